"""Broadcast ops against a loop oracle written from the math doc's indexing rule (a_i = min(d_i, SA_i - 1))."""
from __future__ import annotations

import itertools
from fractions import Fraction
from math import trunc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from support import INT32_MAX, INT32_MIN, bound, values
from support.oracles import wrap32

import cvm_onnx.core.ops.broadcast  # noqa: F401  (registration)
from cvm_onnx.core.ops import registry

OpRuleError = registry.OpRuleError
op = registry.get
SETTINGS = settings(max_examples=120, deadline=None)


FUNCS = {
    "broadcast_add": lambda a, b: a + b,
    "broadcast_sub": lambda a, b: a - b,
    "broadcast_mul": lambda a, b: a * b,
    "broadcast_max": max,
    "broadcast_div": lambda a, b: 0 if b == 0 else trunc(Fraction(a, b)),  # C++ truncation, x/0 = 0
    "broadcast_greater": lambda a, b: int(a > b),
}
PRECISION = {
    "broadcast_add": lambda p0, p1: max(p0, p1) + 1,
    "broadcast_sub": lambda p0, p1: max(p0, p1) + 1,
    "broadcast_mul": lambda p0, p1: p0 + p1,
    "broadcast_max": max,
    "broadcast_div": lambda p0, p1: p0,
    "broadcast_greater": lambda p0, p1: p0,
}
names = st.sampled_from(sorted(FUNCS))


@st.composite
def broadcastable(draw):
    """Two shapes that broadcast: right-aligned, each pair equal or with a 1, of any lengths 1..4."""
    out = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3))
    def side():
        n = draw(st.integers(1, len(out)))
        return tuple(d if draw(st.booleans()) else 1 for d in out[len(out) - n:])
    return side(), side()


def oracle(name: str, x: np.ndarray, z: np.ndarray) -> tuple[tuple[int, ...], list[int]]:
    k = max(x.ndim, z.ndim)
    sa = (1,) * (k - x.ndim) + x.shape
    sb = (1,) * (k - z.ndim) + z.shape
    out = tuple(max(u, v) for u, v in zip(sa, sb))
    xa, za = x.reshape(sa), z.reshape(sb)
    f = FUNCS[name]
    res = []
    for d in itertools.product(*(range(n) for n in out)):
        u = int(xa[tuple(min(i, s - 1) for i, s in zip(d, sa))])
        v = int(za[tuple(min(i, s - 1) for i, s in zip(d, sb))])
        res.append(wrap32(f(u, v)))
    return out, res


def run(name, x, z):
    cls = op(name)
    a = cls.bind({})
    (y,) = cls.run(a, [x, z])
    assert y.dtype == np.int32
    return a, y


@SETTINGS
@given(names, broadcastable(), st.integers(1, 32), st.integers(1, 32), st.data())
def test_against_oracle(name, shapes, p0, p1, data):
    x = data.draw(values(shapes[0], p0))
    z = data.draw(values(shapes[1], p1))
    a, y = run(name, x, z)
    out, want = oracle(name, x, z)
    assert y.shape == out and y.ravel().tolist() == want
    cls = op(name)
    assert cls.infer_shapes(a, [x.shape, z.shape]) == [out] == [np.broadcast_shapes(x.shape, z.shape)]
    assert cls.infer_precisions(a, [p0, p1], [x.shape, z.shape]) == [PRECISION[name](p0, p1)]
    assert cls.arity(a) == (2, 2) and cls.parse_attrs({}) == ({}, [])


@SETTINGS
@given(names, st.integers(1, 32), st.integers(1, 32))
def test_precision_is_a_true_bound(name, p0, p1):
    """Every pair of extreme values (+-bound, +-1, 0) stays within the inferred precision, when that is valid."""
    (prec,) = op(name).infer_precisions(op(name).bind({}), [p0, p1], [(1,), (1,)])
    if prec > 32 or (name == "broadcast_greater" and p0 == 1):
        return  # an invalid graph, or the runtime's loose rule for greater (see the next test)
    ext = lambda r: np.array(sorted({v for v in (-r, -1, 0, 1, r) if abs(v) <= r}), np.int32)  # noqa: E731
    x, z = np.meshgrid(ext(bound(p0)), ext(bound(p1)))
    _, y = run(name, x, z)
    assert np.abs(y.astype(np.int64)).max() <= bound(prec)


