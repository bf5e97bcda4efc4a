"""Detection ops: get_valid_counts and non_max_suppression (rows [id, score, x1, y1, x2, y2])."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..constants import INT32_MAX
from .registry import Attr, Op, in_range, number_precision, register, require

INT64_MAX = (1 << 63) - 1


def equals(expected: Any) -> Callable[[Any], str | None]:
    """Check for the only value the runtime supports."""
    return lambda v: None if v == expected else f"must be {expected} (the only value the runtime supports)"


@register
class GetValidCounts(Op):
    """Per batch, rows with row[1] > score_threshold moved to the top in order, the rest filled with -1.

    Outputs: 0 = valid_count (B,) = the number of such rows, 1 = the rearranged data (B, N, K). Its gas counts
    1 per element of output 0: the runtime's GetOps meant output 1 but tests the name "get_valid_count".
    """

    name = "get_valid_counts"
    family = "vision"
    native_attrs = ("score_threshold",)
    bound = staticmethod(lambda a, s, b, v: [s[0][1], max(b[0], 1)])
    attrs = (Attr("score_threshold", "int", 0),)
    outputs = 2

    @staticmethod
    def shape(a, data):
        require(len(data) == 3, f"data shape {tuple(data)} must be 3-D (B, N, K)")
        require(2 <= data[2] < 32, f"row length K={data[2]} must lie in [2, 31]")
        return [(data[0],), tuple(data)]

    @staticmethod
    def precision(a, precisions, shapes):
        b, n, k = shapes[0]
        return [number_precision(n * k), precisions[0]]

    @staticmethod
    def kernel(a, data):
        valid = data[:, :, 1] > a.score_threshold
        count = valid.sum(axis=1)
        order = np.argsort(~valid, axis=1, kind="stable")  # valid rows first, both groups in input order
        out = np.take_along_axis(data, order[:, :, None], axis=1)
        out[np.arange(data.shape[1]) >= count[:, None]] = -1
        return count.astype(np.int32), out


def iou(kept: np.ndarray, box: np.ndarray) -> np.ndarray:
    """Integer IoU in percent of each row of ``kept`` (m, 4) with ``box`` (4,), corner format, as the runtime.

    Coordinate differences in int32 (wrapping as the runtime's), areas in int64; 0 when the summed areas or
    the union are <= 0; overlap*100 // union, or overlap // (union/100) when overlap*100 would pass INT64_MAX.
    """
    box = box[None]

    def area(b):
        return (b[:, 2] - b[:, 0]).astype(np.int64) * (b[:, 3] - b[:, 1])

    sum_area = area(kept) + area(box)
    w = np.maximum(0, np.minimum(kept[:, 2], box[:, 2]) - np.maximum(kept[:, 0], box[:, 0]))
    h = np.maximum(0, np.minimum(kept[:, 3], box[:, 3]) - np.maximum(kept[:, 1], box[:, 1]))
    overlap = h.astype(np.int64) * w
    union = sum_area - overlap
    big = overlap > INT64_MAX // 100
    num = np.where(big, overlap, overlap * 100)
    den = np.where(big, union // 100, union)
    ok = (sum_area > 0) & (union > 0)
    return np.where(ok, num // np.where(ok, den, 1), 0)


@register
class NonMaxSuppression(Op):
    """Greedy NMS per batch (the runtime's FORMAL algorithm); the output has the data's shape.

    T = clamp(valid_count, 0, N); the first T rows stable-sorted by score, descending; candidates p < min(T, top_k)
    (top_k < 0: no limit) while kept < min(T, max_output_size) (< 0: no limit): rows with id < 0 are skipped, a row
    is dropped when a kept row (of the same id, or any with force_suppress) has iou >= iou_threshold, else kept
    in order. The remaining rows are -1.
    """

    name = "non_max_suppression"
    family = "vision"
    input_names = ("data", "valid_count")
    native_attrs = ("max_output_size", "iou_threshold", "force_suppress", "top_k")
    bound = staticmethod(lambda a, s, b, v: [max(b[0], 1)])
    attrs = (
        Attr("max_output_size", "int", -1),
        Attr("iou_threshold", "int", 50, in_range(1, INT32_MAX)),
        Attr("force_suppress", "bool", False),
        Attr("top_k", "int", -1),
        Attr("coord_start", "int", 2, equals(2)),
        Attr("score_index", "int", 1, equals(1)),
        Attr("id_index", "int", 0, equals(0)),
        Attr("return_indices", "bool", False, equals(False)),
        Attr("invalid_to_bottom", "bool", True, equals(True)),
    )
    inputs = 2

    @staticmethod
    def batch_refusal(a, shapes, derived, n):
        if n > 1:
            return ("non_max_suppression over a batch is not portable: the runtime's CPU device stops at the first "
                    "example whose valid_count is <= 0")
        return None

    @staticmethod
    def shape(a, data, valid_count):
        require(len(data) == 3 and data[2] == 6, f"data shape {tuple(data)} must be (B, N, 6)")
        require(len(valid_count) == 1, f"valid_count shape {tuple(valid_count)} must be 1-D (B,)")
        require(valid_count[0] == data[0],
                f"valid_count length {valid_count[0]} must equal the batch size B={data[0]}")
        return tuple(data)

    @staticmethod
    def base_ops(a, shapes, out):
        """20 per batch: the runtime's count is data's first dimension (B) times 20, not N."""
        return shapes[0][0] * 20

    @staticmethod
    def kernel(a, data, valid_count):
        n_rows = data.shape[1]
        out = np.full_like(data, -1)
        for rows, vc, kept in zip(data, valid_count, out):
            t = min(max(int(vc), 0), n_rows)
            rows = rows[:t][np.argsort(-rows[:t, 1].astype(np.int64), kind="stable")]
            p_max = t if a.top_k < 0 else min(t, a.top_k)
            n_max = t if a.max_output_size < 0 else min(t, a.max_output_size)
            n = 0
            for row in rows[:p_max]:
                if n == n_max:
                    break
                if row[0] < 0:
                    continue
                rivals = kept[:n] if a.force_suppress else kept[:n][kept[:n, 0] == row[0]]
                if (iou(rivals[:, 2:], row[2:]) >= a.iou_threshold).any():
                    continue
                kept[n] = row
                n += 1
        return out

    @staticmethod
    def warnings(a, shapes, precisions):
        out = []
        if a.max_output_size == 0:
            out.append("max_output_size=0: the runtime's CPU device applies no limit, FORMAL keeps no box")
        if shapes[0][0] > 1:
            out.append(f"batch size {shapes[0][0]} > 1: the runtime's CPU device stops at the first batch whose "
                       f"valid_count is <= 0, leaving the later batches unwritten")
        if precisions[0] > 30:
            out.append(f"data precision {precisions[0]} > 30: the runtime's IoU coordinate differences can overflow "
                       f"int32 (undefined behaviour in C++; the kernel mirrors the usual wrap-around)")
        return out
