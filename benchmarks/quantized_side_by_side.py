"""A quantized model side by side: cvm-onnx's exact serving form against onnxruntime's own int8 execution.

A float ResNet-20-shaped network (CIFAR layout: a 3x3 stem, three stages of three basic blocks with 16/32/64
channels, 1x1 projections where a stage halves the size, global average pooling, a 64 -> 10 Gemm; random He
weights in numpy, batch norms folded into the convolutions' biases) is written as float ONNX, then quantized
the same way twice from the same calibration samples:

* by ``cvm-onnx quantize`` (``cvm_onnx.app.quantize.quantize``: quantize_static in the QDQ form, imported into CVM),
  exported as the serving form (``to_onnx(..., Target.default())``, integer products) and run with
  ``cvm_onnx.runtime.sessions.session`` (float images quantized by the model's input edge, outputs dequantized: the
  timing includes both);
* by onnxruntime's quantize_static alone, in the QDQ and QOperator forms, run by a default onnxruntime session
  (its own int8 kernels: QLinearConv, MatMulInteger, ...).

Each result is compared with an exact oracle of the quantized model (docs/import.md: the QDQ graph's real
arithmetic, here in numpy: integer accumulation exact in float64, the scales applied in float64, QuantizeLinear
rounding half to even), in output steps (|y - oracle| / the output's scale): the share of elements exactly
equal and the largest difference. Latencies: best of five medians, batch 1 (one thread) and batch 64 (every
CPU), every onnxruntime session created once.

Run: python benchmarks/quantized_side_by_side.py [--calibration N] [--runs N] [--activation uint8|int8]
     [--per-tensor]
"""
from __future__ import annotations

import argparse
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.app.api import load
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


# -- the run ----------------------------------------------------------------------------------------------------
def ort_session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibration", type=int, default=64, help="calibration images (default 64)")
    ap.add_argument("--runs", type=int, default=400, help="timed runs at batch 1 (fewer at batch 64)")
    ap.add_argument("--activation", choices=["uint8", "int8"], default="uint8")
    ap.add_argument("--per-tensor", action="store_true", help="weights per tensor (default: per channel)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    rng = np.random.default_rng(0)
    float_model = resnet20(rng)
    calibration = rng.normal(size=(args.calibration, 3, 32, 32)).astype(np.float32)
    images = rng.normal(size=(64, 3, 32, 32)).astype(np.float32)
    flags = {f for f in Path("/proc/cpuinfo").read_text().split() if f in (
        "avx2", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8")} if Path("/proc/cpuinfo").exists() else set()
    print(f"machine: {machine()}; CPU flags: {', '.join(sorted(flags)) or 'none'}; cvm-onnx products: "
          f"{cpu.products()} (every product: {cpu.unbounded()}); load average {os.getloadavg()[0]:.2f}")
    print(f"quantization: {args.activation} activations, weights int8 per "
          f"{'tensor' if args.per_tensor else 'channel'}, minmax on {args.calibration} random images")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        onnx.save(float_model, tmp / "float.onnx")
        np.save(tmp / "calibration.npy", calibration)
        opts = dict(per_channel=not args.per_tensor, activation=args.activation)
        quantize(tmp / "float.onnx", tmp / "calibration.npy", tmp / "cvm", form="qdq", save_onnx=tmp / "qdq.onnx",
                 **opts)
        quantize(tmp / "float.onnx", tmp / "calibration.npy", tmp / "cvm_qop", form="qoperator",
                 save_onnx=tmp / "qop.onnx", **opts)
        qdq, qop = onnx.load(tmp / "qdq.onnx"), onnx.load(tmp / "qop.onnx")
        graph, edges = load(tmp / "cvm").graph, read_edges(tmp / "cvm")
    want = oracle(qdq, images)
    scale = output_scale(qdq)
    print(f"| {'what':<52} | {'batch':>5} | {'median':>9} | {'images/s':>8} | {'equal':>7} | {'max steps':>9} |")
    print(f"|{'-' * 54}|{'-' * 7}|{'-' * 11}|{'-' * 10}|{'-' * 9}|{'-' * 11}|")
    for batch in (1, 64):
        threads = 1 if batch == 1 else usable_cpus()
        feeds = [images[k:k + batch] for k in range(0, 64, batch)]
        forms = {"onnxruntime, QDQ model (quantize_static)": ort_session(any_batch(qdq), threads),
                 "onnxruntime, QOperator model (quantize_static)": ort_session(any_batch(qop), threads)}
        for name, sess in forms.items():
            got = np.concatenate([sess.run(None, {"x": f})[0] for f in feeds])
            equal, worst = steps(got, want, scale)
            ms = median_ms(lambda: sess.run(None, {"x": feeds[0]}), max(25, args.runs // batch))
            print(f"| {name:<52} | {batch:>5} | {ms:>6.3f} ms | {batch / ms * 1e3:>8.0f} | {equal:>7.2%} | {worst:>9} |",
                  flush=True)
        served = session(to_onnx(graph, Target(), batch=batch), threads=threads)
        name = served.get_inputs()[0].name

        def run(x: np.ndarray) -> np.ndarray:
            q = edges.input.quantize(x).astype(np.int32)
            return edges.outputs[0].dequantize(served.run(None, {name: q})[0])

        got = np.concatenate([run(f) for f in feeds])
        equal, worst = steps(got, want, scale)
        ms = median_ms(lambda: run(feeds[0]), max(25, args.runs // batch))
        print(f"| {'cvm-onnx serving form (cvm-onnx quantize, exact CVM)':<52} | {batch:>5} | {ms:>6.3f} ms | "
              f"{batch / ms * 1e3:>8.0f} | {equal:>7.2%} | {worst:>9} |", flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
