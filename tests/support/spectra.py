"""An audio front end as models ship it (ONNX's STFT, HannWindow, MelWeightMatrix) and tone samples for it, for
quantize's STFT rewrite (tests/from_onnx/test_quantize_spectra.py) and the real runtime's test."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.core.format.onnx_file import onnx_model


def mel_front_end(length: int = 800, size: int = 160, step: int = 80, mels: int = 16) -> onnx.ModelProto:
    """An audio front end as models ship it: STFT of a periodic Hann window of a constant size (HannWindow of a
    Constant), the power |X|^2 (Mul, ReduceSum over re/im), a MatMul by MelWeightMatrix of constants, Sqrt."""
    def c(v, name):
        return h.make_node("Constant", [], [name], value=nh.from_array(np.array(v), name))
    nodes = [c(np.int64(size), "wn"), h.make_node("HannWindow", ["wn"], ["w"], periodic=1),
             h.make_node("STFT", ["x", "step", "w", "n"], ["spec"], onesided=1, name="stft"),
             h.make_node("Mul", ["spec", "spec"], ["sq"]),
             h.make_node("ReduceSum", ["sq", "axes"], ["power"], keepdims=0),
             c(np.int64(mels), "nm"), c(np.int64(size), "dl"), c(np.int64(16000), "sr"), c(np.float32(0), "lo"),
             c(np.float32(8000), "hi"), h.make_node("MelWeightMatrix", ["nm", "dl", "sr", "lo", "hi"], ["mel"]),
             h.make_node("MatMul", ["power", "mel"], ["melspec"]), h.make_node("Sqrt", ["melspec"], ["y"])]
    inits = [nh.from_array(np.array(step, np.int64), "step"), nh.from_array(np.array(size, np.int64), "n"),
             nh.from_array(np.array([-1], np.int64), "axes")]
    g = h.make_graph(nodes, "front", [h.make_tensor_value_info("x", T.FLOAT, [1, length, 1])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    return onnx_model(g, 17)


def tones(n: int, length: int = 800, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(length) / 16000
    return np.stack([(np.sin(2 * np.pi * rng.uniform(100, 4000) * t) * rng.uniform(0.1, 1)
                      + rng.normal(0, 0.05, length))[None, :, None] for _ in range(n)]).astype(np.float32)
