"""What a twelfth corpus (models shipped in wheels) met in quantize. invisible-watermark's RivaGAN encoder and
decoder are video models run on one frame: 3-D Convs of (N, C, 1, H, W) by (1, 11, 11) kernels ('Conv on a 3-D
image: only 1-D and 2-D have a CVM form'). An axis of one value, one tap and no padding has one output, so such a
Conv (or MaxPool) is the 2-D one over the other axes. The encoder also concatenates an empty slice
(torch.cat([a[:, :n] * d, a[:, n:]]) with n the whole axis): 'the slice of (1, 32, 1, 128, 128) is empty: CVM has
no empty tensors'. An empty slice is an empty constant now, which a Concat drops; any other node that reads one is
refused naming it."""
from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import qdq
from support.shipped import shipped
from test_import_exact_forms import exact, model
from test_quantized_fresh_ops import draw_x, oracle_equal, run

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.verify import verify

SETTINGS = settings(max_examples=12, deadline=None)


def windows(x, begin, end, kernel, strides, dilations, fill=0):
    """(kernel position, the input's values it reads at every output position) of an N-D window op, the input padded
    with ``fill``."""
    x = np.pad(x.astype(np.int64), [(0, 0), (0, 0)] + list(zip(begin, end)), constant_values=fill)
    out = [(size - d * (k - 1) - 1) // s + 1 for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations)]
    for tap in itertools.product(*(range(k) for k in kernel)):
        yield tap, x[(slice(None), slice(None)) + tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                                                       for t, d, s, o in zip(tap, dilations, strides, out))]


