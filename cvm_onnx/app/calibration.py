"""The ranges onnxruntime.quantization's calibrators compute, computed with the weights on disk and no run's tensors
kept beyond its reduction: what quantize_static is then given as its calibration cache (``calibration_cache_path``).

quantize_static's own calibration holds the float model twice (its copy and its calibrator's) beside the session,
and its histogram calibrators every tensor of every run. Here the session runs the augmented model whose weights
stay in the prepared model's external data, and each run is reduced as it comes:
- minmax: onnxruntime's augmentation (ReduceMin and ReduceMax, keepdims, reshaped to (-1,), of every float tensor
  its op types read or write), each run's (1,) results kept, then NaN-ignoring min and max over the runs, as
  MinMaxCalibrater.compute_data does;
- entropy, percentile: onnxruntime's HistogramCollector given the histograms it would have made of all runs'
  values at once (its one ``collect`` of every run stacked): a first pass over the samples finds the range each
  histogram covers (the NaN-ignoring min and max; for the symmetric percentile, the min and max of the absolute
  values), a second sums each run's histogram over that range and bin count (np.histogram counts each value on its
  own, so the sums are the whole's counts); the collector then computes the thresholds (its own code).
The defaults are quantize_static's where ``extra_options`` sets no Calib* option (create_calibrator's).
"""
from __future__ import annotations

import itertools
import math
import os
import uuid
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .memory import release_memory

#: create_calibrator's defaults for the histogram methods: (num_bins, num_quantized_bins, percentile, symmetric).
HISTOGRAMS = {"entropy": (128, 128, 99.999, False), "percentile": (2048, 2048, 99.999, True)}
#: The lowest opset quantize_static keeps: below it, it converts the model first (update_opset_version) and
#: calibrates the converted one, which ``ranges`` does not compute.
LOWEST_OPSET = 10

Progress = Callable[[int, int | None, str], None]


def applies(model: onnx.ModelProto) -> bool:
    """Whether quantize_static calibrates ``model`` as it is (an opset it keeps), so ``ranges`` computes its
    calibrators' ranges."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return opset >= LOWEST_OPSET


def feed(name: str, sample: np.ndarray, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """One sample as onnxruntime's feed: ``{name: sample}`` reshaped to ``shape``; a sample of several inputs (a
    structured array's element, one field per input, each of its shape) as one array per field."""
    if sample.dtype.names is not None:
        return {k: np.asarray(sample[k]) for k in sample.dtype.names}
    return {name: np.asarray(sample).reshape(shape)}


def ranges(prepared: Path, name: str, samples: np.ndarray, shape: tuple[int, ...], method: str,
           progress: Progress | None = None, extra: Iterable[str] = ()):
    """The ``TensorsData`` onnxruntime's calibrator for ``method`` (minmax, entropy, percentile; quantize_static's
    defaults) computes on the model in ``prepared`` (its weights as external data beside it) fed each of
    ``samples`` (``feed``) as its input ``name``, in order, as quantize's CalibrationDataReader does; the tensors
    ``extra`` calibrated too."""
    from onnxruntime.quantization import CalibrationMethod, TensorsData

    def feeds() -> Iterator[dict[str, np.ndarray]]:
        return (feed(name, x, shape) for x in samples)

    count = len(samples)
    model = _inferred(prepared)
    tensors = sorted(_to_calibrate(model) | set(extra))
    augmented = prepared.with_name(f"{prepared.stem}-augmented.onnx")
    try:
        if method == "minmax":
            names = _add_reduce_min_max(model, tensors)
            onnx.save(model, augmented)  # the weights stay where they are: external, beside ``prepared``
            del model
            session = _session(augmented)
            release_memory()  # what the session's loading freed: the runs' tensors would stand on it
            runs: list[np.ndarray] = []  # per output, its results stacked: allocated once, so that no run's small
            for k, one in enumerate(feeds()):  # arrays stay among the next runs' tensors
                for i, v in enumerate(session.run(names, one)):
                    if not k:
                        runs.append(np.empty((count, *v.shape), v.dtype))
                    runs[i][k] = v
                if progress:
                    progress(k + 1, count, "calibrating")
            return TensorsData(CalibrationMethod.MinMax, {
                t: (np.nanmin(runs[2 * k], axis=0), np.nanmax(runs[2 * k + 1], axis=0)) for k, t in enumerate(tensors)})
        outs = {o.name for o in model.graph.output}
        infos = _value_infos(model)
        model.graph.output.extend(infos[t] for t in tensors if t not in outs)
        onnx.save(model, augmented)
        del model
        session = _session(augmented)
        release_memory()
        names = [o.name for o in session.get_outputs() if o.name in tensors]
        return _histograms(session, feeds, names, count, method, progress)
    finally:
        augmented.unlink(missing_ok=True)


