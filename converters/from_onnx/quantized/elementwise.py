"""The float elementwise ops on dequantized values: Add, Sub, Mul, Div, Pow, Mod, BatchNormalization, Relu, Clip,
and the float functions (Sigmoid, Tanh, ...) as ``Mapped`` values made tables by the QuantizeLinear that follows;
Cast (to float32 the value, to an integer type a table).
"""
from __future__ import annotations

import functools
import math
from dataclasses import replace
from fractions import Fraction
from typing import Callable

import numpy as np
from onnx import TensorProto

from ..context import BOOL, INT16, INT32, INT_RANGES, Tensor, const, onnx_cast, type_name
from ..emit import (as_int32, broadcast_of, broadcast_shape, broadcasts_into, extreme, minus_zero, normal, onnx_pads,
                    reduced, summed_windows)
from ..registry import Refuse, float_rule, integer_rule
from .products import ceil_ends, image_sum, powers, summed
from .masks import KeptScores, Tabulated, looked_up, masked_scores, tabulated
from .l2norm import L2Normalized, normalized
from .pair_sums import counted_sum
from .qdq import MAX_TABLE, Requant, lookup, quantize, saturate
from .roots import MAX_DEGREE, root, root_degree, wide
from .values import (MS, Deferred, Mapped, Real, Scaled, Summed, float32_sum, of_integers, per_tensor, real_bound,
                     scaled, sum_of)
@float_rule("Add", since=7)
def add_rule(ctx, node, a, b):
    """a + b: exact as a sum of scaled integers (a float constant c a term sign(c) at scale |c|), requantized by the
    QuantizeLinear that follows. x + an attention mask's term (a table of one integer tensor): ``MaskedScores``,
    for the Softmax that reads it (of scores a Where masks, ``KeptScores``, their term plus the mask's). A float
    function's value plus a constant: one table (``function_shifted``)."""
    mask = next((x for x in (a, b) if isinstance(x, Tabulated)), None)
    if mask is not None:
        x = b if mask is a else a
        if isinstance(x, KeptScores):  # x' + (m + mask)
            return masked_scores(ctx, x.x, tabulated(ctx, node, *(x.term if v is x else v for v in (a, b))))
        return masked_scores(ctx, per_tensor(scaled(x, "the scores beside an attention mask"), "a masked Softmax"),
                             mask)
    if (shifted := function_shifted(a, b, 1, 1)) is not None:
        return shifted
    if (moved := extreme_moved(ctx, a, b, 1)) is not None:
        return moved
    terms = []
    for x in (a, b):
        terms += summands(x, "an Add operand")
    return sum_of(terms)


@float_rule("Sum", "Mean", since=6)
def sum_rule(ctx, node, *xs):
    """Sum of any number of values (tf2onnx's AddN): the sum of their terms, as Add's; Mean: each term's scale
    over the count n (exact rationals). Requantized by the QuantizeLinear that follows."""
    terms = [t for x in xs for t in summands(x, f"a {node.op_type} operand")]
    if node.op_type == "Mean":
        terms = [replace(t, scale=np.asarray(t.scale / len(xs), dtype=object)) for t in terms]
    return sum_of(terms)


def function_shifted(a, b, sign_a: int, sign_b: int) -> Mapped | None:
    """sign_a a + sign_b b where one operand is a float function's value (``Mapped``, or an L2 norm's value that
    takes functions after it) and the other a constant of one value throughout that does not broadcast it
    (log(x) - c, a log spectrum's offset, which quantize_static leaves in float after the Log): the function's
    value plus that constant, one table still; None for any other operands."""
    for x, c, sx, sc in ((a, b, sign_a, sign_b), (b, a, sign_b, sign_a)):
        if not (isinstance(x, Mapped) or isinstance(x, Deferred) and hasattr(x, "then")):
            continue
        v = constant_values(c)
        if v is None or not v.size or (v != v.flat[0]).any() or len(v.shape) > len(x.shape) or \
                any(d not in (1, n) for d, n in zip(v.shape[::-1], tuple(x.shape)[::-1])):
            return None
        k = float(v.flat[0]) * sc
        return mapped(x, (lambda u: u + k) if sx > 0 else (lambda u: k - u), f"{'+' if sx > 0 else '-'} {k}")
    return None


def summands(x, what: str) -> list[Scaled]:
    """The terms of a sum: a sum's, a dequantized value, or a float constant c as sign(c) at scale |c| (per
    element; 1 where c is 0)."""
    if isinstance(x, Summed):
        return list(x.terms)
    if is_float_const(x):
        c = np.asarray(x.value, np.float64)
        if not np.isfinite(c).all():
            raise Refuse(f"{what} is a constant that is not finite")
        size = np.array([Fraction(float(abs(v))) if v else Fraction(1) for v in c.flat], dtype=object)
        return [Scaled(const(np.sign(c).astype(np.int64), INT32), size.reshape(c.shape), np.zeros((), np.int64))]
    return [scaled(x, what)]


@float_rule("BatchNormalization", since=9)
def batch_norm_rule(ctx, node, x, gamma, beta, mean, var):
    """Inference BatchNormalization of a dequantized x (one quantize_static leaves after a ConvTranspose):
    a (x - mean) + beta = a x + c per channel, a = gamma / sqrt(var + epsilon) and c = beta - a mean in float64
    (those rationals are the ones used: the real square root differs by 2^-52 relative). The sum of x's term,
    t times sign(a) (broadcast_mul) at scale s |a|, and a constant term sign(c) at scale |c|, requantized by the
    QuantizeLinear that follows."""
    x = per_tensor(scaled(x, "the BatchNormalization input"), "BatchNormalization")
    if node.attr_int("training_mode", 0) or len(x.shape) < 2:
        raise Refuse("BatchNormalization in training mode or of a tensor without channels has no CVM form")
    params = []
    for t, what in ((gamma, "scale"), (beta, "B"), (mean, "input_mean"), (var, "input_var")):
        if isinstance(t, Scaled) and t.t.is_const:  # a quantized constant (quantize_static quantizes scale and B)
            value = np.array([float(f) for f in np.broadcast_to((t.t.value.astype(np.int64) - t.zero) * t.scale,
                                                               t.shape).flat])
        elif is_float_const(t):
            value = np.asarray(t.value, np.float64).reshape(-1)
        else:
            value = None
        if value is None or value.size != x.shape[1]:
            raise Refuse(f"BatchNormalization {what} must be a constant of one value per channel")
        params.append(value)
    g, b, mu, v = params
    with np.errstate(all="ignore"):
        a = g / np.sqrt(v + np.float64(np.float32(node.attr_float("epsilon", 1e-5))))
        c = b - a * mu
    if not (np.isfinite(a).all() and np.isfinite(c).all()):
        raise Refuse("BatchNormalization with a variance of -epsilon or less, or non-finite parameters")
    shape = (-1,) + (1,) * (len(x.shape) - 2)
    sign = np.sign(a).astype(np.int64).reshape(shape)
    t = as_int32(x.t)
    if (sign != 1).any():
        sc = const(sign.astype(np.int32), INT32)
        peak = max(-t.lo, t.hi)
        t = ctx.result(ctx.op("broadcast_mul", t, sc), INT32, -peak if (sign < 0).any() else min(t.lo, 0), peak,
                       broadcast_shape(t, sc))
    s, z = x.scale.reshape(()).item(), int(x.zero.reshape(()))
    magnitude = [Fraction(float(abs(q))) if q else Fraction(1) for q in a]
    terms = [Scaled(t, np.array([s * m for m in magnitude], dtype=object).reshape(shape), sign * z)]
    if c.any():
        terms.append(Scaled(const(np.sign(c).astype(np.int64).reshape(shape), INT32),
                            np.array([Fraction(float(abs(q))) if q else Fraction(1) for q in c],
                                     dtype=object).reshape(shape), np.zeros((), np.int64)))
    return Summed(tuple(terms), x.shape)


def negated(ctx, x: Scaled) -> Scaled:
    """-x = (-t - (-z)) s: CVM's negative of t, the zero point negated."""
    if x.t.is_const:
        return Scaled(const(-x.t.value.astype(np.int64), INT32), x.scale, -x.zero)
    t = as_int32(x.t)
    return Scaled(ctx.result(ctx.op("negative", t), INT32, -t.hi, -t.lo, t.shape), x.scale, -x.zero)


@float_rule("Sub", since=7)
def sub_rule(ctx, node, a, b):
    """a - b: a + (-b), -b = (-t + z) s exactly (``negated``; a float constant as in Add), requantized by the
    QuantizeLinear that follows; a float function's value less a constant (or a constant less it) one table
    (``function_shifted``)."""
    if (shifted := function_shifted(a, b, 1, -1)) is not None:
        return shifted
    if (moved := extreme_moved(ctx, a, b, -1)) is not None:
        return moved
    return difference(ctx, a, b, -1)


def difference(ctx, a, b, sign: int):
    """a + sign b as a sum of terms, exact (``summands``; a float constant array a term too); for a - b, a term of
    both (one dequantized value) cancels where the rest keeps the sum's shape ((pp + ww) - pp = ww), unless
    float32's rounding of a's sum, as the model computes it first, reaches half a step of a computed term left
    (``float32_cancels``)."""
    a, b = (const(x, TensorProto.FLOAT) if isinstance(x, np.ndarray) else x for x in (a, b))
    terms = summands(a, "an Add operand" if sign > 0 else "a Sub operand")
    more = summands(b, "an Add operand" if sign > 0 else "a Sub operand")
    if sign > 0:
        return sum_of(terms + more)
    shape = broadcast_shape(*(t.t for t in terms + more))
    summed = list(terms)
    for t in list(more):
        u = next((u for u in terms if same_value(u, t)), None)
        rest = [v.t for v in terms + more if v is not u and v is not t]
        if u is not None and rest and broadcast_shape(*rest) == shape:
            terms.remove(u)
            more.remove(t)
    if len(terms) < len(summed) and (why := float32_cancels(summed, terms + more)) is not None:
        raise Refuse(why)
    return sum_of(terms + [negated(ctx, t) for t in more])


def float32_cancels(summed: list, left: list) -> str | None:
    """Why a Sub that cancels a term of the sum ``summed`` (k terms) has no exact form here, or None: float32
    computes that sum first, within (k - 1) 2^-24 of the sum of its terms' largest |values|, and where that error
    reaches half the finest step of a computed term ``left`` the model's value is not the exact one the
    cancellation gives ((pp + ww) - pp with pp 2^24 steps of ww: float32 holds no ww)."""
    steps = [float(min(t.scale.flat)) for t in left if isinstance(t, Scaled) and not t.t.is_const]
    if len(summed) < 2 or not steps:
        return None
    largest = sum(max(abs(e - int(z)) for e in (t.t.lo, t.t.hi) for z in (t.zero.min(), t.zero.max()))
                  * float(max(t.scale.flat)) for t in summed if isinstance(t, Scaled))
    error = (len(summed) - 1) * 2.0 ** -24 * largest
    if error < min(steps) / 2:
        return None
    return (f"a Sub cancelling a term of a float sum: float32 rounds the sum within {error:.3g}, past half the step "
            f"{min(steps):.3g} of what is left (its terms' grids are too far apart), so the model's float32 value "
            "is not the exact difference: quantize the sum first")


