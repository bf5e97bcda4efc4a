"""Forms the exporter picks by the bounds for speed, at the edges of their exactness conditions.

* conv2d/dense: the bias joins the float32 Conv/Gemm exactly while ``max|x| * sum|w| + |bias|`` <= 2^24, and is
  added in int32 one step beyond.
* cvm_right_shift: Round((x + 1/2) * 2^-s) in float32 for |x| < 2^23, float64 beyond, checked against the
  runtime's formula ((x >> (s-1)) + 1) >> 1 on the values next to every rounding point.
* The float32 chunks of a reduction (found by galloping, linear in the weights) are the greedy split, and the
  weights' magnitudes are taken without int64 copies (conversion memory).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto
from support import assert_exact, single_op

from cvm_onnx.converters.to_onnx import nn as lower_nn
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.ops.registry import magnitudes, max_abs

pytestmark = pytest.mark.isa  # CI repeats these on an emulated CPU without AVX-512 (qemu-x86_64 -cpu Haswell)
TWO_24 = 1 << 24


def body_nodes(graph):
    return [n for f in to_onnx(graph).functions for n in f.node]


def bias_placement(graph) -> tuple[int, bool]:
    """(inputs of the float Conv/Gemm, whether an int32 Add follows)."""
    nodes = body_nodes(graph)
    (product,) = [n for n in nodes if n.op_type in ("Conv", "Gemm")]
    return len(product.input), any(n.op_type == "Add" for n in nodes)


@pytest.mark.parametrize("extra", [0, 1])
@pytest.mark.parametrize("weight_param", [True, False])
def test_conv2d_bias_inside_up_to_2_24(extra, weight_param):
    """3x3 kernel over a 3x3 input of 115 channels, all 127: 127^2 * 9 * 115 = 2^24 - 83701; a bias of
    +-(83701 + extra) brings the output bound to 2^24 + extra (channel 1 is the negative mirror)."""
    c, gap = 115, TWO_24 - 127 * 127 * 9 * 115
    x = np.full((1, c, 3, 3), 127, np.int32)
    w = np.full((2, c, 3, 3), 127, np.int32)
    w[1] = -127
    bias = np.array([gap + extra, -(gap + extra)], np.int32)
    graph, feeds = single_op("conv2d", [(x, 8, False), (w, 8, weight_param), (bias, 18, True)], channels=2,
                             kernel_size=(3, 3))
    [y] = assert_exact(graph, feeds)
    assert y.ravel().tolist() == [TWO_24 + extra, -(TWO_24 + extra)]
    assert bias_placement(graph) == ((3, False) if extra == 0 else (2, True))


@pytest.mark.parametrize("extra", [0, 1])
def test_dense_bias_inside_up_to_2_24(extra):
    """K = 1040 of 127 * 127 = 2^24 - 3056, bias +-(3056 + extra)."""
    gap = TWO_24 - 127 * 127 * 1040
    x = np.full((2, 1040), 127, np.int32)
    x[1] = -127
    w = np.full((2, 1040), 127, np.int32)
    w[1] = -127
    bias = np.array([gap + extra, -(gap + extra)], np.int32)
    graph, feeds = single_op("dense", [(x, 8, False), (w, 8, True), (bias, 14, True)], units=2)
    [y] = assert_exact(graph, feeds)
    assert y[0].tolist() == [TWO_24 + extra, -(TWO_24 + extra)]
    assert bias_placement(graph) == ((3, False) if extra == 0 else (2, True))


def runtime_right_shift(x: int, s: int, precision: int) -> int:
    """The runtime's cvm_right_shift on one value (Python ints: exact arithmetic shifts)."""
    limit = (1 << (precision - 1)) - 1
    return max(-limit, min(limit, ((x >> (s - 1)) + 1) >> 1))


def rounding_points(bound: int, s: int) -> np.ndarray:
    """0, +-1, +-bound and x = k 2^s + 2^(s-1) + {-1, 0, 1} (the round-half-up points) and k 2^s + {-1, 0, 1},
    for k near 0 and near the bound, both signs, kept within +-bound."""
    top = bound >> s
    ks = sorted({0, 1, 2, 3, top - 1, top, top + 1})
    points = {0, 1, -1, bound, -bound}
    for k in ks:
        for base in (k << s, (k << s) + (1 << (s - 1))):
            for d in (-1, 0, 1):
                points |= {base + d, -(base + d)}
    return np.array(sorted(v for v in points if abs(v) <= bound), np.int32)


@pytest.mark.parametrize("p_in, float_type", [(23, TensorProto.FLOAT), (24, TensorProto.FLOAT),
                                              (25, TensorProto.DOUBLE), (32, TensorProto.DOUBLE)])
@pytest.mark.parametrize("s", [1, 2, 7, 16, 22, 23, 24, 30, 31])
@pytest.mark.parametrize("precision", [8, 32])
def test_cvm_right_shift_at_every_rounding_point(p_in, float_type, s, precision):
    """Input bounds 2^22-1 and 2^23-1 take float32, 2^24-1 and 2^31-1 float64; the runtime's formula decides."""
    bound = (1 << (p_in - 1)) - 1
    x = rounding_points(bound, s)
    graph, feeds = single_op("cvm_right_shift", [(x, p_in, False)], shift_bit=s, precision=precision)
    [y] = assert_exact(graph, feeds)
    assert y.tolist() == [runtime_right_shift(int(v), s, precision) for v in x]
    casts = [n for n in body_nodes(graph) if n.op_type == "Cast"]
    assert casts[0].attribute[0].i == float_type


def greedy_chunks_oracle(x_bound: int, w_sums: np.ndarray):
    """Greedy chunks by a plain loop: extend while x_bound * max_o (sum of the chunk) stays <= 2^24."""
    sums = [[int(v) for v in row] for row in w_sums]
    if any(x_bound * v > TWO_24 for row in sums for v in row):
        return None
    chunks, lo, n = [], 0, w_sums.shape[1]
    while lo < n:
        hi = lo + 1
        while hi < n and max(x_bound * sum(row[lo:hi + 1]) for row in sums) <= TWO_24:
            hi += 1
        chunks.append((lo, hi))
        lo = hi
    return chunks


@settings(max_examples=200, deadline=None)
@given(x_bound=st.sampled_from([0, 1, 127, 255, 32767, 1 << 20]),
       w=hnp.arrays(np.uint8, hnp.array_shapes(min_dims=2, max_dims=2, max_side=40), elements=st.integers(0, 4)),
       parts=st.sampled_from([1, 2, 3, 4, 64, 1 << 12]))
def test_float_chunks_gallop_is_the_greedy_split(x_bound, w, parts):
    """Weights in units of cap / parts (cap = 2^24 // max|x|): chunk sums land exactly on the cap, and beyond."""
    w_sums = w.astype(np.int64) * (TWO_24 // max(x_bound, 1) // parts)
    assert lower_nn.float_chunks(x_bound, w_sums) == greedy_chunks_oracle(max(x_bound, 1), w_sums)


@pytest.mark.parametrize("dtype", [np.int8, np.int32])
def test_magnitudes_without_wide_copies(dtype):
    info = np.iinfo(dtype)
    x = np.array([info.min, -1, 0, 1, info.max], dtype)
    assert max_abs(x) == 1 << (info.bits - 1) and max_abs(x[1:]) == info.max and max_abs(x[:0]) == 0
    m = magnitudes(x)
    assert m.dtype.itemsize == x.dtype.itemsize and m.dtype.kind == "u"
    assert m.tolist() == [1 << (info.bits - 1), 1, 0, 1, info.max]
