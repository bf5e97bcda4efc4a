"""An attention mask's term as users ship it: a float tensor computed elementwise from integer tensors (an int64
attention_mask input, or two moves of it: DeBERTa's outer product) and constants, as HF writes (1 - mask) * c and
torch Where(keep, 0, c), a decoder with its causal matrix, added to the scores a Softmax reads. Over the integers'
whole ranges (the packed input's clip makes them the only values it can take) at each constants' value the term is a
table; where every entry is 0 or a level that masks, the masked Softmax takes it (docs/import.md, "Masked
Softmax")."""
from __future__ import annotations

import functools
import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..context import BOOL, INT32, MAX_FOLDED, Tensor, const, foldable, onnx_cast
from ..emit import as_int32, broadcast_of, broadcast_shape, broadcasts_into
from ..registry import Refuse, integer_rule
from .qdq import MAX_TABLE, Mask, MaskedScores
from .values import Deferred, Scaled

#: Elementwise ops a mask's term may take (their other operands constants: a causal matrix, or one value).
VALUE_OPS = frozenset({"Cast", "Sub", "Add", "Mul", "Div", "Neg", "Not", "Where", "Equal", "Less", "Greater",
                       "LessOrEqual", "GreaterOrEqual", "And", "Or", "Min", "Max"})
COMPARISONS = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or"})
#: Ops that move a mask's values without changing them (their other operands shapes or axes).
LAYOUT_OPS = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Expand", "Flatten", "Transpose", "Identity"})


def carried(node: onnx.NodeProto, stored) -> list[int]:
    """The inputs of a move that carry a mask's values: a layout op's first, a Gather's by constant indices (in
    ``stored``), each of a Concat's (a slice assignment of the padding into the causal matrix, as quantize writes a
    ScatterND of constant indices: ``rewrites.scatters_as_gathers``); [] for any other node."""
    if node.op_type in LAYOUT_OPS or node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in stored:
        return [0]
    return list(range(len(node.input))) if node.op_type == "Concat" else []


def looks_up(node: onnx.NodeProto, stored) -> bool:
    """Whether ``node`` is a Gather of a 1-D constant (in ``stored``) by computed indices: elementwise in them (a
    masking row's value, ``rewrites.masking_rows_apart``)."""
    return node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in stored and \
        node.input[1] not in stored and len(stored[node.input[0]].dims) == 1


def mask_terms(graph: onnx.GraphProto, base_dir: str = "") -> set[str]:
    """The outputs of the nodes that compute an operand of an Add read by a Softmax (or a ReduceLogSumExp) alone, or a
    Where so read, through ``VALUE_OPS``, lookups (``looks_up``) and moves (their ``carried`` inputs alone), every
    reader of each within those nodes or the Add (the Softmax): the attention masks' terms, tabulated by
    ``tabulated`` (a Where of the scores by ``masked_where``); and such an Add's operand that is a float constant of
    several values, each 0 or negative, 0 among them (a causal matrix folded: ``constant_term``), read by such Adds
    alone. ``base_dir``: the folder of the graph's external data (such a constant stored there is read from it)."""
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for x in set(n.input):
            readers.setdefault(x, []).append(n)
    outputs = {o.name for o in graph.output}
    adds = [n for n in graph.node if n.op_type in ("Add", "Where") and n.output[0] not in outputs
            and [r.op_type for r in readers.get(n.output[0], [])] in (["Softmax"], ["ReduceLogSumExp"])]
    stored = {t.name: t for t in graph.initializer}
    stored.update({n.output[0]: n.attribute[0].t for n in graph.node if n.op_type == "Constant" and n.attribute
                   and n.attribute[0].name == "value"})
    cone: dict[str, onnx.NodeProto] = {}
    todo = [x for a in adds for x in (a.input if a.op_type == "Add" else a.output)]
    while todo:
        n = producer.get(todo.pop())
        if n is None or n.output[0] in cone or n.domain not in ("", "ai.onnx") or len(n.output) != 1 or \
                n.op_type not in VALUE_OPS and not carried(n, stored) and not looks_up(n, stored):
            continue
        cone[n.output[0]] = n
        todo += list(n.input) if n.op_type in VALUE_OPS else n.input[1:] if looks_up(n, stored) else \
            [n.input[i] for i in carried(n, stored)]
    ids = {id(a) for a in adds if a.op_type == "Add"} | {id(r) for a in adds for r in readers[a.output[0]]}
    while True:  # every reader inside
        out = {o for o, n in cone.items() if o in outputs or
               any(id(r) not in ids and (r.output[0] not in cone) for r in readers.get(o, []))}
        if not out:
            break
        for o in out:
            del cone[o]
    fixed = {x for a in adds if a.op_type == "Add" for x in a.input if x in stored and x not in outputs and
             all(id(r) in ids for r in readers[x]) and _levels(stored[x], base_dir)}
    return set(cone) | fixed


