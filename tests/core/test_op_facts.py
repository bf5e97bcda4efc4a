"""Every CVM op's facts are complete: a lowering, a bound rule, and the documented way back from ONNX.

An op is defined once (cvm_onnx/ops); its lowering (converters/to_onnx, ``@lowering``) and its bound rule
(``Op.bound``) are found from its name. The documented import path of every op (docs/import.md, "Models written
by the exporter come back identical") is checked on each op's cases of docs/operators.md, in both forms.
"""
from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import operator_cases

from cvm_onnx.converters.from_onnx import from_onnx
from cvm_onnx.converters.from_onnx.roundtrip import MARKS
from cvm_onnx.converters.to_onnx import LOWERINGS, to_onnx
from cvm_onnx.core.ops import REGISTRY
from cvm_onnx.native import ATTRS as NATIVE_ATTRS

ROOT = Path(__file__).resolve().parents[2]


CASES = operator_cases()


def test_every_op_has_a_lowering_and_a_bound_rule():
    assert sorted(set(REGISTRY) - set(LOWERINGS)) == [], "ops without a lowering (converters/to_onnx)"
    assert sorted(set(LOWERINGS) - set(REGISTRY)) == [], "lowerings of no op"
    assert [name for name, op in REGISTRY.items() if not callable(op.bound)] == [], "ops without Op.bound"


def test_native_ops_are_the_native_lowerings():
    """The native library's ops and attributes are the definitions' (``native_attrs``), defaults included."""
    assert set(NATIVE_ATTRS) == {op for op, lowering in LOWERINGS.items() if lowering.native}
    for op, attrs in NATIVE_ATTRS.items():
        assert attrs == {a.name: int(a.default) for a in REGISTRY[op].attrs if a.name in attrs}


def test_every_op_has_documented_cases():
    assert sorted(set(REGISTRY) - set(CASES)) == [], "ops without a case in docs/make_operators.py"


def test_the_documented_way_back_names_every_native_op_and_flat_form_marker():
    """docs/import.md's way back for the exporter's models (its section "Models written by the exporter come back
    identical") lists the native ops and the markers the flat form carries, as the code has them."""
    text = (ROOT / "docs" / "import.md").read_text()
    section = text.split("## Models written by the exporter come back identical\n", 1)[1].split("\n## ", 1)[0]
    native = re.search(r"Nodes of domain `cvm\.native` \(([^)]*)\)", section)
    assert native and set(re.findall(r"`(\w+)`", native.group(1))) == set(NATIVE_ATTRS)
    assert [m for m in MARKS if f"`{m}`" not in section] == []


INTERVAL_OPS = sorted(name for name, op in REGISTRY.items() if op.interval is not None)
SMALL = st.integers(-(1 << 29), 1 << 29)  # sums and differences of two stay within int32


@st.composite
def interval_cases(draw, name: str):
    """Attributes of ``name``, an interval per input and values inside them (the ends included)."""
    op = REGISTRY[name]
    given_attrs = {}
    if name == "clip":
        a_min = draw(st.integers(-(1 << 31) + 1, (1 << 31) - 2))
        given_attrs = {"a_min": a_min, "a_max": draw(st.integers(a_min + 1, (1 << 31) - 1))}
    elif name in ("cvm_clip", "cvm_right_shift"):
        given_attrs = {"precision": draw(st.integers(1, 32))}
        if name == "cvm_right_shift":
            given_attrs["shift_bit"] = draw(st.integers(1, 31))
    a = op.bind(op.parse_attrs(given_attrs)[0])
    small = st.integers(-(1 << 15), 1 << 15) if name == "broadcast_mul" else SMALL  # products within int32
    intervals = [tuple(sorted((draw(small), draw(small)))) for _ in range(op.arity(a)[0])]
    values = [np.array([lo, hi, *draw(st.lists(st.integers(lo, hi), max_size=6))], np.int32) for lo, hi in intervals]
    return op, a, intervals, values


