"""What a fifteenth corpus (models shipped in wheels) met in quantize.
capiti's protein classifiers pool a Conv1d's output by a max over the residues, the padding masked first
(``masked_fill(pad, -3.4e38)`` as Where): quantize_static calibrates the Where's output over [-3.4e38, max], a grid of
scale about 1e36, requantized after the ReduceMax to an ordinary one (M about 7e36). Both were refused ('Where of a
constant branch off the other branch's grid', 'no multiplier and shift within CVM's 32 bits'): the constant branch is
now quantized exactly by the QuantizeLinear that follows (``Selected``), and a ratio past the output's range is the
saturation it is."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import ort_session, quantizes_whole

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model

SCALES = st.floats(2.0 ** -20, 2.0 ** 20, width=32)
F32_MAX = float(np.finfo(np.float32).max)


def cvm(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The import run by the reference executor on int8 x, declared 9 bits (-128 among its values: CVM's 8 bits are
    -127..127, and the runtime clamps what lies past them)."""
    imp = import_model(model, input_precision=9)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    return got


def quantized(v, s: float, z: int, lo: int, hi: int) -> int:
    """QuantizeLinear of the exact real v: round half to even, the zero point added, saturated."""
    return min(max(round(Fraction(v) / Fraction(s)) + z, lo), hi)


def requant_qdq(s_in: float, z_in: int, s_out: float, z_out: int, otype: int) -> onnx.ModelProto:
    """DequantizeLinear(int8 x, s_in, z_in), a Relu-free MaxPool of 1 (a node between), QuantizeLinear(s_out, z_out)."""
    onp = np.int8 if otype == T.INT8 else np.uint8
    nodes = [h.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             h.make_node("MaxPool", ["xf"], ["p"], kernel_shape=[1, 1]),
             h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
    inits = [nh.from_array(np.array(s_in, np.float32), "sx"), nh.from_array(np.array(z_in, np.int8), "zx"),
             nh.from_array(np.array(s_out, np.float32), "so"), nh.from_array(np.array(z_out, onp), "zo")]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.INT8, [1, 1, 16, 16])],
                     [h.make_tensor_value_info("y", otype, None)], inits)
    return onnx_model(g, 17)


@settings(max_examples=40, deadline=None)
@given(big=st.floats(129.0, 2.0 ** 119, width=32), s_out=SCALES, z_in=st.integers(-20, 20),
       otype=st.sampled_from([T.INT8, T.UINT8]), z_out=st.integers(0, 255), seed=st.integers(0, 2**16))
def test_a_ratio_past_the_output_range_saturates_exactly(big, s_out, z_in, otype, z_out, seed):
    """Property: a requantization by M = s_in / s_out >= 129 (every nonzero step saturates int8 and uint8) equals
    the exact QuantizeLinear of every input integer (0 steps to z_out, others to an end), and onnxruntime. Before:
    'no multiplier and shift within CVM's 32 bits requantize by M in [...]' past 2^31 or so."""
    lo, hi = (-128, 127) if otype == T.INT8 else (0, 255)
    z_out = min(max(z_out - (128 if otype == T.INT8 else 0), lo), hi)
    s_in = float(np.float32(big * s_out))
    if not np.isfinite(s_in) or s_in * 255 >= 3e38:
        return
    m = requant_qdq(s_in, z_in, s_out, z_out, otype)
    x = np.random.default_rng(seed).integers(-128, 128, size=(1, 1, 16, 16))
    x.flat[:3] = (z_in, -128, 127)
    want = np.vectorize(lambda v: quantized((Fraction(int(v) - z_in) * Fraction(s_in)), s_out, z_out, lo, hi))(x)
    assert np.array_equal(cvm(m, x).reshape(x.shape), want)
    got = ort_session(m).run(None, {"x": x.astype(np.int8)})[0]
    assert np.array_equal(got.astype(np.int64), want)


def where_qdq(c: float, first: bool, s: float, z: int, k: int, s_out: float, z_out: int) -> onnx.ModelProto:
    """x = DequantizeLinear(int8 x, s, z); Where(x > k s, c, x) (``first``) or Where(x > k s, x, c);
    QuantizeLinear(s_out, z_out) to uint8."""
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("Greater", ["xf", "k"], ["cond"]),
             h.make_node("Where", ["cond", "c", "xf"] if first else ["cond", "xf", "c"], ["w"]),
             h.make_node("QuantizeLinear", ["w", "so", "zo"], ["y"])]
    inits = [nh.from_array(np.array(s, np.float32), "s"), nh.from_array(np.array(z, np.int8), "z"),
             nh.from_array(np.array(k * s, np.float32), "k"), nh.from_array(np.array(c, np.float32), "c"),
             nh.from_array(np.array(s_out, np.float32), "so"), nh.from_array(np.array(z_out, np.uint8), "zo")]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.INT8, [1, 64])],
                     [h.make_tensor_value_info("y", T.UINT8, None)], inits)
    return onnx_model(g, 17)


@settings(max_examples=60, deadline=None)
@given(c=st.floats(-F32_MAX, F32_MAX, width=32) | st.sampled_from([-F32_MAX, -1e4, 0.3, -0.0]),
       first=st.booleans(), s=SCALES, z=st.integers(-10, 10), k=st.integers(-100, 100), ratio=SCALES,
       z_out=st.integers(0, 255), seed=st.integers(0, 2**16))
