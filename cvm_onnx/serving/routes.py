"""The route map of a serving form: for each CVM conv2d, its route (``cvm.routes``, chosen at export) and what
computes it in the model as it runs (its layout, kernel nodes, the ISA that multiplies, the requantize chain's
step kinds and the path the kernels take for the chain), read from the model's nodes, metadata ``cvm.routes`` and
``cvm.target`` by ``route_map`` alone; ``chain_paths``: the path of every requantize kernel's chains.

A model exported with layout "session" is mapped as a session here lays it out (the layout remembered for it on
this CPU, ``route_cache``, with this machine's operands, as ``runtime.sessions`` runs them), so the map says what
runs on this machine; where no layout is remembered yet, as this machine's target's (``Target.native``), which a
session here replaces by the fastest it measures.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import onnx

from cvm_onnx.core.constants import MARK_FUSED, MARK_IN_RUN, MARK_OPS, ROUTES
from cvm_onnx.native import DOMAIN, STEP_KINDS, ChainPath, chain_path

from .cpu_layout import layout_passes
from .passes import Sequential
from .route_cache import Choice, RouteKey, default_threads, lookup
from .target import Target

#: What each native kernel's products are multiplied by.
_ISA_NAMES = {0: "picked at run time", 1: "plain C", 2: "AVX2 vpmaddwd", 3: "AVX-VNNI", 4: "AVX-512 VNNI",
              5: "AVX2 vpmaddubsw"}


@dataclass(frozen=True)
class Route:
    """One conv2d's route: the ``route`` export chose (and ``why`` not integer products), the ``layout`` it runs
    in, the ``kernel`` nodes computing it, the ``isa`` multiplying its products, its ``chain``'s step kinds and the
    ``path`` the CPU kernels take for the chain (``chain_paths``; "-" where none or unknown)."""

    conv: str
    route: str
    why: str
    layout: str
    kernel: str
    isa: str
    chain: str
    path: str = "-"


def _attr(node: onnx.NodeProto, name: str) -> list[int] | int | None:
    a = next((a for a in node.attribute if a.name == name), None)
    return None if a is None else list(a.ints) if a.type == onnx.AttributeProto.INTS else a.i


def chain_kinds(node: onnx.NodeProto) -> str:
    """The step kinds of a native requantize kernel's chain (each channel's own steps: "per channel")."""
    if _attr(node, "channel_counts") is not None:
        return "per channel"
    kinds = [STEP_KINDS[k] for k in (_attr(node, "steps") or [])[::3] if 0 <= k < len(STEP_KINDS)]
    sums = [STEP_KINDS[k] for k in (_attr(node, "sum_steps") or [])[::3] if 0 <= k < len(STEP_KINDS)]
    return " > ".join(kinds) + (f"; add; {' > '.join(sums)}" if node.op_type.startswith(("requantize_add",
                                                                                          "conv_requantize_add"))
                                else "")


#: The native requantize kernels, whose chains the CPU kernels run (requantize.h).
REQUANTIZE_KERNELS = ("requantize", "requantize_uint8", "requantize_add", "requantize_add_uint8", "conv_requantize",
                      "conv_requantize_uint8", "conv_requantize_add", "conv_requantize_add_uint8")


def chain_paths(model: onnx.ModelProto) -> dict[str, ChainPath]:
    """The path (``native.chain_path``) of each native requantize kernel's chains in ``model``, by node name (its
    output's where unnamed); empty without the native library."""
    nodes = [n for n in model.graph.node if n.domain == DOMAIN and n.op_type in REQUANTIZE_KERNELS]
    if not nodes:
        return {}
    types = {}
    if any("_add" in n.op_type for n in nodes):  # the addends' types: int32 or uint8
        inferred = onnx.shape_inference.infer_shapes(model).graph
        types = {v.name: v.type.tensor_type.elem_type for v in (*inferred.input, *inferred.value_info)}
    paths = {}
    for n in nodes:
        attrs = {a.name: list(a.ints) for a in n.attribute if a.type == onnx.AttributeProto.INTS}
        channels_last = n.op_type.startswith("conv_") or bool(_attr(n, "nhwc")) or bool(attrs.get("rows"))
        addend = None
        if "_add" in n.op_type:
            addend = "uint8" if types.get(n.input[-1]) == onnx.TensorProto.UINT8 else "int32"
        path = chain_path(attrs, channels_last, addend)
        if path is None:
            return {}
        paths[n.name or n.output[0]] = path
    return paths


def _kernel(node: onnx.NodeProto, producer: dict[str, onnx.NodeProto], here: Target) -> tuple[str, str, str]:
    """(layout, kernel, isa) of the run whose requantize kernel is ``node``, in a model made for ``here``."""
    if node.op_type.startswith("conv_requantize"):
        isa = _attr(node, "isa") or 0
        return "fused", node.op_type, _ISA_NAMES.get(isa, str(isa)) + (f" (here: {here.isa})" if not isa else "")
    if _attr(node, "scales") is not None:
        return "per-channel scale", node.op_type, "int32 multiply"
    source = producer.get(node.input[0])
    while source is not None and source.op_type in ("Reshape", "Transpose"):
        source = producer.get(source.input[0])
    if source is None or source.op_type != "MatMulInteger":
        return "float32 products", (source.op_type if source is not None else "-") + f" > {node.op_type}", "MLAS"
    operands = []
    for t in source.input[:2]:
        n = producer.get(t)
        while n is not None and n.op_type in ("Reshape", "Transpose"):
            n = producer.get(n.input[0])
        operands.append(n)
    window = next((n.op_type for n in operands if n is not None and n.op_type.startswith("im2col")), "?")
    if here.provider == "cuda":
        return "cuda", f"{window} > MatMulInteger > {node.op_type}", "cuBLAS int8 x int8"
    signed = window == "im2col_int8" or any(n is not None and n.op_type == "Cast" and _attr(n, "to") ==
                                            onnx.TensorProto.INT8 for n in operands)
    kind = "MLAS u8s8" if signed else "MLAS u8u8"
    if window == "im2col_rows":
        rows = operands[0]
        layout = "rows (channels-last)" if _attr(rows, "nhwc") or _attr(node, "nhwc") else "rows"
        return layout, f"{window} > MatMulInteger > {node.op_type}", kind
    return "columns", f"{window} > MatMulInteger > {node.op_type}", kind


def remembered(model: onnx.ModelProto, threads: int | None = None) -> Choice | None:
    """The layout remembered here (``route_cache``) for a serving form exported with layout "session", as a session
    with ``threads`` (None: as many as it gets by default) and this machine's operands runs it; None where there is
    none, or the model's layout is not left to the session."""
    target = Target.of(model)
    if target is None or not target.cpu_integer or target.layout != "session":
        return None
    here = Target.native()
    if not here.cpu_integer:
        return None
    return lookup(RouteKey.of(model, threads or default_threads(model), here.operands))


def route_map(model: onnx.ModelProto) -> list[Route]:
    """Each conv2d's ``Route`` in ``model`` (a serving form; none for another form), as it runs here."""
    props = {p.key: p.value for p in model.metadata_props}
    if ROUTES not in props:
        return []
    target = Target.of(model)
    deferred = target is not None and target.cpu_integer and target.layout == "session"
    here = Target.native() if deferred or target is None else target
    if deferred and here.cpu_integer:
        known = remembered(model)
        model = Sequential(layout_passes(known.layout if known else here.layout, here.operands))(model).model
    producer = {o: n for n in model.graph.node for o in n.output}
    paths = chain_paths(model) if here.cpu_integer else {}
    kernels: dict[str, tuple[str, str, str, str, str]] = {}
    for n in model.graph.node:
        marks = {p.key: p.value for p in n.metadata_props}
        if n.domain != DOMAIN or MARK_FUSED not in marks or not n.op_type.startswith(("requantize", "conv_")):
            continue
        head, op = json.loads(marks[MARK_FUSED])[0], json.loads(marks.get(MARK_OPS, "[]"))[:1]
        if op == ["conv2d"]:
            path = paths.get(n.name or n.output[0])
            kernels[head] = (*_kernel(n, producer, here), chain_kinds(n), path.text if path else "-")
        inner = json.loads(marks.get(MARK_IN_RUN, "{}"))  # a per-channel scale's run in the kernel reading it
        if json.loads(inner.get(MARK_OPS, "[]"))[:1] == ["conv2d"]:
            kinds = " > ".join(STEP_KINDS[k] for k in (_attr(n, "in_steps") or [])[::3] if 0 <= k < len(STEP_KINDS))
            kernels[json.loads(inner[MARK_FUSED])[0]] = ("per-channel scale", f"{n.op_type} (in_steps)",
                                                        "int32 multiply", kinds, "-")
    routes = []
    for conv, route, why in json.loads(props[ROUTES]):
        layout, kernel, isa, chain, path = kernels.get(conv, (
            "float32 products" if route.startswith("float32") else "-", "Conv" if route.startswith("float32") else "-",
            "MLAS", "-", "-"))
        routes.append(Route(conv, route.split(";")[0], why, layout, kernel, isa, chain, path))
    return routes


def route_lines(model: onnx.ModelProto) -> list[str]:
    """The route map as text lines, one per conv2d, with a header naming the target it runs for."""
    routes = route_map(model)
    if not routes:
        return []
    target = Target.of(model)
    deferred = target is not None and target.cpu_integer and target.layout == "session"
    lines = [f"routes ({len(routes)} conv2d; target {target.text() if target else 'unstated'}"
             f"{', laid out as a session here lays it out' if deferred else ''}):"]
    if deferred and Target.native().cpu_integer:
        known = remembered(model)
        lines.append(f"  layout {known.layout}, from the route cache (measured on this CPU: {known.timed()})"
                     if known else f"  layout not measured here yet: mapped as this machine's target's "
                     f"({Target.native().layout}); a session here measures rows, fused and columns and keeps the "
                     "fastest")
    lines += [f"  {r.conv}: {r.route}; {r.layout}: {r.kernel}; {r.isa}; chain {r.chain}"
              + (f"; path {r.path}" if r.path != "-" else "") + (f"; not integer products: {r.why}" if r.why else "")
              for r in routes]
    return lines
