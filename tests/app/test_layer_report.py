"""The per-layer report (cvm_onnx.app.layers, ``quantize --report``, ``convert --report --samples``) against an
independent computation on a small QDQ model: the CVM values of each tensor from an import cut there (``--outputs``),
the float model by an onnxruntime session of its own, the exact arithmetic in Fractions (round half to even)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import conv_layer, quantized

from cvm_onnx.app.layers import exact_sum, layer_report
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model


def conv_pool(seed: int) -> onnx.ModelProto:
    """x (1, 2, 4, 4) -> Conv 3x3 (3 channels, pads 1) -> c -> AveragePool 2x2 stride 2 -> p."""
    rng = np.random.default_rng(seed)
    nodes, inits = conv_layer(rng, "c", "x", 2, 3)
    nodes.append(h.make_node("AveragePool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]))
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4])],
                     [h.make_tensor_value_info("p", T.FLOAT, None)], inits)
    return onnx_model(g, 17)


def conv_and_pool_session(f: onnx.ModelProto) -> ort.InferenceSession:
    """The float model unoptimised, its convolution's output ``c`` an output beside the pool's ``p``."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    g = onnx.ModelProto()
    g.CopyFrom(f)
    g.graph.output.append(h.make_tensor_value_info("c", T.FLOAT, None))
    return ort.InferenceSession(g.SerializeToString(), so, providers=["CPUExecutionProvider"])


def fr(v) -> Fraction:
    return Fraction(float(v))


def exact_mean(d: np.ndarray) -> float:
    """The mean of ``d`` summed in Fractions, then rounded once."""
    return float(sum(map(Fraction, d.reshape(-1).tolist()), Fraction(0)) / d.size)


def saturate(v: Fraction, zero: int, lo: int, hi: int) -> int:
    return min(max(round(v) + zero, lo), hi)  # Fraction's round: half to even


class Exact:
    """The QDQ conv_pool model's pieces in Fractions, read from its initializers by name."""

    def __init__(self, q: onnx.ModelProto):
        self.c = {t.name: nh.to_array(t) for t in q.graph.initializer}
        if "c_b_quantized_scale" not in self.c:  # QOperator: QLinearConv's bias is at x_scale * w_scale
            self.c["c_b_quantized_scale"] = np.array([fr(self.c["x_scale"]) * fr(v) for v in
                                                      np.broadcast_to(self.c["c_w_scale"], (3,))], dtype=object)
        self.type = {T.UINT8: (0, 255), T.INT8: (-128, 127)}[
            next(t.data_type for t in q.graph.initializer if t.name == "x_zero_point")]

    def s_z(self, name: str) -> tuple[Fraction, int]:
        return fr(self.c[f"{name}_scale"]), int(self.c[f"{name}_zero_point"])

    def input(self, x: np.ndarray) -> np.ndarray:
        s, z = self.s_z("x")
        return np.array([saturate(fr(v) / s, z, *self.type) for v in x.flat]).reshape(x.shape)

    def conv(self, xq: np.ndarray) -> np.ndarray:
        sx, zx = self.s_z("x")
        so, zo = self.s_z("c")
        w, sw, zw = self.c["c_w_quantized"], self.c["c_w_scale"], self.c["c_w_zero_point"]
        b, sb = self.c["c_b_quantized"], self.c["c_b_quantized_scale"]
        sw, zw, sb = np.broadcast_to(sw, (3,)), np.broadcast_to(zw, (3,)), np.broadcast_to(sb, (3,))
        pad = np.pad(xq[0].astype(np.int64) - zx, ((0, 0), (1, 1), (1, 1)))
        out = np.zeros((1, 3, 4, 4), np.int64)
        for o in range(3):
            for i in range(4):
                for j in range(4):
                    acc = int((pad[:, i:i + 3, j:j + 3] * (w[o].astype(np.int64) - int(zw[o]))).sum())
                    real = acc * sx * fr(sw[o]) + int(b[o]) * fr(sb[o])
                    out[0, o, i, j] = saturate(real / so, zo, *self.type)
        return out

    def pool(self, cq: np.ndarray, out: str) -> np.ndarray:
        si, zi = self.s_z("c")
        so, zo = self.s_z(out)
        v = cq.astype(np.int64) - zi
        res = np.zeros((1, 3, 2, 2), np.int64)
        for o in range(3):
            for i in range(2):
                for j in range(2):
                    real = Fraction(int(v[0, o, 2 * i:2 * i + 2, 2 * j:2 * j + 2].sum()), 4) * si
                    res[0, o, i, j] = saturate(real / so, zo, *self.type)
        return res


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**16), activation=st.sampled_from(["uint8", "int8"]), symmetric=st.booleans(),
       per_channel=st.booleans(), spread=st.sampled_from([0.5, 1.5, 4.0]))
