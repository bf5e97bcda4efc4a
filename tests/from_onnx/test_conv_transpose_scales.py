"""A ConvTranspose's weight scales are read per output channel, not weight by weight: a ViT decoder's kernels
(quantized per tensor or per channel along axis 1) took 11 s of its import in exact scales compared one by one."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from support.quantized import qdq

from cvm_onnx.converters.from_onnx import import_model


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_large_kernel_compares_one_scale_per_channel(monkeypatch, per_channel):
    cin, per, k = 32, 48, (4, 4)
    rng = np.random.default_rng(0)
    sw = (rng.uniform(0.5, 2, per) * 0.01).astype(np.float32) if per_channel else np.float32(0.01)
    inits = {"s": np.float32(0.05), "zx": np.uint8(128), "w": rng.integers(-127, 128, (cin, per) + k).astype(np.int8),
             "sw": sw, "so": np.float32(0.1), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"], axis=1),
             h.make_node("ConvTranspose", ["xf", "wf"], ["c"], strides=[2, 2], kernel_shape=list(k)),
             h.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"])]
    m = qdq(nodes, (1, cin, 3, 3), T.UINT8, inits, T.INT8)
    compared = [0]
    eq = Fraction.__eq__

    def counted(a, b):
        compared[0] += 1
        return eq(a, b)

    monkeypatch.setattr(Fraction, "__eq__", counted)
    import_model(m, input_precision=9)
    assert compared[0] < cin * per  # weight by weight: cin * per * 16 (24576)


def test_onnxruntimes_qoperator_float_conv_transpose_is_refused_in_one_line(tmp_path):
    """quantize --form qoperator leaves a ConvTranspose in float (DequantizeLinear, float weights, QuantizeLinear):
    one line naming it and the QDQ form; --form qdq imports the same model. Regression: the refusal said only
    'the ConvTranspose weight is a float tensor that no DequantizeLinear produced'."""
    from onnx import numpy_helper as nh
    import onnx
    from cvm_onnx.app.quantize import quantize
    from cvm_onnx.core.errors import UnsupportedError

    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.normal(size=(4, 6, 3, 3)).astype(np.float32), "w0"),
             nh.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w"),
             nh.from_array(rng.normal(size=(3,)).astype(np.float32), "b")]
    nodes = [h.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["c0"], ["r0"]),
             h.make_node("ConvTranspose", ["r0", "w", "b"], ["y"], name="up", strides=[2, 2], pads=[1, 1, 1, 1],
                         output_padding=[1, 1])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 6, 5, 5])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(4, 1, 6, 5, 5)).astype(np.float32))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "q1", form="qoperator")
    [p] = e.value.problems
    assert p.where.startswith("up") and "--form qdq" in p.rule and "\n" not in p.rule
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "q2", form="qdq")
    assert done.imported is not None
