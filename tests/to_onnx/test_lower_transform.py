"""ONNX lowerings of the transform ops: onnxruntime's output equals the reference executor's bit for bit, over
random shapes and attributes (negative axes, every reshape code, negative strides, out-of-range indices) and values
at the precision extremes; each op is also exported once in the flat (inlined) form. Values verified on a build of
the runtime (notes) pin the reference for the trickiest ops."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from support import assert_exact, single_op, tensors

SETTINGS = settings(max_examples=20, deadline=None)
precisions = st.sampled_from([2, 8, 31, 32])


def shape_of(draw, min_dims=1, max_dims=4, max_side=4) -> tuple[int, ...]:
    return tuple(draw(st.lists(st.integers(1, max_side), min_size=min_dims, max_size=max_dims)))


def signed_axis(draw, axis: int, n: int) -> int:
    """``axis`` in [0, n) written in either sign."""
    return axis - n if draw(st.booleans()) else axis


def data_input(draw, shape, is_param=None):
    """(value, precision, is_param) of one input with values at the precision extremes."""
    p = draw(precisions)
    param = draw(st.booleans()) if is_param is None else is_param
    return draw(tensors(shape, p)), p, param


def check(op, inputs, inline=False, **attrs):
    graph, feeds = single_op(op, inputs, **attrs)
    return assert_exact(graph, feeds, inline=inline)


# -- row-major reinterpretations: one Reshape to the static shape ----------------------------------------------
@SETTINGS
@given(st.data())
def test_expand_dims(d):
    s = shape_of(d.draw)
    n = len(s)
    axis = d.draw(st.integers(-n - 1, n))
    check("expand_dims", [data_input(d.draw, s, False)], axis=axis, num_newaxis=d.draw(st.integers(1, 6 - n)))


@SETTINGS
@given(st.data())
def test_flatten(d):
    check("flatten", [data_input(d.draw, shape_of(d.draw, max_dims=6, max_side=3), False)])


@st.composite
def reshape_codes(draw, s: tuple[int, ...]) -> tuple[int, ...]:
    """A valid MXNet reshape target for ``s`` using the codes 0, -1, -2, -3, -4 and plain sizes."""
    if draw(st.integers(0, 4)) == 0:  # regroup freely: (-1,) or (k, -1) with k dividing the size
        size = math.prod(s)
        k = draw(st.sampled_from([k for k in range(1, size + 1) if size % k == 0]))
        return draw(st.sampled_from([(-1,), (k, -1), (-1, k)]))
    codes, i, inferred = [], 0, False
    while i < len(s):
        kinds = ["0", "size", "-2"] + (["-1"] if not inferred else []) + (["-3"] if i + 1 < len(s) else [])
        kinds += ["-4"]
        kind = draw(st.sampled_from(kinds))
        if kind == "0":
            codes.append(0)
        elif kind == "size":
            codes.append(s[i])
        elif kind == "-1":
            codes.append(-1)
            inferred = True
        elif kind == "-2":
            codes.append(-2)
            codes += [1] * draw(st.integers(0, 1))  # trailing sizes after -2 add axes of 1
            break
        elif kind == "-3":
            codes.append(-3)
            i += 1
        else:
            d0 = s[i]
            d1 = draw(st.sampled_from([k for k in range(1, d0 + 1) if d0 % k == 0]))
            split = draw(st.sampled_from([(d1, d0 // d1), (-1, d0 // d1), (d1, -1)]))
            codes += [-4, *split]
        i += 1
    return tuple(codes)


@SETTINGS
@given(st.data())
def test_reshape(d):
    s = shape_of(d.draw, max_dims=3)
    check("reshape", [data_input(d.draw, s, False)], shape=d.draw(reshape_codes(s)))


@pytest.mark.parametrize("codes, want", [
    ((4, 0, 2), (4, 3, 2)), ((2, 0, 0), (2, 3, 4)), ((6, 1, -1), (6, 1, 4)), ((3, -1, 8), (3, 1, 8)),
    ((-1,), (24,)), ((-2,), (2, 3, 4)), ((2, -2), (2, 3, 4)), ((-2, 1, 1), (2, 3, 4, 1, 1)), ((-3, 4), (6, 4)),
    ((0, -3), (2, 12)), ((-3, -2), (6, 4)), ((-4, 1, 2, -2), (1, 2, 3, 4)), ((2, -4, -1, 3, -2), (2, 1, 3, 4)),
])
def test_reshape_runtime_examples(codes, want):
    """The examples of the runtime's reshape documentation, input shape (2, 3, 4)."""
    x = np.arange(-12, 12, dtype=np.int32).reshape(2, 3, 4)
    (y,) = check("reshape", [(x, 8, False)], shape=codes)
    assert y.shape == want and np.array_equal(y.reshape(-1), x.reshape(-1))


