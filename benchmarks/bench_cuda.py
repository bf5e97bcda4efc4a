"""ResNet-20 on a GPU: every exported form on onnxruntime's CUDA provider, beside the CPU provider and beside
PyTorch (float32, TF32 off) on the same shapes, at batch 1, 64 and 1024.

Forms: function (as exported), flat (``--inline``), the CPU serving form (``--optimize``) and the CUDA serving
form (``--provider cuda``: every node a CUDA kernel, convolutions as int8 x int8 products). Every call goes
through IO binding (``sessions.Bound``: the input copied to the GPU once, every output kept there until the
call ends; the copies are in the times); the CUDA form also with a CUDA graph. Forms that keep Conv are timed
with cuDNN's algorithm search DEFAULT (implicit GEMM, exact by construction) and HEURISTIC (cuDNN's fastest
guess, which may round): each result is first checked bit for bit against the reference executor, and a form
that is not exact is reported as such and not timed. Latencies are the best of five medians; images/s is the
batch over that latency.

Prints the GPU (name, driver), onnxruntime's version and the CPU (model and its avx2/avx512_vnni/amx flags).
Where onnxruntime has no usable CUDA provider it says so and stops (``--cpu`` still times the CPU provider).

``--profile`` adds, for the CUDA serving form at each batch, the time per op type from onnxruntime's profile (the
calls after the first three): the host's time in each node, which for asynchronous CUDA kernels is their launch,
or their wait where a node synchronizes.

Run: python benchmarks/bench_cuda.py [--model DIR] [--batches 1,64,1024] [--forms NAME,...] [--runs N] [--cpu]
[--no-torch] [--profile]
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from cvm_onnx.app.api import load
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.batch import batched
from cvm_onnx.core.errors import RuntimeFailure
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.placement import without_cuda_kernel
from cvm_onnx.runtime.sessions import Bound, cuda_status, session
from cvm_onnx.serving.target import Target

from bench import median_ms  # benchmarks/ is the script's folder on sys.path

RESNET = Path(__file__).resolve().parents[2] / "shared" / "models" / "resnet20-cifar"
FORMS = {
    "function": dict(),
    "flat": dict(inline=True),
    "serving (cpu)": dict(target=Target.default()),
    "serving (cuda)": dict(target=Target("cuda")),
}


def cpu_line() -> str:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    names = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")]
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    shown = [f for f in ("avx2", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    return f"CPU: {names[0] if names else platform.processor()}, {len(names)} CPUs, flags {' '.join(shown) or '-'}"


def gpu_line() -> str:
    if shutil.which("nvidia-smi") is None:
        return "GPU: nvidia-smi not found"
    done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                          capture_output=True, text=True)
    return f"GPU: {done.stdout.strip() or done.stderr.strip()}"


def row(*cells) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |")


def timed(model, provider: str, data: np.ndarray, want: list[np.ndarray], runs: int, batch: int,
          **options) -> str:
    """'ms (images/s)' of the model on ``provider`` through IO binding, or why it was not timed."""
    try:
        sess = session(model, provider, **options)
        call = Bound(sess)
        got = call({sess.get_inputs()[0].name: data})
    except RuntimeFailure as e:
        return f"not run: {e}"
    if not all(np.array_equal(g, w) for g, w in zip(got, want)):
        return "NOT EXACT (not timed)"
    ms = median_ms(lambda: call({sess.get_inputs()[0].name: data}), runs)
    return f"{ms:.3f} ms ({batch / ms * 1e3:,.0f} img/s)"


def torch_ms(graph, data: np.ndarray, runs: int) -> str:
    """PyTorch on the GPU, float32 with TF32 off, a network of the CVM graph's shapes: its conv2d and dense
    layers with the same weights as floats, relu and the additions; the integer requantization steps
    (shifts, clips, scalar multiplies) become identities or float multiplies. Not exact: a speed reference."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return "torch not installed"
    if not torch.cuda.is_available():
        return "torch sees no GPU"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    params = {k: torch.tensor(v.astype(np.float32), device=dev) for k, v in graph.params.items()}

    def forward(x):
        values = {}
        for i, node in enumerate(graph.nodes):
            ins = [values[(e.node, e.index)] for e in node.inputs]
            a = node.attrs
            if node.is_variable:
                out = params.get(node.name, x)
            elif node.op == "conv2d":
                out = F.conv2d(ins[0], ins[1], ins[2] if len(ins) > 2 else None, tuple(a.get("strides", (1, 1))),
                               tuple(a.get("padding", (0, 0))), tuple(a.get("dilation", (1, 1))), a.get("groups", 1))
            elif node.op == "dense":
                out = F.linear(ins[0], ins[1], ins[2] if len(ins) > 2 else None)
            elif node.op == "relu":
                out = F.relu(ins[0])
            elif node.op in ("elemwise_add", "broadcast_add"):
                out = ins[0] + ins[1]
            elif node.op == "broadcast_mul":
                out = ins[0] * ins[1]
            elif node.op in ("cvm_right_shift", "cvm_clip", "clip", "cvm_left_shift"):
                out = ins[0]
            elif node.op == "flatten":
                out = ins[0].flatten(1)
            elif node.op == "sum":
                out = ins[0].sum(dim=tuple(a["axis"]), keepdim=bool(a.get("keepdims", False)))
            else:
                raise NotImplementedError(node.op)
            values[(i, 0)] = out
        return [values[(h.node, h.index)] for h in graph.heads]

    x = torch.tensor(data.astype(np.float32), device=dev)
    try:
        with torch.no_grad():
            forward(x)
            torch.cuda.synchronize()

            def call():
                forward(x)
                torch.cuda.synchronize()

            ms = median_ms(call, runs)
    except NotImplementedError as e:
        return f"op {e} not mapped"
    return f"{ms:.3f} ms ({len(data) / ms * 1e3:,.0f} img/s)"


