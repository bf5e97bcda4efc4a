"""Every CVM op's facts are complete: a lowering, a bound rule, and the documented way back from ONNX.

An op is defined once (cvm_onnx/ops); its lowering (converters/to_onnx, ``@lowering``) and its bound rule
(``Op.bound``) are found from its name. The documented import path of every op (docs/import.md, "Models written
by the exporter come back identical") is checked on each op's cases of docs/operators.md, in both forms.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from harness import operator_cases

from cvm_onnx.converters.from_onnx import from_onnx
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
    assert "## Models written by the exporter come back identical" in (ROOT / "docs" / "import.md").read_text()


@pytest.mark.parametrize("inline", [False, True], ids=["function", "flat"])
@pytest.mark.parametrize("op", sorted(REGISTRY))
def test_every_op_comes_back_from_its_export(op, inline):
    def described(g):
        return [(n.op, n.outputs, None if n.is_variable else REGISTRY[n.op].bind(n.attrs)) for n in g.nodes]

    for _, graph in CASES[op]:
        assert described(from_onnx(to_onnx(graph, inline=inline))) == described(graph)
