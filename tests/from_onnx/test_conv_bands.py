"""A padded convolution over a large input (DNSMOS's 128 x 900 x 161 spectrogram convolutions): the zero point's
share of the padding, (c - z) V with V the window sums, added by bands along one spatial axis (the outputs whose
windows reach the padding in full, one shared pattern for those between) when V in full passes the limit. Each
case against the oracle of docs/import.md, with the limit set just below V's size so the bands are taken."""
from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.quantized import qdq
from test_quantized_rules import draw_x, oracle_equal

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.from_onnx.quantized import products
from cvm_onnx.core.errors import CVMError

NP = {T.INT8: np.int8, T.UINT8: np.uint8}


def conv_model(cin, cout, shape, k, strides, dil, pads, x_type, zx, transpose=False):
    rng = np.random.default_rng(sum(shape) + cout)
    wshape = (cin, cout) + tuple(k) if transpose else (cout, cin) + tuple(k)
    inits = {"s": np.float32(0.05), "zx": NP[x_type](zx), "w": rng.integers(-127, 128, wshape).astype(np.int8),
             "sw": np.float32(0.01), "so": np.float32(0.07), "zo": np.int8(-3),
             "b": rng.integers(-500, 500, cout).astype(np.int32), "sb": np.float32(0.05 * 0.01)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"]),
             h.make_node("DequantizeLinear", ["b", "sb"], ["bf"]),
             h.make_node("ConvTranspose" if transpose else "Conv", ["xf", "wf", "bf"], ["c"], strides=list(strides),
                         dilations=list(dil), pads=list(pads), kernel_shape=list(k)),
             h.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"])]
    return qdq(nodes, (1, cin) + tuple(shape), x_type, inits, T.INT8)


def inside(n, k, s, d, b, out):
    """The outputs along one axis whose every tap reads inside the image."""
    return [o for o in range(out) if 0 <= o * s - b and o * s - b + (k - 1) * d < n]


@settings(max_examples=30, deadline=None)
@given(d=st.data(), cin=st.integers(1, 3), cout=st.integers(1, 4), shape=st.tuples(st.integers(3, 12),
       st.integers(3, 12)), k=st.tuples(st.integers(1, 4), st.integers(1, 4)),
       strides=st.tuples(st.integers(1, 3), st.integers(1, 3)), dil=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_conv_window_sums_by_bands_equal_the_oracle(d, cin, cout, shape, k, strides, dil, x_type):
    pads = [d.draw(st.integers(0, dd * (kk - 1) + 1)) for dd, kk in zip(dil + dil, k + k)]
    outs = [(n + p + q - dd * (kk - 1) - 1) // s + 1 for n, p, q, dd, kk, s in
            zip(shape, pads[:2], pads[2:], dil, k, strides)]
    if min(outs) < 1 or not any(pads):
        return
    zx = d.draw(st.sampled_from([-128, 127, 0, 255] if x_type == T.UINT8 else [-128, 127, 5]))
    zx = min(max(zx, 0 if x_type == T.UINT8 else -128), 255 if x_type == T.UINT8 else 127)
    m = conv_model(cin, cout, shape, k, strides, dil, pads, x_type, zx)
    full = cout * outs[0] * outs[1]
    runs = [inside(n, kk, s, dd, b, o) for n, kk, s, dd, b, o in zip(shape, k, strides, dil, pads[:2], outs)]
    counts = [cout * outs[1 - a] * (outs[a] - len(r) + 1) for a, r in enumerate(runs) if r]
    with mock.patch.object(products, "MAX_WINDOW_SUMS", full - 1):
        if not counts or min(counts) > full - 1:  # no axis whose bands hold fewer values: refused, naming it
            with pytest.raises(CVMError, match=r"\(Conv\): the padded convolution's zero-point correction .* in "
                                               r"bands too"):
                import_model(m, input_precision=9)
            return
        imp = import_model(m, input_precision=9)
        assert all(p.shape != (cout, outs[0], outs[1]) for p in imp.graph.params.values())  # no V in full
        assert "concatenate" in [n.op for n in imp.graph.nodes] or len(runs[0]) == outs[0] or \
            len(runs[1]) == outs[1]
        oracle_equal(m, draw_x(d, (1, cin) + tuple(shape), x_type))


@pytest.mark.parametrize("transpose", [False, True])
def test_dnsmos_sized_convolution_imports_by_bands(transpose):
    """128 x 12 x 161 outputs of a 3 x 3 convolution padded by 1 (DNSMOS's width and channels; 247296 window sums,
    the limit set below them) and a ConvTranspose's: bands of 2 rows and one pattern, equal to the oracle."""
    shape = (12, 161)
    m = conv_model(1, 128, shape, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), T.UINT8, 0, transpose)
    with mock.patch.object(products, "MAX_WINDOW_SUMS", 1 << 17):
        imp = import_model(m, input_precision=9)
        assert max(p.size for p in imp.graph.params.values()) <= 128 * 161 * 3
        x = np.random.default_rng(0).integers(0, 256, (1, 1) + shape)
        x.flat[0], x.flat[-1] = 0, 255
        oracle_equal(m, x)


def test_a_huge_declared_input_takes_its_bands_from_the_shapes():
    """A padded convolution over an input declared 2^23 x 3 (a hostile model's shape): its window sums pass the
    limit in full, not by rows' bands, which are found from the shapes alone: no per-output mask of the 2^23 rows
    is built (those masks were Python lists: gigabytes and half a minute)."""
    import tracemalloc

    m = conv_model(1, 4, (1 << 23, 3), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), T.UINT8, 0)
    tracemalloc.start()
    try:
        imp = import_model(m, input_precision=9)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "concatenate" in [n.op for n in imp.graph.nodes]
    assert peak < 64 << 20
