"""The planners compute in Python integers (requant_plans.py, quantized/norm.py): each plan's multipliers and delta equal
their definitions evaluated in Fractions, over ratios with different denominators (float32 scales, 1 / count),
shared ratios and sums of terms; ``exact_max`` is the exact maximum where floats tie."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from cvm_onnx.converters.from_onnx.quantized.norm import layernorm_plan
from cvm_onnx.converters.from_onnx.requant_plans import SPLIT, NoPlan, distinct, exact_max, plan, round_half_up
from cvm_onnx.core.ops.elemwise import round_shift

SETTINGS = settings(max_examples=60, deadline=None)
f32 = st.floats(2.0**-40, 2.0**6, width=32).map(Fraction)
ratio = st.one_of(f32, st.integers(1, 9).map(lambda c: Fraction(1, c)))


@SETTINGS
@given(pairs=st.lists(st.tuples(st.integers(-(1 << 200), 1 << 200), st.integers(1, 1 << 200)), max_size=8),
       near=st.integers(0, 3), shift=st.integers(60, 200))
@example(pairs=[(1, 3)], near=2, shift=100).via("quotients one 2^-100 apart: the same float")
def test_exact_max_is_the_largest_fraction(pairs, near, shift):
    """exact_max over any quotients, with ``near`` more that differ from the first by 2^-shift (equal floats)."""
    if pairs:
        a, b = pairs[0]
        pairs = pairs + [((a << shift) + i, b << shift) for i in range(-near, near + 1)]
    nums, dens = [a for a, _ in pairs], [b for _, b in pairs]
    assert exact_max(nums, dens) == max((Fraction(a, b) for a, b in pairs), default=Fraction(0))


def one_part_delta(ms, m, s: int, k: int, b1: int) -> Fraction:
    """docs/import.md's delta of a one-part plan: max M 2^(s-1) [s > 0] + B1 |m / 2^k - M 2^s|."""
    return max((Fraction(1 << s, 2) * x if s else 0) + b1 * abs(Fraction(int(mi), 1 << k) - x * (1 << s))
               for x, mi in zip(ms, m))


@SETTINGS
@given(pool=st.lists(st.one_of(ratio, st.integers(1, 1 << 70)), min_size=1, max_size=6), d=st.data())
def test_distinct_values_index_back_to_every_element(pool, d):
    """``distinct``: values[index] equals the array, element by element (objects shared, or equal values made
    apart: a Fraction and its copy, an int and the Fraction of it), the values pairwise unequal and in order of first
    appearance."""
    shape = d.draw(st.lists(st.integers(1, 4), max_size=3))
    picks = d.draw(st.lists(st.tuples(st.integers(0, len(pool) - 1), st.booleans()), min_size=math.prod(shape),
                            max_size=math.prod(shape)))
    ms = np.empty(len(picks), dtype=object)
    ms[:] = [Fraction(pool[i]) if copy else pool[i] for i, copy in picks]
    ms = ms.reshape(shape)
    values, index = distinct(ms)
    assert index.shape == ms.shape and [values[i] for i in index.flat] == list(ms.flat)
    first = list(dict.fromkeys(Fraction(v) for v in ms.flat))
    assert [Fraction(v) for v in values] == first


@SETTINGS
@given(lo=st.integers(-(1 << 30), 0), hi=st.integers(0, 1 << 30), ratios=st.lists(ratio, min_size=1, max_size=10),
       repeat=st.booleans(), out=st.sampled_from([(-128, 127), (0, 255), (-32768, 32767)]),
       split=st.sampled_from([None, SPLIT, Fraction(1, 2)]))
@example(lo=-7001505, hi=43109, ratios=[Fraction(1.5405103408194787e-12)], repeat=False, out=(-128, 127),
         split=None).via("a pre-shift (s = 20)")
