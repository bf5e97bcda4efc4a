"""Import rules of the elementwise ONNX ops and of the ones that only name values (Identity, Constant, Cast, Shape).

Arithmetic is imported when the operands' intervals prove that ONNX computes the exact result (no wrap in the
element type, no float rounding) within 32 bits; CVM then computes the same. Constant operands are folded with
numpy in the ONNX element type (wrapping as ONNX does), or become params.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from onnx import TensorProto, helper

from .checks import tensor_array
from .context import (FLOAT_EXACT, Tensor, bound, check_values, const, cvm_shape, foldable, is_supported_type, tight,
                      type_name)
from .registry import Refuse, rule

BOOL = TensorProto.BOOL


def np_type(dtype: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(dtype))


def broadcast_shape(*ts: Tensor) -> tuple[int, ...]:
    """ONNX multidirectional (numpy) broadcasting of the operands' shapes."""
    try:
        return tuple(np.broadcast_shapes(*(t.shape for t in ts)))
    except ValueError:
        raise Refuse(f"shapes {[t.shape for t in ts]} do not broadcast") from None


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


# -- arithmetic -------------------------------------------------------------------------------------------------
ARITHMETIC = {"Add": ("broadcast_add", np.add), "Sub": ("broadcast_sub", np.subtract),
              "Mul": ("broadcast_mul", np.multiply)}


def _interval(op: str, a: Tensor, b: Tensor) -> tuple[int, int]:
    if op == "Add":
        return a.lo + b.lo, a.hi + b.hi
    if op == "Sub":
        return a.lo - b.hi, a.hi - b.lo
    products = [x * y for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    return min(products), max(products)


@rule("Add", "Sub", "Mul")
def arithmetic(ctx, node, a, b):
    """x + y, x - y, x * y -> broadcast_add/sub/mul: exact when the result interval fits the element type."""
    cvm, fn = ARITHMETIC[node.op_type]
    if a.is_const and b.is_const:
        foldable(broadcast_shape(a, b))
        return folded(fn(a.value, b.value), a.dtype)
    lo, hi = _interval(node.op_type, a, b)
    check_values(a.dtype, lo, hi)
    return ctx.result(ctx.op(cvm, a, b), a.dtype, lo, hi, broadcast_shape(a, b))


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))


@rule("Div")
def div(ctx, node, a, b):
    """Integer x / y truncated toward zero -> broadcast_div (which also truncates). A zero divisor is undefined
    in ONNX (onnxruntime dies of SIGFPE) and 0 in CVM; a constant one is refused."""
    if a.dtype in FLOAT_EXACT:
        raise Refuse(f"{type_name(a.dtype)} Div is not integer division: no exact CVM form")
    if b.is_const and (b.value == 0).any():
        raise Refuse("division by a constant zero")
    if a.is_const and b.is_const:
        foldable(broadcast_shape(a, b))
        return folded(_trunc_div(a.value.astype(np.int64), b.value.astype(np.int64)), a.dtype)
    if b.is_const:
        least = int(np.abs(b.value.astype(np.int64)).min())
    else:
        least = b.lo if b.lo > 0 else -b.hi if b.hi < 0 else 1
    m = a.peak // least
    lo = 0 if a.lo >= 0 and b.lo >= 0 else -m
    return ctx.result(ctx.op("broadcast_div", a, b), a.dtype, lo, m, broadcast_shape(a, b))


@rule("Max", "Min", since=8)
def extremum(ctx, node, *xs):
    """max/min of any number of operands -> broadcast_max (min(x, y) = -max(-x, -y))."""
    sign = 1 if node.op_type == "Max" else -1
    acc = _signed(ctx, xs[0], sign)
    for x in xs[1:]:
        x = _signed(ctx, x, sign)
        if acc.is_const and x.is_const:
            foldable(broadcast_shape(acc, x))
            acc = folded(np.maximum(acc.value, x.value), acc.dtype)
            continue
        check_values(acc.dtype, max(acc.lo, x.lo), max(acc.hi, x.hi))
        acc = ctx.result(ctx.op("broadcast_max", acc, x), acc.dtype, max(acc.lo, x.lo), max(acc.hi, x.hi),
                         broadcast_shape(acc, x))
    return _signed(ctx, acc, sign)