def _levels(t: onnx.TensorProto, base_dir: str = "") -> bool:
    """Whether a stored constant is a float one of several values, each 0 or negative, 0 among them (one in external
    data read from ``base_dir``, where given)."""
    if t.data_type not in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16) or \
            t.data_location == TensorProto.EXTERNAL and not base_dir or math.prod(t.dims) > MAX_FOLDED:
        return False
    v = numpy_helper.to_array(t, base_dir)
    return v.size > 1 and v.max() == 0 and v.min() < 0


def constant_term(x: Tensor) -> Tabulated | Tensor:
    """A constant of several values added to the scores a Softmax reads (a folded causal matrix: ``mask_terms``): a
    table of its distinct values at a constant key; one value: itself."""
    k = _keyed(x)
    return x if k is None else Tabulated(k[0], k[2])


class Tabulated(Deferred):
    """A value computed elementwise from the integers of ``t`` alone: ``table[i]`` where t = t.lo + i (a numpy
    array of the ONNX value's type). Only an attention mask added to a Softmax's scores has an integer form."""

    what = "an attention mask's term"

    def __init__(self, t: Tensor, table: np.ndarray):
        self.t, self.table, self.shape = t, table, t.shape

    def quantized(self, ctx, scale, out_zero, dtype):
        raise Refuse(f"{self.what} (a table of its integer input) has an integer form only added to the scores a "
                     "Softmax reads")


def _np_type(dtype: int) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(dtype))
    except (KeyError, TypeError, ValueError):
        raise Refuse(f"a mask's term of type {dtype}: no ONNX tensor type that numpy holds") from None


def table_op(op: str, to: int | None, args: list[np.ndarray]) -> np.ndarray:
    """``op`` on tables and constants (numpy arrays of the ONNX types), as onnxruntime computes it elementwise:
    float32 in float32 (IEEE, rounded to nearest; an overflow is inf), integers exactly."""
    with np.errstate(all="ignore"):
        if op == "Cast":
            return onnx_cast(args[0], to, "an attention mask's term")
        if op == "Neg":
            return -args[0]
        if op == "Not":
            return ~args[0]
        if op == "Where":
            return np.where(args[0], args[1], args[2]).astype(np.result_type(args[1], args[2]))
        if op == "Gather":  # of a 1-D constant: negative indices from the end, as ONNX; past either end an error
            return np.take(args[0], args[1].astype(np.int64))
        if len({a.dtype for a in args}) > 1:
            raise Refuse(f"{op} of an attention mask's term and a constant of another type")
        if op == "Div" and args[0].dtype.kind != "f":
            raise Refuse("Div of integers in an attention mask's term has no table form here")
        fn = {"Sub": np.subtract, "Add": np.add, "Mul": np.multiply, "Div": np.divide, "Equal": np.equal,
              "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal,
              "And": np.logical_and, "Or": np.logical_or, "Min": np.minimum, "Max": np.maximum}[op]
        out = functools.reduce(fn, args) if op in ("Min", "Max") else fn(*args)
        return np.asarray(out).astype(bool if op in COMPARISONS else args[0].dtype)


