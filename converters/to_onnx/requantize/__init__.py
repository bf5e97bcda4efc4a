"""Requantization runs for the serving form: a chain of monotone integer steps lowered as one short body.

CVM models requantize between layers with runs such as conv2d -> cvm_right_shift -> broadcast_mul (scalar)
-> cvm_right_shift -> relu. Lowered one op at a time, each step casts to float and back; fused, the run costs
a few int32 Add/Mul/BitwiseAnd nodes and one float32 Clip. A run that alone reads a conv2d/dense starts from
its float32 product, which also takes a first shift (``lower_run``).

A run is a chain of nodes, each the only reader of the previous one's output, made of these steps on an
integer w: ``shift s``: floor((w + 2^(s-1)) / 2^s) (cvm_right_shift, the runtime's round half up);
``mul m`` and ``add c`` by a scalar param (broadcast_mul/add/sub, cvm_left_shift as mul 2^s); ``clip``
(cvm_clip, clip, relu, and the clip that ends cvm_right_shift and cvm_left_shift).

Exactness. Every step f is monotone (non-increasing only for mul by m < 0), so f(clip(w, lo, hi)) =
clip(f(w), f(lo), f(hi)) (bounds swapped for m < 0): the clips are deferred and merged into one, applied at the
end, on values that were never clipped. The body holds ``t = w * 2^e`` in int32, with w an integer and e the
sum of the shifts so far: a shift adds 2^(e+s-1) to t and clears its low e+s bits with BitwiseAnd (two's
complement: t & -2^k = 2^k floor(t / 2^k)), so t becomes f(w) * 2^(e+s) with no division. Every step is taken
only where the bound ``W >= |w|`` (from the input's proven bound) shows its int32 result cannot overflow;
otherwise the pending clip is applied first (``Clip`` on t, bounds scaled by 2^e) if that is enough, else t is
brought back to e = 0 (the clip taken in float32); if even that is not enough the run ends before the step.
The end divides by 2^e in float32 (t / 2^e has at most 24 significant bits when W < 2^24: exact; float64
otherwise), clips there and casts the integer back to int32.

By concern: ``steps`` (which nodes are steps), ``matching`` (the runs found and their heads, each conv2d's
route), ``run`` (the int32 body), ``encoding`` (the native ``requantize`` steps), ``lowering`` (a run's body).
"""
from .lowering import lower_run
from .matching import Chain, conv_routes, runs
from .steps import steps_of

__all__ = ["Chain", "conv_routes", "lower_run", "runs", "steps_of"]