def conv_nd(x, w, begin, end, strides, dilations, group):
    """The ONNX Conv of integers by its definition, any number of spatial axes: each kernel position's window of
    the zero-padded input times its weights, summed, per group."""
    m, cg = w.shape[:2]
    y = 0
    for tap, part in windows(x, begin, end, w.shape[2:], strides, dilations):
        y = y + np.concatenate([np.einsum("nc...,mc->nm...", part[:, g * cg:(g + 1) * cg],
                                          w[g * (m // group):(g + 1) * (m // group)][(...,) + tap].astype(np.int64))
                                for g in range(group)], axis=1)
    return y


def max_pool_nd(x, kernel, begin, end, strides, dilations):
    """The ONNX MaxPool (ceil_mode 0) by its definition: the max of each window, the padding never winning."""
    return np.max([part for _, part in windows(x, begin, end, kernel, strides, dilations, -(1 << 62))], axis=0)


def geometry(d, single: int):
    """(input spatial shape, kernel, pads begin, end, strides, dilations) of a 3-D Conv whose spatial axis ``single``
    has one value, one tap and no padding."""
    shape, kernel, begin, end, strides, dilations = [], [], [], [], [], []
    for axis in range(3):
        if axis == single:
            shape.append(1), kernel.append(1), begin.append(0), end.append(0)
            strides.append(d.draw(st.integers(1, 3))), dilations.append(d.draw(st.integers(1, 3)))
            continue
        k, dil = d.draw(st.integers(1, 3)), d.draw(st.integers(1, 2))
        shape.append(d.draw(st.integers(dil * (k - 1) + 1, 7))), kernel.append(k), dilations.append(dil)
        begin.append(d.draw(st.integers(0, k - 1))), end.append(d.draw(st.integers(0, k - 1)))
        strides.append(d.draw(st.integers(1, 2)))
    return shape, kernel, begin, end, strides, dilations


@SETTINGS
@given(d=st.data(), single=st.integers(0, 2), group=st.sampled_from([1, 2]), extremes=st.booleans())
def test_a_conv_of_a_3d_image_with_an_axis_of_one_value_is_exact(d, single, group, extremes):
    """ConvInteger of an (N, C, D, H, W) image, one spatial axis of one value, one tap, no padding (any stride and
    dilation there), the others drawn, values within CVM's 8 bits (|v| <= 127): the definition's sums
    (``conv_nd``), on the reference executor and on onnxruntime. Regression: 'Conv on a 3-D image: only 1-D and
    2-D have a CVM form'."""
    shape, kernel, begin, end, strides, dilations = geometry(d, single)
    c, m = 2 * group, 2 * group
    x = np.full((1, c, *shape), d.draw(st.sampled_from([-127, 127])), np.int8) if extremes else \
        np.clip(draw_x(d, (1, c, *shape), T.INT8), -127, 127).astype(np.int8)
    w = np.clip(draw_x(d, (m, c // group, *kernel), T.INT8), -127, 127).astype(np.int8)
    if extremes:
        w[:] = -127
    m_ = model("ConvInteger", ["x", "w"], x.shape, T.INT8, {"w": w}, opset=10, out_type=T.INT32,
               pads=begin + end, strides=strides, dilations=dilations, group=group, kernel_shape=kernel)
    exact(m_, x, conv_nd(x, w, begin, end, strides, dilations, group), 8)


@SETTINGS
@given(d=st.data(), single=st.integers(0, 2))
def test_a_max_pool_of_a_3d_image_with_an_axis_of_one_value_is_exact(d, single):
    """MaxPool of an int8 (N, C, D, H, W) image, one spatial axis of one value, one tap and no padding, the others
    drawn: the definition's maxima (``max_pool_nd``), on the reference executor and on onnxruntime. Regression:
    'MaxPool on a 3-D image: only 1-D and 2-D have a CVM form'."""
    shape, kernel, begin, end, strides, dilations = geometry(d, single)
    x = draw_x(d, (1, 2, *shape), T.INT8).astype(np.int8)
    m = model("MaxPool", ["x"], x.shape, T.INT8, opset=12, kernel_shape=kernel, pads=begin + end, strides=strides,
              dilations=dilations)
    exact(m, x, max_pool_nd(x, kernel, begin, end, strides, dilations), 9)  # 9 bits hold int8's -128


def dq_conv(x_shape, w: np.ndarray, attrs: dict, per_channel: bool, sw=None) -> onnx.ModelProto:
    """DequantizeLinear(x) -> Conv(DequantizeLinear(w), bias) -> QuantizeLinear: a QDQ model's Conv (weight scales
    ``sw`` where given)."""
    m = len(w)
    if sw is None:
        sw = np.linspace(0.01, 0.03, m).astype(np.float32) if per_channel else np.float32(0.02)
    inits = {"s": np.float32(0.05), "z": np.int8(3), "w8": w, "sw": sw, "zw": np.zeros(sw.shape, np.int8),
             "b": (np.arange(m) * 7 - 9).astype(np.int32), "sb": (np.float32(0.05) * sw).astype(np.float32),
             "so": np.float32(0.37), "zo": np.int8(-4)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("DequantizeLinear", ["w8", "sw", "zw"], ["wf"], axis=0),
             h.make_node("DequantizeLinear", ["b", "sb"], ["bf"], axis=0),
             h.make_node("Conv", ["xf", "wf", "bf"], ["r"], name="conv", **attrs),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    return qdq(nodes, x_shape, T.INT8, inits, T.INT8)


@SETTINGS
@given(d=st.data(), single=st.integers(0, 2), per_channel=st.booleans())
def test_a_quantized_conv_of_a_3d_image_with_an_axis_of_one_value_is_its_2d_conv(d, single, per_channel):
    """A QDQ Conv of a 3-D image, one axis of one value, one tap and no padding: the import of its 2-D twin (that
    axis dropped from the input, the weight and the attributes), whose every output is the oracle's of
    docs/import.md; the export exact."""
    shape, kernel, begin, end, strides, dilations = geometry(d, single)
    x = draw_x(d, (1, 3, *shape), T.INT8)
    w = draw_x(d, (4, 3, *kernel), T.INT8).astype(np.int8)
    keep = [a for a in range(3) if a != single]
    twin = {"pads": [begin[a] for a in keep] + [end[a] for a in keep], "strides": [strides[a] for a in keep],
            "dilations": [dilations[a] for a in keep]}
    m3 = dq_conv(x.shape, w, {"pads": begin + end, "strides": strides, "dilations": dilations}, per_channel)
    x2 = x.reshape((1, 3) + tuple(shape[a] for a in keep))
    m2 = dq_conv(x2.shape, w.reshape((4, 3) + tuple(kernel[a] for a in keep)), twin, per_channel)
    _, [got] = run(m3, x)
    _, [want] = run(m2, x2)
    assert got.shape[2 + single] == 1 and np.array_equal(got.reshape(want.shape), want)
    oracle_equal(m2, x2)


@pytest.mark.parametrize("two_part", [True, False])
def test_a_quantized_conv_of_one_frame_requantized_in_runs_of_channels_is_its_2d_conv(two_part):
    """Weights per channel over 5 decades of scale, so the QuantizeLinear requantizes the channels in runs of their
    own plans (one-part products): the 3-D Conv's import gives its 2-D twin's integers. Regression: 'cannot reshape
    array of size 20 into shape (32,1,1,1)' (the runs read the channel axis from the scale's first axis)."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (32, 3, 1, 3, 3)).astype(np.int8)
    sw = (10.0 ** np.linspace(-5, 0, 32)).astype(np.float32)
    x = rng.integers(-128, 128, (1, 3, 1, 8, 8))
    def imported(w_, x_, pads):
        m = dq_conv(x_.shape, w_, {"pads": pads}, True, sw)
        return execute(import_model(m, two_part=two_part).graph, {"data": x_.astype(np.int32)})[0]

    want = imported(w[:, :, 0], x[:, :, 0], [1, 1, 1, 1])
    assert np.array_equal(imported(w, x, [0, 1, 1, 0, 1, 1]).reshape(want.shape), want)


def sliced(start: int, then: str) -> onnx.ModelProto:
    """DequantizeLinear(x (1, 4, 3)) -> Slice of channels [start:] -> ``then`` -> QuantizeLinear: "Concat" joins
    the slice to x (torch.cat([x, a[:, n:]]); another op reads the slice itself."""
    inits = {"s": np.float32(0.05), "z": np.int8(0), "st": np.array([start], np.int64),
             "en": np.array([1 << 62], np.int64), "ax": np.array([1], np.int64)}
    attrs = {"MaxPool": {"kernel_shape": [1]}}.get(then, {})
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Slice", ["xf", "st", "en", "ax"], ["part"], name="tail"),
             h.make_node(then, ["xf", "part"] if then == "Concat" else ["part"], ["r"], name="op",
                         **({"axis": 1} if then == "Concat" else attrs)),
             h.make_node("QuantizeLinear", ["r", "s", "z"], ["y"], name="q")]
    return qdq(nodes, (1, 4, 3), T.INT8, inits, T.INT8)


@pytest.mark.parametrize("start", [4, 9, 2])
def test_an_empty_slice_concatenated_is_dropped(start):
    """A Concat of x and x's channels [start:]: x itself where that slice is empty (start past the 4 channels), x
    and its last channels otherwise. Regression: 'the slice of (1, 4, 3) is empty: CVM has no empty tensors'."""
    x = np.arange(-6, 6, dtype=np.int64).reshape(1, 4, 3) * 9
    _, [got] = run(sliced(start, "Concat"), x)
    assert np.array_equal(got, np.concatenate([x, x[:, start:]], axis=1))


@pytest.mark.parametrize("reader", ["Identity", "Relu", "Softmax", "MaxPool", "ReduceMax"])
def test_an_empty_slice_read_by_anything_but_a_concat_is_refused_naming_the_node(reader):
    """An empty slice read by anything but a Concat: one line naming the reader, CVM has no empty tensors (never an
    error of numpy's on the empty array, as the Softmax's and the MaxPool's were)."""
    with pytest.raises(UnsupportedError) as e:
        import_model(sliced(4, reader))
    [p] = e.value.problems
    assert p.where == f"op ({reader})" and "'part' is an empty slice: CVM has no empty tensors" in p.rule, p


def watermark_model(encoder: bool) -> onnx.ModelProto:
    """A RivaGAN-like float model on one frame (1, 3, 1, 16, 16): 3-D Convs by (1, 5, 5) kernels, Tanh,
    BatchNormalization, a Softmax over the channels (Transpose, Softmax, Transpose) as attention. The decoder's
    attention weighs its features, averaged per channel (32 values); the encoder's weighs 4 data bits, joined with
    the empty rest of its channels ([4:]), summed and concatenated to the frame, a residual added back."""
    rng = np.random.default_rng(3)
    inits = {"w1": rng.normal(0, 0.2, (4, 3, 1, 5, 5)), "w2": rng.normal(0, 0.2, (4, 4, 1, 5, 5)),
             "g": rng.uniform(0.5, 1.5, 4), "b": rng.normal(0, 0.1, 4), "mu": rng.normal(0, 0.1, 4),
             "var": rng.uniform(0.5, 1.5, 4), "w3": rng.normal(0, 0.2, (4, 4, 1, 5, 5)),
             "w4": rng.normal(0, 0.2, (3, 4, 1, 5, 5)), "st": np.array([4], np.int64), "en": np.array([8], np.int64),
             "ax": np.array([1], np.int64), "shape": np.array([1, 4, 1, 1, 1], np.int64), "k": np.float32(0.02)}
    pads = {"pads": [0, 2, 2, 0, 2, 2]}
    nodes = [h.make_node("Conv", ["frame", "w1"], ["c1"], **pads), h.make_node("Tanh", ["c1"], ["t1"]),
             h.make_node("BatchNormalization", ["t1", "g", "b", "mu", "var"], ["n1"]),
             h.make_node("Conv", ["n1", "w2"], ["c2"], **pads),
             h.make_node("Transpose", ["c2"], ["p"], perm=[0, 4, 2, 3, 1]),
             h.make_node("Softmax", ["p"], ["sp"], axis=4),
             h.make_node("Transpose", ["sp"], ["att"], perm=[0, 4, 2, 3, 1])]
    if encoder:
        nodes += [h.make_node("Reshape", ["data", "shape"], ["bits"]), h.make_node("Mul", ["att", "bits"], ["wd"]),
                  h.make_node("Slice", ["att", "st", "en", "ax"], ["rest"]),
                  h.make_node("Concat", ["wd", "rest"], ["all"], axis=1),
                  h.make_node("ReduceSum", ["all"], ["sum"], axes=[1], keepdims=1),
                  h.make_node("Concat", ["frame", "sum"], ["fs"], axis=1),
                  h.make_node("Conv", ["fs", "w3"], ["c3"], **pads), h.make_node("Tanh", ["c3"], ["t3"]),
                  h.make_node("Conv", ["t3", "w4"], ["c4"], **pads), h.make_node("Tanh", ["c4"], ["t4"]),
                  h.make_node("Mul", ["t4", "k"], ["r"]), h.make_node("Add", ["frame", "r"], ["y"])]
    else:
        nodes += [h.make_node("Conv", ["n1", "w3"], ["c3"], **pads),
                  h.make_node("Mul", ["c3", "att"], ["wf"]),
                  h.make_node("ReduceMean", ["wf"], ["y"], axes=[2, 3, 4], keepdims=0)]
    inputs = [h.make_tensor_value_info("frame", T.FLOAT, [1, 3, 1, 16, 16])]
    if encoder:
        inputs.append(h.make_tensor_value_info("data", T.FLOAT, [1, 4]))
    g = h.make_graph(nodes, "m", inputs, [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(np.asarray(v, np.float32 if np.asarray(v).dtype.kind == "f" else np.int64), k)
                      for k, v in inits.items()])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 11)])


@pytest.mark.parametrize("encoder, per_channel", [(False, False), (True, True)])
def test_a_watermark_model_on_one_frame_quantizes_whole(tmp_path, encoder, per_channel):
    """quantize takes the RivaGAN-like models whole: as close to the float model as onnxruntime's quantized model
    (1.1x of its mean distance), the export exact. Regression: refused at each 3-D Conv, and at the encoder's empty
    slice."""
    onnx.save(watermark_model(encoder), tmp_path / "f.onnx")
    rng = np.random.default_rng(7)
    frames = rng.uniform(-1, 1, (8, 1, 3, 1, 16, 16)).astype(np.float32)
    cal = tmp_path / ("c.npz" if encoder else "c.npy")
    if encoder:
        np.savez(cal, frame=frames[:, 0], data=rng.integers(0, 2, (8, 4)).astype(np.float32))
    else:
        np.save(cal, frames)
    done = quantize(tmp_path / "f.onnx", cal, tmp_path / "m", per_channel=per_channel)
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=2).exact


def test_shipped_watermark_decoder_imports_whole(tmp_path):
    """invisible-watermark's RivaGAN decoder as shipped, on 8 frames of 32 x 32 in [-1, 1] (its package's
    x / 127.5 - 1): whole, within 1.1x onnxruntime's quantized model, the export exact."""
    path = shipped("imwatermark", "rivagan_decoder.onnx")
    rng = np.random.default_rng(0)
    frames = np.clip(rng.normal(0, 0.3, (8, 1, 3, 1, 32, 32)).cumsum(-1), -1, 1).astype(np.float32)
    np.save(tmp_path / "c.npy", frames)
    done = quantize(path, tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=2).exact
