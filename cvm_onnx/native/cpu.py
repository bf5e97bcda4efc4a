"""Which integer products onnxruntime computes exactly on this CPU: the serving form's operand types.

The serving form's convolutions multiply in onnxruntime's MatMulInteger (MLAS). A convolution of one group is
*rows* (``im2col_rows``): each output position's window as a row of uint8, x itself where x is proven >= 0
(offset 0, values in [0, 127]) else x + 128 (zero point 128), or for quantized operands u - z the u themselves
(``zero`` z, values in [0, 255]: ``nn.conv2d_unsigned``), times the constant weights (K, OC) as ``w + 128``
(uint8, zero point 128). A grouped one is *columns*: the weights ``w + 128`` as the constant left
operand, the windows ``x + 128`` (``im2col_uint8``) as the right one. Exactness per operand type, x86:

* **uint8 x uint8**: exact on every ISA. MLAS widens both to int16 (values <= 255) and sums pairs with vpmaddwd
  into int32: no saturation; raw sums <= K * 255 * 255 < 2^31 for K <= 33025 (the exporter's limit), and the
  zero-point corrections are exact integer terms.
* **uint8 x int8** (the weights as int8 ``w``, or the columns' windows as int8 ``x``): where MLAS takes VNNI
  (AVX512-VNNI, AVX-VNNI: vpdpbusd adds four u8 x s8 products straight into int32) or AMX (tdpbusd), exact for
  any operands; raw sums <= K * 255 * 128 < 2^31. On AVX2 or AVX-512 without VNNI it sums pairs of products in
  int16 with saturation (vpmaddubsw), so it is exact exactly when no pair sum leaves [-2^15, 2^15 - 1]: for rows
  of offset 0 (the uint8 operand in [0, 127]) and int8 weights every pair sum |a0 w0 + a1 w1| <= 2 * 127 * 128 =
  32512 < 2^15, whatever pairs MLAS forms; with the uint8 operand up to 255 (2 * 255 * 127 > 32767: offset 128,
  and rows with a ``zero``) they can saturate: wrong results (506/512 under ``qemu-x86_64 -cpu Haswell``).
  Faster than uint8 x uint8 (benchmarks/RESULTS.md).
* int8 x int8: exact, but x86 MLAS has no kernel for it (only a portable one, far slower than u8 x s8:
  benchmarks/RESULTS.md), so it is not used.

A serving form's target says its operand types (``cvm_onnx.serving.target``): uint8 x uint8 is exact everywhere;
``Target.native()`` takes uint8 x int8 (``serving.cpu_layout.signed_operands``, at export, or at session creation
for a model whose target left the layout to the session) where it is exact here: every product where ``unbounded()``
(VNNI or AMX reported by CPUID, with the register state the OS enables, *and* a probe whose int16 pair sums would
saturate computes exactly in this very onnxruntime), else the rows of offset 0 without a ``zero`` where a probe at
the edge of their bound (pair sums 2 * 127 * -128 and 2 * 127 * 127) is exact. Either test alone would trust
something unchecked (the dispatch inside MLAS, or the CPU).

The layout "fused" (``serving.cpu_layout.fused_convolutions``) replaces each rows product and its requantize
by one native kernel that multiplies in its own code (custom_ops/conv.h: VNNI, AVX2 or plain C, exact on each), so
the operand types above concern only the MatMulInteger products left.
"""
from __future__ import annotations

import ctypes
from functools import cache

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.native import library_path

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


def _exact(a: np.ndarray, b: np.ndarray, a_constant: bool) -> bool:
    """Whether MatMulInteger a (uint8, zero point 128 when ``a_constant``, else 0) x b (int8) is exact here, one of
    them a constant (an initializer, as the serving form's weights) and the other the input."""
    za = np.uint8(128 if a_constant else 0)
    const, var = (("a", a), ("b", b)) if a_constant else (("b", b), ("a", a))
    node = helper.make_node("MatMulInteger", ["a", "b", "za"], ["y"])
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info(var[0], helper.np_dtype_to_tensor_dtype(
        var[1].dtype), var[1].shape)], [helper.make_tensor_value_info("y", TensorProto.INT32, [a.shape[0], b.shape[1]])],
        [numpy_helper.from_array(const[1], const[0]), numpy_helper.from_array(za, "za")])
    model = onnx_model(graph)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    got = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {var[0]: var[1]})
    return bool(np.array_equal(got[0], (a.astype(np.int64) - int(za)) @ b.astype(np.int64)))


def _edge_weights(k: int, n: int) -> np.ndarray:
    return np.where(np.arange(k * n).reshape(k, n) % 3 == 0, -128, 127).astype(np.int8)


def _probe_exact() -> bool:
    """Whether uint8 x int8 is exact on operands whose int16 pair sums saturate (255 * 127 twice, and 255 * -128
    twice): the columns' constant weights x windows, and the rows' windows x constant weights."""
    a = np.full((16, 64), 255, np.uint8)
    return _exact(a, _edge_weights(64, 32), a_constant=True) and _exact(a, _edge_weights(64, 32), a_constant=False)


def _probe_bounded() -> bool:
    """Whether uint8 x int8 is exact on rows of offset 0 at the edge of their bound: windows 127 (and 0) times
    constant weights -128 and 127, pair sums down to 2 * 127 * -128 and up to 2 * 127 * 127."""
    a = np.where(np.arange(16 * 64).reshape(16, 64) % 5 == 4, 0, 127).astype(np.uint8)
    return _exact(a, _edge_weights(64, 32), a_constant=False)


@cache
def unbounded() -> bool:
    """Whether uint8 x int8 is exact here for any operands (VNNI or AMX, and the saturation probe exact)."""
    return bool(EXACT_SIGNED & set(features())) and _probe_exact()


@cache
def products() -> str:
    """``"u8s8"`` where uint8 x int8 products are exact here for some convolutions (all: ``unbounded()``; else
    the rows of offset 0), else ``"u8u8"``."""
    return "u8s8" if unbounded() or _probe_bounded() else "u8u8"

