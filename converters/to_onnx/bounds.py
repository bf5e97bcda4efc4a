"""Value bounds: for every entry, an integer B with |x| <= B for every value the entry can take.

Lowerings pick exact and fast forms from these bounds (float32 is exact below 2^24, int32 arithmetic cannot
overflow below 2^31, ...). The runtime's precision labels are not used: ``where`` labels its output with its
condition's precision, and a 1-bit input to ``broadcast_greater`` still gives 1. Instead each op's bound follows
from its inputs' bounds and, for params, their actual values (a conv's bound is max over output channels of
sum|w| * B_x + |bias|). ``ANY`` (2^31) means any int32, INT32_MIN included.
"""
from __future__ import annotations

from math import prod
from typing import Callable

import numpy as np

from cvm_onnx.constants import ANY, precision_bound
from cvm_onnx.graph import Entry, Graph
from cvm_onnx.ops import REGISTRY
from cvm_onnx.ops.registry import magnitudes, max_abs

def _product_bound(a, x: int, w: int, w_value: np.ndarray | None, b: int, b_value: np.ndarray | None,
                   per_row: int) -> int:
    """max over output channels of sum|w_row| * B_x + |bias|: conv2d (rows of C/g*kh*kw) and dense (rows of K)."""
    if w_value is not None:
        rows = np.add.reduce(magnitudes(w_value).reshape(w_value.shape[0], -1), axis=1, dtype=np.int64) * x
    else:
        rows = np.full(1, per_row * w * x, np.int64)
    if a.use_bias:
        rows = rows + (magnitudes(b_value).astype(np.int64) if b_value is not None else b)
    return int(rows.max())


def _conv2d(a, shapes, bounds, values):
    w = shapes[1]
    return [_product_bound(a, bounds[0], bounds[1], values[1], bounds[2] if a.use_bias else 0,
                           values[2] if a.use_bias else None, w[1] * w[2] * w[3])]


def _dense(a, shapes, bounds, values):
    return [_product_bound(a, bounds[0], bounds[1], values[1], bounds[2] if a.use_bias else 0,
                           values[2] if a.use_bias else None, shapes[1][1])]


Rule = Callable[..., list[int]]
RULES: dict[str, Rule] = {
    "conv2d": _conv2d,
    "dense": _dense,
    **dict.fromkeys(["elemwise_add", "elemwise_sub", "broadcast_add", "broadcast_sub"],
                    lambda a, s, b, v: [b[0] + b[1]]),
    "broadcast_mul": lambda a, s, b, v: [b[0] * b[1]],
    "broadcast_max": lambda a, s, b, v: [max(b)],
    "broadcast_div": lambda a, s, b, v: [b[0]],
    "broadcast_greater": lambda a, s, b, v: [1],
    "cvm_right_shift": lambda a, s, b, v: [min(precision_bound(a.precision), (b[0] >> a.shift_bit) + 1)],
    "cvm_left_shift": lambda a, s, b, v: [min(precision_bound(a.precision), b[0] << a.shift_bit)],
    "cvm_clip": lambda a, s, b, v: [min(precision_bound(a.precision), b[0])],
    "clip": lambda a, s, b, v: [max(abs(a.a_min), abs(a.a_max))],
    "cvm_precision": lambda a, s, b, v: [32],
    "sum": lambda a, s, b, v: [b[0] * (prod(s[0]) // prod(REGISTRY["sum"].infer_shapes(a, s)[0]))],
    "concatenate": lambda a, s, b, v: [max(b)],
    "where": lambda a, s, b, v: [max(b[1], b[2])],
    "cvm_lut": lambda a, s, b, v: [b[1]],
    "get_valid_counts": lambda a, s, b, v: [s[0][1], max(b[0], 1)],
    "non_max_suppression": lambda a, s, b, v: [max(b[0], 1)],
}
"""Ops absent from RULES output values of their first input (relu, abs, negative, max, pooling, data movement)."""


def value_bounds(graph: Graph) -> dict[Entry, int]:
    out: dict[Entry, int] = {}
    for i, node in enumerate(graph.nodes):
        if node.is_variable:
            value = graph.params.get(node.name)
            out[Entry(i)] = max_abs(value) if value is not None else node.outputs[0].bound
            continue
        bounds = [out[e] for e in node.inputs]
        rule = RULES.get(node.op)
        if rule is None:
            found = [bounds[0]] * len(node.outputs)
        else:
            sources = [graph.nodes[e.node] for e in node.inputs]
            values = [graph.params.get(s.name) if s.is_variable else None for s in sources]
            shapes = [graph.type_of(e).shape for e in node.inputs]
            found = rule(REGISTRY[node.op].bind(node.attrs), shapes, bounds, values)
        for k, b in enumerate(found):
            out[Entry(i, k)] = min(int(b), ANY)
    return out
