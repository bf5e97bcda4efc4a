"""L2 normalization of a dequantized value, in integers (docs/import.md, "L2 normalization: the integer form and its
bound"): LpNormalization(p=2), and the written-out forms found in the graph before the walk (``l2_chains``):
x / max(||x||, eps), x / sqrt(sum x^2 + eps), x / (||x|| + eps), x * Reciprocal(...), the norm as ReduceL2, Sqrt or
Pow(0.5) of ReduceSumSquare or of ReduceSum of Pow(x, 2), Pow(Abs(x), 2) or Mul(x, x), eps by Clip(min), Max or Add;
and RMSNorm (T5's, LLaMA's), the same with ReduceMean of the squares and eps inside the root: x / sqrt(sum x^2 / k + a)
= sqrt(k) x / sqrt(sum x^2 + k a) over k values, the factor sqrt(k) in the output's multiplier.

With x = u s per tensor (u = t - z) and S = sum u^2 over a row, every such form is y = x / (sqrt(max(sum x^2 + a,
b)) + o) = u / (sqrt(max(S + G, E)) + O), G = a / s^2, E = b / s^2, O = o / s: LayerNormalization's table form
(``norm.best_plan``) with D = u, V = S (|D| <= sqrt(V), as |D| <= sqrt((n - 1) V) there with n = 2), gamma = 1 / s_out
and beta = 0. Of a value computed after the last QuantizeLinear (a masked mean's quotient): that value quantized
first to an int16 grid of its bound (``TailNormalized``).

The norm itself as a value (``norm_chains``, ``Norm``; docs/import.md, "The L2 norm as a value"): s sqrt(S)
requantized exactly, round(s sqrt(S) / s_y), from the exact integer S; a float function after it, over S.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import partial
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto

from cvm_onnx.core.constants import tight

from ..context import INT32, INT_RANGES, Tensor
from ..emit import as_int32, reduced
from ..registry import Refuse
from ..requant_plans import NoPlan
from .chains import FLAT, _divisor, _Graph, _lower_bound, _scalar
from .norm import (LayerNormPlan, best_plan, c32, levelled, proven, quartered_shape, quotient, table_bits,
                   table_index, table_shape)
from .qdq import MAX_TABLE, Requant, quantize, saturate
from .values import TAIL_GRIDS, Deferred, Scaled, float32_sum, least_float32, per_tensor, scaled


def squares_fit(n: int, peak: int) -> bool:
    """Whether u^2 (its operands' labels summed) and S = sum u^2 over n values |u| <= peak (u^2's label plus
    bits(n)) keep CVM's labels within 32 bits."""
    return 2 * tight(peak) <= 32 and tight(peak * peak) + n.bit_length() <= 32


