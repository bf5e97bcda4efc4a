"""What an eleventh corpus (audio and signal models shipped in wheels) and a sweep of the ops such models use met in
quantize. quantize_static leaves Celu, Shrink (torch's Hardshrink and Softshrink) and ThresholdedRelu in float
between DequantizeLinear and QuantizeLinear ('no CVM op for ONNX Shrink'): each is a float function of one value, a
table. A Where of two computed branches on different grids (torch.where(x > 0, x, f(x)), a gate between two paths)
was refused ('Where of branches on different grids'): QuantizeLinear acts on each element alone, so Q(where(c, A,
B)) = where(c, Q(A), Q(B)), each branch requantized at the output's scale. Sum (tf2onnx's AddN) and Mean had no
rule: the sum of their operands' terms, as Add's (over n)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.quantized import between_convs, float32_of, qdq, quantizes_whole
from support.shipped import shipped
from test_quantized_fresh_ops import NP, RANGE, draw_x, oracle_equal, run

from cvm_onnx.app.quantize import quantize
from cvm_onnx.runtime.verify import verify

SETTINGS = settings(max_examples=12, deadline=None)


def celu(v, alpha):
    """ONNX Celu: max(0, x) + min(0, alpha (exp(x / alpha) - 1))."""
    return np.maximum(0, v) + np.minimum(0, alpha * (np.exp(v / alpha) - 1))


def shrink(v, lambd, bias):
    """ONNX Shrink: x + bias below -lambd, x - bias above lambd, 0 between."""
    return np.select([v < -lambd, v > lambd], [v + bias, v - bias], 0.0)


SPEC = {"Celu": lambda v, a: celu(v, a["alpha"]), "Shrink": lambda v, a: shrink(v, a["lambd"], a["bias"]),
        "ThresholdedRelu": lambda v, a: np.where(v > a["alpha"], v, 0.0)}


@SETTINGS
@given(d=st.data(), op=st.sampled_from(sorted(SPEC)), s=st.floats(2.0**-7, 2.0**-2, width=32),
       so=st.floats(2.0**-7, 1.0, width=32), zo=st.integers(-20, 20), x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_celu_shrink_and_thresholded_relu_are_tables_of_their_exact_values(d, op, s, so, zo, x_type):
    """Celu, Shrink and ThresholdedRelu between DequantizeLinear and QuantizeLinear, on every integer of the input
    type: QuantizeLinear of the exact values (the ONNX definitions in float64, rounded half to even, saturated; the
    thresholds of Shrink and ThresholdedRelu at DequantizeLinear's float32 values).
    Regression: 'no CVM op for ONNX Celu' (Shrink, ThresholdedRelu)."""
    attrs = {"Celu": {"alpha": d.draw(st.floats(0.125, 3, width=32))},
             "Shrink": {"lambd": d.draw(st.floats(0, 2, width=32)), "bias": d.draw(st.floats(-1, 1, width=32))},
             "ThresholdedRelu": {"alpha": d.draw(st.floats(-1, 2, width=32))}}[op]
    z = d.draw(st.integers(*RANGE[x_type]))
    inits = {"s": np.float32(s), "z": NP[x_type](z), "so": np.float32(so), "zo": np.int8(zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node(op, ["xf"], ["r"], **attrs),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    lo, hi = RANGE[x_type]
    x = np.arange(lo, hi + 1, dtype=np.int64).reshape(16, 16)
    _, [got] = run(qdq(nodes, x.shape, x_type, inits, T.INT8, opset=18), x)
    u = (x - z) * float(np.float32(s))
    real = SPEC[op](u if op == "Celu" else float32_of(u), {k: float(np.float32(v)) for k, v in attrs.items()})
    want = np.clip(np.rint(real / float(np.float32(so))) + zo, -128, 127)
    assert np.array_equal(got, want.astype(np.int64))


def where_model(sa, za, sb, zb, so, zo, thr, x_type, per_channel: bool, shape=(3, 4)):
    """Where(DQ(x, sa, za) > thr, DQ(x, sa, za), DQ(x, sb, zb)) -> QuantizeLinear(so, zo): both branches read x
    at their own scales and zero points (``sb``, ``zb`` per channel along axis 1 where ``per_channel``)."""
    inits = {"sa": np.float32(sa), "za": NP[x_type](za), "sb": np.asarray(sb, np.float32),
             "zb": np.asarray(zb).astype(NP[x_type]), "so": np.float32(so), "zo": np.int8(zo), "thr": np.float32(thr)}
    nodes = [h.make_node("DequantizeLinear", ["x", "sa", "za"], ["a"]),
             h.make_node("DequantizeLinear", ["x", "sb", "zb"], ["b"], axis=1),
             h.make_node("Greater", ["a", "thr"], ["c"]), h.make_node("Where", ["c", "a", "b"], ["r"], name="gate"),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    return qdq(nodes, shape, x_type, inits if per_channel else {**inits, "sb": np.float32(sb), "zb": NP[x_type](zb)},
               T.INT8)


def branch_model(s, z, so, zo, x_type, shape=(3, 4)):
    """One branch alone: DequantizeLinear(s, z along axis 1) -> QuantizeLinear(so, zo)."""
    inits = {"s": np.asarray(s, np.float32), "z": np.asarray(z).astype(NP[x_type]), "so": np.float32(so),
             "zo": np.int8(zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["b"], axis=1),
             h.make_node("QuantizeLinear", ["b", "so", "zo"], ["y"])]
    return qdq(nodes, shape, x_type, inits, T.INT8)


@SETTINGS
@given(d=st.data(), sa=st.floats(2.0**-8, 2.0**2, width=32), so=st.floats(2.0**-8, 2.0**2, width=32),
       zo=st.integers(-10, 10), thr=st.floats(-20, 20, width=32), x_type=st.sampled_from([T.INT8, T.UINT8]),
       per_channel=st.booleans())
def test_a_where_of_branches_on_different_grids_is_the_where_of_their_quantizations(d, sa, so, zo, thr, x_type,
                                                                                    per_channel):
    """Where of two dequantized values of different scales and zero points (the second per channel or per tensor),
    then QuantizeLinear: the integer where, on the exact condition (x - za) sa > thr, of each branch's own
    QuantizeLinear at the output's scale, each equal to the oracle of docs/import.md. Regression: 'Where of
    branches on different grids (scales or zero points) has no exact CVM form here'."""
    lo, hi = RANGE[x_type]
    za = d.draw(st.integers(lo, hi))
    sb = [d.draw(st.floats(2.0**-8, 2.0**2, width=32)) for _ in range(4 if per_channel else 1)]
    zb = [d.draw(st.integers(lo, hi)) for _ in sb]
    if not per_channel:
        sb, zb = sb[0], zb[0]
    x = draw_x(d, (3, 4), x_type)
    x[0, :2] = lo, hi
    _, [got] = run(where_model(sa, za, sb, zb, so, zo, thr, x_type, per_channel), x)
    branches = []
    for s, z in ((sa, za), (sb, zb)):
        m = branch_model(s, z, so, zo, x_type)
        oracle_equal(m, x)  # each branch's QuantizeLinear is the oracle's
        branches.append(run(m, x)[1][0])
    cond = (x - za).astype(np.float32) * np.float32(sa) > np.float32(thr)  # ONNX's: float32 values compared
    assert np.array_equal(got, np.where(cond, *branches))


@SETTINGS
@given(d=st.data(), n=st.integers(1, 4), op=st.sampled_from(["Sum", "Mean"]), so=st.floats(2.0**-6, 2.0, width=32),
       zo=st.integers(-10, 10), x_type=st.sampled_from([T.INT8, T.UINT8]), constant=st.booleans())
def test_sum_and_mean_of_several_values_are_the_sum_of_their_terms(d, n, op, so, zo, x_type, constant):
    """Sum (tf2onnx's AddN) and Mean of n dequantized values of their own scales and zero points (and a float
    constant), then QuantizeLinear: equal to the oracle of docs/import.md, the sum of every operand's terms (Mean's
    scales over the count), requantized within its plan's bound. Regression: 'no CVM op for ONNX Sum' (Mean)."""
    lo, hi = RANGE[x_type]
    grids = [(d.draw(st.floats(2.0**-8, 2.0, width=32)), d.draw(st.integers(lo, hi))) for _ in range(n)]
    inits = {f"s{i}": np.float32(s) for i, (s, _) in enumerate(grids)} | \
        {f"z{i}": NP[x_type](z) for i, (_, z) in enumerate(grids)} | \
        {"so": np.float32(so), "zo": np.int8(zo), "k": np.float32(d.draw(st.floats(-4, 4, width=32)))}
    nodes = [h.make_node("DequantizeLinear", ["x", f"s{i}", f"z{i}"], [f"v{i}"]) for i in range(n)] + \
        [h.make_node(op, [f"v{i}" for i in range(n)] + (["k"] if constant else []), ["r"], name="all"),
         h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    x = draw_x(d, (3, 4), x_type)
    x[0, :2] = lo, hi
    oracle_equal(qdq(nodes, x.shape, x_type, inits, T.INT8), x)


FLOAT_MODELS = {
    "softshrink": ([h.make_node("Shrink", ["a"], ["b"], lambd=0.5, bias=0.5)], {}),
    "celu": ([h.make_node("Celu", ["a"], ["b"], alpha=0.7)], {}),
    "mean": ([h.make_node("Relu", ["a"], ["r"]), h.make_node("Sigmoid", ["a"], ["g"]),
              h.make_node("Mean", ["a", "r", "g"], ["b"])], {}),
    "gate": ([h.make_node("Greater", ["a", "zero"], ["c"]), h.make_node("Conv", ["a", "w3"], ["v"], pads=[1] * 4),
              h.make_node("Where", ["c", "a", "v"], ["b"])],
             {"zero": np.float32(0), "w3": np.random.default_rng(6).normal(0, 0.3, (8, 8, 3, 3))}),
}


@pytest.mark.parametrize("name, per_channel", [("softshrink", False), ("celu", True), ("gate", True), ("mean", False)])
def test_float_models_of_these_forms_quantize_whole(tmp_path, name, per_channel):
    """quantize takes a float model of each form whole: as close to the float model as onnxruntime's quantized
    model (1.1x of its mean distance), the export exact. Regression: refused at the Shrink, the Celu, the Where, the
    Mean."""
    quantizes_whole(tmp_path, between_convs(*FLOAT_MODELS[name]), per_channel)


def test_shipped_pitch_classifier_imports_whole(tmp_path):
    """ultrastar-pitch's keras2onnx pitch-class CNN (2048 normalized MDCT bins -> 12 pitch classes, Softmax) as
    shipped: whole, within 1.1x onnxruntime's quantized model, the export exact."""
    model = shipped("ultrastar_pitch", "binaries/pitchnet_2020_12_14.onnx")
    rng = np.random.default_rng(0)
    bins = np.abs(rng.normal(size=(8, 2048)) * np.exp(-np.arange(2048) / rng.uniform(50, 400, (8, 1))))
    np.save(tmp_path / "c.npy", (bins / bins.max(axis=1, keepdims=True)).astype(np.float32))
    done = quantize(model, tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=2).exact


@pytest.mark.parametrize("op, attrs, s, edge", [("Shrink", {"lambd": 0.5, "bias": 0.25}, 0.05, [-7, 13]),
                                               ("ThresholdedRelu", {"alpha": 0.5}, 0.05, [13]),
                                               ("Floor", {}, 0.7, [13]), ("Ceil", {}, 0.3, [13])])
def test_a_step_function_steps_where_dequantize_linear_rounds_its_input(op, attrs, s, edge):
    """Shrink, ThresholdedRelu, Floor, Ceil at scales where (x - 3) s lies a float32 rounding from the step's edge
    ((-10) 0.05 = -0.5000000075, 10 x 0.7 = 6.9999999, 10 x 0.3 = 3.0000001): the step taken where DequantizeLinear's
    float32 value lies, every int8 input equal to onnxruntime's QDQ model. Regression: the exact product's side, 8
    output steps (Shrink) or one (Floor) from onnxruntime's (the newest fuzz target's wrong-result hunt on the Shrink
    seed)."""
    from support.quantized import ort_session

    inits = {"s": np.float32(s), "z": np.int8(3), "so": np.float32(0.03 if attrs else 1.0), "zo": np.int8(-4)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node(op, ["xf"], ["r"], **attrs),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    x = np.arange(-128, 128, dtype=np.int64).reshape(16, 16)
    m = qdq(nodes, x.shape, T.INT8, inits, T.INT8, opset=18)
    _, [got] = run(m, x)
    [want] = ort_session(m).run(None, {"x": x.astype(np.int8)})
    assert np.array_equal(got.reshape(want.shape), want), np.flatnonzero(got.reshape(want.shape) != want) - 128
    for e in edge:  # the exact product is on the other side of the step
        u = (e - 3) * float(np.float32(s))
        step = {"Floor": np.floor, "Ceil": np.ceil}.get(op, lambda v: abs(v) > 0.5)
        assert step(u) != step(float32_of(u))
