"""Lowerings of the transform ops (cvm_lut is a native custom op, see native.py).

These ops only move int32 values, so each lowering is exact as soon as it selects the same elements as the
runtime's FORMAL kernel. Shapes are static: every lowering takes its output shape from ``b.outputs`` and writes
it as a constant, so the graph reads as plain ONNX (Reshape, Transpose, Slice, Gather, Tile, Concat, Where).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .lowering import lowering

INT64_MIN = -(1 << 63)


@lowering("expand_dims")
@lowering("flatten")
@lowering("reshape")
@lowering("squeeze")
def reinterpret(b, a, x):
    """Reshape to the static output shape: the runtime copies the row-major data unchanged (MXNet's reshape
    codes 0, -1, -2, -3, -4 are resolved at export)."""
    return b.to_output_shape(x)


@lowering("transpose")
def transpose(b, a, x):
    """Transpose; output axis i is input axis axes[i] (negative + ndim), axes=() reverses the axes."""
    n = len(x.shape)
    perm = [v % n for v in a.axes] or list(range(n - 1, -1, -1))
    return b.Transpose(x, perm=perm)


@lowering("strided_slice")
def strided_slice(b, a, x):
    """Slice on every axis that is not taken whole: y[d] = x[begin + stride * d], d < out dim.

    begin is normalised as the runtime does (negative + dim, clamped to [0, dim] for stride > 0 or
    [-1, dim-1] for stride < 0); the end written is one step past the last element taken, or INT64_MIN when that
    lies before index 0 (stride < 0), since ONNX reads a negative end as counted from the back.
    """
    starts, ends, axes, steps = [], [], [], []
    for i, (d, k) in enumerate(zip(x.shape, b.outputs[0].shape)):
        step = a.stride[i] if i < len(a.stride) else 1
        begin = a.begin[i] if i < len(a.begin) else 0
        begin += d if begin < 0 else 0
        begin = min(max(begin, -1 if step < 0 else 0), d - 1 if step < 0 else d)
        if (begin, step, k) == (0, 1, d):
            continue
        end = begin + step * (k - 1) + (1 if step > 0 else -1)
        starts.append(begin)
        ends.append(end if end >= 0 else INT64_MIN)
        axes.append(i)
        steps.append(step)
    if not axes:
        return x.name
    return b.Slice(x, b.const(starts), b.const(ends), b.const(axes), b.const(steps))


@lowering("repeat")
def repeat(b, a, x):
    """Each element ``repeats`` times along ``axis``: Unsqueeze a new axis after it, Expand that axis to
    ``repeats``, Reshape to merge the two (so y[.., d, ..] = x[.., d // repeats, ..])."""
    axis = a.axis % len(x.shape)
    wide = list(x.shape[:axis + 1]) + [a.repeats] + list(x.shape[axis + 1:])
    t = b.Unsqueeze(x, b.const([axis + 1]))
    return b.to_output_shape(b.Expand(t, b.const(wide)))


@lowering("tile")
def tile(b, a, x):
    """Tile with reps right-aligned to the output rank (a lower-rank input is first reshaped to that rank with
    leading 1s): y[k] = x[k mod n]."""
    rank = len(b.outputs[0].shape)
    reps = (1,) * (rank - len(a.reps)) + tuple(a.reps)
    t = x.name
    if len(x.shape) < rank:
        t = b.Reshape(x, b.const((1,) * (rank - len(x.shape)) + x.shape))
    return b.Tile(t, b.const(reps))


@lowering("take")
def take(b, a, x, idx):
    """Gather with the indices clipped into [0, n-1] first (ONNX Gather has no clipping). axis None: n is the
    size and the data is reshaped to 1-D; otherwise n is the size of ``axis``."""
    if a.axis is None:
        data, axis = b.Reshape(x, b.const([-1])), 0
        n = int(np.prod(x.shape))
    else:
        data, axis = x.name, a.axis % len(x.shape)
        n = x.shape[axis]
    safe = b.Clip(idx, b.const(0, np.int32), b.const(n - 1, np.int32))
    return b.Gather(data, safe, axis=axis)


@lowering("slice_like")
def slice_like(b, a, x, like):
    """The leading corner of the data: Slice from 0 to the output size on the axes it shortens (the second
    input contributes only its static shape)."""
    axes = [i for i, (d, k) in enumerate(zip(x.shape, b.outputs[0].shape)) if d != k]
    if not axes:
        return x.name
    ends = [b.outputs[0].shape[i] for i in axes]
    return b.Slice(x, b.const([0] * len(axes)), b.const(ends), b.const(axes))


@lowering("concatenate")
def concatenate(b, a, *xs):
    """Concat along ``axis`` (negative + ndim)."""
    return b.Concat(*xs, axis=a.axis % len(xs[0].shape))


@lowering("where")
def where(b, a, cond, x, y):
    """cond != 0 ? x : y, with Cast to bool as the != 0 test. A 1-D condition (length x.shape[0]) selects whole
    rows, as the math doc says: it is reshaped to (n, 1, ..., 1) and broadcast."""
    if cond.shape != x.shape:
        cond = b.Reshape(cond, b.const((cond.shape[0],) + (1,) * (len(x.shape) - 1)))
    return b.Where(b.Cast(cond, to=TensorProto.BOOL), x, y)
