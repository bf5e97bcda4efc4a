"""Float forms written out op by op, fused into the one ONNX op the importer's rules take, before quantize_static:
LayerNormalization (its float biases flattened), Gelu (the Erf and tanh forms), LRN (torch's LocalResponseNorm), and
a BatchNormalization after a ConvTranspose folded into its weights."""
from __future__ import annotations

import math
from collections import Counter
from typing import Iterator, Mapping

import numpy as np
import onnx

from cvm_onnx.core.format.onnx_file import dims as onnx_dims

from .rewrites import _fresh_name, _known_shapes, _taken, shapes_only


#: The opset of ONNX's LayerNormalization: a model holding written-out ones (``layernorms``) is raised to it.
LAYERNORM_OPSET = 17


class _Constants(Mapping):
    """The values of the graph's initializers and Constant nodes (value attribute), by name, each made an array
    when first read (the patterns read a few small ones: the weights are not copied)."""

    def __init__(self, graph: onnx.GraphProto):
        self.protos = {t.name: t for t in graph.initializer}
        for n in graph.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                self.protos[n.output[0]] = n.attribute[0].t
        self._arrays: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        from onnx import numpy_helper

        if name not in self._arrays:
            self._arrays[name] = numpy_helper.to_array(self.protos[name])
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.protos)

    def __len__(self) -> int:
        return len(self.protos)


def _constants(graph: onnx.GraphProto) -> _Constants:
    return _Constants(graph)


def _node_readers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto | None]]:
    """Each tensor's reading nodes in graph order, a graph output read by None."""
    readers: dict[str, list[onnx.NodeProto | None]] = {}
    for n in graph.node:
        for x in n.input:
            readers.setdefault(x, []).append(n)
    for o in graph.output:
        readers.setdefault(o.name, []).append(None)
    return readers


