"""What a fifth corpus of models shipped in wheels met in quantize: scikit-learn's ai.onnx.ml Scaler (skl2onnx's
StandardScaler before an MLP) written as Add and Mul, checked bit for bit against onnxruntime's own Scaler over random
offsets, scales and inputs; the MLP then quantizes and imports whole, where quantize_static looped forever (no
type known after the Scaler, so a Reshape waited for its input's quantization); such a wait refused naming the
node; a weight read by several Gemms (a written-out LSTM's steps), on which onnxruntime could not build the
comparison's session; nothing left in the working folder by onnxruntime's symbolic shape inference; a Pad of a
quantized constant value (madmom); a model computing in float16 (Keras' mixed precision) widened to float32."""
from __future__ import annotations

import contextlib
import signal
from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from support.quantized import qdq

from cvm_onnx.app.quantize import quantize
from cvm_onnx.app.rewrites import float16_as_float32, scalers_as_ops
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify


@contextlib.contextmanager
def within(seconds: int):
    """Fail the test, instead of hanging it, where the body runs longer than ``seconds``."""
    def stop(*_):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def with_ml(g: onnx.GraphProto) -> onnx.ModelProto:
    m = onnx_model(g, 13)
    m.opset_import.append(h.make_opsetid("ai.onnx.ml", 1))
    return m


def scaler_model(kind: int, shape: list[int], offset: list[float], scale: list[float]) -> onnx.ModelProto:
    g = h.make_graph([h.make_node("Scaler", ["x"], ["y"], domain="ai.onnx.ml", offset=offset, scale=scale)], "s",
                     [h.make_tensor_value_info("x", kind, shape)], [h.make_tensor_value_info("y", T.FLOAT, None)])
    return with_ml(g)


def run(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


FLOATS = st.floats(width=32, allow_nan=False, allow_infinity=False) | st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 1.0])
KINDS = {T.FLOAT: np.float32, T.INT32: np.int32, T.INT64: np.int64}


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(KINDS)), rank=st.sampled_from([1, 2]), features=st.integers(1, 6),
       rows=st.integers(1, 4), per=st.booleans(),
       data=st.data())
def test_a_scaler_is_its_add_and_mul_bit_for_bit(kind, rank, features, rows, per, data):
    """onnxruntime's Scaler kernel, y = (x - offset) * scale in float32 per feature (one value or one per feature,
    as many of each), and the rewrite's Add(x, -offset), Mul(scale) give the same float32 values and signs,
    infinities from overflow included, for float and integer inputs of extreme values; the numpy float32 formula
    agrees (NaN where 0 * inf)."""
    offset, scale = ([data.draw(FLOATS) for _ in range(features if per else 1)] for _ in range(2))
    shape = [rows, features] if rank == 2 else [features]
    size = int(np.prod(shape))
    if KINDS[kind] is np.float32:
        x = np.array(data.draw(st.lists(FLOATS, min_size=size, max_size=size)), np.float32)
    else:
        info = np.iinfo(KINDS[kind])
        x = np.array(data.draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=size, max_size=size)),
                     KINDS[kind])
    x = x.reshape(shape)
    m = scaler_model(kind, shape, offset, scale)
    with np.errstate(all="ignore"):
        want = (x.astype(np.float32) - np.float32(offset)) * np.float32(scale)
        rewritten = onnx.ModelProto()
        rewritten.CopyFrom(m)
        assert scalers_as_ops(rewritten.graph) == 1
        assert {n.op_type for n in rewritten.graph.node} <= {"Cast", "Add", "Mul"}
        onnx.shape_inference.infer_shapes(rewritten, strict_mode=True)
        got, theirs = run(rewritten, x), run(m, x)
    assert np.array_equal(got, theirs, equal_nan=True) and np.array_equal(np.signbit(got), np.signbit(theirs))
    assert np.array_equal(got, want, equal_nan=True)


@pytest.mark.parametrize("shape, kind, offset", [([2, 3, 4], T.FLOAT, [1.0]),  # rank 3: left
                                                 ([2, 3], T.DOUBLE, [1.0]),  # double: left
                                                 ([2, 3], T.FLOAT, [1.0, 2.0]),  # two offsets for 3 features
                                                 ([2, 1], T.FLOAT, [1.0, 2.0])])  # two offsets, one scale
def test_other_scalers_are_left(shape, kind, offset):
    m = scaler_model(kind, shape, offset, [2.0])
    assert scalers_as_ops(m.graph) == 0 and [n.op_type for n in m.graph.node] == ["Scaler"]


