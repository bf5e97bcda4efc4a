"""An ONNX model read safely: every string UTF-8; tensors' size, type and data checked before anything is
allocated or read; external data only from a file inside the model's directory.

* ``tensor_problem``: dims >= 0, at most 2^30 elements, a readable type (bool, integer, float), data of exactly
  the declared size; external data at a relative location (no NUL byte, no absolute path) that stays inside the
  model's directory once symlinks are resolved, at an offset and length within its file;
* ``tensor_array`` reads a tensor that passed it;
* ``not_utf8`` finds strings that are not UTF-8 (protobuf hands them over as bytes);
* ``call_problems`` finds calls of model-local functions without their formal inputs (onnxruntime crashes);
* ``readable`` is a model ready for onnxruntime: its strings UTF-8, its function calls well formed, every
  external tensor loaded into it (onnxruntime would look for the files in the working directory of a model
  given as bytes).

The importer (``converters.from_onnx.checks``) and the runtime use these same checks.
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterator, MutableSequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, numpy_helper

from ..errors import FormatError, Problem

MAX_ELEMENTS = 1 << 30
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


def _external(t: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def external_path(t: onnx.TensorProto, base_dir: Path | None) -> tuple[Path | None, str | None]:
    """The file holding an external tensor, or why it may not be read."""
    if base_dir is None:
        return None, "has external data, but no model directory was given to read it from"
    location = _external(t).get("location", "")
    if "\x00" in location:
        return None, f"external data location {location!r} contains a NUL byte"
    if not location or os.path.isabs(location) or Path(location).drive:
        return None, f"external data location {location!r} must be a relative path inside the model's directory"
    root = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, path]) != root:
        return None, f"external data location {location!r} leaves the model's directory"
    if not os.path.isfile(path):
        return None, f"external data file {location!r} does not exist"
    return Path(path), None


def not_utf8(message: Any, path: str) -> Iterator[str]:
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
                yield from not_utf8(item, where)


def unsupported_type(data_type: int) -> str | None:
    """Why a tensor of a valid ONNX type that is not read here (int4, uint4, float8, string, complex ...) is
    unsupported, or None for a type that is read or is no ONNX type (UNDEFINED, unknown numbers)."""
    if data_type in ITEMSIZE or data_type == TensorProto.UNDEFINED or data_type not in TensorProto.DataType.values():
        return None
    return (f"has data type {TensorProto.DataType.Name(data_type)}, which has no CVM form (bool, 8- to 64-bit "
            "integer and float16/32/64 tensors do: quantize weights to int8 or uint8)")


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
        if unsupported_type(t.data_type):
            return unsupported_type(t.data_type)
        return f"has data type {t.data_type}, which is no ONNX tensor type"
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


def _external_bytes(t: onnx.TensorProto, base_dir: Path | None) -> bytes:
    """The data of an external tensor that passed ``tensor_problem``: its raw bytes (little-endian)."""
    path, _ = external_path(t, base_dir)
    offset = int(_external(t).get("offset", "0"))
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(math.prod(t.dims) * ITEMSIZE[t.data_type])


def tensor_array(t: onnx.TensorProto, base_dir: Path | None) -> np.ndarray:
    """The value of a tensor that passed ``tensor_problem``."""
    if t.data_location != TensorProto.EXTERNAL:
        return numpy_helper.to_array(t)
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")
    raw = _external_bytes(t, base_dir)
    return np.frombuffer(raw, dtype).astype(dtype.newbyteorder("=")).reshape(tuple(t.dims))


def _graph_tensors(graph: onnx.GraphProto, where: str) -> Iterator[tuple[str, onnx.TensorProto]]:
    for t in graph.initializer:
        yield f"{where}initializer {t.name!r}", t
    for s in graph.sparse_initializer:
        yield f"{where}sparse initializer {s.values.name!r}", s.values
        yield f"{where}sparse initializer {s.values.name!r}", s.indices
    yield from _node_tensors(graph.node, where)


def _node_tensors(nodes, where: str) -> Iterator[tuple[str, onnx.TensorProto]]:
    for i, n in enumerate(nodes):
        label = f"{where}{n.name or f'node {i} ({n.op_type})'}"
        for a in n.attribute:
            tensors = [a.t] if a.type == AttributeProto.TENSOR else list(a.tensors)
            tensors += [a.sparse_tensor.values, a.sparse_tensor.indices] if a.HasField("sparse_tensor") else []
            for sp in a.sparse_tensors:
                tensors += [sp.values, sp.indices]
            yield from ((label, t) for t in tensors)
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _graph_tensors(g, f"{label}/{a.name}: ")


def all_tensors(model: onnx.ModelProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    """(where, tensor) for every tensor of a model: initializers, attributes, subgraphs' and functions'."""
    yield from _graph_tensors(model.graph, "")
    for f in model.functions:
        yield from _node_tensors(f.node, f"function {f.name}: ")


def call_problems(model: onnx.ModelProto) -> list[Problem]:
    """Nodes (of the graph or of a function) calling a model-local function with other inputs than its formal
    ones (each given, none '') or with more outputs than it has: onnxruntime loads such a call and dies of
    SIGSEGV running the function's body without the input."""
    functions = {(f.domain, f.name, f.overload): f for f in model.functions}
    out = []
    for nodes, where in [(model.graph.node, ""), *((f.node, f"function {f.name}: ") for f in model.functions)]:
        for i, n in enumerate(nodes):
            f = functions.get((n.domain, n.op_type, n.overload))
            if f is not None and (len(n.input) != len(f.input) or "" in n.input or len(n.output) > len(f.output)):
                out.append(Problem(f"{where}{n.name or f'node {i} ({n.op_type})'}",
                                   f"calls function {f.domain}.{f.name} with inputs {list(n.input)} and "
                                   f"{len(n.output)} output(s); it takes {len(f.input)} inputs, gives "
                                   f"{len(f.output)} output(s)"))
    return out


