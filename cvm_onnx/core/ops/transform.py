"""Transform ops: expand_dims, flatten, reshape, squeeze, transpose, strided_slice, repeat, tile, take, cvm_lut,
slice_like, concatenate, where.

They move int32 values without arithmetic. Shape rules follow the runtime's ``FInferShape`` functions
(``src/top/tensor/transform.cc``), kernels follow its FORMAL device. Every output keeps the precision of
input 0 (for where, the condition's), except cvm_lut (the table's) and concatenate (the largest).
The global shape limits (ndim 1..6, dims <= 2^24, size <= 2^30) are checked by validation, not here.
"""
from __future__ import annotations

import math

import numpy as np

from .registry import Attr, Op, in_range, input_bound, register, require

ANY_COUNT = 2**31 - 1  # the runtime's kVarg: no upper bound on the input count


def _positive(value: int) -> str | None:
    return None if value > 0 else "must be > 0"


def _axis(axis: int, lo: int, hi: int, name: str, ndim: int) -> int:
    """``axis`` checked to lie in [lo, hi] (the runtime's VerifyAttrRange); a negative one counts from hi + 1."""
    require(lo <= axis <= hi, f"{name}={axis} must lie in [{lo}, {hi}] for a {ndim}-D input")
    return axis + (hi + 1) if axis < 0 else axis


@register
class ExpandDims(Op):
    """Insert ``num_newaxis`` dims of size 1 before ``axis`` in [-ndim-1, ndim] (negative: +ndim+1)."""

    name = "expand_dims"
    keeps_nonnegative = True
    family = "transform"
    bound = staticmethod(input_bound)
    attrs = (Attr("axis", "int"), Attr("num_newaxis", "int", 1, in_range(1, 4096)))

    @staticmethod
    def shape(a, s):
        n = len(s)
        axis = _axis(a.axis, -n - 1, n, "expand_dims.axis", n)
        return s[:axis] + (1,) * a.num_newaxis + s[axis:]

    @staticmethod
    def kernel(a, x):
        return x.reshape(ExpandDims.shape(a, x.shape))


@register
class Flatten(Op):
    """Row-major reinterpretation as (d0, d1*...*dn); a 1-D input becomes (d0, 1)."""

    name = "flatten"
    keeps_nonnegative = True
    family = "transform"
    bound = staticmethod(input_bound)

    @staticmethod
    def shape(a, s):
        return (s[0], math.prod(s[1:]))

    @staticmethod
    def kernel(a, x):
        return x.reshape(Flatten.shape(a, x.shape))


@register
class Reshape(Op):
    """Row-major reinterpretation to ``shape``, with MXNet's codes (the size must be preserved).

    0 copies the next input dim; -1 (at most once) is inferred from the size and consumes an input dim;
    -2 copies all remaining input dims; -3 merges the next two input dims; -4 splits the next input dim
    into the two values that follow it (one of them may be -1). A positive value also consumes an input dim.
    Values below -4 match no branch of the runtime and are skipped.
    """

    name = "reshape"
    keeps_nonnegative = True
    family = "transform"
    bound = staticmethod(input_bound)
    attrs = (Attr("shape", "tuple"),)

    @staticmethod
    def shape(a, s):
        target = a.shape
        require(len(target) > 0, "reshape.shape must not be empty")
        out: list[int] = []
        src, infer, i = 0, None, 0
        while i < len(target):
            v = target[i]
            if v > 0:
                out.append(v)
                src += 1
            elif v == 0:
                require(src < len(s), f"reshape code 0 at position {i} has no input dim left to copy from {s}")
                out.append(s[src])
                src += 1
            elif v == -1:
                require(infer is None, "reshape.shape may hold only one -1 (one inferred dim)")
                infer = len(out)
                out.append(1)
                src += 1
            elif v == -2:
                out.extend(s[src:])
                src = max(src, len(s))
            elif v == -3:
                require(src + 1 < len(s), f"reshape code -3 at position {i} needs two input dims left in {s}")
                out.append(s[src] * s[src + 1])
                src += 2
            elif v == -4:
                require(i + 2 < len(target), "reshape code -4 must be followed by the two split dims")
                require(src < len(s), f"reshape code -4 at position {i} has no input dim left to split in {s}")
                d0, d1, d2 = s[src], target[i + 1], target[i + 2]
                src, i = src + 1, i + 2
                require(d1 != -1 or d2 != -1, "reshape split dims after -4 cannot both be -1")
                require(all(d == -1 or d > 0 for d in (d1, d2)),
                        f"reshape split dims after -4 must be positive or -1, got {d1}, {d2}")
                d1 = d0 // d2 if d1 == -1 else d1
                d2 = d0 // d1 if d2 == -1 else d2
                require(d1 * d2 == d0, f"reshape split dims {d1}, {d2} do not divide the input dim {d0}")
                out += [d1, d2]
            i += 1
        size = math.prod(s)
        if infer is not None:
            out[infer] = size // math.prod(out)
        require(math.prod(out) == size, f"reshape target {tuple(out)} has a different size from the input {s}")
        return tuple(out)

    @staticmethod
    def kernel(a, x):
        return x.reshape(Reshape.shape(a, x.shape))


