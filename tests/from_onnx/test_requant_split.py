"""Requantization products in parts (docs/import.md, "Two-part products", "Products in n parts"): r =
round_half_up(v1 m / 2^k) with m = m1 2^b + m0 computed as cvm_right_shift(v1 m1 + floor(v1 m0 / 2^b), k - b),
floor(p0 / 2^b) as cvm_right_shift(p0 - 2^(b-1), b), and in three parts by nested floors; each plan's labels within
CVM's rules, its result equal to the one-part formula with the full m, and imports equal to the exact oracle,
exported to ONNX exactly."""
from __future__ import annotations

import dataclasses
import os
from fractions import Fraction

import numpy as np
import onnx
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.quantized import Oracle, qdq

from cvm_onnx.app.api import load
from cvm_onnx.app.cli import main
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.from_onnx import requant_plans
from cvm_onnx.converters.from_onnx.requant_plans import FINER, MAX_PARTS, SPLIT, NoPlan, plan, round_half_up, tight
from cvm_onnx.core.constants import precision_bound
from cvm_onnx.core.executor import execute
from cvm_onnx.core.ops.elemwise import round_shift
from cvm_onnx.runtime.verify import verify

EXAMPLES = int(os.environ.get("CVM_ONNX_EXAMPLES", "150"))
wide = st.integers(-(1 << 40), 1 << 40)


@settings(max_examples=EXAMPLES, deadline=None)
@given(p1=wide, p0=wide, b=st.integers(1, 30), j=st.integers(1, 31))
@example(p1=0, p0=-1, b=1, j=1).via("a negative low part: floor, not truncation")
@example(p1=-1, p0=(1 << 29) - 1, b=30, j=1).via("the low part one below 2^b")
def test_the_two_part_identity(p1, p0, b, j):
    """round_half_up((p1 2^b + p0) / 2^k) = round_shift(p1 + floor(p0 / 2^b), k - b) and floor(p0 / 2^b) =
    round_shift(p0 - 2^(b-1), b), for any integers (k = b + j): the rounding constant 2^(k-1) is a multiple of
    2^b, so p0's fraction below 2^b never carries."""
    k = b + j
    assert round_shift(p0 - (1 << (b - 1)), b) == p0 // (1 << b)
    assert round_half_up(Fraction(p1 * (1 << b) + p0, 1 << k)) == round_shift(p1 + round_shift(p0 - (1 << (b - 1)),
                                                                                                 b), j)


@settings(max_examples=EXAMPLES, deadline=None)
@given(ps=st.lists(wide, min_size=2, max_size=5), widths=st.lists(st.integers(1, 30), min_size=4, max_size=4),
       j=st.integers(1, 31))
@example(ps=[-1, -1, 0], widths=[1, 1, 1, 1], j=1).via("negative low parts: floors, not truncations")
def test_the_nested_floor_identity(ps, widths, j):
    """A product in n parts (docs/import.md, "Products in n parts"): for any integers p_0 .. p_(n-1) (the lowest
    first) and widths b_j, t_0 = floor(p_0 / 2^b_0), t_j = floor((p_j + t_(j-1)) / 2^(b_j)), each as round_shift(x -
    2^(b_j-1), b_j), equals floor(sum_(i<=j) p_i 2^(B_i) / 2^(B_(j+1))) (B_i the widths below i), and
    round_shift(p_top + t_last, j) is round_half_up of the whole sum over 2^(B + j)."""
    widths = widths[:len(ps) - 1]
    t, below, total = None, 0, 0
    for p_, b in zip(ps, widths):
        total += p_ << below
        x = p_ if t is None else p_ + t
        t = round_shift(x - (1 << (b - 1)), b)
        below += b
        assert t == total // (1 << below)
    total += ps[-1] << below
    assert round_shift(ps[-1] + t, j) == round_half_up(Fraction(total, 1 << (below + j)))


def fewer_parts(make, n: int):
    """``make()`` with plans of at most n parts."""
    kept = requant_plans.MAX_PARTS
    requant_plans.MAX_PARTS = n
    try:
        return make()
    finally:
        requant_plans.MAX_PARTS = kept


def same(p, q) -> bool:
    """Plans equal field for field (multipliers as arrays)."""
    return q is not None and all(np.array_equal(a, b) for a, b in zip(p.multipliers, q.multipliers)) and \
        dataclasses.replace(p, multipliers=()) == dataclasses.replace(q, multipliers=())


def cvm_shift(x, s: int, p: int):
    """cvm_right_shift as the runtime's FORMAL kernel computes it: round_shift, then the symmetric clip of p."""
    return np.clip(round_shift(x, s), -precision_bound(p), precision_bound(p))


