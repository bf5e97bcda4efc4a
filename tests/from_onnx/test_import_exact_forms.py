"""The import rules of issue 19, each against an exact numpy oracle over random shapes, attributes and values at
the precision extremes: the imported graph on the reference executor and, exported again, on onnxruntime equal
the oracle element for element, or the model is refused with the rule's reason where the oracle's values leave
what CVM or the ONNX type can hold."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from support import bound, tensors

from cvm_onnx.converters.from_onnx import from_onnx
from cvm_onnx.converters.from_onnx.checks import supported_versions
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.errors import FormatError, UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.sessions import run

SETTINGS = settings(max_examples=10, deadline=None)
TYPES = {T.INT8: np.int8, T.UINT8: np.uint8, T.INT16: np.int16, T.UINT16: np.uint16, T.INT32: np.int32,
         T.UINT32: np.uint32, T.INT64: np.int64, T.UINT64: np.uint64}
shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)
#: The newest ai.onnx opset the installed onnx and onnxruntime read: the models here import opset 26 or that.
READ = supported_versions()[1]


def model(op, ins, shape, x_type, inits=(), opset=min(26, READ), out_type=None, **attrs):
    """One node ``op`` reading ``ins`` (``x`` is the graph input, the others initializers), output ``y``."""
    graph = helper.make_graph(
        [helper.make_node(op, list(ins), ["y"], name=op.lower(), **attrs)], "t",
        [helper.make_tensor_value_info("x", x_type, list(shape))],
        [helper.make_tensor_value_info("y", out_type or x_type, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
    return onnx_model(graph, opset)


def exact(m, x: np.ndarray, want: np.ndarray, precision: int) -> None:
    """Imported, the model computes ``want`` on the reference executor and on onnxruntime."""
    graph = from_onnx(m, input_precision=precision)
    feed = {"data": x.astype(np.int64).astype(np.int32).reshape(graph.nodes[graph.inputs[0]].outputs[0].shape)}
    for where, [got] in (("reference", execute(graph, feed)), ("onnxruntime", run(to_onnx(graph), feed))):
        assert got.size == want.size and np.array_equal(got.reshape(want.shape), want.astype(np.int64)), \
            (where, got, want)


def draw_x(d, shape, dtype, p):
    """Values of ``dtype`` within precision p (the input's declared bits)."""
    info = np.iinfo(TYPES[dtype])
    b = bound(p)
    return np.asarray(np.clip(d.draw(tensors(shape, p)).astype(np.int64), max(info.min, -b), min(info.max, b)),
                      TYPES[dtype])


def in_type(values: np.ndarray, dtype: int) -> bool:
    info = np.iinfo(TYPES[dtype])
    return values.size == 0 or (info.min <= values.min() and values.max() <= info.max)


# -- the Min bug and its audit ------------------------------------------------------------------------------------
@SETTINGS
@given(st.data(), shapes, st.sampled_from(list(TYPES)), st.integers(1, 31), st.booleans())
def test_min_and_max_of_any_integer_type(d, shape, dtype, p, is_min):
    """Regression: Min on unsigned types was refused (its rewrite -max(-x, -y) checked -x against the type)."""
    x = draw_x(d, shape, dtype, p)
    c = draw_x(d, shape[-1:], dtype, 31)
    want = (np.minimum if is_min else np.maximum)(x, c)
    exact(model("Min" if is_min else "Max", ["x", "c"], shape, dtype, {"c": c}), x, want, p)


def test_min_of_unsigned_constants_is_folded_without_wrapping():
    """Regression: the folded negations of uint8 constants wrapped (min(0, 3) gave 3)."""
    m = model("Min", ["a", "b"], (2,), T.UINT8, {"a": np.array([0, 200], np.uint8), "b": np.array([3, 100], np.uint8)})
    graph = from_onnx(m)
    assert np.array_equal(graph.params[graph.nodes[graph.heads[0].node].name].reshape(-1), [0, 100])


@SETTINGS
@given(st.data(), st.integers(1, 3), st.integers(1, 3), st.integers(-3, -1), st.integers(1, 12))
def test_unsigned_gemm_bounds_only_its_result(d, m_, n, beta, p):
    """A @ B + beta * C in uint32 with beta < 0: beta * C wraps in ONNX, the result does not (regression: the audit
    of rewrites; Gemm checked its steps against the type and refused this)."""
    a = d.draw(tensors((m_, 1), 8)).clip(100, 127).astype(np.uint32)
    b = d.draw(tensors((1, n), 8)).clip(100, 127).astype(np.uint32)
    c = draw_x(d, (m_, n), T.UINT32, p)
    m = model("Gemm", ["a", "b", "x"], (m_, n), T.UINT32, {"a": a, "b": b}, opset=13, beta=float(beta))
    exact(m, c, a.astype(np.int64) @ b.astype(np.int64) + beta * c.astype(np.int64), p)


# -- comparisons and logic ----------------------------------------------------------------------------------------
COMPARISONS = {"Equal": np.equal, "Greater": np.greater, "Less": np.less, "GreaterOrEqual": np.greater_equal,
               "LessOrEqual": np.less_equal}


@SETTINGS
@given(st.data(), shapes, st.sampled_from(sorted(COMPARISONS)), st.integers(1, 32), st.booleans())
def test_comparisons(d, shape, op, p, first):
    x = draw_x(d, shape, T.INT32, p)
    c = d.draw(st.one_of(st.just(x[..., :1]), tensors(shape[-1:], p))).astype(np.int32)
    ins = ["x", "c"] if first else ["c", "x"]
    want = COMPARISONS[op](*((x, c) if first else (c, x)))
    exact(model(op, ins, shape, T.INT32, {"c": c}, out_type=T.BOOL), x, want, p)


@SETTINGS
@given(st.data(), shapes, st.sampled_from(["And", "Or", "Xor", "Not"]))
def test_logic_of_zero_one_values(d, shape, op):
    x = d.draw(tensors(shape, 2)).clip(0, 1).astype(bool)
    c = d.draw(tensors(shape[-1:], 2)).clip(0, 1).astype(bool)
    fn = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}
    want = np.logical_not(x) if op == "Not" else fn[op](x, c)
    m = model(op, ["x"] if op == "Not" else ["x", "c"], shape, T.BOOL, {} if op == "Not" else {"c": c})
    exact(m, x, want, 2)


