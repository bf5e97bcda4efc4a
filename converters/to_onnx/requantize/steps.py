"""The steps of a requantization run: which CVM nodes are monotone integer steps on one tensor (``Op.step``),
and the steps each is (``steps_of``); a product in parts as one step (``two_part``)."""
from __future__ import annotations

from dataclasses import dataclass

from cvm_onnx.core.constants import precision_bound
from cvm_onnx.core.graph import Entry, Graph, Node
from cvm_onnx.core.ops import REGISTRY


@dataclass(frozen=True)
class Step:
    """One monotone step: ``kind`` "shift" (k = bits), "mul" / "add" (k = constant), "clip" (lo, hi; None =
    unbounded) or "cmul" (a multiplier per axis-1 channel, ``ks``; k = the largest |multiplier|; native runs only);
    "mul64": a product in parts (``two_part``), floor(v k / 2^b) with k = m_top 2^b + (k mod 2^b), "cmul64" the
    same with a multiplier per axis-1 channel (``ks``, k = the largest |multiplier|), ``levels`` each level's
    (width, bound of its cvm_right_shift's precision) from the lowest (their widths summing to b), ``low`` the
    last's bound (native runs only); "even": round_half_even(v / 2^k) (``half_even``), ``low`` the
    bound of its two cvm_right_shifts' precision (native runs only)."""

    kind: str
    k: int = 0
    lo: int | None = None
    hi: int | None = None
    ks: tuple[int, ...] = ()
    b: int = 0
    low: int = 0
    levels: tuple[tuple[int, int], ...] = ()


def channel_step(step: Step, c: int) -> Step:
    """Channel c's own form of a step: "cmul" and "cmul64" with its multiplier as "mul" and "mul64"."""
    if step.kind in ("cmul", "cmul64"):
        return Step(step.kind[1:], step.ks[c], b=step.b, low=step.low, levels=step.levels)
    return step


def _limit(precision: int) -> Step:
    bound = precision_bound(precision)
    return Step("clip", lo=-bound, hi=bound)


