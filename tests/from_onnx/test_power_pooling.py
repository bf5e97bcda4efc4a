"""GeM pooling and p-norms (docs/import.md, "Roots of wide exact sums"): Pow(ReduceMean(Pow(x, p)), 1/p) and its
spellings, the p-th root of the exact mean or sum of p-th powers, whose integers pass a table's 2^16, requantized
exactly: round((s^p S / n)^(1/p) / s_y) + z_y, S = sum u^p an exact integer."""
from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np
import onnx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.gem import gem
from support.l2norm import NP
from support.quantized import ort_session, per_channel_output, qdq
from test_quantized_rules import imported

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.from_onnx.quantized import l2norm
from cvm_onnx.core.errors import CVMError
from cvm_onnx.core.format.onnx_file import onnx_model

RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255), T.INT16: (-32768, 32767)}
REDUCE = ("mean", "sum", "global", "whole")  # ReduceMean, ReduceSum, GlobalAveragePool, AveragePool of the image


def iroot(v: int, p: int) -> int:
    """floor(v^(1/p)) of an integer v >= 0, exactly."""
    k = int(round(v ** (1 / p))) if v < 1 << 1000 else 1 << (v.bit_length() // p)
    while k ** p > v:
        k -= 1
    while (k + 1) ** p <= v:
        k += 1
    return k


def exact_gem(u: np.ndarray, p: int, mean: bool, keep: bool, c: Fraction, zo: int, lo: int, hi: int) -> np.ndarray:
    """clip(round(c (S / n)^(1/p)) + zo, lo, hi), S = sum u^p over the last two axes (n values; S / n where
    ``mean``), rounding half to even, in rationals: X = c^p S (/ n), k = floor(X^(1/p)) = iroot(floor(X)), then X
    against (k + 1/2)^p."""
    n = u.shape[2] * u.shape[3]
    total = (u.astype(object) ** p).sum(axis=(2, 3), keepdims=keep)

    def one(v) -> int:
        x = c ** p * int(v) / (n if mean else 1)
        k = iroot(math.floor(x), p)
        half = Fraction(2 * k + 1, 2) ** p
        if x > half or (x == half and k % 2 == 1):
            k += 1
        return min(max(k + zo, lo), hi)

    return np.vectorize(one, otypes=[np.int64])(total)


def check(p, x_type, zx, s, shape, reduce, root, out, clip, keep, x):
    """The import's integers equal the exact oracle's on x (a float output at the importer's int16 grid), and
    each unsaturated output lies within half a step of the root in float64."""
    m = gem(p, x_type, zx, s, shape, reduce, root, out, clip, keep)
    imp, got = imported(m, x)
    if out is None:
        so, zo, (lo, hi) = Fraction(float(imp.edges.outputs[0].scale)), 0, RANGE[T.INT16]
    else:
        so, zo, (lo, hi) = Fraction(float(np.float32(out[0]))), out[1], RANGE[out[2]]
    u = x - zx
    sx = Fraction(float(np.float32(s)))
    if clip is not None:  # the Clip's QuantizeLinear: max(u s, eps) at s_c (eps below half a step: 0 there)
        sc = Fraction(float(np.float32(clip[1])))
        u = np.vectorize(lambda v: max(round(v * sx / sc), 0), otypes=[object])(u.astype(object))
        sx = sc
    keep = keep or reduce in ("global", "whole")
    want = exact_gem(u, p, reduce != "sum", keep, sx / so, zo, lo, hi)
    assert got.shape == want.shape and np.array_equal(got, want), (got, want)
    n = 1 if reduce == "sum" else shape[2] * shape[3]
    value = (float(sx) ** p * (u.astype(np.float64) ** p).sum(axis=(2, 3), keepdims=keep) / n) ** (1 / p)
    inside = (got > lo) & (got < hi)
    assert (np.abs((got - zo) * float(so) - value)[inside] <= float(so) * (0.5 + 1e-9)).all()
    return got


@st.composite
def cases(draw):
    p = draw(st.sampled_from([2, 3, 4]))
    x_type = T.INT8 if p == 4 else draw(st.sampled_from([T.UINT8, T.INT8]))
    lo, hi = RANGE[x_type]
    # u = x - zx >= 0 for an odd p (zx at the bottom); p = 4: int8 about 0 over at most 3 values (32-bit labels)
    zx = lo if p == 3 else 0 if p == 4 else draw(st.sampled_from([lo, hi, (lo + hi + 1) // 2]) | st.integers(lo, hi))
    h_w = draw(st.sampled_from([(1, 3), (3, 1), (1, 1)])) if p == 4 else \
        draw(st.sampled_from([(7, 7), (1, 2)]) | st.tuples(st.integers(1, 8), st.integers(1, 8)))
    if p != 4 and h_w[0] * h_w[1] * max(hi - zx, zx - lo) ** p < 1 << 16:  # a table over the sum: not this rule's
        h_w = (8, 8)
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), *h_w)
    reduce = draw(st.sampled_from(REDUCE))
    root = draw(st.sampled_from(["pow", "sqrt"])) if p == 2 else "pow"
    keep = draw(st.sampled_from([0, 1])) if reduce in ("mean", "sum") else 1
    s = float(np.float32(draw(st.sampled_from([0.05, 0.0039, 0.7]) | st.floats(1e-3, 1.0))))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.integers(lo, hi + 1, size=shape)
    if draw(st.booleans()):  # rows at an extreme: the largest S
        x[0, 0] = lo if zx > (lo + hi) // 2 or p == 4 else hi
    x.flat[-1] = zx  # a 0 inside
    out = draw(st.sampled_from([None, (0.05, 0, T.UINT8), (1.0, -128, T.INT8)]) |
               st.tuples(st.floats(1e-3, 2.0), st.integers(-20, 20), st.sampled_from([T.INT8, T.UINT8]))
               .map(lambda o: (o[0], o[1] + (128 if o[2] == T.UINT8 else 0), o[2])))
    return p, x_type, zx, s, shape, reduce, root, out, None, keep, x


@settings(max_examples=40, deadline=None)
@given(cases())
@example((3, T.UINT8, 0, 0.02, (1, 2, 7, 7), "mean", "pow", (0.05, 0, T.UINT8), None, 1,
          np.array([[[[255] * 7] * 7, [[0] * 7] * 7]])))
@example((2, T.INT8, 5, 0.7, (1, 1, 2, 2), "sum", "sqrt", (2.0, 0, T.UINT8), None, 0,
          np.array([[[[-128, 127], [5, -128]]]])))
@example((4, T.INT8, 0, 0.05, (1, 1, 1, 3), "whole", "pow", None, None, 1, np.array([[[[-128] * 3]]])))
def test_gem_is_exact(case):
    """Every output equals round((s^p S / n)^(1/p) / s_y) + z_y (half to even, saturated), computed in rationals,
    for p = 2, 3, 4, each reduction (ReduceMean, ReduceSum keepdims either way, GlobalAveragePool, AveragePool of
    the whole image), Pow(1/p) or Sqrt, int8 and uint8 x, quantized and float outputs, extremes (the largest S, 0);
    within half a step of the float64 root (refused before: "Pow over N integers: a table of at most 2^16
    entries")."""
    check(*case)


def test_exact_at_ties():
    """(s^p S)^(1/p) / s_y exactly a half-integer (s = 1/2, s_y = 1: S = 3^p, 5^p, 7^p give 1.5, 2.5, 3.5): half to
    even, for the square and the cube root."""
    for p in (2, 3):
        x = np.zeros((4, 1, 1, 2), np.int64)
        x[:3, 0, 0, 0] = 3, 5, 7
        got = check(p, T.UINT8, 0, 0.5, (4, 1, 1, 2), "sum", "pow", (1.0, 0, T.UINT8), None, 0, x)
        assert got.reshape(-1).tolist() == [2, 2, 4, 0]


def test_clip_before_the_power():
    """SSCD's GeM: Clip(x, 1e-6) quantized by quantize_static (int8 and uint8), Pow 3, ReduceMean over 7 x 7 (the
    mean of cubes over 812487376 integers), Pow(0.33333334)."""
    rng = np.random.default_rng(3)
    for c_type, zx in ((T.UINT8, 0), (T.INT8, 0)):
        x = rng.integers(-40, 128, (2, 3, 7, 7))
        x[0, 0] = 127
        check(3, T.INT8, zx, 0.02, (2, 3, 7, 7), "mean", "pow", (0.05, 0, T.UINT8), (1e-6, 0.02, c_type), 1, x)


def test_agrees_with_onnxruntime():
    """The QDQ model of SSCD's GeM: the same integers as onnxruntime's float root between the QDQ pairs, but for a
    float32 rounding at a tie."""
    rng = np.random.default_rng(4)
    m = gem(3, T.UINT8, 0, 0.02, (4, 8, 7, 7), out=(0.05, 0, T.UINT8))
    x = rng.integers(0, 256, (4, 8, 7, 7))
    _, got = imported(m, x)
    [want] = ort_session(m).run(None, {"x": x.astype(np.uint8)})
    assert np.abs(got - want.astype(np.int64)).max() <= 1
    assert np.mean(got == want) > 0.99


def test_refusals_name_the_node(monkeypatch):
    """One line naming the node and the rule: an exponent that is no 1/p (a p that is not an integer), an exponent
    computed at run time, a root of a value reaching below 0 (the cubes of int8 x), a per-channel output scale, a
    bucket holding more output steps than ``MAX_INNER``."""
    m = gem(3, T.UINT8, 0, 0.02, (1, 1, 7, 7))
    next(t for t in m.graph.initializer if t.name == "r").CopyFrom(nh.from_array(np.float32(0.4), "r"))
    with pytest.raises(CVMError, match=r"gem \(Pow\): Pow by 0.400000006 of a value over 812487376 integers: a table "
                                       r"holds at most 2\^16 entries and a root \(the exponent 1/p, p an integer "
                                       r"2..16\) has a CVM form"):
        import_model(m, input_precision=9)
    m = gem(3, T.UINT8, 0, 0.02, (1, 1, 7, 7))
    root = next(n for n in m.graph.node if n.name == "gem")
    m.graph.node.insert(3, h.make_node("ReduceMax", ["xf"], ["e"], keepdims=0))
    root.input[1] = "e"
    with pytest.raises(CVMError, match=r"gem \(Pow\): Pow of two values over 812487376 x 256 integers: a table of "
                                       r"at most 2\^16 entries has a CVM form"):
        import_model(m, input_precision=9)
    with pytest.raises(CVMError, match=r"gem \(Pow\): Pow\(\., 1/3\) of a value over 203131216 integers reaching "
                                       r"below 0 is undefined \(NaN\) there"):
        import_model(gem(3, T.INT8, 0, 0.02, (1, 1, 7, 7)), input_precision=9)
    m = gem(3, T.UINT8, 0, 0.02, (1, 2, 7, 7))
    per_channel_output(m, 0.05, 2, 1)
    with pytest.raises(CVMError, match=r"gem \(Pow\(\., 1/3\)\) with a per-channel output scale has no CVM form"):
        import_model(m, input_precision=9)
    monkeypatch.setattr(l2norm, "MAX_INNER", 0)
    with pytest.raises(CVMError, match=r"gem \(Pow\(\., 1/3\)\): its output takes 1 steps within one bucket of its "
                                       r"input \(at most 0\)"):
        import_model(gem(3, T.UINT8, 0, 0.02, (1, 1, 7, 7)), input_precision=9)


def gem_float(p: float, learned: bool, reduce: str) -> onnx.ModelProto:
    """A float CNN ending in GeM as torch exports it: Conv, Relu, Clip(min 1e-6), Pow(p), the reduction over H, W,
    Pow(1 / p); ``learned``: timm's GeM, p an initializer of shape (1,) and its reciprocal Div(1, p)."""
    rng = np.random.default_rng(5)
    node = h.make_node
    inits = [nh.from_array(rng.normal(0, 0.5, (8, 4, 1, 1)).astype(np.float32), "w"),
             nh.from_array(np.float32(1e-6), "eps"), nh.from_array(np.array([p] if learned else p, np.float32), "p"),
             nh.from_array(np.array([2, 3], np.int64), "axes")]
    nodes = [node("Conv", ["x", "w"], ["c"]), node("Relu", ["c"], ["r"]), node("Clip", ["r", "eps"], ["cl"]),
             node("Pow", ["cl", "p"], ["pw"])]
    nodes.append(node("ReduceMean", ["pw", "axes"], ["m"], keepdims=1) if reduce == "mean" else
                 node("AveragePool", ["pw"], ["m"], kernel_shape=[6, 6]))
    if learned:
        inits.append(nh.from_array(np.float32(1), "one"))
        nodes.append(node("Div", ["one", "p"], ["inv"]))
    else:
        inits.append(nh.from_array(np.float32(1 / p), "inv"))
    nodes.append(node("Pow", ["m", "inv"], ["y"], name="gem"))
    g = h.make_graph(nodes, "gem", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 6, 6])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 8, 1, 1])], inits)
    return onnx_model(g, 18, {})


