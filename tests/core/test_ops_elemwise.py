"""Elementwise ops against per-element Python oracles written from the runtime notes (section 3 and 4)."""
from __future__ import annotations

from fractions import Fraction
from math import floor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from support import INT32_MAX, INT32_MIN, bound, values
from support.oracles import wrap32

import cvm_onnx.core.ops.elemwise  # noqa: F401  (registration)
from cvm_onnx.core.ops import registry
from cvm_onnx.core.ops.elemwise import round_shift

OpRuleError = registry.OpRuleError
op = registry.get
SETTINGS = settings(max_examples=150, deadline=None)

shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)
precisions = st.integers(1, 32)


def clip_p(v: int, p: int) -> int:
    return max(-bound(p), min(bound(p), v))


@st.composite
def tensor(draw, shape=None):
    p = draw(precisions)
    s = draw(shapes) if shape is None else shape
    return p, draw(values(s, p))


def run(name: str, x: list[np.ndarray], **attrs):
    cls = op(name)
    typed, errors = cls.parse_attrs(attrs)
    assert not errors, errors
    a = cls.bind(typed)
    (y,) = cls.run(a, x)
    assert y.dtype == np.int32
    assert cls.infer_shapes(a, [t.shape for t in x]) == [y.shape]
    return a, y


def expect(x: np.ndarray, f) -> np.ndarray:
    return np.array([f(v) for v in x.ravel().tolist()], dtype=np.int64).reshape(x.shape)


def within(y: np.ndarray, p: int) -> bool:
    return int(np.abs(y.astype(np.int64)).max()) <= bound(p)


# -- unary ops ------------------------------------------------------------------------------------------------
@SETTINGS
@given(tensor())
def test_abs_negative(px):
    p, x = px
    for name, f in (("abs", abs), ("negative", lambda v: -v)):
        a, y = run(name, [x])
        assert np.array_equal(y, expect(x, f))
        assert op(name).infer_precisions(a, [p], [x.shape]) == [p] and within(y, p)
        assert op(name).arity(a) == (1, 1)


def test_abs_negative_int32_min_wraps():
    x = np.array([INT32_MIN, INT32_MAX, -INT32_MAX], dtype=np.int32)
    assert run("abs", [x])[1].tolist() == [wrap32(abs(v)) for v in x.tolist()] == [INT32_MIN, INT32_MAX, INT32_MAX]
    assert run("negative", [x])[1].tolist() == [INT32_MIN, -INT32_MAX, INT32_MAX]


def precision_of(v: int) -> int:
    i = 1
    while abs(v) >= 1 << i:
        i += 1
    return i


@SETTINGS
@given(tensor())
def test_cvm_precision(px):
    p, x = px
    a, y = run("cvm_precision", [x])
    assert np.array_equal(y, expect(x, precision_of))
    assert op("cvm_precision").infer_precisions(a, [p], [x.shape]) == [6] and within(y, 6)


def test_cvm_precision_verified_values():
    x = np.array([0, 1, -1, 2, 3, -3, 4, 7, -8, 127, 100000, INT32_MAX, -INT32_MAX, INT32_MIN], dtype=np.int32)
    assert run("cvm_precision", [x])[1].tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 4, 7, 17, 31, 31, 32]


# -- elemwise_add / elemwise_sub --------------------------------------------------------------------------------
@st.composite
def same_shape_pair(draw):
    s = draw(shapes)
    p0, p1 = draw(precisions), draw(precisions)
    return p0, draw(values(s, p0)), p1, draw(values(s, p1))


@SETTINGS
@given(same_shape_pair())
def test_elemwise_add_sub(pair):
    p0, x, p1, z = pair
    for name, f in (("elemwise_add", lambda u, v: u + v), ("elemwise_sub", lambda u, v: u - v)):
        a, y = run(name, [x, z])
        want = [wrap32(f(u, v)) for u, v in zip(x.ravel().tolist(), z.ravel().tolist())]
        assert y.ravel().tolist() == want
        (prec,) = op(name).infer_precisions(a, [p0, p1], [x.shape, z.shape])
        assert prec == max(p0, p1) + 1
        if prec <= 32:
            assert within(y, prec)
        assert op(name).arity(a) == (2, 2)


@pytest.mark.parametrize("name", ["elemwise_add", "elemwise_sub"])
@pytest.mark.parametrize("lhs,rhs", [((2, 3), (3,)), ((2, 3), (2, 1)), ((1, 3), (2, 3)), ((3,), (1, 3))])
def test_elemwise_binary_requires_identical_shapes(name, lhs, rhs):
    cls = op(name)
    with pytest.raises(OpRuleError, match="identical shapes"):
        cls.infer_shapes(cls.bind({}), [lhs, rhs])


