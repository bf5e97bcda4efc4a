"""A sentence embedding's ending: a masked mean pooling, sum(x * mask) / clamp(sum(mask), eps), then an L2
normalization (LpNormalization, ReduceL2 / Clip / Div, Pow / ReduceSum / Pow 0.5 / Clip / Div, ReduceSumSquare /
Sqrt / Max / Div, tf's Reciprocal(Sqrt(Max(ReduceSum(x * x), eps))) * x), the model's last ops. quantize_static
leaves them all float: the mean, a quotient computed after the last QuantizeLinear, is quantized first to an int16
grid of its bound and the L2 normalization's rule runs on those integers (docs/import.md, "L2 normalization of a
value computed after the last QuantizeLinear"). Before: 'the LpNormalization input (Div) must be quantized
(QuantizeLinear) first' (and the chains' alike)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.l2norm import exact_l2, l2_nodes
from support.quantized import quantizes_whole
from test_float_tails17 import ending_at_the_div, least_float32_scale
from test_masked_pooling16 import RANGE, SCALES, f, least_c, masked_inputs, masked_mean_qdq, oracle
from test_quantize_fresh15 import padded_ids

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.from_onnx.quantized.l2norm import l2_plan
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model

#: The L2 normalizations of a pooled embedding tested here (``support.l2norm.FORMS``), each with an eps.
ENDINGS = ("lp", "reducel2", "clip", "max", "tf")
INT16 = (-32768, 32767)


def mean_then_l2(shape, x_type, sx, zx, sp, zp, least: float, form: str, count: str, eps: float):
    """``masked_mean_qdq``'s masked mean (B, T, C) -> (B, C) ending at its Div, then the L2 normalization ``form``
    along C: the float output."""
    model = ending_at_the_div(masked_mean_qdq(shape, x_type, sx, zx, sp, zp, 1.0, 0, least, "clip", count, False))
    nodes, inits = l2_nodes(form, "v", "yf", (shape[0], shape[2]), 1, eps)
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(nh.from_array(np.asarray(v), k) for k, v in inits.items())
    del model.graph.output[:]
    model.graph.output.extend([h.make_tensor_value_info("yf", T.FLOAT, None)])
    return model


@settings(max_examples=20, deadline=None)
@given(d=st.data(), x_type=st.sampled_from([T.INT8, T.UINT8]), sx=SCALES, sp=SCALES,
       least=st.sampled_from([1e-9, 1.0]), form=st.sampled_from(ENDINGS), count=st.sampled_from(["grid", "float"]),
       eps=st.sampled_from([1e-12, 1e-6]))
def test_an_l2_normalized_masked_mean_is_exact_on_its_grids(d, x_type, sx, sp, least, form, count, eps):
    """Property: a masked mean (one token to 16, channels 1 to 40, scales 2^-10 to 16, rows all masked and all
    kept, x at its type's ends) then an L2 normalization as the float output: the mean at int16 steps s_v, the least
    float32 with P s_v >= its bound, P = 2^j - 1 the largest (j <= 15) with an L2 plan at the output's grid; every
    output within 1/2 + delta (the plan's) of the exact normalization of the rounded mean, clip(round(v / s_v), -P,
    P) from the exact quotients v, wherever each v of the row lies farther than the quotient's E from a
    half-integer, and equal to it rounded farther than delta from a half-integer."""
    if count == "float":  # a float count is integers: a bound off them is refused by the integer Clip
        least = 1.0
    b, t, c = d.draw(st.integers(1, 3)), d.draw(st.integers(1, 16)), d.draw(st.integers(1, 40))
    assume(t > least)
    lo, hi = RANGE[x_type]
    zx, zp = d.draw(st.integers(lo, hi)), d.draw(st.integers(0, 255))
    x, m = masked_inputs(np.random.default_rng(d.draw(st.integers(0, 2 ** 16))), (b, t, c), lo, hi)
    imp = import_model(mean_then_l2((b, t, c), x_type, sx, zx, sp, zp, least, form, count, eps),
                       input_precisions={"x": 9, "m": 2})
    so = Fraction(float(imp.edges.outputs[0].scale))
    [got] = execute(imp.graph, {"x": x.astype(np.int32), "m": m.astype(np.int32)})
    got = np.asarray(got, np.int64).reshape(b, c)
    weight = 255 * f(1 / 255) if count == "grid" else Fraction(1)
    bound = min(t * max(zp, 255 - zp) * f(sp) / f(least), Fraction(float(max(zp, 255 - zp) * f(sp) / weight)))
    steps, s_v, plan = None, None, None
    for steps in (32767 >> j for j in range(8)):  # the largest grid with a plan at the output's scale
        s_v = least_float32_scale(bound * 32767 / steps)
        e = Fraction(float(np.float32(eps)))
        floor = e if form == "tf" else Fraction(0) if form == "lp" else e * e  # a Max of the sum, of the norm
        try:
            plan = l2_plan(c, steps, Fraction(0), floor / s_v**2, so, *INT16)
            break
        except Exception:  # noqa: BLE001  (NoPlan: the next grid)
            continue
    assert plan is not None and plan.delta < Fraction(1, 2)
    want = oracle(x, m, sx, zx, sp, zp, float(s_v), least, count)
    step = {"grid": f(1 / 255), "float": Fraction(1)}[count]
    c_low = least_c(t, sp, float(s_v), zp, step, least)
    for i in range(b):
        v = [want[i, j][0] for j in range(c)]
        assert all(abs(q) <= steps for q in v)  # the mean's bound: no value passes its grid
        if all(want[i, j][1] == 0 for j in range(c)):  # no kept token: the mean 0 exactly, so is its normalization
            assert (got[i] == 0).all(), got[i]
            continue
        room = [c_low * s_v * want[i, j][2] - 1 for j in range(c)]
        if min(room) <= 0:
            continue
        e_q = [(Fraction(want[i, j][1], 2) + abs(v[j])) / room[j] for j in range(c)]
        if any(abs(abs(q - math.floor(q)) - Fraction(1, 2)) <= eq for q, eq in zip(v, e_q)):
            continue  # a value within E of a half-integer: its integer is either neighbour
        r = np.array([[max(-steps, min(steps, round(q))) for q in v]], dtype=np.int64)
        y = exact_l2(r, 1, s_v, form, Fraction(float(np.float32(eps))))[0] / float(so)
        assert np.all(np.abs(got[i] - y) <= float(plan.error) + 1e-9), (got[i], y)
        away = np.abs(y - np.floor(y) - 0.5) > float(plan.delta) + 1e-9
        assert np.array_equal(got[i][away], np.rint(y[away]))


def sentence_model(ending: str | None, length: int = 12, vocab: int = 30, dim: int = 16):
    """A BERT-like float model over token ids (0 the padding): word and position embeddings, LayerNormalization, one
    encoder layer (self-attention with the padding masked, its residual and LayerNormalization, a Relu FFN, its
    residual and LayerNormalization), sentence-transformers' mean pooling, sum(x * mask) / clamp(sum(mask), 1e-9),
    then the L2 normalization ``ending`` (``support.l2norm.FORMS``; None: the pooled output)."""
    rng = np.random.default_rng(18)

    def w(*shape, scale=0.3):
        return (rng.normal(size=shape) * scale).astype(np.float32)

    inits = {"embed": w(vocab, dim, scale=1.0), "pos": w(1, length, dim, scale=0.5), "pad": np.array(0, np.int64),
             "one": np.float32(1), "big": np.float32(-10000), "rs": np.float32(1 / math.sqrt(dim)),
             "at": np.array([1], np.int64), "last": np.array([-1], np.int64), "least": np.float32(1e-9)}
    for k in ("q", "k", "v", "o", "f1", "f2"):
        inits["w" + k], inits["b" + k] = w(dim, dim), w(dim, scale=0.1)
    for k in range(3):
        inits[f"g{k}"], inits[f"n{k}"] = 1 + w(dim, scale=0.1), w(dim, scale=0.1)
    node = h.make_node
    nodes = [node("Equal", ["ids", "pad"], ["is_pad"]), node("Not", ["is_pad"], ["real"]),
             node("Cast", ["real"], ["mask"], to=T.FLOAT), node("Gather", ["embed", "ids"], ["e"]),
             node("Add", ["e", "pos"], ["ep"]), node("LayerNormalization", ["ep", "g0", "n0"], ["h0"], axis=-1)]
    for k in ("q", "k", "v"):
        nodes += [node("MatMul", ["h0", "w" + k], [k + "m"]), node("Add", [k + "m", "b" + k], [k])]
    nodes += [node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), node("MatMul", ["q", "kt"], ["qk"]),
              node("Mul", ["qk", "rs"], ["scores"]), node("Unsqueeze", ["mask", "at"], ["m1"]),
              node("Sub", ["one", "m1"], ["off"]), node("Mul", ["off", "big"], ["bias"]),
              node("Add", ["scores", "bias"], ["masked"]), node("Softmax", ["masked"], ["probs"], axis=-1),
              node("MatMul", ["probs", "v"], ["ctx"]), node("MatMul", ["ctx", "wo"], ["om"]),
              node("Add", ["om", "bo"], ["o"]), node("Add", ["o", "h0"], ["r1"]),
              node("LayerNormalization", ["r1", "g1", "n1"], ["h1"], axis=-1),
              node("MatMul", ["h1", "wf1"], ["f1m"]), node("Add", ["f1m", "bf1"], ["f1"]), node("Relu", ["f1"], ["a1"]),
              node("MatMul", ["a1", "wf2"], ["f2m"]), node("Add", ["f2m", "bf2"], ["f2"]),
              node("Add", ["f2", "h1"], ["r2"]), node("LayerNormalization", ["r2", "g2", "n2"], ["h2"], axis=-1),
              node("Unsqueeze", ["mask", "last"], ["m3"]), node("Shape", ["h2"], ["full"]),
              node("Expand", ["m3", "full"], ["me"]), node("Mul", ["h2", "me"], ["xm"]),
              node("ReduceSum", ["xm", "at"], ["s"], keepdims=0), node("ReduceSum", ["me", "at"], ["n"], keepdims=0),
              node("Clip", ["n", "least", ""], ["nc"]), node("Div", ["s", "nc"], ["pooled"])]
    out = "pooled"
    if ending is not None:
        more, extra = l2_nodes(ending, "pooled", "emb", (1, dim), 1, 1e-12)
        nodes += more
        inits.update(extra)
        out = "emb"
    g = h.make_graph(nodes, "sentence", [h.make_tensor_value_info("ids", T.INT64, [1, length])],
                     [h.make_tensor_value_info(out, T.FLOAT, [1, dim])],
                     [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    return onnx_model(g, 17)


@pytest.mark.parametrize("ending", [None, *ENDINGS])
@pytest.mark.parametrize("per_channel", [False, True])
def test_a_sentence_embedding_quantizes_whole(tmp_path, ending, per_channel):
    """A BERT-like encoder ending in sentence-transformers' mean pooling (at 1e-9) and each L2 normalization: whole,
    as close to float as onnxruntime's quantized model (1.1x), the export exact. Regression: the pooling refused
    as a float output with no bound, the normalization 'must be quantized (QuantizeLinear) first'."""
    ids = padded_ids(8, 12, 30)[:, 0]
    ids[0, 1:] = 0  # a sequence of one token
    quantizes_whole(tmp_path, sentence_model(ending), per_channel, ids[:, None])