@SETTINGS
@given(st.data(), shapes, st.sampled_from([T.INT8, T.UINT8, T.INT16, T.UINT16, T.INT32, T.UINT32]),
       st.integers(1, 32))
def test_bitwise_not(d, shape, dtype, p):
    x = draw_x(d, shape, dtype, p)
    want = np.invert(x).astype(np.int64)
    m = model("BitwiseNot", ["x"], shape, dtype)
    info = np.iinfo(TYPES[dtype])  # refused where ~x of some value within the precision leaves 32 bits, drawn or not
    ends = np.array([max(info.min, -bound(p)), min(info.max, bound(p))]).astype(TYPES[dtype])  # ~x is monotone
    if np.abs(np.invert(ends).astype(np.int64)).max() > (1 << 31) - 1:
        with pytest.raises(UnsupportedError, match="precision bound exceeded"):
            from_onnx(m, input_precision=p)
        return
    exact(m, x, want, p)


# -- Mod, BitShift, Pow -------------------------------------------------------------------------------------------
@SETTINGS
@given(st.data(), shapes, st.sampled_from([T.INT8, T.UINT8, T.INT16, T.INT32, T.UINT32, T.INT64]),
       st.integers(2, 15), st.integers(0, 1), st.booleans())
def test_mod_both_modes(d, shape, dtype, p, fmod, dividend_is_input):
    """Python's % (fmod=0: the divisor's sign) and C's fmod (fmod=1: the dividend's), a constant or variable
    divisor (a variable divisor's zeros are undefined in ONNX: the drawn values avoid them)."""
    x = draw_x(d, shape, dtype, p)
    c = draw_x(d, shape[-1:], dtype, d.draw(st.integers(1, 16)))
    if dividend_is_input:
        c = np.where(c == 0, 1, c).astype(c.dtype)
        a, b = x, c
    else:
        x = np.where(x == 0, 1, x).astype(x.dtype)
        a, b = c, x
    want = (np.fmod if fmod else np.mod)(a.astype(np.int64), b.astype(np.int64))
    exact(model("Mod", ["x", "c"] if dividend_is_input else ["c", "x"], shape, dtype, {"c": c}, fmod=fmod),
          x, want, p)


