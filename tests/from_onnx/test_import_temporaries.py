"""The import's params building holds no temporary of a weight's size beyond the one it must: the signed row sums
of a product's weights a block of rows at a time (products.signed_sums), a param's bound from its own values
(Importer.variable). Exact against the whole-array computation, over random shapes and extreme values."""
from __future__ import annotations

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import numpy as np
import pytest

from cvm_onnx.converters.from_onnx.context import Importer
from cvm_onnx.converters.from_onnx.quantized import products

SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(rows=hnp.arrays(np.int64, hnp.array_shapes(min_dims=2, max_dims=2, max_side=40),
                       elements=st.integers(-(1 << 40), 1 << 40)),
       block=st.integers(1, 200))
def test_signed_sums_are_the_sums_of_the_clipped_rows(rows, block):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(products, "ROW_BLOCK", block)  # blocks of one row up to the whole matrix
        pos, neg = products.signed_sums(rows)
    assert pos.dtype == neg.dtype == np.int64
    assert np.array_equal(pos, np.clip(rows, 0, None).sum(axis=1))
    assert np.array_equal(neg, np.clip(rows, None, 0).sum(axis=1))


def test_signed_sums_hold_no_temporary_of_the_matrix_size():
    rows = np.random.default_rng(0).integers(-255, 256, size=(64, 1 << 14))  # 8 MiB of int64
    tracemalloc.start()
    try:
        products.signed_sums(rows)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < rows.nbytes // 2


@SETTINGS
@given(value=st.one_of(
    hnp.arrays(np.int8, hnp.array_shapes(max_dims=3, max_side=6)),
    hnp.arrays(np.int32, hnp.array_shapes(max_dims=3, max_side=6)),
    hnp.arrays(np.int64, hnp.array_shapes(max_dims=3, max_side=6),
               elements=st.integers(-(1 << 31), (1 << 31) - 1))))
def test_a_params_bound_is_its_largest_magnitude(value):
    ctx = Importer()
    e = ctx.variable("w", value.shape, 32, value)
    assert ctx.bounds[e] == int(np.abs(value.astype(np.int64)).max(initial=0))


def test_a_params_bound_holds_no_wider_copy_of_it():
    value = np.full(1 << 22, -128, np.int8)  # 4 MiB; as int64 32 MiB
    ctx = Importer()
    tracemalloc.start()
    try:
        e = ctx.variable("w", value.shape, 8, value)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ctx.bounds[e] == 128 and peak < value.nbytes
