"""The runs of channels (requant_plans.runs) take the channels in ``channel_order``: by their floats, Fractions
compared only where floats tie; that order is the exact one (the Fractions sorted, ties in channel order) over
random channel spreads with repeated ratios and ratios whose floats are equal."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cvm_onnx.converters.from_onnx.requant_plans import _even, channel_order

f32 = st.floats(2.0**-30, 2.0**4, width=32).map(Fraction)


@settings(max_examples=200, deadline=None)
@given(base=st.lists(f32, min_size=1, max_size=24), twins=st.lists(st.tuples(st.integers(0, 23), st.integers(-3, 3)),
                                                                  max_size=6), seed=st.integers(0, 2**32 - 1))
@example(base=[Fraction(1, 3)], twins=[(0, 1), (0, -1), (0, 0)], seed=0).via("three ratios of one float, one repeated")
def test_the_channel_order_is_the_exact_order(base, twins, seed):
    """Channels drawn from float32 ratios (1e-9 to 16), repeated ones, and twins 2^-100 apart (equal floats,
    different Fractions), in random order: sorted as the Fractions themselves sort, equal ones in channel order."""
    ms = list(base) + [base[i % len(base)] + Fraction(d, 1 << 100) for i, d in twins]
    ms = [ms[i] for i in np.random.default_rng(seed).permutation(len(ms))]
    assert channel_order(np.array(ms, dtype=object)) == sorted(range(len(ms)), key=lambda i: ms[i])


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
