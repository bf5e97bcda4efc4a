"""CVM graph -> ONNX model: one node per CVM op node, decompositions as model-local functions.

The model: input ``data`` (int32, static shape) clamped to its declared precision as the runtime does, params
as initializers of their stored type (int8 or int32; function bodies widen int8 ones, a native op or a graph
output reads an int8 param through a Cast named ``<param>:int32``), each CVM op as a node of domain ``cvm``
calling a function specialised to its attributes and shapes (identical bodies share one function overload),
native custom ops in place, outputs named after the CVM heads, value_info with the static shape and the CVM
precision on every tensor, provenance in metadata_props.

The flat form (``inline=True``) puts every body's nodes in the main graph instead, named ``<cvm node>/<k>`` and
marked with metadata ``cvm.node``, ``cvm.op``, ``cvm.attrs`` and ``cvm.inputs`` so the CVM graph can still be
recovered.
"""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from cvm_onnx.core.batch import batched as batched_graph
from cvm_onnx.core.constants import (
    BATCH,
    CONVERTED_FROM,
    DOMAIN,
    DOMAIN_VERSION,
    IR_VERSION,
    MARK_ATTRS,
    MARK_FUSED,
    MARK_INPUTS,
    MARK_NODE,
    MARK_OP,
    MARK_OPS,
    NATIVE_LIBRARY,
    OPSET,
    OPTIMIZED,
    PRECISION,
    PROVIDER,
    QUANTIZATION,
    ROUTES,
    SOURCE_VERSION,
    SYMBOL,
    TARGET,
    __version__,
)
from cvm_onnx.core.errors import Problem, UnsupportedError
from cvm_onnx.core.format import Edges, pack_symbol
from cvm_onnx.core.graph import Entry, Graph, Node, TensorType
from cvm_onnx.core.ops import REGISTRY, Attrs
from cvm_onnx.native import DOMAIN as NATIVE_DOMAIN
from cvm_onnx.native import LIBRARY, ops_used
from cvm_onnx.native import VERSION as NATIVE_VERSION
from cvm_onnx.serving import pipeline
from cvm_onnx.serving.target import Target

from . import broadcast, elemwise, native, nn, reduce, requantize, transform  # noqa: F401  (registers the lowerings)
from .bounds import nonnegative, value_bounds
from .float_edges import ENDS, with_float_edges
from .lowering import LOWERINGS, Body, Value, lower


def onnx_attrs(a: Attrs) -> dict[str, Any]:
    """Typed CVM attributes as ONNX attribute values: bools as 0/1, tuples as int lists; None is left out."""
    out = {}
    for k, v in a.items():
        if v is not None:
            out[k] = int(v) if isinstance(v, bool) else [int(i) for i in v] if isinstance(v, tuple) else v
    return out


def entry_names(graph: Graph) -> dict[Entry, str]:
    """ONNX tensor name of every entry: the CVM node name, ``N:k`` for output k > 0 (N: output 0's name),
    ``name:clamped`` for an input after the runtime's clamp (the graph input keeps the plain name); an op output's
    name taken already (op nodes of one name, which the runtime allows, or named as a variable's tensors, or as the
    tensors the float edges add beside the input and the outputs: ``X:scale``..., float_edges.ENDS) or empty gets
    ``#n`` appended, so that every tensor has its own (the ONNX node takes its output 0's, a flat-form group its
    name too)."""
    names: dict[Entry, str] = {}
    used = {f"{node.name}{end}" for node in graph.nodes if node.is_variable
            for end in ("", ":clamped", ":min", ":max", ":clamp", ":int32")}
    ends = [graph.nodes[i].name for i in graph.inputs] + [
        graph.nodes[e.node].name if e.index == 0 else f"{graph.nodes[e.node].name}:{e.index}" for e in graph.heads]
    used |= {f"{name}:{end}" for name in ends for end in ENDS} - set(ends)  # (the outputs keep their names)

    def unique(name: str) -> str:
        out, n = name, 1
        while not out or out in used:  # (an empty name is no tensor in ONNX)
            out, n = f"{name}#{n}", n + 1
        used.add(out)
        return out

    for i, node in enumerate(graph.nodes):
        if node.is_variable and node.name not in graph.params:
            names[Entry(i)] = f"{node.name}:clamped"
        elif node.is_variable:
            names[Entry(i)] = node.name
        else:
            for k in range(len(node.outputs)):
                names[Entry(i, k)] = unique(node.name if k == 0 else f"{names[Entry(i)]}:{k}")
    return names


