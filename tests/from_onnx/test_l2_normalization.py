"""L2 normalization of a quantized x (docs/import.md, "L2 normalization: the integer form and its bound"): every
written-out form and LpNormalization imported as u / sqrt(max(S + G, E)) by the LayerNorm table, each output within
1/2 + delta output steps of the exact value (rounded exactly where that lies further than delta from a
half-integer), onnxruntime's QDQ model within one step, and `quantize` of float models holding each form (refused
before: quantize_static quantized the pieces, and a ReduceSum of float squares has no integer form)."""
from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np
import onnx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.l2norm import FORMS, RMS, exact_l2, l2_float, l2_nodes, l2_qdq
from test_quantized_rules import imported, ort_session

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.from_onnx.quantized.l2norm import l2_plan
from cvm_onnx.core.errors import CVMError
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify

RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255), T.INT16: (-32768, 32767)}


def plan_of(imp):
    [p] = [r.layernorm for r in imp.requants if r.layernorm]
    return p


@st.composite
def cases(draw):
    form = draw(st.sampled_from(sorted(FORMS)))
    rank = draw(st.sampled_from([2, 3]))
    n = draw(st.sampled_from([1, 2, 3, 16, 64, 300]) | st.integers(1, 40))
    shape = [draw(st.integers(1, 3)) for _ in range(rank)]
    axis = draw(st.integers(0, rank - 1))
    shape[axis] = n
    x_type = draw(st.sampled_from([T.UINT8, T.INT8]))
    lo, hi = RANGE[x_type]
    zx = draw(st.sampled_from([lo, hi, (lo + hi + 1) // 2]) | st.integers(lo, hi))
    s = float(np.float32(draw(st.sampled_from([0.05, 0.0039, 0.7]) | st.floats(1e-3, 1.0))))
    steps = st.sampled_from([0.7, 3.5, 40.0]).map(lambda k: k * s)  # eps of a few input steps: where it decides
    eps = float(np.float32(draw(st.sampled_from([1e-12, 1e-6]) | steps)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.integers(lo, hi + 1, size=shape)
    if draw(st.booleans()):  # near-zero and zero rows, where eps decides
        x = np.clip(zx + rng.integers(-2, 3, size=shape), lo, hi)
    x.flat[0] = zx
    out = draw(st.sampled_from([None, (1 / 127, 0, T.INT8), (1 / 255, 128, T.UINT8)]) |
               st.tuples(st.floats(1e-3, 0.05), st.integers(-20, 20), st.just(T.INT8)))
    return form, tuple(shape), axis, x_type, s, zx, eps, out, x


@settings(max_examples=40, deadline=None)
@given(cases())
@example(("clip", (2, 2048), 1, T.UINT8, 0.039, 3, 1e-12, None, np.random.default_rng(0).integers(0, 256, (2, 2048))))
@example(("plain", (3, 5), 1, T.INT8, 0.05, 0, 1e-12, (1 / 127, 0, T.INT8), np.array([[0] * 5, [1] * 5, [-128] * 5])))
@example(("tf", (300, 1), 0, T.UINT8, float(np.float32(0.0039)), 0, float(np.float32(40 * 0.0039)), None,
          np.random.default_rng(1).integers(0, 256, (300, 1))))
@example(("rms", (300, 1), 0, T.UINT8, float(np.float32(0.05)), 0, float(np.float32(1e-12)), (1 / 255, 128, T.UINT8),
          np.random.default_rng(1).integers(0, 256, (300, 1))))
def test_l2_normalization_within_its_bound(case):
    """Every output within 1/2 + delta of the exact value (of the exact comparisons with eps), and equal to it
    rounded (QuantizeLinear's half to even, saturated) where that lies further than delta from a half-integer; a row
    of zeros with no eps: QuantizeLinear's NaN (the type's minimum), as a float output refused; an eps floor past the
    table's exact squares refused in one line (n = 300 at s = 0.0039, eps 40 steps: 10256 squared steps), as a row of
    256 values or more with no plan within half a step in 32 bits (300 at 4420 output steps per unit)."""
    check(*case)


def check(form, shape, axis, x_type, s, zx, eps, out, x, precision: int = 9):
    """The checks of the test above on one model and input (of ``precision`` bits); returns the plan (None where
    refused)."""
    m = l2_qdq(form, shape, axis, x_type, s, zx, eps, out)
    s_, eps_ = Fraction(float(np.float32(s))), Fraction(float(np.float32(eps)))
    exact = exact_l2(x - zx, axis, s_, form, eps_)
    if out is None and form == "plain":  # zero rows are reachable (zx lies within the type)
        with pytest.raises(CVMError, match=r"NaN \(0 / 0\) on a row of zeros"):
            import_model(m, input_precision=9)
        return None
    try:
        imp, got = imported(m, x, precision)
    except CVMError as e:  # the documented refusals: an eps floor past the table's exact squares, a wide row's
        far = re.search(r"eps lies \S+ squared input steps out \(at most 2\^(\d+)\)", str(e))  # 32-bit bound
        wide = re.search(r"over (\d+) values at \S+ output steps per unit has no integer form within half a step "
                         r"in 32 bits", str(e))
        assert far and eps_ / s_**2 > 2 ** int(far[1]) or wide and int(wide[1]) == shape[axis] >= 256, str(e)
        return None
    p = plan_of(imp)
    assert p.delta < Fraction(1, 2)
    if out is None:
        edge = imp.edges.outputs[0]
        so, zo, (lo, hi) = Fraction(float(edge.scale)), 0, RANGE[T.INT16]
    else:
        so, zo, (lo, hi) = Fraction(float(np.float32(out[0]))), out[1], RANGE[out[2]]
    want = exact / float(so) + zo
    nan = np.isnan(want)
    assert (got[nan] == lo).all()
    inside = ~nan & (got > lo) & (got < hi)
    err = np.abs(got - np.where(nan, 0, want))
    assert (err[inside] <= p.error + 1e-9).all(), (err[inside].max(), p.error)
    away = ~nan & (np.abs(want - np.floor(want) - 0.5) > float(p.delta) + 1e-9)
    assert np.array_equal(got[away], np.clip(np.rint(want[away]), lo, hi))
    return p


@pytest.mark.parametrize("form, out", [("clip", None), ("plain", (1 / 127, 0, T.INT8))])
def test_wide_rows(form, out):
    """Rows of 40000 values of 8 bits, whose sum of squares S passes 32 bits: its level and bucket from the squares
    split at 4^Q, exact (docs: "Wide rows"), every output within the bound; rows of S = 0, 1, 2^T - 1, 2^T, 2^T + 1
    (level 0 against level 1), all 255 and random."""
    n, rng = 40000, np.random.default_rng(3)
    x = np.full((8, n), 3)
    x[1, 0] = 4
    for row, total in ((2, 4095), (3, 4096), (4, 4097)):
        x[row, :total] = 4
    x[5], x[6], x[7] = 255, rng.integers(0, 256, n), 3 + rng.integers(0, 2, n) * 2 - 1
    p = check(form, (8, n), 1, T.UINT8, 0.039, 3, 1e-12, out, x)
    assert p.quarter >= 1 and p.table_bits == 12


@pytest.mark.parametrize("form", ["lp", "reducel2", "tf"])
def test_int16_rows_whose_squares_reach_31_bits(form):
    """int16 x within 8191 (14 bits) over 17 values: S up to 2^30, the table's bucket floor(S / 4^m) a division
    that keeps S's 32-bit label, narrowed by a clip (an identity) for the index's sum; every output within its bound
    (rows at the ends, of zeros, near zero). Before: 'precision bound exceeded: broadcast_add of inputs with
    precisions [17, 32] needs 33 bits'."""
    rng = np.random.default_rng(5)
    x = rng.integers(-8191, 8192, (5, 17))
    x[0], x[1], x[2], x[3] = 8191, -8191, 0, rng.integers(-2, 3, 17)
    p = check(form, (5, 17), 1, T.INT16, 0.001, 0, 1e-12, None, x, 14)
    assert p is not None and p.levels


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_form_agrees_with_onnxruntime(form):
    """Each form in a QDQ model (channels of NCHW, axis 1; uint8 in, int8 out), a zero row and a near-zero one
    included: onnxruntime's model (float normalization between the integers) within one step (an RMSNorm's output
    at sqrt(24) / 127, its span)."""
    rng = np.random.default_rng(1)
    shape = (2, 24, 3)
    m = l2_qdq(form, shape, 1, T.UINT8, 0.03, 90, 1e-12, ((math.sqrt(24) if form in RMS else 1) / 127, 0, T.INT8))
    x = rng.integers(0, 256, shape)
    x[0, :, 0] = 90
    x[1, :, 1] = 90 + rng.integers(-1, 2, 24)
    imp, got = imported(m, x)
    [want] = ort_session(m).run(None, {"x": x.astype(np.uint8)})
    assert np.abs(got - want.astype(np.int64)).max() <= 1
    assert plan_of(imp).delta < Fraction(1, 100)


@pytest.mark.parametrize("form, axis, reader", [(f, 1, f == "plain") for f in sorted(FORMS)] +
                         [("clip", 1, True), ("rsqrt", 3, True)])
def test_quantize_takes_each_form(tmp_path, form, axis, reader):
    """`quantize` of a float model (Conv, then the normalization, a float output or read by a Conv; with no eps only
    read: as a float output a row of zeros is NaN, refused): it imports
    whole (every form refused before), the normalization's nodes left float, and CVM's output
    as close to the float model as onnxruntime's quantized model's (within a step and a quarter on average)."""
    shape = (1, 16, 3, 4)
    onnx.save(l2_float(form, shape, axis, 1e-12, reader=reader), tmp_path / "f.onnx")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "cal.npy", rng.normal(size=(8, 1, 4, 3, 4)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "cal.npy", tmp_path / "cvm")
    q = onnx.load_from_string(done.onnx_model)
    kept = {n.op_type for n in q.graph.node if n.name.startswith("l2_") or n.output[0].startswith("l2_")}
    quantized = {i for n in q.graph.node if n.op_type == "QuantizeLinear" for i in n.input}
    assert kept and not any(o in quantized for n in q.graph.node if n.op_type in kept for o in n.output
                            if n.op_type not in ("Div", "Mul", "LpNormalization"))
    assert [r for r in done.imported.requants if r.layernorm]
    [a] = done.agreements
    assert a.mean_steps <= a.ort_mean_steps + 0.25, (a.mean_steps, a.ort_mean_steps)


def test_refusals_name_the_node():
    """LpNormalization p=3; squares past 32 bits (int16 x of 16 bits: the split's 4^Q a passes 32 bits in its
    label); an eps of 1000 input steps (past the table's exact level); a plan that cannot reach half a step: one
    line naming the node and the rule."""
    m = l2_qdq("lp", (2, 4), 1, T.UINT8, 0.1, 0, 0.0, (1 / 127, 0, T.INT8))
    m.graph.node[1].attribute[1].i = 3
    with pytest.raises(CVMError, match=r"l2_lp \(LpNormalization\): LpNormalization p=3 has no CVM form"):
        import_model(m, input_precision=9)
    m = l2_qdq("clip", (2, 64), 1, T.INT16, 0.1, 0, 1e-12, (1 / 127, 0, T.INT8), opset=21)
    with pytest.raises(CVMError, match=r"l2_div \(L2 normalization\): .*\|u\| <= 3276\d passes 32 bits in its sum "
                                      "of squares"):
        import_model(m, input_precision=16)
    m = l2_qdq("clip", (2, 600), 1, T.UINT8, 0.001, 0, 1.0, (1 / 127, 0, T.INT8))
    with pytest.raises(CVMError, match=r"l2_div \(L2 normalization\): .*eps lies 1e\+06 squared input steps out"):
        import_model(m, input_precision=9)
    with pytest.raises(Exception, match="no integer form within half a step"):
        l2_plan(4, 255, Fraction(0), Fraction(0), Fraction(1, 2**40), -128, 127)


@pytest.mark.parametrize("form", RMS)
def test_a_t5_block_with_a_written_out_rmsnorm_quantizes_whole(tmp_path, form):
    """`quantize` of a float T5-style block (MatMul, the RMSNorm written out over 48 values, its gain Mul, MatMul):
    imported whole, as close to float as onnxruntime's quantized model (1.1x), exported exactly. Refused before
    (no rule took the written-out RMSNorm: the T5 encoder's 'the divisor (Sqrt) must be quantized first')."""
    rng = np.random.default_rng(4)
    shape, d = (1, 6, 48), 48
    nodes, inits = l2_nodes(form, "h", "n", shape, 2, 1e-6)
    nodes = [h.make_node("MatMul", ["x", "w1"], ["h"]), *nodes, h.make_node("Mul", ["n", "g"], ["m"]),
             h.make_node("MatMul", ["m", "w2"], ["y"])]
    inits.update(w1=(rng.normal(size=(d, d)) / 4).astype(np.float32), g=rng.uniform(0.2, 2, d).astype(np.float32),
                 w2=(rng.normal(size=(d, 16)) / 7).astype(np.float32))
    g = h.make_graph(nodes, "t5", [h.make_tensor_value_info("x", T.FLOAT, list(shape))],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 6, 16])],
                     [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    onnx.save(onnx_model(g, 17, {}), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(8, *shape)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "cvm")
    assert [r for r in done.imported.requants if r.layernorm]
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, (a.mean_steps, a.ort_mean_steps)
    assert verify(done.imported.graph, None, seeds=2).exact