def refused_for_its_opset(m) -> bool:
    """Whether the model's opset is newer than the installed onnxruntime reads, and the import says so."""
    if m.opset_import[0].version <= READ:
        return False
    with pytest.raises(FormatError, match=f"opset {m.opset_import[0].version} is not one the installed onnx and "
                                          f"onnxruntime read"):
        from_onnx(m)
    return True


def shift_oracle(x: np.ndarray, y: np.ndarray, left: bool) -> np.ndarray:
    """ONNX BitShift (opset 28): within the width W, x << y wrapped to the type and x >> y arithmetic; a shift by a
    negative y or one >= W gives 0, or -1 for a right shift of a negative x."""
    width = 8 * x.dtype.itemsize
    x64, y64 = x.astype(np.int64), y.astype(np.int64)
    x64, y64 = np.broadcast_arrays(x64, y64)
    inside = (y64 >= 0) & (y64 < width)
    s = np.clip(y64, 0, width - 1)
    if left:
        return np.where(inside, (x64 << s).astype(x.dtype), 0)
    return np.where(inside, x64 >> s, np.where(x64 < 0, -1, 0))


@SETTINGS
@given(st.data(), shapes, st.sampled_from([T.INT8, T.UINT8, T.INT16, T.UINT16, T.INT32, T.UINT32]),
       st.integers(1, 20), st.booleans())
def test_bit_shift_by_constants(d, shape, dtype, p, left):
    """Right shifts and left shifts that fit the type, by constants in and out of [0, W); a left shift that wraps
    at the declared precision is a table when few values reach it, else refused."""
    x = draw_x(d, shape, dtype, p)
    width = 8 * np.dtype(TYPES[dtype]).itemsize
    lo = -width if np.iinfo(TYPES[dtype]).min < 0 else 0
    y = np.array(d.draw(st.lists(st.integers(lo, width + 2), min_size=shape[-1], max_size=shape[-1])),
                 TYPES[dtype])
    m = model("BitShift", ["x", "s"], shape, dtype, {"s": y}, opset=28, direction="LEFT" if left else "RIGHT")
    if refused_for_its_opset(m):
        return
    try:
        graph = from_onnx(m, input_precision=p)
    except UnsupportedError as e:
        assert left and "precision bound exceeded" in str(e)
        return
    del graph
    exact(m, x, shift_oracle(x, y, left), p)


@SETTINGS
@given(st.data(), shapes, st.sampled_from([T.INT8, T.UINT8, T.INT16, T.INT32]), st.integers(1, 6), st.booleans())
def test_bit_shift_by_a_variable_amount_is_a_table(d, shape, dtype, p, left):
    """A constant x shifted by the input (|y| <= 2^(p-1)-1, few values): the table of every shift it can take."""
    y = draw_x(d, shape, dtype, p)
    x = draw_x(d, shape[-1:], dtype, 6)
    m = model("BitShift", ["c", "x"], shape, dtype, {"c": x}, opset=28, direction="LEFT" if left else "RIGHT")
    if refused_for_its_opset(m):
        return
    info = np.iinfo(TYPES[dtype])
    every = np.arange(max(info.min, -bound(p)), min(info.max, bound(p)) + 1).astype(TYPES[dtype])
    table = shift_oracle(x.reshape(-1, 1), every.reshape(1, -1), left).astype(np.int64)  # np.abs(int32 -2^31) < 0
    if np.abs(table).max() > bound(32):
        with pytest.raises(UnsupportedError, match="beyond CVM's 32 bits"):
            from_onnx(m, input_precision=p)
        return
    exact(m, y, shift_oracle(np.broadcast_to(x, shape), y, left), p)



def test_a_left_shift_table_reaching_minus_2_31_is_refused():
    """-31 << 31 wraps to -2^31 in int32, one past CVM's 32-bit bound (the property's own check once missed it:
    np.abs of an int32 -2^31 is negative)."""
    m = model("BitShift", ["c", "x"], (1,), T.INT32, {"c": np.array([-31], np.int32)}, opset=28, direction="LEFT")
    if refused_for_its_opset(m):
        return
    with pytest.raises(UnsupportedError, match="beyond CVM's 32 bits"):
        from_onnx(m, input_precision=6)

