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
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from onnx import TensorProto

from cvm_onnx.core.constants import FLOAT32_EXACT as FLOAT_EXACT
from cvm_onnx.core.constants import INT32_MAX, precision_bound
from cvm_onnx.core.graph import Entry, Graph, Node
from cvm_onnx.core.ops import REGISTRY
from cvm_onnx.core.ops.elemwise import round_shift
from cvm_onnx.native import DOMAIN as NATIVE_DOMAIN
from cvm_onnx.serving.target import Target

from . import nn
from .lowering import Body, Value, unwiden, widen



@dataclass(frozen=True)
class Step:
    """One monotone step: ``kind`` "shift" (k = bits), "mul" / "add" (k = constant), "clip" (lo, hi; None =
    unbounded) or "cmul" (a multiplier per axis-1 channel, ``ks``; k = the largest |multiplier|; native runs only)."""

    kind: str
    k: int = 0
    lo: int | None = None
    hi: int | None = None
    ks: tuple[int, ...] = ()


def _limit(precision: int) -> Step:
    bound = precision_bound(precision)
    return Step("clip", lo=-bound, hi=bound)


def _scalar(graph: Graph, e: Entry) -> int | None:
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


def steps_of(graph: Graph, node: Node, channels: bool = False) -> tuple[Entry, list[Step]] | None:
    """The entry a run continues from and the node's steps, or None when the node is not a monotone step on one
    tensor (its definition's ``Op.step``; a broadcast op counts only with a one-number param that leaves the other input's shape; with
    ``channels``, a broadcast_mul by one multiplier per axis-1 channel too, "cmul", for native runs)."""
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
            c = _scalar(graph, node.inputs[const])
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
        return top + (abs(step.k) << e) <= INT32_MAX

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


@dataclass(frozen=True)
class Unsigned:
    """A conv2d's data as the halves of u - zero (the quantized importer's 8-bit operands, from_onnx's
    ``products.halves``): ``nodes`` = [v = u - zero (absent when zero is 0), h = cvm_right_shift(v, 1), g = v - h,
    concatenate((h, g), axis 1), cvm_clip(8)], read by a conv2d (one group) whose weight is [w, w] along the input
    channels; ``data`` is u (proven in [0, 255]), ``weight`` w (OC, C, kh, kw).

    The conv2d computes conv(v, w) (zero padding): with v in [-254, 254] (u in [0, U], U <= 255, and
    max(zero, U - zero) <= 254), h = floor((v + 1) / 2) and g = v - h = floor(v / 2) both lie in [-127, 127], so
    neither cvm_right_shift's clip to 8 bits nor cvm_clip changes a value and h + g = v; conv(concat(h, g), [w, w])
    = conv(h, w) + conv(g, w) = conv(h + g, w) (each output the same integer sum of products, regrouped; the
    padding is 0 in h, g and v alike), hence the same int32 result as the runtime's accumulator."""

    nodes: tuple[int, ...]
    data: Entry
    zero: int
    weight: np.ndarray


@dataclass(frozen=True)
class Chain:
    """A run: its step nodes in order and the conv2d/dense node whose product starts it, if any (on "cuda" a
    conv2d with no steps after it); ``unsigned``: the head's data computed from u (``Unsigned``); ``offset``: a
    broadcast_add of a param (OC, OH, OW) between the head and the steps (an integer-products head of rows only);
    ``take``: a take of some of the head's output channels (``channels``, clipped into range as take does) between
    them, the head (and its unsigned and offset nodes) then shared by the runs of every take reading it."""

    nodes: list[int]
    head: int | None = None
    unsigned: Unsigned | None = None
    offset: int | None = None
    take: int | None = None
    channels: np.ndarray | None = None

    @property
    def all(self) -> list[int]:
        before = [] if self.unsigned is None else list(self.unsigned.nodes)
        return before + [i for i in (self.head, self.offset, self.take) if i is not None] + self.nodes


