"""The dequantized values: float tensors held exactly as integers with rational scales (``Scaled``, ``Summed``,
``Mapped``, ``Softmaxed``, a ``Deferred`` form; ``Real`` is any of them), and reading their scales, zero points and
axes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np
from onnx import TensorProto

from ..context import INT_RANGES, Tensor, type_name
from ..emit import broadcast_shape
from ..registry import Refuse

QUANTIZED_TYPES = (TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16)
MS = "com.microsoft"
#: A zero point this far from 0 (a dead channel's bias, kept out of conv2d by ``accumulate``) has no CVM label:
#: the products keep such biases out, and the QuantizeLinear settles those rows to their one value.
FAR = 1 << 30


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
    top: tuple[int, ...] | None = None  # only its value at the max, of this shape (1 / sum e^(x - max))
    keep: "Deferred | None" = None  # a masked Softmax's mask (``qdq.Mask``), broadcasting to x
    absorbed: tuple[bool, ...] = ()  # per mask level: it absorbs every x in float32 (a row at that level: uniform)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.x.shape if self.top is None else self.top


class Deferred:
    """A float value with an integer form of its own (LayerNormalization's ``Normalized``), which the QuantizeLinear
    that follows makes by calling ``quantized(ctx, scale, out_zero, dtype)``; ``what`` names it."""

    what: str


Real = (Scaled, Summed, Mapped, Softmaxed, Deferred)


def sum_of(terms) -> Scaled | Summed:
    """The sum of ``terms`` less its constant terms equal to their zero points throughout, where the others still
    broadcast to the sum's shape: (t - z) s = 0 at any scale s (quantize_static's all-zero table at scale 1 beside
    scores at 1e-12, whose multiplier no common shift holds); a sum of one term is that term."""
    shape = broadcast_shape(*(t.t for t in terms))
    kept = [t for t in terms if not (t.t.is_const and t.clip == (None, None) and
                                     not (np.asarray(t.t.value, np.int64) - t.zero).any())]
    if kept and len(kept) < len(terms) and broadcast_shape(*(t.t for t in kept)) == shape:
        terms = kept
    return terms[0] if len(terms) == 1 else Summed(tuple(terms), shape)


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


#: The int16 grids of a value computed after the last QuantizeLinear (a float output's, and one an L2 normalization
#: reads): 2^j - 1 steps each way, j from 15 down to 8; each takes the finest that has a plan.
TAIL_GRIDS = tuple(32767 >> j for j in range(8))


def least_float32(m: float, steps: int) -> np.float32:
    """The least float32 s with steps * s >= m (the scale of a grid of ``steps`` steps each way holding [-m, m])."""
    s = np.float32(m / steps)
    while float(s) * steps < m:
        s = np.nextafter(s, np.float32(np.inf))
    return s


def squares_pass_float32(n: int, top) -> bool:
    """Whether a float32 sum of n squares of values up to ``top`` in size may pass float32's range: n top^2 >= 2^127
    (below it every partial sum stays finite)."""
    return n * top * top >= 2**127


def float32_sum(x: Scaled, n: int, what: str, p: int = 2) -> None:
    """Refuses a per-tensor x = (t - z) s where a float32 sum of n p-th powers (|x| or x^2) of its values may pass
    float32's range (n (P s)^p >= 2^127, P the largest |t - z|; below it every partial sum stays finite):
    onnxruntime's sum is inf there (an Lp normalization 0, a norm or root inf), the import's exact sum finite; and
    squares where s^2 < 2^-126: the square of a value one step from z is below float32's normal range there, where
    onnxruntime's float32 squares lose their precision (0 below 2^-149: an L2 normalization 0), the import's exact."""
    z = int(x.zero.reshape(()))
    peak, s = max(z - x.t.lo, x.t.hi - z, 0), x.scale.reshape(()).item()
    if (n * peak * s >= 2**127) if p == 1 else squares_pass_float32(n, peak * s):
        raise Refuse(f"{what} of {n} {'squares of values' if p == 2 else 'values'} up to {peak} x {float(s):g}: it "
                     "passes float32's range, where onnxruntime computes it as inf")
    if p == 2 and peak and s * s < Fraction(1, 2**126):
        raise Refuse(f"{what} of squares of values at scale {float(s):g}: a square of one step, s^2 < 2^-126, is "
                     "below float32's normal range, where onnxruntime's float32 squares lose their precision")


def scaled(x, what: str, clipped_ok: bool = False) -> Scaled:
    """``x`` as a ``Scaled``, or why it has no integer form here."""
    if isinstance(x, Scaled):
        if x.clip != (None, None) and not clipped_ok:
            raise Refuse(f"a Clip off the quantization grid must be followed by QuantizeLinear, not {what}")
        return x
    if isinstance(x, Tensor):
        raise Refuse(f"{what} is a float tensor that no DequantizeLinear produced: it has no integer form")
    raise Refuse(f"{what} ({'a sum' if isinstance(x, Summed) else x.what}) must be quantized (QuantizeLinear) first")


def of_integers(t: Tensor) -> Scaled:
    """A float tensor the importer holds as integers (the first float tensor after an integer input: a Cast, a
    OneHot) as the real value it is: its integers at scale 1, zero point 0."""
    return Scaled(t, np.asarray(Fraction(1), dtype=object), np.zeros((), np.int64))


#: Float ops whose float rule takes a float tensor of integers beside a float constant exactly (a uint8 image's
#: (x - mean) / std inside the model): the scale carries the constant factor, a sum the constant term.
AFFINE = ("Add", "Sub", "Mul", "Div")


def quantized_affines(graph) -> set[str]:
    """The outputs of the ``AFFINE`` nodes a chain of such nodes takes to a QuantizeLinear: where a float tensor of
    integers may be taken as the real value it is (elsewhere, as in an integer model, the integer rules decide)."""
    producer = {o: n for n in graph.node for o in n.output}
    found: set[str] = set()
    todo = [n.input[0] for n in graph.node if n.op_type == "QuantizeLinear" and n.input]
    while todo:
        n = producer.get(todo.pop())
        if n is None or n.op_type not in AFFINE or n.domain not in ("", "ai.onnx") or n.output[0] in found:
            continue
        found.add(n.output[0])
        todo += list(n.input)
    return found


def affine_of_integers(op: str, ins: list) -> bool:
    """Whether ``op`` reads a computed float tensor of integers (``of_integers``) and a float constant that the
    integer rules would refuse: Add, Sub or Mul by a constant of non-integer values, Div of that tensor by any
    constant (a float Div is no integer division)."""
    if op not in AFFINE or len(ins) != 2 or any(not isinstance(x, Tensor) for x in ins):
        return False
    computed = [x for x in ins if not x.is_const]
    constant = [x for x in ins if x.is_const]
    if len(computed) != 1 or computed[0].dtype != TensorProto.FLOAT or constant[0].value.dtype.kind != "f":
        return False
    if op == "Div":
        return ins[0] is computed[0]
    return not np.array_equal(constant[0].value, np.round(constant[0].value))


def real_bound(t: Tensor | Scaled | None, what: str, open_end: float | None = None) -> Fraction | None:
    """The real value of an optional constant scalar bound (Clip min/max, a Pad value); None for none or for
    ``open_end`` (Clip's min -inf, max inf: no bound); any other value not finite refused (a Clip min of inf or NaN
    makes every value that). A quantized constant (quantize_static quantizes a Pad's constant_value:
    DequantizeLinear of an integer q) is its exact value (q - zero) * scale, as every dequantized value is here."""
    if t is None:
        return None
    if isinstance(t, Scaled) and t.per_tensor and isinstance(t.t, Tensor) and t.t.is_const and t.t.value.size == 1:
        return (int(np.asarray(t.t.value).reshape(())) - int(t.zero.reshape(()))) * Fraction(t.scale.reshape(()).item())
    if not isinstance(t, Tensor) or not t.is_const or t.value.size != 1:
        raise Refuse(f"{what} must be a constant scalar")
    v = float(np.asarray(t.value).reshape(()))
    if v == open_end:
        return None
    if not math.isfinite(v):
        raise Refuse(f"{what} {v} must be finite{'' if open_end is None else f' or {open_end}'}")
    return Fraction(v)
