"""Lowerings of the elementwise ops (int32 in, int32 out)."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from cvm_onnx.core.constants import precision_bound
from cvm_onnx.core.ops.elemwise import round_shift

from .lowering import lowering


def _clip(b, x, bound: int, dtype=np.int32):
    return b.Clip(x, b.const(-bound, dtype), b.const(bound, dtype))


@lowering("cvm_right_shift")
def cvm_right_shift(b, a, x):
    """Rounding right shift then symmetric clip: floor((x + 2^(s-1)) / 2^s) clipped to +-(2^(p-1)-1).

    This equals the runtime's ((x >> (s-1)) + 1) >> 1 (round half up). ONNX Div truncates and BitShift is
    unsigned, so it is taken in floating point as Round((x + 1/2) * 2^-s): with x = q 2^s + j, 0 <= j < 2^s,
    that value is q + (j + 1/2) / 2^s, never halfway between two integers, and its nearest integer is q + 1
    exactly when j >= 2^(s-1), i.e. floor((x + 2^(s-1)) / 2^s), whatever rule Round uses for ties. Every step
    is exact: x + 1/2 needs one bit below the integers, which float32 has for |x| < 2^23 (float64 otherwise),
    scaling by 2^-s only moves the exponent, and the rounded value is an integer of the same size or smaller.
    The clip is left out when the bound already keeps the result inside it.
    """
    s, limit = a.shift_bit, precision_bound(a.precision)
    dtype, to = (np.float32, TensorProto.FLOAT) if x.bound < 1 << 23 else (np.float64, TensorProto.DOUBLE)
    y = b.Round(b.Mul(b.Add(b.Cast(x, to=to), b.const(0.5, dtype)), b.const(2.0 ** -s, dtype)))
    if round_shift(x.bound, s) > limit:
        y = b.Clip(y, b.const(-limit, dtype), b.const(limit, dtype))
    return b.Cast(y, to=TensorProto.INT32)


@lowering("cvm_clip")
def cvm_clip(b, a, x):
    """Symmetric clip to +-(2^(p-1)-1)."""
    return _clip(b, x, precision_bound(a.precision))


@lowering("cvm_left_shift")
def cvm_left_shift(b, a, x):
    """x * 2^s then symmetric clip; in int64 (p_in + s <= 32 bits) so no product overflows."""
    t = b.Mul(b.Cast(x, to=TensorProto.INT64), b.const(1 << a.shift_bit))
    return b.Cast(_clip(b, t, precision_bound(a.precision), np.int64), to=TensorProto.INT32)


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
