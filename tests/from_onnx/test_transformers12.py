"""Transformers' leftovers (issue 35), torch-free models as torch's exporter writes them (support/transformers12.py):
an attention bias gathered from a table with masking rows (chython-rxnmap's -inf padding distance) taken apart into
a bias quantize_static quantizes and a mask's term the masked Softmax takes (docs/import.md, "Masked Softmax"),
against the row-by-row oracle and onnxruntime; a padding Where over ConstantOfShape zeros; a T5 block (RMSNorms, a
relative-position bias, a gated GELU) and a decoder with rotary embeddings and a KV cache through `quantize`."""
from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from support.transformers12 import biased_attention, distances, lookup_model, roles, rope_decoder, t5_block
from test_decoder_masks import check_masked_softmax

from cvm_onnx.app.kept_float import masked_softmaxes
from cvm_onnx.app.quantize import quantize
from cvm_onnx.app.rewrites import masking_rows_apart, masks_after_biases
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.runtime.verify import verify

F32_MIN = float(np.finfo(np.float32).min)
LEVELS = [0.0, -math.inf, F32_MIN, -1e9, -10000.0]


@settings(max_examples=15, deadline=None)
@given(d=st.data(), heads=st.integers(1, 2), n=st.integers(1, 5), rows=st.integers(1, 6),
       s=st.floats(2.0**-10, 2.0**2, width=32))
def test_a_looked_up_term_equals_the_masked_softmax(d, heads, n, rows, s):
    """Softmax(x + Transpose(Unsqueeze(Gather(v, idx)))) (v a row's value: 0, -inf, float32's min, -1e9, -10000;
    idx a 4-bit input, negative ones from the end, every value of its range imported: those past v's ends clipped)
    over random heads, lengths, scales and x at its extremes: the oracle over each row's highest level, within one
    step of onnxruntime where it keeps something or absorbs x. Regression: the Gather of v by idx was no mask's."""
    assume(float(np.float32(s)) * 128 * 2 + 106 <= 10000)
    v = np.asarray(d.draw(st.lists(st.sampled_from(LEVELS), min_size=rows, max_size=rows)), np.float32)
    idx = np.asarray(d.draw(st.lists(st.integers(-rows, rows - 1), min_size=n * n, max_size=n * n)),
                     np.int64).reshape(1, n, n)
    x = np.asarray(d.draw(st.lists(st.integers(-128, 127), min_size=heads * n * n, max_size=heads * n * n)),
                   np.int64).reshape(1, heads, n, n)
    term = v[idx][:, None]
    check_masked_softmax(lookup_model(v, heads, n, s), x, x, term, s, {"d": idx})


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(2, 7), heads=st.integers(1, 3), low=st.sampled_from(LEVELS[1:]), seed=st.integers(0, 99),
       shared=st.booleans())
def test_masking_rows_apart_compute_the_same_float32_values(rows, heads, low, seed, shared):
    """An attention bias gathered from a table with rows of one value at most -10000 (any rows, the table read by
    another node too or not), taken apart into the finite table and a mask's term: onnxruntime's float32 outputs
    equal the model's on every distance (negative ones too), bit for bit."""
    rng = np.random.default_rng(seed)
    padding = tuple(int(r) for r in rng.choice(rows, int(rng.integers(1, rows)), replace=False))
    model = biased_attention(heads=2 * heads, d=4 * heads, rows=rows, padding=padding, seed=seed, low=low)
    if shared:  # the table also an output's
        model.graph.node.append(onnx.helper.make_node("Identity", ["spatial_encoder.weight"], ["table"]))
        table = onnx.helper.make_tensor_value_info("table", onnx.TensorProto.FLOAT, [rows, 2 * heads])
        model.graph.output.append(table)
    apart = onnx.ModelProto()
    apart.CopyFrom(model)
    assert masking_rows_apart(apart) == 1
    onnx.checker.check_model(apart)
    feed = {"x": rng.normal(size=(1, 6, 4 * heads)).astype(np.float32),
            "distances": rng.integers(-rows, rows, (1, 6, 6))}
    feed["distances"][0, :, 0] = [r for r in range(rows) if r not in padding][0]  # each row keeps one
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
                 for m in (model, apart))
    for w, g in zip(want, got):
        assert np.array_equal(w, g)


