"""Safety checks on an ONNX model before anything of it is run or allocated (every problem at once).

* tensors (initializers, Constant values) by ``format.onnx_safety.tensor_problem``: dims >= 0, at most 2^30
  elements, data of exactly the declared size; external data inside the model's directory, within its file;
* the graph: every input of a node defined (graph input, initializer or another node's output), each tensor
  produced once, no cycle;
* declared shapes (inputs, outputs, value_info) of at most 2^30 elements, each dim in [0, 2^24] (a dim < 0, as
  Paddle's exports write, is unknown, as onnxruntime reads it);
* every string UTF-8; tensors of a type that can be read (bool, integer, float; a valid type CVM lacks, int4 or
  float8, is ``UnsupportedError`` when nothing else is wrong); declared element types that exist;
* versions: an IR version and one ai.onnx opset that the installed onnx and onnxruntime read, the project's own
  domains at their versions, every node's domain imported;
* every node against its op's schema for the model's opset (onnx.defs for ai.onnx and the domains onnx knows, the
  op registry for the exporter's cvm domain, the registered schemas of cvm.native, onnxruntime's of its contrib
  domain com.microsoft): input and output counts, '' (an absent input or output) only where the schema marks
  the position optional, no unknown, repeated or mistyped attribute, every required one present. Import rules
  can then read typed, present values (``registry.NodeView``).

``checked_order`` returns the nodes in a topological order or raises ``FormatError`` listing the problems.
``tensor_array`` (from ``format.onnx_safety``) reads a checked tensor, external data included.
"""
from __future__ import annotations

import functools
import heapq
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper

from cvm_onnx import native
from cvm_onnx.core.constants import DOMAIN as CVM_DOMAIN
from cvm_onnx.core.constants import DOMAIN_VERSION as CVM_DOMAIN_VERSION
from cvm_onnx.core.constants import INT32_MAX
from cvm_onnx.core.errors import FormatError, Problem, UnsupportedError
from cvm_onnx.core.format.onnx_file import dims
from cvm_onnx.core.format.onnx_safety import (
    MAX_ELEMENTS,
    call_problems,
    not_utf8,
    tensor_array,  # noqa: F401  (the rules read it from here)
    tensor_problem,
    unsupported_type,
)
from cvm_onnx.core.graph import MAX_DIM  # noqa: F401  (the rules read it from here)
from cvm_onnx.core.ops import REGISTRY
from cvm_onnx.core.ops.registry import REQUIRED

def node_label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"node {index} ({node.op_type})"


def _shape_problem(vi: onnx.ValueInfoProto) -> str | None:
    known = [d for d in dims(vi) or () if d is not None]
    if any(d > MAX_DIM for d in known) or math.prod(known) > MAX_ELEMENTS:
        return f"declares shape {known}: dims must lie in [0, 2^24], at most 2^30 elements"
    return None


def _tensors(graph: onnx.GraphProto):
    """(where, tensor) for every initializer and every tensor-valued Constant attribute."""
    for t in graph.initializer:
        yield f"initializer {t.name!r}", t
    for i, n in enumerate(graph.node):
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield node_label(n, i), a.t


# -- versions and op schemas ---------------------------------------------------------------------------------------
DEFAULT_DOMAINS = ("", "ai.onnx")
MIN_IR_VERSION = 3  # models declare their opsets (opset_import) from IR version 3 on
#: The versions of the project's own domains: the exporter's function domain, the native custom ops.
OWN_DOMAINS = {CVM_DOMAIN: CVM_DOMAIN_VERSION, native.DOMAIN: native.VERSION}
#: The ONNX attribute type of each CVM attribute kind (bools as 0/1, tuples as int lists).
KIND_TYPES = {"int": AttributeProto.INT, "bool": AttributeProto.INT, "optional_int": AttributeProto.INT,
              "tuple": AttributeProto.INTS, "str": AttributeProto.STRING}