@pytest.mark.parametrize("learned, reduce", [(True, "mean"), (False, "whole")])
def test_quantize_gem(tmp_path, learned, reduce):
    """torch's GeM (F.avg_pool2d of the whole image) and timm's (a learned p = 3 as a (1,) initializer, Div(1, p))
    through `quantize`: whole, within 1.1x onnxruntime's quantized model's distance from float."""
    onnx.save(gem_float(3.0, learned, reduce), tmp_path / "f.onnx")
    np.save(tmp_path / "cal.npy", np.random.default_rng(6).normal(size=(8, 1, 4, 6, 6)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "cal.npy", tmp_path / "cvm")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()


def test_quantize_refuses_a_fractional_p(tmp_path):
    """timm's GeM with a learned p = 2.5: the root of its mean, past a table, refused in one line naming the node."""
    onnx.save(gem_float(2.5, True, "mean"), tmp_path / "f.onnx")
    np.save(tmp_path / "cal.npy", np.random.default_rng(6).normal(size=(8, 1, 4, 6, 6)).astype(np.float32))
    with pytest.raises(CVMError, match=r"gem \(Pow\): Pow by 0.400000006 of a value over \d+ integers"):
        quantize(tmp_path / "f.onnx", tmp_path / "cal.npy", tmp_path / "cvm")


def reduced_qdq(op: str, x_type, zx: int, s: float, shape, axes, keep, out):
    """DequantizeLinear(x at s, zx) -> ``op`` over ``axes`` (opset 18: axes as an input; "ReduceSumPow": ReduceSum
    of Pow(x, 2)) -> QuantizeLinear at ``out`` = (s_y, z_y, type)."""
    node = h.make_node
    inits = dict(s=np.float32(s), zx=NP[x_type](zx), axes=np.array(axes, np.int64), two=np.float32(2),
                 so=np.float32(out[0]), zo=NP[out[2]](out[1]))
    nodes = [node("DequantizeLinear", ["x", "s", "zx"], ["xf"])]
    if op == "ReduceSumPow":
        nodes += [node("Pow", ["xf", "two"], ["sq"]), node("ReduceSum", ["sq", "axes"], ["r"], keepdims=keep)]
    else:
        nodes.append(node(op, ["xf", "axes"], ["r"], keepdims=keep))
    nodes.append(node("QuantizeLinear", ["r", "so", "zo"], ["y"]))
    return qdq(nodes, shape, x_type, {k: v for k, v in inits.items() if op == "ReduceSumPow" or k != "two"}, out[2],
               opset=18)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["ReduceL1", "ReduceSumSquare"]), st.sampled_from([T.INT8, T.UINT8]), st.integers(0, 255),
       st.lists(st.integers(1, 5), min_size=1, max_size=3), st.integers(0, 2), st.sampled_from([0, 1]),
       st.floats(1e-3, 1.0), st.integers(0, 2**16))
