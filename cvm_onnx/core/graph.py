"""The CVM graph IR: variables and op nodes in topological order, entries, heads and params.

It mirrors the runtime's graph: a node has one or more outputs ("entries"), an input is an ``Entry``
(node index, output index). Every entry has a static ``TensorType`` (shape and bit precision p, meaning
|x| <= 2^(p-1)-1). The IR knows nothing of files or ONNX.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from .constants import precision_bound

VARIABLE = "null"
MAX_NDIM = 6
MAX_DIM = 1 << 24
MAX_SIZE = 1 << 30


def shape_problem(shape: tuple[int, ...]) -> str | None:
    """The runtime's limits on every shape (1..6 dims, each in (0, 2^24], size <= 2^30) as a sentence, or None."""
    if not 1 <= len(shape) <= MAX_NDIM:
        return f"ndim {len(shape)} is not in 1..{MAX_NDIM}"
    if any(not 0 < d <= MAX_DIM for d in shape):
        return f"shape {tuple(shape)}: every dimension must lie in (0, 2^24]"
    if math.prod(int(d) for d in shape) > MAX_SIZE:
        return f"shape {tuple(shape)}: size exceeds 2^30"
    return None


@dataclass(frozen=True, order=True)
class Entry:
    """Output ``index`` of node ``node`` (an index into ``Graph.nodes``)."""

    node: int
    index: int = 0


@dataclass(frozen=True)
class TensorType:
    """Static facts of one entry: its shape and its precision (-1 when not known yet)."""

    shape: tuple[int, ...]
    precision: int = -1

    @property
    def bound(self) -> int:
        """Largest magnitude a value of this precision may have: 2^(p-1)-1."""
        return precision_bound(self.precision)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class Node:
    """A variable (``op == "null"``: the input ``data`` or a param) or an op node with its attributes.

    ``attrs`` holds the attributes as given (strings as read from a file, or typed values); validation turns
    them into typed values. ``outputs`` holds one ``TensorType`` per output.
    """

    name: str
    op: str
    inputs: tuple[Entry, ...] = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    outputs: tuple[TensorType, ...] = ()

    @property
    def is_variable(self) -> bool:
        return self.op == VARIABLE


@dataclass
class Graph:
    """A CVM model: nodes in topological order, the heads (outputs) and the param values (int8 or int32)."""

    nodes: list[Node]
    heads: list[Entry]
    params: dict[str, np.ndarray] = field(default_factory=dict)
    postprocess: str | None = None

    def type_of(self, entry: Entry) -> TensorType:
        return self.nodes[entry.node].outputs[entry.index]

    def entries(self) -> Iterator[Entry]:
        for i, node in enumerate(self.nodes):
            for k in range(len(node.outputs) if not node.is_variable else 1):
                yield Entry(i, k)

    @property
    def variables(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.is_variable]

    @property
    def inputs(self) -> list[int]:
        """Variables without a param value: the model's runtime inputs (normally just ``data``)."""
        return [i for i in self.variables if self.nodes[i].name not in self.params]

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            if not node.is_variable:
                counts[node.op] = counts.get(node.op, 0) + 1
        return dict(sorted(counts.items()))
