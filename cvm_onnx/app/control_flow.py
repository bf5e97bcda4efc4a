"""Control flow and constants that the float model's inputs and shapes decide, made straight-line before
quantize_static: Ifs of a constant condition replaced by the branch they take, constant subgraphs folded, Loops and
Scans unrolled into copies of their bodies (the same float operations, in the same order)."""
from __future__ import annotations

import math
from collections import Counter
from typing import Callable, Mapping

import numpy as np
import onnx

from cvm_onnx.converters.from_onnx.context import MAX_FOLDED

from .rewrites import shapes_only


CONTROL_FLOW = ("If", "Loop", "Scan")


def fold_constant_ifs(model: onnx.ModelProto, shapes: bool = False) -> None:
    """Each If whose condition the graph's constants alone decide (evaluated by onnx's reference evaluator): its
    branch's nodes in its place, the branch's own tensors renamed ``<If>/<name>`` (in the branch's subgraphs too),
    Identity to the If's outputs; repeated until none is left (an inlined branch's own Ifs too). ``shapes`` (the
    input's shape fixed): first the nodes that compute constants, a Shape or Size of a tensor whose shape onnx's
    shape inference states in full among them, replaced by their values, each time. The Loops and Scans they decide
    are unrolled each time too (``unrolled_loops``, ``unrolled_scans``), their copies (of Loops within unrolled Loops
    too) adding at most MAX_UNROLLED_NODES nodes to the graph in all."""
    graph = model.graph
    limit = len(graph.node) + MAX_UNROLLED_NODES
    folded = True
    while folded:
        folded = shapes and fold_constants(model) > 0
        inits = {t.name for t in graph.initializer}
        producer = {o: n for n in graph.node for o in n.output}
        for node in [n for n in graph.node if n.op_type == "If"]:
            if (cond := _condition(model, node.input[0], inits, producer)) is not None:
                _inline(graph, node, cond)
                folded = True
        folded = unrolled_loops(model, limit) + unrolled_scans(model, limit) > 0 or folded


#: Ops whose outputs are drawn at random: never folded to constants.
RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def fold_constants(model: onnx.ModelProto, kept: frozenset[str] = frozenset()) -> int:
    """The main graph's nodes that compute constants (every input a constant; a Shape or Size of a tensor whose
    shape onnx's shape inference, with data propagation, states in full) replaced by initializers of their values
    (onnx's reference evaluator); control flow, random draws, the ops ``kept`` and nodes whose outputs' shapes are
    not known or hold more than MAX_FOLDED elements (checked before computing them) stay, but for a NonZero of a
    constant, whose output holds at most its input's rank times size. A constant that only folded nodes read
    (not a graph input or output, nor read in a subgraph) is dropped: an initializer from the graph, a folded
    value when its last reader folds. Returns how many nodes were replaced."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    try:
        g = onnx.shape_inference.infer_shapes(shapes_only(model), data_prop=True).graph
    except Exception:  # noqa: BLE001  (onnx's inference raises several types: no shape is then known)
        g = onnx.GraphProto()
    known = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in [*g.value_info, *g.input, *g.output]
             if v.type.tensor_type.HasField("shape")
             and all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)}
    tensors = {t.name: t for t in graph.initializer}
    values: dict[str, np.ndarray] = {}  # the folded nodes' outputs still read
    readers = Counter(x for n in graph.node for x in n.input if x)
    kept = {v.name for v in [*graph.input, *graph.output]} | _subgraph_reads(graph)
    dead: set[str] = set()
    done = []  # (index, node)
    for k, n in enumerate(graph.node):
        if n.op_type in RANDOM or n.op_type in kept or any(a.HasField("g") or a.graphs for a in n.attribute) or \
                any(o and (o not in known or math.prod(known[o]) > MAX_FOLDED) for o in n.output) and \
                not (n.op_type == "NonZero" and n.input[0] in tensors and
                     max(len(tensors[n.input[0]].dims), 1) * math.prod(tensors[n.input[0]].dims) <= MAX_FOLDED):
            continue
        if n.op_type in ("Shape", "Size") and (n.input[0] in known or n.input[0] in values
                                                or n.input[0] in tensors):
            dims = np.array(known[n.input[0]] if n.input[0] in known else
                            values[n.input[0]].shape if n.input[0] in values else tensors[n.input[0]].dims,
                            np.int64)
            attrs = {a.name: a.i for a in n.attribute}
            outs = [dims.prod() if n.op_type == "Size" else dims[attrs.get("start", 0):attrs.get("end", len(dims))]]
        elif all(not x or x in values or x in tensors for x in n.input):
            try:
                sub = helper.make_graph([n], "constant", [], [helper.make_value_info(o, onnx.TypeProto())
                                                             for o in n.output if o],
                                        [tensors[x] if x in tensors else numpy_helper.from_array(values[x], x)
                                         for x in set(n.input) if x])
                outs = ReferenceEvaluator(helper.make_model(sub, opset_imports=model.opset_import)).run(None, {})
            except Exception:  # noqa: BLE001  (the reference evaluator raises anything: the node stays)
                continue
        else:
            continue
        values.update((o, np.asarray(v)) for o, v in zip([o for o in n.output if o], outs))
        done.append((k, n))
        for x in filter(None, n.input):
            readers[x] -= 1
            if readers[x] == 0 and x not in kept:
                values.pop(x, None)
                dead.add(x)
    for _, n in done:
        graph.initializer.extend(numpy_helper.from_array(values.pop(o), o) for o in n.output if o and o not in dead)
    for k, _ in reversed(done):  # by index: remove() compares messages, quadratic in an unrolled Loop's nodes
        del graph.node[k]
    for k in reversed([k for k, t in enumerate(graph.initializer) if t.name in dead]):
        del graph.initializer[k]
    return len(done)


def _subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    """The names the nodes of ``graph``'s subgraphs (and theirs, at any depth) read."""
    out: set[str] = set()
    for n in graph.node:
        for a in n.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                out.update(x for m in sub.node for x in m.input)
                out |= _subgraph_reads(sub)
    return out


