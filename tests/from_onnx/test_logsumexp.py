"""ReduceLogSumExp of a dequantized value (docs/import.md, "ReduceLogSumExp: the integer form and its bound"): over
any axes, keepdims either way, quantized or a float output; within 1/2 + delta of the float64 LSE of the
dequantized integers, onnxruntime's QDQ model within 1 + delta, the export bit-exact."""
from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np
import onnx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper
from onnx import numpy_helper as nh
from support.masks import FORMS
from support.quantized import ort_session, qdq

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import CVMError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify

SETTINGS = settings(max_examples=10, deadline=None)
NP = {T.INT8: np.int8, T.UINT8: np.uint8}
RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255)}


def lse_model(shape, x_type, inits, axes, keep: int, opset: int, out_type):
    """DequantizeLinear, ReduceLogSumExp over ``axes`` (an attribute before opset 18, an input from it on), then
    QuantizeLinear (out_type quantized) or a float output."""
    out = "lf" if out_type != T.FLOAT else "y"
    if opset >= 18:
        inits = inits | {"axes": np.array(axes, np.int64)}
        nodes = [h_node("ReduceLogSumExp", ["xf", "axes"], [out], keepdims=keep)]
    else:
        nodes = [h_node("ReduceLogSumExp", ["xf"], [out], axes=axes, keepdims=keep)]
    nodes.insert(0, h_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]))
    if out_type != T.FLOAT:
        nodes.append(h_node("QuantizeLinear", ["lf", "so", "zo"], ["y"]))
    return qdq(nodes, shape, x_type, inits, out_type, opset=opset)


def h_node(*a, **k):
    return helper.make_node(*a, **k)


def lse(real: np.ndarray, axes: tuple[int, ...], keep: int) -> np.ndarray:
    """float64 LSE: max + log sum exp(x - max)."""
    top = real.max(axis=axes, keepdims=True)
    y = top + np.log(np.exp(real - top).sum(axis=axes, keepdims=True))
    return y if keep else y.squeeze(axis=axes)


def tail_scale(m: float) -> float:
    """The float tail's int16 scale: the least float32 with 32767 scale >= m."""
    scale = np.float32(m / 32767)
    while float(scale) * 32767 < m:
        scale = np.nextafter(scale, np.float32(np.inf))
    return float(scale)


def run(m, x, out_type, so, zo, s, zx, axes, keep):
    """(the import's output, its plan, the float64 LSE in output steps, the output's range, q)."""
    imp = import_model(m, input_precision=9)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    assert verify(imp.graph, x.astype(np.int32)).exact
    [p] = [r.logsoftmax for r in imp.requants if r.logsoftmax]
    n = math.prod(x.shape[a] for a in axes)
    if out_type == T.FLOAT:
        t_lo, t_hi = RANGE[m.graph.input[0].type.tensor_type.elem_type]
        so = tail_scale(max(abs((t_lo - zx) * s), abs((t_hi - zx) * s + math.log(n))))
        zo, (lo, hi) = 0, (-32768, 32767)
    else:
        lo, hi = RANGE[out_type]
    q = 1 / Fraction(float(np.float32(so)))
    exact = lse((x - zx) * s, axes, keep) * float(q) + zo
    return got.astype(np.int64), p, exact, lo, hi


@SETTINGS
@given(d=st.data(), shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
       x_type=st.sampled_from([T.INT8, T.UINT8]), out_type=st.sampled_from([T.INT8, T.UINT8, T.FLOAT]),
       s=st.floats(2.0**-10, 2.0**2, width=32), so=st.sampled_from([1 / 16, 0.1, 0.05, 0.02, 1.0]),
       opset=st.sampled_from([13, 18]), keep=st.sampled_from([0, 1]))
