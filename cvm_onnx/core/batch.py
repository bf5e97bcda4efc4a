"""A graph with a chosen batch size: the input's first dimension 1 becomes N, where every op allows it.

``batched(graph, n)`` re-infers every node with the inputs' first dimension n and requires that each entry derived
from an input had first dimension 1 and now has n, its other dimensions and its precision unchanged; entries
computed from params alone stay as they are. Then example k of the batch flows through its own slice [k] of every
derived tensor, because each op's FORMAL kernel treats the leading axis of such tensors like any other outer axis:
elementwise and broadcast ops, conv2d, dense, pooling, reductions over other axes, reshapes and transposes that keep
the leading axis, get_valid_counts per batch. The few cases where the shapes look right but the examples would mix
(take along the batch axis, slice_like cut by an input's shape) or the batch would not be portable
(non_max_suppression, which the runtime's CPU device runs differently for B > 1) are refused by the op's definition
(``Op.batch_refusal``). Everything else that breaks the rule (a reshape folding the batch, a reduction or
concatenation over axis 0, ...) is refused with the node and the shapes.
"""
from __future__ import annotations

from dataclasses import replace

from .errors import Problem, UnsupportedError
from .graph import Graph, Node, TensorType, shape_problem
from .ops import REGISTRY, NodeRuleError, type_node


def batched(graph: Graph, n: int) -> Graph:
    """``graph`` (validated) with batch size ``n``: every input's first dimension (which must be 1) becomes n.

    Raises ``UnsupportedError`` naming the first node that does not keep the batch axis, and why.
    """
    if n < 1:
        raise UnsupportedError(f"the batch size must be >= 1, got {n}")
    nodes: list[Node] = []
    derived: list[bool] = []  # per node: its outputs are computed from an input
    for node in graph.nodes:
        if node.is_variable:
            is_input = node.name not in graph.params
            if is_input:
                node = _batched_input(node, n)
            nodes.append(node)
            derived.append(is_input)
            continue
        from_input = [derived[e.node] for e in node.inputs]
        if any(from_input):
            before = [graph.type_of(e) for e in node.inputs]
            node = _batched_op(node, before, [nodes[e.node].outputs[e.index] for e in node.inputs], from_input, n)
        nodes.append(node)
        derived.append(any(from_input))
    return replace(graph, nodes=nodes)


def _refuse(node: Node, why: str) -> UnsupportedError:
    return UnsupportedError(Problem(node.name, f"cannot batch: {why}"))


def _batched_input(node: Node, n: int) -> Node:
    t = node.outputs[0]
    if t.shape[0] != 1:
        raise _refuse(node, f"input shape {t.shape} must have a first dimension of 1 to take the batch")
    return replace(node, outputs=(_grown(node, t.shape, n, t.precision),))


def _grown(node: Node, shape: tuple[int, ...], n: int, precision: int) -> TensorType:
    new = (n,) + shape[1:]
    if (rule := shape_problem(new)) is not None:
        raise _refuse(node, f"batch {n} gives {rule}")
    return TensorType(new, precision)


def _batched_op(node: Node, before: list[TensorType], types: list[TensorType], from_input: list[bool],
                n: int) -> Node:
    """``node`` with its outputs re-inferred from its batched input ``types`` (``before``: for one example).

    A reshape whose target starts with the example's 1 (a literal 1 where its input has the batch) takes code 0
    there instead, which copies the input's first dimension: the same target for one example, N with the batch,
    each example's elements still its own contiguous slice."""
    if node.op == "reshape" and from_input[0] and before[0].shape[:1] == (1,):
        target = tuple(REGISTRY["reshape"].bind(node.attrs).shape)
        if target[:1] == (1,):
            node = replace(node, attrs={**node.attrs, "shape": (0, *target[1:])})
    try:
        typed = type_node(node.op, node.attrs, types)
    except NodeRuleError as e:
        shapes = [t.shape for t in types]
        raise _refuse(node, f"{node.op} does not take the batched input shapes {shapes}: {e}") from None
    outs = []
    for k, (old, new) in enumerate(zip(node.outputs, typed.outputs)):
        shape, p = new.shape, new.precision
        want = (n,) + old.shape[1:]
        if old.shape[0] != 1 or shape != want:
            raise _refuse(node, f"{node.op} output {k} has shape {old.shape} for one example and {shape} for {n}, "
                                f"not {want}: the op does not keep the batch as its first axis")
        if p != old.precision:
            raise _refuse(node, f"{node.op} output {k} precision {old.precision} becomes {p} with the batch")
        outs.append(_grown(node, old.shape, n, p))
    if (why := REGISTRY[node.op].batch_refusal(typed.attrs, [t.shape for t in types], from_input, n)) is not None:
        raise _refuse(node, why)
    return replace(node, outputs=tuple(outs))
