"""The graph's float edges: the float input quantized by its QuantizeLinear node(s) (``input_edge``), and the float
outputs read from the last dequantized values (``output_edge``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
from onnx import TensorProto, helper

from ..context import INT_RANGES, Tensor, tight, type_name
from ..registry import Refuse
from ..requant_plans import NoPlan, softmax_plan
from .elementwise import Quotient
from .l2norm import Bounded, L2Normalized, TailNormalized
from .logsumexp import LogSumExped
from .qdq import LogSoftmaxed, quantize
from .values import (QUANTIZED_TYPES, TAIL_GRIDS, Deferred, Mapped, Real, Scaled, Softmaxed, Summed,
                     least_float32)


@dataclass
class InputEdge:
    """The float graph input quantized by QuantizeLinear node(s) of one constant scale and zero point."""

    dtype: int
    scale: np.ndarray  # float32
    zero: np.ndarray
    nodes: list = field(default_factory=list)  # the QuantizeLinear nodes it replaces


def _named(graph, n) -> str:
    return f"{n.op_type} {n.name!r}" if n.name else f"{n.op_type} (unnamed, node {list(graph.node).index(n)})"


#: Ops that only select or move values: between the float input and its QuantizeLinear they commute with it.
INPUT_MOVES = ("Slice", "Concat", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity")


def quantizers(graph, name: str) -> tuple[list, list[str]]:
    """The QuantizeLinear nodes that quantize the float input ``name``, read directly or through ops that only
    move values (INPUT_MOVES, every data input from the input: an NHWC input's Transpose, YOLOX's Focus Slices),
    and what reads it (or a moved copy) otherwise: nodes (named) and graph outputs."""
    outputs = {o.name for o in graph.output}
    reached, todo, found, moves, others = {name}, [name], {}, [], {}
    while todo:
        x = todo.pop(0)
        if x in outputs and x != name:
            others[x] = f"the graph output {x!r}"
        for n in (n for n in graph.node if x in n.input):
            data = list(n.input) if n.op_type == "Concat" else list(n.input[:1])
            if n.op_type == "QuantizeLinear" and data == [x]:
                found[id(n)] = n
            elif n.op_type in INPUT_MOVES and x in data and x not in n.input[len(data):]:
                moves.append(n)
                if n.output[0] not in reached:
                    reached.add(n.output[0])
                    todo.append(n.output[0])
            else:
                others[id(n)] = _named(graph, n)
    for n in moves:
        if any(d not in reached for d in (n.input if n.op_type == "Concat" else n.input[:1])):
            others[id(n)] = _named(graph, n)
    return list(found.values()), list(others.values())


#: What a float graph input must be for CVM: quantized by QuantizeLinear alone (as onnxruntime.quantization writes).
ONLY = ("CVM takes a float input only where QuantizeLinear quantizes it (a quantized model, as "
        "onnxruntime.quantization writes it)")
#: The positions of quantization parameters (scales, zero points) in the ops that read them.
PARAMETERS = {"QuantizeLinear": (1, 2), "DequantizeLinear": (1, 2), "QLinearConv": (1, 2, 4, 5, 6, 7),
              "QLinearMatMul": (1, 2, 4, 5, 6, 7), "QGemm": (1, 2, 4, 5, 7, 8), "QLinearAdd": (1, 2, 4, 5, 6, 7),
              "QLinearMul": (1, 2, 4, 5, 6, 7)}


def input_edge(graph, name: str, constants: dict) -> InputEdge | str:
    """How a float input is quantized: every consumer a QuantizeLinear with the same constant scale and zero point
    (per tensor), directly or through ops that only move values (``quantizers``). Else why not, as a sentence
    naming the nodes that read it otherwise."""
    params = [_named(graph, n) for n in graph.node
              if any(k < len(n.input) and n.input[k] == name for k in PARAMETERS.get(n.op_type, ()))]
    if params:
        return (f"the graph input {name!r} is a quantization parameter (scale or zero point) of {', '.join(params)}:"
                " given at run time; CVM needs scales and zero points constant (initializers)")
    users, others = quantizers(graph, name)
    if not users and not others:
        return f"the float input is read by no node: {ONLY}"
    producers = {t: n for n in graph.node for t in n.output}
    why = [f"the float input is read by {', '.join(others)}: {ONLY}"] if others else []
    for n in users:
        computed = [t for t in n.input[1:3] if t and t not in constants]
        if computed:
            by = ", ".join(_named(graph, producers[t]) if t in producers else f"the graph input {t!r}"
                           for t in computed)
            why.append(f"{_named(graph, n)} quantizes the float input by a scale or zero point computed at run "
                       f"time (by {by}): CVM needs them constant")
    if why:
        return "; ".join(why)
    found = []
    for n in users:
        s = constants.get(n.input[1]) if len(n.input) > 1 else None
        z = constants.get(n.input[2]) if len(n.input) > 2 and n.input[2] else None
        if (bad := _input_parameters_problem(graph, n, s, z)) is not None:
            return bad
        zv = np.zeros((), np.int64) if z is None else np.asarray(z)
        dtype = next((a.i for a in n.attribute if a.name == "output_dtype" and a.i), None) or \
            (TensorProto.UINT8 if z is None else helper.np_dtype_to_tensor_dtype(zv.dtype))
        if dtype not in QUANTIZED_TYPES:
            return f"{_named(graph, n)} quantizes the float input to {type_name(dtype)}: CVM takes int8, uint8, " \
                   "int16 or uint16"
        found.append((dtype, np.asarray(s, np.float32).reshape(()), zv.astype(np.int64).reshape(())))
    if any(f[0] != found[0][0] or f[1] != found[0][1] or f[2] != found[0][2] for f in found):
        return "the float input is quantized by QuantizeLinear nodes of different scales or zero points"
    return InputEdge(found[0][0], found[0][1], found[0][2], users)


def _input_parameters_problem(graph, n, s: np.ndarray | None, z: np.ndarray | None) -> str | None:
    """Why the scale ``s`` and zero point ``z`` of ``n``, quantizing the float input, are not one finite scale > 0
    and one integer zero point in range (CVM's input is quantized per tensor), or None."""
    who = f"{_named(graph, n)} quantizing the float input"
    if s is None or s.dtype.kind != "f" or s.size == 0:
        return f"{who}: its scale must be a float scalar, has {'none' if s is None else f'{s.dtype} {s.shape}'}"
    if s.size > 1:
        return (f"{who}: its scale has {s.size} values (per-channel or per-axis quantization of the input): CVM's "
                "input takes one scale and zero point; quantize the input per tensor")
    if not (np.isfinite(s).all() and (s > 0).all()):
        return f"{who}: its scale {float(s.reshape(-1)[0])} must be finite and > 0"
    if z is not None:
        if z.dtype.kind not in "iu":
            return f"{who}: its zero point is {z.dtype}, not an integer"
        if z.size != 1:
            return f"{who}: its zero point has {z.size} values for one scale (they must have the same shape)"
    return None


def input_precision(dtype: int) -> int:
    lo, hi = INT_RANGES[dtype]
    return tight(max(-lo, hi))


#: The type of a value computed after the last QuantizeLinear (a float output): int16, zero point 0.
TAIL_TYPE, TAIL_STEPS = TensorProto.INT16, TAIL_GRIDS[0]


def span(x) -> tuple[float, float] | None:
    """An interval holding every finite value of a real value computed after the last QuantizeLinear (None: none
    known): a dequantized value's from its integers, a sum's the sum of its terms', a function's the least and
    largest finite value it takes on its input's integers (on both operands' for a function of two), Softmax's
    [0, 1], LogSoftmax's [-(hi - lo) s - log n, 0], Max (Min) the max (min) of the ends, a quotient of sums
    |a / b| <= max|a| / min|b| where b's interval (its deferred Clip applied) holds no 0 (``quotient_span``)."""
    if isinstance(x, np.ndarray):
        return (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
    if isinstance(x, Scaled):
        ends = [(t - z) * float(f) for t in (x.t.lo, x.t.hi) for z in (int(x.zero.min()), int(x.zero.max()))
                for f in (min(x.scale.flat), max(x.scale.flat))]
        return min(ends), max(ends)
    if isinstance(x, Summed):
        parts = [span(t) for t in x.terms]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)
    if isinstance(x, Mapped):
        t, z, s = x.x.t, int(x.x.zero.reshape(())), float(x.x.scale.reshape(()).item())
        if t.hi - t.lo >= 1 << 16:
            raise Refuse(f"{x.what} over {t.hi - t.lo + 1} integers: a table of at most 2^16 entries has a CVM form")
        with np.errstate(all="ignore"):
            image = np.asarray(x.fn((np.arange(t.lo, t.hi + 1, dtype=np.int64) - z) * s), np.float64)
        finite = image[np.isfinite(image)]
        return (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
    if isinstance(x, Softmaxed):
        return 0.0, 1.0
    if isinstance(x, Quotient):
        return quotient_span(x)
    if isinstance(x, Deferred) and hasattr(type(x), "ends"):  # LogSoftmax's, an L2 normalization's [-1, 1]
        return x.ends
    if hasattr(x, "grid"):  # a function of two values (Paired): its finite values, within its bound if known
        with np.errstate(all="ignore"):
            finite = x.grid()[np.isfinite(x.grid())]
        ends = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 0.0)
        return ends if x.bound is None else (max(ends[0], -float(x.bound)), min(ends[1], float(x.bound)))
    operands = getattr(x, "operands", None)  # an Extreme
    parts = None if operands is None else [span(v) for v in operands]
    if parts is None or None in parts:
        return None
    pick = max if x.is_max else min
    return pick(p[0] for p in parts), pick(p[1] for p in parts)


def quotient_span(x: Quotient) -> tuple[float, float] | None:
    """[-m, m], m the least of its known ``bound`` and max|a| / min|b|: a and b the sums of their terms' intervals,
    b's clipped by its deferred Clip (lo, hi) to [max(b_lo, lo), min(b_hi, hi)], where that interval holds no 0 and
    is no divisor of one term reaching 0 clipped at 0 < lo with its one step r > 32767 lo (a guard of 0 / 0 alone:
    sentence-transformers' count at 1e-9 on a 1/255 grid, where every value at a nonzero divisor, |a| / r <
    m / 32767, would lie within one step of 0 at the grid m gives); None where neither holds."""
    found = [] if x.bound is None else [float(x.bound)]
    a, b = ([sum(p) for p in zip(*(span(t) for t in terms))] for terms in (x.a, x.b))
    lo, hi = x.clip
    if lo is not None:
        b = [max(v, float(lo)) for v in b]
    if hi is not None:
        b = [min(v, float(hi)) for v in b]
    least = b[0] if b[0] > 0 else -b[1] if b[1] < 0 else 0.0
    guard = lo is not None and len(x.b) == 1 and 0 < lo * TAIL_STEPS < min(x.b[0].scale.flat) and \
        span(x.b[0])[0] <= 0 <= span(x.b[0])[1]
    if least and not guard:
        found.append(max(abs(a[0]), abs(a[1])) / least)
    return (-min(found), min(found)) if found else None


def tail(ctx, x) -> Scaled:
    """A value computed after the last QuantizeLinear (a float output: a float function, Softmax, a sum, Max/Min,
    a deferred Clip), quantized here: int16 with zero point 0 and scale s = the least float32 with N s >= m, m the
    largest |value| of the interval ``span`` holds it in (a function's largest finite |value| on its input's
    integers, 1 for Softmax and an L2 normalization), N = 32767 (for those two the largest 2^j - 1 <= 32767 their
    integer form has a plan for); then QuantizeLinear's integer form at that scale."""
    ends = span(x)
    if hasattr(x, "grid"):
        with np.errstate(all="ignore"):
            if np.isnan(x.grid()).any():
                raise Refuse(f"{x.what} as a float output is undefined (NaN: 0 / 0) on part of its operands' ranges, "
                             "which no integer holds: quantize it (a QuantizeLinear gives NaN the type's minimum)")
    if ends is None:
        raise Refuse(f"a float output ({getattr(x, 'what', 'a value')}) computed after the last QuantizeLinear has "
                     "no integer form here: cut the graph (--outputs) at a quantized tensor")
    m = max(abs(ends[0]), abs(ends[1])) or 1.0
    for steps in TAIL_GRIDS:
        exact = Fraction(float(least_float32(m, steps)))
        try:
            if isinstance(x, Softmaxed):
                softmax_plan(x.view[1], 1 / exact)
            elif isinstance(x, (L2Normalized, TailNormalized)):
                x.plan(exact, -32768, 32767)
        except NoPlan:
            continue
        break
    zero = np.zeros((), np.int64)
    exact = np.asarray(exact, dtype=object)
    return Scaled(quantize(ctx, x, exact, zero, TAIL_TYPE), exact, zero)


#: The float ops that take a LogSoftmax as it is: QuantizeLinear (its integer form), Max and Min (``Extreme``: each
#: operand quantized at the output's scale).
LOGSOFTMAX_TAKERS = ("QuantizeLinear", "Max", "Min")


def float_read(ctx, op: str, x):
    """A LogSoftmax or ReduceLogSumExp read by any other float op (quantize_static quantizes no Exp, Neg, Log,
    ReduceMax, ReduceSum or, after a ReduceLogSumExp, Sub after it; QOperator no Gather): first quantized as a float
    output is (``tail``: int16, zero point 0, the least float32 scale s_t with 32767 s_t >= the largest |value| of
    its ``ends``, within 1/2 + delta steps of s_t), then the op's own rule on those integers; a value LpNormalization
    reads, ``l2_read``; any other value as it is."""
    if op == "LpNormalization":
        return l2_read(x)
    if isinstance(x, (LogSoftmaxed, LogSumExped)) and op not in LOGSOFTMAX_TAKERS:
        return tail(ctx, x)
    return x


def l2_read(x):
    """A value an L2 normalization reads: one computed after the last QuantizeLinear whose interval ``span`` knows
    (a masked mean's quotient), ``Bounded`` by its largest |value| (the normalization quantizes it at a grid of its
    own); any other as it is."""
    if isinstance(x, Real) and not isinstance(x, Scaled):
        ends = span(x)
        if ends is not None:
            return Bounded(x, max(abs(ends[0]), abs(ends[1])) or 1.0)
    return x


def output_edge(ctx, x) -> tuple[Tensor, np.ndarray, np.ndarray]:
    """(the integers, scale as float32, zero point) of a graph output that is a dequantized tensor; any other real
    value (a float tail, a scale no float32 holds, a per-tensor sum of integers beyond 16 bits: a float function's
    table averaged at the output) quantized by ``tail``."""
    if not (isinstance(x, Scaled) and x.clip == (None, None) and float32_scales(x)) or wide(x):
        x = tail(ctx, x)
    s = np.array([float(v) for v in x.scale.flat], np.float64).reshape(x.scale.shape)
    return x.t, s.astype(np.float32), x.zero


def wide(x) -> bool:
    """Whether ``x`` is a per-tensor dequantized value whose integers and zero point no 16-bit type holds."""
    if not isinstance(x, Scaled) or not x.per_tensor:
        return False
    lo, hi = min(x.t.lo, int(x.zero.reshape(()))), max(x.t.hi, int(x.zero.reshape(())))
    return not any(INT_RANGES[d][0] <= lo and hi <= INT_RANGES[d][1] for d in QUANTIZED_TYPES)


def float32_scales(x: Scaled) -> bool:
    """Whether every scale of x is a float32 number (as DequantizeLinear's are)."""
    return all(Fraction(float(np.float32(float(f)))) == f for f in x.scale.flat)
