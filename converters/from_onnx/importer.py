"""ONNX -> CVM: ``from_onnx`` walks the graph in topological order and applies one import rule per node.

The walk: safety checks (``checks``); a static pass naming every node no rule covers (no CVM op, opset too
old); graph inputs become CVM variables (one input is named ``data``; with ``pack``, several are slices of one
``data``), initializers constants; each node (or flat-form group, see ``roundtrip``) is imported by its rule;
graph outputs become the heads. A node whose rule refuses is reported with its name and reason, and the walk goes
on with the nodes that do not depend on it, and past a quantizing node after it (QuantizeLinear, QLinear*: its
quantized output becomes a stand-in holding any value of its type), so one ``UnsupportedError`` lists every
problem; nothing is returned (or written) unless there is none. The graph returned has passed ``validate``.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto

from cvm_onnx.converters.to_onnx.float_edges import without_float_edges
from cvm_onnx.core.constants import PRECISION as PRECISION_KEY
from cvm_onnx.core.constants import FLOAT_IO, MARK_NODE, MARK_OP, OPTIMIZED, QUANTIZATION, precision_of
from cvm_onnx.core.errors import Problem, UnsupportedError
from cvm_onnx.core.format.edges import Edge, Edges, Slot, parse_edges
from cvm_onnx.core.format.onnx_file import dims, static_shape
from cvm_onnx.core.graph import MAX_DIM, Entry, Graph
from cvm_onnx.core.ops import REGISTRY
from cvm_onnx.core.validate import validate

# registers the rules (in this order: RULES lists them so)
from . import elemwise, transform, nn, reduce, quantized, roundtrip  # noqa: F401, I001
from .checks import broadcast_problem, checked_order, node_label, tensor_array, type_problem
from .context import INT_RANGES, Importer, Tensor, bound, const, cvm_shape, type_name
from .registry import FLOAT_RULES, RULES, NodeView, Refuse

INPUT_NAME = "data"
#: The ops that may read an empty slice: a Concat or QLinearConcat drops it; a QuantizeLinear or DequantizeLinear
#: between (as quantize_static writes them) gives an empty value again. Any other reader is refused naming it.
EMPTY_READERS = ("Concat", "QLinearConcat", "QuantizeLinear", "DequantizeLinear")
#: The ops whose integer and scale types the quantized rules check themselves (they take int16 and int32 at any
#: opset), not by their onnx schema.
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
#: onnxruntime's dynamic quantization (quantize_dynamic and its fusions) and weight-only quantization (``WEIGHT_ONLY``):
#: (domain, op type). Their activations are float (scales computed at run time, or none), so such a model has no
#: static CVM form; ``cvm-onnx quantize`` takes it (app/dynamic.py).
WEIGHT_ONLY = ("MatMulNBits", "GatherBlockQuantized")
DYNAMIC_OPS = (("", "DynamicQuantizeLinear"), ("com.microsoft", "DynamicQuantizeLSTM"),
               ("com.microsoft", "DynamicQuantizeMatMul"), ("com.microsoft", "MatMulIntegerToFloat"),
               *(("com.microsoft", op) for op in WEIGHT_ONLY))


@dataclass
class Imported:
    """An import: the validated graph; for a quantized model its float edges and requantizations; which CVM
    nodes each ONNX node (``name (OpType)``) became; ``tensors``: the CVM entry computing each ONNX tensor the
    graph computes (not constants), by name (a cut at that tensor, ``outputs``, would make it a head)."""

    graph: Graph
    edges: Edges | None
    requants: list[quantized.Requant]
    origins: list[tuple[str, list[str]]]
    tensors: dict[str, Entry] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class Unit:
    """What one rule imports: a node, or the nodes of one flat-form CVM node (``group`` is its name)."""

    name: str
    nodes: list[onnx.NodeProto]
    group: str | None = None
    # the Div or Mul ending a written-out softmax or L2 normalization, or an L2 norm's root, imported as one
    chain: quantized.SoftmaxChain | quantized.L2Chain | quantized.NormChain | None = None

    @property
    def where(self) -> str:
        op = roundtrip.marks(self.nodes[0]).get(MARK_OP, "?") if self.group else self.nodes[0].op_type
        return f"{self.name} ({op})"


def _domain(d: str) -> str:
    return "" if d == "ai.onnx" else d


class _Walk:
    def __init__(self, model: onnx.ModelProto, input_precision: int, base_dir: Path | None, pack: bool = False,
                 precisions: dict[str, int] | None = None):
        self.model = model
        self.pack, self.precisions = pack, precisions or {}
        self.slots: list[Slot] = []  # the packed inputs' layout in ``data``
        self.graph = model.graph
        self.inferred: dict[str, tuple[int, tuple[int, ...] | None]] | None = None  # by onnx's shape inference
        self.metadata = {p.key: p.value for p in model.metadata_props}
        self.base_dir = base_dir
        self.order = checked_order(model, base_dir)
        self.opsets = {_domain(o.domain): o.version for o in model.opset_import}
        self.input_precision = input_precision
        self.ctx = Importer()
        self.ctx.base_dir = base_dir
        self.tensors: dict[str, Tensor] = {}
        self.failed: set[str] = set()
        self.problems: list[Problem] = []
        self.meta: dict[str, str] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for vi in [*self.graph.input, *self.graph.output, *self.graph.value_info]:
            self.meta.update({vi.name: p.value for p in vi.metadata_props if p.key == PRECISION_KEY})
            if (d := dims(vi)) is not None and None not in d:
                self.shapes[vi.name] = d
        self.ctx.shapes = self.shapes
        self.consumed = {x for n in self.graph.node for x in n.input} | {o.name for o in self.graph.output}
        self.empty: set[str] = set()  # empty slices, and what EMPTY_READERS make of them
        self.masks = quantized.mask_terms(self.graph)
        self.affines = quantized.quantized_affines(self.graph)
        self.replaced: set[int] = set()  # QuantizeLinear nodes of the float input (the CVM input is their output)
        self.input_edge: Edge | None = None
        self.output_edges: list[Edge | None] = []
        self.origins: list[tuple[str, list[str]]] = []
        self.progress: Callable[[int, int | None, str], None] | None = None

    def problem(self, where: str, rule: str) -> None:
        self.problems.append(Problem(where, rule))

    def precision(self, name: str) -> int | None:
        """The precision the model declares for tensor ``name`` (value_info metadata), if any."""
        if name not in self.meta:
            return None
        if (p := precision_of(self.meta[name])) is None:
            self.problem(name, f"metadata {PRECISION_KEY}={self.meta[name]!r} is not a precision in [1, 32]")
        return p

    # -- the walk ---------------------------------------------------------------------------------------------------
    def run(self) -> Imported:
        if (refused := dynamic_refusal(self.graph)) is not None:
            raise UnsupportedError(refused[1], where=refused[0])
        units = [(u, self.supported(u)) for u in self.units()]
        inputs = self.inputs()
        self.initializers()
        for i, (u, supported) in enumerate(units):
            if supported:
                self.unit(u)
            else:
                self.skipped(u)
            if self.progress:
                self.progress(i + 1, len(units), "importing")
        heads = self.heads()
        while self.ctx.pending:  # declared params that no node reads (the CVM graph had them too)
            name, t = next(iter(self.ctx.pending.items()))
            try:
                self.ctx.entry(t)
            except Refuse as e:
                self.problem(name, str(e))
        if self.problems:
            raise UnsupportedError(self.problems)
        if self.progress:
            self.progress(0, None, "validating")
        graph = validate(Graph(self.ctx.nodes, heads, self.ctx.params), inputs=tuple(inputs)).graph
        quantized_edges = self.input_edge is not None or any(e is not None for e in self.output_edges)
        edges = Edges(self.input_edge, tuple(self.output_edges), tuple(self.slots)) if quantized_edges or \
            self.slots else self.kept_edges(graph)
        computed = {name: t.entry for name, t in self.tensors.items() if isinstance(t, Tensor) and t.entry is not None}
        return Imported(graph, edges, self.ctx.requants, self.origins, computed)

    def kept_edges(self, graph: Graph) -> Edges | None:
        """The float edges a model exported from a quantized import keeps in its metadata, if any: they come
        back with the CVM model (``quantization.json``)."""
        if QUANTIZATION not in self.metadata:
            return None
        return parse_edges(self.metadata[QUANTIZATION], f"metadata {QUANTIZATION}", len(graph.heads))

    def units(self) -> list[Unit]:
        """Nodes in topological order; the nodes of a flat-form group become one unit at its last member; the last
        node of a written-out softmax reads its input, and the nodes only it read are dropped (``softmaxes``)."""
        chains, dropped = self.softmaxes()
        self.ctx.means = self.masked_means()
        nodes = [self.graph.node[i] for i in self.order if i not in dropped]
        names = [n.name or f"{n.op_type}_{i}" for i, n in zip([i for i in self.order if i not in dropped], nodes)]
        groups: dict[str, list[onnx.NodeProto]] = {}
        for n in nodes:
            if (g := roundtrip.marks(n).get(MARK_NODE)) is not None:
                groups.setdefault(g, []).append(n)
        units, seen = [], {}
        for name, n in zip(names, nodes):
            g = roundtrip.marks(n).get(MARK_NODE)
            if g is None:
                units.append(Unit(name, [n], chain=chains.get(id(n))))
                continue
            seen[g] = seen.get(g, 0) + 1
            if seen[g] == len(groups[g]):
                units.append(Unit(g, groups[g], g))
        return units

    def softmaxes(self) -> tuple[dict[int, quantized.SoftmaxChain | quantized.L2Chain | quantized.NormChain],
                                 set[int]]:
        """The written-out softmaxes and L2 normalizations (``quantized.softmax_chains``, ``quantized.l2_chains``)
        by the id of their last node, and the indices of the nodes that the graph's outputs need only through them
        (and of the nodes reading those)."""
        if not any(n.op_type in ("Exp", *quantized.SUMS) for n in self.graph.node):
            return {}, set()
        if self.inferred is None:
            self.inferred = inferred_types(self.model)
        constants = self.constants()
        constants.update({n.output[0]: tensor_array(a.t, self.base_dir) for n in self.graph.node
                          if n.op_type == "Constant" and n.output and (a := next(iter(n.attribute), None)) is not None
                          and a.name == "value"})
        shapes = {k: s for k, (_, s) in self.inferred.items()}
        chains = quantized.softmax_chains(self.graph, self.opsets.get("", 0), shapes, constants) + \
            quantized.l2_chains(self.graph, self.opsets.get("", 0), shapes, constants) + \
            quantized.norm_chains(self.graph, self.opsets.get("", 0), shapes, constants)
        if not chains:
            return {}, set()
        rewired = {id(c.node): [c.x] for c in chains}
        before, after = self.live({}), self.live(rewired)
        dropped, gone = set(), set()
        for i in self.order:
            n = self.graph.node[i]
            if (i in before and i not in after) or any(x in gone for x in rewired.get(id(n), n.input)):
                dropped.add(i)
                gone.update(n.output)
        return {id(c.node): c for c in chains}, dropped

    def masked_means(self) -> dict[str, quantized.MaskedMean]:
        """The masked means (``quantized.masked_means``) by their Div's output."""
        if not any(n.op_type == "Div" for n in self.graph.node) or \
                not any(n.op_type == "ReduceSum" for n in self.graph.node):
            return {}
        if self.inferred is None:
            self.inferred = inferred_types(self.model)
        return quantized.masked_means(self.graph, self.opsets.get("", 0), {k: s for k, (_, s) in self.inferred.items()},
                                      self.constants(), {k: t for k, (t, _) in self.inferred.items()})

    def live(self, inputs: dict[int, list[str]]) -> set[int]:
        """The indices of the nodes the graph's outputs need, node ``id`` reading ``inputs[id]`` where given."""
        needed, out = {o.name for o in self.graph.output}, set()
        for i in reversed(self.order):
            n = self.graph.node[i]
            if any(o in needed for o in n.output):
                out.add(i)
                needed.update(inputs.get(id(n), n.input))
        return out

    def supported(self, u: Unit) -> bool:
        """Whether a rule covers the unit; else report why (no CVM op, opset too old, inconsistent markers)."""
        if u.group is not None:
            op = roundtrip.marks(u.nodes[0]).get(MARK_OP)
            if any(roundtrip.marks(n) != roundtrip.marks(u.nodes[0]) for n in u.nodes):
                self.problem(u.where, "the nodes of this flat-form CVM node carry different cvm.op/cvm.attrs")
                return False
            if op not in REGISTRY:
                self.problem(u.where, f"flat-form marker cvm.op={op!r} names no CVM op")
                return False
            return True
        if u.chain is not None:  # a written-out form's rule (ReduceL2's norm has no rule of its own)
            return True
        n = u.nodes[0]
        domain = _domain(n.domain)
        r = RULES.get((domain, n.op_type)) or FLOAT_RULES.get((domain, n.op_type))
        if r is None:
            self.problem(u.where, f"no CVM op for ONNX {domain + '::' if domain else ''}{n.op_type}")
            return False
        if self.opsets.get(domain, 0) < r.since:
            self.problem(u.where, f"needs opset {r.since} of {domain or 'ai.onnx'} (the model imports "
                                  f"{self.opsets.get(domain, 'none')})")
            return False
        return True

    def inputs(self) -> list[str]:
        """Graph inputs (not initializers) as CVM variables; a single one is named ``data``. With ``pack`` and
        several inputs, one variable ``data`` holds them all, flattened and concatenated in the graph's input order,
        at the widest precision among them: each is a strided_slice of it, reshaped, and clipped to its own values
        (its type within its precision; a float input's quantized type) where those are fewer (``Slot``). Returns
        the variables' names."""
        inits = {t.name for t in self.graph.initializer}
        vis = [v for v in self.graph.input if v.name not in inits]
        for name in sorted({v.name for v in vis if sum(u.name == v.name for u in vis) > 1}):
            self.problem(name, "graph input declared more than once (ONNX names each value once)")
        vis = list({v.name: v for v in vis}.values())
        found = []
        for v in vis:
            tt = v.type.tensor_type
            edge = None
            if tt.elem_type not in INT_RANGES:
                edge = quantized.input_edge(self.graph, v.name, self.constants())
                if isinstance(edge, str):
                    self.problem(v.name, edge if tt.elem_type == TensorProto.FLOAT else
                                 f"input of non-integer type {type_name(tt.elem_type)}: {edge}")
                    continue
            if (shape := static_shape(v)) is None:
                self.problem(v.name, "input needs a static shape (every dim known and > 0)")
                continue
            p = self.precisions.get(v.name) or self.precision(v.name) or self.precision(f"{v.name}:clamped") or \
                self.input_precision
            if edge is not None:
                p = quantized.input_precision(edge.dtype)
            if not 1 <= p <= 32:
                self.problem(v.name, f"input precision {p} must lie in [1, 32]")
                continue
            found.append((v, shape, p, edge))
        names, data, offset = [], None, 0
        total = sum(math.prod(cvm_shape(s)) for _, s, _, _ in found)
        if self.pack and len(vis) > 1 and len(found) == len(vis) and total > MAX_DIM:
            self.problem(", ".join(v.name for v in vis), f"the inputs packed into data hold {total} values: data is "
                                                           "one axis, of at most 2^24 (the runtime's bound on a dim)")
            found = []
        if self.pack and len(vis) > 1 and len(found) == len(vis):
            widest = max(p for _, _, p, _ in found)
            data = self.ctx.variable(INPUT_NAME, (total,), widest)
            names.append(self.ctx.nodes[data.node].name)
        for v, shape, p, edge in found:
            tt = v.type.tensor_type
            if data is None:
                e = self.ctx.variable(INPUT_NAME if len(vis) == 1 else v.name, cvm_shape(shape), p)
                names.append(self.ctx.nodes[e.node].name)
            else:
                size = math.prod(cvm_shape(shape))
                self.ctx.base = f"{v.name}:unpacked"
                e = self.ctx.emit("strided_slice", data, begin=(offset,), end=(offset + size,), stride=(1,))
                e = self.ctx.emit("reshape", e, shape=cvm_shape(shape))
                offset += size
            if edge is None:
                lo, hi = INT_RANGES[tt.elem_type]
                lo, hi = max(lo, -bound(p)), min(hi, bound(p))
                if data is not None:
                    if (lo, hi) != (-bound(widest), bound(widest)):
                        self.ctx.base = f"{v.name}:clamped"
                        e = self.ctx.emit("clip", e, a_min=lo, a_max=hi)
                    self.slots.append(Slot(v.name, shape, type_name(tt.elem_type), p))
                self.tensors[v.name] = Tensor(tt.elem_type, shape, lo, hi, e)
                continue
            lo, hi = INT_RANGES[edge.dtype]  # the integer input saturates as QuantizeLinear does
            self.ctx.base = f"{v.name}:saturated"
            q = Tensor(edge.dtype, shape, lo, hi, self.ctx.emit("clip", e, a_min=lo, a_max=hi))
            self.tensors[v.name] = q  # ops that only move values between the input and its quantizers move q
            self.replaced.update(id(n) for n in edge.nodes)
            if data is None:
                self.input_edge = Edge(names[-1], type_name(edge.dtype), edge.scale, edge.zero)
            else:
                self.slots.append(Slot(v.name, shape, type_name(edge.dtype), p,
                                       Edge(v.name, type_name(edge.dtype), edge.scale, edge.zero)))
        self.failed.update(v.name for v in vis if v.name not in self.tensors)
        return names

    def constants(self) -> dict[str, np.ndarray]:
        """The initializers' values (the float input's QuantizeLinear reads its scale from them)."""
        return {t.name: tensor_array(t, self.base_dir) for t in self.graph.initializer}

    def initializers(self) -> None:
        for t in self.graph.initializer:
            self.tensors[t.name] = const(tensor_array(t, self.base_dir), t.data_type, name=t.name)
            if (p := self.precision(t.name)) is not None:
                self.ctx.declared[t.name] = p
                self.ctx.pending[t.name] = self.tensors[t.name]
                if t.data_type in (TensorProto.INT8, TensorProto.INT32):
                    self.ctx.stored[t.name] = np.dtype(np.int8 if t.data_type == TensorProto.INT8 else np.int32)
        for s in self.graph.sparse_initializer:
            self.problem(s.values.name, "sparse initializers are not supported")

    def unit(self, u: Unit) -> None:
        if id(u.nodes[0]) in self.replaced:  # a quantizer of the float input: its integers (moved), as they are
            n = u.nodes[0]
            if n.input[0] in self.tensors:
                self.tensors[n.output[0]] = self.tensors[n.input[0]]
            return
        names = roundtrip.group_inputs(u.nodes) if u.group else [u.chain.x] if u.chain else list(u.nodes[0].input)
        missing = [x for x in names if x and x not in self.tensors]
        if missing:
            for x in missing:
                if x not in self.failed:
                    self.problem(u.where, f"consumes {x!r}, an inner tensor of a flat-form CVM node")
            self.skipped(u)
            return
        self.ctx.base = u.name
        first = len(self.ctx.nodes)
        try:
            if read := [x for n in u.nodes if n.op_type not in EMPTY_READERS for x in n.input if x in self.empty]:
                raise Refuse(f"{read[0]!r} is an empty slice: CVM has no empty tensors (a Concat drops one)")
            if u.group is not None:
                outs = roundtrip.import_group(self.ctx, u.name, u.nodes, self.tensors, self.shapes)
            elif u.chain is not None:
                value = quantized.l2_value if isinstance(u.chain, quantized.L2Chain) else \
                    quantized.norm_value if isinstance(u.chain, quantized.NormChain) else quantized.softmax_value
                x = self.tensors[u.chain.x]
                x = quantized.l2_read(x) if value is quantized.l2_value else x
                outs = {u.nodes[0].output[0]: value(u.chain, x)}
            else:
                n = u.nodes[0]
                key = (_domain(n.domain), n.op_type)
                ins = [self.tensors[x] if x else None for x in n.input]
                ins = [quantized.constant_term(t) if x in self.masks and isinstance(t, Tensor) and t.is_const else t
                       for x, t in zip(n.input, ins)]
                view = NodeView(n, u.name, self.opsets[_domain(n.domain)])
                if (wrong := quantized.parameter_problem(view, ins, key)) is not None:
                    raise Refuse(wrong)
                dtypes = [x.dtype if isinstance(x, Tensor) else None for x in ins]  # a dequantized value: float
                if (key in RULES or any(isinstance(x, quantized.Real) for x in ins)) and key[1] not in QDQ_OPS and \
                        (wrong := type_problem(n, self.opsets[key[0]], dtypes)) is not None:
                    raise Refuse(wrong)
                if (wrong := broadcast_problem(n, [getattr(x, "shape", None) for x in ins])) is not None:
                    raise Refuse(wrong)
                if n.output[0] in self.masks and not any(isinstance(x, quantized.Real) and
                                                         not isinstance(x, quantized.Tabulated) for x in ins):
                    fn = quantized.tabulated
                elif n.output[0] in self.masks and n.op_type == "Where":
                    fn = quantized.masked_where
                    ins = [quantized.float_read(self.ctx, n.op_type, x) for x in ins]
                elif n.output[0] in self.affines and quantized.affine_of_integers(n.op_type, ins):
                    fn = FLOAT_RULES[key].fn
                    ins = [x if x.is_const else quantized.of_integers(x) for x in ins]
                elif any(isinstance(x, quantized.Real) for x in ins):
                    if key not in FLOAT_RULES:
                        raise Refuse(f"float {n.op_type} of dequantized values has no integer form")
                    fn = FLOAT_RULES[key].fn
                    ins = [quantized.float_read(self.ctx, n.op_type, x) for x in ins]
                elif key in RULES:
                    fn = RULES[key].fn
                else:
                    raise Refuse(f"no CVM op for ONNX {n.op_type} on integers (only between quantized tensors)")
                out = fn(self.ctx, view, *ins)
                out = [out] if isinstance(out, (Tensor, *quantized.Real)) else list(out)
                outs = {name: t for name, t in zip(n.output, out) if name}
                for k, name in enumerate(n.output):
                    if name and (k >= len(out) or out[k] is None) and name in self.consumed:
                        raise Refuse(f"output {k} ({name!r}) has no CVM form")
        except Refuse as e:
            self.problem(u.where, str(e))
            self.skipped(u)
            return
        for name, t in outs.items():
            if t is not None:
                self.tensors[name] = replace(t, name=name) if isinstance(t, Tensor) and t.is_const and \
                    t.name is None else t
                if 0 in t.shape and (u.nodes[0].op_type == "Slice" or u.nodes[0].op_type in EMPTY_READERS
                                     and any(x in self.empty for x in u.nodes[0].input)):
                    self.empty.add(name)
        self.origins.append((u.where, [n.name for n in self.ctx.nodes[first:]]))

    def skipped(self, u: Unit) -> None:
        """A unit not imported (refused, or reading what was not): its outputs are failed, except the quantized
        tensors a quantizing node (QuantizeLinear, QLinear*, QGemm) gives, which become stand-ins, so that the
        nodes after them are still imported and every problem of the model is reported in one pass."""
        for n in u.nodes:
            for name in n.output:
                t = self.stand_in(n, name) if name else None
                if t is None:
                    self.failed.add(name)
                else:
                    self.tensors[name] = t

    def stand_in(self, node: onnx.NodeProto, name: str) -> Tensor | None:
        """An input-like CVM variable holding any value of the quantized type of ``name`` (its declared or
        inferred type and static shape), where ``node`` quantizes; else None. Only ever made for a model with a
        problem already reported, which is therefore never written."""
        if node.op_type != "QuantizeLinear" and not node.op_type.startswith("QLinear") and node.op_type != "QGemm":
            return None
        if self.inferred is None:
            self.inferred = inferred_types(self.model)
        dtype, shape = self.inferred.get(name, (None, None))
        if dtype not in quantized.QUANTIZED_TYPES or shape is None:
            return None
        lo, hi = INT_RANGES[dtype]
        e = self.ctx.variable(f"{name}:unknown", cvm_shape(shape), quantized.input_precision(dtype))
        return Tensor(dtype, shape, lo, hi, e)

    def heads(self) -> list[Entry]:
        heads = []
        for o in self.graph.output:
            t = self.tensors.get(o.name)
            if t is None:
                continue  # its producer was refused and reported
            self.ctx.base = o.name
            try:
                edge = None
                if isinstance(t, quantized.Real):
                    t, scale, zero = quantized.output_edge(self.ctx, t)
                    edge = Edge(o.name, edge_type(t, zero), scale, zero)
                e = self.ctx.entry(t)
                heads.append(e if edge is None else self._named_head(e, o.name, heads))
                self.output_edges.append(edge)
            except Refuse as e:
                self.problem(o.name, str(e))
        return heads

    def _named_head(self, e: Entry, name: str, heads: list[Entry]) -> Entry:
        """``e``, its op node renamed after the quantized model's float output ``name`` where that name is free:
        the head reads as the source model's output, not as the last of the CVM ops its QuantizeLinear became."""
        node = self.ctx.nodes[e.node]
        if not node.is_variable and node.name != name and name not in self.ctx.names and e not in heads:
            self.ctx.names.add(name)
            self.ctx.nodes[e.node] = replace(node, name=name)
        return e


