"""L2 normalizations as exporters write them (docs/import.md, "L2 normalization"), in quantized (QDQ) and float
models, and the exact value they stand for."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.core.format.onnx_file import onnx_model

NP = {T.INT8: np.int8, T.UINT8: np.uint8, T.INT16: np.int16}

#: form -> who writes it
FORMS = {
    "clip": "torch F.normalize, older exports: Abs, Pow 2, ReduceSum, Pow 0.5, Clip(min eps), Expand, Div",
    "reducel2": "torch F.normalize: ReduceL2, Clip(min eps), Expand, Div",
    "max": "ReduceSumSquare, Sqrt, Max(eps), Div",
    "rsqrt": "x * Reciprocal(Sqrt(ReduceSum(x * x) + eps))",
    "tf": "tf.math.l2_normalize: Reciprocal(Sqrt(Max(ReduceSum(x * x), eps))) * x",
    "lp": "LpNormalization(p=2)",
    "plain": "x / Sqrt(ReduceSum(Pow(x, 2))), no eps",
    "norm_eps": "torch x / (x.norm(dim, keepdim=True) + eps): ReduceL2, Add(eps), Div",
    "sqrt_eps": "x / (Sqrt(ReduceSumSquare(x)) + eps)",
    "div_add": "x / Sqrt(ReduceSum(x * x) + eps)",
    "rms": "T5's RMSNorm: x * Reciprocal(Sqrt(ReduceMean(Pow(x, 2)) + eps))",
    "rms_div": "LLaMA-style RMSNorm: x / Sqrt(ReduceMean(x * x) + eps)",
}
#: the forms of a mean of squares: x / sqrt(sum x^2 / k + eps) over k values
RMS = ("rms", "rms_div")


def l2_nodes(form: str, x: str, y: str, shape: tuple[int, ...], axis: int, eps: float):
    """(nodes, initializers) computing y = the L2 normalization of x along ``axis`` as ``form`` writes it."""
    c = {"l2_two": np.float32(2), "l2_half": np.float32(0.5), "l2_eps": np.float32(eps),
         "l2_axes": np.array([axis], np.int64), "l2_shape": np.array(shape, np.int64)}
    node = h.make_node
    if form == "clip":
        nodes = [node("Abs", [x], ["l2_a"]), node("Pow", ["l2_a", "l2_two"], ["l2_p"]),
                 node("ReduceSum", ["l2_p", "l2_axes"], ["l2_s"], keepdims=1),
                 node("Pow", ["l2_s", "l2_half"], ["l2_n"]), node("Clip", ["l2_n", "l2_eps"], ["l2_c"]),
                 node("Expand", ["l2_c", "l2_shape"], ["l2_e"]), node("Div", [x, "l2_e"], [y], name="l2_div")]
    elif form == "reducel2":
        nodes = [node("ReduceL2", [x], ["l2_n"], axes=[axis], keepdims=1), node("Clip", ["l2_n", "l2_eps"], ["l2_c"]),
                 node("Expand", ["l2_c", "l2_shape"], ["l2_e"]), node("Div", [x, "l2_e"], [y], name="l2_div")]
    elif form == "max":
        nodes = [node("ReduceSumSquare", [x], ["l2_s"], axes=[axis], keepdims=1), node("Sqrt", ["l2_s"], ["l2_n"]),
                 node("Max", ["l2_n", "l2_eps"], ["l2_c"]), node("Div", [x, "l2_c"], [y], name="l2_div")]
    elif form in ("rsqrt", "tf"):
        nodes = [node("Mul", [x, x], ["l2_p"]), node("ReduceSum", ["l2_p", "l2_axes"], ["l2_s"], keepdims=1),
                 node("Add" if form == "rsqrt" else "Max", ["l2_s", "l2_eps"], ["l2_c"]),
                 node("Sqrt", ["l2_c"], ["l2_n"]), node("Reciprocal", ["l2_n"], ["l2_r"]),
                 node("Mul", [x, "l2_r"] if form == "rsqrt" else ["l2_r", x], [y], name="l2_mul")]
    elif form in ("norm_eps", "sqrt_eps"):
        norm = [node("ReduceL2", [x], ["l2_n"], axes=[axis], keepdims=1)] if form == "norm_eps" else \
            [node("ReduceSumSquare", [x], ["l2_s"], axes=[axis], keepdims=1), node("Sqrt", ["l2_s"], ["l2_n"])]
        nodes = [*norm, node("Add", ["l2_n", "l2_eps"], ["l2_c"]), node("Div", [x, "l2_c"], [y], name="l2_div")]
    elif form == "div_add":
        nodes = [node("Mul", [x, x], ["l2_p"]), node("ReduceSum", ["l2_p", "l2_axes"], ["l2_s"], keepdims=1),
                 node("Add", ["l2_eps", "l2_s"], ["l2_c"]), node("Sqrt", ["l2_c"], ["l2_n"]),
                 node("Div", [x, "l2_n"], [y], name="l2_div")]
    elif form == "lp":
        nodes = [node("LpNormalization", [x], [y], axis=axis, p=2, name="l2_lp")]
    elif form == "rms":
        nodes = [node("Pow", [x, "l2_two"], ["l2_p"]), node("ReduceMean", ["l2_p"], ["l2_s"], axes=[axis], keepdims=1),
                 node("Add", ["l2_s", "l2_eps"], ["l2_c"]), node("Sqrt", ["l2_c"], ["l2_n"]),
                 node("Reciprocal", ["l2_n"], ["l2_r"]), node("Mul", [x, "l2_r"], [y], name="l2_mul")]
    elif form == "rms_div":
        nodes = [node("Mul", [x, x], ["l2_p"]), node("ReduceMean", ["l2_p"], ["l2_s"], axes=[axis], keepdims=1),
                 node("Add", ["l2_s", "l2_eps"], ["l2_c"]), node("Sqrt", ["l2_c"], ["l2_n"]),
                 node("Div", [x, "l2_n"], [y], name="l2_div")]
    elif form == "plain":
        nodes = [node("Pow", [x, "l2_two"], ["l2_p"]), node("ReduceSum", ["l2_p", "l2_axes"], ["l2_s"], keepdims=1),
                 node("Sqrt", ["l2_s"], ["l2_n"]), node("Div", [x, "l2_n"], [y], name="l2_div")]
    else:
        raise ValueError(form)
    used = {i for n in nodes for i in n.input}
    return nodes, {k: v for k, v in c.items() if k in used}


def l2_qdq(form: str, shape, axis: int, x_type, s: float, zx: int, eps: float, out: tuple | None, opset: int = 17):
    """DequantizeLinear(x at s, zx) -> the L2 normalization -> QuantizeLinear at ``out`` = (s_out, z_out, type), or
    the float output ``yf`` (``out`` None)."""
    nodes, inits = l2_nodes(form, "xf", "yf", shape, axis, eps)
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]), *nodes]
    inits.update(s=np.float32(s), zx=NP[x_type](zx))
    if out is not None:
        so, zo, o_type = out
        inits.update(so=np.float32(so), zo=NP[o_type](zo))
        nodes.append(h.make_node("QuantizeLinear", ["yf", "so", "zo"], ["y"]))
    o = h.make_tensor_value_info("y", out[2], list(shape)) if out is not None else \
        h.make_tensor_value_info("yf", T.FLOAT, list(shape))
    g = h.make_graph(nodes, "l2", [h.make_tensor_value_info("x", x_type, list(shape))], [o],
                     [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    return onnx_model(g, opset, {})


def l2_float(form: str, shape, axis: int, eps: float, seed: int = 0, reader: bool = False):
    """A float model: x -> Conv 1x1 (4 -> shape[1] channels, NCHW) -> the L2 normalization along ``axis`` -> the
    float output (``reader``: then a Conv 1x1 that quantize_static quantizes, reading it)."""
    rng = np.random.default_rng(seed)
    c = shape[1]
    w = rng.normal(size=(c, 4, 1, 1)).astype(np.float32)
    b = (rng.normal(size=c) * 0.3).astype(np.float32)
    nodes, inits = l2_nodes(form, "h", "n" if reader else "y", shape, axis, eps)
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["h"]), *nodes]
    inits.update(w=w, b=b)
    if reader:
        inits.update(w2=rng.normal(size=(3, c, 1, 1)).astype(np.float32))
        nodes.append(h.make_node("Conv", ["n", "w2"], ["y"]))
    out = (shape[0], 3) + tuple(shape[2:]) if reader else shape
    g = h.make_graph(nodes, "l2f", [h.make_tensor_value_info("x", T.FLOAT, [shape[0], 4, *shape[2:]])],
                     [h.make_tensor_value_info("y", T.FLOAT, list(out))],
                     [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    return onnx_model(g, 17, {})


def exact_l2(u: np.ndarray, axis: int, s: Fraction, form: str, eps: Fraction) -> np.ndarray:
    """sqrt(k) u / (sqrt(max(S + a / s^2, b / s^2)) + o / s) in float64 from exact comparisons (S = sum u^2 along
    ``axis``, an integer; the form's a, b and o from eps; k the row's length for a mean of squares (``RMS``: a = k eps),
    else 1), the value y = x / ... of x = u s; a row of zeros with no eps NaN."""
    total = (u.astype(object) ** 2).sum(axis=axis, keepdims=True)
    k = u.shape[axis] if form in RMS else 1
    a = k * eps if form in ("rsqrt", "div_add", *RMS) else Fraction(0)
    b = {"clip": eps * eps, "reducel2": eps * eps, "max": eps * eps, "tf": eps, "rsqrt": eps}.get(form, a)
    g, e, o = a / (s * s), b / (s * s), (eps / s if form in ("norm_eps", "sqrt_eps") else Fraction(0))
    den = np.vectorize(lambda v: math.sqrt(max(Fraction(int(v)) + g, e)) + o if max(v + g, e) or o else math.nan,
                       otypes=[np.float64])(total)
    with np.errstate(invalid="ignore"):
        return np.where(den > 0, math.sqrt(k) * u / np.where(den > 0, den, 1), 0.0 if form == "lp" else math.nan)
