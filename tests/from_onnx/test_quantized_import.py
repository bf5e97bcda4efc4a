"""The quantized front: random small float models quantized by onnxruntime.quantization.quantize_static (QDQ and
QOperator forms, int8/uint8 activations, symmetric or not, per tensor or per channel, opsets 13..21) import
into CVM models whose integer outputs equal, exactly, a numpy oracle written here from docs/import.md
(integer accumulation, then each requantization with the multiplier, shifts and clip the import chose); every
requantization lies within its stated bound of the exact rational value; the models validate and export to
ONNX bit-exact; single-layer models agree with onnxruntime within one step. Bad input gets one clear error
naming the node."""
from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import Oracle, conv_layer, float_model, ort_session, quantized, small_qdq

import cvm_onnx
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import CVMError, FormatError, UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format import read_edges
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify

SETTINGS = settings(max_examples=12, deadline=None)


# -- properties -------------------------------------------------------------------------------------------------
CONFIG = st.fixed_dictionaries({
    "fmt": st.sampled_from(["QDQ", "QOperator"]), "activation": st.sampled_from(["int8", "uint8"]),
    "symmetric": st.booleans(), "per_channel": st.booleans(), "opset": st.sampled_from([13, 17, 19, 21])})
MODEL = st.fixed_dictionaries({
    "kind": st.sampled_from(["plain", "Add", "Mul", "Concat", "Pow"]), "seed": st.integers(0, 2**16),
    "group": st.sampled_from([1, 2, 4]), "stride": st.sampled_from([1, 2]),
    "pads": st.sampled_from([(1, 1, 1, 1), (0, 0, 0, 0), (0, 1, 2, 0)]),
    "pool": st.sampled_from(["max", "avg", "global"]), "head": st.sampled_from(["gemm", "matmul", "sigmoid"])})


@SETTINGS
@given(config=CONFIG, spec=MODEL, seed=st.integers(0, 2**16))
def test_import_equals_the_oracle_and_exports_exactly(tmp_path_factory, config, spec, seed):
    tmp = tmp_path_factory.mktemp("q")
    fm = float_model(opset=config["opset"], **spec)
    qm, shape = quantized(fm, tmp, config["fmt"], config["activation"], config["symmetric"], config["per_channel"])
    imp = import_model(qm)
    edges = imp.edges
    oracle = Oracle(qm, imp)
    rng = np.random.default_rng(seed)
    for x in [rng.normal(size=shape).astype(np.float32) * 2, np.zeros(shape, np.float32)]:
        q = edges.input.quantize(x)
        got = execute(imp.graph, {"data": q})
        want = oracle.run(q)
        for g_, w_, e in zip(got, want, edges.outputs):
            assert w_[0] == "real" and w_[1].dtype == np.int64  # (q - zero) of the last DequantizeLinear
            assert np.array_equal(g_ - e.zero_point, w_[1].reshape(g_.shape))
    assert verify(imp.graph, seeds=1).exact


@settings(max_examples=10, deadline=None)
@given(config=CONFIG, seed=st.integers(0, 2**16), heads=st.integers(1, 3), m=st.integers(1, 5),
       k=st.integers(1, 9))
def test_matmul_of_two_computed_tensors_equals_the_oracle(tmp_path_factory, config, seed, heads, m, k):
    """Attention's products (PP-OCRv4's recognizer): x (1, heads, m, k) times its own transpose through a conv,
    both computed, quantized per tensor; the import equals the oracle's exact integer products and requantization
    and exports exactly."""
    rng = np.random.default_rng(seed)
    nodes, inits = conv_layer(rng, "c", "x", heads, heads, k=1, pads=(0, 0, 0, 0))
    nodes += [h.make_node("Transpose", ["c"], ["ct"], perm=[0, 1, 3, 2]), h.make_node("MatMul", ["x", "ct"], ["y"])]
    g = h.make_graph(nodes, "att", [h.make_tensor_value_info("x", T.FLOAT, [1, heads, m, k])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    fm = onnx_model(g, config["opset"])
    qm, shape = quantized(fm, tmp_path_factory.mktemp("att"), config["fmt"], config["activation"],
                          config["symmetric"], config["per_channel"])
    imp = import_model(qm)
    oracle = Oracle(qm, imp)
    for x in [rng.normal(size=shape).astype(np.float32) * 2, np.zeros(shape, np.float32)]:
        q = imp.edges.input.quantize(x)
        [got] = execute(imp.graph, {"data": q})
        [want] = oracle.run(q)
        assert got.shape == want[1].shape == (1, heads, m, m)
        assert np.array_equal(got - imp.edges.outputs[0].zero_point, want[1])
    assert verify(imp.graph, seeds=1).exact


# -- onnxruntime, one layer at a time -------------------------------------------------------------------------------
@settings(max_examples=8, deadline=None)
@given(form=st.sampled_from([("QDQ", "int8"), ("QDQ", "uint8"), ("QOperator", "uint8")]),
       symmetric=st.booleans(), per_channel=st.booleans(), seed=st.integers(0, 2**16),
       op=st.sampled_from(["conv", "gemm"]))
def test_one_layer_agrees_with_onnxruntime_within_one_step(tmp_path_factory, form, symmetric, per_channel, seed,
                                                           op):
    """Against onnxruntime with session.x64quantprecision (exact integer kernels on every CPU), which has no
    int8-activation QLinearConv: the QOperator form is compared with uint8 activations only (the oracle test
    covers both)."""
    fmt, activation = form
    rng = np.random.default_rng(seed)
    if op == "conv":
        nodes, inits = conv_layer(rng, "y", "x", 3, 4)
        shape = [1, 3, 5, 5]
    else:
        inits = [nh.from_array(rng.normal(size=(6, 4)).astype(np.float32), "w"),
                 nh.from_array(rng.normal(size=(4,)).astype(np.float32), "b")]
        nodes, shape = [h.make_node("Gemm", ["x", "w", "b"], ["y"])], [1, 6]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, shape)],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    fm = onnx_model(g, 17)
    qm, shape = quantized(fm, tmp_path_factory.mktemp("q"), fmt, activation, symmetric, per_channel)
    imp = import_model(qm)
    sess = ort_session(qm)
    out = imp.edges.outputs[0]
    for _ in range(3):
        x = rng.normal(size=shape).astype(np.float32) * 3
        [want] = sess.run(None, {"x": x})
        [got] = cvm_onnx.run_cvm(imp.graph, x, imp.edges)
        assert got.dtype == np.float32
        steps = np.rint(np.abs(got.astype(np.float64) - want) / float(out.scale))
        assert steps.max() <= 1


