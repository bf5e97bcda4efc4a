"""A float ONNX model to CVM: onnxruntime's own pre-processing and static quantizer, then the importer.

``quantize(F.onnx, C.npy, DIR)`` takes a float model as it is shipped and
1. refuses, in one line, what CVM cannot hold at all: several inputs, control flow (If, Loop, Scan), recurrent
   layers (LSTM, GRU, RNN);
2. fixes the input's dynamic dims to one sample of C.npy (batch 1), cuts the graph at ``outputs`` when given
   (like ``convert --outputs``), raises an opset below 13 to 13 with onnx.version_converter (where it can), and
   pre-processes the model as onnxruntime.quantization.shape_inference.quant_pre_process does (onnxruntime's
   basic graph optimizations: constant folding, BatchNormalization folded into the Conv before it, less the
   fusions of ``UNFUSED``; symbolic shape inference where it succeeds; onnx shape inference) and folds a
   BatchNormalization after ConvTranspose;
3. calibrates on the N samples stacked on axis 0 of C.npy (``method``: minmax, entropy or percentile) and writes
   the int8 model onnxruntime.quantization.quantize_static makes (QDQ or QOperator form, activations uint8 or
   int8, symmetric or not, weights int8 per tensor or per channel; ForceQuantizeNoInputCheck, so that a Slice or
   Reshape reading the float input quantizes it), stamped with the IR version its opsets need (not the float
   model's);
4. imports it as the CVM model DIR with its float edges (``quantization.json``), and compares the CVM model and
   onnxruntime's quantized model with the float model on the calibration samples, output by output.
No calibration code of our own, and one graph rewrite (that BatchNormalization, which onnxruntime's optimizer
leaves): the tools are onnxruntime's and onnx's. onnxruntime's own log lines (its C++ logger, its Python
loggers) are silenced meanwhile.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import sys
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import onnx

from cvm_onnx.converters.from_onnx import Imported, cut
from cvm_onnx.core.errors import FormatError, RuntimeFailure, UnsupportedError
from cvm_onnx.core.format.edges import FILE as EDGES
from cvm_onnx.core.format.model_dir import replace_files
from cvm_onnx.core.format.npy import read_npy
from cvm_onnx.core.format.onnx_file import dims as onnx_dims, ir_version, write_onnx
from cvm_onnx.runtime.bulk import run_many

from .api import convert, load_onnx

METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
Progress = Callable[[int, int, str], None]
#: The opset the model is raised to before quantization (where lower): the QDQ forms the importer reads best.
OPSET = 13
CONTROL_FLOW = ("If", "Loop", "Scan")
RECURRENT = ("LSTM", "GRU", "RNN", "DynamicQuantizeLSTM")
ORT_DEFAULT_SEVERITY = 2  # onnxruntime's default logger: warnings and above
#: onnxruntime fusions left out of the pre-processing: they make ops CVM lacks out of ops it has (YOLOX's
#: Slice x4 + Concat "Focus" becomes SpaceToDepth + Gather, and the float input is then read by no QuantizeLinear).
UNFUSED = ("SliceConcatToSpaceToDepthFusion",)
#: The opset of ONNX's LayerNormalization: a model holding written-out ones (``layernorms``) is raised to it.
LAYERNORM_OPSET = 17
INTEGER_TYPES = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16,
                 onnx.TensorProto.INT32, onnx.TensorProto.UINT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT64,
                 onnx.TensorProto.BOOL)


@dataclass(frozen=True)
class Agreement:
    """One output against the float model on the calibration samples: |CVM - float| and |onnxruntime's quantized
    model - float| in output steps (mean, max, share within one step); top-1 agreement (argmax over the classes)
    only for a classifier-shaped output, (1, C) or (C,) per sample with C > 1, where it means something."""

    name: str
    top1: float | None
    mean_steps: float
    max_steps: float
    within_one_step: float
    ort_top1: float | None = None
    ort_mean_steps: float | None = None
    ort_max_steps: float | None = None

    def line(self) -> str:
        top = "" if self.top1 is None else f"top-1 agreement {self.top1:.2%}, "
        text = (f"{self.name}: {top}|CVM - float| mean {self.mean_steps:.2f}, max {self.max_steps:.1f} output "
                f"steps; {self.within_one_step:.2%} of elements within one step")
        if self.ort_mean_steps is not None:
            ort_top = "" if self.ort_top1 is None else f"top-1 {self.ort_top1:.2%}, "
            text += (f" (onnxruntime's quantized model: {ort_top}mean {self.ort_mean_steps:.2f}, max "
                     f"{self.ort_max_steps:.1f})")
        return text


@dataclass(frozen=True)
class Quantized:
    """What ``quantize`` made: the import (graph, edges, requantizations), the agreement per output on the
    calibration samples, the float model as compared (input dims fixed, cut) and the quantized ONNX model."""

    imported: Imported
    agreements: list[Agreement]
    samples: int
    float_model: onnx.ModelProto
    onnx_model: bytes


class _Reader:
    """onnxruntime.quantization's CalibrationDataReader over the samples, one feed per sample, counting them."""

    def __init__(self, name: str, samples: np.ndarray, shape: tuple[int, ...], progress: Progress | None):
        self.name, self.samples, self.shape, self.progress = name, samples, shape, progress
        self.i = 0

    def get_next(self):
        if self.i >= len(self.samples):
            return None
        feed = {self.name: np.asarray(self.samples[self.i], np.float32).reshape(self.shape)}
        self.i += 1
        if self.progress:
            self.progress(self.i, len(self.samples), "calibrating")
        return feed

    def rewind(self):
        self.i = 0


