"""Written-out softmax chains: Exp(u) / ReduceSum(Exp(u)) over contiguous axes (or Exp(u) times the Reciprocal of
that sum), u = x less (or plus) shifts constant along those axes, found in the graph before the walk and imported
as ``Softmaxed`` (x along those axes), as the Softmax rule imports Softmax (docs/import.md, "Written-out softmax").
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from ..registry import Refuse
from .values import Softmaxed, per_tensor, scaled

#: Ops that keep a tensor's values in row-major order (only the shape changes).
FLAT = ("Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten")


@dataclass(frozen=True)
class SoftmaxChain:
    """The Div (or Mul) ``node`` that ends a written-out softmax of tensor ``x`` over ``view`` (outer, n, inner)."""

    node: onnx.NodeProto
    x: str
    view: tuple[int, int, int]


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

    def axes(self, node: onnx.NodeProto, rank: int) -> list[int] | None:
        """ReduceSum's reduced axes (sorted, non-negative), or None where they are not constant."""
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if self.opset >= 13:
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


def softmax_chains(graph: onnx.GraphProto, opset: int, shapes: dict[str, tuple[int, ...] | None],
                   constants: dict[str, np.ndarray]) -> list[SoftmaxChain]:
    """Every written-out softmax of ``graph`` (``shapes``: static shapes by tensor name, ``constants``: constant
    values by name; ``opset``: the default domain's)."""
    if not any(n.op_type == "Exp" for n in graph.node):
        return []
    g = _Graph(graph, opset, shapes, constants)
    return [c for n in graph.node if n.op_type in ("Div", "Mul") and n.domain in ("", "ai.onnx")
            if (c := _chain(g, n)) is not None]


def softmax_value(chain: SoftmaxChain, x) -> Softmaxed:
    """The chain's value: the softmax of the dequantized x (per tensor), quantized by the QuantizeLinear that
    follows or as a float tail."""
    x = per_tensor(scaled(x, "the written-out softmax's input"), "a written-out softmax")
    return Softmaxed(x, chain.view, "softmax (written out)")
