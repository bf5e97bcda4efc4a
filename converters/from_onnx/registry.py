"""The import-rule registry: one rule per ONNX op type (per domain), registered by name as in onnx2torch.

A rule is ``fn(ctx, node, *inputs) -> Tensor | list[Tensor]``: it receives the import context, the ONNX node
(``NodeView``: name, typed attributes, opset) and one ``Tensor`` per ONNX input (None for an omitted optional
input), adds the CVM nodes that compute the same values and returns one ``Tensor`` per ONNX output. A rule that
finds no exact CVM form raises ``Refuse`` with the reason; the importer reports it with the node's name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import onnx
from onnx import AttributeProto, helper


class Refuse(Exception):
    """An ONNX node without an exact CVM form; the message says why (no CVM op, type, attribute, precision)."""


@dataclass(frozen=True)
class Rule:
    op_type: str
    fn: Callable[..., Any]
    since: int  # the lowest opset of the node's domain whose semantics the rule implements


RULES: dict[tuple[str, str], Rule] = {}
#: The rules of float ops applied to dequantized values (an input is a ``quantized.Real``): the quantized front.
FLOAT_RULES: dict[tuple[str, str], Rule] = {}


def rule(*op_types: str, since: int = 7, domain: str = "", table: dict | None = None) -> Callable:
    """Register ``fn`` as the import rule of each ONNX ``op_types`` in ``domain`` (opset ``since`` and later)."""
    table = RULES if table is None else table

    def deco(fn):
        for op in op_types:
            if (domain, op) in table:
                raise ValueError(f"import rule of {domain or 'ai.onnx'}::{op} defined twice")
            table[(domain, op)] = Rule(op, fn, since)
        return fn

    return deco


REQUIRED: Any = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()
_KINDS = {"int": (AttributeProto.INT,), "ints": (AttributeProto.INTS,), "float": (AttributeProto.FLOAT,),
          "floats": (AttributeProto.FLOATS,), "string": (AttributeProto.STRING,), "tensor": (AttributeProto.TENSOR,),
          "strings": (AttributeProto.STRINGS,)}


def attr_type_name(t: int) -> str:
    return AttributeProto.AttributeType.Name(t) if t in AttributeProto.AttributeType.values() else f"type {t}"


def float_rule(*op_types: str, since: int = 7, domain: str = "") -> Callable:
    """Register ``fn`` as the rule of float ``op_types`` whose inputs include dequantized values."""
    return rule(*op_types, since=since, domain=domain, table=FLOAT_RULES)


def integer_rule(node) -> Callable:
    """The integer rule of ``node``'s (default-domain) op: a float rule runs it on a dequantized value's integers."""
    return RULES[("", node.op_type)].fn


@dataclass(frozen=True)
class NodeView:
    """An ONNX node as rules read it: its name, op type, attributes and the domain's opset.

    Rules read attributes with the typed readers (``attr_int``, ``attr_ints``, ``attr_float``, ``attr_floats``,
    ``attr_str``, ``attr_tensor``): each returns a present value of its Python type (the default when the
    attribute is absent; a missing required one, a value of another ONNX type or outside the given range is a
    ``Refuse`` naming the attribute). ``checks`` has already held every node of an op with a schema to it, so
    these refusals are the last guard, for ops without one and for ranges the schema does not state.
    """

    proto: onnx.NodeProto
    name: str
    opset: int

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    def _read(self, name: str, kind: str, default: Any) -> Any:
        found = [a for a in self.proto.attribute if a.name == name]
        if not found:
            if default is REQUIRED:
                raise Refuse(f"{self.op_type} needs attribute {name}")
            return default
        a = found[-1]
        if a.type not in _KINDS[kind]:
            raise Refuse(f"{self.op_type} attribute {name} must be {attr_type_name(_KINDS[kind][0])}, "
                         f"got {attr_type_name(a.type)}")
        v = helper.get_attribute_value(a)
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else list(v) if kind in ("ints", "floats") else v

    def has(self, name: str) -> bool:
        return any(a.name == name for a in self.proto.attribute)

    def attr_int(self, name: str, default: Any = REQUIRED, lo: int | None = None, hi: int | None = None) -> int:
        """An INT attribute, within [lo, hi] when given."""
        v = self._read(name, "int", default)
        if v is not default:
            _in_range(self, name, [v], lo, hi)
        return v

    def attr_ints(self, name: str, default: Any = REQUIRED, lo: int | None = None, hi: int | None = None,
                  size: int | None = None) -> list[int]:
        """An INTS attribute of ``size`` values (when given), each within [lo, hi] (when given)."""
        v = self._read(name, "ints", default)
        if v is not default:
            if size is not None and len(v) != size:
                raise Refuse(f"{self.op_type} attribute {name}={v} must have {size} value(s)")
            _in_range(self, name, v, lo, hi)
        return v

    def attr_float(self, name: str, default: Any = REQUIRED) -> float:
        return self._read(name, "float", default)

    def attr_floats(self, name: str, default: Any = REQUIRED) -> list[float]:
        return self._read(name, "floats", default)

    def attr_str(self, name: str, default: Any = REQUIRED, choices: tuple[str, ...] | None = None) -> str:
        """A STRING attribute, one of ``choices`` when given."""
        v = self._read(name, "string", default)
        if choices is not None and v is not default and v not in choices:
            raise Refuse(f"{self.op_type} attribute {name}={v!r} must be one of {', '.join(choices)}")
        return v

    def attr_strs(self, name: str, default: Any = REQUIRED) -> list[str]:
        """A STRINGS attribute."""
        v = self._read(name, "strings", default)
        return v if v is default else [x.decode("utf-8", "replace") for x in v]

    def attr_tensor(self, name: str, default: Any = REQUIRED) -> onnx.TensorProto:
        return self._read(name, "tensor", default)

    @property
    def attrs(self) -> dict[str, Any]:
        """Every attribute as a Python value of its declared type."""
        out = {}
        for a in self.proto.attribute:
            try:
                v = helper.get_attribute_value(a)
            except ValueError:
                raise Refuse(f"attribute {a.name} has {attr_type_name(a.type)}, which holds no value") from None
            out[a.name] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
        return out


def _in_range(node: NodeView, name: str, values: list[int], lo: int | None, hi: int | None) -> None:
    bad = [v for v in values if (lo is not None and v < lo) or (hi is not None and v > hi)]
    if bad:
        span = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
        raise Refuse(f"{node.op_type} attribute {name}={values if len(values) > 1 else values[0]}: "
                     f"{bad[0]} is outside {span}")
