"""Written-out softmax chains: Exp(u) / ReduceSum(Exp(u)) over contiguous axes (or Exp(u) times the Reciprocal of
that sum), u = x less (or plus) shifts constant along those axes, found in the graph before the walk and imported
as ``Softmaxed`` (x along those axes), as the Softmax rule imports Softmax (docs/import.md, "Written-out softmax");
and the confidence 1 / ReduceSum(Exp(x - ReduceMax(x))), the softmax at the max; the Wheres of masked Softmaxes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import onnx
from onnx import TensorProto

from .values import Softmaxed, per_tensor, scaled

#: The element types a mask's Cast reads: integers.
MASK_TYPES = (TensorProto.BOOL, TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16,
              TensorProto.INT32, TensorProto.UINT32, TensorProto.INT64, TensorProto.UINT64)
#: Ops that keep a tensor's values in row-major order (only the shape changes).
FLAT = ("Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten")


@dataclass(frozen=True)
class SoftmaxChain:
    """The Div (or Mul) ``node`` that ends a written-out softmax of tensor ``x`` over ``view`` (outer, n, inner)."""

    node: onnx.NodeProto
    x: str
    view: tuple[int, int, int]
    top: tuple[int, ...] | None = None  # the written-out confidence's shape (``_confidence``)


class _Graph:
    def __init__(self, graph: onnx.GraphProto, opset: int, shapes: dict[str, tuple[int, ...] | None],
                 constants: dict[str, np.ndarray]):
        self.opset, self.constants = opset, constants
        self.producer = {o: n for n in graph.node for o in n.output if o}
        self.shapes = {**shapes, **{k: v.shape for k, v in constants.items()}}

    def made(self, name: str, *ops: str) -> onnx.NodeProto | None:
        n = self.producer.get(name)
        return n if n is not None and n.domain in ("", "ai.onnx") and n.op_type in ops else None

    def shape(self, name: str) -> tuple[int, ...] | None:
        s = self.shapes.get(name)
        return None if s is None else tuple(s)

    def pass_qdq(self, name: str) -> str:
        """The tensor before DequantizeLinear(QuantizeLinear(.)) pairs ending at ``name``."""
        while (dq := self.made(name, "DequantizeLinear")) is not None and \
                (q := self.made(dq.input[0], "QuantizeLinear")) is not None:
            name = q.input[0]
        return name

    def axes(self, node: onnx.NodeProto, rank: int, since: int = 13) -> list[int] | None:
        """A reduction's axes (sorted, non-negative; an input from opset ``since``: ReduceSum's 13, ReduceMax's 18),
        or None where they are not constant."""
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if self.opset >= since:
            if len(node.input) > 1 and node.input[1]:
                if node.input[1] not in self.constants:
                    return None
                axes = [int(a) for a in self.constants[node.input[1]].reshape(-1)]
            else:
                axes = []
        else:
            axes = list(attrs.get("axes", []))
        if not axes:
            return None if attrs.get("noop_with_empty_axes", 0) else list(range(rank))
        if any(not -rank <= a < rank for a in axes):
            return None
        return sorted({a % rank for a in axes})

    def finite(self, name: str, depth: int = 0) -> bool:
        """Whether tensor ``name`` is finite on every input: a finite constant, dequantized integers, a move or
        max/min reduction of such, a Max (Min) of such and constants none of which is +inf (-inf) or NaN."""
        if name in self.constants:
            return bool(np.isfinite(self.constants[name]).all())
        if depth > 32 or (n := self.made(name, "DequantizeLinear", "Expand", "ReduceMax", "ReduceMin", "Max", "Min",
                                         *FLAT)) is None:
            return False
        if n.op_type == "DequantizeLinear":
            return True
        if n.op_type not in ("Max", "Min"):
            return self.finite(n.input[0], depth + 1)
        bad = np.inf if n.op_type == "Max" else -np.inf
        consts = [self.constants[i] for i in n.input if i in self.constants]
        if any((np.isnan(c) | (c == bad)).any() for c in consts):
            return False
        values = [i for i in n.input if i not in self.constants]
        return bool(values) and all(self.finite(i, depth + 1) for i in values)

    def constant_along(self, name: str, axes: list[int], rank: int) -> bool:
        """Whether ``name``, broadcast (right-aligned) against a rank-``rank`` tensor, has one value along ``axes``:
        its size there is 1 (or it lacks those axes), or it is an Expand of such a tensor."""
        while True:
            s = self.shape(name)
            if s is not None and len(s) <= rank and all(a < rank - len(s) or s[a - rank + len(s)] == 1 for a in axes):
                return True
            if (e := self.made(name, "Expand")) is None:
                return False
            name = e.input[0]


def _scalar(g: _Graph, name: str) -> Fraction | None:
    v = g.constants.get(name)
    if v is None or v.size != 1 or v.dtype.kind != "f" or not np.isfinite(v).all():
        return None
    return Fraction(float(v.reshape(())))


def _lower_bound(g: _Graph, n: onnx.NodeProto) -> tuple[str, Fraction] | None:
    """(the value, c) of Max(value, c) or Clip(value, min=c) with no max; else None."""
    if n.op_type == "Max":
        if len(n.input) != 2:
            return None
        for v, c in ((n.input[0], n.input[1]), (n.input[1], n.input[0])):
            if (k := _scalar(g, c)) is not None and v not in g.constants:
                return v, k
        return None
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    if g.opset < 11:
        if "max" in attrs or "min" not in attrs:
            return None
        return n.input[0], Fraction(float(np.float32(attrs["min"])))
    if len(n.input) < 2 or not n.input[1] or (len(n.input) > 2 and n.input[2]):
        return None
    k = _scalar(g, n.input[1])
    return None if k is None else (n.input[0], k)


def _padded(s: tuple[int, ...], rank: int) -> tuple[int, ...] | None:
    return (1,) * (rank - len(s)) + s if len(s) <= rank else None


def _divisor(g: _Graph, steps: list[onnx.NodeProto], den: str, keep: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether the ops ``steps`` (forward from the sum of keepdims shape ``keep``) give a divisor ``den`` holding at
    each position of ``shape`` the sum of its row: moves keeping row-major order while the values are the sum's in
    order, ending in the keepdims shape; or an Expand of the keepdims shape that only broadcasts, after which only
    elementwise ops (QuantizeLinear/DequantizeLinear pairs, Reciprocal) follow."""
    rank, flat = len(shape), True
    for step in steps:
        if step.op_type in FLAT and not flat:
            return False
        if step.op_type == "Expand":
            s_in, s_out = g.shape(step.input[0]), g.shape(step.output[0])
            if not flat or s_in is None or s_out is None or _padded(s_in, rank) != keep or \
                    (p := _padded(s_out, rank)) is None or any(o not in (1, d) for o, d in zip(p, shape)):
                return False
            flat = False
    s = g.shape(den)
    return not flat or (s is not None and _padded(s, rank) == keep)


