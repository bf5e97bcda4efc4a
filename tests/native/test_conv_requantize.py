"""The fused convolution kernels (conv_requantize[...], custom_ops/conv.h) against exact numpy oracles: the windows
as im2col_rows gathers them, the products sum (rows - z) * (weights - 128) in int64 wrapped to int32, then the
requantize steps (support.native's oracles), on every products kernel this CPU runs (isa), over random
geometries, channel counts across the kernels' blocks of 16, extreme values and every output and addend type."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from support import tensors
from support.native import (channels_oracle, cpu_step, even, int32s, mul64, requantize_add_oracle, requantize_oracle,
                            windows)
from support.oracles import wrap

from cvm_onnx.core.errors import RuntimeFailure
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.native import DOMAIN, library_path
from cvm_onnx.native.cpu import features
from cvm_onnx.runtime.sessions import run, session
from cvm_onnx.serving.route_cache import usable_cpus

EXAMPLES = int(os.environ.get("CVM_ONNX_EXAMPLES", "60"))  # fewer under qemu (.ci/run)
BY_IMAGE = 4 * usable_cpus()  # the smallest batch split over the threads by image (conv.h kImagesPerCpu)
pytestmark = pytest.mark.skipif(library_path() is None, reason="the native custom-op library was not built")


def isas(bounded: bool = False) -> list[int]:
    """The products kernels this CPU runs (conv.h ProductIsa): baseline, AVX2 pairs, AVX-VNNI, AVX-512 VNNI, and for
    rows of values in [0, 127] (``bounded``: offset 0 without a zero point) AVX2 bytes."""
    have = set(features())
    return [1] + [2] * ("avx2" in have) + [3] * ({"avx2", "avx_vnni"} <= have) + [4] * ("avx512_vnni" in have) + \
        [5] * (bounded and "avx2" in have)


def rows_oracle(x, nhwc, kernel, strides, dilations, pads, offset, zero):
    """(N, OH * OW, kh * kw * C) int64: each window in the order (fh, fw, c), x + offset, the fill in the padding."""
    x = x.transpose(0, 3, 1, 2) if nhwc else x
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (dh, dw), (pt, pl, pb, pr) = kernel, strides, dilations, pads
    fill = zero if zero >= 0 else offset
    xp = np.pad(x.astype(np.int64) + offset, [(0, 0), (0, 0), (pt, pb), (pl, pr)], constant_values=fill)
    oh, ow = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1, (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    taps = [xp[:, :, fh * dh + np.arange(oh)[:, None] * sh, fw * dw + np.arange(ow)[None, :] * sw]
            for fh in range(kh) for fw in range(kw)]  # each (N, C, OH, OW)
    return np.stack(taps, axis=1).transpose(0, 3, 4, 1, 2).reshape(n, oh * ow, kh * kw * c), (oh, ow)


def conv_model(op, x_shape, x_type, weights, bias_shape, attrs, addend=None) -> onnx.ModelProto:
    inputs = ["x", "w", "b"] + ["a"] * (addend is not None)
    node = helper.make_node(op, inputs, ["y"], domain=DOMAIN)
    node.attribute.extend(helper.make_attribute(k, v, attr_type=onnx.AttributeProto.INTS if isinstance(v, list) else
                                                None) for k, v in attrs.items())
    values = [helper.make_tensor_value_info("x", x_type, x_shape),
              helper.make_tensor_value_info("b", TensorProto.INT32, bias_shape)]
    if addend is not None:
        values.append(helper.make_tensor_value_info("a", addend, None))
    out = TensorProto.UINT8 if op.endswith("_uint8") else TensorProto.INT32
    graph = helper.make_graph([node], "g", values, [helper.make_tensor_value_info("y", out, None)],
                              [numpy_helper.from_array(weights, "w")])
    return onnx_model(graph, domains={DOMAIN: 1})


@st.composite
def winograd_windows(draw):
    """The windows the AVX2 and AVX-512 VNNI kernels take the Winograd products of (custom_ops/winograd.h): 3 x 3,
    strides and dilations 1, pads 0 to 2, inputs whose 4 x 4 output tiles end anywhere (sizes 1 to 14 the kernel
    fits)."""
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    h = draw(st.integers(max(1, 3 - pads[0] - pads[2]), 14))
    w = draw(st.integers(max(1, 3 - pads[1] - pads[3]), 14))
    return (3, 3), (1, 1), (1, 1), pads, (h, w)


@st.composite
def winograd_bands(draw):
    """Winograd windows whose outputs span two bands of output rows or more (cvm_ops.cc: a multiple of 4 rows, about
    24 tiles of 4 x 4 each: 16 rows at output widths 17 to 24, 12 at 25 to 32), the last one partial or not."""
    pads = tuple(draw(st.integers(0, 2)) for _ in range(4))
    h = draw(st.integers(19 - pads[0] - pads[2], 34 - pads[0] - pads[2]))
    w = draw(st.integers(19 - pads[1] - pads[3], 34 - pads[1] - pads[3]))
    return (3, 3), (1, 1), (1, 1), pads, (h, w)


@st.composite
def convolutions(draw, channels=(1, 3, 16, 17, 40, 64, 70, 90), in_channels=(1, 3, 4, 5, 16, 32), window=windows()):
    """A convolution: data (int32 NCHW or NHWC, or uint8 NHWC) in its range, weights, zero points, bias, steps;
    ``channels`` and ``in_channels``: the output and input channel counts drawn from; ``window``: its geometry."""
    kernel, strides, dilations, pads, (h, w) = draw(window)
    n, c = draw(st.sampled_from([1, 2, BY_IMAGE])), draw(st.sampled_from(in_channels))
    oc = draw(st.sampled_from(channels))
    kind = draw(st.sampled_from(["uint8", "zero", "offset0", "offset128"]))
    nhwc = kind == "uint8" or draw(st.booleans())
    lo, hi = {"offset0": (0, 127), "offset128": (-128, 127)}.get(kind, (0, 255))
    shape = (n, h, w, c) if nhwc else (n, c, h, w)
    x = draw(st.one_of(st.just(np.full(shape, hi)), st.just(np.full(shape, lo)),
                       st.integers(0, 2**32 - 1).map(lambda s: np.random.default_rng(s).integers(lo, hi + 1, shape))))
    weights = draw(st.one_of(st.sampled_from([0, 255]).map(lambda v: np.full((kernel[0] * kernel[1] * c, oc), v)),
                             st.integers(0, 2**32 - 1).map(lambda s: np.random.default_rng(s).integers(
                                 0, 256, (kernel[0] * kernel[1] * c, oc))))).astype(np.uint8)
    attrs = dict(kernel_shape=list(kernel), strides=list(strides), dilations=list(dilations), pads=list(pads),
                 nhwc=int(nhwc), offset=128 if kind == "offset128" else 0,
                 product_zero=draw(st.sampled_from([0, 128, 255]) | st.integers(0, 255)))
    if kind in ("uint8", "zero"):
        attrs["zero"] = draw(st.integers(0, 255))
    return x.astype(np.uint8 if kind == "uint8" else np.int32), weights, attrs


def clip_step():
    return st.tuples(int32s, int32s).map(sorted).map(lambda ab: (3, *ab))


#: A quantized import's requantization (clip, shift, multiply, shift, clip; then a multiply before a residual Add),
#: whose kernels take compile-time kinds (requantize.h channel_blocks), with random constants (shifts of at least
#: one: a shift by 0 goes, and the kinds with it).
shift, multiply = st.tuples(st.just(0), st.integers(1, 31), st.just(0)), st.tuples(st.just(1), int32s, st.just(0))
import_chain = st.tuples(clip_step(), shift, multiply, shift, clip_step()).map(list)
import_chain_and_multiply = st.tuples(import_chain, multiply).map(lambda c: [*c[0], c[1]])
#: The same with its product in two parts (mul64), as a ``two_part`` import's: after a shift or not (the importer's
#: usual chain: clip, mul64, shift, clip), then a multiply before a residual Add or not.
import_two_part_chain = st.tuples(clip_step(), shift, mul64, shift, clip_step()).map(list)
#: The same where M is p / 2^a and ties are met: its shift rounds half to even (even), as such an import's.
import_even_chain = st.tuples(clip_step(), shift, multiply, even, clip_step()).map(list)
#: The importer's usual two-part chain (no shift before the product), then a multiply or not.
two_part_chain = st.tuples(clip_step(), mul64, shift, clip_step()).map(list)
two_part_chain_and_multiply = st.tuples(two_part_chain, multiply).map(lambda c: [*c[0], c[1]])
#: A requantization to an output with a zero point (uint8 activations, asymmetric): the chain, then the zero point
#: added and the result clipped to the type.
zero_point = st.tuples(st.just(2), int32s, st.just(0))
import_chain_to_zero_point = st.tuples(import_chain, zero_point, clip_step()).map(lambda c: [*c[0], c[1], c[2]])


@st.composite
def importer_two_part_chain(draw, then: str = "", parts: int = 2):
    """The importer's chain with its product in parts and their labels (docs/import.md): clip within label P, mul64
    (m1 of at most 31 - P bits; two parts: b = 30 - P, 0 <= m0 < 2^b, v m0 within int32, requantize.h kMul64Narrow;
    three: B = (30 - P) + (29 - P) <= 31, m0 < 2^B, whose products in three int32 parts fit, kMul64Narrow2), shift,
    clip; then (``then``) a multiply, the output's zero point added and clipped, or nothing."""
    p = draw(st.integers(2, 29) if parts == 2 else st.integers(14, 28))
    bound, b = (1 << (p - 1)) - 1, max(1, 30 - p) + (29 - p) * (parts - 2)
    m0 = draw(st.integers(0, (1 << b) - 1) | st.sampled_from([0, (1 << b) - 1]))
    m = (draw(st.integers(0, (1 << (31 - p)) - 1)) << b) + m0
    chain = [(3, -draw(st.integers(0, bound)), draw(st.integers(0, bound))), (4, m, b), draw(shift), draw(clip_step())]
    return chain + {"multiply": [draw(multiply)], "zero point": [draw(zero_point), draw(clip_step())]}.get(then, [])


