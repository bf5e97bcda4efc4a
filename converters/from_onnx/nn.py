"""Import rules of the ONNX products, pooling and resizing: MatMul, Gemm, MatMulInteger -> dense; Conv,
ConvInteger -> conv2d; MaxPool -> max_pool2d; Resize (nearest) -> upsampling, repeat or take; Upsample (nearest,
integer scales) -> upsampling or repeat.

* CVM's dense and conv2d take 8-bit inputs (|x| <= 127): an input whose interval proves it gets a cvm_clip to
  lower its label if needed, any other is refused. Zero points are subtracted first (a constant weight is
  folded), so ConvInteger/MatMulInteger of uint8 data work when the data minus its zero point fits.
* The result interval is exact per output channel for a constant weight (positive and negative weights times
  the input interval, zero padding included); ONNX computes int32 products exactly when that interval fits
  int32, and float ones when every partial sum stays within the float's exact integers (max|x| * sum|w|).
* CVM pads symmetrically. Asymmetric padding (pads_begin != pads_end, auto_pad SAME_UPPER/SAME_LOWER) is
  computed exactly with a larger symmetric padding P chosen so that the ONNX windows are a stride-aligned
  subset of CVM's, followed by a strided_slice picking them. Max pooling needs P < kernel; when the aligned P
  is too large, it pools with stride 1 and lets the strided_slice take every stride-th window.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .checks import MAX_DIM
from .context import FLOAT_EXACT, INT32, MAX_FOLDED, Tensor, check_values, const, type_name
from .emit import (aligned, as_int32, attrs_2d, broadcast_shape, concatenated, conv_window, cropped, depth_folded,
                   depth_taps, depth_unfolded, extreme, integer_scales, minus_zero, nearest, one_value_axes, onnx_pads,
                   reduced, resize_scales, resized_shape, scaled_size, select, single_axes, spatial_2d,
                   strided_slice, transposed, with_ones, without)
from .evaluated import affine
from .registry import Refuse, rule


# -- helpers ----------------------------------------------------------------------------------------------------
def product_interval(x: Tensor, w: Tensor, reduced: int, padded: bool = False) -> tuple[int, int, int]:
    """(lo, hi, partial) of sum_k x_k * w[o, k] over the rows o of w (a constant) or any weights within w's
    interval; ``partial`` bounds every partial sum. ``padded``: some x_k may be 0 (zero padding)."""
    xlo, xhi = (min(x.lo, 0), max(x.hi, 0)) if padded else (x.lo, x.hi)
    xpeak = max(-xlo, xhi)
    if not w.is_const:
        m = reduced * xpeak * w.peak
        return -m, m, m
    rows = w.value.astype(np.int64).reshape(w.shape[0], -1)
    pos, neg = np.clip(rows, 0, None).sum(axis=1), np.clip(rows, None, 0).sum(axis=1)
    lo, hi = pos * xlo + neg * xhi, pos * xhi + neg * xlo
    return int(lo.min()), int(hi.max()), xpeak * int(np.abs(rows).sum(axis=1).max())


def check_partial(dtype: int, partial: int, what: str) -> None:
    """A float product is exact when no partial sum leaves the float's exact integers."""
    if dtype in FLOAT_EXACT and partial > FLOAT_EXACT[dtype]:
        raise Refuse(f"precision bound exceeded: {what} partial sums may reach {partial}, beyond the integers "
                     f"{type_name(dtype)} holds exactly")


def minus_zero_point(ctx, t: Tensor, zp: Tensor | None, channel_axis: int | None = None) -> Tensor:
    """t - zero_point as int32 (a per-channel zero point lies along ``channel_axis``)."""
    if zp is None:
        return as_int32(t)
    if not zp.is_const:
        raise Refuse("a zero point must be a constant")
    z = zp.value.astype(np.int64)
    if z.size > 1 and channel_axis is not None:
        z = z.reshape((-1,) + (1,) * (len(t.shape) - 1 - channel_axis))
    return minus_zero(ctx, t, z)


