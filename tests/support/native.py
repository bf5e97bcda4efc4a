"""The native kernels' oracles and models: im2col (its windows gathered by numpy) and requantize (its steps in
int64, wrapped to int32 as the kernel computes), one-node models of each, and their strategies."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper

from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.native import DOMAIN

from .oracles import wrap


def im2col_oracle(x, kernel, strides, dilations, pads, group, offset, wide=False):
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (dh, dw), (pt, pl, pb, pr) = kernel, strides, dilations, pads
    xp = np.pad(x.astype(np.int64) + offset, [(0, 0), (0, 0), (pt, pb), (pl, pr)], constant_values=offset)
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    if wide:  # each window position: OH padded rows read on from (fh * dh, fw * dw), past the plane into offsets
        hp, wp = xp.shape[2:]
        flat = np.concatenate([xp.reshape(n, c, hp * wp), np.full((n, c, dw * (kw - 1)), offset)], axis=2)
        cols = np.stack([flat[:, :, fh * dh * wp + fw * dw:][:, :, :oh * wp] for fh in range(kh) for fw in range(kw)],
                        axis=2)
        return cols.reshape(n, group, c // group * kh * kw, oh * wp)
    cols = np.empty((n, c, kh, kw, oh, ow), np.int64)
    for fh in range(kh):
        for fw in range(kw):
            rows, columns = fh * dh + np.arange(oh) * sh, fw * dw + np.arange(ow) * sw
            cols[:, :, fh, fw] = xp[:, :, rows][:, :, :, columns]
    return cols.reshape(n, group, c // group * kh * kw, oh * ow)


def im2col_model(op: str, shape, elem_type=TensorProto.INT32, **attrs) -> onnx.ModelProto:
    out = TensorProto.INT8 if op == "im2col_int8" else TensorProto.UINT8
    node = helper.make_node(op, ["x"], ["y"], domain=DOMAIN, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem_type, shape)],
                              [helper.make_tensor_value_info("y", out, [None] * (3 if op == "im2col_rows" else 4))])
    return onnx_model(graph, domains={DOMAIN: 1})


@st.composite
def windows(draw):
    """A 2-D window geometry: kernel, strides, dilations, pads and an input size (h, w) the kernel fits."""
    kernel = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    strides = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilations = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    h = draw(st.integers(max(1, dilations[0] * (kernel[0] - 1) + 1 - pads[0] - pads[2]), 9))
    w = draw(st.integers(max(1, dilations[1] * (kernel[1] - 1) + 1 - pads[1] - pads[3]), 9))
    return kernel, strides, dilations, pads, (h, w)


@st.composite
def geometries(draw):
    group = draw(st.sampled_from([1, 1, 2, 3]))
    c = group * draw(st.integers(1, 3))
    kernel, strides, dilations, pads, (h, w) = draw(windows())
    return (draw(st.integers(1, 2)), c, h, w), kernel, strides, dilations, pads, group


def requantize_oracle(x, bias, steps, scales=()):
    v = x.astype(np.int64)
    if len(scales):
        v = wrap(v * np.array(scales, np.int64).reshape(1, -1, *([1] * (x.ndim - 2))), 32)
    if bias.size:
        v = wrap(v + bias.astype(np.int64).reshape(1, -1, *([1] * (x.ndim - 2))), 32)
    for kind, a, b in steps:
        if kind == 0:
            v = wrap(v + (1 << (a - 1) if a else 0), 32) >> a
        elif kind == 1:
            v = wrap(v * a, 32)
        elif kind == 2:
            v = wrap(v + a, 32)
        elif kind == 4:  # floor(v a / 2^b), exact in Python integers
            v = wrap(v.astype(object) * a >> b, 32).astype(np.int64)
        elif kind == 5:  # round_half_even(v / 2^a) (Python's round of a Fraction); wrapped where v + 2^(a-1) wraps
            v = np.vectorize(lambda x: half_even(int(x), a), otypes=[np.int64])(v) if v.size else v
        else:
            v = np.clip(v, a, b)
    return v.astype(np.int32)


def channels_oracle(x, bias, per):
    """Each channel's own steps ``per[k]`` on x (N, P, C) + bias (none, (C,) or (P, C)), channels last:
    ``requantize_oracle`` channel by channel, (N, P, C) int32."""
    v = wrap(x.astype(np.int64) + (bias.astype(np.int64) if bias.size else 0), 32)
    none = np.zeros(0, np.int32)
    return np.stack([requantize_oracle(v[..., k], none, per[k]) for k in range(x.shape[-1])], axis=-1)


def requantize_add_oracle(x, bias, per, addend, addend_steps, sum_steps):
    """requantize_add's values, channels last (N, P, C): ``channels_oracle``, plus the addend (N, P, C) after its
    steps, wrapping in int32, then the sum's steps."""
    none = np.zeros(0, np.int32)
    added = requantize_oracle(addend.astype(np.int64), none, addend_steps)
    return requantize_oracle(wrap(channels_oracle(x, bias, per).astype(np.int64) + added, 32), none, sum_steps)


def requantize_model(shape, channels: int, steps, width: int = 0, scales=()) -> onnx.ModelProto:
    node = helper.make_node("requantize", ["x", "b"], ["y"], domain=DOMAIN, steps=[v for s in steps for v in s],
                            **({"width": width} if width else {}), **({"scales": list(scales)} if scales else {}))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT32, shape),
                                            helper.make_tensor_value_info("b", TensorProto.INT32, [channels])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32,
                                                             [*shape[:-1], width] if width else shape)])
    return onnx_model(graph, domains={DOMAIN: 1})


int32s = st.integers(-(1 << 31), (1 << 31) - 1)
step = st.one_of(st.tuples(st.just(0), st.integers(1, 31), st.just(0)),
                 st.tuples(st.sampled_from([1, 2]), st.one_of(int32s, st.sampled_from([0, 1, -1, -(1 << 31)])),
                           st.just(0)),
                 st.tuples(int32s, int32s).map(sorted).map(lambda ab: (3, *ab)))
#: A product in two parts (the CPU kernel's mul64): (4, m1 2^b + m0, b), m1 an int32, 0 <= m0 < 2^b.
mul64 = st.integers(0, 31).flatmap(lambda b: st.tuples(
    st.just(4), st.tuples(st.one_of(int32s, st.sampled_from([0, 1, -1, -(1 << 31), (1 << 31) - 1])),
                          st.integers(0, (1 << b) - 1) | st.sampled_from([0, (1 << b) - 1])).map(
        lambda m: (m[0] << b) + m[1]), st.just(b)))
#: A shift rounding half to even (the CPU kernel's even): (5, s, 0), s in 0..31 (0: the value itself).
even = st.tuples(st.just(5), st.integers(0, 31), st.just(0))
#: Steps of the CPU kernel, which also takes shift 0 (the value itself: identity steps aligning channel_steps),
#: mul64 and even.
cpu_step = st.one_of(step, st.just((0, 0, 0)), mul64, even)


def half_even(v: int, s: int) -> int:
    """round_half_even(v / 2^s) for an int32 v where v + 2^(s-1) is one (the kernel's proven domain); past it, the
    kernel's int32 sum (v + 2^(s-1) - 1 + bit s of v, wrapped) shifted."""
    if not s:
        return v
    if v + (1 << (s - 1)) <= (1 << 31) - 1:
        return round(Fraction(v, 1 << s))
    return wrap(v + (1 << (s - 1)) - 1 + ((v >> s) & 1), 32) >> s
