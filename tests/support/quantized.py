"""Small float CNNs quantized by onnxruntime.quantization.quantize_static: the source models of the quantized
import's tests."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnxruntime import quantization

from cvm_onnx.core.format.onnx_file import onnx_model


def conv_layer(rng, name, x, c_in, c_out, group=1, k=3, stride=1, pads=(1, 1, 1, 1), dilation=1):
    w = nh.from_array(rng.normal(size=(c_out, c_in // group, k, k)).astype(np.float32), f"{name}_w")
    b = nh.from_array(rng.normal(size=(c_out,)).astype(np.float32), f"{name}_b")
    node = h.make_node("Conv", [x, w.name, b.name], [name], group=group, strides=[stride, stride], pads=list(pads),
                       dilations=[dilation, dilation])
    return [node], [w, b]


def float_model(kind: str, seed: int, opset: int, group: int, stride: int, pads, pool: str, head: str):
    """A small float CNN: conv (+ relu) [two branches joined by Add, Mul or Concat; or squared by Pow, then a 1x1
    conv, which quantizes it: quantize_static leaves Pow unquantized], a pooling, flatten, Gemm or MatMul
    (+ Sigmoid). Group 4: the first conv is depthwise (4 channels in, 4 out)."""
    rng = np.random.default_rng(seed)
    c = 4 if group == 4 else 2 * group
    nodes, inits = conv_layer(rng, "c1", "x", c, 4, group, stride=stride, pads=pads)
    nodes.append(h.make_node("Relu", ["c1"], ["r1"]))
    last = "r1"
    if kind in ("Add", "Mul", "Concat"):
        n2, i2 = conv_layer(rng, "c2", "x", c, 4, 1, stride=stride, pads=pads)
        nodes += n2
        inits += i2
        nodes.append(h.make_node(kind, ["r1", "c2"], ["j"], **({"axis": 1} if kind == "Concat" else {})))
        last = "j"
    if kind == "Pow":
        inits.append(nh.from_array(np.array(2, np.float32), "two"))
        nodes.append(h.make_node("Pow", ["r1", "two"], ["j"]))
        n3, i3 = conv_layer(rng, "cj", "j", 4, 4, k=1, pads=(0, 0, 0, 0))
        nodes += n3
        inits += i3
        last = "cj"
    if pool == "max":
        nodes.append(h.make_node("MaxPool", [last], ["p"], kernel_shape=[2, 2], strides=[2, 2]))
    elif pool == "avg":
        nodes.append(h.make_node("AveragePool", [last], ["p"], kernel_shape=[2, 2], strides=[1, 1],
                                 pads=[1, 0, 0, 1]))
    else:
        nodes.append(h.make_node("GlobalAveragePool", [last], ["p"]))
    nodes.append(h.make_node("Flatten", ["p"], ["f"]))
    shapes = {"x": [1, c, 6, 6]}
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, shapes["x"])],
                     [h.make_tensor_value_info("f", T.FLOAT, None)], inits)
    m = onnx_model(g, opset)
    m = onnx.shape_inference.infer_shapes(m)
    n_f = [v for v in m.graph.value_info if v.name == "f"] or list(m.graph.output)
    width = n_f[0].type.tensor_type.shape.dim[1].dim_value
    w2 = nh.from_array(rng.normal(size=(width, 3)).astype(np.float32), "w2")
    b2 = nh.from_array(rng.normal(size=(3,)).astype(np.float32), "b2")
    m.graph.initializer.extend([w2, b2])
    if head == "gemm":
        m.graph.node.append(h.make_node("Gemm", ["f", "w2", "b2"], ["y"]))
    else:
        m.graph.node.append(h.make_node("MatMul", ["f", "w2"], ["mm"]))
        m.graph.node.append(h.make_node("Add", ["mm", "b2"], ["y"]))
    out = "y"
    if head == "sigmoid":
        m.graph.node.append(h.make_node("Sigmoid", ["y"], ["ys"]))
        out = "ys"
    del m.graph.output[:]
    m.graph.output.append(h.make_tensor_value_info(out, T.FLOAT, None))
    del m.graph.value_info[:]
    return m


class Reader(quantization.CalibrationDataReader):
    def __init__(self, shape, seed=0, n=4):
        rng = np.random.default_rng(seed)
        self.items = iter([{"x": rng.normal(size=shape).astype(np.float32)} for _ in range(n)])

    def get_next(self):
        return next(self.items, None)


def quantized(model: onnx.ModelProto, tmp, fmt: str, activation: str, symmetric: bool, per_channel: bool):
    src, dst = tmp / "f.onnx", tmp / "q.onnx"
    onnx.save(model, src)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    quantization.quantize_static(
        str(src), str(dst), Reader(shape), quant_format=getattr(quantization.QuantFormat, fmt),
        activation_type=getattr(quantization.QuantType, "QInt8" if activation == "int8" else "QUInt8"),
        weight_type=quantization.QuantType.QInt8, per_channel=per_channel,
        extra_options={"ActivationSymmetric": symmetric})
    return onnx.load(dst), shape


def small_qdq(tmp, activation="uint8"):
    rng = np.random.default_rng(3)
    nodes, inits = conv_layer(rng, "y", "x", 2, 2)
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    qm, _ = quantized(onnx_model(g, 17), tmp, "QDQ", activation, False, True)
    return qm
