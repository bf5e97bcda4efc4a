"""The L2 norm as a value (docs/import.md, "The L2 norm as a value"): ReduceL2 and its written-out forms of a
dequantized x, requantized exactly: round(s sqrt(S) / s_y) + z_y, S = sum u^2 an exact integer."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.l2value import FORMS, compressed_qdq, norm_nodes, norm_qdq
from support.quantized import per_channel_output
from test_quantized_rules import imported, ort_session

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.from_onnx.quantized import l2norm
from cvm_onnx.core.errors import CVMError
from cvm_onnx.core.format.onnx_file import onnx_model

RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255), T.INT16: (-32768, 32767)}


def exact_norm(u: np.ndarray, axes, keep, c: Fraction, zo: int, lo: int, hi: int) -> np.ndarray:
    """clip(round(c sqrt(S)) + zo, lo, hi), S = sum u^2 over ``axes``, rounding half to even, in rationals:
    w = c^2 S = p / q, k = floor(sqrt(w)) = isqrt(p q) // q, then w against (k + 1/2)^2."""
    total = (u.astype(object) ** 2).sum(axis=tuple(axes), keepdims=bool(keep))

    def one(v) -> int:
        w = c * c * int(v)
        k = math.isqrt(w.numerator * w.denominator) // w.denominator
        half = Fraction(2 * k + 1, 2) ** 2
        if w > half or (w == half and k % 2 == 1):
            k += 1
        return min(max(k + zo, lo), hi)

    return np.vectorize(one, otypes=[np.int64])(total)