def same_value(a, b) -> bool:
    """Whether a and b are one dequantized value: the same integers at the same scale and zero point."""
    if a is b:
        return True
    if not (isinstance(a, Scaled) and isinstance(b, Scaled)) or a.clip != (None, None) or b.clip != (None, None):
        return False
    same_t = a.t is b.t or a.t.entry is not None and a.t.entry == b.t.entry and a.t.shape == b.t.shape
    return same_t and a.scale.shape == b.scale.shape and a.zero.shape == b.zero.shape and \
        all(x == y for x, y in zip(a.scale.flat, b.scale.flat)) and (a.zero == b.zero).all()


#: The most operands a deferred Max (Min) that an Add or Sub distributes over may reach.
MAX_EXTREME = 64


def leaves(x) -> int:
    """The operands a deferred Max (Min) nests, all levels (1 for any other value)."""
    return sum(leaves(v) for v in x.operands) if isinstance(x, Extreme) else 1


def extreme_moved(ctx, a, b, sign: int) -> Extreme | None:
    """a + sign b where an operand is a deferred Max (Min) of values on different grids (``Extreme``):
    max_i(x_i) + y = max_i(x_i + y) and y - max_i(x_i) = min_i(y - x_i) (Min alike; both operands such: each
    operand's in turn), each operand's sum exact (``difference``); an x_i that is y itself gives the constant 0 (a
    max-stabilised exponent's y - max(y, x) = min(0, y - x)), so that a function after it takes each operand apart
    (``function_rule``), and the QuantizeLinear after that the max (min) of their integers. None for other
    operands; refused past ``MAX_EXTREME`` operands (each may be a table of 2^16 entries)."""
    if not isinstance(a, Extreme) and not isinstance(b, Extreme):
        return None
    if (n := leaves(a) * leaves(b)) > MAX_EXTREME:
        raise Refuse(f"{'Add' if sign > 0 else 'Sub'} of a Max or Min of values on different grids makes a Max or Min "
                     f"of {n} values, past the {MAX_EXTREME} this import takes: quantize the Max (Min) first")

    def moved(x, y):
        if isinstance(x, Extreme):
            return Extreme(x.is_max, tuple(moved(v, y) for v in x.operands))
        if isinstance(y, Extreme):
            return Extreme(y.is_max == (sign > 0), tuple(moved(x, v) for v in y.operands))
        if sign < 0 and same_value(x, y):
            return np.zeros(broadcast_of(*(np.shape(v) if isinstance(v, np.ndarray) else v.shape for v in (x, y))),
                            np.float64)
        return difference(ctx, x, y, sign)
    return moved(a, b)


def multiply(ctx, a: Scaled, b: Scaled) -> Scaled:
    """(a - za)(b - zb) in int32, at scale s_a * s_b."""
    va, vb = minus_zero(ctx, a.t, a.zero), minus_zero(ctx, b.t, b.zero)
    corners = [x * y for x in (va.lo, va.hi) for y in (vb.lo, vb.hi)]
    e = ctx.op("broadcast_mul", va, vb)
    scale = np.asarray(a.scale * b.scale, dtype=object).reshape(broadcast_of(a.scale.shape, b.scale.shape))
    return Scaled(ctx.result(e, INT32, min(corners), max(corners), broadcast_shape(va, vb)), scale,
                  np.zeros((), np.int64))


def constant_factor(t, what: str, shape: tuple[int, ...] | None = None) -> Fraction:
    """A float constant scalar > 0 (Mul or Div by it scales a value exactly: its float32/64 value is a rational);
    also a tensor holding one such value throughout whose shape broadcasts into the operand's ``shape`` (a mean
    pooling's token count): elementwise it is that scalar, and the result keeps the operand's shape."""
    v = np.asarray(t.value, np.float64)
    if v.size > 1 and shape is not None and (v == v.flat[0]).all() and broadcasts_into(v.shape, shape):
        v = v.reshape(-1)[:1]
    if v.size != 1 or not np.isfinite(v).all() or v.reshape(()) <= 0:
        raise Refuse(f"{what} must be a finite constant > 0, a scalar or one value throughout that does not "
                     f"broadcast the other operand (got {v.reshape(-1)[:4]}): it then scales the value exactly")
    return Fraction(float(v.reshape(())))


def constant_factors(t, what: str, x) -> Fraction | np.ndarray:
    """``constant_factor``'s scalar, or for a constant of several values (a per-channel normalization's std inside
    the model), each finite and > 0, whose shape broadcasts into a ``Scaled`` x's (or into each term's of a sum:
    (x - mean) / std) without growing it and beside no deferred Clip: those values as exact Fractions in the
    constant's shape (each scale becomes per element: the scale times the factor, broadcast)."""
    v = np.asarray(t.value, np.float64)
    shape = getattr(x, "shape", None)
    terms = x.terms if isinstance(x, Summed) else (x,)
    if v.size <= 1 or (v == v.flat[0]).all() or not (np.isfinite(v) & (v > 0)).all() \
            or not all(isinstance(term, Scaled) and term.clip == (None, None) and broadcasts_into(v.shape, term.shape)
                       for term in terms):
        return constant_factor(t, what, shape)
    return np.array([Fraction(float(q)) for q in v.flat], dtype=object).reshape(v.shape)


def rescaled(x, factor: Fraction | np.ndarray, what: str):
    """x * factor, exactly: the scale (of each term) times factor; a float function's value times it; x itself for
    factor 1 (of any form: a written-out softmax's confidence times 1)."""
    if isinstance(x, Summed):
        return Summed(tuple(rescaled(t, factor, what) for t in x.terms), x.shape)
    if isinstance(factor, np.ndarray):  # per element (``constant_factors``): x is a Scaled without a Clip
        scale = np.asarray(x.scale * factor, dtype=object)
        return replace(x, scale=scale.reshape(broadcast_of(x.scale.shape, factor.shape)))
    if factor == 1:
        return x
    if isinstance(x, Mapped):  # float64 table values: times the numerator, over the denominator (each exact)
        n, d = float(factor.numerator), float(factor.denominator)
        return Mapped(x.x, lambda v, f=x.fn: np.asarray(f(v)) * n / d, f"{x.what} * {factor}")
    x = scaled(x, what, clipped_ok=True)
    clip = tuple(None if b is None else b * factor for b in x.clip)
    return replace(x, scale=np.asarray(x.scale * factor, dtype=object).reshape(x.scale.shape), clip=clip)


def is_float_const(t) -> bool:
    return isinstance(t, Tensor) and t.is_const and np.asarray(t.value).dtype.kind == "f"


@float_rule("Mul", since=7)
def mul_rule(ctx, node, a, b):
    """(a - za)(b - zb) at scale s_a * s_b; by a float constant c > 0 (hard-swish's 1/6): the scale times c (per
    element for a constant of several values, ``constant_factors``)."""
    if is_float_const(b) or is_float_const(a):
        x, c = (a, b) if is_float_const(b) else (b, a)
        return rescaled(x, constant_factors(c, "the Mul constant", x), "a Mul operand")
    return multiply(ctx, scaled(a, "a Mul operand"), scaled(b, "a Mul operand"))


@float_rule("Div", since=7)
def div_rule(ctx, node, a, b):
    """a / c for a float constant c > 0 (hard-swish's x * relu6(x + 3) / 6; a per-channel std, per element): the
    scale over c, an exact rational folded into the requantization that follows; by a computed value: a table of
    a / b over both operands' integers (``Paired``: a / 0 = +-inf saturates, 0 / 0 = NaN is the output type's
    minimum); of sums of computed values (a min-max normalization's (x - min) / (max - min)), or of values too wide
    for that table, an integer quotient (``Quotient``). A divisor's deferred Clip (a masked mean's count clipped at 1
    or eps off the mask's grid) is clipped there: in the table's exact values, or as the quotient's D; a computed
    float tensor of integers (a count of a float mask) is the real value it is (``of_integers``). A masked mean
    (``chains.MaskedMean``: T tokens, every weight 0 or at least w) whose weights are >= 0 has
    |a / b| <= max|a| / (T w), its bound as a float output (``masked_bound``)."""
    if isinstance(b, Tensor) and not b.is_const and b.dtype == TensorProto.FLOAT:
        b = of_integers(b)
    if not is_float_const(b):
        wide = isinstance(a, Scaled) and isinstance(b, Scaled) and \
            (a.t.hi - a.t.lo + 1) * (b.t.hi - b.t.lo + 1) > MAX_TABLE
        bound = masked_bound(ctx.means.get(node.proto.output[0]), a, b)
        if isinstance(a, Summed) or isinstance(b, Summed) or wide:
            return Quotient(a, b, bound)
        if isinstance(b, Scaled) and b.clip != (None, None):
            lo, hi = (None if v is None else float(v) for v in b.clip)
            return Paired(lambda u, v: np.divide(u, np.clip(v, lo, hi)), scaled(a, "the dividend"),
                          replace(b, clip=(None, None)), "Div", bound=bound)
        return Paired(np.divide, scaled(a, "the dividend"), scaled(b, "the divisor"), "Div", bound=bound)
    return rescaled(a, 1 / constant_factors(b, "the divisor", a), "the dividend")


def masked_bound(mean, a, b) -> Fraction | None:
    """max|a| / (T w) for a masked mean (``chains.MaskedMean``, or None: no bound) of one dequantized dividend and
    divisor per tensor whose weights are >= 0 (the divisor's least value, T times its weights', at least 0): the
    products vanish with their weights, each within max|a| / T (the sum's interval is T times its terms'), and each
    other weight is at least w, so |a| <= K max|a| / T over b >= K w, K the kept tokens (a = 0 where K = 0)."""
    if mean is None or not (isinstance(a, Scaled) and isinstance(b, Scaled) and a.per_tensor and b.per_tensor):
        return None
    za, zb = int(a.zero.reshape(())), int(b.zero.reshape(()))
    if b.t.lo < zb:
        return None
    return max(za - a.t.lo, a.t.hi - za) * a.scale.reshape(()).item() / (mean.tokens * mean.least)


#: |N| and |D| of a ``Quotient`` stay within 2^QUOTIENT_BITS: 2|N| + |D| and every sign product within 32 bits.
QUOTIENT_BITS = 28
#: The multipliers a ``Quotient`` tries below its largest, for the divisor's terms nearest exact.
QUOTIENT_SEARCH = 1 << 16

#: A comparison with its operands swapped: c op x is x SWAPPED[op] c.
SWAPPED = {"Equal": "Equal", "Greater": "Less", "Less": "Greater", "GreaterOrEqual": "LessOrEqual",
           "LessOrEqual": "GreaterOrEqual"}


