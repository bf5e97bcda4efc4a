"""Small float transformer encoders and recurrent layers written with onnx.helper, as exporters write them
(issue 35)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.core.format.onnx_file import onnx_model

def encoder(seed=0, s=8, d=16, heads=2, ff=32, gelu="erf", ln="fused", opset=17, layers=1, scale="mul"):
    """x (1, s, d) -> ``layers`` pre-norm encoder layers (LayerNorm, Q/K/V MatMul + bias, heads split by Reshape
    and Transpose, Q K^T scaled (``scale``: Mul by 1/sqrt(dh) or Div by sqrt(dh)), Softmax, weights x V, output
    projection, residual Add; LayerNorm, MLP with GELU, residual Add) -> a final LayerNorm ``y``. ``gelu``: "erf"
    (x * (1 + Erf(x / sqrt 2)) * 0.5), "tanh" (its tanh form with Pow 3) or "op" (Gelu, opset 20); ``ln``:
    "fused" (LayerNormalization), "pow" (ReduceMean, Sub, Pow 2, ReduceMean, Add, Sqrt, Div, Mul, Add) or "mul"
    (Mul(d, d) and Mul by Reciprocal); ReduceMean's axes an input from opset 18."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def c(name, v, dt=np.float32):
        inits.append(nh.from_array(np.asarray(v, dt), name))
        return name

    def node(op, ins, **a):
        out = f"{op}_{len(nodes)}"
        nodes.append(h.make_node(op, ins, [out], name=f"n{len(nodes)}_{op}", **a))
        return out

    def reduce_mean(x, tag):
        if opset < 18:
            return node("ReduceMean", [x], axes=[-1])
        return node("ReduceMean", [x, c(f"{tag}_axes", [-1], np.int64)])

    def layernorm(x, tag):
        g, b = c(f"{tag}_g", 1 + 0.1 * rng.normal(size=d)), c(f"{tag}_b", 0.1 * rng.normal(size=d))
        if ln == "fused":
            return node("LayerNormalization", [x, g, b], axis=-1, epsilon=1e-5)
        dd = node("Sub", [x, reduce_mean(x, f"{tag}_mean")])
        sq = node("Mul", [dd, dd]) if ln == "mul" else node("Pow", [dd, c(f"{tag}_two", 2.0)])
        sd = node("Sqrt", [node("Add", [reduce_mean(sq, f"{tag}_var"), c(f"{tag}_eps", 1e-5)])])
        nrm = node("Mul", [dd, node("Reciprocal", [sd])]) if ln == "mul" else node("Div", [dd, sd])
        return node("Add", [node("Mul", [nrm, g]), b])

    def linear(x, din, dout, tag):
        w, b = c(f"{tag}_w", rng.normal(size=(din, dout)) / np.sqrt(din)), c(f"{tag}_b", 0.1 * rng.normal(size=dout))
        return node("Add", [node("MatMul", [x, w]), b])

    def split(z, t):
        shape = c(f"{t}_{z}_shape", [1, s, heads, dh], np.int64)
        return node("Transpose", [node("Reshape", [z, shape])], perm=[0, 2, 1, 3])

    dh = d // heads
    x = "x"
    for L in range(layers):
        t = f"l{L}"
        y = layernorm(x, f"{t}ln1")
        qh, kh, vh = (split(linear(y, d, d, f"{t}{n}"), t) for n in "qkv")
        sc = node("MatMul", [qh, node("Transpose", [kh], perm=[0, 1, 3, 2])])
        sc = node("Mul", [sc, c(f"{t}_scale", 1 / np.sqrt(dh))]) if scale == "mul" else \
            node("Div", [sc, c(f"{t}_scale", np.sqrt(dh))])
        o = node("MatMul", [node("Softmax", [sc], axis=-1), vh])
        o = node("Reshape", [node("Transpose", [o], perm=[0, 2, 1, 3]), c(f"{t}_oshape", [1, s, d], np.int64)])
        x = node("Add", [x, linear(o, d, d, f"{t}o")])
        y = layernorm(x, f"{t}ln2")
        hdn = linear(y, d, ff, f"{t}f1")
        if gelu == "erf":
            e = node("Erf", [node("Div", [hdn, c(f"{t}_sq2", np.sqrt(2))])])
            hdn = node("Mul", [node("Mul", [hdn, node("Add", [e, c(f"{t}_one", 1.0)])]), c(f"{t}_half", 0.5)])
        elif gelu == "tanh":
            cube = node("Pow", [hdn, c(f"{t}_three", 3.0)])
            inner = node("Mul", [node("Add", [hdn, node("Mul", [cube, c(f"{t}_k", 0.044715)])]),
                                 c(f"{t}_r", np.sqrt(2 / np.pi))])
            hdn = node("Mul", [node("Mul", [hdn, c(f"{t}_half", 0.5)]),
                               node("Add", [node("Tanh", [inner]), c(f"{t}_one", 1.0)])])
        elif gelu == "op":
            hdn = node("Gelu", [hdn])
        x = node("Add", [x, linear(hdn, ff, d, f"{t}f2")])
    layernorm(x, "final")
    nodes[-1].output[0] = "y"
    g = h.make_graph(nodes, "encoder", [h.make_tensor_value_info("x", T.FLOAT, [1, s, d])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, s, d])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def lstm_model(way: str, seed: int, steps=12, size=8, hidden=16, states=False, op="LSTM", peepholes: float = 0.0,
               **attrs) -> onnx.ModelProto:
    """x (steps, 1, size) -> MatMul -> LSTM, GRU or RNN (``way``, bias, initial states when ``states``; an LSTM's
    peepholes P of N(0, ``peepholes``) where not 0) -> MatMul by the identity: quantize_static quantizes the layer's
    input and output around the float layer."""
    rng = np.random.default_rng(seed)
    dirs = 2 if way == "bidirectional" else 1
    k = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    inits = {"w0": rng.normal(size=(size, size)) / 2, "W": rng.normal(size=(dirs, k * hidden, size)) / 2,
             "R": rng.normal(size=(dirs, k * hidden, hidden)) / 3, "B": rng.normal(size=(dirs, 2 * k * hidden)) / 3,
             "h0": rng.uniform(-1, 1, (dirs, 1, hidden)), "c0": rng.uniform(-2, 2, (dirs, 1, hidden)),
             "w1": np.eye(hidden)}
    ins = ["a", "W", "R", "B"] + ((["", "h0", "c0"] if op == "LSTM" else ["", "h0"]) if states else [])
    if peepholes:
        inits["P"] = np.random.default_rng(seed + 1).normal(size=(dirs, 3 * hidden)) * peepholes
        ins = ins + [""] * (7 - len(ins)) + ["P"]
    nodes = [h.make_node("MatMul", ["x", "w0"], ["a"]),
             h.make_node(op, ins, ["Y0"], hidden_size=hidden, direction=way, **attrs),
             h.make_node("MatMul", ["Y0", "w1"], ["y"])]
    g = h.make_graph(nodes, "lstm", [h.make_tensor_value_info("x", T.FLOAT, [steps, 1, size])],
                     [h.make_tensor_value_info("y", T.FLOAT, [steps, dirs, 1, hidden])],
                     [nh.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    m = onnx_model(g, 17)
    m.ir_version = 8
    return m