@example(c=200325.0, first=False, s=400649.0, z=-4, k=-83, ratio=1.0, z_out=0, seed=1).via("float32 products")
@example(c=0.0, first=False, s=317467.0, z=0, k=0, ratio=2.0, z_out=0, seed=1).via("onnxruntime's float32 ties")
@example(c=0.0, first=True, s=1.0, z=0, k=0, ratio=1.0, z_out=128, seed=0).via("x = -128 at 9 bits")
def test_where_of_a_value_and_an_off_grid_constant_is_each_branch_quantized(c, first, s, z, k, ratio, z_out, seed):
    """Property: Where(x > k s, c, x) of a dequantized x and any float32 constant c, quantized to (s_out, z_out):
    the CVM graph equals where(cond, Q(c), Q(x)) in exact arithmetic on every input integer, the condition on
    DequantizeLinear's float32 values as onnxruntime compares them; onnxruntime equals it wherever that float32
    product (x - z) s is exact, and is one step away at most elsewhere (s 317467, s_out 2 s: fl(63 s) is 20000420, so
    31 where the exact 31.5 rounds to 32: the documented requantization bound). Before: 'Where of a constant
    branch off the other branch's grid has no exact CVM form here' unless c lay on x's grid; and the Greater compared
    the exact product (x - z) s, which float32 rounds onto k s (s 400649, x - z = -83: -33253867 is -33253868)."""
    s_out = float(np.float32(s * ratio))
    m = where_qdq(c, first, s, z, k, s_out, z_out)
    x = np.random.default_rng(seed).integers(-128, 128, size=(1, 64))
    x.flat[:3] = np.clip([z + k - 1, z + k, z + k + 1], -128, 127)  # about the condition's edge
    keep = (x - z).astype(np.float32) * np.float32(s) > np.float32(k * s)
    qx = np.vectorize(lambda v: quantized(Fraction(int(v) - z) * Fraction(s), s_out, z_out, 0, 255))(x)
    qc = quantized(Fraction(float(np.float32(c))), s_out, z_out, 0, 255)
    want = np.where(keep, qc, qx) if first else np.where(keep, qx, qc)
    assert np.array_equal(cvm(m, x).reshape(x.shape), want)
    got = ort_session(m).run(None, {"x": x.astype(np.int8)})[0].astype(np.int64)
    exact = (x - z) * s == ((x - z).astype(np.float32) * np.float32(s)).astype(np.float64)
    assert np.array_equal(got[exact], want[exact]) and (np.abs(got - want) <= 1).all()


def masked_max_pool(length: int = 24, vocab: int = 22, dim: int = 8, classes: int = 3) -> onnx.ModelProto:
    """capiti's pooling as torch exports it: token ids (int64, 0 the padding), an embedding Gather, a Conv1d, the
    padding's positions filled with -3.4e38 (Where of the mask == 0) and the max over positions, a Gemm."""
    rng = np.random.default_rng(4)
    inits = [nh.from_array(rng.normal(0, 1, (vocab, dim)).astype(np.float32), "embed"),
             nh.from_array(rng.normal(0, 0.3, (dim, dim, 3)).astype(np.float32), "w"),
             nh.from_array(rng.normal(0, 0.1, dim).astype(np.float32), "b"),
             nh.from_array(rng.normal(0, 0.3, (classes, dim)).astype(np.float32), "wh"),
             nh.from_array(rng.normal(0, 0.1, classes).astype(np.float32), "bh"),
             nh.from_array(np.array(0, np.int64), "pad"), nh.from_array(np.array([1], np.int64), "one"),
             nh.from_array(np.array(0.0, np.float32), "zero"),
             nh.from_array(np.array(-3.4028235e38, np.float32), "fill")]
    nodes = [h.make_node("Equal", ["ids", "pad"], ["is_pad"]), h.make_node("Not", ["is_pad"], ["real"]),
             h.make_node("Cast", ["real"], ["mask"], to=T.FLOAT), h.make_node("Unsqueeze", ["mask", "one"], ["m3"]),
             h.make_node("Gather", ["embed", "ids"], ["e"]), h.make_node("Transpose", ["e"], ["et"], perm=[0, 2, 1]),
             h.make_node("Conv", ["et", "w", "b"], ["c"], pads=[1, 1]),
             h.make_node("Equal", ["m3", "zero"], ["off"]), h.make_node("Where", ["off", "fill", "c"], ["filled"]),
             h.make_node("ReduceMax", ["filled"], ["pooled"], axes=[-1], keepdims=0),
             h.make_node("Gemm", ["pooled", "wh", "bh"], ["logits"], transB=1)]
    g = h.make_graph(nodes, "masked_max", [h.make_tensor_value_info("ids", T.INT64, [1, length])],
                     [h.make_tensor_value_info("logits", T.FLOAT, [1, classes])], inits)
    return onnx_model(g, 17)


def padded_ids(n: int, length: int = 24, vocab: int = 22) -> np.ndarray:
    """n sequences of 4 to ``length`` ids in 1 .. vocab - 1, padded with 0."""
    rng = np.random.default_rng(1)
    x = np.zeros((n, 1, length), np.int64)
    for i in range(n):
        k = int(rng.integers(4, length + 1))
        x[i, 0, :k] = rng.integers(1, vocab, k)
    return x


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_masked_max_pooling_quantizes_whole(tmp_path, per_channel):
    """capiti's masked max pooling over token ids: whole, as close to float as onnxruntime's quantized model (1.1x),
    the export exact. Before: refused at the Where (off-grid constant) and the ReduceMax's QuantizeLinear (M 1e36)."""
    quantizes_whole(tmp_path, masked_max_pool(), per_channel, padded_ids(8))
