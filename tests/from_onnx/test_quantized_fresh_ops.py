"""The quantized front's rules of issue 34 (ops real float models use that had no integer form: Max/Min with a
constant, PRelu, GlobalMaxPool, ReduceMax/Min/Sum, Reciprocal, Log at 0, Pow tables, a float tail after the last
QuantizeLinear), each on one small QDQ model with an integer input, against an exact oracle: the rational value
rounded (same-scale forms), or the oracle of docs/import.md with every requantization checked against its bound."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx.reference import ReferenceEvaluator
from support.quantized import Oracle, declared, qdq, written_softmax
from test_quantized_rules import softmax_oracle

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import CVMError
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.verify import verify

SETTINGS = settings(max_examples=10, deadline=None)
NP = {T.INT8: np.int8, T.UINT8: np.uint8}
RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255)}
scales = st.floats(2.0**-8, 2.0**2, width=32)
x_types = st.sampled_from([T.INT8, T.UINT8])


def draw_x(d, shape, dtype):
    lo, hi = RANGE[dtype]
    return np.asarray(d.draw(st.lists(st.integers(lo, hi), min_size=math.prod(shape), max_size=math.prod(shape))),
                      np.int64).reshape(shape)


def run(m, x: np.ndarray):
    """(the import, its outputs on x by the reference executor); the export computes the same on onnxruntime."""
    imp = import_model(m, input_precision=9)
    got = execute(imp.graph, {"data": x.astype(np.int32)})
    assert verify(imp.graph, x.astype(np.int32)).exact
    return imp, [g.astype(np.int64) for g in got]


def oracle_equal(m, x: np.ndarray) -> None:
    """Every output equals the oracle of docs/import.md (each requantization by its plan, within its bound)."""
    imp, got = run(m, x)
    want = Oracle(m, imp).run(x.astype(np.int64))
    for g_, w_ in zip(got, want, strict=True):
        w_ = np.asarray(w_[1])
        assert g_.shape == w_.shape or (w_.ndim == 0 and g_.shape == (1,))  # CVM holds a scalar as (1,)
        assert np.array_equal(g_, w_.reshape(g_.shape))


def quantized(real, s: Fraction, z: int, dtype) -> np.ndarray:
    """QuantizeLinear of exact rationals: round half to even, + z, saturated."""
    lo, hi = RANGE[dtype]
    return np.vectorize(lambda r: min(max(round(r / s) + z, lo), hi), otypes=[np.int64])(real)


def zero(d, dtype) -> int:
    return d.draw(st.integers(*RANGE[dtype]))


# -- Max and Min with a constant, of values of one scale -----------------------------------------------------------
@SETTINGS
@given(d=st.data(), s=scales, c=st.floats(-40, 40, width=32), op=st.sampled_from(["Max", "Min"]), x_type=x_types,
       on_grid=st.booleans(), first=st.booleans())
def test_max_min_with_a_constant_is_a_clip(d, s, c, op, x_type, on_grid, first):
    """Max(x, c) = Clip(x, c, inf), Min(x, c) = Clip(x, -inf, c), quantized at x's own scale: exactly
    Q(max((x - z) s, c)) for every x, c on the grid or off it (then the clip is deferred to the QuantizeLinear).
    Regression: 'float Max of dequantized values has no integer form' (tf2onnx's maximum after LeakyRelu)."""
    z = zero(d, x_type)
    if on_grid:
        c = float(np.float32(d.draw(st.integers(-60, 60)) * np.float32(s)))
    inits = {"s": np.float32(s), "z": NP[x_type](z), "c": np.float32(c)}
    ins = ["c", "xf"] if first else ["xf", "c"]
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node(op, ins, ["r"]),
             h.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])]
    shape = (2, 7)
    x = draw_x(d, shape, x_type)
    sf, cf = Fraction(float(np.float32(s))), Fraction(float(np.float32(c)))
    real = np.vectorize(lambda v: (max if op == "Max" else min)((v - z) * sf, cf), otypes=[object])(x)
    want = quantized(real, sf, z, x_type)
    try:
        _, [got] = run(qdq(nodes, shape, x_type, inits, x_type), x)
    except CVMError as e:  # a constant that leaves one value of the type: refused as such
        assert "single value" in str(e)
        return
    assert np.array_equal(got, want)


@SETTINGS
@given(d=st.data(), s=scales, so=scales, op=st.sampled_from(["Max", "Min"]), x_type=x_types)
def test_max_min_of_values_of_one_scale(d, s, so, op, x_type):
    """Max/Min of two dequantized values of one scale and zero point (the halves of a Split): the integer max/min
    of their integers, requantized at another scale; equal to the oracle (Max/Min on the integers, then the plan)."""
    z = zero(d, x_type)
    inits = {"s": np.float32(s), "z": NP[x_type](z), "so": np.float32(so), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Split", ["xf"], ["a", "b"], axis=1, num_outputs=2), h.make_node(op, ["a", "b"], ["r"]),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    shape = (3, 8)
    x = draw_x(d, shape, x_type)
    imp, [got] = run(qdq(nodes, shape, x_type, inits, T.INT8, opset=18), x)
    v = (np.maximum if op == "Max" else np.minimum)(x[:, :4], x[:, 4:]) - z
    [r] = imp.requants
    want = v if r.plan is None else Oracle.plan_of(r.plan, [v], r.plan.multipliers)  # None: the same scale
    assert np.array_equal(got, np.clip(want, -128, 127))


def test_max_with_a_constant_array_off_the_grid_is_the_max_of_both_rounded():
    """max(x, c) for c = [0.3, 1.0] off x's grid of 0.5, quantized at that grid: max(x, round(c / 0.5)), the exactly
    rounded max (tests/from_onnx/test_rwkv15.py checks any scales)."""
    inits = {"s": np.float32(0.5), "z": np.int8(0), "c": np.array([0.3, 1.0], np.float32)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node("Max", ["xf", "c"], ["r"],
                                                                                  name="max7"),
             h.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])]
    x = np.array([[-128, -128], [0, 1], [2, 127]], np.int8)
    _, [got] = run(qdq(nodes, (3, 2), T.INT8, inits, T.INT8), x)
    assert got.tolist() == [[1, 2], [1, 2], [2, 127]]


