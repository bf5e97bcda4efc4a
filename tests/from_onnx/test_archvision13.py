"""Graph forms of vision architectures as torch and transformers export them (benchmarks/vision_architectures.py),
each in its minimal ONNX form: against the exact oracle, and through `cvm-onnx quantize` whole, within 1.1x
onnxruntime's quantized model's distance from the float model, the export exact."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.quantized import between_convs, qdq, quantizes_whole
from test_quantize_ops12 import ort_average_counts
from test_quantized_fresh_ops import NP, RANGE, draw_x, oracle_equal

from cvm_onnx.app.quantize import outputs, quantize
from cvm_onnx.runtime.verify import verify


def grn(nhwc: bool, eps: float, seed: int) -> onnx.ModelProto:
    """ConvNeXt V2's global response normalization between two convs: g = ||x|| over the spatial axes (ReduceL2),
    x * gamma * g / (mean of g over the channels + eps) + beta + x; channels last (transformers' ConvNextV2, between
    two Transposes) or first."""
    rng = np.random.default_rng(seed)
    shape = (1, 1, 1, 8) if nhwc else (1, 8, 1, 1)
    nodes = [h.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 3, 1])] if nhwc else \
        [h.make_node("Identity", ["a"], ["t"])]
    nodes += [h.make_node("ReduceL2", ["t", "spatial"], ["g"], keepdims=1),
              h.make_node("ReduceMean", ["g", "channels"], ["gm"], keepdims=1),
              h.make_node("Add", ["gm", "eps"], ["ge"]),
              h.make_node("Div", ["g", "ge"], ["nx"]),
              h.make_node("Mul", ["t", "nx"], ["tn"]),
              h.make_node("Mul", ["gamma", "tn"], ["tg"]),
              h.make_node("Add", ["tg", "beta"], ["tb"]),
              h.make_node("Add", ["tb", "t"], ["o" if nhwc else "b"])]
    nodes += [h.make_node("Transpose", ["o"], ["b"], perm=[0, 3, 1, 2])] if nhwc else []
    return between_convs(nodes, {"spatial": np.array([1, 2] if nhwc else [2, 3]),
                                 "channels": np.array([-1 if nhwc else 1]), "eps": np.float32(eps),
                                 "gamma": rng.normal(0, 0.5, shape), "beta": rng.normal(0, 0.5, shape)}, opset=18)


def without_added_grids(quantized: bytes) -> bytes:
    """onnxruntime's quantized model less the QuantizeLinear / DequantizeLinear pairs quantize adds after a value
    quantize_static leaves float (named ``<tensor>_quantized`` and ``<tensor>_dequantized``)."""
    m = onnx.load_from_string(quantized)
    added = {n.output[0]: n for n in m.graph.node if n.name == n.output[0] and n.name.endswith(
        ("_quantized", "_dequantized"))}
    source = {y: added[n.input[0]].input[0] for y, n in added.items() if n.op_type == "DequantizeLinear"}
    kept = [n for n in m.graph.node if n.output[0] not in added]
    for n in kept:
        n.input[:] = [source.get(x, x) for x in n.input]
    del m.graph.node[:]
    m.graph.node.extend(kept)
    return m.SerializeToString()


@settings(max_examples=4, deadline=None)
@given(nhwc=st.booleans(), eps=st.sampled_from([1e-6, 1e-3, 0.5]), per_channel=st.booleans(),
       seed=st.integers(0, 2**16))
@example(nhwc=False, eps=1e-6, per_channel=True, seed=65533)  # an element 2 steps from onnxruntime's (below)
def test_grn_quantizes_whole_within_onnxruntime_distance(tmp_path_factory, nhwc, eps, per_channel, seed):
    """ConvNeXt V2's GRN: the L2 norm g over the spatial axes, read by its mean over the channels and by the Div,
    quantized where it is computed at its calibrated grid (kept_float.norms_quantized), so that the norm is rounded
    exactly and the quotient is the bounded quotient of sums: whole, the mean distance from the float model within
    1.1x that of onnxruntime's model as quantize_static writes it (the norm float), the export exact. Not every
    element within one step of onnxruntime's model: the quotient's one step (its bound) is multiplied by x and gamma
    and summed by the conv after it. Regression: refused 'the ReduceMean input (L2 norm) must be quantized
    (QuantizeLinear) first'."""
    tmp = tmp_path_factory.mktemp("grn")
    onnx.save(grn(nhwc, eps, seed), tmp / "f.onnx")
    rng = np.random.default_rng(seed)
    np.save(tmp / "c.npy", rng.normal(size=(8, 1, 8, 12, 12)).astype(np.float32))
    done = quantize(tmp / "f.onnx", tmp / "c.npy", tmp / "m", per_channel=per_channel)
    held = rng.normal(size=(16, 1, 8, 12, 12)).astype(np.float32)
    [want], _, [got] = outputs(done.float_model, done.onnx_model, done.imported, held)
    [_], [plain], _ = outputs(done.float_model, without_added_grids(done.onnx_model), done.imported, held, got=[got])
    assert np.abs(got - want).mean() <= 1.1 * np.abs(plain - want).mean()
    assert verify(done.imported.graph, seeds=2).exact



