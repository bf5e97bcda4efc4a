"""Op classes of shipped models the quantized import refused before, of dequantized values: 3-D ConvTranspose (3-D
U-Nets, video and medical models), LRN (AlexNet, CaffeNet, GoogLeNet), ReduceProd, and ConvTranspose sized by
auto_pad or output_shape (tf2onnx's Conv2DTranspose)."""
from __future__ import annotations

import math
import re
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import (between_convs, conv_transpose_qdq, qdq, quantizes_whole,
                               transposed_conv_is_onnxruntimes)
from test_quantized_fresh_ops import NP, oracle_equal, run

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.from_onnx.quantized.lrn import lrn_plan
from cvm_onnx.converters.from_onnx.requant_plans import NoPlan
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.format.onnx_file import onnx_model


# -- 3-D ConvTranspose -------------------------------------------------------------------------------------------
def conv_transpose_3d_attrs(d, spatial: tuple[int, ...], kernel: tuple[int, ...]) -> dict:
    """Strides, dilations, pads up to the dilated kernel's reach, output_padding below the stride (onnxruntime's
    rule), a group."""
    strides = [d.draw(st.integers(1, 3)) for _ in spatial]
    dil = [d.draw(st.integers(1, 2)) for _ in spatial]
    return {"strides": strides, "dilations": dil, "kernel_shape": list(kernel),
            "pads": [d.draw(st.integers(0, dd * (k - 1))) for dd, k in zip(dil + dil, kernel + kernel)],
            "output_padding": [d.draw(st.integers(0, s - 1)) for s in strides]}


@settings(max_examples=25, deadline=None)
@given(d=st.data(), group=st.sampled_from([1, 2]), per=st.integers(1, 3), x_type=st.sampled_from([T.INT8, T.UINT8]),
       per_channel=st.booleans(), with_bias=st.booleans(), fill=st.sampled_from(["random", "min", "max"]))
def test_a_3d_conv_transpose_equals_the_oracle(d, group, per, x_type, per_channel, with_bias, fill):
    """QDQ ConvTranspose of (N, C, D, H, W) (groups, strides, dilations, pads, output_padding, per-channel weights
    along axis 1 as quantize_static writes them, a bias) equals the oracle: ConvTranspose's 3-D sum by its
    definition on the integers, then the requantization by its plan, at extreme inputs too. Regression: 'only a 1-D
    or 2-D ConvTranspose has a CVM form here'."""
    cin = 2 * group
    spatial = tuple(d.draw(st.integers(1, 4)) for _ in range(3))
    kernel = tuple(d.draw(st.integers(1, 3)) for _ in range(3))
    a = conv_transpose_3d_attrs(d, spatial, kernel)
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    zx = d.draw(st.integers(*((-128, 127) if x_type == T.INT8 else (0, 255))))
    shape = (d.draw(st.integers(1, 2)), cin) + spatial
    m = conv_transpose_qdq(rng, shape, x_type, zx, (cin, per) + kernel, group, per_channel, with_bias, **a)
    n = len(spatial)
    outs = [(size - 1) * a["strides"][i] - a["pads"][i] - a["pads"][n + i] + a["dilations"][i] * (kernel[i] - 1) + 1
            + a["output_padding"][i] for i, size in enumerate(spatial)]
    if min(outs) < 1:
        with pytest.raises(UnsupportedError, match=r"up \(ConvTranspose\).*output .* is empty"):
            import_model(m, input_precision=9)
        return
    info = np.iinfo(NP[x_type])
    x = rng.integers(info.min, int(info.max) + 1, shape) if fill == "random" else \
        np.full(shape, info.min if fill == "min" else info.max)
    oracle_equal(m, x)


@pytest.mark.parametrize("attrs, depth", [({"dilations": [2, 1, 1]}, 1), ({"strides": [3, 1, 1]}, 2)])
def test_a_3d_conv_transposes_depth_windows_of_zeros_only_are_zeros(attrs, depth):
    """Depth windows that read only padding (a depth of 1 by 2 taps 2 apart) or only inserted zeros (stride 3 past
    2 taps) are outputs of 0: equal to the oracle. Regression (the first): refused 'has a depth window of padding
    only'."""
    w = np.random.default_rng(4).integers(-127, 128, (2, 2, 2, 1, 1)).astype(np.int8)
    inits = {"s": np.float32(0.05), "zx": np.uint8(3), "w": w, "sw": np.float32(0.01), "so": np.float32(0.1),
             "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"]),
             h.make_node("ConvTranspose", ["xf", "wf"], ["c"], name="up", **attrs),
             h.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"])]
    shape = (1, 2, depth, 2, 2)
    oracle_equal(qdq(nodes, shape, T.UINT8, inits, T.INT8), np.arange(8 * depth).reshape(shape) * 31 % 256)


