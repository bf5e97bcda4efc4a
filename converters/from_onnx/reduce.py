"""Import rules of the reductions: ReduceSum, ReduceMax, ReduceMin, GlobalMaxPool -> sum and max over explicit axes,
then a reshape to ONNX's shape; CumSum and CumProd along a constant axis; ArgMax, ArgMin and TopK as maxima of
comparisons (``first_max``).

The axes are always listed (CVM's max with the default axis=() starts from 0). Kept axes of size 1 are
reshaped away before reducing, which avoids the runtime CPU kernel's misreading of some of them. ReduceSum is
exact when n * max|x| fits the element type (onnxruntime saturates int32 sums beyond it, and adds in double,
exact below 2^53). ReduceMin is -max(-x), the negations steps in CVM's int32.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from onnx import TensorProto

from cvm_onnx.core.constants import FLOAT64_EXACT, tight

from .context import FLOAT_EXACT, INT32, Tensor, check_values, const, foldable
from .emit import arith, concatenated, greater, ints, logical_not, negated, normal, reduced, scalar, step, \
    strided_slice
from .registry import Refuse, rule

REDUCE = {"ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min}


@rule(*REDUCE, since=1)
def reduce(ctx, node, x, axes_t=None):
    is_sum = node.op_type == "ReduceSum"
    rank = len(x.shape)
    axes = node.attr_ints("axes", None) if node.opset < (13 if is_sum else 18) else ints(axes_t, "axes")
    if not axes and node.attr_int("noop_with_empty_axes", 0):
        return x
    axes = sorted(set(normal(axes or list(range(rank)), rank)))
    keep = node.attr_int("keepdims", 1)
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else \
        tuple(d for i, d in enumerate(x.shape) if i not in axes)
    n = math.prod(x.shape[i] for i in axes)
    if n == 0:
        raise Refuse("reducing an empty axis: CVM has no empty tensors")
    lo, hi = (n * x.lo, n * x.hi) if is_sum else (x.lo, x.hi)
    check_values(x.dtype, lo, hi)
    if is_sum and n * x.peak > FLOAT_EXACT.get(x.dtype, FLOAT64_EXACT):
        raise Refuse(f"precision bound exceeded: partial sums may reach {n * x.peak}, beyond the integers "
                     "onnxruntime adds exactly")
    if x.is_const:
        v = x.value.astype(np.int64) if is_sum and x.value.dtype.kind in "iub" else x.value  # max, min: in order
        return const(REDUCE[node.op_type](v, axis=tuple(axes), keepdims=bool(keep)).astype(x.value.dtype), x.dtype)
    if node.op_type == "ReduceMin":  # -max(-x)
        y = negated(ctx, reduced(ctx, "max", negated(ctx, x), axes, -hi, -lo))
    else:
        y = reduced(ctx, "sum" if is_sum else "max", x, axes, lo, hi)
    return ctx.reshape(replace(y, dtype=x.dtype), shape)


@rule("GlobalMaxPool", since=1)
def global_max_pool(ctx, node, x):
    """The max over every axis after the first two (N, C, spatial...), kept as 1s: CVM's max over them, reshaped."""
    if len(x.shape) < 3:
        raise Refuse(f"GlobalMaxPool of a rank-{len(x.shape)} tensor: it needs (N, C, spatial...)")
    axes = list(range(2, len(x.shape)))
    if 0 in x.shape[2:]:
        raise Refuse("reducing an empty axis: CVM has no empty tensors")
    shape = x.shape[:2] + (1,) * len(axes)
    if x.is_const:
        return const(np.max(x.value, axis=tuple(axes), keepdims=True), x.dtype)
    return ctx.reshape(replace(reduced(ctx, "max", x, axes, x.lo, x.hi), dtype=x.dtype), shape)


MAX_STEPS = 1024  # positions along a CumProd axis (one product node each)


def _axis(node, x: Tensor, axis_t: Tensor) -> int:
    if not x.shape:
        raise Refuse(f"{node.op_type} of a scalar: it needs an axis")
    return normal([scalar(axis_t, f"{node.op_type} axis")], len(x.shape))[0]