# -- GatherND of dequantized values (the dynamo exporter's adaptive pooling to non-divisible sizes, area Resize) --
@settings(max_examples=15, deadline=None)
@given(d=st.data(), s=st.floats(2.0**-8, 2.0**2, width=32), so=st.floats(2.0**-8, 2.0**2, width=32),
       zo=st.integers(-20, 20), x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_gather_nd_of_dequantized_values_is_the_integer_gather(d, s, so, zo, x_type):
    """GatherND (any batch_dims, any index depth, constant indices, negatives among them) between DequantizeLinear
    and QuantizeLinear: it only selects values, so the integer GatherND of t at x's scale and zero point, requantized:
    equal to the oracle. Regression: 'float GatherND of dequantized values has no integer form'."""
    rank = d.draw(st.integers(1, 4))
    shape = tuple(d.draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    b = d.draw(st.integers(0, rank - 1))
    k = d.draw(st.integers(1, rank - b))
    lookups = shape[:b] + tuple(d.draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    dims = np.array(shape[b:b + k])
    idx = np.array([d.draw(st.integers(-n, n - 1)) for _ in range(int(np.prod(lookups, dtype=int))) for n in dims],
                   np.int64).reshape(lookups + (k,))
    lo, hi = RANGE[x_type]
    z = d.draw(st.integers(lo, hi))
    inits = {"s": np.float32(s), "z": NP[x_type](z), "so": np.float32(so), "zo": np.int8(zo), "idx": idx}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("GatherND", ["xf", "idx"], ["g"], batch_dims=b),
             h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    x = draw_x(d, shape, x_type)
    x.reshape(-1)[:2] = (lo, hi)[:x.size]
    oracle_equal(qdq(nodes, x.shape, x_type, inits, T.INT8, opset=13), x)


@given(per_channel=st.booleans(), seed=st.integers(0, 2**16))
@settings(max_examples=2, deadline=None)
def test_gather_nd_between_convs_quantizes_whole(tmp_path_factory, per_channel, seed):
    """A float GatherND of positions of a conv's output (which quantize_static leaves float) read by a conv:
    `quantize` takes it whole, within 1.1x onnxruntime's distance from float, the export exact."""
    rng = np.random.default_rng(seed)
    idx = np.stack([rng.integers(-n, n, (1, 8, 6, 6)) for n in (1, 8, 12, 12)], -1)
    quantizes_whole(tmp_path_factory.mktemp("gnd"), between_convs([h.make_node("GatherND", ["a", "idx"], ["b"])],
                                                                   {"idx": idx}), per_channel)


# -- AveragePool of one window larger than the image (HF EfficientNet's AvgPool2d(hidden_dim, ceil_mode=True)) ---
@settings(max_examples=10, deadline=None)
@given(d=st.data(), s=st.floats(2.0**-8, 2.0**2, width=32), so=st.floats(2.0**-8, 2.0**2, width=32),
       zo=st.integers(-20, 20), x_type=st.sampled_from([T.INT8, T.UINT8]), counted=st.integers(0, 1))
def test_average_pool_of_one_window_past_the_image_is_its_mean(d, s, so, zo, x_type, counted):
    """AveragePool with ceil_mode whose kernel passes the image (n < k < n + stride: one window, at the image) is the
    mean of the image, both counts H W (onnxruntime's float AveragePool on ones gives 1): equal to the oracle;
    EfficientNet's 2560 kernel on 7 x 7 imports as that sum. Regression: the input padded to the kernel (2560 x 2560
    per channel) before the window sums."""
    size = [d.draw(st.integers(1, 7)) for _ in range(2)]
    strides = [d.draw(st.integers(1, 4)) for _ in range(2)]
    kernel = [d.draw(st.integers(n, n + st_ - 1)) for n, st_ in zip(size, strides)]
    if d.draw(st.booleans()):
        kernel, strides, size = [2560, 2560], [2560, 2560], [7, 7]
    for n, k, st_ in zip(size, kernel, strides):
        assert np.array_equal(ort_average_counts(n, k, st_, 0, 0, counted), np.ones(1, np.float32))
    lo, hi = RANGE[x_type]
    inits = {"s": np.float32(s), "z": NP[x_type](d.draw(st.integers(lo, hi))), "so": np.float32(so),
             "zo": np.int8(zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("AveragePool", ["xf"], ["p"], kernel_shape=kernel, strides=strides, ceil_mode=1,
                         count_include_pad=counted),
             h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
    x = draw_x(d, (1, 3, *size), x_type)
    x.reshape(-1)[:2] = lo, hi
    oracle_equal(qdq(nodes, x.shape, x_type, inits, T.INT8, opset=19), x)


@pytest.mark.parametrize("size, kernel", [((2, 2), 3), ((7, 7), 9)])
def test_qlinear_average_pool_counting_its_padding_is_not_the_image_mean(size, kernel):
    """onnxruntime's QLinearAveragePool with count_include_pad=1 divides the one window past the image by the whole
    kernel, k^2 (90s over 2 x 2 by a 3 x 3 kernel: 40), not H W: the import never takes it as the image's mean; it
    is refused in one line naming the node (the kernel larger than the padded input). Regression: the mean's
    shortcut for AveragePool under ceil_mode took it too (90 where onnxruntime gives 40)."""
    from onnx import numpy_helper as nh

    from cvm_onnx.converters.from_onnx import import_model
    from cvm_onnx.core.errors import CVMError

    node = h.make_node("QLinearAveragePool", ["x", "s", "z", "s", "z"], ["y"], domain="com.microsoft", name="pool",
                       kernel_shape=[kernel] * 2, strides=[kernel - 1] * 2, ceil_mode=1, count_include_pad=1)
    g = h.make_graph([node], "g", [h.make_tensor_value_info("x", T.UINT8, [1, 1, *size])],
                     [h.make_tensor_value_info("y", T.UINT8, None)],
                     [nh.from_array(np.float32(1.0), "s"), nh.from_array(np.uint8(0), "z")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)], ir_version=8)
    with pytest.raises(CVMError, match=r"pool \(QLinearAveragePool\): the kernel .* is larger than the padded input"):
        import_model(m, input_precision=9)