#: Attributes of standard ops whose range onnxruntime does not check before it uses them, and the least value it
#: takes safely (below it, it dies of SIGSEGV creating the session).
UNCHECKED_ATTRIBUTES = {("GatherND", "batch_dims"): 0}


def unsafe_nodes(model: onnx.ModelProto) -> list[Problem]:
    """Nodes of the standard domain (in the graph, its subgraphs and the model's functions) that onnxruntime loads
    and dies of SIGSEGV on: '' at an input their op's schema does not mark optional (Max, Min, when run), an
    attribute of UNCHECKED_ATTRIBUTES below its least value (GatherND's batch_dims < 0, at session creation)."""
    def walk(nodes, opsets: dict[str, int], where: str):
        for i, n in enumerate(nodes):
            label = f"{where}{n.name or f'node {i} ({n.op_type})'}"
            for a in n.attribute if n.domain in ("", "ai.onnx") else ():
                least = UNCHECKED_ATTRIBUTES.get((n.op_type, a.name))
                if least is not None and a.type == AttributeProto.INT and a.i < least:
                    yield Problem(label, f"{n.op_type}: attribute {a.name}={a.i} must be >= {least}")
            if n.domain in ("", "ai.onnx") and "" in n.input:
                try:
                    schema = onnx.defs.get_schema(n.op_type, opsets.get("", 1), "")
                except onnx.defs.SchemaError:
                    schema = None
                formals = schema.inputs if schema is not None else []
                for k, name in enumerate(n.input):
                    if not name and formals and formals[min(k, len(formals) - 1)].option != \
                            onnx.defs.OpSchema.FormalParameterOption.Optional:
                        yield Problem(label, f"{n.op_type}: input {k} ({formals[min(k, len(formals) - 1)].name}) "
                                             "is required, but empty")
            for a in n.attribute:
                for g in [a.g] if a.type == AttributeProto.GRAPH else a.graphs:
                    yield from walk(g.node, opsets, f"{label}/{a.name}: ")

    def opsets(imports) -> dict[str, int]:
        return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in imports}

    out = list(walk(model.graph.node, opsets(model.opset_import), ""))
    for f in model.functions:
        out += walk(f.node, {**opsets(model.opset_import), **opsets(f.opset_import)}, f"function {f.name}: ")
    return out


def readable(model: onnx.ModelProto, base_dir: str | os.PathLike | None) -> onnx.ModelProto:
    """``model`` with every external tensor's data read into it (in place) from its file inside ``base_dir`` (the
    model's directory; None: there is none), each under ``tensor_problem``'s checks, after checking that every
    string is UTF-8 and every call of a model-local function well formed (``call_problems``); else
    ``FormatError`` listing every problem."""
    if bad := list(not_utf8(model, "model")):
        raise FormatError([Problem(where, "string is not UTF-8") for where in bad])
    if problems := call_problems(model):
        raise FormatError(problems)
    base = None if base_dir is None else Path(base_dir)
    external = [(w, t) for w, t in all_tensors(model) if t.data_location == TensorProto.EXTERNAL]
    if problems := [Problem(w, f"tensor {rule}") for w, t in external if (rule := tensor_problem(t, base))]:
        raise FormatError(problems)
    for _, t in external:
        t.raw_data = _external_bytes(t, base)
        del t.external_data[:]
        t.data_location = TensorProto.DEFAULT
    return model
