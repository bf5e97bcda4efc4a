"""InstanceNormalization between DequantizeLinear and QuantizeLinear (style-transfer nets; torch's GroupNorm export,
Reshape(N, G, -1) -> InstanceNormalization(ones, zeros) -> Reshape -> Mul gamma -> Add beta) and GroupNormalization
(opset 21): LayerNormalization's integer form over each (n, c)'s or (n, group)'s values, its scale and B per channel
(docs/import.md, "LayerNormalization: the integer form and its bound"). Each was refused before ('no CVM op for ONNX
InstanceNormalization', and GroupNormalization)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import layernorm_oracle, qdq
from test_quantized_rules import NP, draw_x, imported, layernorm_model, ort_session, scales

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.from_onnx.quantized import norm
from cvm_onnx.core.errors import CVMError, UnsupportedError
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify


def instance_norm_model(shape, x_type, s, zx, eps, gamma, sg, beta, float_params: bool, so, zo, out_type,
                        groups: int = 0):
    """DequantizeLinear -> InstanceNormalization(scale, B) -> QuantizeLinear, scale and B per channel as
    quantize_static writes them (scale int8 at sg, B int32 at s * sg) or float; ``groups``: GroupNormalization
    (opset 21) of that many groups instead."""
    inits = {"s": np.float32(s), "zx": NP[x_type](zx), "so": np.float32(so), "zo": NP[out_type](zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"])]
    if float_params:
        inits["gf"] = (gamma * np.float32(sg)).astype(np.float32)
        inits["bf"] = (beta * np.float32(np.float32(s) * np.float32(sg))).astype(np.float32)
    else:
        inits.update(g=gamma.astype(np.int8), sg=np.float32(sg), b=beta.astype(np.int32),
                     sb=np.float32(np.float32(s) * np.float32(sg)))
        nodes += [h.make_node("DequantizeLinear", ["g", "sg"], ["gf"]),
                  h.make_node("DequantizeLinear", ["b", "sb"], ["bf"])]
    nodes += [h.make_node("GroupNormalization", ["xf", "gf", "bf"], ["yf"], epsilon=eps, num_groups=groups,
                          name="in") if groups else
              h.make_node("InstanceNormalization", ["xf", "gf", "bf"], ["yf"], epsilon=eps, name="in"),
              h.make_node("QuantizeLinear", ["yf", "so", "zo"], ["y"])]
    return qdq(nodes, shape, x_type, inits, out_type, opset=21 if groups else 17), inits


def exact_params(inits, float_params: bool) -> tuple[list[Fraction], list[Fraction]]:
    """The channels' scale and B as the model's exact reals."""
    if float_params:
        return [Fraction(float(v)) for v in inits["gf"]], [Fraction(float(v)) for v in inits["bf"]]
    return ([int(v) * Fraction(float(inits["sg"])) for v in inits["g"]],
            [int(v) * Fraction(float(inits["sb"])) for v in inits["b"]])


def check(shape, x_type, out_type, s, so, eps, sg, float_params, zx, zo, gamma, beta, x, groups: int = 0):
    """The import's output on x: equal to the integer form's oracle (LayerNormalization's, each group's rows with
    its channels' scale and B), every unsaturated output within 1/2 + delta of the exact normalization (float64),
    onnxruntime's QDQ model within one step on the rows that are not constant (on a constant row its float32
    E[x^2] - E[x]^2 may be negative, and a tiny epsilon then makes its output NaN: 0 where B is 10 steps), the
    export exact."""
    c, size = shape[1], math.prod(shape[2:])
    k = groups or c
    n = c // k * size
    m, inits = instance_norm_model(shape, x_type, s, zx, eps, gamma, sg, beta, float_params, so, zo, out_type,
                                   groups)
    g, b = exact_params(inits, float_params)
    imp, got = imported(m, x)
    [p] = [r.layernorm for r in imp.requants if r.layernorm]
    s_, so_, eps_ = (Fraction(float(np.float32(v))) for v in (s, so, eps))
    lo, hi = (-128, 127) if out_type == T.INT8 else (0, 255)
    stored, u, y = (v.reshape(shape[0], k, n) for v in (x, x - zx, got))
    for j in range(k):
        channels = [j * (c // k) + i // size for i in range(n)]
        want = layernorm_oracle(stored[:, j], (shape[0], n), s_, eps_, [g[i] for i in channels], [b[i] for i in channels],
                                so_, zo, lo, hi, p)
        assert np.array_equal(y[:, j], want)
    xr = u * float(s_)
    dev = xr - xr.mean(axis=2, keepdims=True)
    normed = (dev / np.sqrt((dev * dev).mean(axis=2, keepdims=True) + float(eps_))).reshape(shape[0], c, size)
    exact = ((normed * np.array([float(q) for q in g])[:, None] + np.array([float(q) for q in b])[:, None]) /
             float(so_) + zo).reshape(y.shape)
    inside = (y > lo) & (y < hi)
    assert (np.abs(y - exact)[inside] <= p.error + 1e-6).all()
    assert p.delta < Fraction(1, 2)
    [ort_y] = ort_session(m).run(None, {"x": x.astype(NP[x_type])})
    varied = np.broadcast_to(u.min(axis=2, keepdims=True) < u.max(axis=2, keepdims=True), u.shape)
    assert (np.abs(y - ort_y.astype(np.int64).reshape(y.shape))[varied] <= 1 + int(p.error)).all()
    return p


@settings(max_examples=16, deadline=None)
@given(d=st.data(), shape=st.lists(st.integers(1, 5), min_size=3, max_size=4).map(tuple),
       x_type=st.sampled_from([T.INT8, T.UINT8]), out_type=st.sampled_from([T.INT8, T.UINT8]), s=scales,
       eps=st.sampled_from([1e-12, 1e-6, 1e-5, 1e-2, 1.0]), sg=st.floats(2.0**-9, 2.0**-5, width=32),
       float_params=st.booleans(), kind=st.sampled_from(["any", "extremes", "constant rows"]), grouped=st.booleans())
def test_instance_norm_equals_its_integer_form_within_its_bound(d, shape, x_type, out_type, s, eps, sg,
                                                              float_params, kind, grouped):
    """InstanceNormalization, or GroupNormalization of any group count, over any spatial shape and channel count,
    scale and B quantized or float, any epsilon, extreme and constant rows: the oracle exactly, the exact value
    within the bound, onnxruntime's QDQ model within one step."""
    c = shape[1]
    groups = d.draw(st.sampled_from([k for k in range(1, c + 1) if c % k == 0])) if grouped else 0
    zx = d.draw(st.integers(*((-128, 127) if x_type == T.INT8 else (0, 255))))
    zo = d.draw(st.integers(*((-128, 127) if out_type == T.INT8 else (0, 255))))
    gamma = np.asarray(d.draw(st.lists(st.integers(-127, 127), min_size=c, max_size=c)), np.int64)
    beta = np.asarray(d.draw(st.lists(st.integers(-2**12, 2**12), min_size=c, max_size=c)), np.int64)
    # the output scale as calibrated: the widest |gamma| sqrt(n - 1) + |beta| over 127 steps, or finer
    n = math.prod(shape[2:]) * (c // groups if groups else 1)
    reach = float(np.abs(gamma).max() * sg * math.sqrt(max(n - 1, 1)) + np.abs(beta).max() * s * sg) or 1.0
    so = reach / d.draw(st.sampled_from([20, 127, 250]))
    x = draw_x(d, shape, x_type)
    info = np.iinfo(NP[x_type])
    if kind == "extremes":
        x = np.where(x % 2 == 0, int(info.min), int(info.max))
    elif kind == "constant rows":
        x = np.broadcast_to(x.reshape(-1, n)[:, :1], (x.size // n, n)).reshape(shape).copy()
    check(shape, x_type, out_type, s, so, eps, sg, float_params, zx, zo, gamma, beta, x, groups)


@pytest.mark.parametrize("n, c", [(4096, 2), (8192, 2), (12288, 2), (12288, 1)])
def test_a_group_whose_sum_of_squares_passes_32_bits_is_exact(n, c):
    """Groups of 4096 to 12288 values (a UNet's GroupNorm: n^2 max|u|^2 far past 32 bits, the quartered form; past
    8191 values the sum of squares in parts of 4096), extremes in one row: the oracle exactly, within the bound.
    8192 and 12288 were refused before ('passes 32 bits in its variance'); one row alone failed at its parts' sums
    (an internal error: their shape)."""
    rng = np.random.default_rng(n)
    shape = (1, c, n)
    x = rng.integers(0, 256, shape)
    x[0, c - 1, ::2], x[0, c - 1, 1::2] = 0, 255
    p = check(shape, T.UINT8, T.INT8, 0.02, 0.04, 1e-5, 0.01, False, 128, 0, np.array([100, -90][:c]),
              np.array([300, -7][:c]), x)
    assert p.quarter


@st.composite
def wide_groups(draw):
    """(shape, groups): 1 or 2 groups of n = channels per group x positions values past the quartered form's limit
    (16384 <= n <= 40000; positions a multiple of 64, as an image's are)."""
    cpg, size = draw(st.sampled_from([1, 2, 3, 5, 8])), 64 * draw(st.integers(32, 625))
    assume(16384 <= cpg * size <= 40000)
    k = draw(st.sampled_from([1, 2])) if cpg * size <= 20000 else 1
    return (1, cpg * k, size), k


@settings(max_examples=4, deadline=None)
@given(d=st.data(), case=wide_groups(), x_type=st.sampled_from([T.INT8, T.UINT8]),
       out_type=st.sampled_from([T.INT8, T.UINT8]), s=st.floats(2.0**-12, 2.0**-7, width=32),
       eps=st.sampled_from([1e-5, 1e-3, 1.0]),
       sg=st.floats(2.0**-9, 2.0**-5, width=32), float_params=st.booleans(),
       kind=st.sampled_from(["any", "extremes", "narrow", "constant rows"]), reach=st.sampled_from([4, 16, 127]))
def test_a_wide_group_equals_its_integer_form_within_its_bound(d, case, x_type, out_type, s, eps, sg, float_params,
                                                            kind, reach):
    """GroupNormalization over groups of 16384 to 40000 values (the wide form: V's bucket from Y, D pre-shifted),
    input scales up to 2^-7, scale and B quantized or float, an output of +-4 to +-127 standard deviations: the oracle
    exactly (every integer step recomputed), the exact value within the bound, onnxruntime within one step.
    Refused before ('passes 32 bits in its variance')."""
    shape, k = case
    c = shape[1]
    zx = d.draw(st.integers(*((-128, 127) if x_type == T.INT8 else (0, 255))))
    zo = d.draw(st.integers(*((-128, 127) if out_type == T.INT8 else (0, 255))))
    gamma = np.asarray(d.draw(st.lists(st.integers(-127, 127), min_size=c, max_size=c)), np.int64)
    beta = np.asarray(d.draw(st.lists(st.integers(-2**12, 2**12), min_size=c, max_size=c)), np.int64)
    so = float(np.abs(gamma).max() * sg * reach + np.abs(beta).max() * s * sg or 1.0) / 127
    rng = np.random.default_rng(d.draw(st.integers(0, 2**32 - 1)))
    info = np.iinfo(NP[x_type])
    x = rng.integers(int(info.min), int(info.max) + 1, shape)
    if kind == "extremes":
        x = np.where(x % 2 == 0, int(info.min), int(info.max))
    elif kind == "narrow":  # a spread of a few integers: V near its least nonzero values
        x = np.clip(zx + rng.integers(-1, 2, shape) * (rng.random(shape) < 0.01), info.min, info.max)
    elif kind == "constant rows":
        x = np.broadcast_to(x.reshape(k, -1)[:, :1], (k, x.size // k)).reshape(shape).copy()
    p = check(shape, x_type, out_type, s, so, eps, sg, float_params, zx, zo, gamma, beta, x, k)
    assert p.wide


@pytest.mark.parametrize("s, so", [(0.0453, 0.04), (3242.0, 0.125)])
def test_a_wide_row_of_low_variance_reads_its_exact_variance(s, so):
    """The terrain UNet's InstanceNormalizations over 16384 values (uint8 rows at an input scale of 0.045, and of
    3242: G = eps n^2 / s^2 near 0), about 25 output steps per standard deviation: rows of a few integers' spread
    (V near n - 1) read their exact V (the wide form's small rows), the oracle exactly, within the bound. Refused
    before ('no integer form within half a step': Y's unit read them too coarsely)."""
    rng = np.random.default_rng(7)
    shape = (2, 2, 16384)
    x = np.full(shape, 131)
    x[0, 0, rng.integers(0, 16384, 3)] = 130  # V = 3 (n - 3)
    x[0, 1] += rng.integers(-2, 3, 16384) * (rng.random(16384) < 0.05)
    x[1, 0] = rng.integers(0, 256, 16384)
    x[1, 1, ::2], x[1, 1, 1::2] = 0, 255
    p = check(shape, T.UINT8, T.INT8, s, so, 1e-5, 0.01, False, 128, 0, np.array([100, -90]), np.array([300, -7]), x)
    assert p.wide and p.wide.cap


@settings(max_examples=4, deadline=None)
@given(d=st.data(), size=st.integers(256, 512).map(lambda k: 64 * k), x_type=st.sampled_from([T.INT8, T.UINT8]),
       s=st.sampled_from([2.0**-7, 0.03, 0.1, 3242.0, 2.0**28]), eps=st.sampled_from([1e-6, 1e-5]),
       spread=st.integers(1, 6), share=st.sampled_from([1e-4, 1e-2, 0.3]), steps=st.sampled_from([4, 25, 100]))
def test_wide_rows_of_low_variance_equal_their_integer_form(d, size, x_type, s, eps, spread, share, steps):
    """Groups of 16384 to 32768 values (the wide form's exact V for small rows) whose values lie within a few
    integers of one (V from n - 1 up), any input scale (G = eps n^2 / s^2 from far above Y's unit to near 0), 4 to
    100 output steps per standard deviation (fewer where beta's 64 steps set the output scale): the oracle exactly,
    within the bound, onnxruntime within one step."""
    info = np.iinfo(NP[x_type])
    zx = d.draw(st.integers(int(info.min), int(info.max)))
    rng = np.random.default_rng(d.draw(st.integers(0, 2**32 - 1)))
    shape = (2, 1, size)
    x = np.clip(zx + rng.integers(-spread, spread + 1, shape) * (rng.random(shape) < share), info.min, info.max)
    gamma, beta = np.array([d.draw(st.sampled_from([-127, -50, 90, 127]))]), np.array([d.draw(st.integers(-99, 99))])
    so = max(abs(int(gamma[0])) * 0.01 / steps, abs(int(beta[0])) * s * 0.01 / 64)  # beta within 64 steps
    p = check(shape, x_type, T.INT8, s, so, eps, 0.01, False, zx, 0, gamma, beta, x)
    assert p.wide and p.wide.cap


def test_a_wide_row_is_compared_on_the_integers_the_import_reads():
    """The wide form's Y floors sums of u = x - c, which a shift of x changes: the oracle is given the stored
    integers, as the import reads them. Given x - z (int8 at z = -111, c = -1), its Y was 17199 where the import's
    is 17200 (another bucket: 1210 outputs one step apart, both within the bound)."""
    size, zx, gamma, beta, steps, s = 29056, -111, -127, 50, 25, 0.03
    rng = np.random.default_rng(5610)
    shape = (2, 1, size)
    x = np.clip(zx + rng.integers(-3, 4, shape) * (rng.random(shape) < 0.3), -128, 127)
    so = max(abs(gamma) * 0.01 / steps, abs(beta) * s * 0.01 / 64)
    p = check(shape, T.INT8, T.INT8, s, so, 1e-6, 0.01, False, zx, 0, np.array([gamma]), np.array([beta]), x)
    assert p.wide and p.centre != 0


def test_instance_norm_refusals_name_the_node():
    """Epsilon 0, a scale of the wrong length, rank 2, groups that do not divide the channels: one line each naming
    the node and the rule."""
    g, b = np.ones(3, np.int64), np.zeros(3, np.int64)
    m, _ = instance_norm_model((1, 3, 4), T.UINT8, 0.1, 0, 0.0, g, 0.01, b, False, 0.05, 0, T.UINT8)
    with pytest.raises(CVMError, match=r"in \(InstanceNormalization\): .*epsilon must be > 0"):
        import_model(m, input_precision=9)
    m, _ = instance_norm_model((1, 3, 4), T.UINT8, 0.1, 0, 1e-5, np.ones(2, np.int64), 0.01, np.zeros(2, np.int64),
                               True, 0.05, 0, T.UINT8)
    with pytest.raises(CVMError, match=r"in \(InstanceNormalization\): .*scale of 2 values for 3 channels"):
        import_model(m, input_precision=9)
    m, _ = instance_norm_model((2, 3), T.UINT8, 0.1, 0, 1e-5, g, 0.01, b, True, 0.05, 0, T.UINT8)
    with pytest.raises(CVMError, match=r"in \(InstanceNormalization\): .*of rank 2 \(at least 3"):
        import_model(m, input_precision=9)
    m, _ = instance_norm_model((1, 3, 4), T.UINT8, 0.1, 0, 1e-5, g, 0.01, b, True, 0.05, 0, T.UINT8, groups=2)
    with pytest.raises(CVMError, match=r"in \(GroupNormalization\): .*num_groups 2 must divide the 3 channels"):
        import_model(m, input_precision=9)


@pytest.mark.parametrize("op", ["LayerNormalization", "InstanceNormalization", "GroupNormalization"])
def test_rows_past_the_widest_planned_are_refused_before_their_constants_are_read(op, monkeypatch):
    """Rows of 2^17 values (past MAX_WIDE = 65536): refused in one line naming the node and the rule before any
    work per position or channel (no scale or bias made exact: a LayerNormalization over 2^20 values took 24 s to
    be refused, making a Fraction of each gamma first)."""
    monkeypatch.setattr(norm, "real_values", unread)
    n = 1 << 17
    if op == "LayerNormalization":
        m, _ = layernorm_model((1, n), -1, T.UINT8, 0.02, 128, 1e-5, np.ones(n, np.int64), 0.01, None, False, 0.05, 0,
                               T.UINT8)
        name = "ln"
    else:
        g, b = np.ones(4, np.int64), np.zeros(4, np.int64)
        shape = (1, 1, n) if op == "InstanceNormalization" else (1, 4, n // 4)
        m, _ = instance_norm_model(shape, T.UINT8, 0.02, 128, 1e-5, g[:shape[1]], 0.01, b[:shape[1]], False, 0.05, 0,
                                   T.UINT8, groups=0 if op == "InstanceNormalization" else 1)
        name = "in"
    with pytest.raises(CVMError, match=rf"{name} \({op}\): a LayerNormalization over {n} values: its integer form "
                                       r"takes rows of at most 65536 values"):
        import_model(m, input_precision=9)


@pytest.mark.parametrize("float_params", [False, True])
def test_more_distinct_pairs_than_planned_are_refused_before_they_are_made_exact(float_params, monkeypatch):
    """A LayerNormalization over 20000 positions of 20000 distinct (gamma, beta) pairs (past MAX_PAIRS = 16384),
    quantized or float: refused in one line before a Fraction of each is made (13 s at 65536 values before)."""
    monkeypatch.setattr(norm, "real_values", unread)
    n = 20000
    m, _ = layernorm_model((1, n), -1, T.UINT8, 0.01, 0, 1e-5, np.arange(n) % 127 + 1, 0.01, np.arange(n),
                           float_params, 0.05, 0, T.UINT8)
    with pytest.raises(CVMError, match=r"ln \(LayerNormalization\): a LayerNormalization over 20000 values with 20000 "
                                       r"distinct \(gamma, beta\) pairs"):
        import_model(m, input_precision=9)


def unread(*args, **kwargs):
    raise AssertionError("a constant was made exact before the plan's bounds were checked")


def group_norm_block(shape, groups: int, layers: int, seed: int = 0) -> onnx.ModelProto:
    """A float UNet block as torch exports it: Conv, then ``layers`` times GroupNorm (Reshape(N, G, -1),
    InstanceNormalization reading one shared ones scale and zeros bias, Reshape back, Mul gamma, Add beta) and
    SiLU, a Conv between."""
    rng = np.random.default_rng(seed)
    n, c_in, hw = shape[0], shape[1], shape[2:]
    c = 2 * groups
    nodes = [h.make_node("Conv", ["x", "w0", "b0"], ["a0"], pads=[1, 1, 1, 1])]
    inits = [nh.from_array(rng.normal(size=(c, c_in, 3, 3)).astype(np.float32), "w0"),
             nh.from_array(rng.normal(size=c).astype(np.float32), "b0"),
             nh.from_array(np.array([n, groups, -1], np.int64), "groups"),
             nh.from_array(np.array([n, c, *hw], np.int64), "back"),
             nh.from_array(np.ones(groups, np.float32), "ones"), nh.from_array(np.zeros(groups, np.float32), "zeros")]
    for i in range(layers):
        a, z = f"a{i}", f"a{i + 1}"
        nodes += [h.make_node("Reshape", [a, "groups"], [f"r{i}"]),
                  h.make_node("InstanceNormalization", [f"r{i}", "ones", "zeros"], [f"i{i}"], epsilon=1e-5),
                  h.make_node("Reshape", [f"i{i}", "back"], [f"u{i}"]),
                  h.make_node("Mul", [f"u{i}", f"g{i}"], [f"m{i}"]), h.make_node("Add", [f"m{i}", f"be{i}"], [f"n{i}"]),
                  h.make_node("Sigmoid", [f"n{i}"], [f"sg{i}"]), h.make_node("Mul", [f"n{i}", f"sg{i}"], [f"s{i}"]),
                  h.make_node("Conv", [f"s{i}", f"w{i + 1}", f"b{i + 1}"], [z], pads=[1, 1, 1, 1])]
        inits += [nh.from_array(rng.uniform(0.5, 1.5, (c, 1, 1)).astype(np.float32), f"g{i}"),
                  nh.from_array(rng.normal(scale=0.3, size=(c, 1, 1)).astype(np.float32), f"be{i}"),
                  nh.from_array((rng.normal(size=(c, c, 3, 3)) / 6).astype(np.float32), f"w{i + 1}"),
                  nh.from_array(rng.normal(size=c).astype(np.float32), f"b{i + 1}")]
    g = h.make_graph(nodes, "unet_block", [h.make_tensor_value_info("x", T.FLOAT, list(shape))],
                     [h.make_tensor_value_info(f"a{layers}", T.FLOAT, [n, c, *hw])], inits)
    return onnx_model(g, 17)


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_group_norm_unet_block_quantizes_whole(tmp_path, per_channel):
    """`quantize` of a float UNet block with torch's GroupNorm export (two GroupNorms sharing their ones and
    zeros): imported whole, as close to float as onnxruntime's quantized model (1.1x), exported exactly.
    Refused before: 'no CVM op for ONNX InstanceNormalization'."""
    rng = np.random.default_rng(1)
    onnx.save(group_norm_block((1, 3, 8, 8), 4, 2), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(8, 3, 8, 8)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m", per_channel=per_channel)
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps
    assert verify(done.imported.graph, None, seeds=2).exact


def test_a_float_group_normalization_quantizes_whole(tmp_path):
    """`quantize` of a float model holding GroupNormalization (opset 21) itself: written as torch's GroupNorm export
    before onnxruntime's optimizer (``group_norms_as_instance_norms``), imported whole, as close to float as
    onnxruntime's quantized model (1.1x), exported exactly. Refused before: the optimizer inlined its function, and
    the import stopped at its Div ('the divisor (Sqrt) must be quantized first')."""
    rng = np.random.default_rng(2)
    inits = [nh.from_array(rng.normal(size=(8, 3, 3, 3)).astype(np.float32), "w"),
             nh.from_array(rng.normal(size=8).astype(np.float32), "b"),
             nh.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "g"),
             nh.from_array(rng.normal(scale=0.3, size=8).astype(np.float32), "be")]
    g = h.make_graph([h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                      h.make_node("GroupNormalization", ["c", "g", "be"], ["n"], num_groups=4, epsilon=1e-5),
                      h.make_node("Relu", ["n"], ["y"])], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 8, 8, 8])], inits)
    onnx.save(onnx_model(g, 21), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(8, 3, 8, 8)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, None, seeds=2).exact


@pytest.mark.parametrize("s, groups", [(3e38, 0), (1e17, 2), (3e38, 2)])
def test_a_norm_whose_float32_variance_overflows_is_refused_naming_it(s, groups):
    """Instance- or GroupNormalization at an input scale where a row's float32 variance passes float32's range
    (onnxruntime: inf or NaN, its output the zero point): refused in one line naming the node (at 3e38 the input's
    own values pass it: its DequantizeLinear); at 1e15 over 8 values still imported. Regression: imported exactly, 2
    output steps from onnxruntime's NaN (the newest13 hunt on the 32768-value InstanceNormalization seed, input scale
    3e38)."""
    args = ((1, 4, 8), T.UINT8, s, 128, 1e-5, np.array([3, -5, 7, 100]), 0.01, np.array([40, -7, 0, 900]), False,
            0.04, 0, T.UINT8, groups)
    with pytest.raises(UnsupportedError) as e:
        import_model(instance_norm_model(*args)[0], input_precision=9)
    if s * 128 >= 2.0**128 - 2.0**103:
        assert all("(DequantizeLinear): " in str(p) and "past float32's range" in p.rule for p in e.value.problems)
    else:
        [p] = e.value.problems
        op = "GroupNormalization" if groups else "InstanceNormalization"
        assert f"({op}): " in str(p) and "pass float32's range in their variance" in p.rule, p
    import_model(instance_norm_model(*args[:2], 1e15, *args[3:])[0], input_precision=9)
