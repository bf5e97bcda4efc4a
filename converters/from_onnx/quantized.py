"""The quantized front: models written by onnxruntime.quantization (QDQ and QOperator forms) as integer CVM ops.

Every float tensor between a DequantizeLinear and a QuantizeLinear is held exactly, as integers with a rational
scale (``Real``): ``Scaled`` (t - zero) * scale, with t a CVM integer tensor and scale, zero scalars or arrays
broadcast over it (per channel); ``Summed``, a sum of those (an Add of tensors of different scales); ``Mapped``,
a float function of a ``Scaled`` (Sigmoid, Tanh, ...). DequantizeLinear makes a ``Scaled`` of its integer input
and emits nothing. Float ops on ``Real`` values are integer ops: Conv/MatMul/Gemm accumulate in int32 at scale
s_x * s_w, MaxPool/Reshape/... run the integer rules on t, Relu is max(t, zero). QuantizeLinear requantizes a
``Real`` into its integer type (``requant.plan``: multiply, cvm_right_shift, saturation as clip); a ``Mapped``
becomes a cvm_lut table over its input's integers. A QOperator node is the same composition
(QLinearConv = QuantizeLinear(Conv(DequantizeLinear(x), DequantizeLinear(w)))). See docs/import.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Callable

import numpy as np
from onnx import TensorProto, helper

from cvm_onnx.core.constants import INT32_MAX

from .context import INT_RANGES, Tensor, bound, const, tight, type_name
from .emit import (aligned, attrs_2d, axes_of, broadcast_shape, concatenated, cropped, nearest, normal, onnx_pads,
                   reduced, select, spatial_2d)
from .registry import RULES, Refuse, float_rule, rule
from .requant import NoPlan, Plan, Run, SoftmaxPlan, plan, runs, softmax_plan

INT32 = TensorProto.INT32
QUANTIZED_TYPES = (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16)
MAX_TABLE = 1 << 16  # entries a cvm_lut table of a float function may have
MAX_PRODUCTS = 1 << 24  # elements of the products tensor of a MatMul of two computed tensors
MS = "com.microsoft"


# -- values -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Scaled:
    """The float tensor (t - zero) * scale; scale (Fractions > 0) and zero (ints) broadcast over t. ``clip``: a
    Clip to real bounds deferred to the QuantizeLinear that follows (monotone rounding commutes with it)."""

    t: Tensor
    scale: np.ndarray
    zero: np.ndarray
    clip: tuple[Fraction | None, Fraction | None] = (None, None)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.t.shape

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1 and self.zero.size == 1


@dataclass(frozen=True, eq=False)
class Summed:
    """sum_i terms_i: an Add of ``Scaled`` tensors of different scales, computed exactly by QuantizeLinear."""

    terms: tuple[Scaled, ...]
    shape: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Mapped:
    """fn(x) for a float elementwise ``fn`` (float64 numpy), made a table over x's integers by QuantizeLinear."""

    x: Scaled
    fn: Callable[[np.ndarray], np.ndarray]
    what: str

    @property
    def shape(self) -> tuple[int, ...]:
        return self.x.shape


@dataclass(frozen=True, eq=False)
class Softmaxed:
    """Softmax of x over one axis (``view``: x's shape as (outer, n, inner), the softmax along n), made integers by
    the QuantizeLinear that follows."""

    x: Scaled
    view: tuple[int, int, int]
    what: str = "Softmax"

    @property
    def shape(self) -> tuple[int, ...]:
        return self.x.shape


Real = (Scaled, Summed, Mapped, Softmaxed)


@dataclass(frozen=True)
class Requant:
    """One requantization, for the report: the ONNX node, the ratios M, the plan (or M == 1, or a table: none), or
    the runs of channels with a plan each (requant.runs) where one plan cannot hold every channel."""

    node: str
    ratios: tuple[float, ...]
    plan: Plan | None
    runs: tuple[Run, ...] = ()
    softmax: SoftmaxPlan | None = None
    settled: tuple[tuple[int, int], ...] = ()  # (row, its one output value): rows of a far zero point (``settle``)

    @property
    def plans(self) -> list[Plan]:
        return [self.plan] if self.plan is not None else [r.plan for r in self.runs]


def fractions(value: np.ndarray) -> np.ndarray:
    return np.array([Fraction(float(v)) for v in value.flat], dtype=object).reshape(value.shape)