@dataclass(frozen=True)
class Grouped:
    """The runs of a head's channel groups (``Chain.take``) put back together: ``concat`` concatenates their
    outputs along axis 1 and ``back`` (a take along axis 1) puts every channel back at its place in the head's
    output, so channel c of the result is its group's run applied to channel c of the head's (``grouped``
    checks it). One native ``requantize`` computes it with each channel's own steps."""

    parts: tuple[Chain, ...]
    concat: int
    back: int
    source: tuple[tuple[int, int], ...]  # channel c of the result: (part, position in its take) that back picks
    tail: tuple[int, ...] = ()  # step nodes after ``back``, each the only reader of the previous

    @property
    def head(self) -> int:
        return self.parts[0].head

    @property
    def unsigned(self) -> Unsigned | None:
        return self.parts[0].unsigned

    @property
    def all(self) -> list[int]:
        first = self.parts[0]
        shared = [] if first.unsigned is None else list(first.unsigned.nodes)
        shared += [i for i in (first.head, first.offset) if i is not None]
        return shared + [i for c in self.parts for i in [c.take, *c.nodes]] + [self.concat, self.back, *self.tail]

    def channel_steps(self, graph: Graph) -> list[list[Step]]:
        """Channel c's steps: those of the group (and position in it) that the take back picks for c, then the
        tail's, a per-channel multiplier ("cmul") taken as its own ("mul")."""
        def own(steps: list[Step], k: int) -> list[Step]:
            return [Step("mul", s.ks[k]) if s.kind == "cmul" else s for s in steps]

        tail = [step for i in self.tail for step in steps_of(graph, graph.nodes[i], True)[1]]
        parts = [[step for i in c.nodes for step in steps_of(graph, graph.nodes[i], True)[1]] for c in self.parts]
        return [own(parts[g], k) + own(tail, ch) for ch, (g, k) in enumerate(self.source)]


def _readers(graph: Graph) -> dict[Entry, int]:
    """How many times each entry is read (a head counts twice: it must stay)."""
    readers: dict[Entry, int] = {}
    for node in graph.nodes:
        for e in node.inputs:
            readers[e] = readers.get(e, 0) + 1
    for h in graph.heads:
        readers[h] = readers.get(h, 0) + 2
    return readers


def _operands(graph: Graph, node: Node, bounds: dict[Entry, int]) -> tuple[Value, Value]:
    """A conv2d's data and weight as the lowerings see them (shape, bound, the param's value)."""
    x, w = (Value("", graph.type_of(e).shape, bounds[e], graph.params.get(graph.nodes[e.node].name))
            for e in node.inputs[:2])
    return x, w


def int8_head(graph: Graph, node: Node, bounds: dict[Entry, int], provider: str = "cpu") -> bool:
    """Whether ``node`` is a conv2d that starts a run from its integer products (``nn.int8_route``)."""
    if node.op != "conv2d":
        return False
    return nn.int8_route(REGISTRY[node.op].bind(node.attrs), *_operands(graph, node, bounds), node.outputs[0].shape,
                         provider)


def _producer(graph: Graph, e: Entry, op: str, readers: dict[Entry, int], count: int = 1) -> Node | None:
    """The node making ``e`` when it is an ``op`` read exactly ``count`` times (never a head)."""
    node = graph.nodes[e.node]
    return node if node.op == op and not e.index and readers.get(e) == count else None


def unsigned_source(graph: Graph, conv: int, bounds: dict[Entry, int], nonneg: set[Entry],
                    readers: dict[Entry, int]) -> Unsigned | None:
    """The ``Unsigned`` form of conv2d ``conv``'s data, when its nodes are exactly that pattern, each read only
    inside it, and the bounds prove its conditions (u >= 0, U <= 255, max(zero, U - zero) <= 254, the halves'
    cvm_right_shift of 8 bits or more); else None."""
    node = graph.nodes[conv]
    groups = REGISTRY["conv2d"].bind(node.attrs).groups if node.op == "conv2d" else 1
    w = graph.params.get(graph.nodes[node.inputs[1].node].name)
    clip = _producer(graph, node.inputs[0], "cvm_clip", readers)
    cat = clip and REGISTRY["cvm_clip"].bind(clip.attrs).precision == 8 and \
        _producer(graph, clip.inputs[0], "concatenate", readers)
    if groups != 1 or w is None or not cat or REGISTRY["concatenate"].bind(cat.attrs).axis != 1 or \
            len(cat.inputs) != 2:
        return None
    h_e, g_e = cat.inputs
    h, g = _producer(graph, h_e, "cvm_right_shift", readers, 2), _producer(graph, g_e, "broadcast_sub", readers)
    if h is None or g is None or list(g.inputs) != [h.inputs[0], h_e]:
        return None
    ha = REGISTRY["cvm_right_shift"].bind(h.attrs)
    v_e = h.inputs[0]
    v = _producer(graph, v_e, "broadcast_sub", readers, 2)
    zero = v and _scalar(graph, v.inputs[1])
    u_e, chain = (v.inputs[0], [v_e.node]) if zero is not None and v is not None else (v_e, [])
    zero = zero or 0
    c = graph.type_of(u_e).shape[1] if len(graph.type_of(u_e).shape) == (4 if node.op == "conv2d" else 2) else 0
    if ha.shift_bit != 1 or ha.precision < 8 or graph.type_of(u_e).shape != graph.type_of(v_e).shape or \
            u_e not in nonneg or bounds[u_e] > 255 or not 0 <= zero <= 255 or \
            max(zero, bounds[u_e] - zero) > 254 or w.shape[1] != 2 * c or not np.array_equal(w[:, :c], w[:, c:]):
        return None
    return Unsigned(tuple(chain + [h_e.node, g_e.node, clip.inputs[0].node, node.inputs[0].node]), u_e, zero,
                    w[:, :c])


