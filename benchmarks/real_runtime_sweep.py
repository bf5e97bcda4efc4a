"""The architecture sweeps' imports on the CVM runtime itself (issue 35): each float model of a sweep's folder
(benchmarks/more_architectures.py, fourth_architectures.py, text_architectures.py, vision_architectures.py) quantized
per tensor or per channel by `cvm-onnx quantize` into a folder of imports, then each import loaded by a local build of
the runtime (libcvm.so, named by CVM_RUNTIME_LIB; tests/support/cvm_runtime.py drives it) on its CPU and FORMAL devices
and run on held-out inputs (and, where there is one input, its extremes: every value its lowest, its highest), its
output compared with the reference executor's, every element.

A load the runtime refuses, a run that fails or dies, and each output that differs are rows of the sweep, one JSON line
per import and device. Heads whose row counts differ (CVMAPIInference cannot pack them) run one head at a time.

Run:
  python benchmarks/real_runtime_sweep.py import --models DIR --driver more|fourth|text|vision --imports OUT
      [--only NAME ...] [--weights per-tensor|per-channel|both] [--held-out N]
  CVM_RUNTIME_LIB=libcvm.so python benchmarks/real_runtime_sweep.py run --imports OUT [--only NAME ...]
      [--devices cpu formal] [--formal-gas G] [--timeout S] [--json out.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests" / "support")]  # the sweeps; cvm_runtime alone

INPUTS = "inputs.npy"  # an import's held-out inputs (then its extremes), as the runtime's data, int32
ABOUT = "sweep.json"  # an import's source: the float model, exporter, weights, ops, quantize seconds
EXPORTERS = ("ts-eager14", "torchscript", "dynamo", "ts")


def sources(driver: str) -> dict:
    """The sweep's models by name: (n, seed) -> n samples (an array, or one per input name), and the inputs quantize
    folds (as the sweep measured them)."""
    if driver in ("more", "fourth"):
        architectures = importlib.import_module(f"{driver}_architectures").architectures

        def of(inputs):
            def sample(n, seed):
                got = {k: s(n, seed + i) for i, (k, s) in enumerate(inputs.items())}
                return got if len(got) > 1 else next(iter(got.values()))
            return sample
        return {name: (of(inputs), None) for name, (_, inputs) in architectures().items()}
    if driver == "text":
        from text_architectures import ARCHITECTURES, samples
        return {name: (samples(kind), {"attention_mask": 1} if kind == "text" else None)
                for name, (_, _, _, kind) in ARCHITECTURES.items()}
    from real_models import imagenet, pages
    from vision_architectures import architectures, blocks

    def images(shape):
        return lambda n, seed: np.stack([imagenet(p) for p in pages(n, shape, seed)]).astype(np.float32)
    return {name: (images(shape), None) for name, _, shape in architectures() + blocks()}


def split(stem: str) -> tuple[str, str]:
    """A sweep file's stem as (architecture, exporter)."""
    for e in EXPORTERS:
        if stem.endswith("-" + e):
            return stem[:-len(e) - 1], e
    return stem, ""


def data_of(imp, data, i: int) -> np.ndarray:
    """Sample ``i`` of ``data`` (N samples stacked, or one such array per input name) as the import's ``data``."""
    edges = imp.edges
    if isinstance(data, dict):  # each input's sample as its slot takes it (a state's without the sample axis)
        shapes = {s.name: s.shape for s in edges.inputs}
        return edges.pack({k: v[i] if v.shape[1:] == shapes[k] else v[i:i + 1] for k, v in data.items()})
    x = data[i:i + 1]
    return edges.input.quantize(x) if edges and edges.input else x.astype(np.int32)


