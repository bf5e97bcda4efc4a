"""A longer fuzz run over the reliability properties of tests/core/test_reliability.py and
tests/from_onnx/test_hostile_onnx.py.

The same mutations (symbol, attributes, params, ONNX models; ResNet-20 when the shared model is present; ``storage``:
graphs past the runtime's 2^32-byte storage bound, ``storage_seeds``) and the
same check: every outcome is success or a CVMError, within the time and memory bounds. Unlike the tests, a run
does not stop at the first failure: it counts the inputs tried and groups failures by signature (exception type
and the innermost project frame), printing one example of each.

The ``*-files`` and ``*-rules`` targets are hostile .onnx files (the reliability mutations of whole files; the
attribute and input-name mutations of every import rule's op type, seeded by onnx's backend node tests and the
exporter's models, or by an exported ResNet-20), each given to ``convert`` and to ``run`` in a child process, so
a signal or a hang is counted as an outcome rather than ending the run; the counts by outcome are printed.
``quantized`` is the same for models onnxruntime.quantization writes (tests/support/hostile_quantized.py: QDQ
and QOperator, per tensor and per channel, uint8 and int8, dynamic), mutated in their quantization parameters,
QLinear inputs, weight types and input shapes or generically; every import is exported back and verified exact;
``recent`` is the same for the seeds of the forms added lately alone (``HQ.recent_seeds``), ``latest`` for those
of the forms added last (``HQ.latest_seeds``), ``norms-masks`` for those of the decoder masks, normalizations,
Casts, images and long grouped convolutions among them (``HQ.NORMS_AND_MASKS``), ``newest`` for those of GeM
pooling, roots, wide-row norms, GPT-2's eager and the slice-assigned masks, masked ReduceLogSumExp, the Celu, Shrink
and ThresholdedRelu tables, Where of two grids, Sum, Mean, ReverseSequence and far-zero quotients (``HQ.NEWEST``),
``newest13`` for those of AveragePool ceil_mode, nearest Resize to any size, CumSum, Trilu, Hardmax, GlobalLpPool,
3-D Conv and MaxPool of one frame, an empty slice concatenated, 32768-value norm rows and an attention bias of
masking rows, QDQ and QOperator (``HQ.newest13_seeds``); ``newest14`` for those of a Div through the input's identity
Transpose, the max of a nondecreasing function, GatherND, ceil_mode AveragePool as the mean, Resize at ties, 3-D
Conv, MaxPool and AveragePool over depth taps, a norm near float32's bound, GRN, a rank-2 STFT, T5's Where-masked bias,
rank-3 MatMul weights and a causal matrix of 16 tokens (``HQ.newest14_seeds``); ``newest15`` for those of a sum's
constant term at its zero point, DeBERTa's joint mask key, 1-D and 3-D AveragePool, a Where of a constant condition,
LpPool, LpNormalization p = 1, ReduceLogSum, an L2 norm near float32's bound, (1, K, N) MatMul weights, a
ConvTranspose's lattice and recurrent layers carrying their states (``HQ.newest15_seeds``); ``newest16`` for those
of LRN, 3-D and sized ConvTranspose, ReduceProd, a Pad off the grid, RWKV's Max rules, a Where of a constant off the
grid, a comparison at float32's threshold, a saturating requantization, Longformer's windows and masked fills, the
WKV recurrence and skl2onnx's linear classifiers (``HQ.newest16_seeds``); ``newest18`` for those of masked mean and
max pooling, a function of a sum on two grids, antialiased and cubic Resize, the float tails and a Sub cancelling a
term, their bounds also set at their edges (``HQ.newest18_seeds``). A refusal stating a CVM op's own rule rather than
the ONNX node's is a failure (``HQ.cvm_rule``).
``quantize`` gives ``cvm-onnx quantize`` mutated float models and calibration sets, ``quantize-latest`` those of the
forms added last (``HQ.LATEST_FLOAT``), ``quantize-norms-masks`` those of the norms-masks seeds
(``HQ.NORMS_AND_MASKS_FLOAT``), ``quantize-newest13`` those of the newest13 forms (``HQ.NEWEST13_FLOAT``),
``quantize-newest14`` those of the newest14 forms (``HQ.NEWEST14_FLOAT``), ``quantize-newest15`` those of the
newest15 forms (``HQ.NEWEST15_FLOAT``), ``quantize-newest16`` those of the newest16 forms (``HQ.NEWEST16_FLOAT``),
``quantize-newest17`` weight-only models (MatMulNBits, GatherBlockQuantized: ``HQ.NEWEST17_FLOAT``).
``layouts`` loads the packed seeds' model directories with their quantization.json edited and runs them on mutated
named inputs (.npz): the outputs must be those of the directory's own layout, or the edit refused
(``HQ.check_layout``). Each child may add CHILD_MEMORY to its address space; a case gets CASE_SECONDS.

    python benchmarks/fuzz.py --minutes 5              # all targets, time split evenly
    python benchmarks/fuzz.py --minutes 2 onnx params  # some targets
    python benchmarks/fuzz.py --count 10000 onnx-rules onnx-files resnet-rules resnet-files   # a fixed number
    nice python benchmarks/fuzz.py --count 10000 quantized                                    # the quantized front
"""
from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), *(str(ROOT / "tests" / d) for d in ("", "core", "from_onnx"))]
import test_hostile_onnx as H  # noqa: E402
import test_reliability as R  # noqa: E402
import test_storage_plan as S  # noqa: E402
from conftest import RESNET  # noqa: E402
from support import hostile_quantized as HQ  # noqa: E402

