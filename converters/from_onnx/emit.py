"""The emit helpers the import rules share: broadcasting, constant scalars and axes, the arithmetic and comparison
steps of rewrites, slicing and joining, the convolution and pooling geometry, reductions over axes. Rule modules
import these from here and never from one another.
"""
from __future__ import annotations

import functools
import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
from onnx import TensorProto, helper

from .checks import MAX_DIM
from .context import BOOL, FLOAT_EXACT, INT32, Tensor, check_values, const, cvm_shape, foldable, op_interval
from .registry import REQUIRED, Refuse



def np_type(dtype: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(dtype))


def as_int32(t: Tensor) -> Tensor:
    """The same values as an int32 tensor (a constant converted)."""
    return replace(t, dtype=INT32, name=None) if not t.is_const else const(t.value.astype(np.int64), INT32)


def minus_zero(ctx, t: Tensor, z: np.ndarray) -> Tensor:
    """t - z as an int32 tensor, ``z`` a zero point broadcast against t (a constant t folded)."""
    if not z.any():
        return as_int32(t)
    if t.is_const:
        return const(t.value.astype(np.int64) - z, INT32)
    zc = const(z.astype(np.int32), INT32)
    return ctx.apply("broadcast_sub", as_int32(t), zc, shape=broadcast_shape(t, zc))


def broadcast_of(*shapes) -> tuple[int, ...]:
    """ONNX multidirectional (numpy) broadcasting of shapes; shapes that do not broadcast refused."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise Refuse(f"shapes {[tuple(s) for s in shapes]} do not broadcast") from None


def broadcast_shape(*ts: Tensor) -> tuple[int, ...]:
    """ONNX multidirectional (numpy) broadcasting of the operands' shapes; an empty result of a computed operand
    (one broadcast against an empty constant) refused: CVM has no empty tensor."""
    out = broadcast_of(*(t.shape for t in ts))
    if 0 in out and not all(t.is_const for t in ts):
        raise Refuse(f"shapes {[t.shape for t in ts]} broadcast to {out}, an empty tensor: CVM has none")
    return out


def broadcasts_into(shape: tuple[int, ...], into: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts into ``into`` without growing it (False for shapes that do not broadcast)."""
    return len(shape) <= len(into) and all(d in (1, n) for d, n in zip(tuple(shape)[::-1], tuple(into)[::-1]))


def folded(value: np.ndarray, dtype: int) -> Tensor:
    """A constant result in the ONNX element type ``dtype``."""
    return const(np.asarray(value).astype(np_type(dtype)), dtype)


def scalar(t: Tensor | None, what: str) -> int | None:
    """The integer value of an optional constant scalar input."""
    if t is None:
        return None
    if not t.is_const or t.value.size != 1:
        raise Refuse(f"{what} must be a constant scalar")
    v = t.value.reshape(()).item()
    if not float(v).is_integer():  # False for nan and inf too (int() of them raises)
        raise Refuse(f"{what} = {v} is not an integer")
    return int(v)


ARITHMETIC = {"Add": ("broadcast_add", np.add), "Sub": ("broadcast_sub", np.subtract),
              "Mul": ("broadcast_mul", np.multiply)}


def arith(ctx, op: str, a: Tensor, b: Tensor, dtype: int = TensorProto.INT32) -> Tensor:
    """``a op b`` (Add, Sub, Mul) of element type ``dtype``; the default, int32, is for the steps of a rule's
    rewrite, which ONNX never computes: only CVM's 32 bits bound them."""
    cvm, fn = ARITHMETIC[op]
    if a.is_const and b.is_const:
        foldable(broadcast_shape(a, b))
        wide = (a.value, b.value) if dtype in FLOAT_EXACT else (a.value.astype(np.int64), b.value.astype(np.int64))
        return folded(fn(*wide), dtype)
    lo, hi = op_interval(cvm, a, b)
    check_values(dtype, lo, hi)
    return ctx.result(ctx.op(cvm, a, b), dtype, lo, hi, broadcast_shape(a, b))


def wide(v: np.ndarray) -> np.ndarray:
    """Integers as int64 for folding, unsigned ones as they are (uint64 values pass int64)."""
    return v if v.dtype.kind in "uf" else v.astype(np.int64)


