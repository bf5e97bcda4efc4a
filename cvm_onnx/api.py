"""The library's front door: load, validate, convert, run. The CLI is a thin shell over these functions."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from .converters.from_onnx import from_onnx
from .converters.to_onnx import to_onnx
from .errors import FormatError, Problem, UnsupportedError
from .executor import execute
from .format import read_model, write_model
from .format.model_dir import replace_file
from .format.onnx_file import onnx_pieces
from .graph import Graph
from .validate import validate


@dataclass
class Loaded:
    """A validated CVM model and the portability warnings validation raised."""

    graph: Graph
    warnings: list[Problem]


def load(path: str | os.PathLike, params: str | os.PathLike | None = None) -> Loaded:
    """Read a CVM model (a directory with ``symbol`` and ``params``, or a symbol file and ``params``) and validate it."""
    v = validate(read_model(path, params))
    return Loaded(v.graph, v.warnings)


def is_onnx(path: str | os.PathLike) -> bool:
    return Path(path).suffix == ".onnx"


def load_onnx(path: str | os.PathLike) -> onnx.ModelProto:
    try:
        return onnx.load(os.fspath(path), load_external_data=False)
    except Exception as e:  # protobuf raises several unrelated types
        raise FormatError(f"not an ONNX model: {e}", where=os.fspath(path)) from None


def write_onnx(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Write ``model`` atomically (a temp file in the same directory, then a rename), without a second copy of its
    weights in memory (``format.onnx_file``); ``FormatError`` on failure."""
    try:
        replace_file(Path(path), onnx_pieces(model))
    except OSError as e:
        raise FormatError(f"cannot write the model: {e.strerror or e}", os.fspath(path)) from None


def import_onnx(path: str | os.PathLike, input_precision: int = 8) -> Graph:
    """Read an .onnx file (external data from its directory) and import it as a validated CVM graph."""
    return from_onnx(load_onnx(path), input_precision, base_dir=Path(path).parent)


def convert(src: str | os.PathLike, dst: str | os.PathLike, params: str | os.PathLike | None = None,
            inline: bool = False, input_precision: int = 8, batch: int | None = None,
            optimize: bool = False) -> None:
    """CVM model -> ``dst`` (.onnx), or an .onnx model -> the CVM model directory ``dst`` (``input_precision``:
    the bits of its input). ``batch`` and ``optimize`` as in ``to_onnx`` (CVM -> ONNX). Nothing is written when
    conversion fails."""
    if not is_onnx(src):
        write_onnx(to_onnx(load(src, params).graph, inline=inline, batch=batch, optimize=optimize), dst)
        return
    graph = import_onnx(src, input_precision)
    if len(graph.inputs) != 1:
        names = ", ".join(graph.nodes[i].name for i in graph.inputs)
        raise UnsupportedError(f"the CVM runtime takes exactly one input, data; this model has {names}", where=str(src))
    write_model(validate(graph).graph, dst)


def run_cvm(graph: Graph, data: np.ndarray) -> list[np.ndarray]:
    """Run a validated CVM graph on the reference executor; ``data`` is the input (int8 or int32)."""
    return execute(graph, {"data": data})


__all__ = ["Loaded", "load", "load_onnx", "to_onnx", "from_onnx", "import_onnx", "write_onnx", "convert", "run_cvm",
           "write_model", "is_onnx"]