def _condition(model: onnx.ModelProto, name: str, inits: set[str], producer: dict[str, onnx.NodeProto]) \
        -> bool | None:
    """The value of the If condition ``name`` where the graph's constants decide it, else None."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    needed, todo = [], [name]
    while todo:
        x = todo.pop()
        if x in inits or any(x in n.output for n in needed):
            continue
        up = producer.get(x)
        if up is None or up.op_type in ("If", "Loop", "Scan"):
            return None
        needed.append(up)
        todo.extend(i for i in up.input if i)
    order = {id(n): k for k, n in enumerate(model.graph.node)}
    sub = helper.make_graph(sorted(needed, key=lambda n: order[id(n)]), "cond", [],
                            [helper.make_tensor_value_info(name, onnx.TensorProto.BOOL, None)],
                            list(model.graph.initializer))
    try:
        [cond] = ReferenceEvaluator(helper.make_model(sub, opset_imports=model.opset_import)).run(None, {})
    except Exception:  # noqa: BLE001  (the reference evaluator raises anything: the If stays)
        return None
    cond = np.asarray(cond).reshape(-1)
    return bool(cond[0]) if cond.size == 1 else None  # If takes one value: of none or several the If stays


def _inline(graph: onnx.GraphProto, node: onnx.NodeProto, cond: bool) -> None:
    """The If ``node`` replaced in ``graph`` by its branch for ``cond``."""
    from onnx import helper

    branch = next(a.g for a in node.attribute if a.name == ("then_branch" if cond else "else_branch"))
    local = {o for n in branch.node for o in n.output} | {t.name for t in branch.initializer}
    prefix = f"{node.name or node.output[0]}/"
    new = []
    for t in branch.initializer:
        c = onnx.TensorProto()
        c.CopyFrom(t)
        c.name = prefix + t.name
        graph.initializer.append(c)
    for k, n in enumerate(branch.node):
        c = onnx.NodeProto()
        c.CopyFrom(n)
        c.input[:] = [prefix + x if x in local else x for x in n.input]
        c.output[:] = [prefix + x if x else x for x in n.output]
        c.name = f"{prefix}{n.name or n.op_type}/{k}"
        for a in c.attribute:
            for sub in [a.g] if a.HasField("g") else list(a.graphs):
                _renamed_outer(sub, local, prefix)
        new.append(c)
    for b_out, out in zip(branch.output, node.output):
        if out:
            new.append(helper.make_node("Identity", [prefix + b_out.name if b_out.name in local else b_out.name],
                                        [out], name=f"{prefix}{out}"))
    at = list(graph.node).index(node)
    graph.node.remove(node)
    for k, n in enumerate(new):
        graph.node.insert(at + k, n)


#: The most iterations a Loop is unrolled to (each a copy of its body), and the most nodes the copies may add to the
#: graph in all: onnxruntime's QDQ quantizer then takes a time that grows with the square of the graph's nodes.
MAX_UNROLLED = 1024
MAX_UNROLLED_NODES = 1 << 13


def _evaluated(name: str, producer: Mapping[str, onnx.NodeProto], consts: Mapping[str, onnx.TensorProto],
               opsets) -> np.ndarray | None:
    """The value of ``name`` where the constants ``consts`` alone decide it through the nodes of ``producer``
    (onnx's reference evaluator), else None: it reads a graph input, control flow or something the evaluator
    cannot compute."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    order: list[onnx.NodeProto] = []
    seen: set[int] = set()
    leaves: set[str] = set()
    stack: list[tuple[str, bool]] = [(name, False)]
    while stack:  # the producers in dependency order (post-order)
        x, done = stack.pop()
        if x in consts:
            leaves.add(x)
            continue
        up = producer.get(x)
        if up is None or up.op_type in CONTROL_FLOW or up.op_type in RANDOM:
            return None
        if done:
            if id(up) not in seen:
                seen.add(id(up))
                order.append(up)
            continue
        if id(up) in seen:
            continue
        stack.append((x, True))
        stack.extend((i, False) for i in up.input if i)
    sub = helper.make_graph(order, "value", [], [helper.make_value_info(name, onnx.TypeProto())],
                            [consts[x] for x in leaves])
    try:
        [value] = ReferenceEvaluator(helper.make_model(sub, opset_imports=opsets)).run(None, {})
    except Exception:  # noqa: BLE001  (the reference evaluator raises anything: not decided)
        return None
    return np.asarray(value)


def _iterations(node: onnx.NodeProto, body: onnx.GraphProto, producer: Mapping[str, onnx.NodeProto],
                consts: Mapping[str, onnx.TensorProto], opsets) -> int | None:
    """How many iterations the Loop ``node`` runs where the constants decide it, else None (also past MAX_UNROLLED
    iterations or MAX_UNROLLED_NODES copied nodes): its trip count and first condition evaluated in the graph, then
    the part of the body that its condition reads (the loop-carried values it reads, and theirs) run alone,
    iteration by iteration, by onnx's reference evaluator, before anything is copied."""
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    trip = _evaluated(node.input[0], producer, consts, opsets) if node.input[0] else None
    cond = _evaluated(node.input[1], producer, consts, opsets) if node.input[1] else np.array(True)
    if (node.input[0] and (trip is None or trip.size != 1 or trip.dtype.kind not in "iu")) or cond is None or \
            cond.size != 1:
        return None
    limit = math.inf if trip is None else max(int(trip.reshape(-1)[0]), 0)
    bound = min(MAX_UNROLLED, MAX_UNROLLED_NODES // max(len(body.node), 1))
    if not bool(cond.reshape(-1)[0]):
        return 0
    inputs = [v.name for v in body.input]
    made = {o: n for n in body.node for o in n.output if o}
    own = {t.name: t for t in body.initializer}
    carried = {v.name: 1 + j for j, v in enumerate(body.input[2:])}  # a carried input: its body output's index
    wanted, todo, seen, outer, fed = [body.output[0].name], [body.output[0].name], set(), set(), set()
    while todo:  # the cone of the condition, closed over the carried values it reads
        x = todo.pop()
        if x in seen or not x:
            continue
        seen.add(x)
        if x in carried:
            fed.add(x)
            wanted.append(body.output[carried[x]].name)
            todo.append(body.output[carried[x]].name)
        elif x in made:
            n = made[x]
            todo.extend(n.input)
            todo.extend(y for a in n.attribute for g in ([a.g] if a.HasField("g") else a.graphs)
                        for y in _outer_reads(g))
        elif x not in inputs[:2] and x not in own:
            outer.add(x)
    if body.output[0].name == inputs[1]:  # the condition passed through: the trip count alone ends the loop
        return int(limit) if limit <= bound else None
    values = {}
    for x in outer:  # the outer tensors the condition reads: constants, or it is not decided
        v = _evaluated(x, producer, consts, opsets)
        if v is None:
            return None
        values[x] = v
    state = {}
    for x, v in zip(inputs[2:], node.input[2:]):  # the carried values the condition reads start as constants
        if x in fed:
            value = _evaluated(v, producer, consts, opsets) if v else None
            if value is None:
                return None
            state[x] = value
    nodes = [n for n in body.node if any(o in seen for o in n.output)]
    feeds = [inputs[0], inputs[1], *sorted(fed)]
    sub = helper.make_graph(nodes, "condition", [helper.make_value_info(x, onnx.TypeProto()) for x in feeds],
                            [helper.make_value_info(x, onnx.TypeProto()) for x in wanted],
                            [own[x] for x in seen if x in own] +
                            [numpy_helper.from_array(np.asarray(v), x) for x, v in values.items()])
    try:
        run = ReferenceEvaluator(helper.make_model(sub, opset_imports=opsets))
    except Exception:  # noqa: BLE001  (the reference evaluator raises anything: not decided)
        return None
    k, going = 0, True
    while going and k < limit:
        if k == bound:
            return None
        try:
            outs = run.run(None, {inputs[0]: np.array(k, np.int64), inputs[1]: np.array(True), **state})
        except Exception:  # noqa: BLE001
            return None
        got = dict(zip(wanted, outs))
        cond = np.asarray(got[wanted[0]])
        if cond.size != 1:
            return None
        going = bool(cond.reshape(-1)[0])
        state = {x: got[body.output[carried[x]].name] for x in fed}
        k += 1
    return k


def _outer_reads(graph: onnx.GraphProto) -> set[str]:
    """The names the nodes of a subgraph (and its subgraphs) read that it does not itself define."""
    own = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {o for n in graph.node
                                                                                    for o in n.output}
    reads = {x for n in graph.node for x in n.input if x}
    reads |= {x for n in graph.node for a in n.attribute for g in ([a.g] if a.HasField("g") else a.graphs)
              for x in _outer_reads(g)}
    return reads - own


def _copies(body: onnx.GraphProto, base: str, count: int, bind: Callable) \
        -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], list[list[str]]]:
    """``count`` copies of ``body`` in order, its tensors renamed ``<base><k>/<name>`` (in its subgraphs too), its
    initializers and Constant nodes, the same in every copy, held once as ``<base><name>``; ``bind(k, prefix,
    previous outputs)`` gives copy k's extra constants, the nodes before it and the outer names of the body's
    inputs. Returns the nodes, the constants and each copy's output names."""
    local = {o for n in body.node for o in n.output if o} | {t.name for t in body.initializer}
    shared = {t.name: base + t.name for t in body.initializer}
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    for t in body.initializer if count else []:
        c = onnx.TensorProto()
        c.CopyFrom(t)
        c.name = shared[t.name]
        inits.append(c)
    for j, n in enumerate(body.node):
        if n.op_type == "Constant" and not n.input and count:
            shared.update((o, f"{base}{o}") for o in n.output if o)
            c = onnx.NodeProto()
            c.CopyFrom(n)
            c.output[:] = [shared.get(o, o) for o in n.output]
            c.name = f"{base}{n.name or n.op_type}/{j}"
            nodes.append(c)
    outs: list[list[str]] = []
    for k in range(count):
        prefix = f"{base}{k}/"
        extra, before, bound = bind(k, prefix, outs[-1] if outs else None)
        inits += extra
        nodes += before
        names = {x: prefix + x for x in local} | shared | bound
        for j, n in enumerate(body.node):
            if n.op_type == "Constant" and not n.input:
                continue
            c = onnx.NodeProto()
            c.CopyFrom(n)
            c.input[:] = [names.get(x, x) for x in n.input]
            c.output[:] = [names.get(x, x) for x in n.output]
            c.name = f"{prefix}{n.name or n.op_type}/{j}"
            for a in c.attribute:
                for sub in [a.g] if a.HasField("g") else list(a.graphs):
                    _renamed(sub, names)
            nodes.append(c)
        outs.append([names.get(v.name, v.name) for v in body.output])
    return nodes, inits, outs


