"""All CVM ops, defined by family; importing this package fills ``REGISTRY``."""
from . import broadcast, elemwise, nn, reduce, transform, vision  # noqa: F401  (registration)
from .registry import REGISTRY, Attr, Attrs, NodeRuleError, Op, OpRuleError, TypedNode, get, type_node

__all__ = ["REGISTRY", "Attr", "Attrs", "NodeRuleError", "Op", "OpRuleError", "TypedNode", "get", "type_node"]
