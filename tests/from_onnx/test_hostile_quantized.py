"""Hostile quantized models and calibration data: one clear refusal naming the node, the tensor and the rule, with
the documented exit code, never an internal error; nothing left behind. Models are the ones
onnxruntime.quantization writes (tests/support/hostile_quantized.py), each broken by one mutation; a short seeded
run of that fuzzer; benchmarks/fuzz.py (``quantized``) runs it long."""
from __future__ import annotations

import functools
import math
import re
import time
from pathlib import Path
from fractions import Fraction

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support import hostile_quantized as HQ
from conftest import MODELS
from support.quantized import float_model, qdq

from cvm_onnx.app import api, cli
from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx import import_model, requant_plans
from cvm_onnx.core.errors import CVMError, FormatError, UnsupportedError
from cvm_onnx.core.format.onnx_file import onnx_model


@pytest.fixture(scope="module")
def seeds() -> dict[str, onnx.ModelProto]:
    return {k: onnx.load_from_string(v) for k, v in HQ.seeds(full=False).items()}


def seed(seeds, fmt: str, channel: bool) -> onnx.ModelProto:
    """A copy of the CNN seed (Conv, Add, AveragePool, MatMul) in ``fmt``, weights per channel or per tensor."""
    name = next(k for k in seeds if k.startswith("Add-") and f"/{fmt}/" in k and k.endswith("channel" if channel
                                                                                             else "tensor"))
    m = onnx.ModelProto()
    m.CopyFrom(seeds[name])
    return m


def node(m: onnx.ModelProto, op: str, k: int = 0) -> onnx.NodeProto:
    return [n for n in m.graph.node if n.op_type == op][k]


def set_init(m: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    HQ._set(m, name, nh.from_array(np.asarray(value), name))


def refusal(m: onnx.ModelProto, kind: type | tuple = UnsupportedError) -> str:
    start = time.monotonic()
    with pytest.raises(CVMError) as e:
        import_model(m)
    assert isinstance(e.value, kind), str(e.value)
    assert time.monotonic() - start < 30
    assert all(p.where and "\n" not in str(p) for p in e.value.problems)
    return str(e.value)


# -- scales, zero points, axes, biases: checked against the op before any rule computes ----------------------------
@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
@pytest.mark.parametrize("channel", [False, True])
def test_an_empty_scale_anywhere_is_refused_naming_the_node_and_tensor(seeds, fmt, channel):
    """A scale of shape (0,) was accepted: broadcasting errors in QLinearConv, QGemm, QLinearAdd (``max() arg is an
    empty sequence``), a DequantizeLinear before a Gemm; an output DequantizeLinear wrote "scale": []."""
    base = seed(seeds, fmt, channel)
    scales = {n.input[k] for n in base.graph.node for k in HQ.scale_places(n)}
    for name in sorted(scales):
        m = onnx.ModelProto()
        m.CopyFrom(base)
        set_init(m, name, np.zeros(0, np.float32))
        msg = refusal(m)
        assert f"scale {name!r} has shape (0,), no values" in msg, msg


@pytest.mark.parametrize("bad", [0.0, -1.0, np.nan, np.inf, -np.inf])
def test_scale_values_that_are_not_finite_and_positive_are_refused(seeds, bad):
    m = seed(seeds, "QOperator", True)
    conv = node(m, "QLinearConv")
    value = nh.to_array(HQ._init(m, conv.input[4])).copy()
    value.reshape(-1)[1] = bad
    set_init(m, conv.input[4], value)
    assert f"scale {conv.input[4]!r} holds {bad}: every scale must be finite and > 0" in refusal(m)


def test_a_2d_bias_on_qlinear_conv_is_refused_and_a_row_bias_on_qgemm_imports(tmp_path):
    """An int32 bias of shape (1, C): internal error (``input operand has more dimensions than allowed by the axis
    remapping``). QLinearConv's B is 1-D; QGemm's C broadcasts to (M, N), so (1, N) is the same bias."""
    fm = float_model("plain", 1, 17, 1, 1, (1, 1, 1, 1), "max", "gemm")
    m = onnx.load_from_string(HQ._quantized(fm, "QOperator", "uint8", True))
    conv, gemm = node(m, "QLinearConv"), node(m, "QGemm")
    good = import_model(m)
    b = nh.to_array(HQ._init(m, gemm.input[6]))
    set_init(m, gemm.input[6], b.reshape(1, -1))
    row = import_model(m)
    assert row.graph.params.keys() == good.graph.params.keys()
    assert all(np.array_equal(row.graph.params[k], good.graph.params[k]) for k in good.graph.params)
    set_init(m, conv.input[8], nh.to_array(HQ._init(m, conv.input[8])).reshape(1, -1))
    assert f"bias {conv.input[8]!r} has shape (1, 4): QLinearConv's B is 1-D" in refusal(m)


@pytest.mark.parametrize("shape", [(1, 1), (1, 10), (2,)])
def test_an_output_scale_of_several_values_on_a_per_tensor_op_is_refused(seeds, shape):
    """An output scale of shape (1, 1) or (1, 10) on QLinearMatMul or QLinearAdd: ``cannot reshape array``."""
    for op in ("QLinearMatMul", "QLinearAdd"):
        m = seed(seeds, "QOperator", True)
        n = node(m, op)
        s = float(nh.to_array(HQ._init(m, n.input[6])))
        set_init(m, n.input[6], np.full(shape, s, np.float32))
        msg = refusal(m)
        assert n.input[6] in msg and ("per tensor" in msg or "scalar (per tensor) or 1-D" in msg), msg


def test_a_per_channel_activation_scale_before_a_product_is_refused(seeds):
    """A per-channel scale on the activation a MatMul reads: ``cannot reshape array of size 32 into shape ()``."""
    m = seed(seeds, "QDQ", False)
    mm = node(m, "MatMul")
    dq = next(n for n in m.graph.node if n.output[0] == mm.input[0])
    k = 36
    s = float(nh.to_array(HQ._init(m, dq.input[1])))
    z = nh.to_array(HQ._init(m, dq.input[2]))
    dq.input[1], dq.input[2] = "act_scale", "act_zero"
    set_init(m, "act_scale", np.full(k, s, np.float32))
    set_init(m, "act_zero", np.full(k, z, z.dtype))
    msg = refusal(m)
    assert "MatMul" in msg and "per-tensor scale" in msg, msg


def test_weight_scales_and_zero_points_that_do_not_match_the_channels_are_refused(seeds):
    """Per-channel weight scales along the wrong axis, of too many values, or a zero point of another shape:
    internal errors from broadcasting; now each names the tensor, its shape and the channels."""
    m = seed(seeds, "QDQ", True)
    dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "c1_w_quantized")
    next(a for a in dq.attribute if a.name == "axis").i = 1
    assert "has 4 values but the tensor 'c1_w_quantized' has 2 along axis (axis 1" in refusal(m)
    m = seed(seeds, "QOperator", True)
    conv = node(m, "QLinearConv")
    set_init(m, conv.input[4], np.full(8, 0.01, np.float32))
    assert f"scale {conv.input[4]!r} has 8 values but the tensor {conv.input[3]!r} has 4" in refusal(m)
    m = seed(seeds, "QOperator", True)
    conv = node(m, "QLinearConv")
    set_init(m, conv.input[5], np.zeros(2, np.int8))
    assert f"zero point {conv.input[5]!r} has shape (2,) and the scale" in refusal(m)


def test_the_input_quantizer_takes_one_scale_and_one_zero_point(seeds):
    """The input QuantizeLinear's zero point with more values than its scalar scale: internal error. Per-channel
    input quantization read as if the values were bad."""
    m = seed(seeds, "QDQ", False)
    q = node(m, "QuantizeLinear")
    set_init(m, q.input[2], np.zeros(3, np.uint8))
    assert "zero point has 3 values for one scale" in refusal(m)
    m = seed(seeds, "QDQ", False)
    set_init(m, q.input[1], np.full(2, 0.1, np.float32))
    msg = refusal(m)
    assert "its scale has 2 values (per-channel or per-axis quantization of the input)" in msg
    assert "input of non-integer type" not in msg


def test_a_scale_given_as_a_graph_input_is_said_to_be_computed_at_run_time(seeds):
    m = seed(seeds, "QOperator", False)
    conv = node(m, "QLinearConv")
    name = conv.input[6]
    m.graph.initializer.remove(HQ._init(m, name))
    m.graph.input.append(h.make_tensor_value_info(name, T.FLOAT, []))
    msg = refusal(m)
    assert f"the graph input {name!r} is a quantization parameter" in msg and "given at run time" in msg
    assert "only a float input read by QuantizeLinear" not in msg


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearAveragePool", "QLinearConv", "QLinearMatMul"])
@pytest.mark.parametrize("how", ["missing", "extra"])
def test_qlinear_input_counts_are_checked_against_their_schemas(seeds, op, how):
    """com.microsoft QLinear ops never had their input count checked: ``TypeError: qlinear_binary() takes 10
    positional arguments but 11 were given``. onnxruntime's own schemas now say how many each takes."""
    m = seed(seeds, "QOperator", False)
    n = node(m, op)
    if how == "missing":
        del n.input[3 if op == "QLinearAveragePool" else 6:]
    else:
        n.input.extend([n.input[1]] * 2)
    msg = refusal(m, FormatError)
    assert f"({op})" in msg or op in msg
    assert "takes" in msg and "input(s)" in msg, msg


def test_optional_qlinear_zero_points_may_be_left_out(seeds):
    """QLinearAdd's C_zero_point is optional in onnxruntime's schema (then 0): a 7-input QLinearAdd imports."""
    m = seed(seeds, "QOperator", False)
    add = node(m, "QLinearAdd", 1)
    set_init(m, add.input[7], np.zeros((), np.uint8))
    want = import_model(m)
    del add.input[7]
    got = import_model(m)
    assert [n.op for n in got.graph.nodes] == [n.op for n in want.graph.nodes]


def test_a_huge_scale_is_refused_from_its_shape(seeds):
    """A DequantizeLinear scale of 2^24 + 1 values made a Fraction of each: no answer in 60 s."""
    m = seed(seeds, "QDQ", True)
    dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "c1_w_quantized")
    set_init(m, dq.input[1], np.full((1 << 24) + 1, 0.5, np.float32))
    start = time.monotonic()
    assert "has 16777217 values" in refusal(m)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("dims", [(1 << 20, 8), (1 << 14, 1 << 15)])
def test_a_legal_but_huge_input_is_refused_from_shapes_before_evaluating(seeds, dims):
    """A huge input, (1, 1, 1048576, 8) into the digits QOperator model: 61 s and 1.3 GB of numpy einsum (the
    padded convolution's window sums) before a clean refusal; the 8-bit halves of a 2^30-element input were
    refused as ``concatenate: output shape ... exceeds 2^30``, in terms of an op the model does not have. (The
    convolution's window sums, by bands since, no longer refuse the first shape: its AveragePool's do.)"""
    m = seed(seeds, "QOperator", False)
    d = m.graph.input[0].type.tensor_type.shape.dim
    d[2].dim_value, d[3].dim_value = dims
    del m.graph.value_info[:]
    start = time.monotonic()
    msg = refusal(m)
    assert time.monotonic() - start < 10
    assert "(QLinearConv): the padded convolution's zero-point correction" in msg or \
        "(QLinearConv): the input of conv2d as 2 8-bit parts" in msg or \
        "(QLinearAveragePool): the padded convolution's zero-point correction" in msg, msg
    assert "concatenate" not in msg


def test_an_average_pool_of_a_huge_input_is_planned_once_per_distinct_scale(seeds):
    """An AveragePool that does not count its padding has a scale per output position; its requantization was
    planned over every position (Fractions per position and shift: 47 s for a (1, 2, 20000, 6) input, no answer
    in 60 s for 100000 rows). Each distinct ratio is planned once."""
    m = seed(seeds, "QOperator", False)
    m.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 100000
    del m.graph.value_info[:]
    start = time.monotonic()
    msg = refusal(m)
    assert time.monotonic() - start < 20
    assert "QLinearMatMul" in msg and "QLinearAveragePool" not in msg


def _apply(p, v: int, channel: int) -> int:
    """docs/import.md's one-term form, written from the doc: clip, pre-shift and final shift rounding half up."""
    def shift(x, s):
        return (x + (1 << (s - 1))) >> s if s else x
    if p.clip:
        v = min(max(v, p.clip[0]), p.clip[1])
    m = int(p.multipliers[0].flat[channel])
    return shift(shift(v, p.pre_shift) * m, p.shift)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.fractions(Fraction(1, 1 << 20), Fraction(4)), min_size=1, max_size=4),
       st.lists(st.integers(0, 3), min_size=1, max_size=30), st.integers(-300, 0), st.integers(1, 300))
