"""The float edges of a CVM model imported from a quantized ONNX model: ``quantization.json`` next to ``symbol``
and ``params``. It holds the scale and zero point of the input (how the source model's first QuantizeLinear
turns float data into the model's integer input) and of each output (how its last DequantizeLinear turns the
model's integer output into floats). A model directory without it is a plain CVM model. See docs/format.md.

    {"format": "cvm-onnx quantization", "version": 1,
     "input": {"name": "data", "type": "uint8", "scale": 0.0039215689, "zero_point": 0},
     "outputs": [{"name": "y", "type": "int8", "scale": [0.1, 0.2], "zero_point": [0, 0]}, null]}

A scale is a float32 written as the shortest decimal that reads back to it, a scale or zero point a number or a
nested list broadcast over the tensor (per channel); ``null`` is an output of plain integers.

A model of several inputs packed into its one ``data`` (version 2) lists them, in the order they are laid out in
``data`` (each flattened, row-major), with ``"input": null``:

    "inputs": [{"name": "ids", "shape": [1, 8], "type": "int64", "precision": 15, "edge": null},
               {"name": "mask", "shape": [1, 8], "type": "uint8", "precision": 9, "edge": {...}}]

``type`` is the ONNX input's integer type (a float input's: its edge's), ``precision`` the bits of its values in
``data``; a value must lie within both (``Slot.limits``). ``edge``: a float input's quantization (null: integers).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from ..constants import precision_bound
from ..errors import FormatError, RuntimeFailure
from ..graph import Graph

FILE = "quantization.json"
FORMAT = "cvm-onnx quantization"
VERSION = 1
PACKED_VERSION = 2  # the version of a file listing packed inputs (``inputs``)
INTEGER_TYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")
TYPES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535)}


@dataclass(frozen=True)
class Edge:
    """One quantized tensor at the model's edge: its integer type, scale (float32) and zero point."""

    name: str
    type: str
    scale: np.ndarray
    zero_point: np.ndarray

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """QuantizeLinear in float32: saturate(round_half_even(x / scale) + zero_point), as int32."""
        lo, hi = TYPES[self.type]
        with np.errstate(over="ignore"):  # beyond float32: inf, saturated below
            q = np.rint(np.asarray(x, np.float32) / self.scale) + self.zero_point
        return np.clip(q, lo, hi).astype(np.int32)

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        """DequantizeLinear in float32: (q - zero_point) * scale."""
        return (np.asarray(q, np.int64) - self.zero_point).astype(np.float32) * self.scale

    def to_json(self) -> dict:
        return {"name": self.name, "type": self.type, "scale": self.scale.astype(np.float64).tolist(),
                "zero_point": self.zero_point.astype(np.int64).tolist()}


@dataclass(frozen=True)
class Slot:
    """One input of a model of several packed into ``data``: its name, shape (one sample), integer type, precision
    in ``data``, and a float input's edge (None: the input takes integers)."""

    name: str
    shape: tuple[int, ...]
    type: str
    precision: int
    edge: Edge | None = None

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def limits(self) -> tuple[int, int]:
        """The values the input may hold in ``data``: its type's range within +-(2^(precision-1)-1)."""
        lo, hi = (0, 1) if self.type == "bool" else (int(np.iinfo(self.type).min), int(np.iinfo(self.type).max))
        b = precision_bound(self.precision)
        return max(lo, -b), min(hi, b)

    def integers(self, x: np.ndarray) -> np.ndarray:
        """``x`` (this input's values, float for a float input) as the integers ``data`` holds, as int64; values
        past ``limits`` (or not integers, or NaN) refused in one line naming the input."""
        if self.edge is not None:
            if x.dtype.kind != "f":
                raise RuntimeFailure(f"input {self.name!r} takes floats (quantized to {self.edge.type}), got "
                                     f"{x.dtype}")
            if np.isnan(x).any():
                raise RuntimeFailure(f"input {self.name!r}: NaN has no quantized value")
            return self.edge.quantize(x).astype(np.int64)
        if x.dtype.kind not in "iub":
            raise RuntimeFailure(f"input {self.name!r} takes integers ({self.type}), got {x.dtype}")
        lo, hi = self.limits()
        if x.size and (int(x.min()) < lo or int(x.max()) > hi):
            bad = int(x.min()) if int(x.min()) < lo else int(x.max())
            raise RuntimeFailure(f"input {self.name!r} holds {bad}, outside [{lo}, {hi}] ({self.type} within "
                                 f"{self.precision} bits, the range it was imported for)")
        return x.astype(np.int64)

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "type": self.type, "precision": self.precision,
                "edge": None if self.edge is None else self.edge.to_json()}


