"""Finding the requantization runs of a CVM graph for a target: the chains of steps (``runs``), the conv2d/dense
each starts from (its head: float32 product, integer products, ``Unsigned`` data, an offset, taken channels),
the runs of one convolution's channel groups (``Grouped``), and each conv2d's route (``conv_routes``)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from cvm_onnx.core.constants import FLOAT32_EXACT as FLOAT_EXACT
from cvm_onnx.core.graph import Entry, Graph, Node
from cvm_onnx.core.ops import REGISTRY
from cvm_onnx.serving.target import Target

from .. import nn
from ..lowering import Body, Value
from .run import Run
from .steps import Step, channel_step, fork_readers, forked, scalar_param, steps_of


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
    them, the head (and its unsigned and offset nodes) then shared by the runs of every take reading it; ``inner``:
    the other nodes of the products in parts and shifts rounding half to even that end at some of ``nodes``
    (``steps.forked``)."""

    nodes: list[int]
    head: int | None = None
    unsigned: Unsigned | None = None
    offset: int | None = None
    take: int | None = None
    channels: np.ndarray | None = None
    inner: tuple[int, ...] = ()

    @property
    def all(self) -> list[int]:
        before = [] if self.unsigned is None else list(self.unsigned.nodes)
        return before + [i for i in (self.head, self.offset, self.take) if i is not None] + list(self.inner) + \
            self.nodes


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
        return shared + [i for c in self.parts for i in [c.take, *c.inner, *c.nodes]] + \
            [self.concat, self.back, *self.tail]

    def channel_steps(self, graph: Graph) -> list[list[Step]]:
        """Channel c's steps: those of the group (and position in it) that the take back picks for c, then the
        tail's, a per-channel multiplier ("cmul", "cmul64") taken as its own ("mul", "mul64")."""
        def own(steps: list[Step], k: int) -> list[Step]:
            return [channel_step(s, k) for s in steps]

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