@float_rule(*SWAPPED, since=7)
def compare_rule(ctx, node, a, b):
    """x op c of a dequantized x (per tensor) and one constant value c (dequantized or float), as onnxruntime
    compares DequantizeLinear's float32 values fl((t - z) s) with c: within half a step of the exact (t - z) s while
    |t - z| < 2^23, so only the integers within one of r = c / s + z are evaluated in float32, the integer threshold
    taken from them (Equal: the one integer whose value is c; none: false; several: refused); past 2^23 t op r on
    integers (t > floor(r), t >= ceil(r), ...). The integer comparison of t with that whole number, clamped to
    [lo - 1, hi + 1] of t's interval (which keeps every answer). Two computed values of one scale and zero point:
    the comparison of their integers."""
    op = node.op_type
    if isinstance(a, Scaled) and isinstance(b, Scaled) and not a.t.is_const and not b.t.is_const:
        a, b = per_tensor(a, op), per_tensor(b, op)
        if a.scale.reshape(()).item() != b.scale.reshape(()).item() or \
                int(a.zero.reshape(())) != int(b.zero.reshape(())):
            raise Refuse(f"{op} of two computed values of different scales or zero points has no exact CVM form here")
        return integer_rule(node)(ctx, node, a.t, b.t)
    swapped = not (isinstance(a, Scaled) and not a.t.is_const)
    x, c = (b, a) if swapped else (a, b)
    x = per_tensor(scaled(x, f"the {op} operand"), op)
    if isinstance(c, Scaled) and c.t.is_const and c.t.size == 1:
        value = dequantized32(int(c.t.value.reshape(())) - int(c.zero.reshape(())), c.scale.reshape(()).item())
    elif is_float_const(c) and c.value.size == 1 and math.isfinite(float(c.value.reshape(()))):
        value = np.float32(c.value.reshape(()))
    else:
        raise Refuse(f"{op} of a dequantized value and anything but one constant value has no exact CVM form here")
    s, z, t = x.scale.reshape(()).item(), int(x.zero.reshape(())), x.t
    r = Fraction(float(value)) / s + z
    eff = SWAPPED[op] if swapped else op
    if max(abs(t.lo - z), abs(t.hi - z)) >= 1 << 23:  # products past float32's 24 bits by more than a step: exact
        k = math.floor(r) if eff in ("Greater", "LessOrEqual") else math.ceil(r)
        if op == "Equal" and r.denominator != 1:
            return const(np.zeros(t.shape, bool), BOOL)
    else:  # onnxruntime compares DequantizeLinear's float32 (t - z) s, within half a step of the exact product
        near = [v for v in range(math.floor(r) - 1, math.ceil(r) + 2) if t.lo <= v <= t.hi]
        hold = {v: bool(COMPARED[eff](dequantized32(v - z, s), value)) for v in near}
        if op == "Equal":
            equal = [v for v, held in hold.items() if held]
            if len(equal) > 1:
                raise Refuse(f"Equal of a dequantized value and {float(value):g}: {len(equal)} integers' float32 "
                             "values equal it")
            if not equal:
                return const(np.zeros(t.shape, bool), BOOL)
            k = equal[0]
        elif eff in ("Greater", "GreaterOrEqual"):  # true from the first integer that holds on
            k = min((v for v, held in hold.items() if held), default=math.ceil(r) + 2)
            k -= eff == "Greater"
        else:  # Less, LessOrEqual: true up to the last integer that holds
            k = max((v for v, held in hold.items() if held), default=math.floor(r) - 2)
            k += eff == "Less"
    k = const(np.array(min(max(k, t.lo - 1), t.hi + 1), np.int32), INT32)
    return integer_rule(node)(ctx, node, *((k, t) if swapped else (t, k)))


#: The float comparisons, on onnxruntime's float32 values.
COMPARED = {"Equal": np.equal, "Greater": np.greater, "Less": np.less, "GreaterOrEqual": np.greater_equal,
            "LessOrEqual": np.less_equal}


def dequantized32(u: int, s) -> np.float32:
    """DequantizeLinear's float32 value of the integer u = t - z at scale s: (float)u * s, rounded once."""
    return np.float32(np.float32(u) * np.float32(float(s)))


@float_rule("IsNaN", since=9)
@float_rule("IsInf", since=10)
def never_rule(ctx, node, x):
    """IsNaN, IsInf of a dequantized value: (t - z) s, an integer times a finite scale, is never NaN, nor infinite
    (DequantizeLinear refuses values past float32's range): false everywhere, a constant (torch's attention export
    then takes Where(IsNaN(softmax), 0, softmax)'s other branch). Exact."""
    x = scaled(x, f"the {node.op_type} input", clipped_ok=True)
    return const(np.zeros(x.shape, bool), BOOL)


@float_rule("GlobalLpPool", since=2)
def global_lp_pool_rule(ctx, node, x):
    """GlobalLpPool of a per-tensor dequantized x = u s: p = 1, the exact sum of |u| over the image at s; p = 2, the
    square root of the exact sum of u^2 at s^2 (``powers``, ``image_sum``): a table of it, or its exact root
    (``roots.Root``) past a table's 2^16 integers. Other p refused."""
    p = node.attr_int("p", 2)
    if p not in (1, 2):
        raise Refuse(f"GlobalLpPool p={p}: only p = 1 and p = 2 have an exact form here")
    x = per_tensor(scaled(x, "the GlobalLpPool input"), "GlobalLpPool")
    if p == 2:
        float32_sum(x, math.prod(x.shape[2:]), "GlobalLpPool's sum")
    v = powers(ctx, x, p == 2)
    total = replace(v, t=image_sum(ctx, v.t))
    if p == 1:
        return total
    return root(total, 2, node.name, "GlobalLpPool") if wide(total) else mapped(total, np.sqrt, "GlobalLpPool")


@float_rule("LpPool", since=2)
def lp_pool_rule(ctx, node, x):
    """LpPool of a per-tensor dequantized x = u s over any number of spatial axes (pads, auto_pad, strides,
    dilations, ceil_mode): the windows' exact sums of |u| (p = 1, at s) or of u^2 (p = 2, at s^2; then its square
    root as GlobalLpPool's), the padding adding 0, summed axis by axis (``summed_windows``); an auto_pad whose total
    is negative crops, as onnxruntime's pools. Other p refused."""
    p = node.attr_int("p", 2)
    if p not in (1, 2):
        raise Refuse(f"LpPool p={p}: only p = 1 and p = 2 have an exact form here")
    x = per_tensor(scaled(x, "the LpPool input"), "LpPool")
    n = len(x.shape) - 2
    if n < 1:
        raise Refuse(f"LpPool of a rank-{len(x.shape)} input: it takes (N, C, spatial...)")
    kernel = node.attr_ints("kernel_shape", lo=1, size=n)
    strides = node.attr_ints("strides", [1] * n, lo=1, size=n)
    dilations = node.attr_ints("dilations", [1] * n, lo=1, size=n)
    if node.attr_str("auto_pad", "NOTSET").startswith("SAME") and max(dilations) > 1:
        raise Refuse("LpPool with auto_pad SAME and dilations: onnxruntime pads for the undilated kernel, its output "
                     "shape not ONNX's")
    begin, end = onnx_pads(node, x.shape[2:], kernel, strides, dilations, crop=True)
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    _, outs = ceil_ends(node, x.shape[2:], spans, strides, begin, end)
    if p == 2:
        float32_sum(x, math.prod(kernel), "LpPool's sum")
    v = powers(ctx, x, p == 2)
    total = replace(v, t=summed_windows(ctx, v.t, kernel, strides, dilations, begin, outs))
    if p == 1:
        return total
    return root(total, 2, node.name, "LpPool") if wide(total) else mapped(total, np.sqrt, "LpPool")


@float_rule("LpNormalization", since=1)
def lp_normalization_rule(ctx, node, x):
    """LpNormalization of a per-tensor dequantized x = u s along ``axis`` (a row of zeros gives 0, as onnxruntime's
    kernel): p = 2, an ``L2Normalized`` (of a value computed after the last QuantizeLinear, a masked mean's quotient:
    ``l2norm.normalized``); p = 1, the ``Quotient`` u / V of u by V = max(sum |u|, 1) over the row at the same scale
    (V = 1 only on a row of zeros, whose u / V is 0). Integers by the QuantizeLinear that follows. Refused where
    onnxruntime's float32 sum may pass its range (then inf: its output 0)."""
    p = node.attr_int("p", 2)
    if p not in (1, 2):
        raise Refuse(f"LpNormalization p={p} has no CVM form (p = 1 and p = 2 have)")
    rank = len(x.shape)
    [axis] = normal([node.attr_int("axis", -1)], rank, "LpNormalization axis")
    view = (math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:]))

    def checked(v) -> Scaled:
        v = per_tensor(scaled(v, "the LpNormalization input"), "LpNormalization")
        float32_sum(v, view[1], "LpNormalization's sum", p)
        return v

    if p == 2:
        return normalized(x, lambda v: L2Normalized(checked(v), view, Fraction(0), Fraction(0), Fraction(0), False,
                                                    node.name))
    x = checked(x)
    v = powers(ctx, x, False)
    total = reduced(ctx, "sum", ctx.reshape(v.t, view), [1], 0, view[1] * v.t.hi)
    e = ctx.emit("clip", ctx.entry(total), a_min=1, a_max=max(total.hi, 1))
    keep = x.shape[:axis] + (1,) + x.shape[axis + 1:]
    total = ctx.reshape(ctx.result(e, INT32, 1, max(total.hi, 1), total.shape), keep)
    return Quotient(x, Scaled(total, v.scale, np.zeros((), np.int64)), Fraction(1))  # |u| <= sum |u| <= V


@float_rule("ReduceLogSum", since=1)
def reduce_log_sum_rule(ctx, node, x, axes_t=None):
    """ReduceLogSum of a per-tensor dequantized x: Log of ReduceSum's exact sum of x - z at s_x (a table over the
    sum's integers, as Log's: log(0) = -inf saturates; refused where the sum reaches below 0, where Log is NaN).
    Refused with noop_with_empty_axes and no axes."""
    x = per_tensor(scaled(x, "the ReduceLogSum input"), "ReduceLogSum")
    total = summed(ctx, node, x, lambda: minus_zero(ctx, x.t, x.zero), axes_t, 18, x.scale.reshape(()).item(), False)
    if total is x:
        raise Refuse("ReduceLogSum with noop_with_empty_axes and no axes has no CVM form here")
    return defined("ReduceLogSum", mapped(total, FUNCTIONS["Log"](node), "ReduceLogSum"))


@float_rule("Trilu", since=14)
def trilu_rule(ctx, node, x, k=None):
    """Trilu of a dequantized x = (t - z) s: the integer rule on t - z (times the 0/1 mask of the triangle kept),
    at s, zero point 0: the values dropped are 0 = (z - z) s. Exact."""
    x = scaled(x, "the Trilu input")
    return Scaled(integer_rule(node)(ctx, node, minus_zero(ctx, x.t, x.zero), k), x.scale, np.zeros((), np.int64))


