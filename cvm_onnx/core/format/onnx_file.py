"""An ONNX model as file bytes, written and read in pieces so the weights are never copied whole a second time.

``SerializeToString`` builds the whole file in memory next to the model (twice the weights at the peak). Here
the model without its initializers is serialized once, and each initializer follows inside the ``graph``
field (whose length is computed first from ``ByteSize``): its small fields serialized, then its ``raw_data``
written as it is. Protobuf parsers take the fields of a message in any order, so the result is the same
message; identical models give identical bytes. ``read_onnx`` parses a file the same way round: the model without
its initializers from the file's other bytes, then each initializer from its own bytes (``onnx.load`` holds the
file's bytes beside the model parsed from them).

Versions: every model cvm-onnx writes or builds (exports, quantize's output, the shipped and the tests' models)
carries the lowest IR version its opsets need (``ir_version``), never the installed onnx's newest (onnx 1.23
stamps IR 14, which onnxruntime 1.31 cannot load); ``onnx_model`` builds one so.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import onnx
from google.protobuf.message import Message
from onnx import helper

from ..constants import OPSET
from ..errors import FormatError
from .model_dir import replace_file

GRAPH = 7  # ModelProto.graph
INITIALIZER = 5  # GraphProto.initializer
RAW_DATA = 9  # TensorProto.raw_data


def ir_version(opsets) -> int:
    """The IR version of a model importing ``opsets`` (OperatorSetIdProto): the lowest they need
    (``onnx.helper.find_min_ir_version_for``; domains onnx does not know, cvm-onnx's own, need none), so every
    onnx and onnxruntime that reads the opsets reads the model."""
    return helper.find_min_ir_version_for(list(opsets), ignore_unknown=True)


def dims(vi: onnx.ValueInfoProto) -> tuple[int | None, ...] | None:
    """A value's declared dims, each None where unknown (a dim_param, no value, or a value < 0, which onnxruntime
    reads as -1); None where it declares no tensor shape."""
    t = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not t.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None for d in t.shape.dim)


def static_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    """A value's shape where it declares every dim and each is > 0 (a shape a CVM tensor can have), else None."""
    d = dims(vi)
    return d if d is not None and all(d) else None


def onnx_model(graph: onnx.GraphProto, opset: int = OPSET, domains: dict[str, int] | None = None,
               **kwargs) -> onnx.ModelProto:
    """``onnx.helper.make_model`` importing ai.onnx ``opset`` (cvm-onnx's, ``OPSET``, by default) and the other
    ``domains`` (name: version), stamped with the IR version they need (``ir_version``)."""
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir_version(opsets), **kwargs)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _key(number: int, length: int) -> bytes:
    """The key and length of a length-delimited field."""
    return _varint(number << 3 | 2) + _varint(length)


def _without(message: Message, field: str) -> Message:
    """A copy of ``message`` (ONNX's messages are proto2: presence is HasField) without ``field``, which is not
    even read: the other fields are copied, and they are small."""
    out = type(message)()
    for fd in message.DESCRIPTOR.fields:
        if fd.name == field:
            continue
        value = getattr(message, fd.name)
        if hasattr(value, "extend"):  # a repeated field
            getattr(out, fd.name).extend(value)
        elif not message.HasField(fd.name):
            continue
        elif isinstance(value, Message):
            getattr(out, fd.name).CopyFrom(value)
        else:
            setattr(out, fd.name, value)
    return out


def onnx_pieces(model: onnx.ModelProto) -> Iterator[bytes]:
    """The serialized ``model``: its fields but the graph, then the graph with its initializers one by one."""
    graph = _without(model.graph, "initializer").SerializeToString()
    inits = model.graph.initializer
    heads = [_without(t, "raw_data").SerializeToString() for t in inits]
    raw_keys = [_key(RAW_DATA, n) if (n := len(t.raw_data)) else b"" for t in inits]  # one tensor's copy at a time
    sizes = [len(h) + len(k) + len(t.raw_data) for h, k, t in zip(heads, raw_keys, inits)]
    length = len(graph) + sum(len(_key(INITIALIZER, s)) + s for s in sizes)
    yield _without(model, "graph").SerializeToString() + _key(GRAPH, length) + graph
    for t, head, raw_key, size in zip(inits, heads, raw_keys, sizes):
        yield _key(INITIALIZER, size) + head + raw_key
        yield t.raw_data


def write_onnx(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Write ``model`` atomically (a temp file in the same directory, then a rename), without a second copy of its
    weights in memory (``onnx_pieces``); ``FormatError`` on failure."""
    try:
        replace_file(Path(path), onnx_pieces(model))
    except OSError as e:
        raise FormatError(f"cannot write the model: {e.strerror or e}", os.fspath(path)) from None



def _read_varint(f, end: int) -> int:
    n = shift = 0
    while shift < 64 and f.tell() < end:
        b = f.read(1)[0]
        n |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return n
    raise ValueError("a varint runs past its message")


def _fields(f, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """The fields of the message at bytes [start, end) of the file ``f``: (number, where its key starts, where its
    value starts, where it ends), the value's start None unless it is length-delimited."""
    out = []
    f.seek(start)
    while (at := f.tell()) < end:
        key = _read_varint(f, end)
        kind, value = key & 7, None
        if kind == 0:
            _read_varint(f, end)
        elif kind in (1, 5):
            f.seek(8 if kind == 1 else 4, os.SEEK_CUR)
        elif kind == 2:
            length = _read_varint(f, end)
            value = f.tell()
            f.seek(value + length)
        else:
            raise ValueError(f"wire type {kind}")
        if f.tell() > end:
            raise ValueError("a field runs past its message")
        out.append((key >> 3, at, value, f.tell()))
    return out


def _spans(f, spans: list[tuple[int, int]]) -> bytes:
    """The bytes of the file ``f`` at ``spans`` (in order), adjacent ones read together."""
    out, merged = bytearray(), []
    for a, b in spans:
        if merged and merged[-1][1] == a:
            merged[-1][1] = b
        else:
            merged.append([a, b])
    for a, b in merged:
        f.seek(a)
        out += f.read(b - a)
    return bytes(out)


def read_onnx(path: str | os.PathLike) -> onnx.ModelProto:
    """The model in the file ``path`` as ``onnx.load(path, load_external_data=False)`` parses it, with no more than
    one initializer's bytes held beside it: the file's fields but the graph's initializers parsed as one message,
    then each initializer parsed from its own bytes and appended in the file's order (a message parses the same
    from its fields in pieces). A file not taken apart so (one graph field, every field within its message, each
    piece parsed) is parsed whole, as ``onnx.load`` parses it, with its errors."""
    with open(path, "rb") as f:
        try:
            top = _fields(f, 0, os.fstat(f.fileno()).st_size)
            graphs = [x for x in top if x[0] == GRAPH]
            if len(graphs) != 1 or graphs[0][2] is None:
                raise ValueError("not one graph field")
            _, _, start, end = graphs[0]
            inner = _fields(f, start, end)
            graph = _spans(f, [(at, e) for n, at, v, e in inner if n != INITIALIZER or v is None])
            model = onnx.ModelProto.FromString(
                _spans(f, [(at, e) for n, at, _, e in top if n != GRAPH]) + _key(GRAPH, len(graph)) + graph)
            for _, _, v, e in (x for x in inner if x[0] == INITIALIZER and x[2] is not None):
                f.seek(v)
                model.graph.initializer.add().ParseFromString(f.read(e - v))
            return model
        except Exception:  # noqa: BLE001  (then parsed whole: onnx.load's own errors, or its model)
            pass
    return onnx.load(os.fspath(path), load_external_data=False)