def step(ctx, op: str, a: Tensor, b: Tensor, lo: int, hi: int) -> Tensor:
    """CVM op ``op`` of a and b, a step of a rewrite whose values provably lie in [lo, hi] (within 32 bits)."""
    return ctx.result(ctx.op(op, a, b), INT32, lo, hi, broadcast_shape(a, b))


def extreme(ctx, is_max: bool, xs) -> Tensor:
    """The elementwise max (or min) of tensors ``xs`` of one type."""
    consts = [x for x in xs if x.is_const]
    operands = [x for x in xs if not x.is_const]
    if consts:
        foldable(broadcast_shape(*consts))
        operands.append(folded(functools.reduce(np.maximum if is_max else np.minimum, [c.value for c in consts]),
                               xs[0].dtype))
    if len(operands) == 1:
        return operands[0]
    signed = operands if is_max else [negated(ctx, x) for x in operands]
    acc = signed[0]
    for x in signed[1:]:
        acc = ctx.apply("broadcast_max", acc, x, shape=broadcast_shape(acc, x))
    return replace(acc if is_max else negated(ctx, acc), dtype=xs[0].dtype)


def negated(ctx, x: Tensor) -> Tensor:
    """-x as a step in CVM's int32 (exact where |x| fits 32 bits)."""
    check_values(INT32, -x.hi, -x.lo)
    if x.is_const:
        return const(-x.value.astype(np.int64), INT32)
    return ctx.apply("negative", x, shape=x.shape)


def differ(ctx, a: Tensor, b: Tensor) -> Tensor:
    """a != b as max(a > b, b > a), 1 or 0."""
    return ctx.apply("broadcast_max", greater(ctx, a, b), greater(ctx, b, a), dtype=BOOL, shape=broadcast_shape(a, b))


def equal(ctx, a: Tensor, b: Tensor) -> Tensor:
    """a == b as 1 - (a != b)."""
    return logical_not(ctx, differ(ctx, a, b))


def greater(ctx, a: Tensor, b: Tensor) -> Tensor:
    """a > b as 1 or 0."""
    return ctx.result(ctx.op("broadcast_greater", a, b), BOOL, 0, 1, broadcast_shape(a, b))


def ones(t: Tensor, value: int = 1) -> Tensor:
    """A constant ``value`` of ``t``'s CVM rank, broadcasting to ``t``."""
    return const(np.full((1,) * len(cvm_shape(t.shape)), value, np.int64), INT32)


def logical_not(ctx, x: Tensor) -> Tensor:
    """not x (0/1) = 1 - x -> broadcast_sub."""
    if x.is_const:
        return const(np.logical_not(x.value), BOOL)
    return ctx.apply("broadcast_sub", ones(x), x, dtype=BOOL, shape=x.shape)


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


def concatenated(ctx, axis: int, *xs: Tensor) -> Tensor:
    """xs joined along ONNX axis ``axis`` -> concatenate (empty inputs dropped; constants folded)."""
    rank = len(xs[0].shape)
    axis = normal([axis], rank)[0]
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


def strided_slice(ctx, x: Tensor, ranges: list[range]) -> Tensor:
    """``x`` restricted to one index range per axis: strided_slice with end one step past the last index
    (written as -(dim+1) when that is -1, since strided_slice reads a negative end from the back)."""
    shape = tuple(len(r) for r in ranges)
    if 0 in shape:  # an empty constant: a Concat drops it; anything that would emit it refuses (``Importer.entry``)
        return const(np.zeros(shape, x.value.dtype if x.is_const else np.int64), x.dtype)
    if all(r == range(d) for r, d in zip(ranges, x.shape)):
        return x
    if x.is_const:
        return const(x.value[np.ix_(*(np.array(r) for r in ranges))], x.dtype)
    ends = [r[-1] + (1 if r.step > 0 else -1) for r in ranges]
    e = ctx.emit("strided_slice", x.entry, begin=tuple(r.start for r in ranges),
                 end=tuple(v if v >= 0 else -d - 1 for v, d in zip(ends, x.shape)),
                 stride=tuple(r.step for r in ranges))
    return ctx.result(e, x.dtype, x.lo, x.hi, shape)


