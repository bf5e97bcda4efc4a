"""ONNX lowerings of conv2d, dense, max_pool2d, upsampling and relu: onnxruntime == the reference executor, bit for bit.

Hypothesis draws shapes, groups, strides, dilation, padding, kernel and pool sizes, ceil_mode, bias and values
biased to the precision extremes, for both conv2d/dense forms. Fixed cases drive the float32 bound of
conv2d/dense to 2^24 and across it (chunked float path) and past it within one input channel (int32 MatMul
path), and run the lowerings on any int32 inputs (bound 2^31). The exactness tests of conv2d/dense carry the
``isa`` marker so CI can repeat them on an emulated CPU (``qemu-x86_64 -cpu Haswell``); the environment variable
CVM_ONNX_EXAMPLES sets the example count of the property tests there.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from support import assert_exact, bound, single_op, tensors

from cvm_onnx.converters.to_onnx import nn as lower_nn
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.converters.to_onnx.bounds import ANY
from cvm_onnx.converters.to_onnx.lowering import Value, lower, op_model
from cvm_onnx.core.errors import ValidationError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.core.ops import REGISTRY

EXAMPLES = int(os.environ.get("CVM_ONNX_EXAMPLES", "100"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FORMS = ["fast", "core"]


def op_types(graph, conv_form: str = "fast") -> list[str]:
    """Op types of the nodes computing ``graph``'s op (which path a lowering took): the function bodies of the
    export, or the core form's body."""
    if conv_form == "core":
        return [n.op_type for n in op_model(graph, "core").graph.node]
    return [n.op_type for f in to_onnx(graph).functions for n in f.node]


def check_form(graph, feeds, conv_form: str, inline: bool = False) -> None:
    """``graph`` (``single_op``) equals the reference executor bit for bit: exported (``assert_exact``), or with
    ``conv_form`` "core" its op's core form (``op_model``) run on onnxruntime."""
    if conv_form == "fast":
        assert_exact(graph, feeds, inline=inline)
        return
    model = op_model(graph, "core")
    onnx.checker.check_model(model, full_check=True)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, execute(graph, feeds), strict=True):
        assert g.dtype == w.dtype and np.array_equal(g, w)


def build(op, inputs, **attrs):
    """single_op, rejecting (for hypothesis) the attribute draws the runtime's load-time rules refuse."""
    try:
        return single_op(op, inputs, **attrs)
    except ValidationError:
        assume(False)


def pm127(rng, shape) -> np.ndarray:
    return rng.choice(np.array([-127, 127], np.int32), size=shape)


# -- conv2d -----------------------------------------------------------------------------------------------------

@st.composite
def conv_cases(draw):
    """(inputs, attrs) of one conv2d: groups 1, depthwise (g = C) or other, any stride/dilation/padding."""
    kind = draw(st.sampled_from(["one", "depthwise", "other"]))
    g = 1 if kind == "one" else draw(st.integers(1 if kind == "depthwise" else 2, 4))
    cg = 1 if kind == "depthwise" else draw(st.integers(1, 4))
    ocg = draw(st.integers(1, 3))
    kh, kw, dh, dw = (draw(st.integers(1, m)) for m in (3, 3, 2, 2))
    sh, sw, ph, pw = (draw(st.integers(lo, 3)) for lo in (1, 1, 0, 0))
    h = max(1, dh * (kh - 1) + 1 - 2 * ph) + draw(st.integers(0, 4))
    w = max(1, dw * (kw - 1) + 1 - 2 * pw) + draw(st.integers(0, 4))
    n = draw(st.integers(1, 2))
    p_x, p_w, p_b = draw(st.integers(1, 8)), draw(st.integers(1, 8)), draw(st.integers(1, 31))
    use_bias = draw(st.booleans())
    inputs = [(draw(tensors((n, g * cg, h, w), p_x)), p_x, False),
              (draw(tensors((g * ocg, cg, kh, kw), p_w)), p_w, draw(st.booleans()))]
    if use_bias:
        inputs.append((draw(tensors((g * ocg,), p_b)), p_b, draw(st.booleans())))
    attrs = dict(channels=g * ocg, kernel_size=(kh, kw), strides=(sh, sw), padding=(ph, pw),
                 dilation=(dh, dw), groups=g, use_bias=use_bias)
    return inputs, attrs


@pytest.mark.isa
@pytest.mark.parametrize("form", FORMS)
@PROPERTY
@given(case=conv_cases(), inline=st.booleans())
def test_conv2d_exact(form, case, inline):
    inputs, attrs = case
    check_form(*build("conv2d", inputs, **attrs), form, inline)


