"""LSTM with peepholes (input P: c into the i and f gates, the new c into o; madmom's LSTMs), unrolled as the LSTM
without them (docs/import.md, "LSTM: the integer form"): P per tensor and direction at 2^-e with |P_q| <= 2^G,
P_q c on 2^-14 added to the gate's pre-activation. The steps against the integer oracle written from the docs
(Python integers), the whole layer against the float model within 1.02x onnxruntime's quantized model's distance
(which runs the layer in float, peepholes included), exported and run bit-exactly."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import support.recurrent as rec
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import numpy_helper as nh
from support.transformers import lstm_model

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx.context import Importer, Tensor
from cvm_onnx.converters.from_onnx.quantized.values import Scaled
from cvm_onnx.core.executor import execute
from cvm_onnx.core.graph import Graph
from cvm_onnx.core.validate import validate
from cvm_onnx.runtime.verify import verify


@settings(max_examples=10, deadline=None)
@given(steps=st.integers(1, 5), batch=st.integers(1, 2), size=st.integers(1, 4), hidden=st.integers(1, 3),
       reverse=st.booleans(), states=st.booleans(), e_w=st.integers(12, 22), e_r=st.integers(17, 24),
       e_p=st.integers(10, 20), seed=st.integers(0, 2**16))
def test_peephole_steps_equal_the_integer_form(steps, batch, size, hidden, reverse, states, e_w, e_r, e_p, seed):
    """``direction``'s unrolled steps with peepholes equal the integer oracle exactly, on int8 inputs at the
    extremes, for 16-bit weights at power-of-two scales, peepholes P_q 2^-(e_p - G) (one of them +-2^G, so the
    importer's scale is recovered: max|P| from 1/4 to 256 at G = 14), initial states zero or not (|c0| <= 3)."""
    from cvm_onnx.converters.from_onnx.quantized.recurrent import direction, lstm_bits

    rng = np.random.default_rng(seed)
    w16, r16 = rec.ints16(rng, (4 * hidden, size)), rec.ints16(rng, (4 * hidden, hidden))
    w = w16 * 2.0 ** (4 - e_w)  # s_x = 2^-4: s_x s_W = 2^-e_w
    r = r16 * 127 * 2.0 ** -e_r
    b = rng.normal(size=8 * hidden)
    h0 = rng.uniform(-1, 1, (batch, hidden)) if states else np.zeros((batch, hidden))
    c0 = rng.uniform(-3, 3, (batch, hidden)) if states else np.zeros((batch, hidden))
    g = lstm_bits(steps, float(np.abs(c0).max()))
    pq = rng.integers(-(1 << g), (1 << g) + 1, 3 * hidden)
    pq[rng.integers(0, pq.size)] = (1 << g) * rng.choice([-1, 1])
    p = pq * 2.0 ** -(e_p - 4)  # P at 2^-e, e = e_p - 4: |P| = 2^G 2^-e at most
    x = rng.integers(-128, 128, (steps, batch, size))
    x.flat[0], x.flat[-1] = -128, 127
    order = list(range(steps))[::-1] if reverse else list(range(steps))
    ctx = Importer()
    data = ctx.variable("data", (steps, batch, size), 9)
    xs = Scaled(Tensor(T.INT8, (steps, batch, size), -128, 127, data), np.asarray(Fraction(1, 16), object),
                np.zeros((), np.int64))
    ys, hn, cn = direction(ctx, xs, w, r, b, h0, c0, order, g, p)
    graph = validate(Graph(ctx.nodes, tuple(t.entry for t in [*ys, hn, cn]), ctx.params)).graph
    got = execute(graph, {"data": x.astype(np.int32)})
    wys, wh, wc = rec.lstm(x, w16, e_w, r16, e_r, b[:4 * hidden] + b[4 * hidden:], h0, c0, order, g, pq,
                           e_p - 4)
    for have, want in zip(got, [*wys, wh, wc]):
        assert np.array_equal(have.astype(np.int64), np.asarray(want, np.int64).reshape(have.shape))
    assert verify(graph, x.astype(np.int32)).exact


@pytest.mark.parametrize("way, states, scale", [("forward", False, 0.5), ("reverse", True, 1.0),
                                                ("bidirectional", False, 2.0)])
def test_an_lstm_with_peepholes_imports_whole_exact_and_as_close_to_float_as_onnxruntime(tmp_path, way, states,
                                                                                           scale):
    """Before: refused ("LSTM with peepholes has no CVM form here"). Unrolled, exported bit-exactly, its mean
    distance from the float model within 1.02x onnxruntime's quantized model's."""
    m = lstm_model(way, 0, states=states, peepholes=scale)
    onnx.checker.check_model(m)
    onnx.save(m, tmp_path / "f.onnx")
    rng = np.random.default_rng(1)
    np.save(tmp_path / "c.npy", rng.normal(size=(32, 12, 1, 8)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.02 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def test_zero_peepholes_give_the_model_without_them(tmp_path):
    """P of zeros (as exporters write an unused P) gives the CVM model of the LSTM without P, byte for byte."""
    rng = np.random.default_rng(2)
    np.save(tmp_path / "c.npy", rng.normal(size=(8, 12, 1, 8)).astype(np.float32))
    for name, scale in (("none", None), ("zeros", 0.0)):
        m = lstm_model("forward", 3)
        if scale is not None:  # P given, all zeros
            node = next(n for n in m.graph.node if n.op_type == "LSTM")
            m.graph.initializer.append(nh.from_array(np.zeros((1, 48), np.float32), "P"))
            node.input.extend(["", "", "", "P"])
        onnx.save(m, tmp_path / f"{name}.onnx")
        quantize(tmp_path / f"{name}.onnx", tmp_path / "c.npy", tmp_path / name)
    for f in ("symbol", "params"):
        assert (tmp_path / "none" / f).read_bytes() == (tmp_path / "zeros" / f).read_bytes()


@pytest.mark.parametrize("seed", [0, 1])
def test_a_cell_growing_each_step_stays_close_to_the_float_lstm(seed):
    """A forget gate near 1 and i g of either sign: c moves by up to 1 a step (madmom's beat trackers' cells reach 99
    in 100 steps), with peepholes, over 100 steps. The unrolled steps' Y is within 0.012 steps of 1/127 of the float
    LSTM (onnxruntime) on the same input on average. Failed before (G = 11 with f c and P_q c whole: 0.021-0.023;
    now 0.006-0.007)."""
    from cvm_onnx.converters.from_onnx.quantized.recurrent import direction, lstm_bits

    rng = np.random.default_rng(seed)
    steps, batch, size, hidden = 100, 2, 6, 8
    w, r = rng.normal(size=(4 * hidden, size)) / 2, rng.normal(size=(4 * hidden, hidden)) / 2
    b = np.concatenate([rng.normal(1, 1, hidden), rng.normal(0, 1, hidden), rng.normal(4, 1, hidden),
                        rng.normal(0, 2, hidden), np.zeros(4 * hidden)])
    p = rng.normal(size=3 * hidden) / 10
    x = rng.integers(-128, 128, (steps, batch, size))
    ctx = Importer()
    data = ctx.variable("data", (steps, batch, size), 9)
    xs = Scaled(Tensor(T.INT8, (steps, batch, size), -128, 127, data), np.asarray(Fraction(1, 64), object),
                np.zeros((), np.int64))
    g, zero = lstm_bits(steps, 0.0), np.zeros((batch, hidden))
    ys, _, _ = direction(ctx, xs, w, r, b, zero, zero, list(range(steps)), g, p)
    graph = validate(Graph(ctx.nodes, tuple(t.entry for t in ys), ctx.params)).graph
    got = np.stack(execute(graph, {"data": x.astype(np.int32)})).reshape(steps, batch, hidden) * 2.0 ** -g
    layer = onnx.helper.make_graph(
        [onnx.helper.make_node("LSTM", ["x", "W", "R", "B", "", "", "", "P"], ["y"], hidden_size=hidden)], "lstm",
        [onnx.helper.make_tensor_value_info("x", T.FLOAT, [steps, batch, size])],
        [onnx.helper.make_tensor_value_info("y", T.FLOAT, None)],
        [nh.from_array(v[None].astype(np.float32), n) for v, n in ((w, "W"), (r, "R"), (b, "B"), (p, "P"))])
    model = onnx.helper.make_model(layer, opset_imports=[onnx.helper.make_opsetid("", 14)], ir_version=8)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": (x / 64).astype(np.float32)})[0][:, 0]
    assert np.abs(got - want).mean() * 127 < 0.012


def test_an_initial_cell_past_2_to_the_20_is_refused_in_one_line():
    """G falls from 14 while 2^G (|c0| + steps + 1) reaches 2^28; below 8 (|c0| past about 2^20) the LSTM is
    refused, naming initial_c."""
    from cvm_onnx.converters.from_onnx.quantized.recurrent import lstm_bits
    from cvm_onnx.converters.from_onnx.registry import Refuse

    assert lstm_bits(100, 0.0) == 14 and lstm_bits(100, 2.0**14) == 13 and lstm_bits(100, 2.0**19) == 8
    with pytest.raises(Refuse, match="initial_c reaching 1.05e"):
        lstm_bits(100, 2.0**20)
