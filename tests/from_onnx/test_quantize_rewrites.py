"""quantize's graph rewrites before quantize_static (``cvm_onnx.app.rewrites``): an Einsum of a computed tensor
and a constant (tf2onnx's EinsumDense, ``abcd,cde->abe``) as Transpose/Reshape/MatMul, the same sums of the same
products, checked on integer-valued floats (every sum exact in float32) against numpy's einsum in int64 over
random equations; a bias shared by two convolutions copied per node under a name no tensor has."""
from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.app.rewrites import _placed, _Places, einsums_as_matmuls, gemm_beta_folded, unshared_biases
from cvm_onnx.app.kept_float import masked_softmaxes
from cvm_onnx.app.quantize import quantize
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify


def einsum_model(equation: str, xshape, w: np.ndarray, const_first: bool) -> onnx.ModelProto:
    ins = ["w", "x"] if const_first else ["x", "w"]
    g = h.make_graph([h.make_node("Einsum", ins, ["y"], equation=equation)], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, list(xshape))],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], [nh.from_array(w, "w")])
    return onnx_model(g, 13)


def run(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def check_einsum_rewritten(case, seed) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """``einsums_as_matmuls`` of the Einsum ``case`` (equation, x's shape, w's shape, constant first) on integers
    drawn from ``seed``: no Einsum left, the graph valid under strict shape inference, and onnxruntime's result equal
    to numpy's einsum in int64 (every sum exact in float32). The model, x and that einsum."""
    eq, xs, ws, first = case
    rng = np.random.default_rng(seed)
    x, w = rng.integers(-20, 21, xs), rng.integers(-20, 21, ws)
    m = einsum_model(eq, xs, w.astype(np.float32), first)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(m)
    assert einsums_as_matmuls(rewritten.graph) == 1
    assert "Einsum" not in {n.op_type for n in rewritten.graph.node}
    onnx.shape_inference.infer_shapes(rewritten, strict_mode=True)
    want = np.einsum(eq, *((w, x) if first else (x, w))).astype(np.int64)
    got = run(rewritten, x.astype(np.float32))
    assert got.shape == want.shape and np.array_equal(got.astype(np.int64), want)
    return m, x, want


@st.composite
def equations(draw):
    """(equation, x's shape, w's shape, constant first): batch letters (in x and the output), summed letters (in x
    and w), w's output letters, each term's letters in a random order."""
    letters = iter("abcdefgh")
    batch, summed, kept = ([next(letters) for _ in range(draw(st.integers(lo, hi)))]
                           for lo, hi in ((0, 2), (1, 2), (0, 2)))
    if not batch and not kept:
        kept = [next(letters)]
    dims = {c: draw(st.integers(1, 4)) for c in batch + summed + kept}
    x, w, out = (draw(st.permutations(t)) for t in (batch + summed, summed + kept, batch + kept))
    first = draw(st.booleans())
    eq = f"{''.join(w)},{''.join(x)}->{''.join(out)}" if first else f"{''.join(x)},{''.join(w)}->{''.join(out)}"
    return eq, tuple(dims[c] for c in x), tuple(dims[c] for c in w), first


@settings(max_examples=40, deadline=None)
@given(case=equations(), seed=st.integers(0, 2**16))
def test_an_einsum_of_a_constant_is_its_matmul(case, seed):
    m, x, want = check_einsum_rewritten(case, seed)
    assert np.array_equal(run(m, x.astype(np.float32)).astype(np.int64), want)


@pytest.mark.parametrize("eq, xs, ws", [("abc,cde->abd", (2, 3, 4), (4, 5, 6)),  # e summed over w alone
                                        ("abc,cd->ad", (2, 3, 4), (4, 5)),  # b summed over x alone
                                        ("...c,cd->...d", (2, 3, 4), (4, 5)),  # an ellipsis
                                        ("abc,cd->abcd", (2, 3, 4), (4, 5))])  # nothing summed: an outer product
def test_other_einsums_are_left(eq, xs, ws):
    m = einsum_model(eq, xs, np.ones(ws, np.float32), False)
    assert einsums_as_matmuls(m.graph) == 0 and [n.op_type for n in m.graph.node] == ["Einsum"]


def batched_model(equation: str, sa, sb) -> onnx.ModelProto:
    """x holds both operands (a's values, then b's); each sliced out and reshaped, then Einsum(a, b)."""
    na, nb = math.prod(sa), math.prod(sb)
    inits = [nh.from_array(np.array(v, np.int64), k) for k, v in
             {"s0": [0], "s1": [na], "s2": [na + nb], "ax": [0], "sa": list(sa), "sb": list(sb)}.items()]
    g = h.make_graph([h.make_node("Slice", ["x", "s0", "s1", "ax"], ["fa"]),
                      h.make_node("Slice", ["x", "s1", "s2", "ax"], ["fb"]),
                      h.make_node("Reshape", ["fa", "sa"], ["a"]), h.make_node("Reshape", ["fb", "sb"], ["b"]),
                      h.make_node("Einsum", ["a", "b"], ["y"], equation=equation)], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [na + nb])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                     inits)
    return onnx_model(g, 13)


