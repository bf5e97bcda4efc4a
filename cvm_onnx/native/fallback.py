"""The pure-Python fallback of the cvm.native ops: onnxruntime-extensions PyOps running the reference kernels
(onnxruntime-extensions is the extra ``fallback``, imported only when the fallback runs).

onnxruntime-extensions serves Python ops in the domain ``ai.onnx.contrib`` only, and onnxruntime lets one library
own a domain, so the fallback cannot take ``cvm.native`` over: ``to_fallback`` rewrites a model's cvm.native
nodes into ``ai.onnx.contrib`` nodes (``CvmNonMaxSuppression``, ``CvmGetValidCounts``, ``CvmLut``) with every
attribute written out (PyOps have no attribute defaults). The PyOps call the op registry's FORMAL reference
kernels, so the results are those of ``cvm_onnx.core.ops``. They run on the CPU only and are slow: the outputs cross
through Python lists (about 0.1 us per element).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from cvm_onnx import native
from cvm_onnx.core.errors import RuntimeFailure, UnsupportedError
from cvm_onnx.core.ops import REGISTRY

DOMAIN = "ai.onnx.contrib"
OP_TYPES = {"non_max_suppression": "CvmNonMaxSuppression", "get_valid_counts": "CvmGetValidCounts",
            "cvm_lut": "CvmLut"}
_registered = False


def _kernel(name: str):
    """A PyOp body: int attributes -> the registry op's typed attributes, then its reference kernel."""
    op = REGISTRY[name]

    def run(*xs: np.ndarray, **attrs: int):
        xs = [np.asarray(x, dtype=np.int32) for x in xs]
        typed = {k: bool(v) if op.attr(k).kind == "bool" else int(v) for k, v in attrs.items()}
        if name == "cvm_lut":
            typed["in_dim"] = xs[1].size
        out = op.run(op.bind(typed), xs)
        return out[0] if len(out) == 1 else tuple(out)

    return run


def library() -> str:
    """Register the PyOps (once per process) and return the onnxruntime-extensions library to register
    (``UnsupportedError`` without onnxruntime-extensions, the extra ``fallback``)."""
    global _registered
    try:
        from onnxruntime_extensions import PyCustomOpDef, get_library_path, onnx_op
    except ImportError:
        raise UnsupportedError("the native custom-op library is not built with this install, and its pure-Python "
                               "fallback needs onnxruntime-extensions, the extra fallback (pip install "
                               "onnxruntime-extensions); or reinstall with the library (README, Building)") from None

    if not _registered:
        i32 = PyCustomOpDef.dt_int32
        for name, op_type in OP_TYPES.items():
            op = REGISTRY[name]
            n_in, n_out = op.arity(op.bind({}))[1], op.outputs
            attrs = {a: PyCustomOpDef.dt_int64 for a in native.ATTRS[name]}
            onnx_op(op_type=op_type, domain=DOMAIN, inputs=[i32] * n_in, outputs=[i32] * n_out,
                    attrs=attrs)(_kernel(name))
        _registered = True
    return get_library_path()


def uses_native(model: onnx.ModelProto) -> bool:
    """Whether any node of the graph or of a model-local function is in the cvm.native domain."""
    return any(n.domain == native.DOMAIN for nodes in _node_lists(model) for n in nodes)


def to_fallback(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose cvm.native nodes are the fallback's ai.onnx.contrib nodes, attributes explicit."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for nodes in _node_lists(out):
        for node in nodes:
            if node.domain == native.DOMAIN:
                _rewrite(node)
    for imports in [out.opset_import, *(f.opset_import for f in out.functions)]:
        if any(o.domain == native.DOMAIN for o in imports):
            kept = [o for o in imports if o.domain not in (native.DOMAIN, DOMAIN)]
            del imports[:]
            imports.extend(kept + [helper.make_opsetid(DOMAIN, 1)])
    return out


def _node_lists(model: onnx.ModelProto) -> list:
    return [model.graph.node, *(f.node for f in model.functions)]


def _rewrite(node: onnx.NodeProto) -> None:
    defaults = native.ATTRS.get(node.op_type)
    if defaults is None:
        raise RuntimeFailure(f"unknown op {native.DOMAIN}::{node.op_type} (known: {', '.join(native.ATTRS)})",
                             where=node.name)
    given = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise RuntimeFailure(f"unknown attribute(s) {', '.join(unknown)} of {node.op_type}", where=node.name)
    node.domain, node.op_type = DOMAIN, OP_TYPES[node.op_type]
    del node.attribute[:]
    node.attribute.extend(helper.make_attribute(k, int(given.get(k, v))) for k, v in defaults.items())
