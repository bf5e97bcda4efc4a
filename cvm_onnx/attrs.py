"""The CVM runtime's attribute value syntax (dmlc parameter strings), parsed and written in one place.

Values in ``op_attrs`` are strings: ints ``"3"``, bools ``"True"``/``"false"``/``"1"``, tuples ``"(1, 1)"``,
``"[1, 1]"`` or a bare ``"1"`` (an ``L`` suffix is tolerated), optional ints ``"None"``, enum names as-is.
Typed values in Python: ``int``, ``bool``, ``tuple[int, ...]``, ``None`` and ``str``.
"""
from __future__ import annotations

import re
from typing import Any, Callable

_INT = re.compile(r"^\s*[+-]?\d+L?\s*$")
_BOOLS = {"true": True, "1": True, "false": False, "0": False}


class AttrSyntaxError(ValueError):
    """A string that is not a value of the requested kind."""


def _to_int(text: str) -> int:
    if not _INT.match(text):
        raise AttrSyntaxError(f"{text!r} is not an integer")
    return int(text.strip().rstrip("L"))


def parse_int(value: Any) -> int:
    if isinstance(value, bool):
        raise AttrSyntaxError(f"{value!r} is a bool, not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return _to_int(value)
    raise AttrSyntaxError(f"{value!r} is not an integer")


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOLS:
        return _BOOLS[value.strip().lower()]
    raise AttrSyntaxError(f"{value!r} is not a bool (True/False/true/false/1/0)")


def parse_tuple(value: Any) -> tuple[int, ...]:
    if isinstance(value, (tuple, list)):
        return tuple(parse_int(v) for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
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
        return tuple(_to_int(t) for t in items)
    return (_to_int(text),)


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
