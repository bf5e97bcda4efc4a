"""Far rows whose output varies (docs/import.md, "Far rows whose output varies"): a channel whose int32 bias is
2^30 or more accumulator steps (no conv2d label holds it) and whose QuantizeLinear output is not one value,
requantized alone with the bias split off at import; against the oracle of docs/import.md (the one-part formula on
the whole value v, within 1/2 + delta of v M), the export against the reference executor."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from test_quantized_import import oracle_equal, qdq_conv

from cvm_onnx.converters.from_onnx.requant_plans import NoPlan, far_plan
from cvm_onnx.core.ops.elemwise import round_shift
from cvm_onnx.runtime.verify import verify

RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255), T.INT16: (-32768, 32767)}
huge = st.one_of(st.sampled_from([(1 << 31) - 1, 1 << 30, 2147268950, 2100000000]),
                 st.integers(1 << 30, (1 << 31) - 1)).flatmap(lambda b: st.sampled_from([b, -b]))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), c_out=st.integers(1, 4), dead=st.integers(0, 3), bias=huge,
       reach=st.floats(0.0, 1.0), c_in=st.sampled_from([1, 8, 32]), out=st.sampled_from([T.INT8, T.UINT8, T.INT16]),
       x_type=st.sampled_from([T.INT8, T.UINT8]), inputs=st.sampled_from(["random", "low", "high", "ends"]))
def test_a_far_row_whose_output_varies_equals_the_oracle(seed, c_out, dead, bias, reach, c_in, out, x_type, inputs):
    """A dead channel (bias 2^30 .. 2^31 - 1 of either sign) whose value b M lies anywhere from 0 to the output
    range's end (``reach``), so that its output varies over its accumulator's interval: imported, equal to the oracle
    (each far row's r within 1/2 + delta of v M) and exact on onnxruntime. Regression: refused, 'its output varies:
    the channel's bias is too large for its weights' scale' (PP-OCRv6's detector per channel)."""
    rng = np.random.default_rng(seed)
    dead %= c_out
    lo, hi = RANGE[out]
    zo = 0 if out != T.UINT8 else 128
    so, sx = 0.05, 0.02
    w = rng.integers(-127, 128, size=(c_out, c_in, 3, 3))
    w[dead].flat[: rng.integers(0, w[dead].size + 1)] = rng.choice([-127, 127])
    sw = (rng.uniform(0.5, 2, c_out) * 0.01).astype(np.float32)
    target = reach * (hi - zo if bias > 0 else zo - lo)  # |b| M in output steps
    sw[dead] = np.float32(max(target, 1e-3) * so / (abs(bias) * sx))
    b = rng.integers(-2000, 2000, c_out)
    b[dead] = bias
    m = qdq_conv(w, sw, sx, 0 if x_type == T.INT8 else 128, x_type, so, zo, out, bias=b)
    xlo, xhi = RANGE[x_type]
    x = {"random": rng.integers(xlo, xhi + 1, size=(1, c_in, 5, 5)), "low": np.full((1, c_in, 5, 5), xlo),
         "high": np.full((1, c_in, 5, 5), xhi), "ends": rng.choice([xlo, xhi], size=(1, c_in, 5, 5))}[inputs]
    imp = oracle_equal(m, x)
    [rec] = imp.requants
    assert len(rec.far) + len(rec.settled) == 1
    assert verify(imp.graph, x.astype(np.int32)).exact


@settings(max_examples=200, deadline=None)
@given(width=st.integers(1 << 21, 1 << 25), below=st.floats(0, 1), c=huge, eps=st.fractions(-0.125, 0.125),
       out=st.sampled_from([T.INT8, T.UINT8, T.INT16]), data=st.data())
def test_far_plan_split_equals_the_one_part_formula(width, below, c, eps, out, data):
    """For a far row whose output varies over u in [lo, hi] (c M near a half-step r0 + 1/2 + eps anywhere in the
    output range, its ends included, u's interval around 0), far_plan has a plan, and its run-time form,
    cvm_right_shift(cvm_right_shift(clip(u) + c0, s) m + addend, k) + Q in exact integers (each step's value checked
    against its label), equals the one-part formula on v = u + c, floor((v1 m + 2^(k-1)) / 2^k) with
    v1 = round_half_up(clip(v) / 2^s), within 1/2 + delta of v M where it does not saturate, for u at the ends of
    its interval and inside it."""
    lo = -int(below * width)
    hi = lo + width
    rlo, rhi = RANGE[out]
    zo = 0 if out != T.UINT8 else 128
    r0 = data.draw(st.integers(0, rhi - zo) if c > 0 else st.integers(rlo - zo, -1))
    ratio = (r0 + Fraction(1, 2) + eps) / c  # > 0: c M = r0 + 1/2 + eps
    ends = {min(max(round((u + c) * ratio) + zo, rlo), rhi) for u in (lo, hi)}
    assume(len(ends) > 1)  # a row of one value is settled instead
    fp = far_plan(lo, hi, c, ratio, rlo - zo, rhi - zo)
    p = fp.plan
    m = int(p.multipliers[0].reshape(-1)[0])
    assert p.pre_precision + len(bin(m)) - 2 + 1 <= 31 and p.shift <= 30 and p.precision + p.shift <= 31
    for u in {lo, hi, data.draw(st.integers(lo, hi)), data.draw(st.integers(lo, hi))}:
        v = u + c
        uc = min(max(u, p.clip[0]), p.clip[1]) if p.clip else u
        u1 = round_shift(uc + fp.pre_add, p.pre_shift) if p.pre_shift else uc
        assert abs(uc + fp.pre_add) < 1 << 31 and abs(u1) <= (1 << (p.pre_precision - 1)) - 1
        x = u1 * m + fp.add
        assert abs(x) < 1 << 31
        part = round_shift(x, p.shift)
        assert abs(part) <= (1 << (p.precision - 1)) - 1
        r = part + fp.after
        vc = min(max(v, p.clip[0] + c), p.clip[1] + c) if p.clip else v
        v1 = round_shift(vc, p.pre_shift) if p.pre_shift else vc
        assert r == (v1 * m + (1 << (p.shift - 1))) >> p.shift
        if rlo <= r + zo <= rhi:
            assert abs(r - v * ratio) <= Fraction(1, 2) + p.delta
        else:  # saturated: the exact value saturates the same way
            assert (r + zo > rhi) == (round(v * ratio) + zo > rhi) or abs(r - v * ratio) <= 1


def test_a_far_row_over_31_bits_has_no_plan():
    """u spanning [-2^30, 2^30] (a label of 32 bits) leaves no pre-shift whose shifted label and shift stay within
    31 bits: NoPlan (the importer refuses the QuantizeLinear naming the channel), though its output varies."""
    with pytest.raises(NoPlan, match="within one step"):
        far_plan(-(1 << 30), 1 << 30, 1 << 30, Fraction(1, 1 << 23), -128, 127)


def test_the_import_report_lists_a_far_row_with_its_plan():
    """`convert --report` lists a far row's requantization: its channel, the bias split off, M, m, s, k and the
    worst error 1/2 + delta (it listed the other rows only)."""
    from cvm_onnx.app.report import import_markdown
    from cvm_onnx.core.gas import measure

    w = np.full((2, 1, 1, 1), 100)
    m = qdq_conv(w, np.array([2.0**-20, 0.01], np.float32), 2.0**-11, 0, T.INT8, 1.0, 0, T.INT8,
                 bias=np.array([1 << 30, 5]), pads=(0, 0, 0, 0), name="deadconv")
    imp = oracle_equal(m, np.arange(-12, 13).reshape(1, 1, 5, 5))
    [(row, fp)] = imp.requants[0].far
    text = import_markdown("m.onnx", "out", imp, measure(imp.graph.nodes))
    line = next(x for x in text.splitlines() if "far channel 0" in x)
    assert f"its bias {1 << 30} split off" in line and f"{fp.plan.error:.6f}" in line
    assert f"| {fp.plan.pre_shift} | {fp.plan.shift} |" in line


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(1, 5), dead=st.integers(0, 4), bias=huge, reach=st.floats(0.0, 1.0),
       k=st.sampled_from([1, 16, 300]), out=st.sampled_from([T.INT8, T.UINT8, T.INT16]), rows=st.integers(1, 3))
def test_a_far_column_of_a_gemm_equals_the_oracle(seed, n, dead, bias, reach, k, out, rows):
    """The same for a Gemm's output column (dense; weights per column, the bias (N,) at s_x s_w): the far column
    taken out along the last axis, requantized alone; equal to the oracle, exact on onnxruntime."""
    from onnx import helper as h
    from support.quantized import Oracle, qdq

    from cvm_onnx.converters.from_onnx import import_model
    from cvm_onnx.core.executor import execute

    rng = np.random.default_rng(seed)
    dead %= n
    lo, hi = RANGE[out]
    zo = 0 if out != T.UINT8 else 128
    so, sx = 0.05, 0.02
    w = rng.integers(-127, 128, size=(k, n))
    sw = (rng.uniform(0.5, 2, n) * 0.01).astype(np.float32)
    target = reach * (hi - zo if bias > 0 else zo - lo)  # |b| M in output steps; near a half-step: output varies
    sw[dead] = np.float32((int(target) + 0.5 if seed % 3 else max(target, 1e-3)) * so / (abs(bias) * sx))
    b = rng.integers(-2000, 2000, n)
    b[dead] = bias
    onp = {T.INT8: np.int8, T.UINT8: np.uint8, T.INT16: np.int16}[out]
    inits = {"sx": np.float32(sx), "zx": np.int8(0), "w": w.astype(np.int8), "sw": sw, "zw": np.zeros(n, np.int8),
             "b": b.astype(np.int32), "sb": (np.float32(sx) * sw).astype(np.float32), "zb": np.zeros(n, np.int32),
             "so": np.float32(so), "zo": onp(zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], axis=1),
             h.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bf"], axis=0),
             h.make_node("Gemm", ["xf", "wf", "bf"], ["r"]),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    m = qdq(nodes, (rows, k), T.INT8, inits, out)
    x = rng.choice([-128, 127, 0, 5], size=(rows, k)) if seed % 2 else rng.integers(-128, 128, size=(rows, k))
    imp = import_model(m, input_precision=9)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    [want] = Oracle(m, imp).run(x.astype(np.int64))
    assert np.array_equal(got.astype(np.int64), np.asarray(want[1]).reshape(got.shape))
    [rec] = imp.requants
    assert len(rec.far) + len(rec.settled) == 1
    assert verify(imp.graph, x.astype(np.int32)).exact