@st.composite
def batched_equations(draw):
    """(equation, a's shape, b's shape): 0-2 batch letters, one summed, one free letter of each operand, each
    term's letters in a random order (attention's ``aecd,abcd->acbe``)."""
    letters = iter("abcdefg")
    batch = [next(letters) for _ in range(draw(st.integers(0, 2)))]
    s, fa, fb = next(letters), next(letters), next(letters)
    dims = {c: draw(st.integers(1, 4)) for c in batch + [s, fa, fb]}
    a, b, out = (draw(st.permutations(t)) for t in (batch + [s, fa], batch + [s, fb], batch + [fa, fb]))
    return f"{''.join(a)},{''.join(b)}->{''.join(out)}", tuple(dims[c] for c in a), tuple(dims[c] for c in b)


@st.composite
def wide_equations(draw):
    """(equation, a's shape, b's shape): 0-2 batch letters, one summed, one free letter of one operand and 2-3 of
    the other, each term's letters in a random order."""
    letters = iter("abcdefgh")
    batch = [next(letters) for _ in range(draw(st.integers(0, 2)))]
    s, one = next(letters), next(letters)
    many = [next(letters) for _ in range(draw(st.integers(2, 3)))]
    dims = {c: draw(st.integers(1, 4)) for c in batch + [s, one] + many}
    terms = [batch + [s, one], batch + [s] + many]
    if draw(st.booleans()):
        terms.reverse()
    a, b, out = (draw(st.permutations(t)) for t in (*terms, batch + [one] + many))
    return f"{''.join(a)},{''.join(b)}->{''.join(out)}", tuple(dims[c] for c in a), tuple(dims[c] for c in b)


@settings(max_examples=60, deadline=None)
@given(case=batched_equations() | wide_equations(), seed=st.integers(0, 2**16))
@example(case=("bcd,bdhw->bchw", (1, 17, 8), (1, 8, 4, 4)), seed=0)
def test_an_einsum_of_two_computed_tensors_is_a_batched_matmul(case, seed):
    """Equal to numpy's einsum exactly (small integers), the graph valid under strict shape inference; with several
    free letters on one operand (TesseraNet's bcd,bdhw->bchw) too. Regression: those were left as an Einsum ('no CVM
    op for ONNX Einsum')."""
    eq, sa, sb = case
    rng = np.random.default_rng(seed)
    a, b = rng.integers(-20, 21, sa), rng.integers(-20, 21, sb)
    m = batched_model(eq, sa, sb)
    assert einsums_as_matmuls(m.graph) == 1
    assert "Einsum" not in {n.op_type for n in m.graph.node} and "MatMul" in {n.op_type for n in m.graph.node}
    onnx.shape_inference.infer_shapes(m, strict_mode=True)
    x = np.concatenate([a.ravel(), b.ravel()]).astype(np.float32)
    want = np.einsum(eq, a, b)
    got = run(m, x)
    assert got.shape == want.shape and np.array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("eq, sa, sb", [("abc,abd->abcd", (2, 3, 4), (2, 3, 5)),  # nothing summed
                                        ("abcd,abce->ade", (2, 3, 4, 5), (2, 3, 4, 6)),  # two letters summed
                                        ("abc,abc->ab", (2, 3, 4), (2, 3, 4)),  # no free letter
                                        ("abcd,ace->abe", (2, 3, 4, 5), (2, 4, 6))])  # d summed over a alone
