"""Requantization runs of the serving form (converters/to_onnx/requantize/): a chain of shifts, clips, relu
and scalar multiplications fused into one int32 body, exact against the reference executor on every input."""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from support import bound, tensors

from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import ValidationError
from cvm_onnx.core.executor import execute
from cvm_onnx.native import MUL64, library_path
from cvm_onnx.runtime.sessions import run
from cvm_onnx.serving.target import Target

SHAPE = (1, 2, 3, 4)
EXAMPLES = int(os.environ.get("CVM_ONNX_EXAMPLES", "150"))  # fewer under qemu (.ci/run)


def fused(model: onnx.ModelProto) -> list[list[str]]:
    """The CVM nodes of each fused run, from the nodes' ``cvm.fused`` marks."""
    runs = {p.value for n in model.graph.node for p in n.metadata_props if p.key == "cvm.fused"}
    return sorted(json.loads(r) for r in runs)


def check(graph, feeds, int8: bool | None = None) -> onnx.ModelProto:
    """Exact against the reference in the serving form with ONNX-op runs and, with the native library, with its
    kernels (integer products, native requantize); returns the form ``int8`` asks for (None: the ONNX-op one,
    whose structure the tests inspect)."""
    forms = {False: to_onnx(graph, Target(products="float"))}
    if library_path() is not None:
        forms[True] = to_onnx(graph, Target())
    want = execute(graph, feeds)
    for model in forms.values():
        onnx.checker.check_model(model, full_check=True)
        for got, w in zip(run(model, feeds), want):
            assert got.dtype == w.dtype and np.array_equal(got, w)
    return forms[bool(int8)] if int8 is not None else forms[False]


def scalars():
    """Multipliers and addends: zero, +-1, powers of two and their neighbours, the int32 edges."""
    edges = [0, 1, -1, 2, -2, 127, -127, (1 << 30) + 1, -(1 << 31), (1 << 31) - 1]
    return st.one_of(st.sampled_from(edges), st.integers(-(1 << 16), 1 << 16),
                     st.integers(0, 30).map(lambda k: 1 << k), st.integers(-(1 << 31), (1 << 31) - 1))


@st.composite
def steps(draw):
    """A graph: data of random precision, then 2..7 step ops (some heads on the way), and its input."""
    b = GraphBuilder()
    p_in = draw(st.integers(1, 32))
    x = b.input("data", SHAPE, p_in)
    heads, p = [], p_in
    for k in range(draw(st.integers(2, 7))):
        kind = draw(st.sampled_from(["rshift", "rshift", "clip", "cvm_clip", "relu", "lshift", "mul", "add", "sub"]))
        if kind == "rshift":
            p = draw(st.integers(1, 32))
            x = b.op("cvm_right_shift", x, shift_bit=draw(st.integers(1, 32)), precision=p)
        elif kind == "cvm_clip":
            p = draw(st.integers(1, 32))
            x = b.op("cvm_clip", x, precision=p)
        elif kind == "clip":
            edge = (1 << 31) - 2  # the widest bounds whose precision (the runtime's bits(n + 1) + 1) is 32
            lo, hi = sorted(draw(st.lists(st.integers(-edge, edge), min_size=2, max_size=2, unique=True)))
            x, p = b.op("clip", x, a_min=lo, a_max=hi), (max(abs(lo), abs(hi)) + 1).bit_length() + 1
        elif kind == "relu":
            x = b.op("relu", x)
        elif kind == "lshift" and p < 32:
            s = draw(st.integers(1, 32 - p))
            p = draw(st.integers(1, 32))
            x = b.op("cvm_left_shift", x, shift_bit=s, precision=p)
        elif kind in ("mul", "add", "sub") and p < 32:
            c = draw(scalars())  # kept within the precision rules: p + p_c <= 32 (mul), max(p, p_c) + 1 <= 32
            room = 32 - p if kind == "mul" else 31
            c = c >> max(0, c.bit_length() + 1 - room) if c >= 0 else -(-c >> max(0, (-c).bit_length() + 1 - room))
            pc = abs(c).bit_length() + 1
            p = p + pc if kind == "mul" else max(p, pc) + 1
            op = {"mul": "broadcast_mul", "add": "broadcast_add", "sub": "broadcast_sub"}[kind]
            param = b.param(f"c{k}", np.full(draw(st.sampled_from([(1,), (1, 1, 1)])), c, np.int32))
            x = b.op(op, *((param, x) if op != "broadcast_sub" and draw(st.booleans()) else (x, param)))
        if draw(st.integers(0, 5)) == 0:
            heads.append(x)
    try:
        graph = b.build(x, *heads)
    except ValidationError:
        assume(False)
    return graph, {"data": draw(tensors(SHAPE, min(p_in + 1, 32)))}


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=steps())
def test_random_runs_are_exact(case):
    graph, feeds = case
    check(graph, feeds)