@pytest.mark.parametrize("name", INTERVAL_OPS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_interval_rules_hold_and_are_reached(name, data):
    """An op's interval rule (``Op.interval``, which the importer applies): the kernel on values within the
    inputs' intervals stays in it, and reaches both its ends at the inputs' ends or zero (each rule is monotone in
    every input on either side of zero)."""
    op, a, intervals, values = data.draw(interval_cases(name))
    [(lo, hi)] = op.interval(a, intervals)
    outs = [op.kernel(a, *(v.reshape(-1, *[1] * k) for k, v in enumerate(values)))]
    points = [sorted({lo, hi} | ({0} if lo < 0 < hi else set())) for lo, hi in intervals]
    corners = [op.kernel(a, *(np.array([c], np.int32) for c in ends)) for ends in itertools.product(*points)]
    got = np.concatenate([o.ravel() for o in outs + corners]).astype(np.int64)
    assert lo <= got.min() and got.max() <= hi
    assert (int(min(c.min() for c in corners)), int(max(c.max() for c in corners))) == (lo, hi)


def variable_cases(name: str) -> list:
    """(attributes, the input types) of the documented cases of ``name`` whose node reads graph inputs alone."""
    out = []
    for _, graph in CASES.get(name, []):
        for node in graph.nodes:
            if node.op == name and all(graph.nodes[e.node].is_variable and graph.nodes[e.node].name not in graph.params
                                       for e in node.inputs):
                out.append((REGISTRY[name].bind(node.attrs), [graph.type_of(e) for e in node.inputs]))
    return out


def outputs_of(op, a, xs) -> list[np.ndarray]:
    ys = op.kernel(a, *xs)
    return [np.asarray(y) for y in (ys if isinstance(ys, tuple) else (ys,))]


#: Ops whose documented cases give non-negative outputs for non-negative inputs but whose definitions do not (yet)
#: say so: the exporter's proof of x >= 0 does not use them (each needs its own argument first).
UNDECLARED_NONNEGATIVE = {"abs", "broadcast_div", "broadcast_greater", "cvm_precision", "sum", "where"}


DECLARED_NONNEGATIVE = sorted(name for name, op in REGISTRY.items()
                              if any(op.nonnegative(a, True) for a, _ in variable_cases(name)))


def nonnegative_inputs(types, draw_ints) -> list[np.ndarray]:
    return [np.array(draw_ints(t), np.int32).reshape(t.shape) for t in types]


@pytest.mark.parametrize("name", DECLARED_NONNEGATIVE)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_an_op_said_to_keep_values_nonnegative_does(name, data):
    """``Op.nonnegative``: where an op says its outputs are >= 0 given non-negative inputs (or given any, as relu),
    its kernel gives none below 0 for such inputs within their precisions, on every documented case."""
    op = REGISTRY[name]
    for a, types in variable_cases(name):
        for signed in (False, True):
            xs = [np.array(data.draw(st.lists(st.integers(-t.bound if signed else 0, t.bound), min_size=int(np.prod(
                t.shape)), max_size=int(np.prod(t.shape)))), np.int32).reshape(t.shape) for t in types]
            if op.nonnegative(a, not signed):
                assert all(int(y.min(initial=0)) >= 0 for y in outputs_of(op, a, xs)), (a, xs)


def test_an_op_keeping_values_nonnegative_says_so():
    """An op whose kernel keeps non-negative inputs so on every documented case (200 random draws each, the
    bounds included) says it (``Op.keeps_nonnegative``), or is one of the known ``UNDECLARED_NONNEGATIVE``: a new
    op that forgets to say it costs the exporter its x >= 0 routes and fails here."""
    rng = np.random.default_rng(0)
    found = set()
    for name, op in REGISTRY.items():
        cases = variable_cases(name)
        if not cases or name in DECLARED_NONNEGATIVE:
            continue
        kept = True
        for a, types in cases:
            for k in range(200):
                high = [t.bound if k % 2 else rng.integers(0, t.bound + 1) for t in types]
                xs = [rng.integers(0, h + 1, t.shape).astype(np.int32) for h, t in zip(high, types)]
                try:
                    kept = kept and all(int(y.min(initial=0)) >= 0 for y in outputs_of(op, a, xs))
                except Exception:  # noqa: BLE001  (inputs the kernel refuses, e.g. a division by zero)
                    continue
        if kept:
            found.add(name)
    assert found == UNDECLARED_NONNEGATIVE


STEP_OPS = sorted(name for name, op in REGISTRY.items() if op.step is not None)


@pytest.mark.parametrize("name", STEP_OPS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_requantization_step_is_monotone(name, data):
    """``Op.step``: an op a requantization run takes as a step is monotone in its data (the run defers its clips
    past every step: f(clip(w, lo, hi)) = clip(f(w), f(lo), f(hi))): for x <= x' element for element, its
    outputs move one way, nondecreasing, or for a multiplication by a negative number nonincreasing."""
    op = REGISTRY[name]
    cases = variable_cases(name)
    assert cases, f"{name} has no documented case reading inputs alone"
    a, types = data.draw(st.sampled_from(cases))
    t = types[0]
    x = np.array(data.draw(st.lists(st.integers(-t.bound, t.bound), min_size=int(np.prod(t.shape)),
                                    max_size=int(np.prod(t.shape)))), np.int32).reshape(t.shape)
    up = np.array(data.draw(st.lists(st.integers(0, t.bound), min_size=x.size, max_size=x.size)), np.int64)
    x2 = np.minimum(x.astype(np.int64) + up.reshape(x.shape), t.bound).astype(np.int32)
    c = np.array([data.draw(st.integers(-(1 << 10), 1 << 10))], np.int32)  # the one-number param of a scalar step
    extra = [c] if op.step == "scalar" else []
    (y,), (y2,) = outputs_of(op, a, [x, *extra]), outputs_of(op, a, [x2, *extra])
    sign = -1 if name == "broadcast_mul" and c[0] < 0 else 1
    assert (sign * (y2.astype(np.int64) - y.astype(np.int64)) >= 0).all(), (x, x2, c)


@pytest.mark.parametrize("inline", [False, True], ids=["function", "flat"])
@pytest.mark.parametrize("op", sorted(REGISTRY))
def test_every_op_comes_back_from_its_export(op, inline):
    def described(g):
        return [(n.op, n.outputs, None if n.is_variable else REGISTRY[n.op].bind(n.attrs)) for n in g.nodes]

    for _, graph in CASES[op]:
        assert described(from_onnx(to_onnx(graph, inline=inline))) == described(graph)
