"""Transformer blocks (issue 35): attention's MatMul of two computed tensors as one CVM ``dense`` per matrix,
exactly the integer product (a - z_a) @ (b - z_b) of numpy over random shapes, broadcast batch axes, intervals
and zero points reaching the types' extremes; the graph validates (dense's operands 8-bit) and exports to ONNX
bit-exactly."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T

from cvm_onnx.converters.from_onnx.context import Importer, Tensor
from cvm_onnx.converters.from_onnx.emit import strided_slice
from cvm_onnx.converters.from_onnx.quantized.products import variable_matmul
from cvm_onnx.converters.from_onnx.quantized.values import Scaled
from cvm_onnx.core.executor import execute
from cvm_onnx.core.graph import Graph
from cvm_onnx.core.validate import validate
from cvm_onnx.runtime.verify import verify

SETTINGS = settings(max_examples=25, deadline=None)
RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255)}


@st.composite
def operand(draw, shape):
    """(ONNX type, [lo, hi] within it, zero point, values in [lo, hi] with both ends present)."""
    dtype = draw(st.sampled_from([T.INT8, T.UINT8]))
    tlo, thi = RANGE[dtype]
    lo = draw(st.sampled_from([tlo, tlo + 1, (tlo + thi) // 2]) | st.integers(tlo, thi))
    hi = draw(st.sampled_from([thi, thi - 1]) | st.integers(lo, thi))
    zero = draw(st.sampled_from([tlo, thi, (tlo + thi + 1) // 2]) | st.integers(tlo, thi))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    v = rng.integers(lo, hi + 1, size=shape)
    v.flat[0], v.flat[-1] = lo, hi
    return dtype, lo, hi, zero, v


@st.composite
def matmul_case(draw):
    """Shapes (..., M, K) and (..., K, N) whose batch axes broadcast (either side may lack or stretch one)."""
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    m, k, n = draw(st.integers(1, 6)), draw(st.integers(1, 70)), draw(st.integers(1, 6))

    def side(mat):
        dims = [d if draw(st.booleans()) else 1 for d in batch]
        return tuple(dims[draw(st.integers(0, len(dims))):]) + mat

    sa, sb = side((m, k)), side((k, n))
    return sa, sb, draw(operand(sa)), draw(operand(sb))


def imported_matmul(sa, sb, a, b):
    """The CVM graph of variable_matmul on a and b, both read from the one input ``data`` (a's values, then b's),
    and that input."""
    (ta, alo, ahi, za, va), (tb, blo, bhi, zb, vb) = a, b
    ctx = Importer()
    na, nb = math.prod(sa), math.prod(sb)
    data = ctx.variable("data", (na + nb,), 9)
    flat = Tensor(T.INT32, (na + nb,), -255, 255, data)

    def part(start, size, shape, dtype, lo, hi):
        t = ctx.reshape(strided_slice(ctx, flat, [range(start, start + size)]), shape)
        return Scaled(Tensor(dtype, shape, lo, hi, t.entry), np.asarray(1, object), np.asarray(za if start == 0
                                                                                              else zb))
    y = variable_matmul(ctx, part(0, na, sa, ta, alo, ahi), part(na, nb, sb, tb, blo, bhi))
    graph = validate(Graph(ctx.nodes, (y.t.entry,), ctx.params)).graph
    return graph, y, np.concatenate([va.reshape(-1), vb.reshape(-1)]).astype(np.int32)


@SETTINGS
@given(case=matmul_case())
def test_matmul_of_two_computed_tensors_is_the_exact_integer_product(case):
    sa, sb, a, b = case
    graph, y, x = imported_matmul(sa, sb, a, b)
    want = (a[4].astype(np.int64) - a[3]) @ (b[4].astype(np.int64) - b[3])
    [got] = execute(graph, {"data": x})
    assert got.shape == want.shape and np.array_equal(got, want)
    assert y.t.lo <= want.min() and want.max() <= y.t.hi  # the interval the import states holds
    assert [nd.op for nd in graph.nodes].count("dense") == math.prod(want.shape[:-2])
    assert verify(graph, x).exact


def test_a_vit_head_imports_as_six_denses():
    """ViT-S/16's attention scores, (1, 6, 257, 64) @ (1, 6, 64, 257) of uint8 tensors: refused before ("would
    compute 25362816 products at once"); now six dense of 8-bit halves, exact."""
    rng = np.random.default_rng(0)
    sa, sb = (1, 6, 257, 64), (1, 6, 64, 257)
    a = (T.UINT8, 0, 255, 131, rng.integers(0, 256, sa))
    b = (T.UINT8, 0, 255, 120, rng.integers(0, 256, sb))
    graph, _, x = imported_matmul(sa, sb, a, b)
    [got] = execute(graph, {"data": x})
    assert np.array_equal(got, (a[4] - 131) @ (b[4] - 120))
    assert [nd.op for nd in graph.nodes].count("dense") == 6
