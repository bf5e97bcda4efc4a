"""Running a model over many samples: chunk by chunk, a batch per model call, results streamed to disk.

* Samples, for a model input of shape S: an array of shape S is one sample; ``(N, *S)`` is N samples stacked
  on a new axis 0; where S's first dimension is 1, ``(N, *S[1:])`` is N samples laid along it (a data set as
  models take it: (359, 1, 8, 8) for (1, 1, 8, 8)). A directory holds .npy files of these kinds, taken in
  file-name order, all of one dtype. Shapes and dtypes are checked before anything runs, every bad file named
  with the index of its first sample.
* Plan: the model in the form a runner executes. A CVM graph takes the batched form (``cvm_onnx.core.batch``, the
  serving form on onnxruntime) with the chunk's size as its batch where every op allows it, else it runs one
  sample per call; an .onnx file runs as given, batched if its metadata ``cvm.batch`` says so. A short batch is
  padded with zero samples whose results are dropped (examples never mix in a batched form).
* Runner: the unit of work, one onnxruntime session (or the reference executor's graph) over a chunk; the same
  class runs locally (``run_many``) and in each Ray actor (``cvm_onnx.runtime.on_ray``).
* Output: each model output laid out as the samples were: stacked, ``(N, *output shape)`` (so for a
  directory), or concatenated along its first axis (one sample: the output itself). An ``.npy`` path takes a
  one-output model, any other path is an ``.npz`` keyed by the output names. Written into memory maps in a
  temporary directory beside the target and renamed over it once complete: memory stays bounded by a chunk,
  and a failure leaves no partial file.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
import zipfile
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import onnx

from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.batch import batched
from cvm_onnx.core.constants import BATCH, CHUNK, QUANTIZATION
from cvm_onnx.core.errors import CVMError, FormatError, Problem, RuntimeFailure, UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.edges import Edges, parse_edges
from cvm_onnx.core.format.npy import read_npy
from cvm_onnx.core.format.onnx_file import dims
from cvm_onnx.core.graph import Graph
from cvm_onnx.runtime import sessions
from cvm_onnx.serving.target import Target

Progress = Callable[[int, int, str], None]
ModelArg = Graph | onnx.ModelProto


# -- samples ------------------------------------------------------------------------------------------------------
def _fits(shape: Sequence[int], want: Sequence[int | None]) -> bool:
    return len(shape) == len(want) and all(w is None or s == w for s, w in zip(shape, want))


def _shown(want: Sequence[int | str | None]) -> str:
    return "(" + ", ".join("?" if w is None else str(w) for w in want) + ("," if len(want) == 1 else "") + ")"


@dataclass
class Samples:
    """``count`` samples of shape ``shape`` read a chunk at a time from .npy files (memory-mapped) or an array.

    ``files`` holds each file (or array) with its number of samples and whether they are stacked on a new axis
    (else laid along the model's first axis). ``stacked``: how the outputs are laid out (see ``Output``).
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    count: int
    stacked: bool
    files: list[tuple[Path | np.ndarray, int, bool]]

    def chunk(self, start: int, stop: int) -> np.ndarray:
        """Samples ``start`` to ``stop - 1`` stacked on axis 0."""
        parts, first = [], 0
        for path, n, stacked in self.files:
            lo, hi = max(start, first) - first, min(stop, first + n) - first
            if lo < hi:
                data = read_npy(path) if isinstance(path, Path) else path
                parts.append(data[lo:hi] if stacked else data[None] if n == 1 else data[lo:hi, None])
            first += n
            if first >= stop:
                break
        return np.concatenate(parts) if len(parts) > 1 else np.array(parts[0])


def samples(source: str | os.PathLike | np.ndarray, want: Sequence[int | None]) -> Samples:
    """The samples in ``source`` (an .npy file, a directory of them, or an array) for a model input of shape
    ``want`` (None: any size). Raises ``RuntimeFailure`` listing every file that fits no layout."""
    if not isinstance(source, np.ndarray) and Path(source).is_dir():
        return _directory(Path(source), want)
    data = source if isinstance(source, np.ndarray) else read_npy(Path(source))
    where = "input" if data is source else str(source)
    n, stacked = _count(data.shape, want, where)
    return Samples(_one(data.shape, n, stacked), _dtype(data.dtype, where), n, stacked,
                   [(data if data is source else Path(source), n, stacked)])


def _directory(path: Path, want: Sequence[int | None]) -> Samples:
    files = sorted(p for p in path.iterdir() if p.suffix == ".npy" and p.is_file())
    if not files:
        raise FormatError("no .npy files in the input directory", where=str(path))
    listed, problems, first, dtype, shape = [], [], 0, None, None
    for f in files:
        data, where = read_npy(f), f"sample {first} ({f.name})"
        try:
            n, stacked = _count(data.shape, want, where)
        except RuntimeFailure as e:
            problems += e.problems
            n = 1
        else:
            one = _one(data.shape, n, stacked)
            if dtype is None:
                dtype, shape = _dtype(data.dtype, where), one
            elif data.dtype != dtype or one != shape:
                problems.append(Problem(where, f"{data.dtype} samples of shape {one}; the first file holds {dtype} "
                                               f"samples of shape {shape}"))
            listed.append((f, n, stacked))
        first += n
    if problems:
        raise RuntimeFailure(problems)
    return Samples(shape, dtype, first, True, listed)


def _dtype(dtype: np.dtype, where: str) -> np.dtype:
    if dtype.kind not in "biuf":
        raise RuntimeFailure(f"{dtype} samples; the input must hold integers (or floats)", where=where)
    return dtype


def _one(shape: tuple[int, ...], n: int, stacked: bool) -> tuple[int, ...]:
    """One sample's shape in an array of ``n`` samples of ``shape``."""
    return shape[1:] if stacked else shape if n == 1 else (1, *shape[1:])


def _count(shape: tuple[int, ...], want: Sequence[int | None], where: str) -> tuple[int, bool]:
    """The number of samples in an array of ``shape`` and whether they are stacked on a new axis 0, for a model
    input ``want``: ``(N, *want)`` is N stacked samples; ``want`` itself is one; where ``want``'s first dimension
    is 1, ``(N, *want[1:])`` is N samples laid along it. Else ``RuntimeFailure``."""
    if len(shape) == len(want) + 1 and _fits(shape[1:], want):
        return shape[0], True
    if _fits(shape, want):
        return 1, False
    if len(shape) == len(want) and want and want[0] == 1 and _fits(shape[1:], want[1:]):
        return shape[0], False
    rest = _shown(("N", *want[1:])) + " or " if want and want[0] == 1 else ""
    raise RuntimeFailure(f"shape {shape} is not the model input's {_shown(want)}, nor samples {rest}"
                         f"{_shown(('N', *want))}", where=where)


# -- plan and runner ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """A model ready for runners (picklable, for Ray): ``model`` is a CVM graph (the reference executor) or a
    serialized ONNX model (onnxruntime) taking ``batch`` samples of shape ``sample`` per call; ``split[k]``:
    output k carries the batch on axis 0 (else it is computed from params alone, the same for every sample; in
    an .onnx file, an output carries the batch when its first dimension is the batch size). ``io_binding``:
    calls go through ``sessions.Bound`` (None: on CUDA), the data copied to the device once and the outputs kept
    there until the call ends; ``cuda_graph``: the session replays a captured CUDA graph (CUDA, static shapes)."""

    model: Graph | bytes
    batch: int
    sample: tuple[int | None, ...]
    names: tuple[str, ...]
    split: tuple[bool, ...]
    provider: str = "cpu"
    threads: int | None = None
    edges: Edges | None = None  # a quantized import's float edges: float samples in, float32 outputs out
    io_binding: bool | None = None
    cuda_graph: bool = False

    @property
    def uses_binding(self) -> bool:
        return self.io_binding if self.io_binding is not None else self.provider == "cuda" or self.cuda_graph


def plan(model: ModelArg, chunk: int = CHUNK, onnxruntime: bool = False, provider: str = "cpu",
         threads: int | None = None, edges: Edges | None = None, io_binding: bool | None = None,
         cuda_graph: bool = False) -> Plan:
    """The plan for ``model``: a CVM graph in its batched form (batch ``chunk``) where every op allows it, on
    the reference executor or, with ``onnxruntime``, exported in the serving form (for ``provider``: the CUDA
    serving form on "cuda"); an ONNX model as given."""
    if cuda_graph and io_binding is False:
        raise RuntimeFailure("a CUDA graph needs IO binding (fixed device buffers): leave io_binding on")
    if chunk < 1:
        raise RuntimeFailure(f"the chunk size must be >= 1, got {chunk}")
    if isinstance(model, onnx.ModelProto):
        return replace(_onnx_plan(model, provider, threads, edges), io_binding=io_binding, cuda_graph=cuda_graph)
    names = tuple(model.nodes[h.node].name for h in model.heads)
    sample = model.nodes[model.inputs[0]].outputs[0].shape
    try:
        form = batched(model, chunk) if chunk > 1 else model
    except UnsupportedError:
        form, chunk = model, 1
    split = tuple(chunk > 1 and form.type_of(h).shape != model.type_of(h).shape for h in model.heads)
    if onnxruntime:
        exported = to_onnx(form, Target.default(provider), batch=chunk if chunk > 1 else None, batched=True)
        return Plan(exported.SerializeToString(), chunk, sample, names, split, provider, threads, edges,
                    io_binding, cuda_graph)
    return Plan(form, chunk, sample, names, split, provider, threads, edges)


def _onnx_plan(model: onnx.ModelProto, provider: str, threads: int | None, edges: Edges | None) -> Plan:
    inputs = [i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    if len(inputs) != 1:
        raise RuntimeFailure(f"the model has {len(inputs)} inputs ({', '.join(i.name for i in inputs)}); "
                             f"runners feed exactly one")

    sample = list(dims(inputs[0]) or ())
    props = {p.key: p.value for p in model.metadata_props}
    marked = props.get(BATCH, "")
    if edges is None and QUANTIZATION in props:  # exported from a quantized import: its float edges
        edges = parse_edges(props[QUANTIZATION], f"metadata {QUANTIZATION}", len(model.graph.output))
        edges.fit_declared(dims(inputs[0]), [dims(o) for o in model.graph.output], f"metadata {QUANTIZATION}")
    batch = int(marked) if marked.isdigit() and sample and sample[0] == int(marked) else 1
    if batch > 1:
        sample[0] = 1
    split = tuple(batch > 1 and (dims(o) or ())[:1] == (batch,) for o in model.graph.output)
    return Plan(model.SerializeToString(), batch, tuple(sample), tuple(o.name for o in model.graph.output), split,
                provider, threads, edges)


class Runner:
    """One onnxruntime session (or the reference executor's graph) running chunks of samples, ``plan.batch``
    per call; ``runner(chunk)`` returns each output stacked over the chunk's samples."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.session, self.precision, self.bound = None, None, None
        if isinstance(plan.model, bytes):
            model = onnx.load_from_string(plan.model)
            self.session = sessions.session(model, plan.provider, threads=plan.threads, cuda_graph=plan.cuda_graph)
            self.precision = sessions.declared_precision(model, self.session.get_inputs()[0].name)
            self.bound = sessions.Bound(self.session) if plan.uses_binding else None

    def __call__(self, chunk: np.ndarray, index: Sequence[int] | None = None) -> list[np.ndarray]:
        """Outputs for ``chunk`` (samples on axis 0); ``index``: their numbers in the whole input, named in
        errors (None: errors name no sample)."""
        b = self.plan.batch
        results: list[list[np.ndarray]] = [[] for _ in self.plan.names]
        for a in range(0, len(chunk), b):
            part = chunk[a:a + b]
            try:
                outs = self._call(part)
            except CVMError as e:
                if index is None:
                    raise
                raise self._failed(part, index[a:a + len(part)], e) from None
            for k, out in enumerate(outs):
                if b == 1:
                    results[k].append(out[None])
                elif self.plan.split[k]:
                    results[k].append(out[:len(part), None])
                else:
                    results[k].append(np.broadcast_to(out, (len(part), *out.shape)))
        return [np.concatenate(r) for r in results]

    def units(self, data: Samples, chunk: int, workers: int = 1) -> Iterator[tuple[slice, list[np.ndarray]]]:
        """The outputs of ``data``'s samples ``chunk`` at a time (``self(...)``), in order, as (their slice,
        outputs); ``workers`` units run at once (onnxruntime runs a session's calls concurrently), at most one
        more waiting, so memory stays bounded by a few units. One worker runs them in the calling thread: a thread
        of its own would allocate in a glibc arena of its own, which keeps what the runs freed after they end
        (benchmarks/RESULTS.md: the importer's memory)."""
        def unit(a: int) -> list[np.ndarray]:
            b = min(a + chunk, data.count)
            return self(data.chunk(a, b), range(a, b) if data.stacked else None)

        if workers == 1:
            for a in range(0, data.count, chunk):
                yield slice(a, min(a + chunk, data.count)), unit(a)
            return
        with ThreadPoolExecutor(workers) as pool:
            pending: deque = deque()
            for a in range(0, data.count, chunk):
                pending.append((a, pool.submit(unit, a)))
                if len(pending) > workers:
                    a0, result = pending.popleft()
                    yield slice(a0, min(a0 + chunk, data.count)), result.result()
            while pending:
                a0, result = pending.popleft()
                yield slice(a0, min(a0 + chunk, data.count)), result.result()

    def _failed(self, part: np.ndarray, index: Sequence[int], error: CVMError) -> RuntimeFailure:
        """The error of the first sample of ``part`` that fails alone, named by its index (else of them all)."""
        for k in range(len(part) if len(part) > 1 else 0):
            try:
                self._call(part[k:k + 1])
            except CVMError as e:
                index, error = index[k:k + 1], e
                break
        where = f"sample {index[0]}" if len(index) == 1 else f"samples {index[0]}-{index[-1]}"
        return RuntimeFailure([Problem(where, str(p)) for p in error.problems])

    def _call(self, part: np.ndarray) -> list[np.ndarray]:
        """The outputs on ``part``; through the edges for float data, and always for a model of several inputs
        packed into ``data`` (``part`` then holds the packed integers: its outputs dequantized where it has edges)."""
        edges = self.plan.edges
        if edges is not None and (part.dtype.kind == "f" or edges.inputs):
            return edges.finish(self._model(edges.prepare(part)))
        return self._model(part)

    def _model(self, part: np.ndarray) -> list[np.ndarray]:
        b = self.plan.batch
        if b == 1:
            x = part[0]
        else:  # samples (1, *rest) side by side on the batch axis, zero samples after a short part
            x = part.reshape(len(part), *part.shape[2:])
            if len(x) < b:
                x = np.concatenate([x, np.zeros((b - len(x), *x.shape[1:]), x.dtype)])
        if self.session is None:
            graph = self.plan.model
            return execute(graph, {graph.nodes[graph.inputs[0]].name: x})
        feeds = sessions.feed(self.session, x, self.precision)
        return self.bound(feeds) if self.bound is not None else sessions.run(self.session, feeds)


# -- output -------------------------------------------------------------------------------------------------------
class Output:
    """The outputs of ``count`` samples, written as they come (``write``) and published by ``commit``: to
    ``path`` (.npy for one output, else .npz) through a temporary directory beside it, or kept in memory when
    ``path`` is None (``arrays``). ``stacked``: each output's values are stacked on a new axis 0, ``(count,
    *shape)``, else concatenated along their first axis, as the samples were (one sample: the output itself).
    Leaving the ``with`` block uncommitted removes everything written. ``keys`` and ``shapes`` describe what was
    written."""

    def __init__(self, path: str | os.PathLike | None, names: Sequence[str], count: int, stacked: bool = True):
        self.path = None if path is None else Path(path)
        self.keys = _keys(names)
        self.count, self.stacked = count, stacked
        self.arrays: list[np.ndarray] = []
        self.shapes: list[tuple[int, ...]] = []
        self._tmp: str | None = None
        if self.path is not None and self.path.suffix == ".npy" and len(names) != 1:
            raise FormatError(f"the model has {len(names)} outputs ({', '.join(names)}); write them to an .npz, "
                              f"an .npy holds one", where=str(self.path))

    def __enter__(self) -> Output:
        return self

    def __exit__(self, *exc) -> None:
        self._clean()

    def write(self, where: slice | np.ndarray, outs: Sequence[np.ndarray]) -> None:
        """Outputs of the samples at ``where`` (a slice with start and stop, or indices), each stacked on axis 0."""
        if not self.arrays:
            self.arrays = [self._array(k, o) for k, o in enumerate(outs)]
        for array, out in zip(self.arrays, outs):
            if self.stacked or out.ndim == 1:
                array[where if array.ndim else ...] = out
                continue
            d = out.shape[1]  # concatenated: sample i's rows are i * d .. i * d + d - 1
            rows = (slice(where.start * d, where.stop * d) if isinstance(where, slice) else
                    (np.asarray(where)[:, None] * d + np.arange(d)).ravel())
            array[rows] = out.reshape(-1, *out.shape[2:])

    def _array(self, k: int, out: np.ndarray) -> np.ndarray:
        one = out.shape[1:]
        shape = ((self.count, *one) if self.stacked or (not one and self.count > 1) else
                 one if not one else (self.count * one[0], *one[1:]))
        self.shapes.append(shape)
        if self.path is None:
            return np.empty(shape, out.dtype)
        try:
            if self._tmp is None:
                self._tmp = tempfile.mkdtemp(dir=self.path.parent, prefix=f".{self.path.name}.")
            return np.lib.format.open_memmap(Path(self._tmp) / f"{k}.npy", "w+", out.dtype, shape)
        except OSError as e:
            raise FormatError(f"cannot write the outputs: {e.strerror or e}", where=str(self.path)) from None

    def commit(self) -> None:
        """Publish the outputs: ``path`` replaced at once (mode 0644 if new, else kept)."""
        if self.path is None:
            return
        try:
            for a in self.arrays:
                a.flush()
            files = [Path(self._tmp) / f"{k}.npy" for k in range(len(self.arrays))]
            if self.path.suffix == ".npy":
                staged = files[0]
            else:
                staged = Path(self._tmp) / "outputs.npz"
                with zipfile.ZipFile(staged, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
                    for key, f in zip(self.keys, files):
                        z.write(f, f"{key}.npy")
            with open(staged, "rb+") as f:
                os.fsync(f.fileno())
            os.chmod(staged, stat.S_IMODE(self.path.stat().st_mode) if self.path.exists() else 0o644)
            os.replace(staged, self.path)
        except OSError as e:
            raise FormatError(f"cannot write the outputs: {e.strerror or e}", where=str(self.path)) from None

    def _clean(self) -> None:
        self.arrays = [a for a in self.arrays if not isinstance(a, np.memmap)]
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def _keys(names: Sequence[str]) -> list[str]:
    """Archive keys: the output names, a repeated one suffixed with its position."""
    keys: list[str] = []
    for k, name in enumerate(names):
        keys.append(name if name not in keys else f"{name}_{k}")
    return keys


# -- one machine --------------------------------------------------------------------------------------------------
def run_many(model: ModelArg, inputs: str | os.PathLike | np.ndarray, output: str | os.PathLike | None = None,
             chunk: int = CHUNK, provider: str = "cpu", threads: int | None = None,
             progress: Progress | None = None, edges: Edges | None = None, workers: int | None = None,
             io_binding: bool | None = None, cuda_graph: bool = False) -> Output:
    """Run ``model`` (a validated CVM graph on the reference executor, or an ONNX model on onnxruntime) over
    the samples in ``inputs`` (an .npy file, a directory of them, or an array), ``chunk`` samples per unit of
    work. With ``output`` the results are written there, else kept in memory: the ``Output`` returned has them
    in ``arrays``, its ``keys`` and ``shapes``. ``edges``: a quantized import's float edges, which take float
    samples and give float32 outputs.

    ``workers`` units run at once on one session (``Runner.units``), each on one onnxruntime thread; default:
    one per usable CPU for an ONNX model on the CPU when ``threads`` is not given, else 1 (then ``threads`` is
    onnxruntime's, see ``sessions.session``). Units of a few samples on every core are faster than one batch
    over all cores: each unit's tensors stay in its core's caches (benchmarks/bench.py). ``io_binding`` and
    ``cuda_graph``: see ``Plan`` (on CUDA the data of each call stays on the GPU between its nodes)."""
    if workers is None:
        cpu_onnx = provider == "cpu" and threads is None and isinstance(model, onnx.ModelProto)
        workers = sessions.usable_cpus() if cpu_onnx else 1
    if workers < 1:
        raise RuntimeFailure(f"the number of workers must be >= 1, got {workers}")
    if cuda_graph and provider != "cuda":
        raise RuntimeFailure("a CUDA graph needs provider 'cuda'")
    if cuda_graph and workers > 1:  # one captured graph replays one set of buffers: one caller at a time
        raise RuntimeFailure(f"a CUDA graph runs one call at a time; got {workers} workers")
    p, data = planned(model, inputs, chunk, provider=provider, threads=1 if workers > 1 else threads, edges=edges,
                      io_binding=io_binding, cuda_graph=cuda_graph)
    runner = Runner(p)

    with Output(output, p.names, data.count, data.stacked) as out:
        for where, outs in runner.units(data, chunk, workers):
            out.write(where, outs)
            if progress:
                progress(where.stop, data.count, "samples")
        out.commit()
    return out


def planned(model: ModelArg, inputs: str | os.PathLike | np.ndarray, chunk: int, **how) -> tuple[Plan, Samples]:
    """The plan (``plan(model, chunk, **how)``) and the samples it runs; the batch is no larger than their
    count, so that no call pads beyond the samples there are."""
    p = plan(model, chunk, **how)
    data = samples(inputs, p.sample)
    if data.count == 0:
        raise RuntimeFailure("the input holds no samples")
    return (plan(model, data.count, **how) if p.batch > data.count else p), data
