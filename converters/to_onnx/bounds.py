"""True precisions: a bound every value of an entry provably satisfies, for choosing exact lowerings.

The runtime's precision labels are bounds for every op but those in ``WIDER``: ``where`` takes the precision of
its condition while it outputs values of ``x`` and ``y``; a 1-bit (all zero) input to ``broadcast_greater``,
``get_valid_counts`` or ``non_max_suppression`` still gives 1 or -1. Those get the bound of what they output; every
other op re-applies its own precision rule to the true input precisions. Where a rule refuses the wider inputs,
nothing better than 32 bits (any int32) is known. Params get the precision of their largest actual value.
"""
from __future__ import annotations

import numpy as np

from cvm_onnx.graph import Entry, Graph
from cvm_onnx.ops import REGISTRY, OpRuleError
from cvm_onnx.ops.registry import bits


WIDER = {
    "where": lambda p: [max(p[1], p[2])],
    "broadcast_greater": lambda p: [max(p[0], 2)],
    "get_valid_counts": lambda p: [32, max(p[0], 2)],
    "non_max_suppression": lambda p: [max(p[0], 2)],
}


def true_precisions(graph: Graph) -> dict[Entry, int]:
    out: dict[Entry, int] = {}
    for i, node in enumerate(graph.nodes):
        if node.is_variable:
            value = graph.params.get(node.name)
            p = node.outputs[0].precision
            if value is not None and value.size:
                p = min(p, bits(int(np.abs(value.astype(np.int64)).max())) + 1)
            out[Entry(i)] = max(p, 1)
            continue
        ins = [out[e] for e in node.inputs]
        if node.op in WIDER:
            precs = WIDER[node.op](ins)
        else:
            op = REGISTRY[node.op]
            try:
                precs = op.infer_precisions(op.bind(node.attrs), ins, [graph.type_of(e).shape for e in node.inputs])
            except OpRuleError:
                precs = [32] * len(node.outputs)
        for k, p in enumerate(precs):
            out[Entry(i, k)] = min(max(p, 1), 32)
    return out