# -- clip --------------------------------------------------------------------------------------------------------
@st.composite
def clip_bounds(draw):
    edge = st.sampled_from([-INT32_MAX, -INT32_MAX + 1, -1, 0, 1, INT32_MAX - 1, INT32_MAX])
    lo, hi = sorted(draw(st.lists(st.one_of(edge, st.integers(-INT32_MAX, INT32_MAX)), min_size=2, max_size=2,
                                  unique=True)))
    return lo, hi


@SETTINGS
@given(tensor(), clip_bounds())
def test_clip(px, lohi):
    p, x = px
    lo, hi = lohi
    a, y = run("clip", [x], a_min=str(lo), a_max=str(hi))
    assert np.array_equal(y, expect(x, lambda v: max(min(hi, v), lo)))
    (prec,) = op("clip").infer_precisions(a, [p], [x.shape])
    assert prec == (max(abs(lo), abs(hi)) + 1).bit_length() + 1  # GetNumberPrecision = bits(n + 1) + 1
    assert within(y, prec)


def test_clip_precision_verified_values():
    cls = op("clip")
    prec = lambda lo, hi: cls.infer_precisions(cls.bind({"a_min": lo, "a_max": hi}), [8], [(1,)])  # noqa: E731
    assert prec(-127, 127) == [9] and prec(0, 6) == [4] and prec(-6, 1) == [4]
    assert prec(-INT32_MAX, 0) == [33]  # over 32: validation rejects such a graph, as the runtime does


@pytest.mark.parametrize("attrs,rule", [
    ({"a_min": "1", "a_max": "1"}, "a_min < a_max"),
    ({"a_min": "5", "a_max": "-5"}, "a_min < a_max"),
])
def test_clip_needs_ordered_bounds(attrs, rule):
    cls = op("clip")
    typed, errors = cls.parse_attrs(attrs)
    assert not errors
    with pytest.raises(OpRuleError, match=rule):
        cls.infer_precisions(cls.bind(typed), [8], [(3,)])


@pytest.mark.parametrize("attrs,rule", [
    ({"a_min": str(INT32_MIN), "a_max": "0"}, "must lie in"),
    ({"a_min": "0", "a_max": str(1 << 31)}, "must lie in"),
    ({"a_min": "0"}, "a_max is required"),
    ({"a_max": "0"}, "a_min is required"),
    ({"a_min": "0", "a_max": "1.5"}, "not an integer"),
    ({"a_min": "0", "a_max": "3", "precision": "8"}, "unknown attribute"),
])
def test_clip_attribute_rules(attrs, rule):
    _, errors = op("clip").parse_attrs(attrs)
    assert any(rule in e for e in errors), errors


# -- cvm_clip ------------------------------------------------------------------------------------------------------
@SETTINGS
@given(tensor(), precisions, st.sampled_from(["True", "False", "1", "0"]))
def test_cvm_clip(px, q, is_sign):
    p, x = px
    a, y = run("cvm_clip", [x], precision=str(q), is_sign=is_sign)
    assert np.array_equal(y, expect(x, lambda v: clip_p(v, q)))  # is_sign is ignored
    assert op("cvm_clip").infer_precisions(a, [p], [x.shape]) == [q] and within(y, q)


def test_cvm_clip_int32_edges():
    x = np.array([INT32_MIN, -INT32_MAX, -200, 200, INT32_MAX], dtype=np.int32)
    assert run("cvm_clip", [x], precision="8")[1].tolist() == [-127, -127, -127, 127, 127]
    assert run("cvm_clip", [x], precision="32")[1].tolist() == [-INT32_MAX, -INT32_MAX, -200, 200, INT32_MAX]
    assert run("cvm_clip", [x], precision="1")[1].tolist() == [0] * 5


@pytest.mark.parametrize("name", ["cvm_clip", "cvm_right_shift", "cvm_left_shift"])
@pytest.mark.parametrize("value", ["0", "33", "-1"])
def test_precision_attribute_range(name, value):
    _, errors = op(name).parse_attrs({"precision": value, "shift_bit": "1"} if name != "cvm_clip"
                                     else {"precision": value})
    assert any("precision" in e and "[1, 32]" in e for e in errors), errors


def test_cvm_clip_precision_required():
    assert any("precision is required" in e for e in op("cvm_clip").parse_attrs({})[1])


# -- cvm_right_shift (already defined) ------------------------------------------------------------------------------
def test_cvm_right_shift_verified_values():
    x = np.arange(-13, 14, dtype=np.int32)
    _, y = run("cvm_right_shift", [x], precision="8", shift_bit="3")
    assert y.tolist() == [clip_p(floor(Fraction(v + 4, 8)), 8) for v in range(-13, 14)]
    assert y[[1, 9, 17, 25]].tolist() == [-1, 0, 1, 2]  # -12, -4, 4, 12 from the notes