def domain_of(name: str) -> str:
    """A domain name with the default domain as ''."""
    return "" if name in DEFAULT_DOMAINS else name


@functools.cache
def supported_versions() -> tuple[int, int]:
    """(IR version, ai.onnx opset): the highest that both the installed onnx and onnxruntime read (onnxruntime is
    asked with a one-node model, from onnx's highest version down)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3

    def loads(ir: int, opset: int) -> bool:
        vi = [helper.make_tensor_value_info(n, TensorProto.INT32, [1]) for n in "xy"]
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", vi[:1], vi[1:])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)
        try:
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            return True
        except Exception:  # noqa: BLE001  (onnxruntime's refusals come in several types)
            return False

    ir = next((v for v in range(onnx.IR_VERSION, MIN_IR_VERSION, -1) if loads(v, 7)), MIN_IR_VERSION)
    return ir, next((v for v in range(onnx.defs.onnx_opset_version(), 1, -1) if loads(ir, v)), 1)


def version_problems(model: onnx.ModelProto) -> list[Problem]:
    """The model's IR version and opset imports against what onnx, onnxruntime and cvm-onnx read: one import per
    domain, one of ai.onnx, versions that exist."""
    ir_max, opset_max = supported_versions()
    out = []
    if not MIN_IR_VERSION <= model.ir_version <= ir_max:
        out.append(Problem("model", f"ir_version {model.ir_version} is not one the installed onnx and onnxruntime "
                                    f"read ({MIN_IR_VERSION} to {ir_max})"))
    counts = Counter(domain_of(o.domain) for o in model.opset_import)
    out += [Problem("model", f"opset_import names domain {d or 'ai.onnx'} {n} times (once at most)")
            for d, n in counts.items() if n > 1]
    versions = {domain_of(o.domain): o.version for o in model.opset_import}
    if "" not in versions:
        out.append(Problem("model", "opset_import has no version of the default domain ai.onnx"))
    elif not 1 <= versions[""] <= opset_max:
        out.append(Problem("model", f"ai.onnx opset {versions['']} is not one the installed onnx and onnxruntime "
                                    f"read (1 to {opset_max})"))
    out += [Problem("model", f"domain {d} version {versions[d]} is not cvm-onnx's ({v})")
            for d, v in OWN_DOMAINS.items() if versions.get(d, v) != v]
    return out


@dataclass(frozen=True)
class Signature:
    """What a node of one op may hold: input and output counts, the positions that may be '' (an absent
    optional input or output), and its attributes, name -> (ONNX attribute type, required)."""

    inputs: tuple[int, int]
    outputs: tuple[int, int]
    optional_inputs: Callable[[int], bool]
    optional_outputs: Callable[[int], bool]
    attrs: dict[str, tuple[int, bool]]
    input_names: Callable[[int], str] = str


def _optional(formals: list) -> Callable[[int], bool]:
    """Whether position k of a schema's formal parameters is Optional (a variadic last one covers the rest)."""
    option = onnx.defs.OpSchema.FormalParameterOption
    return lambda k: bool(formals) and formals[min(k, len(formals) - 1)].option == option.Optional


def _of_schema(s: onnx.defs.OpSchema) -> Signature:
    names = [f.name for f in s.inputs]
    return Signature((s.min_input, s.max_input), (s.min_output, s.max_output), _optional(s.inputs),
                     _optional(s.outputs), {n: (a.type.value, a.required) for n, a in s.attributes.items()},
                     lambda k: names[min(k, len(names) - 1)] if names else str(k))


def _of_cvm_op(op: type) -> Signature:
    """A CVM op called in the exporter's function domain: the op registry's attributes (its arity depends on
    them: the import rule checks it)."""
    return Signature((0, INT32_MAX), (1, op.outputs), lambda k: False, lambda k: False,
                     {a.name: (KIND_TYPES[a.kind], a.default is REQUIRED) for a in op.attrs})


