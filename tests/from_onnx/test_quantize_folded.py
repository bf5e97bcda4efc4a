"""`quantize --fold` on models shaped as real recurrent and text models ship (silero-vad, a sentence encoder):
inputs of undeclared dims folded (a state's batch 1, a mask's sequence length from the samples), Ifs nested in
the branches they inline, Ifs that the input's shape decides once it is fixed, repeated --fold options; each model
imports whole, exports exactly and is as close to the float model as onnxruntime's quantized model (1.1x)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from cvm_onnx.app.cli import main
from cvm_onnx.app.control_flow import fold_constant_ifs, fold_constants
from cvm_onnx.app.quantize import folded_inputs, quantize
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify


def consts(rng, **shapes) -> list[onnx.TensorProto]:
    return [nh.from_array((rng.normal(size=s) / 2).astype(np.float32), k) for k, s in shapes.items()]


def ints(**values) -> list[onnx.TensorProto]:
    return [nh.from_array(np.asarray(v, np.int64), k) for k, v in values.items()]


def nested_vad() -> onnx.ModelProto:
    """silero-vad's structure: inputs x (?, ?), state (2, ?, 6) and sr; If sr == 16000 (outer), whose branch
    computes a = x @ w0 and holds an If on a's batch size (inner, read as silero's decoder reads its encoder's
    shape) whose branches read ``a``, a tensor of the outer branch; then the state's first slice is added."""
    rng = np.random.default_rng(5)
    inner_then = h.make_graph([h.make_node("Relu", ["a"], ["r"])], "inner_then", [],
                              [h.make_tensor_value_info("r", T.FLOAT, None)])
    inner_else = h.make_graph([h.make_node("Neg", ["a"], ["n"])], "inner_else", [],
                              [h.make_tensor_value_info("n", T.FLOAT, None)])
    then = h.make_graph([
        h.make_node("MatMul", ["x", "w0"], ["a"]),
        h.make_node("Shape", ["a"], ["sa"]), h.make_node("Gather", ["sa", "i0"], ["batch"]),
        h.make_node("Equal", ["batch", "i1"], ["one"]),
        h.make_node("If", ["one"], ["b"], then_branch=inner_then, else_branch=inner_else, name="by_batch"),
        h.make_node("Slice", ["state", "i0", "i1", "i0"], ["h0"]),
        h.make_node("Reshape", ["h0", "row"], ["h1"]),
        h.make_node("MatMul", ["b", "w1"], ["c"]), h.make_node("Add", ["c", "h1"], ["yt"])], "then", [],
        [h.make_tensor_value_info("yt", T.FLOAT, None)])
    other = h.make_graph([h.make_node("MatMul", ["x", "w2"], ["ye"])], "else", [],
                         [h.make_tensor_value_info("ye", T.FLOAT, None)])
    nodes = [h.make_node("Equal", ["sr", "rate"], ["is16k"]),
             h.make_node("If", ["is16k"], ["y"], then_branch=then, else_branch=other, name="by_rate")]
    g = h.make_graph(nodes, "vad", [h.make_tensor_value_info("x", T.FLOAT, ["", ""]),
                                    h.make_tensor_value_info("state", T.FLOAT, [2, "", 6]),
                                    h.make_tensor_value_info("sr", T.INT64, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)],
                     consts(rng, w0=(4, 4), w1=(4, 6), w2=(4, 6)) + ints(rate=16000, i0=[0], i1=[1], row=[1, 6]))
    return onnx_model(g, 17)