#: An import's residual Add: the addend's steps (none, a multiply, or a clip and a multiply) and a shift after the
#: sum (then the clip that ends every chain), whose kernels also take compile-time kinds.
import_addend = st.just([]) | multiply.map(lambda m: [m]) | st.tuples(clip_step(), multiply).map(list)
#: A CVM model's requantization, one list for every channel (clip, multiply, shift, clip, after a shift or not; then
#: a multiply before a residual Add, or a second multiply, shift and clip or without its clip, or none), or a
#: quantized import's per-tensor one with its product in two parts (clip, mul64, shift, clip, then a multiply or
#: not), whose kernels also take compile-time kinds (requantize.h uniform_chain).
cvm_chain = st.tuples(st.lists(shift, max_size=1), clip_step(), multiply, shift, clip_step(),
                      st.just([]) | multiply.map(lambda m: [m]) | st.tuples(multiply, shift).map(list) |
                      st.tuples(multiply, shift, clip_step()).map(list)).map(lambda t: [*t[0], *t[1:5], *t[5]]) | \
    two_part_chain | two_part_chain_and_multiply


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=convolutions(), data=st.data(), bias=st.sampled_from(["none", "channel", "position"]),
       bytes_out=st.booleans(), add=st.sampled_from([None, TensorProto.INT32, TensorProto.UINT8]),
       chains=st.sampled_from(["one list", "each channel's", "an import's"]), threads=st.integers(1, 2))