def test_a_plan_over_repeated_ratios_is_the_plan_over_every_ratio(ratios, picks, lo, hi):
    """plan() plans each distinct M once: over repeated ratios it is the plan of the distinct ratios, each channel
    given its ratio's multiplier, and on every v in [lo, hi] each channel's result is within 1/2 + delta of v M
    (saturated to the output range), delta < 1/2."""
    ms = np.array([ratios[i % len(ratios)] for i in picks], dtype=object)
    distinct = sorted(set(ms.flat))
    try:
        want = requant_plans.plan([(lo, hi, np.array(distinct, dtype=object))], -128, 127)
    except requant_plans.NoPlan:
        with pytest.raises(requant_plans.NoPlan):
            requant_plans.plan([(lo, hi, ms)], -128, 127)
        return
    got = requant_plans.plan([(lo, hi, ms)], -128, 127)
    assert (got.clip, got.pre_shift, got.shift, got.delta, got.split) == \
        (want.clip, want.pre_shift, want.shift, want.delta, want.split)
    assert got.multipliers[0].tolist() == [want.multipliers[0][distinct.index(m)] for m in ms.flat]
    assert got.delta < Fraction(1, 2)
    if got.split:
        return  # the two-part form's integers: tests/from_onnx/test_requant_split.py
    for c, m in enumerate(ms.flat):
        for v in range(lo, hi + 1):
            exact = v * m
            r = min(max(_apply(got, v, c), -128), 127)
            assert abs(r - min(max(exact, Fraction(-128)), Fraction(127))) <= Fraction(1, 2) + got.delta
            if abs(exact - math.floor(exact) - Fraction(1, 2)) > got.delta:  # not within delta of a half-integer
                assert r == min(max(math.floor(exact + Fraction(1, 2)), -128), 127)


@pytest.mark.parametrize("fmt, op", [("QDQ", "AveragePool"), ("QOperator", "QLinearAveragePool")])
@pytest.mark.parametrize("kernel", [[2], [2, 2, 2]])
def test_an_average_pool_kernel_of_another_rank_is_refused(seeds, fmt, op, kernel):
    """kernel_shape of 1 or 3 values on a 2-D AveragePool: ``ValueError: Einstein sum subscript o does not contain
    the correct number of indices`` (found by benchmarks/fuzz.py quantized)."""
    m = seed(seeds, fmt, False)
    n = node(m, op)
    next(a for a in n.attribute if a.name == "kernel_shape").ints[:] = kernel
    msg = refusal(m, (FormatError, UnsupportedError))
    assert "kernel_shape" in msg, msg


@pytest.mark.parametrize("fmt, op", [("QDQ", "AveragePool"), ("QOperator", "QLinearAveragePool")])
@pytest.mark.parametrize("pads, said", [([1, 0, 32, 1], "(1, 32)"), ([2, 0, 0, 1], "(2, 0)"),
                                        ([0, 0, 0, 2], "(0, 2)"), ([0, 1 << 31, 0, 0], f"({1 << 31}, 0)")])
def test_an_average_pool_pad_not_smaller_than_its_kernel_is_refused_naming_it(seeds, fmt, op, pads, said):
    """The fuzzer's case (the Add CNN, QDQ int8): the 2x2 AveragePool's pads [1, 0, 32, 1], padding not counted: a
    window of padding only counts 0 input values, ``ZeroDivisionError: Fraction(1, 0)`` came through as an internal
    error. A pad >= the kernel (onnxruntime refuses it) is now one refusal naming the node and the pads."""
    m = seed(seeds, fmt, True)
    n = node(m, op)
    next(a for a in n.attribute if a.name == "pads").ints[:] = pads
    msg = refusal(m)
    assert f"({op}): AveragePool pads {said} not smaller than the kernel (2) with count_include_pad=0" in msg, msg


def test_int4_weights_are_unsupported_not_a_format_error(seeds, tmp_path, capsys):
    """onnxruntime's own QInt4 weights: ``format error: ... INT4, which cannot be read`` (exit 2, a broken file)
    where the file is valid and the type has no CVM form (exit 4)."""
    m = seed(seeds, "QDQ", True)
    w = nh.to_array(HQ._init(m, "c1_w_quantized"))
    HQ._set(m, "c1_w_quantized", h.make_tensor("t", T.INT4, w.shape, np.clip(w, -8, 7).reshape(-1).tolist()))
    msg = refusal(m)
    assert "data type INT4, which has no CVM form" in msg
    onnx.save(m, tmp_path / "q.onnx")
    assert cli.main(["convert", str(tmp_path / "q.onnx"), "-o", str(tmp_path / "out")]) == 4
    assert not (tmp_path / "out").exists()


# -- the fuzzer, briefly ---------------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.deferred(lambda: HQ.mutated(HQ.seeds(full=False))))  # seeds built when run, not at collection
def test_mutated_quantized_models_are_refused_cleanly_or_imported_exactly(case):
    outcome = HQ.check(case.files[0])
    assert outcome in HQ.CLEAN, (case, outcome)


@settings(max_examples=25, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.deferred(lambda: HQ.mutated(HQ.family_seeds())))  # seeds built when run, not at collection
def test_mutated_models_of_the_newer_rule_families_are_refused_cleanly_or_imported_exactly(case):
    """Attention, LayerNormalization, GELU, LSTM/GRU/RNN, Resize, ConvTranspose, PRelu, dilated MaxPool, Gemm's
    factors, Pad, token ids into Gather, int16 activations, int4 weights: their attributes, constant inputs and
    quantization parameters mutated."""
    outcome = HQ.check(case.files[0])
    assert outcome in HQ.CLEAN, (case, outcome)


@pytest.mark.parametrize("kind", HQ.LATEST)
def test_the_seeds_of_the_forms_added_last_import_exactly(kind):
    """Each seed of the forms added last imports and exports exactly, so that its mutants test the rule, not a
    refusal of the seed."""
    assert HQ.check(HQ.latest_seeds()[f"{kind}/QDQ"]) == "ok"


@settings(max_examples=15, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.deferred(lambda: HQ.mutated(HQ.latest_seeds())))  # seeds built when run, not at collection
def test_mutated_models_of_the_forms_added_last_are_refused_cleanly_or_imported_exactly(case):
    """LogSoftmax (and one read by Exp), the written-out confidence, IsNaN/IsInf, Div/Pow/Mod of two computed
    values, a constant W times x, an LSTM of a wide initial cell, two inputs packed, the masked Softmax, ArgMax/TopK/
    GatherElements heads, unrolled Loops and Scans, a quotient of sums, a symbolic first dim, L2 normalizations and
    norms, ReduceLogSumExp, a dense of 40,000 inputs, HF's and torch's masks, a FusedMatMul, GRUs of a folded cache,
    decoder masks, Instance- and GroupNormalization, written-out RMSNorms, x / (||x|| + eps), a Cast to uint8, a
    uint8 image normalized inside the model, Log minus a constant, a grouped Conv whose group passes 32 bits: their
    attributes, constant inputs, input dims and quantization parameters mutated."""
    outcome = HQ.check(case.files[0])
    assert outcome in HQ.CLEAN, (case, outcome)