@register
class Squeeze(Op):
    """Remove the listed axes (each in [-ndim, ndim-1], of size 1), or every 1-dim if ``axis=()``.

    If no dim remains the output is (1,).
    """

    name = "squeeze"
    keeps_nonnegative = True
    family = "transform"
    bound = staticmethod(input_bound)
    attrs = (Attr("axis", "tuple", ()),)

    @staticmethod
    def shape(a, s):
        n = len(s)
        if a.axis:
            drop = {_axis(v, -n, n - 1, "squeeze.axis", n) for v in a.axis}
            for i in sorted(drop):
                require(s[i] == 1, f"squeeze.axis: axis {i} has size {s[i]}, only size-1 axes can be squeezed")
        else:
            drop = {i for i, d in enumerate(s) if d == 1}
        return tuple(d for i, d in enumerate(s) if i not in drop) or (1,)

    @staticmethod
    def kernel(a, x):
        return x.reshape(Squeeze.shape(a, x.shape))


def _permutation(axes: tuple[int, ...], n: int) -> tuple[int, ...]:
    if not axes:
        return tuple(range(n - 1, -1, -1))
    require(len(axes) == n, f"transpose.axes={axes} must list all {n} axes or be empty")
    perm = tuple(_axis(v, -n, n - 1, "transpose.axes", n) for v in axes)
    require(len(set(perm)) == n, f"transpose.axes={axes} repeats an axis")
    return perm


@register
class Transpose(Op):
    """Permute the axes: output axis i is input axis ``axes[i]``; ``axes=()`` reverses them."""

    name = "transpose"
    keeps_nonnegative = True
    family = "transform"
    bound = staticmethod(input_bound)
    attrs = (Attr("axes", "tuple", ()),)

    @staticmethod
    def shape(a, s):
        return tuple(s[p] for p in _permutation(a.axes, len(s)))

    @staticmethod
    def kernel(a, x):
        return np.transpose(x, _permutation(a.axes, x.ndim))