def value_info(name: str, t: TensorType, elem_type: int = TensorProto.INT32) -> onnx.ValueInfoProto:
    vi = helper.make_tensor_value_info(name, elem_type, list(t.shape))
    vi.metadata_props.add(key=PRECISION, value=str(t.precision))
    return vi


def unsupported(graph: Graph) -> list[Problem]:
    return [Problem(n.name, f"no ONNX lowering for CVM op {n.op!r}")
            for n in graph.nodes if not n.is_variable and n.op not in LOWERINGS]


class _Exporter:
    def __init__(self, graph: Graph, inline: bool, target: Target | None = None):
        self.graph, self.inline, self.target = graph, inline, target
        self.routes: list[list[str]] = []
        self.names = entry_names(graph)
        self.bounds = value_bounds(graph)
        self.nonneg = nonnegative(graph)
        self.nodes: list[onnx.NodeProto] = []
        self.functions: dict[bytes, onnx.FunctionProto] = {}
        self.overloads: dict[str, int] = {}
        self.initializers: list[str] = []  # params, written into the model last (their data is copied once)
        self.inputs: list[onnx.ValueInfoProto] = []
        self.infos: list[onnx.ValueInfoProto] = []
        self.domains = {"": OPSET}
        self.widened: set[str] = set()

    def variable(self, i: int, node: Node) -> None:
        t = node.outputs[0]
        value = self.graph.params.get(node.name)
        int8 = value is not None and value.dtype == np.int8
        self.infos.append(value_info(self.names[Entry(i)], t, TensorProto.INT8 if int8 else TensorProto.INT32))
        if value is not None:
            self.initializers.append(node.name)
            return
        self.inputs.append(helper.make_tensor_value_info(
            node.name, TensorProto.INT32, list(t.shape),
            doc_string=f"int32, values within precision {t.precision} (|x| <= {t.bound}; the model clamps them as "
                       f"the runtime does): cast int8 data to int32"))
        bounds = []
        for side, v in (("min", -t.bound), ("max", t.bound)):
            bounds.append(f"{node.name}:{side}")
            self.nodes.append(helper.make_node("Constant", [], [bounds[-1]], name=bounds[-1],
                                               value=numpy_helper.from_array(np.array(v, np.int32))))
        self.nodes.append(helper.make_node(
            "Clip", [node.name, *bounds], [self.names[Entry(i)]], name=f"{node.name}:clamp",
            doc_string=f"the runtime clamps its input to precision {t.precision}: |x| <= {t.bound}"))

    def op(self, i: int, node: Node) -> None:
        g = self.graph
        a = REGISTRY[node.op].bind(node.attrs)
        ins = [Value(name, g.type_of(e).shape, self.bounds[e], self.param(e))
               for name, e in zip(REGISTRY[node.op].input_names_for(len(node.inputs)), node.inputs)]
        outs = [Value("", o.shape, self.bounds[Entry(i, k)]) for k, o in enumerate(node.outputs)]
        body, body_outs = lower(node.op, a, ins, outs)
        in_names = [self.names[e] for e in node.inputs]
        out_names = [self.names[Entry(i, k)] for k in range(len(node.outputs))]
        self.infos.extend(value_info(n, o) for n, o in zip(out_names, node.outputs))
        doc = f"CVM {node.op}(" + ", ".join(f"{k}={v}" for k, v in a.items()) + ")"
        if LOWERINGS[node.op].native:
            (call,) = body.nodes
            call.name, call.doc_string = self.names[Entry(i)], doc
            call.input[:], call.output[:] = [self.int32(e) for e in node.inputs], out_names
            self.domains[NATIVE_DOMAIN] = NATIVE_VERSION
            self.nodes.append(call)
        elif self.inline:
            marks = {MARK_NODE: self.names[Entry(i)], MARK_OP: node.op,
                     MARK_ATTRS: json.dumps(onnx_attrs(a), sort_keys=True), MARK_INPUTS: json.dumps(in_names)}
            self.flatten(self.names[Entry(i)], marks, body, dict(zip([v.name for v in ins], in_names)) |
                         dict(zip(body_outs, out_names)))
        else:
            self.nodes.append(self.call(node, a, ins, body, body_outs, in_names, out_names, doc))
            self.nodes[-1].name = self.names[Entry(i)]

    def param(self, e: Entry) -> np.ndarray | None:
        """The value of a param entry (int8 or int32, as stored); None for other entries."""
        node = self.graph.nodes[e.node]
        return self.graph.params.get(node.name) if node.is_variable else None

    def int32(self, e: Entry) -> str:
        """The name of entry ``e`` as int32: an int8 param through its Cast (added once)."""
        name, value = self.names[e], self.param(e)
        if value is None or value.dtype != np.int8:
            return name
        if f"{name}:int32" not in self.widened:
            self.widened.add(f"{name}:int32")
            self.nodes.append(helper.make_node("Cast", [name], [f"{name}:int32"], name=f"{name}:int32",
                                               to=TensorProto.INT32))
        return f"{name}:int32"

    def call(self, node: Node, a: Attrs, ins: list[Value], body: Body, body_outs: list[str],
             in_names: list[str], out_names: list[str], doc: str) -> onnx.NodeProto:
        """A node of domain ``cvm`` calling the function of this body (shared with identical bodies)."""
        attrs = onnx_attrs(a)
        formal = {t: "out" if len(body_outs) == 1 else f"out{k}" for k, t in enumerate(body_outs)}
        for n in body.nodes:  # the body's outputs get readable names
            n.input[:] = [formal.get(t, t) for t in n.input]
            n.output[:] = [formal.get(t, t) for t in n.output]
        fn = helper.make_function(DOMAIN, node.op, [v.name for v in ins], list(formal.values()), body.nodes,
                                  [helper.make_opsetid("", OPSET)], attributes=list(attrs),
                                  doc_string=inspect.cleandoc(LOWERINGS[node.op].fn.__doc__ or ""))
        key = fn.SerializeToString(deterministic=True)
        if key not in self.functions:
            self.overloads[node.op] = self.overloads.get(node.op, 0) + 1
            fn.overload = str(self.overloads[node.op])
            self.functions[key] = fn
        self.domains[DOMAIN] = DOMAIN_VERSION
        call = helper.make_node(node.op, in_names, out_names, name=node.name, domain=DOMAIN, doc_string=doc)
        # int lists typed explicitly: an empty one (e.g. transpose axes=()) has no type to infer
        call.attribute.extend(helper.make_attribute(k, v, attr_type=onnx.AttributeProto.INTS if isinstance(v, list)
                                                    else None) for k, v in attrs.items())
        call.overload = self.functions[key].overload
        return call

    def run(self, chain: requantize.Chain) -> None:
        """A requantization run (requantize/), with the conv2d/dense that starts it if any, as one flat body
        named after its last node, marked with the CVM nodes it computes."""
        g = self.graph
        out, last = Entry(chain.all[-1]), g.nodes[chain.all[-1]]
        if chain.head is None:
            x, _ = requantize.steps_of(g, g.nodes[chain.nodes[0]], self.target.cpu_integer)
            ins, names, head_bound = [Value("data", g.type_of(x).shape, self.bounds[x])], [self.int32(x)], 0
        else:
            head = g.nodes[chain.head]
            ins = [Value(name, g.type_of(e).shape, self.bounds[e], self.param(e), e in self.nonneg)
                   for name, e in zip(REGISTRY[head.op].input_names_for(len(head.inputs)), head.inputs)]
            names, head_bound = [self.names[e] for e in head.inputs], self.bounds[Entry(chain.head)]
            if chain.unsigned is not None:  # the data is u (requantize.Unsigned); the weight a constant of the body
                u = chain.unsigned.data
                ins[0] = Value(ins[0].name, g.type_of(u).shape, self.bounds[u], None, u in self.nonneg)
                names[0] = self.int32(u)
        body, y = requantize.lower_run(g, chain, ins, Value("", last.outputs[0].shape, self.bounds[out]), head_bound,
                                       self.target)
        if any(n.domain == NATIVE_DOMAIN for n in body.nodes):
            self.domains[NATIVE_DOMAIN] = 1
        if y in {v.name for v in ins}:
            y = body.Identity(y)
        self.infos.append(value_info(self.names[out], last.outputs[0]))
        marks = {MARK_FUSED: json.dumps([g.nodes[i].name for i in chain.all]),
                 MARK_OPS: json.dumps([g.nodes[i].op for i in chain.all])}
        self.flatten(self.names[out], marks, body, dict(zip([v.name for v in ins], names)) | {y: self.names[out]})

    def flatten(self, prefix: str, marks: dict[str, str], body: Body, rename: dict[str, str]) -> None:
        """The body's nodes in the main graph: inner tensors and nodes prefixed by ``prefix`` (the CVM node's output
        name, ``entry_names``),
        each with the metadata ``marks`` (for a node of the flat form: the CVM node, op, attributes and input
        tensors, in input order, it comes from)."""
        for k, inner in enumerate(body.nodes):
            n = onnx.NodeProto()
            n.CopyFrom(inner)
            n.name = f"{prefix}/{k}"
            n.input[:] = [rename.get(t, f"{prefix}/{t}") if t else t for t in inner.input]
            n.output[:] = [rename.get(t, f"{prefix}/{t}") for t in inner.output]
            for key, value in marks.items():
                n.metadata_props.add(key=key, value=value)
            self.nodes.append(n)

    def heads(self) -> list[onnx.ValueInfoProto]:
        """Graph outputs named after the heads; a repeated head (or an input) gets its own name via Identity."""
        outputs, used = [], set()
        for h in self.graph.heads:
            name, t = self.int32(h), self.graph.type_of(h)
            if name in used or self.graph.nodes[h.node].is_variable:
                alias = f"{name}:out{len(outputs)}"
                self.nodes.append(helper.make_node("Identity", [name], [alias], name=alias))
                name = alias
            used.add(name)
            outputs.append(value_info(name, t))
        return outputs

    def model(self, source_version: str) -> onnx.ModelProto:
        fuse = self.target is not None
        chains = requantize.runs(self.graph, self.bounds, self.target, self.nonneg) if fuse else []
        if fuse:
            self.routes = requantize.conv_routes(self.graph, self.bounds, chains, self.target, self.nonneg)
        fused = {c.all[-1]: c for c in chains}
        inside = {i for c in fused.values() for i in c.all[:-1]}
        for i, node in enumerate(self.graph.nodes):
            if i in fused:
                self.run(fused[i])
            elif i not in inside:
                (self.variable if node.is_variable else self.op)(i, node)
        outputs = self.heads()
        out_names = {o.name for o in outputs}
        graph = helper.make_graph(self.nodes, "cvm", self.inputs, outputs, [],
                                  value_info=[v for v in self.infos if v.name not in out_names])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in self.domains.items()],
                                  functions=list(self.functions.values()), ir_version=IR_VERSION,
                                  producer_name="cvm-onnx", producer_version=__version__)
        order = {name: k for k, name in enumerate(self.graph.params)}  # the params file's order
        for name in sorted(self.initializers, key=order.__getitem__):
            value = self.graph.params[name]
            int8 = value.dtype == np.int8
            t = model.graph.initializer.add(name=name, data_type=TensorProto.INT8 if int8 else TensorProto.INT32,
                                            dims=value.shape)
            t.raw_data = np.ascontiguousarray(value, "i1" if int8 else "<i4").tobytes()
        native = ops_used(model)
        model.doc_string = self.about(native)
        helper.set_model_props(model, {CONVERTED_FROM: "CVM", SOURCE_VERSION: source_version} | (
            {NATIVE_LIBRARY: f"{LIBRARY} (domain {NATIVE_DOMAIN}: {', '.join(native)}); its path: "
                                   "python -m cvm_onnx.native"} if native else {}) | (
            {ROUTES: json.dumps(self.routes)} if self.target is not None else {}))
        return model

    def about(self, native: list[str]) -> str:
        """The model's doc string: what it is, what its inputs take, and the custom-op library it needs."""
        ins = "; ".join(f"{self.graph.nodes[i].name}: int32 {t.shape}, values within precision {t.precision} "
                        f"(|x| <= {t.bound})" for i in self.graph.inputs for t in self.graph.nodes[i].outputs[:1])
        text = (f"A CVM model converted by cvm-onnx {__version__}, bit-exact with the CVM runtime. Input {ins}: "
                "cast int8 data to int32.")
        if native:
            text += (f" Its {NATIVE_DOMAIN} ops ({', '.join(native)}) need the custom-op library {LIBRARY} of the "
                     "cvm-onnx package: onnxruntime.SessionOptions().register_custom_ops_library(path), the path "
                     "printed by `python -m cvm_onnx.native`.")
        return text


