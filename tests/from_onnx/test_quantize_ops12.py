"""Op classes that shipped float models carry and quantize refused (issue 35's op sweep: each op between two Convs),
each against an exact oracle over random shapes, attributes and extreme values: AveragePool with ceil_mode (timm's
ResNet-D shortcut, torch's avg_pool2d(ceil_mode=True)); nearest Resize to sizes that are no integer multiple (a
take of the picked inputs, against onnxruntime); CumSum (an exact integer cumulative sum) and Trilu (a mask) of
dequantized values; Hardmax (comparisons of the integers); GlobalLpPool p = 1, 2 (an exact sum, its exact root).
And quantize of a float model of each form: within 1.1x onnxruntime's distance from the float model, the export
exact."""
from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import between_convs, ort_session, pool_sums, pool_windows, qdq, quantizes_whole
from test_quantized_fresh_ops import NP, RANGE, draw_x, oracle_equal

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import CVMError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify

SETTINGS = settings(max_examples=12, deadline=None)


def ort_average_counts(n: int, k: int, s: int, b: int, e: int, counted: int) -> np.ndarray:
    """onnxruntime's float AveragePool (ceil_mode) on one axis of n ones: each window's count of input values
    over its divisor, as an exact rational's float32 (both small integers)."""
    node = h.make_node("AveragePool", ["x"], ["y"], kernel_shape=[k, 1], strides=[s, 1], pads=[b, 0, e, 0],
                       ceil_mode=1, count_include_pad=counted)
    g = h.make_graph([node], "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 1, n, 1])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)])
    sess = ort.InferenceSession(onnx_model(g, 19).SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": np.ones((1, 1, n, 1), np.float32)})[0].reshape(-1)


# -- AveragePool with ceil_mode ------------------------------------------------------------------------------------
def pool_attrs(d, size):
    """Random 2-D AveragePool attributes under ceil_mode whose last windows start inside the input."""
    k = [d.draw(st.integers(1, min(4, n))) for n in size]
    s = [d.draw(st.integers(1, 3)) for _ in size]
    pads = [d.draw(st.integers(0, kk - 1)) for kk in k] + [d.draw(st.integers(0, kk - 1)) for kk in k]
    return {"kernel_shape": k, "strides": s, "pads": pads, "ceil_mode": 1,
            "count_include_pad": d.draw(st.integers(0, 1))}


@SETTINGS
@given(d=st.data(), s=st.floats(2.0**-8, 2.0**2, width=32), so=st.floats(2.0**-8, 2.0**2, width=32),
       zo=st.integers(-20, 20), x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_average_pool_with_ceil_mode_is_the_window_sums_over_onnxruntime_counts(d, s, so, zo, x_type):
    """AveragePool (ceil_mode=1, any kernel, stride, pads, count_include_pad) between DequantizeLinear and
    QuantizeLinear: equal to the oracle of docs/import.md (the exact window sums at s / count, requantized within
    the plan's bound), its windows and counts those of onnxruntime's float AveragePool. Regression: 'AveragePool
    with ceil_mode or dilations has no CVM form here'."""
    size = [d.draw(st.integers(1, 7)) for _ in range(2)]
    a = pool_attrs(d, size)
    for i, n in enumerate(size):
        win = pool_windows(n, a["kernel_shape"][i], a["strides"][i], a["pads"][i], a["pads"][2 + i], True)
        assume(win[-1][0] < n)  # else ONNX's and onnxruntime's window counts differ: the refusal test's case
        want = [(min(w1, n) - max(w0, 0)) / ((wc - w0) if a["count_include_pad"] else min(w1, n) - max(w0, 0))
                for w0, w1, wc in win]
        got = ort_average_counts(n, a["kernel_shape"][i], a["strides"][i], a["pads"][i], a["pads"][2 + i],
                                 a["count_include_pad"])
        assert np.array_equal(got, np.float32(want))
    lo, hi = RANGE[x_type]
    z = d.draw(st.integers(lo, hi))
    inits = {"s": np.float32(s), "z": NP[x_type](z), "so": np.float32(so), "zo": np.int8(zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("AveragePool", ["xf"], ["p"], name="pool", **a),
             h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
    x = draw_x(d, (1, 3, *size), x_type)
    x.reshape(-1)[:2] = lo, hi
    oracle_equal(qdq(nodes, x.shape, x_type, inits, T.INT8, opset=19), x)


def test_average_pool_whose_ceil_window_starts_past_the_input_is_refused_naming_the_node():
    """ceil_mode on 2 values, kernel 2, stride 2, end pad 1: ceil((2 + 1 - 2) / 2) + 1 = 2 windows by ONNX's
    formula, the second starting past the input, which onnxruntime drops: refused in one line."""
    inits = {"s": np.float32(0.25), "z": np.int8(0), "so": np.float32(0.1), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("AveragePool", ["xf"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2],
                         pads=[0, 0, 1, 1], ceil_mode=1),
             h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
    with pytest.raises(CVMError, match=r"pool \(AveragePool\): AveragePool ceil_mode where the last window starts "
                                       r"past the input"):
        import_model(qdq(nodes, (1, 2, 2, 2), T.INT8, inits, T.INT8), input_precision=9)


@SETTINGS
@example(d=None, size=(3, 5), x_type=T.INT8)
@given(d=st.data(), size=st.tuples(st.integers(1, 7), st.integers(1, 7)), x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_qlinear_average_pool_with_ceil_mode_counts_the_whole_kernel_as_onnxruntime(d, size, x_type):
    """com.microsoft QLinearAveragePool (ceil_mode, count_include_pad=1), onnxruntime's kernel alone: a window past
    the end padding is divided by the whole kernel (where AveragePool's float kernel divides by the positions up to
    the end padding): the import equals the exact rational v = s sum(x - z) / (kh kw so) rounded, + zo, saturated,
    wherever v lies 2^-8 or more from a half-integer (the requantization's bound), and is within one step of
    onnxruntime's quantized model (its float kernel's rounding), over random geometry. Regression: the float count,
    20 to 50 steps off (the newest13 hunt on the QOperator ceil_mode seed; the example: (3, 5) by kernel 2, stride
    2, no pads)."""
    a = {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 0, 0], "ceil_mode": 1, "count_include_pad": 1}
    if d is not None:
        a = pool_attrs(d, size) | {"count_include_pad": 1}
        for i, n in enumerate(size):
            win = pool_windows(n, a["kernel_shape"][i], a["strides"][i], a["pads"][i], a["pads"][2 + i], True)
            assume(win[-1][0] < n)
    npt = NP[x_type]
    node = h.make_node("QLinearAveragePool", ["x", "s", "z", "so", "zo"], ["y"], domain="com.microsoft", name="pool",
                       **a)
    m = qdq([node], (1, 2, *size), x_type, {"s": np.float32(0.05), "z": npt(3), "so": np.float32(0.03),
                                            "zo": npt(5)}, x_type)
    lo, hi = RANGE[x_type]
    x = np.random.default_rng(sum(size)).integers(lo, hi + 1, (1, 2, *size)).astype(npt)
    x.reshape(-1)[:2] = lo, hi
    want = ort_session(m).run(None, {"x": x})[0].astype(np.int64)
    imp = import_model(m, input_precision=9)
    got = execute(imp.graph, {"data": x.astype(np.int32)})[0]
    scale = Fraction(float(np.float32(0.05))) / Fraction(float(np.float32(0.03))) / math.prod(a["kernel_shape"])
    v = np.vectorize(lambda t: int(t) * scale, otypes=[object])(pool_sums(x.astype(np.int64) - 3, a))
    exact = np.vectorize(lambda q: min(max(round(q) + 5, lo), hi), otypes=[np.int64])(v)
    near = np.vectorize(lambda q: abs(q - math.floor(q) - Fraction(1, 2)) < Fraction(1, 256), otypes=[bool])(v)
    assert got.shape == exact.shape and np.array_equal(got[~near], exact[~near]), (a, got, exact)
    assert np.abs(got - want).max() <= 1, (a, got, want)
    assert verify(imp.graph, x.astype(np.int32)).exact


# -- Resize nearest to sizes that are no integer multiple --------------------------------------------------------
MODES = ["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners", "tf_half_pixel_for_nn"]
ROUNDINGS = ["floor", "ceil", "round_prefer_floor", "round_prefer_ceil"]


def float_scale(n: int, o: int) -> np.float32:
    """The least float32 scale v with floor(n v) = o: the scales value that resizes n values to o."""
    v = np.float32(o / n)
    while np.floor(n * float(v)) < o:
        v = np.nextafter(v, np.float32(np.inf))
    return v


def resize_model(shape, out, mode: str, rounding: str, by_sizes: bool) -> onnx.ModelProto:
    """Resize nearest of an int8 input of ``shape`` to ``out`` (its last two axes), by sizes or by float scales."""
    extra = {"coordinate_transformation_mode": mode, "nearest_mode": rounding}
    if by_sizes:
        node = h.make_node("Resize", ["x", "", "", "sz"], ["y"], name="up", mode="nearest", **extra)
        init = nh.from_array(np.array(list(shape[:2]) + list(out), np.int64), "sz")
    else:
        node = h.make_node("Resize", ["x", "", "sc"], ["y"], name="up", mode="nearest", **extra)
        init = nh.from_array(np.array([1, 1] + [float_scale(d, o) for o, d in zip(out, shape[2:])], np.float32), "sc")
    g = h.make_graph([node], "m", [h.make_tensor_value_info("x", T.INT8, list(shape))],
                     [h.make_tensor_value_info("y", T.INT8, None)], [init])
    return onnx_model(g, 19)


def resized_equal_onnxruntime(m: onnx.ModelProto, x: np.ndarray) -> None:
    """The import of ``m`` on x equals onnxruntime's run of ``m`` (a selection of x's values: exact)."""
    imp = import_model(m)
    got = np.asarray(execute(imp.graph, {"data": x.astype(np.int32)})[0])
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.array_equal(got.reshape(want.shape), want.astype(np.int64))
    assert verify(imp.graph, x.astype(np.int32)).exact


@SETTINGS
@given(d=st.data(), mode=st.sampled_from(MODES), rounding=st.sampled_from(ROUNDINGS), by_sizes=st.booleans())
def test_resize_nearest_at_any_scale_is_a_take_of_the_picked_inputs(d, mode, rounding, by_sizes):
    """Resize nearest from (h, w) to any (h', w') (up or down, by sizes or float scales, every coordinate mode and
    nearest mode): the import equals onnxruntime's. Regression: 'resizing (1, 8, 12, 12) to (1, 8, 18, 18) is not
    an upsampling by integer scales'."""
    shape = (1, 2, d.draw(st.integers(1, 9)), d.draw(st.integers(1, 9)))
    out = [d.draw(st.integers(1, 20)) for _ in range(2)]
    x = (np.arange(np.prod(shape)) % 255 - 127).reshape(shape).astype(np.int8)  # CVM's int8 is +-127
    resized_equal_onnxruntime(resize_model(shape, out, mode, rounding, by_sizes), x)


@pytest.mark.parametrize("size, out, mode, rounding", [
    (12, 7, "asymmetric", "floor"), (12, 8, "half_pixel", "round_prefer_floor"),
    (5, 4, "align_corners", "round_prefer_floor"),
    (5, 8, "pytorch_half_pixel", "round_prefer_ceil"), (6, 10, "tf_half_pixel_for_nn", "ceil")])
def test_resize_nearest_without_ties_imports_as_onnxruntime_computes(size, out, mode, rounding):
    """Shapes whose coordinates lie off every rounding boundary (torch's F.interpolate(size=) 12 -> 7, the ONNX
    default 12 -> 8, ...): imported, equal to onnxruntime's by sizes and by float scales."""
    shape = (1, 3, size, size + 1)
    x = (np.arange(np.prod(shape)) % 255 - 127).reshape(shape).astype(np.int8)  # CVM's int8 is +-127
    for by_sizes in (True, False):
        resized_equal_onnxruntime(resize_model(shape, [out, out], mode, rounding, by_sizes), x)


@SETTINGS
@example(n=3, k=5, step=0, mode="asymmetric")
@given(n=st.integers(1, 40), k=st.integers(1, 80), step=st.sampled_from([-1, 0, 1]),
       mode=st.sampled_from(["asymmetric", "half_pixel"]))
def test_resize_by_scales_has_onnxruntimes_output_size(n, k, step, mode):
    """Resize by a float scale near k / n (its float32, or one ulp either side): the import's output size is
    onnxruntime's, floor of the product rounded to float32 (3 x 1.6666666 is 5 values, not the exact product's 4),
    its values equal (an empty output refused). Regression: the size computed from the exact product (refused
    naming 4 values)."""
    v = np.float32(k / n)
    v = v if step == 0 else np.nextafter(v, np.float32(step * np.inf))
    node = h.make_node("Resize", ["x", "", "sc"], ["y"], name="up", mode="nearest", coordinate_transformation_mode=mode,
                       nearest_mode="floor")
    g = h.make_graph([node], "m", [h.make_tensor_value_info("x", T.INT8, [1, 1, 1, n])],
                     [h.make_tensor_value_info("y", T.INT8, None)],
                     [nh.from_array(np.array([1, 1, 1, v], np.float32), "sc")])
    m = onnx_model(g, 19)
    x = (np.arange(n) % 255 - 127).reshape(1, 1, 1, n).astype(np.int8)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    try:
        imp = import_model(m)
    except CVMError as e:
        assert want.size == 0 and re.search(r"up \(Resize\): .*must hold 1 to 2\^24 values", str(e)), str(e)
        return
    assert imp.graph.type_of(imp.graph.heads[0]).shape == want.shape
    resized_equal_onnxruntime(m, x)


# -- CumSum and Trilu of dequantized values --------------------------------------------------------------------
@SETTINGS
@given(d=st.data(), s=st.floats(2.0**-8, 2.0**2, width=32), so=st.floats(2.0**-8, 2.0**4, width=32),
       zo=st.integers(-20, 20), x_type=st.sampled_from([T.INT8, T.UINT8]),
       out_type=st.sampled_from([T.INT8, T.INT16]))
def test_cumsum_is_the_integer_cumulative_sum(d, s, so, zo, x_type, out_type):
    """CumSum (any axis, exclusive, reverse) of a dequantized value: the exact integer cumulative sums of x - z
    at s (a dense by a 0/1 matrix), requantized: equal to the oracle of docs/import.md (numpy's cumsum of the
    integers, the plan within its bound). Regression: 'no CVM op for ONNX CumSum'."""
    shape = tuple(d.draw(st.integers(1, 6)) for _ in range(d.draw(st.integers(1, 3))))
    lo, hi = RANGE[x_type]
    inits = {"s": np.float32(s), "z": NP[x_type](d.draw(st.integers(lo, hi))), "so": np.float32(so),
             "zo": np.int8(zo) if out_type == T.INT8 else np.int16(zo),
             "ax": np.array(d.draw(st.integers(-len(shape), len(shape) - 1)), np.int64)}
    attrs = {"exclusive": d.draw(st.integers(0, 1)), "reverse": d.draw(st.integers(0, 1))}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("CumSum", ["xf", "ax"], ["c"], name="sums", **attrs),
             h.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"])]
    x = draw_x(d, shape, x_type)
    x.reshape(-1)[:2] = (lo, hi)[:x.size]
    oracle_equal(qdq(nodes, shape, x_type, inits, out_type, opset=18), x)


@pytest.mark.parametrize("shape, axis", [((1, 5), 1), ((2, 1, 3), 2), ((1, 1), 0), ((3, 1), 0)])
def test_integer_cumsum_keeps_the_axes_of_size_one(shape, axis):
    """CumSum of int32 values over an input with axes of size 1: the shape and values onnxruntime gives.
    Regression: the sum dropped those axes ((1, 5) came out as (5,))."""
    g = h.make_graph([h.make_node("CumSum", ["x", "ax"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.INT32, list(shape))],
                     [h.make_tensor_value_info("y", T.INT32, None)],
                     [nh.from_array(np.array(axis, np.int64), "ax")])
    m = onnx_model(g, 17)
    x = np.arange(np.prod(shape), dtype=np.int32).reshape(shape) - 3
    got = execute(import_model(m, input_precision=8).graph, {"data": x})[0]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.shape == want.shape and np.array_equal(got, want)


@SETTINGS
@given(d=st.data(), s=st.floats(2.0**-8, 2.0**2, width=32), so=st.floats(2.0**-8, 2.0**2, width=32),
       zo=st.integers(-20, 20), x_type=st.sampled_from([T.INT8, T.UINT8]), upper=st.integers(0, 1),
       with_k=st.booleans())
def test_trilu_is_the_integers_times_a_mask(d, s, so, zo, x_type, upper, with_k):
    """Trilu (upper or lower, any k) of a dequantized value: the integers x - z times the constant 0/1 mask (0 is
    (z - z) s), requantized: equal to the oracle (numpy's triu / tril of the integers). Regression: 'float Trilu of
    dequantized values has no integer form'."""
    shape = tuple(d.draw(st.integers(1, 6)) for _ in range(d.draw(st.integers(2, 4))))
    lo, hi = RANGE[x_type]
    inits = {"s": np.float32(s), "z": NP[x_type](d.draw(st.integers(lo, hi))), "so": np.float32(so),
             "zo": np.int8(zo), "k": np.array(d.draw(st.integers(-7, 7)), np.int64)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Trilu", ["xf", "k"] if with_k else ["xf"], ["t"], name="tri", upper=upper),
             h.make_node("QuantizeLinear", ["t", "so", "zo"], ["y"])]
    x = draw_x(d, shape, x_type)
    x.reshape(-1)[:2] = (lo, hi)[:x.size]
    oracle_equal(qdq(nodes, shape, x_type, inits if with_k else {k: v for k, v in inits.items() if k != "k"},
                     T.INT8, opset=18), x)


# -- Hardmax of dequantized values --------------------------------------------------------------------------------
@SETTINGS
@given(d=st.data(), s=st.floats(2.0**-8, 2.0**2, width=32), so=st.floats(2.0**-8, 2.0, width=32),
       zo=st.integers(-20, 20), x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_hardmax_is_one_at_the_first_max_of_the_integers(d, s, so, zo, x_type):
    """Hardmax (any axis) of a dequantized value: 1 at the first max of its integers along the axis (their order is
    the values'), 0 elsewhere, requantized: equal to the oracle (numpy's argmax), ties among maxima included.
    Regression: 'no CVM op for ONNX Hardmax'."""
    shape = tuple(d.draw(st.integers(1, 5)) for _ in range(d.draw(st.integers(1, 3))))
    lo, hi = RANGE[x_type]
    inits = {"s": np.float32(s), "z": NP[x_type](d.draw(st.integers(lo, hi))), "so": np.float32(so),
             "zo": np.int8(zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Hardmax", ["xf"], ["m"], name="hard", axis=d.draw(st.integers(-len(shape), len(shape) - 1))),
             h.make_node("QuantizeLinear", ["m", "so", "zo"], ["y"])]
    x = np.asarray(d.draw(st.lists(st.sampled_from([lo, hi, lo + 1, (lo + hi) // 2]), min_size=int(np.prod(shape)),
                                   max_size=int(np.prod(shape)))), np.int64).reshape(shape)  # ties, extremes
    oracle_equal(qdq(nodes, shape, x_type, inits, T.INT8, opset=18), x)


# -- GlobalLpPool of dequantized values ---------------------------------------------------------------------------
@SETTINGS
@given(d=st.data(), s=st.floats(2.0**-8, 2.0**2, width=32), so=st.floats(2.0**-6, 2.0**4, width=32),
       zo=st.integers(-20, 20), x_type=st.sampled_from([T.INT8, T.UINT8]), p=st.integers(1, 2))
def test_global_lp_pool_is_the_exact_sum_or_its_root(d, s, so, zo, x_type, p):
    """GlobalLpPool p = 1 (the exact sum of |x - z| over the image at s) or p = 2 (the square root of the exact sum
    of (x - z)^2 at s^2: a table, or the exact root past 2^16 integers) of a dequantized value, over images small
    and large: equal to the oracle of docs/import.md. Regression: 'no CVM op for ONNX GlobalLpPool'."""
    shape = (1, d.draw(st.integers(1, 3)), d.draw(st.sampled_from([1, 2, 5, 12])), d.draw(st.integers(1, 6)))
    lo, hi = RANGE[x_type]
    inits = {"s": np.float32(s), "z": NP[x_type](d.draw(st.integers(lo, hi))), "so": np.float32(so),
             "zo": np.int8(zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("GlobalLpPool", ["xf"], ["g"], name="lp", p=p),
             h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    x = draw_x(d, shape, x_type)
    x.reshape(-1)[:2] = (lo, hi)[:x.size]
    oracle_equal(qdq(nodes, shape, x_type, inits, T.INT8, opset=18), x)


def test_global_lp_pool_of_another_p_is_refused_naming_the_node():
    inits = {"s": np.float32(0.25), "z": np.int8(0), "so": np.float32(0.1), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("GlobalLpPool", ["xf"], ["g"], name="lp", p=3),
             h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    with pytest.raises(CVMError, match=r"lp \(GlobalLpPool\): GlobalLpPool p=3: only p = 1 and p = 2"):
        import_model(qdq(nodes, (1, 2, 3, 3), T.INT8, inits, T.INT8, opset=18), input_precision=9)


# -- quantize of float models of each form ------------------------------------------------------------------------
FLOAT_MODELS = {
    "interpolate_size": ([h.make_node("Resize", ["a", "", "", "sz"], ["b"], mode="nearest",
                                      coordinate_transformation_mode="asymmetric", nearest_mode="floor")],
                         {"sz": np.array([1, 8, 7, 7], np.int64)}),
    "resize_two_thirds": ([h.make_node("Resize", ["a", "", "", "sz"], ["b"], mode="nearest")],
                          {"sz": np.array([1, 8, 8, 8], np.int64)}),
    "cumsum": ([h.make_node("CumSum", ["a", "ax"], ["b"])], {"ax": np.array(3, np.int64)}),
    "trilu": ([h.make_node("Trilu", ["a"], ["b"], upper=0)], {}),
    "hardmax": ([h.make_node("Hardmax", ["a"], ["b"], axis=1)], {}),
    "gem_l2": ([h.make_node("GlobalLpPool", ["a"], ["g"], p=2), h.make_node("Mul", ["a", "g"], ["b"])], {}),
    "resnet_d_shortcut": ([h.make_node("AveragePool", ["a"], ["b"], kernel_shape=[2, 2], strides=[2, 2],
                                       ceil_mode=1, count_include_pad=0)], {}),
    "avg_ceil_counted": ([h.make_node("AveragePool", ["a"], ["b"], kernel_shape=[3, 3], strides=[2, 2],
                                      pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1)], {}),
}


@pytest.mark.parametrize("name, per_channel", [("resnet_d_shortcut", False), ("avg_ceil_counted", True),
                                               ("interpolate_size", True), ("resize_two_thirds", False),
                                               ("cumsum", False), ("trilu", True), ("hardmax", False),
                                               ("gem_l2", True)])
def test_float_models_of_these_forms_quantize_whole(tmp_path, name, per_channel):
    """quantize takes a float model of each form whole: as close to the float model as onnxruntime's quantized
    model (1.1x of its mean distance), the export exact. Regression: refused at the AveragePool (ceil_mode), the
    Resize (12 -> 7 or 8: not an upsampling by integer scales), the CumSum, the Trilu, the Hardmax, the
    GlobalLpPool."""
    quantizes_whole(tmp_path, between_convs(*FLOAT_MODELS[name]), per_channel)