# -- PRelu -------------------------------------------------------------------------------------------------------
@SETTINGS
@given(d=st.data(), s=scales, so=scales, x_type=x_types, kind=st.sampled_from(["channel", "scalar", "rank4"]))
def test_prelu_is_a_sum_of_two_parts(d, s, so, x_type, kind):
    """PRelu(x) = max(x, 0) + a min(x, 0) with a per-channel (or scalar) slope of any sign, zero included: the sum
    of two exact terms requantized together; equal to the oracle, within the sum's bound of the exact value.
    Regression: 'no CVM op for ONNX PRelu' (MTCNN)."""
    c = 4
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    shape = {"channel": (c, 1, 1), "scalar": (1,), "rank4": (1, c, 1, 1)}[kind]
    slope = rng.uniform(-0.5, 1.5, size=shape).astype(np.float32)
    if kind != "scalar":
        slope.reshape(-1)[0] = 0
    z = zero(d, x_type)
    inits = {"s": np.float32(s), "z": NP[x_type](z), "a": slope, "so": np.float32(so), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node("PRelu", ["xf", "a"], ["r"]),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    xshape = (1, c, 2, 3)
    oracle_equal(qdq(nodes, xshape, x_type, inits, T.INT8), draw_x(d, xshape, x_type))


# -- GlobalMaxPool, ReduceMax, ReduceMin, ReduceSum -------------------------------------------------------------
@SETTINGS
@given(d=st.data(), shape=st.lists(st.integers(1, 5), min_size=3, max_size=4).map(tuple), s=scales, so=scales,
       op=st.sampled_from(["GlobalMaxPool", "ReduceMax", "ReduceMin", "ReduceSum"]), keep=st.booleans(),
       opset=st.sampled_from([13, 18]), x_type=x_types)
def test_reductions_of_one_quantized_tensor(d, shape, s, so, op, keep, opset, x_type):
    """GlobalMaxPool, ReduceMax, ReduceMin of x: the max/min of its integers (one positive scale); ReduceSum: the sum
    of x - z at x's scale; any axes (attribute or input as the opset has it); equal to the oracle.
    Regression: 'no CVM op for ONNX GlobalMaxPool', 'float ReduceMax of dequantized values has no integer form'."""
    rank = len(shape)
    z = zero(d, x_type)
    inits = {"s": np.float32(s), "z": NP[x_type](z), "so": np.float32(so), "zo": np.int8(0)}
    attrs, extra = {}, []
    if op != "GlobalMaxPool":
        axes = d.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank, unique_by=lambda a: a % rank))
        attrs["keepdims"] = int(keep)
        if opset >= (13 if op == "ReduceSum" else 18):
            inits["axes"], extra = np.array(axes, np.int64), ["axes"]
        else:
            attrs["axes"] = axes
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node(op, ["xf"] + extra, ["r"], **attrs),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    oracle_equal(qdq(nodes, shape, x_type, inits, T.INT8, opset=opset), draw_x(d, shape, x_type))


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
def test_a_sum_reduction_without_keepdims_keeps_the_other_axes_of_size_1(op):
    """ReduceMean/ReduceSum over axis 2 of (1, 3, 4) without keepdims is (1, 3), the batch axis kept. Regression:
    the import gave (3,) (the sum drops axes of size 1 and its shape was taken as ONNX's), so a Gemm after it was
    refused ('Gemm input of shape (8,)', an integer-input classifier)."""
    inits = {"s": np.float32(0.5), "z": np.int8(1), "so": np.float32(0.25), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node(op, ["xf"], ["r"], axes=[2], keepdims=0), h.make_node("QuantizeLinear", ["r", "so", "zo"],
                                                                               ["y"])]
    x = np.arange(-6, 6, dtype=np.int64).reshape(1, 3, 4)
    oracle_equal(qdq(nodes, x.shape, T.INT8, inits, T.INT8, opset=11), x)


# -- tables: Log (0 included), Reciprocal, Pow, Exp ----------------------------------------------------------------
@SETTINGS
@given(d=st.data(), s=scales, so=st.floats(2.0**-6, 1.0, width=32), op=st.sampled_from(["Log", "Reciprocal", "Exp",
                                                                                         "Pow"]),
       k=st.sampled_from([0.5, -1.0, 5.0, 1.5]))
def test_tables_over_the_quantized_range(d, s, so, op, k):
    """Log, Reciprocal, Exp, Pow by a constant exponent outside 1..4, of a uint8 input of zero point 0 (a Clip to a
    small positive bound quantized, as audio front ends write it): a table of the exact values, where log(0) = -inf
    and 1/0 = inf saturate as QuantizeLinear saturates them; equal to the oracle. Regression: 'Log is undefined on
    part of its input's range', 'no integer form' for Reciprocal and Pow by 0.5."""
    inits = {"s": np.float32(s), "z": np.uint8(0), "so": np.float32(so), "zo": np.int8(0)}
    extra = []
    if op == "Pow":
        inits["k"], extra = np.float32(k), ["k"]
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node(op, ["xf"] + extra, ["r"]),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    shape = (2, 9)
    x = draw_x(d, shape, T.UINT8)
    x[0, 0] = 0
    oracle_equal(qdq(nodes, shape, T.UINT8, inits, T.INT8), x)


def test_log_where_its_input_reaches_below_zero_is_refused_naming_the_log():
    """A Log whose input's integers reach below the zero point is refused at the Log (not the QuantizeLinear after
    it), saying which value and which integers made it undefined."""
    inits = {"s": np.float32(0.25), "z": np.int8(0), "so": np.float32(0.1), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Log", ["xf"], ["r"], name="mel_log"),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"], name="q_after")]
    with pytest.raises(CVMError, match=r"mel_log \(Log\): Log is undefined on 127 of its input's 255 values, at -31.75 "
                                       r"first: its input's integers reach -127 of \[-127, 127\] at zero point 0"):
        import_model(qdq(nodes, (2, 3), T.INT8, inits, T.INT8))


def test_log_of_a_clip_deferred_to_the_table():
    """Clip(x, 1e-10) then Log without a QuantizeLinear between: the table is of log(clip(x)), so 0 gives
    log(1e-10) (the float model's value), not -inf; equal to that exact table."""
    inits = {"s": np.float32(0.5), "z": np.int8(0), "lo": np.float32(1e-10), "so": np.float32(0.25),
             "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node("Clip", ["xf", "lo"], ["c"]),
             h.make_node("Log", ["c"], ["r"]), h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    x = np.arange(-128, 128, dtype=np.int64).reshape(16, 16)
    _, [got] = run(qdq(nodes, x.shape, T.INT8, inits, T.INT8), x)
    real = np.log(np.maximum(x * 0.5, float(np.float32(1e-10))))
    assert np.array_equal(got, np.clip(np.rint(real / 0.25), -128, 127).astype(np.int64))
    assert got[0, 0] == -92  # log(1e-10) / 0.25 = -92.1


# -- a float tail after the last QuantizeLinear ---------------------------------------------------------------------
@SETTINGS
@given(d=st.data(), s=scales, op=st.sampled_from(["Sigmoid", "Tanh", "Softmax"]), x_type=x_types)
def test_a_float_tail_is_quantized_to_int16_at_the_scale_stated(d, s, op, x_type):
    """DequantizeLinear then Sigmoid, Tanh or Softmax as the float output: int16 at zero point 0 and the scale
    s_t = the least float32 with N s_t >= the largest |value| (1 for Softmax), N = 32767 (Softmax: 2^j - 1 <= 32767),
    as docs/import.md states;
    Sigmoid/Tanh equal to that exact table, Softmax within one step of the exact softmax of the quantized input.
    Regression: 'a float output computed after the last QuantizeLinear has no integer form'."""
    z = zero(d, x_type)
    inits = {"s": np.float32(s), "z": NP[x_type](z)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node(op, ["xf"], ["y"])]
    shape = (2, 6)
    x = draw_x(d, shape, x_type)
    imp, [got] = run(qdq(nodes, shape, x_type, inits, T.FLOAT), x)
    [edge] = imp.edges.outputs
    assert edge.zero_point.reshape(()) == 0 and edge.type == "int16"
    st_ = float(np.asarray(edge.scale).reshape(()))
    real = (np.arange(RANGE[x_type][0], RANGE[x_type][1] + 1) - z) * float(np.float32(s))
    f = {"Sigmoid": lambda v: 1 / (1 + np.exp(-v)), "Tanh": np.tanh}.get(op)
    top = 1.0 if f is None else np.abs(f(real)).max()
    n = 32767 if f is not None else round(1 / st_)  # Softmax: the finest 2^j - 1 its integer form has a plan for
    v = (x - z) * float(np.float32(s))
    assert n in [32767 >> j for j in range(8)] and n * st_ <= top * (1 + 2.0**-22)
    assert n * st_ >= (1.0 if f is None else np.abs(f(v)).max())
    if f is not None:
        assert np.array_equal(got, np.clip(np.rint(f(v) / st_), -32768, 32767).astype(np.int64))
    else:
        e = np.exp(v - v.max(axis=1, keepdims=True))
        assert np.abs(got - e / e.sum(axis=1, keepdims=True) / st_).max() < 1


# -- biases of shape (1, C), (1, 1, C) ---------------------------------------------------------------------------
@SETTINGS
@given(d=st.data(), sx=scales, sw=scales, so=scales, x_type=x_types, rows=st.sampled_from([(), (1,)]))
def test_a_gemm_bias_of_shape_1_c_is_one_value_per_output(d, sx, sw, so, x_type, rows):
    """Gemm's C of shape (1, N) (or (N,)), int32 at s_x s_w: one bias per output column, as broadcasting reads it;
    equal to the oracle. Regression: an internal error, 'input operand has more dimensions than allowed by the
    axis remapping' (an integer-input model's one-hot MatMul bias)."""
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    n = 4
    inits = {"s": np.float32(sx), "z": NP[x_type](zero(d, x_type)),
             "w": rng.integers(-127, 128, size=(3, n)).astype(np.int8), "sw": np.float32(sw), "zw": np.int8(0),
             "b": rng.integers(-1000, 1000, size=rows + (n,)).astype(np.int32),
             "sb": np.float32(np.float32(sx) * np.float32(sw)), "zb": np.int32(0), "so": np.float32(so),
             "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"]),
             h.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bf"]), h.make_node("Gemm", ["xf", "wf", "bf"], ["r"]),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    oracle_equal(qdq(nodes, (2, 3), x_type, inits, T.INT8), draw_x(d, (2, 3), x_type))


