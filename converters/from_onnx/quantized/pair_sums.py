"""A float function of a sum of two values on two grids, f(a + b) with a = (t_a - z_a) s_a and b = (t_b - z_b) s_b
(RWKV's exp(pp - ww), a logsumexp's exp(x - max(x)) with the max quantized apart), as the number of thresholds at or
below one integer D = t_a A + t_b B (docs/import.md, "Functions of a sum on two grids"): where the table of pairs'
outputs never decrease (or never increase) with D over every pair of integers, they are a step function of D,
counted by ``l2norm.counted``'s buckets and mapped to the output's integers by one small table: equal to the table of
pairs entry for entry, in far fewer entries.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..context import INT32, Tensor
from ..emit import as_int32, broadcast_shape
from .l2norm import counted, norm_tables
from .norm import c32, proven, table_shape, table_size
from .values import Scaled

#: A and B keep |t_a| A and |t_b| B below 2^SUM_BITS: D and its distances from the thresholds within 31 bits.
SUM_BITS = 29
#: The most thresholds compared in one bucket (a broadcast_greater, a cvm_lut and a broadcast_add each).
MAX_DEPTH = 2


def multipliers(ctx, a: Scaled, b: Scaled) -> tuple[int, int]:
    """A, B with A / B the fraction nearest s_a / s_b whose terms keep each below 2^(SUM_BITS + 1 - p), p the
    precision of its integers (|t| A < 2^SUM_BITS, the product's precision at most 31), times the largest integer
    keeping them there: pairs of nearly equal sums (scales near a small ratio, 13 s_a - 20 s_b a float32 rounding)
    keep their order in D."""
    top_a, top_b = ((1 << (SUM_BITS + 1 - ctx.type_of(x.t.entry).precision)) - 1 for x in (a, b))
    ratio = Fraction(a.scale.reshape(()).item()) / Fraction(b.scale.reshape(()).item())
    limit_a, limit_b = top_a, top_b
    while True:  # the nearest fraction's other term may pass its limit by one: halve both limits then
        if ratio * limit_b <= limit_a:
            near = ratio.limit_denominator(limit_b)
            big, small = near.numerator, near.denominator
        else:
            near = (1 / ratio).limit_denominator(limit_a)
            big, small = near.denominator, near.numerator
        if big <= top_a and small <= top_b:
            break
        limit_a, limit_b = limit_a // 2, limit_b // 2
    k = max(min(top_a // max(big, 1), top_b // max(small, 1)), 1)
    return big * k, small * k


def steps(d: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(thresholds, levels) with q = levels[#{thresholds <= d}] at every pair, where q never decreases with d (and
    pairs of one d share one q); None elsewhere, or where q takes one value."""
    order = np.argsort(d)
    ds, qs = d[order], q[order]  # pairs of one d in any order: a tie of two q's shows either way
    dq = np.diff(qs)
    if (dq < 0).any() or (dq[np.diff(ds) == 0] != 0).any():
        return None
    levels = np.unique(qs)
    if levels.size < 2:
        return None
    return ds[np.searchsorted(qs, levels[1:])], levels


def layout(marks: np.ndarray, v_max: int) -> tuple[int, tuple[int, int, int]] | None:
    """(entries, (T, levels, unit)): ``counted``'s buckets of fewest table entries, at most ``MAX_DEPTH``
    thresholds in one, over the units near the narrowest span of MAX_DEPTH + 1 thresholds (a wider bucket holds
    more where it falls there)."""
    span = int((marks[MAX_DEPTH:] - marks[:-MAX_DEPTH]).min()) if marks.size > MAX_DEPTH else v_max
    best = None
    for unit in range(max(span.bit_length() - 4, 0), span.bit_length() + 1):
        for size in (1 << 8, 1 << 10):
            shape = table_shape(v_max >> unit, 0, size)
            if shape is None:
                continue
            depth = norm_tables(marks, v_max, *shape, 0, unit)[2]
            entries = table_size(*shape) * (1 + depth)
            if depth <= MAX_DEPTH and (best is None or entries < best[0]):
                best = (entries, (*shape, unit))
    return best


def counted_sum(ctx, a: Scaled, b: Scaled, values: np.ndarray, dtype: int, where: str) -> Tensor | None:
    """The output integers ``values`` (the table of pairs: rows t_a, columns t_b) as levels[#{thresholds <= D}],
    D = t_a A + t_b B (the zero points in the thresholds) clipped to the thresholds' span; None where they are no
    step function of D (either way) or the form takes no fewer table entries."""
    if a.t.is_const or b.t.is_const:
        return None
    big, small = multipliers(ctx, a, b)
    ta, tb = (np.arange(x.t.lo, x.t.hi + 1, dtype=np.int64) for x in (a, b))
    d = (ta[:, None] * big + tb[None, :] * small).ravel()
    for sign in (1, -1):
        if (found := steps(sign * d, values.ravel())) is not None:
            break
    else:
        return None
    marks, levels = found
    first, last = int(marks[0]) - 1, int(marks[-1])
    v_max = last - first
    down = np.sort(last + 1 - marks)  # S = last - D: the thresholds from the top (exp's dense end)
    plans = [(p, up) for up, m in ((True, marks - first), (False, down)) if (p := layout(m, v_max)) is not None]
    if not plans:
        return None
    (entries, shape), up = min(plans, key=lambda p: p[0][0])
    if entries + levels.size >= values.size:
        return None
    terms = [proven(ctx, "broadcast_mul", as_int32(x.t), c32(sign * m), min(x.t.lo * sign * m, x.t.hi * sign * m),
                    max(x.t.lo * sign * m, x.t.hi * sign * m), x.shape) for x, m in ((a, big), (b, small))]
    out_shape = broadcast_shape(*terms)
    total = proven(ctx, "broadcast_add", *terms, terms[0].lo + terms[1].lo, terms[0].hi + terms[1].hi, out_shape)
    e = ctx.emit("clip", ctx.entry(total), a_min=first, a_max=last)
    total = ctx.result(e, INT32, first, last, out_shape)
    flat = (math.prod(out_shape), 1, 1)
    s = proven(ctx, "broadcast_sub", *((total, c32(first)) if up else (c32(last), total)), 0, v_max, out_shape)
    k = counted(ctx, ctx.reshape(s, flat), (marks - first if up else down).tolist(), v_max, where, "sum",
                layout=shape)
    table = levels if up else levels[::-1]
    e = ctx.emit("cvm_lut", ctx.entry(ctx.reshape(k, out_shape)), ctx.entry(c32(table)), in_dim=table.size)
    return ctx.result(e, dtype, int(levels.min()), int(levels.max()), out_shape)
