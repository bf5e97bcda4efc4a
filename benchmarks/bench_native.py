"""non_max_suppression and get_valid_counts on B=1, N=10,000 boxes: native library vs Python fallback vs reference.

    python benchmarks/bench_native.py [--n 10000] [--repeat 5]

Runs each implementation on the same data, checks that all outputs are identical, and prints the median wall
time per call (onnxruntime session creation excluded).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from onnx import TensorProto, helper

from cvm_onnx.core import ops
from cvm_onnx.core.format import onnx_file
from cvm_onnx.native import DOMAIN, library_path
from cvm_onnx.runtime import sessions


def model(op: str, inputs, outputs, **attrs):
    node = helper.make_node(op, [n for n, _ in inputs], [n for n, _ in outputs], domain=DOMAIN, **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info(n, TensorProto.INT32, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, TensorProto.INT32, s) for n, s in outputs])
    return onnx_file.onnx_model(graph, domains={DOMAIN: 1})


def boxes(n: int, seed: int = 0) -> np.ndarray:
    """(1, n, 6) rows [id, score, x1, y1, x2, y2]: 10 classes, scores with ties, boxes 1..100 wide in 1000x1000."""
    rng = np.random.default_rng(seed)
    xy = rng.integers(0, 1000, (n, 2))
    wh = rng.integers(1, 100, (n, 2))
    rows = np.column_stack([rng.integers(0, 10, n), rng.integers(0, 1000, n), xy, xy + wh])
    return rows[None].astype(np.int32)


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def bench(name: str, onnx_model, feeds: dict, attrs: dict, repeat: int) -> tuple:
    sessions = {p: sessions.session(onnx_model, native=p == "native") for p in ("native", "fallback")}
    op = ops.get(name)
    xs = list(feeds.values())
    bound = op.bind({k: bool(v) if k == "force_suppress" else v for k, v in attrs.items()})
    outs = {p: sessions.run(s, feeds) for p, s in sessions.items()}
    outs["reference"] = op.run(bound, xs)
    for p, got in outs.items():
        assert all(np.array_equal(g, w) for g, w in zip(got, outs["reference"])), f"{p} differs from the reference"
    times = {p: median_ms(lambda s=s: s.run(None, feeds), repeat) for p, s in sessions.items()}
    times["reference"] = median_ms(lambda: op.run(bound, xs), repeat)
    return name, times, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if library_path() is None:
        raise SystemExit("the native custom-op library is not built; see docs/custom_ops.md")
    data = boxes(args.n)
    nms_attrs = {"max_output_size": -1, "iou_threshold": 50, "force_suppress": 0, "top_k": -1}
    nms = model("non_max_suppression", [("data", list(data.shape)), ("valid_count", [1])],
                [("y", list(data.shape))], **nms_attrs)
    gvc = model("get_valid_counts", [("data", list(data.shape))], [("count", [1]), ("y", list(data.shape))],
                score_threshold=500)
    rows = [
        bench("non_max_suppression", nms, {"data": data, "valid_count": np.array([args.n], np.int32)}, nms_attrs,
              args.repeat),
        bench("get_valid_counts", gvc, {"data": data}, {"score_threshold": 500}, args.repeat),
    ]
    print(f"B=1, N={args.n} boxes; median of {args.repeat} calls; outputs identical across all three")
    print(f"{'op':<22}{'native ms':>12}{'fallback ms':>14}{'reference ms':>15}{'fallback/native':>17}")
    for name, t, _ in rows:
        print(f"{name:<22}{t['native']:>12.3f}{t['fallback']:>14.3f}{t['reference']:>15.3f}"
              f"{t['fallback'] / t['native']:>16.0f}x")
    kept = int((rows[0][2]["native"][0][0, :, 0] >= 0).sum())
    print(f"(nms kept {kept} of {args.n} boxes; get_valid_counts kept {int(rows[1][2]['native'][0][0])})")


if __name__ == "__main__":
    main()