@contextlib.contextmanager
def quiet_onnxruntime() -> Iterator[None]:
    """onnxruntime's own log lines off for the duration (its default C++ logger at severity error, Python logging
    up to error: failures are raised as ours; what onnxruntime.quantization prints, "Collecting tensor data and
    making histogram ...", to sys.stdout and to file descriptor 1 alike); its default severity (warning), logging and
    stdout are restored after."""
    import onnxruntime as ort

    quiet = logging.root.manager.disable
    logging.disable(logging.ERROR)
    ort.set_default_logger_severity(3)
    try:
        with silenced_stdout(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy's overflow warnings inside the calibrators
            yield
    finally:
        ort.set_default_logger_severity(ORT_DEFAULT_SEVERITY)
        logging.disable(quiet)


@contextlib.contextmanager
def silenced_stdout() -> Iterator[None]:
    """sys.stdout and file descriptor 1 (C++ and tqdm writes) to the null device for the duration."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1 (a daemon): only sys.stdout
        with contextlib.redirect_stdout(io.StringIO()):
            yield
        return
    try:
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(io.StringIO()):
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node, those of subgraphs (If branches, Loop bodies) too."""
    for n in graph.node:
        yield n
        for a in n.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                yield from _nodes(g)


def _inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in inits]


def refusal(model: onnx.ModelProto) -> str | None:
    """Why the float model as a whole has no CVM form (several inputs, control flow, recurrent layers), as one
    sentence; None if nothing of the kind."""
    why = []
    inputs = _inputs(model)
    if len(inputs) != 1:
        why.append(f"{len(inputs)} inputs ({', '.join(v.name for v in inputs) or 'none'}): a CVM model takes one")
    ops = Counter(n.op_type for n in _nodes(model.graph))
    for kind, names in (("control flow", CONTROL_FLOW), ("recurrent layers", RECURRENT)):
        if found := [f"{op} x{ops[op]}" for op in names if ops[op]]:
            why.append(f"{kind} ({', '.join(found)}): CVM has none")
    return "; ".join(why) or None


