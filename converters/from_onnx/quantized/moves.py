"""The ops that only move or select values of a dequantized tensor (MaxPool, Reshape, Slice, ...): the integer rule on
its integers, the scale and zero point kept; ArgMax, ArgMin and TopK, which order them; Shape, Pad, Concat.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np
from onnx import TensorProto

from ..context import INT32, INT_RANGES, const, tight
from ..checks import MAX_DIM
from ..emit import (as_int32, axes_of, broadcast_shape, concatenated, ints, minus_zero, normal, resize_coordinate,
                    resize_scales, resized_shape)
from ..registry import Refuse, float_rule, integer_rule
from ..requant_plans import distinct
from .recurrent import shift
from .values import Deferred, Mapped, Real, Scaled, Summed, of_integers, per_tensor, real_bound, scaled


MOVES = ["MaxPool", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Resize", "Upsample",
         "Identity", "Expand", "Tile", "Gather", "Split", "GlobalMaxPool", "ReduceMax", "ReduceMin", "DepthToSpace",
         "SpaceToDepth", "GatherElements", "GatherND", "ReverseSequence"]
#: The most inputs one output of an antialiased Resize may read along an axis (each tap a take and a product over
#: the output; a linear downscale past 2048x, a cubic one past 1024x, reads more).
MAX_TAPS = 1 << 12


def move_rule(ctx, node, x, *rest):
    """An op that only moves or selects values (MaxPool, GlobalMaxPool, ReduceMax, ReduceMin: the scale is positive,
    so the max of values of one scale is the value of their integers' max): the integer rule on t. A deferred
    Clip passes through (clip then select = select then clip; max commutes with the monotone clip), so a Clip off
    the grid may precede a Resize or MaxPool before the QuantizeLinear."""
    if node.op_type == "Resize" and node.attr_str("mode", "nearest") in ("linear", "cubic"):
        return interpolated_resize(ctx, node, scaled(x, "the Resize input"), *rest)
    if node.op_type in ("ReduceMax", "ReduceMin") and isinstance(x, Summed):
        return reduced_sum(ctx, node, x, *rest)
    if node.op_type in ("ReduceMax", "ReduceMin", "MaxPool", "GlobalMaxPool") and isinstance(x, Mapped):
        return reduced_function(ctx, node, x, *rest)
    x = scaled(x, f"the {node.op_type} input", clipped_ok=True)
    if not x.per_tensor:
        raise Refuse(f"{node.op_type} needs a per-tensor scale and zero point")
    if any(isinstance(r, Real) for r in rest):
        raise Refuse(f"{node.op_type} with a dequantized value as its parameters")
    if node.op_type == "Flatten" and node.attr_int("axis", 1) == 1 and len(x.shape) > 2 and not x.t.is_const:
        shape = (x.shape[0], math.prod(x.shape[1:]))  # CVM's flatten keeps the batch axis (a batched form can grow it)
        return replace(x, t=ctx.result(ctx.emit("flatten", x.t.entry), x.t.dtype, x.t.lo, x.t.hi, shape))
    out = integer_rule(node)(ctx, node, x.t, *rest)
    if not isinstance(out, list):
        return replace(x, t=out)
    return [None if o is None else replace(x, t=o) for o in out]  # MaxPool's Indices: None


for _op in MOVES:
    float_rule(_op, since=1)(move_rule)


def reduced_function(ctx, node, x: Mapped, *rest) -> Mapped:
    """ReduceMax, ReduceMin, MaxPool or GlobalMaxPool of a float function f of one value (Whisper's log-mel, Log
    before its max - 8 floor) that is nondecreasing on its input's integers: max f(x) = f(max x) and min f(x) =
    f(min x), so the op moves x's integers and f applies after. Refused where f is not monotone there."""
    t, z, s = x.x.t, int(x.x.zero.reshape(-1)[0]), float(np.asarray(x.x.scale).reshape(-1)[0])
    if not x.x.per_tensor or t.hi - t.lo >= 1 << 16:
        raise Refuse(f"{node.op_type} of {x.what} must be quantized (QuantizeLinear) first")
    with np.errstate(all="ignore"):
        image = np.asarray(x.fn((np.arange(t.lo, t.hi + 1, dtype=np.int64) - z) * s), np.float64)
    if not (image[1:] >= image[:-1]).all():
        raise Refuse(f"{node.op_type} of {x.what}, not nondecreasing on its input's integers, must be quantized "
                     "(QuantizeLinear) first")
    out = move_rule(ctx, node, x.x, *rest)
    if not isinstance(out, list):
        return Mapped(out, x.fn, x.what)
    return [None if o is None else Mapped(o, x.fn, x.what) for o in out]


def reduced_sum(ctx, node, x: Summed, axes_t=None) -> Summed:
    """ReduceMax, ReduceMin of a sum (a per-sample min-max normalization's x - ReduceMin(x)) whose terms but one are
    constant along the reduced axes (size 1 there): max(a + c) = max(a) + c, as c is the same for every value
    reduced; so the one varying term is reduced by the integer rule (its scale positive), and the others keep their
    integers (reshaped as keepdims says). Refused where two terms vary along the reduced axes."""
    rank = len(x.shape)
    axes = axes_of(node, axes_t, 18)
    if not axes and node.attr_int("noop_with_empty_axes", 0):
        return x
    axes = sorted(set(normal(axes or list(range(rank)), rank)))
    keep = node.attr_int("keepdims", 1)

    def varies(t: Scaled) -> bool:
        shape = (1,) * (rank - len(t.shape)) + t.shape
        return any(shape[a] > 1 for a in axes)

    moving = [t for t in x.terms if varies(t)]
    if len(moving) > 1:
        raise Refuse(f"{node.op_type} of a sum of {len(moving)} terms that vary along the reduced axes (of different "
                     "scales) has no exact CVM form: quantize the sum first")
    out = []
    for t in x.terms:
        t = per_tensor(t, f"a term of the {node.op_type} input")
        if t is moving[0] if moving else False:
            out.append(move_rule(ctx, node, t, *(() if axes_t is None else (axes_t,))))
            continue
        shape = (1,) * (rank - len(t.shape)) + t.shape
        shape = tuple(1 if i in axes else d for i, d in enumerate(shape)) if keep else \
            tuple(d for i, d in enumerate(shape) if i not in axes)
        out.append(replace(t, t=ctx.reshape(t.t, shape)))
    return Summed(tuple(out), broadcast_shape(*(t.t for t in out)))


def interpolated_resize(ctx, node, x: Scaled, roi=None, scales=None, sizes=None) -> Scaled:
    """Resize linear (bilinear, ...) or cubic at rational scales, axis by axis: each output o reads the input
    coordinate num / den (``resize_coordinate``: exact rationals by the coordinate transformation mode) and
    y = sum_k w_k x[j_k] / W_o over its taps, whole weights w_k summing to W_o (``taps``: ONNX's linear and cubic
    interpolation, W_o the same for every output but with cubic exclude_outside; ``filtered_taps``: antialias),
    the indices clamped to the axis (onnxruntime's border, onnx.reference's edge padding). On the integers: a
    ``take`` and a ``broadcast_mul`` per tap, ``broadcast_add``: exactly (t' - W_o z) s / W_o per axis, a scale
    and zero point per output along the axis where W_o differs; refused where a product and the sum of the taps
    pass 32 bits."""
    if x.per_tensor is False:
        raise Refuse("Resize needs a per-tensor scale and zero point")
    if node.opset < 11:
        raise Refuse("Resize linear or cubic before opset 11 has no exact CVM form here")
    if roi is not None and roi.size and node.attr_str("coordinate_transformation_mode", "half_pixel") == \
            "tf_crop_and_resize":
        raise Refuse("Resize tf_crop_and_resize has no CVM form")
    cubic = node.attr_str("mode", "nearest") == "cubic"
    antialias, exclude = node.attr_int("antialias", 0), node.attr_int("exclude_outside", 0)
    full = resized_shape(node, x.t, scales, sizes)
    if len(full) != len(x.shape) or any(not 1 <= o <= MAX_DIM for o in full):
        raise Refuse(f"Resize of {x.shape} to {tuple(full)}: every output axis must hold 1 to 2^24 values")
    factors = resize_scales(node, x.t.shape, full, scales, sizes)
    mode = node.attr_str("coordinate_transformation_mode", "half_pixel")
    a = float(np.float32(node.attr_float("cubic_coeff_a", -0.75))) if cubic else None
    if a is not None and not math.isfinite(a):
        raise Refuse(f"Resize cubic_coeff_a {a} must be finite")
    a = None if a is None else Fraction(a)
    plans = []
    for axis, (d, f, o) in enumerate(zip(x.shape, factors, full)):
        if f == 1 and o == d:
            plans.append(None)
            continue
        coordinate = resize_coordinate(mode, np.arange(o), d, o, f)
        plan = filtered_taps(coordinate, d, f, a, exclude) if antialias else taps(coordinate, a, d if exclude else 0)
        if (plan[1] <= 0).any():
            raise Refuse(f"Resize {node.attr_str('mode')} from {x.shape} to {tuple(full)}: its weights on axis {axis} "
                         "sum to 0 or less at an output (exclude_outside): it has no value there")
        plans.append(plan)
    y, first = Scaled(as_int32(x.t), x.scale.reshape(()), x.zero.reshape(()).astype(np.int64)), True
    for axis, (d, plan, o) in enumerate(zip(x.shape, plans, full)):
        if plan is None:
            continue
        room = 32 - tight(max(int(np.abs(w).max()) for _, w in plan[0])) - (len(plan[0]) - 1).bit_length()
        if tight(y.t.peak) > room:
            if first or room < 2:
                raise Refuse(f"Resize {node.attr_str('mode')} from {x.shape} to {tuple(full)}: its weights on axis "
                             f"{axis} (over {common(plan[1]) or f'up to {plan[1].max()}'}) times integers up to "
                             f"{y.t.peak} need more than 32 bits")
            y = rounded(ctx, y, room, plans[axis:], node, x, full)
        y, first = interpolated(ctx, y, axis, d, plan, o), False
    return y


def rounded(ctx, y: Scaled, room: int, later: list, node, x: Scaled, full) -> Scaled:
    """y's integers u = t - z rounded to 2^k of them, round_half_up(u / 2^k) at scale s 2^k (``recurrent.shift``),
    k the fewest bits that bring them within ``room`` bits (sign included), where the products of the next axis's
    taps would pass 32 bits (cubic on two axes): each value moves by at most 2^(k-1) s, and the ``later`` axes'
    weights (sum |w_o| / W_o at most G per axis) carry that to at most 2^(k-1) max(s) prod G of the output. Refused
    where that passes half of the input's step (onnxruntime's quantized Resize rounds between its axes to it)."""
    u = minus_zero(ctx, y.t, y.zero)
    k = max(tight(u.peak) - room, 1)
    while tight((u.peak + (1 << (k - 1))) >> k) > room:
        k += 1
    gain = math.prod(largest_gain(p) for p in later if p is not None)
    error = (1 << (k - 1)) * max(distinct(y.scale)[0]) * gain / x.scale.reshape(()).item()
    if error > Fraction(1, 2):
        raise Refuse(f"Resize {node.attr_str('mode')} from {x.shape} to {tuple(full)}: its weights over the axes pass "
                     f"32 bits, and rounding between them moves the output by up to {float(error):.3g} input steps "
                     "(more than 1/2)")
    return Scaled(shift(ctx, u, k), np.asarray(y.scale * (1 << k), dtype=object), np.zeros((), np.int64))


def largest_gain(plan) -> Fraction:
    """The largest sum |w_k| / W_o of an axis's outputs (``taps``, ``filtered_taps``), each distinct pair once."""
    sums = sum(np.abs(w) for _, w in plan[0])
    return max(Fraction(int(a), int(b)) for a, b in set(zip(sums, plan[1])))


def interpolated(ctx, x: Scaled, axis: int, d: int, plan, o: int) -> Scaled:
    """x resized along ``axis`` by the taps of ``plan`` (``taps``, ``filtered_taps``): sum_k w_k x[j_k] at scale
    s / W_o and zero point z W_o."""
    t = x.t
    shape = t.shape[:axis] + (o,) + t.shape[axis + 1:]
    along = (-1,) + (1,) * (len(shape) - axis - 1)
    parts = []
    for idx, w in plan[0]:
        if not w.any():
            continue
        e = ctx.result(ctx.emit("take", ctx.entry(t), ctx.entry(const(np.clip(idx, 0, d - 1).astype(np.int32),
                                                                         INT32)), axis=axis),
                       INT32, t.lo, t.hi, shape)
        ends = [t.lo * int(w.min()), t.lo * int(w.max()), t.hi * int(w.min()), t.hi * int(w.max()), 0]
        wc = const(w.reshape(along).astype(np.int32), INT32)
        parts.append(ctx.result(ctx.op("broadcast_mul", e, wc), INT32, min(ends), max(ends), shape))
    y = parts[0]
    for p in parts[1:]:
        y = ctx.result(ctx.op("broadcast_add", y, p), INT32, y.lo + p.lo, y.hi + p.hi, shape)
    weights = plan[1]
    if all((w >= 0).all() for _, w in plan[0]):  # a weighted mean of x times W_o
        ends = [t.lo * int(weights.min()), t.lo * int(weights.max()), t.hi * int(weights.min()),
                t.hi * int(weights.max())]
        y = replace(y, lo=max(y.lo, min(ends)), hi=min(y.hi, max(ends)))
    w = common(weights)
    if w is not None:
        return Scaled(y, np.asarray(x.scale / w, dtype=object), np.asarray(x.zero * w, np.int64))
    values, index = distinct(weights)  # each distinct W_o's scale made once, then one per output
    scale = np.asarray(x.scale / values.reshape(along), dtype=object)
    zero = np.asarray(x.zero * values.reshape(along), np.int64)
    return Scaled(y, np.take(scale, index, scale.ndim - len(along)), np.take(zero, index, zero.ndim - len(along)))


def common(weights: np.ndarray) -> int | None:
    """The one sum W_o of an axis's weights where every output has it, else None."""
    return int(weights[0]) if (weights == weights[0]).all() else None


def taps(coordinate: tuple[np.ndarray, int], a: Fraction | None, exclude: int = 0
         ) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """([(input index, integer weight) per tap], W_o per output) of outputs at coordinates num / den: linear (``a``
    None): x[i] by den - r and x[i + 1] by r, W = den; cubic with coefficient A = p / q: x[i - 1 + k] by
    W c_k(r / den), W = q den^3, c_0 = A u^3 - 5A u^2 + 8A u - 4A (u = 1 + t), c_1 = (A + 2) t^3 - (A + 3) t^2 + 1,
    c_2 and c_3 the same of 1 - t (ONNX's coefficients, summing to 1), in integers of r, den, p, q. Cubic with
    ``exclude`` (exclude_outside; the axis's size): the taps outside [0, size) weigh 0, W_o the sum of the rest."""
    num, den = coordinate
    low = num // den
    r = num - low * den
    if a is None:
        return [(low, den - r), (low + 1, r)], np.full(len(num), den, dtype=object)
    p, q = a.numerator, a.denominator

    def near(v):  # W c(v / den) for |v / den| <= 1
        return (p + 2 * q) * v ** 3 - (p + 3 * q) * v ** 2 * den + q * den ** 3

    def far(v):  # W c(v / den) for 1 <= v / den <= 2
        return p * (v ** 3 - 5 * v ** 2 * den + 8 * v * den ** 2 - 4 * den ** 3)

    r = whole(r, 2 * den, a)
    out = [(low - 1 + k, np.array(w, dtype=object)) for k, w in
           enumerate([far(r + den), near(r), near(den - r), far(2 * den - r)])]
    if exclude:
        out = [(i, np.where((i >= 0) & (i < exclude), w, 0)) for i, w in out]
        return balanced(out)
    return out, np.full(len(num), q * den ** 3, dtype=object)


def filtered_taps(coordinate: tuple[np.ndarray, int], size: int, scale: Fraction, a: Fraction | None,
                  exclude: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Resize with antialias (onnxruntime's filter): output o at coordinate c = num / den weighs input j by
    F((j - c) g), g = min(scale, 1) = gp / gq: F(v) = max(1 - |v|, 0) (linear) or ONNX's cubic coefficient of |v|
    (0 past 2), over the j with |j - c| < support / g (support 1, cubic 2), refused past ``MAX_TAPS`` of them;
    divided by their sum (exclude_outside: of the j in [0, size) only; else the others' weights go to the clamped
    index, the border). In integers:
    v = m / D with D = den gq, m = (j den - num) gp; linear D - |m|, cubic q_A D^3 F, over W_o their sum; each
    output's weights and W_o balanced (``balanced``)."""
    num, den = (np.asarray(v, dtype=object) for v in coordinate)
    g = min(scale, Fraction(1))
    gp, gq = g.numerator, g.denominator
    reach = (1 if a is None else 2) * den * gq  # |j - c| < reach / (den gp)
    low = (num * gp - reach) // (den * gp) + 1
    high = -((-(num * gp + reach)) // (den * gp))  # j < ceil((num gp + reach) / (den gp))
    count = int((high - low).max())
    if count > MAX_TAPS:
        raise Refuse(f"Resize with antialias from {size} to {len(num)} values along an axis reads {count} inputs per "
                     f"output, past the {MAX_TAPS} this import takes (a take and a product each): resize in steps")
    big = int(den) * gq
    out = []
    for k in range(count):
        j = low + k
        v = whole(np.abs((j * den - num) * gp), 2 * big + int(den) * gp, a)  # v < reach + den gp
        if a is None:
            w = np.where(v < big, big - v, 0)
        else:
            p, q = a.numerator, a.denominator
            near = (p + 2 * q) * v ** 3 - (p + 3 * q) * v ** 2 * big + q * big ** 3
            far = p * (v ** 3 - 5 * v ** 2 * big + 8 * v * big ** 2 - 4 * big ** 3)
            w = np.where(v < big, near, np.where(v < 2 * big, far, 0))
        if exclude:
            w = np.where((j >= 0) & (j < size), w, 0)
        out.append((j.astype(np.int64), w.astype(object)))
    return balanced(out)


def whole(v: np.ndarray, top: int, a: Fraction | None) -> np.ndarray:
    """The integers v (0 <= v <= ``top``, and the kernel's scale up to ``top``) as int64 where every term of the
    kernel's integer form of them (``taps``, ``filtered_taps``: A = p / q, linear p = 0, q = 1) stays within
    18 (|p| + q) top^3 < 2^62, else as Python ints: the same integers either way."""
    p, q = (0, 1) if a is None else (a.numerator, a.denominator)
    return v.astype(np.int64 if 18 * (abs(p) + q) * top ** 3 < 1 << 62 else object)


def balanced(out: list[tuple[np.ndarray, np.ndarray]]) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Taps of whole weights (object arrays) and their sums W_o per output, each output's divided by their gcd and
    then times the power of two that brings W_o within a factor 2 of the axis's largest W (so the requantization's
    ratios s / W_o over an axis span at most 2x, and so do its integers' ranges)."""
    total = sum(w for _, w in out)
    g = functools.reduce(np.gcd, (w for _, w in out))
    g = np.where(g == 0, 1, g)
    total = total // g
    top = max(total)
    lift = np.array([1 << ((top // t).bit_length() - 1) if t > 0 else 1 for t in total], dtype=object)
    return [(i, w // g * lift) for i, w in out], total * lift


@float_rule("Shape", since=1)
def shape_rule(ctx, node, x):
    """The static shape of a dequantized value (shape arithmetic, folded at import)."""
    return integer_rule(node)(ctx, node, x)  # it reads only x.shape


@float_rule("Pad", since=11)
def pad_rule(ctx, node, x, pads=None, value=None, axes=None):
    """Pad with a real value v: the integer value v / s + z where that is a whole number within the input's type;
    else (v off the input's grid or past its range) padded by the QuantizeLinear that follows (``Padded``)."""
    x = per_tensor(scaled(x, "the Pad input"), "Pad")
    v = Fraction(0) if value is None else real_bound(value, "Pad constant_value")
    q = v / x.scale.reshape(()).item() + int(x.zero.reshape(()))
    lo, hi = INT_RANGES[x.t.dtype]
    if q.denominator != 1 or not lo <= q <= hi:
        widths = ints(pads, "Pad pads")
        padded = normal(ints(axes, "Pad axes") or list(range(len(x.shape))), len(x.shape))
        if len(widths) != 2 * len(padded):
            raise Refuse(f"Pad pads {widths} must hold 2 values per padded axis ({len(padded)} axes)")
        shape = list(x.shape)
        for a, b, e in zip(padded, widths[:len(padded)], widths[len(padded):]):
            shape[a] += b + e
        return Padded(x, node, pads, axes, np.float32(float(v)), tuple(shape))
    fill = const(np.array([int(q)], np.int64), x.t.dtype)
    return replace(x, t=integer_rule(node)(ctx, node, x.t, pads, fill, axes))


@dataclass(frozen=True, eq=False)
class Padded(Deferred):
    """Pad of x with a float32 value v off x's grid, made integers by the QuantizeLinear that follows: x's
    integers requantized to its grid (elementwise, so before the Pad as after it) padded with v's integer there,
    saturate(round_half_even(v / scale) + zero) in float32 as onnxruntime quantizes v."""

    x: Scaled
    node: object
    pads: object
    axes: object
    value: np.float32
    shape: tuple[int, ...]
    what: str = "Pad"

    def quantized(self, ctx, scale: np.ndarray, out_zero: int, dtype: int):
        from .qdq import quantize, quantized_constant
        if scale.size != 1:
            raise Refuse("Pad with a per-channel output scale has no CVM form")
        zero = np.array(out_zero, np.int64)
        t = quantize(ctx, self.x, scale, zero, dtype)
        fill = quantized_constant(const(np.array([self.value], np.float32), TensorProto.FLOAT), scale.reshape(1),
                                  zero.reshape(1), 0, dtype)
        return integer_rule(self.node)(ctx, self.node, t, self.pads, fill, self.axes)


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


def ordered(node, x) -> Scaled:
    """``x``, a dequantized value whose order along the node's axis is its integers': (t - z) * s with s > 0 and z
    the same along the axis. DequantizeLinear's float32 product rounds monotonically, and for |t - z| <= 2^17 one
    step s exceeds float32's spacing there, so t1 < t2 <=> their values are, and equal values are equal t."""
    x = scaled(x, f"the {node.op_type} input")
    rank = len(x.shape)
    axis = normal([node.attr_int("axis", -1 if node.op_type in ("TopK", "Hardmax") else 0)], max(rank, 1))[0]
    for what, v in (("scale", x.scale), ("zero point", x.zero)):
        v = v.reshape((1,) * (rank - v.ndim) + v.shape)
        if rank and v.shape[axis] > 1 and (v != np.take(v, [0], axis=axis)).any():
            raise Refuse(f"{node.op_type} along axis {axis}, which has a {what} per channel: their order is not "
                         "their integers'")
    return x


@float_rule("ArgMax", "ArgMin", since=1)
def arg_extreme_rule(ctx, node, x):
    """ArgMax, ArgMin of a dequantized value: of its integers (``ordered``); the indices are integers."""
    return integer_rule(node)(ctx, node, ordered(node, x).t)


@float_rule("Hardmax", since=13)
def hardmax_rule(ctx, node, x):
    """Hardmax of a dequantized value: of its integers (``ordered``): 1 at the first max, 0 elsewhere, at scale 1."""
    return of_integers(integer_rule(node)(ctx, node, ordered(node, x).t))


@float_rule("TopK", since=10)
def topk_rule(ctx, node, x, k):
    """TopK of a dequantized value: of its integers (``ordered``), the values at x's scale and zero point."""
    x = ordered(node, x)
    if isinstance(k, Real):
        raise Refuse("TopK k must be a constant integer")
    values, indices = integer_rule(node)(ctx, node, x.t, k)
    return [replace(x, t=values), indices]
