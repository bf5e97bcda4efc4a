"""Import rules of the elementwise ONNX ops and of the ones that only name values (Identity, Constant, Cast, Shape).

Arithmetic is imported when the operands' intervals prove that ONNX computes the exact result (no wrap in the
element type, no float rounding) within 32 bits; CVM then computes the same. Constant operands are folded with
numpy in the ONNX element type (wrapping as ONNX does), or become params. A rule that rewrites (Min as -max(-x),
Mod, a right shift as a floor) checks the type on its result only: its steps are CVM int32 values that ONNX never
computes, bounded by 32 bits alone. Where no arithmetic form exists, an operand taking few values gives a table
(``evaluated.table``).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from onnx import TensorProto

from .checks import tensor_array
from .context import (FLOAT_EXACT, INT_RANGES, Tensor, bound, check_values, const, cvm_shape, foldable,
                      is_supported_type, tight, type_name)
from .emit import (BOOL, INT32, arith, broadcast_shape, differ, equal, extreme, folded, greater, logical_not,
                  np_type, ones, scalar, step, wide)
from .evaluated import evaluate, table
from .registry import Refuse, rule



# -- arithmetic -------------------------------------------------------------------------------------------------


@rule("Add", "Sub", "Mul")
def arithmetic(ctx, node, a, b):
    """x + y, x - y, x * y -> broadcast_add/sub/mul: exact when the result interval fits the element type."""
    return arith(ctx, node.op_type, a, b, a.dtype)


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
    return trunc_div(ctx, a, b, a.dtype)


def trunc_div(ctx, a: Tensor, b: Tensor, dtype: int) -> Tensor:
    """trunc(a / b) -> broadcast_div (0 where b is 0)."""
    if a.is_const and b.is_const:
        foldable(broadcast_shape(a, b))
        return folded(_trunc_div(wide(a.value), wide(b.value)), dtype)
    if b.is_const:
        least = int(np.abs(b.value.astype(np.int64)).min())
    else:
        least = b.lo if b.lo > 0 else -b.hi if b.hi < 0 else 1
    m = a.peak // least
    lo = 0 if a.lo >= 0 and b.lo >= 0 else -m
    return ctx.result(ctx.op("broadcast_div", a, b), dtype, lo, m, broadcast_shape(a, b))


@rule("Mod", since=10)
def mod(ctx, node, a, b):
    """fmod=1: r = a - b * trunc(a / b) (C's fmod: the dividend's sign), with broadcast_div truncating as C does.
    fmod=0 (integers): r + b where r and b have opposite signs (Python's %: the divisor's sign), that is
    r + b * ((0 > r) * (b > 0) + (r > 0) * (0 > b)). |r| <= |a| and |r| < |b|; a constant zero divisor is refused
    (undefined in ONNX), a variable one gives r = a."""
    fmod = node.attr_int("fmod", 0, 0, 1)
    if a.dtype in FLOAT_EXACT and not fmod:
        raise Refuse("Mod of floats needs fmod=1")
    if b.is_const and (b.value == 0).any():
        raise Refuse("Mod by a constant zero")
    if a.is_const and b.is_const:
        foldable(broadcast_shape(a, b))
        av, bv = wide(a.value), wide(b.value)
        return folded(np.fmod(av, bv) if fmod else np.mod(av, bv), a.dtype)
    q = trunc_div(ctx, a, b, INT32)
    qb = step(ctx, "broadcast_mul", q, b, min(a.lo, 0), max(a.hi, 0))  # trunc(a / b) * b lies between 0 and a
    limit = b.peak - 1 if b.lo > 0 or b.hi < 0 else a.peak
    r = step(ctx, "broadcast_sub", a, qb, max(min(a.lo, 0), -limit), min(max(a.hi, 0), limit))
    if fmod:
        return replace(r, dtype=a.dtype)
    zero = ones(r, 0)
    if b.lo > 0:
        flip = greater(ctx, zero, r)
    elif b.hi < 0:
        flip = greater(ctx, r, zero)
    else:
        below = step(ctx, "broadcast_mul", greater(ctx, zero, r), greater(ctx, b, zero), 0, 1)
        above = step(ctx, "broadcast_mul", greater(ctx, r, zero), greater(ctx, zero, b), 0, 1)
        flip = step(ctx, "broadcast_add", below, above, 0, 1)
    lo, hi = (0, limit) if b.lo > 0 else (-limit, 0) if b.hi < 0 else (-limit, limit)
    m = step(ctx, "broadcast_add", r, step(ctx, "broadcast_mul", flip, b, min(b.lo, 0), max(b.hi, 0)), lo, hi)
    return replace(m, dtype=a.dtype)


BITS = {TensorProto.INT8: 8, TensorProto.UINT8: 8, TensorProto.INT16: 16, TensorProto.UINT16: 16,
        TensorProto.INT32: 32, TensorProto.UINT32: 32, TensorProto.INT64: 64, TensorProto.UINT64: 64}


@rule("BitShift", since=11)
def bit_shift(ctx, node, x, y):
    """By a constant y, shifts within the width W: x << y = x * 2^y -> broadcast_mul, exact when the result fits
    the type (ONNX drops the bits beyond, CVM would keep them); x >> y = floor(x / 2^y), the truncating
    broadcast_div less 1 where a negative remainder is left. A y outside [0, W) gives what ONNX defines: 0, or -1
    for a right shift of a negative x, which floor(x / 2^s) also gives for any s with 2^s > |x|. A variable y
    (of a constant x) is a table."""
    left = node.attr_str("direction", choices=("LEFT", "RIGHT")) == "LEFT"
    if x.dtype not in BITS:
        raise Refuse(f"BitShift of {type_name(x.dtype)}: not an integer type")
    if not y.is_const:
        return table(ctx, node, [x, y], x.dtype)
    width = BITS[x.dtype]
    yv = y.value.astype(np.int64)
    inside = (yv >= 0) & (yv < width)
    if x.is_const:
        return _const_shift(node, x, y)
    if left:
        try:
            return arith(ctx, "Mul", x, const(np.where(inside, 2 ** np.clip(yv, 0, 62), 0), INT32), x.dtype)
        except Refuse as wraps:  # a table holds the wrapped values ONNX defines, when x takes few values
            try:
                return table(ctx, node, [x, y], x.dtype)
            except Refuse:
                raise wraps from None
    shift = np.minimum(np.where(inside, yv, width), x.peak.bit_length())
    if shift.max(initial=0) > 30:
        raise Refuse(f"precision bound exceeded: a right shift by {int(shift.max())} of values reaching {x.peak} "
                     "needs a divisor beyond CVM's 32 bits")
    return floor_div(ctx, x, const(1 << shift, INT32), x.dtype)


def _const_shift(node, x: Tensor, y: Tensor) -> Tensor:
    foldable(broadcast_shape(x, y))
    [z] = evaluate(node, {node.proto.input[0]: x.value, node.proto.input[1]: y.value})
    return const(z, x.dtype)


def floor_div(ctx, x: Tensor, d: Tensor, dtype: int) -> Tensor:
    """floor(x / d) for a constant d > 0: trunc((x - (d - 1) * (0 > x)) / d) -> broadcast ops and broadcast_div (a
    negative x moved down by d - 1 truncates to the floor; no product of wide labels)."""
    dv = d.value.astype(np.int64)
    lo, hi = min(x.lo // int(dv.min()), x.lo // int(dv.max())), max(x.hi // int(dv.min()), x.hi // int(dv.max()))
    if x.lo < 0:
        top = int(dv.max()) - 1
        down = step(ctx, "broadcast_mul", greater(ctx, ones(x, 0), x), const(dv - 1, INT32), 0, top)
        x = step(ctx, "broadcast_sub", x, down, x.lo - top, x.hi)
    return replace(trunc_div(ctx, x, d, INT32), dtype=dtype, lo=lo, hi=hi)


@rule("Pow", since=7)
def pow_(ctx, node, x, y):
    """x ** k by a constant integer k >= 0 shared by every element: square-and-multiply with broadcast_mul, each
    step the exact interval of its power of x (the result must fit the type, the steps CVM's 32 bits). Any other
    exponent, or a variable exponent of a constant base, is a table."""
    if x.dtype in FLOAT_EXACT:
        raise Refuse(f"{type_name(x.dtype)} Pow rounds: no exact CVM form")
    k = None
    if y.is_const and y.value.size and (y.value == y.value.reshape(-1)[0]).all():
        k = y.value.reshape(-1)[0].item()
    if not y.is_const and y.lo < 0:
        raise Refuse("a variable exponent that may be negative: an integer to a negative power has no integer "
                     "value ONNX defines")
    if x.is_const or k is None or not float(k).is_integer() or k < 0:
        return table(ctx, node, [x, y], x.dtype)
    shape = broadcast_shape(x, y)
    check_values(x.dtype, *power_interval(x.lo, x.hi, int(k)))
    out, base, e = None, (x, 1), int(k)
    while e:
        if e & 1:
            out = base if out is None else _times(ctx, out, base, x)
        e >>= 1
        if e:
            base = _times(ctx, base, base, x)
    if out is None:  # x ** 0
        return folded(np.ones(foldable(shape), np.int64), x.dtype)
    return replace(ctx.broadcast_to(out[0], shape), dtype=x.dtype)


def power_interval(lo: int, hi: int, k: int) -> tuple[int, int]:
    """The exact range of x ** k over x in [lo, hi]: at the ends, or 0 where the interval holds it."""
    values = [lo ** k, hi ** k] + ([0] if lo <= 0 <= hi else [])
    return min(values), max(values)


def _times(ctx, a: tuple[Tensor, int], b: tuple[Tensor, int], x: Tensor) -> tuple[Tensor, int]:
    """x^i * x^j = x^(i+j) -> broadcast_mul, a step in CVM's int32 with the exact interval of that power."""
    (ta, i), (tb, j) = a, b
    return step(ctx, "broadcast_mul", ta, tb, *power_interval(x.lo, x.hi, i + j)), i + j


@rule("BitwiseAnd", "BitwiseOr", "BitwiseXor", since=18)
def bitwise(ctx, node, a, b):
    """Of a constant and a variable taking few values: a table (the bits of wide ranges have no CVM form)."""
    if a.is_const and b.is_const:
        foldable(broadcast_shape(a, b))
        fn = {"BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor}
        return folded(fn[node.op_type](a.value, b.value), a.dtype)
    return table(ctx, node, [a, b], a.dtype)


SIGNED_PAIRS = {(TensorProto.INT8, TensorProto.UINT8), (TensorProto.UINT8, TensorProto.INT8),
                (TensorProto.INT16, TensorProto.UINT16), (TensorProto.UINT16, TensorProto.INT16)}


@rule("BitCast", since=26)
def bit_cast(ctx, node, x):
    """Between the signed and unsigned N-bit types (N = 8, 16): the same value where it lies in both types, else
    plus 2^N (signed -> unsigned: x < 0) or minus 2^N (unsigned -> signed: x >= 2^(N-1)); that is
    x + 2^N * (0 > x), x - 2^N * (x > 2^(N-1) - 1) with broadcast_greater, broadcast_mul and broadcast_add."""
    to = node.attr_int("to")
    if to == x.dtype:
        return x
    if (x.dtype, to) not in SIGNED_PAIRS:
        raise Refuse(f"BitCast from {type_name(x.dtype)} to {type_name(to)}: only between the signed and unsigned "
                     "8- and 16-bit types (other widths change the shape or pass 32 bits)")
    if x.is_const:
        return folded(x.value.view(np_type(to)), to)
    n = 1 << BITS[to]
    tlo, thi = INT_RANGES[to]
    if tlo <= x.lo and x.hi <= thi:
        return replace(x, dtype=to)
    wrap = greater(ctx, ones(x, 0), x) if tlo == 0 else greater(ctx, x, ones(x, thi))
    y = arith(ctx, "Add", x, arith(ctx, "Mul", wrap, ones(x, n if tlo == 0 else -n)))
    return replace(y, dtype=to, lo=max(y.lo, tlo), hi=min(y.hi, thi))


@rule("Max", "Min", since=8)
def extremum(ctx, node, *xs):
    """max/min of any number of operands -> broadcast_max, min(x, y) = -max(-x, -y). The result lies within the
    operands' types; the negations are steps in CVM's int32, exact for every value (unsigned ones too)."""
    return extreme(ctx, node.op_type == "Max", xs)


# -- comparisons and logic: 0/1 results ---------------------------------------------------------------------------
COMPARE = {"Greater": np.greater, "Less": np.less, "GreaterOrEqual": np.greater_equal,
           "LessOrEqual": np.less_equal, "Equal": np.equal, "Xor": np.not_equal}


@rule(*COMPARE, since=7)
def compare(ctx, node, a, b):
    """x > y -> broadcast_greater (1 or 0); x < y is y > x; x >= y is 1 - (y > x); x <= y is 1 - (x > y);
    x == y is 1 - max(x > y, y > x); Xor (of 0/1 values) is x != y, max(x > y, y > x)."""
    op = node.op_type
    if a.is_const and b.is_const:
        foldable(broadcast_shape(a, b))
        return const(COMPARE[op](a.value, b.value), BOOL)
    if op in ("Less", "GreaterOrEqual"):
        a, b = b, a
    if op in ("Greater", "Less"):
        return greater(ctx, a, b)
    if op in ("GreaterOrEqual", "LessOrEqual"):
        return logical_not(ctx, greater(ctx, a, b))
    return differ(ctx, a, b) if op == "Xor" else equal(ctx, a, b)


@rule("Not", since=1)
def not_rule(ctx, node, x):
    """not x (0/1) = 1 - x -> broadcast_sub."""
    return logical_not(ctx, x)


@rule("And", "Or", since=7)
def logical(ctx, node, a, b):
    """Of 0/1 values: x and y = x * y -> broadcast_mul; x or y = max(x, y) -> broadcast_max."""
    if a.is_const and b.is_const:
        foldable(broadcast_shape(a, b))
        return const((np.logical_and if node.op_type == "And" else np.logical_or)(a.value, b.value), BOOL)
    e = ctx.op("broadcast_mul" if node.op_type == "And" else "broadcast_max", a, b)
    return ctx.result(e, BOOL, 0, 1, broadcast_shape(a, b))


@rule("BitwiseNot", since=18)
def bitwise_not(ctx, node, x):
    """~x = -1 - x for a signed type, (2^N - 1) - x for an N-bit unsigned one -> broadcast_sub from a constant."""
    if x.dtype not in BITS:
        raise Refuse(f"BitwiseNot of {type_name(x.dtype)}: not an integer type")
    if x.is_const:
        return folded(np.bitwise_not(x.value), x.dtype)
    tlo, thi = INT_RANGES[x.dtype]
    top = -1 if tlo < 0 else thi
    check_values(x.dtype, top - x.hi, top - x.lo)
    return ctx.apply("broadcast_sub", ones(x, top), x, dtype=x.dtype, shape=x.shape)


@rule("Neg", since=6)
def negative(ctx, node, x):
    """-x -> negative."""
    if x.is_const:
        return folded(-x.value, x.dtype)
    check_values(x.dtype, -x.hi, -x.lo)
    return ctx.apply("negative", x, dtype=x.dtype, shape=x.shape)


@rule("Abs", since=6)
def abs_(ctx, node, x):
    """|x| -> abs."""
    if x.is_const:
        return folded(np.abs(x.value), x.dtype)
    return ctx.apply("abs", x, dtype=x.dtype, shape=x.shape)


@rule("Relu", since=6)
def relu(ctx, node, x):
    """max(x, 0) -> relu."""
    if x.is_const:
        return folded(np.maximum(x.value, 0), x.dtype)
    return ctx.apply("relu", x, dtype=x.dtype, shape=x.shape)


FLOAT_MAX = 3.4e38  # the float attributes of Clip before opset 11 default to +-FLT_MAX: no bound


@rule("Clip", since=6)
def clip(ctx, node, x, lo_t=None, hi_t=None):
    """min(max(x, lo), hi): nothing where the interval already lies within; cvm_clip(p) for +-(2^(p-1)-1);
    else clip with the bounds tightened to the interval (equal on every value x takes). Variable bounds: Max then
    Min."""
    if any(t is not None and not t.is_const for t in (lo_t, hi_t)):  # variable bounds: min(max(x, lo), hi)
        x = x if lo_t is None else extreme(ctx, True, [x, lo_t])
        return x if hi_t is None else extreme(ctx, False, [x, hi_t])
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