def _signed(ctx, x: Tensor, sign: int) -> Tensor:
    return x if sign > 0 else negative(ctx, None, x)


@rule("Greater", "Less")
def greater(ctx, node, a, b):
    """x > y -> broadcast_greater (1 or 0); x < y is y > x."""
    if node.op_type == "Less":
        a, b = b, a
    if a.is_const and b.is_const:
        return const(np.greater(a.value, b.value), BOOL)
    return ctx.result(ctx.op("broadcast_greater", a, b), BOOL, 0, 1, broadcast_shape(a, b))


@rule("Neg", since=6)
def negative(ctx, node, x):
    """-x -> negative."""
    if x.is_const:
        return folded(-x.value, x.dtype)
    check_values(x.dtype, -x.hi, -x.lo)
    return ctx.result(ctx.emit("negative", x.entry), x.dtype, -x.hi, -x.lo, x.shape)


@rule("Abs", since=6)
def abs_(ctx, node, x):
    """|x| -> abs."""
    if x.is_const:
        return folded(np.abs(x.value), x.dtype)
    lo = x.lo if x.lo >= 0 else -x.hi if x.hi <= 0 else 0
    return ctx.result(ctx.emit("abs", x.entry), x.dtype, lo, x.peak, x.shape)


@rule("Relu", since=6)
def relu(ctx, node, x):
    """max(x, 0) -> relu."""
    if x.is_const:
        return folded(np.maximum(x.value, 0), x.dtype)
    return ctx.result(ctx.emit("relu", x.entry), x.dtype, max(x.lo, 0), max(x.hi, 0), x.shape)


FLOAT_MAX = 3.4e38  # the float attributes of Clip before opset 11 default to +-FLT_MAX: no bound


@rule("Clip", since=6)
def clip(ctx, node, x, lo_t=None, hi_t=None):
    """min(max(x, lo), hi): nothing where the interval already lies within; cvm_clip(p) for +-(2^(p-1)-1);
    else clip with the bounds tightened to the interval (equal on every value x takes)."""
    if node.opset < 11:
        lo, hi = (node.attr_float(k, None) for k in ("min", "max"))
        lo, hi = (None if v is None or abs(v) >= FLOAT_MAX else v for v in (lo, hi))
        if any(v is not None and not float(v).is_integer() for v in (lo, hi)):
            raise Refuse(f"Clip bounds {lo}, {hi} are not integers")
        lo, hi = (None if v is None else int(v) for v in (lo, hi))
    else:
        lo, hi = scalar(lo_t, "Clip min"), scalar(hi_t, "Clip max")
    cmin = min(x.lo, hi if hi is not None else x.lo) if lo is None else lo
    cmax = max(x.hi, cmin) if hi is None else hi
    if cmin > cmax:  # min(max(x, lo), hi) is hi everywhere
        return folded(np.full(foldable(x.shape), cmax), x.dtype)
    if cmin <= x.lo and x.hi <= cmax:
        return x
    if x.is_const:
        return folded(np.minimum(np.maximum(x.value, cmin), cmax), x.dtype)
    new_lo, new_hi = min(max(x.lo, cmin), cmax), max(min(x.hi, cmax), cmin)
    if new_lo == new_hi:  # every value clipped to one bound
        return folded(np.full(foldable(x.shape), new_lo), x.dtype)
    if cmin == -cmax and cmax == bound(tight(cmax)):
        e = ctx.emit("cvm_clip", x.entry, precision=tight(cmax))
    else:
        e = ctx.emit("clip", x.entry, a_min=new_lo, a_max=new_hi)
    return ctx.result(e, x.dtype, new_lo, new_hi, x.shape)


