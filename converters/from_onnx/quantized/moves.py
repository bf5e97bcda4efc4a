"""The ops that only move or select values of a dequantized tensor (MaxPool, Reshape, Slice, ...): the integer rule on
its integers, the scale and zero point kept; Shape, Pad, Concat.
"""
from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import numpy as np

from ..context import INT32, const, tight
from ..checks import MAX_DIM
from ..emit import as_int32, concatenated, normal, resized_shape
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
    """Resize linear (bilinear, ...) at rational scales, axis by axis: each output o reads the input coordinate
    num / den (``linear_coordinate``: exact rationals by the coordinate transformation mode), i = floor(num / den),
    r = num - i den, and y = ((den - r) x[i] + r x[i + 1]) / den, the indices clamped to the axis (onnxruntime's
    border). On the integers: two ``take``s, ``broadcast_mul`` by the integer weights den - r and r,
    ``broadcast_add``: exactly (t' - den z) s / den per axis, weights summing to den; refused where a product and
    its sum pass 32 bits (precision(t) + precision(den) + 1). Cubic is refused."""
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
    if len(full) != len(x.shape) or any(not 1 <= o <= MAX_DIM for o in full):
        raise Refuse(f"Resize of {x.shape} to {tuple(full)}: every output axis must hold 1 to 2^24 values")
    factors = resize_scales(node, x.t.shape, full, scales, sizes)
    mode = node.attr_str("coordinate_transformation_mode", "half_pixel")
    t, zero, scale = as_int32(x.t), int(x.zero.reshape(())), x.scale.reshape(()).item()
    coordinates = [None if f == 1 and o == d else linear_coordinate(mode, np.arange(o), d, o, f)
                   for d, f, o in zip(x.shape, factors, full)]
    peak = max(-t.lo, t.hi)
    for axis, c in enumerate(coordinates):
        if c is not None:
            if tight(peak) + tight(c[1]) + 1 > 32:
                raise Refuse(f"Resize linear from {x.shape} to {tuple(full)}: its weights on axis {axis} (denominator "
                             f"{c[1]}) times integers up to {peak} need more than 32 bits")
            peak *= c[1]
    for axis, (d, c, o) in enumerate(zip(x.shape, coordinates, full)):
        if c is None:
            continue
        num, den = c
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


def resize_scales(node, shape: tuple[int, ...], full: list[int], scales, sizes) -> list[Fraction]:
    """The scale ONNX Resize uses per axis in its coordinates, exactly: out / size where ``sizes`` are given, else the
    float ``scales`` value (1 on the axes not listed)."""
    if sizes is not None and sizes.size:
        return [Fraction(o, d) if d else Fraction(1) for o, d in zip(full, shape)]
    rank = len(shape)
    out = [Fraction(1)] * rank
    for a, v in zip(normal(node.attr_ints("axes", list(range(rank))), rank), scales.value.reshape(-1)):
        if not v > 0:
            raise Refuse(f"Resize scale {v} must be > 0")
        out[a] = Fraction(float(v))
    return out


def linear_coordinate(mode: str, o: np.ndarray, size: int, out: int, scale: Fraction) -> tuple[np.ndarray, int]:
    """The input coordinate num / den (integers) ONNX Resize reads for outputs ``o`` at ``scale`` = p / q, exactly:
    half_pixel (o + 1/2) / scale - 1/2 = ((2o + 1) q - p) / 2p (pytorch_half_pixel: the same where out > 1, else
    0; half_pixel_symmetric: the same where size * scale is a whole number), asymmetric o q / p, align_corners
    o (size - 1) / (out - 1) (0 where out = 1), tf_half_pixel_for_nn (o + 1/2) / scale."""
    p, q = scale.numerator, scale.denominator
    if mode == "half_pixel_symmetric" and (size * scale).denominator != 1:
        raise Refuse(f"Resize half_pixel_symmetric where {size} x scale {float(scale)} is not a whole number has no "
                     "exact CVM form here")
    if mode in ("half_pixel", "half_pixel_symmetric") or (mode == "pytorch_half_pixel" and out > 1):
        return (2 * o + 1) * q - p, 2 * p
    if mode == "pytorch_half_pixel" or (mode == "align_corners" and out == 1):
        return 0 * o, 1
    if mode == "align_corners":
        return o * (size - 1), out - 1
    if mode == "asymmetric":
        return o * q, p
    if mode == "tf_half_pixel_for_nn":
        return (2 * o + 1) * q, 2 * p
    raise Refuse(f"Resize linear with coordinate_transformation_mode={mode} has no exact CVM form")


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