def layernorms(graph: onnx.GraphProto) -> list[tuple[list[onnx.NodeProto], str, int, float, np.ndarray | None,
                                                      np.ndarray | None]]:
    """The LayerNormalizations written out as ops (Paddle's and PyTorch's older exports, a time series' scaler):
    ReduceMean(x) over some axes (an attribute, or a constant input from opset 18), d = x - mean (or two such Subs,
    Keras', one squared and one divided), ReduceMean(Pow(d, 2) or Mul(d, d)) over the same axes, + epsilon, Sqrt,
    d / that (or d * Reciprocal(that)), then, over the last k axes, optionally * gamma and + beta (constants); every
    intermediate read only inside the pattern. Each as (its nodes, x, axis, epsilon, gamma, beta): axis -k where
    the axes are the last k given negative, else the axes as written (a tuple; no gamma, no beta)."""
    consts = _constants(graph)
    readers = _node_readers(graph)

    def only(name: str, op: str) -> onnx.NodeProto | None:
        r = readers.get(name, [])
        return r[0] if len(r) == 1 and r[0] is not None and r[0].op_type == op else None

    def other(n: onnx.NodeProto, name: str) -> np.ndarray | None:
        rest = [x for x in n.input if x != name]
        v = consts.get(rest[0]) if len(rest) == 1 and len(n.input) == 2 else None
        return v if v is not None and v.dtype.kind == "f" else None

    def axes(n: onnx.NodeProto) -> tuple[int, ...] | None:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        given = consts.get(n.input[1]) if len(n.input) == 2 else None
        if attrs.get("keepdims", 1) != 1 or ("axes" in attrs) == (given is not None) or len(n.input) > 2:
            return None
        k = sorted(attrs["axes"] if given is None else given.reshape(-1).tolist())
        return tuple(k) if k and len(set(k)) == len(k) else None

    def squares(n: onnx.NodeProto, d: str) -> bool:  # Pow(d, 2) or Mul(d, d)
        if n.op_type == "Mul":
            return list(n.input) == [d, d]
        two = consts.get(n.input[1]) if n.op_type == "Pow" and list(n.input)[:1] == [d] else None
        return two is not None and two.size == 1 and float(two.reshape(())) == 2.0

    def divides(n: onnx.NodeProto, d: str, sqrt: str) -> bool:  # d / sqrt, or d * Reciprocal(sqrt)
        if n.op_type == "Div":
            return list(n.input) == [d, sqrt]
        if n.op_type != "Mul" or len(n.input) != 2 or d not in n.input or n.input[0] == n.input[1]:
            return False
        r = producer.get(n.input[1] if n.input[0] == d else n.input[0])
        return r is not None and r.op_type == "Reciprocal" and list(r.input) == [sqrt] and \
            only(r.output[0], "Mul") is n

    producer = {o: n for n in graph.node for o in n.output}
    found = []
    for mean in graph.node:
        if mean.op_type != "ReduceMean" or (ax := axes(mean)) is None:
            continue
        x = mean.input[0]
        subs = readers.get(mean.output[0], [])
        if not 1 <= len(subs) <= 2 or \
                any(s is None or s.op_type != "Sub" or list(s.input) != [x, mean.output[0]] for s in subs):
            continue
        users = [list({id(u): u for u in readers.get(s.output[0], [None])}.values()) for s in subs]
        if len(subs) == 1:
            pairs = [(u, subs[0].output[0]) for u in users[0]] if len(users[0]) == 2 else []
        else:  # Keras' x - mean written twice (tf2onnx's DTLN InstantLayerNormalization): one squared, one divided
            pairs = [(u[0], s.output[0]) for u, s in zip(users, subs)] if all(len(u) == 1 for u in users) else []
        if not pairs or any(u is None for u, _ in pairs):
            continue
        pw, d = next(((u, e) for u, e in pairs if squares(u, e)), (None, None))
        div, dd = next(((u, e) for u, e in pairs if u is not pw), (None, None))
        var = only(pw.output[0], "ReduceMean") if pw is not None else None
        add = only(var.output[0], "Add") if var is not None and axes(var) == ax else None
        eps = other(add, var.output[0]) if add is not None else None
        sqrt = only(add.output[0], "Sqrt") if eps is not None and eps.size == 1 else None
        if sqrt is None or div is None or not divides(div, dd, sqrt.output[0]):
            continue
        inside = [producer[r] for r in div.input if div.op_type == "Mul" and r != dd]
        nodes, last, gamma, beta = [mean, *subs, pw, var, add, sqrt, *inside, div], div, None, None
        trailing = list(ax) == list(range(-len(ax), 0))
        if trailing and (mul := only(last.output[0], "Mul")) is not None and \
                (gamma := other(mul, last.output[0])) is not None:
            nodes.append(mul)
            last = mul
            if (plus := only(last.output[0], "Add")) is not None and \
                    (beta := other(plus, last.output[0])) is not None:
                nodes.append(plus)
        found.append((nodes, x, -len(ax) if trailing else ax, float(eps.reshape(())), gamma, beta))
    return found


