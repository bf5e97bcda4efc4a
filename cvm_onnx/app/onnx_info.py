"""What an ONNX model holds and needs, for ``cvm-onnx info model.onnx``: its opsets, the native ops it uses and
the library to register for them, its inputs and outputs (type, shape, CVM precision) and where it came from;
and a CVM model's float edges. onnx is imported where an ONNX model is described (``info`` of a CVM model
needs none of it)."""
from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from cvm_onnx.core.constants import (
    CONVERTED_FROM,
    FLOAT_IO,
    OPTIMIZED,
    PRECISION,
    QUANTIZATION,
    SOURCE_VERSION,
    SYMBOL,
    precision_bound,
    precision_of,
)
from cvm_onnx.core.errors import FormatError
from cvm_onnx.core.format.edges import Edge, Edges, parse_edges

if TYPE_CHECKING:
    import onnx


def _type(vi: onnx.ValueInfoProto) -> str:
    from onnx import TensorProto

    t = vi.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in t.shape.dim)
    known = t.elem_type in TensorProto.DataType.values()
    return f"{TensorProto.DataType.Name(t.elem_type).lower() if known else f'type {t.elem_type}'} {dims}"


def _precisions(model: onnx.ModelProto) -> dict[str, str]:
    """The CVM precision declared for each tensor (metadata ``cvm.precision``; an input's is on its clamped
    value ``<input>:clamped``, or on the input itself where a serving form merged the clamp away)."""
    from onnx import TensorProto

    declared = {vi.name: p.value for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]
                for p in vi.metadata_props if p.key == PRECISION}
    return declared | {vi.name: declared[f"{vi.name}:clamped"] for vi in model.graph.input
                       if f"{vi.name}:clamped" in declared and vi.type.tensor_type.elem_type != TensorProto.FLOAT}


def _scale(edge: Edge) -> str:
    values = edge.scale.reshape(-1)
    if values.size == 1:
        return f"scale {str(values[0])}, zero point {int(edge.zero_point.reshape(-1)[0])}"
    return f"per channel: {values.size} scales and zero points"


def edge_lines(edges: Edges, where: str, integers: str) -> list[str]:
    """The lines of ``cvm-onnx info`` for a quantized import's float edges (``where`` they are kept; ``integers``:
    what takes the integers instead)."""
    if edges.inputs:
        offsets = list(itertools.accumulate([s.size for s in edges.inputs], initial=0))
        lines = [f"packed inputs ({where}): data holds {len(edges.inputs)} inputs, flattened and concatenated; "
                 "`cvm-onnx run --input X.npz` takes one array per name"]
        lines += [f"  data[{a}:{b}] {s.name}: {s.shape}, " + (f"float, quantized to {s.edge.type} ({_scale(s.edge)})"
                                                          if s.edge is not None else f"{s.type}, values in "
                                                          f"{list(s.limits())}")
                  for s, a, b in zip(edges.inputs, offsets, offsets[1:])]
        lines += [f"  output {e.name}: {e.type} dequantized to float32 ({_scale(e)})" for e in edges.outputs
                  if e is not None]
        return lines
    lines = [f"float edges ({where}): `cvm-onnx run` takes float input and gives float32 outputs; {integers}"]
    if edges.input is not None:
        lines.append(f"  input  {edges.input.name}: float, quantized to {edges.input.type} ({_scale(edges.input)})")
    for e in edges.outputs:
        if e is not None:
            lines.append(f"  output {e.name}: {e.type} dequantized to float32 ({_scale(e)})")
    return lines


def describe(model: onnx.ModelProto) -> list[str]:
    """The lines of ``cvm-onnx info`` for an ONNX model."""
    from cvm_onnx import native
    from cvm_onnx.serving.routes import route_lines

    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    producer = " ".join(x for x in (model.producer_name, model.producer_version) if x) or "unknown"
    lines = [f"ONNX model: IR version {model.ir_version}, opsets {opsets}; producer {producer}"]
    precisions = _precisions(model)
    inits = {t.name for t in model.graph.initializer}
    for kind, values in (("input ", [vi for vi in model.graph.input if vi.name not in inits]),
                         ("output", model.graph.output)):
        for vi in values:
            p = precisions.get(vi.name)
            bound = "" if p is None else f", precision {p} (|x| <= {precision_bound(precision_of(p))})" \
                if precision_of(p) else f", precision {p!r} (not a precision in [1, 32])"
            lines.append(f"{kind} {vi.name}: {_type(vi)}{bound}")
    props = {p.key: p.value for p in model.metadata_props}
    if props.get(CONVERTED_FROM) == "CVM":
        form = "the serving form (--optimize; not importable back)" if OPTIMIZED in props else (
            "its source symbol kept: converts back byte for byte"
            if SYMBOL in props else "converts back to the same graph")
        lines.append(f"converted from CVM ({props.get(SOURCE_VERSION, 'version unknown')}) by {producer}; {form}")
    if QUANTIZATION in props:
        try:
            edges = parse_edges(props[QUANTIZATION], f"metadata {QUANTIZATION}", len(model.graph.output))
        except FormatError as e:
            lines.append(f"float edges: malformed: {e}")
        else:
            lines += edge_lines(edges, f"metadata {QUANTIZATION}", "onnxruntime alone takes and gives the integers")
    if FLOAT_IO in props:
        lines.append(f"float edges in the graph (metadata {FLOAT_IO}): float32 input quantized by QuantizeLinear, "
                     "float32 outputs by DequantizeLinear, for any onnxruntime or Triton client")
    lines.append(f"nodes: {len(model.graph.node)} in the graph, {len(model.functions)} functions, "
                 f"{len(model.graph.initializer)} initializers")
    lines += route_lines(model)
    ops = native.ops_used(model)
    if not ops:
        lines.append("native ops: none (plain onnxruntime runs it, no custom-op library needed)")
        return lines
    lines.append(f"native ops ({native.DOMAIN}): {', '.join(ops)}: onnxruntime needs the custom-op library "
                 f"{native.LIBRARY}: SessionOptions().register_custom_ops_library(path)")
    lines.append(f"  {native.status()}")
    return lines