def extremes(imp) -> list[np.ndarray]:
    """The single input's lowest and highest values everywhere (its quantized type's, else its precision's)."""
    data = imp.graph.nodes[imp.graph.inputs[0]].outputs[0]
    edges = imp.edges
    if edges and edges.inputs:
        lo, hi = zip(*(s.limits() for s in edges.inputs))
        if len(edges.inputs) > 1:
            return []
        lo, hi = lo[0], hi[0]
    elif edges and edges.input:
        from cvm_onnx.core.format.edges import TYPES
        lo, hi = TYPES[edges.input.type]
    else:
        lo, hi = -data.bound, data.bound
    return [np.full(data.shape, v, np.int32) for v in (lo, hi)]


def import_one(path: Path, driver: dict, out: Path, per_channel: bool, held_out: int) -> dict:
    """Quantize the sweep's model at ``path`` into ``out`` (8 calibration samples), with its held-out inputs."""
    import onnx

    from cvm_onnx.app.quantize import quantize
    from cvm_onnx.core.errors import CVMError

    name, exporter = split(path.stem)
    sample, fold = driver[name]
    data = sample(8 + held_out, 0)
    r = {"model": path.stem, "exporter": exporter, "per_channel": per_channel,
         "ops": len(onnx.load(str(path), load_external_data=False).graph.node)}
    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(data, dict):
            cal = Path(tmp) / "cal.npz"
            np.savez(cal, **{k: v[:8] for k, v in data.items()})
        else:
            cal = Path(tmp) / "cal.npy"
            np.save(cal, data[:8])
        t = time.perf_counter()
        try:
            imp = quantize(path, cal, out, per_channel=per_channel, fold=fold, models=False).imported
        except CVMError as e:
            return r | {"whole": False, "why": str(e).splitlines()[0][:300]}
    r |= {"whole": True, "quantize_s": round(time.perf_counter() - t, 1)}
    shape = imp.graph.nodes[imp.graph.inputs[0]].outputs[0].shape
    xs = [data_of(imp, data, 8 + i).reshape(shape) for i in range(held_out)]
    np.save(out / INPUTS, np.stack(xs + extremes(imp)))
    (out / ABOUT).write_text(json.dumps(r))
    return r


def heads_apart(graph) -> list:
    """The graph as the runtime can run it: itself, or one graph per head where the heads' row counts differ."""
    rows = {math.prod(graph.type_of(e).shape[:-1]) for e in graph.heads}
    return [graph] if len(rows) == 1 else [dataclasses.replace(graph, heads=[e]) for e in graph.heads]


def run_import(folder: Path, devices: list[str], formal_gas: float) -> list[dict]:
    """The import in ``folder`` on each device of the runtime, against the reference executor, one row per device
    (in this process: the caller runs it in a child, as a load may abort)."""
    from cvm_runtime import CPU, FORMAL, LIB, CvmRuntime, packed

    from cvm_onnx import load
    from cvm_onnx.core.executor import execute
    from cvm_onnx.core.format import write_model

    graph = load(folder).graph
    xs = np.load(folder / INPUTS)
    parts = heads_apart(graph)
    rows, wants = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for k, g in enumerate(parts):
            if len(parts) > 1:
                write_model(g, Path(tmp) / str(k))
        for device in devices:
            r = {"device": device, "heads": len(graph.heads), "equal": [True] * len(xs), "load_s": 0.0, "run_s": 0.0,
                 "gas": 0}
            rows.append(r)
            if device == "formal" and rows[0]["gas"] > formal_gas:
                r.update(skipped=f"gas {rows[0]['gas']:.3g} > {formal_gas:.3g}", equal=None)
                continue
            for k, g in enumerate(parts):
                t = time.perf_counter()
                try:
                    runtime = CvmRuntime(LIB, Path(tmp) / str(k) if len(parts) > 1 else folder,
                                         {"cpu": CPU, "formal": FORMAL}[device])
                except RuntimeError as e:
                    r.update(failure=f"load: {e}", equal=None)
                    break
                r["load_s"] = round(r["load_s"] + time.perf_counter() - t, 2)
                r["gas"] += runtime.gas()
                for i, x in enumerate(xs):
                    t = time.perf_counter()
                    got = runtime.run(x)
                    r["run_s"] = round(r["run_s"] + time.perf_counter() - t, 2)
                    if (k, i) not in wants:
                        wants[k, i] = packed(execute(g, {"data": x}))
                    if not np.array_equal(got, wants[k, i]):
                        r["equal"][i] = False
                        r.setdefault("differ", []).append({"head": k, "input": i, "of": int(got.size),
                                                          "elements": int((got != wants[k, i]).sum())})
    return rows