def means_written_out(model: onnx.ModelProto) -> int:
    """Two float forms of a mean as torch's time series scalers write them ((x - mean) / sqrt(var + eps) over the
    time axis with an observed mask of ones: PatchTST's, PatchTSMixer's), made what ``layernorms`` reads: x * ones
    (a constant of ones that broadcasts nothing onto x) as x, and ReduceSum(y, axes) / n (a constant of the one
    value n, the count of elements summed, that broadcasts nothing onto the sum) as ReduceMean(y, axes) where it
    is a centre (read by y - it) or a variance (read only by + a constant, read only by a Sqrt). Both need the
    dims known (onnx's shape inference); nothing changes in a graph with subgraphs (their reads are not followed).
    Returns how many nodes it rewrote."""
    from onnx import helper

    graph = model.graph
    consts = _constants(graph)
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node
           for a in n.attribute) or not any(n.op_type == "Sqrt" for n in graph.node) or \
            not any(n.op_type in ("Mul", "Div") and any(x in consts for x in n.input) for n in graph.node):
        return 0
    shapes = _known_shapes(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    outputs = {o.name for o in graph.output}

    def known(name: str) -> list[int] | None:
        dims = shapes.get(name)
        return dims if dims is not None and all(d is not None for d in dims) else None

    def one_value(name: str) -> float | None:
        v = consts.get(name)
        return float(v.reshape(-1)[0]) if v is not None and v.dtype.kind == "f" and v.size and \
            (v == v.reshape(-1)[0]).all() else None

    def unbroadcast(name: str, dims: list[int] | None) -> bool:  # the constant leaves dims as they are
        return dims is not None and list(np.broadcast_shapes(tuple(dims), consts[name].shape)) == dims

    done = 0
    for n in list(graph.node):  # x * ones -> x
        c = next((x for x in n.input if x in consts), None) if n.op_type == "Mul" and len(n.input) == 2 else None
        x = next((i for i in n.input if i != c), None)
        if c is None or x is None or one_value(c) != 1.0 or n.output[0] in outputs or not unbroadcast(c, known(x)):
            continue
        for r in graph.node:
            r.input[:] = [x if i == n.output[0] else i for i in r.input]
        graph.node.remove(n)
        done += 1
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for x in n.input:
            readers.setdefault(x, []).append(n)
    producer = {o: n for n in graph.node for o in n.output}
    for div in list(graph.node):  # ReduceSum(y, axes) / n -> ReduceMean(y, axes)
        total = producer.get(div.input[0]) if div.op_type == "Div" and len(div.input) == 2 else None
        if total is None or total.op_type != "ReduceSum" or len(readers.get(total.output[0], [])) != 1 or \
                total.output[0] in outputs or div.input[1] not in consts:
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in total.attribute}
        given = consts.get(total.input[1]) if len(total.input) > 1 and total.input[1] else None
        ax = attrs.get("axes") if given is None else given.reshape(-1).tolist()
        dims = known(total.input[0])
        if not ax or dims is None or attrs.get("keepdims", 1) != 1 or \
                one_value(div.input[1]) != float(np.prod([dims[a] for a in ax])) or \
                not unbroadcast(div.input[1], [1 if i in {a % len(dims) for a in ax} else d
                                               for i, d in enumerate(dims)]):
            continue
        rs = readers.get(div.output[0], [])
        centre = any(r.op_type == "Sub" and list(r.input) == [total.input[0], div.output[0]] for r in rs)
        plus = rs[0] if len(rs) == 1 and rs[0].op_type == "Add" and \
            any(i in consts for i in rs[0].input if i != div.output[0]) else None
        variance = plus is not None and [r.op_type for r in readers.get(plus.output[0], [])] == ["Sqrt"]
        if not (centre or variance):
            continue
        mean = helper.make_node("ReduceMean", [total.input[0], *([total.input[1]] if opset >= 18 else [])],
                                [div.output[0]], name=f"{div.output[0]}:ReduceMean", keepdims=1,
                                **({} if opset >= 18 else {"axes": ax}))
        graph.node.insert(list(graph.node).index(div), mean)
        graph.node.remove(div)
        graph.node.remove(total)
        done += 1
    return done


def fuse_layernorm(model: onnx.ModelProto) -> None:
    """Each written-out LayerNormalization (``layernorms``, after ``means_written_out``) as one LayerNormalization
    node (opset 17), which quantize_static quantizes as one op and the importer holds in integers (docs/import.md);
    gamma and beta broadcast to the normalized shape; axes that are not the last moved last by a Transpose and back
    by another. Nothing changes below opset 17 or where the normalized shape is unknown."""
    from onnx import numpy_helper, shape_inference

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    if opset >= LAYERNORM_OPSET:
        means_written_out(model)
    found = layernorms(model.graph) if opset >= LAYERNORM_OPSET else []
    if not found:
        return
    known = [*shape_inference.infer_shapes(shapes_only(model)).graph.value_info, *model.graph.input]
    shapes = {v.name: [d or 0 for d in onnx_dims(v) or ()] for v in known}
    taken = _taken(model.graph)
    for nodes, x, axis, eps, gamma, beta in found:
        shape = shapes.get(x)
        axes = [axis] if isinstance(axis, int) else list(axis)
        if not shape or not all(-len(shape) <= a < len(shape) for a in axes) or \
                (isinstance(axis, int) and not all(shape[axis:])):
            continue
        rank, last = len(shape), nodes[-1].output[0]
        moved = sorted(a % rank for a in axes) if isinstance(axis, tuple) else list(range(rank + axis, rank))
        perm = [i for i in range(rank) if i not in moved] + moved
        if not all(shape[i] for i in moved):
            continue
        norm = tuple(shape[i] for i in moved)
        names = [_fresh_name(taken, f"{last}:ln_scale"), _fresh_name(taken, f"{last}:ln_bias")]
        g = np.broadcast_to(np.ones(1, np.float32) if gamma is None else gamma.astype(np.float32), norm)
        b = np.broadcast_to(np.zeros(1, np.float32) if beta is None else beta.astype(np.float32), norm)
        model.graph.initializer.extend([numpy_helper.from_array(np.ascontiguousarray(g), names[0]),
                                        numpy_helper.from_array(np.ascontiguousarray(b), names[1])])
        at = list(model.graph.node).index(nodes[-1])
        new = [onnx.helper.make_node("LayerNormalization", [x, *names], [last], name=f"{last}:LayerNormalization",
                                     axis=-len(moved), epsilon=eps)]
        if perm != list(range(rank)):  # the axes moved last and back (a normalization over time: (batch, time, c))
            inner, out = _fresh_name(taken, f"{last}:moved"), _fresh_name(taken, f"{last}:normalized")
            new = [onnx.helper.make_node("Transpose", [x], [inner], name=inner, perm=perm),
                   onnx.helper.make_node("LayerNormalization", [inner, *names], [out], name=out,
                                         axis=-len(moved), epsilon=eps),
                   onnx.helper.make_node("Transpose", [out], [last], name=f"{last}:back",
                                         perm=[int(i) for i in np.argsort(perm)])]
        for k, node in enumerate(new):
            model.graph.node.insert(at + k, node)
        for n in nodes:
            model.graph.node.remove(n)


