"""onnxruntime's dynamic int8 models (quantize_dynamic: DynamicQuantizeLinear + MatMulInteger/ConvInteger + Cast +
Mul, com.microsoft DynamicQuantizeMatMul, MatMulIntegerToFloat, DynamicQuantizeLSTM): ``convert`` refuses them in
one line naming ``quantize``; ``quantize`` rewrites them as the float model they stand for (``app.dynamic``), each
weight dequantized as onnxruntime's DequantizeLinear computes it (the oracle), and keeps the weights' integers,
scales and zero points when it quantizes them again; the CVM model is as close to onnxruntime running the dynamic
model as onnxruntime's static quantized model is (1.1x)."""
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

from support.dynamic import cnn, dynamic, embedding, fused, integer_to_float, lstm, mlp

from cvm_onnx.app.dynamic import as_float
from cvm_onnx.app.quantize import outputs, quantize
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify

DYNAMIC = {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "DynamicQuantizeLSTM", "DynamicQuantizeMatMul",
           "MatMulIntegerToFloat"}


def run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {s.get_inputs()[0].name: x})


def dequantized(q: np.ndarray, s: np.ndarray, z: np.ndarray, axis: int) -> np.ndarray:
    """onnxruntime's DequantizeLinear of q by s and z (per tensor, or per channel along ``axis``): the oracle."""
    g = h.make_graph([h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=axis)], "dq", [],
                     [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(q, "q"), nh.from_array(s.reshape(-1) if s.size > 1 else s.reshape(()), "s"),
                      nh.from_array(z.reshape(-1) if z.size > 1 else z.reshape(()), "z")])
    return ort.InferenceSession(onnx_model(g, 13).SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {})[0]


def weights(model: onnx.ModelProto) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """quantize_dynamic's weights by their float name: (integers, scale, zero point)."""
    inits = {t.name: nh.to_array(t) for t in model.graph.initializer}
    return {k.removesuffix("_quantized"): (v, inits[k.replace("_quantized", "_scale")],
                                            inits[k.replace("_quantized", "_zero_point")])
            for k, v in inits.items() if k.endswith("_quantized")}