@SETTINGS
@given(st.integers(1, 32), st.integers(1, 32), st.data())
def test_cvm_right_shift(q, s, data):
    p = data.draw(precisions)
    x = data.draw(values(data.draw(shapes), p))
    a, y = run("cvm_right_shift", [x], precision=str(q), shift_bit=str(s))
    assert np.array_equal(y, expect(x, lambda v: clip_p(floor(Fraction(v + (1 << (s - 1)), 1 << s)), q)))
    assert op("cvm_right_shift").infer_precisions(a, [p], [x.shape]) == [q] and within(y, q)


# -- cvm_left_shift --------------------------------------------------------------------------------------------------
@st.composite
def left_shift_case(draw):
    s = draw(st.integers(1, 31))
    p = draw(st.integers(1, 32 - s))
    return s, p, draw(values(draw(shapes), p)), draw(precisions)


@SETTINGS
@given(left_shift_case())
def test_cvm_left_shift(case):
    s, p, x, q = case
    a, y = run("cvm_left_shift", [x], precision=str(q), shift_bit=str(s))
    assert np.array_equal(y, expect(x, lambda v: clip_p(v * (1 << s), q)))
    assert op("cvm_left_shift").infer_precisions(a, [p], [x.shape]) == [q] and within(y, q)
    assert any("CPU" in w for w in op("cvm_left_shift").warnings(a, [x.shape], [p]))


@pytest.mark.parametrize("p,s", [(32, 1), (1, 32), (24, 9), (8, 25)])
def test_cvm_left_shift_needs_room(p, s):
    cls = op("cvm_left_shift")
    with pytest.raises(OpRuleError, match="precision \\+ shift_bit <= 32"):
        cls.infer_precisions(cls.bind({"precision": 8, "shift_bit": s}), [p], [(2,)])


def test_cvm_left_shift_at_the_limit():
    cls = op("cvm_left_shift")
    a = cls.bind({"precision": 32, "shift_bit": 24})
    assert cls.infer_precisions(a, [8], [(2,)]) == [32]
    x = np.array([-127, 127], dtype=np.int32)
    assert cls.run(a, [x])[0].tolist() == [-127 << 24, 127 << 24]


def test_attribute_syntax_and_unknowns():
    cls = op("cvm_right_shift")
    typed, errors = cls.parse_attrs({"precision": "8", "shift_bit": "3", "is_sign": "false", "__hidden__": "x"})
    assert not errors and typed == {"precision": 8, "shift_bit": 3, "is_sign": False}
    assert any("unknown attribute" in e for e in op("abs").parse_attrs({"axis": "1"})[1])
    assert any("shift_bit is required" in e for e in op("cvm_left_shift").parse_attrs({"precision": "8"})[1])


@settings(max_examples=200, deadline=None)
@given(x=st.integers(-(1 << 40), 1 << 40), s=st.integers(1, 40))
def test_round_shift_rounds_half_up(x, s):
    """``round_shift``, the one statement of cvm_right_shift's rounding (the kernel, the lowerings' bounds and
    the importer's intervals call it): x / 2^s rounded half up, on Python ints and int64 arrays alike."""
    want = floor(Fraction(x, 1 << s) + Fraction(1, 2))
    assert round_shift(x, s) == want
    assert round_shift(np.array([x], np.int64), s).tolist() == [want]


@pytest.mark.parametrize("s", range(1, 33))
def test_cvm_right_shift_at_int32s_ends(s):
    """The rounding shift of INT32_MIN and INT32_MAX and their neighbours (x + 2^(s-1) passes int32 there)."""
    x = np.array([INT32_MIN, INT32_MIN + 1, -1, 0, 1, INT32_MAX - 1, INT32_MAX], np.int32)
    _, y = run("cvm_right_shift", [x], precision="32", shift_bit=str(s))
    assert y.tolist() == expect(x, lambda v: clip_p(floor(Fraction(v + (1 << (s - 1)), 1 << s)), 32)).tolist()


@pytest.mark.parametrize("s", [1, 7])
def test_cvm_right_shift_makes_no_int64_copy(s):
    """cvm_right_shift of an int32 tensor allocates at most twice its bytes while it runs (its output and the
    rounding bit): no int64 copy (the reference executor's peak on a model's largest tensors)."""
    import tracemalloc

    x = (np.arange(1 << 20, dtype=np.int64) * 4099 - (1 << 31) + 7).astype(np.int32)  # across int32, wrapped
    tracemalloc.start()
    try:
        _, y = run("cvm_right_shift", [x], precision="20", shift_bit=str(s))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert y[::4096].tolist() == expect(x[::4096], lambda v: clip_p(floor(Fraction(v + (1 << (s - 1)), 1 << s)),
                                                                     20)).tolist()
    assert peak < 2.5 * x.nbytes
