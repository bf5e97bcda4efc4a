"""The lowering registry and the function-body builder every lowering writes with.

A lowering turns one CVM op node into the body of a model-local ONNX function (domain ``cvm``): it receives a
``Body``, the node's typed attributes and one ``Value`` per input (name, shape, a bound every value provably
satisfies, see bounds.py), and returns the name of each output. Bodies are written like onnxscript:
``b.Add(x, b.const(1))``. A lowering registered with ``native=True`` emits exactly one node of the native
custom-op library instead, which the exporter places in the main graph as is.

Every body takes and returns int32; a param stored as int8 (``Value.const`` of dtype int8) is passed as is
and widened by the body's first node, a Cast. A body may compute in float32 or float64 where that is exact,
but it casts a float to int32 only when the float holds an integer within int32 (never relying on Cast's
truncation or on out-of-range conversion): ``optimize.py`` depends on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.core.graph import Entry, Graph
from cvm_onnx.core.ops import REGISTRY, Attrs

from .bounds import value_bounds


@dataclass(frozen=True)
class Value:
    """A tensor of a function body: its name, static shape, a proven bound on |x|, for a param its value, and
    whether it is proven >= 0 (``bounds.nonnegative``)."""

    name: str
    shape: tuple[int, ...]
    bound: int
    const: np.ndarray | None = field(default=None, compare=False, repr=False)
    nonneg: bool = False


@dataclass
class Body:
    """The nodes of one function body under construction. ``b.OpType(*inputs, **attrs)`` appends a node."""

    outputs: list[Value]
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    widened: dict[str, str] = field(default_factory=dict)  # int8 param widened to int32: int32 name -> int8 name
    _count: int = 0
    conv_form: str = "fast"  # how conv2d and dense are written: "fast" or "core" (nn.py, CONV_FORMS)

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}{self._count}"

    def node(self, op_type: str, *inputs: str | Value, n_out: int = 1, domain: str = "",
             **attrs: Any) -> Any:
        names = [i.name if isinstance(i, Value) else i for i in inputs]
        if op_type == "Cast" and names[0] in self.widened:  # int8 -> float is as exact as int32 -> float
            names[0] = self.widened[names[0]]
        outs = [self.fresh("t") for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, names, outs, domain=domain or None,
                                           **{k: v for k, v in attrs.items() if v is not None}))
        return outs[0] if n_out == 1 else outs

    def __getattr__(self, op_type: str) -> Callable[..., Any]:
        if not op_type[:1].isupper():
            raise AttributeError(op_type)
        return lambda *inputs, **attrs: self.node(op_type, *inputs, **attrs)

    def to_output_shape(self, x: str | Value) -> str:
        """``x`` reshaped to the (static) shape of the body's first output."""
        return self.Reshape(x, self.const(self.outputs[0].shape))

    def const(self, value: Any, dtype: Any = np.int64) -> str:
        """A Constant node holding ``value`` (a scalar gives a 0-d tensor)."""
        out = self.fresh("c")
        tensor = numpy_helper.from_array(np.asarray(value, dtype=dtype), out)
        self.nodes.append(helper.make_node("Constant", [], [out], value=tensor))
        return out


def is_int8(v: Value) -> bool:
    return v.const is not None and v.const.dtype == np.int8


LoweringFn = Callable[..., "str | list[str]"]


@dataclass(frozen=True)
class Lowering:
    op: str
    fn: LoweringFn
    native: bool = False


LOWERINGS: dict[str, Lowering] = {}


def lowering(op: str, native: bool = False) -> Callable[[LoweringFn], LoweringFn]:
    """Register ``fn(b, a, *inputs)`` as the lowering of CVM op ``op``. Its docstring becomes the function's doc."""

    def deco(fn: LoweringFn) -> LoweringFn:
        if op in LOWERINGS:
            raise ValueError(f"lowering of {op} defined twice")
        LOWERINGS[op] = Lowering(op, fn, native)
        return fn

    return deco


def widen(b: Body, inputs: list[Value]) -> list[Value]:
    """``inputs``, each int8 param read through a Cast to int32 (``unwiden`` drops the Casts left unread: a Cast
    to float reads the int8 param itself, ``Body.node``)."""
    args = list(inputs)
    for k, v in enumerate(inputs):
        if is_int8(v):
            args[k] = replace(v, name=b.Cast(v, to=TensorProto.INT32))
            b.widened[args[k].name] = v.name
    return args


def unwiden(b: Body, names: list[str]) -> None:
    """Drop the widening Casts that nothing in ``b`` nor its outputs ``names`` reads."""
    read = {t for n in b.nodes for t in n.input} | set(names)
    b.nodes[:] = [n for n in b.nodes if n.output[0] not in b.widened or n.output[0] in read]


#: How conv2d and dense may be written (nn.py): the export's "fast" and the "core" form, which tests and
#: benchmarks/bench_conv.py reach through ``lower``.
CONV_FORMS = ("fast", "core")


def lower(op: str, a: Attrs, inputs: list[Value], outputs: list[Value],
          conv_form: str = "fast") -> tuple[Body, list[str]]:
    """Run the lowering of ``op`` (int8 params widened first), conv2d and dense in ``conv_form`` (``CONV_FORMS``;
    ``ValueError`` for another); returns the body and the names of its outputs."""
    if conv_form not in CONV_FORMS:
        raise ValueError(f"conv_form must be one of {CONV_FORMS}, got {conv_form!r}")
    b = Body(outputs, conv_form=conv_form)
    args = list(inputs) if LOWERINGS[op].native else widen(b, inputs)
    out = LOWERINGS[op].fn(b, a, *args)
    names = [out] if isinstance(out, str) else list(out)
    unwiden(b, names)
    # a function output must be produced inside the body, never be one of its inputs
    inputs_names = {v.name for v in inputs}
    names = [b.Identity(n) if n in inputs_names else n for n in names]
    return b, names


def op_model(graph: Graph, conv_form: str = "fast") -> onnx.ModelProto:
    """The one op of ``graph`` (its other nodes its inputs and params) lowered in ``conv_form`` (``lower``) as a
    model: its inputs the graph's, its params initializers (int8 ones as int8), its bounds as the export takes
    them (``bounds.value_bounds``). How tests and benchmarks/bench_conv.py reach the core form, which the export
    never writes."""
    (i, node), bounds = next((i, n) for i, n in enumerate(graph.nodes) if not n.is_variable), value_bounds(graph)
    names = [graph.nodes[e.node].name for e in node.inputs]
    ins = [Value(name, graph.type_of(e).shape, bounds[e], graph.params.get(name)) for name, e in zip(names, node.inputs)]
    outs = [Value("", o.shape, bounds[Entry(i, k)]) for k, o in enumerate(node.outputs)]
    body, names = lower(node.op, REGISTRY[node.op].bind(node.attrs), ins, outs, conv_form=conv_form)
    inputs = [helper.make_tensor_value_info(v.name, TensorProto.INT32, list(v.shape)) for v in ins if v.const is None]
    params = [numpy_helper.from_array(v.const, v.name) for v in ins if v.const is not None]
    outputs = [helper.make_tensor_value_info(n, TensorProto.INT32, list(v.shape)) for n, v in zip(names, outs)]
    return onnx_model(helper.make_graph(body.nodes, node.op, inputs, outputs, params))