def test_other_einsums_of_computed_tensors_are_left(eq, sa, sb):
    m = batched_model(eq, sa, sb)
    assert einsums_as_matmuls(m.graph) == 0 and "Einsum" in {n.op_type for n in m.graph.node}


def test_attention_written_as_einsums_quantizes_and_imports(tmp_path):
    """Keras' MultiHeadAttention as tf2onnx writes it: scores Einsum ``aecd,abcd->acbe`` of the projected query and
    key (two computed tensors), Softmax, weights x value Einsum ``acbe,aecd->abcd``: imports whole, the export
    exact, as close to float as onnxruntime's quantized model (1.1x)."""
    rng = np.random.default_rng(3)
    t, d, heads, k = 6, 8, 2, 4
    inits = [nh.from_array(rng.normal(size=(d, heads * k)).astype(np.float32) / 2, n) for n in ("wq", "wk", "wv")]
    inits.append(nh.from_array(np.array([1, t, heads, k], np.int64), "shape"))
    nodes = [h.make_node("MatMul", ["x", f"w{n}"], [f"{n}2"]) for n in "qkv"]
    nodes += [h.make_node("Reshape", [f"{n}2", "shape"], [n]) for n in "qkv"]
    nodes += [h.make_node("Einsum", ["k", "q"], ["s"], equation="aecd,abcd->acbe"),
              h.make_node("Softmax", ["s"], ["p"], axis=-1),
              h.make_node("Einsum", ["p", "v"], ["y"], equation="acbe,aecd->abcd")]
    g = h.make_graph(nodes, "mha", [h.make_tensor_value_info("x", T.FLOAT, [1, t, d])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    onnx.save(onnx_model(g, 13), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 1, t, d)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def test_a_model_with_an_einsum_dense_quantizes_and_imports(tmp_path):
    """x (4, 6) -> MatMul -> Reshape (4, 2, 3) -> Einsum abc,bcd->ad (attention's output projection over 2 heads)
    -> Relu: refused before ("no CVM op for ONNX Einsum": quantize_static left it in float); imports whole, the
    export exact, as close to float as onnxruntime's quantized model (1.1x)."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.normal(size=(6, 6)).astype(np.float32), "w0"),
             nh.from_array(np.array([4, 2, 3], np.int64), "shape"),
             nh.from_array(rng.normal(size=(2, 3, 5)).astype(np.float32), "wo")]
    g = h.make_graph([h.make_node("MatMul", ["x", "w0"], ["a"]), h.make_node("Reshape", ["a", "shape"], ["r"]),
                      h.make_node("Einsum", ["r", "wo"], ["e"], equation="abc,bcd->ad"),
                      h.make_node("Relu", ["e"], ["y"])], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [4, 6])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                     inits)
    onnx.save(onnx_model(g, 13), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 4, 6)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def shared_bias_model() -> onnx.ModelProto:
    """Two Convs reading one bias ``b``, the first writing a tensor named ``b2``: quantize_static copies the shared
    bias for the second Conv as ``b2`` (the largest initializer suffix + 1), so the Relu after the first Conv read
    the bias instead (basic-pitch's ``conv1d_25;conv1d_25`` and ``conv1d_25;conv1d_252``)."""
    rng = np.random.default_rng(2)
    inits = [nh.from_array(rng.normal(size=(4, 2, 3, 3)).astype(np.float32), "w1"),
             nh.from_array(rng.normal(size=(4, 4, 3, 3)).astype(np.float32), "w2"),
             nh.from_array(rng.normal(size=4).astype(np.float32), "b")]
    g = h.make_graph([h.make_node("Conv", ["x", "w1", "b"], ["b2"], pads=[1, 1, 1, 1]),
                      h.make_node("Relu", ["b2"], ["r"]),
                      h.make_node("Conv", ["r", "w2", "b"], ["c"], pads=[1, 1, 1, 1]),
                      h.make_node("Relu", ["c"], ["y"])], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 6, 6])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 6, 6])], inits)
    return onnx_model(g, 13)