def signature(node: onnx.NodeProto, versions: dict[str, int],
              functions: frozenset[tuple[str, str, str]] = frozenset()) -> Signature | str | None:
    """The node's signature by its domain's schema (ONNX's for ai.onnx and other domains onnx knows, the project's
    for cvm and cvm.native), the reason there is none where one must exist, or None (a domain the rules judge).
    A node of the cvm domain calls a function the model defines (``functions``: domain, name, overload)."""
    domain = domain_of(node.domain)
    if domain not in versions:
        return f"its domain {domain!r} is not in the model's opset_import"
    version = min(versions[domain], INT32_MAX)
    if domain == CVM_DOMAIN:
        if node.op_type not in REGISTRY:
            return f"cvm has no op {node.op_type}"
        if (node.domain, node.op_type, node.overload) not in functions:
            return f"calls function {node.domain}.{node.op_type}{f'({node.overload})' if node.overload else ''}, " \
                   "which the model does not define"
        return _of_cvm_op(REGISTRY[node.op_type])
    if version < 1 or not onnx.defs.has(node.op_type, version, domain):
        if domain in ("", native.DOMAIN):
            return f"{domain or 'ai.onnx'} has no op {node.op_type} in version {versions[domain]}"
        if domain in CONTRIB_DOMAINS:
            return contrib_signature(domain, node.op_type, version)
        return None
    s = onnx.defs.get_schema(node.op_type, version, domain)
    if s.deprecated:
        return f"{node.op_type} is deprecated in {domain or 'ai.onnx'} version {version}"
    return _of_schema(s)


#: Domains whose schemas onnxruntime registers (its contrib ops: QGemm, QLinearAdd, ...), not onnx.
CONTRIB_DOMAINS = ("com.microsoft",)


