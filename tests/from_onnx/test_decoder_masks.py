"""Decoder attention masks: a padding term of the attention_mask input combined with a causal matrix computed from
shapes (or folded), as transformers' and torch's exports write them (support/masks.py), added to the scores a
Softmax reads: imported as the masked Softmax of docs/import.md ("Masked Softmax"), the causal part folded into
each position's level, against the row-by-row oracle and onnxruntime; and through `quantize` (the Python function
and `cvm-onnx quantize` alike)."""
from __future__ import annotations

import gc
import math
from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import numpy_helper as nh
from support.masks import (FORMS, X_PRECISION, decoder_model, levelled_softmax_oracle, mask_length, scores_of,
                           term_of, torchscript_decoder)
from support.packed import bert_like, bert_samples, quantized_bert

from cvm_onnx.app import cli
from cvm_onnx.app.kept_float import masked_softmaxes
from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.from_onnx.quantized import masks
from cvm_onnx.core.errors import CVMError, UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.verify import verify

F32_MIN = float(np.finfo(np.float32).min)


def check_decoder(form: str, m: np.ndarray, x: np.ndarray, c: float, s: float, window: int | None = None) -> None:
    """The import of ``decoder_model`` on m and x: ``check_masked_softmax`` of the term onnxruntime computes."""
    b, heads, n, _ = x.shape
    model = decoder_model(form, b, heads, n, c, s, window)
    alone = form in ("causal", "eager_causal")  # no attention_mask input
    check_masked_softmax(model, scores_of(form, x), x, term_of(form, m, c, window), s, {} if alone else {"m": m})


def check_masked_softmax(model: onnx.ModelProto, v: np.ndarray, x: np.ndarray, term: np.ndarray, s: float,
                         masks: dict[str, np.ndarray]) -> None:
    """The import of ``model`` (int8 scores ``x`` at scale s plus a term of its integer inputs ``masks``, a Softmax
    to uint8 at 1/255) equals the oracle over each row's highest level of ``term`` (as onnxruntime computes it) of
    the scores ``v``, exports exactly, and is within one step of onnxruntime's model where a row keeps something or
    its level absorbs x; a row of -inf alone (float32's NaN) exactly."""
    imp = import_model(model, input_precision=X_PRECISION)
    feed = {"x": x.astype(np.int32), **{k: m.astype(np.int32) for k, m in masks.items()}} if masks else \
        {"data": x.astype(np.int32)}
    [got] = execute(imp.graph, feed)
    assert verify(imp.graph, feed).exact
    [p] = [r.softmax for r in imp.requants if r.softmax]
    big = 128 * float(np.float32(s))
    want = levelled_softmax_oracle(v, term, float(np.float32(s)), 1 / Fraction(float(np.float32(1 / 255))), p, 0, 0,
                                   255, big)
    assert np.array_equal(got.astype(np.int64), want)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    [ort_y] = session.run(None, {"x": x.astype(np.int8), **masks})
    top = np.broadcast_to(np.broadcast_to(term, x.shape).max(axis=-1, keepdims=True), x.shape)
    g = np.float32(-top)
    gap = np.where(np.isfinite(g), g - np.nextafter(g, np.float32(0)), np.inf)
    diff = np.abs(got.astype(np.int64) - ort_y.astype(np.int64))
    assert (diff[top == -np.inf] == 0).all()
    assert (diff[(top == 0) | (big < gap / 2)] <= 1).all()


@settings(max_examples=12, deadline=None)
@given(d=st.data(), form=st.sampled_from(FORMS), batch=st.integers(1, 2), heads=st.integers(1, 2),
       n=st.integers(1, 6), s=st.floats(2.0**-10, 2.0**2, width=32),
       c=st.sampled_from([F32_MIN, -10000.0, -1e9, -math.inf]))
