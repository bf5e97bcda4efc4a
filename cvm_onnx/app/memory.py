"""Memory handed back between the stages of quantize (cvm_onnx.app.quantize) and within its calibration."""
from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import multiprocessing
import os
import signal
import threading
from typing import Callable, Iterator, TypeVar

from cvm_onnx.core.errors import CVMError

T = TypeVar("T")


#: glibc's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD (malloc.h) and the values quantize fixes them at: blocks of 1 MiB
#: and more mapped apart; the heap's top handed back from 64 MiB free (the largest its dynamic threshold reaches)
M_MMAP_THRESHOLD, M_TRIM_THRESHOLD = -3, -1
MMAP_THRESHOLD, TRIM_THRESHOLD = 1 << 20, 64 << 20


@functools.cache
def _libc(name: str) -> Callable[..., int] | None:
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):  # no glibc
        return None


def map_large_blocks() -> None:
    """glibc's mmap threshold fixed at ``MMAP_THRESHOLD`` for the rest of the process (mallopt; nothing without
    glibc). Its default rises to the largest block freed (up to 32 MiB): past the first large array freed, the
    arrays of a few MiB that the import and the reference executor make and free come from the heap, where freed
    memory is kept until it can be trimmed, so the heap's high-water mark stands above what is alive. Mapped
    apart, each is handed back when freed. Fixing it fixes the trim threshold too, at 128 KiB unless set: the
    heap's top, shrunk and grown again at every large free, made the comparison several times slower; it is set
    at ``TRIM_THRESHOLD``, and ``release_memory`` trims the heap between stages."""
    if (mallopt := _libc("mallopt")) is not None:
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


_open = 0  # how many own_garbage regions are open
_open_lock = threading.Lock()


@contextlib.contextmanager
def own_garbage() -> Iterator[None]:
    """Inside (nested or in several threads: from the first entry to the last exit), the collections of
    ``release_memory`` walk only the objects made inside: whatever the process held on entering (its modules, a
    caller's objects, the million of a test process) is moved out of the collector's sight (gc.freeze) and given
    back on leaving: a full collection walks every tracked object, however few of them the stage made."""
    global _open
    with _open_lock:
        _open += 1
        if _open == 1:
            gc.freeze()
    try:
        yield
    finally:
        with _open_lock:
            _open -= 1
            if _open == 0:
                gc.unfreeze()


def release_memory() -> None:
    """Unreachable objects collected (onnx's and onnxruntime's tools leave models in reference cycles) and the
    heap's free pages returned to the system (glibc's malloc_trim; nothing without glibc). Each stage of quantize
    frees the copies of the model it made (serializations, onnxruntime's sessions), which glibc otherwise keeps, so
    that the next stage's peak does not stand on them."""
    gc.collect()
    if (trim := _libc("malloc_trim")) is not None:
        trim(0)


class ChildFailed(Exception):
    """``in_child``'s child failed: its exception's type and message (one not of ours), or the signal that ended it
    (``signal``, else None)."""

    def __init__(self, message: str, signal: int | None = None):
        super().__init__(message)
        self.signal = signal


def in_child(fn: Callable[..., T], progress: Callable[..., None] | None = None) -> T:
    """``fn()``'s value, ``fn`` run in a forked child process, where the system forks (else here): what it imports
    and allocates (onnxruntime's symbolic shape inference imports sympy, 32 MiB that would stay for the rest of the
    process; the import's temporaries, whose freed pages stay in the heap) goes with the child, which shares this
    process's pages until it writes them. Its value comes back pickled. ``progress``: ``fn`` is called with a
    stand-in for it, whose calls (picklable arguments) are made here as the child makes them. A ``CVMError`` it
    raises is raised here as it is; another exception, as ``ChildFailed`` with its type and message; a child ended
    by a signal, as ``ChildFailed`` naming it. An exception here (``progress`` raising, an interrupt) ends the
    child first."""
    if not hasattr(os, "fork"):
        return fn(progress) if progress is not None else fn()
    read, write = multiprocessing.Pipe(duplex=False)  # pickled messages: (kind, value)
    pid = os.fork()
    if pid == 0:  # the child: no cleanup of the parent's (atexit, buffered output), only os._exit
        code = 0
        try:
            read.close()
            told = fn(lambda *args: write.send(("progress", args))) if progress is not None else fn()
            write.send(("value", told))
        except BaseException as e:  # noqa: BLE001  (anything fn raises is the parent's to report)
            code = 1
            write.send(("error", e) if isinstance(e, CVMError) else ("failed", f"{type(e).__name__}: {e}"[:1 << 16]))
        finally:
            os._exit(code)
    write.close()
    ended = False
    try:
        said = ("failed", "")
        with read:
            while True:
                try:
                    message = read.recv()
                except EOFError:  # the child ended (its messages whole or not)
                    break
                if message[0] == "progress":
                    progress(*message[1])
                else:
                    said = message
        _, status = os.waitpid(pid, 0)
        ended = True
    finally:
        if not ended:  # interrupted here: the child ends with this process's call
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        raise ChildFailed(f"the child process was ended by signal {number} ({signal.Signals(number).name})", number)
    kind, value = said
    if kind == "error":
        raise value
    if kind != "value" or status:
        raise ChildFailed(kind == "failed" and value or
                          f"the child process ended with status {os.waitstatus_to_exitcode(status)}")
    return value
