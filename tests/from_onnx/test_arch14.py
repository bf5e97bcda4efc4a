"""Graph forms of a third sweep of architectures as torch exports them (benchmarks/more_architectures.py), each in
its minimal ONNX form: torch's LSTM, GRU and RNN with their initial states inputs of the model (a streaming model's
state carried from its last call), quantized by QuantizeLinear like any activation; AveragePool of a 1-D image
(torch's AvgPool1d); a Where of a constant condition of one value (a masked_fill by a mask folded to ones)."""
from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import numpy as np
import onnx
import pytest
import support.recurrent as rec
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.quantized import Oracle, qdq
from support.transformers import lstm_model
from test_quantized_fresh_ops import NP, RANGE, draw_x, oracle_equal, run, scales, x_types

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx.context import Importer, Tensor
from cvm_onnx.converters.from_onnx.emit import strided_slice
from cvm_onnx.converters.from_onnx.quantized.values import Scaled
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.graph import Graph
from cvm_onnx.core.validate import validate
from cvm_onnx.runtime.verify import verify


def parts(ctx, shapes: list[tuple[int, ...]], ranges: list[tuple[int, int]]) -> list[Tensor]:
    """Tensors of the given shapes and integer ranges, each a slice of the CVM graph's one input "data" (their
    values flattened and joined in order)."""
    sizes = [int(np.prod(s)) for s in shapes]
    data = Tensor(T.INT32, (sum(sizes),), -128, 255, ctx.variable("data", (sum(sizes),), 9))
    ends = np.cumsum([0] + sizes)
    return [replace(ctx.reshape(strided_slice(ctx, data, [range(a, b)]), s), lo=lo, hi=hi)
            for a, b, s, (lo, hi) in zip(ends, ends[1:], shapes, ranges)]


def dequantized(t: Tensor, scale, zero) -> Scaled:
    return Scaled(t, np.asarray(Fraction(float(scale)), object), np.asarray(zero, np.int64))


@settings(max_examples=12, deadline=None)
@given(steps=st.integers(1, 4), batch=st.integers(1, 2), size=st.integers(1, 3), hidden=st.integers(1, 3),
       reverse=st.booleans(), zh=st.integers(0, 255), zc=st.integers(0, 255), sh=st.floats(0.3, 0.999),
       sc=st.floats(1e-3, 0.05), seed=st.integers(0, 2**16))
def test_carried_states_equal_the_integer_lstm(steps, batch, size, hidden, reverse, zh, zc, sh, sc, seed):
    """An LSTM's initial h and c as uint8 inputs (q - z) s: the unrolled steps equal the integer oracle of
    docs/import.md run from the constant states of the same values, h clipped to [-1, 1] (its grid reaches past 1
    by less than a step), c at 2^-G, G and c's split from the bound of c's grid (one sample at its extreme)."""
    from cvm_onnx.converters.from_onnx.quantized.recurrent import H_ONE, carried, direction, lstm_bits

    rng = np.random.default_rng(seed)
    w16, r16 = rec.ints16(rng, (4 * hidden, size)), rec.ints16(rng, (4 * hidden, hidden))
    e_w, e_r = 16, 20
    w, r, b = w16 * 2.0 ** (4 - e_w), r16 * 127 * 2.0 ** -e_r, rng.normal(size=8 * hidden)
    s_h = np.float32(sh / (max(zh, 255 - zh) - 1))  # the grid reaches 1 + s_h at most
    s_c = np.float32(sc)
    x = rng.integers(-128, 128, (steps, batch, size))
    qh, qc = rng.integers(0, 256, (1, batch, hidden)), rng.integers(0, 256, (1, batch, hidden))
    qh.flat[0], qc.flat[-1] = 255 * (zh < 128), 255 * (zc < 128)  # each at its grid's reach
    hv = np.clip((qh - zh) * np.float64(s_h), -1, 1)[0]
    cv = ((qc - zc) * np.float64(s_c))[0]
    g = lstm_bits(steps, float(np.abs(cv).max()))
    ctx = Importer()
    state = (1, batch, hidden)
    xt, ht, ct = parts(ctx, [(steps, batch, size), state, state], [(-128, 127), (0, 255), (0, 255)])
    [h0] = carried(ctx, dequantized(ht, s_h, zh), H_ONE, top=1)
    [c0] = carried(ctx, dequantized(ct, s_c, zc), 1 << g)
    xs = dequantized(xt, Fraction(1, 16), 0)
    order = list(range(steps))[::-1] if reverse else list(range(steps))
    ys, hn, cn = direction(ctx, xs, w, r, b, h0, c0, order, g)
    graph = validate(Graph(ctx.nodes, tuple(t.entry for t in [*ys, hn, cn]), ctx.params)).graph
    data = np.concatenate([x.ravel(), qh.ravel(), qc.ravel()]).astype(np.int32)
    got = execute(graph, {"data": data})
    wys, wh, wc = rec.lstm(x, w16, e_w, r16, e_r, b[:4 * hidden] + b[4 * hidden:], hv, cv, order, g)
    for have, want in zip(got, [*wys, wh, wc]):
        assert np.array_equal(have.astype(np.int64), np.asarray(want, np.int64).reshape(have.shape))
    assert verify(graph, data).exact