CASE_SECONDS = 60  # a child that answers no case within this is a hang
CHILD_MEMORY = 4 << 30  # address space a child may add to what it holds once started (a blow-up fails there)

TARGETS = {
    "symbols": (lambda: R.mutated_symbols(R.SEEDS), R.check_cvm),
    "attributes": (lambda: R.mutated_attributes(R.SEEDS), R.check_cvm),
    "params": (lambda: R.mutated_params(R.SEEDS), R.check_cvm),
    "onnx": (lambda: R.mutated_onnx(R.ONNX_SEEDS), R.check_onnx),
    "resnet": (lambda: R.mutated_symbols(R.resnet_seeds(RESNET)) | R.mutated_attributes(R.resnet_seeds(RESNET))
               | R.mutated_params(R.resnet_seeds(RESNET)), R.check_cvm),
    "resnet-onnx": (lambda: R.mutated_onnx(R.resnet_onnx_seeds(RESNET)), R.check_onnx),
    "storage": (lambda: R.mutated_symbols(storage_seeds()) | R.mutated_attributes(storage_seeds()), R.check_cvm),
}
#: Hostile .onnx files through convert and run in a child process (``Child``).
CHILD_TARGETS = {
    "onnx-files": lambda: R.mutated_onnx(R.ONNX_SEEDS),
    "onnx-rules": lambda: H.mutated_nodes(H.rule_seeds()),
    "resnet-files": lambda: R.mutated_onnx(R.resnet_onnx_seeds(RESNET)),
    "resnet-rules": lambda: H.mutated_nodes(R.resnet_onnx_seeds(RESNET)),
    "quantized": lambda: HQ.mutated(HQ.seeds()),
    "recent": lambda: HQ.mutated(HQ.recent_seeds()),
    "latest": lambda: HQ.mutated(HQ.latest_seeds()),
    "norms-masks": lambda: HQ.mutated({k: v for k, v in HQ.latest_seeds().items()
                                       if k.split("/")[0] in HQ.NORMS_AND_MASKS}),
    "newest": lambda: HQ.mutated({k: v for k, v in HQ.latest_seeds().items() if k.split("/")[0] in HQ.NEWEST}),
    "newest13": lambda: HQ.mutated(HQ.newest13_seeds()),
    "newest14": lambda: HQ.mutated(HQ.newest14_seeds()),
    "newest15": lambda: HQ.mutated(HQ.newest15_seeds()),
    "newest16": lambda: HQ.mutated(HQ.newest16_seeds()),
    "newest18": lambda: HQ.mutated(HQ.newest18_seeds()),
    "quantize": lambda: HQ.mutated_calibration(),
    "quantize-latest": lambda: HQ.mutated_calibration(HQ.LATEST_FLOAT),
    "quantize-norms-masks": lambda: HQ.mutated_calibration(HQ.NORMS_AND_MASKS_FLOAT),
    "quantize-newest13": lambda: HQ.mutated_calibration(HQ.NEWEST13_FLOAT),
    "quantize-newest14": lambda: HQ.mutated_calibration(HQ.NEWEST14_FLOAT),
    "quantize-newest15": lambda: HQ.mutated_calibration(HQ.NEWEST15_FLOAT),
    "quantize-newest16": lambda: HQ.mutated_calibration(HQ.NEWEST16_FLOAT),
    "quantize-newest17": lambda: HQ.mutated_calibration(HQ.NEWEST17_FLOAT),
    "layouts": lambda: HQ.mutated_layouts(),
}
PROJECT = ("cvm_onnx", "converters")


