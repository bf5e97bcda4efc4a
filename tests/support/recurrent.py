"""The integer form of the recurrent layers' steps (docs/import.md, "LSTM: the integer form", GRU and RNN after it),
written from the docs in Python integers for the oracle tests: weights drawn as 16-bit integers with their
power-of-two scales, and the shared pieces of a step (the pre-activations on their grids, the tables)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

ONE_H = 127 * 128  # h at 1/16256
FINE = 14  # products on the grid 2^-14 (2^-(10 + 4))
REACH = 16 << 10  # pre-activations clipped to [-16, 16] in steps of 2^-10


def rhu(x, k: int):
    """round_half_up(x / 2^k)."""
    return (x + (1 << (k - 1))) >> k


def times(v, a: int):
    """v 2^a: exact for a >= 0, else rounded half up."""
    return v * (1 << a) if a >= 0 else rhu(v, -a)


def ints16(rng, shape) -> np.ndarray:
    """Integers in [-16256, 16256], one of them +-16256 (so the importer's per-tensor scale is recovered)."""
    q = rng.integers(-ONE_H, ONE_H + 1, shape)
    q.flat[rng.integers(0, q.size)] = ONE_H * rng.choice([-1, 1])
    return q


def halves(q):
    """(hi, lo): q = 128 hi + lo, hi = round_half_up(q / 128)."""
    hi = rhu(q, 7)
    return hi, q - 128 * hi


def obj(a) -> np.ndarray:
    return np.asarray(a, np.int64).astype(object)


def x_part(x, w16, e_w: int, bias) -> np.ndarray:
    """x W^T + b on 2^-14 for x at s_x and W = w16 2^-e_w / s_x: x W_hi^T 2^(21-e_w) and x W_lo^T 2^(14-e_w),
    each rounded, plus b rounded half to even to 2^-14."""
    hi, lo = halves(w16)
    b = np.array([round(Fraction(float(v)) * (1 << FINE)) for v in bias], dtype=object)
    return times(obj(x) @ obj(hi).T, 21 - e_w) + times(obj(x) @ obj(lo).T, 14 - e_w) + b


def h_part(h, r16, e_r: int) -> np.ndarray:
    """h R^T on 2^-14 for h at 1/16256 and R = r16 127 2^-e_r: with h = 128 h_hi + h_lo, R = 128 R_hi + R_lo,
    h_hi R_hi^T 2^(21-e_r) + (h_hi R_lo^T + h_lo R_hi^T) 2^(14-e_r) + h_lo R_lo^T 2^(7-e_r), each rounded."""
    hh, hl = halves(obj(h))
    rh, rl = halves(obj(r16))
    return (times(hh @ rh.T, 21 - e_r) + times(hh @ rl.T + hl @ rh.T, 14 - e_r) + times(hl @ rl.T, 7 - e_r))


def index(fine) -> np.ndarray:
    """A pre-activation on 2^-14 rounded to 2^-10 and clipped to [-16, 16]."""
    return np.clip(rhu(fine, 4), -REACH, REACH)


def lookup(tab: list[int], k, reach: int = REACH) -> np.ndarray:
    return np.vectorize(lambda v: tab[int(v) + reach], otypes=[object])(k)


def gate_tables(g: int) -> tuple[list[int], list[int]]:
    """round(2^G sigmoid(k / 1024)), round(2^G tanh(k / 1024)), k in [-16384, 16384]."""
    return ([round((1 << g) / (1 + math.exp(-k / 1024))) for k in range(-REACH, REACH + 1)],
            [round((1 << g) * math.tanh(k / 1024)) for k in range(-REACH, REACH + 1)])


def state(h0) -> np.ndarray:
    return obj(np.rint(h0 * ONE_H))


def lstm_bits(steps: int, c0: float) -> int:
    """G = 14, one fewer while 2^G (ceil|c0| + steps + 1) >= 2^28."""
    g = 14
    while ((1 << g) * (math.ceil(c0) + steps + 1)).bit_length() > 28:
        g -= 1
    return g


def split_bits(g: int, steps: int, c0: float) -> int:
    """K >= 1, the fewest with rhu(C, K) < 2^(28 - G), C = 2^G (ceil|c0| + steps + 1) the bound of c."""
    bound, k = (1 << g) * (math.ceil(c0) + steps + 1), 1
    while rhu(bound, k).bit_length() > 28 - g:
        k += 1
    return k


def lstm(x, w16, e_w: int, r16, e_r: int, bias, h0, c0, order, g: int, pq=None, e_p: int = 0):
    """The integer LSTM of docs/import.md: z from x W^T + b and h R^T on 2^-14, rounded to 2^-10 and clipped to
    +-16, the gates from round(2^G sigmoid(k / 1024)) and round(2^G tanh(k / 1024)); with c = 2^K c_hi + c_lo
    (c_hi = rhu(c, K), ``split_bits``) and m c = m c_hi + rhu(m c_lo, K) at 2^K times m's scale and c's, c' =
    times(f c, K - G) + rhu(i g, G), tanh(c') from round(2^G tanh(k / 2048)) at c' on 2^-11 clipped to +-8, y =
    rhu(o tanh(c'), G), h' = rhu(127 y, G - 7) at 1/16256; with peepholes ``pq`` (i, o, f; P at 2^-e_p): z of i
    and f plus times(P_q c, 14 - e_p - G + K), z of o plus times(P_q c', 14 - e_p - G + K) with the new c'. Python
    integers: (ys in ``order``, h, c)."""
    hidden = r16.shape[1]
    k = split_bits(g, len(order), float(np.abs(c0).max(initial=0)))

    def cell(m, c):
        hi = rhu(c, k)
        return m * hi + rhu(m * (c - hi * (1 << k)), k)

    sig, tnh = gate_tables(g)
    ctab = [round((1 << g) * math.tanh(k / 2048)) for k in range(-16384, 16385)]
    h, c = state(h0), obj(np.rint(c0 * (1 << g)))
    p_i, p_o, p_f = (obj(np.zeros(hidden, np.int64) if pq is None else pq[k * hidden:(k + 1) * hidden])
                     for k in range(3))
    a = FINE - e_p - g + k
    ys = {}
    for t in order:
        pre = x_part(x[t], w16, e_w, bias) + h_part(h, r16, e_r)
        part = [pre[:, k * hidden:(k + 1) * hidden] for k in range(4)]
        i = lookup(sig, index(part[0] + times(cell(p_i, c), a)))
        f = lookup(sig, index(part[2] + times(cell(p_f, c), a)))
        cand = lookup(tnh, index(part[3]))
        c = times(cell(f, c), k - g) + rhu(i * cand, g)
        o = lookup(sig, index(part[1] + times(cell(p_o, c), a)))
        at = c * (1 << (11 - g)) if g <= 11 else rhu(c, g - 11)
        ys[t] = rhu(o * lookup(ctab, np.clip(at, -16384, 16384), 16384), g)
        h = rhu(ys[t] * 127, g - 7)
    return [ys[t] for t in order], h, c