@float_rule("Where", since=9)
def where_rule(ctx, node, cond, a, b):
    """cond ? x : y of dequantized values on one grid (one scale and zero point per tensor), a constant branch
    taken onto the other's grid where it lies on it (div_no_nan's 0: (z - z) s): the integer where of their
    integers, the scale and zero point kept. Two constant branches: on the grid of the first (per tensor) that the
    other lies on (an attention mask's Where(keep, 0, -3.4e38) at -3.4e38's grid, where 0 is (z - z) s). Exact.
    Two computed branches on different grids (scales, zero points, per channel, a sum, a table): deferred to the
    QuantizeLinear that follows (``Selected``), and so is a float constant branch off the other's grid (a
    masked_fill's -3.4e38 before a max pooling): its QuantizeLinear exactly rounded and saturated. A constant
    condition of one value (a masked_fill by a mask folded to ones) is the branch it selects where that branch has
    the output's shape: the same values."""
    if isinstance(cond, Real):
        raise Refuse("Where with a float condition has no CVM form (compare first)")
    if isinstance(cond, Tensor) and cond.is_const and cond.value.size and \
            (np.asarray(cond.value).all() or not np.asarray(cond.value).any()):
        chosen = a if np.asarray(cond.value).all() else b
        shapes = [getattr(v, "shape", None) for v in (cond, a, b)]
        try:
            whole = np.broadcast_shapes(*shapes) if None not in shapes else None
        except ValueError:
            raise Refuse(f"Where of shapes {shapes}: they do not broadcast") from None
        if whole is not None and chosen.shape == whole:
            return chosen
    x = next((v for v in (a, b) if isinstance(v, Scaled) and not v.t.is_const), None)
    if x is not None and x.per_tensor:
        try:
            return _where_on(ctx, node, cond, a, b, x)
        except Refuse:
            pass
    if all(isinstance(v, Real) and constant_values(v) is None for v in (a, b)) or x is not None and x.per_tensor \
            and all(v is x or is_float_const(v) or isinstance(v, Scaled) and v.t.is_const for v in (a, b)):
        return Selected(node, cond, a, b)
    if x is not None:
        return _where_on(ctx, node, cond, a, b, per_tensor(x, "a Where branch"))
    for x in (a, b):
        if isinstance(x, Scaled) and x.per_tensor:
            try:
                return _where_on(ctx, node, cond, a, b, x)
            except Refuse:
                pass
    raise Refuse("Where of two constant branches on no one grid has no integer form here")


def masked_where(ctx, node, cond, a, b):
    """Where(cond, x, c) or Where(cond, c, x) of the scores x a Softmax or ReduceLogSumExp reads (``mask_terms``:
    GPT-2's causal Where, its padding term added after), c a float constant of one value below 0: ``KeptScores``, x'
    = (t - z) keep at x's scale and zero point 0 (keep = cond, or Not(cond): ``looked_up`` of a table) and the term
    Where(cond, 0, c) (Where(cond, c, 0)), whose sum float32 computes as it computes the Where (x + 0 and 0 + c are
    exact); any other Where by ``where_rule`` (one keeping everywhere: x)."""
    x, c = (a, b) if isinstance(a, Scaled) else (b, a)
    v = constant_values(c)
    if not isinstance(x, Scaled) or x.t.is_const or not x.per_tensor or not is_float_const(c) or v.size != 1 or \
            not v.reshape(()) < 0 or isinstance(cond, Real) and not isinstance(cond, Tabulated):
        return where_rule(ctx, node, cond, a, b)
    zero = const(np.zeros((), np.asarray(c.value).dtype), c.dtype)
    term = tabulated(ctx, node, cond, *((zero, c) if x is a else (c, zero)))
    if not isinstance(term, Tabulated):  # a condition of one value
        kept = not np.asarray(term.value).any() and broadcasts_into(term.shape, x.shape)
        return x if kept else where_rule(ctx, node, cond, a, b)
    keep = looked_up(ctx, term, np.asarray(term.table) == 0)
    t = minus_zero(ctx, x.t, x.zero.reshape(()))
    kept = ctx.apply("broadcast_mul", t, as_int32(keep), shape=broadcast_shape(t, keep))
    return KeptScores(replace(x, t=kept, zero=np.zeros((), np.int64)), term)


def _where_on(ctx, node, cond, a, b, x: Scaled):
    """``where_rule`` on the grid of the branch ``x`` (per tensor)."""
    s, z = x.scale.reshape(()).item(), int(x.zero.reshape(()))

    def on_grid(v) -> Tensor:
        if v is x:
            return x.t
        if isinstance(v, Scaled) and v.per_tensor and v.scale.reshape(()).item() == s and \
                int(v.zero.reshape(())) == z:
            return v.t
        if isinstance(v, Scaled) and v.t.is_const:
            real = (v.t.value.astype(np.int64) - v.zero) * v.scale
        elif is_float_const(v) and np.isfinite(np.asarray(v.value, np.float64)).all():
            real = np.vectorize(lambda f: Fraction(float(f)), otypes=[object])(np.asarray(v.value))
        else:
            raise Refuse("Where of branches on different grids (scales or zero points) has no exact CVM form here")
        k = np.vectorize(lambda r: r / s + z, otypes=[object])(np.asarray(real, dtype=object))
        if any(q.denominator != 1 for q in k.flat):
            raise Refuse("Where of a constant branch off the other branch's grid has no exact CVM form here")
        if any(not INT_RANGES[INT32][0] <= q <= INT_RANGES[INT32][1] for q in k.flat):
            raise Refuse("Where of a constant branch past 32 bits on the other branch's grid has no CVM form")
        return const(k.astype(np.int64), INT32)

    return replace(x, t=integer_rule(node)(ctx, node, cond, on_grid(a), on_grid(b)))


@float_rule("Pow", since=7)
def pow_rule(ctx, node, x, y):
    """x^k for a constant exponent k: for an integer 1 <= k <= 4 (a LayerNormalization's square, a generalized
    mean's power) k - 1 exact Muls, the result's interval that of u^k (u = t - z: at least 0 for an even k);
    for any other k a table over x's integers (float64 power), refused where it is undefined on x's range; x^(1/p)
    of a value past a table's 2^16 integers its exact root (``roots.Root``). x^y of two dequantized values: a table
    over both operands' integers at their float32 dequantized values (``Paired``; a negative base to a fractional
    power, NaN, is the output type's minimum)."""
    k = constant_values(y)
    if k is None and isinstance(x, Scaled) and not x.t.is_const and isinstance(y, Scaled):
        return Paired(np.power, x, y, "Pow", float32=True)
    if k is None or k.size != 1 or not np.isfinite(k).all():
        raise Refuse("Pow of a dequantized value by an exponent computed at run time that is not a dequantized value "
                     "(or by a constant not finite) has no integer form")
    k = float(k.reshape(()))
    if isinstance(x, Deferred) and hasattr(x, "then"):
        return mapped(x, lambda v: np.power(v, k), "Pow")
    if wide(x):
        if (p := root_degree(k)) is None:
            raise Refuse(f"Pow by {k:.9g} of a value over {x.t.hi - x.t.lo + 1} integers: a table holds at most 2^16 "
                         f"entries and a root (the exponent 1/p, p an integer 2..{MAX_DEGREE}) has a CVM form "
                         "(quantize its input first)")
        return root(x, p, node.name, f"Pow(., 1/{p})")
    if k != round(k) or not 1 <= k <= 4 or isinstance(x, Mapped):
        return defined("Pow", mapped(x, lambda v: np.power(v, k), "Pow"))
    base = scaled(x, "the Pow base")
    out = base
    for _ in range(int(k) - 1):
        out = multiply(ctx, out, base)
    a, b = base.t.lo - int(base.zero.max()), base.t.hi - int(base.zero.min())  # u = t - z in [a, b]
    ends = sorted((a ** int(k), b ** int(k)))
    low = 0 if k % 2 == 0 and a <= 0 <= b else ends[0]  # u^k's interval: at least 0 for an even k
    return replace(out, t=replace(out.t, lo=max(out.t.lo, low), hi=min(out.t.hi, ends[1])))


@float_rule("Mod", since=10)
def mod_rule(ctx, node, a, b):
    """fmod(a, b) of floats (fmod=1, C's fmod: the sign of a; ONNX takes no other for floats): by a float constant
    b, a table over a's integers; of two dequantized values one table over both operands' integers (``Paired``;
    fmod(a, 0), NaN, is the output type's minimum)."""
    if node.attr_int("fmod", 0) != 1:
        raise Refuse("Mod of floats takes fmod=1 (ONNX defines no other for floats)")
    c = constant_values(b)
    if c is not None:
        if c.size != 1 or not np.isfinite(c).all() or float(c.reshape(())) == 0:
            raise Refuse("Mod of a dequantized value by a constant other than one finite non-zero value has no "
                         "table form here")
        cf = float(c.reshape(()))
        return defined("Mod", mapped(a, lambda v: np.fmod(v, cf), "Mod"))
    return Paired(np.fmod, scaled(a, "the Mod dividend"), scaled(b, "the Mod divisor"), "Mod")


def relu(ctx, x: Scaled) -> Scaled:
    """max(t, zero): exact, the scale is positive."""
    if x.clip != (None, None):
        return replace(x, clip=(max(x.clip[0], Fraction(0)) if x.clip[0] is not None else Fraction(0), x.clip[1]))
    if x.t.lo >= int(x.zero.max()):
        return x
    zc = const(np.broadcast_to(x.zero, x.zero.shape).astype(np.int32), INT32)
    e = ctx.op("broadcast_max", as_int32(x.t), zc)
    t = ctx.result(e, x.t.dtype, max(x.t.lo, int(x.zero.min())), max(x.t.hi, int(x.zero.max())),
                   broadcast_shape(x.t, zc))
    return replace(x, t=t)


@float_rule("Relu", since=6)
def relu_rule(ctx, node, x):
    if isinstance(x, Mapped):
        return mapped(x, lambda v: np.maximum(v, 0), "Relu")
    if isinstance(x, Summed):  # max(x, 0) of a sum: the max of its QuantizeLinear and 0's (``Extreme``)
        return Extreme(True, (x, np.zeros((), np.float64)))
    return relu(ctx, scaled(x, "the Relu input", clipped_ok=True))


@float_rule("Clip", since=11)
def clip_rule(ctx, node, x, lo_t=None, hi_t=None):
    """Clip to real bounds: an integer clip when they lie on x's grid, else deferred to the QuantizeLinear; to a
    computed bound (a log-mel's top_db: max - 80), Max then Min (``Extreme``)."""
    if any(isinstance(b, Real) and constant_values(b) is None for b in (lo_t, hi_t)):
        out = x
        for b, is_max in ((lo_t, True), (hi_t, False)):
            c = None if b is None else constant_values(b)
            if c is not None and (c == (-np.inf if is_max else np.inf)).all():
                continue  # an infinite bound clips nothing
            if c is not None and not np.isfinite(c).all():
                raise Refuse("a Clip bound with non-finite values beside finite ones")
            if b is not None:
                out = Extreme(is_max, (out, b if c is None else c))
        return out
    lo, hi = real_bound(lo_t, "Clip min", -math.inf), real_bound(hi_t, "Clip max", math.inf)
    if isinstance(x, Mapped) or isinstance(x, Deferred) and hasattr(x, "then"):
        return mapped(x, lambda v: np.clip(v, None if lo is None else float(lo), None if hi is None else float(hi)),
                      "Clip")
    return bounded(ctx, scaled(x, "the Clip input", clipped_ok=True), lo, hi)


