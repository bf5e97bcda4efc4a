"""Recurrent layers whose input scale is large against W (silero v5 fed 512 samples: s_x = 18.3), so that x W^T's
parts pass 32 bits on the grid 2^-14 (converters/from_onnx/quantized/recurrent.py, ``saturated``): their steps equal
the integer oracle exactly, whole layers import, export bit-exactly and stay as close to float as onnxruntime's
quantized model; scales past what the pre-clip keeps within 32 bits are refused in one line."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from support import recurrent as rec
from support.transformers import lstm_model
from test_rnn import rnn_oracle
from test_transformers import gru_oracle

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx.context import Importer, Tensor
from cvm_onnx.converters.from_onnx.quantized.recurrent import (RNN_BITS, direction, gru_direction, lstm_bits,
                                                              rnn_direction)
from cvm_onnx.converters.from_onnx.quantized.values import Scaled
from cvm_onnx.converters.from_onnx.registry import Refuse
from cvm_onnx.core.executor import execute
from cvm_onnx.core.graph import Graph
from cvm_onnx.core.validate import validate
from cvm_onnx.runtime.verify import verify


def layer(op: str, x, w16, e_w: int, r16, e_r: int, b, h0, order):
    """(the imported direction's outputs on ``x``, the oracle's) for W = w16 2^-e_w / s_x (s_x = 2^-4), R = r16
    127 2^-e_r."""
    steps, batch, size = x.shape
    w, r = w16 * 2.0 ** (4 - e_w), r16 * 127 * 2.0 ** -e_r
    ctx = Importer()
    data = ctx.variable("data", (steps, batch, size), 9)
    xs = Scaled(Tensor(T.INT8, (steps, batch, size), -128, 127, data), np.asarray(Fraction(1, 16), object),
                np.zeros((), np.int64))
    k = len(b) // 2
    if op == "LSTM":
        c0 = np.zeros_like(h0)
        g = lstm_bits(steps, 0.0)
        ys, h, c = direction(ctx, xs, w, r, b, h0, c0, order, g)
        outs = [*ys, h, c]
        wys, wh, wc = rec.lstm(x, w16, e_w, r16, e_r, b[:k] + b[k:], h0, c0, order, g)
        want = [*wys, wh, wc]
    elif op == "GRU":  # linear_before_reset = 1: R one tensor
        ys, h = gru_direction(ctx, xs, w, r, b, h0, order, 10, True)
        outs = [*ys, h]
        hidden = k // 3
        wys, wh = gru_oracle(x, w16, e_w, [r16] * 2, [e_r] * 2, b[:k] + np.concatenate([b[k:k + 2 * hidden],
                             0 * b[k + 2 * hidden:]]), b[k + 2 * hidden:], h0, order, 10, True)
        want = [*wys, wh]
    else:
        ys, h = rnn_direction(ctx, xs, w, r, b, h0, order, False)
        outs = [*ys, h]
        wys, wh = rnn_oracle(x, w16, e_w, r16, e_r, b[:k] + b[k:], h0, order, RNN_BITS, False)
        want = [*wys, wh]
    graph = validate(Graph(ctx.nodes, tuple(t.entry for t in outs), ctx.params)).graph
    return graph, execute(graph, {"data": x.astype(np.int32)}), want


@settings(max_examples=15, deadline=None)
@given(op=st.sampled_from(["LSTM", "GRU", "RNN"]), steps=st.integers(1, 3), batch=st.integers(1, 2),
       size=st.integers(1, 40), hidden=st.integers(1, 3), reverse=st.booleans(), states=st.booleans(),
       e_w=st.integers(-10, 8), e_r=st.integers(17, 24), seed=st.integers(0, 2**16))
@example(op="LSTM", steps=2, batch=1, size=32, hidden=2, reverse=False, states=True, e_w=8, e_r=18, seed=3)
@example(op="GRU", steps=2, batch=1, size=1, hidden=2, reverse=True, states=False, e_w=-10, e_r=17, seed=4)
@example(op="RNN", steps=1, batch=1, size=1100, hidden=1, reverse=False, states=True, e_w=15, e_r=17, seed=5)
def test_steps_at_large_input_scales_equal_the_integer_form(op, steps, batch, size, hidden, reverse, states, e_w,
                                                            e_r, seed):
    """LSTM, GRU and RNN steps for s_x s_W = 2^-e_w up to 2^10 (x W_hi^T shifted left by 13 to 31 bits, x W_lo^T
    by 6 to 24: a part's label past 32 bits on 2^-14 for e_w <= about 3 + log2(size)) equal the integer oracle's
    (which sums the parts unclipped), on int8 inputs at the extremes. The examples were refused before: the first
    two on the grid 2^-14 past 32 bits, the third (1100 inputs, x W_lo^T shifted right, x W_hi^T left by 6) its
    label 33 bits."""
    rng = np.random.default_rng(seed)
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    w16, r16 = rec.ints16(rng, (gates * hidden, size)), rec.ints16(rng, (gates * hidden, hidden))
    x = rng.integers(-128, 128, (steps, batch, size))
    x.flat[0], x.flat[-1] = -128, 127
    if rng.integers(0, 2):  # every x at the extreme that drives x W^T's first row furthest
        x[...] = np.where(w16[0] >= 0, 127, -128)
    b = rng.normal(size=2 * gates * hidden) * 4
    h0 = rng.uniform(-1, 1, (batch, hidden)) if states else np.zeros((batch, hidden))
    order = list(range(steps))[::-1] if reverse else list(range(steps))
    graph, got, want = layer(op, x, w16, e_w, r16, e_r, b, h0, order)
    for have, w in zip(got, want):
        assert np.array_equal(have.astype(np.int64), np.asarray(w, np.int64).reshape(have.shape))
    assert verify(graph, x.astype(np.int32)).exact


def test_scales_past_the_pre_clip_are_refused_naming_the_rule():
    """s_x s_W = 2^25: the clipped sum put on 2^-14 (v 2^39) passes 32 bits, refused in one line."""
    rng = np.random.default_rng(0)
    with pytest.raises(Refuse, match=r"recurrent layer's weights on the grid 2\^-14 reaches 2\^\d+: beyond CVM's 32"):
        layer("LSTM", rng.integers(-128, 128, (2, 1, 3)), rec.ints16(rng, (8, 3)), -25, rec.ints16(rng, (8, 2)),
              18, np.zeros(16), np.zeros((1, 2)), [0, 1])


@pytest.mark.parametrize("op, way", [("LSTM", "forward"), ("GRU", "bidirectional"), ("RNN", "reverse")])
def test_layers_fed_at_a_large_scale_import_whole_and_exact(tmp_path, op, way):
    """A layer whose input quantize_static calibrates at a scale of 786 (x of N(0, 1e4) through a MatMul of 24):
    x W_hi^T on 2^-14 would reach 2^35 (refused before); imported whole, exported bit-exactly, its distance from
    the float model within 1.02x onnxruntime's quantized model's."""
    onnx.save(lstm_model(way, 0, size=24, op=op), tmp_path / "f.onnx")
    rng = np.random.default_rng(1)
    np.save(tmp_path / "c.npy", (rng.normal(size=(32, 12, 1, 24)) * 1e4).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.02 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact
