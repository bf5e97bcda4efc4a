"""Exact verification: a CVM model's ONNX export on onnxruntime against the reference executor, every element.

Inputs are the given ones (``given_cases``: each sample of an input as ``cvm-onnx run`` takes it, a case of
its own), or generated within each input's declared precision p (|x| <= 2^(p-1)-1): all 0, all
+bound, all -bound, then ``seeds`` random draws (uniform, with one element in ten set to -bound, 0 or +bound).
Every output of every input must be equal (same dtype, shape and values: ``np.array_equal``, no tolerance).

With the float edges of a quantized model (``edges``), the export takes them in the graph (``float_io``: float32
in, float32 out) and is compared with ``cvm-onnx run`` on the CVM model, ``edges.finish(execute(graph,
edges.prepare(x)))``, for float32 inputs: 0, +-3.4e38 and +-inf (saturating), values on rounding ties
((k + 1/2) * scale and their neighbours), then ``seeds`` random draws across the quantized range and a little
beyond it.

On a mismatch the export runs again with every CVM entry as an extra graph output (named by the exporter's
``entry_names``), and the nodes are compared with the executor's values in topological order: the first node with
a differing output is reported with its op, attributes and a few differing positions.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper

from cvm_onnx.converters.from_onnx import from_onnx
from cvm_onnx.converters.to_onnx import entry_names, to_onnx
from cvm_onnx.core.attrs import format_value
from cvm_onnx.core.constants import CONVERTED_FROM, OPTIMIZED
from cvm_onnx.core.errors import RuntimeFailure, UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format import Edge, Edges, read_model
from cvm_onnx.core.format.edges import TYPES
from cvm_onnx.core.graph import Entry, Graph
from cvm_onnx.core.validate import validate
from cvm_onnx.runtime.bulk import samples as read_samples
from cvm_onnx.runtime.sessions import run, session

Progress = Callable[[int, int, str], None]
"""``progress(done, total, what)``: called before each step of a long task."""

SHOWN = 5  # differing positions reported per tensor
NAMED = 12  # cases named in a verdict; of more, the first and the last few


@dataclass(frozen=True)
class Case:
    """One set of inputs, named for the verdict ("zeros", "+127", "seed 0", "given", "sample 3")."""

    name: str
    inputs: dict[str, np.ndarray]


@dataclass
class Difference:
    """One tensor that differs: its name, shapes and dtypes, the count of differing elements and the first few
    positions as (index, expected, got)."""

    name: str
    expected: np.ndarray
    got: np.ndarray
    count: int = 0
    positions: list[tuple[tuple[int, ...], int | float, int | float]] = field(default_factory=list)

    @classmethod
    def of(cls, name: str, expected: np.ndarray, got: np.ndarray) -> Difference | None:
        if expected.dtype == got.dtype and expected.shape == got.shape and np.array_equal(expected, got):
            return None
        d = cls(name, expected, got)
        if expected.shape == got.shape:
            where = np.argwhere(expected != got)
            d.count = len(where)
            d.positions = [(tuple(int(i) for i in ix), expected[tuple(ix)].item(), got[tuple(ix)].item())
                           for ix in where[:SHOWN]]
        return d

    def lines(self) -> list[str]:
        e, g = self.expected, self.got
        if e.shape != g.shape:
            return [f"{self.name}: shape {tuple(g.shape)}, expected {tuple(e.shape)}"]
        if not self.count:
            return [f"{self.name}: dtype {g.dtype}, expected {e.dtype}"]
        out = [f"{self.name} {tuple(e.shape)}: {self.count} of {e.size} elements differ"]
        out += [f"  at {ix}: expected {want}, got {got}" for ix, want, got in self.positions]
        return out


@dataclass
class Divergence:
    """The first CVM node (topological order) whose output differs on onnxruntime."""

    node: str
    op: str
    attrs: dict[str, str]
    inputs: list[str]
    differences: list[Difference]

    def lines(self) -> list[str]:
        attrs = ", ".join(f"{k}={v}" for k, v in self.attrs.items()) or "none"
        out = [f"first differing node (topological order): {self.node} ({self.op})",
               f"  attributes: {attrs}", f"  inputs: {', '.join(self.inputs) or 'none'}"]
        return out + ["  " + s for d in self.differences for s in d.lines()]


@dataclass
class Verdict:
    """The outcome: ``exact`` when every output of every case was equal; otherwise the first failing case, its
    differing outputs and the first differing node (None if no node differs on its own)."""

    cases: list[str]
    outputs: list[str]
    provider: str
    exact: bool = True
    failed_case: str | None = None
    differences: list[Difference] = field(default_factory=list)
    divergence: Divergence | None = None

    def lines(self) -> list[str]:
        if self.exact:
            named = self.cases if len(self.cases) <= NAMED else [*self.cases[:NAMED - 3], "...", *self.cases[-2:]]
            return [(f"exact: {len(self.outputs)} output(s) ({', '.join(self.outputs)}) equal element for element "
                     f"on onnxruntime ({self.provider}) for {len(self.cases)} input(s): {', '.join(named)}")]
        out = [f"MISMATCH on input {self.failed_case!r} (onnxruntime {self.provider}):"]
        out += ["  output " + s if k == 0 else "  " + s for d in self.differences for k, s in enumerate(d.lines())]
        out += self.divergence.lines() if self.divergence else ["no single node differs (only the graph outputs)"]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def generated_cases(graph: Graph, seeds: int = 3) -> list[Case]:
    """Zeros, +bound, -bound and ``seeds`` random inputs within each input's declared precision (int32)."""
    types = {graph.nodes[i].name: graph.nodes[i].outputs[0] for i in graph.inputs}
    bound = max(t.bound for t in types.values())
    cases = [Case(name, {n: np.full(t.shape, sign * t.bound, np.int32) for n, t in types.items()})
             for name, sign in (("zeros", 0), (f"+{bound}", 1), (f"-{bound}", -1))]
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        inputs = {}
        for n, t in types.items():
            x = rng.integers(-t.bound, t.bound, size=t.shape, endpoint=True, dtype=np.int32)
            edge = rng.random(t.shape) < 0.1
            x[edge] = rng.choice(np.array([-t.bound, 0, t.bound], np.int32), int(edge.sum()))
            inputs[n] = x
        cases.append(Case(f"seed {seed}", inputs))
    return cases


