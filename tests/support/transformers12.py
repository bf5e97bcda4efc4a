"""Small float transformers as torch's exporter writes them, torch-free (issue 35): an attention bias gathered from
an embedding table by an int64 input (a padding row of -inf, chython-rxnmap's distance embedding), a T5 block
(RMSNorms, a relative-position bias, a gated GELU), and a decoder with rotary position embeddings and a KV cache."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.core.format.onnx_file import onnx_model


class _Graph:
    """Nodes and float32 initializers as a builder writes them, each output named for its node."""

    def __init__(self, seed: int):
        self.rng, self.nodes, self.inits = np.random.default_rng(seed), [], []

    def c(self, name, v, dt=np.float32) -> str:
        self.inits.append(nh.from_array(np.asarray(v, dt), name))
        return name

    def w(self, name, shape, scale=1.0) -> str:
        return self.c(name, self.rng.normal(size=shape) * scale / np.sqrt(shape[0]))

    def node(self, op, ins, out=None, **a) -> str:
        out = out or f"{op}_{len(self.nodes)}"
        self.nodes.append(h.make_node(op, ins, [out], name=f"/n{len(self.nodes)}/{op}", **a))
        return out

    def heads(self, z, s, heads, dh, tag) -> str:
        """(1, s, heads dh) -> (1, heads, s, dh)."""
        shape = self.c(f"{tag}_shape", [1, s, heads, dh], np.int64)
        return self.node("Transpose", [self.node("Reshape", [z, shape])], perm=[0, 2, 1, 3])

    def merged(self, o, s, d, tag) -> str:
        return self.node("Reshape", [self.node("Transpose", [o], perm=[0, 2, 1, 3]),
                                     self.c(f"{tag}_oshape", [1, s, d], np.int64)])

    def rmsnorm(self, x, d, tag) -> str:
        """T5's: x times Reciprocal(Sqrt(ReduceMean(Pow(x, 2)) + eps)), times its weight."""
        var = self.node("ReduceMean", [self.node("Pow", [x, self.c(f"{tag}_two", 2.0)]),
                                       self.c(f"{tag}_axes", [-1], np.int64)])
        r = self.node("Reciprocal", [self.node("Sqrt", [self.node("Add", [var, self.c(f"{tag}_eps", 1e-6)])])])
        return self.node("Mul", [self.c(f"{tag}_g", 1 + 0.1 * self.rng.normal(size=d)), self.node("Mul", [x, r])])

    def model(self, name, inputs, outputs) -> onnx.ModelProto:
        g = h.make_graph(self.nodes, name, inputs, outputs, self.inits)
        m = onnx_model(g, 18)
        onnx.checker.check_model(m)
        return m


def biased_attention(s: int = 6, d: int = 8, heads: int = 2, rows: int = 5, padding=(0,), seed: int = 0,
                     low: float = -np.inf, mask: str = "distances", weights: bool = False) -> onnx.ModelProto:
    """x (1, s, d) float and an int64 input -> one attention layer whose scores q k^T / sqrt(dh) get a term added
    -> the output projection and a residual -> y (1, s, d). ``mask``: "distances" (1, s, s): Transpose(Gather(table,
    distances)) (table (rows, heads): finite, its ``padding`` rows ``low``), as chython-rxnmap's spatial encoder
    writes it; "roles" (1, s): its padding mask, Where(Cast(Equal(roles, 0), bool), low, ConstantOfShape(Shape(roles)))
    reshaped to (1, 1, 1, s) and expanded. ``weights``: the output chython-rxnmap's is instead, the attention
    weights' mean over the heads (ReduceSum, Div), of the first item (Gather) -> attention (s, s)."""
    b, dh = _Graph(seed), d // heads
    if mask == "distances":
        table = b.rng.normal(size=(rows, heads)).astype(np.float32)
        table[list(padding)] = low
        bias = b.node("Transpose", [b.node("Gather", [b.c("spatial_encoder.weight", table), "distances"])],
                      perm=[0, 3, 1, 2])
        index = h.make_tensor_value_info("distances", T.INT64, [1, s, s])
    else:
        pad = b.node("Cast", [b.node("Equal", ["roles", b.c("zero", 0, np.int64)])], to=T.BOOL)
        zeros = b.node("ConstantOfShape", [b.node("Shape", ["roles"])], value=h.make_tensor("v", T.FLOAT, [1], [0]))
        bias = b.node("Expand", [b.node("Reshape", [b.node("Where", [pad, b.c("low", low), zeros]),
                                                    b.c("row", [1, 1, 1, s], np.int64)]),
                                 b.c("square", [1, heads, s, s], np.int64)])
        index = h.make_tensor_value_info("roles", T.INT64, [1, s])
    q, k, v = (b.heads(b.node("MatMul", ["x", b.w(f"w{n}", (d, d))]), s, heads, dh, n) for n in "qkv")
    sc = b.node("Mul", [b.node("MatMul", [q, b.node("Transpose", [k], perm=[0, 1, 3, 2])]),
                        b.c("scale", 1 / np.sqrt(dh))])
    p = b.node("Softmax", [b.node("Add", [sc, bias])], axis=-1)
    if weights:
        mean = b.node("Div", [b.node("ReduceSum", [p, b.c("heads", [1], np.int64)], keepdims=0), b.c("h", heads)])
        b.node("Gather", [mean, b.c("first", 0, np.int64)], "attention", axis=0)
        return b.model("biased", [h.make_tensor_value_info("x", T.FLOAT, [1, s, d]), index],
                       [h.make_tensor_value_info("attention", T.FLOAT, [s, s])])
    o = b.node("MatMul", [b.merged(b.node("MatMul", [p, v]), s, d, "o"), b.w("wo", (d, d))])
    b.node("Add", ["x", o], "y")
    return b.model("biased", [h.make_tensor_value_info("x", T.FLOAT, [1, s, d]), index],
                   [h.make_tensor_value_info("y", T.FLOAT, [1, s, d])])