def _sample_shape(model: onnx.ModelProto, data: np.ndarray, where: str) -> tuple[str, tuple[int, ...]]:
    """The input's name and its shape for one calibration sample: its static dims, its dynamic ones taken from the
    samples, (N, *shape) or (N, *shape[1:]) where the first dim is 1 or dynamic (the batch, then 1)."""
    v = _inputs(model)[0]
    dims = [d or None for d in onnx_dims(v) or ()]
    one = tuple(data.shape[1:])
    shape = one if len(one) == len(dims) else (1,) + one if len(one) + 1 == len(dims) else None
    if shape is None or (dims[0] is None and shape[0] != 1) or any(d not in (None, s) for d, s in zip(dims, shape)):
        rest = "".join(f", {'?' if d is None else d}" for d in dims[1:])
        raise FormatError(f"calibration samples must be floats of shape (N{rest}) or (N, 1{rest}) (N >= 1, batch 1)"
                          f", got {data.dtype} {data.shape}", where=where)
    return v.name, shape


#: Values a calibration set may hold (as float32: 4 GiB).
MAX_SAMPLES = 1 << 30


def _calibration(path: str | os.PathLike) -> np.ndarray:
    """The calibration samples as float32, checked before they are read: the header's dtype (float16, 32 or 64) and
    shape (N >= 1 samples on axis 0, at most MAX_SAMPLES values, as many as the file holds: it is memory-mapped),
    then every value finite and within float32."""
    where = os.fspath(path)
    data = read_npy(path, "the calibration samples", mmap=True)
    if data.dtype.kind != "f" or data.dtype.itemsize > 8 or data.ndim < 1 or len(data) == 0:
        raise FormatError(f"calibration samples must be floats (float16, float32 or float64), N >= 1 of them stacked "
                          f"on axis 0, got {data.dtype} {data.shape}", where=where)
    if data.size > MAX_SAMPLES:
        raise FormatError(f"calibration samples of shape {data.shape} hold {data.size} values (at most 2^30)",
                          where=where)
    with np.errstate(over="ignore", invalid="ignore"):
        samples = np.asarray(data, np.float32)
    bad = ~np.isfinite(samples)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        value = data[at]
        why = "beyond float32" if np.isfinite(value) else str(value)
        raise FormatError(f"calibration sample {at[0]} holds {why} at {at[1:]} ({int(bad.sum())} value(s) not "
                          "finite in float32): calibration samples must be finite", where=where)
    return samples