@pytest.mark.parametrize("dilation", [(1 << 31) - 1, 1 << 22])
def test_a_3d_conv_transposes_huge_depth_padding_is_refused_before_it_is_allocated(dilation):
    """A depth dilation of 2^31 - 1 (2^22) pads the depth with that many zero slices: refused in one line before
    they are allocated. Regression (the hand grid's case): MemoryError, 'Unable to allocate 144. GiB'."""
    m = conv_transpose_qdq(np.random.default_rng(0), (1, 2, 2, 3, 3), T.UINT8, 7, (2, 2, 2, 2, 2), 1, False, True,
                           dilations=[dilation, 1, 1])
    with pytest.raises(UnsupportedError, match=r"^up \(ConvTranspose\): folding it would compute a constant of \d+ "
                                               r"elements \(at most 2\^24 are folded\)$"):
        import_model(m, input_precision=9)


@settings(max_examples=20, deadline=None)
@given(d=st.data(), group=st.sampled_from([1, 2]))
def test_the_3d_oracle_is_onnxruntimes_on_the_integers(d, group):
    """The oracle itself against onnxruntime's float 3-D ConvTranspose on small integers (exact in float32): so the
    property above compares with ConvTranspose as ONNX defines it."""
    spatial = tuple(d.draw(st.integers(1, 4)) for _ in range(3))
    kernel = tuple(d.draw(st.integers(1, 3)) for _ in range(3))
    a = dict(conv_transpose_3d_attrs(d, spatial, kernel), group=group)
    rng = np.random.default_rng(d.draw(st.integers(0, 99)))
    x = rng.integers(-20, 21, (1, 2 * group) + spatial).astype(np.float32)
    w = rng.integers(-20, 21, (2 * group, 2) + kernel).astype(np.float32)
    n = len(spatial)
    if min((size - 1) * a["strides"][i] - a["pads"][i] - a["pads"][n + i] + a["dilations"][i] * (kernel[i] - 1) + 1
           + a["output_padding"][i] for i, size in enumerate(spatial)) < 1:
        return
    assert transposed_conv_is_onnxruntimes(x, w, a)


def conv_transpose_3d_model() -> onnx.ModelProto:
    """A 3-D U-Net's decoder step: Conv 3-D (2 -> 4 channels), Relu, ConvTranspose 3-D (stride 2, pads 1,
    output_padding 1) back to 2 channels, on (1, 2, 4, 6, 6)."""
    rng = np.random.default_rng(3)
    g = h.make_graph([h.make_node("Conv", ["x", "w1", "b1"], ["c"], kernel_shape=[3, 3, 3], pads=[1] * 6),
                      h.make_node("Relu", ["c"], ["r"]),
                      h.make_node("ConvTranspose", ["r", "w2", "b2"], ["y"], kernel_shape=[3, 3, 3], strides=[2] * 3,
                                  pads=[1] * 6, output_padding=[1] * 3)], "up",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 6, 6])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(rng.normal(size=s).astype(np.float32) * 0.3, n) for n, s in
                      (("w1", (4, 2, 3, 3, 3)), ("b1", (4,)), ("w2", (4, 2, 3, 3, 3)), ("b2", (2,)))])
    return onnx_model(g, 17)


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_float_model_with_a_3d_conv_transpose_quantizes_whole(tmp_path, per_channel):
    """quantize takes a Conv 3-D + ConvTranspose 3-D model whole: within 1.1x onnxruntime's distance from float, the
    export exact. Regression: refused 'only a 1-D or 2-D ConvTranspose has a CVM form here'."""
    quantizes_whole(tmp_path, conv_transpose_3d_model(), per_channel)


# -- LRN -----------------------------------------------------------------------------------------------------------
def window_sums(u: np.ndarray, size: int) -> np.ndarray:
    """sum u^2 over each channel window c - floor((size - 1) / 2) .. c + ceil((size - 1) / 2), exactly."""
    sq = u.astype(object) ** 2
    c, b = u.shape[1], (size - 1) // 2
    return np.stack([sq[:, max(0, i - b):min(c, i - b + size)].sum(axis=1) for i in range(c)], axis=1)


