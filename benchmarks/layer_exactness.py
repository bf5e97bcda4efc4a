"""Per layer, how far a CVM import of a quantized ONNX model lies from the exact requantization of each Conv.

For every Conv of a QDQ model whose output goes straight to a QuantizeLinear, the model is imported cut at that
Conv's quantized input and at its QuantizeLinear (`import_model(..., outputs=[...])`), run on random float
input, and the CVM integers out are compared with round_half_even((acc + bias) * M) + z_out (saturated),
computed from the CVM integers in: acc by onnx's reference Conv in float64 (exact for these integers), M =
s_x s_w / s_out per channel as exact rationals. Each requantization's bound says |r - exact| <= 1/2 + delta < 1,
so every layer must be within one step; the share exactly equal tells how often the rounding differs. The
layer's group says which are depthwise.

Run: python benchmarks/layer_exactness.py MODEL_QDQ.onnx [--seed N]   (input shape from the model, static)
"""
from __future__ import annotations

import argparse
import logging
import platform
from fractions import Fraction

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model


def conv_sums(x: np.ndarray, w: np.ndarray, attrs: dict) -> np.ndarray:
    g = h.make_graph([h.make_node("Conv", ["a", "b"], ["o"], **attrs)], "c",
                     [h.make_tensor_value_info("a", T.DOUBLE, None), h.make_tensor_value_info("b", T.DOUBLE, None)],
                     [h.make_tensor_value_info("o", T.DOUBLE, None)])
    model = onnx_model(g, opset=13)
    return np.rint(ReferenceEvaluator(model).run(None, {"a": x, "b": w})[0]).astype(np.int64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    m = onnx.load(args.model)
    g = m.graph
    inits = {t.name: nh.to_array(t) for t in g.initializer}
    made = {o: n for n in g.node for o in n.output}
    shape = [d.dim_value for d in g.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(args.seed).uniform(-1, 1, shape).astype(np.float32)
    print(f"{platform.processor() or platform.machine()}; {args.model}; input {shape}, seed {args.seed}")
    print("| Conv | group | outputs | max steps | exactly equal |\n|---|---:|---:|---:|---:|")
    for n in g.node:
        quantizers = [c for c in g.node if c.op_type == "QuantizeLinear" and n.output[0] in c.input[:1]]
        if n.op_type != "Conv" or not quantizers:
            continue
        dqx, dqw, q = made[n.input[0]], made[n.input[1]], quantizers[0]
        imp = import_model(m, outputs=[dqx.input[0], q.output[0]])
        xi, yi = execute(imp.graph, {"data": imp.edges.input.quantize(x)})
        zx = int(inits[dqx.input[2]]) if len(dqx.input) > 2 else 0
        attrs = {a.name: h.get_attribute_value(a) for a in n.attribute}
        acc = conv_sums(xi.astype(np.float64) - zx, inits[dqw.input[0]].astype(np.float64), attrs)
        if len(n.input) > 2:
            acc = acc + inits[made[n.input[2]].input[0]].astype(np.int64).reshape(1, -1, 1, 1)
        so, zo = Fraction(float(inits[q.input[1]])), int(inits[q.input[2]])
        sx = Fraction(float(inits[dqx.input[1]]))
        ms = [sx * Fraction(float(s)) / so for s in np.broadcast_to(inits[dqw.input[1]], (acc.shape[1],))]
        lo, hi = (-128, 127) if inits[q.input[2]].dtype == np.int8 else (0, 255)
        want = np.array([[min(max(round(int(a) * ms[c]) + zo, lo), hi) for a in acc[:, c].flat]
                         for c in range(acc.shape[1])]).reshape(acc.shape[1], acc.shape[0], -1)
        got = yi.reshape(acc.shape).transpose(1, 0, 2, 3).reshape(want.shape)
        d = np.abs(got.astype(np.int64) - want)
        print(f"| {n.name} | {attrs.get('group', 1)} | {d.size} | {d.max()} | {100 * (d == 0).mean():.1f}% |")


if __name__ == "__main__":
    main()