def test_a_nested_vad_with_an_undeclared_state_dim_imports_whole(tmp_path):
    """The state (2, ?, 6) folded as zeros of (2, 1, 6); the If on sr inlined, then the If on the batch size of a
    tensor its branch computes (known once the input is fixed to one sample), its branches reading the outer
    branch's tensor under its new name. Imports whole, exactly, within 1.1x onnxruntime's distance. Regression:
    refused ("its shape is not declared in full"); with the state declared, refused for the If left."""
    onnx.save(nested_vad(), tmp_path / "vad.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(12, 1, 4)).astype(np.float32))
    done = quantize(tmp_path / "vad.onnx", tmp_path / "c.npy", tmp_path / "m", fold={"state": None, "sr": 16000})
    assert not [n for n in done.float_model.graph.node if n.op_type == "If"]
    assert any(n.op_type == "Relu" for n in done.float_model.graph.node)  # batch 1: the inner If's then branch
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def test_an_inlined_branch_keeps_its_nested_if_reading_its_tensors():
    """An If that constants decide, whose branch holds an If they do not decide (on an input): inlined, the inner
    If's branches read the outer branch's tensor by its new name, and the model computes what it computed before.
    Regression: they kept the old name (onnxruntime refused the model: a tensor no node writes)."""
    m = nested_vad()
    g = m.graph
    cond = h.make_tensor_value_info("flag", T.BOOL, [])
    g.input.append(cond)
    by_rate = next(n for n in g.node if n.op_type == "If")
    then = next(a.g for a in by_rate.attribute if a.name == "then_branch")
    inner = next(n for n in then.node if n.op_type == "If")
    inner.input[0] = "flag"
    folded = folded_inputs(m, {"sr": 16000.0})
    assert [n.op_type for n in folded.graph.node].count("If") == 1
    rng = np.random.default_rng(1)
    feed = {"x": rng.normal(size=(1, 4)).astype(np.float32), "state": rng.normal(size=(2, 1, 6)).astype(np.float32)}
    for flag in (True, False):
        want = ort.InferenceSession(m.SerializeToString()).run(None, {**feed, "sr": np.array(16000), "flag":
                                                                       np.array(flag)})
        got = ort.InferenceSession(folded.SerializeToString()).run(None, {**feed, "flag": np.array(flag)})
        assert np.array_equal(want[0], got[0])


def test_constants_and_static_shapes_are_folded_random_draws_and_huge_constants_stay():
    """fold_constants: Shape of a tensor of known shape, and a chain of constants, become initializers of their
    values; a node reading the input, a random draw and a constant of 2^25 elements (not computed) stay."""
    g = h.make_graph([h.make_node("Relu", ["x"], ["r"]), h.make_node("Shape", ["r"], ["s"]),
                      h.make_node("Mul", ["s", "two"], ["s2"]), h.make_node("RandomNormal", [], ["z"], shape=[2]),
                      h.make_node("Cast", ["s2"], ["f"], to=T.FLOAT), h.make_node("Add", ["f", "z"], ["y"]),
                      h.make_node("ConstantOfShape", ["huge"], ["big"])], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [3, 5])], [h.make_tensor_value_info("y", T.FLOAT, None),
                                                                        h.make_tensor_value_info("big", T.FLOAT, None)],
                     ints(two=[2], huge=[1 << 25]))
    m = onnx_model(g, 17)
    assert fold_constants(m) == 3
    assert [n.op_type for n in m.graph.node] == ["Relu", "RandomNormal", "Add", "ConstantOfShape"]
    assert np.array_equal(nh.to_array(next(t for t in m.graph.initializer if t.name == "f")), [6.0, 10.0])


