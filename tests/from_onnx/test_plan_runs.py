"""The runs of channels (requant_plans.runs) order the channels by their floats and compare Fractions only where
floats tie: the runs equal those of the exact planner that sorts the Fractions themselves (kept here as the oracle),
over random channel spreads with repeated ratios and ratios whose floats are equal."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cvm_onnx.converters.from_onnx.requant_plans import SPLIT, NoPlan, Plan, Run, _even, plan, runs

f32 = st.floats(2.0**-30, 2.0**4, width=32).map(Fraction)


def oracle(lo: int, hi: int, ms: np.ndarray, low: int, high: int, target: Fraction,
           split_above: Fraction | None) -> list[Run]:
    """The runs as defined: channels sorted by their exact M, each run the prefix of the rest the bisection over
    prefix lengths finds (planned exactly by ``plan``), its delta at most ``target`` or its first channel's."""
    order = sorted(range(len(ms)), key=lambda i: ms[i])

    def attempt(part: list[int], bound: Fraction) -> Plan | None:
        try:
            p = plan([(lo, hi, np.array([ms[i] for i in part], dtype=object))], low, high, split_above)
        except NoPlan:
            return None
        return p if p.delta <= bound else None

    out, i = [], 0
    while i < len(order):
        found = attempt(order[i:i + 1], Fraction(1, 2))
        if found is None:
            raise NoPlan(f"channel {order[i]}")
        bound = max(target, found.delta)
        end, a, b = i + 1, i + 2, len(order)
        while a <= b:
            mid = (a + b) // 2
            p = attempt(order[i:mid], bound)
            if p is None:
                b = mid - 1
            else:
                end, found, a = mid, p, mid + 1
        out.append(Run(np.array(order[i:end], np.int64), found))
        i = end
    return out


def same(a: list[Run], b: list[Run]) -> bool:
    def key(p: Plan):
        return (p.clip, p.pre_shift, p.pre_precision, [m.tolist() for m in p.multipliers], p.shift, p.precision,
                p.delta, p.split, p.low_precision, p.even)

    return len(a) == len(b) and all(x.channels.tolist() == y.channels.tolist() and key(x.plan) == key(y.plan)
                                    for x, y in zip(a, b))


@settings(max_examples=60, deadline=None)
@given(base=st.lists(f32, min_size=1, max_size=24), twins=st.lists(st.tuples(st.integers(0, 23), st.integers(-3, 3)),
                                                                  max_size=6),
       bound=st.integers(1, 1 << 24), out=st.sampled_from([(-128, 127), (0, 255)]),
       target=st.sampled_from([Fraction(1, 2), Fraction(1, 64)]), split=st.sampled_from([None, SPLIT, Fraction(0)]),
       seed=st.integers(0, 2**32 - 1))
@example(base=[Fraction(1, 3)], twins=[(0, 1), (0, -1), (0, 0)], bound=1 << 20, out=(-128, 127),
         target=Fraction(1, 64), split=None, seed=0).via("three ratios of one float, one repeated")
def test_runs_equal_the_exact_orders_runs(base, twins, bound, out, target, split, seed):
    """Channels drawn from float32 ratios (1e-9 to 16: spreads runs must cut), repeated ones, and twins 2^-100
    apart (equal floats, different Fractions), in random order."""
    ms = list(base) + [base[i % len(base)] + Fraction(d, 1 << 100) for i, d in twins]
    ms = [ms[i] for i in np.random.default_rng(seed).permutation(len(ms))]
    arr = np.array(ms, dtype=object)
    try:
        want = oracle(-bound, bound, arr, *out, target, split)
    except NoPlan:
        want = None
    try:
        got = runs(-bound, bound, arr, *out, target, split)
    except NoPlan:
        got = None
    assert (got is None) == (want is None)
    assert got is None or same(got, want)


@settings(max_examples=60, deadline=None)
@given(dyadic=st.lists(st.tuples(st.integers(1, 1 << 12), st.integers(0, 20)), min_size=1, max_size=4),
       other=st.lists(f32, max_size=3), bound=st.integers(1, 1 << 16))
def test_ties_are_planned_only_for_ratios_p_over_a_power_of_two(dyadic, other, bound):
    """_even's plan exists only where every M is p / 2^a: a ratio with another denominator (a float32 ratio that
    is not dyadic) leaves it to the usual plan."""
    ms = [Fraction(p, 1 << a) for p, a in dyadic] + [x for x in other if x.denominator & (x.denominator - 1)]
    p = _even([(-bound, bound, np.array(ms, dtype=object))], -128, 127, 8)
    if len(ms) > len(dyadic):
        assert p is None
    elif p is not None:
        assert p.delta == 0 and [int(m) for m in p.multipliers[0]] == [int(x * (1 << p.shift)) for x in ms]
