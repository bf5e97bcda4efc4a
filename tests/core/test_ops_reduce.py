"""sum and max against a loop oracle written from the runtime notes (section 2 table, section 3 "sum / max")."""
from __future__ import annotations

import itertools
from math import prod

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import bound, reduce_case
from support.oracles import wrap32

import cvm_onnx.core.ops.reduce  # noqa: F401  (registration)
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.ops import registry
from cvm_onnx.core.validate import c_api_warnings, validate

OpRuleError = registry.OpRuleError
op = registry.get
SETTINGS = settings(max_examples=150, deadline=None)
DTYPES = ["float16", "float32", "float64", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"]


def reduced_set(shape, axis, exclude) -> set[int]:
    """R of the math doc: every axis for axis=(), else the listed axes (+ndim), inverted by exclude."""
    nd = len(shape)
    if not axis:
        return set(range(nd))
    listed = {i + nd if i < 0 else i for i in axis}
    return set(range(nd)) - listed if exclude else listed


def out_shape(shape, axis, keepdims, exclude):
    r = reduced_set(shape, axis, exclude)
    if not r:
        return tuple(shape)
    if keepdims:
        return tuple(1 if i in r else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in r) or (1,)


def windows(shape, reduced) -> list[list[tuple[int, ...]]]:
    """For each output element (row-major over the kept axes), the input indices it reduces, in order."""
    kept = [i for i in range(len(shape)) if i not in reduced]
    red = sorted(reduced)
    out = []
    for k in itertools.product(*(range(shape[i]) for i in kept)):
        group = []
        for r in itertools.product(*(range(shape[i]) for i in red)):
            idx = [0] * len(shape)
            for i, v in zip(kept, k):
                idx[i] = v
            for i, v in zip(red, r):
                idx[i] = v
            group.append(tuple(idx))
        out.append(group)
    return out


def oracle(name, x, axis, keepdims, exclude):
    r = reduced_set(x.shape, axis, exclude)
    shape = out_shape(x.shape, axis, keepdims, exclude)
    if not r:  # exclude with every axis listed: identity copy
        return shape, x.ravel().tolist()
    f = (lambda u, v: u + v) if name == "sum" else max
    res = []
    for group in windows(x.shape, r):
        vals = [int(x[i]) for i in group]
        acc = 0 if not axis and not exclude else vals.pop(0)  # the default reduce-all starts from 0
        for v in vals:
            acc = f(acc, v)
        res.append(wrap32(acc))
    return shape, res


@SETTINGS
@given(reduce_case())
def test_against_oracle(c):
    name, attrs, p, x = c
    cls = op(name)
    typed, errors = cls.parse_attrs({k: str(v) for k, v in attrs.items()})
    assert not errors, errors
    a = cls.bind(typed)
    (y,) = cls.run(a, [x])
    shape, want = oracle(name, x, **attrs)
    assert y.dtype == np.int32 and y.shape == shape and y.ravel().tolist() == want
    assert cls.infer_shapes(a, [x.shape]) == [shape]
    (prec,) = cls.infer_precisions(a, [p], [x.shape])
    assert prec == (p + (x.size // prod(shape)).bit_length() if name == "sum" else p)
    assert cls.arity(a) == (1, 1)


@SETTINGS
@given(reduce_case(), st.booleans())
def test_precision_is_a_true_bound(c, negative):
    """All elements at +-(2^(p-1)-1): the result stays within the inferred precision whenever that is valid."""
    name, attrs, p, x = c
    cls = op(name)
    a = cls.bind(attrs)
    (prec,) = cls.infer_precisions(a, [p], [x.shape])
    if prec > 32:
        return  # an invalid graph
    (y,) = cls.run(a, [np.full(x.shape, -bound(p) if negative else bound(p), np.int32)])
    assert np.abs(y.astype(np.int64)).max() <= bound(prec)


def test_max_default_axes_start_from_zero():
    """Verified on the runtime: max([[-5,-3],[-9,-4]]) is 0 with axis=(), -3 with axis=(0, 1)."""
    x = np.array([[-5, -3], [-9, -4]], np.int32)
    mx = op("max")
    assert mx.run(mx.bind({}), [x])[0].tolist() == [0]
    assert mx.run(mx.bind({"axis": (0, 1)}), [x])[0].tolist() == [-3]
    assert mx.run(mx.bind({"exclude": True}), [x])[0].tolist() == [-3]  # axis=() with exclude: the general path
    assert mx.run(mx.bind({"keepdims": True}), [x])[0].tolist() == [[0]]
    assert any("starts from 0" in w for w in mx.warnings(mx.bind({}), [x.shape], [8]))
    for attrs in ({"axis": (0, 1)}, {"exclude": True}):
        assert mx.warnings(mx.bind(attrs), [x.shape], [8]) == []
    sm = op("sum")
    assert sm.run(sm.bind({}), [x])[0].tolist() == [-21] and sm.warnings(sm.bind({}), [x.shape], [8]) == []


def test_formalization_examples():
    data = np.array([[[1, 2], [2, 3], [1, 3]], [[1, 4], [4, 3], [5, 2]], [[7, 1], [7, 2], [7, 3]]], np.int32)
    sm = op("sum")
    assert sm.run(sm.bind({"axis": (1,)}), [data])[0].tolist() == [[4, 8], [10, 9], [21, 6]]
    assert sm.run(sm.bind({"axis": (1, 2)}), [data])[0].tolist() == [12, 19, 27]


@pytest.mark.parametrize("attrs,shape", [
    ({}, (1,)),
    ({"keepdims": True}, (1, 1, 1)),
    ({"exclude": True}, (1,)),
    ({"axis": (0, 1, 2)}, (1,)),
    ({"axis": (0, 1, 2), "exclude": True}, (2, 3, 4)),
    ({"axis": (0, 1, 2), "exclude": True, "keepdims": True}, (2, 3, 4)),
    ({"axis": (-1,)}, (2, 3)),
    ({"axis": (2, 0)}, (3,)),
    ({"axis": (1,), "exclude": True}, (3,)),
    ({"axis": (1,), "exclude": True, "keepdims": True}, (1, 3, 1)),
])
def test_shape_rules(attrs, shape):
    for name in ("sum", "max"):
        cls = op(name)
        assert cls.infer_shapes(cls.bind(attrs), [(2, 3, 4)]) == [shape]


@pytest.mark.parametrize("axis,rule", [
    ((3,), "must lie in \\[-3, 2\\]"),
    ((-4,), "must lie in \\[-3, 2\\]"),
    ((1, 1), "distinct"),
    ((0, -3), "distinct"),
    ((2, 0, -1), "distinct"),
])
def test_axis_rules(axis, rule):
    for name in ("sum", "max"):
        cls = op(name)
        for exclude in (False, True):
            with pytest.raises(OpRuleError, match=rule):
                cls.infer_shapes(cls.bind({"axis": axis, "exclude": exclude}), [(2, 3, 4)])


def test_attribute_syntax():
    cls = op("sum")
    typed, errors = cls.parse_attrs({"axis": "(2, 3)", "keepdims": "True", "exclude": "0", "dtype": "int32"})
    assert not errors and typed == {"axis": (2, 3), "keepdims": True, "exclude": False, "dtype": "int32"}
    assert cls.parse_attrs({"axis": "1"})[0] == {"axis": (1,)}
    assert cls.parse_attrs({"axis": "[1, -1]"})[0] == {"axis": (1, -1)}
    assert cls.bind({}).as_dict() == {"axis": (), "keepdims": False, "exclude": False, "dtype": "int32"}
    for dtype in DTYPES:
        assert cls.parse_attrs({"dtype": dtype})[1] == []
    for dtype in ("Int32", "4", "int", " int32", "same"):
        assert any("dtype" in e for e in cls.parse_attrs({"dtype": dtype})[1]), dtype
    assert any("unknown attribute" in e for e in op("max").parse_attrs({"axes": "(1,)"})[1])


def cpu_reads(shape, reduced, y_shape) -> list[list[int]]:
    """The flat input offsets the runtime's CPU kernel (cpu/ops/reduce.cc) reads for each output, step by step."""
    nd = len(shape)
    flag = [i in reduced for i in range(nd)]
    step = [prod(shape[i + 1:]) for i in range(nd)]
    y_wide = [d for d in y_shape if d != 1]
    red = sorted(reduced)
    out = []
    for i in range(prod(y_shape)):
        start, o, xj = 0, i, nd - 1
        for j in reversed(range(len(y_wide))):
            col, o = o % y_wide[j], o // y_wide[j]
            while xj >= 0:  # while (xj >= 0 && flag[xj--]);
                reduced_axis, xj = flag[xj], xj - 1
                if not reduced_axis:
                    break
            start += col * step[xj + 1]
        group = []
        for k in range(prod(shape[r] for r in red)):
            off = 0
            for r in reversed(red):
                off, k = off + (k % shape[r]) * step[r], k // shape[r]
            group.append(start + off)
        out.append(group)
    return out


@st.composite
def ones_heavy_case(draw):
    """Shapes rich in size-1 axes, where the CPU kernel's index mapping can go wrong."""
    shape = tuple(draw(st.lists(st.sampled_from([1, 1, 2, 3]), min_size=1, max_size=5)))
    axis = tuple(draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape))))
    attrs = dict(axis=axis, keepdims=draw(st.booleans()), exclude=draw(st.booleans()))
    return draw(st.sampled_from(["sum", "max"])), attrs, 8, np.zeros(shape, np.int32)


