"""conv2d on onnxruntime CPU: the fast form (float32 Conv, exact by the 2^24 bound) against the core form
(Pad + im2col + int32 MatMul), on ResNet-like layers: C -> C channels, 3x3, padding 1, 32x32, with bias.

Each layer is lowered alone in each form (``lowering.op_model``: the export writes the fast form only), and both
forms are checked bit for bit against the reference executor before timing.
Run: python benchmarks/bench_conv.py [--batch N] [--runs N]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort

from cvm_onnx.converters.to_onnx.lowering import op_model
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.sessions import session


def conv_layer(c: int, batch: int, rng: np.random.Generator):
    b = GraphBuilder()
    x = b.input("data", (batch, c, 32, 32), 8)
    w = b.param("w", rng.integers(-127, 128, (c, c, 3, 3)), 8)
    bias = b.param("b", rng.integers(-(1 << 20), 1 << 20, (c,)), 22)
    y = b.op("conv2d", x, w, bias, name="conv", channels=c, kernel_size=(3, 3), padding=(1, 1))
    return b.build(y), rng.integers(-127, 128, (batch, c, 32, 32)).astype(np.int32)


def time_form(graph, data: np.ndarray, form: str, runs: int) -> tuple[float, np.ndarray]:
    """Median milliseconds of one run with conv2d written in ``form``, and the output."""
    model = op_model(graph, form)
    sess = session(model)
    feeds = {"data": data}
    out = sess.run(None, feeds)[0]
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    return 1e3 * float(np.median(times)), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"onnxruntime {ort.__version__} CPU, batch {args.batch}, median of {args.runs} runs")
    print(f"{'layer':>22} {'fast (ms)':>10} {'core (ms)':>10} {'core/fast':>10}")
    cases = [(f"{c}->{c} 3x3 32x32", *conv_layer(c, args.batch, rng)) for c in (16, 32, 64)]
    for name, graph, data in cases:
        want = execute(graph, {"data": data})[0]
        ms = {}
        for form in ("fast", "core"):
            ms[form], got = time_form(graph, data, form, args.runs)
            assert np.array_equal(got, want), f"{form} form differs from the reference"
        print(f"{name:>22} {ms['fast']:>10.3f} {ms['core']:>10.3f} {ms['core'] / ms['fast']:>9.1f}x")


if __name__ == "__main__":
    main()