def read_weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The float weight each MatMul (input 1), Conv (input 1) and LSTM (inputs 1, 2: W, R) reads, by op, output
    and place."""
    inits = {t.name: nh.to_array(t) for t in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        for i in {"MatMul": [1], "Conv": [1], "LSTM": [1, 2]}.get(n.op_type, []):
            out[f"{n.op_type}:{n.output[0]}:{i}"] = inits[n.input[i]]
    return out


@st.composite
def cases(draw):
    kind = draw(st.sampled_from(["mlp", "cnn", "lstm"]))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    if kind == "mlp":
        model = mlp(rng, *(draw(st.integers(1, 9)) for _ in range(3)))
    elif kind == "cnn":
        model = cnn(rng, draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(3, 7)),
                    draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(0, 1)))
    else:
        model = lstm(rng, draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 4)),
                     draw(st.sampled_from(["forward", "reverse", "bidirectional"])))
    return kind, model, draw(st.booleans()), draw(st.sampled_from(["int8", "uint8"])), seed


@settings(max_examples=40, deadline=None)
@given(case=cases())
def test_the_float_model_holds_the_dynamic_weights_dequantized(case):
    """Every weight of the rewritten model is onnxruntime's DequantizeLinear of the dynamic model's integers (LSTM:
    transposed to ONNX's layout), no dynamic op is left, and it computes what the float model of those weights
    computes, element for element."""
    kind, model, per_channel, weight, seed = case
    dyn = dynamic(model, per_channel, weight)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(dyn)
    overrides = as_float(rewritten.graph)
    assert not {n.op_type for n in rewritten.graph.node} & DYNAMIC
    # the float model of the dequantized weights, built here from the original graph and the oracle
    oracle = onnx.ModelProto()
    oracle.CopyFrom(model)
    w = weights(dyn)
    for t in oracle.graph.initializer:
        if t.name in w:
            q, s, z = w[t.name]
            if kind == "lstm":  # (directions, inputs, 4 hidden), scales per direction or per direction and row
                f = np.stack([dequantized(q[d], s[d], z[d], 1) for d in range(q.shape[0])]).transpose(0, 2, 1)
            else:
                f = dequantized(q, s, z, 0 if kind == "cnn" else 1)
            t.CopyFrom(nh.from_array(f, t.name))
    got, want = read_weights(rewritten), read_weights(oracle)
    assert len(got) == len(want)
    assert sorted(a.tobytes() for a in got.values()) == sorted(a.tobytes() for a in want.values())
    x = np.random.default_rng(seed).normal(size=[d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim])
    [a], [b] = run(rewritten, x.astype(np.float32)), run(oracle, x.astype(np.float32))
    assert np.array_equal(a, b)
    # the products' weights keep their grids: one override per weight, per tensor or per channel as they were
    assert len(overrides) == (0 if kind == "lstm" else len(w))


@pytest.mark.parametrize("form", ["DynamicQuantizeMatMul", "MatMulIntegerToFloat"])
@pytest.mark.parametrize("per_channel, weight", [(False, "int8"), (True, "uint8")])
def test_fused_forms_are_the_same_float_model(form, per_channel, weight):
    """onnxruntime's fused spellings of the same dynamic MLP rewrite to the float model that its unfused spelling
    rewrites to: the same weights, the same outputs element for element."""
    rng = np.random.default_rng(5)
    dyn = dynamic(mlp(rng), per_channel, weight)
    other = fused(dyn) if form == "DynamicQuantizeMatMul" else integer_to_float(dyn)
    assert form in {n.op_type for n in other.graph.node}
    x = rng.normal(size=(1, 8)).astype(np.float32)
    [y_dyn], [y_other] = run(dyn, x), run(other, x)
    assert np.array_equal(y_dyn, y_other) or form == "DynamicQuantizeMatMul"  # its kernel rounds on its own
    a, b = onnx.ModelProto(), onnx.ModelProto()
    a.CopyFrom(dyn)
    b.CopyFrom(other)
    assert as_float(a.graph).keys() and as_float(b.graph).keys()
    assert sorted(w.tobytes() for w in read_weights(a).values()) == \
        sorted(w.tobytes() for w in read_weights(b).values())
    assert np.array_equal(run(a, x)[0], run(b, x)[0])


@pytest.mark.parametrize("kind", ["mlp", "cnn", "lstm"])
def test_convert_refuses_a_dynamic_model_in_one_line_naming_quantize(tmp_path, capsys, kind):
    """Before: one line per DynamicQuantizeLinear or DynamicQuantizeLSTM ("no CVM op") and one for the float input."""
    from cvm_onnx.app.cli import main

    onnx.save(dynamic({"mlp": mlp, "cnn": cnn, "lstm": lstm}[kind](np.random.default_rng(0)), False, "int8"),
              tmp_path / "d.onnx")
    assert main(["convert", str(tmp_path / "d.onnx"), "-o", str(tmp_path / "m")]) == UnsupportedError.exit_code
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "dynamic quantization" in err and "cvm-onnx quantize" in err
    assert ("DynamicQuantizeLSTM x1" if kind == "lstm" else "DynamicQuantizeLinear x") in err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("kind", ["mlp", "lstm"])
def test_the_dynamic_refusal_names_the_first_dynamic_node(kind):
    """The refusal's place is the first dynamic node, by name or, unnamed, by index and op type. Regression: it named
    no place (the quantized fuzzer's "unnamed UnsupportedError")."""
    from cvm_onnx.converters.from_onnx import import_model

    m = dynamic({"mlp": mlp, "lstm": lstm}[kind](np.random.default_rng(0)), False, "int8")
    op = "DynamicQuantizeLSTM" if kind == "lstm" else "DynamicQuantizeLinear"
    i, first = next((i, n) for i, n in enumerate(m.graph.node) if n.op_type == op)
    with pytest.raises(UnsupportedError) as e:
        import_model(m)
    assert [p.where for p in e.value.problems] == [first.name or f"node {i} ({op})"]
    first.name = ""
    with pytest.raises(UnsupportedError) as e:
        import_model(m)
    assert [p.where for p in e.value.problems] == [f"node {i} ({op})"]


def grids(model: onnx.ModelProto) -> list[tuple[bytes, bytes, bytes]]:
    """Each constant integer tensor a DequantizeLinear reads, with its scale and zero point (static model)."""
    inits = {t.name: nh.to_array(t) for t in model.graph.initializer}
    return [tuple(inits[x].astype(inits[x].dtype).tobytes() for x in n.input[:3]) for n in model.graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in inits and inits[n.input[0]].dtype.kind in "iu"
            and inits[n.input[0]].ndim >= 2]


@pytest.mark.parametrize("kind, per_channel, weight", [
    ("mlp", False, "int8"), ("mlp", True, "uint8"), ("cnn", False, "uint8"), ("cnn", True, "int8"),
    ("lstm", False, "int8"), ("lstm", True, "uint8")])
def test_quantize_takes_a_dynamic_model(tmp_path, kind, per_channel, weight):
    """Before: quantize_static failed on the dynamic model (KeyError: the scale of a DynamicQuantizeLinear, or
    DynamicQuantizeLSTM refused). Now it imports whole, the export is exact, the product weights keep the dynamic
    model's integers, scales and zero points, and on 24 held-out samples the CVM model is as close to onnxruntime
    running the dynamic model as onnxruntime's static quantized model is (1.1x)."""
    rng = np.random.default_rng(11)
    model = {"mlp": mlp, "cnn": cnn, "lstm": lstm}[kind](rng)
    dyn = dynamic(model, per_channel, weight)
    onnx.save(dyn, tmp_path / "d.onnx")
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    data = rng.normal(size=[32, *shape[1:]] if kind != "lstm" else [32, *shape]).astype(np.float32)
    np.save(tmp_path / "c.npy", data[:8])
    done = quantize(tmp_path / "d.onnx", tmp_path / "c.npy", tmp_path / "m", per_channel=per_channel)
    static = onnx.load_from_string(done.onnx_model)
    if kind != "lstm":  # the LSTM's weights stay float in the static model (the importer takes them to 16 bits)
        kept = set(grids(static))
        for q, s, z in weights(dyn).values():
            assert (q.tobytes(), s.tobytes(), z.tobytes()) in kept
    assert verify(done.imported.graph, seeds=1).exact
    held = data[8:].reshape(24, *shape)
    ref = np.stack([run(dyn, x)[0] for x in held])
    _, [q], [g] = outputs(done.float_model, done.onnx_model, done.imported, held)
    cvm, ort_static = np.abs(g - ref.reshape(g.shape)).mean(), np.abs(q - ref.reshape(q.shape)).mean()
    assert cvm <= 1.1 * ort_static, (cvm, ort_static)


def test_a_dynamic_quantization_of_another_form_is_refused_naming_it(tmp_path):
    """A DynamicQuantizeLinear whose outputs feed no product of quantize_dynamic's form (here its integers into an
    Add): one clear refusal naming the node, before anything runs."""
    g = h.make_graph([h.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"], name="dql"),
                      h.make_node("Cast", ["q"], ["f"], to=T.FLOAT), h.make_node("Mul", ["f", "s"], ["y"])],
                     "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)])
    onnx.save(onnx_model(g, 17), tmp_path / "d.onnx")
    np.save(tmp_path / "c.npy", np.ones((2, 4), np.float32))
    with pytest.raises(UnsupportedError, match=r"dql \(DynamicQuantizeLinear\)"):
        quantize(tmp_path / "d.onnx", tmp_path / "c.npy", tmp_path / "m")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("form, k", [("DynamicQuantizeMatMul", 2), ("MatMulIntegerToFloat", 3)])
def test_a_fused_dynamic_node_without_its_weight_scale_is_refused_naming_the_first_node_left(tmp_path, form, k):
    """The quantize fuzzer's cases: a DynamicQuantizeMatMul without its weight's scale, a MatMulIntegerToFloat
    without its own: refused in one line listing the nodes left, but with no place (the fuzzer counts it unnamed).
    The first node left is the place now."""
    dyn = dynamic(mlp(np.random.default_rng(5)), False, "int8")
    m = fused(dyn) if form == "DynamicQuantizeMatMul" else integer_to_float(dyn)
    next(n for n in m.graph.node if n.op_type == form).input[k] = ""
    onnx.save(m, tmp_path / "d.onnx")
    np.save(tmp_path / "c.npy", np.ones((2, 8), np.float32))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "d.onnx", tmp_path / "c.npy", tmp_path / "m")
    [p] = e.value.problems
    assert p.where and p.rule.startswith("onnxruntime's dynamic or weight-only quantization in a form not "
                                         f"rewritten as its float model: {p.where} ("), str(p)
    assert form in p.rule and not (tmp_path / "m").exists()


@pytest.mark.parametrize("per_channel", [False, True])
def test_the_qoperator_form_keeps_per_channel_grids_with_per_channel(tmp_path, per_channel):
    """The QOperator quantizer reads per-channel overrides only when it quantizes per channel: a dynamic MLP with
    uint8 weights per column imports whole either way (before this was handled: quantize_static's ValueError,
    'Expected tensor ... to use per-tensor quantization overrides'), its weights' grids kept with --per-channel."""
    rng = np.random.default_rng(4)
    dyn = dynamic(mlp(rng), True, "uint8")
    onnx.save(dyn, tmp_path / "d.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(8, 8)).astype(np.float32))
    done = quantize(tmp_path / "d.onnx", tmp_path / "c.npy", tmp_path / "m", per_channel=per_channel,
                    form="qoperator")
    assert verify(done.imported.graph, seeds=1).exact
    inits = [nh.to_array(t) for t in onnx.load_from_string(done.onnx_model).graph.initializer]
    kept = {a.tobytes() for a in inits}
    assert all(q.tobytes() in kept for q, _, _ in weights(dyn).values()) == per_channel


@pytest.mark.parametrize("weight", ["int8", "uint8"])
def test_an_embedding_read_as_integers_both_ways(tmp_path, weight):
    """quantize_dynamic's quantized embedding (Gather of its integers) read through a Transpose by MatMulInteger
    (its scale and zero point constants: no DynamicQuantizeLinear) and through a DequantizeLinear: the rewrite
    holds the embedding dequantized by onnxruntime's DequantizeLinear (the oracle) and computes what the float model
    of the dequantized weights computes, element for element; quantize imports it whole (before: 'the MatMul/Gemm
    input must hold 8-bit values', the integers read as they are), the export exact, as close to onnxruntime
    running the dynamic model as its static quantized model (1.1x)."""
    rng = np.random.default_rng(6)
    model = embedding(rng)
    dyn = dynamic(model, False, weight)
    assert {"MatMulInteger", "DequantizeLinear"} <= {n.op_type for n in dyn.graph.node}
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(dyn)
    as_float(rewritten.graph)
    assert not {n.op_type for n in rewritten.graph.node} & (DYNAMIC | {"DequantizeLinear"})
    oracle = onnx.ModelProto()
    oracle.CopyFrom(model)
    w = weights(dyn)
    for t in oracle.graph.initializer:
        q, s, z = w[t.name]
        t.CopyFrom(nh.from_array(dequantized(q, s, z, 1), t.name))
    ids = rng.integers(0, 20, (32, 1, 6)).astype(np.int64)
    for x in ids[:4]:
        assert np.array_equal(run(rewritten, x)[0], run(oracle, x)[0])
    onnx.save(dyn, tmp_path / "d.onnx")
    np.save(tmp_path / "c.npy", ids[:8, 0])
    done = quantize(tmp_path / "d.onnx", tmp_path / "c.npy", tmp_path / "m")
    assert verify(done.imported.graph, seeds=1).exact
    held = ids[8:]
    ref = np.stack([run(dyn, x)[0] for x in held])
    _, [q], [g] = outputs(done.float_model, done.onnx_model, done.imported, held)
    cvm, ort_static = np.abs(g - ref.reshape(g.shape)).mean(), np.abs(q - ref.reshape(q.shape)).mean()
    assert cvm <= 1.1 * ort_static, (cvm, ort_static)
