"""Import rules of the ONNX data-movement ops. They move values without changing them, so the interval carries
over and exactness is a matter of selecting the same elements:

* Reshape, Flatten, Squeeze, Unsqueeze: one CVM reshape to the static output shape (nothing if it is unchanged);
* Transpose -> transpose; Concat -> concatenate (empty inputs dropped); Tile -> tile; Expand -> repeat;
* Slice -> strided_slice with ONNX's clamping resolved here (begin, one-past-the-last end, stride per axis);
* Gather -> take with constant indices made non-negative (take clips, ONNX wraps negatives and refuses others);
* Pad (constant mode) -> concatenate with params filled with the pad value; negative pads crop (strided_slice).
"""
from __future__ import annotations

import math

import numpy as np

from .context import Tensor, check_values, const, cvm_shape, foldable
from .elemwise import broadcast_shape, np_type
from .registry import Refuse, rule


def ints(t: Tensor | None, what: str) -> list[int] | None:
    """The values of an optional constant integer input."""
    if t is None:
        return None
    if not t.is_const:
        raise Refuse(f"{what} must be a constant")
    values = t.value.reshape(-1)
    if values.dtype.kind == "f" and not (np.isfinite(values).all() and np.array_equal(values, np.round(values))):
        raise Refuse(f"{what} must hold integers")
    return [int(v) for v in values]


def axes_of(node, t: Tensor | None, since: int) -> list[int] | None:
    """The ``axes`` of a node: an attribute before opset ``since``, a constant input from it on."""
    return node.attr_ints("axes", None) if node.opset < since else ints(t, "axes")


def normal(axes: list[int], rank: int, what: str = "axis") -> list[int]:
    out = []
    for a in axes:
        if not -rank <= a < rank:
            raise Refuse(f"{what} {a} is out of range for rank {rank}")
        out.append(a % rank)
    return out


@rule("Reshape", since=5)
def reshape(ctx, node, x, shape):
    """Reshape (0 copies the input dim unless allowzero, -1 is inferred)."""
    target = ints(shape, "Reshape shape")
    keep_zero = node.attr_int("allowzero", 0)
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
    rest = iter(x.shape)
    return ctx.reshape(x, tuple(1 if i in new else next(rest) for i in range(rank)))


@rule("Transpose", since=1)
def transpose(ctx, node, x):
    rank = len(x.shape)
    perm = normal(node.attr_ints("perm", list(range(rank))[::-1], size=rank), rank)
    if sorted(perm) != list(range(rank)):
        raise Refuse(f"Transpose perm {perm} is not a permutation of the {rank} axes")
    if perm == list(range(rank)):
        return x
    if x.is_const:
        return const(np.transpose(x.value, perm), x.dtype)
    shape = tuple(x.shape[p] for p in perm)
    return ctx.result(ctx.emit("transpose", x.entry, axes=tuple(perm)), x.dtype, x.lo, x.hi, shape)


@rule("Concat", since=4)
def concat(ctx, node, *xs):
    rank = len(xs[0].shape)
    axis = normal([node.attr_int("axis")], rank)[0]
    if any(len(x.shape) != rank or x.shape[:axis] + x.shape[axis + 1:] != xs[0].shape[:axis] + xs[0].shape[axis + 1:]
           for x in xs):
        raise Refuse(f"Concat of shapes {[x.shape for x in xs]} along axis {axis}: the other axes differ")
    xs = [x for x in xs if x.size] or xs[:1]
    if all(x.is_const for x in xs):
        return const(np.concatenate([x.value for x in xs], axis=axis), xs[0].dtype)
    if len(xs) == 1:
        return xs[0]
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    e = ctx.op("concatenate", *xs, axis=axis)
    return ctx.result(e, xs[0].dtype, min(x.lo for x in xs), max(x.hi for x in xs), tuple(shape))


def onnx_range(dim: int, start: int, end: int, step: int) -> range:
    """The indices ONNX Slice takes on one axis: negatives count from the end, then start is clamped to
    [0, dim] ([0, dim-1] for step < 0) and end to [0, dim] ([-1, dim-1] for step < 0)."""
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        return range(min(max(start, 0), dim), min(max(end, 0), dim), step)
    return range(min(max(start, 0), dim - 1), min(max(end, -1), dim - 1), step)


def strided_slice(ctx, x: Tensor, ranges: list[range]) -> Tensor:
    """``x`` restricted to one index range per axis: strided_slice with end one step past the last index
    (written as -(dim+1) when that is -1, since strided_slice reads a negative end from the back)."""
    shape = tuple(len(r) for r in ranges)
    if 0 in shape:
        raise Refuse(f"the slice of {x.shape} is empty: CVM has no empty tensors")
    if all(r == range(d) for r, d in zip(ranges, x.shape)):
        return x
    if x.is_const:
        return const(x.value[np.ix_(*(np.array(r) for r in ranges))], x.dtype)
    ends = [r[-1] + (1 if r.step > 0 else -1) for r in ranges]
    e = ctx.emit("strided_slice", x.entry, begin=tuple(r.start for r in ranges),
                 end=tuple(v if v >= 0 else -d - 1 for v, d in zip(ends, x.shape)),
                 stride=tuple(r.step for r in ranges))
    return ctx.result(e, x.dtype, x.lo, x.hi, shape)


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


@rule("Gather", since=1)
def gather(ctx, node, x, idx):
    """Gather -> take. Constant indices: negatives made positive, out-of-range ones refused (ONNX fails on them,
    take would clip); variable indices must provably lie in [0, dim-1]."""
    rank = len(x.shape)
    axis = normal([node.attr_int("axis", 0)], rank)[0]
    dim = x.shape[axis]
    shape = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
    if idx.is_const:
        iv = idx.value.astype(np.int64)
        if iv.size and (iv.min() < -dim or iv.max() >= dim):
            raise Refuse(f"Gather index out of range [-{dim}, {dim - 1}]")
        iv = np.where(iv < 0, iv + dim, iv)
        if x.is_const:
            return const(np.take(x.value, iv, axis=axis), x.dtype)
        idx = const(iv.astype(np.int32), idx.dtype)
    elif idx.lo < 0 or idx.hi >= dim:
        raise Refuse(f"Gather indices may lie outside [0, {dim - 1}] (in [{idx.lo}, {idx.hi}]): CVM's take clips them")
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
    """Constant padding: negative pads crop (strided_slice), positive ones concatenate params of the value."""
    mode = node.attr_str("mode", "constant")
    if mode != "constant":
        raise Refuse(f"Pad mode {mode}: only constant padding has a CVM form")
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