@SETTINGS
@given(st.data())
def test_squeeze(d):
    s = tuple(d.draw(st.lists(st.sampled_from([1, 1, 2, 3]), min_size=1, max_size=5)))
    ones = [i for i, v in enumerate(s) if v == 1]
    chosen = d.draw(st.lists(st.sampled_from(ones), unique=True)) if ones else []
    axis = tuple(signed_axis(d.draw, i, len(s)) for i in chosen)
    check("squeeze", [data_input(d.draw, s, False)], axis=axis)


# -- permutations and selections -------------------------------------------------------------------------------
@SETTINGS
@given(st.data())
def test_transpose(d):
    s = shape_of(d.draw, max_dims=5)
    n = len(s)
    perm = d.draw(st.permutations(range(n)))
    axes = () if d.draw(st.booleans()) else tuple(signed_axis(d.draw, p, n) for p in perm)
    check("transpose", [data_input(d.draw, s, False)], axes=axes)


@st.composite
def slice_attrs(draw, s: tuple[int, ...]):
    """begin/end/stride written in every form the runtime accepts: negative, past the ends (clamped), omitted."""
    begins, ends, strides = [], [], []
    for dim in s:
        step = draw(st.sampled_from([1, 2, 3, -1, -2, -3]))
        b = draw(st.integers(0, dim - 1))
        if step > 0:
            e = draw(st.integers(b + 1, dim))
            raw_e = draw(st.sampled_from([e, e - dim] if e < dim else [dim, dim + 7]))
        else:
            e = draw(st.integers(-1, b - 1)) if b > 0 else -1
            raw_e = draw(st.sampled_from([e, e - dim] if e >= 0 else [-dim - 1, -dim - 9]))
        clamped = [-dim - 5] if b == 0 and step > 0 else [dim + 5] if b == dim - 1 and step < 0 else []
        raw_b = draw(st.sampled_from([b, b - dim] + clamped))
        begins.append(raw_b)
        ends.append(raw_e)
        strides.append(step)

    def trimmed(values, default):  # trailing default entries may be left out
        values = list(values)
        while values and values[-1] == default(len(values) - 1) and draw(st.booleans()):
            values.pop()
        return tuple(values)

    return dict(begin=trimmed(begins, lambda i: 0) or (0,), end=trimmed(ends, lambda i: s[i]) or (s[0],),
                stride=trimmed(strides, lambda i: 1))


@SETTINGS
@given(st.data())
def test_strided_slice(d):
    s = shape_of(d.draw, max_dims=4, max_side=7)
    check("strided_slice", [data_input(d.draw, s, False)], **d.draw(slice_attrs(s)))


def test_strided_slice_verified():
    """Verified on the runtime: begin=(8,), end=(1,), stride=(-3,) on arange(10) gives [8, 5, 2]."""
    (y,) = check("strided_slice", [(np.arange(10, dtype=np.int32), 8, False)], begin=(8,), end=(1,), stride=(-3,))
    assert y.tolist() == [8, 5, 2]


def test_strided_slice_down_to_zero():
    """A backward slice that ends at index 0 (ONNX would read an end of -1 as the last index)."""
    x = np.arange(6, dtype=np.int32)
    (y,) = check("strided_slice", [(x, 8, False)], begin=(5,), end=(-7,), stride=(-1,))
    assert y.tolist() == [5, 4, 3, 2, 1, 0]


@SETTINGS
@given(st.data())
def test_repeat(d):
    s = shape_of(d.draw)
    axis = signed_axis(d.draw, d.draw(st.integers(0, len(s) - 1)), len(s))
    check("repeat", [data_input(d.draw, s, False)], repeats=d.draw(st.integers(1, 4)), axis=axis)


@SETTINGS
@given(st.data())
def test_tile(d):
    s = shape_of(d.draw, max_dims=4, max_side=3)
    reps = tuple(d.draw(st.lists(st.integers(1, 3), min_size=1, max_size=5)))
    check("tile", [data_input(d.draw, s, False)], reps=reps)


def index_values(n: int, shape):
    """int32 indices in and out of [0, n): negatives, n and beyond, and the int32 extremes."""
    edges = st.sampled_from([-(2**31 - 1), -1, 0, n - 1, n, 2**31 - 1])
    return hnp.arrays(np.int32, shape, elements=st.one_of(edges, st.integers(-3, n + 3)))


@SETTINGS
@given(st.data())
def test_take(d):
    s = shape_of(d.draw, max_dims=3)
    axis = d.draw(st.one_of(st.none(), st.integers(0, len(s) - 1)))
    n = math.prod(s) if axis is None else s[axis]
    idx = d.draw(index_values(n, shape_of(d.draw, max_dims=3, max_side=3)))
    if axis is not None:
        axis = signed_axis(d.draw, axis, len(s))
    check("take", [data_input(d.draw, s), (idx, 32, d.draw(st.booleans()))], axis=axis)