def bounded(ctx, x: Scaled, lo: Fraction | None, hi: Fraction | None) -> Scaled:
    """x clipped to the real bounds lo, hi (None: unbounded): the integer clip when they lie on x's grid, else a
    clip deferred to the QuantizeLinear, Q(clip(x, lo, hi)) = clip(Q(x), Q(lo), Q(hi)) (rounding is monotone)."""
    if x.clip != (None, None) or not x.per_tensor:  # Clip of a Clip, or per-channel: deferred, bounds combined
        old = x.clip
        lo = old[0] if lo is None else lo if old[0] is None else max(lo, old[0])
        hi = old[1] if hi is None else hi if old[1] is None else min(hi, old[1])
        return replace(x, clip=(lo, hi))
    s, z = x.scale.reshape(()).item(), int(x.zero.reshape(()))
    grid = [None if b is None else b / s + z for b in (lo, hi)]
    if all(g is None or g.denominator == 1 for g in grid):
        a = x.t.lo if grid[0] is None else max(int(grid[0]), x.t.lo)
        b = x.t.hi if grid[1] is None else min(int(grid[1]), x.t.hi)
        if a <= x.t.lo and b >= x.t.hi:
            return x
        if a >= b:
            raise Refuse("the Clip leaves a single value: fold it")
        e = ctx.emit("clip", ctx.entry(as_int32(x.t)), a_min=a, a_max=b)
        return replace(x, t=ctx.result(e, x.t.dtype, a, b, x.shape))
    return replace(x, clip=(lo, hi))


def constant_values(t) -> np.ndarray | None:
    """The float64 values of a float constant, or of a quantized constant as DequantizeLinear computes them
    (float32 (q - z) * s); None for a computed value."""
    if is_float_const(t):
        return np.asarray(t.value, np.float64)
    if isinstance(t, Scaled) and t.t.is_const:
        q = np.broadcast_to(t.t.value.astype(np.int64) - t.zero, broadcast_of(t.shape, t.scale.shape))
        s = np.array([float(v) for v in np.broadcast_to(t.scale, q.shape).flat], np.float32).reshape(q.shape)
        return (q.astype(np.float32) * s).astype(np.float64)
    return None


@float_rule("Max", "Min", since=6)
def extremum_rule(ctx, node, *xs):
    """max/min of dequantized values and constants. Of values of one scale and zero point: the integer max/min of
    their integers (the scale is positive). With a constant c: x itself where c never binds on x's range
    (``never_binds``); max(x, c) = Clip(x, c, inf), min(x, c) = Clip(x, -inf, c) (``bounded``: exact on the grid,
    else deferred to the QuantizeLinear); a constant array of one value that scalar; one on x's grid the integer
    max/min, one off it deferred (``Extreme``). Of a float function's value: the table's values max'ed (min'ed)
    with a scalar c. Of values of different scales, a sum, Softmax: deferred (``Extreme``)."""
    is_max = node.op_type == "Max"
    consts = [c for c in (constant_values(x) for x in xs) if c is not None]
    values = [x for x in xs if constant_values(x) is None]
    c = functools.reduce(np.maximum if is_max else np.minimum, consts) if consts else None
    if not values:
        raise Refuse(f"{node.op_type} of constants only: fold it")
    if len(values) == 1 and isinstance(values[0], Mapped):
        if c is None or c.size != 1:
            raise Refuse(f"{node.op_type} of a float function's value with anything but one constant scalar")
        cf = float(c.reshape(()))
        return mapped(values[0], lambda v: (np.maximum if is_max else np.minimum)(v, cf), node.op_type)
    alike = all(isinstance(v, Scaled) and v.per_tensor and v.clip == (None, None) for v in values) and all(
        v.scale.reshape(()).item() == values[0].scale.reshape(()).item() and int(v.zero.reshape(())) ==
        int(values[0].zero.reshape(())) for v in values)
    if (len(values) > 1 and not alike) or not isinstance(values[0], (Scaled, Tensor)):  # the max (min) of
        # their quantizations (Extreme)
        operands = tuple(values) + (() if c is None else (c,))
        return Extreme(is_max, operands)
    xs_ = [scaled(x, f"a {node.op_type} operand", clipped_ok=len(values) == 1) for x in values]
    x = xs_[0]
    if len(xs_) > 1:
        t = extreme(ctx, is_max, [as_int32(v.t) for v in xs_])
        x = replace(x, t=replace(t, dtype=x.t.dtype) if len({v.t.dtype for v in xs_}) == 1 else t)
    if c is None or never_binds(x, c, is_max):
        return x
    if c.size > 1 and (c == c.flat[0]).all() and broadcasts_into(c.shape, x.shape):
        c = c.reshape(-1)[:1]  # one value throughout, not broadcasting x: that scalar
    if c.size == 1:
        cf = float(c.reshape(()))
        if math.isnan(cf):
            raise Refuse(f"{node.op_type} with a NaN constant is NaN throughout: no integer form")
        if math.isinf(cf):
            if (cf < 0) == is_max:
                return x
            raise Refuse(f"{node.op_type} with {cf} is that constant: fold it")
        b = Fraction(cf)
        return bounded(ctx, x, b, None) if is_max else bounded(ctx, x, None, b)
    x = per_tensor(x, f"{node.op_type} with a constant array")
    if np.isnan(c).any():
        raise Refuse(f"{node.op_type} with a NaN in its constant array is NaN there: no integer form")
    s, z = x.scale.reshape(()).item(), int(x.zero.reshape(()))
    grid = np.array([Fraction(float(v)) / s + z if np.isfinite(v) else Fraction(1, 2) for v in c.flat], dtype=object)
    if any(g.denominator != 1 or not -(1 << 30) < g < 1 << 30 for g in grid):  # off the grid, or past 31 bits on
        return Extreme(is_max, (x, c))  # it (less z is then past 32): the max (min) of both quantized at the output's
    k = np.array([int(g) for g in grid], np.int64).reshape(c.shape)
    t = extreme(ctx, is_max, [as_int32(x.t), const(k, INT32)])
    return replace(x, t=replace(t, dtype=x.t.dtype) if x.t.lo <= t.lo and t.hi <= x.t.hi else t)


def never_binds(x: Scaled, c: np.ndarray, is_max: bool) -> bool:
    """Whether max(x, c) (min(x, c)) is x on x's whole range: a per-tensor x and every value of c, broadcasting into
    x's shape, at most (at least) x's least (greatest) value (an initial state's -1e38; -inf (inf) too)."""
    if not x.per_tensor or x.clip != (None, None) or not broadcasts_into(c.shape, x.shape) or np.isnan(c).any():
        return False
    z, s = int(x.zero.reshape(())), x.scale.reshape(()).item()
    end = (x.t.lo - z) * s if is_max else (x.t.hi - z) * s
    def below(v: float) -> bool:  # v never above x's least value (for Min: never below its greatest)
        if math.isinf(v):
            return (v < 0) == is_max
        return Fraction(v) <= end if is_max else Fraction(v) >= end
    return all(below(float(v)) for v in c.flat)


class Paired(Deferred):
    """fn(a, b) of two dequantized values (a / b and a^b of computed values, exp(x - m) at two scales): QuantizeLinear
    of it is one cvm_lut over both operands' integers, index (t_a - lo_a) R_b + (t_b - lo_b) (broadcast_mul,
    broadcast_add), R_a R_b <= 2^16 entries, each sat(round(fn(real a, real b) / s_out) + z_out) in float64 (the
    exactly rounded value of fn at the exact inputs; an infinite value saturates; NaN (0 / 0) is the output type's
    minimum, as onnxruntime's QuantizeLinear gives it). ``float32``: fn at the inputs as DequantizeLinear gives them,
    float32(t - z) * float32(s) rounded to float32 (Pow: a negative base has a power only where that exponent is a
    whole number). ``summed``: fn(a, b) is a function of a + b, and where the entries are a step function of one
    integer D = t_a A + t_b B the same outputs come from far fewer entries (``pair_sums.counted_sum``). ``bound``: a
    known bound on |fn(a, b)| (a masked mean's: ``masked_bound``), which its float output's interval takes."""

    def __init__(self, fn, a: Scaled, b: Scaled, what: str, float32: bool = False, summed: bool = False,
                 bound: Fraction | None = None):
        self.fn, self.a, self.b, self.what = fn, per_tensor(a, what), per_tensor(b, what), what
        self.float32, self.summed, self.bound = float32, summed, bound
        self.shape = broadcast_shape(a.t, b.t)
        if (a.t.hi - a.t.lo + 1) * (b.t.hi - b.t.lo + 1) > MAX_TABLE:
            raise Refuse(f"{what} of two values over {a.t.hi - a.t.lo + 1} x {b.t.hi - b.t.lo + 1} integers: a table "
                         f"of at most 2^16 entries has a CVM form")

    def grid(self) -> np.ndarray:
        """fn at every (a, b) pair of the operands' integers, rows a, columns b."""
        def real(x: Scaled) -> np.ndarray:
            q = np.arange(x.t.lo, x.t.hi + 1, dtype=np.int64) - int(x.zero.reshape(()))
            s = float(x.scale.reshape(()).item())
            if self.float32:
                return (q.astype(np.float32) * np.float32(s)).astype(np.float64)
            return q * s
        with np.errstate(all="ignore"):
            return np.asarray(self.fn(real(self.a)[:, None], real(self.b)[None, :]), np.float64)

    def quantized(self, ctx, scale: np.ndarray, out_zero: int, dtype: int) -> Tensor:
        if scale.size != 1:
            raise Refuse(f"{self.what} with a per-channel output scale has no CVM form")
        lo, hi = INT_RANGES[dtype]
        image = self.grid()
        with np.errstate(all="ignore"):  # an infinite (or beyond float64) value saturates
            values = np.clip(np.rint(image / float(scale.reshape(()).item())) + out_zero, lo, hi)
        values = np.where(np.isnan(image), lo, values).astype(np.int64)
        ctx.requants.append(Requant(ctx.base, (), None))
        if self.summed and (r := counted_sum(ctx, self.a, self.b, values, dtype, self.what)) is not None:
            return r
        ra, rb = self.a.t.hi - self.a.t.lo + 1, self.b.t.hi - self.b.t.lo + 1
        ia = minus_zero(ctx, self.a.t, np.asarray(self.a.t.lo))
        ib = minus_zero(ctx, self.b.t, np.asarray(self.b.t.lo))
        if rb > 1:
            k = const(np.array(rb, np.int32), INT32)
            ia = ctx.result(ctx.op("broadcast_mul", ia, k), INT32, 0, (ra - 1) * rb, ia.shape)
        index = ctx.result(ctx.op("broadcast_add", ia, ib), INT32, 0, ra * rb - 1, self.shape)
        e = ctx.emit("cvm_lut", ctx.entry(index), ctx.entry(const(values.reshape(-1), INT32)), in_dim=ra * rb)
        return ctx.result(e, dtype, int(values.min()), int(values.max()), self.shape)


