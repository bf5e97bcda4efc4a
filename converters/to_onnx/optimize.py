"""An optional pass for serving the flat form: drop the int32 round trips between float bodies.

A lowering that computes in floating point casts its result to int32 (every CVM tensor is int32), and the
next lowering often casts it straight back: ``Cast(Cast(v, to=INT32), to=F)`` with v float32 or float64.

Exactness: every lowering casts a float to int32 only when the float holds an integer within int32 (that is
each lowering's exactness argument; none relies on Cast's truncation or on out-of-range conversion, see
lowering.py). So the int32 holds v exactly, and converting that integer to F gives what converting v to F
gives: v itself when F is v's own type (v is representable in it), else the same round-to-nearest of the same
integer (float32 -> float64 is exact; float64 -> float32 rounds both ways alike). The pass therefore lets the
consumer read v, or ``Cast(v, to=F)``, and drops the casts nobody reads any more. The int32 tensor stays
wherever anything else reads it (a graph output, an int32 op), so every CVM tensor that remains keeps its
value. Params that nothing reads any more (scalars a fused run holds as constants) are dropped too.

The result is no longer the exporter's canonical flat form (``from_onnx`` verifies a flat-form node against
its lowering, so it does not import an optimized model): it is meant for running.
"""
from __future__ import annotations

import onnx
from onnx import TensorProto

FLOATS = (TensorProto.FLOAT, TensorProto.DOUBLE)


def _cast_to(node: onnx.NodeProto) -> int | None:
    if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
        return None
    return next(a.i for a in node.attribute if a.name == "to")


def _types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor shape inference can tell (initializer data left out: only types matter)."""
    g = model.graph
    params = [onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in g.initializer]
    light = onnx.helper.make_model(onnx.helper.make_graph(g.node, g.name, [*g.input, *params], g.output),
                                   opset_imports=model.opset_import, ir_version=model.ir_version)
    inferred = onnx.shape_inference.infer_shapes(light)
    infos = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    return {vi.name: vi.type.tensor_type.elem_type for vi in infos}


def drop_int32_round_trips(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` (the exporter's flat form) where every ``Cast(Cast(v, to=INT32), to=F)`` of a float v
    reads v (F is v's type) or becomes ``Cast(v, to=F)``, and every cast left unread is removed."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    types = _types(out)
    producer = {o: n for n in graph.node for o in n.output}
    rename: dict[str, str] = {}
    for node in graph.node:
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
    _drop_unread_casts(graph)
    _drop_unread_initializers(graph)
    made = {o for n in graph.node for o in n.output} | {t.name for t in graph.initializer}
    infos = [vi for vi in graph.value_info if vi.name in made]
    del graph.value_info[:]
    graph.value_info.extend(infos)
    return out


def _drop_unread_initializers(graph: onnx.GraphProto) -> None:
    """Remove the params nobody reads (a fused run holds its scalars as constants), so that onnxruntime has no
    unused initializer to warn about."""
    read = {t for n in graph.node for t in n.input} | {o.name for o in graph.output}
    for k in reversed(range(len(graph.initializer))):
        if graph.initializer[k].name not in read:
            del graph.initializer[k]


def _drop_unread_casts(graph: onnx.GraphProto) -> None:
    """Remove the casts whose output nobody reads, repeatedly (a dropped cast may leave its source unread)."""
    while True:
        read = {t for n in graph.node for t in n.input} | {o.name for o in graph.output}
        keep = [n for n in graph.node if _cast_to(n) is None or n.output[0] in read]
        if len(keep) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(keep)
