"""The float elementwise ops on dequantized values: Add, Sub, Mul, Div, Pow, BatchNormalization, Relu, Clip, and the
float functions (Sigmoid, Tanh, ...) as ``Mapped`` values made tables by the QuantizeLinear that follows.
"""
from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction
from typing import Callable

import numpy as np

from ..context import INT32, Tensor, const
from ..emit import as_int32, broadcast_shape, minus_zero
from ..registry import Refuse, float_rule
from .values import MS, Mapped, Scaled, Summed, per_tensor, real_bound, scaled
@float_rule("Add", since=7)
def add_rule(ctx, node, a, b):
    """a + b: exact as a sum of scaled integers, requantized by the QuantizeLinear that follows."""
    terms = []
    for x in (a, b):
        terms += list(x.terms) if isinstance(x, Summed) else [scaled(x, "an Add operand")]
    return Summed(tuple(terms), broadcast_shape(*(t.t for t in terms)))


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
    """a - b: a + (-b), -b = (-t + z) s exactly (``negated``), requantized by the QuantizeLinear that follows."""
    terms = list(a.terms) if isinstance(a, Summed) else [scaled(a, "a Sub operand")]
    terms += [negated(ctx, t) for t in (b.terms if isinstance(b, Summed) else [scaled(b, "a Sub operand")])]
    return Summed(tuple(terms), broadcast_shape(*(t.t for t in terms)))


def multiply(ctx, a: Scaled, b: Scaled) -> Scaled:
    """(a - za)(b - zb) in int32, at scale s_a * s_b."""
    va, vb = minus_zero(ctx, a.t, a.zero), minus_zero(ctx, b.t, b.zero)
    corners = [x * y for x in (va.lo, va.hi) for y in (vb.lo, vb.hi)]
    e = ctx.op("broadcast_mul", va, vb)
    scale = np.asarray(a.scale * b.scale, dtype=object).reshape(np.broadcast_shapes(a.scale.shape, b.scale.shape))
    return Scaled(ctx.result(e, INT32, min(corners), max(corners), broadcast_shape(va, vb)), scale,
                  np.zeros((), np.int64))


def constant_factor(t, what: str) -> Fraction:
    """A float constant scalar > 0 (Mul or Div by it scales a value exactly: its float32/64 value is a rational)."""
    v = np.asarray(t.value, np.float64)
    if v.size != 1 or not np.isfinite(v).all() or v.reshape(()) <= 0:
        raise Refuse(f"{what} must be a finite constant scalar > 0 (got {v.reshape(-1)[:4]}): it then scales the "
                     "value exactly")
    return Fraction(float(v.reshape(())))


def rescaled(x, factor: Fraction, what: str):
    """x * factor, exactly: the scale (of each term) times factor; a float function's value times it."""
    if isinstance(x, Mapped):  # float64 table values: times the numerator, over the denominator (each exact)
        n, d = float(factor.numerator), float(factor.denominator)
        return Mapped(x.x, lambda v, f=x.fn: np.asarray(f(v)) * n / d, f"{x.what} * {factor}")
    if isinstance(x, Summed):
        return Summed(tuple(rescaled(t, factor, what) for t in x.terms), x.shape)
    x = scaled(x, what, clipped_ok=True)
    clip = tuple(None if b is None else b * factor for b in x.clip)
    return replace(x, scale=np.asarray(x.scale * factor, dtype=object).reshape(x.scale.shape), clip=clip)


def is_float_const(t) -> bool:
    return isinstance(t, Tensor) and t.is_const and np.asarray(t.value).dtype.kind == "f"


@float_rule("Mul", since=7)
def mul_rule(ctx, node, a, b):
    """(a - za)(b - zb) at scale s_a * s_b; by a float constant c > 0 (hard-swish's 1/6): the scale times c."""
    if is_float_const(b) or is_float_const(a):
        x, c = (a, b) if is_float_const(b) else (b, a)
        return rescaled(x, constant_factor(c, "the Mul constant"), "a Mul operand")
    return multiply(ctx, scaled(a, "a Mul operand"), scaled(b, "a Mul operand"))