@rule("Where", since=9)
def where(ctx, node, c, x, y):
    """cond ? x : y -> where, every operand broadcast to the output shape (a full-shape condition), the
    condition's label widened to x's and y's, since where's output takes it."""
    shape = broadcast_shape(c, x, y)
    if c.is_const and x.is_const and y.is_const:
        foldable(shape)
        return folded(np.where(c.value, x.value, y.value), x.dtype)
    c, x, y = (ctx.broadcast_to(t, shape) for t in (c, x, y))
    xe, ye = ctx.entry(x), ctx.entry(y)
    ce, width = ctx.entry(c), max(ctx.type_of(xe).precision, ctx.type_of(ye).precision)
    if ctx.type_of(ce).precision < width:  # where takes its label from the condition: widen it (0/1 stay)
        ce = ctx.emit("cvm_clip", ce, precision=width)
    return ctx.result(ctx.emit("where", ce, xe, ye), x.dtype, min(x.lo, y.lo), max(x.hi, y.hi), shape)


# -- values that only get a name or a type ----------------------------------------------------------------------
@rule("Identity", since=1)
def identity(ctx, node, x):
    return x


#: Constant's scalar and list attributes: (reader, numpy type, ONNX type of the value).
CONSTANT_VALUES = {"value_int": ("attr_int", np.int64, TensorProto.INT64),
                   "value_ints": ("attr_ints", np.int64, TensorProto.INT64),
                   "value_float": ("attr_float", np.float32, TensorProto.FLOAT),
                   "value_floats": ("attr_floats", np.float32, TensorProto.FLOAT)}


@rule("Constant", since=1)
def constant(ctx, node):
    """The value of a Constant node (tensor, int(s) or float(s))."""
    a = node.proto.attribute[0] if len(node.proto.attribute) == 1 else None
    if a is not None and a.name == "value":
        t = node.attr_tensor("value")
        return const(tensor_array(t, ctx.base_dir), t.data_type)
    if a is not None and a.name in CONSTANT_VALUES:
        reader, np_dtype, dtype = CONSTANT_VALUES[a.name]
        return const(np.array(getattr(node, reader)(a.name), np_dtype), dtype)
    raise Refuse(f"Constant {a.name if a is not None else 'without one value'} has no CVM form")


def cast(ctx, x: Tensor, to: int) -> Tensor:
    """``x`` as element type ``to``: the same CVM values where no value changes (else refused); != 0 for bool."""
    if not is_supported_type(to):
        raise Refuse(f"Cast to non-integer type {type_name(to)}")
    if x.is_const:  # a widened param (the exporter's Cast of an int8 initializer) keeps its name
        y = folded(x.value, to)
        return replace(y, name=x.name) if np.array_equal(y.value, x.value) else y
    if to == BOOL and not 0 <= x.lo <= x.hi <= 1:
        nonzero = Tensor(x.dtype, x.shape, 0, x.peak, ctx.emit("abs", x.entry))
        zero = const(np.zeros((1,) * len(cvm_shape(x.shape)), np.int32), TensorProto.INT32)
        return ctx.result(ctx.op("broadcast_greater", nonzero, zero), BOOL, 0, 1, x.shape)
    check_values(to, x.lo, x.hi)
    return replace(x, dtype=to)


@rule("Cast", since=6)
def cast_rule(ctx, node, x):
    """Cast between integer types (and floats carrying integers) where no value changes."""
    return cast(ctx, x, node.attr_int("to"))


@rule("CastLike", since=15)
def cast_like(ctx, node, x, like):
    return cast(ctx, x, like.dtype)


@rule("Shape", since=1)
def shape(ctx, node, x):
    """The static shape, as an int64 constant (start/end as Python slicing)."""
    return const(np.array(x.shape, np.int64)[node.attr_int("start", 0):node.attr_int("end", None)], TensorProto.INT64)
