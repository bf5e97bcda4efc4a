"""A model that ends at its masked mean pooling: the Div is a float output (quantize_static puts no QuantizeLinear
after it), quantized as a float tail: int16, zero point 0, the least float32 s with 32767 s >= m, m the least of
max|a| / min|b|, b's interval clipped by its deferred Clip, and for a masked mean max|a| / (T w), w its least kept
weight ("Quotients of sums" in docs/import.md). Before: 'a float output (Div) computed after the last
QuantizeLinear has no integer form here'."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.quantized import qdq, quantizes_whole
from test_masked_pooling16 import RANGE, SCALES, check, f, ids_model, least_c, masked_inputs, masked_mean_qdq, oracle
from test_quantize_fresh15 import padded_ids
from test_quantized_fresh_ops import NP, draw_x

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.from_onnx.quantized.chains import least_weight
from cvm_onnx.core.errors import CVMError
from cvm_onnx.core.executor import execute

INT16 = (-32768, 32767)


def ending_at_the_div(model):
    """``model`` with its last node (the QuantizeLinear after the Div) removed: the Div's float output is the
    graph's."""
    div = model.graph.node[-1].input[0]
    del model.graph.node[-1]
    del model.graph.output[:]
    model.graph.output.extend([h.make_tensor_value_info(div, T.FLOAT, None)])
    return model


def least_float32_scale(m: Fraction) -> Fraction:
    """The least float32 s with 32767 s >= m."""
    s = np.float32(float(m) / 32767)
    while Fraction(float(s)) * 32767 < m:
        s = np.nextafter(s, np.float32(np.inf))
    while Fraction(float(np.nextafter(s, np.float32(0)))) * 32767 >= m:
        s = np.nextafter(s, np.float32(0))
    return Fraction(float(s))


def mean_grid(t: int, zp: int, sp: float, least: float, count: str) -> Fraction:
    """The float output's scale: the least float32 s with 32767 s >= m, m the least of the quotient's bound T P s_p /
    least (P = max|t_p - z_p|) and, for a masked mean (a count of the mask on its grid or of its float Cast, not
    requantized), its bound P s_p / w, w the least kept weight: 255 steps of 1/255 on the grid, 1 in float."""
    bounds = [t * max(zp, 255 - zp) * f(sp) / f(least)]
    if count != "qdq":
        bounds.append(Fraction(float(max(zp, 255 - zp) * f(sp) / (255 * f(1 / 255) if count == "grid" else 1))))
    return least_float32_scale(min(bounds))


@settings(max_examples=30, deadline=None)
@given(d=st.data(), x_type=st.sampled_from([T.INT8, T.UINT8]), sx=SCALES, sp=SCALES,
       least=st.sampled_from([1.0, 0.5, 3.0, 0.25, 1e-9, 1e-3]), form=st.sampled_from(["clip", "max"]),
       count=st.sampled_from(["grid", "float", "qdq"]), expand=st.booleans())
