"""Float edges inside the graph (``convert --float-io``): an export of a quantized import that takes and gives
float32, as its float source model did, around the exact integer core; the input and outputs keep their names.

* The input: float32 -> QuantizeLinear (the edge's scale and zero point, of its type) -> Cast to int32 -> the
  core's input, renamed ``<name>:quantized``. ONNX's QuantizeLinear is saturate(round_half_even(x / scale) +
  zero_point) in float32: ``Edge.quantize``, what ``cvm-onnx run`` does to float input, to the bit.
* Each output with an edge: the core's int32 output, renamed ``<name>:quantized`` -> Sub (the zero point, int32;
  none when it is 0) -> DequantizeLinear (the scale; ``axis`` for a per-channel one) -> float32: float32(q -
  zero_point) * scale, ``Edge.dequantize``. The subtraction stays within int32 for the output's precision, or
  the export is refused. An output without an edge stays int32.
* Metadata ``cvm.float_io`` holds the edges (the text of ``quantization.json``), ``cvm.quantization`` none: the
  model quantizes for itself, so no runner does it again. The import takes the edges off again
  (``without_float_edges``), verified: putting them back must give the model as it is.

NaN has no quantized value: ``cvm-onnx run`` refuses it; this model gives what onnxruntime's QuantizeLinear
gives (ONNX does not say).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from cvm_onnx.core.constants import FLOAT_IO, INT32_MAX, PRECISION, QUANTIZATION, precision_bound, precision_of
from cvm_onnx.core.errors import FormatError, UnsupportedError
from cvm_onnx.core.format.edges import Edge, Edges, parse_edges

TYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "int16": TensorProto.INT16,
         "uint16": TensorProto.UINT16}
#: The ends of the names the float edges give their tensors and nodes beside the input's or an output's name X
#: (``X:scale``...): the export names no tensor of its own so (``entry_names``).
ENDS = ("quantized", "scale", "zero_point", "quantize", "cast", "centred", "centre", "dequantize", *TYPES)


def _rename(graph: onnx.GraphProto, old: str, new: str) -> None:
    for n in graph.node:
        n.input[:] = [new if t == old else t for t in n.input]
        n.output[:] = [new if t == old else t for t in n.output]


def _inner(vi: onnx.ValueInfoProto, name: str) -> onnx.ValueInfoProto:
    """The core's int32 tensor ``vi`` (with its precision) under its new name."""
    out = onnx.ValueInfoProto()
    out.CopyFrom(vi)
    out.name = name
    return out


def _as_float(vi: onnx.ValueInfoProto) -> None:
    vi.type.tensor_type.elem_type = TensorProto.FLOAT
    del vi.metadata_props[:]


def _input(graph: onnx.GraphProto, vi: onnx.ValueInfoProto, edge: Edge) -> list[onnx.NodeProto]:
    name, q = vi.name, f"{vi.name}:quantized"
    _rename(graph, name, q)
    graph.value_info.append(_inner(vi, q))
    graph.initializer.extend([numpy_helper.from_array(edge.scale.reshape(()), f"{name}:scale"),
                              helper.make_tensor(f"{name}:zero_point", TYPES[edge.type], [],
                                                 [int(edge.zero_point.reshape(-1)[0])])])
    _as_float(vi)
    return [helper.make_node("QuantizeLinear", [name, f"{name}:scale", f"{name}:zero_point"], [f"{name}:{edge.type}"],
                             name=f"{name}:quantize"),
            helper.make_node("Cast", [f"{name}:{edge.type}"], [q], name=f"{name}:cast", to=TensorProto.INT32)]


def _output(graph: onnx.GraphProto, vi: onnx.ValueInfoProto, edge: Edge) -> list[onnx.NodeProto]:
    name, q = vi.name, f"{vi.name}:quantized"
    rank = len(vi.type.tensor_type.shape.dim)
    scale, zero = edge.scale, edge.zero_point
    channels = [k for k, d in enumerate(scale.shape) if d != 1]
    if len(channels) > 1 or scale.ndim > rank:
        raise UnsupportedError(f"its scale of shape {scale.shape} is neither one number nor one per channel of an "
                               f"axis: DequantizeLinear has no form for it", where=name)
    precision = precision_of(next((p.value for p in vi.metadata_props if p.key == PRECISION), "32")) or 32
    if zero.any() and precision_bound(precision) + int(np.abs(zero).max()) > INT32_MAX:
        raise UnsupportedError(f"its values (precision {precision}) minus the zero point may leave int32", where=name)
    _rename(graph, name, q)
    graph.value_info.append(_inner(vi, q))
    nodes, centred = [], q
    if zero.any():
        centred = f"{name}:centred"
        graph.initializer.append(numpy_helper.from_array(zero.astype(np.int32), f"{name}:zero_point"))
        nodes.append(helper.make_node("Sub", [q, f"{name}:zero_point"], [centred], name=f"{name}:centre"))
    graph.initializer.append(numpy_helper.from_array(scale.reshape(-1) if channels else scale.reshape(()),
                                                     f"{name}:scale"))
    axis = {"axis": rank - scale.ndim + channels[0]} if channels else {}
    nodes.append(helper.make_node("DequantizeLinear", [centred, f"{name}:scale"], [name], name=f"{name}:dequantize",
                                  **axis))
    _as_float(vi)
    return nodes


