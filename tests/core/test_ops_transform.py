"""Transform ops against loop oracles written from the runtime's rules (FORMAL kernels, shape checks), the
runtime's own reshape examples and values verified on a build of the runtime."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from cvm_onnx.core.attrs import format_value
from cvm_onnx.core.ops import REGISTRY, OpRuleError

EDGE = 2**31 - 1  # the largest magnitude a 32-bit precision allows
SETTINGS = settings(max_examples=40, deadline=None)


def bound(name: str, attrs: dict):
    """Parse attributes written as the runtime's strings, as a model file holds them."""
    op = REGISTRY[name]
    typed, errors = op.parse_attrs({k: format_value(v) for k, v in attrs.items()})
    assert not errors, errors
    return op, op.bind(typed)


def run(name: str, attrs: dict, *xs: np.ndarray) -> np.ndarray:
    """The op's output, checked to be int32 and of the inferred shape."""
    op, a = bound(name, attrs)
    (shape,) = op.infer_shapes(a, [x.shape for x in xs])
    (y,) = op.run(a, [x.astype(np.int32) for x in xs])
    assert y.dtype == np.int32
    assert y.shape == shape
    return y


def shapes(min_dims=1, max_dims=4, sides=st.integers(1, 4)):
    return st.lists(sides, min_size=min_dims, max_size=max_dims).map(tuple)


def tensors(shape):
    """Distinct int32 values (so a wrong index cannot go unnoticed), extremes included."""
    return arrays(np.int32, shape, elements=st.integers(-EDGE, EDGE), unique=True)


@st.composite
def data(draw, min_dims=1, max_dims=4, sides=st.integers(1, 4)):
    return draw(tensors(draw(shapes(min_dims, max_dims, sides))))


def axis_of(draw, n: int, extra: int = 0) -> tuple[int, int]:
    """A valid axis in [-n-extra, n-1+extra] drawn in either sign, and its non-negative form."""
    real = draw(st.integers(0, n - 1 + extra))
    return (real - n - extra if draw(st.booleans()) else real), real


# -- expand_dims, flatten, reshape, squeeze: row-major reinterpretations --------------------------------------
@SETTINGS
@given(st.data())
def test_expand_dims(d):
    x = d.draw(data())
    n = x.ndim
    axis, real = axis_of(d.draw, n + 1)
    k = d.draw(st.integers(1, 3))
    y = run("expand_dims", {"axis": axis, "num_newaxis": k}, x)
    assert y.shape == x.shape[:real] + (1,) * k + x.shape[real:]
    for idx in np.ndindex(*x.shape):
        assert y[idx[:real] + (0,) * k + idx[real:]] == x[idx]


def flat_index(idx, dims):
    return sum(i * math.prod(dims[j + 1:]) for j, i in enumerate(idx))


@SETTINGS
@given(data())
def test_flatten(x):
    y = run("flatten", {}, x)
    assert y.shape == (x.shape[0], math.prod(x.shape[1:]))
    for idx in np.ndindex(*x.shape):
        assert y[idx[0], flat_index(idx[1:], x.shape[1:])] == x[idx]


