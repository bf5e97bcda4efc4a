"""The op registry: each CVM op defined once, as a subclass of ``Op`` registered under its runtime name.

An op definition states the runtime's rules for that op: typed attributes with defaults and ranges, input
arity, output count, shape inference, precision inference (``FInferPrecision``), the FORMAL reference kernel
and the patterns on which the runtime's devices disagree (portability warnings).

Rules are broken by raising ``OpRuleError`` with a sentence naming the rule; validation attaches the node.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from ..attrs import PARSERS, AttrSyntaxError
from ..constants import precision_bound
from ..graph import TensorType

Shape = tuple[int, ...]
REQUIRED: Any = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()


class OpRuleError(ValueError):
    """A load-time rule of the runtime that an op's inputs or attributes break."""


@dataclass(frozen=True)
class Attr:
    """One attribute: its name, kind (int, bool, tuple, optional_int, str), default and range check.

    ``check`` receives the typed value and returns ``None`` or the broken rule as a sentence.
    """

    name: str
    kind: str
    default: Any = REQUIRED
    check: Callable[[Any], str | None] | None = None

    def parse(self, value: Any) -> Any:
        typed = PARSERS[self.kind](value)
        if self.check is not None and (err := self.check(typed)) is not None:
            raise OpRuleError(f"attribute {self.name}={value!r}: {err}")
        return typed


def in_range(lo: int, hi: int) -> Callable[[Any], str | None]:
    """Check for an int, or every item of a tuple, lying in [lo, hi] (the runtime's VerifyAttrRange)."""

    def check(value: Any) -> str | None:
        items = value if isinstance(value, tuple) else (value,)
        bad = [v for v in items if v is not None and not lo <= v <= hi]
        return f"must lie in [{lo}, {hi}]" if bad else None

    return check


