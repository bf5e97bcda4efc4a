"""The serving form's native kernels: the im2col ops and requantize (against numpy oracles, and their input
checks), conv2d runs started from MatMulInteger (exact against the reference executor for every operand route this CPU
computes exactly), and the choice of operand types (cvm_onnx.native.cpu)."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from support import tensors
from support.native import (channels_oracle, cpu_step, even, geometries, im2col_model, im2col_oracle, int32s,
                            requantize_add_oracle, requantize_model, requantize_oracle, step)
from support.oracles import wrap32

from cvm_onnx.app.cli import main
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import RuntimeFailure
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format import write_model
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.core.graph import Entry
from cvm_onnx.native import DOMAIN, cpu, library_path
from cvm_onnx.runtime.sessions import LAYOUTS, run, session
from cvm_onnx.serving import cpu_layout
from cvm_onnx.serving.target import Target

EXAMPLES = int(os.environ.get("CVM_ONNX_EXAMPLES", "60"))  # fewer under qemu (.ci/run)
pytestmark = pytest.mark.skipif(library_path() is None, reason="the native custom-op library was not built")


def routes() -> list[str]:
    """The operand routes this CPU computes exactly: uint8 x uint8 always, uint8 x int8 where ``cpu`` says so."""
    return ["u8u8"] + (["u8s8"] if cpu.products() == "u8s8" else [])


def run_route(model: onnx.ModelProto, feeds: dict, route: str, layout: str | None = None) -> list[np.ndarray]:
    return session(model, products=route, layout=layout).run(None, feeds)


def assert_exact_on_every_route(model: onnx.ModelProto, graph, data: np.ndarray) -> None:
    """The serving form ``model`` of ``graph`` equals the reference executor on ``data`` through every operand
    route this CPU computes exactly, as rows and as columns."""
    want = execute(graph, {"data": data})
    for route in routes():
        for layout in ("rows", "columns"):
            got = run_route(model, {"data": data}, route, layout)
            assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True)), (route, layout)


# -- the im2col ops alone ---------------------------------------------------------------------------------------

@settings(max_examples=EXAMPLES, deadline=None)
@given(geometry=geometries(), data=st.data(), op=st.sampled_from(["im2col_int8", "im2col_uint8"]))
def test_im2col_gathers_every_window(geometry, data, op):
    """Every window, and with wide=1 (strides 1) every padded row read on from each window position."""
    shape, kernel, strides, dilations, pads, group = geometry
    wide = strides == (1, 1) and data.draw(st.booleans())
    x = data.draw(st.one_of(tensors(shape, 8), tensors(shape, 1).map(lambda t: t - 128)))  # -128 too
    model = im2col_model(op, shape, kernel_shape=kernel, strides=strides, dilations=dilations, pads=pads,
                         group=group, **({"wide": 1} if wide else {}))
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output[0].type.tensor_type
    (got,) = run(model, {"x": x})
    want = im2col_oracle(x, kernel, strides, dilations, pads, group, 0 if op == "im2col_int8" else 128, wide)
    assert got.dtype == (np.int8 if op == "im2col_int8" else np.uint8)
    assert np.array_equal(got.astype(np.int64), want)
    assert [d.dim_value for d in inferred.shape.dim] == list(want.shape)


@pytest.mark.parametrize("threads", [1, 3])
def test_im2col_on_several_threads_gathers_every_plane_and_names_the_first_bad_value(threads):
    shape = (3, 8, 12, 12)
    x = np.random.default_rng(threads).integers(-128, 128, shape).astype(np.int32)
    model = im2col_model("im2col_int8", list(shape), kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2)
    sess = session(model, threads=threads)
    assert np.array_equal(sess.run(None, {"x": x})[0], im2col_oracle(x, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 2, 0))
    x.reshape(-1)[[900, 2000, 3000]] = [200, -300, 400]  # planes 6, 13 and 20: the first is named
    with pytest.raises(Exception, match=r"data value 200 at flat index 900 is outside"):
        sess.run(None, {"x": x})


def test_im2col_refuses_values_outside_int8():
    model = im2col_model("im2col_uint8", [1, 1, 2, 2], kernel_shape=[1, 1])
    x = np.array([[[[0, 127], [-128, 128]]]], np.int32)
    with pytest.raises(RuntimeFailure, match=r"im2col_uint8: data value 128 at flat index 3 is outside \[-128, 127\]"):
        run(model, {"x": x})


@pytest.mark.parametrize("shape, attrs, message", [
    ([1, 2, 3], dict(kernel_shape=[1, 1]), "data must be 4-D"),
    ([1, 3, 4, 4], dict(kernel_shape=[1, 1], group=2), "do not divide into group 2"),
    ([1, 1, 2, 2], dict(kernel_shape=[3, 3]), "larger than the padded input"),
])
def test_im2col_refuses_bad_shapes_with_one_error(shape, attrs, message):
    """The kernel's own checks (the schema's shape inference is not consulted by onnxruntime)."""
    x = np.zeros(shape, np.int32)
    model = im2col_model("im2col_int8", [None] * len(shape), **attrs)
    with pytest.raises(RuntimeFailure, match=message):
        run(model, {"x": x})


@pytest.mark.parametrize("attrs", [dict(), dict(kernel_shape=[3]), dict(kernel_shape=[1, 1], pads=[1, 1]),
                                   dict(kernel_shape=[1, 1], strides=[0, 1]),
                                   dict(kernel_shape=[1, 1], pads=[-1, 0, 0, 0]),
                                   dict(kernel_shape=[1, 1], wide=2), dict(kernel_shape=[1, 1], strides=[2, 1], wide=1)])
def test_im2col_refuses_bad_attributes(attrs):
    """Wrong lengths and values are refused by the schema (checker) and by the kernel (session or run)."""
    model = im2col_model("im2col_int8", [1, 1, 3, 3], **attrs)
    with pytest.raises((onnx.checker.ValidationError, onnx.shape_inference.InferenceError), match="kernel_shape|"
                       "pads|strides|wide"):
        onnx.checker.check_model(model, full_check=True)
    with pytest.raises(RuntimeFailure, match="im2col_int8"):
        run(model, {"x": np.zeros((1, 1, 3, 3), np.int32)})


def test_im2col_refuses_a_wrong_input_type():
    model = im2col_model("im2col_int8", [1, 1, 3, 3], TensorProto.INT64, kernel_shape=[1, 1])
    with pytest.raises(RuntimeFailure):
        session(model)


def rows_oracle(x, kernel, strides, dilations, pads, offset):
    """rows[n, oh * OW + ow, (fh * kw + fw) * C + c] = xp[n, c, oh*sh + fh*dh, ow*sw + fw*dw] + offset."""
    cols = im2col_oracle(x, kernel, strides, dilations, pads, 1, offset)  # (N, 1, C * kh * kw, OH * OW)
    n, c = x.shape[:2]
    windows = cols.reshape(n, c, kernel[0], kernel[1], -1)  # (N, C, kh, kw, P)
    return windows.transpose(0, 4, 2, 3, 1).reshape(n, -1, kernel[0] * kernel[1] * c)


@settings(max_examples=EXAMPLES, deadline=None)
@given(geometry=geometries(), data=st.data(), offset=st.sampled_from([0, 128]), threads=st.integers(1, 2))
def test_im2col_rows_gathers_every_window_as_a_row(geometry, data, offset, threads):
    """Every window of a one-group convolution as a row in the order (fh, fw, c), x + offset (offset 0: values in
    [0, 127]), offset in the padding; on 1-2 threads."""
    (n, c, h, w), kernel, strides, dilations, pads, _ = geometry
    c = data.draw(st.sampled_from([c, 8, 16, 17]))  # 8 x 8 blocks and their remainders
    shape = (n, c, h, w)
    x = data.draw(tensors(shape, 8) if offset else tensors(shape, 8).map(np.abs))
    if data.draw(st.booleans()):  # the edges of the range
        x = np.where(np.arange(x.size).reshape(shape) % 2, 127, -128 if offset else 0).astype(np.int32)
    model = im2col_model("im2col_rows", shape, kernel_shape=kernel, strides=strides, dilations=dilations,
                         pads=pads, offset=offset)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output[0].type.tensor_type
    got = session(model, threads=threads).run(None, {"x": x})[0]
    want = rows_oracle(x, kernel, strides, dilations, pads, offset)
    assert got.dtype == np.uint8 and np.array_equal(got.astype(np.int64), want)
    assert [d.dim_value for d in inferred.shape.dim] == list(want.shape)


@pytest.mark.parametrize("offset, value", [(0, -1), (0, 128), (128, -129)])
def test_im2col_rows_refuses_values_outside_its_range(offset, value):
    """offset 0 takes [0, 127] (the bound that makes uint8 x int8 pair sums fit int16), 128 takes [-128, 127]."""
    model = im2col_model("im2col_rows", [1, 1, 2, 2], kernel_shape=[1, 1], offset=offset)
    x = np.array([[[[0, 1], [value, 2]]]], np.int32)
    low = 0 if offset == 0 else -128
    with pytest.raises(RuntimeFailure, match=rf"im2col_rows: data value {value} at flat index 2 is outside "
                                              rf"\[{low}, 127\]"):
        run(model, {"x": x})


@pytest.mark.parametrize("attrs", [dict(kernel_shape=[1, 1], offset=1), dict(kernel_shape=[1, 1], group=2),
                                   dict(kernel_shape=[1, 1], wide=1)])
def test_im2col_rows_refuses_bad_attributes(attrs):
    model = im2col_model("im2col_rows", [1, 2, 3, 3], **attrs)
    with pytest.raises((onnx.checker.ValidationError, onnx.shape_inference.InferenceError), match="im2col_rows"):
        onnx.checker.check_model(model, full_check=True)
    with pytest.raises(RuntimeFailure, match="im2col_rows"):
        run(model, {"x": np.zeros((1, 2, 3, 3), np.int32)})
    for layout in LAYOUTS:  # each layout's passes leave the node for onnxruntime to refuse (the columns' too)
        with pytest.raises(RuntimeFailure, match="im2col_rows"):
            session(model, layout=layout)


# -- conv2d runs from integer products -------------------------------------------------------------------------

@st.composite
def conv_runs(draw):
    """conv2d (random geometry, weights at the int8 edges, optional bias) -> cvm_right_shift -> relu, and data;
    a quarter of them channelwise (1x1, one channel per group, a per-channel scale)."""
    (n, c, h, w), kernel, strides, dilations, pads, group = draw(geometries())
    if pads[0] != pads[2] or pads[1] != pads[3]:  # CVM's padding is symmetric
        return draw(conv_runs())
    oc = group * draw(st.integers(1, 3))
    if draw(st.integers(0, 3)) == 0:
        kernel, strides, pads, group, oc = (1, 1), (1, 1), (0, 0, 0, 0), c, c
    b = GraphBuilder()
    x = b.input("data", (1, c, h, w), 8)
    if draw(st.booleans()):  # x >= 0: one group takes rows of offset 0 (uint8 x int8 on every x86 CPU)
        x = b.op("relu", x)
    wshape = (oc, c // group, *kernel)
    inputs = [x, b.param("w", draw(tensors(wshape, 8)), 8)]
    use_bias = draw(st.booleans())
    if use_bias:
        inputs.append(b.param("b", draw(tensors((oc,), draw(st.sampled_from([8, 20, 31])))), 31))
    y = b.op("conv2d", *inputs, channels=oc, kernel_size=kernel, strides=strides, dilation=dilations,
             padding=pads[:2], groups=group, use_bias=use_bias)
    y = b.op("cvm_right_shift", y, shift_bit=draw(st.integers(1, 16)), precision=8)
    graph = b.build(b.op("relu", y))
    return graph, draw(tensors((n, c, h, w), 8)), n


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=conv_runs())
def test_conv_runs_from_integer_products_are_exact(case):
    """Exact against the reference executor through every operand route this CPU computes exactly (under qemu
    Haswell: uint8 x int8 for rows of x >= 0 only), as exported (rows for one group) and with the rows turned into
    columns at session creation, batched too."""
    graph, data, n = case
    if n > 1:
        from cvm_onnx.core.batch import batched

        graph = batched(graph, n)
    model = to_onnx(graph, Target())
    conv = next(node for node in graph.nodes if node.op == "conv2d")
    channelwise = conv.attrs["kernel_size"] == (1, 1) and conv.attrs["groups"] == data.shape[1] == \
        conv.attrs["channels"] and conv.attrs["strides"] == (1, 1) and conv.attrs["padding"] == (0, 0)
    ops = [node.op_type for node in model.graph.node]
    scaled = [node for node in model.graph.node if any(a.name == "scales" for a in node.attribute)]
    assert (ops.count("MatMulInteger"), len(scaled)) == ((0, 1) if channelwise else (1, 0))
    assert_exact_on_every_route(model, graph, data)


def targets_here() -> list[Target]:
    """The CPU targets with a fixed layout whose operands this CPU computes exactly."""
    operands = ["u8u8"] + (["u8s8-rows0"] if cpu.products() == "u8s8" else []) + (["u8s8"] if cpu.unbounded() else [])
    return [Target(layout=layout, operands=o) for layout in ("rows", "fused", "columns") for o in operands]


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=conv_runs(), data=st.data())
def test_a_target_with_a_fixed_layout_is_exact_on_plain_onnxruntime(case, data):
    """Exported for any target of a fixed layout and operands this CPU computes exactly, the file run by plain
    onnxruntime (default options, the native library registered) equals the reference executor, batched too."""
    graph, x, n = case
    if n > 1:
        from cvm_onnx.core.batch import batched

        graph = batched(graph, n)
    target = data.draw(st.sampled_from(targets_here()))
    model = to_onnx(graph, target)
    so = ort.SessionOptions()
    so.register_custom_ops_library(library_path())
    got = ort.InferenceSession(model.SerializeToString(), so).run(None, {"data": x})
    assert all(np.array_equal(g, w) for g, w in zip(got, execute(graph, {"data": x}), strict=True)), target


@pytest.mark.isa
def test_the_chosen_route_is_exact_on_this_cpu():
    """``cpu.unbounded`` (uint8 x int8 for every product) holds only with VNNI/AMX and an exact probe (so never
    under qemu Haswell), and the probe's operands (int16 pair sums that saturate) are exact through the route the
    session picks."""
    flags = set(open("/proc/cpuinfo").read().split()) if os.path.exists("/proc/cpuinfo") else set()
    if cpu.unbounded():  # the library's CPUID reading agrees with the kernel's
        assert {"avx512_vnni", "avx_vnni", "amx_int8"} & flags
    b = GraphBuilder()
    x = b.input("data", (1, 64, 1, 1), 8)
    w = b.param("w", np.full((8, 64, 1, 1), 127), 8)  # the left operand w + 128 = 255
    y = b.op("cvm_right_shift", b.op("conv2d", x, w, channels=8, kernel_size=(1, 1), use_bias=False),
             shift_bit=1, precision=32)
    graph = b.build(b.op("clip", y, a_min=-(1 << 20), a_max=1 << 20))
    data = np.where(np.arange(64) % 4 < 2, 127, -127).reshape(1, 64, 1, 1).astype(np.int32)  # 2 * 255 * 127 > 2^15
    model = to_onnx(graph, Target())
    assert "MatMulInteger" in {n.op_type for n in model.graph.node}
    assert np.array_equal(run(model, {"data": data})[0], execute(graph, {"data": data})[0])


@pytest.mark.isa
def test_rows_of_nonnegative_windows_are_exact_at_the_edge_of_the_pair_sum_bound():
    """Windows in [0, 127] (after a relu) times weights at -127 and 127 (a conv2d's 8 bits): every int16 pair sum of the
    uint8 x int8 products is within 2 * 127 * 128 = 32512, so that route is exact on every x86 CPU (under qemu
    Haswell: vpmaddubsw, which saturates), and ``products()`` offers it there; the same weights over windows up
    to 255 (offset 128) are left uint8 x uint8 unless ``unbounded()``."""
    assert cpu.products() == "u8s8"  # every x86 CPU: at least the rows of offset 0
    b = GraphBuilder()
    c = 64
    w = b.param("w", np.where(np.arange(8 * c * 9).reshape(8, c, 3, 3) % 3 == 0, -127, 127), 8)
    x = b.input("data", (1, c, 4, 4), 8)
    heads = []
    for source in (b.op("relu", x), x):  # offset 0, offset 128
        y = b.op("conv2d", source, w, channels=8, kernel_size=(3, 3), padding=(1, 1), use_bias=False)
        heads.append(b.op("clip", b.op("cvm_right_shift", y, shift_bit=1, precision=32), a_min=-(1 << 22),
                          a_max=1 << 22))
    graph = b.build(*heads)
    model = to_onnx(graph, Target())
    offsets = sorted(a.i for n in model.graph.node if n.op_type == "im2col_rows" for a in n.attribute
                     if a.name == "offset")
    assert offsets == [0, 128]
    signed = cpu_layout.signed_operands(model, cpu.unbounded())
    int8_weights = sum(n.op_type == "MatMulInteger" and len(n.input) < 4 for n in signed.graph.node)
    assert int8_weights == (2 if cpu.unbounded() else 1)
    for data in (np.full((1, c, 4, 4), 127), np.where(np.arange(c * 16).reshape(1, c, 4, 4) % 5 == 0, -127, 127)):
        data = data.astype(np.int32)
        assert all(np.array_equal(g, w) for g, w in zip(run(model, {"data": data}), execute(graph, {"data": data})))


@pytest.mark.isa
def test_the_saturation_probe_fails_exactly_where_uint8_x_int8_is_not_exact_for_every_operand():
    """Without VNNI the probe's operands (pair sums 2 * 255 * 127) come out wrong: the route ``unbounded()``
    guards really is inexact there, so the bound of the rows of offset 0 is what makes them exact."""
    if not cpu.EXACT_SIGNED & set(cpu.features()):
        assert not cpu._probe_exact() and not cpu.unbounded()
    assert cpu._probe_bounded()


def test_signed_columns_rewrites_only_matmul_operands():
    b = GraphBuilder()
    x = b.input("data", (1, 2, 4, 4), 8)
    w = b.param("w", np.ones((4, 1, 3, 3), np.int32), 8)  # two groups: columns (one group takes rows)
    y = b.op("cvm_right_shift", b.op("conv2d", x, w, channels=4, kernel_size=(3, 3), use_bias=False, groups=2),
             shift_bit=2, precision=8)
    model = to_onnx(b.build(b.op("relu", y)), Target())
    signed = cpu_layout.signed_columns(model)
    ops = {n.op_type: n for n in signed.graph.node}
    assert "im2col_int8" in ops and "im2col_uint8" not in ops and len(ops["MatMulInteger"].input) == 3
    assert "im2col_uint8" in {n.op_type for n in model.graph.node}  # the exported model is left as it was
    # an im2col that is also a graph output keeps its type
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    cols = next(n for n in exposed.graph.node if n.op_type == "im2col_uint8").output[0]
    exposed.graph.output.add().CopyFrom(helper.make_tensor_value_info(cols, TensorProto.UINT8, [None] * 4))
    assert "im2col_uint8" in {n.op_type for n in cpu_layout.signed_columns(exposed).graph.node}


def test_without_the_native_library_the_integer_form_is_refused_with_one_error():
    b = GraphBuilder()
    x = b.input("data", (1, 1, 3, 3), 8)
    y = b.op("cvm_right_shift", b.op("conv2d", x, b.param("w", np.ones((1, 1, 3, 3)), 8), channels=1,
                                     kernel_size=(3, 3), padding=(1, 1), use_bias=False), shift_bit=1, precision=8)
    graph = b.build(b.op("relu", y))
    model = to_onnx(graph, Target())
    with pytest.raises(RuntimeFailure, match="native im2col and requantize kernels.*products='float'"):
        session(model, native=False)
    assert "MatMulInteger" in {n.op_type for n in model.graph.node}
    assert "MatMulInteger" not in {n.op_type for n in to_onnx(graph, Target(products="float")).graph.node}


def test_the_integer_route_is_taken_where_its_windows_fit_the_cost_model():
    """A conv2d gathering at most ``nn.INT8_COLUMNS`` bytes of windows starts its run from integer products;
    the same layer batched past that keeps its float32 Conv (measured slower there)."""
    from cvm_onnx.converters.to_onnx import nn
    from cvm_onnx.core.batch import batched

    b = GraphBuilder()
    x = b.input("data", (1, 16, 64, 64), 8)
    y = b.op("conv2d", x, b.param("w", np.ones((4, 16, 3, 3)), 8), channels=4, kernel_size=(3, 3),
             padding=(1, 1), use_bias=False)
    graph = b.build(b.op("relu", b.op("cvm_right_shift", y, shift_bit=4, precision=8)))
    fits = nn.INT8_COLUMNS // (16 * 9 * 64 * 64)  # images whose windows fit
    assert fits >= 1
    for n, route in ((fits, "MatMulInteger"), (fits + 1, "Conv")):
        ops = {node.op_type for node in to_onnx(batched(graph, n), Target()).graph.node}
        assert route in ops and not ({"MatMulInteger", "Conv"} - {route}) & ops


def test_a_library_without_the_feature_probe_means_no_unbounded_signed_products(monkeypatch, tmp_path):
    """A library that does not load (or lacks ``cvm_onnx_cpu_features``) reports no features, so only the
    products whose bound proves uint8 x int8 exact may become signed."""
    monkeypatch.setattr(cpu, "library_path", lambda: str(tmp_path / "missing.so"))
    cpu.features.cache_clear()
    cpu.unbounded.cache_clear()
    try:
        assert cpu.features() == () and not cpu.unbounded()
    finally:
        cpu.features.cache_clear()
        cpu.unbounded.cache_clear()


# -- the native requantize op -----------------------------------------------------------------------------------

@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data(),
       steps=st.lists(cpu_step, min_size=1, max_size=6))
def test_requantize_applies_its_steps_in_int32(shape, data, steps):
    """Every step in order with int32 wrap-around (the exporter only emits runs that never wrap), + a bias per
    axis-1 channel, against a numpy oracle, at the int32 edges too."""
    x = data.draw(st.lists(st.one_of(int32s, st.sampled_from([0, -1, (1 << 31) - 1, -(1 << 31)])),
                           min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    x = np.array(x, np.int64).reshape(shape).astype(np.int32)
    channels = shape[1] if len(shape) > 1 and data.draw(st.booleans()) else 0
    bias = np.array(data.draw(st.lists(int32s, min_size=channels, max_size=channels)), np.int64).astype(np.int32)
    model = requantize_model(shape, channels, steps)
    onnx.checker.check_model(model, full_check=True)
    assert np.array_equal(run(model, {"x": x, "b": bias})[0], requantize_oracle(x, bias, steps))


#: A quantized import's requantization whose shift rounds half to even (requantize.h EvenChains: one pass): a clip,
#: a multiply or none, the even shift, its final clip or none, after a shift or not.
_clip = st.tuples(int32s, int32s).map(sorted).map(lambda ab: (3, *ab))
even_chain = st.tuples(st.lists(st.tuples(st.just(0), st.integers(1, 31), st.just(0)), max_size=1), _clip,
                       st.lists(st.tuples(st.just(1), int32s, st.just(0)), max_size=1), even,
                       st.lists(_clip, max_size=1)).map(lambda t: [*t[0], t[1], *t[2], t[3], *t[4]])


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 4), inner=st.integers(1, 600), steps=even_chain, data=st.data())
def test_requantize_of_an_imports_chain_rounding_half_to_even(n, c, inner, steps, data):
    """The chains of an import whose shift rounds half to even, in one pass (the kinds known at compile time), against
    the numpy oracle (round_half_even of a Fraction where the kernel's int32 sum does not wrap), at the int32 edges
    too and at ties."""
    size = n * c * inner
    x = np.array(data.draw(st.lists(st.one_of(int32s, st.sampled_from([0, -1, (1 << 31) - 1, -(1 << 31)]),
                                              st.integers(-64, 64).map(lambda j: j * 8 + 4)),
                                    min_size=size, max_size=size)), np.int64).reshape(n, c, inner).astype(np.int32)
    bias = np.zeros(c, np.int32) if data.draw(st.booleans()) else np.zeros(0, np.int32)
    model = requantize_model([n, c, inner], bias.size, steps)
    assert np.array_equal(run(model, {"x": x, "b": bias})[0], requantize_oracle(x, bias, steps))


@settings(max_examples=max(5, EXAMPLES // 6), deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 4), inner=st.integers(3000, 9000), threads=st.integers(1, 3),
       steps=st.lists(step, min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_requantize_splits_large_tensors_across_threads_exactly(n, c, inner, threads, steps, seed):
    """Tensors of several 16 K-element blocks, whose bounds fall inside channels, on 1-3 intra-op threads, with
    per-channel scales or without (int32 multiplies that wrap)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-(1 << 31), 1 << 31, (n, c, inner), dtype=np.int64).astype(np.int32)
    bias = rng.integers(-(1 << 31), 1 << 31, c, dtype=np.int64).astype(np.int32)
    scales = [] if seed % 2 else [int(v) for v in rng.integers(-(1 << 31), 1 << 31, c, dtype=np.int64)]
    sess = session(requantize_model([n, c, inner], c, steps, scales=scales), threads=threads)
    assert np.array_equal(sess.run(None, {"x": x, "b": bias})[0], requantize_oracle(x, bias, steps, scales))


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(shape=st.lists(st.integers(1, 40), min_size=3, max_size=4), data=st.data(),
       steps=st.lists(step, min_size=1, max_size=5), threads=st.integers(1, 3))
def test_requantize_with_a_width_keeps_the_first_elements_of_each_row(shape, data, steps, threads):
    """width w: the steps over x[..., :w] + bias (rows gathered into chunks, split across threads)."""
    width = data.draw(st.integers(1, shape[-1]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.integers(-(1 << 31), 1 << 31, shape, dtype=np.int64).astype(np.int32)
    channels = shape[1] if data.draw(st.booleans()) else 0
    bias = rng.integers(-(1 << 31), 1 << 31, channels, dtype=np.int64).astype(np.int32)
    model = requantize_model(shape, channels, steps, width)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output[0].type.tensor_type
    got = session(model, threads=threads).run(None, {"x": x, "b": bias})[0]
    assert np.array_equal(got, requantize_oracle(x[..., :width], bias, steps))
    assert [d.dim_value for d in inferred.shape.dim] == [*shape[:-1], width]


@pytest.mark.parametrize("steps, channels, message", [
    ([(0, 32, 0)], 0, "step 0 is not a valid"), ([(3, 5, 4)], 0, "step 0 is not a valid"),
    ([(7, 1, 0)], 0, "step 0 is not a valid"), ([(1, 1 << 31, 0)], 0, "step 0 is not a valid"),
    ([(2, 1, 0)], 3, "bias must be empty or \\(C,\\)"),
])
def test_requantize_refuses_bad_steps_and_bias(steps, channels, message):
    model = requantize_model([1, 2, 3], channels, steps)
    with pytest.raises(RuntimeFailure, match=message):
        run(model, {"x": np.zeros((1, 2, 3), np.int32), "b": np.zeros(channels, np.int32)})


@pytest.mark.parametrize("shape, attrs", [([1, 2, 3], dict(width=4)), ([2, 3], dict(width=1)),
                                          ([1, 2, 3], dict(width=-1)), ([1, 2, 3], dict(scales=[1, 2, 3])),
                                          ([1, 2, 3], dict(scales=[1, 2], width=2)),
                                          ([1, 2, 3], dict(scales=[1, 1 << 31]))])
def test_requantize_refuses_a_width_or_scales_its_data_cannot_take(shape, attrs):
    node = helper.make_node("requantize", ["x", "b"], ["y"], domain=DOMAIN, steps=[2, 1, 0], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT32, [None] * len(shape)),
                                            helper.make_tensor_value_info("b", TensorProto.INT32, [0])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)])
    model = onnx_model(graph, domains={DOMAIN: 1})
    with pytest.raises(RuntimeFailure, match="requantize: (width|.*scales)"):
        run(model, {"x": np.zeros(shape, np.int32), "b": np.zeros(0, np.int32)})