def _chain(g: _Graph, node: onnx.NodeProto) -> SoftmaxChain | None:
    """The written-out softmax ``node`` ends, or None. Div(e, den) or Mul(e, den) / Mul(den, e) with e = Exp(u), den
    the sum ReduceSum(e) over contiguous axes through (forward from the sum) moves keeping row-major order, an
    Expand of the keepdims shape, QuantizeLinear/DequantizeLinear pairs, one Reciprocal for Mul, none for Div."""
    ins = [node.input[:2]] if node.op_type == "Div" else [node.input[:2], node.input[1::-1]]
    for e, den in ins:
        exp = g.made(e, "Exp")
        shape = g.shape(e)
        if exp is None or shape is None or None in shape:
            continue
        path, name = [], den  # the ops from the divisor back to the ReduceSum
        while (step := g.made(g.pass_qdq(name), "ReduceSum", "Reciprocal", "Expand", *FLAT)) is not None:
            path.append(step)
            if step.op_type == "ReduceSum":
                break
            name = step.input[0]
        if not path or path[-1].op_type != "ReduceSum" or path[-1].input[0] != e or \
                sum(p.op_type == "Reciprocal" for p in path) != (node.op_type == "Mul"):
            continue
        rank = len(shape)
        axes = g.axes(path[-1], rank)
        if not axes or axes != list(range(axes[0], axes[-1] + 1)):
            continue
        keep = tuple(1 if a in axes else d for a, d in enumerate(shape))
        if not _divisor(g, path[-2::-1], den, keep, shape):
            continue
        u = exp.input[0]
        while (shift := g.made(u, "Sub", "Add")) is not None:
            others = [shift.input[1]] if shift.op_type == "Sub" else \
                [i for i in shift.input[::-1] if i in g.constants]
            m = next((i for i in others if g.constant_along(i, axes, rank) and g.finite(i)), None)
            if m is None:
                break
            u = shift.input[0] if m == shift.input[1] else shift.input[1]
        if g.shape(u) != shape:
            continue
        return SoftmaxChain(node, u, (math.prod(shape[:axes[0]]), math.prod(shape[axes[0]:axes[-1] + 1]),
                                      math.prod(shape[axes[-1] + 1:])))
    return None


