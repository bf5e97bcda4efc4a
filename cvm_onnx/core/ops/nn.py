"""Neural-network ops, NCHW: conv2d, dense, max_pool2d, upsampling, relu."""
from __future__ import annotations

import math
from functools import reduce
from typing import Any, Callable

import numpy as np

from ..constants import FLOAT32_EXACT, FLOAT64_EXACT, INT32_MAX
from .registry import Attr, Op, bits, in_range, input_bound, magnitudes, one_of, register, require


def ints(*counts: int, lo: int | None = None, hi: int | None = None) -> Callable[[Any], str | None]:
    """Check for a tuple of one of ``counts`` lengths whose items lie in [lo, hi] (ndim check + VerifyAttrRange)."""

    def check(value: tuple[int, ...]) -> str | None:
        if len(value) not in counts:
            return f"must have {' or '.join(map(str, counts))} values"
        return None if lo is None else in_range(lo, hi)(value)

    return check


def with_bias(a) -> tuple[int, int]:
    """Input count of conv2d and dense: data, weight and, when ``use_bias``, bias."""
    return (3, 3) if a.use_bias else (2, 2)


def require_bias(bias, size: int, name: str) -> None:
    """Rule on the optional bias: shape (size,)."""
    if bias is not None:
        require(tuple(bias) == (size,), f"bias shape {tuple(bias)} must be ({name},) = ({size},)")


def absmax(x: np.ndarray) -> int:
    return max(-int(x.min()), int(x.max()), 0)


#: The most values conv2d holds at once in each of its im2col, its weights and its products (8 MiB of float64 each):
#: larger inputs are taken in blocks of samples, of output rows and of output channels, whose sums are the same.
COLS = 1 << 20


#: The fewest terms a float32 block of ``exact_form`` sums: with fewer, float64 over all terms is the cheaper form.
MIN_TERMS = 256


def exact_form(a: np.ndarray, b: np.ndarray, k: int) -> tuple[type, int]:
    """The cheapest dtype in which the products of integer arrays ``a`` and ``b`` summed over ``k`` terms are exact,
    and the terms it sums at once (``summed``).

    Every product and every partial sum of t terms is an integer of magnitude at most max|a| * max|b| * t. Below
    2^24 (float32) or 2^53 (float64) such integers and every sum of them are exactly representable, so each BLAS
    operation (fused or not, in whatever order it adds) is exact and the float result is the exact integer sum.
    float32 over all k terms where that bound holds for t = k; else, where it holds for k in float64, float32 over
    blocks of the most terms t >= ``MIN_TERMS`` it holds for, each block's exact sum added in float64 (exact: every
    partial sum of the k terms is below 2^53); else float64 over all terms. The precision rule of conv2d/dense
    (inputs <= 8 bits, |v| <= 127) gives float32 for k <= 1040, in blocks for k < 2^39. Beyond (inputs outside
    their precision) int64: its wrap-around agrees with the runtime's int32 accumulation modulo 2^32.
    """
    top = absmax(a) * absmax(b)
    if top * k < FLOAT32_EXACT:
        return np.float32, k
    if top * k >= FLOAT64_EXACT:
        return np.int64, k
    terms = (FLOAT32_EXACT - 1) // top
    return (np.float32, terms) if terms >= MIN_TERMS else (np.float64, k)


def summed(a: np.ndarray, b: np.ndarray, terms: int) -> np.ndarray:
    """``np.matmul(a, b)`` (a's last axis against b's second to last) of arrays of integers in ``exact_form``'s
    dtype: ``terms`` at a time, the blocks added in float64 (one block: a's dtype)."""
    k = a.shape[-1]
    if terms >= k:
        return np.matmul(a, b)
    out = np.matmul(a[..., :terms], b[..., :terms, :]).astype(np.float64)
    for k0 in range(terms, k, terms):
        out += np.matmul(a[..., k0:k0 + terms], b[..., k0:k0 + terms, :])
    return out


