"""GeM pooling as exporters write it, in quantized (QDQ) models (docs/import.md, "Roots of wide exact sums")."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h

from .l2norm import NP
from .quantized import qdq


def gem(p: int, x_type, zx: int, s: float, shape, reduce="mean", root="pow", out=(0.05, 0, T.UINT8), clip=None,
        keep=1):
    """DequantizeLinear(x at s, zx) -> [Clip(min eps) -> QuantizeLinear -> DequantizeLinear at (s_c, 0, type), as
    quantize_static writes a Clip] -> Pow(p) -> the reduction over H, W -> Pow(1/p) (float32, as exporters
    write it) or Sqrt -> QuantizeLinear at ``out`` = (s_y, z_y, type), or the float output ``yf`` (``out`` None)."""
    node = h.make_node
    nodes = [node("DequantizeLinear", ["x", "s", "zx"], ["xf"])]
    inits = dict(s=np.float32(s), zx=NP[x_type](zx), p=np.float32(p), r=np.float32(1 / p))
    v = "xf"
    if clip is not None:
        eps, sc, c_type = clip
        inits.update(eps=np.float32(eps), sc=np.float32(sc), zc=NP[c_type](0))
        nodes += [node("Clip", [v, "eps"], ["c"]), node("QuantizeLinear", ["c", "sc", "zc"], ["cq"]),
                  node("DequantizeLinear", ["cq", "sc", "zc"], ["cf"])]
        v = "cf"
    nodes.append(node("Pow", [v, "p"], ["pw"]))
    if reduce in ("mean", "sum"):
        inits["axes"] = np.array([2, 3], np.int64)
        nodes.append(node("ReduceMean" if reduce == "mean" else "ReduceSum", ["pw", "axes"], ["m"], keepdims=keep))
    elif reduce == "global":
        nodes.append(node("GlobalAveragePool", ["pw"], ["m"]))
    else:
        nodes.append(node("AveragePool", ["pw"], ["m"], kernel_shape=list(shape[2:])))
    nodes.append(node("Pow", ["m", "r"], ["yf"], name="gem") if root == "pow" else node("Sqrt", ["m"], ["yf"],
                                                                                          name="gem"))
    if out is None:
        return qdq(nodes, shape, x_type, inits, T.FLOAT, opset=18, out="yf")
    inits.update(so=np.float32(out[0]), zo=NP[out[2]](out[1]))
    nodes.append(node("QuantizeLinear", ["yf", "so", "zo"], ["y"]))
    return qdq(nodes, shape, x_type, inits, out[2], opset=18)
