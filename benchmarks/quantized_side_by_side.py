"""A quantized model side by side: cvm-onnx's exact serving form against onnxruntime's and OpenVINO's int8.

A float ResNet-20-shaped network (CIFAR layout: a 3x3 stem, three stages of three basic blocks with 16/32/64
channels, 1x1 projections where a stage halves the size, global average pooling, a 64 -> 10 Gemm; random He
weights in numpy, batch norms folded into the convolutions' biases) is written as float ONNX, then quantized
the same way twice from the same calibration samples:

* by ``cvm-onnx quantize`` (``cvm_onnx.app.quantize.quantize``: quantize_static in the QDQ form, imported into CVM
  with ``--one-part`` products; the same QDQ model also imported by default, products in two or three parts where closer), each
  exported as the serving form
  (``to_onnx(..., Target(), float_io=True)``, integer products) and run with ``cvm_onnx.runtime.sessions.session``,
  float32 in and out as the other forms: the model's edges in the graph (its input quantized, its output
  dequantized by onnxruntime's QuantizeLinear and DequantizeLinear, the same integers as the edges in numpy);
* by onnxruntime's quantize_static alone, in the QDQ and QOperator forms, run by a default onnxruntime session
  (its own int8 kernels: QLinearConv, MatMulInteger, ...);
* the same QDQ model read by OpenVINO (an optional benchmark dependency, the extra ``bench``: without it its rows
  are left out, and the script says so), compiled for its CPU plugin twice: with the plugin's default inference
  precision hint (bf16 on a CPU with bf16) and with ``INFERENCE_PRECISION_HINT`` f32. It runs the layers it
  matches as quantized in int8 and the others in the precision it picks for the CPU (printed under the table,
  per layer kind), so its results depend on the CPU.

Each result is compared with an exact oracle of the quantized model (docs/import.md: the QDQ graph's real
arithmetic, here in numpy: integer accumulation exact in float64, the scales applied in float64, QuantizeLinear
rounding half to even), in output steps (|y - oracle| / the output's scale): the share of elements exactly
equal and the largest difference, at batch 1 and at batch 64. Latencies: best of five medians, batch 1 (one
thread) and batch 64 (every usable CPU), every session created once; the forms alternate in ``--rounds``
rounds and each cell gives the lowest and highest round. For the CVM forms, the CVM op nodes and the gas
(``cvm_onnx.core.gas``, the runtime's GetOps). One table, printed and with ``--markdown FILE`` also written there.

Run: python benchmarks/quantized_side_by_side.py [--calibration N] [--runs N] [--rounds N] [--activation uint8|int8]
     [--per-tensor] [--markdown FILE]
"""
from __future__ import annotations

import argparse
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.app.api import convert, load
from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.format import read_edges
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.native import cpu
from cvm_onnx.runtime.sessions import session, usable_cpus
from cvm_onnx.serving.target import Target

from bench import machine, median_ms  # benchmarks/ is the script's folder on sys.path


# -- the float network ------------------------------------------------------------------------------------------
def resnet20(rng: np.random.Generator) -> onnx.ModelProto:
    """The float ResNet-20-shaped network, input (N, 3, 32, 32) with a symbolic batch N."""
    nodes, inits = [], []

    def conv(x: str, c_in: int, c_out: int, k: int, stride: int, name: str) -> str:
        w = rng.normal(size=(c_out, c_in, k, k)) * np.sqrt(2 / (c_in * k * k))
        inits.extend([nh.from_array(w.astype(np.float32), f"{name}_w"),
                      nh.from_array((rng.normal(size=c_out) * 0.1).astype(np.float32), f"{name}_b")])
        nodes.append(h.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], pads=[k // 2] * 4,
                                 strides=[stride, stride]))
        return name

    def relu(x: str) -> str:
        nodes.append(h.make_node("Relu", [x], [f"{x}_relu"]))
        return f"{x}_relu"

    x, c = relu(conv("x", 3, 16, 3, 1, "stem")), 16
    for stage, width in enumerate((16, 32, 64)):
        for block in range(3):
            stride = 2 if stage and not block else 1
            name = f"s{stage}b{block}"
            y = conv(relu(conv(x, c, width, 3, stride, f"{name}c1")), width, width, 3, 1, f"{name}c2")
            short = conv(x, c, width, 1, stride, f"{name}p") if stride > 1 or c != width else x
            nodes.append(h.make_node("Add", [y, short], [f"{name}_sum"]))
            x, c = relu(f"{name}_sum"), width
    nodes.append(h.make_node("GlobalAveragePool", [x], ["pool"]))
    nodes.append(h.make_node("Flatten", ["pool"], ["flat"]))
    inits.extend([nh.from_array((rng.normal(size=(64, 10)) / 8).astype(np.float32), "fc_w"),
                  nh.from_array(np.zeros(10, np.float32), "fc_b")])
    nodes.append(h.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"]))
    graph = h.make_graph(nodes, "resnet20_float", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 32, 32])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 10])], inits)
    return onnx_model(graph, opset=17)


