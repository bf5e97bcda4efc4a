"""The pieces of a per-sample min-max normalization (basic-pitch's normalized log: x - ReduceMin(x), ReduceMax of
that sum, Equal of the max with 0, Where(div_no_nan)) in quantized models, against exact oracles: the rational
values, compared, maxed and quantized (round half to even) in Fractions."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.quantized import qdq

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.verify import verify

RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255)}
NP = {T.INT8: np.int8, T.UINT8: np.uint8}
scales = st.floats(2.0**-8, 2.0**2, width=32)


def draw_x(d, shape, dtype) -> np.ndarray:
    lo, hi = RANGE[dtype]
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    kind = d.draw(st.sampled_from(["random", "ends", "flat"]))
    if kind == "ends":
        return rng.choice([lo, hi], size=shape).astype(np.int64)
    if kind == "flat":  # every value of a sample equal: its max - min is 0
        return np.repeat(rng.integers(lo, hi + 1, (shape[0], 1, 1)), shape[1] * shape[2]).reshape(shape)
    return rng.integers(lo, hi + 1, size=shape).astype(np.int64)


def imported(m, x):
    imp = import_model(m, input_precision=9)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    assert verify(imp.graph, x.astype(np.int32)).exact
    return imp, got.astype(np.int64)


def q(real, s: Fraction, z: int, dtype) -> int:
    lo, hi = RANGE[dtype]
    return min(max(round(real / s) + z, lo), hi)


@settings(max_examples=20, deadline=None)
@given(d=st.data(), sx=scales, sm=scales, so=scales, x_type=st.sampled_from([T.INT8, T.UINT8]),
       op=st.sampled_from(["ReduceMax", "ReduceMin"]), keep=st.booleans(), opset=st.sampled_from([15, 18]))
def test_reduce_max_of_x_minus_its_min_equals_the_exact_max(d, sx, sm, so, x_type, op, keep, opset):
    """ReduceMax (ReduceMin) over axes (1, 2) of x - m, m = Q(ReduceMin(x)) broadcast per sample at its own scale
    (a sum quantize_static leaves in float): the varying term reduced, the constant one kept, requantized together;
    every output within 1/2 + delta steps of the exact max (min) of the rational values, and equal to its round
    half to even wherever that is farther than delta from a half-integer. Regression: 'the ReduceMax input (a sum)
    must be quantized (QuantizeLinear) first'."""
    n, t, f = d.draw(st.integers(1, 3)), d.draw(st.integers(1, 5)), d.draw(st.integers(1, 6))
    zx, zm = d.draw(st.integers(*RANGE[x_type])), d.draw(st.integers(*RANGE[x_type]))
    zo = d.draw(st.integers(*RANGE[x_type]))
    inits = {"sx": np.float32(sx), "zx": NP[x_type](zx), "sm": np.float32(sm), "zm": NP[x_type](zm),
             "so": np.float32(so), "zo": NP[x_type](zo), "shape": np.array([n, 1, 1], np.int64)}
    axes = {"axes": [1, 2]} if opset < 18 else {}
    reduce_in = ["d"] if opset < 18 else ["d", "axes"]
    if opset >= 18:
        inits["axes"] = np.array([1, 2], np.int64)
    nodes = [h.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             h.make_node("ReduceMin", ["xf"] + reduce_in[1:], ["mn"], keepdims=0, **axes),
             h.make_node("QuantizeLinear", ["mn", "sm", "zm"], ["mq"]),
             h.make_node("DequantizeLinear", ["mq", "sm", "zm"], ["mf"]),
             h.make_node("Reshape", ["mf", "shape"], ["mr"]),
             h.make_node("Sub", ["xf", "mr"], ["d"]),
             h.make_node(op, reduce_in, ["r"], keepdims=int(keep), **axes),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    m = qdq(nodes, (n, t, f), x_type, inits, x_type, opset=opset)
    x = draw_x(d, (n, t, f), x_type)
    imp, got = imported(m, x)
    sx_, sm_, so_ = Fraction(float(np.float32(sx))), Fraction(float(np.float32(sm))), Fraction(float(np.float32(so)))
    mins = [q(min(int(v) - zx for v in x[k].flat) * sx_, sm_, zm, x_type) for k in range(n)]
    pick = max if op == "ReduceMax" else min
    exact = [pick((int(v) - zx) * sx_ for v in x[k].flat) - (mins[k] - zm) * sm_ for k in range(n)]
    [rec] = [r for r in imp.requants if r.node.endswith("_7") or r.node == "QuantizeLinear_7"]
    delta = rec.plan.delta if rec.plan is not None else Fraction(0)
    for k in range(n):
        v = exact[k] / so_
        g = int(got.reshape(n)[k])
        lo, hi = RANGE[x_type]
        if lo < g < hi:
            assert abs(g - zo - v) <= Fraction(1, 2) + delta
        if abs(v - round(v) - Fraction(1, 2)) > delta and abs(v - round(v) + Fraction(1, 2)) > delta:
            assert g == q(exact[k], so_, zo, x_type)


@settings(max_examples=25, deadline=None)
@given(d=st.data(), sx=scales, x_type=st.sampled_from([T.INT8, T.UINT8]),
       op=st.sampled_from(["Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"]), first=st.booleans(),
       form=st.sampled_from(["on grid", "off grid", "float", "dequantized 0", "far"]))
def test_a_comparison_with_a_constant_selects_exactly(d, sx, x_type, op, first, form):
    """Where(x op c, x, 0) (0 dequantized, as div_no_nan's) quantized at x's own scale: equal to the comparison of
    DequantizeLinear's float32 value fl((t - z) s) with c, as onnxruntime compares them (not the exact (t - z) s: at
    s 1.5842193, t - z = 24, fl(24 s) is c = 24 s rounded, which the exact product is not), for c on x's grid, off
    it, a float constant, a dequantized 0, beyond x's range, either operand first. Regression: 'float Equal of dequantized values has no integer form',
    'float Where of dequantized values has no integer form' (basic-pitch)."""
    z = d.draw(st.integers(*RANGE[x_type]))
    s = Fraction(float(np.float32(sx)))
    k = d.draw(st.integers(-300, 300))
    c = {"on grid": k * s, "off grid": (k + Fraction(1, 3)) * s, "float": Fraction(float(np.float32(k * 0.37))),
         "dequantized 0": Fraction(0), "far": 1000 * s * (1 if k > 0 else -1)}[form]
    inits = {"sx": np.float32(sx), "zx": NP[x_type](z), "zero": np.int8(0), "zs": np.float32(0.5), "zz": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["zero", "zs", "zz"], ["zf"])]
    if form == "dequantized 0":
        cname = "zf"
    else:
        inits["c"] = np.float32(float(c))
        c = Fraction(float(np.float32(float(c))))
        cname = "c"
    nodes += [h.make_node(op, ["xf", cname] if first else [cname, "xf"], ["cond"]),
              h.make_node("Where", ["cond", "xf", "zf"], ["w"]),
              h.make_node("QuantizeLinear", ["w", "sx", "zx"], ["y"])]
    m = qdq(nodes, (2, 9), x_type, inits, x_type)
    x = draw_x(d, (1, 2, 9), x_type).reshape(2, 9)
    _, got = imported(m, x)
    ops = {"Equal": lambda a, b: a == b, "Greater": lambda a, b: a > b, "Less": lambda a, b: a < b,
           "GreaterOrEqual": lambda a, b: a >= b, "LessOrEqual": lambda a, b: a <= b}
    def value(v: int) -> Fraction:  # DequantizeLinear's float32 product, as onnxruntime compares it
        return Fraction(float(np.float32(int(v) - z) * np.float32(sx)))

    want = [int(v) if (ops[op](value(v), c) if first else ops[op](c, value(v))) else z for v in x.flat]
    assert got.reshape(-1).tolist() == want