@example(seed=1, activation="uint8", symmetric=False, per_channel=True, spread=1.5)
@example(seed=2, activation="int8", symmetric=True, per_channel=False, spread=1.5)
def test_report_numbers_equal_an_independent_computation(tmp_path_factory, seed, activation, symmetric, per_channel,
                                                         spread):
    """Random weights, types and samples (inside the calibration range, or past it: saturated values)."""
    tmp_path = tmp_path_factory.mktemp("report")
    f = conv_pool(seed)
    q, _ = quantized(f, tmp_path, "QDQ", activation, symmetric, per_channel)
    qs = {n.output[0]: n for n in q.graph.node if n.op_type == "QuantizeLinear"}
    assert sorted(qs) == ["c_QuantizeLinear_Output", "p_QuantizeLinear_Output", "x_QuantizeLinear_Output"]
    pool_out = qs["p_QuantizeLinear_Output"].input[1][:-len("_scale")]
    samples = spread * np.random.default_rng(seed + 10).normal(size=(5, 1, 2, 4, 4)).astype(np.float32)

    report = layer_report(q, import_model(q), samples, f)
    assert (report.samples, report.float_model, report.note) == (5, True, None)
    rows = {r.name: r for r in report.layers}

    cvm = {}  # each tensor's CVM values from an import cut at it
    for name in qs:
        cut = import_model(q, outputs=[name])
        cvm[name] = np.stack([execute(cut.graph, {"data": cut.edges.input.quantize(x)})[0].reshape(
            (1, 3, 4, 4) if name[0] == "c" else (1, 3, 2, 2) if name[0] == "p" else (1, 2, 4, 4)) for x in samples])
    sess = conv_and_pool_session(f)
    p, c = zip(*(sess.run(["p", "c"], {"x": x}) for x in samples))
    floats = {"x_QuantizeLinear_Output": samples, "c_QuantizeLinear_Output": np.stack(c),
              "p_QuantizeLinear_Output": np.stack(p)}
    ex = Exact(q)
    exact = {"x_QuantizeLinear_Output": np.stack([ex.input(x) for x in samples]),
             "c_QuantizeLinear_Output": np.stack([ex.conv(v) for v in cvm["x_QuantizeLinear_Output"]]),
             "p_QuantizeLinear_Output": np.stack([ex.pool(v, pool_out) for v in cvm["c_QuantizeLinear_Output"]])}
    assert list(rows) == ["x_QuantizeLinear_Output", "c_QuantizeLinear_Output", "p_QuantizeLinear_Output"]
    assert [rows[n].op for n in rows] == ["(the input)", "Conv", "AveragePool"]
    for name, r in rows.items():
        node = qs[name]
        s = float(nh.to_array(next(t for t in q.graph.initializer if t.name == node.input[1])))
        z = int(nh.to_array(next(t for t in q.graph.initializer if t.name == node.input[2])))
        d = np.abs((cvm[name].astype(np.float64) - z) - floats[name].astype(np.float64) / s)
        e = np.abs(cvm[name].astype(np.int64) - exact[name])
        assert (r.scale, r.elements) == (s, d.size)
        assert r.float_max == d.max() and r.float_mean == exact_mean(d)
        assert (r.equal, r.off) == ((e == 0).sum() / e.size, e.max())