def dynamic_refusal(graph: onnx.GraphProto) -> tuple[str, str] | None:
    """(the first such node, one sentence) where ``graph`` is onnxruntime's dynamic or weight-only quantization
    (``DYNAMIC_OPS``), naming its nodes by op type and pointing at ``cvm-onnx quantize``; else None."""
    found: dict[str, int] = {}
    first = None
    for i, n in enumerate(graph.node):
        if (_domain(n.domain), n.op_type) in DYNAMIC_OPS:
            found[n.op_type] = found.get(n.op_type, 0) + 1
            first = first or node_label(n, i)
    if first is None:
        return None
    ops = ", ".join(f"{op} x{k}" for op, k in found.items())
    how = "weight-only quantization" if set(found) <= set(WEIGHT_ONLY) else "dynamic quantization"
    return first, (f"onnxruntime's {how} ({ops}) leaves its activations float (scales computed at run time, or "
                   "none), so the model has no static CVM form: cvm-onnx quantize takes it with calibration samples "
                   "(its weights dequantized, its activations calibrated)")


def edge_type(t: Tensor, zero: np.ndarray) -> str:
    """The quantized type named in a dequantized output's edge: its own, or for integers of another type (a cut at
    a Concat of inputs of different scales gives int32) the first of int8, uint8, int16, uint16 holding its
    values and zero points; else refused."""
    if t.dtype in quantized.QUANTIZED_TYPES:
        return type_name(t.dtype)
    lo, hi = min(t.lo, int(zero.min())), max(t.hi, int(zero.max()))
    for dtype in quantized.QUANTIZED_TYPES:
        if INT_RANGES[dtype][0] <= lo and hi <= INT_RANGES[dtype][1]:
            return type_name(dtype)
    raise Refuse(f"a dequantized output of {type_name(t.dtype)} values in [{lo}, {hi}], beyond 16 bits, has no "
                 "float edge: cut the graph (--outputs) at a quantized tensor")