# -- the float edges --------------------------------------------------------------------------------------------
def test_input_quantization_is_onnxruntime_quantize_linear():
    """Edge.quantize against onnxruntime's QuantizeLinear on values at and around every tie."""
    from cvm_onnx.core.format import Edge

    for dtype, zero in (("uint8", 131), ("int8", -7)):
        e = Edge("data", dtype, np.array(0.0625, np.float32), np.array(zero))
        x = (np.arange(-4200, 4200, dtype=np.float32) / 512).reshape(1, -1)
        elem = T.UINT8 if dtype == "uint8" else T.INT8
        g = h.make_graph([h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])], "q",
                         [h.make_tensor_value_info("x", T.FLOAT, list(x.shape))],
                         [h.make_tensor_value_info("q", elem, None)],
                         [nh.from_array(np.array(0.0625, np.float32), "s"),
                          h.make_tensor("z", elem, [], [zero])])
        [want] = ort_session(onnx_model(g, 17)).run(None, {"x": x})
        assert np.array_equal(e.quantize(x), want.astype(np.int32))


def test_convert_writes_edges_and_run_takes_floats_or_integers(tmp_path):
    qm = small_qdq(tmp_path)
    src = tmp_path / "m.onnx"
    onnx.save(qm, src)
    cvm_onnx.convert(src, tmp_path / "m")
    edges = read_edges(tmp_path / "m")
    assert edges.input.type == "uint8" and edges.outputs[0] is not None
    model = cvm_onnx.load(tmp_path / "m")
    heads = [model.graph.nodes[h.node].name for h in model.graph.heads]
    assert heads == [o.name for o in qm.graph.output]  # named as the source model's outputs
    x = np.random.default_rng(0).normal(size=(1, 2, 4, 4)).astype(np.float32)
    [yf] = cvm_onnx.run_cvm(model.graph, x, model.edges)
    [yi] = cvm_onnx.run_cvm(model.graph, edges.input.quantize(x).astype(np.int32), model.edges)
    assert yf.dtype == np.float32 and yi.dtype == np.int32
    assert np.array_equal(yf, edges.outputs[0].dequantize(yi))
    [want] = ort_session(qm).run(None, {"x": x})
    assert np.abs(yf - want).max() <= float(edges.outputs[0].scale) * 1.0001
    cvm_onnx.write_model(model.graph, tmp_path / "m")  # a plain model: the edges go
    assert read_edges(tmp_path / "m") is None


def test_cli_run_writes_float32_outputs(tmp_path):
    from cvm_onnx.app.cli import main

    onnx.save(small_qdq(tmp_path), tmp_path / "m.onnx")
    assert main(["convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m"), "--report",
                 str(tmp_path / "r.md")]) == 0
    report = (tmp_path / "r.md").read_text()
    assert "Requantizations" in report and "conv2d" in report
    np.save(tmp_path / "x.npy", np.ones((1, 2, 4, 4), np.float32))
    assert main(["run", str(tmp_path / "m"), "--input", str(tmp_path / "x.npy"), "--output",
                 str(tmp_path / "o.npz")]) == 0
    [y] = np.load(tmp_path / "o.npz").values()
    assert y.dtype == np.float32


# -- refusals ---------------------------------------------------------------------------------------------------
def problems(model, **kw) -> str:
    with pytest.raises(CVMError) as e:
        import_model(model, **kw)
    return str(e.value)


def edited(model, fn):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    fn(m)
    return m


def set_init(m, name, value):
    for i, t in enumerate(m.graph.initializer):
        if t.name == name:
            m.graph.initializer[i].CopyFrom(nh.from_array(value, name))