def lrn_exact(u: np.ndarray, size: int, s: float, so: float, alpha: float, beta: float, bias: float) -> np.ndarray:
    """LRN of x = u s in steps of s_out, to 40 digits: u s (bias + alpha / size V s^2)^-beta / s_out, V the window
    sums of u^2."""
    getcontext().prec = 40
    d = [Decimal(v) for v in (s, so, alpha, beta, bias)]
    return np.vectorize(lambda ui, v: Decimal(int(ui)) * d[0] / d[1] * (d[4] + d[2] / size * d[0] ** 2 * int(v))
                        ** -d[3], otypes=[object])(u, window_sums(u, size))


def lrn_model(shape, x_type, size: int, s: float, zx: int, so: float, zo: int, **attrs):
    inits = {"s": np.float32(s), "z": NP[x_type](zx), "so": np.float32(so), "zo": np.int8(zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("LRN", ["xf"], ["g"], name="lrn", size=size, **attrs),
             h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    return qdq(nodes, shape, x_type, inits, T.INT8)


@settings(max_examples=25, deadline=None)
@given(d=st.data(), x_type=st.sampled_from([T.INT8, T.UINT8]), size=st.integers(1, 7),
       s=st.floats(2.0**-8, 2.0**2, width=32), so=st.floats(2.0**-7, 2.0**-1, width=32), zo=st.integers(-30, 30),
       alpha=st.floats(2.0**-17, 2.0, width=32), beta=st.floats(-1.0, 2.0, width=32),
       bias=st.floats(0.25, 3.0, width=32))
def test_lrn_is_within_its_bound_of_the_exact_value(d, x_type, size, s, so, zo, alpha, beta, bias):
    """LRN of a dequantized value over (N, C, ...) (any size, alpha, beta, bias; 1-D and 2-D images):
    every output within 1/2 + E output steps of the exact LRN (to 40 digits), saturated alike, E the plan's bound
    (docs/import.md, "LRN: the integer form and its bound"), extreme integers included; refused in one line where
    1/2 + E passes one step or the gain times |u| passes 32 bits.
    Regression: 'no CVM op for ONNX LRN'."""
    shape = (d.draw(st.integers(1, 2)), d.draw(st.integers(1, 8))) + \
        tuple(d.draw(st.integers(1, 3)) for _ in range(d.draw(st.integers(1, 2))))
    lo, hi = np.iinfo(NP[x_type]).min, np.iinfo(NP[x_type]).max
    zx = d.draw(st.integers(int(lo), int(hi)))
    m = lrn_model(shape, x_type, size, s, zx, so, zo, alpha=alpha, beta=beta, bias=bias)
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    x = rng.integers(int(lo), int(hi) + 1, shape)
    x.reshape(-1)[:2] = (lo, hi)[:x.size]
    if d.draw(st.booleans()):
        x[:, ::2] = d.draw(st.sampled_from([lo, hi]))  # windows of the largest sums
    w = max(zx - int(lo), int(hi) - zx)
    try:
        lrn_plan(w, size, *(Fraction(v) for v in (s, so, alpha, beta, bias)), max(zo + 128, 127 - zo))
    except NoPlan as e:  # a gain past 32 bits, or spanning so much that the table is a step off: one line
        with pytest.raises(UnsupportedError, match=r"lrn \(LRN\): " + re.escape(str(e))):
            import_model(m, input_precision=9)
        return
    imp, [y] = run(m, x)
    [plan] = [r.lrn for r in imp.requants if r.lrn is not None]
    want = lrn_exact(x - zx, size, s, so, alpha, beta, bias)
    exact = np.vectorize(lambda e: min(max(e + zo, -128), 127), otypes=[object])(want)
    assert (np.abs(y.reshape(x.shape).astype(object) - exact) <= Decimal(0.5) + Decimal(plan.delta)).all()


@settings(max_examples=20, deadline=None)
@given(d=st.data(), size=st.sampled_from([1, 3, 5, 7]))
def test_the_lrn_oracles_window_is_onnxruntimes(d, size):
    """The oracle's channel windows against onnxruntime's float LRN (odd sizes: it takes no other): at alpha = size,
    beta = 1, bias = 1 it is y = x / (1 + V), and x / y - 1 rounds to V exactly (V < 2^10, float32's relative
    error 2^-23 a step)."""
    shape = tuple(d.draw(st.integers(1, n)) for n in (2, 9, 3, 3))
    x = np.random.default_rng(d.draw(st.integers(0, 99))).integers(-5, 6, shape)
    g = h.make_graph([h.make_node("LRN", ["x"], ["y"], size=size, alpha=float(size), beta=1.0, bias=1.0)], "t",
                     [h.make_tensor_value_info("x", T.FLOAT, list(shape))],
                     [h.make_tensor_value_info("y", T.FLOAT, None)])
    [got] = ort.InferenceSession(onnx_model(g, 13).SerializeToString(),
                                 providers=["CPUExecutionProvider"]).run(None, {"x": x.astype(np.float32)})
    at = x != 0
    assert np.array_equal(np.rint(x[at] / got[at].astype(np.float64) - 1), window_sums(x, size)[at].astype(np.int64))


@pytest.mark.parametrize("attrs, s, so, message", [
    ({"size": 3, "bias": 0.0}, 0.05, 0.1, r"lrn \(LRN\): LRN bias 0: only bias > 0"),
    ({"size": 3, "alpha": 1e-4, "beta": 2.0, "bias": 0.25}, 4.0, 2.0**-7, r"lrn \(LRN\): .*more than one step"),
    ({"size": 3}, 1e19, 0.1, r"lrn \(LRN\): LRN's sum of 3 squares of values up to 255 x 1e\+19: it passes float32"),
    ({"size": 3, "beta": float("nan")}, 0.05, 0.1, r"lrn \(LRN\): LRN alpha 0.0001, beta nan, bias 1: each must be"),
    ({"size": 3, "alpha": -1.0}, 0.05, 0.1, r"lrn \(LRN\): bias \+ alpha / size s\^2 V reaches 0 or below")])
def test_lrn_refusals_name_the_node(attrs, s, so, message):
    with pytest.raises(UnsupportedError, match=message):
        import_model(lrn_model((1, 4, 2, 2), T.UINT8, s=s, zx=0, so=so, zo=0, **attrs), input_precision=9)


def test_an_lrn_of_too_many_window_taps_is_refused_before_they_are_allocated():
    with pytest.raises(UnsupportedError, match=r"lrn \(LRN\): its 600 x 30000 windows along axis 2 hold 18000000"):
        import_model(lrn_model((1, 600, 1, 1), T.UINT8, 30000, 0.05, 0, 0.1, 0), input_precision=9)


def lrn_between_convs(pool_first: bool) -> onnx.ModelProto:
    """AlexNet's Conv -> Relu -> LRN -> MaxPool (GoogLeNet's MaxPool -> LRN), then a Conv; LRN size 5, alpha 1e-4,
    beta 0.75, bias 1 as they ship, its alpha raised to 0.02 so that the sums matter on unit-scale samples."""
    lrn = h.make_node("LRN", ["r" if not pool_first else "p", ], ["n"], size=5, alpha=0.02, beta=0.75, bias=1.0)
    pool = h.make_node("MaxPool", ["n" if not pool_first else "r"], ["p" if pool_first else "b"], kernel_shape=[3, 3],
                       strides=[2, 2])
    middle = [h.make_node("Relu", ["a"], ["r"])] + ([pool, lrn, h.make_node("Identity", ["n"], ["b"])] if pool_first
                                                    else [lrn, pool])
    return between_convs(middle, {})


@pytest.mark.parametrize("pool_first", [False, True])
@pytest.mark.parametrize("per_channel", [False, True])
def test_float_models_with_lrn_quantize_whole(tmp_path, pool_first, per_channel):
    """quantize takes AlexNet's and GoogLeNet's LRN blocks whole: within 1.1x onnxruntime's distance from float, the
    export exact. Regression: refused 'no CVM op for ONNX LRN'."""
    quantizes_whole(tmp_path, lrn_between_convs(pool_first), per_channel)


# -- ReduceProd ----------------------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(d=st.data(), x_type=st.sampled_from([T.INT8, T.UINT8]), s=st.floats(2.0**-4, 2.0**2, width=32),
       keep=st.integers(0, 1))
def test_reduce_prod_is_the_exact_product(d, x_type, s, keep):
    """ReduceProd of a dequantized value over any axes (keepdims either way, axes as an input at opset 18): the exact
    product of x - z at s^n, requantized by its plan, equal to the oracle of docs/import.md (extreme integers
    included); refused in one line where a partial product passes 32 bits, past 32 values or past float32's range.
    Regression: 'no CVM op for ONNX ReduceProd'."""
    shape = tuple(d.draw(st.integers(1, 3)) for _ in range(d.draw(st.integers(1, 3))))
    axes = d.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape),
                           unique_by=lambda a: a % len(shape)))
    n = math.prod(shape[a % len(shape)] for a in axes)
    lo, hi = np.iinfo(NP[x_type]).min, np.iinfo(NP[x_type]).max
    zx = d.draw(st.integers(int(lo), int(hi)))
    peak = max(zx - int(lo), int(hi) - zx)
    top = n * math.log2(s * peak)  # the products reach 2^top: a grid of about 100 steps to it
    inits = {"s": np.float32(s), "z": NP[x_type](zx), "so": np.float32(2.0 ** min(max(top - 7, -100), 100)),
             "zo": np.int8(d.draw(st.integers(-9, 9))), "ax": np.array(axes, np.int64)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("ReduceProd", ["xf", "ax"], ["g"], name="prod", keepdims=keep),
             h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    m = qdq(nodes, shape, x_type, inits, T.INT8, opset=18)
    x = np.random.default_rng(d.draw(st.integers(0, 2**16))).integers(int(lo), int(hi) + 1, shape)
    x.reshape(-1)[:2] = (lo, hi)[:x.size]
    try:
        oracle_equal(m, x)
    except UnsupportedError as e:
        why = str(e)
        assert why.startswith("prod (ReduceProd): ReduceProd of") and "\n" not in why
        assert ("passes 32 bits" in why and peak ** (n - 1) >= 2**22  # never where each step fits 32 bits
                or "float32's range" in why and (top >= 127 or n * math.log2(s) < -149))


@pytest.mark.parametrize("shape, s, message", [
    ((2, 5), 0.05, r"prod \(ReduceProd\): ReduceProd of 5 values of x - z up to 255: the product of 4 passes 32 bits"),
    ((1, 33), 0.05, r"prod \(ReduceProd\): ReduceProd of 33 values: at most 32"),
    ((1, 3), 2.0**50, r"prod \(ReduceProd\): ReduceProd of 3 values up to 255 x 1\.1259e\+15: the product leaves "
                      r"float32's range")])
def test_reduce_prod_refusals_name_the_node(shape, s, message):
    inits = {"s": np.float32(s), "z": np.uint8(0), "so": np.float32(1.0), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("ReduceProd", ["xf"], ["g"], name="prod", axes=[1]),
             h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    with pytest.raises(UnsupportedError, match=message):
        import_model(qdq(nodes, shape, T.UINT8, inits, T.INT8, opset=17), input_precision=9)


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_float_model_with_reduce_prod_quantizes_whole(tmp_path, per_channel):
    """quantize takes Conv -> ReduceProd over 2 channels -> Conv whole: within 1.1x onnxruntime's distance from float,
    the export exact. Regression: refused 'no CVM op for ONNX ReduceProd'."""
    split = nh.from_array(np.array([2, 6], np.int64), "sp")
    middle = [h.make_node("Split", ["a", "sp"], ["a2", "a6"], axis=1),
              h.make_node("ReduceProd", ["a2"], ["p"], axes=[1]),
              h.make_node("Mul", ["a6", "p"], ["b0"]),
              h.make_node("Concat", ["b0", "a2"], ["b"], axis=1)]
    m = between_convs(middle, {})
    m.graph.initializer.append(split)
    quantizes_whole(tmp_path, m, per_channel)


# -- ConvTranspose with auto_pad or output_shape -------------------------------------------------------------------
def sized_conv_transpose_attrs(d, spatial: tuple[int, ...], kernel: tuple[int, ...]) -> dict:
    """Strides, dilations, output_padding, and auto_pad SAME_UPPER / SAME_LOWER / VALID or an output_shape (of the
    spatial sizes: onnxruntime takes no other) up to one past the sizes its sums reach, with or without a SAME
    auto_pad."""
    strides = [d.draw(st.integers(1, 3)) for _ in spatial]
    dil = [d.draw(st.integers(1, 2)) for _ in spatial]
    extra = [d.draw(st.integers(0, s - 1)) for s in strides]
    a = {"strides": strides, "dilations": dil, "output_padding": extra}
    full = [(size - 1) * s + dd * (k - 1) + 1 + o for size, s, dd, k, o in zip(spatial, strides, dil, kernel, extra)]
    if d.draw(st.booleans()):
        a["output_shape"] = [d.draw(st.integers(1, f + 1)) for f in full]
        if d.draw(st.booleans()):
            a["auto_pad"] = d.draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER"]))
    else:
        a["auto_pad"] = d.draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    return a


def sums_reach(a: dict, spatial, kernel) -> bool:
    """Whether every output size asked is within the sizes the sums reach (else the import refuses)."""
    full = [(size - 1) * s + dd * (k - 1) + 1 + o for size, s, dd, k, o in
            zip(spatial, a["strides"], a["dilations"], kernel, a["output_padding"])]
    if "output_shape" in a:
        return all(o <= f for o, f in zip(a["output_shape"], full))
    return a["auto_pad"] == "VALID" or all(size * s <= f for size, s, f in zip(spatial, a["strides"], full))


@settings(max_examples=30, deadline=None)
@given(d=st.data())
def test_conv_transposes_sized_by_auto_pad_or_output_shape_are_onnxruntimes(d):
    """The oracle's pads from auto_pad or output_shape (ONNX's rule) against onnxruntime's float ConvTranspose on
    small integers (exact in float32), 1-D to 3-D, every size its sums reach (past them onnxruntime pads otherwise:
    the import refuses those)."""
    n = d.draw(st.integers(1, 3))
    spatial = tuple(d.draw(st.integers(1, 4)) for _ in range(n))
    kernel = tuple(d.draw(st.integers(1, 3)) for _ in range(n))
    a = sized_conv_transpose_attrs(d, spatial, kernel)
    if not sums_reach(a, spatial, kernel):
        return
    rng = np.random.default_rng(d.draw(st.integers(0, 99)))
    x = rng.integers(-20, 21, (1, 2) + spatial).astype(np.float32)
    w = rng.integers(-20, 21, (2, 2) + kernel).astype(np.float32)
    assert transposed_conv_is_onnxruntimes(x, w, a)


@settings(max_examples=25, deadline=None)
@given(d=st.data(), x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_a_conv_transpose_sized_by_auto_pad_or_output_shape_equals_the_oracle(d, x_type):
    """QDQ ConvTranspose 1-D to 3-D with auto_pad SAME_UPPER / SAME_LOWER / VALID or an output_shape: its pads by
    ONNX's rule, then the sum of the explicit pads' form, equal to the oracle; an output past the sizes its sums
    reach refused in one line. Regression: 'ConvTranspose with output_shape or auto_pad has no CVM form here'."""
    n = d.draw(st.integers(1, 3))
    spatial = tuple(d.draw(st.integers(1, 4)) for _ in range(n))
    kernel = tuple(d.draw(st.integers(1, 3)) for _ in range(n))
    a = sized_conv_transpose_attrs(d, spatial, kernel)
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    zx = d.draw(st.integers(*((-128, 127) if x_type == T.INT8 else (0, 255))))
    inits = {"s": np.float32(0.05), "zx": NP[x_type](zx), "w": rng.integers(-127, 128, (2, 3) + kernel)
             .astype(np.int8), "sw": np.float32(0.01), "so": np.float32(0.1), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"]),
             h.make_node("ConvTranspose", ["xf", "wf"], ["c"], name="up", **a),
             h.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"])]
    shape = (1, 2) + spatial
    m = qdq(nodes, shape, x_type, inits, T.INT8)
    if not sums_reach(a, spatial, kernel):
        with pytest.raises(UnsupportedError, match=r"up \(ConvTranspose\): a ConvTranspose output .* past the"):
            import_model(m, input_precision=9)
        return
    info = np.iinfo(NP[x_type])
    x = rng.integers(info.min, int(info.max) + 1, shape)
    x.reshape(-1)[:2] = (info.min, info.max)[:x.size]
    oracle_equal(m, x)


@pytest.mark.parametrize("attrs", [{"auto_pad": "SAME_UPPER"}, {"output_shape": [23, 24]}])
def test_a_float_model_with_a_sized_conv_transpose_quantizes_whole(tmp_path, attrs):
    """quantize takes Conv -> ConvTranspose 3x3 stride 2 sized by auto_pad (tf2onnx's Conv2DTranspose padding='same')
    or output_shape -> Conv whole: within 1.1x onnxruntime's distance from float, the export exact. Regression:
    refused 'ConvTranspose with output_shape or auto_pad has no CVM form here'."""
    w = np.random.default_rng(9).normal(0, 0.3, (8, 8, 3, 3)).astype(np.float32)
    up = h.make_node("ConvTranspose", ["a", "wt"], ["b"], kernel_shape=[3, 3], strides=[2, 2], **attrs)
    quantizes_whole(tmp_path, between_convs([up], {"wt": w}), True)
