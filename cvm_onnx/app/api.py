"""The library's front door: load, validate, convert, run. The CLI is a thin shell over these functions."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping

import numpy as np

from cvm_onnx.core.errors import FormatError, Problem, UnsupportedError
from cvm_onnx.core.format import Edges, read_edges, read_model, write_model
from cvm_onnx.core.gas import Gas, measure
from cvm_onnx.core.graph import Graph
from cvm_onnx.core.validate import INPUT_NAME, validate

if TYPE_CHECKING:
    import onnx

    from cvm_onnx.converters.from_onnx import Imported

# The converters' names this module passes on are imported when first used: loading a CVM model needs neither
# onnx nor the converters.


def __getattr__(name: str):
    if name == "from_onnx":
        from cvm_onnx.converters.from_onnx import from_onnx as value
    elif name == "import_model":
        from cvm_onnx.converters.from_onnx import import_model as value
    elif name == "to_onnx":
        from cvm_onnx.converters.to_onnx import to_onnx as value
    elif name == "write_onnx":
        from cvm_onnx.core.format.onnx_file import write_onnx as value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


@dataclass
class Loaded:
    """A validated CVM model, the portability warnings validation raised and its gas (core/gas.py)."""

    graph: Graph
    warnings: list[Problem]
    edges: Edges | None = None  # a quantized import's float edges (quantization.json), if any
    gas: Gas | None = None


def load(path: str | os.PathLike, params: str | os.PathLike | None = None) -> Loaded:
    """Read a CVM model (a directory with ``symbol`` and ``params``, or a symbol file and ``params``) and validate it;
    a directory's ``quantization.json`` (float edges) too."""
    v = validate(read_model(path, params))
    return Loaded(v.graph, v.warnings, read_edges(path, v.graph) if Path(path).is_dir() else None, v.gas)


def is_onnx(path: str | os.PathLike) -> bool:
    return Path(path).suffix == ".onnx"


def load_onnx(path: str | os.PathLike, external_data: bool = False) -> onnx.ModelProto:
    """The ONNX model in ``path`` (``read_onnx``: never the file's bytes whole beside it); ``FormatError`` unless the
    file parses as a model with an IR version and a graph (an empty file parses as an empty model).
    ``external_data``: external tensors read into the model from the file's directory, under the importer's checks
    (``format.onnx_safety``), as a model to run needs them; else left external."""
    from cvm_onnx.core.format.onnx_file import read_onnx
    from cvm_onnx.core.format.onnx_safety import readable

    try:
        model = read_onnx(path)
    except FileNotFoundError:
        raise FormatError("no such file", where=os.fspath(path)) from None
    except OSError as e:
        raise FormatError(f"cannot be read: {e.strerror or e}", where=os.fspath(path)) from None
    except Exception as e:  # noqa: BLE001  (protobuf raises several unrelated types)
        raise FormatError(f"not an ONNX model: {e}", where=os.fspath(path)) from None
    if not model.ir_version or not model.HasField("graph"):
        what = "an empty file" if Path(path).stat().st_size == 0 else "no IR version or no graph"
        raise FormatError(f"not an ONNX model: {what}", where=os.fspath(path))
    return readable(model, Path(path).parent) if external_data else model


def import_onnx(path: str | os.PathLike, input_precision: int = 8) -> Graph:
    """Read an .onnx file (external data from its directory) and import it as a validated CVM graph."""
    from cvm_onnx.converters.from_onnx import batch_of_one, from_onnx

    model = load_onnx(path)
    batch_of_one(model)
    return from_onnx(model, input_precision, base_dir=Path(path).parent)