def test_reduce_l1_and_sum_square(op, x_type, zx, shape, first, keep, s_y, seed):
    """ReduceL1 and ReduceSumSquare of a dequantized x (refused before: no rule): the exact sum of |u| at s or of u^2
    at s^2. At s_y = s (s^2) the output is that sum itself, saturated; at any s_y ReduceSumSquare gives the integers
    of ReduceSum(Pow(x, 2)), one exact value requantized alike."""
    lo, hi = RANGE[x_type]
    zx = lo + zx % (hi - lo + 1)
    axes = list(range(min(first, len(shape) - 1), len(shape)))
    x = np.random.default_rng(seed).integers(lo, hi + 1, shape)
    s = 0.5
    unit = s if op == "ReduceL1" else s * s
    _, got = imported(reduced_qdq(op, x_type, zx, s, tuple(shape), axes, keep, (unit, 0, T.INT16)), x)
    u = (x - zx).astype(np.int64)
    total = (np.abs(u) if op == "ReduceL1" else u * u).sum(axis=tuple(axes), keepdims=bool(keep))
    want = np.clip(total, -32768, 32767).reshape(got.shape)
    assert np.array_equal(got, want)
    if op == "ReduceSumSquare":
        out = (s_y, 0, T.UINT8)
        _, got = imported(reduced_qdq(op, x_type, zx, s, tuple(shape), axes, keep, out), x)
        _, same = imported(reduced_qdq("ReduceSumPow", x_type, zx, s, tuple(shape), axes, keep, out), x)
        assert np.array_equal(got, same)


@pytest.mark.parametrize("reduce", ["mean", "global"])
def test_an_average_of_a_power_infinite_at_zero_is_refused_naming_the_node(reduce):
    """GeM with p = -1 after its Clip's QuantizeLinear (which reads eps = 1e-6 as 0): Pow(0, -1) = inf, so the float
    model's average is inf and its output saturates; refused in one line naming the average. Regression: the inf
    taken as the int16 table's largest value, a finite average (41 and 45 where onnxruntime gives 255)."""
    m = gem(-1, T.INT8, 0, 0.05, (1, 2, 5, 5), reduce, clip=(1e-6, 0.05, T.UINT8))
    with pytest.raises(CVMError) as e:
        import_model(m, input_precision=8)
    assert len(e.value.problems) == 1 and "\n" not in str(e.value), e.value
    assert re.search(r"(ReduceMean|GlobalAveragePool).*: the average of Pow, which is infinite or NaN at "
                     r"its input's integers \[0\]", str(e.value)), e.value
