"""The serving form's flat-form passes: small rewrites of the exported flat form, each keeping every CVM tensor's
value (``SERVING``, for every target; ``CUDA`` besides for the CUDA provider).

The model that comes out is no longer the exporter's canonical flat form (``from_onnx`` verifies a flat-form
node against its lowering, so it does not import a serving form): it is meant for running. The passes it went
through are named in its metadata ``cvm.optimized``.
"""
from __future__ import annotations

import onnx
from onnx import TensorProto, numpy_helper

from cvm_onnx.core.constants import PRECISION
from cvm_onnx.native import DOMAIN as NATIVE_DOMAIN

from .passes import NO_STALE_VALUE_INFO, Condition, Pass, model_pass


FLOATS = (TensorProto.FLOAT, TensorProto.DOUBLE)


def _unread_casts(model: onnx.ModelProto) -> list[str]:
    read = _read(model.graph)
    return [n.name for n in model.graph.node if _cast_to(n) is not None and n.output[0] not in read]


def _unread_params(model: onnx.ModelProto) -> list[str]:
    read = _read(model.graph)
    return [t.name for t in model.graph.initializer if t.name not in read]


NO_UNREAD_CASTS = Condition("every Cast's output read", _unread_casts)
NO_UNREAD_PARAMS = Condition("every initializer read", _unread_params)
def _cast_to(node: onnx.NodeProto) -> int | None:
    if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
        return None
    return next(a.i for a in node.attribute if a.name == "to")


