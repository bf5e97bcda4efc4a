"""The CVM runtime's attribute value syntax (dmlc parameter strings), parsed and written in one place.

Values in ``op_attrs`` are strings: ints ``"3"``, bools ``"True"``/``"false"``/``"1"``, tuples ``"(1, 1)"``,
``"[1, 1]"`` or a bare ``"1"`` (their items tolerate an ``L`` suffix), optional ints ``"None"``, enum names as-is.
Typed values in Python: ``int``, ``bool``, ``tuple[int, ...]``, ``None`` and ``str``. Ints must fit an int32 and
tuple items an int64, the types the runtime reads them into.
"""
from __future__ import annotations

import re
from typing import Any, Callable

_INT = re.compile(r"^\s*[+-]?\d+\s*$")
_TUPLE_ITEM = re.compile(r"^\s*[+-]?\d+L?\s*$")  # TShape items tolerate an L suffix; int fields do not
_BOOLS = {"true": True, "1": True, "false": False, "0": False}


class AttrSyntaxError(ValueError):
    """A string that is not a value of the requested kind."""


def _in_range(value: int, bits: int, given: Any) -> int:
    """``value`` if an int of ``bits`` bits holds it (the runtime's istream read fails beyond)."""
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if not lo <= value <= hi:
        raise AttrSyntaxError(f"{given!r:.60} must lie in [{lo}, {hi}] (an int{bits} as the runtime reads it)")
    return value


def _to_int(text: str, bits: int, pattern: re.Pattern = _INT) -> int:
    if not pattern.match(text):
        raise AttrSyntaxError(f"{text!r:.60} is not an integer")
    digits = text.strip().rstrip("L")
    # over 19 significant digits is beyond int64 (and int() refuses over 4300)
    value = int(digits) if len(digits.lstrip("+-").lstrip("0")) <= 19 else 1 << 63
    return _in_range(value, bits, text)


def _int(value: Any, bits: int) -> int:
    if isinstance(value, bool):
        raise AttrSyntaxError(f"{value!r} is a bool, not an integer")
    if isinstance(value, int):
        return _in_range(value, bits, value)
    if isinstance(value, str):
        return _to_int(value, bits)
    raise AttrSyntaxError(f"{value!r} is not an integer")


def parse_int(value: Any) -> int:
    """An ``int`` attribute: the runtime's fields are int32."""
    return _int(value, 32)


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOLS:
        return _BOOLS[value.strip().lower()]
    raise AttrSyntaxError(f"{value!r} is not a bool (True/False/true/false/1/0)")


def parse_tuple(value: Any) -> tuple[int, ...]:
    if isinstance(value, (tuple, list)):
        return tuple(_int(v, 64) for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return (_int(value, 64),)
    if not isinstance(value, str):
        raise AttrSyntaxError(f"{value!r} is not an integer tuple")
    text = value.strip()
    if text[:1] in ("(", "[") and text[-1:] in (")", "]"):  # (`"" in "(["` is True)
        if (text[0], text[-1]) not in {("(", ")"), ("[", "]")}:
            raise AttrSyntaxError(f"{value!r} has mismatched brackets")
        body = text[1:-1].strip()
        if not body:
            return ()
        items = [t for t in body.split(",")]
        if items[-1].strip() == "":  # "(1,)"
            items = items[:-1]
        return tuple(_to_int(t, 64, _TUPLE_ITEM) for t in items)  # TShape items are int64
    return (_to_int(text, 64, _TUPLE_ITEM),)


def parse_optional_int(value: Any) -> int | None:
    if value is None or (isinstance(value, str) and value.strip() == "None"):
        return None
    return parse_int(value)


def parse_str(value: Any) -> str:
    if not isinstance(value, str):
        raise AttrSyntaxError(f"{value!r} is not a string")
    return value


PARSERS: dict[str, Callable[[Any], Any]] = {
    "int": parse_int,
    "bool": parse_bool,
    "tuple": parse_tuple,
    "optional_int": parse_optional_int,
    "str": parse_str,
}


def format_value(value: Any) -> str:
    """The string the runtime's parser reads back as ``value`` (MRT's ``str(value)`` form)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "None"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(str(int(v)) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)
