"""The import context: ONNX tensors as CVM entries or constants, each with a proven interval of values.

Every ONNX tensor becomes a ``Tensor``: its ONNX element type and shape, an interval [lo, hi] holding every value
it can take, and either its value (initializers, Constant nodes, folded shape arithmetic) or the CVM entry that
computes it. Two kinds of bound are kept apart:

* the interval decides exactness: an ONNX integer op wraps in its element type and float32 rounds beyond 2^24,
  while CVM computes exactly in int32, so a CVM form is exact when the interval proves the ONNX result is
  neither wrapped nor rounded, and fits 32 bits;
* the CVM precision (the label the runtime re-infers from its rules) decides validity: conv2d/dense inputs need
  <= 8 bits, every entry <= 32 bits. Where the interval proves a tighter bound than the label, a ``cvm_clip`` to
  that bound (an identity on every value the tensor can take) lowers the label.

A CVM scalar does not exist: a 0-d ONNX tensor is the CVM shape (1,), which broadcasts the same way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from cvm_onnx.core.constants import ANY, FLOAT32_EXACT, FLOAT64_EXACT, INT32_MAX, INT32_MIN, tight
from cvm_onnx.core.constants import precision_bound as bound
from cvm_onnx.core.graph import VARIABLE, Entry, Node, TensorType
from cvm_onnx.core.ops import REGISTRY, NodeRuleError, type_node
from cvm_onnx.core.ops.registry import output_intervals
from cvm_onnx.core.validate import shape_problem

from .registry import Refuse

INT32 = TensorProto.INT32
INT16 = TensorProto.INT16
BOOL = TensorProto.BOOL

INT_RANGES = {
    TensorProto.BOOL: (0, 1),
    TensorProto.INT8: (-(1 << 7), (1 << 7) - 1), TensorProto.UINT8: (0, (1 << 8) - 1),
    TensorProto.INT16: (-(1 << 15), (1 << 15) - 1), TensorProto.UINT16: (0, (1 << 16) - 1),
    TensorProto.INT32: (INT32_MIN, INT32_MAX), TensorProto.UINT32: (0, (1 << 32) - 1),
    TensorProto.INT64: (-(1 << 63), (1 << 63) - 1), TensorProto.UINT64: (0, (1 << 64) - 1),
}
#: Float types carry integers exactly up to this magnitude (24 and 53 bits of mantissa).
FLOAT_EXACT = {TensorProto.FLOAT: FLOAT32_EXACT, TensorProto.DOUBLE: FLOAT64_EXACT}


def cvm_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The CVM shape of an ONNX shape: a scalar is (1,)."""
    return tuple(shape) or (1,)


def type_name(dtype: int) -> str:
    return TensorProto.DataType.Name(dtype).lower() if dtype in TensorProto.DataType.values() else f"type {dtype}"


def onnx_cast(v: np.ndarray, to: int, what: str) -> np.ndarray:
    """ONNX's Cast of the array ``v`` (of ``what``) to the ONNX type ``to``, as a numpy array of that type: to bool
    v != 0; from a float type to an integer one truncation toward zero, refused where a value is not finite or the
    type does not hold it (ONNX leaves that conversion undefined); any other, numpy's conversion."""
    if to == BOOL:
        return v != 0
    try:
        target = np.dtype(helper.tensor_dtype_to_np_dtype(to))
    except (KeyError, TypeError, ValueError):
        raise Refuse(f"Cast of {what} to {type_name(to)}: no ONNX tensor type that numpy holds") from None
    if target.kind not in "iu" or v.dtype.kind != "f":
        return v.astype(target)
    lo, hi = INT_RANGES[to]
    out = np.trunc(v)
    bad = ~np.isfinite(v) | (out < lo) | (out >= hi + 1)
    if bad.any():
        raise Refuse(f"Cast to {type_name(to)} of {what} reaching {float(v[bad].flat[0])}, which the type does not "
                     f"hold (ONNX leaves that conversion undefined): clip them to [{lo}, {hi}] first")
    return out.astype(target)


