"""Forms computed by evaluating the ONNX node itself, with onnx's reference implementation, on constants.

* ``table``: an elementwise node whose one variable operand takes few values. Its proven interval [lo, hi] holds
  every value it can take, so the node's output at each output position is one of n * R values (n positions of
  the constant operands, R = hi - lo + 1): the table of those values, computed once, and ``take`` at index
  j * R + (v - lo) give exactly the node's output, including whatever ONNX defines for wrapping, shifts past the
  width or signs. Used where no arithmetic form covers a variable operand (a shift amount, an exponent).
* ``affine``: a node whose one variable input is a scalar s on which its output depends affinely (a zero point
  of MatMulInteger or ConvInteger): y(s) = y(0) + s * (y(1) - y(0)) exactly, both constants evaluated here.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import onnx

from .context import INT32, INT32_MAX, Tensor, const, cvm_shape, foldable
from .emit import broadcast_of
from .registry import Refuse
MAX_TABLE = 1 << 16  # entries of a table (the variable's values times the constant operands' positions)


def evaluate(node, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The node's outputs on constant inputs, by onnx's reference implementation (its opset's semantics)."""
    from onnx.reference import ReferenceEvaluator

    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            return ReferenceEvaluator(node.proto, opsets={"": node.opset}).run(None, feeds)
    except Exception as e:  # noqa: BLE001  (the reference raises what numpy raises)
        raise Refuse(f"onnx's reference implementation cannot evaluate it on constants: {e}") from None


def _integers(v: np.ndarray, what: str) -> np.ndarray:
    if v.dtype.kind == "f" and not (np.isfinite(v).all() and np.array_equal(v, np.round(v))):
        raise Refuse(f"{what} holds non-integer values")
    peak = max(-int(v.min()), int(v.max()), 0) if v.size else 0
    if peak > INT32_MAX:
        raise Refuse(f"precision bound exceeded: {what} reaches {peak}, beyond CVM's 32 bits")
    return v.astype(np.int64)


def table(ctx, node, ins: list[Tensor | None], dtype: int) -> Tensor:
    """The elementwise ``node`` on ``ins`` (one variable, the others constant) as a lookup: take(table, index)."""
    names = list(node.proto.input)
    var = [k for k, t in enumerate(ins) if t is not None and not t.is_const]
    if len({names[k] for k in var}) != 1:
        raise Refuse("a table needs exactly one variable operand")
    v = ins[var[0]]
    consts = {names[k]: t for k, t in enumerate(ins) if t is not None and t.is_const}
    cshape = broadcast_of(*(t.shape for t in consts.values())) if consts else ()
    out_shape = broadcast_of(v.shape, cshape)
    n, r = math.prod(cshape), v.hi - v.lo + 1
    if n * r > MAX_TABLE:
        raise Refuse(f"no arithmetic form, and a table over the variable operand's {r} values at {n} positions "
                     f"would hold {n * r} entries (at most {MAX_TABLE})")
    grid = np.arange(v.lo, v.hi + 1).astype(onnx.helper.tensor_dtype_to_np_dtype(v.dtype)).reshape(1, r)
    feeds = {name: np.broadcast_to(t.value, cshape).reshape(n, 1) for name, t in consts.items()}
    feeds[names[var[0]]] = grid
    values = _integers(np.broadcast_to(evaluate(node, feeds)[0], (n, r)).reshape(-1), "its table")
    offset = ctx.result(ctx.op("broadcast_sub", v, const(np.full((1,) * len(cvm_shape(v.shape)), v.lo), INT32)),
                        INT32, 0, r - 1, v.shape) if v.lo else v
    if n > 1:
        rows = const(np.arange(n).reshape(cshape) * r, INT32)
        index = ctx.result(ctx.op("broadcast_add", offset, rows), INT32, 0, n * r - 1, out_shape)
    else:
        index = ctx.broadcast_to(ctx.reshape(offset, (1,) * (len(out_shape) - len(v.shape)) + v.shape), out_shape)
    e = ctx.op("take", const(values, INT32), index)
    return ctx.result(e, dtype, int(values.min()), int(values.max()), out_shape)


def affine(ctx, node, ins: list[Tensor | None], k: int, dtype: int, axis: int) -> Tensor:
    """``node`` whose only variable input, ``ins[k]``, is a scalar s, or a vector whose element c only output
    slice c along ``axis`` reads, on which the node depends affinely: y(0) + s * (y(1) - y(0)) with s along
    ``axis`` -> broadcast_mul and broadcast_add."""
    s = ins[k]
    if any(t is not None and not t.is_const for i, t in enumerate(ins) if i != k):
        raise Refuse("an affine form needs one variable input")
    np_type = onnx.helper.tensor_dtype_to_np_dtype(s.dtype)
    feeds = {name: t.value for name, t in zip(node.proto.input, ins) if t is not None and t.is_const}
    y0, y1 = (_integers(evaluate(node, {**feeds, node.proto.input[k]: np.full(s.shape, z, np_type)})[0],
                        "the product") for z in (0, 1))
    slope, base = y1 - y0, y0
    foldable(base.shape)
    terms = [s.lo * slope, s.hi * slope]  # s * slope at the ends of s's interval, per element
    lo, hi = np.minimum(*terms), np.maximum(*terms)
    along = [1] * len(cvm_shape(base.shape))
    if s.size > 1:
        along[axis % len(along)] = s.size
    sv = ctx.reshape(s, tuple(along))
    m = ctx.result(ctx.op("broadcast_mul", const(slope, INT32), sv), INT32, int(lo.min()), int(hi.max()), base.shape)
    e = ctx.op("broadcast_add", m, const(base, INT32))
    return ctx.result(e, dtype, int((base + lo).min()), int((base + hi).max()), base.shape)
