"""Op classes of shipped models the quantized import refused before: nearest Resize at rounding ties (onnxruntime's
float32 picks)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import between_convs, quantizes_whole
from test_quantize_ops12 import MODES, ROUNDINGS, resize_model, resized_equal_onnxruntime

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
