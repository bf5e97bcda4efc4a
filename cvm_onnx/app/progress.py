"""A progress bar for the CLI: on stderr, only when stderr is a terminal and the work lasts more than a moment."""
from __future__ import annotations

import os
import sys
import tempfile
import threading
from contextlib import contextmanager
from typing import Iterator

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


@contextmanager
def native_stderr_held() -> Iterator[None]:
    """On a terminal, what native code writes to stderr's file descriptor while the block runs (Ray's C++ core
    worker logging over the bar) goes to a temporary file, written out after the block only if it fails; Python's
    ``sys.stderr`` (our messages, a ``Bar`` made inside the block) goes on to the terminal through a duplicate of
    the descriptor. Elsewhere (a file, a pipe) nothing is drawn over, and nothing is held."""
    if not sys.stderr.isatty():
        yield
        return
    fd = sys.stderr.fileno()
    sys.stderr.flush()
    saved = os.dup(fd)
    terminal = os.fdopen(os.dup(fd), "w", buffering=1, encoding=sys.stderr.encoding, errors=sys.stderr.errors)
    previous, sys.stderr = sys.stderr, terminal
    failed = True
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), fd)
        try:
            yield
            failed = False
        finally:
            sys.stderr = previous
            terminal.close()
            os.dup2(saved, fd)
            os.close(saved)
            if failed:
                held.seek(0)
                text = held.read()
                while text:
                    text = text[os.write(fd, text):]
