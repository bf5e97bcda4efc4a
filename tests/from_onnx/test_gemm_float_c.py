"""A QDQ Gemm whose C is a float constant that no DequantizeLinear quantized (docs/import.md, "Gemm's alpha, beta and
transA"): C put on the product's grid, round_half_even(beta C / (|alpha| s_a s_b)) per element, then as a quantized
C (dense's bias where it is a row, else a second term). Against the exact oracle of docs/import.md (every
requantization within its bound), the export against the reference executor, and onnxruntime (which runs the float
Gemm) within one step."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.quantized import Oracle, ort_session, qdq

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.verify import verify

NP = {T.INT8: np.int8, T.UINT8: np.uint8}
RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255)}
powers = st.integers(-8, 2).map(lambda e: 2.0**e)
factors = st.sampled_from([1.0, -1.0, 0.5, 2.0, -0.25, 3.0, -1.5])

def check(m, x, x_type):
    """The import of m equals the oracle on x, exactly on onnxruntime's session of the export; onnxruntime running m
    itself within one step."""
    imp = import_model(m, input_precision=9)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    [want] = Oracle(m, imp).run(x)
    assert np.array_equal(got.astype(np.int64), np.asarray(want[1]).reshape(got.shape))
    assert verify(imp.graph, x.astype(np.int32)).exact
    theirs = ort_session(m).run(
        None, {"x": x.astype(NP[x_type])})[0]
    assert np.abs(theirs.astype(np.int64) - got.astype(np.int64).reshape(theirs.shape)).max() <= 1



@settings(max_examples=40, deadline=None)
@given(d=st.data(), sx=st.one_of(powers, st.floats(2.0**-8, 2.0**2, width=32)), sw=powers, alpha=factors,
       beta=factors, trans_a=st.booleans(), trans_b=st.booleans(),
       c_shape=st.sampled_from(["()", "(N,)", "(1, N)", "(M, N)", "(M, 1)"]), ties=st.booleans(),
       x_type=st.sampled_from([T.INT8, T.UINT8]), out_type=st.sampled_from([T.INT8, T.UINT8]),
       per_channel=st.booleans())
def test_a_float_c_is_put_on_the_products_grid(d, sx, sw, alpha, beta, trans_a, trans_b, c_shape, ties, x_type,
                                               out_type, per_channel):
    """QuantizeLinear(alpha A' B' + beta C) of a constant B (per tensor or per column) and a float constant C of any
    broadcast shape, its values random or exactly on half-steps of the grid (``ties``: the rounding half to even
    decides): equal to the oracle, exact on onnxruntime's session of the export, onnxruntime's float Gemm within one
    step. Regression: refused, 'the Gemm bias C is a float tensor that no DequantizeLinear produced'."""
    m_, k, n = d.draw(st.integers(1, 4)), d.draw(st.integers(1, 6)), d.draw(st.integers(1, 5))
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    w = rng.integers(-127, 128, (k, n))
    w = w.T if trans_b else w
    sws = (np.float32(sw) * 2.0 ** rng.integers(-2, 3, n)).astype(np.float32) if per_channel else np.float32(sw)
    zo = int(rng.integers(*RANGE[out_type]))
    so = float(np.float32(abs(alpha) * sx * float(np.max(sws)) * 127 * 128 * k / 128 / 4))
    shape = {"()": (), "(N,)": (n,), "(1, N)": (1, n), "(M, N)": (m_, n), "(M, 1)": (m_, 1)}[c_shape]
    unit = abs(alpha / beta) * float(sx) * np.broadcast_to(sws, (n,)).astype(np.float64)  # the grid of C
    steps = rng.integers(-3000, 3001, shape)
    if ties:  # C exactly half-way between two steps of its grid (one column's grid where C does not span them)
        c = (steps + 0.5) * (unit if shape and shape[-1] == n else unit[0])
    else:
        c = rng.normal(size=shape) * so * 8
    c = np.asarray(c).reshape(shape).astype(np.float32)
    inits = {"s": np.float32(sx), "z": NP[x_type](int(rng.integers(*RANGE[x_type]))), "w": w.astype(np.int8),
             "sw": sws, "zw": np.zeros(np.shape(sws), np.int8), "so": np.float32(so), "zo": NP[out_type](zo),
             "c": c}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], axis=0 if trans_b else 1),
             h.make_node("Gemm", ["xf", "wf", "c"], ["r"], alpha=alpha, beta=beta, transA=int(trans_a),
                         transB=int(trans_b)),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    x_shape = (k, m_) if trans_a else (m_, k)
    m = qdq(nodes, x_shape, x_type, inits, out_type)
    lo, hi = RANGE[x_type]
    x = rng.integers(lo, hi + 1, x_shape) if d.draw(st.booleans()) else rng.choice([lo, hi], x_shape)
    check(m, x, x_type)


@settings(max_examples=15, deadline=None)
@given(d=st.data(), sx=st.floats(2.0**-6, 2.0**-1, width=32), alpha=factors, beta=factors,
       c_shape=st.sampled_from(["(M,)", "(M, M)", "(M, 1)"]), x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_a_float_c_beside_a_product_of_computed_tensors(d, sx, alpha, beta, c_shape, x_type):
    """alpha x x^T + beta C (Gemm(x, x, transB=1)) with a float constant C: C on the grid of the computed product,
    |alpha| s^2; equal to the oracle, exact on onnxruntime's session of the export, onnxruntime within one step."""
    m_, k = d.draw(st.integers(1, 4)), d.draw(st.integers(1, 6))
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    so = float(np.float32(abs(alpha) * sx * sx * 128 * 128 * k / 64))
    shape = {"(M,)": (m_,), "(M, M)": (m_, m_), "(M, 1)": (m_, 1)}[c_shape]
    inits = {"s": np.float32(sx), "z": NP[x_type](int(rng.integers(*RANGE[x_type]))), "so": np.float32(so),
             "zo": np.int8(0), "c": (rng.normal(size=shape) * so * 8).astype(np.float32)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Gemm", ["xf", "xf", "c"], ["r"], alpha=alpha, beta=beta, transB=1),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    m = qdq(nodes, (m_, k), x_type, inits, T.INT8)
    lo, hi = RANGE[x_type]
    x = rng.integers(lo, hi + 1, (m_, k))
    check(m, x, x_type)
