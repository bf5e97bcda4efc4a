"""Decoder attention masks as exporters write them, torch-free: a padding term of an int64 attention_mask input (B, S)
combined with a causal matrix computed from shapes (Range, Less, Trilu, ConstantOfShape, Expand), added to
dequantized scores (B, H, S, S) a Softmax reads; and the row-by-row oracle of docs/import.md's masked Softmax."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.app.rewrites import scatters_as_gathers
from cvm_onnx.core.format.onnx_file import onnx_model

#: The decoder forms: "legacy", transformers' _make_causal_mask (Where(Less(Range, Range + 1 as a column), 0,
#: full(c))) plus _expand_mask's Where(Cast(1 - m, bool), c, 1 - m); "to_4d", AttentionMaskConverter.to_4d: the
#: padding's Where over the causal matrix (a sliding window's Trilu filled with c too); "cache", the
#: cache-position form: Trilu(full(c), k=1) times Greater(Range, cache_position), (causal + m) == 0 filled with c;
#: "sdpa", torch's SDPA of a bool mask: Where(And(causal, Cast(m, bool)), 0, c); "min", Min of HF's (1 - m) c and
#: the causal matrix; "gpt2", a folded causal initializer plus HF's (1 - m) c; "causal", that initializer alone (an
#: export without attention_mask: m unread); GPT-2's eager attention, Where(causal, scores, c) on the scores then
#: + the padding term: "eager", causal a Slice of a bool buffer (1, 1, P, P) at the lengths Shape computes plus HF's
#: (1 - m) c, and "eager_causal", a bool constant alone (no attention_mask), the Where read by the Softmax itself.
#: "cache_scatter", the cache-position form with a mask shorter than the keys (mask_length < target_length): the
#: padding written into the causal matrix's first columns by a slice assignment, Slice then ScatterND.
FORMS = ("legacy", "to_4d", "cache", "sdpa", "min", "gpt2", "causal", "eager", "eager_causal", "cache_scatter")
#: The forms whose Where on the scores replaces them by c where the causal matrix masks.
EAGER = ("eager", "eager_causal")
#: The precision the masked Softmax's tests import their int8 scores x at: 9 holds int8's whole range, so x = -128
#: reaches the import as onnxruntime and the oracle read it (at 8 the runtime clamps it to -127).
X_PRECISION = 9


def _causal(form: str, c: float, window: int | None) -> tuple[list, dict]:
    """The causal part's nodes (output ``causal``: (S, S) float, 0 where kept and c elsewhere; ``keep`` bool for
    sdpa) from the length S = Shape(m)[1], and their constants."""
    nodes = [h.make_node("Shape", ["m"], ["m_shape"]), h.make_node("Gather", ["m_shape", "one_i"], ["len"], axis=0),
             h.make_node("Range", ["zero_i", "len", "one_i"], ["pos"]),
             h.make_node("Concat", ["len_1", "len_1"], ["square"], axis=0)]
    consts = {"one_i": np.array(1, np.int64), "zero_i": np.array(0, np.int64)}
    nodes.append(h.make_node("Unsqueeze", ["len", "axis0"], ["len_1"]))
    consts["axis0"] = np.array([0], np.int64)
    if form == "cache":  # full(c), triu(k=1), times arange > cache_position (0 .. S-1) as a column
        nodes += [h.make_node("ConstantOfShape", ["square"], ["filled"], value=h.make_tensor("v", T.FLOAT, [1], [c])),
                  h.make_node("Trilu", ["filled", "one_i"], ["upper"]),
                  h.make_node("Reshape", ["pos", "column"], ["cache_pos"]),
                  h.make_node("Greater", ["pos", "cache_pos"], ["after"]),
                  h.make_node("Cast", ["after"], ["after_f"], to=T.FLOAT), h.make_node("Mul", ["upper", "after_f"],
                                                                                     ["causal"])]
        consts["column"] = np.array([-1, 1], np.int64)
        return nodes, consts
    nodes += [h.make_node("Add", ["pos", "one_i"], ["pos1"]), h.make_node("Reshape", ["pos1", "column"], ["col"]),
              h.make_node("Less", ["pos", "col"], ["keep"])]
    consts["column"] = np.array([-1, 1], np.int64)
    if form == "sdpa":
        return nodes, consts
    nodes += [h.make_node("ConstantOfShape", ["square"], ["filled"], value=h.make_tensor("v", T.FLOAT, [1], [c])),
              h.make_node("Where", ["keep", "zero_f", "filled"], ["causal0" if window else "causal"])]
    if window:  # mask.masked_fill_(tril(ones(bool), diagonal=-window), c)
        nodes += [h.make_node("ConstantOfShape", ["square"], ["ones"], value=h.make_tensor("v", T.BOOL, [1], [1])),
                  h.make_node("Trilu", ["ones", "minus_window"], ["far"], upper=0),
                  h.make_node("Where", ["far", "c", "causal0"], ["causal"])]
        consts["minus_window"] = np.array(-window, np.int64)
    return nodes, consts


def decoder_term(form: str, batch: int, s: int, c: float, window: int | None = None) -> tuple[list, dict]:
    """The nodes computing ``bias`` (B, 1, S, S) from the int64 input ``m`` (B, S), and their constants."""
    consts = {"c": np.float32(c), "one_f": np.float32(1), "zero_f": np.float32(0), "axes12": np.array([1, 2], np.int64),
              "axes01": np.array([0, 1], np.int64), "wide": np.array([batch, 1, s, s], np.int64)}
    if form == "cache_scatter":  # causal[..., :M] = Where(causal[..., :M] + m == 0, c, causal[..., :M]), M = S - 1
        k = s - 1
        upper = np.triu(np.ones((s, s), bool), 1)
        consts.update({"upper": np.where(upper, np.float32(c), np.float32(0)) * np.ones((batch, 1, 1, 1), np.float32),
                       "zero_1": np.array([0], np.int64), "width": np.array([k], np.int64),
                       "axis3": np.array([3], np.int64),
                       "at": np.stack(np.meshgrid(np.arange(batch), [0], np.arange(s), np.arange(k), indexing="ij"),
                                      -1).astype(np.int64)})
        nodes = [h.make_node("Add", ["upper", "zero_f"], ["causal_b"]),  # computed: its shape not declared
                 h.make_node("Slice", ["causal_b", "zero_1", "width", "axis3"], ["head"]),
                 h.make_node("Unsqueeze", ["m", "axes12"], ["m4"]), h.make_node("Cast", ["m4"], ["mf"], to=T.FLOAT),
                 h.make_node("Add", ["head", "mf"], ["sum"]), h.make_node("Equal", ["sum", "zero_f"], ["padded"]),
                 h.make_node("Where", ["padded", "c", "head"], ["head_b"]),
                 h.make_node("ScatterND", ["causal_b", "at", "head_b"], ["bias"])]
        return nodes, consts
    if form in EAGER:  # ``keep`` (1, 1, S, S) bool; ``pad`` HF's (1 - m) c; ``bias`` Where(keep, 0, c) + pad
        kept = np.tril(np.ones((s + 2, s + 2), bool)).reshape(1, 1, s + 2, s + 2)
        if form == "eager_causal":
            nodes, consts = [], {"c": np.float32(c), "keep": kept[:, :, :s, :s]}
        else:
            consts.update({"buffer": kept, "axis2": np.array([2], np.int64), "axis3": np.array([3], np.int64),
                           "one_i": np.array(1, np.int64), "axis0": np.array([0], np.int64)})
            nodes = [h.make_node("Shape", ["m"], ["m_shape"]), h.make_node("Gather", ["m_shape", "one_i"], ["len"]),
                     h.make_node("Unsqueeze", ["len", "axis0"], ["len_1"]),
                     h.make_node("Sub", ["len_1", "len_1"], ["start"]),
                     h.make_node("Slice", ["buffer", "start", "len_1", "axis2"], ["rows"]),
                     h.make_node("Slice", ["rows", "start", "len_1", "axis3"], ["keep"]),
                     h.make_node("Unsqueeze", ["m", "axes12"], ["m4"]), h.make_node("Cast", ["m4"], ["mf"], to=T.FLOAT),
                     h.make_node("Sub", ["one_f", "mf"], ["inv"]), h.make_node("Mul", ["inv", "c"], ["pad"])]
        nodes.append(h.make_node("Where", ["keep", "zero_f", "c"], ["bias" if form == "eager_causal" else "cterm"]))
        consts["zero_f"] = np.float32(0)
        if form == "eager":
            nodes.append(h.make_node("Add", ["cterm", "pad"], ["bias"]))
        return nodes, consts
    if form == "causal":  # no padding input: the folded causal matrix alone is the term
        kept = np.tril(np.ones((s, s), bool))
        return [], {"bias": np.where(kept, np.float32(0), np.float32(c)).astype(np.float32).reshape(1, 1, s, s)}
    if form == "gpt2":  # the causal matrix folded into an initializer, as a static export leaves it
        kept = np.tril(np.ones((s, s), bool))
        consts["causal"] = np.where(kept, np.float32(0), np.float32(c)).astype(np.float32)
        nodes = []
    else:
        nodes, more = _causal(form, c, window)
        consts.update(more)
    pad = [h.make_node("Unsqueeze", ["m", "axes12"], ["m4"])]
    if form in ("legacy", "to_4d"):
        pad += [h.make_node("Expand", ["m4", "wide"], ["m_wide"]), h.make_node("Cast", ["m_wide"], ["mf"], to=T.FLOAT),
                h.make_node("Sub", ["one_f", "mf"], ["inv"]), h.make_node("Cast", ["inv"], ["masked"], to=T.BOOL)]
        if form == "legacy":
            pad.append(h.make_node("Where", ["masked", "c", "inv"], ["pad"]))
            tail = [h.make_node("Unsqueeze", ["causal", "axes01"], ["causal4"]),
                    h.make_node("Expand", ["causal4", "wide"], ["causal_b"]),
                    h.make_node("Add", ["pad", "causal_b"], ["bias"])]
        else:
            tail = [h.make_node("Unsqueeze", ["causal", "axes01"], ["causal4"]),
                    h.make_node("Expand", ["causal4", "wide"], ["causal_b"]),
                    h.make_node("Where", ["masked", "c", "causal_b"], ["bias"])]
    elif form == "cache":
        pad += [h.make_node("Cast", ["m4"], ["mf"], to=T.FLOAT)]
        tail = [h.make_node("Unsqueeze", ["causal", "axes01"], ["causal4"]),
                h.make_node("Expand", ["causal4", "wide"], ["causal_b"]),
                h.make_node("Add", ["causal_b", "mf"], ["sum"]), h.make_node("Equal", ["sum", "zero_f"], ["padded"]),
                h.make_node("Where", ["padded", "c", "causal_b"], ["bias"])]
    elif form == "sdpa":
        pad += [h.make_node("Cast", ["m4"], ["kept"], to=T.BOOL)]
        tail = [h.make_node("Unsqueeze", ["keep", "axes01"], ["keep4"]),
                h.make_node("And", ["keep4", "kept"], ["both"]),
                h.make_node("Where", ["both", "zero_f", "c"], ["bias"])]
    else:  # min, gpt2: HF's (1 - m) c
        pad += [h.make_node("Cast", ["m4"], ["mf"], to=T.FLOAT), h.make_node("Sub", ["one_f", "mf"], ["inv"]),
                h.make_node("Mul", ["inv", "c"], ["pad"])]
        tail = [h.make_node("Min" if form == "min" else "Add", ["pad", "causal"], ["bias"])]
    return nodes + pad + tail, consts


def decoder_model(form: str, batch: int, heads: int, s: int, c: float, scale: float, window: int | None = None,
                  so: float = 1 / 255, term: bool = False, lse: bool = False) -> onnx.ModelProto:
    """DequantizeLinear(x int8 (B, H, S, S)) + the decoder term of ``m`` -> Softmax (last axis) -> QuantizeLinear
    (uint8, ``so``): the form quantize leaves; ``lse``: ReduceLogSumExp (last axis, keepdims) to int8 instead;
    ``term``: the term (B, 1, S, S) float as the output instead."""
    nodes, consts = decoder_term(form, batch, s, c, window)
    consts.update({"s": np.float32(scale), "zx": np.int8(0), "so": np.float32(so),
                   "zo": np.int8(0) if lse else np.uint8(0)})
    scores = [h.make_node("Add", ["xf", "bias"], ["sc"])]
    if form in EAGER and not term:  # the Where on the scores instead of Where(keep, 0, c)
        nodes = nodes[:-2 if form == "eager" else -1]
        scores = [h.make_node("Where", ["keep", "xf", "c"], ["sc" if form == "eager_causal" else "xw"])]
        if form == "eager":
            scores.append(h.make_node("Add", ["xw", "pad"], ["sc"]))
    m = h.make_tensor_value_info("m", T.INT64, [batch, mask_length(form, s)])
    m.metadata_props.add(key="cvm.precision", value="2")
    if term:
        out, inputs = [h.make_tensor_value_info("bias", T.FLOAT, None)], [m]
    else:
        nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]), *nodes, *scores,
                 h.make_node("ReduceLogSumExp", ["sc"], ["sf"], axes=[-1]) if lse else
                 h.make_node("Softmax", ["sc"], ["sf"], axis=-1),
                 h.make_node("QuantizeLinear", ["sf", "so", "zo"], ["y"])]
        out = [h.make_tensor_value_info("y", T.INT8 if lse else T.UINT8, None)]
        inputs = [h.make_tensor_value_info("x", T.INT8, [batch, heads, s, s]), m]
    if form in ("causal", "eager_causal"):
        inputs = inputs[:1]
    used = {i for n in nodes for i in n.input}
    g = h.make_graph(nodes, "decoder", inputs, out, [nh.from_array(np.asarray(v), k) for k, v in consts.items()
                                                     if k in used])
    model = onnx_model(g, 17)
    if form == "cache_scatter" and not term:  # its ScatterND as quantize writes it (after the optimizer's shapes)
        model = onnx.shape_inference.infer_shapes(model)
        scatters_as_gathers(model)
    return model


def deberta_model(batch: int, heads: int, n: int, c: float, s: float, bits: int = 2) -> onnx.ModelProto:
    """Softmax(Where(Cast(Not(Cast(m_i m_j, bool)), bool), c, DequantizeLinear(x))) over the keys, to uint8 at
    1/255: DebertaV2's get_attention_mask (m unsqueezed to (B, 1, 1, S) times its move to (B, 1, S, 1)) and its
    masked_fill of the scores, as torch's TorchScript exporter writes them; m an int64 input of ``bits``."""
    inits = {"s": np.float32(s), "zx": np.int8(0), "so": np.float32(1 / 255), "zo": np.uint8(0), "c": np.float32(c),
             "a1": np.array([1], np.int64), "a2": np.array([2], np.int64), "a_2": np.array([-2], np.int64),
             "a_1": np.array([-1], np.int64)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("Unsqueeze", ["m", "a1"], ["m1"]), h.make_node("Unsqueeze", ["m1", "a2"], ["row"]),
             h.make_node("Squeeze", ["row", "a_2"], ["sq"]), h.make_node("Unsqueeze", ["sq", "a_1"], ["col"]),
             h.make_node("Mul", ["row", "col"], ["mm"]), h.make_node("Cast", ["mm"], ["keep"], to=T.BOOL),
             h.make_node("Not", ["keep"], ["masked"]), h.make_node("Cast", ["masked"], ["rm"], to=T.BOOL),
             h.make_node("Where", ["rm", "c", "xf"], ["sc"]), h.make_node("Softmax", ["sc"], ["p"], axis=-1),
             h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
    m = h.make_tensor_value_info("m", T.INT64, [batch, n])
    m.metadata_props.add(key="cvm.precision", value=str(bits))
    g = h.make_graph(nodes, "deberta", [h.make_tensor_value_info("x", T.INT8, [batch, heads, n, n]), m],
                     [h.make_tensor_value_info("y", T.UINT8, None)], [nh.from_array(v, k) for k, v in inits.items()])
    return onnx_model(g, 17)


def torchscript_decoder(layers: int, c: float, d: int = 8, vocab: int = 30, pooled: bool = False) -> onnx.ModelProto:
    """A float decoder as torch's TorchScript exporter writes Phi3's: input_ids (1, S) int64 -> embeddings; each of
    ``layers`` attention layers adds Where(keep, Constant 0, Constant c) (its own Constants, shape (1,)) to its
    scores q k^T / sqrt(d) before a Softmax, keep the causal matrix computed from Shape(input_ids) (Range, Unsqueeze,
    LessOrEqual); the residual sum is the output. ``pooled``: the last layer's masked scores also reduced by
    ReduceMax into a second output (quantize_static then quantizes the masked scores: their range reaches c)."""
    rng = np.random.default_rng(0)
    inits = {"emb": rng.normal(size=(vocab, d)).astype(np.float32), "one": np.int64(1), "zero": np.int64(0),
             "ax0": np.array([0], np.int64), "ax1": np.array([1], np.int64), "scale": np.float32(d ** -0.5)}
    nodes = [h.make_node("Gather", ["emb", "input_ids"], ["x0"]), h.make_node("Shape", ["input_ids"], ["shape"]),
             h.make_node("Gather", ["shape", "one"], ["len"], axis=0),
             h.make_node("Range", ["zero", "len", "one"], ["pos"]),
             h.make_node("Unsqueeze", ["pos", "ax0"], ["keys"]), h.make_node("Unsqueeze", ["pos", "ax1"], ["queries"]),
             h.make_node("LessOrEqual", ["keys", "queries"], ["keep"])]
    x = "x0"
    for k in range(layers):
        p = f"l{k}_"
        inits.update({p + w: rng.normal(size=(d, d)).astype(np.float32) for w in ("wq", "wk", "wv")})
        nodes += [h.make_node("Constant", [], [p + "zero"], value=nh.from_array(np.zeros(1, np.float32))),
                  h.make_node("Constant", [], [p + "c"], value=nh.from_array(np.full(1, c, np.float32))),
                  *(h.make_node("MatMul", [x, p + "w" + t], [p + t]) for t in "qkv"),
                  h.make_node("Transpose", [p + "k"], [p + "kt"], perm=[0, 2, 1]),
                  h.make_node("MatMul", [p + "q", p + "kt"], [p + "s0"]),
                  h.make_node("Mul", [p + "s0", "scale"], [p + "s"]),
                  h.make_node("Where", ["keep", p + "zero", p + "c"], [p + "bias"]),
                  h.make_node("Add", [p + "s", p + "bias"], [p + "a"]),
                  h.make_node("Softmax", [p + "a"], [p + "p"], axis=-1),
                  h.make_node("MatMul", [p + "p", p + "v"], [p + "ctx"]),
                  h.make_node("Add", [x, p + "ctx"], [p + "x"])]
        x = p + "x"
    outputs = [h.make_tensor_value_info(x, T.FLOAT, None)]
    if pooled:
        nodes.append(h.make_node("ReduceMax", [f"l{layers - 1}_a"], ["top"], axes=[-1], keepdims=0))
        outputs.append(h.make_tensor_value_info("top", T.FLOAT, None))
    g = h.make_graph(nodes, "decoder", [h.make_tensor_value_info("input_ids", T.INT64, [1, "seq"])], outputs,
                     [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    return onnx_model(g, 17)


def mask_length(form: str, s: int) -> int:
    """The attention_mask's length at S queries and keys: S - 1 for "cache_scatter", else S."""
    return s - 1 if form == "cache_scatter" else s


def term_of(form: str, m: np.ndarray, c: float, window: int | None = None) -> np.ndarray:
    """The decoder term (B, 1, S, S) as onnxruntime computes the float graph on ``m``."""
    if form == "causal":
        return decoder_term(form, *m.shape, c)[1]["bias"]
    if form == "eager_causal":
        return np.where(decoder_term(form, *m.shape, c)[1]["keep"], np.float32(0), np.float32(c))
    s = m.shape[1] + (form == "cache_scatter")
    model = decoder_model(form, *m.shape[:1], 1, s, c, 1.0, window, term=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"m": m.astype(np.int64)})[0]


def scores_of(form: str, x: np.ndarray) -> np.ndarray:
    """The scores beside the term: x itself, or for GPT-2's Where on the scores, x where the causal matrix keeps and
    0 elsewhere, so that x' + term is what float32 computes (x + 0 and 0 + v are exact)."""
    if form not in EAGER:
        return x
    return np.where(np.tril(np.ones(x.shape[-2:], bool)), x, 0)


def levelled_softmax_oracle(v: np.ndarray, term: np.ndarray, s: float, q: Fraction, p, zo: int, lo: int, hi: int,
                            big: float) -> np.ndarray:
    """Softmax(x + term) along the last axis as docs/import.md states it, row by row: R the positions at the row's
    highest term value L; L = 0: the Softmax oracle over R; L < 0: uniform over R where L absorbs x in float32 (x + L
    rounds to L), else the softmax of x over R; L = -inf (float32's NaN): the type's least integer; 0 (z_out)
    outside R."""
    n = v.shape[-1]
    v2, t2 = v.astype(np.int64).reshape(-1, n), np.broadcast_to(term, v.shape).reshape(-1, n)
    f, b = p.frac_bits, p.split
    out = np.full(v2.shape, zo, np.int64)
    for o in range(v2.shape[0]):
        top = t2[o].max()
        r = t2[o] == top
        if top == -np.inf:
            out[o] = lo
            continue
        g = np.float32(-top)
        uniform = top != 0 and big < float(g - np.nextafter(g, np.float32(0))) / 2
        d = np.zeros(r.sum(), np.int64) if uniform else v2[o, r].max() - v2[o, r]
        ex = [math.exp(-int(k) * s) for k in d]
        bigs = [math.floor(Fraction(x) * 2**f + Fraction(1, 2)) for x in ex]
        total = (sum(bigs) + (1 << b >> 1)) >> b
        t = [math.floor(Fraction(x * float(q)) * 2**(f - b) + Fraction(1, 2)) for x in ex]
        out[o, r] = [(2 * tk + total) // (2 * total) + zo for tk in t]
    return np.clip(out, lo, hi).reshape(v.shape)
