"""Validation: the runtime's load-time rules applied to a whole graph, every problem reported at once.

``validate(graph)`` returns a new graph whose op nodes carry typed attributes (as given, no defaults added) and
inferred output types, the portability warnings and the model's gas (core/gas.py); or raises ``ValidationError``
listing every problem, each naming the node and the rule, the runtime's three gas limits included. A node whose
inputs failed is skipped, so one mistake is reported once.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .errors import Problem, ValidationError
from .format.storage import MAX_STORAGE, storage_plan
from .format.storage import storage_bytes as plan_bytes
from .gas import Gas, measure
from .graph import Graph, Node, TensorType, shape_problem
from .ops import REGISTRY, NodeRuleError, type_node
from .ops.registry import max_abs

INPUT_NAME = "data"


@dataclass
class Validated:
    graph: Graph
    warnings: list[Problem]
    gas: Gas


def _variable(node: Node, graph: Graph, problems: list[Problem], inputs: tuple[str, ...]) -> Node | None:
    where = node.name
    declared = node.outputs[0] if node.outputs else None
    if declared is None:
        problems.append(Problem(where, "variable has no shape"))
        return None
    ok = True
    if (err := shape_problem(declared.shape)) is not None:
        problems.append(Problem(where, err))
        ok = False
    if not 1 <= declared.precision <= 32:
        problems.append(Problem(where, f"variable precision {declared.precision} must lie in [1, 32]"))
        ok = False
    value = graph.params.get(node.name)
    if value is not None and node.name in inputs:
        problems.append(Problem(where, f"params hold a value of the input '{node.name}': the runtime replaces it by "
                                       "the given input (leave it out of params)"))
    elif value is None:
        if node.name not in inputs:
            problems.append(Problem(where, f"param missing from params (only the input '{INPUT_NAME}' may be absent)"))
    elif ok:
        if tuple(value.shape) != declared.shape:
            problems.append(Problem(where, f"param shape {tuple(value.shape)} differs from the graph's {declared.shape}"))
            ok = False
        elif value.dtype not in (np.int8, np.int32):
            problems.append(Problem(where, f"param dtype {value.dtype} must be int8 or int32"))
            ok = False
        elif value.size:
            peak = max_abs(value)
            if peak > declared.bound:
                problems.append(Problem(where, f"param value {peak} exceeds precision {declared.precision} "
                                               f"(|x| <= {declared.bound})"))
                ok = False
    return replace(node, attrs={}, outputs=(declared,)) if ok else None


def _op(node: Node, typed_nodes: list[Node | None], problems: list[Problem],
        warnings: list[Problem]) -> Node | None:
    where = node.name
    op = REGISTRY.get(node.op)
    if op is None:
        problems.append(Problem(where, f"unknown op {node.op!r}"))
        return None
    types: list[TensorType | None] = []  # None: the input failed (and was reported) or does not exist
    missing = []
    for e in node.inputs:
        s = typed_nodes[e.node]
        if s is not None and e.index >= len(s.outputs):
            missing.append(Problem(where, f"input {s.name} has no output {e.index}"))
        types.append(s.outputs[e.index] if s is not None and not missing else None)
    try:
        typed = type_node(node.op, node.attrs, types)
    except NodeRuleError as e:
        problems.extend(Problem(where, f"{node.op}: {rule}") for rule in e.rules)
        return None
    problems.extend(missing[:1])
    if typed.outputs is None:
        return None
    a, shapes = typed.attrs, [t.shape for t in types]
    out_shapes, out_precs = [t.shape for t in typed.outputs], [t.precision for t in typed.outputs]
    ok = True
    for k, s in enumerate(out_shapes):
        if (err := shape_problem(s)) is not None:
            problems.append(Problem(where, f"{node.op}: output {k} {err}"))
            ok = False
    for k, p in enumerate(out_precs):
        if not 1 <= p <= 32:
            problems.append(Problem(where, f"{node.op}: output {k} precision {p} must lie in [1, 32] "
                                           f"(insert cvm_right_shift or cvm_clip before it)"))
            ok = False
    if node.outputs:
        declared = [t.shape for t in node.outputs]
        if len(declared) != len(out_shapes):
            problems.append(Problem(where, f"{node.op}: the graph gives {len(declared)} outputs, the op has "
                                           f"{len(out_shapes)}"))
            ok = False
        elif declared != out_shapes:
            problems.append(Problem(where, f"{node.op}: shape in the graph {declared if len(declared) > 1 else declared[0]}"
                                           f" differs from the inferred "
                                           f"{out_shapes if len(out_shapes) > 1 else out_shapes[0]}"))
            ok = False
    if not ok:
        return None
    warnings.extend(Problem(where, f"{node.op}: {w}") for w in op.warnings(a, shapes, [t.precision for t in types]))
    return replace(node, attrs=typed.given, outputs=typed.outputs)


def validate(graph: Graph, inputs: tuple[str, ...] = (INPUT_NAME,)) -> Validated:
    """Check ``graph`` against every load-time rule of the runtime; raise ``ValidationError`` with all problems.

    ``inputs`` names the variables that may come without a param value (the runtime allows only ``data``;
    tests of single ops widen it).
    """
    problems: list[Problem] = []
    warnings: list[Problem] = []
    typed_nodes: list[Node | None] = []
    seen: set[str] = set()
    for i, node in enumerate(graph.nodes):
        late = [e for e in node.inputs if not 0 <= e.node < i]
        if late:
            problems.append(Problem(node.name, f"input node {late[0].node} does not come before node {i} "
                                               f"(nodes must be in topological order)"))
            typed_nodes.append(None)
            continue
        if node.is_variable:
            if node.name in seen:
                problems.append(Problem(node.name, "variable name used twice"))
            seen.add(node.name)
            typed_nodes.append(_variable(node, graph, problems, inputs))
        else:
            typed_nodes.append(_op(node, typed_nodes, problems, warnings))
    variable_names = {n.name for n in graph.nodes if n.is_variable}
    if inputs == (INPUT_NAME,) and INPUT_NAME not in variable_names:
        problems.append(Problem(INPUT_NAME, f"the graph has no variable '{INPUT_NAME}': the runtime loads no model "
                                            "without its input"))
    for name in graph.params:
        if name not in variable_names:
            problems.append(Problem(name, "param has no variable of that name in the graph"))
    if not graph.heads:
        problems.append(Problem("heads", "the graph has no outputs"))
    for h in graph.heads:
        if not 0 <= h.node < len(graph.nodes):
            problems.append(Problem("heads", f"head {h.node} is not a node"))
        elif (n := typed_nodes[h.node]) is not None and h.index >= len(n.outputs):
            problems.append(Problem("heads", f"head {n.name} has no output {h.index}"))
    gas = measure(typed_nodes)
    problems.extend(gas.problems)
    if not problems and (size := storage_bytes(replace(graph, nodes=typed_nodes))) > MAX_STORAGE:
        problems.append(Problem("storage", f"the runtime's storage for this graph, {size} bytes (4 per int32 value, "
                                           f"storages reused between tensors not live together), passes its "
                                           f"load-time bound 2^32 = {MAX_STORAGE} (CvmRuntime::GetStorageSize): it "
                                           f"refuses to load the model (a smaller input)"))
    if problems:
        raise ValidationError(problems)
    return Validated(replace(graph, nodes=list(typed_nodes)), warnings, gas)


def storage_bytes(graph: Graph) -> int:
    """The runtime's storage for a typed ``graph`` under the plan the writer writes (format/storage.py): per storage
    id, 4 bytes per value of its largest entry."""
    return plan_bytes(graph.nodes, storage_plan(graph.nodes, graph.heads))


def c_api_warnings(graph: Graph) -> list[Problem]:
    """The C API's output rule, outside the graph's validity: several heads are interleaved row by row (a row: all
    axes but the last), so heads with different row counts make every inference fail ("detection model output
    cannot concat") although the model loads; a warning naming each head's rows. ``graph``: validated."""
    if len(graph.heads) < 2:
        return []
    rows = {graph.nodes[h.node].name: int(np.prod(graph.type_of(h).shape[:-1], dtype=np.int64)) for h in graph.heads}
    if len(set(rows.values())) < 2:
        return []
    said = ", ".join(f"{name} {r}" for name, r in rows.items())
    return [Problem("heads", f"the CVM runtime's C API interleaves several outputs row by row (all axes but the "
                             f"last) and refuses at every inference heads of different row counts ({said}): the "
                             "model loads but does not run on chain")]