def carrying(op: str, way: str, seed: int) -> onnx.ModelProto:
    """``lstm_model`` with the layer's initial states inputs of the model (h0, and c0 for an LSTM), as torch exports
    an LSTM, GRU or RNN called with its states."""
    m = lstm_model(way, seed, states=True, op=op)
    dirs = 2 if way == "bidirectional" else 1
    states = ["h0", "c0"] if op == "LSTM" else ["h0"]
    kept = [t for t in m.graph.initializer if t.name not in states]
    del m.graph.initializer[:]
    m.graph.initializer.extend(kept)
    m.graph.input.extend(h.make_tensor_value_info(s, T.FLOAT, [dirs, 1, 16]) for s in states)
    return m


def states(op: str, way: str, n: int, seed: int) -> dict[str, np.ndarray]:
    """n samples: x N(0, 1), h a layer's output (tanh of N(0, 1)), c N(0, 1)."""
    rng = np.random.default_rng(seed)
    dirs = 2 if way == "bidirectional" else 1
    got = {"x": rng.normal(size=(n, 12, 1, 8)), "h0": np.tanh(rng.normal(size=(n, dirs, 1, 16)))}
    if op == "LSTM":
        got["c0"] = rng.normal(size=(n, dirs, 1, 16))
    return {k: v.astype(np.float32) for k, v in got.items()}


@pytest.mark.parametrize("op, way", [("LSTM", "bidirectional"), ("GRU", "reverse"),
                                     ("RNN", "forward")])
def test_a_layer_carrying_its_states_imports_whole_exact_and_as_close_to_float_as_onnxruntime(tmp_path, op, way):
    """torch's LSTM / GRU / RNN called with its states (h0, c0 inputs): whole, its mean distance from the float
    model within 1.1x onnxruntime's quantized model's, exported bit-exactly. Regression: refused 'the LSTM
    initial_h must be a constant'."""
    onnx.save(carrying(op, way, 0), tmp_path / "f.onnx")
    np.savez(tmp_path / "c.npz", **states(op, way, 16, 1))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npz", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def test_a_state_grid_past_one_is_refused_in_one_line(tmp_path):
    """A carried h calibrated past [-1, 1] (no layer writes such an h): refused in one line naming the node and
    the rule, not clipped."""
    onnx.save(carrying("GRU", "forward", 0), tmp_path / "f.onnx")
    cal = states("GRU", "forward", 8, 1)
    cal["h0"] *= 3
    np.savez(tmp_path / "c.npz", **cal)
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npz", tmp_path / "m")
    [problem] = e.value.problems
    assert "GRU initial_h on a grid reaching" in problem.rule and "within [-1, 1]" in problem.rule


@settings(max_examples=15, deadline=None)
@given(d=st.data(), x_type=x_types, s=scales, so=scales, zo=st.integers(-128, 127))
def test_a_1d_average_pool_is_the_2d_pool_over_one_row(d, x_type, s, so, zo):
    """AveragePool of a 1-D image (torch's AvgPool1d: SEW's squeeze of its frames) over random lengths, kernels,
    strides, pads, ceil_mode and count_include_pad: its outputs equal the exact oracle's of the 2-D pool over (1, L)
    by the kernel (1, k) on the same integers. Regression: refused 'AveragePool of a 1-D image: only 2-D here'."""
    size, k = d.draw(st.integers(1, 9)), d.draw(st.integers(1, 4))
    stride, ceil, counted = d.draw(st.integers(1, 3)), d.draw(st.integers(0, 1)), d.draw(st.integers(0, 1))
    pads = [d.draw(st.integers(0, k - 1)), d.draw(st.integers(0, k - 1))]
    assume(k <= size + sum(pads) and not (ceil and ((size + sum(pads) - k + stride - 1) // stride) * stride - pads[0]
                                          >= size))
    lo, hi = RANGE[x_type]
    z = NP[x_type](d.draw(st.integers(lo, hi)))

    def model(two: bool) -> onnx.ModelProto:
        attrs = dict(kernel_shape=[1, k] if two else [k], strides=[1, stride] if two else [stride], ceil_mode=ceil,
                     count_include_pad=counted, pads=[0, pads[0], 0, pads[1]] if two else pads)
        nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
                 h.make_node("AveragePool", ["xf"], ["p"], **attrs),
                 h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
        shape = (1, 3, 1, size) if two else (1, 3, size)
        return qdq(nodes, shape, x_type, {"s": np.float32(s), "z": z, "so": np.float32(so), "zo": np.int8(zo)},
                   T.INT8, opset=19)
    x = draw_x(d, (1, 3, size), x_type)
    x.reshape(-1)[:2] = lo, hi
    _, [got] = run(model(False), x)
    imp, _ = run(model(True), x[:, :, None])
    [want] = Oracle(model(True), imp).run(x[:, :, None].astype(np.int64))
    assert np.array_equal(got, np.asarray(want[1]).reshape(got.shape))


def test_a_1d_average_pool_between_convs_quantizes_whole(tmp_path):
    """Conv1d, AvgPool1d (kernel 2, SEW's squeeze), Conv1d: whole through quantize, within 1.1x onnxruntime's
    distance from the float model, exported bit-exactly."""
    rng = np.random.default_rng(0)
    nodes = [h.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3], pads=[1, 1]),
             h.make_node("AveragePool", ["a"], ["p"], kernel_shape=[2], strides=[2]),
             h.make_node("Conv", ["p", "w2"], ["y"], kernel_shape=[3], pads=[1, 1])]
    g = h.make_graph(nodes, "pool1d", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 32])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 16])],
                     [onnx.numpy_helper.from_array(rng.normal(size=(8, 4, 3)).astype(np.float32), "w1"),
                      onnx.numpy_helper.from_array(rng.normal(size=(4, 8, 3)).astype(np.float32), "w2")])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 1, 4, 32)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