class Quotient(Deferred):
    """a / b of two sums of dequantized values (``Summed``, or one ``Scaled``; computed terms per tensor):
    QuantizeLinear of it is sat(sign(N) sign(D) round(|N| / |D|) + z_out), N = sum_i (t_i - z_i) n_i + K_N,
    D = sum_j (u_j - y_j) d_j + K_D, n_i = round(s_i c), d_j = round(r_j s_out c), c = L / (r_0 s_out) (``plan``:
    d_0 = L exactly), the constant terms and zero points rounded into K_N, K_D; round(|N| / |D|) = floor((2|N| + |D|)
    / (2|D|)) (broadcast_div of values >= 0), at most hi - lo + 1; D = 0 gives the type's maximum for N > 0, else
    its minimum (a / 0 = +-inf saturates, 0 / 0 = NaN is the minimum, as onnxruntime). With v = a / (b s_out),
    e_N = N - c a and e_D = D - c b s_out, N / D - v = (e_N - v e_D) / D: the output is within
    1/2 + (|e_N| + |v| |e_D|) / |D| of v (docs/import.md, "Quotients of sums"). A divisor of one ``Scaled`` with
    a deferred Clip to real bounds (lo, hi): D clipped to their integers (``clip_ends``), |e_D| within
    max(|e_D|, 1) of the clipped value. ``bound``: a known bound on |a / b| (LpNormalization p = 1: 1; a masked mean's,
    ``masked_bound``), which its float output's interval takes."""

    def __init__(self, a, b, bound: Fraction | None = None):
        self.what, self.bound = "Div", bound
        self.a = self.terms(a, "the dividend")
        self.clip = b.clip if isinstance(b, Scaled) else (None, None)
        self.b = self.terms(replace(b, clip=(None, None)) if isinstance(b, Scaled) else b, "the divisor")
        if all(t.t.is_const for t in self.b):
            raise Refuse("Div by a constant that is no float constant has no CVM form here")
        self.shape = broadcast_shape(*(t.t for t in self.a + self.b))
        self.ends = [self.constant_ends(terms) for terms in (self.a, self.b)]

    @staticmethod
    def terms(x, what: str) -> list[Scaled]:
        terms = list(x.terms) if isinstance(x, Summed) else [scaled(x, what)]
        for t in terms:
            if not t.t.is_const:
                per_tensor(t, f"{what} of a Div of sums")
        return terms

    @staticmethod
    def integers(terms: list[Scaled], c: Fraction) -> tuple[list[tuple[Scaled, int]], np.ndarray]:
        """(x_i, round(s_i c)) of the computed terms and the constant K (the constant terms, rounded)."""
        products, k = [], np.zeros((), object)
        for t in terms:
            if t.t.is_const:
                real = (t.t.value.astype(np.int64).astype(object) - t.zero.astype(object)) * t.scale
                k = k + np.vectorize(lambda r: r * c, otypes=[object])(np.asarray(real, dtype=object))
                continue
            products.append((t, round(t.scale.reshape(()).item() * c)))
        k = np.vectorize(round, otypes=[object])(np.asarray(k, dtype=object)).astype(np.int64)
        return products, k

    @staticmethod
    def constant_ends(terms: list[Scaled]) -> tuple[Fraction, Fraction]:
        """The sum of the constant terms' least values and the sum of their largest (0, 0 without any)."""
        lo = hi = Fraction(0)
        for t in terms:
            if t.t.is_const:
                real = np.asarray((t.t.value.astype(np.int64).astype(object) - t.zero.astype(object)) * t.scale,
                                  dtype=object)
                lo, hi = lo + min(real.flat), hi + max(real.flat)
        return lo, hi

    @staticmethod
    def reach(terms: list[Scaled], ends: tuple[Fraction, Fraction], c: Fraction) -> int:
        """A bound on |sum_i (t_i - z_i) round(s_i c) + K| and on each partial sum ``sum`` makes on the way, in its
        order (the computed terms, then K, whose constant part lies between c lo and c hi, rounded)."""
        lo = hi = peak = 0
        for t in terms:
            if not t.t.is_const:
                n = round(t.scale.reshape(()).item() * c)
                z = int(t.zero.reshape(()))
                lo, hi = lo + min((t.t.lo - z) * n, (t.t.hi - z) * n), hi + max((t.t.lo - z) * n, (t.t.hi - z) * n)
                peak = max(peak, -lo, hi)
        return max(peak, -(lo + math.floor(ends[0] * c)), hi + math.ceil(ends[1] * c))

    def sum(self, ctx, products: list[tuple[Scaled, int]], k: np.ndarray) -> Tensor:
        """sum_i (t_i - z_i) n_i + K, each product and partial sum within ``reach``."""
        if all(n == 0 for _, n in products):
            raise Refuse("Div of sums whose computed terms vanish at the quotient's scale has no CVM form here")
        acc = None
        for x, n in sorted(products, key=lambda p: p[1] == 0):
            if n == 0 and broadcast_shape(acc, x.t) == acc.shape:
                continue  # a vanished term (its multiplier 0); one of a wider shape is kept, times 0, for its shape
            u = ctx.apply("broadcast_mul", minus_zero(ctx, x.t, x.zero.reshape(())),
                          const(np.array(n, np.int32), INT32), shape=x.shape)
            acc = u if acc is None else ctx.apply("broadcast_add", acc, u, shape=broadcast_shape(acc, u))
        kc = const(k.astype(np.int32), INT32)
        return ctx.apply("broadcast_add", acc, kc, shape=broadcast_shape(acc, kc)) if k.any() else acc

    def clip_ends(self, k: Fraction) -> tuple[int | None, int | None]:
        """The divisor's Clip bounds at D's scale k = c s_out, round(bound k): a bound > 0 at least 1, one < 0 at
        most -1 (a divisor clipped away from 0 stays nonzero: a masked mean's empty row is 0 / 1, not 0 / 0)."""
        def end(b: Fraction | None) -> int | None:
            if b is None:
                return None
            v = round(b * k)
            return max(v, 1) if b > 0 else min(v, -1) if b < 0 else v
        return end(self.clip[0]), end(self.clip[1])

    def divisor_reach(self, scale: Fraction, k: int) -> int:
        """``reach`` of the divisor at D's scale, made at that scale times 2^k; its Clip's integers too."""
        return max([self.reach(self.b, self.ends[1], scale * (1 << k))] +
                   [abs(e) for e in self.clip_ends(scale) if e is not None])

    def plan(self, s_out: Fraction) -> tuple[Fraction, int]:
        """(c, k): c = L / (2^k r_0 s_out), D made at c s_out 2^k and rounded to 2^-k of it. k = 0 where some L >= 1
        keeps |N| and |D| within 2^QUOTIENT_BITS: L_max the largest; else (a masked mean's sum of 1200 values over a
        count of 1200 mask steps) the k <= 30 of the largest L_max / 2^k keeping |N| and that fine D within it. The
        L of the last ``QUOTIENT_SEARCH`` up to L_max whose multipliers are nearest exact (least sum max|u - y|
        |exact - rounded|): with other computed divisor terms, d_j = round(L r_j / r_0); where k > 0, the dividend's
        n_i too."""
        def width(t: Scaled) -> int:
            return max(abs(t.t.lo - int(t.zero.reshape(()))), abs(t.t.hi - int(t.zero.reshape(()))))

        computed = sorted((t for t in self.b if not t.t.is_const),
                          key=lambda t: width(t) * t.scale.reshape(()).item(), reverse=True)
        r0 = computed[0].scale.reshape(()).item()

        def largest(k: int) -> int:
            def fits(n: int) -> bool:
                c = Fraction(n, 1 << k) / (r0 * s_out)
                return max(self.reach(self.a, self.ends[0], c), self.divisor_reach(c * s_out, k)) <= 1 << QUOTIENT_BITS

            low, high = 0, 1 << QUOTIENT_BITS  # fits(low), not fits(high + 1)
            while low < high:
                mid = (low + high + 1) // 2
                low, high = (mid, high) if fits(mid) else (low, mid - 1)
            return low

        k, low = 0, largest(0)
        if low < 1:
            k, low = max(((j, largest(j)) for j in range(1, 31)), key=lambda p: (Fraction(p[1], 1 << p[0]), -p[0]))
        if low < 1:
            raise Refuse(f"Div of sums too wide for a 32-bit quotient: its dividend and divisor pass 2^{QUOTIENT_BITS}")
        terms = [(t, t.scale.reshape(()).item() / r0) for t in computed[1:]]
        if k:
            terms += [(t, t.scale.reshape(()).item() / (r0 * s_out * (1 << k))) for t in self.a if not t.t.is_const]
        best = low
        if terms:
            ls = np.arange(max(low - QUOTIENT_SEARCH, low // 2, 1), low + 1, dtype=np.float64)
            cost = sum(width(t) * np.abs(ls * float(x) - np.rint(ls * float(x))) for t, x in terms)
            best = int(ls[int(np.argmin(cost))])
        return Fraction(best, 1 << k) / (r0 * s_out), k

    def quantized(self, ctx, scale: np.ndarray, out_zero: int, dtype: int) -> Tensor:
        if scale.size != 1:
            raise Refuse("Div of sums with a per-channel output scale has no CVM form")
        s_out = scale.reshape(()).item()
        lo, hi = INT_RANGES[dtype]
        c, k = self.plan(s_out)
        n = self.sum(ctx, *self.integers(self.a, c))
        d = self.sum(ctx, *self.integers(self.b, c * s_out * (1 << k)))
        if k:  # D = sign(D_k) max(floor((|D_k| + 2^(k-1)) / 2^k), 1) for D_k != 0: D_k / 2^k rounded half away
            # from zero, a divisor that is not 0 kept so (within 1 of D_k / 2^k)
            ad = ctx.apply("abs", d, shape=d.shape)
            half = ctx.apply("broadcast_add", ad, const(np.array(1 << (k - 1), np.int32), INT32), shape=d.shape)
            whole = ctx.apply("broadcast_div", half, const(np.array(1 << k, np.int32), INT32), shape=d.shape)
            whole = ctx.apply("broadcast_max", whole, ctx.apply("clip", ad, shape=d.shape, a_min=0, a_max=1),
                              shape=d.shape)
            d = ctx.apply("broadcast_mul", whole, ctx.apply("clip", d, shape=d.shape, a_min=-1, a_max=1),
                          shape=d.shape)
        if self.clip != (None, None):
            low, high = self.clip_ends(c * s_out)
            if low is not None and high is not None and low >= high:
                raise Refuse("the divisor's Clip leaves a single value: fold it")
            d = ctx.apply("clip", d, shape=d.shape, a_min=min(d.lo, high) if low is None else low,
                          a_max=max(d.hi, low) if high is None else high)

        def c32(v: int) -> Tensor:
            return const(np.array(v, np.int32), INT32)

        def signs(x: Tensor, bias: int) -> Tensor:  # clip(2x + bias, -1, 1): sign(x), 0 counted as -bias
            two = ctx.apply("broadcast_add", x, x, shape=x.shape)
            return ctx.apply("clip", ctx.apply("broadcast_add", two, c32(bias), shape=x.shape), shape=x.shape,
                             a_min=-1, a_max=1)

        an, ad = ctx.apply("abs", n, shape=n.shape), ctx.apply("abs", d, shape=d.shape)
        top = ctx.apply("broadcast_add", ctx.apply("broadcast_add", an, an, shape=an.shape), ad, shape=self.shape)
        q = ctx.apply("broadcast_div", top, ctx.apply("broadcast_add", ad, ad, shape=ad.shape), shape=self.shape)
        big = hi - lo + 1
        zero = ctx.apply("broadcast_greater", c32(1), ad, shape=ad.shape)  # D = 0: q is 0, raised to ``big``
        q = ctx.apply("broadcast_add", q, ctx.apply("broadcast_mul", zero, c32(big), shape=ad.shape),
                      shape=self.shape)
        q = ctx.apply("clip", q, shape=self.shape, a_min=0, a_max=big)
        sign = ctx.apply("broadcast_mul", signs(n, -1), signs(d, 1), shape=self.shape)
        r = ctx.apply("broadcast_mul", q, sign, shape=self.shape)
        ctx.requants.append(Requant(ctx.base, (), None))
        return saturate(ctx, r, out_zero, lo, hi, dtype, self.shape)


class Odd(Deferred):
    """|x| (Abs) or -x (Neg) of a sum x: QuantizeLinear of it is sat(|r| + z_out) (sat(z_out - r)), r the sum's
    requantization at the output's scale and zero point 0 as int16. Rounding half to even is odd, round(-v) =
    -round(v), so round(|v| / s) = |round(v / s)|: r within 1/2 + delta of v / s, |r| (-r) is within 1/2 + delta
    of |v| / s (-v / s), as each requantization's bound states; r saturated at -2^15 or 2^15 - 1 saturates the
    output alike where the output type's values lie within 2^15 - 1 of its zero point (8-bit types)."""

    def __init__(self, op: str, x: Summed):
        self.op, self.x, self.shape, self.what = op, x, x.shape, f"{op} of a sum"

    def quantized(self, ctx, scale: np.ndarray, out_zero: int, dtype: int) -> Tensor:
        lo, hi = INT_RANGES[dtype]
        if max(hi - out_zero, out_zero - lo) > (1 << 15) - 1:
            raise Refuse(f"{self.what} with an output of type {type_name(dtype)} has no CVM form here (8-bit types)")
        r = quantize(ctx, self.x, scale, np.zeros((), np.int64), INT16)
        r = ctx.apply("abs" if self.op == "Abs" else "negative", r, shape=self.shape)
        return saturate(ctx, r, out_zero, lo, hi, dtype, self.shape)


class Extreme(Deferred):
    """max (min) of real values of any forms and float constants: QuantizeLinear of it is the max (min) of each
    operand's QuantizeLinear at the output's scale (its requantization, table, ...; a constant's exactly rounded),
    as rounding is monotone: each operand's integer is within 1/2 + delta of its exact value, and so is the max
    (|max(p, q) - max(P, Q)| <= max(|p - P|, |q - Q|))."""

    def __init__(self, is_max: bool, operands: tuple):
        self.is_max, self.operands = is_max, operands
        self.what = "Max" if is_max else "Min"
        try:
            self.shape = tuple(np.broadcast_shapes(*(np.shape(x) if isinstance(x, np.ndarray) else x.shape
                                                     for x in operands)))
        except ValueError:
            raise Refuse(f"{self.what} of shapes that do not broadcast") from None

    def quantized(self, ctx, scale: np.ndarray, out_zero: int, dtype: int) -> Tensor:
        lo, hi = INT_RANGES[dtype]
        t = extreme(ctx, self.is_max, each_quantized(ctx, self.what, self.operands, scale, out_zero, dtype))
        return replace(t, dtype=dtype, lo=max(t.lo, lo), hi=min(t.hi, hi))


def each_quantized(ctx, what: str, operands, scale: np.ndarray, out_zero: int, dtype: int) -> list[Tensor]:
    """Each operand's QuantizeLinear at the output's scale and zero point as int32: a real value's (its
    requantization, table, ...), a float constant's exactly rounded (half to even, saturated; +-inf the type's
    ends); refused for a float value no DequantizeLinear gives, a NaN constant."""
    if scale.size != 1:
        raise Refuse(f"{what} of values of different scales with a per-channel output scale has no CVM form")
    s = scale.reshape(()).item()
    lo, hi = INT_RANGES[dtype]
    ints = []
    for x in operands:
        if isinstance(x, Tensor):
            if (x := constant_values(x)) is None:
                raise Refuse(f"{what} of a float value that no DequantizeLinear gives has no CVM form")
        if isinstance(x, np.ndarray):
            if np.isnan(x).any():
                raise Refuse(f"{what} of a NaN constant is NaN there: no integer form")
            q = np.array([(hi if v > 0 else lo) if math.isinf(v) else min(max(round(Fraction(float(v)) / s) + out_zero,
                                                                               lo), hi) for v in x.flat], np.int64)
            ints.append(const(q.reshape(x.shape), INT32))
        else:
            ints.append(as_int32(quantize(ctx, x, scale, np.asarray(out_zero), dtype)))
    return ints


class Selected(Deferred):
    """cond ? a : b of two computed real values on different grids, or of one and a float constant off its grid:
    QuantizeLinear of it is the integer where of each branch's QuantizeLinear at the output's scale
    (``each_quantized``), as QuantizeLinear acts on each element alone: Q(where(c, A, B)) = where(c, Q(A), Q(B)),
    each branch within its own requantization's bound (a constant's exact)."""

    def __init__(self, node, cond: Tensor, a, b):
        self.node, self.cond, self.operands, self.what = node, cond, (a, b), "Where"
        try:
            self.shape = tuple(np.broadcast_shapes(cond.shape, a.shape, b.shape))
        except ValueError:
            raise Refuse("Where of shapes that do not broadcast") from None

    def quantized(self, ctx, scale: np.ndarray, out_zero: int, dtype: int) -> Tensor:
        lo, hi = INT_RANGES[dtype]
        a, b = each_quantized(ctx, self.what, self.operands, scale, out_zero, dtype)
        t = integer_rule(self.node)(ctx, self.node, self.cond, a, b)
        return replace(t, dtype=dtype, lo=max(t.lo, lo), hi=min(t.hi, hi))


@float_rule("PRelu", since=7)
def prelu_rule(ctx, node, x, slope):
    """max(x, 0) + a min(x, 0) for a constant slope a (per channel, or any shape broadcast to x): the sum of
    p = max(t, z) at x's scale and zero point and of (t - p) sign(a) (<= 0 times the sign, broadcast_sub and
    broadcast_mul) at scale s |a|, requantized together by the QuantizeLinear that follows (its bound: a sum's)."""
    x = per_tensor(scaled(x, "the PRelu input"), "PRelu")
    a = constant_values(slope)
    if a is None or not np.isfinite(a).all():
        raise Refuse("PRelu with a slope computed at run time or not finite: only a constant slope has an exact form")
    if not broadcasts_into(a.shape, x.shape):
        raise Refuse(f"PRelu slope of shape {a.shape} does not broadcast to the input's {x.shape}")
    while a.ndim and a.shape[0] == 1 and a.ndim > 1:
        a = a.reshape(a.shape[1:])
    p = relu(ctx, x)
    if p is x:
        return x
    v = ctx.result(ctx.op("broadcast_sub", as_int32(x.t), as_int32(p.t)), INT32, x.t.lo - int(x.zero.reshape(())),
                   0, x.shape)
    sign = np.sign(a).astype(np.int64)
    if (sign != 1).any():
        sc = const(sign.astype(np.int32), INT32)
        v = ctx.result(ctx.op("broadcast_mul", v, sc), INT32, v.lo if (sign > 0).any() else 0,
                       -v.lo if (sign < 0).any() else 0, broadcast_shape(v, sc))
    s = x.scale.reshape(()).item()
    size = np.array([s * (Fraction(float(abs(q))) if q else Fraction(1)) for q in a.flat], dtype=object)
    return Summed((p, Scaled(v, size.reshape(a.shape), np.zeros((), np.int64))), broadcast_shape(p.t, v))


def mapped(x, fn: Callable, what: str) -> Mapped:
    """fn of x as a table's function; a Clip deferred on x is applied first (the table is of exact values); of a
    value that takes functions after it (``then``: an L2 norm), its own."""
    if isinstance(x, Deferred) and hasattr(x, "then"):
        return x.then(fn, what)
    if isinstance(x, Mapped):
        f = x.fn
        return Mapped(x.x, lambda v: fn(f(v)), f"{what}({x.what})")
    x = scaled(x, f"the {what} input", clipped_ok=True)
    if x.clip != (None, None):
        lo, hi = (None if b is None else float(b) for b in x.clip)
        return Mapped(per_tensor(replace(x, clip=(None, None)), what), lambda v: fn(np.clip(v, lo, hi)),
                      f"{what}(Clip)")
    return Mapped(per_tensor(x, what), fn, what)


def _erf(v):
    return np.vectorize(math.erf, otypes=[np.float64])(v)


def _gelu(v):
    return 0.5 * v * (1 + _erf(v / math.sqrt(2)))


def _gelu_tanh(v):
    return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))


