"""Elementwise ops: abs, negative, cvm_precision, elemwise_add/sub, clip, cvm_clip, cvm_right_shift, cvm_left_shift."""
from __future__ import annotations

import numpy as np

from .registry import Attr, Op, in_range, register, clip_to_precision


@register
class CvmRightShift(Op):
    """Rounding arithmetic right shift, then symmetric clip: clip(((x >> (s-1)) + 1) >> 1, p)."""

    name = "cvm_right_shift"
    family = "elemwise"
    attrs = (
        Attr("precision", "int", check=in_range(1, 32)),
        Attr("shift_bit", "int", check=in_range(1, 32)),
        Attr("is_sign", "bool", True),
    )

    @staticmethod
    def precision(a, precisions, shapes):
        return a.precision

    @staticmethod
    def kernel(a, x):
        t = ((x.astype(np.int64) >> (a.shift_bit - 1)) + 1) >> 1
        return clip_to_precision(t, a.precision)

    @staticmethod
    def warnings(a, shapes, precisions):
        out = []
        if a.shift_bit >= 31:
            out.append(f"shift_bit={a.shift_bit} >= 31: the runtime's CPU device returns x >> 31 instead")
        elif a.precision + a.shift_bit >= 32:
            out.append(f"precision+shift_bit={a.precision + a.shift_bit} >= 32: the runtime's CPU device skips the clip")
        return out