def _rows(n: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """rows[i, j] = 1 where output i takes input j."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    return (j > i if exclusive else j >= i) if reverse else (j < i if exclusive else j <= i)


@rule("CumSum", since=11)
def cumsum(ctx, node, x, axis_t):
    """y_i = sum of x_j over the j that row i of a constant 0/1 matrix T takes (j <= i; j < i exclusive; reversed
    j >= i, j > i): x (axis length L moved to a new axis) times T -> broadcast_mul, then sum over j. Every partial
    sum is a cumulative sum of at most L values, so the interval c * [lo, hi] for c the rows' counts bounds them.
    The sum is reshaped to x's shape (``reduced`` drops its axes of size 1)."""
    axis = _axis(node, x, axis_t)
    n = x.shape[axis]
    foldable((n, n))
    rows = _rows(n, bool(node.attr_int("exclusive", 0)), bool(node.attr_int("reverse", 0)))
    counts = rows.sum(axis=1)
    cmin, cmax = int(counts.min()), int(counts.max())
    lo, hi = min(cmin * x.lo, cmax * x.lo), max(cmin * x.hi, cmax * x.hi)
    check_values(x.dtype, lo, hi)
    if cmax * x.peak > FLOAT_EXACT.get(x.dtype, FLOAT64_EXACT):
        raise Refuse(f"precision bound exceeded: partial sums may reach {cmax * x.peak}, beyond the integers "
                     "the type adds exactly")
    if x.is_const:
        v = np.moveaxis(x.value.astype(np.int64), axis, -1) @ rows.T
        return const(np.moveaxis(v, -1, axis).astype(x.value.dtype), x.dtype)
    after = x.shape[axis + 1:]
    spread = ctx.reshape(x, x.shape[:axis] + (1, n) + after)
    t = const(rows.reshape((n, n) + (1,) * len(after)), TensorProto.BOOL)
    terms = ctx.result(ctx.op("broadcast_mul", spread, t), TensorProto.INT32, min(x.lo, 0), max(x.hi, 0),
                       x.shape[:axis] + (n, n) + after)
    return replace(ctx.reshape(reduced(ctx, "sum", terms, [axis + 1], lo, hi), x.shape), dtype=x.dtype)


@rule("CumProd", since=26)
def cumprod(ctx, node, x, axis_t):
    """y_i = y_(i-1) * x_i along a constant axis (1 before the first for exclusive; from the end for reverse):
    strided_slice per position, broadcast_mul, concatenate. Each product's interval is checked against the type."""
    axis = _axis(node, x, axis_t)
    n = x.shape[axis]
    if n > MAX_STEPS:
        raise Refuse(f"CumProd along {n} positions: one product node each, at most {MAX_STEPS}")
    if x.is_const:
        v = np.moveaxis(x.value.astype(np.int64), axis, 0)
        ones = np.ones_like(v[:1])
        seq = v[::-1] if node.attr_int("reverse", 0) else v
        seq = np.concatenate([ones, seq[:-1]]) if node.attr_int("exclusive", 0) else seq
        out = np.cumprod(seq, axis=0)
        out = out[::-1] if node.attr_int("reverse", 0) else out
        check_values(x.dtype, *((int(out.min()), int(out.max())) if out.size else (0, 0)))
        return const(np.moveaxis(out, 0, axis).astype(x.value.dtype), x.dtype)
    order = range(n - 1, -1, -1) if node.attr_int("reverse", 0) else range(n)
    parts, acc = {}, None
    for k, i in enumerate(order):
        if node.attr_int("exclusive", 0):
            parts[i] = acc if acc is not None else const(np.ones(x.shape[:axis] + (1,) + x.shape[axis + 1:],
                                                                np.int64), x.dtype)
        here = strided_slice(ctx, x, [range(i, i + 1) if a == axis else range(d) for a, d in enumerate(x.shape)])
        acc = here if acc is None else arith(ctx, "Mul", acc, here, x.dtype)
        if not node.attr_int("exclusive", 0):
            parts[i] = acc
    pieces = [parts[i] for i in range(n)]
    if len(pieces) == 1:
        return pieces[0]
    shape = x.shape
    e = ctx.op("concatenate", *pieces, axis=axis)
    return ctx.result(e, x.dtype, min(p.lo for p in pieces), max(p.hi for p in pieces), shape)


MAX_TOPK = 512  # rounds of TopK: 4 CVM nodes each by its key, 11 masked (a YOLOv10 head takes 300 of 8400)


def scalar_of(x: Tensor, v: int) -> Tensor:
    """The constant ``v`` of x's rank, broadcasting to it."""
    return const(np.full((1,) * len(x.shape), v, np.int64), INT32)


def kept_max(ctx, x: Tensor, axis: int, lo: int, hi: int) -> Tensor:
    """max of x along ``axis``, kept as 1, with values in [lo, hi]: one ``max`` with keepdims where every kept axis
    of size 1 leads (the CPU kernel pairs the output's dims above 1 with x's kept axes from the right, and misreads a
    kept 1 after another axis), else ``reduced`` and a reshape."""
    keep = x.shape[:axis] + (1,) + x.shape[axis + 1:]
    lead = next((a for a, d in enumerate(x.shape) if d > 1 or a == axis), len(x.shape))
    if any(d == 1 for a, d in enumerate(x.shape) if a > lead and a != axis):
        return ctx.reshape(replace(reduced(ctx, "max", x, [axis], lo, hi), dtype=x.dtype), keep)
    return ctx.result(ctx.op("max", x, axis=(axis,), keepdims=True), x.dtype, lo, hi, keep)


def first_max(ctx, x: Tensor, axis: int, last: bool, lo: int, hi: int, consts: tuple | None = None) -> tuple:
    """(m, i, t, s, consts) along ``axis`` (length C) of x, the reduced axis kept as 1: m = max x (in [lo, hi]);
    e = x == m as x > m - 1 (broadcast_greater; 1 - (m > x) where m - 1 would pass 31 bits); t = e * w for the
    constant w_j = C - j (j + 1 with ``last``), so s = max t = C - i for the first index i of the max (i + 1 for the
    last); i = C - s (s - 1). t equals s at i alone, which ``topk`` uses to mask it. ``consts`` (w, 1, C): made
    here, or those an earlier call returned, so that every round of a TopK reads the same params."""
    c, rank = x.shape[axis], len(x.shape)
    if consts is None:
        j = np.arange(c).reshape((c,) + (1,) * (rank - 1 - axis))
        consts = const(j + 1 if last else c - j, INT32), scalar_of(x, 1), scalar_of(x, c)
    w, one, top = consts
    m = kept_max(ctx, x, axis, lo, hi)
    if tight(max(1 - x.lo, x.hi)) <= 31:
        eq = greater(ctx, x, step(ctx, "broadcast_sub", m, one, lo - 1, hi - 1))
    else:
        eq = logical_not(ctx, greater(ctx, m, x))
    t = step(ctx, "broadcast_mul", eq, w, 0, c)
    s = kept_max(ctx, t, axis, 1, c)
    i = step(ctx, "broadcast_sub", s, one, 0, c - 1) if last else step(ctx, "broadcast_sub", top, s, 0, c - 1)
    return m, replace(i, dtype=TensorProto.INT64), t, s, consts


def _reduced_axis(node, x: Tensor, default: int) -> int:
    if not x.shape:
        raise Refuse(f"{node.op_type} of a scalar: it needs an axis")
    axis = normal([node.attr_int("axis", default)], len(x.shape))[0]
    if x.shape[axis] == 0:
        raise Refuse("reducing an empty axis: CVM has no empty tensors")
    return axis


@rule("ArgMax", "ArgMin", since=1)
def arg_extreme(ctx, node, x):
    """The index of the first (``select_last_index``: last) max along ``axis`` (``first_max``); ArgMin on -x. The
    int64 indices are CVM int32 of bits(C - 1) + 1 bits, in [0, C - 1]."""
    axis = _reduced_axis(node, x, 0)
    keep, last = node.attr_int("keepdims", 1, 0, 1), node.attr_int("select_last_index", 0, 0, 1)
    is_min = node.op_type == "ArgMin"
    shape = x.shape[:axis] + (1,) * keep + x.shape[axis + 1:]
    if x.is_const:
        v, fn = np.moveaxis(x.value, axis, -1), np.argmin if is_min else np.argmax
        i = v.shape[-1] - 1 - fn(v[..., ::-1], axis=-1) if last else fn(v, axis=-1)
        return const(i.reshape(shape).astype(np.int64), TensorProto.INT64)
    check_values(INT32, x.lo, x.hi)
    xs = negated(ctx, x) if is_min else x
    i = first_max(ctx, xs, axis, bool(last), xs.lo, xs.hi)[1]
    return ctx.reshape(i, shape)


@rule("Hardmax", since=13)
def hardmax(ctx, node, x):
    """1 at the first max along ``axis``, 0 elsewhere: ``first_max``'s t = e (C - j) equals its max s (>= 1) there
    alone, so t > s - 1 (broadcast_greater); 0 and 1 of x's type."""
    axis = _reduced_axis(node, x, -1)
    check_values(INT32, x.lo, x.hi)
    _, _, t, s, (_, one, _) = first_max(ctx, x, axis, False, x.lo, x.hi)
    return replace(greater(ctx, t, step(ctx, "broadcast_sub", s, one, 0, x.shape[axis] - 1)), dtype=x.dtype)


def ranked(ctx, x: Tensor, axis: int, k: int) -> tuple[Tensor, Tensor]:
    """The k largest of x along ``axis`` (length C) in order and their indices, x in [lo, hi] with R C <= 2^30
    (R = hi - lo + 1): z = (x - lo) C + (C - 1 - j) lies in [0, R C - 1], is distinct at every j and orders as x,
    then the lower index; round r takes M_r = max y_r with y_0 = z, y_(r+1) = where(z > M_r - 1, -1, z) (the z
    taken so far are those >= M_r, every other one lies in [0, M_r - 1]); at the end x = floor(M / C) + lo and
    j = C - 1 - (M - C floor(M / C)) for every round's M at once."""
    c, rank, lo, r = x.shape[axis], len(x.shape), x.lo, x.hi - x.lo + 1
    one, wide = scalar_of(x, 1), scalar_of(x, c)
    u = x if lo == 0 else step(ctx, "broadcast_sub", x, scalar_of(x, lo), 0, r - 1)
    j = np.arange(c).reshape((c,) + (1,) * (rank - 1 - axis))
    z = step(ctx, "broadcast_add", step(ctx, "broadcast_mul", u, wide, 0, (r - 1) * c), const(c - 1 - j, INT32), 0,
             r * c - 1)
    low = step(ctx, "broadcast_sub", greater(ctx, scalar_of(x, -1), z), one, -1, -1)  # -1 of z's shape
    y, tops = z, []
    for _ in range(k):
        tops.append(kept_max(ctx, y, axis, 0, r * c - 1))
        if len(tops) < k:
            hit = greater(ctx, z, step(ctx, "broadcast_sub", tops[-1], one, -1, r * c - 2))
            y = ctx.result(ctx.op("where", hit, low, z), INT32, -1, r * c - 1, z.shape)
    top = concatenated(ctx, axis, *tops)
    q = ctx.result(ctx.op("broadcast_div", top, wide), INT32, 0, r - 1, top.shape)
    v = q if lo == 0 else step(ctx, "broadcast_add", q, scalar_of(x, lo), lo, lo + r - 1)
    rest = step(ctx, "broadcast_sub", top, step(ctx, "broadcast_mul", q, wide, 0, (r - 1) * c), 0, c - 1)
    return v, replace(step(ctx, "broadcast_sub", scalar_of(x, c - 1), rest, 0, c - 1), dtype=TensorProto.INT64)


@rule("TopK", since=10)
def topk(ctx, node, x, k_t):
    """The k largest (``largest=0``: smallest, on -x) values along ``axis`` and their indices, in order, equal
    values by lower index first (as onnxruntime; with ``sorted=0`` the same elements, which onnxruntime orders its
    own way: these come sorted): ``ranked`` where x's range R and the axis' length C have R C <= 2^30 and the
    precisions of R - 1 and C sum to at most 32 (broadcast_mul's rule), else k
    rounds of ``first_max``, each but the last masking the element found, x - D * (t > s - 1) with D = R, below
    every value not taken. k is a constant, at most MAX_TOPK."""
    axis = _reduced_axis(node, x, -1)
    k = scalar(k_t, "TopK k")
    c = x.shape[axis]
    if not 1 <= k <= c:
        raise Refuse(f"TopK k={k} must lie in [1, {c}] (the axis' length): CVM has no empty tensors")
    if k > MAX_TOPK:
        raise Refuse(f"TopK k={k}: one round of CVM nodes per value, at most {MAX_TOPK}")
    largest = node.attr_int("largest", 1, 0, 1)
    if x.is_const:
        v = np.moveaxis(x.value, axis, -1)  # ties by lower index first: a stable sort (of v reversed, descending)
        order = (c - 1 - np.argsort(v[..., ::-1], axis=-1, kind="stable")[..., ::-1] if largest else
                 np.argsort(v, axis=-1, kind="stable"))[..., :k]
        values = np.take_along_axis(v, order, axis=-1)
        return [const(np.moveaxis(values, -1, axis).astype(x.value.dtype), x.dtype),
                const(np.moveaxis(order, -1, axis).astype(np.int64), TensorProto.INT64)]
    check_values(INT32, x.lo, x.hi)
    xs = x if largest else negated(ctx, x)
    d = xs.hi - xs.lo + 1
    if d * c <= 1 << 30 and tight(d - 1) + tight(c) <= 32:  # (x - lo) C: broadcast_mul's precision is the sum
        v, i = ranked(ctx, xs, axis, k)
        return [replace(v if largest else negated(ctx, v), dtype=x.dtype), i]
    if k > 1 and (tight(d) > 30 or tight(max(d - xs.lo, xs.hi)) > 32):
        raise Refuse(f"TopK of values in [{x.lo}, {x.hi}]: masking each value found moves it {d} below the least, "
                     "past CVM's 32 bits")
    big, consts = scalar_of(x, d), None
    values, indices, cur = [], [], xs
    for r in range(k):
        m, i, t, s, consts = first_max(ctx, cur, axis, False, xs.lo, xs.hi, consts)
        values.append(m)
        indices.append(i)
        if r < k - 1:
            hit = greater(ctx, t, step(ctx, "broadcast_sub", s, consts[1], 0, c - 1))
            cur = step(ctx, "broadcast_sub", cur, step(ctx, "broadcast_mul", hit, big, 0, d), xs.lo - d, xs.hi)
    v = concatenated(ctx, axis, *values)
    v = replace(v if largest else negated(ctx, v), dtype=x.dtype)
    return [v, replace(concatenated(ctx, axis, *indices), dtype=TensorProto.INT64)]
