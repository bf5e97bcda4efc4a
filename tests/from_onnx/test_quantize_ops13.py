"""Op classes of shipped models the quantized import refused before: nearest Resize at rounding ties (onnxruntime's
float32 picks), 3-D Conv, MaxPool and AveragePool with taps along the depth."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import between_convs, one, ort_session, qdq, quantizes_whole
from test_import_onnx import check, data, model, node
from test_quantize_ops12 import MODES, ROUNDINGS, resize_model, resized_equal_onnxruntime
from test_quantized_fresh_ops import NP, RANGE, oracle_equal, quantized

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import CVMError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model

SETTINGS = settings(max_examples=15, deadline=None)


# -- Resize nearest at rounding ties ----------------------------------------------------------------------------
def shifted(n: int) -> np.ndarray:
    """An int8 input of n values along the last axis, distinct (CVM's int8 is +-127)."""
    return (np.arange(n) % 255 - 127).astype(np.int8)


@SETTINGS
@example(size=12, num=3, den=2, mode="half_pixel", rounding="round_prefer_floor", by_sizes=True)
@example(size=12, num=2, den=3, mode="asymmetric", rounding="floor", by_sizes=False)
@example(size=10, num=6, den=5, mode="asymmetric", rounding="round_prefer_ceil", by_sizes=True)
@example(size=11, num=13, den=11, mode="tf_half_pixel_for_nn", rounding="round_prefer_floor", by_sizes=True)
@example(size=20, num=3, den=10, mode="half_pixel", rounding="round_prefer_ceil", by_sizes=True)
@given(size=st.integers(1, 24), num=st.integers(1, 7), den=st.integers(1, 7), mode=st.sampled_from(MODES),
       rounding=st.sampled_from(ROUNDINGS), by_sizes=st.booleans())
def test_resize_nearest_at_ties_picks_as_onnxruntime(size, num, den, mode, rounding, by_sizes):
    """Resize nearest by a ratio num / den (1.5x, 2/3, 6/5: coordinates on rounding ties of every nearest mode), by
    sizes or float scales: the import equals onnxruntime's run (its float32 coordinates, its 1e-6 tie band).
    Regression: 'output 1's coordinate 0.5 is a rounding tie ... which onnxruntime's float arithmetic may round
    either way' (12 -> 18 half_pixel), and 7 -> 2 asymmetric round_prefer_ceil reading input 3 (onnxruntime 4)."""
    out = max(1, size * num // den)
    shape = (1, 2, 2, size)
    x = np.broadcast_to(shifted(size), shape).copy()
    resized_equal_onnxruntime(resize_model(shape, [2, out], mode, rounding, by_sizes), x)


@pytest.mark.parametrize("size, out", [(7, 9), (6, 4), (5, 5), (12, 18)])
def test_resize_nearest_half_pixel_symmetric_picks_as_onnxruntime(size, out):
    """half_pixel_symmetric (opset 19) at any scale, onnxruntime's offset and coordinate (float32 and float64):
    equal. Regression: 'half_pixel_symmetric where 7 x scale 1.2857143 is not a whole number has no exact CVM form'."""
    for rounding in ROUNDINGS:
        x = shifted(size).reshape(1, 1, 1, size)
        resized_equal_onnxruntime(resize_model((1, 1, 1, size), [1, out], "half_pixel_symmetric", rounding, False), x)


def test_resize_nearest_to_the_input_shape_is_the_input():
    """A scale of 1.3 that leaves every axis its size (floor(3 x 1.3) = 3): onnxruntime returns the input as it is,
    the coordinates unread; so does the import. Regression: refused ('reads input 0 at that scale, 1 at 3/3')."""
    node = h.make_node("Resize", ["x", "", "sc"], ["y"], name="up", mode="nearest",
                       coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    g = h.make_graph([node], "m", [h.make_tensor_value_info("x", T.INT8, [1, 1, 3, 3])],
                     [h.make_tensor_value_info("y", T.INT8, None)],
                     [nh.from_array(np.array([1, 1, 1.3, 1.3], np.float32), "sc")])
    resized_equal_onnxruntime(onnx_model(g, 13), shifted(9).reshape(1, 1, 3, 3))


@pytest.mark.parametrize("sizes, mode, rounding, per_channel", [
    ([1, 8, 18, 18], "half_pixel", "round_prefer_floor", False),
    ([1, 8, 8, 8], "asymmetric", "floor", True)])
def test_float_models_resizing_at_ties_quantize_whole(tmp_path, sizes, mode, rounding, per_channel):
    """quantize takes a float model Conv -> Resize nearest 1.5x (the ONNX default modes) or torch's 2/3 (asymmetric,
    floor) -> Conv whole: within 1.1x onnxruntime's distance from float, the export exact. Regression: refused at
    the Resize ('is a rounding tie')."""
    node = h.make_node("Resize", ["a", "", "", "sz"], ["b"], mode="nearest", coordinate_transformation_mode=mode,
                       nearest_mode=rounding)
    quantizes_whole(tmp_path, between_convs([node], {"sz": np.array(sizes, np.int64)}), per_channel)


# -- 3-D convolution -------------------------------------------------------------------------------------------
@SETTINGS
@given(d=st.data(), group=st.sampled_from([1, 2]), per_channel=st.booleans(), x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_conv_3d_is_a_conv2d_over_the_depth_taps(d, group, per_channel, x_type):
    """A 3-D Conv of dequantized values (taps along depth, height and width; any pads, strides, dilations, group,
    weights per tensor or per channel): the conv2d of the depth taps stacked into channels (the depth padded with
    the zero point), requantized: equal to the oracle of docs/import.md (onnx.reference's Conv on the integers,
    each requantization by its plan). Regression: 'Conv on a 3-D image: only 1-D and 2-D have a CVM form'."""
    c, m = 2 * group, d.draw(st.integers(1, 4)) * group
    kernel = [d.draw(st.integers(1, 3)) for _ in range(3)]
    shape = (d.draw(st.integers(1, 2)), c) + tuple(k + d.draw(st.integers(0, 3)) for k in kernel)
    pads = [d.draw(st.integers(0, k - 1)) for k in kernel * 2]
    dilation = d.draw(st.integers(1, 2))
    assume(shape[4] + pads[2] + pads[5] >= dilation * (kernel[2] - 1) + 1)
    lo, hi = RANGE[x_type]
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    inits = {"s": np.float32(d.draw(st.floats(2.0**-8, 1, width=32))), "z": NP[x_type](d.draw(st.integers(lo, hi))),
             "w": rng.integers(-127, 128, (m, c // group) + tuple(kernel)).astype(np.int8),
             "sw": rng.uniform(2.0**-9, 2.0**-5, m).astype(np.float32) if per_channel else np.float32(2.0**-7),
             "zw": np.zeros(m, np.int8) if per_channel else np.int8(0),
             "so": np.float32(d.draw(st.floats(2.0**-6, 2.0**2, width=32))), "zo": NP[x_type](0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], **({"axis": 0} if per_channel else {})),
             h.make_node("Conv", ["xf", "wf"], ["c"], name="c3", group=group, pads=pads,
                         strides=[d.draw(st.integers(1, 2)) for _ in range(3)],
                         dilations=[1, 1, dilation]),
             h.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"])]
    m_ = qdq(nodes, shape, x_type, inits, x_type)
    oracle_equal(m_, rng.integers(lo, hi + 1, shape).astype(NP[x_type]))


def test_conv_3d_whose_depth_taps_pass_2_24_values_is_refused_naming_the_node():
    inits = {"s": np.float32(0.05), "z": np.int8(0), "w": np.ones((2, 64, 3, 3, 3), np.int8), "sw": np.float32(0.01),
             "zw": np.int8(0), "so": np.float32(0.3), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"]),
             h.make_node("Conv", ["xf", "wf"], ["c"], name="c3", pads=[1] * 6),
             h.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"])]
    with pytest.raises(CVMError, match=r"c3 \(Conv\): Conv 3-D: its 64 x 3 depth taps hold 113246208 values, more "
                                       r"than 2\^24"):
        import_model(qdq(nodes, (1, 64, 64, 96, 96), T.INT8, inits, T.INT8))


def conv_3d_model() -> onnx.ModelProto:
    """A float video model: Conv 3x3x3 (4 -> 6 channels, pads 1, depth stride 2) -> Relu -> Conv 3x1x1 on
    (1, 4, 6, 8, 8)."""
    rng = np.random.default_rng(3)
    inits = [nh.from_array(rng.normal(0, 0.3, (6, 4, 3, 3, 3)).astype(np.float32), "w1"),
             nh.from_array(rng.normal(0, 0.3, (6,)).astype(np.float32), "b1"),
             nh.from_array(rng.normal(0, 0.3, (4, 6, 3, 1, 1)).astype(np.float32), "w2")]
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["a"], pads=[1] * 6, strides=[2, 1, 1]),
             h.make_node("Relu", ["a"], ["r"]), h.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 0, 0, 1, 0, 0])]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 6, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    return onnx_model(g, 17)


@pytest.mark.parametrize("per_channel", [False, True])
def test_float_3d_conv_models_quantize_whole(tmp_path, per_channel):
    """quantize takes a float model of 3-D Convs (taps along depth) whole: within 1.1x onnxruntime's distance from
    float, the export exact. Regression: refused ('Conv on a 3-D image: only 1-D and 2-D have a CVM form')."""
    quantizes_whole(tmp_path, conv_3d_model(), per_channel)


@SETTINGS
@given(d=st.data(), group=st.sampled_from([1, 2]), auto_pad=st.sampled_from(["NOTSET", "SAME_UPPER", "VALID"]))
def test_integer_conv_3d_equals_onnxruntimes(d, group, auto_pad):
    """A 3-D Conv of float32 values carrying integers (taps along every axis, pads or auto_pad, strides, a bias):
    the conv2d over its depth taps equals onnxruntime's float Conv (exact on these integers). Regression: 'Conv on
    a 3-D image: only 1-D and 2-D have a CVM form'."""
    c, m = 2 * group, 2 * group
    kernel = [d.draw(st.integers(1, 3)) for _ in range(3)]
    shape = (1, c) + tuple(k + d.draw(st.integers(0, 3)) for k in kernel)
    pads = {"pads": [d.draw(st.integers(0, k - 1)) for k in kernel * 2]} if auto_pad == "NOTSET" else {}
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    inits = {"w": rng.integers(-127, 128, (m, c // group) + tuple(kernel)).astype(np.float32),
             "b": rng.integers(-1000, 1000, m).astype(np.float32)}
    m_ = model([node("Cast", ["x"], "f", to=T.FLOAT),
                node("Conv", ["f", "w", "b"], "c", group=group, auto_pad=auto_pad, **pads,
                     strides=[d.draw(st.integers(1, 2)) for _ in range(3)]),
                node("Cast", ["c"], "y", to=T.INT32)], shape, inits=inits)
    check(m_, data(d.draw, shape, 8))


@SETTINGS
@given(d=st.data(), ceil=st.integers(0, 1), quantized=st.booleans())
def test_max_pool_3d_is_the_max_of_2d_ones_over_the_depth_taps(d, ceil, quantized):
    """A 3-D MaxPool (taps along every axis, pads, strides, ceil_mode) of int8 values, or of dequantized ones (a
    move: quantized again at their own scale and zero point): the max over the depth taps of 2-D max pools equals
    onnxruntime's (its quantized model's). Regression: 'MaxPool on a 3-D image: only 1-D and 2-D have a CVM
    form'."""
    kernel = [d.draw(st.integers(1, 3)) for _ in range(3)]
    shape = (1, 2) + tuple(k + d.draw(st.integers(0, 3)) for k in kernel)
    attrs = {"kernel_shape": kernel, "pads": [d.draw(st.integers(0, k - 1)) for k in kernel * 2],
             "strides": [d.draw(st.integers(1, 2)) for _ in range(3)], "ceil_mode": ceil}
    x = data(d.draw, shape, 8).astype(np.int8)
    if not quantized:
        check(model([node("MaxPool", ["x"], "y", **attrs)], shape, out_type=T.INT8, x_type=T.INT8), x)
        return
    inits = {"s": np.float32(0.05), "z": np.int8(d.draw(st.integers(-128, 127)))}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node("MaxPool", ["xf"], ["p"], **attrs),
             h.make_node("QuantizeLinear", ["p", "s", "z"], ["y"])]
    m_ = qdq(nodes, shape, T.INT8, inits, T.INT8)
    want = ort_session(m_).run(None, {"x": x})[0]
    got = execute(import_model(m_).graph, {"data": x.astype(np.int32)})[0]
    assert np.array_equal(got.reshape(want.shape), want)


@SETTINGS
@given(d=st.data(), counted=st.booleans())
def test_average_pool_3d_is_a_depthwise_conv_of_ones(d, counted):
    """A 3-D AveragePool whose windows all count kd kh kw positions (no pads, or pads counted), of dequantized
    values: the depthwise Conv over its depth taps by weights 1 at s_x / (kd kh kw), requantized (kernels of 2^k
    positions: the requantization's multiplier exact) equals the exact mean (window sums of x - z_x by onnx's
    reference Conv), rounded half to even. Regression: 'AveragePool of a 3-D image: only 2-D here'."""
    kernel = [d.draw(st.sampled_from([1, 2, 4])) for _ in range(3)]
    shape = (1, 2) + tuple(k + d.draw(st.integers(0, 2)) for k in kernel)
    pads = [d.draw(st.integers(0, k - 1)) for k in kernel * 2] if counted else [0] * 6
    strides = [d.draw(st.integers(1, 2)) for _ in range(3)]
    z = d.draw(st.integers(-128, 127))
    inits = {"s": np.float32(2.0**-4), "z": np.int8(z), "so": np.float32(2.0**-5), "zo": np.int8(3)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("AveragePool", ["xf"], ["p"], name="avg", kernel_shape=kernel, pads=pads, strides=strides,
                         count_include_pad=int(counted)),
             h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
    m_ = qdq(nodes, shape, T.INT8, inits, T.INT8)
    x = data(d.draw, shape, 8).astype(np.int8)
    sums = one("Conv", [x.astype(np.int64) - z, np.ones((2, 1) + tuple(kernel))], group=2, pads=pads, strides=strides)
    want = quantized(sums.astype(np.int64) * Fraction(2**5, 2**4 * math.prod(kernel)), Fraction(1), 3, T.INT8)
    got = execute(import_model(m_).graph, {"data": x.astype(np.int32)})[0]
    assert np.array_equal(got.reshape(want.shape), want)
