"""Elementwise ops: abs, negative, cvm_precision, elemwise_add/sub, clip, cvm_clip, cvm_right_shift, cvm_left_shift.

Kernels take int32 arrays and compute in int64; casting the result back to int32 wraps exactly as the runtime's
int32 arithmetic does (e.g. abs/negative of INT32_MIN give INT32_MIN), which inputs within their precision never reach.
"""
from __future__ import annotations

import numpy as np

from ..constants import INT32_MAX, precision_bound
from .broadcast import BroadcastAdd, BroadcastSub
from .registry import Attr, Op, clip_to_precision, in_range, input_bound, number_precision, register, require


def round_shift(x, s: int):
    """The runtime's rounding right shift by s >= 1 (cvm_right_shift before its clip): ((x >> (s-1)) + 1) >> 1,
    i.e. floor((x + 2^(s-1)) / 2^s), round half up; for a Python int or an integer array wide enough for x."""
    return ((x >> (s - 1)) + 1) >> 1


def _clipped(lo: int, hi: int, low: int, high: int) -> list[tuple[int, int]]:
    """The interval of clip(x, low, high) for x in [lo, hi] (clip is monotone)."""
    return [(min(max(lo, low), high), min(max(hi, low), high))]


class _Unary(Op):
    """An attribute-less op on one tensor: output shape and precision are those of the input."""

    family = "elemwise"
    bound = staticmethod(input_bound)


@register
class Abs(_Unary):
    """|x|."""

    name = "abs"
    interval = staticmethod(lambda a, i: [(max(i[0][0], -i[0][1], 0), max(-i[0][0], i[0][1]))])

    @staticmethod
    def kernel(a, x):
        return np.abs(x.astype(np.int64)).astype(np.int32)


@register
class Negative(_Unary):
    """-x."""

    name = "negative"
    interval = staticmethod(lambda a, i: [(-i[0][1], -i[0][0])])

    @staticmethod
    def kernel(a, x):
        return (-x.astype(np.int64)).astype(np.int32)


@register
class CvmPrecision(_Unary):
    """The bit width of each element: the smallest i >= 1 with |x| < 2^i (0, +-1 -> 1; 127 -> 7). Precision 6."""

    name = "cvm_precision"
    bound = staticmethod(lambda a, s, b, v: [32])

    @staticmethod
    def precision(a, precisions, shapes):
        return 6

    @staticmethod
    def kernel(a, x):
        # frexp(m) = (f, e) with m = f * 2^e, 0.5 <= f < 1: e is the bit length of m, exact for |x| <= 2^31.
        _, e = np.frexp(np.abs(x.astype(np.int64)).astype(np.float64))
        return np.maximum(e, 1).astype(np.int32)


def _same_shape(a, lhs, rhs):
    require(lhs == rhs, f"elemwise inputs must have identical shapes, got {lhs} and {rhs}")
    return lhs


@register
class ElemwiseAdd(BroadcastAdd):
    """x + y for two tensors of identical shape (broadcast_add without broadcasting)."""

    name = "elemwise_add"
    step = None  # a run's scalar steps are broadcasts of one number
    family = "elemwise"
    shape = staticmethod(_same_shape)


@register
class ElemwiseSub(BroadcastSub):
    """x - y for two tensors of identical shape (broadcast_sub without broadcasting)."""

    name = "elemwise_sub"
    step = None  # a run's scalar steps are broadcasts of one number
    family = "elemwise"
    shape = staticmethod(_same_shape)


@register
class Clip(Op):
    """max(min(a_max, x), a_min); both bounds in [-(2^31-1), 2^31-1] and a_min < a_max.

    Precision GetNumberPrecision(max(|a_min|, |a_max|)); like the runtime, the a_min < a_max rule is checked
    by precision inference.
    """

    name = "clip"
    step = "clip"
    family = "elemwise"
    bound = staticmethod(lambda a, s, b, v: [max(abs(a.a_min), abs(a.a_max))])
    interval = staticmethod(lambda a, i: _clipped(*i[0], a.a_min, a.a_max))
    attrs = (
        Attr("a_min", "int", check=in_range(-INT32_MAX, INT32_MAX)),
        Attr("a_max", "int", check=in_range(-INT32_MAX, INT32_MAX)),
    )

    @staticmethod
    def precision(a, precisions, shapes):
        require(a.a_min < a.a_max, f"clip needs a_min < a_max, got a_min={a.a_min}, a_max={a.a_max}")
        return number_precision(max(abs(a.a_min), abs(a.a_max)))

    @staticmethod
    def kernel(a, x):
        return np.maximum(np.minimum(x, a.a_max), a.a_min).astype(np.int32)

    @classmethod
    def nonnegative(cls, a, inputs):
        return a.a_min >= 0 or inputs and a.a_max >= 0


