"""A Triton Inference Server model repository holding an exported model, for Triton's onnxruntime backend.

``REPO/<name>/1/model.onnx``, ``REPO/<name>/config.pbtxt`` and, when the model uses cvm.native ops, the native
library copied beside the config. The config says:

* ``platform: "onnxruntime_onnx"``, every input and output with its name, data type and dims;
* ``max_batch_size: 0``, dims with the batch: an exported model has a fixed first dimension (1, or N for the
  batch form ``--batch N``), and Triton batches only models whose first dimension is variable. A request
  carries exactly the form's N samples; the batch form sets how many (config comment);
* ``instance_group`` on the CPU, or on the GPU for the CUDA serving form (``convert --provider cuda``, metadata
  ``cvm.provider``): every node of that form has a CUDA kernel, it holds no Conv (no cuDNN algorithm choice),
  and its only float products (a dense layer's Gemm) multiply integers within +-127, exact in TF32's 11
  significant bits too, with sums within 2^24 accumulated in float32, so the backend's default CUDA options
  give the same values as ``cvm_onnx.runtime.sessions``'s;
* ``model_operations { op_library_filename }``: the library by the absolute path the server sees it at,
  ``server_repo/<name>/libcvm_onnx_ops.so`` (the backend hands the name to onnxruntime as given, so a relative
  one would resolve against the server's working directory). ``server_repo`` defaults to ``/models``, where
  Triton's container examples mount the repository.
"""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Iterable

import onnx
from onnx import TensorProto

from cvm_onnx.core.constants import BATCH, PROVIDER, __version__
from cvm_onnx.core.errors import FormatError, UnsupportedError
from cvm_onnx.core.format.model_dir import replace_files
from cvm_onnx.core.format.onnx_file import dims, onnx_pieces
from cvm_onnx.native import LIBRARY, fallback, library_path

SERVER_REPO = "/models"
TYPES = {TensorProto.BOOL: "TYPE_BOOL", TensorProto.UINT8: "TYPE_UINT8", TensorProto.UINT16: "TYPE_UINT16",
         TensorProto.UINT32: "TYPE_UINT32", TensorProto.UINT64: "TYPE_UINT64", TensorProto.INT8: "TYPE_INT8",
         TensorProto.INT16: "TYPE_INT16", TensorProto.INT32: "TYPE_INT32", TensorProto.INT64: "TYPE_INT64",
         TensorProto.FLOAT16: "TYPE_FP16", TensorProto.FLOAT: "TYPE_FP32", TensorProto.DOUBLE: "TYPE_FP64"}
"""Triton's data type of each ONNX tensor type (model_config.proto's DataType)."""


def _quoted(text: str) -> str:
    """A protobuf text-format string literal: printable ASCII as is, every other byte of the UTF-8 octal-escaped."""
    out = []
    for byte in text.encode("utf-8"):
        c = chr(byte)
        out.append("\\" + c if c in '"\\' else c if 32 <= byte < 127 else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _tensors(kind: str, values) -> list[str]:
    lines = [f"{kind} ["]
    for k, vi in enumerate(values):
        t = vi.type.tensor_type
        if t.elem_type not in TYPES:
            raise UnsupportedError(f"{kind} {vi.name}: ONNX type {TensorProto.DataType.Name(t.elem_type)} has no "
                                   f"Triton data type")
        shape = [-1 if d is None else d for d in dims(vi) or ()]
        lines += ["  {", f"    name: {_quoted(vi.name)}", f"    data_type: {TYPES[t.elem_type]}",
                  f"    dims: [ {', '.join(map(str, shape))} ]", "  }" + ("," if k < len(values) - 1 else "")]
    return lines + ["]"]


def config(model: onnx.ModelProto, name: str, library: str | None = None) -> str:
    """The text of ``config.pbtxt`` for ``model`` served as ``name``; ``library``: the op library's path on the
    server, when the model uses cvm.native ops."""
    props = {p.key: p.value for p in model.metadata_props}
    batch, provider = props.get(BATCH, "1"), props.get(PROVIDER, "cpu")
    initializers = {t.name for t in model.graph.initializer}
    lines = [f"# written by cvm-onnx {__version__}: a fixed batch of {batch} sample(s) per request "
             f"(convert --batch N sets it)",
             f"name: {_quoted(name)}", 'platform: "onnxruntime_onnx"', "max_batch_size: 0",
             *_tensors("input", [i for i in model.graph.input if i.name not in initializers]),
             *_tensors("output", list(model.graph.output)),
             f"instance_group [ {{ count: 1, kind: KIND_{'GPU' if provider == 'cuda' else 'CPU'} }} ]"]
    if library is not None:
        lines += ["model_operations {", f"  op_library_filename: {_quoted(library)}", "}"]
    return "\n".join(lines) + "\n"


def model_folder(repo: str | os.PathLike, name: str) -> Path:
    """``repo/name``, where ``name`` can name a directory."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise FormatError(f"{name!r} cannot name a model directory", where=os.fspath(repo))
    return Path(repo) / name


def write_repository(model: onnx.ModelProto, repo: str | os.PathLike, name: str,
                     server_repo: str = SERVER_REPO) -> Path:
    """Write ``model`` into the Triton repository ``repo`` as model ``name``, version 1 (files replaced, each
    atomically; a library left by an earlier model that used cvm.native ops removed when this one does not);
    returns the model's directory. ``server_repo``: where the server will see ``repo``."""
    folder = model_folder(repo, name)
    files: dict[Path, bytes | Iterable[bytes]] = {}
    library = None
    if fallback.uses_native(model):
        built = library_path()
        if built is None:
            raise UnsupportedError("the model uses cvm.native ops, but the native custom-op library was not built "
                                   "with this install (see docs/custom_ops.md)")
        files[folder / LIBRARY] = Path(built).read_bytes()
        library = str(PurePosixPath(server_repo) / name / LIBRARY)
    files[folder / "config.pbtxt"] = config(model, name, library).encode()
    files[folder / "1" / "model.onnx"] = onnx_pieces(model)
    try:
        (folder / "1").mkdir(parents=True, exist_ok=True)
        replace_files(files)
        if library is None:
            (folder / LIBRARY).unlink(missing_ok=True)
    except OSError as e:
        raise FormatError(f"cannot write the Triton repository: {e.strerror or e}", where=str(folder)) from None
    return folder
