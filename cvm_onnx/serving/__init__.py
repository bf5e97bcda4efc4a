"""The serving form: a ``Target`` decided once (``target``) and the one pass pipeline that makes the serving form
for it from the exported flat form (``pipeline``): the flat-form passes (``flat``), then for a CPU target with
integer products the layout and operand passes (``cpu_layout``), each a ``passes.Pass`` whose requires/ensures
are checked around it. The same pipeline serves a model exported with layout "session" at session creation
(``runtime.sessions``).
"""
from __future__ import annotations

from .cpu_layout import layout_passes
from .flat import CUDA, SERVING
from .passes import Sequential
from .target import Target


def pipeline(target: Target) -> Sequential:
    """The passes that make ``target``'s serving form of the exported flat form, in order."""
    return Sequential(SERVING + (CUDA if target.provider == "cuda" else ()) +
                      (layout_passes(target.layout, target.operands) if target.cpu_integer else ()))
