"""Lowerings of sum and max over the runtime's reduced axes, reshaped to the runtime's output shape."""
from __future__ import annotations

import numpy as np

from cvm_onnx.core.constants import INT32_MAX
from cvm_onnx.core.ops.reduce import reduced_axes

from .lowering import lowering


@lowering("sum")
def sum_(b, a, x):
    """Sum over the reduced axes with int32 wrap-around, as the runtime's int32 accumulator.

    ReduceSum on int32 saturates instead of wrapping, so it serves only when the output's bound excludes
    overflow (then no partial sum can overflow either). Otherwise the reduced axes are moved last and flattened,
    and CumSum (which wraps) runs along them; its last element is the sum.
    """
    axes = reduced_axes(a, len(x.shape))
    if not axes:
        return b.Identity(x)
    if b.outputs[0].bound <= INT32_MAX:
        return b.to_output_shape(b.ReduceSum(x, b.const(list(axes)), keepdims=0))
    kept = [i for i in range(len(x.shape)) if i not in axes]
    rows = int(np.prod([x.shape[i] for i in kept], dtype=np.int64))
    flat = b.Reshape(b.Transpose(x, perm=kept + list(axes)), b.const([rows, -1]))
    total = b.Slice(b.CumSum(flat, b.const(1)), b.const([-1]), b.const([np.iinfo(np.int64).max]), b.const([1]))
    return b.to_output_shape(total)


@lowering("max")
def max_(b, a, x):
    """Maximum over the reduced axes; with the default axis=() the runtime's accumulator starts at 0."""
    axes = reduced_axes(a, len(x.shape))
    if not axes:
        return b.Identity(x)
    y = b.ReduceMax(x, b.const(list(axes)), keepdims=0)
    if not a.axis and not a.exclude:
        y = b.Max(y, b.const(0, np.int32))
    return b.to_output_shape(y)
