"""Transformer architectures as torch exports them (benchmarks/text_architectures.py's sweep), torch-free: the forms
that sweep found refused, written with onnx.helper. A batched MatMul whose weight of rank 3 onnxruntime's optimizer
folds from constants (DeBERTa-v2's relative-position keys, repeated per head); a causal matrix folded to a constant of
1 KB or more, which quantize's pre-processing stores as external data (every decoder of 16 tokens or more, as the
TorchScript exporter writes GPT-2, LLaMA, Qwen2, Mistral and Phi); T5's relative-position bias masked by a Where of
the attention mask (transformers' T5 with SDPA, the mask an input)."""
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
from support.packed import bert_like, bert_samples, quantized_bert
from support.transformers12 import t5_block
from test_quantize_rewrites import run

from cvm_onnx.app.kept_float import masked_softmaxes
from cvm_onnx.app.quantize import prepare, quantize
from cvm_onnx.app.rewrites import where_biases_apart
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify

F32_MIN = float(np.finfo(np.float32).min)


def repeated_keys(heads: int, m: int, k: int, n: int, w: np.ndarray) -> onnx.ModelProto:
    """x (heads, m, k) -> MatMul by Tile(w (1, k, n), (heads, 1, 1)) -> Relu: DeBERTa-v2's c2p product, its
    positions' keys computed from constants and repeated per head (torch's .repeat), which onnxruntime's optimizer
    folds into one weight of rank 3."""
    nodes = [h.make_node("Tile", ["w", "reps"], ["keys"]), h.make_node("MatMul", ["x", "keys"], ["mm"]),
             h.make_node("Relu", ["mm"], ["y"])]
    inits = [nh.from_array(w.astype(np.float32), "w"), nh.from_array(np.array([heads, 1, 1], np.int64), "reps")]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [heads, m, k])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    return onnx_model(g, 13)


@settings(max_examples=8, deadline=None)
@given(heads=st.integers(2, 4), m=st.integers(1, 4), k=st.integers(1, 8), n=st.integers(1, 40),
       seed=st.integers(0, 2**16))
def test_a_weight_of_rank_3_the_optimizer_folds_becomes_a_block_diagonal_matmul(tmp_path_factory, heads, m, k, n, seed):
    """The prepared model (after onnxruntime's optimizer) holds no MatMul by a constant of rank 3, and computes
    numpy's int64 matmul on integer-valued floats exactly. Regression: the folded weight reached the importer,
    'a MatMul weight of shape (G, K, N): dense takes one weight matrix'."""
    tmp = tmp_path_factory.mktemp("p")
    rng = np.random.default_rng(seed)
    w = rng.integers(-20, 21, (1, k, n))
    prepare(repeated_keys(heads, m, k, n, w), tmp / "p.onnx")
    model = onnx.load(tmp / "p.onnx")
    inits = {t.name: t for t in model.graph.initializer}
    assert not [x for node in model.graph.node if node.op_type == "MatMul" for x in node.input
                if x in inits and len(inits[x].dims) >= 3]
    x = rng.integers(-20, 21, (heads, m, k))
    got = run(model, x.astype(np.float32))
    assert np.array_equal(got.astype(np.int64), np.maximum(np.matmul(x, np.repeat(w, heads, 0)), 0))