@pytest.mark.parametrize("bad", [0.0, -0.5, np.inf, np.nan])
def test_bad_scales_are_refused_naming_the_node(tmp_path, bad):
    qm = small_qdq(tmp_path)
    inits = {t.name: nh.to_array(t) for t in qm.graph.initializer}
    dq = next(n for n in qm.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "y_w_quantized")
    scale = inits[dq.input[1]].copy()
    scale.reshape(-1)[-1] = bad
    msg = problems(edited(qm, lambda m: set_init(m, dq.input[1], scale)))
    assert dq.name in msg and "finite and > 0" in msg
    q = next(n for n in qm.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    msg = problems(edited(qm, lambda m: set_init(m, q.input[1], np.array(bad, np.float32))))
    assert q.name in msg and "must be finite and > 0" in msg


def test_run_time_scale_is_refused(tmp_path):
    qm = small_qdq(tmp_path)
    q = [n for n in qm.graph.node if n.op_type == "QuantizeLinear"][-1]

    def fn(m):  # the scale: the largest quantized input value, as a float
        node = next(n for n in m.graph.node if n.name == q.name)
        node.input[1] = "runtime_scale"
        first = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
        m.graph.node.insert(1, h.make_node("ReduceMax", [first.output[0]], ["peak"], keepdims=0))
        m.graph.node.insert(2, h.make_node("Cast", ["peak"], ["runtime_scale"], to=T.FLOAT))
    msg = problems(edited(qm, fn))
    assert q.name in msg and "run time" in msg


def test_a_float_input_read_otherwise_is_refused_naming_its_readers():
    """A float input that is not a quantized model's (read by a Sigmoid; quantized by a scale computed from it at
    run time): the refusal names each node that reads it so, and what computes the scale."""
    x = h.make_tensor_value_info("x", T.FLOAT, [1, 4])
    y = h.make_tensor_value_info("y", T.FLOAT, [1, 4])
    only = ("CVM takes a float input only where QuantizeLinear quantizes it (a quantized model, as "
            "onnxruntime.quantization writes it)")
    nodes = [h.make_node("Sigmoid", ["x"], ["s"], name="sig"), h.make_node("Neg", ["x"], ["n"]),
             h.make_node("Add", ["s", "n"], ["y"], name="add")]
    m = onnx_model(h.make_graph(nodes, "g", [x], [y]), 17)
    assert problems(m) == f"x: the float input is read by Sigmoid 'sig', Neg (unnamed, node 1): {only}"
    nodes = [h.make_node("ReduceMax", ["x"], ["m"], name="absmax", keepdims=0),
             h.make_node("Div", ["m", "k"], ["scale"], name="div"),
             h.make_node("QuantizeLinear", ["x", "scale", "z"], ["q"], name="q"),
             h.make_node("DequantizeLinear", ["q", "scale", "z"], ["y"], name="dq")]
    inits = [nh.from_array(np.array(127, np.float32), "k"), nh.from_array(np.array(0, np.int8), "z")]
    m = onnx_model(h.make_graph(nodes, "g", [x], [y], inits), 17)
    assert problems(m) == (f"x: the float input is read by ReduceMax 'absmax': {only}; QuantizeLinear 'q' quantizes "
                           "the float input by a scale or zero point computed at run time (by Div 'div'): CVM needs "
                           "them constant")


def test_float_ops_after_the_last_dequantize_are_refused_all_at_once_and_outputs_cut(tmp_path):
    qm = small_qdq(tmp_path)

    def fn(m):
        m.graph.node.append(h.make_node("Det", ["y"], ["s"], name="det"))
        m.graph.node.append(h.make_node("MeanVarianceNormalization", ["y"], ["l"], name="mvn"))
        del m.graph.output[:]
        m.graph.output.extend([h.make_tensor_value_info("s", T.FLOAT, None),
                               h.make_tensor_value_info("l", T.FLOAT, None)])
    m = edited(qm, fn)
    msg = problems(m)
    assert "det" in msg and "mvn" in msg
    imp = import_model(m, outputs=["y"])
    assert imp.edges.outputs[0] is not None
    with pytest.raises(UnsupportedError, match="nope"):
        import_model(m, outputs=["nope"])


@pytest.fixture(scope="module")
def qoperator_model(tmp_path_factory):
    """A QOperator model with com.microsoft nodes (QLinearConcat, QGemm, QLinearGlobalAveragePool) besides
    QLinearConv: onnx knows no schema for that domain, so only the rules' typed readers guard their attributes."""
    fm = float_model("Concat", seed=1, opset=17, group=1, stride=1, pads=(1, 1, 1, 1), pool="global", head="gemm")
    return quantized(fm, tmp_path_factory.mktemp("qop"), "QOperator", "uint8", False, False)[0]


def test_every_attribute_of_a_quantized_node_retyped_is_refused_naming_it(qoperator_model):
    """Each attribute of each quantized node given as a string: one clear refusal naming the node and the
    attribute, by the schema check (ai.onnx) or the rule's typed reader (com.microsoft). QLinearConcat's axis as
    a string was an internal TypeError: the quantized rules read attributes untyped."""
    cases = [(i, a.name) for i, n in enumerate(qoperator_model.graph.node) if n.op_type.startswith("Q")
             and n.op_type not in ("QuantizeLinear",) for a in n.attribute]
    assert any(qoperator_model.graph.node[i].domain == "com.microsoft" for i, _ in cases)

    def retype(i, name):
        def fn(m):
            [a] = [a for a in m.graph.node[i].attribute if a.name == name]
            a.type, a.s = onnx.AttributeProto.STRING, b"x"
            a.ClearField("i"), a.ClearField("f"), a.ClearField("ints")
        return fn

    for i, name in cases:
        node = qoperator_model.graph.node[i]
        with pytest.raises((FormatError, UnsupportedError), match=rf"\({node.op_type}\).*{name} must be"):
            import_model(edited(qoperator_model, retype(i, name)))


def test_a_product_operand_wider_than_cvm_allows_is_refused(tmp_path):
    """int16 activations into a Conv: CVM's conv2d takes 8-bit operands (two halves of 9 bits at most)."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, size=(2, 2, 3, 3)).astype(np.int8)
    g = h.make_graph(
        [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"], name="dqx"),
         h.make_node("DequantizeLinear", ["w", "s"], ["wf"], name="dqw"),
         h.make_node("Conv", ["xf", "wf"], ["c"], name="conv16", pads=[1, 1, 1, 1]),
         h.make_node("QuantizeLinear", ["c", "s", "z"], ["y"], name="qy")],
        "m", [h.make_tensor_value_info("x", T.INT16, [1, 2, 4, 4])], [h.make_tensor_value_info("y", T.INT16, None)],
        [nh.from_array(np.array(0.5, np.float32), "s"), nh.from_array(np.array(0, np.int16), "z"),
         nh.from_array(w, "w")])
    msg = problems(onnx_model(g, 21), input_precision=16)
    assert "conv16" in msg and "8-bit operands" in msg


def test_a_clip_off_the_grid_is_deferred_to_the_quantize_linear(tmp_path):
    """Relu6 whose bound 6 is not on the input's grid: y = clip(Q(x), Q(0), Q(6)) (rounding commutes)."""
    s = 0.7
    g = h.make_graph(
        [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
         h.make_node("Clip", ["xf", "lo", "hi"], ["c"]),
         h.make_node("QuantizeLinear", ["c", "so", "z"], ["y"])],
        "m", [h.make_tensor_value_info("x", T.INT8, [1, 255])], [h.make_tensor_value_info("y", T.INT8, None)],
        [nh.from_array(np.array(s, np.float32), "s"), nh.from_array(np.array(0, np.int8), "z"),
         nh.from_array(np.array(0.25, np.float32), "so"), nh.from_array(np.array(0.0, np.float32), "lo"),
         nh.from_array(np.array(6.0, np.float32), "hi")])
    m = onnx_model(g, 17)
    x = np.arange(-127, 128, dtype=np.int8).reshape(1, 255)
    [want] = ort_session(m).run(None, {"x": x})
    [got] = execute(import_model(m, input_precision=8).graph, {"data": x.astype(np.int32)})
    assert np.abs(got - want.astype(np.int32)).max() <= 1
    assert got.max() == 24  # 6 / 0.25


# -- cvm-onnx quantize ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["minmax", "percentile"])
def test_quantize_command_calibrates_imports_and_compares(tmp_path, capsys, method):
    from cvm_onnx.app.cli import main

    rng = np.random.default_rng(5)
    nodes, inits = conv_layer(rng, "c", "x", 2, 3)
    nodes += [h.make_node("Relu", ["c"], ["r"]), h.make_node("Flatten", ["r"], ["f"])]
    inits.append(nh.from_array(rng.normal(size=(48, 4)).astype(np.float32), "w"))
    nodes.append(h.make_node("MatMul", ["f", "w"], ["y"]))
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    onnx.save(onnx_model(g, 17), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(6, 2, 4, 4)).astype(np.float32))
    args = ["quantize", str(tmp_path / "f.onnx"), "--calibration", str(tmp_path / "c.npy"), "-o",
            str(tmp_path / "m"), "--method", method, "--per-channel", "--save-onnx", str(tmp_path / "q.onnx")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "6 calibration samples" in out and "top-1 agreement" in out
    model = cvm_onnx.load(tmp_path / "m")
    x = rng.normal(size=(1, 2, 4, 4)).astype(np.float32)
    [got] = cvm_onnx.run_cvm(model.graph, x, model.edges)
    [want] = ort_session(onnx.load(tmp_path / "q.onnx")).run(None, {"x": x})
    assert np.abs(got - want).max() <= float(model.edges.outputs[0].scale) * 1.0001
    np.save(tmp_path / "bad.npy", np.zeros((3, 5), np.float32))
    assert main(args[:3] + [str(tmp_path / "bad.npy")] + args[4:]) == 2
    assert "calibration samples must be floats of shape (N, 2, 4, 4)" in capsys.readouterr().err


def test_quantized_model_has_the_ir_version_its_opsets_need(tmp_path):
    """A float model stamped with a newer IR version than its opset needs (onnx 1.23's make_model stamps 14):
    the quantized model saved carries the IR version its opset needs, so an older onnxruntime reads it too."""
    from cvm_onnx.app.quantize import quantize
    from cvm_onnx.converters.from_onnx.checks import supported_versions

    rng = np.random.default_rng(6)
    nodes, inits = conv_layer(rng, "y", "x", 2, 3)
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=supported_versions()[0]),
              tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(3, 2, 4, 4)).astype(np.float32))
    quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m", save_onnx=tmp_path / "q.onnx")
    assert onnx.load(tmp_path / "q.onnx").ir_version == 8 < supported_versions()[0]


