"""CVM -> ONNX conversion through checked stages, with a report: every stage timed, every CVM op with the ONNX form
it was converted to, sizes. Rendered as Markdown (``--report``) and as a short terminal summary.

Stages, in order: read, validate, convert, onnx checker (full_check), strict shape inference, onnxruntime load,
exact comparison (only when asked), write. The .onnx file is written only when every stage before passed.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import onnx
import onnxruntime

from .constants import DOMAIN, __version__
from .api import write_onnx
from .batch import batched
from .converters.to_onnx import to_onnx
from .errors import Problem, RuntimeFailure
from .format import read_model
from .format.model_dir import read_symbol_text
from .graph import Graph
from .native import DOMAIN as NATIVE_DOMAIN
from .runtime import session
from .validate import validate
from .verify import Progress, Verdict, verify

STAGES = ["read", "validate", "convert", "onnx checker (full_check)", "strict shape inference", "onnxruntime load",
          "exact comparison", "write"]


@dataclass
class Stage:
    name: str
    status: str  # "passed", "failed" or "skipped"
    seconds: float = 0.0
    detail: str = ""


@dataclass
class OpForm:
    """How one CVM op was converted: ``nodes`` CVM nodes, as ``form``; ``primitives``: the distinct ONNX op types
    its bodies use besides Constant; ``onnx_nodes``: their primitive nodes counted per call (the flat form's)."""

    op: str
    nodes: int
    form: str
    primitives: list[str]
    onnx_nodes: int


@dataclass
class Report:
    """The stages run (a failed one ends the run; ``error`` holds its exception), the op table and sizes."""

    source: str
    output: str
    stages: list[Stage] = field(default_factory=list)
    ops: list[OpForm] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    warnings: list[Problem] = field(default_factory=list)
    verdict: Verdict | None = None
    error: Exception | None = None

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.stages)

    def markdown(self) -> str:
        out = [f"# Conversion report: {self.source} -> {self.output}", "",
               f"cvm-onnx {__version__}, onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}. "
               + ("Every stage passed." if self.error is None else f"**Failed**: {self.error}"), "",
               "## Stages", "", "| stage | result | time | details |", "|---|---|---:|---|"]
        out += [f"| {s.name} | {s.status} | {_ms(s)} | {_cell(s.detail)} |" for s in self.stages]
        if self.ops:
            out += ["", "## Operators", "",
                    ("Primitive ONNX ops: the distinct op types of the op's function bodies, besides Constant. ONNX "
                     "nodes: the primitive nodes of all its calls, as in the flat form (`--inline`)."), "",
                    "| CVM op | CVM nodes | converted as | primitive ONNX ops | ONNX nodes |", "|---|---:|---|---|---:|"]
            out += [f"| {o.op} | {o.nodes} | {o.form} | {', '.join(o.primitives) or '-'} | {o.onnx_nodes} |"
                    for o in self.ops]
            out.append(f"| **total** | {sum(o.nodes for o in self.ops)} | | | {sum(o.onnx_nodes for o in self.ops)} |")
        if self.sizes or self.counts:
            out += ["", "## Sizes", "", "| | |", "|---|---:|"]
            out += [f"| {k} | {_bytes(v)} |" for k, v in self.sizes.items()]
            out += [f"| {k} | {v} |" for k, v in self.counts.items()]
        if self.warnings:
            out += ["", "## Validation warnings", ""] + [f"- {_cell(str(w))}" for w in self.warnings]
        if self.verdict is not None:
            out += ["", "## Exact comparison", "", "```", str(self.verdict), "```"]
        return "\n".join(out) + "\n"

    def summary(self) -> list[str]:
        passed = [s.name for s in self.stages if s.status == "passed"]
        head = (f"converted {self.source} -> {self.output}" if self.error is None
                else f"conversion of {self.source} failed")
        out = [f"{head} in {self.seconds:.2f} s", f"  stages passed: {', '.join(passed) or 'none'}"]
        out += [f"  stage failed: {s.name}" for s in self.stages if s.status == "failed"]
        if self.ops:
            kinds = ", ".join(f"{o.op} x{o.nodes}" for o in self.ops)
            out.append(f"  {sum(o.nodes for o in self.ops)} CVM op nodes ({kinds})")
        if "ONNX model" in self.sizes:
            out.append(f"  ONNX model {_bytes(self.sizes['ONNX model'])}, "
                       + ", ".join(f"{v} {k}" for k, v in self.counts.items()))
        if self.verdict is not None:
            out += ["  " + s for s in self.verdict.lines()]
        return out


def _ms(s: Stage) -> str:
    return "" if s.status == "skipped" else f"{s.seconds * 1000:.0f} ms"


