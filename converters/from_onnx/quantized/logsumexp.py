"""ReduceLogSumExp of a dequantized value in integers (docs/import.md, "ReduceLogSumExp: the integer form and its
bound"): LSE = max + log sum e^(x - max), with LogSoftmax's exp table over d = max - t and its two log tables of
the sum (requant_plans.LogSoftmaxPlan), the max's own term a table over its integers."""
from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import numpy as np

from ..context import INT32, INT_RANGES, Tensor, const, tight
from ..emit import as_int32, axes_of, broadcast_shape, normal, reduced
from ..registry import Refuse, float_rule
from ..requant_plans import NoPlan, logsoftmax_plan
from .qdq import (MAX_TABLE, MaskedScores, Requant, logsoftmax_tables, masked, masked_below_max, saturate, scores_read,
                  sunk)
from .values import Deferred, Scaled, Softmaxed, per_tensor, scaled


class LogSumExped(Deferred):
    """ReduceLogSumExp of x = (t - z) s over ``axes`` (``shape`` the output's, keepdims applied), made integers by
    the QuantizeLinear that follows (``quantized``) or as a float output."""

    what = "ReduceLogSumExp"

    def __init__(self, x: Scaled, axes: list[int], shape: tuple[int, ...], mask: Softmaxed | None = None):
        self.x, self.axes, self.shape, self.mask = x, axes, shape, mask
        self.n = math.prod(x.shape[i] for i in axes)

    @property
    def ends(self) -> tuple[float, float]:
        """The least and largest value it takes: (lo - z) s and (hi - z) s + log n."""
        if self.mask is not None:
            raise Refuse("ReduceLogSumExp of scores plus an attention mask read by a float op: a row masked "
                         "throughout takes the mask's value, which no int16 grid of the scores holds (quantize it)")
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
        if self.mask is not None:
            saturating(self.mask, 1 / Fraction(scale.reshape(()).item()), out_zero, lo, self.n)

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

        if self.mask is None:
            v = as_int32(t)
            top = ctx.reshape(reduced(ctx, "max", v, self.axes, t.lo, t.hi), kept)
            d = ctx.result(ctx.op("broadcast_sub", top, v), INT32, 0, t.hi - t.lo, v.shape)
            s_ = ctx.reshape(reduced(ctx, "sum", lut(d, e_), self.axes, 1 << p.frac_bits, self.n << p.frac_bits),
                             dropped)
        else:  # over the positions at each row's highest level (w = 1), max t' = max t - lo there
            rows = masked_below_max(ctx, t, self.mask)
            e = lut(rows.d, e_)
            e = ctx.result(ctx.op("broadcast_mul", e, rows.w), INT32, 0, e.hi, e.shape)
            s_ = ctx.reshape(reduced(ctx, "sum", e, [1], 1 << p.frac_bits, self.n << p.frac_bits), dropped)
        i1 = shifted(s_, p.fine, (s_.hi + (1 << p.fine >> 1)) >> p.fine)
        if i1.hi > p.fine_top:
            e = ctx.emit("clip", ctx.entry(i1), a_min=0, a_max=p.fine_top)
            i1 = ctx.result(e, INT32, min(i1.lo, p.fine_top), p.fine_top, i1.shape)
        if self.mask is not None:
            k = ctx.reshape(rows.peak, dropped)
        else:
            k = ctx.reshape(top, dropped)
            if t.lo:
                k = ctx.result(ctx.op("broadcast_sub", k, const(np.array(t.lo, np.int32), INT32)), INT32, 0,
                               t.hi - t.lo, dropped)
        both = add(lut(k, m_), add(lut(i1, g1), lut(shifted(s_, p.coarse, g2.size - 1), g2)))
        r = shifted(both, b, (both.hi + (1 << b >> 1)) >> b)
        if self.mask is not None:  # a row masked throughout: below the output's least value
            r = masked_rows_sunk(ctx, r, self.mask.keep.levels, ctx.reshape(rows.top, dropped), out_zero - c - lo)
        ctx.requants.append(Requant(ctx.base, (), None, logsoftmax=p))
        return saturate(ctx, ctx.reshape(r, self.shape), out_zero - c, lo, hi, dtype, self.shape)


