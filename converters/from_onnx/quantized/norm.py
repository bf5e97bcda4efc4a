"""LayerNormalization of a dequantized value, in integers: a ``Normalized`` value made integers by the QuantizeLinear
that follows (docs/import.md, "LayerNormalization: the integer form and its bound").

Over each row of n values t along the normalized axes, with u = t - c (c centres t's interval):
D_i = n u_i - sum u = n (x_i - mean) / s and V = n sum u^2 - (sum u)^2 = n^2 var / s^2, both exact, so
(x_i - mean) / sqrt(var + eps) = D_i / sqrt(V + G) with G = eps n^2 / s^2. 1 / sqrt(V + G) comes from one table
(``cvm_lut``) of R = round(2^(F+m) / sqrt(v + G)) at 3 * 2^(T-2) * m + the bucket, for the row's level m (V < 2^T:
m = 0 and the bucket V, v = V exactly; else 4^(m-1) 2^T <= V < 4^m 2^T, the bucket floor(V / 4^m), v its middle),
then N = trunc(D R / 2^(m+j)) and the output round_half_up((N m_i + B_i) / 2^k) + z_out with
m_i = round(gamma_i 2^(k-F+j) / s_out) and B_i = round(beta_i 2^k / s_out). ``layernorm_plan`` picks T, F, j and k
for the least bound; where it passes half a step (a gamma of many output steps), m_i takes s more bits in two
products and the bound covers the outputs that do not saturate (``saturating_plan``). Rows whose V passes 32 bits
take the quartered form (``quartered``), and past it the form of any width (``wide_plan``: V's bucket from an integer
Y within a proven interval, or from V itself on rows of small variance, D pre-shifted per table entry).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import partial
from typing import Callable

import numpy as np

from cvm_onnx.core.constants import tight

from ..context import INT32, INT_RANGES, Tensor, const
from ..emit import as_int32, normal, reduced
from ..registry import Refuse, float_rule
from ..requant_plans import NoPlan, exact_max
from .qdq import Requant, saturate
from .values import Deferred, Scaled, per_tensor, scaled, squares_pass_float32

MAX_TABLE = 1 << 16  # entries of the 1 / sqrt table
MAX_SHIFT = 31


@dataclass(frozen=True)
class LayerNormPlan:
    """The integer LayerNormalization's parameters: centre c, table bits T and levels K (m in 0..K), the table R,
    F, j, the clip bound of N, the output multipliers m_i and offsets B_i with shift k, and the worst distance
    ``delta`` (in output steps, before the final rounding) from the exact LayerNormalization of the integers."""

    n: int
    centre: int
    table_bits: int
    levels: int
    table: np.ndarray
    frac_bits: int
    extra: int  # j
    n_bound: int
    multipliers: np.ndarray
    offsets: np.ndarray
    shift: int
    precision: int
    delta: Fraction
    quarter: int = 0  # q: V as floor(V / 4^q) from the row's mean-centred sums when n^2 max|u|^2 passes 32 bits
    split: int = 0  # h: R holds h more bits, D R taken in two products (R >> h, R mod 2^h); 0: one product
    gamma_split: int = 0  # s: m_i holds s more bits, N m_i / 2^s as N (m_i >> s) + trunc(N (m_i mod 2^s) / 2^s)
    saturating: bool = False  # delta bounds the outputs that do not saturate (docs: "A gamma of many steps")
    wide: WideRows | None = None  # rows of any width: V's bucket from Y, D pre-shifted per entry (docs)

    @property
    def error(self) -> float:
        return float(Fraction(1, 2) + self.delta)


def _rounded(num: int, den: int, t: int) -> int:
    """round_half_up(num / den 2^t) in integers (den > 0)."""
    if t >= 0:
        return ((num << (t + 1)) + den) // (den << 1)
    return ((num << 1) + (den << -t)) // (den << (1 - t))


def level_table(n: int, v_max: int, g: float, t_bits: int, levels: int, f: int,
                h: int = 0, floor: float = 0.0, outside: float = 0.0) -> tuple[np.ndarray, float, float]:
    """R over (m, bucket) as the flat table at 3 * 2^(T-2) * m + bucket (a level m >= 1 has buckets 2^(T-2) ..
    2^T - 1 only: the levels follow each other), R = round(2^(F+m+h) / (sqrt(max(v + G, floor)) + outside)) with h
    extra bits (the split form's; ``floor`` an L2 normalization's eps, reached at level 0 only, where v is exact;
    ``outside`` its eps added to the root; below, sqrt(V + G) stands for that whole divisor), and E = the
    worst |D| |R / 2^h - 2^(F+m) / sqrt(V + G)| / 2^m over every reachable V (V = 0 or
    V >= n - 1, |D| <= sqrt((n - 1) V)), computed in float64 at the bucket's ends (the distance is monotone in V
    within a bucket) with a relative margin of 2^-40; and eps = the worst |R / (2^h R*) - 1|, R* = 2^(F+m) /
    sqrt(V + G), over the same V (monotone within a bucket too), with an absolute margin of 2^-40."""
    def root(v: np.ndarray) -> np.ndarray:
        return np.sqrt(np.maximum(v + g, floor)) + outside

    size, step = 1 << t_bits, 3 << (t_bits - 2)
    table = np.zeros(size + levels * step if levels else v_max + 1, np.int64)
    worst = rel = 0.0
    for m in range(levels + 1):
        k = np.arange(size, dtype=np.int64)
        if m:
            k = k[size >> 2:]
            lo, hi = k << (2 * m), ((k + 1) << (2 * m)) - 1
            mid = lo + ((1 << (2 * m)) - 1) / 2
        else:
            k = k[(k >= max(n - 1, 1)) & (k <= v_max)]  # V = 0: D = 0, the entry 0
            lo = hi = k
            mid = k.astype(np.float64)
        keep = lo <= v_max
        k, lo, hi, mid = k[keep], lo[keep], np.minimum(hi[keep], v_max), mid[keep]
        if not k.size:
            continue
        r = np.floor(np.ldexp(1 / root(mid), f + m + h) + 0.5).astype(np.int64)
        table[m * step + k] = r
        for v in (lo, hi):
            e = np.abs(np.ldexp(r.astype(np.float64), -h) - np.ldexp(1 / root(v), f + m)) * \
                np.sqrt((n - 1) * v.astype(np.float64))
            worst = max(worst, float(np.max(np.ldexp(e, -m))))
            rel = max(rel, float(np.max(np.abs(np.ldexp(r.astype(np.float64), -(f + m + h)) * root(v) - 1))))
    return table, worst * (1 + 2.0**-40), rel + 2.0**-40


def small_rows(n: int, t_bits: int, quarter: int) -> int:
    """A bound on P = sum (u - q)^2 of every row whose level m is below ``quarter`` (V < 4^(q-1) 2^T), with
    n P = V + r^2, r^2 <= (n - 1)^2."""
    return -(-((1 << (2 * quarter - 2 + t_bits)) + (n - 1) ** 2) // n)


def table_size(t_bits: int, levels: int) -> int:
    """The entries of a table of T bits and K levels: level 0's 2^T, then each level's upper three quarters."""
    return (1 << t_bits) + levels * (3 << (t_bits - 2))


def table_shape(v_max: int, quarter: int, size: int = MAX_TABLE) -> tuple[int, int] | None:
    """(T, K): the most table bits T (at most 16, at least 2Q) whose K levels cover V <= v_max in at most ``size``
    entries, with K >= Q; None if there is none."""
    for t_bits in range(16, max(4, 2 * quarter) - 1, -1):
        levels = 0
        while v_max >= (1 << (2 * levels + t_bits)):
            levels += 1
        if table_size(t_bits, levels) <= size:
            return (t_bits, levels) if levels >= quarter else None
    return None


def quartered_fits(n: int, w: int, v_max: int, t_bits: int, quarter: int) -> bool:
    """Whether ``quartered``'s steps keep every CVM label within 32 bits (a product's label is the sum of its
    operands' labels) for rows of n values of width w."""
    unit = 1 << (2 * quarter)
    p_top = (n * n * w * w // 4 + (n - 1) ** 2) // n
    tn = tight(n)
    return (tight(w) + tn <= 32 and square_sums_fit(n, w, unit) and 2 * tight(n - 1) <= 32
            and tight(p_top // unit) + tn <= 32 and tight(unit - 1) + tn <= 32
            and tight(small_rows(n, t_bits, quarter)) + tn <= 32 and tight(n * unit + n * n) <= 31
            and tight(v_max >> (2 * quarter)) <= 31 and tight(p_top) <= 32)


def square_sums_fit(n: int, w: int, unit: int) -> bool:
    """Whether ``square_sums``' steps keep every CVM label within 32 bits for rows of n values |du| <= w."""
    b = chunk(n, w)
    a = n // b
    return (2 * tight(w) + tight(b) <= 32 and tight(b * w * w // unit) + max(tight(unit), tight(a)) <= 32
            and tight(a * unit) + tight(a) <= 32)


def variance_fits(n: int, peak: int) -> bool:
    """Whether ``variance``'s steps keep every CVM label within 32 bits (a product's label is the sum of its
    operands', a difference's one more than the wider) for rows of n values |u| <= peak."""
    return (2 * tight(peak) <= 32 and tight(n * peak * peak) + tight(n) <= 32 and 2 * tight(n * peak) <= 32
            and tight(n * n * peak * peak) + 1 <= 32)


def layernorm_plan(n: int, lo: int, hi: int, s: Fraction, eps: Fraction, gamma: np.ndarray, beta: np.ndarray,
                   low: int, high: int) -> LayerNormPlan:
    """The plan of least delta for rows of n integers in [lo, hi] at scale s, epsilon ``eps``, and per-position
    gamma / s_out and beta / s_out (``gamma``, ``beta``: Fractions), into the output range [low, high]. Planned
    over the distinct (gamma_i, beta_i) pairs, in the order of their first positions (a position's multiplier and
    offset are its pair's)."""
    if gamma.size == beta.size:
        pairs: dict[tuple[int, int, int, int], int] = {}  # keyed by integers: a Fraction's hash is a modular inverse
        index = np.array([pairs.setdefault((g.numerator, g.denominator, b.numerator, b.denominator), len(pairs))
                          for g, b in zip(gamma.flat, beta.flat)], np.int64)
        if len(pairs) < gamma.size:
            first = np.unique(index, return_index=True)[1]
            p = layernorm_plan(n, lo, hi, s, eps, gamma.reshape(-1)[first], beta.reshape(-1)[first], low, high)
            return replace(p, multipliers=p.multipliers[index], offsets=p.offsets[index])
    w = hi - lo
    centre = (lo + hi) // 2
    peak = max(centre - lo, hi - centre)
    d_max, v_max = (n - 1) * w, n * n * w * w // 4 if n > 1 else 0  # V = n^2 var <= n^2 w^2 / 4
    precision = tight(max(-low, high))
    within_width(n)
    big = max(abs(x) for x in gamma.flat) if gamma.size else Fraction(0)
    # |y_i / s_out - beta_i / s_out| <= |gamma_i / s_out| sqrt(n - 1): a beta_i / s_out further than that plus the
    # output range plus 2 from 0 saturates every output of position i, and so does the bound in its place (the same
    # outputs; B_i within 32 bits)
    root = math.isqrt(max(n - 1, 0)) + 1  # > sqrt(n - 1)
    beta = np.array([max(-limit, min(limit, bi)) for gi, bi in zip(gamma.flat, beta.flat)
                     for limit in [abs(gi) * root + high - low + 2]], dtype=object)
    if variance_fits(n, peak):
        quarter, shape = 0, table_shape(v_max, 0)
    elif (found := quartered_shape(v_max, lambda t, q: quartered_fits(n, w, v_max, t, q))) is not None:
        quarter, shape = found
    else:
        return wide_plan(n, w, centre, peak, float(eps * n * n / (s * s)), gamma, beta, (low, high), precision, big)
    if shape is None:
        raise NoPlan(f"a LayerNormalization over {n} values needs a table of more than 2^16 entries")
    t_bits, levels = shape
    g = float(eps * n * n / (s * s))
    d_bits = tight(d_max)
    # the largest entry, over 2^F: at the least V > 0 of level 0, or 2^m / sqrt(4^m 2^(T-2)) at a level m >= 1
    r_first = max(1 / math.sqrt(n - 1 + g) if n > 1 else 0.0, 2.0 ** (1 - t_bits / 2) if levels else 0.0)
    f = table_bits(r_first, d_bits)
    shape = (n, centre, t_bits, levels, quarter, precision)
    best, h = best_plan(shape, v_max, g, f, d_bits, 0, gamma, beta), 31 - d_bits
    if (best is None or best.delta >= Fraction(1, 2)) and h > 0:  # R in two parts
        best = best_plan(shape, v_max, g, f, d_bits, h, gamma, beta)
    if best is None or best.delta >= Fraction(1, 2):  # the bound on the outputs that do not saturate
        plans = [best_plan(shape, v_max, g, f, d_bits, part, gamma, beta, (low, high))
                 for part in ((0, h) if h > 0 else (0,))]
        best = min((p for p in plans if p is not None), key=lambda p: p.delta, default=None)
    if best is None or best.delta >= Fraction(1, 2):
        raise far(n, big)
    return best


def within_width(n: int) -> None:
    """Refuses rows of more than ``MAX_WIDE`` values (NoPlan), before any work per position: the form of wide rows
    plans at most that many, and a LayerNormalization's gamma and beta take a Fraction each."""
    if n > MAX_WIDE:
        raise NoPlan(f"a LayerNormalization over {n} values: its integer form takes rows of at most {MAX_WIDE} "
                     "values (past 16383 its sums pass 32 bits, and its search for wide rows grows with them)")


def planned_width(n: int) -> None:
    """``within_width`` in a rule: a row the plan would refuse, refused before its constants are read."""
    try:
        within_width(n)
    except NoPlan as e:
        raise Refuse(str(e)) from None


def planned_pairs(n: int, gamma, beta, size: int) -> None:
    """Refuses gamma and beta of more than ``MAX_PAIRS`` distinct pairs over their ``size`` values (positions or
    channels) before their exact values are made, where their stored values tell their reals apart (a per-tensor
    dequantized constant's integers, a float constant's floats); else ``tabled`` counts them."""
    def stored(x) -> np.ndarray | None:
        if isinstance(x, Scaled) and x.t.is_const and x.per_tensor:
            v = x.t.value
        elif isinstance(x, Tensor) and x.is_const and np.asarray(x.value).dtype.kind == "f":
            v = np.asarray(x.value)
        else:
            return None
        return np.broadcast_to(v.reshape(-1), (size,)).astype(np.float64) if v.size in (1, size) else None
    values = [stored(x) for x in (gamma, beta) if x is not None]
    if size > MAX_PAIRS and all(v is not None for v in values):
        count = len(np.unique(np.stack(values, axis=1), axis=0))
        if count > MAX_PAIRS:
            raise Refuse(str(too_many_pairs(n, count)))


def too_many_pairs(n: int, count: int) -> NoPlan:
    return NoPlan(f"a LayerNormalization over {n} values with {count} distinct (gamma, beta) pairs: its plan is "
                  f"searched over at most {MAX_PAIRS}")


def far(n: int, big: Fraction) -> NoPlan:
    return NoPlan(f"a LayerNormalization over {n} values with |gamma| up to {float(big):.3g} output steps has no "
                  "integer form within half a step in 32 bits")


@dataclass(frozen=True)
class WideRows:
    """The wide form's statistics (docs: "Rows of any width"): a_i = 2^c u_i - q with q = trunc(2^c sum u / n),
    r = 2^c sum u - n q, P = sum a_i^2, Y = clip(floor(P / 2^z) - floor(t^2 / K), 0, y_max) with t = trunc(r / 2^g),
    K = floor(n 2^z / 4^g); per table entry the pre-shift p (D' = trunc(D / 2^p), |D'| <= ``d_bound``) and the
    exponent x of N = trunc(D' R / 2^(x+j)). Where ``cap`` > 0, a row of Y <= ``y_small`` reads its exact V instead
    (``small_v``), at (T_s, K_s) = ``small_shape`` in the table's first entries."""

    width: int  # w: the rows' values lie in an interval of w + 1 integers
    scale: int  # c
    z: int
    g: int
    k: int
    y_max: int
    shifts: np.ndarray | None = None
    exps: np.ndarray | None = None
    d_bound: int = 0
    cap: int = 0  # floor(P / 2^z) taken at most cap for the exact V (0: no small rows)
    y_small: int = -1
    v_small: int = 0  # the exact V's largest value
    small_shape: tuple[int, int] = (0, 0)

    def p_top(self, n: int) -> int:
        """A bound on P: n P = 4^c V + r^2 <= 4^c n^2 w^2 / 4 + (n - 1)^2."""
        return ((n * n * self.width ** 2 << (2 * self.scale)) // 4 + (n - 1) ** 2) // n

    def small_entries(self) -> int:
        """The table entries of the exact V (the first ones)."""
        return table_size(*self.small_shape) if self.cap else 0


def small_rows_of(n: int, rows: WideRows) -> WideRows:
    """``rows`` with the exact V of small rows where its steps fit 32 bits (docs: "Rows of any width", the exact V;
    g = 0, so K = n 2^z): with Q_r = floor(r^2 / n), R_r = r^2 - n Q_r and P' = 2^z min(floor(P / 2^z), cap) +
    P mod 2^z (< 2^29), a row of Y <= y_small has P' = P, 0 <= P - Q_r < 2^z (Y + 1) and 4^c V = n (P - Q_r) - R_r;
    n (P - Q_r) within 32 bits."""
    qr = (n - 1) ** 2 // n
    if rows.g or rows.z >= 29 or 2 * tight(n - 1) > 32 or tight(n) + tight(qr - qr // 2) > 32:
        return rows
    cap = (1 << (29 - rows.z)) - 1
    y_small = min(((1 << (31 - tight(n))) >> rows.z) - 1, cap - (qr >> rows.z), rows.y_max - 1)
    v_small = min((n * (((y_small + 1) << rows.z) - 1)) >> (2 * rows.scale), n * n * rows.width ** 2 // 4)
    shape = table_shape(v_small, 0, MAX_TABLE // 2)
    if y_small < 0 or shape is None:
        return rows
    return replace(rows, cap=cap, y_small=y_small, v_small=v_small, small_shape=shape)


#: the most values in a row the wide form plans
MAX_WIDE = 1 << 16
#: the most distinct (gamma_i, beta_i) pairs a plan is searched over (each takes every try's exact bound)
MAX_PAIRS = 1 << 14
#: the wide form's tries: R in one part or two, and the bits B of D' (|D'| < 2^B)
WIDE_BITS = ((False, (16,)), (True, (18, 20, 22)))


def wide_plan(n: int, w: int, centre: int, peak: int, g: float, gamma: np.ndarray, beta: np.ndarray,
              outputs: tuple[int, int], precision: int, big: Fraction) -> LayerNormPlan:
    """The wide form's plan of least delta (rows whose V passes 32 bits even quartered), G = ``g``: for each scale
    bits c (at most 4) the least z whose steps fit 32 bits, and of those the least unit n 2^z / 4^c, then c; with
    the exact V of small rows where it fits (``small_rows_of``)."""
    rows = None
    for c in range(5):  # the least Y unit n 2^z / 4^c, then the least c
        if tight(n * peak << c) + 1 > 32 or tight(n * w) + 1 > 32:
            continue
        top = WideRows(w, c, 0, 0, 0, 0).p_top(n)
        z = next((z for z in range(64) if tight(top >> z) <= 31 and square_sums_fit(n, w << c, 1 << z)), None)
        g_shift = max(0, (n - 1).bit_length() - 15)
        if z is not None and (n << z) >> (2 * g_shift) and (rows is None or z - 2 * c < rows.z - 2 * rows.scale):
            rows = WideRows(w, c, z, g_shift, (n << z) >> (2 * g_shift), top >> z)
    if rows is None:
        raise NoPlan(f"a LayerNormalization over {n} values of {w + 1} integers passes 32 bits in its sums")
    rows = small_rows_of(n, rows)
    found = table_shape(rows.y_max, 0, MAX_TABLE - rows.small_entries())
    if found is None:
        raise NoPlan(f"a LayerNormalization over {n} values needs a table of more than 2^16 entries")
    shape = (n, centre, *found, 0, precision)
    best = None
    for bound in (None, outputs):
        for split, choices in WIDE_BITS:
            for bits in choices:
                h = 30 - bits if split else 0
                tab, laid = wide_table(n, rows, *found, g, h, bits)
                p = tabled(shape, tab, tight(laid.d_bound), h, gamma, beta, bound)
                if p is not None and (best is None or p.delta < best.delta):
                    best = replace(p, wide=laid)
        if best is not None and best.delta < Fraction(1, 2):
            return best
    raise far(n, big)


def wide_table(n: int, rows: WideRows, t_bits: int, levels: int, g: float, h: int,
               bits: int) -> tuple[Table, WideRows]:
    """The wide form's table: the exact V's entries (``rows.small_shape``) first, each over its bucket [V_a, V_b],
    then those over Y's level and bucket, each entry's V in [V_lo, V_hi] = u [Y_a - e_lo, Y_b + e_hi] (u = n 2^z /
    4^c, Y_a..Y_b its Y, within V's reach; none at Y_b <= y_small, which read the exact V); per entry the pre-shift
    p = max(0, bits(D_b) - B) with D_b >= sqrt((n - 1) V_hi), R = round_half_up(2^(e+h) (1 / sqrt(A + G) +
    1 / sqrt(B + G)) / 2), A = max(n - 1, u (Y_a - 1)) and B = max(A, min(u (Y_b + 1), n^2 w^2 / 4)) (V_a and V_b
    for the exact V; exact in float64), with the most e keeping R >> h below 2^(30-B); F = min(e - p),
    x = e - p - F. E (at F) is the worst sqrt((n - 1) V) |R / 2^(e+h) - 1 / sqrt(V + G)| + (2^p - 1) R / 2^(e+h)
    over the entry's V (the first term at V_lo, V_hi and its one inner extremum), eps the worst
    |R sqrt(V + G) / 2^(e+h) - 1| (at V_lo, V_hi), in float64 with margins of 2^-40."""
    w = rows.width
    per = float(Fraction(n << rows.z, 1 << (2 * rows.scale)))  # V per unit of Y
    t_max, full = (n - 1) >> rows.g, n << rows.z
    k_star = Fraction(full, 1 << (2 * rows.g))
    # V / per - Y lies in [-below, above]: floor(P / 2^z) loses [0, 1), floor(t^2 / K) and t's truncation the rest
    below = float(Fraction(((2 * t_max + 1) << (2 * rows.g)) - ((t_max + 1) << (rows.g + 1)) + 1, full) + 1)
    above = float(1 + Fraction(t_max * t_max) / (k_star * rows.k))
    below, above = below * (1 + 2.0**-40), above * (1 + 2.0**-40)
    v_top = float(n * n * w * w // 4)
    first = rows.small_entries()
    index, ya, yb = buckets(t_bits, levels, rows.y_max)
    keep = yb > rows.y_small
    index, ya, yb = index[keep] + first, ya[keep], yb[keep]
    v_lo = np.maximum(per * (ya - below) * (1 - 2.0**-40), n - 1)  # V = 0: D = 0
    v_hi = np.minimum(per * (yb + above) * (1 + 2.0**-40), v_top)
    a_nom = np.maximum(per * (ya - 1), n - 1)
    b_nom = np.maximum(np.minimum(per * (yb + 1), v_top), a_nom)
    if first:
        small, va, vb = buckets(*rows.small_shape, rows.v_small)
        lo, hi = np.maximum(va, n - 1).astype(np.float64), np.minimum(vb, v_top).astype(np.float64)
        index, v_lo, v_hi = np.concatenate([small, index]), np.concatenate([lo, v_lo]), np.concatenate([hi, v_hi])
        a_nom, b_nom = np.concatenate([lo, a_nom]), np.concatenate([np.maximum(hi, lo), b_nom])
    live = v_hi >= v_lo
    index, v_lo, v_hi, a_nom, b_nom = index[live], v_lo[live], v_hi[live], a_nom[live], b_nom[live]
    d_top = np.minimum(np.floor(np.sqrt((n - 1) * v_hi) * (1 + 2.0**-40)) + 1, (n - 1) * w).astype(np.int64)
    shift = np.array([max(int(x).bit_length() - bits, 0) for x in d_top], np.int64)
    low_root = np.sqrt(v_lo + g)
    ex = np.floor(np.log2(((1 << (30 - bits)) - 2) * low_root)).astype(np.int64)
    r = np.floor(np.ldexp((1 / np.sqrt(a_nom + g) + 1 / np.sqrt(b_nom + g)) / 2, ex + h) + 0.5).astype(np.int64)
    rr = np.ldexp(r.astype(np.float64), -(ex + h))
    inner = np.clip(np.cbrt((g / rr) ** 2) - g, v_lo, v_hi)  # where G (V + G)^-3/2 = rr
    err = np.max([np.sqrt((n - 1) * v) * np.abs(rr - 1 / np.sqrt(v + g)) for v in (v_lo, v_hi, inner)], axis=0)
    pre = (np.ldexp(1.0, shift) - 1) * rr
    rel = float(np.max([np.abs(rr * np.sqrt(v + g) - 1) for v in (v_lo, v_hi)], initial=0.0)) + 2.0**-40
    f = int((ex - shift).min()) if ex.size else 0
    table, shifts, exps = (np.zeros(first + table_size(t_bits, levels), np.int64) for _ in range(3))
    table[index], shifts[index], exps[index] = r, shift, ex - shift - f
    laid = replace(rows, shifts=shifts, exps=exps, d_bound=int((d_top >> shift).max(initial=0)))
    worst, most = (math.ldexp(float(np.max(x, initial=0.0)), f) * (1 + 2.0**-40) for x in (err + pre, pre))
    return Table(table, worst, rel, f, int(exps.max()), most), laid


def buckets(t_bits: int, levels: int, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(entry, first, last) of each bucket of a levelled table (``levelled``) over 0..``top``: level 0's values
    0..2^T - 1 one each, level m's buckets [b 4^m, (b + 1) 4^m - 1] for b in 2^(T-2)..2^T - 1, the last cut at top."""
    size, step = 1 << t_bits, 3 << (t_bits - 2)
    index, first, last = [], [], []
    for m in range(levels + 1):
        k = np.arange(size >> 2 if m else 0, size, dtype=np.int64)
        lo, hi = k << (2 * m), ((k + 1) << (2 * m)) - 1
        keep = lo <= top
        index.append(m * step + k[keep])
        first.append(lo[keep])
        last.append(np.minimum(hi[keep], top))
    return tuple(np.concatenate(x) for x in (index, first, last))


def quartered_shape(v_max: int, fits: Callable[[int, int], bool]) -> tuple[int, tuple[int, int]] | None:
    """The least quarter Q in 1..15 (squares split at 4^Q) whose table over [0, v_max] has a shape (``table_shape``)
    that ``fits(T, Q)`` accepts, with that shape; None where none does."""
    for quarter in range(1, 16):
        shape = table_shape(v_max, quarter)
        if shape is not None and fits(shape[0], quarter):
            return quarter, shape
    return None


def table_bits(r_first: float, d_bits: int) -> int:
    """The table's F: the most fraction bits (at most 40) for which its largest entry ``r_first`` 2^F, rounded, times
    a value of ``d_bits`` bits stays within 32 bits."""
    f = 0
    while tight(math.floor(math.ldexp(r_first, f + 1) + 0.5)) + d_bits <= 32 and f < 40:
        f += 1
    return f


def best_plan(shape: tuple, v_max: int, g: float, f: int, d_bits: int, h: int, gamma: np.ndarray,
              beta: np.ndarray, outputs: tuple[int, int] | None = None, floor: float = 0.0,
              outside: float = 0.0) -> LayerNormPlan | None:
    """The plan of least delta for table bits F and split h (0: one product D R; else D (R >> h) and D (R mod 2^h),
    each truncated), over j and k; with ``outputs`` (low, high), ``saturating_plan``'s; ``floor`` and ``outside``
    as ``level_table``'s. None when no table or no multipliers fit 32 bits."""
    n, centre, t_bits, levels, quarter, precision = shape
    table, worst, rel = level_table(n, v_max, g, t_bits, levels, f, h, floor, outside)
    return tabled(shape, Table(table, worst, rel, f, levels), d_bits, h, gamma, beta, outputs)


@dataclass(frozen=True)
class Table:
    """A 1 / sqrt table R at F fraction bits with its error E (``worst``) and relative error (``rel``), as
    ``level_table`` gives them; ``top``: the largest exponent e of a lookup 2^(e+j) (the level); ``pre``: the
    part of E that does not shrink with the table's error (the wide form's pre-shift, in N at j = 0)."""

    table: np.ndarray
    worst: float
    rel: float
    f: int
    top: int
    pre: float = 0.0


def tabled(shape: tuple, tab: Table, d_bits: int, h: int, gamma: np.ndarray, beta: np.ndarray,
           outputs: tuple[int, int] | None = None) -> LayerNormPlan | None:
    """``best_plan``'s search over j and k for a given table, over the distinct (gamma_i, beta_i) pairs (a
    position's multiplier, offset and bound are its pair's), of which it takes at most ``MAX_PAIRS``."""
    n, centre, t_bits, levels, quarter, precision = shape
    if gamma.size == beta.size:
        pairs: dict[tuple[Fraction, Fraction], int] = {}
        index = np.array([pairs.setdefault(gb, len(pairs)) for gb in zip(gamma.flat, beta.flat)], np.int64)
        if len(pairs) > MAX_PAIRS:
            raise too_many_pairs(n, len(pairs))
        if len(pairs) < gamma.size:
            g, b = np.empty(len(pairs), object), np.empty(len(pairs), object)
            g[:], b[:] = [gb[0] for gb in pairs], [gb[1] for gb in pairs]
            p = tabled(shape, tab, d_bits, h, g, b, outputs)
            return None if p is None else replace(p, multipliers=p.multipliers[index], offsets=p.offsets[index])
    table, worst, f = tab.table, tab.worst, tab.f
    if tight(int(table.max(initial=0)) >> h) + d_bits > 32:
        if h or outputs:
            return None
        raise NoPlan(f"a LayerNormalization over {n} values has no 1 / sqrt table within 32 bits")
    if outputs is not None:
        return saturating_plan(shape, tab, h, gamma, beta, outputs)
    best = None
    gn, gd = [x.numerator for x in gamma.flat], [x.denominator for x in gamma.flat]
    bn, bd = [x.numerator for x in beta.flat], [x.denominator for x in beta.flat]
    extremes_b = [min(beta.flat), max(beta.flat)] if beta.size else []
    extremes_g = [min(gamma.flat), max(gamma.flat)] if gamma.size else []
    big = max((abs(x) for x in extremes_g), default=Fraction(0))
    for j in range(0, f + 1):
        if tab.top + j + h > 30:  # the lookup 2^(m+j+h) within 31 bits
            break
        err = Fraction(worst) / (1 << j) + (2 if h else 1)  # the table's error, and trunc's (once per part)
        if best is not None and big * err / (1 << (f - j)) >= best.delta:
            break  # delta >= max |c_i| err = max |gamma_i| (worst + 2^j (h ? 2 : 1)) / 2^F, which grows with j
        nb = math.floor(Fraction(math.ldexp(math.sqrt(n - 1), f - j)) * (1 + Fraction(1, 1 << 40)) + err) + 1
        u = f - j  # c_i = gamma_i / 2^u
        for k in range(MAX_SHIFT - precision, 0, -1):
            # round_half_up is monotone: the extremes of c and beta give the largest |m_i| and |B_i|
            peak_m = max((abs(_rounded(x.numerator, x.denominator, k - u)) for x in extremes_g), default=0)
            peak_b = max((abs(_rounded(x.numerator, x.denominator, k)) for x in extremes_b), default=0)
            label = tight(nb) + tight(peak_m)
            if label > 32 or max(label, tight(peak_b)) + 1 > 32:
                continue
            ms = [_rounded(a, b, k - u) for a, b in zip(gn, gd)]  # round_half_up(c_i 2^k)
            bs = [_rounded(a, b, k) for a, b in zip(bn, bd)]
            # |c_i| err + nb |m_i / 2^k - c_i| + |B_i / 2^k - beta_i|, over 2^(k+u) Dg_i Db_i E_d in integers
            en, ed = err.numerator, err.denominator
            delta = exact_max([abs(g) * en * (db << k) + nb * abs((mi * dg << u) - (g << k)) * db * ed
                              + (abs(bi * db - (b << k)) * dg * ed << u)
                              for g, dg, mi, b, db, bi in zip(gn, gd, ms, bn, bd, bs)],
                             [(dg * db * ed) << (k + u) for dg, db in zip(gd, bd)])
            if best is None or delta < best.delta:
                best = LayerNormPlan(n, centre, t_bits, levels, table, f, j, nb, np.array(ms, np.int64),
                                     np.array(bs, np.int64), k, precision, delta, quarter, h)
            break
    return best


def saturating_plan(shape: tuple, tab: Table, h: int, gamma: np.ndarray, beta: np.ndarray,
                    outputs: tuple[int, int]) -> LayerNormPlan | None:
    """The plan of least delta over j and k with m_i = round_half_up(c_i 2^(k+s)) in two parts (s = 30 -
    label(N_b)) and, per position, the lesser of the plain bound (with 2^-k for the low part's truncation) and
    A_i (|mu_i| eps + |mu_i - c_i|) / |c_i| + |mu_i| e_t + |B_i / 2^k - beta_i| + 2^-k, mu_i = m_i / 2^(k+s),
    A_i = max(high - beta_i, beta_i - low) + 1: the bound of every output that does not saturate (docs)."""
    n, centre, t_bits, levels, quarter, precision = shape
    table, worst, f = tab.table, tab.worst, tab.f
    low, high = outputs
    eps = Fraction(tab.rel)
    reach = [max(high - b, b - low) + 1 for b in beta.flat]
    extremes_g = [min(gamma.flat), max(gamma.flat)] if gamma.size else []
    extremes_b = [min(beta.flat), max(beta.flat)] if beta.size else []
    floats = (*(np.array([_float(x) for x in v], np.float64) for v in (gamma.flat, beta.flat, reach)),
              np.array([x == 0 for x in gamma.flat], bool))
    best, offsets = None, {}
    for j in range(0, f + 1):
        if tab.top + j + h > 30:  # the lookup 2^(m+j+h) within 31 bits
            break
        e_t = (2 if h else 1) + Fraction(tab.pre) / (1 << j)  # trunc's, and the pre-shift's
        err = Fraction(worst) / (1 << j) + (2 if h else 1)
        nb = math.floor(Fraction(math.ldexp(math.sqrt(n - 1), f - j)) * (1 + Fraction(1, 1 << 40)) + err) + 1
        s, u = 30 - tight(nb), f - j
        if s < 0:
            continue
        for k in range(MAX_SHIFT - precision, 0, -1):
            # floor(m / 2^s) and round_half_up are monotone: the extremes give the largest |m_i >> s| and |B_i|
            peak_a = max((abs(_rounded(x.numerator, x.denominator, k + s - u) >> s) for x in extremes_g), default=0)
            peak_b = max((abs(_rounded(x.numerator, x.denominator, k)) for x in extremes_b), default=0)
            if tight(nb) + tight(peak_a) > 30 or tight(peak_b) > 30:
                continue
            ms = [_rounded(x.numerator, x.denominator, k + s - u) for x in gamma.flat]
            if k not in offsets:
                offsets[k] = [_rounded(x.numerator, x.denominator, k) for x in beta.flat]
            bs = offsets[k]
            delta = saturating_delta(gamma, beta, ms, bs, reach, (k, s, u), nb, (err, eps, e_t), floats)
            if best is None or delta < best.delta:
                best = LayerNormPlan(n, centre, t_bits, levels, table, f, j, nb, np.array(ms, np.int64),
                                     np.array(bs, np.int64), k, precision, delta, quarter, h, s, True)
            break
    return best


def saturating_delta(gamma: np.ndarray, beta: np.ndarray, ms: list[int], bs: list[int], reach: list[Fraction],
                     shifts: tuple[int, int, int], nb: int, errors: tuple[Fraction, Fraction, Fraction],
                     floats: tuple[np.ndarray, ...]) -> Fraction:
    """``saturating_plan``'s delta at shifts (k, s, u): the max over positions of d_i = |c_i| err + nb |mu_i - c_i|
    + off_i, or where c_i != 0 the lesser of that and A_i (|mu_i| eps + |mu_i - c_i|) / |c_i| + |mu_i| e_t + off_i
    (c_i = gamma_i / 2^u, mu_i = m_i / 2^(k+s), off_i = |B_i / 2^k - beta_i| + (2^-k where s > 0), A_i =
    ``reach``; ``errors``: err, eps, e_t), each over its common denominator in integers, for the positions whose
    d_i in float64 (``floats``: gamma, beta and reach in float64, and where gamma is 0) may reach the largest
    (``_candidates``)."""
    k, s, u = shifts
    err, eps, e_t = errors
    en, ed, pn, pd, tn, td = err.numerator, err.denominator, eps.numerator, eps.denominator, e_t.numerator, \
        e_t.denominator
    rest = 1 if s else 0
    nums, dens = [], []
    for i in _candidates(floats, ms, bs, shifts, nb, tuple(float(x) for x in errors)):
        gi, mi, bi, b, a = gamma.flat[i], ms[i], bs[i], beta.flat[i], reach[i]
        gn, gd, bn, bd = abs(gi.numerator), gi.denominator, b.numerator, b.denominator
        x = abs((mi * gd << u) - (gi.numerator << (k + s)))  # |mu - c| gd 2^(u+k+s)
        off = abs(bi * bd - (bn << k)) + rest * bd  # off bd 2^k
        num = (gn * en * bd << (k + s)) + nb * x * bd * ed + (off * gd * ed << (u + s))
        den = gd * bd * ed << (u + k + s)
        if gn:  # A = an / ad; the second bound over ad bd pd td gn 2^(k+s)
            an, ad, m = a.numerator, a.denominator, abs(mi)
            n2 = an * ((m * pn * gd << u) + x * pd) * bd * td + ad * pd * gn * (m * tn * bd + (off * td << s))
            d2 = ad * bd * pd * td * gn << (k + s)
            if n2 * den < num * d2:
                num, den = n2, d2
        nums.append(num)
        dens.append(den)
    return exact_max(nums, dens)


def _float(x: Fraction) -> float:
    """x in float64, +-inf past its range."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def _candidates(floats: tuple[np.ndarray, ...], ms: list[int], bs: list[int],
                shifts: tuple[int, int, int], nb: int, errors: tuple[float, float, float]) -> np.ndarray:
    """The positions whose ``saturating_delta`` term may be the largest: each d_i in float64 is within 2^-40 of its
    terms' magnitudes summed (plus 2^-900) of the exact one where its values lie in float64's normal range (every
    rounding is within 2^-52 of its value); those within that of the largest, and every position outside that
    range."""
    k, s, u = shifts
    err, eps, e_t = errors
    with np.errstate(all="ignore"):
        g, bt, a, gamma_zero = floats[0] / 2.0**u, floats[1], floats[2], floats[3]
        mu = np.array(ms, np.float64) / 2.0**(k + s)
        b = np.array(bs, np.float64) / 2.0**k
        c, rest = np.abs(g), 2.0**-k if s else 0.0
        off, off_top = np.abs(b - bt) + rest, np.abs(b) + np.abs(bt) + rest
        d = c * err + nb * np.abs(mu - g) + off
        top = c * err + nb * (np.abs(mu) + c) + off_top
        second = a * (np.abs(mu) * eps + np.abs(mu - g)) / c + np.abs(mu) * e_t + off
        top2 = a * (np.abs(mu) * (eps + 1) + c) / c + np.abs(mu) * e_t + off_top
        d = np.where(gamma_zero, d, np.minimum(d, second))
        margin = np.ldexp(top + np.where(gamma_zero, 0.0, top2), -40) + 2.0**-900
        normal = np.where(gamma_zero, True, c >= 2.0**-900) & ((bt == 0) | (np.abs(bt) >= 2.0**-900))
        good = normal & np.isfinite(d) & np.isfinite(margin)
        least = np.max((d - margin)[good], initial=-np.inf)
        return np.flatnonzero(~good | (d + margin >= least))


@dataclass(frozen=True, eq=False)
class Normalized(Deferred):
    """LayerNormalization of x over its last n values (``view``: (outer, n)), with gamma and beta per position
    (Fractions, flat n) or, where ``affine`` is (N, C, S) (Instance- and GroupNormalization), per channel (flat C;
    the rows read as N C S values), and epsilon, made integers by the QuantizeLinear that follows
    (``quantized``)."""

    x: Scaled
    view: tuple[int, int]
    gamma: np.ndarray
    beta: np.ndarray
    eps: Fraction
    node: str = ""
    what: str = "LayerNormalization"
    affine: tuple[int, int, int] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.x.shape

    def quantized(self, ctx, scale: np.ndarray, out_zero: int, dtype: int) -> Tensor:
        """The integers of QuantizeLinear(LayerNormalization(x)), by ``layernorm_plan``'s form."""
        if scale.size != 1:
            raise Refuse(f"{self.what} with a per-channel output scale has no CVM form")
        s_out = scale.reshape(()).item()
        t, (outer, n) = self.x.t, self.view
        lo, hi = INT_RANGES[dtype]
        s_in, peak = self.x.scale.reshape(()).item(), max(-t.lo, t.hi) + int(np.abs(self.x.zero).max())
        if squares_pass_float32(n, 2 * peak * s_in):  # n squares of differences of two values, in float32
            raise Refuse(f"{self.node} ({self.what}): {n} values up to {peak} x {float(s_in):g} a row pass float32's "
                         "range in their variance, which onnxruntime computes as inf or NaN")
        try:
            p = layernorm_plan(n, t.lo, t.hi, self.x.scale.reshape(()).item(), self.eps,
                               *(per_distinct(lambda v: v / s_out, x) for x in (self.gamma, self.beta)),
                               lo - out_zero, hi - out_zero)
        except NoPlan as e:
            raise Refuse(f"{self.node} ({self.what}): {e}") from None
        ctx.requants.append(Requant(ctx.base, (), None, layernorm=p))
        return saturate(ctx, ctx.reshape(emit(ctx, as_int32(t), outer, n, p, self.affine), self.shape), out_zero,
                        lo, hi, dtype, self.shape)


def proven(ctx, name: str, a: Tensor, b: Tensor, lo: int, hi: int, shape) -> Tensor:
    """CVM op ``name`` of a and b, whose values the form proves lie in [lo, hi]."""
    return ctx.result(ctx.op(name, a, b), INT32, lo, hi, shape)


def c32(value) -> Tensor:
    return const(np.asarray(value, np.int64).astype(np.int32), INT32)


def emit(ctx, t: Tensor, outer: int, n: int, p: LayerNormPlan, affine: tuple[int, int, int] | None = None) \
        -> Tensor:
    """The plan's CVM ops on the rows of t: u, D, V, the level and bucket, R, N, and the output's shift; the
    multipliers and offsets per position, or per channel where ``affine`` is (N, C, S) (N read as N C S values)."""
    op = partial(proven, ctx)
    rows, col = (outer, n), (outer, 1)

    def laid(v: np.ndarray) -> Tensor:
        return c32(v.reshape(1, -1, 1) if affine else v.reshape(1, n))
    u = ctx.reshape(t, rows)
    if p.centre:
        u = op("broadcast_sub", u, c32(p.centre), u.lo - p.centre, u.hi - p.centre, rows)
    w = u.hi - u.lo
    total = ctx.reshape(reduced(ctx, "sum", u, [1], n * u.lo, n * u.hi), col)
    key, exps = None, p.levels
    if p.wide:
        d, index = wide_rows(ctx, u, total, n, p)
        key, exps = index, p.wide.exps
    else:
        scaled_u = op("broadcast_mul", u, c32(n), min(n * u.lo, 0), max(n * u.hi, 0), rows)
        d = op("broadcast_sub", scaled_u, total, -(n - 1) * w, (n - 1) * w, rows)  # n u_i - sum u
        if p.quarter:
            key, bucket = quartered(ctx, u, total, n, p)
            index = table_index(ctx, key, bucket, p.table_bits, p.levels, p.table.size)
        elif p.levels:
            key, index = levelled(ctx, variance(ctx, u, total, n, rows, col), p.table_bits, p.levels, p.table.size)
        else:
            index = variance(ctx, u, total, n, rows, col)
    prod = quotient(ctx, d, index, key, p.table >> p.split, p.extra, exps)
    if p.split:  # the low h bits of R: D R0 / 2^(m+j+h), truncated on its own
        low = quotient(ctx, d, index, key, p.table & ((1 << p.split) - 1), p.extra + p.split, exps)
        prod = op("broadcast_add", prod, low, prod.lo + low.lo, prod.hi + low.hi, rows)
    if prod.hi > p.n_bound:  # an identity on every value N takes (docs): it bounds the label
        e = ctx.emit("clip", ctx.entry(prod), a_min=-p.n_bound, a_max=p.n_bound)
        prod = ctx.result(e, INT32, -p.n_bound, p.n_bound, rows)
    if affine:
        rows = affine
        prod = ctx.reshape(prod, rows)
    if p.gamma_split:  # N (m_i >> s) + trunc(N (m_i mod 2^s) / 2^s)
        high = p.multipliers >> p.gamma_split
        peak_m, lows = int(np.abs(high).max(initial=0)), (1 << p.gamma_split) - 1
        y = op("broadcast_mul", prod, laid(high), -prod.hi * peak_m, prod.hi * peak_m, rows)
        low = op("broadcast_mul", prod, laid(p.multipliers & lows), -prod.hi * lows,
                 prod.hi * lows, rows)
        bound = (prod.hi * lows) >> p.gamma_split
        low = op("broadcast_div", low, c32(1 << p.gamma_split), -bound, bound, rows)
        y = op("broadcast_add", y, low, y.lo - bound, y.hi + bound, rows)
    else:
        m = laid(p.multipliers)
        peak_m = int(np.abs(p.multipliers).max(initial=0))
        y = op("broadcast_mul", prod, m, -prod.hi * peak_m, prod.hi * peak_m, rows)
    if p.offsets.any():
        b = laid(p.offsets)
        y = op("broadcast_add", y, b, y.lo + int(p.offsets.min()), y.hi + int(p.offsets.max()), rows)
    bnd = (1 << (p.precision - 1)) - 1
    e = ctx.emit("cvm_right_shift", ctx.narrow(y, tight(max(-y.lo, y.hi))), precision=p.precision, shift_bit=p.shift)
    return ctx.result(e, INT32, -bnd, bnd, rows)


def quotient(ctx, d: Tensor, index: Tensor, level: Tensor | None, table: np.ndarray, extra: int,
             levels: int | np.ndarray) -> Tensor:
    """trunc(D R / 2^(e + extra)) with R = table[index] (``cvm_lut``) and e = exps[level] (a lookup of 2^(e+extra)),
    ``levels``: the exps, or K for the levels 0..K (e = m)."""
    op = partial(proven, ctx)
    col, rows = index.shape, d.shape
    r = ctx.result(ctx.emit("cvm_lut", ctx.entry(index), ctx.entry(c32(table)), in_dim=table.size), INT32, 0,
                   int(table.max(initial=0)), col)
    prod = op("broadcast_mul", d, r, -d.hi * r.hi, d.hi * r.hi, rows)
    if level is not None:
        powers = [1 << (int(e) + extra) for e in (range(levels + 1) if isinstance(levels, int) else levels)]
        e = ctx.emit("cvm_lut", ctx.entry(level), ctx.entry(c32(powers)), in_dim=len(powers))
        return op("broadcast_div", prod, ctx.result(e, INT32, min(powers), max(powers), col), prod.lo, prod.hi, rows)
    if extra:
        return op("broadcast_div", prod, c32(1 << extra), prod.lo, prod.hi, rows)
    return prod


def levelled(ctx, v: Tensor, t_bits: int, levels: int, entries: int,
             bucket_hi: int | None = None) -> tuple[Tensor, Tensor]:
    """The level m = #{k < K : v >= 4^k 2^T} of each v (its axis 1 of length 1) and its index in a table of
    ``entries`` (``table_index``) with the bucket floor(v / 4^m) (at most ``bucket_hi``; by default the larger of
    2^T - 1, a level below K's bound, and floor(v_max / 4^K)). Where the division keeps a 32-bit label (its
    dividend's), a clip to that bound, an identity, narrows it for the index's sum."""
    op = partial(proven, ctx)
    col = v.shape
    bounds = np.array([((1 << t_bits) << (2 * m)) - 1 for m in range(levels)])
    above = op("broadcast_greater", v, c32(bounds.reshape((1, levels) + (1,) * (len(col) - 2))), 0, 1,
               (col[0], levels, *col[2:]))
    level = ctx.reshape(reduced(ctx, "sum", above, [1], 0, levels), col)
    powers = c32([1 << (2 * m) for m in range(levels + 1)])
    e = ctx.emit("cvm_lut", ctx.entry(level), ctx.entry(powers), in_dim=levels + 1)
    top = min(v.hi, max((1 << t_bits) - 1, v.hi >> (2 * levels))) if bucket_hi is None else bucket_hi
    bucket = op("broadcast_div", v, ctx.result(e, INT32, 1, 1 << (2 * levels), col), 0, top, col)
    if ctx.type_of(bucket.entry).precision >= 32 > tight(top):
        bucket = ctx.result(ctx.emit("clip", ctx.entry(bucket), a_min=0, a_max=top), INT32, 0, top, col)
    return level, table_index(ctx, level, bucket, t_bits, levels, entries)


def table_index(ctx, level: Tensor, bucket: Tensor, t_bits: int, levels: int, entries: int) -> Tensor:
    """3 2^(T-2) m + b: the entry of level m's bucket b in a table of ``entries`` (level 0's 2^T buckets, then each
    level's upper three quarters)."""
    step, col = 3 << (t_bits - 2), level.shape
    return proven(ctx, "broadcast_add", proven(ctx, "broadcast_mul", level, c32(step), 0, levels * step, col),
                  bucket, 0, entries - 1, col)


def wide_rows(ctx, u: Tensor, total: Tensor, n: int, p: LayerNormPlan) -> tuple[Tensor, Tensor]:
    """The wide form's D' = trunc(D / 2^p) (D = n u - sum u) and table index of each row: of Y's level and bucket,
    or of the exact V's where Y <= y_small (``small_v``)."""
    op = partial(proven, ctx)
    wide, rows, col = p.wide, u.shape, total.shape
    w = u.hi - u.lo
    d = op("broadcast_sub", op("broadcast_mul", u, c32(n), min(n * u.lo, 0), max(n * u.hi, 0), rows), total,
           -(n - 1) * w, (n - 1) * w, rows)
    _, rest, a = centred(ctx, u, total, n, wide.scale)
    high, low, _ = square_sums(ctx, a, n, w << wide.scale, 1 << wide.z, wide.p_top(n))
    t_max = (n - 1) >> wide.g
    t = op("broadcast_div", rest, c32(1 << wide.g), -t_max, t_max, col) if wide.g else rest
    rho = op("broadcast_div", op("broadcast_mul", t, t, 0, t_max * t_max, col), c32(wide.k), 0,
             t_max * t_max // wide.k, col)
    e = ctx.emit("clip", ctx.entry(op("broadcast_sub", high, rho, -rho.hi, high.hi, col)), a_min=0,
                 a_max=wide.y_max)
    y = ctx.result(e, INT32, 0, wide.y_max, col)
    first = wide.small_entries()
    index = levelled(ctx, y, p.table_bits, p.levels, p.table.size - first)[1] if p.levels else y
    if first:  # the exact V's entry where Y <= y_small
        index = op("broadcast_add", index, c32(first), first, p.table.size - 1, col)
        small = small_v(ctx, rest, high, low, n, wide)
        t_bits, levels = wide.small_shape
        small = levelled(ctx, small, t_bits, levels, first)[1] if levels else small
        gap = op("broadcast_sub", index, small, 1, p.table.size - 1, col)
        pick = op("broadcast_mul", op("broadcast_greater", y, c32(wide.y_small), 0, 1, col), gap, 0, gap.hi, col)
        index = op("broadcast_add", small, pick, 0, p.table.size - 1, col)
    if wide.shifts.any():
        e = ctx.emit("cvm_lut", ctx.entry(index), ctx.entry(c32(1 << wide.shifts)), in_dim=wide.shifts.size)
        d = op("broadcast_div", d, ctx.result(e, INT32, 1, 1 << int(wide.shifts.max()), col), -wide.d_bound,
               wide.d_bound, rows)
    return d, index


def small_v(ctx, rest: Tensor, high: Tensor, low: Tensor, n: int, wide: WideRows) -> Tensor:
    """V of each row of Y <= y_small, exactly (``small_rows_of``): 4^c V = n min(P' - Q_r, 2^z (y_small + 1) - 1)
    - R_r, R_r = r^2 - n ceil(Q_r / 2) - n floor(Q_r / 2) (each product within 32 bits), clipped to [0, v_small]
    (every row's value within its label; only those rows' are read)."""
    op = partial(proven, ctx)
    col, z, cap, t = rest.shape, wide.z, wide.cap, 2 * wide.scale
    top = ((wide.y_small + 1) << z) - 1
    r2 = op("broadcast_mul", rest, rest, 0, (n - 1) ** 2, col)
    qr = op("broadcast_div", r2, c32(n), 0, (n - 1) ** 2 // n, col)
    half = op("broadcast_div", qr, c32(2), 0, qr.hi // 2, col)
    more = op("broadcast_sub", qr, half, 0, qr.hi - qr.hi // 2, col)
    rr = op("broadcast_sub", r2, op("broadcast_mul", more, c32(n), 0, n * more.hi, col), 0, n - 1 + n * half.hi, col)
    rr = op("broadcast_sub", rr, op("broadcast_mul", half, c32(n), 0, n * half.hi, col), 0, n - 1, col)
    e = ctx.emit("clip", ctx.entry(high), a_min=0, a_max=cap)
    capped = op("broadcast_mul", ctx.result(e, INT32, 0, cap, col), c32(1 << z), 0, cap << z, col)
    whole = op("broadcast_add", capped, low, 0, ((cap + 1) << z) - 1, col)
    e = ctx.emit("clip", ctx.entry(op("broadcast_sub", whole, qr, -qr.hi, whole.hi, col)), a_min=0, a_max=top)
    v = op("broadcast_sub", op("broadcast_mul", ctx.result(e, INT32, 0, top, col), c32(n), 0, n * top, col), rr,
           1 - n, n * top, col)
    e = ctx.emit("clip", ctx.entry(v), a_min=0, a_max=wide.v_small << t)
    v = ctx.result(e, INT32, 0, wide.v_small << t, col)
    return op("broadcast_div", v, c32(1 << t), 0, wide.v_small, col) if t else v


def centred(ctx, u: Tensor, total: Tensor, n: int, c: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """(q, r, 2^c u - q) of each row: its truncated mean at c fraction bits, q = trunc(2^c sum u / n), and
    r = 2^c sum u - n q (|r| <= n - 1)."""
    op = partial(proven, ctx)
    rows, col, w = u.shape, total.shape, u.hi - u.lo
    if c:
        u = op("broadcast_mul", u, c32(1 << c), u.lo << c, u.hi << c, rows)
        total = op("broadcast_mul", total, c32(1 << c), total.lo << c, total.hi << c, col)
    mean = op("broadcast_div", total, c32(n), u.lo, u.hi, col)
    rest = op("broadcast_sub", total, op("broadcast_mul", mean, c32(n), n * u.lo, n * u.hi, col), 1 - n, n - 1, col)
    return mean, rest, op("broadcast_sub", u, mean, -w << c, w << c, rows)


def variance(ctx, u: Tensor, total: Tensor, n: int, rows, col) -> Tensor:
    """V = n sum u^2 - (sum u)^2 of each row, exactly (n^2 max|u|^2 within 32 bits)."""
    op = partial(proven, ctx)
    peak, w = max(-u.lo, u.hi), u.hi - u.lo
    square = op("broadcast_mul", u, u, 0, peak * peak, rows)
    squares = ctx.reshape(reduced(ctx, "sum", square, [1], 0, n * peak * peak), col)
    return op("broadcast_sub", op("broadcast_mul", squares, c32(n), 0, n * n * peak * peak, col),
              op("broadcast_mul", total, total, 0, (n * peak) ** 2, col), 0, n * n * w * w // 4, col)


def quartered(ctx, u: Tensor, total: Tensor, n: int, p: LayerNormPlan) -> tuple[Tensor, Tensor]:
    """The level m and bucket of V where V passes 32 bits, from integers that do not (docs/import.md): the row's
    truncated mean q = trunc(sum u / n), r = sum u - n q, P = sum (u - q)^2, so V = n P - r^2; V_q = floor(V / 4^Q)
    = n floor(P / 4^Q) + floor((n (P mod 4^Q) - r^2 + C) / 4^Q) - C / 4^Q (C = 4^Q ceil(n^2 / 4^Q) makes the
    dividend positive); the level from V_q (every threshold 4^k 2^T is a multiple of 4^Q, T >= 2Q), the bucket
    floor(V_q / 4^(m-Q)) at levels m >= Q, else floor(V / 4^m) of V = n min(P, P_s) - r^2, exact on those rows."""
    op = partial(proven, ctx)
    outer = u.shape[0]
    col = (outer, 1)
    w, quarter, size = u.hi - u.lo, p.quarter, 1 << p.table_bits
    unit = 1 << (2 * quarter)
    _, rest, du = centred(ctx, u, total, n)
    p_top = (n * n * w * w // 4 + (n - 1) ** 2) // n  # n P = V + r^2, V <= n^2 w^2 / 4
    high, low, whole = square_sums(ctx, du, n, w, unit, p_top)
    r2 = op("broadcast_mul", rest, rest, 0, (n - 1) ** 2, col)
    lift = -(-n * n // unit)
    y = op("broadcast_add", op("broadcast_sub", op("broadcast_mul", low, c32(n), 0, n * (unit - 1), col), r2,
                               -(n - 1) ** 2, n * (unit - 1), col), c32(lift * unit),
           lift * unit - (n - 1) ** 2, n * (unit - 1) + lift * unit, col)
    v_top = (n * n * w * w // 4) >> (2 * quarter)
    vq = op("broadcast_sub", op("broadcast_add", op("broadcast_mul", high, c32(n), 0, n * (p_top // unit), col),
                                op("broadcast_div", y, c32(unit), 0, (n * (unit - 1)) // unit + lift, col),
                                0, n * (p_top // unit) + (n * (unit - 1)) // unit + lift, col),
            c32(lift), 0, v_top, col)
    thresholds = c32([[((size << (2 * m)) >> (2 * quarter)) - 1 for m in range(p.levels)]])
    above = op("broadcast_greater", vq, thresholds, 0, 1, (outer, p.levels))
    level = ctx.reshape(reduced(ctx, "sum", above, [1], 0, p.levels), col)
    p_small = small_rows(n, p.table_bits, quarter)
    if whole is None:  # min(P, P_s) = min(4^Q min(floor(P / 4^Q), floor(P_s / 4^Q) + 1) + P mod 4^Q, P_s)
        cap = p_small // unit + 1
        e = ctx.emit("clip", ctx.entry(high), a_min=0, a_max=min(cap, p_top // unit))
        capped = op("broadcast_mul", ctx.result(e, INT32, 0, min(cap, p_top // unit), col), c32(unit), 0,
                    cap * unit, col)
        whole = op("broadcast_add", capped, low, 0, cap * unit + unit - 1, col)
    e = ctx.emit("clip", ctx.entry(whole), a_min=0, a_max=p_small)
    small = op("broadcast_sub", op("broadcast_mul", ctx.result(e, INT32, 0, p_small, col), c32(n), 0, n * p_small,
                                   col), r2, -(n - 1) ** 2, n * p_small, col)

    def lut(values: list[int]) -> Tensor:
        e = ctx.emit("cvm_lut", ctx.entry(level), ctx.entry(c32(values)), in_dim=p.levels + 1)
        return ctx.result(e, INT32, min(values), max(values), col)

    # < 2^T on every row: floor(V / 4^m) at a level m >= Q; V_q < 2^(T-2) below
    top = op("broadcast_div", vq, lut([1 << (2 * max(m - quarter, 0)) for m in range(p.levels + 1)]), 0, size - 1,
             col)
    bottom = op("broadcast_div", small, lut([1 << (2 * min(m, quarter - 1)) for m in range(p.levels + 1)]),
                small.lo, small.hi, col)
    above_q = op("broadcast_greater", level, c32(quarter - 1), 0, 1, col)
    gap = op("broadcast_sub", top, bottom, -bottom.hi, top.hi - bottom.lo, col)
    pick = op("broadcast_mul", above_q, gap, min(gap.lo, 0), max(gap.hi, 0), col)
    return level, op("broadcast_add", bottom, pick, 0, size - 1, col)


def chunk(n: int, w: int) -> int:
    """The most values b, a divisor of n, whose sum of squares (each <= w^2) keeps its CVM label within 32 bits
    (``quartered_fits``); 1 where none but 1 does."""
    b = min(n, (1 << max(31 - 2 * tight(w), 0)) - 1)
    while n % b:
        b -= 1
    return b


def square_sums(ctx, du: Tensor, n: int, w: int, unit: int, p_top: int) -> tuple[Tensor, Tensor, Tensor | None]:
    """(floor(P / 4^Q), P mod 4^Q, P) of each row's P = sum du^2 (|du| <= w, P <= p_top); where the sum passes 32
    bits in CVM's labels, from sums of b = ``chunk(n, w)`` squares, P itself None: P = 4^Q H + L with
    H = sum floor(P_j / 4^Q) and L = sum P_j mod 4^Q over the n / b parts P_j, so floor(P / 4^Q) = H +
    floor(L / 4^Q)."""
    op = partial(proven, ctx)
    outer, b = du.shape[0], chunk(n, w)
    a, col = n // b, (outer, 1)
    square = op("broadcast_mul", du, du, 0, w * w, du.shape)
    if a == 1:
        sq = ctx.reshape(reduced(ctx, "sum", square, [1], 0, p_top), col)
        high = op("broadcast_div", sq, c32(unit), 0, p_top // unit, col)
        return high, op("broadcast_sub", sq, op("broadcast_mul", high, c32(unit), 0, p_top // unit * unit, col), 0,
                        unit - 1, col), sq
    part, top = (outer, a), b * w * w
    sums = ctx.reshape(reduced(ctx, "sum", ctx.reshape(square, (outer, a, b)), [2], 0, top), part)
    highs = op("broadcast_div", sums, c32(unit), 0, top // unit, part)
    lows = op("broadcast_sub", sums, op("broadcast_mul", highs, c32(unit), 0, top // unit * unit, part), 0,
              unit - 1, part)
    over = ctx.reshape(reduced(ctx, "sum", lows, [1], 0, a * (unit - 1)), col)
    carry = op("broadcast_div", over, c32(unit), 0, a * (unit - 1) // unit, col)
    high = op("broadcast_add", ctx.reshape(reduced(ctx, "sum", highs, [1], 0, p_top // unit), col), carry, 0,
              p_top // unit, col)
    return high, op("broadcast_sub", over, op("broadcast_mul", carry, c32(unit), 0, carry.hi * unit, col), 0,
                    unit - 1, col), None


def real_values(x, size: int, what: str, op: str = "LayerNormalization", over: str = "normalized positions") \
        -> np.ndarray:
    """A constant gamma or beta (a dequantized constant, as quantize_static writes them, or a float one) as exact
    Fractions broadcast over ``size`` values (flat: ``over``), one Fraction per distinct stored value (a per-tensor
    dequantized constant's integers, a float constant's floats), shared by its positions."""
    if isinstance(x, Scaled) and x.t.is_const and x.per_tensor:
        v = np.broadcast_to(x.t.value, x.shape)
        zero, scale = int(x.zero.reshape(-1)[0]), x.scale.reshape(-1)[0]
        real = lambda q: Fraction((int(q) - zero) * scale)  # noqa: E731
    elif isinstance(x, Scaled) and x.t.is_const:
        v, real = np.broadcast_to((x.t.value.astype(np.int64) - x.zero) * x.scale, x.shape), Fraction
    elif isinstance(x, Tensor) and x.is_const and np.asarray(x.value).dtype.kind == "f":
        v, real = np.asarray(x.value), lambda q: Fraction(float(q))  # noqa: E731
    else:
        raise Refuse(f"{op} {what} must be a constant")
    if v.size not in (1, size):
        raise Refuse(f"{op} {what} of {v.size} values for {size} {over}")
    flat = np.broadcast_to(v.reshape(-1), (size,))
    if flat.dtype == object:
        return np.array([real(q) for q in flat], dtype=object)
    distinct, at = np.unique(flat, return_inverse=True)
    return np.array([real(q) for q in distinct], dtype=object)[at.reshape(-1)]


def per_distinct(f: Callable, v: np.ndarray) -> np.ndarray:
    """``f`` of each value of the object array ``v``, computed once per distinct object (``real_values`` shares
    one among equal values)."""
    done: dict[int, object] = {}
    out = np.empty(v.shape, object)
    out.flat[:] = [done[id(x)] if id(x) in done else done.setdefault(id(x), f(x)) for x in v.flat]
    return out


def epsilon(node, op: str) -> Fraction:
    """The node's ``epsilon`` (float32, default 1e-5), which must be > 0 and finite."""
    eps = float(np.float32(node.attr_float("epsilon", 1e-5)))
    if not 0 < eps < math.inf:
        raise Refuse(f"{op} epsilon must be > 0 and finite (a constant row is 0 / 0 otherwise), not {eps}")
    return Fraction(eps)


@float_rule("LayerNormalization", since=17)
def layer_norm_rule(ctx, node, x, gamma, beta=None):
    """LayerNormalization (inference: its Mean and InvStdDev outputs unused) of a per-tensor dequantized x over the
    axes from ``axis`` on: a ``Normalized`` value, integers by the QuantizeLinear that follows."""
    if len([o for o in node.proto.output if o]) > 1:
        raise Refuse("LayerNormalization's Mean and InvStdDev outputs have no CVM form")
    x = per_tensor(scaled(x, "the LayerNormalization input"), "LayerNormalization")
    rank = len(x.shape)
    [axis] = normal([node.attr_int("axis", -1)], rank, "LayerNormalization axis")
    n = math.prod(x.shape[axis:])
    eps = epsilon(node, "LayerNormalization")
    planned_width(n)
    planned_pairs(n, gamma, beta, n)
    g = real_values(gamma, n, "Scale")
    b = real_values(beta, n, "B") if beta is not None else np.array([Fraction(0)] * n, dtype=object)
    return Normalized(x, (math.prod(x.shape[:axis]), n), g, b, eps, node.name)


def channel_normalized(node, x, scale, bias, op: str, groups: int | None = None) -> Normalized:
    """Instance- or GroupNormalization of a per-tensor dequantized x (N, C, D1, ...) in ``groups`` groups of C / G
    channels (None: one per channel): a ``Normalized`` value over rows (N G, C / G D1 ...), scale and bias
    constants per channel, integers by the QuantizeLinear that follows."""
    x = per_tensor(scaled(x, f"the {op} input"), op)
    if len(x.shape) < 3:
        raise Refuse(f"{op} of rank {len(x.shape)} (at least 3: N, C, D1, ...)")
    c = x.shape[1]
    groups = c if groups is None else groups
    if groups < 1 or c % groups:
        raise Refuse(f"{op} num_groups {groups} must divide the {c} channels")
    eps = epsilon(node, op)
    size = math.prod(x.shape[2:])
    planned_width(c // groups * size)
    planned_pairs(c // groups * size, scale, bias, c)
    g, b = (real_values(v, c, what, op, "channels") for v, what in ((scale, "scale"), (bias, "bias")))
    return Normalized(x, (x.shape[0] * groups, c // groups * size), g, b, eps, node.name, op, (x.shape[0], c, size))


@float_rule("InstanceNormalization", since=6)
def instance_norm_rule(ctx, node, x, scale, bias):
    """InstanceNormalization: each (n, c)'s values normalized (torch's GroupNorm: x as (N, G, -1) here)."""
    return channel_normalized(node, x, scale, bias, "InstanceNormalization")


@float_rule("GroupNormalization", since=21)
def group_norm_rule(ctx, node, x, scale, bias):
    """GroupNormalization (opset 21; onnx's checker refuses opset 18's, deprecated): each (n, group)'s values
    normalized."""
    return channel_normalized(node, x, scale, bias, "GroupNormalization", node.attr_int("num_groups", 0))