def inferred_types(model: onnx.ModelProto) -> dict[str, tuple[int, tuple[int, ...] | None]]:
    """Element type and static shape (None where a dim is unknown) of every tensor onnx's shape inference
    finds, declared ones included; {} where it fails."""
    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001  (onnx's inference raises several types)
        graph = model.graph
    out = {}
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        out[vi.name] = (vi.type.tensor_type.elem_type, static_shape(vi))
    return out


def cut(model: onnx.ModelProto, outputs: list[str]) -> onnx.ModelProto:
    """``model`` with ``outputs`` as its outputs and only the nodes they need (``--outputs``); refused where they
    need no graph input (constants, or computed from constants alone: no model to run)."""
    produced = {o: n for n in model.graph.node for o in n.output if o}
    known = produced.keys() | {v.name for v in model.graph.input} | {t.name for t in model.graph.initializer}
    missing = [name for name in outputs if name not in known]
    if missing:
        raise UnsupportedError([Problem(name or "''", "no tensor of this name to cut the graph at")
                                for name in missing])
    needed, todo = set(), list(outputs)
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        if name in produced:
            todo.extend(x for x in produced[name].input if x)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(n for n in model.graph.node if any(o in needed for o in n.output))
    infos = {v.name: v for v in [*model.graph.value_info, *model.graph.output, *model.graph.input]}
    del out.graph.output[:]
    out.graph.output.extend(infos[name] if name in infos else onnx.ValueInfoProto(name=name) for name in outputs)
    inputs = [v for v in model.graph.input if v.name in needed]
    if not inputs:
        raise UnsupportedError([Problem(name, "computed from constants alone: a graph cut there reads no input")
                                for name in dict.fromkeys(outputs)])
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    return out


def batch_of_one(model: onnx.ModelProto) -> list[str]:
    """Fix, in ``model``, each input's dynamic first dim whose other dims are static to 1, and every dim the model
    declares by the same name (value_info, outputs): a shipped model's batch axis, as a CVM model's shapes are
    static. Returns one note per input fixed."""
    graph, notes, names = model.graph, [], set()
    inits = {t.name for t in graph.initializer}
    for v in graph.input:
        ds = v.type.tensor_type.shape.dim
        if v.name in inits or not ds or ds[0].dim_value > 0 or any(d.dim_value <= 0 for d in ds[1:]):
            continue
        name = ds[0].dim_param
        if name:
            names.add(name)
        ds[0].Clear()
        ds[0].dim_value = 1
        notes.append(f"{v.name}: its dynamic first dim{f' {name!r}' if name else ''} taken as 1 (a CVM model's "
                     f"shapes are static)")
    for v in [*graph.value_info, *graph.output] if names else []:
        for d in v.type.tensor_type.shape.dim:
            if d.dim_param in names:
                d.Clear()
                d.dim_value = 1
    return notes


def import_model(model: onnx.ModelProto, input_precision: int = 8, base_dir: str | os.PathLike | None = None,
                 outputs: list[str] | None = None, two_part: bool = True,
                 progress: Callable[[int, int | None, str], None] | None = None, pack: bool = False,
                 input_precisions: dict[str, int] | None = None) -> Imported:
    """``from_onnx`` with what a report and a model directory need besides the graph (``Imported``).
    ``outputs``: cut the graph at these tensors (they become the outputs). ``two_part`` (default): a requantization
    whose one-part product is not exact takes two products where they are closer (a sum: where one part errs by
    more than ``requant_plans.SPLIT`` of a step; docs/import.md, "Two-part products"); False: one part only, fewer CVM
    ops. ``progress(done, total, stage)`` is told of each node group imported ("importing") and of the final check
    ("validating"). ``pack``: a model of several inputs takes them packed into one ``data`` (``_Walk.inputs``; their
    layout in ``edges.inputs``), as the CVM runtime feeds one input only. ``input_precisions``: an integer input's
    precision by its name (others: ``input_precision``)."""
    if not 1 <= input_precision <= 32:
        raise UnsupportedError(f"input precision {input_precision} must lie in [1, 32]", where="data")
    if any(p.key == OPTIMIZED for p in model.metadata_props):
        raise UnsupportedError("this is the exporter's serving form (--optimize), whose fused nodes do not map back "
                               "to CVM ops; import the model converted without --optimize")
    if any(p.key == FLOAT_IO for p in model.metadata_props):
        model = without_float_edges(model)
    if outputs:
        model = cut(model, outputs)
    walk = _Walk(model, input_precision, None if base_dir is None else Path(base_dir), pack, input_precisions)
    if two_part:
        walk.ctx.split_above = Fraction(0)
    walk.progress = progress
    return walk.run()


def from_onnx(model: onnx.ModelProto, input_precision: int = 8,
              base_dir: str | os.PathLike | None = None) -> Graph:
    """Import an ONNX model as a validated CVM graph that computes the same values, bit for bit, for inputs
    within ``input_precision`` (the runtime clamps its input to it).

    Models written by the exporter come back as the CVM graph they came from (names, attributes, precisions,
    params byte for byte). ``base_dir`` is the model's directory, needed only for external data. Raises
    ``FormatError`` for an unsafe or malformed model and ``UnsupportedError`` listing every node without an
    exact CVM form.
    """
    return import_model(model, input_precision, base_dir).graph