def saturating(mask: Softmaxed, q: Fraction, out_zero: int, least: int, n: int) -> None:
    """Refused unless a row at any masked level c (its highest) saturates the output at ``least``: float32 gives it
    at most v = ((X + c)(1 - 2^-24) + log n + 1)(1 - 2^-24) (each rounding of a negative sum towards 0 by 2^-24
    relatively; the log of the sum at most log n, with 1 to spare), so v q + z_out < least - 1/2 rounds below it;
    -inf (NaN in float32) is the type's least integer."""
    x = mask.x
    big = max(abs(x.t.lo - int(x.zero.reshape(()))), abs(x.t.hi - int(x.zero.reshape(())))) * \
        Fraction(x.scale.reshape(()).item())
    shrink = 1 - Fraction(1, 1 << 24)
    for c in mask.keep.levels:
        if c == 0 or c == -math.inf:
            continue
        top = ((big + Fraction(c)) * shrink + Fraction(math.log(n)) + 1) * shrink  # v's bound
        if top * q + out_zero >= least - Fraction(1, 2):
            raise Refuse(f"ReduceLogSumExp of scores plus an attention mask at {c:g}: a row masked throughout is "
                         f"{c:g} + the LSE of x there, which the output's grid holds above its least value {least}: "
                         "it has no exact form")


def masked_rows_sunk(ctx, r: Tensor, levels: tuple[float, ...], top: Tensor, below: int) -> Tensor:
    """r sunk below the output's least value (``sunk``) in the rows whose highest level rank ``top`` is not level 0's
    (every row where no level is 0)."""
    last = len(levels) - 1
    if levels[-1] != 0:
        return sunk(ctx, r, const(np.array(1, np.int32), INT32), below)
    if not last:
        return r
    e = ctx.emit("clip", ctx.entry(ctx.result(ctx.op("broadcast_sub", const(np.array(last, np.int32), INT32), top),
                                              INT32, 0, last, top.shape)), a_min=0, a_max=1)
    return sunk(ctx, r, ctx.result(e, INT32, 0, 1, top.shape), below)


@float_rule("ReduceLogSumExp", since=1)
def reduce_log_sum_exp_rule(ctx, node, x, axes_t=None):
    """ReduceLogSumExp: an integer form made by the QuantizeLinear that follows (``LogSumExped``); with empty axes
    and noop_with_empty_axes, x itself; over so many values that no plan exists, refused here. Of scores plus an
    attention mask (or a Where on them, ``masks.KeptScores``) over adjacent axes: the LSE over the positions at
    each row's highest level (``qdq.masked``'s levels and bound), a row whose highest level is below 0 saturated
    at the output's least value (``saturating``)."""
    x = scores_read(ctx, x)
    mask = x if isinstance(x, MaskedScores) else None
    x = per_tensor(scaled(x if mask is None else mask.x, "the ReduceLogSumExp input"), "ReduceLogSumExp")
    rank = len(x.shape)
    axes = axes_of(node, axes_t, 18)
    if not axes and node.attr_int("noop_with_empty_axes", 0) and mask is None:
        return x
    axes = sorted(set(normal(axes or list(range(rank)), rank)))
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if node.attr_int("keepdims", 1) else \
        tuple(d for i, d in enumerate(x.shape) if i not in axes)
    if mask is not None:
        if axes != list(range(axes[0], axes[-1] + 1)):
            raise Refuse("ReduceLogSumExp of scores plus an attention mask over axes that are not adjacent has no "
                         "CVM form here")
        view = (math.prod(x.shape[:axes[0]]), math.prod(x.shape[i] for i in axes), math.prod(x.shape[axes[-1] + 1:]))
        soft = masked(x, mask, view)
        mask = replace(soft, absorbed=(False,) * len(soft.absorbed))  # no uniform rows: they saturate
    y = LogSumExped(x, axes, shape, mask)
    try:  # the count alone (n >= 32768) leaves no plan, whatever the output's grid
        logsoftmax_plan(y.n, Fraction(1), 1)
    except NoPlan as e:
        raise Refuse(str(e).replace("LogSoftmax", "ReduceLogSumExp")) from None
    return y
