"""Lowerings of sum and max over the runtime's reduced axes, reshaped to the runtime's output shape."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from cvm_onnx.core.constants import INT32_MAX
from cvm_onnx.core.ops.reduce import reduced_axes

from .lowering import lowering
from .nn import FLOAT_EXACT


@lowering("sum")
def sum_(b, a, x):
    """Sum over the reduced axes with int32 wrap-around, as the runtime's int32 accumulator.

    ReduceSum on int32 saturates instead of wrapping, so it serves only when the output's bound excludes
    overflow (then no partial sum can overflow either). Otherwise the reduced axes are moved last and flattened,
    and CumSum (which wraps) runs along them; its last element is the sum. onnxruntime's CUDA int32 ReduceSum
    adds in float32 (cuDNN): exact while every partial sum, at most the output's bound, is within 2^24; above
    that, in every form (each may run on CUDA), the sum is taken in float64 (exact to 2^53), cast back.
    """
    axes = reduced_axes(a, len(x.shape))
    if not axes:
        return b.Identity(x)
    bound = b.outputs[0].bound
    if FLOAT_EXACT < bound <= INT32_MAX:
        wide = b.ReduceSum(b.Cast(x, to=TensorProto.DOUBLE), b.const(list(axes)), keepdims=0)
        return b.to_output_shape(b.Cast(wide, to=TensorProto.INT32))
    if bound <= INT32_MAX:
        return b.to_output_shape(b.ReduceSum(x, b.const(list(axes)), keepdims=0))
    kept = [i for i in range(len(x.shape)) if i not in axes]
    rows = int(np.prod([x.shape[i] for i in kept], dtype=np.int64))
    flat = b.Reshape(b.Transpose(x, perm=kept + list(axes)), b.const([rows, -1]))
    total = b.Slice(b.CumSum(flat, b.const(1)), b.const([-1]), b.const([np.iinfo(np.int64).max]), b.const([1]))
    return b.to_output_shape(total)


@lowering("max")
def max_(b, a, x):
    """Maximum over the reduced axes; with the default axis=() the runtime's accumulator starts at 0.
    onnxruntime's CUDA int32 ReduceMax compares in float32: exact for |x| <= 2^24; wider inputs take float64,
    which holds every int32, in every form (each may run on CUDA)."""
    axes = reduced_axes(a, len(x.shape))
    if not axes:
        return b.Identity(x)
    if x.bound > FLOAT_EXACT:
        y = b.Cast(b.ReduceMax(b.Cast(x, to=TensorProto.DOUBLE), b.const(list(axes)), keepdims=0),
                   to=TensorProto.INT32)
    else:
        y = b.ReduceMax(x, b.const(list(axes)), keepdims=0)
    if not a.axis and not a.exclude:
        y = b.Max(y, b.const(0, np.int32))
    return b.to_output_shape(y)
