"""Value bounds: for every entry, an integer B with |x| <= B for every value the entry can take.

Lowerings pick exact and fast forms from these bounds (float32 is exact below 2^24, int32 arithmetic cannot
overflow below 2^31, ...). The runtime's precision labels are not used: ``where`` labels its output with its
condition's precision, and a 1-bit input to ``broadcast_greater`` still gives 1. Instead each op's bound follows
from its inputs' bounds and, for params, their actual values (a conv's bound is max over output channels of
sum|w| * B_x + |bias|): the rule is the op definition's ``bound`` (cvm_onnx/ops). ``ANY`` (2^31) means any int32,
INT32_MIN included.
"""
from __future__ import annotations

from cvm_onnx.core.constants import ANY
from cvm_onnx.core.graph import Entry, Graph
from cvm_onnx.core.ops import REGISTRY
from cvm_onnx.core.ops.registry import max_abs


def value_bounds(graph: Graph) -> dict[Entry, int]:
    out: dict[Entry, int] = {}
    for i, node in enumerate(graph.nodes):
        if node.is_variable:
            value = graph.params.get(node.name)
            out[Entry(i)] = max_abs(value) if value is not None else node.outputs[0].bound
            continue
        bounds = [out[e] for e in node.inputs]
        sources = [graph.nodes[e.node] for e in node.inputs]
        values = [graph.params.get(s.name) if s.is_variable else None for s in sources]
        shapes = [graph.type_of(e).shape for e in node.inputs]
        op = REGISTRY[node.op]
        found = op.bound(op.bind(node.attrs), shapes, bounds, values)
        for k, b in enumerate(found):
            out[Entry(i, k)] = min(int(b), ANY)
    return out


def nonnegative(graph: Graph) -> set[Entry]:
    """The entries proven >= 0: params whose values are, and each op's outputs where its definition says so of
    its inputs (``Op.nonnegative``: relu, clip with a_min >= 0, the ops that keep non-negative inputs so)."""
    out: set[Entry] = set()
    for i, node in enumerate(graph.nodes):
        if node.is_variable:
            value = graph.params.get(node.name)
            if value is not None and int(value.min(initial=0)) >= 0:
                out.add(Entry(i))
            continue
        op = REGISTRY[node.op]
        if op.nonnegative(op.bind(node.attrs), all(e in out for e in node.inputs)):
            out.update(Entry(i, k) for k in range(len(node.outputs)))
    return out