#: External tensors below this size (onnx.save's threshold for external data) are read into the model: onnxruntime
#: reads a shape or axes input's values when it loads the model, and only from the model itself.
INLINE = 1024


def _inferred(prepared: Path) -> onnx.ModelProto:
    """The model as onnxruntime's calibrator loads it (onnx's shape inference of the file,
    load_model_with_shape_infer), its external tensors of ``INLINE`` bytes or more left on disk."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    inferred = prepared.with_name(f"{prepared.stem}-inferred.onnx")
    try:
        onnx.shape_inference.infer_shapes_path(os.fspath(prepared), os.fspath(inferred))
        model = onnx.load(inferred, load_external_data=False)
    finally:
        inferred.unlink(missing_ok=True)
    for t in model.graph.initializer:
        size = math.prod(t.dims) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize \
            if t.data_type != onnx.TensorProto.STRING else INLINE
        if uses_external_data(t) and size < INLINE:
            load_external_data_for_tensor(t, os.fspath(prepared.parent))
            t.ClearField("data_location")
            del t.external_data[:]
    return model


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    infos = {v.name: v for v in model.graph.value_info}
    infos.update({v.name: v for v in model.graph.output})
    infos.update({v.name: v for v in model.graph.input})
    return infos


def _to_calibrate(model: onnx.ModelProto) -> set[str]:
    """The float tensors (not initializers) read or written by the ops quantize_static quantizes
    (CalibraterBase.select_tensors_to_calibrate over the QLinear and QDQ registries' op types)."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    ops = set(QLinearOpsRegistry) | set(QDQRegistry)
    infos = _value_infos(model)
    inits = {t.name for t in model.graph.initializer}
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    return {t for n in model.graph.node if n.op_type in ops for t in itertools.chain(n.input, n.output)
            if t in infos and infos[t].type.HasField("tensor_type")
            and infos[t].type.tensor_type.elem_type in floats and t not in inits}


def _add_reduce_min_max(model: onnx.ModelProto, tensors: Iterable[str]) -> list[str]:
    """MinMaxCalibrater.augment_graph's nodes (per tensor, in order): ReduceMin and ReduceMax with keepdims, each
    reshaped to (-1,) as an output named ``<tensor>_ReduceMin`` / ``_ReduceMax``. Returns those outputs' names, in
    pairs."""
    graph = model.graph
    shape = str(uuid.uuid4())
    graph.initializer.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), shape))
    infos = _value_infos(model)
    count = len(graph.node)
    firsts: dict[str, int] = {}
    for i, n in enumerate(graph.node):
        for x in n.input:
            firsts.setdefault(x, i)
    before: dict[int, list[onnx.NodeProto]] = {}  # each tensor's nodes just before its first reader, in order
    names = []
    for t in tensors:
        for op in ("ReduceMin", "ReduceMax"):
            out = f"{t}_{op}"
            before.setdefault(firsts.get(t, count), []).extend([
                helper.make_node(op, [t], [f"{out}_Reshape"], keepdims=1, name=out),
                helper.make_node("Reshape", [f"{out}_Reshape", shape], [out], name=f"{out}_Reshape")])
            graph.output.append(helper.make_tensor_value_info(out, infos[t].type.tensor_type.elem_type, [None]))
            names.append(out)
    nodes = onnx.GraphProto()  # the nodes written anew once: an insert each moves every node after it
    for i, n in enumerate(graph.node):
        nodes.node.extend(before.get(i, []))
        nodes.node.append(n)
    nodes.node.extend(before.get(count, []))
    graph.ClearField("node")
    graph.node.extend(nodes.node)
    return names