def test_padding_and_causal_masks_equal_the_masked_softmax(d, form, batch, heads, n, s, c):
    """Every decoder form over random lengths, heads, scales, c (float32's min, -10000, -1e9, -inf; the forms
    multiplying by c not at -inf: 0 * -inf is NaN) and masks of a 2-bit input (-1, 0, 1: left and right padding,
    rows keeping nothing), a sliding window for transformers' to_4d, x at its extremes: equal to the oracle, within
    one step of onnxruntime where it keeps something or absorbs x. Regression: 'two tensors vary (a table takes
    one)', 'an Add operand is a float tensor that no DequantizeLinear produced' (Min), the causal part refused."""
    assume(not (form in ("min", "gpt2", "eager") and c == -math.inf))
    assume(not (form == "causal" and n == 1) and not (form == "cache_scatter" and n == 1))  # 1 x 1: no mask
    assume(float(np.float32(s)) * 128 * 2 + 106 <= 10000)
    window = d.draw(st.sampled_from([None, 1, 2])) if form == "to_4d" else None
    k = mask_length(form, n)
    m = np.asarray(d.draw(st.lists(st.integers(-1, 1), min_size=batch * k, max_size=batch * k)),
                   np.int64).reshape(batch, k)
    x = np.asarray(d.draw(st.lists(st.integers(-128, 127), min_size=batch * heads * n * n,
                                   max_size=batch * heads * n * n)), np.int64).reshape(batch, heads, n, n)
    check_decoder(form, m, x, c, s, window)


@settings(max_examples=60, deadline=None)
@given(top=st.sampled_from([1, 2, 7, 300, 1 << 20, 1 << 47]), shape=st.lists(st.integers(1, 9), min_size=1,
                                                                            max_size=3), seed=st.integers(0, 99))
def test_the_constant_keys_unique_is_numpys(top, shape, seed):
    """The causal matrices' keys are compacted by a table of their range where it is small, else by numpy's sort:
    the values and the inverse of np.unique either way."""
    a = np.random.default_rng(seed).integers(0, top, shape)
    values, inverse = masks._unique(a)
    want, index = np.unique(a, return_inverse=True)
    assert np.array_equal(values, want) and np.array_equal(inverse.reshape(-1), index.reshape(-1))


def test_gpt2s_eager_where_over_one_key_keeps_the_scores():
    """GPT-2's eager Where over one query and one key: its causal condition is one value, keeping everything,
    broadcast over the heads: the scores themselves. Regression: refused, 'a constant branch past 32 bits'."""
    for c in (F32_MIN, -10000.0):
        check_decoder("eager", np.array([[1], [0]]), np.array([-128, 127, 0, 5]).reshape(2, 2, 1, 1), c, 0.5)


@pytest.mark.parametrize("form", FORMS)
def test_left_padded_rows_at_every_level(form):
    """Left padding (a padded query sees only padding: a row masked throughout), right padding, -1s and a row of
    -1s, x at its extremes, c float32's min (absorbing x: uniform rows) and BERT's -10000: as the oracle and
    onnxruntime."""
    m = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [-1, 0, 1, -1, 1], [-1, -1, -1, -1, -1]])
    x = np.tile(np.array([-128, 127, 5, 0, -3]), (4, 2, 5, 1))
    for c in (F32_MIN, -10000.0):
        check_decoder(form, m[:, :mask_length(form, 5)], x, c, 0.25)


@pytest.mark.parametrize("form", FORMS)
def test_a_kept_row_reads_int8s_least_value(form):
    """x = -128 (int8's least) beside -121 at s = 1 in a row keeping both: [255, 0], the exact softmax (254.77, 0.23)
    rounded, as onnxruntime reads x. Regression: imported at precision 8, the runtime clamped -128 to -127 and gave
    [254, 1] against the oracle of -128."""
    check_decoder(form, np.ones((1, mask_length(form, 2)), np.int64), np.tile(np.array([-121, -128]), (1, 1, 2, 1)),
                  F32_MIN, 1.0)


def test_a_table_past_2_16_keys_is_refused_in_one_line():
    """A term over an input of 16 bits at a causal matrix of two values: 2^17 keys, refused in one line naming the
    node and the bound."""
    model = decoder_model("legacy", 1, 1, 4, -10000.0, 0.25)
    model.graph.input[1].metadata_props[0].value = "16"
    with pytest.raises(CVMError) as e:
        import_model(model, input_precision=8)
    assert len(str(e.value).splitlines()) == 1 and "would hold more than 2^16 entries" in str(e.value), e.value


@pytest.mark.parametrize("form, c", [("legacy", F32_MIN), ("cache", -10000.0), ("causal", F32_MIN),
                                     ("eager", F32_MIN), ("eager_causal", -10000.0), ("cache_scatter", F32_MIN)])
