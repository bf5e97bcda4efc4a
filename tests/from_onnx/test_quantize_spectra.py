"""quantize's rewrite of ONNX's STFT and DFT (``cvm_onnx.app.rewrites.spectra_as_products``): a strided Conv and a
MatMul by the DFT matrix, against the DFT computed in float64 (numpy's FFT of the frames) within the stated bound
(N C + 2) 2^-24 sum |x w| per bin (C = 1 or 2 channels), and exactly where every kernel value is an integer (N of
1, 2, 4 and an integer window); onnxruntime's own STFT and DFT against the same oracle, which pins the oracle's
frames, bins and signs; a window op of a constant size folded; a step computed at run time refused naming the node;
a spectrogram front end quantized and imported whole."""
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
from support.spectra import mel_front_end, tones

from cvm_onnx.app.rewrites import spectra_as_products
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.format.onnx_file import onnx_model

U = 2.0 ** -24


def session(m: onnx.ModelProto):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


def rewritten(m: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(m)
    assert spectra_as_products(out) == 1
    assert not {"STFT", "DFT", "HannWindow"} & {n.op_type for n in out.graph.node}
    onnx.shape_inference.infer_shapes(out, strict_mode=True)
    return out


def stft_model(shape, step, window, frame, onesided, hann=False) -> onnx.ModelProto:
    inits, nodes = [nh.from_array(np.array(step, np.int64), "step")], []
    if hann:
        nodes.append(h.make_node("Constant", [], ["wsize"], value=nh.from_array(np.array(frame, np.int64))))
        nodes.append(h.make_node("HannWindow", ["wsize"], ["w"], periodic=1))
    elif window is not None:
        inits.append(nh.from_array(window, "w"))
    if frame is not None:
        inits.append(nh.from_array(np.array(frame, np.int64), "n"))
    ins = ["x", "step", "w" if hann or window is not None else "", "n" if frame is not None else ""]
    while not ins[-1]:
        ins.pop()
    nodes.append(h.make_node("STFT", ins, ["y"], onesided=onesided, name="spectrum"))
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, list(shape))],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    return onnx_model(g, 17)


def stft_oracle(x: np.ndarray, step: int, w: np.ndarray, onesided: bool) -> tuple[np.ndarray, np.ndarray]:
    """(the STFT in float64, its bound (N C + 2) 2^-24 sum_n |x_n w_n| per frame): numpy's FFT of each frame."""
    size = w.size
    z = x[..., 0].astype(np.float64) + (1j * x[..., 1] if x.shape[-1] == 2 else 0)
    frames = (x.shape[1] - size) // step + 1
    seg = np.stack([z[:, f * step:f * step + size] for f in range(frames)], axis=1) * w
    spec = np.fft.fft(seg, axis=-1)[..., :size // 2 + 1 if onesided else size]
    mass = (np.abs(seg.real) + np.abs(seg.imag)).sum(-1, keepdims=True)
    return np.stack([spec.real, spec.imag], -1), (size * x.shape[-1] + 2) * U * mass[..., None] + 1e-30


@settings(max_examples=40, deadline=None)
@given(size=st.integers(1, 24), extra=st.integers(0, 30), step=st.integers(1, 6), channels=st.sampled_from([1, 2]),
       onesided=st.booleans(), given_=st.sampled_from(["both", "window", "length"]), seed=st.integers(0, 2**16))
def test_stft_is_a_strided_convolution(size, extra, step, channels, onesided, given_, seed):
    """STFT(signal, step, window, frame_length) as Transpose, Conv (stride step, kernel w cos and -w sin per bin),
    Reshape, Transpose: within (N C + 2) 2^-24 sum |x w| of the float64 DFT of each frame, as onnxruntime's STFT is
    within 8 times that; shape (batch, frames, bins, 2)."""
    rng = np.random.default_rng(seed)
    shape = (2, size + extra, channels)
    x = (rng.normal(size=shape) * rng.choice([1e-3, 1, 1e3])).astype(np.float32)
    w = rng.uniform(-1, 1, size).astype(np.float32)
    m = stft_model(shape, step, None if given_ == "length" else w, None if given_ == "window" else size, onesided)
    want, bound = stft_oracle(x, step, np.ones(size, np.float32) if given_ == "length" else w, onesided)
    got = session(rewritten(m)).run(None, {"x": x})[0]
    ort_y = session(m).run(None, {"x": x})[0]
    assert got.shape == want.shape == ort_y.shape
    assert (np.abs(got - want) <= bound).all()
    assert (np.abs(ort_y - want) <= 8 * bound).all()


@settings(max_examples=20, deadline=None)
@given(size=st.sampled_from([1, 2, 4]), extra=st.integers(0, 12), step=st.integers(1, 4),
       channels=st.sampled_from([1, 2]), onesided=st.booleans(), seed=st.integers(0, 2**16))
def test_stft_of_an_integer_kernel_is_exact(size, extra, step, channels, onesided, seed):
    """N of 1, 2 or 4 and an integer window: every kernel value w cos, w sin an integer (the quarter turns exact),
    every sum exact in float32: equal to the integer DFT."""
    rng = np.random.default_rng(seed)
    shape = (1, size + extra, channels)
    x = rng.integers(-1000, 1001, shape).astype(np.float32)
    w = rng.integers(-8, 9, size).astype(np.float32)
    want, _ = stft_oracle(x.astype(np.int64), step, w.astype(np.int64), onesided)
    got = session(rewritten(stft_model(shape, step, w, size, onesided))).run(None, {"x": x})[0]
    assert np.array_equal(got.astype(np.int64), np.rint(want).astype(np.int64))


def test_a_hann_window_of_a_constant_size_is_folded():
    shape, size = (1, 40, 1), 16
    m = stft_model(shape, 4, None, size, True, hann=True)
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    w = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(size) / size)).astype(np.float32)
    want, bound = stft_oracle(x, 4, w, True)
    r = rewritten(m)
    assert [n.op_type for n in r.graph.node] == ["Transpose", "Conv", "Reshape", "Transpose"]
    assert {t.name for t in r.graph.initializer} == {"spectrum:kernel", "spectrum:shape"}
    assert (np.abs(session(r).run(None, {"x": x})[0] - want) <= bound + 4 * U * np.abs(want)).all()