def test_each_convolutions_route_is_recorded_with_why_not(tmp_path, monkeypatch):
    """The serving form's metadata and the --report list every conv2d's route, and why it takes no integer
    products: windows over the cost model's limit, an output read by two runs, or the products turned off."""
    from cvm_onnx.converters.to_onnx import nn

    monkeypatch.setattr(nn, "INT8_COLUMNS", 400)  # a 1x1 conv here gathers 50 bytes, a 3x3 one 450
    b = GraphBuilder()

    def conv(x, name, **attrs):
        kernel, groups = attrs.get("kernel_size", (1, 1)), attrs.get("groups", 1)
        w = b.param(f"{name}_w", np.ones((2, 2 // groups, *kernel)), 8)
        return b.op("conv2d", x, w, channels=2, use_bias=False, name=name, **({"kernel_size": (1, 1)} | attrs))

    def requantized(y):
        return b.op("relu", b.op("cvm_right_shift", y, shift_bit=4, precision=8))

    x = b.input("data", (1, 2, 5, 5), 8)
    a = requantized(conv(x, "int"))
    s = requantized(conv(a, "scale", groups=2))
    big = requantized(conv(s, "big", kernel_size=(3, 3), padding=(1, 1)))
    twice = conv(big, "twice")
    positive = requantized(conv(b.op("relu", x), "positive"))
    graph = b.build(b.op("elemwise_add", requantized(twice), requantized(twice)), positive)
    routes = lambda m: json.loads({p.key: p.value for p in m.metadata_props}["cvm.routes"])  # noqa: E731
    assert routes(to_onnx(graph, Target())) == [
        ["int", "integer products (rows: uint8 x int8 with VNNI)", ""], ["scale", "per-channel scale", ""],
        ["big", "float32/int32 products", "its windows, 450 bytes, exceed the cost model's 400 bytes a call"],
        ["twice", "float32/int32 products", "its output is not read by one requantization run alone"],
        ["positive", "integer products (rows of x >= 0: uint8 x int8 on every x86 CPU)", ""]]
    assert {r[2] for r in routes(to_onnx(graph, Target(products="float")))} == {
        "integer products are off (the target's products are float)"}
    write_model(graph, tmp_path / "m")
    assert main(["convert", str(tmp_path / "m"), "-o", str(tmp_path / "m.onnx"), "--optimize", "--report",
                 str(tmp_path / "r.md")]) == 0
    report = (tmp_path / "r.md").read_text()
    assert "| twice | float32/int32 products | its output is not read by one requantization run alone |" in report
    assert ("convolutions: 1 integer products (rows: uint8 x int8 with VNNI), 1 per-channel scale, 2 float32/int32 "
            "products, 1 integer products (rows of x >= 0: uint8 x int8 on every x86 CPU)") in report


@pytest.mark.parametrize("kernel, groups", [((3, 3), 1), ((1, 1), 2), (None, None)])
def test_runs_reading_an_int8_param_read_it_as_int32(kernel, groups):
    """A run whose head conv2d reads an int8 param as its data (integer products or a per-channel scale), or a
    run reading one directly: the native kernels read int32, so the param is widened first, exactly."""
    b = GraphBuilder()
    p = b.param("p", (np.arange(32) - 16).astype(np.int8).reshape(1, 2, 4, 4), 8)
    y = p
    if kernel is not None:
        w = b.param("w", np.arange(2 * 2 // groups * kernel[0] * kernel[1]).reshape(2, 2 // groups, *kernel) % 5, 8)
        y = b.op("conv2d", p, w, channels=2, kernel_size=kernel, padding=(kernel[0] // 2, kernel[1] // 2),
                 groups=groups, use_bias=False)
    y = b.op("relu", b.op("cvm_right_shift", y, shift_bit=1, precision=8))
    graph = b.build(b.op("elemwise_add", b.input("data", (1, 2, 4, 4), 8), y))
    data = np.arange(32, dtype=np.int32).reshape(1, 2, 4, 4) % 7
    want = execute(graph, {"data": data})
    for route in routes():
        assert np.array_equal(run_route(to_onnx(graph, Target()), {"data": data}, route)[0],
                              want[0]), route


@pytest.mark.isa
def test_a_session_takes_the_products_route_asked_for_only_where_exact():
    """``products="u8u8"`` anywhere (exact at the int8 edges); "u8s8" only where ``cpu.products()`` says it is
    exact for some products (under qemu Haswell: the rows of x >= 0); anything else refused."""
    b = GraphBuilder()
    x = b.input("data", (1, 2, 4, 4), 8)
    y = b.op("conv2d", x, b.param("w", np.full((2, 2, 3, 3), -127), 8), channels=2, kernel_size=(3, 3),
             padding=(1, 1), use_bias=False)
    graph = b.build(b.op("relu", b.op("cvm_right_shift", y, shift_bit=4, precision=8)))
    model = to_onnx(graph, Target())
    data = np.full((1, 2, 4, 4), 127, np.int32)
    want = execute(graph, {"data": data})[0]
    assert np.array_equal(session(model, products="u8u8").run(None, {"data": data})[0], want)
    with pytest.raises(RuntimeFailure, match="products='u8s4'"):
        session(model, products="u8s4")
    if cpu.products() != "u8s8":
        with pytest.raises(RuntimeFailure, match="products='u8s8'"):
            session(model, products="u8s8")


def test_a_refused_convolution_outside_any_run_says_why_it_was_refused(monkeypatch):
    """A conv2d whose float32 sums exceed 2^24 heads no run; when the cost model also refuses its integer
    products, that refusal is the reason recorded (not that no run starts from it)."""
    from cvm_onnx.converters.to_onnx import nn

    monkeypatch.setattr(nn, "INT8_COLUMNS", 400)
    b = GraphBuilder()
    x = b.input("data", (1, 1100, 1, 1), 8)
    y = b.op("conv2d", x, b.param("w", np.full((1, 1100, 1, 1), 127), 8), channels=1, kernel_size=(1, 1),
             use_bias=False, name="wide_sum")  # 127 * 127 * 1100 > 2^24
    graph = b.build(b.op("relu", b.op("cvm_right_shift", y, shift_bit=16, precision=8)))
    model = to_onnx(graph, Target())
    routes = json.loads({p.key: p.value for p in model.metadata_props}["cvm.routes"])
    assert routes == [["wide_sum", "float32/int32 products",
                       "its windows, 1,100 bytes, exceed the cost model's 400 bytes a call"]]
    data = np.full((1, 1100, 1, 1), 127, np.int32)
    assert np.array_equal(run(model, {"data": data})[0], execute(graph, {"data": data})[0])


# -- which values are proven >= 0 (the rows of offset 0) ---------------------------------------------------------

@st.composite
def sign_graphs(draw):
    """A chain of ops over the input (some proving x >= 0, some keeping it, some not), and data at the edges."""
    b = GraphBuilder()
    x = b.input("data", (1, 2, 4, 4), 8)
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["relu", "clip", "cvm_right_shift", "max_pool2d", "broadcast_add", "negative",
                                     "elemwise_sub", "cvm_clip"]))
        if kind == "relu":
            x = b.op("relu", x)
        elif kind == "clip":
            x = b.op("clip", x, a_min=draw(st.integers(-5, 5)), a_max=draw(st.integers(6, 200)))
        elif kind == "cvm_right_shift":
            x = b.op("cvm_right_shift", x, shift_bit=draw(st.integers(1, 3)), precision=8)
        elif kind == "cvm_clip":
            x = b.op("cvm_clip", x, precision=draw(st.integers(2, 8)))
        elif kind == "max_pool2d":
            x = b.op("max_pool2d", x, pool_size=(2, 2), padding=(1, 1))
        elif kind == "broadcast_add":
            x = b.op("broadcast_add", x, b.param(f"p{len(b.nodes)}", draw(tensors((1, 2, 1, 1), 4)), 4))
        elif kind == "negative":
            x = b.op("negative", x)
        else:
            x = b.op("elemwise_sub", x, b.op("relu", x))
    data = draw(st.one_of(tensors((1, 2, 4, 4), 8), st.just(np.full((1, 2, 4, 4), 127, np.int32)),
                          st.just(np.full((1, 2, 4, 4), -127, np.int32))))
    return b.build(x), data


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=sign_graphs())
def test_values_proven_nonnegative_are_never_negative(case):
    """``bounds.nonnegative`` claims an entry only where every value it takes is >= 0 (checked on the reference
    executor's values of every entry), and claims relu outputs."""
    from cvm_onnx.converters.to_onnx.bounds import nonnegative

    graph, data = case
    claimed = nonnegative(graph)
    values = execute(graph, {"data": data}, keep_all=True)
    assert all(int(values[e].min(initial=0)) >= 0 for e in claimed if e in values)
    assert all(Entry(i) in claimed for i, n in enumerate(graph.nodes) if n.op == "relu")


def test_resnet20_convolutions_after_a_relu_take_rows_of_offset_0(resnet):
    """ResNet-20's convolutions from integer products (all but the per-channel scales: 1x1, one channel a group)
    that read a relu's output take rows of offset 0, the others of 128; those reading the same tensor with the same
    geometry share one im2col_rows (merge_repeated_windows). On chain: 18 of 22 offset 0, 21 im2col_rows."""
    model = to_onnx(resnet, Target())
    rows = {n.output[0]: n for n in model.graph.node if n.op_type == "im2col_rows"}
    offsets = [a.i for m in model.graph.node if m.op_type == "MatMulInteger" and m.input[0] in rows
               for a in rows[m.input[0]].attribute if a.name == "offset"]
    g = resnet
    convs = [n for n in g.nodes if n.op == "conv2d" and not (
        n.attrs["kernel_size"] == (1, 1) and n.attrs["groups"] == n.attrs["channels"] == g.type_of(n.inputs[0]).shape[1])]
    after_relu = sum(g.nodes[n.inputs[0].node].op == "relu" for n in convs)
    windows = {(n.inputs[0], *(n.attrs.get(k) for k in ("kernel_size", "strides", "padding", "dilation"))) for n in convs}
    assert sorted(offsets) == [0] * after_relu + [128] * (len(convs) - after_relu) and len(rows) == len(windows)


@pytest.mark.parametrize("first, second", [((0, 5), (10, 20)), ((-50, 50), (-10, 3)), ((10, 20), (-5, 12)),
                                           ((-300, -200), (-250, 0))])
def test_two_clips_in_a_row_are_one_step_and_exact(first, second):
    """requantize takes clip(clip(v, a, b), lo, hi) as clip(v, clip(a, lo, hi), clip(b, lo, hi)), disjoint
    ranges too (every value becomes a bound)."""
    b = GraphBuilder()
    x = b.input("data", (1, 4, 5, 5), 8)
    y = b.op("conv2d", x, b.param("w", np.arange(-72, 72).reshape(4, 4, 3, 3), 8), channels=4, kernel_size=(3, 3),
             padding=(1, 1), use_bias=False)
    y = b.op("clip", b.op("clip", b.op("cvm_right_shift", y, shift_bit=2, precision=16), a_min=first[0],
                          a_max=first[1]), a_min=second[0], a_max=second[1])
    graph = b.build(y)
    model = to_onnx(graph, Target())
    (steps,) = [list(a.ints) for n in model.graph.node if n.op_type == "requantize" for a in n.attribute
                if a.name == "steps"]
    assert steps[0::3].count(3) == 1
    data = np.random.default_rng(0).integers(-127, 128, (1, 4, 5, 5)).astype(np.int32)
    assert np.array_equal(run(model, {"data": data})[0], execute(graph, {"data": data})[0])


def test_the_layout_measured_at_session_creation_is_exact_and_recorded(resnet):
    """layout="measure" times the rows, the fused kernels (``cpu_layout.fused_convolutions``) and the columns
    (``cpu_layout.columns_from_rows``) and keeps the fastest; the session's cvm.routes says so; every way the outputs are
    the reference's. Where no layout is remembered (serving.route_cache) that is the default."""
    model = to_onnx(resnet, Target())
    columns = cpu_layout.columns_from_rows(model)
    assert {n.op_type for n in columns.graph.node if n.domain == DOMAIN} == {"im2col_uint8", "requantize"}
    data = np.random.default_rng(0).integers(-127, 128, (1, 3, 32, 32)).astype(np.int32)
    want = execute(resnet, {"data": data})[0]
    sess = session(model, layout="measure")
    assert np.array_equal(sess.run(None, {"data": data})[0], want)
    routes = json.loads(sess.get_modelmeta().custom_metadata_map["cvm.routes"])
    assert all(re.search(r"layout measured at session creation: rows .* ms, fused .* ms, columns .* ms", r[1])
               for r in routes if r[1].startswith("integer products"))
    for layout in ("rows", "fused", "columns"):
        assert np.array_equal(session(model, layout=layout).run(None, {"data": data})[0], want), layout
    with pytest.raises(RuntimeFailure, match="layout='diagonal'"):
        session(model, layout="diagonal")


# -- channels-last between rows products (cpu_layout.channels_last) -----------------------------------------------------

@st.composite
def residual_graphs(draw):
    """A ResNet-like chain: a stem conv, blocks of conv -> run -> conv -> run joined by elemwise_add with their
    input, a per-channel scale (folded batch norm) and a relu, maybe a strided conv; the output after a run, an
    add, or a flatten. Weights at the int8 edges."""
    c = draw(st.integers(1, 9))
    hw = draw(st.integers(2, 7))
    b = GraphBuilder()

    def run(y, relu=True):
        y = b.op("cvm_right_shift", y, shift_bit=draw(st.integers(4, 9)), precision=8)
        return b.op("relu", y) if relu else y

    def conv(x, c_in, c_out, k=3, stride=1, groups=1):
        w = b.param(f"w{len(b.nodes)}", draw(tensors((c_out, c_in // groups, k, k), 8)), 8)
        return b.op("conv2d", x, w, channels=c_out, kernel_size=(k, k), padding=(k // 2, k // 2),
                    strides=(stride, stride), groups=groups, use_bias=False)

    x = run(conv(b.input("data", (1, 3, hw, hw), 8), 3, c))
    for _ in range(draw(st.integers(1, 2))):
        y = run(conv(run(conv(x, c, c)), c, c), relu=False)
        x = b.op("cvm_clip", b.op("elemwise_add", x, y), precision=8)
        if draw(st.booleans()):
            x = run(conv(x, c, c, k=1, groups=c))  # a per-channel scale
        x = b.op("relu", x)
    if draw(st.booleans()):
        x = run(conv(x, c, 2 * c, stride=2))
    end = draw(st.sampled_from(["run", "add", "flatten"]))
    if end == "add":
        x = b.op("elemwise_add", x, x)
    elif end == "flatten":
        x = b.op("flatten", x)
    return b.build(x), draw(tensors((1, 3, hw, hw), 8))


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=residual_graphs())
def test_channels_last_between_rows_products_is_exact(case):
    """The rows route with its tensors kept channels-last (residual adds, per-channel scales, the output read back
    as NCHW), and the fused kernels' route, equal the reference executor, and equal the model without the pass."""
    graph, data = case
    model = to_onnx(graph, Target())
    last = cpu_layout.channels_last(model)
    assert any(a.name == "nhwc" for n in last.graph.node for a in n.attribute)
    want = execute(graph, {"data": data})[0]
    for layout in ("rows", "fused"):
        assert np.array_equal(session(model, layout=layout).run(None, {"data": data})[0], want), layout
    for products in routes():
        assert np.array_equal(session(model, products=products, layout="columns").run(None, {"data": data})[0], want)


def fused_here(model: onnx.ModelProto, isa: int) -> ort.InferenceSession:
    """A plain onnxruntime session of the fused layout of ``model`` on products kernel ``isa`` (conv.h ProductIsa)."""
    so = ort.SessionOptions()
    so.register_custom_ops_library(library_path())
    served = cpu_layout.fused_convolutions(cpu_layout.channels_last(model), isa=isa)
    return ort.InferenceSession(served.SerializeToString(), so, providers=["CPUExecutionProvider"])


def kernels_here() -> list[int]:
    """The products kernels this CPU runs (conv.h ProductIsa): baseline, AVX2 pairs, AVX-512 VNNI."""
    have = set(cpu.features())
    return [1] + [2] * ("avx2" in have) + [4] * ("avx512_vnni" in have)


def standalone_scales(model: onnx.ModelProto) -> list[str]:
    """The outputs of the standalone channels-last ``requantize`` nodes with ``scales`` (a folded batch norm's) that
    only a convolution kernel reads."""
    readers = {}
    for n in model.graph.node:
        for t in n.input:
            readers.setdefault(t, []).append(n.op_type)
    return [n.output[0] for n in model.graph.node if n.op_type == "requantize" and
            any(a.name == "scales" for a in n.attribute) and any(a.name == "nhwc" and a.i for a in n.attribute) and
            [r[:15] for r in readers.get(n.output[0], [])] == ["conv_requantize"]]


@st.composite
def scaled_graphs(draw):
    """A convolution and its run and relu, a per-channel scale (a 1 x 1 convolution of one channel per group, at
    least two: a folded batch norm) with a bias or without and its run and relu, then a convolution reading it
    (strided or not) and its run and relu: the scale's run is channels-last and only that convolution reads it.
    Batch 1 to 3, values at the int8 edges."""
    n, c, hw = draw(st.integers(1, 3)), draw(st.integers(2, 20)), draw(st.integers(2, 7))
    b = GraphBuilder()

    def param(name, shape, precision=8):
        return b.param(name, draw(tensors(shape, precision)), 8 if precision == 8 else 31)

    def run(y):
        return b.op("relu", b.op("cvm_right_shift", y, shift_bit=draw(st.integers(1, 9)), precision=8))

    y = run(b.op("conv2d", b.input("data", (n, 3, hw, hw), 8), param("w0", (c, 3, 3, 3)), channels=c,
                 kernel_size=(3, 3), padding=(1, 1), strides=(1, 1), groups=1, use_bias=False))
    bias = draw(st.booleans())
    scale = [y, param("ws", (c, 1, 1, 1))] + [param("bs", (c,), draw(st.sampled_from([8, 20, 31])))] * bias
    y = run(b.op("conv2d", *scale, channels=c, kernel_size=(1, 1), padding=(0, 0), strides=(1, 1), groups=c,
                 use_bias=bias))
    stride = draw(st.sampled_from([1, 2]))
    y = run(b.op("conv2d", y, param("w2", (c, c, 3, 3)), channels=c, kernel_size=(3, 3), padding=(1, 1),
                 strides=(stride, stride), groups=1, use_bias=False))
    return b.build(y), draw(tensors((n, 3, hw, hw), 8))


@st.composite
def preactivation_graphs(draw):
    """ResNet-20's blocks in small: a stem convolution and its run and relu, then one to three blocks, each a
    per-channel scale of the block's input with its run and relu, two convolutions and their runs (a relu after
    the first; a clip, multiply and shift after the second), and the Add of the block's input and the second's
    run, then a clip, multiply and shift (its end): the block's input read by its scale and by its Add. Batch 1
    to 3, values at the int8 edges."""
    n, c, hw = draw(st.integers(1, 3)), draw(st.integers(2, 20)), draw(st.integers(2, 7))
    b = GraphBuilder()

    def run(y, relu=True):
        y = b.op("cvm_right_shift", y, shift_bit=draw(st.integers(1, 9)), precision=8)
        return b.op("relu", y) if relu else y

    def conv(y, c_in, k=3, groups=1):
        w = b.param(f"w{len(b.nodes)}", draw(tensors((c, c_in // groups, k, k), 8)), 8)
        return b.op("conv2d", y, w, channels=c, kernel_size=(k, k), padding=(k // 2, k // 2), strides=(1, 1),
                    groups=groups, use_bias=False)

    def scaled(y, precision):  # a clip, a multiply by a scalar and a shift (the CVM model's requantization)
        m = b.param(f"m{len(b.nodes)}", np.array([draw(st.integers(1, 127))]), 8)
        y = b.op("broadcast_mul", b.op("cvm_clip", y, precision=precision), m)
        return b.op("cvm_right_shift", y, shift_bit=draw(st.integers(1, 9)), precision=8)

    x = run(conv(b.input("data", (n, 3, hw, hw), 8), 3))
    for _ in range(draw(st.integers(1, 3))):
        h = scaled(conv(run(conv(run(conv(x, c, k=1, groups=c)), c)), c), 16)
        x = scaled(b.op("elemwise_add", x, h), 9)
    return b.build(x), draw(tensors((n, 3, hw, hw), 8))


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=preactivation_graphs())
def test_preactivation_blocks_fuse_their_adds_and_scales_exactly(case):
    """Pre-activation blocks (ResNet-20's): in the fused layout each block's Add and its end run go into its
    second convolution (its input, read by the block's scale too, the addend: residual_ends) and each scale into
    its first (in_steps: _input_runs), no standalone Add left; rows and fused equal the reference executor, the
    fused on every products kernel here."""
    graph, data = case
    model = to_onnx(graph, Target())
    served = cpu_layout.fused_convolutions(cpu_layout.channels_last(model))
    blocks = sum(node.op == "elemwise_add" for node in graph.nodes)
    ops = [node.op_type for node in served.graph.node]
    assert ops.count("conv_requantize_add") == blocks and standalone_scales(served) == []
    assert sum(any(a.name == "in_steps" for a in node.attribute) for node in served.graph.node) == blocks
    want = execute(graph, {"data": data})[0]
    assert np.array_equal(session(model, layout="rows").run(None, {"data": data})[0], want)
    for isa in kernels_here():
        assert np.array_equal(fused_here(model, isa).run(None, {"data": data})[0], want), isa


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=scaled_graphs())
def test_fused_convolutions_run_the_standalone_runs_they_read_exactly(case):
    """In the fused layout a standalone channels-last run (a per-channel scale's and its relu) that only a
    convolution of offset 0 reads goes into it (in_steps, in_scales, in_bias: cpu_layout._input_runs): none is
    left, and the model equals the reference executor on every products kernel here."""
    graph, data = case
    model = to_onnx(graph, Target())
    served = cpu_layout.fused_convolutions(cpu_layout.channels_last(model))
    assert standalone_scales(served) == [] and any(a.name == "in_steps" for n in served.graph.node for a in n.attribute)
    want = execute(graph, {"data": data})[0]
    for isa in kernels_here():
        assert np.array_equal(fused_here(model, isa).run(None, {"data": data})[0], want), isa


@pytest.mark.isa
def test_resnet20_fused_runs_its_batch_norm_scales_in_the_convolutions(resnet):
    """ResNet-20's fused layout: every per-channel scale (a pre-activation block's batch norm and relu) runs in
    the convolution reading it (in_steps); batch 1 and a batch split by image equal the reference executor on every
    products kernel here; the route map names the kernel each scale runs in."""
    from cvm_onnx.core.batch import batched
    from cvm_onnx.serving.routes import route_map

    model = to_onnx(resnet, Target())
    served = cpu_layout.fused_convolutions(cpu_layout.channels_last(model))
    assert standalone_scales(served) == []
    assert sum(any(a.name == "in_steps" for a in n.attribute) for n in served.graph.node) >= 7  # (on-chain: 8)
    rows, fused = (route_map(to_onnx(resnet, Target(layout=layout))) for layout in ("rows", "fused"))
    scales = [r.conv for r in rows if r.layout == "per-channel scale"]
    assert all(r.layout != "-" for r in fused) and [r.conv for r in fused if r.layout == "per-channel scale"] == scales
    assert sum(r.kernel == "conv_requantize (in_steps)" for r in fused) == \
        sum(any(a.name == "in_steps" for a in n.attribute) for n in served.graph.node)
    for n in (1, 9):
        data = np.random.default_rng(n).integers(-127, 128, (n, 3, 32, 32)).astype(np.int32)
        graph = batched(resnet, n) if n > 1 else resnet
        want = execute(graph, {"data": data})[0]
        for isa in kernels_here():
            assert np.array_equal(fused_here(to_onnx(graph, Target()), isa).run(None, {"data": data})[0], want), isa


@st.composite
def summed_graphs(draw):
    """A convolution and its run and relu (a rows product kept channels-last), then CVM's sum over drawn axes
    (the global pooling's (2, 3) most often), with or without keepdims; batch 1 to 3, data and weights at the int8
    edges."""
    n, c, h, w = draw(st.integers(1, 3)), draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(st.integers(1, 9))
    b = GraphBuilder()
    weights = b.param("w", draw(tensors((c, 3, 3, 3), 8)), 8)
    y = b.op("conv2d", b.input("data", (n, 3, h, w), 8), weights, channels=c, kernel_size=(3, 3), padding=(1, 1),
             strides=(1, 1), groups=1, use_bias=False)
    y = b.op("relu", b.op("cvm_right_shift", y, shift_bit=draw(st.integers(1, 9)), precision=8))
    axes = draw(st.sampled_from([(2, 3), (2, 3), (3, 2), (1,), (3,), (1, 2, 3)]))
    y = b.op("sum", y, axis=axes, keepdims=draw(st.booleans()))
    return b.build(y), draw(tensors((n, 3, h, w), 8)), axes


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=summed_graphs())
def test_channels_last_sums_positions_by_one_matmul(case):
    """A sum over the positions (axes 2 and 3) of a channels-last tensor is one int32 MatMul of ones (any other sum
    stays a ReduceSum), in the rows and fused layouts equal to the reference executor."""
    graph, data, axes = case
    model = to_onnx(graph, Target())
    sums = [n.op_type for n in cpu_layout.channels_last(model).graph.node if n.op_type in ("ReduceSum", "MatMul")]
    assert sums == ["MatMul" if sorted(axes) == [2, 3] else "ReduceSum"]
    want = execute(graph, {"data": data})[0]
    for layout in ("rows", "fused"):
        got = session(model, layout=layout).run(None, {"data": data})[0]
        assert got.dtype == want.dtype and np.array_equal(got, want), layout


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=2, max_size=4), data=st.data(),
       steps=st.lists(step, min_size=1, max_size=4))
def test_requantize_channels_last_takes_bias_and_scales_per_last_axis(shape, data, steps):
    """nhwc=1: bias and scales per last-axis channel, against the oracle on the transposed data."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.integers(-(1 << 31), 1 << 31, shape, dtype=np.int64).astype(np.int32)
    c = shape[-1]
    bias = rng.integers(-(1 << 31), 1 << 31, c if data.draw(st.booleans()) else 0, dtype=np.int64).astype(np.int32)
    scales = [int(v) for v in rng.integers(-(1 << 31), 1 << 31, c, dtype=np.int64)] if data.draw(st.booleans()) else []
    node = helper.make_node("requantize", ["x", "b"], ["y"], domain=DOMAIN, steps=[v for s in steps for v in s],
                            nhwc=1, **({"scales": scales} if scales else {}))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT32, shape),
                                            helper.make_tensor_value_info("b", TensorProto.INT32, [bias.size])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, shape)])
    model = onnx_model(graph, domains={DOMAIN: 1})
    onnx.checker.check_model(model, full_check=True)
    moved = np.moveaxis(x, -1, 1)  # the oracle takes the channels on axis 1
    want = np.moveaxis(requantize_oracle(moved, bias, steps, scales), 1, -1)
    assert np.array_equal(run(model, {"x": x, "b": bias})[0], want)


def test_im2col_rows_reads_channels_last_data_as_its_nchw_twin():
    x = np.random.default_rng(0).integers(0, 128, (2, 5, 6, 7)).astype(np.int32)
    attrs = dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], offset=0)
    nchw = run(im2col_model("im2col_rows", list(x.shape), **attrs), {"x": x})[0]
    moved = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    assert np.array_equal(run(im2col_model("im2col_rows", list(moved.shape), nhwc=1, **attrs), {"x": moved})[0], nchw)


FUSED = [(3, 1, 0, 3), (0, 3, 1, 0, 3), (3, 1, 0, 3, 1, 0, 3), (0, 3, 1, 0, 3, 1, 0, 3)]  # requantize.h's one-pass runs


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(kinds=st.sampled_from(FUSED), data=st.data(), n=st.integers(1, 3000), nhwc=st.booleans())
def test_requantize_runs_taken_in_one_pass_equal_the_oracle(kinds, data, n, nhwc):
    """The step sequences the kernel applies in one pass (clip, mul, shift, clip, ...), at the int32 edges."""
    steps = []
    for kind in kinds:
        if kind == 0:
            steps.append((0, data.draw(st.integers(1, 31)), 0))
        elif kind == 1:
            steps.append((1, data.draw(st.one_of(int32s, st.sampled_from([0, 1, -1, -(1 << 31)]))), 0))
        else:
            steps.append((3, *sorted(data.draw(st.tuples(int32s, int32s)))))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = rng.integers(-(1 << 31), 1 << 31, (1, 3, n), dtype=np.int64).astype(np.int32)
    x.reshape(-1)[:4] = [0, -1, (1 << 31) - 1, -(1 << 31)][:x.size]
    bias = rng.integers(-(1 << 31), 1 << 31, 3, dtype=np.int64).astype(np.int32)
    if nhwc:
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
        node = helper.make_node("requantize", ["x", "b"], ["y"], domain=DOMAIN, steps=[v for s in steps for v in s],
                                nhwc=1)
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT32, list(x.shape)),
                                                helper.make_tensor_value_info("b", TensorProto.INT32, [3])],
                                  [helper.make_tensor_value_info("y", TensorProto.INT32, list(x.shape))])
        model = onnx_model(graph, domains={DOMAIN: 1})
        want = np.moveaxis(requantize_oracle(np.moveaxis(x, -1, 1), bias, steps), 1, -1)
    else:
        model = requantize_model(list(x.shape), 3, steps)
        want = requantize_oracle(x, bias, steps)
    assert np.array_equal(run(model, {"x": x, "b": bias})[0], want)


# -- conv2d of quantized operands: the halves of u - z, u in [0, 255] ---------------------------------------------

@settings(max_examples=EXAMPLES, deadline=None)
@given(geometry=geometries(), data=st.data(), threads=st.integers(1, 2))
def test_im2col_rows_with_a_zero_point_gathers_u_itself_and_the_zero_point_in_the_padding(geometry, data, threads):
    """With ``zero`` (offset 0) the rows hold u in [0, 255] itself and ``zero`` in the padding."""
    (n, c, h, w), kernel, strides, dilations, pads, _ = geometry
    zero = data.draw(st.sampled_from([0, 1, 127, 128, 254, 255]))
    u = data.draw(tensors((n, c, h, w), 9).map(np.abs))
    model = im2col_model("im2col_rows", u.shape, kernel_shape=kernel, strides=strides, dilations=dilations,
                         pads=pads, offset=0, zero=zero)
    onnx.checker.check_model(model, full_check=True)
    got = session(model, threads=threads).run(None, {"x": u})[0]
    assert np.array_equal(got.astype(np.int64), rows_oracle(u - zero, kernel, strides, dilations, pads, zero))


@pytest.mark.parametrize("value", [-1, 256])
def test_im2col_rows_with_a_zero_point_refuses_values_outside_uint8(value):
    model = im2col_model("im2col_rows", [1, 1, 2, 2], kernel_shape=[1, 1], offset=0, zero=7)
    x = np.array([[[[0, 255], [value, 2]]]], np.int32)
    with pytest.raises(RuntimeFailure, match=rf"data value {value} at flat index 2 is outside \[0, 255\]"):
        run(model, {"x": x})


@pytest.mark.parametrize("attrs", [dict(offset=128, zero=3), dict(offset=0, zero=256), dict(offset=0, zero=-2)])
def test_im2col_rows_refuses_a_zero_point_it_cannot_take(attrs):
    model = im2col_model("im2col_rows", [1, 2, 3, 3], kernel_shape=[1, 1], **attrs)
    with pytest.raises((onnx.checker.ValidationError, onnx.shape_inference.InferenceError), match="zero"):
        onnx.checker.check_model(model, full_check=True)
    with pytest.raises(RuntimeFailure, match="zero"):
        run(model, {"x": np.zeros((1, 2, 3, 3), np.int32)})


def quantized_conv(b, u, c: int, zero: int, w: np.ndarray, bias: np.ndarray | None, op: str = "conv2d", **attrs):
    """conv2d (or dense) of u - zero as the quantized importer writes it (from_onnx's ``products.halves``):
    h = (u - zero) shifted by 1, g = u - zero - h, concatenated, cvm_clip(8), by the weights [w, w]."""
    v = b.op("broadcast_sub", u, b.param(f"z{len(b.nodes)}", np.array([zero]), 9)) if zero else u
    h = b.op("cvm_right_shift", v, shift_bit=1, precision=8)
    x = b.op("cvm_clip", b.op("concatenate", h, b.op("broadcast_sub", v, h), axis=1), precision=8)
    inputs = [x, b.param(f"w{len(b.nodes)}", np.concatenate([w, w], axis=1), 8)]
    if bias is not None:
        inputs.append(b.param(f"b{len(b.nodes)}", bias, 20))
    size = {"channels" if op == "conv2d" else "units": w.shape[0]}
    return b.op(op, *inputs, **size, use_bias=bias is not None, **attrs)


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 70), oc=st.integers(1, 12), top=st.sampled_from([255, 200, 128]),
       zero=st.sampled_from([0, 1, 127, 128, 200, 254, 255]), data=st.data())
def test_dense_of_quantized_operands_takes_u_itself_and_is_exact(n, c, oc, top, zero, data):
    """A dense of the halves of u - zero (the quantized import's last Gemm) takes one MatMulInteger of u itself
    (uint8, zero point ``zero``) and one requantize exactly where the bounds prove ``requantize.Unsigned``'s
    conditions, else its float form; exact against the reference executor (weights and data at the edges)."""
    b = GraphBuilder()
    u = b.op("clip", b.input("data", (n, c), 10), a_min=0, a_max=top)
    bias = data.draw(st.none() | tensors((oc,), 20))
    y = quantized_conv(b, u, c, zero, data.draw(tensors((oc, c), 8)), bias, op="dense")
    y = b.op("cvm_right_shift", y, shift_bit=data.draw(st.integers(1, 12)), precision=16)
    graph = b.build(b.op("clip", y, a_min=0, a_max=255))  # a run of two steps
    model = to_onnx(graph, Target())
    ops = [node.op_type for node in model.graph.node]
    ok = max(zero, top - zero) <= 254
    assert (ops.count("MatMulInteger"), "Gemm" in ops, "Concat" in ops) == ((1, False, False) if ok else (0, True, True))
    x = data.draw(st.one_of(tensors((n, c), 10), st.just(np.full((n, c), top, np.int32))))
    assert np.array_equal(run(model, {"data": x})[0], execute(graph, {"data": x})[0])


@st.composite
def quantized_conv_runs(draw):
    """u = clip(data, 0, U) (U <= 255), a ``quantized_conv`` of u - zero (weights at the int8 edges, a random
    geometry of one group), perhaps + a param per output position, then clip, shift, a multiplier per channel,
    shift, + a zero point, clip to [0, 255]; data at the edges. ``ok``: whether the bounds allow the unsigned
    route (max(zero, U - zero) <= 254)."""
    (n, c, h, w), kernel, strides, dilations, pads, _ = draw(geometries())
    if pads[0] != pads[2] or pads[1] != pads[3]:
        return draw(quantized_conv_runs())
    oc = draw(st.integers(2, 5))
    top = draw(st.sampled_from([255, 255, 200, 128]))
    zero = draw(st.sampled_from([0, 1, 127, 128, 200, 254, 255]))
    b = GraphBuilder()
    u = b.op("clip", b.input("data", (1, c, h, w), 10), a_min=0, a_max=top)
    wv = draw(tensors((oc, c, *kernel), 8))
    bias = draw(st.none() | tensors((oc,), 20))
    y = quantized_conv(b, u, c, zero, wv, bias, kernel_size=kernel, strides=strides, dilation=dilations,
                       padding=pads[:2])
    oh = (h + 2 * pads[0] - dilations[0] * (kernel[0] - 1) - 1) // strides[0] + 1
    ow = (w + 2 * pads[1] - dilations[1] * (kernel[1] - 1) - 1) // strides[1] + 1
    if draw(st.booleans()):
        y = b.op("broadcast_add", y, b.param(f"p{len(b.nodes)}", draw(tensors((oc, oh, ow), 18)), 18))
    y = b.op("clip", y, a_min=-draw(st.integers(0, 1 << 19)), a_max=draw(st.integers(1, 1 << 19)))
    y = b.op("cvm_right_shift", y, shift_bit=draw(st.integers(1, 4)), precision=16)
    muls = draw(st.lists(st.integers(-(1 << 14), 1 << 14), min_size=oc, max_size=oc))
    y = b.op("broadcast_mul", y, b.param(f"m{len(b.nodes)}", np.array(muls).reshape(oc, 1, 1), 16))
    y = b.op("cvm_right_shift", y, shift_bit=draw(st.integers(8, 20)), precision=10)
    y = b.op("broadcast_add", y, b.param(f"q{len(b.nodes)}", np.array([draw(st.integers(0, 255))]), 9))
    graph = b.build(b.op("clip", y, a_min=0, a_max=255))
    data = draw(st.one_of(tensors((n, c, h, w), 10), st.just(np.full((n, c, h, w), top, np.int32)),
                          st.just(np.where(np.arange(n * c * h * w).reshape(n, c, h, w) % 2, top, 0))))
    return graph, data.astype(np.int32), n, max(zero, top - zero) <= 254


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=quantized_conv_runs())
def test_conv_runs_of_quantized_operands_take_u_itself_and_are_exact(case):
    """A conv2d of the halves of u - zero takes integer products of u itself (``requantize.Unsigned``: one
    MatMulInteger of K = C * kh * kw, no Conv) exactly where the bounds prove its conditions, the per-position param
    and the per-channel multiplier inside its native run; exact against the reference executor through every
    operand route this CPU computes exactly (under qemu Haswell uint8 x uint8 for them), batched too."""
    graph, data, n, ok = case
    if n > 1:
        from cvm_onnx.core.batch import batched

        graph = batched(graph, n)
    model = to_onnx(graph, Target())
    ops = [node.op_type for node in model.graph.node]
    zeros = [a.i for node in model.graph.node if node.op_type == "im2col_rows" for a in node.attribute
             if a.name == "zero"]
    assert len(zeros) == ok  # else the conv2d of the halves (2C channels) as any conv2d
    if ok:
        assert ops.count("MatMulInteger") == 1 and ops.count("requantize") == 1  # the multiplier per channel too
        assert {"Conv", "Mul", "Gather", "Concat"}.isdisjoint(ops)
    assert_exact_on_every_route(model, graph, data)


@st.composite
def stacked_quantized_convs(draw):
    """Two 3x3 quantized convolutions of u - zero in a row, each with a run (clip, shift, a multiplier per channel,
    shift, + a zero point, clip to [0, 255]; the zero points in [1, 254]: the unsigned route for both); the first
    run's output read by the second convolution alone, or also the model's output, or also read by a relu; or one
    or two residual blocks after the first (each a convolution's run scaled, + the block's input clipped and
    scaled, shifted, clipped; the first block's end read by the second block's convolution and shortcut)."""
    c, h, w = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 6))
    b = GraphBuilder()
    x = b.op("clip", b.input("data", (1, c, h, w), 10), a_min=0, a_max=255)

    def conv_run(u, c_in: int, oc: int | None = None, scaled: bool = False):
        oc = oc or draw(st.integers(1, 4))
        y = quantized_conv(b, u, c_in, draw(st.sampled_from([1, 127, 128, 254])), draw(tensors((oc, c_in, 3, 3), 8)),
                           draw(st.none() | tensors((oc,), 20)), kernel_size=(3, 3), padding=(1, 1))
        y = b.op("cvm_right_shift", b.op("clip", y, a_min=-(1 << 19), a_max=1 << 19), shift_bit=2, precision=16)
        muls = draw(st.lists(st.integers(-(1 << 14), 1 << 14), min_size=oc, max_size=oc))
        y = b.op("broadcast_mul", y, b.param(f"m{len(b.nodes)}", np.array(muls).reshape(oc, 1, 1), 16))
        y = b.op("cvm_right_shift", y, shift_bit=draw(st.integers(8, 20)), precision=10)
        y = b.op("broadcast_add", y, b.param(f"q{len(b.nodes)}", np.array([draw(st.integers(0, 255))]), 9))
        y = b.op("clip", y, a_min=0, a_max=255)
        if scaled:  # a residual branch at the shortcut's scale
            y = b.op("broadcast_mul", y, b.param(f"s{len(b.nodes)}", np.array([draw(st.integers(1, 1 << 12))]), 14))
        return y, oc

    first, oc = conv_run(x, c)
    other = draw(st.sampled_from(["none", "output", "relu", "residual", "residuals"]))
    blocks = {"residual": 1, "residuals": 2}.get(other, 0)
    if not blocks:
        y, _ = conv_run(first, oc)
    for _ in range(blocks):  # a residual block's end: the shortcut's run +
        short = b.op("broadcast_mul", b.op("cvm_clip", first, precision=9),  # the branch, shifted, clipped
                     b.param(f"short{len(b.nodes)}", np.array([draw(st.integers(1, 1 << 12))]), 14))
        branch, _ = conv_run(first, oc, oc, scaled=True)
        total = b.op("elemwise_add", branch, short)
        first = y = b.op("clip", b.op("cvm_right_shift", total, shift_bit=draw(st.integers(1, 12)), precision=16),
                         a_min=0, a_max=255)
    outs = [y] + ([first] if other == "output" else [b.op("relu", first)] if other == "relu" else [])
    data = draw(st.one_of(tensors((1, c, h, w), 10), st.just(np.full((1, c, h, w), 255, np.int32))))
    return b.build(*outs), data.astype(np.int32), other


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=stacked_quantized_convs())
def test_bytes_between_quantized_convs_and_residual_ends_are_exact(case):
    """channels_last writes the first convolution's requantized values as uint8 (``requantize_uint8``) exactly
    where they are read by the second one's rows alone, and takes a residual block's end (shortcut run, Add, run)
    into the branch's requantize (``requantize_add``, writing bytes where the next block's rows and shortcut alone
    read them); the model equals the reference executor on every route (the
    rows with the passes, and without them the columns)."""
    graph, data, other = case
    model = to_onnx(graph, Target())
    ops = [n.op_type for n in cpu_layout.channels_last(model).graph.node]
    assert ops.count("requantize_uint8") == (other in ("none", "residual", "residuals"))  # read by rows (+ addend)
    assert ops.count("requantize_add") == other.startswith("residual")
    assert ops.count("requantize_add_uint8") == (other == "residuals")  # the first end: read as bytes
    assert_exact_on_every_route(model, graph, data)


def requantize_add_model(shape, per, rows, addend_shape, bytes_in: bool, bytes_out: bool, bias_shape=None,
                         **attrs) -> onnx.ModelProto:
    """One requantize_add (requantize_add_uint8 with ``bytes_out``) of data ``shape`` (N, P, C) with each channel's
    own steps ``per``, ``rows`` (OH, OW) or none, an int32 or (``bytes_in``) uint8 addend of ``addend_shape``, the
    bias (C,) or of ``bias_shape``, and the further attributes (addend_steps, sum_steps; nhwc False: none)."""
    m = channel_steps_model(shape, shape[2], per, rows, attrs.pop("nhwc", True), bias_shape)
    m.graph.node[0].op_type = "requantize_add_uint8" if bytes_out else "requantize_add"
    m.graph.node[0].input.append("a")
    m.graph.node[0].attribute.extend(ints_attrs(**attrs))
    m.graph.input.append(helper.make_tensor_value_info("a", TensorProto.UINT8 if bytes_in else TensorProto.INT32,
                                                       addend_shape))
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.UINT8 if bytes_out else TensorProto.INT32
    return m


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(n=st.integers(1, 2), c=st.sampled_from([1, 3, 16]), positions=st.sampled_from([1, 7, 64]), data=st.data(),
       rows=st.booleans(), threads=st.integers(1, 2), bytes_in=st.booleans(), bytes_out=st.booleans())
def test_requantize_add_is_requantize_then_add_then_a_run(n, c, positions, data, rows, threads, bytes_in, bytes_out):
    """requantize_add(data, bias, addend) = sum_steps(requantize(data, bias) + addend_steps(addend)), the sum
    wrapping in int32, with rows or without, each channel's own steps or one list, the addend int32 or uint8, y
    int32 or (requantize_add_uint8, sum_steps ending with a clip within [0, 255]) uint8; an addend not of y's
    shape, no nhwc, bad steps or (uint8) sum_steps ending otherwise are refused naming the op and the rule."""
    per = [data.draw(st.lists(cpu_step, max_size=4)) for _ in range(c)]
    x, bias = data.draw(tensors((n, positions, c), 32)), data.draw(tensors((c,), 32))
    shape = (n, positions, 1, c) if rows else (n, positions, c)
    addend = data.draw(tensors(shape, 9).map(np.abs).map(lambda a: a.astype(np.uint8)) if bytes_in else
                       tensors(shape, 32))
    sums = data.draw(st.lists(cpu_step, max_size=3)) + [(3, 0, data.draw(st.integers(0, 255)))] * bytes_out
    extra = {"addend_steps": [v for s in data.draw(st.lists(cpu_step, max_size=3)) for v in s],
             "sum_steps": [v for s in sums for v in s]}
    want = requantize_add_oracle(x, bias, per, addend.reshape(n, positions, c), np.reshape(extra["addend_steps"],
                                                                                         (-1, 3)), sums).reshape(shape)
    name = "requantize_add_uint8" if bytes_out else "requantize_add"

    def fused(shape, **attrs) -> onnx.ModelProto:
        return requantize_add_model([n, positions, c], per, [positions, 1] if rows else None, shape, bytes_in,
                                    bytes_out, **{**extra, **attrs})

    got = session(fused(list(shape)), threads=threads).run(None, {"x": x, "b": bias, "a": addend})[0]
    assert got.dtype == (np.uint8 if bytes_out else np.int32) and np.array_equal(got, want)
    bad = [((n, positions + 1, c), {}, "the addend must have y's shape"), (shape, {"nhwc": False}, "needs nhwc 1"),
           (shape, {"addend_steps": [0, 40, 0]}, "addend_steps: step 0")]
    bad += [(shape, {"sum_steps": [3, -1, 255]}, "sum_steps must end with a clip within")] * bytes_out
    for bad_shape, attrs, message in bad:
        with pytest.raises(RuntimeFailure, match=f"{name}: {message}"):
            run(fused(list(bad_shape), **attrs), {"x": x, "b": bias, "a": np.zeros(bad_shape, addend.dtype)})


@pytest.mark.parametrize("shortcut", [(1, 4, 4, 3), (1, 1, 1, 3)])
def test_residual_ends_take_adds_of_one_shape_only(shortcut):
    """cpu_layout.residual_ends fuses Add(requantize, shortcut run) -> run into one requantize_add where both operands have
    one shape, and leaves a broadcasting Add (whose addend is not y-shaped) as it is; either way the values are the
    Add's."""
    def rq(x, out, steps):
        return helper.make_node("requantize", [x, "b0"], [out], domain=DOMAIN, nhwc=1, steps=steps)

    nodes = [rq("a", "r1", [3, -5, 5]), rq("s", "r2", [3, -9, 9, 1, 3, 0]), helper.make_node("Add", ["r1", "r2"], ["t"]),
             rq("t", "y", [0, 1, 0, 3, -4, 4])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", TensorProto.INT32, [1, 4, 4, 3]),
                                           helper.make_tensor_value_info("s", TensorProto.INT32, list(shortcut))],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 4, 4, 3])],
                              [onnx.numpy_helper.from_array(np.zeros(0, np.int32), "b0")])
    model = onnx_model(graph, domains={DOMAIN: 1})
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    cpu_layout.residual_ends(fused.graph, cpu_layout._shapes(model))
    assert [n.op_type for n in fused.graph.node].count("requantize_add") == (shortcut == (1, 4, 4, 3))
    rng = np.random.default_rng(0)
    feeds = {"a": rng.integers(-20, 20, (1, 4, 4, 3)).astype(np.int32),
             "s": rng.integers(-20, 20, shortcut).astype(np.int32)}
    assert np.array_equal(run(fused, feeds)[0], run(model, feeds)[0])


def test_residual_ends_take_a_projection_shortcut_as_the_addend():
    """An Add of two channels-last requantize runs neither of which is a run of steps alone (a block whose shortcut
    is a 1x1 projection), read by a run of steps alone, is one requantize_add: the first run with the second's
    output as its addend (no addend_steps, the second kept); the values are the Add's."""
    def rq(x, out, steps, bias="b0"):
        return helper.make_node("requantize", [x, bias], [out], domain=DOMAIN, nhwc=1, steps=steps)

    nodes = [rq("a", "r1", [3, -50, 50], "b1"), rq("s", "r2", [3, -9, 9, 1, 3, 0], "b1"),
             helper.make_node("Add", ["r1", "r2"], ["t"]), rq("t", "y", [0, 1, 0, 3, -40, 40])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(t, TensorProto.INT32, [1, 4, 4, 3])
                                           for t in ("a", "s")],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 4, 4, 3])],
                              [onnx.numpy_helper.from_array(np.zeros(0, np.int32), "b0"),
                               onnx.numpy_helper.from_array(np.array([5, -7, 1 << 30], np.int32), "b1")])
    model = onnx_model(graph, domains={DOMAIN: 1})
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    cpu_layout.residual_ends(fused.graph, cpu_layout._shapes(model))
    assert [n.op_type for n in fused.graph.node] == ["requantize", "requantize_add"]
    rng = np.random.default_rng(0)
    feeds = {t: rng.integers(-100, 100, (1, 4, 4, 3)).astype(np.int32) for t in ("a", "s")}
    assert np.array_equal(run(fused, feeds)[0], run(model, feeds)[0])


