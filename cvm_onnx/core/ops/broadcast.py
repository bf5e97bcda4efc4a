"""Broadcasting binary ops: broadcast_add, broadcast_sub, broadcast_mul, broadcast_max, broadcast_div and
broadcast_greater.

Shapes broadcast as in numpy: right-aligned, missing leading dims count as 1, and each pair of dims must be equal
or contain a 1. Kernels wrap exactly as the runtime's int32 arithmetic: add, sub and mul compute in int32 (numpy
wraps them modulo 2^32, as int64 arithmetic cast to int32 does, without an int64 copy of the output's size), the
others in int64, cast to int32.
"""
from __future__ import annotations

import numpy as np

from .registry import Op, Shape, register, require, sum_bound


class _Broadcast(Op):
    """Two inputs broadcast together; precision p0 (Op's default) unless a subclass states its rule."""

    family = "broadcast"
    inputs = 2
    input_names = ("lhs", "rhs")

    @staticmethod
    def shape(a, lhs: Shape, rhs: Shape) -> Shape:
        n = max(len(lhs), len(rhs))
        left = (1,) * (n - len(lhs)) + tuple(lhs)
        right = (1,) * (n - len(rhs)) + tuple(rhs)
        for i, (l, r) in enumerate(zip(left, right)):
            require(l == r or l == 1 or r == 1,
                    f"shapes {lhs} and {rhs} do not broadcast: right-aligned dims {l} and {r} "
                    f"(axis {i} of the output) must be equal or one of them 1")
        return tuple(max(l, r) for l, r in zip(left, right))


class _Additive(_Broadcast):
    """Precision max(p0, p1) + 1."""

    bound = staticmethod(sum_bound)

    @staticmethod
    def precision(a, precisions, shapes):
        return max(precisions) + 1


@register
class BroadcastAdd(_Additive):
    """x + y."""

    name = "broadcast_add"
    keeps_nonnegative = True
    step = "scalar"
    interval = staticmethod(lambda a, i: [(i[0][0] + i[1][0], i[0][1] + i[1][1])])

    @staticmethod
    def kernel(a, x, y):
        return np.add(x, y, dtype=np.int32, casting="unsafe")


@register
class BroadcastSub(_Additive):
    """x - y."""

    name = "broadcast_sub"
    step = "scalar"
    interval = staticmethod(lambda a, i: [(i[0][0] - i[1][1], i[0][1] - i[1][0])])

    @staticmethod
    def kernel(a, x, y):
        return np.subtract(x, y, dtype=np.int32, casting="unsafe")


@register
class BroadcastMul(_Broadcast):
    """x * y; precision p0 + p1."""

    name = "broadcast_mul"
    keeps_nonnegative = True
    step = "scalar"
    bound = staticmethod(lambda a, s, b, v: [b[0] * b[1]])
    interval = staticmethod(lambda a, i: [(min(p := [x * y for x in i[0] for y in i[1]]), max(p))])

    @staticmethod
    def precision(a, precisions, shapes):
        return precisions[0] + precisions[1]

    @staticmethod
    def kernel(a, x, y):
        return np.multiply(x, y, dtype=np.int32, casting="unsafe")


@register
class BroadcastMax(_Broadcast):
    """max(x, y); precision max(p0, p1)."""

    name = "broadcast_max"
    keeps_nonnegative = True
    interval = staticmethod(lambda a, i: [(max(i[0][0], i[1][0]), max(i[0][1], i[1][1]))])
    bound = staticmethod(lambda a, s, b, v: [max(b)])

    @staticmethod
    def precision(a, precisions, shapes):
        return max(precisions)

    @staticmethod
    def kernel(a, x, y):
        return np.maximum(x, y).astype(np.int32)


@register
class BroadcastDiv(_Broadcast):
    """y == 0 ? 0 : x / y with C++ truncation toward zero (-7/2 = -3); precision p0.

    INT32_MIN / -1 (undefined in C++, outside every precision) gives 2^31, which wraps to INT32_MIN.
    """

    name = "broadcast_div"
    bound = staticmethod(lambda a, s, b, v: [b[0]])

    @staticmethod
    def kernel(a, x, y):
        x, y = x.astype(np.int64), y.astype(np.int64)
        safe = np.where(y == 0, 1, y)
        q = np.abs(x) // np.abs(safe) * (np.sign(x) * np.sign(safe))
        return np.where(y == 0, 0, q).astype(np.int32)


@register
class BroadcastGreater(_Broadcast):
    """x > y as 1 or 0; precision p0 (the runtime's rule, although p0 = 1 bounds only 0)."""

    name = "broadcast_greater"
    bound = staticmethod(lambda a, s, b, v: [1])

    @staticmethod
    def kernel(a, x, y):
        return (x > y).astype(np.int32)
