"""Ties rounded half to even (docs/import.md, "Ties"): where a requantization's M is p / 2^a exactly, the CVM graph
rounds v M as QuantizeLinear does, checked against an exact rational oracle and onnxruntime at every tie."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import Oracle, Reader, ort_session

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.from_onnx.requant_plans import plan
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model


class Exact(Oracle):
    """The QDQ graph's exact arithmetic: every QuantizeLinear rounds the exact rational value half to even (Python's
    round of a Fraction), adds the zero point and saturates; no plan of the import is used."""

    def requant_terms(self, rec, name, terms, s_out, zo, lo, hi):
        exact = sum(np.asarray(t[1], dtype=object) * (t[2] / s_out) for t in terms)
        q = np.vectorize(lambda v: round(v), otypes=[object])(np.asarray(exact, dtype=object))
        return np.clip(q.astype(np.int64) + zo, lo, hi)


def cvm(model: onnx.ModelProto, q: np.ndarray, two_part: bool = False):
    imp = import_model(model, input_precision=8, two_part=two_part)
    [got] = execute(imp.graph, {"data": q.astype(np.int32)})
    return imp, got


def onnxruntime(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {model.graph.input[0].name: x})[0]


# -- one requantization at every tie --------------------------------------------------------------------------------
def pool_qdq(kind: str, k: int, c: int, size: int, s_in: float, s_out: float, z_out: int, otype: int):
    """DequantizeLinear(int8 x, s_in), an AveragePool k x k stride k (or GlobalAveragePool), QuantizeLinear(s_out,
    z_out): M = s_in / (s_out k^2)."""
    pool = h.make_node("AveragePool", ["xf"], ["p"], kernel_shape=[k, k], strides=[k, k]) if kind == "avg" else \
        h.make_node("GlobalAveragePool", ["xf"], ["p"])
    onp = np.int8 if otype == T.INT8 else np.uint8
    nodes = [h.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]), pool,
             h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
    inits = [nh.from_array(np.array(s_in, np.float32), "sx"), nh.from_array(np.array(0, np.int8), "zx"),
             nh.from_array(np.array(s_out, np.float32), "so"), nh.from_array(np.array(z_out, onp), "zo")]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.INT8, [1, c, size, size])],
                     [h.make_tensor_value_info("y", otype, None)], inits)
    return onnx_model(g, 17)


def near_ties(rng, shape: tuple[int, ...], k: int) -> np.ndarray:
    """int8 values (-127..127) whose k x k window sums lie at and around the multiples of k^2 / 2."""
    x = rng.integers(-127, 128, size=shape)
    n, c, hh, ww = shape
    for i in range(0, hh - k + 1, k):
        for j in range(0, ww - k + 1, k):
            win = x[:, :, i:i + k, j:j + k].reshape(n, c, -1)
            want = rng.integers(-40, 41, size=(n, c)) * (k * k // 2 or 1) + rng.integers(-1, 2, size=(n, c))
            diff = want - win.sum(-1)
            for t in range(k * k):  # spread the difference over the window within -127..127
                step = np.clip(win[..., t] + diff, -127, 127) - win[..., t]
                win[..., t] += step
                diff -= step
            x[:, :, i:i + k, j:j + k] = win.reshape(n, c, k, k)
    return x


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(["avg", "global"]), k=st.sampled_from([2, 4]), c=st.integers(1, 5),
       ratio=st.sampled_from([Fraction(1), Fraction(1, 2), Fraction(2), Fraction(3, 2), Fraction(3, 4),
                              Fraction(5, 8), Fraction(1, 8)]),
       s_out=st.sampled_from([0.05, 0.0078125, 0.1, 1.0 / 3]), otype=st.sampled_from([T.INT8, T.UINT8]),
       seed=st.integers(0, 2**16))
def test_pools_round_ties_as_quantize_linear(kind, k, c, ratio, s_out, otype, seed):
    """AveragePool k x k and GlobalAveragePool with s_in / s_out a dyadic ratio (equal scales, halved, doubled,
    3/2, ...), values at and around every tie of the pool's M: the CVM graph (reference executor) equals the exact
    oracle on every value, and so does onnxruntime where its float32 arithmetic is exact (s_out a power of two;
    elsewhere its float32 average can fall off a tie either way); the plan is the half-to-even form where a tie is
    met."""
    rng = np.random.default_rng(seed)
    size = 2 * k if kind == "avg" else k
    s_in = float(np.float32(s_out * ratio))
    if Fraction(s_in) / Fraction(float(np.float32(s_out))) != ratio:
        return  # float32 scales whose ratio is not this dyadic number
    z_out = 0 if otype == T.INT8 else 128
    d = Fraction(s_out).denominator
    exact_in_float = Fraction(s_out).numerator == 1 and d & (d - 1) == 0
    m = pool_qdq(kind, k, c, size, s_in, float(np.float32(s_out)), z_out, otype)
    q = near_ties(rng, (2, c, size, size), k)
    for one in q:
        imp, got = cvm(m, one[None])
        want = Exact(m, imp).run(one[None])[0][1]
        assert np.array_equal(got.reshape(want.shape), want)
        if exact_in_float:
            assert np.array_equal(onnxruntime(m, one[None].astype(np.int8)).astype(np.int64), want)
    [r] = imp.requants
    if ratio.denominator * k * k > 1:  # M = ratio / k^2 not an integer: ties exist among these sums
        assert r.plan.even and r.plan.delta == 0


@settings(max_examples=60, deadline=None)
@given(a=st.integers(1, 12), p=st.integers(1, 2**9).map(lambda p: 2 * p - 1), lo=st.integers(-(1 << 20), 0),
       span=st.integers(1, 1 << 21), per=st.integers(1, 3), out=st.sampled_from([(-128, 127), (0, 255)]),
       seed=st.integers(0, 99))
def test_a_dyadic_plan_rounds_half_to_even_exactly(a, p, lo, span, per, out, seed):
    """M = p / 2^a (per channel: a few such ratios) over any accumulator interval: the plan's CVM ops on integers at
    and around every tie (odd multiples of 2^(a-1) / p's part) give round_half_even(v M), saturated, exactly; the
    labels keep every op within 32 bits and both shifts consistent across devices."""
    from cvm_onnx.converters.from_onnx.requant_plans import tight
    rng = np.random.default_rng(seed)
    hi = lo + span
    ms = np.array([Fraction(p * (2 * j + 1) if j else p, 1 << a) for j in range(per)], dtype=object)
    low, high = out[0] - (0 if out[0] else 128), out[1] - (0 if out[0] else 128)
    pl = plan([(lo, hi, ms)], low, high)
    ties = (rng.integers(lo >> a, (hi >> a) + 1, 300) << a) + (1 << (a - 1))
    v = np.unique(np.concatenate([ties, ties - 1, ties + 1, [lo, hi, 0], rng.integers(lo, hi + 1, 100)]))
    v = v[(v >= lo) & (v <= hi)].astype(np.int64)[:, None]
    exact = np.vectorize(lambda x, mm: min(max(round(int(x) * mm), low), high), otypes=[np.int64])(
        v.astype(object), ms[None, :])
    if not pl.even:  # no tie in the clipped interval, or labels too wide: today's plan, within its bound
        return
    assert pl.pre_shift == 0 and pl.delta == 0
    w = np.clip(v, *pl.clip) if pl.clip else v
    t = w * pl.multipliers[0][None, :]
    k, b = pl.shift, (1 << (pl.even - 1)) - 1
    assert tight(int(np.abs(w).max()) if pl.clip is None else max(-pl.clip[0], pl.clip[1])) + \
        tight(int(pl.multipliers[0].max())) <= 31 and pl.even + k + 1 <= 31
    halves = [np.clip((t + c + (1 << k)) >> (k + 1), -b, b) for c in ((1 << (k - 1)) - 1, -(1 << (k - 1)))]
    assert np.array_equal(np.clip(halves[0] + halves[1], low, high), exact)


def add_qdq(sa: float, sb: float, so: float, z_out: int, otype: int) -> onnx.ModelProto:
    """x (int8) at scale sa, requantized to sb (QuantizeLinear, DequantizeLinear), the two added, QuantizeLinear(so,
    z_out): an Add of terms at scales sa and sb."""
    onp = np.int8 if otype == T.INT8 else np.uint8
    nodes = [h.make_node("DequantizeLinear", ["x", "sa"], ["af"]), h.make_node("QuantizeLinear", ["af", "sb"], ["q"]),
             h.make_node("DequantizeLinear", ["q", "sb"], ["bf"]), h.make_node("Add", ["af", "bf"], ["s"]),
             h.make_node("QuantizeLinear", ["s", "so", "zo"], ["y"])]
    inits = [nh.from_array(np.array(sa, np.float32), "sa"), nh.from_array(np.array(sb, np.float32), "sb"),
             nh.from_array(np.array(so, np.float32), "so"), nh.from_array(np.array(z_out, onp), "zo")]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.INT8, [1, 4, 8, 8])],
                     [h.make_tensor_value_info("y", otype, None)], inits)
    return onnx_model(g, 17)


@settings(max_examples=25, deadline=None)
@given(ea=st.integers(-3, 3), eb=st.integers(-3, 3), otype=st.sampled_from([T.INT8, T.UINT8]),
       seed=st.integers(0, 2**16))
def test_an_add_of_dyadic_ratios_rounds_ties_as_quantize_linear(ea, eb, otype, seed):
    """An Add of two terms whose scales are the output's times 2^ea and 2^eb (a sum: k the larger of their
    exponents): the CVM graph equals the exact oracle on every value, ties included, and so does onnxruntime (its
    float32 arithmetic is exact on powers of two)."""
    so = 2.0 ** -6
    m = add_qdq(so * 2.0 ** ea, so * 2.0 ** eb, so, 0 if otype == T.INT8 else 128, otype)
    x = np.random.default_rng(seed).integers(-127, 128, size=(1, 4, 8, 8))
    imp, got = cvm(m, x)
    want = Exact(m, imp).run(x)[0][1]
    assert np.array_equal(got.reshape(want.shape), want)
    assert np.array_equal(onnxruntime(m, x.astype(np.int8)).astype(np.int64), want)
    sums = [r.plan for r in imp.requants if r.plan is not None and len(r.plan.multipliers) == 2]
    assert len(sums) == 1 and bool(sums[0].even) == (min(ea, eb) < 0)  # ties only where some ratio is not whole


@settings(max_examples=20, deadline=None)
@given(c_out=st.integers(2, 6), ew=st.lists(st.integers(-9, -3), min_size=6, max_size=6), ex=st.integers(-8, -4),
       eo=st.integers(-6, 0), otype=st.sampled_from([T.INT8, T.UINT8]), seed=st.integers(0, 2**16))
def test_a_conv_of_power_of_two_scales_rounds_ties_per_channel(c_out, ew, ex, eo, otype, seed):
    """A QDQ Conv whose input, per-channel weight and output scales are powers of two (M = 2^(ex + ew_c - eo) per
    channel, many values at ties): the CVM graph equals the exact oracle and onnxruntime on every value."""
    rng = np.random.default_rng(seed)
    onp = np.int8 if otype == T.INT8 else np.uint8
    w = rng.integers(-127, 128, size=(c_out, 2, 3, 3))
    nodes = [h.make_node("DequantizeLinear", ["x", "sx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"], axis=0),
             h.make_node("Conv", ["xf", "wf"], ["cf"], pads=[1, 1, 1, 1]),
             h.make_node("QuantizeLinear", ["cf", "so", "zo"], ["y"])]
    inits = [nh.from_array(np.array(2.0 ** ex, np.float32), "sx"), nh.from_array(w.astype(np.int8), "w"),
             nh.from_array(np.array([2.0 ** e for e in ew[:c_out]], np.float32), "sw"),
             nh.from_array(np.array(2.0 ** eo, np.float32), "so"),
             nh.from_array(np.array(0 if otype == T.INT8 else 128, onp), "zo")]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.INT8, [1, 2, 5, 5])],
                     [h.make_tensor_value_info("y", otype, None)], inits)
    m = onnx_model(g, 17)
    x = rng.integers(-127, 128, size=(1, 2, 5, 5))
    imp, got = cvm(m, x)
    want = Exact(m, imp).run(x)[0][1]
    assert np.array_equal(got.reshape(want.shape), want)
    assert np.array_equal(onnxruntime(m, x.astype(np.int8)).astype(np.int64), want)
    assert all(p.even for r in imp.requants for p in r.plans)  # every M non-integer, its ties within reach


# -- the issue's hidden case ----------------------------------------------------------------------------------------
def hidden_case(tmp_path) -> onnx.ModelProto:
    """A depthwise 3x3 Conv (group 8) + a pointwise Conv + Relu + a 2x2 AveragePool + Flatten + Gemm, input
    (1, 8, 8, 8), quantized by onnxruntime.quantization (QDQ, int8 activations and weights, symmetric, MinMax)."""
    from onnxruntime import quantization
    rng = np.random.default_rng(39)
    inits = [nh.from_array(rng.normal(size=(8, 1, 3, 3)).astype(np.float32), "dw"),
             nh.from_array(rng.normal(size=(8,)).astype(np.float32), "db"),
             nh.from_array((rng.normal(size=(8, 8, 1, 1)) / 3).astype(np.float32), "pw"),
             nh.from_array(rng.normal(size=(8,)).astype(np.float32), "pb"),
             nh.from_array((rng.normal(size=(128, 10)) / 8).astype(np.float32), "gw"),
             nh.from_array(rng.normal(size=(10,)).astype(np.float32), "gb")]
    nodes = [h.make_node("Conv", ["x", "dw", "db"], ["d"], group=8, pads=[1, 1, 1, 1]),
             h.make_node("Conv", ["d", "pw", "pb"], ["c"]), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("AveragePool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("Flatten", ["p"], ["f"]), h.make_node("Gemm", ["f", "gw", "gb"], ["y"])]
    g = h.make_graph(nodes, "hidden", [h.make_tensor_value_info("x", T.FLOAT, [1, 8, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    onnx.save(onnx_model(g, 17), tmp_path / "f.onnx")
    quantization.quantize_static(
        str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader([1, 8, 8, 8], seed=1, n=8),
        quant_format=quantization.QuantFormat.QDQ, activation_type=quantization.QuantType.QInt8,
        weight_type=quantization.QuantType.QInt8, calibrate_method=quantization.CalibrationMethod.MinMax,
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
    return onnx.load(tmp_path / "q.onnx")


def integer_tail(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model from its input's integers (the first QuantizeLinear's output) to the last QuantizeLinear's
    integers (the trailing DequantizeLinear cut)."""
    g = model.graph
    first = next(n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == g.input[0].name)
    last = [n for n in g.node if n.op_type == "QuantizeLinear"][-1]
    keep = [n for n in g.node
            if n is not first and not (n.op_type == "DequantizeLinear" and n.input[0] == last.output[0])]
    for n in keep:
        n.input[:] = ["x" if i == first.output[0] else i for i in n.input]
    graph = h.make_graph(keep, "tail", [h.make_tensor_value_info("x", T.INT8, [1, 8, 8, 8])],
                         [h.make_tensor_value_info(last.output[0], T.INT8, None)], list(g.initializer))
    return onnx_model(graph, 17)


def test_the_issues_hidden_case_equals_the_exact_oracle(tmp_path):
    """The issue's hidden case, from its input's integers: onnxruntime equals the exact oracle on every output, and
    so does the import with two-part products (52% before, 5 steps at worst: the 2x2 pool's M = 1/4 rounded its
    ties half up; one part's remaining distance is its convolutions' coarser products near half-integers)."""
    m = integer_tail(hidden_case(tmp_path))
    rng = np.random.default_rng(0)
    equal = total = 0
    for _ in range(24):
        q = rng.integers(-127, 128, size=(1, 8, 8, 8))
        imp, got = cvm(m, q, two_part=True)
        want = Exact(m, imp).run(q)[0][1]
        [ref] = ort_session(m).run(None, {m.graph.input[0].name: q.astype(np.int8)})  # exact on AVX2 too
        ref = ref.astype(np.int64)
        equal += int((got.reshape(want.shape) == want).sum())
        total += want.size
        assert np.array_equal(ref, want)
    assert any(r.plan is not None and r.plan.even for r in imp.requants)  # the pool's M = 1/4: ties met
    assert equal == total, f"{equal} of {total} outputs equal the exact oracle"