@settings(max_examples=15, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(HQ.mutated_layouts())
def test_edited_layouts_of_packed_models_are_refused_or_give_the_same_outputs(case):
    """A packed model directory whose quantization.json was edited, run on named inputs (mutated too): refused in
    one line, or the outputs of the directory's own layout."""
    outcome = HQ.check_layout(*case.files)
    assert outcome in ("ok", "ok, inputs the own layout refuses", "FormatError", "RuntimeFailure"), (case, outcome)

@pytest.mark.parametrize("key", ["ops/QOperator/int8/channel", "ops/QDQ/uint8/tensor"])
@pytest.mark.parametrize("shape", [(3, 1), (2, 3)])
def test_a_prelu_slope_that_does_not_broadcast_is_refused_naming_the_prelu(key, shape):
    """A PRelu slope of shape (3, 1) or (2, 3) beside an input (1, 3, 5, 5): numpy's broadcasting ValueError came
    through as an internal error (the fuzzer's case); now one refusal naming the node and both shapes."""
    m = onnx.load_from_string(HQ.family_seeds()[key])
    name = node(m, "PRelu").input[1]
    slope = nh.to_array(HQ._init(m, name))
    set_init(m, name, np.resize(slope.reshape(-1), shape).astype(slope.dtype))
    msg = refusal(m)
    assert f"prelu (PRelu): PRelu slope of shape {shape} does not broadcast to the input's (1, 3, 5, 5)" in msg, msg



def test_a_dilated_max_pool_of_a_huge_batch_is_refused_before_allocating_its_padding():
    """The fuzzer's case: the ops seed (QOperator int8) with a batch of 2^24 (legal: 2^24 x 2 x 5 x 5 values): the
    dilated MaxPool's padding constant of shape (2^24, 3, 1, 5) was allocated, an internal MemoryError (1.88 GiB)
    under the fuzzer's memory limit. Now refused naming the MaxPool, from shapes."""
    m = onnx.load_from_string(HQ.family_seeds()["ops/QOperator/int8/channel"])
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1 << 24
    assert "pool (MaxPool): dilated MaxPool of (16777216, 3, 5, 5): its padding of shape (16777216, 3, 1, 5) would " \
        "be a constant of more than 2^24 elements" in refusal(m)


@pytest.mark.parametrize("key", ["ops/QDQ/uint8/tensor", "ops/QOperator/int8/channel"])
def test_a_gemm_weight_of_one_axis_is_refused_naming_the_gemm(key):
    """The fuzzer's case (the plain CNN, QDQ uint8: its Gemm's quantized weight reshaped to (108,)): numpy's
    ``AxisError: axis 1 is out of bounds`` came through as an internal error, as for a per-tensor QGemm. Gemm's B
    is a matrix: a B of one axis is one refusal naming the Gemm (QGemm); here the ops seed's."""
    m = onnx.load_from_string(HQ.family_seeds()[key])
    g = next(n for n in m.graph.node if n.op_type in ("Gemm", "QGemm"))
    name = g.input[3] if g.op_type == "QGemm" else \
        next(n.input[0] for n in m.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == g.input[1])
    w = nh.to_array(HQ._init(m, name))
    set_init(m, name, w.reshape(-1))
    if g.op_type == "QGemm":  # B per tensor (per channel, its scale's axis 1 is refused first)
        set_init(m, g.input[4], np.float32(0.01))
        set_init(m, g.input[5], np.zeros((), w.dtype))
    msg = refusal(m)
    assert f"{g.name} ({g.op_type}): Gemm weight B of shape ({w.size},): Gemm takes a matrix" in msg, msg


def _with_attribute(m: onnx.ModelProto, op: str, **attrs) -> onnx.ModelProto:
    n = node(m, op)
    for name, value in attrs.items():
        for a in [a for a in n.attribute if a.name == name]:
            n.attribute.remove(a)
        n.attribute.append(h.make_attribute(name, value))
    return m


@pytest.mark.parametrize("eps", [np.inf, -np.inf, np.nan, 0.0, -1.0])
def test_a_layernorm_epsilon_that_is_not_finite_and_positive_is_refused_naming_it(eps):
    """epsilon = inf or NaN: ``cannot convert Infinity to integer ratio`` came through as an internal error (the
    fuzzer's case); now one refusal naming the LayerNormalization and the value."""
    m = _with_attribute(onnx.load_from_string(HQ.family_seeds()["encoder/QDQ/int8/channel"]), "LayerNormalization",
                        epsilon=eps)
    msg = refusal(m)
    assert "(LayerNormalization): LayerNormalization epsilon must be > 0 and finite (a constant row is 0 / 0 " \
           f"otherwise), not {float(np.float32(eps))}" in msg, msg


@pytest.mark.parametrize("a", [np.inf, np.nan])
def test_a_cubic_resize_coefficient_that_is_not_finite_is_refused_naming_the_resize(a):
    """Resize cubic with cubic_coeff_a = inf or NaN: an internal error from Fraction; now a refusal naming it."""
    m = _with_attribute(onnx.load_from_string(HQ.family_seeds()["ops/QDQ/uint8/tensor"]), "Resize", mode="cubic",
                        cubic_coeff_a=a)
    assert f"resize (Resize): Resize cubic_coeff_a {float(a)} must be finite" in refusal(m)



def test_a_reshape_copying_a_dim_past_the_input_rank_is_refused_naming_it():
    """The fuzzer's case: an encoder's Reshape to [1, 4, 2, 0, 1] of a rank-3 tensor (0 copies the input's dim at
    its place, and there is none): an internal IndexError; now one refusal naming the Reshape."""
    m = onnx.load_from_string(HQ.family_seeds()["encoder/QDQ/int8/channel"])
    n = next(n for n in m.graph.node if n.name == "n3_Reshape")
    set_init(m, n.input[1], np.array([1, 4, 2, 0, 1], np.int64))
    assert "n3_Reshape (Reshape): Reshape of (1, 4, 8) to [1, 4, 2, 0, 1]: a 0 past the input's rank has no dim to " \
        "copy" in refusal(m)


@pytest.mark.parametrize("key, steps", [("LSTM/QDQ/uint8/tensor", 4097), ("GRU/QOperator/int8/channel", 2049),
                                        ("RNN/QDQ/uint8/tensor", 1 << 20)])
def test_a_recurrent_layer_of_more_steps_than_unrolled_is_refused_naming_it(key, steps):
    """An input of 2^20 steps was unrolled step by step (tens of CVM nodes each): no answer within the fuzzer's
    minute. Past MAX_NODES CVM nodes over the directions (at the second step's count; at least one a step): one
    refusal naming the layer and the bound, at once."""
    from cvm_onnx.converters.from_onnx.quantized.recurrent import MAX_NODES

    m = onnx.load_from_string(HQ.family_seeds()[key])
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = steps
    op = key.split("/")[0]
    each = " in each direction" if op == "GRU" else ""
    said = refusal(m)
    assert f"({op}): {op} over {steps} steps{each}: unrolled into " in said
    assert f"CVM nodes ({'at least one' if steps > MAX_NODES else ''}" in said
    assert f"at most {MAX_NODES:,} a layer" in said


@pytest.mark.parametrize("key, steps, said", [("RNN/QDQ/uint8/tensor", 4500, "RNN over 4500 steps"),
                                              ("LSTM/QDQ/uint8/tensor", 2400, "LSTM over 2400 steps"),
                                              ("GRU/QDQ/uint8/tensor", 1100, "GRU over 1100 steps in each direction")])
def test_a_recurrent_layer_past_the_bound_is_refused_naming_it(key, steps, said):
    """The fuzzer's hang: the RNN seed with an INT32 input of 4096 steps imported in about 20 s and its export's
    onnxruntime session took minutes to start. The import is linear in the layer's CVM nodes (a few dozen a step).
    Past MAX_NODES of them over the directions (these seeds' layers: about 4,200 RNN steps, 2,250 LSTM, 2,100 GRU):
    one refusal naming the layer and the bound, at its third step (docs/import.md's LSTM row)."""
    from cvm_onnx.converters.from_onnx.quantized.recurrent import MAX_NODES

    m = onnx.load_from_string(HQ.family_seeds()[key])
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = steps
    m.graph.input[0].type.tensor_type.elem_type = T.INT32
    why = refusal(m)
    assert f"({key.split('/')[0]}): {said}: unrolled into about " in why
    assert f"a step), at most {MAX_NODES:,} a layer" in why


def test_the_recurrent_bound_counts_nodes_not_steps(monkeypatch):
    """At a bound of 4,000 CVM nodes a layer, an RNN of 120 steps (about 31 nodes a step) imports and an LSTM of
    120 steps (about 58) is refused, saying about how many nodes it would take: within 5% of what 100 of its steps
    take unbounded."""
    from cvm_onnx.converters.from_onnx.quantized import recurrent

    def seed(op: str, steps: int) -> onnx.ModelProto:
        m = onnx.load_from_string(HQ.family_seeds()[f"{op}/QDQ/uint8/tensor"])
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = steps
        return m

    monkeypatch.setattr(recurrent, "MAX_NODES", 4000)
    assert 120 * 25 < len(import_model(seed("RNN", 120)).graph.nodes) < 4000
    why = refusal(seed("LSTM", 120))
    said = int(why.split("unrolled into about ")[1].split(" CVM nodes")[0].replace(",", ""))
    per = int(why.split(" CVM nodes (")[1].split(" a step")[0])
    assert said == 120 * per and "at most 4,000 a layer" in why
    monkeypatch.setattr(recurrent, "MAX_NODES", 1 << 20)
    hundred = len(import_model(seed("LSTM", 120)).graph.nodes) - len(import_model(seed("LSTM", 20)).graph.nodes)
    assert abs(100 * per - hundred) < 0.05 * hundred, (per, hundred)


def test_fresh_names_are_the_first_free_and_found_in_linear_time(monkeypatch):
    """Each of an unrolled layer's nodes took a name by trying name/1, name/2, ... from 1: quadratic in the nodes
    (300 LSTM steps: 8.5 s of 10 in ``fresh``). The names are the same (the first free), the lookups now linear."""
    from cvm_onnx.converters.from_onnx import context

    ctx = context.Importer()
    ctx.names.update({"a/2", "a/4", "b"})
    assert [ctx.fresh(n) for n in ("a", "a", "a", "a", "b", "b", "c")] == ["a", "a/1", "a/3", "a/5", "b/1", "b/2",
                                                                           "c"]
    lookups = [0]

    class Counted(set):
        def __contains__(self, x):
            lookups[0] += 1
            return super().__contains__(x)

    real = context.Importer.__init__

    def counted(self):
        real(self)
        self.names = Counted()

    monkeypatch.setattr(context.Importer, "__init__", counted)
    m = onnx.load_from_string(HQ.family_seeds()["LSTM/QDQ/uint8/tensor"])
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 200
    nodes = len(import_model(m).graph.nodes)
    assert lookups[0] < 4 * nodes, (lookups[0], nodes)


# -- cvm-onnx quantize: the calibration file first, nothing written unless everything succeeded ----------------------
@pytest.fixture
def float_cnn(tmp_path):
    """A float CNN (1, 2, 6, 6) -> 3 and six calibration samples of it."""
    onnx.save(float_model("plain", 2, 17, 1, 1, (1, 1, 1, 1), "max", "gemm"), tmp_path / "f.onnx")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "c.npy", rng.normal(size=(6, 2, 6, 6)).astype(np.float32))
    return tmp_path


def quantize_cli(d, calibration, *extra) -> list:
    return ["quantize", str(d / "f.onnx"), "--calibration", str(calibration), "-o", str(d / "out" / "m"), *extra]


@pytest.mark.parametrize("bad, said", [(np.nan, "holds nan at"), (np.inf, "holds inf at"),
                                       (1e300, "holds beyond float32 at")])
def test_calibration_samples_that_are_not_finite_are_a_format_error_naming_the_file(float_cnn, capsys, bad, said):
    """One NaN in the samples: exit 5 after onnxruntime's ``x_scale inf must be finite`` x9, and the output left
    behind; now exit 2 naming the file and the sample, before anything runs, and nothing written."""
    c = np.load(float_cnn / "c.npy").astype(np.float64)
    c[3, 1, 2, 2] = bad
    np.save(float_cnn / "bad.npy", c)
    assert cli.main(quantize_cli(float_cnn, float_cnn / "bad.npy")) == 2
    err = capsys.readouterr().err
    assert str(float_cnn / "bad.npy") in err and f"calibration sample 3 {said} (1, 2, 2)" in err, err
    assert not (float_cnn / "out").exists()


def test_a_calibration_header_claiming_terabytes_is_refused_before_reading(float_cnn, capsys):
    """A header claiming 10^9 x 2 x 6 x 6 samples: ``MemoryError: Unable to allocate``."""
    header = {"descr": "<f4", "fortran_order": False, "shape": (10 ** 9, 2, 6, 6)}
    with open(float_cnn / "huge.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(np.zeros(72, np.float32).tobytes())
    assert cli.main(quantize_cli(float_cnn, float_cnn / "huge.npy")) == 2
    assert str(float_cnn / "huge.npy") in capsys.readouterr().err
    assert not (float_cnn / "out").exists()


def test_float16_calibration_samples_are_taken(float_cnn, capsys):
    """float16 samples: an internal error from onnxruntime's session (the float model takes float32), with the
    output left behind."""
    np.save(float_cnn / "half.npy", np.load(float_cnn / "c.npy").astype(np.float16))
    assert cli.main(quantize_cli(float_cnn, float_cnn / "half.npy")) == 0, capsys.readouterr().err
    assert sorted(p.name for p in (float_cnn / "out" / "m").iterdir()) == ["params", "quantization.json", "symbol"]
    assert [p.name for p in (float_cnn / "out").iterdir()] == ["m"]  # no staging directory left


def test_a_failure_after_the_import_leaves_nothing_and_keeps_an_old_model(float_cnn, capsys, monkeypatch):
    """quantize wrote the CVM model, then compared it: a failure there left symbol, params and quantization.json.
    It now writes into a sibling directory, renamed at the end; an existing model stays as it was."""
    from cvm_onnx.app import quantize as q
    from cvm_onnx.core.errors import RuntimeFailure

    def fail(*a, **k):
        raise RuntimeFailure("late")

    monkeypatch.setattr(q, "compare", fail)
    assert cli.main(quantize_cli(float_cnn, float_cnn / "c.npy")) == 5
    assert not (float_cnn / "out").exists()
    monkeypatch.undo()
    assert cli.main(quantize_cli(float_cnn, float_cnn / "c.npy")) == 0
    before = {p.name: p.read_bytes() for p in (float_cnn / "out" / "m").iterdir()}
    monkeypatch.setattr(q, "compare", fail)
    assert cli.main(quantize_cli(float_cnn, float_cnn / "c.npy", "--per-channel")) == 5
    assert {p.name: p.read_bytes() for p in (float_cnn / "out" / "m").iterdir()} == before
    assert [p.name for p in (float_cnn / "out").iterdir()] == ["m"]


def test_a_nan_weight_is_named(float_cnn, capsys):
    """A NaN weight: onnxruntime's ``All-NaN axis encountered`` then ``quantize_static failed: AssertionError:
    scale issue``; now the initializer is named."""
    m = onnx.load(float_cnn / "f.onnx")
    w = nh.to_array(m.graph.initializer[0]).copy()
    w.reshape(-1)[5] = np.nan
    m.graph.initializer[0].CopyFrom(nh.from_array(w, m.graph.initializer[0].name))
    onnx.save(m, float_cnn / "f.onnx")
    assert cli.main(quantize_cli(float_cnn, float_cnn / "c.npy")) == 4
    err = capsys.readouterr().err
    assert f"initializer {m.graph.initializer[0].name!r} holds nan" in err and "scale issue" not in err, err
    assert not (float_cnn / "out").exists()


def test_quantize_of_an_integer_model_says_it_is_already_integer(tmp_path, capsys):
    """A CVM export (int32 input, integer weights): onnxruntime's ``Unexpected input data type`` (exit 5) before;
    now exit 4 saying it is already integer, and nothing written."""
    exported = tmp_path / "f.onnx"
    assert cli.main(["convert", str(MODELS / "digits_cnn"), "-o", str(exported)]) == 0
    np.save(tmp_path / "c.npy", np.zeros((2, 1, 8, 8), np.int32))
    capsys.readouterr()
    assert cli.main(quantize_cli(tmp_path, tmp_path / "c.npy")) == 4
    assert "this model takes int32: it is already integer" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_an_integer_input_with_float_weights_is_no_integer_model(float_cnn, capsys):
    """Float weights behind an integer input are quantized (integer inputs), so float calibration samples that are
    not integers are the error, naming the input."""
    m = onnx.load(float_cnn / "f.onnx")
    m.graph.input[0].type.tensor_type.elem_type = T.INT32
    onnx.save(m, float_cnn / "f.onnx")
    assert cli.main(quantize_cli(float_cnn, float_cnn / "c.npy")) == 2
    assert "must be integers" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_histogram_calibration_prints_nothing_of_onnxruntime(float_cnn, capfd, method):
    """onnxruntime.quantization prints "Collecting tensor data and making histogram ...", "Number of tensors",
    "Percentile : (...)" on stdout: docs/cli.md says onnxruntime's words are silenced."""
    assert cli.main(quantize_cli(float_cnn, float_cnn / "c.npy", "--method", method)) == 0
    out = capfd.readouterr().out
    assert "making histogram" not in out and "Number of" not in out and "Percentile" not in out
    assert "Finding optimal" not in out
    assert "calibration samples" in out


@settings(max_examples=5, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(HQ.mutated_calibration())
def test_quantize_of_mutated_models_and_calibration_sets_fails_cleanly_leaving_nothing(case):
    outcome = HQ.check_quantize(*case.files)
    assert outcome in ("ok", "FormatError", "UnsupportedError", "RuntimeFailure"), (case, outcome)


@pytest.mark.parametrize("kind", HQ.LATEST_FLOAT)
def test_the_float_seeds_of_the_forms_added_last_quantize(kind):
    """Each float seed of the forms added last (STFT, DFT, W x, LogSoftmax, the confidence, IsNaN, Div, Pow, Mod,
    ArgMax/TopK/GatherElements heads, a quotient of sums, two inputs from an .npz, the masked Softmax, Loops and a
    Scan, L2 normalizations and a norm, ReduceLogSumExp, HF's and torch's masks, grouped Einsums and MatMuls, a
    ScatterND, GRUs of a folded cache, SplitToSequence, FusedConv and FusedMatMul, a dense of 40,000 inputs, GPT-2's
    eager mask, the cache-position slice assignment, a masked ReduceLogSumExp)
    quantizes and imports (its folds given), so that its mutants test the rule, not a refusal of the seed."""
    assert HQ.check_quantize(*HQ.float_seeds()[kind], "minmax", "qdq", False, HQ.FOLDS.get(kind)) == "ok"


def test_samples_that_overflow_the_float_model_are_named(float_cnn, capsys):
    """Finite samples of 3e38 make the float model's activations inf: onnxruntime's ``supplied range of [-inf, inf]
    is not finite`` came through without the cause; now the calibration file and the sample are named."""
    c = np.load(float_cnn / "c.npy")
    c[2] = 3e38
    np.save(float_cnn / "big.npy", c)
    assert cli.main(quantize_cli(float_cnn, float_cnn / "big.npy", "--method", "entropy")) == 5
    err = capsys.readouterr().err
    assert f"{float_cnn / 'big.npy'}: the float model computes inf or NaN on calibration sample 2" in err, err
    assert not (float_cnn / "out").exists()


def test_a_float_model_onnxruntime_cannot_load_is_refused_in_one_line_naming_the_file(tmp_path, capsys):
    """The fuzzer's case: an encoder's Reshape shape (int64) retyped to float. onnxruntime's multi-line load error
    came through unnamed; now one line naming the source file, exit 5, nothing written."""
    m = HQ._family("encoder")
    t = next(t for t in m.graph.initializer if t.data_type == T.INT64)
    t.CopyFrom(nh.from_array(nh.to_array(t).astype(np.float32), t.name))
    onnx.save(m, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(2, 4, 8)).astype(np.float32))
    assert cli.main(quantize_cli(tmp_path, tmp_path / "c.npy")) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"runtime error: {tmp_path / 'f.onnx'}: onnxruntime cannot load the "
                                               "float model"), err
    assert "of operator (Reshape) in node (n3_Reshape) is invalid" in err[0]
    assert not (tmp_path / "out").exists()