def test_conv_requantize_is_the_rows_product_then_requantize(case, data, bias, bytes_out, add, chains, threads):
    """conv_requantize[_uint8 | _add | _add_uint8](x, w, bias) on every products kernel here equals the rows of
    x (im2col_rows), times w - 128 less the rows' zero point, exact, then requantize's steps (one list, then also
    with scales, each channel's own, or each channel's of a quantized import's kinds, its product in one part or
    two, its shift rounding half up or to even) with the bias (none, per
    channel or per position and channel), the addend's and the sum's; on one thread or two."""
    check_conv(case, data, bias, bytes_out, add, chains, threads)


def equal_on_every_isa(op, x, weights, b, attrs, add, feeds, want, threads):
    """The op on every kernel this CPU runs (the bounded ones where the offset and zero allow) gives ``want``."""
    for isa in isas(bounded=attrs["offset"] == 0 and "zero" not in attrs):
        model = conv_model(op, list(x.shape), TensorProto.UINT8 if x.dtype == np.uint8 else TensorProto.INT32,
                           weights, list(b.shape), {**attrs, "isa": isa}, add)
        got = session(model, threads=threads).run(None, feeds)[0]
        assert got.dtype == want.dtype and np.array_equal(got, want), isa


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=convolutions(channels=(16, 48)), data=st.data(), bias=st.sampled_from(["none", "channel", "position"]),
       bytes_out=st.booleans(), add=st.sampled_from([None, TensorProto.INT32, TensorProto.UINT8]),
       chains=st.sampled_from(["an import's", "a CVM model's"]), threads=st.integers(1, 2))
