"""Lowerings to the native custom-op library (domain cvm.native): ops with no good ONNX form."""
from __future__ import annotations

from cvm_onnx.native import DOMAIN

from .lowering import lowering


@lowering("get_valid_counts", native=True)
def get_valid_counts(b, a, x):
    """Rows whose score (column 1) is > score_threshold, moved to the top in order; the rest -1; their count."""
    return b.node("get_valid_counts", x, n_out=2, domain=DOMAIN, score_threshold=a.score_threshold)


@lowering("non_max_suppression", native=True)
def non_max_suppression(b, a, x, valid_count):
    """Greedy NMS with the runtime's integer IoU percent (>= threshold suppresses), FORMAL semantics."""
    return b.node("non_max_suppression", x, valid_count, domain=DOMAIN, max_output_size=a.max_output_size,
                  iou_threshold=a.iou_threshold, force_suppress=int(a.force_suppress), top_k=a.top_k)


@lowering("cvm_lut", native=True)
def cvm_lut(b, a, indices, table):
    """table.flat[clip(indices, 0, in_dim - 1)]."""
    return b.node("cvm_lut", indices, table, domain=DOMAIN)