@settings(max_examples=10, deadline=None)
@given(d=st.data(), x_type=x_types, s=scales, so=scales, zo=st.integers(-128, 127), first=st.booleans(),
       fill=st.sampled_from([-3.4028234663852886e38, -1e4, 0.3]))
def test_a_where_of_a_constant_condition_is_the_branch_it_selects(d, x_type, s, so, zo, first, fill):
    """Where(cond, x, c) (or Where(not cond, c, x)) of a constant condition of one value selecting x everywhere,
    broadcast from (1, 1, 1, 1) or of the scores' shape (LayoutLMv3's masked_fill of its scores by a mask folded to
    ones, against float32's minimum, a constant off x's grid): the import equals that of the model without the Where
    (x requantized), which equals the exact oracle. Regression: refused 'Where of a constant branch off the other
    branch's grid has no exact CVM form here'."""
    shape = (1, 2, 3, 3)
    lo, hi = RANGE[x_type]
    inits = {"s": np.float32(s), "z": NP[x_type](d.draw(st.integers(lo, hi))), "so": np.float32(so),
             "zo": np.int8(zo), "cond": np.full(d.draw(st.sampled_from([(1, 1, 1, 1), shape])), first),
             "c": np.float32(fill)}
    dq = h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"])
    where = [dq, h.make_node("Where", ["cond", "xf", "c"] if first else ["cond", "c", "xf"], ["w"]),
             h.make_node("QuantizeLinear", ["w", "so", "zo"], ["y"])]
    plain = qdq([dq, h.make_node("QuantizeLinear", ["xf", "so", "zo"], ["y"])], shape, x_type, inits, T.INT8)
    x = draw_x(d, shape, x_type)
    _, [got] = run(qdq(where, shape, x_type, inits, T.INT8), x)
    _, [want] = run(plain, x)
    assert np.array_equal(got, want)
    oracle_equal(plain, x)


@settings(max_examples=40, deadline=None)
@given(d=st.data(), rank=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_a_scatter_elements_of_constant_indices_is_a_gather(d, rank, seed):
    """ScatterElements (reduction none) of constant indices, each position written once, negative indices too
    (dynamo's select_scatter: RecurrentGemma's state written in place): replaced by Concat and Gather
    (``scatters_as_gathers``), equal to onnx's reference ScatterElements on float data. Regression: left, then
    refused 'no CVM op for ONNX ScatterElements'."""
    from onnx import numpy_helper as nh
    from onnx.reference import ReferenceEvaluator

    from cvm_onnx.app.rewrites import scatters_as_gathers

    shape = [d.draw(st.integers(1, 4)) for _ in range(rank)]
    axis = d.draw(st.integers(-rank, rank - 1))
    rng = np.random.default_rng(seed)
    at = [d.draw(st.integers(1, n)) for n in shape]  # the indices' shape: within the data's
    at[axis] = d.draw(st.integers(1, shape[axis]))
    lines = np.moveaxis(np.zeros(at, np.int64), axis, -1)
    for k in np.ndindex(lines.shape[:-1]):  # distinct positions on the axis along each line
        lines[k] = rng.permutation(shape[axis])[:at[axis]] - shape[axis] * rng.integers(0, 2, at[axis])
    idx = np.moveaxis(lines, -1, axis)
    node = h.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], axis=axis)
    g = h.make_graph([node], "g", [h.make_tensor_value_info("data", T.FLOAT, shape),
                                   h.make_tensor_value_info("upd", T.FLOAT, list(idx.shape))],
                     [h.make_tensor_value_info("y", T.FLOAT, shape)], [nh.from_array(idx, "idx")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 16)], ir_version=8)
    feed = {"data": rng.normal(size=shape).astype(np.float32), "upd": rng.normal(size=idx.shape).astype(np.float32)}
    [want] = ReferenceEvaluator(m).run(None, feed)
    assert scatters_as_gathers(m) == 1 and "ScatterElements" not in {n.op_type for n in m.graph.node}
    [got] = ReferenceEvaluator(m).run(None, feed)
    assert np.array_equal(got, want)