@dataclass(frozen=True)
class Edges:
    """The input's edge (None: the model takes integers) and one per output (None: integers); for a model of
    several inputs packed into ``data``, each input's ``Slot`` in their order there (``input`` is then None)."""

    input: Edge | None
    outputs: tuple[Edge | None, ...]
    inputs: tuple[Slot, ...] = ()

    def pack(self, named: Mapping[str, np.ndarray] | np.ndarray) -> np.ndarray:
        """The inputs by name (a mapping, or a structured array with one field per input) packed into ``data``:
        each sample's inputs flattened and concatenated in ``inputs``' order, as int32, of shape (total,) for one
        sample, (N, total) for N stacked on a new axis 0 or along an input's leading axis of 1 (every input N). A
        missing or unknown name, a shape that is neither, values an input cannot hold: ``RuntimeFailure`` in one
        line naming the input."""
        if isinstance(named, np.ndarray):
            if named.dtype.names is None:
                raise RuntimeFailure(f"this model packs {len(self.inputs)} inputs into data "
                                     f"({', '.join(s.name for s in self.inputs)}): give one array per input name")
            named = {k: named[k] for k in named.dtype.names}
        names = [s.name for s in self.inputs]
        if missing := [n for n in names if n not in named]:
            raise RuntimeFailure(f"no array for input {missing[0]!r} (the model's inputs: {', '.join(names)})")
        if extra := [n for n in named if n not in names]:
            raise RuntimeFailure(f"{extra[0]!r} is no input of the model (its inputs: {', '.join(names)})")
        arrays = [np.asarray(named[s.name]) for s in self.inputs]
        counts = []  # per input: 0 for one sample, else N
        for s, x in zip(self.inputs, arrays):
            along = s.shape[:1] == (1,) and x.ndim == len(s.shape) and x.shape[1:] == s.shape[1:]  # (N, *S[1:])
            counts.append(0 if x.shape == s.shape else x.shape[0] if (x.shape[1:] == s.shape or along) and
                          x.shape[0] else -1)
            if counts[-1] < 0:
                also = f" or (N, *{s.shape[1:]})" if s.shape[:1] == (1,) else ""
                raise RuntimeFailure(f"input {s.name!r} has shape {x.shape}: it takes {s.shape} (one sample) or "
                                     f"(N, *{s.shape}){also} (N samples)")
        if len(set(counts)) > 1:
            k = next(k for k, n in enumerate(counts) if n != counts[0])
            said = ["one sample" if not n else f"{n} sample{'s' * (n > 1)}" for n in (counts[k], counts[0])]
            raise RuntimeFailure(f"input {self.inputs[k].name!r} has {said[0]}, {self.inputs[0].name!r} {said[1]}: "
                                 "every input takes the same")
        parts = [s.integers(x).reshape((n, s.size) if n else (s.size,))
                 for s, x, n in zip(self.inputs, arrays, counts)]
        return np.concatenate(parts, axis=-1).astype(np.int32)

    def prepare(self, data: np.ndarray) -> np.ndarray:
        """Float input data quantized as the source model's first QuantizeLinear does; integers as they are; for
        packed inputs, a structured array of them packed (``pack``), packed integers as they are."""
        data = np.asarray(data)
        if self.inputs and data.dtype.names is not None:
            return self.pack(data)
        if data.dtype.kind != "f":
            return data
        if self.inputs:
            raise RuntimeFailure("float input data, but this model packs several inputs into data: give one array "
                                 "per input name")
        if self.input is None:
            raise RuntimeFailure("float input data, but this model takes integers (its input is not quantized)")
        if np.isnan(data).any():
            raise RuntimeFailure("NaN in the float input data: it has no quantized value")
        return self.input.quantize(data)

    def finish(self, outputs: list[np.ndarray]) -> list[np.ndarray]:
        """The outputs dequantized to float32 where the source model dequantized them."""
        return [y if e is None else e.dequantize(y) for e, y in zip(self.outputs, outputs)]

    def fit(self, graph: Graph, where: str) -> None:
        """Refuse edges that do not describe ``graph``: one output edge per head; every scale and zero point
        broadcast to its tensor's shape (the input's: ``data``'s; a packed input's are checked on reading); packed
        inputs filling ``data`` exactly, each at most its precision, each where the import's ``NAME:unpacked``
        slice reads it (when there is one)."""
        heads = [graph.type_of(e).shape for e in graph.heads]
        if len(self.outputs) != len(heads):
            raise FormatError(f"{len(self.outputs)} output edges for a model of {len(heads)} outputs", where)
        data = [graph.nodes[i] for i in graph.inputs]
        fits = [(e, shape, f"output {k}") for k, (e, shape) in enumerate(zip(self.outputs, heads))]
        if self.input is not None and len(data) == 1:
            fits.append((self.input, data[0].outputs[0].shape, "input"))
        for e, shape, what in fits:
            if e is not None and not _broadcasts(shape, e.scale.shape, e.zero_point.shape):
                raise FormatError(f"scale {list(e.scale.shape)} and zero point {list(e.zero_point.shape)} do not "
                                  f"broadcast to the tensor's shape {list(shape)}", f"{where}: {what}")
        if not self.inputs:
            return
        total = sum(s.size for s in self.inputs)
        if len(data) != 1 or data[0].outputs[0].shape != (total,):
            got = ", ".join(f"{n.name} {list(n.outputs[0].shape)}" for n in data)
            raise FormatError(f"packed inputs of {total} values in all, but the model's inputs are {got}", where)
        offset, p = 0, data[0].outputs[0].precision
        slices = {n.name: n.attrs for n in graph.nodes if n.op == "strided_slice"}
        for k, s in enumerate(self.inputs):
            if s.precision > p:
                raise FormatError(f"precision {s.precision} is wider than data's {p}", f"{where}: inputs {k}")
            a = slices.get(f"{s.name}:unpacked")
            read = (tuple(a.get("begin", ())), tuple(a.get("end", ()))) if a is not None else None
            if read is not None and read != ((offset,), (offset + s.size,)):
                raise FormatError(f"input {s.name!r} lies at [{offset}, {offset + s.size}) of data by this layout, "
                                  f"but the model reads it at [{', '.join(map(str, read[0]))}, "
                                  f"{', '.join(map(str, read[1]))})", f"{where}: inputs {k}")
            offset += s.size

    def fit_declared(self, data: tuple[int | None, ...] | None, outputs: list[tuple[int | None, ...] | None],
                     where: str) -> None:
        """``fit`` for an ONNX export by the dims its model declares (None: unknown): each output edge's scale and
        zero point broadcast to its output's dims, where all are known; packed inputs filling ``data``'s."""
        for k, (e, d) in enumerate(zip(self.outputs, outputs)):
            if e is not None and d is not None and None not in d and \
                    not _broadcasts(d, e.scale.shape, e.zero_point.shape):
                raise FormatError(f"scale {list(e.scale.shape)} and zero point {list(e.zero_point.shape)} do not "
                                  f"broadcast to the output's shape {list(d)}", f"{where}: output {k}")
        total = sum(s.size for s in self.inputs)
        if self.inputs and data is not None and None not in data and tuple(data) != (total,):
            raise FormatError(f"packed inputs of {total} values in all, but the model's input data is "
                              f"{list(data)}", where)

    def to_bytes(self) -> bytes:
        doc = {"format": FORMAT, "version": PACKED_VERSION if self.inputs else VERSION,
               "input": None if self.input is None else self.input.to_json(),
               "outputs": [None if e is None else e.to_json() for e in self.outputs]}
        if self.inputs:
            doc["inputs"] = [s.to_json() for s in self.inputs]
        return (json.dumps(doc, indent=1) + "\n").encode()


