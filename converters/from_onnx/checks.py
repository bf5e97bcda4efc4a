"""Safety checks on an ONNX model before anything of it is run or allocated (every problem at once).

* tensors (initializers, Constant values): dims >= 0, at most 2^30 elements, data of exactly the declared size;
  external data must lie inside the model's directory, within its file;
* the graph: every input of a node defined (graph input, initializer or another node's output), each tensor
  produced once, no cycle;
* declared shapes (inputs, outputs, value_info) of at most 2^30 elements, each dim in [0, 2^24];
* every string UTF-8; standard nodes with the inputs and outputs their op's schema allows (required ones given);
* tensors of a type that can be read (bool, integer, float).

``checked_order`` returns the nodes in a topological order or raises ``FormatError`` listing the problems.
``tensor_array`` reads a checked tensor, external data included.
"""
from __future__ import annotations

import heapq
import math
import os
from collections.abc import Iterator, MutableSequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from cvm_onnx.errors import FormatError, Problem

MAX_ELEMENTS = 1 << 30
MAX_DIM = 1 << 24
ITEMSIZE = {
    TensorProto.BOOL: 1, TensorProto.INT8: 1, TensorProto.UINT8: 1, TensorProto.INT16: 2, TensorProto.UINT16: 2,
    TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2, TensorProto.INT32: 4, TensorProto.UINT32: 4,
    TensorProto.FLOAT: 4, TensorProto.INT64: 8, TensorProto.UINT64: 8, TensorProto.DOUBLE: 8,
}
TYPED_FIELD = {
    **dict.fromkeys([TensorProto.BOOL, TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16,
                     TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.INT32], "int32_data"),
    TensorProto.INT64: "int64_data", TensorProto.UINT32: "uint64_data", TensorProto.UINT64: "uint64_data",
    TensorProto.FLOAT: "float_data", TensorProto.DOUBLE: "double_data",
}


def node_label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"node {index} ({node.op_type})"


def _external(t: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def external_path(t: onnx.TensorProto, base_dir: Path | None) -> tuple[Path | None, str | None]:
    """The file holding an external tensor, or why it may not be read."""
    if base_dir is None:
        return None, "has external data, but no model directory was given to read it from"
    location = _external(t).get("location", "")
    if not location or os.path.isabs(location) or Path(location).drive:
        return None, f"external data location {location!r} must be a relative path inside the model's directory"
    root = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, path]) != root:
        return None, f"external data location {location!r} leaves the model's directory"
    if not os.path.isfile(path):
        return None, f"external data file {location!r} does not exist"
    return Path(path), None


def tensor_problem(t: onnx.TensorProto, base_dir: Path | None) -> str | None:
    """Why a tensor cannot be read safely, or None."""
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        return f"has a negative dimension in {dims}"
    size = math.prod(dims)
    if size > MAX_ELEMENTS:
        return f"declares {size} elements (more than 2^30): refused before allocating it"
    item = ITEMSIZE.get(t.data_type)
    if item is None:
        name = TensorProto.DataType.Name(t.data_type) if t.data_type in TensorProto.DataType.values() else t.data_type
        return f"has data type {name}, which cannot be read (bool, integer and float types can)"
    if t.data_location == TensorProto.EXTERNAL:
        path, err = external_path(t, base_dir)
        if err:
            return err
        info = _external(t)
        try:
            offset = int(info.get("offset", "0"))
            length = int(info["length"]) if "length" in info else path.stat().st_size - offset
        except ValueError:
            return f"external data offset/length are not integers: {info}"
        if offset < 0 or length < 0 or offset + length > path.stat().st_size:
            return f"external data [{offset}, {offset + length}) lies outside its file of {path.stat().st_size} bytes"
        if length != size * item:
            return f"external data has {length} bytes, but shape {dims} of {item}-byte values needs {size * item}"
        return None
    if t.HasField("raw_data"):
        if len(t.raw_data) != size * item:
            return f"raw data has {len(t.raw_data)} bytes, but shape {dims} of {item}-byte values needs {size * item}"
        return None
    count = len(getattr(t, TYPED_FIELD[t.data_type]))
    if count != size:
        return f"holds {count} values, but its shape {dims} declares {size}"
    return None


def tensor_array(t: onnx.TensorProto, base_dir: Path | None) -> np.ndarray:
    """The value of a tensor that passed ``tensor_problem``."""
    if t.data_location != TensorProto.EXTERNAL:
        return numpy_helper.to_array(t)
    path, _ = external_path(t, base_dir)
    info = _external(t)
    offset = int(info.get("offset", "0"))
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")
    count = math.prod(t.dims)
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(count * dtype.itemsize)
    return np.frombuffer(raw, dtype).astype(dtype.newbyteorder("=")).reshape(tuple(t.dims))


