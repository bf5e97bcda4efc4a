"""The importer's time and memory on a ViT-S-like encoder (issue 35's target: a 100 MB transformer within 60 s
and 2x its size in memory on 2 cores, ``--per-channel`` within 2x the default's time).

The float model is tests/support/transformers.py's ``encoder`` at ViT-S/16's dimensions (197 tokens, d 384,
6 heads, MLP 1536; 12 layers: 85 MB, 81 MiB, of float weights), quantized by quantize_static (QDQ, uint8 activations,
int8 weights, minmax on a few normal samples) through ``cvm_onnx.app.quantize``'s own pre-processing, per tensor
and per channel; each quantized model is cached in the work folder. Each import runs in a fresh process (so its
peak RSS is its own): ``import_model``, then ``validate``, timed apart, and the sha256 of the files written
(symbol, params, quantization.json), so two checkouts' imports can be compared byte for byte. ``--repeat``
alternates the forms. ``--whole``: the whole ``cvm_onnx.app.quantize.quantize`` of the float model instead (as
``cvm-onnx quantize`` runs it, on ``--samples`` samples; ``--model DIR``: of DIR/float.onnx on DIR/calibration.npy),
timed stage by stage from its progress reports (``models=False``, as the CLI runs it), with each stage's own peak
RSS (VmHWM reset at its start), the peak of the whole, the RSS after the imports (the interpreter's baseline) and
the sha256 of the files written (the CVM model's and the quantized ONNX model); a form may name the calibration
method (``--forms pt,pc-entropy``). First, as the yardstick, onnxruntime alone: the peak of a process that
imports numpy and onnxruntime only and runs one default CPU session of the float model on one sample.
Peaks are /proc's VmHWM of the child alone, in MiB.

Run: python benchmarks/transformer_import.py [--layers 12] [--samples 4] [--repeat 1] [--work DIR] [--profile N]
[--whole [--model DIR]]
(``--profile N``: print cProfile's N most costly functions of the import, cumulative)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
DIMS = dict(s=197, d=384, heads=6, ff=1536)


def quantized(work: Path, layers: int, samples: int, per_channel: bool) -> Path:
    """The QDQ model of the ``layers``-layer encoder in ``work`` (built once)."""
    out = work / f"vit{layers}_{'pc' if per_channel else 'pt'}.onnx"
    if out.exists():
        return out
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from support.transformers import encoder

    from cvm_onnx.app.quantize import _quantize_static, _Reader, _stamp, prepare, quiet_onnxruntime

    model = encoder(seed=0, layers=layers, **DIMS)
    rng = np.random.default_rng(0)
    data = rng.normal(size=(samples, 1, DIMS["s"], DIMS["d"])).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp, quiet_onnxruntime():
        prepared = Path(tmp) / "prepared.onnx"
        prepare(model, prepared)
        _quantize_static(prepared, out, _Reader("x", data, data.shape[1:], None), per_channel, False, "minmax",
                         "uint8", "qdq", prepared)
        _stamp(out)
    return out


def peak_mb() -> float:
    """This process's peak RSS (MB): /proc's VmHWM, which starts afresh at exec (ru_maxrss keeps the forking
    parent's peak across exec, so a child started by a large parent would report the parent's)."""
    try:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM"))
        return int(line.split()[1]) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(path: str, profile: int) -> None:
    """Import ``path`` in this process; print one JSON line: seconds per stage, peak RSS (MB), digest."""
    if path.endswith(".whole"):
        return whole(path[:-len(".whole")])
    from cvm_onnx.converters.from_onnx import import_model
    from cvm_onnx.core.format.model_dir import write_model
    from cvm_onnx.core.validate import validate

    t0 = time.perf_counter()
    model = onnx.load(path)
    t1 = time.perf_counter()
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        imported = prof.runcall(import_model, model)
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(profile)
    else:
        imported = import_model(model)
    t2 = time.perf_counter()
    graph = validate(imported.graph).graph
    t3 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        write_model(graph, tmp, edges=imported.edges)
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(Path(tmp).iterdir()))).hexdigest()
    peak = peak_mb()
    print(json.dumps(dict(load=t1 - t0, import_=t2 - t1, validate=t3 - t2, peak_mb=peak, nodes=len(graph.nodes),
                          digest=digest)))


def whole(tag: str) -> None:
    """``quantize`` of the float model in the folder ``tag`` names (float.onnx, calibration.npy), per channel where
    its form starts with "pc", with the calibration method after a "-" (``pc-entropy``); one JSON line: per stage in
    order its seconds and its own peak RSS (MiB: VmHWM, reset at each stage's start where /proc allows), the peak
    of the whole, and the sha256 of the files written (the CVM model's and the quantized ONNX model)."""
    from cvm_onnx.app.quantize import quantize

    base = peak_mb()
    work, form = tag.rsplit(".", 1)
    form, _, method = form.partition("-")
    stages: list[list] = [["loading", time.perf_counter(), 0.0]]
    top = [base]

    def end_stage() -> None:
        stages[-1][2] = peak_mb()
        top[0] = max(top[0], stages[-1][2])
        reset_peak()

    def progress(done, total, what):
        if stages[-1][0] != what:
            end_stage()
            stages.append([what, time.perf_counter(), 0.0])

    reset_peak()
    with tempfile.TemporaryDirectory() as tmp:
        quantize(Path(work) / "float.onnx", Path(work) / "calibration.npy", Path(tmp) / "m",
                 per_channel=form.startswith("pc"), method=method or "minmax", save_onnx=Path(tmp) / "q.onnx",
                 progress=progress, models=False)
        end_stage()
        files = sorted((Path(tmp) / "m").iterdir()) + [Path(tmp) / "q.onnx"]
        digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in files}
    ends = [t for _, t, _ in stages[1:]] + [time.perf_counter()]
    times = {w: (e - t, p) for (w, t, p), e in zip(stages, ends)}
    print(json.dumps(dict(stages=times, peak_mb=top[0], base_mb=base, digests=digests)))


def reset_peak() -> None:
    """VmHWM reset to the present RSS (Linux's clear_refs 5); where it cannot be, peaks accumulate."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "cvm_onnx_transformer_import")
    ap.add_argument("--forms", default="pt,pc", help="pt (per tensor), pc (per channel), comma-separated; with "
                    "--whole, each may name a calibration method after a '-' (pt-entropy)")
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--whole", action="store_true", help="time the whole quantize, stage by stage")
    ap.add_argument("--model", type=Path, help="with --whole: a folder holding float.onnx and calibration.npy to "
                    "quantize instead of the encoder")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.profile)
    a.work.mkdir(parents=True, exist_ok=True)
    forms = a.forms.split(",")
    if a.whole:
        return main_whole(a, forms)
    models = {f: quantized(a.work, a.layers, a.samples, f == "pc") for f in forms}
    weights = 4 * sum(int(np.prod(t.dims)) for t in onnx.load(models[forms[0]]).graph.initializer
                      if len(t.dims) == 2) / 2**20
    print(f"{a.layers}-layer ViT-S-like encoder ({weights:.0f} MB of float weights); load {os.getloadavg()[0]:.2f}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for _ in range(a.repeat):
        for f in forms:
            load = os.getloadavg()[0]
            r = subprocess.run([sys.executable, __file__, "--child", str(models[f]), "--profile", str(a.profile)],
                               env=env, capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"{f}: import failed\n{r.stderr[-4000:]}")
            if a.profile:
                print(r.stderr)
            m = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"{f}: load {m['load']:.1f} s, import {m['import_']:.1f} s, validate {m['validate']:.1f} s, "
                  f"peak {m['peak_mb']:.0f} MB, {m['nodes']} nodes, digest {m['digest'][:16]} (loadavg {load:.2f})")


ONNXRUNTIME_ALONE = """
import json, sys
import numpy as np
import onnxruntime as ort
def hwm():
    return next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM")) / 1024
base = hwm()
s = ort.InferenceSession(sys.argv[1] + "/float.onnx", providers=["CPUExecutionProvider"])
x = np.load(sys.argv[1] + "/calibration.npy", mmap_mode="r")[0]
s.run(None, {s.get_inputs()[0].name: np.ascontiguousarray(x)})
print(json.dumps([hwm(), base]))
"""


def main_whole(a, forms: list[str]) -> None:
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from support.transformers import encoder

    work = a.model or a.work / f"whole{a.layers}_{a.samples}"
    work.mkdir(exist_ok=True)
    if not a.model and not (work / "float.onnx").exists():
        onnx.save(encoder(seed=0, layers=a.layers, **DIMS), work / "float.onnx")
        rng = np.random.default_rng(0)
        np.save(work / "calibration.npy", rng.normal(size=(a.samples, 1, DIMS["s"], DIMS["d"])).astype(np.float32))
    size = (work / "float.onnx").stat().st_size / 2**20
    what = f"{work / 'float.onnx'}" if a.model else f"the {a.layers}-layer ViT-S-like encoder"
    samples = len(np.load(work / "calibration.npy", mmap_mode="r"))
    print(f"quantize of {what} ({size:.1f} MiB), {samples} samples; load {os.getloadavg()[0]:.2f}")
    r = subprocess.run([sys.executable, "-c", ONNXRUNTIME_ALONE, str(work)], capture_output=True, text=True,
                       check=True)
    print("onnxruntime alone (numpy and onnxruntime imported, one default CPU session of the float model, one "
          "run of one sample): peak {:.0f} MiB, {:.0f} MiB after imports".format(*json.loads(r.stdout)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for _ in range(a.repeat):
        for f in forms:
            load = os.getloadavg()[0]
            r = subprocess.run([sys.executable, __file__, "--child", f"{work}.{f}.whole"], env=env,
                               capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"{f}: quantize failed\n{r.stderr[-4000:]}")
            m = json.loads(r.stdout.strip().splitlines()[-1])
            parts = ", ".join(f"{w} {t:.1f} s (peak {p:.0f} MiB)" for w, (t, p) in m["stages"].items())
            print(f"{f}: {sum(t for t, _ in m['stages'].values()):.1f} s: {parts}; peak {m['peak_mb']:.0f} MiB, "
                  f"{m['base_mb']:.0f} MiB after imports (loadavg {load:.2f}); sha256 "
                  + ", ".join(f"{k} {v}" for k, v in m["digests"].items()))


if __name__ == "__main__":
    main()