def test_lse_within_its_bound_of_float_and_onnxruntime(d, shape, x_type, out_type, s, so, opset, keep):
    """Over any set of axes, keepdims either way, zero points anywhere (extreme integers too), quantized or a float
    output: every unsaturated output within 1/2 + delta of LSE(x s) q + z_out (float64), and onnxruntime's QDQ model
    within 1 + delta of it. Refused ("no CVM op") before the rule."""
    rank = len(shape)
    axes = tuple(sorted(d.draw(st.sets(st.integers(0, rank - 1), min_size=1))))
    zx = d.draw(st.integers(*RANGE[x_type]))
    zo = d.draw(st.integers(*RANGE[out_type])) if out_type != T.FLOAT else 0
    inits = {"s": np.float32(s), "zx": NP[x_type](zx)}
    if out_type != T.FLOAT:
        inits |= {"so": np.float32(so), "zo": NP[out_type](zo)}
    lo_x, hi_x = RANGE[x_type]
    x = np.asarray(d.draw(st.lists(st.sampled_from([lo_x, hi_x]) | st.integers(lo_x, hi_x),
                                   min_size=math.prod(shape), max_size=math.prod(shape))), np.int64).reshape(shape)
    m = lse_model(shape, x_type, inits, list(axes), keep, opset, out_type)
    got, p, exact, lo, hi = run(m, x, out_type, so, zo, float(np.float32(s)), zx, axes, keep)
    assert got.shape == (exact.shape or (1,))  # a scalar as CVM's one value
    got = got.reshape(exact.shape)
    inside = (got > lo) & (got < hi)
    assert (np.abs(got - exact)[inside] <= p.error + 1e-9).all()
    assert (got[exact >= hi + p.error] == hi).all() and (got[exact <= lo - p.error] == lo).all()
    [want] = ort_session(m).run(None, {"x": x.astype(NP[x_type])})
    if out_type == T.FLOAT:  # float32 LSE against the int16 steps: 1/2 + delta and float32's error
        q = (exact - zo) / np.where(exact == 0, 1, lse((x - zx) * float(np.float32(s)), axes, keep))
        assert (np.abs(got - want.astype(np.float64) * q)[inside] <= p.error + 1e-3).all()
    else:
        assert (np.abs(got - want.astype(np.int64))[inside] <= 1 + p.delta + 1e-6).all()