def test_conv_requantize_runs_the_usual_chains_exactly(case, data, bias, bytes_out, add, chains, threads):
    """The same with a quantized import's chains (each channel's) or a CVM model's (one list), and a residual Add
    of an import's kinds (the addend's steps none, a multiply, or a clip and a multiply; a shift and a clip after
    the sum), over channels in blocks of 16: the kernels that take these kinds at compile time, their constants in
    registers (requantize.h channel_blocks and uniform_chain)."""
    check_conv(case, data, bias, bytes_out, add, chains, threads)


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=convolutions(channels=(1, 8, 16, 17, 32, 40, 64), in_channels=(16, 17, 23, 32, 33, 64, 114, 115),
                         window=winograd_windows()),
       data=st.data(), bias=st.sampled_from(["none", "channel", "position"]), bytes_out=st.booleans(),
       add=st.sampled_from([None, TensorProto.INT32, TensorProto.UINT8]),
       chains=st.sampled_from(["one list", "each channel's", "a CVM model's"]), threads=st.integers(1, 2))
def test_conv_requantize_winograd_products_are_exact(case, data, bias, bytes_out, add, chains, threads):
    """The 3 x 3 convolutions of stride 1 that the AVX2 kernels (isa 2 and 5; 16 to 114 input channels) and the
    AVX-512 VNNI kernel (isa 4; 32 to 114) multiply by Winograd F(4x4, 3x3) (115 and more take the direct form): the
    same values as the oracle and every other kernel, over output sizes that leave partial 4 x 4 tiles and partial
    groups of tiles, channel counts off the blocks of 16 and the channel pairs, pads, zero points and offsets,
    extreme data and weights, the bias, chains and addends, the batch split by tiles or by image."""
    check_conv(case, data, bias, bytes_out, add, chains, threads)