def test_residual_ends_take_a_block_input_read_elsewhere_as_the_addend():
    """An Add of a channels-last requantize run only it reads and a block's input that another node reads too (a
    pre-activation block: its first run reads it, and the Add after its last convolution), read by a run of steps
    alone, is one requantize_add: the run with the block's input as its addend (no addend_steps; the input's run
    kept, its other reader too); the values are the Add's."""
    def rq(x, out, steps):
        return helper.make_node("requantize", [x, "b0"], [out], domain=DOMAIN, nhwc=1, steps=steps)

    nodes = [rq("s", "x", [3, -50, 50]), rq("a", "r1", [3, -9, 9, 1, 3, 0]), rq("x", "other", [1, 5, 0]),
             helper.make_node("Add", ["r1", "x"], ["t"]), rq("t", "y", [0, 1, 0, 3, -40, 40])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(t, TensorProto.INT32, [1, 4, 4, 3])
                                           for t in ("a", "s")],
                              [helper.make_tensor_value_info(t, TensorProto.INT32, [1, 4, 4, 3])
                               for t in ("y", "other")],
                              [onnx.numpy_helper.from_array(np.zeros(0, np.int32), "b0")])
    model = onnx_model(graph, domains={DOMAIN: 1})
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    cpu_layout.residual_ends(fused.graph, cpu_layout._shapes(model))
    assert [n.op_type for n in fused.graph.node] == ["requantize", "requantize", "requantize_add"]
    assert list(fused.graph.node[2].input)[2] == "x"
    rng = np.random.default_rng(0)
    feeds = {t: rng.integers(-100, 100, (1, 4, 4, 3)).astype(np.int32) for t in ("a", "s")}
    want = run(model, feeds)
    assert all(np.array_equal(g, w) for g, w in zip(run(fused, feeds), want, strict=True))