def float_cases(graph: Graph, edge: Edge, seeds: int = 3) -> list[Case]:
    """Float32 inputs for an export with float edges (see the module docstring)."""
    [i] = graph.inputs
    name, shape = graph.nodes[i].name, graph.nodes[i].outputs[0].shape
    lo, hi = TYPES[edge.type]
    steps = np.arange(lo - int(edge.zero_point.max()) - 2, hi - int(edge.zero_point.min()) + 2)
    ties = ((steps + 0.5) * np.float64(edge.scale.reshape(-1)[0])).astype(np.float32)
    ties = np.concatenate([np.nextafter(ties, -np.inf), ties, np.nextafter(ties, np.inf)])
    big = float(np.finfo(np.float32).max)
    cases = [Case(n, {name: np.full(shape, v, np.float32)}) for n, v in
             (("zeros", 0.0), ("+3.4e38", big), ("-3.4e38", -big), ("+inf", np.inf), ("-inf", -np.inf))]
    cases.append(Case("ties", {name: np.resize(ties, shape).astype(np.float32)}))
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        x = (rng.uniform(steps[0], steps[-1], size=shape) * edge.scale.reshape(-1)[0]).astype(np.float32)
        pick = rng.random(shape) < 0.2
        x[pick] = rng.choice(np.concatenate([ties, [0, big, -big]]).astype(np.float32), int(pick.sum()))
        cases.append(Case(f"seed {seed}", {name: x}))
    return cases


