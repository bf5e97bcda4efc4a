"""The serving form's passes: small rewrites of the exported flat form, each keeping every CVM tensor's value.

The serving form (``to_onnx(..., optimize=True)``) is made in two stages: the exporter writes the flat form
with the requantization runs fused (``requantize.py``, chosen on the CVM graph where the bounds are known),
then ``SERVING`` runs over the ONNX model in order. Each pass is a ``Pass``: a name, a function
``pass(model) -> model`` whose docstring states the invariant it keeps, and, in onnx-ir's style, the conditions
it ``requires`` of the model it is given and ``ensures`` of the model it returns, checked around every run: a
broken one is an ``InvariantError`` naming the pass, the condition and where it breaks (a bug of the exporter,
never of the input). Like onnx-ir's in-place passes they rewrite the model they are given and return it;
``run_passes`` copies the exported model once first.

The model that comes out is no longer the exporter's canonical flat form (``from_onnx`` verifies a flat-form
node against its lowering, so it does not import an optimized model): it is meant for running. The passes it
went through are named in its metadata ``cvm.optimized``.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import onnx
from onnx import TensorProto, numpy_helper

from cvm_onnx.core.constants import DOMAIN, PRECISION
from cvm_onnx.native import DOMAIN as NATIVE_DOMAIN


FLOATS = (TensorProto.FLOAT, TensorProto.DOUBLE)


class InvariantError(AssertionError):
    """A serving pass was given a model that breaks what it requires, or returned one that breaks what it
    ensures: an internal error of the exporter."""


@dataclass(frozen=True)
class Condition:
    """A property of a model: ``says`` states it, ``broken(model)`` lists the places where it does not hold."""

    says: str
    broken: Callable[[onnx.ModelProto], list[str]]


@dataclass(frozen=True)
class Pass:
    """A named rewrite ``run(model) -> model`` (in place); its docstring states the invariant it keeps, and the
    conditions it ``requires`` before and ``ensures`` after are checked around each call."""

    name: str
    run: Callable[[onnx.ModelProto], onnx.ModelProto]
    requires: tuple[Condition, ...] = ()
    ensures: tuple[Condition, ...] = ()

    @property
    def invariant(self) -> str:
        return inspect.cleandoc(self.run.__doc__ or "")

    def check(self, when: str, conditions: tuple[Condition, ...], model: onnx.ModelProto) -> None:
        for c in conditions:
            if places := c.broken(model):
                raise InvariantError(f"serving pass {self.name} {when} {c.says}; broken at "
                                     f"{', '.join(places[:5])}" + (f" and {len(places) - 5} more" if len(places) > 5
                                                                   else ""))

    def __call__(self, model: onnx.ModelProto) -> onnx.ModelProto:
        self.check("requires", self.requires, model)
        out = self.run(model)
        self.check("ensures", self.ensures, out)
        return out


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


def _unread_casts(model: onnx.ModelProto) -> list[str]:
    read = _read(model.graph)
    return [n.name for n in model.graph.node if _cast_to(n) is not None and n.output[0] not in read]


def _unread_params(model: onnx.ModelProto) -> list[str]:
    read = _read(model.graph)
    return [t.name for t in model.graph.initializer if t.name not in read]


def _stale_value_info(model: onnx.ModelProto) -> list[str]:
    g = model.graph
    made = {o for n in g.node for o in n.output} | {t.name for t in g.initializer}
    return [vi.name for vi in g.value_info if vi.name not in made]


#: The flat form: every node in the main graph, none calling a function of the cvm domain.
FLAT = Condition("the flat form (no cvm function)", _not_flat)
#: Every tensor a node reads, and every graph output, is made before: a graph input, an initializer or a node
#: earlier in the list (the graph is in topological order, nothing dangles).
ORDERED = Condition("every tensor read made before it is read", _read_before_made)
NO_UNREAD_CASTS = Condition("every Cast's output read", _unread_casts)
NO_UNREAD_PARAMS = Condition("every initializer read", _unread_params)
NO_STALE_VALUE_INFO = Condition("value_info only for tensors a node or an initializer makes", _stale_value_info)


def model_pass(*ensures: Condition) -> Callable[[Callable[[onnx.ModelProto], onnx.ModelProto]], Pass]:
    """``fn`` as a ``Pass`` named after it: it requires the flat form in order and ensures that again, with
    ``ensures`` besides."""
    def make(fn: Callable[[onnx.ModelProto], onnx.ModelProto]) -> Pass:
        return Pass(fn.__name__, fn, (FLAT, ORDERED), (FLAT, ORDERED, *ensures))

    return make


def run_passes(passes: list[Pass] | tuple[Pass, ...], model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` after every pass in order."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for p in passes:
        out = p(out)
    return out


def _cast_to(node: onnx.NodeProto) -> int | None:
    if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
        return None
    return next(a.i for a in node.attribute if a.name == "to")


def element_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor shape inference can tell (initializer data left out: only types matter)."""
    g = model.graph
    params = [onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in g.initializer]
    light = onnx.helper.make_model(onnx.helper.make_graph(g.node, g.name, [*g.input, *params], g.output),
                                   opset_imports=model.opset_import, ir_version=model.ir_version)
    inferred = onnx.shape_inference.infer_shapes(light)
    infos = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    return {vi.name: vi.type.tensor_type.elem_type for vi in infos}