def is_supported_type(dtype: int) -> bool:
    return dtype in INT_RANGES or dtype in FLOAT_EXACT


@dataclass(frozen=True, eq=False)
class Tensor:
    """One ONNX tensor: element type, ONNX shape, value interval, and a constant value or a CVM entry."""

    dtype: int
    shape: tuple[int, ...]
    lo: int
    hi: int
    entry: Entry | None = None
    value: np.ndarray | None = None
    name: str | None = None

    @property
    def is_const(self) -> bool:
        return self.value is not None

    @property
    def peak(self) -> int:
        """max |x|."""
        return max(-self.lo, self.hi, 0)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def interval(value: np.ndarray) -> tuple[int, int]:
    """[floor(min), ceil(max)] of an array (of integers, or of floats, which may be anything)."""
    if value.size == 0:
        return 0, 0
    if value.dtype.kind == "f":
        if not np.isfinite(value).all():
            return -(1 << 64), 1 << 64
        return math.floor(value.min()), math.ceil(value.max())
    return int(value.min()), int(value.max())


MAX_FOLDED = 1 << 24  # elements a constant computed by the importer may have


def foldable(shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape``, when a constant of that shape may be computed; checked before allocating, since a few bytes of
    ONNX (a Clip whose bounds cross, an Expand of a scalar) can describe a constant of any size, or of a negative
    dim (ConstantOfShape of [-5])."""
    if any(d < 0 for d in shape):
        raise Refuse(f"a constant of shape {tuple(shape)}: a dim is negative")
    n = math.prod(shape)
    if n > MAX_FOLDED:
        raise Refuse(f"folding it would compute a constant of {n} elements (at most 2^24 are folded)")
    return shape


def const(value: np.ndarray, dtype: int, name: str | None = None) -> Tensor:
    value = np.asarray(value)
    lo, hi = interval(value)
    return Tensor(dtype, tuple(int(d) for d in value.shape), lo, hi, value=value, name=name)


class TooWide(Refuse):
    """A CVM op's output precision would exceed 32 bits."""


class Importer:
    """The CVM graph under construction: nodes typed as they are added, params, bounds, names."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.params: dict[str, np.ndarray] = {}
        self.bounds: dict[Entry, int] = {}  # the exporter's bound on |x| of every entry (bounds.py)
        self.names: set[str] = set()
        self._taken: dict[str, int] = {}  # per name given to fresh, the k below which every name/k is taken
        self.split_above: Fraction | None = None  # with two_part, 0 (requant_plans.plan; qdq.requantize)
        self.declared: dict[str, int] = {}  # precisions the model declares for its initializers (round trip)
        self.pending: dict[str, Tensor] = {}  # those initializers not yet made params, in the model's order
        self.stored: dict[str, np.dtype] = {}  # and the type they are stored in, int8 or int32 (kept as params)
        self._consts: dict[Tensor, Entry] = {}  # params made of constants (a Tensor hashes by identity)
        self._named: dict[str, Entry] = {}  # the same, by the name of the ONNX tensor they come from
        self.base = ""  # name of the ONNX node being imported: the default name of the CVM nodes it becomes
        self.base_dir: Path | None = None  # the model's directory (external data)
        self.requants: list = []  # the requantizations of the quantized front (quantized.Requant), for the report
        self.shapes: dict[str, tuple[int, ...]] = {}  # static shapes the model declares (value_info, inputs, outputs)
        self.means: dict = {}  # the masked means by their Div's output (quantized.MaskedMean)

    # -- names and types ------------------------------------------------------------------------------------------
    def fresh(self, name: str) -> str:
        """``name``, or ``name/k`` with the first free k when it is taken (names are never freed: the search resumes
        where the last one for ``name`` ended, so the thousands of nodes of one unrolled layer cost linear time)."""
        k = self._taken.get(name, 0)
        out = name if k == 0 else f"{name}/{k}"
        while out in self.names:
            k += 1
            out = f"{name}/{k}"
        self.names.add(out)
        self._taken[name] = k
        return out

    def type_of(self, e: Entry) -> TensorType:
        return self.nodes[e.node].outputs[e.index]

    def tensor(self, e: Entry) -> Tensor:
        """The int32 tensor of a CVM entry whose values are known by the exporter's bound."""
        b = self.bounds[e]
        return Tensor(TensorProto.INT32, self.type_of(e).shape, -b, b, e)

    # -- variables --------------------------------------------------------------------------------------------------
    def variable(self, name: str, shape: tuple[int, ...], precision: int, value: np.ndarray | None = None,
                 stored: np.dtype | None = None) -> Entry:
        """A variable: the input (no value) or a param, stored as ``stored`` (int8 or int32) when given, else int8
        when its precision is <= 8, else int32."""
        name = self.fresh(name)
        self.nodes.append(Node(name, VARIABLE, outputs=(TensorType(tuple(shape), precision),)))
        e = Entry(len(self.nodes) - 1)
        self.bounds[e] = bound(precision)
        if value is not None:
            dtype = stored or (np.int8 if precision <= 8 else np.int32)
            self.params[name] = value.reshape(shape).astype(dtype, copy=False)  # no copy where it has the type
            self.bounds[e] = max(-int(value.min(initial=0)), int(value.max(initial=0)))  # |value|'s, no copy
        return e

    def entry(self, t: Tensor) -> Entry:
        """The CVM entry of ``t``; a constant becomes a param (once), named after its ONNX tensor."""
        if t.entry is not None:
            return t.entry
        if t in self._consts:
            return self._consts[t]
        if t.name in self._named:  # the same initializer read through another tensor (a widening Cast)
            return self._named[t.name]
        if t.name in self.pending:  # the params a model declares come back in its order: the earlier ones first
            for name in list(self.pending):
                earlier = self.pending.pop(name)
                if name == t.name:
                    break
                self.entry(earlier)
        v = t.value
        what = f"constant {t.name}" if t.name else "a constant"
        if not v.size:
            raise Refuse(f"{what} of shape {t.shape} is empty: CVM has no empty tensors")
        if v.dtype.kind == "f" and not np.array_equal(v, np.round(v)):
            raise Refuse(f"{what} holds non-integer values")
        if t.peak > INT32_MAX:
            raise Refuse(f"{what} holds {t.peak}, beyond 32 bits")
        p = self.declared.get(t.name or "", tight(t.peak))
        stored = self.stored.get(t.name or "")
        e = self.variable(t.name or f"{self.base}/const", cvm_shape(t.shape), p,
                          np.asarray(v, np.int64) if v.dtype.kind in "fb" else v, stored)
        self._consts[t] = e
        if t.name:
            self._named[t.name] = e
        return e

    # -- op nodes ---------------------------------------------------------------------------------------------------
    def emit(self, op: str, *inputs: Entry, name: str | None = None, **attrs) -> Entry | tuple[Entry, ...]:
        """Add CVM op node ``op`` with typed ``attrs``, typed at once by the op's rules (``Refuse`` if they fail,
        ``TooWide`` if an output needs more than 32 bits); returns its entry (a tuple for several outputs). A clip
        to one value v (CVM's clip needs a_min < a_max) is clip(clip(x, v - 1, v), v, v + 1), for |v| <= 2^31 - 3:
        a clip's bounds hold at most 2^31 - 2 in magnitude (the runtime's precision of a clip is GetNumberPrecision
        of its larger bound), so a v nearer the ends has no such form and is refused."""
        if op == "clip" and attrs.get("a_min") == attrs.get("a_max") is not None:
            v = attrs["a_min"]
            if abs(v) > INT32_MAX - 2:
                raise Refuse(f"clip to the one value {v}: CVM's clip needs a_min < a_max, and the two clips that give "
                             f"one value need the bound {v + (1 if v > 0 else -1)}, past a clip's 2^31 - 2")
            inner = self.emit("clip", *inputs, name=name, a_min=v - 1, a_max=v)
            return self.emit("clip", inner, name=name, a_min=v, a_max=v + 1)
        outs = self.add(self.typed(op, inputs, name or self.base or op, attrs))
        return outs if REGISTRY[op].outputs > 1 else outs[0]

    def typed(self, op: str, inputs: tuple[Entry, ...], name: str, attrs: dict) -> Node:
        """The node ``op(inputs)`` with its output types, by the op's rules; not added yet."""
        types = [self.type_of(e) for e in inputs]
        try:
            typed = type_node(op, attrs, types)
        except NodeRuleError as e:
            raise Refuse(f"{op}: {e}") from None
        for t in typed.outputs:
            if (err := shape_problem(t.shape)) is not None:
                raise Refuse(f"{op}: output {err}")
        if (p := max(t.precision for t in typed.outputs)) > 32:
            raise TooWide(f"precision bound exceeded: a step of its integer form, of inputs of "
                          f"{[t.precision for t in types]} bits, needs {p} bits, past CVM's 32")
        return Node(name, op, tuple(inputs), typed.given, typed.outputs)

    def add(self, node: Node) -> tuple[Entry, ...]:
        """Append a typed node (its name made unique) and record its bounds."""
        found = self.bounds_of(node)
        self.nodes.append(replace(node, name=self.fresh(node.name)))
        i = len(self.nodes) - 1
        for k, b in enumerate(found):
            self.bounds[Entry(i, k)] = b
        return tuple(Entry(i, k) for k in range(len(node.outputs)))

    def param_value(self, e: Entry) -> np.ndarray | None:
        node = self.nodes[e.node]
        return self.params.get(node.name) if node.is_variable else None

    def bounds_of(self, node: Node) -> list[int]:
        """The op's bound rule (as in the exporter's bounds.py) on the outputs of ``node``, from its inputs' bounds
        and param values."""
        bounds = [self.bounds[e] for e in node.inputs]
        op = REGISTRY[node.op]
        found = op.bound(op.bind(node.attrs), [self.type_of(e).shape for e in node.inputs], bounds,
                         [self.param_value(e) for e in node.inputs])
        return [min(int(b), ANY) for b in found]

    # -- tensors ----------------------------------------------------------------------------------------------------
    def narrow(self, t: Tensor, p: int, what: str = "input") -> Entry:
        """``t``'s entry with a CVM precision <= p: as is, or through a cvm_clip that the interval proves exact."""
        e = self.entry(t)
        if self.type_of(e).precision <= p:
            return e
        if tight(t.peak) > p:
            raise Refuse(f"precision bound exceeded: the {what} must hold {p}-bit values (|x| <= {bound(p)}) for "
                         f"CVM, but its values may reach {t.peak}")
        return self.emit("cvm_clip", e, precision=tight(t.peak))

    def op(self, op: str, *xs: Tensor, **attrs) -> Entry | tuple[Entry, ...]:
        """Emit ``op`` on tensors; if an output would pass 32 bits, first narrow each input's label to its interval."""
        try:
            return self.emit(op, *map(self.entry, xs), **attrs)
        except TooWide:
            narrowed = [self.narrow(x, tight(x.peak)) for x in xs]
            return self.emit(op, *narrowed, **attrs)

    def apply(self, op: str, *xs: Tensor, dtype: int = TensorProto.INT32, shape: tuple[int, ...] | None = None,
              **attrs) -> Tensor:
        """``op`` on tensors (as ``op``) as the ONNX tensor ``result`` checks, with the interval the op's own rule
        gives from the inputs' intervals (``interval`` in core/ops, else its ``bound``)."""
        e = self.op(op, *xs, **attrs)
        return self.result(e, dtype, *op_interval(op, *xs, **attrs), shape)

    def result(self, e: Entry, dtype: int, lo: int, hi: int, shape: tuple[int, ...] | None = None) -> Tensor:
        """The ONNX tensor computed by entry ``e`` with values in [lo, hi], after checking that ONNX computes them
        without wrapping (integers) or rounding (floats), and that they fit 32 bits. A CVM label below the
        interval (where, broadcast_greater) is raised with a cvm_clip so every later rule can trust it."""
        peak = max(-lo, hi, 0)
        check_values(dtype, lo, hi)
        if self.type_of(e).precision < tight(peak):
            e = self.emit("cvm_clip", e, precision=tight(peak))
        shape = self.type_of(e).shape if shape is None else tuple(shape)
        assert cvm_shape(shape) == self.type_of(e).shape, (shape, self.type_of(e).shape)
        return Tensor(dtype, shape, lo, hi, e)

    def reshape(self, t: Tensor, shape: tuple[int, ...]) -> Tensor:
        """``t`` with the ONNX shape ``shape`` (same size), a CVM reshape when the CVM shape changes."""
        shape = tuple(int(d) for d in shape)
        if t.is_const:
            return replace(t, shape=shape, value=t.value.reshape(shape), name=None)
        if cvm_shape(shape) == self.type_of(t.entry).shape:
            return replace(t, shape=shape)
        return replace(t, shape=shape, entry=self.emit("reshape", t.entry, shape=cvm_shape(shape)))

    def broadcast_to(self, t: Tensor, shape: tuple[int, ...]) -> Tensor:
        """``t`` broadcast to ``shape`` (numpy rules): a reshape to the rank, then a repeat per stretched axis."""
        shape = tuple(shape)
        if t.shape == shape:
            return t
        if t.is_const:
            return replace(t, shape=shape, value=np.broadcast_to(t.value, foldable(shape)), name=None)
        t = self.reshape(t, (1,) * (len(shape) - len(t.shape)) + t.shape)
        e = t.entry
        for axis, (d, n) in enumerate(zip(t.shape, shape)):
            if d != n:
                e = self.emit("repeat", e, repeats=n, axis=axis)
        return replace(t, shape=shape, entry=e)


def op_interval(op: str, *xs: Tensor, **attrs) -> tuple[int, int]:
    """The interval of CVM op ``op``'s output on tensors by the op's own rule (``interval`` in core/ops, else its
    ``bound``): what a rule's result holds, known before it is emitted."""
    rule = REGISTRY[op]
    [(lo, hi)] = output_intervals(rule, rule.bind(rule.parse_attrs(attrs)[0]), [cvm_shape(x.shape) for x in xs],
                                  [(x.lo, x.hi) for x in xs], [x.value for x in xs])
    return lo, hi


def check_values(dtype: int, lo: int, hi: int) -> None:
    """Refuse values that ONNX would wrap (integers) or round (floats), or that need more than 32 bits."""
    peak = max(-lo, hi, 0)
    if dtype in INT_RANGES:
        tlo, thi = INT_RANGES[dtype]
        if lo < tlo or hi > thi:
            raise Refuse(f"precision bound exceeded: values may reach [{lo}, {hi}], outside {type_name(dtype)} "
                         f"[{tlo}, {thi}]; ONNX wraps them, CVM would not")
    elif dtype in FLOAT_EXACT:
        if peak > FLOAT_EXACT[dtype]:
            raise Refuse(f"precision bound exceeded: values may reach {peak}, beyond the integers "
                         f"{type_name(dtype)} holds exactly (2^{FLOAT_EXACT[dtype].bit_length() - 1})")
    else:
        raise Refuse(f"non-integer type {type_name(dtype)}")
    if peak > INT32_MAX:
        raise Refuse(f"precision bound exceeded: values may reach {peak}, beyond CVM's 32 bits")