def integer_head(graph: Graph, node: Node, bounds: dict[Entry, int], provider: str = "cpu") -> bool:
    """Whether ``node`` is a conv2d that starts a run from its integer products (``nn.integer_route``)."""
    if node.op != "conv2d":
        return False
    return nn.integer_route(REGISTRY[node.op].bind(node.attrs), *_operands(graph, node, bounds), node.outputs[0].shape,
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
    zero = v and scalar_param(graph, v.inputs[1])
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
    """conv2d ``node``'s ``Unsigned`` data where its integer products take that form (``nn.integer_refusal`` with
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
    return src if nn.integer_refusal(a, u, w, graph.nodes[node].outputs[0].shape, most_x=255) is None else None


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


#: The integer products' routes by layout (``nn.conv2d_integer``; the operand types ``cvm_onnx.native.cpu`` gives them
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
               nn.integer_refusal(a, x, w, node.outputs[0].shape, target.provider) or
               ("its output is not read by one requantization run alone" if i not in heads else None))
        layout = ("cuda" if target.provider == "cuda" else "columns" if a.groups > 1 or not nn.ROWS else
                  "rows0" if node.inputs[0] in nonneg else "rows")
        route = ("float32/int32 products" if why else
                 "per-channel scale" if nn.channelwise(a, x, node.outputs[0].shape[1]) else INTEGER_ROUTES[layout])
        routes.append([node.name, route, why or ""])
    return routes


def _head(graph: Graph, first: int, bounds: dict[Entry, int], readers: dict[Entry, int], target: Target,
          nonneg: set[Entry] = frozenset()) -> tuple[int, Unsigned | None, int | None, int | None] | None:
    """(the conv2d/dense node whose product the run's ``first`` node reads, its ``Unsigned`` data, the ``offset``
    node, the ``take`` node), when its product can feed the run: with the target's integer products, a conv2d taking
    the integer route (``integer_head``, or on the CPU ``unsigned_head``); on the CPU also through a broadcast_add
    of a param (OC, OH, OW) (``offset_param``) and a take of some of its channels (``taken_channels``; the head then
    read by other takes too, which ``runs`` checks), both where its products are rows; else its single float32
    product, whose sums are exact integers when its bound B (bias included) is <= 2^24; taking a first shift s too,
    every partial sum of (y + 1/2) * 2^-s is a multiple of 2^-(s+1) of magnitude at most (2B + 1) 2^-(s+1), exact
    when 2B + 1 <= 2^24. Each node between the head and ``first`` is read only by the next (the take's input by the
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
        if unsigned is not None or _rows(graph, node, bounds) and integer_head(graph, node, bounds, target.provider):
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
    if target.products == "integer" and integer_head(graph, producer, bounds, target.provider):
        return x.node, None, None, None
    return (x.node, None, None, None) if limit <= FLOAT_EXACT else None


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
        if i in starts and not starts[i].inner:
            merged[head] = replace(g, tail=tuple(starts[i].nodes))
            absorbed.add(i)
            continue
        step = steps_of(graph, node, True)
        run = Run(Body([]), Value("x", (), bounds[e]))
        if i not in inside and i not in taken and step is not None and step[0] == e and \
                forked(graph, node) is None and all(map(run.apply, step[1])):
            merged[head] = replace(g, tail=(i,))
    return [c for c in chains if (c.take is None or c.head not in merged) and
            (c.head is not None or c.nodes[0] not in absorbed)] + list(merged.values())


def _inner(nodes: list[int], parts: dict[int, tuple[Entry, tuple[int, ...]]]) -> tuple[int, ...]:
    """The inner nodes of the products in parts and shifts rounding half to even (``two_parts``) ending at some
    of ``nodes``."""
    return tuple(j for i in nodes if i in parts for j in parts[i][1])


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


def two_parts(graph: Graph, readers: dict[Entry, int]) -> dict[int, tuple[Entry, tuple[int, ...]]]:
    """The products in parts and the shifts rounding half to even (``steps.forked``) whose v is read by their inner
    readers alone (``steps.fork_readers``: a product in n parts by its n multiplies) and each inner node by the next
    alone: their last node -> (v, the inner nodes)."""
    found = {}
    for i, node in enumerate(graph.nodes):
        part = None if node.is_variable else forked(graph, node)
        if part is not None and readers.get(part[0]) == fork_readers(part[2]) and \
                all(readers.get(Entry(j)) == 1 for j in part[1]):
            found[i] = part[:2]
    return found


def runs(graph: Graph, bounds: dict[Entry, int], target: Target, nonneg: set[Entry] = frozenset()) -> list[Chain]:
    """Chains of at least two step nodes, each node the only reader of the previous one's output (not a head; chains
    of other branches may lie between them in node order), cut where a step has no exact int32 form (``Run.apply``);
    each with the conv2d/dense that starts it, if any (``_head``; the ``target``'s products "integer": integer
    products allowed; ``nonneg``: the entries proven >= 0). On the CPU with integer products a product in parts
    or a shift rounding half to even (``two_parts``) is one step, its inner nodes the chain's. On
    "cuda", with integer products, every other conv2d that can take integer products is a chain of its own with no
    steps (its products + bias, one ``requantize``)."""
    readers = _readers(graph)
    parts = two_parts(graph, readers) if target.cpu_integer else {}
    for v, _ in parts.values():  # the two multiplies of v read it as one step
        readers[v] = 1
    inner = {j for _, nodes in parts.values() for j in nodes}
    found: list[list[int]] = []
    growing: dict[Entry, tuple[list[int], Run]] = {}  # the chains that may go on, by their last node's output
    for i, node in enumerate(graph.nodes):
        step = None if node.is_variable or i in inner else steps_of(graph, node, target.cpu_integer)
        if step is None or forked(graph, node) is not None and i not in parts:
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
    heads = [_head(graph, c[0], bounds, readers, target, nonneg) for c in found]
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
            chains.append(Chain(c, head[0], head[1], head[2], take, chans, _inner(c, parts)))
        elif len(c) > 1:
            chains.append(Chain(c, inner=_inner(c, parts)))
    if target.cpu_integer:
        chains = grouped(graph, chains, readers, bounds, taken)
    if target.provider == "cuda" and target.products == "integer":  # no Conv on the GPU: every conv2d that can is
        # its integer products + requantize
        heads = {c.head for c in chains}
        chains += [Chain([], i) for i, node in enumerate(graph.nodes)
                   if i not in heads and not node.is_variable and integer_head(graph, node, bounds, "cuda")]
    return chains