def test_lse_of_many_equal_maxima_read_by_a_float_sub():
    """6625 values a row, half of them at the max (the largest sum), read by a float Sub then quantized (TesseraNet's
    mask statistics: quantize_static quantizes no Sub after it): the LSE first as a float output (int16, within
    1/2 + delta of its steps s_t), the Sub exact, then the QuantizeLinear; onnxruntime's QDQ model within one step
    plus the int16 form's error in output steps."""
    n = 6625
    rng = np.random.default_rng(n)
    x = rng.integers(-128, 128, size=(2, n))
    x[0, :n // 2] = 127
    inits = {"s": np.float32(0.05), "zx": np.int8(3), "so": np.float32(0.1), "zo": np.uint8(7), "c": np.float32(9)}
    nodes = [h_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h_node("ReduceLogSumExp", ["xf"], ["l"], axes=[1], keepdims=1), h_node("Sub", ["l", "c"], ["d"]),
             h_node("QuantizeLinear", ["d", "so", "zo"], ["y"])]
    m = qdq(nodes, x.shape, T.INT8, inits, T.UINT8, opset=13)
    imp = import_model(m, input_precision=9)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    assert verify(imp.graph, x.astype(np.int32)).exact
    [p] = [r.logsoftmax for r in imp.requants if r.logsoftmax]
    s_t = tail_scale(max(abs(-131 * 0.05), abs(124 * float(np.float32(0.05)) + math.log(n))))
    margin = p.error * s_t / float(np.float32(0.1))
    exact = (lse((x - 3) * float(np.float32(0.05)), (1,), 1) - 9) / float(np.float32(0.1)) + 7
    [want] = ort_session(m).run(None, {"x": x.astype(np.int8)})
    assert (np.abs(got - exact) <= 0.5 + margin + 1e-6).all()
    assert (np.abs(got.astype(np.int64) - want) <= 1).all()


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_quantize_static_leaves_it_float_and_it_imports(tmp_path, fmt):
    """quantize_static (QDQ and QOperator alike) leaves ReduceLogSumExp and the Sub and Relu after it float after a
    DequantizeLinear: a float tail, the LSE imported as its int16 form (within 1/2 + delta of its steps s_t), the
    Sub's exact sum as the output's int16 (1/2 more): onnxruntime's quantized model's float output within those."""
    from onnxruntime import quantization
    from support.quantized import Reader

    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 3, 3, 3)).astype(np.float32)
    nodes = [h_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             h_node("ReduceLogSumExp", ["c"], ["l"], axes=[-1], keepdims=0), h_node("Sub", ["l", "k"], ["d"]),
             h_node("Relu", ["d"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", T.FLOAT, None)],
                          [nh.from_array(w, "w"), nh.from_array(np.float32(1.0), "k")])
    onnx.save(onnx_model(g, 13), tmp_path / "f.onnx")
    quantization.quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader([1, 3, 8, 8]),
                                 quant_format=getattr(quantization.QuantFormat, fmt))
    m = onnx.load(tmp_path / "q.onnx")
    assert [n.op_type for n in m.graph.node][-3:] == ["ReduceLogSumExp", "Sub", "Relu"]
    imp = import_model(m, input_precision=9)
    [p] = [r.logsoftmax for r in imp.requants if r.logsoftmax]
    e_in, [e_out] = imp.edges.input, imp.edges.outputs
    init = {i.name: nh.to_array(i) for i in m.graph.initializer}
    [dq] = [n for n in m.graph.node if n.output[0] == m.graph.node[-3].input[0]]
    s_c, z_c = float(init[dq.input[1]]), int(init[dq.input[2]])
    lo, hi = (-128, 127) if init[dq.input[2]].dtype == np.int8 else (0, 255)
    s_t = tail_scale(max(abs((lo - z_c) * s_c), abs((hi - z_c) * s_c + math.log(8))))  # the LSE's int16 steps
    x = rng.normal(size=(4, 1, 3, 8, 8)).astype(np.float32)
    session = ort_session(m)
    for xi in x:
        ti = np.clip(np.rint(xi / e_in.scale) + e_in.zero_point, -128 if e_in.type == "int8" else 0,
                     127 if e_in.type == "int8" else 255)
        [got] = execute(imp.graph, {"data": ti.astype(np.int32)})
        [want] = session.run(None, {"x": xi})
        steps = np.abs(got.reshape(want.shape) * float(e_out.scale) - want) / float(e_out.scale)
        assert (steps <= p.error * s_t / float(e_out.scale) + 0.5 + 1e-3).all(), steps.max()


def test_lse_of_a_sum_of_two_scales_is_refused_naming_the_node():
    """An input that is no one dequantized value (a sum at two scales) is refused in one line naming the node."""
    inits = {"s": np.float32(0.05), "zx": np.int8(0), "s2": np.float32(0.03), "so": np.float32(0.1),
             "zo": np.uint8(0)}
    nodes = [h_node("DequantizeLinear", ["x", "s", "zx"], ["a"]), h_node("DequantizeLinear", ["x", "s2", "zx"], ["b"]),
             h_node("Add", ["a", "b"], ["xf"]), h_node("ReduceLogSumExp", ["xf"], ["l"], axes=[1], name="lse"),
             h_node("QuantizeLinear", ["l", "so", "zo"], ["y"])]
    with pytest.raises(CVMError, match=r"lse \(ReduceLogSumExp\).*the ReduceLogSumExp input \(a sum\) must be "
                                       r"quantized"):
        import_model(qdq(nodes, (2, 5), T.INT8, inits, T.UINT8, opset=13), input_precision=9)


def test_lse_over_too_many_values_is_refused_at_its_node():
    """Over 40000 values (F = 14) E's roundings alone could move the sum by more than half of it: refused in one line
    naming the ReduceLogSumExp (not the QuantizeLinear after it, as before the count was checked at the rule)."""
    inits = {"s": np.float32(0.05), "zx": np.int8(0), "so": np.float32(0.1), "zo": np.uint8(0)}
    nodes = [h_node("DequantizeLinear", ["x", "s", "zx"], ["a"]),
             h_node("ReduceLogSumExp", ["a"], ["l"], axes=[1], name="lse"),
             h_node("QuantizeLinear", ["l", "so", "zo"], ["y"])]
    with pytest.raises(CVMError, match=r"lse \(ReduceLogSumExp\).*a ReduceLogSumExp over 40000 values has no integer "
                                       r"form"):
        import_model(qdq(nodes, (1, 40000), T.INT8, inits, T.UINT8, opset=13), input_precision=9)


@SETTINGS
@given(d=st.data(), form=st.sampled_from(FORMS), batch=st.integers(1, 2), n=st.integers(2, 5),
       s=st.floats(2.0**-6, 2.0**0, width=32), so=st.sampled_from([1 / 16, 0.1, 0.5]),
       c=st.sampled_from([float(np.finfo(np.float32).min), -10000.0, -1e9, -math.inf]))
def test_lse_of_masked_scores_over_the_kept_positions(d, form, batch, n, s, so, c):
    """ReduceLogSumExp of int8 scores plus each decoder mask form (support/masks.py: padding and causal terms, GPT-2's
    Where on the scores, the slice assignment) over the last axis, 2-bit masks (-1, 0, 1: rows masked throughout):
    a row keeping something within 1/2 + delta of the float64 LSE of its kept scores (unsaturated), a row masked
    throughout the output's least value, as onnxruntime gives it (within 1 + delta where kept). Regression: refused
    (the masked scores taken as one dequantized value: 'a constant holds 3.4e38, beyond 32 bits', 'Where of a
    constant branch off the other branch's grid')."""
    from support.masks import decoder_model, mask_length, scores_of, term_of

    assume(not (form in ("min", "gpt2", "eager") and c == -math.inf))
    k = mask_length(form, n)
    m = np.asarray(d.draw(st.lists(st.integers(-1, 1), min_size=batch * k, max_size=batch * k)),
                   np.int64).reshape(batch, k)
    x = np.asarray(d.draw(st.lists(st.sampled_from([-128, 127]) | st.integers(-128, 127), min_size=batch * n * n,
                                   max_size=batch * n * n)), np.int64).reshape(batch, 1, n, n)
    model = decoder_model(form, batch, 1, n, c, s, so=so, lse=True)
    imp = import_model(model, input_precision=9)
    alone = form in ("causal", "eager_causal")
    feed = {"x": x.astype(np.int32), "m": m.astype(np.int32)} if not alone else {"data": x.astype(np.int32)}
    [got] = execute(imp.graph, feed)
    assert verify(imp.graph, feed).exact
    [p] = [r.logsoftmax for r in imp.requants if r.logsoftmax]
    term = np.broadcast_to(term_of(form, m, c), x.shape)
    kept = term == term.max(axis=-1, keepdims=True)
    real = np.where(kept, scores_of(form, x) * float(np.float32(s)), -np.inf)
    exact = lse(real, (3,), 1) * float(1 / Fraction(float(np.float32(so))))
    got = got.reshape(exact.shape).astype(np.int64)
    masked = term.max(axis=-1, keepdims=True) < 0
    assert (got[masked] == -128).all()
    inside = ~masked & (got > -128) & (got < 127)
    assert (np.abs(got - exact)[inside] <= p.error + 1e-9).all()
    [want] = ort_session(model).run(None, {"x": x.astype(np.int8), **({"m": m} if not alone else {})})
    assert (want.reshape(got.shape)[masked] == -128).all()
    assert (np.abs(got - want.reshape(got.shape))[inside] <= 1 + p.delta + 1e-6).all()


@pytest.mark.parametrize("form", [None, "eager"])
def test_quantize_leaves_masked_scores_float_for_the_lse(tmp_path, form):
    """The BERT-like model with ReduceLogSumExp of its masked scores over the keys (torch's Where(keep, 0, c) added,
    or GPT-2's Where on the scores then HF's padding term): quantize leaves the mask's nodes, the Add and the
    ReduceLogSumExp float, the importer takes the masked LSE: within 1.1x onnxruntime's quantized model's distance
    from float, exported exactly. Regression: refused (the masked scores quantized at c's grid: 'a
    ReduceLogSumExp over 6 values has no integer form here')."""
    from support.packed import bert_like, bert_samples, quantized_bert

    samples = bert_samples()
    samples["mask"] = samples["mask"].astype(np.int64).reshape(-1, 1, 6) if form else samples["mask"].astype(np.int64)
    done, qm = quantized_bert(tmp_path, bert_like(low=float(np.finfo(np.float32).min), decoder=form, lse=True),
                              samples)
    assert [n.input[0] for n in qm.graph.node if n.op_type == "ReduceLogSumExp"] == ["s2"]
    assert verify(done.imported.graph, seeds=2).exact


def test_lse_of_masked_scores_whose_masked_rows_do_not_saturate_is_refused():
    """BERT's -10000 at an output scale of 100: a row masked throughout is -10000 + its LSE, -100 steps, which int8
    holds: refused in one line naming the node, the level and the output's least value."""
    from support.masks import decoder_model

    model = decoder_model("legacy", 1, 1, 4, -10000.0, 0.25, so=100.0, lse=True)
    with pytest.raises(CVMError) as e:
        import_model(model, input_precision=9)
    assert len(e.value.problems) == 1 and "\n" not in str(e.value), e.value
    assert re.search(r"ReduceLogSumExp.*at -10000: a row masked throughout .* least value -128", str(e.value)), e.value