@SETTINGS
@given(st.data(), shapes, st.sampled_from([T.INT32, T.INT64]), st.integers(1, 12), st.integers(0, 7))
def test_pow_by_a_constant_exponent(d, shape, dtype, p, k):
    """Pow-15's integer types are int32 and int64 (the importer's schema check refuses the others)."""
    x = draw_x(d, shape, dtype, p)
    m = model("Pow", ["x", "k"], shape, dtype, {"k": np.array(k, TYPES[dtype])}, opset=15)
    info = np.iinfo(TYPES[dtype])
    lo, hi = max(info.min, -bound(p)), min(info.max, bound(p))
    reach = [lo ** k, hi ** k]
    if min(reach) < max(info.min, -bound(32)) or max(reach) > min(info.max, bound(32)):
        with pytest.raises(UnsupportedError, match="precision bound exceeded"):
            from_onnx(m, input_precision=p)
        return
    exact(m, x, x.astype(np.int64) ** k, p)


@SETTINGS
@given(st.data(), shapes, st.integers(1, 4))
def test_pow_by_per_element_exponents_is_a_table(d, shape, p):
    x = draw_x(d, shape, T.INT32, p)
    k = np.array(d.draw(st.lists(st.integers(0, 5), min_size=shape[-1], max_size=shape[-1])), np.int32)
    exact(model("Pow", ["x", "k"], shape, T.INT32, {"k": k}, opset=15), x, x.astype(np.int64) ** k, p)


