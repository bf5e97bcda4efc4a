"""The route cache: the layout a session measured fastest for a model on this CPU, remembered so that every later
session of that model here takes it without measuring again (``choose``).

A measurement (``measure``) times each candidate layout's session on zeros in its steady state: every candidate
run untimed first (a session's first runs pay one-time costs), then the candidates alternated over rounds (each
round a median of a few runs after an untimed one, a candidate's time its best round: a shared machine slows whole
stretches), and keeps the fastest. It is remembered under a ``RouteKey``: the CPU (its model name and the features
the native library reads), the model (``model_digest``: its operators, attributes, input shapes and the types and
shapes of its weights, not their values), the intra-op threads, the operand types, the software that runs it
(cvm-onnx's and onnxruntime's versions and a digest of the native library) and the measurement's version
(``MEASUREMENT``): a different CPU, model, thread count or build is measured anew, and so is a choice an earlier
measurement made.

The file is ``routes.json`` in ``cache_dir()``: the directory ``CVM_ONNX_CACHE_DIR`` names, else
``$XDG_CACHE_HOME/cvm-onnx``, else ``~/.cache/cvm-onnx``; ``CVM_ONNX_NO_CACHE`` set (to anything but "" or "0")
turns the cache off (every session measures). A file that cannot be read, or holds something else, and a
directory that cannot be written are ignored with a ``RuntimeWarning``, never an error: the session measures, and
a measurement rewrites a damaged file. It keeps the ``MAX_ENTRIES`` routes stored last.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from cvm_onnx.core.constants import __version__
from cvm_onnx.core.format.onnx_file import dims
from cvm_onnx.native import cpu, library_path

FILE = "routes.json"
FORMAT = 1
MAX_ENTRIES = 256
MEASUREMENT = 2  # the version of ``measure``, part of every key: a choice another version made is measured anew
WARMUP, ROUNDS, REPEAT = 3, 4, 5  # measure's untimed runs of each candidate, rounds, and timed runs in a round


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def batched_input(model: onnx.ModelProto) -> bool:
    """Whether an input's first dimension is larger than one (or symbolic)."""
    return any((d := dims(vi)) and (d[0] is None or d[0] > 1) for vi in model.graph.input)


def default_threads(model: onnx.ModelProto) -> int:
    """The intra-op threads a session of ``model`` gets unless told: one for one sample, every usable CPU for a
    batched model (``runtime.sessions``)."""
    return usable_cpus() if batched_input(model) else 1