@settings(max_examples=EXAMPLES, deadline=None)
@given(lo=st.integers(-(1 << 31) + 1, 0), hi=st.integers(0, (1 << 31) - 1),
       ratios=st.lists(st.floats(2.0**-40, 2.0**8, width=32), min_size=1, max_size=4),
       out=st.sampled_from([(-128, 127), (0, 255), (-32768, 32767), (0, 65535)]), zero=st.integers(-300, 300),
       seed=st.integers(0, 99), threshold=st.sampled_from([SPLIT, Fraction(0)]))
@example(lo=-(1 << 31) + 1, hi=(1 << 31) - 1, ratios=[2.0**-30], out=(-128, 127), zero=0, seed=0, threshold=SPLIT)
@example(lo=-(1 << 20), hi=1 << 20, ratios=[0.00039, 0.029], out=(0, 255), zero=128, seed=1, threshold=SPLIT)
def test_split_plans_keep_the_rules_and_equal_the_one_part_rounding(lo, hi, ratios, out, zero, seed, threshold):
    """The plan is in parts exactly where the one-part plan's delta passes the threshold (SPLIT, or 0: the
    importer's default) or none exists, and parts come closer; in more than two parts (at most MAX_PARTS, B <= 31)
    only where two leave delta above FINER and more come closer; a plan in parts keeps every broadcast_mul and
    broadcast_add within 32 bits and every cvm_right_shift's precision + shift within 31 (the CPU device clips as
    FORMAL does), with 0 <= m_j < 2^(b_j) below the top and each level's precision holding its bound (computed
    here); its integer steps (each with its label's clip) equal round_half_up(v1 m / 2^k) on integers across the
    interval (its ends, 0, the clip's ends, random ones), and r lies within 1/2 + delta of v M unsaturated."""
    check_single(lo, hi, ratios, out, zero, seed, threshold)


@settings(max_examples=EXAMPLES, deadline=None)
@given(width=st.integers(14, 24), scales=st.lists(st.floats(2.0**-16, 2.0**-8, width=32), min_size=1, max_size=4),
       s_out=st.floats(2.0**-6, 1.0, width=32), out=st.sampled_from([(-128, 127), (0, 255)]),
       zero=st.integers(-128, 255), seed=st.integers(0, 99))
@example(width=18, scales=[float.fromhex("0x1.4c7510p-14")], s_out=float.fromhex("0x1.5c0938p-4"), out=(-128, 127),
         zero=0, seed=0).via("two parts round v = 66999 (v M = 62.50000086) down")
def test_accumulators_take_three_parts_within_the_rules(width, scales, s_out, out, zero, seed):
    """The same for the importer's usual requantization, a convolution's accumulator of 14..24 bits into 8 bits,
    M = s / s_out of float32 scales (a denominator of up to 24 odd bits: no plan is exact), where two parts leave
    delta above FINER and three parts are planned."""
    check_single(-(1 << width), 1 << width, [Fraction(x) / Fraction(s_out) for x in scales], out, zero, seed,
                 Fraction(0))


