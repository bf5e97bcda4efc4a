"""Import rules of ReduceSum and ReduceMax -> sum and max over explicit axes, then a reshape to ONNX's shape.

The axes are always listed (CVM's max with the default axis=() starts from 0). Kept axes of size 1 are
reshaped away before reducing, which avoids the runtime CPU kernel's misreading of some of them. ReduceSum is
exact when n * max|x| fits the element type (onnxruntime saturates int32 sums beyond it, and adds in double,
exact below 2^53).
"""
from __future__ import annotations

import math

import numpy as np

from .context import FLOAT_EXACT, check_values, const
from .registry import Refuse, rule
from .transform import ints, normal

DOUBLE_EXACT = 1 << 53


@rule("ReduceSum", "ReduceMax", since=1)
def reduce(ctx, node, x, axes_t=None):
    is_sum = node.op_type == "ReduceSum"
    rank = len(x.shape)
    axes = node.attr_ints("axes", None) if node.opset < (13 if is_sum else 18) else ints(axes_t, "axes")
    if not axes and node.attr_int("noop_with_empty_axes", 0):
        return x
    axes = sorted(set(normal(axes or list(range(rank)), rank)))
    keep = node.attr_int("keepdims", 1)
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else \
        tuple(d for i, d in enumerate(x.shape) if i not in axes)
    n = math.prod(x.shape[i] for i in axes)
    if n == 0:
        raise Refuse("reducing an empty axis: CVM has no empty tensors")
    lo, hi = (n * x.lo, n * x.hi) if is_sum else (x.lo, x.hi)
    check_values(x.dtype, lo, hi)
    if is_sum and n * x.peak > FLOAT_EXACT.get(x.dtype, DOUBLE_EXACT):
        raise Refuse(f"precision bound exceeded: partial sums may reach {n * x.peak}, beyond the integers "
                     "onnxruntime adds exactly")
    if x.is_const:
        v = x.value.astype(np.int64) if x.value.dtype.kind in "iub" else x.value
        return const((np.sum if is_sum else np.max)(v, axis=tuple(axes), keepdims=bool(keep)).astype(x.value.dtype),
                     x.dtype)
    kept = [i for i in range(rank) if i not in axes and x.shape[i] > 1]
    if len(kept) + len(axes) < rank:  # drop the kept axes of size 1
        x = ctx.reshape(x, tuple(x.shape[i] for i in sorted(kept + axes)))
        axes = [sorted(kept + axes).index(a) for a in axes]
    e = ctx.op("sum" if is_sum else "max", x, axis=tuple(axes), keepdims=False)
    y = ctx.result(e, x.dtype, lo, hi, tuple(d for i, d in enumerate(x.shape) if i not in axes))
    return ctx.reshape(y, shape)