def unsigned_head(graph: Graph, node: int, bounds: dict[Entry, int], nonneg: set[Entry],
                  readers: dict[Entry, int]) -> Unsigned | None:
    """conv2d ``node``'s ``Unsigned`` data where its integer products take that form (``nn.int8_refusal`` with
    u's bound, up to 255, on the CPU's rows), dense ``node``'s where they are exact (``nn.dense_unsigned``), else
    None."""
    op = graph.nodes[node].op
    src = unsigned_source(graph, node, bounds, nonneg, readers) if op == "dense" or op == "conv2d" and nn.ROWS \
        else None
    if src is None or op == "dense":
        return src if src is None or nn.dense_unsigned_exact(src.weight) else None
    a = REGISTRY["conv2d"].bind(graph.nodes[node].attrs)
    u = Value("", graph.type_of(src.data).shape, bounds[src.data])
    w = Value("", src.weight.shape, 0, src.weight)
    return src if nn.int8_refusal(a, u, w, graph.nodes[node].outputs[0].shape, most_x=255) is None else None


def offset_param(graph: Graph, node: Node) -> np.ndarray | None:
    """The param (OC, OH, OW) that a broadcast_add adds to a conv2d's output (OC, OH, OW per element, the batch
    broadcast; a leading 1 allowed), else None."""
    if node.op != "broadcast_add":
        return None
    src = graph.nodes[node.inputs[1].node]
    p = graph.params.get(src.name) if src.is_variable else None
    shape = graph.type_of(node.inputs[0]).shape
    if p is None or len(shape) != 4 or p.shape not in (tuple(shape[1:]), (1, *shape[1:])) or \
            node.outputs[0].shape != shape:
        return None
    return p.reshape(shape[1:])


#: The integer products' routes by layout (``nn.conv2d_int8``; the operand types ``cvm_onnx.native.cpu`` gives them
#: on the CPU; the CUDA form's are int8 x int8).
INTEGER_ROUTES = {"rows0": "integer products (rows of x >= 0: uint8 x int8 on every x86 CPU)",
                  "rows": "integer products (rows: uint8 x int8 with VNNI)",
                  "columns": "integer products (columns: uint8 x int8 with VNNI)",
                  "unsigned": "integer products (rows of u - z, u in [0, 255]: uint8 x int8 with VNNI)",
                  "cuda": "integer products (int8 x int8)"}


def conv_routes(graph: Graph, bounds: dict[Entry, int], chains: list[Chain], target: Target,
                nonneg: set[Entry] = frozenset()) -> list[list[str]]:
    """Each conv2d's route in the serving form, [name, route, why not integer products (or "")]: integer
    products (``INTEGER_ROUTES``; ``nonneg``: the entries proven >= 0), "per-channel scale" (its run's
    requantize multiplies) or "float32/int32 products" (a float32 Conv where exact, else the core form)."""
    heads = {c.head: c for c in chains if c.head is not None}
    routes = []
    for i, node in enumerate(graph.nodes):
        if node.op != "conv2d":
            continue
        a, (x, w) = REGISTRY[node.op].bind(node.attrs), _operands(graph, node, bounds)
        if i in heads and heads[i].unsigned is not None:
            routes.append([node.name, INTEGER_ROUTES["unsigned"], ""])
            continue
        why = ("integer products are off (the target's products are float)" if target.products != "integer" else
               nn.int8_refusal(a, x, w, node.outputs[0].shape, target.provider) or
               ("its output is not read by one requantization run alone" if i not in heads else None))
        layout = ("cuda" if target.provider == "cuda" else "columns" if a.groups > 1 or not nn.ROWS else
                  "rows0" if node.inputs[0] in nonneg else "rows")
        route = ("float32/int32 products" if why else
                 "per-channel scale" if nn.channelwise(a, x, node.outputs[0].shape[1]) else INTEGER_ROUTES[layout])
        routes.append([node.name, route, why or ""])
    return routes