@pytest.mark.parametrize("mask, padding, low, weights", [
    ("distances", (0,), -math.inf, False), ("distances", (3, 1), -math.inf, False),
    ("distances", (2,), F32_MIN, False), ("roles", (0,), -math.inf, False), ("distances", (0,), -math.inf, True)])
def test_masking_biases_quantize_whole(tmp_path, mask, padding, low, weights):
    """chython-rxnmap's forms: a distance embedding's padding rows (-inf, or float32's min) added to the scores, or
    its roles' padding Where over ConstantOfShape zeros: quantize takes them apart (the finite bias quantized, the
    mask's term left float), and the import is within 1.1x onnxruntime's quantized model's distance from float,
    exported exactly; with the attention weights averaged over the heads as the output (``weights``: a float tail
    quantize_static quantizes no input of) too. Regression: refused ("holds -inf ...: onnxruntime.quantization
    computes scales from finite weights only"); the float32 min rows quantized at the grid of that minimum; the
    masked Softmax's output, unquantized, refused ("the ReduceSum input (masked Softmax) must be quantized")."""
    onnx.save(biased_attention(padding=padding, low=low, mask=mask, weights=weights), tmp_path / "b.onnx")
    rng = np.random.default_rng(3)
    index = distances(16, padding=padding) if mask == "distances" else roles(16)
    np.savez(tmp_path / "c.npz", x=rng.normal(size=(16, 1, 6, 8)).astype(np.float32), **{mask: index})
    done = quantize(tmp_path / "b.onnx", tmp_path / "c.npz", tmp_path / "m", save_onnx=tmp_path / "q.onnx")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps and a.mean_steps < 1, a.line()
    assert verify(done.imported.graph, seeds=2).exact
    q = onnx.load(tmp_path / "q.onnx")
    [softmax] = [n for n in q.graph.node if n.op_type == "Softmax"]
    [add] = [n for n in q.graph.node if softmax.input[0] in n.output]
    assert add.op_type == "Add"  # the masked scores float
    [grid] = [n.input[1:] for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == softmax.output[0]]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in q.graph.initializer}
    if weights:  # as onnxruntime quantizes a Softmax (else a MatMul's calibrated input)
        assert [inits[g].item() for g in grid] == [np.float32(1 / 255), 0]


def test_a_row_masking_only_in_part_stays_refused(tmp_path):
    """A table whose -inf entries are not whole rows (one head masked, another not) is no mask's: refused in one
    line naming its Gather and the rule."""
    model = biased_attention()
    [t] = [t for t in model.graph.initializer if t.name == "spatial_encoder.weight"]
    table = onnx.numpy_helper.to_array(t).copy()
    table[0, 1] = 1.5
    t.CopyFrom(onnx.numpy_helper.from_array(table, t.name))
    assert masking_rows_apart(model) == 0
    onnx.save(model, tmp_path / "b.onnx")
    np.savez(tmp_path / "c.npz", x=np.zeros((2, 1, 6, 8), np.float32), distances=distances(2))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "b.onnx", tmp_path / "c.npz", tmp_path / "m")
    assert len(str(e.value).splitlines()) == 1 and "finite weights only" in str(e.value) and "Gather" in str(e.value)


def test_a_padding_where_over_zeros_of_a_shape_is_found():
    """chython-rxnmap's roles mask, Where(Cast(Equal(roles, 0), bool), -inf, ConstantOfShape(Shape(roles))), is a
    mask's term that quantize leaves float, its ConstantOfShape computed from shapes. Regression: none found (the
    ConstantOfShape read as a second varying tensor), so '-inf ... finite weights only'."""
    nodes = masked_softmaxes(biased_attention(mask="roles"))
    assert {n.op_type for n in nodes} == {"Where", "Reshape", "Expand", "Add", "Softmax"}


