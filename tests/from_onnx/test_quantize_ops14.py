"""Op classes of shipped models the quantized import refused before: windowed LpPool (p = 1, 2), LpNormalization
p = 1, ReduceLogSum and 3-D AveragePool of any counts, of dequantized values; an empty slice requantized into a
QLinearConcat (onnxruntime's QOperator form); AveragePool with auto_pad SAME cropping as onnxruntime; and L2 / RMS
norms whose float32 sum of squares overflows in onnxruntime, refused."""
from __future__ import annotations

import math

from fractions import Fraction

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.l2norm import FORMS, l2_qdq
from support.l2value import norm_qdq
from support.hostile_quantized import frame3d
from support.quantized import between_convs, ort_session, pool_sums, qdq, quantized, quantizes_whole
from test_quantized_fresh_ops import NP, RANGE, draw_x, oracle_equal, run

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import CVMError, UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify

SETTINGS = settings(max_examples=15, deadline=None)


# -- LpPool ------------------------------------------------------------------------------------------------------
def lp_pool_attrs(d, n: int, spatial: tuple[int, ...]) -> dict:
    """LpPool attributes over ``spatial``: kernel, strides, dilations, explicit pads smaller than the kernel (as
    onnxruntime requires) or an auto_pad, ceil_mode; every window starting inside the input."""
    k = [d.draw(st.integers(1, 3)) for _ in range(n)]
    a = {"kernel_shape": k, "strides": [d.draw(st.integers(1, 3)) for _ in range(n)],
         "dilations": [d.draw(st.integers(1, 2)) for _ in range(n)]}
    auto = d.draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto == "NOTSET":
        a["pads"] = [d.draw(st.integers(0, x - 1)) for x in k * 2]
        a["ceil_mode"] = d.draw(st.integers(0, 1))
    else:
        a["auto_pad"] = auto
        a["dilations"] = [1] * n if auto.startswith("SAME") else a["dilations"]
    pads = a.get("pads", [0] * 2 * n)
    for i, size in enumerate(spatial):
        span = (k[i] - 1) * a["dilations"][i] + 1
        assume(size + pads[i] + pads[n + i] >= span)
        out = (size + pads[i] + pads[n + i] - span + (a["strides"][i] - 1 if a.get("ceil_mode") else 0)) \
            // a["strides"][i] + 1
        assume((out - 1) * a["strides"][i] - pads[i] < size)
    return a


