"""Reductions: sum and max over axes, as the runtime's FORMAL kernels compute them.

Axes are normalised (a negative axis gets +ndim), must lie in [0, ndim-1] and be distinct; ``exclude`` reduces
the axes not listed. Three paths, as in the runtime:

* ``axis=()`` reduces every axis (whatever ``exclude`` says). With ``exclude=False`` the accumulator starts at 0,
  so ``max`` of all-negative data is 0 (the math doc says the true maximum; the runtime, on every device, says 0);
  ``sum`` is unaffected.
* ``exclude=True`` with every axis listed reduces nothing: an identity copy.
* otherwise the accumulator starts from the first element of each reduced window.

The output shape keeps reduced axes as 1 with ``keepdims``; without it they are dropped, and a reduction over
every axis gives (1,). The sum accumulates in int32 (wrapping); the kernel sums in int64 and casts, which is equal.
``dtype`` must be one of the runtime's enum names (``DTYPES``) and is otherwise ignored: every output is int32.
"""
from __future__ import annotations

from math import prod
from typing import ClassVar

import numpy as np

from .registry import Attr, Op, Shape, bits, input_bound, one_of, register, require

DTYPES = ("float16", "float32", "float64", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64")


def reduced_axes(a, ndim: int) -> tuple[int, ...]:
    """The axes the runtime reduces over, ascending."""
    if not a.axis:
        return tuple(range(ndim))
    for i in a.axis:
        require(-ndim <= i < ndim, f"reduce axis {i} must lie in [-{ndim}, {ndim - 1}] for a {ndim}-D input")
    axes = [i + ndim if i < 0 else i for i in a.axis]
    require(len(set(axes)) == len(axes), f"reduce axes {a.axis} must be distinct once normalised, got {axes}")
    return tuple(i for i in range(ndim) if (i in axes) != a.exclude)


def _cpu_misreads(shape: Shape, reduced: tuple[int, ...]) -> bool:
    """Whether the runtime's CPU kernel reads wrong elements on its general path.

    It maps the output's dims of size > 1, right to left, onto the input's kept axes, right to left, counting
    kept axes of size 1 too; it goes wrong where the strides of the paired axes differ, i.e. where a kept
    axis of size 1 lies right of a reduced axis that has a wider kept axis to its left.
    """
    kept = [i for i in range(len(shape)) if i not in reduced]
    wide = [i for i in kept if shape[i] > 1]
    stride = lambda i: prod(shape[i + 1:])  # noqa: E731
    return any(stride(k) != stride(w) for k, w in zip(kept[::-1], wide[::-1]))


class _Reduce(Op):
    """sum/max: one input, the reduce attributes, shape rules; subclasses give the accumulation ufunc."""

    family = "reduce"
    ufunc: ClassVar[np.ufunc]
    attrs = (
        Attr("axis", "tuple", ()),
        Attr("keepdims", "bool", False),
        Attr("exclude", "bool", False),
        Attr("dtype", "str", "int32", check=one_of(*DTYPES)),
    )

    @staticmethod
    def shape(a, x: Shape) -> Shape:
        r = reduced_axes(a, len(x))
        if a.keepdims:
            return tuple(1 if i in r else d for i, d in enumerate(x))
        return tuple(d for i, d in enumerate(x) if i not in r) or (1,)

    @classmethod
    def kernel(cls, a, x):
        r = reduced_axes(a, x.ndim)
        if not r:
            return x.astype(np.int32, copy=True)
        x64 = x.astype(np.int64)
        if not a.axis and not a.exclude:
            y = cls.ufunc.reduce(x64, axis=None, initial=0)
        else:
            y = cls.ufunc.reduce(x64, axis=r)
        return np.reshape(y, cls.shape(a, x.shape)).astype(np.int32)

    @staticmethod
    def warnings(a, shapes, precisions):
        r = reduced_axes(a, len(shapes[0]))
        if r and _cpu_misreads(shapes[0], r):
            return [f"reducing axes {r} of shape {shapes[0]}: the runtime's CPU kernel reads wrong elements when "
                    "a kept axis of size 1 lies right of a reduced axis (FORMAL, followed here, is right)"]
        return []


@register
class Sum(_Reduce):
    """Sum over the reduced axes; precision p_in + bits(in_size / out_size)."""

    name = "sum"
    bound = staticmethod(lambda a, s, b, v: [b[0] * (prod(s[0]) // prod(Sum.infer_shapes(a, s)[0]))])
    ufunc = np.add

    @classmethod
    def precision(cls, a, precisions, shapes):
        return precisions[0] + bits(prod(shapes[0]) // prod(cls.shape(a, shapes[0])))

    @staticmethod
    def base_ops(a, shapes, out):
        """The elements summed into each output: input size / output size."""
        return prod(shapes[0]) // prod(out)


@register
class Max(_Reduce):
    """Max over the reduced axes (from 0 for the default axis=()); precision p_in."""

    name = "max"
    keeps_nonnegative = True
    bound = staticmethod(input_bound)
    ufunc = np.maximum

    @classmethod
    def warnings(cls, a, shapes, precisions):
        out = super().warnings(a, shapes, precisions)
        if not a.axis and not a.exclude:
            out.append("max with the default axis=() starts from 0 on the runtime (every device): all-negative "
                       "data gives 0, not its maximum; list the axes to get the true maximum")
        return out