def fixed(model: onnx.ModelProto, shape: tuple[int, ...]) -> onnx.ModelProto:
    """``model`` with its input's dims set to ``shape`` (dynamic dims fixed)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    v = _inputs(out)[0]
    for d, n in zip(v.type.tensor_type.shape.dim, shape):
        d.Clear()
        d.dim_value = n
    return out


def prepare(model: onnx.ModelProto, path: Path) -> None:
    """Write to ``path`` the float model as quantize_static takes it: its opset raised to 13 where lower and
    onnx.version_converter can; optimized by onnxruntime at its basic level as quant_pre_process does (constant
    folding, BatchNormalization into Conv), less the fusions of ``UNFUSED``; then quant_pre_process's shape
    inference (symbolic where it succeeds, else onnx's alone); a BatchNormalization after ConvTranspose folded."""
    import onnxruntime as ort
    from onnx import version_converter
    from onnxruntime.quantization.shape_inference import quant_pre_process

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), OPSET)
    want = LAYERNORM_OPSET if layernorms(model.graph) else OPSET
    if opset < want:
        try:
            model = version_converter.convert_version(model, want)
        except Exception:  # noqa: BLE001  (the converter raises anything; the model then stays at its opset)
            pass
    fuse_layernorm(model)
    source, optimized = path.with_suffix(".source.onnx"), path.with_suffix(".optimized.onnx")
    onnx.save(model, source)
    try:  # quant_pre_process's optimization step, less the fusions into ops CVM lacks
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = os.fspath(optimized)
        ort.InferenceSession(os.fspath(source), options, providers=["CPUExecutionProvider"],
                             disabled_optimizers=list(UNFUSED))
    except Exception as e:  # noqa: BLE001  (onnxruntime raises several types)
        raise RuntimeFailure(f"onnxruntime cannot load the float model to optimize it: {type(e).__name__}: {e}")
    failure = None
    for symbolic in (True, False):  # onnxruntime's symbolic shape inference asserts on some graphs
        try:
            quant_pre_process(optimized, path, skip_optimization=True, skip_symbolic_shape=not symbolic)
            break
        except Exception as e:  # noqa: BLE001  (onnxruntime's tools raise anything)
            failure = e
    else:
        raise RuntimeFailure(f"onnxruntime.quantization's pre-processing (quant_pre_process) failed: "
                             f"{type(failure).__name__}: {failure}")
    out = onnx.load(path)  # onnxruntime's optimizer imports every domain it knows (custom ones too): keep the used
    used = {n.domain for n in _nodes(out.graph)} | {"", "ai.onnx"}
    kept = [o for o in out.opset_import if o.domain in used]
    del out.opset_import[:]
    out.opset_import.extend(kept)
    fold_batchnorm(out.graph)
    onnx.save(out, path)


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """The float values of the graph's initializers and Constant nodes (value attribute), by name."""
    from onnx import numpy_helper

    out = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def layernorms(graph: onnx.GraphProto) -> list[tuple[list[onnx.NodeProto], str, int, float, np.ndarray | None,
                                                      np.ndarray | None]]:
    """The LayerNormalizations written out as ops (Paddle's and PyTorch's older exports): ReduceMean(x) over the
    last k axes, d = x - mean, ReduceMean(Pow(d, 2)) over the same axes, + epsilon, Sqrt, d / that, then
    optionally * gamma and + beta (constants); every intermediate read only inside the pattern. Each as (its
    nodes, x, axis -k, epsilon, gamma, beta)."""
    consts = _constants(graph)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for x in n.input:
            readers.setdefault(x, []).append(n)
    for o in graph.output:
        readers.setdefault(o.name, []).append(None)

    def only(name: str, op: str) -> onnx.NodeProto | None:
        r = readers.get(name, [])
        return r[0] if len(r) == 1 and r[0] is not None and r[0].op_type == op else None

    def other(n: onnx.NodeProto, name: str) -> np.ndarray | None:
        rest = [x for x in n.input if x != name]
        v = consts.get(rest[0]) if len(rest) == 1 and len(n.input) == 2 else None
        return v if v is not None and v.dtype.kind == "f" else None

    def axes(n: onnx.NodeProto) -> tuple[int, ...] | None:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        if attrs.get("keepdims", 1) != 1 or len(n.input) != 1 or "axes" not in attrs:
            return None
        k = sorted(attrs["axes"])
        return tuple(k) if k and all(a < 0 for a in k) and k == list(range(-len(k), 0)) else None

    found = []
    for mean in graph.node:
        if mean.op_type != "ReduceMean" or (ax := axes(mean)) is None:
            continue
        x = mean.input[0]
        sub = only(mean.output[0], "Sub")
        if sub is None or list(sub.input) != [x, mean.output[0]]:
            continue
        d = sub.output[0]
        users = readers.get(d, [])
        if len(users) != 2 or None in users or sorted(u.op_type for u in users) != ["Div", "Pow"]:
            continue
        pw, div = sorted(users, key=lambda u: u.op_type, reverse=True)
        two = consts.get(pw.input[1]) if list(pw.input)[:1] == [d] else None
        if two is None or two.size != 1 or float(two.reshape(())) != 2.0 or list(div.input) != [d, div.input[1]]:
            continue
        var = only(pw.output[0], "ReduceMean")
        add = only(var.output[0], "Add") if var is not None and axes(var) == ax else None
        eps = other(add, var.output[0]) if add is not None else None
        sqrt = only(add.output[0], "Sqrt") if eps is not None and eps.size == 1 else None
        if sqrt is None or only(sqrt.output[0], "Div") is not div or div.input[1] != sqrt.output[0]:
            continue
        nodes, last, gamma, beta = [mean, sub, pw, var, add, sqrt, div], div, None, None
        if (mul := only(last.output[0], "Mul")) is not None and (gamma := other(mul, last.output[0])) is not None:
            nodes.append(mul)
            last = mul
            if (plus := only(last.output[0], "Add")) is not None and \
                    (beta := other(plus, last.output[0])) is not None:
                nodes.append(plus)
        found.append((nodes, x, -len(ax), float(eps.reshape(())), gamma, beta))
    return found