@pytest.mark.isa
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("c, groups, chunks", [(128, 1, 2), (256, 2, 2), (128, 128, 1)])
@pytest.mark.parametrize("weight_param", [True, False])
def test_conv2d_chunked_float(form, c, groups, chunks, weight_param):
    """3x3, all +-127: a float32 chunk holds at most 115 input channels (127 * 127 * 9 * 115 <= 2^24), so 128
    channels per group need two chunks, depthwise needs one."""
    rng = np.random.default_rng(groups)
    oc = c if groups == c else 4
    cg = c // groups
    x = np.full((1, c, 4, 4), 127, np.int32)
    x[:, :, :2] = pm127(rng, (1, c, 2, 4))
    w = np.full((oc, cg, 3, 3), 127, np.int32)
    w[: oc // 2] = pm127(rng, (oc // 2, cg, 3, 3))
    bias = pm127(rng, (oc,)) * (1 << 23)
    graph, feeds = single_op("conv2d", [(x, 8, False), (w, 8, weight_param), (bias, 31, True)], channels=oc,
                             kernel_size=(3, 3), padding=(1, 1), groups=groups)
    check_form(graph, feeds, form)
    convs = op_types(graph, form).count("Conv")
    assert convs == (0 if form == "core" else chunks)


@pytest.mark.isa
@pytest.mark.parametrize("form", FORMS)
def test_conv2d_int_path(form):
    """A 33x33 kernel of +-127 on +-127 data: one input channel alone exceeds 2^24 (127 * 127 * 1089)."""
    rng = np.random.default_rng(7)
    x = np.full((1, 2, 34, 33), 127, np.int32)
    x[:, 1] = pm127(rng, (34, 33))
    w = np.full((3, 2, 33, 33), 127, np.int32)
    w[1] = pm127(rng, (2, 33, 33))
    w[2] = -127
    graph, feeds = single_op("conv2d", [(x, 8, False), (w, 8, True)], channels=3, kernel_size=(33, 33),
                             use_bias=False)
    check_form(graph, feeds, form)
    types = op_types(graph, form)
    assert "Conv" not in types and "MatMul" in types


# -- dense ------------------------------------------------------------------------------------------------------

@st.composite
def dense_cases(draw):
    m, k, units = draw(st.integers(1, 4)), draw(st.integers(1, 40)), draw(st.integers(1, 6))
    p_x, p_w, p_b = draw(st.integers(1, 8)), draw(st.integers(1, 8)), draw(st.integers(1, 31))
    use_bias = draw(st.booleans())
    inputs = [(draw(tensors((m, k), p_x)), p_x, False), (draw(tensors((units, k), p_w)), p_w, draw(st.booleans()))]
    if use_bias:
        inputs.append((draw(tensors((units,), p_b)), p_b, draw(st.booleans())))
    return inputs, dict(units=units, use_bias=use_bias)


@pytest.mark.isa
@pytest.mark.parametrize("form", FORMS)
@PROPERTY
@given(case=dense_cases(), inline=st.booleans())
def test_dense_exact(form, case, inline):
    inputs, attrs = case
    check_form(*build("dense", inputs, **attrs), form, inline)


@pytest.mark.isa
@pytest.mark.parametrize("last, gemms", [(24, 1), (25, 2)])
def test_dense_bound_reaches_and_crosses_2_24(last, gemms):
    """x = 127 everywhere; w = 127 * 1040 then ``last``: 127 * (127 * 1040 + 24) = 2^24 - 8 fits one float32
    Gemm, with 25 the bound passes 2^24 and the reduction is split in two."""
    x = np.full((2, 1041), 127, np.int32)
    w = np.full((2, 1041), 127, np.int32)
    w[:, -1] = last
    w[1, :520] = -127
    bias = np.array([2**30 - 1, -(2**30 - 1)], np.int32)
    graph, feeds = single_op("dense", [(x, 8, False), (w, 8, True), (bias, 31, True)], units=2)
    assert_exact(graph, feeds)
    assert op_types(graph).count("Gemm") == gemms


@pytest.mark.isa
@pytest.mark.parametrize("weight_param", [True, False])
def test_dense_four_chunks(weight_param):
    """K = 4096 of +-127: a float32 chunk holds at most 1040 columns, so 4 chunks; 127^2 * 4096 + (2^30 - 1)."""
    x = np.full((1, 4096), 127, np.int32)
    w = np.full((2, 4096), 127, np.int32)
    w[1, ::3] = -127
    bias = np.array([2**30 - 1, -(2**30 - 1)], np.int32)
    graph, feeds = single_op("dense", [(x, 8, False), (w, 8, weight_param), (bias, 31, True)], units=2)
    got = assert_exact(graph, feeds)[0]
    assert op_types(graph).count("Gemm") == 4
    assert got[0, 0] == 127 * 127 * 4096 + 2**30 - 1


def test_float_chunks_bounds():
    """Greedy chunks: each within 2^24 / max|x|, None when one column alone exceeds it."""
    cap = (1 << 24) // 127
    sums = np.array([[cap, 0, 1, cap - 1, 1, 5]], np.int64)
    assert lower_nn.float_chunks(127, sums) == [(0, 2), (2, 4), (4, 6)]
    assert lower_nn.float_chunks(127, sums + np.array([[1, 0, 0, 0, 0, 0]])) is None
    assert lower_nn.float_chunks(1, np.array([[1 << 24, 1], [0, 1 << 24]])) == [(0, 1), (1, 2)]
    assert lower_nn.float_chunks(0, np.array([[(1 << 24) + 1]])) is None


def test_a_conv_form_other_than_fast_or_core_is_refused():
    x, w = np.ones((1, 1, 3, 3), np.int32), np.ones((1, 1, 1, 1), np.int32)
    with pytest.raises(ValueError, match="conv_form"):
        run_lowering("conv2d", dict(channels=1, kernel_size=(1, 1), use_bias=False), [(x, 1, False), (w, 1, True)],
                     "float")


# -- lowerings on any int32 inputs, INT32_MIN included (bound 2^31: a `where` can feed conv2d/dense such values) --

def run_lowering(op: str, attrs: dict, inputs: list[tuple[np.ndarray, int, bool]],
                 conv_form: str = "fast") -> np.ndarray:
    """Lower ``op`` for inputs (value, bound on |value|, is_param) in ``conv_form``, run the body as a model on
    onnxruntime."""
    a = REGISTRY[op].bind(REGISTRY[op].parse_attrs(attrs)[0])
    values = [Value(f"x{k}", v.shape, bnd, v if is_param else None) for k, (v, bnd, is_param) in enumerate(inputs)]
    out = Value("y", tuple(REGISTRY[op].shape(a, *(v.shape for v in values))), ANY)
    body, (name,) = lower(op, a, values, [out], conv_form=conv_form)
    io = [helper.make_tensor_value_info(v.name, TensorProto.INT32, list(v.shape)) for v in values]
    graph = helper.make_graph(body.nodes, op, io, [helper.make_tensor_value_info(name, TensorProto.INT32, None)])
    model = onnx_model(graph)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {v.name: x for v, (x, _, _) in zip(values, inputs)})[0]