def test_an_if_of_a_condition_of_no_values_is_refused_as_control_flow(tmp_path):
    """The fuzzer's case: a constant If condition of shape (0,): an internal IndexError while folding the Ifs; now
    the If stays (it takes one value) and the model is refused naming the file and the If."""
    model, npy = HQ.float_seeds()["if"]
    m = onnx.load_from_string(model)
    set_init(m, "c", np.zeros(0, bool))
    onnx.save(m, tmp_path / "f.onnx")
    (tmp_path / "c.npy").write_bytes(npy)
    with pytest.raises(UnsupportedError, match=r"the model has no CVM form: control flow \(If x1\)") as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "out" / "m")
    assert e.value.problems[0].where == str(tmp_path / "f.onnx")
    assert not (tmp_path / "out").exists()


def test_a_one_part_import_that_is_refused_leaves_the_quantized_model_written(tmp_path, monkeypatch):
    """The fuzzer's case (a Gemm's C given as "", QOperator per channel): the model imported with two-part products
    and was written, then the one-part import recorded beside it for its gas was refused ("no multiplier and shift
    within CVM's 32 bits"): UnsupportedError with DIR left behind. Now the model is the result, without the
    one-part gas. (That C is dropped now, so the refusal is stood in for.)"""
    from cvm_onnx.app import quantize as q

    def refused(model, **kwargs):  # (a model of several inputs passes their precisions)
        raise UnsupportedError("no multiplier and shift within CVM's 32 bits", where="y")

    monkeypatch.setattr(q, "one_part_gas", refused)
    monkeypatch.setattr(q, "has_two_parts", lambda imported: True)
    model, npy = HQ.float_seeds()["plain"]
    onnx.save(onnx.load_from_string(model), tmp_path / "f.onnx")
    (tmp_path / "c.npy").write_bytes(npy)
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "out" / "m", per_channel=True,
                    form="qoperator")
    assert done.one_part_gas is None and (tmp_path / "out" / "m" / "symbol").is_file()


@pytest.mark.parametrize("inputs", [["x", ""], ["x"], ["x", "w", "w"]])
def test_an_einsum_without_its_equations_operands_is_refused_before_onnxruntime_runs_it(tmp_path, inputs):
    """The fuzzer's case: an Einsum 'abc,cd->abd' with its second input absent killed the process (SIGSEGV in
    onnxruntime's calibration run). Now a format error naming the file, the node and the operands (exit 2)."""
    model, npy = HQ.float_seeds()["einsum"]
    m = onnx.load_from_string(model)
    node(m, "Einsum").input[:] = inputs
    onnx.save(m, tmp_path / "f.onnx")
    (tmp_path / "c.npy").write_bytes(npy)
    with pytest.raises(FormatError, match=r"\(Einsum\): equation 'abc,cd->abd' takes 2 operands, the node has "
                                          + re.escape(f"inputs {inputs}")) as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "out" / "m")
    assert e.value.problems[0].where == str(tmp_path / "f.onnx")
    assert not (tmp_path / "out").exists()


def test_a_trailing_absent_input_is_no_input_to_onnxruntime(tmp_path):
    """The fuzzer's case: an encoder's last LayerNormalization with B given as "" (legal: absent) killed the process
    (SIGSEGV creating onnxruntime's session of the prepared float model). Trailing absent inputs are dropped first:
    the model quantizes and imports."""
    model, npy = HQ.float_seeds()["encoder"]
    m = onnx.load_from_string(model)
    node(m, "LayerNormalization", 2).input[2] = ""
    onnx.save(m, tmp_path / "f.onnx")
    (tmp_path / "c.npy").write_bytes(npy)
    quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "out" / "m", per_channel=True)
    assert (tmp_path / "out" / "m" / "symbol").is_file()


@pytest.mark.parametrize("seed, init, shape, method, said", [
    ("encoder", "l0_oshape", (2, 3), "entropy", "n19_Reshape"), ("dyn-fused", "b1", (2, 6), "minmax", "onnxruntime cannot run the float model: ")])
def test_a_failure_of_onnxruntime_is_one_line_naming_the_file(tmp_path, seed, init, shape, method, said):
    """The fuzzers' cases: the encoder's output shape (a Reshape's) of shape (2, 3), whose multi-line message from
    onnxruntime came through as a problem of several lines; a DynamicQuantizeMatMul's bias of shape (2, 6) for a
    (1, 6) product, which quantizes (its shape is not checked before it runs) but onnxruntime cannot run on the
    samples, a refusal that named no place. Now each is one line naming the source file."""
    model, npy = HQ.float_seeds()[seed]
    m = onnx.load_from_string(model)
    set_init(m, init, np.resize(nh.to_array(HQ._init(m, init)), shape))
    onnx.save(m, tmp_path / "f.onnx")
    (tmp_path / "c.npy").write_bytes(npy)
    with pytest.raises(CVMError) as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "out" / "m", method=method)
    [p] = e.value.problems
    assert p.where == str(tmp_path / "f.onnx") and "\n" not in p.rule and said in p.rule, str(p)
    assert not (tmp_path / "out").exists()


def test_an_infinite_clip_bound_is_no_bad_weight():
    """An initializer read only as a bound (Clip's max = inf, as torch exports clamp(min=...)) is no weight: only
    NaN is refused there; inf in a weight is refused, naming it."""
    from cvm_onnx.app.quantize import non_finite

    def model(value, op):
        nodes = [h.make_node("Clip", ["x", "lo", "c"], ["y"]) if op == "Clip" else h.make_node("MatMul", ["x", "c"],
                                                                                                ["y"])]
        g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 1])],
                         [h.make_tensor_value_info("y", T.FLOAT, None)],
                         [nh.from_array(np.array(0, np.float32), "lo"),
                          nh.from_array(np.full((1, 1) if op == "MatMul" else (), value, np.float32), "c")])
        return h.make_model(g)

    assert non_finite(model(np.inf, "Clip")) is None
    assert "'c' holds nan" in non_finite(model(np.nan, "Clip"))
    assert "'c' holds inf" in non_finite(model(np.inf, "MatMul"))


def test_a_scalar_into_a_qlinear_matmul_is_refused_naming_it():
    """The fuzzer's case: the first QuantizeLinear's input deleted (it quantizes its scale: a scalar) before a
    QLinearMatMul: an internal IndexError before; now one refusal naming the node."""
    m = onnx.load_from_string(HQ._quantized(HQ._small("softmax"), "QOperator", "uint8", False))
    assert m.graph.node[0].op_type == "QuantizeLinear" and m.graph.node[1].op_type == "QLinearMatMul"
    del m.graph.node[0].input[0]
    with pytest.raises(UnsupportedError, match="rank 1 or more") as e:
        import_model(m)
    assert "QLinearMatMul" in str(e.value)


def states_model(tmp_path, dims: list | None = None) -> tuple[Path, Path]:
    """The LSTM whose states h0 and c0 are graph inputs (``HQ.FOLDS``), h0 declared with ``dims``, and its samples."""
    model, npy = HQ.float_seeds()["states"]
    m = onnx.load_from_string(model)
    if dims is not None:
        h0 = next(v for v in m.graph.input if v.name == "h0")
        h0.type.tensor_type.shape.ClearField("dim")
        for d in dims:
            h0.type.tensor_type.shape.dim.add().dim_value = d
    onnx.save(m, tmp_path / "f.onnx")
    (tmp_path / "c.npy").write_bytes(npy)
    return tmp_path / "f.onnx", tmp_path / "c.npy"


@pytest.mark.parametrize("fold, dims, want", [
    ({"nope": None}, None, "the model has no input 'nope' (inputs: x, h0, c0)"),
    ({"h0": None, "c0": None}, [1 << 40, 1, 4], "its declared shape (1099511627776, 1, 4) holds 4398046511104 values"),
    ({"h0": None, "c0": None}, [(1 << 63) - 1, 1, 4], "values, more than a constant may hold (16777216)"),
    ({"h0": float("nan"), "c0": None}, None, "nan is no value of its type float32 (finite, within"),
    ({"h0": 1e300, "c0": None}, None, "1e+300 is no value of its type float32"),
    ({"h0": -float("inf"), "c0": None}, None, "-inf is no value of its type float32")])
def test_a_fold_that_cannot_be_is_refused_naming_the_option_and_the_input(tmp_path, fold, dims, want):
    """The fuzzer's cases: --fold of a name that is no input was refused without a place (one line, but unnamed);
    an input declared with 2^40 rows was a MemoryError (32 TiB asked of numpy), with 2^63 - 1 a ValueError; a
    value of NaN, one past float32 (a RuntimeWarning, then inf) went on into the model. Now each names
    ``--fold NAME`` and what is wrong, before anything is allocated or written."""
    src, cal = states_model(tmp_path, dims)
    with pytest.raises(UnsupportedError) as e:
        quantize(src, cal, tmp_path / "out" / "m", fold=fold)
    [p] = e.value.problems
    assert p.where == f"--fold {next(iter(fold))}" and want in p.rule, str(p)
    assert not (tmp_path / "out").exists()


def test_a_fold_of_an_integer_input_takes_integers_in_its_range(tmp_path):
    """An int64 state given 0.5 was truncated to 0, given 1e30 wrapped; refused naming the input now."""
    src, cal = states_model(tmp_path)
    m = onnx.load(src)
    next(v for v in m.graph.input if v.name == "c0").type.tensor_type.elem_type = T.INT64
    onnx.save(m, src)
    for value, want in ((0.5, "0.5 is no value of its type int64"), (1e30, "1e+30 is no value of its type int64")):
        with pytest.raises(UnsupportedError) as e:
            quantize(src, cal, tmp_path / "out" / "m", fold={"h0": None, "c0": value})
        assert e.value.problems[0].where == "--fold c0" and want in e.value.problems[0].rule, str(e.value)


