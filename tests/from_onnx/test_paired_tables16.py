"""A float function of a sum of two values on two grids (docs/import.md, "Functions of a sum on two grids"): where
the table of pairs' outputs are a step function of D = x A + y B, the thresholds counted on D give the same outputs
as the table of pairs, over every one of the 2^16 pairs of two 8-bit values, from a few thousand entries; elsewhere
(a function that rises and falls) the table of pairs stays."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.cvm_runtime import CPU, FORMAL, LIB, CvmRuntime, packed
from support.quantized import qdq

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.from_onnx.quantized import elementwise
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format import write_model
from cvm_onnx.runtime.verify import verify

RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255)}
NP = {T.INT8: np.int8, T.UINT8: np.uint8}
FUNCTIONS = {"Exp": np.exp, "Sigmoid": lambda v: 1 / (1 + np.exp(-v)), "Tanh": np.tanh, "Cos": np.cos,
             "Reciprocal": lambda v: 1 / v}
RISING = ("Exp", "Sigmoid", "Tanh")
scales = st.floats(2.0**-9, 2.0**-1, width=32)


def pair_model(fn: str, op: str, x_type: int, sa, za, sb, zb, so, zo):
    """y = Q(fn(DQ(x[0]) op DQ(x[1]))), x of shape (2, 2^16): every pair of two 8-bit values, x[0] at (sa, za),
    x[1] at (sb, zb), y uint8 at (so, zo)."""
    inits = {"sa": np.float32(sa), "za": NP[x_type](za), "sb": np.float32(sb), "zb": NP[x_type](zb),
             "so": np.float32(so), "zo": np.uint8(zo), "i0": np.array(0, np.int64), "i1": np.array(1, np.int64)}
    nodes = [h.make_node("DequantizeLinear", ["x", "sa", "za"], ["af"]),
             h.make_node("DequantizeLinear", ["x", "sb", "zb"], ["bf"]),
             h.make_node("Gather", ["af", "i0"], ["a"], axis=0), h.make_node("Gather", ["bf", "i1"], ["b"], axis=0),
             h.make_node(op, ["a", "b"], ["v"]), h.make_node(fn, ["v"], ["f"]),
             h.make_node("QuantizeLinear", ["f", "so", "zo"], ["y"])]
    return qdq(nodes, (2, 1 << 16), x_type, inits, T.UINT8)


def every_pair(x_type: int) -> np.ndarray:
    lo, hi = RANGE[x_type]
    a, b = np.meshgrid(np.arange(lo, hi + 1), np.arange(lo, hi + 1), indexing="ij")
    return np.stack([a.ravel(), b.ravel()]).astype(np.int32)


def oracle(fn: str, op: str, x: np.ndarray, sa, za, sb, zb, so, zo) -> tuple[np.ndarray, np.ndarray]:
    """The rounded outputs of the exact dequantized values (each product and their sum exact in float64: 24-bit
    scales, 9-bit integers, exponents within 2^8), fn in float64, and each one's distance from a half-integer."""
    a = (x[0].astype(np.float64) - za) * float(np.float32(sa))
    b = (x[1].astype(np.float64) - zb) * float(np.float32(sb))
    with np.errstate(divide="ignore"):  # 1 / 0 = inf saturates
        v = FUNCTIONS[fn](a + b if op == "Add" else a - b) / float(np.float32(so))
    return np.clip(np.rint(v) + zo, 0, 255), np.abs(v - np.floor(v) - 0.5)


def largest_table(graph) -> int:
    return max(p.size for p in graph.params.values())


@settings(max_examples=12, deadline=None)
@given(fn=st.sampled_from(list(FUNCTIONS)), op=st.sampled_from(["Sub", "Add"]), sa=scales, sb=scales,
       x_type=st.sampled_from([T.INT8, T.UINT8]), so=st.sampled_from([1 / 255, 1 / 128, 0.013, 0.1]),
       d=st.data())
