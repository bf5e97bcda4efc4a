"""com.microsoft FastGelu with a bias (onnxruntime's transformer fusions write it): the bias added to the input's
integers on a grid K times finer (docs/import.md, "FastGelu's bias"), then one table; equal to that form's oracle
on every input integer and channel, and within 1/2 + 0.57 s / (K s_out) steps of the float FastGelu."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.quantized import qdq

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.executor import execute


def gelu_tanh(v):
    return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))


@settings(max_examples=15, deadline=None)
@given(channels=st.integers(1, 6), x_type=st.sampled_from([T.INT8, T.UINT8]), s=st.floats(2.0**-6, 2.0**-2, width=32),
       so=st.floats(2.0**-7, 2.0**-3, width=32), zx=st.integers(0, 127), zo=st.integers(-128, 127),
       reach=st.sampled_from([0.01, 1.0, 30.0, 3000.0]), seed=st.integers(0, 2**16))
def test_fastgelu_with_a_bias_is_one_table_over_a_finer_grid(channels, x_type, s, so, zx, zo, reach, seed):
    """On every input integer and channel: sat(round_half_even(gelu((K x + u_c - K z) s / K) / s_out) + z_out),
    K the largest power of two <= 256 with K 255 + max u - min u < 2^16 and u_c = round(b_c K / s); within
    1/2 + 0.57 s / (K s_out) (+ float rounding) of the float FastGelu of (x - z) s + b_c where it does not
    saturate; K = 1 still too wide is refused, naming the bias."""
    b = (np.random.default_rng(seed).uniform(-reach, reach, channels)).astype(np.float32)
    inits = {"s": np.float32(s), "zx": (np.int8 if x_type == T.INT8 else np.uint8)(zx), "so": np.float32(so),
             "zo": np.int8(zo), "b": b}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("FastGelu", ["xf", "b"], ["g"], domain="com.microsoft"),
             h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    m = qdq(nodes, (256, channels), x_type, inits, T.INT8)
    sx, bs = Fraction(float(np.float32(s))), [Fraction(float(v)) for v in b]
    k = 256
    while k >= 1:
        u = np.array([round(v * k / sx) for v in bs], np.int64)
        if k * 255 + int(u.max() - u.min()) < 1 << 16:
            break
        k //= 2
    if k < 1:
        try:
            import_model(m, input_precision=9)
        except UnsupportedError as e:
            assert "FastGelu bias spreads its input" in str(e)
            return
        raise AssertionError("a bias too wide for any table was not refused")
    lo = -128 if x_type == T.INT8 else 0
    x = np.arange(lo, lo + 256)[:, None] + np.zeros((1, channels), np.int64)
    imp = import_model(m, input_precision=9)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    fine = (k * x + u[None, :] - k * zx) * (float(sx) / k)
    want = np.clip(np.rint(gelu_tanh(fine) / float(np.float32(so))) + zo, -128, 127)
    assert np.array_equal(got, want)
    exact = gelu_tanh((x - zx) * float(sx) + b.astype(np.float64)[None, :]) / float(np.float32(so)) + zo
    inside = (exact > -128) & (exact < 127)
    assert (np.abs(got - exact)[inside] <= 0.5 + 0.57 * float(sx) / (k * float(np.float32(so))) + 1e-6).all()
    assert [nd.op for nd in imp.graph.nodes].count("cvm_lut") == 1