def test_fold_and_outputs_refusals_on_the_command_line_are_one_named_line(tmp_path, capsys):
    """The CLI's own checks of --fold and --outputs named no place: a value that is no number, an empty name."""
    src, cal = states_model(tmp_path)
    base = ["quantize", str(src), "--calibration", str(cal), "-o", str(tmp_path / "out")]
    assert cli.main([*base, "--fold", "h0=zero"]) == UnsupportedError.exit_code
    assert capsys.readouterr().err.strip() == "unsupported: --fold h0=zero: the value must be a number"
    assert cli.main([*base, "--fold", "h0", "c0", "--outputs", ""]) == UnsupportedError.exit_code
    assert capsys.readouterr().err.strip() == "unsupported: '': no tensor of this name to cut the graph at"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("seed_name", ["gemm-float-c/QDQ/uint8/tensor", "gemm/QDQ/uint8/tensor"])
@pytest.mark.parametrize("shape", [(2,), (1, 2), (0,), (3, 4), (4, 1), (1, 1, 4)])
def test_a_gemms_c_that_does_not_broadcast_to_its_output_is_refused(seed_name, shape):
    """The recent-forms fuzzer's case: a float C of shape (2,) or (0,) beside a Gemm of 4 columns was an internal
    error (``shape mismatch`` putting C on the product's grid); one of shape (3, 4) beside a product of one row, float
    or quantized, imported as an output of 3 rows (ONNX broadcasts C to (M, N) one way: onnxruntime refuses it). Now
    refused naming the Gemm and C's shape; C of shape (), (4,), (1, 4) imports (``test_gemm_float_c``)."""
    m = onnx.load_from_string(HQ.recent_seeds()[seed_name])
    gemm = node(m, "Gemm")
    c = gemm.input[2]
    if HQ._init(m, c) is None:  # a quantized C: its integers, before the DequantizeLinear
        c = next(n for n in m.graph.node if n.output[0] == c).input[0]
    v = nh.to_array(HQ._init(m, c))
    set_init(m, c, np.resize(v, shape).astype(v.dtype))
    assert f"the Gemm's C of shape {shape} does not broadcast to its output (1, 4)" in refusal(m)


def test_an_empty_conv_weight_is_refused_naming_it():
    """The recent-forms fuzzer's case (the DepthToSpace seed): a Conv weight's integers of shape (0,) were an
    internal error (``cannot reshape array of size 0``); now refused naming the Conv and the weight's shape."""
    m = onnx.load_from_string(HQ.recent_seeds()["depth/QDQ/uint8/tensor"])
    set_init(m, "w1_quantized", np.zeros(0, np.int8))
    assert "conv (Conv): the Conv weight of shape (0,): a weight holds values" in refusal(m)


def test_a_per_channel_output_scale_without_a_zero_point_is_no_internal_error():
    """The quantized fuzzer's case (the DepthToSpace seed, QOperator): a QuantizeLinear whose zero point is absent
    and whose scale has one value per channel: ``cannot reshape array of size 2 into shape ()`` looking for far rows
    (which assumed one output scale). Now the per-channel scale goes on to the QLinearConv after it, which refuses
    it naming the scale."""
    m = onnx.load_from_string(HQ.recent_seeds()["depth/QOperator/int8/channel"])
    q = next(n for n in m.graph.node if n.name == "e_QuantizeLinear")
    q.input[2] = ""
    set_init(m, q.input[1], np.full(2, float(nh.to_array(HQ._init(m, q.input[1]))), np.float32))
    assert f"the scale {q.input[1]!r} has 2 values: QLinearConv quantizes this input per tensor" in refusal(m)


@pytest.mark.parametrize("axes", [[2, 2], [1, -3], [0, 0, 1]])
def test_an_unsqueeze_of_a_repeated_axis_is_refused_naming_it(axes):
    """Unsqueeze's axes naming one axis twice (-3 is axis 1 of a rank-4 output) is refused naming the node and its
    axes (the confidence seed's Unsqueeze: an internal StopIteration, found by a sweep of its constants)."""
    m = onnx.load_from_string(HQ.latest_seeds()["confidence/QDQ"])
    un = node(m, "Unsqueeze")
    un.name, un.input[1] = "unsqueeze_max", "unsqueeze_axes"
    set_init(m, "unsqueeze_axes", np.array(axes, np.int64))
    said = refusal(m)
    assert "unsqueeze_max" in said and f"Unsqueeze axes {axes} name an axis twice" in said, said


def _rnn_with_states() -> bytes:
    from support.transformers import lstm_model

    return HQ._quantized(lstm_model("forward", 1, steps=3, size=4, hidden=4, states=True, op="RNN"), "QDQ", "uint8",
                         False)


@pytest.mark.parametrize("seed", [lambda: HQ.latest_seeds()["lstm-wide-c/QDQ"],
                                  lambda: HQ.family_seeds()["GRU/QDQ/uint8/tensor"],
                                  lambda: HQ.family_seeds()["GRU/QOperator/int8/channel"], _rnn_with_states],
                         ids=["LSTM", "GRU-QDQ", "GRU-QOperator", "RNN"])
@pytest.mark.parametrize("h0", [264208.0, -264208.0, 1e20, -3e38])
def test_an_initial_h_past_32_bits_at_its_scale_is_refused_naming_the_layer(seed, h0):
    """An initial_h whose value at 1/16256 passes 32 bits is refused naming the layer (it wrapped: 264208 was
    imported as -0.126, 1e20 and 3e38 as 0; found by a sweep of the wide-cell LSTM's states)."""
    m = onnx.load_from_string(seed())
    layer = next(n for n in m.graph.node if n.op_type in ("LSTM", "GRU", "RNN"))
    layer.name = "the_layer"
    v = nh.to_array(HQ._init(m, layer.input[5])).copy()
    v.reshape(-1)[0] = h0
    set_init(m, layer.input[5], v.astype(np.float32))
    said = refusal(m)
    assert f"the_layer ({layer.op_type}): {layer.op_type} initial_h reaching {abs(h0):.3g}: past 32 bits at " \
           "1/16256" in said, said


@pytest.mark.parametrize("x_type, z, s", [(T.UINT8, 0, 3e38), (T.UINT8, 0, 1.4e36), (T.INT8, 100, 1.5e36),
                                          (T.INT8, -128, 1.3e36), (T.UINT8, 200, 1e30)])
def test_is_inf_of_a_dequantized_value_that_can_overflow_is_refused(x_type, z, s):
    """IsInf of (t - z) s is false everywhere only while |t - z| s stays within float32's range: past it
    DequantizeLinear gives inf, so the DequantizeLinear is refused (it imported as false: Where(IsInf(x), 0, x) of
    a scale of 3e38 gave x where onnxruntime gives 0; found reading the rule after the sweep of the IsInf seed's
    scales); within it the import equals onnxruntime."""
    from cvm_onnx.core.executor import execute
    from support.quantized import qdq

    lo, hi = (0, 255) if x_type == T.UINT8 else (-128, 127)
    np_type = np.uint8 if x_type == T.UINT8 else np.int8
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"], name="dq"),
             h.make_node("IsInf", ["xf"], ["t"], name="inf"),
             h.make_node("Where", ["t", "zero", "xf"], ["w"]), h.make_node("QuantizeLinear", ["w", "s", "z"], ["y"])]
    m = qdq(nodes, (2, 128), x_type, {"s": np.float32(s), "z": np_type(z), "zero": np.float32(0)}, x_type)
    x = np.arange(lo, hi + 1).reshape(2, 128).astype(np_type)
    with np.errstate(over="ignore"):
        overflows = bool(np.isinf((x.astype(np.int32) - z).astype(np.float32) * np.float32(s)).any())
    if overflows:
        with pytest.raises(UnsupportedError) as e:
            import_model(m, input_precision=9)
        [p] = e.value.problems
        assert p.where == "dq (DequantizeLinear)" and "DequantizeLinear of values reaching" in p.rule and \
            "past float32's range" in p.rule, str(p)
    else:
        import onnxruntime as ort

        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        [got] = execute(import_model(m, input_precision=9).graph, {"data": x.astype(np.int32)})
        assert np.array_equal(got.reshape(want.shape), want)
    assert overflows == (s * max(hi - z, z - lo) > 3.4028234663852886e38)


@pytest.mark.parametrize("opset", [19, 21])
@pytest.mark.parametrize("where", ["both", "dequantize"])
def test_a_float16_scale_is_refused_naming_the_node(opset, where):
    """DequantizeLinear and QuantizeLinear of a float16 scale (opset 19 on) compute in float16: onnxruntime's
    outputs differ from the exact requantization the import wrote (4 of 256 uint8 inputs through Relu at scales
    0.0312 and 0.047), also where a Cast to float32 follows; refused naming the node and the scale. Regression:
    imported, those outputs wrong."""
    from support.quantized import qdq

    f16 = {"s": True, "so": where == "both"}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"], name="dq")]
    if where == "dequantize":
        nodes.append(h.make_node("Cast", ["xf"], ["xc"], name="cast", to=T.FLOAT))
    nodes += [h.make_node("Relu", ["xc" if where != "both" else "xf"], ["r"], name="relu"),
              h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"], name="q")]
    m = qdq(nodes, (1, 8), T.UINT8, {"zx": np.uint8(3), "zo": np.uint8(5)}, T.UINT8, opset=opset)
    m.graph.initializer.extend(h.make_tensor(k, T.FLOAT16 if f16[k] else T.FLOAT, [], [v])
                               for k, v in (("s", 0.0312), ("so", 0.047)))
    with pytest.raises(UnsupportedError) as info:
        import_model(m, input_precision=9)
    assert any(p.where.startswith("dq") and "the scale 's' is float16" in p.rule for p in info.value.problems), \
        info.value


@pytest.mark.parametrize("form", ["tf", "Max", "Min", "Add"])
def test_an_empty_constant_beside_a_computed_value_is_refused_naming_the_node(form):
    """tf.math.l2_normalize's Max(S, eps) with eps of shape (0,), or a dequantized x (2, 1) against an empty
    constant in Max, Min, Add: numpy broadcasts them to an empty (2, 0); refused naming the node. Regression: an
    internal AssertionError ((2, 0), (2, 1)) (the latest fuzz target: the L2 normalization seed's eps emptied)."""
    from support.l2norm import l2_qdq
    from support.quantized import qdq

    empty = nh.from_array(np.zeros(0, np.float32), "e")
    if form == "tf":
        m = l2_qdq("tf", (2, 5), 1, T.UINT8, 0.03, 120, 1e-12, None)
        next(t for t in m.graph.initializer if t.name == "l2_eps").CopyFrom(nh.from_array(np.zeros(0, np.float32),
                                                                                          "l2_eps"))
        node = "Max"
    else:
        nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
                 h.make_node(form, ["xf", "e"], ["r"], name="op"),
                 h.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])]
        m = qdq(nodes, (2, 1), T.UINT8, {"s": np.float32(0.05), "z": np.uint8(3)}, T.UINT8)
        m.graph.initializer.append(empty)
        node = "op"
    with pytest.raises(UnsupportedError) as info:
        import_model(m, input_precision=9)
    assert any(node in p.where and "an empty tensor" in p.rule for p in info.value.problems), info.value


def test_a_mask_term_cast_to_no_onnx_type_is_refused_naming_the_node():
    """HF's (1 - Cast(m)) c with the Cast's ``to`` no ONNX type (99): refused in one line naming the Cast.
    Regression: an internal KeyError 99 (the latest fuzz target on the HF Where mask's seed)."""
    from onnx.helper import make_graph, make_tensor_value_info

    mask = make_tensor_value_info("m", T.INT64, [1, 4])
    mask.metadata_props.add(key="cvm.precision", value="2")
    consts = {"s": np.float32(0.5), "zx": np.int8(0), "so": np.float32(1 / 255), "zo": np.uint8(0),
              "c": np.float32(-10000), "one": np.float32(1)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("Cast", ["m"], ["mf"], to=99, name="cast"), h.make_node("Sub", ["one", "mf"], ["inv"]),
             h.make_node("Mul", ["inv", "c"], ["bias"]), h.make_node("Add", ["xf", "bias"], ["sc"]),
             h.make_node("Softmax", ["sc"], ["sf"], axis=-1), h.make_node("QuantizeLinear", ["sf", "so", "zo"], ["y"])]
    g = make_graph(nodes, "m", [make_tensor_value_info("x", T.INT8, [2, 4]), mask],
                   [make_tensor_value_info("y", T.UINT8, None)],
                   [nh.from_array(np.asarray(v), k) for k, v in consts.items()])
    with pytest.raises(UnsupportedError) as info:
        import_model(onnx_model(g, 17), input_precision=8)
    assert any("cast" in p.where and "type 99" in p.rule and "\n" not in str(p) for p in info.value.problems), \
        info.value