def test_a_float_model_stamped_newer_than_onnxruntime_reads_quantizes(tmp_path):
    """A float model stamped with an IR version the installed onnxruntime cannot load (onnx 1.23's make_model stamps
    14, onnxruntime 1.31 reads 13) quantizes at the IR version its opset needs. Regression: "onnxruntime cannot load
    the float model" at the lowest versions."""
    from cvm_onnx.app.quantize import quantize
    from cvm_onnx.converters.from_onnx.checks import supported_versions

    rng = np.random.default_rng(8)
    nodes, inits = conv_layer(rng, "y", "x", 2, 3)
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=supported_versions()[0] + 1),
              tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(3, 2, 4, 4)).astype(np.float32))
    quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m", save_onnx=tmp_path / "q.onnx")
    assert onnx.load(tmp_path / "q.onnx").ir_version == 8


# -- the requantization plan ------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(lo=st.integers(-(1 << 30), 0), span=st.integers(1, (1 << 31) - 1),
       ratios=st.lists(st.floats(2.0**-40, 2.0**8, width=32), min_size=1, max_size=3),
       out=st.sampled_from([(-128, 127), (0, 255), (-32768, 32767)]), zero=st.integers(-5, 5), seed=st.integers(0, 99))
@example(lo=-2871364, span=1, ratios=[1.0, 46.743568420410156], out=(-128, 127), zero=0, seed=0)
@example(lo=0, span=1, ratios=[0.5], out=(-128, 127), zero=0, seed=0)  # a tie (v = 1): the exact plan, k = 1
def test_plan_meets_the_precision_rules_and_its_bound(lo, span, ratios, out, zero, seed):
    """Any accumulator interval within 32 bits and ratios from 2^-40 to 2^8: the plan keeps broadcast_mul within
    32 bits and cvm_right_shift consistent across devices, and on integers across the interval (its ends, 0
    and random ones) r is within plan.error of v * M wherever the output does not saturate; beyond the clip the
    result saturates as unclipped arithmetic would. Into 8 bits from sums within 30 bits, where no one plan holds
    every ratio, runs of channels do, and a single ratio always has a plan."""
    from cvm_onnx.converters.from_onnx.requant_plans import NoPlan, plan, round_half_up, runs, tight

    hi = min(lo + span, (1 << 31) - 1)
    zero = min(max(zero, out[0]), out[1])  # a zero point lies within its type (zero_of refuses others)
    ms = np.array([Fraction(r) for r in ratios], dtype=object)
    low, high = out[0] - zero, out[1] - zero
    try:
        p = plan([(lo, hi, ms)], low, high)
    except NoPlan:  # into 8 bits, a single ratio always has a plan; several too spread for one have runs
        if out[1] - out[0] > 255 or max(-lo, hi) >= 1 << 29:
            return  # refused with a clear error (16-bit outputs or 31-bit sums leave too few bits for m)
        assert len(ms) > 1
        parts = runs(lo, hi, ms, low, high)
        assert sorted(np.concatenate([r.channels for r in parts])) == list(range(len(ms)))
        assert all(r.plan.delta < Fraction(1, 2) for r in parts)
        return
    clip = p.clip or (lo, hi)
    assert clip[0] < clip[1] or p.clip is None  # CVM's clip needs a_min < a_max
    b1 = (max(-clip[0], clip[1], 1) + ((1 << p.pre_shift) >> 1)) >> p.pre_shift
    if not p.split:  # a two-part plan's labels: test_requant_split
        assert max(tight(b1), p.pre_precision) + tight(int(p.multipliers[0].max())) <= 32
        if p.precision + p.shift < 31 and not p.even:  # k is the largest the rules allow for its pre-shift (a
            # tie-rounding plan's k is the largest a of M = p / 2^a: docs/import.md, "Ties")
            assert p.pre_precision + tight(round_half_up(max(ms) * (1 << (p.pre_shift + p.shift + 1)))) > 32
    last = p.shift - p.split  # the final cvm_right_shift's (after a two-part product's low part: b)
    assert p.precision + last <= 31 and last >= 1 and p.pre_precision + p.pre_shift <= 31
    rng = np.random.default_rng(seed)
    v = np.unique(np.concatenate([[lo, hi, 0, clip[0], clip[1]], rng.integers(lo, hi + 1, 200)]).clip(lo, hi))
    v = v.astype(np.int64)[:, None]
    w = np.clip(v, *clip)
    if p.pre_shift:
        w = (w + (1 << (p.pre_shift - 1))) >> p.pre_shift
    r = (w * p.multipliers[0][None, :] + (1 << (p.shift - 1))) >> p.shift
    exact = v.astype(object) * ms[None, :]
    inside = (exact >= low - 1) & (exact <= high + 1)
    assert all(abs(int(a) - e) <= p.error for a, e in zip(r[inside], exact[inside]))
    saturated = np.clip(r, low, high)
    assert np.array_equal(saturated[exact > high + 1], np.full((exact > high + 1).sum(), high))
    assert np.array_equal(saturated[exact < low - 1], np.full((exact < low - 1).sum(), low))