@dataclass(frozen=True)
class Export:
    """What one export made: the model; in the serving form each conv2d's route, (name, route, why not integer
    products or ""), as its metadata ``cvm.routes`` says (``requantize.conv_routes``), and the names of the
    passes run over it, in order (``cvm_onnx.serving.pipeline``); both empty in the other forms."""

    model: onnx.ModelProto
    routes: tuple[tuple[str, str, str], ...] = ()
    passes: tuple[str, ...] = ()


def to_onnx(graph: Graph, target: Target | None = None, *, inline: bool = False, source_version: str = "cvm_1.0.0",
            batch: int | None = None, symbol: str | None = None, edges: Edges | None = None, batched: bool = False,
            float_io: bool = False) -> onnx.ModelProto:
    """The model of ``export`` (same arguments)."""
    return export(graph, target, inline=inline, source_version=source_version, batch=batch, symbol=symbol,
                  edges=edges, batched=batched, float_io=float_io).model


def export(graph: Graph, target: Target | None = None, *, inline: bool = False, source_version: str = "cvm_1.0.0",
           batch: int | None = None, symbol: str | None = None, edges: Edges | None = None, batched: bool = False,
           float_io: bool = False) -> Export:
    """Export a validated CVM graph: for a ``target`` (``cvm_onnx.serving.target.Target``) its serving form, else
    the function form (``inline``: the flat form). The bytes are a function of the arguments alone.

    The serving form: the flat form with requantization runs fused (``requantize/``; where the target's products
    are "integer" a run may start from a conv2d's exact integer products, ``nn.conv2d_integer``: native im2col +
    MatMulInteger, instead of its float32 Conv), then the target's pass pipeline (``cvm_onnx.serving.pipeline``:
    for CUDA every node a kernel of onnxruntime's CUDA provider, ``cvm_onnx.runtime.placement`` checks it; for a
    CPU target its layout and operands). Metadata ``cvm.target`` states the target, ``cvm.provider`` its provider.

    ``symbol``: the text of the symbol file ``graph`` was read from, kept (packed) in the metadata
    ``cvm.symbol.zlib`` so the import writes it back byte for byte (when the graph imported is still the one it
    describes). ``batch``: the input's first dimension 1 becomes this batch size (``cvm_onnx.core.batch.batched``;
    refused with ``UnsupportedError`` where an op would not keep the batch axis); a batched model says its batch
    size in metadata ``cvm.batch``; ``batched``: ``graph`` already has batch size ``batch``. ``edges``: a quantized
    import's float edges, kept in metadata ``cvm.quantization`` (the model itself takes and gives integers;
    ``cvm-onnx run`` and the import back read them); ``float_io``: the edges in the graph instead, float32 input
    and outputs (``float_edges``).
    """
    if float_io and edges is None:
        raise UnsupportedError("float input and outputs need a quantized model (a model directory with "
                               "quantization.json, as convert and quantize write for a quantized ONNX model)")
    if problems := unsupported(graph):
        raise UnsupportedError(problems)
    if batch is not None and not batched:
        graph = batched_graph(graph, batch)
    exporter = _Exporter(graph, inline or target is not None, target)
    model = exporter.model(source_version)
    if symbol is not None and batch is None and target is None:
        model.metadata_props.add(key=SYMBOL, value=pack_symbol(symbol))
    if batch is not None:  # the samples' axis, for runners that split a batch (cvm_onnx.runtime.bulk)
        model.metadata_props.add(key=BATCH, value=str(batch))
    if edges is not None:
        model.metadata_props.add(key=QUANTIZATION, value=edges.to_bytes().decode())
    if target is None:
        return Export(with_float_edges(model, edges) if float_io else model)
    passes = pipeline(target)
    model = passes(model).model
    products = sum(n.op_type == "MatMulInteger" for n in model.graph.node)
    model.metadata_props.add(key=PROVIDER, value=target.provider)
    model.metadata_props.add(key=TARGET, value=target.text())
    model.metadata_props.add(key=OPTIMIZED, value=f"requantization runs fused ({products} from integer "
                             f"products); passes: {', '.join(passes.names)}")
    return Export(with_float_edges(model, edges) if float_io else model, tuple(map(tuple, exporter.routes)),
                  passes.names)