def _bytes(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MiB"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def op_forms(graph: Graph, model: onnx.ModelProto) -> list[OpForm]:
    """The op table of an exported model (function or flat form), one row per CVM op in the graph."""
    functions = {(f.domain, f.name, f.overload): f for f in model.functions}
    op_of = {n.name: n.op for n in graph.nodes if not n.is_variable}
    forms: dict[str, set[str]] = {}
    overloads: dict[str, set[str]] = {}
    types: dict[str, set[str]] = {}
    sizes: dict[str, int] = {}
    for n in model.graph.node:
        marks = {p.key: p.value for p in n.metadata_props}
        if n.domain == DOMAIN:
            op, body, form = n.op_type, functions[(n.domain, n.op_type, n.overload)].node, f"function {DOMAIN}::"
            overloads.setdefault(op, set()).add(n.overload)
        elif n.domain == NATIVE_DOMAIN:
            op, body, form = op_of[n.name], [n], f"native custom op {NATIVE_DOMAIN}::{n.op_type}"
        elif "cvm.op" in marks:
            op, body, form = marks["cvm.op"], [n], "inlined (flat form)"
        elif "cvm.ops" in marks:  # a fused run of the optimized form: counted once, under its last op
            *others, op = json.loads(marks["cvm.ops"])
            body, form = [n], "fused run (optimized form)"
            for other in others:
                forms.setdefault(other, set()).add(form)
                types.setdefault(other, set()).update({n.op_type} - {"Constant"})
        else:
            continue  # the input clamp, head aliases, int8 params' widening
        forms.setdefault(op, set()).add(form)
        types.setdefault(op, set()).update(b.op_type for b in body if b.domain in ("", "ai.onnx") and
                                           b.op_type != "Constant")
        sizes[op] = sizes.get(op, 0) + len(body)
    rows = []
    for op, count in graph.op_counts().items():
        k = len(overloads.get(op, ()))
        form = sorted(f + op + (f" ({k} overloads)" if k > 1 else "") if f.endswith("::") else f
                      for f in forms.get(op, {"-"}))
        rows.append(OpForm(op, count, " / ".join(form), sorted(types.get(op, ())), sizes.get(op, 0)))
    return rows


def _source_files(src: Path, params: str | os.PathLike | None) -> dict[str, Path]:
    return {"CVM symbol": src / "symbol" if src.is_dir() else src,
            "CVM params": Path(params) if params is not None else src / "params"}


def convert_checked(src: str | os.PathLike, dst: str | os.PathLike, params: str | os.PathLike | None = None,
                    inline: bool = False, verify_seeds: int | None = None, provider: str = "cpu",
                    progress: Progress | None = None, batch: int | None = None,
                    optimize: bool = False) -> Report:
    """Convert the CVM model ``src`` to ``dst`` (.onnx) through the stages above and return the report. A failing
    stage ends the run: its exception is ``report.error`` (not raised) and nothing is written.
    ``verify_seeds``: run the exact comparison with that many random inputs (besides 0 and the extremes).
    ``batch``, ``optimize``: as in ``to_onnx`` (the comparison then runs the batched CVM graph)."""
    report = Report(os.fspath(src), os.fspath(dst))
    state: dict = {}

    def read():
        state["graph"] = read_model(src, params)
        state["symbol"] = read_symbol_text(src, params)
        report.sizes.update({k: p.stat().st_size for k, p in _source_files(Path(src), params).items()})
        g = state["graph"]
        return f"{len(g.nodes)} nodes, {len(g.params)} params"

    def check():
        v = validate(state["graph"])
        state["graph"], report.warnings = v.graph, v.warnings
        return f"{len(v.warnings)} warning(s)"

    def convert():
        single = state["graph"]
        g = state["graph"] = single if batch is None else batched(single, batch)
        model = state["model"] = to_onnx(single, inline=inline, batch=batch, optimize=optimize,
                                         symbol=state["symbol"] if batch is None else None)
        state["bytes"] = model.SerializeToString(deterministic=True)
        report.ops = op_forms(g, model)
        report.sizes["ONNX model"] = len(state["bytes"])
        report.counts = {"ONNX graph nodes": len(model.graph.node), "ONNX functions": len(model.functions),
                         "primitive ONNX nodes of the CVM ops": sum(o.onnx_nodes for o in report.ops)}
        form = "optimized flat" if optimize else "flat" if inline else "function"
        return f"{form} form{f', batch {batch}' if batch is not None else ''}, opset {model.opset_import[0].version}"

    def checker():
        onnx.checker.check_model(state["model"], full_check=True)

    def shapes():
        onnx.shape_inference.infer_shapes(state["model"], check_type=True, strict_mode=True, data_prop=True)

    def load():
        session(state["bytes"], provider)
        return f"onnxruntime {onnxruntime.__version__}, {provider}"

    def compare():
        def step(done, total, what):
            if progress:
                progress(len(report.stages), len(STAGES), f"exact comparison: {what}")

        verdict = report.verdict = verify(state["graph"], onnx_model=state["model"], seeds=verify_seeds,
                                          provider=provider, progress=step)
        if not verdict.exact:
            d = verdict.divergence
            raise RuntimeFailure(f"not exact on input {verdict.failed_case!r}"
                                 + (f": the first differing node is {d.node} ({d.op})" if d else ""))
        return f"{len(verdict.cases)} inputs: {', '.join(verdict.cases)}"

    def write():
        write_onnx(state["model"], dst)

    steps: list[Callable[[], str | None]] = [read, check, convert, checker, shapes, load, compare, write]
    for k, (name, step) in enumerate(zip(STAGES, steps)):
        if step is compare and verify_seeds is None:
            report.stages.append(Stage(name, "skipped", detail="ask with --verify"))
            continue
        if progress:
            progress(k, len(STAGES), name)
        start = time.perf_counter()
        try:
            detail = step() or ""
        except Exception as e:  # recorded, and handed to the caller in report.error
            report.stages.append(Stage(name, "failed", time.perf_counter() - start, str(e)))
            report.error = e
            return report
        report.stages.append(Stage(name, "passed", time.perf_counter() - start, detail))
    if progress:
        progress(len(STAGES), len(STAGES), "done")
    return report
