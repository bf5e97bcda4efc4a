"""What a seventh corpus of speech and audio models shipped in wheels met in quantize: a pitch model whose float
decoding tail masks logits with a -inf constant (refused for that constant even when `--outputs` cuts the tail
off), and a static QDQ model (QuantizeLinear of activations, a turn detector shipped int8) given to quantize (36
lines about scales quantize_static 'would wait for forever' instead of one saying it is quantized already), and
per channel, a DFT written out as MatMul(constant cosine matrix, frames), whose constant quantize_static quantized
per channel along the sum's axis; torch's attention export's Where(IsNaN(softmax), 0, softmax) (all-MiniLM-L6-v2)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import Oracle, qdq

from cvm_onnx.app.quantize import non_finite, quantize
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify


def masked_tail(bad: float, rng: np.random.Generator) -> onnx.ModelProto:
    """MatMul -> Relu ('logits'), then a float decoding tail: Where(a constant mask, logits, ``bad``) -> ArgMax, as
    swift-f0's pitch decoding masks the bins outside [fmin, fmax] with -inf."""
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Relu", ["m"], ["logits"]),
             h.make_node("Where", ["mask", "logits", "fill"], ["masked"]),
             h.make_node("ArgMax", ["masked"], ["best"], axis=1, keepdims=0)]
    g = h.make_graph(nodes, "tail", [h.make_tensor_value_info("x", T.FLOAT, [1, 16])],
                     [h.make_tensor_value_info("best", T.INT64, None)],
                     [nh.from_array(rng.normal(size=(16, 8)).astype(np.float32), "w"),
                      nh.from_array(np.arange(8)[None] % 3 != 0, "mask"),
                      nh.from_array(np.array(bad, np.float32), "fill")])
    return onnx_model(g, 13)


@pytest.mark.parametrize("bad", [-np.inf, np.inf, np.nan])
def test_a_non_finite_constant_in_a_cut_tail_is_not_refused(tmp_path, bad):
    """The non-finite constant counts only where the part quantized reads it: with the tail cut off (`--outputs`
    logits) the model imports and exports back exactly; without the cut it is still refused, naming the constant.
    Regression: the cut model was refused for it."""
    tmp = tmp_path
    rng = np.random.default_rng(0)
    m = masked_tail(bad, rng)
    onnx.save(m, tmp / "f.onnx")
    samples = rng.normal(size=(8, 16)).astype(np.float32)
    np.save(tmp / "c.npy", samples)
    done = quantize(tmp / "f.onnx", tmp / "c.npy", tmp / "out", outputs=["logits"])
    assert [a.name for a in done.agreements] == ["logits"]
    assert verify(done.imported.graph, None, seeds=2).exact
    assert "'fill' holds" in non_finite(m)
    assert non_finite(m, ["logits"]) is None
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp / "f.onnx", tmp / "c.npy", tmp / "whole")
    [p] = e.value.problems
    assert "the initializer 'fill' holds" in p.rule and "finite weights only (read by masked (Where): --outputs " \
        "cuts a float tail off before them)" in p.rule, p.rule


def test_a_non_finite_constant_read_in_an_if_branch_counts():
    """A constant read only inside a branch of an If the outputs are computed from is read by the part quantized."""
    branch = lambda v: h.make_graph([h.make_node("Add", ["x", v], ["r"])], "b", [],  # noqa: E731
                                    [h.make_tensor_value_info("r", T.FLOAT, None)])
    g = h.make_graph([h.make_node("If", ["c"], ["y"], then_branch=branch("bad"), else_branch=branch("ok"))], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 2])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(np.array(True), "c"), nh.from_array(np.full((1, 2), np.inf, np.float32), "bad"),
                      nh.from_array(np.zeros((1, 2), np.float32), "ok")])
    assert "'bad' holds inf" in non_finite(onnx_model(g, 13))