@float_rule("Div", since=7)
def div_rule(ctx, node, a, b):
    """a / c for a float constant c > 0 (hard-swish's x * relu6(x + 3) / 6): the scale over c, an exact rational
    folded into the requantization that follows."""
    if not is_float_const(b):
        raise Refuse("float Div of dequantized values has no integer form: only division by a constant > 0")
    return rescaled(a, 1 / constant_factor(b, "the divisor"), "the dividend")


@float_rule("Pow", since=7)
def pow_rule(ctx, node, x, y):
    """x^k for a constant integer exponent 1 <= k <= 4 (a LayerNormalization's square): k - 1 exact Muls."""
    k = np.asarray(y.value) if isinstance(y, Tensor) and y.is_const and y.value.size == 1 else None
    if k is None or k.reshape(()) != round(float(k.reshape(()))) or not 1 <= int(k.reshape(())) <= 4:
        raise Refuse("Pow of a dequantized value has an integer form for a constant exponent 1, 2, 3 or 4 only")
    base = scaled(x, "the Pow base")
    out = base
    for _ in range(int(k.reshape(())) - 1):
        out = multiply(ctx, out, base)
    return out


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
    return relu(ctx, scaled(x, "the Relu input", clipped_ok=True))


@float_rule("Clip", since=11)
def clip_rule(ctx, node, x, lo_t=None, hi_t=None):
    """Clip to real bounds: an integer clip when they lie on x's grid, else deferred to the QuantizeLinear."""
    lo, hi = real_bound(lo_t, "Clip min"), real_bound(hi_t, "Clip max")
    if isinstance(x, Mapped):
        return mapped(x, lambda v: np.clip(v, None if lo is None else float(lo), None if hi is None else float(hi)),
                      "Clip")
    x = scaled(x, "the Clip input", clipped_ok=True)
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


def mapped(x, fn: Callable, what: str) -> Mapped:
    if isinstance(x, Mapped):
        f = x.fn
        return Mapped(x.x, lambda v: fn(f(v)), f"{what}({x.what})")
    return Mapped(per_tensor(scaled(x, f"the {what} input"), what), fn, what)


def _erf(v):
    return np.vectorize(math.erf, otypes=[np.float64])(v)


def _gelu(v):
    return 0.5 * v * (1 + _erf(v / math.sqrt(2)))


def _gelu_tanh(v):
    return 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))


FUNCTIONS: dict[str, Callable] = {
    "Sigmoid": lambda n: lambda v: 1 / (1 + np.exp(-v)),
    "Tanh": lambda n: np.tanh,
    "Exp": lambda n: np.exp,
    "Log": lambda n: lambda v: np.log(np.where(v > 0, v, np.nan)),
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
    "Gelu": lambda n: _gelu_tanh if n.attr_str("approximate", "none") == "tanh" else _gelu,
}


def function_rule(ctx, node, x):
    """A float elementwise function: a table over x's integers, built by the QuantizeLinear that follows."""
    return mapped(x, FUNCTIONS[node.op_type](node), node.op_type)


for _op in FUNCTIONS:
    float_rule(_op, since=6)(function_rule)


@float_rule("Gelu", "FastGelu", since=1, domain=MS)
def ms_gelu_rule(ctx, node, x, bias=None):
    """com.microsoft Gelu (erf) and FastGelu (tanh form), as ``cvm-onnx quantize`` fuses written-out GELUs: a table
    over x's integers, built by the QuantizeLinear that follows."""
    if bias is not None:
        raise Refuse(f"{node.op_type} with a bias input has no CVM form here")
    return mapped(x, _gelu if node.op_type == "Gelu" else _gelu_tanh, node.op_type)