@pytest.mark.parametrize("form", ["sub-div", "mul-add"])
@pytest.mark.parametrize("shape", [(5,), (2, 3), (4, 1, 1, 1, 1)])
def test_a_per_channel_factor_that_does_not_broadcast_is_refused_naming_the_node(form, shape):
    """A uint8 image normalized inside the model whose std (a Div's or Mul's constant of several values) has a shape
    that does not broadcast into the pixels' (1, 3, 4, 3): refused in one line naming the node. Regression: an
    internal ValueError from numpy's broadcast (the norms-masks fuzz target on the image seed)."""
    from support.normalized_images import image_model

    std = np.resize(np.array([0.229, 0.224, 0.225], np.float32), shape)
    m = image_model(form, 3, np.array([0.485, 0.456, 0.406]), np.ones(3), 255.0, 0.02, 128)
    next(t for t in m.graph.initializer if t.name == "std").CopyFrom(nh.from_array(std, "std"))
    with pytest.raises(UnsupportedError) as info:
        import_model(m, input_precision=9)
    assert all("\n" not in str(p) for p in info.value.problems), info.value
    assert info.value.problems[0].where.startswith(("Div", "Mul")), info.value


@pytest.mark.parametrize("op, eps", [("Max", np.nan), ("Min", np.nan), ("Max", [0.05, np.nan]),
                                     ("Min", [np.inf, np.nan])])
def test_a_nan_max_or_min_constant_is_refused_naming_the_node(op, eps):
    """Max or Min of a dequantized x and a constant holding NaN (tf.math.l2_normalize's Max(S, eps) with eps NaN):
    one line naming the node. Regression: an internal ValueError 'cannot convert NaN to integer ratio' (the latest
    fuzz target on the L2 normalization seed)."""
    from support.quantized import qdq

    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node(op, ["xf", "e"], ["r"], name="op"),
             h.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])]
    m = qdq(nodes, (3, 2), T.UINT8, {"s": np.float32(0.05), "z": np.uint8(3), "e": np.float32(eps)}, T.UINT8)
    with pytest.raises(UnsupportedError) as info:
        import_model(m, input_precision=9)
    assert any("op" in p.where and "\n" not in str(p) for p in info.value.problems), info.value


@pytest.mark.parametrize("inputs", [["x", "x"], ["x", "m", "x", "m"]])
def test_a_graph_input_declared_twice_is_refused_naming_it(tmp_path, inputs):
    """A QDQ model whose graph declares its input x (and a second input m) more than once: refused in one line per
    name, naming it, and no model written. Regression: imported as two packed inputs of one name, whose
    quantization.json the loader then refused ('packed inputs: two or more, of distinct names') (the newest fuzz
    target, generic mutations of the ThresholdedRelu and Sum seeds)."""
    from support.quantized import qdq

    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("ThresholdedRelu", ["xf"], ["r"], alpha=0.3),
             h.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])]
    m = qdq(nodes, (2, 6), T.INT8, {"s": np.float32(0.05), "z": np.int8(3)}, T.INT8)
    declared = {"x": m.graph.input[0], "m": h.make_tensor_value_info("m", T.INT8, [2, 6])}
    del m.graph.input[:]
    m.graph.input.extend(declared[name] for name in inputs)
    onnx.save(m, tmp_path / "m.onnx")
    with pytest.raises(UnsupportedError) as info:
        api.convert(tmp_path / "m.onnx", tmp_path / "out")
    assert sorted(p.where for p in info.value.problems) == sorted(set(inputs)), info.value
    assert all("declared more than once" in str(p) and "\n" not in str(p) for p in info.value.problems)
    assert not (tmp_path / "out").exists()


def test_a_clip_of_a_constant_by_a_computed_bound_is_the_max_of_their_quantizations():
    """Clip(c, min=DequantizeLinear(x)), the constant as the clipped input (a swapped Clip): max(c, x) quantized, the
    max of each one's QuantizeLinear. Regression: an internal AttributeError ('Tensor' object has no attribute 't':
    the constant handed to QuantizeLinear's rule as a value), the newest fuzz target on the GeM seed."""
    from support.quantized import qdq

    from cvm_onnx.core.executor import execute

    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node("Clip", ["c", "xf"], ["r"]),
             h.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])]
    m = qdq(nodes, (16, 16), T.INT8, {"s": np.float32(0.05), "z": np.int8(3), "c": np.float32(0.3)}, T.INT8)
    imp = import_model(m, input_precision=8)
    x = np.arange(-128, 128).reshape(16, 16)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    c = round(Fraction(float(np.float32(0.3))) / Fraction(float(np.float32(0.05)))) + 3
    assert np.array_equal(got.reshape(x.shape), np.maximum(x, c))


@pytest.mark.parametrize("mode, inputs, said", [
    ("nearest", ["x", "", ""], "neither scales nor sizes"), ("nearest", ["x"], "neither scales nor sizes"),
    ("nearest", ["x", "", "sc", "sz"], "both scales and sizes"), ("linear", ["xf", "", ""], "neither scales nor sizes"),
    ("linear", ["xf", "", "sc", "sz"], "both scales and sizes")])
def test_a_resize_of_neither_or_both_scales_and_sizes_is_refused_naming_it(mode, inputs, said):
    """Resize needs exactly one of scales and sizes (onnxruntime refuses the model otherwise): nearest of integers
    and linear between quantized tensors, refused in one line naming the node. Regression: an internal
    AttributeError ('NoneType' object has no attribute 'value'), the newest13 fuzz target on its Resize seeds."""
    from support.quantized import qdq

    inits = {"s": np.float32(0.05), "z": np.int8(3), "sc": np.array([1, 1, 2, 2], np.float32),
             "sz": np.array([1, 2, 8, 8], np.int64)}
    resize = h.make_node("Resize", inputs, ["r"], name="up", mode=mode)
    nodes = [resize] if mode == "nearest" else [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), resize,
                                                h.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])]
    m = qdq(nodes, (1, 2, 4, 4), T.INT8, inits, T.INT8, out="r" if mode == "nearest" else "y", opset=19)
    with pytest.raises(CVMError) as e:
        import_model(m, input_precision=9)
    [p] = e.value.problems
    assert p.where == "up (Resize)" and f"Resize with {said}: ONNX requires exactly one" in p.rule, p


@pytest.mark.parametrize("kernel, strides, ceil", [([(1 << 31) - 1, 1], [2, 2], 1), ([(1 << 31) - 1, 1], [2, 2], 0),
                                                   ([1 << 30, 1], [1 << 30, 1], 1), ([8, 1], [4, 1], 1)])
def test_an_average_pool_kernel_past_the_padded_input_is_refused_before_allocating_it(kernel, strides, ceil):
    """AveragePool of a kernel larger than the padded input (5 + 1 values), with or without ceil_mode (whose one
    window may pass the input by less than a stride): refused in one line naming the node, before the kernel's
    weights are allocated. Regression: a MemoryError allocating 32 GiB of ones (the newest13 fuzz target on the
    ceil_mode seed)."""
    from support.quantized import qdq

    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("AveragePool", ["xf"], ["p"], name="pool", kernel_shape=kernel, strides=strides,
                         pads=[0, 0, 1, 0], ceil_mode=ceil),
             h.make_node("QuantizeLinear", ["p", "s", "z"], ["y"])]
    m = qdq(nodes, (1, 2, 5, 7), T.INT8, {"s": np.float32(0.05), "z": np.int8(3)}, T.INT8, opset=19)
    with pytest.raises(CVMError) as e:
        import_model(m, input_precision=9)
    [p] = e.value.problems
    assert p.where == "pool (AveragePool)" and f"the kernel ({kernel[0]}) is larger than the padded input (6)" in p.rule


@pytest.mark.parametrize("name, attrs, said", [("su\ns", {"exclu\x1bive": 1}, r"unknown attribute 'exclu\x1bive'"),
                                               ("su\u2028ms", {"reverse": 1.5}, "attribute reverse must be INT"),
                                               ("sums\r", {}, None)])