def dequantized_weights(rng, uses: list[str], d: int) -> onnx.ModelProto:
    """y = sum over weights i of x @ w_i, w_i an int8 initializer dequantized as torch's exports spell it (Cast,
    Mul by a scale, a Transpose where i is odd), each weight's ``uses[i]`` besides: "" (none), "live" (its Cast
    read by a MatMul of the input too), "output" (its scaled value a graph output), "branch" (read in an If's
    branches), "input" (the int8 tensor also a graph input)."""
    nodes, inits, outs, ins = [], [], [h.make_tensor_value_info("y", T.FLOAT, None)], []
    for i, use in enumerate(uses):
        q = rng.integers(-128, 128, (d, d)).astype(np.int8)
        q.flat[:2] = -128, 127
        inits += [nh.from_array(q, f"q{i}"), nh.from_array(np.float32(rng.uniform(1e-3, 2)), f"s{i}")]
        nodes += [h.make_node("Cast", [f"q{i}"], [f"c{i}"], to=T.FLOAT),
                  h.make_node("Mul", [f"c{i}", f"s{i}"], [f"m{i}"])]
        w = f"m{i}"
        if i % 2:
            nodes.append(h.make_node("Transpose", [w], [f"t{i}"], perm=[1, 0]))
            w = f"t{i}"
        if use == "live":
            nodes += [h.make_node("MatMul", ["x", w], [f"a{i}"]), h.make_node("MatMul", ["x", f"c{i}"], [f"l{i}"]),
                      h.make_node("Add", [f"a{i}", f"l{i}"], [f"p{i}"])]
        else:
            nodes.append(h.make_node("MatMul", ["x", w], [f"p{i}"]))
        if use == "output":
            outs.append(h.make_tensor_value_info(f"m{i}", T.FLOAT, None))
        elif use == "branch":
            branch = [h.make_graph([h.make_node(op, [f"m{i}"], [f"{op}{i}"])], op, [],
                                   [h.make_tensor_value_info(f"{op}{i}", T.FLOAT, None)]) for op in ("Relu", "Neg")]
            nodes.append(h.make_node("If", ["flag"], [f"b{i}"], then_branch=branch[0], else_branch=branch[1]))
            outs.append(h.make_tensor_value_info(f"b{i}", T.FLOAT, None))
            ins.append(h.make_tensor_value_info("flag", T.BOOL, []))
        elif use == "input":
            ins.append(h.make_tensor_value_info(f"q{i}", T.INT8, [d, d]))
    nodes.append(h.make_node("Sum", [f"p{i}" for i in range(len(uses))], ["y"]))
    ins = [h.make_tensor_value_info("x", T.FLOAT, [2, d])] + list({v.name: v for v in ins}.values())
    return onnx_model(h.make_graph(nodes, "dequantized", ins, outs, inits), 17)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["", "live", "output", "branch", "input"]), min_size=1, max_size=4),
       st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_folded_weights_compute_the_same_and_no_constant_is_left_that_nothing_reads(uses, d, seed):
    """fold_constants of dequantized int8 weights: the model computes what it computed (onnx's reference
    evaluator, exactly; an initializer that is also a graph input fed its own value), every chain folded, and each
    initializer left is read by a node or a branch, or is a graph input or output. Regression: the int8 weights
    and their Casts were kept as unread initializers."""
    rng = np.random.default_rng(seed)
    m = dequantized_weights(rng, uses, d)
    feeds = {"x": rng.normal(size=(2, d)).astype(np.float32), "flag": np.array(bool(seed % 2))}
    feeds.update({v.name: nh.to_array(next(t for t in m.graph.initializer if t.name == v.name))
                  for v in m.graph.input if v.name.startswith("q")})
    names = [v.name for v in m.graph.input]
    want = ReferenceEvaluator(m).run(None, {k: v for k, v in feeds.items() if k in names})
    assert fold_constants(m) > 0
    got = ReferenceEvaluator(m).run(None, {k: v for k, v in feeds.items() if k in names})
    assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))
    assert {n.op_type for n in m.graph.node} <= {"MatMul", "Add", "Sum", "If"}
    read = {x for n in m.graph.node for x in n.input} | {v.name for v in [*m.graph.input, *m.graph.output]}
    read |= {x for n in m.graph.node for a in n.attribute for g in [a.g] if a.HasField("g") for x in
             (y for k in g.node for y in k.input)}
    assert [t.name for t in m.graph.initializer if t.name not in read] == []


def sentence_encoder(vocab: int = 40) -> onnx.ModelProto:
    """A sentence encoder as sentence-transformers exports it: input_ids and attention_mask (batch, sequence),
    token embeddings (Gather), mean pooling under the mask (Mul, ReduceSum, Clip, Div), a dense head."""
    rng = np.random.default_rng(2)
    nodes = [h.make_node("Gather", ["emb", "input_ids"], ["e"]),
             h.make_node("Unsqueeze", ["attention_mask", "last"], ["m1"]),
             h.make_node("Cast", ["m1"], ["m2"], to=T.FLOAT), h.make_node("Shape", ["e"], ["se"]),
             h.make_node("Expand", ["m2", "se"], ["mm"]), h.make_node("Mul", ["e", "mm"], ["em"]),
             h.make_node("ReduceSum", ["em", "one"], ["num"], keepdims=0),
             h.make_node("ReduceSum", ["mm", "one"], ["cnt"], keepdims=0),
             h.make_node("Clip", ["cnt", "tiny"], ["den"]), h.make_node("Div", ["num", "den"], ["pooled"]),
             h.make_node("MatMul", ["pooled", "w"], ["y"])]
    g = h.make_graph(nodes, "encoder", [h.make_tensor_value_info("input_ids", T.INT64, ["batch", "sequence"]),
                                        h.make_tensor_value_info("attention_mask", T.INT64, ["batch", "sequence"])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)],
                     consts(rng, emb=(vocab, 8), w=(8, 4)) + ints(last=[-1], one=[1])
                     + [nh.from_array(np.float32(1e-9), "tiny")])
    return onnx_model(g, 17)