def _stacked(values: list[str], out: str, axis: int, base: str) -> tuple[list[onnx.NodeProto], onnx.TensorProto]:
    """Nodes stacking the tensors ``values`` into ``out`` on a new axis ``axis`` (Unsqueeze, Concat), and the axes
    constant they read."""
    from onnx import helper, numpy_helper

    axes = f"{base}{out}/axes"
    parts = [f"{base}{out}/{j}" for j in range(len(values))]
    nodes = [helper.make_node("Unsqueeze", [x, axes], [p], name=f"{p}/Unsqueeze") for x, p in zip(values, parts)]
    nodes.append(helper.make_node("Concat", parts, [out], axis=axis, name=f"{base}{out}/Concat"))
    return nodes, numpy_helper.from_array(np.array([axis], np.int64), axes)


def _replaced(graph: onnx.GraphProto, node: onnx.NodeProto, nodes: list[onnx.NodeProto],
              inits: list[onnx.TensorProto]) -> None:
    at = list(graph.node).index(node)
    graph.node.remove(node)
    for j, n in enumerate(nodes):
        graph.node.insert(at + j, n)
    graph.initializer.extend(inits)


def unrolled_loops(model: onnx.ModelProto, limit: int | None = None) -> int:
    """Each Loop of the main graph whose iterations the graph's constants decide (``_iterations``: its trip count
    and conditions, a tf2onnx while loop's counters, a map over a batch of fixed size) replaced by copies of its
    body, one per iteration (at most MAX_UNROLLED, and MAX_UNROLLED_NODES nodes in all; ``_copies``), in order:
    iteration k's body with the iteration number k and condition true as constants, its loop-carried inputs the
    previous iteration's outputs (the Loop's initial values first); the final values by Identity, each scan output
    the iterations' values stacked on a new first axis (Unsqueeze, Concat). The same float operations in the same
    order: the model computes what the Loop computed. A Loop whose iterations are not decided, past those bounds,
    or running none with scan outputs (empty, of no known shape), or whose copies would take the graph past ``limit``
    nodes, stays. Returns how many were unrolled."""
    from onnx import helper, numpy_helper

    graph = model.graph
    done = 0
    for node in [n for n in graph.node if n.op_type == "Loop"]:
        body = next((a.g for a in node.attribute if a.name == "body" and a.type == onnx.AttributeProto.GRAPH), None)
        if body is None or len(node.input) < 2 or len(body.input) != len(node.input) or \
                len(body.output) < len(node.input) - 1 or len(node.output) != len(body.output) - 1:
            continue  # not a Loop as ONNX defines it: it stays, refused
        consts = {t.name: t for t in graph.initializer}
        producer = {o: n for n in graph.node for o in n.output if o}
        count = _iterations(node, body, producer, consts, model.opset_import)
        n_carried = len(node.input) - 2
        n_scan = len(body.output) - 1 - n_carried
        if count is None or (count == 0 and n_scan) or (limit is not None and
                                                         len(graph.node) + count * len(body.node) > limit):
            continue
        it, ok = body.input[0].name, body.input[1].name

        def bind(k: int, prefix: str, previous: list[str] | None):
            carried = node.input[2:] if previous is None else previous[1:1 + n_carried]
            return ([numpy_helper.from_array(np.array(k, np.int64), prefix + it),
                     numpy_helper.from_array(np.array(True), prefix + ok)], [],
                    {it: prefix + it, ok: prefix + ok} | {v.name: x for v, x in zip(body.input[2:], carried)})

        base = f"{node.name or node.output[0]}/"
        new, inits, outs = _copies(body, base, count, bind)
        final = outs[-1][1:1 + n_carried] if outs else list(node.input[2:])
        new += [helper.make_node("Identity", [x], [o], name=f"{base}{o}")
                for x, o in zip(final, node.output[:n_carried]) if o]
        for j, o in enumerate(node.output[n_carried:]):
            if o:
                nodes, axes = _stacked([v[1 + n_carried + j] for v in outs], o, 0, base)
                new += nodes
                inits.append(axes)
        _replaced(graph, node, new, inits)
        done += 1
    return done