def given_cases(graph: Graph, source: str | os.PathLike | np.ndarray, edges: Edges | None = None,
                quantized: bool = False) -> list[Case]:
    """One case per sample in ``source`` (an .npy file, a directory of them or an array), laid out as ``cvm-onnx
    run --input`` takes them (``bulk.samples``), named "sample k". Float samples need ``edges`` (the export with
    float input and outputs), integers none; ``quantized``: the model has float edges that are not compared, so
    the refusal of float samples names the float form."""
    [i] = graph.inputs
    name, shape = graph.nodes[i].name, graph.nodes[i].outputs[0].shape
    found = read_samples(source, shape)
    floats = found.dtype.kind == "f"
    if edges is not None and not floats:
        raise RuntimeFailure(f"{found.dtype} samples, but the export with float input and outputs takes floats: "
                             f"give the float samples (or the integers without --float-io)", where=name)
    if edges is None and floats:
        hint = ("; for float samples, verify the export with float input and outputs: verify MODEL --float-io "
                "(its quantization.json quantizes them), or an .onnx that convert --float-io wrote" if quantized
                else ": this model has no float edges (quantization.json) to quantize them")
        raise RuntimeFailure(f"{found.dtype} samples, but the export compared takes integers{hint}", where=name)
    data = found.chunk(0, found.count)
    return [Case(f"sample {k}", {name: data[k].reshape(shape)}) for k in range(found.count)]


def _as_graph(model) -> Graph:
    if isinstance(model, Graph):
        return model
    if isinstance(model, (str, os.PathLike)):
        return validate(read_model(model)).graph
    return model.graph  # a Loaded


def exported_graph(onnx_model: onnx.ModelProto, where: str = "") -> Graph:
    """The CVM graph an export of ``to_onnx`` came from, read back from its CVM op nodes, to verify the export
    against: an ONNX model the exporter did not write, and the serving form (--optimize), which keeps no CVM
    graph, are refused naming what to verify instead."""
    props = {p.key: p.value for p in onnx_model.metadata_props}
    if props.get(CONVERTED_FROM) != "CVM":
        raise UnsupportedError("not an export of a CVM model (no metadata converted_from=CVM), so there is no "
                               "reference to verify it against: import it (cvm-onnx convert M.onnx -o DIR) and "
                               "verify DIR", where=where)
    if OPTIMIZED in props:
        raise UnsupportedError("the serving form (--optimize) keeps no CVM graph to verify it against: verify "
                               "it as it is written, cvm-onnx convert MODEL_DIR --optimize --verify", where=where)
    return from_onnx(onnx_model)


def _feeds(case: Case, edges: Edges | None = None) -> dict[str, np.ndarray]:
    """The case as the export takes it: float32 with float edges, else int32."""
    return {k: np.asarray(v).astype(np.int32 if edges is None else np.float32) for k, v in case.inputs.items()}


def _reference(graph: Graph, case: Case, edges: Edges | None, keep_all: bool = False):
    """The reference executor on the case (quantized first with float edges, as ``cvm-onnx run`` does)."""
    if edges is None:
        return execute(graph, case.inputs, keep_all)
    values = execute(graph, {k: edges.prepare(np.float32(v)) for k, v in case.inputs.items()}, keep_all)
    return values if keep_all else edges.finish(values)