PRECISION = Attr("precision", "int", check=in_range(1, 32))
SHIFT_BIT = Attr("shift_bit", "int", check=in_range(1, 32))
IS_SIGN = Attr("is_sign", "bool", True)  # accepted and ignored, as by the runtime's kernels


class _Requantize(Op):
    """cvm_clip and the shifts: the output precision is the ``precision`` attribute."""

    family = "elemwise"
    attrs = (PRECISION, SHIFT_BIT, IS_SIGN)

    @staticmethod
    def precision(a, precisions, shapes):
        return a.precision


@register
class CvmClip(_Requantize):
    """Symmetric clip to +-(2^(p-1)-1)."""

    name = "cvm_clip"
    keeps_nonnegative = True
    step = "limit"
    bound = staticmethod(lambda a, s, b, v: [min(precision_bound(a.precision), b[0])])
    interval = staticmethod(lambda a, i: _clipped(*i[0], -precision_bound(a.precision), precision_bound(a.precision)))
    attrs = (PRECISION, IS_SIGN)

    @staticmethod
    def kernel(a, x):
        return clip_to_precision(x, a.precision)


@register
class CvmRightShift(_Requantize):
    """Rounding arithmetic right shift, then symmetric clip: clip(round_shift(x, s), p)."""

    name = "cvm_right_shift"
    keeps_nonnegative = True
    step = "shift"
    bound = staticmethod(lambda a, s, b, v: [min(precision_bound(a.precision), (b[0] >> a.shift_bit) + 1)])
    interval = staticmethod(lambda a, i: _clipped(*(round_shift(v, a.shift_bit) for v in i[0]),
                                                  -precision_bound(a.precision), precision_bound(a.precision)))

    @staticmethod
    def kernel(a, x):
        s = a.shift_bit
        if x.dtype == np.int32 and 1 <= s <= 31:  # round_shift as (x >> s) + bit s-1 of x: in int32, no int64 copy
            y = x >> (s - 1)
            bit = y & 1
            y >>= 1
            y += bit
            r = precision_bound(a.precision)
            return np.clip(y, -r, r, out=y)
        return clip_to_precision(round_shift(x.astype(np.int64), s), a.precision)

    @staticmethod
    def warnings(a, shapes, precisions):
        out = []
        if a.shift_bit >= 31:
            out.append(f"shift_bit={a.shift_bit} >= 31: the runtime's CPU device returns x >> 31 instead")
        elif a.precision + a.shift_bit >= 32:
            out.append(f"precision+shift_bit={a.precision + a.shift_bit} >= 32: the runtime's CPU device skips the clip")
        return out


@register
class CvmLeftShift(_Requantize):
    """Left shift, then symmetric clip: clip(x << s, p). Needs p_in + shift_bit <= 32, so x << s fits in int32.

    The shift wraps in int32 before the clip, as the FORMAL kernel's does (only reachable outside the precision).
    """

    name = "cvm_left_shift"
    keeps_nonnegative = True
    step = "left_shift"
    bound = staticmethod(lambda a, s, b, v: [min(precision_bound(a.precision), b[0] << a.shift_bit)])

    @staticmethod
    def precision(a, precisions, shapes):
        require(precisions[0] + a.shift_bit <= 32,
                f"cvm_left_shift needs input precision + shift_bit <= 32, got {precisions[0]} + {a.shift_bit}")
        return a.precision

    @staticmethod
    def kernel(a, x):
        return clip_to_precision((x.astype(np.int64) << a.shift_bit).astype(np.int32), a.precision)

    @staticmethod
    def warnings(a, shapes, precisions):
        return ["the runtime's CPU and CUDA cvm_left_shift kernels always fail (ERROR_RUNTIME); "
                "use broadcast_mul by 2^shift_bit and cvm_clip instead"]
