"""Where onnxruntime places a model's nodes with the CUDA provider: a check from its kernel table, and a reading
of a session's profile.

* ``cuda_kernels.json`` (beside this module) holds the kernels of onnxruntime's CUDAExecutionProvider for the
  ops cvm-onnx writes, at opset 21, with their type constraints, taken from onnxruntime's own operator-kernel
  documentation (its source and commit are named in the file). ``without_cuda_kernel(model)`` lists every node
  that has no CUDA kernel for its types: onnxruntime would run it on the CPU provider, with a copy to and from
  the host around it. A ``cvm.native`` node needs a CUDA kernel of the installed native library (``cuda_ops``)
  that takes its attributes: ``cuda_refusals`` names those the native CUDA kernel would refuse at run time (a
  session places them on CUDA, where they fail; ``sessions.session`` refuses such a model for "cuda" up front).
  Constants, and nodes that read only constants (folded when the session is created), need none.
* ``profiled_placement(path)`` reads an onnxruntime profile (``SessionOptions.enable_profiling``) and gives the
  provider each node ran on, for the check on a machine with a GPU.
"""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import onnx
from onnx import TensorProto

from cvm_onnx.serving.flat import element_types
from cvm_onnx.core.errors import Problem
from cvm_onnx.native import DOMAIN as NATIVE_DOMAIN
from cvm_onnx.native import CPU_ONLY_ATTRIBUTES, cuda_ops, library_path


@cache
def table() -> dict:
    """The kernel table (see the module's docstring)."""
    return json.loads(Path(__file__).with_name("cuda_kernels.json").read_text())


def _type_name(elem_type: int) -> str:
    return {"FLOAT": "float", "DOUBLE": "double"}.get(TensorProto.DataType.Name(elem_type),
                                                      TensorProto.DataType.Name(elem_type).lower())


def _constants(model: onnx.ModelProto) -> set[str]:
    """Tensors known when the session is created: initializers, and outputs of nodes reading only those."""
    known = {t.name for t in model.graph.initializer}
    for node in model.graph.node:
        if node.domain in ("", "ai.onnx") and all(not t or t in known for t in node.input):
            known.update(node.output)
    return known


def _kernel_problem(node: onnx.NodeProto, types: dict[str, int]) -> str | None:
    """Why ``node`` (domain ai.onnx) has no CUDA kernel for its types, or None when it has one."""
    kernel = table()["kernels"].get(node.op_type)
    if kernel is None:
        return f"onnxruntime has no CUDA kernel for {node.op_type}"
    formal_in = kernel["inputs"]
    named = [(formal_in[0][:-1] if formal_in[0].endswith("*") else formal_in[min(k, len(formal_in) - 1)], t)
             for k, t in enumerate(node.input) if t]
    named += list(zip(kernel["outputs"], node.output))
    bound: dict[str, str] = {}
    for constraint, tensor in named:
        if tensor not in types:
            return f"the type of {tensor!r} is unknown"
        name = _type_name(types[tensor])
        if name not in kernel["types"][constraint]:
            allowed = ", ".join(kernel["types"][constraint])
            return f"onnxruntime's CUDA {node.op_type} takes {constraint} in {allowed}; {tensor!r} is {name}"
        if bound.setdefault(constraint, name) != name:
            return f"{node.op_type}'s {constraint} is both {bound[constraint]} and {name}"
    return None


def _cpu_only(node: onnx.NodeProto) -> str | None:
    """Why the native CUDA kernel of ``node`` (domain cvm.native) refuses its attributes, or None."""
    set_ = [a.name for a in node.attribute if a.name in CPU_ONLY_ATTRIBUTES.get(node.op_type, ())
            and (a.i or a.ints)]
    return (f"the native CUDA {node.op_type} takes no {' or '.join(set_)} (the CPU serving form's channels-last "
            f"layout: export the CUDA form, provider 'cuda')") if set_ else None


def cuda_refusals(model: onnx.ModelProto) -> list[Problem]:
    """Each ``cvm.native`` node that onnxruntime would place on CUDA and whose CUDA kernel refuses it."""
    ops = cuda_ops(library_path())
    return [Problem(n.name or n.output[0], why) for n in model.graph.node
            if n.domain == NATIVE_DOMAIN and n.op_type in ops and (why := _cpu_only(n))]


def without_cuda_kernel(model: onnx.ModelProto) -> list[Problem]:
    """Each node of ``model``'s main graph that onnxruntime's CUDA provider cannot run, named, with why."""
    types = element_types(model)
    known = _constants(model)
    problems = []
    for node in model.graph.node:
        if node.op_type == "Constant" or all(t in known for t in node.output):
            continue
        if node.domain == NATIVE_DOMAIN:
            why = _cpu_only(node) if node.op_type in cuda_ops(library_path()) else \
                f"the native library has no CUDA kernel for {NATIVE_DOMAIN} {node.op_type}"
        elif node.domain in ("", "ai.onnx"):
            why = _kernel_problem(node, types)
        else:
            why = f"domain {node.domain!r} has no CUDA kernels (a function call: inline it, or export the serving form)"
        if why:
            problems.append(Problem(node.name or node.output[0], why))
    return problems


def profiled_placement(path: str | Path) -> dict[str, str]:
    """Node name -> the execution provider it ran on, from an onnxruntime profile file (kernel events)."""
    placed = {}
    for event in json.loads(Path(path).read_text()):
        args = event.get("args", {})
        if event.get("cat") == "Node" and "provider" in args:
            placed[event["name"].removesuffix("_kernel_time")] = args["provider"]
    return placed
