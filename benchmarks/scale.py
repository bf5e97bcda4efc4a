"""Throughput of ResNet-20 over many inputs: one process (the batched serving form) against Ray Data actors.

    python benchmarks/scale.py [--samples 2048] [--chunk 64] [--rounds 3]

Runs the shared ResNet-20 (../shared/models/resnet20-cifar) over seeded random int8 images in its serving form
(``--optimize --batch CHUNK``): in this process (``bulk.run_many``) with onnxruntime's default threads and with
one thread, then on a local Ray instance (``on_ray.run_on_ray``) with 1 and 2 actors of one CPU and one thread
each. Every result is checked bit for bit against the first. Each figure is the best of ``--rounds`` runs, with
the median and the load average (a shared VM's neighbours slow whole stretches). Every run is end to end (the
plan, sessions, writing the results); "running the session" is the compute alone, a runner reused. A Ray run
includes starting its actors; that start is measured alone (a run of one chunk, less its compute) and the
overhead per call (one chunk, one map_batches task) is the rest of a 1-actor run past the compute, divided by
the calls.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

import cvm_onnx
from cvm_onnx.runtime import bulk
from cvm_onnx.serving.target import Target

RESNET = Path(__file__).resolve().parents[2] / "shared" / "models" / "resnet20-cifar"


def cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    return f"{platform.processor()}, {os.cpu_count()} CPUs"


def timed(work, rounds: int) -> tuple[float, float, list[np.ndarray]]:
    """Best and median seconds of ``rounds`` runs of ``work()``, and its last result."""
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        out = work()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times), out


def report(what: str, n: int, best: float, median: float) -> None:
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"{what:<44} {best * 1000:9.0f} ms best ({median * 1000:.0f} median)  {n / best:7.0f} images/s  "
          f"load {load}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import ray

    from cvm_onnx.runtime.on_ray import run_on_ray

    graph = cvm_onnx.load(RESNET).graph
    served = cvm_onnx.to_onnx(graph, Target.default(), batch=args.chunk)
    x = np.random.default_rng(0).integers(-127, 128, (args.samples, 1, 3, 32, 32)).astype(np.int8)
    n, calls = args.samples, -(-args.samples // args.chunk)
    print(f"ResNet-20, {n} inputs, serving form batch {args.chunk} ({calls} calls); {cpu()}; "
          f"onnxruntime {__import__('onnxruntime').__version__}, ray {ray.__version__}")

    best, median, want = timed(lambda: bulk.run_many(served, x, chunk=args.chunk).arrays, args.rounds)
    report("one process, default threads", n, best, median)
    best, median, got = timed(lambda: bulk.run_many(served, x, chunk=args.chunk, threads=1).arrays, args.rounds)
    assert np.array_equal(got[0], want[0])
    report("one process, 1 thread", n, best, median)
    runner = bulk.Runner(bulk.plan(served, args.chunk, threads=1))
    compute, median, _ = timed(lambda: [runner(x[a:a + args.chunk]) for a in range(0, n, args.chunk)], args.rounds)
    report("  of which running the session (1 thread)", n, compute, median)

    t = time.perf_counter()
    ray.init("local", num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    print(f"ray.init (local, 2 CPUs): {time.perf_counter() - t:.1f} s")
    try:
        start, _, _ = timed(lambda: run_on_ray(served, x[:args.chunk], actors=1, chunk=args.chunk).arrays,
                            args.rounds)
        start -= compute / calls
        print(f"Ray start of a run (1 actor, one chunk, less its compute): {start * 1000:.0f} ms")
        for actors in (1, 2):
            best_r, median_r, got = timed(
                lambda: run_on_ray(served, x, actors=actors, chunk=args.chunk).arrays, args.rounds)
            assert np.array_equal(got[0], want[0]), "Ray differs from the single process"
            report(f"Ray, {actors} actor(s) x 1 thread", n, best_r, median_r)
            if actors == 1:
                per_call = (best_r - start - compute) / calls
                print(f"  overhead per call (chunk of {args.chunk}), past the start: {per_call * 1000:.1f} ms")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