def fuse_layernorm(model: onnx.ModelProto) -> None:
    """Each written-out LayerNormalization (``layernorms``) as one LayerNormalization node (opset 17), which
    quantize_static quantizes as one op and the importer holds in integers (docs/import.md); gamma and beta
    broadcast to the normalized shape. Nothing changes below opset 17 or where the normalized shape is unknown."""
    from onnx import numpy_helper, shape_inference

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    found = layernorms(model.graph) if opset >= LAYERNORM_OPSET else []
    if not found:
        return
    known = [*shape_inference.infer_shapes(model).graph.value_info, *model.graph.input]
    shapes = {v.name: [d or 0 for d in onnx_dims(v) or ()] for v in known}
    for nodes, x, axis, eps, gamma, beta in found:
        shape = shapes.get(x)
        if not shape or len(shape) < -axis or not all(shape[axis:]):
            continue
        norm = tuple(shape[axis:])
        last = nodes[-1].output[0]
        names = [f"{last}:ln_scale", f"{last}:ln_bias"]
        g = np.broadcast_to(np.ones(1, np.float32) if gamma is None else gamma.astype(np.float32), norm)
        b = np.broadcast_to(np.zeros(1, np.float32) if beta is None else beta.astype(np.float32), norm)
        model.graph.initializer.extend([numpy_helper.from_array(np.ascontiguousarray(g), names[0]),
                                        numpy_helper.from_array(np.ascontiguousarray(b), names[1])])
        at = list(model.graph.node).index(nodes[-1])
        model.graph.node.insert(at, onnx.helper.make_node("LayerNormalization", [x, *names], [last],
                                                          name=f"{last}:LayerNormalization", axis=axis,
                                                          epsilon=eps))
        for n in nodes:
            model.graph.node.remove(n)


def fold_batchnorm(graph: onnx.GraphProto) -> None:
    """Fold each BatchNormalization (inference form, constant parameters) that follows a ConvTranspose with
    constant weights, directly or through an Add of a per-channel constant (its bias, as Paddle writes it), and
    is the only reader of its input: onnxruntime's optimizer folds it into a Conv only. With a = scale /
    sqrt(var + epsilon) per output channel (in float32, as onnxruntime's Conv fusion computes it), the weights
    become W * a along the output channels and the bias (bias - mean) * a + B."""
    from onnx import numpy_helper

    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    readers = Counter(x for n in graph.node for x in n.input)
    readers.update(o.name for o in graph.output)

    def value(name: str) -> np.ndarray | None:
        return numpy_helper.to_array(inits[name]).astype(np.float32) if name in inits else None

    for bn in [n for n in graph.node if n.op_type == "BatchNormalization" and len(n.output) == 1]:
        params = [value(x) for x in bn.input[1:5]]
        up, add, bias = producer.get(bn.input[0]), None, np.zeros(1, np.float32)
        if up is not None and up.op_type == "Add" and readers[up.output[0]] == 1:
            k = next((k for k in (0, 1) if value(up.input[k]) is not None), None)
            add, bias = up, value(up.input[k]).reshape(-1) if k is not None else None
            up = producer.get(up.input[1 - k]) if k is not None else None
        if up is None or up.op_type != "ConvTranspose" or readers[up.output[0]] != 1 or \
                any(p is None for p in params) or value(up.input[1]) is None or \
                (len(up.input) > 2 and up.input[2] and value(up.input[2]) is None):
            continue
        w = value(up.input[1])
        group = next((a.i for a in up.attribute if a.name == "group"), 1)
        c = w.shape[1] * group
        if bias.size not in (1, c) or any(p.size != c for p in params):
            continue
        if len(up.input) > 2 and up.input[2]:
            bias = bias + value(up.input[2]).reshape(c)
        scale, beta, mean, var = (p.reshape(c) for p in params)
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        a = (scale / np.sqrt(var + np.float32(eps))).astype(np.float32)
        w2 = w.reshape((group, -1, w.shape[1]) + w.shape[2:]) * a.reshape(group, 1, -1, *[1] * (w.ndim - 2))
        b2 = (np.broadcast_to(bias, (c,)) - mean) * a + beta
        names = (f"{up.output[0]}:folded_w", f"{up.output[0]}:folded_b")
        graph.initializer.extend([numpy_helper.from_array(w2.reshape(w.shape).astype(np.float32), names[0]),
                                  numpy_helper.from_array(b2.astype(np.float32), names[1])])
        old = [*up.input[1:], *bn.input[1:], *(add.input if add is not None else [])]
        del up.input[1:]
        up.input.extend(names)
        up.output[0] = bn.output[0]
        graph.node.remove(bn)
        if add is not None:
            graph.node.remove(add)
        readers.subtract(old)
        for name in old:
            if name in inits and readers[name] <= 0:
                graph.initializer.remove(inits.pop(name))