def test_without_a_float_model_the_float_columns_are_absent(tmp_path):
    q, _ = quantized(conv_pool(3), tmp_path, "QDQ", "uint8", False, False)
    rows = layer_report(q, import_model(q), np.zeros((2, 1, 2, 4, 4), np.float32)).layers
    assert [(r.float_mean, r.float_max) for r in rows] == [(None, None)] * 3
    assert all(r.equal is not None and r.elements == 2 * size for r, size in zip(rows, (32, 48, 12)))


def test_the_import_names_the_entry_of_every_tensor_it_computes(tmp_path):
    """``Imported.tensors``: each computed tensor's entry holds what an import cut at that tensor gives."""
    q, _ = quantized(conv_pool(4), tmp_path, "QDQ", "int8", False, True)
    whole = import_model(q)
    x = np.random.default_rng(0).normal(size=(1, 2, 4, 4)).astype(np.float32)
    values = execute(whole.graph, {"data": whole.edges.input.quantize(x)}, keep_all=True)
    names = [n for n in whole.tensors if n.endswith("_QuantizeLinear_Output")]
    assert sorted(names) == ["c_QuantizeLinear_Output", "p_QuantizeLinear_Output", "x_QuantizeLinear_Output"]
    for name in names:
        cut = import_model(q, outputs=[name])
        [want] = execute(cut.graph, {"data": cut.edges.input.quantize(x)})
        assert np.array_equal(values[whole.tensors[name]].reshape(-1), want.reshape(-1)), name


def test_pieces_the_reference_evaluator_cannot_run_leave_the_exact_columns_empty_and_say_why(tmp_path, monkeypatch):
    import onnx.reference

    class Refusing:
        def __init__(self, model):
            raise NotImplementedError("no kernel for com.example::Op")

    f = conv_pool(5)
    q, _ = quantized(f, tmp_path, "QDQ", "uint8", False, False)
    monkeypatch.setattr(onnx.reference, "ReferenceEvaluator", Refusing)
    report = layer_report(q, import_model(q), np.zeros((1, 1, 2, 4, 4), np.float32), f)
    assert report.note == ("the exact arithmetic was not computed: onnx's reference evaluator cannot run the pieces "
                           "(NotImplementedError: no kernel for com.example::Op)")
    assert [(r.equal, r.off) for r in report.layers] == [(None, None)] * 3
    assert all(r.float_mean is not None for r in report.layers)


def test_a_qoperator_models_tensors_against_the_float_model_and_the_exact_arithmetic(tmp_path):
    """QOperator form: each QLinear node's output against the float tensor of its name less `_quantized`, clipped
    to its type's range (the Relu fused into the QLinearConv is that clip), and against its exact arithmetic (the
    bias at x_scale w_scale) in Fractions."""
    rng = np.random.default_rng(6)
    nodes, inits = conv_layer(rng, "c", "x", 2, 3)
    nodes += [h.make_node("Relu", ["c"], ["r"]),
              h.make_node("AveragePool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2])]
    f = onnx_model(h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4])],
                                [h.make_tensor_value_info("p", T.FLOAT, None)], inits), 17)
    q, _ = quantized(f, tmp_path, "QOperator", "uint8", False, True)
    assert [n.op_type for n in q.graph.node] == ["QuantizeLinear", "QLinearConv", "QLinearAveragePool",
                                                 "DequantizeLinear"]
    samples = 1.5 * np.random.default_rng(7).normal(size=(4, 1, 2, 4, 4)).astype(np.float32)
    rows = {r.name: r for r in layer_report(q, import_model(q), samples, f).layers}
    assert list(rows) == ["x_quantized", "c_quantized", "p_quantized"]
    inits_q = {t.name: nh.to_array(t) for t in q.graph.initializer}
    sess = conv_and_pool_session(f)
    ex = Exact(q)
    cvm = {}
    for name in ("x_quantized", "c_quantized", "p_quantized"):
        cut = import_model(q, outputs=[name])
        cvm[name] = [execute(cut.graph, {"data": cut.edges.input.quantize(x)})[0].reshape(
            {"x": (1, 2, 4, 4), "c": (1, 3, 4, 4), "p": (1, 3, 2, 2)}[name[0]]) for x in samples]
    exact = {"c_quantized": [ex.conv(v) for v in cvm["x_quantized"]],
             "p_quantized": [ex.pool(v, "p") for v in cvm["c_quantized"]]}
    for name, float_name in (("c_quantized", "c"), ("p_quantized", "p")):
        s, z = float(inits_q[name[:-10] + "_scale"]), int(inits_q[name[:-10] + "_zero_point"])
        d = np.concatenate([np.abs((got.reshape(-1).astype(np.float64) - z) - np.clip(
            sess.run([float_name], {"x": x})[0].reshape(-1).astype(np.float64) / s, -z, 255 - z))
            for got, x in zip(cvm[name], samples)])
        e = np.abs(np.concatenate(cvm[name]).astype(np.int64) - np.concatenate(exact[name]))
        r = rows[name]
        assert (r.equal, r.off, r.elements) == ((e == 0).mean(), e.max(), d.size)
        assert r.float_max == d.max() and r.float_mean == exact_mean(d)
    assert rows["x_quantized"].equal == 1.0


