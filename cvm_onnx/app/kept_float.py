"""The nodes quantize_static must leave float (its ``nodes_to_exclude``), so that the importer's exact rules see
them whole: an attention mask's term with its Add and Softmax (the scores keep their own grid), and a written-out L2
normalization; each given its own copies of the constants it reads, which quantize_static would otherwise quantize
for another reader."""
from __future__ import annotations

import itertools
import math
import os
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from cvm_onnx.core.format.onnx_file import dims as onnx_dims


#: The most elements of a mask's integer tensor evaluated at its positions (larger: one value for all).
MAX_LEAF = 1 << 20
#: The highest masked value quantize leaves float (BERT's -10000; torch and HF write float32's min): the importer's
#: masked Softmax then takes scores up to |x| = 4947 (c <= -(2 |x| + 106)).
MASK_LOW = -10000.0
#: The ops whose input of scores plus a mask the importer takes (docs/import.md, "Masked Softmax").
READERS = ("Softmax", "ReduceLogSumExp")
#: The most rows of a table a mask's term looks up (``masks.looks_up``) that each value of its index is tried at.
MAX_ROWS = 1024


def masked_softmaxes(model: onnx.ModelProto, base_dir: str = "") -> list[onnx.NodeProto]:
    """The nodes of each Softmax(x + m) (or ReduceLogSumExp: ``READERS``) where m is an attention mask's term: computed
    from one integer tensor by elementwise ops of constants and moves (``mask_terms``: torch's Where(keep, 0, c),
    HF's (1 - mask) * c, a decoder's padding term with its causal matrix, or that matrix alone, each read by every
    layer's Add and by nothing else; a masking row's value looked up, ``rewrites.masking_rows_apart``), and, with
    that tensor 0 or 1 throughout (each row of a table the term looks up: at most ``MAX_ROWS``) and its moves
    evaluated, 0 or at most ``MASK_LOW`` (-inf too) everywhere, each of the two somewhere; with the Where on the
    scores x that the Add or the Softmax reads, Where(cond, x, c) or Where(cond, c, x) of a constant c at most
    ``MASK_LOW`` (GPT-2's causal Where). Its float nodes, the Add and the Softmax, which quantize_static then leaves
    float (nodes_to_exclude), so that x keeps its own grid and the mask stays exact; the importer's masked-Softmax
    rule takes them (docs/import.md, "Masked Softmax"). ``base_dir``: the folder of the model's external data (a
    graph loaded without it: each constant read is loaded from there alone)."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    from cvm_onnx.converters.from_onnx.quantized.masks import LAYOUT_OPS, carried, looks_up, mask_terms, table_op

    graph = model.graph
    terms = mask_terms(graph, base_dir)
    if not terms:
        return []
    consts = {t.name: t for t in graph.initializer}
    consts.update({n.output[0]: n.attribute[0].t for n in graph.node if n.op_type == "Constant" and n.attribute
                   and n.attribute[0].name == "value"})
    producer = {o: n for n in graph.node for o in n.output}
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    for n in graph.node:  # the types the ops fix (no shape inference: it would copy the weights)
        if n.op_type in ("Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or", "Xor",
                         "IsNaN", "IsInf"):
            types.setdefault(n.output[0], onnx.TensorProto.BOOL)
        elif n.op_type == "Cast":
            types.setdefault(n.output[0], next((a.i for a in n.attribute if a.name == "to"), 0))

    shapes = {v.name: onnx_dims(v) for v in [*graph.input, *graph.value_info, *graph.output]}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)

    def leaf(name: str, v: int, leaves: set) -> np.ndarray | None:
        """The term's one varying tensor ``name`` at the integer ``v`` everywhere, of its type and shape (a scalar
        where its shape is unknown; None: not integers)."""
        kind = onnx.helper.tensor_dtype_to_np_dtype(types[name]) if types.get(name) else None
        leaves.add(name)
        if kind is None or np.dtype(kind).kind not in "iub" or len(leaves) > 1:
            return None
        shape = shapes.get(name)
        known = shape is not None and all(shape) and math.prod(shape) <= MAX_LEAF
        return np.full(shape if known else (), v, kind)

    def values(name: str, v: int, seen: dict, leaves: set) -> np.ndarray | None:
        """The term's values where its one varying integer tensor is ``v`` (None: no such term); ``seen`` the
        values of its nodes' outputs, ``leaves`` its varying tensors: inputs, or integers computed from floats (a
        comparison of scores). A layout op's move of a scalar is that scalar; any other move evaluated; a
        ConstantOfShape (zeros of the mask's shape, ``Shape`` computing it before the shapes are fixed) its value."""
        if name in seen:
            return seen[name]
        n = producer.get(name)
        if n is not None and n.op_type == "ConstantOfShape":  # of a shape computed from shapes: its one value
            return numpy_helper.to_array(n.attribute[0].t).reshape(()) if n.attribute else np.float32(0)
        n = n if name in terms else None
        if n is None:
            return numpy_helper.to_array(consts[name], base_dir) if name in consts else leaf(name, v, leaves)
        inner = set(leaves)
        moved = carried(n, consts)
        args = [values(x, v, seen, inner) for x in ([n.input[i] for i in moved] if moved else n.input)]
        if any(a is None for a in args):
            return leaf(name, v, leaves)
        leaves |= inner
        try:
            if not moved:
                out = table_op(n.op_type, next((a.i for a in n.attribute if a.name == "to"), None), args)
            elif n.op_type in LAYOUT_OPS and args[0].ndim == 0:
                out = args[0]
            else:
                feeds = {x: numpy_helper.to_array(consts[x], base_dir) for x in n.input if x in consts}
                feeds.update({n.input[i]: a for i, a in zip(moved, args)})
                out = ReferenceEvaluator(n, opsets={"": opset}).run(None, feeds)[0]
        except Exception:  # noqa: BLE001  (any op this evaluation cannot take: no mask)
            return None
        seen[name] = out
        return out

    readers = Counter(i for n in graph.node for i in n.input)
    # the integer tensor at 0 and 1 (a 0/1 mask); a term looking a table up: at each of its rows
    rows = [math.prod(consts[n.input[0]].dims) for n in graph.node if n.output and n.output[0] in terms and
            looks_up(n, consts)]
    probes = range(min(rows)) if rows and 2 <= min(rows) <= MAX_ROWS else range(2)

    def scores_where(name: str) -> list[onnx.NodeProto]:
        """[the Where(cond, x, c) or Where(cond, c, x) computing ``name``], c a float constant of one value at most
        ``MASK_LOW`` and x computed (GPT-2's causal Where on the scores), read once; else []."""
        n = producer.get(name)
        if n is None or n.op_type != "Where" or readers[name] != 1 or len(n.input) != 3:
            return []
        fixed = [x for x in n.input[1:] if x in consts]
        if len(fixed) != 1 or consts[fixed[0]].data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
                                                                 onnx.TensorProto.FLOAT16):
            return []
        c = numpy_helper.to_array(consts[fixed[0]], base_dir)
        return [n] if c.size == 1 and (c <= MASK_LOW).all() else []

    found = []
    for sm in graph.node:
        if sm.op_type in READERS and sm.input and (kept := scores_where(sm.input[0])):
            found += [*kept, sm]
            continue
        add = producer.get(sm.input[0]) if sm.op_type in READERS and sm.input else None
        if add is None or add.op_type != "Add" or readers[add.output[0]] != 1:
            continue
        for term in add.input:
            seen: dict = {}
            leaves: set = set()
            at = [values(term, v, seen if v == 0 else {}, leaves) for v in probes]
            if term not in terms or any(a is None or np.asarray(a).dtype.kind != "f" for a in at):
                continue
            both = np.concatenate([np.ravel(a) for a in at])
            if both.max() != 0 or not both.min() <= MASK_LOW or ((both != 0) & ~(both <= MASK_LOW)).any():
                continue
            found += [producer[x] for x in seen if np.asarray(seen[x]).dtype.kind == "f"]
            found += [add, sm, *scores_where(next((x for x in add.input if x != term), term))]
            break
    return list({id(n): n for n in found}.values())


