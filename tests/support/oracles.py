"""Helpers shared by the op tests: building an op's attributes, and the runtime's integer IoU written out."""
from __future__ import annotations

from cvm_onnx.core.ops import REGISTRY

INT64_MAX = (1 << 63) - 1


def make(name, **given_attrs):
    """The op ``name`` and its bound attributes; the attributes must be valid."""
    op = REGISTRY[name]
    typed, errors = op.parse_attrs(given_attrs)
    assert not errors, errors
    return op, op.bind(typed)


def errors_of(name, **given_attrs):
    return " | ".join(REGISTRY[name].parse_attrs(given_attrs)[1])


def wrap(v: int, bits: int) -> int:
    """``v`` as a signed ``bits``-bit integer (two's-complement wrap-around)."""
    half = 1 << (bits - 1)
    return (v + half) % (1 << bits) - half


def wrap32(v: int) -> int:
    """``v`` as an int32 (the runtime's int32 arithmetic)."""
    return wrap(v, 32)


def iou_oracle(a: list[int], b: list[int]) -> int:
    """The runtime's `iou` of corner boxes [x1, y1, x2, y2]: int32 differences, int64 areas, integer percent with
    the INT64_MAX/100 branch (notes section 3)."""
    def area(r):
        return wrap(r[2] - r[0], 32) * wrap(r[3] - r[1], 32)

    sum_area = wrap(area(a) + area(b), 64)
    if sum_area <= 0:
        return 0
    w = max(0, wrap(min(a[2], b[2]) - max(a[0], b[0]), 32))
    h = max(0, wrap(min(a[3], b[3]) - max(a[1], b[1]), 32))
    overlap = w * h
    tmp = sum_area - overlap
    if tmp <= 0:
        return 0
    if INT64_MAX // 100 < overlap:
        tmp //= 100
    else:
        overlap *= 100
    return overlap // tmp if tmp else 0
