"""CVM -> ONNX conversion as one list of named stages, run plain (``api.convert``) or timed (``convert --report``).

Each stage reads what the stages before it made and records what it makes on the ``Conversion``:

    read      the symbol and params files -> the graph (and the symbol's text, kept for the round trip)
    validate  the runtime's load-time rules -> the typed graph and its portability warnings
    batch     (with a batch size) the input's first dimension 1 becomes N, where every op keeps it
    export    the graph -> the ONNX model (function, flat or serving form)
    check     (when asked) the ONNX checker (full_check), strict shape inference and an onnxruntime session
    compare   (when asked) the exported model against the reference executor, element for element
    write     the .onnx file, atomically

A stage that is not asked for is skipped. The file is written last, so nothing is written unless every stage
before passed.
"""
from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

import onnx
import onnxruntime

from cvm_onnx.converters.to_onnx.export import Export, export
from cvm_onnx.core.batch import batched
from cvm_onnx.core.errors import Problem, RuntimeFailure
from cvm_onnx.core.format import Edges, read_edges, read_model
from cvm_onnx.core.format.edges import FILE
from cvm_onnx.core.format.model_dir import read_symbol_text
from cvm_onnx.core.format.onnx_file import write_onnx
from cvm_onnx.core.gas import Gas
from cvm_onnx.core.graph import Graph
from cvm_onnx.core.validate import validate
from cvm_onnx.runtime.placement import without_cuda_kernel
from cvm_onnx.runtime.sessions import layout_choice, session
from cvm_onnx.runtime.verify import Progress, Verdict, verify
from cvm_onnx.serving.target import Target


@dataclass
class StageRun:
    """How one stage went in a timed run: "passed", "failed" or "skipped", its time and a one-line detail."""

    name: str
    status: str
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Conversion:
    """One CVM -> ONNX conversion: what is asked (``src`` a model directory or symbol file, ``params``, ``dst``,
    the form; ``check``: run the check stage; ``seeds``: run the comparison with that many random inputs besides
    0 and the extremes), what the stages made, and in a timed run how each stage went and the error that ended
    the run."""

    src: str | os.PathLike
    dst: str | os.PathLike
    params: str | os.PathLike | None = None
    inline: bool = False
    batch: int | None = None
    optimize: bool = False
    float_io: bool = False  # a quantized model's float edges in the graph: float32 input and outputs
    check: bool = False
    seeds: int | None = None
    provider: str = "cpu"
    target: str = "cpu"  # the serving form's target (Target.named: "cuda" or "native" imply it; checked on ``provider``)
    graph: Graph | None = None
    symbol: str | None = None
    edges: Edges | None = None  # a quantized import's float edges (the directory's quantization.json)
    warnings: list[Problem] = field(default_factory=list)
    gas: Gas | None = None  # the CVM model's (before any batch), from the validate stage
    model: onnx.ModelProto | None = None
    exported: Export | None = None  # the export stage's record: the model, its conv2d routes and passes
    placement: str = ""  # the CUDA form's: whether every node has a CUDA kernel (runtime.placement)
    verdict: Verdict | None = None
    stages: list[StageRun] = field(default_factory=list)
    error: Exception | None = None

    @property
    def form(self) -> str:
        form = "CUDA serving" if self.target == "cuda" else "native serving" if self.target == "native" else \
            "optimized flat" if self.optimize else "flat" if self.inline else "function"
        return f"{form} form" + (f", batch {self.batch}" if self.batch is not None else "") + (
            ", float input and outputs" if self.float_io else "")


def _read(c: Conversion, progress: Progress | None) -> str:
    c.graph = read_model(c.src, c.params)
    c.symbol = read_symbol_text(c.src, c.params)
    c.edges = read_edges(c.src) if os.path.isdir(c.src) else None
    return f"{len(c.graph.nodes)} nodes, {len(c.graph.params)} params"


def _validate(c: Conversion, progress: Progress | None) -> str:
    v = validate(c.graph)
    c.graph, c.warnings, c.gas = v.graph, v.warnings, v.gas
    if c.edges is not None:
        c.edges.fit(c.graph, os.path.join(c.src, FILE))
    return f"{len(v.warnings)} warning(s); {v.gas.line()}"


def _batch(c: Conversion, progress: Progress | None) -> str:
    c.graph = batched(c.graph, c.batch)
    return ", ".join(f"input {c.graph.nodes[i].name} {c.graph.nodes[i].outputs[0].shape}" for i in c.graph.inputs)


def _native_layout(c: Conversion, target: Target) -> tuple[Target, str]:
    """``target`` (this machine's) with the layout a session here takes for the model (``layout_choice``: the
    route cache's, else measured), and a note saying which; as it was where there is no layout to choose."""
    probe = export(c.graph, replace(target, layout="session", operands="u8u8", isa="any"), inline=c.inline,
                   batch=c.batch, symbol=c.symbol, edges=c.edges, batched=c.batch is not None, float_io=c.float_io)
    choice = layout_choice(probe.model)
    if choice is None:
        return target, ""
    source = "from the route cache" if choice.source == "cache" else "measured here"
    return replace(target, layout=choice.layout), f"; layout {choice.layout}, {source} ({choice.timed()})"