def _read(graph: onnx.GraphProto) -> set[str]:
    return {t for n in graph.node for t in n.input} | {o.name for o in graph.output}


@model_pass()
def skip_int32_round_trips(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every ``Cast(Cast(v, to=INT32), to=F)`` of a float v is read as v (F is v's type) or ``Cast(v, to=F)``.

    Exact: every lowering casts a float to int32 only when the float holds an integer within int32 (each
    lowering's exactness argument; none relies on Cast's truncation or on out-of-range conversion, see
    lowering.py). So the int32 holds v exactly, and converting that integer to F gives what converting v to F
    gives: v itself when F is v's own type, else the same round-to-nearest of the same integer (float32 ->
    float64 is exact; float64 -> float32 rounds both ways alike). The int32 casts stay (``drop_unread_casts``
    removes those nobody reads any more).
    """
    types = element_types(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    rename: dict[str, str] = {}
    for node in model.graph.node:
        node.input[:] = [rename.get(t, t) for t in node.input]
        to = _cast_to(node)
        inner = producer.get(node.input[0]) if to in FLOATS else None
        if inner is None or _cast_to(inner) != TensorProto.INT32 or types.get(inner.input[0]) not in FLOATS:
            continue
        v = inner.input[0]
        if types[v] == to:
            rename[node.output[0]] = v
        else:
            node.input[0] = v
    return model


@model_pass(NO_UNREAD_CASTS)
def drop_unread_casts(model: onnx.ModelProto) -> onnx.ModelProto:
    """Casts whose output nobody reads are removed, repeatedly (a dropped cast may leave its source unread);
    every tensor still read, or a graph output, keeps its producer."""
    graph = model.graph
    while True:
        read = _read(graph)
        keep = [n for n in graph.node if _cast_to(n) is None or n.output[0] in read]
        if len(keep) == len(graph.node):
            return model
        del graph.node[:]
        graph.node.extend(keep)


@model_pass(NO_UNREAD_PARAMS)
def drop_unread_params(model: onnx.ModelProto) -> onnx.ModelProto:
    """Initializers nobody reads are removed (a fused run holds its scalars as constants), so that onnxruntime
    has no unused initializer to warn about; every param still read stays as it was."""
    read = _read(model.graph)
    for k in reversed(range(len(model.graph.initializer))):
        if model.graph.initializer[k].name not in read:
            del model.graph.initializer[k]
    return model


@model_pass(NO_STALE_VALUE_INFO)
def drop_stale_value_info(model: onnx.ModelProto) -> onnx.ModelProto:
    """value_info is kept only for tensors a node or an initializer still makes, in its order; every kept entry
    is unchanged (its shape and ``cvm.precision``)."""
    graph = model.graph
    made = {o for n in graph.node for o in n.output} | {t.name for t in graph.initializer}
    infos = [vi for vi in graph.value_info if vi.name in made]
    del graph.value_info[:]
    graph.value_info.extend(infos)
    return model


def _window_key(node: onnx.NodeProto) -> bytes | None:
    """What determines a native im2col node's output (its op, inputs and attributes), else None."""
    if node.domain != NATIVE_DOMAIN or not node.op_type.startswith("im2col"):
        return None
    key = onnx.NodeProto(op_type=node.op_type, domain=node.domain, input=node.input, attribute=node.attribute)
    return key.SerializeToString(deterministic=True)


def _repeated_windows(model: onnx.ModelProto) -> list[str]:
    seen, repeated = set(), []
    for n in model.graph.node:
        if (key := _window_key(n)) is not None:
            repeated += [n.name] if key in seen else []
            seen.add(key)
    return repeated


NO_REPEATED_WINDOWS = Condition("no two native im2col nodes of the same inputs and attributes", _repeated_windows)


@model_pass(NO_REPEATED_WINDOWS)
def merge_repeated_windows(model: onnx.ModelProto) -> onnx.ModelProto:
    """A native im2col node with the same op, inputs and attributes as an earlier one (the runs that take channel
    groups of one convolution, ``requantize.Chain.take``) is removed, its readers reading the earlier one's output:
    the op is a function of its input and attributes (pure data movement), so the windows are the same bytes."""
    first: dict[bytes, str] = {}
    rename: dict[str, str] = {}
    nodes = []
    for node in model.graph.node:
        node.input[:] = [rename.get(t, t) for t in node.input]
        key = _window_key(node)
        if key is not None and key in first:
            rename[node.output[0]] = first[key]
            continue
        if key is not None:
            first[key] = node.output[0]
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def _integer_clips(model: onnx.ModelProto) -> list[str]:
    types = element_types(model)
    return [n.name for n in model.graph.node
            if n.op_type == "Clip" and n.domain in ("", "ai.onnx") and types.get(n.input[0]) not in FLOATS]


#: What the CUDA form needs of a Clip: none on integers (onnxruntime's CUDA provider has no int32 Clip kernel).
NO_INTEGER_CLIP = Condition("no Clip of an integer tensor", _integer_clips)


@model_pass(NO_INTEGER_CLIP)
def clips_as_max_min(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every integer ``Clip(x, lo, hi)`` becomes ``Min(Max(x, lo), hi)`` (an absent bound: that step left out),
    named after it: onnxruntime has no CUDA kernel for int32 Clip, and Max and Min have int32 ones. The same
    value: ONNX Clip is min(max(x, lo), hi), which for lo > hi gives hi, as the Min of the Max does."""
    types = element_types(model)
    nodes = []
    for node in model.graph.node:
        if node.op_type != "Clip" or node.domain not in ("", "ai.onnx") or types.get(node.input[0]) in FLOATS:
            nodes.append(node)
            continue
        x = node.input[0]
        bounds = [(op, t) for op, t in zip(("Max", "Min"), [*node.input[1:], "", ""][:2]) if t]
        for k, (op, t) in enumerate(bounds):
            y = node.output[0] if k == len(bounds) - 1 else f"{node.output[0]}:{op.lower()}"
            nodes.append(onnx.helper.make_node(op, [x, t], [y], name=f"{node.name}:{op.lower()}"))
            nodes[-1].metadata_props.extend(node.metadata_props)
            x = y
        if not bounds:
            nodes.append(onnx.helper.make_node("Identity", [x], list(node.output), name=node.name))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def _integer_scalars(graph: onnx.GraphProto) -> dict[str, int]:
    """The integer scalar each Constant node (``value``) makes, by its output's name."""
    out = {}
    for n in graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.attribute[0].name == "value":
            v = numpy_helper.to_array(n.attribute[0].t)
            if v.size == 1 and v.dtype.kind in "iu":
                out[n.output[0]] = int(v.reshape(-1)[0])
    return out


def _clip(x: int, lo: int, hi: int) -> int:
    """ONNX Clip of one value: min(max(x, lo), hi) (hi for lo > hi)."""
    return min(max(x, lo), hi)


def _move_declared(graph: onnx.GraphProto, src: str, dst: str) -> None:
    """The ``cvm.precision`` of value ``src`` put on graph input ``dst`` (if ``dst`` is one and ``src`` has it)."""
    declared = [p for vi in graph.value_info if vi.name == src for p in vi.metadata_props if p.key == PRECISION]
    for vi in graph.input:
        if vi.name == dst:
            vi.metadata_props.extend(declared)


@model_pass()
def merge_clip_pairs(model: onnx.ModelProto) -> onnx.ModelProto:
    """``Clip(Clip(x, a1, b1), a2, b2)`` with integer constant bounds, the inner Clip's output read by the outer
    alone and no graph output, becomes ``Clip(x, A, B)`` in the outer's place, A = clip(a1, a2, b2) and
    B = clip(b1, a2, b2) (each the tensor of one of the four bounds: no new constant); the inner Clip and the
    Constants nobody reads any more are removed. (The input's clamp to its precision followed by a clip: the
    precision declared on the clamped value, ``<input>:clamped``, moves to the graph input itself.)

    Exact for every x (ONNX Clip is min(max(x, lo), hi)): g = clip(., a2, b2) is nondecreasing. For a1 > b1 the
    inner is b1, so the left side is g(b1) = B, and A >= B makes clip(x, A, B) = B too. For a1 <= b1 the inner is
    the median of a1, x, b1, and a nondecreasing g commutes with medians: the left side is med(A, g(x), B). If
    a2 > b2, g is b2 everywhere and A = B = b2. Else A, B lie in [a2, b2], where g(x) = x; outside it g(x) is
    the nearer end of [a2, b2], beyond neither A nor B on x's side: med(A, g(x), B) = med(A, x, B) = clip(x, A, B).
    """
    graph = model.graph
    scalars = _integer_scalars(graph)
    reads: dict[str, int] = {}
    for t in [t for n in graph.node for t in n.input] + [o.name for o in graph.output]:
        reads[t] = reads.get(t, 0) + 1
    clips: dict[str, onnx.NodeProto] = {}
    dropped: set[str] = set()  # the inner Clips' outputs
    freed: set[str] = set()
    for node in graph.node:
        if node.op_type != "Clip" or node.domain not in ("", "ai.onnx") or len(node.input) != 3 \
                or not all(t in scalars for t in node.input[1:]):
            continue
        inner = clips.get(node.input[0])
        if inner is not None and reads[node.input[0]] == 1:
            (a1, b1), (a2, b2) = inner.input[1:], node.input[1:]
            value = {scalars[t]: t for t in (a1, b1, a2, b2)}
            lo, hi = (value[_clip(scalars[t], scalars[a2], scalars[b2])] for t in (a1, b1))
            freed.update({a1, b1, a2, b2} - {lo, hi})
            node.input[:] = [inner.input[0], lo, hi]
            dropped.add(inner.output[0])
            _move_declared(graph, inner.output[0], inner.input[0])
        clips[node.output[0]] = node
    nodes = [n for n in graph.node if n.op_type != "Clip" or n.output[0] not in dropped]
    read = {t for n in nodes for t in n.input} | {o.name for o in graph.output}
    nodes = [n for n in nodes if not (n.op_type == "Constant" and n.output[0] in freed - read)]
    del graph.node[:]
    graph.node.extend(nodes)
    return model


#: The passes of the serving form after export, in order.
SERVING: tuple[Pass, ...] = (merge_repeated_windows, merge_clip_pairs, skip_int32_round_trips, drop_unread_casts,
                             drop_unread_params, drop_stale_value_info)
#: The passes of the CUDA serving form after ``SERVING``: every node a kernel of onnxruntime's CUDA provider.
CUDA: tuple[Pass, ...] = (clips_as_max_min,)
