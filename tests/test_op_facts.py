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

ROOT = Path(__file__).resolve().parents[1]


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


@pytest.mark.parametrize("inline", [False, True], ids=["function", "flat"])
@pytest.mark.parametrize("op", sorted(REGISTRY))
def test_every_op_comes_back_from_its_export(op, inline):
    def described(g):
        return [(n.op, n.outputs, None if n.is_variable else REGISTRY[n.op].bind(n.attrs)) for n in g.nodes]

    for _, graph in CASES[op]:
        assert described(from_onnx(to_onnx(graph, inline=inline))) == described(graph)
