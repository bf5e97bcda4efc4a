"""Attention forms transformers' exports write, each in its minimal ONNX form: a sum's constant term equal to its
zero point throughout (LeViT's attention biases as initialized), against the exact oracle and through `cvm-onnx
quantize`; DeBERTa-v2's attention mask, an outer product of two moves of one mask tensor, as the masked Softmax."""
from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.masks import deberta_model
from support.quantized import between_convs, qdq, quantizes_whole
from support.transformers12 import t5_block
from test_decoder_masks import check_masked_softmax
from test_quantized_fresh_ops import NP, RANGE, draw_x, oracle_equal

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import CVMError
from cvm_onnx.runtime.verify import verify

F32_MIN = float(np.finfo(np.float32).min)


# -- a sum's constant term of value 0 (LeViT's attention biases at their zero initialization) ----------------------
@settings(max_examples=40, deadline=None)
@given(d=st.data(), op=st.sampled_from(["Add", "Sub", "Sub'", "Sum", "Mean"]),
       after=st.sampled_from([None, "Abs", "Neg", "Relu"]), s=st.sampled_from([1.3116868e-12, 2.0**-30, 0.01]),
       ratio=st.floats(0.25, 4.0), x_type=st.sampled_from([T.INT8, T.UINT8]),
       zero=st.sampled_from(["int8", "uint8", "float"]), sb=st.sampled_from([1.0, 3.5e9]),
       shape=st.sampled_from([(2, 4, 4), (4,), (1, 1, 1, 1)]), second=st.booleans())