def test_a_qoperator_tensor_only_moved_on_takes_its_producers_scale(tmp_path):
    """A MaxPool's output read only by a Flatten (no scale beside it): measured at the scale of the QLinearConv
    it moves, against the float MaxPool's output."""
    rng = np.random.default_rng(8)
    nodes, inits = conv_layer(rng, "c", "x", 2, 3)
    inits += [nh.from_array(rng.normal(size=(12, 2)).astype(np.float32), "w2"),
              nh.from_array(rng.normal(size=(2,)).astype(np.float32), "b2")]
    nodes += [h.make_node("Relu", ["c"], ["r"]),
              h.make_node("MaxPool", ["r"], ["m"], kernel_shape=[2, 2], strides=[2, 2]),
              h.make_node("Flatten", ["m"], ["fl"]), h.make_node("Gemm", ["fl", "w2", "b2"], ["y"])]
    f = onnx_model(h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4])],
                                [h.make_tensor_value_info("y", T.FLOAT, None)], inits), 17)
    q, _ = quantized(f, tmp_path, "QOperator", "uint8", False, False)
    pool = next(n for n in q.graph.node if n.op_type == "MaxPool")
    assert [n.op_type for n in q.graph.node if pool.output[0] in n.input] == ["Flatten"]
    samples = np.random.default_rng(9).normal(size=(3, 1, 2, 4, 4)).astype(np.float32)
    rows = {r.name: r for r in layer_report(q, import_model(q), samples, f).layers}
    assert [r.op for r in rows.values()] == ["(the input)", "QLinearConv", "MaxPool", "Flatten", "QGemm"]
    conv = next(n for n in q.graph.node if n.op_type == "QLinearConv")
    inits_q = {t.name: nh.to_array(t) for t in q.graph.initializer}
    s, z = float(inits_q[conv.input[6]]), int(inits_q[conv.input[7]])
    cut = import_model(q, outputs=[pool.output[0]])
    g = onnx.ModelProto()
    g.CopyFrom(f)
    g.graph.output.append(h.make_tensor_value_info("m", T.FLOAT, None))
    sess = ort.InferenceSession(g.SerializeToString(), providers=["CPUExecutionProvider"])
    d = np.concatenate([np.abs(
        (execute(cut.graph, {"data": cut.edges.input.quantize(x)})[0].reshape(-1).astype(np.float64) - z)
        - np.clip(sess.run(["m"], {"x": x})[0].reshape(-1).astype(np.float64) / s, -z, 255 - z)) for x in samples])
    assert rows[pool.output[0]].float_max == d.max() and rows[pool.output[0]].scale == s
    gemm = next(n for n in q.graph.node if n.op_type == "QGemm")  # its exact arithmetic: the bias at sa sb
    assert len(gemm.input) == 9 and all(gemm.input)
    e = qgemm_steps_off(q, gemm, samples, 1)
    assert (rows[gemm.output[0]].equal, rows[gemm.output[0]].off) == ((e == 0).mean(), e.max())