def any_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the batch dimension of its input and output symbolic (value_info dropped)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vi in [*out.graph.input, *out.graph.output]:
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    del out.graph.value_info[:]
    return out


# -- the oracle -------------------------------------------------------------------------------------------------
def _attr(node: onnx.NodeProto, name: str, default):
    a = next((a for a in node.attribute if a.name == name), None)
    return default if a is None else onnx.helper.get_attribute_value(a)


def _per_axis(scale: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """A per-tensor scale as is; a per-axis one shaped to broadcast along ``axis``."""
    if scale.ndim == 0 or scale.size == 1:
        return scale.reshape(())
    shape = [1] * ndim
    shape[axis] = scale.size
    return scale.reshape(shape)


def _windows(x: np.ndarray, k: int, stride: int, pad: int) -> np.ndarray:
    """(N, C, H, W) -> (N, OH, OW, C * k * k) float64 windows (im2col)."""
    n, c, hh, ww = x.shape
    xp = np.pad(x, [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    oh, ow = (hh + 2 * pad - k) // stride + 1, (ww + 2 * pad - k) // stride + 1
    cols = np.stack([xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride] for i in range(k) for j in range(k)],
                    axis=2)  # (N, C, k*k, OH, OW)
    return cols.reshape(n, c * k * k, oh, ow).transpose(0, 2, 3, 1)


def oracle(qdq: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The QDQ model's real arithmetic on ``x``: every DequantizeLinear output kept as its integers (q - z) and
    scale, so Conv and Gemm accumulate integers (exact in float64: |sums| < 2^53) and scale once in float64;
    QuantizeLinear rounds half to even and saturates."""
    g = qdq.graph
    vals: dict[str, np.ndarray] = {t.name: nh.to_array(t).astype(np.float64) for t in g.initializer}
    raw = {t.name: nh.to_array(t) for t in g.initializer}
    ints: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # DQ outputs: (q - z, scale broadcastable)
    vals[g.input[0].name] = x.astype(np.float64)
    for node in g.node:
        i, o = node.input, node.output[0]
        if node.op_type == "Constant":
            vals[o] = nh.to_array(node.attribute[0].t).astype(np.float64)
            raw[o] = nh.to_array(node.attribute[0].t)
        elif node.op_type == "QuantizeLinear":
            v, s = vals[i[0]], vals[i[1]]
            z = raw[i[2]] if len(i) > 2 and i[2] else np.uint8(0)
            axis = _attr(node, "axis", 1)
            info = np.iinfo(z.dtype)
            q = np.rint(v / _per_axis(s, axis, v.ndim)) + _per_axis(z.astype(np.float64), axis, v.ndim)
            vals[o] = np.clip(q, info.min, info.max)
            raw[o] = vals[o].astype(z.dtype)
        elif node.op_type == "DequantizeLinear":
            q = vals[i[0]]
            s = vals[i[1]]
            z = vals[i[2]] if len(i) > 2 and i[2] else np.float64(0)
            axis = _attr(node, "axis", 1)
            d = q - _per_axis(z, axis, q.ndim)
            sc = _per_axis(s, axis, q.ndim)
            ints[o] = (d, sc)
            vals[o] = d * sc  # exact: an 8- or 32-bit integer times a float32
        elif node.op_type == "Conv":
            (ix, sx), (iw, sw) = ints[i[0]], ints[i[1]]
            k, stride, pad = iw.shape[2], _attr(node, "strides", [1, 1])[0], _attr(node, "pads", [0] * 4)[0]
            acc = _windows(ix, k, stride, pad) @ iw.reshape(iw.shape[0], -1).T  # (N, OH, OW, OC), exact integers
            y = acc.transpose(0, 3, 1, 2) * (np.asarray(sx).reshape(()) * np.asarray(sw).reshape(1, -1, 1, 1))
            vals[o] = y + (vals[i[2]].reshape(1, -1, 1, 1) if len(i) > 2 else 0)
        elif node.op_type in ("Gemm", "MatMul"):
            (ia, sa), (ib, sb) = ints[i[0]], ints[i[1]]
            b = ib.T if _attr(node, "transB", 0) else ib
            y = (ia @ b) * (np.asarray(sa).reshape(()) * np.asarray(sb).reshape(1, -1))
            vals[o] = y + (vals[i[2]] if node.op_type == "Gemm" and len(i) > 2 else 0)
        elif node.op_type == "Relu":
            vals[o] = np.maximum(vals[i[0]], 0)
            if i[0] in ints:
                ints[o] = (np.maximum(ints[i[0]][0], 0), ints[i[0]][1])
        elif node.op_type == "Add":
            vals[o] = vals[i[0]] + vals[i[1]]
        elif node.op_type == "GlobalAveragePool":
            vals[o] = vals[i[0]].mean(axis=(2, 3), keepdims=True)
        elif node.op_type == "Flatten":
            vals[o] = vals[i[0]].reshape(vals[i[0]].shape[0], -1)
            if i[0] in ints:
                ints[o] = (ints[i[0]][0].reshape(vals[o].shape), ints[i[0]][1])
        else:
            raise NotImplementedError(f"oracle: {node.op_type}")
    return vals[g.output[0].name]


def steps(got: np.ndarray, want: np.ndarray, scale: float) -> tuple[float, int]:
    """(share of elements equal, largest difference) in output steps."""
    d = np.rint(np.abs(got.astype(np.float64) - want) / scale).astype(np.int64)
    return float((d == 0).mean()), int(d.max())


def output_scale(qdq: onnx.ModelProto) -> float:
    """The scale of the DequantizeLinear that gives the model's output."""
    node = next(n for n in qdq.graph.node if n.output[0] == qdq.graph.output[0].name)
    inits = {t.name: nh.to_array(t) for t in qdq.graph.initializer}
    return float(inits[node.input[1]].reshape(-1)[0])


# -- the forms --------------------------------------------------------------------------------------------------
Runner = Callable[[np.ndarray], np.ndarray]  # float images (batch, 3, 32, 32) -> the float outputs


@dataclass
class Form:
    """One way of running the quantized model: ``make(batch, threads)`` builds its session once and returns its
    runner; CVM forms carry their op node count and gas; ``notes`` collects what a make learnt (precisions)."""

    name: str
    make: Callable[[int, int], Runner]
    ops: int | None = None
    gas: int | None = None
    notes: list[str] = field(default_factory=list)


def cvm_form(name: str, directory: Path) -> Form:
    """A CVM import's serving form (integer products) in a cvm-onnx session, float32 in and out as the other forms:
    its edges in the graph (``float_io``: QuantizeLinear on the input, DequantizeLinear on the output)."""
    loaded, edges = load(directory), read_edges(directory)

    def make(batch: int, threads: int) -> Runner:
        served = session(to_onnx(loaded.graph, Target(), batch=batch, edges=edges, float_io=True), threads=threads)
        name = served.get_inputs()[0].name
        return lambda x: served.run(None, {name: x})[0]

    return Form(name, make, sum(not n.is_variable for n in loaded.graph.nodes), loaded.gas.total)


def ort_session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def ort_form(name: str, model: onnx.ModelProto) -> Form:
    def make(batch: int, threads: int) -> Runner:
        sess = ort_session(any_batch(model), threads)
        return lambda x: sess.run(None, {"x": x})[0]

    return Form(name, make)


def openvino_forms(path: Path) -> list[Form]:
    """The QDQ model at ``path`` on OpenVINO's CPU plugin, with its default inference precision and with f32;
    none when OpenVINO is not installed."""
    try:
        import openvino as ov
    except ImportError:
        return []
    core = ov.Core()
    default = core.get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()

    def openvino_form(precision: str | None) -> Form:
        hint = f"default precision hint ({default})" if precision is None else f"precision hint {precision}"

        def make(batch: int, threads: int) -> Runner:
            model = core.read_model(str(path))
            model.reshape({"x": [batch, 3, 32, 32]})
            config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
            if precision:
                config["INFERENCE_PRECISION_HINT"] = precision
            request = core.compile_model(model, "CPU", config).create_infer_request()
            if batch == 1:
                form.notes.append(f"{form.name}: {layer_precisions(request.get_compiled_model())}")

            def run(x: np.ndarray) -> np.ndarray:
                request.infer({0: x})
                return request.get_output_tensor(0).data.copy()

            return run

        form = Form(f"OpenVINO {ov.__version__.split('-')[0]}, QDQ model, {hint}", make)
        return form

    return [openvino_form(None), openvino_form("f32")]


def layer_precisions(compiled) -> str:
    """The compiled model's convolutions and fully connected layers, and its other layers but constants, by the
    precision they run in (OpenVINO's runtime model)."""
    counts: dict[str, int] = {}
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        kind, precision = info["layerType"].astype(str), info["runtimePrecision"].astype(str)
        if kind not in ("Input", "Output", "Const"):
            key = f"{kind} {precision}" if kind in ("Convolution", "FullyConnected") else f"other layers {precision}"
            counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n} x {key}" for key, n in sorted(counts.items()))


# -- the run ----------------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibration", type=int, default=64, help="calibration images (default 64)")
    ap.add_argument("--runs", type=int, default=400, help="timed runs at batch 1 (fewer at batch 64)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds the forms alternate in (default 2)")
    ap.add_argument("--activation", choices=["uint8", "int8"], default="uint8")
    ap.add_argument("--per-tensor", action="store_true", help="weights per tensor (default: per channel)")
    ap.add_argument("--markdown", type=Path, help="also write the table (and the machine) to this file")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    rng = np.random.default_rng(0)
    float_model = resnet20(rng)
    calibration = rng.normal(size=(args.calibration, 3, 32, 32)).astype(np.float32)
    images = rng.normal(size=(64, 3, 32, 32)).astype(np.float32)
    flags = {f for f in Path("/proc/cpuinfo").read_text().split() if f in (
        "avx2", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")} \
        if Path("/proc/cpuinfo").exists() else set()
    lines = [f"machine: {machine()}; CPU flags: {', '.join(sorted(flags)) or 'none'}; cvm-onnx products: "
             f"{cpu.products()} (every product: {cpu.unbounded()}); load average {os.getloadavg()[0]:.2f}",
             f"quantization: {args.activation} activations, weights int8 per "
             f"{'tensor' if args.per_tensor else 'channel'}, minmax on {args.calibration} random images"]
    print(*lines, sep="\n", flush=True)
    batches = {1: 1, 64: usable_cpus()}  # batch: threads
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        onnx.save(float_model, tmp / "float.onnx")
        np.save(tmp / "calibration.npy", calibration)
        opts = dict(per_channel=not args.per_tensor, activation=args.activation)
        quantize(tmp / "float.onnx", tmp / "calibration.npy", tmp / "cvm", form="qdq", save_onnx=tmp / "qdq.onnx",
                 two_part=False, **opts)
        quantize(tmp / "float.onnx", tmp / "calibration.npy", tmp / "cvm_qop", form="qoperator",
                 save_onnx=tmp / "qop.onnx", **opts)
        convert(tmp / "qdq.onnx", tmp / "cvm_parts")
        qdq, qop = onnx.load(tmp / "qdq.onnx"), onnx.load(tmp / "qop.onnx")
        onnx.save(any_batch(qdq), tmp / "qdq_any_batch.onnx")
        on_openvino = openvino_forms(tmp / "qdq_any_batch.onnx")
        if not on_openvino:
            lines.append("OpenVINO is not installed: its rows are left out (pip install -e \".[bench]\" adds it)")
            print(lines[-1])
        forms = [cvm_form("cvm-onnx serving form (exact CVM, --one-part import)", tmp / "cvm"),
                 cvm_form("cvm-onnx serving form (exact CVM, default import: products in parts)", tmp / "cvm_parts"),
                 ort_form("onnxruntime, QDQ model", qdq), ort_form("onnxruntime, QOperator model", qop), *on_openvino]
        runners = {(form.name, batch): form.make(batch, threads) for form in forms
                   for batch, threads in batches.items()}
    want, scale = oracle(qdq, images), output_scale(qdq)
    fidelity = {}
    for (name, batch), run in runners.items():
        got = np.concatenate([run(images[k:k + batch]) for k in range(0, 64, batch)])
        fidelity[name, batch] = steps(got.reshape(want.shape), want, scale)
    times: dict[tuple[str, int], list[float]] = {key: [] for key in runners}
    for _ in range(args.rounds):
        for batch in batches:
            for form in forms:
                run, x = runners[form.name, batch], images[:batch]
                times[form.name, batch].append(median_ms(lambda: run(x), max(25, args.runs // batch)))
    table = [f"| form | equal to the exact oracle | max steps | batch 1, 1 thread | batch 64, {batches[64]} threads "
             "| CVM op nodes | gas |", "|---|---|---|---|---|---|---|"]
    for form in forms:
        (e1, w1), (e64, w64) = fidelity[form.name, 1], fidelity[form.name, 64]
        equal = f"{e1:.2%}" if e1 == e64 else f"{e1:.2%} (batch 64: {e64:.2%})"
        worst = f"{w1}" if w1 == w64 else f"{w1} (batch 64: {w64})"
        cells = [f"{min(times[form.name, b]):.3f}" + (f"-{max(times[form.name, b]):.3f}" if args.rounds > 1 else "")
                 + " ms" for b in batches]
        table.append(f"| {form.name} | {equal} | {worst} | {' | '.join(cells)} | "
                     f"{form.ops if form.ops is not None else ''} | {form.gas if form.gas is not None else ''} |")
    notes = [note for form in forms for note in form.notes]
    report = ["", *table, "", f"- latency: the lowest and highest of {args.rounds} round(s), each the best of five "
              "medians; the forms alternate in each round", *(f"- {note}" for note in notes),
              f"- load average at the end {os.getloadavg()[0]:.2f}"]
    print(*report, sep="\n")
    if args.markdown:
        args.markdown.write_text("\n\n".join(lines) + "\n" + "\n".join(report) + "\n")


if __name__ == "__main__":
    main()