def roles(n: int, s: int = 6, seed: int = 1) -> np.ndarray:
    """n samples of roles (n, 1, s): 1 (reactant) then 2 (product) atoms, then 0 (padding) past 2 .. s of them."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, 1, s), np.int64)
    for k, (length, cut) in enumerate(zip(rng.integers(2, s + 1, n), rng.integers(1, s, n))):
        out[k, 0, :length] = np.where(np.arange(length) < cut, 1, 2)
    return out


def lookup_model(v: np.ndarray, heads: int, n: int, s: float, precision: int = 4) -> onnx.ModelProto:
    """DequantizeLinear(x int8 (1, heads, n, n), s) + Transpose(Unsqueeze(Gather(v, d), -1)) of d int64 (1, n, n)
    (``precision`` bits) -> Softmax -> QuantizeLinear (uint8, 1/255): the masking rows' term as quantize leaves it
    (``rewrites.masking_rows_apart``)."""
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]), h.make_node("Gather", ["v", "d"], ["rows"]),
             h.make_node("Unsqueeze", ["rows", "last"], ["col"]),
             h.make_node("Transpose", ["col"], ["term"], perm=[0, 3, 1, 2]),
             h.make_node("Add", ["xf", "term"], ["sc"]), h.make_node("Softmax", ["sc"], ["sf"], axis=-1),
             h.make_node("QuantizeLinear", ["sf", "so", "zo"], ["y"])]
    d = h.make_tensor_value_info("d", T.INT64, [1, n, n])
    d.metadata_props.add(key="cvm.precision", value=str(precision))
    consts = {"v": np.asarray(v, np.float32), "last": np.array([-1], np.int64), "s": np.float32(s),
              "zx": np.int8(0), "so": np.float32(1 / 255), "zo": np.uint8(0)}
    g = h.make_graph(nodes, "lookup", [h.make_tensor_value_info("x", T.INT8, [1, heads, n, n]), d],
                     [h.make_tensor_value_info("y", T.UINT8, None)], [nh.from_array(c, k) for k, c in consts.items()])
    return onnx_model(g, 17)


def distances(n: int, s: int = 6, rows: int = 5, padding=(0,), seed: int = 1) -> np.ndarray:
    """n samples of distances (n, 1, s, s) in [0, rows), as chython-rxnmap's are: two molecules, a random split of
    the s atoms, the first ``padding`` row across them (masked) and the other rows within each (so that every row
    keeps some)."""
    rng = np.random.default_rng(seed)
    kept = np.array([r for r in range(rows) if r not in padding])
    out = kept[rng.integers(0, len(kept), (n, 1, s, s))]
    for k, cut in enumerate(rng.integers(1, s, n)):
        out[k, 0, :cut, cut:] = out[k, 0, cut:, :cut] = padding[0]
    return out.astype(np.int64)


def t5_block(s: int = 6, d: int = 16, heads: int = 2, ff: int = 32, buckets: int = 8, seed: int = 0,
             mask: bool | str = False, low: float = float(np.finfo(np.float32).min),
             shaped: bool = False) -> onnx.ModelProto:
    """x (1, s, d) -> a T5 encoder block: RMSNorm, self-attention (no scaling) with the relative-position bias
    (Gather of the bucket embedding (buckets, heads) by the folded bucket indices, Transpose, Unsqueeze) added to
    the scores, residual; RMSNorm, the gated GELU FFN (gelu(x wi_0) * (x wi_1), tanh form) wo, residual; the final
    RMSNorm -> y. ``mask``: an attention_mask input (1, s) int64 too, HF's (1 - m) float32's min added to the
    position bias; "where": the bias masked by Where(Cast(m, bool), bias, low) instead (transformers' T5 with SDPA).
    ``shaped``: the bucket indices computed from Shape(x) at run time, its length and the mask's dynamic
    (TorchScript's export with dynamic axes)."""
    b, dh = _Graph(seed), d // heads
    length = "s" if shaped else s
    if not shaped:
        rel = np.arange(s)[None, :] - np.arange(s)[:, None]
        bucket = b.c("buckets", np.clip(np.abs(rel) + (rel > 0) * (buckets // 2), 0, buckets - 1), np.int64)
    else:  # min(|j - i| + (j > i) buckets / 2, buckets - 1) of j, i in Range(0, Shape(x)[1])
        n = b.node("Gather", [b.node("Shape", ["x"]), b.c("one_i", 1, np.int64)])
        r = b.node("Range", [b.c("zero_i", 0, np.int64), n, "one_i"])
        rel = b.node("Sub", [b.node("Unsqueeze", [r, b.c("axis_0", [0], np.int64)]),
                             b.node("Unsqueeze", [r, b.c("axis_1", [1], np.int64)])])
        after = b.node("Mul", [b.node("Cast", [b.node("Greater", [rel, "zero_i"])], to=T.INT64),
                               b.c("half_buckets", buckets // 2, np.int64)])
        bucket = b.node("Min", [b.node("Add", [b.node("Abs", [rel]), after]), b.c("top", buckets - 1, np.int64)])
    pos = b.node("Unsqueeze", [b.node("Transpose", [b.node("Gather", [
        b.c("relative_attention_bias", b.rng.normal(size=(buckets, heads))), bucket])],
        perm=[2, 0, 1]), b.c("axis0", [0], np.int64)])
    inputs = [h.make_tensor_value_info("x", T.FLOAT, [1, length, d])]
    if mask == "where":
        keep = b.node("Cast", [b.node("Unsqueeze", ["attention_mask", b.c("axes12", [1, 2], np.int64)])], to=T.BOOL)
        pos = b.node("Where", [keep, pos, b.c("low", [low])])
        inputs.append(h.make_tensor_value_info("attention_mask", T.INT64, [1, length]))
    elif mask:  # HF's extended mask, (1 - m) float32's min, added to the position bias
        inv = b.node("Sub", [b.c("one_m", 1.0), b.node("Cast", ["attention_mask"], to=T.FLOAT)])
        ext = b.node("Unsqueeze", [b.node("Mul", [inv, b.c("f32_min", np.finfo(np.float32).min)]),
                                   b.c("axes12", [1, 2], np.int64)])
        pos = b.node("Add", [pos, ext])
        inputs.append(h.make_tensor_value_info("attention_mask", T.INT64, [1, s]))
    y = b.rmsnorm("x", d, "ln1")
    q, k, v = (b.heads(b.node("MatMul", [y, b.w(f"w{n}", (d, d))]), s, heads, dh, n) for n in "qkv")
    sc = b.node("MatMul", [q, b.node("Transpose", [k], perm=[0, 1, 3, 2])])
    p = b.node("Softmax", [b.node("Add", [sc, pos])], axis=-1)
    x = b.node("Add", ["x", b.node("MatMul", [b.merged(b.node("MatMul", [p, v]), s, d, "o"), b.w("wo", (d, d))])])
    y = b.rmsnorm(x, d, "ln2")
    g = b.node("MatMul", [y, b.w("wi_0", (d, ff))])
    cube = b.node("Pow", [g, b.c("three", 3.0)])
    inner = b.node("Mul", [b.node("Add", [g, b.node("Mul", [cube, b.c("k", 0.044715)])]), b.c("r", np.sqrt(2 / np.pi))])
    gelu = b.node("Mul", [b.node("Mul", [g, b.c("half", 0.5)]), b.node("Add", [b.node("Tanh", [inner]),
                                                                              b.c("one", 1.0)])])
    hdn = b.node("Mul", [gelu, b.node("MatMul", [y, b.w("wi_1", (d, ff))])])
    x = b.node("Add", [x, b.node("MatMul", [hdn, b.w("wo_ff", (ff, d))])])
    b.rmsnorm(x, d, "final")
    b.nodes[-1].output[0] = "y"
    return b.model("t5", inputs, [h.make_tensor_value_info("y", T.FLOAT, [1, length, d])])


def rope_decoder(s: int = 4, past: int = 4, d: int = 16, heads: int = 2, ff: int = 32, seed: int = 0) \
        -> onnx.ModelProto:
    """x (1, s, d), past_key and past_value (1, heads, past, dh) -> a LLaMA decoder layer: RMSNorm, q and k rotated
    (q cos + rotate_half(q) sin, rotate_half = Concat(Neg(Slice of the second half), Slice of the first), cos and
    sin constants at positions past .. past + s - 1), k and v appended to the cache (Concat on the sequence axis),
    the folded causal matrix (0, float32's min) added to the scores, SiLU-gated MLP, residuals -> y and the present
    key and value."""
    b, dh, half = _Graph(seed), d // heads, d // heads // 2
    inv = 1.0 / 10000 ** (np.arange(half) * 2 / dh)
    angles = np.arange(past, past + s)[:, None] * inv[None, :]
    angles = np.concatenate([angles, angles], -1)[None, None]
    cos, sin = b.c("cos", np.cos(angles)), b.c("sin", np.sin(angles))
    b.c("starts0", [0], np.int64), b.c("ends0", [half], np.int64), b.c("starts1", [half], np.int64)
    b.c("ends1", [np.iinfo(np.int64).max], np.int64), b.c("axes3", [3], np.int64)

    def rotated(z):
        first = b.node("Slice", [z, "starts0", "ends0", "axes3"])
        second = b.node("Slice", [z, "starts1", "ends1", "axes3"])
        turned = b.node("Concat", [b.node("Neg", [second]), first], axis=-1)
        return b.node("Add", [b.node("Mul", [z, cos]), b.node("Mul", [turned, sin])])

    causal = np.where(np.arange(past + s)[None, :] <= past + np.arange(s)[:, None], 0,
                      np.finfo(np.float32).min)[None, None]
    y = b.rmsnorm("x", d, "ln1")
    q, k, v = (b.heads(b.node("MatMul", [y, b.w(f"w{n}", (d, d))]), s, heads, dh, n) for n in "qkv")
    keys = b.node("Concat", ["past_key", rotated(k)], "present_key", axis=2)
    values = b.node("Concat", ["past_value", v], "present_value", axis=2)
    sc = b.node("Mul", [b.node("MatMul", [rotated(q), b.node("Transpose", [keys], perm=[0, 1, 3, 2])]),
                        b.c("scale", 1 / np.sqrt(dh))])
    p = b.node("Softmax", [b.node("Add", [sc, b.c("causal", causal)])], axis=-1)
    x = b.node("Add", ["x", b.node("MatMul", [b.merged(b.node("MatMul", [p, values]), s, d, "o"),
                                              b.w("wo", (d, d))])])
    y = b.rmsnorm(x, d, "ln2")
    g = b.node("MatMul", [y, b.w("gate", (d, ff))])
    act = b.node("Mul", [g, b.node("Sigmoid", [g])])
    x = b.node("Add", [x, b.node("MatMul", [b.node("Mul", [act, b.node("MatMul", [y, b.w("up", (d, ff))])]),
                                            b.w("down", (ff, d))])], "y")
    cache = [1, heads, past, dh]
    return b.model("decoder", [h.make_tensor_value_info("x", T.FLOAT, [1, s, d]),
                               h.make_tensor_value_info("past_key", T.FLOAT, cache),
                               h.make_tensor_value_info("past_value", T.FLOAT, cache)],
                   [h.make_tensor_value_info("y", T.FLOAT, [1, s, d]),
                    h.make_tensor_value_info("present_key", T.FLOAT, [1, heads, past + s, dh]),
                    h.make_tensor_value_info("present_value", T.FLOAT, [1, heads, past + s, dh])])