def _export(c: Conversion, progress: Progress | None) -> str:
    target = Target.named(c.target) if c.optimize or c.target != "cpu" else None
    chosen = ""
    if c.target == "native" and target.cpu_integer:
        target, chosen = _native_layout(c, target)
    c.exported = export(c.graph, target, inline=c.inline, batch=c.batch, symbol=c.symbol, edges=c.edges,
                        batched=c.batch is not None, float_io=c.float_io)
    c.model = c.exported.model
    passes = ("; passes: " + ", ".join(c.exported.passes) if c.exported.passes else "") + chosen
    routes = Counter(route for _, route, _ in c.exported.routes)
    placed = ""
    if c.target == "cuda":  # a node without a CUDA kernel would run on the CPU provider: a warning naming it
        missing = without_cuda_kernel(c.model)
        c.warnings += [Problem(p.where, f"runs on the CPU provider: {p.rule}") for p in missing]
        c.placement = f"{len(missing)} node(s) without a CUDA kernel" if missing else "every node a CUDA kernel"
        placed = f"; {c.placement}"
    return f"{c.form}, opset {c.model.opset_import[0].version}{passes}" + (
        "; convolutions: " + ", ".join(f"{n} {route}" for route, n in routes.items()) if routes else "") + placed


def _check(c: Conversion, progress: Progress | None) -> str:
    onnx.checker.check_model(c.model, full_check=True)
    onnx.shape_inference.infer_shapes(c.model, check_type=True, strict_mode=True, data_prop=True)
    session(c.model.SerializeToString(deterministic=True), c.provider)
    return f"ONNX checker (full_check), strict shape inference, onnxruntime {onnxruntime.__version__} ({c.provider})"


def _compare(c: Conversion, progress: Progress | None) -> str:
    def step(done: int, total: int, what: str) -> None:
        if progress:
            progress(STAGES.index(COMPARE), len(STAGES), f"compare: {what}")

    verdict = c.verdict = verify(c.graph, onnx_model=c.model, seeds=c.seeds, provider=c.provider, progress=step,
                                 edges=c.edges if c.float_io else None)
    if not verdict.exact:
        d = verdict.divergence
        raise RuntimeFailure(f"not exact on input {verdict.failed_case!r}"
                             + (f": the first differing node is {d.node} ({d.op})" if d else ""))
    return f"{len(verdict.cases)} inputs: {', '.join(verdict.cases)}"


def _write(c: Conversion, progress: Progress | None) -> str:
    write_onnx(c.model, c.dst)
    return os.fspath(c.dst)


@dataclass(frozen=True)
class Stage:
    """A named stage: ``run`` makes its part of the conversion and returns a detail line; ``wanted`` says whether
    this conversion asks for it (else ``skipped`` says why in a timed run)."""

    name: str
    run: Callable[[Conversion, Progress | None], str]
    wanted: Callable[[Conversion], bool] = lambda c: True
    skipped: str = ""


COMPARE = Stage("compare", _compare, lambda c: c.seeds is not None, "ask with --verify")
STAGES: list[Stage] = [
    Stage("read", _read),
    Stage("validate", _validate),
    Stage("batch", _batch, lambda c: c.batch is not None, "ask with --batch N"),
    Stage("export", _export),
    Stage("check", _check, lambda c: c.check, "asked with --report or --verify"),
    COMPARE,
    Stage("write", _write),
]


def run(c: Conversion, timed: bool = False, progress: Progress | None = None) -> Conversion:
    """Run the stages the conversion asks for, in order. Plain: the first failure raises. Timed: every stage is
    recorded in ``c.stages`` (time, outcome, detail), and a failure ends the run as ``c.error`` instead of
    raising. ``progress(done, total, what)`` is called before each stage."""
    for k, stage in enumerate(STAGES):
        if not stage.wanted(c):
            if timed:
                c.stages.append(StageRun(stage.name, "skipped", detail=stage.skipped))
            continue
        if progress:
            progress(k, len(STAGES), stage.name)
        if not timed:
            stage.run(c, progress)
            continue
        start = time.perf_counter()
        try:
            detail = stage.run(c, progress)
        except Exception as e:  # noqa: BLE001  (recorded, and handed to the caller in c.error)
            c.stages.append(StageRun(stage.name, "failed", time.perf_counter() - start, str(e)))
            c.error = e
            return c
        c.stages.append(StageRun(stage.name, "passed", time.perf_counter() - start, detail))
    if progress:
        progress(len(STAGES), len(STAGES), "done")
    return c