def dense(ctx, x: Tensor, w: Tensor, dtype: int, bias: Tensor | None = None) -> Tensor:
    """x (M, K) times w (N, K)^T (+ bias (N,)) with dense; the interval and the float check."""
    xe = ctx.narrow(x, 8, "MatMul/Gemm input")
    we = ctx.narrow(w, 8, "MatMul/Gemm weight")
    lo, hi, partial = product_interval(x, w, x.shape[1])
    ins = [xe, we]
    if bias is not None:
        lo, hi, partial = lo + bias.lo, hi + bias.hi, partial + bias.peak
        ins.append(ctx.entry(bias))
    check_partial(dtype, partial, "the product's")
    e = ctx.emit("dense", *ins, units=w.shape[0], use_bias=bias is not None)
    return ctx.result(e, dtype, lo, hi, (x.shape[0], w.shape[0]))


def matmul(ctx, a: Tensor, b: Tensor, dtype: int) -> Tensor:
    """ONNX MatMul (numpy semantics) with a right operand of rank <= 2: rows of a flattened, dense, reshaped."""
    if len(b.shape) > 2:
        raise Refuse("MatMul with a batched right operand has no CVM form (dense takes one weight matrix)")
    if not a.shape or not b.shape or a.shape[-1] != b.shape[0]:
        raise Refuse(f"MatMul operands of shapes {a.shape} and {b.shape} do not match")
    if a.is_const and b.is_const:
        return const(np.matmul(a.value, b.value), dtype)
    k = a.shape[-1]
    b2 = b if len(b.shape) == 2 else ctx.reshape(b, (k, 1))
    rows = ctx.reshape(a, (math.prod(a.shape[:-1]), k))
    y = dense(ctx, rows, transposed(ctx, b2, (1, 0)), dtype)
    shape = a.shape[:-1] + b.shape[1:] if len(a.shape) > 1 else b.shape[1:]
    return ctx.reshape(y, shape)


@rule("MatMul", since=1)
def matmul_rule(ctx, node, a, b):
    return matmul(ctx, a, b, a.dtype)


@rule("MatMulInteger", since=10)
def matmul_integer(ctx, node, a, b, a_zero=None, b_zero=None):
    """(A - a_zero_point) @ (B - b_zero_point) in int32 (a per-row a_zero_point, a per-column b_zero_point). A
    variable zero point of constant matrices: the product is affine in it (per row or column)."""
    if (k := _variable_zero_point([a, b, a_zero, b_zero])) is not None:
        return affine(ctx, node, [a, b, a_zero, b_zero], k, INT32, -2 if k == 2 else -1)
    a = minus_zero_point(ctx, a, a_zero, len(a.shape) - 2)
    return matmul(ctx, a, minus_zero_point(ctx, b, b_zero), INT32)


def _variable_zero_point(ins: list[Tensor | None]) -> int | None:
    """The position of the one variable input when it is a zero point (inputs 2, 3), else None."""
    var = [k for k, t in enumerate(ins) if t is not None and not t.is_const]
    return var[0] if len(var) == 1 and var[0] >= 2 else None


@rule("Gemm", since=7)
def gemm(ctx, node, a, b, c=None):
    """alpha * A' @ B' + beta * C with integer alpha and beta: dense (C as its bias when it is a row). Integer
    types wrap, so only the result must fit the type (the steps CVM's 32 bits); floats round, so every step must
    stay within the integers the type holds exactly."""
    alpha, beta = node.attr_float("alpha", 1.0), node.attr_float("beta", 1.0)
    if not (float(alpha).is_integer() and float(beta).is_integer()):
        raise Refuse(f"Gemm alpha={alpha}, beta={beta}: only integer factors have an exact CVM form")
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise Refuse(f"Gemm operands of shapes {a.shape} and {b.shape}: both must be matrices")
    inner = a.dtype if a.dtype in FLOAT_EXACT else INT32
    a = transposed(ctx, a, (1, 0)) if node.attr_int("transA", 0) else a
    w = b if node.attr_int("transB", 0) else transposed(ctx, b, (1, 0))
    n = w.shape[0]
    if c is not None and beta != 1:
        c = const(c.value * int(beta), c.dtype) if c.is_const else None if beta == 0 else mul(ctx, c, int(beta), inner)
    bias = None
    if c is not None and alpha == 1 and c.is_const and c.shape in ((), (1,), (n,), (1, 1), (1, n)):
        bias, c = const(np.broadcast_to(c.value.reshape(-1), (n,)), c.dtype), None
    y = dense(ctx, a, w, inner, bias)
    if alpha != 1:
        y = mul(ctx, y, int(alpha), inner)
    if c is not None:
        lo, hi = y.lo + c.lo, y.hi + c.hi
        check_values(inner, lo, hi)
        y = ctx.result(ctx.op("broadcast_add", y, c), inner, lo, hi, broadcast_shape(y, c))
    check_values(a.dtype, y.lo, y.hi)
    return replace(y, dtype=a.dtype)


