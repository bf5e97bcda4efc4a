"""A CVM model on disk: a directory holding ``symbol`` (the JSON) and ``params`` (the binary), as on chain."""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, TypeVar

from ..errors import FormatError, Problem
from ..graph import Graph
from .edges import FILE as EDGES
from .edges import Edges
from .params import params_pieces, read_params
from .symbol import read_symbol, write_symbol

SYMBOL = "symbol"
PARAMS = "params"
T = TypeVar("T")


def _read_bytes(path: Path, read: Callable[[BinaryIO], T] | None = None) -> bytes | T:
    """The file's bytes, or what ``read`` makes of the open file; ``FormatError`` where it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read() if read is None else read(f)
    except FileNotFoundError:
        raise FormatError("no such file", str(path)) from None
    except IsADirectoryError:
        raise FormatError("is a directory, not a file", str(path)) from None
    except OSError as e:
        raise FormatError(f"cannot be read: {e.strerror or e}", str(path)) from None


def model_files(path: str | os.PathLike, params: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """The symbol and params files of a model directory, or of a symbol file and ``params`` (which overrides the
    params file of a directory)."""
    path = Path(path)
    if path.is_dir():
        return path / SYMBOL, Path(params) if params is not None else path / PARAMS
    if params is not None:
        return path, Path(params)
    if path.exists():
        raise FormatError("is not a model directory: give the directory holding symbol and params, or a symbol "
                          "file with --params", str(path))
    raise FormatError("no such model directory or file", str(path))


def read_symbol_text(path: str | os.PathLike, params: str | os.PathLike | None = None) -> str | None:
    """The symbol file's text as written (None unless it is UTF-8)."""
    try:
        return _read_bytes(model_files(path, params)[0]).decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_model(path: str | os.PathLike, params: str | os.PathLike | None = None) -> Graph:
    """The graph of a model directory (``symbol`` and ``params``), or of a symbol file and a params file.

    ``params`` overrides the params file of a directory. Raises ``FormatError`` listing the problems of both
    files.
    """
    symbol_path, params_path = model_files(path, params)
    problems: list[Problem] = []
    graph, values = None, None
    try:
        graph = read_symbol(_read_bytes(symbol_path), where=str(symbol_path))
    except FormatError as e:
        problems += e.problems
    try:
        values = _read_bytes(params_path, lambda f: read_params(f, where=str(params_path)))
    except FormatError as e:
        problems += e.problems
    if problems:
        raise FormatError(problems)
    graph.params = values
    return graph


def replace_files(files: dict[Path, bytes | Iterable[bytes]]) -> None:
    """Write each file (its bytes, or its pieces in order) to a temporary file next to it, then rename them all
    over their targets: a failure while writing (or an interruption) changes none of them."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o644
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            staged.append((tmp, path))
            with os.fdopen(fd, "wb") as f:
                for piece in [data] if isinstance(data, bytes) else data:
                    f.write(piece)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
        for tmp, path in staged:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        raise


def replace_file(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write ``data`` (bytes, or pieces) to ``path`` atomically: a temporary file next to it, then a rename."""
    replace_files({path: data})


def write_model(graph: Graph, directory: str | os.PathLike, symbol: str | None = None,
                edges: Edges | None = None) -> None:
    """Write ``symbol`` and ``params`` into ``directory`` (created if needed), both replaced together: a failure
    leaves the old files (and no new directory). ``edges``: the float edges of a quantized import, written as
    ``quantization.json`` with them; without them, an old ``quantization.json`` is removed (a plain model).

    ``symbol``: the source's symbol text, written as it is (the caller has checked that it describes ``graph``),
    with the params in their order and stored types. Without it the runtime writer's symbol is written and params
    are stored as int8 when their variable's precision is <= 8, else int32 (MRT's rule).
    """
    directory = Path(directory)
    precisions = {} if symbol is not None else {n.name: n.outputs[0].precision for n in graph.nodes
                                                if n.is_variable and n.outputs and n.name in graph.params}
    text = (write_symbol(graph) if symbol is None else symbol).encode("utf-8")
    data = params_pieces(graph.params, precisions)  # written as each array's bytes are made
    fresh = not directory.exists()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        files = {directory / SYMBOL: text, directory / PARAMS: data}
        if edges is not None:
            files[directory / EDGES] = edges.to_bytes()
        replace_files(files)
        if edges is None:
            (directory / EDGES).unlink(missing_ok=True)
    except BaseException as e:
        if fresh and directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
        if isinstance(e, OSError):
            raise FormatError(f"cannot write the model: {e.strerror or e}", str(directory)) from None
        raise
