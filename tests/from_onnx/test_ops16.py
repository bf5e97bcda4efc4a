"""Op classes of shipped models the quantized import refused before, of dequantized values: Resize with antialias
(torchvision's resize(antialias=True), image processors exported with their model) and cubic Resize with
exclude_outside."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import Oracle, between_convs, qdq, quantizes_whole
from test_quantized_fresh_ops import NP, RANGE, cubic_coefficients, run

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import CVMError
from cvm_onnx.core.format.onnx_file import onnx_model

MODES = ["half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners"]


# -- Resize with antialias, cubic Resize with exclude_outside --------------------------------------------------------
def coordinate(mode: str, k: int, n: int, o: int, f: Fraction) -> Fraction:
    """The input coordinate of output k of an axis of n resized to o at scale f (ONNX's coordinate modes)."""
    if mode == "align_corners":
        return Fraction(k * (n - 1), o - 1) if o > 1 else Fraction(0)
    if mode == "asymmetric":
        return k / f
    if mode == "pytorch_half_pixel" and o == 1:
        return Fraction(0)
    return (k + Fraction(1, 2)) / f - Fraction(1, 2)


def antialias_taps(n: int, o: int, f: Fraction, mode: str, a: Fraction | None, exclude: bool) -> list:
    """[(input index, weight)] per output of onnxruntime's antialiased Resize, in exact rationals: the filter
    (linear 1 - |v|, or the cubic kernel of A) at v = (j - c) min(f, 1) over every j with a nonzero value, each
    divided by their sum; exclude_outside drops the j outside [0, n) first, else their weights go to the border."""
    g = min(f, Fraction(1))

    def kernel(v: Fraction) -> Fraction:
        v = abs(v)
        if a is None:
            return max(1 - v, Fraction(0))
        if v < 1:
            return ((a + 2) * v - (a + 3)) * v * v + 1
        return (((v - 5) * v + 8) * v - 4) * a if v < 2 else Fraction(0)

    reach = (1 if a is None else 2) / g
    out = []
    for k in range(o):
        c = coordinate(mode, k, n, o, f)
        taps = [(j, kernel((j - c) * g)) for j in range(math.floor(c - reach), math.ceil(c + reach) + 1)]
        taps = [(j, w) for j, w in taps if w and (0 <= j < n or not exclude)]
        total = sum(w for _, w in taps)
        out.append([(min(max(j, 0), n - 1), w / total) for j, w in taps])
    return out


def excluded_cubic_taps(n: int, o: int, f: Fraction, mode: str, a: Fraction) -> list:
    """ONNX's cubic taps x[i - 1 .. i + 2] of each output with exclude_outside: those outside [0, n) dropped, the
    others' coefficients divided by their sum."""
    out = []
    for k in range(o):
        c = coordinate(mode, k, n, o, f)
        i = math.floor(c)
        taps = [(i - 1 + j, w) for j, w in enumerate(cubic_coefficients(c - i, a)) if 0 <= i - 1 + j < n]
        total = sum(w for _, w in taps)
        out.append([(j, w / total) for j, w in taps])
    return out


def resized(x: np.ndarray, out: tuple[int, ...], factors: list[Fraction], taps_of) -> np.ndarray:
    """x resized axis by axis in exact rationals, ``taps_of(n, o, f)`` the taps of an axis."""
    y = x.astype(object)
    for axis, (n, o, f) in enumerate(zip(x.shape, out, factors)):
        if o != n or f != 1:
            y = np.stack([sum(w * np.take(y, j, axis) for j, w in taps) for taps in taps_of(n, o, f)], axis)
    return y


def resize_node(out_or_scales, antialias: int, mode: str, a: float | None, exclude: bool, name: str = "rs",
                inputs=("xf", "r")):
    """A Resize (linear where ``a`` is None, else cubic of A) to a sizes tuple of ints or by a scales list of
    floats."""
    by_sizes = all(isinstance(v, int) for v in out_or_scales)
    attrs = {"cubic_coeff_a": a} if a is not None else {}
    node = h.make_node("Resize", [inputs[0], "", *([""] if by_sizes else []), "rs_" + name], [inputs[1]],
                       mode="linear" if a is None else "cubic", antialias=antialias, name=name,
                       coordinate_transformation_mode=mode, exclude_outside=int(exclude), **attrs)
    value = np.array(out_or_scales, np.int64 if by_sizes else np.float32)
    return node, {"rs_" + name: value}


def float_resize(x: np.ndarray, out_or_scales, antialias: int, mode: str, a: float | None,
                 exclude: bool) -> np.ndarray:
    """onnxruntime's float Resize of x (opset 18)."""
    node, inits = resize_node(out_or_scales, antialias, mode, a, exclude, inputs=("x", "y"))
    g = h.make_graph([node], "g", [h.make_tensor_value_info("x", T.FLOAT, x.shape)],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], [nh.from_array(v, k) for k, v in inits.items()])
    return ort.InferenceSession(onnx_model(g, 18).SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(np.float32)})[0]