def scalar_param(graph: Graph, e: Entry) -> int | None:
    """The value of a param holding exactly one number, else None."""
    node = graph.nodes[e.node]
    value = graph.params.get(node.name) if node.is_variable else None
    return int(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def channel_values(graph: Graph, e: Entry, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The values of a param that broadcasts along axis 1 of ``shape`` only, one per channel ((C,) + (1,) * k,
    leading 1s allowed, rank at most ``shape``'s, C = shape[1] > 1), else None."""
    node = graph.nodes[e.node]
    value = graph.params.get(node.name) if node.is_variable else None
    if value is None or len(shape) < 2 or shape[1] < 2 or value.ndim > len(shape) or value.size != shape[1]:
        return None
    dims = (1,) * (len(shape) - value.ndim) + value.shape
    return tuple(int(v) for v in value.reshape(-1)) if dims[1] == shape[1] else None


def _multipliers(graph: Graph, e: Entry, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """A broadcast_mul's param as one multiplier (a 1-tuple) or one per axis-1 channel of ``shape``, else None."""
    c = scalar_param(graph, e)
    return (c,) if c is not None else channel_values(graph, e, shape)


def _low_part(graph: Graph, e: Entry, shape: tuple[int, ...], room: int) -> tuple[
        Entry, tuple[int, ...], tuple[int, ...], tuple[tuple[int, int], ...]] | None:
    """The low operand of a product in parts: broadcast_mul(v, m) (v, (), m's multipliers, no levels), or a product
    in parts itself whose widths sum to at most ``room`` (``two_part``: v, its inner nodes (its last node, e's, is
    the caller's), its whole multipliers, its levels), else None."""
    node = graph.nodes[e.node]
    if e.index or graph.type_of(e).shape != shape:
        return None
    if node.op == "broadcast_mul":
        m = _multipliers(graph, node.inputs[1], shape)
        return None if m is None else (node.inputs[0], (), m, ())
    part = two_part(graph, node, room)
    if part is None:
        return None
    v, inner, step = part
    return v, inner, step.ks or (step.k,), step.levels


def two_part(graph: Graph, node: Node, room: int = 31) -> tuple[Entry, tuple[int, ...], Step] | None:
    """A product in parts ending at ``node`` (the quantized importer's, docs/import.md "Two-part products" and
    "Products in n parts"): p = broadcast_mul(v, m_top), t = cvm_right_shift(broadcast_add(L, -2^(b-1)), b) into
    precision q, ``node`` = broadcast_add(p, t) (in either order), where L is broadcast_mul(v, m0) with 0 <= m0 <
    2^b, or itself a product in parts of v, floor(v m_L / 2^B_L) with 0 <= m_L < 2^(B_L + b); each multiplier one
    param or one per axis-1 channel, every tensor of v's shape: (v, the inner nodes, the step "mul64" or "cmul64"
    with k = m_top 2^(B_L + b) + m_L, b = B_L + b, ``levels`` the (b_j, bound of q_j) of each level from the lowest,
    ``low`` the last's), else None. Where none of these int32 ops wraps and no level's shift clips (``Run`` checks
    it from v's bound), ``node`` is floor(v k / 2^b): by induction L = floor(v m_L / 2^B_L), cvm_right_shift of L -
    2^(b-1) by b is floor(L / 2^b) = floor(v m_L / 2^(B_L + b)) (nested floors), and v m_top 2^(B_L + b) is a
    multiple of 2^(B_L + b). Only B <= ``room`` (31: a native mul64's shift) is sought, so at most 31 levels are
    read. The caller checks that v is read by the n multiplies alone (``fork_readers``) and each inner node by the
    next alone."""
    if node.op != "broadcast_add" or len(node.inputs) != 2:
        return None
    shape = node.outputs[0].shape
    for hi_e, lo_e in (tuple(node.inputs), tuple(reversed(node.inputs))):
        high, shift = graph.nodes[hi_e.node], graph.nodes[lo_e.node]
        if high.op != "broadcast_mul" or shift.op != "cvm_right_shift" or hi_e.index or lo_e.index:
            continue
        add = graph.nodes[shift.inputs[0].node]
        if add.op != "broadcast_add" or shift.inputs[0].index:
            continue
        a = REGISTRY["cvm_right_shift"].bind(shift.attrs)
        b, c = a.shift_bit, scalar_param(graph, add.inputs[1])
        if not 1 <= b <= room or c != -(1 << (b - 1)):
            continue
        low = _low_part(graph, add.inputs[0], shape, room - b)
        v = high.inputs[0]
        if low is None or low[0] != v or graph.type_of(v).shape != shape or \
                any(graph.type_of(e).shape != shape for e in (hi_e, lo_e, shift.inputs[0])):
            continue
        _, nested, m0, levels = low
        below = sum(w for w, _ in levels) + b
        m1 = _multipliers(graph, high.inputs[1], shape)
        if m1 is None or not all(0 <= m < (1 << below) for m in m0):
            continue
        levels += ((b, precision_bound(a.precision)),)
        inner = nested + (hi_e.node, add.inputs[0].node, shift.inputs[0].node, lo_e.node)
        if len(m1) == len(m0) == 1:
            return v, inner, Step("mul64", (m1[0] << below) + m0[0], b=below, low=levels[-1][1], levels=levels)
        n = max(len(m1), len(m0))
        ks = tuple((m1[c % len(m1)] << below) + m0[c % len(m0)] for c in range(n))
        return v, inner, Step("cmul64", max(abs(k) for k in ks), ks=ks, b=below, low=levels[-1][1], levels=levels)
    return None


def fork_readers(step: Step) -> int:
    """How many nodes of a forked step read its input: one multiply per part of a product in parts, two shifts of a
    shift rounding half to even."""
    return len(step.levels) + 1 if step.kind in ("mul64", "cmul64") else 2


def half_even(graph: Graph, node: Node) -> tuple[Entry, tuple[int, ...], Step] | None:
    """A shift rounding half to even ending at ``node`` (the quantized importer's, docs/import.md "Ties"): ``node`` =
    broadcast_add of cvm_right_shift(t + 2^(k-1) - 1, k + 1) and cvm_right_shift(t - 2^(k-1), k + 1) (in either
    order; each add a broadcast_add of one param, the one of 0 absent), every tensor of t's shape: (t, the inner
    nodes, the step "even" with ``low`` = the lesser bound of the two shifts' precisions), else None. Where neither
    add wraps and neither shift's clip acts (``Run`` checks it from t's bound), ``node`` is floor((t + 3 2^(k-1) - 1)
    / 2^(k+1)) + floor((t + 2^(k-1)) / 2^(k+1)) = round_half_even(t / 2^k). The caller checks that t is read by
    these two alone and each inner node by the next alone."""
    if node.op != "broadcast_add" or len(node.inputs) != 2 or any(e.index for e in node.inputs):
        return None
    shape = node.outputs[0].shape
    found = []
    for e in node.inputs:
        shift = graph.nodes[e.node]
        if shift.op != "cvm_right_shift" or shift.inputs[0].index or graph.type_of(shift.inputs[0]).shape != shape:
            return None
        a = REGISTRY["cvm_right_shift"].bind(shift.attrs)
        add = graph.nodes[shift.inputs[0].node]
        c = scalar_param(graph, add.inputs[1]) if add.op == "broadcast_add" and len(add.inputs) == 2 else None
        t, inner = (add.inputs[0], (shift.inputs[0].node, e.node)) if c is not None else (shift.inputs[0], (e.node,))
        found.append((a.shift_bit - 1, c or 0, t, inner, precision_bound(a.precision)))
    (k, c1, t, inner1, p1), (k2, c2, t2, inner2, p2) = found
    if k < 1 or k2 != k or t != t2 or graph.type_of(t).shape != shape or \
            sorted((c1, c2)) != [-(1 << (k - 1)), (1 << (k - 1)) - 1]:
        return None
    return t, inner1 + inner2, Step("even", k, low=min(p1, p2))


def forked(graph: Graph, node: Node) -> tuple[Entry, tuple[int, ...], Step] | None:
    """``two_part`` or ``half_even``: one step whose input is read by two nodes inside it."""
    return two_part(graph, node) or half_even(graph, node)


def steps_of(graph: Graph, node: Node, channels: bool = False) -> tuple[Entry, list[Step]] | None:
    """The entry a run continues from and the node's steps, or None when the node is not a monotone step on one
    tensor (its definition's ``Op.step``; a broadcast op counts only with a one-number param that leaves the other
    input's shape; with ``channels``, for native runs, a broadcast_mul by one multiplier per axis-1 channel too,
    "cmul", and the end of a product in parts or of a shift rounding half to even, ``forked``, whose input is
    v)."""
    if channels and (part := forked(graph, node)) is not None:
        return part[0], [part[2]]
    op = REGISTRY[node.op]
    a = op.bind(node.attrs)
    if op.step == "shift":
        return node.inputs[0], [Step("shift", a.shift_bit), _limit(a.precision)]
    if op.step == "left_shift":
        return node.inputs[0], [Step("mul", 1 << a.shift_bit), _limit(a.precision)]
    if op.step == "limit":
        return node.inputs[0], [_limit(a.precision)]
    if op.step == "clip":
        return node.inputs[0], [Step("clip", lo=a.a_min, hi=a.a_max)]
    if op.step == "relu":
        return node.inputs[0], [Step("clip", lo=0)]
    if op.step == "scalar":
        for data, const in ((0, 1), (1, 0)) if node.op != "broadcast_sub" else ((0, 1),):
            c = scalar_param(graph, node.inputs[const])
            x = node.inputs[data]
            if c is not None and graph.type_of(x).shape == node.outputs[0].shape:
                kind, k = ("mul", c) if node.op == "broadcast_mul" else ("add", c if node.op == "broadcast_add" else -c)
                return x, [Step(kind, k)]
    if channels and node.op == "broadcast_mul":
        for data, const in ((0, 1), (1, 0)):
            x, shape = node.inputs[data], node.outputs[0].shape
            ks = channel_values(graph, node.inputs[const], shape)
            if ks is not None and graph.type_of(x).shape == shape:
                return x, [Step("cmul", max(abs(k) for k in ks), ks=ks)]
    return None
