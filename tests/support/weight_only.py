"""onnxruntime's weight-only quantized ops (com.microsoft MatMulNBits, GatherBlockQuantized) in small models of random
packed weights, as transformers.js' q4 models write them: for the quantize tests and the runtime's."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def nbits(rng: np.random.Generator, k: int, n: int, bits: int, size: int, zeros: bool, bias: bool,
          scales: np.ndarray, level: int = 0, x: str = "x", y: str = "y", tag: str = ""
          ) -> tuple[onnx.NodeProto, list[onnx.TensorProto], dict]:
    """A MatMulNBits node of random packed weights, its initializers, and what it packs (``oracle``'s input)."""
    blocks = -(-k // size)
    packed = rng.integers(0, 256, (n, blocks, size * bits // 8), dtype=np.uint8)
    ins = [x, f"b{tag}", f"s{tag}"]
    inits = [nh.from_array(packed, f"b{tag}"), nh.from_array(scales.reshape(n, blocks), f"s{tag}")]
    facts = {"packed": packed, "scales": scales.reshape(n, blocks), "zeros": None, "bias": None}
    if zeros:
        facts["zeros"] = rng.integers(0, 256, n * -(-blocks * bits // 8), dtype=np.uint8)
        ins.append(f"z{tag}")
        inits.append(nh.from_array(facts["zeros"], f"z{tag}"))
    if bias:
        facts["bias"] = rng.integers(-50, 50, n).astype(np.float32)
        ins += [""] * (5 - len(ins)) + [f"c{tag}"]
        inits.append(nh.from_array(facts["bias"], f"c{tag}"))
    node = h.make_node("MatMulNBits", ins, [y], domain="com.microsoft", K=k, N=n, bits=bits, block_size=size,
                       accuracy_level=level)
    return node, inits, facts


def float_in(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], shape: list[int]) -> onnx.ModelProto:
    """``nodes`` as a model of one float input x of ``shape`` and its last node's output (opset 17 with
    com.microsoft 1, IR 8: what onnxruntime 1.31 loads)."""
    g = h.make_graph(nodes, "nbits", [h.make_tensor_value_info("x", T.FLOAT, shape)],
                     [h.make_tensor_value_info(nodes[-1].output[0], T.FLOAT, None)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)], ir_version=8)


def gather_blocks(rng: np.random.Generator, rows: int, cols: int, kind: str, bits: int, size: int, axis: int,
                  gather: int, zeros: bool) -> tuple[onnx.NodeProto, list[onnx.TensorProto], np.ndarray]:
    """A GatherBlockQuantized node reading ``idx`` from random (rows, cols) data of ``kind`` (int4, uint4, or uint8
    packed ``bits`` a value along the last axis), its initializers, and its table as the oracle dequantizes it:
    each value minus its block's zero point (absent: 0, or 2^(bits - 1) for uint8), times its block's scale along
    ``axis``, rounded to float32."""
    lo, hi = {"int4": (-8, 8), "uint4": (0, 16), "uint8": (0, 1 << bits)}[kind]
    q = rng.integers(lo, hi, (rows, cols))
    shape = [rows, cols]
    shape[axis] = -(-shape[axis] // size)
    s = rng.uniform(-2, 2, shape).astype(np.float32)
    z = rng.integers(lo, hi, shape) if zeros else np.full(shape, 1 << (bits - 1) if kind == "uint8" else 0)

    def tensor(name: str, v: np.ndarray) -> onnx.TensorProto:
        if kind != "uint8":
            return h.make_tensor(name, T.INT4 if kind == "int4" else T.UINT4, list(v.shape), v.ravel().tolist())
        per = 8 // bits
        v = np.pad(v, [(0, 0), (0, -v.shape[1] % per)])
        return nh.from_array((v.reshape(len(v), -1, per) << np.arange(0, 8, bits)).sum(-1).astype(np.uint8), name)

    inits = [tensor("d", q), nh.from_array(s, "s")] + ([tensor("z", z)] if zeros else [])
    node = h.make_node("GatherBlockQuantized", ["d", "idx", "s"] + ["z"] * zeros, ["e"], domain="com.microsoft",
                       bits=bits, block_size=size, quantize_axis=axis, gather_axis=gather)
    table = np.zeros((rows, cols), np.float32)
    for r in range(rows):
        for c in range(cols):
            b = (r // size, c) if axis == 0 else (r, c // size)
            table[r, c] = np.float32(q[r, c] - z[b]) * s[b]
    return node, inits, table


def two_layers(rng: np.random.Generator, k: int = 64) -> onnx.ModelProto:
    """x (1, 6, k) -> MatMulNBits (4 bits, blocks of 32, no zero points, a bias) -> Relu -> MatMulNBits (zero
    points, blocks of 16) -> y: a transformers.js q4 dense pair."""
    a, ia, _ = nbits(rng, k, 48, 4, 32, False, True, rng.uniform(0.002, 0.02, 48 * -(-k // 32)).astype(np.float32),
                     y="h", tag="1")
    b, ib, _ = nbits(rng, 48, 10, 4, 16, True, False, rng.uniform(0.002, 0.02, 30).astype(np.float32), x="r",
                     tag="2")
    return float_in([a, h.make_node("Relu", ["h"], ["r"]), b], ia + ib, [1, 6, k])


def embedded(rng: np.random.Generator) -> onnx.ModelProto:
    """idx (1, 6) int64 ids < 50 -> GatherBlockQuantized (uint8 packed 4 bits along the row, blocks of 16, zero
    points) -> MatMulNBits (32 -> 8, a bias) -> y: a q4 model's embedding and first dense layer."""
    emb, ie, _ = gather_blocks(rng, 50, 32, "uint8", 4, 16, 1, 0, True)
    dense, idn, _ = nbits(rng, 32, 8, 4, 16, False, True, rng.uniform(0.01, 0.05, 16).astype(np.float32), x="e",
                          tag="1")
    g = h.make_graph([emb, dense], "embedded", [h.make_tensor_value_info("idx", T.INT64, [1, 6])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], ie + idn)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)], ir_version=8)