def _quantized_whole(tmp_path, model, samples, per_channel):
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "c.npz", **samples)
    done = quantize(tmp_path / "m.onnx", tmp_path / "c.npz", tmp_path / "out", per_channel=per_channel)
    for a in done.agreements:
        assert a.mean_steps <= 1.1 * a.ort_mean_steps and a.mean_steps < 2, a.line()
    assert verify(done.imported.graph, seeds=2).exact


@pytest.mark.parametrize("per_channel, mask", [(False, False), (True, False), (False, True)])
def test_a_t5_block_quantizes_whole(tmp_path, per_channel, mask):
    """A T5 encoder block (RMSNorms written out with Pow, ReduceMean, Sqrt, Reciprocal and the weight's Mul; the
    relative-position bias gathered by folded buckets and added to the scores; the gated GELU FFN; ``mask``: HF's
    padding term added to that bias): whole, within 1.1x onnxruntime's quantized model's distance from float and
    below 2 steps, exported exactly. Regression (mask): the bias plus mask quantized at the grid of float32's min,
    17.5 mean steps from float (onnxruntime's model alike)."""
    rng = np.random.default_rng(3)
    samples = {"x": rng.normal(size=(16, 1, 6, 16)).astype(np.float32)}
    if mask:
        samples["attention_mask"] = (np.arange(6) < rng.integers(2, 7, (16, 1, 1))).astype(np.int64)
    _quantized_whole(tmp_path, t5_block(mask=mask), samples, per_channel)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 99), bits=st.lists(st.booleans(), min_size=6, max_size=6))
def test_masks_after_biases_compute_the_same_float32_values(seed, bits):
    """A T5 block's position bias plus HF's padding term of float32's min, taken apart into (x + b) + m: onnxruntime's
    float32 outputs equal the model's, bit for bit, on any mask (none kept too)."""
    model = t5_block(mask=True, seed=seed)
    apart = onnx.ModelProto()
    apart.CopyFrom(model)
    assert masks_after_biases(apart) == 1
    onnx.checker.check_model(apart)
    assert masks_after_biases(t5_block(seed=seed)) == 0  # no mask: nothing to take apart
    feed = {"x": np.random.default_rng(seed).normal(size=(1, 6, 16)).astype(np.float32),
            "attention_mask": np.array([bits], np.int64)}
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
                 for m in (model, apart))
    assert np.array_equal(want[0], got[0], equal_nan=True)


def test_a_mask_added_to_a_masking_bias_stays():
    """A bias with a masking value (a causal matrix's float32 min, folded) plus a padding term is no bias to quantize:
    left as it is (x + causal quantized would take the grid of that minimum). Regression: taken apart."""
    model = t5_block(mask=True)
    [t] = [t for t in model.graph.initializer if t.name == "relative_attention_bias"]
    table = onnx.numpy_helper.to_array(t).copy()
    table[-1] = F32_MIN
    t.CopyFrom(onnx.numpy_helper.from_array(table, t.name))
    assert masks_after_biases(model) == 0


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_rope_decoder_with_a_kv_cache_quantizes_whole(tmp_path, per_channel):
    """A LLaMA decoder layer: rotary embeddings (Slice halves, Neg, Concat, Mul by cos and sin constants), the past
    key and value inputs concatenated on the sequence axis (and output), a folded causal matrix, SiLU-gated MLP:
    whole, each output within 1.1x onnxruntime's quantized model's distance from float, exported exactly."""
    rng = np.random.default_rng(3)
    samples = {"x": rng.normal(size=(16, 1, 4, 16)), "past_key": rng.normal(size=(16, 1, 2, 4, 8)),
               "past_value": rng.normal(size=(16, 1, 2, 4, 8))}
    _quantized_whole(tmp_path, rope_decoder(), {k: v.astype(np.float32) for k, v in samples.items()}, per_channel)