@settings(max_examples=300, deadline=None)
@given(st.one_of(reduce_case(), ones_heavy_case()))
def test_cpu_bug_warning_matches_the_cpu_kernel(c):
    name, attrs, _, x = c
    r = reduced_set(x.shape, attrs["axis"], attrs["exclude"])
    cls = op(name)
    warned = any("CPU" in w for w in cls.warnings(cls.bind(attrs), [x.shape], [8]))
    if not r or (not attrs["axis"] and not attrs["exclude"]):
        assert not warned  # the identity and reduce-from-0 paths are the same on CPU and FORMAL
        return
    formal = [[int(np.ravel_multi_index(i, x.shape)) for i in g] for g in windows(x.shape, r)]
    y_shape = out_shape(x.shape, attrs["axis"], attrs["keepdims"], attrs["exclude"])
    assert warned == (cpu_reads(x.shape, r, y_shape) != formal)


def test_cpu_bug_verified_example():
    """sum(axis=1) of shape (2, 3, 1) differs on CPU (verified); a kept 1 with nothing wide left of it does not."""
    sm = op("sum")
    assert any("CPU" in w for w in sm.warnings(sm.bind({"axis": (1,)}), [(2, 3, 1)], [8]))
    assert cpu_reads((2, 3, 1), {1}, (2, 1)) == [[0, 1, 2], [1, 2, 3]]  # FORMAL reads [0, 1, 2], [3, 4, 5]