def one_of(*choices: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"


class Attrs:
    """Typed attribute values of one node, defaults filled in; read as ``a.shift_bit``."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, Any]):
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Attrs are read-only")

    def items(self):
        return self._values.items()

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Attrs) and self._values == other._values

    def __repr__(self) -> str:
        return f"Attrs({self._values})"


class Op:
    """Base of every op definition. Subclasses set ``name``, ``attrs``, ``inputs`` and override the rules.

    ``inputs`` is the input count, or a function of the attributes returning (min, max) (e.g. ``use_bias``).
    ``shape`` returns the output shape (a list of shapes for multi-output ops); ``precision`` returns the output
    precision (a list for multi-output ops); ``kernel`` computes the outputs from int32 arrays.
    """

    name: ClassVar[str]
    family: ClassVar[str]
    attrs: ClassVar[tuple[Attr, ...]] = ()
    inputs: ClassVar[int | Callable[[Attrs], tuple[int, int]]] = 1
    outputs: ClassVar[int] = 1
    doc: ClassVar[str] = ""
    #: The runtime's names of the inputs (its op table); the exported functions' parameter names.
    input_names: ClassVar[tuple[str, ...]] = ("data",)
    #: For an op run by the native custom-op library (cvm_onnx/native): the attributes its native op takes, as
    #: ONNX ints with the defaults above; None for the others.
    native_attrs: ClassVar[tuple[str, ...] | None] = None
    #: ``bound(a, shapes, bounds, values) -> [B_k]``: a bound on |y_k| for each output from the inputs' shapes,
    #: their bounds and, for a param, its value (else None); the exporter's lowerings rely on it
    #: (converters/to_onnx/bounds.py). Every op states one.
    bound: ClassVar[Callable[..., list[int]] | None] = None
    #: ``interval(a, intervals) -> [(lo_k, hi_k)]``: the values each output can take when each input's values lie
    #: in its interval [lo, hi] (no int32 wrap: the values are within 32 bits), stated by the ops the importer
    #: applies to intervals (``output_intervals``); the others have the symmetric interval of ``bound``.
    interval: ClassVar[Callable[..., list[tuple[int, int]]] | None] = None
    #: Whether every output is >= 0 when every input is (monotone maps fixing 0, selections, and sums or products
    #: of non-negative values): read by ``nonnegative``, the exporter's proof of x >= 0 (to_onnx/bounds.py).
    keeps_nonnegative: ClassVar[bool] = False
    #: The monotone step the op is on its data input, for a requantization run (to_onnx/requantize/
    #: ``steps_of``): "shift" (cvm_right_shift), "left_shift", "limit" (cvm_clip: clip to the precision), "clip",
    #: "relu", "scalar" (a broadcast op by a one-number param); None: no step.
    step: ClassVar[str | None] = None

    @classmethod
    def nonnegative(cls, a: Attrs, inputs: bool) -> bool:
        """Whether every output is >= 0, given whether every input is (``inputs``)."""
        return cls.keeps_nonnegative and inputs

    # -- attribute handling -------------------------------------------------------------------------------
    @classmethod
    def parse_attrs(cls, given: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Typed values of the attributes given, and every broken rule (unknown name, bad value, missing)."""
        known = {a.name: a for a in cls.attrs}
        typed: dict[str, Any] = {}
        errors: list[str] = []
        for name, value in given.items():
            if name.startswith("__") and name.endswith("__"):
                continue  # hidden attributes are ignored by the runtime's parser
            if name not in known:
                errors.append(f"unknown attribute {name!r} (known: {', '.join(known) or 'none'})")
                continue
            try:
                typed[name] = known[name].parse(value)
            except (AttrSyntaxError, OpRuleError) as e:
                msg = str(e)
                errors.append(msg if msg.startswith("attribute") else f"attribute {name}={value!r}: {msg}")
        for a in cls.attrs:
            if a.default is REQUIRED and a.name not in given:
                errors.append(f"attribute {a.name} is required")
        return typed, errors

    @classmethod
    def bind(cls, typed: dict[str, Any]) -> Attrs:
        """All attributes of a node, the given ones over the defaults."""
        return Attrs({a.name: typed.get(a.name, a.default) for a in cls.attrs})

    @classmethod
    def arity(cls, a: Attrs) -> tuple[int, int]:
        n = cls.inputs
        return n(a) if callable(n) else (n, n)

    # -- rules (override) ---------------------------------------------------------------------------------
    @staticmethod
    def shape(a: Attrs, *shapes: Shape) -> Shape | list[Shape]:
        return shapes[0]

    @staticmethod
    def precision(a: Attrs, precisions: list[int], shapes: list[Shape]) -> int | list[int]:
        return precisions[0]

    @staticmethod
    def kernel(a: Attrs, *xs: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        raise NotImplementedError

    @staticmethod
    def warnings(a: Attrs, shapes: list[Shape], precisions: list[int]) -> list[str]:
        """Patterns the runtime's CPU and FORMAL devices compute differently (the model is not portable)."""
        return []

    @staticmethod
    def base_ops(a: Attrs, shapes: list[Shape], out: Shape) -> int:
        """The runtime's cost of one element of output 0 (``CvmRuntime::GetOps``, its "base ops"; ``out`` is output
        0's shape): 1 unless the op states its own (core/gas.py)."""
        return 1

    @staticmethod
    def batch_refusal(a: Attrs, shapes: list[Shape], derived: list[bool], n: int) -> str | None:
        """Why the op cannot take a batch of ``n`` although its output shapes keep the batch axis (``derived``:
        which inputs are computed from the model's input), or None (cvm_onnx/core/batch.py)."""
        return None

    @classmethod
    def input_names_for(cls, n: int) -> list[str]:
        """The names of ``n`` inputs."""
        return list(cls.input_names)[:n]

    @classmethod
    def attr(cls, name: str) -> Attr:
        return next(a for a in cls.attrs if a.name == name)

    # -- uniform access (lists, whatever the output count) ------------------------------------------------
    @classmethod
    def infer_shapes(cls, a: Attrs, shapes: list[Shape]) -> list[Shape]:
        out = cls.shape(a, *shapes)
        out = [tuple(int(d) for d in s) for s in out] if cls.outputs > 1 else [tuple(int(d) for d in out)]
        return out

    @classmethod
    def infer_precisions(cls, a: Attrs, precisions: list[int], shapes: list[Shape]) -> list[int]:
        out = cls.precision(a, precisions, shapes)
        return list(out) if cls.outputs > 1 else [out]

    @classmethod
    def run(cls, a: Attrs, xs: list[np.ndarray]) -> list[np.ndarray]:
        out = cls.kernel(a, *xs)
        return list(out) if cls.outputs > 1 else [out]


REGISTRY: dict[str, type[Op]] = {}


def register(cls: type[Op]) -> type[Op]:
    """Class decorator: add an op definition to the registry under ``cls.name``."""
    if cls.name in REGISTRY:
        raise ValueError(f"op {cls.name} defined twice")
    REGISTRY[cls.name] = cls
    return cls


def get(name: str) -> type[Op]:
    return REGISTRY[name]


class NodeRuleError(OpRuleError):
    """Every rule one node breaks (``rules``, sentences); the caller names the node and its op."""

    def __init__(self, rules: list[str]):
        super().__init__("; ".join(rules))
        self.rules = rules


@dataclass(frozen=True)
class TypedNode:
    """A node typed by its op's rules: its attributes as given (typed), all of them with the defaults (``attrs``),
    and its output types (None when an input's type is unknown)."""

    given: dict[str, Any]
    attrs: Attrs
    outputs: tuple[TensorType, ...] | None


def type_node(op: str, attrs: dict[str, Any], types: Sequence[TensorType | None]) -> TypedNode:
    """Type one node of op ``op`` (registered) on inputs of ``types``: parse the given attributes, bind the
    defaults, check the input count, infer the output shapes and precisions (skipped when a type is None, after
    the attribute and arity rules). Raises ``NodeRuleError`` with every broken rule. The one typing step of
    validation, batching and the importer."""
    cls = REGISTRY[op]
    given, errors = cls.parse_attrs(attrs)
    if errors:
        raise NodeRuleError(errors)
    a = cls.bind(given)
    lo, hi = cls.arity(a)
    if not lo <= len(types) <= hi:
        raise NodeRuleError([f"takes {lo if lo == hi else f'{lo} to {hi}'} inputs, got {len(types)}"])
    if any(t is None for t in types):
        return TypedNode(given, a, None)
    shapes = [t.shape for t in types]
    try:
        out_shapes = cls.infer_shapes(a, shapes)
        precisions = cls.infer_precisions(a, [t.precision for t in types], shapes)
    except OpRuleError as e:
        raise NodeRuleError([str(e)]) from None
    return TypedNode(given, a, tuple(TensorType(s, p) for s, p in zip(out_shapes, precisions)))


# -- helpers shared by op definitions ------------------------------------------------------------------------
def output_intervals(op: type[Op], a: Attrs, shapes: list[Shape], intervals: list[tuple[int, int]],
                     values: list) -> list[tuple[int, int]]:
    """Each output's interval [lo, hi] by the op's ``interval`` rule, else [-B, B] with B its ``bound`` from the
    inputs' magnitudes."""
    if op.interval is not None:
        return op.interval(a, intervals)
    return [(-b, b) for b in op.bound(a, shapes, [max(-lo, hi, 0) for lo, hi in intervals], values)]


def input_bound(a: Attrs, shapes: list[Shape], bounds: list[int], values: list) -> list[int]:
    """The bound of an op whose output holds values of its first input, moved or selected (or smaller)."""
    return [bounds[0]]


def sum_bound(a: Attrs, shapes: list[Shape], bounds: list[int], values: list) -> list[int]:
    """The bound of a sum of two inputs."""
    return [bounds[0] + bounds[1]]


def bits(n: int) -> int:
    """Number of binary digits of n (the runtime's GetReduceSumBit): 1->1, 2..3->2, 4..7->3."""
    return int(n).bit_length()


def number_precision(n: int) -> int:
    """The runtime's GetNumberPrecision(n) = bits(n + 1) + 1: the precision that holds +-n."""
    return bits(n + 1) + 1


def max_abs(x: np.ndarray) -> int:
    """max |x| over an integer array (0 if empty), without a widened copy: |INT_MIN| counts as 2^(bits-1)."""
    return max(-int(x.min()), int(x.max())) if x.size else 0


def magnitudes(x: np.ndarray) -> np.ndarray:
    """|x| of a signed integer array as the unsigned type of the same width (|INT_MIN| = 2^(bits-1) fits):
    one array the size of x instead of an int64 copy."""
    return np.abs(x).view(x.dtype.str.replace("i", "u"))


def clip_to_precision(x: np.ndarray, precision: int) -> np.ndarray:
    """Symmetric clip to +-(2^(p-1)-1), as int32 (a new array: np.clip's, cast only where it is not int32)."""
    r = precision_bound(precision)
    return np.clip(x, -r, r).astype(np.int32, copy=False)


def require(cond: bool, rule: str) -> None:
    if not cond:
        raise OpRuleError(rule)