def along(value: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """A per-axis 1-D array shaped to broadcast along ``axis`` of a rank-``rank`` tensor (a scalar as is)."""
    if value.size == 1:
        return value.reshape(())
    return value.reshape((-1,) + (1,) * (rank - 1 - axis))


def scale_of(t: Tensor | None, what: str) -> np.ndarray:
    """A constant scale as Fractions; refused when computed at run time, or zero, negative or not finite."""
    if t is None:
        raise Refuse(f"{what} is missing")
    if not t.is_const:
        raise Refuse(f"{what} is computed at run time: CVM needs constant scales")
    v = np.asarray(t.value, np.float64)
    bad = v[~(np.isfinite(v) & (v > 0))]
    if bad.size:
        raise Refuse(f"{what} {bad.reshape(-1)[0]} must be finite and > 0")
    return fractions(np.asarray(t.value))


def zero_of(t: Tensor | None, dtype: int, what: str) -> np.ndarray:
    """A constant zero point (0 if omitted) within the range of the quantized type ``dtype``."""
    if t is None:
        return np.zeros((), np.int64)
    if not t.is_const:
        raise Refuse(f"{what} is computed at run time: CVM needs constant zero points")
    v = np.asarray(t.value)
    if v.dtype.kind not in "iub":
        raise Refuse(f"{what} of type {type_name(t.dtype)} is not an integer")
    lo, hi = INT_RANGES.get(dtype, (0, 0))
    if v.size and (v.min() < lo or v.max() > hi):
        raise Refuse(f"{what} {int(v.min()) if v.min() < lo else int(v.max())} lies outside {type_name(dtype)} "
                     f"[{lo}, {hi}]")
    return v.astype(np.int64)


def axis_of(node, rank: int, size: int) -> int:
    axis = node.attr_int("axis", 1)
    if size > 1 and not -rank <= axis < rank:
        raise Refuse(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def per_tensor(x: Scaled, what: str) -> Scaled:
    if not x.per_tensor:
        raise Refuse(f"{what} needs a per-tensor scale and zero point")
    if x.clip != (None, None):
        raise Refuse(f"a Clip off the quantization grid must be followed by QuantizeLinear, not {what}")
    return x


def scaled(x, what: str, clipped_ok: bool = False) -> Scaled:
    """``x`` as a ``Scaled``, or why it has no integer form here."""
    if isinstance(x, Scaled):
        if x.clip != (None, None) and not clipped_ok:
            raise Refuse(f"a Clip off the quantization grid must be followed by QuantizeLinear, not {what}")
        return x
    if isinstance(x, Tensor):
        raise Refuse(f"{what} is a float tensor that no DequantizeLinear produced: it has no integer form")
    raise Refuse(f"{what} ({'a sum' if isinstance(x, Summed) else x.what}) must be quantized (QuantizeLinear) first")


def as_int32(t: Tensor) -> Tensor:
    return replace(t, dtype=INT32, name=None) if not t.is_const else const(t.value.astype(np.int64), INT32)


def minus_zero(ctx, x: Scaled) -> Tensor:
    """t - zero as an int32 tensor (a constant one folded)."""
    t, z = x.t, x.zero
    if not z.any():
        return as_int32(t)
    if t.is_const:
        return const(t.value.astype(np.int64) - z, INT32)
    zc = const(z.astype(np.int32), INT32)
    return ctx.apply("broadcast_sub", as_int32(t), zc, shape=broadcast_shape(t, zc))


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


@rule("DequantizeLinear", since=10)
@rule("DequantizeLinear", since=1, domain=MS)
def dequantize_rule(ctx, node, x, s, z=None):
    """x -> (x - zero) * scale, held exactly: nothing is emitted."""
    return dequantize(node, x, s, z)


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
    """round(x / scale) + zero, saturated: a requantization of x's integers (or a table for a float function)."""
    dtype = out_type(node, z)
    if node.attr_int("block_size", 0):
        raise Refuse("blocked quantization (block_size) has no CVM form")
    scale, zero = scale_of(s, "y_scale"), zero_of(z, dtype, "y_zero_point")
    if isinstance(x, Tensor) and not (x.is_const and x.value.dtype.kind == "f"):
        raise Refuse("QuantizeLinear of a float tensor that is not a dequantized value (nor the graph's input)")
    rank = len(x.shape)
    axis = axis_of(node, rank, scale.size)
    if isinstance(x, Tensor):
        return quantized_constant(x, s.value, along(zero, axis, rank), axis, dtype)
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
    zo = int(zero.reshape(()))
    lo, hi = INT_RANGES[dtype]
    if isinstance(x, Mapped):
        return table(ctx, x, scale, zo, dtype)
    if isinstance(x, Softmaxed):
        return softmax(ctx, x, scale, zo, dtype)
    offset, settled = None, ()
    if isinstance(x, Scaled):
        lo, hi = (max(lo, clipped(x.clip[0], scale, zo, lo, hi)) if x.clip[0] is not None else lo,
                  min(hi, clipped(x.clip[1], scale, zo, lo, hi)) if x.clip[1] is not None else hi)
        x, offset, settled = settle(ctx, x, scale, zo, lo, hi)
    terms = x.terms if isinstance(x, Summed) else (x,)
    vs = [minus_zero(ctx, term) for term in terms]
    ratios = [np.asarray(term.scale / scale, dtype=object) for term in terms]
    shape = broadcast_shape(*vs)

    def finish(r: Tensor) -> Tensor:  # the settled rows' values added, then z_out and the saturation
        if offset is not None:
            oc = const(offset.astype(np.int32), INT32)
            r = ctx.result(ctx.op("broadcast_add", r, oc), INT32, r.lo + min(int(offset.min()), 0),
                           r.hi + max(int(offset.max()), 0), broadcast_shape(r, oc))
        return saturate(ctx, r, zo, lo, hi, dtype, shape)

    if len(vs) == 1 and all(r == 1 for r in ratios[0].flat):  # the same scale: only the zero point moves
        ctx.requants.append(Requant(ctx.base, (1.0,), None, settled=settled))
        return finish(vs[0])
    tlo, thi = INT_RANGES[dtype]  # the type holds the zero point: the plan's clip needs low <= 0 <= high
    flat = tuple(float(r) for m in ratios for r in m.flat)
    try:
        p = plan([(v.lo, v.hi, r) for v, r in zip(vs, ratios)], tlo - zo, thi - zo)
    except NoPlan as e:
        axis = channel_axis(ratios[0], len(shape)) if len(vs) == 1 else None
        if axis is None or vs[0].shape[axis] != shape[axis]:
            raise Refuse(str(e)) from None
        try:
            parts = runs(vs[0].lo, vs[0].hi, ratios[0].reshape(-1), tlo - zo, thi - zo)
        except NoPlan as e2:
            raise Refuse(str(e2)) from None
        ctx.requants.append(Requant(ctx.base, flat, None, tuple(parts), settled=settled))
        return finish(apply_runs(ctx, vs[0], parts, axis, ratios[0].shape))
    ctx.requants.append(Requant(ctx.base, flat, p, settled=settled))
    return finish(apply(ctx, vs, p))


FAR = 1 << 30  # a zero point this far (a bias kept out of conv2d, ``accumulate``) has no CVM label


def settle(ctx, x: Scaled, scale: np.ndarray, zo: int, lo: int, hi: int) -> tuple[Scaled, np.ndarray | None, tuple]:
    """Rows of x whose zero point is FAR (a dead channel: tiny weight scale, huge bias) and whose QuantizeLinear
    gives one value K for every t in t's interval (round half to even of the exact values at its ends, saturated:
    rounding is monotone): t is multiplied by 0 there (zero point 0, the least other ratio), and K - z_out added
    after the requantization. (x, those offsets per row or None, ((row, K), ...)); another far row is refused."""
    far = np.abs(x.zero) >= FAR
    if not far.any():
        return x, None, ()
    full = np.broadcast_shapes(x.scale.shape, x.zero.shape)
    ratio = np.broadcast_to(np.asarray(x.scale / scale.reshape(()).item(), dtype=object), full)
    zero = np.broadcast_to(x.zero, full)
    far = np.broadcast_to(far, full)
    offset, settled = np.zeros(full, np.int64), []
    for i in zip(*np.nonzero(far)):
        z, m = int(zero[i]), ratio[i]
        ends = {min(max(round((v - z) * m) + zo, lo), hi) for v in (x.t.lo, x.t.hi)}
        if len(ends) > 1:
            raise Refuse(f"a bias of {-z} at the accumulator's scale (no CVM label holds it) on a channel whose "
                         "output varies: no CVM form")
        offset[i] = ends.pop() - zo
        settled.append((int(np.ravel_multi_index(i, full)), int(offset[i]) + zo))
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


def clipped(bound_: Fraction, scale: np.ndarray, zo: int, lo: int, hi: int) -> int:
    """QuantizeLinear of one real value (round half to even), saturated."""
    if scale.size != 1:
        raise Refuse("a Clip before a per-channel QuantizeLinear has no CVM form")
    q = bound_ / scale.reshape(()).item()
    return min(max(round(q) + zo, lo), hi)


def apply(ctx, vs: list[Tensor], p: Plan) -> Tensor:
    """The plan's integer ops on v_i: [clip, pre-shift,] multiply(s), sum, cvm_right_shift (requant.py)."""
    products = []
    for v, m in zip(vs, p.multipliers):
        if p.clip is not None:
            a, b = p.clip
            v = ctx.apply("clip", v, shape=v.shape, a_min=a, a_max=b)
        if p.pre_shift:
            v = ctx.apply("cvm_right_shift", v, shape=v.shape, precision=p.pre_precision, shift_bit=p.pre_shift)
        e = ctx.narrow(v, tight(v.peak))
        mc = const(m.astype(np.int32), INT32)
        products.append(ctx.result(ctx.emit("broadcast_mul", e, ctx.entry(mc)), INT32,
                                   min(v.lo * int(m.max()), 0), max(v.hi * int(m.max()), 0),
                                   broadcast_shape(v, mc)))
    total = products[0]
    for t in products[1:]:
        total = ctx.apply("broadcast_add", total, t, shape=broadcast_shape(total, t))
    b = bound(p.precision)
    e = ctx.emit("cvm_right_shift", total.entry, precision=p.precision, shift_bit=p.shift)
    return ctx.result(e, INT32, -b, b, total.shape)


def saturate(ctx, r: Tensor, zo: int, lo: int, hi: int, dtype: int, shape: tuple[int, ...]) -> Tensor:
    """clip(r + zero, lo, hi) as the quantized type."""
    if zo:
        zc = const(np.array(zo, np.int32), INT32)
        r = ctx.apply("broadcast_add", r, zc, shape=shape)
    if lo <= r.lo and r.hi <= hi:
        return replace(r, dtype=dtype)
    if lo >= hi:
        raise Refuse(f"the Clip leaves the single value {lo}: fold it")
    e = ctx.emit("clip", ctx.entry(r), a_min=lo, a_max=hi)
    return ctx.result(e, dtype, max(lo, r.lo), min(hi, r.hi), shape)


def table(ctx, x: Mapped, scale: np.ndarray, zo: int, dtype: int) -> Tensor:
    """QuantizeLinear(fn(x)) as cvm_lut over x's integers lo..hi: entry i = sat(round(fn((lo+i-z) * s) / s_out) +
    z_out), in float64, rounding half to even."""
    a = per_tensor(x.x, x.what)
    t = a.t
    n = t.hi - t.lo + 1
    if n > MAX_TABLE:
        raise Refuse(f"{x.what} over {n} integers: a table of at most 2^16 entries has a CVM form "
                     f"(quantize its input first)")
    if scale.size != 1:
        raise Refuse(f"{x.what} with a per-channel output scale has no CVM form")
    q = np.arange(t.lo, t.hi + 1, dtype=np.int64)
    real = (q - int(a.zero.reshape(()))) * float(a.scale.reshape(()).item())
    lo, hi = INT_RANGES[dtype]
    with np.errstate(all="ignore"):
        image = x.fn(real)
    if np.isnan(image).any():
        raise Refuse(f"{x.what} is undefined on part of its input's range")
    values = np.clip(np.rint(image / float(scale.reshape(()).item())) + zo, lo, hi).astype(np.int64)
    index = as_int32(t)
    if t.lo:
        c = const(np.array(t.lo, np.int32), INT32)
        index = ctx.result(ctx.op("broadcast_sub", index, c), INT32, 0, n - 1, t.shape)
    e = ctx.emit("cvm_lut", ctx.entry(index), ctx.entry(const(values, INT32)), in_dim=n)
    ctx.requants.append(Requant(ctx.base, (), None))
    return ctx.result(e, dtype, int(values.min()), int(values.max()), t.shape)


def softmax(ctx, x: Softmaxed, scale: np.ndarray, zo: int, dtype: int) -> Tensor:
    """QuantizeLinear(Softmax(x)) in integers (requant.SoftmaxPlan): d = max - t along the axis (CVM max,
    broadcast_sub); T, H, L = cvm_lut(d) of their tables; S' = sum H + cvm_right_shift(sum L, b) (CVM sum);
    y = (2T + S') / (2S') (broadcast_mul, broadcast_add, broadcast_div: the floor, all >= 0); + z_out, clip."""
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
    v = ctx.reshape(as_int32(t), (outer, n, inner))
    top = ctx.reshape(reduced(ctx, "max", v, [1], t.lo, t.hi), (outer, 1, inner))
    d = ctx.result(ctx.op("broadcast_sub", top, v), INT32, 0, span - 1, v.shape)

    def lut(values: np.ndarray) -> Tensor:
        e = ctx.emit("cvm_lut", ctx.entry(d), ctx.entry(const(values, INT32)), in_dim=span)
        return ctx.result(e, INT32, int(values.min()), int(values.max()), v.shape)

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
    num = add(twice(lut(tables[0])), s_)
    y = ctx.result(ctx.op("broadcast_div", num, twice(s_)), INT32, 0, num.hi // (2 << (f - b)), v.shape)  # S' >= 2^F-b
    ctx.requants.append(Requant(ctx.base, (), None, softmax=p))
    lo, hi = INT_RANGES[dtype]
    return saturate(ctx, ctx.reshape(y, x.shape), zo, lo, hi, dtype, x.shape)


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
    axis = node.attr_int("axis", -1 if opset >= 13 else 1)
    if not -rank <= axis < rank:
        raise Refuse(f"Softmax axis {axis} is out of range for rank {rank}")
    axis %= rank
    if opset >= 13:
        return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    return math.prod(shape[:axis]), math.prod(shape[axis:]), 1


@float_rule("Softmax", since=1)
def softmax_rule(ctx, node, x):
    """Softmax: an integer form made by the QuantizeLinear that follows (``softmax``)."""
    x = per_tensor(scaled(x, "the Softmax input"), "Softmax")
    return Softmaxed(x, softmax_view(node, x.shape, node.opset))


# -- products: Conv, MatMul, Gemm, AveragePool ------------------------------------------------------------------
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
    if np.abs(w).max(initial=0) <= 127:
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
    full = np.broadcast_to(w.scale, v.shape)
    if transpose:
        v, full = v.T, full.T
    rows = full.reshape(len(v), -1)
    if not (rows == rows[:, :1]).all():
        raise Refuse(f"{what} is quantized along an axis other than its output channels")
    return v, rows[:, 0].copy()


def accumulate(ctx, x: Scaled, w: np.ndarray, sw: np.ndarray, bias: Scaled | None, op: str, groups: int = 1,
               valid: np.ndarray | None = None, window: Callable[[Tensor], Tensor] | None = None,
               **attrs) -> tuple[Tensor, np.ndarray, np.ndarray]:
    """sum (x - z) * w (+ bias) in int32 by conv2d or dense: (the accumulator, its scale s_x * s_w per row, the
    zero point per row: minus the bias of a row that no conv2d label holds, |bias| >= 2^30, kept out of it: a
    dead channel's, whose weight scale is tiny and bias huge; the QuantizeLinear settles such rows, ``settle``).
    x's 8-bit parts (x - c) times w's parts, concatenated along the reduced axis; then
    sum (x - z) w = sum (x - c) w + (c - z) V, V the sum of the weights a window reads inside the input: per
    output channel (conv2d's int32 bias) where it is the same at every position, else a (C, H, W) param added
    after ``window`` (the strided_slice picking ONNX's outputs among conv2d's, which pads with zeros)."""
    x = per_tensor(x, f"the input of {op}")
    sx, z = x.scale.reshape(()).item(), int(x.zero.reshape(()))
    xparts, c = halves(ctx, as_int32(x.t))
    wparts = weight_parts(w, "the weight")
    rows = w.reshape(len(w), -1)
    b = np.zeros(len(w), np.int64)
    if bias is not None:
        b = bias_values(bias, sx * sw, len(w))
    uniform = valid is None or bool((valid == valid[:, :1, :1]).all())
    total = b + (c - z) * (rows.sum(axis=1) if valid is None else valid[:, 0, 0] if uniform else 0)
    excess = np.where(np.abs(total) >= 1 << 30, total, 0)
    b, total = b - excess, total - excess
    ins = grouped_concat(ctx, [p for p in xparts for _ in wparts], groups)
    weights = np.concatenate([p for _ in xparts for p in wparts], axis=1)
    xlo, xhi = min(x.t.lo - z, 0), max(x.t.hi - z, 0)
    pos, neg = np.clip(rows, 0, None).sum(axis=1), np.clip(rows, None, 0).sum(axis=1)
    lo, hi = int((pos * xlo + neg * xhi + b).min()), int((pos * xhi + neg * xlo + b).max())
    args = [ctx.narrow(ins, 8, f"the input of {op}"), ctx.entry(const(weights.astype(np.int8), TensorProto.INT8))]
    if np.abs(total).max() > INT32_MAX:
        raise Refuse("the bias with the zero point's correction passes 32 bits")
    if total.any():
        args.append(ctx.entry(const(total.astype(np.int32), INT32)))
    if op == "conv2d":
        e = ctx.emit(op, *args, use_bias=bool(total.any()), groups=groups, **attrs)
    else:
        e = ctx.emit(op, *args, use_bias=bool(total.any()), units=len(w))
    reach = int((np.abs(rows).sum(axis=1) * max(abs(x.t.lo - c), abs(x.t.hi - c)) + np.abs(total)).max())
    y = ctx.result(e, INT32, -reach, reach)  # every conv2d output, those window drops included
    if window is not None:
        y = window(y)
    if not uniform:
        corr = const(((c - z) * valid).astype(np.int32), INT32)
        y = ctx.result(ctx.op("broadcast_add", y, corr), INT32, lo, hi, y.shape)
    return ctx.result(y.entry, INT32, lo, hi, y.shape), np.asarray(sx * sw, dtype=object), -excess


def window_sums(w: np.ndarray, size: tuple[int, int], strides, dilations, begin, outs) -> np.ndarray:
    """V (O, H', W'): for each output of a padded convolution, the sum of the weights whose input lies inside the
    image (the padding reads zeros)."""
    masks = [np.array([[0 <= o * s - b + k * d < n for k in range(kk)] for o in range(out)], np.int64)
             for n, kk, s, d, b, out in zip(size, w.shape[2:], strides, dilations, begin, outs)]
    return np.einsum("okl,ik,jl->oij", w.sum(axis=1), *masks)


def bias_values(bias: Scaled, acc_scale: np.ndarray, n: int) -> np.ndarray:
    """The bias as integers at the accumulator's scale s_x * s_w (as onnxruntime's QLinearConv adds it): its own
    scale must be that product to float32 rounding (a denormal float32 holds it to 2^-149 only)."""
    if not bias.t.is_const:
        raise Refuse("the bias is computed at run time: CVM needs a constant bias")
    v = np.broadcast_to(bias.t.value.astype(np.int64) - bias.zero, (n,)) if bias.t.size in (1, n) else None
    s = np.broadcast_to(bias.scale.reshape(-1) if bias.scale.size > 1 else bias.scale.reshape(()), (n,))
    if v is None:
        raise Refuse(f"a bias of shape {bias.t.shape} for {n} outputs")
    for have, want in zip(s, acc_scale):  # float32 rounding of the product: 2^-22 relative, or a denormal's step
        if abs(have - want) > max(want / (1 << 22), Fraction(1, 1 << 149)):
            raise Refuse(f"the bias scale {float(have):.9g} is not input scale x weight scale ({float(want):.9g})")
    return v.copy()


def dense(ctx, x: Scaled, w: np.ndarray, sw: np.ndarray, bias: Scaled | None) -> Scaled:
    """x (..., K) times w (N, K)^T: rows flattened, dense, reshaped back; scale s_x * s_w along the last axis."""
    k = x.shape[-1]
    rows = Scaled(ctx.reshape(x.t, (math.prod(x.shape[:-1]), k)), x.scale.reshape(()), x.zero.reshape(()))
    acc, scale, zero = accumulate(ctx, rows, w, sw, bias, "dense")
    return Scaled(ctx.reshape(acc, x.shape[:-1] + (len(w),)), scale, zero if zero.any() else np.zeros((), np.int64))


def padding(ctx, w: np.ndarray, size: tuple[int, int], strides, dilations, begin, end) -> dict:
    """conv2d's symmetric padding for ONNX pads (begin, end): the aligned padding, the strided_slice of ONNX's
    outputs (aligned, select) and the window sums V where some window reads padding."""
    plans = [aligned(n, d * (k - 1) + 1, s, b, e)
             for n, k, s, d, b, e in zip(size, w.shape[2:], strides, dilations, begin, end)]
    outs = [p[2] for p in plans]
    return {"padding": tuple(p[0] for p in plans),
            "window": lambda y: select(ctx, y, [p[1] for p in plans], [1, 1], outs),
            "valid": window_sums(w, size, strides, dilations, begin, outs) if any(begin + end) else None}


def conv(ctx, node, x: Scaled, w: Scaled, bias: Scaled | None) -> Scaled:
    """Conv: conv2d (groups, strides, dilations; its zero padding aligned as nn's Conv rule does, the zero point's
    share of the padding corrected by the window sums V)."""
    wv, sw = weight(w, "the Conv weight")
    x = per_tensor(x, "Conv")
    one_d = len(x.shape) == 3
    t = spatial_2d(ctx, x.t, "Conv")
    wv = wv.reshape(wv.shape[:2] + (1,) + wv.shape[2:]) if one_d else wv
    if wv.ndim != 4:
        raise Refuse(f"a {wv.ndim - 2}-D convolution has no CVM form")
    strides = attrs_2d(node, "strides", 1, one_d, 1)
    dilations = attrs_2d(node, "dilations", 1, one_d, 1)
    begin, end = onnx_pads(node, x.shape[2:], list(w.shape[2:]), strides[-len(x.shape) + 2:],
                              dilations[-len(x.shape) + 2:])
    if one_d:
        begin, end = [0] + begin, [0] + end
    t, begin, end = cropped(ctx, t, begin, end)
    groups = node.attr_int("group", 1, lo=1)
    acc, scale, zero = accumulate(ctx, replace(x, t=t), wv, sw, bias, "conv2d", groups,
                            **padding(ctx, wv, t.shape[2:], strides, dilations, begin, end),
                            channels=len(wv), kernel_size=tuple(wv.shape[2:]), strides=tuple(strides),
                            dilation=tuple(dilations))
    if one_d:
        acc = ctx.reshape(acc, (acc.shape[0], acc.shape[1], acc.shape[3]))
    shape = (-1, 1, 1) if not one_d else (-1, 1)
    return Scaled(acc, scale.reshape(shape), zero.reshape(shape) if zero.any() else np.zeros((), np.int64))


@float_rule("Conv", since=1)
def conv_rule(ctx, node, x, w, b=None):
    return conv(ctx, node, scaled(x, "the Conv input"), scaled(w, "the Conv weight"),
                None if b is None else scaled(b, "the Conv bias"))


def conv_transpose(ctx, node, x: Scaled, w: Scaled, bias: Scaled | None) -> Scaled:
    """ConvTranspose (2-D): the convolution of x with zeros inserted between its values (s - 1 per stride s:
    `upsampling` or `repeat` of x - z, times a 0/1 mask), padded d (k - 1) - pads (+ output_padding at the end),
    by the kernel flipped and its in/out channels swapped per group, stride 1: the Conv rule's conv2d and window
    sums on that, exactly."""
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise Refuse("only a 2-D ConvTranspose has a CVM form here")
    if node.has("output_shape") or node.attr_str("auto_pad", "NOTSET") != "NOTSET":
        raise Refuse("ConvTranspose with output_shape or auto_pad has no CVM form here (give pads)")
    x = per_tensor(x, "ConvTranspose")
    groups = node.attr_int("group", 1, lo=1)
    if not w.t.is_const:
        raise Refuse("the ConvTranspose weight is computed at run time: CVM's conv2d needs a constant weight")
    cin, per, kh, kw = w.shape
    if cin != x.shape[1] or cin % groups:
        raise Refuse(f"a ConvTranspose weight of shape {w.shape} for {x.shape[1]} input channels in {groups} groups")
    strides = node.attr_ints("strides", [1, 1], lo=1, size=2)
    dilations = node.attr_ints("dilations", [1, 1], lo=1, size=2)
    extra = node.attr_ints("output_padding", [0, 0], lo=0, size=2)
    pads = node.attr_ints("pads", [0, 0, 0, 0], lo=0, size=4)
    if any(o >= s for o, s in zip(extra, strides)):
        raise Refuse(f"ConvTranspose output_padding {extra} must be below the strides {strides}")
    outs = [(n - 1) * s - p - q + d * (k - 1) + 1 + o for n, s, p, q, d, k, o in
            zip(x.shape[2:], strides, pads[:2], pads[2:], dilations, (kh, kw), extra)]
    if min(outs) < 1:
        raise Refuse(f"the ConvTranspose output {outs} is empty: CVM has no empty tensors")

    def flipped(a: np.ndarray) -> np.ndarray:  # (C_in, C_out/g, kh, kw) -> (C_out, C_in/g, kh, kw), flipped
        a = a.reshape(groups, cin // groups, per, kh, kw).transpose(0, 2, 1, 3, 4)
        return a.reshape(groups * per, cin // groups, kh, kw)[:, :, ::-1, ::-1]

    full = np.broadcast_to(w.scale, w.shape)
    wv = Scaled(const(np.ascontiguousarray(flipped(w.t.value.astype(np.int64) - w.zero)), INT32),
                np.ascontiguousarray(flipped(full)), np.zeros((), np.int64))
    wv, sw = weight(wv, "the ConvTranspose weight")
    v = minus_zero(ctx, x)
    n, c, hgt, wid = x.shape
    up = nearest(ctx, v, [1, 1, *strides])
    mask = np.zeros((1, 1, hgt * strides[0], wid * strides[1]), np.int32)
    mask[..., ::strides[0], ::strides[1]] = 1
    up = ctx.result(ctx.op("broadcast_mul", up, const(mask, INT32)), INT32, min(v.lo, 0), max(v.hi, 0), up.shape)
    begin = [d * (k - 1) - p for d, k, p in zip(dilations, (kh, kw), pads[:2])]
    end = [d * (k - 1) - p + o - (s - 1) for d, k, p, o, s in zip(dilations, (kh, kw), pads[2:], extra, strides)]
    up, begin, end = cropped(ctx, up, begin, end)
    acc, scale, zero = accumulate(ctx, Scaled(up, x.scale, np.zeros((), np.int64)), wv, sw, bias, "conv2d", groups,
                            **padding(ctx, wv, up.shape[2:], [1, 1], dilations, begin, end), channels=len(wv),
                            kernel_size=(kh, kw), strides=(1, 1), dilation=tuple(dilations))
    return Scaled(acc, scale.reshape(-1, 1, 1), zero.reshape(-1, 1, 1) if zero.any() else np.zeros((), np.int64))


@float_rule("ConvTranspose", since=1)
def conv_transpose_rule(ctx, node, x, w, b=None):
    return conv_transpose(ctx, node, scaled(x, "the ConvTranspose input"), scaled(w, "the ConvTranspose weight"),
                          None if b is None else scaled(b, "the ConvTranspose bias"))


@float_rule("MatMul", since=1)
def matmul_rule(ctx, node, a, b):
    a, b = scaled(a, "the MatMul input"), scaled(b, "the MatMul weight")
    if not b.t.is_const:
        return variable_matmul(ctx, a, b)
    if len(b.shape) != 2:
        raise Refuse(f"a MatMul weight of shape {b.shape}: dense takes one weight matrix")
    w, sw = weight(b, "the MatMul weight", transpose=True)
    return dense(ctx, a, w, sw, None)


def variable_matmul(ctx, a: Scaled, b: Scaled) -> Scaled:
    """a @ b of two computed tensors (attention's Q K^T and weights x V), per tensor, at scale s_a s_b: the
    products (a - za)[..., M, K, 1] (b - zb)[..., 1, K, N] (broadcast_mul), summed over K, exactly in int32."""
    a, b = per_tensor(a, "MatMul"), per_tensor(b, "MatMul")
    if len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != b.shape[-2]:
        raise Refuse(f"MatMul of shapes {a.shape} and {b.shape}: CVM's form takes matrices (rank >= 2) that chain")
    va, vb = minus_zero(ctx, a), minus_zero(ctx, b)
    ea, eb = ctx.reshape(va, a.shape + (1,)), ctx.reshape(vb, b.shape[:-2] + (1,) + b.shape[-2:])
    corners = [x * y for x in (va.lo, va.hi) for y in (vb.lo, vb.hi)]
    shape = broadcast_shape(ea, eb)
    if math.prod(shape) > MAX_PRODUCTS:
        raise Refuse(f"MatMul of shapes {a.shape} and {b.shape} would compute {math.prod(shape)} products at once "
                     f"(at most 2^24)")
    prod = ctx.result(ctx.op("broadcast_mul", ea, eb), INT32, min(corners), max(corners), shape)
    k = a.shape[-1]
    total = reduced(ctx, "sum", prod, [len(shape) - 2], k * prod.lo, k * prod.hi)
    total = ctx.reshape(total, shape[:-2] + shape[-1:])  # reduced drops the axes of size 1
    return Scaled(total, np.asarray(a.scale.reshape(()).item() * b.scale.reshape(()).item(), dtype=object),
                  np.zeros((), np.int64))


@float_rule("Gemm", since=7)
def gemm_rule(ctx, node, a, b, c=None):
    if node.attr_float("alpha", 1.0) != 1.0 or node.attr_float("beta", 1.0) != 1.0 or node.attr_int("transA", 0):
        raise Refuse("a quantized Gemm with alpha, beta != 1 or transA has no CVM form here")
    a, b = scaled(a, "the Gemm input A"), scaled(b, "the Gemm weight B")
    if len(a.shape) != 2:
        raise Refuse(f"Gemm input of shape {a.shape}")
    w, sw = weight(b, "the Gemm weight", transpose=not node.attr_int("transB", 0))
    return dense(ctx, a, w, sw, None if c is None else scaled(c, "the Gemm bias C"))


def average(ctx, node, x: Scaled) -> Scaled:
    """AveragePool: a depthwise conv2d with weights 1 over the zero-point-padded input, at scale s_x / count
    (count per output position when padding is not counted)."""
    x = per_tensor(x, "AveragePool")
    if node.attr_int("ceil_mode", 0) or any(d != 1 for d in node.attr_ints("dilations", [])):
        raise Refuse("AveragePool with ceil_mode or dilations has no CVM form here")
    if len(x.shape) != 4:
        raise Refuse(f"AveragePool of a {len(x.shape) - 2}-D image: only 2-D here")
    kernel = node.attr_ints("kernel_shape", lo=1)
    strides = node.attr_ints("strides", [1, 1], lo=1)
    begin, end = onnx_pads(node, x.shape[2:], kernel, strides, [1, 1])
    c = x.shape[1]
    t, begin, end = cropped(ctx, x.t, begin, end)
    ones = np.ones((c, 1) + tuple(kernel), np.int64)
    pad = padding(ctx, ones, t.shape[2:], strides, [1, 1], begin, end)
    acc, _, _ = accumulate(ctx, replace(x, t=t), ones, np.ones(c, object), None, "conv2d", c, **pad, channels=c,
                        kernel_size=tuple(kernel), strides=tuple(strides), dilation=(1, 1))
    sx = x.scale.reshape(()).item()
    if node.attr_int("count_include_pad", 0) or pad["valid"] is None:
        return Scaled(acc, np.asarray(sx / math.prod(kernel), dtype=object), np.zeros((), np.int64))
    count = pad["valid"][0]  # the window sums of weights 1: the input positions each window reads
    return Scaled(acc, np.array([sx / int(n) for n in count.flat], dtype=object).reshape(count.shape),
                  np.zeros((), np.int64))


@float_rule("AveragePool", since=7)
def average_rule(ctx, node, x):
    return average(ctx, node, scaled(x, "the AveragePool input"))


def global_average(ctx, x: Scaled) -> Scaled:
    """GlobalAveragePool: sum of x - z over the image, at scale s_x / (H * W)."""
    x = per_tensor(x, "GlobalAveragePool")
    v = minus_zero(ctx, x)
    axes = tuple(range(2, len(x.shape)))
    n = math.prod(x.shape[2:])
    e = ctx.op("sum", v, axis=axes, keepdims=False)
    s = ctx.result(e, INT32, min(v.lo * n, 0), max(v.hi * n, 0), x.shape[:2])
    return Scaled(ctx.reshape(s, x.shape[:2] + (1,) * len(axes)), np.asarray(x.scale.reshape(()).item() / n,
                                                                          dtype=object), np.zeros((), np.int64))


@float_rule("GlobalAveragePool", since=1)
def global_average_rule(ctx, node, x):
    return global_average(ctx, scaled(x, "the GlobalAveragePool input"))


@float_rule("ReduceMean", since=1)
def reduce_mean_rule(ctx, node, x, axes_t=None):
    """ReduceMean: the sum of x - z over the axes (CVM's sum, as ReduceSum) at scale s_x / n, n the count of
    values reduced: exact, requantized by the QuantizeLinear that follows."""
    x = per_tensor(scaled(x, "the ReduceMean input"), "ReduceMean")
    rank = len(x.shape)
    axes = axes_of(node, axes_t, 18)
    if not axes and node.attr_int("noop_with_empty_axes", 0):
        return x
    axes = sorted(set(normal(axes or list(range(rank)), rank)))
    keep = node.attr_int("keepdims", 1)
    n = math.prod(x.shape[i] for i in axes)
    v = minus_zero(ctx, x)
    y = reduced(ctx, "sum", v, axes, min(v.lo * n, 0), max(v.hi * n, 0))
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else y.shape
    return Scaled(ctx.reshape(y, shape), np.asarray(x.scale.reshape(()).item() / n, dtype=object),
                  np.zeros((), np.int64))


# -- elementwise ------------------------------------------------------------------------------------------------
@float_rule("Add", since=7)
def add_rule(ctx, node, a, b):
    """a + b: exact as a sum of scaled integers, requantized by the QuantizeLinear that follows."""
    terms = []
    for x in (a, b):
        terms += list(x.terms) if isinstance(x, Summed) else [scaled(x, "an Add operand")]
    return Summed(tuple(terms), broadcast_shape(*(t.t for t in terms)))


@float_rule("BatchNormalization", since=9)
def batch_norm_rule(ctx, node, x, gamma, beta, mean, var):
    """Inference BatchNormalization of a dequantized x (one quantize_static leaves after a ConvTranspose):
    a (x - mean) + beta = a x + c per channel, a = gamma / sqrt(var + epsilon) and c = beta - a mean in float64
    (those rationals are the ones used: the real square root differs by 2^-52 relative). The sum of x's term,
    t times sign(a) (broadcast_mul) at scale s |a|, and a constant term sign(c) at scale |c|, requantized by the
    QuantizeLinear that follows."""
    x = per_tensor(scaled(x, "the BatchNormalization input"), "BatchNormalization")
    if node.attr_int("training_mode", 0) or len(x.shape) < 2:
        raise Refuse("BatchNormalization in training mode or of a tensor without channels has no CVM form")
    params = []
    for t, what in ((gamma, "scale"), (beta, "B"), (mean, "input_mean"), (var, "input_var")):
        if isinstance(t, Scaled) and t.t.is_const:  # a quantized constant (quantize_static quantizes scale and B)
            value = np.array([float(f) for f in np.broadcast_to((t.t.value.astype(np.int64) - t.zero) * t.scale,
                                                               t.shape).flat])
        elif is_float_const(t):
            value = np.asarray(t.value, np.float64).reshape(-1)
        else:
            value = None
        if value is None or value.size != x.shape[1]:
            raise Refuse(f"BatchNormalization {what} must be a constant of one value per channel")
        params.append(value)
    g, b, mu, v = params
    with np.errstate(all="ignore"):
        a = g / np.sqrt(v + np.float64(np.float32(node.attr_float("epsilon", 1e-5))))
        c = b - a * mu
    if not (np.isfinite(a).all() and np.isfinite(c).all()):
        raise Refuse("BatchNormalization with a variance of -epsilon or less, or non-finite parameters")
    shape = (-1,) + (1,) * (len(x.shape) - 2)
    sign = np.sign(a).astype(np.int64).reshape(shape)
    t = as_int32(x.t)
    if (sign != 1).any():
        sc = const(sign.astype(np.int32), INT32)
        peak = max(-t.lo, t.hi)
        t = ctx.result(ctx.op("broadcast_mul", t, sc), INT32, -peak if (sign < 0).any() else min(t.lo, 0), peak,
                       broadcast_shape(t, sc))
    s, z = x.scale.reshape(()).item(), int(x.zero.reshape(()))
    magnitude = [Fraction(float(abs(q))) if q else Fraction(1) for q in a]
    terms = [Scaled(t, np.array([s * m for m in magnitude], dtype=object).reshape(shape), sign * z)]
    if c.any():
        terms.append(Scaled(const(np.sign(c).astype(np.int64).reshape(shape), INT32),
                            np.array([Fraction(float(abs(q))) if q else Fraction(1) for q in c],
                                     dtype=object).reshape(shape), np.zeros((), np.int64)))
    return Summed(tuple(terms), x.shape)


def negated(ctx, x: Scaled) -> Scaled:
    """-x = (-t - (-z)) s: CVM's negative of t, the zero point negated."""
    if x.t.is_const:
        return Scaled(const(-x.t.value.astype(np.int64), INT32), x.scale, -x.zero)
    t = as_int32(x.t)
    return Scaled(ctx.result(ctx.op("negative", t), INT32, -t.hi, -t.lo, t.shape), x.scale, -x.zero)


@float_rule("Sub", since=7)
def sub_rule(ctx, node, a, b):
    """a - b: a + (-b), -b = (-t + z) s exactly (``negated``), requantized by the QuantizeLinear that follows."""
    terms = list(a.terms) if isinstance(a, Summed) else [scaled(a, "a Sub operand")]
    terms += [negated(ctx, t) for t in (b.terms if isinstance(b, Summed) else [scaled(b, "a Sub operand")])]
    return Summed(tuple(terms), broadcast_shape(*(t.t for t in terms)))


def multiply(ctx, a: Scaled, b: Scaled) -> Scaled:
    """(a - za)(b - zb) in int32, at scale s_a * s_b."""
    va, vb = minus_zero(ctx, a), minus_zero(ctx, b)
    corners = [x * y for x in (va.lo, va.hi) for y in (vb.lo, vb.hi)]
    e = ctx.op("broadcast_mul", va, vb)
    scale = np.asarray(a.scale * b.scale, dtype=object).reshape(np.broadcast_shapes(a.scale.shape, b.scale.shape))
    return Scaled(ctx.result(e, INT32, min(corners), max(corners), broadcast_shape(va, vb)), scale,
                  np.zeros((), np.int64))


def constant_factor(t, what: str) -> Fraction:
    """A float constant scalar > 0 (Mul or Div by it scales a value exactly: its float32/64 value is a rational)."""
    v = np.asarray(t.value, np.float64)
    if v.size != 1 or not np.isfinite(v).all() or v.reshape(()) <= 0:
        raise Refuse(f"{what} must be a finite constant scalar > 0 (got {v.reshape(-1)[:4]}): it then scales the "
                     "value exactly")
    return Fraction(float(v.reshape(())))


def rescaled(x, factor: Fraction, what: str):
    """x * factor, exactly: the scale (of each term) times factor; a float function's value times it."""
    if isinstance(x, Mapped):  # float64 table values: times the numerator, over the denominator (each exact)
        n, d = float(factor.numerator), float(factor.denominator)
        return Mapped(x.x, lambda v, f=x.fn: np.asarray(f(v)) * n / d, f"{x.what} * {factor}")
    if isinstance(x, Summed):
        return Summed(tuple(rescaled(t, factor, what) for t in x.terms), x.shape)
    x = scaled(x, what, clipped_ok=True)
    clip = tuple(None if b is None else b * factor for b in x.clip)
    return replace(x, scale=np.asarray(x.scale * factor, dtype=object).reshape(x.scale.shape), clip=clip)


def is_float_const(t) -> bool:
    return isinstance(t, Tensor) and t.is_const and np.asarray(t.value).dtype.kind == "f"


@float_rule("Mul", since=7)
def mul_rule(ctx, node, a, b):
    """(a - za)(b - zb) at scale s_a * s_b; by a float constant c > 0 (hard-swish's 1/6): the scale times c."""
    if is_float_const(b) or is_float_const(a):
        x, c = (a, b) if is_float_const(b) else (b, a)
        return rescaled(x, constant_factor(c, "the Mul constant"), "a Mul operand")
    return multiply(ctx, scaled(a, "a Mul operand"), scaled(b, "a Mul operand"))


@float_rule("Div", since=7)
def div_rule(ctx, node, a, b):
    """a / c for a float constant c > 0 (hard-swish's x * relu6(x + 3) / 6): the scale over c, an exact rational
    folded into the requantization that follows."""
    if not is_float_const(b):
        raise Refuse("float Div of dequantized values has no integer form: only division by a constant > 0")
    return rescaled(a, 1 / constant_factor(b, "the divisor"), "the dividend")


@float_rule("Pow", since=7)
def pow_rule(ctx, node, x, y):
    """x^k for a constant integer exponent 1 <= k <= 4 (a LayerNormalization's square): k - 1 exact Muls."""
    k = np.asarray(y.value) if isinstance(y, Tensor) and y.is_const and y.value.size == 1 else None
    if k is None or k.reshape(()) != round(float(k.reshape(()))) or not 1 <= int(k.reshape(())) <= 4:
        raise Refuse("Pow of a dequantized value has an integer form for a constant exponent 1, 2, 3 or 4 only")
    base = scaled(x, "the Pow base")
    out = base
    for _ in range(int(k.reshape(())) - 1):
        out = multiply(ctx, out, base)
    return out


def relu(ctx, x: Scaled) -> Scaled:
    """max(t, zero): exact, the scale is positive."""
    if x.clip != (None, None):
        return replace(x, clip=(max(x.clip[0], Fraction(0)) if x.clip[0] is not None else Fraction(0), x.clip[1]))
    if x.t.lo >= int(x.zero.max()):
        return x
    zc = const(np.broadcast_to(x.zero, x.zero.shape).astype(np.int32), INT32)
    e = ctx.op("broadcast_max", as_int32(x.t), zc)
    t = ctx.result(e, x.t.dtype, max(x.t.lo, int(x.zero.min())), max(x.t.hi, int(x.zero.max())),
                   broadcast_shape(x.t, zc))
    return replace(x, t=t)


@float_rule("Relu", since=6)
def relu_rule(ctx, node, x):
    if isinstance(x, Mapped):
        return mapped(x, lambda v: np.maximum(v, 0), "Relu")
    return relu(ctx, scaled(x, "the Relu input", clipped_ok=True))


def real_bound(t: Tensor | None, what: str) -> Fraction | None:
    if t is None:
        return None
    if not t.is_const or t.value.size != 1:
        raise Refuse(f"{what} must be a constant scalar")
    v = float(np.asarray(t.value).reshape(()))
    if not math.isfinite(v):
        return None
    return Fraction(v)


@float_rule("Clip", since=11)
def clip_rule(ctx, node, x, lo_t=None, hi_t=None):
    """Clip to real bounds: an integer clip when they lie on x's grid, else deferred to the QuantizeLinear."""
    lo, hi = real_bound(lo_t, "Clip min"), real_bound(hi_t, "Clip max")
    if isinstance(x, Mapped):
        return mapped(x, lambda v: np.clip(v, None if lo is None else float(lo), None if hi is None else float(hi)),
                      "Clip")
    x = scaled(x, "the Clip input", clipped_ok=True)
    if x.clip != (None, None) or not x.per_tensor:  # Clip of a Clip, or per-channel: deferred, bounds combined
        old = x.clip
        lo = old[0] if lo is None else lo if old[0] is None else max(lo, old[0])
        hi = old[1] if hi is None else hi if old[1] is None else min(hi, old[1])
        return replace(x, clip=(lo, hi))
    s, z = x.scale.reshape(()).item(), int(x.zero.reshape(()))
    grid = [None if b is None else b / s + z for b in (lo, hi)]
    if all(g is None or g.denominator == 1 for g in grid):
        a = x.t.lo if grid[0] is None else max(int(grid[0]), x.t.lo)
        b = x.t.hi if grid[1] is None else min(int(grid[1]), x.t.hi)
        if a <= x.t.lo and b >= x.t.hi:
            return x
        if a >= b:
            raise Refuse("the Clip leaves a single value: fold it")
        e = ctx.emit("clip", ctx.entry(as_int32(x.t)), a_min=a, a_max=b)
        return replace(x, t=ctx.result(e, x.t.dtype, a, b, x.shape))
    return replace(x, clip=(lo, hi))


def mapped(x, fn: Callable, what: str) -> Mapped:
    if isinstance(x, Mapped):
        f = x.fn
        return Mapped(x.x, lambda v: fn(f(v)), f"{what}({x.what})")
    return Mapped(per_tensor(scaled(x, f"the {what} input"), what), fn, what)


def _erf(v):
    return np.vectorize(math.erf, otypes=[np.float64])(v)


FUNCTIONS: dict[str, Callable] = {
    "Sigmoid": lambda n: lambda v: 1 / (1 + np.exp(-v)),
    "Tanh": lambda n: np.tanh,
    "Exp": lambda n: np.exp,
    "Log": lambda n: lambda v: np.log(np.where(v > 0, v, np.nan)),
    "Sqrt": lambda n: lambda v: np.sqrt(np.where(v >= 0, v, np.nan)),
    "Erf": lambda n: _erf,
    "Softplus": lambda n: lambda v: np.logaddexp(0, v),
    "Softsign": lambda n: lambda v: v / (1 + np.abs(v)),
    "Abs": lambda n: np.abs,
    "Neg": lambda n: np.negative,
    "HardSigmoid": lambda n: lambda v: np.clip(n.attr_float("alpha", 0.2) * v + n.attr_float("beta", 0.5), 0, 1),
    "HardSwish": lambda n: lambda v: v * np.clip(v / 6 + 0.5, 0, 1),
    "LeakyRelu": lambda n: lambda v: np.where(v >= 0, v, n.attr_float("alpha", 0.01) * v),
    "Elu": lambda n: lambda v: np.where(v >= 0, v, n.attr_float("alpha", 1.0) * np.expm1(v)),
    "Selu": lambda n: lambda v: n.attr_float("gamma", 1.0507009873554805) * np.where(
        v > 0, v, n.attr_float("alpha", 1.6732632423543772) * np.expm1(v)),
    "Gelu": lambda n: lambda v: 0.5 * v * (1 + _erf(v / math.sqrt(2))),
}


def function_rule(ctx, node, x):
    """A float elementwise function: a table over x's integers, built by the QuantizeLinear that follows."""
    return mapped(x, FUNCTIONS[node.op_type](node), node.op_type)


for _op in FUNCTIONS:
    float_rule(_op, since=6)(function_rule)


# -- data movement: the integer rules on t ----------------------------------------------------------------------
MOVES = ["MaxPool", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Resize", "Upsample",
         "Identity", "Expand", "Tile", "Gather", "Split"]


def move_rule(ctx, node, x, *rest):
    """An op that only moves or selects values (MaxPool: the scale is positive): the integer rule on t. A deferred
    Clip passes through (clip then select = select then clip; max commutes with the monotone clip), so a Clip off
    the grid may precede a Resize or MaxPool before the QuantizeLinear."""
    x = scaled(x, f"the {node.op_type} input", clipped_ok=True)
    if not x.per_tensor:
        raise Refuse(f"{node.op_type} needs a per-tensor scale and zero point")
    if any(isinstance(r, Real) for r in rest):
        raise Refuse(f"{node.op_type} with a dequantized value as its parameters")
    if node.op_type == "Flatten" and node.attr_int("axis", 1) == 1 and len(x.shape) > 2 and not x.t.is_const:
        shape = (x.shape[0], math.prod(x.shape[1:]))  # CVM's flatten keeps the batch axis (a batched form can grow it)
        return replace(x, t=ctx.result(ctx.emit("flatten", x.t.entry), x.t.dtype, x.t.lo, x.t.hi, shape))
    out = RULES[("", node.op_type)].fn(ctx, node, x.t, *rest)
    return [replace(x, t=o) for o in out] if isinstance(out, list) else replace(x, t=out)


for _op in MOVES:
    float_rule(_op, since=1)(move_rule)


@float_rule("Shape", since=1)
def shape_rule(ctx, node, x):
    """The static shape of a dequantized value (shape arithmetic, folded at import)."""
    return RULES[("", "Shape")].fn(ctx, node, x)  # it reads only x.shape


@float_rule("Pad", since=11)
def pad_rule(ctx, node, x, pads=None, value=None, axes=None):
    """Pad with a real value v: the integer value v / s + z, which must be a whole number."""
    x = per_tensor(scaled(x, "the Pad input"), "Pad")
    v = Fraction(0) if value is None else real_bound(value, "Pad constant_value")
    q = v / x.scale.reshape(()).item() + int(x.zero.reshape(()))
    if q.denominator != 1:
        raise Refuse(f"Pad value {float(v)} is not on the input's quantization grid")
    fill = const(np.array([int(q)], np.int64), x.t.dtype)
    return replace(x, t=RULES[("", "Pad")].fn(ctx, node, x.t, pads, fill, axes))


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


# -- the QOperator form: compositions of the above --------------------------------------------------------------
def dq(x, s, z, axis: int | None = None) -> Scaled:
    return dequantize(None, x, s, z, axis)


def q(ctx, node, value, s, z) -> Tensor:
    dtype = out_type(node, z)
    return quantize(ctx, value, scale_of(s, "y_scale"), zero_of(z, dtype, "y_zero_point"), dtype)


def bias_of(b: Tensor | None, x: Scaled, w: Scaled) -> Scaled | None:
    if b is None:
        return None
    return Scaled(b, np.asarray(x.scale.reshape(()).item() * np.broadcast_to(w.scale, (w.t.shape[0],) +
                                                                         (1,) * (len(w.shape) - 1)).reshape(-1)),
                  np.zeros((), np.int64))


@rule("QLinearConv", since=10)
def qlinear_conv(ctx, node, x, xs, xz, w, ws, wz, ys, yz, b=None):
    xv, wv = dq(x, xs, xz), dq(w, ws, wz, 0)
    return q(ctx, node, conv(ctx, node, xv, wv, bias_of(b, xv, wv)), ys, yz)


@rule("QLinearMatMul", since=10)
def qlinear_matmul(ctx, node, a, a_s, az, b, bs, bz, ys, yz):
    av, bv = dq(a, a_s, az), dq(b, bs, bz, 1)
    if not bv.t.is_const:
        return q(ctx, node, variable_matmul(ctx, av, bv), ys, yz)
    if len(bv.shape) != 2:
        raise Refuse(f"a QLinearMatMul weight of shape {bv.shape}: dense takes one weight matrix")
    w, sw = weight(bv, "the QLinearMatMul weight B", transpose=True)
    return q(ctx, node, dense(ctx, av, w, sw, None), ys, yz)


@rule("QGemm", since=1, domain=MS)
def qgemm(ctx, node, a, a_s, az, b, bs, bz, c=None, ys=None, yz=None):
    if node.attr_float("alpha", 1.0) != 1.0 or node.attr_int("transA", 0):
        raise Refuse("QGemm with alpha != 1 or transA has no CVM form here")
    trans = bool(node.attr_int("transB", 0))
    av, bv = dq(a, a_s, az), dq(b, bs, bz, 0 if trans else 1)
    w, sw = weight(bv, "the QGemm weight B", transpose=not trans)
    bias = None if c is None else Scaled(c, np.asarray(av.scale.reshape(()).item() * sw), np.zeros((), np.int64))
    y = dense(ctx, av, w, sw, bias)
    return y if ys is None else q(ctx, node, y, ys, yz)


@rule("QLinearAdd", "QLinearMul", since=1, domain=MS)
def qlinear_binary(ctx, node, a, a_s, az, b, bs, bz, ys, yz):
    av, bv = dq(a, a_s, az), dq(b, bs, bz)
    value = add_rule(ctx, node, av, bv) if node.op_type == "QLinearAdd" else multiply(ctx, av, bv)
    return q(ctx, node, value, ys, yz)


@rule("QLinearConcat", since=1, domain=MS)
def qlinear_concat(ctx, node, ys, yz, *triples):
    xs = [dq(*triples[i:i + 3]) for i in range(0, len(triples), 3)]
    return q(ctx, node, concat_rule(ctx, node, *xs), ys, yz)


def _channels_first(node) -> None:
    if node.attr_int("channels_last", 0):
        raise Refuse("channels_last has no CVM form here")


@rule("QLinearAveragePool", since=1, domain=MS)
def qlinear_average_pool(ctx, node, x, xs, xz, ys, yz):
    _channels_first(node)
    return q(ctx, node, average(ctx, node, dq(x, xs, xz)), ys, yz)


@rule("QLinearGlobalAveragePool", since=1, domain=MS)
def qlinear_global_average_pool(ctx, node, x, xs, xz, ys, yz):
    _channels_first(node)
    return q(ctx, node, global_average(ctx, dq(x, xs, xz)), ys, yz)


@rule("QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftsign", since=1, domain=MS)
def qlinear_function(ctx, node, x, xs, xz, ys, yz):
    fn = FUNCTIONS[node.op_type[len("QLinear"):]](node)
    return q(ctx, node, mapped(dq(x, xs, xz), fn, node.op_type), ys, yz)


@rule("QLinearSoftmax", since=1, domain=MS)
def qlinear_softmax(ctx, node, x, xs, xz, ys, yz):
    """QuantizeLinear(Softmax(DequantizeLinear(x))), Softmax at the semantics of the node's ``opset`` attribute."""
    xv = dq(x, xs, xz)
    value = Softmaxed(per_tensor(xv, "QLinearSoftmax"), softmax_view(node, xv.shape, node.attr_int("opset", 13)))
    return q(ctx, node, value, ys, yz)


# -- the graph's float input ------------------------------------------------------------------------------------
@dataclass
class InputEdge:
    """The float graph input quantized by QuantizeLinear node(s) of one constant scale and zero point."""

    dtype: int
    scale: np.ndarray  # float32
    zero: np.ndarray
    nodes: list = field(default_factory=list)  # the QuantizeLinear nodes it replaces


def _named(graph, n) -> str:
    return f"{n.op_type} {n.name!r}" if n.name else f"{n.op_type} (unnamed, node {list(graph.node).index(n)})"


#: Ops that only select or move values: between the float input and its QuantizeLinear they commute with it.
INPUT_MOVES = ("Slice", "Concat", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity")


def quantizers(graph, name: str) -> tuple[list, list[str]]:
    """The QuantizeLinear nodes that quantize the float input ``name``, read directly or through ops that only
    move values (INPUT_MOVES, every data input from the input: an NHWC input's Transpose, YOLOX's Focus Slices),
    and what reads it (or a moved copy) otherwise: nodes (named) and graph outputs."""
    outputs = {o.name for o in graph.output}
    reached, todo, found, moves, others = {name}, [name], {}, [], {}
    while todo:
        x = todo.pop(0)
        if x in outputs and x != name:
            others[x] = f"the graph output {x!r}"
        for n in (n for n in graph.node if x in n.input):
            data = list(n.input) if n.op_type == "Concat" else list(n.input[:1])
            if n.op_type == "QuantizeLinear" and data == [x]:
                found[id(n)] = n
            elif n.op_type in INPUT_MOVES and x in data and x not in n.input[len(data):]:
                moves.append(n)
                if n.output[0] not in reached:
                    reached.add(n.output[0])
                    todo.append(n.output[0])
            else:
                others[id(n)] = _named(graph, n)
    for n in moves:
        if any(d not in reached for d in (n.input if n.op_type == "Concat" else n.input[:1])):
            others[id(n)] = _named(graph, n)
    return list(found.values()), list(others.values())


def input_edge(graph, name: str, constants: dict) -> InputEdge | str:
    """How a float input is quantized: every consumer a QuantizeLinear with the same constant scale and zero point
    (per tensor), directly or through ops that only move values (``quantizers``). Else why not, as a sentence
    naming the nodes that read it otherwise."""
    users, others = quantizers(graph, name)
    if not users and not others:
        return "only a float input read by QuantizeLinear alone (a quantized model) has a CVM form; no node reads it"
    producers = {t: n for n in graph.node for t in n.output}
    why = [f"read by {', '.join(others)}: only a float input read by QuantizeLinear alone (a quantized model) has "
           "a CVM form"] if others else []
    for n in users:
        computed = [t for t in n.input[1:3] if t and t not in constants]
        if computed:
            by = ", ".join(_named(graph, producers[t]) if t in producers else f"the graph input {t!r}"
                           for t in computed)
            why.append(f"{_named(graph, n)} quantizes it by a scale or zero point computed at run time (by {by}): "
                       "CVM needs them constant")
    if why:
        return "; ".join(why)
    found = []
    for n in users:
        s = constants.get(n.input[1]) if len(n.input) > 1 else None
        z = constants.get(n.input[2]) if len(n.input) > 2 and n.input[2] else None
        s = np.asarray(s, np.float32)
        if s.size != 1 or not np.isfinite(s).all() or (s <= 0).any():
            return f"QuantizeLinear {n.name!r} of the input needs one finite scale > 0, has {s.reshape(-1)[:4]}"
        zv = np.zeros((), np.int64) if z is None else np.asarray(z)
        dtype = next((a.i for a in n.attribute if a.name == "output_dtype" and a.i), None) or \
            (TensorProto.UINT8 if z is None else helper.np_dtype_to_tensor_dtype(zv.dtype))
        if dtype not in QUANTIZED_TYPES:
            return f"QuantizeLinear {n.name!r} of the input to a type CVM does not take"
        found.append((dtype, s.reshape(()), zv.astype(np.int64).reshape(())))
    if any(f[0] != found[0][0] or f[1] != found[0][1] or f[2] != found[0][2] for f in found):
        return "the input is quantized by QuantizeLinear nodes of different scales or zero points"
    return InputEdge(found[0][0], found[0][1], found[0][2], users)


def input_precision(dtype: int) -> int:
    lo, hi = INT_RANGES[dtype]
    return tight(max(-lo, hi))


def output_edge(x) -> tuple[Tensor, np.ndarray, np.ndarray]:
    """(the integers, scale as float32, zero point) of a graph output that is a dequantized tensor."""
    if not isinstance(x, Scaled) or x.clip != (None, None):
        raise Refuse("a float output computed after the last QuantizeLinear has no integer form: cut the graph "
                     "(--outputs) at a quantized tensor")
    s = np.array([float(v) for v in x.scale.flat], np.float64).reshape(x.scale.shape)
    if not (s.astype(np.float32).astype(np.float64) == s).all() or \
            not all(Fraction(float(v)) == f for v, f in zip(s.flat, x.scale.flat)):
        raise Refuse("a float output that no DequantizeLinear produced (its scale is not a float32): cut the graph "
                     "(--outputs) at a quantized tensor")
    return x.t, s.astype(np.float32), x.zero