def test_a_bias_shared_by_two_convolutions_gets_a_copy_each(tmp_path):
    """Each Conv reads a bias of its own, a copy under a name no tensor has; the model quantizes and imports whole
    (before: the quantized model's Relu read the bias copy, and the import was refused at a shape), the export
    exact and as close to float as onnxruntime's quantized model."""
    m = shared_bias_model()
    assert unshared_biases(m.graph) == 1  # the first Conv's copy; the last reader keeps ``b``
    names = [o for n in m.graph.node for o in n.output]
    biases = [n.input[2] for n in m.graph.node if n.op_type == "Conv"]
    assert len(set(biases)) == 2 and not set(biases) & set(names)
    x = np.random.default_rng(0).normal(size=(1, 2, 6, 6)).astype(np.float32)
    assert np.array_equal(run(m, x), run(shared_bias_model(), x))
    onnx.save(shared_bias_model(), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(1).normal(size=(8, 2, 6, 6)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def shared_norm_bias_model(op: str) -> onnx.ModelProto:
    """Two normalizations (``op``: InstanceNormalization, or LayerNormalization over the last axis) reading one
    scale ``ones`` and one bias ``zeros``, a Reshape and a Conv between, the Reshape writing ``zeros0`` (torch's
    exporter names every value ``val_<k>``): quantize_static copied the shared bias for the second node as
    ``zeros0`` (the largest suffix + 1, from -1) and then failed at the Reshape's output, 'Quantization parameter
    shared mode is not supported for weight yet' (adaptive-terrain-diffusion's UNet: 139 InstanceNormalizations
    sharing the bias ``val_35``, copied as ``val_350``... which torch's values are too)."""
    rng = np.random.default_rng(3)
    size = 4 if op == "InstanceNormalization" else 6
    inits = [nh.from_array(rng.normal(size=(4, 4, 3, 3)).astype(np.float32), "w"),
             nh.from_array(rng.normal(size=4).astype(np.float32), "cb"),
             nh.from_array(np.ones(size, np.float32), "ones"), nh.from_array(np.zeros(size, np.float32), "zeros"),
             nh.from_array(np.array([1, 4, 6, 6], np.int64), "shape")]
    g = h.make_graph([h.make_node(op, ["x", "ones", "zeros"], ["n1"]),
                      h.make_node("Reshape", ["n1", "shape"], ["zeros0"]),
                      h.make_node("Conv", ["zeros0", "w", "cb"], ["c"], pads=[1, 1, 1, 1]),
                      h.make_node(op, ["c", "ones", "zeros"], ["y"])], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 6, 6])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 6, 6])], inits)
    return onnx_model(g, 17)


@pytest.mark.parametrize("op", ["InstanceNormalization", "LayerNormalization"])
def test_a_bias_shared_by_two_normalizations_gets_a_copy_each(tmp_path, op):
    """Each normalization reads a bias of its own, under a name no tensor has; the model quantizes and imports
    whole, the export exact and as close to float as onnxruntime's quantized model. Before: quantize_static
    failed ('Quantization parameter shared mode is not supported for weight yet')."""
    m = shared_norm_bias_model(op)
    assert unshared_biases(m.graph) == 1
    names = [o for n in m.graph.node for o in n.output]
    biases = [n.input[2] for n in m.graph.node if n.op_type == op]
    assert len(set(biases)) == 2 and not set(biases) & set(names)
    onnx.save(shared_norm_bias_model(op), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(1).normal(size=(8, 4, 6, 6)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def gemm_model(alpha: float, beta: float, seed: int) -> onnx.ModelProto:
    """x (1, 24) -> MatMul, Relu -> Gemm(alpha, beta, transB) with a constant C of 6."""
    rng = np.random.default_rng(seed)
    inits = [nh.from_array(rng.normal(size=(24, 16)).astype(np.float32) * 0.3, "w1"),
             nh.from_array(rng.normal(size=(6, 16)).astype(np.float32) * 0.2, "w"),
             nh.from_array(rng.normal(size=(6,)).astype(np.float32), "c")]
    nodes = [h.make_node("MatMul", ["x", "w1"], ["m"]), h.make_node("Relu", ["m"], ["r"]),
             h.make_node("Gemm", ["r", "w", "c"], ["y"], alpha=alpha, beta=beta, transB=1)]
    return onnx_model(h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 24])],
                                   [h.make_tensor_value_info("y", T.FLOAT, None)], inits), 17)