def test_rows_read_uint8_channels_last_data_as_its_int32_twin():
    """im2col_rows of uint8 (N, H, W, C) data (nhwc, a zero) gives the rows of the same values as int32; uint8 data
    without nhwc or a zero is refused, naming the op and the rule."""
    x = np.random.default_rng(0).integers(0, 256, (2, 5, 6, 7))
    attrs = dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], offset=0, zero=9, nhwc=1)
    words = run(im2col_model("im2col_rows", list(x.shape), **attrs), {"x": x.astype(np.int32)})[0]
    assert np.array_equal(run(im2col_model("im2col_rows", list(x.shape), TensorProto.UINT8, **attrs),
                              {"x": x.astype(np.uint8)})[0], words)
    for bad in ({"nhwc": 0}, {"zero": -1}):
        with pytest.raises(RuntimeFailure, match="im2col_rows: uint8 data needs nhwc 1 and a zero"):
            run(im2col_model("im2col_rows", list(x.shape), TensorProto.UINT8, **{**attrs, **bad}),
                {"x": x.astype(np.uint8)})


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(n=st.integers(1, 2), c=st.sampled_from([1, 3, 16, 24]), positions=st.sampled_from([1, 7, 64]), data=st.data(),
       rows=st.booleans(), threads=st.integers(1, 2))