def test_an_stft_step_computed_at_run_time_is_refused_naming_the_node():
    g = h.make_graph([h.make_node("STFT", ["x", "step", "", "n"], ["y"], name="spectrum")], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 32, 1]),
                      h.make_tensor_value_info("step", T.INT64, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], [nh.from_array(np.array(8, np.int64), "n")])
    with pytest.raises(UnsupportedError, match=r"spectrum \(STFT\): STFT with its frame_step computed at run time"):
        spectra_as_products(onnx_model(g, 17))


def dft_model(shape, axis, length, inverse, onesided, opset) -> onnx.ModelProto:
    inits, ins = [], ["x", ""]
    if length is not None:
        inits.append(nh.from_array(np.array(length, np.int64), "len"))
        ins[1] = "len"
    attrs = {"inverse": inverse, "onesided": onesided}
    if opset >= 20:
        inits.append(nh.from_array(np.array(axis, np.int64), "axis"))
        ins.append("axis")
    else:
        attrs["axis"] = axis
    while not ins[-1]:
        ins.pop()
    g = h.make_graph([h.make_node("DFT", ins, ["y"], name="dft", **attrs)], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, list(shape))],
                     [h.make_tensor_value_info("y", T.FLOAT, None)],
                     inits)
    return onnx_model(g, opset)


@settings(max_examples=40, deadline=None)
@given(dims=st.lists(st.integers(1, 6), min_size=2, max_size=3), channels=st.sampled_from([1, 2]),
       axis_at=st.integers(0, 10), length=st.one_of(st.none(), st.integers(1, 9)), inverse=st.booleans(),
       onesided=st.booleans(), negative=st.booleans(), opset=st.sampled_from([17, 20]), seed=st.integers(0, 2**16))