def _slice_plan(a, s: tuple[int, ...]) -> tuple[list[int], tuple[int, ...], tuple[int, ...]]:
    """Normalised begin, the stride and the output shape of strided_slice on shape ``s``."""
    n = len(s)
    begins = a.begin[:n] + (0,) * (n - len(a.begin))
    ends = a.end[:n] + s[len(a.end):]
    strides = a.stride[:n] + (1,) * (n - len(a.stride))
    starts, out = [], []
    for i, (d, b, e, st) in enumerate(zip(s, begins, ends, strides)):
        require(st != 0, f"strided_slice.stride is 0 on axis {i}")
        lo, hi = (-1, d - 1) if st < 0 else (0, d)
        b = min(max(b + d if b < 0 else b, lo), hi)
        e = min(max(e + d if e < 0 else e, lo), hi)
        require(e < b if st < 0 else b < e,
                f"strided_slice selects nothing on axis {i}: clamped begin {b}, end {e}, stride {st}")
        starts.append(b)
        out.append((abs(e - b) + abs(st) - 1) // abs(st))
    return starts, strides, tuple(out)


@register
class StridedSlice(Op):
    """Per axis (missing begin 0, end dim, stride 1; negative +dim; clamped to [0, dim] for stride > 0 or
    [-1, dim-1] for stride < 0): stride != 0, the range must be non-empty, out = ceil(|end-begin| / |stride|),
    y[d] = x[begin + stride * d]. Entries past ndim are ignored. The tuples hold ints only ("None" is rejected).
    """

    name = "strided_slice"
    keeps_nonnegative = True
    family = "transform"
    bound = staticmethod(input_bound)
    attrs = (Attr("begin", "tuple", (0,)), Attr("end", "tuple", (1,)), Attr("stride", "tuple", ()))

    @staticmethod
    def shape(a, s):
        return _slice_plan(a, s)[2]

    @staticmethod
    def kernel(a, x):
        begins, strides, out = _slice_plan(a, x.shape)
        # the last index taken plus one step, as a slice's stop (None past index 0 backwards)
        stops = [b + st * (k - 1) + (1 if st > 0 else -1) for b, st, k in zip(begins, strides, out)]
        return x[tuple(slice(b, e if e >= 0 else None, st) for b, e, st in zip(begins, stops, strides))].copy()

    @staticmethod
    def warnings(a, shapes, precisions):
        n = len(shapes[0])
        if len(a.begin) > n:
            return [f"begin has {len(a.begin)} entries for a {n}-D input: the runtime's kernels clamp the extra "
                    f"entries by reading past the shape and stride arrays (undefined behaviour)"]
        return []


@register
class Repeat(Op):
    """Repeat each element ``repeats`` (> 0) times along ``axis`` in [-ndim, ndim-1]: y[..d..] = x[..d // r..]."""

    name = "repeat"
    keeps_nonnegative = True
    family = "transform"
    bound = staticmethod(input_bound)
    attrs = (Attr("repeats", "int", check=_positive), Attr("axis", "int", 0))

    @staticmethod
    def shape(a, s):
        axis = _axis(a.axis, -len(s), len(s) - 1, "repeat.axis", len(s))
        return s[:axis] + (s[axis] * a.repeats,) + s[axis + 1:]

    @staticmethod
    def kernel(a, x):
        return np.repeat(x, a.repeats, axis=a.axis)


@register
class Tile(Op):
    """Tile the whole tensor ``reps`` times, right-aligned: out ndim = max(ndim, len(reps)), y[k] = x[k mod n].

    ``reps`` must be non-empty with each value in [1, 4096]; its default (0,) never is, so it is in effect required.
    """

    name = "tile"
    keeps_nonnegative = True
    family = "transform"
    bound = staticmethod(input_bound)
    attrs = (Attr("reps", "tuple", (0,)),)

    @staticmethod
    def shape(a, s):
        require(len(a.reps) > 0, "tile.reps must not be empty")
        require(all(1 <= r <= 4096 for r in a.reps), f"tile.reps={a.reps}: every value must lie in [1, 4096]")
        k = max(len(s), len(a.reps))
        s1 = (1,) * (k - len(s)) + s
        r1 = (1,) * (k - len(a.reps)) + a.reps
        return tuple(d * r for d, r in zip(s1, r1))

    @staticmethod
    def kernel(a, x):
        return np.tile(x, a.reps)


@register
class Take(Op):
    """Gather with indices clipped into range. axis None: y = flat_x[clip(i, 0, size-1)], shape of the indices;
    axis in [-ndim, ndim-1]: x[.., clip(i, 0, dim-1), ..], shape d[:a] + indices.shape + d[a+1:].
    """

    name = "take"
    family = "transform"
    input_names = ("data", "indices")
    bound = staticmethod(input_bound)
    attrs = (Attr("axis", "optional_int", None),)
    inputs = 2

    @staticmethod
    def batch_refusal(a, shapes, derived, n):
        if derived[0] and (a.axis is None or a.axis % len(shapes[0]) == 0):
            return "take indexes the flattened data or its first axis, which becomes the batch axis"
        return None

    @staticmethod
    def shape(a, s, idx):
        if a.axis is None:
            return idx
        axis = _axis(a.axis, -len(s), len(s) - 1, "take.axis", len(s))
        return s[:axis] + idx + s[axis + 1:]

    @staticmethod
    def kernel(a, x, idx):
        if a.axis is None:
            return x.reshape(-1)[np.clip(idx, 0, x.size - 1)]
        axis = a.axis % x.ndim
        return np.take(x, np.clip(idx, 0, x.shape[axis] - 1), axis=axis)


@register
class CvmLut(Op):
    """Table lookup: input 0 = indices, input 1 = table with size ``in_dim``; y = table_flat[clip(i, 0, in_dim-1)].

    The output has the indices' shape and the table's precision.
    """

    name = "cvm_lut"
    family = "transform"
    input_names = ("indices", "table")
    native_attrs = ()  # in_dim is the table's size
    bound = staticmethod(lambda a, s, b, v: [b[1]])
    attrs = (Attr("in_dim", "int"),)
    inputs = 2

    @staticmethod
    def shape(a, idx, table):
        require(math.prod(table) == a.in_dim, f"cvm_lut table size {math.prod(table)} must equal in_dim={a.in_dim}")
        return idx

    @staticmethod
    def precision(a, precisions, shapes):
        return precisions[1]

    @staticmethod
    def kernel(a, idx, table):
        return table.reshape(-1)[np.clip(idx, 0, table.size - 1)]


def _like_shape(a, s: tuple[int, ...], like: tuple[int, ...]) -> tuple[int, ...]:
    if a.axis:
        hi = min(len(s), len(like)) - 1
        axes = [_axis(v + len(s) if v < 0 else v, 0, hi, "slice_like.axis (made non-negative with the data's ndim)",
                      len(s)) for v in a.axis]
    else:
        require(len(s) == len(like), f"slice_like with axis=() needs inputs of equal ndim, got {s} and {like}")
        axes = list(range(len(s)))
    out = list(s)
    for i in axes:
        require(like[i] <= s[i], f"slice_like: axis {i} of shape_like ({like[i]}) exceeds the data's ({s[i]})")
        out[i] = like[i]
    return tuple(out)


@register
class SliceLike(Op):
    """The leading corner of the data: on the listed axes (``()`` = all, equal ndims) the size becomes
    shape_like's, which must not exceed the data's. y[d] = x[d] (the start is always 0).
    """

    name = "slice_like"
    keeps_nonnegative = True
    family = "transform"
    input_names = ("data", "shape_like")
    bound = staticmethod(input_bound)
    attrs = (Attr("axis", "tuple", ()),)
    inputs = 2

    @staticmethod
    def batch_refusal(a, shapes, derived, n):
        if derived[1] and not derived[0]:
            return "slice_like takes only the shape of the input-derived tensor: each example would get another slice"
        return None

    @staticmethod
    def shape(a, s, like):
        return _like_shape(a, s, like)

    @staticmethod
    def kernel(a, x, like):
        return x[tuple(slice(0, d) for d in _like_shape(a, x.shape, like.shape))]


@register
class Concatenate(Op):
    """Join one or more inputs of equal ndim along ``axis`` in [-ndim, ndim-1]; the other dims must be equal.

    The output precision is the largest input precision.
    """

    name = "concatenate"
    keeps_nonnegative = True
    family = "transform"
    bound = staticmethod(lambda a, s, b, v: [max(b)])
    attrs = (Attr("axis", "int", 1),)
    inputs = staticmethod(lambda a: (1, ANY_COUNT))

    @classmethod
    def input_names_for(cls, n):
        return [f"data{k}" for k in range(n)]

    @staticmethod
    def shape(a, *shapes):
        first, n = shapes[0], len(shapes[0])
        axis = _axis(a.axis, -n, n - 1, "concatenate.axis", n)
        for k, s in enumerate(shapes[1:], 1):
            require(len(s) == n, f"concatenate input {k} has {len(s)} dims, input 0 has {n}")
            require(all(d == f for i, (d, f) in enumerate(zip(s, first)) if i != axis),
                    f"concatenate input {k} shape {s} differs from input 0 {first} off axis {axis}")
        return first[:axis] + (sum(s[axis] for s in shapes),) + first[axis + 1:]

    @staticmethod
    def precision(a, precisions, shapes):
        return max(precisions)

    @staticmethod
    def kernel(a, *xs):
        return np.concatenate(xs, axis=a.axis % xs[0].ndim)


@register
class Where(Op):
    """cond != 0 ? x : y. x and y have equal shapes; cond has their shape, or is 1-D of length x.shape[0]
    (then cond[i] selects row i, as the math doc says).

    The output precision is the condition's (input 0), as in the runtime, not that of x or y.
    """

    name = "where"
    family = "transform"
    input_names = ("condition", "x", "y")
    bound = staticmethod(lambda a, s, b, v: [max(b[1], b[2])])
    inputs = 3

    @staticmethod
    def shape(a, cond, x, y):
        require(x == y, f"where: x and y must have the same shape, got {x} and {y}")
        if cond != x:
            require(len(cond) == 1 and cond[0] == x[0],
                    f"where: the condition {cond} must have the shape of x {x} or be 1-D of length {x[0]}")
        return x

    @staticmethod
    def kernel(a, cond, x, y):
        if cond.shape != x.shape:
            cond = cond.reshape((-1,) + (1,) * (x.ndim - 1))
        return np.where(cond != 0, x, y)

    @staticmethod
    def warnings(a, shapes, precisions):
        out = []
        if shapes[0] != shapes[1]:
            out.append("1-D condition: the runtime copies only the first bytes of each row (size bytes, not "
                       "size*4) and the rest is stale memory that differs between devices and runs; the model is "
                       "not portable (this project selects whole rows, as the math doc says)")
        if max(precisions[1:]) > precisions[0]:
            out.append(f"the output precision is the condition's ({precisions[0]}) although x/y may need "
                       f"{max(precisions[1:])} bits: consumers trusting it (the C API's int8 output packing, "
                       f"the CPU device's int8 conv2d) may truncate values")
        return out
