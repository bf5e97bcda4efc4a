"""The p-th root of a wide exact value (docs/import.md, "Roots of wide exact sums"): Pow(w, 1/p) for an integer
2 <= p <= ``MAX_DEGREE`` (the exponent 1/p in float64, or float32(1/p) as exporters write it) and Sqrt, of a
dequantized w = (t - z) s_w >= 0 whose integers pass a table's 2^16 entries: the exact mean or sum of p-th powers of
GeM pooling, Pow(ReduceMean(Pow(x, p)), 1/p), or of a p-norm. Its integer round(c (t - z)^(1/p)) (half to even), c^p =
s_w / s_y^p, is the number of thresholds (t - z) >= or > (k - 1/2)^p / c^p, exact rationals, at or below t - z
(``l2norm.root_thresholds``, ``l2norm.counted``)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..context import INT_RANGES, Tensor
from ..emit import as_int32
from ..registry import Refuse
from .l2norm import MAX_INNER, counted, root_thresholds
from .norm import c32, proven
from .qdq import MAX_TABLE, Requant, saturate
from .values import Deferred, Scaled, per_tensor

#: The largest root degree p taken (Pow(., 1/p)).
MAX_DEGREE = 16


def root_degree(k: float) -> int | None:
    """p where the exponent k is 1/p for an integer 2 <= p <= ``MAX_DEGREE``, in float64 or float32; else None."""
    if not 0 < k <= 0.5:
        return None
    p = round(1 / k)
    return p if 2 <= p <= MAX_DEGREE and k in (1 / p, float(np.float32(1 / p))) else None


def wide(x) -> bool:
    """Whether x is a computed dequantized value (per tensor, no deferred clip) whose integers pass a table's 2^16."""
    return isinstance(x, Scaled) and not x.t.is_const and x.per_tensor and x.clip == (None, None) and \
        x.t.hi - x.t.lo + 1 > MAX_TABLE


@dataclass(frozen=True, eq=False)
class Root(Deferred):
    """w^(1/p) of a dequantized w = (t - z) s_w >= 0 (``wide``), made integers by the QuantizeLinear that follows (or
    a float output's grid): round(s_w^(1/p) (t - z)^(1/p) / s_y) + z_y, exactly."""

    x: Scaled
    p: int
    node: str = ""
    what: str = "root"

    @property
    def shape(self) -> tuple[int, ...]:
        return self.x.shape

    def top(self) -> int:
        return self.x.t.hi - int(self.x.zero.reshape(()))

    @property
    def ends(self) -> tuple[float, float]:
        """0 to (s_w (t - z)_max)^(1/p), the span a float output is quantized to."""
        return 0.0, (float(self.x.scale.reshape(()).item()) * self.top()) ** (1 / self.p)

    def quantized(self, ctx, scale: np.ndarray, out_zero: int, dtype: int) -> Tensor:
        """t - z, then the number of ``root_thresholds`` at or below it (``counted``), + z_y, clipped."""
        where = f"{self.node} ({self.what})"
        if scale.size != 1:
            raise Refuse(f"{where} with a per-channel output scale has no CVM form")
        lo, hi = INT_RANGES[dtype]
        t, z, v_max = self.x.t, int(self.x.zero.reshape(())), self.top()
        cp = self.x.scale.reshape(()).item() / scale.reshape(()).item() ** self.p
        # round(c w^(1/p)) <= c v_max^(1/p) + 1/2: a bound on the outputs reached, with a margin for float64
        k_max = min(max(hi - out_zero, 0), math.floor(float(cp) ** (1 / self.p) * v_max ** (1 / self.p)) + 2)
        if k_max > MAX_INNER * MAX_TABLE:
            raise Refuse(f"{where}: its output takes {k_max} steps over its input (at most {MAX_INNER} per bucket of "
                         "2^16): quantize it at a coarser scale")
        flat = (math.prod(self.shape), 1, 1)
        w = ctx.reshape(as_int32(t), flat)
        if z:
            w = proven(ctx, "broadcast_sub", w, c32(z), t.lo - z, v_max, flat)
        ctx.requants.append(Requant(ctx.base, (), None))
        marks = [m for m in root_thresholds(cp, self.p, k_max) if m <= v_max]
        r = counted(ctx, w, marks, v_max, where, "input")
        return saturate(ctx, ctx.reshape(r, self.shape), out_zero, lo, hi, dtype, self.shape)


def root(x: Scaled, p: int, node: str, what: str) -> Root:
    """The p-th root of a ``wide`` x, refused where x reaches below 0 (the root is NaN there)."""
    x = per_tensor(x, what)
    if x.t.lo < int(x.zero.reshape(())):
        raise Refuse(f"{what} of a value over {x.t.hi - x.t.lo + 1} integers reaching below 0 is undefined (NaN) "
                     "there")
    return Root(x, p, node, what)