def quartered_fits(n: int, peak: int, t_bits: int, quarter: int) -> bool:
    """Whether ``quartered``'s steps keep every CVM label within 32 bits (a product's label is the sum of its
    operands'): u^2 = 4^Q a + b, A = sum a, B = sum b, S_Q = A + floor(B / 4^Q), and S = 4^Q min(A, 2^(T-2)) + B."""
    unit, tn = 1 << (2 * quarter), n.bit_length()
    return (2 * tight(peak) <= 32 and tight(peak * peak // unit) + tn <= 32 and tight(unit - 1) + tn <= 32
            and tight(peak * peak // unit) + tight(unit) <= 32
            and tight(n * peak * peak // unit + n) <= 31 and tight(unit * ((1 << (t_bits - 2)) + n)) <= 31)


def root_below(k: int) -> Fraction:
    """sqrt(k) to within 2^-64 below (exact where k is a square)."""
    return Fraction(math.isqrt(k << 128), 1 << 64)


def l2_plan(n: int, peak: int, g: Fraction, e: Fraction, s_out: Fraction, low: int, high: int,
            o: Fraction = Fraction(0), mean: int = 1) -> LayerNormPlan:
    """The plan of least delta for sqrt(mean) u / (sqrt(max(S + G, E)) + O) over rows of n integers |u| <= peak, in
    output steps of s_out, into [low, high] (z_out subtracted); where S passes 32 bits, its level and bucket from
    the squares split at 4^Q (``quartered``). sqrt(mean) is taken as ``root_below``'s c, and delta grows by the
    bound's terms in |c_i| for the rest, (N_b + e_N) (sqrt(mean) - c) / (s_out 2^(F-j)); O is 0 where mean > 1."""
    v_max = n * peak * peak
    quarter, shape = 0, table_shape(v_max, 0)
    if not squares_fit(n, peak):
        if (found := quartered_shape(v_max, lambda t, q: quartered_fits(n, peak, t, q))) is None:
            raise NoPlan(f"an L2 normalization over {n} values |u| <= {peak} passes 32 bits in its sum of squares")
        quarter, shape = found
    if shape is None:
        raise NoPlan(f"an L2 normalization over {n} values needs a table of more than 2^16 entries")
    t_bits, levels = shape
    if levels and e - g > (1 << t_bits):  # the eps floor must lie where the table holds every S exactly
        raise NoPlan(f"an L2 normalization's eps lies {float(e - g):.3g} squared input steps out (at most 2^{t_bits})")
    d_bits = tight(peak)
    r_first = max(1 / (math.sqrt(max(1 + float(g), float(e))) + float(o)) if v_max else 0.0,
                  2.0 ** (1 - t_bits / 2) if levels else 0.0)
    f = table_bits(r_first, d_bits)
    precision = tight(max(-low, high))
    root = root_below(mean)
    gamma, beta = np.array([root / s_out], dtype=object), np.array([Fraction(0)], dtype=object)
    key = (2, 0, t_bits, levels, quarter, precision)  # n = 2: |D| <= sqrt((2 - 1) V), V >= 1 when not 0
    best, h = best_plan(key, v_max, float(g), f, d_bits, 0, gamma, beta, floor=float(e), outside=float(o)), 31 - d_bits
    if (best is None or best.delta >= Fraction(1, 2)) and h > 0:  # R in two parts
        best = best_plan(key, v_max, float(g), f, d_bits, h, gamma, beta, floor=float(e), outside=float(o))
    if best is not None and root * root != mean:  # sqrt(mean) - root < 2^-64; e_N < N_b
        best = replace(best, delta=best.delta + Fraction(2 * best.n_bound, 1 << (64 + best.frac_bits - best.extra))
                       / s_out)
    if best is None or best.delta >= Fraction(1, 2):
        raise NoPlan(f"an L2 normalization over {n} values at {float(root / s_out):.3g} output steps per unit has "
                     "no integer form within half a step in 32 bits")
    return best


@dataclass(frozen=True, eq=False)
class L2Normalized(Deferred):
    """sqrt(mean) x / (sqrt(max(sum x^2 + add, floor)) + outside) over the n values of ``view`` (outer, n, inner),
    made integers by the QuantizeLinear that follows; ``nan_at_zero``: a row of zeros is 0 / 0 (no eps),
    QuantizeLinear's NaN; ``mean`` k > 1: an RMSNorm's, x / sqrt(max(sum x^2 / k + add / k, floor / k)), outside 0."""

    x: Scaled
    view: tuple[int, int, int]
    add: Fraction
    floor: Fraction
    outside: Fraction
    nan_at_zero: bool
    node: str = ""
    what: str = "L2 normalization"
    mean: int = 1

    @property
    def shape(self) -> tuple[int, ...]:
        return self.x.shape

    @property
    def ends(self) -> tuple[float, float]:
        """Every value lies in [-sqrt(mean), sqrt(mean)] (the span a float output is quantized to)."""
        t, z = self.x.t, int(self.x.zero.reshape(()))
        if self.nan_at_zero and t.lo <= z <= t.hi:
            raise Refuse(f"{self.node} ({self.what} with no eps) as a float output is NaN (0 / 0) on a row of "
                         "zeros, which no integer holds: quantize it (a QuantizeLinear gives NaN the type's minimum)")
        return -math.sqrt(self.mean), math.sqrt(self.mean)

    def plan(self, s_out: Fraction, low: int, high: int) -> LayerNormPlan:
        """``l2_plan`` for output steps s_out into [low, high] (z_out subtracted)."""
        t, z = self.x.t, int(self.x.zero.reshape(()))
        s = self.x.scale.reshape(()).item()
        peak = max(abs(t.lo - z), abs(t.hi - z))
        return l2_plan(self.view[1], peak, self.add / (s * s), self.floor / (s * s), s_out, low, high,
                       self.outside / s, self.mean)

    def quantized(self, ctx, scale: np.ndarray, out_zero: int, dtype: int) -> Tensor:
        """The integers of QuantizeLinear(y), by ``l2_plan``'s form."""
        if scale.size != 1:
            raise Refuse(f"{self.node} ({self.what}) with a per-channel output scale has no CVM form")
        t, z = self.x.t, int(self.x.zero.reshape(()))
        lo, hi = INT_RANGES[dtype]
        try:
            p = self.plan(scale.reshape(()).item(), lo - out_zero, hi - out_zero)
        except NoPlan as e:
            raise Refuse(f"{self.node} ({self.what}): {e}") from None
        ctx.requants.append(Requant(ctx.base, (), None, layernorm=p))
        zero_row = self.nan_at_zero and t.lo <= z <= t.hi
        r = emit(ctx, as_int32(t), z, self.view, p, lo - out_zero if zero_row else None)
        return saturate(ctx, ctx.reshape(r, self.shape), out_zero, lo, hi, dtype, self.shape)


@dataclass(frozen=True, eq=False)
class TailNormalized(Deferred):
    """``form`` (an ``L2Normalized``, its x a stand-in) of ``value``, a value computed after the last QuantizeLinear
    (a masked mean's quotient: nothing quantizes it), every |value| <= ``bound``: value quantized first by its own
    rule to int16, zero point 0, scale s_v the least float32 with P s_v >= bound, clipped to [-P, P] (an identity
    where |value| <= P s_v, which moves no output away from value / s_v), P the largest of ``TAIL_GRIDS`` at which
    form has a plan at the output's scale; then form on those integers (docs/import.md, "L2 normalization of a value
    computed after the last QuantizeLinear")."""

    value: object
    bound: float
    form: L2Normalized

    @property
    def shape(self) -> tuple[int, ...]:
        return self.form.shape

    @property
    def what(self) -> str:
        return self.form.what

    @property
    def ends(self) -> tuple[float, float]:
        return self.at(TAIL_GRIDS[-1]).ends

    def at(self, steps: int) -> L2Normalized:
        """form of the value's integers at ``steps`` steps each way (a stand-in tensor of that interval)."""
        s = np.asarray(Fraction(float(least_float32(self.bound, steps))), dtype=object)
        x = Scaled(Tensor(TensorProto.INT16, self.form.shape, -steps, steps), s, np.zeros((), np.int64))
        float32_sum(x, self.form.view[1], f"the {self.form.what}'s sum")
        return replace(self.form, x=x)

    def stepped(self, s_out: Fraction, low: int, high: int) -> tuple[int, LayerNormPlan]:
        """(P, the plan) at the largest of ``TAIL_GRIDS`` that has one for output steps s_out into [low, high]."""
        for steps in TAIL_GRIDS:
            try:
                return steps, self.at(steps).plan(s_out, low, high)
            except NoPlan:
                continue
        raise NoPlan(f"an L2 normalization over {self.form.view[1]} values has no integer form within half a step "
                     f"in 32 bits on any int16 grid of its input ({TAIL_GRIDS[-1]} to {TAIL_GRIDS[0]} steps)")

    def plan(self, s_out: Fraction, low: int, high: int) -> LayerNormPlan:
        return self.stepped(s_out, low, high)[1]

    def quantized(self, ctx, scale: np.ndarray, out_zero: int, dtype: int) -> Tensor:
        """The value quantized at the grid ``stepped`` picks and clipped to it, then form's integers."""
        if scale.size != 1:
            raise Refuse(f"{self.form.node} ({self.what}) with a per-channel output scale has no CVM form")
        lo, hi = INT_RANGES[dtype]
        try:
            steps, _ = self.stepped(scale.reshape(()).item(), lo - out_zero, hi - out_zero)
        except NoPlan as e:
            raise Refuse(f"{self.form.node} ({self.what}): {e}") from None
        form = self.at(steps)
        t = quantize(ctx, self.value, form.x.scale, np.zeros((), np.int64), TensorProto.INT16)
        t = ctx.result(ctx.emit("clip", ctx.entry(t), a_min=-steps, a_max=steps), TensorProto.INT16, max(t.lo, -steps),
                       min(t.hi, steps), t.shape)
        return replace(form, x=replace(form.x, t=t)).quantized(ctx, scale, out_zero, dtype)


@dataclass(frozen=True, eq=False)
class Bounded:
    """A value computed after the last QuantizeLinear (a masked mean's quotient) read by an L2 normalization, with
    ``bound`` >= every |value| (its float output's interval, ``edges.l2_read``): the normalization quantizes it at a
    grid of its own (``TailNormalized``)."""

    value: object
    bound: float

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.shape

    @property
    def what(self) -> str:
        return getattr(self.value, "what", "a sum")


def normalized(x, form: Callable[[Scaled], L2Normalized]) -> L2Normalized | TailNormalized:
    """form(x) of a per-tensor dequantized x; of a value computed after the last QuantizeLinear (``Bounded``),
    ``TailNormalized`` at its bound."""
    if isinstance(x, Bounded):
        stand_in = Scaled(Tensor(TensorProto.INT16, x.shape, -1, 1), np.asarray(Fraction(1), dtype=object),
                          np.zeros((), np.int64))
        return TailNormalized(x.value, x.bound, form(stand_in))
    return form(x)


def emit(ctx, t: Tensor, z: int, view: tuple[int, int, int], p: LayerNormPlan, nan: int | None) -> Tensor:
    """The plan's CVM ops on t's rows: u = t - z, S = sum u^2, the level and bucket of S, R, N = trunc(u R / 2^(m+j)),
    the output's shift; ``nan``: the value (less z_out) of a row of zeros."""
    op = partial(proven, ctx)
    outer, n, inner = view
    rows, col = view, (outer, 1, inner)
    u = ctx.reshape(t, rows)
    peak = max(z - u.lo, u.hi - z)  # u's interval made symmetric: the products' bounds below take +-peak
    if z:
        u = op("broadcast_sub", u, c32(z), -peak, peak, rows)
    else:
        u = ctx.result(ctx.entry(u), INT32, -peak, peak, rows)
    square = op("broadcast_mul", u, u, 0, peak * peak, rows)
    level = None
    if p.quarter:
        level, index, total = quartered(ctx, square, n, p, col)
    else:
        total = ctx.reshape(reduced(ctx, "sum", square, [1], 0, n * peak * peak), col)
        index = total
    if p.levels and not p.quarter:
        level, index = levelled(ctx, total, p.table_bits, p.levels, p.table.size)
    prod = quotient(ctx, u, index, level, p.table >> p.split, p.extra, p.levels)
    if p.split:  # the low h bits of R: u R0 / 2^(m+j+h), truncated on its own
        low = quotient(ctx, u, index, level, p.table & ((1 << p.split) - 1), p.extra + p.split, p.levels)
        prod = op("broadcast_add", prod, low, prod.lo + low.lo, prod.hi + low.hi, rows)
    if prod.hi > p.n_bound:  # an identity on every value N takes (docs): it bounds the label
        e = ctx.emit("clip", ctx.entry(prod), a_min=-p.n_bound, a_max=p.n_bound)
        prod = ctx.result(e, INT32, -p.n_bound, p.n_bound, rows)
    m = int(p.multipliers[0])
    y = op("broadcast_mul", prod, c32(m), -prod.hi * abs(m), prod.hi * abs(m), rows)
    bnd = (1 << (p.precision - 1)) - 1
    e = ctx.emit("cvm_right_shift", ctx.narrow(y, tight(max(-y.lo, y.hi))), precision=p.precision, shift_bit=p.shift)
    r = ctx.result(e, INT32, -bnd, bnd, rows)
    if nan is None:
        return r
    empty = op("broadcast_greater", c32(1), total, 0, 1, col)  # S = 0 (total: S or 0 < S' <= S): every u is 0
    fill = op("broadcast_mul", empty, c32(nan), min(nan, 0), max(nan, 0), col)
    return op("broadcast_add", r, fill, r.lo + min(nan, 0), r.hi + max(nan, 0), rows)


def quartered(ctx, square: Tensor, n: int, p: LayerNormPlan, col) -> tuple[Tensor, Tensor, Tensor]:
    """The level m, table index and a value 0 exactly where S is (S itself below 4^(Q-1) 2^T) of rows whose S =
    sum u^2 passes 32 bits, from integers that do not: u^2 = 4^Q a + b (a = floor(u^2 / 4^Q)), A = sum a,
    B = sum b < n 4^Q, S_Q = floor(S / 4^Q) = A + floor(B / 4^Q). Every threshold 4^k 2^T is a multiple of 4^Q
    (T >= 2Q), so the level comes from S_Q, and at a level m >= Q the bucket floor(S / 4^m) = floor(S_Q / 4^(m-Q));
    a row of level m < Q has A <= S / 4^Q < 2^(T-2), so S = 4^Q min(A, 2^(T-2)) + B there, exactly, and its
    bucket floor(S / 4^m)."""
    op = partial(proven, ctx)
    outer, _, inner = col
    rows = square.shape
    unit, size = 1 << (2 * p.quarter), 1 << p.table_bits
    top_a = square.hi // unit
    high = op("broadcast_div", square, c32(unit), 0, top_a, rows)
    low = op("broadcast_sub", square, op("broadcast_mul", high, c32(unit), 0, top_a * unit, rows), 0, unit - 1, rows)
    a = ctx.reshape(reduced(ctx, "sum", high, [1], 0, n * top_a), col)
    b = ctx.reshape(reduced(ctx, "sum", low, [1], 0, n * (unit - 1)), col)
    sq = op("broadcast_add", a, op("broadcast_div", b, c32(unit), 0, n, col), 0, n * top_a + n, col)
    thresholds = c32(np.array([((size << (2 * m)) >> (2 * p.quarter)) - 1 for m in range(p.levels)])
                     .reshape(1, p.levels, 1))
    above = op("broadcast_greater", sq, thresholds, 0, 1, (outer, p.levels, inner))
    level = ctx.reshape(reduced(ctx, "sum", above, [1], 0, p.levels), col)
    cap = size >> 2
    e = ctx.emit("clip", ctx.entry(a), a_min=0, a_max=cap)
    small = op("broadcast_add", op("broadcast_mul", ctx.result(e, INT32, 0, min(cap, a.hi), col), c32(unit), 0,
                                   unit * min(cap, a.hi), col), b, 0, unit * min(cap, a.hi) + b.hi, col)

    def lut(values: list[int]) -> Tensor:
        e = ctx.emit("cvm_lut", ctx.entry(level), ctx.entry(c32(values)), in_dim=p.levels + 1)
        return ctx.result(e, INT32, min(values), max(values), col)

    # < 2^T on the rows each is picked for: floor(S_Q / 4^(m-Q)) at a level m >= Q, floor(S / 4^m) below
    top = op("broadcast_div", sq, lut([1 << (2 * max(m - p.quarter, 0)) for m in range(p.levels + 1)]), 0, sq.hi,
             col)
    bottom = op("broadcast_div", small, lut([1 << (2 * min(m, p.quarter - 1)) for m in range(p.levels + 1)]), 0,
                small.hi, col)
    top, bottom = [ctx.result(ctx.emit("clip", ctx.entry(v), a_min=0, a_max=size - 1), INT32, 0, size - 1, col)
                   for v in (top, bottom)]  # identities on the rows each is picked for: bounds the labels
    above_q = op("broadcast_greater", level, c32(p.quarter - 1), 0, 1, col)
    gap = op("broadcast_sub", top, bottom, 1 - size, size - 1, col)
    pick = op("broadcast_mul", above_q, gap, min(gap.lo, 0), max(gap.hi, 0), col)
    bucket = op("broadcast_add", bottom, pick, 0, size - 1, col)
    return level, table_index(ctx, level, bucket, p.table_bits, p.levels, p.table.size), small


# -- the written-out forms ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class L2Chain:
    """The Div (or Mul) ``node`` that ends a written-out L2 normalization of tensor ``x`` over ``view`` (outer, n,
    inner): sqrt(mean) x / (sqrt(max(sum x^2 + add, floor)) + outside) (``mean`` k > 1: a ReduceMean's, RMSNorm,
    outside 0); ``nodes``: every node of it (the reduction's on)."""

    node: onnx.NodeProto
    x: str
    view: tuple[int, int, int]
    add: Fraction
    floor: Fraction
    outside: Fraction
    nodes: tuple[onnx.NodeProto, ...]
    mean: int = 1


_STEPS = ("Sqrt", "Pow", "Reciprocal", "Clip", "Max", "Add", "Expand", *FLAT)
#: The reductions a written-out L2 normalization or RMSNorm (ReduceMean), or an L2 norm, ends in.
SUMS = ("ReduceSum", "ReduceSumSquare", "ReduceL2", "ReduceMean")


def _same(g: _Graph, a: str, b: str) -> bool:
    """Whether tensors a and b hold the same values: one name, or DequantizeLinear of the same inputs."""
    if a == b:
        return True
    da, db = g.made(a, "DequantizeLinear"), g.made(b, "DequantizeLinear")
    return da is not None and db is not None and list(da.input) == list(db.input) and \
        [(x.name, x.i) for x in da.attribute] == [(x.name, x.i) for x in db.attribute]


def _squares(g: _Graph, name: str, x: str) -> list[onnx.NodeProto] | None:
    """The nodes of Pow(v, 2) or Mul(v, v), v = x or Abs(x), computing ``name``; else None."""
    sq = g.made(name, "Pow", "Mul")
    if sq is None or len(sq.input) != 2:
        return None
    if sq.op_type == "Pow":
        if _scalar(g, sq.input[1]) != 2:
            return None
        v = sq.input[0]
    elif sq.input[0] != sq.input[1]:
        return None
    else:
        v = sq.input[0]
    nodes = [sq]
    if (a := g.made(v, "Abs")) is not None:
        nodes.append(a)
        v = a.input[0]
    return nodes if _same(g, v, x) else None


def _chain(g: _Graph, node: onnx.NodeProto) -> L2Chain | None:
    """The written-out L2 normalization ``node`` ends, or None (the forms of the module's docstring; between the
    norm and the Div moves keeping row-major order or an Expand of the keepdims shape, as a softmax's sum)."""
    pairs = [node.input[:2]] if node.op_type == "Div" else [node.input[:2], node.input[1::-1]]
    for x, den in pairs:
        shape = g.shape(x)
        if shape is None or None in shape or x in g.constants:
            continue
        steps, name = [], den
        while len(steps) < 24 and (n := g.made(name, *_STEPS, *SUMS)) is not None:
            steps.append(n)
            if n.op_type in SUMS:
                break
            if n.op_type in ("Max", "Clip"):
                bound = _lower_bound(g, n)
                if bound is None:
                    break
                name = bound[0]
            elif n.op_type == "Add":
                name = next((v for v, c in ((n.input[0], n.input[1]), (n.input[1], n.input[0]))
                             if _scalar(g, c) is not None and v not in g.constants), "")
            elif n.op_type == "Pow" and _scalar(g, n.input[1]) != Fraction(1, 2):
                break
            else:
                name = n.input[0]
        if not steps or steps[-1].op_type not in SUMS:
            continue
        total, rank = steps[-1], len(shape)
        squares: list[onnx.NodeProto] | None = []
        if total.op_type in ("ReduceSum", "ReduceMean"):
            squares = _squares(g, total.input[0], x)
        elif not _same(g, total.input[0], x):
            squares = None
        axes = g.axes(total, rank, 13 if total.op_type == "ReduceSum" else 18)
        if squares is None or not axes or axes != list(range(axes[0], axes[-1] + 1)):
            continue
        keep = tuple(1 if a in axes else d for a, d in enumerate(shape))
        if not _divisor(g, steps[-2::-1], den, keep, shape):
            continue
        add, floor, outside, rooted, recips, ok = Fraction(0), Fraction(0), Fraction(0), total.op_type == "ReduceL2", \
            0, True
        for n in steps[-2::-1]:  # from the sum to the divisor
            if n.op_type in ("Sqrt", "Pow"):
                ok, rooted = ok and not rooted, True
            elif n.op_type == "Reciprocal":
                ok, recips = ok and rooted, recips + 1
            elif n.op_type == "Add":
                c = next(_scalar(g, i) for i in n.input if _scalar(g, i) is not None)
                ok = ok and not recips and c >= 0
                if rooted:  # eps added to the norm: ||x|| + eps
                    outside += c
                else:
                    add, floor = add + c, floor + c
            elif n.op_type in ("Max", "Clip"):
                c = _lower_bound(g, n)[1]
                ok = ok and not recips and not outside
                floor = max(floor, c * c if c > 0 else 0) if rooted else max(floor, c)
        if not ok or not rooted or recips != (node.op_type == "Mul"):
            continue
        view = (math.prod(shape[:axes[0]]), math.prod(shape[axes[0]:axes[-1] + 1]), math.prod(shape[axes[-1] + 1:]))
        k = view[1] if total.op_type == "ReduceMean" else 1
        if k > 1 and outside:  # sqrt(k) o, irrational: no such RMSNorm was seen
            continue
        return L2Chain(node, x, view, k * add, k * floor, outside, (*steps, *squares, node), k)
    return None


def l2_chains(graph: onnx.GraphProto, opset: int, shapes: dict[str, tuple[int, ...] | None],
              constants: dict[str, np.ndarray]) -> list[L2Chain]:
    """Every written-out L2 normalization of ``graph`` (``shapes``, ``constants`` and ``opset`` as
    ``chains.softmax_chains`` takes them)."""
    if not any(n.op_type in SUMS for n in graph.node):
        return []
    g = _Graph(graph, opset, shapes, constants)
    return [c for n in graph.node if n.op_type in ("Div", "Mul") and n.domain in ("", "ai.onnx")
            if (c := _chain(g, n)) is not None]


def l2_value(chain: L2Chain, x) -> L2Normalized | TailNormalized:
    """The chain's value: the L2 normalization of the dequantized x (per tensor), or of a value computed after the
    last QuantizeLinear (``normalized``)."""
    what = "RMS normalization" if chain.mean > 1 else "L2 normalization"

    def form(v) -> L2Normalized:
        v = per_tensor(scaled(v, f"the {what}'s input"), f"an {what}")
        float32_sum(v, chain.view[1], f"the {what}'s sum")
        return L2Normalized(v, chain.view, chain.add, chain.floor, chain.outside, not (chain.floor or chain.outside),
                            chain.node.name, what, chain.mean)

    return normalized(x, form)


# -- the norm as a value ------------------------------------------------------------------------------------------
#: The most output thresholds one bucket of a sum of squares past a table's 2^16 entries may hold.
MAX_INNER = 16
#: The most values of S a float function after the norm is evaluated on (float64: 32 MiB).
MAX_IMAGE = 1 << 22


def rounded_root(c: Fraction, v: int) -> int:
    """round(c sqrt(v)), half to even, exactly: k = floor(c sqrt(v)) = isqrt(floor(p^2 v / q^2)) (c = p / q), then
    4 p^2 v against (2k + 1)^2 q^2."""
    p, q = c.numerator, c.denominator
    k = math.isqrt(p * p * v // (q * q))
    d = 4 * p * p * v - (2 * k + 1) ** 2 * q * q
    return k + 1 if d > 0 or (d == 0 and k % 2) else k


def root_thresholds(cp: Fraction, p: int, top: int) -> list[int]:
    """The least integer S with round(c S^(1/p)) >= k (half to even), for k = 1 .. top, c^p = cp > 0:
    c S^(1/p) > k - 1/2 (>= where k is even) iff S > or >= (k - 1/2)^p / c^p = (2k - 1)^p b / (2^p a), cp = a / b,
    exactly in integers."""
    a, b = cp.numerator << p, cp.denominator
    out = []
    for k in range(1, top + 1):
        q = (2 * k - 1) ** p * b
        out.append(-(-q // a) if k % 2 == 0 else q // a + 1)
    return out


def norm_tables(marks: list[int], v_max: int, t_bits: int, levels: int,
                most: int, unit: int = 0) -> tuple[np.ndarray, list[np.ndarray], int]:
    """(base, inner, depth) over the index of S's level m and bucket b = floor(S / (4^m 2^unit)) (LayerNorm's: S
    itself below 2^T where unit is 0): base = the thresholds <= the bucket's least S, inner[d] = its (d+1)-th
    threshold above that, less one (v_max where none), so that k(S) = base + #{d: S > inner[d]} exactly; depth = the
    most thresholds in one bucket, inner empty where that passes ``most``."""
    size = 1 << t_bits
    m = np.concatenate([np.zeros(size, np.int64), np.repeat(np.arange(1, levels + 1), size - (size >> 2))])
    b = np.concatenate([np.arange(size)] + [np.arange(size >> 2, size)] * levels).astype(np.int64)
    lo_s, hi_s = b << (2 * m + unit), ((b + 1) << (2 * m + unit)) - 1
    marks_a = np.array(marks, np.int64)
    i = np.searchsorted(marks_a, lo_s, side="right")
    j = np.searchsorted(marks_a, np.minimum(hi_s, v_max), side="right")
    depth = int((j - i).max(initial=0))
    padded = np.append(marks_a - 1, v_max)  # a position past the bucket's thresholds reads v_max
    return i, [np.where(i + d < j, padded[np.minimum(i + d, marks_a.size)], v_max)
               for d in range(depth if depth <= most else 0)], depth


def counted(ctx, total: Tensor, marks: list[int], v_max: int, where: str, of: str = "sum of squares",
            layout: tuple[int, int, int] | None = None) -> Tensor:
    """The number of ``marks`` (ascending thresholds) at or below each S = total in [0, v_max] (shape (outer, 1,
    inner)): k(S) = base[index] + #{d: S > inner[d][index]} (``norm_tables``), index = m * 3 2^(T-2) + b from the
    level m and bucket b = floor(S / (4^m 2^unit)) of S // 2^unit (a count of thresholds 2^T 4^k - 1 below it; no
    levels: the bucket itself); ``layout`` (T, levels, unit), by default ``table_shape``'s at unit 0; refused, naming
    ``where``, where one bucket holds more than ``MAX_INNER`` marks."""
    op = partial(proven, ctx)
    col = total.shape
    t_bits, levels, unit = layout or (*table_shape(v_max, 0), 0)
    base, inner_t, depth = norm_tables(marks, v_max, t_bits, levels, MAX_INNER, unit)
    if depth > MAX_INNER:
        raise Refuse(f"{where}: its output takes {depth} steps within one bucket of its {of} (at most "
                     f"{MAX_INNER}): quantize it at a coarser scale")
    key = op("broadcast_div", total, c32(1 << unit), 0, v_max >> unit, col) if unit else total
    index = levelled(ctx, key, t_bits, levels, base.size, (1 << t_bits) - 1)[1] if levels else key

    def lut(values: np.ndarray) -> Tensor:
        e = ctx.emit("cvm_lut", ctx.entry(index), ctx.entry(c32(values)), in_dim=values.size)
        return ctx.result(e, INT32, int(values.min()), int(values.max()), col)

    r = lut(base)
    for th in inner_t:
        past = op("broadcast_greater", total, lut(th), 0, 1, col)
        r = op("broadcast_add", r, past, r.lo, r.hi + 1, col)
    return r


@dataclass(frozen=True, eq=False)
class Norm(Deferred):
    """||x|| = s sqrt(S) over the n values of ``view`` (outer, n, inner) of a per-tensor x = u s, S = sum u^2 (an
    exact integer), of shape ``shape`` (the reduction's, keepdims either way), made integers by the QuantizeLinear
    that follows (or a float output's grid): round(s sqrt(S) / s_y) + z_y, exactly."""

    x: Scaled
    view: tuple[int, int, int]
    shape: tuple[int, ...]
    node: str = ""
    what: str = "L2 norm"
    fn: Callable[[np.ndarray], np.ndarray] | None = None  # a float function applied after the norm (float64)

    def peak(self) -> int:
        t, z = self.x.t, int(self.x.zero.reshape(()))
        return max(abs(t.lo - z), abs(t.hi - z))

    def then(self, fn: Callable[[np.ndarray], np.ndarray], what: str) -> Norm:
        """fn of this value (Clip, Pow, Log, ...): a table over S (``image``)."""
        f = self.fn
        return replace(self, fn=fn if f is None else lambda v: fn(f(v)), what=f"{what}({self.what})")

    def image(self) -> np.ndarray:
        """fn(s sqrt(S)) for S = 0 .. n P^2 (float64), refused where S takes more than ``MAX_IMAGE`` values or fn is
        undefined (NaN) on one of them."""
        v_max = self.view[1] * self.peak() ** 2
        if v_max >= MAX_IMAGE:
            raise Refuse(f"{self.node} ({self.what}): a function of an L2 norm whose sum of squares takes {v_max + 1} "
                         "values (at most 2^22) has no CVM form here: quantize the norm first")
        with np.errstate(all="ignore"):
            out = np.asarray(self.fn(np.sqrt(np.arange(v_max + 1, dtype=np.float64))
                                     * float(self.x.scale.reshape(()).item())), np.float64)
        if np.isnan(out).any():
            raise Refuse(f"{self.node} ({self.what}) is undefined (NaN) on part of its input's range")
        return np.broadcast_to(out, (v_max + 1,))

    @property
    def ends(self) -> tuple[float, float]:
        """0 to s sqrt(n P^2) (a function's finite values on the table), the span a float output is quantized to."""
        if self.fn is not None:
            finite = self.image()[np.isfinite(self.image())]
            return (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
        return 0.0, float(self.x.scale.reshape(()).item()) * math.sqrt(self.view[1]) * self.peak()

    def quantized(self, ctx, scale: np.ndarray, out_zero: int, dtype: int) -> Tensor:
        """S = sum u^2 (``squares_fit``), then the output k - z_y = round(c sqrt(S)), c = s / s_y: a cvm_lut table
        over S (``rounded_root``) where S <= n P^2 < 2^16, else the number of ``root_thresholds`` <= S at S's level
        and bucket (``norm_tables``); + z_y, clipped. With a function after the norm, a table over S of
        round(fn(s sqrt(S)) / s_y) (``image``, float64, half to even: as a float function's table over its input's
        integers), ``function_of``."""
        if scale.size != 1:
            raise Refuse(f"{self.node} (L2 norm) with a per-channel output scale has no CVM form")
        lo, hi = INT_RANGES[dtype]
        outer, n, inner = self.view
        peak, v_max = self.peak(), n * self.peak() ** 2
        if not squares_fit(n, peak):
            raise Refuse(f"{self.node} (L2 norm) over {n} values |u| <= {peak} passes 32 bits in its sum of squares")
        c = self.x.scale.reshape(()).item() / scale.reshape(()).item()
        top = max(hi - out_zero, 0)
        k_max = min(top, math.floor(c * (math.isqrt(v_max) + 1)) + 1)  # round(c sqrt(S)) <= c sqrt(v_max) + 1/2
        op = partial(proven, ctx)
        t, z = as_int32(self.x.t), int(self.x.zero.reshape(()))
        rows, col = self.view, (outer, 1, inner)
        u = ctx.reshape(t, rows)
        if z:
            u = op("broadcast_sub", u, c32(z), -peak, peak, rows)
        else:
            u = ctx.result(ctx.entry(u), INT32, -peak, peak, rows)
        square = op("broadcast_mul", u, u, 0, peak * peak, rows)
        total = ctx.reshape(reduced(ctx, "sum", square, [1], 0, v_max), col)
        ctx.requants.append(Requant(ctx.base, (), None))
        if self.fn is not None:
            values = np.clip(np.rint(self.image() / float(scale.reshape(()).item())), lo - out_zero,
                             hi - out_zero).astype(np.int64)
            r = self.function_of(ctx, total, values)
        elif v_max < MAX_TABLE:
            values = np.array([min(rounded_root(c, v), top) for v in range(v_max + 1)], np.int64)
            e = ctx.emit("cvm_lut", ctx.entry(total), ctx.entry(c32(values)), in_dim=v_max + 1)
            r = ctx.result(e, INT32, int(values.min()), int(values.max()), col)
        else:
            r = counted(ctx, total, [m for m in root_thresholds(c * c, 2, k_max) if m <= v_max], v_max,
                        f"{self.node} ({self.what})")
        return saturate(ctx, ctx.reshape(r, self.shape), out_zero, lo, hi, dtype, self.shape)

    def function_of(self, ctx, total: Tensor, values: np.ndarray) -> Tensor:
        """values[S] (less z_y): a cvm_lut table over S where it has at most 2^16 entries; else, where values is
        monotone in S, values[0] plus or minus the number of its unit steps at or below S (``counted``)."""
        col = (self.view[0], 1, self.view[2])
        if values.size <= MAX_TABLE:
            e = ctx.emit("cvm_lut", ctx.entry(total), ctx.entry(c32(values)), in_dim=values.size)
            return ctx.result(e, INT32, int(values.min()), int(values.max()), col)
        steps = np.diff(values)
        sign = 1 if (steps >= 0).all() else -1 if (steps <= 0).all() else 0
        if not sign:
            raise Refuse(f"{self.node} ({self.what}) over a sum of squares of {values.size} values (a table holds at "
                         "most 2^16) is not monotone in it: quantize the norm first")
        marks = np.repeat(np.arange(1, values.size), np.abs(steps)).tolist()
        count = counted(ctx, total, marks, values.size - 1, f"{self.node} ({self.what})")
        first = int(values[0])
        if sign < 0:
            count = proven(ctx, "broadcast_mul", count, c32(-1), -count.hi, 0, col)
        return proven(ctx, "broadcast_add", count, c32(first), first + count.lo, first + count.hi, col)


@dataclass(frozen=True)
class NormChain:
    """The node ``node`` computing the L2 norm of tensor ``x`` over ``view`` (outer, n, inner), of shape ``shape``:
    ReduceL2(x), Sqrt or Pow(., 0.5) of ReduceSumSquare(x) or of ReduceSum of Pow(x, 2) or Mul(x, x), x or Abs(x)
    inside; ``nodes``: every node of it."""

    node: onnx.NodeProto
    x: str
    view: tuple[int, int, int]
    shape: tuple[int, ...]
    nodes: tuple[onnx.NodeProto, ...]


def _unsigned(g: _Graph, name: str) -> tuple[str, list[onnx.NodeProto]]:
    """(x, [Abs]) where ``name`` is Abs(x), else (name, [])."""
    a = g.made(name, "Abs")
    return (a.input[0], [a]) if a is not None else (name, [])


def _norm(g: _Graph, node: onnx.NodeProto) -> NormChain | None:
    """The norm ``node`` computes (``NormChain``'s forms), or None."""
    if node.op_type == "ReduceL2":
        total, rooted = node, []
    elif node.op_type == "Sqrt" or (node.op_type == "Pow" and len(node.input) == 2
                                    and _scalar(g, node.input[1]) == Fraction(1, 2)):
        total, rooted = g.made(node.input[0], "ReduceSum", "ReduceSumSquare"), [node]
        if total is None:
            return None
    else:
        return None
    if total.op_type == "ReduceSum":
        sq = g.made(total.input[0], "Pow", "Mul")
        if sq is None or len(sq.input) != 2:
            return None
        if sq.op_type == "Pow" and _scalar(g, sq.input[1]) != 2 or \
                sq.op_type == "Mul" and not _same(g, sq.input[0], sq.input[1]):
            return None
        x, inner = _unsigned(g, sq.input[0])
        inner = [sq, *inner]
    else:
        x, inner = _unsigned(g, total.input[0])
    shape = g.shape(x)
    if shape is None or None in shape or x in g.constants:
        return None
    axes = g.axes(total, len(shape), 13 if total.op_type == "ReduceSum" else 18)
    if not axes or axes != list(range(axes[0], axes[-1] + 1)):
        return None
    keep = next((a.i for a in total.attribute if a.name == "keepdims"), 1)
    out = tuple(1 if a in axes else d for a, d in enumerate(shape) if keep or a not in axes)
    view = (math.prod(shape[:axes[0]]), math.prod(shape[axes[0]:axes[-1] + 1]), math.prod(shape[axes[-1] + 1:]))
    return NormChain(node, x, view, out, (*rooted, total, *inner))


def norm_chains(graph: onnx.GraphProto, opset: int, shapes: dict[str, tuple[int, ...] | None],
                constants: dict[str, np.ndarray]) -> list[NormChain]:
    """Every L2 norm of ``graph`` computed as a value (``NormChain``), those inside an L2 normalization
    (``l2_chains``) left to it (arguments as ``l2_chains`` takes them)."""
    if not any(n.op_type in SUMS for n in graph.node):
        return []
    g = _Graph(graph, opset, shapes, constants)
    taken = {id(n) for c in l2_chains(graph, opset, shapes, constants) for n in c.nodes}
    return [c for n in graph.node if n.domain in ("", "ai.onnx") and id(n) not in taken
            if (c := _norm(g, n)) is not None]


def norm_value(chain: NormChain, x) -> Norm:
    """The chain's value: the L2 norm of the dequantized x (per tensor)."""
    x = per_tensor(scaled(x, "the L2 norm's input"), "an L2 norm")
    float32_sum(x, chain.view[1], "the L2 norm's sum")
    return Norm(x, chain.view, chain.shape, chain.node.name)