def test_take_verified():
    """Verified on the runtime: indices [-3, 0, 2, 9] into [10, 20, 30, 40] give [10, 10, 30, 40]."""
    (y,) = check("take", [(np.array([10, 20, 30, 40], np.int32), 8, False),
                          (np.array([-3, 0, 2, 9], np.int32), 8, False)])
    assert y.tolist() == [10, 10, 30, 40]


@SETTINGS
@given(st.data())
def test_slice_like(d):
    s = shape_of(d.draw)
    if d.draw(st.booleans()):  # axis=(): equal ranks, every axis cut to shape_like's
        like, axis = tuple(d.draw(st.integers(1, v)) for v in s), ()
    else:  # listed axes (counted from the data's rank when negative); shape_like's other dims are free
        rank = d.draw(st.integers(1, 5))
        axes = d.draw(st.lists(st.integers(0, min(rank, len(s)) - 1), min_size=1, max_size=3, unique=True))
        like = tuple(d.draw(st.integers(1, s[i] if i in axes else 4)) for i in range(rank))
        axis = tuple(signed_axis(d.draw, i, len(s)) for i in axes)
    check("slice_like", [data_input(d.draw, s, False), data_input(d.draw, like)], axis=axis)


@SETTINGS
@given(st.data())
def test_concatenate(d):
    s = shape_of(d.draw)
    axis = d.draw(st.integers(0, len(s) - 1))
    inputs = []
    for _ in range(d.draw(st.integers(1, 4))):
        shape = s[:axis] + (d.draw(st.integers(1, 3)),) + s[axis + 1:]
        inputs.append(data_input(d.draw, shape))
    inputs[0] = (*inputs[0][:2], False)
    check("concatenate", inputs, axis=signed_axis(d.draw, axis, len(s)))


@SETTINGS
@given(st.data())
def test_where(d):
    s = shape_of(d.draw)
    full = d.draw(st.booleans())
    cond = data_input(d.draw, s if full else s[:1], False)
    check("where", [cond, data_input(d.draw, s, False), data_input(d.draw, s, False)])


def test_where_selects_rows():
    """A 1-D condition selects whole rows (the math doc; the runtime copies only the first bytes of a row)."""
    x = np.arange(6, dtype=np.int32).reshape(3, 2)
    cond = np.array([-5, 0, 2**31 - 1], np.int32)
    (y,) = check("where", [(cond, 32, False), (x, 8, False), (-x, 8, False)])
    assert y.tolist() == [[0, 1], [-2, -3], [4, 5]]


# -- the flat form: every op once with its functions inlined ---------------------------------------------------
def _x(*shape):
    return np.arange(-(math.prod(shape) // 2), math.prod(shape) - math.prod(shape) // 2,
                     dtype=np.int32).reshape(shape)


INLINE_CASES = {
    "expand_dims": ([(_x(2, 3), 8, False)], dict(axis=-1, num_newaxis=2)),
    "flatten": ([(_x(2, 3, 2), 8, False)], {}),
    "reshape": ([(_x(2, 3, 4), 8, False)], dict(shape=(2, -4, -1, 3, -2))),
    "squeeze": ([(_x(1, 3, 1), 8, False)], dict(axis=(0, -1))),
    "transpose": ([(_x(2, 3, 4), 8, False)], dict(axes=())),
    "strided_slice": ([(_x(5, 6), 8, False)], dict(begin=(4, 1), end=(-9, 6), stride=(-2, 2))),
    "repeat": ([(_x(2, 3), 8, False)], dict(repeats=3, axis=-1)),
    "tile": ([(_x(2, 3), 8, False)], dict(reps=(2, 1, 2))),
    "take": ([(_x(3, 4), 8, False), (np.array([[5, -1], [2, 0]], np.int32), 8, False)], dict(axis=1)),
    "slice_like": ([(_x(4, 5), 8, False), (_x(2, 5), 8, True)], dict(axis=(0,))),
    "concatenate": ([(_x(2, 3), 8, False), (_x(2, 1), 8, True), (_x(2, 2), 30, False)], dict(axis=-1)),
    "where": ([(np.array([[0, 3], [-1, 0]], np.int32), 4, False), (_x(2, 2), 8, False),
               (_x(2, 2) * 99, 16, False)], {}),
}


@pytest.mark.parametrize("op", sorted(INLINE_CASES))
def test_inlined(op):
    inputs, attrs = INLINE_CASES[op]
    check(op, inputs, inline=True, **attrs)


@pytest.mark.parametrize("inline", [False, True])
def test_whole_selection(inline):
    """Selections that keep everything lower to an Identity, in both forms."""
    x = _x(2, 3)
    (y,) = check("strided_slice", [(x, 8, False)], inline=inline, begin=(-9, 0), end=(2, 3))
    (z,) = check("slice_like", [(x, 8, False), (x, 8, False)], inline=inline)
    assert np.array_equal(y, x) and np.array_equal(z, x)
