"""Memory handed back between the stages of quantize (cvm_onnx.app.quantize) and within its calibration."""
from __future__ import annotations

import ctypes
import functools
import gc
from typing import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # no glibc
        return None


def release_memory() -> None:
    """Unreachable objects collected (onnx's and onnxruntime's tools leave models in reference cycles) and the
    heap's free pages returned to the system (glibc's malloc_trim; nothing without glibc). Each stage of quantize
    frees the copies of the model it made (serializations, onnxruntime's sessions), which glibc otherwise keeps, so
    that the next stage's peak does not stand on them."""
    gc.collect()
    if (trim := _malloc_trim()) is not None:
        trim(0)
