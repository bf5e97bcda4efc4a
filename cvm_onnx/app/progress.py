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
from rich.text import Text


class _Count(MofNCompleteColumn):
    """done/total once the total is known; nothing before (rich would show ``0/?``)."""

    def render(self, task) -> Text:
        return super().render(task) if task.total is not None else Text("")


class Bar:
    """``with Bar() as bar: work(progress=bar)``; ``bar(done, total, what)`` moves it. The bar appears after
    ``delay`` seconds (never when stderr is not a terminal) and is erased when the block ends."""

    def __init__(self, delay: float = 0.5):
        console = Console(stderr=True)
        self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), _Count(),
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

    def __call__(self, done: int, total: int | None, what: str) -> None:
        """done/total of the stage ``what``; total None: a stage of unknown length, shown by its name alone."""
        if total is None:  # rich keeps a task's total once set: a new task
            self._bar.remove_task(self._task)
            self._task = self._bar.add_task(what, total=None)
            return
        self._bar.update(self._task, completed=done, total=total, description=what)


@contextmanager
def native_stderr_held() -> Iterator[None]:
    """What native code writes to stderr's file descriptor while the block runs (Ray's C++ core worker logging)
    goes to a temporary file, written out after the block only if it fails; Python's ``sys.stderr`` (our
    messages, a ``Bar`` made inside the block) goes on through a duplicate of the descriptor. So on a terminal
    nothing draws over the bar, and on a terminal, a file or a pipe alike a run that succeeds prints only its
    own lines. A ``sys.stderr`` with no descriptor (captured in-process) holds nothing."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    ours = os.fdopen(os.dup(fd), "w", buffering=1, encoding=sys.stderr.encoding, errors=sys.stderr.errors)
    previous, sys.stderr = sys.stderr, ours
    failed = True
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), fd)
        try:
            yield
            failed = False
        finally:
            sys.stderr = previous
            ours.close()
            os.dup2(saved, fd)
            os.close(saved)
            if failed:
                held.seek(0)
                text = held.read()
                while text:
                    text = text[os.write(fd, text):]
