"""``Run``: a run's steps as one int32 body of ONNX ops, each step taken only where the proven bound shows it exact
(the package's docstring gives the argument); ``matching`` uses it to cut runs where a step has no exact form."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from cvm_onnx.core.constants import FLOAT32_EXACT as FLOAT_EXACT
from cvm_onnx.core.constants import INT32_MAX
from cvm_onnx.core.ops.elemwise import round_shift

from ..lowering import Body, Value
from .steps import Step


def _clip(v: int | None, lo: int | None, hi: int | None) -> int | None:
    if v is not None and lo is not None:
        v = max(v, lo)
    if v is not None and hi is not None:
        v = min(v, hi)
    return v


class Run:
    """The body of a run under construction: ``t`` holds w * 2^e (int32), the value is clip(w, lo, hi), |w| <= W.

    Bounds that cannot bind (lo <= -W, hi >= W) are dropped. ``M``, the largest of W, |lo| and |hi|, bounds
    every value the runtime's int32 steps see (they work on the clipped value, which lies between these), so a
    step whose check passes with M overflows neither here nor in the runtime. ``apply`` adds a step and returns
    False, emitting nothing, when no int32 form of it is exact.
    """

    def __init__(self, b: Body, x: Value, in_float: bool = False):
        """``in_float``: x is a float32 tensor of integers (|x| <= 2^24), cast to int32 at the first int32 step;
        clips before that are taken in float32."""
        self.b, self.t, self.e, self.w, self.float = b, x.name, 0, x.bound, in_float
        self.lo: int | None = None
        self.hi: int | None = None

    @property
    def m(self) -> int:
        return max([self.w, *(abs(v) for v in (self.lo, self.hi) if v is not None)])

    def apply(self, step: Step) -> bool:
        if step.kind == "clip":
            self.lo = step.lo if self.lo is None else _clip(self.lo, step.lo, step.hi)
            self.hi = step.hi if self.hi is None else _clip(self.hi, step.lo, step.hi)
            self._tighten()
            return True
        # as it is; else with the clip applied in int32; else brought back to e = 0 (the clip applied in float32)
        for relief, m, e in ((None, self.m, self.e), (self._flush, self._flushed(), self.e),
                             (self._normalize, self._clipped() if self.e else None, 0)):
            if m is not None and self._fits(step, m, e):
                if relief is not None:
                    relief()
                if step.kind in ("mul64", "cmul64"):
                    self._mul64(step)
                elif step.kind == "even":
                    self._even(step.k)
                else:
                    getattr(self, "_" + step.kind)(step.k)
                self._tighten()
                return True
        return False

    def _flushed(self) -> int | None:
        """M after ``_flush``, or None when there is no two-sided clip to apply."""
        return None if self.lo is None or self.hi is None else max(abs(self.lo), abs(self.hi))

    def _clipped(self) -> int:
        """The bound of the clipped value (clip is monotone: its extremes are those of +-W)."""
        return max(abs(_clip(v, self.lo, self.hi)) for v in (-self.w, self.w))

    def _tighten(self) -> None:
        if self.lo is not None and self.lo <= -self.w:
            self.lo = None
        if self.hi is not None and self.hi >= self.w:
            self.hi = None

    @staticmethod
    def _fits(step: Step, m: int, e: int) -> bool:
        """Whether ``step`` on t = w * 2^e, |w| and the clip bounds <= m, stays within int32."""
        top = m << e
        if step.kind == "shift":
            return e + step.k <= 31 and top + (1 << (e + step.k - 1)) <= INT32_MAX
        if step.kind == "mul":  # the multiplier itself must be an int32 constant (cvm_left_shift 31: 2^31 is not)
            return top * abs(step.k) <= INT32_MAX and -INT32_MAX - 1 <= step.k <= INT32_MAX
        if step.kind == "cmul":  # every multiplier an int32 (k: the largest magnitude)
            return top * step.k <= INT32_MAX and all(-INT32_MAX - 1 <= k <= INT32_MAX for k in step.ks)
        if step.kind in ("mul64", "cmul64"):  # the form in parts' int32 ops on the value itself
            return e == 0 and step.b <= 31 and all(Run._two_part_fits(k, step.levels, m) for k in (step.ks or (step.k,)))
        if step.kind == "even":  # the half-to-even form's int32 ops on the value itself
            return e == 0 and Run._even_fits(step.k, step.low, m)
        return top + (abs(step.k) << e) <= INT32_MAX

    @staticmethod
    def _two_part_fits(k: int, levels: tuple[tuple[int, int], ...], m: int) -> bool:
        """Whether the CVM ops of a product in parts (``steps.two_part``; level j's multiplier m_j = (k >> B_j) mod
        2^(b_j), B_j the widths below it, m_top = k >> B) on values |v| <= m stay within int32 and no level's clip
        to its bound acts: |v m_j| + T_(j-1) + 2^(b_j-1) within int32 and |floor((v m_j + t_(j-1)) / 2^(b_j))| <=
        T_j = ceil((m m_j + T_(j-1)) / 2^(b_j)) <= its bound (T_(-1) = 0), m_top an int32 and m |m_top| + T_last
        within int32."""
        t, start = 0, 0
        for b, low in levels:
            x = m * ((k >> start) & ((1 << b) - 1)) + t
            t = -(-x >> b)
            if x + (1 << (b - 1)) > INT32_MAX or t > low:
                return False
            start += b
        top = k >> start
        return -INT32_MAX - 1 <= top <= INT32_MAX and m * abs(top) + t <= INT32_MAX

    @staticmethod
    def _even_fits(k: int, low: int, m: int) -> bool:
        """Whether the CVM ops of a shift rounding half to even (``steps.half_even``) on values |t| <= m stay within
        int32 and neither shift's clip to +-``low`` acts: |t| + 2^(k-1) within int32, and floor((t + c + 2^k) /
        2^(k+1)) within +-low for c = 2^(k-1) - 1 at t = m and c = -2^(k-1) at t = -m (each shift is monotone)."""
        half = 1 << (k - 1)
        return m + half <= INT32_MAX and (m + half - 1 + (1 << k)) >> (k + 1) <= low and \
            -((-m - half + (1 << k)) >> (k + 1)) <= low

    def _even(self, k: int) -> None:
        """Bounds only (a native run rounds; no int32 body has this step): the clipped value over 2^k, rounded (its
        magnitude at most floor((M + 2^(k-1)) / 2^k)); the clip is taken."""
        self.w, self.lo, self.hi = (self._clipped() + (1 << (k - 1))) >> k, None, None

    def _mul64(self, step: Step) -> None:
        """Bounds only (a native run multiplies; no int32 body has this step): the clipped value, at most
        ``_clipped()``, times multipliers of magnitude <= k, over 2^b, floored; the clip is taken."""
        self.w, self.lo, self.hi = -(-self._clipped() * abs(step.k) >> step.b), None, None

    def _int32(self) -> None:
        if self.float:
            self.t, self.float = self.b.Cast(self.t, to=TensorProto.INT32), False

    def _shift(self, s: int) -> None:
        self._int32()
        k = self.e + s
        self.t = self.b.BitwiseAnd(self.b.Add(self.t, self._i32(1 << (k - 1))), self._i32(-(1 << k)))
        self.e = k
        f = lambda v: None if v is None else round_shift(v, s)  # noqa: E731
        self.w, self.lo, self.hi = f(self.w), f(self.lo), f(self.hi)

    def _cmul(self, k: int) -> None:
        """Bounds only (a native run multiplies; no int32 body has this step): the clipped value, at most
        ``_clipped()``, times multipliers of magnitude <= k; the clip is taken (a bound per channel is not kept)."""
        self.w, self.lo, self.hi = self._clipped() * k, None, None

    def _mul(self, m: int) -> None:
        self._int32()
        self.t = self.b.Mul(self.t, self._i32(m))
        self.w *= abs(m)
        lo, hi = (None if v is None else v * m for v in (self.lo, self.hi))
        self.lo, self.hi = (lo, hi) if m >= 0 else (hi, lo)

    def _add(self, c: int) -> None:
        self._int32()
        self.t = self.b.Add(self.t, self._i32(c << self.e))
        self.w += abs(c)
        self.lo, self.hi = (None if v is None else v + c for v in (self.lo, self.hi))

    def _i32(self, v: int) -> str:
        return self.b.const(v, np.int32)

    def _flush(self) -> None:
        """Apply a two-sided pending clip to t (in int32, or float32 while t is float): W becomes the clip's."""
        if self.lo is None or self.hi is None:
            return
        if self.float and self.m > FLOAT_EXACT:
            self._int32()
        scale = 1 << self.e
        const = (lambda v: self.b.const(v, np.float32)) if self.float else self._i32
        self.t = self.b.Clip(self.t, const(self.lo * scale), const(self.hi * scale))
        self.w, self.lo, self.hi = max(abs(self.lo), abs(self.hi)), None, None

    def _normalize(self) -> None:
        """t becomes the clipped value itself (e = 0)."""
        if self.e:
            bound = self._clipped()
            self.t, self.w, self.e, self.lo, self.hi = self.finish(), bound, 0, None, None

    def finish(self) -> str:
        """The value, clip(t / 2^e, lo, hi), as int32."""
        b = self.b
        if self.float and self.m <= FLOAT_EXACT:  # e = 0: clip in float32, then cast
            y = self.t
            if self.lo is not None or self.hi is not None:
                y = b.Clip(y, *("" if v is None else b.const(v, np.float32) for v in (self.lo, self.hi)))
            return b.Cast(y, to=TensorProto.INT32)
        self._int32()
        if self.e == 0:
            if self.lo is None and self.hi is None:
                return self.t
            return b.Clip(self.t, *("" if v is None else self._i32(v) for v in (self.lo, self.hi)))
        if self.m >= FLOAT_EXACT:
            self._flush()
        dtype, to = (np.float32, TensorProto.FLOAT) if self.m < FLOAT_EXACT else (np.float64, TensorProto.DOUBLE)
        y = b.Mul(b.Cast(self.t, to=to), b.const(2.0 ** -self.e, dtype))
        if self.lo is not None or self.hi is not None:
            y = b.Clip(y, *("" if v is None else b.const(v, dtype) for v in (self.lo, self.hi)))
        return b.Cast(y, to=TensorProto.INT32)