@pytest.mark.isa
@settings(max_examples=max(5, EXAMPLES // 4), deadline=None)
@given(case=convolutions(channels=(16, 17, 32), in_channels=(16, 32, 33), window=winograd_bands()),
       data=st.data(), bias=st.sampled_from(["none", "channel", "position"]), bytes_out=st.booleans(),
       add=st.sampled_from([None, TensorProto.INT32, TensorProto.UINT8]),
       chains=st.sampled_from(["one list", "each channel's", "a CVM model's"]), threads=st.integers(1, 2))
def test_conv_requantize_winograd_bands_are_exact(case, data, bias, bytes_out, add, chains, threads):
    """The Winograd products over several bands of output rows (outputs 17 to 32 wide and tall): each band's
    positions, bias per position and addend found from its first row's, on every kernel."""
    check_conv(case, data, bias, bytes_out, add, chains, threads)


@st.composite
def input_runs(draw):
    """A convolution of int32 NHWC data with offset 0 (a zero or not) whose data first runs through in_steps (random
    CPU steps or a CVM model's clip, multiply, shift; then a clip within the rows' range), with in_scales and in_bias
    or without: the convolution drawn by ``convolutions`` (the Winograd products' windows too) taking the run's
    values, the raw int32 data (extremes included) and the in_ attributes."""
    x, weights, attrs = draw(convolutions(channels=(16, 17, 32), window=windows() | winograd_windows()))
    n, h, w, c = x.shape if attrs["nhwc"] else (x.shape[0], *x.shape[2:], x.shape[1])
    attrs.update(offset=0)
    zero = attrs.get("zero", -1)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    span = draw(st.sampled_from([1 << 31, 1 << 15, 300]))
    raw = rng.integers(max(-span, -(1 << 31)), min(span, 1 << 31), (n, h, w, c)).astype(np.int32)
    for v in draw(st.lists(st.sampled_from([-(1 << 31), (1 << 31) - 1, 0, -1, 1]), max_size=3)):
        raw.reshape(-1)[rng.integers(0, raw.size, max(1, raw.size // 8))] = v
    top = 255 if zero >= 0 else 127
    last = draw(st.tuples(st.integers(0, top), st.integers(0, top)).map(sorted).map(lambda ab: (3, *ab)))
    chain = draw(st.lists(cpu_step, max_size=3) | st.tuples(clip_step(), multiply, shift).map(list)) + [last]
    run = {"in_steps": [v for s in chain for v in s]}
    scales = draw(st.none() | st.lists(int32s | st.integers(1, 127), min_size=c, max_size=c))
    bias = draw(st.none() | st.lists(int32s | st.integers(-1000, 1000), min_size=c, max_size=c))
    run.update({"in_scales": scales} if scales else {}, **({"in_bias": bias} if bias else {}))
    values = requantize_oracle(raw.transpose(0, 3, 1, 2), np.array(bias or [], np.int32), chain, scales or ())
    return (values.transpose(0, 2, 3, 1), weights, {**attrs, "nhwc": 1}), raw, run


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(drawn=input_runs(), data=st.data(), bias=st.sampled_from(["none", "channel", "position"]),
       bytes_out=st.booleans(), add=st.sampled_from([None, TensorProto.INT32, TensorProto.UINT8]),
       chains=st.sampled_from(["one list", "each channel's", "a CVM model's"]), threads=st.integers(1, 2))
def test_conv_requantize_runs_its_data_through_in_steps_first(drawn, data, bias, bytes_out, add, chains, threads):
    """conv_requantize[...] with in_steps (in_scales, in_bias) on int32 NHWC data (extreme values included) equals
    requantize's run of the data (x * in_scales + in_bias, then in_steps) convolved as without them, on every
    products kernel here: a standalone run folded into the convolution reading it (cpu_layout._input_runs)."""
    case, raw, run = drawn
    check_conv(case, data, bias, bytes_out, add, chains, threads, before=(raw, run))


def check_conv(case, data, bias, bytes_out, add, chains, threads, before=None):
    """The body of the properties above: draws the bias, steps and addend, asserts every kernel's y;
    ``before``: (the raw data fed instead of case's x, the in_ attributes that make case's x of it)."""
    x, weights, attrs = case
    rows, (oh, ow) = rows_oracle(x, attrs["nhwc"], attrs["kernel_shape"], attrs["strides"], attrs["dilations"],
                                 attrs["pads"], attrs["offset"], attrs.get("zero", -1))
    oc, positions, n = weights.shape[1], oh * ow, x.shape[0]
    products = wrap((rows - attrs["product_zero"]) @ (weights.astype(np.int64) - 128), 32)
    b = data.draw(tensors({"none": (0,), "channel": (oc,), "position": (positions, oc)}[bias], 32))
    ends = [(3, 0, data.draw(st.integers(0, 255)))] if bytes_out else []
    if chains in ("one list", "a CVM model's"):
        chain = data.draw(st.lists(cpu_step, max_size=4) if chains == "one list" else cvm_chain) + ([] if add else ends)
        per, steps = [chain] * oc, {"steps": [v for s in chain for v in s]}
        if chains == "one list" and data.draw(st.booleans()):  # each channel's products times its scale, then bias
            scales = data.draw(st.lists(int32s, min_size=oc, max_size=oc))
            steps["scales"] = scales
            products = wrap(products * np.array(scales, np.int64), 32)
    else:
        drawn = data.draw(st.just(st.lists(cpu_step, max_size=3)) if chains == "each channel's" else st.sampled_from(
            [import_chain, import_chain_and_multiply, import_chain_to_zero_point, import_two_part_chain,
             import_even_chain, two_part_chain, two_part_chain_and_multiply, importer_two_part_chain(),
             importer_two_part_chain("multiply"), importer_two_part_chain("zero point"),
             importer_two_part_chain(parts=3), importer_two_part_chain("multiply", 3),
             importer_two_part_chain("zero point", 3)]))
        per = [data.draw(drawn) + ([] if add else ends) for _ in range(oc)]
        steps = {"channel_counts": [len(p) for p in per], "channel_steps": [v for p in per for s in p for v in s]}
    op = "conv_requantize" + "_add" * (add is not None) + "_uint8" * bytes_out
    feeds = {"x": x, "b": b}
    if add is None:
        want = channels_oracle(products, b, per)
    else:
        shape = (n, positions, oc)
        feeds["a"] = data.draw(tensors(shape, 9).map(np.abs).map(lambda a: a.astype(np.uint8))
                               if add == TensorProto.UINT8 else tensors(shape, 32)).reshape(n, oh, ow, oc)
        if chains in ("an import's", "a CVM model's"):
            addend_steps = data.draw(import_addend)
            sum_steps = [data.draw(shift), *(ends or [data.draw(clip_step())])]
        else:
            addend_steps = data.draw(st.lists(cpu_step, max_size=3))
            sum_steps = data.draw(st.lists(cpu_step, max_size=3)) + ends
        steps.update(addend_steps=[v for s in addend_steps for v in s], sum_steps=[v for s in sum_steps for v in s])
        want = requantize_add_oracle(products, b, per, feeds["a"].reshape(shape), addend_steps, sum_steps)
    want = want.reshape(n, oh, ow, oc).astype(np.uint8 if bytes_out else np.int32)
    if before is not None:
        x, feeds["x"] = before[0], before[0]
        steps.update(before[1])
    equal_on_every_isa(op, x, weights, b, {**attrs, **steps}, add, feeds, want, threads)


@pytest.mark.isa
@settings(max_examples=EXAMPLES, deadline=None)
@given(case=convolutions(channels=(16, 32, 48, 64)), data=st.data(),
       bias=st.sampled_from(["none", "channel", "position"]), bytes_out=st.booleans(),
       add=st.sampled_from([None, TensorProto.INT32, TensorProto.UINT8]),
       chains=st.sampled_from(["one list", "each channel's"]), threads=st.integers(1, 2))
def test_conv_requantize_writes_every_value_in_its_place(case, data, bias, bytes_out, add, chains, threads):
    """Chains that keep the values apart (nothing, or a multiply by a channel's own odd constant, on int32; a shift
    that brings the products to about a byte and a clip to [0, 255] on bytes; the addend added as it is), so that a
    value written to another position or channel, read from another row of the bias or the addend, or a row left
    out shows: over channels in blocks of 16 (the AVX-512 VNNI kernel requantizes its tiles in registers there),
    partial tiles, the bias none, per channel or per position, the batch split by tiles or by image, every kernel."""
    x, weights, attrs = case
    rows, (oh, ow) = rows_oracle(x, attrs["nhwc"], attrs["kernel_shape"], attrs["strides"], attrs["dilations"],
                                 attrs["pads"], attrs["offset"], attrs.get("zero", -1))
    oc, positions, n = weights.shape[1], oh * ow, x.shape[0]
    products = wrap((rows - attrs["product_zero"]) @ (weights.astype(np.int64) - 128), 32)
    shift = max(0, int(np.abs(products).max()).bit_length() - 8)  # products >> shift within about +-2^8
    b = data.draw(tensors({"none": (0,), "channel": (oc,), "position": (positions, oc)}[bias],
                          shift + 8 if bytes_out else 32))
    if bytes_out:
        per = [[(0, shift, 0), (3, 0, 255)]] * oc
    elif chains == "one list":
        per = [[(1, 2 * data.draw(st.integers(0, 2**20)) + 1, 0)] if data.draw(st.booleans()) else []] * oc
    else:
        per = [[(1, 2 * data.draw(st.integers(0, 2**20)) + 1, 0)] for _ in range(oc)]
    if chains == "one list":
        steps = {"steps": [v for s in per[0] for v in s]}
    else:
        steps = {"channel_counts": [len(p) for p in per], "channel_steps": [v for p in per for s in p for v in s]}
    feeds = {"x": x, "b": b}
    if add is None:
        want = channels_oracle(products, b, per)
    else:
        shape = (n, positions, oc)
        sum_steps = [(3, 0, 255)] if bytes_out else []
        feeds["a"] = data.draw(tensors(shape, 9).map(np.abs).map(lambda a: a.astype(np.uint8))
                               if add == TensorProto.UINT8 else tensors(shape, 32)).reshape(n, oh, ow, oc)
        steps.update(addend_steps=[], sum_steps=[v for s in sum_steps for v in s])
        want = requantize_add_oracle(products, b, per, feeds["a"].reshape(shape), [], sum_steps)
    op = "conv_requantize" + "_add" * (add is not None) + "_uint8" * bytes_out
    want = want.reshape(n, oh, ow, oc).astype(np.uint8 if bytes_out else np.int32)
    equal_on_every_isa(op, x, weights, b, {**attrs, **steps}, add, feeds, want, threads)


@pytest.mark.isa
def test_conv_requantize_sums_the_largest_products_of_every_kernel_exactly():
    """Rows of 255 (uint8 data) and of 127 (int32 data of offset 0, the AVX2 bytes kernel's bound) times weights -128
    (and 127) over K = 3 * 3 * 1,024: |sum| up to 9,216 * 255 * 128 > 2^28 and pairs of products at the edge of
    int16 (2 * 127 * -128), no saturation anywhere, with the zero point 0 and 255."""
    c, oc = 1024, 20
    for value, dtype, bounded in ((255, np.uint8, False), (127, np.int32, True)):
        x = np.full((1, 3, 3, c), value, dtype)
        rows = {"zero": 0} if dtype == np.uint8 else {}
        for fill in (0, 255):
            weights = np.full((9 * c, oc), fill, np.uint8)
            for zero in (0, 255):
                want = wrap(np.full((1, 1, 1, oc), (value - zero) * 9 * c * (fill - 128), np.int64), 32)
                for isa in isas(bounded):
                    model = conv_model("conv_requantize", [1, 3, 3, c], TensorProto.UINT8 if dtype == np.uint8 else
                                       TensorProto.INT32, weights, [0], dict(kernel_shape=[3, 3], nhwc=1, offset=0,
                                                                            product_zero=zero, steps=[], isa=isa,
                                                                            **rows))
                    got = run(model, {"x": x, "b": np.zeros(0, np.int32)})[0]
                    assert np.array_equal(got, want.astype(np.int32)), (value, fill, zero, isa)


@pytest.mark.isa
@pytest.mark.parametrize("c", [114, 115])
def test_conv_requantize_winograd_sums_its_largest_products_exactly(c):
    """The Winograd products' bound (custom_ops/winograd.h): 3 x 3 windows of 255 (uint8 data) or 127 (offset 0) over
    C = 114 channels times weights -128 or 127 sum to |y| <= 9 * 114 * 255 * 128 < 2^25, exact through 576 y modulo
    2^32; 115 channels take the direct form: exact too. Every output position (padding 1, 7 x 7: partial tiles)
    against the oracle, with the zero point 0 and 255."""
    shape, oc = (1, 7, 7, c), 20
    for value, dtype, bounded in ((255, np.uint8, False), (127, np.int32, True)):
        rows = {"zero": 0} if dtype == np.uint8 else {}
        x = np.full(shape, value, dtype)
        gathered, _ = rows_oracle(x, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 0, 0 if rows else -1)
        for fill in (0, 255):
            weights = np.full((9 * c, oc), fill, np.uint8)
            for zero in (0, 255):
                want = wrap((gathered - zero) @ (weights.astype(np.int64) - 128), 32).reshape(1, 7, 7, oc)
                for isa in isas(bounded):
                    model = conv_model("conv_requantize", list(shape), TensorProto.UINT8 if rows else
                                       TensorProto.INT32, weights, [0], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                                                            nhwc=1, offset=0, product_zero=zero,
                                                                            steps=[], isa=isa, **rows))
                    got = run(model, {"x": x, "b": np.zeros(0, np.int32)})[0]
                    assert np.array_equal(got, want.astype(np.int32)), (value, fill, zero, isa)


@pytest.mark.parametrize("n", [1, 2, BY_IMAGE, BY_IMAGE + 1])
@pytest.mark.parametrize("nhwc", [0, 1])
def test_conv_requantize_names_the_first_data_value_outside_the_range(n, nhwc):
    """Data values outside [0, 127] (offset 0): one error naming the smallest flat index, whether the batch is split
    by tiles over one padded copy or by image, wherever in the batch the values lie."""
    shape = (n, 4, 4, 3) if nhwc else (n, 3, 4, 4)
    x = np.zeros(shape, np.int32)
    flat = x.reshape(-1)
    first = (n - 1) * 48 + 17  # in the last image
    flat[first], flat[-1] = 128, -1
    if n > 1:
        flat[first - 40] = 200  # the smallest, in the image before
        first -= 40
    model = conv_model("conv_requantize", list(shape), TensorProto.INT32, np.zeros((27, 5), np.uint8), [5],
                       dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], nhwc=nhwc, offset=0, steps=[3, 0, 9]))
    with pytest.raises(RuntimeFailure, match=rf"conv_requantize: data value {flat[first]} at flat index {first} "
                                             r"is outside \[0, 127\]"):
        run(model, {"x": x, "b": np.zeros(5, np.int32)})


def test_conv_requantize_refuses_bad_input_naming_the_op_and_the_rule():
    """A non-constant weight, an unknown kernel, a zero point outside uint8, a bias, addend, input or weights of the
    wrong shape, and bytes out of a chain that does not end in them: one error naming the op and the rule."""
    x, weights = np.zeros((1, 4, 4, 3), np.uint8), np.zeros((27, 5), np.uint8)
    base = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], nhwc=1, offset=0, zero=0, steps=[3, 0, 9])
    feeds = {"x": x, "b": np.zeros(5, np.int32)}

    def refused(model, feeds, message):
        with pytest.raises(RuntimeFailure, match=message):
            run(model, feeds)

    model = conv_model("conv_requantize", [1, 4, 4, 3], TensorProto.UINT8, weights, [5], base)
    loose = onnx.ModelProto()
    loose.CopyFrom(model)
    loose.graph.input.append(helper.make_tensor_value_info("w", TensorProto.UINT8, [27, 5]))
    del loose.graph.initializer[:]
    refused(loose, {**feeds, "w": weights}, "conv_requantize: the weights must be a constant")
    refused(conv_model("conv_requantize", [1, 4, 4, 3], TensorProto.UINT8, weights, [5], {**base, "isa": 9}), feeds,
            "conv_requantize: isa 9 is not a kernel this CPU runs")
    if "avx2" in features():
        refused(conv_model("conv_requantize", [1, 4, 4, 3], TensorProto.UINT8, weights, [5], {**base, "isa": 5}),
                feeds, r"conv_requantize: isa 5 takes rows of values in \[0, 127\]")
    refused(conv_model("conv_requantize", [1, 4, 4, 3], TensorProto.UINT8, weights, [5], {**base, "product_zero": 256}),
            feeds, "conv_requantize: product_zero must be in")
    refused(conv_model("conv_requantize", [1, 4, 4, 3], TensorProto.UINT8, weights, [4], base),
            {"x": x, "b": np.zeros(4, np.int32)}, r"conv_requantize: the bias must be empty, \(OC,\)")
    refused(conv_model("conv_requantize", [1, 4, 4, 2], TensorProto.UINT8, weights, [5], base),
            {**feeds, "x": np.zeros((1, 4, 4, 2), np.uint8)}, "conv_requantize: the weights .* must be")
    refused(conv_model("conv_requantize", [1, 4, 4, 3], TensorProto.UINT8, weights[:26], [5], base), feeds,
            r"conv_requantize: the weights \(K, OC\) must have K = kh \* kw \* C, got \(26, 5\) for a 3 x 3 kernel")
    for kernel in ([0, 3], [-3, -9], [2**40, 2**40], [28, 1]):  # no division by zero, no overflow
        refused(conv_model("conv_requantize", [1, 4, 4, 3], TensorProto.UINT8, weights, [5],
                           {**base, "kernel_shape": kernel}), feeds, "conv_requantize: the weights .* must have K")
    refused(conv_model("conv_requantize_uint8", [1, 4, 4, 3], TensorProto.UINT8, weights, [5],
                       {**base, "steps": [3, -1, 9]}), feeds, "conv_requantize_uint8: every chain must end with a clip")
    refused(conv_model("conv_requantize_add", [1, 4, 4, 3], TensorProto.UINT8, weights, [5], base, TensorProto.INT32),
            {**feeds, "a": np.zeros((1, 4, 4, 4), np.int32)}, "conv_requantize_add: the addend must have y's shape")


