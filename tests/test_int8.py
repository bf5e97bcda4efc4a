"""The serving form's native kernels: the im2col ops and requantize (against numpy oracles, and their input
checks), conv2d runs started from MatMulInteger (exact against the reference executor for every operand route this CPU
computes exactly), and the choice of operand types (cvm_onnx.native.cpu)."""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from support import tensors
from support.native import (geometries, im2col_model, im2col_oracle, int32s, requantize_model, requantize_oracle,
                            step)

from cvm_onnx.app.cli import main
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import RuntimeFailure
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format import write_model
from cvm_onnx.native import DOMAIN, cpu, library_path
from cvm_onnx.runtime.sessions import run, session

EXAMPLES = int(os.environ.get("CVM_ONNX_EXAMPLES", "60"))  # fewer under qemu (.ci/run)
pytestmark = pytest.mark.skipif(library_path() is None, reason="the native custom-op library was not built")


def routes() -> list[str]:
    """The operand routes this CPU computes exactly: uint8 x uint8 always, uint8 x int8 where ``cpu`` says so."""
    return ["u8u8"] + (["u8s8"] if cpu.products() == "u8s8" else [])


def run_route(model: onnx.ModelProto, feeds: dict, route: str) -> list[np.ndarray]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu, "products", lambda: route)
        return run(model, feeds)


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
    Haswell: uint8 x uint8 only), batched too."""
    graph, data, n = case
    if n > 1:
        from cvm_onnx.core.batch import batched

        graph = batched(graph, n)
    model = to_onnx(graph, optimize=True, int8=True)
    conv = next(node for node in graph.nodes if node.op == "conv2d")
    channelwise = conv.attrs["kernel_size"] == (1, 1) and conv.attrs["groups"] == data.shape[1] == \
        conv.attrs["channels"] and conv.attrs["strides"] == (1, 1) and conv.attrs["padding"] == (0, 0)
    ops = [node.op_type for node in model.graph.node]
    scaled = [node for node in model.graph.node if any(a.name == "scales" for a in node.attribute)]
    assert (ops.count("MatMulInteger"), len(scaled)) == ((0, 1) if channelwise else (1, 0))
    want = execute(graph, {"data": data})
    for route in routes():
        got = run_route(model, {"data": data}, route)
        assert all(np.array_equal(g, w) for g, w in zip(got, want)), route


@pytest.mark.isa
def test_the_chosen_route_is_exact_on_this_cpu():
    """``cpu.products`` picks uint8 x int8 only with VNNI/AMX and an exact probe (so never under qemu Haswell),
    and the probe's operands (int16 pair sums that saturate) are exact through the route it picks."""
    if cpu.products() == "u8s8":
        assert cpu.EXACT_SIGNED & set(cpu.features()) and cpu._probe_exact()
    else:
        assert not cpu.EXACT_SIGNED & set(cpu.features()) or not cpu._probe_exact()
    b = GraphBuilder()
    x = b.input("data", (1, 64, 1, 1), 8)
    w = b.param("w", np.full((8, 64, 1, 1), 127), 8)  # the left operand w + 128 = 255
    y = b.op("cvm_right_shift", b.op("conv2d", x, w, channels=8, kernel_size=(1, 1), use_bias=False),
             shift_bit=1, precision=32)
    graph = b.build(b.op("clip", y, a_min=-(1 << 20), a_max=1 << 20))
    data = np.where(np.arange(64) % 4 < 2, 127, -127).reshape(1, 64, 1, 1).astype(np.int32)  # 2 * 255 * 127 > 2^15
    model = to_onnx(graph, optimize=True, int8=True)
    assert "MatMulInteger" in {n.op_type for n in model.graph.node}
    assert np.array_equal(run(model, {"data": data})[0], execute(graph, {"data": data})[0])


def test_signed_columns_rewrites_only_matmul_operands():
    b = GraphBuilder()
    x = b.input("data", (1, 2, 4, 4), 8)
    w = b.param("w", np.ones((3, 2, 3, 3), np.int32), 8)
    y = b.op("cvm_right_shift", b.op("conv2d", x, w, channels=3, kernel_size=(3, 3), use_bias=False),
             shift_bit=2, precision=8)
    model = to_onnx(b.build(b.op("relu", y)), optimize=True, int8=True)
    signed = cpu.signed_columns(model)
    ops = {n.op_type: n for n in signed.graph.node}
    assert "im2col_int8" in ops and "im2col_uint8" not in ops and len(ops["MatMulInteger"].input) == 3
    assert "im2col_uint8" in {n.op_type for n in model.graph.node}  # the exported model is left as it was
    # an im2col that is also a graph output keeps its type
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    cols = next(n for n in exposed.graph.node if n.op_type == "im2col_uint8").output[0]
    exposed.graph.output.add().CopyFrom(helper.make_tensor_value_info(cols, TensorProto.UINT8, [None] * 4))
    assert "im2col_uint8" in {n.op_type for n in cpu.signed_columns(exposed).graph.node}