def _shape_problem(vi: onnx.ValueInfoProto) -> str | None:
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = [d.dim_value for d in vi.type.tensor_type.shape.dim if d.HasField("dim_value")]
    if any(not 0 <= d <= MAX_DIM for d in dims) or math.prod(dims) > MAX_ELEMENTS:
        return f"declares shape {dims}: dims must lie in [0, 2^24], at most 2^30 elements"
    return None


def _not_utf8(message: Any, path: str) -> Iterator[str]:
    """Where ``message`` (recursively) has a string that is not UTF-8 (protobuf returns those as bytes)."""
    for fd in message.DESCRIPTOR.fields:
        if fd.type not in (fd.TYPE_STRING, fd.TYPE_MESSAGE):
            continue  # (bytes fields are not read: no copy of tensor data)
        value = getattr(message, fd.name)
        repeated = isinstance(value, MutableSequence)
        if not repeated and fd.type == fd.TYPE_MESSAGE and not message.HasField(fd.name):
            continue
        for k, item in enumerate(value if repeated else [value]):
            where = f"{path}.{fd.name}" + (f"[{k}]" if repeated else "")
            if isinstance(item, bytes):
                yield where
            elif fd.type == fd.TYPE_MESSAGE:
                yield from _not_utf8(item, where)


def _count(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"at least {lo}" if hi >= (1 << 31) - 1 else f"{lo} to {hi}"


def _arity_problem(node: onnx.NodeProto, opset: int | None) -> str | None:
    """Why a standard node has inputs or outputs its op's schema does not allow, or None (other domains and
    unknown ops are left to the import rules)."""
    if node.domain not in ("", "ai.onnx") or opset is None or not onnx.defs.has(node.op_type, opset, ""):
        return None
    schema = onnx.defs.get_schema(node.op_type, opset, "")
    for verb, what, n, lo, hi in (("takes", "input", len(node.input), schema.min_input, schema.max_input),
                                  ("gives", "output", len(node.output), schema.min_output, schema.max_output)):
        if not lo <= n <= hi:
            return f"{node.op_type} {verb} {_count(lo, hi)} {what}(s), has {n}"
    for k, (name, formal) in enumerate(zip(node.input, schema.inputs)):
        if not name and formal.option == onnx.defs.OpSchema.FormalParameterOption.Single:
            return f"{node.op_type}: input {k} ({formal.name}) is required, but empty"
    return None


def _tensors(graph: onnx.GraphProto):
    """(where, tensor) for every initializer and every tensor-valued Constant attribute."""
    for t in graph.initializer:
        yield f"initializer {t.name!r}", t
    for i, n in enumerate(graph.node):
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield node_label(n, i), a.t


def checked_order(model: onnx.ModelProto, base_dir: Path | None) -> list[int]:
    """Indices of the graph's nodes in a topological order, after every safety check; else ``FormatError``."""
    if bad := list(_not_utf8(model, "model")):
        raise FormatError([Problem(where, "string is not UTF-8") for where in bad])
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is not None:  # onnx.defs takes a C int: clamp a version beyond any schema's
        opset = max(0, min(opset, onnx.defs.onnx_opset_version()))
    problems = [Problem(where, f"tensor {rule}") for where, t in _tensors(graph)
                if (rule := tensor_problem(t, base_dir)) is not None]
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if (rule := _shape_problem(vi)) is not None:
            problems.append(Problem(vi.name, rule))
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {s.values.name for s in graph.sparse_initializer}
    producer: dict[str, int] = {}
    for i, n in enumerate(graph.node):
        if (rule := _arity_problem(n, opset)) is not None:
            problems.append(Problem(node_label(n, i), rule))
        for o in n.output:
            if o and (o in producer or o in defined):
                problems.append(Problem(node_label(n, i), f"output {o!r} is already defined elsewhere"))
            elif o:
                producer[o] = i
    users: list[list[int]] = [[] for _ in graph.node]
    waiting = [0] * len(graph.node)
    for i, n in enumerate(graph.node):
        for name in dict.fromkeys(x for x in n.input if x):
            if name in producer:
                users[producer[name]].append(i)
                waiting[i] += 1
            elif name not in defined:
                problems.append(Problem(node_label(n, i), f"input {name!r} is not defined by any node, graph "
                                                           "input or initializer"))
    for o in graph.output:
        if o.name not in producer and o.name not in defined:
            problems.append(Problem(o.name, "graph output is not defined by any node, input or initializer"))
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in users[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < len(graph.node):
        stuck = [node_label(graph.node[i], i) for i in range(len(graph.node)) if waiting[i] > 0]
        problems.append(Problem("graph", f"the nodes form a cycle (or depend on one): {', '.join(stuck[:8])}"
                                         + (" ..." if len(stuck) > 8 else "")))
    if problems:
        raise FormatError(problems)
    return order
