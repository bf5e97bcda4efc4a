"""quantize's heap settings (cvm_onnx.app.memory): with glibc's mmap threshold fixed, an array of a few MiB made
after a larger one was freed is mapped apart (handed back when freed), not carved from the heap, as the threshold's
default, risen to the larger block, would have it."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cvm_onnx.app.memory import MMAP_THRESHOLD, map_large_blocks


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mapped_bytes() -> int:
    return _MALLINFO2().hblkhd


try:
    _MALLINFO2 = ctypes.CDLL(None).mallinfo2
    _MALLINFO2.restype = _Mallinfo2
except (OSError, AttributeError):
    _MALLINFO2 = None


@pytest.mark.skipif(_MALLINFO2 is None, reason="glibc's mallinfo2 (2.33 and later) reads the mapped bytes")
def test_a_few_mib_after_a_larger_block_freed_are_mapped_apart():
    map_large_blocks()
    big = np.ones(16 << 20, np.uint8)  # freed: the default threshold would rise to 16 MiB
    del big
    before = _mapped_bytes()
    a = np.ones(4 * MMAP_THRESHOLD, np.uint8)
    assert _mapped_bytes() - before >= a.nbytes