def test_a_deferred_clip_above_zero_keeps_per_channel_requantization_exact():
    """Clip(min=1.0) off the grid before a per-channel requantization: the plan's clip is taken for the type's
    range (which holds the zero point), the Clip's bounds only at the end (regression: a clip bound above zero
    once fed the plan and clipped a channel of larger M before it saturated)."""
    s = np.array([0.3, 0.05], np.float32)
    g = h.make_graph(
        [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"], axis=1),
         h.make_node("Clip", ["xf", "lo"], ["c"]),
         h.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"])],
        "m", [h.make_tensor_value_info("x", T.INT8, [1, 2, 255])], [h.make_tensor_value_info("y", T.UINT8, None)],
        [nh.from_array(s, "s"), nh.from_array(np.zeros(2, np.int8), "z"), nh.from_array(np.array(0.07, np.float32), "so"),
         nh.from_array(np.array(0, np.uint8), "zo"), nh.from_array(np.array(1.01, np.float32), "lo")])
    m = onnx_model(g, 17)
    x = np.broadcast_to(np.arange(-127, 128, dtype=np.int8), (1, 2, 255)).copy()
    [got] = execute(import_model(m, input_precision=8).graph, {"data": x.astype(np.int32)})
    real = np.maximum(x.astype(np.float64) * s.astype(np.float64).reshape(1, 2, 1), 1.01)
    exact = np.clip(np.rint(real / np.float64(np.float32(0.07))), 0, 255)
    assert np.abs(got - exact).max() <= 1


DIGITS = Path(__file__).resolve().parents[2] / "models" / "digits_cnn"


@pytest.mark.parametrize("form", [dict(), dict(optimize=True, batch=16)])
def test_an_export_keeps_the_float_edges_for_run_and_for_the_import_back(tmp_path, form, capsys):
    """CVM -> ONNX keeps quantization.json in the metadata cvm.quantization: `run` on the .onnx takes float
    images as `run` on the CVM model does (the same float32 logits), and ONNX -> CVM writes the file back."""
    from cvm_onnx.app.cli import main
    from cvm_onnx.runtime.bulk import run_many

    assert main(["convert", str(DIGITS), "-o", str(tmp_path / "d.onnx"), *(["--optimize"] if form else []),
                 *(["--batch", "16"] if form else [])]) == 0
    model = onnx.load(tmp_path / "d.onnx")
    assert main(["info", str(tmp_path / "d.onnx")]) == 0
    kept = {p.key: p.value for p in model.metadata_props}["cvm.quantization"]
    assert kept.encode() == (DIGITS / "quantization.json").read_bytes()
    assert "float edges (metadata cvm.quantization)" in capsys.readouterr().out
    images = np.load(DIGITS / "calibration.npy")[:37]
    loaded = cvm_onnx.load(DIGITS)
    want = run_many(loaded.graph, images, edges=loaded.edges).arrays
    got = run_many(model, images, chunk=16).arrays
    assert got[0].dtype == np.float32 and np.array_equal(got[0], want[0])
    if not form:  # the serving form is not importable back
        cvm_onnx.convert(tmp_path / "d.onnx", tmp_path / "back")
        for name in ("symbol", "params", "quantization.json"):
            assert (tmp_path / "back" / name).read_bytes() == (DIGITS / name).read_bytes(), name


@pytest.mark.parametrize("value, message", [("{", "cannot read the quantization edges"),
                                            ('{"format": "x"}', "not a cvm-onnx quantization file"),
                                            (None, "2 output edges for a model of 1 outputs")])
def test_bad_kept_edges_are_refused_naming_the_metadata(tmp_path, value, message):
    from cvm_onnx.runtime.bulk import run_many

    model = cvm_onnx.to_onnx(cvm_onnx.load(DIGITS).graph)
    edges = (DIGITS / "quantization.json").read_text()
    if value is None:  # a second output edge, for a model of one output
        doc = json.loads(edges)
        value = json.dumps({**doc, "outputs": doc["outputs"] * 2})
    model.metadata_props.add(key="cvm.quantization", value=value)
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(FormatError, match=message) as e:
        cvm_onnx.convert(tmp_path / "m.onnx", tmp_path / "back")
    assert "metadata cvm.quantization" in str(e.value)
    with pytest.raises(FormatError, match=message):
        run_many(model, np.load(DIGITS / "calibration.npy")[:2])


# -- per-channel requantization of any spread ---------------------------------------------------------------------
def qdq_conv(w: np.ndarray, sw: np.ndarray, sx: float, zx: int, xtype: int, so: float, zo: int, otype: int,
             group: int = 1, bias: np.ndarray | None = None, pads=(1, 1, 1, 1), strides=(1, 1), name="conv"):
    """DequantizeLinear(x), DequantizeLinear(w) per output channel [, bias], Conv, QuantizeLinear: one QDQ layer."""
    xnp = np.int8 if xtype == T.INT8 else np.uint8
    onp = {T.INT8: np.int8, T.UINT8: np.uint8, T.INT16: np.int16}[otype]
    nodes = [h.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"], name="dqx"),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"], name="dqw", axis=0),
             h.make_node("Conv", ["xf", "wf"] + (["bf"] if bias is not None else []), ["cf"], name=name,
                         group=group, pads=list(pads), strides=list(strides)),
             h.make_node("QuantizeLinear", ["cf", "so", "zo"], ["y"], name="q")]
    inits = [nh.from_array(np.array(sx, np.float32), "sx"), nh.from_array(np.array(zx, xnp), "zx"),
             nh.from_array(w.astype(np.int8), "w"), nh.from_array(sw.astype(np.float32), "sw"),
             nh.from_array(np.array(so, np.float32), "so"), nh.from_array(np.array(zo, onp), "zo")]
    if bias is not None:
        nodes.insert(2, h.make_node("DequantizeLinear", ["b", "sb"], ["bf"], name="dqb", axis=0))
        inits += [nh.from_array(bias.astype(np.int32), "b"),
                  nh.from_array((np.float32(sx) * sw.astype(np.float32)).astype(np.float32), "sb")]
    c = w.shape[1] * group
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", xtype, [1, c, 5, 5])],
                     [h.make_tensor_value_info("y", otype, None)], inits)
    return onnx_model(g, 17)