@functools.cache
def _contrib_schemas() -> dict[tuple[str, str], list]:
    """onnxruntime's registered schemas of CONTRIB_DOMAINS by (domain, op), each op's versions newest first."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    out: dict[tuple[str, str], list] = {}
    for s in ort_c.get_all_operator_schema():
        if s.domain in CONTRIB_DOMAINS:
            out.setdefault((s.domain, s.name), []).append(s)
    return {k: sorted(v, key=lambda s: -s.since_version) for k, v in out.items()}


def contrib_signature(domain: str, op: str, version: int) -> Signature | str:
    """A contrib op's signature by onnxruntime's own schema (what its kernels are registered against): input
    and output counts, optional positions and attributes, as for an onnx schema; the reason where it has none."""
    s = next((s for s in _contrib_schemas().get((domain, op), []) if s.since_version <= version), None)
    if s is None:
        return f"onnxruntime has no op {domain}::{op} in version {version}"
    names = [f.name for f in s.inputs]

    def optional(formals: list) -> Callable[[int], bool]:
        return lambda k: bool(formals) and formals[min(k, len(formals) - 1)].option.name == "Optional"

    return Signature((s.min_input, s.max_input), (s.min_output, s.max_output), optional(s.inputs),
                     optional(s.outputs), {n: (int(a.type.value), bool(a.required)) for n, a in s.attributes.items()},
                     lambda k: names[min(k, len(names) - 1)] if names else str(k))


def type_problem(node: onnx.NodeProto, version: int, dtypes: list[int | None]) -> str | None:
    """Why the element types of a node's inputs (None: absent) break its onnx schema's type constraints (each
    input's types allowed, inputs sharing a type parameter of one type), or None; ops without an onnx schema
    pass. onnxruntime refuses such a node; its import rule would compute on types the op does not take."""
    domain = domain_of(node.domain)
    if domain == CVM_DOMAIN or not 1 <= version <= INT32_MAX or not onnx.defs.has(node.op_type, version, domain):
        return None
    s = onnx.defs.get_schema(node.op_type, version, domain)
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in s.type_constraints}
    taken: dict[str, str] = {}
    for k, dtype in enumerate(dtypes):
        if dtype is None or not s.inputs:
            continue
        formal = s.inputs[min(k, len(s.inputs) - 1)]
        name = f"tensor({TensorProto.DataType.Name(dtype).lower()})"
        options = allowed.get(formal.type_str, {formal.type_str})
        if name not in options:
            return (f"{node.op_type}: input {k} ({formal.name}) is {name}, not one of "
                    f"{', '.join(sorted(options))} (its schema's {formal.type_str})")
        if formal.is_homogeneous and taken.setdefault(formal.type_str, name) != name:
            return (f"{node.op_type}: input {k} ({formal.name}) is {name}, but an earlier input of type "
                    f"{formal.type_str} is {taken[formal.type_str]}")
    return None


#: The ONNX ops of multidirectional (numpy) broadcasting.
BROADCASTING = frozenset({"Add", "And", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Div", "Equal",
                          "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Max", "Mean", "Min", "Mod", "Mul", "Or",
                          "Pow", "Sub", "Sum", "Where", "Xor"})


def broadcast_problem(node: onnx.NodeProto, shapes: list[tuple[int, ...] | None]) -> str | None:
    """Why the shapes of a broadcasting op's inputs (None: absent) break ONNX's multidirectional broadcasting, or
    None. onnxruntime refuses such a node; its import rule would reach a CVM op's own shape rule."""
    if domain_of(node.domain) != "" or node.op_type not in BROADCASTING:
        return None
    known = [tuple(s) for s in shapes if s is not None]
    try:
        np.broadcast_shapes(*known)
    except ValueError:
        return (f"{node.op_type}: input shapes {', '.join(map(str, known))} do not broadcast (ONNX's multidirectional "
                "broadcasting: right-aligned dims equal, or one of them 1)")
    return None


#: Attributes that a later opset gives an op, with what to do about them. quantize_static writes per-channel
#: DequantizeLinear with axis at any opset, which onnxruntime refuses below 13 ('Unrecognized attribute: axis').
LATER_ATTRS = {(op, "axis"): f"{op}: attribute 'axis' (per-channel quantization) exists from opset 13 on; "
               "onnxruntime refuses it below too: quantize the float model raised to opset 13 (onnx.version_converter"
               "; cvm-onnx quantize does)" for op in ("QuantizeLinear", "DequantizeLinear")}


def _count(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"at least {lo}" if hi >= INT32_MAX else f"{lo} to {hi}"


def _type_name(t: int) -> str:
    return AttributeProto.AttributeType.Name(t) if t in AttributeProto.AttributeType.values() else f"type {t}"


def node_problems(node: onnx.NodeProto, sig: Signature) -> list[str]:
    """Every way ``node`` breaks its signature: input/output counts, '' where the position is not optional,
    unknown, repeated, mistyped or missing required attributes, a reduction's keepdims other than 0 or 1."""
    op, out = node.op_type, []
    for verb, what, names, (lo, hi), optional in (
            ("takes", "input", node.input, sig.inputs, sig.optional_inputs),
            ("gives", "output", node.output, sig.outputs, sig.optional_outputs)):
        if not lo <= len(names) <= hi:
            out.append(f"{op} {verb} {_count(lo, hi)} {what}(s), has {len(names)}")
        for k, name in enumerate(names):
            if not name and not optional(k):
                formal = f" ({sig.input_names(k)})" if what == "input" else ""
                out.append(f"{op}: {what} {k}{formal} is required, but empty")
    given = Counter(a.name for a in node.attribute)
    for a in node.attribute:
        want = sig.attrs.get(a.name)
        if want is None:
            out.append(LATER_ATTRS.get((op, a.name)) or
                       f"{op}: unknown attribute {a.name!r} (known: {', '.join(sig.attrs) or 'none'})")
        elif a.ref_attr_name:
            out.append(f"{op}: attribute {a.name} refers to a function's attribute outside a function")
        elif want[0] != a.type:
            out.append(f"{op}: attribute {a.name} must be {_type_name(want[0])}, got {_type_name(a.type)}")
        elif a.name == "keepdims" and a.i not in (0, 1) and (op.startswith("Reduce") or op in ("ArgMax", "ArgMin")):
            out.append(f"{op}: attribute keepdims must be 0 or 1, got {a.i} (onnxruntime reads it as 0, onnx's "
                       "reference as 1)")
    out += [f"{op}: attribute {name} is given {n} times" for name, n in given.items() if n > 1]
    out += [f"{op}: attribute {name} is required" for name, (_, required) in sig.attrs.items()
            if required and name not in given]
    return out


def _value_type_problem(vi: onnx.ValueInfoProto) -> str | None:
    if not vi.type.HasField("tensor_type"):
        return None
    t = vi.type.tensor_type.elem_type
    if t == TensorProto.UNDEFINED or t not in TensorProto.DataType.values():
        return f"declares element type {t}, which is no ONNX tensor type"
    return None


def checked_order(model: onnx.ModelProto, base_dir: Path | None) -> list[int]:
    """Indices of the graph's nodes in a topological order, after every safety check; else ``FormatError``."""
    if bad := list(not_utf8(model, "model")):
        raise FormatError([Problem(where, "string is not UTF-8") for where in bad])
    if problems := version_problems(model):  # no node can be judged against versions that do not exist
        raise FormatError(problems)
    graph = model.graph
    versions = {domain_of(o.domain): o.version for o in model.opset_import}
    functions = frozenset((f.domain, f.name, f.overload) for f in model.functions)
    problems = [Problem(where, f"tensor {rule}") for where, t in _tensors(graph)
                if (rule := tensor_problem(t, base_dir)) is not None] + call_problems(model)
    unsupported = [Problem(where, f"tensor {unsupported_type(t.data_type)}") for where, t in _tensors(graph)
                   if unsupported_type(t.data_type)]
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        problems += [Problem(vi.name, rule) for rule in (_shape_problem(vi), _value_type_problem(vi)) if rule]
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {s.values.name for s in graph.sparse_initializer}
    producer: dict[str, int] = {}
    for i, n in enumerate(graph.node):
        sig = signature(n, versions, functions)
        rules = [sig] if isinstance(sig, str) else [] if sig is None else node_problems(n, sig)
        problems += [Problem(node_label(n, i), rule) for rule in rules]
        for o in n.output:
            if o and (o in producer or o in defined):
                problems.append(Problem(node_label(n, i), f"output {o!r} is already defined elsewhere"))
            elif o:
                producer[o] = i
    users: list[list[int]] = [[] for _ in graph.node]
    waiting = [0] * len(graph.node)
    for i, n in enumerate(graph.node):
        for name in dict.fromkeys(x for x in n.input if x):
            if name in producer:
                users[producer[name]].append(i)
                waiting[i] += 1
            elif name not in defined:
                problems.append(Problem(node_label(n, i), f"input {name!r} is not defined by any node, graph "
                                                           "input or initializer"))
    for o in graph.output:
        if o.name not in producer and o.name not in defined:
            problems.append(Problem(o.name or "graph output ''", "graph output is not defined by any node, input "
                                                                 "or initializer"))
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in users[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < len(graph.node):
        stuck = [node_label(graph.node[i], i) for i in range(len(graph.node)) if waiting[i] > 0]
        problems.append(Problem("graph", f"the nodes form a cycle (or depend on one): {', '.join(stuck[:8])}"
                                         + (" ..." if len(stuck) > 8 else "")))
    if problems and problems == unsupported:  # valid tensors of a type CVM lacks (int4, float8 ...)
        raise UnsupportedError(problems)
    if problems:
        raise FormatError(problems)
    return order
