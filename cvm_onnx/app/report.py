"""The conversion report of a timed run (``pipeline.run(..., timed=True)``), rendered as Markdown (``--report``)
and as a short terminal summary: every stage with its time, every CVM op with the ONNX form it was converted to,
sizes, the model's gas, warnings and the comparison's verdict. It renders; it runs nothing."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import onnx
import onnxruntime

from cvm_onnx.converters.from_onnx import Imported
from cvm_onnx.core.constants import DOMAIN, MARK_OP, MARK_OPS, __version__
from cvm_onnx.core.format.model_dir import model_files
from cvm_onnx.core.gas import Gas
from cvm_onnx.core.graph import Graph
from cvm_onnx.native import DOMAIN as NATIVE_DOMAIN
from cvm_onnx.native.cpu import products
from cvm_onnx.serving.routes import Route, route_map

from .pipeline import Conversion, StageRun


@dataclass
class OpForm:
    """How one CVM op was converted: ``nodes`` CVM nodes, as ``form``; ``primitives``: the distinct ONNX op types
    its bodies use besides Constant; ``onnx_nodes``: their primitive nodes counted per call (the flat form's)."""

    op: str
    nodes: int
    form: str
    primitives: list[str]
    onnx_nodes: int


class Report:
    """What a timed conversion shows: its stages (a failed one ended the run, ``error``), the op table and sizes."""

    def __init__(self, c: Conversion):
        self.source, self.output = str(c.src), str(c.dst)
        self.stages: list[StageRun] = c.stages
        self.warnings, self.verdict, self.error = c.warnings, c.verdict, c.error
        self.placement = c.placement
        self.gas: Gas | None = c.gas
        self.sizes: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.ops: list[OpForm] = []
        self.routes: list[Route] = []
        if any(s.name == "read" and s.status == "passed" for s in self.stages):
            files = model_files(c.src, c.params)
            self.sizes = {"CVM symbol": files[0].stat().st_size, "CVM params": files[1].stat().st_size}
        if c.model is not None:
            self.ops = op_forms(c.graph, c.model)
            self.routes = route_map(c.model)
            self.sizes["ONNX model"] = c.model.ByteSize()
            self.counts = {"ONNX graph nodes": len(c.model.graph.node), "ONNX functions": len(c.model.functions),
                           "primitive ONNX nodes of the CVM ops": sum(o.onnx_nodes for o in self.ops)}

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
        if self.routes:
            out += ["", "## Convolution routes (serving form)", "",
                    ("Integer products: native im2col + MatMulInteger, as uint8 x int8 where this CPU computes it "
                     f"exactly (rows of x >= 0 on every x86 CPU, all with VNNI), else uint8 x uint8 (this CPU: "
                     f"{products()}). Per-channel scale: multiplied in its "
                     "run's requantize. Float32/int32 products: ONNX Conv where float32 is exact, else the core "
                     "form (docs/semantics.md). Layout, kernel, ISA and chain: what computes it on this machine "
                     "(cvm_onnx.serving.routes); path: how the CPU kernels run the chain (compiled for its kinds, "
                     "kinds at run time, or one loop per step)."), "",
                    "| conv2d | route | why not integer products | layout | kernel | ISA | chain | path |",
                    "|---|---|---|---|---|---|---|---|"]
            out += [f"| {r.conv} | {r.route} | {_cell(r.why) or '-'} | {r.layout} | {_cell(r.kernel)} | {r.isa} | "
                    f"{_cell(r.chain)} | {_cell(r.path)} |" for r in self.routes]
        if self.sizes or self.counts:
            out += ["", "## Sizes", "", "| | |", "|---|---:|"]
            out += [f"| {k} | {_bytes(v)} |" for k, v in self.sizes.items()]
            out += [f"| {k} | {v} |" for k, v in self.counts.items()]
        if self.gas is not None:
            out += ["", "## Gas", "", f"The CVM model's {self.gas.line()}."]
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
        if self.gas is not None:
            out.append(f"  the CVM model's {self.gas.line()}")
        if "ONNX model" in self.sizes:
            out.append(f"  ONNX model {_bytes(self.sizes['ONNX model'])}, "
                       + ", ".join(f"{v} {k}" for k, v in self.counts.items()))
        if self.placement:
            out.append(f"  CUDA provider: {self.placement}")
        if self.verdict is not None:
            out += ["  " + s for s in self.verdict.lines()]
        return out


def _ms(s: StageRun) -> str:
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
        elif n.domain == NATIVE_DOMAIN and MARK_OPS not in marks:  # not a fused run's im2col
            op, body, form = op_of[n.name], [n], f"native custom op {NATIVE_DOMAIN}::{n.op_type}"
        elif MARK_OP in marks:
            op, body, form = marks[MARK_OP], [n], "inlined (flat form)"
        elif MARK_OPS in marks:  # a fused run of the optimized form: counted once, under its last op
            *others, op = json.loads(marks[MARK_OPS])
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


def gas_lines(imported: Imported, gas: Gas, one_part: Gas | None = None) -> list[str]:
    """The gas of an import; the share of the ONNX nodes whose requantization takes runs of channels or products
    in parts (two or more; their CVM nodes, params included); with ``one_part`` (the gas of the one-part
    import), the difference."""
    out = [gas.line()]
    origins = {where.rpartition(" (")[0]: set(names) for where, names in imported.origins}
    for what, picked in (("runs of channels", [r for r in imported.requants if r.runs]),
                         ("products in parts", [r for r in imported.requants if any(p.split for p in r.plans)])):
        if picked:
            names = set().union(*(origins.get(r.node, set()) for r in picked))
            out.append(f"  the {len(picked)} requantization(s) in {what} ({', '.join(r.node for r in picked[:3])}"
                       f"{', ...' * (len(picked) > 3)}): gas {gas.of(names)}, their ONNX nodes' CVM nodes")
    if one_part is not None:
        out.append(f"  in one-part products the same model's gas is {one_part.total} (ops {one_part.ops}, memory "
                   f"{one_part.memory}): products in parts add {gas.total - one_part.total:+d}")
    return out


def import_markdown(src: str | os.PathLike, dst: str | os.PathLike, imported: Imported, gas: Gas,
                    one_part: Gas | None = None, layers: list[str] | None = None) -> str:
    """The report of an ONNX -> CVM import: which CVM ops each ONNX node became, the gas (``gas_lines``) and, for
    a quantized model, every requantization (its ratios M, multipliers, shifts, and the worst distance from the
    exact value, in output steps: 1/2 for the rounding plus the approximation of M; docs/import.md); ``layers``:
    the per-tensor distances measured on samples (``layers.markdown``)."""
    g = imported.graph
    out = [f"# Import report: {src} -> {dst}", "",
           f"cvm-onnx {__version__}, onnx {onnx.__version__}. {sum(not n.is_variable for n in g.nodes)} CVM op nodes, "
           f"{len(g.params)} params.", "", "## Gas", "",
           *[f"- {t.strip()}" for t in gas_lines(imported, gas, one_part)],
           "", "## ONNX nodes and the CVM ops they became", "",
           "| ONNX node | CVM ops |", "|---|---|"]
    kinds = {n.name: n.op for n in g.nodes}
    for where, names in imported.origins:
        ops = [f"{kinds[n]} `{n}`" for n in names if n in kinds and kinds[n] != "null"]
        out.append(f"| {_cell(where)} | {_cell(', '.join(ops)) or '(none: a name, a constant or a scale)'} |")
    if imported.requants:
        out += ["", "## Requantizations", "",
                "r = round_half_up(sum v * m / 2^k) after an optional clip and pre-shift s (round_half_even where "
                "marked: m / 2^k = M exactly); worst error = 1/2 + the approximation of M, in output steps.", "",
                "| ONNX node | M | multiplier m | pre-shift s | shift k | clip | worst error (steps) |",
                "|---|---|---|---:|---:|---|---:|"]
        for r in imported.requants:
            far = [(f"{r.node} (far channel {row}: its bias {fp.offset} split off)", (float(fp.ratio),), fp.plan)
                   for row, fp in r.far]
            if not r.plans:
                what = "same scale (zero point only)" if r.ratios else "cvm_lut table"
                out.append(f"| {_cell(r.node)} | {what} | | | | | {'0' if r.ratios else '1/2'} |")
                if not far:
                    continue
            parts = ([(r.node, r.ratios, r.plan)] if r.plan is not None else [
                (f"{r.node} (channels {', '.join(map(str, run.channels[:4]))}{', ...' * (len(run.channels) > 4)})",
                 tuple(r.ratios[i] for i in run.channels), run.plan) for run in r.runs]) + far
            for node, ratios, p in parts:
                ms = ", ".join(f"{v:.6g}" for v in ratios[:4]) + (f", ... ({len(ratios)})" if len(ratios) > 4 else "")
                mult = [int(v) for m in p.multipliers for v in m.reshape(-1)]
                mults = ", ".join(map(str, mult[:4])) + (f", ... ({len(mult)})" if len(mult) > 4 else "")
                clip = "" if p.clip is None else f"[{p.clip[0]}, {p.clip[1]}]"
                shift = f"{p.shift} ({len(p.widths) + 1} parts, b = {' + '.join(map(str, p.widths))})" if p.split else \
                    f"{p.shift} (half to even)" if p.even else p.shift
                out.append(f"| {_cell(node)} | {ms} | {mults} | {p.pre_shift} | {shift} | {clip} | {p.error:.6f} |")
    if imported.edges is not None:
        e = imported.edges
        out += ["", "## Float edges (quantization.json)", ""]
        if e.input is not None:
            out.append(f"- input {e.input.name}: {e.input.type}, scale {e.input.scale.tolist()}, zero point "
                       f"{e.input.zero_point.tolist()}")
        for k, o in enumerate(e.outputs):
            out.append(f"- output {k}: " + ("integers" if o is None else f"{o.name}: {o.type}, scale "
                                            f"{o.scale.tolist()}, zero point {o.zero_point.tolist()}"))
    if layers is not None:
        out += ["", "## Per quantized tensor", "", *layers]
    return "\n".join(out) + "\n"