def test_conv_requantize_refuses_in_steps_it_cannot_fold_naming_the_op_and_the_rule():
    """in_steps on uint8 data, data not channels-last or of offset 128, or not ending with a clip within the rows'
    range; in_scales or in_bias without in_steps, not int32s, or not one per input channel: one error naming the
    op and the rule."""
    weights = np.random.default_rng(0).integers(0, 256, (27, 5)).astype(np.uint8)
    x = np.zeros((1, 4, 4, 3), np.int32)
    base = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], nhwc=1, offset=0, steps=[3, -9999, 9999], in_steps=[3, 0, 127])
    feeds = {"x": x, "b": np.zeros(5, np.int32)}
    rule = r"conv_requantize: in_steps take int32 data with nhwc 1 and offset 0 and end with a clip within \[0, 127\]"
    for attrs, x_type, message in [
            ({**base, "zero": 0}, TensorProto.UINT8, rule), ({**base, "offset": 128}, TensorProto.INT32, rule),
            ({**base, "nhwc": 0}, TensorProto.INT32, rule),
            ({**base, "in_steps": [3, 0, 128]}, TensorProto.INT32, rule),
            ({**base, "in_steps": [3, -1, 9]}, TensorProto.INT32, rule),
            ({**base, "in_steps": [3, 0, 9, 1, 2, 0]}, TensorProto.INT32, rule),
            ({**base, "in_steps": [9, 0, 0]}, TensorProto.INT32, "conv_requantize: in_steps: "),
            ({**base, "in_steps": [], "in_scales": [1, 1, 1]}, TensorProto.INT32,
             "conv_requantize: in_scales and in_bias need in_steps"),
            ({**base, "in_bias": [2**31, 0, 0]}, TensorProto.INT32, "conv_requantize: in_bias must be int32s"),
            ({**base, "in_scales": [1, 1]}, TensorProto.INT32,
             "conv_requantize: 2 in_scales or in_bias for 3 input channels")]:
        model = conv_model("conv_requantize", [1, 4, 4, 3], x_type, weights, [5], attrs)
        with pytest.raises(RuntimeFailure, match=message):
            run(model, {**feeds, "x": x.astype(np.uint8 if x_type == TensorProto.UINT8 else np.int32)})
    zero = conv_model("conv_requantize", [1, 4, 4, 3], TensorProto.INT32, weights, [5],
                      {**base, "zero": 3, "in_steps": [3, 0, 255]})  # with a zero the rows take [0, 255]
    x[0, 1, 2] = [-5, 300, 7]
    rows, _ = rows_oracle(np.clip(x, 0, 255), 1, [3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 0, 3)
    want = np.clip(rows @ (weights.astype(np.int64) - 128), -9999, 9999).reshape(1, 4, 4, 5)
    assert np.array_equal(run(zero, {**feeds, "x": x})[0], want)
