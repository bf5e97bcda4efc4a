"""cvm-onnx's speed in one table: ResNet-20 on onnxruntime CPU (batch 1 and 64) and on the reference executor,
conversion times, a synthetic 25 M-parameter model's conversion (time and peak memory) and a 5,000-node chain.

Every onnxruntime result is first checked bit for bit against the reference executor. Latencies are the best
of five medians over many runs (``median_ms``); the load average is printed because other processes on the
machine change them. The serving form is timed with its convolutions' products in float32 and as integer
products (native im2col + MatMulInteger, ``cvm_onnx.native.cpu`` picks the operand types: the route and the CPU
features detected are printed, and which route each convolution took; the layout is the one the session takes:
remembered in the route cache for this model, CPU and threads, else measured, and the row says which), and also
with every one-group product as columns (``layout="columns"``), as rows of three nodes (``layout="rows"``), as
fused kernels (``layout="fused"``), as rows with every product uint8 x uint8, as fused kernels on their AVX2 route
(``cpu_layout.fused_convolutions(..., isa=2)``: what an AVX2-only CPU runs, timed on this one), and exported for
this machine's target run by plain onnxruntime (default options, the native library registered).

OpenVINO (the extra ``bench``; its rows are left out without it) on the same ResNet-20 where it can read the
export: the flat form and the serving form with float32 products (standard ONNX operators only), with the CPU
plugin's default inference precision hint (bf16 on a CPU with bf16) and with f32. The function form (cvm local
functions) and the serving form with integer products (cvm.native custom ops) it cannot read: their rows say
why. Each OpenVINO row gives the share of outputs equal to the reference executor's, not an assertion.

The CVM runtime: with the environment variable CVM_RUNTIME_LIB naming a local build of its library
(libcvm.so of CortexFoundation/cvm-runtime, built by hand; not part of this project), its CPU device is timed
side by side in the same process through its C API (output checked against the reference) and every ratio
is to that figure; otherwise to CVM_RUNTIME_MS, measured by hand on the README's machine.

ResNet-20 is the on-chain model where it is here (../shared/models/resnet20-cifar, or CVM_RESNET20), else the
stand-in of the same layers and shapes that models/resnet20/make.py generates.

Run: [CVM_RUNTIME_LIB=/path/libcvm.so] python benchmarks/bench.py [--model DIR] [--runs N] [--skip-big]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from cvm_onnx.app.api import load
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.batch import batched
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format import write_model
from cvm_onnx.native import cpu, library_path
from cvm_onnx.runtime import bulk
from cvm_onnx.runtime.sessions import LAYOUTS, session, usable_cpus
from cvm_onnx.serving import cpu_layout
from cvm_onnx.serving.target import Target

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.cvm_runtime import CvmRuntime  # noqa: E402  (the C API wrapper the tests use too)

_spec = importlib.util.spec_from_file_location("make_resnet20", Path(__file__).resolve().parents[1] / "models" /
                                               "resnet20" / "make.py")
make_resnet20 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_resnet20)
# The CVM runtime (CortexFoundation/cvm-runtime b5a2518, built with its own make target, -O3, OpenMP on both
# CPUs), ResNet-20 batch 1 through its C API, median of 2000 runs: measured on the 2-vCPU AMD EPYC of the
# README's table (CPU 7.33-7.61 ms, FORMAL 84 ms); the issue measured 8.05 and 84 ms on a Xeon.
CVM_RUNTIME_MS = {"CPU device": 7.47, "FORMAL device": 84.0}


def median_ms(fn, runs: int, warmup: int = 3, rounds: int = 5) -> float:
    """The lowest of ``rounds`` medians of ``runs // rounds`` timed calls (ms): a shared VM's neighbours slow
    whole stretches of seconds, and the best stretch is the figure that repeats."""
    for _ in range(warmup):
        fn()
    medians = []
    for _ in range(rounds):
        times = []
        for _ in range(max(1, runs // rounds)):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        medians.append(float(np.median(times)))
    return 1e3 * min(medians)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, onnxruntime {ort.__version__}, Python {platform.python_version()}"


def row(what: str, value: str, note: str = "") -> None:
    print(f"| {what:<44} | {value:>16} | {note} |")


def conv_routes(model, products: str) -> str:
    """How many convolutions start from integer products (and the operand types the session picks), are
    per-channel scales (their run's ``requantize`` multiplies) or take float32 products."""
    ops = [node.op_type for node in model.graph.node]
    scales = sum(any(a.name == "scales" for a in node.attribute) for node in model.graph.node)
    integer = ops.count("MatMulInteger") + sum(op.startswith("conv_requantize") for op in ops)
    return (f"convolutions: {integer} integer ({products}), {scales} per-channel "
            f"scales, {ops.count('Conv')} float32")


def resnet(model: Path, runs: int) -> None:
    graph = load(model).graph
    row("ResNet-20 load + validate", f"{median_ms(lambda: load(model), 10):.1f} ms")
    row("ResNet-20 export (function form)", f"{median_ms(lambda: to_onnx(graph), 10):.1f} ms")
    row("ResNet-20 export (optimized flat form)", f"{median_ms(lambda: to_onnx(graph, Target.default()), 5):.1f} ms")
    one = np.load(model / "input.npy").astype(np.int32)
    ref_ms = median_ms(lambda: execute(graph, {"data": one}), max(5, runs // 20))
    base, base_name = CVM_RUNTIME_MS["CPU device"], "the CVM CPU device's (by hand)"
    if os.environ.get("CVM_RUNTIME_LIB"):
        cvm = CvmRuntime(os.environ["CVM_RUNTIME_LIB"], model)
        assert np.array_equal(cvm.run(one).reshape(-1), execute(graph, {"data": one})[0].reshape(-1)), \
            "the CVM runtime differs from the reference"
        base, base_name = median_ms(lambda: cvm.run(one), runs), "the CVM CPU device's (same run)"
        row("ResNet-20 CVM runtime CPU device batch 1", f"{base:.2f} ms", f"its C API, {os.environ['CVM_RUNTIME_LIB']}")
    cpus = usable_cpus()
    for batch in (1, 64):
        data = np.concatenate([one, np.random.default_rng(0).integers(-127, 128, (batch - 1,) + one.shape[1:])])
        data = data.astype(np.int32)
        want = execute(batched(graph, batch), {"data": data})[0]
        forms = [("function form", {}, None, None, None)]
        for products in ("float", "integer"):
            for threads in sorted({1, cpus}):
                forms.append((f"optimized, {'integer' if products == 'integer' else 'float32'} products, {threads} "
                              "thread(s)", dict(target=Target(products=products)), threads, None, None))
        unit = cpus if batch > 1 else 1
        integer = dict(target=Target())
        forms.append((f"optimized, integer products as columns (no rows), {unit} thread(s)", integer, unit, None,
                      "columns"))
        forms.append((f"optimized, integer products as rows (3 nodes), {unit} thread(s)", integer, unit, None, "rows"))
        forms.append((f"optimized, fused kernels (their best ISA here), {unit} thread(s)", integer, unit, None,
                      "fused"))
        forms.append((f"optimized, rows all u8u8 (MLAS), {unit} thread(s)", integer, unit, "u8u8", "rows"))
        if "avx2" in cpu.features():
            forms.append((f"optimized, fused kernels on AVX2 only, {unit} thread(s)", integer, unit, None,
                          "fused AVX2"))
        forms.append((f"--target native on plain onnxruntime, {unit} thread(s)", dict(target=Target.native()), unit,
                      None, "plain"))
        for form, options, threads, products, layout in forms:
            onnx_model = to_onnx(graph, batch=batch, **options)
            if layout in ("fused AVX2", "plain"):  # a session of onnxruntime's own: conv.h's AVX2 kernels on this
                # CPU (an AVX2-only CPU's route), or the file exported for this machine as a user runs it
                served = onnx_model if layout == "plain" else cpu_layout.fused_convolutions(
                    cpu_layout.channels_last(onnx_model), isa=2)
                so = ort.SessionOptions()
                so.intra_op_num_threads = threads
                so.register_custom_ops_library(library_path())
                sess = ort.InferenceSession(served.SerializeToString(), so, providers=["CPUExecutionProvider"])
            else:
                sess = session(onnx_model, threads=threads, products=products, layout=layout)
            feeds = {"data": data}
            assert np.array_equal(sess.run(None, feeds)[0], want), "onnxruntime differs from the reference"
            ms = median_ms(lambda: sess.run(None, feeds), max(25, runs // batch))
            note = f"{batch / ms * 1e3:.0f} images/s, {base / (ms / batch):.1f}x {base_name}"
            routes = sess.get_modelmeta().custom_metadata_map.get("cvm.routes", "")
            chosen = next((k for k in LAYOUTS if f"{k} taken" in routes), Target.native().layout)
            layout = layout or chosen + (" (from the route cache)" if "from the route cache" in routes else
                                         " (measured at session creation)" if "measured at" in routes else "")
            integer = options.get("target") is not None and options["target"].products == "integer"
            row(f"ResNet-20 ORT batch {batch}, {form}", f"{ms:.2f} ms",
                note + (f"; {conv_routes(onnx_model, products or cpu.products())}, {layout}" if integer else "") +
                f"; load {os.getloadavg()[0]:.2f}")
        openvino(graph, batch, data, want, runs, base, base_name)
        if batch > 1:
            units(graph, data, want, base, base_name)
    if os.environ.get("CVM_RUNTIME_LIB"):
        with tempfile.TemporaryDirectory() as tmp:  # its throughput at batch 64, from the batched CVM model
            write_model(batched(graph, 64), Path(tmp))
            cvm64 = CvmRuntime(os.environ["CVM_RUNTIME_LIB"], Path(tmp))
            ms = median_ms(lambda: cvm64.run(data), 6, warmup=1, rounds=2)
            row("ResNet-20 CVM runtime CPU device batch 64", f"{ms:.1f} ms",
                f"{64 / ms * 1e3:.0f} images/s, against {1e3 / base:.0f} images/s at batch 1")
    row("ResNet-20 reference executor batch 1", f"{ref_ms:.1f} ms", "numpy, FORMAL semantics")
    for name, ms in CVM_RUNTIME_MS.items():
        row(f"ResNet-20 CVM runtime {name} batch 1", f"{ms:.2f} ms", "its C API, measured by hand (see above)")


def openvino(graph, batch: int, data: np.ndarray, want: np.ndarray, runs: int, base: float, base_name: str) -> None:
    """ResNet-20 on OpenVINO's CPU plugin (one thread at batch 1, every usable CPU at batch 64), each form it reads
    at its default precision hint and at f32, the share of outputs equal to the reference stated."""
    try:
        import openvino as ov
    except ImportError:
        if batch == 1:
            row("ResNet-20 on OpenVINO", "-", "OpenVINO is not installed (pip install -e \".[bench]\"): left out")
        return
    core, threads = ov.Core(), 1 if batch == 1 else usable_cpus()
    default = core.get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    version = ov.__version__.split("-")[0]
    forms = [("function form", {}), ("flat form", dict(inline=True)),
             ("serving form, float32 products", dict(target=Target(products="float"))),
             ("serving form, integer products", dict(target=Target()))]
    for form, options in forms:
        with tempfile.TemporaryDirectory() as tmp:
            onnx.save(to_onnx(graph, batch=batch, **options), Path(tmp) / "model.onnx")
            try:
                model = core.read_model(str(Path(tmp) / "model.onnx"))
            except RuntimeError as e:
                lines = [line.strip("- ") for line in str(e).splitlines()]
                why = next((line for line in lines if line.startswith("No conversion rule")), lines[-1])
                row(f"ResNet-20 OpenVINO {version} batch {batch}, {form}", "-", f"OpenVINO cannot read it: {why}")
                continue
        for precision in (None, "f32"):
            config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
            if precision:
                config["INFERENCE_PRECISION_HINT"] = precision
            request = core.compile_model(model, "CPU", config).create_infer_request()
            feeds = {0: data}
            request.infer(feeds)
            equal = float((request.get_output_tensor(0).data.reshape(want.shape) == want).mean())
            ms = median_ms(lambda: request.infer(feeds), max(25, runs // batch))
            row(f"ResNet-20 OpenVINO {version} batch {batch}, {form}, precision hint {precision or default}",
                f"{ms:.2f} ms", f"{batch / ms * 1e3:.0f} images/s, {base / (ms / batch):.1f}x {base_name}; "
                f"{equal:.2%} of outputs equal to the reference; {threads} thread(s); load {os.getloadavg()[0]:.2f}")


def units(graph, data: np.ndarray, want: np.ndarray, base: float, base_name: str) -> None:
    """The batch through ``bulk.Runner.units`` (what ``run_many`` and ``cvm-onnx run`` do with an ONNX model):
    units of ``chunk`` samples, one per usable CPU at once on one session, one onnxruntime thread each."""
    workers = usable_cpus()
    for chunk in (4, 8, 16):
        p = bulk.plan(to_onnx(graph, Target.default(), batch=chunk), chunk, threads=1)
        runner, samples = bulk.Runner(p), bulk.samples(data, p.sample)
        got = np.concatenate([outs[0] for _, outs in runner.units(samples, chunk, workers)])
        assert np.array_equal(got.reshape(want.shape), want), "the units differ from the reference"
        ms = median_ms(lambda: [None for _ in runner.units(samples, chunk, workers)], 25)
        row(f"ResNet-20 {len(data)} images in units of {chunk}, {workers} worker(s)", f"{ms:.2f} ms",
            f"{len(data) / ms * 1e3:.0f} images/s, {base / (ms / len(data)):.1f}x {base_name}; integer products, "
            f"serving form; load {os.getloadavg()[0]:.2f}")


def big_model(directory: Path, units=(4096, 4096, 2048, 10)) -> int:
    """A dense model of int8 weights (the CVM's usual storage) with ~25 M params; returns its param count."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("data", (1, units[0]), 8)
    for i, (k, u) in enumerate(zip(units[:-1], units[1:])):
        w = b.param(f"w{i}", rng.integers(-127, 128, (u, k), dtype=np.int8), 8)
        x = b.op("dense", x, w, b.param(f"b{i}", rng.integers(-1000, 1000, (u,)), 16), units=u)
        if i < len(units) - 2:
            x = b.op("relu", b.op("cvm_right_shift", x, shift_bit=16, precision=8))
    graph = b.build(x)
    write_model(graph, directory)
    return sum(v.size for v in graph.params.values())


def chain_model(directory: Path, ops: int) -> None:
    """conv2d -> cvm_right_shift -> relu, repeated: ``ops`` op nodes (plus a weight per conv2d)."""
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input("data", (1, 4, 8, 8), 8)
    for k in range(ops // 3):
        w = b.param(f"w{k}", rng.integers(-127, 128, (4, 4, 3, 3)), 8)
        x = b.op("conv2d", x, w, channels=4, kernel_size=(3, 3), padding=(1, 1), use_bias=False)
        x = b.op("relu", b.op("cvm_right_shift", x, shift_bit=8, precision=8))
    write_model(b.build(x), directory)


CONVERT = """
import sys, time
from pathlib import Path
def memory():
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024
from cvm_onnx.app.api import load, to_onnx, write_onnx
base, _ = memory()
t0 = time.perf_counter()
graph = load(sys.argv[1]).graph
t1 = time.perf_counter()
model = to_onnx(graph)
del graph
t2 = time.perf_counter()
write_onnx(model, sys.argv[2])
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2, memory()[1] - base)
"""


def convert_in_subprocess(src: Path, dst: Path) -> tuple[float, float, float, float]:
    """(load + validate s, export s, serialize + write s, peak memory above the start in MiB), in a fresh
    process so the peak is this conversion's."""
    out = subprocess.run([sys.executable, "-c", CONVERT, str(src), str(dst)], check=True, capture_output=True,
                         text=True).stdout.split()
    return tuple(float(v) for v in out)  # type: ignore[return-value]


def conversions(tmp: Path) -> None:
    params = big_model(tmp / "big")
    size = (tmp / "big" / "params").stat().st_size / 2**20
    read, export, write, peak = convert_in_subprocess(tmp / "big", tmp / "big.onnx")
    row(f"{params / 1e6:.1f} M-param model: load + validate", f"{read:.2f} s", f"params file {size:.1f} MiB (int8)")
    row(f"{params / 1e6:.1f} M-param model: export", f"{export:.2f} s")
    row(f"{params / 1e6:.1f} M-param model: serialize + write", f"{write:.2f} s",
        f"total {read + export + write:.2f} s")
    row(f"{params / 1e6:.1f} M-param model: peak memory", f"{peak:.0f} MiB", f"{peak / size:.1f}x the params file")
    totals = {}
    for ops in (1251, 5001):
        chain_model(tmp / f"chain{ops}", ops)
        totals[ops] = float(np.median([sum(convert_in_subprocess(tmp / f"chain{ops}", tmp / "chain.onnx")[:3])
                                       for _ in range(3)]))
    row("1,250-op chain: convert", f"{totals[1251]:.2f} s")
    row("5,000-op chain: convert", f"{totals[5001]:.2f} s", f"{totals[5001] / totals[1251]:.1f}x for 4x the nodes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="ResNet-20 model directory (with input.npy; default: the "
                        "on-chain one at ../shared/models/resnet20-cifar or CVM_RESNET20, else the stand-in "
                        "models/resnet20/make.py generates)")
    parser.add_argument("--runs", type=int, default=400, help="runs per batch-1 latency (fewer for batch 64)")
    parser.add_argument("--skip-big", action="store_true", help="leave out the 25 M-param and 5,000-node models")
    args = parser.parse_args()
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f}")
    print(f"CPU features (CPUID, enabled by the OS): {', '.join(cpu.features()) or 'none detected'}; integer "
          f"products as {cpu.products()} (uint8 x int8 where exact: every product with VNNI/AMX and the "
          f"saturation probe ({cpu.unbounded()}), else the rows of x >= 0)")
    print(f"| {'what':<44} | {'median':>16} | note |")
    print(f"|{'-' * 46}|{'-' * 18}|------|")
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or make_resnet20.resnet20(Path(tmp) / "resnet20")
        if model != make_resnet20.ONCHAIN and args.model is None:
            print(f"(the on-chain ResNet-20 is absent ({make_resnet20.ONCHAIN}): timing the stand-in of the same "
                  "layers and shapes that models/resnet20/make.py generates; the CVM runtime's by-hand figures "
                  "are the on-chain model's)")
        if model.exists():
            resnet(model, args.runs)
        else:
            print(f"(no ResNet-20 model at {model}: skipped)")
        if not args.skip_big:
            conversions(Path(tmp))
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