@pytest.mark.isa
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("weight_param", [True, False])
def test_conv2d_int32_inputs_wrap(form, groups, weight_param):
    """Data of any int32 value: products and sums wrap modulo 2^32 as in the runtime."""
    rng = np.random.default_rng(groups)
    x = rng.choice(np.array([-(2**31), 2**31 - 1, 3, -5, 0], np.int32), size=(2, 4, 5, 5))
    w = rng.integers(-127, 128, size=(4, 4 // groups, 3, 3)).astype(np.int32)
    attrs = dict(channels=4, kernel_size=(3, 3), padding=(1, 1), strides=(2, 1), groups=groups, use_bias=False)
    got = run_lowering("conv2d", attrs, [(x, ANY, False), (w, 127, weight_param)], form)
    assert np.array_equal(got, REGISTRY["conv2d"].kernel(REGISTRY["conv2d"].bind(attrs), x, w))


@pytest.mark.isa
@pytest.mark.parametrize("form", FORMS)
def test_dense_int32_inputs_wrap(form):
    rng = np.random.default_rng(3)
    x = rng.choice(np.array([-(2**31), 2**31 - 1, 1 << 20, -7], np.int32), size=(3, 9))
    w = rng.integers(-127, 128, size=(5, 9)).astype(np.int32)
    b = rng.integers(-(2**31) + 1, 2**31, size=5).astype(np.int32)
    attrs = dict(units=5)
    got = run_lowering("dense", attrs, [(x, ANY, False), (w, 127, True), (b, ANY, True)], form)
    assert np.array_equal(got, REGISTRY["dense"].kernel(REGISTRY["dense"].bind(attrs), x, w, b))


# -- max_pool2d, upsampling, relu -----------------------------------------------------------------------------

@st.composite
def pool_cases(draw):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ph, pw = draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1))
    padding = (ph,) if ph < kw and draw(st.booleans()) else (ph, pw)
    pw = padding[-1]
    h = max(1, kh - 2 * ph) + draw(st.integers(0, 5))
    w = max(1, kw - 2 * pw) + draw(st.integers(0, 5))
    p = draw(st.sampled_from([1, 2, 8, 9, 24, 25, 26, 32]) | st.integers(1, 32))
    x = draw(tensors((draw(st.integers(1, 2)), draw(st.integers(1, 3)), h, w), p))
    attrs = dict(pool_size=(kh, kw), strides=(draw(st.integers(1, 3)), draw(st.integers(1, 3))), padding=padding,
                 ceil_mode=draw(st.booleans()))
    return [(x, p, False)], attrs


