"""Lowerings of the broadcast ops (and elemwise_add/sub, their same-shape cases): ONNX's multidirectional
broadcasting is numpy's, as the runtime's."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .lowering import lowering


@lowering("elemwise_add")
@lowering("broadcast_add")
def add(b, a, x, y):
    """x + y (int32, wrapping as the runtime's int32 arithmetic)."""
    return b.Add(x, y)


@lowering("elemwise_sub")
@lowering("broadcast_sub")
def sub(b, a, x, y):
    """x - y (int32, wrapping)."""
    return b.Sub(x, y)


@lowering("broadcast_mul")
def broadcast_mul(b, a, x, y):
    """x * y (int32, wrapping)."""
    return b.Mul(x, y)


@lowering("broadcast_max")
def broadcast_max(b, a, x, y):
    """max(x, y)."""
    return b.Max(x, y)


@lowering("broadcast_greater")
def broadcast_greater(b, a, x, y):
    """1 where x > y, else 0."""
    return b.Cast(b.Greater(x, y), to=TensorProto.INT32)


@lowering("broadcast_div")
def broadcast_div(b, a, x, y):
    """x / y truncated toward zero, and 0 where y == 0.

    ONNX integer Div truncates like C++, but a zero divisor or INT32_MIN / -1 kills onnxruntime (SIGFPE): the
    quotient is taken in int64 of a divisor with its zeros replaced by 1, then zeroed where y == 0 and cast back
    (INT32_MIN / -1 = 2^31 wraps to INT32_MIN, as the reference's int32 result).
    """
    zero = b.Equal(y, b.const(0, np.int32))
    safe = b.Where(zero, b.const(1, np.int64), b.Cast(y, to=TensorProto.INT64))
    q = b.Cast(b.Div(b.Cast(x, to=TensorProto.INT64), safe), to=TensorProto.INT32)
    return b.Where(zero, b.const(0, np.int32), q)
