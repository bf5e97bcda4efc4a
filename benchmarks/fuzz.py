"""A longer fuzz run over the reliability properties of tests/test_reliability.py.

The same mutations (symbol, attributes, params, ONNX models; ResNet-20 when the shared model is present) and the
same check: every outcome is success or a CVMError, within the time and memory bounds. Unlike the tests, a run
does not stop at the first failure: it counts the inputs tried and groups failures by signature (exception type
and the innermost project frame), printing one example of each.

    python benchmarks/fuzz.py --minutes 5              # all targets, time split evenly
    python benchmarks/fuzz.py --minutes 2 onnx params  # some targets
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import test_reliability as R  # noqa: E402
from conftest import RESNET  # noqa: E402

TARGETS = {
    "symbols": (lambda: R.mutated_symbols(R.SEEDS), R.check_cvm),
    "attributes": (lambda: R.mutated_attributes(R.SEEDS), R.check_cvm),
    "params": (lambda: R.mutated_params(R.SEEDS), R.check_cvm),
    "onnx": (lambda: R.mutated_onnx(R.ONNX_SEEDS), R.check_onnx),
    "resnet": (lambda: R.mutated_symbols(R.resnet_seeds(RESNET)) | R.mutated_attributes(R.resnet_seeds(RESNET))
               | R.mutated_params(R.resnet_seeds(RESNET)), R.check_cvm),
    "resnet-onnx": (lambda: R.mutated_onnx(R.resnet_onnx_seeds(RESNET)), R.check_onnx),
}
PROJECT = ("cvm_onnx", "converters")


def signature(e: BaseException) -> str:
    """Exception type and the innermost frame of the project's code (or of the test's bounds check)."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if any(f"/{p}/" in f.filename for p in PROJECT)] or frames
    f = ours[-1]
    first_line = (str(e).splitlines() or [""])[0]
    what = first_line[:60] if isinstance(e, AssertionError) else type(e).__name__
    return f"{what} at {Path(f.filename).name}:{f.lineno} ({f.name})"


class Run:
    """Checks cases until ``end`` (a time.monotonic() value), counting them and grouping the failures."""

    def __init__(self, check, end: float):
        self.check, self.end = check, end
        self.tried = 0
        self.failures: Counter[str] = Counter()
        self.examples: dict[str, str] = {}

    def __call__(self, case) -> None:
        if time.monotonic() > self.end:
            return  # the rest of hypothesis' chunk is drawn but not checked
        self.tried += 1
        try:
            self.check(case)
        except Exception as e:  # noqa: BLE001  (every failure is recorded, the run goes on)
            key = signature(e)
            self.failures[key] += 1
            self.examples.setdefault(key, f"{case!r:.300}\n      {type(e).__name__}: {str(e)[:300]}")


def fuzz(name: str, seconds: float, chunk: int) -> Run:
    strategy, check = TARGETS[name]
    run = Run(check, time.monotonic() + seconds)
    while time.monotonic() < run.end:
        @settings(max_examples=chunk, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy())
        def test(case):
            run(case)

        test()
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("targets", nargs="*", help=f"some of {', '.join(TARGETS)} (default: all)")
    p.add_argument("--minutes", type=float, default=5.0, help="total time, split evenly over the targets")
    p.add_argument("--chunk", type=int, default=200, help="examples per hypothesis run (a new random seed each)")
    args = p.parse_args()
    if unknown := set(args.targets) - set(TARGETS):
        p.error(f"unknown targets: {', '.join(sorted(unknown))}")
    targets = args.targets or [t for t in TARGETS if not t.startswith("resnet") or (RESNET / "symbol").is_file()]
    total_tried = total_failed = 0
    for name in targets:
        start = time.monotonic()
        run = fuzz(name, args.minutes * 60 / len(targets), args.chunk)
        failed = sum(run.failures.values())
        total_tried, total_failed = total_tried + run.tried, total_failed + failed
        print(f"{name:<11} {run.tried:>8} inputs in {time.monotonic() - start:6.1f} s, {failed} failures, "
              f"{len(run.failures)} distinct", flush=True)
        for key, count in run.failures.most_common():
            print(f"  {count:>6} x {key}\n      {run.examples[key]}")
    print(f"total       {total_tried:>8} inputs, {total_failed} failures")
    sys.exit(1 if total_failed else 0)


if __name__ == "__main__":
    main()
