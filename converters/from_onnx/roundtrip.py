"""Import rules of the exporter's own nodes: every CVM op comes back as it was.

* Function form: a node of domain ``cvm`` whose op type is the CVM op and whose ONNX attributes are its bound
  attributes (bools as 0/1, tuples as int lists), read back by the registry's attribute kinds.
* Native nodes: domain ``cvm.native`` (get_valid_counts, non_max_suppression, cvm_lut; cvm_lut's ``in_dim`` is
  its table's size).
* Flat form: the nodes of one CVM node's body, each marked with metadata ``cvm.node`` (its name), ``cvm.op`` and
  ``cvm.attrs`` (JSON). The group's outputs are the tensors the exporter names after the node (``name``,
  ``name:k``); its inputs are the tensors it consumes from outside. The ONNX nodes do not record which input
  position each of those fills (nor a repeated input), so the order taken is the one for which the exporter's
  lowering, re-run on it, reproduces the group's nodes exactly: the markers are verified, not trusted.
"""
from __future__ import annotations

import itertools
import json
import math
from typing import Any, Iterator

import onnx

from cvm_onnx.converters.to_onnx.lowering import DOMAIN, Value, lower
from cvm_onnx.graph import Node
from cvm_onnx.native import ATTRS as NATIVE_OPS
from cvm_onnx.native import DOMAIN as NATIVE_DOMAIN
from cvm_onnx.ops import REGISTRY, Attrs

from .context import Importer, Tensor, cvm_shape
from .registry import NodeView, Refuse, rule

MARKS = ("cvm.node", "cvm.op", "cvm.attrs")
MAX_ORDERS = 720  # input orders tried per flat-form node (the first, in order of use, is the usual one)


def marks(node: onnx.NodeProto) -> dict[str, str]:
    """The flat-form markers of a node."""
    return {p.key: p.value for p in node.metadata_props if p.key in MARKS}


def outer_inputs(nodes: list[onnx.NodeProto]) -> list[str]:
    """Tensors the nodes consume that none of them produces, in order of first use."""
    produced = {o for n in nodes for o in n.output}
    return list(dict.fromkeys(x for n in nodes for x in n.input if x and x not in produced))


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


def _orders(outer: list[str], lo: int, hi: int) -> Iterator[tuple[str, ...]]:
    """Input lists using every outer tensor: first in order of use, then others (repeats allowed), bounded."""
    first = tuple(outer)
    if lo <= len(first) <= hi:
        yield first
    for n in range(max(lo, len(outer)), min(hi, len(outer) + 2) + 1):
        for seq in itertools.islice(itertools.product(outer, repeat=n), MAX_ORDERS):
            if seq != first and set(seq) == set(outer):
                yield seq


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
    op = m["cvm.op"]
    try:
        raw = json.loads(m.get("cvm.attrs", "{}"))
    except ValueError:
        raise Refuse(f"cvm.attrs is not JSON: {m['cvm.attrs']!r:.80}") from None
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
    outer = outer_inputs(nodes)
    want = [_canonical(n) for n in nodes]
    lo, hi = cls.arity(a)
    for seq in _orders(outer, lo, hi):
        entries = tuple(ctx.entry(tensors[x]) for x in seq)
        try:
            node = ctx.typed(op, entries, name, attrs)
        except Refuse:
            continue
        if any(shapes.get(o, t.shape) != t.shape for o, t in zip(out_names, node.outputs)):
            continue
        if _lowered(ctx, node, a, seq, out_names) == want:
            return {o: ctx.tensor(e) for o, e in zip(out_names, ctx.add(node))}
    raise Refuse(f"no order of the tensors it consumes ({', '.join(outer) or 'none'}) makes the exporter's "
                 f"lowering of {op} reproduce its flat-form nodes")