def mlp(scaler_at_input: bool = True) -> onnx.ModelProto:
    """skl2onnx's MLPRegressor after a StandardScaler (the surfaces-onnx-files wheel's model): Scaler, Cast to float,
    MatMul + Add + Relu twice, MatMul + Add, Reshape to (N, 1); or with the Scaler after a Relu of the input."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.normal(size=(4, 16)).astype(np.float32), "w0"),
             nh.from_array(rng.normal(size=(1, 16)).astype(np.float32), "b0"),
             nh.from_array(rng.normal(size=(16, 16)).astype(np.float32) / 4, "w1"),
             nh.from_array(rng.normal(size=(1, 16)).astype(np.float32), "b1"),
             nh.from_array(rng.normal(size=(16, 1)).astype(np.float32), "w2"),
             nh.from_array(rng.normal(size=(1, 1)).astype(np.float32), "b2"),
             nh.from_array(np.array([-1, 1], np.int64), "shape")]
    scaler = h.make_node("Scaler", ["x" if scaler_at_input else "r"], ["s"], domain="ai.onnx.ml",
                         offset=[66.8, 1.5, 5.3, 0.9], scale=[0.025, 0.89, 0.32, 1.18])
    nodes = ([] if scaler_at_input else [h.make_node("Relu", ["x"], ["r"])]) + [
        scaler, h.make_node("Cast", ["s"], ["c"], to=T.FLOAT),
        h.make_node("MatMul", ["c", "w0"], ["m0"]), h.make_node("Add", ["m0", "b0"], ["a0"]),
        h.make_node("Relu", ["a0"], ["r0"]), h.make_node("MatMul", ["r0", "w1"], ["m1"]),
        h.make_node("Add", ["m1", "b1"], ["a1"]), h.make_node("Relu", ["a1"], ["r1"]),
        h.make_node("MatMul", ["r1", "w2"], ["m2"]), h.make_node("Add", ["m2", "b2"], ["a2"]),
        h.make_node("Reshape", ["a2", "shape"], ["y"], name="reshape")]
    g = h.make_graph(nodes, "mlp", [h.make_tensor_value_info("x", T.FLOAT, [None, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [None, 1])], inits)
    return with_ml(g)


def features(n: int) -> np.ndarray:
    rng = np.random.default_rng(1)
    return (np.array([66.8, 1.5, 5.3, 0.9]) + rng.normal(size=(n, 1, 4)) / np.array([0.025, 0.89, 0.32, 1.18])) \
        .astype(np.float32)


def test_an_sklearn_mlp_after_a_scaler_quantizes_and_imports(tmp_path):
    """Imports whole, as close to float as onnxruntime's quantized model (1.1x), the export exact; before: quantize
    never returned (quantize_static waited for the Reshape's input forever)."""
    onnx.save(mlp(), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", features(16))
    with within(120):
        done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def test_a_tensor_waiting_for_a_quantization_that_never_comes_is_refused(tmp_path, monkeypatch):
    """A Scaler the rewrite leaves (after a Relu: its input no graph input) stops onnx's shape inference; nothing
    after it is quantized and the Reshape's output waits for its input's scale: refused naming the Reshape, in one
    problem, before onnxruntime's loop (before: it never returned). Nothing is left in the working folder (before:
    onnxruntime's symbolic shape inference left sym_shape_infer_temp.onnx there)."""
    onnx.save(mlp(scaler_at_input=False), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", features(8))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    with within(120), pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [p] = e.value.problems
    assert p.where == "reshape" and "scale and zero point of 'a2'" in p.rule and "forever" in p.rule
    assert not list((tmp_path / "cwd").iterdir()) and not (tmp_path / "m").exists()


def test_a_weight_read_by_several_gemms_is_compared(tmp_path):
    """Three Gemm + Tanh steps reading one weight and bias (an LSTM written out per step, captcha-whisperer's CRNN):
    onnxruntime cannot make its exact-kernel session of the quantized model ("Attempt to replace the existing
    tensor", a traceback before); the comparison runs it at the basic optimization level: imports whole, as
    close to float as that (1.1x), the export exact."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.normal(size=(8, 8)).astype(np.float32) / 2, "w"),
             nh.from_array(rng.normal(size=8).astype(np.float32), "b")]
    nodes, x = [], "x"
    for k in range(3):
        nodes += [h.make_node("Gemm", [x, "w", "b"], [f"g{k}"], transB=1), h.make_node("Tanh", [f"g{k}"], [f"t{k}"])]
        x = f"t{k}"
    g = h.make_graph(nodes, "steps", [h.make_tensor_value_info("x", T.FLOAT, [1, 8])],
                     [h.make_tensor_value_info(x, T.FLOAT, None)], inits)
    onnx.save(onnx_model(g, 13), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 1, 8)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def pad_model(x_type: int, s: float, z: int, vq: int, vs: float, vz: int, pads: list[int]) -> onnx.ModelProto:
    """DequantizeLinear(x) padded with a quantized constant_value DequantizeLinear(vq, vs, vz), quantized back at
    x's scale and zero point: quantize_static's QDQ Pad (madmom's key CNN pads so)."""
    inits = {"s": np.float32(s), "z": NP[x_type](z), "vq": NP[x_type](vq), "vs": np.float32(vs), "vz": NP[x_type](vz),
             "pads": np.array(pads, np.int64)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("DequantizeLinear", ["vq", "vs", "vz"], ["v"]),
             h.make_node("Pad", ["xf", "pads", "v"], ["p"], mode="constant", name="pad"),
             h.make_node("QuantizeLinear", ["p", "s", "z"], ["y"])]
    return qdq(nodes, (1, 2, 3, 3), x_type, inits, x_type)


NP = {T.INT8: np.int8, T.UINT8: np.uint8}


@settings(max_examples=30, deadline=None)
@given(x_type=st.sampled_from([T.INT8, T.UINT8]), s=st.floats(2.0**-10, 2.0**4, width=32), data=st.data())
def test_a_pad_with_a_quantized_value_pads_its_integer(x_type, s, data):
    """A Pad whose constant_value is itself dequantized, (vq - vz) vs exactly: where that is on x's grid (vs = s,
    vz = z, as quantize_static writes it; or any value whose v / s is whole) and within x's type, the integer
    v / s + z is padded; off the grid or outside x's type, the integer the QuantizeLinear after the Pad gives
    float32's v, saturate(round_half_even(fl(v) / s) + z): equal to the exact QDQ model's result (x's integers,
    the padded value's integer) on every input. Regression: an AttributeError ('Scaled' object has no attribute
    'is_const') on madmom's key CNN; off the grid or outside x's type, refused."""
    lo, hi = (-128, 127) if x_type == T.INT8 else (0, 255)
    z, vq = data.draw(st.integers(lo, hi)), data.draw(st.integers(lo, hi))
    same = data.draw(st.booleans())
    vs, vz = (s, z) if same else (data.draw(st.floats(2.0**-10, 2.0**4, width=32)), data.draw(st.integers(lo, hi)))
    pads = data.draw(st.lists(st.integers(0, 2), min_size=8, max_size=8))
    m = pad_model(x_type, s, z, vq, vs, vz, pads)
    v = (vq - vz) * Fraction(vs)
    fill = v / Fraction(s) + z
    if fill.denominator != 1 or not lo <= fill <= hi:  # QuantizeLinear of float32's v
        v32 = np.float32(np.float32(vq - vz) * np.float32(vs))
        fill = int(np.clip(np.rint(v32 / np.float32(s)) + z, lo, hi))
    imp = import_model(m, input_precision=9)
    x = np.asarray(data.draw(st.lists(st.integers(lo, hi), min_size=18, max_size=18)), np.int64).reshape(1, 2, 3, 3)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    want = np.pad(x, [(a, b) for a, b in zip(pads[:4], pads[4:])], constant_values=fill)
    assert np.array_equal(got.astype(np.int64), want)
    assert verify(imp.graph, x.astype(np.int32)).exact


def half_model(dtype: int, w: np.ndarray, b: np.ndarray, vocab: np.ndarray) -> onnx.ModelProto:
    """Keras' mixed precision as tf2onnx writes it (slovorez's morpheme model): int32 ids, a float32 embedding
    Gather, Cast to ``dtype``, a Conv and bias Add of ``dtype`` weights, Relu, Softmax, a ``dtype`` output."""
    np_type = np.float16 if dtype == T.FLOAT16 else np.float32
    inits = [nh.from_array(vocab, "emb"), nh.from_array(w.astype(np_type), "w"), nh.from_array(b.astype(np_type), "b"),
             nh.from_array(np.array([2], np.int64), "ax")]
    nodes = [h.make_node("Gather", ["emb", "x"], ["e"]), h.make_node("Cast", ["e"], ["c"], to=dtype),
             h.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 1]), h.make_node("Unsqueeze", ["t", "ax"], ["u"]),
             h.make_node("Conv", ["u", "w", "b"], ["k"], pads=[0, 1, 0, 1]), h.make_node("Relu", ["k"], ["r"]),
             h.make_node("Softmax", ["r"], ["y"], axis=1)]
    g = h.make_graph(nodes, "half", [h.make_tensor_value_info("x", T.INT32, [1, 6])],
                     [h.make_tensor_value_info("y", dtype, None)], inits)
    return onnx_model(g, 13)


def half_weights(seed: int, scale: float = 1.0):
    rng = np.random.default_rng(seed)
    w = (rng.normal(size=(5, 4, 1, 3)) * scale).astype(np.float16)
    return w, rng.normal(size=5).astype(np.float16), rng.normal(size=(9, 4)).astype(np.float32)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), scale=st.sampled_from([1e-3, 1.0, 300.0]),
       ids=st.lists(st.integers(0, 8), min_size=6, max_size=6))