def _broadcasts(shape: tuple[int, ...], *others: tuple[int, ...]) -> bool:
    """Whether ``others`` broadcast to ``shape`` without growing it."""
    try:
        return np.broadcast_shapes(tuple(shape), *others) == tuple(shape)
    except ValueError:
        return False


def _edge(doc, where: str) -> Edge | None:
    if doc is None:
        return None
    if not isinstance(doc, dict) or set(doc) != {"name", "type", "scale", "zero_point"}:
        raise FormatError("an edge must be null or have exactly name, type, scale and zero_point", where)
    if not isinstance(doc["type"], str) or doc["type"] not in TYPES:
        raise FormatError(f"type {doc['type']!r} is not one of {', '.join(TYPES)}", where)
    try:
        scale = np.array(doc["scale"])
        zero = np.array(doc["zero_point"])
    except (TypeError, ValueError) as e:
        raise FormatError(f"scale and zero_point must be numbers or nested lists: {e}", where) from None
    if scale.dtype.kind not in "fiu":  # no strings ("0.5"), booleans or nulls
        raise FormatError(f"every scale must be a number, got {scale.dtype} values", where)
    scale = scale.astype(np.float64)
    if not (np.isfinite(scale) & (scale > 0)).all() or \
            (scale.astype(np.float32).astype(np.float64) != scale).any():
        raise FormatError("every scale must be a finite float32 > 0", where)
    lo, hi = TYPES[doc["type"]]
    if zero.dtype.kind not in "iu" or (zero.size and (zero.min() < lo or zero.max() > hi)):
        raise FormatError(f"every zero point must be an integer in [{lo}, {hi}]", where)
    if not isinstance(doc["name"], str):
        raise FormatError("name must be a string", where)
    return Edge(doc["name"], doc["type"], scale.astype(np.float32), zero.astype(np.int64))