@SETTINGS
@given(st.data(), shapes, st.sampled_from(["BitwiseAnd", "BitwiseOr", "BitwiseXor"]), st.integers(1, 8))
def test_bitwise_of_a_narrow_input_is_a_table(d, shape, op, p):
    x = draw_x(d, shape, T.INT16, p)
    c = d.draw(tensors(shape[-1:], 16)).astype(np.int16)
    fn = {"BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or, "BitwiseXor": np.bitwise_xor}[op]
    exact(model(op, ["x", "c"], shape, T.INT16, {"c": c}, opset=18), x, fn(x, c), p)


@SETTINGS
@given(st.data(), shapes, st.sampled_from([(T.INT8, T.UINT8), (T.UINT8, T.INT8), (T.INT16, T.UINT16),
                                           (T.UINT16, T.INT16)]), st.integers(1, 17))
def test_bit_cast_between_signed_and_unsigned(d, shape, types, p):
    src, dst = types
    x = draw_x(d, shape, src, p)
    exact(model("BitCast", ["x"], shape, src, out_type=dst, to=dst), x, x.view(TYPES[dst]), p)


# -- data movement --------------------------------------------------------------------------------------------------
@SETTINGS
@given(st.data(), st.lists(st.integers(1, 4), min_size=2, max_size=4).map(tuple), st.booleans(),
       st.integers(-5, 5), st.booleans())
def test_trilu(d, shape, upper, k, k_is_input):
    """A constant k (a 0/1 mask) or k as the input (a comparison): the last two axes' triangle."""
    x = draw_x(d, shape, T.INT32, 30)
    fn = np.triu if upper else np.tril
    if k_is_input:
        m = model("Trilu", ["c", "x"], (), T.INT64, {"c": x}, opset=14, out_type=T.INT32, upper=int(upper))
        exact(m, np.array(k, np.int64), fn(x, k), 4)
    else:
        m = model("Trilu", ["x", "k"], shape, T.INT32, {"k": np.array(k, np.int64)}, opset=14, upper=int(upper))
        exact(m, x, fn(x, k), 30)


def gather_nd_oracle(x: np.ndarray, idx: np.ndarray, b: int) -> np.ndarray:
    batch = x.shape[:b]
    flat_x = x.reshape((-1,) + x.shape[b:])
    flat_i = idx.reshape((int(np.prod(batch)), -1, idx.shape[-1]))
    out = [[flat_x[n][tuple(i)] for i in rows] for n, rows in enumerate(flat_i)]
    return np.array(out).reshape(idx.shape[:-1] + x.shape[b + idx.shape[-1]:])


@SETTINGS
@given(st.data(), shapes, shapes, st.integers(2, 12), st.sampled_from([T.INT32, T.INT64]))
def test_gather_of_input_indices_reads_negatives_as_onnx_does(d, data_shape, idx_shape, p, itype):
    """Gather(c, x), x the input (token ids): indices in [-dim, dim-1] as ONNX reads them, negatives from the end
    (equal to onnx's reference evaluator); beyond, where onnxruntime fails the run, as take clips the wrapped index.
    Regression: refused where the input's precision reached below 0 ("may lie outside")."""
    from onnx.reference import ReferenceEvaluator

    axis = d.draw(st.integers(-len(data_shape), len(data_shape) - 1))
    dim = data_shape[axis]
    c = d.draw(tensors(data_shape, 20))
    m = model("Gather", ["c", "x"], idx_shape, itype, {"c": c}, out_type=T.INT32, axis=axis)
    x = draw_x(d, idx_shape, itype, p)
    valid = np.clip(x, -dim, dim - 1)
    [want] = ReferenceEvaluator(m).run(None, {"x": valid})
    exact(m, valid, want, p)
    exact(m, x, np.take(c, np.clip(np.where(x < 0, x + dim, x), 0, dim - 1), axis=axis), p)


@SETTINGS
@given(st.data(), st.lists(st.integers(1, 3), min_size=2, max_size=4).map(tuple), st.booleans())
def test_gather_nd(d, shape, indices_are_input):
    b = d.draw(st.integers(0, min(1, len(shape) - 1)))
    k = d.draw(st.integers(1, len(shape) - b))
    lookups = shape[:b] + tuple(d.draw(st.lists(st.integers(1, 3), max_size=2)))
    dims = shape[b:b + k]
    idx = np.stack([np.array(d.draw(st.lists(st.integers(-n, n - 1), min_size=int(np.prod(lookups)),
                                             max_size=int(np.prod(lookups))))).reshape(lookups) for n in dims], -1)
    x = draw_x(d, shape, T.INT32, 20)
    want = gather_nd_oracle(x, idx, b)
    if indices_are_input:
        m = model("GatherND", ["c", "x"], idx.shape, T.INT64, {"c": x}, opset=13, out_type=T.INT32, batch_dims=b)
        p = min(n for n in dims).bit_length() + 1  # |i| <= 2^(p-1)-1 within [-dim, dim-1] for every dim
        if np.abs(idx).max() > bound(p) or bound(p) >= min(dims):
            with pytest.raises(UnsupportedError, match="may lie outside"):
                from_onnx(m, input_precision=p)
            return
        exact(m, idx, want, p)
    else:
        exact(model("GatherND", ["x", "i"], shape, T.INT32, {"i": idx}, opset=13, batch_dims=b), x, want, 20)


@SETTINGS
@given(st.data(), st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
       st.sampled_from(["edge", "reflect", "wrap"]))
def test_pad_edge_reflect_wrap(d, shape, mode):
    rank = len(shape)
    limit = [n - 1 if mode == "reflect" else n for n in shape]  # onnxruntime reflects at most dim - 1
    pads = [d.draw(st.integers(0, lim)) for lim in limit] + [d.draw(st.integers(0, lim)) for lim in limit]
    x = draw_x(d, shape, T.INT32, 12)
    want = np.pad(x, list(zip(pads[:rank], pads[rank:])), mode=mode)
    exact(model("Pad", ["x", "p"], shape, T.INT32, {"p": np.array(pads, np.int64)}, opset=19, mode=mode), x, want, 12)


@SETTINGS
@given(st.data(), st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple))
def test_one_hot(d, shape):
    depth = d.draw(st.integers(1, 5))
    idx = np.array(d.draw(st.lists(st.integers(-depth - 1, depth), min_size=int(np.prod(shape)),
                                   max_size=int(np.prod(shape))))).reshape(shape)
    axis = d.draw(st.integers(-len(shape) - 1, len(shape)))
    values = np.array(d.draw(st.lists(st.integers(-1000, 1000), min_size=2, max_size=2)), np.int32)
    hit = np.expand_dims(np.where(idx < 0, idx + depth, idx), axis) == np.expand_dims(
        np.arange(depth), tuple(i for i in range(len(shape) + 1) if i != axis % (len(shape) + 1)))
    want = np.where(hit, values[1], values[0])
    m = model("OneHot", ["x", "n", "v"], shape, T.INT64, {"n": np.array(depth, np.int64), "v": values}, opset=11,
              out_type=T.INT32, axis=axis)
    exact(m, idx, want, (depth + 1).bit_length() + 1)