def test_decoder_masks_keep_the_scores_on_their_own_grid(tmp_path, form, c):
    """The BERT-like model with a decoder's padding and causal term of its int64 mask (1, L), or its folded causal
    matrix alone, or GPT-2's Where on the scores (then its padding term): quantize leaves the term's float nodes, the
    Where, the Add and the Softmax float (the causal part folded by onnxruntime's optimizer), the importer takes the
    masked Softmax: within 1.1x onnxruntime's quantized model's distance from float, exported exactly, and
    onnxruntime's quantized model within one step on held-out masks with -1s. Regression: refused ('Cast of
    dequantized values to bool'; to_4d's form was quantized at the grid of c: 6.40 mean steps against 0.60; GPT-2's
    Where quantized at the grid of c)."""
    samples, held = bert_samples(), bert_samples(4, seed=7)
    for d in (samples, held):
        d["mask"] = d["mask"].astype(np.int64).reshape(-1, 1, 6)[..., :mask_length(form, 6)]
        if "causal" in form:
            del d["mask"]
    done, qm = quantized_bert(tmp_path, bert_like(low=c, decoder=form), samples)
    assert done.agreements[0].mean_steps < 1, done.agreements[0].line()
    assert [n.input[0] for n in qm.graph.node if n.op_type == "Softmax"] == ["s2"]
    assert verify(done.imported.graph, seeds=2).exact
    if "causal" not in form:
        held["mask"][0, 0, 1:3] = -1
        held["mask"][1, 0, 0] = -1
    session = ort.InferenceSession(tmp_path / "q.onnx", providers=["CPUExecutionProvider"])
    [edge] = done.imported.edges.outputs
    xs = done.imported.edges.pack(held) if "causal" not in form else held["input_ids"]
    for k, x in enumerate(xs):
        [got] = execute(done.imported.graph, {"data": x})
        [want] = session.run(None, {name: v[k] for name, v in held.items()})
        assert np.abs(got.astype(np.int64) - edge.quantize(want).astype(np.int64)).max() <= 1


@pytest.mark.parametrize("c, causal, found", [(F32_MIN, None, True), (-10000.0, None, True),
                                              (-9999.0, None, False),  # above MASK_LOW: quantized as before
                                              (-10000.0, 1.0, False)])  # a positive entry: no mask
def test_decoder_masks_found_for_quantize_to_leave_float(c, causal, found):
    """HF's (1 - m) c plus a folded causal matrix (an initializer of 0 and c): the term's float nodes, the Add and the
    Softmax, for quantize_static's nodes_to_exclude, where every value at m = 0 and 1 with each causal entry is 0 or
    at most -10000; a value above (c = -9999, a causal entry of 1): none. Regression: none found (a constant of
    several values was no mask's)."""
    model = bert_like(low=c, decoder="gpt2")
    if causal is not None:
        [t] = [t for t in model.graph.initializer if t.name == "causal"]
        t.CopyFrom(nh.from_array(np.where(nh.to_array(t) == 0, np.float32(causal), nh.to_array(t)), "causal"))
    ops = sorted(n.op_type for n in masked_softmaxes(model))
    assert ops == (["Add", "Add", "Cast", "Mul", "Softmax", "Squeeze", "Sub"] if found else []), ops


def test_constant_keys_of_many_values_do_not_overflow():
    """Five constants of 40000 distinct values each (a variadic Min's operands) combined into one key: each one's
    values indexed by it are its own at every position. Regression: the joint key, 10^23 tuples, wrapped in int64."""
    from cvm_onnx.converters.from_onnx.context import INT32, const
    from cvm_onnx.converters.from_onnx.quantized.masks import _constant_key

    rng = np.random.default_rng(0)
    n = 40000
    idx = [rng.permutation(n) for _ in range(5)]
    values = [np.arange(n, dtype=np.float32) * -(k + 1) for k in range(5)]
    c, per = _constant_key([(const(i.astype(np.int32), INT32), 0, v) for i, v in zip(idx, values)])
    for i, v, p in zip(idx, values, per):
        assert np.array_equal(p[c], v[i])