def oracle_equal(m: onnx.ModelProto, x: np.ndarray, precision: int = 9):
    """The import on the reference executor equals the oracle (which checks each requantization's bound)."""
    imp = import_model(m, input_precision=precision)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    [want] = Oracle(m, imp).run(x.astype(np.int64))
    assert np.array_equal(got, want[1].reshape(got.shape)), (got, want)
    return imp


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), c_in=st.sampled_from([1, 8, 32]), c_out=st.integers(2, 12),
       spread=st.floats(6, 24), low=st.floats(-30, -4), out=st.sampled_from([T.INT8, T.UINT8]))
def test_per_channel_requantization_of_any_spread_equals_the_oracle(seed, c_in, c_out, spread, low, out):
    """Per-channel weight scales spread up to 2^20 apart (the issue's M in [0.000467, 0.129] and far wider): channels
    no single shift holds are requantized in runs, each within its plan's bound of the exact value (the oracle
    checks it) and equal to the oracle element for element; regression: such a layer was refused."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, size=(c_out, c_in, 3, 3))
    w[:, :, 1, 1] = 127  # large accumulators: the clip and the shift matter
    sw = np.float32(2.0) ** rng.uniform(low, low + spread, c_out).astype(np.float32)
    bias = rng.integers(-2000, 2000, c_out)
    m = qdq_conv(w, sw, 0.02, 3, T.INT8, 0.05, 0 if out == T.INT8 else 128, out, bias=bias)
    x = rng.integers(-128, 128, size=(1, c_in, 5, 5))
    x[..., 2, 2] = 127
    imp = oracle_equal(m, x)
    assert verify(imp.graph, x.astype(np.int32)).exact


def test_the_issues_spread_of_channel_scales_is_requantized_in_runs():
    """M in [0.000467, 0.129] over a 32-channel 3x3 accumulator: one one-part plan cannot hold it (the issue's
    refusal), runs of channels can, and so can one two-part plan."""
    from cvm_onnx.converters.from_onnx.requant_plans import SPLIT, NoPlan, plan, runs

    ms = np.array([Fraction(0.000467) * (Fraction(0.129) / Fraction(0.000467)) ** Fraction(i, 7) for i in range(8)],
                  dtype=object)
    ms = np.array([Fraction(float(v)) for v in ms], dtype=object)
    with pytest.raises(NoPlan):
        plan([(-(127 * 128 * 288), 127 * 128 * 288, ms)], -128, 127, split_above=None)
    assert plan([(-(127 * 128 * 288), 127 * 128 * 288, ms)], -128, 127, split_above=SPLIT).split
    parts = runs(-(127 * 128 * 288), 127 * 128 * 288, ms, -128, 127)
    assert len(parts) > 1 and sorted(np.concatenate([r.channels for r in parts])) == list(range(8))
    assert all(r.plan.delta < Fraction(1, 2) for r in parts)


@settings(max_examples=25, deadline=None)
@given(lo=st.integers(-(1 << 24), -1), hi=st.integers(1, 1 << 24),
       ratios=st.lists(st.floats(2.0**-16, 2.0**-1, width=32), min_size=2, max_size=12),
       target=st.sampled_from([Fraction(1, 2), Fraction(1, 16), Fraction(1, 64), Fraction(1, 1024)]),
       out=st.sampled_from([(-128, 127), (0, 255)]))
def test_runs_meet_their_target_where_a_channel_alone_can(lo, hi, ratios, target, out):
    """runs(..., target): every channel in exactly one run, each run's plan within the precision rules (plan) and
    its delta at most the target or, where its first channel alone cannot reach the target, that channel's own
    delta; each run is the longest such prefix of the channels sorted by M."""
    from cvm_onnx.converters.from_onnx.requant_plans import NoPlan, plan, runs

    ms = np.array([Fraction(r) for r in ratios], dtype=object)
    parts = runs(lo, hi, ms, *out, target)
    assert sorted(np.concatenate([r.channels for r in parts])) == list(range(len(ms)))
    order = sorted(range(len(ms)), key=lambda i: ms[i])
    start = 0
    for r in parts:
        assert list(r.channels) == order[start:start + len(r.channels)]
        alone = plan([(lo, hi, ms[r.channels[:1]])], *out).delta
        bound = max(target, alone)
        assert r.plan.delta <= bound and r.plan.delta < Fraction(1, 2)
        start += len(r.channels)
        if start < len(ms):  # the run could not take the next channel within its bound
            longer = order[start - len(r.channels):start + 1]
            try:
                assert plan([(lo, hi, ms[longer])], *out).delta > bound
            except NoPlan:
                pass


def test_widely_spread_channel_scales_are_requantized_finely():
    """A per-channel layer with the detector's spread of ratios (PP-OCRv4's conv2d_455: M in [0.00039, 0.029]):
    one one-part plan holds every channel only with delta 0.36 (a result off round(v M) for about a third of the
    values near a half-integer); one two-part plan (or runs) requantizes every channel within FINE and equals the
    oracle. Regression: the import kept the one plan (its CVM model 1.5x as far from the float model as
    onnxruntime's)."""
    from cvm_onnx.converters.from_onnx.quantized.qdq import FINE

    rng = np.random.default_rng(5)
    c_out = 8
    w = rng.integers(-127, 128, size=(c_out, 16, 3, 3))
    sw = (np.float32(0.05 * 0.00039 / 0.02) * np.float32(74.0) ** np.linspace(0, 1, c_out)).astype(np.float32)
    m = qdq_conv(w, sw, 0.02, 3, T.INT8, 0.05, 128, T.UINT8)
    x = rng.integers(-128, 128, size=(1, 16, 5, 5))
    imp = oracle_equal(m, x)
    [rec] = imp.requants
    assert max(p.delta for p in rec.plans) <= FINE
    assert verify(imp.graph, x.astype(np.int32)).exact


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), c_out=st.integers(2, 6), dead=st.integers(0, 5),
       bias=st.sampled_from([(1 << 31) - 1, -(1 << 31) + 1, 1 << 30, -(1 << 30), 2147268950]),
       tiny=st.sampled_from([1e-16, 1e-30, 1e-38]), out=st.sampled_from([T.INT8, T.UINT8]))