def profiled(model, data: np.ndarray, runs: int = 20, warmup: int = 3) -> list[str]:
    """Per op type: node time per call (us), provider and node count, from onnxruntime's profile of ``runs`` calls
    after ``warmup`` (the first calls load kernels and pick cuBLAS algorithms)."""
    sess = session(model, "cuda", profile=str(Path(tempfile.gettempdir()) / "bench_cuda"))
    call = Bound(sess)
    for _ in range(warmup + runs):
        call({sess.get_inputs()[0].name: data})
    events = json.loads(Path(sess.end_profiling()).read_text())
    calls = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    start = calls[warmup] if len(calls) > warmup else 0
    spent: dict[tuple[str, str], list[int]] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
            spent.setdefault((e["args"]["op_name"], e["args"]["provider"]), []).append(e["dur"])
    total = sum(sum(v) for v in spent.values()) / runs
    lines = [f"node time per call, {total:.0f} us in all (onnxruntime profile, {runs} calls after {warmup}):"]
    for (op, provider), durs in sorted(spent.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"  {op:16s} {provider:24s} {sum(durs) / runs:9.1f} us  {len(durs) // runs} node(s)")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=RESNET)
    ap.add_argument("--batches", default="1,64,1024")
    ap.add_argument("--forms", default=",".join(FORMS), help="which forms, in this order")
    ap.add_argument("--profile", action="store_true", help="the CUDA serving form's GPU time per op type")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--cpu", action="store_true", help="also time onnxruntime's CPU provider")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()

    print(f"onnxruntime {ort.__version__} ({', '.join(ort.get_available_providers())}), Python "
          f"{platform.python_version()}")
    print(gpu_line())
    print(cpu_line())
    status = cuda_status()
    print(status)
    cuda = status.startswith("CUDA: usable here")
    if not cuda:
        print("CUDA is unavailable here: nothing to time on the GPU" + ("" if args.cpu else
              " (--cpu times the CPU provider)"))
        if not args.cpu:
            return 0
    graph = load(args.model).graph
    input_shape = graph.nodes[graph.inputs[0]].outputs[0].shape
    row("batch", "form", "provider", "cuDNN search", "latency (throughput)", "nodes without a CUDA kernel")
    row(*["---"] * 6)
    for batch in (int(b) for b in args.batches.split(",")):
        g = batched(graph, batch) if batch > 1 else graph
        data = np.random.default_rng(batch).integers(-127, 128, (batch, *input_shape[1:])).astype(np.int32)
        t = time.perf_counter()
        want = execute(g, {"data": data})
        print(f"(reference executor, batch {batch}: {time.perf_counter() - t:.1f} s)", file=sys.stderr)
        runs = max(5, args.runs // max(1, batch // 64))
        for name in args.forms.split(","):
            how = FORMS[name]
            model = to_onnx(graph, batch=batch if batch > 1 else None, **how)
            missing = len(without_cuda_kernel(model))
            if cuda:
                searches = ["-"] if how.get("provider") == "cuda" else ["DEFAULT", "HEURISTIC"]
                for search in searches:
                    options = {} if search == "-" else {"conv_search": search}
                    row(batch, name, "cuda", search, timed(model, "cuda", data, want, runs, batch, **options), missing)
                if how.get("provider") == "cuda":
                    row(batch, name, "cuda graph", "-", timed(model, "cuda", data, want, runs, batch, cuda_graph=True),
                        missing)
            if args.cpu:
                row(batch, name, "cpu", "-", timed(model, "cpu", data, want, runs, batch), "")
        if cuda and args.profile:
            print("\n".join(profiled(to_onnx(graph, Target("cuda"), batch=batch if batch > 1 else None), data)))
        if cuda and not args.no_torch:
            row(batch, "PyTorch fp32 (TF32 off)", "cuda", "cudnn.benchmark", torch_ms(graph, data, runs), "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