def _head(graph: Graph, first: int, bounds: dict[Entry, int], readers: dict[Entry, int],
          target: Target, conv_form: str = "fast",
          nonneg: set[Entry] = frozenset()) -> tuple[int, Unsigned | None, int | None, int | None] | None:
    """(the conv2d/dense node whose product the run's ``first`` node reads, its ``Unsigned`` data, the ``offset``
    node, the ``take`` node), when its product can feed the run: with the target's integer products, a conv2d taking the integer route
    (``int8_head``, or on the CPU ``unsigned_head``); on the CPU also through a broadcast_add of a param (OC, OH,
    OW) (``offset_param``) and a take of some of its channels (``taken_channels``; the head then read by other
    takes too, which ``runs`` checks), both where its products are rows; else its single float32 product, whose
    sums are exact integers when its bound B (bias included) is <= 2^24; taking a first shift s too, every partial
    sum of (y + 1/2) * 2^-s is a multiple of 2^-(s+1) of magnitude at most (2B + 1) 2^-(s+1), exact when
    2B + 1 <= 2^24. Each node between the head and ``first`` is read only by the next (the take's input by the
    takes)."""
    cpu = target.cpu_integer
    x, steps = steps_of(graph, graph.nodes[first], cpu)
    producer = graph.nodes[x.node]
    limit = 2 * bounds[x] + 1 if steps[0].kind == "shift" else bounds[x]
    if x.index or readers.get(x) != 1:
        return None

    def rows_head(conv: int, offset: int | None, take: int | None):  # a conv2d whose integer products are rows
        node = graph.nodes[conv]
        if node.op != "conv2d":
            return None
        unsigned = unsigned_head(graph, conv, bounds, nonneg, readers)
        if unsigned is not None or _rows(graph, node, bounds) and int8_head(graph, node, bounds, target.provider):
            return conv, unsigned, offset, take
        return None

    take = None
    if cpu and taken_channels(graph, producer) is not None:
        take, x = x.node, producer.inputs[0]
        producer = graph.nodes[x.node]
        if x.index:
            return None
    if cpu and offset_param(graph, producer) is not None:
        e = producer.inputs[0]
        if e.index or readers.get(e) != 1 or take is None and readers.get(x) != 1:
            return None
        return rows_head(e.node, x.node, take)
    if take is not None:
        return rows_head(x.node, None, take)
    if producer.op not in ("conv2d", "dense"):
        return None
    if cpu and (unsigned := unsigned_head(graph, x.node, bounds, nonneg, readers)):
        return x.node, unsigned, None, None
    if target.products == "integer" and int8_head(graph, producer, bounds, target.provider):
        return x.node, None, None, None
    return (x.node, None, None, None) if conv_form == "fast" and limit <= FLOAT_EXACT else None