@pytest.mark.parametrize(("alpha", "beta"), [(0.5, 0.7), (-1.5, 0.3), (1.0, -2.0)])
def test_a_gemms_beta_is_folded_into_its_constant_c(tmp_path, alpha, beta):
    """beta C as float32(beta C) with beta 1: onnxruntime's float Gemm gives the same floats; the model quantizes
    and imports within 1.1x onnxruntime's distance from float, under one output step on average. Regression:
    quantize_static quantized C at s_a s_w beta and then set beta to 1, so both quantized models computed
    alpha A B + C (about 9 steps from float for these betas)."""
    m = gemm_model(alpha, beta, 0)
    assert gemm_beta_folded(m.graph) == 1
    assert [a.f for a in m.graph.node[2].attribute if a.name == "beta"] == [1.0]
    x = np.random.default_rng(1).normal(size=(16, 1, 24)).astype(np.float32)
    assert all(np.array_equal(run(m, v), run(gemm_model(alpha, beta, 0), v)) for v in x)
    onnx.save(gemm_model(alpha, beta, 0), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", x)
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "q", per_channel=True)
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps and a.mean_steps < 1, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def two_layer_mask(low: float, extra_reader: bool, other: str = "Softmax") -> onnx.ModelProto:
    """Scores x0, x1 each plus one shared Where(Cast(m, bool), 0, low), each read by ``other``; ``extra_reader``:
    the mask also read by a Mul."""
    nodes = [h.make_node("Cast", ["m"], ["keep"], to=T.BOOL), h.make_node("Where", ["keep", "zero", "low"], ["bias"],
                                                                           name="w")]
    outs = []
    for i in range(2):
        attrs = {"axis": -1} if other == "Softmax" else {}
        nodes += [h.make_node("Add", [f"x{i}", "bias"], [f"s{i}"], name=f"a{i}"),
                  h.make_node(other, [f"s{i}"], [f"p{i}"], name=f"p{i}", **attrs)]
        outs.append(f"p{i}")
    if extra_reader:
        nodes.append(h.make_node("Mul", ["bias", "x0"], ["y"], name="mul"))
        outs.append("y")
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("m", T.INT64, [1, 4])] +
                     [h.make_tensor_value_info(f"x{i}", T.FLOAT, [1, 4]) for i in range(2)],
                     [h.make_tensor_value_info(o, T.FLOAT, [1, 4]) for o in outs],
                     [nh.from_array(np.float32(0), "zero"), nh.from_array(np.float32(low), "low")])
    return onnx_model(g, 17)


@pytest.mark.parametrize("low, extra, other, want", [
    (float(np.finfo(np.float32).min), False, "Softmax", ["w", "a0", "p0", "a1", "p1"]),
    (-10000.0, False, "Softmax", ["w", "a0", "p0", "a1", "p1"]),
    (float(np.finfo(np.float32).min), True, "Softmax", []),  # the mask read by a Mul too: quantized as before
    (1.0, False, "Softmax", []),  # c >= 0 is no mask
    (-9999.0, False, "Softmax", []),  # c above MASK_LOW: quantized as before
    (-10000.0, False, "Relu", []),  # no Softmax
])
def test_masked_softmaxes_found_for_quantize_to_leave_float(low, extra, other, want):
    """Softmax(x + Where(keep, 0, c)), c <= -10000, the mask shared by every layer's Add: the Where, each Add and
    Softmax (quantize_static's nodes_to_exclude); a mask with any other reader, c > -10000 or another op than
    Softmax: none."""
    assert [n.name for n in masked_softmaxes(two_layer_mask(low, extra, other))] == want


