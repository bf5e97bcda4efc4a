"""Import rules of the exporter's own nodes: every CVM op comes back as it was.

* Function form: a node of domain ``cvm`` whose op type is the CVM op and whose ONNX attributes are its bound
  attributes (bools as 0/1, tuples as int lists), read back by the registry's attribute kinds.
* Native nodes: domain ``cvm.native`` (get_valid_counts, non_max_suppression, cvm_lut; cvm_lut's ``in_dim`` is
  its table's size).
* Flat form: the nodes of one CVM node's body, each marked with metadata ``cvm.node`` (its name), ``cvm.op``,
  ``cvm.attrs`` (JSON) and ``cvm.inputs`` (JSON: its input tensors in order). The group's outputs are the tensors
  the exporter names after the node (``name``, ``name:k``). The markers are verified, not trusted: the exporter's
  lowering, re-run on them, must reproduce the group's nodes exactly.
* Source symbol: the metadata ``cvm.symbol.zlib`` holds the text of the symbol file the model was converted from
  (zlib-compressed, base64; unpacked to at most twice the size of the graph's own symbol, plus 1 MiB). It
  is written back as it is (byte for byte: attributes as given, their order, the dialect's layout) only when it
  describes the graph imported: the same nodes, bound attributes, inputs, output types and heads.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from typing import Any

import onnx

from cvm_onnx.converters.to_onnx.lowering import Value, lower
from cvm_onnx.core.constants import DOMAIN, MARK_ATTRS, MARK_INPUTS, MARK_NODE, MARK_OP, SYMBOL
from cvm_onnx.core.errors import CVMError
from cvm_onnx.core.format import read_symbol, unpack_symbol, write_symbol
from cvm_onnx.core.graph import Graph, Node
from cvm_onnx.core.ops import REGISTRY, Attrs
from cvm_onnx.core.validate import validate
from cvm_onnx.native import ATTRS as NATIVE_OPS
from cvm_onnx.native import DOMAIN as NATIVE_DOMAIN

from .context import Importer, Tensor, cvm_shape
from .registry import NodeView, Refuse, rule

MARKS = (MARK_NODE, MARK_OP, MARK_ATTRS, MARK_INPUTS)


def marks(node: onnx.NodeProto) -> dict[str, str]:
    """The flat-form markers of a node."""
    return {p.key: p.value for p in node.metadata_props if p.key in MARKS}


def group_inputs(nodes: list[onnx.NodeProto]) -> list[str]:
    """The tensors a flat-form group reads: those marked in ``cvm.inputs`` and those its nodes consume from outside."""
    produced = {o for n in nodes for o in n.output}
    try:
        marked = [x for x in json.loads(marks(nodes[0]).get(MARK_INPUTS, "[]")) if isinstance(x, str)]
    except (ValueError, TypeError):
        marked = []
    return list(dict.fromkeys(marked + [x for n in nodes for x in n.input if x and x not in produced]))


def cvm_attrs(op: str, raw: dict[str, Any]) -> dict[str, Any]:
    """ONNX/JSON attribute values as typed CVM values, by the registry's kinds (int 0/1 -> bool, list -> tuple)."""
    kinds = {a.name: a.kind for a in REGISTRY[op].attrs}
    out = {}
    for k, v in raw.items():
        if kinds.get(k) == "bool" and isinstance(v, int) and not isinstance(v, bool) and v in (0, 1):
            v = bool(v)
        elif kinds.get(k) == "tuple" and isinstance(v, list):
            v = tuple(v)
        out[k] = v
    return out


def _call(ctx: Importer, node: NodeView, xs: tuple[Tensor | None, ...], attrs: dict[str, Any]) -> list[Tensor]:
    if any(x is None for x in xs):
        raise Refuse("an input is omitted")
    entries = tuple(ctx.entry(x) for x in xs)
    outs = ctx.add(ctx.typed(node.op_type, entries, node.name, cvm_attrs(node.op_type, attrs)))
    return [ctx.tensor(e) for e in outs]


@rule(*REGISTRY, domain=DOMAIN, since=1)
def cvm_op(ctx, node, *xs):
    """A CVM op called as a function of domain cvm: the op with its attributes."""
    return _call(ctx, node, xs, node.attrs)


@rule(*NATIVE_OPS, domain=NATIVE_DOMAIN, since=1)
def native_op(ctx, node, *xs):
    """A native custom op: the CVM op of the same name (cvm_lut's in_dim from its table)."""
    attrs = node.attrs
    if node.op_type == "cvm_lut" and len(xs) == 2 and xs[1] is not None:
        attrs["in_dim"] = math.prod(cvm_shape(xs[1].shape))
    return _call(ctx, node, xs, attrs)


# -- flat form --------------------------------------------------------------------------------------------------
def _canonical(n: onnx.NodeProto) -> bytes:
    """A node without its name, doc string and metadata."""
    c = onnx.NodeProto()
    c.CopyFrom(n)
    c.name, c.doc_string = "", ""
    del c.metadata_props[:]
    return c.SerializeToString(deterministic=True)