def quantize(src: str | os.PathLike, calibration: str | os.PathLike, dst: str | os.PathLike,
             per_channel: bool = False, symmetric: bool = False, method: str = "minmax",
             activation: str = "uint8", form: str = "qdq", save_onnx: str | os.PathLike | None = None,
             progress: Progress | None = None, outputs: list[str] | None = None,
             two_part: bool = False) -> Quantized:
    """Pre-process the float model ``src``, quantize it with onnxruntime.quantization.quantize_static calibrated
    on ``calibration`` (N samples on axis 0), import it as the CVM model ``dst`` (with ``quantization.json``),
    and compare it with the float model on those samples. ``outputs``: cut the float model at these tensors
    first. ``save_onnx``: also keep the quantized ONNX model there. ``two_part``: as ``import_model``'s."""
    if method not in METHODS:
        raise UnsupportedError(f"calibration method {method!r}: one of {', '.join(METHODS)}")
    model = load_onnx(src, external_data=True)
    if (why := refusal(model)) is not None:
        raise UnsupportedError(f"the model has no CVM form: {why}", where=os.fspath(src))
    if (why := not_float(model)) is not None:
        raise UnsupportedError(why, where=os.fspath(src))
    if (why := non_finite(model)) is not None:
        raise UnsupportedError(why, where=os.fspath(src))
    data = _calibration(calibration)
    name, shape = _sample_shape(model, data, os.fspath(calibration))
    samples = data.reshape((len(data),) + shape)
    with staged(dst) as stage, quiet_onnxruntime():
        model = fixed(model, shape)
        if outputs:
            model = cut(model, outputs)
        with tempfile.TemporaryDirectory() as tmp:
            prepared = Path(tmp) / "prepared.onnx"
            prepare(model, prepared)
            out = Path(tmp) / "quantized.onnx"
            try:
                _quantize_static(prepared, out, _Reader(name, samples, shape, progress), per_channel, symmetric,
                                 method, activation, form, src)
            except RuntimeFailure:
                if (k := overflowing(prepared, name, samples)) is not None:
                    raise RuntimeFailure(f"the float model computes inf or NaN on calibration sample {k} (its "
                                         "activations pass float32's range): onnxruntime.quantization needs finite "
                                         "ranges; give samples as the model expects them",
                                         where=os.fspath(calibration)) from None
                raise
            _stamp(out)
            imported = convert(out, stage, two_part=two_part)
            quantized = out.read_bytes()
        agreements = compare(model, quantized, imported, samples, progress)
        if save_onnx is not None:
            write_bytes(Path(save_onnx), quantized)
    return Quantized(imported, agreements, len(samples), model, quantized)