@st.composite
def reshape_cases(draw):
    """A source shape and a target using every special code, with the output shape it must give."""
    src = draw(shapes(1, 4, st.integers(1, 6)))
    codes, want, k, inferred = [], [], 0, False
    while k < len(src):
        d, kind = src[k], draw(st.sampled_from(["copy", "literal", "merge", "split", "rest", "infer"]))
        if kind == "copy":
            codes, want, k = codes + [0], want + [d], k + 1
        elif kind == "literal":
            codes, want, k = codes + [d], want + [d], k + 1
        elif kind == "merge" and k + 1 < len(src):
            codes, want, k = codes + [-3], want + [d * src[k + 1]], k + 2
        elif kind == "split":
            left = draw(st.sampled_from([q for q in range(1, d + 1) if d % q == 0]))
            hide = draw(st.sampled_from(["none", "left", "right"]))
            codes += [-4, -1 if hide == "left" else left, -1 if hide == "right" else d // left]
            want, k = want + [left, d // left], k + 1
        elif kind == "rest":
            codes, want, k = codes + [-2], want + list(src[k:]), len(src)
        elif kind == "infer" and not inferred:
            codes, want, k, inferred = codes + [-1], want + [d], k + 1, True
    ones = draw(st.integers(0, 2))
    return src, tuple(codes + [1] * ones), tuple(want + [1] * ones)


@settings(max_examples=100, deadline=None)
@given(reshape_cases(), st.data())
def test_reshape_codes(case, d):
    src, codes, want = case
    x = d.draw(tensors(src))
    y = run("reshape", {"shape": codes}, x)
    assert y.shape == want
    assert np.array_equal(y.ravel(), x.ravel())


# The examples in the runtime's reshape documentation (src/top/tensor/transform.cc), then two of its code paths.
@pytest.mark.parametrize("src, codes, want", [
    ((2, 3, 4), (4, 0, 2), (4, 3, 2)), ((2, 3, 4), (2, 0, 0), (2, 3, 4)),
    ((2, 3, 4), (6, 1, -1), (6, 1, 4)), ((2, 3, 4), (3, -1, 8), (3, 1, 8)), ((2, 3, 4), (-1,), (24,)),
    ((2, 3, 4), (-2,), (2, 3, 4)), ((2, 3, 4), (2, -2), (2, 3, 4)), ((2, 3, 4), (-2, 1, 1), (2, 3, 4, 1, 1)),
    ((2, 3, 4), (-3, 4), (6, 4)), ((2, 3, 4, 5), (-3, -3), (6, 20)), ((2, 3, 4), (0, -3), (2, 12)),
    ((2, 3, 4), (-3, -2), (6, 4)), ((2, 3, 4), (-4, 1, 2, -2), (1, 2, 3, 4)),
    ((2, 3, 4), (2, -4, -1, 3, -2), (2, 1, 3, 4)),
    ((2, 3, 4), (-1, 0, 0), (2, 3, 4)),  # -1 consumes an input dim, as a positive value does
    ((2, 3, 4), (1, 0, -1), (1, 3, 8)),
])
def test_reshape_examples(src, codes, want):
    x = np.arange(math.prod(src), dtype=np.int32).reshape(src)
    assert run("reshape", {"shape": codes}, x).shape == want


@SETTINGS
@given(st.data())
def test_squeeze(d):
    x = d.draw(data(sides=st.sampled_from([1, 1, 2, 3])))
    n, ones = x.ndim, [i for i, s in enumerate(x.shape) if s == 1]
    if ones and d.draw(st.booleans()):
        real = d.draw(st.lists(st.sampled_from(ones), min_size=1, max_size=3))
        axis = tuple(r - n if d.draw(st.booleans()) else r for r in real)
    else:
        real, axis = ones, ()
    y = run("squeeze", {"axis": axis}, x)
    kept = tuple(s for i, s in enumerate(x.shape) if i not in real)
    assert y.shape == (kept or (1,))
    assert np.array_equal(y.ravel(), x.ravel())


# -- transpose, strided_slice, repeat, tile: index maps -------------------------------------------------------
@SETTINGS
@given(st.data())
def test_transpose(d):
    x = d.draw(data())
    n = x.ndim
    if d.draw(st.booleans()):
        perm = d.draw(st.permutations(range(n)))
        axes = tuple(p - n if d.draw(st.booleans()) else p for p in perm)
    else:
        perm, axes = [n - 1 - i for i in range(n)], ()
    y = run("transpose", {"axes": axes}, x)
    for idx in np.ndindex(*x.shape):
        assert y[tuple(idx[p] for p in perm)] == x[idx]


def slice_ranges(shape, begin, end, stride):
    """The runtime's per-axis rule: pad, make non-negative, clamp to the stride's range; Python ranges."""
    out = []
    for i, n in enumerate(shape):
        b = begin[i] if i < len(begin) else 0
        e = end[i] if i < len(end) else n
        s = stride[i] if i < len(stride) else 1
        lo, hi = (-1, n - 1) if s < 0 else (0, n)
        b = min(max(b + n if b < 0 else b, lo), hi)
        e = min(max(e + n if e < 0 else e, lo), hi)
        out.append(range(b, e, s))
    return out


@SETTINGS
@given(st.data())
def test_strided_slice(d):
    x = d.draw(data(sides=st.integers(1, 6)))
    n = x.ndim
    ints = st.integers(-8, 8)
    begin = tuple(d.draw(st.lists(ints, max_size=n)))
    end = tuple(d.draw(st.lists(ints, max_size=n)))
    stride = tuple(d.draw(st.lists(st.integers(-3, 3).filter(bool), max_size=n)))
    attrs = {"begin": begin, "end": end, "stride": stride}
    ranges = slice_ranges(x.shape, begin, end, stride)
    if all(ranges):
        y = run("strided_slice", attrs, x)
        assert np.array_equal(y, x[np.ix_(*ranges)])
    else:
        op, a = bound("strided_slice", attrs)
        with pytest.raises(OpRuleError, match="selects nothing"):
            op.infer_shapes(a, [x.shape])


def test_strided_slice_verified_and_defaults():
    x = np.arange(10, dtype=np.int32)
    assert run("strided_slice", {"begin": (8,), "end": (1,), "stride": (-3,)}, x).tolist() == [8, 5, 2]
    assert run("strided_slice", {"begin": (-1,), "end": (-11,), "stride": (-1,)}, x).tolist() == list(range(9, -1, -1))
    m = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert run("strided_slice", {}, m).tolist() == [[0, 1, 2, 3]]  # defaults begin (0,), end (1,)


@SETTINGS
@given(st.data())
def test_repeat(d):
    x = d.draw(data())
    axis, real = axis_of(d.draw, x.ndim)
    r = d.draw(st.integers(1, 3))
    y = run("repeat", {"repeats": r, "axis": axis}, x)
    assert y.shape == x.shape[:real] + (x.shape[real] * r,) + x.shape[real + 1:]
    for idx in np.ndindex(*y.shape):
        assert y[idx] == x[idx[:real] + (idx[real] // r,) + idx[real + 1:]]


@SETTINGS
@given(data(max_dims=3), st.lists(st.integers(1, 3), min_size=1, max_size=4))
def test_tile(x, reps):
    y = run("tile", {"reps": tuple(reps)}, x)
    k, n = max(x.ndim, len(reps)), x.ndim
    sx = (1,) * (k - n) + x.shape
    sr = (1,) * (k - len(reps)) + tuple(reps)
    assert y.shape == tuple(a * b for a, b in zip(sx, sr))
    for idx in np.ndindex(*y.shape):
        assert y[idx] == x[tuple(idx[k - n + i] % x.shape[i] for i in range(n))]


# -- take, cvm_lut: clipped gathers ----------------------------------------------------------------------------
indices = st.one_of(st.integers(-3, 8), st.sampled_from([-EDGE, EDGE]))


def clip(i, n):
    return min(max(int(i), 0), n - 1)


@SETTINGS
@given(st.data())
def test_take(d):
    x = d.draw(data(max_dims=3))
    idx = d.draw(arrays(np.int32, d.draw(shapes(1, 3)), elements=indices))
    if d.draw(st.booleans()):
        y = run("take", {"axis": None}, x, idx)
        flat = x.ravel()
        assert y.shape == idx.shape
        for j in np.ndindex(*idx.shape):
            assert y[j] == flat[clip(idx[j], flat.size)]
    else:
        axis, a = axis_of(d.draw, x.ndim)
        y = run("take", {"axis": axis}, x, idx)
        m = idx.ndim
        assert y.shape == x.shape[:a] + idx.shape + x.shape[a + 1:]
        for j in np.ndindex(*y.shape):
            pick = clip(idx[j[a:a + m]], x.shape[a])
            assert y[j] == x[j[:a] + (pick,) + j[a + m:]]


def test_take_verified():
    got = run("take", {}, np.array([10, 20, 30, 40]), np.array([-3, 0, 2, 9]))
    assert got.tolist() == [10, 10, 30, 40]


@SETTINGS
@given(st.data())
def test_cvm_lut(d):
    table = d.draw(data(max_dims=2, sides=st.integers(1, 8)))
    idx = d.draw(arrays(np.int32, d.draw(shapes(1, 3)), elements=indices))
    y = run("cvm_lut", {"in_dim": table.size}, idx, table)
    flat = table.ravel()
    assert y.shape == idx.shape
    for j in np.ndindex(*idx.shape):
        assert y[j] == flat[clip(idx[j], table.size)]


# -- slice_like, concatenate, where -----------------------------------------------------------------------------
@SETTINGS
@given(st.data())
def test_slice_like(d):
    x = d.draw(data())
    n = x.ndim
    if d.draw(st.booleans()):
        like = tuple(d.draw(st.integers(1, s)) for s in x.shape)
        axis, want = (), like
    else:
        nl = d.draw(st.integers(1, n + 1))
        like = tuple(d.draw(st.integers(1, x.shape[i] if i < n else 4)) for i in range(nl))
        real = d.draw(st.lists(st.integers(0, min(n, nl) - 1), min_size=1, max_size=3))
        axis = tuple(r - n if d.draw(st.booleans()) else r for r in real)
        want = tuple(like[i] if i in real else s for i, s in enumerate(x.shape))
    y = run("slice_like", {"axis": axis}, x, np.zeros(like, np.int32))
    assert y.shape == want
    for idx in np.ndindex(*want):
        assert y[idx] == x[idx]


@SETTINGS
@given(st.data())
def test_concatenate(d):
    base = d.draw(shapes())
    n = len(base)
    axis, a = axis_of(d.draw, n)
    sizes = d.draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    xs = [d.draw(tensors(base[:a] + (k,) + base[a + 1:])) for k in sizes]
    y = run("concatenate", {"axis": axis}, *xs)
    assert y.shape == base[:a] + (sum(sizes),) + base[a + 1:]
    for i, xi in enumerate(xs):
        for idx in np.ndindex(*xi.shape):
            new = sum(sizes[:i]) + idx[a]
            assert y[idx[:a] + (new,) + idx[a + 1:]] == xi[idx]


@SETTINGS
@given(st.data())
def test_where(d):
    x = d.draw(data())
    y = d.draw(tensors(x.shape))
    rows = d.draw(st.booleans())
    cond = d.draw(arrays(np.int32, x.shape[:1] if rows else x.shape, elements=st.sampled_from([0, 1, -1, EDGE, -EDGE])))
    out = run("where", {}, cond, x, y)
    for idx in np.ndindex(*x.shape):
        c = cond[idx[0]] if rows else cond[idx]
        assert out[idx] == (x[idx] if c != 0 else y[idx])


# -- attributes, arity, precision, rules, warnings ----------------------------------------------------------------
def test_defaults_and_required():
    assert REGISTRY["strided_slice"].bind({}).as_dict() == {"begin": (0,), "end": (1,), "stride": ()}
    assert REGISTRY["concatenate"].bind({}).axis == 1
    assert REGISTRY["take"].bind({}).axis is None
    assert REGISTRY["tile"].bind({}).reps == (0,)
    assert REGISTRY["expand_dims"].bind({"axis": 0}).num_newaxis == 1
    for name, attr in [("reshape", "shape"), ("expand_dims", "axis"), ("repeat", "repeats"), ("cvm_lut", "in_dim")]:
        _, errors = REGISTRY[name].parse_attrs({})
        assert errors == [f"attribute {attr} is required"]


@pytest.mark.parametrize("name, attrs", [
    ("expand_dims", {"axis": "0", "num_newaxis": "0"}), ("expand_dims", {"axis": "0", "num_newaxis": "4097"}),
    ("repeat", {"repeats": "0"}), ("strided_slice", {"begin": "(None, 1)"}), ("squeeze", {"axes": "(0,)"}),
    ("flatten", {"axis": "1"}), ("where", {"axis": "0"}),
])
def test_attribute_errors(name, attrs):
    _, errors = REGISTRY[name].parse_attrs(attrs)
    assert errors


def test_arity():
    arity = {n: REGISTRY[n].arity(REGISTRY[n].bind({})) for n in ("flatten", "take", "cvm_lut", "slice_like", "where")}
    assert arity == {"flatten": (1, 1), "take": (2, 2), "cvm_lut": (2, 2), "slice_like": (2, 2), "where": (3, 3)}
    lo, hi = REGISTRY["concatenate"].arity(REGISTRY["concatenate"].bind({}))
    assert lo == 1 and hi >= 2**31 - 1


@pytest.mark.parametrize("name, attrs, shapes, precisions, want", [
    ("flatten", {}, [(2, 3)], [7], 7),
    ("take", {}, [(4,), (2,)], [9, 3], 9),
    ("cvm_lut", {"in_dim": 4}, [(2,), (4,)], [3, 9], 9),            # the table's
    ("concatenate", {"axis": 0}, [(1,), (2,), (3,)], [4, 12, 8], 12),
    ("where", {}, [(2,), (2,), (2,)], [1, 16, 16], 1),                # the condition's, as the runtime
    ("slice_like", {}, [(3,), (2,)], [5, 30], 5),
])
def test_precision(name, attrs, shapes, precisions, want):
    op, a = bound(name, attrs)
    assert op.infer_precisions(a, precisions, shapes) == [want]


@pytest.mark.parametrize("name, attrs, shapes, rule", [
    ("expand_dims", {"axis": 3}, [(2, 2)], r"must lie in \[-3, 2\]"),
    ("expand_dims", {"axis": -4}, [(2, 2)], r"must lie in \[-3, 2\]"),
    ("reshape", {"shape": ()}, [(4,)], "must not be empty"),
    ("reshape", {"shape": (5,)}, [(4,)], "different size"),
    ("reshape", {"shape": (-1, -1)}, [(4,)], "only one -1"),
    ("reshape", {"shape": (0, 0)}, [(4,)], "no input dim left"),
    ("reshape", {"shape": (-3,)}, [(4,)], "two input dims"),
    ("reshape", {"shape": (-4, 2)}, [(4,)], "followed by the two split dims"),
    ("reshape", {"shape": (-4, -1, -1)}, [(4,)], "cannot both be -1"),
    ("reshape", {"shape": (-4, 3, -1)}, [(4,)], "do not divide"),
    ("reshape", {"shape": (-4, -2, -2)}, [(4,)], "positive or -1"),
    ("reshape", {"shape": (-4, 0, -1)}, [(4,)], "positive or -1"),
    ("squeeze", {"axis": (1,)}, [(1, 2)], "only size-1 axes"),
    ("squeeze", {"axis": (2,)}, [(1, 2)], r"must lie in \[-2, 1\]"),
    ("transpose", {"axes": (0,)}, [(1, 2)], "must list all 2 axes"),
    ("transpose", {"axes": (0, -2)}, [(1, 2)], "repeats an axis"),
    ("transpose", {"axes": (0, 2)}, [(1, 2)], r"must lie in \[-2, 1\]"),
    ("strided_slice", {"stride": (0,)}, [(3,)], "stride is 0"),
    ("strided_slice", {"begin": (2,), "end": (2,)}, [(3,)], "selects nothing"),
    ("strided_slice", {"begin": (0,), "end": (2,), "stride": (-1,)}, [(3,)], "selects nothing"),
    ("repeat", {"repeats": 2, "axis": 2}, [(1, 2)], r"must lie in \[-2, 1\]"),
    ("tile", {}, [(2,)], r"\[1, 4096\]"),
    ("tile", {"reps": ()}, [(2,)], "must not be empty"),
    ("tile", {"reps": (4097,)}, [(2,)], r"\[1, 4096\]"),
    ("take", {"axis": -3}, [(2, 2), (1,)], r"must lie in \[-2, 1\]"),
    ("cvm_lut", {"in_dim": 5}, [(2,), (4,)], "must equal in_dim"),
    ("slice_like", {}, [(2, 2), (2,)], "equal ndim"),
    ("slice_like", {}, [(2, 2), (2, 3)], "exceeds"),
    ("slice_like", {"axis": (1,)}, [(2, 2), (2,)], r"must lie in \[0, 0\]"),
    ("concatenate", {}, [(2,), (2,)], r"must lie in \[-1, 0\]"),  # the default axis 1 on 1-D inputs
    ("concatenate", {"axis": 0}, [(2, 2), (2,)], "has 1 dims"),
    ("concatenate", {"axis": 0}, [(2, 2), (2, 3)], "differs from input 0"),
    ("where", {}, [(2, 2), (2, 2), (2, 3)], "same shape"),
    ("where", {}, [(3,), (2, 2), (2, 2)], "be 1-D of length 2"),
    ("where", {}, [(2, 1), (2, 2), (2, 2)], "be 1-D of length 2"),
])
def test_rule_violations(name, attrs, shapes, rule):
    op, a = bound(name, attrs)
    with pytest.raises(OpRuleError, match=rule):
        op.infer_shapes(a, shapes)


def test_warnings():
    op, a = bound("where", {})
    assert any("1-D condition" in w for w in op.warnings(a, [(2,), (2, 3), (2, 3)], [8, 8, 8]))
    assert any("precision" in w for w in op.warnings(a, [(2, 3)] * 3, [1, 8, 8]))
    assert op.warnings(a, [(2, 3)] * 3, [8, 8, 8]) == []
    op, a = bound("strided_slice", {"begin": (0, 0)})
    assert op.warnings(a, [(3,)], [8]) and not op.warnings(a, [(3, 3)], [8])


def test_reshape_skips_codes_below_minus_4():
    # They match no branch of the runtime's ReshapeInferShape and consume nothing.
    assert run("reshape", {"shape": (-5, 4)}, np.arange(4)).shape == (4,)