def test_a_problem_at_a_node_named_with_a_line_break_is_one_line(tmp_path, capsys, name, attrs, said):
    """A node whose name (or attribute's name) holds a line break or a control character: each problem printed as
    one line, those characters escaped, by the import (its file checks and its rules) and by the command line.
    Regression: 'su\\ns: CumSum: unknown attribute ...' took two lines (the newest13 fuzz target's generic mutation
    of the CumSum seed)."""
    from support.quantized import qdq

    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("CumSum", ["xf", "ax"], ["c"], name=name, **attrs),
             h.make_node("QuantizeLinear", ["c", "s", "z"], ["y"])]
    m = qdq(nodes, (2, 3), T.INT8, {"s": np.float32(0.05), "z": np.int8(3), "ax": np.array(1, np.int64)}, T.INT8, 18)
    if said is None:  # a rule's refusal: a CumSum of an axis input that is no constant
        m.graph.node[1].input[1] = "x"
    with pytest.raises(CVMError) as e:
        import_model(m, input_precision=9)
    assert e.value.problems and all("\n" not in str(p) and "\r" not in str(p) and "\u2028" not in str(p)
                                    for p in e.value.problems), e.value.problems
    assert len(str(e.value).splitlines()) == len(e.value.problems)
    assert said is None or said in str(e.value), str(e.value)
    onnx.save(m, tmp_path / "m.onnx")
    assert cli.main(["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == len(e.value.problems), err


@pytest.mark.parametrize("op, kernel", [("MaxPool", [9, 9]), ("MaxPool", [1]), ("MaxPool", [1, 1, 2, 2]),
                                        ("Conv", [3, 3]), ("Conv", [1, 1, 3, 3])])
def test_a_3d_kernel_of_another_rank_is_refused_naming_the_node(op, kernel):
    """A MaxPool (of int8 values, as onnxruntime's QOperator models have it) or a QDQ Conv of a 3-D image (one frame)
    whose kernel_shape or weight has not 3 spatial axes: refused in one line naming the node. Regression: an
    internal IndexError in single_axes (the newest13 fuzz target's hunt on the 3-D QOperator seed)."""
    from support.quantized import qdq
    from test_quantize_fresh12 import dq_conv

    if op == "MaxPool":
        m = qdq([h.make_node("MaxPool", ["x"], ["r"], name="pool", kernel_shape=kernel)], (1, 2, 1, 6, 5), T.INT8, {},
                T.INT8, out="r", opset=12)
    else:
        m = dq_conv((1, 3, 1, 6, 6), np.ones((4, 3, *kernel), np.int8), {}, False)
    with pytest.raises(CVMError) as e:
        import_model(m, input_precision=9)
    [p] = e.value.problems
    assert p.where == ("pool (MaxPool)" if op == "MaxPool" else "conv (Conv)"), p
    assert (f"kernel of shape {tuple(kernel)} on a 3-D image: one size per spatial axis" in p.rule or
            f"kernel_shape={kernel} must have 3 value(s)" in p.rule), p


@pytest.mark.parametrize("outputs, packed", [(["wt", "wt"], True), (["wt"], False), (["w"], True)])
def test_outputs_computed_from_constants_alone_are_refused_naming_them(tmp_path, outputs, packed):
    """--outputs at a tensor no graph input reaches (a weight, or a Transpose of it): the cut graph has no input,
    refused in one line per name by quantize (a model of one input, or of two from an .npz) and by convert.
    Regression: quantize's internal IndexError running onnxruntime on a graph of no input (the quantize-newest13
    fuzz target: the T5 block cut at its position bias's Gather of constant buckets), or quantize_static's failure
    ('Invalid input name: x')."""
    rng = np.random.default_rng(0)
    ins = ["x", "v"] if packed else ["x"]
    g = h.make_graph([h.make_node("Sum", ins, ["a"]), h.make_node("MatMul", ["a", "w"], ["y"]),
                      h.make_node("Transpose", ["w"], ["wt"])], "m",
                     [h.make_tensor_value_info(x, T.FLOAT, [1, 4]) for x in ins],
                     [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(rng.normal(size=(4, 3)).astype(np.float32), "w")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), tmp_path / "f.onnx")
    samples = {x: rng.normal(size=(6, 1, 4)).astype(np.float32) for x in ins}
    cal = tmp_path / ("c.npz" if packed else "c.npy")
    np.savez(cal, **samples) if packed else np.save(cal, samples["x"])
    for run in (lambda: quantize(tmp_path / "f.onnx", cal, tmp_path / "out" / "m", outputs=outputs),
                lambda: api.convert(tmp_path / "f.onnx", tmp_path / "out" / "c", outputs=outputs)):
        with pytest.raises(UnsupportedError) as e:
            run()
        assert [(p.where, p.rule) for p in e.value.problems] == \
            [(outputs[0], "computed from constants alone: a graph cut there reads no input")], e.value
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("before, shape", [(None, (1, 2, 4, 4)), ("Exp", (1, 2, 4, 4)), (None, (1, 2, 3, 4, 4)),
                                           ("Log", (1, 2, 3, 4, 4))])
@pytest.mark.parametrize("read", [False, True])
def test_a_max_pool_indices_output_of_dequantized_values_is_refused_naming_the_node(before, shape, read):
    """A MaxPool of dequantized values (or of a nondecreasing function of them, the max of the function's form; 2-D
    or 3-D over depth taps) whose Indices output is a graph output, or read by a Cast: refused in one line naming the
    node and the output. Regression: an internal AttributeError ('NoneType' object has no attribute 'shape'): the
    move rule made the Indices' None a quantized value (the fuzz14 target's reading of the max-of-a-function form)."""
    from support.quantized import qdq

    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"])]
    nodes += [h.make_node(before, ["xf"], ["f"])] if before else []
    nodes += [h.make_node("MaxPool", ["f" if before else "xf"], ["p", "idx"], name="pool",
                          kernel_shape=[2] * (len(shape) - 2)),
              h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
    nodes += [h.make_node("Cast", ["idx"], ["i32"], to=T.INT32)] if read else []
    inits = {"s": np.float32(0.05), "z": np.uint8(0), "so": np.float32(0.1), "zo": np.uint8(0)}
    m = qdq(nodes, shape, T.UINT8, inits, T.UINT8, opset=13)
    m.graph.output.append(h.make_tensor_value_info("i32" if read else "idx", T.INT32 if read else T.INT64, None))
    with pytest.raises(UnsupportedError) as e:
        import_model(m, input_precision=9)
    assert [(p.where, p.rule) for p in e.value.problems] == \
        [("pool (MaxPool)", "output 1 ('idx') has no CVM form")], e.value


@pytest.mark.parametrize("op, shape, attrs, said", [
    ("MaxPool", (1, 2, 3, 5, 5), {"kernel_shape": [HQ.BIG, 1, 1]}, "has a depth window of padding only, or none"),
    ("MaxPool", (1, 2, 3, 5, 5), {"kernel_shape": [2, 1, 1], "pads": [HQ.BIG, 0, 0, 0, 0, 0]},
     "MaxPool 3-D: its 2147483649 x 2 depth taps hold 214748364900 values, more than 2^24"),
    ("Conv", (1, 2, 3, 5, 5), {"kernel_shape": [2, 1, 1], "pads": [0, 0, 0, HQ.BIG, 0, 0]},
     "Conv 3-D: its 2147483649 x 2 depth taps hold 214748364900 values, more than 2^24"),
    ("AveragePool", (1, 2, 5, 5), {"kernel_shape": [1 << 30, 1], "pads": [1 << 30, 0, 0, 0], "count_include_pad": 1},
     "AveragePool kernel (1073741824, 1) over 2 channels: its weights would hold 2147483648 values, more than 2^24"),
    ("AveragePool", (1, 2, 3, 5, 5), {"kernel_shape": [HQ.BIG, 1, 1]},
     "AveragePool kernel (2147483647, 1, 1) over 2 channels: its weights would hold 4294967294 values"),
    ("AveragePool", (1, 2, 3, 5, 5), {"kernel_shape": [2, 1 << 30, 1], "pads": [0, 1 << 30, 0, 0, 0, 0],
                                      "count_include_pad": 1}, "its weights would hold 4294967296 values"),
    ("LpPool", (1, 2, 6), {"p": 1, "kernel_shape": [HQ.BIG], "pads": [HQ.BIG - 1, HQ.BIG - 1]},
     "its 2147483652 x 2147483647 windows along axis 2 hold 9223372049739677688 values, more than 2^24"),
    ("LpPool", (1, 2, 3, 4), {"p": 2, "kernel_shape": [1, 1 << 28], "pads": [0, 1 << 28, 0, 1 << 28]},
     "its 268435461 x 268435456 windows along axis 3"),
    ("AveragePool", (1, 2, 3, 4, 5), {"kernel_shape": [1, 1, 1 << 28], "pads": [0, 0, (1 << 28) - 1, 0, 0,
                                                                                (1 << 28) - 1]},
     "windows along axis 4 hold")])
def test_huge_kernels_and_pads_of_pools_and_3d_convs_are_refused_before_allocating(op, shape, attrs, said):
    """A 3-D MaxPool or Conv whose depth kernel or pads reach 2^31 (its depth taps' indices), an AveragePool (2-D or
    3-D) whose kernel within as large pads holds 2^31 positions (its weights of ones), an LpPool or uncounted 3-D
    AveragePool whose windows along an axis take 2^31 or 2^56 taps (their indices): refused in one line naming the
    node, before those are allocated. Regression: MemoryError allocating 2 to 16 GiB (or 45 s for 2 GiB) (the
    fuzz14 target's depth kernels and pads); for the windows' taps, 16 GiB and 512 PiB (fuzz15's hand grid)."""
    from support.quantized import qdq
    from test_quantize_fresh12 import dq_conv

    if op == "Conv":
        m = dq_conv(shape, np.ones((2, 2, *attrs["kernel_shape"]), np.int8), {"pads": attrs["pads"]}, False)
    else:
        nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
                 h.make_node(op, ["xf"], ["p"], name="pool", **attrs),
                 h.make_node("QuantizeLinear", ["p", "s", "z"], ["y"])]
        m = qdq(nodes, shape, T.INT8, {"s": np.float32(0.05), "z": np.int8(3)}, T.INT8, opset=19)
    with pytest.raises(CVMError) as e:
        import_model(m, input_precision=9)
    [p] = e.value.problems
    assert p.where == ("conv (Conv)" if op == "Conv" else f"pool ({op})") and said in p.rule, p


def test_a_conv_of_an_empty_map_onnxruntime_dies_on_is_refused_in_one_line(tmp_path):
    """An AveragePool under ceil_mode whose kernel passes the map by a stride (13 on 12 x 12, stride 1: an empty
    map) read by a Conv of 8 channels: onnxruntime's calibration refuses it, and its optimized session (NCHWc)
    dies of SIGFPE on it; quantize reports the calibration's failure in one line, nothing written. Regression: the
    process killed by signal 8 in quantize's check for non-finite activations (the quantize-newest14 target on the
    mean AveragePool seed, its strides removed)."""
    from cvm_onnx.core.errors import RuntimeFailure
    from support.quantized import between_convs

    onnx.save(between_convs([h.make_node("AveragePool", ["a"], ["b"], kernel_shape=[13, 13], ceil_mode=1)], {}),
              tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(6, 8, 12, 12)).astype(np.float32))
    with pytest.raises(RuntimeFailure) as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "out" / "m")
    assert len(e.value.problems) == 1 and "\n" not in str(e.value), e.value
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("op, shape, attrs", [
    ("AveragePool", (1, 2, 6), {"kernel_shape": [3], "pads": [-1, 0]}),
    ("AveragePool", (1, 2, 6, 6), {"kernel_shape": [3, 3], "pads": [0, 0, 0, -2], "count_include_pad": 1}),
    ("AveragePool", (1, 2, 4, 5, 6), {"kernel_shape": [2, 2, 3], "pads": [0, 0, -1, 0, 0, 0]}),
    ("LpPool", (1, 2, 6), {"p": 2, "kernel_shape": [3], "pads": [-1, 0]}),
    ("MaxPool", (1, 2, 6), {"kernel_shape": [3], "pads": [0, -1]}),
    ("Conv", (1, 2, 6, 6), {"pads": [-1, 0, 0, 0]})])
def test_negative_pads_are_refused_naming_the_node(op, shape, attrs):
    """Explicit pads below 0 (ONNX's shape inference refuses them, and so onnxruntime, at load): refused in one
    line naming the node. Regression: imported as a crop of the input (fuzz15's hand grid)."""
    from support.quantized import qdq
    from test_quantize_fresh12 import dq_conv

    if op == "Conv":
        m = dq_conv(shape, np.ones((2, 2, 3, 3), np.int8), attrs, False)
    else:
        nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
                 h.make_node(op, ["xf"], ["p"], name="pool", **attrs),
                 h.make_node("QuantizeLinear", ["p", "s", "z"], ["y"])]
        m = qdq(nodes, shape, T.INT8, {"s": np.float32(0.05), "z": np.int8(3)}, T.INT8, opset=19)
    with pytest.raises(UnsupportedError) as e:
        import_model(m, input_precision=9)
    [p] = e.value.problems
    assert p.where == ("conv (Conv)" if op == "Conv" else f"pool ({op})") and "hold a negative value" in p.rule, p


@pytest.mark.parametrize("nodes", [
    [h.make_node("ScatterElements", ["a", "idx"], ["b"], axis=1)],
    [h.make_node("SequenceConstruct", ["a", "a"], ["sq"]), h.make_node("ConcatFromSequence", [], ["b"], axis=1)]],
    ids=["ScatterElements", "ConcatFromSequence"])
def test_a_node_lacking_inputs_a_rewrite_reads_is_refused_in_one_line(tmp_path, nodes):
    """A ScatterElements of two inputs (no updates), a ConcatFromSequence of none: quantize's rewrites (a scatter of
    constant indices as a Gather, a sequence's Concat) leave them, and onnxruntime's refusal is said in one line.
    Regression: IndexError in scatters_as_gathers and sequences_as_concats (fuzz15's hand grid)."""
    from cvm_onnx.core.errors import RuntimeFailure
    from support.quantized import between_convs

    onnx.save(between_convs(nodes, {"idx": np.zeros((1, 1, 12, 12), np.int64)}), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(4, 8, 12, 12)).astype(np.float32))
    with pytest.raises(RuntimeFailure) as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "out" / "m")
    assert len(e.value.problems) == 1 and "\n" not in str(e.value), e.value
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("shape", [(2,), (1, 3, 1, 1)])
def test_a_where_of_a_constant_condition_that_does_not_broadcast_is_refused_in_one_line(first, shape):
    """Where(cond, c, x) of a constant condition of one value whose shape does not broadcast with x (1, 2, 3, 3):
    refused in one line naming the node and the shapes. Regression: an internal ValueError of numpy's broadcast in
    the constant condition's shortcut (the wrong-result hunt on fuzz15's where-const seed)."""
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Where", ["cond", "c", "xf"] if first else ["cond", "xf", "c"], ["r"], name="where"),
             h.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])]
    m = qdq(nodes, (1, 2, 3, 3), T.INT8, {"s": np.float32(0.05), "z": np.int8(3), "cond": np.full(shape, first),
                                          "c": np.float32(-1e4)}, T.INT8)
    with pytest.raises(UnsupportedError) as e:
        import_model(m, input_precision=9)
    [p] = e.value.problems
    assert p.where == "where (Where)" and "do not broadcast" in p.rule, p


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint8, np.float32])
@pytest.mark.parametrize("value", [0, 1])
def test_a_where_whose_constant_condition_is_not_bool_is_refused_by_its_schema(dtype, value):
    """Where(cond, x, c) of dequantized x whose constant condition is not bool: ONNX's schema takes only bool there
    and onnxruntime refuses the model, so the import refuses the node in one line naming the type. Regression: it
    imported, reading any nonzero integer as true (fuzz15's int64 condition)."""
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Where", ["cond", "xf", "c"], ["r"], name="where"),
             h.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])]
    m = qdq(nodes, (1, 2, 3, 3), T.INT8, {"s": np.float32(0.05), "z": np.int8(3), "cond": np.full((1, 2, 3, 3), value,
                                                                                                   dtype),
                                          "c": np.float32(0.1)}, T.INT8)
    with pytest.raises(UnsupportedError) as e:
        import_model(m, input_precision=9)
    [p] = e.value.problems
    assert p.where == "where (Where)" and "input 0 (condition)" in p.rule and "tensor(bool)" in p.rule, p


