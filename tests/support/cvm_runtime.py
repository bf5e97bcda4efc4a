"""The CVM runtime itself, for comparisons: a local build of its library (libcvm.so of
CortexFoundation/cvm-runtime, built by hand, never part of this project) named by the environment variable
CVM_RUNTIME_LIB, driven through its C API with ctypes. Optional: without it the tests that use it are skipped,
since they check the runtime's agreement, not this project's code."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

LIB = os.environ.get("CVM_RUNTIME_LIB")
CPU, FORMAL = 0, 2  # CVMAPILoadModel's device_type numbering (not DLPack's)


def packed(outputs: list[np.ndarray]) -> np.ndarray:
    """The outputs as CVMAPIInference writes them: one head flat; several heads interleaved by rows (all but the
    last axis; the runtime fails when their row counts differ)."""
    if len(outputs) == 1:
        return np.asarray(outputs[0]).reshape(-1)
    rows = [np.asarray(o).reshape(-1, np.shape(o)[-1]) for o in outputs]
    return np.concatenate(rows, axis=1).reshape(-1)


class CvmRuntime:
    """One model directory loaded on one device of the CVM runtime: ``run(x)`` -> its output, flat int32."""

    def __init__(self, library: str, model: Path, device: int = CPU):
        self.lib = ctypes.CDLL(library)
        symbol, params = (model / "symbol").read_bytes(), (model / "params").read_bytes()
        self.net = ctypes.c_void_p()
        if self.lib.CVMAPILoadModel(symbol, len(symbol), params, len(params), ctypes.byref(self.net), device, 0):
            raise RuntimeError(f"the CVM runtime at {library} did not load {model}")
        sizes = [ctypes.c_ulonglong() for _ in range(3)]
        for fn, size in zip(("GetInputLength", "GetOutputLength", "GetOutputTypeSize"), sizes):
            getattr(self.lib, f"CVMAPI{fn}")(self.net, ctypes.byref(size))
        self.in_bytes, out_bytes, self.out_size = (v.value for v in sizes)
        self.out = ctypes.create_string_buffer(out_bytes)

    def gas(self) -> int:
        """CVMAPIGetGasFromModel: the runtime's GetOps, ops + memory."""
        gas = ctypes.c_ulonglong()
        if self.lib.CVMAPIGetGasFromModel(self.net, ctypes.byref(gas)):
            raise RuntimeError("the CVM runtime did not give the gas")
        return gas.value

    def run(self, x: np.ndarray) -> np.ndarray:
        data = x.astype(np.int8 if self.in_bytes == x.size else np.int32).tobytes()
        if self.lib.CVMAPIInference(self.net, data, len(data), self.out):
            raise RuntimeError("the CVM runtime failed to run")
        return np.frombuffer(self.out.raw, np.int8 if self.out_size == 1 else np.int32).astype(np.int32)
