"""LSTM, GRU and RNN of a dequantized sequence with float weights (as quantize_static leaves them between a
DequantizeLinear and a QuantizeLinear), unrolled over the fixed length into CVM ops (docs/import.md, "LSTM: the
integer form").

W and R are quantized per tensor to 16 bits (w = 128 w_hi + w_lo, both 8-bit) at power-of-two scales (``wide``); h
is held as integers at scale 1 / (127 2^7) (h = 128 h_hi + h_lo, both 8-bit), so x W^T and h R^T are sums of 8-bit
``dense`` products, each shifted to steps of 2^-14, summed, rounded to steps of 2^-10 and clipped to [-16, 16];
sigmoid and tanh tables give the gates at 2^-G. LSTM (G = 14): c = 2^K c_hi + c_lo, c' = round(f c / 2^G) +
round(i g / 2^G) at 2^-G, f c as f c_hi + round(f c_lo / 2^K); tanh(c') from a table over c' rounded to 2^-11 and
clipped to [-8, 8]; Y = round(o tanh(c') / 2^G) at 2^-G and h' = round(127 Y / 2^(G-7)). GRU: h' = round(127 (2^G
- z) n / 2^(2G-7)) + round(z h / 2^G). RNN (tanh or sigmoid): Y = f(x W^T + b + h R^T) from the table at 2^-G, h' =
round(127 Y / 2^(G-7)).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from onnx import TensorProto

from cvm_onnx.core.constants import tight

from ..context import INT32, Tensor, const
from ..emit import as_int32, concatenated, strided_slice
from ..registry import Refuse, float_rule
from .products import dense
from .values import Scaled, per_tensor, scaled

INDEX_BITS = 10  # gate pre-activations in steps of 2^-10
FINE_BITS = 4  # each product shifted to steps of 2^-14 before their sum is rounded to 2^-10
GATE_REACH = 16  # clipped to [-16, 16]: sigmoid and tanh are within 2^-23 of their limits beyond
CELL_BITS = 11  # tanh(c) looked up at c rounded to 2^-11
CELL_REACH = 8  # clipped to [-8, 8]
H_STEPS = 127  # h's high half at scale 1/127
LOW_BITS = 7  # h = 2^7 h_hi + h_lo, w = 2^7 w_hi + w_lo
H_ONE = H_STEPS << LOW_BITS  # h at scale 1/16256; |weights| <= 16256
RNN_BITS = 12  # an RNN's outputs at 2^-12
LSTM_BITS = 14  # an LSTM's gates, c and Y at 2^-14 (fewer only where |c_0| + steps passes 2^14)
MAX_NODES = 1 << 17  # CVM nodes a layer unrolls into, over its directions (the import's time and memory linear in them)


def gate_bits(steps: int, c0: float) -> int:
    """A GRU's G (at most 10 there; an LSTM's is ``lstm_bits``): the most bits <= 12 with 2^G times 2^G (|c0| +
    steps + 1) and 2^2G times 127 within 32 bits."""
    g = 12
    while g > 4 and (tight(1 << g) + tight((1 << g) * (math.ceil(c0) + steps + 1)) > 32 or
                     tight(1 << (2 * g)) + tight(H_STEPS) > 32):
        g -= 1
    return g


def lstm_bits(steps: int, c0: float) -> int:
    """An LSTM's G: LSTM_BITS, fewer while c's bound 2^G (ceil|c0| + steps + 1) reaches 2^28 (|c'| <= f |c| + |i g|
    <= |c| + 1 per step), so that c's halves (``cell_split``) and their products keep CVM's labels within 32 bits;
    refused below 8 (h' = rhu(127 Y, G - 7))."""
    g = LSTM_BITS
    while tight((1 << g) * (math.ceil(c0) + steps + 1)) > 29:
        if g == 8:
            raise Refuse(f"an LSTM initial_c reaching {c0:.3g}: its cell state on the grid 2^-8 passes 28 bits")
        g -= 1
    return g


def cell_split(g: int, steps: int, c0: float) -> int:
    """K >= 1, the fewest bits with c = 2^K c_hi + c_lo (c_hi = rhu(c, K)) such that f c_hi and P_q c_hi (|f|,
    |P_q| <= 2^G) plus rhu(f c_lo, K) keep CVM's labels within 32 bits: tight(2^G) + tight(rhu(C, K)) <= 31, C =
    2^G (ceil|c0| + steps + 1) the bound of c."""
    bound, k = (1 << g) * (math.ceil(c0) + steps + 1), 1
    while tight(1 << g) + tight((bound + (1 << (k - 1))) >> k) > 31:
        k += 1
    return k


def wide(w: np.ndarray, unit: Fraction) -> tuple[np.ndarray, Fraction]:
    """(w in 16 bits per tensor, its scale s = unit 2^-e): e the largest with max|w| <= 16256 s, the integers
    round_half_even(w / s) (float64 quotients within 2^-20 of a half-integer recomputed in exact Fractions). unit
    1 / s_x makes s_x s = 2^-e, unit 127 against h at 1/16256 makes s / 16256 = 2^-(e+7): every product's scale a
    power of two."""
    if not np.isfinite(w).all():
        raise Refuse("the recurrent layer's weights hold NaN or infinity")
    peak = Fraction(float(np.abs(w).max(initial=0)))
    if not peak:
        return np.zeros(w.shape, np.int64), unit
    e = math.floor(math.log2(H_ONE * unit / peak))
    while peak > H_ONE * unit * Fraction(2) ** -e:
        e -= 1
    while peak <= H_ONE * unit * Fraction(2) ** -(e + 1):
        e += 1
    scale = unit * Fraction(2) ** -e
    ratio = w.astype(np.float64) / float(scale)
    q = np.rint(ratio)
    for i, j in zip(*np.nonzero(np.abs(np.abs(ratio - np.trunc(ratio)) - 0.5) < 2.0**-20)):
        q[i, j] = round(Fraction(float(w[i, j])) / scale)
    return np.clip(q, -H_ONE, H_ONE).astype(np.int64), scale


def halves16(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) with q = 2^7 hi + lo: hi = round_half_up(q / 2^7) in [-127, 127] (|q| <= 16256), lo in [-64, 63]."""
    hi = (q + (1 << (LOW_BITS - 1))) >> LOW_BITS
    return hi, q - (hi << LOW_BITS)


def table(ctx, index: Tensor, values: Tensor, lo: int, hi: int) -> Tensor:
    """cvm_lut of ``index`` (0-based, within the table) into the constant ``values`` (one param however often)."""
    e = ctx.emit("cvm_lut", ctx.entry(index), ctx.entry(values), in_dim=values.size)
    return ctx.result(e, INT32, lo, hi, index.shape)


def exponent(m: Fraction) -> int:
    """a with 2^a 2^-14 = m (m a power of two, by ``wide``)."""
    m = m * (1 << (INDEX_BITS + FINE_BITS))
    return m.numerator.bit_length() - m.denominator.bit_length()


def fine(ctx, v: Tensor, a: int) -> Tensor:
    """v at scale 2^a 2^-14 in steps of 2^-14: v 2^a, or round_half_up(v / 2^-a) (``cvm_right_shift``)."""
    v = as_int32(v)
    if a >= 0:
        if not on_grid(v, a):
            raise Refuse(f"a product of the recurrent layer's weights on the grid 2^-14 reaches "
                         f"2^{(max(-v.lo, v.hi) << a).bit_length()}: beyond CVM's 32 bits (its label and 2^{a}'s)")
        return step(ctx, "broadcast_mul", v, c32(1 << a), v.lo << a, v.hi << a) if a else v
    if -a > 31:  # |v| < 2^31 rounds to 0
        return c32(np.zeros(v.shape, np.int64))
    return shift(ctx, v, -a)


def step(ctx, name: str, a: Tensor, b: Tensor, lo: int, hi: int) -> Tensor:
    e = ctx.op(name, a, b)
    return ctx.result(e, INT32, lo, hi, ctx.type_of(e).shape)


def added(ctx, a: Tensor, b: Tensor) -> Tensor:
    return step(ctx, "broadcast_add", a, b, a.lo + b.lo, a.hi + b.hi)


def shift(ctx, x: Tensor, k: int) -> Tensor:
    """round_half_up(x / 2^k) (cvm_right_shift by k >= 1)."""
    peak = max(-x.lo, x.hi)
    bound = (peak + (1 << (k - 1))) >> k
    e = ctx.emit("cvm_right_shift", ctx.narrow(x, tight(peak)), precision=tight(bound), shift_bit=k)
    return ctx.result(e, INT32, -bound, bound, x.shape)


def clipped(ctx, x: Tensor, reach: int) -> Tensor:
    if x.lo >= -reach and x.hi <= reach:
        return x
    e = ctx.emit("clip", ctx.entry(x), a_min=-reach, a_max=reach)
    return ctx.result(e, INT32, max(x.lo, -reach), min(x.hi, reach), x.shape)


def c32(v) -> Tensor:
    return const(np.asarray(v, np.int64).astype(np.int32), INT32)


@dataclass(frozen=True, eq=False)
class Carried:
    """One direction's initial state a model takes as an input (``carried``): its integers on the layer's grid."""

    t: Tensor
    peak: float  # a bound on its real |values|


def initial(t, what: str, shape: tuple[int, int, int], top: int | None = None) -> np.ndarray | Scaled:
    """An initial state: a constant (zeros when absent) as float64 of ``shape`` (``floats``), or a per-tensor
    dequantized input, the state a streaming model carries from its last call, as it is; refused where its grid
    holds more than 2^16 integers, or reaches past +-``top`` (h: |h| <= 1 wherever a layer writes it) by more than
    one step."""
    if t is None or (isinstance(t, Scaled) and t.t.is_const) or (isinstance(t, Tensor) and t.is_const):
        return floats(t, what, shape)
    x = per_tensor(scaled(t, f"the {what}"), what)
    if x.shape != shape:
        raise Refuse(f"the {what} of shape {x.shape}, not {shape}")
    if x.t.hi - x.t.lo >= 1 << 16:
        raise Refuse(f"the {what} on a grid of {x.t.hi - x.t.lo + 1:,} integers: at most 2^16 (a table of them)")
    s = x.scale.reshape(()).item()
    if top is not None and grid_reach(x) > top + s:
        raise Refuse(f"the {what} on a grid reaching {float(grid_reach(x)):.3g}: a state within [-{top}, {top}] (one "
                     "step past it at most) expected")
    return x


def grid_reach(x: Scaled) -> Fraction:
    """max |(q - z) s| over the integers q of a per-tensor ``x``."""
    z = int(x.zero.reshape(()))
    return max(abs(x.t.lo - z), abs(x.t.hi - z)) * x.scale.reshape(()).item()


def peak_of(v: np.ndarray | Scaled) -> float:
    """A bound on an initial state's |values| (``initial``)."""
    return float(grid_reach(v)) if isinstance(v, Scaled) else float(np.abs(v).max(initial=0))


def carried(ctx, x: Scaled, unit: int, top: int | None = None) -> list[Carried]:
    """A carried initial state (``initial``, (dirs, batch, hidden)) per direction at 1/``unit``: a table of its
    integers q, round_half_even((q - z) s unit), clipped to +-``top`` unit where given (a grid point of h past 1 by
    less than a step: the float state it stands for is within [-1, 1]); refused where a value passes 32 bits."""
    z, s = int(x.zero.reshape(())), x.scale.reshape(()).item()
    values = [round((q - z) * s * unit) for q in range(x.t.lo, x.t.hi + 1)]
    if top is not None:
        values = [min(max(v, -top * unit), top * unit) for v in values]
    if max(map(abs, values)) >= 1 << 31:
        raise Refuse(f"an initial state reaching {float(grid_reach(x)):.3g}: past 32 bits at 1/{unit}")
    q = as_int32(x.t)
    index = step(ctx, "broadcast_sub", q, c32(x.t.lo), 0, x.t.hi - x.t.lo) if x.t.lo else q
    v = table(ctx, index, c32(values), min(values), max(values))
    dirs, batch, hidden = x.shape
    return [Carried(ctx.reshape(strided_slice(ctx, v, [range(d, d + 1), range(batch), range(hidden)]),
                                (batch, hidden)), float(grid_reach(x))) for d in range(dirs)]


def state(h0: np.ndarray | Carried, op: str) -> Tensor | None:
    """An initial h at 1/16256 (None when zero); refused where that passes 32 bits."""
    if isinstance(h0, Carried):
        return h0.t
    q = np.rint(h0 * H_ONE)
    if np.abs(q).max(initial=0) >= 1 << 31:
        raise Refuse(f"{op} initial_h reaching {float(np.abs(h0).max()):.3g}: past 32 bits at 1/{H_ONE}")
    return c32(q.astype(np.int64)) if h0.any() else None


def projected(ctx, xs: Scaled, w: np.ndarray, bias: np.ndarray, reach: int) -> Tensor:
    """x W^T + b over every step at 2^-14, clipped at +-``reach``: W in 16 bits (``wide``, s_x s_W a power of
    two), x W_hi^T and x W_lo^T (two ``dense``) each shifted to 2^-14, b rounded to 2^-14."""
    wq, sw = wide(w, 1 / per_tensor(xs, "the recurrent layer's input").scale.reshape(()).item())
    hi, lo = halves16(wq)
    rows = np.full(len(w), sw, dtype=object)
    xh, xl = dense(ctx, xs, hi, rows * (1 << LOW_BITS), None), dense(ctx, xs, lo, rows, None)
    ah, al = exponent(xh.scale.flat[0]), exponent(xl.scale.flat[0])
    units = grid_bias(bias)
    if on_grid(xh.t, ah) and on_grid(xl.t, al):
        xw = added(ctx, fine(ctx, xh.t, ah), fine(ctx, xl.t, al))
    else:  # past +-(reach + |b|) the clip below gives +-reach whatever b
        xw = saturated(ctx, xh.t, xl.t, al, (reach << (INDEX_BITS + FINE_BITS)) + int(np.abs(units).max(initial=0)))
    if units.any():
        xw = step(ctx, "broadcast_add", xw, c32(units.reshape(1, 1, -1)), xw.lo + int(units.min()),
                  xw.hi + int(units.max()))
    return clipped(ctx, xw, reach << (INDEX_BITS + FINE_BITS))


def on_grid(v: Tensor, a: int) -> bool:
    """Whether v 2^a (``fine``: a ``broadcast_mul`` by 2^a for a > 0) keeps CVM's label, v's precision plus
    2^a's, within 32 bits."""
    return a <= 0 or tight(max(-v.lo, v.hi)) + tight(1 << a) <= 32


def saturated(ctx, hi: Tensor, lo: Tensor, a: int, top: int) -> Tensor:
    """x W_hi^T 2^(a+7) + x W_lo^T 2^a on 2^-14 where a part passes 32 bits there (an input scale s_x large
    against W: x W^T reaching 2^17), clipped first with a bound that keeps every value the clip to +-``reach`` makes
    of the sum plus b (|x W^T| >= ``top`` = reach 2^14 + max|b| gives +-reach whatever b): in units 2^m, m = max(a,
    0), lo' = x W_lo^T 2^(a-m) (rounded half up where a < 0), hi clipped to +-ceil((ceil(top / 2^m) + max|lo'|) /
    2^(a+7-m)) (past which hi alone puts the sum past the top whatever lo'), their sum v clipped to
    +-ceil(top / 2^m) and put on 2^-14 as v 2^m; within 32 bits while ceil(top / 2^m) 2^m and the sum do."""
    m = max(a, 0)
    low = fine(ctx, lo, a) if a < 0 else as_int32(lo)
    k = a + LOW_BITS - m
    top_m = -(-top >> m)
    high = clipped(ctx, as_int32(hi), -(-(top_m + max(-low.lo, low.hi)) >> k))
    v = added(ctx, fine(ctx, high, k), low)
    return fine(ctx, clipped(ctx, v, top_m), m) if m else v


def grid_bias(b: np.ndarray) -> np.ndarray:
    """b rounded half to even to 2^-14; refused where it passes 30 bits there (|b| >= 2^16)."""
    units = [round(Fraction(float(v)) * (1 << (INDEX_BITS + FINE_BITS))) for v in b]
    if any(abs(u) >= 1 << 30 for u in units):
        raise Refuse(f"a recurrent layer's bias reaches {float(np.abs(b).max()):.3g}: beyond 2^30 steps of 2^-14")
    return np.array(units, np.int64)


def split(ctx, h: Tensor, k: int = LOW_BITS) -> tuple[Tensor, Tensor]:
    """h as (h_hi, h_lo), h = 2^k h_hi + h_lo: h_hi = round_half_up(h / 2^k), h_lo in [-2^(k-1), 2^(k-1)) (both
    8-bit for h's |h| <= 16256 and k = 7)."""
    hi = shift(ctx, h, k)
    back = step(ctx, "broadcast_mul", hi, c32(1 << k), hi.lo << k, hi.hi << k)
    return hi, step(ctx, "broadcast_sub", h, back, -(1 << (k - 1)), (1 << (k - 1)) - 1)


def weights(r: np.ndarray) -> list[tuple[Tensor, int, int]]:
    """R in 16 bits against h at 1/16256 (``wide``: R = s (2^7 R_hi + R_lo), s = 127 2^-e) as the three ``dense``
    weights of ``recurrent``, each (an int8 constant, one param however many steps read it; its largest row sum of
    |R|; a, its products' scale 2^a 2^-14): R_hi (2^7 s / 127), [R_lo, R_hi] (s / 127), R_lo (s / 16256)."""
    rq, sr = wide(r, Fraction(H_STEPS))
    rh, rl = halves16(rq)
    return [(const(m.astype(np.int8), TensorProto.INT8), int(np.abs(m).sum(axis=1).max(initial=0)), exponent(sr * k))
            for m, k in ((rh, Fraction(1 << LOW_BITS, H_STEPS)), (np.concatenate([rl, rh], axis=1),
                                                                Fraction(1, H_STEPS)), (rl, Fraction(1, H_ONE)))]


def recurrent(ctx, h: Tensor, r: list[tuple[Tensor, int, int]]) -> Tensor:
    """h R^T at 2^-14 for h at 1/16256: with h = 2^7 h_hi + h_lo, the sum of three ``dense`` products (``weights``)
    each shifted to 2^-14: h_hi R_hi^T, [h_hi, h_lo] [R_lo, R_hi]^T and h_lo R_lo^T."""
    hh, hl = split(ctx, h)
    out = None
    for x, (w, rows, a) in zip((hh, concatenated(ctx, 1, hh, hl), hl), r):
        e = ctx.emit("dense", ctx.narrow(x, 8, "h's half"), ctx.entry(w), use_bias=False, units=w.shape[0])
        reach = rows * max(-x.lo, x.hi)
        v = fine(ctx, ctx.result(e, INT32, -reach, reach, (x.shape[0], w.shape[0])), a)
        out = v if out is None else added(ctx, out, v)
    return out


def reach_of(r: np.ndarray) -> int:
    """A bound on |h R^T| (|h| <= 1) plus the gates' reach and a margin of two: max_r sum |R_r| in float64."""
    return GATE_REACH + math.ceil(float(np.abs(r).sum(axis=1).max(initial=0))) + 2


def peepholes(p: np.ndarray, g: int) -> tuple[np.ndarray, int]:
    """P (3 hidden: i, o, f) per tensor at 2^-e, e the largest with max|P| 2^e <= 2^G: (round_half_even(P 2^e), e),
    so |P_q| <= 2^G, as the gates f that multiply c (``gate_bits`` keeps their labels within 32 bits)."""
    peak = Fraction(float(np.abs(p).max()))
    e = math.floor(math.log2((1 << g) / peak))
    while peak * Fraction(2) ** e > 1 << g:
        e -= 1
    while peak * Fraction(2) ** (e + 1) <= 1 << g:
        e += 1
    return np.rint(p * 2.0 ** e).astype(np.int64), e  # p 2^e is exact: a power-of-two scaling of float64


def cell_times(ctx, m: Tensor, cs: tuple[Tensor, Tensor], k: int) -> Tensor:
    """m c / 2^K for c = 2^K c_hi + c_lo (``cell_split``): m c_hi + rhu(m c_lo, K), within half a step of it."""
    hi, lo = cs
    pm = m.peak
    whole = step(ctx, "broadcast_mul", m, hi, -pm * hi.peak, pm * hi.peak)
    return added(ctx, whole, shift(ctx, step(ctx, "broadcast_mul", m, lo, -pm * lo.peak, pm * lo.peak), k))


def peephole(ctx, pq: np.ndarray, cs: tuple[Tensor, Tensor], a: int, k: int) -> Tensor:
    """P_q c (c at 2^-G in halves ``cs``, P_q at 2^-e, a = 14 - e - G) on the grid 2^-14: ``cell_times`` put there
    by ``fine``."""
    return fine(ctx, cell_times(ctx, c32(pq.reshape(1, -1)), cs, k), a + k)


def gate_tables(g: int) -> tuple[Tensor, Tensor]:
    """round(2^G sigmoid(k / 2^10)) and round(2^G tanh(k / 2^10)) for k in [-16 2^10, 16 2^10], as constants."""
    ks = range(-(GATE_REACH << INDEX_BITS), (GATE_REACH << INDEX_BITS) + 1)
    return (c32([round((1 << g) / (1 + math.exp(-k / (1 << INDEX_BITS)))) for k in ks]),
            c32([round((1 << g) * math.tanh(k / (1 << INDEX_BITS))) for k in ks]))


def gate_index(ctx, pre: Tensor) -> Tensor:
    """A pre-activation at 2^-14, rounded to the 2^-10 grid and clipped to [-16, 16], as a 0-based table index."""
    reach = GATE_REACH << INDEX_BITS
    pre = clipped(ctx, shift(ctx, as_int32(pre), FINE_BITS), reach)
    return step(ctx, "broadcast_add", pre, c32(reach), pre.lo + reach, pre.hi + reach)


def columns(ctx, x: Tensor, start: int, stop: int) -> Tensor:
    return strided_slice(ctx, x, [range(x.shape[0]), range(start, stop)])


def at_step(ctx, xw: Tensor, t: int) -> Tensor:
    batch, width = xw.shape[1], xw.shape[2]
    return ctx.reshape(strided_slice(ctx, xw, [range(t, t + 1), range(batch), range(width)]), (batch, width))


def direction(ctx, xs: Scaled, w: np.ndarray, r: np.ndarray, b: np.ndarray, h0: np.ndarray, c0: np.ndarray,
              order: list[int], g: int, p: np.ndarray | None = None) -> tuple[list[Tensor], Tensor, Tensor]:
    """One direction over the steps in ``order``: (y per step at 2^-G, the last h at 1/16256, the last c at 2^-G).
    c is split in halves (``cell_split``) for f c and P c. ``p``: the peepholes (i, o, f; ``peepholes``), P_i c and
    P_f c of the step's c into i and f, P_o c' of the new c into o, each on 2^-14 and added to the gate's
    pre-activation."""
    hidden = r.shape[1]
    c0max = c0.peak if isinstance(c0, Carried) else float(np.abs(c0).max(initial=0))
    cut = cell_split(g, len(order), c0max)
    rw = weights(r)
    # x W^T + b clipped where the sum is past +-16 whatever h R^T (|h R^T| <= reach - 18) and P c (|c| <= |c0| + t)
    reach = reach_of(r)
    if p is not None:
        reach += math.ceil(float(np.abs(p).max()) * (math.ceil(c0max) + len(order)))
        pq, e = peepholes(p, g)
        ps, a = [pq[k * hidden:(k + 1) * hidden] for k in range(3)], INDEX_BITS + FINE_BITS - e - g
    xw = projected(ctx, xs, w, b[:4 * hidden] + b[4 * hidden:], reach)  # Wb + Rb: float64 sums, exact
    sig, tnh = gate_tables(g)
    creach = CELL_REACH << CELL_BITS
    ctab = c32([round((1 << g) * math.tanh(k / (1 << CELL_BITS))) for k in range(-creach, creach + 1)])
    h = state(h0, "LSTM")
    one = 1 << g
    c = c0.t if isinstance(c0, Carried) else c32(np.rint(c0 * one).astype(np.int64))
    cs = None
    ys = []
    for t in order:
        cs = cs or split(ctx, c, cut)
        pre = at_step(ctx, xw, t)
        if h is not None:
            pre = added(ctx, pre, recurrent(ctx, h, rw))
        if p is None:
            idx = gate_index(ctx, pre)
            gates = [columns(ctx, idx, k * hidden, (k + 1) * hidden) for k in range(4)]
            i, o, f = (table(ctx, gates[k], sig, 0, one) for k in (0, 1, 2))
        else:  # gate k's pre-activation plus P_k c (P's order i, o, f is the gates'): i and f now, o after c'
            parts = [columns(ctx, pre, k * hidden, (k + 1) * hidden) for k in range(4)]
            i, f = (table(ctx, gate_index(ctx, added(ctx, parts[j], peephole(ctx, ps[j], cs, a, cut))), sig, 0, one)
                    for j in (0, 2))
            gates = [None, None, None, gate_index(ctx, parts[3])]
        cand = table(ctx, gates[3], tnh, -one, one)
        fc = fine(ctx, cell_times(ctx, f, cs, cut), cut - g)
        ig = shift(ctx, step(ctx, "broadcast_mul", i, cand, -one * one, one * one), g)
        c = added(ctx, fc, ig)
        cs = None
        if p is not None:  # c' in halves for P_o c' now and f c' next step
            cs = split(ctx, c, cut)
            o = table(ctx, gate_index(ctx, added(ctx, parts[1], peephole(ctx, ps[1], cs, a, cut))), sig, 0, one)
        if g > CELL_BITS:
            ci = shift(ctx, c, g - CELL_BITS)
        elif g == CELL_BITS:
            ci = c
        else:  # clipped to +-8 first, so that the product stays within 32 bits (the same values)
            c8 = clipped(ctx, c, CELL_REACH << g)
            ci = step(ctx, "broadcast_mul", c8, c32(1 << (CELL_BITS - g)), c8.lo << (CELL_BITS - g),
                      c8.hi << (CELL_BITS - g))
        ci = clipped(ctx, ci, creach)
        tc = table(ctx, step(ctx, "broadcast_add", ci, c32(creach), ci.lo + creach, ci.hi + creach), ctab, -one, one)
        y = shift(ctx, step(ctx, "broadcast_mul", o, tc, -one * one, one * one), g)
        ys.append(y)
        h = shift(ctx, step(ctx, "broadcast_mul", y, c32(H_STEPS), -one * H_STEPS, one * H_STEPS), g - LOW_BITS)
    return ys, h, c


def gru_direction(ctx, xs: Scaled, w: np.ndarray, r: np.ndarray, b: np.ndarray, h0: np.ndarray, order: list[int],
                  g: int, before: bool) -> tuple[list[Tensor], Tensor]:
    """One GRU direction over the steps in ``order`` (gates z, r, h; ``before``: linear_before_reset):
    (y = h per step at 1/16256, the last h)."""
    hidden = r.shape[1]
    wb, rb = b[:3 * hidden], b[3 * hidden:]
    rbh = grid_bias(rb[2 * hidden:]) if before else np.zeros(hidden, np.int64)  # R_bh at 2^-14, inside r (.)
    # |h R^T| <= max_r sum |R_r|, also of (r h) R_h^T (|r h| <= 1); + |R_bh| inside r (.)
    reach = reach_of(r) + math.ceil(float(np.abs(rb[2 * hidden:]).max(initial=0))) * before
    xw = projected(ctx, xs, w, wb + np.concatenate([rb[:2 * hidden], 0 * rb[2 * hidden:] if before else
                                                    rb[2 * hidden:]]), reach)
    rzr = weights(r if before else r[:2 * hidden])
    rhw = None if before else weights(r[2 * hidden:])
    sig, tnh = gate_tables(g)
    one = 1 << g
    h = state(h0, "GRU")
    ys = []
    for t in order:
        pre = at_step(ctx, xw, t)
        pz, pr, ph = (columns(ctx, pre, k * hidden, (k + 1) * hidden) for k in range(3))
        if h is not None:
            zh = recurrent(ctx, h, rzr)
            pz = added(ctx, pz, columns(ctx, zh, 0, hidden))
            pr = added(ctx, pr, columns(ctx, zh, hidden, 2 * hidden))
        gz = table(ctx, gate_index(ctx, pz), sig, 0, one)
        gr = table(ctx, gate_index(ctx, pr), sig, 0, one)
        if before and (h is not None or rbh.any()):  # r (h R_h^T + R_bh), the sum rounded to 2^-10
            hh = columns(ctx, zh, 2 * hidden, 3 * hidden) if h is not None else None
            if rbh.any():
                rc = c32(rbh.reshape(1, -1))
                hh = rc if hh is None else step(ctx, "broadcast_add", hh, rc, hh.lo + min(int(rbh.min()), 0),
                                                hh.hi + max(int(rbh.max()), 0))
            hh = shift(ctx, hh, FINE_BITS)
            peak = max(-hh.lo, hh.hi)
            ph = added(ctx, ph, shift(ctx, step(ctx, "broadcast_mul", gr, hh, -one * peak, one * peak), g - FINE_BITS))
        elif not before and h is not None:  # (r h) R_h^T: r h at 1/16256, in two halves
            rh = shift(ctx, step(ctx, "broadcast_mul", gr, h, -one * H_ONE, one * H_ONE), g)
            ph = added(ctx, ph, recurrent(ctx, rh, rhw))
        cand = table(ctx, gate_index(ctx, ph), tnh, -one, one)
        keep = step(ctx, "broadcast_sub", c32(one), gz, 0, one)  # 1 - z
        y = shift(ctx, step(ctx, "broadcast_mul", step(ctx, "broadcast_mul", keep, cand, -one * one, one * one),
                            c32(H_STEPS), -one * one * H_STEPS, one * one * H_STEPS), 2 * g - LOW_BITS)
        if h is not None:  # + z h, each rounded to 1/16256; the sum clipped to [-1, 1]
            y = clipped(ctx, added(ctx, y, shift(ctx, step(ctx, "broadcast_mul", gz, h, -one * H_ONE, one * H_ONE),
                                                 g)), H_ONE)
        ys.append(y)
        h = y
    return ys, h


def rnn_direction(ctx, xs: Scaled, w: np.ndarray, r: np.ndarray, b: np.ndarray, h0: np.ndarray, order: list[int],
                  sigmoid: bool) -> tuple[list[Tensor], Tensor]:
    """One RNN direction over the steps in ``order`` (activation tanh, or sigmoid): (y per step at 2^-G, G =
    ``RNN_BITS``, the last h at 1/16256)."""
    hidden = r.shape[1]
    rw = weights(r)
    xw = projected(ctx, xs, w, b[:hidden] + b[hidden:], reach_of(r))  # Wb + Rb: float64 sums of float32, exact
    sig, tnh = gate_tables(RNN_BITS)
    one = 1 << RNN_BITS
    tab, low = (sig, 0) if sigmoid else (tnh, -one)
    h = state(h0, "RNN")
    ys = []
    for t in order:
        pre = at_step(ctx, xw, t)
        if h is not None:
            pre = added(ctx, pre, recurrent(ctx, h, rw))
        y = table(ctx, gate_index(ctx, pre), tab, low, one)
        ys.append(y)
        h = shift(ctx, step(ctx, "broadcast_mul", y, c32(H_STEPS), low * H_STEPS, one * H_STEPS),
                  RNN_BITS - LOW_BITS)
    return ys, h


class Steps(list):
    """One direction's steps in order; iterating them refuses, at the third, a layer whose CVM nodes at the second
    step's count would pass MAX_NODES over its ``total`` steps (``said``: the layer and its steps, for the
    refusal)."""

    def __init__(self, ctx, order: list[int], total: int, said: str):
        super().__init__(order)
        self.ctx, self.total, self.said = ctx, total, said

    def __iter__(self):
        mark = 0
        for k, t in enumerate(super().__iter__()):
            if k == 1:
                mark = len(self.ctx.nodes)
            elif k == 2 and (per := len(self.ctx.nodes) - mark) * self.total > MAX_NODES:
                raise Refuse(f"{self.said}: unrolled into about {per * self.total:,} CVM nodes ({per} a step), at "
                             f"most {MAX_NODES:,} a layer")
            yield t


def floats(t, what: str, shape: tuple[int, ...]) -> np.ndarray:
    """A constant float input (quantized constants dequantized exactly) as float64 of ``shape``."""
    if t is None:
        return np.zeros(shape)
    if isinstance(t, Scaled) and t.t.is_const:
        v = np.array([float(q) for q in np.broadcast_to((t.t.value.astype(np.int64) - t.zero) * t.scale,
                                                        t.shape).flat]).reshape(t.shape)
    elif isinstance(t, Tensor) and t.is_const and np.asarray(t.value).dtype.kind == "f":
        v = np.asarray(t.value, np.float64)
    else:
        raise Refuse(f"the {what} must be a constant")
    if v.shape != shape:
        raise Refuse(f"the {what} of shape {v.shape}, not {shape}")
    if not np.isfinite(v).all():
        raise Refuse(f"the {what} holds NaN or infinity")
    return v


def unrolled(node, op: str, gates: int, x, w, r, b, lens):
    """What LSTM (4 gates), GRU (3) and RNN (1) share: the per-tensor input X of shape (steps, batch, size), the
    direction, the number of directions, hidden_size, and W, R, B as floats of ONNX's shapes; a sequence_lens other
    than the full length of every sequence, or more than MAX_NODES steps over the directions (at least a node
    each; ``Steps`` bounds the nodes), refused."""
    xs = per_tensor(scaled(x, f"the {op} input"), op)
    if len(xs.shape) != 3:
        raise Refuse(f"an {op} input of shape {xs.shape}: (sequence, batch, features) expected")
    steps, _, size = xs.shape
    way = node.attr_str("direction", "forward", choices=("forward", "reverse", "bidirectional"))
    dirs = 2 if way == "bidirectional" else 1
    if steps * dirs > MAX_NODES:
        raise Refuse(f"{op} over {steps} steps{' in each direction' if dirs > 1 else ''}: unrolled into more than "
                     f"{MAX_NODES:,} CVM nodes (at least one a step), at most {MAX_NODES:,} a layer")
    hidden = node.attr_int("hidden_size", lo=1)
    wv = floats(w, f"{op} W", (dirs, gates * hidden, size))
    rv = floats(r, f"{op} R", (dirs, gates * hidden, hidden))
    bv = floats(b, f"{op} B", (dirs, 2 * gates * hidden))
    if lens is not None and not lens.is_const:  # a pack_padded_sequence's lengths, from the model's inputs
        raise Refuse(f"{op} sequence_lens computed at run time has no CVM form: every sequence is taken whole "
                     f"({steps} steps), so the lengths must be constants (quantize --fold the lengths input to "
                     f"{steps})")
    if lens is not None and not (np.asarray(lens.value) == steps).all():
        raise Refuse(f"{op} sequence_lens other than the full length of every sequence has no CVM form")
    return xs, way, dirs, hidden, wv, rv, bv


def orders(ctx, op: str, way: str, dirs: int, steps: int) -> list[Steps]:
    """Each direction's order of the steps (``Steps``, bounding the layer's nodes): forward, or backward for
    "reverse" and a bidirectional layer's second."""
    said = f"{op} over {steps} steps{' in each direction' if dirs > 1 else ''}"
    return [Steps(ctx, list(range(steps)) if (way == "forward" or d == 0) and way != "reverse" else
                  list(range(steps - 1, -1, -1)), steps * dirs, said) for d in range(dirs)]


def stacked(ctx, per_direction: list, steps: int, batch: int, hidden: int):
    """Y (steps, dirs, batch, hidden) from each direction's outputs in time order."""
    dirs = len(per_direction)
    return concatenated(ctx, 0, *(ctx.reshape(concatenated(ctx, 1, *(ctx.reshape(ys[k], (1, 1, batch, hidden))
                                                                   for ys in per_direction)), (1, dirs, batch, hidden))
                                  for k in range(steps)))


def finals(ctx, states: list, batch: int, hidden: int):
    """Y_h or Y_c (dirs, batch, hidden) from each direction's last state."""
    return concatenated(ctx, 0, *(ctx.reshape(h, (1, batch, hidden)) for h in states))


def default_activations(node, default: list[str]) -> bool:
    """Whether the layer's activations are ONNX's defaults: ``activations`` absent, or ``default`` written out once
    per direction (as tf2onnx writes them), without activation_alpha or activation_beta."""
    if node.has("activation_alpha") or node.has("activation_beta"):
        return False
    dirs = 2 if node.attr_str("direction", "forward") == "bidirectional" else 1
    return node.attr_strs("activations", default * dirs) == default * dirs


@float_rule("LSTM", since=7)
def lstm_rule(ctx, node, x, w, r, b=None, lens=None, h0=None, c0=None, p=None):
    """LSTM (default activations, no clip, layout 0; forward, reverse or bidirectional) of a per-tensor dequantized
    X with constant W, R, B, P (zeros when absent), initial_h and initial_c constants (zeros when absent) or carried
    (``initial``), every sequence the full length: unrolled (``direction``). Outputs Y and Y_c at 2^-G, Y_h at
    1/16256, requantized by what follows."""
    if node.attr_int("layout", 0) or node.has("clip") or node.attr_int("input_forget", 0) or \
            not default_activations(node, ["Sigmoid", "Tanh", "Tanh"]):
        raise Refuse("LSTM with layout 1, clip, input_forget or other activations has no CVM form here")
    xs, way, dirs, hidden, wv, rv, bv = unrolled(node, "LSTM", 4, x, w, r, b, lens)
    steps, batch, _ = xs.shape
    pv = floats(p, "LSTM P", (dirs, 3 * hidden))
    hv = initial(h0, "LSTM initial_h", (dirs, batch, hidden), top=1)
    cv = initial(c0, "LSTM initial_c", (dirs, batch, hidden))
    g = lstm_bits(steps, peak_of(cv))
    hv = carried(ctx, hv, H_ONE, top=1) if isinstance(hv, Scaled) else hv
    cv = carried(ctx, cv, 1 << g) if isinstance(cv, Scaled) else cv
    outs = []
    for d, order in enumerate(orders(ctx, "LSTM", way, dirs, steps)):
        ys, h, c = direction(ctx, xs, wv[d], rv[d], bv[d], hv[d], cv[d], order, g, pv[d] if pv[d].any() else None)
        outs.append((ys if order[0] == 0 else ys[::-1], h, c))
    one = Fraction(1, 1 << g)
    z = np.zeros((), np.int64)
    y = stacked(ctx, [o[0] for o in outs], steps, batch, hidden)
    yh = finals(ctx, [o[1] for o in outs], batch, hidden)
    yc = finals(ctx, [o[2] for o in outs], batch, hidden)
    return [Scaled(y, np.asarray(one, dtype=object), z), Scaled(yh, np.asarray(Fraction(1, H_ONE), dtype=object), z),
            Scaled(yc, np.asarray(Fraction(1, 1 << g), dtype=object), z)]


@float_rule("GRU", since=7)
def gru_rule(ctx, node, x, w, r, b=None, lens=None, h0=None):
    """GRU (default activations, no clip, layout 0, either linear_before_reset; forward, reverse or bidirectional)
    of a per-tensor dequantized X with constant W, R, B, initial_h a constant (zeros when absent) or carried
    (``initial``), every sequence the full length: unrolled (``gru_direction``). Outputs Y and Y_h at 1/16256."""
    if node.attr_int("layout", 0) or node.has("clip") or not default_activations(node, ["Sigmoid", "Tanh"]):
        raise Refuse("GRU with layout 1, clip or other activations has no CVM form here")
    xs, way, dirs, hidden, wv, rv, bv = unrolled(node, "GRU", 3, x, w, r, b, lens)
    steps, batch, _ = xs.shape
    hv = initial(h0, "GRU initial_h", (dirs, batch, hidden), top=1)
    hv = carried(ctx, hv, H_ONE, top=1) if isinstance(hv, Scaled) else hv
    g = min(gate_bits(steps, 0.0), 10)  # r (h R_h^T + R_bh) on 2^-10: labels (G + 2) + 11 + bits(reach) within 32
    before = bool(node.attr_int("linear_before_reset", 0))
    outs = []
    for d, order in enumerate(orders(ctx, "GRU", way, dirs, steps)):
        ys, h = gru_direction(ctx, xs, wv[d], rv[d], bv[d], hv[d], order, g, before)
        outs.append((ys if order[0] == 0 else ys[::-1], h))
    z = np.zeros((), np.int64)
    y = stacked(ctx, [o[0] for o in outs], steps, batch, hidden)
    yh = finals(ctx, [o[1] for o in outs], batch, hidden)
    return [Scaled(y, np.asarray(Fraction(1, H_ONE), dtype=object), z),
            Scaled(yh, np.asarray(Fraction(1, H_ONE), dtype=object), z)]


@float_rule("RNN", since=7)
def rnn_rule(ctx, node, x, w, r, b=None, lens=None, h0=None):
    """RNN (activation Tanh, the default, or Sigmoid; no clip, layout 0; forward, reverse or bidirectional) of a
    per-tensor dequantized X with constant W, R, B, initial_h a constant (zeros when absent) or carried
    (``initial``), every sequence the full length: unrolled (``rnn_direction``). Outputs Y at 2^-G and Y_h at
    1/16256. Relu is refused: its h is unbounded, and h enters the next step as two 8-bit halves over [-1, 1]."""
    if node.attr_int("layout", 0) or node.has("clip"):
        raise Refuse("RNN with layout 1 or clip has no CVM form here")
    xs, way, dirs, hidden, wv, rv, bv = unrolled(node, "RNN", 1, x, w, r, b, lens)
    acts = node.attr_strs("activations", ["Tanh"] * dirs)
    if len(acts) != dirs or any(a not in ("Tanh", "Sigmoid") for a in acts):
        raise Refuse(f"RNN activations {acts}: Tanh or Sigmoid, one per direction (Relu's h is unbounded)")
    steps, batch, _ = xs.shape
    hv = initial(h0, "RNN initial_h", (dirs, batch, hidden), top=1)
    hv = carried(ctx, hv, H_ONE, top=1) if isinstance(hv, Scaled) else hv
    outs = []
    for d, order in enumerate(orders(ctx, "RNN", way, dirs, steps)):
        ys, h = rnn_direction(ctx, xs, wv[d], rv[d], bv[d], hv[d], order, acts[d] == "Sigmoid")
        outs.append((ys if order[0] == 0 else ys[::-1], h))
    z = np.zeros((), np.int64)
    y = stacked(ctx, [o[0] for o in outs], steps, batch, hidden)
    yh = finals(ctx, [o[1] for o in outs], batch, hidden)
    return [Scaled(y, np.asarray(Fraction(1, 1 << RNN_BITS), dtype=object), z),
            Scaled(yh, np.asarray(Fraction(1, H_ONE), dtype=object), z)]
