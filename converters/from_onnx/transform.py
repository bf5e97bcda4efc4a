"""Import rules of the ONNX data-movement ops. They move values without changing them, so the interval carries
over and exactness is a matter of selecting the same elements:

* Reshape, Flatten, Squeeze, Unsqueeze: one CVM reshape to the static output shape (nothing if it is unchanged);
* Transpose -> transpose; DepthToSpace, SpaceToDepth -> reshape, transpose (6-D), reshape; Concat -> concatenate
  (empty inputs dropped); Tile -> tile; Expand -> repeat;
* Slice -> strided_slice with ONNX's clamping resolved here (begin, one-past-the-last end, stride per axis);
* Gather -> take with constant indices made non-negative (take clips, ONNX wraps negatives and refuses others);
  GatherND -> take of rows; GatherElements -> take of the flattened data; OneHot -> comparisons with the positions;
  ReverseSequence -> take of the positions it reads (constant lengths);
* Pad: constant mode -> concatenate with params filled with the pad value; edge, reflect, wrap -> take of the
  padded positions; negative pads crop (strided_slice);
* Trilu -> broadcast_mul by a 0/1 mask; EyeLike, ConstantOfShape -> constants.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from onnx import TensorProto, numpy_helper

from .context import INT32, Tensor, check_values, const, cvm_shape, foldable, is_supported_type, type_name
from .emit import (arith, axes_of, broadcast_shape, concatenated, equal, extreme, greater, ints, normal, np_type,
                  scalar, step, strided_slice, transposed)
from .evaluated import evaluate
from .registry import Refuse, rule


@rule("Reshape", since=5)
def reshape(ctx, node, x, shape):
    """Reshape (0 copies the input dim unless allowzero, -1 is inferred)."""
    target = ints(shape, "Reshape shape")
    keep_zero = node.attr_int("allowzero", 0)
    if not keep_zero and any(v == 0 for v in target[len(x.shape):]):
        raise Refuse(f"Reshape of {x.shape} to {target}: a 0 past the input's rank has no dim to copy")
    out = [x.shape[i] if v == 0 and not keep_zero else v for i, v in enumerate(target)]
    if out.count(-1) == 1:
        known = math.prod(v for v in out if v != -1)
        out[out.index(-1)] = x.size // known if known else 0
    if math.prod(out) != x.size or any(v < 0 for v in out):
        raise Refuse(f"Reshape of {x.shape} to {target} does not keep the size")
    return ctx.reshape(x, tuple(out))


@rule("Flatten", since=1)
def flatten(ctx, node, x):
    rank = len(x.shape)
    axis = node.attr_int("axis", 1, -rank, rank)
    axis += rank if axis < 0 else 0
    return ctx.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


@rule("Squeeze", since=1)
def squeeze(ctx, node, x, axes_t=None):
    axes = axes_of(node, axes_t, 13)
    rank = len(x.shape)
    drop = set(normal(axes, rank)) if axes else {i for i, d in enumerate(x.shape) if d == 1}
    if any(x.shape[i] != 1 for i in drop):
        raise Refuse(f"Squeeze of axes {sorted(drop)} of shape {x.shape}: only size-1 axes can go")
    return ctx.reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in drop))


@rule("Unsqueeze", since=1)
def unsqueeze(ctx, node, x, axes_t=None):
    axes = axes_of(node, axes_t, 13) or []
    rank = len(x.shape) + len(axes)
    new = set(normal(axes, rank))
    if len(new) != len(axes):
        raise Refuse(f"Unsqueeze axes {list(axes)} name an axis twice (output rank {rank})")
    rest = iter(x.shape)
    return ctx.reshape(x, tuple(1 if i in new else next(rest) for i in range(rank)))


@rule("Transpose", since=1)
def transpose(ctx, node, x):
    rank = len(x.shape)
    perm = normal(node.attr_ints("perm", list(range(rank))[::-1], size=rank), rank)
    if sorted(perm) != list(range(rank)):
        raise Refuse(f"Transpose perm {perm} is not a permutation of the {rank} axes")
    return x if perm == list(range(rank)) else transposed(ctx, x, tuple(perm))


def _rearranged(ctx, x: Tensor, split: tuple[int, ...], perm: tuple[int, ...], out: tuple[int, ...]) -> Tensor:
    """``x`` reshaped to ``split``, transposed by ``perm`` and reshaped to ``out``: its values moved."""
    return ctx.reshape(transposed(ctx, ctx.reshape(x, split), perm), out)


def _blocked(node, x: Tensor) -> tuple[int, int, int, int, int]:
    """(N, C, H, W, b) of a DepthToSpace or SpaceToDepth of a 4-D x, block size b."""
    if len(x.shape) != 4:
        raise Refuse(f"{node.op_type} of a {len(x.shape)}-D tensor: ONNX defines it for (N, C, H, W)")
    return (*x.shape, node.attr_int("blocksize", lo=1))


@rule("DepthToSpace", since=1)
def depth_to_space(ctx, node, x):
    """DepthToSpace (PixelShuffle), block b: as ONNX defines it, x reshaped to (N, b, b, C/b^2, H, W) (mode DCR) or
    (N, C/b^2, b, b, H, W) (CRD), transposed (0, 3, 4, 1, 5, 2) or (0, 1, 4, 2, 5, 3), reshaped to (N, C/b^2, H b,
    W b): CVM's reshape, transpose (6-D), reshape."""
    n, c, hh, ww, b = _blocked(node, x)
    mode = node.attr_str("mode", "DCR", choices=("DCR", "CRD"))
    if c % (b * b):
        raise Refuse(f"DepthToSpace of {c} channels in blocks of {b} x {b}: the channels must be a multiple of {b * b}")
    split, perm = ((n, b, b, c // (b * b), hh, ww), (0, 3, 4, 1, 5, 2)) if mode == "DCR" else \
        ((n, c // (b * b), b, b, hh, ww), (0, 1, 4, 2, 5, 3))
    return _rearranged(ctx, x, split, perm, (n, c // (b * b), hh * b, ww * b))


@rule("SpaceToDepth", since=1)
def space_to_depth(ctx, node, x):
    """SpaceToDepth, block b: as ONNX defines it, x reshaped to (N, C, H/b, b, W/b, b), transposed (0, 3, 5, 1, 2,
    4), reshaped to (N, C b^2, H/b, W/b): CVM's reshape, transpose (6-D), reshape."""
    n, c, hh, ww, b = _blocked(node, x)
    if hh % b or ww % b:
        raise Refuse(f"SpaceToDepth of {hh} x {ww} in blocks of {b}: both must be multiples of {b}")
    return _rearranged(ctx, x, (n, c, hh // b, b, ww // b, b), (0, 3, 5, 1, 2, 4), (n, c * b * b, hh // b, ww // b))


@rule("Concat", since=4)
def concat(ctx, node, *xs):
    return concatenated(ctx, node.attr_int("axis"), *xs)


def onnx_range(dim: int, start: int, end: int, step: int) -> range:
    """The indices ONNX Slice takes on one axis: negatives count from the end, then start is clamped to
    [0, dim] ([0, dim-1] for step < 0) and end to [0, dim] ([-1, dim-1] for step < 0)."""
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        return range(min(max(start, 0), dim), min(max(end, 0), dim), step)
    return range(min(max(start, 0), dim - 1), min(max(end, -1), dim - 1), step)


@rule("Slice", since=1)
def slice_(ctx, node, x, starts=None, ends=None, axes=None, steps=None):
    if node.opset < 10:
        starts, ends, axes, steps = node.attr_ints("starts"), node.attr_ints("ends"), node.attr_ints("axes", None), None
    else:
        starts, ends = ints(starts, "Slice starts"), ints(ends, "Slice ends")
        axes, steps = ints(axes, "Slice axes"), ints(steps, "Slice steps")
    rank = len(x.shape)
    axes = normal(axes if axes is not None else list(range(len(starts))), rank)
    steps = steps or [1] * len(axes)
    if not len(starts) == len(ends) == len(axes) == len(steps) or len(set(axes)) < len(axes):
        raise Refuse(f"Slice starts {starts}, ends {ends}, axes {axes}, steps {steps}: one per distinct axis")
    if 0 in steps:
        raise Refuse("Slice step 0")
    ranges = [range(d) for d in x.shape]
    for a, s, e, st in zip(axes, starts, ends, steps):
        ranges[a] = onnx_range(x.shape[a], s, e, st)
    return strided_slice(ctx, x, ranges)


@rule("Split", since=2)
def split(ctx, node, x, split_t=None):
    """Split -> one strided_slice per output along the axis: sizes from ``split``, else equal parts (opset 18's
    num_outputs: ceil(dim / n) each, the last smaller)."""
    rank = len(x.shape)
    axis = normal([node.attr_int("axis", 0)], rank)[0]
    d, n = x.shape[axis], len(node.proto.output)
    sizes = node.attr_ints("split", None) if node.opset < 13 else ints(split_t, "Split split")
    if sizes is None:
        k = node.attr_int("num_outputs", n, lo=1) if node.opset >= 18 else n
        if k != n:
            raise Refuse(f"Split num_outputs {k} for {n} outputs: they must be equal")
        if node.opset < 18 and d % k:
            raise Refuse(f"Split of {d} into {k} equal parts")
        step = -(-d // k)
        sizes = [min(step, d - i * step) for i in range(k)]
    if len(sizes) != n or sum(sizes) != d or min(sizes) < 1:
        raise Refuse(f"Split sizes {sizes} for {n} outputs of an axis of {d}: each >= 1, summing to it")
    outs, start = [], 0
    for size in sizes:
        outs.append(strided_slice(ctx, x, [range(start, start + size) if a == axis else range(dim)
                                           for a, dim in enumerate(x.shape)]))
        start += size
    return outs


@rule("Range", since=11)
def range_(ctx, node, start, limit, delta):
    """Range of constants (shape arithmetic): folded at import by onnx's reference implementation; of a value
    computed at run time, refused (its length would depend on it)."""
    ins = (start, limit, delta)
    if not all(t.is_const for t in ins):
        raise Refuse("shape from values: Range of a value computed at run time (its length would depend on it)")
    [v] = evaluate(node, {name: t.value for name, t in zip(node.proto.input, ins)})
    if not v.size:
        raise Refuse("the Range is empty: CVM has no empty tensors")
    return const(np.asarray(v), start.dtype)


def wrapped(ctx, idx: Tensor, dim: int) -> Tensor:
    """Variable Gather indices that may be negative, made non-negative as ONNX reads them: i + dim * (0 > i)
    (broadcast_greater, broadcast_mul, broadcast_add), exact for i in [-dim, -1]; the bounds follow each part."""
    if idx.lo >= 0:
        return idx
    parts = [(idx.lo + dim, min(idx.hi, -1) + dim)] + ([(max(idx.lo, 0), idx.hi)] if idx.hi >= 0 else [])
    neg = greater(ctx, const(np.zeros((1,) * len(cvm_shape(idx.shape)), np.int64), INT32), idx)
    shift = step(ctx, "broadcast_mul", neg, const(np.full((1,) * len(cvm_shape(idx.shape)), dim, np.int64), INT32),
                 0, dim)
    return step(ctx, "broadcast_add", idx, shift, min(p[0] for p in parts), max(p[1] for p in parts))


@rule("Gather", since=1)
def gather(ctx, node, x, idx, axis: int | None = None):
    """Gather -> take. Constant indices: negatives made positive, out-of-range ones refused (ONNX fails on them,
    take would clip). Variable indices (token ids read from the input): negatives in [-dim, -1] made positive
    (``wrapped``); where they may still lie outside [0, dim-1], at indices ONNX gives no result for (onnxruntime
    fails the run), take clips them."""
    rank = len(x.shape)
    axis = normal([node.attr_int("axis", 0) if axis is None else axis], rank)[0]
    dim = x.shape[axis]
    shape = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
    if idx.is_const:
        iv = idx.value.astype(np.int64)
        if iv.size and (idx.lo < -dim or idx.hi >= dim):
            raise Refuse(f"Gather index out of range [-{dim}, {dim - 1}]")
        iv = np.where(iv < 0, iv + dim, iv)
        if x.is_const:
            return const(np.take(x.value, iv, axis=axis), x.dtype)
        idx = const(iv.astype(np.int32), idx.dtype)
    else:
        idx = wrapped(ctx, idx, dim)
    cvm = x.shape[:axis] + cvm_shape(idx.shape) + x.shape[axis + 1:]
    out = ctx.result(ctx.op("take", x, idx, axis=axis), x.dtype, x.lo, x.hi, cvm)
    return ctx.reshape(out, shape)


@rule("Tile", since=6)
def tile(ctx, node, x, repeats):
    reps = ints(repeats, "Tile repeats")
    if 0 in reps:
        raise Refuse("Tile with a 0 repeat gives an empty tensor: CVM has none")
    if all(r == 1 for r in reps):
        return x
    if x.is_const:
        foldable(tuple(d * r for d, r in zip((1,) * (len(reps) - x.value.ndim) + x.value.shape, reps)))
        return const(np.tile(x.value, reps), x.dtype)
    shape = tuple(d * r for d, r in zip(x.shape, reps))
    return ctx.result(ctx.emit("tile", x.entry, reps=tuple(reps)), x.dtype, x.lo, x.hi, shape)


@rule("Expand", since=8)
def expand(ctx, node, x, shape):
    target = Tensor(x.dtype, tuple(ints(shape, "Expand shape")), 0, 0)
    return ctx.broadcast_to(x, broadcast_shape(x, target))


def filled(x: Tensor, axis: int, width: int, fill: int) -> Tensor:
    """A constant of ``x``'s shape but ``width`` along ``axis``, holding ``fill``."""
    return const(np.full(foldable(x.shape[:axis] + (width,) + x.shape[axis + 1:]), fill, np_type(x.dtype)), x.dtype)


@rule("Pad", since=2)
def pad(ctx, node, x, pads=None, value=None, axes=None):
    """Negative pads crop (strided_slice). Constant mode: positive pads concatenate params of the value; edge,
    reflect and wrap: each padded axis is a take of the input's positions np.pad gives for that mode (the same
    index rule as ONNX's)."""
    mode = node.attr_str("mode", "constant")
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise Refuse(f"Pad mode {mode} is not an ONNX value")
    rank = len(x.shape)
    if node.opset < 11:
        widths, fill = node.attr_ints("pads"), node.attr_float("value", 0.0)
        axes = list(range(rank))
    else:
        widths = ints(pads, "Pad pads")
        if value is not None and value.size != 1:
            raise Refuse(f"Pad constant_value must be one value, has {value.size}")
        fill = 0 if value is None else ints(value, "Pad constant_value")[0]
        axes = normal(ints(axes, "Pad axes") or list(range(rank)), rank)
    if len(widths) != 2 * len(axes) or len(set(axes)) < len(axes):
        raise Refuse(f"Pad pads {widths} must hold 2 values per padded axis ({len(axes)} distinct axes)")
    if not float(fill).is_integer():
        raise Refuse(f"Pad value {fill} is not an integer")
    fill = int(fill)
    begin, end = widths[:len(axes)], widths[len(axes):]
    ranges = [range(d) for d in x.shape]
    for a, b, e in zip(axes, begin, end):
        ranges[a] = range(max(-b, 0), x.shape[a] - max(-e, 0))
    x = strided_slice(ctx, x, ranges)
    if mode != "constant":
        for a, b, e in zip(axes, begin, end):
            if b > 0 or e > 0:
                foldable((x.shape[a] + max(b, 0) + max(e, 0),))
                x = gather(ctx, node, x, const(np.pad(np.arange(x.shape[a]), (max(b, 0), max(e, 0)), mode=mode),
                                                 TensorProto.INT64), axis=a)
        return x
    check_values(x.dtype, min(x.lo, fill), max(x.hi, fill))
    for a, b, e in zip(axes, begin, end):
        if b <= 0 and e <= 0:
            continue
        if x.is_const:
            foldable(x.shape[:a] + (x.shape[a] + max(b, 0) + max(e, 0),) + x.shape[a + 1:])
            x = const(np.pad(x.value, [(max(b, 0), max(e, 0)) if i == a else (0, 0) for i in range(rank)],
                             constant_values=fill), x.dtype)
            continue
        before, after = ([filled(x, a, w, fill)] if w > 0 else [] for w in (b, e))
        parts = before + [x] + after
        shape = x.shape[:a] + (x.shape[a] + max(b, 0) + max(e, 0),) + x.shape[a + 1:]
        x = ctx.result(ctx.op("concatenate", *parts, axis=a), x.dtype, min(x.lo, fill), max(x.hi, fill), shape)
    return x


@rule("Trilu", since=14)
def trilu(ctx, node, x, k_t=None):
    """The upper (j - i >= k) or lower (j - i <= k) triangle of the last two axes, zeros elsewhere: x times a
    constant 0/1 mask -> broadcast_mul. A variable k (a scalar) makes the mask a comparison with the constant
    j - i: upper (j - i + 1) > k, lower k > (j - i - 1) -> broadcast_greater."""
    if len(x.shape) < 2:
        raise Refuse(f"Trilu of a {len(x.shape)}-D tensor: it needs 2 dims or more")
    if 0 in x.shape:
        raise Refuse("Trilu of an empty tensor: CVM has no empty tensors")
    n, m = foldable(x.shape[-2:])
    d = np.arange(m)[None, :] - np.arange(n)[:, None]
    upper = node.attr_int("upper", 1)
    if k_t is None or k_t.is_const:
        k = scalar(k_t, "Trilu k") or 0
        keep = d >= k if upper else d <= k
        if keep.all():
            return x
        if x.is_const or not keep.any():
            kept = np.where(keep, x.value if x.is_const else 0, 0)
            return const(np.broadcast_to(kept, foldable(x.shape)).astype(np_type(x.dtype)), x.dtype)
        mask = const(keep, TensorProto.BOOL)
    else:
        k = ctx.reshape(k_t, (1, 1))
        mask = greater(ctx, const(d + 1, INT32), k) if upper else greater(ctx, k, const(d - 1, INT32))
    return ctx.result(ctx.op("broadcast_mul", x, mask), x.dtype, min(x.lo, 0), max(x.hi, 0), x.shape)


@rule("GatherND", since=11)
def gather_nd(ctx, node, x, idx):
    """x[b..., idx[b..., q..., 0], ..., idx[b..., q..., k-1], :]: with x as rows (every batch and indexed position)
    of the remaining dims, the row of a lookup is batch * (indexed positions) + its raveled index, negatives
    counted from the end -> take along axis 0. The rows come from constant indices, or from variable ones
    provably within [-dim, dim-1] as sum((i + dim * (0 > i)) * stride) -> broadcast ops and sum."""
    b = node.attr_int("batch_dims", 0, 0)
    if not idx.shape or not 1 <= idx.shape[-1] <= len(x.shape) - b:
        raise Refuse(f"GatherND indices of shape {idx.shape} do not fit data of shape {x.shape}")
    k = idx.shape[-1]
    dims, rest = x.shape[b:b + k], x.shape[b + k:]
    if len(dims) != k or idx.shape[:b] != x.shape[:b]:
        raise Refuse(f"GatherND indices of shape {idx.shape} do not fit data of shape {x.shape}")
    lookups, n = idx.shape[:-1], math.prod(dims)
    if 0 in lookups:
        raise Refuse("GatherND with no indices gives an empty tensor: CVM has none")
    strides = np.array([math.prod(dims[j + 1:]) for j in range(k)], np.int64)
    batch = np.broadcast_to(np.arange(math.prod(x.shape[:b])).reshape(x.shape[:b] + (1,) * (len(lookups) - b)) * n,
                            lookups)
    dv = np.array(dims, np.int64)
    if idx.is_const:
        iv = idx.value.astype(np.int64)
        if idx.hi > max(dims) or (iv < -dv).any() or (iv >= dv).any():
            raise Refuse(f"GatherND index out of range of dims {dims}")
        rows = const((np.where(iv < 0, iv + dv, iv) * strides).sum(axis=-1) + batch, INT32)
    else:
        if idx.lo < -int(dv.min()) or idx.hi >= int(dv.min()):
            raise Refuse(f"GatherND indices may lie outside [-dim, dim-1] for dims {dims} (in [{idx.lo}, {idx.hi}])")
        negative = greater(ctx, const(np.zeros(1), INT32), idx)
        shift = step(ctx, "broadcast_mul", negative, const(dv, INT32), 0, int(dv.max()))
        wrapped = step(ctx, "broadcast_add", idx, shift, 0, int(dv.max()) - 1)
        scaled = step(ctx, "broadcast_mul", wrapped, const(strides, INT32), 0, n - 1)
        flat = ctx.result(ctx.op("sum", ctx.reshape(scaled, (math.prod(lookups), k)), axis=(1,), keepdims=False),
                          INT32, 0, n - 1, (math.prod(lookups),))
        rows = step(ctx, "broadcast_add", ctx.reshape(flat, lookups), const(batch, INT32), 0, batch.max() + n - 1)
    table_ = ctx.reshape(x, (math.prod(x.shape[:b]) * n, math.prod(rest)))
    if x.is_const and rows.is_const:
        return const(table_.value[rows.value].reshape(lookups + rest), x.dtype)
    e = ctx.op("take", table_, rows, axis=0)
    return ctx.reshape(ctx.result(e, x.dtype, x.lo, x.hi, cvm_shape(rows.shape) + (math.prod(rest),)),
                       lookups + rest)


@rule("GatherElements", since=11)
def gather_elements(ctx, node, x, idx):
    """y[p] = x[p with its ``axis`` coordinate replaced by idx[p]]: take of the flattened x at base + i * stride
    (base: the constant offset of p's other coordinates; stride: the axis' in x), negatives counted from the end.
    Constant indices outside [-dim, dim-1] are refused (ONNX fails on them); computed ones must provably lie
    within it (i + dim * (0 > i), then broadcast_mul, broadcast_add)."""
    rank = len(x.shape)
    axis = normal([node.attr_int("axis", 0)], max(rank, 1))[0]
    if not rank or len(idx.shape) != rank or any(n > d for a, (n, d) in enumerate(zip(idx.shape, x.shape))
                                                 if a != axis):
        raise Refuse(f"GatherElements indices of shape {idx.shape} do not fit data of shape {x.shape} (axis {axis})")
    if 0 in idx.shape:
        raise Refuse("GatherElements with no indices gives an empty tensor: CVM has none")
    dim = x.shape[axis]
    strides = [math.prod(x.shape[a + 1:]) for a in range(rank)]
    foldable(idx.shape)
    base = sum(np.arange(n).reshape((n,) + (1,) * (rank - 1 - a)) * strides[a]
               for a, n in enumerate(idx.shape) if a != axis)
    base = np.broadcast_to(np.asarray(base, np.int64), idx.shape)
    if idx.is_const:
        iv = idx.value.astype(np.int64)
        if idx.lo < -dim or idx.hi >= dim:
            raise Refuse(f"GatherElements index out of range [-{dim}, {dim - 1}]")
        flat = const(base + np.where(iv < 0, iv + dim, iv) * strides[axis], INT32)
        if x.is_const:
            return const(x.value.reshape(-1)[flat.value], x.dtype)
    else:
        if idx.lo < -dim or idx.hi >= dim:
            raise Refuse(f"GatherElements indices may lie outside [-{dim}, {dim - 1}] (in [{idx.lo}, {idx.hi}])")
        i = step(ctx, "broadcast_mul", wrapped(ctx, idx, dim), const(np.array([strides[axis]]), INT32), 0,
                 (dim - 1) * strides[axis])
        flat = step(ctx, "broadcast_add", i, const(base, INT32), 0, math.prod(x.shape) - 1)
    out = ctx.result(ctx.op("take", x, flat), x.dtype, x.lo, x.hi, cvm_shape(idx.shape))
    return ctx.reshape(out, idx.shape)


@rule("ReverseSequence", since=10)
def reverse_sequence(ctx, node, x, lens):
    """Along ``time_axis``, the first lens[b] elements of each batch b (``batch_axis``) reversed, the rest in place:
    with equal lengths, take along the time axis at n - 1 - t (t < n), t; else take of the flattened x at each
    element's source position. The lengths must be constant (a shape's folding gives them: a bidirectional RNN's
    backward pass) and lie in [0, time steps], as onnxruntime requires."""
    b_axis, t_axis = node.attr_int("batch_axis", 1, 0, 1), node.attr_int("time_axis", 0, 0, 1)
    if len(x.shape) < 2 or b_axis == t_axis:
        raise Refuse(f"ReverseSequence of a rank-{len(x.shape)} tensor with batch_axis {b_axis}, time_axis {t_axis}: "
                     "rank >= 2, the axes 0 and 1")
    if not lens.is_const:
        raise Refuse("ReverseSequence sequence_lens must be a constant (its positions would depend on run-time values)")
    n, steps, batch = lens.value.astype(np.int64).reshape(-1), x.shape[t_axis], x.shape[b_axis]
    if n.size != batch or n.min() < 0 or n.max() > steps:
        raise Refuse(f"ReverseSequence sequence_lens {n.tolist()[:8]} for {batch} sequences of {steps} steps: one per "
                     f"sequence, each in [0, {steps}]")
    t = np.arange(steps)[:, None]
    src = np.where(t < n, n - 1 - t, t)  # (time, batch): the time step each output element reads
    if (src == src[:, :1]).all():
        return gather(ctx, node, x, const(src[:, 0], INT32), axis=t_axis)
    foldable(x.shape)
    pos = np.indices(x.shape)
    pos[t_axis] = np.expand_dims(src if t_axis == 0 else src.T, tuple(range(2, len(x.shape))))
    flat = np.ravel_multi_index(tuple(pos), x.shape)
    if x.is_const:
        return const(x.value.reshape(-1)[flat], x.dtype)
    out = ctx.result(ctx.op("take", x, const(flat, INT32)), x.dtype, x.lo, x.hi, cvm_shape(x.shape))
    return ctx.reshape(out, x.shape)


@rule("EyeLike", since=9)
def eye_like(ctx, node, x):
    """Ones on the k-th diagonal of x's (static) shape: a constant."""
    if len(x.shape) != 2:
        raise Refuse(f"EyeLike of a {len(x.shape)}-D tensor: it needs 2 dims")
    dtype = node.attr_int("dtype", x.dtype)
    if not is_supported_type(dtype):
        raise Refuse(f"EyeLike of type {type_name(dtype)}: not an integer type")
    return const(np.eye(*foldable(x.shape), k=node.attr_int("k", 0), dtype=np_type(dtype)), dtype)


@rule("ConstantOfShape", since=9)
def constant_of_shape(ctx, node, shape):
    """A constant shape filled with the value: a constant (a variable shape would make CVM's shapes depend on
    values)."""
    dims = tuple(ints(shape, "ConstantOfShape shape (the output shape)"))
    value = node.attr_tensor("value", None)
    fill = numpy_helper.to_array(value).reshape(-1)[0] if value is not None else np.float32(0)
    dtype = value.data_type if value is not None else TensorProto.FLOAT
    if not is_supported_type(dtype):
        raise Refuse(f"ConstantOfShape of type {type_name(dtype)}: not an integer type")
    return const(np.full(foldable(dims), fill, np_type(dtype)), dtype)


@rule("OneHot", since=9)
def one_hot(ctx, node, idx, depth_t, values):
    """values[1] where the index (negatives counted from the end) is j along the new axis, values[0] elsewhere:
    hit = max(i == j, i == j - depth) (Equal's form), y = off + hit * (on - off) with broadcast ops."""
    depth = scalar(depth_t, "OneHot depth (the output's size)")
    if depth is None or depth <= 0:
        raise Refuse(f"OneHot depth {depth}: an empty tensor, CVM has none")
    if values.shape != (2,):
        raise Refuse(f"OneHot values of shape {values.shape}: must be (off, on)")
    rank = len(idx.shape) + 1
    axis = normal([node.attr_int("axis", -1)], rank)[0]
    spread = idx.shape[:axis] + (1,) + idx.shape[axis:]
    out = foldable(idx.shape[:axis] + (depth,) + idx.shape[axis:])
    j = np.arange(depth).reshape((depth,) + (1,) * (rank - 1 - axis))
    off, on = (strided_slice(ctx, values, [range(k, k + 1)]) for k in (0, 1))
    if idx.is_const:
        iv = np.where(idx.value > depth, depth, idx.value).astype(np.int64).reshape(spread)  # beyond: no hit
        hit = const(np.broadcast_to((iv == j) | (iv == j - depth), out), TensorProto.BOOL)
    else:
        spread_idx = ctx.reshape(idx, spread)
        hit = extreme(ctx, True, [equal(ctx, spread_idx, const(j - wrap, INT32)) for wrap in (0, depth)])
    if hit.is_const and off.is_const and on.is_const:
        return const(np.where(hit.value, on.value, off.value).astype(np_type(values.dtype)), values.dtype)
    gap = arith(ctx, "Sub", on, off)
    y = arith(ctx, "Add", ctx.broadcast_to(off, out), arith(ctx, "Mul", hit, gap))
    return replace(y, dtype=values.dtype, lo=min(off.lo, on.lo), hi=max(off.hi, on.hi))