def test_a_single_terms_plan_is_its_definition_in_fractions(lo, hi, ratios, repeat, out, split):
    """m_i = round_half_up(M_i 2^(s+k)) and delta as defined, for per-channel ratios with any denominators (some
    repeated: planned once per distinct ratio)."""
    ms = ratios + ratios[:2] if repeat else ratios
    try:
        p = plan([(lo, hi, np.array(ms, dtype=object))], *out, split)
    except NoPlan:
        return
    [m] = p.multipliers
    t = p.pre_shift + p.shift
    assert [int(v) for v in m] == [round_half_up(x * (1 << t)) for x in ms]
    clip = p.clip or (lo, hi)
    b = max(-clip[0], clip[1], 1)
    b1 = round_shift(b, p.pre_shift) if p.pre_shift else b
    assert p.delta == one_part_delta(ms, m, p.pre_shift, p.shift, b1)


@SETTINGS
@given(terms=st.lists(st.tuples(st.integers(1, 1 << 20), st.lists(st.floats(2.0**-14, 2.0**-6, width=32)
                                                                    .map(Fraction), min_size=1, max_size=3)),
                      min_size=2, max_size=3),
       split=st.sampled_from([None, SPLIT]))
def test_a_sums_plan_is_its_definition_in_fractions(terms, split):
    """Several terms: m_i = round_half_up(M_i 2^k) and delta = sum_i B_i max |m_i / 2^k - M_i|."""
    given_terms = [(-b, b, np.array(ms, dtype=object)) for b, ms in terms]
    try:
        p = plan(given_terms, -128, 127, split)
    except NoPlan:
        return
    for (_, ms), m in zip(terms, p.multipliers):
        assert [int(v) for v in m.flat] == [round_half_up(x * (1 << p.shift)) for x in ms]
    assert p.delta == sum(max(b * abs(Fraction(int(mi), 1 << p.shift) - x) for x, mi in zip(ms, m.flat))
                          for (b, ms), m in zip(terms, p.multipliers))


@settings(max_examples=25, deadline=None)
@given(n=st.sampled_from([2, 7, 64, 384]), lo=st.integers(-128, 0), w=st.integers(1, 255),
       s=st.floats(2.0**-8, 1.0, width=32), s_out=st.floats(2.0**-6, 1.0, width=32),
       spread=st.floats(0.0, 3.0), seed=st.integers(0, 2**31))