def _keyed(x) -> tuple[Tensor, int, np.ndarray] | None:
    """An operand of a term's op as (key, lo, values): the value at a position is values[key - lo] there, key an
    integer tensor (a variable one, or the constant index of a constant's distinct values); None for a constant of
    one value."""
    if isinstance(x, Tabulated):
        return x.t, 0 if x.t.dtype == BOOL else x.t.lo, np.asarray(x.table)
    if not x.is_const:
        lo, hi = (0, 1) if x.dtype == BOOL else (x.lo, x.hi)
        if hi - lo + 1 > MAX_TABLE:
            raise Refuse(f"an attention mask's term of an integer tensor of {hi - lo + 1} values: its table holds at "
                         "most 2^16")
        return x, lo, np.arange(lo, hi + 1).astype(_np_type(x.dtype))
    v = np.asarray(x.value)
    if v.size == 0 or (v == v.reshape(-1)[0]).all():
        return None
    values, index = np.unique(v, return_inverse=True)
    if values.size <= 1:  # NaNs throughout
        return None
    return const(index.reshape(v.shape).astype(np.int32), INT32), 0, values.astype(v.dtype)


def _unique(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(a, return_inverse=True) of integers from 0: by marking them in a table of their range where it
    is no more than a few times a's size (linear in a causal matrix's keys, where a sort is n log n)."""
    top = int(a.max(initial=-1)) + 1
    if top > 4 * a.size + 1024:
        return np.unique(a, return_inverse=True)
    seen = np.zeros(top, bool)
    seen[a] = True
    values = np.flatnonzero(seen)
    rank = np.empty(top, np.int64)
    rank[values] = np.arange(values.size)
    return values, rank[a]


def _constant_key(keys: list[tuple[Tensor, int, np.ndarray]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Constant keys combined into one, c in 0 .. K - 1 (the distinct tuples of their positions' indices, in the
    shape they broadcast to), and each one's values indexed by c."""
    shape = broadcast_of(*(k.shape for k, _, _ in keys))
    c, per = np.zeros(foldable(shape), np.int64), []
    for k, lo, values in keys:  # compacted at each step: every pair below 2^48
        pairs = c * values.size + (np.asarray(k.value, np.int64) - lo)
        tuples, c = _unique(pairs)
        per = [p[tuples // values.size] for p in per] + [values[tuples % values.size]]
        c = c.reshape(shape)
    return c, per


def _moved(ctx, node, ins: list) -> Tabulated | Tensor:
    """A move (``carried``) by its integer rule on the keys: of one table, its key; of several tables and constants
    (a Concat), one table of them all end to end, each operand's key offset to its own part (a constant's the index
    of its distinct values), at most 2^16 entries."""
    carry = range(len(ins)) if node.op_type == "Concat" else [0]
    if not any(isinstance(ins[i], Tabulated) for i in carry):
        return integer_rule(node)(ctx, node, *ins)
    if node.op_type != "Concat":
        return Tabulated(integer_rule(node)(ctx, node, ins[0].t, *ins[1:]), ins[0].table)
    keys, tables, offset = [], [], 0
    for x in ins:
        k = _keyed(x)
        if k is None:  # a constant of one value (or none)
            v = np.asarray(x.value)
            k = const(np.zeros(v.shape, np.int32), INT32), 0, v.reshape(-1)[:1]
        key, lo, values = k
        if key.is_const:
            key = const((np.asarray(key.value, np.int64) - lo + offset).astype(np.int32), INT32)
        elif offset != lo:
            key = ctx.result(ctx.op("broadcast_add", as_int32(key), const(np.array(offset - lo, np.int32), INT32)),
                             INT32, key.lo - lo + offset, key.hi - lo + offset, key.shape)
        keys.append(as_int32(key))
        tables.append(values)
        offset += values.size
    if offset > MAX_TABLE:
        raise Refuse(f"Concat of attention masks' terms: their tables hold {offset} entries in all, more than 2^16")
    if len({t.dtype for t in tables}) > 1:
        raise Refuse("Concat of attention masks' terms of different types")
    t = integer_rule(node)(ctx, node, *keys)
    return Tabulated(t, np.concatenate(tables)[t.lo:t.hi + 1])


def _lookup(node, data: Tensor, x) -> Tabulated:
    """Gather of a 1-D constant by an integer tensor (or a table of one): the constant at each integer of its range,
    negative ones from the end as ONNX reads them; those past either end, where ONNX gives no result (onnxruntime
    fails the run), clipped as ``take`` clips them."""
    v = np.asarray(data.value)
    if v.ndim != 1 or v.size == 0:
        raise Refuse(f"Gather of a constant of shape {v.shape} in an attention mask's term: a table takes one "
                     "value per integer (a 1-D constant)")
    t, lo, index = _keyed(x)
    index = index.astype(np.int64)
    return Tabulated(t, v[np.clip(np.where(index < 0, index + v.size, index), 0, v.size - 1)])


def tabulated(ctx, node, *ins) -> Tabulated | Tensor:
    """A node of an attention mask's term (``mask_terms``): a lookup of a constant (``_lookup``); a move of tables'
    keys (``_moved``); an elementwise op of a tensor of integers t (or tables of it; of several, their ``_joint`` key)
    and constants: the op on the table, over the key (t - lo) K + c, t over its whole range lo .. hi and c the index
    of the constants' distinct values at each position (K of them: a causal matrix's 0 and c), at most 2^16 keys in
    all; operands that do not broadcast, or broadcast to an empty tensor, refused."""
    if node.op_type == "Gather" and isinstance(ins[0], Tensor) and ins[0].is_const and \
            (isinstance(ins[1], Tabulated) or not ins[1].is_const):
        return _lookup(node, ins[0], ins[1])
    if node.op_type in LAYOUT_OPS | {"Gather", "Concat"}:
        return _moved(ctx, node, ins)
    shape = broadcast_shape(*(x.t if isinstance(x, Tabulated) else x for x in ins if x is not None))
    if 0 in shape:
        raise Refuse(f"{node.op_type} of an attention mask's term gives an empty tensor of shape {shape}: CVM has none")
    keyed = [None if x is None else _keyed(x) for x in ins]
    if all(k is None for k in keyed):
        return integer_rule(node)(ctx, node, *ins)
    sources = list({id(k[0]): k for k in keyed if k is not None and not k[0].is_const}.values())
    fixed = [k for k in keyed if k is not None and k[0].is_const]
    c, per = _constant_key(fixed) if fixed else (np.zeros((), np.int64), [])
    size = int(c.max()) + 1
    if sources:
        span = math.prod(table.size for _, _, table in sources)
        if span * size > MAX_TABLE:
            raise Refuse(f"{node.op_type} of an attention mask's term: a table over {span} integers of "
                         f"{len(sources)} tensor(s) at {size} constants' values would hold more than 2^16 entries")
        t, lo, picks = _joint(ctx, sources)
        key = t
        if size > 1:
            key = ctx.result(ctx.op("broadcast_mul", as_int32(t), const(np.array(size, np.int32), INT32)), INT32,
                             lo * size, (lo + span - 1) * size, t.shape)
            offset = const((c - lo * size).astype(np.int32), INT32)
            key = ctx.result(ctx.op("broadcast_add", key, offset), INT32, 0, span * size - 1,
                             broadcast_of(t.shape, c.shape))
        key = ctx.broadcast_to(key, shape)
    else:
        span, lo = 1, 0
        key = const(np.broadcast_to(c, foldable(shape)).astype(np.int32), INT32)
    args, fixed_at = [], iter(per)
    for x, k in zip(ins, keyed):
        if k is None:
            v = np.asarray(x.value)
            args.append(v.reshape(-1)[0].astype(v.dtype) if v.size else v)
        elif k[0].is_const:
            args.append(np.tile(next(fixed_at), span))
        else:
            args.append(np.repeat(k[2][picks[id(k[0])]], size))
    out = table_op(node.op_type, node.attr_int("to") if node.op_type == "Cast" else None, args)
    return Tabulated(key, out)


def _joint(ctx, sources: list[tuple[Tensor, int, np.ndarray]]) -> tuple[Tensor, int, dict[int, np.ndarray]]:
    """One key over the integers of several tensors (two moves of one mask: DeBERTa's outer product m_i m_j), each
    t_i over its R_i values from lo_i: k = sum_i (t_i - lo_i) R_(i+1) ... R_n, from 0 (``broadcast_sub``,
    ``broadcast_mul``, ``broadcast_add``: every partial key within 0 .. R_1 ... R_n - 1); with (key, its lo) the
    index into each tensor's values (by id) at each key value. Of one tensor, the tensor itself."""
    if len(sources) == 1:
        [(t, lo, table)] = sources
        return t, lo, {id(t): np.arange(table.size)}
    total = math.prod(table.size for _, _, table in sources)
    key, stride, picks = None, total, {}
    for t, lo, table in sources:
        r = table.size
        stride //= r
        picks[id(t)] = np.arange(total) // stride % r
        u = as_int32(t)
        if lo:
            u = ctx.result(ctx.op("broadcast_sub", u, const(np.array(lo, np.int32), INT32)), INT32, 0, r - 1, t.shape)
        if key is not None:
            key = ctx.result(ctx.op("broadcast_mul", key, const(np.array(r, np.int32), INT32)), INT32, 0,
                             key.hi * r, key.shape)
            u = ctx.result(ctx.op("broadcast_add", key, u), INT32, 0, key.hi + r - 1, broadcast_shape(key, u))
        key = u
    return key, 0, picks


def masked_scores(ctx, x: Scaled, term: Tabulated) -> MaskedScores:
    """x plus an attention mask's term (``mask_of_table``), for the Softmax that reads it; a mask whose shape does
    not broadcast into the scores' refused."""
    mask = mask_of_table(ctx, term)
    if not broadcasts_into(mask.shape, x.shape):
        raise Refuse(f"an attention mask of shape {mask.shape} added to scores of shape {x.shape} must broadcast "
                     "into them")
    return MaskedScores(x, mask, x.shape)


class KeptScores(Deferred):
    """Where(cond, x, c) of the scores x a Softmax reads, c a constant (GPT-2's causal Where; Where(cond, c, x)
    alike): x' + m, x' = x where kept and 0 elsewhere (``x``, on x's grid at zero point 0) and m = Where(cond, 0, c)
    (``term``, a table), which float32 computes alike (0 + v is v); with a mask's term added, x' + (m + term).
    Only a Softmax or a ReduceLogSumExp, or an Add of a mask's term they read, takes it (``masked_scores``)."""

    what = "scores masked by a Where"

    def __init__(self, x: Scaled, term: Tabulated):
        self.x, self.term, self.shape = x, term, x.shape

    def masked_scores(self, ctx) -> MaskedScores:
        return masked_scores(ctx, self.x, self.term)

    def quantized(self, ctx, scale, out_zero, dtype):
        raise Refuse(f"{self.what} (a constant where it masks) has an integer form only in the scores a Softmax reads")


def looked_up(ctx, x: Tabulated, entries: np.ndarray) -> Tensor:
    """entries[i] at each position where the table's key is lo + i (int32): a constant of a constant key, t itself
    where entries is the identity, else a cvm_lut of t - lo."""
    t, lo = x.t, 0 if x.t.dtype == BOOL else x.t.lo
    entries = np.asarray(entries, np.int64)
    if t.is_const:
        return const(entries[np.asarray(t.value, np.int64) - lo].astype(np.int32), INT32)
    if lo == 0 and np.array_equal(entries, np.arange(entries.size)):
        return t
    index = as_int32(t)
    if lo:
        index = ctx.result(ctx.op("broadcast_sub", index, const(np.array(lo, np.int32), INT32)), INT32, 0,
                           entries.size - 1, t.shape)
    e = ctx.emit("cvm_lut", ctx.entry(index), ctx.entry(const(entries.astype(np.int32), INT32)), in_dim=entries.size)
    return ctx.result(e, INT32, int(entries.min()), int(entries.max()), t.shape)


def mask_of_table(ctx, x: Tabulated) -> Mask:
    """The mask a table gives: its levels (ascending) the distinct values, each 0 or negative (-inf too); g the
    index of each position's (``looked_up``)."""
    table = np.asarray(x.table)
    if table.dtype.kind != "f":
        raise Refuse(f"{x.what} of {table.dtype} values: a mask is float")
    lo = 0 if x.t.dtype == BOOL else x.t.lo
    bad = np.flatnonzero(np.isnan(table) | (table > 0))
    if bad.size:
        raise Refuse(f"{x.what} takes {float(table[bad[0]]):g} at the integer {lo + int(bad[0])}: an attention mask "
                     "takes 0 and negative values")
    levels, g = np.unique(table, return_inverse=True)
    return Mask(looked_up(ctx, x, g), tuple(float(v) for v in levels), x.t.shape)