def test_a_masked_mean_as_the_float_output_is_within_its_bound_at_its_grid(d, x_type, sx, sp, least, form, count,
                                                                             expand):
    """Property: a masked mean ending the model (one token to 16 or 1200, scales 2^-10 to 16, zero points, masks
    with rows all masked and all kept, x at its type's ends, the count clipped at 1e-9 to 3) takes the int16 grid of
    ``mean_grid``, every exact quotient within it (no output saturates), every output within the documented bound of
    the exact quotient at that grid, equal to it away from half-integers, an all-masked row 0."""
    if count == "float":  # a float count is integers: a bound off them is refused by the integer Clip
        least = max(1.0, float(round(least)))
    if count == "qdq":  # a requantized count may round a kept token's weight to 0: a / lo has no bound near 0
        least = max(least, 0.25)
    b, t, c = d.draw(st.integers(1, 3)), d.draw(st.integers(1, 16) | st.just(1200)), d.draw(st.integers(1, 4))
    assume(t > least)  # a count never above the bound: the Clip leaves one value, the Div folds to a / least
    lo, hi = RANGE[x_type]
    zx, zp = d.draw(st.integers(lo, hi)), d.draw(st.integers(0, 255))
    rng = np.random.default_rng(d.draw(st.integers(0, 2 ** 16)))
    x, m = masked_inputs(rng, (b, t, c), lo, hi)
    model = ending_at_the_div(masked_mean_qdq((b, t, c), x_type, sx, zx, sp, zp, 1.0, 0, least, form, count,
                                              expand))
    imp = import_model(model, input_precisions={"x": 9, "m": 2})
    so = Fraction(float(imp.edges.outputs[0].scale))
    assert so == mean_grid(t, zp, sp, least, count)
    [got] = execute(imp.graph, {"x": x.astype(np.int32), "m": m.astype(np.int32)})
    got = np.asarray(got).reshape(b, c)
    want = oracle(x, m, sx, zx, sp, zp, float(so), least, count)
    assert all(abs(v) <= 32767 for v, _, _ in want.values())
    step = {"grid": f(1 / 255), "float": Fraction(1), "qdq": f(t / 255)}[count]
    check(got, want, least_c(t, sp, float(so), zp, step, least), float(so), 0, *INT16)


def pooled_ending(form: str):
    """``ids_model(form)`` without its Gemm head: the masked mean's Div is the model's output."""
    model = ids_model(form)
    del model.graph.node[-1]
    del model.graph.output[:]
    model.graph.output.extend([h.make_tensor_value_info("pooled", T.FLOAT, None)])
    return model


def one_token_ids() -> np.ndarray:
    """``padded_ids(8)`` with a sequence of one token first."""
    ids = padded_ids(8)
    ids[0, 0, 1:] = 0
    return ids


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_masked_mean_pooling_as_the_last_op_quantizes_whole(tmp_path, per_channel):
    """capiti's masked mean, sum(x * mask) / Clip(sum(mask), 1), as the model's last op: whole, as close to float
    as onnxruntime's quantized model (1.1x), the export exact. Regression: refused 'a float output (Div) computed
    after the last QuantizeLinear has no integer form here'."""
    quantizes_whole(tmp_path, pooled_ending("clip"), per_channel, one_token_ids())