def lrns(graph: onnx.GraphProto, shapes: Mapping[str, list[int | None]]) -> list[tuple[list[onnx.NodeProto], str,
                                                                                         int, float, float, float]]:
    """The LRNs written out as torch's local_response_norm exports them: Mul(x, x) (or Pow(x, 2)), a Reshape to
    (N, 1, C, ...) (or Unsqueeze at axis 1), a constant Pad of zeros along C alone, b before and size - 1 - b after,
    an AveragePool of kernel (size, 1, ...) at stride 1 (the Pad's widths its own pads instead, with
    count_include_pad, where onnxruntime's optimizer fused them), Squeeze of axis 1 (then a Reshape to
    x's shape where the view merged axes), * alpha, + k, Pow beta (scalar constants), x / that; every intermediate
    read only inside the pattern, ``shapes`` (inferred, None unknown) proving the views keep N, C and the order. That is
    ONNX's LRN(size, alpha, beta, bias = k) where its window is the Pad's: b = floor((size - 1) / 2), an odd size
    (torch pads size // 2 first: an even size's window is not LRN's, and is left), of a 4-D x (onnxruntime's LRN
    takes no other rank, and quantize runs it). Each as (its nodes, x, size, alpha, beta, k)."""
    consts = _constants(graph)
    readers = _node_readers(graph)

    def only(name: str, *ops: str) -> onnx.NodeProto | None:
        r = readers.get(name, [])
        return r[0] if len(r) == 1 and r[0] is not None and r[0].op_type in ops else None

    def scalar(n: onnx.NodeProto, name: str) -> float | None:
        rest = [x for x in n.input if x != name]
        v = consts.get(rest[0]) if len(rest) == 1 and len(n.input) == 2 else None
        return float(v.reshape(())) if v is not None and v.size == 1 and v.dtype.kind == "f" else None

    def attrs(n: onnx.NodeProto) -> dict:
        return {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}

    def ints(n: onnx.NodeProto, key: str, at: int) -> list[int] | None:
        given = consts.get(n.input[at]) if len(n.input) > at and n.input[at] else None
        return given.reshape(-1).tolist() if given is not None else attrs(n).get(key)

    found = []
    for sq in graph.node:
        x = sq.input[0] if sq.input else ""
        two = consts.get(sq.input[1]) if sq.op_type == "Pow" and len(sq.input) == 2 else None
        if not (sq.op_type == "Mul" and list(sq.input) == [x, x] or two is not None and two.size == 1 and
                float(two.reshape(())) == 2.0):
            continue
        shape = shapes.get(x)
        view = only(sq.output[0], "Reshape", "Unsqueeze")
        pad = only(view.output[0], "Pad") if view is not None else None
        pool = only((pad or view).output[0], "AveragePool") if view is not None else None
        squeeze = only(pool.output[0], "Squeeze") if pool is not None else None
        if squeeze is None or not shape or len(shape) != 4 or not all(shape) or \
                (view.op_type == "Unsqueeze" and ints(view, "axes", 1) != [1]):
            continue
        viewed = shapes.get(view.output[0])
        if not viewed or not all(viewed) or viewed[:3] != [shape[0], 1, shape[1]] or \
                math.prod(viewed[3:]) != math.prod(shape[2:]):
            continue
        last = only(squeeze.output[0], "Reshape") or squeeze
        if shapes.get(last.output[0]) != shape:
            continue
        mul = only(last.output[0], "Mul")
        add = only(mul.output[0], "Add") if mul is not None else None
        pw = only(add.output[0], "Pow") if add is not None and list(add.input).count(mul.output[0]) == 1 else None
        div = only(pw.output[0], "Div") if pw is not None and pw.input[0] == add.output[0] else None
        if div is None or list(div.input) != [x, pw.output[0]] or ints(squeeze, "axes", 1) != [1]:
            continue
        alpha, k, beta = scalar(mul, last.output[0]), scalar(add, mul.output[0]), scalar(pw, add.output[0])
        rank, p = len(viewed), attrs(pool)
        size = (p.get("kernel_shape") or [0])[0]
        own = p.get("pads", [0] * (2 * rank - 4))  # the pool's: zeros counted only with count_include_pad
        widths = [0, 0, *own[:rank - 2], 0, 0, *own[rank - 2:]] if len(own) == 2 * rank - 4 else None
        if pad is not None and widths is not None:
            pads, a = ints(pad, "pads", 1), attrs(pad)
            value = consts.get(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else np.zeros(1)
            if pads is None or len(pads) != 2 * rank or len(pad.input) > 3 or a.get("value", 0.0) or \
                    a.get("mode", b"constant") not in (b"constant", "constant") or value is None or \
                    value.size != 1 or float(value.reshape(())) != 0.0:
                continue
            widths = [w + v for w, v in zip(widths, pads)]
        if None in (alpha, k, beta) or widths is None or (any(own) and not p.get("count_include_pad", 0)) or \
                p.get("kernel_shape") != [size] + [1] * (rank - 3) or any(v != 1 for v in p.get("strides", [1])) or \
                any(d != 1 for d in p.get("dilations", [1])) or p.get("ceil_mode", 0) or \
                p.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or \
                any(v for i, v in enumerate(widths) if i % rank != 2) or \
                (widths[2], widths[rank + 2]) != ((size - 1) // 2, size // 2):
            continue
        nodes = [sq, view, *([pad] if pad is not None else []), pool, squeeze,
                 *([last] if last is not squeeze else []), mul, add, pw, div]
        found.append((nodes, x, size, alpha, beta, k))
    return found


def fuse_lrn(model: onnx.ModelProto) -> None:
    """Each written-out LRN (``lrns``) as one LRN node, which the importer holds in integers (docs/import.md)."""
    views = {o for n in model.graph.node if n.op_type in ("Pad", "Reshape", "Unsqueeze") for o in n.output}
    if not any(n.op_type == "AveragePool" and n.input[0] in views for n in model.graph.node):
        return
    for nodes, x, size, alpha, beta, k in lrns(model.graph, _known_shapes(model)):
        out = nodes[-1].output[0]
        at = list(model.graph.node).index(nodes[-1])
        model.graph.node.insert(at, onnx.helper.make_node("LRN", [x], [out], name=f"{out}:LRN", size=size,
                                                          alpha=alpha, beta=beta, bias=k))
        for n in nodes:
            model.graph.node.remove(n)


def flatten_biases(graph: onnx.GraphProto) -> None:
    """Each Gemm's bias C that is a constant of shape (1, ..., 1, N) (onnxruntime's fusion of MatMul + Add writes
    the Add's (1, N)) as the (N,) it broadcasts as: quantize_static's per-channel adjustment of weight scales for
    int32 biases indexes the bias by channel and fails on any other shape ('The truth value of an array ... is
    ambiguous')."""
    from onnx import numpy_helper

    inits = {t.name: t for t in graph.initializer}
    for n in graph.node:
        if n.op_type != "Gemm" or len(n.input) < 3 or n.input[2] not in inits:
            continue
        c = numpy_helper.to_array(inits[n.input[2]])
        if c.ndim < 2 or any(d != 1 for d in c.shape[:-1]):
            continue
        name = f"{n.input[2]}:flat"
        if name not in inits:
            inits[name] = numpy_helper.from_array(c.reshape(-1), name)
            graph.initializer.append(inits[name])
        old, n.input[2] = n.input[2], name
        if all(old not in m.input for m in graph.node) and old not in {o.name for o in graph.output}:
            graph.initializer.remove(inits.pop(old))


#: The elementwise ops a written-out GELU is made of.
GELU_OPS = {"Div": np.divide, "Mul": np.multiply, "Add": np.add, "Sub": np.subtract, "Pow": np.power,
            "Tanh": np.tanh, "Erf": np.vectorize(math.erf, otypes=[np.float64])}


GELU_GRID = np.linspace(-10, 10, 2001)


#: GELU's two forms, by the op that replaces each (com.microsoft Gelu: erf; FastGelu: tanh).
GELU_FORMS = {"Gelu": lambda v: 0.5 * v * (1 + GELU_OPS["Erf"](v / math.sqrt(2))),
              "FastGelu": lambda v: 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))}