@pytest.mark.parametrize(("shape", "ok"), [((1, 1, 3), True), ((3,), True), ((1, 3), True), ((1,), True),
                                          ((3, 1), False), ((1, 3, 1), False), ((2, 3), False)])
def test_bias_values_read_a_bias_along_its_last_axis(shape, ok):
    """A bias varying along its last axis only is (C,); one varying along another axis is refused, not broadcast."""
    from cvm_onnx.converters.from_onnx.context import INT32, const
    from cvm_onnx.converters.from_onnx.quantized.products import bias_values
    from cvm_onnx.converters.from_onnx.quantized.values import Scaled
    from cvm_onnx.converters.from_onnx.registry import Refuse

    value = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    b = Scaled(const(value, INT32), np.asarray(Fraction(1, 8), dtype=object), np.zeros((), np.int64))
    acc = np.array([Fraction(1, 8)] * 3, dtype=object)
    if ok:
        assert list(bias_values(b, acc, 3)) == list(np.broadcast_to(value.reshape(-1), (3,)))
    else:
        with pytest.raises(Refuse, match="one value per output"):
            bias_values(b, acc, 3)


# -- the first float tensor after an integer input -----------------------------------------------------------------
@SETTINGS
@given(d=st.data(), so=st.floats(2.0**-4, 2.0**6, width=32), zo=st.integers(-20, 20),
       x_type=st.sampled_from([T.INT8, T.INT16, T.INT32]))
def test_quantize_linear_of_a_float_tensor_of_integers(d, so, zo, x_type):
    """An integer input, Cast to float, QuantizeLinear (as quantize_static writes an integer-input model): a
    requantization of the integers at scale 1; equal to its plan on x and within its bound of x / s_out.
    Regression: 'QuantizeLinear of a float tensor that is not a dequantized value'."""
    inits = {"so": np.float32(so), "zo": np.int8(zo)}
    nodes = [h.make_node("Cast", ["x"], ["xf"], to=T.FLOAT), h.make_node("QuantizeLinear", ["xf", "so", "zo"], ["y"])]
    x = np.asarray(d.draw(st.lists(st.integers(-255, 255), min_size=8, max_size=8)), np.int64).reshape(2, 4)
    if x_type == T.INT8:
        x = np.clip(x, -127, 127)
    imp, [got] = run(qdq(nodes, x.shape, x_type, inits, T.INT8), x)
    [r] = imp.requants
    v = Oracle.plan_of(r.plan, [x], r.plan.multipliers) if r.plan is not None else x
    assert np.array_equal(got, np.clip(v + zo, -128, 127))
    exact = x.astype(object) / Fraction(float(np.float32(so)))
    inside = np.abs(got) < 127
    assert all(abs(g - zo - e) <= Fraction(1, 2) + Fraction(r.plan.error if r.plan else 0)
               for g, e in zip(got[inside].flat, exact[inside].flat))


# -- sums with constants, Max/Min of different forms, a Clip to a computed bound, a float tail of a sum -------------
@SETTINGS
@given(d=st.data(), s=scales, so=scales, c=st.floats(-50, 50, width=32), op=st.sampled_from(["Add", "Sub"]),
       x_type=x_types)
def test_add_sub_of_a_float_constant_is_a_term(d, s, so, c, op, x_type):
    """x + c, x - c for a float constant c: the sum of x's term and sign(c) at scale |c| (0: no term, x's
    requantization alone; M = 1 moves x's integers), requantized together; equal to the oracle's sum (the constant
    as its exact rational), within its bound. Regression: 'a Sub operand is a float tensor that no DequantizeLinear
    produced' (a log-mel's max - 80)."""
    z = zero(d, x_type)
    inits = {"s": np.float32(s), "z": NP[x_type](z), "c": np.float32(c), "so": np.float32(so), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node(op, ["xf", "c"], ["r"]),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    shape = (2, 5)
    x = draw_x(d, shape, x_type)
    imp, [got] = run(qdq(nodes, shape, x_type, inits, T.INT8), x)
    [r] = imp.requants
    cf = Fraction(float(np.float32(c)))
    sign = (1 if cf > 0 else -1 if cf < 0 else 0) * (1 if op == "Add" else -1)
    terms = [x - z] + ([np.full(x.shape, sign)] if sign else [])
    want = x - z if r.plan is None else Oracle.plan_of(r.plan, terms, r.plan.multipliers)
    assert (r.plan is None) == (not sign and np.float32(s) == np.float32(so))
    assert np.array_equal(got, np.clip(want, -128, 127))
    exact = (x - z).astype(object) * Fraction(float(np.float32(s))) / Fraction(float(np.float32(so))) + \
        (cf if op == "Add" else -cf) / Fraction(float(np.float32(so)))
    inside = (got > -128) & (got < 127)
    bound = Fraction(r.plan.error) + Fraction(1, 2) if r.plan else 0
    assert all(abs(g - e) <= bound for g, e in zip(got[inside], exact[inside]))


@SETTINGS
@given(d=st.data(), sa=scales, sb=scales, so=scales, op=st.sampled_from(["Max", "Min"]), x_type=x_types)
def test_max_min_of_values_of_different_scales(d, sa, sb, so, op, x_type):
    """Max/Min of two dequantized values of different scales: the max (min) of each one's requantization at the
    output's scale (rounding is monotone); equal to that, each by its plan, and within 1/2 + the larger delta of the
    exact max (min). Regression: 'float Max of dequantized values has no integer form'."""
    za, zb = zero(d, x_type), zero(d, x_type)
    assume(np.float32(sa) != np.float32(sb) or za != zb)  # alike: the integers' max (test above)
    inits = {"sa": np.float32(sa), "za": NP[x_type](za), "sb": np.float32(sb), "zb": NP[x_type](zb),
             "so": np.float32(so), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "sa", "za"], ["a"]),
             h.make_node("DequantizeLinear", ["x", "sb", "zb"], ["b0"]),
             h.make_node("Transpose", ["b0"], ["b"], perm=[1, 0]), h.make_node("Transpose", ["a"], ["at"], perm=[1, 0]),
             h.make_node(op, ["at", "b"], ["r"]), h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    shape = (3, 4)
    x = draw_x(d, shape, x_type)
    imp, [got] = run(qdq(nodes, shape, x_type, inits, T.INT8), x)
    parts = []
    for rec, v in zip(imp.requants, (x.T - za, x.T - zb)):
        parts.append(np.clip(v if rec.plan is None else Oracle.plan_of(rec.plan, [v], rec.plan.multipliers), -128,
                             127))
    f = np.maximum if op == "Max" else np.minimum
    assert np.array_equal(got, f(*parts))