def test_a_static_qdq_model_given_to_quantize_is_refused_in_one_line(tmp_path):
    """A model onnxruntime's quantize_static wrote in the QDQ form (QuantizeLinear of activations, as pipecat's
    smart-turn v3.2 ships) given to quantize: one line saying it is quantized already and naming convert, exit 4.
    Regression: quantize_static ran on it and the import listed a line per scale it 'would wait for forever'. A
    float model whose weights alone are DequantizeLinear of integers is still quantized (test_quantize_dynamic)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    rng = np.random.default_rng(0)
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Relu", ["m"], ["r"]),
                      h.make_node("MatMul", ["r", "w2"], ["y"])], "s",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 16])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(rng.normal(size=(16, 16)).astype(np.float32), "w"),
                      nh.from_array(rng.normal(size=(16, 4)).astype(np.float32), "w2")])
    onnx.save(onnx_model(g, 13), tmp_path / "f.onnx")
    samples = rng.normal(size=(8, 16)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.left = [{"x": s[None]} for s in samples]

        def get_next(self):
            return self.left.pop() if self.left else None

    quantize_static(tmp_path / "f.onnx", tmp_path / "q.onnx", Reader(), quant_format=QuantFormat.QDQ)
    np.save(tmp_path / "c.npy", samples)
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "q.onnx", tmp_path / "c.npy", tmp_path / "out")
    [p] = e.value.problems
    assert "the model has no CVM form: it is quantized already (QuantizeLinear x3 of computed tensors): " \
           "quantize takes a float model (convert reads quantized ones)" in p.rule, p.rule
    assert e.value.exit_code == 4
    assert not (tmp_path / "out").exists()


@settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(m=st.integers(1, 9), k=st.integers(1, 24), n=st.integers(1, 9), seed=st.integers(0, 2**16),
       scale=st.sampled_from([1e-3, 1.0, 50.0]))
def test_a_constant_first_matmul_operand_is_per_tensor_per_channel(tmp_path_factory, m, k, n, seed, scale):
    """MatMul(W, x) with W constant and x computed (swift-f0's DFT written out: the cosine matrix times the frames)
    quantized per channel: W is quantized per tensor (per channel along its axis 1, K, the sum had no integer form)
    and the import equals the oracle (W x on the integers, the output's requantization by its plan), at the
    input's extremes too, and exports exactly. Regression: 'MatMul needs a per-tensor scale and zero point'."""
    tmp = tmp_path_factory.mktemp("wx")
    rng = np.random.default_rng(seed)
    w = (rng.normal(size=(m, k)) * rng.uniform(0.1, 10, (1, k)) * scale).astype(np.float32)
    g = h.make_graph([h.make_node("MatMul", ["w", "x"], ["y"])], "wx",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, k, n])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(w, "w")])
    onnx.save(onnx_model(g, 13), tmp / "f.onnx")
    np.save(tmp / "c.npy", rng.normal(size=(8, k, n)).astype(np.float32))
    done = quantize(tmp / "f.onnx", tmp / "c.npy", tmp / "out", per_channel=True, save_onnx=tmp / "q.onnx")
    q = onnx.load(tmp / "q.onnx")
    [dq] = [d for d in q.graph.node if d.op_type == "DequantizeLinear" and d.input[0].startswith("w")]
    assert next(t for t in q.graph.initializer if t.name == dq.input[1]).dims == []
    imp = done.imported
    zy = int(nh.to_array(next(t for t in q.graph.initializer if t.name == "y_zero_point")))
    for x in (np.zeros((1, k, n)), np.full((1, k, n), 255), rng.integers(0, 256, (1, k, n))):
        [got] = execute(imp.graph, {"data": x.astype(np.int32)})
        [(_, want, *_)] = Oracle(q, imp).run(x.astype(np.int64))  # the output dequantized: its integers less zy
        assert np.array_equal(got.astype(np.int64) - zy, np.asarray(want).reshape(got.shape))
    assert verify(imp.graph, None, seeds=2).exact
    quantize(tmp / "f.onnx", tmp / "c.npy", tmp / "qop", per_channel=True, form="qoperator")  # as it was: imports


@settings(max_examples=25, deadline=None)
@given(op=st.sampled_from(["IsNaN", "IsInf"]), taken=st.booleans(), x_type=st.sampled_from([T.UINT8, T.INT8]),
       shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), zero=st.integers(-128, 255),
       scale=st.floats(2.0**-20, 2.0**10, width=32), seed=st.integers(0, 2**16))
def test_is_nan_and_is_inf_of_a_dequantized_value_are_false(op, taken, x_type, shape, zero, scale, seed):
    """IsNaN / IsInf of a dequantized value, deciding Where(test, 0, x) as torch's attention export writes it
    (all-MiniLM-L6-v2's Where(IsNaN(softmax), 0, softmax)): never true, so the output is x's integers (test, 0, x)
    or the grid's 0, z (test, x, 0), requantized on x's own grid: equal to that oracle on every input integer, the
    extremes included, and the export exact. Regression: 'no CVM op for ONNX IsNaN'."""
    lo, hi = (0, 255) if x_type == T.UINT8 else (-128, 127)
    z = min(max(zero, lo), hi)
    np_type = np.uint8 if x_type == T.UINT8 else np.int8
    inits = {"s": np.float32(scale), "z": np_type(z), "zero": np.float32(0)}
    branches = ["xf", "zero"] if taken else ["zero", "xf"]
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node(op, ["xf"], ["t"]),
             h.make_node("Where", ["t", *branches], ["w"]), h.make_node("QuantizeLinear", ["w", "s", "z"], ["y"])]
    imp = import_model(qdq(nodes, shape, x_type, inits, x_type), input_precision=9)
    rng = np.random.default_rng(seed)
    for x in (np.full(shape, lo), np.full(shape, hi), rng.integers(lo, hi + 1, shape)):
        [got] = execute(imp.graph, {"data": x.astype(np.int32)})
        assert np.array_equal(got, np.full(shape, z) if taken else x)
    assert verify(imp.graph, None, seeds=1).exact