def test_requantize_uint8_writes_the_values_of_requantize_as_bytes(n, c, positions, data, rows, threads):
    """requantize_uint8 (nhwc; every channel's chain ends with a clip within [0, 255]) gives requantize's values as
    uint8, with rows or without, the chains of any kinds or of one sequence of kinds (then narrowed in registers),
    the bias none, (C,) or with rows per position; a chain ending otherwise, or no nhwc, is refused naming the op
    and the rule."""
    ends = [(3, *sorted(data.draw(st.one_of(st.just((0, 255)), st.tuples(st.integers(0, 255), st.integers(0, 255))))))
            for _ in range(c)]
    chains = data.draw(st.one_of(st.lists(st.lists(cpu_step, max_size=4), min_size=c, max_size=c),
                                 chains_of_one_kind_sequence(c)))
    per = [[*p, end] for p, end in zip(chains, ends)]
    x = data.draw(tensors((n, positions, c), data.draw(st.sampled_from([12, 32]))))
    bias = data.draw(st.one_of(st.just(np.zeros(0, np.int32)), tensors((c,), 32),
                               *[tensors((positions, c), 32)] * rows))
    model = channel_steps_model([n, positions, c], c, per, [positions, 1] if rows else None, True, list(bias.shape))
    model.graph.node[0].op_type = "requantize_uint8"
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.UINT8
    got = session(model, threads=threads).run(None, {"x": x, "b": bias})[0]
    assert got.dtype == np.uint8 and np.array_equal(got.reshape(n, positions, c), channels_oracle(x, bias, per))
    per[0][-1] = (3, -1, 255)
    for bad in (channel_steps_model([n, positions, c], c, per, None, True),
                channel_steps_model([n, positions, c], c, [[*p[:-1], e] for p, e in zip(per, ends)], None, False)):
        bad.graph.node[0].op_type = "requantize_uint8"
        bad.graph.output[0].type.tensor_type.elem_type = TensorProto.UINT8
        with pytest.raises(RuntimeFailure, match="requantize_uint8: needs nhwc 1 and every chain ending with a clip"):
            run(bad, {"x": x, "b": np.zeros(c, np.int32)})


