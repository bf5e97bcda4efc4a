"""get_valid_counts and non_max_suppression: kernels against loop oracles written from the runtime's FORMAL
algorithm, the verified IoU values, shape and precision inference, the load-time rules and the warnings."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import INT32_MAX, INT32_MIN
from support.oracles import INT64_MAX, errors_of, iou_oracle, make

from cvm_onnx.core.ops import REGISTRY, OpRuleError

FAST = settings(max_examples=150, deadline=None)


def run(op, a, *xs):
    outs = op.run(a, [np.asarray(x, np.int32) for x in xs])
    assert all(o.dtype == np.int32 for o in outs)
    assert op.infer_shapes(a, [np.shape(x) for x in xs]) == [o.shape for o in outs]
    return outs


def arrays(shape, values):
    size = int(np.prod(shape))
    return st.lists(values, min_size=size, max_size=size).map(lambda v: np.array(v, np.int64).reshape(shape))


# -- get_valid_counts ---------------------------------------------------------------------------------------
def gvc_oracle(data, threshold):
    counts, out = [], []
    for rows in data.tolist():
        valid = [r for r in rows if r[1] > threshold]
        counts.append(len(valid))
        out.append(valid + [[-1] * len(r) for r in rows[len(valid):]])
    return counts, out


@FAST
@given(st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(2, 31)), st.integers(0, 2 ** 32),
       st.integers(-3, 3) | st.sampled_from([INT32_MIN, INT32_MAX]))
def test_get_valid_counts_matches_loop_oracle(shape, seed, threshold):
    data = np.random.default_rng(seed).choice([INT32_MIN, -3, -2, -1, 0, 1, 2, 3, INT32_MAX], shape)
    op, a = make("get_valid_counts", score_threshold=threshold)
    count, out = run(op, a, data)
    expect_count, expect_out = gvc_oracle(data, threshold)
    assert count.tolist() == expect_count and out.tolist() == expect_out


@FAST
@given(st.tuples(st.integers(1, 3), st.integers(1, 40), st.integers(2, 31)), st.integers(2, 32),
       st.integers(-1, 1), st.integers(0, 2 ** 32))
def test_get_valid_counts_precision_is_a_true_bound(shape, p, threshold, seed):
    """Inputs at +-(2^(p-1)-1); p >= 2 because the -1 filling needs 2 bits (see the p = 1 test)."""
    op, a = make("get_valid_counts", score_threshold=threshold)
    x = np.random.default_rng(seed).choice([-1, 1], shape) * ((1 << (p - 1)) - 1)
    p_count, p_out = op.infer_precisions(a, [p], [shape])
    count, out = run(op, a, x)
    assert count.max() <= (1 << (p_count - 1)) - 1
    assert np.abs(out.astype(np.int64)).max() <= (1 << (p_out - 1)) - 1


def test_get_valid_counts_fills_minus_one_even_at_precision_1():
    """A runtime quirk: p_in = 1 (all zeros) gives out1 precision 1 although the filling is -1."""
    op, a = make("get_valid_counts")
    assert op.infer_precisions(a, [1], [(1, 2, 2)]) == [4, 1]
    assert run(op, a, np.zeros((1, 2, 2)))[1].tolist() == [[[-1, -1], [-1, -1]]]


def test_get_valid_counts_rules():
    op = REGISTRY["get_valid_counts"]
    a = op.bind(op.parse_attrs({})[0])
    assert a.as_dict() == dict(score_threshold=0) and op.arity(a) == (1, 1) and op.outputs == 2
    assert op.infer_shapes(a, [(2, 5, 6)]) == [(2,), (2, 5, 6)]
    # GetNumberPrecision(N*K) = bits(N*K + 1) + 1: the notes' example 6 -> 4; 30 -> bits(31) + 1 = 6
    assert op.infer_precisions(a, [8], [(4, 3, 2)]) == [4, 8]
    assert op.infer_precisions(a, [20], [(1, 5, 6)]) == [6, 20]
    assert errors_of("get_valid_counts", score_threshold="x") and errors_of("get_valid_counts", top_k="1")
    for bad, rule in (((2, 5), "3-D"), ((1, 2, 3, 4), "3-D"), ((1, 5, 1), "K=1"), ((1, 5, 32), "K=32")):
        with pytest.raises(OpRuleError, match=rule):
            op.infer_shapes(a, [bad])
    assert op.infer_shapes(a, [(1, 5, 31)]) == [(1,), (1, 5, 31)]
    assert op.infer_shapes(a, [(1, 5, 2)]) == [(1,), (1, 5, 2)]


# -- non_max_suppression ------------------------------------------------------------------------------------


def nms_oracle(data, valid_count, a):
    out = []
    for rows, vc in zip(data.tolist(), valid_count.tolist()):
        n_rows = len(rows)
        t = max(min(n_rows, vc), 0)
        ranked = sorted(rows[:t], key=lambda r: -r[1])  # Python's sort is stable
        n_max = min(t, a.max_output_size) if a.max_output_size >= 0 else t
        p_max = min(t, a.top_k) if a.top_k >= 0 else t
        kept = []
        p = 0
        while len(kept) < n_max and p < p_max:
            row = ranked[p]
            p += 1
            if row[0] < 0:
                continue
            if any((a.force_suppress or k[0] == row[0]) and iou_oracle(k[2:], row[2:]) >= a.iou_threshold
                   for k in kept):
                continue
            kept.append(row)
        out.append(kept + [[-1] * 6] * (n_rows - len(kept)))
    return out


BIG = (1 << 29) - 1  # the largest magnitude of precision 30


@st.composite
def nms_cases(draw):
    b, n = draw(st.integers(1, 3)), draw(st.integers(1, 9))
    if draw(st.booleans()):  # corner + size, mostly proper boxes that overlap often
        corner = draw(arrays((b, n, 2), st.integers(-3, 6)))
        boxes = np.concatenate([corner, corner + draw(arrays((b, n, 2), st.integers(-1, 8)))], axis=2)
    else:  # any corners, at the extremes of precision 30 too
        boxes = draw(arrays((b, n, 4), st.integers(-3, 12) | st.sampled_from([0, 1, BIG, -BIG, BIG - 1, BIG // 2])))
    ids = draw(arrays((b, n, 1), st.integers(-1, 2)))
    scores = draw(arrays((b, n, 1), st.integers(-2, 3) | st.sampled_from([-BIG, BIG])))
    data = np.concatenate([ids, scores, boxes], axis=2)
    valid_count = draw(arrays((b,), st.integers(-2, n + 2)))
    attrs = dict(max_output_size=draw(st.integers(-1, n + 1)), top_k=draw(st.integers(-1, n + 1)),
                 iou_threshold=draw(st.integers(1, 101)), force_suppress=draw(st.booleans()))
    return data, valid_count, attrs


@settings(max_examples=200, deadline=None)
@given(nms_cases())
def test_nms_matches_loop_oracle(case):
    data, valid_count, attrs = case
    op, a = make("non_max_suppression", **attrs)
    (out,) = run(op, a, data, valid_count)
    assert out.tolist() == nms_oracle(data, valid_count, a)


def test_nms_verified_iou_values():
    """Two 10x10 boxes offset by 1: IoU 8100/119 = 68; threshold 68 suppresses, 69 keeps."""
    data = np.array([[[0, 90, 0, 0, 10, 10], [0, 80, 1, 1, 11, 11]]])
    assert iou_oracle([0, 0, 10, 10], [1, 1, 11, 11]) == 68
    for thr, kept in ((68, 1), (69, 2)):
        op, a = make("non_max_suppression", iou_threshold=thr)
        (out,) = run(op, a, data, [2])
        assert out.tolist() == [data[0, :kept].tolist() + [[-1] * 6] * (2 - kept)]


def test_nms_large_boxes_use_the_int64_division_branch():
    """overlap > INT64_MAX/100 (coordinates near 2^29): tmp is divided by 100 instead of overlap multiplied."""
    a_box, b_box = [0, 0, BIG, BIG], [BIG // 4, 0, BIG, BIG]
    assert BIG * (BIG - BIG // 4) > INT64_MAX // 100
    thr = iou_oracle(a_box, b_box)
    assert thr == 75
    data = np.array([[[1, 9] + a_box, [1, 8] + b_box]])
    for t, kept in ((thr, 1), (thr + 1, 2)):
        op, a = make("non_max_suppression", iou_threshold=t)
        assert run(op, a, data, [2])[0][0, :, 0].tolist() == [1] * kept + [-1] * (2 - kept)


def test_nms_rules_and_warnings():
    op = REGISTRY["non_max_suppression"]
    a = op.bind(op.parse_attrs({})[0])
    assert a.as_dict() == dict(max_output_size=-1, iou_threshold=50, force_suppress=False, top_k=-1, coord_start=2,
                               score_index=1, id_index=0, return_indices=False, invalid_to_bottom=True)
    assert op.arity(a) == (2, 2)
    assert op.infer_shapes(a, [(1, 7, 6), (1,)]) == [(1, 7, 6)]
    assert op.infer_precisions(a, [30, 6], [(1, 7, 6), (1,)]) == [30]
    for bad in (dict(coord_start="3"), dict(score_index="0"), dict(id_index="1"), dict(iou_threshold="0"),
                dict(iou_threshold="-5"), dict(return_indices="True"), dict(invalid_to_bottom="False"),
                dict(score_threshold="1")):
        assert errors_of("non_max_suppression", **bad), bad
    assert not errors_of("non_max_suppression", coord_start="2", score_index="1", id_index="0", top_k="3",
                         max_output_size="0", force_suppress="1", return_indices="0", invalid_to_bottom="1")
    for shapes, rule in ((((1, 7, 5), (1,)), r"\(B, N, 6\)"), (((7, 6), (1,)), r"\(B, N, 6\)"),
                         (((2, 7, 6), (2, 1)), "1-D"), (((2, 7, 6), (3,)), "batch size B=2")):
        with pytest.raises(OpRuleError, match=rule):
            op.infer_shapes(a, list(shapes))
    assert op.warnings(a, [(1, 7, 6), (1,)], [16, 4]) == []
    _, zero = make("non_max_suppression", max_output_size=0)
    assert any("max_output_size=0" in w for w in op.warnings(zero, [(1, 7, 6), (1,)], [16, 4]))
    assert any("batch size 2" in w for w in op.warnings(a, [(2, 7, 6), (2,)], [16, 4]))
    # the runtime registers SamePrecision for nms: p_in > 30 loads, its IoU may then overflow int32
    assert op.infer_precisions(a, [31, 6], [(1, 7, 6), (1,)]) == [31]
    assert any("precision 31" in w for w in op.warnings(a, [(1, 7, 6), (1,)], [31, 4]))


def test_nms_max_output_size_zero_and_top_k_zero_keep_nothing():
    data = np.array([[[0, 5, 0, 0, 1, 1], [1, 4, 0, 0, 1, 1]]])
    for attrs in (dict(max_output_size=0), dict(top_k=0)):
        op, a = make("non_max_suppression", **attrs)
        assert (run(op, a, data, [2])[0] == -1).all()