def test_greater_with_one_bit_input_exceeds_its_precision():
    """The runtime gives broadcast_greater the precision of input 0; with p0 = 1 (only 0) the 1s exceed it."""
    a, y = run("broadcast_greater", np.array([0], np.int32), np.array([-5], np.int32))
    assert y.tolist() == [1] and op("broadcast_greater").infer_precisions(a, [1, 4], [(1,), (1,)]) == [1]


def test_div_verified_values():
    x = np.array([-7, -6, 5, 7, 0, -7, INT32_MAX, -INT32_MAX], np.int32)
    z = np.array([2, -4, -2, 0, 0, 0, -1, 2], np.int32)
    assert run("broadcast_div", x, z)[1].tolist() == [-3, 1, -2, 0, 0, 0, -INT32_MAX, -(INT32_MAX // 2)]


def test_div_int32_min_by_minus_one_wraps():
    """Undefined in C++ and outside every precision; the int64 quotient 2^31 wraps to INT32_MIN."""
    assert run("broadcast_div", np.array([INT32_MIN], np.int32), np.array([-1], np.int32))[1].tolist() == [INT32_MIN]


def test_verified_broadcast_examples():
    """The examples of the runtime's op descriptions."""
    x, z = np.ones((2, 3), np.int32), np.array([[0], [1]], np.int32)
    assert run("broadcast_add", x, z)[1].tolist() == [[1, 1, 1], [2, 2, 2]]
    assert run("broadcast_sub", x, z)[1].tolist() == [[1, 1, 1], [0, 0, 0]]
    assert run("broadcast_mul", x, z)[1].tolist() == [[0, 0, 0], [1, 1, 1]]
    assert run("broadcast_greater", x, z)[1].tolist() == [[1, 1, 1], [0, 0, 0]]
    x2 = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    assert run("broadcast_max", x2, np.array([[2], [3]], np.int32))[1].tolist() == [[2, 2, 3], [4, 5, 6]]
    assert run("broadcast_div", np.full((2, 3), 6, np.int32), np.array([[2], [3]], np.int32))[1].tolist() == \
        [[3, 3, 3], [2, 2, 2]]


@st.composite
def incompatible(draw):
    """Two shapes with one right-aligned pair of different dims, neither of them 1."""
    lhs = list(draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3)))
    rhs = list(lhs[draw(st.integers(0, len(lhs) - 1)):])
    i = draw(st.integers(1, len(rhs)))
    lhs[-i] = draw(st.integers(2, 4))
    rhs[-i] = draw(st.integers(2, 4).filter(lambda d: d != lhs[-i]))
    return (tuple(lhs), tuple(rhs)) if draw(st.booleans()) else (tuple(rhs), tuple(lhs))


@SETTINGS
@given(names, incompatible())
def test_incompatible_shapes_are_rejected(name, shapes):
    with pytest.raises(ValueError):
        np.broadcast_shapes(*shapes)
    with pytest.raises(OpRuleError, match="equal or one of them 1"):
        op(name).infer_shapes(op(name).bind({}), list(shapes))


def test_no_attributes():
    assert any("unknown attribute" in e for e in op("broadcast_mul").parse_attrs({"axis": "1"})[1])


@SETTINGS
@given(st.sampled_from(["broadcast_add", "broadcast_sub", "broadcast_mul"]), broadcastable(), st.integers(1, 32),
       st.data())
def test_add_sub_mul_of_an_int8_operand_wrap_as_int32(name, shapes, p0, data):
    """add, sub and mul compute in int32 whatever the operands' types: an int8 operand (a param as stored) is
    widened, not computed in int8 (which would wrap at 8 bits)."""
    x = data.draw(values(shapes[0], p0))
    z = data.draw(hnp.arrays(np.int8, shapes[1]))
    _, y = run(name, x, z)
    out, want = oracle(name, x, z)
    assert y.shape == out and y.ravel().tolist() == want


@pytest.mark.parametrize("name", ["broadcast_add", "broadcast_sub", "broadcast_mul"])
def test_add_sub_mul_allocate_only_their_output(name):
    """add, sub and mul of int32 tensors make no int64 copy: at most their output's bytes (and a little) are
    allocated while they run (the reference executor's peak on a model's largest tensors)."""
    import tracemalloc

    x = np.arange(1 << 20, dtype=np.int32) - (1 << 19)
    z = np.array([3], np.int32)
    tracemalloc.start()
    try:
        _, y = run(name, x, z)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert y.tolist()[:2] == [wrap32(FUNCS[name](int(v), 3)) for v in x[:2]]
    assert peak < 1.5 * x.nbytes
