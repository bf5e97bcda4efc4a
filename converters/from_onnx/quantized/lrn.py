"""LRN of a dequantized value in integers, made by the QuantizeLinear that follows (docs/import.md, "LRN: the
integer form and its bound").

x = u s per tensor; over each channel window (c - floor((size - 1) / 2) .. c + ceil((size - 1) / 2), the channels
outside it absent) V = sum u^2 exactly, and the output in steps of s_out is u g(V) with
g(V) = (s / s_out) (bias + alpha / size s^2 V)^-beta. One table (``cvm_lut``) holds R = round(2^F g) per bucket
of V (V itself below 2^T; past it norm's levels, buckets of 4^m values), then r = round_half_up(u R / 2^F):
within 1/2 + E of u g(V) on every output that does not saturate, E the table's worst error (``lrn_plan``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from cvm_onnx.core.constants import tight

from ..context import INT32, INT_RANGES, Tensor
from ..emit import minus_zero, summed_windows
from ..registry import Refuse, float_rule
from ..requant_plans import NoPlan
from .norm import buckets, c32, levelled, proven, table_bits, table_shape
from .qdq import Requant, saturate
from .values import Deferred, Scaled, float32_sum, per_tensor, scaled

MAX_FRAC = 32  # F: R's fraction bits at most (cvm_right_shift's largest shift)


@dataclass(frozen=True)
class LRNPlan:
    """The table R over V's buckets (T bits, K levels: ``norm.levelled``'s index), its fraction bits F, and E
    (``delta``): the worst |u| |R / 2^F - g(V)| over every V of a bucket and |u| <= min(w, sqrt(V)) whose output,
    exact or tabled, does not saturate."""

    table_bits: int
    levels: int
    table: np.ndarray
    frac_bits: int
    delta: float

    @property
    def error(self) -> float:
        return 0.5 + self.delta


def lrn_plan(w: int, size: int, s: Fraction, s_out: Fraction, alpha: Fraction, beta: Fraction, bias: Fraction,
             limit: int) -> LRNPlan:
    """The plan for |u| <= w over windows of ``size`` channels, outputs |r| <= ``limit`` unsaturated: T, K the
    most table bits covering V <= size w^2 in 2^16 entries (``norm.table_shape``); F the most fraction bits (at
    most 32) whose largest entry times w stays within 32 bits; R per bucket [a, b] the rounded mean of 2^F g(a) and
    2^F g(b) (g is monotone in V, so its values on the bucket lie between those); E in float64 with a relative
    margin of 2^-40 (g's few roundings). Refused (``NoPlan``) where 1/2 + E passes one step."""
    v_max = size * w * w
    shape = table_shape(v_max, 0)
    if shape is None or tight(v_max) > 32:
        raise NoPlan(f"its sums of {size} squares up to {w}^2 have no table of at most 2^16 entries")
    t_bits, levels = shape
    if bias + min(alpha, 0) * s * s * v_max / size <= 0:
        raise NoPlan(f"bias + alpha / size s^2 V reaches 0 or below over its sums (alpha {float(alpha):g}): its power "
                     "is undefined there")
    index, first, last = buckets(t_bits, levels, v_max)
    gain, k = float(s / s_out), float(alpha * s * s / size)
    with np.errstate(all="ignore"):
        g_first, g_last = (gain * (float(bias) + k * v.astype(np.float64)) ** -float(beta) for v in (first, last))
    top = float(max(g_first.max(), g_last.max()))
    if not math.isfinite(top) or tight(math.floor(top + 0.5)) + tight(w) > 32:
        raise NoPlan(f"its gain (s / s_out) (bias + ...)^-beta reaches {top:.6g}: times {w} past 32 bits")
    f = min(table_bits(top, tight(w)), MAX_FRAC)
    r = np.floor(np.ldexp((g_first + g_last) / 2, f) + 0.5).astype(np.int64)
    off = np.maximum(np.abs(np.ldexp(r, -f) - g_first), np.abs(np.ldexp(r, -f) - g_last))
    # |u| within the window's root and where the exact or tabled output stays within the limit
    low = np.minimum(np.minimum(g_first, g_last), np.ldexp(r, -f))
    with np.errstate(divide="ignore"):
        reach = np.where(low > 0, np.floor((limit + 0.5) / np.where(low > 0, low, 1)), w)
    u = np.minimum(np.minimum(w, np.floor(np.sqrt(last.astype(np.float64)))), reach)
    table = np.zeros(int(index.max()) + 1, np.int64)
    table[index] = r
    delta = float(np.max(u * off, initial=0.0)) * (1 + 2.0**-40) + 2.0**-40
    if delta > 0.5:
        raise NoPlan(f"its table of (s / s_out) (bias + alpha / size s^2 V)^-beta, from {top:.6g} down to "
                     f"{float(min(g_first.min(), g_last.min())):.6g}, is within 1/2 + {delta:.3g} output steps of the "
                     "exact value: more than one step")
    return LRNPlan(t_bits, levels, table, f, delta)


class LocalResponseNormalized(Deferred):
    """LRN of x (N, C, ...) over windows of ``size`` channels, made integers by the QuantizeLinear that follows
    (``quantized``)."""

    def __init__(self, x: Scaled, size: int, alpha: float, beta: float, bias: float, node: str):
        self.x, self.size, self.node, self.what, self.shape = x, size, node, "LRN", x.shape
        self.alpha, self.beta, self.bias = (Fraction(v) for v in (alpha, beta, bias))

    def quantized(self, ctx, scale: np.ndarray, out_zero: int, dtype: int) -> Tensor:
        """u = t - z; V = the window sums of u^2 over the channels (``summed_windows``); R = cvm_lut of V's bucket
        (``norm.levelled``'s index past 2^T); r = cvm_right_shift(u R, F); + z_out, saturated."""
        if scale.size != 1:
            raise Refuse("LRN with a per-channel output scale has no CVM form")
        x, shape, size = self.x, self.shape, self.size
        lo, hi = INT_RANGES[dtype]
        z = int(x.zero.reshape(()))
        w = max(z - x.t.lo, x.t.hi - z, 0)
        try:
            p = lrn_plan(w, size, x.scale.reshape(()).item(), scale.reshape(()).item(), self.alpha, self.beta,
                         self.bias, max(out_zero - lo, hi - out_zero))
        except NoPlan as e:
            raise Refuse(f"{self.node} (LRN): {e}") from None
        n, c, rest = shape[0], shape[1], math.prod(shape[2:])
        u = minus_zero(ctx, x.t, x.zero)
        squares = ctx.reshape(proven(ctx, "broadcast_mul", u, u, 0, w * w, shape), (n, 1, c, rest))
        try:
            v = summed_windows(ctx, squares, [size], [1], [1], [(size - 1) // 2], [c])
        except Refuse as e:
            raise Refuse(f"{self.node} (LRN): {e}") from None
        v = ctx.reshape(v, (n, 1, c * rest))
        index = levelled(ctx, v, p.table_bits, p.levels, p.table.size)[1] if p.levels else v
        e = ctx.emit("cvm_lut", ctx.entry(index), ctx.entry(c32(p.table)), in_dim=p.table.size)
        r = ctx.reshape(ctx.result(e, INT32, int(p.table.min()), int(p.table.max()), v.shape), shape)
        reach = w * r.hi
        y = proven(ctx, "broadcast_mul", u, r, -reach, reach, shape)
        if p.frac_bits:
            top = (reach >> p.frac_bits) + 1
            e = ctx.emit("cvm_right_shift", ctx.narrow(y, tight(reach)), precision=tight(top), shift_bit=p.frac_bits)
            y = ctx.result(e, INT32, -top, top, shape)
        ctx.requants.append(Requant(ctx.base, (), None, lrn=p))
        return saturate(ctx, y, out_zero, lo, hi, dtype, shape)


@float_rule("LRN", since=1)
def lrn_rule(ctx, node, x):
    """LRN of a per-tensor dequantized x = u s: a ``LocalResponseNormalized``; refused where alpha, beta or bias is
    not finite, bias <= 0 (at V = 0 it divides by 0 or by a power of 0), and where onnxruntime's float32 sum of
    squares may pass its range."""
    x = per_tensor(scaled(x, "the LRN input"), "LRN")
    if len(x.shape) < 3:
        raise Refuse(f"LRN of a rank-{len(x.shape)} input: it takes (N, C, spatial...)")
    size = node.attr_int("size", lo=1)
    alpha, beta, bias = (node.attr_float(k, v) for k, v in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    if not all(map(math.isfinite, (alpha, beta, bias))):
        raise Refuse(f"LRN alpha {alpha:g}, beta {beta:g}, bias {bias:g}: each must be finite")
    if not bias > 0:
        raise Refuse(f"LRN bias {bias:g}: only bias > 0 has a value at every input (at a window of zeros it divides "
                     "by bias^beta)")
    float32_sum(x, size, "LRN's sum")
    return LocalResponseNormalized(x, size, alpha, beta, bias, node.name)
