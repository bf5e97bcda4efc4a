"""LSTM, GRU and RNN of a dequantized sequence with float weights (as quantize_static leaves them between a
DequantizeLinear and a QuantizeLinear), unrolled over the fixed length into CVM ops (docs/import.md, "LSTM: the
integer form").

Per direction and step t, with h held as integers at scale 1/127 (8 bits, ``dense``'s operand): the gate
pre-activations x W^T + b and h R^T are each requantized (one plan each) to steps of 2^-8, added and clipped to
[-16, 16]; sigmoid and tanh tables give the gates at 2^-G. LSTM: c' = round(f c / 2^G) + round(i g / 2^G) at 2^-G;
tanh(c') from a table over c' rounded to 2^-9 and clipped to [-8, 8]; Y = o tanh(c') exactly at 2^-2G and
h' = round(127 Y / 2^2G). GRU: Y = (1 - z) n 127 + z h 2^G at 1 / (127 2^2G), h' = round(Y / 2^2G). RNN (tanh or
sigmoid): Y = f(x W^T + b + h R^T) from the table at 2^-G, h' = round(127 Y / 2^G).
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from cvm_onnx.core.constants import tight

from ..context import INT32, Tensor, const
from ..emit import as_int32, concatenated, strided_slice
from ..registry import Refuse, float_rule
from .products import dense
from ..requant_plans import NoPlan, plan
from .qdq import Requant, apply
from .values import Scaled, per_tensor, scaled

INDEX_BITS = 8  # gate pre-activations in steps of 2^-8
GATE_REACH = 16  # clipped to [-16, 16]: sigmoid and tanh are within 2^-23 of their limits beyond
CELL_BITS = 9  # tanh(c) looked up at c rounded to 2^-9
CELL_REACH = 8  # clipped to [-8, 8]
H_STEPS = 127  # h at scale 1/127
RNN_BITS = 12  # an RNN's outputs at 2^-12


def gate_bits(steps: int, c0: float) -> int:
    """G: gates at 2^-G, c at 2^-G, |c| <= |c0| + steps (|c'| <= f |c| + |i g| <= |c| + 1), so that the labels of
    f c (2^G times 2^G (|c0| + steps)) and of o tanh(c) 127 (2^2G times 127) stay within 32 bits."""
    g = 12
    while g > 4 and (tight(1 << g) + tight((1 << g) * (math.ceil(c0) + steps + 1)) > 32 or
                     tight(1 << (2 * g)) + tight(H_STEPS) > 32):
        g -= 1
    return g


def quantized_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(w as int8 per row, symmetric, and each row's scale as an exact Fraction): round_half_even(w / s),
    s = float32(max|w| / 127); quotients within 2^-20 of a half-integer are recomputed in exact Fractions."""
    peak = np.abs(w).max(axis=1)
    s32 = np.array([np.float32(p / 127) if p > 0 else np.float32(1) for p in peak], np.float64)
    ratio = w.astype(np.float64) / s32[:, None]
    q = np.rint(ratio)
    for i, j in zip(*np.nonzero(np.abs(np.abs(ratio - np.trunc(ratio)) - 0.5) < 2.0**-20)):
        q[i, j] = round(Fraction(float(w[i, j])) / Fraction(float(s32[i])))
    return np.clip(q, -127, 127).astype(np.int64), np.array([Fraction(float(v)) for v in s32], dtype=object)


def table(ctx, index: Tensor, values: np.ndarray, lo: int, hi: int) -> Tensor:
    """cvm_lut of ``index`` (0-based, within the table) into ``values``."""
    e = ctx.emit("cvm_lut", ctx.entry(index), ctx.entry(const(values.astype(np.int32), INT32)), in_dim=values.size)
    return ctx.result(e, INT32, lo, hi, index.shape)


def to_grid(ctx, x: Scaled, bound: int) -> Tensor:
    """x (zero point 0, a scale per column) in steps of 2^-8, clipped to +-bound: one requantization plan
    (requant_plans.plan) into [-bound, bound], recorded for the report."""
    grid = Fraction(1, 1 << INDEX_BITS)
    ratios = np.asarray(x.scale / grid, dtype=object).reshape(-1)
    v = as_int32(x.t)
    try:
        p = plan([(v.lo, v.hi, ratios)], -bound, bound, Fraction(1, 2))
    except NoPlan as e:
        raise Refuse(f"gate pre-activations: {e}") from None
    ctx.requants.append(Requant(ctx.base, tuple(float(r) for r in ratios), p))
    r = apply(ctx, [v], p)
    e = ctx.emit("clip", ctx.entry(r), a_min=-bound, a_max=bound)
    return ctx.result(e, INT32, max(r.lo, -bound), min(r.hi, bound), r.shape)


def step(ctx, name: str, a: Tensor, b: Tensor, lo: int, hi: int) -> Tensor:
    e = ctx.op(name, a, b)
    return ctx.result(e, INT32, lo, hi, ctx.type_of(e).shape)


def shift(ctx, x: Tensor, k: int) -> Tensor:
    """round_half_up(x / 2^k) (cvm_right_shift by k >= 1)."""
    peak = max(-x.lo, x.hi)
    bound = (peak + (1 << (k - 1))) >> k
    e = ctx.emit("cvm_right_shift", ctx.narrow(x, tight(peak)), precision=tight(bound), shift_bit=k)
    return ctx.result(e, INT32, -bound, bound, x.shape)


def c32(v) -> Tensor:
    return const(np.asarray(v, np.int64).astype(np.int32), INT32)


def projected(ctx, xs: Scaled, wq: np.ndarray, sw: np.ndarray, bias: np.ndarray) -> Scaled:
    """x W^T over every step (one ``dense``, at s_x s_W per column) plus the bias rounded to that scale (within half
    of s_x s_W, far below the gates' 2^-8 grid)."""
    xw = dense(ctx, xs, wq, sw, None)
    if not bias.any():
        return xw
    units = np.array([round(Fraction(float(v)) / sc) for v, sc in zip(bias, xw.scale.reshape(-1))], np.int64)
    t = ctx.result(ctx.op("broadcast_add", xw.t, c32(units.reshape(1, 1, -1))), INT32, xw.t.lo + int(units.min()),
                   xw.t.hi + int(units.max()), xw.shape)
    return Scaled(t, xw.scale, xw.zero)


def gate_tables(g: int) -> tuple[np.ndarray, np.ndarray]:
    """round(2^G sigmoid(k / 256)) and round(2^G tanh(k / 256)) for k in [-4096, 4096]."""
    ks = range(-(GATE_REACH << INDEX_BITS), (GATE_REACH << INDEX_BITS) + 1)
    return (np.array([round((1 << g) / (1 + math.exp(-k / (1 << INDEX_BITS)))) for k in ks]),
            np.array([round((1 << g) * math.tanh(k / (1 << INDEX_BITS))) for k in ks]))


def gate_index(ctx, pre: Tensor) -> Tensor:
    """A pre-activation on the 2^-8 grid clipped to [-16, 16], as a 0-based table index."""
    reach = GATE_REACH << INDEX_BITS
    pre = as_int32(pre)
    e = ctx.emit("clip", ctx.entry(pre), a_min=-reach, a_max=reach)
    pre = ctx.result(e, INT32, max(pre.lo, -reach), min(pre.hi, reach), pre.shape)
    return step(ctx, "broadcast_add", pre, c32(reach), pre.lo + reach, pre.hi + reach)


def columns(ctx, x: Tensor, start: int, stop: int) -> Tensor:
    return strided_slice(ctx, x, [range(x.shape[0]), range(start, stop)])


def direction(ctx, xs: Scaled, w: np.ndarray, r: np.ndarray, b: np.ndarray, h0: np.ndarray, c0: np.ndarray,
              order: list[int], g: int) -> tuple[list[Tensor], Tensor, Tensor]:
    """One direction over the steps in ``order``: (y per step at 2^-2G, the last h at 1/127, the last c at 2^-G)."""
    steps, batch = xs.shape[0], xs.shape[1]
    hidden = r.shape[1]
    wq, sw = quantized_rows(w)
    rq, sr = quantized_rows(r)
    xw = projected(ctx, xs, wq, sw, b[:4 * hidden] + b[4 * hidden:])  # Wb + Rb: float64 sums of float32, exact
    z = np.zeros((), np.int64)
    sig, tnh = gate_tables(g)
    creach = CELL_REACH << CELL_BITS
    ctab = np.array([round((1 << g) * math.tanh(k / (1 << CELL_BITS))) for k in range(-creach, creach + 1)])
    h = c32(np.rint(h0 * H_STEPS).astype(np.int64)) if h0.any() else None
    one = 1 << g
    # |h R^T| <= max_r sum |R_q| s_R (|h| <= 1), bounded in float64 with a margin of one
    reach_h = GATE_REACH + math.ceil(float((np.abs(rq).sum(axis=1) * sr.astype(np.float64)).max(initial=0))) + 2
    c = c32(np.rint(c0 * one).astype(np.int64))
    ys = []
    for t in order:
        xt = Scaled(ctx.reshape(strided_slice(ctx, xw.t, [range(t, t + 1), range(batch), range(4 * hidden)]),
                                (batch, 4 * hidden)), xw.scale, xw.zero)
        # each product requantized to the 2^-8 grid on its own, x W^T + b clipped where the sum is past +-16
        # whatever h R^T (|h R^T| <= reach_h - 17)
        pre = to_grid(ctx, xt, reach_h << INDEX_BITS)
        if h is not None:
            hs = Scaled(ctx.reshape(h, (batch, hidden)) if h.shape != (batch, hidden) else h,
                        np.asarray(Fraction(1, H_STEPS), dtype=object), z)
            zh = to_grid(ctx, dense(ctx, hs, rq, sr, None), reach_h << INDEX_BITS)
            pre = step(ctx, "broadcast_add", pre, zh, pre.lo + zh.lo, pre.hi + zh.hi)
        idx = gate_index(ctx, pre)
        gates = [columns(ctx, idx, k * hidden, (k + 1) * hidden) for k in range(4)]
        i, o, f = (table(ctx, gates[k], sig, 0, one) for k in (0, 1, 2))
        cand = table(ctx, gates[3], tnh, -one, one)
        peak = max(-c.lo, c.hi)
        fc = shift(ctx, step(ctx, "broadcast_mul", f, c, -one * peak, one * peak), g)
        ig = shift(ctx, step(ctx, "broadcast_mul", i, cand, -one * one, one * one), g)
        c = step(ctx, "broadcast_add", fc, ig, fc.lo + ig.lo, fc.hi + ig.hi)
        if g > CELL_BITS:
            ci = shift(ctx, c, g - CELL_BITS)
        else:
            ci = step(ctx, "broadcast_mul", c, c32(1 << (CELL_BITS - g)), c.lo << (CELL_BITS - g),
                      c.hi << (CELL_BITS - g))
        e = ctx.emit("clip", ctx.entry(ci), a_min=-creach, a_max=creach)
        ci = ctx.result(e, INT32, max(ci.lo, -creach), min(ci.hi, creach), ci.shape)
        tc = table(ctx, step(ctx, "broadcast_add", ci, c32(creach), ci.lo + creach, ci.hi + creach), ctab, -one, one)
        y = step(ctx, "broadcast_mul", o, tc, -one * one, one * one)
        ys.append(y)
        h = shift(ctx, step(ctx, "broadcast_mul", y, c32(H_STEPS), -one * one * H_STEPS, one * one * H_STEPS), 2 * g)
    return ys, h, c


def gru_direction(ctx, xs: Scaled, w: np.ndarray, r: np.ndarray, b: np.ndarray, h0: np.ndarray, order: list[int],
                  g: int, before: bool) -> tuple[list[Tensor], Tensor]:
    """One GRU direction over the steps in ``order`` (gates z, r, h; ``before``: linear_before_reset):
    (y per step at 1 / (127 2^2G), the last h at 1/127)."""
    batch, hidden = xs.shape[1], r.shape[1]
    wq, sw = quantized_rows(w)
    rq, sr = quantized_rows(r)
    wb, rb = b[:3 * hidden], b[3 * hidden:]
    xw = projected(ctx, xs, wq, sw, wb + np.concatenate([rb[:2 * hidden], 0 * rb[2 * hidden:] if before else
                                                         rb[2 * hidden:]]))
    rbh = np.array([round(Fraction(float(v)) * (1 << INDEX_BITS)) for v in rb[2 * hidden:]], np.int64) \
        if before else np.zeros(hidden, np.int64)  # R_bh on the 2^-8 grid, inside r (.)
    z0 = np.zeros((), np.int64)
    sig, tnh = gate_tables(g)
    one = 1 << g
    # |h R^T| <= max_r sum |R_q| s_R, also of (r h) R_h^T (|r h| <= 1); + |R_bh| inside r (.)
    reach_h = GATE_REACH + math.ceil(float((np.abs(rq).sum(axis=1) * sr.astype(np.float64)).max(initial=0))
                                     + float(np.abs(rb[2 * hidden:]).max(initial=0)) * before) + 2
    bound = reach_h << INDEX_BITS
    h = c32(np.rint(h0 * H_STEPS).astype(np.int64)) if h0.any() else None
    h_scale = np.asarray(Fraction(1, H_STEPS), dtype=object)
    ys = []
    for t in order:
        xt = Scaled(ctx.reshape(strided_slice(ctx, xw.t, [range(t, t + 1), range(batch), range(3 * hidden)]),
                                (batch, 3 * hidden)), xw.scale, xw.zero)
        pre = to_grid(ctx, xt, bound)  # clipped where the sum is past +-16 whatever the h terms
        pz, pr, ph = (columns(ctx, pre, k * hidden, (k + 1) * hidden) for k in range(3))
        if h is not None:
            hs = Scaled(h, h_scale, z0)
            zh = to_grid(ctx, dense(ctx, hs, rq[:2 * hidden] if not before else rq, sr[:2 * hidden]
                                    if not before else sr, None), bound)
            pz = step(ctx, "broadcast_add", pz, columns(ctx, zh, 0, hidden), pz.lo - bound, pz.hi + bound)
            pr = step(ctx, "broadcast_add", pr, columns(ctx, zh, hidden, 2 * hidden), pr.lo - bound, pr.hi + bound)
        gz = table(ctx, gate_index(ctx, pz), sig, 0, one)
        gr = table(ctx, gate_index(ctx, pr), sig, 0, one)
        if before and (h is not None or rbh.any()):  # r (h R_h^T + R_bh), on the grid
            hh = columns(ctx, zh, 2 * hidden, 3 * hidden) if h is not None else None
            if rbh.any():
                rc = c32(rbh.reshape(1, -1))
                hh = rc if hh is None else step(ctx, "broadcast_add", hh, rc, hh.lo + min(int(rbh.min()), 0),
                                                hh.hi + max(int(rbh.max()), 0))
            peak = max(-hh.lo, hh.hi)
            ph = step(ctx, "broadcast_add", ph, shift(ctx, step(ctx, "broadcast_mul", gr, hh, -one * peak, one * peak),
                                                      g), ph.lo - peak, ph.hi + peak)
        elif not before and h is not None:  # (r h) R_h^T: r h at 1/127 (8 bits), then dense
            rh = shift(ctx, step(ctx, "broadcast_mul", gr, h, -one * H_STEPS, one * H_STEPS), g)
            hh = to_grid(ctx, dense(ctx, Scaled(rh, h_scale, z0), rq[2 * hidden:], sr[2 * hidden:], None), bound)
            ph = step(ctx, "broadcast_add", ph, hh, ph.lo + hh.lo, ph.hi + hh.hi)
        cand = table(ctx, gate_index(ctx, ph), tnh, -one, one)
        keep = step(ctx, "broadcast_sub", c32(one), gz, 0, one)  # 1 - z
        y = step(ctx, "broadcast_mul", step(ctx, "broadcast_mul", keep, cand, -one * one, one * one), c32(H_STEPS),
                 -one * one * H_STEPS, one * one * H_STEPS)
        if h is not None:  # + z h, at 1 / (127 2^2G)
            zh_ = step(ctx, "broadcast_mul", step(ctx, "broadcast_mul", h, c32(one), -H_STEPS * one, H_STEPS * one),
                       gz, -H_STEPS * one * one, H_STEPS * one * one)
            y = step(ctx, "broadcast_add", y, zh_, y.lo + zh_.lo, y.hi + zh_.hi)
        ys.append(y)
        h = shift(ctx, y, 2 * g)
    return ys, h


def rnn_direction(ctx, xs: Scaled, w: np.ndarray, r: np.ndarray, b: np.ndarray, h0: np.ndarray, order: list[int],
                  sigmoid: bool) -> tuple[list[Tensor], Tensor]:
    """One RNN direction over the steps in ``order`` (activation tanh, or sigmoid): (y per step at 2^-G, G =
    ``RNN_BITS``, the last h at 1/127)."""
    batch, hidden = xs.shape[1], r.shape[1]
    wq, sw = quantized_rows(w)
    rq, sr = quantized_rows(r)
    xw = projected(ctx, xs, wq, sw, b[:hidden] + b[hidden:])  # Wb + Rb: float64 sums of float32, exact
    sig, tnh = gate_tables(RNN_BITS)
    one = 1 << RNN_BITS
    tab, low = (sig, 0) if sigmoid else (tnh, -one)
    # |h R^T| <= max_r sum |R_q| s_R (|h| <= 1), bounded in float64 with a margin of one
    reach_h = GATE_REACH + math.ceil(float((np.abs(rq).sum(axis=1) * sr.astype(np.float64)).max(initial=0))) + 2
    h = c32(np.rint(h0 * H_STEPS).astype(np.int64)) if h0.any() else None
    h_scale, z = np.asarray(Fraction(1, H_STEPS), dtype=object), np.zeros((), np.int64)
    ys = []
    for t in order:
        xt = Scaled(ctx.reshape(strided_slice(ctx, xw.t, [range(t, t + 1), range(batch), range(hidden)]),
                                (batch, hidden)), xw.scale, xw.zero)
        pre = to_grid(ctx, xt, reach_h << INDEX_BITS)  # clipped where the sum is past +-16 whatever h R^T
        if h is not None:
            zh = to_grid(ctx, dense(ctx, Scaled(h, h_scale, z), rq, sr, None), reach_h << INDEX_BITS)
            pre = step(ctx, "broadcast_add", pre, zh, pre.lo + zh.lo, pre.hi + zh.hi)
        y = table(ctx, gate_index(ctx, pre), tab, low, one)
        ys.append(y)
        h = shift(ctx, step(ctx, "broadcast_mul", y, c32(H_STEPS), low * H_STEPS, one * H_STEPS), RNN_BITS)
    return ys, h


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
    return v


def unrolled(node, op: str, gates: int, x, w, r, b, lens):
    """What LSTM (4 gates), GRU (3) and RNN (1) share: the per-tensor input X of shape (steps, batch, size), the
    direction, the number of directions, hidden_size, and W, R, B as floats of ONNX's shapes; a sequence_lens other
    than the full length of every sequence refused."""
    xs = per_tensor(scaled(x, f"the {op} input"), op)
    if len(xs.shape) != 3:
        raise Refuse(f"an {op} input of shape {xs.shape}: (sequence, batch, features) expected")
    steps, _, size = xs.shape
    way = node.attr_str("direction", "forward", choices=("forward", "reverse", "bidirectional"))
    dirs = 2 if way == "bidirectional" else 1
    hidden = node.attr_int("hidden_size", lo=1)
    wv = floats(w, f"{op} W", (dirs, gates * hidden, size))
    rv = floats(r, f"{op} R", (dirs, gates * hidden, hidden))
    bv = floats(b, f"{op} B", (dirs, 2 * gates * hidden))
    if lens is not None and not (lens.is_const and (np.asarray(lens.value) == steps).all()):
        raise Refuse(f"{op} sequence_lens other than the full length of every sequence has no CVM form")
    return xs, way, dirs, hidden, wv, rv, bv


def orders(way: str, dirs: int, steps: int) -> list[list[int]]:
    """Each direction's order of the steps: forward, or backward for "reverse" and a bidirectional layer's second."""
    return [list(range(steps)) if (way == "forward" or d == 0) and way != "reverse" else list(range(steps - 1, -1, -1))
            for d in range(dirs)]


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
    X with constant W, R, B, initial_h, initial_c (zeros when absent), every sequence the full length: unrolled
    (``direction``). Outputs Y at 2^-2G, Y_h at 1/127 and Y_c at 2^-G, requantized by what follows."""
    if node.attr_int("layout", 0) or node.has("clip") or node.attr_int("input_forget", 0) or \
            not default_activations(node, ["Sigmoid", "Tanh", "Tanh"]):
        raise Refuse("LSTM with layout 1, clip, input_forget or other activations has no CVM form here")
    xs, way, dirs, hidden, wv, rv, bv = unrolled(node, "LSTM", 4, x, w, r, b, lens)
    steps, batch, _ = xs.shape
    if p is not None and floats(p, "LSTM P", (dirs, 3 * hidden)).any():
        raise Refuse("LSTM with peepholes has no CVM form here")
    hv = floats(h0, "LSTM initial_h", (dirs, batch, hidden))
    cv = floats(c0, "LSTM initial_c", (dirs, batch, hidden))
    g = gate_bits(steps, float(np.abs(cv).max(initial=0)))
    outs = []
    for d, order in enumerate(orders(way, dirs, steps)):
        ys, h, c = direction(ctx, xs, wv[d], rv[d], bv[d], hv[d], cv[d], order, g)
        outs.append((ys if order[0] == 0 else ys[::-1], h, c))
    one = Fraction(1, 1 << (2 * g))
    z = np.zeros((), np.int64)
    y = stacked(ctx, [o[0] for o in outs], steps, batch, hidden)
    yh = finals(ctx, [o[1] for o in outs], batch, hidden)
    yc = finals(ctx, [o[2] for o in outs], batch, hidden)
    return [Scaled(y, np.asarray(one, dtype=object), z), Scaled(yh, np.asarray(Fraction(1, H_STEPS), dtype=object), z),
            Scaled(yc, np.asarray(Fraction(1, 1 << g), dtype=object), z)]


@float_rule("GRU", since=7)
def gru_rule(ctx, node, x, w, r, b=None, lens=None, h0=None):
    """GRU (default activations, no clip, layout 0, either linear_before_reset; forward, reverse or bidirectional)
    of a per-tensor dequantized X with constant W, R, B, initial_h (zeros when absent), every sequence the full
    length: unrolled (``gru_direction``). Outputs Y at 1 / (127 2^2G), Y_h at 1/127."""
    if node.attr_int("layout", 0) or node.has("clip") or not default_activations(node, ["Sigmoid", "Tanh"]):
        raise Refuse("GRU with layout 1, clip or other activations has no CVM form here")
    xs, way, dirs, hidden, wv, rv, bv = unrolled(node, "GRU", 3, x, w, r, b, lens)
    steps, batch, _ = xs.shape
    hv = floats(h0, "GRU initial_h", (dirs, batch, hidden))
    g = min(gate_bits(steps, 0.0), 10)  # z h one, labels (G + 2) + 9 + (G + 2) within 32
    before = bool(node.attr_int("linear_before_reset", 0))
    outs = []
    for d, order in enumerate(orders(way, dirs, steps)):
        ys, h = gru_direction(ctx, xs, wv[d], rv[d], bv[d], hv[d], order, g, before)
        outs.append((ys if order[0] == 0 else ys[::-1], h))
    z = np.zeros((), np.int64)
    y = stacked(ctx, [o[0] for o in outs], steps, batch, hidden)
    yh = finals(ctx, [o[1] for o in outs], batch, hidden)
    return [Scaled(y, np.asarray(Fraction(1, H_STEPS << (2 * g)), dtype=object), z),
            Scaled(yh, np.asarray(Fraction(1, H_STEPS), dtype=object), z)]


@float_rule("RNN", since=7)
def rnn_rule(ctx, node, x, w, r, b=None, lens=None, h0=None):
    """RNN (activation Tanh, the default, or Sigmoid; no clip, layout 0; forward, reverse or bidirectional) of a
    per-tensor dequantized X with constant W, R, B, initial_h (zeros when absent), every sequence the full length:
    unrolled (``rnn_direction``). Outputs Y at 2^-G and Y_h at 1/127. Relu is refused: its h is unbounded, and h
    enters the next step as an 8-bit operand over [-1, 1]."""
    if node.attr_int("layout", 0) or node.has("clip"):
        raise Refuse("RNN with layout 1 or clip has no CVM form here")
    xs, way, dirs, hidden, wv, rv, bv = unrolled(node, "RNN", 1, x, w, r, b, lens)
    acts = node.attr_strs("activations", ["Tanh"] * dirs)
    if len(acts) != dirs or any(a not in ("Tanh", "Sigmoid") for a in acts):
        raise Refuse(f"RNN activations {acts}: Tanh or Sigmoid, one per direction (Relu's h is unbounded)")
    steps, batch, _ = xs.shape
    hv = floats(h0, "RNN initial_h", (dirs, batch, hidden))
    outs = []
    for d, order in enumerate(orders(way, dirs, steps)):
        ys, h = rnn_direction(ctx, xs, wv[d], rv[d], bv[d], hv[d], order, acts[d] == "Sigmoid")
        outs.append((ys if order[0] == 0 else ys[::-1], h))
    z = np.zeros((), np.int64)
    y = stacked(ctx, [o[0] for o in outs], steps, batch, hidden)
    yh = finals(ctx, [o[1] for o in outs], batch, hidden)
    return [Scaled(y, np.asarray(Fraction(1, 1 << RNN_BITS), dtype=object), z),
            Scaled(yh, np.asarray(Fraction(1, H_STEPS), dtype=object), z)]