def _axes_before(g: _Graph, x: str, y: str, axes: list[int], rank: int) -> list[int] | None:
    """The axes of ``y`` that are ``axes`` of ``x`` for a max over them: ``axes`` where y is x, or where x is
    Transpose(y) (QuantizeLinear and DequantizeLinear pairs passed) with the other axes in their order (onnxruntime
    moves a Transpose after its ReduceMax), their places in y; else None."""
    if x == y:
        return axes
    t = g.made(x, "Transpose")
    if t is None or g.pass_qdq(t.input[0]) != y:
        return None
    perm = next((list(a.ints) for a in t.attribute if a.name == "perm"), list(range(rank))[::-1])
    rest = [perm[i] for i in range(rank) if i not in axes]
    return sorted(perm[a] for a in axes) if rest == sorted(rest) else None


def _confidence(g: _Graph, node: onnx.NodeProto) -> SoftmaxChain | None:
    """The written-out confidence ``node`` ends, or None: Reciprocal(r) or Div(1, r), r = ReduceSum(Exp(x - m))
    over contiguous axes A, m = ReduceMax(x) over A kept (keepdims, or Unsqueeze at A; QuantizeLinear and
    DequantizeLinear pairs on m passed; of the tensor x transposes: ``_axes_before``): the softmax of x along A at
    its max, 1 / sum exp(x - max(x))."""
    if node.op_type == "Div" and not (node.input[0] in g.constants and np.all(g.constants[node.input[0]] == 1)):
        return None
    total = g.made(g.pass_qdq(node.input[-1]), "ReduceSum")
    exp = g.made(total.input[0], "Exp") if total is not None else None
    sub = g.made(exp.input[0], "Sub") if exp is not None else None
    shape = g.shape(sub.input[0]) if sub is not None else None
    if shape is None or None in shape or (top := g.shape(total.output[0])) is None:
        return None
    rank, x, m = len(shape), sub.input[0], g.pass_qdq(sub.input[1])
    axes = g.axes(total, rank)
    if not axes or axes != list(range(axes[0], axes[-1] + 1)):
        return None
    if (un := g.made(m, "Unsqueeze")) is not None:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in un.attribute}
        kept = attrs.get("axes") if g.opset < 13 else g.constants.get(un.input[1]) if len(un.input) > 1 else None
        if kept is None or sorted(int(a) % rank for a in np.reshape(kept, -1)) != axes:
            return None
        m = g.pass_qdq(un.input[0])
    big = g.made(m, "ReduceMax")
    if big is None or g.axes(big, rank, 18) != _axes_before(g, g.pass_qdq(x), g.pass_qdq(big.input[0]), axes, rank):
        return None
    keepdims = next((a.i for a in big.attribute if a.name == "keepdims"), 1)
    kept = g.shape(sub.input[1])  # the max where x has its rows: x's shape with 1 on A
    if bool(keepdims) == (un is not None) or kept is None or \
            _padded(kept, rank) != tuple(1 if a in axes else d for a, d in enumerate(shape)):
        return None
    return SoftmaxChain(node, x, (math.prod(shape[:axes[0]]), math.prod(shape[axes[0]:axes[-1] + 1]),
                                  math.prod(shape[axes[-1] + 1:])), top)


def softmax_chains(graph: onnx.GraphProto, opset: int, shapes: dict[str, tuple[int, ...] | None],
                   constants: dict[str, np.ndarray]) -> list[SoftmaxChain]:
    """Every written-out softmax of ``graph`` (``shapes``: static shapes by tensor name, ``constants``: constant
    values by name; ``opset``: the default domain's)."""
    if not any(n.op_type == "Exp" for n in graph.node):
        return []
    g = _Graph(graph, opset, shapes, constants)
    return [c for n in graph.node if n.op_type in ("Div", "Mul", "Reciprocal") and n.domain in ("", "ai.onnx")
            if (c := (_chain(g, n) if n.op_type != "Reciprocal" else None) or _confidence(g, n)) is not None]


def softmax_value(chain: SoftmaxChain, x) -> Softmaxed:
    """The chain's value: the softmax of the dequantized x (per tensor), quantized by the QuantizeLinear that
    follows or as a float tail."""
    x = per_tensor(scaled(x, "the written-out softmax's input"), "a written-out softmax")
    if chain.top is not None:
        return Softmaxed(x, chain.view, "softmax at its max (written out)", chain.top)
    return Softmaxed(x, chain.view, "softmax (written out)")


@dataclass(frozen=True)
class MaskedMean:
    """A Div of ReduceSum(x * v) by Clip(ReduceSum(w), lo) or Max(ReduceSum(w), lo) (lo > 0) over the same
    ``tokens`` positions, v and w one mask: a float Cast of integers, moved by the same Unsqueezes (and Expands),
    through QuantizeLinear/DequantizeLinear pairs, w's the first of v's. Every weight w is 0 or at least ``least``,
    and where it is 0 so is v (each pair keeps 0) and the product (docs/import.md, "Quotients of sums")."""

    tokens: int
    least: Fraction


