"""The float edges of a CVM model imported from a quantized ONNX model: ``quantization.json`` next to ``symbol``
and ``params``. It holds the scale and zero point of the input (how the source model's first QuantizeLinear
turns float data into the model's integer input) and of each output (how its last DequantizeLinear turns the
model's integer output into floats). A model directory without it is a plain CVM model. See docs/format.md.

    {"format": "cvm-onnx quantization", "version": 1,
     "input": {"name": "data", "type": "uint8", "scale": 0.0039215689, "zero_point": 0},
     "outputs": [{"name": "y", "type": "int8", "scale": [0.1, 0.2], "zero_point": [0, 0]}, null]}

A scale is a float32 written as the shortest decimal that reads back to it, a scale or zero point a number or a
nested list broadcast over the tensor (per channel); ``null`` is an output of plain integers.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import FormatError, RuntimeFailure

FILE = "quantization.json"
FORMAT = "cvm-onnx quantization"
VERSION = 1
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
class Edges:
    """The input's edge (None: the model takes integers) and one per output (None: integers)."""

    input: Edge | None
    outputs: tuple[Edge | None, ...]

    def prepare(self, data: np.ndarray) -> np.ndarray:
        """Float input data quantized as the source model's first QuantizeLinear does; integers as they are."""
        data = np.asarray(data)
        if data.dtype.kind != "f":
            return data
        if self.input is None:
            raise RuntimeFailure("float input data, but this model takes integers (its input is not quantized)")
        if np.isnan(data).any():
            raise RuntimeFailure("NaN in the float input data: it has no quantized value")
        return self.input.quantize(data)

    def finish(self, outputs: list[np.ndarray]) -> list[np.ndarray]:
        """The outputs dequantized to float32 where the source model dequantized them."""
        return [y if e is None else e.dequantize(y) for e, y in zip(self.outputs, outputs)]

    def to_bytes(self) -> bytes:
        doc = {"format": FORMAT, "version": VERSION, "input": None if self.input is None else self.input.to_json(),
               "outputs": [None if e is None else e.to_json() for e in self.outputs]}
        return (json.dumps(doc, indent=1) + "\n").encode()


def _edge(doc, where: str) -> Edge | None:
    if doc is None:
        return None
    if not isinstance(doc, dict) or set(doc) != {"name", "type", "scale", "zero_point"}:
        raise FormatError("an edge must be null or have exactly name, type, scale and zero_point", where)
    if doc["type"] not in TYPES:
        raise FormatError(f"type {doc['type']!r} is not one of {', '.join(TYPES)}", where)
    try:
        scale = np.array(doc["scale"], np.float64)
        zero = np.array(doc["zero_point"])
    except (TypeError, ValueError) as e:
        raise FormatError(f"scale and zero_point must be numbers or nested lists: {e}", where) from None
    if scale.dtype.kind != "f" or not (np.isfinite(scale) & (scale > 0)).all() or \
            (scale.astype(np.float32).astype(np.float64) != scale).any():
        raise FormatError("every scale must be a finite float32 > 0", where)
    lo, hi = TYPES[doc["type"]]
    if zero.dtype.kind not in "iu" or (zero.size and (zero.min() < lo or zero.max() > hi)):
        raise FormatError(f"every zero point must be an integer in [{lo}, {hi}]", where)
    if not isinstance(doc["name"], str):
        raise FormatError("name must be a string", where)
    return Edge(doc["name"], doc["type"], scale.astype(np.float32), zero.astype(np.int64))


def read_edges(directory: str | os.PathLike) -> Edges | None:
    """The edges of a model directory, or None when it has no ``quantization.json`` (a plain CVM model)."""
    path = Path(directory) / FILE
    if not path.is_file():
        return None
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise FormatError(f"cannot read the quantization edges: {e}", str(path)) from None
    return parse_edges(raw, str(path))


def parse_edges(raw: bytes | str, where: str, outputs: int | None = None) -> Edges:
    """The edges written by ``Edges.to_bytes`` (a ``quantization.json``, or an exported model's metadata), for a
    model of ``outputs`` outputs when given."""
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise FormatError(f"cannot read the quantization edges: {e}", where) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION or \
            not isinstance(doc.get("outputs"), list) or set(doc) != {"format", "version", "input", "outputs"}:
        raise FormatError(f"not a {FORMAT} file of version {VERSION}", where)
    if outputs is not None and len(doc["outputs"]) != outputs:
        raise FormatError(f"{len(doc['outputs'])} output edges for a model of {outputs} outputs", where)
    return Edges(_edge(doc["input"], f"{where}: input"),
                 tuple(_edge(e, f"{where}: output {i}") for i, e in enumerate(doc["outputs"])))
