"""The native ``requantize`` encoding of a run: its steps as (kind, a, b) int triples (``_flat``; the kinds are
``cvm_onnx.native``'s SHIFT, MULTIPLY, ADD, CLIP, MUL64, EVEN), each channel's own steps aligned to one sequence of
kinds (``_aligned``), and the ``requantize`` nodes that run them."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from cvm_onnx.core.constants import INT32_MAX
from cvm_onnx.native import ADD, CLIP, EVEN, MUL64, MULTIPLY, SHIFT
from cvm_onnx.native import DOMAIN as NATIVE_DOMAIN

from ..lowering import Body, Value
from .steps import Step, channel_step


def native_run(b: Body, x: str, bias: Value | None, steps: list[Step], **attrs) -> str:
    """The run as native ``requantize`` nodes: the steps in the order the CVM ops take them, each clip at
    once (two clips in a row as one: clamps compose, clip(clip(v, a, b), lo, hi) = clip(v, clip(a, lo, hi),
    clip(b, lo, hi))), on x + bias per channel (or per position and channel, ``_bias``) in int32 (``attrs``: its
    ``width`` or ``scales``, see ``nn.conv2d_integer``). With a per-channel multiplication ("cmul") each channel
    gets its own steps (``channel_steps``, the multiplier its own), or, where ``attrs`` has no such form (a width,
    batch_inner, scales), the cmul starts the next node, whose ``scales`` multiply each channel before its steps (a
    "cmul64", a product in parts per channel, the next node with each channel's own steps from it on).
    Exact: ``runs`` took every step only where the proven bound shows that the runtime's own int32 computation
    (clipped as it goes) cannot overflow, so the kernel's int32 arithmetic never wraps where the runtime's does
    not; the shift is the runtime's (v + 2^(s-1)) >> s. No steps (a CUDA-form conv2d alone) is written as the
    clip to int32's own range, which changes nothing."""
    cmul = [s for s in steps if s.kind in ("cmul", "cmul64")]
    if cmul and not {"width", "batch_inner", "scales"} & attrs.keys():  # each channel its own steps, one pass
        per = [[channel_step(s, c) for s in steps] for c in range(len(cmul[0].ks))]
        return channel_run(b, x, bias, per, **attrs)
    for k, s in enumerate(steps):
        if s.kind == "cmul64":
            x = native_run(b, x, bias, steps[:k], **attrs)
            return channel_run(b, x, None, [[channel_step(t, c) for t in steps[k:]] for c in range(len(s.ks))])
        if s.kind == "cmul":
            x = native_run(b, x, bias, steps[:k], **attrs)
            return native_run(b, x, None, steps[k + 1:], scales=list(s.ks))
    return b.node("requantize", x, _bias_name(b, bias), domain=NATIVE_DOMAIN, steps=_flat(steps), **attrs)


def _bias_name(b: Body, bias: Value | None) -> str:
    """``requantize``'s bias input: the bias as int32, or an empty one."""
    return b.Cast(bias, to=TensorProto.INT32) if bias is not None else b.const(np.zeros(0, np.int32), np.int32)


def channel_run(b: Body, x: str, bias: Value | None, per: list[list[Step]], **attrs) -> str:
    """One ``requantize`` with each channel's own steps (``per``, no "cmul"), flattened (``_flat``) and aligned to
    one sequence of kinds (``_aligned``)."""
    flat = _aligned([_flat(steps) for steps in per])
    return b.node("requantize", x, _bias_name(b, bias), domain=NATIVE_DOMAIN,
                  channel_counts=[len(f) // 3 for f in flat], channel_steps=[v for f in flat for v in f], **attrs)


#: A step of each kind that leaves every value as it is: shift 0, multiply by 1, add 0, clip to int32's range,
#: floor(v 1 / 2^0), a shift by 0 rounding half to even.
IDENTITY = {SHIFT: [SHIFT, 0, 0], MULTIPLY: [MULTIPLY, 1, 0], ADD: [ADD, 0, 0], CLIP: [CLIP, -INT32_MAX - 1, INT32_MAX],
            MUL64: [MUL64, 1, 0], EVEN: [EVEN, 0, 0]}


def _supersequence(a: list[int], b: list[int]) -> list[int]:
    """A shortest sequence holding both ``a`` and ``b`` as subsequences (longest common subsequence kept once)."""
    n, m = len(a), len(b)
    common = [[0] * (m + 1) for _ in range(n + 1)]  # common[i][j]: LCS length of a[i:] and b[j:]
    for i in reversed(range(n)):
        for j in reversed(range(m)):
            common[i][j] = common[i + 1][j + 1] + 1 if a[i] == b[j] else max(common[i + 1][j], common[i][j + 1])
    out, i, j = [], 0, 0
    while i < n and j < m:
        if a[i] == b[j]:
            out, i, j = out + [a[i]], i + 1, j + 1
        elif common[i + 1][j] >= common[i][j + 1]:
            out, i = out + [a[i]], i + 1
        else:
            out, j = out + [b[j]], j + 1
    return out + a[i:] + b[j:]


def _aligned(programs: list[list[int]]) -> list[list[int]]:
    """Flat step lists with ``IDENTITY`` steps inserted so that all have one sequence of kinds (a common
    supersequence of theirs): each computes the same values, and ``requantize`` applies them side by side."""
    kinds = programs[0][0::3]
    for p in programs[1:]:
        kinds = _supersequence(kinds, p[0::3])
    out = []
    for p in programs:
        q, j = [], 0
        for kind in kinds:  # leftmost embedding: kinds is a supersequence of p's, so every step of p is placed
            if j < len(p) // 3 and p[3 * j] == kind:
                q, j = q + p[3 * j:3 * j + 3], j + 1
            else:
                q += IDENTITY[kind]
        out.append(q)
    return out


def _flat(steps: list[Step]) -> list[int]:
    """The steps (no "cmul" or "cmul64") as requantize's (kind, a, b) triples ("mul64": (MUL64, k, b), "even":
    (EVEN, k, 0)), two clips in a row as one; no steps as the clip to int32's own range."""
    low, high = -INT32_MAX - 1, INT32_MAX
    flat: list[int] = []
    for s in steps:
        if s.kind != "clip":
            flat += [{"shift": SHIFT, "mul": MULTIPLY, "add": ADD, "mul64": MUL64, "even": EVEN}[s.kind], s.k,
                     s.b if s.kind == "mul64" else 0]
            continue
        lo, hi = low if s.lo is None else s.lo, high if s.hi is None else s.hi
        if flat[-3:-2] == [CLIP]:  # clip(clip(v, a, b), lo, hi) = clip(v, clip(a, lo, hi), clip(b, lo, hi)): one pass
            flat[-2:] = [min(max(flat[-2], lo), hi), min(max(flat[-1], lo), hi)]
        else:
            flat += [CLIP, lo, hi]
    return flat or [CLIP, low, high]