def test_the_unsigned_route_needs_equal_weight_halves_and_its_own_nodes():
    """Not taken where the conv2d's two weight halves differ, or where another node reads one of the halves."""
    for case in ("halves", "reader"):
        b = GraphBuilder()
        u = b.op("relu", b.input("data", (1, 2, 4, 4), 9))
        w = np.arange(-18, 18).reshape(2, 2, 3, 3)
        y = quantized_conv(b, u, 2, 128, w, None, kernel_size=(3, 3), padding=(1, 1))
        if case == "halves":
            conv = b.nodes[y.node]
            b.params[b.nodes[conv.inputs[1].node].name][0, 0, 0, 0] += 1
        y = b.op("cvm_right_shift", b.op("cvm_right_shift", y, shift_bit=2, precision=16), shift_bit=2, precision=8)
        if case == "reader":  # the halves' cvm_right_shift read outside them too
            h = next(Entry(i) for i, node in enumerate(b.nodes) if node.op == "cvm_right_shift")
            graph = b.build(y, b.op("relu", h))
        else:
            graph = b.build(y)
        model = to_onnx(graph, Target())
        assert not [a for n in model.graph.node if n.op_type == "im2col_rows" for a in n.attribute if a.name == "zero"]
        data = np.random.default_rng(0).integers(-255, 256, (1, 2, 4, 4)).astype(np.int32)
        assert all(np.array_equal(g, w) for g, w in zip(run(model, {"data": data}), execute(graph, {"data": data})))


