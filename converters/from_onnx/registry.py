"""The import-rule registry: one rule per ONNX op type (per domain), registered by name as in onnx2torch.

A rule is ``fn(ctx, node, *inputs) -> Tensor | list[Tensor]``: it receives the import context, the ONNX node
(``NodeView``: name, attributes, opset) and one ``Tensor`` per ONNX input (None for an omitted optional
input), adds the CVM nodes that compute the same values and returns one ``Tensor`` per ONNX output. A rule that
finds no exact CVM form raises ``Refuse`` with the reason; the importer reports it with the node's name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import onnx
from onnx import helper


class Refuse(Exception):
    """An ONNX node without an exact CVM form; the message says why (no CVM op, type, attribute, precision)."""


@dataclass(frozen=True)
class Rule:
    op_type: str
    fn: Callable[..., Any]
    since: int  # the lowest opset of the node's domain whose semantics the rule implements


RULES: dict[tuple[str, str], Rule] = {}


def rule(*op_types: str, since: int = 7, domain: str = "") -> Callable:
    """Register ``fn`` as the import rule of each ONNX ``op_types`` in ``domain`` (opset ``since`` and later)."""

    def deco(fn):
        for op in op_types:
            if (domain, op) in RULES:
                raise ValueError(f"import rule of {domain or 'ai.onnx'}::{op} defined twice")
            RULES[(domain, op)] = Rule(op, fn, since)
        return fn

    return deco


@dataclass(frozen=True)
class NodeView:
    """An ONNX node as rules read it: its name, op type, attributes (Python values) and the domain's opset."""

    proto: onnx.NodeProto
    name: str
    opset: int

    @property
    def op_type(self) -> str:
        return self.proto.op_type

    @property
    def attrs(self) -> dict[str, Any]:
        out = {}
        for a in self.proto.attribute:
            v = helper.get_attribute_value(a)
            out[a.name] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
        return out

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)