@settings(max_examples=40, deadline=None)
@given(d=st.data())
def test_lp_pool_window_sums_equal_onnxruntime(d):
    """The oracle's window sums (``pool_sums``) equal onnxruntime's float LpPool p = 1 of integers (sums
    exact in float32) over 1-D to 3-D images, every pads, auto_pad, strides, dilations, ceil_mode geometry."""
    n = d.draw(st.integers(1, 3))
    spatial = tuple(d.draw(st.integers(1, 7)) for _ in range(n))
    a = lp_pool_attrs(d, n, spatial)
    x = np.random.default_rng(d.draw(st.integers(0, 99))).integers(0, 100, (1, 2) + spatial).astype(np.float32)
    g = h.make_graph([h.make_node("LpPool", ["x"], ["y"], p=1, **a)], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, x.shape)], [h.make_tensor_value_info("y", T.FLOAT, None)])
    got = ort.InferenceSession(onnx_model(g, 18).SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    assert np.array_equal(got, pool_sums(x.astype(np.int64), a))


@SETTINGS
@given(d=st.data(), s=st.floats(2.0**-8, 2.0**2, width=32), so=st.floats(2.0**-6, 2.0**4, width=32),
       zo=st.integers(-20, 20), x_type=st.sampled_from([T.INT8, T.UINT8]), p=st.integers(1, 2))
def test_lp_pool_is_the_exact_window_sums_or_their_root(d, s, so, zo, x_type, p):
    """LpPool p = 1 (the exact window sums of |x - z| at s) or p = 2 (the square root of the exact window sums of
    (x - z)^2 at s^2: its exact root past 2^16 integers) of a dequantized value over 1-D to 3-D images, any pads,
    auto_pad, strides, dilations, ceil_mode: equal to the oracle of docs/import.md, extreme integers included.
    Regression: 'no CVM op for ONNX LpPool'."""
    n = d.draw(st.integers(1, 3))
    spatial = tuple(d.draw(st.integers(1, 6 if n < 3 else 4)) for _ in range(n))
    a = lp_pool_attrs(d, n, spatial)
    shape = (d.draw(st.integers(1, 2)), d.draw(st.integers(1, 3))) + spatial
    lo, hi = RANGE[x_type]
    inits = {"s": np.float32(s), "z": NP[x_type](d.draw(st.integers(lo, hi))), "so": np.float32(so),
             "zo": np.int8(zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("LpPool", ["xf"], ["g"], name="lp", p=p, **a),
             h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    x = draw_x(d, shape, x_type)
    x.reshape(-1)[:2] = (lo, hi)[:x.size]
    oracle_equal(qdq(nodes, shape, x_type, inits, T.INT8, opset=18), x)


@pytest.mark.parametrize("p, attrs, message", [
    (3, {"kernel_shape": [2, 2]}, r"lp \(LpPool\): LpPool p=3: only p = 1 and p = 2"),
    (2, {"kernel_shape": [1, 2], "strides": [1, 2], "pads": [0, 1, 0, 1], "ceil_mode": 1},
     r"lp \(LpPool\): LpPool ceil_mode where the last window starts past the input"),
    (1, {"kernel_shape": [2, 2], "dilations": [1, 2], "auto_pad": "SAME_LOWER"},
     r"lp \(LpPool\): LpPool with auto_pad SAME and dilations: onnxruntime pads for the undilated kernel")])
def test_lp_pool_refusals_name_the_node(p, attrs, message):
    inits = {"s": np.float32(0.25), "z": np.int8(0), "so": np.float32(0.1), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("LpPool", ["xf"], ["g"], name="lp", p=p, **attrs),
             h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    with pytest.raises(CVMError, match=message):
        import_model(qdq(nodes, (1, 2, 4, 3), T.INT8, inits, T.INT8, opset=18), input_precision=9)


@pytest.mark.parametrize("p, attrs, per_channel", [
    (2, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, False),
    (1, {"kernel_shape": [2, 2], "strides": [2, 2]}, True),
    (2, {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}, True)])
def test_float_models_of_lp_pool_quantize_whole(tmp_path, p, attrs, per_channel):
    """quantize takes a float model Conv -> LpPool -> Conv whole: within 1.1x onnxruntime's distance from float, the
    export exact. Regression: refused 'no CVM op for ONNX LpPool'."""
    quantizes_whole(tmp_path, between_convs([h.make_node("LpPool", ["a"], ["b"], p=p, **attrs)], {}, 18),
                    per_channel)



# -- ReduceLogSum ---------------------------------------------------------------------------------------------------
@SETTINGS
@given(d=st.data(), s=st.floats(2.0**-8, 2.0**2, width=32), so=st.floats(2.0**-6, 2.0**-1, width=32),
       zo=st.integers(-128, 0), keep=st.integers(0, 1))
def test_reduce_log_sum_is_a_table_of_the_exact_sum(d, s, so, zo, keep):
    """ReduceLogSum of a dequantized uint8 value (zero point 0: every sum >= 0) over any axes, keepdims either way:
    Log's table over ReduceSum's exact sum, log 0 = -inf saturating: equal to the oracle of docs/import.md.
    Regression: 'no CVM op for ONNX ReduceLogSum'."""
    shape = tuple(d.draw(st.integers(1, 5)) for _ in range(d.draw(st.integers(1, 3))))
    axes = d.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1, max_size=len(shape),
                           unique_by=lambda a: a % len(shape)))
    inits = {"s": np.float32(s), "z": np.uint8(0), "so": np.float32(so), "zo": np.int8(zo),
             "ax": np.array(axes, np.int64)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("ReduceLogSum", ["xf", "ax"], ["g"], name="rls", keepdims=keep),
             h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    x = draw_x(d, shape, T.UINT8)
    x.reshape(-1)[:1] = 255
    oracle_equal(qdq(nodes, shape, T.UINT8, inits, T.INT8, opset=18), x)


def test_reduce_log_sum_reaching_below_0_is_refused_naming_the_node():
    inits = {"s": np.float32(0.5), "z": np.int8(0), "so": np.float32(0.1), "zo": np.int8(0),
             "ax": np.array([1], np.int64)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("ReduceLogSum", ["xf", "ax"], ["g"], name="rls"),
             h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    with pytest.raises(CVMError, match=r"rls \(ReduceLogSum\): ReduceLogSum is undefined on"):
        import_model(qdq(nodes, (1, 3), T.INT8, inits, T.INT8, opset=18), input_precision=9)


def test_float_model_of_reduce_log_sum_quantizes_whole(tmp_path):
    """quantize takes a float model Conv -> Relu -> ReduceLogSum over the image, added back -> Conv whole: within
    1.1x onnxruntime's distance from float, the export exact. Regression: 'no CVM op for ONNX ReduceLogSum'."""
    nodes = [h.make_node("Relu", ["a"], ["ra"]), h.make_node("ReduceLogSum", ["ra", "ax"], ["r"], keepdims=1),
             h.make_node("Add", ["a", "r"], ["b"])]
    quantizes_whole(tmp_path, between_convs(nodes, {"ax": np.array([2, 3], np.int64)}, 18), False)


# -- 3-D AveragePool of windows of different counts ----------------------------------------------------------------
@SETTINGS
@given(d=st.data(), counted=st.booleans(), ceil=st.booleans(), x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_average_pool_3d_of_any_counts_equals_the_oracle(d, counted, ceil, x_type):
    """A 3-D AveragePool with pads not counted, or ceil_mode (counted or not): the window sums of x - z (padding 0)
    at s_x / count per output position, requantized: equal to the oracle of docs/import.md (the exact sums and
    counts, each requantization by its plan within its bound). Regression: 'AveragePool 3-D whose windows count
    different numbers of positions (pads not counted, or ceil_mode) has no CVM form here'."""
    assume(ceil or not counted)
    kernel = [d.draw(st.integers(1, 3)) for _ in range(3)]
    shape = (1, 2) + tuple(k + d.draw(st.integers(0, 3)) for k in kernel)
    a = {"kernel_shape": kernel, "pads": [d.draw(st.integers(0, k - 1)) for k in kernel * 2],
         "strides": [d.draw(st.integers(1, 3)) for _ in range(3)], "ceil_mode": int(ceil),
         "count_include_pad": int(counted)}
    for i, n in enumerate(shape[2:]):  # every window starts inside the input
        p, q, k, s = a["pads"][i], a["pads"][3 + i], kernel[i], a["strides"][i]
        assume(((n + p + q - k + (s - 1 if ceil else 0)) // s) * s - p < n)
    lo, hi = RANGE[x_type]
    inits = {"s": np.float32(d.draw(st.floats(2.0**-8, 1, width=32))), "z": NP[x_type](d.draw(st.integers(lo, hi))),
             "so": np.float32(d.draw(st.floats(2.0**-8, 1, width=32))), "zo": np.int8(d.draw(st.integers(-9, 9)))}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("AveragePool", ["xf"], ["p"], name="avg", **a),
             h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
    x = draw_x(d, shape, x_type)
    x.reshape(-1)[:2] = (lo, hi)
    oracle_equal(qdq(nodes, shape, x_type, inits, T.INT8), x)


@SETTINGS
@given(d=st.data(), rank=st.integers(2, 3), auto=st.sampled_from(["SAME_UPPER", "SAME_LOWER"]),
       counted=st.integers(0, 1))
def test_average_pool_same_with_a_stride_past_the_kernel_crops_as_onnxruntime(d, rank, auto, counted):
    """AveragePool (2-D, 3-D) with auto_pad SAME where a stride passes the kernel (a negative total pad: onnxruntime
    crops the input, reading o s + j + (total / 2 truncated)): equal to onnxruntime's quantized model (kernels of 1
    or 2 per axis, s_x / s_out = 4: every count 1, 2, 4 or 8 is exact, no tie). Regression: read o s + j, 10 steps
    off on a 1 x 6 row of strides 3 (SAME_UPPER)."""
    kernel = [d.draw(st.integers(1, 2)) for _ in range(rank)]
    strides = [d.draw(st.integers(1, 4)) for _ in range(rank)]
    shape = (1, 2) + tuple(d.draw(st.integers(1, 7)) for _ in range(rank))
    assume(any((-(-n // s) - 1) * s + k < n for n, s, k in zip(shape[2:], strides, kernel)))
    inits = {"s": np.float32(2.0**-3), "z": np.int8(0), "so": np.float32(2.0**-5), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("AveragePool", ["xf"], ["p"], name="avg", kernel_shape=kernel, strides=strides, auto_pad=auto,
                         count_include_pad=counted),
             h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
    m = qdq(nodes, shape, T.INT8, inits, T.INT8)
    x = np.random.default_rng(d.draw(st.integers(0, 99))).integers(-31, 32, shape).astype(np.int8)
    got = execute(import_model(m, input_precision=9).graph, {"data": x.astype(np.int32)})[0]
    want = ort_session(m).run(None, {"x": x})[0]
    assert np.array_equal(got.reshape(want.shape), want)


@pytest.mark.parametrize("per_channel", [False, True])
def test_float_model_of_an_uncounted_3d_average_pool_quantizes_whole(tmp_path, per_channel):
    """quantize takes a float 3-D Conv -> AveragePool (pads not counted, ceil_mode) -> Conv model whole: within
    1.1x onnxruntime's distance from float, the export exact. Regression: refused at the AveragePool."""
    rng = np.random.default_rng(4)
    inits = [nh.from_array(rng.normal(0, 0.3, (4, 3, 3, 3, 3)).astype(np.float32), "w1"),
             nh.from_array(rng.normal(0, 0.3, (2, 4, 1, 1, 1)).astype(np.float32), "w2")]
    nodes = [h.make_node("Conv", ["x", "w1"], ["c"], pads=[1] * 6), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("AveragePool", ["r"], ["p"], kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1] * 6,
                         ceil_mode=1),
             h.make_node("Conv", ["p", "w2"], ["y"])]
    g = h.make_graph(nodes, "avg3d", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 6, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    quantizes_whole(tmp_path, onnx_model(g, 17), per_channel)


# -- LpNormalization p = 1 ----------------------------------------------------------------------------------------
@SETTINGS
@given(d=st.data(), s=st.floats(2.0**-8, 2.0**2, width=32), so=st.floats(2.0**-8, 2.0**-2, width=32),
       zo=st.integers(-20, 20), x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_lp_normalization_p1_is_the_quotient_by_the_row_sum(d, s, so, zo, x_type):
    """LpNormalization p = 1 of a dequantized x = u s along any axis: u / (sum |u| s_out) quantized, a row of zeros
    0 (onnxruntime's kernel): every output within 1/2 + 2^-8 steps of the exact rational v ("Quotients of sums":
    1/2 + |e_N| / |D| <= 1/2 + 1 / (2 L), L >= 2^12 here), so equal to round(v) wherever v lies 2^-8 or more from a
    half-integer; within one step of onnxruntime's QDQ model. Regression: 'LpNormalization p=1 has no CVM form'."""
    shape = tuple(d.draw(st.integers(1, 5)) for _ in range(d.draw(st.integers(1, 3)))) + (d.draw(st.integers(1, 40)),)
    axis = d.draw(st.integers(-len(shape), len(shape) - 1))
    lo, hi = RANGE[x_type]
    z = d.draw(st.integers(lo, hi))
    inits = {"s": np.float32(s), "z": NP[x_type](z), "so": np.float32(so), "zo": np.int8(zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("LpNormalization", ["xf"], ["g"], name="lp", p=1, axis=axis),
             h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    x = draw_x(d, shape, x_type)
    x.reshape(-1)[:2] = (lo, hi)[:x.size]
    if d.draw(st.booleans()):  # a row of zeros
        np.moveaxis(x, axis, -1)[(0,) * (len(shape) - 1)] = z
    m = qdq(nodes, shape, x_type, inits, T.INT8)
    got = execute(import_model(m, input_precision=9).graph, {"data": x.astype(np.int32)})[0].astype(np.int64)
    u = x.astype(np.int64) - z
    total = np.abs(u).sum(axis=axis, keepdims=True)
    v = np.vectorize(lambda a, b: Fraction(int(a), int(b)) / Fraction(float(np.float32(so))) if b else Fraction(0),
                     otypes=[object])(u, np.broadcast_to(total, u.shape))
    want = np.vectorize(lambda q: min(max(round(q) + zo, -128), 127), otypes=[np.int64])(v)
    near = np.vectorize(lambda q: abs(abs(q - math.floor(q)) - Fraction(1, 2)) < Fraction(1, 256), otypes=[bool])(v)
    assert np.array_equal(got[~near], want[~near])
    assert (np.abs(got - want)[near] <= 1).all()
    ort_y = ort_session(m).run(None, {"x": x.astype(NP[x_type])})[0].astype(np.int64)
    assert np.abs(got - ort_y).max(initial=0) <= 1


def test_float_model_of_lp_normalization_p1_quantizes_whole(tmp_path):
    """quantize takes a float model Conv -> LpNormalization p = 1 over the channels -> Conv whole: within 1.1x
    onnxruntime's distance from float, the export exact. Regression: 'LpNormalization p=1 has no CVM form'."""
    node = h.make_node("LpNormalization", ["a"], ["b"], p=1, axis=1)
    quantizes_whole(tmp_path, between_convs([node], {}), False)


# -- an empty slice into a Concat ------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt, activation, per_channel", [("QOperator", "uint8", False), ("QOperator", "int8", True),
                                                          ("QDQ", "int8", True)])
def test_an_empty_slice_requantized_into_a_concat_adds_nothing(tmp_path, fmt, activation, per_channel):
    """onnxruntime's quantized model of Concat(p, p[:, 4:], p) over 4 channels: the empty slice quantized at its own
    scale (QOperator: Slice -> QuantizeLinear -> QLinearConcat; QDQ int8: a QuantizeLinear of its own too) is an
    empty constant that the (QLinear)Concat drops: the import equals that of the same model without the slice, and
    exports exactly. Regression: 'e_quantized is an empty slice', 'a constant of shape (1, 0, 1, 4, 4) is empty'."""
    (tmp_path / "e").mkdir(), (tmp_path / "p").mkdir()
    with_empty = import_model(quantized(frame3d(), tmp_path / "e", fmt, activation, False, per_channel)[0])
    plain = import_model(quantized(frame3d(False), tmp_path / "p", fmt, activation, False, per_channel)[0])
    rng = np.random.default_rng(3)
    for x in [rng.normal(size=(1, 3, 1, 8, 8)) * 3, np.full((1, 3, 1, 8, 8), 1e3), np.full((1, 3, 1, 8, 8), -1e3)]:
        q = with_empty.edges.input.quantize(x.astype(np.float32))
        assert np.array_equal(q, plain.edges.input.quantize(x.astype(np.float32)))
        for a, b in zip(execute(with_empty.graph, {"data": q}), execute(plain.graph, {"data": q}), strict=True):
            assert np.array_equal(a, b)
    assert verify(with_empty.graph, seeds=1).exact


# -- sums of squares past float32's range ------------------------------------------------------------------------
NORMS = ("reducel2", "abs", "sumsquare", "pow", "abspow")
SQUARES = [f"l2 {f}" for f in FORMS] + [f"norm {f}" for f in NORMS] + ["LpPool", "GlobalLpPool"]


def squares_model(name: str, s: float):
    """An L2 / RMS normalization form, an L2 norm form, LpPool or GlobalLpPool p = 2 over 8 int8 values a row at
    input scale s, quantized (the norms and roots at 1e20)."""
    kind, _, form = name.partition(" ")
    if kind == "l2":
        return l2_qdq(form, (1, 3, 8), -1, T.INT8, s, 0, 1e-6, (1 / 127, 0, T.INT8))
    if kind == "norm":
        return norm_qdq(form, (1, 3, 8), [2], 1, T.INT8, s, 0, (1e20, 0, T.INT8))
    inits = {"s": np.float32(s), "z": np.int8(0), "so": np.float32(1e20), "zo": np.int8(0)}
    attrs = {"kernel_shape": [2, 4]} if kind == "LpPool" else {}
    return qdq([h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
                h.make_node(kind, ["xf"], ["g"], name="lp", p=2, **attrs),
                h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])], (1, 3, 2, 4), T.INT8, inits, T.INT8)


@pytest.mark.parametrize("name", SQUARES)
def test_sums_of_squares_past_float32_are_refused_naming_the_node(name):
    """An L2 or RMS normalization (every written-out form, LpNormalization), an L2 norm, LpPool or GlobalLpPool
    p = 2 whose 8 squares at input scale 1e18 pass float32's range: onnxruntime's sum is inf (the normalization
    0, the norm or root saturated), the import's exact; refused in one line naming the node. At the largest
    float32 scale below the bound (n (128 s)^2 < 2^127) imported. Regression: imported, 0 against 45 steps."""
    x = np.full((1, 3, 8), 127, np.int8)
    m = squares_model(name, 1e18)
    got = ort_session(m).run(None, {"x": x.reshape([d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim])})
    assert set(np.unique(got[0])) <= {0, 127}  # inf's: x / inf = 0, inf saturated
    with pytest.raises(UnsupportedError) as e:
        import_model(m, input_precision=9)
    [p] = e.value.problems
    named = {n.name for n in m.graph.node}
    assert "passes float32's range, where onnxruntime computes it as inf" in p.rule and p.where.split(" (")[0] in named
    import_model(squares_model(name, float(np.nextafter(np.float32(2.0**55), np.float32(0)))), input_precision=9)


@pytest.mark.parametrize("name", SQUARES)
def test_squares_below_float32s_normal_range_are_refused_naming_the_node(name):
    """The same forms at input scale 1e-30: onnxruntime's float32 squares of the values underflow to 0 (its L2
    normalization 0, its norm or root 0), the import's exact; refused in one line naming the node where a square of
    one step, s^2, is below float32's normal range 2^-126. At s = 2^-63 imported, within one step of onnxruntime
    (or refused by another rule: an eps of a clip or max form 2^14 squared steps past the values' grid).
    Regression: imported, 47 to 87 steps from onnxruntime (the hunt on fuzz15's near-overflow seed at s = 1e-45)."""
    with pytest.raises(UnsupportedError) as e:
        import_model(squares_model(name, 1e-30), input_precision=9)
    [p] = e.value.problems
    named = {n.name for n in squares_model(name, 1e-30).graph.node}
    assert "is below float32's normal range" in p.rule and p.where.split(" (")[0] in named, str(p)
    m = squares_model(name, 2.0**-63)
    x = np.random.default_rng(0).integers(-128, 128, [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim])
    try:
        _, [got] = run(m, x.astype(np.int8))
    except UnsupportedError as e:
        assert "eps lies" in str(e), e
        return
    assert np.abs(got - ort_session(m).run(None, {"x": x.astype(np.int8)})[0]).max() <= 1


def test_an_l1_normalization_past_float32_is_refused_naming_the_node():
    """LpNormalization p = 1 whose float32 sum of 8 |values| at input scale 2e36 passes float32's range: onnxruntime's
    sum is inf (every output 0), the import's exact; refused in one line naming the node. Below the bound (8 x 128 s
    < 2^127) imported."""
    def model(s: float):
        inits = {"s": np.float32(s), "z": np.int8(0), "so": np.float32(1 / 127), "zo": np.int8(0)}
        return qdq([h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
                    h.make_node("LpNormalization", ["xf"], ["g"], name="lp", p=1, axis=-1),
                    h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])], (1, 3, 8), T.INT8, inits, T.INT8)

    m = model(2e36)
    assert not ort_session(m).run(None, {"x": np.full((1, 3, 8), 127, np.int8)})[0].any()  # x / inf
    with pytest.raises(UnsupportedError) as e:
        import_model(m, input_precision=9)
    [p] = e.value.problems
    assert p.where.startswith("lp (LpNormalization)") and "passes float32's range" in p.rule, str(p)
    import_model(model(1e35), input_precision=9)


# -- MatMul by one matrix broadcast over the batch -----------------------------------------------------------------
@SETTINGS
@given(d=st.data(), ones=st.integers(1, 2), x_rank=st.integers(1, 4), k=st.integers(1, 6), n=st.integers(1, 5),
       per_channel=st.booleans(), qoperator=st.booleans(), x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_a_matmul_weight_of_one_matrix_broadcast_is_that_matrix(d, ones, x_rank, k, n, per_channel, qoperator,
                                                                 x_type):
    """A constant MatMul / QLinearMatMul weight of shape (1, ..., 1, K, N) is one matrix broadcast over the input's
    batch axes (the output of rank max(rank x, rank w)), per tensor or per column (QLinearMatMul's N scales: its last
    axis): dense by that matrix, equal to the oracle. Regressions: refused 'dense takes one weight matrix';
    QLinearMatMul's per-column scales placed on axis 1, an internal error at rank 3 (fuzz15)."""
    x_shape = tuple(d.draw(st.integers(1, 3)) for _ in range(x_rank - 1)) + (k,)
    lo, hi = RANGE[x_type]
    w = np.asarray(d.draw(st.lists(st.integers(-127, 127), min_size=k * n, max_size=k * n)), np.int8).reshape(
        (1,) * ones + (k, n))
    sw = np.asarray(d.draw(st.lists(st.floats(2.0**-10, 1, width=32), min_size=n, max_size=n)), np.float32) \
        if per_channel else np.float32(d.draw(st.floats(2.0**-10, 1, width=32)))
    inits = {"s": np.float32(0.05), "z": NP[x_type](d.draw(st.integers(lo, hi))), "w": w, "sw": sw,
             "zw": np.zeros(sw.shape, np.int8), "so": np.float32(d.draw(st.floats(2.0**-7, 4, width=32))),
             "zo": np.int8(d.draw(st.integers(-5, 5)))}
    if qoperator:
        nodes = [h.make_node("QLinearMatMul", ["x", "s", "z", "w", "sw", "zw", "so", "zo"], ["y"])]
    else:
        nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
                 h.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], axis=-1),
                 h.make_node("MatMul", ["xf", "wf"], ["yf"]),
                 h.make_node("QuantizeLinear", ["yf", "so", "zo"], ["y"])]
    m = qdq(nodes, x_shape, x_type, inits, T.INT8)
    oracle_equal(m, draw_x(d, x_shape, x_type))


def test_qlinear_matmul_scales_per_column_of_a_rank_3_weight():
    """onnxruntime's QOperator model of x (2, 3, 6) @ w (1, 6, 5) per channel: QLinearMatMul with a vector of 5
    weight scales and zero points, one per column (b's last axis): equal to the oracle, and the same as the model
    of w's (6, 5) matrix, within one step of onnxruntime's. Regression: the vector was placed on axis 1 of the
    weight (6 rows), an internal ValueError."""
    w = (np.arange(30).reshape(1, 6, 5) % 11 - 5).astype(np.int8)
    x = np.random.default_rng(0).integers(-128, 128, (2, 3, 6)).astype(np.int8)
    outs = []
    for weight in (w, w[0]):
        inits = {"s": np.float32(0.05), "z": np.int8(3), "w": weight, "zw": np.zeros(5, np.int8),
                 "sw": np.linspace(0.01, 0.05, 5).astype(np.float32), "so": np.float32(0.2), "zo": np.int8(-2)}
        m = qdq([h.make_node("QLinearMatMul", ["x", "s", "z", "w", "sw", "zw", "so", "zo"], ["y"], name="mm")],
                (2, 3, 6), T.INT8, inits, T.INT8)
        oracle_equal(m, x)
        outs.append(run(m, x)[1][0])
    assert np.array_equal(*outs)
    assert np.abs(outs[1] - ort_session(m).run(None, {"x": x})[0]).max() <= 1


def test_a_matmul_weight_of_several_matrices_is_refused_in_one_line():
    w = np.ones((2, 3, 4), np.int8)
    m = qdq([h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"]),
             h.make_node("MatMul", ["xf", "wf"], ["yf"]),
             h.make_node("QuantizeLinear", ["yf", "so", "zo"], ["y"])], (2, 5, 3), T.INT8,
            {"s": np.float32(0.1), "z": np.int8(0), "w": w, "sw": np.float32(0.1), "so": np.float32(0.1),
             "zo": np.int8(0)}, T.INT8)
    with pytest.raises(UnsupportedError, match=r"MatMul weight of shape \(2, 3, 4\): dense takes one weight matrix"):
        import_model(m)
