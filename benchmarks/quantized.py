"""How close CVM models imported from onnxruntime.quantization models come to onnxruntime running them, and the
digits classifier's accuracy float -> quantized ONNX -> CVM.

For small random float models (a CNN, an MLP, a two-branch CNN joined by Add and Concat) quantized by
quantize_static in every configuration (QDQ and QOperator forms; uint8 and int8 activations; asymmetric and
symmetric; weights per tensor and per channel; opsets 13, 17, 21), on random inputs:

* the share of output elements within one output step of onnxruntime, and the share exactly equal;
* top-1 agreement (argmax of the output).

onnxruntime runs with the session option session.x64quantprecision = "1" (exact integer kernels on every CPU;
never a default session, whose int8 results depend on the CPU: docs/import.md). That option has no
int8-activation QLinearConv, so a QOperator model with int8 activations is compared with onnxruntime running
its QDQ twin (the same calibration, hence the same scales, zero points and weights: checked, the two import as
the same CVM ops and params).

Digits: models/digits_cnn/make.py run into a temporary directory (the numpy-trained float CNN written as float
ONNX, quantized by `cvm_onnx.app.quantize.quantize`: minmax, per channel, int8 activations, 256 training images),
accuracy on the 359 held-out images of the float model (numpy), the quantized ONNX model (onnxruntime,
x64quantprecision), the CVM model (reference executor) and its ONNX export. Needs scikit-learn (extra `models`).

Run: python benchmarks/quantized.py [--samples N] [--skip-digits]
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import logging
import os
import platform
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnxruntime import quantization as q

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.add_session_config_entry("session.x64quantprecision", "1")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


# -- models -----------------------------------------------------------------------------------------------------
def conv(rng, name, x, c_in, c_out, k=3, pads=(1, 1, 1, 1), stride=1):
    w = nh.from_array((rng.normal(size=(c_out, c_in, k, k)) / np.sqrt(c_in * k * k)).astype(np.float32), f"{name}_w")
    b = nh.from_array((rng.normal(size=(c_out,)) * 0.1).astype(np.float32), f"{name}_b")
    return [h.make_node("Conv", [x, w.name, b.name], [name], pads=list(pads), strides=[stride, stride])], [w, b]


def dense(rng, name, x, n_in, n_out):
    w = nh.from_array((rng.normal(size=(n_in, n_out)) / np.sqrt(n_in)).astype(np.float32), f"{name}_w")
    b = nh.from_array((rng.normal(size=(n_out,)) * 0.1).astype(np.float32), f"{name}_b")
    return [h.make_node("Gemm", [x, w.name, b.name], [name])], [w, b]


def model(kind: str, opset: int, seed: int = 0) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def add(pair):
        nodes.extend(pair[0])
        inits.extend(pair[1])

    if kind == "mlp":
        shape = (1, 32)
        add(dense(rng, "d1", "x", 32, 24))
        nodes.append(h.make_node("Relu", ["d1"], ["r1"]))
        add(dense(rng, "d2", "r1", 24, 16))
        nodes.append(h.make_node("Relu", ["d2"], ["r2"]))
        add(dense(rng, "y", "r2", 16, 10))
    else:
        shape = (1, 3, 8, 8)
        add(conv(rng, "c1", "x", 3, 8))
        nodes.append(h.make_node("Relu", ["c1"], ["r1"]))
        nodes.append(h.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]))
        add(conv(rng, "c2", "p1", 8, 8))
        nodes.append(h.make_node("Relu", ["c2"], ["r2"]))
        last = "r2"
        if kind == "branch":
            add(conv(rng, "c3", "p1", 8, 8, k=1, pads=(0, 0, 0, 0)))
            nodes.append(h.make_node("Add", ["r2", "c3"], ["a"]))
            nodes.append(h.make_node("Concat", ["a", "p1"], ["cat"], axis=1))
            nodes.append(h.make_node("AveragePool", ["cat"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]))
            last = "ap"
        nodes.append(h.make_node("GlobalAveragePool", [last], ["g"]))
        nodes.append(h.make_node("Flatten", ["g"], ["f"]))
        add(dense(rng, "y", "f", 16 if kind == "branch" else 8, 10))
    g = h.make_graph(nodes, kind, [h.make_tensor_value_info("x", T.FLOAT, list(shape))],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 10])], inits)
    return onnx_model(g, opset), shape


class Reader(q.CalibrationDataReader):
    def __init__(self, xs):
        self.items = iter([{"x": x} for x in xs])

    def get_next(self):
        return next(self.items, None)


def quantized(src: Path, dst: Path, xs, fmt: str, act: str, sym: bool, pc: bool) -> onnx.ModelProto:
    q.quantize_static(str(src), str(dst), Reader(xs), quant_format=getattr(q.QuantFormat, fmt),
                      activation_type=q.QuantType.QInt8 if act == "int8" else q.QuantType.QUInt8,
                      weight_type=q.QuantType.QInt8, per_channel=pc, extra_options={"ActivationSymmetric": sym})
    return onnx.load(dst)


def same_quantization(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    """Whether two forms of a model import as the same integer computation: equal CVM ops and params (the same
    quantized weights, biases, scales and zero points)."""
    def key(m):
        g = import_model(m).graph
        return g.op_counts(), sorted(v.tobytes() for v in g.params.values())
    return key(a) == key(b)


# -- agreement --------------------------------------------------------------------------------------------------
def agreement(samples: int) -> list[tuple]:
    rows = []
    for kind, fmt, act, sym, pc, opset in itertools.product(["cnn", "mlp", "branch"], ["QDQ", "QOperator"],
                                                           ["uint8", "int8"], [False, True], [False, True],
                                                           [13, 17, 21]):
        fm, shape = model(kind, opset)
        rng = np.random.default_rng(1)
        calib = [rng.normal(size=shape).astype(np.float32) for _ in range(16)]
        xs = [rng.normal(size=shape).astype(np.float32) * 1.2 for _ in range(samples)]
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            onnx.save(fm, tmp / "f.onnx")
            qm = quantized(tmp / "f.onnx", tmp / "q.onnx", calib, fmt, act, sym, pc)
            reference, twin = qm, ""
            if fmt == "QOperator" and act == "int8":
                reference = quantized(tmp / "f.onnx", tmp / "twin.onnx", calib, "QDQ", act, sym, pc)
                twin = " (vs its QDQ twin: " + ("same" if same_quantization(qm, reference) else "DIFFERENT") + \
                    " quantized values)"
        imp = import_model(qm)
        sess = session(reference)
        edge = imp.edges.outputs[0]
        within = equal = top1 = total = 0
        for x in xs:
            [want] = sess.run(None, {"x": x})
            [y] = execute(imp.graph, {"data": imp.edges.input.quantize(x)})
            got = edge.dequantize(y)
            steps = np.rint(np.abs(got.astype(np.float64) - want) / float(edge.scale))
            within += int((steps <= 1).sum())
            equal += int((steps == 0).sum())
            total += steps.size
            top1 += int(got.argmax() == want.argmax())
        worst = max((p.error for r in imp.requants for p in r.plans), default=0.5)
        rows.append((kind, fmt, act, "sym" if sym else "asym", "per-channel" if pc else "per-tensor", opset,
                     within / total, equal / total, top1 / len(xs), worst))
        print(f"{kind:6} {fmt:9} {act:5} {rows[-1][3]:4} {rows[-1][4]:11} opset {opset}: within one step "
              f"{rows[-1][6]:.2%}, equal {rows[-1][7]:.2%}, top-1 {rows[-1][8]:.2%}, worst requantization "
              f"error {worst:.3f} steps{twin}", flush=True)
    return rows


# -- digits -----------------------------------------------------------------------------------------------------
def digits(tmp: Path) -> dict:
    """models/digits_cnn/make.py run into ``tmp`` (the shipped model's own path): its held-out accuracies."""
    spec = importlib.util.spec_from_file_location("make_digits",
                                                  Path(__file__).parents[1] / "models" / "digits_cnn" / "make.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    make.main(tmp)
    acc = json.loads((tmp / "accuracy.json").read_text())
    return {"float": acc["float_accuracy"], "quantized ONNX": acc["ort_quantized_accuracy"],
            "CVM": acc["cvm_accuracy"], "ONNX export of the CVM model": acc["onnx_accuracy"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=200, help="random inputs per configuration (default 200)")
    ap.add_argument("--skip-digits", action="store_true")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # quantize_static's advice to pre-process
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, onnxruntime {ort.__version__}; "
          f"load average {os.getloadavg()} (a shared machine)", flush=True)
    rows = agreement(args.samples)
    within = [r[6] for r in rows]
    print(f"\n{len(rows)} configurations: within one step min {min(within):.2%}, mean {np.mean(within):.2%}; "
          f"exactly equal min {min(r[7] for r in rows):.2%}, mean {np.mean([r[7] for r in rows]):.2%}; top-1 "
          f"agreement min {min(r[8] for r in rows):.2%}, mean {np.mean([r[8] for r in rows]):.2%}; load "
          f"{os.getloadavg()[0]:.2f}")
    if not args.skip_digits:
        with tempfile.TemporaryDirectory() as tmp:
            acc = digits(Path(tmp))
        print("digits held-out accuracy: " + ", ".join(f"{k} {v:.2%}" for k, v in acc.items()))


if __name__ == "__main__":
    main()