@pytest.mark.parametrize("shape,axis,bug", [
    ((2, 3, 1), (1,), True),
    ((2, 3, 1, 1), (1, 3), True),
    ((2, 1, 3, 1), (1,), True),
    ((3, 1), (0,), False),  # no wide kept axis left of the kept 1
    ((2, 1, 1), (1,), False),  # the reduced axis between has size 1: same strides
    ((2, 3, 4), (1,), False),
    ((1, 3, 2), (1,), False),
])
def test_cpu_bug_cases(shape, axis, bug):
    sm = op("sum")
    r = set(axis)
    formal = [[int(np.ravel_multi_index(i, shape)) for i in g] for g in windows(shape, r)]
    assert (cpu_reads(shape, r, out_shape(shape, axis, False, False)) != formal) == bug
    assert any("CPU" in w for w in sm.warnings(sm.bind({"axis": axis}), [shape], [8])) == bug


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=2, max_size=4), st.integers(0, 3), st.integers(0, 3))
def test_heads_of_different_row_counts_are_warned_as_the_c_api_refuses_them(shape, a, b):
    """The C API interleaves several heads row by row (a row: all axes but the last) and refuses heads of different
    row counts at every inference; validate warns naming each head's rows, and only then."""
    shape = tuple(shape)
    g = GraphBuilder()
    x = g.input("data", shape, 8)
    heads = [g.op("sum", x, name=f"h{i}", axis=(k % len(shape),), keepdims=True) for i, k in enumerate((a, b))]
    graph = g.build(*heads)
    assert all(w.where != "heads" for w in validate(graph).warnings)  # the C API's rule, not the graph's
    warned = c_api_warnings(graph)
    rows = [int(np.prod([1 if i == k % len(shape) else d for i, d in enumerate(shape)][:-1])) for k in (a, b)]
    assert len(warned) == (rows[0] != rows[1])
    if warned:
        assert f"h0 {rows[0]}, h1 {rows[1]}" in warned[0].rule and "does not run on chain" in warned[0].rule