def test_without_the_native_library_the_integer_form_is_refused_with_one_error():
    b = GraphBuilder()
    x = b.input("data", (1, 1, 3, 3), 8)
    y = b.op("cvm_right_shift", b.op("conv2d", x, b.param("w", np.ones((1, 1, 3, 3)), 8), channels=1,
                                     kernel_size=(3, 3), padding=(1, 1), use_bias=False), shift_bit=1, precision=8)
    graph = b.build(b.op("relu", y))
    model = to_onnx(graph, optimize=True, int8=True)
    with pytest.raises(RuntimeFailure, match="native im2col and requantize kernels.*int8=False"):
        session(model, native=False)
    assert "MatMulInteger" in {n.op_type for n in model.graph.node}
    assert "MatMulInteger" not in {n.op_type for n in to_onnx(graph, optimize=True, int8=False).graph.node}


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
        ops = {node.op_type for node in to_onnx(batched(graph, n), optimize=True, int8=True).graph.node}
        assert route in ops and not ({"MatMulInteger", "Conv"} - {route}) & ops


def test_a_library_without_the_feature_probe_means_no_signed_products(monkeypatch, tmp_path):
    """A library that does not load (or lacks ``cvm_onnx_cpu_features``) reports no features, so the exported
    uint8 x uint8 products stay."""
    monkeypatch.setattr(cpu, "library_path", lambda: str(tmp_path / "missing.so"))
    cpu.features.cache_clear()
    cpu.products.cache_clear()
    try:
        assert cpu.features() == () and cpu.products() == "u8u8"
    finally:
        cpu.features.cache_clear()
        cpu.products.cache_clear()


# -- the native requantize op -----------------------------------------------------------------------------------

@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data(),
       steps=st.lists(step, min_size=1, max_size=6))
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
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)],
                              ir_version=10)
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
    graph = b.build(b.op("elemwise_add", requantized(twice), requantized(twice)))
    routes = lambda m: json.loads({p.key: p.value for p in m.metadata_props}["cvm.routes"])  # noqa: E731
    assert routes(to_onnx(graph, optimize=True, int8=True)) == [
        ["int", "integer products", ""], ["scale", "per-channel scale", ""],
        ["big", "float32/int32 products", "its windows, 450 bytes, exceed the cost model's 400 bytes a call"],
        ["twice", "float32/int32 products", "its output is not read by one requantization run alone"]]
    assert {r[2] for r in routes(to_onnx(graph, optimize=True, int8=False))} == {
        "integer products are off (no native library, or int8=False)"}
    write_model(graph, tmp_path / "m")
    assert main(["convert", str(tmp_path / "m"), "-o", str(tmp_path / "m.onnx"), "--optimize", "--report",
                 str(tmp_path / "r.md")]) == 0
    report = (tmp_path / "r.md").read_text()
    assert "| twice | float32/int32 products | its output is not read by one requantization run alone |" in report
    assert "convolutions: 1 integer products, 1 per-channel scale, 2 float32/int32 products" in report


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
        assert np.array_equal(run_route(to_onnx(graph, optimize=True, int8=True), {"data": data}, route)[0],
                              want[0]), route


@pytest.mark.isa
def test_a_session_takes_the_products_route_asked_for_only_where_exact():
    """``products="u8u8"`` anywhere (exact at the int8 edges); "u8s8" only where ``cpu.products()`` says it is
    exact (under qemu Haswell it is refused); anything else refused."""
    b = GraphBuilder()
    x = b.input("data", (1, 2, 4, 4), 8)
    y = b.op("conv2d", x, b.param("w", np.full((2, 2, 3, 3), -127), 8), channels=2, kernel_size=(3, 3),
             padding=(1, 1), use_bias=False)
    graph = b.build(b.op("relu", b.op("cvm_right_shift", y, shift_bit=4, precision=8)))
    model = to_onnx(graph, optimize=True, int8=True)
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
    model = to_onnx(graph, optimize=True, int8=True)
    routes = json.loads({p.key: p.value for p in model.metadata_props}["cvm.routes"])
    assert routes == [["wide_sum", "float32/int32 products",
                       "its windows, 1,100 bytes, exceed the cost model's 400 bytes a call"]]
    data = np.full((1, 1100, 1, 1), 127, np.int32)
    assert np.array_equal(run(model, {"data": data})[0], execute(graph, {"data": data})[0])