@settings(max_examples=40, deadline=None)
@given(d=st.data(), mode=st.sampled_from(MODES), a=st.sampled_from([None, -0.75, -0.5]), exclude=st.booleans())
def test_the_antialias_oracle_is_onnxruntimes(d, mode, a, exclude):
    """The oracle's antialiased Resize (and cubic exclude_outside without it) is onnxruntime's float Resize of
    integers up to 128, to float32's rounding of its weights (2^-12 relative to the largest input)."""
    antialias = d.draw(st.sampled_from([1, 1, 0])) if a is not None and exclude else 1
    shape = (1, 2, d.draw(st.integers(1, 7)), d.draw(st.integers(1, 7)))
    out = (1, 2, d.draw(st.integers(1, 11)), d.draw(st.integers(1, 11)))
    x = np.random.default_rng(d.draw(st.integers(0, 2**16))).integers(-128, 129, shape)
    factors = [Fraction(o, n) for o, n in zip(out, shape)]
    fa = None if a is None else Fraction(a)
    mine = resized(x, out, factors, lambda n, o, f: antialias_taps(n, o, f, mode, fa, exclude) if antialias else
                   excluded_cubic_taps(n, o, f, mode, fa))
    theirs = float_resize(x, out, antialias, mode, a, exclude)
    assert np.abs(mine.astype(np.float64) - theirs).max() <= 2.0**-5


def resize_qdq(shape, x_type, z: int, s: float, so: float, zo: int, node, inits) -> onnx.ModelProto:
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), node,
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"], name="q")]
    return qdq(nodes, shape, x_type, {"s": np.float32(s), "z": NP[x_type](z), "so": np.float32(so),
                                      "zo": np.int8(zo), **inits}, T.INT8, opset=18)


@settings(max_examples=30, deadline=None)
@given(d=st.data(), mode=st.sampled_from(MODES), a=st.sampled_from([None, None, -0.75, -0.5]),
       exclude=st.booleans(), x_type=st.sampled_from([T.INT8, T.UINT8]), by_sizes=st.booleans(),
       s=st.floats(2.0**-6, 2.0**2, width=32), so=st.floats(2.0**-6, 2.0**2, width=32),
       fill=st.sampled_from(["random", "low", "high"]))
