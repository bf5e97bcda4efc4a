"""The products and sums of dequantized values: Conv, ConvTranspose, MatMul, Gemm (int32 accumulation at scale
s_x * s_w), AveragePool, GlobalAveragePool, ReduceMean.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Callable

import numpy as np
from onnx import TensorProto, helper

from cvm_onnx.core.constants import INT32_MAX
from cvm_onnx.core.format.onnx_safety import MAX_ELEMENTS

from ..checks import MAX_DIM
from ..context import INT32, Tensor, TooWide, const, foldable, tight, type_name
from ..emit import (aligned, as_2d, as_int32, axes_of, broadcast_of, concatenated, conv_window, cropped,
                    depth_folded, depth_unfolded, minus_zero, nearest, normal, one_value_axes, onnx_pads, reduced,
                    select, single_axes, spatial_2d, strided_slice, summed_windows, transposed, with_ones, without)
from ..registry import Refuse, float_rule, integer_rule, rule
from .qdq import quantize
from .values import FAR, Mapped, Scaled, per_tensor, scaled, sum_of
MAX_MATRICES = 4096  # matrix products (dense nodes) of one MatMul of two computed tensors
MAX_WINDOW_SUMS = 1 << 22  # values of a padded convolution's window sums (a constant per output position)
ROW_BLOCK = 1 << 18  # values of a weight matrix's block of rows that signed_sums reads at once


def halves(ctx, x: Tensor) -> tuple[list[Tensor], int]:
    """(parts, c): 8-bit tensors summing to x - c. x itself when it fits 8 bits; else c centres x's interval and
    the parts are ceil((x - c) / 2) (cvm_right_shift by 1 rounds half up) and the rest, floor((x - c) / 2)."""
    if tight(x.peak) <= 8:
        return [x], 0
    c = (x.lo + x.hi + 1) // 2
    lo, hi = x.lo - c, x.hi - c
    if max(-lo, hi) > 254:
        raise Refuse(f"a product operand of {x.hi - x.lo + 1} values (in [{x.lo}, {x.hi}]): CVM's conv2d and "
                     f"dense take 8-bit operands, two halves hold at most 509 values")
    if c:
        cc = const(np.array(c, np.int32), INT32)
        x = ctx.apply("broadcast_sub", x, cc, shape=x.shape)
    h = ctx.apply("cvm_right_shift", x, shape=x.shape, precision=8, shift_bit=1)
    g = ctx.result(ctx.op("broadcast_sub", x, h), INT32, lo // 2, hi // 2, x.shape)
    return [h, g], c


def weight_parts(w: np.ndarray, what: str) -> list[np.ndarray]:
    """w as 8-bit parts: itself, or clip(w, -127, 127) and the rest."""
    if max(-int(w.min(initial=0)), int(w.max(initial=0))) <= 127:
        return [w]
    first = np.clip(w, -127, 127)
    if np.abs(w - first).max() > 127:
        raise Refuse(f"{what} minus its zero point reaches {int(np.abs(w).max())}: CVM's products take 8 bits")
    return [first, w - first]


def grouped_concat(ctx, parts: list[Tensor], groups: int) -> Tensor:
    """Concatenate (N, C, ...) parts along the channels, group by group (part 0's channels of group g, part 1's,
    ...), so a grouped conv2d sees every part of its group."""
    if len(parts) == 1:
        return parts[0]
    n, c = parts[0].shape[:2]
    rest = parts[0].shape[2:]
    if groups > 1:
        parts = [ctx.reshape(p, (n, groups, c // groups) + rest) for p in parts]
    axis = 2 if groups > 1 else 1
    shape = list(parts[0].shape)
    shape[axis] *= len(parts)
    y = ctx.result(ctx.op("concatenate", *parts, axis=axis), INT32, min(p.lo for p in parts),
                   max(p.hi for p in parts), tuple(shape))
    return ctx.reshape(y, (n, c * len(parts)) + rest)


def weight(w: Scaled, what: str, transpose: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(w - zero as int64 with the output channels first, the scale of each output channel) of a constant weight
    quantized per tensor or per output channel; ``transpose``: a (K, N) matrix."""
    if not w.t.is_const:
        raise Refuse(f"{what} is computed at run time: CVM's conv2d and dense need a constant weight here")
    v = w.t.value.astype(np.int64) - w.zero
    if v.ndim == 0 or v.size == 0:
        raise Refuse(f"{what} of shape {tuple(v.shape)}: a weight holds values along its output channels")
    scale = np.asarray(w.scale, dtype=object)
    scale = scale.reshape((1,) * (v.ndim - scale.ndim) + scale.shape)  # the scale's own shape, at v's rank
    if transpose:
        v, scale = v.T, scale.T
    rows = np.broadcast_to(scale, (len(v),) + scale.shape[1:]).reshape(len(v), -1)
    if not (rows == rows[:, :1]).all():
        raise Refuse(f"{what} is quantized along an axis other than its output channels")
    return v, rows[:, 0].copy()


def accumulate(ctx, x: Scaled, w: np.ndarray, sw: np.ndarray, bias: Scaled | None, op: str, groups: int = 1,
               valid: np.ndarray | Banded | None = None, window: Callable[[Tensor], Tensor] | None = None,
               **attrs) -> tuple[Tensor, np.ndarray, np.ndarray]:
    """sum (x - z) * w (+ bias) in int32 by conv2d or dense: (the accumulator, its scale s_x * s_w per row, the
    zero point per row: minus the bias of a row that no conv2d label holds, |bias| >= 2^30, kept out of it: a
    dead channel's, whose weight scale is tiny and bias huge; the QuantizeLinear settles such rows, ``settle``).
    x's 8-bit parts (x - c) times w's parts, concatenated along the reduced axis; then
    sum (x - z) w = sum (x - c) w + (c - z) V, V the sum of the weights a window reads inside the input: per
    output channel (conv2d's int32 bias) where it is the same at every position, else a (C, H, W) param (or one
    per band, ``Banded``) added after ``window`` (the strided_slice picking ONNX's outputs among conv2d's, which
    pads with zeros)."""
    x = per_tensor(x, f"the input of {op}")
    sx, z = x.scale.reshape(()).item(), int(x.zero.reshape(()))
    wparts = weight_parts(w, "the weight")
    copies = (1 if tight(x.t.peak) <= 8 else 2) * len(wparts)
    if copies > 1 and x.t.size * copies > MAX_ELEMENTS:
        raise Refuse(f"the input of {op} as {copies} 8-bit parts (its 9-bit values in halves, times the weight's "
                     f"parts) would hold {x.t.size * copies} values (more than 2^30)")
    xparts, c = halves(ctx, as_int32(x.t))
    rows = w.reshape(len(w), -1)
    b = np.zeros(len(w), np.int64)
    if bias is not None:
        b = bias_values(bias, sx * sw, len(w))
    uniform = valid is None or not isinstance(valid, Banded) and bool((valid == valid[:, :1, :1]).all())
    total = b + (c - z) * (rows.sum(axis=1) if valid is None else valid[:, 0, 0] if uniform else 0)
    excess = np.where(np.abs(total) >= FAR, total, 0)
    b, total = b - excess, total - excess
    ins = grouped_concat(ctx, [p for p in xparts for _ in wparts], groups)
    weights = np.concatenate([p.astype(np.int8) for _ in xparts for p in wparts], axis=1)
    xlo, xhi = min(x.t.lo - z, 0), max(x.t.hi - z, 0)
    pos, neg = signed_sums(rows)
    lo, hi = int((pos * xlo + neg * xhi + b).min()), int((pos * xhi + neg * xlo + b).max())
    args = [ctx.narrow(ins, 8, f"the input of {op}"), ctx.entry(const(weights, TensorProto.INT8))]
    if np.abs(total).max() > INT32_MAX:
        raise Refuse("the bias with the zero point's correction passes 32 bits")
    if total.any():
        args.append(ctx.entry(const(total.astype(np.int32), INT32)))
    extent = max(abs(x.t.lo - c), abs(x.t.hi - c))
    bare = int(((pos - neg) * extent).max())
    try:
        e = product(ctx, op, args, groups, len(w), attrs)
    except TooWide:
        if chunks_of(ctx, args, groups) is not None:
            e = product_in_chunks(ctx, op, ins, args, weights, attrs, bare, total, groups)
        elif not total.any():
            raise
        else:
            e = biased_apart(ctx, op, args, groups, len(w), attrs, bare, total)
    reach = int(((pos - neg) * extent + np.abs(total)).max())
    y = ctx.result(e, INT32, -reach, reach)  # every conv2d output, those window drops included
    if window is not None:
        y = window(y)
    if isinstance(valid, Banded):
        y = add_banded(ctx, y, valid, c - z, lo, hi)
    elif not uniform:
        corr = const(((c - z) * valid).astype(np.int32), INT32)
        y = ctx.result(ctx.op("broadcast_add", y, corr), INT32, lo, hi, y.shape)
    return ctx.result(y.entry, INT32, lo, hi, y.shape), np.asarray(sx * sw, dtype=object), -excess