def test_a_float16_model_widened_is_its_float32_twin(seed, scale, ids):
    """float16_as_float32 leaves no float16 anywhere and computes exactly what the same graph written in float32
    with the same (float16) weights computes, bit for bit."""
    w, b, vocab = half_weights(seed, scale)
    m = half_model(T.FLOAT16, w, b, vocab)
    assert float16_as_float32(m.graph) > 0
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True).graph
    assert all(t.data_type != T.FLOAT16 for t in m.graph.initializer)
    assert all(v.type.tensor_type.elem_type != T.FLOAT16 for v in (*inferred.value_info, *inferred.output))
    x = np.array([ids], np.int32)
    twin = half_model(T.FLOAT, w.astype(np.float32), b.astype(np.float32), vocab)
    got, want = run(m, x), run(twin, x)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_a_float16_model_quantizes_and_imports(tmp_path):
    """The mixed-precision model imports whole, as close to float as onnxruntime's quantized model (1.1x), the
    export exact; before: refused (DequantizeLinear with a float16 scale, float Casts of dequantized values)."""
    m = half_model(T.FLOAT16, *half_weights(0))
    onnx.save(m, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(1).integers(0, 9, (16, 6)).astype(np.int32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


@settings(max_examples=25, deadline=None)
@given(x_type=st.sampled_from([T.INT8, T.UINT8]), s=st.floats(2.0**-8, 2.0**2, width=32),
       op=st.sampled_from(["ReduceMean", "GlobalAveragePool"]), fn=st.sampled_from(["Elu", "Sigmoid", "Softplus"]),
       data=st.data())
def test_a_float_function_averaged_at_the_output_is_tabled_first(x_type, s, op, fn, data):
    """DequantizeLinear -> Elu (or another float function) -> ReduceMean or GlobalAveragePool -> the output, both
    left in float by quantize_static (madmom's key CNN ends so): the function is tabled as a float output is
    (int16, zero point 0, the least float32 step s_t with 32767 s_t >= its largest |value|), then averaged in
    integers; the output within s_t / 2 + half its own step of the float64 mean of the function, on every input.
    Regression: refused ('the ReduceMean input (Elu) must be quantized (QuantizeLinear) first')."""
    lo, hi = (-128, 127) if x_type == T.INT8 else (0, 255)
    z = data.draw(st.integers(lo, hi))
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=4, max_size=4)))
    attrs = {}
    if op == "ReduceMean":
        attrs = {"axes": data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True)),
                 "keepdims": int(data.draw(st.booleans()))}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node(fn, ["xf"], ["f"]),
             h.make_node(op, ["f"], ["y"], **attrs)]
    m = qdq(nodes, shape, x_type, {"s": np.float32(s), "z": NP[x_type](z)}, T.FLOAT, opset=13)
    imp = import_model(m, input_precision=9)
    x = np.asarray(data.draw(st.lists(st.integers(lo, hi), min_size=int(np.prod(shape)),
                                      max_size=int(np.prod(shape)))), np.int64).reshape(shape)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    [edge] = imp.edges.outputs
    real = (got.astype(np.float64) - float(edge.zero_point.reshape(-1)[0])) * float(edge.scale.reshape(-1)[0])
    f = {"Elu": lambda v: np.where(v >= 0, v, np.expm1(v)), "Sigmoid": lambda v: 1 / (1 + np.exp(-v)),
         "Softplus": lambda v: np.logaddexp(0, v)}[fn]
    values = f((np.arange(lo, hi + 1) - z) * float(np.float32(s)))
    table_step = float(np.abs(values).max() or 1.0) / 32767 * (1 + 2.0**-20)
    axes = tuple(attrs.get("axes", (2, 3)))
    want = f((x - z) * float(np.float32(s))).mean(axis=axes, keepdims=bool(attrs.get("keepdims", 1)))
    bound = table_step / 2 + float(edge.scale.reshape(-1)[0]) / 2
    assert np.abs(real.reshape(want.shape) - want).max() <= bound * (1 + 1e-9)
    assert verify(imp.graph, x.astype(np.int32)).exact