def unrolled_scans(model: onnx.ModelProto, limit: int | None = None) -> int:
    """Each Scan (opset 9 on) of the main graph whose scan inputs' lengths along their axes onnx's shape inference
    states (one length L, 1 to MAX_UNROLLED, and MAX_UNROLLED_NODES copied nodes in all) replaced by L copies of its
    body (``_copies``): copy t reads slice t of each scan input (Gather at t on its axis, L - 1 - t where its
    direction is 1) and the previous copy's states (the Scan's initial ones first); the final states by Identity,
    each scan output the copies' values stacked on a new axis at its scan_output_axes (Unsqueeze, Concat; in
    reverse order where its direction is 1). The same float operations in the same order. Any other Scan stays, and
    one whose copies would take the graph past ``limit`` nodes.
    Returns how many were unrolled."""
    from onnx import helper, numpy_helper

    from .rewrites import _known_shapes

    graph = model.graph
    version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    scans = [n for n in graph.node if n.op_type == "Scan"]
    if not scans or version < 9:
        return 0
    shapes = _known_shapes(model)
    done = 0
    for node in scans:
        attrs = {a.name: a for a in node.attribute}
        body = attrs["body"].g if "body" in attrs and attrs["body"].type == onnx.AttributeProto.GRAPH else None
        m = attrs["num_scan_inputs"].i if "num_scan_inputs" in attrs else 0
        n = len(node.input) - m
        if body is None or not 0 < m <= len(node.input) or len(body.input) != len(node.input) or \
                len(node.output) != len(body.output) or len(body.output) < n:
            continue
        k_out = len(body.output) - n
        listed = {name: list(attrs[name].ints) if name in attrs else [0] * size for name, size in
                  (("scan_input_axes", m), ("scan_input_directions", m), ("scan_output_axes", k_out),
                   ("scan_output_directions", k_out))}
        if any(len(v) != size for v, size in zip(listed.values(), (m, m, k_out, k_out))):
            continue
        lengths = set()
        for x, axis in zip(node.input[n:], listed["scan_input_axes"]):
            dims = shapes.get(x)
            lengths.add(dims[axis] if dims and -len(dims) <= axis < len(dims) else None)
        if len(lengths) != 1 or (length := lengths.pop()) is None or not 1 <= length <= MAX_UNROLLED or \
                length * len(body.node) > MAX_UNROLLED_NODES or \
                (limit is not None and len(graph.node) + length * len(body.node) > limit):
            continue
        base = f"{node.name or node.output[0]}/"

        def bind(t: int, prefix: str, previous: list[str] | None):
            states = node.input[:n] if previous is None else previous[:n]
            inits, before, bound = [], [], {v.name: x for v, x in zip(body.input[:n], states)}
            for j, (x, axis, back) in enumerate(zip(node.input[n:], listed["scan_input_axes"],
                                                    listed["scan_input_directions"])):
                at, sliced = f"{prefix}scan{j}/at", f"{prefix}scan{j}"
                inits.append(numpy_helper.from_array(np.array(length - 1 - t if back else t, np.int64), at))
                before.append(helper.make_node("Gather", [x, at], [sliced], axis=axis, name=f"{sliced}/Gather"))
                bound[body.input[n + j].name] = sliced
            return inits, before, bound

        new, inits, outs = _copies(body, base, length, bind)
        new += [helper.make_node("Identity", [x], [o], name=f"{base}{o}")
                for x, o in zip(outs[-1][:n], node.output[:n]) if o]
        for j, (o, axis, back) in enumerate(zip(node.output[n:], listed["scan_output_axes"],
                                                 listed["scan_output_directions"])):
            if o:
                values = [v[n + j] for v in outs]
                nodes, axes = _stacked(values[::-1] if back else values, o, axis, base)
                new += nodes
                inits.append(axes)
        _replaced(graph, node, new, inits)
        done += 1
    return done


