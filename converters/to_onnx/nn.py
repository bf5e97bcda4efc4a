"""Lowerings of the neural-network ops: conv2d, dense, max_pool2d, upsampling, relu (int32 in, int32 out).

conv2d and dense have two forms, chosen by ``lowering.lower``'s ``conv_form`` (the body's ``b.conv_form``; the
export writes "fast"):

* ``"core"``: the core-ops decomposition: Pad + im2col (Slice/Reshape/Concat) + int32 MatMul (+ bias). Exact
  for every input: ORT's int32 MatMul wraps modulo 2^32 (multiply and add), which is the runtime's int32
  accumulator, whatever the order of the additions.
* ``"fast"`` (default): Cast to float32 + ONNX Conv/Gemm + Cast back to int32, where that is exact (below), in
  as many input-channel chunks as the bound needs, else the core form.

Exactness of float32: every product and every partial sum of one output is an integer of magnitude at most
``max|x| * sum|w|`` over the weights it reduces (any order of additions, with or without FMA, only adds subsets
of the products). Every integer of magnitude <= 2^24 is a float32, so when that bound is <= 2^24 every
operation is exact and the float result is the exact integer sum, which Cast turns back into int32 exactly.
``max|x|`` is the input's true precision bound; ``sum|w|`` is taken from the weight's values when it is a param
(``Value.const``), else from its bound. A reduction over too many channels is split into chunks each within
2^24; the chunk sums are added in int32, which wraps like the runtime's accumulator, so the total equals the
runtime's modulo 2^32. The bias joins a single float32 Conv/Gemm (where onnxruntime adds it in its kernel) when
the output's bound, ``max|x| * sum|w| + |bias|`` per output channel, is <= 2^24: every partial sum, with or
without the bias, is then an integer within 2^24. Otherwise it is added in int32 after the Cast back (it may be
as large as 2^31).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from cvm_onnx.core.constants import FLOAT32_EXACT as FLOAT_EXACT
from cvm_onnx.core.constants import INT32_MAX
from cvm_onnx.core.ops.nn import pool_pads
from cvm_onnx.core.ops.registry import magnitudes
from cvm_onnx.native import DOMAIN as NATIVE_DOMAIN

from .lowering import lowering

ROWS = True  # whether integer products of one group take the rows route on the CPU (conv2d_rows), else columns
INT8_K = 33025  # the most products one uint8 x uint8 sum may take: K * 255 * 255 < 2^31
# int8 x int8 (the CUDA form: |x| <= 127, w in [-128, 127]): K * 127 * 128 <= 2^31 - 1
INT8_K_SIGNED = (2**31 - 1) // (127 * 128)
# The most elements the native im2col gives in one call (its int32 indexing), the CUDA form's only columns limit
COLUMNS_LIMIT = INT32_MAX
# The most bytes of windows one im2col call may gather for the integer route to be taken: as far as measured
# (benchmarks/RESULTS.md, "Measurements behind the code's choices"); larger calls are unmeasured.
INT8_COLUMNS = 1 << 24


def float_chunks(x_bound: int, w_sums: np.ndarray) -> list[tuple[int, int]] | None:
    """Contiguous ranges [lo, hi) of the reduced channels with ``x_bound * max_o sum_{lo<=c<hi} w_sums[o, c]``
    <= 2^24, greedily as long as possible; None when one channel alone exceeds the bound.

    ``w_sums[o, c]`` (any non-negative integers) bounds sum |w| over the weights of output o and reduced channel
    c. Each chunk is found by galloping: windows that double while the sums still fit, then halve, so the work
    is linear in the weights and no prefix-sum matrix is built (a dense layer's w_sums are its weights).
    """
    cap = FLOAT_EXACT // max(x_bound, 1)  # x_bound * s <= 2^24  <=>  s <= cap, for integers s
    if w_sums.size and int(w_sums.max()) > cap:
        return None
    chunks, lo, n = [], 0, w_sums.shape[1]
    while lo < n:
        total, hi, step, growing = np.zeros(w_sums.shape[0], np.int64), lo, 1, True
        while step and hi < n:
            t = total + np.add.reduce(w_sums[:, hi:hi + step], axis=1, dtype=np.int64)
            fits = int(t.max(initial=0)) <= cap
            if fits:
                total, hi = t, min(hi + step, n)
            growing = growing and fits
            step = step * 2 if growing else step // 2
        chunks.append((lo, hi))
        lo = hi
    return chunks


def weight_sums(w, per_column: int) -> np.ndarray:
    """Bounds on sum |w| per (output, reduced channel): from the values of a param (for one weight per channel,
    as in dense, its unsigned magnitudes, no wider copy), else from its bound."""
    if w.const is not None:
        a = magnitudes(w.const)
        a = a.reshape(a.shape[0], a.shape[1], -1)
        return a[:, :, 0] if a.shape[2] == 1 else np.add.reduce(a, axis=2, dtype=np.int64)
    return np.full(w.shape[:2], per_column * w.bound, np.int64)


def _slice(b, x, axis: int, lo: int, hi: int) -> str:
    return b.Slice(x, b.const([lo]), b.const([hi]), b.const([axis]))


def _to_int(b, y) -> str:
    return b.Cast(y, to=TensorProto.INT32)


def _sum_int32(b, parts: list[str]) -> str:
    total = parts[0]
    for p in parts[1:]:
        total = b.Add(total, p)
    return total


# -- conv2d -----------------------------------------------------------------------------------------------------

def _conv_shape(b, a, x):
    n, c, h, w = x.shape
    _, oc, oh, ow = b.outputs[0].shape
    return n, c, oc, oh, ow, a.groups


def windows(b, xp, kernel, strides, dilation, out) -> str:
    """All windows of ``xp`` (N, C, H, W): win[n, c, fh, fw, oh, ow] = xp[n, c, oh*sh + fh*dh, ow*sw + fw*dw],
    by kh strided Slices along H stacked on a new axis 2, then kw strided Slices along W stacked on axis 3."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, strides, dilation, out

    def stack(t, axis: int, new_axis: int, k: int, d: int, s: int, n: int) -> str:
        parts = [b.Unsqueeze(b.Slice(t, b.const([f * d]), b.const([f * d + (n - 1) * s + 1]), b.const([axis]),
                                     b.const([s])), b.const([new_axis]))
                 for f in range(k)]
        return b.Concat(*parts, axis=new_axis) if k > 1 else parts[0]

    rows = stack(xp, 2, 2, kh, dh, sh, oh)  # (N, C, kh, oh, W)
    return stack(rows, 4, 3, kw, dw, sw, ow)  # (N, C, kh, kw, oh, ow)


def conv2d_core(b, a, x, w) -> str:
    """Pad + im2col + int32 MatMul: y[n, g, o, l] = sum_k w[g, o, k] * cols[n, g, k, l], k = (ic, fh, fw)."""
    n, c, oc, oh, ow, g = _conv_shape(b, a, x)
    (kh, kw), (ph, pw) = a.kernel_size, a.padding
    cg = c // g
    xp = b.Pad(x, b.const([0, 0, ph, pw, 0, 0, ph, pw])) if ph or pw else x.name
    win = windows(b, xp, a.kernel_size, a.strides, a.dilation, (oh, ow))  # (N, C, kh, kw, oh, ow)
    cols = b.Reshape(win, b.const([n, g, cg * kh * kw, oh * ow]))
    y = b.MatMul(b.Reshape(w, b.const([g, oc // g, cg * kh * kw])), cols)  # (N, g, OC/g, oh*ow)
    return b.Reshape(y, b.const([n, oc, oh, ow]))


def _conv_attrs(a) -> dict:
    return dict(kernel_shape=list(a.kernel_size), strides=list(a.strides), dilations=list(a.dilation),
                pads=list(a.padding) * 2, group=a.groups)


def _scaled(b, w, bias, channels: int, scale: float, offset: float) -> tuple[str, list[str]]:
    """float32 weight * scale and (bias + offset) * scale (constant expressions, folded by onnxruntime)."""
    wf, bf = b.Cast(w, to=TensorProto.FLOAT), None if bias is None else b.Cast(bias, to=TensorProto.FLOAT)
    if offset:
        bf = b.const(np.full(channels, offset, np.float32), np.float32) if bf is None else \
            b.Add(bf, b.const(offset, np.float32))
    if scale != 1:
        wf, bf = b.Mul(wf, b.const(scale, np.float32)), None if bf is None else b.Mul(bf, b.const(scale, np.float32))
    return wf, [] if bf is None else [bf]


def conv2d_float32(b, a, x, w, bias=None, scale: float = 1.0, offset: float = 0.0) -> str:
    """(conv(x, w) + bias + offset) * scale as one float32 Conv (float32 out); ``scale`` a power of two, so
    exact whenever the unscaled sums are (the caller's bound)."""
    wf, biases = _scaled(b, w, bias, w.shape[0], scale, offset)
    return b.Conv(b.Cast(x, to=TensorProto.FLOAT), wf, *biases, **_conv_attrs(a))


def integer_refusal(a, x, w, out_shape: tuple[int, ...], provider: str = "cpu", most_x: int = 127) -> str | None:
    """Why a conv2d does not take ``conv2d_integer``, or None when it does: it must be exact (|x| <= ``most_x``, 127
    (for ``conv2d_unsigned``: its u, 255), the weight a param within [-128, 127], at most ``INT8_K`` products per
    output: C/G * kh * kw; on "cuda", int8 x int8, ``INT8_K_SIGNED``) and expected faster (its windows,
    N * C * kh * kw * OH * OW bytes, at most ``INT8_COLUMNS`` on the CPU; on "cuda" only the kernel's
    ``COLUMNS_LIMIT``: the GPU gathers them at memory speed, and any other route there is a float Conv or a CPU
    fallback)."""
    kh, kw = a.kernel_size
    n, c = x.shape[:2]
    columns = n * c * kh * kw * out_shape[2] * out_shape[3]
    most_k, most_columns = (INT8_K_SIGNED, COLUMNS_LIMIT) if provider == "cuda" else (INT8_K, INT8_COLUMNS)
    if x.bound > most_x:
        return f"its input's bound {x.bound} exceeds {'int8' if most_x == 127 else 'uint8'}'s {most_x}"
    if w.const is None:
        return "its weight is not a param"
    if int(w.const.min(initial=0)) < -128 or int(w.const.max(initial=0)) > 127:
        return "its weights exceed int8"
    if c // a.groups * kh * kw > most_k:
        return f"{c // a.groups * kh * kw} products per output exceed {most_k}"
    if columns > most_columns:
        return f"its windows, {columns:,} bytes, exceed the cost model's {most_columns:,} bytes a call"
    return None


def integer_route(a, x, w, out_shape: tuple[int, ...], provider: str = "cpu") -> bool:
    """Whether a conv2d takes ``conv2d_integer`` (``integer_refusal`` says why not)."""
    return integer_refusal(a, x, w, out_shape, provider) is None


def channelwise(a, x, oc: int) -> bool:
    """Whether every output of a conv2d is one input value times one weight: a 1x1 window over one channel per
    group (groups = C = OC), strides 1, no padding (a per-channel scale, as a folded batch norm)."""
    return (tuple(a.kernel_size) == (1, 1) and a.groups == x.shape[1] == oc and tuple(a.strides) == (1, 1)
            and tuple(a.padding) == (0, 0))


def conv2d_integer(b, a, x, w, provider: str = "cpu") -> tuple[str, dict]:
    """conv(x, w) in int32 from integer products: the native ``im2col_uint8`` gathers the windows as
    x + 128 (uint8, 128 in the padding), MatMulInteger multiplies (w + 128) (uint8) by them, both zero points
    128: y = sum (w + 128 - 128) (x + 128 - 128) = sum w x exactly (``cvm_onnx.native.cpu`` gives the argument per
    ISA; ``integer_route`` the conditions). The result is exact, so it is the runtime's int32 accumulator's.

    Returns the products, (N, OC, OH, W') with W' >= OW, and the attributes of the ``requantize`` that
    finishes them. With strides 1 the columns are wide (W' the padded width: each window position one
    contiguous copy); each row's last W' - OW products are of windows that wrap into the next row, and are
    dropped (``width``: OW). A ``channelwise`` conv2d is its single product per output, x * w[c]: x itself,
    and ``requantize`` multiplies in int32 by ``scales`` (w), wrapping as the runtime's accumulator does (and not
    wrapping here: |x| <= 127, |w| <= 128).

    On "cuda" (onnxruntime's CUDA MatMulInteger takes int8 x int8 only) the windows are ``im2col_int8`` (x
    itself, 0 in the padding, never wide) and the weights int8, no zero points: cuBLAS's int8 GEMM sums the
    products in int32, |w x| <= 128 * 127 and K <= ``INT8_K_SIGNED`` products, so no sum overflows and the
    result is sum w x exactly, in any order. The columns are ``batch_inner`` ((G, K, N * OH * OW): onnxruntime's
    CUDA MatMulInteger runs one GEMM per batch entry, so the samples go into the GEMM's columns, one GEMM per
    group), the products come out (OC, N, OH, OW), and ``requantize`` (``batch_inner``) reads them so."""
    n, c, oc, oh, ow, g = _conv_shape(b, a, x)
    (kh, kw), (ph, pw) = a.kernel_size, a.padding
    if channelwise(a, x, oc):
        return x.name, {"scales": [int(v) for v in w.const.reshape(-1)]}
    if g == 1 and ROWS and provider == "cpu":
        return conv2d_rows(b, a, x, w)
    k = c // g * kh * kw
    attrs = dict(domain=NATIVE_DOMAIN, kernel_shape=[kh, kw], strides=list(a.strides), dilations=list(a.dilation),
                 pads=[ph, pw, ph, pw], group=g)
    weights = b.const([oc, k] if g == 1 else [g, oc // g, k])
    if provider == "cuda":
        cols = b.node("im2col_int8", x, batch_inner=1, **attrs)  # (G, K, N * OH * OW)
        cols = b.Reshape(cols, b.const([k, n * oh * ow])) if g == 1 else cols
        products = b.MatMulInteger(b.Reshape(b.Cast(w, to=TensorProto.INT8), weights), cols)
        return b.Reshape(products, b.const([oc, n, oh, ow])), {"batch_inner": 1}
    wide = tuple(a.strides) == (1, 1)
    width = x.shape[3] + 2 * pw if wide else ow
    cols = b.node("im2col_uint8", x, **attrs, **({"wide": 1} if wide else {}))  # (N, G, K, OH * W')
    wq = b.Cast(b.Add(b.Cast(w, to=TensorProto.INT32), b.const(128, np.int32)), to=TensorProto.UINT8)
    zero = b.const(128, np.uint8)
    products = b.MatMulInteger(b.Reshape(wq, weights), cols, zero, zero)
    return b.Reshape(products, b.const([n, oc, oh, width])), {"width": ow} if width > ow else {}


def _im2col_rows(b, a, x, **attrs) -> str:
    """The native ``im2col_rows`` of conv2d ``a``'s geometry on x: (N, OH * OW, K), K = kh * kw * C."""
    (kh, kw), (ph, pw) = a.kernel_size, a.padding
    return b.node("im2col_rows", x, domain=NATIVE_DOMAIN, kernel_shape=[kh, kw], strides=list(a.strides),
                  dilations=list(a.dilation), pads=[ph, pw, ph, pw], **attrs)


def conv2d_rows(b, a, x, w) -> tuple[str, dict]:
    """conv(x, w) (one group) as rows: the native ``im2col_rows`` gathers each output position's window as one row,
    K = kh * kw * C bytes in the order (fh, fw, c), holding x itself when x is proven >= 0 (offset 0: values in [0,
    127], checked by the kernel) or x + 128 (offset 128, zero point 128); MatMulInteger multiplies the rows by the
    constant (K, OC) weights w + 128 (uint8, zero point 128): sum (x + o - o)(w + 128 - 128) = sum w x. uint8 x
    uint8 here (exact on every ISA); the target's operands (``cvm_onnx.serving.cpu_layout``) make the weights int8
    where uint8 x int8 is exact (docs/semantics.md: offset 0 bounds every int16 pair sum by 2 * 127 * 128 < 2^15).

    Returns the products, (N, OH * OW, OC), and ``requantize``'s ``rows`` (OH, OW), which writes them as NCHW."""
    n, c, oc, oh, ow, _ = _conv_shape(b, a, x)
    kh, kw = a.kernel_size
    offset = 0 if x.nonneg else 128
    rows = _im2col_rows(b, a, x, offset=offset)
    wt = b.Reshape(b.Transpose(w, perm=[2, 3, 1, 0]), b.const([kh * kw * c, oc]))
    wq = b.Cast(b.Add(wt, b.const(128, np.int32)), to=TensorProto.UINT8)
    zero = b.const(128, np.uint8)
    return b.MatMulInteger(rows, wq, zero if offset else "", zero), {"rows": [oh, ow]}


def conv2d_unsigned(b, a, u, w: np.ndarray, zero: int) -> tuple[str, dict]:
    """conv(u - zero, w) (one group; u in [0, 255], zero in [0, 255], the convolution's zero padding being
    u - zero = 0) as rows: ``im2col_rows`` with ``zero`` gathers u itself (checked in [0, 255]) and ``zero`` in the
    padding, and MatMulInteger multiplies the rows, zero point ``zero``, by the constant (K, OC) weights w + 128
    (uint8, zero point 128): sum (u - zero)(w + 128 - 128) = sum (u - zero) w, each padded term 0. uint8 x uint8
    (exact on every ISA: raw sums <= K * 255 * 255 < 2^31); the target's operands make the weights int8 only
    where uint8 x int8 is exact for any operands (VNNI: operands "u8s8"). Returns the products, (N, OH * OW, OC), and
    ``requantize``'s ``rows`` (OH, OW)."""
    n, c, oc, oh, ow, _ = _conv_shape(b, a, u)
    kh, kw = a.kernel_size
    rows = _im2col_rows(b, a, u, offset=0, zero=zero)
    return _unsigned_products(b, rows, w.transpose(2, 3, 1, 0).reshape(kh * kw * c, oc), zero), {"rows": [oh, ow]}


def _unsigned_products(b, u, wk: np.ndarray, zero: int) -> str:
    """MatMulInteger of uint8 u (zero point ``zero``) by the constant (K, OC) int8 weights ``wk`` as wk + 128
    (uint8, zero point 128): sum (u - zero)(wk + 128 - 128) = sum (u - zero) wk."""
    wq = (wk.astype(np.int32) + 128).astype(np.uint8)
    return b.MatMulInteger(u, b.const(wq, np.uint8), b.const(zero, np.uint8), b.const(128, np.uint8))


def conv2d_float(b, a, x, w, chunks: list[tuple[int, int]], bias=None) -> str:
    """One float32 Conv per chunk of each group's input channels, each Cast to int32, added in int32; a
    ``bias`` is given only with a single chunk whose sums, bias included, stay within 2^24."""
    if len(chunks) == 1:
        return _to_int(b, conv2d_float32(b, a, x, w, bias))
    n, c, oc, oh, ow, g = _conv_shape(b, a, x)
    h, wd = x.shape[2:]
    cg = c // g
    conv = _conv_attrs(a)
    xf = b.Cast(x, to=TensorProto.FLOAT)
    wf = b.Cast(w, to=TensorProto.FLOAT)
    xg = b.Reshape(xf, b.const([n, g, cg, h, wd]))
    parts = [_to_int(b, b.Conv(b.Reshape(_slice(b, xg, 2, lo, hi), b.const([n, g * (hi - lo), h, wd])),
                               _slice(b, wf, 1, lo, hi), **conv))
             for lo, hi in chunks]
    return _sum_int32(b, parts)


@lowering("conv2d")
def conv2d(b, a, x, w, bias=None):
    """2-D convolution NCHW/OIHW (groups, dilation, zero padding), int32 accumulation, then + bias.

    Fast form: float32 Conv where every partial sum is an integer within 2^24 (exact), split over input
    channels when needed, the chunks added in int32 (wraps like the runtime); the bias inside the Conv when the
    sums with it stay within 2^24, else added in int32. Otherwise Pad + im2col + int32 MatMul, which wraps
    modulo 2^32 exactly as the runtime's int32 accumulator.
    """
    kh, kw = a.kernel_size
    chunks = float_chunks(x.bound, weight_sums(w, kh * kw)) if b.conv_form == "fast" else None
    if chunks is None:
        y = conv2d_core(b, a, x, w)
    elif bias is not None and len(chunks) == 1 and b.outputs[0].bound <= FLOAT_EXACT:
        return conv2d_float(b, a, x, w, chunks, bias)
    else:
        y = conv2d_float(b, a, x, w, chunks)
    return y if bias is None else b.Add(y, b.Reshape(bias, b.const([-1, 1, 1])))


# -- dense ------------------------------------------------------------------------------------------------------

def dense_float32(b, a, x, w, bias=None, scale: float = 1.0, offset: float = 0.0) -> str:
    """(x @ w^T + bias + offset) * scale as one float32 Gemm (float32 out); ``scale`` a power of two."""
    wf, biases = _scaled(b, w, bias, w.shape[0], scale, offset)
    return b.Gemm(b.Cast(x, to=TensorProto.FLOAT), wf, *biases, transB=1)


def dense_float(b, x, w, chunks: list[tuple[int, int]], bias=None) -> str:
    """One float32 Gemm x[:, lo:hi] @ w[:, lo:hi]^T per chunk, each Cast to int32, added in int32; a ``bias``
    is given only with a single chunk whose sums, bias included, stay within 2^24."""
    if len(chunks) == 1:
        return _to_int(b, dense_float32(b, None, x, w, bias))
    xf = b.Cast(x, to=TensorProto.FLOAT)
    wf = b.Cast(w, to=TensorProto.FLOAT)
    return _sum_int32(b, [_to_int(b, b.Gemm(_slice(b, xf, 1, lo, hi), _slice(b, wf, 1, lo, hi), transB=1))
                          for lo, hi in chunks])


def dense_unsigned_exact(w: np.ndarray) -> bool:
    """Whether ``dense_unsigned`` is exact for weight ``w`` (OC, K): within int8, at most ``INT8_K`` products."""
    return w.shape[1] <= INT8_K and int(w.min(initial=0)) >= -128 and int(w.max(initial=0)) <= 127


def dense_unsigned(b, u, w: np.ndarray, zero: int) -> str:
    """(u - zero) @ w^T (u (N, K) in [0, 255], zero in [0, 255], w (OC, K) within int8, K <= ``INT8_K``) as
    MatMulInteger of u cast to uint8 (exact: u is proven in [0, 255]), zero point ``zero``, by the constant (K, OC)
    weights w + 128 (uint8, zero point 128): sum (u - zero)(w + 128 - 128) = sum (u - zero) w, each raw sum
    <= K * 255 * 255 < 2^31 (uint8 x uint8, exact on every ISA), so the int32 result is the runtime's."""
    return _unsigned_products(b, b.Cast(u, to=TensorProto.UINT8), w.T, zero)


@lowering("dense")
def dense(b, a, x, w, bias=None):
    """y = x @ w^T (int32 accumulation), then + bias.

    Fast form: float32 Gemm where every partial sum is an integer within 2^24 (exact), split over K when
    needed, the chunks added in int32; the bias inside the Gemm when the sums with it stay within 2^24, else
    added in int32. Otherwise int32 MatMul, which wraps exactly as the runtime's accumulator.
    """
    chunks = float_chunks(x.bound, weight_sums(w, 1)) if b.conv_form == "fast" else None
    if chunks is None:
        y = b.MatMul(x, b.Transpose(w, perm=[1, 0]))
    elif bias is not None and len(chunks) == 1 and b.outputs[0].bound <= FLOAT_EXACT:
        return dense_float(b, x, w, chunks, bias)
    else:
        y = dense_float(b, x, w, chunks)
    return y if bias is None else b.Add(y, bias)


# -- max_pool2d -------------------------------------------------------------------------------------------------

@lowering("max_pool2d")
def max_pool2d(b, a, x):
    """Max over each window; padded positions never win.

    The input is padded explicitly with -inf, below every input value, to the runtime's extent: top/left =
    padding, bottom/right = enough for the last window (ceil_mode may reach past the padding). Every window holds
    at least one input position (padding < pool_size; with ceil_mode the last window starts inside the input), so
    the sentinel never changes a maximum. The windows of an unpadded MaxPool over that tensor are then exactly the
    runtime's. float32 holds every integer of magnitude <= 2^24 exactly (and ORT's float MaxPool is about 10x
    faster than its int8 one); wider inputs pool in float64, which holds every int32 (not int32 windows +
    ReduceMax: onnxruntime's CUDA int32 ReduceMax compares in float32, and CUDA has no int32 Pad).
    """
    _, _, h, w = x.shape
    _, _, oh, ow = b.outputs[0].shape
    (kh, kw), (sh, sw), (ph, pw) = a.pool_size, a.strides, pool_pads(a.padding)
    bottom = max(ph + h, (oh - 1) * sh + kh) - ph - h
    right = max(pw + w, (ow - 1) * sw + kw) - pw - w
    pads = b.const([0, 0, ph, pw, 0, 0, bottom, right])
    dtype, to = (np.float32, TensorProto.FLOAT) if x.bound <= FLOAT_EXACT else (np.float64, TensorProto.DOUBLE)
    xp = b.Pad(b.Cast(x, to=to), pads, b.const(-np.inf, dtype))
    return _to_int(b, b.MaxPool(xp, kernel_shape=[kh, kw], strides=[sh, sw]))


# -- upsampling, relu -------------------------------------------------------------------------------------------

@lowering("upsampling")
def upsampling(b, a, x):
    """Nearest neighbour, y[n,c,h,w] = x[n,c,h/s,w/s]: each value repeated s x s by Reshape/Expand/Reshape."""
    n, c, h, w = x.shape
    s = a.scale
    if s == 1:
        return x.name
    y = b.Expand(b.Reshape(x, b.const([n, c, h, 1, w, 1])), b.const([n, c, h, s, w, s]))
    return b.to_output_shape(y)


@lowering("relu")
def relu(b, a, x):
    """max(x, 0), as Max rather than Relu: onnxruntime's Relu -> Clip fusion throws on int32 (a relu followed by
    cvm_clip would make the model unloadable), and Max has int32 kernels on CUDA too, Relu none."""
    return b.Max(x, b.const(0, np.int32))