def _mask_path(g: _Graph, name: str) -> tuple[str, tuple, tuple] | None:
    """(the Cast's output, its moves (each Unsqueeze's axes; Expands left out: they only broadcast), its
    QuantizeLinear/DequantizeLinear pairs from the Cast on, each (scale, zero point, the zero point type's largest))
    of a mask
    ``name``; None for anything else."""
    moves, grids = [], []
    while (n := g.made(name, "Unsqueeze", "Expand", "DequantizeLinear", "Cast")) is not None:
        if n.op_type == "Cast":
            return name, tuple(moves), tuple(grids)
        if n.op_type == "Unsqueeze":
            axes = g.constants.get(n.input[1]) if len(n.input) > 1 else \
                next((list(a.ints) for a in n.attribute if a.name == "axes"), None)
            if axes is None:
                return None
            moves.insert(0, tuple(int(a) for a in np.reshape(axes, -1)))
        elif n.op_type == "DequantizeLinear":
            q = g.made(n.input[0], "QuantizeLinear")
            if q is None or list(q.input[1:]) != list(n.input[1:]) or len(n.input) < 3:
                return None
            s, z = g.constants.get(n.input[1]), g.constants.get(n.input[2])
            if s is None or z is None or s.size != 1 or z.size != 1 or z.dtype.kind not in "iu":
                return None
            grids.insert(0, (Fraction(float(s.reshape(()))), int(z.reshape(())), int(np.iinfo(z.dtype).max)))
            name = q.input[0]
            continue
        name = n.input[0]
    return None


def least_weight(grids: tuple) -> Fraction:
    """The least positive value a mask's weight takes at an integer c (0: none): c itself, or c through its
    QuantizeLinear/DequantizeLinear pairs (s, z, hi) in turn, (min(round(v / s) + z, hi) - z) s (half to even), which
    never decreases and keeps 0: at the least c > 0 where it is positive (below 2^31)."""
    def weight(c: int) -> Fraction:
        v = Fraction(c)
        for s, z, hi in grids:
            v = (min(round(v / s) + z, hi) - z) * s
        return v

    low, high = 1, 1 << 31
    if weight(high) <= 0:
        return Fraction(0)
    while low < high:  # weight(high) > 0
        mid = (low + high) // 2
        low, high = (low, mid) if weight(mid) > 0 else (mid + 1, high)
    return weight(low)


def _masked_mean(g: _Graph, node: onnx.NodeProto, dtypes: dict[str, int]) -> MaskedMean | None:
    """The masked mean ``node`` (a Div) ends, or None (``MaskedMean``'s form)."""
    clip = g.made(node.input[1], "Clip", "Max")
    bound = _lower_bound(g, clip) if clip is not None else None
    count = g.made(bound[0], "ReduceSum") if bound is not None and bound[1] > 0 else None
    total = g.made(node.input[0], "ReduceSum")
    mul = g.made(g.pass_qdq(total.input[0]), "Mul") if count is not None and total is not None else None
    w = _mask_path(g, count.input[0]) if mul is not None else None
    if w is None or dtypes.get(g.made(w[0], "Cast").input[0]) not in MASK_TYPES:
        return None
    shape = g.shape(mul.output[0])
    if shape is None or None in shape:
        return None
    axes = g.axes(total, len(shape))
    keepdims = {next((a.i for a in r.attribute if a.name == "keepdims"), 1) for r in (count, total)}
    if not axes or g.axes(count, len(shape)) != axes or len(keepdims) != 1:
        return None

    def along(name: str) -> bool:  # the mask's shape has the product's rank and its sizes on the summed axes
        s = g.shape(name)
        return s is not None and len(s) == len(shape) and all(s[a] == shape[a] for a in axes)

    if not along(count.input[0]) or not any(
            (p := _mask_path(g, v)) is not None and p[:2] == w[:2] and p[2][:len(w[2])] == w[2] and along(v)
            for v in mul.input):
        return None
    least = least_weight(w[2])
    return MaskedMean(math.prod(shape[a] for a in axes), least) if least > 0 else None


def masked_means(graph: onnx.GraphProto, opset: int, shapes: dict[str, tuple[int, ...] | None],
                 constants: dict[str, np.ndarray], dtypes: dict[str, int]) -> dict[str, MaskedMean]:
    """Every masked mean of ``graph`` by its Div's output (``dtypes``: element types by tensor name; the rest as
    ``softmax_chains`` takes them)."""
    g = _Graph(graph, opset, shapes, constants)
    return {n.output[0]: m for n in graph.node if n.op_type == "Div" and n.domain in ("", "ai.onnx")
            if (m := _masked_mean(g, n, dtypes)) is not None}