@PROPERTY
@given(case=pool_cases(), inline=st.booleans())
def test_max_pool2d_exact(case, inline):
    inputs, attrs = case
    assert_exact(*build("max_pool2d", inputs, **attrs), inline=inline)


@pytest.mark.parametrize("p, pooled", [(8, "FLOAT"), (25, "FLOAT"), (26, "DOUBLE"), (32, "DOUBLE")])
def test_max_pool2d_padding_never_wins(p, pooled):
    """All values at the most negative of their precision (INT32_MIN + 1 at 32 bits), padding 1 and ceil_mode
    windows reaching past it: the padded positions must not win. Also the notes' verified example. Values
    within 2^24 pool in float32, wider ones in float64."""
    x = np.full((1, 2, 4, 6), -bound(p), np.int32)
    graph, feeds = single_op("max_pool2d", [(x, p, False)], pool_size=(3, 3), strides=(2, 2), padding=(1,),
                             ceil_mode=True)
    assert np.array_equal(assert_exact(graph, feeds)[0], np.full((1, 2, 3, 4), -bound(p)))
    assert "MaxPool" in op_types(graph) and "ReduceMax" not in op_types(graph)
    casts = [n for n in to_onnx(graph, inline=True).graph.node if n.op_type == "Cast"]
    assert TensorProto.DataType.Name(casts[0].attribute[0].i) == pooled
    x = -np.arange(1, 10, dtype=np.int32).reshape(1, 1, 3, 3)
    graph, feeds = single_op("max_pool2d", [(x, p, False)], pool_size=(2, 2), strides=(2, 2), padding=(1, 1))
    assert assert_exact(graph, feeds)[0].ravel().tolist() == [-1, -2, -4, -5]


@PROPERTY
@given(p=st.integers(1, 32), scale=st.integers(1, 3), shape=st.tuples(*[st.integers(1, 3)] * 4),
       inline=st.booleans(), data=st.data())
def test_upsampling_exact(p, scale, shape, inline, data):
    x = data.draw(tensors(shape, p))
    y = assert_exact(*single_op("upsampling", [(x, p, False)], scale=scale), inline=inline)[0]
    assert y.shape == (*shape[:2], shape[2] * scale, shape[3] * scale)


@PROPERTY
@given(p=st.integers(1, 32), shape=st.tuples(*[st.integers(1, 4)] * 3), inline=st.booleans(), data=st.data())
def test_relu_exact(p, shape, inline, data):
    x = data.draw(tensors(shape, p))
    y = assert_exact(*single_op("relu", [(x, p, False)]), inline=inline)[0]
    x = np.clip(x, -bound(p), bound(p))  # the runtime clamps the input to its precision
    assert np.array_equal(y, np.where(x > 0, x, 0))


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_max_pool2d_any_int32(ceil_mode):
    """Bound 2^31: INT32_MIN is a real value here, equal to the padding sentinel, which still never changes a max."""
    x = np.full((1, 1, 4, 6), -(2**31), np.int32)
    x[0, 0, 1, 2] = 2**31 - 1
    x[0, 0, 3, 5] = -(2**31) + 1
    attrs = dict(pool_size=(3, 3), strides=(2, 2), padding=(1, 1), ceil_mode=ceil_mode)
    got = run_lowering("max_pool2d", attrs, [(x, ANY, False)])
    assert np.array_equal(got, REGISTRY["max_pool2d"].kernel(REGISTRY["max_pool2d"].bind(attrs), x))
