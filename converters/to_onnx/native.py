"""Lowerings to the native custom-op library (domain cvm.native): ops with no good ONNX form. Each is one node
of the library's op of the same name, with the attributes the op's definition lists (``Op.native_attrs``)."""
from __future__ import annotations

from cvm_onnx.core.ops import REGISTRY
from cvm_onnx.native import DOMAIN

from .lowering import lowering


def _call(b, a, op: str, *inputs, n_out: int = 1):
    return b.node(op, *inputs, n_out=n_out, domain=DOMAIN,
                  **{name: int(getattr(a, name)) for name in REGISTRY[op].native_attrs})


@lowering("get_valid_counts", native=True)
def get_valid_counts(b, a, x):
    """Rows whose score (column 1) is > score_threshold, moved to the top in order; the rest -1; their count."""
    return _call(b, a, "get_valid_counts", x, n_out=2)


@lowering("non_max_suppression", native=True)
def non_max_suppression(b, a, x, valid_count):
    """Greedy NMS with the runtime's integer IoU percent (>= threshold suppresses), FORMAL semantics."""
    return _call(b, a, "non_max_suppression", x, valid_count)


@lowering("cvm_lut", native=True)
def cvm_lut(b, a, indices, table):
    """table.flat[clip(indices, 0, in_dim - 1)]."""
    return _call(b, a, "cvm_lut", indices, table)