def test_rows_with_a_zero_point_stay_uint8_x_uint8_without_unbounded_signed_products():
    """Their uint8 operand reaches 255, so uint8 x int8 pair sums can saturate without VNNI (2 * 255 * 127 >
    2^15): ``signed_operands`` turns their weights int8 only for ``every`` (``cpu.unbounded()``)."""
    b = GraphBuilder()
    u = b.op("relu", b.input("data", (1, 2, 4, 4), 9))
    y = quantized_conv(b, u, 2, 128, np.full((3, 2, 3, 3), 127), None, kernel_size=(3, 3), padding=(1, 1))
    graph = b.build(b.op("cvm_right_shift", b.op("cvm_right_shift", y, shift_bit=2, precision=16), shift_bit=2,
                         precision=8))
    model = to_onnx(graph, Target())
    for unbounded in (False, True):
        signed = cpu_layout.signed_operands(model, every=unbounded)
        casts = [a.i for n in signed.graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"]
        assert (TensorProto.INT8 in casts) == unbounded


# -- requantize with each channel's own steps, and the runs of a convolution's channel groups ---------------------

def ints_attrs(**attrs) -> list[onnx.AttributeProto]:
    return [helper.make_attribute(k, v, attr_type=onnx.AttributeProto.INTS) for k, v in attrs.items()]


def channel_steps_model(shape, channels: int, per, rows=None, nhwc: bool = False, bias_shape=None) -> onnx.ModelProto:
    """One requantize with ``channel_steps`` (``per``: each channel's (kind, a, b) triples); ``rows`` (OH, OW);
    ``nhwc``: the channels on the last axis; the bias (``channels``,) or of ``bias_shape``."""
    node = helper.make_node("requantize", ["x", "b"], ["y"], domain=DOMAIN, **({"rows": rows} if rows else {}),
                            **({"nhwc": 1} if nhwc else {}))
    node.attribute.extend(ints_attrs(channel_counts=[len(p) for p in per],
                                     channel_steps=[v for p in per for s in p for v in s]))
    out = ([shape[0], *rows, shape[2]] if nhwc else [shape[0], shape[2], *rows]) if rows else shape
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT32, shape),
                                            helper.make_tensor_value_info("b", TensorProto.INT32,
                                                                          bias_shape or [channels])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, out)])
    return onnx_model(graph, domains={DOMAIN: 1})


@st.composite
def chains_of_one_kind_sequence(draw, c: int):
    """c channels' own steps (up to 11), all of one sequence of kinds, each step of its kind drawn directly."""
    value = st.one_of(int32s, st.sampled_from([0, 1, -1, -(1 << 31)]))
    of_kind = {0: st.tuples(st.just(0), st.integers(0, 31), st.just(0)), 1: st.tuples(st.just(1), value, st.just(0)),
               2: st.tuples(st.just(2), value, st.just(0)),
               3: st.tuples(int32s, int32s).map(sorted).map(lambda ab: (3, *ab))}
    kinds = draw(st.lists(st.sampled_from([0, 1, 2, 3]), max_size=11))
    return [[draw(of_kind[k]) for k in kinds] for _ in range(c)]


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(n=st.integers(1, 3), c=st.sampled_from([1, 3, 16, 24, 64, 100]), positions=st.sampled_from([1, 5, 64, 97]),
       data=st.data(), layout=st.sampled_from(["rows", "rows nhwc", "nhwc"]),
       bias=st.sampled_from(["none", "channel", "position"]), threads=st.integers(1, 2))
def test_requantize_of_channels_with_one_sequence_of_kinds_is_exact(n, c, positions, data, layout, bias, threads):
    """Channels whose own steps have the same kinds (the serving form's, each chain fused on 16-lane vectors with
    per-lane constants, 64 values at a time, then 16, then one) give channel c of x + bias through channel c's
    steps, the bias none, (C,) or per position (P, C) with rows; for any channel count and position count (chunks
    ending mid-period and where the bias rows wrap); on 1-2 threads."""
    per = data.draw(chains_of_one_kind_sequence(c))
    if bias == "position" and "rows" not in layout:
        bias = "channel"
    b = {"none": np.zeros(0, np.int32), "channel": data.draw(tensors((c,), 32)),
         "position": data.draw(tensors((positions, c), 32))}[bias]
    x = data.draw(tensors((n, positions, c), 32))
    model = channel_steps_model([n, positions, c], b.size, per, [positions, 1] if "rows" in layout else None,
                                "nhwc" in layout, list(b.shape))
    got = session(model, threads=threads).run(None, {"x": x, "b": b})[0]
    want = channels_oracle(x, b, per).transpose(0, 2, 1)  # (N, C, P)
    assert np.array_equal(got.reshape(want.transpose(0, 2, 1).shape if "nhwc" in layout else want.shape),
                          want.transpose(0, 2, 1) if "nhwc" in layout else want)


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(n=st.integers(1, 2), c=st.sampled_from([1, 3, 16, 24, 64]), positions=st.sampled_from([1, 5, 64, 97]),
       data=st.data(), rows=st.booleans(), bias=st.sampled_from(["none", "channel", "position"]),
       bytes_in=st.booleans(), bytes_out=st.booleans(), threads=st.integers(1, 2))
def test_requantize_add_of_channels_with_one_sequence_of_kinds_is_exact(n, c, positions, data, rows, bias, bytes_in,
                                                                         bytes_out, threads):
    """requantize_add[_uint8] whose channels' steps have one sequence of kinds (the serving form's: the bias, each
    channel's chain, the addend's steps, the sum's and the narrowing to bytes in one pass on 16-lane vectors) gives
    sum_steps(channel c's steps(x + bias) + addend_steps(addend)), the sums wrapping in int32, as int32 or bytes; the
    bias none, (C,) or per position (P, C) with rows; any channel and position count; on 1-2 threads."""
    per = data.draw(chains_of_one_kind_sequence(c))
    if bias == "position" and not rows:
        bias = "channel"
    b = {"none": np.zeros(0, np.int32), "channel": data.draw(tensors((c,), 32)),
         "position": data.draw(tensors((positions, c), 32))}[bias]
    x = data.draw(tensors((n, positions, c), data.draw(st.sampled_from([12, 32]))))
    shape = (n, positions, 1, c) if rows else (n, positions, c)
    addend = data.draw(tensors(shape, 9).map(np.abs).map(lambda a: a.astype(np.uint8)) if bytes_in else
                       tensors(shape, data.draw(st.sampled_from([12, 32]))))
    added_steps = data.draw(st.lists(cpu_step, max_size=3))
    sums = data.draw(st.lists(cpu_step, max_size=3)) + [(3, 0, data.draw(st.sampled_from([255, 99])))] * bytes_out
    want = requantize_add_oracle(x, b, per, addend.reshape(n, positions, c), added_steps, sums)
    model = requantize_add_model([n, positions, c], per, [positions, 1] if rows else None, list(shape), bytes_in,
                                 bytes_out, list(b.shape), addend_steps=[v for s in added_steps for v in s],
                                 sum_steps=[v for s in sums for v in s])
    got = session(model, threads=threads).run(None, {"x": x, "b": b, "a": addend})[0]
    assert got.dtype == (np.uint8 if bytes_out else np.int32) and np.array_equal(got.reshape(want.shape), want)


@pytest.mark.isa
@pytest.mark.parametrize("bytes_in, bytes_out", [(False, False), (True, True), (False, True)])
@pytest.mark.parametrize("c", [16, 3])
def test_requantize_add_in_registers_keeps_each_values_own_lanes(bytes_in, bytes_out, c):
    """The serving form's shape of requantize_add (channels of one sequence of kinds, rows, a bias per position;
    with 3 channels, 7 values of each image after the last 16 lanes): values spread over [0, 255], so that any value
    written from another's lanes, or an addend's steps left out, shows."""
    n, positions = 2, 77
    rng = np.random.default_rng(7)
    per = [[(0, 1 + k % 3, 0), (3, -40, 400)] for k in range(c)]
    x = rng.integers(-600, 1200, (n, positions, c)).astype(np.int32)
    b = rng.integers(-50, 50, (positions, c)).astype(np.int32)
    addend = rng.integers(0, 256, (n, positions, 1, c)).astype(np.uint8 if bytes_in else np.int32)
    added_steps, sums = [(1, 3, 0)], [(0, 2, 0), (3, 0, 255)]
    want = requantize_add_oracle(x, b, per, addend.reshape(n, positions, c), added_steps, sums)
    assert len(np.unique(want)) > 100
    model = requantize_add_model([n, positions, c], per, [positions, 1], list(addend.shape), bytes_in, bytes_out,
                                 [positions, c], addend_steps=[v for s in added_steps for v in s],
                                 sum_steps=[v for s in sums for v in s])
    got = run(model, {"x": x, "b": b, "a": addend})[0]
    assert got.dtype == (np.uint8 if bytes_out else np.int32) and np.array_equal(got.reshape(want.shape), want)