def at_float32(fn: Callable) -> Callable:
    """``fn`` of a step function (a threshold, Floor) at its input rounded to float32, as DequantizeLinear gives it:
    an exact (t - z) s a float32 step from the step's edge is on the other side of it in the float model."""
    return lambda v: fn(np.asarray(v, np.float64).astype(np.float32).astype(np.float64))


FUNCTIONS: dict[str, Callable] = {
    "Sigmoid": lambda n: lambda v: 1 / (1 + np.exp(-v)),
    "Tanh": lambda n: np.tanh,
    "Exp": lambda n: np.exp,
    "Log": lambda n: lambda v: np.log(np.where(v >= 0, v, np.nan)),  # log(0) = -inf saturates, as in onnxruntime
    "Reciprocal": lambda n: lambda v: 1 / v,  # 1 / 0 = inf (a dequantized 0 is +0) saturates
    "Sqrt": lambda n: lambda v: np.sqrt(np.where(v >= 0, v, np.nan)),
    "Erf": lambda n: _erf,
    "Softplus": lambda n: lambda v: np.logaddexp(0, v),
    "Softsign": lambda n: lambda v: v / (1 + np.abs(v)),
    "Abs": lambda n: np.abs,
    "Neg": lambda n: np.negative,
    "HardSigmoid": lambda n: lambda v: np.clip(n.attr_float("alpha", 0.2) * v + n.attr_float("beta", 0.5), 0, 1),
    "HardSwish": lambda n: lambda v: v * np.clip(v / 6 + 0.5, 0, 1),
    "LeakyRelu": lambda n: lambda v: np.where(v >= 0, v, n.attr_float("alpha", 0.01) * v),
    "Elu": lambda n: lambda v: np.where(v >= 0, v, n.attr_float("alpha", 1.0) * np.expm1(v)),
    "Selu": lambda n: lambda v: n.attr_float("gamma", 1.0507009873554805) * np.where(
        v > 0, v, n.attr_float("alpha", 1.6732632423543772) * np.expm1(v)),
    "Celu": lambda n: lambda v, a=n.attr_float("alpha", 1.0): np.maximum(v, 0) + np.minimum(0, a * np.expm1(v / a)),
    "ThresholdedRelu": lambda n: at_float32(lambda v, a=n.attr_float("alpha", 1.0): np.where(v > a, v, 0.0)),
    "Shrink": lambda n: at_float32(lambda v, lam=n.attr_float("lambd", 0.5), b=n.attr_float("bias", 0.0): np.where(
        v < -lam, v + b, np.where(v > lam, v - b, 0.0))),  # torch's Hardshrink (bias 0) and Softshrink (bias lambd)
    "Gelu": lambda n: _gelu_tanh if n.attr_str("approximate", "none") == "tanh" else _gelu,
    "Mish": lambda n: lambda v: v * np.tanh(np.logaddexp(0, v)),
    "Sign": lambda n: at_float32(np.sign),
    "Floor": lambda n: at_float32(np.floor),
    "Ceil": lambda n: at_float32(np.ceil),
    "Round": lambda n: at_float32(np.rint),  # half to even, as ONNX's Round
    "Sin": lambda n: np.sin,
    "Cos": lambda n: np.cos,
    "Atan": lambda n: np.arctan,
    "Asin": lambda n: np.arcsin,  # NaN outside [-1, 1]: refused where the input reaches there (``defined``)
    "Acos": lambda n: np.arccos,
    "Sinh": lambda n: np.sinh,
    "Cosh": lambda n: np.cosh,
    "Asinh": lambda n: np.arcsinh,
    "Atanh": lambda n: np.arctanh,  # +-1 give +-inf, which saturates; NaN beyond
}


