"""Op classes of shipped models the quantized import refused before: Resize with antialias (torchvision's
resize(antialias=True), image processors exported with their model) and cubic Resize with exclude_outside, of
dequantized values; torch's written-out LocalResponseNorm; skl2onnx's Normalizer L1 and L2."""
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
from support.quantized import Oracle, between_convs, linear_classifier, qdq, quantizes_whole
from test_quantized_fresh_ops import NP, RANGE, cubic_coefficients, run

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.from_onnx.emit import resize_coordinate
from cvm_onnx.converters.from_onnx.quantized.moves import filtered_taps, taps
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
    output's weight sums (whole numbers; where two cubic axes pass 32 bits, the first axis's rounded half up to 2^k
    of them, k read from the requantization's ratio), the output their requantization by its plan, within its bound
    (plus the rounding's reach) of the exact value, at extreme inputs too. Regression: 'Resize with antialias has no
    exact CVM form here', 'Resize cubic with exclude_outside ... has no exact CVM form here'."""
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

    def taps_of(n: int, o: int, f: Fraction) -> list:
        return antialias_taps(n, o, f, mode, fa, exclude) if antialias else excluded_cubic_taps(n, o, f, mode, fa)

    exact = resized(x - z, out, factors, taps_of)
    try:
        imp, [got] = run(m, x)
    except CVMError as e:  # the first axis's products past 32 bits, or rounding between the axes past 1/2 step
        assert a is not None and ("need more than 32 bits" in str(e) or "(more than 1/2)" in str(e)), str(e)
        return
    axes = [axis for axis, (n, o, f) in enumerate(zip(shape, out, factors)) if o != n or f != 1]
    sums, along = {}, {}  # per resized axis, each output's weight sum: its weights' lcm denominator, times 2^e
    for axis in axes:
        w = [math.lcm(*(t.denominator for _, t in row)) for row in taps_of(shape[axis], out[axis], factors[axis])]
        sums[axis] = np.array([v << ((max(w) // v).bit_length() - 1) for v in w], dtype=object)
        along[axis] = sums[axis].reshape((-1,) + (1,) * (3 - axis)) if (sums[axis] != sums[axis][0]).any() \
            else int(sums[axis][0])
    grid = math.prod(along.values())
    [r] = imp.requants
    sx, sy = Fraction(float(np.float32(s))), Fraction(float(np.float32(so)))
    ratio = np.broadcast_to(np.array(r.ratios, dtype=object).reshape(np.shape(grid)), np.shape(grid))
    k = {round(math.log2(float(g * sy * Fraction(q) / sx))) for g, q in zip(np.broadcast_to(grid, ratio.shape).flat,
                                                                           ratio.flat)}
    assert len(k) == 1  # 2^k: the rounding between the axes (k = 0: none)
    k = k.pop()
    v, reach = exact * grid, Fraction(0)
    if k:  # the first axis's integers rounded to 2^k of them (half up), then the second axis's taps on those
        assert len(axes) == 2 and a is not None
        first, second = axes
        u = resized(x - z, out[:second] + shape[second:], factors[:second] + [Fraction(1)] * (4 - second), taps_of)
        u = (u * along[first] + (1 << (k - 1))) // (1 << k)
        rows = taps_of(shape[second], out[second], factors[second])
        v = np.stack([sum(t * sums[second][o] * np.take(u, j, second) for j, t in row) for o, row in enumerate(rows)],
                     second)
        gain = max(sum(abs(t) for _, t in row) for row in rows)
        assert (1 << (k - 1)) / min(sums[first]) * gain <= Fraction(1, 2)  # the refusal's rule: within 1/2 step
        reach = (1 << (k - 1)) * sx / min(sums[first]) * gain / sy  # the rounding's reach in output steps
    assert all(e.denominator == 1 for e in v.flat)
    want = Oracle(m, imp).requant("q", ("real", v.astype(np.int64), np.asarray(sx * (1 << k) / grid, dtype=object)),
                                  sy, 0, -128, 127)  # the plan (or runs) on v, each output within its bound
    assert got.shape == out and np.array_equal(got, want)
    inside = (got > -128) & (got < 127)
    bound = Fraction(1, 2) + Fraction(max((p.error for p in r.plans), default=0)) + reach
    assert all(abs(g - e * sx / sy) <= bound for g, e in zip(got[inside], exact[inside]))


@settings(max_examples=60, deadline=None)
@given(d=st.data(), mode=st.sampled_from(MODES), a=st.sampled_from([None, -0.75, -0.5, 0.0, -3.0]),
       exclude=st.booleans(), n=st.integers(1, 600))
def test_the_antialias_weights_are_the_oracles(d, mode, a, exclude, n):
    """``filtered_taps``' whole weights (``taps``' of cubic exclude_outside without antialias) over each output's
    sum W_o are the oracle's exact weights (summed per clamped index), at sizes and float32 scales whose integers fit
    int64 and whose do not (sizes up to 600, a scale of 23 bits)."""
    antialias = d.draw(st.booleans()) if a is not None and exclude else True
    if d.draw(st.booleans()):
        o = d.draw(st.integers(1, 2 * n))
        f = Fraction(o, n)
    else:
        f = Fraction(float(d.draw(st.floats(0.0625, 3.0, width=32))))
        o = math.floor(n * f)
        assume(o >= 1)
    fa = None if a is None else Fraction(a)
    coordinate = resize_coordinate(mode, np.arange(o), n, o, f)
    weights, sums = filtered_taps(coordinate, n, f, fa, exclude) if antialias else taps(coordinate, fa, n)
    oracle = antialias_taps(n, o, f, mode, fa, exclude) if antialias else excluded_cubic_taps(n, o, f, mode, fa)
    for k, want in enumerate(oracle):
        mine, theirs = {}, {}
        for j, w in weights:
            i = min(max(int(j[k]), 0), n - 1)
            mine[i] = mine.get(i, 0) + Fraction(int(w[k]), int(sums[k]))
        for i, w in want:
            theirs[i] = theirs.get(i, 0) + w
        assert {i: w for i, w in mine.items() if w} == {i: w for i, w in theirs.items() if w}


def test_a_resize_of_a_huge_axis_makes_each_distinct_ratio_once(monkeypatch):
    """Antialiased cubic Resize of (1, 2, 6, 2^16) by (0.5, 0.75) (a fuzzer's hang at 2^20): the scales and ratios
    per output position s / W_o repeat a few values, each made once: the Fractions the import makes do not grow with
    the axis (2^8 -> 2^16). Regression: one Fraction per position for the scale, the ratio and the plan's clip (a
    minute at 2^20)."""
    made, new = [0], Fraction.__new__

    def counting(cls, *args, **kwargs):
        made[0] += 1
        return new(cls, *args, **kwargs)

    monkeypatch.setattr(Fraction, "__new__", staticmethod(counting))
    counts = []
    for n in (1 << 8, 1 << 16):
        node, inits = resize_node([1.0, 1.0, 0.5, 0.75], 1, "pytorch_half_pixel", -0.75, True)
        m = resize_qdq((1, 2, 6, n), T.INT8, 3, 0.05, 0.04, 0, node, inits)
        made[0] = 0
        g = import_model(m).graph
        assert g.type_of(g.heads[0]).shape == (1, 2, 3, n * 3 // 4)
        counts.append(made[0])
    assert counts[1] <= counts[0] < 1000, counts


def test_an_antialiased_cubic_resize_past_32_bits_is_refused_naming_the_node():
    """Cubic antialias by the float scale 0.6 (the float32 5033165 / 2^23: weights over a 25-bit denominator, cubed)
    on its one resized axis: its products pass 32 bits before any rounding: refused in one line naming the node and
    the rule."""
    node, inits = resize_node([1.0, 1.0, 1.0, 0.6], 1, "half_pixel", -0.5, True, name="shrink")
    with pytest.raises(CVMError, match=r"shrink \(Resize\): Resize cubic from \(1, 1, 2, 5\) to \(1, 1, 2, 3\): its "
                                       r"weights on axis 3 \(over (up to )?\d+\) times integers up to \d+ need more "
                                       r"than 32 bits"):
        import_model(resize_qdq((1, 1, 2, 5), T.UINT8, 0, 0.1, 0.1, 0, node, inits))


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("a", [None, -0.5])
def test_a_float_model_with_an_antialiased_resize_quantizes_whole(tmp_path, per_channel, a):
    """quantize takes Conv -> Resize(antialias=1) 12 x 12 -> 7 x 9 -> Conv whole (linear, torchvision's bilinear;
    cubic with A = -0.5 and exclude_outside, its bicubic as torch's exporter writes it: its two axes' weights pass
    32 bits, rounded between them): within 1.1x onnxruntime's distance from float, the export exact. Regression:
    refused 'Resize with antialias has no exact CVM form here'."""
    out = (1, 8, 7, 9)
    node, inits = resize_node(out, 1, "pytorch_half_pixel", a, a is not None, inputs=("a", "b"))
    quantizes_whole(tmp_path, between_convs([node], inits, opset=18), per_channel)


# -- torch's written-out LocalResponseNorm ---------------------------------------------------------------------------
def written_lrn(shape: tuple[int, ...], size: int, alpha: float, beta: float, k: float, before: int | None = None,
                **edits) -> tuple[list, dict]:
    """torch's local_response_norm of 'a' into 'b' as its exporters write it: Mul(a, a), a view to (N, 1, C, ...)
    (Unsqueeze for a 3-D input, else Reshape to (N, 1, C, D1, -1)), Pad of zeros along C (size // 2 before), an
    AveragePool (size, 1, ...), Squeeze of axis 1, a Reshape back to a's shape (5-D), * alpha, + k, Pow beta,
    a / that. ``edits``: a pad value, pool strides, or squeezed axes off the pattern; count_include_pad: the Pad's
    widths the pool's own pads (as onnxruntime's optimizer fuses them), counted or not."""
    before = size // 2 if before is None else before
    rank = 4 if len(shape) == 3 else 5
    pads = [0] * (2 * rank)
    pads[2], pads[rank + 2] = before, size - 1 - before
    inits = {"two_pads": np.array(pads, np.int64), "sq_axes": np.array(edits.get("squeezed", [1]), np.int64),
             "alpha": np.float32(alpha), "k": np.float32(k), "beta": np.float32(beta),
             "pad_value": np.float32(edits.get("pad_value", 0.0))}
    nodes = [h.make_node("Mul", ["a", "a"], ["sq"])]
    if len(shape) == 3:
        inits["unsq"] = np.array([1], np.int64)
        nodes.append(h.make_node("Unsqueeze", ["sq", "unsq"], ["view"]))
    else:
        inits["view_shape"] = np.array([shape[0], 1, shape[1], shape[2], -1], np.int64)
        nodes.append(h.make_node("Reshape", ["sq", "view_shape"], ["view"]))
    if "count_include_pad" in edits:  # the Pad fused into the pool (onnxruntime's optimizer)
        own = pads[2:rank] + pads[rank + 2:]
        pool = {"pads": own, "count_include_pad": edits["count_include_pad"]}
    else:
        pool = {}
        nodes.append(h.make_node("Pad", ["view", "two_pads", "pad_value"], ["padded"]))
    nodes += [h.make_node("AveragePool", ["padded" if not pool else "view"], ["avg"],
                          kernel_shape=[size] + [1] * (rank - 3), strides=edits.get("strides", [1] * (rank - 2)),
                          **pool),
              h.make_node("Squeeze", ["avg", "sq_axes"], ["sqz" if len(shape) == 5 else "div"])]
    if len(shape) == 5:
        inits["back"] = np.array(shape, np.int64)
        nodes.append(h.make_node("Reshape", ["sqz", "back"], ["div"]))
    nodes += [h.make_node("Mul", ["div", "alpha"], ["scaled"]), h.make_node("Add", ["scaled", "k"], ["biased"]),
              h.make_node("Pow", ["biased", "beta"], ["powered"]), h.make_node("Div", ["a", "powered"], ["b"])]
    return nodes, inits


def written_model(nodes: list, inits: dict, shape: tuple[int, ...]) -> onnx.ModelProto:
    """A float model (opset 18) of ``nodes`` from 'a' (the input x) to 'b' (the output y)."""
    renamed = [h.make_node(n.op_type, ["x" if i == "a" else i for i in n.input],
                           ["y" if o == "b" else o for o in n.output], **{a.name: h.get_attribute_value(a)
                                                                          for a in n.attribute}) for n in nodes]
    g = h.make_graph(renamed, "m", [h.make_tensor_value_info("x", T.FLOAT, list(shape))],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], [nh.from_array(np.asarray(v), n)
                                                                       for n, v in inits.items()])
    return onnx_model(g, 18)


def ort_run(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@settings(max_examples=25, deadline=None)
@given(d=st.data(), rank=st.sampled_from([3, 4, 5]), size=st.integers(1, 7), pool_pads=st.booleans(),
       alpha=st.floats(2.0**-13, 2.0, width=32), beta=st.floats(0.25, 1.5, width=32), k=st.floats(0.5, 3.0, width=32))
def test_torchs_written_out_lrn_is_fused_into_onnxs_lrn(d, rank, size, pool_pads, alpha, beta, k):
    """torch's local_response_norm written out of a 4-D input becomes one LRN(size, alpha, beta, bias = k) where its
    window is LRN's (odd sizes): the written-out model computes ONNX's LRN of those attributes (``lrn``) to float32
    rounding; an even size (torch's window one channel before LRN's) and 3-D and 5-D inputs (onnxruntime's LRN takes
    4-D only) are left as they are; the Pad as the pool's own counted pads too (onnxruntime's optimizer fuses them so). Regression: the
    pattern was left whole, refused at its Div by the computed Pow."""
    from cvm_onnx.app.fusions import fuse_lrn

    shape = (d.draw(st.integers(1, 2)), d.draw(st.integers(1, 9))) + \
        tuple(d.draw(st.integers(1, 4)) for _ in range(rank - 2))
    m = written_model(*written_lrn(shape, size, alpha, beta, k, **({"count_include_pad": 1} if pool_pads else {})),
                    shape)
    fused = onnx.ModelProto()
    fused.CopyFrom(m)
    fuse_lrn(fused)
    if size % 2 == 0 or rank != 4:
        assert [n.op_type for n in fused.graph.node] == [n.op_type for n in m.graph.node]
        return
    [node] = fused.graph.node
    a = {x.name: h.get_attribute_value(x) for x in node.attribute}
    assert node.op_type == "LRN" and a["size"] == size and (a["alpha"], a["beta"], a["bias"]) == (alpha, beta, k)
    x = np.random.default_rng(d.draw(st.integers(0, 2**16))).normal(0, 2, shape).astype(np.float32)
    assert np.allclose(ort_run(m, x), lrn(x, **a), rtol=2e-6, atol=0)


def lrn(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """ONNX's LRN in float64: x / (bias + alpha / size * sum of x^2 over channels c - floor((size - 1) / 2) ..
    c + ceil((size - 1) / 2)) ^ beta. (onnxruntime's LRN kernel is up to 8e-6 from it, relative, in float32: too far
    for a check of the window; onnx's reference LRN sums over the batch axis.)"""
    x = x.astype(np.float64)
    before, after = (size - 1) // 2, size // 2
    squares = np.pad(x * x, [(0, 0), (before, after), (0, 0), (0, 0)])
    total = sum(squares[:, j:j + x.shape[1]] for j in range(size))
    return x / (bias + alpha / size * total) ** beta


@pytest.mark.parametrize("edit", [{"pad_value": 1.0}, {"strides": [2, 1, 1]}, {"squeezed": [0]}, {"before": 1},
                                  {"count_include_pad": 0}])
def test_a_written_out_lrn_off_the_pattern_is_left(edit):
    """A nonzero pad value, a pool stride, another squeezed axis, a window placed otherwise, pool pads not counted:
    not LRN, left."""
    from cvm_onnx.app.fusions import fuse_lrn

    shape = (1, 6, 3, 3) if "squeezed" not in edit else (1, 6, 1, 3)
    m = written_model(*written_lrn(shape, 5, 0.02, 0.75, 1.0, **edit), shape)
    ops = [n.op_type for n in m.graph.node]
    fuse_lrn(m)
    assert [n.op_type for n in m.graph.node] == ops


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_float_model_with_torchs_written_out_lrn_quantizes_whole(tmp_path, per_channel):
    """quantize takes Conv -> torch's written-out LocalResponseNorm (size 5, alpha 0.02) -> Conv whole: within 1.1x
    onnxruntime's distance from float, the export exact. Regression: refused at its Div by the computed Pow."""
    quantizes_whole(tmp_path, between_convs(*written_lrn((1, 8, 12, 12), 5, 0.02, 0.75, 1.0), opset=18), per_channel)


# -- Normalizer L1 and L2 -------------------------------------------------------------------------------------------
def normalizer(norm: str, shape: list | None, elem: int = T.FLOAT) -> onnx.ModelProto:
    """An ai.onnx.ml Normalizer(norm) of the input x of ``shape`` and type ``elem``."""
    g = h.make_graph([h.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm=norm, name="n")], "m",
                     [h.make_tensor_value_info("x", elem, shape)], [h.make_tensor_value_info("y", T.FLOAT, None)])
    return onnx_model(g, 13, {"ai.onnx.ml": 1})


@settings(max_examples=30, deadline=None)
@given(d=st.data(), norm=st.sampled_from(["L1", "L2"]), rank=st.sampled_from([1, 2]), zeros=st.booleans(),
       magnitude=st.integers(-6, 6))
def test_a_normalizer_l1_or_l2_is_onnxruntimes_lp_normalization(d, norm, rank, zeros, magnitude):
    """normalizers_as_lp_norms: Normalizer(norm L1 or L2) of a 1-D or 2-D x (rows of zeros too; L2 of doubles too)
    becomes Cast and LpNormalization(p 1 or 2, axis -1), whose float output is onnxruntime's Normalizer's to float32
    rounding: L1 the same division, L2 within (n + 8) 2^-24 relative over rows of n (docs/import.md)."""
    from cvm_onnx.app.rewrites import normalizers_as_lp_norms

    shape = (d.draw(st.integers(1, 6)),) if rank == 1 else (d.draw(st.integers(1, 4)), d.draw(st.integers(1, 40)))
    dtype = d.draw(st.sampled_from([np.float32, np.float64] if norm == "L2" else [np.float32]))
    x = (np.random.default_rng(d.draw(st.integers(0, 2**16))).normal(0, 3, shape) * 10.0**magnitude).astype(dtype)
    if zeros:
        x[..., :] = 0 if rank == 1 else x[..., :] * (np.arange(shape[0]) % 2).reshape(-1, 1)
    m = normalizer(norm, list(shape), T.FLOAT if dtype == np.float32 else T.DOUBLE)
    want = ort_run(m, x)
    assert normalizers_as_lp_norms(m) == 1
    assert [n.op_type for n in m.graph.node] == ["Cast", "LpNormalization"]
    assert h.get_node_attr_value(m.graph.node[1], "p") == int(norm[1])
    got = ort_run(m, x)
    rtol = 2e-7 if norm == "L1" else (shape[-1] + 8) * 2.0**-24
    assert got.shape == want.shape and np.allclose(got, want, rtol=rtol, atol=0)


@pytest.mark.parametrize("norm", ["L1", "L2"])
@pytest.mark.parametrize("shape", [[2, 3, 4], [1, 1, 2, 3], [], None])
def test_a_normalizer_of_another_rank_is_left_and_refused(norm, shape):
    """onnxruntime's Normalizer refuses an input of rank past 2 (and a scalar); an input whose rank shape inference
    does not state may be one: left, and quantize's refusal names it. Before: rewritten as an LpNormalization that
    runs where onnxruntime's model fails."""
    from cvm_onnx.app.quantize import refusal
    from cvm_onnx.app.rewrites import normalizers_as_lp_norms

    m = normalizer(norm, shape)
    if shape:
        with pytest.raises(Exception, match="Rank of input"):
            ort_run(m, np.ones(shape, np.float32))
    assert "ai.onnx.ml ops (Normalizer x1): CVM has none" in refusal(m)
    assert "Normalizer 'n': its input's rank is not stated 1 or 2" in refusal(m)
    assert normalizers_as_lp_norms(m) == 0 and [n.op_type for n in m.graph.node] == ["Normalizer"]


@pytest.mark.parametrize("elem", [T.INT32, T.INT64])
def test_a_normalizer_l2_of_integers_is_left_and_refused(elem):
    """onnxruntime's Normalizer L2 squares an integer x in its own type (an int32 x of 50000 wraps: NaN beside it),
    where Cast and LpNormalization would give the norm: left, and quantize's refusal names it; L1 of integers
    (|x| summed in float) is rewritten."""
    from cvm_onnx.app.quantize import refusal
    from cvm_onnx.app.rewrites import normalizers_as_lp_norms

    m = normalizer("L2", [1, 2], elem)
    if elem == T.INT32:
        assert np.isnan(ort_run(m, np.array([[50000, 1]], np.int32))[0, 1])
    assert "Normalizer 'n': norm L2 of integers: onnxruntime squares them in their own type" in refusal(m)
    assert normalizers_as_lp_norms(m) == 0 and [n.op_type for n in m.graph.node] == ["Normalizer"]
    assert normalizers_as_lp_norms(normalizer("L1", [1, 2], elem)) == 1


@pytest.mark.parametrize("norm", ["MAX", "bogus", None])
def test_a_normalizer_max_or_of_no_norm_is_refused_saying_why(norm):
    """A Normalizer MAX (the default norm) is refused naming the node and the reason (its quotient has no bound),
    as is a norm onnxruntime does not know; neither is rewritten."""
    from cvm_onnx.app.quantize import refusal
    from cvm_onnx.app.rewrites import normalizers_as_lp_norms

    m = normalizer(norm or "MAX", [2, 3])
    if norm is None:
        del m.graph.node[0].attribute[:]
    why = refusal(m)
    assert "ai.onnx.ml ops (Normalizer x1): CVM has none" in why
    assert ("Normalizer 'n': norm bogus of 1 inputs is not" if norm == "bogus" else
            "Normalizer 'n': norm MAX divides each row by its max") in why
    assert normalizers_as_lp_norms(m) == 0


@pytest.mark.parametrize("norm", ["L1", "L2"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_a_multinomial_logistic_regression_with_its_normalizer_quantizes_whole(tmp_path, per_channel, norm):
    """skl2onnx's multinomial LogisticRegression (a Scaler, LinearClassifier SOFTMAX, then Normalizer L1 of the
    probabilities; L2 as a pipeline's last Normalizer) quantizes whole: within 1.1x onnxruntime's distance from
    float, the export exact. Regression: refused 'ai.onnx.ml ops (Normalizer x1): CVM has none'."""
    rng = np.random.default_rng(8)
    m = linear_classifier(rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=3).astype(np.float32),
                          [0, 1, 2], [None, 4], scaler=True, post_transform="SOFTMAX")
    m.graph.node[-1].output[1] = "probability_tensor"
    m.graph.node.extend([h.make_node("Normalizer", ["probability_tensor"], ["probabilities"], domain="ai.onnx.ml",
                                     norm=norm, name="Normalizer")])
    quantizes_whole(tmp_path, m, per_channel, rng.normal(size=(8, 1, 4)))


def test_only_an_l1_normalizations_float_output_is_put_on_a_grid(tmp_path):
    """l1_norms_quantized: an LpNormalization p = 1 that no reader quantizes gets a QuantizeLinear and
    DequantizeLinear at [-1, 1]'s grid; p = 2 stays float (the importer's L2 form reaches a float output on a finer
    grid: a Normalizer L2 at a model's end nearer float so)."""
    from cvm_onnx.app.kept_float import l1_norms_quantized

    g = h.make_graph([h.make_node("LpNormalization", ["x"], ["y1"], p=1, axis=-1, name="l1"),
                      h.make_node("LpNormalization", ["x"], ["y2"], p=2, axis=-1, name="l2")], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
                     [h.make_tensor_value_info(y, T.FLOAT, [1, 4]) for y in ("y1", "y2")])
    onnx.save(onnx_model(g, 13), tmp_path / "q.onnx")
    assert l1_norms_quantized(tmp_path / "q.onnx", T.UINT8, False) == 1
    m = onnx.load(tmp_path / "q.onnx")
    assert [n.op_type for n in m.graph.node] == ["LpNormalization", "QuantizeLinear", "DequantizeLinear",
                                                 "LpNormalization"]
    assert [v.name for v in m.graph.output] == ["y1_dequantized", "y2"]


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_pipeline_of_a_normalizer_l2_then_a_classifier_quantizes_whole(tmp_path, per_channel):
    """A scikit-learn Pipeline of Normalizer('l2') then a LinearClassifier (its scores, or SOFTMAX) quantizes
    whole: within 1.1x onnxruntime's distance from float, the export exact. Regression: refused 'ai.onnx.ml ops
    (Normalizer x1): CVM has none'."""
    rng = np.random.default_rng(9)
    for transform in ("NONE", "SOFTMAX"):
        m = linear_classifier(rng.normal(size=(3, 5)).astype(np.float32), rng.normal(size=3).astype(np.float32),
                              [0, 1, 2], [None, 5], post_transform=transform)
        m.graph.node[0].input[0] = "normalized"
        m.graph.node.insert(0, h.make_node("Normalizer", ["x"], ["normalized"], domain="ai.onnx.ml", norm="L2",
                                           name="Normalizer"))
        quantizes_whole(tmp_path, m, per_channel, rng.normal(size=(8, 1, 5)))
