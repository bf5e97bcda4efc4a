"""Requantization in integers: y = round(sum_i v_i * M_i) for integers v_i in known intervals and exact rational
ratios M_i > 0 (scalars or per-channel arrays), as CVM computes it within its 32-bit precision rules.

The form (docs/import.md, "Requantization"), for one term v with ratio M:

    v' = clip(v, a_lo, a_hi)                           only where the interval of v passes the clip
    v1 = round_half_up(v' / 2^s)                       cvm_right_shift(s), only when s > 0
    r  = round_half_up(v1 * m / 2^k)                   broadcast_mul by m (per channel), cvm_right_shift(k)

with m = round_half_up(M * 2^(s+k)). Several terms (an Add of tensors of different scales) share k and have no
clip or pre-shift: r = round_half_up(sum_i v_i * m_i / 2^k). ``plan`` picks the clip, s, k and m:

* the clip: beyond [a_lo, a_hi] the result saturates anyway (every step is monotone), so clipping there changes
  nothing and bounds |v'| by about (output range) / M instead of the accumulator's static bound;
* the precision rules: label(v1) + label(m) <= 32 (broadcast_mul), and label(r) + k < 32 (so the runtime's CPU
  device clips as FORMAL does);
* the error: |v1 * m / 2^k - v * M| <= delta = M * 2^(s-1) [s > 0] + B1 * |m / 2^k - M * 2^s| per channel
  (B1 bounds |v1|); ``plan`` minimises delta over s, with the largest k the rules allow for each s.

So |r - v * M| <= 1/2 + delta, and r differs from round(v * M) by at most one, only where v * M lies within
delta of a half-integer. ``plan`` refuses when delta >= 1/2 (the clip's argument needs it).

A term that has no one-part plan, or (``two_part``, the importer's default) whose one-part delta is not 0, is
also planned in two parts (``_split``): m = m1 2^b + m0 (0 <= m0 < 2^b), r = cvm_right_shift(v1 m1
+ floor(v1 m0 / 2^b), k - b) with floor(p0 / 2^b) = cvm_right_shift(p0 - 2^(b-1), b), which equals
round_half_up(v1 m / 2^k) exactly; b = 30 - label(v1) and label(v1) + label(m1) <= 31 keep every product and sum
within 32 bits, so m gets about 61 - 2 label(v1) bits. The closer of the two plans is kept; delta's formula is the same. A sum splits every m_i at one b
(``_several_split``): the highs and the lows summed apart, then the same two shifts. Where two parts leave delta
above ``FINER``, a single term is also planned in three (``MAX_PARTS``): m split at b_0 = 30 - label(v1) and b_1 =
29 - label(v1) from the bottom, t_0 = floor(v1 m_0 / 2^(b_0)), t_1 = floor((v1 m_1 + t_0) / 2^(b_1)), r =
cvm_right_shift(v1 m_top + t_1, k - B) with B = b_0 + b_1 <= 31: the same integers by nested floors
(docs/import.md, "Products in n parts"), m of about 91 - 3 label(v1) bits.

Ties (``_even``): where every M_i is p_i / 2^(a_i) exactly and some v meets a tie (v M = n + 1/2), the plan is
exact (s = 0, m_i = M_i 2^k, k = max a_i, delta = 0) and rounds half to even as QuantizeLinear does:
r = cvm_right_shift(t + 2^(k-1) - 1, k + 1) + cvm_right_shift(t - 2^(k-1), k + 1) = round_half_even(t / 2^k) for
t = sum_i v_i m_i (docs/import.md, "Ties"). Elsewhere ties are unreachable or the planned product decides them.

Per-channel ratios spread too widely for one shift and one clip (the precision rules bound the product's label by
the largest multiplier and the widest clipped channel together) are cut into runs (``runs``): channels sorted by
M, each run the longest prefix of the rest that one plan requantizes within the bound, requantized as a tensor of
its own (the importer takes its channels out and puts the results back in order). With a ``target`` below 1/2
(the importer's FINE), runs also cut a plan that exists but is coarse: each run's delta at most the target, or its
first channel's own where that is larger.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from cvm_onnx.core.constants import tight
from cvm_onnx.core.ops.elemwise import round_shift
from cvm_onnx.core.ops.registry import bits

MAX_SHIFT = 31
#: A sum (``_several``) is planned in two parts only where its one-part plan's delta passes this, whatever
#: ``split_above`` asks (docs/import.md, "Two-part products": below it a sum's two parts moved no measured output,
#: and the serving form does not fuse them).
SPLIT = Fraction(1, 1024)
#: A single term is planned in more than two parts (up to ``MAX_PARTS``) only where its closest plan in fewer parts
#: leaves delta above this (docs/import.md, "Products in n parts").
FINER = Fraction(1, 1 << 20)
MAX_PARTS = 3


def round_half_up(x: Fraction) -> int:
    return math.floor(x + Fraction(1, 2))


@dataclass(frozen=True)
class Plan:
    """How ``r = round(sum_i v_i * M_i)`` is computed: an optional clip of the single term, its pre-shift,
    multipliers (int64 arrays shaped like the M_i), the final shift and precision, and the worst error."""

    clip: tuple[int, int] | None
    pre_shift: int
    pre_precision: int
    multipliers: tuple[np.ndarray, ...]
    shift: int
    precision: int
    delta: Fraction  # worst |v1 * m / 2^k - v * M| (before the final rounding), in output steps
    split: int = 0  # B > 0: each product in parts, m = m_top 2^B + (m mod 2^B)
    widths: tuple[int, ...] = ()  # the levels' shifts b_0, b_1, ... (summing to B): n - 1 of them for n parts
    lows: tuple[int, ...] = ()  # each level's precision: the label of floor(sum_i v_i (m_i mod 2^B_j) / 2^B_j)
    even: int = 0  # > 0: m / 2^k = M exactly and r rounds half to even (``_even``); the two shifts' precision

    @property
    def low_precision(self) -> int:
        """The last level's precision (the label of floor(sum_i v_i (m_i mod 2^B) / 2^B)), 0 for one part."""
        return self.lows[-1] if self.lows else 0

    @property
    def parts(self) -> list[tuple[np.ndarray, ...]]:
        """Each term's parts, the top first: (m_top, ..., m_1, m_0) with m = sum_j m_j 2^(b_0 + ... + b_(j-1)),
        0 <= m_j < 2^(b_j) below the top, for a split plan (two parts: (m1, m0), m = m1 2^b + m0)."""
        starts = [sum(self.widths[:j]) for j in range(len(self.widths))]
        return [(m >> self.split, *((m >> a) & ((1 << w) - 1) for a, w in reversed(list(zip(starts, self.widths)))))
                for m in self.multipliers]

    @property
    def error(self) -> float:
        """The worst |r - v * M| in output steps: the final rounding's 1/2 plus delta."""
        return float(Fraction(1, 2) + self.delta)