def qgemm_steps_off(q, gemm, samples, alpha) -> np.ndarray:
    """Each output of a two-column QGemm, imported, against saturate((a . w + bias) alpha s_a s_b / s_y + z_y) in
    Fractions (the bias in the accumulator, as onnxruntime's kernel adds it), over the samples: steps off."""
    inits_q = {t.name: nh.to_array(t) for t in q.graph.initializer}
    a_in = import_model(q, outputs=[gemm.input[0]])
    got = import_model(q, outputs=[gemm.output[0]])
    sa, za, wq, sb, zb, bias, sy, zy = (inits_q[x] for x in (*gemm.input[1:3], *gemm.input[3:9]))
    e = []
    for x in samples:
        a = execute(a_in.graph, {"data": a_in.edges.input.quantize(x)})[0].reshape(-1).astype(np.int64) - int(za)
        want = [saturate((int(a @ (wq[:, j].astype(np.int64) - int(zb))) + int(bias[j])) * fr(alpha) * fr(sa) *
                         fr(sb) / fr(sy), int(zy), 0, 255) for j in range(2)]
        e.append(np.abs(execute(got.graph, {"data": got.edges.input.quantize(x)})[0].reshape(-1) - want))
    return np.concatenate(e)


@pytest.mark.parametrize("alpha", [-0.75, 2.5])
def test_a_qgemm_with_alpha_against_its_exact_arithmetic(tmp_path, alpha):
    """A QGemm with alpha != 1 (its attribute set on onnxruntime's QOperator model) is measured too: against
    saturate((a . w + bias) alpha s_a s_b / s_y + z_y), the bias in the accumulator as its kernel adds it, in
    Fractions. Regression: left out of the report ('-'), as QGemm with alpha != 1 had no import."""
    rng = np.random.default_rng(8)
    inits = [nh.from_array(rng.normal(size=(6, 2)).astype(np.float32), "w2"),
             nh.from_array(rng.normal(size=(2,)).astype(np.float32), "b2")]
    nodes = [h.make_node("Gemm", ["x", "w2", "b2"], ["y"])]
    f = onnx_model(h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 6])],
                                [h.make_tensor_value_info("y", T.FLOAT, None)], inits), 17)
    q, _ = quantized(f, tmp_path, "QOperator", "uint8", False, False)
    gemm = next(n for n in q.graph.node if n.op_type == "QGemm")
    del gemm.attribute[:]
    gemm.attribute.append(h.make_attribute("alpha", alpha))
    samples = np.random.default_rng(9).normal(size=(3, 1, 6)).astype(np.float32)
    rows = {r.name: r for r in layer_report(q, import_model(q), samples, None).layers}
    e = qgemm_steps_off(q, gemm, samples, alpha)
    row = rows[gemm.output[0]]
    assert row.op == "QGemm" and (row.equal, row.off) == ((e == 0).mean(), e.max())


def test_a_qlinear_concat_against_its_exact_arithmetic(tmp_path):
    """QLinearConcat: each input requantized to the output's scale, round half to even, in Fractions."""
    rng = np.random.default_rng(13)
    n1, i1 = conv_layer(rng, "c1", "x", 2, 2)
    n2, i2 = conv_layer(rng, "c2", "x", 2, 3)
    f = onnx_model(h.make_graph(n1 + n2 + [h.make_node("Concat", ["c1", "c2"], ["y"], axis=1)], "m",
                                [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4])],
                                [h.make_tensor_value_info("y", T.FLOAT, None)], i1 + i2), 17)
    q, _ = quantized(f, tmp_path, "QOperator", "uint8", False, False)
    [cat] = [n for n in q.graph.node if n.op_type == "QLinearConcat"]
    inits = {t.name: nh.to_array(t) for t in q.graph.initializer}
    samples = np.random.default_rng(14).normal(size=(3, 1, 2, 4, 4)).astype(np.float32)
    rows = {r.name: r for r in layer_report(q, import_model(q), samples, f).layers}
    sy, zy = fr(inits[cat.input[0]]), int(inits[cat.input[1]])
    cuts = [import_model(q, outputs=[x]) for x in cat.input[2::3]]
    e = []
    for x in samples:
        parts = [np.array([saturate((int(v) - int(inits[z])) * fr(inits[s]) / sy, zy, 0, 255) for v in
                           execute(c.graph, {"data": c.edges.input.quantize(x)})[0].reshape(-1)])
                 for c, s, z in zip(cuts, cat.input[3::3], cat.input[4::3])]
        out = import_model(q, outputs=[cat.output[0]])
        e.append(np.abs(execute(out.graph, {"data": out.edges.input.quantize(x)})[0].reshape(-1)
                        - np.concatenate(parts)))
    e = np.concatenate(e)
    assert (rows[cat.output[0]].op, rows[cat.output[0]].equal, rows[cat.output[0]].off) == (
        "QLinearConcat", (e == 0).mean(), e.max())