def read_edges(directory: str | os.PathLike, graph: Graph | None = None) -> Edges | None:
    """The edges of a model directory, or None when it has no ``quantization.json`` (a plain CVM model); checked
    against the directory's validated ``graph`` when given (``Edges.fit``)."""
    path = Path(directory) / FILE
    if not path.is_file():
        return None
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise FormatError(f"cannot read the quantization edges: {e}", str(path)) from None
    edges = parse_edges(raw, str(path))
    if graph is not None:
        edges.fit(graph, str(path))
    return edges


def parse_edges(raw: bytes | str, where: str, outputs: int | None = None) -> Edges:
    """The edges written by ``Edges.to_bytes`` (a ``quantization.json``, or an exported model's metadata), for a
    model of ``outputs`` outputs when given."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise FormatError(f"cannot read the quantization edges: {e}", where) from None
    keys = {"format", "version", "input", "outputs"}
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("outputs"), list) or \
            not (doc.get("version") == VERSION and set(doc) == keys or
                 doc.get("version") == PACKED_VERSION and set(doc) == keys | {"inputs"}):
        raise FormatError(f"not a {FORMAT} file of version {VERSION} or {PACKED_VERSION}", where)
    if outputs is not None and len(doc["outputs"]) != outputs:
        raise FormatError(f"{len(doc['outputs'])} output edges for a model of {outputs} outputs", where)
    inputs = tuple(_slot(s, f"{where}: inputs {i}") for i, s in enumerate(doc.get("inputs", ())))
    if "inputs" in doc and (len(inputs) < 2 or doc["input"] is not None or
                            len({s.name for s in inputs}) < len(inputs)):
        raise FormatError("packed inputs: two or more, of distinct names, and input null", where)
    return Edges(_edge(doc["input"], f"{where}: input"),
                 tuple(_edge(e, f"{where}: output {i}") for i, e in enumerate(doc["outputs"])), inputs)


def _slot(doc, where: str) -> Slot:
    if not isinstance(doc, dict) or set(doc) != {"name", "shape", "type", "precision", "edge"}:
        raise FormatError("a packed input must have exactly name, shape, type, precision and edge", where)
    shape, p = doc["shape"], doc["precision"]
    if not isinstance(doc["name"], str) or not isinstance(shape, list) or \
            not all(type(d) is int and d > 0 for d in shape) or math.prod(shape) > 1 << 31:
        raise FormatError("name must be a string and shape a list of positive dims (at most 2^31 values)", where)
    if type(p) is not int or not 1 <= p <= 32 or not isinstance(doc["type"], str) or \
            doc["type"] not in INTEGER_TYPES:
        raise FormatError(f"precision must be an integer in [1, 32] and type one of {', '.join(INTEGER_TYPES)}",
                          where)
    edge = _edge(doc["edge"], f"{where}: edge")
    if edge is not None and edge.type != doc["type"]:
        raise FormatError(f"a float input's type is its edge's ({edge.type}), not {doc['type']}", where)
    if edge is not None and not _broadcasts(tuple(shape), edge.scale.shape, edge.zero_point.shape):
        raise FormatError(f"scale {list(edge.scale.shape)} and zero point {list(edge.zero_point.shape)} do not "
                          f"broadcast to the input's shape {shape}", f"{where}: edge")
    return Slot(doc["name"], tuple(shape), doc["type"], p, edge)