def grouped(graph: Graph, chains: list[Chain], readers: dict[Entry, int], bounds: dict[Entry, int],
            taken: set[int]) -> list[Chain | Grouped]:
    """``chains`` with the runs of every head's channel groups merged into one ``Grouped`` where their outputs
    are concatenated along axis 1 (each read only there, in any order) and taken back so that every channel of the
    head lands at its own place: channel c of the result is concatenated position back[c] (clipped, as take
    does), which must be position i of a group whose take picked channel c. Elsewhere they stay runs of their own.
    A run (``chains``) reading the take back alone joins as the ``tail``, or a single step node there outside
    every run and ``taken`` (the nodes of an ``Unsigned``) whose steps ``Run`` takes from the take's bound."""
    parts: dict[int, list[Chain]] = {}
    for c in chains:
        if c.take is not None:
            parts.setdefault(c.head, []).append(c)
    last = {Entry(c.all[-1]): c for c in chains if c.take is not None}
    merged: dict[int, Grouped] = {}
    for head, group in parts.items():
        ends = [Entry(c.nodes[-1]) for c in group]
        cat = _only_reader(graph, ends[0], readers)
        if cat is None or cat[1].op != "concatenate" or REGISTRY["concatenate"].bind(cat[1].attrs).axis % 4 != 1 or \
                sorted(cat[1].inputs) != sorted(ends) or len(set(ends)) != len(ends) or \
                any(readers.get(e) != 1 for e in ends):
            continue
        back = _only_reader(graph, Entry(cat[0]), readers)
        order = [last[e] for e in cat[1].inputs]
        out = graph.nodes[head].outputs[0].shape
        picks = None if back is None else taken_channels(graph, back[1])
        if picks is None or graph.nodes[back[0]].outputs[0].shape != out or len(picks) != out[1] or \
                readers.get(Entry(cat[0])) != 1:
            continue
        position = [(g, i) for g, c in enumerate(order) for i in range(len(c.channels))]
        picks = np.clip(picks, 0, len(position) - 1)
        source = tuple(position[j] for j in picks)
        if all(int(order[g].channels[i]) == ch for ch, (g, i) in enumerate(source)):
            merged[head] = Grouped(tuple(order), cat[0], back[0], source)
    inside = {i for c in chains for i in c.all}
    starts = {c.nodes[0]: c for c in chains if c.head is None}
    absorbed: set[int] = set()
    for head, g in merged.items():
        e = Entry(g.back)
        nxt = _only_reader(graph, e, readers)
        if nxt is None:
            continue
        i, node = nxt
        if i in starts:
            merged[head] = replace(g, tail=tuple(starts[i].nodes))
            absorbed.add(i)
            continue
        step = steps_of(graph, node, True)
        run = Run(Body([]), Value("x", (), bounds[e]))
        if i not in inside and i not in taken and step is not None and step[0] == e and all(map(run.apply, step[1])):
            merged[head] = replace(g, tail=(i,))
    return [c for c in chains if (c.take is None or c.head not in merged) and
            (c.head is not None or c.nodes[0] not in absorbed)] + list(merged.values())


def _only_reader(graph: Graph, e: Entry, readers: dict[Entry, int]) -> tuple[int, Node] | None:
    """(index, node) of the one node reading ``e`` when ``e`` is read exactly once, else None."""
    if readers.get(e) != 1:
        return None
    return next(((i, n) for i, n in enumerate(graph.nodes) if e in n.inputs), None)


def _rows(graph: Graph, conv: Node, bounds: dict[Entry, int]) -> bool:
    """Whether a conv2d's integer products on the CPU are rows (one group, not a per-channel scale)."""
    a = REGISTRY["conv2d"].bind(conv.attrs)
    return a.groups == 1 and nn.ROWS and not nn.channelwise(a, _operands(graph, conv, bounds)[0],
                                                            conv.outputs[0].shape[1])


def taken_channels(graph: Graph, node: Node) -> np.ndarray | None:
    """The channels a take picks along axis 1 of a 4-D tensor by a 1-D param (clipped into range, as take does),
    else None."""
    if node.op != "take":
        return None
    shape = graph.type_of(node.inputs[0]).shape
    axis = REGISTRY["take"].bind(node.attrs).axis
    src = graph.nodes[node.inputs[1].node]
    idx = graph.params.get(src.name) if src.is_variable else None
    if len(shape) != 4 or axis is None or axis % 4 != 1 or idx is None or idx.ndim != 1 or not idx.size:
        return None
    return np.clip(idx.astype(np.int64), 0, shape[1] - 1)


