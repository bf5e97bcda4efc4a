"""The CVM symbol JSON: read with the runtime's loader rules, written in the layout of the runtime's JSONWriter.

Reading accepts what the runtime's loader (``CvmRuntime::Load`` and ``PrepareGraphWithVersion``) accepts:
versions ``cvm_1.0.0`` (also when ``version`` is absent, as in the 2019 models) and ``cvm_1.1.0``, ``func_name``
values with a numeric suffix (``cvm_right_shift_11``, stripped as the runtime's ``GetOpName`` does), the legacy
``dtype`` graph attribute and the ignored node attributes (``flatten_data``, ``num_inputs``, ``num_outputs``,
``op_attrs``). Every broken rule is collected and reported in one ``FormatError``.

The format layer knows no ops: how many outputs each node has comes from ``node_row_ptr`` (exact in
``cvm_1.0.0``) or, when a ``cvm_1.1.0`` file has no usable one, from the highest output index that inputs and
heads refer to. Validation checks the counts against the op definitions.

Writing emits ``cvm_1.0.0`` with exact ``node_row_ptr`` and ``arg_nodes``, ``dltype`` all ``int32`` and
``storage_id`` = entry index (always a valid plan) unless that passes the runtime's 2^32-byte storage bound, then a
plan that reuses storage (``storage.storage_plan``), laid out byte for byte like the runtime's own writer.
"""
from __future__ import annotations

import base64
import binascii
import json
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

from ..attrs import format_value
from ..constants import INT32_MAX, INT32_MIN
from ..errors import FormatError, Problem
from ..graph import VARIABLE, Entry, Graph, Node, TensorType, shape_problem
from .storage import storage_plan

VERSIONS = ("cvm_1.0.0", "cvm_1.1.0")
DEFAULT_VERSION = "cvm_1.0.0"
TOP_KEYS = ("nodes", "arg_nodes", "node_row_ptr", "heads", "attrs", "version", "postprocess")
NODE_KEYS = ("op", "name", "inputs", "attrs", "precision")
IGNORED_NODE_ATTRS = ("flatten_data", "num_inputs", "num_outputs", "op_attrs")
GRAPH_ATTR_TAGS = {"shape": "list_shape", "storage_id": "list_int", "op_attrs": "list_str",
                   "precision": "list_int", "dltype": "list_str", "device_index": "list_int"}
# Ops whose output may share its input's storage id (graph_runtime.cc; "nagetive" is the runtime's spelling).
IN_PLACE_OPS = frozenset({"flatten", "relu", "expand_dims", "reshape", "squeeze", "abs", "cvm_precision",
                          "elemwise_add", "elemwise_sub", "nagetive", "clip", "cvm_clip", "cvm_right_shift",
                          "cvm_left_shift"})