def test_an_antialiased_resize_is_the_exact_value_requantized(d, mode, a, exclude, x_type, by_sizes, s, so, fill):
    """Resize linear or cubic with antialias (and cubic exclude_outside without it), down or up, by sizes or float
    scales, every coordinate mode: the integers are the exact rational value of onnxruntime's filter times each
    output's weight sums (whole numbers), the output their requantization by its plan, within its bound of the
    exact value, at extreme inputs too. Regression: 'Resize with antialias has no exact CVM form here', 'Resize
    cubic with exclude_outside ... has no exact CVM form here'."""
    antialias = d.draw(st.sampled_from([1, 1, 0])) if a is not None and exclude else 1
    shape = (1, 2, d.draw(st.integers(1, 6)), d.draw(st.integers(1, 6)))
    if by_sizes:
        out = shape[:2] + (d.draw(st.integers(1, 9)), d.draw(st.integers(1, 9)))
        factors, given_ = [Fraction(o, n) for o, n in zip(out, shape)], out
    else:
        f = [d.draw(st.sampled_from([0.25, 0.5, 0.75, 1.0, 1.5, 2.0])) for _ in range(2)]
        out = shape[:2] + tuple(math.floor(n * v) for n, v in zip(shape[2:], f))
        factors, given_ = [Fraction(1), Fraction(1)] + [Fraction(v) for v in f], [1.0, 1.0, *f]
    assume(min(out) >= 1 and any(o != n or f != 1 for o, n, f in zip(out, shape, factors)))
    lo, hi = RANGE[x_type]
    z = d.draw(st.integers(lo, hi))
    x = {"random": np.random.default_rng(d.draw(st.integers(0, 2**16))).integers(lo, hi + 1, shape),
         "low": np.full(shape, lo), "high": np.full(shape, hi)}[fill]
    m = resize_qdq(shape, x_type, z, s, so, 0, *resize_node(given_, antialias, mode, a, exclude))
    fa = None if a is None else Fraction(a)
    exact = resized(x - z, out, factors, lambda n, o, f: antialias_taps(n, o, f, mode, fa, exclude) if antialias
                    else excluded_cubic_taps(n, o, f, mode, fa))
    try:
        imp, [got] = run(m, x)
    except CVMError as e:  # two cubic axes' weights past 32 bits
        assert a is not None and "need more than 32 bits" in str(e), str(e)
        return
    grid = 1  # each output's weight sum per resized axis: the lcm of its weights' denominators, times 2^e < 2 W / it
    for axis, (n, o, f) in enumerate(zip(shape, out, factors)):
        if o != n or f != 1:
            taps = antialias_taps(n, o, f, mode, fa, exclude) if antialias else excluded_cubic_taps(n, o, f, mode, fa)
            w = np.array([math.lcm(*(t.denominator for _, t in row)) for row in taps], dtype=object)
            w = np.array([v << ((max(w) // v).bit_length() - 1) for v in w], dtype=object)
            grid = grid * (w.reshape((-1,) + (1,) * (3 - axis)) if (w != w[0]).any() else int(w[0]))
    v = exact * grid
    assert all(e.denominator == 1 for e in v.flat)
    scale = np.asarray(Fraction(float(np.float32(s))) / grid, dtype=object)
    want = Oracle(m, imp).requant("q", ("real", v.astype(np.int64), scale), Fraction(float(np.float32(so))), 0,
                                  -128, 127)  # the plan (or runs) on v, each output within its bound
    assert got.shape == out and np.array_equal(got, want)


def test_an_antialiased_cubic_resize_past_32_bits_is_refused_naming_the_node():
    """Cubic antialias from 6 to 5 (weights over 2 x 6 x 5 = 60, cubed) on both axes: the second axis's products
    pass 32 bits: refused in one line naming the node and the rule."""
    node, inits = resize_node((1, 1, 5, 5), 1, "half_pixel", -0.5, True, name="shrink")
    with pytest.raises(CVMError, match=r"shrink \(Resize\): Resize cubic from \(1, 1, 6, 6\) to \(1, 1, 5, 5\): its "
                                       r"weights on axis 3 \(over up to \d+\) times integers up to \d+ need more than "
                                       r"32 bits"):
        import_model(resize_qdq((1, 1, 6, 6), T.UINT8, 0, 0.1, 0.1, 0, node, inits))


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("a", [None, -0.5])
def test_a_float_model_with_an_antialiased_resize_quantizes_whole(tmp_path, per_channel, a):
    """quantize takes Conv -> Resize(antialias=1) -> Conv whole (linear 12 -> 7, torchvision's bilinear; cubic with
    A = -0.5 and exclude_outside, its bicubic, 12 -> 6): within 1.1x onnxruntime's distance from float, the export
    exact. Regression: refused 'Resize with antialias has no exact CVM form here'."""
    out = (1, 8, 7, 7) if a is None else (1, 8, 6, 6)
    node, inits = resize_node(out, 1, "pytorch_half_pixel", a, a is not None, inputs=("a", "b"))
    quantizes_whole(tmp_path, between_convs([node], inits, opset=18), per_channel)
