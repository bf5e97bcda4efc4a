"""ArgMax, ArgMin, TopK and GatherElements (a model's heads: greedy decoding, top-k) as CVM graphs of maxima and
comparisons, on integer inputs against exact numpy oracles and onnxruntime, and on dequantized inputs (QDQ models)
against onnxruntime on the same model: indices and values equal element for element, ties and extreme values
(all equal, the type's min and max, 32-bit precision) included; the imports export to ONNX bit-exactly."""
from __future__ import annotations

import math
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support import bound
from support.quantized import qdq

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.from_onnx.reduce import MAX_TOPK
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify

SETTINGS = settings(max_examples=20, deadline=None)
NP = {T.INT8: np.int8, T.UINT8: np.uint8, T.INT16: np.int16, T.UINT16: np.uint16, T.INT32: np.int32,
      T.INT64: np.int64}
shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple)


def draw_x(d, shape, dtype: int, p: int) -> np.ndarray:
    """Values of ``dtype`` within precision p, from a few values (ties) or anywhere, with the extremes often."""
    info = np.iinfo(NP[dtype])
    lo, hi = max(int(info.min), -bound(p)), min(int(info.max), bound(p))
    pool = d.draw(st.one_of(st.just([lo, hi]), st.lists(st.integers(lo, hi), min_size=1, max_size=3)))
    elems = st.one_of(st.sampled_from(sorted({lo, hi, min(max(0, lo), hi), *pool})), st.integers(lo, hi))
    return np.array(d.draw(st.lists(elems, min_size=math.prod(shape), max_size=math.prod(shape))),
                    NP[dtype]).reshape(shape)


def arg_oracle(x: np.ndarray, axis: int, is_min: bool, last: bool, keep: bool) -> np.ndarray:
    v = np.moveaxis(x.astype(np.int64), axis, -1)
    v = -v if is_min else v
    i = v.shape[-1] - 1 - np.argmax(v[..., ::-1], -1) if last else np.argmax(v, -1)
    return np.expand_dims(i, axis) if keep else i