INT32 = (INT32_MIN, INT32_MAX)
UINT32 = (0, (1 << 32) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
_SUFFIX = re.compile(r"_\d*$")
_ESCAPE = re.compile(r"\\(.)", re.S)
_RUNTIME_ESCAPES = {"\r": "\\r", "\n": "\\n", "\\": "\\\\", "\t": "\\t", '"': '\\"'}
_QUOTE = str.maketrans(_RUNTIME_ESCAPES)


def op_name(func_name: str) -> str:
    """The runtime's ``GetOpName``: drop a trailing ``_<digits>`` (``cvm_right_shift_11`` -> ``cvm_right_shift``)."""
    return _SUFFIX.sub("", func_name)


# -- JSON text ---------------------------------------------------------------------------------------------------
def _line_col(text: str, pos: int) -> str:
    return f"line {text.count(chr(10), 0, pos) + 1} column {pos - text.rfind(chr(10), 0, pos)}"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_json(text: str) -> tuple[Any, str | None, str | None]:
    """(value, place, rule): the parsed value, or where and why the runtime's JSON reader refuses the text."""
    try:
        value = json.loads(text, strict=False, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        return None, _line_col(text, e.pos), f"malformed JSON: {e.msg}"
    except ValueError as e:
        return None, "", f"malformed JSON: {e}"
    except RecursionError:
        return None, "", "malformed JSON: nested too deeply"
    for m in _ESCAPE.finditer(text):
        if m.group(1) not in "rnt\\\"":
            return None, _line_col(text, m.start()), (f"string escape \\{m.group(1)} is not read by the runtime "
                                                      "(only \\r \\n \\t \\\\ \\\")")
    return value, None, None


def _is_int(x: Any, bounds: tuple[int, int] = INT64) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and bounds[0] <= x <= bounds[1]


def _first_bad(items: list, ok: Callable[[Any], bool]) -> int | None:
    return next((i for i, x in enumerate(items) if not ok(x)), None)


# -- reading -----------------------------------------------------------------------------------------------------
@dataclass
class _Node:
    """One node as read: ``op`` is the canonical op name or "null", None when the node itself is broken."""

    index: int
    name: str | None
    op: str | None = None
    inputs: list[tuple[int, int]] = field(default_factory=list)

    @property
    def place(self) -> str:
        return f"node {self.index}" + (f" {self.name!r}" if self.name is not None else "")


class _Reader:
    def __init__(self, where: str):
        self.where = where
        self.problems: list[Problem] = []

    def bad(self, place: str, rule: str) -> None:
        self.problems.append(Problem(f"{self.where}: {place}" if place else self.where, rule))

    def entry(self, x: Any, place: str) -> tuple[int, int] | None:
        if isinstance(x, list) and len(x) in (2, 3) and all(_is_int(v, UINT32) for v in x):
            return x[0], x[1]
        self.bad(place, f"an entry must be [node_id, index, version] of unsigned ints, not {x!r:.60}")
        return None

    def check_keys(self, obj: dict, allowed: tuple[str, ...], place: str, what: str) -> None:
        for key in obj:
            if key not in allowed:
                self.bad(place, f"unknown {what} key {key!r} (the runtime refuses it; allowed: {', '.join(allowed)})")

    # top level
    def read(self, doc: Any) -> Graph | None:
        if not isinstance(doc, dict):
            self.bad("", "the symbol must be a JSON object")
            return None
        if not {"nodes", "heads", "attrs"} & doc.keys():
            what = f"a JSON object with {len(doc)} key(s), none of them" if doc else "an empty JSON object, without"
            self.bad("", f"not a CVM symbol: {what} nodes, heads or attrs; each rule it breaks follows")
        self.check_keys(doc, TOP_KEYS, "", "top-level")
        for key in ("nodes", "heads", "attrs"):
            if key not in doc:
                self.bad("", f"required key {key!r} is missing")
        version = doc.get("version", DEFAULT_VERSION)
        if version not in VERSIONS:
            self.bad("version", f"{version!r:.60} is not one of {', '.join(VERSIONS)}")
            version = VERSIONS[-1]
        postprocess = doc.get("postprocess")
        if postprocess is not None and not isinstance(postprocess, str):
            self.bad("postprocess", "must be a string")
        raw_nodes = doc.get("nodes", [])
        if not isinstance(raw_nodes, list):
            self.bad("nodes", "must be an array of node objects")
            raw_nodes = []
        nodes = [self.node(i, raw) for i, raw in enumerate(raw_nodes)]
        raw_heads = doc.get("heads", [])
        if not isinstance(raw_heads, list):
            self.bad("heads", "must be an array of entries")
            raw_heads = []
        heads = [self.entry(h, f"heads[{i}]") for i, h in enumerate(raw_heads)]
        self.unique_variables(nodes)
        attrs = self.graph_attrs(doc.get("attrs", {}), version)
        counts = self.output_counts(doc, nodes, heads, version)
        self.references(nodes, heads, counts)
        if version == "cvm_1.0.0":
            self.arg_nodes(doc, nodes)
        self.entry_lists(attrs, nodes, counts, version)
        op_attrs = self.op_attrs(attrs.get("op_attrs"), nodes)
        if self.problems:
            return None
        return _graph(nodes, counts, attrs, op_attrs, heads, postprocess)

    def node(self, i: int, raw: Any) -> _Node:
        if not isinstance(raw, dict):
            self.bad(f"node {i}", "a node must be a JSON object")
            return _Node(i, None)
        name = raw.get("name")
        if not isinstance(name, str):
            self.bad(f"node {i}", "name must be a string" if "name" in raw else "required key 'name' is missing")
            name = None
        place = _Node(i, name).place
        self.check_keys(raw, NODE_KEYS, place, "node")
        op = raw.get("op")
        if op not in ("null", "cvm_op"):
            self.bad(place, f"op must be \"null\" or \"cvm_op\", not {op!r:.60}" if "op" in raw
                     else "required key 'op' is missing")
            op = None
        if "precision" in raw and not _is_int(raw["precision"], INT32):
            self.bad(place, "precision must be an integer")
        raw_inputs = raw.get("inputs")
        if not isinstance(raw_inputs, list):
            self.bad(place, "inputs must be an array of entries" if "inputs" in raw
                     else "required key 'inputs' is missing")
            raw_inputs = []
        inputs = [self.entry(x, f"{place} inputs[{k}]") for k, x in enumerate(raw_inputs)]
        func = self.node_attrs(raw.get("attrs"), place, op == "cvm_op")
        if op == "null" and inputs:
            self.bad(place, "a variable (op \"null\") must have no inputs")
        if None in inputs or op is None or name is None or (op == "cvm_op" and func is None):
            return _Node(i, name)
        return _Node(i, name, VARIABLE if op == "null" else func, inputs)

    def node_attrs(self, attrs: Any, place: str, is_op: bool) -> str | None:
        """The canonical op name from ``attrs.func_name`` (None when absent or broken)."""
        if attrs is None:
            if is_op:
                self.bad(place, "an op node needs attrs with func_name")
            return None
        if not isinstance(attrs, dict):
            self.bad(place, "attrs must be an object of strings")
            return None
        self.check_keys(attrs, ("func_name",) + IGNORED_NODE_ATTRS, place, "node attribute")
        for key, value in attrs.items():
            if not isinstance(value, str):
                self.bad(place, f"attrs.{key} must be a string, not {value!r:.60}")
        func = attrs.get("func_name")
        if not isinstance(func, str):
            if "func_name" not in attrs:
                self.bad(place, "attrs.func_name is required")
            return None
        if is_op and not op_name(func):
            self.bad(place, f"func_name {func!r} names no op")
            return None
        return op_name(func)

    def unique_variables(self, nodes: list[_Node]) -> None:
        seen: set[str] = set()
        for node in nodes:
            if node.op == VARIABLE:
                if node.name in seen:
                    self.bad(node.place, f"variable name {node.name!r} is used twice")
                seen.add(node.name)

    # graph attributes
    def graph_attrs(self, attrs: Any, version: str) -> dict[str, list]:
        """The graph attribute lists whose tags and element types are right."""
        if not isinstance(attrs, dict):
            self.bad("attrs", "must be an object")
            return {}
        out: dict[str, list] = {}
        for key, value in attrs.items():
            place = f"attrs.{key}"
            if key == "dtype":
                self.legacy_dtype(value, place)
                continue
            if key not in GRAPH_ATTR_TAGS:
                self.bad("attrs", f"unknown graph attribute {key!r} (the runtime refuses it)")
                continue
            tag = GRAPH_ATTR_TAGS[key]
            if not (isinstance(value, list) and len(value) == 2 and value[0] == tag):
                self.bad(place, f"must be [\"{tag}\", [...]]")
                continue
            if (rule := self.payload_rule(tag, value[1])) is None:
                out[key] = value[1]
            else:
                self.bad(place, rule)
        required = ["shape", "storage_id", "op_attrs", "precision"] + (["dltype"] if version == "cvm_1.0.0" else [])
        for key in required:
            if key not in attrs:
                self.bad("attrs", f"graph attribute {key!r} is required" +
                         (" in cvm_1.0.0" if key == "dltype" else ""))
        if out.pop("device_index", []):
            self.bad("attrs.device_index", "must be absent or empty")
        return out

    @staticmethod
    def payload_rule(tag: str, payload: Any) -> str | None:
        """Why a graph attribute's value is not a list of the tag's element type, or None."""
        kinds = {"list_int": ("an integer", lambda x: _is_int(x, INT32)),
                 "list_str": ("a string", lambda x: isinstance(x, str)),
                 "list_shape": ("an array of integers",
                                lambda x: isinstance(x, list) and all(_is_int(d) for d in x))}
        kind, ok = kinds[tag]
        if not isinstance(payload, list):
            return "the value must be an array"
        if (i := _first_bad(payload, ok)) is not None:
            return f"element {i} must be {kind}, not {payload[i]!r:.60}"
        return None

    def legacy_dtype(self, value: Any, place: str) -> None:
        """The 2019 ``dtype`` attribute: read and skipped, as the runtime does."""
        ok = isinstance(value, list) and len(value) == 2 and (
            (value[0] == "list_int" and self.payload_rule("list_int", value[1]) is None)
            or (value[0] == "list_str" and _is_int(value[1], (0, INT64[1]))))
        if not ok:
            self.bad(place, "the legacy dtype attribute must be [\"list_int\", [...]]")

    # structure
    def output_counts(self, doc: dict, nodes: list[_Node], heads: list, version: str) -> list[int]:
        """Outputs per node: from node_row_ptr when usable, else 1 per variable and the highest index used + 1."""
        ptr = doc.get("node_row_ptr")
        rule = self.row_ptr_rule(ptr, nodes)
        if rule is None:
            return [b - a for a, b in zip(ptr, ptr[1:])]
        if version == "cvm_1.0.0":
            self.bad("node_row_ptr", rule)
        elif "node_row_ptr" in doc and not (isinstance(ptr, list) and all(_is_int(x, UINT32) for x in ptr)):
            self.bad("node_row_ptr", "must be an array of unsigned integers")
        counts = [1] * len(nodes)
        for entry in [e for n in nodes for e in n.inputs] + heads:
            if entry is not None and entry[0] < len(nodes) and nodes[entry[0]].op != VARIABLE:
                counts[entry[0]] = max(counts[entry[0]], entry[1] + 1)
        return counts

    @staticmethod
    def row_ptr_rule(ptr: Any, nodes: list[_Node]) -> str | None:
        if ptr is None:
            return "is required in cvm_1.0.0 (it gives each node's output count)"
        if not isinstance(ptr, list) or not all(_is_int(x, UINT32) for x in ptr):
            return "must be an array of unsigned integers"
        if len(ptr) != len(nodes) + 1 or (ptr and ptr[0] != 0):
            return f"must have {len(nodes) + 1} elements starting at 0 (prefix sums of the output counts)"
        for i, node in enumerate(nodes):
            step = ptr[i + 1] - ptr[i]
            if step < 1 or (node.op == VARIABLE and step != 1):
                return f"gives node {i} {step} outputs (a variable has 1, an op at least 1)"
        return None

    def references(self, nodes: list[_Node], heads: list, counts: list[int]) -> None:
        def check(entry: tuple[int, int], place: str, before: int) -> None:
            j, k = entry
            if j >= len(nodes):
                self.bad(place, f"refers to node {j}, which does not exist ({len(nodes)} nodes)")
            elif j >= before:
                self.bad(place, f"refers to node {j}: nodes must be in topological order (inputs first)")
            elif k >= counts[j]:
                self.bad(place, f"refers to output {k} of node {j}, which has {counts[j]} output(s)")

        for i, node in enumerate(nodes):
            for k, entry in enumerate(node.inputs):
                check(entry, f"{node.place} inputs[{k}]", i)
        for i, entry in enumerate(heads):
            if entry is not None:
                check(entry, f"heads[{i}]", len(nodes))

    def arg_nodes(self, doc: dict, nodes: list[_Node]) -> None:
        """cvm_1.0.0: arg_nodes lists exactly the variables' node indices, in increasing order."""
        expected = [i for i, n in enumerate(nodes) if n.op == VARIABLE]
        given = doc.get("arg_nodes")
        if given != expected and all(n.op is not None for n in nodes):
            self.bad("arg_nodes", f"must list the {len(expected)} variables' node indices in increasing order "
                     f"in cvm_1.0.0, not {given!r:.80}")

    def entry_lists(self, attrs: dict, nodes: list[_Node], counts: list[int], version: str) -> None:
        """One shape, precision, storage id (and dltype in cvm_1.0.0) per entry, one op_attrs per node."""
        num_entries = sum(counts)
        per_entry = ("shape", "storage_id", "precision") + (("dltype",) if version == "cvm_1.0.0" else ())
        keys = [k for k in per_entry if k in attrs]
        wrong = [k for k in keys if len(attrs[k]) != num_entries]
        for key in wrong:
            self.bad(f"attrs.{key}", f"has {len(attrs[key])} elements, expected {num_entries} "
                     "(one per node output)")
        if "op_attrs" in attrs and len(attrs["op_attrs"]) != len(nodes):
            self.bad("attrs.op_attrs", f"has {len(attrs['op_attrs'])} elements, expected {len(nodes)} "
                     "(one per node)")
            attrs.pop("op_attrs")
        if wrong or not keys or any(n.op is None for n in nodes):
            return  # entries cannot be told apart (and num_entries is bounded by a list's length below)
        owners = [(node, k) for node, c in zip(nodes, counts) for k in range(c)]

        def place(key: str, e: int) -> str:
            node, k = owners[e]
            return f"attrs.{key}[{e}] ({node.place} output {k})"

        for e, shape in enumerate(attrs.get("shape", [])):
            if (rule := shape_problem(tuple(shape))) is not None:
                self.bad(place("shape", e), rule)
        for e, p in enumerate(attrs.get("precision", [])):
            if not (p == -1 or 1 <= p <= 32):
                self.bad(place("precision", e), f"precision {p} must be -1 or in [1, 32]")
            elif p == -1 and owners[e][0].op == VARIABLE:
                self.bad(place("precision", e), "a variable needs a precision in [1, 32], not -1")
        for e, t in enumerate(attrs.get("dltype", []) if "dltype" in keys else []):
            if t != "int32":
                self.bad(place("dltype", e), f"dltype {t!r:.40} is not \"int32\"")
        if "storage_id" in attrs:
            self.storage(attrs["storage_id"], nodes, counts)

    def storage(self, sids: list[int], nodes: list[_Node], counts: list[int]) -> None:
        """Storage ids are >= 0; an op outside the in-place set may not write where it reads."""
        if (e := _first_bad(sids, lambda s: s >= 0)) is not None:
            self.bad(f"attrs.storage_id[{e}]", f"storage id {sids[e]} is negative")
            return
        first = [0]
        for c in counts:
            first.append(first[-1] + c)
        for i, node in enumerate(nodes):
            if node.op == VARIABLE or node.op in IN_PLACE_OPS:
                continue
            read = {sids[first[j] + k] for j, k in node.inputs if j < i and k < counts[j]}
            for k in range(counts[i]):
                if sids[first[i] + k] in read:
                    self.bad(node.place, f"output {k} reuses the storage id {sids[first[i] + k]} of an input "
                             f"({node.op} cannot run in place)")

    def op_attrs(self, texts: list[str] | None, nodes: list[_Node]) -> list[dict[str, str]]:
        """Each op node's attribute dict (parsed from its JSON string); variables' strings are ignored."""
        out: list[dict[str, str]] = []
        for i, (text, node) in enumerate(zip(texts or [], nodes)):
            out.append({})
            if node.op in (None, VARIABLE):
                continue
            where = f"attrs.op_attrs[{i}] ({node.place})"
            value, pos, rule = _parse_json(text)
            if rule is not None:
                self.bad(where, f"{rule}{' at ' + pos if pos else ''} in {text!r:.80}")
            elif not isinstance(value, dict):
                self.bad(where, f"must be a JSON object of strings (\"{{}}\" when there are none), not {text!r:.80}")
            elif (bad := [k for k, v in value.items() if not isinstance(v, str)]):
                self.bad(where, f"attribute values must be strings: {', '.join(bad)}")
            else:
                out[-1] = value
        return out


def _graph(nodes: list[_Node], counts: list[int], attrs: dict[str, list], op_attrs: list[dict[str, str]],
           heads: list[tuple[int, int]], postprocess: str | None) -> Graph:
    shapes, precisions = attrs["shape"], attrs["precision"]
    out, e = [], 0
    for node, count, node_attrs in zip(nodes, counts, op_attrs):
        types = tuple(TensorType(tuple(shapes[e + k]), precisions[e + k]) for k in range(count))
        e += count
        out.append(Node(node.name, node.op, tuple(Entry(j, k) for j, k in node.inputs), node_attrs, types))
    return Graph(out, [Entry(j, k) for j, k in heads], postprocess=postprocess)


def read_symbol(text: str | bytes, where: str = "symbol") -> Graph:
    """The graph in a symbol JSON (any dialect the runtime loads), without params.

    Raises one ``FormatError`` listing every broken rule (malformed JSON gives its line and column).
    """
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(Problem(f"{where}, byte {e.start}", "the symbol is not UTF-8 text")) from None
    doc, pos, rule = _parse_json(text)
    if rule is not None:
        raise FormatError(Problem(f"{where}, {pos}" if pos else where, rule))
    reader = _Reader(where)
    try:
        graph = reader.read(doc)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:  # a case the checks missed
        reader.bad("", f"malformed symbol ({type(e).__name__}: {e})")
    if reader.problems:
        raise FormatError(reader.problems)
    return graph


# -- writing -----------------------------------------------------------------------------------------------------
def quote(text: str) -> str:
    """A JSON string as the runtime writes it (escaping only \\r \\n \\t \\\\ and \\")."""
    return '"' + text.translate(_QUOTE) + '"'


def attrs_text(attrs: dict[str, Any]) -> str:
    """An ``op_attrs`` string: ``{"k": "v", ...}`` in the dict's order with runtime value syntax, ``{}`` if empty."""
    return "{" + ", ".join(f"{quote(str(k))}: {quote(format_value(v))}" for k, v in attrs.items()) + "}"


class _Writer:
    """The runtime's ``utils::JSONWriter``: members on new lines indented 2 spaces per level, ", " separators."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self.multi: list[bool] = []
        self.count: list[int] = []

    def newline(self) -> None:
        if not self.multi or self.multi[-1]:
            self.out.append("\n" + "  " * len(self.multi))

    def begin(self, bracket: str, multi: bool) -> None:
        self.out.append(bracket)
        self.multi.append(multi)
        self.count.append(0)

    def end(self, bracket: str) -> None:
        multi, n = self.multi.pop(), self.count.pop()
        if multi and n:
            self.newline()
        self.out.append(bracket)

    def item(self) -> None:
        if self.count[-1]:
            self.out.append(", ")
        self.count[-1] += 1
        self.newline()

    def key(self, key: str) -> None:
        if self.count[-1]:
            self.out.append(", ")
        self.newline()
        self.out.append(quote(key) + ": ")
        self.count[-1] += 1


_Emit = Callable[[_Writer, Any], None]


def _scalar(w: _Writer, v: Any) -> None:
    w.out.append(quote(v) if isinstance(v, str) else str(int(v)))


def _array(item: _Emit, multi: Callable[[list], bool]) -> _Emit:
    def emit(w: _Writer, values: list) -> None:
        w.begin("[", multi(values))
        for v in values:
            w.item()
            item(w, v)
        w.end("]")
    return emit


def _object(fields: Callable[[str], _Emit], multi: Callable[[dict], bool]) -> _Emit:
    def emit(w: _Writer, obj: dict) -> None:
        w.begin("{", multi(obj))
        for k, v in obj.items():
            w.key(k)
            fields(k)(w, v)
        w.end("}")
    return emit


def _always(_: Any) -> bool:
    return True


def _pod_multi(values: list) -> bool:  # containers of numbers or entries: inline up to 10 elements
    return len(values) > 10


_pod_ints = _array(_scalar, _pod_multi)
_entries = _array(_array(_scalar, lambda _: False), _pod_multi)
_PAYLOADS = {"list_int": _pod_ints, "list_str": _array(_scalar, _always), "list_shape": _array(_pod_ints, _always)}


def _tagged(w: _Writer, value: list) -> None:  # graph attribute: [type_tag, payload] on one line
    tag, payload = value
    w.begin("[", False)
    w.item()
    _scalar(w, tag)
    w.item()
    _PAYLOADS[tag](w, payload)
    w.end("]")


_map_multi = lambda obj: len(obj) > 1  # noqa: E731  (a map of one element is written inline)
_NODE_FIELDS = {"op": _scalar, "name": _scalar, "attrs": _object(lambda _: _scalar, _map_multi),
                "inputs": _entries, "precision": _scalar}
_node = _object(_NODE_FIELDS.__getitem__, _always)
_TOP_FIELDS = {"nodes": _array(_node, _always), "arg_nodes": _pod_ints, "node_row_ptr": _pod_ints,
               "heads": _entries, "attrs": _object(lambda _: _tagged, _map_multi),
               "version": _scalar, "postprocess": _scalar}


def layout(doc: dict) -> str:
    """A symbol document (parsed JSON) as text, byte for byte as the runtime's JSONWriter lays it out."""
    w = _Writer()
    _object(_TOP_FIELDS.__getitem__, _always)(w, doc)
    return "".join(w.out)


def _document(graph: Graph) -> dict:
    missing = [Problem(f"node {i} {n.name!r}", "has no output types (shape and precision) to write")
               for i, n in enumerate(graph.nodes) if not n.outputs]
    if missing:
        raise FormatError(missing)
    nodes, op_attrs, types, row_ptr = [], [], [], [0]
    for node in graph.nodes:
        inputs = [[e.node, e.index, 0] for e in node.inputs]
        outputs = node.outputs[:1] if node.is_variable else node.outputs
        if node.is_variable:
            nodes.append({"op": VARIABLE, "name": node.name, "inputs": inputs})
            t = outputs[0]
            op_attrs.append(attrs_text({"precision": t.precision, "shape": t.shape}))
        else:
            nodes.append({"op": "cvm_op", "name": node.name,
                          "attrs": {"flatten_data": "0", "func_name": node.op, "num_inputs": str(len(inputs)),
                                    "num_outputs": str(len(outputs))},
                          "inputs": inputs})
            op_attrs.append(attrs_text(node.attrs))
        types.extend(outputs)
        row_ptr.append(row_ptr[-1] + len(outputs))
    doc = {
        "nodes": nodes,
        "arg_nodes": graph.variables,
        "node_row_ptr": row_ptr,
        "heads": [[e.node, e.index, 0] for e in graph.heads],
        "attrs": {
            "op_attrs": ["list_str", op_attrs],
            "dltype": ["list_str", ["int32"] * len(types)],
            "precision": ["list_int", [t.precision for t in types]],
            "storage_id": ["list_int", storage_plan(graph.nodes, graph.heads)],
            "shape": ["list_shape", [list(t.shape) for t in types]],
        },
        "version": DEFAULT_VERSION,
    }
    if graph.postprocess is not None:
        doc["postprocess"] = graph.postprocess
    return doc


def pack_symbol(text: str) -> str:
    """A symbol file's text as a short ASCII string (zlib-compressed, base64) for a metadata value."""
    return base64.b64encode(zlib.compress(text.encode("utf-8"), 9)).decode("ascii")


def unpack_symbol(packed: str, limit: int) -> str | None:
    """The text ``pack_symbol`` packed, or None when ``packed`` is not such a string or unpacks to more than
    ``limit`` bytes (never more is allocated: a small value may inflate a thousandfold)."""
    try:
        inflate = zlib.decompressobj()
        data = inflate.decompress(base64.b64decode(packed, validate=True), limit)
        if not inflate.eof or inflate.unconsumed_tail:
            return None
        return data.decode("utf-8")
    except (binascii.Error, ValueError, zlib.error, UnicodeDecodeError):
        return None


def write_symbol(graph: Graph) -> str:
    """The symbol JSON of ``graph`` (cvm_1.0.0, runtime layout, deterministic), checked by reading it back.

    Raises ``FormatError`` when the graph breaks a rule of the format (the reader's problems, e.g. a variable
    without a precision or a shape the runtime refuses).
    """
    text = layout(_document(graph))
    read_symbol(text, where="symbol to write")
    return text