def element_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor shape inference can tell (initializer data left out: only types matter)."""
    g = model.graph
    params = [onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in g.initializer]
    light = onnx.helper.make_model(onnx.helper.make_graph(g.node, g.name, [*g.input, *params], g.output),
                                   opset_imports=model.opset_import, ir_version=model.ir_version)
    inferred = onnx.shape_inference.infer_shapes(light)
    infos = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    return {vi.name: vi.type.tensor_type.elem_type for vi in infos}


def _read(graph: onnx.GraphProto) -> set[str]:
    return {t for n in graph.node for t in n.input} | {o.name for o in graph.output}


@model_pass()
def skip_int32_round_trips(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every ``Cast(Cast(v, to=INT32), to=F)`` of a float v is read as v (F is v's type) or ``Cast(v, to=F)``.

    Exact: every lowering casts a float to int32 only when the float holds an integer within int32 (each
    lowering's exactness argument; none relies on Cast's truncation or on out-of-range conversion, see
    lowering.py). So the int32 holds v exactly, and converting that integer to F gives what converting v to F
    gives: v itself when F is v's own type, else the same round-to-nearest of the same integer (float32 ->
    float64 is exact; float64 -> float32 rounds both ways alike). The int32 casts stay (``drop_unread_casts``
    removes those nobody reads any more).
    """
    types = element_types(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    rename: dict[str, str] = {}
    for node in model.graph.node:
        node.input[:] = [rename.get(t, t) for t in node.input]
        to = _cast_to(node)
        inner = producer.get(node.input[0]) if to in FLOATS else None
        if inner is None or _cast_to(inner) != TensorProto.INT32 or types.get(inner.input[0]) not in FLOATS:
            continue
        v = inner.input[0]
        if types[v] == to:
            rename[node.output[0]] = v
        else:
            node.input[0] = v
    return model


@model_pass(NO_UNREAD_CASTS)
def drop_unread_casts(model: onnx.ModelProto) -> onnx.ModelProto:
    """Casts whose output nobody reads are removed, repeatedly (a dropped cast may leave its source unread);
    every tensor still read, or a graph output, keeps its producer."""
    graph = model.graph
    while True:
        read = _read(graph)
        keep = [n for n in graph.node if _cast_to(n) is None or n.output[0] in read]
        if len(keep) == len(graph.node):
            return model
        del graph.node[:]
        graph.node.extend(keep)


@model_pass(NO_UNREAD_PARAMS)
def drop_unread_params(model: onnx.ModelProto) -> onnx.ModelProto:
    """Initializers nobody reads are removed (a fused run holds its scalars as constants), so that onnxruntime
    has no unused initializer to warn about; every param still read stays as it was."""
    read = _read(model.graph)
    for k in reversed(range(len(model.graph.initializer))):
        if model.graph.initializer[k].name not in read:
            del model.graph.initializer[k]
    return model


@model_pass(NO_STALE_VALUE_INFO)
def drop_stale_value_info(model: onnx.ModelProto) -> onnx.ModelProto:
    """value_info is kept only for tensors a node or an initializer still makes, in its order; every kept entry
    is unchanged (its shape and ``cvm.precision``)."""
    graph = model.graph
    made = {o for n in graph.node for o in n.output} | {t.name for t in graph.initializer}
    infos = [vi for vi in graph.value_info if vi.name in made]
    del graph.value_info[:]
    graph.value_info.extend(infos)
    return model


def _window_key(node: onnx.NodeProto) -> bytes | None:
    """What determines a native im2col node's output (its op, inputs and attributes), else None."""
    if node.domain != NATIVE_DOMAIN or not node.op_type.startswith("im2col"):
        return None
    key = onnx.NodeProto(op_type=node.op_type, domain=node.domain, input=node.input, attribute=node.attribute)
    return key.SerializeToString(deterministic=True)


def _repeated_windows(model: onnx.ModelProto) -> list[str]:
    seen, repeated = set(), []
    for n in model.graph.node:
        if (key := _window_key(n)) is not None:
            repeated += [n.name] if key in seen else []
            seen.add(key)
    return repeated


NO_REPEATED_WINDOWS = Condition("no two native im2col nodes of the same inputs and attributes", _repeated_windows)


@model_pass(NO_REPEATED_WINDOWS)
def merge_repeated_windows(model: onnx.ModelProto) -> onnx.ModelProto:
    """A native im2col node with the same op, inputs and attributes as an earlier one (the runs that take channel
    groups of one convolution, ``requantize.Chain.take``) is removed, its readers reading the earlier one's output:
    the op is a function of its input and attributes (pure data movement), so the windows are the same bytes."""
    first: dict[bytes, str] = {}
    rename: dict[str, str] = {}
    nodes = []
    for node in model.graph.node:
        node.input[:] = [rename.get(t, t) for t in node.input]
        key = _window_key(node)
        if key is not None and key in first:
            rename[node.output[0]] = first[key]
            continue
        if key is not None:
            first[key] = node.output[0]
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def _integer_clips(model: onnx.ModelProto) -> list[str]:
    types = element_types(model)
    return [n.name for n in model.graph.node
            if n.op_type == "Clip" and n.domain in ("", "ai.onnx") and types.get(n.input[0]) not in FLOATS]


#: What the CUDA form needs of a Clip: none on integers (onnxruntime's CUDA provider has no int32 Clip kernel).
NO_INTEGER_CLIP = Condition("no Clip of an integer tensor", _integer_clips)


@model_pass(NO_INTEGER_CLIP)
def clips_as_max_min(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every integer ``Clip(x, lo, hi)`` becomes ``Min(Max(x, lo), hi)`` (an absent bound: that step left out),
    named after it: onnxruntime has no CUDA kernel for int32 Clip, and Max and Min have int32 ones. The same
    value: ONNX Clip is min(max(x, lo), hi), which for lo > hi gives hi, as the Min of the Max does."""
    types = element_types(model)
    nodes = []
    for node in model.graph.node:
        if node.op_type != "Clip" or node.domain not in ("", "ai.onnx") or types.get(node.input[0]) in FLOATS:
            nodes.append(node)
            continue
        x = node.input[0]
        bounds = [(op, t) for op, t in zip(("Max", "Min"), [*node.input[1:], "", ""][:2]) if t]
        for k, (op, t) in enumerate(bounds):
            y = node.output[0] if k == len(bounds) - 1 else f"{node.output[0]}:{op.lower()}"
            nodes.append(onnx.helper.make_node(op, [x, t], [y], name=f"{node.name}:{op.lower()}"))
            nodes[-1].metadata_props.extend(node.metadata_props)
            x = y
        if not bounds:
            nodes.append(onnx.helper.make_node("Identity", [x], list(node.output), name=node.name))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def _integer_scalars(graph: onnx.GraphProto) -> dict[str, int]:
    """The integer scalar each Constant node (``value``) makes, by its output's name."""
    out = {}
    for n in graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.attribute[0].name == "value":
            v = numpy_helper.to_array(n.attribute[0].t)
            if v.size == 1 and v.dtype.kind in "iu":
                out[n.output[0]] = int(v.reshape(-1)[0])
    return out


def _clip(x: int, lo: int, hi: int) -> int:
    """ONNX Clip of one value: min(max(x, lo), hi) (hi for lo > hi)."""
    return min(max(x, lo), hi)


def _move_declared(graph: onnx.GraphProto, src: str, dst: str) -> None:
    """The ``cvm.precision`` of value ``src`` put on graph input ``dst`` (if ``dst`` is one and ``src`` has it)."""
    declared = [p for vi in graph.value_info if vi.name == src for p in vi.metadata_props if p.key == PRECISION]
    for vi in graph.input:
        if vi.name == dst:
            vi.metadata_props.extend(declared)


@model_pass()
def merge_clip_pairs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``Clip(Clip(x, a1, b1), a2, b2)`` with integer constant bounds, the inner Clip's output read by the outer
    alone and no graph output, becomes ``Clip(x, A, B)`` in the outer's place, A = clip(a1, a2, b2) and
    B = clip(b1, a2, b2) (each the tensor of one of the four bounds: no new constant); the inner Clip and the
    Constants nobody reads any more are removed. (The input's clamp to its precision followed by a clip: the
    precision declared on the clamped value, ``<input>:clamped``, moves to the graph input itself.)

    Exact for every x (ONNX Clip is min(max(x, lo), hi)): g = clip(., a2, b2) is nondecreasing. For a1 > b1 the
    inner is b1, so the left side is g(b1) = B, and A >= B makes clip(x, A, B) = B too. For a1 <= b1 the inner is
    the median of a1, x, b1, and a nondecreasing g commutes with medians: the left side is med(A, g(x), B). If
    a2 > b2, g is b2 everywhere and A = B = b2. Else A, B lie in [a2, b2], where g(x) = x; outside it g(x) is
    the nearer end of [a2, b2], beyond neither A nor B on x's side: med(A, g(x), B) = med(A, x, B) = clip(x, A, B).
    """
    graph = model.graph
    scalars = _integer_scalars(graph)
    reads: dict[str, int] = {}
    for t in [t for n in graph.node for t in n.input] + [o.name for o in graph.output]:
        reads[t] = reads.get(t, 0) + 1
    clips: dict[str, onnx.NodeProto] = {}
    dropped: set[str] = set()  # the inner Clips' outputs
    freed: set[str] = set()
    for node in graph.node:
        if node.op_type != "Clip" or node.domain not in ("", "ai.onnx") or len(node.input) != 3 \
                or not all(t in scalars for t in node.input[1:]):
            continue
        inner = clips.get(node.input[0])
        if inner is not None and reads[node.input[0]] == 1:
            (a1, b1), (a2, b2) = inner.input[1:], node.input[1:]
            value = {scalars[t]: t for t in (a1, b1, a2, b2)}
            lo, hi = (value[_clip(scalars[t], scalars[a2], scalars[b2])] for t in (a1, b1))
            freed.update({a1, b1, a2, b2} - {lo, hi})
            node.input[:] = [inner.input[0], lo, hi]
            dropped.add(inner.output[0])
            _move_declared(graph, inner.output[0], inner.input[0])
        clips[node.output[0]] = node
    nodes = [n for n in graph.node if n.op_type != "Clip" or n.output[0] not in dropped]
    read = {t for n in nodes for t in n.input} | {o.name for o in graph.output}
    nodes = [n for n in nodes if not (n.op_type == "Constant" and n.output[0] in freed - read)]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


#: The passes of the serving form after export, in order.
SERVING: tuple[Pass, ...] = (merge_repeated_windows, merge_clip_pairs, skip_int32_round_trips, drop_unread_casts,
                             drop_unread_params, drop_stale_value_info)
#: The passes of the CUDA serving form after ``SERVING``: every node a kernel of onnxruntime's CUDA provider.
CUDA: tuple[Pass, ...] = (clips_as_max_min,)
