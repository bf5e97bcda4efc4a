"""The ops that only move or select values of a dequantized tensor (MaxPool, Reshape, Slice, ...): the integer rule on
its integers, the scale and zero point kept; Shape, Pad, Concat.
"""
from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import numpy as np

from ..context import INT32, const
from ..emit import as_int32, concatenated, integer_scales, normal, resized_shape, source_coordinate
from ..registry import Refuse, float_rule, integer_rule
from .values import Real, Scaled, per_tensor, real_bound, scaled


MOVES = ["MaxPool", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Resize", "Upsample",
         "Identity", "Expand", "Tile", "Gather", "Split", "GlobalMaxPool", "ReduceMax", "ReduceMin"]


def move_rule(ctx, node, x, *rest):
    """An op that only moves or selects values (MaxPool, GlobalMaxPool, ReduceMax, ReduceMin: the scale is positive,
    so the max of values of one scale is the value of their integers' max): the integer rule on t. A deferred
    Clip passes through (clip then select = select then clip; max commutes with the monotone clip), so a Clip off
    the grid may precede a Resize or MaxPool before the QuantizeLinear."""
    if node.op_type == "Resize" and node.attr_str("mode", "nearest") == "linear":
        return linear_resize(ctx, node, scaled(x, "the Resize input"), *rest)
    x = scaled(x, f"the {node.op_type} input", clipped_ok=True)
    if not x.per_tensor:
        raise Refuse(f"{node.op_type} needs a per-tensor scale and zero point")
    if any(isinstance(r, Real) for r in rest):
        raise Refuse(f"{node.op_type} with a dequantized value as its parameters")
    if node.op_type == "Flatten" and node.attr_int("axis", 1) == 1 and len(x.shape) > 2 and not x.t.is_const:
        shape = (x.shape[0], math.prod(x.shape[1:]))  # CVM's flatten keeps the batch axis (a batched form can grow it)
        return replace(x, t=ctx.result(ctx.emit("flatten", x.t.entry), x.t.dtype, x.t.lo, x.t.hi, shape))
    out = integer_rule(node)(ctx, node, x.t, *rest)
    return [replace(x, t=o) for o in out] if isinstance(out, list) else replace(x, t=out)


for _op in MOVES:
    float_rule(_op, since=1)(move_rule)


def linear_resize(ctx, node, x: Scaled, roi=None, scales=None, sizes=None) -> Scaled:
    """Resize linear (bilinear, ...) at integer scales f, axis by axis: each output o reads the input coordinate
    num / den (exact rationals by the coordinate transformation mode; den = 2f for half_pixel), i = floor(num / den),
    r = num - i den, and y = ((den - r) x[i] + r x[i + 1]) / den, the indices clamped to the axis (onnxruntime's
    border). On the integers: two ``take``s, ``broadcast_mul`` by the integer weights den - r and r,
    ``broadcast_add``: exactly (t' - den z) s / den per axis, weights summing to den. Cubic and non-integer scales
    are refused."""
    if x.per_tensor is False:
        raise Refuse("Resize needs a per-tensor scale and zero point")
    if node.opset < 11:
        raise Refuse("Resize linear before opset 11 has no exact CVM form here")
    if roi is not None and roi.size and node.attr_str("coordinate_transformation_mode", "half_pixel") == \
            "tf_crop_and_resize":
        raise Refuse("Resize tf_crop_and_resize has no CVM form")
    if node.attr_int("antialias", 0):
        raise Refuse("Resize linear with antialias has no exact CVM form here")
    full = resized_shape(node, x.t, scales, sizes)
    factors = integer_scales(x.t, full)
    mode = node.attr_str("coordinate_transformation_mode", "half_pixel")
    t, zero, scale = as_int32(x.t), int(x.zero.reshape(())), x.scale.reshape(()).item()
    for axis, (d, f, o) in enumerate(zip(x.shape, factors, full)):
        if f == 1:
            continue
        num, den = source_coordinate(mode, np.arange(o), d, o, f)
        low = num // den
        frac = num - low * den
        lo, hi = (const(np.clip(i, 0, d - 1).astype(np.int32), INT32) for i in (low, low + 1))
        shape = t.shape[:axis] + (o,) + t.shape[axis + 1:]
        along = (-1,) + (1,) * (len(shape) - axis - 1)
        parts = []
        for idx, w in ((lo, den - frac), (hi, frac)):
            if not w.any():
                continue
            e = ctx.result(ctx.emit("take", ctx.entry(t), ctx.entry(idx), axis=axis), INT32, t.lo, t.hi, shape)
            wc = const(w.reshape(along).astype(np.int32), INT32)
            parts.append(ctx.result(ctx.op("broadcast_mul", e, wc), INT32, min(t.lo * int(w.max()), 0),
                                    max(t.hi * int(w.max()), 0), shape))
        y = parts[0]
        for p in parts[1:]:
            y = ctx.result(ctx.op("broadcast_add", y, p), INT32, y.lo + p.lo, y.hi + p.hi, shape)
        t = replace(y, lo=max(y.lo, t.lo * den), hi=min(y.hi, t.hi * den))  # a weighted mean of x times den
        zero, scale = zero * den, scale / den
    return Scaled(t, np.asarray(scale, dtype=object), np.asarray(zero, np.int64))


@float_rule("Shape", since=1)
def shape_rule(ctx, node, x):
    """The static shape of a dequantized value (shape arithmetic, folded at import)."""
    return integer_rule(node)(ctx, node, x)  # it reads only x.shape


@float_rule("Pad", since=11)
def pad_rule(ctx, node, x, pads=None, value=None, axes=None):
    """Pad with a real value v: the integer value v / s + z, which must be a whole number."""
    x = per_tensor(scaled(x, "the Pad input"), "Pad")
    v = Fraction(0) if value is None else real_bound(value, "Pad constant_value")
    q = v / x.scale.reshape(()).item() + int(x.zero.reshape(()))
    if q.denominator != 1:
        raise Refuse(f"Pad value {float(v)} is not on the input's quantization grid")
    fill = const(np.array([int(q)], np.int64), x.t.dtype)
    return replace(x, t=integer_rule(node)(ctx, node, x.t, pads, fill, axes))


@float_rule("Concat", since=4)
def concat_rule(ctx, node, *xs):
    """Concat: of the integers when every input has the same scale and zero point, else along a per-axis scale and
    zero point that the QuantizeLinear that follows requantizes channel by channel."""
    xs = [per_tensor(scaled(x, "a Concat input"), "Concat") for x in xs]
    rank = len(xs[0].shape)
    axis = normal([node.attr_int("axis")], rank)[0]
    same = all(x.scale == xs[0].scale and x.zero == xs[0].zero for x in xs)
    t = concatenated(ctx, node.attr_int("axis"), *(as_int32(x.t) for x in xs))
    if same:
        return Scaled(replace(t, dtype=xs[0].t.dtype) if len({x.t.dtype for x in xs}) == 1 else t, xs[0].scale,
                      xs[0].zero)
    shape = (-1,) + (1,) * (rank - 1 - axis)
    scale = np.concatenate([np.full(x.shape[axis], x.scale.reshape(()).item(), dtype=object) for x in xs])
    zero = np.concatenate([np.full(x.shape[axis], int(x.zero.reshape(())), np.int64) for x in xs])
    return Scaled(t, scale.reshape(shape), zero.reshape(shape))