@pytest.mark.parametrize("per_channel", [False, True])
def test_deberta_repeated_keys_quantize_whole(tmp_path, per_channel):
    """The folded rank-3 weight through quantize: whole, within 1.1x onnxruntime's quantized model's distance from
    float, exported exactly. Regression: refused ('dense takes one weight matrix'), as DeBERTa-v2's TorchScript export
    was."""
    rng = np.random.default_rng(1)
    onnx.save(repeated_keys(4, 16, 16, 64, rng.normal(size=(1, 16, 64)) / 4), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(8, 4, 16, 16)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m", per_channel=per_channel)
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def causal_decoder(length: int, c: float) -> onnx.ModelProto:
    """The BERT-like decoder of ``length`` tokens whose scores get a folded causal matrix (0 and c) added, the Add
    reading that constant itself, as onnxruntime's optimizer leaves it."""
    model = bert_like(length=length, low=c, decoder="causal")
    [squeeze] = [n for n in model.graph.node if n.op_type == "Squeeze" and n.input[0] == "bias"]
    [bias] = [t for t in model.graph.initializer if t.name == "bias"]
    model.graph.initializer.append(nh.from_array(nh.to_array(bias).squeeze(1), squeeze.output[0]))
    model.graph.node.remove(squeeze)
    model.graph.initializer.remove(bias)
    return model


@settings(max_examples=10, deadline=None)
@given(length=st.integers(2, 40), c=st.sampled_from([-math.inf, F32_MIN, -1e9, -10000.0]))
def test_a_causal_matrix_in_external_data_is_a_mask(tmp_path_factory, length, c):
    """A folded causal matrix (an initializer of 0 and c) stored as external data, the model's graph read without
    it (as quantize reads its prepared model): the same nodes kept float as with the matrix in the graph.
    Regression: none found where the matrix was external (1 KB or more: 16 tokens and more), so quantize_static
    quantized the scores plus the matrix at the grid of c ('the scale ... holds inf')."""
    tmp = tmp_path_factory.mktemp("m")
    model = causal_decoder(length, c)
    want = sorted(n.op_type for n in masked_softmaxes(model))
    onnx.save(model, tmp / "b.onnx", save_as_external_data=True, location="b.data", size_threshold=0)
    header = onnx.load(tmp / "b.onnx", load_external_data=False)
    assert want == ["Add", "Softmax"] and sorted(n.op_type for n in masked_softmaxes(header, str(tmp))) == want


@pytest.mark.parametrize("c", [-math.inf, F32_MIN])
def test_a_decoder_of_16_tokens_quantizes_whole(tmp_path, c):
    """A decoder of 16 tokens whose causal matrix is folded (1 KB: external data in quantize's prepared model):
    whole, within 1.1x onnxruntime's quantized model's distance from float, exported exactly. Regression: the scores
    plus the matrix quantized at the grid of c: 'the scale ... holds inf' (-inf), far from float (float32's min)."""
    samples = {"input_ids": bert_samples(length=16)["input_ids"]}
    done, _ = quantized_bert(tmp_path, causal_decoder(16, c), samples)
    assert done.agreements[0].mean_steps < 2, done.agreements[0].line()  # 9.8 steps before
    assert verify(done.imported.graph, seeds=1).exact


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 99), bits=st.lists(st.booleans(), min_size=6, max_size=6),
       low=st.sampled_from([-math.inf, F32_MIN]))
def test_a_where_masked_bias_taken_apart_computes_the_same_float32_values(seed, bits, low):
    """A T5 block's position bias masked by Where(keep, bias, low), written bias + Where(keep, 0, low): onnxruntime's
    float32 outputs equal the model's, bit for bit, on any mask (none kept too)."""
    model = t5_block(mask="where", low=low, seed=seed)
    apart = onnx.ModelProto()
    apart.CopyFrom(model)
    assert where_biases_apart(apart) == 1
    onnx.checker.check_model(apart)
    feed = {"x": np.random.default_rng(seed).normal(size=(1, 6, 16)).astype(np.float32),
            "attention_mask": np.array([bits], np.int64)}
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
                 for m in (model, apart))
    assert np.array_equal(want[0], got[0], equal_nan=True)


def test_a_where_over_a_level_that_does_not_absorb_the_bias_stays():
    """Where(keep, bias, -10000): bias + -10000 is not -10000 in float32, so no other form computes the same values;
    left as it is."""
    assert where_biases_apart(t5_block(mask="where", low=-10000.0)) == 0


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_t5_block_masked_by_a_where_quantizes_whole(tmp_path, per_channel):
    """The T5 block with its bias masked by a Where of the attention mask (an input, padded samples): whole, within
    1.1x onnxruntime's quantized model's distance from float and below 2 steps, exported exactly. Regression: 'Where
    of two constant branches on no one grid has no integer form here'."""
    rng = np.random.default_rng(3)
    samples = {"x": rng.normal(size=(16, 1, 6, 16)).astype(np.float32),
               "attention_mask": (np.arange(6) < rng.integers(2, 7, (16, 1, 1))).astype(np.int64)}
    onnx.save(t5_block(mask="where"), tmp_path / "m.onnx")
    np.savez(tmp_path / "c.npz", **samples)
    done = quantize(tmp_path / "m.onnx", tmp_path / "c.npz", tmp_path / "out", per_channel=per_channel)
    for a in done.agreements:
        assert a.mean_steps <= 1.1 * a.ort_mean_steps and a.mean_steps < 2, a.line()
    assert verify(done.imported.graph, seeds=2).exact
