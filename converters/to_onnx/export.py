"""CVM graph -> ONNX model: one node per CVM op node, decompositions as model-local functions.

The model: input ``data`` (int32, static shape) clamped to its declared precision as the runtime does, params
as int32 initializers, each CVM op as a node of domain ``cvm`` calling a function specialised to its attributes
and shapes (identical bodies shared through one function overload), native custom ops in place, outputs named
after the CVM heads, value_info with the static shape on every tensor, provenance in metadata_props.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from cvm_onnx import __version__
from cvm_onnx.errors import Problem, UnsupportedError
from cvm_onnx.graph import Entry, Graph, TensorType
from cvm_onnx.native import DOMAIN as NATIVE_DOMAIN
from cvm_onnx.ops import REGISTRY

from . import broadcast, elemwise, native, nn, reduce, transform  # noqa: F401  (registers the lowerings)
from .bounds import true_precisions
from .lowering import DOMAIN, IR_VERSION, LOWERINGS, OPSET, Value, lower


def onnx_attr_value(value: Any) -> Any:
    """A typed CVM attribute as an ONNX attribute value (bools as 0/1, tuples as ints); None is left out."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, tuple):
        return [int(v) for v in value]
    return value


def entry_names(graph: Graph) -> dict[Entry, str]:
    """ONNX tensor name of every entry: the CVM node name, ``name:k`` for output k > 0, ``name:clamped`` for an
    input after the runtime's clamp (the graph input keeps the plain name)."""
    names = {}
    for i, node in enumerate(graph.nodes):
        if node.is_variable and node.name not in graph.params:
            names[Entry(i)] = f"{node.name}:clamped"
            continue
        for k in range(len(node.outputs)):
            names[Entry(i, k)] = node.name if k == 0 else f"{node.name}:{k}"
    return names


def value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    vi = helper.make_tensor_value_info(name, TensorProto.INT32, list(t.shape))
    vi.metadata_props.add(key="cvm.precision", value=str(t.precision))
    return vi


def unsupported(graph: Graph) -> list[Problem]:
    return [Problem(n.name, f"no ONNX lowering for CVM op {n.op!r}")
            for n in graph.nodes if not n.is_variable and n.op not in LOWERINGS]


def to_onnx(graph: Graph, inline: bool = False, source_version: str = "cvm_1.0.0") -> onnx.ModelProto:
    """Export a validated CVM graph. ``inline`` writes the flat form (every function inlined)."""
    if problems := unsupported(graph):
        raise UnsupportedError(problems)
    names = entry_names(graph)
    precs = true_precisions(graph)
    nodes: list[onnx.NodeProto] = []
    functions: dict[bytes, onnx.FunctionProto] = {}
    overloads: dict[str, int] = {}
    initializers, inputs = [], []
    infos = []
    uses_native = False

    for i, node in enumerate(graph.nodes):
        t = node.outputs[0]
        if node.is_variable:
            if node.name in graph.params:
                initializers.append(numpy_helper.from_array(graph.params[node.name].astype(np.int32), node.name))
            else:
                inputs.append(helper.make_tensor_value_info(node.name, TensorProto.INT32, list(t.shape)))
                nodes.append(helper.make_node(
                    "Clip", [node.name, *_scalar_consts(nodes, node.name, -t.bound, t.bound)], [names[Entry(i)]],
                    name=f"{node.name}_clamp",
                    doc_string=f"the runtime clamps its input to precision {t.precision}: |x| <= {t.bound}"))
                infos.append(value_info(names[Entry(i)], t))
            continue
        op = REGISTRY[node.op]
        a = op.bind(node.attrs)
        ins = [Value(f"x{k}", TensorType(graph.type_of(e).shape, precs[e]), _param_value(graph, e))
               for k, e in enumerate(node.inputs)]
        outs = [TensorType(o.shape, precs[Entry(i, k)]) for k, o in enumerate(node.outputs)]
        body, out_names = lower(node.op, a, ins, outs)
        in_names = [names[e] for e in node.inputs]
        my_names = [names[Entry(i, k)] for k in range(len(node.outputs))]
        infos.extend(value_info(n, o) for n, o in zip(my_names, node.outputs))
        doc = _node_doc(node.op, a)
        if LOWERINGS[node.op].native:
            (native,) = body.nodes
            native.name = node.name
            native.input[:] = in_names
            native.output[:] = my_names
            native.doc_string = doc
            nodes.append(native)
            uses_native = True
            continue
        fn = helper.make_function(
            DOMAIN, node.op, [v.name for v in ins], out_names, body.nodes,
            [helper.make_opsetid("", OPSET)], attributes=[k for k, v in a.items() if v is not None],
            doc_string=(LOWERINGS[node.op].fn.__doc__ or "").strip())
        key = fn.SerializeToString()
        if key not in functions:
            overloads[node.op] = overloads.get(node.op, 0) + 1
            fn.overload = str(overloads[node.op])
            functions[key] = fn
        call = helper.make_node(node.op, in_names, my_names, name=node.name, domain=DOMAIN, doc_string=doc,
                                **{k: onnx_attr_value(v) for k, v in a.items() if v is not None})
        call.overload = functions[key].overload
        nodes.append(call)

    outputs = []
    used: set[str] = set()
    for h in graph.heads:
        name, t = names[h], graph.type_of(h)
        if name in used or graph.nodes[h.node].is_variable:
            alias = f"{name}_out{len(outputs)}"
            nodes.append(helper.make_node("Identity", [name], [alias], name=alias))
            name = alias
        used.add(name)
        outputs.append(helper.make_tensor_value_info(name, TensorProto.INT32, list(t.shape)))
    out_names = {o.name for o in outputs}
    onnx_graph = helper.make_graph(nodes, "cvm", inputs, outputs, initializers,
                                   value_info=[v for v in infos if v.name not in out_names])
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)]
    if uses_native:
        opsets.append(helper.make_opsetid(NATIVE_DOMAIN, 1))
    model = helper.make_model(onnx_graph, opset_imports=opsets, functions=list(functions.values()),
                              ir_version=IR_VERSION, producer_name="cvm-onnx", producer_version=__version__)
    helper.set_model_props(model, {"converted_from": "CVM", "cvm.version": source_version})
    if inline:
        import onnx.inliner

        model = onnx.inliner.inline_local_functions(model)
    return model


def _param_value(graph: Graph, e: Entry) -> np.ndarray | None:
    """The value of ``e`` when it is a param, else None."""
    node = graph.nodes[e.node]
    return graph.params.get(node.name) if node.is_variable else None


def _scalar_consts(nodes: list[onnx.NodeProto], prefix: str, *values: int) -> list[str]:
    names = []
    for k, v in enumerate(values):
        name = f"{prefix}_{'min' if k == 0 else 'max'}"
        nodes.append(helper.make_node("Constant", [], [name], name=name,
                                      value=numpy_helper.from_array(np.array(v, np.int32), name)))
        names.append(name)
    return names


def _node_doc(op: str, a) -> str:
    args = ", ".join(f"{k}={v}" for k, v in a.items())
    return f"CVM {op}({args})"