def onnx_pads(node, spatial: tuple[int, ...], kernel: list[int], strides: list[int], dilations: list[int],
              crop: bool = False):
    """(begin, end) pads per spatial axis from ``pads`` or ``auto_pad``. SAME_* pads the total
    (ceil(size/s) - 1) * s + dilated kernel - size, half at the begin for SAME_UPPER (truncated toward zero,
    as onnxruntime computes it), the rest at the end, SAME_LOWER the other way round. A negative total is no
    padding, except with ``crop`` (onnxruntime's MaxPool), where it crops the input. A negative ``pads`` value is
    refused (ONNX's shape inference, and so onnxruntime, refuses it)."""
    auto = node.attr_str("auto_pad", "NOTSET", ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"))
    n = len(spatial)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            total = (-(-size // s) - 1) * s + (k - 1) * d + 1 - size
            total = total if crop else max(total, 0)
            t = total + (auto == "SAME_LOWER")
            head = t // 2 if t >= 0 else -(-t // 2)
            begin.append(head)
            end.append(total - head)
        return begin, end
    if auto == "VALID":
        return [0] * n, [0] * n
    pads = node.attr_ints("pads", [0] * 2 * n, size=2 * n)
    if min(pads, default=0) < 0:
        raise Refuse(f"pads {list(pads)} hold a negative value: ONNX's pads are >= 0")
    return list(pads[:n]), list(pads[n:])


def cropped(ctx, x: Tensor, begin: list[int], end: list[int]) -> tuple[Tensor, list[int], list[int]]:
    """Negative pads (2 spatial axes) as a crop of the input; the pads left are >= 0."""
    ranges = [range(d) for d in x.shape[:2]]
    ranges += [range(max(-b, 0), d - max(-e, 0)) for d, b, e in zip(x.shape[2:], begin, end)]
    return strided_slice(ctx, x, ranges), [max(b, 0) for b in begin], [max(e, 0) for e in end]


def aligned(size: int, k: int, s: int, pb: int, pe: int) -> tuple[int, int, int]:
    """(P, offset, out): CVM's symmetric padding P >= pb, pe with P - pb a multiple of the stride, so ONNX output
    o is CVM output o + offset; ``out`` ONNX outputs."""
    out = (size + pb + pe - k) // s + 1
    if out <= 0:
        raise Refuse(f"the kernel ({k}) is larger than the padded input ({size + pb + pe})")
    p = pb if pb >= pe else pb + -(-(pe - pb) // s) * s
    return p, (p - pb) // s, out


def select(ctx, y: Tensor, offsets: list[int], steps: list[int], outs: list[int]) -> Tensor:
    """The ONNX windows among CVM's on the two spatial axes."""
    ranges = [range(d) for d in y.shape[:2]]
    ranges += [range(o, o + s * (n - 1) + 1, s) for o, s, n in zip(offsets, steps, outs)]
    return strided_slice(ctx, y, ranges)


def spatial_2d(ctx, x: Tensor, what: str) -> Tensor:
    """A 1-D (N, C, L) input as (N, C, 1, L); 2-D as is; others refused."""
    if len(x.shape) == 3:
        return ctx.reshape(x, x.shape[:2] + (1,) + x.shape[2:])
    if len(x.shape) != 4:
        raise Refuse(f"{what} on a {len(x.shape) - 2}-D image: only 1-D and 2-D have a CVM form")
    return x


def one_value_axes(node, shape: tuple[int, ...], kernel: list[int]) -> list[int]:
    """The spatial axes (0-based among them) of a Conv or pooling of ONNX shape ``shape`` that hold one value, one tap
    and no padding; refused where the kernel has not one size per spatial axis."""
    n = len(shape) - 2
    if len(kernel) != n:
        raise Refuse(f"{node.op_type} kernel of shape {tuple(kernel)} on a {n}-D image: one size per spatial axis")
    strides = node.attr_ints("strides", [1] * n, lo=1, size=n)
    dilations = node.attr_ints("dilations", [1] * n, lo=1, size=n)
    begin, end = onnx_pads(node, shape[2:], kernel, strides, dilations)
    return [i for i in range(n) if shape[2 + i] == kernel[i] == 1 and begin[i] == end[i] == 0]


def on_axes(node, n: int, keep: list[int], pads: list[int] | None = None, group: int | None = None):
    """The node with its per-axis attributes (of n spatial axes) of the axes ``keep`` only; ``pads`` given: those
    explicit pads and auto_pad NOTSET; ``group`` given: that group."""
    proto = type(node.proto)()
    proto.CopyFrom(node.proto)
    for a in proto.attribute:
        if a.name in ("kernel_shape", "strides", "dilations") and len(a.ints) == n:
            a.ints[:] = [a.ints[i] for i in keep]
        elif a.name == "pads" and len(a.ints) == 2 * n:
            a.ints[:] = [a.ints[i] for i in keep] + [a.ints[n + i] for i in keep]
    given = {k: v for k, v in (("pads", pads), ("group", group)) if v is not None}
    if given:
        kept = [a for a in proto.attribute if a.name not in ("auto_pad", *given)]
        del proto.attribute[:]
        proto.attribute.extend(kept + [helper.make_attribute(k, v) for k, v in given.items()])
    return replace(node, proto=proto)


def as_2d(node):
    """A 1-D Conv or pooling node as the 2-D one over (1, L): a leading axis of one value, one tap, stride and
    dilation 1 and no padding, so the windows over L and what they sum (or their max) are the same."""
    proto = type(node.proto)()
    proto.CopyFrom(node.proto)
    for a in proto.attribute:
        if a.name in ("kernel_shape", "strides", "dilations") and len(a.ints) == 1:
            a.ints[:] = [1, a.ints[0]]
        elif a.name == "pads" and len(a.ints) == 2:
            a.ints[:] = [0, a.ints[0], 0, a.ints[1]]
    return replace(node, proto=proto)


def single_axes(node, shape: tuple[int, ...], kernel: list[int]):
    """A Conv or MaxPool of an N-D image (N > 2, ONNX shape ``shape``, kernel of spatial size ``kernel``) as one of
    2 spatial axes: (the node with its per-axis attributes of the others only, the spatial axes dropped). An axis
    dropped has one value, one tap and no padding (a video model run on one frame: (N, C, 1, H, W) by a (1, k, k)
    kernel), so it has one output whatever its stride, dilation or ceil_mode, the sum (or max) over it is that one
    value's, and the op over the other axes is the same. Refused where fewer than N - 2 axes are such."""
    n = len(shape) - 2
    drop = one_value_axes(node, shape, kernel)[:n - 2]
    if len(drop) < n - 2:
        raise Refuse(f"{node.op_type} on a {n}-D image: only 1-D and 2-D have a CVM form (or more axes of one "
                     "value, one tap and no padding each)")
    return on_axes(node, n, [i for i in range(n) if i not in drop]), [2 + i for i in drop]


def depth_taps(ctx, node, t: Tensor, fill: int, kernel: list[int], ceil: bool = False):
    """The depth windows of a 3-D Conv or pooling of t (N, C, D, H, W) by ``kernel``: for output depth o (of Do) and
    tap j (of kd), input depth o s + j d - b (the depth's stride s, dilation d, begin pad b; ``fill``, the padding,
    outside [0, D - 1]; Do by ``ceil`` as MaxPool's ``pool_plan``), a ``take`` along the depth: (N, C, Do kd, H, W).
    Returns (that, the node of the last two axes with explicit pads, Do); refused where a depth pad is negative, a
    window reads padding only, or the taps would hold more than 2^24 values (before any is computed)."""
    n, c, depth, hh, ww = t.shape
    strides = node.attr_ints("strides", [1] * 3, lo=1, size=3)
    dilations = node.attr_ints("dilations", [1] * 3, lo=1, size=3)
    begin, end = onnx_pads(node, t.shape[2:], kernel, strides, dilations)
    kd, s, d, b = kernel[0], strides[0], dilations[0], begin[0]
    span = depth + b + end[0] - d * (kd - 1) - 1
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= depth + b:  # a last window starting past the input: none
        out -= 1
    padding_only = Refuse(f"{node.op_type} 3-D of depth {depth} by {kd} taps (pads {b}, {end[0]}) has a depth window "
                          "of padding only, or none")
    if span < 0 or b < 0 or end[0] < 0:
        raise padding_only
    if n * out * kd * c * hh * ww > MAX_DIM:  # before the taps' indices are allocated
        raise Refuse(f"{node.op_type} 3-D: its {out} x {kd} depth taps hold {n * out * kd * c * hh * ww} values, "
                     "more than 2^24")
    idx = np.arange(out)[:, None] * s + np.arange(kd) * d - b
    inside = (idx >= 0) & (idx < depth)
    if not inside.any(axis=1).all():
        raise padding_only
    idx = np.where(inside, idx, depth).reshape(-1)  # depth: the padding slice
    if not inside.all():
        t = concatenated(ctx, 2, t, const(np.full((n, c, 1, hh, ww), fill), t.dtype))
    taps = ctx.result(ctx.op("take", t, const(idx.astype(np.int32), INT32), axis=2), t.dtype, t.lo, t.hi,
                      (n, c, out * kd, hh, ww))
    return taps, on_axes(node, 3, [1, 2], [begin[1], begin[2], end[1], end[2]]), out


def depth_folded(ctx, node, t: Tensor, fill: int, kernel: list[int], groups: int):
    """A 3-D Conv's input t (N, C, D, H, W) as a 2-D one whose channels hold the depth taps (``depth_taps``), stacked
    per group as (group, tap, channel): (N Do, G kd C/G, H, W). A conv2d of it by the weight (M, C/G, kd, kh, kw)
    arranged (M, kd C/G, kh, kw) sums every depth window's taps: the 3-D Conv as (N Do, M, Ho, Wo)
    (``depth_unfolded``). Returns (that input, the node of the last two axes)."""
    n, c, _, hh, ww = t.shape
    if c % groups:
        raise Refuse(f"{node.op_type} of {c} channels in {groups} groups")
    taps, plain, out = depth_taps(ctx, node, t, fill, kernel)
    taps = transposed(ctx, ctx.reshape(taps, (n, groups, c // groups, out, kernel[0], hh * ww)), (0, 3, 1, 4, 2, 5))
    return ctx.reshape(taps, (n * out, kernel[0] * c, hh, ww)), on_axes(plain, 2, [0, 1], group=groups)


def depth_unfolded(ctx, y: Tensor, n: int) -> Tensor:
    """A conv2d's output (N Do, M, Ho, Wo) of ``depth_folded``'s input as the 3-D Conv's (N, M, Do, Ho, Wo)."""
    nd, m, ho, wo = y.shape
    y = transposed(ctx, ctx.reshape(y, (n, nd // n, m, ho * wo)), (0, 2, 1, 3))
    return ctx.reshape(y, (n, m, nd // n, ho, wo))


def summed_windows(ctx, t: Tensor, kernel, strides, dilations, begin, outs) -> Tensor:
    """The window sums of t (N, C, spatial...), axis by axis: along each spatial axis, window o of ``outs`` sums
    inputs o s + j d - b over taps j < k, an input outside the axis read as 0 (a zero slice appended): a ``take`` of
    every window's taps, then ``sum`` over them. Refused where the taps would hold more than 2^24 values."""
    for axis, (k, s, d, b, out) in enumerate(zip(kernel, strides, dilations, begin, outs), start=2):
        n = t.shape[axis]
        taps = t.shape[:axis] + (out * k,) + t.shape[axis + 1:]
        if math.prod(taps) > MAX_DIM:  # before the taps' indices are allocated
            raise Refuse(f"its {out} x {k} windows along axis {axis} hold {math.prod(taps)} values, more than 2^24")
        idx = np.arange(out)[:, None] * s + np.arange(k) * d - b
        inside = (idx >= 0) & (idx < n)
        if not inside.all():
            pad = np.zeros(t.shape[:axis] + (1,) + t.shape[axis + 1:], np.int64)
            t = concatenated(ctx, axis, t, const(pad, t.dtype))
        idx = np.where(inside, idx, n).reshape(-1)
        v = ctx.result(ctx.op("take", t, const(idx.astype(np.int32), INT32), axis=axis), t.dtype, t.lo, t.hi, taps)
        v = ctx.reshape(v, t.shape[:axis] + (out, k) + t.shape[axis + 1:])
        lo, hi = k * min(t.lo, 0), k * max(t.hi, 0)
        t = ctx.reshape(reduced(ctx, "sum", v, [axis + 1], lo, hi), t.shape[:axis] + (out,) + t.shape[axis + 1:])
    return t


def transposed(ctx, t: Tensor, perm: tuple[int, ...]) -> Tensor:
    """t with its axes in the order ``perm`` (a constant folded)."""
    if t.is_const:
        return const(np.transpose(t.value, perm), t.dtype)
    shape = tuple(t.shape[p] for p in perm)
    return ctx.result(ctx.emit("transpose", t.entry, axes=perm), t.dtype, t.lo, t.hi, shape)


def without(shape: tuple[int, ...], axes: list[int]) -> tuple[int, ...]:
    """``shape`` less its ``axes``."""
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def with_ones(shape: tuple[int, ...], axes: list[int]) -> tuple[int, ...]:
    """``shape`` with axes of size 1 inserted at ``axes`` (positions in the result, ascending)."""
    out = list(shape)
    for a in axes:
        out.insert(a, 1)
    return tuple(out)


def attrs_2d(node, name: str, default: int | None, one_d: bool, fill: int) -> list[int]:
    """A per-spatial-axis attribute (values >= 1) of a 1-D or 2-D image, as 2 values (``fill`` first for 1-D);
    ``default`` None: required."""
    n = 1 if one_d else 2
    v = node.attr_ints(name, REQUIRED if default is None else [default] * n, lo=1, size=n)
    return [fill] + v if one_d else v


def conv_window(ctx, node, x4: Tensor, shape: tuple[int, ...], kernel: list[int]):
    """(x4, strides, dilations, begin, end) of a 1-D or 2-D Conv (or pooling) of an input of ONNX shape ``shape``
    (``x4`` its 2-D form) by a kernel of spatial size ``kernel``: 2 values each, negative pads cropped off x4."""
    one_d = len(shape) == 3
    strides = attrs_2d(node, "strides", 1, one_d, 1)
    dilations = attrs_2d(node, "dilations", 1, one_d, 1)
    begin, end = onnx_pads(node, shape[2:], kernel, strides[-len(shape) + 2:], dilations[-len(shape) + 2:])
    if one_d:
        begin, end = [0] + begin, [0] + end
    x4, begin, end = cropped(ctx, x4, begin, end)
    return x4, strides, dilations, begin, end


def nearest(ctx, x: Tensor, scales: list[int]) -> Tensor:
    """Nearest upsampling by integer scales: upsampling for (1, 1, s, s), else a repeat per stretched axis."""
    if all(s == 1 for s in scales):
        return x
    shape = tuple(d * s for d, s in zip(x.shape, scales))
    if x.is_const:
        v = x.value
        foldable(shape)
        for axis, s in enumerate(scales):
            v = np.repeat(v, s, axis=axis)
        return const(v, x.dtype)
    if len(scales) == 4 and scales[:2] == [1, 1] and scales[2] == scales[3]:
        return ctx.result(ctx.emit("upsampling", x.entry, scale=scales[2]), x.dtype, x.lo, x.hi, shape)
    e = x.entry
    for axis, s in enumerate(scales):
        if s > 1:
            e = ctx.emit("repeat", e, repeats=s, axis=axis)
    return ctx.result(e, x.dtype, x.lo, x.hi, shape)


def reduced(ctx, op: str, x: Tensor, axes: list[int], lo: int, hi: int) -> Tensor:
    """CVM ``op`` (sum, max) of x over ``axes``, dropped, with values in [lo, hi]; kept axes of size 1 go first
    (the CPU kernel misreads some of them)."""
    rank = len(x.shape)
    kept = [i for i in range(rank) if i not in axes and x.shape[i] > 1]
    if len(kept) + len(axes) < rank:
        x = ctx.reshape(x, tuple(x.shape[i] for i in sorted(kept + axes)))
        axes = [sorted(kept + axes).index(a) for a in axes]
    e = ctx.op(op, x, axis=tuple(axes), keepdims=False)
    return ctx.result(e, x.dtype, lo, hi, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def resized_shape(node, x: Tensor, scales: Tensor | None, sizes: Tensor | None) -> list[int]:
    """The output shape of Resize from ``sizes`` (stretch policy only) or constant ``scales`` over ``axes``: exactly
    one of them given (not empty), as ONNX requires."""
    rank = len(x.shape)
    axes = normal(node.attr_ints("axes", list(range(rank))), rank)
    full = list(x.shape)
    given = [t is not None and t.size > 0 for t in (scales, sizes)]
    if given.count(True) != 1:
        raise Refuse(f"Resize with {'both' if all(given) else 'neither'} scales {'and' if all(given) else 'nor'} "
                     "sizes: ONNX requires exactly one")
    if sizes is not None and sizes.size:
        if node.attr_str("keep_aspect_ratio_policy", "stretch") != "stretch":
            raise Refuse("Resize keep_aspect_ratio_policy other than stretch has no CVM form")
        values = ints(sizes, "Resize sizes")
        if len(values) != len(axes):
            raise Refuse(f"Resize sizes {values} must hold one value per axis ({len(axes)})")
        for a, v in zip(axes, values):
            full[a] = v
    elif scales is not None and scales.size:
        if not scales.is_const:
            raise Refuse("Resize scales must be a constant")
        values = scales.value.reshape(-1)
        if len(values) != len(axes):
            raise Refuse(f"Resize scales {values.tolist()} must hold one value per axis ({len(axes)})")
        for a, v in zip(axes, values):
            full[a] = scaled_size(x.shape[a], v)
    return full


def scaled_size(size: int, scale) -> int:
    """floor(size * scale) with the product rounded to float32 as onnxruntime computes it (3 x 1.6666666f is 5, where
    the exact product, 4.9999998, floors to 4), the output size of a scaled axis; refused unless finite and at most
    2^24."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = float(np.float32(size) * np.float32(scale))
    if not math.isfinite(out) or out > MAX_DIM:
        raise Refuse(f"scale {scale} of an axis of {size} gives no output size in [0, 2^24]")
    return math.floor(out)


def integer_scales(x: Tensor, out: list[int]) -> list[int]:
    if len(out) != len(x.shape) or any(not 1 <= d <= o <= MAX_DIM or o % d for o, d in zip(out, x.shape)):
        raise Refuse(f"resizing {x.shape} to {tuple(out)} is not an upsampling by integer scales")
    return [o // d for o, d in zip(out, x.shape)]


def resize_scales(node, shape: tuple[int, ...], full: list[int], scales, sizes) -> list[Fraction]:
    """The scale ONNX Resize uses per axis in its coordinates, exactly: out / size where ``sizes`` are given, else the
    float ``scales`` value (1 on the axes not listed)."""
    if sizes is not None and sizes.size:
        return [Fraction(o, d) if d else Fraction(1) for o, d in zip(full, shape)]
    rank = len(shape)
    out = [Fraction(1)] * rank
    for a, v in zip(normal(node.attr_ints("axes", list(range(rank))), rank), scales.value.reshape(-1)):
        if not v > 0:
            raise Refuse(f"Resize scale {v} must be > 0")
        out[a] = Fraction(float(v))
    return out


def resize_coordinate(mode: str, o: np.ndarray, size: int, out: int, scale: Fraction) -> tuple[np.ndarray, int]:
    """The input coordinate num / den (integers) ONNX Resize reads for outputs ``o`` at ``scale`` = p / q, exactly:
    half_pixel (o + 1/2) / scale - 1/2 = ((2o + 1) q - p) / 2p (pytorch_half_pixel: the same where out > 1, else
    0; half_pixel_symmetric: the same where size * scale is a whole number), asymmetric o q / p, align_corners
    o (size - 1) / (out - 1) (0 where out = 1), tf_half_pixel_for_nn (o + 1/2) / scale."""
    p, q = scale.numerator, scale.denominator
    if mode == "half_pixel_symmetric" and (size * scale).denominator != 1:
        raise Refuse(f"Resize half_pixel_symmetric where {size} x scale {float(scale)} is not a whole number has no "
                     "exact CVM form here")
    if mode in ("half_pixel", "half_pixel_symmetric") or (mode == "pytorch_half_pixel" and out > 1):
        return (2 * o + 1) * q - p, 2 * p
    if mode == "pytorch_half_pixel" or (mode == "align_corners" and out == 1):
        return 0 * o, 1
    if mode == "align_corners":
        return o * (size - 1), out - 1
    if mode == "asymmetric":
        return o * q, p
    if mode == "tf_half_pixel_for_nn":
        return (2 * o + 1) * q, 2 * p
    raise Refuse(f"Resize with coordinate_transformation_mode={mode} has no exact CVM form")
