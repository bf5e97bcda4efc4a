"""Lowerings of the elementwise ops (int32 in, int32 out)."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .lowering import lowering

INT32_MAX = (1 << 31) - 1


def _clip(b, x, bound: int, dtype=np.int32):
    return b.Clip(x, b.const(-bound, dtype), b.const(bound, dtype))


@lowering("cvm_right_shift")
def cvm_right_shift(b, a, x):
    """Rounding right shift then symmetric clip: floor((x + 2^(s-1)) / 2^s) clipped to +-(2^(p-1)-1).

    ONNX Div truncates and BitShift is unsigned, so the floor is Div(t - Mod(t, 2^s), 2^s) with Mod's
    non-negative remainder (fmod=0, positive divisor): t - Mod is a multiple of 2^s and the Div is exact. This
    equals ((x >> (s-1)) + 1) >> 1. Computed in int32 when |x| + 2^(s-1) fits (true precision), else in int64.
    """
    s = a.shift_bit
    wide = x.bound + (1 << (s - 1)) > INT32_MAX or s >= 31
    dtype = np.int64 if wide else np.int32
    t = b.Cast(x, to=TensorProto.INT64) if wide else x.name
    t = b.Add(t, b.const(1 << (s - 1), dtype))
    d = b.const(1 << s, dtype)
    q = b.Div(b.Sub(t, b.Mod(t, d, fmod=0)), d)
    y = _clip(b, q, (1 << (a.precision - 1)) - 1, dtype)
    return b.Cast(y, to=TensorProto.INT32) if wide else y


@lowering("cvm_clip")
def cvm_clip(b, a, x):
    """Symmetric clip to +-(2^(p-1)-1)."""
    return _clip(b, x, (1 << (a.precision - 1)) - 1)


@lowering("cvm_left_shift")
def cvm_left_shift(b, a, x):
    """x * 2^s then symmetric clip; in int64 (p_in + s <= 32 bits) so no product overflows."""
    t = b.Mul(b.Cast(x, to=TensorProto.INT64), b.const(1 << a.shift_bit))
    return b.Cast(_clip(b, t, (1 << (a.precision - 1)) - 1, np.int64), to=TensorProto.INT32)


@lowering("clip")
def clip(b, a, x):
    """max(min(x, a_max), a_min)."""
    return b.Clip(x, b.const(a.a_min, np.int32), b.const(a.a_max, np.int32))


@lowering("cvm_precision")
def cvm_precision(b, a, x):
    """Smallest i >= 1 with |x| < 2^i, as 1 + the count of k in 1..31 with |x| >= 2^k (|x| in int64)."""
    mag = b.Unsqueeze(b.Abs(b.Cast(x, to=TensorProto.INT64)), b.const([-1]))
    over = b.Cast(b.GreaterOrEqual(mag, b.const([1 << k for k in range(1, 32)])), to=TensorProto.INT32)
    return b.Add(b.ReduceSum(over, b.const([-1]), keepdims=0), b.const(1, np.int32))


@lowering("abs")
def abs_(b, a, x):
    """|x| (int32; |INT32_MIN| stays INT32_MIN as in the runtime's int32 arithmetic)."""
    return b.Abs(x)


@lowering("negative")
def negative(b, a, x):
    """-x (int32, wrapping)."""
    return b.Neg(x)


@lowering("elemwise_add")
def elemwise_add(b, a, x, y):
    """x + y (int32, wrapping; the precision rules exclude overflow)."""
    return b.Add(x, y)


@lowering("elemwise_sub")
def elemwise_sub(b, a, x, y):
    """x - y (int32, wrapping; the precision rules exclude overflow)."""
    return b.Sub(x, y)
