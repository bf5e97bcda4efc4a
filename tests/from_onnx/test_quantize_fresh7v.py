"""What a seventh corpus of vision models shipped in wheels met in quantize: Abs, Neg and Relu of a sum that no
QuantizeLinear ends (onnxruntime quantizes no Sub): a Siamese network's L1 distance |a - b| with its second image
folded to a constant (CapSpot), x - c for a per-element constant c, a sum of two scales; each is the sum's own
requantization at the output's scale, then |r|, -r or max(r, z) on the integers, equal to the oracle of
docs/import.md."""
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

from support.quantized import Oracle, qdq
from support.shipped import shipped

from cvm_onnx.app.api import run_cvm
from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify

NP = {T.INT8: np.int8, T.UINT8: np.uint8, T.INT16: np.int16, T.UINT16: np.uint16}
RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255)}
EXACT = {"Abs": np.abs, "Neg": np.negative, "Relu": lambda v: np.maximum(v, 0)}


def odd_model(op: str, x_type: int, s: float, zx: int, c: np.ndarray | None, s2: float | None, so: float, zo: int,
              out_type: int) -> onnx.ModelProto:
    """DequantizeLinear of x, less a float constant c (per element, or a scalar), plus x dequantized again at scale
    s2 (a second term of another scale), then ``op`` and QuantizeLinear: the sum is quantized nowhere."""
    inits = {"s": np.float32(s), "zx": NP[x_type](zx), "so": np.float32(so), "zo": NP[out_type](zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"])]
    v = "xf"
    if c is not None:
        inits["c"] = c.astype(np.float32)
        nodes.append(h.make_node("Sub", [v, "c"], ["d"]))
        v = "d"
    if s2 is not None:
        inits["s2"] = np.float32(s2)
        nodes += [h.make_node("DequantizeLinear", ["x", "s2", "zx"], ["x2"]), h.make_node("Add", [v, "x2"], ["e"])]
        v = "e"
    nodes += [h.make_node(op, [v], ["r"], name="f"), h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"], name="q")]
    return qdq(nodes, (16, 16), x_type, inits, out_type)


@settings(max_examples=40, deadline=None)
@given(d=st.data(), op=st.sampled_from(["Abs", "Neg", "Relu"]), x_type=st.sampled_from([T.INT8, T.UINT8]),
       out_type=st.sampled_from([T.INT8, T.UINT8]), s=st.sampled_from([2.0**-7, 0.003, 0.05, 0.7]),
       so=st.sampled_from([2.0**-8, 0.01, 0.05, 0.4]), const=st.sampled_from(["vector", "scalar", "none"]),
       second=st.booleans())
def test_odd_functions_and_relu_of_a_sum_equal_the_oracle(d, op, x_type, out_type, s, so, const, second):
    """Abs, Neg and Relu of x - c (c per element or a scalar) and of x at two scales, over every integer of x's
    type and extreme constants: the import equals the oracle (the sum's requantization by its plan, checked within
    its bound, then |r|, -r or max(r, z)) and its export runs exactly. Regression: 'Abs of a sum needs a
    per-tensor scale and zero point', 'the Relu input (a sum) must be quantized (QuantizeLinear) first'."""
    if const == "none" and not second:
        second = True  # a sum needs two terms
    zx = d.draw(st.integers(*RANGE[x_type]))
    zo = d.draw(st.integers(*RANGE[out_type]))
    width = d.draw(st.sampled_from([1.0, 20.0, 300.0]))
    c = None if const == "none" else d.draw(st.sampled_from([
        lambda n: np.random.default_rng(n).uniform(-width, width, (16,) if const == "vector" else ()),
        lambda n: np.full((16,) if const == "vector" else (), width),
        lambda n: np.random.default_rng(n).choice([0.0, -width, width, 1e-3], (16,) if const == "vector" else ())]))(
        d.draw(st.integers(0, 99)))
    s2 = d.draw(st.sampled_from([0.011, 0.3, 2.0**-5])) if second else None
    m = odd_model(op, x_type, s, zx, c, s2, so, zo, out_type)
    x = np.arange(RANGE[x_type][0], RANGE[x_type][1] + 1, dtype=np.int64).reshape(16, 16)
    imp = import_model(m, input_precision=9)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    [(_, want, *_)] = Oracle(m, imp).run(x.astype(np.int64))
    assert np.array_equal(got.astype(np.int64), np.asarray(want).reshape(got.shape))
    assert verify(imp.graph, x.astype(np.int32)).exact


def test_odd_functions_of_a_sum_are_the_exact_values_without_ties():
    """Away from ties (|v / s_out| at least 0.01 from a half), the result is the exactly rounded value itself."""
    c = np.linspace(-2, 2, 16)
    for op in EXACT:
        m = odd_model(op, T.UINT8, 0.03, 100, c, None, 0.0197, 3, T.UINT8)
        x = np.arange(256, dtype=np.int64).reshape(16, 16)
        [got] = execute(import_model(m, input_precision=9).graph, {"data": x.astype(np.int32)})
        v = EXACT[op](((x - 100) * np.float64(np.float32(0.03)) - np.float32(c).astype(np.float64))
                      / np.float64(np.float32(0.0197)))
        far = np.abs(v - np.floor(v) - 0.5) > 0.01
        assert far.mean() > 0.9
        assert np.array_equal(got[far], np.clip(np.rint(v) + 3, 0, 255)[far])


def test_an_odd_function_of_a_sum_with_a_wide_output_is_refused_in_one_line():
    """A uint16 output whose values lie up to 65535 from its zero point: refused naming the node and the rule."""
    m = odd_model("Abs", T.UINT8, 0.03, 100, np.linspace(-2, 2, 16), None, 0.001, 0, T.UINT16)
    with pytest.raises(UnsupportedError, match=r"Abs of a sum with an output of type uint16 has no CVM form"):
        import_model(m, input_precision=9)


def siamese_model() -> onnx.ModelProto:
    """Two towers (a Conv and a mean over the image) of shared weights, |a - b|, a dense layer and a Sigmoid: a
    Siamese similarity as tf2onnx writes it."""
    rng = np.random.default_rng(1)
    w = nh.from_array(rng.normal(size=(6, 3, 3, 3)).astype(np.float32), "w")
    d = nh.from_array(rng.normal(size=(6, 1)).astype(np.float32), "d")
    nodes = []
    for k in ("1", "2"):
        nodes += [h.make_node("Conv", [f"x{k}", "w"], [f"c{k}"], pads=[1, 1, 1, 1]),
                  h.make_node("Relu", [f"c{k}"], [f"r{k}"]),
                  h.make_node("GlobalAveragePool", [f"r{k}"], [f"g{k}"]),
                  h.make_node("Flatten", [f"g{k}"], [f"e{k}"])]
    nodes += [h.make_node("Sub", ["e1", "e2"], ["diff"]), h.make_node("Abs", ["diff"], ["l1"], name="l1"),
              h.make_node("MatMul", ["l1", "d"], ["logit"]), h.make_node("Sigmoid", ["logit"], ["p"])]
    g = h.make_graph(nodes, "siamese", [h.make_tensor_value_info(f"x{k}", T.FLOAT, [1, 3, 12, 12]) for k in "12"],
                     [h.make_tensor_value_info("p", T.FLOAT, [1, 1])], [w, d])
    return onnx_model(g, 15)


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_siamese_distance_with_its_second_image_folded_quantizes_and_imports(tmp_path, per_channel):
    """quantize of the Siamese model with its second input folded (a reference image as a constant) imports whole,
    as close to float as onnxruntime's quantized model, and its export runs exactly. Regression: refused 'Abs of
    a sum needs a per-tensor scale and zero point' (CapSpot's sim_model)."""
    src = tmp_path / "m.onnx"
    onnx.save(siamese_model(), src)
    np.save(tmp_path / "c.npy", np.random.default_rng(0).uniform(0, 1, (8, 3, 12, 12)).astype(np.float32))
    done = quantize(src, tmp_path / "c.npy", tmp_path / "out", per_channel=per_channel, fold={"x2": 0.5})
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps + 0.01
    assert verify(done.imported.graph, None, seeds=2).exact


def test_the_ctc_recognizer_imports_whole_as_shipped(tmp_path):
    """trueocr's recognizer (its width folded) as shipped imports whole: its greedy decoding's ArgMax, the TopK of its
    LogSoftmax and its written-out confidence 1 / ReduceSum(Exp(x - max)). The ids (int64 in ONNX, int32 in CVM)
    agree with float at as many positions as onnxruntime's quantized model's (within 2%), the confidence is within
    1.1x its distance from float, and the export runs exactly. Regression: refused 'no CVM op for ONNX ArgMax' and
    'no CVM op for ONNX TopK' (before them: LogSoftmax and the confidence)."""
    src = shipped("trueocr", "models/rec.onnx")
    x = np.random.default_rng(0).uniform(0, 1, (4, 1, 96, 256)).astype(np.float32)
    np.save(tmp_path / "c.npy", x)
    done = quantize(src, tmp_path / "c.npy", tmp_path / "whole", fold={"widths": 256})
    ids, conf, lengths = done.agreements
    assert (ids.name, conf.name, lengths.name) == ("ids", "conf", "lengths")
    assert conf.mean_steps <= 1.1 * conf.ort_mean_steps + 0.01 and lengths.max_steps == 0
    so = ort.SessionOptions()
    so.add_session_config_entry("session.x64quantprecision", "1")
    fl = ort.InferenceSession(done.float_model.SerializeToString(), providers=["CPUExecutionProvider"])
    qd = ort.InferenceSession(done.onnx_model, so, providers=["CPUExecutionProvider"])
    got, want, theirs = [], [], []
    for sample in x:
        feed = {fl.get_inputs()[0].name: sample[None]}
        want.append(fl.run(["ids"], feed)[0])
        theirs.append(qd.run(["ids"], feed)[0])
        got.append(run_cvm(done.imported.graph, sample[None], done.imported.edges)[0].reshape(want[-1].shape))
    got, want, theirs = map(np.concatenate, (got, want, theirs))
    assert np.mean(got == want) >= np.mean(theirs == want) - 0.02
    assert verify(done.imported.graph, None, seeds=1).exact