def cache_dir() -> Path | None:
    """The cache's directory, or None where ``CVM_ONNX_NO_CACHE`` turns it off."""
    if os.environ.get("CVM_ONNX_NO_CACHE", "") not in ("", "0"):
        return None
    if os.environ.get("CVM_ONNX_CACHE_DIR"):
        return Path(os.environ["CVM_ONNX_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cvm-onnx"


@cache
def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_key() -> str:
    """This CPU as the cache tells CPUs apart: its model name and the features the kernels choose by."""
    return f"{cpu_name()} [{' '.join(cpu.features()) or 'no x86 features'}]"


@cache
def software() -> str:
    """The versions that run a route, the native library by the digest of its bytes (a rebuild is measured anew)."""
    path = library_path()
    library = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16] if path else "none"
    return f"cvm-onnx {__version__}, onnxruntime {ort.__version__}, library {library}"


def _attribute(a: onnx.AttributeProto) -> object:
    """An attribute's value for the digest: a tensor by its type and shape alone, a subgraph as a graph."""
    if a.type == onnx.AttributeProto.TENSOR:
        return ["tensor", a.t.data_type, list(a.t.dims)]
    if a.type == onnx.AttributeProto.GRAPH:
        return _graph(a.g)
    if a.type == onnx.AttributeProto.GRAPHS:
        return [_graph(g) for g in a.graphs]
    value = onnx.helper.get_attribute_value(a)
    if isinstance(value, list):
        return [v.decode(errors="replace") if isinstance(v, bytes) else v for v in value]
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _graph(g: onnx.GraphProto) -> dict:
    return {"inputs": [[vi.name, vi.type.tensor_type.elem_type, dims(vi)] for vi in g.input],
            "weights": [[t.name, t.data_type, list(t.dims)] for t in g.initializer],
            "nodes": [[n.op_type, n.domain, list(n.input), list(n.output),
                       [[a.name, _attribute(a)] for a in n.attribute]] for n in g.node]}


def model_digest(model: onnx.ModelProto) -> str:
    """A digest of what a route's speed depends on: the graph's inputs (types and shapes), its nodes (operator,
    domain, inputs and outputs, attributes) and the type and shape of each weight, not the weights' values."""
    text = json.dumps({**_graph(model.graph), "opsets": [[o.domain, o.version] for o in model.opset_import]},
                      default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class RouteKey:
    """What a remembered route holds for: the CPU, the model, the intra-op threads, the operand types, the software,
    and the version of the measurement that chose it."""

    cpu: str
    model: str
    threads: int
    operands: str
    software: str
    measurement: int = MEASUREMENT

    @classmethod
    def of(cls, model: onnx.ModelProto, threads: int, operands: str) -> RouteKey:
        """The key of ``model`` (the form before its layout passes) run here with ``threads`` and ``operands``."""
        return cls(cpu_key(), model_digest(model), threads, operands, software())

    def text(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Choice:
    """The layout taken, each candidate's time (ms) and where the choice came from: "cache" or "measured"."""

    layout: str
    times: dict[str, float]
    source: str

    def timed(self) -> str:
        """Each candidate's time, as text."""
        return ", ".join(f"{k} {ms:.3f} ms" for k, ms in self.times.items())

    def note(self) -> str:
        """The choice as the session's ``cvm.routes`` records it."""
        where = "measured at session creation" if self.source == "measured" else \
            "from the route cache (measured on this CPU)"
        return f"layout {where}: {self.timed()}, {self.layout} taken"


def _read(directory: Path) -> dict[str, dict]:
    """The cache's entries (none where the file is absent; a warning and none where it cannot be read)."""
    path = directory / FILE
    try:
        text = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # nothing stored (yet)
        return {}
    except OSError as e:
        warnings.warn(f"route cache {path} cannot be read ({e}): ignored, the layouts are measured", RuntimeWarning,
                      stacklevel=3)
        return {}
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("routes"), dict):
            raise ValueError(f"not a route cache of format {FORMAT}")
        return data["routes"]
    except ValueError as e:  # (a UnicodeDecodeError too)
        warnings.warn(f"route cache {path} is damaged ({e}): ignored, the layouts are measured and it is rewritten",
                      RuntimeWarning, stacklevel=3)
        return {}


def _entry(value: object) -> Choice | None:
    """The stored choice of one entry, or None where it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("layout"), str) or \
            not isinstance(value.get("ms"), dict) or value["layout"] not in value["ms"] or \
            not all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in value["ms"].items()):
        return None
    return Choice(value["layout"], {k: float(v) for k, v in value["ms"].items()}, "cache")


def lookup(key: RouteKey) -> Choice | None:
    """The choice remembered for ``key``, or None (none stored, the cache off or unreadable)."""
    directory = cache_dir()
    return None if directory is None else _entry(_read(directory).get(key.text()))


def remember(key: RouteKey, choice: Choice) -> None:
    """Store ``choice`` for ``key`` (the file replaced whole; a warning where it cannot be written)."""
    directory = cache_dir()
    if directory is None:
        return
    routes = _read(directory)
    routes.pop(key.text(), None)
    routes[key.text()] = {"layout": choice.layout, "ms": choice.times, "cpu": key.cpu, "threads": key.threads,
                          "operands": key.operands, "software": key.software, "measurement": key.measurement,
                          "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    kept = dict(list(routes.items())[-MAX_ENTRIES:])
    temporary = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=directory, prefix=".routes.", suffix=".tmp", delete=False) as f:
            temporary = f.name
            json.dump({"format": FORMAT, "routes": kept}, f, indent=1)
        os.replace(temporary, directory / FILE)
    except OSError as e:
        warnings.warn(f"route cache {directory / FILE} cannot be written ({e}): the choice is not remembered",
                      RuntimeWarning, stacklevel=3)
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)


def measure(runs: Mapping[str, Callable[[], object]], clock: Callable[[], float] = time.perf_counter,
            warmup: int = WARMUP, rounds: int = ROUNDS, repeat: int = REPEAT) -> Choice:
    """Time each candidate's ``runs[k]()`` in its steady state and take the fastest (the first of equal times).
    Every candidate is first called ``warmup`` times untimed, before any is timed: a session's first runs pay
    one-time costs (onnxruntime's arena and memory plan, the kernels' thread-local buffers, pages touched the first
    time). Then ``rounds`` rounds over the candidates in turn, each candidate's turn one untimed call (its data back
    in the caches after another candidate's) and the median of ``repeat`` timed calls; a candidate's time is its
    best round."""
    for run in runs.values():
        for _ in range(warmup):
            run()
    best = {k: float("inf") for k in runs}
    for _ in range(rounds):
        for k, run in runs.items():
            run()
            times = []
            for _ in range(repeat):
                t = clock()
                run()
                times.append(clock() - t)
            best[k] = min(best[k], 1e3 * float(np.median(times)))
    return Choice(min(best, key=best.get), best, "measured")


def choose(key: RouteKey, candidates: Callable[[], Mapping[str, Callable[[], object]]], layouts: tuple[str, ...],
           fresh: bool = False, clock: Callable[[], float] = time.perf_counter) -> Choice:
    """The layout for ``key`` among ``layouts``: the one remembered (unless ``fresh``), else the fastest of the
    runs ``candidates()`` makes (``measure``; those it could make), remembered."""
    if not fresh and (known := lookup(key)) is not None and known.layout in layouts:
        return known
    choice = measure(candidates(), clock)
    remember(key, choice)
    return choice