def _renamed(graph: onnx.GraphProto, names: Mapping[str, str]) -> None:
    """In a subgraph of an unrolled Loop body (and the subgraphs within), its reads of the body's tensors that it
    does not itself define, renamed as ``names`` says."""
    own = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {o for n in graph.node
                                                                                    for o in n.output}
    outer = {x: y for x, y in names.items() if x not in own}
    for n in graph.node:
        n.input[:] = [outer.get(x, x) for x in n.input]
        for a in n.attribute:
            for sub in [a.g] if a.HasField("g") else list(a.graphs):
                _renamed(sub, outer)
    for v in graph.output:
        v.name = outer.get(v.name, v.name)


def _renamed_outer(graph: onnx.GraphProto, names: set[str], prefix: str) -> None:
    """In a subgraph of an inlined branch (and the subgraphs within), its reads of the branch's tensors ``names``
    that the subgraph does not itself define, renamed ``<prefix><name>``."""
    own = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {o for n in graph.node
                                                                                    for o in n.output}
    outer = names - own
    for n in graph.node:
        n.input[:] = [prefix + x if x in outer else x for x in n.input]
        for a in n.attribute:
            for sub in [a.g] if a.HasField("g") else list(a.graphs):
                _renamed_outer(sub, outer, prefix)
    for v in graph.output:
        if v.name in outer:
            v.name = prefix + v.name