def test_a_clip_to_a_computed_bound_at_the_output_is_a_float_tail():
    """A log-mel's top_db: Clip(x, ReduceMax(x) - 80) as the float output (nothing quantizes it): max(x, m) for
    m = max(x) - 80, quantized to int16 at the scale docs/import.md states (the least float32 with 32767 s >= the
    largest |value| the interval of x allows); within one step of the exact value, and equal to max of the
    requantizations. Regression: 'Clip min must be a constant scalar'."""
    s = np.float32(0.75)
    inits = {"s": s, "z": np.int8(0), "c": np.float32(80.0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("ReduceMax", ["xf"], ["m"], keepdims=0), h.make_node("Sub", ["m", "c"], ["lo"]),
             h.make_node("Clip", ["xf", "lo"], ["y"])]
    x = np.arange(-127, 128, dtype=np.int64).reshape(5, 51)
    imp, [got] = run(qdq(nodes, x.shape, T.INT8, inits, T.FLOAT, opset=13), x)
    [edge] = imp.edges.outputs
    st_ = Fraction(float(np.asarray(edge.scale).reshape(())))
    want = np.float32(128 * 0.75 / 32767)  # x's interval [-96, 95.25] (int8 at 9 bits) bounds max(x, m) too
    while float(want) * 32767 < 128 * 0.75:
        want = np.nextafter(want, np.float32(1))
    assert edge.type == "int16" and st_ == Fraction(float(want))
    real = np.maximum(x * 0.75, x.max() * 0.75 - 80)
    assert np.abs(got * float(st_) - real).max() <= float(st_)


@SETTINGS
@given(d=st.data(), s=st.floats(2.0**-6, 2.0**-1, width=32), so=st.floats(2.0**-8, 2.0**-5, width=32), x_type=x_types)
def test_a_function_of_a_sum_of_one_scale_is_a_table(d, s, so, x_type):
    """Exp(x - ReduceMax(x)) (a written-out softmax's numerator) with both terms at x's scale: the integers added
    (broadcast_add), then one table of exp over the sum's integers; equal to the exact table of exp((t - max t) s).
    Regression: 'the Exp input (a sum) must be quantized (QuantizeLinear) first'."""
    z = zero(d, x_type)
    inits = {"s": np.float32(s), "z": NP[x_type](z), "so": np.float32(so), "zo": np.int8(-128)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("ReduceMax", ["xf"], ["m"], axes=[1], keepdims=1), h.make_node("Sub", ["xf", "m"], ["d"]),
             h.make_node("Exp", ["d"], ["e"]), h.make_node("QuantizeLinear", ["e", "so", "zo"], ["y"])]
    shape = (3, 5)
    x = draw_x(d, shape, x_type)
    _, [got] = run(qdq(nodes, shape, x_type, inits, T.INT8, opset=13), x)
    real = (x - x.max(axis=1, keepdims=True)) * float(np.float32(s))
    assert np.array_equal(got, np.clip(np.rint(np.exp(real) / float(np.float32(so))) - 128, -128, 127))


# -- MaxPool with dilations ----------------------------------------------------------------------------------------
@SETTINGS
@given(d=st.data(), k=st.tuples(st.integers(1, 3), st.integers(1, 3)), dil=st.tuples(st.integers(1, 3),
                                                                                       st.integers(1, 3)),
       strides=st.tuples(st.integers(1, 3), st.integers(1, 3)), ceil=st.booleans(),
       pad=st.sampled_from(["pads", "VALID"]), one_d=st.booleans())
def test_dilated_max_pool_equals_onnxruntime(d, k, dil, strides, ceil, pad, one_d):
    """MaxPool with dilations (explicit pads or VALID, ceil_mode, 1-D or 2-D) of an int8 input: equal to
    onnxruntime's. Regression: 'MaxPool with dilations has no CVM form'."""
    n_sp = 1 if one_d else 2
    k, dil, strides = k[:n_sp], dil[:n_sp], strides[:n_sp]
    assume(any(v > 1 for v in dil))
    size = tuple(d.draw(st.integers(max(dd * (kk - 1) + 1, 2), 9)) for kk, dd in zip(k, dil))
    attrs = {"kernel_shape": list(k), "dilations": list(dil), "strides": list(strides), "ceil_mode": int(ceil)}
    if pad == "pads":
        attrs["pads"] = [d.draw(st.integers(0, kk - 1)) for kk in k] * 2
    else:
        attrs["auto_pad"] = pad
    shape = (1, 2) + size
    m = qdq([h.make_node("MaxPool", ["x"], ["y"], **attrs)], shape, T.INT8, {}, T.INT8, opset=13)
    x = np.clip(draw_x(d, shape, T.INT8), -127, 127)
    try:
        [want] = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": x.astype(np.int8)})
    except Exception:  # noqa: BLE001  (a geometry onnxruntime itself rejects)
        assume(False)
    imp = import_model(m, input_precision=8)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    assert got.shape == want.shape and np.array_equal(got, want.astype(np.int64))
    assert verify(imp.graph, x.astype(np.int32)).exact


def same_pool_oracle(x: np.ndarray, k, dil, strides) -> np.ndarray:
    """ONNX's MaxPool with auto_pad SAME_UPPER, from its text: ceil(size / s) outputs per axis, the total pad
    (out - 1) s + (k - 1) d + 1 - size split with the odd one at the end; each output the max over the window's
    positions inside the input."""
    sizes = x.shape[2:]
    outs = [-(-n // s) for n, s in zip(sizes, strides)]
    begins = [((o - 1) * s + (kk - 1) * d + 1 - n) // 2 for o, s, kk, d, n in zip(outs, strides, k, dil, sizes)]
    y = np.empty(x.shape[:2] + tuple(outs), np.int64)
    for o in np.ndindex(*outs):
        taps = [[o_ * s - b + i * d for i in range(kk) if 0 <= o_ * s - b + i * d < n]
                for o_, s, b, kk, d, n in zip(o, strides, begins, k, dil, sizes)]
        y[(...,) + o] = x[(...,) + np.ix_(*taps)].reshape(x.shape[:2] + (-1,)).max(-1)
    return y


@SETTINGS
@given(d=st.data(), k=st.tuples(st.integers(1, 3), st.integers(1, 3)), dil=st.tuples(st.integers(1, 3),
                                                                                       st.integers(1, 3)),
       strides=st.tuples(st.integers(1, 3), st.integers(1, 3)), ceil=st.booleans(), one_d=st.booleans())
def test_dilated_max_pool_with_same_upper_padding_follows_onnx(d, k, dil, strides, ceil, one_d):
    """A dilated MaxPool with auto_pad SAME_UPPER whose output shape the model declares as ONNX states it
    (ceil(size / stride), as onnx's shape inference gives): equal to the windows of ONNX's text (an exact oracle)
    and to onnx.reference's MaxPool. Regression: 'MaxPool with dilations and auto_pad SAME_*' refused."""
    n_sp = 1 if one_d else 2
    k, dil, strides = k[:n_sp], dil[:n_sp], strides[:n_sp]
    assume(any(v > 1 for v in dil))
    assume(all(s <= (kk - 1) * dd + 1 for s, kk, dd in zip(strides, k, dil)))  # a total pad >= 0 on every size
    size = tuple(d.draw(st.integers(1, 9)) for _ in k)
    outs = [-(-n // s) for n, s in zip(size, strides)]
    begins = [((o - 1) * s + (kk - 1) * dd + 1 - n) // 2
              for o, s, kk, dd, n in zip(outs, strides, k, dil, size)]
    assume(all(any(0 <= j * s - b + i * dd < n for i in range(kk)) for o, s, b, kk, dd, n in
               zip(outs, strides, begins, k, dil, size) for j in range(o)))  # no window of padding only (refused)
    shape = (1, 2) + size
    attrs = {"kernel_shape": list(k), "dilations": list(dil), "strides": list(strides), "ceil_mode": int(ceil),
             "auto_pad": "SAME_UPPER"}
    want_shape = shape[:2] + tuple(-(-n // s) for n, s in zip(size, strides))
    m = declared(qdq([h.make_node("MaxPool", ["x"], ["y"], **attrs)], shape, T.INT8, {}, T.INT8, opset=13),
                 want_shape)
    inferred = onnx.shape_inference.infer_shapes(m).graph.output[0].type.tensor_type.shape.dim
    assert tuple(v.dim_value for v in inferred) == want_shape
    x = np.clip(draw_x(d, shape, T.INT8), -127, 127)
    imp = import_model(m, input_precision=8)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    want = same_pool_oracle(x, k, dil, strides)
    assert got.shape == want_shape and np.array_equal(got, want)
    [ref] = ReferenceEvaluator(m).run(None, {"x": x.astype(np.int8)})
    assert ref.shape == want_shape and np.array_equal(got, ref.astype(np.int64))
    assert verify(imp.graph, x.astype(np.int32)).exact


@pytest.mark.parametrize("declare", [None, (1, 2, 2)])
def test_dilated_max_pool_with_same_padding_undeclared_is_refused_naming_the_node(declare):
    """Without the output shape declared as ONNX gives it (none; onnxruntime's 2 outputs of 3), refused naming
    the node and both shapes."""
    m = qdq([h.make_node("MaxPool", ["x"], ["y"], name="pool3", kernel_shape=[2], dilations=[2],
                         auto_pad="SAME_UPPER")], (1, 2, 3), T.INT8, {}, T.INT8, opset=13)
    if declare:
        m = declared(m, declare)
    said = "declares no output shape" if declare is None else r"declares the output shape \(1, 2, 2\)"
    with pytest.raises(CVMError, match=r"pool3 \(MaxPool\): MaxPool with dilations and auto_pad SAME_UPPER: ONNX "
                                       r"gives the output shape \(1, 2, 3\) .* the model " + said):
        import_model(m)


@pytest.mark.parametrize("case", ["negative-total", "padding-only", "same-lower"])
def test_dilated_max_pool_with_same_padding_without_a_stated_form_is_refused(case):
    """A stride beyond the dilated kernel (a negative total pad, whose split ONNX does not state), a window of
    padding only (1 value, kernel 2 at dilation 2), SAME_LOWER (ONNX's text, onnx.reference and onnxruntime each
    pad it differently): refused naming the node."""
    size, strides, out = {"negative-total": (4, 4, 1), "padding-only": (1, 1, 1), "same-lower": (5, 1, 5)}[case]
    m = declared(qdq([h.make_node("MaxPool", ["x"], ["y"], name="pool4", kernel_shape=[2], dilations=[2],
                                  strides=[strides], auto_pad="SAME_LOWER" if case == "same-lower" else "SAME_UPPER")],
                     (1, 2, size), T.INT8, {}, T.INT8, opset=13), (1, 2, out))
    want = {"negative-total": "pads a negative total -1", "padding-only": "a window of padding only",
            "same-lower": "SAME_LOWER: ONNX's text, its reference implementation"}[case]
    with pytest.raises(CVMError, match=r"pool4 \(MaxPool\): .*" + want):
        import_model(m)


# -- Resize linear at integer scales ----------------------------------------------------------------------------
@SETTINGS
@given(d=st.data(), f=st.tuples(st.integers(1, 4), st.integers(1, 4)), s=scales, so=scales, x_type=x_types,
       mode=st.sampled_from(["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners"]))
def test_linear_resize_at_integer_scales(d, f, s, so, x_type, mode):
    """Resize linear by integer scales (each coordinate mode): the interpolation's integers v = den_h den_w
    (y / s) are exactly onnx's reference value times den_h den_w / s, and the output their requantization by the
    plan; within its bound of the exact value. Regression: 'Resize mode=linear: only nearest has an exact CVM
    form'."""
    assume(f != (1, 1))
    z = zero(d, x_type)
    shape = (1, 2, d.draw(st.integers(1, 4)), d.draw(st.integers(2, 4)))
    inits = {"s": np.float32(s), "z": NP[x_type](z), "so": np.float32(so), "zo": np.int8(0),
             "scales": np.array([1, 1, *f], np.float32)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Resize", ["xf", "", "scales"], ["r"], mode="linear", coordinate_transformation_mode=mode),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    x = draw_x(d, shape, x_type)
    imp, [got] = run(qdq(nodes, shape, x_type, inits, T.INT8, opset=13), x)
    from support.quantized import one
    ref = one("Resize", [(x - z).astype(np.float64), np.array([]), np.array([1, 1, *f], np.float64)], mode="linear",
              coordinate_transformation_mode=mode)
    den = math.prod(2 * k if mode in ("half_pixel", "pytorch_half_pixel") else
                    k if mode == "asymmetric" else n * k - 1 for k, n in zip(f, shape[2:]) if k > 1)
    v = ref * den
    assert np.abs(v - np.rint(v)).max() < 1e-6  # multiples of 1 / den (the reference adds in float64: 1/3 rounds)
    [r] = imp.requants
    want = np.clip(Oracle.plan_of(r.plan, [np.rint(v).astype(np.int64)], r.plan.multipliers), -128, 127)
    assert got.shape == want.shape and np.array_equal(got, want)
    exact = np.rint(v).astype(np.int64).astype(object) * (Fraction(float(np.float32(s))) / den /
                                                         Fraction(float(np.float32(so))))
    inside = (got > -128) & (got < 127)
    assert all(abs(g - e) <= Fraction(1, 2) + Fraction(r.plan.error) for g, e in zip(got[inside], exact[inside]))
    m = qdq(nodes, shape, x_type, inits, T.INT8, opset=13)  # onnxruntime's border and coordinates: the same values
    [theirs] = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(NP[x_type])})
    assert np.abs(got - theirs.astype(np.int64)).max() <= 1


def cubic_coefficients(t: Fraction, a: Fraction) -> list[Fraction]:
    """ONNX's cubic coefficients of x[i - 1 .. i + 2] at t = c - i (onnx.reference's _cubic_coeffs)."""
    def near(v):
        return ((a + 2) * v - (a + 3)) * v * v + 1

    def far(v):
        return ((a * v - 5 * a) * v + 8 * a) * v - 4 * a
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def resize_oracle(x: np.ndarray, out: tuple[int, ...], factors: list[Fraction], mode: str,
                  a: Fraction | None = None) -> np.ndarray:
    """ONNX's linear (``a`` None) or cubic Resize in exact rationals, axis by axis: the coordinate c by the mode at
    the scale ONNX uses; linear: c clamped to [0, size - 1], (1 - r) x[i] + r x[min(i + 1, size - 1)], i = floor,
    r the rest; cubic: sum_k c_k(r) x[i - 1 + k], the indices clamped (edge padding)."""
    y = x.astype(object)
    for axis, (n, o, f) in enumerate(zip(x.shape, out, factors)):
        if o == n and f == 1:
            continue
        cs = []
        for k in range(o):
            if mode == "align_corners":
                c = Fraction(k * (n - 1), o - 1) if o > 1 else Fraction(0)
            elif mode == "asymmetric":
                c = k / f
            elif mode == "pytorch_half_pixel" and o == 1:
                c = Fraction(0)
            else:
                c = (k + Fraction(1, 2)) / f - Fraction(1, 2)
            cs.append(min(max(c, Fraction(0)), Fraction(n - 1)) if a is None else c)
        if a is None:
            y = np.stack([(1 - (c - math.floor(c))) * np.take(y, math.floor(c), axis) +
                          (c - math.floor(c)) * np.take(y, min(math.floor(c) + 1, n - 1), axis) for c in cs], axis)
        else:
            y = np.stack([sum(w * np.take(y, min(max(math.floor(c) - 1 + k, 0), n - 1), axis) for k, w in
                              enumerate(cubic_coefficients(c - math.floor(c), a))) for c in cs], axis)
    return y


@SETTINGS
@given(d=st.data(), s=scales, so=scales, x_type=x_types, by_sizes=st.booleans(),
       mode=st.sampled_from(["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners"]),
       cubic=st.sampled_from([None, -0.75, -0.5]))
def test_resize_linear_and_cubic_at_rational_scales(d, s, so, x_type, by_sizes, mode, cubic):
    """Resize linear or cubic (A = -0.75, -0.5; cubic along the last axis: both axes pass 32 bits but at small
    scales) to any output size (``sizes``: the scale out / size) or by float scales that are not whole (1.5,
    0.75, ...: the exact dyadic the float is), down or up: the interpolation's integers are the exact rational
    value of ONNX's formula times the weights' denominator (whole numbers), and the output their requantization by
    its plan, within its bound of the exact value; within one step of onnxruntime's Resize. Regression: 'resizing
    ... is not an upsampling by integer scales', 'Resize mode=cubic: only nearest ...'."""
    z = zero(d, x_type)
    shape = (1, 2, d.draw(st.integers(1, 5)), d.draw(st.integers(2, 5)))
    if by_sizes:
        out = shape[:3] + (d.draw(st.integers(1, 9)),) if cubic else \
            shape[:2] + (d.draw(st.integers(1, 9)), d.draw(st.integers(1, 9)))
        factors = [Fraction(o, n) for o, n in zip(out, shape)]
        resize_in, more = ["xf", "", "", "sizes"], {"sizes": np.array(out, np.int64)}
    else:
        f = [1.0 if cubic and k == 0 else d.draw(st.sampled_from([0.5, 0.75, 1.0, 1.25, 1.5, 2.5, 3.0]))
             for k in range(2)]
        out = shape[:2] + tuple(math.floor(n * v) for n, v in zip(shape[2:], f))
        factors = [Fraction(1), Fraction(1)] + [Fraction(v) for v in f]
        resize_in, more = ["xf", "", "scales"], {"scales": np.array([1, 1, *f], np.float32)}
    assume(min(out) >= 1 and any(o != n for o, n in zip(out, shape)))
    inits = {"s": np.float32(s), "z": NP[x_type](z), "so": np.float32(so), "zo": np.int8(0), **more}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Resize", resize_in, ["r"], mode="cubic" if cubic else "linear",
                         coordinate_transformation_mode=mode, **({"cubic_coeff_a": cubic} if cubic else {})),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    m = qdq(nodes, shape, x_type, inits, T.INT8, opset=13)
    x = draw_x(d, shape, x_type)
    imp, [got] = run(m, x)
    exact = resize_oracle(x - z, out, factors, mode, None if cubic is None else Fraction(cubic))
    [r] = imp.requants
    assume(r.plan is not None)  # a ratio of 1 (s_out = s / den) moves only the zero point
    sx, sy = Fraction(float(np.float32(s))), Fraction(float(np.float32(so)))
    den = round(sx / sy / Fraction(r.ratios[0]))  # the weights' denominator: the grid of the integers
    v = exact * den
    assert all(e.denominator == 1 for e in v.flat)
    want = np.clip(Oracle.plan_of(r.plan, [v.astype(np.int64)], r.plan.multipliers), -128, 127)
    assert got.shape == out and np.array_equal(got, want)
    inside = (got > -128) & (got < 127)
    assert all(abs(g - e * sx / sy) <= Fraction(1, 2) + Fraction(r.plan.error)
               for g, e in zip(got[inside], exact[inside]))
    [theirs] = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(NP[x_type])})
    assert np.abs(got - theirs.astype(np.int64)).max() <= 1


def test_linear_resize_whose_weights_pass_31_bits_is_refused_naming_the_node():
    """Scale 0.6 is the float32 5033165 / 2^23: half-pixel weights over 2 x 5033165 (25 bits) times 8-bit integers
    need 33 bits: refused naming the node."""
    inits = {"s": np.float32(0.1), "z": np.uint8(0), "so": np.float32(0.1), "zo": np.uint8(0),
             "scales": np.array([1, 1, 1, 0.6], np.float32)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Resize", ["xf", "", "scales"], ["r"], mode="linear", name="shrink"),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    with pytest.raises(CVMError, match=r"shrink \(Resize\): Resize linear from \(1, 1, 2, 5\) to \(1, 1, 2, 3\): its "
                                       r"weights on axis 3 \(over 10066330\) .* need more than 32 bits"):
        import_model(qdq(nodes, (1, 1, 2, 5), T.UINT8, inits, T.UINT8, opset=13))


# -- functions of two dequantized values: one table over both integers ----------------------------------------------
@SETTINGS
@given(d=st.data(), sa=scales, sb=scales, so=scales, zb=st.integers(-128, 0), op=st.sampled_from(["Div", "Exp"]))
def test_a_function_of_two_values_is_one_table(d, sa, sb, so, zb, op):
    """a / b of two computed values (b clipped to b >= s_b > 0 on its grid), and Exp(a - b) of values of two
    scales: one cvm_lut over both operands' integers (256 x 256 entries at most), each the exactly rounded
    float64 value; equal to that table. Regression: 'float Div of dequantized values has no integer form', 'the
    Exp input (a sum) must be quantized (QuantizeLinear) first'."""
    inits = {"sa": np.float32(sa), "za": np.int8(0), "sb": np.float32(sb), "zb": np.int8(zb),
             "so": np.float32(so), "zo": np.int8(0), "low": np.float32(sb)}  # b >= one step: t_b > z_b
    body = [h.make_node("Clip", ["bt", "low"], ["bc"]), h.make_node("Div", ["a", "bc"], ["r"])] if op == "Div" \
        else [h.make_node("Sub", ["a", "bt"], ["dd"]), h.make_node("Exp", ["dd"], ["r"])]
    nodes = [h.make_node("DequantizeLinear", ["x", "sa", "za"], ["a0"]),
             h.make_node("DequantizeLinear", ["x", "sb", "zb"], ["b"]),
             h.make_node("Transpose", ["a0"], ["a"], perm=[1, 0]), h.make_node("Transpose", ["b"], ["bt"], perm=[1, 0]),
             *body, h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    shape = (4, 4)
    x = draw_x(d, shape, T.INT8)
    va = x.T.astype(np.float64) * float(np.float32(sa))
    tb = np.maximum(x, zb + 1) if op == "Div" else x
    vb = (tb - zb).T.astype(np.float64) * float(np.float32(sb))
    _, [got] = run(qdq(nodes, shape, T.INT8, inits, T.INT8), x)
    real = va / vb if op == "Div" else np.exp(va - vb)
    assert np.array_equal(got, np.clip(np.rint(real / float(np.float32(so))), -128, 127).astype(np.int64))


@SETTINGS
@given(d=st.data(), sa=scales, sb=scales, so=scales, za=st.integers(-128, 127), zb=st.integers(-128, 127),
       zo=st.integers(-128, 127), op=st.sampled_from(["Div", "Pow", "AtanDiv", "Mod"]), broadcast=st.booleans(),
       out_type=x_types)
def test_a_function_of_two_values_reaching_its_special_cases_is_one_table(d, sa, sb, so, za, zb, zo, op, broadcast,
                                                                          out_type):
    """a / b, a^b, atan(a / b) (tf2onnx's Atan2: quantize_static leaves its Div and Atan in float) and fmod(a, b)
    of two computed values over their whole ranges (the divisor reaching 0 with the dividend: 0 / 0; a negative
    base to a fractional power; fmod(a, 0)), b broadcast or not: one table equal to the float64 value rounded,
    +-inf saturated and NaN the output type's minimum; at every special case equal to onnxruntime's QDQ model
    (float32 Div, Pow, Atan, Mod, then QuantizeLinear). Regression: 'Div is undefined on part of its operands'
    ranges (0 / 0)' (afis' LEADER), 'Pow of a dequantized value by an exponent computed at run time', 'the Atan
    input (Div) must be quantized', 'no CVM op for ONNX Mod' of floats."""
    lo, hi = RANGE[out_type]
    zo = min(max(zo, lo), hi)
    inits = {"sa": np.float32(sa), "za": np.int8(za), "sb": np.float32(sb), "zb": np.int8(zb),
             "so": np.float32(so), "zo": np.array(zo, NP[out_type]), "starts": np.array([0], np.int64),
             "ends": np.array([1], np.int64), "axes": np.array([1], np.int64)}
    shape = (6, 6)
    x = draw_x(d, shape, T.INT8)
    x[0, 0], x[0, 1], x[1, 0] = za, zb, zb  # 0 / 0 (Transpose: b at (0, 1) is x[1, 0]) and 0^0 reached
    take_b = h.make_node("Slice", ["x", "starts", "ends", "axes"], ["xb"]) if broadcast else \
        h.make_node("Transpose", ["x"], ["xb"], perm=[1, 0])
    nodes = [take_b, h.make_node("DequantizeLinear", ["x", "sa", "za"], ["a"]),
             h.make_node("DequantizeLinear", ["xb", "sb", "zb"], ["b"]),
             *([h.make_node("Div", ["a", "b"], ["q"]), h.make_node("Atan", ["q"], ["r"])] if op == "AtanDiv" else
               [h.make_node(op, ["a", "b"], ["r"], **({"fmod": 1} if op == "Mod" else {}))]),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    m = qdq(nodes, shape, T.INT8, inits, out_type)
    _, [got] = run(m, x)
    tb = x[:, :1] if broadcast else x.T
    va, vb = (x - za) * float(np.float32(sa)), (tb - zb) * float(np.float32(sb))
    if op == "Pow":  # at DequantizeLinear's float32 values: (-2)^(-25.0000004) is NaN, (-2)^-25 is not
        va, vb = ((t - z).astype(np.float32) * np.float32(sc) for t, z, sc in ((x, za, sa), (tb, zb, sb)))
        va, vb = va.astype(np.float64), vb.astype(np.float64)
    with np.errstate(all="ignore"):
        real = {"Div": va / vb, "Pow": np.power(va, vb), "AtanDiv": np.arctan(va / vb), "Mod": np.fmod(va, vb)}[op]
        want = np.where(np.isnan(real), lo, np.clip(np.rint(real / float(np.float32(so))) + zo, lo, hi))
    assert np.array_equal(got, want.astype(np.int64))
    special = ~np.isfinite(real) | ((vb == 0) & (op == "AtanDiv"))  # atan(+-inf) = +-pi/2
    assert special.any() or op == "Pow"
    ort_y = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(np.int8)})[0]
    assert np.array_equal(got[special], ort_y.astype(np.int64)[special]), (np.argwhere(special), va, vb)


@SETTINGS
@given(d=st.data(), s=scales, so=scales, zx=st.integers(-128, 127), c=st.floats(-50, 50, width=32).filter(bool),
       x_type=x_types)
def test_mod_of_floats_by_a_constant_is_a_table(d, s, so, zx, c, x_type):
    """fmod(x, c) (fmod=1) of a dequantized x by a float constant c != 0: a table over x's integers, equal to the
    float64 fmod of the exact value rounded, and to onnxruntime's QDQ model wherever that is not within 2^-20 of a
    rounding tie or of fmod's jumps (float32 against exact). Regression: 'no CVM op for ONNX Mod' of floats."""
    lo, hi = RANGE[x_type]
    zx = min(max(zx, lo), hi)
    inits = {"s": np.float32(s), "zx": np.array(zx, NP[x_type]), "c": np.float32(c), "so": np.float32(so),
             "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("Mod", ["xf", "c"], ["r"], fmod=1), h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    x = np.arange(lo, hi + 1, dtype=np.int64).reshape(1, -1)
    m = qdq(nodes, x.shape, x_type, inits, T.INT8)
    _, [got] = run(m, x)
    cf = float(np.float32(c))
    r = np.fmod((x - zx) * float(np.float32(s)), cf)
    q = r / float(np.float32(so))
    assert np.array_equal(got, np.clip(np.rint(q), -128, 127).astype(np.int64))
    ort_y = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(NP[x_type])})[0].astype(np.int64)
    # off rounding ties and off fmod's jumps by more than float32's error: onnxruntime's DequantizeLinear rounds
    # (x - zx) s to float32 (within |(x - zx) s| 2^-24), fmod is exact on it, and the quotient by so rounds again
    err = (np.abs((x - zx) * float(np.float32(s))) + np.abs(r)) * 2.0 ** -22
    clear = (np.abs(np.abs(q - np.floor(q)) - 0.5) > err / float(np.float32(so)) + 2.0 ** -20) & \
        (np.abs(r) > err) & (abs(cf) - np.abs(r) > err)
    assert np.array_equal(got[clear], ort_y[clear])


@pytest.mark.parametrize("fmod, c, said", [(0, 2.0, "Mod of floats takes fmod=1"),
                                           (1, 0.0, "Mod of a dequantized value by a constant other than one finite "
                                                    "non-zero value")])
def test_mod_of_floats_outside_its_rule_is_refused_naming_the_node(fmod, c, said):
    inits = {"s": np.float32(0.5), "z": np.int8(0), "c": np.float32(c)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["a"]),
             h.make_node("Mod", ["a", "c"], ["r"], name="rem", fmod=fmod),
             h.make_node("QuantizeLinear", ["r", "s", "z"], ["y"])]
    with pytest.raises(CVMError, match=f"rem \\(Mod\\): {said}"):
        import_model(qdq(nodes, (2, 3), T.INT8, inits, T.INT8))


def test_a_division_reaching_zero_over_zero_as_the_float_output_is_refused_naming_the_div():
    """0 / 0 has no value in a float output (no QuantizeLinear to give NaN an integer): refused at the Div."""
    inits = {"s": np.float32(0.5), "z": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["a"]),
             h.make_node("Transpose", ["a"], ["b"], perm=[1, 0]), h.make_node("Div", ["a", "b"], ["y"], name="ratio")]
    with pytest.raises(CVMError, match=r"Div as a float output is undefined \(NaN: 0 / 0\)"):
        import_model(qdq(nodes, (3, 3), T.INT8, inits, T.FLOAT))


def test_a_division_as_the_float_output_is_a_tail_of_its_table():
    """a / b (b >= one step) as the float output: its table at the int16 scale of its largest finite |value|."""
    inits = {"s": np.float32(0.5), "z": np.int8(0), "low": np.float32(0.5)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["a"]),
             h.make_node("Transpose", ["a"], ["b0"], perm=[1, 0]), h.make_node("Clip", ["b0", "low"], ["b"]),
             h.make_node("Div", ["a", "b"], ["y"])]
    x = np.arange(-8, 8, dtype=np.int64).reshape(4, 4)
    imp, [got] = run(qdq(nodes, x.shape, T.INT8, inits, T.FLOAT), x)
    [edge] = imp.edges.outputs
    st_ = float(np.asarray(edge.scale).reshape(()))
    assert edge.type == "int16" and 32767 * st_ >= 128  # -64 / 0.5: the largest |a / b| over both ranges
    real = (x * 0.5) / np.maximum(x.T * 0.5, 0.5)
    assert np.array_equal(got, np.rint(real / st_).astype(np.int64))