def signed_sums(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the sum of the positive values, the sum of the negative values) of each row of an int64 matrix, a block
    of rows at a time: no temporary of the matrix's size."""
    pos, neg = np.zeros(len(rows), np.int64), np.zeros(len(rows), np.int64)
    step = max(1, ROW_BLOCK // max(rows.shape[1], 1))
    for i in range(0, len(rows), step):
        block = rows[i:i + step]
        pos[i:i + step] = np.clip(block, 0, None).sum(axis=1)
        neg[i:i + step] = np.clip(block, None, 0).sum(axis=1)
    return pos, neg


def product(ctx, op: str, args: list, groups: int, units: int, attrs: dict):
    """conv2d or dense of ``args`` (data, weight[, bias])."""
    if op == "conv2d":
        return ctx.emit(op, *args, use_bias=len(args) > 2, groups=groups, **attrs)
    return ctx.emit(op, *args, use_bias=len(args) > 2, units=units)


def biased_apart(ctx, op: str, args: list, groups: int, units: int, attrs: dict, bare: int, total: np.ndarray):
    """conv2d or dense whose bias would take its output's precision past 32 bits (the runtime's rule: max(p_data +
    p_weight + bits(K), p_bias) + 1; a 9-bit input in halves doubles K: VGG's 25088-input dense reached 33): the
    product without the bias, its label narrowed to what its values reach (|sum| <= ``bare``, by the weights' row
    sums: a cvm_clip the interval proves exact), then the bias added by broadcast_add, per output channel. The same
    integers; refused as before where the product alone, or the sum, still passes 32 bits."""
    e = product(ctx, op, args[:2], groups, units, attrs)
    y = ctx.narrow(ctx.result(e, INT32, -bare, bare), tight(bare), f"{op} sum")
    b = total.astype(np.int32).reshape((-1, 1, 1) if op == "conv2d" else (-1,))
    return ctx.emit("broadcast_add", y, ctx.entry(const(b, INT32)))


def chunks_of(ctx, args: list, groups: int = 1) -> list[range] | None:
    """The runs of a product's input channels per group (dense: its reduced axis K; conv2d: the channels of each
    group, each taking kh kw terms) that each keep the runtime's rule p_data + p_weight + bits(K) within 32 bits (at
    most 2^(32 - p_data - p_weight) - 1 terms apiece, in equal runs), where the whole K passes it; None where it does
    not, or where one channel alone would."""
    shape = ctx.type_of(args[1]).shape
    most = (1 << (32 - ctx.type_of(args[0]).precision - ctx.type_of(args[1]).precision)) - 1
    per = math.prod(shape[2:])
    if shape[1] * per <= most or per > most:
        return None
    n = -(-shape[1] // (most // per))
    return [range(i * shape[1] // n, (i + 1) * shape[1] // n) for i in range(n)]


def product_in_chunks(ctx, op: str, ins: Tensor, args: list, weights: np.ndarray, attrs: dict, bare: int,
                      total: np.ndarray, groups: int = 1):
    """dense or conv2d whose reduced axis K (of a grouped conv2d: one group's) alone takes its output past 32 bits
    by the runtime's rule (p_data + p_weight + bits(K): MEGnet's 45411-input dense, its 9-bit input in halves,
    K = 90822, 33 bits): one product per run of the input channels (``chunks_of``; strided_slice of the input, of a
    grouped conv2d the run's channels of every group, a grouped conv2d by the run's weights), each narrowed to what
    its values reach (|sum| <= the largest sum of |w| over the run's weights of an output, times the input's peak: a
    cvm_clip the interval proves exact), summed by broadcast_add, the running sum narrowed likewise and at the end
    to |sum| <= ``bare`` (the whole product's bound), then the bias (``total``) added as in ``biased_apart``. The
    same integers: every partial sum is an exact int32; refused where a narrowed sum or the bias's sum still passes
    32 bits."""
    whole = ctx.result(args[0], INT32, ins.lo, ins.hi, ins.shape)
    n, c, rest = ins.shape[0], ins.shape[1], ins.shape[2:]
    axis = 1 if groups == 1 else 2  # a grouped conv2d's input as (N, groups, C / groups, H, W)
    if groups > 1:
        whole = ctx.reshape(whole, (n, groups, c // groups) + rest)
    acc, reach = None, 0
    for r in chunks_of(ctx, args, groups):
        part = strided_slice(ctx, whole, [r if i == axis else range(d) for i, d in enumerate(whole.shape)])
        if groups > 1:
            part = ctx.reshape(part, (n, groups * len(r)) + rest)
        w = np.ascontiguousarray(weights[:, r.start:r.stop])
        top = int(np.abs(w.reshape(len(w), -1).astype(np.int64)).sum(axis=1).max()) * ins.peak
        e = product(ctx, op, [part.entry, ctx.entry(const(w, TensorProto.INT8))], groups, len(w), attrs)
        y = ctx.result(e, INT32, -top, top)
        if acc is not None:
            reach += top
            y = ctx.result(ctx.op("broadcast_add", acc, y), INT32, -reach, reach, y.shape)
        else:
            reach = top
        lim = min(reach, bare)  # each output's partial sum lies within its whole sum's bound too
        y = ctx.result(y.entry, INT32, -lim, lim, y.shape)
        acc = ctx.result(ctx.narrow(y, tight(lim), f"{op} sum"), INT32, -lim, lim, y.shape)
    if not total.any():
        return acc.entry
    b = total.astype(np.int32).reshape((-1, 1, 1) if op == "conv2d" else (-1,))
    return ctx.emit("broadcast_add", acc.entry, ctx.entry(const(b, INT32)))


@dataclass(frozen=True)
class Banded:
    """The window sums V (O, H', W') of a large padded convolution by bands along one spatial axis (``axis`` 0:
    rows, 1: columns): ``parts`` the index ranges along it, each with its constant: the outputs whose windows
    reach the padding at the begin and at the end, their V in full, and those between, whose windows lie inside
    the image along that axis, one pattern (O, 1, W') or (O, H', 1) that every one of them shares."""
    axis: int
    parts: tuple[tuple[range, np.ndarray], ...]


def window_mask(n: int, kk: int, s: int, d: int, b: int, rows: range) -> np.ndarray:
    """(len(rows), kk) along one spatial axis of n inputs: 1 where tap k of output o's window (o in ``rows``) reads
    inside the image, 0 <= o s - b + k d < n."""
    at = np.arange(rows.start, rows.stop, dtype=np.int64)[:, None] * s - b + np.arange(kk, dtype=np.int64) * d
    return ((at >= 0) & (at < n)).astype(np.int64)


def inside(n: int, kk: int, s: int, d: int, b: int, out: int) -> range:
    """The outputs along one axis whose every tap reads inside the image: o s - b >= 0 and o s - b + (kk - 1) d
    < n, one run of outputs, from the shapes alone."""
    return range(max(0, -(-b // s)), min(out, (n - 1 - (kk - 1) * d + b) // s + 1))


def window_sums(w: np.ndarray, size: tuple[int, int], strides, dilations, begin, outs,
                banded: bool = False) -> np.ndarray | Banded:
    """V (O, H', W'): for each output of a padded convolution, the sum of the weights whose input lies inside the
    image (the padding reads zeros). Above MAX_WINDOW_SUMS values, with ``banded`` V by bands (``Banded``) along
    the axis whose constants are fewer, refused from the shapes where those are above it too (before computing
    any mask)."""
    o, n = len(w), len(w) * math.prod(outs)
    axes = list(zip(size, w.shape[2:], strides, dilations, begin))
    sums = w.sum(axis=1)
    if n <= MAX_WINDOW_SUMS:
        return np.einsum("okl,ik,jl->oij", sums, *(window_mask(*a, range(out)) for a, out in zip(axes, outs)),
                         optimize=True)
    best = None
    for axis in (0, 1) if banded else ():
        mid = inside(*axes[axis], outs[axis])
        if len(mid):  # one run of outputs between the bands
            count = o * outs[1 - axis] * (outs[axis] - len(mid) + 1)
            if count <= MAX_WINDOW_SUMS and (best is None or count < best[0]):
                best = (count, axis, mid)
    if best is None:
        raise Refuse(f"the padded convolution's zero-point correction (its window sums) would be a constant of "
                     f"{o} x {outs[0]} x {outs[1]} = {n} values (at most 2^22{', in bands too' if banded else ''}): "
                     f"the input is too large here")
    _, axis, mid = best
    across = window_mask(*axes[1 - axis], range(outs[1 - axis]))
    parts = []
    for r in (range(mid.start), mid, range(mid.stop, outs[axis])):
        if len(r):
            along = window_mask(*axes[axis], r if r is not mid else range(mid.start, mid.start + 1))
            m = (along, across) if axis == 0 else (across, along)
            parts.append((r, np.einsum("okl,ik,jl->oij", sums, *m, optimize=True)))
    return Banded(axis, tuple(parts))


def add_banded(ctx, y: Tensor, v: Banded, factor: int, lo: int, hi: int) -> Tensor:
    """y (N, O, H', W') + factor V by bands: each band's `strided_slice` of y, `broadcast_add` of its constant
    (the pattern broadcast over the outputs between the bands), `concatenate` along the axis."""
    out = []
    for r, part in v.parts:
        ranges = [range(d) for d in y.shape]
        ranges[2 + v.axis] = r
        t = strided_slice(ctx, y, ranges)
        corr = const((factor * part).astype(np.int32), INT32)
        out.append(ctx.result(ctx.op("broadcast_add", t, corr), INT32, lo, hi, t.shape))
    return concatenated(ctx, 2 + v.axis, *out)


def bias_values(bias: Scaled, acc_scale: np.ndarray, n: int) -> np.ndarray:
    """The bias as integers at the accumulator's scale s_x * s_w (as onnxruntime's QLinearConv adds it): its own
    scale must be that product to float32 rounding (a denormal float32 holds it to 2^-149 only). A bias of any rank
    that varies along its last axis only ((1, 1, C), (1, C): one value per output, as broadcasting reads it) is
    that (C,)."""
    if not bias.t.is_const:
        raise Refuse("the bias is computed at run time: CVM needs a constant bias")
    shape = bias.t.shape
    if bias.t.size not in (1, n) or any(d != 1 for d in shape[:-1]):
        raise Refuse(f"a bias of shape {shape} for {n} outputs: one value per output channel, (C,) or (1, ..., C)")
    full = broadcast_of(shape, bias.zero.shape, bias.scale.shape)
    if math.prod(full) != bias.t.size:
        raise Refuse(f"a bias of shape {shape} dequantized by a scale of shape {bias.scale.shape}: one scale per "
                     "bias value")
    v = np.broadcast_to((bias.t.value.astype(np.int64) - bias.zero).reshape(-1), (n,))
    s = np.broadcast_to(np.broadcast_to(bias.scale, full).reshape(-1), (n,))
    for have, want in zip(s, acc_scale):  # float32 rounding of the product: 2^-22 relative, or a denormal's step
        if not at_scale(have, want):
            raise Refuse(f"the bias scale {float(have):.9g} is not input scale x weight scale ({float(want):.9g})")
    return v.copy()


def dense(ctx, x: Scaled, w: np.ndarray, sw: np.ndarray, bias: Scaled | None) -> Scaled:
    """x (..., K) times w (N, K)^T: rows flattened, dense, reshaped back; scale s_x * s_w along the last axis."""
    x = per_tensor(x, "the input of a Gemm or MatMul (dense)")
    if not x.shape:
        raise Refuse("a scalar times a matrix: MatMul and Gemm multiply tensors of rank 1 or more")
    k = x.shape[-1]
    rows = Scaled(ctx.reshape(x.t, (math.prod(x.shape[:-1]), k)), x.scale.reshape(()), x.zero.reshape(()))
    acc, scale, zero = accumulate(ctx, rows, w, sw, bias, "dense")
    return Scaled(ctx.reshape(acc, x.shape[:-1] + (len(w),)), scale, zero if zero.any() else np.zeros((), np.int64))


def padding(ctx, w: np.ndarray, size: tuple[int, int], strides, dilations, begin, end, banded: bool = False) -> dict:
    """conv2d's symmetric padding for ONNX pads (begin, end): the aligned padding, the strided_slice of ONNX's
    outputs (aligned, select) and the window sums V where some window reads padding (``banded``: by bands where
    large, as ``window_sums``)."""
    plans = [aligned(n, d * (k - 1) + 1, s, b, e)
             for n, k, s, d, b, e in zip(size, w.shape[2:], strides, dilations, begin, end)]
    outs = [p[2] for p in plans]
    return {"padding": tuple(p[0] for p in plans),
            "window": lambda y: select(ctx, y, [p[1] for p in plans], [1, 1], outs),
            "valid": window_sums(w, size, strides, dilations, begin, outs, banded) if any(begin + end) else None}


def full_rank(v: np.ndarray, rank: int) -> np.ndarray:
    """A scale or zero point broadcast over a tensor of ``rank`` axes, with that many axes (leading 1s)."""
    return v.reshape((1,) * (rank - v.ndim) + v.shape)


def axes_dropped(ctx, x: Scaled, drop: list[int]) -> Scaled:
    """``x`` without its axes ``drop`` (each of size 1), its scale and zero point too."""
    scale, zero = (full_rank(v, len(x.shape)) for v in (x.scale, x.zero))
    return replace(x, t=ctx.reshape(x.t, without(x.shape, drop)), scale=scale.reshape(without(scale.shape, drop)),
                   zero=zero.reshape(without(zero.shape, drop)))


def conv(ctx, node, x: Scaled, w: Scaled, bias: Scaled | None) -> Scaled:
    """Conv: conv2d (groups, strides, dilations; its zero padding aligned as nn's Conv rule does, the zero point's
    share of the padding corrected by the window sums V). An N-D one (N > 2) as the 2-D one of ``single_axes``; a
    3-D one with taps along the depth as the conv2d of ``depth_folded`` (the depth padded with the zero point)."""
    if len(x.shape) == len(w.shape) == 5 and not one_value_axes(node, x.shape, list(w.shape[2:])):
        return depth_conv(ctx, node, x, w, bias)
    if len(x.shape) > 4:
        node, drop = single_axes(node, x.shape, list(w.shape[2:]))
        y = conv(ctx, node, axes_dropped(ctx, x, drop), axes_dropped(ctx, w, drop), bias)
        return Scaled(ctx.reshape(y.t, with_ones(y.shape, drop)),  # scale and zero point (C, 1, ...), as 2-D's
                      *(full_rank(v, 4).reshape(with_ones(full_rank(v, 4).shape, drop)[1:]) for v in (y.scale, y.zero)))
    wv, sw = weight(w, "the Conv weight")
    x = per_tensor(x, "Conv")
    one_d = len(x.shape) == 3
    t = spatial_2d(ctx, x.t, "Conv")
    wv = wv.reshape(wv.shape[:2] + (1,) + wv.shape[2:]) if one_d else wv
    if wv.ndim != 4:
        raise Refuse(f"a {wv.ndim - 2}-D convolution has no CVM form")
    t, strides, dilations, begin, end = conv_window(ctx, node, t, x.shape, list(w.shape[2:]))
    groups = node.attr_int("group", 1, lo=1)
    acc, scale, zero = accumulate(ctx, replace(x, t=t), wv, sw, bias, "conv2d", groups,
                            **padding(ctx, wv, t.shape[2:], strides, dilations, begin, end, banded=True),
                            channels=len(wv), kernel_size=tuple(wv.shape[2:]), strides=tuple(strides),
                            dilation=tuple(dilations))
    if one_d:
        acc = ctx.reshape(acc, (acc.shape[0], acc.shape[1], acc.shape[3]))
    shape = (-1, 1, 1) if not one_d else (-1, 1)
    return Scaled(acc, scale.reshape(shape), zero.reshape(shape) if zero.any() else np.zeros((), np.int64))


def depth_conv(ctx, node, x: Scaled, w: Scaled, bias: Scaled | None, groups: int | None = None) -> Scaled:
    """A 3-D Conv (``groups``: the node's group) as one conv2d over the depth taps stacked into channels
    (``depth_folded``): the weight (M, C/G, kd, kh, kw) arranged (M, kd C/G, kh, kw), its scale and zero point per
    output channel unchanged."""
    x = per_tensor(x, "Conv")
    wv, _ = weight(w, "the Conv weight")
    groups = groups or node.attr_int("group", 1, lo=1)
    t, plain = depth_folded(ctx, node, x.t, int(x.zero.reshape(())), list(wv.shape[2:]), groups)
    m, cg, kd, kh, kw = wv.shape
    arranged = np.transpose(w.t.value, (0, 2, 1, 3, 4)).reshape(m, kd * cg, kh, kw)
    full = [full_rank(v, 5) for v in (w.scale, w.zero)]
    scale, zero = (v.reshape(v.shape[:1] + (1, 1, 1)) for v in full)
    y = conv(ctx, plain, Scaled(t, x.scale, x.zero), Scaled(const(arranged, w.t.dtype), scale, zero), bias)
    return Scaled(depth_unfolded(ctx, y.t, x.shape[0]), *(v.reshape(v.shape[:1] + (1, 1, 1)) if v.size > 1 else v
                                                           for v in (y.scale, y.zero)))


@float_rule("Conv", since=1)
def conv_rule(ctx, node, x, w, b=None):
    return conv(ctx, node, scaled(x, "the Conv input"), scaled(w, "the Conv weight"),
                None if b is None else scaled(b, "the Conv bias"))


def conv_transpose(ctx, node, x: Scaled, w: Scaled, bias: Scaled | None) -> Scaled:
    """ConvTranspose (2-D, 3-D): the convolution of x with zeros inserted between its values (s - 1 per stride s:
    `upsampling` or `repeat` of x - z, times a 0/1 mask), padded d (k - 1) - pads (+ output_padding at the end),
    by the kernel flipped and its in/out channels swapped per group, stride 1: the Conv rule (its conv2d and window
    sums; a 3-D one over the depth taps, ``depth_conv``) on that, exactly. A 1-D one (N, C, L) is the 2-D one of
    (N, C, 1, L) by its kernel (C_in, C_out/g, 1, k), stride, dilation 1 and no padding along the new axis
    (``conv_transpose_1d``)."""
    if len(x.shape) == 3 and len(w.shape) == 3:
        return conv_transpose_1d(ctx, node, x, w, bias)
    if len(x.shape) not in (4, 5) or len(w.shape) != len(x.shape):
        raise Refuse(f"a ConvTranspose of a {len(x.shape) - 2}-D input by a weight of shape {w.shape}: only 1-D, "
                     "2-D and 3-D have a CVM form here")
    n = len(x.shape) - 2
    strides = node.attr_ints("strides", [1] * n, lo=1, size=n)
    dilations = node.attr_ints("dilations", [1] * n, lo=1, size=n)
    extra = node.attr_ints("output_padding", [0] * n, lo=0, size=n)
    pads = transpose_pads(node, x.shape[2:], w.shape[2:], strides, dilations, extra)
    return transposed_conv(ctx, node, x, w, bias, strides, dilations, extra, pads)


def transpose_pads(node, sizes, kernel, strides, dilations, extra) -> list[int]:
    """ConvTranspose's pads (begins, then ends): the explicit pads; none for auto_pad VALID; else from the output
    sizes, output_shape's (its spatial sizes) or auto_pad SAME_UPPER / SAME_LOWER's L s per axis: the total
    s (L - 1) + output_padding + d (k - 1) + 1 - out split with total // 2 at the begin under SAME_UPPER, total -
    total // 2 otherwise (ONNX's rule, and onnxruntime's). Refused where a total is negative (a stride past the
    kernel under SAME: onnxruntime then pads 0, its output not the size asked)."""
    n = len(sizes)
    auto = node.attr_str("auto_pad", "NOTSET", choices=("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"))
    if node.has("output_shape"):
        outs = node.attr_ints("output_shape", lo=1, size=n)
    elif auto.startswith("SAME"):
        outs = [size * s for size, s in zip(sizes, strides)]
    elif auto == "VALID":
        return [0] * 2 * n
    else:
        return node.attr_ints("pads", [0] * 2 * n, lo=0, size=2 * n)
    totals = [s * (size - 1) + o + d * (k - 1) + 1 - out
              for size, s, o, d, k, out in zip(sizes, strides, extra, dilations, kernel, outs)]
    if min(totals) < 0:
        raise Refuse(f"a ConvTranspose output {outs} past the {[t + o for t, o in zip(totals, outs)]} its sums reach: "
                     "onnxruntime pads it otherwise")
    begin = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in totals]
    return begin + [t - b for t, b in zip(totals, begin)]


def conv_transpose_1d(ctx, node, x: Scaled, w: Scaled, bias: Scaled | None) -> Scaled:
    """A 1-D ConvTranspose as the 2-D one of x (N, C, 1, L) and w (C_in, C_out/g, 1, k) (its scale and zero point
    given the same new axis), with stride 1, dilation 1, no padding and no output padding along that axis: that
    axis has one input and one tap, so its output is the 1-D one, reshaped back to (N, C_out, L')."""
    if not w.t.is_const:
        raise Refuse("the ConvTranspose weight is computed at run time: CVM's conv2d needs a constant weight")
    strides = node.attr_ints("strides", [1], lo=1, size=1)
    dilations = node.attr_ints("dilations", [1], lo=1, size=1)
    extra = node.attr_ints("output_padding", [0], lo=0, size=1)
    pads = transpose_pads(node, x.shape[2:], w.shape[2:], strides, dilations, extra)

    def axis(a: np.ndarray) -> np.ndarray:  # broadcast against (C_in, C_out/g, k): the new axis before k
        return np.expand_dims(a, -2) if np.ndim(a) else a

    x = replace(x, t=ctx.reshape(x.t, x.shape[:2] + (1,) + x.shape[2:]))
    w = Scaled(const(w.t.value.reshape(w.shape[:2] + (1,) + w.shape[2:]), w.t.dtype), axis(w.scale), axis(w.zero))
    y = transposed_conv(ctx, node, x, w, bias, [1, *strides], [1, *dilations], [0, *extra], [0, pads[0], 0, pads[1]])
    return Scaled(ctx.reshape(y.t, y.shape[:2] + y.shape[3:]), y.scale.reshape(-1, 1),
                  y.zero.reshape(-1, 1) if y.zero.size > 1 else y.zero)


def transposed_conv(ctx, node, x: Scaled, w: Scaled, bias: Scaled | None, strides: list[int],
                    dilations: list[int], extra: list[int], pads: list[int]) -> Scaled:
    """The 2-D or 3-D ConvTranspose of ``conv_transpose`` with its window attributes given (explicit pads); a 3-D
    one's depth padding written as zero slices (``concatenate``): its windows of inserted zeros and padding only are
    outputs of 0 (+ bias), not windows of padding only, which the depth taps refuse."""
    x = per_tensor(x, "ConvTranspose")
    groups = node.attr_int("group", 1, lo=1)
    if not w.t.is_const:
        raise Refuse("the ConvTranspose weight is computed at run time: CVM's conv2d needs a constant weight")
    n = len(x.shape) - 2
    cin, per, kernel = w.shape[0], w.shape[1], w.shape[2:]
    if cin != x.shape[1] or cin % groups:
        raise Refuse(f"a ConvTranspose weight of shape {w.shape} for {x.shape[1]} input channels in {groups} groups")
    if any(o >= s for o, s in zip(extra, strides)):
        raise Refuse(f"ConvTranspose output_padding {extra} must be below the strides {strides}")
    outs = [(size - 1) * s - p - q + d * (k - 1) + 1 + o for size, s, p, q, d, k, o in
            zip(x.shape[2:], strides, pads[:n], pads[n:], dilations, kernel, extra)]
    if min(outs) < 1:
        raise Refuse(f"the ConvTranspose output {outs} is empty: CVM has no empty tensors")

    def flipped(a: np.ndarray) -> np.ndarray:  # (C_in, C_out/g, k...) -> (C_out, C_in/g, k...), flipped
        a = a.reshape(groups, cin // groups, per, *kernel).swapaxes(1, 2)
        return a.reshape(groups * per, cin // groups, *kernel)[(...,) + (slice(None, None, -1),) * n]

    own = np.asarray(w.scale, dtype=object)
    own = own.reshape((1,) * (len(w.shape) - own.ndim) + own.shape)
    at = flipped(np.broadcast_to(np.arange(own.size).reshape(own.shape), w.shape)).reshape(groups * per, -1)
    values = const(np.ascontiguousarray(flipped(w.t.value.astype(np.int64) - w.zero)), INT32)
    zero = np.zeros((), np.int64)
    # each output channel's scale, where one element of the scale serves all of its weights (compared as indices,
    # not as the exact scales of a whole kernel, one by one); else every weight's, one per output channel or refused
    if (at == at[:, :1]).all():
        sw = own.reshape(-1)[at[:, 0]]
    else:
        _, sw = weight(Scaled(values, np.ascontiguousarray(flipped(np.broadcast_to(w.scale, w.shape))), zero),
                       "the ConvTranspose weight")
    wv = Scaled(values, sw.reshape((-1,) + (1,) * (n + 1)), zero)
    v = minus_zero(ctx, x.t, x.zero)
    up = nearest(ctx, v, [1, 1, *strides])
    mask = np.zeros((1, 1) + up.shape[2:], np.int32)
    mask[(...,) + tuple(slice(None, None, s) for s in strides)] = 1
    up = ctx.result(ctx.op("broadcast_mul", up, const(mask, INT32)), INT32, min(v.lo, 0), max(v.hi, 0), up.shape)
    begin = [d * (k - 1) - p for d, k, p in zip(dilations, kernel, pads[:n])]
    end = [d * (k - 1) - p + o - (s - 1) for d, k, p, o, s in zip(dilations, kernel, pads[n:], extra, strides)]
    up, begin, end = cropped(ctx, up, begin, end)
    if n == 3 and begin[0] + end[0]:  # the depth padded with zero slices: a depth window may read those only
        pad = [const(np.zeros(foldable(up.shape[:2] + (p,) + up.shape[3:]), np.int32), INT32)
               for p in (begin[0], end[0])]
        up = concatenated(ctx, 2, pad[0], up, pad[1])
        begin[0] = end[0] = 0
    plain = helper.make_node(node.op_type, [], [], kernel_shape=list(kernel), strides=[1] * n, dilations=dilations,
                             pads=begin + end, group=groups)
    return conv(ctx, replace(node, proto=plain), Scaled(up, x.scale, zero), wv, bias)


@float_rule("ConvTranspose", since=1)
def conv_transpose_rule(ctx, node, x, w, b=None):
    """ConvTranspose of a dequantized x by a quantized constant weight. By a float weight (onnxruntime's QOperator
    form leaves ConvTranspose in float: it has no QLinearConvTranspose) refused: the model computes with those float
    weights, which no integer form holds exactly; the QDQ form quantizes them per output channel."""
    if isinstance(w, Tensor) and w.is_const and np.asarray(w.value).dtype.kind == "f":
        raise Refuse("ConvTranspose with float weights (onnxruntime's QOperator form leaves it in float, having no "
                     "QLinearConvTranspose) has no exact integer form: quantize in the QDQ form (quantize "
                     "--form qdq), which quantizes its weights per output channel")
    return conv_transpose(ctx, node, scaled(x, "the ConvTranspose input"), scaled(w, "the ConvTranspose weight"),
                          None if b is None else scaled(b, "the ConvTranspose bias"))


@float_rule("MatMul", since=1)
def matmul_rule(ctx, node, a, b):
    a, b = scaled(a, "the MatMul input"), scaled(b, "the MatMul weight")
    if not b.t.is_const:
        return variable_matmul(ctx, a, b)
    w, sw = weight(one_matrix(b, "MatMul weight"), "the MatMul weight", transpose=True)
    return ranked(ctx, dense(ctx, a, w, sw, None), matmul_rank(a, b))


def one_matrix(b: Scaled, what: str) -> Scaled:
    """A constant weight of shape (1, ..., 1, K, N), one matrix broadcast over the input's batch axes, as that (K, N)
    matrix; any other shape but (K, N) refused."""
    if len(b.shape) < 2 or any(d != 1 for d in b.shape[:-2]):
        raise Refuse(f"a {what} of shape {b.shape}: dense takes one weight matrix")
    rank, drop = len(b.shape), (0,) * (len(b.shape) - 2)
    return replace(b, t=const(np.asarray(b.t.value).reshape(b.shape[-2:]), b.t.dtype),
                   scale=full_rank(np.asarray(b.scale, dtype=object), rank)[drop],
                   zero=full_rank(np.asarray(b.zero), rank)[drop])


def matmul_rank(a: Scaled, b: Scaled) -> int:
    """The rank of MatMul's a @ b, numpy's: a vector a loses the axis it gains to be a matrix."""
    return max(len(a.shape), len(b.shape)) - (len(a.shape) == 1)


def ranked(ctx, y: Scaled, rank: int) -> Scaled:
    """``y`` with leading axes of 1 up to ``rank`` (MatMul's broadcast of a weight of more axes than its input)."""
    if len(y.shape) >= rank:
        return y
    return replace(y, t=ctx.reshape(y.t, (1,) * (rank - len(y.shape)) + y.shape))


def flat_index(i: tuple[int, ...], dims: tuple[int, ...]) -> int:
    """The flat index into batch axes ``dims`` (broadcast: size-1 axes read index 0) of the broadcast index i."""
    flat = 0
    for j, d in zip(i[len(i) - len(dims):], dims):
        flat = flat * d + (j if d > 1 else 0)
    return flat


def lead(shape: tuple[int, ...], batch: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` with leading 1s up to the rank of batch axes ``batch`` plus its matrix axes."""
    return (1,) * (len(batch) + 2 - len(shape)) + tuple(shape)


def variable_matmul(ctx, a: Scaled, b: Scaled) -> Scaled:
    """a @ b of two computed tensors (attention's Q K^T and weights x V), per tensor, at scale s_a s_b, exactly in
    int32: one ``dense`` per matrix of the broadcast batch axes. With A + c_a = a, B + c_b = b the 8-bit parts of
    ``halves`` (concatenated along K, each part of A against each of B), d_a = c_a - z_a, d_b = c_b - z_b:
    sum_k (a - z_a)(b - z_b) = A . B + d_b sum_k a + d_a sum_k b - K (d_b c_a + d_a c_b - d_a d_b)."""
    a, b = per_tensor(a, "MatMul"), per_tensor(b, "MatMul")
    if len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != b.shape[-2]:
        raise Refuse(f"MatMul of shapes {a.shape} and {b.shape}: CVM's form takes matrices (rank >= 2) that chain")
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = broadcast_of(a.shape[:-2], b.shape[:-2])
    if math.prod(batch) > MAX_MATRICES:
        raise Refuse(f"MatMul of shapes {a.shape} and {b.shape}: {math.prod(batch)} matrix products, one dense "
                     f"each (at most {MAX_MATRICES})")
    za, zb = int(a.zero.reshape(())), int(b.zero.reshape(()))
    ta = as_int32(a.t)
    axes = tuple(range(len(b.shape) - 2)) + (len(b.shape) - 1, len(b.shape) - 2)
    tb = ctx.result(ctx.op("transpose", as_int32(b.t), axes=axes), INT32, b.t.lo, b.t.hi,
                    tuple(b.shape[i] for i in axes))
    pa, ca = halves(ctx, ta)
    pb, cb = halves(ctx, tb)
    da, db = ca - za, cb - zb
    ins = ctx.narrow(concatenated(ctx, -1, *(p for p in pa for _ in pb)), 8, "the data of dense")
    ws = ctx.narrow(concatenated(ctx, -1, *(p for _ in pa for p in pb)), 8, "the weight of dense")
    ins, ws = ctx.tensor(ins), ctx.tensor(ws)
    ins, ws = ctx.reshape(ins, (math.prod(a.shape[:-2]), m, ins.shape[-1])), ctx.reshape(
        ws, (math.prod(b.shape[:-2]), n, ws.shape[-1]))
    rows = []
    for i in np.ndindex(*batch):
        ia, ib = flat_index(i, a.shape[:-2]), flat_index(i, b.shape[:-2])
        x = ctx.reshape(strided_slice(ctx, ins, [range(ia, ia + 1), range(m), range(ins.shape[-1])]),
                        (m, ins.shape[-1]))
        w = ctx.reshape(strided_slice(ctx, ws, [range(ib, ib + 1), range(n), range(ws.shape[-1])]),
                        (n, ws.shape[-1]))
        e = ctx.emit("dense", ctx.narrow(x, 8), ctx.narrow(w, 8), units=n, use_bias=False)
        rows.append(ctx.reshape(ctx.tensor(e), (1, m, n)))
    y = ctx.reshape(concatenated(ctx, 0, *rows), tuple(batch) + (m, n))
    corners = [x * v for x in (a.t.lo - za, a.t.hi - za) for v in (b.t.lo - zb, b.t.hi - zb)]
    lo, hi = k * min(corners), k * max(corners)
    if db:
        sa = ctx.reshape(reduced(ctx, "sum", ta, [len(a.shape) - 1], k * ta.lo, k * ta.hi),
                         lead(a.shape, batch)[:-1] + (1,))
        y = ctx.apply("broadcast_add", y, ctx.apply("broadcast_mul", sa, const(np.array(db, np.int32), INT32)))
    if da:
        sb = ctx.reshape(reduced(ctx, "sum", tb, [len(b.shape) - 1], k * tb.lo, k * tb.hi),
                         lead(b.shape, batch)[:-2] + (1, n))
        y = ctx.apply("broadcast_add", y, ctx.apply("broadcast_mul", sb, const(np.array(da, np.int32), INT32)))
    if (c0 := -k * (db * ca + da * cb - da * db)):
        y = ctx.apply("broadcast_add", y, const(np.array(c0, np.int32), INT32))
    y = ctx.result(y.entry, INT32, lo, hi, tuple(batch) + (m, n))
    return Scaled(y, np.asarray(a.scale.reshape(()).item() * b.scale.reshape(()).item(), dtype=object),
                  np.zeros((), np.int64))


def gemm_factor(node, name: str) -> Fraction:
    """Gemm's ``alpha`` or ``beta`` as the exact rational its float32 value is; refused where not finite."""
    v = node.attr_float(name, 1.0)
    if not math.isfinite(v):
        raise Refuse(f"Gemm {name}={v}: a factor that is not finite has no CVM form")
    return Fraction(v)


def times(ctx, x: Scaled, f: Fraction) -> Scaled:
    """x times the rational f != 0: the scale times |f|, and for f < 0 the integers and zero point negated
    ((t - z) s f = (-t - (-z)) s |f|; a constant folded, else `negative`)."""
    if f > 0:
        return replace(x, scale=np.asarray(x.scale * f, dtype=object)) if f != 1 else x
    t = x.t
    if t.is_const:
        t = const(-t.value.astype(np.int64), INT32)
    else:
        t = as_int32(t)
        t = ctx.result(ctx.op("negative", t), INT32, -t.hi, -t.lo, t.shape)
    return Scaled(t, np.asarray(x.scale * -f, dtype=object), -x.zero, x.clip)


def at_scale(have: Fraction, want: Fraction) -> bool:
    """Whether a bias scale ``have`` is ``want`` to float32's rounding of a product: within want / 2^22, or 2^-149
    (a denormal's step)."""
    hn, hd, wn, wd = have.numerator, have.denominator, want.numerator, want.denominator
    d = abs(hn * wd - wn * hd)  # |have - want| in integers: d / (D_h D_w) against N_w / (D_w 2^22), 1 / 2^149
    return not (d << 22 > wn * hd and d << 149 > hd * wd)


def on_grid(c: Tensor, unit: np.ndarray) -> Scaled:
    """A float constant C (a QDQ Gemm's C that no DequantizeLinear quantized) as integers at the scale ``unit`` (one
    value, or one per output column: C's last axis broadcast): round_half_even(C / unit) of the exact rationals (the
    rounding onnxruntime's quantize_static gives a bias, numpy's round), each within unit / 2 of C. Refused where C
    is not finite or an integer passes int32."""
    v = np.asarray(c.value, np.float64)
    if not np.isfinite(v).all():
        raise Refuse("the Gemm's float C holds NaN or infinity")
    unit = np.asarray(unit, dtype=object)
    shape = broadcast_of(v.shape, unit.shape)
    vb, ub = np.broadcast_to(v, shape), np.broadcast_to(unit, shape)
    ratio = vb / np.vectorize(float, otypes=[np.float64])(ub)
    k = np.rint(ratio).astype(object)
    for i in np.flatnonzero((np.abs(np.abs(ratio - np.trunc(ratio)) - 0.5) < 2.0**-20) | (np.abs(ratio) > 2.0**40)):
        k.flat[i] = round(Fraction(float(vb.flat[i])) / ub.flat[i])  # near a tie or large: the exact quotient
    if any(abs(x) >= 1 << 31 for x in k.flat):
        raise Refuse(f"the Gemm's float C reaches {float(np.abs(v).max()):.6g}: beyond int32 steps of the product's "
                     "scale")
    return Scaled(const(k.astype(np.int64).astype(np.int32), INT32), unit, np.zeros((), np.int64))


def _c_broadcasts(c, out: tuple[int, ...]) -> None:
    """Refused: a Gemm's C (where beta != 0) that does not broadcast to its output (M, N) one way, as ONNX requires
    (no more rows or columns than the product has, none empty)."""
    shape = tuple(c.shape) if c is not None else ()
    if len(shape) > 2 or any(d not in (1, o) for d, o in zip(shape[::-1], tuple(out)[::-1])):
        raise Refuse(f"the Gemm's C of shape {shape} does not broadcast to its output {tuple(out)} (M, N)")


@float_rule("Gemm", since=7)
def gemm_rule(ctx, node, a, b, c=None):
    """alpha A' B' + beta C (docs/import.md, "Gemm's alpha, beta and transA"): A' = A^T under transA (`transpose`);
    the product by `dense` of a constant B, or of two computed tensors (``variable_matmul``, B transposed first
    under transB), at scale |alpha| s_a s_b (negated for alpha < 0). C (with beta != 0) is the dense's int32 bias
    where beta s_c is alpha s_a s_b to float32's rounding, else a second term of the sum (as Add), requantized with
    the product by the QuantizeLinear that follows. A float constant C (no DequantizeLinear) is first put on the
    product's grid (``on_grid``: beta C in steps of |alpha| s_a s_b), then taken as a quantized C."""
    alpha, beta = gemm_factor(node, "alpha"), gemm_factor(node, "beta")
    c = None if beta == 0 else c
    if alpha == 0:
        raise Refuse("Gemm with alpha 0: its product is unused (no CVM form here)")
    a, b = scaled(a, "the Gemm input A"), scaled(b, "the Gemm weight B")
    if len(a.shape) != 2:
        raise Refuse(f"Gemm input of shape {a.shape}")
    if len(b.shape) != 2:
        raise Refuse(f"Gemm weight B of shape {b.shape}: Gemm takes a matrix")
    if node.attr_int("transA", 0):
        a = per_tensor(a, "a transposed Gemm input A")
        a = replace(a, t=ctx.result(ctx.op("transpose", as_int32(a.t), axes=(1, 0)), INT32, a.t.lo, a.t.hi,
                                    a.shape[::-1]))
    float_c = c is not None and isinstance(c, Tensor) and c.is_const and np.asarray(c.value).dtype.kind == "f"
    cs = None if c is None or float_c else [scaled(c, "the Gemm bias C")]
    if not b.t.is_const:
        if node.attr_int("transB", 0):
            b = replace(b, t=ctx.result(ctx.op("transpose", as_int32(b.t), axes=(1, 0)), INT32, b.t.lo, b.t.hi,
                                        b.shape[::-1]))
        product = variable_matmul(ctx, a, b)
        _c_broadcasts(c, product.shape)
        if float_c:
            cs = [on_grid(c, product.scale.reshape(()) * abs(alpha / beta))]
        y = times(ctx, product, alpha)
    else:
        w, sw = weight(b, "the Gemm weight B", transpose=not node.attr_int("transB", 0))
        _c_broadcasts(c, (a.shape[0], len(w)))
        sa = per_tensor(a, "the input of a Gemm (dense)").scale.reshape(()).item()
        if float_c:  # beta C in steps of |alpha| s_a s_b: C in steps of |alpha / beta| s_a s_b per output column
            cs = [on_grid(c, np.array([sa * x * abs(alpha / beta) for x in np.broadcast_to(sw, (len(w),))],
                                      dtype=object))]
        bias = None
        if cs is not None and len(cs) == 1 and cs[0].t.is_const and cs[0].t.size in (1, len(w)) and \
                all(d == 1 for d in cs[0].shape[:-1]):
            folded = times(ctx, cs[0], beta / alpha)
            full = np.broadcast_to(folded.scale, np.broadcast_shapes(folded.scale.shape, (len(w),))).reshape(-1)
            if not folded.zero.any() and all(at_scale(x, sa * s) for x, s in zip(full, sw)):
                bias, cs = folded, None
        y = times(ctx, dense(ctx, a, w, sw, bias), alpha)
    if cs is None:
        return y
    return sum_of([y, times(ctx, cs[0], beta)])


def ceil_ends(node, size: tuple[int, ...], kernel, strides, begin, end) -> tuple[list[int], list[int]]:
    """Under ceil_mode, (the end pads that hold every window, the output count per axis): ceil((size + pads -
    k) / s) + 1 windows, as onnxruntime (and torch) count them; a last window that would start past the input
    (onnxruntime drops it, ONNX's shape inference keeps it) is refused, and so is a kernel larger than the padded
    input (ceil_mode's one window past it too). Without ceil_mode, (end, floor's count)."""
    ceil = node.attr_int("ceil_mode", 0)
    ends, outs = [], []
    for n, k, s, b, e in zip(size, kernel, strides, begin, end):
        if k > n + b + e:
            raise Refuse(f"the kernel ({k}) is larger than the padded input ({n + b + e})")
        out = (n + b + e - k + (s - 1 if ceil else 0)) // s + 1
        if ceil and (out - 1) * s - b >= n:
            raise Refuse(f"{node.op_type} ceil_mode where the last window starts past the input ({n} values, pads "
                         f"{b} and {e}, kernel {k}, stride {s}): onnxruntime drops it, ONNX's output shape keeps it")
        ends.append(max(e, (out - 1) * s + k - n - b))
        outs.append(out)
    return ends, outs


def average(ctx, node, x: Scaled, whole_kernel: bool = False) -> Scaled:
    """AveragePool: a depthwise conv2d with weights 1 over the zero-point-padded input, at scale s_x / count
    (count per output position when padding is not counted; there a pad not smaller than the kernel, which lets a
    window count no input value, is refused, as onnxruntime refuses it); a kernel of the whole unpadded image (torch's
    F.avg_pool2d(x, x.shape[2:])) is ``global_average``, its sum of any width, and so is a larger kernel under
    ceil_mode whose one window starts at the image (HF EfficientNet's AvgPool2d(hidden_dim, ceil_mode=True)), which
    counts H W (not under ``whole_kernel``, which counts k per axis). Under ceil_mode the last windows may pass the
    end padding (``ceil_ends``): the input is padded further, and a counted window counts the positions up to the
    end padding only, min(k, size + end - start) per axis, as ONNX's AveragePool (onnxruntime's float kernel, torch)
    counts them; ``whole_kernel``: the whole kernel, k per axis, as onnxruntime's QLinearAveragePool counts them.
    An auto_pad SAME whose total is negative (a stride past the kernel) crops the input, as onnxruntime's pools. A
    1-D one is the 2-D one over (1, L) (``as_2d``)."""
    x = per_tensor(x, "AveragePool")
    if any(d != 1 for d in node.attr_ints("dilations", [])):
        raise Refuse("AveragePool with dilations has no CVM form here")
    if len(x.shape) == 5:
        return depth_average(ctx, node, x, whole_kernel)
    if len(x.shape) == 3:  # 1-D (torch's AvgPool1d): the 2-D pool over (1, L), the same windows and counts
        n, c, size = x.shape
        y = average(ctx, as_2d(node), replace(x, t=ctx.reshape(x.t, (n, c, 1, size))), whole_kernel)
        return replace(y, t=ctx.reshape(y.t, (n, c, y.shape[3])), scale=y.scale.reshape(y.scale.shape[1:]) if
                       y.scale.ndim == 2 else y.scale)
    if len(x.shape) != 4:
        raise Refuse(f"AveragePool of a {len(x.shape) - 2}-D image: only 2-D here")
    kernel = node.attr_ints("kernel_shape", lo=1, size=2)
    strides = node.attr_ints("strides", [1, 1], lo=1, size=2)
    begin, end = onnx_pads(node, x.shape[2:], kernel, strides, [1, 1], crop=True)
    ceil = node.attr_int("ceil_mode", 0) and not (whole_kernel and node.attr_int("count_include_pad", 0))
    if not any(begin) and not any(end) and all(k == n or ceil and k > n > k - s for k, n, s in
                                               zip(kernel, x.shape[2:], strides)):
        return global_average(ctx, x)  # one window over the whole image, which it counts: the image's mean
    c = x.shape[1]
    t, begin, end = cropped(ctx, x.t, begin, end)
    counted = node.attr_int("count_include_pad", 0)
    if not counted:
        uncounted_pads(kernel, begin, end)
    ends, outs = ceil_ends(node, t.shape[2:], kernel, strides, begin, end)
    ones = kernel_ones(c, kernel, np.int64)
    pad = padding(ctx, ones, t.shape[2:], strides, [1, 1], begin, ends)
    acc, _, _ = accumulate(ctx, replace(x, t=t), ones, np.ones(c, object), None, "conv2d", c, **pad, channels=c,
                        kernel_size=tuple(kernel), strides=tuple(strides), dilation=(1, 1))
    sx = x.scale.reshape(()).item()
    if counted:  # the padded positions each window reads, up to the end padding (or all: ``whole_kernel``)
        axes = [np.full(o, k) if whole_kernel else np.minimum(k, n + e + b - s * np.arange(o))
                for n, k, s, b, e, o in zip(t.shape[2:], kernel, strides, begin, end, outs)]
        count = np.multiply.outer(*axes)
    elif pad["valid"] is None:
        count = np.full(outs, math.prod(kernel))
    else:
        count = pad["valid"][0]  # the window sums of weights 1: the input positions each window reads
    if (count == count.flat[0]).all():
        return Scaled(acc, np.asarray(sx / int(count.flat[0]), dtype=object), np.zeros((), np.int64))
    return Scaled(acc, np.array([sx / int(n) for n in count.flat], dtype=object).reshape(count.shape),
                  np.zeros((), np.int64))


def depth_average(ctx, node, x: Scaled, whole_kernel: bool = False) -> Scaled:
    """A 3-D AveragePool whose windows all count kd kh kw positions (no pads, or pads counted; no ceil_mode): the
    depthwise 3-D Conv by weights 1 (``depth_conv``, the zero point's padding) at scale s_x / (kd kh kw), per
    tensor. Else (pads not counted, ceil_mode, or negative pads: an auto_pad SAME whose total is negative crops the
    input, as onnxruntime's pools) the window sums of x - z, the padding adding 0 (``summed_windows``
    axis by axis), at s_x / count per output position, count as ``average`` takes it on each axis (the input
    positions a window reads; counted, up to the end padding); refused under ``whole_kernel`` with ceil_mode and
    counted pads."""
    kernel = node.attr_ints("kernel_shape", lo=1, size=3)
    strides = node.attr_ints("strides", [1] * 3, lo=1, size=3)
    begin, end = onnx_pads(node, x.shape[2:], kernel, strides, [1] * 3, crop=True)
    counted = node.attr_int("count_include_pad", 0)
    if node.attr_int("ceil_mode", 0) or min(begin + end) < 0 or any(begin + end) and not counted:
        t, begin, end = cropped(ctx, x.t, begin, end)
        return depth_window_average(ctx, node, replace(x, t=t), kernel, strides, begin, end, whole_kernel)
    c = x.shape[1]
    ones = Scaled(const(kernel_ones(c, kernel, np.int8), TensorProto.INT8),
                  np.asarray(Fraction(1), dtype=object), np.zeros((), np.int64))
    y = depth_conv(ctx, node, x, ones, None, groups=c)
    zero = np.asarray(y.zero).reshape(-1)[0]  # every channel's: their weights are the same
    return Scaled(y.t, np.asarray(x.scale.reshape(()).item() / math.prod(kernel), dtype=object),
                  np.asarray(zero, np.int64))


def depth_window_average(ctx, node, x: Scaled, kernel, strides, begin, end, whole_kernel: bool) -> Scaled:
    """``depth_average``'s form of windows that count different numbers of positions (see there)."""
    counted = node.attr_int("count_include_pad", 0)
    if whole_kernel and counted and node.attr_int("ceil_mode", 0):
        raise Refuse("QLinearAveragePool 3-D with ceil_mode and counted pads has no CVM form here")
    if not counted:
        uncounted_pads(kernel, begin, end)
    _, outs = ceil_ends(node, x.shape[2:], kernel, strides, begin, end)
    t = summed_windows(ctx, minus_zero(ctx, x.t, x.zero), kernel, strides, [1] * 3, begin, outs)
    starts = [s * np.arange(o) - b for s, b, o in zip(strides, begin, outs)]
    axes = [np.minimum(k, n + e - a) if counted else np.minimum(a + k, n) - np.maximum(a, 0)
            for n, k, e, a in zip(x.shape[2:], kernel, end, starts)]
    count = np.multiply.outer(np.multiply.outer(axes[0], axes[1]), axes[2])
    sx = x.scale.reshape(()).item()
    return Scaled(t, np.array([sx / int(n) for n in count.flat], dtype=object).reshape(count.shape),
                  np.zeros((), np.int64))


def uncounted_pads(kernel, begin, end) -> None:
    """Refuses an AveragePool pad not smaller than the kernel where the padding is not counted: a window of padding
    only counts no input value, its average undefined (onnxruntime refuses it too)."""
    for pb, pe, k in zip(begin, end, kernel):
        if max(pb, pe) >= k:
            raise Refuse(f"AveragePool pads ({pb}, {pe}) not smaller than the kernel ({k}) with count_include_pad=0: "
                         "a window of padding only can count no input value, its average undefined")


def kernel_ones(c: int, kernel: list[int], dtype) -> np.ndarray:
    """The weights 1 (c, 1, *kernel) of an AveragePool's depthwise Conv; refused past 2^24 values, before they are
    allocated (a huge kernel within huge pads)."""
    if c * math.prod(kernel) > MAX_DIM:
        raise Refuse(f"AveragePool kernel {tuple(kernel)} over {c} channels: its weights would hold "
                     f"{c * math.prod(kernel)} values, more than 2^24")
    return np.ones((c, 1) + tuple(kernel), dtype)


@float_rule("AveragePool", since=7)
def average_rule(ctx, node, x):
    return average(ctx, node, scaled(x, "the AveragePool input"))


def global_average(ctx, x: Scaled) -> Scaled:
    """GlobalAveragePool: sum of x - z over the image (``image_sum``), at scale s_x / (H * W)."""
    x = per_tensor(x, "GlobalAveragePool")
    return Scaled(image_sum(ctx, minus_zero(ctx, x.t, x.zero)),
                  np.asarray(x.scale.reshape(()).item() / math.prod(x.shape[2:]), dtype=object), np.zeros((), np.int64))


def image_sum(ctx, v: Tensor) -> Tensor:
    """The sum of v (N, C, spatial...) over its spatial axes, as (N, C, 1, ...)."""
    axes = tuple(range(2, len(v.shape)))
    n = math.prod(v.shape[2:])
    s = ctx.result(ctx.op("sum", v, axis=axes, keepdims=False), INT32, min(v.lo * n, 0), max(v.hi * n, 0),
                   v.shape[:2])
    return ctx.reshape(s, v.shape[:2] + (1,) * len(axes))


def tabled(ctx, x):
    """A float function of one dequantized value (``Mapped``: an Elu that quantize_static leaves unquantized, the
    average after it being left in float too: madmom's key CNN) quantized as a float output is (edges.tail): int16,
    zero point 0, the least float32 step s with 32767 s >= its largest finite |value| on its input's integers; so
    the average reads integers; refused where the function is infinite or NaN on some of them (the float model's
    average is then no finite value). Any other value as it is."""
    if not isinstance(x, Mapped) or x.x.t.hi - x.x.t.lo >= 1 << 16:
        return x
    q = np.arange(x.x.t.lo, x.x.t.hi + 1, dtype=np.int64) - int(x.x.zero.reshape(()))
    with np.errstate(all="ignore"):
        image = np.abs(np.asarray(x.fn(q * float(x.x.scale.reshape(()).item())), np.float64))
    if not np.isfinite(image).all():
        bad = q[~np.isfinite(image)] + int(x.x.zero.reshape(()))
        raise Refuse(f"the average of {x.what}, which is infinite or NaN at its input's integers {bad[:4].tolist()}"
                     f"{' ...' if bad.size > 4 else ''}: the float model's average has no finite value there")
    m = float(image[np.isfinite(image)].max(initial=0.0)) or 1.0
    step = np.float32(m / 32767)
    while float(step) * 32767 < m:
        step = np.nextafter(step, np.float32(np.inf))
    scale, zero = np.asarray(Fraction(float(step)), dtype=object), np.zeros((), np.int64)
    return Scaled(quantize(ctx, x, scale, zero, TensorProto.INT16), scale, zero)


@float_rule("GlobalAveragePool", since=1)
def global_average_rule(ctx, node, x):
    return global_average(ctx, scaled(tabled(ctx, x), "the GlobalAveragePool input"))


@rule("ReduceMean", since=1)
def integer_mean_rule(ctx, node, x, axes_t=None):
    """ReduceMean of integers a float carries (a Cast of a 0/1 mask to float32: the share of positions kept): the
    integers at scale 1 (``reduce_mean_rule``), so their sum at scale 1 / n, exact, requantized by the
    QuantizeLinear that follows. Of an integer type (its division truncates) refused."""
    if x.dtype not in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16):
        raise Refuse(f"ReduceMean of {type_name(x.dtype)} integers (a truncating division) has no CVM form")
    return reduce_mean_rule(ctx, node, Scaled(replace(x, dtype=INT32), np.asarray(Fraction(1), dtype=object),
                                              np.zeros((), np.int64)), axes_t)


@float_rule("ReduceMean", "ReduceSum", since=1)
def reduce_mean_rule(ctx, node, x, axes_t=None):
    """ReduceMean, ReduceSum: the sum of x - z over the axes (CVM's sum, as ReduceSum) at scale s_x / n (n the
    count of values reduced) or s_x: exact, requantized by the QuantizeLinear that follows. ReduceMean of a float
    function of a dequantized value first quantizes it as a float output is (``tabled``)."""
    mean = node.op_type == "ReduceMean"
    x = per_tensor(scaled(tabled(ctx, x) if mean else x, f"the {node.op_type} input"), node.op_type)
    return summed(ctx, node, x, lambda: minus_zero(ctx, x.t, x.zero), axes_t, 18 if mean else 13,
                  x.scale.reshape(()).item(), mean)


def powers(ctx, x: Scaled, square: bool) -> Scaled:
    """u^2 (``square``) or |u| of a per-tensor dequantized x = u s: `broadcast_mul` of u by u (its interval from
    0) or `abs`, at s^2 or s, zero point 0."""
    z = int(x.zero.reshape(()))
    a, b = x.t.lo - z, x.t.hi - z
    low, peak = 0 if a <= 0 <= b else min(-b, a), max(-a, b)
    u = minus_zero(ctx, x.t, x.zero)
    if square:
        v = ctx.result(ctx.op("broadcast_mul", u, u), INT32, low * low, peak * peak, x.shape)
        return Scaled(v, np.asarray(x.scale.reshape(()).item() ** 2, dtype=object), np.zeros((), np.int64))
    v = ctx.result(ctx.op("abs", u), INT32, low, peak, x.shape)
    return Scaled(v, np.asarray(x.scale.reshape(()).item(), dtype=object), np.zeros((), np.int64))


@float_rule("ReduceSumSquare", "ReduceL1", since=1)
def reduce_power_rule(ctx, node, x, axes_t=None):
    """ReduceSumSquare, ReduceL1 of a per-tensor dequantized x = u s: the exact sum of u^2 at scale s^2 or of |u|
    at s (``powers``), requantized by the QuantizeLinear that follows."""
    x = per_tensor(scaled(x, f"the {node.op_type} input"), node.op_type)
    v = powers(ctx, x, node.op_type == "ReduceSumSquare")
    return summed(ctx, node, v, lambda: v.t, axes_t, 18, v.scale.reshape(()).item(), False)


@float_rule("ReduceProd", since=1)
def reduce_prod_rule(ctx, node, x, axes_t=None):
    """ReduceProd of a per-tensor dequantized x = u s: the exact product of u over the n values of each reduction
    at s^n (the reduced axes moved last, `transpose`, `reshape` to (rows, n); the columns multiplied one by one,
    `strided_slice`, `broadcast_mul`), requantized by the QuantizeLinear that follows. Refused where a running
    product's label and a value's pass 32 bits together (CVM's int32 product), n > 32 (no product of more
    values of |u| >= 2 fits) or where s^n < 2^-149 or (P s)^n >= 2^127, P the largest |u| (onnxruntime's float32
    product 0 or inf)."""
    x = per_tensor(scaled(x, "the ReduceProd input"), "ReduceProd")
    rank = len(x.shape)
    axes = axes_of(node, axes_t, 18)
    if not axes and node.attr_int("noop_with_empty_axes", 0):
        return x
    axes = sorted(set(normal(axes or list(range(rank)), rank)))
    kept = [i for i in range(rank) if i not in axes]
    n, rows = math.prod(x.shape[i] for i in axes), math.prod(x.shape[i] for i in kept)
    z, s = int(x.zero.reshape(())), x.scale.reshape(()).item()
    peak = max(z - x.t.lo, x.t.hi - z, 0)
    if n > 32:
        raise Refuse(f"ReduceProd of {n} values: at most 32 have a CVM form here (a product of more values of "
                     "|x - z| >= 2 passes 32 bits)")
    if n * math.log2(s) < -149 or peak and n * math.log2(peak * s) >= 127:
        raise Refuse(f"ReduceProd of {n} values up to {peak} x {float(s):g}: the product leaves float32's range, "
                     "where onnxruntime computes it as 0 or inf")
    t = ctx.reshape(transposed(ctx, minus_zero(ctx, x.t, x.zero), tuple(kept + axes)), (rows, n))
    acc = strided_slice(ctx, t, [range(rows), range(1)])
    for j in range(1, n):
        if tight(acc.peak) + tight(t.peak) > 32:
            raise Refuse(f"ReduceProd of {n} values of x - z up to {peak}: the product of {j + 1} passes 32 bits "
                         "(CVM's int32)")
        ends = [a * b for a in (acc.lo, acc.hi) for b in (t.lo, t.hi)]
        acc = ctx.result(ctx.op("broadcast_mul", acc, strided_slice(ctx, t, [range(rows), range(j, j + 1)])), INT32,
                         min(ends), max(ends), (rows, 1))
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if node.attr_int("keepdims", 1) else \
        tuple(x.shape[i] for i in kept)
    return Scaled(ctx.reshape(acc, shape), np.asarray(s ** n, dtype=object), np.zeros((), np.int64))


@float_rule("CumSum", since=11)
def cumsum_rule(ctx, node, x, axis_t):
    """CumSum of a per-tensor dequantized x = (t - z) s: the integer rule's cumulative sums of t - z (a constant 0/1
    matrix of the positions each output sums, exclusive, reverse), at s: exact."""
    x = per_tensor(scaled(x, "the CumSum input"), "CumSum")
    return Scaled(integer_rule(node)(ctx, node, minus_zero(ctx, x.t, x.zero), axis_t), x.scale, np.zeros((), np.int64))


def summed(ctx, node, x: Scaled, values: Callable[[], Tensor], axes_t, since: int, scale: Fraction,
           mean: bool) -> Scaled:
    """The sum of the integers ``values()`` (x's value at ``scale``) over the reduction's axes (as input from opset
    ``since``; keepdims; no axes under noop_with_empty_axes: x itself), at ``scale`` (over n, the values reduced,
    where ``mean``)."""
    rank = len(x.shape)
    axes = axes_of(node, axes_t, since)
    if not axes and node.attr_int("noop_with_empty_axes", 0):
        return x
    axes = sorted(set(normal(axes or list(range(rank)), rank)))
    keep = node.attr_int("keepdims", 1)
    n = math.prod(x.shape[i] for i in axes)
    v = values()
    y = reduced(ctx, "sum", v, axes, min(v.lo * n, 0), max(v.hi * n, 0))
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else \
        tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return Scaled(ctx.reshape(y, shape), np.asarray(scale / (n if mean else 1), dtype=object), np.zeros((), np.int64))