@settings(max_examples=25, deadline=None)
@given(form=st.sampled_from(FORMS), d=st.data())
def test_mask_constants_and_scales_of_any_shape_import_or_are_refused_in_one_line(form, d):
    """A decoder form whose float constants (c, 0, 1, a folded causal matrix) and the scores' scale take shapes the
    rule did not expect (empty, (2,), a row too long, more axes): imported, or refused one line per problem, each
    naming its node. Regression: an internal ValueError "shape mismatch ... (1, 1, 6)" (the fuzz target's
    mutated scale and mask constant shapes on the masked BERT-like model), "operands could not be broadcast"."""
    model = decoder_model(form, 1, 1, 4, -10000.0, 0.25)
    inits = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    for t in d.draw(st.lists(st.sampled_from(inits), min_size=1, max_size=3, unique_by=lambda t: t.name)):
        shape = d.draw(st.sampled_from([(0,), (2,), (1, 1, 6), (1, 1, 2, 4), (1,), (4, 4), (3, 1, 1, 1)]))
        v = nh.to_array(t).reshape(-1)
        t.CopyFrom(nh.from_array(np.resize(v, shape) if v.size else np.zeros(shape, np.float32), t.name))
    try:
        import_model(model, input_precision=X_PRECISION)
    except CVMError as e:
        assert e.problems and all("\n" not in str(p) and p.where for p in e.problems), e


def test_an_attention_bias_of_an_embedding_with_inf_rows_is_refused_in_one_line(tmp_path):
    """An attention bias from an embedding whose table holds a -inf row (chython-rxnmap's distance embedding: Gather
    of a float table by an int64 input, added to the scores): its finite rows are a float bias of the scores, which
    no table of 0 and masked levels holds, and onnxruntime.quantization computes scales from finite weights only:
    quantize refuses it in one line naming the Gather and the rule."""
    from cvm_onnx.core.errors import UnsupportedError

    model = bert_like(low=-10000.0)
    [where] = [n for n in model.graph.node if n.op_type == "Where"]
    nodes = [n for n in model.graph.node if n.op_type != "Cast"]
    nodes[nodes.index(where)] = onnx.helper.make_node("Gather", ["table", "mask"], ["bias"], name="distance")
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.append(nh.from_array(np.array([-np.inf, 0.3, -0.7], np.float32), "table"))
    onnx.save(model, tmp_path / "b.onnx")
    samples = bert_samples()
    samples["mask"] = samples["mask"].astype(np.int64)
    np.savez(tmp_path / "c.npz", **samples)
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "b.onnx", tmp_path / "c.npz", tmp_path / "m")
    [p] = e.value.problems
    assert "\n" not in str(p) and "'table' holds -inf" in p.rule and "distance (Gather)" in p.rule and \
        "finite weights only" in p.rule, p


@pytest.mark.parametrize("c, found", [(np.float32(-10000), True), (np.float32(-9999), False),
                                      (np.full(2, -10000, np.float32), False)])
def test_gpt2_where_left_float_only_at_one_masking_value(c, found):
    """GPT-2's Where(causal, scores, c): quantize leaves it float (with the padding term, the Add and the Softmax)
    where c is one value at most -10000; at -9999, or a constant of several values (which the importer's masked
    Where does not take), quantize_static quantizes it as any Where. Regression: a c of several values was left
    float though the import then refused it."""
    model = bert_like(low=F32_MIN, decoder="eager")
    [where] = [n for n in model.graph.node if n.op_type == "Where" and "s1" in n.input]
    where.input[2] = "cw"
    model.graph.initializer.append(nh.from_array(c, "cw"))
    assert any(n is where for n in masked_softmaxes(model)) == found