def convert(src: str | os.PathLike, dst: str | os.PathLike, params: str | os.PathLike | None = None,
            inline: bool = False, input_precision: int = 8, batch: int | None = None,
            optimize: bool = False, outputs: list[str] | None = None, provider: str = "cpu",
            float_io: bool = False, two_part: bool = True, target: str | None = None,
            progress: Callable[[int, int | None, str], None] | None = None,
            input_precisions: dict[str, int] | None = None) -> Imported | Conversion:
    """CVM model -> ``dst`` (.onnx), or an .onnx model -> the CVM model directory ``dst`` (``input_precision``:
    the bits of its input). ``target`` names the serving form's target (``Target.named``: "cpu", the same as
    ``optimize``; "cuda", the same as ``provider="cuda"``; "native", this machine's best); ``batch`` and ``float_io`` (a
    quantized model's float edges in the graph, float32 input and outputs) as in ``to_onnx`` (CVM -> ONNX). A model this function
    exported comes back with its symbol and params files byte for byte. A quantized ONNX model is imported with
    its float edges (``quantization.json``); ``outputs`` cuts the graph at those tensors; ``two_part`` as in
    ``import_model`` (default: two products where they are closer; False: one part only). An ONNX model of several
    inputs is imported with them packed into ``data`` (``import_model``'s ``pack``; ``input_precisions``: an integer
    input's bits by name, else ``input_precision``); ``pack_inputs`` lays them out. An input's dynamic first dim
    (a shipped model's batch axis) is taken as 1 (``batch_of_one``, said in ``Imported.notes``). Returns the import
    (ONNX -> CVM) or the conversion's record, the model's gas included (CVM -> ONNX). Nothing is written when
    conversion fails. ``progress(done, total, stage)``: told of the import's nodes (ONNX -> CVM)."""
    from cvm_onnx.converters.from_onnx import batch_of_one, import_model, source_symbol

    from .pipeline import Conversion, run

    if not is_onnx(src):
        c = Conversion(src, dst, params, inline=inline, batch=batch, optimize=optimize or target is not None,
                       target=target or provider, float_io=float_io)
        run(c)
        return c
    model = load_onnx(src)
    notes = batch_of_one(model)
    imported = import_model(model, input_precision, base_dir=Path(src).parent, outputs=outputs, two_part=two_part,
                            progress=progress, pack=True, input_precisions=input_precisions)
    imported.notes.extend(notes)
    graph = imported.graph
    if len(graph.inputs) != 1:
        names = ", ".join(graph.nodes[i].name for i in graph.inputs)
        raise UnsupportedError(f"the CVM runtime takes exactly one input, data; this model has {names}", where=str(src))
    if graph.nodes[graph.inputs[0]].name != INPUT_NAME:  # the import validated it with that one input as data
        graph = validate(graph).graph
    write_model(graph, dst, symbol=source_symbol(model, graph), edges=imported.edges)
    return imported


def one_part_gas(model: onnx.ModelProto, base_dir: str | os.PathLike | None = None,
                 input_precisions: dict[str, int] | None = None) -> Gas:
    """The gas of ``model`` imported with one-part products only (``import_model``'s ``two_part=False``), to set
    against a two-part import's (several inputs packed, as ``convert`` imports them)."""
    from cvm_onnx.converters.from_onnx import batch_of_one, import_model

    batch_of_one(model)
    return measure(import_model(model, base_dir=base_dir, two_part=False, pack=True,
                                input_precisions=input_precisions).graph.nodes)


def has_two_parts(imported: Imported) -> bool:
    """Whether some requantization of the import takes its products in two parts."""
    return any(p.split for r in imported.requants for p in r.plans)


def pack_inputs(model: str | os.PathLike | Edges | Loaded, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """The named inputs of a model of several packed into one ``data`` (a model directory, its ``Loaded``, or its
    edges), laid out in ``data`` as the CVM runtime takes it: int32, (total,) for one sample, (N, total) for N
    stacked on axis 0 (``Edges.pack``: float inputs quantized by their edges, integers checked against the range the
    model was imported for). ``RuntimeFailure`` in one line for a missing or unknown name, a wrong shape or a value
    past an input's range; ``UnsupportedError`` for a model of one input."""
    edges = model if isinstance(model, Edges) else model.edges if isinstance(model, Loaded) else read_edges(model)
    if edges is None or not edges.inputs:
        raise UnsupportedError("the model takes one input, data: it packs none", where=str(
            model if isinstance(model, (str, os.PathLike)) else ""))
    return edges.pack(inputs)


def run_cvm(graph: Graph, data: np.ndarray | Mapping[str, np.ndarray], edges: Edges | None = None) \
        -> list[np.ndarray]:
    """Run a validated CVM graph on the reference executor; ``data`` is the input (integers). With the ``edges`` of
    a quantized import, float data is quantized as the source model's first QuantizeLinear does and the outputs
    are dequantized to float32, comparable with onnxruntime running the source model. A model of several packed
    inputs takes them by name (``pack_inputs``), its outputs dequantized where it has edges."""
    from cvm_onnx.core.executor import execute

    if isinstance(data, Mapping):
        return edges.finish(execute(graph, {"data": pack_inputs(edges, data)}))
    if edges is None or np.asarray(data).dtype.kind != "f":
        return execute(graph, {"data": data})
    return edges.finish(execute(graph, {"data": edges.prepare(data)}))


__all__ = ["Loaded", "load", "load_onnx", "to_onnx", "from_onnx", "import_onnx", "import_model", "write_onnx",
           "convert", "one_part_gas", "has_two_parts", "pack_inputs", "run_cvm", "write_model", "is_onnx"]