# -- a written-out softmax: Exp(x - m) / ReduceSum(Exp(x - m)) ------------------------------------------------------
@SETTINGS
@given(d=st.data(), shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
       shift=st.sampled_from(["none", "max", "const", "max-float"]), form=st.sampled_from(["div", "mul", "mul-r"]),
       keep=st.booleans(), sum_qdq=st.booleans(), expand=st.booleans(),
       out_type=st.sampled_from([T.INT8, T.UINT8, T.FLOAT]), opset=st.sampled_from([11, 17]))
def test_a_written_out_softmax_imports_as_softmax(d, shape, shift, form, keep, sum_qdq, expand, out_type, opset):
    """Exp(x - m) / ReduceSum(Exp(x - m)) over contiguous axes (m constant along them: none, a max requantized at
    its own scale, a constant, a float max; Div or Mul by a Reciprocal; the sum kept or reshaped back, through a
    QuantizeLinear/DequantizeLinear pair, expanded) is softmax(x) along those axes: equal, integer for integer, to
    the integer form's oracle (test_quantized_rules), within 1/2 + delta of the exact softmax of the quantized
    input, and to the Softmax node's import where one axis is reduced; quantized by the QuantizeLinear after it
    or, as the float output, to int16 at the stated scale; the nodes only it read emit nothing. Regression: 'the
    ReduceSum input (Exp of a sum) must be quantized (QuantizeLinear) first' (Magika)."""
    rank = len(shape)
    a = d.draw(st.integers(0, rank - 1))
    b = d.draw(st.integers(a, rank - 1))
    axes = list(range(a, b + 1))
    zx = zero(d, T.INT8)
    zo = -128 if out_type == T.INT8 else 0
    m = written_softmax(shape, axes, shift, form, keep, sum_qdq, expand, out_type, zx, zo, opset)
    x = draw_x(d, shape, T.INT8)
    imp, [got] = run(m, x)
    emitting = {w.split(" ")[0] for w, nodes in imp.origins if nodes}  # the max, the Exp, the sum: dropped
    assert emitting <= {"softmax_div", f"QuantizeLinear_{len(m.graph.node) - 1}"}
    view = (math.prod(shape[:a]), math.prod(shape[a:b + 1]), math.prod(shape[b + 1:]))
    [p] = [r.softmax for r in imp.requants if r.softmax]
    if out_type == T.FLOAT:
        [edge] = imp.edges.outputs
        assert edge.type == "int16" and int(np.asarray(edge.zero_point).reshape(())) == 0
        so, (lo, hi) = float(np.asarray(edge.scale).reshape(())), (-32768, 32767)
    else:
        so, (lo, hi) = 1 / 256, RANGE[out_type]
    q = 1 / Fraction(so)
    assert np.array_equal(got, softmax_oracle(x - zx, 0.0625, q, view, p, zo, lo, hi))
    real = ((x - zx) * 0.0625).reshape(view)
    ex = np.exp(real - real.max(axis=1, keepdims=True))
    exact = (ex / ex.sum(axis=1, keepdims=True)).reshape(shape) * float(q) + zo
    inside = (got > lo) & (got < hi)
    assert (np.abs(got - exact)[inside] <= p.error + 1e-9).all()
    if a == b and out_type != T.FLOAT:
        nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
                 h.make_node("Softmax", ["xf"], ["p"], axis=a), h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
        inits = {"s": np.float32(0.0625), "zx": np.int8(zx), "so": np.float32(1 / 256), "zo": NP[out_type](zo)}
        _, [theirs] = run(qdq(nodes, shape, T.INT8, inits, out_type), x)
        assert np.array_equal(got, theirs)