def mul(ctx, t: Tensor, k: int, dtype: int) -> Tensor:
    lo, hi = sorted((t.lo * k, t.hi * k))
    check_values(dtype, lo, hi)
    return ctx.result(ctx.op("broadcast_mul", t, const(np.array([k], np.int32), INT32)), dtype, lo, hi, t.shape)


# -- convolution and pooling geometry ---------------------------------------------------------------------------


@rule("Conv", "ConvInteger", since=1)
def conv(ctx, node, x, w, b=None, w_zero=None):
    """Conv (float carrying integers, bias B) or ConvInteger (x_zero_point as 3rd input, w_zero_point) -> conv2d;
    ConvInteger of constants with a variable zero point is affine in it (per output channel for the weight's). A 3-D
    Conv with taps along the depth: ``depth_conv``; other N-D ones: the 2-D one of ``single_axes``."""
    integer = node.op_type == "ConvInteger"
    if not integer and len(x.shape) == len(w.shape) == 5 and not one_value_axes(node, x.shape, list(w.shape[2:])):
        return depth_conv(ctx, node, x, w, b)
    if len(x.shape) > 4:
        node, drop = single_axes(node, x.shape, list(w.shape[2:]))
        y = conv(ctx, node, ctx.reshape(x, without(x.shape, drop)), ctx.reshape(w, without(w.shape, drop)), b,
                 w_zero)
        return ctx.reshape(y, with_ones(y.shape, drop))
    if integer and (k := _variable_zero_point([x, w, b, w_zero])) is not None:
        return affine(ctx, node, [x, w, b, w_zero], k, INT32, 1)
    if integer:
        x, w, b = minus_zero_point(ctx, x, b), minus_zero_point(ctx, w, w_zero, 0), None
    one_d = len(x.shape) == 3
    x4, w4 = spatial_2d(ctx, x, node.op_type), spatial_2d(ctx, w, node.op_type)
    m, cg, kh, kw = w4.shape
    groups = node.attr_int("group", 1, lo=1)
    x4, strides, dilations, begin, end = conv_window(ctx, node, x4, x.shape, list(w.shape[2:]))
    n, c, h, wd = x4.shape
    plans = [aligned(size, d * (k - 1) + 1, s, pb, pe)
             for size, k, s, d, pb, pe in zip((h, wd), (kh, kw), strides, dilations, begin, end)]
    xe, we = ctx.narrow(x4, 8, f"{node.op_type} input X"), ctx.narrow(w4, 8, f"{node.op_type} weight W")
    lo, hi, partial = product_interval(x4, w4, cg * kh * kw, padded=any(begin + end))
    ins = [xe, we]
    if b is not None:
        lo, hi, partial = lo + b.lo, hi + b.hi, partial + b.peak
        ins.append(ctx.entry(b))
    dtype = INT32 if integer else x.dtype
    check_partial(dtype, partial, "the convolution's")
    e = ctx.emit("conv2d", *ins, channels=m, kernel_size=(kh, kw), strides=tuple(strides),
                 padding=tuple(p for p, _, _ in plans), dilation=tuple(dilations), groups=groups,
                 use_bias=b is not None)
    y = ctx.result(e, dtype, lo, hi)
    y = select(ctx, y, [o for _, o, _ in plans], [1, 1], [k for _, _, k in plans])
    return ctx.reshape(y, (n, m, y.shape[3])) if one_d else y