def product_precision(name: str, precisions: list[int], reduced: int, use_bias: bool) -> int:
    """p_data + p_weight + bits(reduced length), then max(., p_bias) + 1 with a bias; inputs must be <= 8 bits."""
    p_data, p_weight = precisions[0], precisions[1]
    require(p_data <= 8, f"{name} data precision {p_data} must be <= 8")
    require(p_weight <= 8, f"{name} weight precision {p_weight} must be <= 8")
    out = p_data + p_weight + bits(reduced)
    return max(out, precisions[2]) + 1 if use_bias else out


def product_bound(a, x: int, w: int, w_value: np.ndarray | None, b: int, b_value: np.ndarray | None,
                  per_row: int) -> int:
    """max over output channels of sum|w_row| * B_x + |bias|: conv2d (rows of C/g*kh*kw) and dense (rows of K)."""
    if w_value is not None:
        rows = np.add.reduce(magnitudes(w_value).reshape(w_value.shape[0], -1), axis=1, dtype=np.int64) * x
    else:
        rows = np.full(1, per_row * w * x, np.int64)
    if a.use_bias:
        rows = rows + (magnitudes(b_value).astype(np.int64) if b_value is not None else b)
    return int(rows.max())


@register
class Conv2D(Op):
    """2-D convolution, NCHW/OIHW, groups, zero padding, dilation, optional bias; int32 accumulation.

    y[n,oc,oh,ow] = sum_{ic<C/g, fh, fw} x[n, oc/(OC/g)*(C/g)+ic, oh*sh+fh*dh-ph, ow*sw+fw*dw-pw] * w[oc,ic,fh,fw]
    (+ bias[oc]); input positions outside the image contribute 0.
    """

    name = "conv2d"
    family = "nn"
    input_names = ("data", "weight", "bias")
    attrs = (
        Attr("channels", "int"),
        Attr("kernel_size", "tuple", check=ints(2)),
        Attr("strides", "tuple", (1, 1), ints(2, lo=1, hi=4096)),
        Attr("padding", "tuple", (0, 0), ints(2, lo=0, hi=4096)),
        Attr("dilation", "tuple", (1, 1), ints(2, lo=1, hi=4096)),
        Attr("groups", "int", 1),
        Attr("layout", "str", "NCHW", one_of("NCHW")),
        Attr("kernel_layout", "str", "OIHW", one_of("OIHW")),
        Attr("out_layout", "str", "__undef__", one_of("__undef__", "NCHW")),
        # a dtype enum: other names parse in the runtime but fail its all-int32 type check
        Attr("out_dtype", "str", "same", one_of("same", "int32")),
        Attr("use_bias", "bool", True),
    )
    inputs = with_bias

    @staticmethod
    def bound(a, shapes, bounds, values):
        w = shapes[1]
        return [product_bound(a, bounds[0], bounds[1], values[1], bounds[2] if a.use_bias else 0,
                              values[2] if a.use_bias else None, w[1] * w[2] * w[3])]

    @staticmethod
    def shape(a, data, weight, bias=None):
        require(len(data) == 4, f"data shape {tuple(data)} must be 4-D (N, C, H, W)")
        n, c, h, w = data
        g = a.groups
        require(g > 0 and c % g == 0 and a.channels % g == 0,
                f"groups={g} must be > 0 and divide both the input channels C={c} and channels={a.channels}")
        kh, kw = a.kernel_size
        expect = (a.channels, c // g, kh, kw)
        require(tuple(weight) == expect,
                f"weight shape {tuple(weight)} must be (channels, C/groups, kh, kw) = {expect}")
        require_bias(bias, a.channels, "channels")
        (ph, pw), (dh, dw), (sh, sw) = a.padding, a.dilation, a.strides
        ekh, ekw = dh * (kh - 1) + 1, dw * (kw - 1) + 1
        require(ekh <= h + 2 * ph and ekw <= w + 2 * pw,
                f"dilated kernel ({ekh}, {ekw}) must fit in the padded input ({h + 2 * ph}, {w + 2 * pw})")
        return n, a.channels, (h + 2 * ph - ekh) // sh + 1, (w + 2 * pw - ekw) // sw + 1

    @staticmethod
    def precision(a, precisions, shapes):
        oc, cg, kh, kw = shapes[1]
        return product_precision("conv2d", precisions, cg * kh * kw, a.use_bias)

    @staticmethod
    def base_ops(a, shapes, out):
        """3 per product of an output's window (weight size / channels), 1 more with a bias."""
        oc, cg, kh, kw = shapes[1]
        return cg * kh * kw * 3 + a.use_bias

    @staticmethod
    def kernel(a, x, w, b=None):
        n, c, h, wd = x.shape
        oc, cg, kh, kw = w.shape
        (ph, pw), (dh, dw), (sh, sw) = a.padding, a.dilation, a.strides
        out = ((h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1)
        y = _on_lattice(x, w, a.padding, out, a.dilation, a.groups) if a.strides == (1, 1) else None
        if y is None:
            y = np.zeros((n, oc, *out), np.int32)
            conv_sums(x, w, a.padding, a.dilation, a.strides, a.groups, y)
        if b is not None:
            y += b.astype(np.int32).reshape(1, oc, 1, 1)  # int32 accumulation's wrap-around
        return y


def conv_sums(x: np.ndarray, w: np.ndarray, origin: tuple[int, int], dilation: tuple[int, int],
              strides: tuple[int, int], groups: int, into: np.ndarray) -> None:
    """y[n,oc,oh,ow] = sum_{ic<C/g, fh, fw} x[n, oc/(OC/g)*(C/g)+ic, oh*sh+fh*dh-oy, ow*sw+fw*dw-ox] * w[oc,ic,fh,fw]
    (0 outside x), ``origin`` (oy, ox): conv2d's sums without its bias, each in ``exact_form``'s dtype, added to
    ``into`` (N, OC, OH, OW; int32, a view of a larger array alike) as int32 accumulation adds (wrapping)."""
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    oh, ow = into.shape[2:]
    g, ocg, k = groups, oc // groups, cg * kh * kw
    dtype, terms = exact_form(x, w, k)
    wm = w.reshape(g, ocg, k)
    # output channels of each group a block at a time, at most COLS weights (converted once if one block)
    per_o = max(1, COLS // (g * k))
    whole = wm.astype(dtype) if per_o >= ocg else None
    # samples or output rows a block at a time: im2col and the products each at most COLS values (or a row's)
    rows = max(1, COLS // (max(c * kh * kw, oc) * ow))
    per, step = (max(1, rows // oh), oh) if rows >= oh else (1, rows)
    for s0 in range(0, n, per):
        xs = x[s0:s0 + per]
        m = len(xs)
        sums = into[s0:s0 + m].reshape(m, g, ocg, oh, ow)  # a view: one axis split
        for r0 in range(0, oh, step):
            r1 = min(oh, r0 + step)
            cols = _im2col(xs, r0, r1, ow, (kh, kw), origin, dilation, strides, dtype)
            cols = cols.reshape(m, g, k, (r1 - r0) * ow)
            for o0 in range(0, ocg, per_o):
                o1 = min(ocg, o0 + per_o)
                wb = whole[:, o0:o1] if whole is not None else wm[:, o0:o1].astype(dtype)
                block = summed(wb, cols, terms).astype(np.int64).reshape(m, g, o1 - o0, r1 - r0, ow)
                sums[:, :, o0:o1, r0:r1] += block.astype(np.int32)
            del cols  # freed before the next block's is made


def _im2col(x: np.ndarray, r0: int, r1: int, ow: int, kernel: tuple[int, int], origin: tuple[int, int],
            dilation: tuple[int, int], strides: tuple[int, int], dtype: type) -> np.ndarray:
    """cols[n, ic, fh*kw+fw, oh-r0, ow] = x[n, ic, oh*sh + fh*dh - oy, ow*sw + fw*dw - ox] (0 outside x) for the
    output rows r0..r1-1, as ``dtype``: from a zero-padded slab of the input rows they read alone."""
    n, c, h, wd = x.shape
    (kh, kw), (oy, ox), (dh, dw), (sh, sw) = kernel, origin, dilation, strides
    top, span = r0 * sh - oy, (r1 - 1 - r0) * sh + (kh - 1) * dh + 1
    width = (ow - 1) * sw + (kw - 1) * dw + 1
    slab = np.zeros((n, c, span, width), x.dtype)
    lo, hi = max(top, 0), min(top + span, h)
    left, right = max(-ox, 0), min(wd, width - ox)
    if lo < hi and left < right:
        slab[:, :, lo - top:hi - top, left + ox:right + ox] = x[:, :, lo:hi, left:right]
    cols = np.empty((n, c, kh * kw, r1 - r0, ow), dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i * kw + j] = slab[:, :, i * dh:i * dh + (r1 - 1 - r0) * sh + 1:sh,
                                          j * dw:j * dw + (ow - 1) * sw + 1:sw]
    return cols


def _lattice(x: np.ndarray, cap: tuple[int, int]) -> tuple[np.ndarray, tuple[int, int] | None,
                                                             tuple[int, int] | None] | None:
    """(beta, (a, P), (b, Q)): every value of ``x`` (N, C, H, W) that differs from beta[n, c] (the value of sample
    n, channel c at all of x's other positions) lies in a row a + P t and a column b + Q u, P and Q divisors of
    their rows' and columns' spacing at most ``cap``, P Q > 1 (a transposed convolution's input: its values with
    s - 1 rows and columns between them, of 0 or of a zero point's offset); (a, P) and (b, Q) None where x holds
    beta alone; None where x has no such lattice."""
    n, c, h, w = x.shape
    flat = x.reshape(n * c, h, w)
    ends = [(flat.max(axis=k), flat.min(axis=k)) for k in (2, 1)]  # per (sample, channel): rows', columns'
    for hi, lo in ends:
        even = np.flatnonzero((hi == lo).all(axis=0))  # rows (columns) of one value per (sample, channel)
        if len(even):
            beta = hi[:, even[0]]
            break
    else:
        return None
    on = [np.flatnonzero(((hi != beta[:, None]) | (lo != beta[:, None])).any(axis=0)) for hi, lo in ends]
    if not len(on[0]):
        return beta.reshape(n, c), None, None
    periods = []
    for at, most in zip(on, cap):
        spacing = int(np.gcd.reduce(np.diff(at))) if len(at) > 1 else 1
        periods.append((int(at[0]), max(p for p in range(1, min(spacing, most) + 1) if spacing % p == 0)))
    if periods[0][1] * periods[1][1] == 1:
        return None
    return beta.reshape(n, c), periods[0], periods[1]


def _inside(out: int, k: int, dilation: int, padding: int, size: int) -> np.ndarray:
    """[o, f]: 1 where output o's tap f reads inside the input (0 <= o + f * dilation - padding < size), else 0."""
    at = np.arange(out)[:, None] + np.arange(k) * dilation - padding
    return ((at >= 0) & (at < size)).astype(np.int64)


def _on_lattice(x: np.ndarray, w: np.ndarray, padding: tuple[int, int], out: tuple[int, int],
                dilation: tuple[int, int], groups: int) -> np.ndarray | None:
    """conv2d's sums at stride 1 over an input on a lattice (``_lattice``), else None: x = beta + d, d zero off the
    lattice, so y = conv(d) + conv(beta). conv(d) by the phases of the output (oh mod P, ow mod Q): each reads the
    lattice's values alone through the taps that meet it, a conv2d of the compacted d by that subset of the
    kernel; conv(beta)[n, oc, oh, ow] the sum of sum_ic beta[n, ic] w[oc, ic, fh, fw] over the taps that read
    inside the image. The same integers, 1/(P Q) of the products; in int64, wrapped as int32 accumulation."""
    oc, cg, kh, kw = w.shape
    (ph, pw), (dh, dw) = padding, dilation
    found = _lattice(x, (kh * dh, kw * dw))
    if found is None:
        return None
    beta, along_h, along_w = found
    n, c, h, wd = x.shape
    # sum_ic beta[n, ic] w[oc, ic, fh, fw] per tap: exact (``exact_form``), a tap's weights converted at a time
    dtype, terms = exact_form(beta, w, cg)
    per_tap, by = np.empty((n, oc, kh, kw), np.int64), beta.reshape(n, groups, 1, cg).astype(dtype)
    for i in range(kh):
        for j in range(kw):
            tap = w[:, :, i, j].reshape(groups, oc // groups, cg).transpose(0, 2, 1).astype(dtype)
            per_tap[:, :, i, j] = summed(by, tap, terms).astype(np.int64).reshape(n, oc)
    rows, cols = (_inside(*axis) for axis in ((out[0], kh, dh, ph, h), (out[1], kw, dw, pw, wd)))
    # the output rows' few distinct sets of taps inside (all of them, but near the borders), each summed once
    kinds, kind = np.unique(rows, axis=0, return_inverse=True)
    y = np.matmul(kinds, np.matmul(per_tap, cols.T)).astype(np.int32)[:, :, kind.reshape(-1)]
    if along_h is None:
        return y
    (a, p), (b, q) = along_h, along_w
    top = absmax(x)  # x - beta within int16, int32
    wide = np.int16 if top < 1 << 14 else np.int32 if top < 1 << 30 else np.int64
    d = x[:, :, a::p, b::q].astype(wide)
    d -= beta.astype(wide)[:, :, None, None]
    step_h, step_w = p // math.gcd(dh, p), q // math.gcd(dw, q)  # the taps meeting the lattice: every step-th
    for u in range(min(p, out[0])):
        fh = next((f for f in range(kh) if (u + f * dh - ph - a) % p == 0), None)
        for v in range(min(q, out[1])):
            fw = next((f for f in range(kw) if (v + f * dw - pw - b) % q == 0), None)
            if fh is None or fw is None:
                continue
            conv_sums(d, w[:, :, fh::step_h, fw::step_w], (-((u + fh * dh - ph - a) // p),
                                                           -((v + fw * dw - pw - b) // q)),
                      (step_h * dh // p, step_w * dw // q), (1, 1), groups, y[:, :, u::p, v::q])
    return y


@register
class Dense(Op):
    """Fully connected: y[m,n] = sum_k x[m,k] * w[n,k] (+ b[n]); int32 accumulation."""

    name = "dense"
    family = "nn"
    input_names = ("data", "weight", "bias")
    attrs = (
        Attr("units", "int", check=in_range(1, INT32_MAX)),
        Attr("use_bias", "bool", True),
    )
    inputs = with_bias

    @staticmethod
    def bound(a, shapes, bounds, values):
        return [product_bound(a, bounds[0], bounds[1], values[1], bounds[2] if a.use_bias else 0,
                              values[2] if a.use_bias else None, shapes[1][1])]

    @staticmethod
    def shape(a, data, weight, bias=None):
        require(len(data) == 2, f"data shape {tuple(data)} must be 2-D (M, K)")
        expect = (a.units, data[1])
        require(tuple(weight) == expect, f"weight shape {tuple(weight)} must be (units, K) = {expect}")
        require_bias(bias, a.units, "units")
        return data[0], a.units

    @staticmethod
    def precision(a, precisions, shapes):
        return product_precision("dense", precisions, shapes[0][1], a.use_bias)

    @staticmethod
    def base_ops(a, shapes, out):
        """3 per product (the weight's second dimension, K), 1 more with a bias."""
        return shapes[1][1] * 3 + a.use_bias

    @staticmethod
    def kernel(a, x, w, b=None):
        dtype, terms = exact_form(x, w, x.shape[1])
        y = summed(x.astype(dtype), w.T.astype(dtype), terms).astype(np.int64)
        if b is not None:
            y += b
        return y.astype(np.int32)


def pool_pads(padding: tuple[int, ...]) -> tuple[int, int]:
    """(ph, pw): one value pads both axes, two are (top=bottom, left=right)."""
    return (padding[0], padding[-1])


def pool_out(size: int, k: int, s: int, p: int, ceil_mode: bool) -> int:
    return (size + 2 * p - k + (s - 1 if ceil_mode else 0)) // s + 1


@register
class MaxPool2D(Op):
    """Max over each window; padded positions never win (every valid window holds an input position)."""

    name = "max_pool2d"
    keeps_nonnegative = True
    family = "nn"
    bound = staticmethod(input_bound)
    attrs = (
        Attr("pool_size", "tuple", check=ints(2)),
        Attr("strides", "tuple", (1, 1), ints(2, lo=1, hi=4096)),
        Attr("padding", "tuple", (0, 0), ints(1, 2, lo=0, hi=4096)),
        Attr("layout", "str", "NCHW", one_of("NCHW")),
        Attr("ceil_mode", "bool", False),
    )

    @staticmethod
    def shape(a, data):
        require(len(data) == 4, f"data shape {tuple(data)} must be 4-D (N, C, H, W)")
        n, c, h, w = data
        out = []
        for axis, size, k, s, p in zip("HW", (h, w), a.pool_size, a.strides, pool_pads(a.padding)):
            require(0 <= k <= size + 2 * p,
                    f"pool_size {k} must lie in [0, {axis}+2*padding] = [0, {size + 2 * p}]")
            require(p < k, f"padding {p} must be < pool_size {k}")
            o = pool_out(size, k, s, p, a.ceil_mode)
            require(not a.ceil_mode or (o - 1) * s - p < size,
                    f"with ceil_mode the last window must start inside the input: "
                    f"(out-1)*stride-padding = {(o - 1) * s - p} must be < {axis} = {size}")
            out.append(o)
        return n, c, out[0], out[1]

    @staticmethod
    def base_ops(a, shapes, out):
        """The window's size, pool_size[0] * pool_size[1]."""
        return a.pool_size[0] * a.pool_size[1]

    @staticmethod
    def kernel(a, x):
        n, c, h, w = x.shape
        (kh, kw), (sh, sw), (ph, pw) = a.pool_size, a.strides, pool_pads(a.padding)
        oh, ow = pool_out(h, kh, sh, ph, a.ceil_mode), pool_out(w, kw, sw, pw, a.ceil_mode)
        # pad with INT32_MIN far enough for every window (ceil_mode windows may pass the bottom/right padding)
        xp = np.full((n, c, max(ph + h, (oh - 1) * sh + kh), max(pw + w, (ow - 1) * sw + kw)),
                     np.iinfo(np.int32).min, np.int32)
        xp[:, :, ph:ph + h, pw:pw + w] = x
        return reduce(np.maximum, (xp[:, :, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw]
                                   for i in range(kh) for j in range(kw)))


@register
class UpSampling(Op):
    """Nearest-neighbour upsampling: y[n,c,h,w] = x[n,c,h/scale,w/scale] (integer division)."""

    name = "upsampling"
    keeps_nonnegative = True
    family = "nn"
    bound = staticmethod(input_bound)
    attrs = (
        Attr("scale", "int", check=in_range(1, 4096)),
        Attr("layout", "str", "NCHW", one_of("NCHW")),
        Attr("method", "str", "NEAREST_NEIGHBOR", one_of("NEAREST_NEIGHBOR")),
    )

    @staticmethod
    def shape(a, data):
        require(len(data) == 4, f"data shape {tuple(data)} must be 4-D (N, C, H, W)")
        n, c, h, w = data
        return n, c, h * a.scale, w * a.scale

    @staticmethod
    def kernel(a, x):
        return x.repeat(a.scale, axis=2).repeat(a.scale, axis=3)


@register
class Relu(Op):
    """max(x, 0)."""

    name = "relu"
    step = "relu"
    family = "nn"
    bound = staticmethod(input_bound)
    interval = staticmethod(lambda a, i: [(max(i[0][0], 0), max(i[0][1], 0))])

    @staticmethod
    def kernel(a, x):
        return np.maximum(x, np.int32(0))

    @classmethod
    def nonnegative(cls, a, inputs):
        return True