@example(n=384, lo=-128, w=255, s=0.027, s_out=2.0**-6, spread=3.0, seed=0).via("gamma up to ~700 steps: saturating")
def test_a_layernorm_plans_multipliers_and_delta_are_their_definitions(n, lo, w, s, s_out, spread, seed):
    """m_i = round_half_up(gamma_i 2^(k-F+j) / s_out), B_i = round_half_up(beta_i 2^k / s_out) and delta =
    max_i |c_i| err + nb |m_i / 2^k - c_i| + |B_i / 2^k - beta_i / s_out| (c_i = gamma_i / (s_out 2^(F-j)),
    err = E / 2^j + 1 or 2, E the bound level_table gives the plan's table), betas clamped as the plan does; a
    saturating plan (gamma of many steps): m_i at k + s bits and, per position, the lesser of that (+ 2^-k) and
    A_i (|mu_i| eps + |mu_i - c_i|) / |c_i| + |mu_i| e_t + |B_i / 2^k - beta_i / s_out| + 2^-k (docs/import.md)."""
    from cvm_onnx.converters.from_onnx.quantized.norm import level_table

    rng = np.random.default_rng(seed)
    so = Fraction(s_out)
    gamma = np.array([Fraction(float(np.float32(x))) / so for x in 1 + spread * rng.normal(size=n)], dtype=object)
    beta = np.array([Fraction(float(np.float32(x))) / so for x in rng.normal(size=n)], dtype=object)
    eps = Fraction(1, 100000)
    try:
        p = layernorm_plan(n, lo, lo + w, Fraction(s), eps, gamma, beta, -131, 124)
    except NoPlan:
        return
    v_max = n * n * w * w // 4
    g = float(eps * n * n / (Fraction(s) * Fraction(s)))
    _, worst, rel = level_table(n, v_max, g, p.table_bits, p.levels, p.frac_bits, p.split)
    e_t = 2 if p.split else 1
    err = Fraction(worst) / (1 << p.extra) + e_t
    c = [x / (1 << (p.frac_bits - p.extra)) for x in gamma]
    sg = p.gamma_split
    assert list(p.multipliers) == [round_half_up(x * (1 << (p.shift + sg))) for x in c]
    root = math.isqrt(n - 1) + 1  # the plan clamps far betas (they saturate either way): as layernorm_plan
    clamped = [max(-lim, min(lim, b)) for gi, b in zip(gamma, beta) for lim in [abs(gi) * root + 255 + 2]]
    assert list(p.offsets) == [round_half_up(x * (1 << p.shift)) for x in clamped]

    def bound(ci, mi, bi, b):
        mu, off = Fraction(int(mi), 1 << (p.shift + sg)), abs(Fraction(int(bi), 1 << p.shift) - b)
        if not p.saturating:
            return abs(ci) * err + p.n_bound * abs(mu - ci) + off
        off += Fraction(1, 1 << p.shift) if sg else 0
        plain = abs(ci) * err + p.n_bound * abs(mu - ci) + off
        reach = max(124 - b, b + 131) + 1
        return min(plain, reach * (abs(mu) * Fraction(rel) + abs(mu - ci)) / abs(ci) + abs(mu) * e_t + off) \
            if ci else plain

    assert p.delta == max(bound(*q) for q in zip(c, p.multipliers, p.offsets, clamped))


@SETTINGS
@given(want=st.one_of(f32, st.integers(1, 1 << 20).map(lambda k: Fraction(k, 1 << 170))),
       off=st.sampled_from([-1, 0, 1]), rel=st.booleans(), jitter=st.integers(-3, 3))
@example(want=Fraction(3, 1 << 10), off=0, rel=True, jitter=0).via("exactly want / 2^22 off: kept")
@example(want=Fraction(3, 1 << 170), off=0, rel=False, jitter=0).via("exactly 2^-149 off a denormal's: kept")
def test_the_bias_scale_check_is_its_definition(want, off, rel, jitter):
    """bias_values (integers) refuses a bias scale exactly where |have - want| > max(want / 2^22, 2^-149), tried at
    either bound, one unit of 2^-200 either side, and near it."""
    from onnx import TensorProto

    from cvm_onnx.converters.from_onnx.context import const
    from cvm_onnx.converters.from_onnx.quantized.products import bias_values
    from cvm_onnx.converters.from_onnx.quantized.values import Scaled
    from cvm_onnx.converters.from_onnx.registry import Refuse

    bound = want / (1 << 22) if rel else Fraction(1, 1 << 149)
    have = want + (bound + Fraction(off, 1 << 200)) * (1 if jitter >= 0 else -1) * (1 + Fraction(jitter, 1 << 30))
    bias = Scaled(const(np.array([3], np.int64), TensorProto.INT32), np.array([have], dtype=object), np.zeros((), np.int64))
    try:
        bias_values(bias, np.array([want], dtype=object), 1)
        refused = False
    except Refuse:
        refused = True
    assert refused == (abs(have - want) > max(want / (1 << 22), Fraction(1, 1 << 149)))


def saturating_bound(c, mu, off, a, err, eps, e_t, nb):
    """One position's bound of a saturating plan (docs/import.md), in Fractions."""
    plain = abs(c) * err + nb * abs(mu - c) + off
    return min(plain, a * (abs(mu) * eps + abs(mu - c)) / abs(c) + abs(mu) * e_t + off) if c else plain


