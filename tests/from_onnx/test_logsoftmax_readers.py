"""A LogSoftmax read by a float op that no QuantizeLinear precedes (quantize_static quantizes no Exp, Neg, ReduceMax
after it; QOperator no Gather): quantized first as a float output is (int16, zero point 0, scale s_t), then the
reader's rule; against the exact float64 value of the reader of the exact log-softmax, within 1/2 + (1/2 + delta)
s_t / s_out steps (each reader moves its input by at most its own change: exp on values <= 0, -x, max, a gather)."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.quantized import qdq

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.verify import verify

RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255)}
NP = {T.INT8: np.int8, T.UINT8: np.uint8}


def reader_nodes(reader: str, inits: dict) -> list:
    if reader == "Gather":
        inits["idx"] = np.array([0, 2, 1], np.int64)
        return [h.make_node("Gather", ["ls", "idx"], ["r"], axis=1)]
    if reader == "ReduceMax":
        return [h.make_node("ReduceMax", ["ls"], ["r"], axes=[1], keepdims=1)]
    return [h.make_node(reader, ["ls"], ["r"])]


def exact(reader: str, ls: np.ndarray) -> np.ndarray:
    return {"Exp": np.exp, "Neg": np.negative, "ReduceMax": lambda v: v.max(axis=1, keepdims=True),
            "Gather": lambda v: v[:, [0, 2, 1]]}[reader](ls)


@settings(max_examples=25, deadline=None)
@given(d=st.data(), reader=st.sampled_from(["Exp", "Neg", "ReduceMax", "Gather"]),
       x_type=st.sampled_from([T.INT8, T.UINT8]), o_type=st.sampled_from([T.INT8, T.UINT8]),
       sx=st.floats(2.0**-6, 0.5, width=32), n=st.integers(3, 64))
def test_a_logsoftmax_read_by_a_float_op_is_within_its_bound(d, reader, x_type, o_type, sx, n):
    """Exp (the softmax back: output 1/255), Neg, ReduceMax and Gather of LogSoftmax over n values, any zero points
    and output scales: within 1/2 + (1/2 + delta) s_t / s_out of the reader's exact value (saturated at the type's
    ends), delta the LogSoftmax rule's at the int16 grid, s_t the least float32 with 32767 s_t >= (hi - lo) s_x +
    log n; exported exactly. Regression: 'the Exp input (LogSoftmax) must be quantized (QuantizeLinear) first'."""
    zx, zo = d.draw(st.integers(*RANGE[x_type])), d.draw(st.integers(*RANGE[o_type]))
    lo_x, hi_x = RANGE[x_type]
    big = (hi_x - lo_x) * float(np.float32(sx)) + math.log(n)
    so = 1 / 255 if reader == "Exp" else float(np.float32(d.draw(st.floats(big / 200, big / 20))))
    inits = {"sx": np.float32(sx), "zx": NP[x_type](zx), "so": np.float32(so), "zo": NP[o_type](zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             h.make_node("LogSoftmax", ["xf"], ["ls"], axis=1)] + reader_nodes(reader, inits) + \
        [h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    m = qdq(nodes, (2, n), x_type, inits, o_type, opset=13)
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    x = rng.integers(lo_x, hi_x + 1, (2, n))
    if d.draw(st.booleans()):  # one maximum among the least values, and a flat row
        x[0], x[1] = lo_x, rng.integers(lo_x, hi_x + 1)
        x[0, 1] = hi_x
    imp = import_model(m, input_precision=9)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    assert verify(imp.graph, x.astype(np.int32)).exact
    s_t = np.float32(big / 32767)
    while float(s_t) * 32767 < big:
        s_t = np.nextafter(s_t, np.float32(np.inf))
    [p] = [r.logsoftmax for r in imp.requants if r.logsoftmax is not None]
    v = (x.astype(np.float64) - zx) * float(np.float32(sx))
    ls = v - v.max(axis=1, keepdims=True)
    ls = ls - np.log(np.exp(ls).sum(axis=1, keepdims=True))
    want = exact(reader, ls) / float(np.float32(so))
    e = 0.5 + (0.5 + p.delta) * float(s_t) / float(np.float32(so)) + 1e-9
    lo, hi = RANGE[o_type]
    g = got.astype(np.int64).reshape(want.shape) - zo
    inside = (lo - zo < g) & (g < hi - zo)
    assert (np.abs(g - want)[inside] <= e).all(), np.abs(g - want)[inside].max()
    assert (want[g == hi - zo] >= hi - zo - e).all() and (want[g == lo - zo] <= lo - zo + e).all()