def masks_kept_float(header: onnx.ModelProto, src: Path) -> list[str]:
    """The names of ``masked_softmaxes``' nodes for quantize_static's nodes_to_exclude, the model in ``src`` (its
    graph ``header``) rewritten where needed: a name given to each unnamed one, and each float constant they read
    (a Where's 0 and c, HF's 1 and c) their own initializer (quantize_static quantizes a constant that a quantized
    node also reads, for every reader)."""
    from onnx import numpy_helper

    nodes = masked_softmaxes(header, os.fspath(src.parent))
    inits = {t.name: t for t in header.graph.initializer}
    consts = {n.output[0]: n.attribute[0].t for n in header.graph.node if n.op_type == "Constant" and n.attribute
              and n.attribute[0].name == "value"}

    def floats(x: str) -> np.ndarray | None:
        t = inits.get(x) or consts.get(x)
        return numpy_helper.to_array(t, os.fspath(src.parent)) if t is not None and t.data_type in (
            onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16) else None

    return _excluded(header, src, nodes, "masked_softmax", floats)


def l2_kept_float(header: onnx.ModelProto, src: Path) -> tuple[list[str], list[str]]:
    """The names of the nodes of each written-out L2 normalization (``l2_chains``: x / max(||x||, eps), x times the
    Reciprocal of sqrt(sum x^2 + eps), ..., RMSNorm's mean of squares) for quantize_static's nodes_to_exclude, so that it quantizes none of
    their pieces (a Clip's, Mul's or Add's grid would round the norm or the squares) and the importer takes x
    / ||x|| on x's own grid (docs/import.md, "L2 normalization"), and of each L2 norm computed as a value
    (``norm_chains``: ReduceL2, Sqrt of ReduceSum of squares, ...; "The L2 norm as a value"); the model in ``src``
    (its graph ``header``) rewritten where needed: unnamed ones named, and each constant they read their own
    initializer (quantize_static quantizes a constant that a quantized node also reads, for every reader: a Pow's 2
    then reads a dequantized 2). Also each norm value's output, for ``norms_quantized``."""
    from onnx import numpy_helper

    from cvm_onnx.converters.from_onnx.quantized import SUMS, l2_chains, norm_chains

    graph = header.graph
    if not any(n.op_type in SUMS for n in graph.node):
        return [], []
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer
                 if t.data_location != onnx.TensorProto.EXTERNAL}
    constants.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node
                      if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    inferred = onnx.shape_inference.infer_shapes(header)
    shapes = {v.name: onnx_dims(v) for v in [*inferred.graph.value_info, *inferred.graph.input,
                                             *inferred.graph.output]}
    opset = next((o.version for o in header.opset_import if o.domain in ("", "ai.onnx")), 0)
    norms = norm_chains(graph, opset, shapes, constants)
    chains = l2_chains(graph, opset, shapes, constants) + norms
    nodes = list({id(n): n for c in chains for n in c.nodes}.values())
    names = _excluded(header, src, nodes, "l2_normalization", constants.get)
    return names, [c.node.output[0] for c in norms]