@pytest.mark.isa
@settings(max_examples=max(EXAMPLES // 4, 10), deadline=None)
@given(data=tensors(SHAPE, 17), s1=st.integers(1, 4), p1=st.integers(8, 16), m=st.integers(1, (1 << 23) - 1),
       s2=st.integers(16, 26), relu=st.booleans())
def test_conv_style_run_is_fused_and_exact(data, s1, p1, m, s2, relu):
    """shift -> mul -> shift [-> relu], as after every ResNet convolution: one run, exact."""
    m = m >> max(0, m.bit_length() + p1 - 31)  # p1 + precision(m) <= 32
    b = GraphBuilder()
    x = b.op("cvm_right_shift", b.input("data", SHAPE, 17), shift_bit=s1, precision=p1)
    x = b.op("cvm_right_shift", b.op("broadcast_mul", x, b.param("m", np.array([m]))), shift_bit=s2, precision=8)
    graph = b.build(b.op("relu", x) if relu else x)
    names = [n.name for n in graph.nodes if not n.is_variable]
    model = check(graph, {"data": data})
    assert fused(model) == [names]
    assert "Round" not in {n.op_type for n in model.graph.node}


@pytest.mark.isa
@settings(max_examples=max(EXAMPLES // 3, 10), deadline=None)
@given(data=st.data(), op=st.sampled_from(["conv2d", "dense"]), use_bias=st.booleans(),
       first=st.sampled_from(["shift", "clip", "mul"]), s=st.integers(1, 12), m=st.integers(-(1 << 12), 1 << 12),
       s2=st.integers(1, 20))
def test_conv_and_dense_feed_their_run(data, op, use_bias, first, s, m, s2):
    """conv2d/dense -> shift (or clip, or nothing) -> mul -> shift -> relu: one body from the float32 product
    (integer products not asked for), which takes a first shift (Round of the scaled sum) and first clips in
    float32; exact on random weights at the precision edges."""
    b = GraphBuilder()
    if op == "conv2d":
        shape, wshape, attrs = (1, 3, 5, 5), (4, 3, 3, 3), dict(channels=4, kernel_size=(3, 3), padding=(1, 1))
    else:
        shape, wshape, attrs = (2, 20), (4, 20), dict(units=4)
    x = b.input("data", shape, 8)
    inputs = [x, b.param("w", data.draw(tensors(wshape, 8)), 8)]
    if use_bias:
        inputs.append(b.param("b", data.draw(tensors((4,), 20)), 20))
    y = b.op(op, *inputs, use_bias=use_bias, **attrs)
    if first == "shift":
        y = b.op("cvm_right_shift", y, shift_bit=s, precision=16)
    elif first == "clip":
        y = b.op("cvm_clip", y, precision=s + 4)
    else:
        m = m >> 4  # the product stays within 32 bits
    y = b.op("cvm_right_shift", b.op("broadcast_mul", y, b.param("m", np.array([m]))), shift_bit=s2, precision=8)
    graph = b.build(b.op("relu", y))
    model = check(graph, {"data": data.draw(tensors(shape, 8))}, int8=False)
    assert fused(model) == [[n.name for n in graph.nodes if not n.is_variable]]
    ops = [n.op_type for n in model.graph.node if n.op_type != "Constant"]
    product = ops.index("Conv" if op == "conv2d" else "Gemm")
    assert ops[product + 1] == "Round" if first == "shift" else ops[product + 1] in ("Clip", "Cast")


def test_a_product_too_wide_for_float32_keeps_its_own_lowering():
    """A conv whose sums may reach 2^23 cannot take the shift in float32 (2B + 1 > 2^24): the run starts after
    it; from integer products (exact at any size) it starts the run."""
    b = GraphBuilder()
    x = b.input("data", (1, 64, 4, 4), 8)
    w = b.param("w", np.full((1, 64, 3, 3), 127, np.int8), 8)
    y = b.op("conv2d", x, w, channels=1, kernel_size=(3, 3), padding=(1, 1), use_bias=False)
    graph = b.build(b.op("relu", b.op("cvm_right_shift", y, shift_bit=10, precision=8)))
    edge = np.full((1, 64, 4, 4), 127, np.int32)
    model = check(graph, {"data": edge}, int8=False)
    assert fused(model) == [[n.name for n in graph.nodes if n.op in ("cvm_right_shift", "relu")]]
    assert "Round" not in {n.op_type for n in model.graph.node}
    assert fused(check(graph, {"data": edge}, int8=True)) == [[n.name for n in graph.nodes if not n.is_variable]]


def test_pending_clip_is_applied_before_an_overflow():
    """The clip to 12 bits is deferred until x * (2^19 - 1) would overflow int32 on the unclipped value (|x| < 2^15):
    then it is applied in int32, and the run goes on as one."""
    b = GraphBuilder()
    x = b.input("data", SHAPE, 16)
    y = b.op("cvm_clip", b.op("cvm_right_shift", x, shift_bit=1, precision=16), precision=12)
    z = b.op("cvm_right_shift", b.op("broadcast_mul", y, b.param("m", np.array([(1 << 19) - 1]))), shift_bit=20,
             precision=8)
    graph = b.build(b.op("relu", z))
    edge = bound(16)
    data = np.array([edge, -edge, 0, 1, -1, 4094, 4095, -4095] * 3, np.int32).reshape(SHAPE)
    model = check(graph, {"data": data})
    assert fused(model) == [[n.name for n in graph.nodes if not n.is_variable]]
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    assert any(n.op_type == "Clip" and producer.get(n.input[0]) == "BitwiseAnd" for n in model.graph.node)


def test_a_step_without_int32_form_starts_a_new_run():
    """x + 2^(s-1) can overflow int32 for a 32-bit x: that shift keeps its own lowering, the rest is one run."""
    b = GraphBuilder()
    x = b.op("cvm_right_shift", b.input("data", SHAPE, 32), shift_bit=1, precision=32)
    graph = b.build(b.op("cvm_clip", b.op("relu", b.op("cvm_right_shift", x, shift_bit=3, precision=20)),
                         precision=9))
    data = np.array([bound(32), -bound(32), 0, 1, -1, 2, -2, 3] * 3, np.int32).reshape(SHAPE)
    model = check(graph, {"data": data})
    names = [n.name for n in graph.nodes if not n.is_variable]
    assert fused(model) == [names[1:]]


def test_a_left_shift_by_31_of_a_zero_value_is_exact():
    """Regression: precision 1 (every value 0) let cvm_left_shift 31 join a run as a multiplication by 2^31, a
    constant int32 cannot hold (OverflowError at export); the run now ends before it."""
    b = GraphBuilder()
    x = b.input("data", SHAPE, 1)
    y = b.op("cvm_right_shift", b.op("cvm_clip", x, precision=1), shift_bit=1, precision=1)
    graph = b.build(b.op("cvm_left_shift", y, shift_bit=31, precision=1))
    check(graph, {"data": np.zeros(SHAPE, np.int32)})


def test_a_head_inside_a_chain_keeps_its_value():
    """A tensor read elsewhere (here a graph output) ends a run: it must exist with its exact value."""
    b = GraphBuilder()
    x = b.op("cvm_right_shift", b.input("data", SHAPE, 16), shift_bit=3, precision=8)
    y = b.op("relu", b.op("cvm_clip", x, precision=6))
    z = b.op("cvm_right_shift", b.op("broadcast_mul", y, b.param("m", np.array([-3]))), shift_bit=1, precision=4)
    graph = b.build(b.op("cvm_clip", z, precision=3), y)
    data = np.arange(-12, 12, dtype=np.int32).reshape(SHAPE) * 1000
    model = check(graph, {"data": data})
    assert [len(r) for r in fused(model)] == [3, 3]


@pytest.mark.parametrize("int8", [False, True])
def test_resnet20_runs(resnet, int8):
    """Every shift sits in a run; every convolution starts one, from its float32 product (each read by a shift
    takes that shift in a Round, as a dense read by one does) or, with integer products, from its MatMulInteger."""
    graph = resnet
    model = to_onnx(graph, Target(products="integer" if int8 else "float"))
    fused_nodes = {name for r in fused(model) for name in r}
    shifts = [n.name for n in graph.nodes if n.op == "cvm_right_shift"]
    assert set(shifts) <= fused_nodes  # every requantization is in a run
    readers = {}
    for n in graph.nodes:
        for e in n.inputs:
            readers.setdefault(graph.nodes[e.node].name, []).append(n.op)
    shifted = [n.name for n in graph.nodes if n.op == "conv2d" and readers[n.name] == ["cvm_right_shift"]]
    assert shifted and set(shifted) <= fused_nodes  # each conv read by a shift takes it (11 on chain)
    convs = sum(n.op == "conv2d" for n in graph.nodes)
    if int8:  # a per-channel scale (1x1, one channel per group) is its run's scales, the others MatMulInteger
        scales = sum(n.op == "conv2d" and n.attrs["kernel_size"] == (1, 1) and n.attrs["groups"] ==
                     n.attrs["channels"] == graph.type_of(n.inputs[0]).shape[1] for n in graph.nodes)
        scaled = [n for n in model.graph.node if any(a.name == "scales" for a in n.attribute)]
        ops = [n.op_type for n in model.graph.node]
        assert scales and (ops.count("MatMulInteger"), len(scaled)) == (convs - scales, scales)
        assert not {"Round", "Conv"} & {n.op_type for n in model.graph.node}
    else:
        dense = [n.name for n in graph.nodes if n.op == "dense" and readers[n.name] == ["cvm_right_shift"]]
        assert sum(n.op_type == "Round" for n in model.graph.node) == len(shifted) + len(dense)
        producer = {o: n.op_type for n in model.graph.node for o in n.output}
        assert sorted(producer[n.input[0]] for n in model.graph.node if n.op_type == "Round") == (
            ["Conv"] * len(shifted) + ["Gemm"] * len(dense))
    read = {t for n in model.graph.node for t in n.input}
    assert all(t.name in read for t in model.graph.initializer)  # the fused scalars left no unused param


def test_a_run_over_an_int8_param():
    """A run may start at a param stored as int8: the body reads it widened to int32."""
    b = GraphBuilder()
    w = b.param("w", np.array([-127, -126, -5, 0, 3, 127] * 4, np.int8).reshape(SHAPE), 8)
    y = b.op("relu", b.op("cvm_clip", b.op("cvm_right_shift", w, shift_bit=1, precision=8), precision=5))
    graph = b.build(b.op("elemwise_add", b.input("data", SHAPE, 8), y))
    model = check(graph, {"data": np.arange(24, dtype=np.int32).reshape(SHAPE) - 12})
    assert [len(r) for r in fused(model)] == [3]


def test_runs_of_branches_interleaved_in_node_order_are_each_fused():
    """Two branches whose step nodes alternate in node order (a residual block's two requantizations) are two runs,
    not cut at every node of the other branch."""
    b = GraphBuilder()
    x = b.input("data", SHAPE, 16)
    p = b.op("cvm_right_shift", x, shift_bit=2, precision=16, name="p1")
    q = b.op("cvm_right_shift", x, shift_bit=3, precision=16, name="q1")
    p = b.op("clip", p, a_min=-1000, a_max=900, name="p2")
    q = b.op("clip", q, a_min=-800, a_max=700, name="q2")
    p = b.op("broadcast_mul", p, b.param("m", np.array([3])), name="p3")
    graph = b.build(b.op("elemwise_add", p, q))
    feeds = {"data": np.arange(-12, 12).reshape(SHAPE).astype(np.int32) * 2731}
    model = check(graph, feeds)
    assert fused(model) == [["p1", "p2", "p3"], ["q1", "q2"]]


@st.composite
def products_in_parts(draw):
    """A requantization as the quantized importer writes it with ``two_part`` (docs/import.md, "Two-part
    products", "Products in n parts"): v = cvm_right_shift(data) or clip(data) of label P, then n = 2..4 parts:
    from the lowest level up p_j = v * m_j (0 <= m_j < 2^(b_j); each multiplier one param or one per channel),
    plus t_(j-1) above the lowest, t_j = cvm_right_shift(that - 2^(b_j-1), b_j) into precision q_j, and
    cvm_right_shift(v * m_top + t_last, k) into 8 bits [+ z, clip], with random labels at and past the importer's
    (q_j < P lets a clip act, a wide m_top lets the product wrap, B = sum b_j past 31 leaves no mul64); its input
    at the precision's edges. Returns the graph, its feeds, the nodes from the first multiply on and whether the
    importer's labels hold (P + label(m_top) <= 31, P + b_0 + 1 <= 31, P + b_j + 1 <= 30 above, q_j >= P, B <= 31)."""
    b = GraphBuilder()
    p_in, p = draw(st.integers(8, 32)), draw(st.integers(2, 24))
    data = b.input("data", SHAPE, p_in)
    if draw(st.booleans()):
        x = b.op("cvm_right_shift", data, shift_bit=draw(st.integers(1, 8)), precision=p)
    else:  # the plan's clip and no pre-shift, the importer's usual chain (clip, mul64, shift, clip)
        x = b.op("clip", data, a_min=-(1 << (p - 1)) + 1, a_max=(1 << (p - 1)) - 1)
    n = draw(st.sampled_from([2, 2, 3, 4]))
    widths = [draw(st.integers(1, 31 if j == 0 else 20)) for j in range(n - 1)]
    channel = lambda: draw(st.booleans())  # noqa: E731
    shape = lambda per: (SHAPE[1], 1, 1) if per else (1,)  # noqa: E731

    def multiplier(name, top):
        per = channel()
        m = np.array([draw(st.integers(0, top)) for _ in range(np.prod(shape(per)))]).reshape(shape(per))
        return m, b.param(name, m)

    t, qs = None, []
    for j, w in enumerate(widths):
        _, mj = multiplier(f"m{j}", (1 << w) - 1)
        pj = b.op("broadcast_mul", x, mj)
        if t is not None:
            pj = b.op("broadcast_add", pj, t)
        low = b.op("broadcast_add", pj, b.param(f"half{j}", np.array([-(1 << (w - 1))])))
        qs.append(draw(st.integers(1, 32)))
        t = b.op("cvm_right_shift", low, shift_bit=w, precision=qs[-1])
    high = draw(st.integers(0, 31 - p).map(lambda bits: (1 << bits) - 1) | st.integers(0, (1 << (32 - p)) - 1))
    m_top, mt = multiplier("mt", high)
    s = b.op("broadcast_add", b.op("broadcast_mul", x, mt), t)
    y = b.op("cvm_right_shift", s, shift_bit=draw(st.integers(1, 31)), precision=8)
    if draw(st.booleans()):
        y = b.op("clip", b.op("broadcast_add", y, b.param("z", np.array([draw(st.integers(-128, 127))]))),
                 a_min=-128, a_max=127)
    try:
        graph = b.build(y)
    except ValidationError:
        assume(False)
    names = {n.name for n in graph.nodes[graph.nodes.index(next(n for n in graph.nodes if n.op == "broadcast_mul")):]
             if not n.is_variable}
    importer = p + int(m_top.max()).bit_length() + 1 <= 31 and p + widths[0] + 1 <= 31 and \
        all(p + w + 1 <= 30 for w in widths[1:]) and min(qs) >= p and sum(widths) <= 31
    return graph, {"data": draw(tensors(SHAPE, min(p_in + 1, 32)))}, names, importer


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=products_in_parts())
def test_a_product_in_parts_is_one_step_and_exact(case):
    """The CVM ops of a product in n parts (and the multiplies reading v) are one native step (mul64: v m in 64 bits
    with the whole m, floor over 2^B) of the run from v's shift to the end, exact against the reference executor;
    where the importer's labels hold (its proof: no int32 op wraps, no level's clip acts, B <= 31) one run takes
    them and every node after them."""
    graph, feeds, names, importer = case
    model = check(graph, feeds, int8=library_path() is not None)
    if library_path() is None or not importer:
        return
    assert any(names <= set(r) for r in fused(model)), (names, fused(model))
    steps = [list(a.ints) for n in model.graph.node for a in n.attribute if a.name in ("steps", "channel_steps")]
    assert any(MUL64 in s[0::3] for s in steps)


@settings(max_examples=EXAMPLES, deadline=None)
@given(widths=st.lists(st.integers(1, 12), min_size=1, max_size=3), lows=st.lists(st.integers(1, 31), min_size=3,
                                                                                  max_size=3),
       top=st.integers(0, (1 << 24) - 1), m=st.integers(1, (1 << 20) - 1), data=st.data())
def test_a_product_in_parts_is_taken_only_where_no_level_wraps_or_clips(widths, lows, top, m, data):
    """``Run._two_part_fits`` (the check before a product in parts becomes one mul64) is sound: where it holds for
    |v| <= m, every level's int32 op (v m_j + t - 2^(b_j-1)) stays within int32 and its cvm_right_shift's clip to
    its precision does not act, for v at -m, m and at random between, and the top's v m_top + t too."""
    from cvm_onnx.converters.to_onnx.requantize.run import Run

    k = top
    for w in widths:
        k = (k << w) + data.draw(st.integers(0, (1 << w) - 1))
    levels = tuple((w, bound(q)) for w, q in zip(widths, lows))
    if not Run._two_part_fits(k, levels, m):
        return
    for v in {-m, m, *data.draw(st.lists(st.integers(-m, m), max_size=20))}:
        t, start = 0, 0
        for w, low in levels:
            p_ = v * ((k >> start) & ((1 << w) - 1))
            x = p_ + t - (1 << (w - 1))
            assert all(-(1 << 31) <= y < 1 << 31 for y in (p_, p_ + t, x))
            t = (x + (1 << (w - 1))) >> w  # cvm_right_shift by w: round_shift(x, w)
            assert abs(t) <= low
            start += w
        assert all(-(1 << 31) <= y < 1 << 31 for y in (v * (k >> start), v * (k >> start) + t))


def test_a_product_in_more_levels_than_a_mul64_holds_stays_cvm_ops():
    """A product in 40 parts of width 1 (B = 39, past mul64's 31): the serving form reads at most 31 levels, leaves
    the chain as CVM ops and equals the reference executor; 31 levels (B = 31) are one mul64 step."""
    for n in (40, 32):
        b = GraphBuilder()
        x = b.op("clip", b.input("data", SHAPE, 12), a_min=-2047, a_max=2047)
        t = None
        for j in range(n - 1):
            p = b.op("broadcast_mul", x, b.param(f"m{j}", np.array([j % 2])))
            if t is not None:
                p = b.op("broadcast_add", p, t)
            t = b.op("cvm_right_shift", b.op("broadcast_add", p, b.param(f"h{j}", np.array([-1]))), shift_bit=1,
                     precision=12)
        y = b.op("broadcast_add", b.op("broadcast_mul", x, b.param("mt", np.array([5]))), t)
        graph = b.build(b.op("cvm_right_shift", y, shift_bit=3, precision=8))
        model = check(graph, {"data": np.arange(-12, 12).reshape(SHAPE).astype(np.int32) * 170},
                      int8=library_path() is not None)
        if library_path() is not None:
            steps = [list(a.ints) for n_ in model.graph.node for a in n_.attribute if a.name in ("steps",
                                                                                                "channel_steps")]
            assert any(MUL64 in s_[0::3] for s_ in steps) == (n == 32)


def test_a_two_part_import_is_served_as_fast_as_one_part(tmp_path):
    """A ResNet-shaped block quantized per channel (QDQ, uint8; benchmarks/quantized_side_by_side.py's network in
    small) and imported with two-part products: its serving form has the same ONNX nodes as the one-part import's
    (each two-part product one mul64 step of its convolution's requantize, no float32/int32 product left), every
    convolution takes integer products, and it equals the reference executor."""
    from collections import Counter

    from onnx import TensorProto as T
    from onnx import helper as h
    from support.quantized import conv_layer, quantized

    from cvm_onnx.converters.from_onnx import import_model
    from cvm_onnx.core.format.onnx_file import onnx_model

    if library_path() is None:
        pytest.skip("the native custom-op library was not built")
    rng = np.random.default_rng(20)
    nodes, inits = [], []

    def conv(x, c_in, c_out, name, k=3, stride=1):
        n, i = conv_layer(rng, name, x, c_in, c_out, k=k, stride=stride, pads=[k // 2] * 4)
        nodes.extend(n)
        inits.extend(i)
        return name

    def relu(x):
        nodes.append(h.make_node("Relu", [x], [f"{x}_relu"]))
        return f"{x}_relu"

    x = relu(conv("x", 3, 8, "stem"))
    y = conv(relu(conv(x, 8, 8, "b1c1")), 8, 8, "b1c2")
    nodes.append(h.make_node("Add", [y, x], ["b1"]))
    x = relu("b1")
    y = conv(relu(conv(x, 8, 16, "b2c1", stride=2)), 16, 16, "b2c2")
    nodes.append(h.make_node("Add", [y, conv(x, 8, 16, "b2p", k=1, stride=2)], ["b2"]))
    nodes += [h.make_node("GlobalAveragePool", [relu("b2")], ["pool"]), h.make_node("Flatten", ["pool"], ["flat"])]
    inits.append(onnx.numpy_helper.from_array(rng.normal(size=(16, 4)).astype(np.float32), "fc_w"))
    nodes.append(h.make_node("Gemm", ["flat", "fc_w"], ["y"]))
    g = h.make_graph(nodes, "block", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    qm, _ = quantized(onnx_model(g, 17), tmp_path, "QDQ", "uint8", False, True)
    one, two = (import_model(qm, two_part=split).graph for split in (False, True))
    forked = Counter(e for n in two.nodes if n.op == "broadcast_mul" for e in n.inputs[:1])
    assert sum(c >= 2 for c in forked.values()) >= 5  # the import has products in parts
    served = {name: to_onnx(graph, Target()) for name, graph in (("one", one), ("two", two))}
    ops = {name: Counter(n.op_type for n in m.graph.node) for name, m in served.items()}
    assert ops["two"] == ops["one"]
    routes = json.loads({p.key: p.value for p in served["two"].metadata_props}["cvm.routes"])
    assert len(routes) == sum(n.op == "conv2d" for n in two.nodes)
    assert all(r[1].startswith("integer products") and not r[2] for r in routes), routes
    feeds = {"data": np.random.default_rng(1).integers(0, 256, (1, 3, 8, 8)).astype(np.int32)}
    for got, want in zip(run(served["two"], feeds), execute(two, feeds)):
        assert np.array_equal(got, want)


@st.composite
def half_even_shifts(draw):
    """A requantization as the quantized importer writes it where ties can be met (docs/import.md, "Ties"): v =
    cvm_right_shift(data) of label P, t = v * m (m one param or one per channel; or t = v), then
    cvm_right_shift(t + 2^(k-1) - 1, k + 1) + cvm_right_shift(t - 2^(k-1), k + 1) (each shift into precision q, the
    add of 0 left out for k = 1, the two in either order) [+ z], clip, with random labels at and past the importer's
    (a narrow q lets a shift's clip act, a wide m lets the product or the adds wrap); its input at the precision's
    edges. Returns the graph, its feeds, the nodes from the product on and whether the importer's proof holds: |t|
    + 2^(k-1) within int32 and neither shift's clip acting at t's bound."""
    b = GraphBuilder()
    p_in, p = draw(st.integers(8, 32)), draw(st.integers(2, 24))
    x = b.op("cvm_right_shift", b.input("data", SHAPE, p_in), shift_bit=draw(st.integers(1, 8)), precision=p)
    k = draw(st.integers(1, 29))
    q = draw(st.integers(2, 31 - k))
    per = draw(st.sampled_from([None, False, True]))
    if per is None:
        t, top = x, 1
    else:
        m = np.array([draw(st.integers(0, (1 << draw(st.integers(0, 32 - p))) - 1))
                      for _ in range(SHAPE[1] if per else 1)]).reshape((SHAPE[1], 1, 1) if per else (1,))
        t, top = b.op("broadcast_mul", x, b.param("m", m), name="product"), int(m.max())
    halves = []
    for c in sorted([(1 << (k - 1)) - 1, -(1 << (k - 1))], reverse=draw(st.booleans())):
        u = b.op("broadcast_add", t, b.param(f"c{len(halves)}", np.array([c]))) if c else t
        halves.append(b.op("cvm_right_shift", u, shift_bit=k + 1, precision=q))
    y = b.op("broadcast_add", *halves, name="even")
    if draw(st.booleans()):
        y = b.op("broadcast_add", y, b.param("z", np.array([draw(st.integers(-128, 127))])))
    y = b.op("clip", y, a_min=-128, a_max=127)
    try:
        graph = b.build(y)
    except ValidationError:
        assume(False)
    ops = [n for n in graph.nodes if not n.is_variable]
    names = {n.name for n in ops[1:]}  # every node after v's shift
    bound_t = ((1 << (p - 1)) - 1) * top
    half, cap = 1 << (k - 1), (1 << (q - 1)) - 1
    importer = bound_t + half <= (1 << 31) - 1 and (bound_t + 3 * half - 1) >> (k + 1) <= cap and \
        -((-bound_t + half) >> (k + 1)) <= cap
    return graph, {"data": draw(tensors(SHAPE, min(p_in + 1, 32)))}, names, importer


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=half_even_shifts())
def test_a_shift_rounding_half_to_even_is_one_step_and_exact(case):
    """The five CVM ops of a shift rounding half to even (two adds, two shifts by k + 1, their sum) are one native
    step (even: round_half_even(t / 2^k)) of the run through them, exact against the reference executor; where the
    importer's proof holds (no int32 op wraps, no shift's clip acts) one run takes them and every node after them;
    a CUDA target leaves them unfused (its requantize has no such step)."""
    from cvm_onnx.native import EVEN

    def kinds(model: onnx.ModelProto) -> list[list[int]]:
        return [list(a.ints)[0::3] for n in model.graph.node for a in n.attribute
                if a.name in ("steps", "channel_steps")]

    graph, feeds, names, importer = case
    assert not any(EVEN in k for k in kinds(to_onnx(graph, Target("cuda"))))  # no CUDA kernel: left unfused
    model = check(graph, feeds, int8=library_path() is not None)
    if library_path() is None or not importer:
        return
    assert any(names <= set(r) for r in fused(model)), (names, fused(model))
    assert any(EVEN in k for k in kinds(model))