def two_layer_hf_mask(low: float, source: int = T.INT64, one: float = 1.0) -> onnx.ModelProto:
    """Scores x0, x1 each plus one shared HF mask (one - Cast(Unsqueeze(m), float)) * low, each read by a
    Softmax; m of type ``source``."""
    nodes = [h.make_node("Unsqueeze", ["m", "axes"], ["m1"], name="u"),
             h.make_node("Cast", ["m1"], ["mf"], to=T.FLOAT, name="cast"),
             h.make_node("Sub", ["one", "mf"], ["inv"], name="sub"), h.make_node("Mul", ["inv", "low"], ["bias"],
                                                                                  name="mul")]
    for i in range(2):
        nodes += [h.make_node("Add", [f"x{i}", "bias"], [f"s{i}"], name=f"a{i}"),
                  h.make_node("Softmax", [f"s{i}"], [f"p{i}"], name=f"p{i}", axis=-1)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("m", source, [4])] +
                     [h.make_tensor_value_info(f"x{i}", T.FLOAT, [1, 4]) for i in range(2)],
                     [h.make_tensor_value_info(f"p{i}", T.FLOAT, [1, 4]) for i in range(2)],
                     [nh.from_array(np.float32(one), "one"), nh.from_array(np.float32(low), "low"),
                      nh.from_array(np.array([0], np.int64), "axes")])
    return onnx_model(g, 17)


@pytest.mark.parametrize("low, source, one, want", [
    (float(np.finfo(np.float32).min), T.INT64, 1.0, ["cast", "sub", "mul", "a0", "p0", "a1", "p1"]),
    (-10000.0, T.INT32, 1.0, ["cast", "sub", "mul", "a0", "p0", "a1", "p1"]),
    (-9999.0, T.INT64, 1.0, []),  # 0 and -9999: above MASK_LOW
    (-10000.0, T.INT64, 2.0, []),  # -10000 and -20000: no 0, no mask
    (-10000.0, T.FLOAT, 1.0, []),  # of a float input: quantized as before
])
def test_hf_masks_found_for_quantize_to_leave_float(low, source, one, want):
    """HF's additive mask (1 - Cast(m, float)) * c of an integer input, c <= -10000, shared by every layer: its
    float nodes (the Cast to float, Sub, Mul), each Add and Softmax; the integer Unsqueeze stays as it is. A term
    that is not 0 at one of m = 0, 1 and at most -10000 at the other, or of a float input: none. Regression: none
    found (the term quantized at the grid of c)."""
    assert [n.name for n in masked_softmaxes(two_layer_hf_mask(low, source, one))] == want


def test_places_stand_where_their_nodes_stood_though_no_caller_holds_the_nodes():
    """``_placed`` replaces exactly the nodes given to ``_Places``, found by a list the caller no longer holds:
    protobuf makes a node's Python object anew once none holds it, and a freed object's id may be another node's
    (a rewrite keyed by bare ids replaced only the last node found, or another one)."""
    g = h.make_graph([h.make_node("Relu", [f"x{i}"], [f"x{i + 1}"], name=f"r{i}") for i in range(60)], "g", [], [])
    places = _Places()
    for i, n in enumerate(list(g.node)):  # each object found here is freed but for ``places``' hold
        if i % 7 == 0:
            places[n] = [h.make_node("Neg", list(n.input), list(n.output), name=f"n{i}")]
        elif i % 7 == 3:
            places[n] = []
    _placed(g, places)
    assert [n.name for n in g.node] == [f"n{i}" if i % 7 == 0 else f"r{i}" for i in range(60) if i % 7 != 3]
