"""True precisions: a bound every value of an entry provably satisfies, for choosing exact lowerings.

The runtime's precision labels are bounds for every op but one: ``where`` takes the precision of its condition
while it outputs values of ``x`` and ``y``. Here ``where`` gets max(p_x, p_y) and every other op re-applies its
own precision rule to the true input precisions; where a rule refuses the wider inputs, nothing better than
32 bits (any int32) is known. Params get the precision of their largest actual value.
"""
from __future__ import annotations

import numpy as np

from cvm_onnx.graph import Entry, Graph
from cvm_onnx.ops import REGISTRY, OpRuleError
from cvm_onnx.ops.registry import bits


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
        if node.op == "where":
            precs = [max(ins[1], ins[2])]
        else:
            op = REGISTRY[node.op]
            try:
                precs = op.infer_precisions(op.bind(node.attrs), ins, [graph.type_of(e).shape for e in node.inputs])
            except OpRuleError:
                precs = [32] * len(node.outputs)
        for k, p in enumerate(precs):
            out[Entry(i, k)] = min(max(p, 1), 32)
    return out