fraction = st.one_of(st.just(Fraction(0)), f32, f32.map(lambda x: -x), st.integers(-(1 << 40), 1 << 40).map(Fraction),
                     st.sampled_from([Fraction(1, 1 << 1000), Fraction(-3, 1 << 1070), Fraction(1 << 1020)]))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(gb=st.lists(st.tuples(fraction, fraction), min_size=1, max_size=12), near=st.booleans(),
       k=st.integers(1, 30), s=st.integers(0, 20), u=st.integers(0, 40), nb=st.integers(1, 1 << 30),
       err=f32, eps=f32, e_t=f32, seed=st.integers(0, 2**31))
def test_the_saturating_delta_is_its_definition(gb, near, k, s, u, nb, err, eps, e_t, seed):
    """saturating_delta (integers over each position's denominator, the float64 candidates first) is the largest
    position's bound in Fractions, for any gamma and beta (0, tiny, huge, far out of float64's range), multipliers
    and offsets near their roundings or anywhere, and positions whose bounds differ by far less than a float's
    step (``near``)."""
    from cvm_onnx.converters.from_onnx.quantized.norm import saturating_delta

    rng = np.random.default_rng(seed)
    if near:
        g, b = gb[0]
        gb = gb + [(g + Fraction(i, 1 << 80), b) for i in (-1, 1)] + [(g, b - Fraction(i, 1 << 90)) for i in (1, 2)]
    gamma = np.array([g for g, _ in gb], dtype=object)
    beta = np.array([b for _, b in gb], dtype=object)
    ms = [round_half_up(g * (1 << (k + s - u)) if k + s >= u else g / (1 << (u - k - s))) + int(rng.integers(-2, 3))
          for g in gamma]
    bs = [round_half_up(b * (1 << k)) + int(rng.integers(-2, 3)) for b in beta]
    assume(max(map(abs, ms + bs)) < 1 << 31)  # the plan's multipliers and offsets: within 31 bits
    reach = [max(124 - b, b + 131) + 1 for b in beta]
    floats = (*(np.array([float(x) if abs(x) < 1e300 else math.inf for x in v]) for v in (gamma, beta, reach)),
              np.array([x == 0 for x in gamma], bool))
    got = saturating_delta(gamma, beta, ms, bs, reach, (k, s, u), nb, (err, eps, e_t), floats)
    rest = Fraction(1, 1 << k) if s else 0
    want = max(saturating_bound(g / (1 << u), Fraction(m, 1 << (k + s)), abs(Fraction(bi, 1 << k) - b) + rest, a,
                                err, eps, e_t, nb) for g, m, bi, b, a in zip(gamma, ms, bs, beta, reach))
    assert got == want


def test_a_wide_rows_plan_over_many_distinct_pairs_takes_seconds():
    """A LayerNormalization over 16390 int8 values (the wide form) with 4080 distinct (gamma, beta) pairs, gamma of
    up to 127 steps (saturating plans): planned in seconds of CPU time (each try's bound over every pair in Python
    integers, only the pairs whose float64 bound may be the largest in exact terms). Regression: 14 s of CPU time
    (16320 pairs: 49 s, past 300 s on a loaded machine, a hang in the fuzzer), each pair's bound taken in
    Fractions for every try."""
    import time

    n, s, s_out = 16390, Fraction(float(np.float32(0.01))), Fraction(float(np.float32(0.05)))
    g, b = np.arange(n) % 255 - 127, np.arange(n) // 255 % 16
    gamma = np.array([int(x) * Fraction(float(np.float32(0.01))) / s_out for x in g], dtype=object)
    beta = np.array([int(x) * s * Fraction(float(np.float32(0.01))) / s_out for x in b], dtype=object)
    start = time.process_time()
    p = layernorm_plan(n, -131, 124, s, Fraction(float(np.float32(1e-5))), gamma, beta, -128, 127)
    assert p.wide and p.delta < Fraction(1, 2)
    assert time.process_time() - start < 6