@functools.cache
def storage_seeds() -> R.Seeds:
    """Graphs whose entries pass the runtime's 2^32-byte bound, one storage each (chains of 1 GiB entries), which
    the writer's storage plan reuses: their symbols' storage ids, shapes and attributes are what ``storage``
    mutates."""
    return R.Seeds({f"chain{n}": R.files_of(R.validate(S.chain(n)).graph) for n in (4, 7, 12)})


def signature(e: BaseException) -> str:
    """Exception type and the innermost frame of the project's code (or of the test's bounds check)."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if any(f"/{p}/" in f.filename for p in PROJECT)] or frames
    f = ours[-1]
    first_line = (str(e).splitlines() or [""])[0]
    what = first_line[:60] if isinstance(e, AssertionError) else type(e).__name__
    return f"{what} at {Path(f.filename).name}:{f.lineno} ({f.name})"


def _family(e: BaseException, named: bool) -> str:
    """An outcome's name: the error family of a CVMError whose problems are one line each (``named``: each says
    where), else ``internal`` with the signature."""
    if isinstance(e, R.CVMError) and all("\n" not in str(p) and (p.where or not named) for p in e.problems):
        return type(e).__name__
    if isinstance(e, AssertionError) and str(e).startswith(("took ", "allocated ")):
        return f"over the {'time' if str(e).startswith('took') else 'memory'} bound"  # timings: see the load
    return f"internal {signature(e)}"


def convert_and_run(data: bytes) -> str:
    """What ``cvm-onnx convert M.onnx -o DIR`` (within the reliability bounds) and ``cvm-onnx run M.onnx`` (zeros
    of the input's shape) make of a file: "convert: <outcome>; run: <outcome>", each ``ok``, an error family or
    ``internal ...``."""
    import numpy as np

    from cvm_onnx.app import api
    from cvm_onnx.runtime import sessions
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.onnx"
        path.write_bytes(data)
        refused: list[BaseException] = []

        def convert() -> None:
            try:
                api.convert(path, Path(d) / "out")
            except R.CVMError as e:
                refused.append(e)
                raise

        try:
            R.bounded(convert, len(data))
            converted = _family(refused[0], named=True) if refused else "ok"
        except Exception as e:  # noqa: BLE001  (every outcome is recorded)
            converted = _family(e, named=True)
        try:
            model = api.load_onnx(path, external_data=True)
            inputs = [i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
            dims = [d.dim_value if d.HasField("dim_value") else 1 for d in inputs[0].type.tensor_type.shape.dim] \
                if inputs else [1]
            sessions.run_model(model, np.zeros(dims if 0 < np.prod(dims) <= 1 << 20 else [1], np.int32))
            ran = "ok"
        except Exception as e:  # noqa: BLE001
            ran = _family(e, named=False)
    return f"convert: {converted}; run: {ran}"


#: The child targets whose cases a child checks otherwise than by ``convert_and_run``: importing a quantized
#: model (exported back and verified exact), quantizing a float model.
CHECKS = {"quantized": "quantized", "recent": "quantized", "latest": "quantized", "norms-masks": "quantized",
          "newest": "quantized", "newest13": "quantized", "newest14": "quantized", "newest15": "quantized",
          "newest16": "quantized", "newest18": "quantized", "quantize": "quantize", "quantize-latest": "quantize",
          "quantize-norms-masks": "quantize", "quantize-newest13": "quantize", "quantize-newest14": "quantize",
          "quantize-newest15": "quantize", "quantize-newest16": "quantize", "quantize-newest17": "quantize",
          "layouts": "layouts"}


def _serve(conn, kind: str) -> None:
    import resource
    import warnings

    warnings.simplefilter("ignore")
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + CHILD_MEMORY, resource.RLIM_INFINITY))
    check = {"quantized": lambda files: f"convert: {HQ.check(files[0])}",
             "quantize": lambda files: f"convert: {HQ.check_quantize(*files)}",
             "layouts": lambda files: f"convert: {HQ.check_layout(*files)}"}.get(
        kind, lambda files: convert_and_run(files[0]))
    while True:
        conn.send(check(conn.recv()))


class Child:
    """A child process checking one file at a time (``convert_and_run``); a case that kills it (a signal) or
    takes more than CASE_SECONDS is that case's outcome, and a new child takes over."""

    def __init__(self, kind: str = "files"):
        self.context = multiprocessing.get_context("spawn")
        self.kind = kind
        self._start()

    def _start(self) -> None:
        self.conn, there = self.context.Pipe()
        self.proc = self.context.Process(target=_serve, args=(there, self.kind), daemon=True)
        self.proc.start()

    def __call__(self, files: tuple) -> str:
        self.conn.send(files)
        if self.conn.poll(CASE_SECONDS):
            try:
                return self.conn.recv()
            except EOFError:
                pass
        self.proc.join(1)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
            outcome = "hang"
        else:
            code = self.proc.exitcode
            outcome = f"signal {-code}" if code is not None and code < 0 else f"child exit {code}"
        self._start()
        return outcome

    def close(self) -> None:
        self.proc.kill()
        self.proc.join()


class ChildCheck:
    """The check of a child target: the outcome of each case, counted; anything but ok or an error family raises."""

    def __init__(self, kind: str = "files"):
        self.child = Child(kind)
        self.outcomes: Counter[str] = Counter()

    def __call__(self, case) -> None:
        outcome = self.child(case.files)
        self.outcomes[outcome] += 1
        if not outcome.startswith("convert: ") or any(w in outcome for w in HQ.FAILURES + ("bound",)):
            raise AssertionError(outcome)


class Run:
    """Checks cases until ``end`` (a time.monotonic() value), counting them and grouping the failures."""

    def __init__(self, check, end: float, count: int | None = None):
        self.check, self.end, self.count = check, end, count
        self.tried = 0
        self.failures: Counter[str] = Counter()
        self.examples: dict[str, str] = {}

    def __call__(self, case) -> None:
        if self.done():
            return  # the rest of hypothesis' chunk is drawn but not checked
        self.tried += 1
        if isinstance(self.check, ChildCheck) and self.tried % 250 == 0:
            print(f"    {self.tried} so far (load {os.getloadavg()[0]:.1f}): {dict(self.check.outcomes)}", flush=True)
        try:
            self.check(case)
        except Exception as e:  # noqa: BLE001  (every failure is recorded, the run goes on)
            key = str(e) if isinstance(self.check, ChildCheck) else signature(e)
            self.failures[key] += 1
            self.examples.setdefault(key, f"{case!r:.300}\n      {type(e).__name__}: {str(e)[:300]}")


    def done(self) -> bool:
        return time.monotonic() > self.end or (self.count is not None and self.tried >= self.count)


def fuzz(name: str, seconds: float, chunk: int, count: int | None = None) -> Run:
    strategy, check = (CHILD_TARGETS[name], ChildCheck(CHECKS.get(name, "files"))) if name in CHILD_TARGETS \
        else TARGETS[name]
    run = Run(check, time.monotonic() + seconds, count)
    while not run.done():
        @settings(max_examples=chunk, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy())
        def test(case):
            run(case)

        test()
    if isinstance(check, ChildCheck):
        check.child.close()
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("targets", nargs="*", help=f"some of {', '.join([*TARGETS, *CHILD_TARGETS])} (default: all)")
    p.add_argument("--minutes", type=float, default=5.0, help="total time, split evenly over the targets")
    p.add_argument("--count", type=int, help="total inputs, split evenly over the targets (the time still bounds)")
    p.add_argument("--chunk", type=int, default=200, help="examples per hypothesis run (a new random seed each)")
    args = p.parse_args()
    if unknown := set(args.targets) - set(TARGETS) - set(CHILD_TARGETS):
        p.error(f"unknown targets: {', '.join(sorted(unknown))}")
    targets = args.targets or [t for t in [*TARGETS, *CHILD_TARGETS]
                               if not t.startswith("resnet") or (RESNET / "symbol").is_file()]
    print(f"{os.cpu_count()} CPUs, load {os.getloadavg()} (timings are noisy: the machine is shared)", flush=True)
    total_tried = total_failed = 0
    for name in targets:
        start = time.monotonic()
        count = None if args.count is None else -(-args.count // len(targets))
        run = fuzz(name, args.minutes * 60 / len(targets), args.chunk, count)
        failed = sum(run.failures.values())
        total_tried, total_failed = total_tried + run.tried, total_failed + failed
        print(f"{name:<12} {run.tried:>8} inputs in {time.monotonic() - start:6.1f} s, {failed} failures, "
              f"{len(run.failures)} distinct (load {os.getloadavg()[0]:.1f})", flush=True)
        if isinstance(run.check, ChildCheck):
            for outcome, n in sorted(run.check.outcomes.items()):
                print(f"  {n:>6}  {outcome}")
        for key, n in run.failures.most_common():
            print(f"  {n:>6} x {key}\n      {run.examples[key]}")
    print(f"total       {total_tried:>8} inputs, {total_failed} failures")
    sys.exit(1 if total_failed else 0)


if __name__ == "__main__":
    main()