def overflowing(model: Path, name: str, samples: np.ndarray) -> int | None:
    """The first calibration sample on which the float ``model`` computes a non-finite output, or None (also when
    onnxruntime cannot run it: the quantizer's own failure is then the one reported)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outs = _run_onnx(model.read_bytes(), name, samples)
    except Exception:  # noqa: BLE001  (onnxruntime raises several types)
        return None
    bad = [np.flatnonzero(~np.isfinite(o.reshape(len(o), -1)).all(axis=1)) for o in outs
           if o.dtype.kind == "f"]
    first = [int(b[0]) for b in bad if b.size]
    return min(first) if first else None


def not_float(model: onnx.ModelProto) -> str | None:
    """Why the model's input is not the float32 that quantize_static calibrates (an integer model is imported by
    convert as it is), or None."""
    t = _inputs(model)[0].type.tensor_type.elem_type
    if t == onnx.TensorProto.FLOAT:
        return None
    name = onnx.TensorProto.DataType.Name(t).lower() if t in onnx.TensorProto.DataType.values() else str(t)
    if t in INTEGER_TYPES:
        return f"this model takes {name}: it is already integer (import it with cvm-onnx convert)"
    return f"this model takes {name}: quantize calibrates float32 models"


def non_finite(model: onnx.ModelProto) -> str | None:
    """The first float initializer holding NaN or infinity (onnxruntime.quantization fails on it, "scale issue"),
    as a sentence naming it, or None."""
    from onnx import numpy_helper

    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)
    for t in model.graph.initializer:
        if t.data_type in floats:
            v = numpy_helper.to_array(t)
            if not np.isfinite(v).all():
                at = tuple(int(i) for i in np.argwhere(~np.isfinite(v))[0])
                return (f"the initializer {t.name!r} holds {v[at]} at {at}: onnxruntime.quantization computes scales "
                        "from finite weights only")
    return None


@contextlib.contextmanager
def staged(dst: str | os.PathLike) -> Iterator[Path]:
    """A temporary sibling directory of ``dst`` to write the model into; renamed to ``dst`` (or its files moved
    into an existing ``dst``) only when the block succeeds, removed otherwise, with any parent it created."""
    dst = Path(dst)
    made = next((p for p in reversed([dst.parent, *dst.parent.parents]) if not p.exists()), None)
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent))
    except OSError as e:
        raise FormatError(f"cannot write the model: {e.strerror or e}", str(dst)) from None
    try:
        yield stage
        try:
            if not dst.exists():
                os.rename(stage, dst)
            else:
                replace_files({dst / p.name: p.read_bytes() for p in stage.iterdir()})
                if not (stage / EDGES).exists():
                    (dst / EDGES).unlink(missing_ok=True)
        except OSError as e:
            raise FormatError(f"cannot write the model: {e.strerror or e}", str(dst)) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if made is not None and not dst.exists():
            shutil.rmtree(made, ignore_errors=True)


def write_bytes(path: Path, data: bytes) -> None:
    try:
        replace_files({path: data})
    except OSError as e:
        raise FormatError(f"cannot write the quantized ONNX model: {e.strerror or e}", str(path)) from None


def outputs(model: onnx.ModelProto, quantized: bytes, imported: Imported, samples: np.ndarray,
            progress: Progress | None = None) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """The outputs of the float ``model``, of onnxruntime's ``quantized`` model and of the CVM model ``imported``
    on ``samples`` (N samples of the input's shape, batch 1), each stacked as the float model's."""
    name = _inputs(model)[0].name
    with quiet_onnxruntime():
        want = _run_onnx(model.SerializeToString(), name, samples)
        ort = _run_onnx(quantized, name, samples)
    got = run_many(imported.graph, samples.astype(np.float32), edges=imported.edges, progress=progress).arrays
    return want, [q.reshape(w.shape) for q, w in zip(ort, want)], [g.reshape(w.shape) for g, w in zip(got, want)]


def _stamp(path: Path) -> None:
    """The quantized model at ``path`` with the IR version its opsets need (``onnx_file.ir_version``): the
    quantizer keeps the float model's, which may be the newest of the onnx that wrote it (onnx 1.23's 14, which
    onnxruntime 1.31 cannot load)."""
    model = onnx.load(path, load_external_data=False)
    if model.ir_version != (ir := ir_version(model.opset_import)):
        model.ir_version = ir
        write_onnx(model, path)


def compare(model: onnx.ModelProto, quantized: bytes, imported: Imported, samples: np.ndarray,
            progress: Progress | None = None) -> list[Agreement]:
    """Each output of the CVM model ``imported`` and of onnxruntime's quantized model against the float
    ``model`` on ``samples`` (N samples of the input's shape, batch 1)."""
    want, ort, got = outputs(model, quantized, imported, samples, progress)
    return [agreement(o.name, g, w, q, e) for o, g, w, q, e in
            zip(model.graph.output, got, want, ort, imported.edges.outputs if imported.edges else [])]


def _quantize_static(src: Path, out: Path, reader: _Reader, per_channel: bool, symmetric: bool, method: str,
                     activation: str, form: str, where) -> None:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    try:
        quantize_static(
            os.fspath(src), os.fspath(out), reader,
            quant_format=QuantFormat.QOperator if form == "qoperator" else QuantFormat.QDQ,
            activation_type=QuantType.QInt8 if activation == "int8" else QuantType.QUInt8,
            weight_type=QuantType.QInt8, per_channel=per_channel,
            calibrate_method=getattr(CalibrationMethod, METHODS[method]),
            extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True,
                           "ForceQuantizeNoInputCheck": True})
    except Exception as e:  # noqa: BLE001  (onnxruntime.quantization raises anything)
        raise RuntimeFailure(f"onnxruntime.quantization.quantize_static failed: {type(e).__name__}: {e}",
                             where=os.fspath(where)) from None