def with_float_edges(model: onnx.ModelProto, edges: Edges) -> onnx.ModelProto:
    """``model`` (an export of the quantized import whose float edges are ``edges``) taking float32 input and
    giving float32 outputs where ``edges`` has them; ``UnsupportedError`` when its input has no edge."""
    if edges.inputs:
        raise UnsupportedError("float input: this model packs several inputs into data, so its export takes the "
                               "packed integers (cvm-onnx run --input X.npz lays named inputs out)")
    if edges.input is None:
        raise UnsupportedError("float input needs a quantized input, and quantization.json gives the input none "
                               "(the model takes integers)")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    initializers = {t.name for t in g.initializer}
    [data] = [vi for vi in g.input if vi.name not in initializers]
    first = _input(g, data, edges.input)
    last = [n for vi, e in zip(g.output, edges.outputs) if e is not None for n in _output(g, vi, e)]
    nodes = first + list(g.node) + last
    del g.node[:]
    g.node.extend(nodes)
    props = {p.key: p.value for p in out.metadata_props if p.key != QUANTIZATION} | {
        FLOAT_IO: edges.to_bytes().decode()}
    del out.metadata_props[:]
    helper.set_model_props(out, props)
    out.doc_string += ABOUT
    return out


ABOUT = (" With float edges: the input takes float32, quantized in the graph (QuantizeLinear); the outputs with an "
         "edge give float32 (DequantizeLinear); metadata cvm.float_io lists them.")


def without_float_edges(model: onnx.ModelProto) -> onnx.ModelProto:
    """The integer export that ``with_float_edges`` made ``model`` from (its edges in metadata
    ``cvm.quantization``); ``FormatError`` unless putting the edges of ``cvm.float_io`` back gives ``model``."""
    props = {p.key: p.value for p in model.metadata_props}
    where = f"metadata {FLOAT_IO}"
    edges = parse_edges(props[FLOAT_IO], where, len(model.graph.output))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inner = {vi.name: vi for vi in g.value_info if vi.name.endswith(":quantized")}
    ends = [vi for vi in g.input if f"{vi.name}:quantized" in inner][:1] + [
        vi for vi, e in zip(g.output, edges.outputs) if e is not None]
    if edges.input is None or not ends or any(f"{vi.name}:quantized" not in inner for vi in ends):
        raise FormatError("the graph's float edges are not the ones it names", where)
    added = {f"{vi.name}:{k}" for vi in ends for k in ("scale", "zero_point", "quantize", "cast", "centre",
                                                          "dequantize")}
    kept = [n for n in g.node if n.name not in added]
    del g.node[:]
    g.node.extend(kept)
    kept_inits = [t for t in g.initializer if t.name not in added]
    del g.initializer[:]
    g.initializer.extend(kept_inits)
    for vi in ends:
        vi.CopyFrom(inner.pop(f"{vi.name}:quantized"))
        vi.name = vi.name.rpartition(":")[0]
        _rename(g, f"{vi.name}:quantized", vi.name)
    kept_infos = [vi for vi in g.value_info if vi.name not in {f"{e.name}:quantized" for e in ends}]
    del g.value_info[:]
    g.value_info.extend(kept_infos)
    del out.metadata_props[:]
    helper.set_model_props(out, {k: v for k, v in props.items() if k != FLOAT_IO} | {QUANTIZATION: props[FLOAT_IO]})
    out.doc_string = out.doc_string.removesuffix(ABOUT)
    try:
        again = with_float_edges(out, edges)
    except UnsupportedError as e:
        raise FormatError(f"the edges it names cannot be the graph's: {e}", where) from None
    if again.SerializeToString(deterministic=True) != model.SerializeToString(deterministic=True):
        raise FormatError("the graph's float edges are not the ones it names (QuantizeLinear of the input, "
                          "DequantizeLinear of the outputs, as convert --float-io writes them)", where)
    return out
