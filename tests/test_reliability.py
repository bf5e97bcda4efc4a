"""Reliability: hostile and malformed models give the project's own errors, within time and memory bounds.

The pipeline under test is the converter's: read the symbol and params, validate, export to ONNX. Every outcome
must be success or a ``CVMError``; anything else is a crash. Crashes found by fuzzing get a regression test below.
"""
from __future__ import annotations

import pytest

from cvm_onnx.attrs import AttrSyntaxError, parse_tuple
from cvm_onnx.builder import GraphBuilder
from cvm_onnx.errors import ValidationError


# -- crashes found by fuzzing ----------------------------------------------------------------------------------------
def test_empty_tuple_attribute_is_a_validation_error():
    """An empty string for a tuple attribute was indexed before being checked (IndexError)."""
    with pytest.raises(AttrSyntaxError):
        parse_tuple("")
    b = GraphBuilder()
    x = b.input("data", (1, 1, 4, 4), 8)
    b.op("max_pool2d", x, name="pool", pool_size="")
    with pytest.raises(ValidationError) as info:
        b.build(x)
    assert [str(p) for p in info.value.problems] == ["pool: max_pool2d: attribute pool_size='': '' is not an integer"]