def test_a_constant_term_of_zeros_is_no_term_of_the_sum(d, op, after, s, ratio, x_type, zero, sb, shape, second):
    """x + b, x - b, b - x, Sum and Mean of x, b [and x at another scale], then [Abs, Neg or Relu], b a quantized
    constant equal to its zero point throughout (quantize_static's all-zero table at scale 1 beside scores at 1e-12)
    or a float 0, read at most as broad as x: (b - z) s_b = 0 at any s_b, so b is no term of the sum, and x + 0 is x
    (Abs of it a table of x's integers): equal to the oracle of docs/import.md, which reads the ONNX ops so.
    Regression: refused 'no common shift within CVM's 32 bits requantizes the sum within one step' (the
    multiplier s_b / s_out past 2^39)."""
    lo, hi = RANGE[x_type]
    inits = {"s": np.float32(s), "z": NP[x_type](d.draw(st.integers(lo, hi))), "so": np.float32(s * ratio),
             "zo": np.int8(d.draw(st.integers(-5, 5)))}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"])]
    if zero == "float":
        inits["bf"] = np.zeros(shape, np.float32)
    else:
        zb = d.draw(st.integers(*RANGE[T.INT8 if zero == "int8" else T.UINT8]))
        kind = np.int8 if zero == "int8" else np.uint8
        inits.update(b=np.full(shape, zb, kind), sb=np.float32(sb), zb=kind(zb))
        nodes.append(h.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bf"]))
    terms = ["xf", "bf"]
    if second:  # x again at 3 s: two terms remain
        inits["s2"] = np.float32(3 * s)
        nodes.append(h.make_node("DequantizeLinear", ["x", "s2", "z"], ["x2"]))
    if op in ("Sum", "Mean"):
        nodes.append(h.make_node(op, terms + (["x2"] if second else []), ["a"]))
    else:
        nodes.append(h.make_node(op[:3], terms[::-1] if op == "Sub'" else terms, ["a0" if second else "a"]))
        nodes += [h.make_node("Add", ["a0", "x2"], ["a"])] if second else []
    if after:
        nodes.append(h.make_node(after, ["a"], ["r"]))
    nodes.append(h.make_node("QuantizeLinear", ["r" if after else "a", "so", "zo"], ["y"]))
    x = draw_x(d, (1, 2, 4, 4), x_type)
    x.reshape(-1)[:2] = lo, hi
    oracle_equal(qdq(nodes, x.shape, x_type, inits, T.INT8), x)


@settings(max_examples=10, deadline=None)
@given(d=st.data(), zb=st.integers(-128, 127), sb=st.sampled_from([1.0, 0.02]), op=st.sampled_from(["Add", "Sub"]))
def test_a_constant_of_zeros_broader_than_the_sum_stays_a_term(d, zb, sb, op):
    """x (1, 2, 4, 4) + b (2, 2, 4, 4), b equal to its zero point throughout: the sum's shape is b's, so b stays a
    term (its integers broadcast x): equal to the oracle, of b's shape."""
    inits = {"s": np.float32(0.01), "z": np.int8(3), "so": np.float32(0.02), "zo": np.int8(0),
             "b": np.full((2, 2, 4, 4), zb, np.int8), "sb": np.float32(sb), "zb": np.int8(zb)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bf"]), h.make_node(op, ["xf", "bf"], ["a"]),
             h.make_node("QuantizeLinear", ["a", "so", "zo"], ["y"])]
    x = draw_x(d, (1, 2, 4, 4), T.INT8)
    oracle_equal(qdq(nodes, x.shape, T.INT8, inits, T.INT8), x)


def levit_bias(bias_shape: tuple[int, ...]) -> onnx.ModelProto:
    """LeViT's attention as initialized, between two convs: scores a Q K^T of tiny values (1e-6 a), plus its
    attention biases, all 0 (a Gather of a zero table by constant indices, as LeViT reads them), then Softmax."""
    nodes = [h.make_node("Mul", ["a", "tiny"], ["q"]), h.make_node("Transpose", ["q"], ["k"], perm=[0, 1, 3, 2]),
             h.make_node("MatMul", ["q", "k"], ["scores"]),
             h.make_node("Gather", ["biases", "idx"], ["bias"], axis=1),
             h.make_node("Add", ["scores", "bias"], ["biased"]), h.make_node("Softmax", ["biased"], ["p"], axis=-1),
             h.make_node("MatMul", ["p", "a"], ["b"])]
    return between_convs(nodes, {"tiny": np.float32(1e-6), "biases": np.zeros(bias_shape, np.float32),
                                 "idx": np.arange(144).reshape(12, 12) % bias_shape[1]})


@settings(max_examples=2, deadline=None)
@given(per_channel=st.booleans(), table=st.sampled_from([(8, 16), (1, 144)]))
def test_levit_attention_biases_of_zeros_quantize_whole(tmp_path_factory, per_channel, table):
    """quantize_static quantizes the zero biases at scale 1 beside scores at 1e-12: whole through `cvm-onnx
    quantize`, within 1.1x onnxruntime's distance from float, the export exact. Regression: refused 'no common shift
    within CVM's 32 bits'."""
    quantizes_whole(tmp_path_factory.mktemp("levit"), levit_bias(table), per_channel)


# -- DeBERTa-v2's attention mask: an outer product of two moves of one mask ------------------------------------------
@settings(max_examples=12, deadline=None)
@given(d=st.data(), batch=st.integers(1, 2), heads=st.integers(1, 2), n=st.integers(1, 6),
       s=st.floats(2.0**-10, 2.0**2, width=32), c=st.sampled_from([F32_MIN, -10000.0, -1e9, -math.inf]))
def test_debertas_outer_product_mask_equals_the_masked_softmax(d, batch, heads, n, s, c):
    """DeBERTa-v2's mask m_i m_j (m of 2 bits: -1, 0, 1; rows and columns of padding, rows keeping nothing) over
    random lengths, heads, scales and c, x at its extremes: one table over the key (m_i - lo) R + m_j - lo of both
    moves' integers, the masked Softmax equal to the row-by-row oracle, within one step of onnxruntime where it keeps
    something or absorbs x. Regression: 'Mul of an attention mask's term: two tensors vary (a table takes one)'."""
    assume(float(np.float32(s)) * 128 * 2 + 106 <= 10000)
    m = np.asarray(d.draw(st.lists(st.integers(-1, 1), min_size=batch * n, max_size=batch * n)),
                   np.int64).reshape(batch, n)
    x = np.asarray(d.draw(st.lists(st.integers(-128, 127), min_size=batch * heads * n * n,
                                   max_size=batch * heads * n * n)), np.int64).reshape(batch, heads, n, n)
    masked = (m[:, None, None, :] * m[:, None, :, None]) == 0
    term = np.where(masked, np.float32(c), np.float32(0))
    check_masked_softmax(deberta_model(batch, heads, n, c, s), np.where(masked, 0, x), x, term, s, {"m": m})


def test_debertas_mask_past_a_tables_keys_is_refused_in_one_line():
    """m of 9 bits (511 values): its outer product's joint key takes 511^2 values, past a table's 2^16: one line
    naming the node and the count."""
    with pytest.raises(CVMError, match=r"Mul of an attention mask's term: a table over 261121 integers of 2 "
                                       r"tensor\(s\) at 1 constants' values would hold more than 2\^16 entries"):
        import_model(deberta_model(1, 1, 4, F32_MIN, 0.01, bits=9), input_precision=9)


# -- TorchScript's T5 with dynamic axes: its position bias computed from Shape of the input -------------------------
def test_a_shaped_t5_block_computes_the_static_ones_values():
    """The T5 block whose bucket indices Shape(x) computes at run time equals the one with them folded, bit for bit
    (the test's model is the form it stands for)."""
    rng = np.random.default_rng(4)
    feed = {"x": rng.normal(size=(1, 6, 16)).astype(np.float32), "attention_mask": np.array([[1, 1, 1, 1, 0, 0]])}
    want, got = (ort.InferenceSession(t5_block(mask="where", shaped=shaped).SerializeToString(),
                                      providers=["CPUExecutionProvider"]).run(None, feed) for shaped in (False, True))
    assert np.array_equal(want[0], got[0])


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_t5_block_whose_bias_shape_computes_quantizes_whole(tmp_path, per_channel):
    """The T5 block of dynamic length, its bias computed from Shape(x) and masked by a Where of the attention mask
    (an input, padded samples): the bias is a constant only once the shapes are fixed and onnxruntime's optimizer has
    folded it, where the Where is taken apart again: whole, within 1.1x onnxruntime's quantized model's distance
    from float, exported exactly. Regression: 'Where of two constant branches on no one grid has no integer form
    here'."""
    rng = np.random.default_rng(3)
    samples = {"x": rng.normal(size=(16, 1, 6, 16)).astype(np.float32),
               "attention_mask": (np.arange(6) < rng.integers(2, 7, (16, 1, 1))).astype(np.int64)}
    onnx.save(t5_block(mask="where", shaped=True), tmp_path / "m.onnx")
    np.savez(tmp_path / "c.npz", **samples)
    done = quantize(tmp_path / "m.onnx", tmp_path / "c.npz", tmp_path / "out", per_channel=per_channel)
    for a in done.agreements:
        assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=2).exact