def runs(graph: Graph, bounds: dict[Entry, int], target: Target, conv_form: str = "fast",
         nonneg: set[Entry] = frozenset()) -> list[Chain]:
    """Chains of at least two step nodes, each node the only reader of the previous one's output (not a head;
    chains of other branches may lie between them in node order), cut where a step has no exact int32 form
    (``Run.apply``); each with the conv2d/dense that starts it, if
    any (``_head``; the ``target``'s products "integer": integer products allowed; ``conv_form`` "core": no float32
    product heads; ``nonneg``: the entries proven >= 0). On "cuda", with integer products, every other conv2d that can take integer products is a
    chain of its own with no steps (its products + bias, one ``requantize``)."""
    readers = _readers(graph)
    found: list[list[int]] = []
    growing: dict[Entry, tuple[list[int], Run]] = {}  # the chains that may go on, by their last node's output
    for i, node in enumerate(graph.nodes):
        step = None if node.is_variable else steps_of(graph, node, target.cpu_integer)
        if step is None:
            continue
        x, steps = step
        chain = growing.pop(x, None) if readers.get(x) == 1 else None
        if chain is not None and all(map(chain[1].apply, steps)):
            chain[0].append(i)
            growing[Entry(i)] = chain
            continue
        if chain is not None and len(chain[0]) > 1:
            found.append(chain[0])
        run = Run(Body([]), Value("x", (), bounds[x]))
        if all(map(run.apply, steps)):
            growing[Entry(i)] = ([i], run)
    found = sorted(found + [c for c, _ in growing.values() if len(c) > 1])
    heads = [_head(graph, c[0], bounds, readers, target, conv_form, nonneg) for c in found]
    sharing: dict[int, int] = {}  # a head read through takes: how many runs take its channels
    for h in heads:
        if h is not None and h[3] is not None:
            sharing[h[0]] = sharing.get(h[0], 0) + 1
    for k, h in enumerate(heads):  # shared only where every reader of the head (or its offset) is such a run
        if h is not None and h[3] is not None and \
                sharing[h[0]] != readers[graph.nodes[h[3]].inputs[0]]:
            heads[k] = None
    taken = {i for h in heads if h is not None and h[1] is not None for i in h[1].nodes}
    chains = []
    for c, head in zip(found, heads):  # u - zero may end an earlier run: that run ends at u instead
        c = c[:-1] if c[-1] in taken else c
        if head is not None:
            take = head[3]
            chans = None if take is None else taken_channels(graph, graph.nodes[take])
            chains.append(Chain(c, head[0], head[1], head[2], take, chans))
        elif len(c) > 1:
            chains.append(Chain(c))
    if target.cpu_integer:
        chains = grouped(graph, chains, readers, bounds, taken)
    if target.provider == "cuda" and target.products == "integer":  # no Conv on the GPU: every conv2d that can is
        # its integer products + requantize
        heads = {c.head for c in chains}
        chains += [Chain([], i) for i, node in enumerate(graph.nodes)
                   if i not in heads and not node.is_variable and int8_head(graph, node, bounds, "cuda")]
    return chains


def _native_run(b: Body, x: str, bias: Value | None, steps: list[Step], **attrs) -> str:
    """The run as native ``requantize`` nodes: the steps in the order the CVM ops take them, each clip at
    once (two clips in a row as one: clamps compose, clip(clip(v, a, b), lo, hi) = clip(v, clip(a, lo, hi),
    clip(b, lo, hi))), on x + bias per channel (or per position and channel, ``_bias``) in int32 (``attrs``: its
    ``width`` or ``scales``, see ``nn.conv2d_int8``). With a per-channel multiplication ("cmul") each channel
    gets its own steps (``channel_steps``, the multiplier its own), or, where ``attrs`` has no such form (a width,
    batch_inner, scales), the cmul starts the next node, whose ``scales`` multiply each channel before its steps.
    Exact: ``runs`` took every step only where the proven bound shows that the runtime's own int32 computation
    (clipped as it goes) cannot overflow, so the kernel's int32 arithmetic never wraps where the runtime's does
    not; the shift is the runtime's (v + 2^(s-1)) >> s. No steps (a CUDA-form conv2d alone) is written as the
    clip to int32's own range, which changes nothing."""
    cmul = [s for s in steps if s.kind == "cmul"]
    if cmul and not {"width", "batch_inner", "scales"} & attrs.keys():  # each channel its own steps, one pass
        per = [[Step("mul", s.ks[c]) if s.kind == "cmul" else s for s in steps] for c in range(len(cmul[0].ks))]
        return _channel_run(b, x, bias, per, **attrs)
    for k, s in enumerate(steps):
        if s.kind == "cmul":
            x = _native_run(b, x, bias, steps[:k], **attrs)
            return _native_run(b, x, None, steps[k + 1:], scales=list(s.ks))
    return b.node("requantize", x, _bias_name(b, bias), domain=NATIVE_DOMAIN, steps=_flat(steps), **attrs)


