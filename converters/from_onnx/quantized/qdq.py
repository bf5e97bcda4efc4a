"""DequantizeLinear (a ``Scaled`` of its integer input, nothing emitted) and QuantizeLinear: a ``Real`` requantized into
its integer type (``requant_plans.plan``: multiply, cvm_right_shift, saturation as clip; per-channel runs; a far zero point
settled), a ``Mapped`` as a cvm_lut table, a ``Softmaxed`` by its softmax plan. ``Requant`` records each for the report.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NamedTuple
from fractions import Fraction

import numpy as np
from onnx import TensorProto

from ..context import INT32, INT_RANGES, Tensor, bound, const, tight, type_name
from ..emit import as_int32, broadcast_of, broadcast_shape, minus_zero, normal, reduced
from ..registry import Refuse, float_rule, rule
from ..requant_plans import (FarPlan, LogSoftmaxPlan, NoPlan, Plan, Run, SoftmaxPlan, distinct, far_plan,
                             logsoftmax_plan, plan, runs, softmax_plan)
from .values import (FAR, MS, QUANTIZED_TYPES, Deferred, Mapped, Real, Scaled, Softmaxed, Summed, along, axis_of,
                     of_integers, per_tensor, scale_of, scaled, zero_of)

MAX_TABLE = 1 << 16  # entries a cvm_lut table of a float function may have
#: A per-channel requantization whose one plan's delta passes this is cut into runs of channels, each within it
#: where a run can be (docs/import.md): widely spread channel scales cost one plan most of its multiplier's bits.
FINE = Fraction(1, 64)


@dataclass(frozen=True)
class Requant:
    """One requantization, for the report: the ONNX node, the ratios M, the plan (or M == 1, or a table: none), or
    the runs of channels with a plan each (requant_plans.runs) where one plan cannot hold every channel."""

    node: str
    ratios: tuple[float, ...]
    plan: Plan | None
    runs: tuple[Run, ...] = ()
    softmax: SoftmaxPlan | None = None
    logsoftmax: LogSoftmaxPlan | None = None
    layernorm: object | None = None  # norm.LayerNormPlan
    lrn: object | None = None  # lrn.LRNPlan
    settled: tuple[tuple[int, int], ...] = ()  # (row, its one output value): rows of a far zero point (``settle``)
    far: tuple[tuple[int, FarPlan], ...] = ()  # (row, its plan): far rows whose output varies (``far_rows``)

    @property
    def plans(self) -> list[Plan]:
        return [self.plan] if self.plan is not None else [r.plan for r in self.runs]


# -- DequantizeLinear and QuantizeLinear ------------------------------------------------------------------------
def dequantize(node, x, s: Tensor | None, z: Tensor | None, axis: int | None = None) -> Scaled:
    if isinstance(x, Real) or x.dtype not in (*QUANTIZED_TYPES, INT32):
        raise Refuse(f"DequantizeLinear of {'a float value' if isinstance(x, Real) else type_name(x.dtype)}: "
                     f"CVM takes int8, uint8, int16, uint16 or int32")
    if node is not None and node.attr_int("block_size", 0):
        raise Refuse("blocked quantization (block_size) has no CVM form")
    scale = scale_of(s, "x_scale")
    zero = zero_of(z, x.dtype, "x_zero_point")
    rank = len(x.shape)
    if axis is None:
        axis = axis_of(node, rank, scale.size) if node is not None else 0
    return Scaled(x, along(scale, axis, rank), along(zero, axis, rank))


#: The least |(x - zero) * scale| that float32 rounds to inf: 2^128 - 2^103, halfway past its largest value.
FLOAT32_OVERFLOW = Fraction(2**128 - 2**103)


@rule("DequantizeLinear", since=10)
@rule("DequantizeLinear", since=1, domain=MS)
def dequantize_rule(ctx, node, x, s, z=None):
    """x -> (x - zero) * scale, held exactly: nothing is emitted. Refused where a value of x's type reaches
    ``FLOAT32_OVERFLOW``: DequantizeLinear gives inf there (and the ops after it inf or NaN), no integer form."""
    y = dequantize(node, x, s, z)
    zero, scale = np.broadcast_arrays(y.zero, y.scale)
    reach = max((max(x.hi - int(z), int(z) - x.lo) * Fraction(v) for z, v in zip(zero.flat, scale.flat)), default=0)
    if reach >= FLOAT32_OVERFLOW:
        raise Refuse(f"DequantizeLinear of values reaching {float(reach):.3g}, past float32's range: it gives inf "
                     "there, which has no integer form")
    return y


def out_type(node, z: Tensor | None) -> int:
    if z is not None:
        dtype = z.dtype
    else:
        dtype = node.attr_int("output_dtype", 0) or TensorProto.UINT8
    if dtype not in QUANTIZED_TYPES:
        raise Refuse(f"quantization to {type_name(dtype)}: CVM takes int8, uint8, int16 or uint16")
    return dtype


@float_rule("QuantizeLinear", since=10)
@float_rule("QuantizeLinear", since=1, domain=MS)
@rule("QuantizeLinear", since=10)
@rule("QuantizeLinear", since=1, domain=MS)
def quantize_rule(ctx, node, x, s, z=None):
    """round(x / scale) + zero, saturated: a requantization of x's integers (or a table for a float function); of a
    float tensor the importer holds as integers (the first float tensor after an integer input), at scale 1; of an
    empty x (an empty slice), the empty constant (a Concat drops it)."""
    dtype = out_type(node, z)
    if node.attr_int("block_size", 0):
        raise Refuse("blocked quantization (block_size) has no CVM form")
    scale, zero = scale_of(s, "y_scale"), zero_of(z, dtype, "y_zero_point")
    rank = len(x.shape)
    axis = axis_of(node, rank, scale.size)
    if 0 in x.shape:
        return const(np.zeros(x.shape, np.int64), dtype)
    if isinstance(x, Tensor) and x.is_const and x.value.dtype.kind == "f":
        return quantized_constant(x, s.value, along(zero, axis, rank), axis, dtype)
    if isinstance(x, Tensor):  # a float tensor of integers (after an integer input: a Cast, a OneHot): scale 1
        x = of_integers(x)
    return quantize(ctx, x, along(scale, axis, rank), along(zero, axis, rank), dtype)


def quantized_constant(x: Tensor, scale: np.ndarray, zero: np.ndarray, axis: int, dtype: int) -> Tensor:
    """QuantizeLinear of a float constant (weights held in a Constant node, as Paddle's exports write them),
    folded as onnxruntime computes it: saturate(round_half_even(float32(x) / float32(scale)) + zero)."""
    lo, hi = INT_RANGES[dtype]
    s = along(np.asarray(scale, np.float32), axis, len(x.shape))
    with np.errstate(all="ignore"):
        q = np.rint(np.asarray(x.value, np.float32) / s)
    if not np.isfinite(q).all():
        raise Refuse("QuantizeLinear of a constant holding non-finite values")
    return const(np.clip(q.astype(np.float64) + zero, lo, hi).astype(np.int64), dtype)


def quantize(ctx, x, scale: np.ndarray, zero: np.ndarray, dtype: int) -> Tensor:
    """The integers of type ``dtype`` that QuantizeLinear(x, scale, zero) gives."""
    if zero.size != 1:
        raise Refuse("a per-channel output zero point has no CVM form here")
    out_zero = int(zero.reshape(()))
    lo, hi = INT_RANGES[dtype]
    if isinstance(x, Mapped):
        return table(ctx, x, scale, out_zero, dtype)
    if isinstance(x, Softmaxed):
        return softmax(ctx, x, scale, out_zero, dtype)
    if isinstance(x, Deferred):
        return x.quantized(ctx, scale, out_zero, dtype)
    offset, settled, far, extra = None, (), (), None
    if isinstance(x, Scaled):
        lo, hi = (max(lo, clipped(x.clip[0], scale, out_zero, lo, hi)) if x.clip[0] is not None else lo,
                  min(hi, clipped(x.clip[1], scale, out_zero, lo, hi)) if x.clip[1] is not None else hi)
        far, extra = far_rows(ctx, x, scale, out_zero, lo, hi, dtype)
        x, offset, settled = settle(ctx, x, scale, out_zero, lo, hi, tuple(i for i, _ in far))
    terms = x.terms if isinstance(x, Summed) else (x,)
    vs = [minus_zero(ctx, term.t, term.zero) for term in terms]
    ratios = [divided(term.scale, scale) for term in terms]
    shape = broadcast_shape(*vs)

    def finish(r: Tensor) -> Tensor:  # the settled and far rows' values added, then z_out and the saturation
        if offset is not None and settled:
            oc = const(offset.astype(np.int32), INT32)
            r = ctx.result(ctx.op("broadcast_add", r, oc), INT32, r.lo + min(int(offset.min()), 0),
                           r.hi + max(int(offset.max()), 0), broadcast_shape(r, oc))
        if extra is not None:
            r = ctx.result(ctx.op("broadcast_add", r, extra), INT32, r.lo + extra.lo, r.hi + extra.hi,
                           broadcast_shape(r, extra))
        return saturate(ctx, r, out_zero, lo, hi, dtype, shape)

    if len(vs) == 1 and all(r == 1 for r in ratios[0].flat):  # the same scale: only the zero point moves
        ctx.requants.append(Requant(ctx.base, (1.0,), None, settled=settled, far=far))
        return finish(vs[0])
    tlo, thi = INT_RANGES[dtype]  # the type holds the zero point: the plan's clip needs low <= 0 <= high
    flat = tuple(v for m in ratios for v in floats(m))
    axis = channel_axis(ratios[0], len(shape)) if len(vs) == 1 else None
    if axis is not None and vs[0].shape[axis] != shape[axis]:
        axis = None
    # two parts where closer (two_part), else only where one part has no plan and no runs of channels can help
    split_above = ctx.split_above if ctx.split_above is not None or axis is not None else Fraction(1, 2)
    try:
        p = plan([(v.lo, v.hi, r) for v, r in zip(vs, ratios)], tlo - out_zero, thi - out_zero, split_above)
    except NoPlan as e:
        if axis is None:
            raise Refuse(str(e)) from None
        p = None
    if axis is not None and (p is None or p.delta > FINE):  # runs of channels, each within FINE where one can be
        try:
            parts = runs(vs[0].lo, vs[0].hi, ratios[0].reshape(-1), tlo - out_zero, thi - out_zero, FINE,
                         ctx.split_above)
        except NoPlan as e2:
            raise Refuse(str(e2)) from None
        if p is None or len(parts) > 1:
            ctx.requants.append(Requant(ctx.base, flat, None, tuple(parts), settled=settled, far=far))
            return finish(apply_runs(ctx, vs[0], parts, axis, ratios[0].shape))
    ctx.requants.append(Requant(ctx.base, flat, p, settled=settled, far=far))
    return finish(apply(ctx, vs, p))




def divided(scale: np.ndarray, out_scale: np.ndarray) -> np.ndarray:
    """The ratios M = scale / out_scale (object arrays of Fractions), each distinct value of ``scale`` divided once
    beside a per-tensor ``out_scale`` (a scale per position repeats a few values: a Resize's, ``distinct``)."""
    scale = np.asarray(scale, dtype=object)
    if out_scale.size != 1:
        return np.asarray(scale / out_scale, dtype=object)
    values, index = distinct(scale)
    m = np.asarray((values / out_scale.reshape(()).item())[index], dtype=object)  # a 0-d index gives a Fraction
    return m.reshape(np.broadcast_shapes(scale.shape, out_scale.shape))


def floats(m: np.ndarray) -> list[float]:
    """The ratios M (an object array) as floats, flat, each distinct value converted once."""
    values, index = distinct(m)
    return np.array([float(v) for v in values], np.float64)[index].reshape(-1).tolist()


def far_of(x: Scaled, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, ...]]:
    """(far, zero, ratio, full): the rows whose zero point is FAR, the zero points and ratios M broadcast to the
    shape ``full`` of x's scale and zero point (ratio None where no row is far). Far rows beside a per-channel
    output scale are refused."""
    full = broadcast_of(x.scale.shape, x.zero.shape)
    far = np.broadcast_to(np.abs(x.zero) >= FAR, full)
    if far.any() and scale.size != 1:
        raise Refuse(f"a zero point of 2^30 or more (a dead channel's) beside a per-channel output scale of "
                     f"{scale.size} values has no CVM form here")
    ratio = np.broadcast_to(np.asarray(x.scale / scale.reshape(()).item(), dtype=object), full) \
        if far.any() else None
    return far, np.broadcast_to(x.zero, full), ratio, full


def one_value(t: Tensor, z: int, m, out_zero: int, lo: int, hi: int) -> int | None:
    """The one output K of a row of values (t - z) m for every t in t's interval (round half to even of the exact
    values at its ends, saturated: rounding is monotone), or None where it varies."""
    ends = {min(max(round((v - z) * m) + out_zero, lo), hi) for v in (t.lo, t.hi)}
    return ends.pop() if len(ends) == 1 else None


def far_rows(ctx, x: Scaled, scale: np.ndarray, out_zero: int, lo: int, hi: int,
             dtype: int) -> tuple[tuple[tuple[int, FarPlan], ...], Tensor | None]:
    """The far rows whose output varies (docs/import.md, "Far rows whose output varies"), each requantized alone
    by its ``FarPlan`` on t (v = t - z with the constant -z split off at import): `take` of the row along the
    channel axis, [`clip`], [`broadcast_add` c0, `cvm_right_shift` s], `broadcast_mul` m, `broadcast_add` of the
    addend, `cvm_right_shift` k, `broadcast_add` Q, then `broadcast_mul` by the row's 0/1 mask, so that the sum
    over such rows (`broadcast_add`) is r on them and 0 elsewhere. (((row, plan), ...), that sum or None)."""
    far, zero, ratio, full = far_of(x, scale)
    rows = [i for i in map(tuple, np.argwhere(far)) if one_value(x.t, int(zero[i]), ratio[i], out_zero, lo, hi) is None]
    if not rows:
        return (), None
    axes = [a for a, n in enumerate(full) if n > 1]
    if len(axes) > 1:
        raise Refuse("a far zero point (a dead channel's bias) that varies along more than one axis has no CVM form")
    tlo, thi = INT_RANGES[dtype]
    plans, extra = [], None
    t = as_int32(x.t)
    for i in rows:
        row = int(np.ravel_multi_index(i, full)) if full else 0
        try:
            p = far_plan(t.lo, t.hi, -int(zero[i]), ratio[i], tlo - out_zero, thi - out_zero)
        except NoPlan as e:
            raise Refuse(f"output channel {row}: its bias is {-int(zero[i])} steps of the accumulator's scale (input "
                         f"scale x weight scale), beyond any CVM label (2^30), and its output varies: {e}") from None
        plans.append((row, p))
        if not axes:  # one row: the whole tensor
            r = far_row(ctx, t, p)
        else:
            axis = len(x.shape) - len(full) + axes[0]
            idx = const(np.array([i[axes[0]]], np.int32), INT32)
            shape = t.shape[:axis] + (1,) + t.shape[axis + 1:]
            u = ctx.result(ctx.emit("take", ctx.entry(t), ctx.entry(idx), axis=axis), INT32, t.lo, t.hi, shape)
            mask = np.zeros(full, np.int32)
            mask[i] = 1
            mc = const(mask, INT32)
            r = far_row(ctx, u, p)
            r = ctx.result(ctx.op("broadcast_mul", r, mc), INT32, min(r.lo, 0), max(r.hi, 0),
                           broadcast_shape(r, mc))
        extra = r if extra is None else ctx.result(ctx.op("broadcast_add", extra, r), INT32, extra.lo + r.lo,
                                                   extra.hi + r.hi, broadcast_shape(extra, r))
    return tuple(plans), extra


def far_row(ctx, u: Tensor, fp: FarPlan) -> Tensor:
    """r = cvm_right_shift(cvm_right_shift(clip(u) + c0, s) m + addend, k) + Q (requant_plans.FarPlan)."""
    p = fp.plan
    if p.clip is not None:
        u = ctx.apply("clip", u, shape=u.shape, a_min=p.clip[0], a_max=p.clip[1])
    if p.pre_shift:
        if fp.pre_add:
            u = ctx.apply("broadcast_add", u, const(np.array(fp.pre_add, np.int32), INT32), shape=u.shape)
        u = ctx.apply("cvm_right_shift", u, shape=u.shape, precision=p.pre_precision, shift_bit=p.pre_shift)
    u = ctx.result(ctx.narrow(u, p.pre_precision), INT32, u.lo, u.hi, u.shape)
    v = product(ctx, u, p.multipliers[0].reshape(()))
    if fp.add:
        v = ctx.apply("broadcast_add", v, const(np.array(fp.add, np.int32), INT32), shape=v.shape)
    r = shifted(ctx, v, p.precision, p.shift)
    if fp.after:
        r = ctx.apply("broadcast_add", r, const(np.array(fp.after, np.int32), INT32), shape=r.shape)
    return r


def settle(ctx, x: Scaled, scale: np.ndarray, out_zero: int, lo: int, hi: int,
           varying: tuple[int, ...] = ()) -> tuple[Scaled, np.ndarray | None, tuple]:
    """Rows of x whose zero point is FAR (a dead channel: tiny weight scale, huge bias) are set to 0 before the
    requantization (zero point 0, the least other ratio): those whose QuantizeLinear gives one value K for every t
    in t's interval (``one_value``) get K - z_out added after it; the rows ``varying`` (flat indices) get their
    ``far_rows`` values instead. (x, those offsets per row or None, ((row, K), ...))."""
    far, zero, ratio, full = far_of(x, scale)
    if not far.any():
        return x, None, ()
    offset, settled = np.zeros(full, np.int64), []
    for i in np.ndindex(*full):
        row = int(np.ravel_multi_index(i, full)) if full else 0
        if not far[i] or row in varying:
            continue
        k = one_value(x.t, int(zero[i]), ratio[i], out_zero, lo, hi)
        offset[i] = k - out_zero
        settled.append((row, k))
    t = as_int32(x.t)  # 0 on the far rows: min(max(t, L), H) with L = H = 0 there, t's own bounds elsewhere
    low = const(np.where(far, 0, min(t.lo, 0)).astype(np.int32), INT32)
    high = const(np.where(far, 0, -max(t.hi, 0)).astype(np.int32), INT32)
    shape = broadcast_shape(t, low)
    t = ctx.result(ctx.op("broadcast_max", t, low), INT32, min(t.lo, 0), max(t.hi, 0), shape)
    t = ctx.result(ctx.op("negative", t), INT32, -t.hi, -t.lo, shape)
    t = ctx.result(ctx.op("broadcast_max", t, high), INT32, t.lo, t.hi, shape)
    t = ctx.result(ctx.op("negative", t), INT32, -t.hi, -t.lo, shape)
    rest = [r for r, f in zip(ratio.flat, far.flat) if not f]
    fill = min(rest) if rest else Fraction(1)
    new_scale = np.where(far, fill * scale.reshape(()).item(), np.broadcast_to(x.scale, full)).astype(object)
    return Scaled(t, new_scale, np.where(far, 0, zero).astype(np.int64), x.clip), offset, tuple(settled)


def channel_axis(ratio: np.ndarray, rank: int) -> int | None:
    """The one axis of a rank-``rank`` tensor along which a per-channel ratio varies (None: a scalar, or several)."""
    axes = [i for i, n in enumerate(ratio.shape) if n > 1]
    return rank - ratio.ndim + axes[0] if len(axes) == 1 else None


def apply_runs(ctx, v: Tensor, parts: list[Run], axis: int, rshape: tuple[int, ...]) -> Tensor:
    """Each run's channels taken out of v (``take`` along ``axis``), requantized by its plan, concatenated, and put
    back in channel order by one more ``take``."""
    outs = []
    for run in parts:
        idx = const(run.channels.astype(np.int32), INT32)
        shape = v.shape[:axis] + (len(run.channels),) + v.shape[axis + 1:]
        sub = ctx.result(ctx.emit("take", ctx.entry(v), ctx.entry(idx), axis=axis), INT32, v.lo, v.hi, shape)
        p = run.plan
        shaped = replace(p, multipliers=tuple(m.reshape((-1,) + rshape[1:]) for m in p.multipliers))
        outs.append(apply(ctx, [sub], shaped))
    order = np.concatenate([r.channels for r in parts])
    y = ctx.result(ctx.emit("concatenate", *(ctx.entry(o) for o in outs), axis=axis), INT32,
                   min(o.lo for o in outs), max(o.hi for o in outs), v.shape)
    back = const(np.argsort(order).astype(np.int32), INT32)
    return ctx.result(ctx.emit("take", ctx.entry(y), ctx.entry(back), axis=axis), INT32, y.lo, y.hi, v.shape)


def clipped(bound_: Fraction, scale: np.ndarray, out_zero: int, lo: int, hi: int) -> int:
    """QuantizeLinear of one real value (round half to even), saturated."""
    if scale.size != 1:
        raise Refuse("a Clip before a per-channel QuantizeLinear has no CVM form")
    q = bound_ / scale.reshape(()).item()
    return min(max(round(q) + out_zero, lo), hi)


def apply(ctx, vs: list[Tensor], p: Plan) -> Tensor:
    """The plan's integer ops on v_i: [clip, pre-shift,] multiply(s), sum, cvm_right_shift (requant_plans.py); a split
    plan's products in parts (``split``); an even plan's shift rounding half to even (``half_even``)."""
    if p.split:
        return split(ctx, [prepared(ctx, v, p) for v in vs], p)
    if p.even:  # a multiplier of 1 (M = 1 / 2^k: a pool at one scale) is left out
        products = [prepared(ctx, v, p) if (m == 1).all() else product(ctx, prepared(ctx, v, p), m)
                    for v, m in zip(vs, p.multipliers)]
        return half_even(ctx, total(ctx, products), p.even, p.shift)
    products = [product(ctx, prepared(ctx, v, p), m) for v, m in zip(vs, p.multipliers)]
    return shifted(ctx, total(ctx, products), p.precision, p.shift)


def total(ctx, xs: list[Tensor]) -> Tensor:
    """The sum of xs, added left to right (broadcast_add)."""
    out = xs[0]
    for t in xs[1:]:
        out = ctx.apply("broadcast_add", out, t, shape=broadcast_shape(out, t))
    return out


def prepared(ctx, v: Tensor, p: Plan) -> Tensor:
    """v1: v clipped and pre-shifted as the plan says, its label narrowed to its interval."""
    if p.clip is not None:
        a, b = p.clip
        v = ctx.apply("clip", v, shape=v.shape, a_min=a, a_max=b)
    if p.pre_shift:
        v = ctx.apply("cvm_right_shift", v, shape=v.shape, precision=p.pre_precision, shift_bit=p.pre_shift)
    return ctx.result(ctx.narrow(v, tight(v.peak)), v.dtype, v.lo, v.hi, v.shape)


def product(ctx, v: Tensor, m: np.ndarray) -> Tensor:
    """v * m (broadcast_mul by the constant m >= 0)."""
    mc = const(m.astype(np.int32), INT32)
    e = ctx.emit("broadcast_mul", v.entry, ctx.entry(mc))
    return ctx.result(e, INT32, min(v.lo * int(m.max()), 0), max(v.hi * int(m.max()), 0), broadcast_shape(v, mc))


def shifted(ctx, x: Tensor, precision: int, k: int) -> Tensor:
    """cvm_right_shift(x, k) into ``precision``, its interval the symmetric bound of that precision."""
    b = bound(precision)
    e = ctx.emit("cvm_right_shift", x.entry, precision=precision, shift_bit=k)
    return ctx.result(e, INT32, -b, b, x.shape)


def half_even(ctx, t: Tensor, precision: int, k: int) -> Tensor:
    """round_half_even(t / 2^k) (docs/import.md, "Ties"): cvm_right_shift(t + 2^(k-1) - 1, k + 1) +
    cvm_right_shift(t - 2^(k-1), k + 1), i.e. floor((t + 3 2^(k-1) - 1) / 2^(k+1)) + floor((t + 2^(k-1)) / 2^(k+1)),
    each shift into ``precision`` (the add of 0, for k = 1, left out); the interval from t's ends (every op is
    monotone)."""
    b = bound(precision)

    def at(x: int) -> int:
        return sum(min(max((x + c + (1 << k)) >> (k + 1), -b), b) for c in ((1 << (k - 1)) - 1, -(1 << (k - 1))))

    halves = []
    for c in (-(1 << (k - 1)), (1 << (k - 1)) - 1):
        u = ctx.apply("broadcast_add", t, const(np.array(c, np.int32), INT32), shape=t.shape) if c else t
        e = ctx.emit("cvm_right_shift", u.entry, precision=precision, shift_bit=k + 1)
        halves.append(ctx.result(e, INT32, -b, b, t.shape))
    e = ctx.op("broadcast_add", *halves)
    return ctx.result(e, INT32, at(t.lo), at(t.hi), t.shape)


def split(ctx, vs: list[Tensor], p: Plan) -> Tensor:
    """round_half_up(sum_i v_i m_i / 2^k) with each m_i in parts (docs/import.md, "Two-part products", "Products in
    n parts"): from the lowest level up, P_j = sum_i v_i m_ij (broadcast_mul, broadcast_add), plus t_(j-1) above
    the lowest, t_j = floor(that / 2^(b_j)) = cvm_right_shift(that - 2^(b_j-1), b_j) (broadcast_add first); then
    cvm_right_shift(sum_i v_i m_top_i + t_last, k - B)."""
    parts = p.parts
    t = None
    for j, (b, low) in enumerate(zip(p.widths, p.lows)):
        x = total(ctx, [product(ctx, v, ms[-1 - j]) for v, ms in zip(vs, parts)])
        if t is not None:
            x = ctx.apply("broadcast_add", x, t, shape=broadcast_shape(x, t))
        c = const(np.array(-(1 << (b - 1)), np.int32), INT32)
        x = ctx.apply("broadcast_add", x, c, shape=x.shape)
        t = ctx.apply("cvm_right_shift", x, shape=x.shape, precision=low, shift_bit=b)
    high = total(ctx, [product(ctx, v, ms[0]) for v, ms in zip(vs, parts)])
    return shifted(ctx, ctx.apply("broadcast_add", high, t, shape=broadcast_shape(high, t)), p.precision,
                   p.shift - p.split)


def saturate(ctx, r: Tensor, out_zero: int, lo: int, hi: int, dtype: int, shape: tuple[int, ...]) -> Tensor:
    """clip(r + zero, lo, hi) as the quantized type."""
    if out_zero:
        zc = const(np.array(out_zero, np.int32), INT32)
        r = ctx.apply("broadcast_add", r, zc, shape=shape)
    if lo <= r.lo and r.hi <= hi:
        return replace(r, dtype=dtype)
    if lo >= hi:
        raise Refuse("the Clip leaves a single value on the output grid (min >= max): fold it")
    e = ctx.emit("clip", ctx.entry(r), a_min=lo, a_max=hi)
    return ctx.result(e, dtype, max(lo, r.lo), min(hi, r.hi), shape)


def table(ctx, x: Mapped, scale: np.ndarray, out_zero: int, dtype: int) -> Tensor:
    """QuantizeLinear(fn(x)) as cvm_lut over x's integers lo..hi: entry i = sat(round(fn((lo+i-z) * s) / s_out) +
    z_out), in float64, rounding half to even."""
    if scale.size != 1:
        raise Refuse(f"{x.what} with a per-channel output scale has no CVM form")
    lo, hi = INT_RANGES[dtype]

    def values(image: np.ndarray) -> np.ndarray:
        if np.isnan(image).any():
            raise Refuse(f"{x.what} is undefined on part of its input's range")
        return np.clip(np.rint(image / float(scale.reshape(()).item())) + out_zero, lo, hi).astype(np.int64)

    out = lookup(ctx, x, values, dtype)
    ctx.requants.append(Requant(ctx.base, (), None))
    return out


def lookup(ctx, x: Mapped, values, dtype: int) -> Tensor:
    """cvm_lut over x's integers lo..hi (at most 2^16), entry i = values(fn((lo + i - z) s)), fn's image computed
    in float64 (an infinite value, or one beyond float64, left to ``values``), as a tensor of type ``dtype``."""
    a = per_tensor(x.x, x.what)
    t = a.t
    n = t.hi - t.lo + 1
    if n > MAX_TABLE:
        raise Refuse(f"{x.what} over {n} integers: a table of at most 2^16 entries has a CVM form "
                     f"(quantize its input first)")
    q = np.arange(t.lo, t.hi + 1, dtype=np.int64)
    real = (q - int(a.zero.reshape(()))) * float(a.scale.reshape(()).item())
    with np.errstate(all="ignore"):
        entries = values(np.broadcast_to(np.asarray(x.fn(real), np.float64), q.shape))
    index = as_int32(t)
    if t.lo:
        c = const(np.array(t.lo, np.int32), INT32)
        index = ctx.result(ctx.op("broadcast_sub", index, c), INT32, 0, n - 1, t.shape)
    e = ctx.emit("cvm_lut", ctx.entry(index), ctx.entry(const(entries, INT32)), in_dim=n)
    return ctx.result(e, dtype, int(entries.min()), int(entries.max()), t.shape)


def softmax(ctx, x: Softmaxed, scale: np.ndarray, out_zero: int, dtype: int) -> Tensor:
    """QuantizeLinear(Softmax(x)) in integers (requant_plans.SoftmaxPlan): d = max - t along the axis (CVM max,
    broadcast_sub); T, H, L = cvm_lut(d) of their tables; S' = sum H + cvm_right_shift(sum L, b) (CVM sum);
    y = (2T + S') / (2S') (broadcast_mul, broadcast_add, broadcast_div: the floor, all >= 0); + z_out, clip.
    Only at the max (``top``: the written-out confidence 1 / sum e^(x - max)): T = T[0], a constant."""
    a = per_tensor(x.x, "Softmax")
    if scale.size != 1:
        raise Refuse("Softmax with a per-channel output scale has no CVM form")
    t, (outer, n, inner) = a.t, x.view
    span = t.hi - t.lo + 1
    if span > MAX_TABLE:
        raise Refuse(f"Softmax of {span} integers: its exp table holds at most 2^16 entries (quantize its input)")
    q = 1 / scale.reshape(()).item()
    try:
        p = softmax_plan(n, q)
    except NoPlan as e:
        raise Refuse(str(e)) from None
    f, b = p.frac_bits, p.split
    tables = softmax_tables(span, float(a.scale.reshape(()).item()), q, p)
    v, d, w, nan = below_max(ctx, t, x.view) + (None, None) if x.keep is None else masked_below_max(ctx, t, x)[:4]

    def lut(values: np.ndarray) -> Tensor:
        e = ctx.emit("cvm_lut", ctx.entry(d), ctx.entry(const(values, INT32)), in_dim=span)
        y = ctx.result(e, INT32, int(values.min()), int(values.max()), v.shape)
        return y if w is None else ctx.result(ctx.op("broadcast_mul", y, w), INT32, min(y.lo, 0), y.hi, v.shape)

    def total(y: Tensor) -> Tensor:
        return ctx.reshape(reduced(ctx, "sum", y, [1], y.lo * n, y.hi * n), (outer, 1, inner))

    def add(y: Tensor, z: Tensor) -> Tensor:
        return ctx.result(ctx.op("broadcast_add", y, z), INT32, y.lo + z.lo, y.hi + z.hi, broadcast_shape(y, z))

    def twice(y: Tensor) -> Tensor:
        return ctx.result(ctx.op("broadcast_mul", y, const(np.array(2, np.int32), INT32)), INT32, 2 * y.lo,
                          2 * y.hi, y.shape)

    s_ = total(lut(tables[1]))
    if b:
        low = total(lut(tables[2]))
        e = ctx.emit("cvm_right_shift", ctx.narrow(low, tight(low.peak)), precision=tight(n), shift_bit=b)
        s_ = add(s_, ctx.result(e, INT32, 0, (low.hi + (1 << (b - 1))) >> b, low.shape))
    if x.top is None:
        num = add(twice(lut(tables[0])), s_)
    else:  # at the max: T[0]
        num = add(const(np.array(2 * tables[0][0], np.int32), INT32), s_)
    y = ctx.result(ctx.op("broadcast_div", num, twice(s_)), INT32, 0, num.hi // (2 << (f - b)),
                   num.shape)  # S' >= 2^(F-b)
    ctx.requants.append(Requant(ctx.base, (), None, softmax=p))
    lo, hi = INT_RANGES[dtype]
    if nan is not None:  # onnxruntime's QuantizeLinear of NaN: the type's least integer
        y = sunk(ctx, y, nan, out_zero - lo)
    return saturate(ctx, ctx.reshape(y, x.shape), out_zero, lo, hi, dtype, x.shape)


def sunk(ctx, y: Tensor, rows: Tensor, below: int) -> Tensor:
    """y less its largest value plus ``below`` where ``rows`` (0 or 1, broadcasting to y) is 1: there y + below is at
    most 0, so y + z_out saturates at the type's least integer lo (below = z_out - lo)."""
    drop = y.hi + below
    n_ = ctx.result(ctx.op("broadcast_mul", rows, const(np.array(drop, np.int32), INT32)), INT32, 0, drop,
                    rows.shape)
    return ctx.result(ctx.op("broadcast_sub", y, n_), INT32, y.lo - drop, y.hi, broadcast_shape(y, n_))


def below_max(ctx, t: Tensor, view: tuple[int, int, int]) -> tuple[Tensor, Tensor]:
    """t as (outer, n, inner) and d = max - t along n (CVM max, broadcast_sub), in 0 .. t.hi - t.lo."""
    outer, n, inner = view
    v = ctx.reshape(as_int32(t), (outer, n, inner))
    top = ctx.reshape(reduced(ctx, "max", v, [1], t.lo, t.hi), (outer, 1, inner))
    return v, ctx.result(ctx.op("broadcast_sub", top, v), INT32, 0, t.hi - t.lo, v.shape)


class MaskedRows(NamedTuple):
    """``masked_below_max``'s tensors, (outer, n, inner) or (outer, 1, inner) per row."""

    v: Tensor  # t' = u (t - lo)
    d: Tensor  # max t' - t'
    w: Tensor  # 1 at the row's highest level, else 0
    nan: Tensor | None  # 1 where the row's highest level is -inf (with -inf among the levels)
    top: Tensor  # the rank of the row's highest level
    peak: Tensor  # max t' (max t - lo over the row's highest level, where no level there absorbs x)


def masked_below_max(ctx, t: Tensor, x: Softmaxed) -> MaskedRows:
    """The masked Softmax's t, d and weights w as (outer, n, inner) (docs/import.md, "Masked Softmax"): g the mask's
    level ranks broadcast to t (reshape, repeat), top their max along the axis, w = 1 where g = top (the row's
    highest level: the kept positions, or every position at a row's highest masked level), else 0; u = w times 0 at
    a level that absorbs x (such a row: d = 0, uniform), else 1; t' = u (t - lo) and d = max t' - t' along the axis,
    in 0 .. hi - lo, 0 at a position of weight 1 in every row. With -inf among the levels, the rows whose top is -inf
    (1, else 0: float32's NaN)."""
    outer, n, inner = x.view
    mask, ranks = x.keep, len(x.keep.levels) - 1
    tt = as_int32(t)
    g = ctx.reshape(ctx.broadcast_to(as_int32(mask.g), t.shape), (outer, n, inner))
    top = ctx.reshape(reduced(ctx, "max", g, [1], 0, ranks), (outer, 1, inner))
    below = ctx.result(ctx.op("broadcast_sub", top, g), INT32, 0, ranks, g.shape)
    if ranks > 1:
        below = ctx.result(ctx.emit("clip", ctx.entry(below), a_min=0, a_max=1), INT32, 0, 1, g.shape)
    w = ctx.result(ctx.op("broadcast_sub", const(np.array(1, np.int32), INT32), below), INT32, 0, 1, g.shape)
    u = w
    if x.absorbed == (True, False):  # two levels, the lower absorbing: u = w g = g
        u = g
    elif any(x.absorbed):
        on = np.array([0 if a else 1 for a in x.absorbed], np.int32)
        e = ctx.emit("cvm_lut", ctx.entry(g), ctx.entry(const(on, INT32)), in_dim=on.size)
        u = ctx.result(ctx.op("broadcast_mul", w, ctx.result(e, INT32, 0, 1, g.shape)), INT32, 0, 1, g.shape)
    a = ctx.result(ctx.op("broadcast_sub", tt, const(np.array(t.lo, np.int32), INT32)), INT32, 0, t.hi - t.lo,
                   t.shape)
    v = ctx.reshape(a, (outer, n, inner))
    v = ctx.result(ctx.op("broadcast_mul", v, u), INT32, 0, t.hi - t.lo, v.shape)
    peak = ctx.reshape(reduced(ctx, "max", v, [1], 0, t.hi - t.lo), (outer, 1, inner))
    nan = None
    if mask.levels[0] == -math.inf:  # top = 0: every position -inf
        e = ctx.emit("clip", ctx.entry(top), a_min=0, a_max=1)
        nan = ctx.result(ctx.op("broadcast_sub", const(np.array(1, np.int32), INT32),
                                ctx.result(e, INT32, 0, 1, top.shape)), INT32, 0, 1, top.shape)
    return MaskedRows(v, ctx.result(ctx.op("broadcast_sub", peak, v), INT32, 0, t.hi - t.lo, v.shape), w, nan, top,
                      peak)


def softmax_tables(span: int, s: float, q: Fraction, p: SoftmaxPlan) -> tuple[np.ndarray, ...]:
    """T, H, L over k = 0 .. span - 1 (float64 exp, rounded half up once)."""
    f, b = p.frac_bits, p.split
    e = np.exp(-np.arange(span, dtype=np.float64) * s)
    big = np.floor(np.ldexp(e, f) + 0.5).astype(np.int64)
    t = np.floor(np.ldexp(e * float(q), f - b) + 0.5).astype(np.int64)
    return t, big >> b, big - ((big >> b) << b)


def softmax_view(node, shape: tuple[int, ...], opset: int) -> tuple[int, int, int]:
    """(outer, n, inner) of a Softmax at ``opset`` semantics: one axis from 13 on (default -1), before it the
    input coerced to 2-D at the axis (default 1)."""
    rank = len(shape)
    [axis] = normal([node.attr_int("axis", -1 if opset >= 13 else 1)], rank, "Softmax axis")
    if opset >= 13:
        return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    return math.prod(shape[:axis]), math.prod(shape[axis:]), 1


class LogSoftmaxed(Deferred):
    """LogSoftmax of x over one axis (``view`` as Softmax's), made integers by the QuantizeLinear that follows
    (``quantized``: requant_plans.LogSoftmaxPlan)."""

    def __init__(self, x: Scaled, view: tuple[int, int, int]):
        self.x, self.view, self.shape, self.what = x, view, x.shape, "LogSoftmax"

    @property
    def ends(self) -> tuple[float, float]:
        """The least and largest value it takes: -(hi - lo) s - log(n) and 0."""
        t = self.x.t
        return -((t.hi - t.lo) * float(self.x.scale.reshape(()).item()) + math.log(self.view[1])), 0.0

    def quantized(self, ctx, scale: np.ndarray, out_zero: int, dtype: int) -> Tensor:
        """d = max - t along the axis; S = sum cvm_lut(d, E) (CVM sum); i1 = clip(cvm_right_shift(S, k1), C1),
        i2 = cvm_right_shift(S, k2); r = cvm_right_shift(cvm_lut(d, A) + cvm_lut(i1, G1) + cvm_lut(i2, G2), P)
        (broadcast_add); y = z_out - r, saturated."""
        if scale.size != 1:
            raise Refuse("LogSoftmax with a per-channel output scale has no CVM form")
        t, (outer, n, inner) = self.x.t, self.view
        span = t.hi - t.lo + 1
        if span > MAX_TABLE:
            raise Refuse(f"LogSoftmax of {span} integers: its tables hold at most 2^16 entries (quantize its input)")
        lo, hi = INT_RANGES[dtype]
        q = 1 / scale.reshape(()).item()
        try:
            p = logsoftmax_plan(n, q, out_zero - lo + 1)
        except NoPlan as e:
            raise Refuse(str(e)) from None
        e_, a_, g1, g2 = logsoftmax_tables(span, float(self.x.scale.reshape(()).item()), q, n, out_zero - lo + 1, p)
        v, d = below_max(ctx, t, self.view)

        def lut(index: Tensor, values: np.ndarray) -> Tensor:
            e = ctx.emit("cvm_lut", ctx.entry(index), ctx.entry(const(values, INT32)), in_dim=values.size)
            return ctx.result(e, INT32, int(values.min()), int(values.max()), index.shape)

        def shifted(y: Tensor, k: int, top: int) -> Tensor:  # round_half_up(y / 2^k), in [0, top]
            if not k:
                return y
            e = ctx.emit("cvm_right_shift", ctx.narrow(y, tight(y.hi)), precision=tight(top), shift_bit=k)
            return ctx.result(e, INT32, y.lo + (1 << k >> 1) >> k, top, y.shape)

        def add(y: Tensor, z: Tensor) -> Tensor:
            return ctx.result(ctx.op("broadcast_add", y, z), INT32, y.lo + z.lo, y.hi + z.hi, broadcast_shape(y, z))

        s_ = ctx.reshape(reduced(ctx, "sum", lut(d, e_), [1], 1 << p.frac_bits, n << p.frac_bits), (outer, 1, inner))
        i1 = shifted(s_, p.fine, (s_.hi + (1 << p.fine >> 1)) >> p.fine)
        if i1.hi > p.fine_top:
            e = ctx.emit("clip", ctx.entry(i1), a_min=0, a_max=p.fine_top)
            i1 = ctx.result(e, INT32, min(i1.lo, p.fine_top), p.fine_top, i1.shape)
        both = add(lut(d, a_), add(lut(i1, g1), lut(shifted(s_, p.coarse, g2.size - 1), g2)))
        r = shifted(both, p.table_bits, (both.hi + (1 << p.table_bits >> 1)) >> p.table_bits)
        y = ctx.result(ctx.op("broadcast_sub", const(np.array(out_zero, np.int32), INT32), r), INT32,
                       out_zero - r.hi, out_zero, r.shape)
        ctx.requants.append(Requant(ctx.base, (), None, logsoftmax=p))
        return saturate(ctx, ctx.reshape(y, self.shape), 0, lo, hi, dtype, self.shape)


def logsoftmax_tables(span: int, s: float, q: Fraction, n: int, below: int,
                      p: LogSoftmaxPlan) -> tuple[np.ndarray, ...]:
    """E over k = 0 .. span - 1 in float64, A over d = 0 .. span - 1 exactly, G1 over 0 .. C1 and G2 over
    0 .. round(n 2^F / 2^k2) from Gc in float64 (0 below 2^F, which S never is), each rounded half up once; A and
    Gc capped at 2^P W (the output saturates there)."""
    f, b = p.frac_bits, p.table_bits
    cap = below << b
    e = np.floor(np.ldexp(np.exp(-np.arange(span, dtype=np.float64) * s), f) + 0.5).astype(np.int64)
    num, den = (Fraction(s) * q * (1 << b)).as_integer_ratio()
    a = np.array([min((2 * i * num + den) // (2 * den), cap) for i in range(span)], np.int64)

    def gc(j: np.ndarray, k: int) -> np.ndarray:
        with np.errstate(divide="ignore"):
            logs = np.maximum(np.log(np.ldexp(j.astype(np.float64), k - f)), 0)
        return np.minimum(np.floor(np.ldexp(logs * float(q), b) + 0.5), cap).astype(np.int64)

    g1 = gc(np.arange(p.fine_top + 1), p.fine)
    j = np.arange(((n << f) + (1 << p.coarse >> 1) >> p.coarse) + 1)
    g2 = np.where(j >= p.first, gc(j, p.coarse) - g1[-1], 0)
    return e, a, g1, g2


@float_rule("LogSoftmax", since=1)
def logsoftmax_rule(ctx, node, x):
    """LogSoftmax: an integer form made by the QuantizeLinear that follows (``LogSoftmaxed``)."""
    x = per_tensor(scaled(x, "the LogSoftmax input"), "LogSoftmax")
    return LogSoftmaxed(x, softmax_view(node, x.shape, node.opset))


class Mask(Deferred):
    """An attention mask's term, added to the scores a Softmax reads, left float by quantize
    (``app.quantize.masked_softmaxes``): at each position one of ``levels`` (ascending, 0 the highest where a
    position can be kept), ``g`` the index into them (an integer tensor broadcasting to the scores). Only a Softmax's
    input's term has an integer form (``MaskedScores``)."""

    what = "an attention mask"

    def __init__(self, g: Tensor, levels: tuple[float, ...], shape: tuple[int, ...]):
        self.g, self.levels, self.shape = g, levels, shape

    def quantized(self, ctx, scale, out_zero, dtype):
        raise Refuse(f"{self.what} has an integer form only added to the scores a Softmax reads")


class MaskedScores(Mask):
    """x + an attention mask of a dequantized x: only a Softmax reads it (``softmax_rule``)."""

    what = "scores plus an attention mask"

    def __init__(self, x: Scaled, mask: Mask, shape: tuple[int, ...]):
        super().__init__(mask.g, mask.levels, shape)
        self.x = x


def masked(x: Scaled, mask: Mask, view: tuple[int, int, int]) -> Softmaxed:
    """Softmax(x + mask) as the softmax of x over the positions at each row's highest level (the kept ones, where
    it keeps any), 0 elsewhere (docs/import.md, "Masked Softmax"), X = max |x| <= 2^23: where the masked levels c
    are at most -(2 X + 106), and each next lower level b at most a - (2 X + 106) - 2^-23 (X + |b|) below the one
    a above it (or -inf), every lower level's exp is 0 in float32 (its argument is below -104) and below e^-104 in
    reals. A row whose highest level is c < 0: uniform where c absorbs x in float32 (X < g / 2, g the gap from |c|
    to the next float32 towards 0: x + c rounds to c), else the softmax of x (of x + c in reals); -inf: NaN."""
    s, z = Fraction(x.scale.reshape(()).item()), int(x.zero.reshape(()))
    big = max(abs(x.t.lo - z), abs(x.t.hi - z)) * s
    levels = mask.levels
    if levels[-1] == 0 and len(levels) > 1 and levels[-2] != -math.inf and \
            (big > 1 << 23 or Fraction(levels[-2]) > -(2 * big + 106)):
        raise Refuse(f"Softmax of scores plus an attention mask of values 0 and {levels[-2]:g}: the mask's masked "
                     f"values must be at most -(2 max|x| + 106) = {-(2 * float(big) + 106):g} (x's range on its "
                     "grid), so that their exp is 0 against every score")
    for b, a in zip(levels[:-1], levels[1:]):
        if a != 0 and b != -math.inf and (big > 1 << 23 or Fraction(b) > Fraction(a) - (2 * big + 106) -
                                           (big + abs(Fraction(b))) / (1 << 23)):
            raise Refuse(f"Softmax of scores plus an attention mask of values {a:g} and {b:g}: each masked value "
                         f"must lie at least 2 max|x| + 106 = {2 * float(big) + 106:g} (and 2^-23 of itself) below "
                         "the next higher one, so that its exp is 0 against every score")

    def absorbs(c: float) -> bool:
        if c == -math.inf:
            return True
        g = np.float32(-c)
        return c != 0 and big < (Fraction(float(g)) - Fraction(float(np.nextafter(g, np.float32(0))))) / 2

    return Softmaxed(x, view, "masked Softmax", keep=mask, absorbed=tuple(absorbs(c) for c in levels))


def scores_read(ctx, x):
    """What a Softmax or a ReduceLogSumExp reads of ``x``: the masked scores of a Where on scores
    (``masks.KeptScores``, whose ``masked_scores`` makes them), else ``x``."""
    return x.masked_scores(ctx) if isinstance(x, Deferred) and hasattr(x, "masked_scores") else x


@float_rule("Softmax", since=1)
def softmax_rule(ctx, node, x):
    """Softmax: an integer form made by the QuantizeLinear that follows (``softmax``); of scores plus an attention
    mask, the masked Softmax (``masked``), as of scores a Where masks (``masks.KeptScores``)."""
    x = scores_read(ctx, x)
    if isinstance(x, MaskedScores):
        xs = per_tensor(x.x, "Softmax")
        return masked(xs, x, softmax_view(node, xs.shape, node.opset))
    x = per_tensor(scaled(x, "the Softmax input"), "Softmax")
    return Softmaxed(x, softmax_view(node, x.shape, node.opset))