# -- constants of a shape ---------------------------------------------------------------------------------------------
@SETTINGS
@given(st.data(), st.integers(1, 5), st.integers(1, 5), st.integers(-6, 6))
def test_eye_like_and_constant_of_shape(d, n, m_, k):
    x = draw_x(d, (n, m_), T.INT32, 8)
    graph = from_onnx(model("EyeLike", ["x"], (n, m_), T.INT32, opset=22, k=k))
    assert np.array_equal(graph.params[graph.nodes[graph.heads[0].node].name].reshape(n, m_), np.eye(n, m_, k))
    del x
    fill = d.draw(st.integers(-1000, 1000))
    cm = model("ConstantOfShape", ["s"], (1,), T.INT32, {"s": np.array([n, m_], np.int64)}, opset=21,
               value=numpy_helper.from_array(np.array([fill], np.int32)))
    cm.graph.node[0].input[0] = "s"
    graph = from_onnx(cm)
    assert np.array_equal(graph.params[graph.nodes[graph.heads[0].node].name].reshape(n, m_), np.full((n, m_), fill))


# -- reductions -----------------------------------------------------------------------------------------------------
@SETTINGS
@given(st.data(), st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple), st.booleans(),
       st.sampled_from([T.INT32, T.UINT8, T.INT8]), st.integers(1, 31))
def test_reduce_min(d, shape, keep, dtype, p):
    rank = len(shape)
    axes = d.draw(st.lists(st.integers(-rank, rank - 1), max_size=rank, unique_by=lambda a: a % rank))
    x = draw_x(d, shape, dtype, p)
    want = np.min(x, axis=tuple(axes) or None, keepdims=keep)
    m = model("ReduceMin", ["x", "a"] if axes else ["x"], shape, dtype, {"a": np.array(axes, np.int64)} if axes else {},
              opset=18, keepdims=int(keep))
    exact(m, x, want, p)


def cumulative(x: np.ndarray, axis: int, exclusive: bool, reverse: bool, fn) -> np.ndarray:
    v = np.flip(x, axis) if reverse else x
    out = fn(v.astype(np.int64), axis=axis)
    if exclusive:
        first = np.zeros_like(np.take(out, [0], axis=axis)) + (1 if fn is np.cumprod else 0)
        out = np.concatenate([first, np.take(out, range(out.shape[axis] - 1), axis=axis)], axis=axis)
    return np.flip(out, axis) if reverse else out


@SETTINGS
@given(st.data(), st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple), st.booleans(), st.booleans(),
       st.sampled_from(["CumSum", "CumProd"]))
def test_cumulative_sums_and_products(d, shape, exclusive, reverse, op):
    axis = d.draw(st.integers(-len(shape), len(shape) - 1))
    p = 20 if op == "CumSum" else 3
    x = draw_x(d, shape, T.INT32, p)
    want = cumulative(x, axis, exclusive, reverse, np.cumsum if op == "CumSum" else np.cumprod)
    m = model(op, ["x", "a"], shape, T.INT32, {"a": np.array(axis, np.int64)}, exclusive=int(exclusive),
              reverse=int(reverse))
    exact(m, x, want, p)


# -- products with a variable zero point ----------------------------------------------------------------------------
@SETTINGS
@given(st.data(), st.integers(1, 3), st.integers(1, 4), st.integers(1, 3), st.sampled_from([2, 3]), st.booleans())
def test_matmul_integer_with_a_variable_zero_point(d, m_, k, n, which, per_axis):
    a = draw_x(d, (m_, k), T.UINT8, 9)
    b = draw_x(d, (k, n), T.UINT8, 9)
    per_axis &= which == 3  # onnx's reference MatMulInteger cannot evaluate a per-row a_zero_point (M,)
    size = n if per_axis else 1
    z = draw_x(d, (size,) if per_axis else (), T.UINT8, 9)
    other = np.array(d.draw(st.integers(0, 255)), np.uint8)
    za, zb = (z, other) if which == 2 else (other, z)
    want = (a.astype(np.int64) - za.reshape(-1, 1) if which == 2 and per_axis else a.astype(np.int64) - za) @ (
        b.astype(np.int64) - zb)
    ins = ["a", "b", "x", "zb"] if which == 2 else ["a", "b", "za", "x"]
    m = model("MatMulInteger", ins, z.shape, T.UINT8, {"a": a, "b": b, "za": other, "zb": other}, opset=10,
              out_type=T.INT32)
    exact(m, z, want, 9)


