"""A model's gas, its cost on chain, as the runtime's ``CvmRuntime::GetOps`` computes it.

gas = ops + memory. Each op node adds base ops x the size of its output 0, base ops being its op's cost per
output element (``Op.base_ops``: dense, conv2d, max_pool2d, sum and non_max_suppression state theirs, every
other op costs 1). Memory is 5 x the size of every entry: a variable's, and every output of an op node. The
runtime refuses a node whose base ops exceed 2^30, the node where the ops so far pass 2^40 and the node where
the memory so far passes 2^40 (``VERIFY_LE``, checked as it walks the nodes in order).
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Sequence

from .errors import Problem
from .graph import Node
from .ops import REGISTRY

MAX_BASE_OPS = 1 << 30
MAX_OPS = 1 << 40
MAX_MEMORY = 1 << 40
MEMORY_SCALE = 5


@dataclass(frozen=True)
class NodeGas:
    """One node's share: its base ops (1 for a variable, which adds none), ops and memory."""

    name: str
    op: str
    base_ops: int
    ops: int
    memory: int

    @property
    def total(self) -> int:
        return self.ops + self.memory


@dataclass(frozen=True)
class Gas:
    """A model's gas in its two parts, each node's share, and the runtime's limits it breaks (each a Problem
    naming the node where the runtime stops)."""

    ops: int
    memory: int
    nodes: tuple[NodeGas, ...]
    problems: tuple[Problem, ...] = ()

    @property
    def total(self) -> int:
        return self.ops + self.memory

    def of(self, names: set[str]) -> int:
        """The gas of the nodes named."""
        return sum(n.total for n in self.nodes if n.name in names)

    def line(self) -> str:
        """``gas N = ops O + memory M``, the figures CVMAPIGetGasFromModel sums."""
        return f"gas {self.total} = ops {self.ops} + memory {self.memory} (the runtime's GetOps)"


def node_gas(node: Node, input_shapes: Sequence[tuple[int, ...]]) -> NodeGas:
    """The share of one typed node (attributes typed as validation leaves them, outputs known)."""
    sizes = [prod(t.shape) for t in node.outputs]
    if node.is_variable:
        return NodeGas(node.name, node.op, 1, 0, MEMORY_SCALE * sizes[0])
    op = REGISTRY[node.op]
    base = op.base_ops(op.bind(node.attrs), list(input_shapes), node.outputs[0].shape)
    return NodeGas(node.name, node.op, base, base * sizes[0], MEMORY_SCALE * sum(sizes))


def measure(nodes: Sequence[Node | None]) -> Gas:
    """The gas of typed nodes in order. A None (a node that failed validation) is skipped: the per-node limit is
    still checked on the others, the totals and their limits only when every node is there."""
    shares: list[NodeGas] = []
    problems: list[Problem] = []
    ops = memory = 0
    whole = all(n is not None for n in nodes)
    for node in nodes:
        if node is None or any(nodes[e.node] is None for e in node.inputs):
            continue
        share = node_gas(node, [nodes[e.node].outputs[e.index].shape for e in node.inputs])
        shares.append(share)
        if share.base_ops > MAX_BASE_OPS:
            problems.append(Problem(node.name, f"{node.op}: {share.base_ops} ops per output element exceed the "
                                               f"runtime's limit 2^30 (GetOps)"))
        if whole and ops <= MAX_OPS < ops + share.ops:
            problems.append(Problem(node.name, f"{node.op}: the model's ops reach {ops + share.ops} here, past the "
                                               f"runtime's limit 2^40 (GetOps)"))
        if whole and memory <= MAX_MEMORY < memory + share.memory:
            problems.append(Problem(node.name, f"the model's memory cost (5 x the entries' sizes) reaches "
                                               f"{memory + share.memory} here, past the runtime's limit 2^40 (GetOps)"))
        ops, memory = ops + share.ops, memory + share.memory
    return Gas(ops, memory, tuple(shares), tuple(problems))
