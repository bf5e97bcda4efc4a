"""The QOperator form (QLinearConv, QLinearMatMul, QGemm, QLinearAdd, ...): compositions of the QDQ rules,
QuantizeLinear(op(DequantizeLinear(x), ...)).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..context import INT32, Tensor
from ..emit import as_int32
from ..registry import Refuse, rule
from .elementwise import FUNCTIONS, add_rule, mapped, multiply
from .moves import concat_rule
from .products import (average, conv, dense, gemm_factor, global_average, matmul_rank, one_matrix, ranked, times,
                       variable_matmul, weight)
from .qdq import dequantize, out_type, quantize, softmax_view
from .values import MS, Scaled, Softmaxed, per_tensor, scale_of, zero_of


def dequantized(x, s, z, axis: int | None = None) -> Scaled:
    """DequantizeLinear(x, s, z) of a QOperator node's input."""
    return dequantize(None, x, s, z, axis)


def requantized(ctx, node, value, s, z) -> Tensor:
    """QuantizeLinear(value, s, z) of a QOperator node's output."""
    dtype = out_type(node, z)
    return quantize(ctx, value, scale_of(s, "y_scale"), zero_of(z, dtype, "y_zero_point"), dtype)


def bias_of(b: Tensor | None, x: Scaled, w: Scaled) -> Scaled | None:
    if b is None:
        return None
    return Scaled(b, np.asarray(x.scale.reshape(()).item() * np.broadcast_to(w.scale, (w.t.shape[0],) +
                                                                         (1,) * (len(w.shape) - 1)).reshape(-1)),
                  np.zeros((), np.int64))


@rule("QLinearConv", since=10)
def qlinear_conv(ctx, node, x, xs, xz, w, ws, wz, ys, yz, b=None):
    xv, wv = dequantized(x, xs, xz), dequantized(w, ws, wz, 0)
    return requantized(ctx, node, conv(ctx, node, xv, wv, bias_of(b, xv, wv)), ys, yz)


@rule("QLinearMatMul", since=10)
def qlinear_matmul(ctx, node, a, a_s, az, b, bs, bz, ys, yz):
    """a @ b requantized; b's scales and zero points per tensor or per column (its last axis, at any rank)."""
    av, bv = dequantized(a, a_s, az), dequantized(b, bs, bz, max(len(b.shape) - 1, 0))
    if not bv.t.is_const:
        return requantized(ctx, node, variable_matmul(ctx, av, bv), ys, yz)
    w, sw = weight(one_matrix(bv, "QLinearMatMul weight"), "the QLinearMatMul weight B", transpose=True)
    return requantized(ctx, node, ranked(ctx, dense(ctx, av, w, sw, None), matmul_rank(av, bv)), ys, yz)


@rule("QGemm", since=1, domain=MS)
def qgemm(ctx, node, a, a_s, az, b, bs, bz, c=None, ys=None, yz=None):
    """alpha (A' B' + C) as onnxruntime's kernel computes it: C int32 in the accumulator, beta unread; A' = A^T under
    transA; the scale alpha s_a s_b (``times``)."""
    alpha = gemm_factor(node, "alpha")
    if alpha == 0:
        raise Refuse("QGemm with alpha 0: its product is unused (no CVM form here)")
    trans = bool(node.attr_int("transB", 0))
    av, bv = dequantized(a, a_s, az), dequantized(b, bs, bz, 0 if trans else 1)
    if len(bv.shape) != 2:
        raise Refuse(f"Gemm weight B of shape {bv.shape}: Gemm takes a matrix")
    if node.attr_int("transA", 0):
        av = replace(av, t=ctx.result(ctx.op("transpose", as_int32(av.t), axes=(1, 0)), INT32, av.t.lo, av.t.hi,
                                      av.shape[::-1]))
    w, sw = weight(bv, "the QGemm weight B", transpose=not trans)
    bias = None if c is None else Scaled(c, np.asarray(av.scale.reshape(()).item() * sw), np.zeros((), np.int64))
    y = times(ctx, dense(ctx, av, w, sw, bias), alpha)
    return y if ys is None else requantized(ctx, node, y, ys, yz)


@rule("QLinearAdd", "QLinearMul", since=1, domain=MS)
def qlinear_binary(ctx, node, a, a_s, az, b, bs, bz, ys, yz=None):
    av, bv = dequantized(a, a_s, az), dequantized(b, bs, bz)
    value = add_rule(ctx, node, av, bv) if node.op_type == "QLinearAdd" else multiply(ctx, av, bv)
    return requantized(ctx, node, value, ys, yz)


@rule("QLinearConcat", since=1, domain=MS)
def qlinear_concat(ctx, node, ys, yz, *triples):
    xs = [dequantized(*triples[i:i + 3]) for i in range(0, len(triples), 3)]
    return requantized(ctx, node, concat_rule(ctx, node, *xs), ys, yz)


def _channels_first(node) -> None:
    if node.attr_int("channels_last", 0):
        raise Refuse("channels_last has no CVM form here")


@rule("QLinearAveragePool", since=1, domain=MS)
def qlinear_average_pool(ctx, node, x, xs, xz, ys, yz=None):
    _channels_first(node)
    return requantized(ctx, node, average(ctx, node, dequantized(x, xs, xz), whole_kernel=True), ys, yz)


@rule("QLinearGlobalAveragePool", since=1, domain=MS)
def qlinear_global_average_pool(ctx, node, x, xs, xz, ys, yz):
    _channels_first(node)
    return requantized(ctx, node, global_average(ctx, dequantized(x, xs, xz)), ys, yz)


@rule("QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftsign", since=1, domain=MS)
def qlinear_function(ctx, node, x, xs, xz, ys, yz=None):
    fn = FUNCTIONS[node.op_type[len("QLinear"):]](node)
    return requantized(ctx, node, mapped(dequantized(x, xs, xz), fn, node.op_type), ys, yz)


@rule("QLinearSoftmax", since=1, domain=MS)
def qlinear_softmax(ctx, node, x, xs, xz, ys, yz):
    """QuantizeLinear(Softmax(DequantizeLinear(x))), Softmax at the semantics of the node's ``opset`` attribute."""
    xv = dequantized(x, xs, xz)
    value = Softmaxed(per_tensor(xv, "QLinearSoftmax"), softmax_view(node, xv.shape, node.attr_int("opset", 13)))
    return requantized(ctx, node, value, ys, yz)