def gelus(graph: onnx.GraphProto) -> list[tuple[list[onnx.NodeProto], str, str, str]]:
    """The GELUs written out as elementwise ops (x / sqrt 2, Erf, + 1, * x, * 0.5; or the tanh form with Pow 3 or
    x * x * x), in any order and association: for each Erf or Tanh, a tensor x up to 6 such ops before it, the
    ops that compute from x alone (and scalar float constants), and among their outputs one that equals a GELU form
    of x within 1e-5 on [-10, 10] (evaluated in float64) and whose intermediates nothing else reads; and whose
    output only ops that quantize_static quantizes by default read (a QuantizeLinear then follows the fused node, as
    one followed the written-out GELU's last Mul; GlobalMaxPool or a graph output would read an unquantized table).
    Each as (its nodes in graph order, x, the output, the form's op)."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    quantized = QDQRegistry.keys() | QLinearOpsRegistry.keys()
    every = _constants(graph)
    consts = {k: every[k] for k, t in every.protos.items() if math.prod(t.dims) == 1 and every[k].dtype.kind == "f"}
    producer = {o: n for n in graph.node for o in n.output}
    readers = _node_readers(graph)
    order = {id(n): i for i, n in enumerate(graph.node)}
    found, taken = [], set()

    def region(x: str) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
        """The ops computing from x alone, with their values on the grid."""
        values, nodes, grown = {x: GELU_GRID}, [], True
        while grown:
            grown = False
            for n in {id(r): r for t in list(values) for r in readers.get(t, []) if r is not None}.values():
                if n.op_type not in GELU_OPS or n.output[0] in values or len(n.output) != 1 or \
                        not all(i in values or i in consts for i in n.input) or id(n) in taken:
                    continue
                args = [values[i] if i in values else consts[i].astype(np.float64).reshape(()) for i in n.input]
                with np.errstate(all="ignore"):
                    values[n.output[0]] = GELU_OPS[n.op_type](*args)
                nodes.append(n)
                grown = True
        return nodes, values

    def gelu_of(nodes: list[onnx.NodeProto], values: dict[str, np.ndarray]):
        """(the ops computing a GELU of x, its output's node first; the form), if one output among ``nodes`` is
        a GELU whose intermediates are read by those ops alone."""
        made = {n.output[0]: n for n in nodes}
        for t in made:
            form = next((k for k, f in GELU_FORMS.items()
                         if np.allclose(values[t], f(GELU_GRID), rtol=0, atol=1e-5)), None)
            if form is None:
                continue
            sub, todo = {}, [t]
            while todo:
                n = made.get(todo.pop())
                if n is not None and id(n) not in sub:
                    sub[id(n)] = n
                    todo.extend(n.input)
            inner = [n.output[0] for n in sub.values() if n.output[0] != t]
            if all(r is not None and id(r) in sub for o in inner for r in readers[o]):
                return [made[t], *(n for n in sub.values() if n is not made[t])], form
        return None

    for e in graph.node:
        if e.op_type not in ("Erf", "Tanh") or id(e) in taken:
            continue
        x, hops = e.input[0], 0
        while x is not None and hops < 6:
            nodes, values = region(x)
            if (hit := gelu_of(nodes, values)) is not None:
                sub, form = hit
                if not all(r is not None and r.op_type in quantized for r in readers[sub[0].output[0]]):
                    break
                found.append((sorted(sub, key=lambda n: order[id(n)]), x, sub[0].output[0], form))
                taken.update(id(n) for n in sub)
                break
            up = producer.get(x)
            x = next((i for i in up.input if i not in consts), None) if up is not None and \
                up.op_type in GELU_OPS else None
            hops += 1
    return found


def fuse_gelu(model: onnx.ModelProto) -> None:
    """Each written-out GELU (``gelus``) as one com.microsoft Gelu or FastGelu node, which the importer makes one
    table over its input's integers (docs/import.md), in place of the several requantizations of its ops."""
    found = gelus(model.graph)
    for nodes, x, out, form in found:
        at = list(model.graph.node).index(nodes[-1])
        model.graph.node.insert(at, onnx.helper.make_node(form, [x], [out], name=f"{out}:{form}",
                                                          domain="com.microsoft"))
        for n in nodes:
            model.graph.node.remove(n)
    if found and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))


