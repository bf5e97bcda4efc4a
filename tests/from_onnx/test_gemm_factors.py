"""Gemm's alpha, beta and transA in quantized models (docs/import.md, "Gemm's alpha, beta and transA"): QDQ Gemm and
com.microsoft QGemm against the exact oracle of docs/import.md (every requantization within its bound of the exact
rational value), the export against the reference executor, and onnxruntime's own integers within one step where
its kernel computes the graph's value (no C, or C at alpha s_a s_b)."""
from __future__ import annotations

import math

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
scales = st.floats(2.0**-8, 2.0**2, width=32)
factors = st.one_of(st.sampled_from([1.0, -1.0, 0.5, 2.0, 0.125, -3.0]),
                    st.floats(2.0**-6, 2.0**6, width=32).flatmap(lambda f: st.sampled_from([f, -f])))


def inputs(d, shape, dtype) -> np.ndarray:
    """Random integers of the type with its extremes likely."""
    lo, hi = RANGE[dtype]
    kind = d.draw(st.sampled_from(["random", "low", "high", "ends"]))
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    if kind == "low":
        return np.full(shape, lo, np.int64)
    if kind == "high":
        return np.full(shape, hi, np.int64)
    if kind == "ends":
        return rng.choice([lo, hi], size=shape).astype(np.int64)
    return rng.integers(lo, hi + 1, size=shape).astype(np.int64)


def checked(m, x: np.ndarray, ort_within: bool):
    """The import of m equals the oracle on x (each requantization within its bound), its export equals the
    reference executor, and (``ort_within``) onnxruntime's result is within one step."""
    imp = import_model(m, input_precision=9)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    oracle = Oracle(m, imp)
    [want] = oracle.run(x)
    assert np.array_equal(got.astype(np.int64), np.asarray(want[1]).reshape(got.shape))
    assert verify(imp.graph, x.astype(np.int32)).exact
    if ort_within:
        theirs = ort_session(m).run(
            None, {"x": x.astype(NP[m.graph.input[0].type.tensor_type.elem_type])})[0]
        assert np.abs(theirs.astype(np.int64) - got.astype(np.int64).reshape(theirs.shape)).max() <= 1
    return imp


@settings(max_examples=25, deadline=None)
@given(d=st.data(), sx=scales, sw=scales, so=st.floats(2.0**-3, 2.0, width=32), alpha=factors,
       beta=st.one_of(st.just(0.0), factors),
       trans_a=st.booleans(), trans_b=st.booleans(), c_form=st.sampled_from(["none", "folds", "own", "matrix"]),
       x_type=st.sampled_from([T.INT8, T.UINT8]), out_type=st.sampled_from([T.INT8, T.UINT8]),
       per_channel=st.booleans())