def test_an_int8_input_at_8_bits_reads_minus_128_as_minus_127():
    """docs/import.md's bound of an int8 input declared 8 bits: exact on -127..127, -128 read as -127 (the runtime's
    clamp). The slice-assigned cache mask's Softmax (scores at 0.1, output at 1/255) fed a -128 where onnxruntime's
    row sum moves by a tenth: at 8 bits it is onnxruntime's output at -127 (5 output steps from its output at
    -128), at 9 bits onnxruntime's at -128 (the newest fuzz hunt's 5-step lead)."""
    from support.quantized import ort_session

    model = decoder_model("cache_scatter", 2, 2, 5, float(np.finfo(np.float32).min), 0.1)
    rng = np.random.default_rng(143)
    x = rng.integers(-128, 128, (2, 2, 5, 5)).astype(np.int8)
    m = rng.integers(-1, 2, (2, 4))
    sess = ort_session(model)
    at = {v: sess.run(None, {"x": np.maximum(x, v), "m": m})[0].astype(np.int64) for v in (-128, -127)}
    assert np.abs(at[-128] - at[-127]).max() > 1
    for bits, want in ((8, at[-127]), (9, at[-128])):
        got = execute(import_model(model, input_precision=bits).graph, {"x": x.astype(np.int32), "m": m})[0]
        assert np.array_equal(got.reshape(want.shape), want), bits


def both_paths(tmp_path, monkeypatch, model: onnx.ModelProto) -> tuple:
    """``model`` quantized by the Python ``quantize`` and by ``cvm-onnx quantize`` on 8 token sequences, with the
    garbage collector run as ``masked_softmaxes`` returns (a long process's collector runs at any allocation): (the
    Python result or its UnsupportedError, the CLI's exit status)."""
    def collected(*args):
        found = masked_softmaxes(*args)
        gc.collect()
        return found

    monkeypatch.setattr("cvm_onnx.app.quantize.masked_softmaxes", collected)
    onnx.save(model, tmp_path / "d.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(3).integers(0, 30, (8, 1, 6)))
    try:
        done = quantize(tmp_path / "d.onnx", tmp_path / "c.npy", tmp_path / "py", save_onnx=tmp_path / "py.onnx")
    except UnsupportedError as e:
        done = e
    code = cli.main(["quantize", str(tmp_path / "d.onnx"), "--calibration", str(tmp_path / "c.npy"), "-o",
                     str(tmp_path / "cli"), "--save-onnx", str(tmp_path / "cli.onnx")])
    return done, code


@pytest.mark.parametrize("c", [-math.inf, F32_MIN])
def test_a_torchscript_causal_mask_quantizes_alike_on_both_paths(tmp_path, monkeypatch, capsys, c):
    """A decoder whose layers each add Where(causal, Constant 0, Constant c) to their scores (torch's TorchScript
    export of Phi3; c -inf or float32's min): both paths leave the masks float and import the masked Softmaxes,
    writing the same model byte for byte. Regression (-inf): refused as 'the Constant 'l0_c' holds -inf' where the
    collector ran between masked_softmaxes and non_finite's look-up of its nodes by id (protobuf makes a freed
    node's object anew: the fourth sweep's phi3 export, imported whole by its sweep and refused by another
    driver)."""
    done, code = both_paths(tmp_path, monkeypatch, torchscript_decoder(2, c))
    assert not isinstance(done, Exception), done
    assert code == 0, capsys.readouterr().err
    for name in ("symbol", "params", "quantization.json"):
        assert (tmp_path / "py" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    assert (tmp_path / "py.onnx").read_bytes() == (tmp_path / "cli.onnx").read_bytes()
    qm = onnx.load(tmp_path / "py.onnx")
    assert [n.input[0] for n in qm.graph.node if n.op_type == "Softmax"] == ["l0_a", "l1_a"]
    assert sum(bool(r.softmax) for r in done.imported.requants) == 2
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=2).exact


def test_a_minus_inf_reaching_quantized_scores_is_refused_alike_on_both_paths(tmp_path, monkeypatch, capsys):
    """The same decoder with its last layer's masked scores also read by a ReduceMax: quantize_static would
    quantize those scores, whose range reaches -inf (an infinite scale), so both paths refuse it in the same one
    line, naming that layer's Constant and its Where. Regression: the line named the first layer's Constant (kept
    float) where the collector ran between masked_softmaxes and non_finite's look-up of its nodes by id."""
    done, code = both_paths(tmp_path, monkeypatch, torchscript_decoder(3, -math.inf, pooled=True))
    assert isinstance(done, UnsupportedError)
    [p] = done.problems
    assert "'l2_c' holds -inf" in p.rule and "l2_bias (Where)" in p.rule, p
    assert code == done.exit_code
    assert capsys.readouterr().err.splitlines() == [f"{done.kind}: {p}"]