def depth_conv(ctx, node, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """A 3-D Conv (taps along the depth) as one conv2d over its depth taps stacked into channels (``depth_folded``,
    zero padding): the constant weight (M, C/G, kd, kh, kw) arranged (M, kd C/G, kh, kw)."""
    if not w.is_const:
        raise Refuse("Conv 3-D of a weight computed at run time has no CVM form (its taps are arranged at import)")
    groups = node.attr_int("group", 1, lo=1)
    t, plain = depth_folded(ctx, node, x, 0, list(w.shape[2:]), groups)
    m, cg, kd, kh, kw = w.shape
    arranged = const(np.transpose(w.value, (0, 2, 1, 3, 4)).reshape(m, kd * cg, kh, kw), w.dtype)
    return depth_unfolded(ctx, conv(ctx, plain, t, arranged, b), x.shape[0])


def pool_plan(size: int, k: int, s: int, pb: int, pe: int, ceil: bool) -> tuple[int, int, int, int]:
    """(P, CVM stride, offset, out) for one axis of a max pooling: ONNX's output count (ceil mode drops a last
    window starting in the end padding), then the stride-aligned symmetric padding if it stays below the
    kernel (CVM's rule), else stride 1 with P = the larger pad, the slice taking every s-th window."""
    span = size + pb + pe - k
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + pb:
        out -= 1
    reach = max((out - 1) * s + k - size - pb, 0)  # the end padding the last window reaches
    p, offset, _ = aligned(size, k, s, pb, reach)
    if p < k:
        return p, s, offset, out
    p = max(pb, reach)
    if p >= k:
        raise Refuse(f"MaxPool pads ({pb}, {pe}) reach a window of padding only (kernel {k})")
    return p, 1, p - pb, out


def depth_max_pool(ctx, node, x: Tensor, kernel: list[int]) -> Tensor:
    """A 3-D MaxPool (taps along the depth) as the 2-D one of every depth tap (``depth_taps``, padded with the least
    value x takes, which never wins), the taps as channels, then ``max`` over each window's kd taps."""
    taps, plain, out = depth_taps(ctx, node, x, x.lo, kernel, ceil=bool(node.attr_int("ceil_mode", 0)))
    n, c, _, hh, ww = taps.shape
    [y, _] = max_pool(ctx, plain, ctx.reshape(taps, (n, c * out * kernel[0], hh, ww)))
    y = ctx.reshape(y, (n, c, out, kernel[0]) + y.shape[2:])
    return ctx.reshape(reduced(ctx, "max", y, [3], y.lo, y.hi), (n, c, out) + y.shape[4:])


@rule("MaxPool", since=1)
def max_pool(ctx, node, x):
    """MaxPool (int8, uint8, floats) -> max_pool2d; padding never wins in either. With dilations: ``dilated``. An
    N-D one (N > 2) as the 2-D one of ``single_axes``."""
    if node.attr_int("storage_order", 0) != 0:
        raise Refuse("MaxPool storage_order=1 concerns the Indices output, which has no CVM form")
    if len(x.shape) == 5 and not one_value_axes(node, x.shape, kernel := node.attr_ints("kernel_shape", lo=1, size=3)):
        return [depth_max_pool(ctx, node, x, kernel), None]
    if len(x.shape) > 4:
        node, drop = single_axes(node, x.shape, node.attr_ints("kernel_shape"))
        [y, _] = max_pool(ctx, node, ctx.reshape(x, without(x.shape, drop)))
        return [ctx.reshape(y, with_ones(y.shape, drop)), None]
    one_d = len(x.shape) == 3
    x4 = spatial_2d(ctx, x, "MaxPool")
    kernel = attrs_2d(node, "kernel_shape", None, one_d, 1)
    strides = attrs_2d(node, "strides", 1, one_d, 1)
    dilations = attrs_2d(node, "dilations", 1, one_d, 1)
    if any(d != 1 for d in dilations):
        return [dilated(ctx, node, x, x4, kernel, strides, dilations), None]
    begin, end = onnx_pads(node, x.shape[2:], kernel[-len(x.shape) + 2:], strides[-len(x.shape) + 2:],
                           [1] * (len(x.shape) - 2), crop=True)
    if one_d:
        begin, end = [0] + begin, [0] + end
    x4, begin, end = cropped(ctx, x4, begin, end)
    n, c, h, w = x4.shape
    plans = [pool_plan(size, k, s, pb, pe, bool(node.attr_int("ceil_mode", 0)))
             for size, k, s, pb, pe in zip((h, w), kernel, strides, begin, end)]
    e = ctx.emit("max_pool2d", x4.entry, pool_size=tuple(kernel), strides=tuple(p[1] for p in plans),
                 padding=tuple(p[0] for p in plans))
    y = ctx.result(e, x.dtype, x.lo, x.hi)
    y = select(ctx, y, [p[2] for p in plans], [s // p[1] for s, p in zip(strides, plans)], [p[3] for p in plans])
    return [ctx.reshape(y, (n, c, y.shape[3])) if one_d else y, None]


#: Kernel positions of a dilated MaxPool (one strided_slice and one broadcast_max each).
MAX_TAPS = 64


def dilated(ctx, node, x: Tensor, x4: Tensor, kernel: list[int], strides: list[int], dilations: list[int]) -> Tensor:
    """MaxPool with dilations d: y[o] = max over kernel positions i of x[o s - b + i d] (b the begin pad; positions
    in the padding never win): the input padded with its least value x.lo (concatenate of constants of at most
    2^24 elements, refused past it), one
    strided_slice per kernel position (start i d, step s, ONNX's output count, ceil mode as ``pool_plan``
    counts it), and their broadcast_max. Exact: the same windows, the same max. auto_pad SAME_UPPER: as ONNX states it
    where the model declares its output shape (``same_declared``). ``x4``: x with two spatial axes; ``kernel``,
    ``strides``, ``dilations``: two values each (``max_pool`` reads them)."""
    one_d = len(x.shape) == 3
    if node.attr_str("auto_pad", "NOTSET").startswith("SAME"):
        same_declared(ctx, node, x, kernel, strides, dilations)
    if math.prod(kernel) > MAX_TAPS:
        raise Refuse(f"dilated MaxPool of {math.prod(kernel)} kernel positions: one slice each, at most {MAX_TAPS}")
    spatial = len(x.shape) - 2
    begin, end = onnx_pads(node, x.shape[2:], kernel[-spatial:], strides[-spatial:], dilations[-spatial:], crop=True)
    if one_d:
        begin, end = [0] + begin, [0] + end
    x4, begin, end = cropped(ctx, x4, begin, end)
    n, c, h, w = x4.shape
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
    outs = [pool_plan(size, k, s, pb, pe, bool(node.attr_int("ceil_mode", 0)))[3]
            for size, k, s, pb, pe in zip((h, w), spans, strides, begin, end)]
    reach = [max((o - 1) * s + k - size - pb, 0) for o, s, k, size, pb in zip(outs, strides, spans, (h, w), begin)]
    padded = x4
    for axis, (pb, pe) in enumerate(zip(begin, reach), start=2):
        shapes = [padded.shape[:axis] + (p,) + padded.shape[axis + 1:] for p in (pb, pe) if p]
        if any(math.prod(shape) > MAX_FOLDED for shape in shapes):
            raise Refuse(f"dilated MaxPool of {x.shape}: its padding of shape {max(shapes, key=math.prod)} would be "
                         "a constant of more than 2^24 elements")
        fill = [const(np.full(shape, x.lo, np.int64), x.dtype) for shape in shapes]
        if fill:
            parts = (fill[:1] if pb else []) + [padded] + (fill[-1:] if pe else [])
            padded = concatenated(ctx, axis, *parts)
    taps = []
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            taps.append(strided_slice(ctx, padded, [range(n), range(c)] + [
                range(k * d, k * d + s * (o - 1) + 1, s)
                for k, d, s, o in zip((i, j), dilations, strides, outs)]))
    y = extreme(ctx, True, [as_int32(t) for t in taps]) if len(taps) > 1 else taps[0]
    y = replace(y, dtype=x.dtype, lo=max(y.lo, x.lo), hi=min(y.hi, x.hi))
    return ctx.reshape(y, (n, c, y.shape[3])) if one_d else y


def same_declared(ctx, node, x: Tensor, kernel: list[int], strides: list[int], dilations: list[int]) -> None:
    """A dilated MaxPool with auto_pad SAME_UPPER: ONNX gives ceil(size / stride) outputs per axis, padded by the
    total (out - 1) stride + dilated kernel - size, the odd one at the end (``onnx_pads``), as onnx.reference
    computes it, where onnxruntime pads for the undilated kernel and gives fewer; imported so only where the model
    declares that output shape, the total is >= 0 (a negative one, a stride beyond the dilated kernel, has no split
    ONNX states) and every window reads an input value, else refused. SAME_LOWER is refused: onnx.reference splits
    its padding unlike ONNX's text (and gives other output counts with strides)."""
    auto = node.attr_str("auto_pad")
    if auto == "SAME_LOWER":
        raise Refuse("MaxPool with dilations and auto_pad SAME_LOWER: ONNX's text, its reference implementation "
                     "(onnx.reference) and onnxruntime each pad it differently; give explicit pads")
    spatial = x.shape[2:]
    n = len(spatial)
    want = tuple(x.shape[:2]) + tuple(-(-size // s) for size, s in zip(spatial, strides[-n:]))
    totals = [(o - 1) * s + (k - 1) * d + 1 - size
              for o, s, k, d, size in zip(want[2:], strides[-n:], kernel[-n:], dilations[-n:], spatial)]
    if min(totals) < 0:
        raise Refuse(f"MaxPool with dilations and auto_pad {auto} pads a negative total {min(totals)} (a stride "
                     "beyond the dilated kernel): ONNX states no split of it; give explicit pads")
    for o, s, k, d, size, t in zip(want[2:], strides[-n:], kernel[-n:], dilations[-n:], spatial, totals):
        if any(all(not 0 <= j * s - t // 2 + i * d < size for i in range(k)) for j in range(o)):
            raise Refuse(f"MaxPool with dilations and auto_pad {auto} over {size} values (kernel {k}, dilation {d}): "
                         "a window of padding only, which no input value fills")
    declared = ctx.shapes.get(node.proto.output[0])
    if declared != want:
        said = "declares no output shape" if declared is None else f"declares the output shape {declared}"
        raise Refuse(f"MaxPool with dilations and auto_pad {auto}: ONNX gives the output shape {want} (padded for "
                     f"the dilated kernel), onnxruntime fewer outputs (padded for the undilated one); the model "
                     f"{said}: declare {want} (value_info) or give explicit pads")


# -- nearest resizing -------------------------------------------------------------------------------------------
#: onnxruntime's round modes of Resize nearest read a coordinate c as a tie where |c - floor(c) - 1/2| <= TIE (in
#: float32), and round it to floor(c) (round_prefer_floor) or ceil(c) (round_prefer_ceil) there.
TIE = np.float32(1e-6)
NEAREST_MODES = ("half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners", "tf_half_pixel_for_nn",
                 "half_pixel_symmetric")


def float_coordinate(mode: str, out: int, size: int, s: np.float32) -> np.ndarray:
    """The float32 input coordinate of each of ``out`` outputs resizing ``size`` values at the float32 scale s, in
    onnxruntime's operations and their order: half_pixel (o + 1/2) / s - 1/2 (pytorch_half_pixel: the same where
    out > 1, else 0), asymmetric o / s, tf_half_pixel_for_nn (o + 1/2) / s, align_corners o (size - 1) / (out - 1)
    (0 where out = 1), half_pixel_symmetric f + (o + 1/2) / s - 1/2 in float64 with f = size / 2 (1 - out / (s size))
    in float32."""
    o, half = np.arange(out, dtype=np.float32), np.float32(0.5)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        if mode == "half_pixel" or mode == "pytorch_half_pixel" and out > 1:
            return (o + half) / s - half
        if mode == "pytorch_half_pixel" or mode == "align_corners" and out == 1:
            return np.zeros(out, np.float32)
        if mode == "asymmetric":
            return o / s
        if mode == "tf_half_pixel_for_nn":
            return (o + half) / s
        if mode == "align_corners":
            return o * np.float32(size - 1) / np.float32(out - 1)
        offset = np.float32(size) / np.float32(2) * (np.float32(1) - np.float32(out) / (s * np.float32(size)))
        return (np.float64(offset) + (o.astype(np.float64) + 0.5) / np.float64(s) - 0.5).astype(np.float32)


def rounded(nearest: str, c: np.ndarray) -> np.ndarray:
    """The integers onnxruntime's nearest mode makes of the float32 coordinates c: floor, ceil; the round modes
    floor(c) or ceil(c) at a tie (``TIE``), else c rounded half away from zero."""
    low = np.floor(c)
    if nearest == "floor":
        return low
    if nearest == "ceil":
        return np.ceil(c)
    if nearest not in ("round_prefer_floor", "round_prefer_ceil"):
        raise Refuse(f"Resize nearest_mode={nearest} is not an ONNX value")
    frac = c - low
    tie = np.abs(frac - np.float32(0.5)) <= TIE
    return np.where(tie, low if nearest == "round_prefer_floor" else np.ceil(c), low + (frac > np.float32(0.5)))


def nearest_indices(node, shape: tuple[int, ...], full: list[int], scales, sizes) -> list[np.ndarray | None]:
    """Per axis, the input index of each output of Resize nearest (None where the axis is kept), as onnxruntime picks
    it: every axis kept where the output shape is the input's, else per axis at the float32 scale s (the ``scales``
    value, 1 on the axes not listed; float32 out / float32 size for ``sizes``), kept at s = 1, else the rounded
    (``rounded``) float32 coordinate (``float_coordinate``), clamped to [0, size - 1]."""
    mode = node.attr_str("coordinate_transformation_mode", "half_pixel")
    rounding = node.attr_str("nearest_mode", "round_prefer_floor")
    if mode not in NEAREST_MODES:
        raise Refuse(f"Resize nearest with coordinate_transformation_mode={mode} has no exact CVM form here")
    if list(full) == list(shape):
        return [None] * len(shape)
    if sizes is not None and sizes.size:
        factors = [np.float32(o) / np.float32(d) for o, d in zip(full, shape)]
    else:
        factors = [np.float32(float(f)) for f in resize_scales(node, shape, full, scales, sizes)]
    return [None if s == 1 else np.clip(rounded(rounding, float_coordinate(mode, o, d, s)), 0, d - 1).astype(np.int64)
            for d, o, s in zip(shape, full, factors)]


@rule("Resize", since=11)
def resize(ctx, node, x, roi=None, scales=None, sizes=None):
    """Resize nearest at any scale (``nearest_indices``): x[o // s] by integer scales s is ``nearest``
    (upsampling or repeat), any other pick a ``take`` of the constant indices per resized axis."""
    mode = node.attr_str("mode", "nearest")
    if mode != "nearest":
        raise Refuse(f"Resize mode={mode}: only nearest has an exact CVM form on integers (linear: between "
                     "quantized tensors)")
    full = resized_shape(node, x, scales, sizes)
    if len(full) != len(x.shape) or any(not 1 <= o <= MAX_DIM for o in full):
        raise Refuse(f"Resize of {x.shape} to {tuple(full)}: every output axis must hold 1 to 2^24 values")
    picks = nearest_indices(node, x.shape, full, scales, sizes)
    if all(p is None or o % d == 0 and np.array_equal(p, np.arange(o) // (o // d))
           for p, o, d in zip(picks, full, x.shape)):  # an integer upsampling
        return nearest(ctx, x, [o // d for o, d in zip(full, x.shape)])
    for axis, p in enumerate(picks):
        if p is not None:
            shape = x.shape[:axis] + (len(p),) + x.shape[axis + 1:]
            x = const(np.take(x.value, p, axis=axis), x.dtype) if x.is_const else \
                ctx.result(ctx.op("take", x, const(p.astype(np.int32), INT32), axis=axis), x.dtype, x.lo, x.hi, shape)
    return x


@rule("Upsample", since=7)
def upsample(ctx, node, x, scales=None):
    """Upsample (opset 7 to 9) nearest: x[o // s] for integer scales s."""
    mode = node.attr_str("mode", "nearest")
    if mode != "nearest":
        raise Refuse(f"Upsample mode={mode}: only nearest has an exact CVM form")
    values = node.attr_floats("scales") if node.opset < 9 else scales.value.reshape(-1) if scales is not None and \
        scales.is_const else None
    if values is None:
        raise Refuse("Upsample scales must be a constant")
    return nearest(ctx, x, integer_scales(x, [scaled_size(d, v) for d, v in zip(x.shape, values)]))