def test_qdq_gemm_with_alpha_beta_trans_a(d, sx, sw, so, alpha, beta, trans_a, trans_b, c_form, x_type, out_type,
                                         per_channel):
    """QuantizeLinear(alpha A' B' + beta C) of a constant B (per tensor or per column) and a C of int32 at beta s_c
    = alpha s_a s_b (folded into dense's bias), at its own scale, or of shape (M, N) (a second term of the sum):
    equal to the oracle, exact on onnxruntime. Regression: refused, 'a quantized Gemm with alpha != 1, beta != 1
    beside a C, or transA has no CVM form here'."""
    m_, k, n = d.draw(st.integers(1, 4)), d.draw(st.integers(1, 6)), d.draw(st.integers(1, 5))
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    w = rng.choice([-127, 127, 0, 1], size=(k, n)) if d.draw(st.booleans()) else rng.integers(-127, 128, (k, n))
    w = w.T if trans_b else w
    if per_channel:
        sws = (np.float32(sw) * rng.uniform(0.25, 4, n)).astype(np.float32)
    else:
        sws = np.float32(sw)
    zo = int(rng.integers(*RANGE[out_type]))
    # the output scale near the product's reach over the output's 256 steps (a sum has no clip: far beyond it, no
    # plan holds the sum's labels, and the import refuses it naming the QuantizeLinear)
    so = float(np.float32(abs(alpha) * sx * float(np.max(sws)) * 127 * 128 * k / 128 * so))
    inits = {"s": np.float32(sx), "z": NP[x_type](int(rng.integers(*RANGE[x_type]))), "w": w.astype(np.int8),
             "sw": sws, "zw": np.zeros(np.shape(sws), np.int8), "so": np.float32(so), "zo": NP[out_type](zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], axis=0 if trans_b else 1)]
    gemm_in = ["xf", "wf"]
    if c_form != "none":
        shape = (m_, n) if c_form == "matrix" else d.draw(st.sampled_from([(n,), (1, n)]))
        big = d.draw(st.sampled_from([1000, 1 << 16]))
        inits["c"] = rng.integers(-big, big + 1, size=shape).astype(np.int32)
        if c_form == "folds" and beta:
            inits["sc"] = (np.float32(alpha) * np.float32(sx) * sws / np.float32(beta)).astype(np.float32)
            inits["sc"] = np.abs(inits["sc"])
            if np.ndim(sws) and len(shape) == 2:
                inits["c"] = inits["c"].reshape(-1)  # per-column scales dequantize a (N,) bias
        else:
            inits["sc"] = np.float32(so * d.draw(st.floats(2.0**-12, 2.0**-2, width=32)))
        inits["zc"] = np.zeros(np.shape(inits["sc"]), np.int32)
        nodes.append(h.make_node("DequantizeLinear", ["c", "sc", "zc"], ["cf"], axis=0))
        gemm_in.append("cf")
    nodes += [h.make_node("Gemm", gemm_in, ["r"], alpha=float(alpha), beta=float(beta), transA=int(trans_a),
                          transB=int(trans_b)),
              h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    x_shape = (k, m_) if trans_a else (m_, k)
    m = qdq(nodes, x_shape, x_type, inits, out_type)
    # onnxruntime fuses the nodes into QGemm (C in the accumulator, at alpha s_a s_b) where beta is 1 beside a C
    fused_as_written = c_form == "none" or beta != 1.0 or c_form == "folds" and alpha > 0
    checked(m, inputs(d, x_shape, x_type), ort_within=fused_as_written)


@settings(max_examples=15, deadline=None)
@given(d=st.data(), sx=scales, so=scales, alpha=factors, trans_a=st.booleans(),
       x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_qdq_gemm_of_two_computed_tensors_with_alpha(d, sx, so, alpha, trans_a, x_type):
    """alpha A' A'^T of a computed A (Gemm(x, x, transB=1), or transA then B = x: x^T x): variable_matmul at scale
    |alpha| s^2, negated for alpha < 0; equal to the oracle and on onnxruntime."""
    m_, k = d.draw(st.integers(1, 4)), d.draw(st.integers(1, 6))
    z = int(np.random.default_rng(0).integers(*RANGE[x_type]))
    inits = {"s": np.float32(sx), "z": NP[x_type](z), "so": np.float32(so), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Gemm", ["xf", "xf"], ["r"], alpha=float(alpha), transA=int(trans_a), transB=int(not trans_a)),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    m = qdq(nodes, (m_, k), x_type, inits, T.INT8)
    checked(m, inputs(d, (m_, k), x_type), ort_within=True)


@settings(max_examples=15, deadline=None)
@given(d=st.data(), sx=scales, sw=scales, so=scales, alpha=factors, trans_a=st.booleans(), trans_b=st.booleans(),
       with_c=st.booleans(), x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_qgemm_with_alpha_and_trans_a(d, sx, sw, so, alpha, trans_a, trans_b, with_c, x_type):
    """com.microsoft QGemm: alpha (A' B' + C) with C int32 in the accumulator, as onnxruntime's kernel computes it;
    equal to the oracle, within one step of onnxruntime's integers. Regression: refused, 'QGemm with alpha != 1 or
    transA has no CVM form here'."""
    m_, k, n = d.draw(st.integers(1, 4)), d.draw(st.integers(1, 6)), d.draw(st.integers(1, 5))
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    w = rng.integers(-127, 128, (n, k) if trans_b else (k, n)).astype(np.int8)
    zo = int(rng.integers(*RANGE[x_type]))
    inits = {"s": np.float32(sx), "z": NP[x_type](int(rng.integers(*RANGE[x_type]))), "w": w, "sw": np.float32(sw),
             "zw": np.int8(0), "so": np.float32(so), "zo": NP[x_type](zo)}
    ins = ["x", "s", "z", "w", "sw", "zw", "c" if with_c else "", "so", "zo"]
    if with_c:
        inits["c"] = rng.integers(-5000, 5001, n).astype(np.int32)
    nodes = [h.make_node("QGemm", ins, ["y"], domain="com.microsoft", alpha=float(alpha), transA=int(trans_a),
                         transB=int(trans_b))]
    x_shape = (k, m_) if trans_a else (m_, k)
    m = qdq(nodes, x_shape, x_type, inits, x_type)
    checked(m, inputs(d, x_shape, x_type), ort_within=True)


def test_gemm_alpha_zero_and_not_finite_are_refused_in_one_line():
    """alpha 0 (the product unused) and a factor that is not finite are refused naming the node and the rule."""
    from test_quantized_import import problems
    for alpha, beta, words in ((0.0, 1.0, "alpha 0"), (math.inf, 1.0, "alpha=inf"), (1.0, math.nan, "beta=nan")):
        inits = {"s": np.float32(0.1), "z": np.int8(0), "w": np.ones((3, 2), np.int8), "sw": np.float32(0.1),
                 "zw": np.int8(0), "so": np.float32(0.1), "zo": np.int8(0)}
        nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
                 h.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"]),
                 h.make_node("Gemm", ["xf", "wf"], ["r"], name="g", alpha=alpha, beta=beta),
                 h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
        msg = problems(qdq(nodes, (2, 3), T.INT8, inits, T.INT8), input_precision=9)
        assert words in msg and "g (Gemm)" in msg and "\n" not in msg.strip()