def test_a_sentence_encoder_with_its_mask_folded_imports_whole(tmp_path):
    """`--fold attention_mask=1`: the mask ones of (1, L), L the samples' sequence length (the dims it shares by
    name with input_ids), so the pooling divides by L; token ids read as integers, negative ones wrapped as ONNX
    does; the Mul by the mask's ones and the Div by the count (a constant of one value) scale exactly. Imports whole,
    exactly, within 1.1x onnxruntime's distance. Regression: refused (the mask's dims undeclared; then the Gather's
    indices "may lie outside", the Div's divisor not a scalar)."""
    onnx.save(sentence_encoder(), tmp_path / "enc.onnx")
    ids = np.random.default_rng(0).integers(0, 40, (10, 7)).astype(np.int64)
    np.save(tmp_path / "c.npy", ids)
    done = quantize(tmp_path / "enc.onnx", tmp_path / "c.npy", tmp_path / "m", fold={"attention_mask": 1.0})
    folded = {t.name: nh.to_array(t) for t in done.float_model.graph.initializer}
    assert folded["mm"].shape == (1, 7, 8) and np.all(folded["mm"] == 1)  # the mask (1, 7) expanded, folded
    assert np.array_equal(folded["den"], np.full((1, 8), 7, np.float32))
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=2).exact


def test_repeated_fold_options_all_apply(tmp_path):
    """`--fold state --fold sr=16000` folds both, as `--fold state sr=16000` does. Regression: the second option
    replaced the first (the state stayed an input: refused for two inputs)."""
    onnx.save(nested_vad(), tmp_path / "vad.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(6, 1, 4)).astype(np.float32))
    for k, args in enumerate((["--fold", "state", "--fold", "sr=16000"], ["--fold", "state", "sr=16000"])):
        assert main(["quantize", str(tmp_path / "vad.onnx"), "--calibration", str(tmp_path / "c.npy"), "-o",
                     str(tmp_path / f"m{k}"), *args]) == 0


def test_folding_an_input_without_a_shape_is_refused_naming_it():
    g = h.make_graph([h.make_node("Add", ["x", "s"], ["y"])], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [2]), h.make_tensor_value_info("s", T.FLOAT, None)],
                     [h.make_tensor_value_info("y", T.FLOAT, None)])
    with pytest.raises(UnsupportedError, match="--fold s: it declares no shape"):
        folded_inputs(onnx_model(g, 17), {"s": None})


def test_fold_constant_ifs_leaves_an_if_on_an_input():
    m = nested_vad()
    fold_constant_ifs(m)
    assert [n.op_type for n in m.graph.node].count("If") == 1


def test_a_refusal_for_ifs_names_fold(tmp_path):
    """Without --fold, silero's shape (its Ifs on the sample rate, an input) is refused in one line naming its Ifs
    and --fold."""
    onnx.save(nested_vad(), tmp_path / "vad.onnx")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "c.npz", x=rng.normal(size=(2, 1, 4)).astype(np.float32),
             state=np.zeros((2, 2, 1, 6), np.float32), sr=np.full(2, 16000, np.int64))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "vad.onnx", tmp_path / "c.npz", tmp_path / "m")
    text = str(e.value)
    assert len(text.splitlines()) == 1 and "If x2" in text and "--fold" in text


def test_an_if_on_the_input_shape_is_folded_without_fold(tmp_path):
    """One input, an If on its batch size (as exporters write a squeeze of a batch of one): the input's shape fixed
    to a sample's decides it, so quantize imports the model whole without --fold. Regression: refused (control
    flow)."""
    rng = np.random.default_rng(4)
    then = h.make_graph([h.make_node("Squeeze", ["a", "i0"], ["s"]), h.make_node("Unsqueeze", ["s", "i0"], ["t"])],
                        "then", [], [h.make_tensor_value_info("t", T.FLOAT, None)])
    other = h.make_graph([h.make_node("Neg", ["a"], ["e"])], "else", [], [h.make_tensor_value_info("e", T.FLOAT, None)])
    nodes = [h.make_node("MatMul", ["x", "w0"], ["a"]), h.make_node("Shape", ["a"], ["sa"]),
             h.make_node("Gather", ["sa", "i0"], ["batch"]), h.make_node("Equal", ["batch", "i1"], ["one"]),
             h.make_node("If", ["one"], ["b"], then_branch=then, else_branch=other),
             h.make_node("MatMul", ["b", "w1"], ["y"])]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, ["batch", 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)],
                     consts(rng, w0=(4, 4), w1=(4, 3)) + ints(i0=[0], i1=[1]))
    onnx.save(onnx_model(g, 17), tmp_path / "m.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(8, 4)).astype(np.float32))
    done = quantize(tmp_path / "m.onnx", tmp_path / "c.npy", tmp_path / "q")
    assert not [n for n in done.float_model.graph.node if n.op_type in ("If", "Neg")]
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact

