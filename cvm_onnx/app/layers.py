"""Where an import's distance comes from, per quantized tensor (``quantize --report``, ``convert --report
--samples``).

Every quantized tensor of the ONNX model that the import computes (a QuantizeLinear's output; in a QOperator model
also a QLinear node's output, at its output scale, and what ops moving its values make of it) is measured on
samples, in that tensor's own steps (its scale), against

* the float model (where given): |(q - z) s - x| / s, x the float model's tensor of the same name (a QDQ model:
  the QuantizeLinear's input; a QOperator model: the name less ``_quantized``), computed by onnxruntime through
  onnxruntime.quantization.qdq_loss_debug (the model with its intermediate tensors as outputs,
  ``collect_activations``, graph optimizations off);
* the exact arithmetic of the quantized model given the same integers in: each piece of a QDQ model (the
  DequantizeLinear nodes, the float ops between, the QuantizeLinear; a QOperator node of ``EXPANDED`` written as
  one, ``qdq_form``) run alone on the CVM values of the quantized tensors it reads, in float64 with onnx's reference evaluator, DequantizeLinear as (q - z) s and QuantizeLinear
  as round half to even of y / s, + z, saturated (``exact``: float64 is exact on these integers up to its own
  rounding of products and sums, 2^-52 relative, far inside a requantization's error). So a tensor off the exact
  arithmetic is off by its own requantization, not by what came before.

The CVM values are the import's own graph run by the reference executor, each tensor's entry (``Imported.tensors``)
an extra head.
"""
from __future__ import annotations

import json
import math
import tempfile
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.converters.from_onnx import Imported, cut
from cvm_onnx.core.errors import RuntimeFailure, UnsupportedError
from cvm_onnx.core.executor import execute

from .calibration import feed

Progress = Callable[[int, int, str], None]
#: The suffixes onnxruntime.quantization gives a QOperator model's quantized tensors and a QDQ model's float tensor
#: quantized into a graph output (quant_utils' TENSOR_NAME_QUANT_SUFFIX and QUANT_INPUT_SUFFIX): the float
#: model's tensor is the name less it.
SUFFIXES = ("_quantized", "_QuantizeLinear_Input")
#: Where a quantizing node's output scale is among its inputs (its zero point follows): QuantizeLinear and the
#: QOperator ops of onnx and com.microsoft.
OUTPUT_SCALE = {"QuantizeLinear": 1, "QLinearConv": 6, "QLinearMatMul": 6, "QLinearAdd": 6, "QLinearMul": 6,
                "QGemm": 7, "QLinearConcat": 0, "QLinearAveragePool": 3, "QLinearGlobalAveragePool": 3,
                "QLinearSigmoid": 3, "QLinearLeakyRelu": 3, "QLinearSoftmax": 3, "QLinearReduceMean": 3}
#: Ops whose output holds values of their first input, at its scale (a QOperator model runs them on integers).
MOVES = ("MaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Gather", "Identity",
         "DepthToSpace", "SpaceToDepth", "Resize", "Pad", "Split", "Tile", "Expand")
#: Samples whose float activations are collected at once (collect_activations keeps every one of them).
CHUNK = 16


@dataclass(frozen=True)
class Layer:
    """One quantized tensor's distance, over the samples, in its own steps: from the float model (mean, summed
    exactly and rounded once, and max of |CVM - float| / scale; None without a float model or where it has no
    tensor of that name) and from the exact arithmetic given the same integers in (the share of values equal, the
    largest |CVM - exact|; None where no piece ends in the tensor: a QOperator one an op moving values gives, or a
    node ``qdq_form`` leaves)."""

    name: str
    op: str
    scale: float
    elements: int
    float_mean: float | None
    float_max: float | None
    equal: float | None
    off: int | None


@dataclass(frozen=True)
class LayerReport:
    """The rows, one per quantized tensor in the model's order, measured on ``samples`` samples, against a float
    model or not; ``note``: why the exact arithmetic is missing, if it is."""

    layers: list[Layer]
    samples: int
    float_model: bool
    note: str | None = None


@dataclass(frozen=True)
class _Tensor:
    """A quantized tensor of the ONNX model: its scale and zero point as broadcast over it, the float tensor it
    stands for, the float ops computing it, whether a QuantizeLinear gives it (a piece ends there), and its type's
    range."""

    name: str
    scale: np.ndarray
    zero: np.ndarray
    float_name: str
    op: str
    quantized: bool
    lo: int  # its type's range
    hi: int


