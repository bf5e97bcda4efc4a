"""The L2 norm as a value (docs/import.md, "The L2 norm as a value") as exporters write it, in quantized (QDQ)
models: ReduceL2 and its written-out forms of a dequantized x, and FastEnhancer's magnitude compression."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.core.format.onnx_file import onnx_model

from .l2norm import NP

#: form -> how it is written
FORMS = {
    "reducel2": "ReduceL2(x)",
    "abs": "ReduceL2(Abs(x)) (torch.linalg.vector_norm of a complex pair, FastEnhancer)",
    "sumsquare": "Sqrt(ReduceSumSquare(x))",
    "pow": "Pow(ReduceSum(Pow(x, 2)), 0.5)",
    "mul": "Sqrt(ReduceSum(Mul(x, x)))",
    "abspow": "Sqrt(ReduceSum(Pow(Abs(x), 2)))",
}


def norm_nodes(form: str, x: str, y: str, axes: list[int], keep: int):
    """(nodes, initializers) computing y = ||x|| over ``axes`` as ``form`` writes it (opset 18: axes as inputs)."""
    c = {"n_two": np.float32(2), "n_half": np.float32(0.5), "n_axes": np.array(axes, np.int64)}
    node = h.make_node
    if form in ("reducel2", "abs"):
        src = x if form == "reducel2" else "n_a"
        nodes = [node("Abs", [x], ["n_a"])] if form == "abs" else []
        nodes.append(node("ReduceL2", [src, "n_axes"], [y], keepdims=keep, name="n_norm"))
    elif form == "sumsquare":
        nodes = [node("ReduceSumSquare", [x, "n_axes"], ["n_s"], keepdims=keep), node("Sqrt", ["n_s"], [y],
                                                                                       name="n_norm")]
    else:
        sq = {"pow": [node("Pow", [x, "n_two"], ["n_p"])], "mul": [node("Mul", [x, x], ["n_p"])],
              "abspow": [node("Abs", [x], ["n_a"]), node("Pow", ["n_a", "n_two"], ["n_p"])]}[form]
        root = node("Pow", ["n_s", "n_half"], [y], name="n_norm") if form == "pow" else \
            node("Sqrt", ["n_s"], [y], name="n_norm")
        nodes = [*sq, node("ReduceSum", ["n_p", "n_axes"], ["n_s"], keepdims=keep), root]
    used = {i for n in nodes for i in n.input}
    return nodes, {k: v for k, v in c.items() if k in used}


def reduced_shape(shape, axes, keep):
    return tuple(1 if a in axes else d for a, d in enumerate(shape) if keep or a not in axes)


def norm_qdq(form: str, shape, axes, keep, x_type, s: float, zx: int, out: tuple | None):
    """DequantizeLinear(x at s, zx) -> the norm -> QuantizeLinear at ``out`` = (s_y, z_y, type), or the float output
    ``yf`` (``out`` None)."""
    nodes, inits = norm_nodes(form, "xf", "yf", axes, keep)
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]), *nodes]
    inits.update(s=np.float32(s), zx=NP[x_type](zx))
    oshape = list(reduced_shape(shape, axes, keep))
    if out is not None:
        so, zo, o_type = out
        inits.update(so=np.float32(so), zo=NP[o_type](zo))
        nodes.append(h.make_node("QuantizeLinear", ["yf", "so", "zo"], ["y"]))
    o = h.make_tensor_value_info("y", out[2], oshape) if out is not None else \
        h.make_tensor_value_info("yf", T.FLOAT, oshape)
    g = h.make_graph(nodes, "norm", [h.make_tensor_value_info("x", x_type, list(shape))], [o],
                     [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    return onnx_model(g, 18, {})


def compressed_qdq(shape, s: float, zx: int, eps: float, power: float, out: tuple):
    """FastEnhancer's magnitude compression: DequantizeLinear -> ReduceL2(Abs(x)) over the last axis (a complex pair)
    -> Clip(min eps) -> Pow(power) -> QuantizeLinear at ``out`` = (s_y, z_y, type)."""
    m = norm_qdq("abs", shape, [len(shape) - 1], 1, T.UINT8, s, zx, None)
    g = m.graph
    so, zo, o_type = out
    g.initializer.extend([nh.from_array(np.float32(eps), "eps"), nh.from_array(np.float32(power), "power"),
                          nh.from_array(np.float32(so), "so"), nh.from_array(NP[o_type](zo), "zo")])
    g.node.extend([h.make_node("Clip", ["yf", "eps"], ["c"]), h.make_node("Pow", ["c", "power"], ["p"]),
                   h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])])
    oshape = [d.dim_value for d in g.output[0].type.tensor_type.shape.dim]
    del g.output[:]
    g.output.append(h.make_tensor_value_info("y", o_type, oshape))
    return m