def _session(path: Path):
    """onnxruntime's calibration session (CalibraterBase.create_inference_session): no graph optimization, CPU;
    without its arena and memory pattern (which only place the tensors, and would keep their peak); its nodes in
    onnxruntime's priority-based order, which runs minmax's ReduceMin and ReduceMax nodes as soon as it can (in the
    default order they run late, each holding its tensor until then; benchmarks/RESULTS.md has the figures). The
    order changes no value."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    return ort.InferenceSession(os.fspath(path), sess_options=options, providers=["CPUExecutionProvider"])


def _histograms(session, feeds: Callable[[], Iterator[dict[str, np.ndarray]]], names: list[str], count: int,
                method: str, progress: Progress | None):
    """HistogramCollector's result for ``names`` over the runs, its histograms summed run by run (module doc)."""
    from onnxruntime.quantization import CalibrationMethod, TensorsData
    from onnxruntime.quantization.calibrate import HistogramCollector

    bins, quantized_bins, percentile, symmetric = HISTOGRAMS[method]
    absolute = method == "percentile" and symmetric  # collect_absolute_value: a histogram of |x| over its range
    low: dict[str, list] = {t: [] for t in names}
    high: dict[str, list] = {t: [] for t in names}
    span: dict[str, list] = {t: [] for t in names}
    dtypes: dict[str, np.dtype] = {}
    for k, feed in enumerate(feeds()):  # the first pass: the ranges
        for t, v in zip(names, session.run(names, feed)):
            v = v.reshape(-1)
            dtypes[t] = v.dtype
            if v.size:
                low[t].append(np.nanmin(v))
                high[t].append(np.nanmax(v))
                if absolute:
                    a = np.absolute(v)
                    span[t].append((a.min(), a.max()))
        if progress:
            progress(k + 1, 2 * count, "calibrating")
    edges: dict[str, tuple] = {}
    extremes: dict[str, tuple] = {}
    for t in names:
        zero = np.array(0, dtype=dtypes[t])
        lo = np.nanmin(np.array(low[t])) if low[t] else zero
        hi = np.nanmax(np.array(high[t])) if high[t] else zero
        extremes[t] = (lo, hi)
        if absolute:
            edges[t] = (np.min(np.array([s[0] for s in span[t]])), np.max(np.array([s[1] for s in span[t]]))) \
                if span[t] else None
        else:
            threshold = np.array(max(abs(lo), abs(hi)), dtype=dtypes[t])
            edges[t] = (-threshold, threshold)
    counts: dict[str, np.ndarray] = {}
    made: dict[str, np.ndarray] = {}
    for k, feed in enumerate(feeds()):  # the second pass: each run's histogram over the whole's range, summed
        for t, v in zip(names, session.run(names, feed)):
            v = v.reshape(-1)
            h, e = np.histogram(np.absolute(v) if absolute else v, bins, range=edges[t])
            counts[t] = counts[t] + h if t in counts else h
            made.setdefault(t, e)
        if progress:
            progress(count + k + 1, 2 * count, "calibrating")
    collector = HistogramCollector(method=method, symmetric=symmetric, num_bins=bins,
                                   num_quantized_bins=quantized_bins, percentile=percentile, scenario="same")
    for t in names:
        lo, hi = extremes[t]
        if absolute:
            collector.histogram_dict[t] = (counts[t], made[t].astype(dtypes[t]), lo, hi)
        else:
            collector.histogram_dict[t] = (counts[t], made[t], lo, hi, edges[t][1])
    cal = CalibrationMethod.Entropy if method == "entropy" else CalibrationMethod.Percentile
    return TensorsData(cal, collector.compute_collection_result())