#: The readers that take an L2 norm left float (docs/import.md, "The L2 norm as a value"): its QuantizeLinear, or a
#: float function of it and constants (a table over its sum of squares).
NORM_READERS = ("QuantizeLinear", "Clip", "Pow", "Max", "Min", "Add", "Sub", "Mul", "Div")


def norms_quantized(path: Path, norms: list[str], found, activation: int, symmetric: bool) -> int:
    """In the quantized model at ``path`` (its weights external), each L2 norm value output in ``norms`` read by an op
    other than a float function of it and constants (``NORM_READERS``: ConvNeXt V2's GRN takes the norm's mean over
    the channels and divides the norm by it) quantized and dequantized where it is computed, at the grid
    onnxruntime gives an activation of its calibrated range in ``found`` (the calibrator's ``TensorsData``; the
    ``activation`` type, ``symmetric`` or not), so that the importer rounds the norm exactly (docs/import.md, "The L2
    norm as a value") and its readers take it on that grid. Returns how many."""
    from cvm_onnx.converters.from_onnx.quantized.elementwise import FUNCTIONS

    model = onnx.load(path, load_external_data=False)
    graph = model.graph
    constants = {t.name for t in graph.initializer} | {o for n in graph.node if n.op_type == "Constant"
                                                       for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for x in n.input:
            readers.setdefault(x, []).append(n)
    done = 0
    for y in norms:
        if y not in found.data or all((r.op_type in FUNCTIONS or r.op_type in NORM_READERS) and all(
                x == y or x in constants or not x for x in r.input) for r in readers.get(y, [])):
            continue
        lo, hi = (float(f(v)) for f, v in zip((np.min, np.max), found.data[y].range_value))
        k = next(i for i, n in enumerate(graph.node) if y in n.output)
        _on_grid(graph, readers, k, min(lo, 0.0), max(hi, 0.0), activation, symmetric)
        done += 1
    if done:
        onnx.save(model, os.fspath(path))
    return done


def _excluded(header: onnx.ModelProto, src: Path, nodes: list[onnx.NodeProto], prefix: str,
              constant: Callable[[str], np.ndarray | None]) -> list[str]:
    """The names of ``nodes`` (of the graph ``header``, the model in ``src``) for quantize_static's
    nodes_to_exclude, the model rewritten where needed: each unnamed one named ``<prefix>_<k>``, and each input
    whose value ``constant`` gives read from an initializer of its own (quantize_static quantizes a constant that a
    quantized node also reads, for every reader), the original dropped where nothing else reads it (an unread one
    in external data fails quantize_static under onnx 1.23.0: 'External data offset ... must be between')."""
    from onnx import numpy_helper

    if not nodes:
        return []
    graph = header.graph
    taken = {n.name for n in graph.node} | {t.name for t in graph.initializer} | \
        {o for n in graph.node for o in n.output} | {v.name for v in graph.input}
    names = (f"{prefix}_{k}" for k in itertools.count() if f"{prefix}_{k}" not in taken)
    copied = set()
    for n in nodes:
        if not n.name:
            n.name = next(names)
        for i, x in enumerate(n.input):
            if (value := constant(x)) is not None:
                n.input[i] = next(names)
                graph.initializer.append(numpy_helper.from_array(value, n.input[i]))
                copied.add(x)
    kept = {x for n in graph.node for x in n.input} | {v.name for v in [*graph.input, *graph.output]}
    for t in [t for t in graph.initializer if t.name in copied - kept]:  # every reader took a copy
        graph.initializer.remove(t)
    onnx.save(header, os.fspath(src))
    return [n.name for n in nodes]


def _on_grid(graph: onnx.GraphProto, readers: dict[str, list[onnx.NodeProto]], k: int, lo: float, hi: float,
             activation: int, symmetric: bool) -> None:
    """The first output y of node ``k`` quantized and dequantized right after it, at the grid onnxruntime gives an
    activation of range [lo, hi] (the ``activation`` type, ``symmetric`` or not); its ``readers`` and the graph's
    output of it read the dequantized value."""
    from onnx import numpy_helper
    from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType

    y = graph.node[k].output[0]
    qmin, qmax = get_qmin_qmax_for_qType(activation, symmetric=symmetric)
    zero, scale = compute_scale_zp(np.array(lo, np.float32), np.array(hi, np.float32), qmin, qmax, symmetric)
    q, s, z, d = (f"{y}_{part}" for part in ("quantized", "scale", "zero_point", "dequantized"))
    graph.initializer.extend([numpy_helper.from_array(np.asarray(scale, np.float32), s),
                              numpy_helper.from_array(np.asarray(zero), z)])
    for r in readers.get(y, []):
        r.input[:] = [d if x == y else x for x in r.input]
    for v in graph.output:
        if v.name == y:
            v.name = d
    graph.node.insert(k + 1, onnx.helper.make_node("QuantizeLinear", [y, s, z], [q], name=q))
    graph.node.insert(k + 2, onnx.helper.make_node("DequantizeLinear", [q, s, z], [d], name=d))


def float_softmaxes_quantized(path: Path, kept: list[str], activation: int, symmetric: bool) -> int:
    """In the quantized model at ``path`` (its weights external), the output of each Softmax named in ``kept``
    (``masks_kept_float``) that no reader quantizes (read by float ops alone: chython-rxnmap's attention weights
    averaged over the heads) quantized and dequantized where it is computed, at the grid onnxruntime gives a Softmax
    it quantizes (the range [0, 1], the ``activation`` type, ``symmetric`` or not), so that the importer's masked
    Softmax takes it as it takes one a MatMul reads. Returns how many."""
    names = set(kept)
    return _unquantized_on_grid(path, lambda n: (0.0, 1.0) if n.op_type == "Softmax" and n.name in names else None,
                                activation, symmetric)


def l1_norms_quantized(path: Path, activation: int, symmetric: bool) -> int:
    """In the quantized model at ``path`` (its weights external), the output of each LpNormalization p = 1 that no
    reader quantizes (quantize_static quantizes no LpNormalization: skl2onnx's Normalizer L1 as the model's output,
    ``rewrites.normalizers_as_lp_norms``) quantized and dequantized where it is computed, at the grid onnxruntime
    gives the range [-1, 1] its values lie in, so that the importer's integer form has a QuantizeLinear to make
    its integers. An LpNormalization p = 2 is left float: the importer's L2 form reaches a float output on a grid
    finer than [-1, 1]'s (of a quantized x, or of one after the last QuantizeLinear: ``l2norm.TailNormalized``).
    Returns how many."""
    def l1(n: onnx.NodeProto) -> tuple[float, float] | None:
        p = next((a.i for a in n.attribute if a.name == "p"), 2)
        return (-1.0, 1.0) if n.op_type == "LpNormalization" and p == 1 else None

    return _unquantized_on_grid(path, l1, activation, symmetric)


def _unquantized_on_grid(path: Path, picked, activation: int, symmetric: bool) -> int:
    """Each node's first output that no reader quantizes, quantized and dequantized on the grid ``_on_grid`` of the
    range ``picked(node)`` gives (None: not picked). Returns how many."""
    model = onnx.load(path, load_external_data=False)
    graph = model.graph
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for x in n.input:
            readers.setdefault(x, []).append(n)
    done = 0
    for k, node in reversed(list(enumerate(graph.node))):
        ends = picked(node)
        if ends is None or any(r.op_type == "QuantizeLinear" for r in readers.get(node.output[0], [])):
            continue
        _on_grid(graph, readers, k, *ends, activation, symmetric)
        done += 1
    if done:
        onnx.save(model, os.fspath(path))
    return done
