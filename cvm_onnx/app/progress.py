"""A progress bar for the CLI: on stderr, only when stderr is a terminal and the work lasts more than a moment."""
from __future__ import annotations

import threading

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


class Bar:
    """``with Bar() as bar: work(progress=bar)``; ``bar(done, total, what)`` moves it. The bar appears after
    ``delay`` seconds (never when stderr is not a terminal) and is erased when the block ends."""

    def __init__(self, delay: float = 0.5):
        console = Console(stderr=True)
        self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), console=console, transient=True)
        self._task = self._bar.add_task("", total=None)
        self._lock = threading.Lock()
        self._closed = self._shown = False
        self._timer = threading.Timer(delay, self._show) if console.is_terminal else None

    def _show(self) -> None:
        with self._lock:
            if not self._closed:
                self._bar.start()
                self._shown = True

    def __enter__(self) -> Bar:
        if self._timer:
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._closed = True
            if self._timer:
                self._timer.cancel()
            if self._shown:
                self._bar.stop()

    def __call__(self, done: int, total: int, what: str) -> None:
        self._bar.update(self._task, completed=done, total=total, description=what)
