"""The runtime's attribute value syntax: what its dmlc parser reads, and what cvm-onnx writes back."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cvm_onnx.core.attrs import AttrSyntaxError, format_value, parse_bool, parse_int, parse_optional_int, parse_tuple


def test_values_as_the_runtime_writes_them():
    assert parse_int("-3") == -3 and parse_int(" 7 ") == 7
    assert [parse_bool(v) for v in ("True", "false", "1", "0")] == [True, False, True, False]
    assert parse_tuple("(1, 1)") == parse_tuple("[1, 1]") == (1, 1)
    assert parse_tuple("3") == (3,) and parse_tuple("()") == () and parse_tuple("(2,)") == (2,)
    assert parse_tuple("(3L, 4L)") == (3, 4)  # TShape items tolerate an L suffix
    assert parse_optional_int("None") is None and parse_optional_int("5") == 5


@pytest.mark.parametrize("text", ["3L", "1.5", "", "0x10", str(1 << 31), str(-(1 << 31) - 1)])
def test_int_fields_refuse_what_the_runtimes_int32_read_refuses(text):
    """An int field is read with istream >> int32: no L suffix (tuples only), no fraction, nothing beyond int32."""
    with pytest.raises(AttrSyntaxError):
        parse_int(text)


@given(st.one_of(st.integers(-(1 << 31), (1 << 31) - 1), st.booleans(), st.none(),
                 st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=4).map(tuple)))
def test_written_values_read_back(value):
    text = format_value(value)
    if isinstance(value, bool):
        assert parse_bool(text) is value
    elif value is None:
        assert parse_optional_int(text) is None
    elif isinstance(value, tuple):
        assert parse_tuple(text) == value
    else:
        assert parse_int(text) == value