@pytest.mark.parametrize("form", ["eps", "max"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_a_masked_mean_at_eps_as_the_last_op_quantizes_whole(tmp_path, form, per_channel):
    """sentence-transformers' masked mean, sum(x * mask) / clamp(sum(mask), 1e-9) (or Max(count, 1e-9)), as the
    model's last op: whole at the grid of its mean's bound, as close to float as onnxruntime's quantized model (1.1x),
    the export exact. Regression: refused 'a float output (Div) computed after the last QuantizeLinear has no
    integer form here' (the quotient's bound max|a| / 1e-9 put every output within one step of 0)."""
    quantizes_whole(tmp_path, pooled_ending(form), per_channel, one_token_ids())


@pytest.mark.parametrize("form", ["clip", "max"])
@pytest.mark.parametrize("other", ["count", "mask"])
def test_a_mean_with_no_bound_over_a_count_clipped_far_below_its_step_as_the_float_output_is_refused(form, other):
    """A Div of a masked sum by a count clipped at 1e-9 on the mask's 1/255 grid that is no masked mean: the count
    requantized (it may round a kept token's weight to 0, a / 1e-9 reachable), or the count of another mask than the
    product's: no bound but max|a| / 1e-9, at whose grid every value at a nonzero count lies within one step of 0:
    refused in one line as a float output with no bound."""
    model = ending_at_the_div(masked_mean_qdq((1, 8, 2), T.INT8, 0.05, 0, 0.02, 128, 1.0, 0, 1e-9, form,
                                              "qdq" if other == "count" else "grid", True))
    if other == "mask":  # the count sums a second mask input
        model.graph.input.extend([h.make_tensor_value_info("m2", T.INT64, [1, 8])])
        for n in (h.make_node("DequantizeLinear", ["mq2", "sm", "zm"], ["md2"]),
                  h.make_node("QuantizeLinear", ["mf2", "sm", "zm"], ["mq2"]),
                  h.make_node("Cast", ["m2"], ["mf2"], to=T.FLOAT)):
            model.graph.node.insert(0, n)
        next(n for n in model.graph.node if n.output[0] == "c3").input[0] = "md2"
    with pytest.raises(CVMError) as e:
        import_model(model, input_precisions={"x": 9, "m": 2, "m2": 2})
    assert "a float output (Div) computed after the last QuantizeLinear has no integer form here" in str(e.value)
    assert "\n" not in str(e.value)


@settings(max_examples=60, deadline=None)
@given(s=st.floats(2.0 ** -10, 4.0, width=32), z=st.integers(0, 200), hi=st.sampled_from([127, 255]),
       twice=st.booleans())
def test_a_masks_least_weight_is_its_least_positive_value(s, z, hi, twice):
    """Property: ``least_weight`` of a mask's QuantizeLinear/DequantizeLinear pairs (scales 2^-10 to 4, zero points,
    int8 and uint8 ends, one pair or two) is the least positive value they give the integers 0 to 64, in exact
    rationals."""
    assume(z < hi)
    grids = ((Fraction(float(np.float32(s))), z, hi),) * (2 if twice else 1)
    values = []
    for k in range(65):
        v = Fraction(k)
        for sg, zg, hg in grids:
            v = (min(round(v / sg) + zg, hg) - zg) * sg
        values.append(v)
    assert least_weight(grids) == min(v for v in values if v > 0)


@settings(max_examples=25, deadline=None)
@given(d=st.data(), s=st.floats(2.0**-8, 2.0**2, width=32), x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_an_l1_normalization_as_the_float_output_takes_the_grid_of_its_bound_1(d, s, x_type):
    """LpNormalization p = 1 as the float output: |u| <= sum |u| <= V, so its grid is the least float32 s_t with
    32767 s_t >= 1; every output within 1/2 + 1 / (2 L) steps of the exact u / (V s_t) ("LpNormalization p = 1"),
    L >= L_0 the least fitting |N| <= P round(L / s_t) and |D| <= n P L within 2^28, equal to its rounding farther
    than that from a half-integer. Before: the general bound max|u| s / s, a grid up to 255 times coarser."""
    shape = tuple(d.draw(st.integers(1, 4)) for _ in range(d.draw(st.integers(0, 2)))) + (d.draw(st.integers(1, 40)),)
    axis = d.draw(st.integers(-len(shape), len(shape) - 1))
    lo, hi = RANGE[x_type]
    z = d.draw(st.integers(lo, hi))
    inits = {"s": np.float32(s), "z": NP[x_type](z)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             h.make_node("LpNormalization", ["xf"], ["g"], name="lp", p=1, axis=axis)]
    x = draw_x(d, shape, x_type)
    x.reshape(-1)[:2] = (lo, hi)[:x.size]
    imp = import_model(qdq(nodes, shape, x_type, inits, T.FLOAT, out="g"), input_precision=9)
    so = Fraction(float(imp.edges.outputs[0].scale))
    assert so == least_float32_scale(Fraction(1))
    got = np.asarray(execute(imp.graph, {"data": x.astype(np.int32)})[0], np.int64).reshape(shape)
    u = x.astype(np.int64) - z
    total = np.broadcast_to(np.abs(u).sum(axis=axis, keepdims=True), u.shape)
    big = max(z - lo, hi - z)
    least_l = min(math.floor((Fraction(1 << 28, big) - Fraction(1, 2)) * so), (1 << 28) // (shape[axis] * big))
    e = Fraction(1, 2 * least_l)
    for y, a, b in zip(got.flat, u.flat, total.flat):
        v = Fraction(int(a), int(b)) / so if b else Fraction(0)
        assert abs(y - v) <= Fraction(1, 2) + e, (y, v)
        if abs(abs(v - math.floor(v)) - Fraction(1, 2)) > e:
            assert y == round(v), (y, v)
