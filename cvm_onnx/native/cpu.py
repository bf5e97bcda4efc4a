"""Which integer products onnxruntime computes exactly on this CPU: the serving form's operand types.

The serving form's convolutions multiply in onnxruntime's MatMulInteger (MLAS), weights as the constant left
operand ``w + 128`` (uint8, zero point 128), the windows as the right one. Exactness per operand type, x86:

* **uint8 x uint8** (the windows as ``x + 128``, zero point 128): exact on every ISA. MLAS widens both to
  int16 (values <= 255) and sums pairs with vpmaddwd into int32: no saturation; raw sums <= K * 255 * 255 <
  2^31 for K <= 33025 (the exporter's limit), and the zero-point corrections are exact integer terms.
* **uint8 x int8** (the windows as ``x``): exact only where MLAS takes VNNI (AVX512-VNNI, AVX-VNNI: vpdpbusd
  adds four u8 x s8 products straight into int32) or AMX (tdpbusd); raw sums <= K * 255 * 128 < 2^31. On
  AVX2 or AVX-512 without VNNI it sums pairs in int16 with saturation (vpmaddubsw; 2 * 255 * 127 > 32767):
  wrong results (506/512 under ``qemu-x86_64 -cpu Haswell``). Measured here 2-2.5x faster than uint8 x uint8.
* int8 x int8: exact, but x86 MLAS has no kernel for it (a portable one: 14 GMAC/s against 140 for u8 x s8
  here), so it is not used.

The exported model is uint8 x uint8 (exact everywhere); ``signed_columns`` turns it into
uint8 x int8 at session creation when ``products()`` says so: VNNI or AMX reported by CPUID (with the register
state the OS enables) *and* a probe with operands that saturate int16 pair sums computes exactly in this very
onnxruntime. Either test alone would trust something unchecked (the dispatch inside MLAS, or the CPU).
"""
from __future__ import annotations

import ctypes
from functools import cache

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from cvm_onnx.native import DOMAIN, library_path

#: Bits of the native library's ``cvm_onnx_cpu_features``.
FEATURES = {1: "avx2", 2: "avx512bw", 4: "avx512_vnni", 8: "avx_vnni", 16: "amx_int8"}
EXACT_SIGNED = {"avx512_vnni", "avx_vnni", "amx_int8"}


@cache
def features() -> tuple[str, ...]:
    """The x86 features CPUID reports and the OS enables (empty without the native library or off x86)."""
    path = library_path()
    if path is None:
        return ()
    try:
        fn = ctypes.CDLL(path).cvm_onnx_cpu_features
    except (OSError, AttributeError):  # a library that does not load, or one built before it had the function
        return ()
    fn.restype = ctypes.c_uint32
    bits = fn()
    return tuple(name for bit, name in FEATURES.items() if bits & bit)


def _probe_exact() -> bool:
    """Whether MatMulInteger uint8 (constant, zero point 128) x int8 is exact on operands whose int16 pair sums
    saturate (255 * 127 twice, and 255 * -128 twice)."""
    k, n = 64, 32
    a = np.full((16, k), 255, np.uint8)
    b = np.where(np.arange(k * n).reshape(k, n) % 3 == 0, -128, 127).astype(np.int8)
    node = helper.make_node("MatMulInteger", ["a", "b", "za"], ["y"])
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("b", TensorProto.INT8, [k, n])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [16, n])],
                              [numpy_helper.from_array(a, "a"), numpy_helper.from_array(np.uint8(128), "za")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    got = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"b": b})
    return bool(np.array_equal(got[0], (a.astype(np.int64) - 128) @ b.astype(np.int64)))


@cache
def products() -> str:
    """``"u8s8"`` where uint8 x int8 products are exact here (see above), else ``"u8u8"``."""
    return "u8s8" if EXACT_SIGNED & set(features()) and _probe_exact() else "u8u8"


def signed_columns(model: onnx.ModelProto) -> onnx.ModelProto:
    """A session-time pass (a copy of ``model``): every ``im2col_uint8`` read only as MatMulInteger's right
    operand with zero point 128 becomes ``im2col_int8`` read with no zero point. Invariant: the products are
    the same integers, sum a (x + 128 - 128) = sum a x, now as uint8 x int8 (for a CPU where ``products()``
    says those are exact)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    consts.update({n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t) for n in graph.node
                   if n.op_type == "Constant" and n.attribute[0].name == "value"})
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in graph.node:
        for k, t in enumerate(n.input):
            readers.setdefault(t, []).append((n, k))
    outputs = {o.name for o in graph.output}
    for n in graph.node:
        if n.domain != DOMAIN or n.op_type != "im2col_uint8" or n.output[0] in outputs:
            continue
        uses = readers.get(n.output[0], [])
        if uses and all(m.op_type == "MatMulInteger" and k == 1 and len(m.input) == 4 and
                        consts.get(m.input[3]) is not None and consts[m.input[3]].dtype == np.uint8 and
                        consts[m.input[3]].size == 1 and int(consts[m.input[3]].reshape(-1)[0]) == 128
                        for m, k in uses):
            n.op_type = "im2col_int8"
            for m, _ in uses:
                del m.input[3]
    return out
