"""ONNX's Cast as the importer evaluates it at import (``context.onnx_cast``: a mask term's table, a dequantized
value's Cast table): onnxruntime's Cast wherever ONNX defines it, refused in one line where a float value is not
finite or outside the integer type."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h

from cvm_onnx.converters.from_onnx.context import INT_RANGES, onnx_cast
from cvm_onnx.converters.from_onnx.registry import Refuse
from cvm_onnx.core.format.onnx_file import onnx_model

TYPES = [T.BOOL, T.INT8, T.UINT8, T.INT16, T.UINT16, T.INT32, T.UINT32, T.INT64, T.FLOAT16, T.DOUBLE]


def ort_cast(v: np.ndarray, to: int) -> np.ndarray:
    g = h.make_graph([h.make_node("Cast", ["x"], ["y"], to=to)], "cast", [h.make_tensor_value_info("x", T.FLOAT, None)],
                     [h.make_tensor_value_info("y", to, None)])
    session = ort.InferenceSession(onnx_model(g, 17).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": v})[0]


@settings(max_examples=40, deadline=None)
@given(to=st.sampled_from(TYPES), v=st.lists(st.one_of(st.floats(width=32), st.integers(-2**33, 2**33).map(float),
                                                      st.sampled_from([-0.5, 0.99, 127.9, 128.0, -128.9, 255.5,
                                                                       65535.9, 2.0**31, -2.0**31, 2.0**32])),
                                            min_size=1, max_size=6))
def test_onnx_cast_is_onnxruntimes_where_onnx_defines_it(to, v):
    """float32 values (infinite, NaN, at and past each type's ends) cast to each type: onnxruntime's values and type
    where every value is finite and inside an integer type (any value to bool and to a float type); else refused,
    naming the value and the type's bounds."""
    x = np.asarray(v, np.float32)
    defined = to not in INT_RANGES or to == T.BOOL or (np.isfinite(x).all() and  # in Python's integers: exact
                                                        all(INT_RANGES[to][0] <= int(t) <= INT_RANGES[to][1]
                                                            for t in np.trunc(x).tolist()))
    if not defined:
        with pytest.raises(Refuse, match=r"which the type does not hold .*clip them to \[-?\d+, \d+\] first"):
            onnx_cast(x, to, "values")
        return
    got, want = onnx_cast(x, to, "values"), ort_cast(x, to)
    assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True)


def test_a_type_numpy_does_not_hold_is_refused():
    with pytest.raises(Refuse, match="Cast of a term to type 99: no ONNX tensor type that numpy holds"):
        onnx_cast(np.zeros(2, np.float32), 99, "a term")