def run_one(folder: Path, devices: list[str], formal_gas: float, timeout: float) -> list[dict]:
    """``run_import`` in a child of one OpenMP thread: a crash or a timeout is a row, with the runtime's last
    words."""
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, __file__, "child", str(folder), str(formal_gas), *devices],
                           capture_output=True, text=True, timeout=timeout, env=os.environ | {"OMP_NUM_THREADS": "1"})
    except subprocess.TimeoutExpired:
        return [{"device": "+".join(devices), "failure": f"timeout after {timeout:.0f} s"}]
    got = [line for line in p.stdout.splitlines() if line.startswith("[")]
    said = [line for line in (p.stderr + p.stdout).splitlines() if line.strip() and not line.startswith("[")]
    if p.returncode == 0 and got:
        return [r | {"seconds": round(time.perf_counter() - t, 1)} |
                ({"said": " | ".join(said[-3:])[:600]} if "failure" in r else {}) for r in json.loads(got[-1])]
    return [{"device": "+".join(devices), "failure": f"exit {p.returncode}: " + " | ".join(said[-3:])[:600]}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stage", choices=("import", "run", "child"))
    ap.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--models", help="the sweep's folder of float models (import)")
    ap.add_argument("--driver", choices=("more", "fourth", "text", "vision"),
                    help="the sweep that exported them (import)")
    ap.add_argument("--imports", help="the folder of imports")
    ap.add_argument("--only", nargs="+", help="file stems (import) or import names (run)")
    ap.add_argument("--weights", choices=("per-tensor", "per-channel", "both"), default="per-tensor")
    ap.add_argument("--held-out", type=int, default=2, help="held-out inputs per import (default 2)")
    ap.add_argument("--devices", nargs="+", default=["cpu", "formal"], choices=["cpu", "formal"])
    ap.add_argument("--formal-gas", type=float, default=2e9, help="FORMAL only below this gas (default 2e9)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per import and device (default 600)")
    ap.add_argument("--json", help="also write each row there, one JSON line")
    args = ap.parse_args()
    if args.stage == "child":
        print(json.dumps(run_import(Path(args.args[0]), args.args[2:], float(args.args[1]))))
        return
    from real_models import cpu
    print(f"CPU: {cpu()}; load {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    if args.stage == "import":
        driver = sources(args.driver)
        for path in sorted(Path(args.models).glob("*.onnx")):
            if args.only and path.stem not in args.only or split(path.stem)[0] not in driver:
                continue
            for pc in {"per-tensor": (False,), "per-channel": (True,), "both": (False, True)}[args.weights]:
                out = Path(args.imports) / f"{path.stem}-{'pc' if pc else 'pt'}"
                try:
                    r = import_one(path, driver, out, pc, args.held_out)
                except Exception as e:  # a crash of the product is a row of the sweep
                    r = {"model": path.stem, "per_channel": pc, "whole": False, "crash": f"{type(e).__name__}: {e}"[
                        :300]}
                rows.append(r)
                print(json.dumps(r | {"load_avg": round(os.getloadavg()[0], 1)}), flush=True)
    else:
        for folder in sorted(p.parent for p in Path(args.imports).glob(f"*/{INPUTS}")):
            if args.only and folder.name not in args.only:
                continue
            about = json.loads((folder / ABOUT).read_text()) | {"import": folder.name}
            for r in run_one(folder, args.devices, args.formal_gas, args.timeout):
                rows.append(about | r | {"load_avg": round(os.getloadavg()[0], 1)})
                print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
