"""All 37 CVM ops, defined by family; importing this package fills ``REGISTRY``."""
from . import broadcast, elemwise, nn, reduce, transform, vision  # noqa: F401  (registration)
from .registry import REGISTRY, Attr, Attrs, Op, OpRuleError, get

__all__ = ["REGISTRY", "Attr", "Attrs", "Op", "OpRuleError", "get"]