def test_an_integer_inputs_first_quantized_tensor_against_its_exact_quantization(tmp_path):
    """An integer input cast to float and quantized (quantize's integer inputs): its QuantizeLinear reads a
    float32 Cast, measured against round half to even of x / s in Fractions (the reference evaluator ran it)."""
    rng = np.random.default_rng(10)
    w = nh.from_array(rng.normal(size=(4, 3)).astype(np.float32), "w")
    f = onnx_model(h.make_graph([h.make_node("Cast", ["x"], ["xf"], to=T.FLOAT),
                                 h.make_node("MatMul", ["xf", "w"], ["y"])], "m",
                                [h.make_tensor_value_info("x", T.INT32, [1, 4])],
                                [h.make_tensor_value_info("y", T.FLOAT, None)], [w]), 17)
    onnx.save(f, tmp_path / "f.onnx")
    from onnxruntime import quantization

    class Reader(quantization.CalibrationDataReader):
        items = iter([{"x": rng.integers(-50, 50, size=(1, 4)).astype(np.int32)} for _ in range(4)])

        def get_next(self):
            return next(self.items, None)

    quantization.quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader(),
                                 weight_type=quantization.QuantType.QInt8)
    q = onnx.load(tmp_path / "q.onnx")
    samples = rng.integers(-80, 80, size=(3, 1, 4)).astype(np.int32)
    report = layer_report(q, import_model(q), samples, f)
    assert report.note is None
    first = report.layers[0]
    node = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "xf")
    inits = {t.name: nh.to_array(t) for t in q.graph.initializer}
    s, z, info = fr(inits[node.input[1]]), int(inits[node.input[2]]), np.iinfo(inits[node.input[2]].dtype)
    cut = import_model(q, outputs=[node.output[0]])
    got = np.concatenate([execute(cut.graph, {"data": x})[0].reshape(-1) for x in samples])
    want = np.array([saturate(Fraction(int(v)) / s, z, int(info.min), int(info.max)) for v in samples.reshape(-1)])
    assert (first.name, first.elements) == (node.output[0], 12)
    assert (first.equal, first.off) == ((got == want).mean(), np.abs(got - want).max())


def test_a_float_tensor_of_another_size_is_not_compared(tmp_path):
    """A float model whose tensors of the same names have other sizes (another model given as --float-model):
    those rows get no float columns, not an error; the input's still do."""
    q, _ = quantized(conv_pool(11), tmp_path, "QDQ", "uint8", False, True)
    rng = np.random.default_rng(12)
    nodes, inits = conv_layer(rng, "c", "x", 2, 5)  # 5 channels, not 3
    nodes.append(h.make_node("AveragePool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]))
    other = onnx_model(h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4])],
                                    [h.make_tensor_value_info("p", T.FLOAT, None)], inits), 17)
    rows = layer_report(q, import_model(q), np.zeros((2, 1, 2, 4, 4), np.float32), other).layers
    assert [(r.float_mean is None, r.float_max is None) for r in rows] == [(False, False), (True, True), (True, True)]
    assert all(r.equal is not None for r in rows)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1e300, allow_nan=False) | st.sampled_from([0.0, 5e-324, 2.0 ** -1022, 1e300]),
                max_size=200), st.randoms())
def test_exact_sum_is_the_exact_sum_in_any_order(values, rnd):
    rnd.shuffle(values)
    assert exact_sum(np.array(values, np.float64)) == sum(map(Fraction, values), Fraction(0))