def test_a_dead_channel_with_a_huge_bias_is_settled(seed, c_out, dead, bias, tiny, out):
    """A channel whose weight scale is tiny (1e-16 .. 1e-38, a denormal bias scale too) and whose int32 bias is
    >= 2^30 (as quantize_static writes a dead channel of a real recognizer): no conv2d label holds the bias, but
    QuantizeLinear gives that channel one value for every input, added after the requantization of the others;
    equal to the oracle, which checks that value exactly. Regression: refused ('conv2d of inputs with precisions
    [8, 8, 32] needs 33 bits'), then 'the bias scale ... is not input scale x weight scale' for a denormal."""
    rng = np.random.default_rng(seed)
    dead %= c_out
    w = rng.integers(-127, 128, size=(c_out, 3, 3, 3))
    sw = (rng.uniform(0.5, 2, c_out) * 0.01).astype(np.float32)
    sw[dead] = np.float32(tiny)
    b = rng.integers(-2000, 2000, c_out)
    b[dead] = bias
    m = qdq_conv(w, sw, 0.02, 3, T.INT8, 0.05, 0 if out == T.INT8 else 128, out, bias=b)
    x = rng.integers(-128, 128, size=(1, 3, 5, 5))
    imp = oracle_equal(m, x)
    assert [r.settled for r in imp.requants if r.settled]
    assert verify(imp.graph, x.astype(np.int32)).exact


def test_a_huge_bias_on_a_channel_whose_output_varies_is_requantized_alone():
    """M = 2^-31 and a bias of 2^30: (t + 2^30) M lies around 1/2, so the channel's output is not one value: its own
    plan with the bias split off at import (tests/from_onnx/test_far_rows.py); equal to the oracle where it
    changes (at t = 0 the tie 1/2, which the plan rounds up: within its bound). Regression: refused ('its output
    varies')."""
    w = np.full((1, 1, 1, 1), 100)
    m = qdq_conv(w, np.array([2.0**-20], np.float32), 2.0**-11, 0, T.INT8, 1.0, 0, T.INT8, bias=np.array([1 << 30]),
                 pads=(0, 0, 0, 0), name="deadconv")
    x = np.array([-128, -127, -2, -1, 0, 1, 2, 126, 127] + list(range(-80, 80, 10))).reshape(1, 1, 5, 5)
    imp = oracle_equal(m, x)
    [rec] = imp.requants
    assert [row for row, _ in rec.far] == [0]
    assert verify(imp.graph, x.astype(np.int32)).exact