def _run_onnx(model: bytes, name: str, samples: np.ndarray) -> list[np.ndarray]:
    """Every output of an ONNX model on each sample, stacked (onnxruntime with exact int8 products:
    session.x64quantprecision, docs/import.md)."""
    from onnxruntime import InferenceSession, SessionOptions

    so = SessionOptions()
    so.add_session_config_entry("session.x64quantprecision", "1")
    sess = InferenceSession(model, so, providers=["CPUExecutionProvider"])
    runs = [sess.run(None, {name: x}) for x in samples]
    return [np.stack([r[k] for r in runs]) for k in range(len(sess.get_outputs()))]


def _classifier(shape: tuple[int, ...]) -> bool:
    """Whether outputs of ``shape`` (N samples stacked) are class scores: (N, C) or (N, 1, C), C > 1."""
    return len(shape) in (2, 3) and shape[-1] > 1 and (len(shape) == 2 or shape[1] == 1)


def agreement(name: str, got: np.ndarray, want: np.ndarray, ort: np.ndarray, edge) -> Agreement:
    """The ``Agreement`` of the CVM outputs ``got`` and onnxruntime's ``ort`` with the float ``want``, in steps of
    the output's ``edge`` (its largest scale; 1 for integers)."""
    want = want.astype(np.float64)
    step = float(np.max(edge.scale)) if edge is not None else 1.0
    classes = _classifier(want.shape)

    def steps(y: np.ndarray) -> tuple[np.ndarray, float | None]:
        y = y.reshape(want.shape).astype(np.float64)
        top1 = float((y.reshape(len(y), -1).argmax(-1) == want.reshape(len(want), -1).argmax(-1)).mean()) \
            if classes else None
        return np.abs(y - want) / step, top1

    diff, top1 = steps(got)
    ort_diff, ort_top1 = steps(ort)
    return Agreement(name, top1, float(diff.mean()), float(diff.max()), float((diff <= 1).mean()),
                     ort_top1, float(ort_diff.mean()), float(ort_diff.max()))