def test_the_counted_steps_equal_the_table_of_pairs_at_every_pair(fn, op, sa, sb, x_type, so, d):
    """Over all 2^16 pairs, random scales and zero points: the import equals the import by the table of pairs
    (``counted_sum`` off) at every pair, and the exactly rounded value wherever that is not within float64's error
    of a half-integer; a rising function (Exp, Sigmoid, Tanh) takes the counted form (no table of 2^16 entries); Cos
    and Reciprocal either form, as their ranges rise and fall; the export exact."""
    if sa == sb:
        return  # one scale: a table over the summed integers (``collapsed``), no table of pairs
    lo, hi = RANGE[x_type]
    za, zb = d.draw(st.integers(lo, hi)), d.draw(st.integers(lo, hi))
    zo = d.draw(st.sampled_from([0, 3, 128]))
    m = pair_model(fn, op, x_type, sa, za, sb, zb, so, zo)
    x = every_pair(x_type)
    imp = import_model(m, input_precision=9)
    [got] = execute(imp.graph, {"data": x})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(elementwise, "counted_sum", lambda *args: None)
        pairs = import_model(m, input_precision=9)
    [want] = execute(pairs.graph, {"data": x})
    assert largest_table(pairs.graph) == 1 << 16
    assert np.array_equal(got, want)
    exact, gap = oracle(fn, op, x, sa, za, sb, zb, so, zo)
    far = gap > 1e-6
    assert np.array_equal(got[far], exact[far])
    if fn in RISING:
        assert largest_table(imp.graph) < 1 << 13
    assert verify(imp.graph, x).exact


def test_a_function_that_rises_and_falls_keeps_the_table_of_pairs():
    """cos(a - b) over a range of several periods is no step function of one integer: the table of pairs."""
    m = pair_model("Cos", "Sub", T.INT8, 0.05, 0, 0.03, 0, 1 / 128, 128)
    imp = import_model(m, input_precision=9)
    assert largest_table(imp.graph) == 1 << 16
    x = every_pair(T.INT8)
    [got] = execute(imp.graph, {"data": x})
    exact, gap = oracle("Cos", "Sub", x, 0.05, 0, 0.03, 0, 1 / 128, 128)
    assert np.array_equal(got[gap > 1e-6], exact[gap > 1e-6])


def test_a_falling_function_counts_its_steps_on_minus_d():
    """1 / (a + b) of two uint8 values at zero point 0 (1 / 0 = inf saturating) never increases: the counted form on
    -D, equal to the table of pairs at every pair."""
    m = pair_model("Reciprocal", "Add", T.UINT8, 0.02, 0, 0.013, 0, 0.05, 0)
    imp = import_model(m, input_precision=9)
    assert largest_table(imp.graph) < 1 << 13
    x = every_pair(T.UINT8)
    [got] = execute(imp.graph, {"data": x})
    exact, gap = oracle("Reciprocal", "Add", x, 0.02, 0, 0.013, 0, 0.05, 0)
    assert np.array_equal(got[gap > 1e-6], exact[gap > 1e-6]) and got[0] == 255


@pytest.mark.skipif(not LIB, reason="CVM_RUNTIME_LIB names no local build of the CVM runtime")
def test_the_counted_form_runs_on_the_cvm_runtime(tmp_path):
    """RWKV's exp(pp - ww) at its scales (uint8 at 1/255): the CVM runtime loads the counted form and gives the
    reference executor's integers at every pair, on its CPU and FORMAL devices."""
    m = pair_model("Exp", "Sub", T.UINT8, 0.0218, 122, 0.01567, 147, 1 / 255, 0)
    imp = import_model(m, input_precision=9)
    assert largest_table(imp.graph) < 1 << 13
    write_model(imp.graph, tmp_path / "cvm")
    x = every_pair(T.UINT8)
    want = packed(execute(imp.graph, {"data": x}))
    for device in (CPU, FORMAL):
        assert np.array_equal(CvmRuntime(LIB, tmp_path / "cvm", device).run(x), want)