@st.composite
def cases(draw):
    form = draw(st.sampled_from(sorted(FORMS)))
    rank = draw(st.sampled_from([1, 2, 3]))
    shape = [draw(st.integers(1, 3)) for _ in range(rank)]
    first = draw(st.integers(0, rank - 1))
    last = draw(st.integers(first, rank - 1))
    axes = list(range(first, last + 1))
    n = draw(st.sampled_from([1, 2, 3, 64, 300]) | st.integers(1, 40))
    shape[first] = n
    keep = draw(st.sampled_from([0, 1]))
    x_type = draw(st.sampled_from([T.UINT8, T.INT8]))
    lo, hi = RANGE[x_type]
    zx = draw(st.sampled_from([lo, hi, (lo + hi + 1) // 2]) | st.integers(lo, hi))
    s = float(np.float32(draw(st.sampled_from([0.05, 0.0039, 0.7]) | st.floats(1e-3, 1.0))))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.integers(lo, hi + 1, size=shape)
    if draw(st.booleans()):  # rows at an extreme: the largest S
        x = np.full(shape, lo if zx > (lo + hi) // 2 else hi)
    x.flat[0] = zx
    out = draw(st.sampled_from([None, (0.05, 0, T.UINT8), (1.0, -128, T.INT8)]) |
               st.tuples(st.floats(1e-3, 2.0), st.integers(-20, 20), st.sampled_from([T.INT8, T.UINT8]))
               .map(lambda o: (o[0], o[1] + (128 if o[2] == T.UINT8 else 0), o[2])))
    return form, tuple(shape), axes, keep, x_type, s, zx, out, x


def check(form, shape, axes, keep, x_type, s, zx, out, x):
    """The import's integers equal the exact oracle's on x (a float output at the importer's int16 grid)."""
    m = norm_qdq(form, shape, axes, keep, x_type, s, zx, out)
    imp, got = imported(m, x)
    if out is None:
        edge = imp.edges.outputs[0]
        so, zo, (lo, hi) = Fraction(float(edge.scale)), 0, RANGE[T.INT16]
    else:
        so, zo, (lo, hi) = Fraction(float(np.float32(out[0]))), out[1], RANGE[out[2]]
    want = exact_norm(x - zx, axes, keep, Fraction(float(np.float32(s))) / so, zo, lo, hi)
    if want.ndim == 0:  # CVM holds a scalar as shape (1,)
        want = want.reshape(1)
    assert got.shape == want.shape and np.array_equal(got, want), (got, want)
    return imp


@settings(max_examples=40, deadline=None)
@given(cases())
@example(("abs", (2, 2), [1], 1, T.UINT8, 0.01, 128, (0.01, 0, T.UINT8), np.array([[128, 131], [0, 255]])))
@example(("pow", (3, 300), [1], 0, T.UINT8, 0.039, 0, None, np.array([[0] * 300, [255] * 300, [1] * 300])))
def test_norm_is_exact(case):
    """Every output equals round(s sqrt(S) / s_y) + z_y (half to even, saturated), computed in rationals, for
    each form, keepdims either way, a table over S (S < 2^16) or a count of thresholds (wide rows)."""
    check(*case)


def test_exact_at_ties():
    """s sqrt(S) / s_y exactly a half-integer (S = 9, 25, 49 at c = 1/2: 1.5, 2.5, 3.5): half to even."""
    x = np.array([[3, 0], [5, 0], [7, 0], [0, 0]])
    imp = check("reducel2", (4, 2), [1], 0, T.INT8, 0.5, 0, (1.0, 0, T.INT8), x)
    got = imported(norm_qdq("reducel2", (4, 2), [1], 0, T.INT8, 0.5, 0, (1.0, 0, T.INT8)), x)[1]
    assert got.tolist() == [2, 2, 4, 0] and imp.graph is not None


@pytest.mark.parametrize("form", sorted(FORMS))
def test_each_form_agrees_with_onnxruntime(form):
    """Each form in a QDQ model (a complex pair on the last axis, uint8 in and out; every form refused before): the
    same integers as onnxruntime's float norm between them, but for a float32 rounding at a tie."""
    rng = np.random.default_rng(1)
    shape = (3, 40, 2)
    m = norm_qdq(form, shape, [2], 1, T.UINT8, 0.03, 128, (0.03, 0, T.UINT8))
    x = rng.integers(0, 256, shape)
    x[0, 0] = 128
    _, got = imported(m, x)
    [want] = ort_session(m).run(None, {"x": x.astype(np.uint8)})
    assert np.abs(got - want.astype(np.int64)).max() <= 1
    assert np.mean(got == want) > 0.99


def row_of(total: int, n: int) -> np.ndarray:
    """n int8 values whose squares sum to ``total`` exactly (greedy: each the largest square left, at most 127)."""
    row = np.zeros(n, np.int64)
    for i in range(n):
        row[i] = min(math.isqrt(total), 127)
        total -= int(row[i]) ** 2
    assert total == 0
    return row


def test_wide_rows():
    """Rows of 300 int8 values (S up to 4.9 million, past a 2^16 table: T = 13, 5 levels) to uint8 and int16
    outputs and a float output: the output's thresholds at S's level and bucket, exact; S at the levels' edges
    (2^13 4^m - 1 and 2^13 4^m), the largest S and 0."""
    rng = np.random.default_rng(2)
    x = rng.integers(-128, 128, (10, 300))
    x[0], x[1] = -128, 0
    for row, total in zip(range(2, 10), (8191, 8192, 32767, 32768, 131071, 131072, 2097151, 2097152)):
        x[row] = row_of(total, 300)
    for out in ((0.2, 0, T.UINT8), (0.001, 0, T.INT16), None):
        check("sumsquare", (10, 300), [1], 0, T.INT8, 0.02, 0, out, x)


def test_refusals_name_the_node(monkeypatch):
    """A per-channel output scale; a bucket of a wide S holding more output thresholds than ``MAX_INNER`` (made 1
    here: an int16 output's steps over 300 int8 values put 8 in one bucket); a function of S past 2^22 values, or
    past 2^16 and not monotone (sin^2): one line naming the node and the rule."""
    x = np.full((1, 300), 127)
    monkeypatch.setattr(l2norm, "MAX_INNER", 1)
    with pytest.raises(CVMError, match=r"n_norm \(L2 norm\): its output takes 8 steps within one bucket of its sum "
                                       r"of squares \(at most 1\)"):
        check("sumsquare", (1, 300), [1], 0, T.INT8, 0.02, 0, (0.001, 0, T.INT16), x)
    monkeypatch.undo()
    m = compressed_qdq((2, 300), 0.03, 128, 1e-5, 0.3, (0.05, 0, T.UINT8))
    with pytest.raises(CVMError, match=r"n_norm \(Pow\(Clip\(L2 norm\)\)\): a function of an L2 norm whose sum "
                                       r"of squares takes 4915201 values \(at most 2\^22\)"):
        import_model(m, input_precision=9)
    m = compressed_qdq((2, 2), 0.03, 0, 1e-5, 2.0, (0.05, 0, T.UINT8))
    clip = next(n for n in m.graph.node if n.op_type == "Clip")
    clip.op_type, clip.input[1:] = "Sin", []
    with pytest.raises(CVMError, match=r"n_norm \(Pow\(Sin\(L2 norm\)\)\) over a sum of squares of 130051 values "
                                       r"\(a table holds at most 2\^16\) is not monotone in it"):
        import_model(m, input_precision=9)
    m = norm_qdq("reducel2", (2, 4), [1], 0, T.INT8, 0.5, 0, (0.01, 0, T.UINT8))
    per_channel_output(m, 0.01, 2, 0)
    with pytest.raises(CVMError, match=r"n_norm \(L2 norm\) with a per-channel output scale has no CVM form"):
        import_model(m, input_precision=9)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([-0.7, 0.3, 0.5, 2.0, -1.0]) | st.floats(-2.0, 2.0), st.sampled_from([1e-5, 1e-12, 0.1]),
       st.floats(1e-3, 0.5), st.sampled_from([0, 128, 255]) | st.integers(0, 255),
       st.sampled_from([(0.05, 0, T.UINT8), (0.01, -128, T.INT8)]) |
       st.tuples(st.floats(1e-3, 1.0), st.integers(-128, 127), st.just(T.INT8)), st.integers(0, 2**16))
@example(-0.7, 1e-5, 0.03, 128, (0.05, 0, T.UINT8), 5)
@example(0.3, 1e-5, 0.03, 128, (0.01, -128, T.INT8), 5)
@example(-0.7, 1e-5, 0.03, 0, (0.05, 0, T.UINT8), 5)  # S up to 130050: monotone steps at its level and bucket
@example(0.5, 1e-5, 0.5, 255, (0.01, -128, T.INT8), 6)
def test_a_function_of_the_norm(power, eps, s, zx, out, seed):
    """Clip(min eps) and Pow after the norm (refused before: "the Clip input (L2 norm) must be quantized first"):
    round(max(s sqrt(S), eps)^power / s_y) + z_y (float64, half to even, saturated) for every S, a table over S or
    (S past 2^16 values, an uncentred uint8 pair) its monotone steps at S's level and bucket; the same integers as
    onnxruntime's model but for float32 rounding at a tie; a zero pair (S = 0) and extremes included."""
    shape = (4, 50, 2)
    m = compressed_qdq(shape, s, zx, eps, power, out)
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, shape)
    x[0, :3] = zx
    x[1, 0] = 255, 255
    x[1, 1] = 0, 0
    _, got = imported(m, x)
    total = ((x - zx) ** 2).sum(axis=2, keepdims=True)
    lo, hi = RANGE[out[2]]
    value = np.power(np.maximum(np.sqrt(total.astype(np.float64)) * float(np.float32(s)), float(np.float32(eps))),
                     float(np.float32(power)))
    want = np.clip(np.rint(value / float(np.float32(out[0]))) + out[1], lo, hi).astype(np.int64)
    assert np.array_equal(got, want)
    [ort] = ort_session(m).run(None, {"x": x.astype(np.uint8)})
    assert np.abs(got - ort.astype(np.int64)).max() <= 1


def norm_float(form: str, seed: int = 0):
    """A float model: x (1, 4, 6) -> MatMul (6 -> 2: a complex pair) -> the norm over the pair -> Mul by 3 (which
    quantize_static quantizes) -> the output."""
    rng = np.random.default_rng(seed)
    nodes, inits = norm_nodes(form, "h", "n", [2], 1)
    nodes = [h.make_node("MatMul", ["x", "w"], ["h"]), *nodes, h.make_node("Mul", ["n", "k"], ["y"])]
    inits.update(w=rng.normal(size=(6, 2)).astype(np.float32), k=np.float32(3))
    g = h.make_graph(nodes, "normf", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 6])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 1])],
                     [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    return onnx_model(g, 18, {})


@pytest.mark.parametrize("form", sorted(FORMS))
def test_quantize_takes_each_form(tmp_path, form):
    """`quantize` of a float model computing a magnitude: it imports whole (every form refused before), the norm's
    nodes left float, and CVM's output as close to the float model as onnxruntime's quantized model's (within a
    quarter step on average)."""
    onnx.save(norm_float(form), tmp_path / "f.onnx")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "cal.npy", rng.normal(size=(8, 1, 4, 6)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "cal.npy", tmp_path / "cvm")
    q = onnx.load_from_string(done.onnx_model)
    quantized = {i for n in q.graph.node if n.op_type == "QuantizeLinear" for i in n.input}
    assert not quantized & {"n_a", "n_p", "n_s"}
    [a] = done.agreements
    assert a.mean_steps <= a.ort_mean_steps + 0.25, (a.mean_steps, a.ort_mean_steps)
