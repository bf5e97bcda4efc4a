"""ReduceLogSumExp of a dequantized value in integers (docs/import.md, "ReduceLogSumExp: the integer form and its
bound"): LSE = max + log sum e^(x - max), with LogSoftmax's exp table over d = max - t and its two log tables of
the sum (requant_plans.LogSoftmaxPlan), the max's own term a table over its integers."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..context import INT32, INT_RANGES, Tensor, const, tight
from ..emit import as_int32, axes_of, broadcast_shape, normal, reduced
from ..registry import Refuse, float_rule
from ..requant_plans import NoPlan, logsoftmax_plan
from .qdq import MAX_TABLE, Requant, logsoftmax_tables, saturate
from .values import Deferred, Scaled, per_tensor, scaled


class LogSumExped(Deferred):
    """ReduceLogSumExp of x = (t - z) s over ``axes`` (``shape`` the output's, keepdims applied), made integers by
    the QuantizeLinear that follows (``quantized``) or as a float output."""

    what = "ReduceLogSumExp"

    def __init__(self, x: Scaled, axes: list[int], shape: tuple[int, ...]):
        self.x, self.axes, self.shape = x, axes, shape
        self.n = math.prod(x.shape[i] for i in axes)

    @property
    def ends(self) -> tuple[float, float]:
        """The least and largest value it takes: (lo - z) s and (hi - z) s + log n."""
        t, z, s = self.x.t, int(self.x.zero.reshape(())), float(self.x.scale.reshape(()).item())
        return (t.lo - z) * s, (t.hi - z) * s + math.log(self.n)

    def quantized(self, ctx, scale: np.ndarray, out_zero: int, dtype: int) -> Tensor:
        """m = max t over the axes, d = m - t; S = sum cvm_lut(d, E) (CVM sum); i1, i2 and G1, G2 as LogSoftmax's;
        r = cvm_right_shift(cvm_lut(m - lo, M) + cvm_lut(i1, G1) + cvm_lut(i2, G2), P) with
        M[k] = round(2^P ((k + lo - z) s q + C)) >= 0; y = r + z_out - C, saturated."""
        if scale.size != 1:
            raise Refuse("ReduceLogSumExp with a per-channel output scale has no CVM form")
        t, z = self.x.t, int(self.x.zero.reshape(()))
        span = t.hi - t.lo + 1
        if span > MAX_TABLE:
            raise Refuse(f"ReduceLogSumExp of {span} integers: its tables hold at most 2^16 entries "
                         "(quantize its input)")
        lo, hi = INT_RANGES[dtype]
        q = 1 / scale.reshape(()).item()
        s = self.x.scale.reshape(()).item()
        c = max(0, math.ceil((z - t.lo) * s * q))  # the max's term plus C is >= 0
        above = hi - out_zero + c + 1  # W: r >= W saturates at hi
        try:
            p = logsoftmax_plan(self.n, q, above)
        except NoPlan as e:
            raise Refuse(str(e).replace("LogSoftmax", "ReduceLogSumExp")) from None
        e_, _, g1, g2 = logsoftmax_tables(span, float(s), q, self.n, above, p)
        b, cap = p.table_bits, above << p.table_bits
        num, den = (Fraction(s) * q * (1 << b)).as_integer_ratio()
        m_ = np.array([min((2 * (k + t.lo - z) * num + den) // (2 * den) + (c << b), cap) for k in range(span)],
                      np.int64)
        kept = tuple(1 if i in self.axes else d for i, d in enumerate(self.x.shape))
        dropped = tuple(d for i, d in enumerate(self.x.shape) if i not in self.axes)
        v = as_int32(t)
        top = ctx.reshape(reduced(ctx, "max", v, self.axes, t.lo, t.hi), kept)
        d = ctx.result(ctx.op("broadcast_sub", top, v), INT32, 0, t.hi - t.lo, v.shape)

        def lut(index: Tensor, values: np.ndarray) -> Tensor:
            e = ctx.emit("cvm_lut", ctx.entry(index), ctx.entry(const(values, INT32)), in_dim=values.size)
            return ctx.result(e, INT32, int(values.min()), int(values.max()), index.shape)

        def shifted(y: Tensor, k: int, most: int) -> Tensor:  # round_half_up(y / 2^k), in [0, most]
            if not k:
                return y
            e = ctx.emit("cvm_right_shift", ctx.narrow(y, tight(y.hi)), precision=tight(most), shift_bit=k)
            return ctx.result(e, INT32, y.lo + (1 << k >> 1) >> k, most, y.shape)

        def add(y: Tensor, w: Tensor) -> Tensor:
            return ctx.result(ctx.op("broadcast_add", y, w), INT32, y.lo + w.lo, y.hi + w.hi, broadcast_shape(y, w))

        s_ = ctx.reshape(reduced(ctx, "sum", lut(d, e_), self.axes, 1 << p.frac_bits, self.n << p.frac_bits),
                         dropped)
        i1 = shifted(s_, p.fine, (s_.hi + (1 << p.fine >> 1)) >> p.fine)
        if i1.hi > p.fine_top:
            e = ctx.emit("clip", ctx.entry(i1), a_min=0, a_max=p.fine_top)
            i1 = ctx.result(e, INT32, min(i1.lo, p.fine_top), p.fine_top, i1.shape)
        k = ctx.reshape(top, dropped)
        if t.lo:
            k = ctx.result(ctx.op("broadcast_sub", k, const(np.array(t.lo, np.int32), INT32)), INT32, 0,
                           t.hi - t.lo, dropped)
        both = add(lut(k, m_), add(lut(i1, g1), lut(shifted(s_, p.coarse, g2.size - 1), g2)))
        r = shifted(both, b, (both.hi + (1 << b >> 1)) >> b)
        ctx.requants.append(Requant(ctx.base, (), None, logsoftmax=p))
        return saturate(ctx, ctx.reshape(r, self.shape), out_zero - c, lo, hi, dtype, self.shape)


@float_rule("ReduceLogSumExp", since=1)
def reduce_log_sum_exp_rule(ctx, node, x, axes_t=None):
    """ReduceLogSumExp: an integer form made by the QuantizeLinear that follows (``LogSumExped``); with empty axes
    and noop_with_empty_axes, x itself; over so many values that no plan exists, refused here."""
    x = per_tensor(scaled(x, "the ReduceLogSumExp input"), "ReduceLogSumExp")
    rank = len(x.shape)
    axes = axes_of(node, axes_t, 18)
    if not axes and node.attr_int("noop_with_empty_axes", 0):
        return x
    axes = sorted(set(normal(axes or list(range(rank)), rank)))
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if node.attr_int("keepdims", 1) else \
        tuple(d for i, d in enumerate(x.shape) if i not in axes)
    y = LogSumExped(x, axes, shape)
    try:  # the count alone (n >= 32768) leaves no plan, whatever the output's grid
        logsoftmax_plan(y.n, Fraction(1), 1)
    except NoPlan as e:
        raise Refuse(str(e).replace("LogSoftmax", "ReduceLogSumExp")) from None
    return y