@pytest.mark.parametrize("case", ["shift-along-another-axis", "divisor-reshaped-across", "divisor-transposed",
                                  "two-exps", "axes-not-contiguous"])
def test_what_is_not_a_softmax_is_not_read_as_one(case):
    """Chains that are not softmax(x) along the summed axes are not read as one: a shift that varies along the
    summed axis is refused as the softmax's input, naming the Div; a divisor holding other rows' sums (reshaped
    across, transposed), an Exp other than the summed one, axes that are not contiguous: the ReduceSum of an Exp is
    refused as before, naming it."""
    inits = {"s": np.float32(0.0625), "z": np.int8(0), "so": np.float32(1 / 256), "zo": np.int8(-128),
             "a1": np.array([1], np.int64), "a2": np.array([2], np.int64), "a02": np.array([0, 2], np.int64),
             "across": np.array([3, 1, 3], np.int64)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"])]
    e, axes, keep, den = "e", "a1", 1, "sum"
    if case == "shift-along-another-axis":  # x - max over axis 2, summed over axis 1
        nodes += [h.make_node("ReduceMax", ["xf"], ["mx"], axes=[2], keepdims=1),
                  h.make_node("Sub", ["xf", "mx"], ["u"]), h.make_node("Exp", ["u"], ["e"])]
    else:
        nodes.append(h.make_node("Exp", ["xf"], ["e"]))
    if case == "two-exps":
        nodes += [h.make_node("Neg", ["xf"], ["xn"]), h.make_node("Exp", ["xn"], ["e2"])]
        e = "e2"
    if case == "axes-not-contiguous":
        axes = "a02"
    if case == "divisor-reshaped-across":  # the (3, 3) sums over axis 2 placed as (3, 1, 3): along axis 1
        axes, keep = "a2", 0
    nodes.append(h.make_node("ReduceSum", [e, axes], ["sum"], keepdims=keep, name="the_sum"))
    if case == "divisor-reshaped-across":
        nodes.append(h.make_node("Reshape", ["sum", "across"], ["den"]))
        den = "den"
    if case == "divisor-transposed":
        nodes.append(h.make_node("Transpose", ["sum"], ["den"], perm=[0, 2, 1]))
        den = "den"
    nodes += [h.make_node("Div", ["e", den], ["p"], name="softmax_div"),
              h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
    m = qdq(nodes, (3, 3, 3), T.INT8, inits, T.INT8)
    if case == "shift-along-another-axis":
        want = r"softmax_div \(Div\): the written-out softmax's input \(a sum\) must be quantized"
    else:
        want = r"the_sum \(ReduceSum\): the ReduceSum input \(.*\) must be quantized"
    with pytest.raises(CVMError, match=want):
        import_model(m)