def _constants(g: onnx.GraphProto) -> dict[str, np.ndarray]:
    out = {t.name: nh.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value":
            out[n.output[0]] = nh.to_array(n.attribute[0].t)
    return out


def _axis(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 1)


def quantized_tensors(model: onnx.ModelProto, computed: set[str]) -> list[_Tensor]:
    """The quantized tensors of ``model`` among ``computed`` (the import's tensors), in node order, with their
    scale and zero point: a QuantizeLinear's own, else those of the QOperator node giving it (``OUTPUT_SCALE``,
    through ``MOVES``), else those a DequantizeLinear or QOperator node reading it gives it."""
    g = model.graph
    consts = _constants(g)
    made = {o: n for n in g.node for o in n.output}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in g.node:
        for k, x in enumerate(n.input):
            readers.setdefault(x, []).append((n, k))

    def scaled(node: onnx.NodeProto, k: int) -> tuple[np.ndarray, np.ndarray, int] | None:
        s = consts.get(node.input[k + 1]) if len(node.input) > k + 1 else None
        z = consts.get(node.input[k + 2]) if len(node.input) > k + 2 and node.input[k + 2] else None
        if s is None or s.dtype.kind != "f" or (z is not None and z.dtype.kind not in "iu"):
            return None
        return s, np.zeros((), np.uint8) if z is None else z, _axis(node)

    def ops(x: str) -> str:
        out, todo, seen = [], [x], set()
        while todo:
            n = made.get(todo.pop())
            if n is not None and n.op_type not in ("DequantizeLinear", "QuantizeLinear") and id(n) not in seen:
                seen.add(id(n))
                out.append(n.op_type)
                todo += [i for i in n.input if i and i not in consts]
        return "+".join(reversed(out)) or "(the input)"

    def given(name: str) -> tuple[np.ndarray, np.ndarray, int] | None:
        """A QOperator tensor's scale: its producer's output scale (through ops that move values), else the
        (x, scale, zero point) triple of a node reading it."""
        x = name
        while (n := made.get(x)) is not None and n.op_type in MOVES and n.input:
            x = n.input[0]
        if n is not None and n.op_type in OUTPUT_SCALE and (f := scaled(n, OUTPUT_SCALE[n.op_type] - 1)) is not None:
            return f
        return next((f for r, k in readers.get(name, []) if _dequantizes(r, k) and (f := scaled(r, k)) is not None),
                    None)

    out, seen = [], set()
    for n in g.node:
        for name in n.output:
            if name not in computed or name in seen:
                continue
            if n.op_type == "QuantizeLinear":
                found, float_name, op = scaled(n, 0), n.input[0], ops(n.input[0])
            else:
                found, float_name, op = given(name), name, n.op_type
            float_name = next((float_name[:-len(x)] for x in SUFFIXES if float_name.endswith(x)), float_name)
            if found is None:
                continue
            s, z, axis = found
            rank = len(_shape(model, name) or ())
            if s.size > 1:
                if not rank:
                    continue
                shape = (-1,) + (1,) * (rank - 1 - axis % rank)
                s, z = s.reshape(shape), z.reshape(shape) if z.size > 1 else z
            seen.add(name)
            info = np.iinfo(z.dtype)
            out.append(_Tensor(name, s.astype(np.float64), z.astype(np.int64), float_name, op,
                               n.op_type == "QuantizeLinear", int(info.min), int(info.max)))
    return out


def _dequantizes(node: onnx.NodeProto, k: int) -> bool:
    """Whether ``node`` reads its input ``k`` as a quantized tensor followed by its scale and zero point."""
    return (node.op_type == "DequantizeLinear" and k == 0) or node.op_type.startswith("QLinear") or \
        node.op_type == "QGemm"


def _shape(model: onnx.ModelProto, name: str) -> tuple[int, ...] | None:
    for v in [*model.graph.value_info, *model.graph.output, *model.graph.input]:
        if v.name == name and v.type.tensor_type.HasField("shape"):
            return tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
    return None


def exact(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """``model`` in float64: DequantizeLinear as (q - z) s, QuantizeLinear as Round(y / s) + z, clipped (Round is
    half to even); float initializers as float64, a Resize's scales and roi kept. ``shapes``: of the graph inputs
    a per-channel DequantizeLinear reads."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = _constants(g)
    keep = {i for n in g.node if n.op_type in ("Resize", "Upsample") for i in n.input[1:]}
    extra, nodes = [], []

    def const(name: str, v) -> str:
        extra.append(nh.from_array(np.asarray(v, np.float64), name))
        return name

    for k, n in enumerate(g.node):
        axis = _axis(n)
        zero = n.input[2] if len(n.input) > 2 and n.input[2] else None
        if n.op_type == "DequantizeLinear":
            s = inits[n.input[1]].astype(np.float64)
            z = inits[zero].astype(np.float64) if zero else np.zeros_like(s)
            if s.size > 1:  # per channel: weights, or a piece's input
                rank = len(inits[n.input[0]].shape if n.input[0] in inits else shapes[n.input[0]])
                shape = (-1,) + (1,) * (rank - 1 - axis % rank)
                s, z = s.reshape(shape), z.reshape(shape)
            nodes += [h.make_node("Cast", [n.input[0]], [f"dq{k}c"], to=T.DOUBLE),
                      h.make_node("Sub", [f"dq{k}c", const(f"dq{k}z", z)], [f"dq{k}s"]),
                      h.make_node("Mul", [f"dq{k}s", const(f"dq{k}m", s)], [n.output[0]])]
        elif n.op_type == "QuantizeLinear":
            s = inits[n.input[1]].astype(np.float64)
            z = inits[zero] if zero else np.zeros((), np.uint8)
            info = np.iinfo(z.dtype)
            nodes += [h.make_node("Cast", [n.input[0]], [f"q{k}x"], to=T.DOUBLE),  # the input, a Cast's float32
                      h.make_node("Div", [f"q{k}x", const(f"q{k}s", s)], [f"q{k}d"]),
                      h.make_node("Round", [f"q{k}d"], [f"q{k}r"]),
                      h.make_node("Add", [f"q{k}r", const(f"q{k}z", z.astype(np.float64))], [f"q{k}a"]),
                      h.make_node("Clip", [f"q{k}a", const(f"q{k}lo", info.min), const(f"q{k}hi", info.max)],
                                  [f"q{k}k"]),
                      h.make_node("Cast", [f"q{k}k"], [n.output[0]], to=h.np_dtype_to_tensor_dtype(z.dtype))]
        elif n.op_type != "Constant" or n.output[0] not in inits:
            nodes.append(n)
    consts = [nh.from_array(v.astype(np.float64), name) if v.dtype == np.float32 and name not in keep
              else nh.from_array(v, name) for name, v in inits.items()]
    del g.node[:], g.initializer[:], g.value_info[:]
    g.node.extend(nodes)
    g.initializer.extend(consts + extra)
    return m


#: The QOperator ops ``qdq_form`` writes as DequantizeLinear, their float op and QuantizeLinear: (the positions of
#: their quantized inputs, each followed by its scale and zero point; of the output's scale; the float op).
EXPANDED = {"QLinearConv": ((0, 3), 6, "Conv"), "QLinearMatMul": ((0, 3), 6, "MatMul"),
            "QLinearAdd": ((0, 3), 6, "Add"), "QLinearMul": ((0, 3), 6, "Mul"),
            "QLinearSigmoid": ((0,), 3, "Sigmoid"), "QLinearLeakyRelu": ((0,), 3, "LeakyRelu"),
            "QLinearAveragePool": ((0,), 3, "AveragePool"), "QLinearGlobalAveragePool": ((0,), 3, "GlobalAveragePool")}


def qdq_form(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its QOperator nodes of ``EXPANDED`` (channels first), QLinearConcat and QGemm (a quantized
    output) as the QDQ pieces they compute: DequantizeLinear of each quantized input (a QLinearConv's int32 bias at
    scale a_scale b_scale, a QGemm's at alpha a_scale b_scale, as its kernel adds it, zero point 0, per channel where
    b_scale is), the float op with the node's attributes (a QGemm's beta 1: its kernel reads none), QuantizeLinear
    to its output. Other nodes stay as they are."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    consts = _constants(g)
    nodes = []
    for k, n in enumerate(g.node):
        spec = EXPANDED.get(n.op_type)
        attrs = {a.name: h.get_attribute_value(a) for a in n.attribute}
        if n.op_type == "QLinearConcat" and n.domain == "com.microsoft":  # (y_scale, y_zero_point, (x, s, z)...)
            spec = (tuple(range(2, len(n.input), 3)), 0, "Concat")
        elif n.op_type == "QGemm" and n.domain == "com.microsoft" and len(n.input) > 7 and n.input[7]:  # a float
            spec = ((0, 3), 7, "Gemm")  # output: left as it is
            attrs["beta"] = 1.0
        if spec is None or n.domain not in ("", "ai.onnx", "com.microsoft") or attrs.get("channels_last", 0):
            nodes.append(n)
            continue
        quantized, out, op = spec
        floats = []
        column = 0 if attrs.get("transB", 0) else -1  # a QGemm's or QLinearMatMul's B: per column of the product
        for i in quantized:
            floats.append(f"{n.output[0]}:in{i}")
            nodes.append(h.make_node("DequantizeLinear", [x for x in n.input[i:i + 3]], [floats[-1]],
                                     **({"axis": 0} if n.op_type == "QLinearConv" and i == 3 else
                                        {"axis": column} if n.op_type in ("QLinearMatMul", "QGemm") and i == 3
                                        else {})))
        bias = {"QLinearConv": 8, "QGemm": 6}.get(n.op_type)
        if bias is not None and len(n.input) > bias and n.input[bias]:  # int32 at a_scale b_scale (QGemm: x alpha)
            name = f"{n.output[0]}:bias_scale"
            g.initializer.append(nh.from_array(np.asarray(consts[n.input[1]], np.float64) *
                                               np.asarray(consts[n.input[4]], np.float64) *
                                               (attrs.get("alpha", 1.0) if n.op_type == "QGemm" else 1.0), name))
            floats.append(f"{n.output[0]}:bias")
            nodes.append(h.make_node("DequantizeLinear", [n.input[bias], name], [floats[-1]],
                                     axis=0 if n.op_type == "QLinearConv" else -1))
        attrs.pop("channels_last", None)  # 0 here: the float op's own layout
        nodes += [h.make_node(op, floats, [f"{n.output[0]}:float"], **attrs),
                  h.make_node("QuantizeLinear", [f"{n.output[0]}:float", *n.input[out:out + 2]], [n.output[0]])]
    del g.node[:]
    g.node.extend(nodes)
    return m


def pieces(model: onnx.ModelProto, tensors: list[_Tensor],
           shapes: dict[str, tuple[int, ...]]) -> tuple[onnx.ModelProto, list[str]]:
    """The pieces of ``model`` (its QOperator nodes in the QDQ form, ``qdq_form``) ending in the QuantizeLinear-made
    ``tensors``, each DequantizeLinear of a quantized tensor reading the new graph input ``name:cvm`` (its CVM
    values, of ``shapes``), in float64 (``exact``); the names computed."""
    m = qdq_form(model)
    known = {t.name for t in tensors}
    names = [o for n in m.graph.node if n.op_type == "QuantizeLinear" for o in n.output if o in known]
    fed = set()
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in known:
            fed.add(n.input[0])
            n.input[0] += ":cvm"
    m.graph.input.extend(h.make_tensor_value_info(t + ":cvm", T.INT32, shapes[t]) for t in fed)
    m = cut(m, names)
    used = {x for n in m.graph.node for x in n.input}
    keep = [v for v in m.graph.input if v.name in used]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    return exact(m, {t + ":cvm": shapes[t] for t in fed}), names


def layer_report(model: onnx.ModelProto, imported: Imported, samples: np.ndarray,
                 float_model: onnx.ModelProto | None = None, progress: Progress | None = None) -> LayerReport:
    """Per quantized tensor of the quantized ONNX ``model`` that ``imported`` (its import) computes, its distance
    on ``samples`` (N inputs stacked on a new axis 0, each of the model's input shape) from ``float_model`` and
    from the exact arithmetic (the module's docstring)."""
    from onnx.reference import ReferenceEvaluator

    tensors = quantized_tensors(model, set(imported.tensors))
    graph = replace(imported.graph, heads=[imported.tensors[t.name] for t in tensors])
    [data_name] = [graph.nodes[i].name for i in graph.inputs]
    shapes = {t.name: _onnx_shape(_shape(model, t.name), graph.type_of(imported.tensors[t.name]).shape)
              for t in tensors}
    exact_model, exact_names = pieces(model, tensors, shapes)
    evaluator, note = None, None
    try:
        evaluator = ReferenceEvaluator(exact_model) if exact_names else None
    except Exception as e:  # noqa: BLE001  (onnx's reference evaluator raises several types)
        exact_names, note = [], _no_exact(e)
    fed = [i.name for i in exact_model.graph.input]
    floats = _Floats(float_model, [t.float_name for t in tensors]) if float_model is not None else None
    acc = {t.name: np.zeros(5) for t in tensors}  # -, |CVM - float| max, equal, |CVM - exact| max, elements
    fsums = {t.name: Fraction(0) for t in tensors}  # |CVM - float| summed exactly
    for k in range(0, len(samples), CHUNK):
        chunk = samples[k:k + CHUNK]
        fl = floats.run(chunk) if floats is not None else {}
        for j, x in enumerate(chunk):
            if progress:
                progress(k + j + 1, len(samples), "per-layer report")
            data = imported.edges.prepare(x) if imported.edges is not None else x
            cvm = {t.name: v.astype(np.int64).reshape(shapes[t.name])
                   for t, v in zip(tensors, execute(graph, {data_name: data}))}
            ex = {}
            if evaluator is not None and exact_names:
                given = feed(data_name, x, np.shape(x))  # the source model's inputs by name
                one = {name: given.get(name, x) if not name.endswith(":cvm") else cvm[name[:-4]] for name in fed}
                try:
                    ex = dict(zip(exact_names, evaluator.run(exact_names, one)))
                except Exception as e:  # noqa: BLE001  (as above)
                    exact_names, note = [], _no_exact(e)
            for t in tensors:
                q, a = cvm[t.name], acc[t.name]
                a[4] += q.size
                if (f := fl.get(t.float_name)) is not None and f[j].size != q.size:
                    floats.drop(t.float_name)  # not the same tensor: no float columns for it
                elif f is not None:
                    f = f[j].astype(np.float64).reshape(q.shape) / t.scale
                    if not t.quantized:  # a QOperator node's output: its fused Relu or Clip is the saturation
                        f = np.clip(f, t.lo - t.zero, t.hi - t.zero)
                    d = np.abs((q - t.zero) - f)
                    fsums[t.name] += exact_sum(d)
                    a[1] = max(a[1], d.max(initial=0))
                if t.name in ex:
                    e = np.abs(q.reshape(-1) - np.asarray(ex[t.name], np.int64).reshape(-1))
                    a[2] += (e == 0).sum()
                    a[3] = max(a[3], e.max(initial=0))
    rows = []
    for t in tensors:
        _, fmax, eq, off, n = acc[t.name]
        fsum = fsums[t.name]
        has_float = floats is not None and floats.has(t.float_name)
        exactly = t.name in exact_names
        rows.append(Layer(t.name, t.op, float(t.scale.max()), int(n), float(fsum / int(n)) if has_float and n else None,
                          float(fmax) if has_float else None, float(eq / n) if exactly and n else None,
                          int(off) if exactly else None))
    return LayerReport(rows, len(samples), float_model is not None, note)


def exact_sum(values: np.ndarray) -> Fraction:
    """The exact sum of finite float64 ``values`` (the mean is then the exactly rounded one, whatever the order of
    the samples): each value is m 2^e with the integer |m| < 2^53 (frexp); the m of each exponent are summed in two
    26-bit halves, each sum exact in float64 for up to 2^25 values at once."""
    v = np.asarray(values, np.float64).reshape(-1)
    total = Fraction(0)
    for k in range(0, v.size, 1 << 25):
        m, e = np.frexp(v[k:k + (1 << 25)])
        m = (m * 2.0 ** 53).astype(np.int64)
        at = e - e.min(initial=0)
        hi = np.bincount(at, weights=(m >> 26).astype(np.float64))
        lo = np.bincount(at, weights=(m & ((1 << 26) - 1)).astype(np.float64))
        base = int(e.min(initial=0)) - 53
        for i in np.flatnonzero(hi.astype(bool) | lo.astype(bool)):
            total += Fraction(int(hi[i]) * (1 << 26) + int(lo[i])) * Fraction(2) ** (base + int(i))
    return total


def _onnx_shape(declared: tuple[int, ...] | None, cvm: tuple[int, ...]) -> tuple[int, ...]:
    """A tensor's ONNX shape: as declared where that holds its CVM value's elements, else its CVM shape."""
    return declared if declared and 0 not in declared and math.prod(declared) == math.prod(cvm) else tuple(cvm)


def _no_exact(e: Exception) -> str:
    return (f"the exact arithmetic was not computed: onnx's reference evaluator cannot run the pieces "
            f"({type(e).__name__}: {e})")


def check_float_model(model: onnx.ModelProto, name: str, sample: np.ndarray, where: str) -> None:
    """Refuse a float model that does not take the quantized model's input ``name`` (a sample of several inputs:
    theirs, ``feed``) or cannot run on ``sample`` (onnxruntime), naming the file, before anything is measured or
    written."""
    import onnxruntime as ort

    inits = {t.name for t in model.graph.initializer}
    inputs = [v.name for v in model.graph.input if v.name not in inits]
    one = feed(name, sample, np.shape(sample))
    if inputs != list(one):
        raise UnsupportedError(f"the float model takes {', '.join(inputs) or 'no input'}, not the quantized "
                               f"model's input{'s' * (len(one) > 1)} {', '.join(map(repr, one))}", where=where)
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, one)
    except Exception as e:  # noqa: BLE001  (onnxruntime raises several types)
        raise RuntimeFailure(f"the float model does not run on the first sample: {type(e).__name__}: {e}",
                             where=where) from None


class _Floats:
    """The float model's tensors by name on samples: onnxruntime.quantization.qdq_loss_debug's augmented model
    (every float tensor an output, flattened) run by ``collect_activations``; a name it does not give, or gives of
    another size than the quantized tensor's, is dropped (``has``)."""

    def __init__(self, model: onnx.ModelProto, names: list[str]):
        from onnxruntime.quantization.qdq_loss_debug import modify_model_output_intermediate_tensors

        self.input = model.graph.input[0].name
        self.names = set(names)
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = Path(tmp) / "float.onnx", Path(tmp) / "augmented.onnx"
            onnx.save(model, src)
            modify_model_output_intermediate_tensors(src, dst)
            self.augmented = dst.read_bytes()

    def has(self, name: str) -> bool:
        return name in self.names

    def drop(self, name: str) -> None:
        self.names.discard(name)

    def run(self, samples: np.ndarray) -> dict[str, list[np.ndarray]]:
        from onnxruntime.quantization.qdq_loss_debug import collect_activations

        feeds = iter([feed(self.input, x, np.shape(x)) for x in samples])

        class Reader:
            def get_next(self):
                return next(feeds, None)

            def __iter__(self):
                return iter(self.get_next, None)

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "augmented.onnx"
            path.write_bytes(self.augmented)
            try:
                got = collect_activations(str(path), Reader())
            except Exception as e:  # noqa: BLE001  (onnxruntime raises several types)
                raise RuntimeFailure(f"the float model's intermediate tensors (qdq_loss_debug): "
                                     f"{type(e).__name__}: {e}") from None
        got[self.input] = list(samples)
        self.names = {n for n in self.names if n in got}
        return {n: got[n] for n in self.names}


#: The columns of the report: per tensor, its name, the float ops of its piece, its (largest) scale, the values
#: compared, |CVM - float| / scale (mean, max), the share equal to the exact arithmetic, the most steps off it.
COLUMNS = ("tensor", "op", "scale", "values", "steps from float, mean", "max", "equal to exact", "max steps off exact")


def cells(r: Layer) -> list[str]:
    """A row of the report as text; "-" where a distance was not measured."""
    def opt(v, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    return [r.name, r.op, f"{r.scale:.6g}", str(r.elements), opt(r.float_mean, ".3f"), opt(r.float_max, ".2f"),
            opt(r.equal, ".2%"), opt(r.off, "d")]


def markdown(report: LayerReport) -> list[str]:
    """The report as Markdown lines: what was measured, then the table."""
    against = ("the float model's tensor of the same name and " if report.float_model else "") + \
        "the exact arithmetic of the quantized model given the same integers in"
    out = [f"Each quantized tensor the CVM model computes, on {report.samples} sample(s), in its own steps (its "
           f"scale; per channel, the largest), against {against} (a piece's DequantizeLinear, float ops and "
           "QuantizeLinear in float64, rounding half to even)." + (f" Note: {report.note}." if report.note else ""),
           "", "| " + " | ".join(COLUMNS) + " |", "|---|---|" + "---:|" * (len(COLUMNS) - 2)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in cells(r)) + " |" for r in report.layers]
    return out


def to_json(report: LayerReport) -> str:
    """The report as JSON: ``{"samples": N, "float_model": bool, "note": str or null, "layers": [{name, op, scale,
    elements, float_mean, float_max, equal, off}, ...]}``, null where a distance was not measured."""
    return json.dumps({"samples": report.samples, "float_model": report.float_model, "note": report.note,
                       "layers": [asdict(r) for r in report.layers]}, indent=1) + "\n"