@st.composite
def simplifiable_chain(draw, kinds: list[str]):
    """Steps of the given pieces, each of which the CPU kernels may simplify away or merge: "clip" (any, or one
    wider than the values), "clips" (two in a row), "id" (shift 0, multiply by 1 or add 0), "around" (add c,
    clip, add -c, c at the int32 edges too), "shift", "mul"."""
    edge = st.sampled_from([-(1 << 31), (1 << 31) - 1, 0, 1, -1, 255, -255, 121, -121, 1 << 20])
    value = st.one_of(int32s, edge)
    clip = st.tuples(value, value).map(sorted).map(lambda ab: (3, *ab))
    steps = []
    for kind in kinds:
        if kind == "clip":
            steps.append(draw(clip))
        elif kind == "clips":
            steps += [draw(clip), draw(clip)]
        elif kind == "id":
            steps.append(draw(st.sampled_from([(0, 0, 0), (1, 1, 0), (2, 0, 0), (3, -(1 << 31), (1 << 31) - 1)])))
        elif kind == "around":  # c often large: x + c wraps around for some x, unless the range before rules it out
            c = draw(st.one_of(st.sampled_from([(1 << 31) - 1, 1 - (1 << 31), 1 << 30, -(1 << 30)]), value))
            steps += [(2, c, 0), draw(clip), (2, -c, 0) if -c < (1 << 31) else (2, c, 0)]
        elif kind == "shift":
            steps.append((0, draw(st.integers(0, 31)), 0))
        else:
            steps.append((1, draw(value), 0))
    return steps


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(kinds=st.lists(st.sampled_from(["clip", "clips", "id", "around", "shift", "mul"]), min_size=1, max_size=8),
       data=st.data(), c=st.sampled_from([1, 2, 16]), layout=st.sampled_from(["nchw", "nhwc", "rows"]))
def test_requantize_chains_the_kernel_simplifies_stay_exact(kinds, data, c, layout):
    """Steps that leave every value as it is, clips in a row and add c, clip, add -c (which the CPU kernels drop or
    merge where the values' range proves it, each channel's chains kept of one sequence of kinds) give the
    oracle's values, at the int32 edges, for one list and for each channel's own."""
    per = [data.draw(simplifiable_chain(kinds)) for _ in range(c)]
    shape = (2, 37, c) if layout != "nchw" else (2, c, 37)
    x = data.draw(st.one_of(tensors(shape, 32), st.sampled_from([np.full(shape, v, np.int32) for v in
                                                                 (-(1 << 31), (1 << 31) - 1, 0, -121, 134)])))
    nchw = x.transpose(0, 2, 1) if layout != "nchw" else x
    want = np.concatenate([requantize_oracle(nchw[:, k:k + 1], np.zeros(0, np.int32), per[k]) for k in range(c)], 1)
    model = channel_steps_model(list(shape), 0, per, [37, 1] if layout == "rows" else None, layout == "nhwc")
    got = session(model).run(None, {"x": x, "b": np.zeros(0, np.int32)})[0]
    assert np.array_equal(got.reshape(want.transpose(0, 2, 1).shape if layout == "nhwc" else want.shape),
                          want.transpose(0, 2, 1) if layout == "nhwc" else want)
    one = requantize_model(list(nchw.shape), 0, per[0])
    assert np.array_equal(run(one, {"x": nchw, "b": np.zeros(0, np.int32)})[0],
                          requantize_oracle(nchw, np.zeros(0, np.int32), per[0]))


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 6), inner=st.sampled_from([1, 5, 64, 1500]), data=st.data(),
       layout=st.sampled_from(["nchw", "rows", "rows nhwc", "nhwc"]), threads=st.integers(1, 2))
def test_requantize_applies_each_channels_own_steps(n, c, inner, data, layout, threads):
    """Channel c of y is channel c of x + bias[c] through its own steps (int32 wrapping as the oracle), for data
    (N, C, ...), for the rows route's (N, OH * OW, C) written as (N, C, OH, OW) or (N, OH, OW, C), and for data
    (N, ..., C) (nhwc); on 1-2 threads."""
    per = [data.draw(st.lists(cpu_step, max_size=5)) for _ in range(c)]
    bias = data.draw(st.sampled_from([np.zeros(0, np.int32), np.arange(c, dtype=np.int32) * 1000003 - 7]))
    last = layout != "nchw"
    shape = (n, inner, c) if last else (n, c, inner)
    x = data.draw(st.one_of(tensors(shape, 32), st.just(np.full(shape, (1 << 31) - 1, np.int32))))
    model = channel_steps_model(list(shape), len(bias), per, [inner, 1] if "rows" in layout else None,
                                "nhwc" in layout)
    onnx.checker.check_model(model, full_check=True)
    got = session(model, threads=threads).run(None, {"x": x, "b": bias})[0]
    nchw = x.transpose(0, 2, 1) if last else x
    want = np.concatenate([requantize_oracle(nchw[:, k:k + 1], bias[k:k + 1], per[k]) for k in range(c)], axis=1)
    if "nhwc" in layout:
        want = want.transpose(0, 2, 1)
    assert np.array_equal(got.reshape(want.shape), want)


@pytest.mark.parametrize("attrs, message", [
    (dict(channel_counts=[1], channel_steps=[0, 1]), "count the triples"),
    (dict(channel_counts=[1, 1], channel_steps=[0, 1, 0]), "count the triples"),
    (dict(channel_counts=[1, 0], channel_steps=[0, 40, 0]), "channel 0"),
    (dict(channel_counts=[0, 0], channel_steps=[], steps=[3, 0, 1]), "without steps"),
    (dict(channel_counts=[0, 0], channel_steps=[], width=2), "width"),
    (dict(channel_counts=[0, 0, 0], channel_steps=[]), "match axis 1")])
def test_requantize_refuses_channel_steps_it_cannot_take(attrs, message):
    node = helper.make_node("requantize", ["x", "b"], ["y"], domain=DOMAIN)
    node.attribute.extend(ints_attrs(**{k: v for k, v in attrs.items() if k != "width"}))
    node.attribute.extend([helper.make_attribute("width", attrs["width"])] if "width" in attrs else [])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT32, [1, 2, 3]),
                                            helper.make_tensor_value_info("b", TensorProto.INT32, [0])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 2, 3])])
    with pytest.raises(RuntimeFailure, match=message):
        run(onnx_model(graph, domains={DOMAIN: 1}), {"x": np.zeros((1, 2, 3), np.int32), "b": np.zeros(0, np.int32)})


@st.composite
def channel_group_runs(draw):
    """A conv2d (of u - zero's halves, or of x >= 0 or any x), perhaps + a param per position, its channels taken
    in groups (a random partition), each group its own run (clip, perhaps a shift, a multiplier per channel or one
    for the group, shift), the runs concatenated in a random order and taken back into channel order (``exact``:
    the right inverse, a channel taken twice picked from either group; else a wrong one), then clip. ``kind``:
    "unsigned", "nonneg" or "any"."""
    oc = draw(st.integers(2, 7))
    c, h, w = draw(st.integers(1, 3)), draw(st.integers(3, 7)), draw(st.integers(3, 7))
    kind = draw(st.sampled_from(["unsigned", "nonneg", "any"]))
    b = GraphBuilder()
    data = b.input("data", (1, c, h, w), 9 if kind == "unsigned" else 8)
    wv = draw(tensors((oc, c, 3, 3), 8))
    bias = draw(st.none() | tensors((oc,), 16))
    if kind == "unsigned":
        y = quantized_conv(b, b.op("relu", data), c, 128, wv, bias, kernel_size=(3, 3), padding=(1, 1))
    else:
        x = b.op("relu", data) if kind == "nonneg" else data
        inputs = [x, b.param("w", wv, 8)] + ([] if bias is None else [b.param("bias", bias, 16)])
        y = b.op("conv2d", *inputs, channels=oc, kernel_size=(3, 3), padding=(1, 1), use_bias=bias is not None)
    if draw(st.booleans()):
        y = b.op("broadcast_add", y, b.param("offset", draw(tensors((oc, h, w), 12)), 12))
    order = draw(st.permutations(range(oc)))
    cuts = sorted(draw(st.sets(st.integers(1, oc - 1), max_size=oc - 1)))
    groups = [order[lo:hi] for lo, hi in zip([0, *cuts], [*cuts, oc])]
    if len(groups) > 1 and draw(st.booleans()):  # a channel taken twice, by two groups with different runs
        groups[0] = [*groups[0], groups[1][0]]
    outs = []
    for k, g in enumerate(groups):
        v = b.op("take", y, b.param(f"idx{k}", np.array(g), 8), axis=1)
        v = b.op("clip", v, a_min=-draw(st.integers(1, 1 << 20)), a_max=draw(st.integers(1, 1 << 20)))
        if draw(st.booleans()):
            v = b.op("cvm_right_shift", v, shift_bit=draw(st.integers(1, 3)), precision=16)
        else:
            v = b.op("cvm_clip", v, precision=16)
        m = draw(st.lists(st.integers(-(1 << 14), 1 << 14), min_size=len(g), max_size=len(g)))
        mul = np.array(m).reshape(-1, 1, 1) if draw(st.booleans()) else np.array(m[:1])
        v = b.op("broadcast_mul", v, b.param(f"m{k}", mul, 16))
        outs.append(b.op("cvm_right_shift", v, shift_bit=draw(st.integers(6, 20)), precision=9))
    at = draw(st.permutations(range(len(groups))))
    concat_order = np.concatenate([groups[k] for k in at])
    back = np.array([draw(st.sampled_from(np.flatnonzero(concat_order == ch).tolist())) for ch in range(oc)])
    exact = draw(st.integers(0, 4)) > 0
    if not exact:
        back = np.roll(back, 1)
    y = b.op("take", b.op("concatenate", *[outs[k] for k in at], axis=1), b.param("back", back, 8), axis=1)
    graph = b.build(b.op("clip", y, a_min=0, a_max=255))
    x = draw(tensors((1, c, h, w), 9 if kind == "unsigned" else 8))
    return graph, x, bool(np.array_equal(concat_order[back], np.arange(oc))), len(groups)


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=channel_group_runs())
def test_the_runs_of_a_convolutions_channel_groups_are_one_requantize_and_exact(case):
    """Where the concatenated runs are taken back into channel order the convolution is one integer product and
    one requantize with each channel's own steps (no take, concatenate or Conv left), else the runs stay as they
    are; exact against the reference executor through every operand route this CPU computes exactly, as rows and
    as columns."""
    graph, data, merged, groups = case
    model = to_onnx(graph, Target())
    ops = [n.op_type for n in model.graph.node]
    own = [n for n in model.graph.node if any(a.name == "channel_counts" for a in n.attribute)]
    assert {"Gather", "Concat"}.isdisjoint(ops) == merged
    if merged:
        assert ops.count("MatMulInteger") == 1 and "Conv" not in ops and len(own) == 1
    assert_exact_on_every_route(model, graph, data)


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(n=st.integers(1, 3), oh=st.integers(1, 9), ow=st.integers(1, 40), c=st.integers(1, 9), data=st.data(),
       nhwc=st.booleans(), threads=st.integers(1, 2))
def test_requantize_of_rows_adds_a_bias_per_position_and_channel(n, oh, ow, c, data, nhwc, threads):
    """With rows (OH, OW) a bias (OH * OW, C) is added per position and channel (wrapping in int32) before the
    steps, written as (N, C, OH, OW) or with nhwc (N, OH, OW, C)."""
    steps = data.draw(st.lists(step, max_size=4))
    x = data.draw(tensors((n, oh * ow, c), 32))
    bias = data.draw(tensors((oh * ow, c), 32))
    node = helper.make_node("requantize", ["x", "b"], ["y"], domain=DOMAIN, rows=[oh, ow], nhwc=int(nhwc))
    node.attribute.extend(ints_attrs(steps=[v for s in steps for v in s]))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT32, [n, oh * ow, c]),
                                            helper.make_tensor_value_info("b", TensorProto.INT32, [oh * ow, c])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32,
                                                             [n, oh, ow, c] if nhwc else [n, c, oh, ow])])
    model = onnx_model(graph, domains={DOMAIN: 1})
    onnx.checker.check_model(model, full_check=True)
    got = session(model, threads=threads).run(None, {"x": x, "b": bias})[0]
    summed = wrap32(x.astype(np.int64) + bias)  # (N, P, C)
    want = requantize_oracle(summed.transpose(0, 2, 1), np.zeros(0, np.int32), steps).reshape(n, c, oh, ow)
    assert np.array_equal(got, want.transpose(0, 2, 3, 1) if nhwc else want)