#: The functions that never decrease: f(max(u, v)) = max(f(u), f(v)), f(min(u, v)) = min(f(u), f(v)).
RISING = ("Exp", "Sigmoid", "Tanh", "Erf", "Softplus", "Softsign", "Atan", "Sinh", "Asinh")


def function_rule(ctx, node, x):
    """A float elementwise function: a table over x's integers (a sum of terms of one scale added first,
    ``collapsed``; of one computed term and constants of one value each, the constants' sum k added in the table,
    f(v + k)), built by the QuantizeLinear that follows; refused here, naming the node, where it is undefined on
    x's range; Sqrt of a value past a table's 2^16 integers its exact root (``roots.Root``). Of a function of two
    values (``Paired``: a sum at two scales, a Div left in float) one table over both operands' integers. A
    function that never decreases (``RISING``) of a deferred Max (Min): the Max (Min) of its values at each
    operand."""
    fn = FUNCTIONS[node.op_type](node)
    def of(x):
        if isinstance(x, Extreme) and node.op_type in RISING:
            return Extreme(x.is_max, tuple(np.asarray(fn(v), np.float64) if isinstance(v, np.ndarray) else of(v)
                                           for v in x.operands))
        return function_of(ctx, node, fn, x)
    return of(x)


def function_of(ctx, node, fn: Callable, x):
    """``function_rule``'s value of fn(x) for x no ``Extreme``."""
    x = collapsed(ctx, x)
    if node.op_type == "Sqrt" and wide(x):
        return root(x, 2, node.name, "Sqrt")
    if isinstance(x, Summed) and node.op_type in ("Abs", "Neg"):
        return Odd(node.op_type, x)
    if isinstance(x, Summed) and (shift := constant_shift(x)) is not None:
        term, k = shift
        return defined(node.op_type, mapped(term, lambda v: fn(v + k), f"{node.op_type}(x + {k})"))
    if isinstance(x, Summed) and len(x.terms) == 2:  # x - max(x) at two scales: a table over both integers
        return Paired(lambda u, v: fn(u + v), *x.terms, f"{node.op_type} of a sum", summed=True)
    if isinstance(x, Paired):  # of a function of two values left in float (tf2onnx's Atan2: Atan of a Div)
        return Paired(lambda u, v, f=x.fn: fn(f(u, v)), x.a, x.b, f"{node.op_type}({x.what})", summed=x.summed)
    return defined(node.op_type, mapped(x, fn, node.op_type))


def constant_shift(x: Summed) -> tuple[Scaled, float] | None:
    """(x, k) for a sum of one computed per-tensor term x and constant terms each of one real value throughout whose
    shapes broadcast into x's (an initial state's -1e38 less a value), k the sum of those values (float64 of the
    exact rational); None for any other sum."""
    computed = [t for t in x.terms if not t.t.is_const]
    if len(computed) != 1 or not computed[0].per_tensor or computed[0].clip != (None, None):
        return None
    k = Fraction(0)
    for t in x.terms:
        if t is computed[0]:
            continue
        real = np.asarray((t.t.value.astype(np.int64).astype(object) - t.zero.astype(object)) * t.scale, dtype=object)
        if t.clip != (None, None) or not real.size or any(v != real.flat[0] for v in real.flat) or \
                not broadcasts_into(real.shape, computed[0].shape):
            return None
        k += real.flat[0]
    return computed[0], float(k)


def collapsed(ctx, x):
    """A sum whose terms share one scalar scale s (a written-out softmax's x - max(x)) as one dequantized value:
    sum_i (t_i - z_i) s = (sum_i t_i - sum_i z_i) s, the integers added by broadcast_add (exact in int32); any
    other value as it is."""
    if not isinstance(x, Summed) or any(t.scale.size != 1 or t.zero.size != 1 or t.clip != (None, None)
                                        for t in x.terms):
        return x
    s = x.terms[0].scale.reshape(()).item()
    if any(t.scale.reshape(()).item() != s for t in x.terms):
        return x
    acc = as_int32(x.terms[0].t)
    for term in x.terms[1:]:
        u = as_int32(term.t)
        acc = ctx.result(ctx.op("broadcast_add", acc, u), INT32, acc.lo + u.lo, acc.hi + u.hi, broadcast_shape(acc, u))
    zero = sum(int(t.zero.reshape(())) for t in x.terms)
    return Scaled(acc, np.asarray(s, dtype=object), np.asarray(zero, np.int64))


def defined(op: str, m: Mapped) -> Mapped:
    """``m``, or a refusal saying which of its input's integers give an undefined (NaN) value."""
    t, z, s = m.x.t, int(m.x.zero.reshape(())), m.x.scale.reshape(()).item()
    if t.hi - t.lo >= 1 << 16:
        return m  # too many values for a table: the QuantizeLinear refuses it
    q = np.arange(t.lo, t.hi + 1, dtype=np.int64)
    with np.errstate(all="ignore"):
        image = np.asarray(m.fn((q - z) * float(s)), np.float64)
    bad = q[np.broadcast_to(np.isnan(image), q.shape)]
    if bad.size:
        first = float((int(bad[0]) - z) * s)
        raise Refuse(f"{op} is undefined on {bad.size} of its input's {q.size} values, at {first} first: its input's "
                     f"integers reach {int(bad[0])} of [{t.lo}, {t.hi}] at zero point {z} and scale {float(s)}; "
                     f"quantize it to values where {op} is defined (a Clip before its QuantizeLinear)")
    return m


for _op in FUNCTIONS:
    float_rule(_op, since=6)(function_rule)


@float_rule("Cast", since=6)
def cast_rule(ctx, node, x):
    """Cast of a dequantized value or a float function's to float32, the type it has: the value itself (an
    exporter's Cast before a graph output). To an integer type (an 8-bit spectrogram or image the model emits,
    Cast(Clip(x, 0, 255)) to uint8): ONNX's conversion (``onnx_cast``) as a cvm_lut table over x's integers
    (``lookup``: fn's values in float64), the integers of that type; refused where x's range reaches a value the
    type does not hold, whose conversion ONNX leaves undefined. To another float type it is refused."""
    to = node.attr_int("to")
    if to == TensorProto.FLOAT:
        return x
    if to not in INT_RANGES:
        raise Refuse(f"Cast of dequantized values to {type_name(to)} has no integer form (to float32 it is the value, "
                     "to an integer type a table)")
    m = mapped(collapsed(ctx, x), lambda v: v, "Cast")
    if not isinstance(m, Mapped):  # a function of an L2 norm: its table is over the sum of squares
        raise Refuse(f"Cast to {type_name(to)} of {getattr(x, 'what', 'its input')} has no CVM form here: quantize "
                     "it first")

    def values(image: np.ndarray) -> np.ndarray:
        return onnx_cast(image, to, "values").astype(np.int64)

    return lookup(ctx, m, values, to)


@float_rule("Gelu", "FastGelu", since=1, domain=MS)
def ms_gelu_rule(ctx, node, x, bias=None):
    """com.microsoft Gelu (erf) and FastGelu (tanh form), as ``cvm-onnx quantize`` fuses written-out GELUs: a table
    over x's integers, built by the QuantizeLinear that follows; FastGelu's bias added first (``biased``)."""
    fn = _gelu if node.op_type == "Gelu" else _gelu_tanh
    if bias is None:
        return mapped(x, fn, node.op_type)
    if node.op_type != "FastGelu":
        raise Refuse(f"{node.op_type} with a bias input has no CVM form here")
    return mapped(biased(ctx, x, bias, node.op_type), fn, node.op_type)


BIAS_GRID = 256  # the most a bias's grid refines its input's scale


def biased(ctx, x, bias, what: str) -> Scaled:
    """x + b, b a constant along x's last axis (float, or dequantized), on a grid K times finer than x's scale s:
    K t + u_c at scale s / K and zero point K z, u_c = round(b_c K / s), so |b_c - u_c s / K| <= s / 2K; K the largest
    power of two up to ``BIAS_GRID`` whose integers a table of at most 2^16 entries holds."""
    x = per_tensor(scaled(x, f"the {what} input"), what)
    if isinstance(bias, Scaled) and bias.t.is_const:
        b = np.broadcast_to((bias.t.value.astype(np.int64) - bias.zero) * bias.scale, bias.shape)
    elif isinstance(bias, Tensor) and bias.is_const and np.asarray(bias.value).dtype.kind == "f":
        b = np.asarray(bias.value)
        if not np.isfinite(b).all():
            raise Refuse(f"the {what} bias holds non-finite values")
        b = np.array([Fraction(float(v)) for v in b.flat], dtype=object).reshape(b.shape)
    else:
        raise Refuse(f"the {what} bias must be a constant")
    if b.ndim != 1 or not x.shape or b.shape[0] != x.shape[-1]:
        raise Refuse(f"a {what} bias of shape {b.shape} for an input of shape {x.shape}: one value per last-axis entry")
    s, z, t = x.scale.reshape(()).item(), int(x.zero.reshape(())), as_int32(x.t)
    k = BIAS_GRID
    while True:
        u = np.array([round(v * k / s) for v in b], np.int64)
        if k * (t.hi - t.lo) + int(u.max() - u.min()) < MAX_TABLE:
            break
        if k == 1:
            raise Refuse(f"the {what} bias spreads its input over more than 2^16 integers (a bias of up to "
                         f"{float(max(abs(v) for v in b)):.3g} at input scale {float(s):.3g})")
        k //= 2
    kt = ctx.result(ctx.op("broadcast_mul", t, const(np.array(k, np.int32), INT32)), INT32, k * t.lo, k * t.hi,
                    t.shape)
    uc = const(u.astype(np.int32), INT32)
    out = ctx.result(ctx.op("broadcast_add", kt, uc), INT32, kt.lo + int(u.min()), kt.hi + int(u.max()),
                     broadcast_shape(kt, uc))
    return Scaled(out, np.asarray(s / k, dtype=object), np.asarray(k * z, np.int64))