def topk_oracle(x: np.ndarray, axis: int, k: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """The k largest (smallest) along ``axis`` in order, equal values by lower index first."""
    v = np.moveaxis(x.astype(np.int64), axis, -1)
    order = np.argsort(-v if largest else v, axis=-1, kind="stable")[..., :k]
    return np.moveaxis(np.take_along_axis(v, order, -1), -1, axis), np.moveaxis(order, -1, axis)


def by_index(values: np.ndarray, indices: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's values and indices along ``axis``, in the order of the indices."""
    v, i = np.moveaxis(values, axis, -1), np.moveaxis(indices, axis, -1)
    order = np.argsort(i, -1)
    return np.take_along_axis(v, order, -1), np.take_along_axis(i, order, -1)


def one_node(op, shape, dtype, outs, inits=(), opset=17, **attrs):
    g = h.make_graph([h.make_node(op, ["x", *dict(inits)], list(outs), name="head", **attrs)], "t",
                     [h.make_tensor_value_info("x", dtype, list(shape))],
                     [h.make_tensor_value_info(o, t, None) for o, t in outs.items()],
                     [nh.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
    return onnx_model(g, opset)


def imported(m, x: np.ndarray, p: int) -> list[np.ndarray]:
    """The import's outputs on x by the reference executor (as int64); its export computes the same."""
    imp = import_model(m, input_precision=p)
    feed = x.astype(np.int64).astype(np.int32)
    assert verify(imp.graph, feed).exact
    return [o.astype(np.int64) for o in execute(imp.graph, {"data": feed})]


def by_onnxruntime(m, x: np.ndarray) -> list[np.ndarray] | None:
    """onnxruntime's outputs on the source model, None where it has no kernel for the type."""
    try:
        s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001  (NOT_IMPLEMENTED: no kernel for this type)
        assert "NOT_IMPLEMENTED" in str(e) or "Could not find an implementation" in str(e), e
        return None
    return [np.asarray(o).astype(np.int64) for o in s.run(None, {"x": x})]


# -- integers ----------------------------------------------------------------------------------------------------
@SETTINGS
@given(st.data(), shapes, st.sampled_from(["ArgMax", "ArgMin"]), st.sampled_from(list(NP)), st.integers(1, 32),
       st.booleans(), st.booleans())
def test_argmax_and_argmin_of_integers(d, shape, op, dtype, p, keep, last):
    """Any axis, keepdims, select_last_index, at every precision up to 32 bits (past 31 the equality is
    1 - (m > x)): the first (last) index of the max (min) of each row, as numpy's and onnxruntime's."""
    axis = d.draw(st.integers(-len(shape), len(shape) - 1))
    x = draw_x(d, shape, dtype, p)
    m = one_node(op, shape, dtype, {"y": T.INT64}, axis=axis, keepdims=int(keep), select_last_index=int(last))
    want = arg_oracle(x, axis, op == "ArgMin", last, keep)
    [got] = imported(m, x, p)
    assert np.array_equal(got.reshape(want.shape), want)
    if (ref := by_onnxruntime(m, x)) is not None:
        assert np.array_equal(ref[0], want)



@pytest.mark.parametrize("k", [1, 2])
def test_topk_where_range_times_length_fits_but_the_precisions_do_not(k):
    """28-bit values along an axis of 4: R C = 2^30 - 4 fits 30 bits, but (x - lo) C is a broadcast_mul of 29 and 4
    bits (33 > 32): the k rounds of first_max instead of a refusal (k = 1) or wrong bits."""
    x = np.array([-(1 << 27) + 1, (1 << 27) - 1, 5, (1 << 27) - 1], np.int32)
    m = one_node("TopK", (4,), T.INT32, {"v": T.INT32, "i": T.INT64}, {"k": np.array([k], np.int64)}, axis=0)
    try:
        got = imported(m, x, 28)
    except UnsupportedError as e:  # k > 1: masking moves a value 2^28 - 1 below the least, past 32 bits
        assert k > 1 and "masking each value found" in str(e)
        return
    for g_, w_ in zip(got, topk_oracle(x, 0, k, True), strict=True):
        assert np.array_equal(g_.reshape(w_.shape), w_)

@SETTINGS
@given(st.data(), shapes, st.sampled_from(list(NP)), st.integers(1, 32), st.booleans(), st.booleans())
def test_topk_of_integers(d, shape, dtype, p, largest, ordered):
    """The k largest (smallest) values and their indices, equal values by lower index first, k up to the axis'
    length: numpy's stable order and onnxruntime's (sorted=0: the same elements as onnxruntime's, which orders them
    its own way); refused only where the input's range passes 30 bits."""
    axis = d.draw(st.integers(-len(shape), len(shape) - 1))
    k = d.draw(st.integers(1, min(shape[axis], MAX_TOPK)))
    x = draw_x(d, shape, dtype, p)
    m = one_node("TopK", shape, dtype, {"v": dtype, "i": T.INT64}, {"k": np.array([k], np.int64)}, axis=axis,
                 largest=int(largest), sorted=int(ordered))
    want = topk_oracle(x, axis, k, largest)
    if p >= 30 and k > 1:  # masking a value found moves it below the least by the range, 2^(p-1) - 1 ... 2^p - 1
        try:
            import_model(m, input_precision=p)
        except UnsupportedError as e:
            assert "masking each value found" in str(e) and "past CVM's 32 bits" in str(e)
            return
    got = imported(m, x, p)
    for g_, w_ in zip(got, want, strict=True):
        assert np.array_equal(g_.reshape(w_.shape), w_)
    if (ref := by_onnxruntime(m, x)) is not None:
        if not ordered:
            ref, want = by_index(*ref, axis), by_index(*want, axis)
        for r_, w_ in zip(ref, want, strict=True):
            assert np.array_equal(r_, w_)


@pytest.mark.parametrize("largest", [True, False])
def test_topk_of_values_too_wide_to_rank_takes_masked_rounds(largest):
    """29-bit values along 7 positions (R C past 2^30: no ranking key) take k masked rounds, equal to the oracle and
    onnxruntime, extremes and ties included; 30-bit ones are refused in one line (masking passes 32 bits)."""
    b = bound(29)
    x = np.array([[b, -b, b, 0, -b, b, 1], [0] * 7, [-b, 5, -b, 5, b, -1, b]], np.int32)
    m = one_node("TopK", x.shape, T.INT32, {"v": T.INT32, "i": T.INT64}, {"k": np.array([5], np.int64)},
                 largest=int(largest))
    want = topk_oracle(x, 1, 5, largest)
    for got, ref, w_ in zip(imported(m, x, 29), by_onnxruntime(m, x), want, strict=True):
        assert np.array_equal(got.reshape(w_.shape), w_) and np.array_equal(ref, w_)
    with pytest.raises(UnsupportedError, match="masking each value found moves it"):
        import_model(m, input_precision=30)


@pytest.mark.parametrize("value", [-128, 0, 127])
def test_heads_of_a_row_of_equal_values(value):
    """All equal (int8's min and max; precision 9 holds -128): ArgMax gives 0, select_last_index the last, TopK
    the first k indices in order."""
    x = np.full((2, 7), value, np.int8)
    [first] = imported(one_node("ArgMax", x.shape, T.INT8, {"y": T.INT64}, axis=1), x, 9)
    [last] = imported(one_node("ArgMin", x.shape, T.INT8, {"y": T.INT64}, axis=1, select_last_index=1), x, 9)
    v, i = imported(one_node("TopK", x.shape, T.INT8, {"v": T.INT8, "i": T.INT64}, {"k": np.array([5], np.int64)}),
                    x, 9)
    assert first.reshape(-1).tolist() == [0, 0] and last.reshape(-1).tolist() == [6, 6]
    assert np.array_equal(i.reshape(2, 5), np.tile(np.arange(5), (2, 1))) and (v == value).all()


def test_topk_past_its_bound_is_refused_in_one_line_naming_the_node():
    """Regression of the refusal: TopK was 'no CVM op for ONNX TopK'; past MAX_TOPK rounds it is one line that says
    why; k of 0 or past the axis as well."""
    for k, why in ((MAX_TOPK + 1, f"at most {MAX_TOPK}"), (0, "must lie in"), (MAX_TOPK + 200, "must lie in")):
        m = one_node("TopK", (2, MAX_TOPK + 100), T.INT8, {"v": T.INT8, "i": T.INT64},
                     {"k": np.array([k], np.int64)})
        with pytest.raises(UnsupportedError) as e:
            import_model(m)
        [problem] = e.value.problems
        assert problem.where == "head (TopK)" and why in problem.rule and f"k={k}" in problem.rule


@SETTINGS
@given(st.data(), st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), st.booleans())
def test_gather_elements(d, shape, indices_are_input):
    """y[p] = x[p with the axis coordinate idx[p]] (indices of any shape within x's, negatives from the end): of
    constant indices on an input, and of input indices (their interval within [-dim, dim-1]) in a constant."""
    axis = d.draw(st.integers(-len(shape), len(shape) - 1))
    dim = shape[axis]
    ishape = tuple(d.draw(st.integers(1, n)) if a != axis % len(shape) else d.draw(st.integers(1, 4))
                   for a, n in enumerate(shape))
    idx = np.array(d.draw(st.lists(st.integers(-dim, dim - 1), min_size=math.prod(ishape),
                                   max_size=math.prod(ishape))), np.int64).reshape(ishape)
    data = draw_x(d, shape, T.INT32, 20)
    if indices_are_input:  # at precision p, |i| <= 2^(p-1)-1 lies within [-dim, dim-1]; at p + 1 it may not
        p = dim.bit_length()
        idx = np.clip(idx, -bound(p), bound(p))
        m = one_node("GatherElements", ishape, T.INT64, {"y": T.INT32}, axis=axis)
        m.graph.initializer.append(nh.from_array(data, "c"))
        m.graph.node[0].input[:] = ["c", "x"]
        with pytest.raises(UnsupportedError, match="may lie outside"):
            import_model(m, input_precision=p + 1)
        [got] = imported(m, idx, p)
    else:
        m = one_node("GatherElements", shape, T.INT32, {"y": T.INT32}, {"i": idx}, axis=axis)
        [got] = imported(m, data, 20)
    rows = data[tuple(slice(None) if a == axis % len(shape) else slice(0, n) for a, n in enumerate(ishape))]
    want = np.take_along_axis(rows, np.where(idx < 0, idx + dim, idx), axis)
    assert np.array_equal(got.reshape(want.shape), want)
    assert np.array_equal(by_onnxruntime(m, idx if indices_are_input else data)[0], want)


def test_gather_elements_of_constant_indices_out_of_range_is_refused():
    m = one_node("GatherElements", (2, 3), T.INT32, {"y": T.INT32}, {"i": np.array([[0, 3]], np.int64)}, axis=1)
    with pytest.raises(UnsupportedError, match=r"GatherElements index out of range \[-3, 2\]"):
        import_model(m)


@pytest.mark.parametrize("op, shape, outs, inits, attrs, why", [
    ("ArgMax", (2, 3), {"y": T.INT64}, {}, {"axis": 2}, "axis 2 is out of range for rank 2"),
    ("ArgMin", (), {"y": T.INT64}, {}, {}, "ArgMin of a scalar: it needs an axis"),
    ("ArgMax", (2, 3), {"y": T.INT64}, {}, {"select_last_index": 2}, r"select_last_index=2: 2 is outside \[0, 1\]"),
    ("TopK", (2, 3), {"v": T.INT8, "i": T.INT64}, {"k": np.array([2.5])}, {}, r"input 1 \(K\) is tensor\(double\)"),
    ("TopK", (2, 3), {"v": T.INT8, "i": T.INT64}, {"k": np.array([1, 2], np.int64)}, {},
     "TopK k must be a constant scalar"),
    ("TopK", (2, 3), {"v": T.INT8, "i": T.INT64}, {"k": np.array([-1], np.int64)}, {}, r"TopK k=-1 must lie in"),
    ("GatherElements", (2, 3), {"y": T.INT8}, {"i": np.zeros((2,), np.int64)}, {}, "do not fit data of shape"),
    ("GatherElements", (2, 3), {"y": T.INT8}, {"i": np.zeros((3, 3), np.int64)}, {"axis": 1},
     "do not fit data of shape"),
])
def test_malformed_heads_are_refused_in_one_line_naming_the_node(op, shape, outs, inits, attrs, why):
    m = one_node(op, shape, T.INT8, outs, inits, **attrs)
    with pytest.raises(UnsupportedError) as e:
        import_model(m, input_precision=8)
    [problem] = e.value.problems
    assert problem.where == f"head ({op})" and re.search(why, problem.rule), problem.rule


def test_heads_of_constants_fold():
    """ArgMax, ArgMin (last index) and TopK of an initializer fold to constants, equal to the oracles."""
    c = np.array([[3, -7, 3, 9, 9], [0, 0, -7, -7, 2]], np.int32)
    m = one_node("Add", (2, 1), T.INT32, {"y": T.INT32}, {"c": c})
    m.graph.node[0].output[0] = "s"
    m.graph.node.extend([h.make_node("ArgMax", ["c"], ["a"], axis=1), h.make_node("Add", ["x", "a32"], ["y"]),
                         h.make_node("ArgMin", ["c"], ["b"], axis=1, select_last_index=1),
                         h.make_node("TopK", ["c", "k"], ["v", "i"], axis=1, largest=0),
                         h.make_node("Cast", ["a"], ["a32"], to=T.INT32)])
    m.graph.initializer.append(nh.from_array(np.array([3], np.int64), "k"))
    m.graph.output.extend(h.make_tensor_value_info(o, T.INT64, None) for o in ("b", "i"))
    m.graph.output.append(h.make_tensor_value_info("v", T.INT32, None))
    x = np.array([[10], [20]], np.int32)
    y, b, i, v = imported(m, x, 8)
    want_v, want_i = topk_oracle(c, 1, 3, False)
    assert np.array_equal(y.reshape(2, 1), x + arg_oracle(c, 1, False, False, True))
    assert np.array_equal(b.reshape(2, 1), arg_oracle(c, 1, True, True, True))
    assert np.array_equal(i.reshape(2, 3), want_i) and np.array_equal(v.reshape(2, 3), want_v)


def test_greedy_decoding_reads_the_indices_as_integers():
    """A CTC recognizer's greedy decoding: ArgMax of dequantized logits (int64), then Cast to int32, Equal to the
    blank, a character table Gather'ed by the indices and Add: integer ops on the CVM int32 indices, equal to
    onnxruntime on the QDQ model."""
    shape = (2, 6, 11)
    inits = {"s": np.float32(0.07), "z": np.int8(-4), "blank": np.array(0, np.int64),
             "table": (np.arange(11) * 3 - 5).astype(np.int32), "one": np.array(1, np.int64)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("ArgMax", ["xf"], ["ids"], axis=-1, keepdims=0),
             h.make_node("Cast", ["ids"], ["y"], to=T.INT32), h.make_node("Equal", ["ids", "blank"], ["eq"]),
             h.make_node("Cast", ["eq"], ["is_blank"], to=T.INT32), h.make_node("Gather", ["table", "ids"], ["chars"]),
             h.make_node("Add", ["ids", "one"], ["next"])]
    m = qdq(nodes, shape, T.INT8, inits, T.INT32)
    m.graph.output.extend(h.make_tensor_value_info(o, t, None) for o, t in (("is_blank", T.INT32),
                                                                           ("chars", T.INT32), ("next", T.INT64)))
    rng = np.random.default_rng(7)
    for x in (rng.integers(-128, 128, shape, dtype=np.int8), np.full(shape, 127, np.int8)):
        for g_, w_ in zip(imported(m, x, 9), by_onnxruntime(m, x), strict=True):
            assert np.array_equal(g_.reshape(w_.shape), w_)


# -- dequantized values ------------------------------------------------------------------------------------------
def head_model(shape, x_type, s, z, axis: int, k: int, largest: bool, last: bool, keep: bool,
               s_axis: int | None = None):
    """x -> DequantizeLinear -> ArgMax, ArgMin, TopK and (a per-tensor scale) the TopK values and GatherElements of x
    by the TopK indices, quantized: every output an integer, as onnxruntime computes them on the QDQ model."""
    inits = {"s": np.asarray(s, np.float32), "z": np.asarray(z, NP[x_type]), "k": np.array([k], np.int64)}
    dq = {} if s_axis is None else {"axis": s_axis}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"], **dq),
             h.make_node("ArgMax", ["xf"], ["amax"], axis=axis, keepdims=int(keep), select_last_index=int(last)),
             h.make_node("ArgMin", ["xf"], ["amin"], axis=axis, keepdims=int(keep), select_last_index=int(last)),
             h.make_node("TopK", ["xf", "k"], ["v", "i"], axis=axis, largest=int(largest))]
    m = qdq(nodes, shape, x_type, inits, T.INT64, opset=21 if x_type == T.INT16 else 17, out="amax")
    if s_axis is None:
        m.graph.node.extend([h.make_node("QuantizeLinear", ["v", "s", "z"], ["vq"]),
                             h.make_node("GatherElements", ["xf", "i"], ["g"], axis=axis),
                             h.make_node("QuantizeLinear", ["g", "s", "z"], ["gq"])])
        outs = {"amin": T.INT64, "vq": x_type, "i": T.INT64, "gq": x_type}
    else:
        outs = {"amin": T.INT64, "i": T.INT64}
    m.graph.output.extend(h.make_tensor_value_info(o, t, None) for o, t in outs.items())
    return m


@SETTINGS
@given(d=st.data(), shape=st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple),
       x_type=st.sampled_from([T.INT8, T.UINT8, T.INT16]), s=st.floats(2.0**-12, 2.0**4, width=32),
       largest=st.booleans(), last=st.booleans(), keep=st.booleans())
def test_heads_of_a_dequantized_value_equal_onnxruntime(d, shape, x_type, s, largest, last, keep):
    """The float ArgMax, ArgMin, TopK and GatherElements of DequantizeLinear(x) are those of x's integers (a positive
    scale, one zero point: docs/import.md): equal to onnxruntime on the QDQ model, indices and values."""
    axis = d.draw(st.integers(-len(shape), len(shape) - 1))
    k = d.draw(st.integers(1, min(shape[axis], MAX_TOPK)))
    info = np.iinfo(NP[x_type])
    z = d.draw(st.sampled_from([int(info.min), 0, int(info.max)]) | st.integers(int(info.min), int(info.max)))
    x = draw_x(d, shape, x_type, 16)
    m = head_model(shape, x_type, s, z, axis, k, largest, last, keep)
    want = by_onnxruntime(m, x)
    got = imported(m, x, 16 if x_type == T.INT16 else 9)
    for g_, w_ in zip(got, want, strict=True):
        assert np.array_equal(g_.reshape(w_.shape), w_)


def test_heads_along_a_per_channel_scale_are_refused_and_across_it_equal_onnxruntime():
    """A scale per channel along the reduced axis orders the floats otherwise than the integers: refused in one
    line; along another axis each row has one scale, and the heads equal onnxruntime's."""
    x = np.random.default_rng(3).integers(-128, 128, (3, 5), dtype=np.int8)
    m = head_model(x.shape, T.INT8, [0.5, 0.01, 1.0], [0, 5, -3], axis=1, k=3, largest=True, last=False, keep=False,
                   s_axis=0)
    for g_, w_ in zip(imported(m, x, 8), by_onnxruntime(m, x), strict=True):
        assert np.array_equal(g_.reshape(w_.shape), w_)
    m = head_model(x.shape, T.INT8, [0.5, 0.01, 1.0], [0, 5, -3], axis=0, k=3, largest=True, last=False, keep=False,
                   s_axis=0)
    with pytest.raises(UnsupportedError, match="ArgMax along axis 0, which has a scale per channel"):
        import_model(m)


@pytest.mark.parametrize("head", ["logits", "softmax", "sigmoid"])
def test_a_classifier_with_argmax_and_topk_heads_quantizes_and_imports(tmp_path, head):
    """A float classifier (Gemm, then Softmax, Sigmoid or nothing) ending in ArgMax, TopK of 3 and GatherElements
    of the logits by TopK's indices, through quantize: quantize_static quantizes what the heads read, and every
    head imports, as close to float as onnxruntime's quantized model's, and exports exactly."""
    from cvm_onnx.app.quantize import quantize

    rng = np.random.default_rng(0)
    nodes, src = [h.make_node("Gemm", ["x", "w", "b"], ["logits"])], "logits"
    if head != "logits":
        nodes.append(h.make_node(head.capitalize(), ["logits"], ["p"], **({"axis": 1} if head == "softmax" else {})))
        src = "p"
    nodes += [h.make_node("ArgMax", [src], ["cls"], axis=1, keepdims=0), h.make_node("TopK", [src, "k"], ["top", "ti"]),
              h.make_node("GatherElements", ["logits", "ti"], ["tl"], axis=1)]
    outs = {"cls": T.INT64, "top": T.FLOAT, "ti": T.INT64, "tl": T.FLOAT}
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 16])],
                     [h.make_tensor_value_info(o, t, None) for o, t in outs.items()],
                     [nh.from_array(rng.normal(size=(16, 10)).astype(np.float32), "w"),
                      nh.from_array(rng.normal(size=(10,)).astype(np.float32), "b"),
                      nh.from_array(np.array([3], np.int64), "k")])
    onnx.save(onnx_model(g, 17), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(32, 16)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "out")
    assert [a.name for a in done.agreements] == list(outs)
    for a in done.agreements:
        assert a.mean_steps <= 1.1 * a.ort_mean_steps + 0.01, a.line()
    assert verify(done.imported.graph, None, seeds=2).exact