def fold_batchnorm(graph: onnx.GraphProto) -> None:
    """Fold each BatchNormalization (inference form, constant parameters) that follows a ConvTranspose with
    constant weights, directly or through an Add of a per-channel constant (its bias, as Paddle writes it), and
    is the only reader of its input: onnxruntime's optimizer folds it into a Conv only. With a = scale /
    sqrt(var + epsilon) per output channel (in float32, as onnxruntime's Conv fusion computes it), the weights
    become W * a along the output channels and the bias (bias - mean) * a + B. A parameter no longer read goes,
    with its graph input where the model lists its initializers as inputs too."""
    from onnx import numpy_helper

    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    readers = Counter(x for n in graph.node for x in n.input)
    readers.update(o.name for o in graph.output)

    def value(name: str) -> np.ndarray | None:
        return numpy_helper.to_array(inits[name]).astype(np.float32) if name in inits else None

    for bn in [n for n in graph.node if n.op_type == "BatchNormalization" and len(n.output) == 1]:
        params = [value(x) for x in bn.input[1:5]]
        up, add, bias = producer.get(bn.input[0]), None, np.zeros(1, np.float32)
        if up is not None and up.op_type == "Add" and readers[up.output[0]] == 1:
            k = next((k for k in (0, 1) if value(up.input[k]) is not None), None)
            add, bias = up, value(up.input[k]).reshape(-1) if k is not None else None
            up = producer.get(up.input[1 - k]) if k is not None else None
        if up is None or up.op_type != "ConvTranspose" or readers[up.output[0]] != 1 or \
                any(p is None for p in params) or value(up.input[1]) is None or \
                (len(up.input) > 2 and up.input[2] and value(up.input[2]) is None):
            continue
        w = value(up.input[1])
        group = next((a.i for a in up.attribute if a.name == "group"), 1)
        c = w.shape[1] * group
        if bias.size not in (1, c) or any(p.size != c for p in params):
            continue
        if len(up.input) > 2 and up.input[2]:
            bias = bias + value(up.input[2]).reshape(c)
        scale, beta, mean, var = (p.reshape(c) for p in params)
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        a = (scale / np.sqrt(var + np.float32(eps))).astype(np.float32)
        w2 = w.reshape((group, -1, w.shape[1]) + w.shape[2:]) * a.reshape(group, 1, -1, *[1] * (w.ndim - 2))
        b2 = (np.broadcast_to(bias, (c,)) - mean) * a + beta
        names = (f"{up.output[0]}:folded_w", f"{up.output[0]}:folded_b")
        graph.initializer.extend([numpy_helper.from_array(w2.reshape(w.shape).astype(np.float32), names[0]),
                                  numpy_helper.from_array(b2.astype(np.float32), names[1])])
        old = [*up.input[1:], *bn.input[1:], *(add.input if add is not None else [])]
        del up.input[1:]
        up.input.extend(names)
        up.output[0] = bn.output[0]
        graph.node.remove(bn)
        if add is not None:
            graph.node.remove(add)
        readers.subtract(old)
        for name in old:
            if name in inits and readers[name] <= 0:
                graph.initializer.remove(inits.pop(name))
                listed = [v for v in graph.input if v.name == name]  # an initializer also a graph input (IR < 4)
                for v in listed:
                    graph.input.remove(v)
