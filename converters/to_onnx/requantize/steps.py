"""The steps of a requantization run: which CVM nodes are monotone integer steps on one tensor (``Op.step``),
and the steps each is (``steps_of``)."""
from __future__ import annotations

from dataclasses import dataclass

from cvm_onnx.core.constants import precision_bound
from cvm_onnx.core.graph import Entry, Graph, Node
from cvm_onnx.core.ops import REGISTRY


@dataclass(frozen=True)
class Step:
    """One monotone step: ``kind`` "shift" (k = bits), "mul" / "add" (k = constant), "clip" (lo, hi; None =
    unbounded) or "cmul" (a multiplier per axis-1 channel, ``ks``; k = the largest |multiplier|; native runs only)."""

    kind: str
    k: int = 0
    lo: int | None = None
    hi: int | None = None
    ks: tuple[int, ...] = ()


def _limit(precision: int) -> Step:
    bound = precision_bound(precision)
    return Step("clip", lo=-bound, hi=bound)


def scalar_param(graph: Graph, e: Entry) -> int | None:
    """The value of a param holding exactly one number, else None."""
    node = graph.nodes[e.node]
    value = graph.params.get(node.name) if node.is_variable else None
    return int(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def channel_values(graph: Graph, e: Entry, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The values of a param that broadcasts along axis 1 of ``shape`` only, one per channel ((C,) + (1,) * k,
    leading 1s allowed, rank at most ``shape``'s, C = shape[1] > 1), else None."""
    node = graph.nodes[e.node]
    value = graph.params.get(node.name) if node.is_variable else None
    if value is None or len(shape) < 2 or shape[1] < 2 or value.ndim > len(shape) or value.size != shape[1]:
        return None
    dims = (1,) * (len(shape) - value.ndim) + value.shape
    return tuple(int(v) for v in value.reshape(-1)) if dims[1] == shape[1] else None


def steps_of(graph: Graph, node: Node, channels: bool = False) -> tuple[Entry, list[Step]] | None:
    """The entry a run continues from and the node's steps, or None when the node is not a monotone step on one
    tensor (its definition's ``Op.step``; a broadcast op counts only with a one-number param that leaves the other
    input's shape; with ``channels``, a broadcast_mul by one multiplier per axis-1 channel too, "cmul", for native
    runs)."""
    op = REGISTRY[node.op]
    a = op.bind(node.attrs)
    if op.step == "shift":
        return node.inputs[0], [Step("shift", a.shift_bit), _limit(a.precision)]
    if op.step == "left_shift":
        return node.inputs[0], [Step("mul", 1 << a.shift_bit), _limit(a.precision)]
    if op.step == "limit":
        return node.inputs[0], [_limit(a.precision)]
    if op.step == "clip":
        return node.inputs[0], [Step("clip", lo=a.a_min, hi=a.a_max)]
    if op.step == "relu":
        return node.inputs[0], [Step("clip", lo=0)]
    if op.step == "scalar":
        for data, const in ((0, 1), (1, 0)) if node.op != "broadcast_sub" else ((0, 1),):
            c = scalar_param(graph, node.inputs[const])
            x = node.inputs[data]
            if c is not None and graph.type_of(x).shape == node.outputs[0].shape:
                kind, k = ("mul", c) if node.op == "broadcast_mul" else ("add", c if node.op == "broadcast_add" else -c)
                return x, [Step(kind, k)]
    if channels and node.op == "broadcast_mul":
        for data, const in ((0, 1), (1, 0)):
            x, shape = node.inputs[data], node.outputs[0].shape
            ks = channel_values(graph, node.inputs[const], shape)
            if ks is not None and graph.type_of(x).shape == shape:
                return x, [Step("cmul", max(abs(k) for k in ks), ks=ks)]
    return None