@dataclass(frozen=True)
class Run:
    """The channels (indices along the per-channel axis, ascending M) that one plan requantizes."""

    channels: np.ndarray
    plan: Plan


def distinct(ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, index) with values[index] == ms: the distinct values (Fractions or ints, keyed by numerator and
    denominator: a Fraction's hash costs a modular inverse) of the object array ``ms``, in order of first
    appearance, and each element's index among them. Each distinct object is read once, so a scale per position
    that repeats a few objects (a Resize's) costs a lookup of its identity per element."""
    flat = np.asarray(ms, dtype=object).reshape(-1)
    ids = np.frompyfunc(id, 1, 1)(flat).astype(np.int64)
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # the objects in order of first appearance
    at: dict[tuple[int, int], int] = {}
    merged = np.array([at.setdefault((x.numerator, x.denominator), len(at)) for x in flat[first[order]]], np.int64)
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    values = np.empty(len(at), dtype=object)
    values[merged] = flat[first[order]]
    return values, merged[rank[inverse]].reshape(np.shape(ms))


def _ratios(ms: np.ndarray) -> tuple[list[int], list[int]]:
    """The numerators and denominators of the ratios (Fractions or ints), flat."""
    flat = list(ms.flat)
    return [x.numerator for x in flat], [x.denominator for x in flat]


def _rounded(nums: list[int], dens: list[int], t: int) -> list[int]:
    """round_half_up(N / D 2^t) = floor((2^(t+1) N + D) / 2D) of each ratio N / D, in integers."""
    return [((n << (t + 1)) + d) // (d << 1) for n, d in zip(nums, dens)]


def _multipliers(ms: np.ndarray, k: int) -> np.ndarray:
    return np.array(_rounded(*_ratios(ms), k), dtype=object).reshape(ms.shape)


def exact_max(nums: list[int], dens: list[int]) -> Fraction:
    """The exact max of nums[i] / dens[i] (dens > 0; 0 for none): Python's int / int is correctly rounded, hence
    monotone, so the max is among the quotients whose float equals the largest float."""
    if not nums:
        return Fraction(0)
    if len(set(dens)) == 1:
        return Fraction(max(nums), dens[0])
    approx = [a / b for a, b in zip(nums, dens)]
    top = max(approx)
    return max(Fraction(a, b) for a, b, f in zip(nums, dens, approx) if f == top)


class NoPlan(ValueError):
    """No clip, shift and multipliers meet both the precision rules and the one-step error bound."""


def saturating(lo: int, hi: int, ms: np.ndarray, low: int, high: int) -> tuple[int, int, np.ndarray]:
    """The term (lo, hi, M) with each M at or above c = max(high, -low) + 1 taken as c: round(v M) and v c are both
    0 at v = 0 and, for every other integer v, at least c in size, beyond [low, high], so both clip alike (a
    masked_fill's -3.4e38 calibrated into a grid of scale 1e36 requantized to an ordinary one). Exact."""
    cap = Fraction(max(high, -low) + 1)
    if all(m < cap for m in ms.flat):
        return lo, hi, ms
    return lo, hi, np.array([min(m, cap) for m in ms.flat], dtype=object).reshape(ms.shape)


def plan(terms: list[tuple[int, int, np.ndarray]], low: int, high: int,
         split_above: Fraction | None = None) -> Plan:
    """The requantization of ``sum_i v_i * M_i`` (``terms``: (lo_i, hi_i, M_i) with M_i an object array of
    Fractions > 0) into the output range [low, high] (low <= 0 <= high), for which ``r`` is then clipped. A plan
    with no one-part form, or whose best one-part form has delta above ``split_above`` (a sum's: above ``SPLIT`` at
    least), takes the best two-part form where that is closer; ``split_above`` None: one part only, 1/2: two parts
    only where one part has no plan, 0: wherever two parts are closer."""
    precision = tight(max(-low, high))
    kmax = MAX_SHIFT - precision
    if len(terms) == 1:
        lo, hi, ms = terms[0]
        # each distinct M planned once, the same plan (an AveragePool's count, a Resize's W_o per position repeat)
        values, index = distinct(ms)
        if len(values) < ms.size:
            p = plan([(lo, hi, values)], low, high, split_above)
            return replace(p, multipliers=tuple(m[index] for m in p.multipliers))
        terms = [saturating(lo, hi, ms, low, high)]
    exact = _even(terms, low, high, precision)
    if exact is not None:
        return exact
    if len(terms) == 1:
        lo, hi, ms = terms[0]
        return _single(lo, hi, ms, low, high, precision, kmax, split_above)
    return _several(terms, precision, kmax, split_above)


def _clipped(lo: int, hi: int, ms: np.ndarray, low: int, high: int) -> tuple[tuple[int, int] | None, int, int]:
    """(the clip or None, v's interval after it): beyond a_hi = ceil((high + 1) / min M) and a_lo = floor((low - 1)
    / min M) every rounding of v M saturates."""
    least = min(ms.flat)
    a_hi, a_lo = math.ceil((high + 1) / least), math.floor((low - 1) / least)
    if lo < a_lo or hi > a_hi:  # (a_lo < 0 < a_hi: an interval wholly beyond one keeps a clip of two values)
        lo, hi = min(max(lo, a_lo), a_hi - 1), max(min(hi, a_hi), a_lo + 1)
        return (lo, hi), lo, hi
    return None, lo, hi


def _two_adic(x: Fraction) -> int | None:
    """a with x = p / 2^a (p an integer), or None where x's denominator is not a power of two."""
    d = x.denominator
    return d.bit_length() - 1 if d & (d - 1) == 0 else None


def _tie_in(lo: int, hi: int, a: int) -> bool:
    """Whether [lo, hi] holds an odd multiple of 2^(a-1) (a >= 1): where v p / 2^a (p odd) is a half-integer."""
    h = 1 << (a - 1)
    return (hi // h - (lo - 1) // h) - (hi // (2 * h) - (lo - 1) // (2 * h)) > 0


def _even(terms: list[tuple[int, int, np.ndarray]], low: int, high: int, precision: int) -> Plan | None:
    """The exact plan rounding half to even (docs/import.md, "Ties"), where every M_i is p / 2^a exactly, some v
    meets a tie (one term: v in its clipped interval an odd multiple of 2^(a-1) for some channel's a >= 1; a sum:
    any a >= 1), and the labels allow it: k = the largest a, m_i = M_i 2^k, t = sum_i v_i m_i within 31 bits (so
    t + c fits 32), and precision + k + 1 <= 31 for the two shifts by k + 1. Else None (today's plan)."""
    if any(x.denominator & (x.denominator - 1) for _, _, ms in terms for x in ms.flat):
        return None  # some M_i not p / 2^a (checked before the Fractions are hashed and sorted)
    scales = [sorted(set(ms.flat)) for _, _, ms in terms]
    adic = [_two_adic(x) for xs in scales for x in xs]
    if None in adic or max(adic) == 0 or precision + max(adic) + 1 > MAX_SHIFT:
        return None
    k, clip = max(adic), None
    if len(terms) == 1:
        lo, hi, ms = terms[0]
        clip, lo, hi = _clipped(lo, hi, ms, low, high)
        if not any(_tie_in(lo, hi, a) for a in {_two_adic(x) for x in scales[0]} if a):
            return None
        bounds = [max(-lo, hi, 1)]
    else:
        bounds = [max(-lo, hi, 1) for lo, hi, _ in terms]
    ms = [np.asarray(m * (1 << k), dtype=object).reshape(m.shape) for _, _, m in terms]
    tops = [int(max(m.flat)) for m in ms]
    if _chain([tight(b) + tight(t) for b, t in zip(bounds, tops)]) > 31:
        return None
    big = sum(b * t for b, t in zip(bounds, tops))
    reach = tight(((big + 3 * (1 << (k - 1))) >> (k + 1)) + 1)  # |floor((t + c + 2^k) / 2^(k+1))|, c the adds'
    shifts = max(precision, reach) if max(precision, reach) + k + 1 <= MAX_SHIFT else precision
    p1 = tight(bounds[0]) if len(terms) == 1 else 0
    return Plan(clip, 0, p1, tuple(np.array([int(x) for x in m.flat], np.int64).reshape(m.shape) for m in ms), k,
                precision, Fraction(0), even=shifts)


def _single(lo: int, hi: int, ms: np.ndarray, low: int, high: int, precision: int, kmax: int,
            split_above: Fraction | None) -> Plan:
    least = min(ms.flat)
    clip, lo, hi = _clipped(lo, hi, ms, low, high)
    b = max(-lo, hi, 1)
    shifts = []  # (s, B1, label(v1)) of each allowed pre-shift
    for s in range(0, bits(b) + 1):
        b1 = round_shift(b, s) if s else b
        if not (s and tight(b1) + s >= 32):
            shifts.append((s, b1, tight(b1)))
    best, top = None, max(ms.flat)
    nums, dens = _ratios(ms)
    for s, b1, p1 in shifts:
        if s and best is not None and top * (1 << s) / 2 >= best.delta:
            break  # delta >= M 2^(s-1), which only grows with s
        # the largest k whose largest multiplier (the largest M's: rounding is monotone) keeps the product's label
        k = next((k for k in range(kmax, 0, -1) if p1 + tight(_rounded([top.numerator], [top.denominator], s + k)[0])
                  <= 32), None)
        if k is not None:
            m = np.array(_rounded(nums, dens, s + k), dtype=object).reshape(ms.shape)  # M 2^s 2^k, rounded
            # a multiplier 0 only where |v| M stays below 1/2: delta says so
            delta = _delta(ms, m, s, k, b1, (nums, dens))
            if best is None or delta < best.delta:
                best = Plan(clip, s, p1, (m.astype(np.int64),), k, precision, delta)
    if split_above is not None and (best is None or best.delta > split_above):
        for s, b1, p1 in shifts:
            if s and best is not None and max(ms.flat) * (1 << s) / 2 >= best.delta:
                break  # delta >= M 2^(s-1), which only grows with s
            two = _split(ms, s, b1, p1, clip, precision, kmax)
            if two is not None and (best is None or two.delta < best.delta):
                best = two
    for n in range(3, MAX_PARTS + 1):  # more parts where the closest plan so far passes FINER, while they come closer
        if split_above is None or split_above >= Fraction(1, 2) or best is None or not best.split or \
                best.delta <= FINER:
            break
        closer = None
        for s, b1, p1 in shifts:
            if s and max(ms.flat) * (1 << s) / 2 >= best.delta:
                break
            more = _split(ms, s, b1, p1, clip, precision, kmax, n)
            if more is not None and more.delta < (closer or best).delta:
                closer = more
        if closer is None:
            break
        best = closer
    if best is None or best.delta >= Fraction(1, 2):
        raise NoPlan(f"no multiplier and shift within CVM's 32 bits requantize by M in [{float(least):.3g}, "
                     f"{float(max(ms.flat)):.3g}] within one step")
    return best


def _delta(ms: np.ndarray, m: np.ndarray, s: int, k: int, b1: int,
           ratios: tuple[list[int], list[int]] | None = None) -> Fraction:
    """The worst M 2^(s-1) [s > 0] + B1 |m / 2^k - M 2^s| over the channels, each as the integer
    (N 2^(s+k-1) [s > 0] + B1 |m D - N 2^(s+k)|) over 2^k D for M = N / D (``ratios``: ms's, if known)."""
    nums, dens = ratios or _ratios(ms)
    t = s + k
    half = 1 << (t - 1) if s else 0
    return exact_max([n * half + b1 * abs(int(mi) * d - (n << t)) for n, d, mi in zip(nums, dens, m.flat)],
                    [d << k for d in dens])


def _split(ms: np.ndarray, s: int, b1: int, p1: int, clip, precision: int, kmax: int, n: int = 2) -> Plan | None:
    """The plan of pre-shift s in n >= 2 parts (None if none): the lowest level's width b_0 = 30 - label(v1), the
    largest the add of -2^(b_0-1) to v1 m_0 allows (m_0 < 2^b_0), each further level's b_j = 29 - label(v1) (its
    sum v1 m_j + t_(j-1) - 2^(b_j-1) within 32 bits); for n >= 3, B = sum b_j <= 31 (the serving form's one
    ``mul64`` holds it); the largest k with k - B <= kmax and label(v1) + label(m_top) <= 31, where every level's
    labels hold (``_levels``)."""
    widths = [30 - p1] + [29 - p1] * (n - 2)
    total = sum(widths)
    if min(widths) < 1 or n > 2 and total > 31:
        return None
    top = max(ms.flat)
    for k in range(total + kmax, total, -1):
        if p1 + tight(_rounded([top.numerator], [top.denominator], s + k)[0] >> total) <= 31:  # the largest M's m
            m = _multipliers(ms, s + k)  # M 2^s 2^k, rounded
            lows = _levels([(b1, p1, m)], widths)
            if lows is None:
                return None
            return Plan(clip, s, p1, (m.astype(np.int64),), k, precision, _delta(ms, m, s, k, b1), total,
                        tuple(widths), lows)
    return None


def _levels(terms: list[tuple[int, int, np.ndarray]], widths: list[int]) -> tuple[int, ...] | None:
    """Each level's precision for terms (B_i >= |v_i|, label(v_i), m_i) split at ``widths`` (docs/import.md,
    "Products in n parts"), or None where a label passes the rules: level j sums P_j = sum_i v_i m_ij (m_ij =
    (m_i >> B_j) mod 2^(b_j), B_j = b_0 + ... + b_(j-1)), adds t_(j-1) (j > 0) and -2^(b_j-1), each within 32
    bits, and t_j = cvm_right_shift of it by b_j into the label of its bound ceil((sum_i B_i max m_ij + T_(j-1)) /
    2^(b_j)), that label + b_j <= 31."""
    lows, bound, start = [], 0, 0
    for j, b in enumerate(widths):
        parts = [(x, p, int(max(int(v) >> start & ((1 << b) - 1) for v in m.flat))) for x, p, m in terms]
        label = _chain([p + tight(mj) for _, p, mj in parts])
        if j:
            label = max(label, lows[-1]) + 1
        if max(label, tight(1 << (b - 1))) + 1 > 32:
            return None
        bound = -(-(sum(x * mj for x, _, mj in parts) + bound) >> b)
        lows.append(tight(bound))
        if lows[-1] + b > 31:
            return None
        start += b
    return tuple(lows)


def _several(terms: list[tuple[int, int, np.ndarray]], precision: int, kmax: int,
             split_above: Fraction | None) -> Plan:
    bounds = [max(-lo, hi, 1) for lo, hi, _ in terms]
    best = None
    for k in range(kmax, 0, -1):
        ms = [_multipliers(m, k) for _, _, m in terms]
        if _chain([tight(b) + tight(max(m.flat)) for b, m in zip(bounds, ms)]) > 32:
            continue
        delta = _sum_delta(terms, bounds, ms, k)
        if delta < Fraction(1, 2):
            best = Plan(None, 0, 0, tuple(m.astype(np.int64) for m in ms), k, precision, delta)
        break
    if split_above is not None and (best is None or best.delta > max(split_above, SPLIT)):
        two = _several_split(terms, bounds, precision, kmax)
        if two is not None and (best is None or two.delta < best.delta):
            best = two
    if best is None:
        raise NoPlan("no common shift within CVM's 32 bits requantizes the sum within one step")
    return best


def _chain(labels: list[int]) -> int:
    """The label of the sum of terms of these labels, added left to right (broadcast_add: max + 1)."""
    out = labels[0]
    for p in labels[1:]:
        out = max(out, p) + 1
    return out


def _sum_delta(terms, bounds: list[int], ms: list[np.ndarray], k: int) -> Fraction:
    """sum_i B_i |m_i / 2^k - M_i|, each term's worst channel (B_i |m_i D - N 2^k| over 2^k D for M_i = N / D)."""
    return sum((_delta(t[2], m, 0, k, b) for b, t, m in zip(bounds, terms, ms)), Fraction(0))


def _several_split(terms, bounds: list[int], precision: int, kmax: int) -> Plan | None:
    """A sum's two-part plan (None if none or delta >= 1/2): the highs v_i m1_i and the lows v_i m0_i summed
    apart, b the largest with the lows' sum minus 2^(b-1) within 32 bits, k the largest with the highs' sum plus
    floor(lows / 2^b) within 32."""
    labels = [tight(b) for b in bounds]
    b = 31 - _chain([p + 1 for p in labels])
    if b < 1:
        return None
    tops = [max(m.flat) for _, _, m in terms]
    for k in range(b + kmax, b, -1):
        high = _chain([p + tight(round_half_up(t * (1 << k)) >> b) for p, t in zip(labels, tops)])
        if high > 31:
            continue
        ms = [_multipliers(m, k) for _, _, m in terms]
        lows = _levels([(x, p, m) for x, p, m in zip(bounds, labels, ms)], [b])
        delta = _sum_delta(terms, bounds, ms, k)
        if lows is None or max(high, lows[0]) + 1 > 32 or delta >= Fraction(1, 2):
            return None
        return Plan(None, 0, 0, tuple(m.astype(np.int64) for m in ms), k, precision, delta, b, (b,), lows)
    return None


def channel_order(ms: np.ndarray) -> list[int]:
    """The channels sorted by their ratios ``ms`` (Fractions), ties in channel order: by each ratio's float, which
    is monotone (int / int is correctly rounded), the Fractions compared only where floats tie."""
    approx = [float(x) for x in ms]
    return sorted(range(len(ms)), key=lambda i: (approx[i], ms[i]))


def runs(lo: int, hi: int, ms: np.ndarray, low: int, high: int, target: Fraction = Fraction(1, 2),
         split_above: Fraction | None = None) -> list[Run]:
    """The single term v in [lo, hi] times per-channel ratios ``ms`` (1-D, Fractions > 0) as runs of channels, each
    with a plan of its own: channels sorted by M, each run the longest prefix of the rest whose plan's delta is below
    at most ``target`` or its first channel's alone (found by bisection; a prefix is only taken when its plan
    exists, and every plan's delta is below 1/2; ``split_above`` as in ``plan``). Refused only when one channel
    alone has no plan."""
    order = channel_order(ms)

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
            raise NoPlan(f"no multiplier and shift within CVM's 32 bits requantize channel {order[i]} "
                         f"(M = {float(ms[order[i]]):.3g}) within one step")
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


@dataclass(frozen=True)
class FarPlan:
    """round(v M) for v = u + c, u a run-time integer and c a constant beyond 32 bits' reach beside it (a dead
    channel's bias, docs/import.md "Far rows whose output varies"): ``plan``'s one-part form on v (its clip, s, k, m
    and delta over v's interval) computed on u, with c = C1 2^s + c0 (0 <= c0 < 2^s) and C1 m + 2^(k-1) = Q 2^k + e
    (0 <= e < 2^k):

        u1 = cvm_right_shift(u + c0, s)               = round_half_up(v / 2^s) - C1
        r  = cvm_right_shift(u1 m + (e - 2^(k-1)), k) + Q = floor((v1 m + 2^(k-1)) / 2^k)

    ``plan.clip`` bounds u (v's clip less c); ``ratio`` M, ``offset`` c, ``pre_add`` c0, ``add`` e - 2^(k-1),
    ``after`` Q; ``plan.precision`` is the label of the shifted part."""
    plan: Plan
    ratio: Fraction
    offset: int
    pre_add: int
    add: int
    after: int


def far_plan(lo: int, hi: int, c: int, ratio: Fraction, low: int, high: int) -> FarPlan:
    """The ``FarPlan`` of least delta for u in [lo, hi] (int32), the constant c and the ratio M > 0 into [low, high]
    (low <= 0 <= high): for each pre-shift s the largest k with label(u1) + label(m) <= 31 and k <= 30 (the product
    plus its addend within 32 bits) and label(shifted part) + k <= 31, delta = M 2^(s-1) [s > 0] + B1 |m / 2^k -
    M 2^s| with B1 the bound of |v1| = |u1 + C1| (not of u1). NoPlan where delta reaches 1/2 or the clip on u leaves
    int32."""
    ms = np.array([ratio], dtype=object)
    clip, vlo, vhi = _clipped(lo + c, hi + c, ms, low, high)
    ulo, uhi = vlo - c, vhi - c
    if max(-ulo, uhi) > (1 << 31) - 1:
        raise NoPlan("the clip of a far row's accumulator leaves 32 bits")
    best = None
    for s in range(0, MAX_SHIFT):
        if s and best is not None and ratio * (1 << s) / 2 >= best[0].delta:
            break  # delta >= M 2^(s-1), which only grows with s
        c1, c0 = divmod(c, 1 << s)
        a, b = ulo + c0, uhi + c0
        if max(-a, b) > (1 << 31) - 1:
            continue
        u1lo, u1hi = (round_shift(a, s), round_shift(b, s)) if s else (a, b)
        bu = max(-u1lo, u1hi, 1)
        if s and tight(bu) + s >= 32:
            continue
        b1 = max(abs(u1lo + c1), abs(u1hi + c1), 1)
        for k in range(MAX_SHIFT - 1, 0, -1):
            m = _rounded([ratio.numerator], [ratio.denominator], s + k)[0]
            top = (bu * m + (1 << k)) >> k  # |floor((u1 m + e) / 2^k)| <= top
            if tight(bu) + tight(m) > 31 or k > 30 or tight(top) + k > MAX_SHIFT:
                continue
            delta = _delta(ms, np.array([m], dtype=object), s, k, b1)
            p = Plan((ulo, uhi) if clip is not None else None, s, tight(bu), (np.array([m], np.int64),), k,
                     tight(top), delta)
            if best is None or delta < best[0].delta:
                q, e = divmod(c1 * m + (1 << (k - 1)), 1 << k)
                best = (p, ratio, c, c0, e - (1 << (k - 1)), q)
            break
    if best is None or best[0].delta >= Fraction(1, 2):
        raise NoPlan(f"no multiplier and shift within CVM's 32 bits requantize M = {float(ratio):.3g} over values "
                     f"reaching {max(abs(lo + c), abs(hi + c))} within one step")
    return FarPlan(*best)


@dataclass(frozen=True)
class SoftmaxPlan:
    """Softmax in integers (docs/import.md, "Softmax"), for d = max - x >= 0 along the axis: the tables
    E[k] = round(2^F exp(-k s)) split as H = floor(E / 2^b) and L = E - 2^b H, and T[k] = round(2^(F-b) q exp(-k s));
    S' = sum H + round_half_up(sum L / 2^b) = round_half_up(sum E / 2^b); y = floor((2T + S') / (2S')).
    ``delta``: the worst distance of T / S' from softmax * q, in output steps."""

    frac_bits: int  # F
    split: int  # b
    delta: Fraction

    @property
    def error(self) -> float:
        return float(Fraction(1, 2) + self.delta)


def softmax_plan(n: int, q: Fraction) -> SoftmaxPlan:
    """F and b of the least delta = (1/2 + q ((n - 1) / 2^(b+1) + 1/2)) / (2^(F-b) - 1/2) for a softmax over n
    values into steps of 1 / q, within the precision rules for the labels of the values' intervals: the sums of
    H (<= 2^(F-b)) and L (< 2^b) over n, the shift of sum L by b, S' (<= n 2^(F-b) + n), 2T (T <= q 2^(F-b) + 1),
    2T + S' and 2S'."""
    best = None
    for f in range(1, 31):
        for b in range(0, f):
            h, top = 1 << (f - b), round_half_up(q * (1 << (f - b))) + 1
            sl = n * ((1 << b) - 1)
            total = n * h + (n + 1) // 2 * bool(b)
            if tight(h) + bits(n) > 32 or (b and (tight(sl) > 32 or tight(n) + b >= 32)) or tight(total) + 1 > 32 \
                    or tight(top) + 3 > 32 or max(tight(2 * top), tight(total)) + 1 > 32 or tight(total) + 3 > 32:
                continue
            delta = (Fraction(1, 2) + q * (Fraction(n - 1, 1 << (b + 1)) + Fraction(1, 2))) / (h - Fraction(1, 2))
            if best is None or delta < best.delta:
                best = SoftmaxPlan(f, b, delta)
    if best is None or best.delta >= Fraction(1, 2):
        raise NoPlan(f"a softmax over {n} values into steps of {float(1 / q):.3g} has no integer form within "
                     "half a step in 32 bits")
    return best


@dataclass(frozen=True)
class LogSoftmaxPlan:
    """LogSoftmax in integers (docs/import.md, "LogSoftmax"), for d = max - x >= 0 along the axis of n values and
    W = z_out - lo + 1 (the output steps below the zero point): E[k] = round(2^F exp(-k s)), S = sum E (>= 2^F);
    the log of S from two tables, fine below T = j0 2^k2 - 2^(k2-1) and coarse from T on: i1 = min(round(S / 2^k1),
    C1), i2 = round(S / 2^k2), G1[i] = Gc(i 2^k1), G2[j] = Gc(j 2^k2) - G1[C1] for j >= j0 (else 0), with
    Gc(v) = min(round(2^P q log(v / 2^F)), 2^P W), so G1[i1] + G2[i2] = Gc(i 2^k) at S's own level;
    A[d] = min(round(2^P d s q), 2^P W); y = z_out - round_half_up((A + G1 + G2) / 2^P), saturated. ``delta``: the
    worst distance of (A + G1 + G2) / 2^P from -log_softmax * q, in output steps: 2^-P for the tables' roundings,
    q times ``log_error`` (nats) for E's roundings (relative (n - 1) / 2^(F+1)) and S's shift (relative
    2^(k1-1) / 2^F below T, 2^(k2-1) / T from T on)."""

    frac_bits: int  # F
    fine: int  # k1
    coarse: int  # k2
    fine_top: int  # C1
    first: int  # j0
    table_bits: int  # P
    log_error: float
    delta: float

    @property
    def error(self) -> float:
        return 0.5 + self.delta


def logsoftmax_plan(n: int, q: Fraction, below: int) -> LogSoftmaxPlan:
    """F, k1, k2, C1, j0 and P of LogSoftmax over n values into steps of 1 / q with ``below`` = W output steps below
    the zero point: F = 30 - bits(n) (sum E within the runtime's sum rule), k2 the least shift whose coarse table
    has at most 2^16 entries, k1 < = k2 (with the largest T whose fine table has at most 2^16 entries) for the least
    relative error of the shift, P the largest <= 16 with 2^P W <= 2^29 (A + G1 + G2 within 31 bits)."""
    f = 30 - bits(n)
    k2 = 0
    while (n << f) + (1 << k2 >> 1) >> k2 >= 1 << 16:
        k2 += 1
    best = None
    for k1 in range(k2 + 1):
        j0 = (((1 << 16) - 1 << k1) - (1 << k1 >> 1) + (1 << k2 >> 1)) >> k2
        if j0 < 1:
            continue
        t = (j0 << k2) - (1 << k2 >> 1)
        e2 = max(Fraction(1 << k1 >> 1, 1 << f), Fraction(1 << k2 >> 1, max(t, 1 << f)))
        if best is None or e2 < best[0]:
            best = (e2, k1, j0, t)
    e1 = Fraction(n - 1, 1 << (f + 1))
    if best is None or e1 >= Fraction(1, 2) or best[0] >= Fraction(1, 2) or below > 1 << 29:
        raise NoPlan(f"a LogSoftmax over {n} values has no integer form here (its sum's log tables need more than "
                     "2^16 entries each)")
    e2, k1, j0, t = best
    p = 16
    while p > 1 and below << p > 1 << 29:
        p -= 1
    log_error = -math.log1p(-float(e1)) - math.log1p(-float(e2))
    return LogSoftmaxPlan(f, k1, k2, (t + (1 << k1 >> 1)) >> k1, j0, p, log_error,
                          2.0**-p + float(q) * log_error)