def test_an_empty_map_past_calibration_is_refused_before_onnxruntime_runs(tmp_path, monkeypatch):
    """The same float model, had calibration passed it (a quantizer writing the QDQ model of the empty map): the
    import refuses the pool in one line before onnxruntime runs the float model for the comparison (its default
    session, this process: SIGFPE), and nothing is written."""
    import cvm_onnx.app.quantize as Q
    from support.quantized import between_convs

    def calibrated(src, out, *args, **kwargs):
        dq, qn = (functools.partial(h.make_node, op) for op in ("DequantizeLinear", "QuantizeLinear"))
        w = np.ones((8, 8, 1, 1), np.int8)
        nodes = [qn(["x", "s", "z"], ["xq"]), dq(["xq", "s", "z"], ["xf"]),
                 h.make_node("AveragePool", ["xf"], ["p"], name="pool", kernel_shape=[13, 13], ceil_mode=1),
                 qn(["p", "s", "z"], ["pq"]), dq(["pq", "s", "z"], ["pf"]), dq(["w", "sw"], ["wf"]),
                 h.make_node("Conv", ["pf", "wf"], ["c"], name="conv"), qn(["c", "s", "z"], ["cq"]),
                 dq(["cq", "s", "z"], ["y"])]
        m = qdq(nodes, (1, 8, 12, 12), T.FLOAT, {"s": np.float32(0.1), "z": np.int8(0), "w": w,
                                                 "sw": np.float32(0.1)}, T.FLOAT)
        onnx.save(m, out)

    def never(*args, **kwargs):
        raise AssertionError("onnxruntime ran the models of an empty map")

    monkeypatch.setattr(Q, "_quantize_static", calibrated)
    monkeypatch.setattr(Q, "onnx_outputs", never)
    onnx.save(between_convs([h.make_node("AveragePool", ["a"], ["b"], kernel_shape=[13, 13], ceil_mode=1)], {}),
              tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(6, 8, 12, 12)).astype(np.float32))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "out" / "m")
    [p] = e.value.problems
    assert p.where == "pool (AveragePool)" and "larger than the padded input" in p.rule, p
    assert not (tmp_path / "out").exists()


def test_a_matmul_of_batch_dims_that_do_not_broadcast_is_refused_naming_it():
    """MatMul of a (3, 2, 4) and its Reshape to (2, 4, 3): batch dims (3,) and (2,) (the fuzzer's windows seed of an
    input dim 8 made 1048576): numpy's broadcasting ValueError came through as an internal error; now one line
    naming the MatMul and both shapes."""
    m = qdq([h.make_node("DequantizeLinear", ["x", "s", "z"], ["a"]), h.make_node("Reshape", ["a", "shape"], ["b"]),
             h.make_node("MatMul", ["a", "b"], ["r"], name="mm"),
             h.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])],
            (3, 2, 4), T.INT8, {"s": np.float32(0.05), "z": np.int8(3), "shape": np.array([2, 4, 3], np.int64)}, T.INT8)
    with pytest.raises(UnsupportedError) as e:
        import_model(m, input_precision=9)
    [p] = e.value.problems
    assert p.where == "mm (MatMul)" and p.rule == "shapes [(3,), (2,)] do not broadcast", p
    assert HQ.check(m.SerializeToString()) == "UnsupportedError"


@pytest.mark.parametrize("op", ["Mul", "Equal", "Greater", "Add", "Div", "Max", "Where"])
def test_a_broadcasting_op_of_computed_shapes_that_do_not_broadcast_is_refused_by_onnxs_rule(op):
    """op(DQ(a) (2, 5, 3), DQ(b) (4, 5, 1)) (fuzz18's masked mean of a mask dim made 4096): refused in one line
    naming the node and ONNX's broadcasting, not a CVM op's own rule. Regression: Mul, Equal and Greater were
    refused with 'broadcast_mul: shapes ... do not broadcast' ('broadcast_greater', ...)."""
    inputs = ["c", "af", "bf"] if op == "Where" else ["af", "bf"]
    nodes = [h.make_node("DequantizeLinear", ["a", "s", "z"], ["af"]),
             h.make_node("DequantizeLinear", ["b", "s", "z"], ["bf"]),
             *([h.make_node("Greater", ["af", "zf"], ["c"])] if op == "Where" else []),
             h.make_node(op, inputs, ["r"], name="op"),
             *([h.make_node("Cast", ["r"], ["rf"], to=T.FLOAT)] if op in ("Equal", "Greater") else []),
             h.make_node("QuantizeLinear", ["rf" if op in ("Equal", "Greater") else "r", "s", "z"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("a", T.INT8, [2, 5, 3]),
                                  h.make_tensor_value_info("b", T.INT8, [4, 5, 1])],
                     [h.make_tensor_value_info("y", T.INT8, None)],
                     [nh.from_array(np.float32(0.05), "s"), nh.from_array(np.int8(0), "z"),
                      nh.from_array(np.float32(0), "zf")])
    with pytest.raises(UnsupportedError) as e:
        import_model(onnx_model(g, 17), input_precisions={"a": 8, "b": 8})
    [p] = e.value.problems
    assert p.where == f"op ({op})" and p.rule.startswith(f"{op}: input shapes (2, 5, 3), ") and \
        "do not broadcast (ONNX's multidirectional broadcasting" in p.rule, p


@pytest.mark.parametrize("lo, hi", [(np.inf, None), (np.inf, np.inf), (None, -np.inf), (np.nan, None),
                                    (None, np.nan), (-np.inf, np.nan)])
@pytest.mark.parametrize("count", [False, True])
def test_a_clip_bound_that_is_not_finite_and_binds_is_refused_naming_the_clip(lo, hi, count):
    """Clip(x, inf) is inf throughout (max -inf: -inf; a NaN bound: NaN), onnxruntime's QDQ model the output's end
    (a masked mean's count clipped so: a / inf = 0): refused in one line naming the Clip and its bound; min -inf and
    max inf still clip nothing. Regression: a non-finite bound was read as no bound, and the model imported as
    x requantized (fuzz18's masked mean of Clip(count, inf, inf): 128 steps from onnxruntime)."""
    from test_masked_pooling16 import masked_mean_qdq

    if count:
        m = masked_mean_qdq((2, 5, 3), T.INT8, 0.05, 3, 0.02, 128, 0.01, 128, 1.0, "clip", "grid", False)
        clip = next(n for n in m.graph.node if n.op_type == "Clip")
        consts = {}
    else:
        clip = h.make_node("Clip", ["xf", "", ""], ["r"], name="clip")
        m, consts = None, {}
    clip.name = "clip"
    for k, v in ((1, lo), (2, hi)):
        clip.input[k] = "" if v is None else f"b{k}"
        consts.update({} if v is None else {f"b{k}": np.float32(v)})
    if m is None:
        m = HQ.between(clip, (2, 3), consts)
    else:
        m.graph.initializer.extend(nh.from_array(v, k) for k, v in consts.items())
    with pytest.raises(UnsupportedError) as e:
        import_model(m, input_precisions={"x": 9, "m": 2})
    [p] = e.value.problems
    assert p.where == "clip (Clip)" and re.fullmatch(r"Clip (min|max) (inf|-inf|nan) must be finite or -?inf",
                                                     p.rule), p



def test_an_antialiased_resize_reading_too_many_inputs_an_output_is_refused_before_its_weights():
    """Resize with antialias of an axis of 2^24 values to 5 (fuzz18's mutant of an input dim): each output reads
    6.7 million inputs; refused in one line within the time bound, naming the node and the count. Regression: its
    weights were computed tap by tap first (minutes; the fuzzer's hang)."""
    from support.fuzz import bounded
    from test_ops16 import resize_node, resize_qdq

    m = resize_qdq((1, 1, 1, 1 << 24), T.INT8, 0, 0.05, 0.05, 0, *resize_node((1, 1, 1, 5), 1, "half_pixel", None,
                                                                              False))
    errors = []

    def imported():
        try:
            import_model(m, input_precision=9)
        except CVMError as e:
            errors.append(e)
            raise

    bounded(imported, m.ByteSize())
    [p] = errors[0].problems
    assert p.where == "rs (Resize)" and "reads 6710887 inputs per output, past the 4096" in p.rule, p


@settings(max_examples=20, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(st.deferred(lambda: HQ.mutated(HQ.newest18_seeds())))
def test_mutated_models_of_the_newest18_forms_are_refused_cleanly_or_imported_exactly(case):
    """Masked mean and max pooling, a function of a sum on two grids, antialiased and cubic Resize, the float tails
    and a Sub cancelling a term: their bounds at their edges (a Clip's min equal to or above its max, past the
    data's range, 0 or negative), attributes, constants, input dims and quantization parameters mutated; a refusal
    stating a CVM op's own rule fails (``HQ.cvm_rule``)."""
    outcome = HQ.check(case.files[0])
    assert outcome in HQ.CLEAN, (case, outcome)


@pytest.mark.parametrize("op", ["Resize", "Mul", "Sub"])
def test_a_dequantized_value_past_float32s_range_is_refused_naming_the_dequantize_linear(op):
    """DequantizeLinear at scale 3e38: float32 gives inf from |x - z| = 2 (the product rounds past 2^128 - 2^103),
    and a cubic Resize (exclude_outside) or x * 0, x - x of those gives NaN, where the import held the exact
    values (fuzz18: 255 steps from onnxruntime): refused in one line naming the DequantizeLinear; at 1.3e36 (a masked
    fill's grid) every int8 value stays finite and the Resize imports."""
    for s, refused in ((3e38, True), (1.3e36, False))[:2 if op == "Resize" else 1]:
        node = {"Resize": h.make_node("Resize", ["xf", "", "", "sz"], ["r"], mode="cubic", exclude_outside=1,
                                      coordinate_transformation_mode="align_corners"),
                "Mul": h.make_node("Mul", ["xf", "zero"], ["r"]), "Sub": h.make_node("Sub", ["xf", "xf"], ["r"])}[op]
        m = qdq([h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"], name="dq"), node,
                 h.make_node("QuantizeLinear", ["r", "so", "z"], ["y"])], (1, 1, 2, 4), T.INT8,
                {"s": np.float32(s), "z": np.int8(3), "so": np.float32(0.05), "zero": np.float32(0),
                 "sz": np.array([1, 1, 3, 7], np.int64)}, T.INT8, opset=18)
        if not refused:
            import_model(m, input_precision=9)
            continue
        with pytest.raises(UnsupportedError) as e:
            import_model(m, input_precision=9)
        [p] = e.value.problems
        assert p.where == "dq (DequantizeLinear)" and "past float32's range" in p.rule, p


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ArgMax"])
def test_a_keepdims_other_than_0_or_1_is_refused_naming_the_node(op):
    """keepdims = 2: onnxruntime keeps no reduced axis (it reads keepdims == 1), onnx's reference keeps it; the import
    kept it, a result of another shape than onnxruntime's (fuzz18's masked mean of a ReduceSum keepdims 2): refused
    in one line naming the node and the attribute."""
    kw = {"axis": 1} if op == "ArgMax" else {"axes": [1]}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node(op, ["xf"], ["r"], name="reduce", keepdims=2, **kw),
             *([] if op == "ArgMax" else [h.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])])]
    m = qdq(nodes, (2, 3), T.INT8, {"s": np.float32(0.05), "z": np.int8(3)}, T.INT64 if op == "ArgMax" else T.INT8,
            opset=12, out="r" if op == "ArgMax" else "y")
    with pytest.raises(CVMError) as e:
        import_model(m, input_precision=9)
    [p] = e.value.problems
    assert p.where.startswith("reduce") and p.rule == (f"{op}: attribute keepdims must be 0 or 1, got 2 (onnxruntime "
                                                       "reads it as 0, onnx's reference as 1)"), p


def test_a_sum_past_32_bits_is_refused_naming_the_node_not_the_cvm_op():
    """ReduceSum of 2^24 int8 values (fuzz18's masked mean of a token dim made 2^24) needs 33 bits: refused in one
    line naming the ReduceSum and the bound, not the CVM op. Regression: 'sum of inputs with precisions [8] needs 33
    bits (CVM allows 32)'."""
    m = qdq([h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("ReduceSum", ["xf", "ax"], ["r"], name="sum", keepdims=0),
             h.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])], (1, 1 << 24), T.INT8,
            {"s": np.float32(0.05), "z": np.int8(0), "ax": np.array([1], np.int64)}, T.INT8, opset=13)
    with pytest.raises(UnsupportedError) as e:
        import_model(m, input_precision=8)
    [p] = e.value.problems
    assert p.where == "sum (ReduceSum)" and "needs 33 bits, past CVM's 32" in p.rule and not HQ.cvm_rule(p.rule), p