def _bias_name(b: Body, bias: Value | None) -> str:
    """``requantize``'s bias input: the bias as int32, or an empty one."""
    return b.Cast(bias, to=TensorProto.INT32) if bias is not None else b.const(np.zeros(0, np.int32), np.int32)


def _channel_run(b: Body, x: str, bias: Value | None, per: list[list[Step]], **attrs) -> str:
    """One ``requantize`` with each channel's own steps (``per``, no "cmul"), flattened (``_flat``) and aligned to
    one sequence of kinds (``_aligned``)."""
    flat = _aligned([_flat(steps) for steps in per])
    return b.node("requantize", x, _bias_name(b, bias), domain=NATIVE_DOMAIN,
                  channel_counts=[len(f) // 3 for f in flat], channel_steps=[v for f in flat for v in f], **attrs)


#: A step of each kind that leaves every value as it is: shift 0, multiply by 1, add 0, clip to int32's range.
IDENTITY = {0: [0, 0, 0], 1: [1, 1, 0], 2: [2, 0, 0], 3: [3, -INT32_MAX - 1, INT32_MAX]}


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
    """The steps (no "cmul") as requantize's (kind, a, b) triples, two clips in a row as one; no steps as the clip
    to int32's own range."""
    low, high = -INT32_MAX - 1, INT32_MAX
    flat: list[int] = []
    for s in steps:
        if s.kind != "clip":
            flat += [{"shift": 0, "mul": 1, "add": 2}[s.kind], s.k, 0]
            continue
        lo, hi = low if s.lo is None else s.lo, high if s.hi is None else s.hi
        if flat[-3:-2] == [3]:  # clip(clip(v, a, b), lo, hi) = clip(v, clip(a, lo, hi), clip(b, lo, hi)): one pass
            flat[-2:] = [min(max(flat[-2], lo), hi), min(max(flat[-1], lo), hi)]
        else:
            flat += [3, lo, hi]
    return flat or [3, low, high]


def lower_run(graph: Graph, chain: Chain, inputs: list[Value], out: Value,
              head_bound: int, target: Target) -> tuple[Body, str]:
    """The body of ``chain`` reading ``inputs`` (the run's input, or the head's data, weight[, bias] and then
    ``head_bound`` bounds the head's output); returns it and its output's name.

    With a head, the run starts from its float32 Conv/Gemm (clips before the first int32 step are taken in
    float32), which also takes a first shift: Round((y + 1/2) * 2^-s) is floor((y + 2^(s-1)) / 2^s) (never a
    tie, as in cvm_right_shift's lowering), with y + 1/2 and the scaling folded into its bias and weights
    (constants). With the ``target``'s integer products (the native library's kernels) the steps are one native ``requantize`` node
    (``_native_run``), from the run's input, from a conv2d head's exact integer products where it takes that
    route (``nn.int8_route``, ``nn.conv2d_int8``), or from the head's float32 product (bias included, an
    integer within 2^24) cast to int32.
    """
    b = Body([out])
    y = _run_body(b, graph, chain, widen(b, inputs), out, head_bound, target)
    unwiden(b, [y])
    return b, y


def _bias(b: Body, graph: Graph, chain: Chain, bias: Value | None) -> Value | None:
    """What ``requantize`` adds to a head's rows products (N, OH * OW, OC): its bias (``bias``, the chain's
    ``channels`` of it where it takes some), or with an ``offset`` param (OC, OH, OW) the constant (OH * OW, OC)
    bias[c] + param[c, p] wrapped to int32 (one per position and channel): the runtime adds the bias, then the
    param, in int32, and int32 additions wrap modulo 2^32 in any order, so the sum is the same int32."""
    ch = chain.channels
    if chain.offset is None:
        if bias is None or ch is None:
            return bias
        return Value(b.Gather(bias.name, b.const(ch), axis=0), (len(ch),), bias.bound)
    p = offset_param(graph, graph.nodes[chain.offset]).astype(np.int64)
    if bias is not None:
        src = graph.nodes[graph.nodes[chain.head].inputs[2].node]
        p = p + graph.params[src.name].astype(np.int64).reshape(-1, 1, 1)
    p = (p if ch is None else p[ch]).reshape(len(p) if ch is None else len(ch), -1)
    wrapped = ((p + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)
    return Value(b.const(np.ascontiguousarray(wrapped.T), np.int32), wrapped.T.shape, 0)


def _grouped_body(b: Body, graph: Graph, chain: Grouped, inputs: list[Value]) -> str:
    """A ``Grouped`` run: the head's integer products (rows), its offset, then one ``requantize`` with each
    channel's own steps (``_channel_run``)."""
    first = chain.parts[0]
    a = REGISTRY["conv2d"].bind(graph.nodes[first.head].attrs)
    if first.unsigned is not None:
        products, attrs = nn.conv2d_unsigned(b, a, inputs[0], first.unsigned.weight, first.unsigned.zero)
    else:
        products, attrs = nn.conv2d_rows(b, a, *inputs[:2])
    bias = _bias(b, graph, replace(first, channels=None), inputs[2] if a.use_bias else None)
    return _channel_run(b, products, bias, chain.channel_steps(graph), **attrs)


def _run_body(b: Body, graph: Graph, chain: Chain, inputs: list[Value], out: Value, head_bound: int,
              target: Target) -> str:
    """``lower_run``'s body in ``b`` (int8 params already widened); returns its output's name."""
    if isinstance(chain, Grouped):
        return _grouped_body(b, graph, chain, inputs)
    int8, provider = target.products == "integer", target.provider
    steps = [step for i in chain.nodes for step in steps_of(graph, graph.nodes[i], target.cpu_integer)[1]]
    if chain.head is None:
        if int8:
            return _native_run(b, inputs[0].name, None, steps)
        r = Run(b, inputs[0])
    elif chain.channels is not None:  # only integer-products heads are shared (``_head``)
        a = REGISTRY["conv2d"].bind(graph.nodes[chain.head].attrs)
        idx = b.const(chain.channels)
        if chain.unsigned is not None:
            products, attrs = nn.conv2d_unsigned(b, a, inputs[0], chain.unsigned.weight[chain.channels],
                                                 chain.unsigned.zero)
        else:
            w = inputs[1]
            w = Value(b.Gather(w.name, idx, axis=0), (len(chain.channels), *w.shape[1:]), w.bound,
                      w.const[chain.channels])
            products, attrs = nn.conv2d_rows(b, a, inputs[0], w)
        return _native_run(b, products, _bias(b, graph, chain, inputs[2] if a.use_bias else None), steps, **attrs)
    elif int8 and chain.unsigned is not None:
        head = graph.nodes[chain.head]
        a = REGISTRY[head.op].bind(head.attrs)
        if head.op == "dense":
            products, attrs = nn.dense_unsigned(b, inputs[0], chain.unsigned.weight, chain.unsigned.zero), {}
        else:
            products, attrs = nn.conv2d_unsigned(b, a, inputs[0], chain.unsigned.weight, chain.unsigned.zero)
        return _native_run(b, products, _bias(b, graph, chain, inputs[2] if a.use_bias else None), steps, **attrs)
    elif int8 and graph.nodes[chain.head].op == "conv2d" and nn.int8_route(
            a := REGISTRY["conv2d"].bind(graph.nodes[chain.head].attrs), *inputs[:2], out.shape, provider):
        products, attrs = nn.conv2d_int8(b, a, *inputs[:2], provider)
        return _native_run(b, products, _bias(b, graph, chain, inputs[2] if a.use_bias else None), steps, **attrs)
    else:
        head = graph.nodes[chain.head]
        a = REGISTRY[head.op].bind(head.attrs)
        product = nn.conv2d_float32 if head.op == "conv2d" else nn.dense_float32
        bias = inputs[2] if a.use_bias else None
        if int8:  # the float32 product holds an integer within 2^24 (``_head``): exact as int32
            return _native_run(b, b.Cast(product(b, a, *inputs[:2], bias), to=TensorProto.INT32), None, steps)
        if steps[0].kind == "shift":
            s = steps.pop(0).k
            y = b.Round(product(b, a, *inputs[:2], bias, scale=2.0 ** -s, offset=0.5))
            head_bound = round_shift(head_bound, s)
        else:
            y = product(b, a, *inputs[:2], bias)
        r = Run(b, Value(y, (), head_bound), in_float=True)
    for step in steps:
        if not r.apply(step):
            raise AssertionError(f"run through {graph.nodes[chain.nodes[-1]].name} has no exact int32 form")
    return r.finish()