def locate(graph: Graph, onnx_model: onnx.ModelProto, case: Case, provider: str = "cpu",
           native: bool | None = None, edges: Edges | None = None) -> Divergence | None:
    """Run ``onnx_model`` with every non-param CVM entry it computes as a graph output and return the first node
    (in topological order) whose value differs from the reference executor's, or None. With float edges in the
    graph, an entry at an edge is the tensor ``<name>:quantized``."""
    names = entry_names(graph)
    if edges is not None:
        produced = {t for n in onnx_model.graph.node for t in n.output}
        names = {e: f"{n}:quantized" if f"{n}:quantized" in produced else n for e, n in names.items()}
    probe = onnx.ModelProto()
    probe.CopyFrom(onnx_model)
    produced = {t for n in probe.graph.node for t in n.output}
    present = {o.name for o in probe.graph.output}
    watched: dict[int, list[Entry]] = {}
    for e, name in sorted(names.items()):
        if graph.nodes[e.node].name not in graph.params and name in produced:
            watched.setdefault(e.node, []).append(e)
            if name not in present:
                probe.graph.output.append(helper.make_tensor_value_info(name, TensorProto.INT32,
                                                                        graph.type_of(e).shape))
    sess = session(probe, provider, native)
    got = dict(zip((o.name for o in sess.get_outputs()), run(sess, _feeds(case, edges))))
    want = _reference(graph, case, edges, keep_all=True)
    for i, entries in watched.items():
        diffs = [d for e in entries if (d := Difference.of(names[e], want[e], got[names[e]]))]
        if diffs:
            node = graph.nodes[i]
            attrs = {k: format_value(v) for k, v in node.attrs.items()}
            return Divergence(node.name, node.op if not node.is_variable else "input", attrs,
                              [names.get(e, graph.nodes[e.node].name) for e in node.inputs], diffs)
    return None


def verify(model, data: np.ndarray | Mapping[str, np.ndarray] | None = None, *, seeds: int = 3,
           provider: str = "cpu", onnx_model: onnx.ModelProto | None = None, inline: bool = False,
           native: bool | None = None, progress: Progress | None = None, edges: Edges | None = None,
           cases: list[Case] | None = None) -> Verdict:
    """Check that ``onnx_model`` (default: ``to_onnx(graph, inline)``) computes exactly what the reference executor
    computes for ``model`` (a validated Graph, a ``Loaded`` or a model path).

    ``data``: the input ``data`` (or a mapping of input names to arrays); None generates the cases described in
    the module docstring; ``cases`` (``given_cases``) replaces both. ``edges``: a quantized model's float edges,
    in the graph of the export (default:
    ``to_onnx(graph, inline, edges=edges, float_io=True)``), which takes float data. Runtime errors (onnxruntime
    refusing the model, a bad input) raise ``RuntimeFailure``.
    """
    graph = _as_graph(model)
    if onnx_model is None:
        onnx_model = to_onnx(graph, inline=inline, edges=edges, float_io=edges is not None)
    if cases is None and data is None:
        cases = generated_cases(graph, seeds) if edges is None else float_cases(graph, edges.input, seeds)
    elif cases is None:
        cases = [Case("given", dict(data) if isinstance(data, Mapping) else {"data": np.asarray(data)})]
    total = len(cases) + 1
    if progress:
        progress(0, total, "onnxruntime session")
    sess = session(onnx_model, provider, native)
    out_names = [o.name for o in sess.get_outputs()]
    verdict = Verdict([c.name for c in cases], out_names, provider)
    for k, case in enumerate(cases, 1):
        if progress:
            progress(k, total, f"input {case.name}")
        if edges is not None and any(np.asarray(v).dtype.kind != "f" for v in case.inputs.values()):
            raise RuntimeFailure("the export with float edges takes float data; give float input")
        want = _reference(graph, case, edges)
        got = run(sess, _feeds(case, edges))
        if len(got) != len(want):
            raise RuntimeFailure(f"the ONNX model has {len(got)} outputs, the CVM model {len(want)}")
        diffs = [d for name, w, g in zip(out_names, want, got) if (d := Difference.of(name, w, g))]
        if diffs:
            verdict.exact, verdict.failed_case, verdict.differences = False, case.name, diffs
            if progress:
                progress(k, total, "locating the first differing node")
            verdict.divergence = locate(graph, onnx_model, case, provider, native, edges)
            break
    if progress:
        progress(total, total, "done")
    return verdict