def _lowered(ctx: Importer, node: Node, a: Attrs, in_names: tuple[str, ...], out_names: list[str]) -> list[bytes]:
    """The exporter's flat nodes of ``node`` (its lowering, renamed as the exporter renames), canonical."""
    ins = [Value(f"x{k}", ctx.type_of(e).shape, ctx.bounds[e], ctx.param_value(e)) for k, e in enumerate(node.inputs)]
    outs = [Value("", t.shape, b) for t, b in zip(node.outputs, ctx.bounds_of(node))]
    try:
        body, body_outs = lower(node.op, a, ins, outs)
    except Exception:  # noqa: BLE001  (a lowering may fail on a wrong input order: then it is not this order)
        return []
    rename = dict(zip([v.name for v in ins], in_names)) | dict(zip(body_outs, out_names))
    flat = []
    for inner in body.nodes:
        n = onnx.NodeProto()
        n.CopyFrom(inner)
        n.input[:] = [rename.get(t, f"{node.name}/{t}") if t else t for t in inner.input]
        n.output[:] = [rename.get(t, f"{node.name}/{t}") for t in inner.output]
        flat.append(_canonical(n))
    return flat


def import_group(ctx: Importer, name: str, nodes: list[onnx.NodeProto], tensors: dict[str, Tensor],
                 shapes: dict[str, tuple[int, ...]]) -> dict[str, Tensor]:
    """The CVM node of a flat-form group, verified against the exporter's lowering; its output tensors."""
    m = marks(nodes[0])
    op = m[MARK_OP]
    try:
        raw = json.loads(m.get(MARK_ATTRS, "{}"))
    except ValueError:
        raise Refuse(f"{MARK_ATTRS} is not JSON: {m[MARK_ATTRS]!r:.80}") from None
    if not isinstance(raw, dict):
        raise Refuse("cvm.attrs must be a JSON object")
    cls = REGISTRY[op]
    attrs = cvm_attrs(op, raw)
    typed, errors = cls.parse_attrs(attrs)
    if errors:
        raise Refuse(f"{op}: " + "; ".join(errors))
    a = cls.bind(typed)
    out_names = [name] + [f"{name}:{k}" for k in range(1, cls.outputs)]
    produced = {o for n in nodes for o in n.output}
    if missing := [o for o in out_names if o not in produced]:
        raise Refuse(f"the flat-form nodes of {name} do not produce its output(s) {missing}")
    try:
        seq = tuple(json.loads(m.get(MARK_INPUTS, "null")))
    except (ValueError, TypeError):
        raise Refuse(f"{MARK_INPUTS} is not a JSON list: {m.get(MARK_INPUTS)!r:.80}") from None
    if not all(isinstance(x, str) and x in tensors for x in seq):
        raise Refuse(f"cvm.inputs names tensors that are not defined before it: {list(seq)!r:.120}")
    node = ctx.typed(op, tuple(ctx.entry(tensors[x]) for x in seq), name, attrs)
    if any(shapes.get(o, t.shape) != t.shape for o, t in zip(out_names, node.outputs)):
        raise Refuse(f"the output shapes of {name} differ from those of {op} on its inputs")
    if _lowered(ctx, node, a, seq, out_names) != [_canonical(n) for n in nodes]:
        raise Refuse(f"its flat-form nodes are not the exporter's lowering of {op} on its marked inputs")
    return {o: ctx.tensor(e) for o, e in zip(out_names, ctx.add(node))}


# -- source symbol ----------------------------------------------------------------------------------------------
def _structure(graph: Graph) -> tuple[Counter, list[tuple[str, int]]]:
    """The graph independent of its node order: a digest per node of its name, op, bound attributes, output types
    and its inputs' digests (as a multiset), and the heads' digests."""
    keys: list[str] = []
    for n in graph.nodes:
        attrs = None if n.is_variable else repr(sorted(REGISTRY[n.op].bind(n.attrs).items()))
        text = repr((n.name, n.op, attrs, n.outputs, n.name in graph.params,
                     [(keys[e.node], e.index) for e in n.inputs]))
        keys.append(hashlib.sha256(text.encode()).hexdigest())
    return Counter(keys), [(keys[h.node], h.index) for h in graph.heads]


def source_symbol(model: onnx.ModelProto, graph: Graph) -> str | None:
    """The symbol text stored in ``model`` if it describes ``graph`` (validated, with its params), else None."""
    packed = next((p.value for p in model.metadata_props if p.key == SYMBOL), None)
    if packed is None:
        return None
    try:
        text = unpack_symbol(packed, limit=2 * len(write_symbol(graph).encode()) + (1 << 20))
        if text is None:
            return None
        stored = read_symbol(text, where=SYMBOL)
        stored.params = graph.params
        stored = validate(stored).graph
    except CVMError:
        return None
    return text if _structure(stored) == _structure(graph) else None