@SETTINGS
@given(st.data(), st.integers(1, 2), st.integers(1, 2), st.integers(0, 1), st.booleans())
def test_conv_integer_with_a_variable_zero_point(d, c, oc, pad, of_weights):
    """The zero point of the data or of the weights (scalars: onnxruntime's ConvInteger, the oracle, takes no
    other) as the input."""
    x = draw_x(d, (1, c, 3, 3), T.UINT8, 9)
    w = draw_x(d, (oc, c, 2, 2), T.UINT8, 9)
    z = draw_x(d, (), T.UINT8, 9)
    ins = ["c", "w", "xz", "x"] if of_weights else ["c", "w", "x"]
    m = model("ConvInteger", ins, z.shape, T.UINT8, {"c": x, "w": w, "xz": np.array(0, np.uint8)}, opset=10,
              out_type=T.INT32, pads=[pad] * 4)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    exact(m, z, sess.run(None, {"x": z})[0], 9)


@pytest.mark.parametrize("op, ins, shape, x_type, inits, attrs", [
    ("OneHot", ["x", "n", "v"], (2,), T.INT64, {"n": np.array(1 << 40, np.int64), "v": np.array([0, 1], np.int32)}, {}),
    ("OneHot", ["x", "n", "v"], (2,), T.INT64, {"n": np.array(3, np.int64), "v": np.array([0, 1, 2], np.int32)}, {}),
    ("Pad", ["x", "p"], (2,), T.INT32, {"p": np.array([1 << 40, 0], np.int64)}, {"mode": "edge"}),
    ("GatherND", ["x", "i"], (2, 2), T.INT32, {"i": np.array(0, np.int64)}, {}),
    ("EyeLike", ["x"], (2, 2), T.INT32, {}, {"dtype": T.STRING}),
    ("CumProd", ["x", "a"], (2000,), T.INT32, {"a": np.array(0, np.int64)}, {}),
])
def test_hostile_attributes_and_shapes_are_refused_clearly(op, ins, shape, x_type, inits, attrs):
    """A huge depth or pad, indices of no rank, a string EyeLike, a long CumProd: one clear refusal each, before
    anything large is allocated or built."""
    with pytest.raises(UnsupportedError) as e:
        from_onnx(model(op, ins, shape, x_type, inits, opset=26, out_type=T.INT32, **attrs))
    assert [p.where for p in e.value.problems] == [f"{op.lower()} ({op})"]


def test_uint64_constants_past_int64_fold_exactly():
    """Regression: Div and Mod folded uint64 constants cast to int64, so 2^64 - 2 became -2 ((2^64 - 2) / (2^63 - 1)
    gave 0, not 2); the negation in Min and a table's entries are refused past 32 bits, never wrapped."""
    for op, a, b, want in [("Div", (1 << 64) - 2, (1 << 63) - 1, 2), ("Mod", (1 << 64) - 3, 5, 3)]:
        m = model(op, ["a", "b"], (1,), T.UINT64, {"a": np.array([a], np.uint64), "b": np.array([b], np.uint64)})
        graph = from_onnx(m)
        assert graph.params[graph.nodes[graph.heads[0].node].name].reshape(-1).tolist() == [want], op
    big = np.array([(1 << 64) - 1], np.uint64)
    with pytest.raises(UnsupportedError, match="values may reach"):
        from_onnx(model("Min", ["x", "a"], (1,), T.UINT64, {"a": big}))
    with pytest.raises(UnsupportedError, match="beyond CVM's 32 bits"):
        from_onnx(model("BitwiseOr", ["x", "a"], (1,), T.UINT64, {"a": big}, opset=18), input_precision=2)