def test_dft_is_a_matmul_by_the_dft_matrix(dims, channels, axis_at, length, inverse, onesided, negative, opset, seed):
    """DFT along a constant axis (1.. rank - 2, negative or not), of a dft_length shorter or longer than the axis
    (truncated, zero-padded) or none, forward or inverse (1 / N), of real or complex values, onesided where real:
    Transpose, Reshape, MatMul by the DFT matrix, Reshape, Transpose; within (N C + 2) 2^-24 sum |x| of numpy's
    FFT in float64, as onnxruntime's DFT is within 8 times that."""
    onesided = onesided and not inverse and channels == 1  # onesided: a forward DFT of real values
    shape = (2, *dims, channels)
    rank = len(shape)
    axis = 1 + axis_at % (rank - 2)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape).astype(np.float32)
    m = dft_model(shape, axis - rank if negative else axis, length, int(inverse), int(onesided), opset)
    size = shape[axis] if length is None else length
    z = np.moveaxis(x[..., 0].astype(np.float64) + (1j * x[..., 1] if channels == 2 else 0), axis, -1)
    z = z[..., :size]
    spec = (np.fft.ifft if inverse else np.fft.fft)(z, n=size, axis=-1)[..., :size // 2 + 1 if onesided else size]
    want = np.stack([np.moveaxis(spec.real, -1, axis), np.moveaxis(spec.imag, -1, axis)], -1)
    mass = (np.abs(z.real) + np.abs(z.imag)).sum(-1, keepdims=True) / (size if inverse else 1)
    bound = np.moveaxis((size * channels + 2) * U * mass, -1, axis)[..., None] + 1e-30
    got = session(rewritten(m)).run(None, {"x": x})[0]
    ort_y = session(m).run(None, {"x": x})[0]
    assert got.shape == want.shape == ort_y.shape
    assert (np.abs(got - want) <= bound).all()
    assert (np.abs(ort_y - want) <= 8 * bound).all()


def test_a_mel_front_end_quantizes_and_imports(tmp_path):
    """The STFT front end (``mel_front_end``): refused before (no rule for STFT); quantize_static quantizes the
    rewritten Conv and the folded mel matrix's MatMul, and the import is whole, the export exact, as close to float
    as onnxruntime's quantized model (1.1x)."""
    from cvm_onnx.app.quantize import quantize
    from cvm_onnx.runtime.verify import verify

    onnx.save(mel_front_end(), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", tones(16))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def _hostile(case: str) -> onnx.ModelProto:
    if case == "dft-length-input":
        g = h.make_graph([h.make_node("DFT", ["x", "len"], ["y"], name="spectrum")], "m",
                         [h.make_tensor_value_info("x", T.FLOAT, [1, 8, 1]),
                          h.make_tensor_value_info("len", T.INT64, [])],
                         [h.make_tensor_value_info("y", T.FLOAT, None)])
        return onnx_model(g, 17)
    if case == "dft-length-2^40":
        return dft_model((1, 8, 1), 1, 1 << 40, 0, 0, 17)
    if case == "hann-2^40":
        m = stft_model((1, 64, 1), 4, None, 16, True, hann=True)
        m.graph.node[0].attribute[0].t.CopyFrom(nh.from_array(np.array(1 << 40, np.int64)))
        return m
    if case == "step-empty":
        m = stft_model((1, 64, 1), 4, None, 16, True)
        m.graph.initializer[0].CopyFrom(nh.from_array(np.zeros(0, np.int64), "step"))
        return m
    if case == "dft-length-2":
        return dft_model((1, 8, 1), 1, [8, 8], 0, 0, 17)
    if case == "dft-length-float":
        m = dft_model((1, 8, 1), 1, 8, 0, 0, 17)
        m.graph.initializer[0].CopyFrom(nh.from_array(np.float32(np.nan), "len"))
        return m
    if case == "dft-axis-2":
        return dft_model((1, 8, 1), [1, 1], None, 0, 0, 20)
    return stft_model((1, 64, 1), 4, None, 65, True)  # a frame longer than the signal


@pytest.mark.parametrize("case, said", [
    ("dft-length-input", r"spectrum \(DFT\): DFT with its dft_length computed at run time"),
    ("dft-length-2^40", r"dft \(DFT\): DFT by a kernel of 8 x 2199023255552 values: at most 16777216"),
    ("hann-2^40", r"spectrum \(STFT\): STFT with its window computed at run time \(or by nodes of unstated shapes or "
                   r"over 16777216 values\)"),
    ("frame-65", r"spectrum \(STFT\): STFT of frame_length 65, frame_step 4, window of shape None over 64 samples"),
    ("step-empty", r"spectrum \(STFT\): STFT with its frame_step of shape \(0,\) and type int64: one integer"),
    ("dft-length-2", r"dft \(DFT\): DFT with its dft_length of shape \(2,\) and type int64: one integer"),
    ("dft-length-float", r"dft \(DFT\): DFT with its dft_length of shape \(\) and type float32: one integer"),
    ("dft-axis-2", r"dft \(DFT\): DFT with its axis of shape \(2,\) and type int64: one integer")])
def test_spectra_out_of_bounds_are_refused_naming_the_node_before_allocating(case, said):
    """A length computed at run time, a kernel or a window op of 2^40 values, a frame longer than the signal, a step,
    length or axis of other than one integer (an internal reshape error: found by the quantize fuzzer's STFT and DFT
    seeds): one refusal naming the node and the rule, before anything of that size is allocated."""
    import time

    start = time.monotonic()
    with pytest.raises(UnsupportedError, match=said):
        spectra_as_products(_hostile(case))
    assert time.monotonic() - start < 10