def check_single(lo, hi, ratios, out, zero, seed, threshold):
    hi = max(hi, lo + 1)
    zero = min(max(zero, out[0]), out[1])
    ms = np.array([Fraction(r) for r in ratios], dtype=object)
    low, high = out[0] - zero, out[1] - zero
    try:
        one = plan([(lo, hi, ms)], low, high, split_above=None)  # the best one-part plan
    except NoPlan:
        one = None
    try:
        p = plan([(lo, hi, ms)], low, high, split_above=threshold)
    except NoPlan:
        assert one is None
        return
    if one is not None and one.delta <= threshold:
        assert same(p, one)
    if not p.split:
        assert same(p, one)
        return
    assert one is None or p.delta < one.delta
    b, k, label, widths = p.split, p.shift, p.pre_precision, p.widths
    assert sum(widths) == b and 1 <= len(widths) <= MAX_PARTS - 1 and (len(widths) == 1 or b <= 31)
    if len(widths) > 1:  # more than two parts only where fewer leave delta above FINER (or have no plan), and closer
        try:
            two = fewer_parts(lambda: plan([(lo, hi, ms)], low, high, split_above=threshold), len(widths))
        except NoPlan:
            two = None
        assert two is None or two.delta > FINER and p.delta < two.delta
    m = p.multipliers[0].astype(object)
    parts = [x.astype(object) for x in p.parts[0]]  # the top first
    starts = [sum(widths[:j]) for j in range(len(widths))]
    assert all((parts[0] << b) + sum(x << a for x, a in zip(reversed(parts[1:]), starts)) == m)
    assert all(0 <= x < 1 << w for part, w in zip(reversed(parts[1:]), widths) for x in part.flat)
    clip = p.clip or (lo, hi)
    b1 = max(-clip[0], clip[1], 1)
    b1 = round_shift(b1, p.pre_shift) if p.pre_shift else b1
    assert tight(b1) <= label and label + p.pre_shift <= 31 if p.pre_shift else tight(b1) == label
    assert label + tight(max(parts[0])) <= 31  # the top product, then its sum with t within 32
    bound = 0
    for j, (w, part, q) in enumerate(zip(widths, reversed(parts[1:]), p.lows)):  # each level's labels and shift
        level = label + tight(max(part)) if j == 0 else max(label + tight(max(part)), p.lows[j - 1]) + 1
        assert max(level, tight(1 << (w - 1))) + 1 <= 32
        bound = -(-(b1 * max(part) + bound) >> w)
        assert tight(bound) <= q and q + w <= 31
    assert 1 <= k - b and p.precision + (k - b) <= 31
    rng = np.random.default_rng(seed)
    v = np.unique(np.concatenate([[lo, hi, 0, 1, -1, *clip], rng.integers(lo, hi + 1, 300)]).clip(lo, hi))
    v = v.astype(object)[:, None]
    v1 = np.clip(v, *clip)
    if p.pre_shift:
        v1 = cvm_shift(v1, p.pre_shift, p.pre_precision)
    t, below = 0, 0
    for j, (w, part, q) in enumerate(zip(widths, reversed(parts[1:]), p.lows)):
        t = cvm_shift(v1 * part + t - (1 << (w - 1)), w, q)
        below += w  # each level is the floor of v1 times m's low bits so far (the nested floors)
        assert np.array_equal(t, (v1 * (m % (1 << below))) // (1 << below))
    r = cvm_shift(v1 * parts[0] + t, k - b, p.precision)
    want = np.vectorize(lambda x: round_half_up(Fraction(x, 1 << k)), otypes=[object])(v1 * m)
    assert np.array_equal(r, np.clip(want, -precision_bound(p.precision), precision_bound(p.precision)))
    exact = v * ms[None, :]
    inside = (exact >= low - 1) & (exact <= high + 1)
    assert all(abs(a - e) <= Fraction(1, 2) + p.delta for a, e in zip(want[inside], exact[inside]))
    assert all(np.clip(want, low, high)[exact > high + 1] == high)
    assert all(np.clip(want, low, high)[exact < low - 1] == low)


def requantized(scales: np.ndarray, s_out: float, out: int, zo: int, p_in: int, x: np.ndarray, two_part: bool):
    """DequantizeLinear of the int32 input x of p_in bits with per-channel ``scales`` (axis 1), then QuantizeLinear
    at s_out, zo into ``out``: the import (``two_part`` as import_model's), after checking that it equals the exact
    oracle element for element (the oracle's result within 1/2 + delta of v M) and that its export to ONNX
    computes the same."""
    c = len(scales)
    m = qdq([h.make_node("DequantizeLinear", ["x", "s", "z"], ["f"], axis=1),
             h.make_node("QuantizeLinear", ["f", "so", "zo"], ["y"])], x.shape, T.INT32,
            {"s": np.asarray(scales, np.float32), "z": np.zeros(c, np.int32), "so": np.float32(s_out),
             "zo": np.array(zo, np.int8 if out == T.INT8 else np.uint8)}, out)
    imp = import_model(m, input_precision=p_in, two_part=two_part)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    [want] = Oracle(m, imp).run(x)
    assert np.array_equal(got.astype(np.int64), np.asarray(want[1]).reshape(got.shape))
    assert verify(imp.graph, x.astype(np.int32)).exact
    return imp


@settings(max_examples=max(EXAMPLES // 5, 10), deadline=None)
@given(d=st.data(), p_in=st.integers(12, 30), c=st.integers(1, 4), s_out=st.floats(2.0**-8, 1.0, width=32),
       out=st.sampled_from([T.INT8, T.UINT8]), two_part=st.booleans())
def test_a_per_channel_requantization_of_a_wide_sum_equals_the_oracle(d, p_in, c, s_out, out, two_part):
    """DequantizeLinear of an int32 input of p_in <= 30 bits (an accumulator: 31-bit sums have no plan) with
    per-channel scales, then QuantizeLinear: the import (by default two parts only where one part has no plan;
    with two_part also where one part errs by more than SPLIT) equals the exact oracle on the input's extremes, 0,
    +-1 and random values, and exports to ONNX exactly (``requantized``)."""
    scales = np.array(d.draw(st.lists(st.floats(2.0**-24, 2.0**-4, width=32), min_size=c, max_size=c)), np.float32)
    zo = d.draw(st.integers(-128, 127) if out == T.INT8 else st.integers(0, 255))
    top = precision_bound(p_in)
    x = np.array(d.draw(st.lists(st.one_of(st.sampled_from([top, -top, 0, 1, -1]), st.integers(-top, top)),
                                 min_size=8 * c, max_size=8 * c)), np.int64).reshape(2, c, 4)
    requantized(scales, s_out, out, zo, p_in, x, two_part)


def test_a_convolution_value_near_a_half_integer_rounds_as_the_exact_arithmetic():
    """An accumulator of 19 bits at s_x s_w = 0x1.4c7510p-14 into 0x1.5c0938p-4 (int8): v = 66999 gives v M =
    62.50000086, which two parts (delta 6.4e-6) round to 62; the default import (three parts, delta 1.5e-8) gives
    63, QuantizeLinear's exact result, on it, its negative and its neighbours (and ``requantized``'s checks)."""
    s, s_out = float.fromhex("0x1.4c7510p-14"), float.fromhex("0x1.5c0938p-4")
    v = [66999, -66999, 66998, 67000, 0, 262143, -262143]
    imp = requantized(np.array([s]), s_out, T.INT8, 0, 19, np.array(v, np.int64).reshape(1, 1, -1), two_part=True)
    [got] = execute(imp.graph, {"data": np.array(v, np.int32).reshape(1, 1, -1)})
    m = Fraction(s) / Fraction(s_out)
    assert got.reshape(-1).tolist() == [min(max(round(x * m), -128), 127) for x in v]
    assert len(imp.requants[0].plan.widths) == 2


def test_a_detector_spread_is_one_two_part_plan():
    """PP-OCRv4's conv2d_455 spread (M in [0.00039, 0.029]) from a 21-bit sum: the best one-part plan has delta
    0.3; one two-part plan holds every channel within 1/128 (no runs), and its import equals the oracle on every
    value of a ramp over the sum's range."""
    ms = np.array([Fraction(0.00039), Fraction(0.0029), Fraction(0.029)], dtype=object)
    one = plan([(-(1 << 20), 1 << 20, ms)], 0 - 128, 255 - 128, split_above=None)
    p = plan([(-(1 << 20), 1 << 20, ms)], 0 - 128, 255 - 128, split_above=SPLIT)
    assert one.delta > Fraction(1, 4) and p.split and p.delta < Fraction(1, 128)
    s_out = 0.05
    x = np.linspace(-(1 << 20), 1 << 20, 3 * 4001).round().astype(np.int64).reshape(1, 3, -1)
    imp = requantized(np.array([0.00039, 0.0029, 0.029]) * s_out, s_out, T.UINT8, 128, 22, x, two_part=True)
    [rec] = imp.requants
    assert rec.plan is not None and rec.plan.split
    [default] = requantized(np.array([0.00039, 0.0029, 0.029]) * s_out, s_out, T.UINT8, 128, 22, x, False).requants
    assert default.plan is None and not any(run.plan.split for run in default.runs)  # one part: runs of channels


@settings(max_examples=EXAMPLES, deadline=None)
@given(d=st.data(), n=st.integers(2, 3), c=st.integers(1, 3),
       out=st.sampled_from([(-128, 127), (0, 255), (-32768, 32767)]), zero=st.integers(-300, 300),
       seed=st.integers(0, 99), threshold=st.sampled_from([SPLIT, Fraction(0)]))
def test_a_sum_in_two_parts_keeps_the_rules_and_equals_the_one_part_rounding(d, n, c, out, zero, seed, threshold):
    """A sum of n terms (an Add), each v_i in its own interval of up to 31 bits with per-channel ratios 2^-24..2^12:
    two parts exactly where one part's delta passes SPLIT (or none exists) and two come closer, whatever lower
    threshold is asked (0: the importer's default); the highs'
    sum, the lows' sum minus 2^(b-1), their sum and every shift within CVM's rules; its integer steps equal
    round_half_up(sum_i v_i m_i / 2^k) on integers across the intervals, within 1/2 + delta of sum_i v_i M_i.
    Regression: a Sub of terms of ratios ~1300 and ~2300 had no one-part plan and was refused."""
    terms = []
    for _ in range(n):
        width = d.draw(st.integers(1, 30))
        lo, hi = -d.draw(st.integers(0, 1 << width)), d.draw(st.integers(1, 1 << width))
        ratios = d.draw(st.lists(st.floats(2.0**-24, 2.0**12, width=32), min_size=c, max_size=c))
        terms.append((lo, hi, np.array([Fraction(r) for r in ratios], dtype=object)))
    zero = min(max(zero, out[0]), out[1])
    low, high = out[0] - zero, out[1] - zero
    try:
        one = plan(terms, low, high, split_above=None)
    except NoPlan:
        one = None
    try:
        p = plan(terms, low, high, split_above=threshold)
    except NoPlan:
        assert one is None
        return
    if one is not None and one.delta <= SPLIT or not p.split:
        assert same(p, one)
        return
    assert one is None or p.delta < one.delta
    b, k = p.split, p.shift
    labels = [tight(max(-lo, hi, 1)) for lo, hi, _ in terms]
    parts = [(m1.astype(object), m0.astype(object)) for m1, m0 in p.parts]
    for m, (m1, m0) in zip(p.multipliers, parts):
        assert all(0 <= x < 1 << b for x in m0) and all(m1 * (1 << b) + m0 == m.astype(object))

    def chain(ls):
        out_ = ls[0]
        for x in ls[1:]:
            out_ = max(out_, x) + 1
        return out_

    high_label = chain([q + tight(max(m1)) for q, (m1, _) in zip(labels, parts)])
    low_label = chain([q + tight(max(m0)) for q, (_, m0) in zip(labels, parts)])
    assert high_label <= 31 and max(low_label, tight(1 << (b - 1))) + 1 <= 32
    worst = sum(max(-lo, hi, 1) * max(m0) for (lo, hi, _), (_, m0) in zip(terms, parts))
    assert tight(-((-worst) >> b)) <= p.low_precision and p.low_precision + b <= 31
    assert max(high_label, p.low_precision) + 1 <= 32 and 1 <= k - b and p.precision + (k - b) <= 31
    rng = np.random.default_rng(seed)
    vs = [np.concatenate([[lo, hi, 0], rng.integers(lo, hi + 1, 200)]).clip(lo, hi).astype(object)[:, None]
          for lo, hi, _ in terms]
    highs = sum(v * m1 for v, (m1, _) in zip(vs, parts))
    lows = cvm_shift(sum(v * m0 for v, (_, m0) in zip(vs, parts)) - (1 << (b - 1)), b, p.low_precision)
    r = cvm_shift(highs + lows, k - b, p.precision)
    exact_sum = sum(v * m.astype(object) for v, m in zip(vs, p.multipliers))
    want = np.vectorize(lambda x: round_half_up(Fraction(x, 1 << k)), otypes=[object])(exact_sum)
    assert np.array_equal(r, np.clip(want, -precision_bound(p.precision), precision_bound(p.precision)))
    exact = sum(v * t[2][None, :] for v, t in zip(vs, terms))
    inside = (exact >= low - 1) & (exact <= high + 1)
    assert all(abs(a - e) <= Fraction(1, 2) + p.delta for a, e in zip(want[inside], exact[inside]))


def test_two_part_is_the_default_and_one_part_is_asked_for_on_the_command_line(tmp_path):
    """`convert` imports the detector spread in one plan in parts (the default, three parts: two leave delta 0.0049
    above FINER; `--two-part` is the same); with `--one-part`, one-part runs of channels (takes)."""
    s_out = 0.05
    m = qdq([h.make_node("DequantizeLinear", ["x", "s", "z"], ["f"], axis=1),
             h.make_node("QuantizeLinear", ["f", "so", "zo"], ["y"])], (1, 3, 4), T.INT32,
            {"s": np.array([0.00039, 0.0029, 0.029], np.float32) * np.float32(s_out), "z": np.zeros(3, np.int32),
             "so": np.float32(s_out), "zo": np.array(128, np.uint8)}, T.UINT8)
    onnx.save(m, tmp_path / "q.onnx")
    nodes = {}
    for flag in ([], ["--two-part"], ["--one-part"]):
        out = tmp_path / (flag[0][2:] if flag else "default")
        assert main(["convert", str(tmp_path / "q.onnx"), "-o", str(out), "--input-precision", "22", *flag]) == 0
        nodes[tuple(flag)] = [n.op for n in load(out).graph.nodes]
    assert nodes[()] == nodes[("--two-part",)] and nodes[()].count("broadcast_mul") == 3 and "take" not in nodes[()]
    assert "take" in nodes[("--one-part",)]
