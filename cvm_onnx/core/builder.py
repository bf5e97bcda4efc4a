"""Build CVM graphs in Python: ``b.input``, ``b.param``, ``b.op`` and ``b.build(heads)`` (validated)."""
from __future__ import annotations

import numpy as np

from .graph import Entry, Graph, Node, TensorType
from .ops import REGISTRY
from .ops.registry import bits
from .validate import validate


class GraphBuilder:
    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.params: dict[str, np.ndarray] = {}
        self.input_names: list[str] = []

    def _add(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def input(self, name: str, shape: tuple[int, ...], precision: int) -> Entry:
        self.input_names.append(name)
        return Entry(self._add(Node(name, "null", outputs=(TensorType(tuple(shape), precision),))))

    def param(self, name: str, value: np.ndarray, precision: int | None = None) -> Entry:
        """A param; its precision defaults to the smallest that holds its values. Stored int8 when <= 8 bits."""
        value = np.asarray(value)
        if precision is None:
            precision = bits(int(np.abs(value.astype(np.int64)).max(initial=0))) + 1
        fits_int8 = value.size == 0 or (value.min() >= -128 and value.max() <= 127)
        self.params[name] = value.astype(np.int8 if precision <= 8 and fits_int8 else np.int32)
        return Entry(self._add(Node(name, "null", outputs=(TensorType(tuple(value.shape), precision),))))

    def op(self, op: str, *inputs: Entry, name: str | None = None, **attrs) -> Entry | tuple[Entry, ...]:
        i = self._add(Node(name or f"{op}_{len(self.nodes)}", op, tuple(inputs), dict(attrs)))
        n = REGISTRY[op].outputs if op in REGISTRY else 1
        return Entry(i) if n == 1 else tuple(Entry(i, k) for k in range(n))

    def build(self, *heads: Entry) -> Graph:
        graph = Graph(list(self.nodes), list(heads), dict(self.params))
        return validate(graph, inputs=tuple(self.input_names)).graph
