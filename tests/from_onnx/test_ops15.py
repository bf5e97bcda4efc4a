"""Op classes of shipped models the quantized import refused before: 3-D ConvTranspose (3-D U-Nets, video and
medical models) of dequantized values."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import qdq, quantizes_whole, transposed_conv
from test_quantized_fresh_ops import NP, oracle_equal

from cvm_onnx.converters.from_onnx import import_model
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
    sw = (rng.uniform(0.5, 2, per) * 0.01).astype(np.float32) if per_channel else np.float32(0.01)
    zx = d.draw(st.integers(*((-128, 127) if x_type == T.INT8 else (0, 255))))
    inits = {"s": np.float32(0.05), "zx": NP[x_type](zx), "w": rng.integers(-127, 128, (cin, per) + kernel)
             .astype(np.int8), "sw": sw, "so": np.float32(0.1), "zo": np.int8(0)}
    ins = ["xf", "wf"]
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"], axis=1)]
    if with_bias:
        inits.update(b=rng.integers(-300, 300, per * group).astype(np.int32),
                     sb=(np.float32(0.05) * np.tile(np.broadcast_to(sw, (per,)), group)).astype(np.float32))
        nodes.append(h.make_node("DequantizeLinear", ["b", "sb"], ["bf"], axis=0))
        ins.append("bf")
    nodes += [h.make_node("ConvTranspose", ins, ["c"], name="up", group=group, **a),
              h.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"])]
    shape = (d.draw(st.integers(1, 2)), cin) + spatial
    m = qdq(nodes, shape, x_type, inits, T.INT8)
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
    g = h.make_graph([h.make_node("ConvTranspose", ["x", "w"], ["y"], **a)], "t",
                     [h.make_tensor_value_info("x", T.FLOAT, list(x.shape))],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], [nh.from_array(w, "w")])
    [want] = ort.InferenceSession(onnx_model(g, 17).SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.array_equal(transposed_conv(x.astype(np.int64), w.astype(np.int64), a), want.astype(np.int64))


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
