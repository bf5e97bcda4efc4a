"""The serving form's pass machinery, in onnx-ir's style: a ``Pass`` states the conditions it ``requires`` of the
model it is given and ``ensures`` of the one it returns, checked around every run (a broken one is an
``InvariantError`` naming the pass, the condition and where it breaks: a bug of the exporter, never of the input),
and says whether it changed the model; ``Sequential`` runs passes in order over one copy of the model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import onnx

from cvm_onnx.core.constants import DOMAIN


class InvariantError(AssertionError):
    """A serving pass was given a model that breaks what it requires, or returned one that breaks what it
    ensures: an internal error of the exporter."""


@dataclass(frozen=True)
class Condition:
    """A property of a model: ``says`` states it, ``broken(model)`` lists the places where it does not hold."""

    says: str
    broken: Callable[[onnx.ModelProto], list[str]]


@dataclass(frozen=True)
class PassResult:
    """What a pass returns: the model, and whether the pass changed it."""

    model: onnx.ModelProto
    modified: bool


@dataclass(frozen=True)
class Pass:
    """A named rewrite ``run(model) -> model`` (in place, or a new model); its docstring states the invariant it
    keeps, and the conditions it ``requires`` before and ``ensures`` after are checked around each call."""

    name: str
    run: Callable[[onnx.ModelProto], onnx.ModelProto]
    requires: tuple[Condition, ...] = ()
    ensures: tuple[Condition, ...] = ()

    def check(self, when: str, conditions: tuple[Condition, ...], model: onnx.ModelProto) -> None:
        for c in conditions:
            if places := c.broken(model):
                raise InvariantError(f"serving pass {self.name} {when} {c.says}; broken at "
                                     f"{', '.join(places[:5])}" + (f" and {len(places) - 5} more" if len(places) > 5
                                                                   else ""))

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        self.check("requires", self.requires, model)
        before = model.SerializeToString(deterministic=True)
        out = self.run(model)
        self.check("ensures", self.ensures, out)
        return PassResult(out, out.SerializeToString(deterministic=True) != before)


def _not_flat(model: onnx.ModelProto) -> list[str]:
    return [n.name for n in model.graph.node if n.domain == DOMAIN] + [f"function {f.name}" for f in model.functions]


def _read_before_made(model: onnx.ModelProto) -> list[str]:
    g = model.graph
    made = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    late = []
    for n in g.node:
        late += [f"{t} (read by {n.name})" for t in n.input if t not in made]
        made.update(n.output)
    return late + [f"output {o.name}" for o in g.output if o.name not in made]


def _stale_value_info(model: onnx.ModelProto) -> list[str]:
    g = model.graph
    made = {o for n in g.node for o in n.output} | {t.name for t in g.initializer}
    return [vi.name for vi in g.value_info if vi.name not in made]


#: The flat form: every node in the main graph, none calling a function of the cvm domain.
FLAT = Condition("the flat form (no cvm function)", _not_flat)
#: Every tensor a node reads, and every graph output, is made before: a graph input, an initializer or a node
#: earlier in the list (the graph is in topological order, nothing dangles).
ORDERED = Condition("every tensor read made before it is read", _read_before_made)
NO_STALE_VALUE_INFO = Condition("value_info only for tensors a node or an initializer makes", _stale_value_info)


def model_pass(*ensures: Condition) -> Callable[[Callable[[onnx.ModelProto], onnx.ModelProto]], Pass]:
    """``fn`` as a ``Pass`` named after it: it requires the flat form in order and ensures that again, with
    ``ensures`` besides."""
    def make(fn: Callable[[onnx.ModelProto], onnx.ModelProto]) -> Pass:
        return Pass(fn.__name__, fn, (FLAT, ORDERED), (FLAT, ORDERED, *ensures))

    return make


@dataclass(frozen=True)
class Sequential:
    """Passes run in order over one copy of the model given (which is left as it was)."""

    passes: tuple[Pass, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.passes)

    def __call__(self, model: onnx.ModelProto) -> PassResult:
        out = onnx.ModelProto()
        out.CopyFrom(model)
        modified = False
        for p in self.passes:
            result = p(out)
            out, modified = result.model, modified or result.modified
        return PassResult(out, modified)
