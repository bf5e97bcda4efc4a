"""The CPU serving form's layout and operand passes: where the integer products of a target's serving form run
(``LAYOUTS``) and as which operand types (``OPERANDS``), rewrites of the flat form after ``flat.SERVING``.

* ``rows`` (``channels_last``): the tensors between rows products kept channels-last, residual ends fused, bytes
  between rows;
* ``fused`` (``channels_last``, then ``fused_convolutions``): each rows product and its requantize one kernel
  (custom_ops/conv.h, which picks its ISA at run time: VNNI, AVX2 or plain C, exact on each);
* ``columns`` (``columns_from_rows``): the one-group products as columns;
* operands ``u8s8`` / ``u8s8-rows0`` (``signed_operands``): the MatMulInteger products left as uint8 x int8
  where the target's CPU computes them exactly (every one, or the rows of offset 0; native/cpu.py says why).

A layout "session" leaves the exported rows as they are, for the session to choose (``runtime.sessions``).
"""
from __future__ import annotations

import json
from functools import cache

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from cvm_onnx.core.constants import MARK_IN_RUN
from cvm_onnx.native import CLIP, DOMAIN, ROWS_ATTRS

from .passes import FLAT, ORDERED, Pass


def _bounded_rows(node: onnx.NodeProto) -> bool:
    """Whether an ``im2col_rows`` holds values in [0, 127] (offset 0 without a zero point; with one they reach 255)."""
    return _int_attr(node, "offset", 128) == 0 and _int_attr(node, "zero", -1) < 0


def signed_operands(model: onnx.ModelProto, every: bool) -> onnx.ModelProto:
    """A copy of ``model`` for a target whose operands are uint8 x int8 (native.cpu.products() "u8s8"): the weights
    of every rows product whose uint8 x int8 form is exact there (all where ``every``, native.cpu.unbounded();
    else those of offset 0) become int8 (``w + 128 - 128``, constant-folded by onnxruntime), read with no zero
    point; and where ``every`` the columns too (``signed_columns``). Invariant: the products are the same
    integers."""
    out = signed_columns(model) if every else _copy(model)
    graph = out.graph
    consts = _consts(graph)
    producer = {o: n for n in graph.node for o in n.output}
    nodes = []
    for m in graph.node:
        rows = producer.get(m.input[0]) if m.op_type == "MatMulInteger" and m.domain in ("", "ai.onnx") else None
        if (rows is not None and rows.domain == DOMAIN and rows.op_type == "im2col_rows" and len(m.input) == 4
                and _is_128(consts.get(m.input[3])) and (every or _bounded_rows(rows))):
            wide, narrow = f"{m.input[1]}:int32", f"{m.input[1]}:int8"
            c128 = f"{m.input[1]}:128"
            nodes += [helper.make_node("Constant", [], [c128], value=numpy_helper.from_array(np.int32(128), c128)),
                      helper.make_node("Cast", [m.input[1]], [wide], to=TensorProto.INT32),
                      helper.make_node("Sub", [wide, c128], [narrow + ":wide"]),
                      helper.make_node("Cast", [narrow + ":wide"], [narrow], to=TensorProto.INT8)]
            m.input[1] = narrow
            del m.input[3]
            while m.input and m.input[-1] == "":
                del m.input[-1]
        nodes.append(m)
    del graph.node[:]
    graph.node.extend(nodes)
    return out


def _readers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    """Each tensor's readers, (node, input index), in node order."""
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in graph.node:
        for k, t in enumerate(n.input):
            readers.setdefault(t, []).append((n, k))
    return readers


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _consts(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    consts.update({n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t) for n in graph.node
                   if n.op_type == "Constant" and n.attribute[0].name == "value"})
    return consts


def _is_128(v: np.ndarray | None) -> bool:
    return v is not None and v.dtype == np.uint8 and v.size == 1 and int(v.reshape(-1)[0]) == 128


def signed_columns(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model``: every ``im2col_uint8`` read only as MatMulInteger's right operand with zero point 128
    becomes ``im2col_int8`` read with no zero point. Invariant: the products are the same integers, sum a (x + 128 -
    128) = sum a x, now as uint8 x int8 (for a CPU where ``native.cpu.unbounded()``)."""
    out = _copy(model)
    graph = out.graph
    consts = _consts(graph)
    readers = _readers(graph)
    outputs = {o.name for o in graph.output}
    for n in graph.node:
        if n.domain != DOMAIN or n.op_type != "im2col_uint8" or n.output[0] in outputs:
            continue
        uses = readers.get(n.output[0], [])
        if uses and all(m.op_type == "MatMulInteger" and k == 1 and len(m.input) == 4 and _is_128(consts.get(m.input[3]))
                        for m, k in uses):
            n.op_type = "im2col_int8"
            for m, _ in uses:
                del m.input[3]
    return out


def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """The static shape of every tensor shape inference gives (the cvm.native schemas included)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    out = {t.name: list(t.dims) for t in g.initializer}
    for vi in [*g.input, *g.value_info, *g.output]:
        if vi.type.tensor_type.HasField("shape"):
            out[vi.name] = [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]
    return out


def columns_from_rows(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model``: every rows product, ``im2col_rows`` -> MatMulInteger(rows, B
    (K, OC) uint8, ..., 128) -> ``requantize`` (rows), becomes the columns form of ``nn.conv2d_integer``: ``im2col_uint8``
    (wide with strides 1) read by MatMulInteger(A, columns, 128, 128), A (OC, K) the same uint8 weights in the
    order (c, fh, fw) (a Reshape/Transpose of B, folded by onnxruntime), reshaped to (N, OC, OH, W') for a
    ``requantize`` with the width OW (not one with each channel's own steps or a bias per position, which have no
    width form). Invariant: the same products, sum (w + 128 - 128)(x + 128 - 128) = sum w x
    (x + 128 is in [0, 255] for the rows of offset 0 too), so the same outputs."""
    out = _copy(model)
    graph = out.graph
    try:
        shapes = _shapes(out)
    except onnx.shape_inference.InferenceError:  # a node the kernels will refuse, naming it: no columns
        shapes = {}
    producer = {o: n for n in graph.node for o in n.output}
    readers = _readers(graph)
    replaced: dict[int, list[onnx.NodeProto]] = {}
    for q in graph.node:
        rows_attr = next((list(a.ints) for a in q.attribute if a.name == "rows"), None)
        if any(a.name == "channel_counts" for a in q.attribute) or len(q.input) > 1 and \
                len(shapes.get(q.input[1], [])) == 2:  # each channel's own steps, a bias per position: no width form
            continue
        m = producer.get(q.input[0]) if q.domain == DOMAIN and q.op_type == "requantize" and rows_attr else None
        r = producer.get(m.input[0]) if m is not None and m.op_type == "MatMulInteger" else None
        if r is None or r.domain != DOMAIN or r.op_type != "im2col_rows" or _int_attr(r, "zero", -1) >= 0 or \
                len(readers[m.output[0]]) != 1 or len(m.input) != 4 or -1 in shapes.get(r.input[0], [-1, -1])[1:]:
            continue
        attrs = {a.name: list(a.ints) for a in r.attribute if a.name != "offset"}
        (kh, kw), (n_, c, h, w), oc = attrs["kernel_shape"], shapes[r.input[0]], shapes[m.input[1]][1]
        pads, strides = attrs.get("pads", [0] * 4), attrs.get("strides", [1, 1])
        oh, ow = rows_attr
        wide = strides == [1, 1]
        width = w + pads[1] + pads[3] if wide else ow
        name = q.output[0]
        const = lambda v, t: helper.make_node("Constant", [], [f"{name}:{t}"], value=numpy_helper.from_array(  # noqa: E731
            np.asarray(v, np.uint8 if t == "128" else np.int64), f"{name}:{t}"))
        nodes = [const([kh, kw, c, oc], "kkco"), const([oc, c * kh * kw], "ok"), const(128, "128"),
                 const([n_, oc, oh, width], "nchw"),
                 helper.make_node("Reshape", [m.input[1], f"{name}:kkco"], [f"{name}:w4"]),
                 helper.make_node("Transpose", [f"{name}:w4"], [f"{name}:w4t"], perm=[3, 2, 0, 1]),
                 helper.make_node("Reshape", [f"{name}:w4t", f"{name}:ok"], [f"{name}:a"]),
                 helper.make_node("im2col_uint8", [r.input[0]], [f"{name}:cols"], domain=DOMAIN,
                                  **{k: v for k, v in attrs.items()}, **({"wide": 1} if wide else {})),
                 helper.make_node("MatMulInteger", [f"{name}:a", f"{name}:cols", f"{name}:128", f"{name}:128"],
                                  [f"{name}:products"]),
                 helper.make_node("Reshape", [f"{name}:products", f"{name}:nchw"], [f"{name}:p4"])]
        del q.input[0]
        q.input.insert(0, f"{name}:p4")
        kept = [a for a in q.attribute if a.name != "rows"]
        del q.attribute[:]
        q.attribute.extend(kept + ([helper.make_attribute("width", ow)] if width > ow else []))
        replaced[id(m)] = nodes  # at the product's place: after x and the weights
    for r in graph.node:  # rows shared by several products (merge_repeated_windows) go once none reads them
        if r.op_type == "im2col_rows" and all(id(m) in replaced for m, _ in readers.get(r.output[0], [(None, 0)])):
            replaced[id(r)] = []
    nodes = [n for node in graph.node for n in replaced.get(id(node), [node])]
    del graph.node[:]
    graph.node.extend(nodes)
    return out


def _int_attr(node: onnx.NodeProto, name: str, default: int = 0) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def channels_last(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` for the rows route: the tensors that rows products start are
    kept channels-last (NHWC) instead of being transposed back to NCHW and forth again by the next ``im2col_rows``.
    In node order, a tensor is NHWC when made by a ``requantize`` of rows (it gets ``nhwc``), by a ``requantize``
    without rows or width of an NHWC tensor (``nhwc``: its bias and scales per last axis), or by an Add of two NHWC
    tensors; an ``im2col_rows`` of an NHWC tensor reads it so (``nhwc``); every other reader (and a graph output)
    gets one Transpose back to NCHW. An NHWC ``requantize`` read only by ``im2col_rows`` with a ``zero`` (which take
    values in [0, 255] as themselves), every chain of which ends with a clip within [0, 255], writes uint8 instead
    (``requantize_uint8``; ``bytes_between_rows``), and residual blocks' ends are one ``requantize_add`` each
    (``residual_ends``); a ReduceSum of an NHWC tensor over its positions is one MatMul (``_positions_sum``).
    Invariant: every NHWC tensor holds its NCHW values permuted
    (0, 2, 3, 1), and each op computes the same values per element (the steps and Add are elementwise, their
    channel the last axis; uint8 holds every value in [0, 255] exactly), so every NCHW tensor, the outputs
    included, is unchanged."""
    out = _copy(model)
    graph = out.graph
    nhwc: set[str] = set()
    back: dict[str, str] = {}  # NHWC tensor -> its NCHW Transpose
    nodes: list[onnx.NodeProto] = []

    def nchw(t: str) -> str:
        if t not in back:
            back[t] = f"{t}:nchw"
            nodes.append(helper.make_node("Transpose", [t], [back[t]], perm=[0, 3, 1, 2]))
        return back[t]

    def set_nhwc(node: onnx.NodeProto) -> None:
        node.attribute.extend([helper.make_attribute("nhwc", 1)])

    try:
        shapes = _shapes(model)
    except onnx.shape_inference.InferenceError:  # a node the kernels will refuse, naming it: fuse no Add, no sum
        shapes = {}
    consts = _consts(graph)
    for node in graph.node:
        if (pooled := _positions_sum(node, nhwc, consts, shapes)) is not None:
            nodes += pooled
            continue
        native = node.domain == DOMAIN
        rows = native and node.op_type == "requantize" and any(a.name == "rows" for a in node.attribute)
        steps = native and node.op_type == "requantize" and not rows and not _int_attr(node, "width") and \
            node.input[0] in nhwc
        add = node.op_type == "Add" and node.domain in ("", "ai.onnx") and all(t in nhwc for t in node.input)
        reads = native and node.op_type == "im2col_rows" and node.input[0] in nhwc
        if rows or steps or reads:
            set_nhwc(node)
        if not (steps or add or reads):
            node.input[:] = [nchw(t) if t in nhwc else t for t in node.input]
        if rows or steps or add:
            nhwc.add(node.output[0])
        nodes.append(node)
    outputs = {o.name for o in graph.output}
    for t in sorted(nhwc & outputs):  # a graph output keeps its name and NCHW values
        for n in nodes:
            n.output[:] = [f"{t}:nhwc" if o == t else o for o in n.output]
            n.input[:] = [f"{t}:nhwc" if i == t else i for i in n.input]
        nodes.append(helper.make_node("Transpose", [f"{t}:nhwc"], [t], perm=[0, 3, 1, 2]))
    for vi in graph.value_info:
        if vi.name in nhwc - outputs and vi.type.tensor_type.HasField("shape") and \
                len(vi.type.tensor_type.shape.dim) == 4:
            dims = [onnx.TensorShapeProto.Dimension() for _ in range(4)]
            for k, d in zip((0, 3, 1, 2), vi.type.tensor_type.shape.dim):
                dims[k].CopyFrom(d)
            del vi.type.tensor_type.shape.dim[:]
            vi.type.tensor_type.shape.dim.extend(dims)
    del graph.node[:]
    graph.node.extend(nodes)
    residual_ends(graph, shapes)
    bytes_between_rows(graph)
    return out


def _positions_sum(node: onnx.NodeProto, nhwc: set[str], consts: dict[str, np.ndarray],
                   shapes: dict[str, list[int]]) -> list[onnx.NodeProto] | None:
    """For ``channels_last``: a ReduceSum over axes (2, 3) (its constant input) of an NHWC tensor of a known NCHW
    shape (N, C, H, W) becomes the MatMul of ones (1, H * W) int32 by the tensor reshaped to (N, H * W, C), reshaped
    to the ReduceSum's output (keepdims or not); None for any other node (onnxruntime's int32 ReduceSum over the
    middle axes of NHWC data, where its optimizer moves the Transpose back to NCHW, is the slower). Invariant:
    the same int32 sums: an NHWC tensor is int32 (a ``requantize``'s or an Add's), and to_onnx's ``sum`` gives an
    int32 ReduceSum only where the output's bound excludes overflow, so every partial sum, in any order, is exact."""
    if node.op_type != "ReduceSum" or node.domain not in ("", "ai.onnx") or len(node.input) != 2 or \
            node.input[0] not in nhwc or (axes := consts.get(node.input[1])) is None:
        return None
    shape = shapes.get(node.input[0], [])
    if len(shape) != 4 or min(shape[1:]) < 1 or sorted(int(a) % 4 for a in axes.reshape(-1)) != [2, 3]:
        return None
    y, c, hw = node.output[0], shape[1], shape[2] * shape[3]
    keep = _int_attr(node, "keepdims", 1)

    def const(v: np.ndarray, t: str) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [f"{y}:{t}"], value=numpy_helper.from_array(v, f"{y}:{t}"))

    return [const(np.array([0, hw, c], np.int64), "positions_shape"),
            helper.make_node("Reshape", [node.input[0], f"{y}:positions_shape"], [f"{y}:positions"]),
            const(np.ones((1, hw), np.int32), "ones"),
            helper.make_node("MatMul", [f"{y}:ones", f"{y}:positions"], [f"{y}:sums"], name=node.name),
            const(np.array([0, c, 1, 1][:4 if keep else 2], np.int64), "shape"),
            helper.make_node("Reshape", [f"{y}:sums", f"{y}:shape"], [y])]


def residual_ends(graph: onnx.GraphProto, shapes: dict[str, list[int]]) -> None:
    """In place, after ``channels_last``: each Add of two NHWC ``requantize`` outputs of one known shape (in
    ``shapes``: no broadcasting) that only it reads, whose sum only a run of steps alone (no rows, channel steps,
    scales, width or bias) reads (the block's end), becomes one ``requantize_add`` at the Add's place, writing the
    end's output with ``sum_steps`` the end's: where one operand is such a run (a residual block's shortcut), the
    other ``requantize`` with the shortcut's data as its addend and ``addend_steps`` the shortcut's steps; else (a
    projection shortcut) the first with the second's output as its addend, no ``addend_steps``, the second kept.
    So too where one operand is read by other nodes as well (a pre-activation block's input, which its first
    convolution's run reads too) and made by a channels-last ``requantize[_add]``: the other, only-read one, with
    it as its addend, no ``addend_steps``.
    Invariant: the same int32 values, element for element (its sum wraps as Add's)."""
    consts = _consts(graph)
    producer = {o: n for n in graph.node for o in n.output}
    readers = _readers(graph)
    outputs = {o.name for o in graph.output}

    def channels_last_requantize(n: onnx.NodeProto | None) -> bool:
        return n is not None and n.domain == DOMAIN and n.op_type == "requantize" and _int_attr(n, "nhwc") == 1

    def steps_alone(n: onnx.NodeProto) -> bool:
        names = {a.name for a in n.attribute}
        bias = consts.get(n.input[1])
        return "steps" in names and not names & {"rows", "channel_counts", "scales", "width"} and \
            bias is not None and bias.size == 0

    def channels_last_run(n: onnx.NodeProto | None) -> bool:  # a requantize[_add] writing NHWC int32
        return n is not None and n.domain == DOMAIN and n.op_type in ("requantize", "requantize_add") and \
            _int_attr(n, "nhwc") == 1

    def only_read(t: str) -> onnx.NodeProto | None:  # the requantize making t, read by one node and not an output
        n = producer.get(t)
        return n if channels_last_requantize(n) and len(readers.get(t, [])) == 1 and t not in outputs else None

    fused: dict[int, onnx.NodeProto | None] = {}
    for add in graph.node:
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or add.output[0] in outputs:
            continue
        ins, ends = [only_read(t) for t in add.input], [m for m, _ in readers.get(add.output[0], [])]
        known = [shapes.get(t, [-1]) for t in add.input]
        if ins == [None, None] or len(ends) != 1 or not channels_last_requantize(ends[0]) or \
                not steps_alone(ends[0]) or known[0] != known[1] or -1 in known[0]:
            continue
        if None in ins:  # the other operand read elsewhere too (a block's input): kept, the addend as it is
            other = add.input[ins.index(None)]
            if not channels_last_run(producer.get(other)):
                continue
            short, main, end, addend, steps = None, next(filter(None, ins)), ends[0], other, []
        else:
            short = next((n for n in reversed(ins) if steps_alone(n)), None)
            main, end = ins[1] if short is ins[0] else ins[0], ends[0]
            addend, steps = (short.input[0], _ints_attr(short, "steps")) if short else (add.input[1], [])
        node = helper.make_node("requantize_add", [main.input[0], main.input[1], addend], [end.output[0]],
                                name=main.name, domain=DOMAIN)
        node.attribute.extend([*main.attribute,
                               AttributeProto(name="addend_steps", type=AttributeProto.INTS, ints=steps),
                               helper.make_attribute("sum_steps", _ints_attr(end, "steps"))])
        node.metadata_props.extend(main.metadata_props)  # the run it computes (``routes``)
        fused.update({id(add): node, id(main): None, id(end): None, **({id(short): None} if short else {})})
    nodes = [fused.get(id(n), n) for n in graph.node]
    del graph.node[:]
    graph.node.extend(n for n in nodes if n is not None)


def _ints_attr(node: onnx.NodeProto, name: str) -> list[int]:
    return next(list(a.ints) for a in node.attribute if a.name == name)


def _ends_in_bytes(steps: list[int]) -> bool:
    """Whether flat (kind, a, b) steps end with a clip within [0, 255]."""
    return len(steps) >= 3 and steps[-3] == CLIP and steps[-2] >= 0 and steps[-1] <= 255


def _chains_end_in_bytes(node: onnx.NodeProto) -> bool:
    """Whether every chain of a ``requantize`` (its steps, or each channel's) ends with a clip within [0, 255]."""
    attrs = {a.name: list(a.ints) for a in node.attribute if a.type == onnx.AttributeProto.INTS}
    if "channel_counts" not in attrs:
        return _ends_in_bytes(attrs.get("steps", []))
    ends = np.cumsum(attrs["channel_counts"]) * 3
    return all(_ends_in_bytes(attrs["channel_steps"][end - 3 * count:end])
               for count, end in zip(attrs["channel_counts"], ends))


def bytes_between_rows(graph: onnx.GraphProto) -> None:
    """In place, after ``residual_ends``: each NHWC ``requantize`` whose every chain ends with a clip within [0, 255]
    (a ``requantize_add``: its ``sum_steps``) and whose every reader takes values in [0, 255] as themselves (an NHWC
    ``im2col_rows`` with a ``zero``, or a ``requantize_add`` as its addend; not a graph output) becomes
    ``requantize_uint8`` (``requantize_add_uint8``), its tensor uint8: a quarter of the bytes, and no narrowing by
    the reader. Invariant: the readers take the same values (every value in [0, 255] is its uint8)."""
    readers = _readers(graph)
    outputs = {o.name for o in graph.output}

    def takes_bytes(m: onnx.NodeProto, k: int) -> bool:
        rows = m.op_type == "im2col_rows" and _int_attr(m, "nhwc") == 1 and _int_attr(m, "zero", -1) >= 0
        return m.domain == DOMAIN and (rows or m.op_type == "requantize_add" and k == 2)

    changed = set()
    for n in graph.node:
        add = n.op_type == "requantize_add"
        uses = readers.get(n.output[0], []) if n.domain == DOMAIN and n.op_type == "requantize" or add else []
        ends = _ends_in_bytes(_ints_attr(n, "sum_steps")) if add else uses and _chains_end_in_bytes(n)
        if uses and n.output[0] not in outputs and _int_attr(n, "nhwc") == 1 and ends and all(
                takes_bytes(m, k) for m, k in uses):
            n.op_type += "_uint8"
            changed.add(n.output[0])
    for vi in graph.value_info:
        if vi.name in changed:
            vi.type.tensor_type.elem_type = TensorProto.UINT8


#: The one kernel each requantize after a rows product becomes (``fused_convolutions``).
CONV_OPS = {"requantize": "conv_requantize", "requantize_uint8": "conv_requantize_uint8",
            "requantize_add": "conv_requantize_add", "requantize_add_uint8": "conv_requantize_add_uint8"}


def fused_convolutions(model: onnx.ModelProto, isa: int = 0) -> onnx.ModelProto:
    """A copy of ``model``, after ``channels_last``: every rows product whose three nodes are
    ``im2col_rows`` -> MatMulInteger(rows, weights uint8 (K, OC) from constants alone, z, 128) read only by an NHWC
    ``requantize[_uint8 | _add | _add_uint8]`` of its rows becomes one ``conv_requantize[...]`` (conv.h: the
    windows read in place, multiplied by the weights packed once, requantized from the tile of products), with the
    rows' attributes, ``product_zero`` z and the requantize's attributes (``isa`` > 0: that products kernel, conv.h
    ProductIsa, for benchmarks; 2, AVX2: its bytes kernel, 5, for rows of values in [0, 127]); rows no product
    reads any more go; a standalone run that only such a kernel reads is run by it (``_input_runs``). Invariant:
    the same values, element for element (each kernel's products are the exact sums of MatMulInteger;
    docs/semantics.md)."""
    out = _copy(model)
    graph = out.graph
    consts = _consts(graph)
    producer = {o: n for n in graph.node for o in n.output}
    readers = _readers(graph)
    outputs = {o.name for o in graph.output}
    inputs = {i.name for i in graph.input}

    @cache
    def constant(t: str) -> bool:  # computed from constants alone by standard ops: onnxruntime folds it
        n = producer.get(t)
        return t in consts and t not in inputs or n is not None and n.domain in ("", "ai.onnx") and all(
            map(constant, filter(None, n.input)))

    replaced: dict[int, onnx.NodeProto | None] = {}
    for q in graph.node:
        m = producer.get(q.input[0]) if q.domain == DOMAIN and q.op_type in CONV_OPS else None
        r = producer.get(m.input[0]) if m is not None and m.op_type == "MatMulInteger" else None
        if r is None or r.domain != DOMAIN or r.op_type != "im2col_rows" or len(m.input) != 4 or \
                _int_attr(q, "nhwc") != 1 or not any(a.name == "rows" for a in q.attribute) or \
                len(readers[m.output[0]]) != 1 or \
                m.output[0] in outputs or not _is_128(consts.get(m.input[3])):
            continue
        zero = consts.get(m.input[2]) if m.input[2] else np.uint8(0)
        if not constant(m.input[1]) or zero is None or zero.dtype != np.uint8 or zero.size != 1:
            continue
        node = helper.make_node(CONV_OPS[q.op_type], [r.input[0], m.input[1], *q.input[1:]], list(q.output),
                                name=q.name, domain=DOMAIN, product_zero=int(zero.reshape(-1)[0]),
                                **({"isa": 5 if isa == 2 and _bounded_rows(r) else isa} if isa else {}))
        node.attribute.extend([a for a in r.attribute if a.name in ROWS_ATTRS] +
                              [a for a in q.attribute if a.name not in ("rows", "nhwc")])
        node.metadata_props.extend(q.metadata_props)  # the run it computes (``routes``)
        replaced.update({id(q): node, id(m): None})
    nodes = [n for n in (replaced.get(id(n), n) for n in graph.node) if n is not None]
    used = {t for n in nodes for t in n.input} | outputs
    nodes = _input_runs([n for n in nodes if n.output[0] in used or not (  # rows and constants no node reads any more
        n.domain == DOMAIN and n.op_type == "im2col_rows" or n.op_type == "Constant")], consts, outputs)
    used = {t for n in nodes for t in n.input} | outputs
    folded = {id(n) for n in nodes if n.output[0] not in used and n.op_type == "Cast" and n.input[0] in consts}
    gone = {n.input[0] for n in nodes if id(n) in folded} - inputs - {
        t for n in nodes if id(n) not in folded for t in n.input}
    del graph.node[:]
    graph.node.extend(n for n in nodes if id(n) not in folded)  # the folded runs' biases, and their initializers
    kept = [t for t in graph.initializer if t.name not in gone]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return out


def _int32_constant(t: str, consts: dict[str, np.ndarray], producer: dict[str, onnx.NodeProto]) -> np.ndarray | None:
    """The int32 values of t where it is an int32 constant or a Cast to int32 of an integer one within int32."""
    n = producer.get(t)
    if n is not None and n.op_type == "Cast" and n.domain in ("", "ai.onnx") and \
            _int_attr(n, "to") == TensorProto.INT32 and n.input[0] in consts:
        v = consts[n.input[0]]
        fits = v.dtype.kind in "iu" and (v.size == 0 or -2 ** 31 <= int(v.min()) and int(v.max()) < 2 ** 31)
        return v.astype(np.int32) if fits else None
    v = consts.get(t)
    return v if v is not None and v.dtype == np.int32 else None


def _input_runs(nodes: list[onnx.NodeProto], consts: dict[str, np.ndarray],
                outputs: set[str]) -> list[onnx.NodeProto]:
    """For ``fused_convolutions``: each NHWC ``requantize`` of steps alone (with ``scales`` or not, a constant bias
    (C,) or none) whose output only a ``conv_requantize[...]`` reads as its data, with offset 0, and whose steps end
    with a clip within that convolution's range ([0, 127], with a zero [0, 255]), goes: the convolution takes its
    data with ``in_steps``, ``in_scales`` and ``in_bias`` (cvm_ops.cc InputRun: run as it narrows its padded copy)
    and the run's marks (``MARK_IN_RUN``). Invariant: the padded copy holds the same bytes (the run's values, each
    within the range, are the bytes the narrowing wrote of them)."""
    producer = {o: n for n in nodes for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    gone = set()
    for q in nodes:
        p = producer.get(q.input[0]) if q.domain == DOMAIN and q.op_type in CONV_OPS.values() else None
        if p is None or p.domain != DOMAIN or p.op_type != "requantize" or _int_attr(q, "offset", 128) != 0 or \
                _int_attr(q, "nhwc") != 1 or _int_attr(p, "nhwc") != 1 or p.output[0] in outputs or \
                len(readers.get(p.output[0], [])) != 1 or \
                {a.name for a in p.attribute} - {"steps", "scales", "nhwc"} or len(p.input) != 2:
            continue
        steps = _ints_attr(p, "steps")
        bias = _int32_constant(p.input[1], consts, producer)
        if bias is None or bias.ndim != 1 or not _ends_in_bytes(steps) or \
                steps[-1] > (255 if _int_attr(q, "zero", -1) >= 0 else 127):
            continue
        q.input[0] = p.input[0]
        q.attribute.extend([helper.make_attribute("in_steps", steps),
                            *(AttributeProto(name="in_scales", type=AttributeProto.INTS, ints=a.ints)
                              for a in p.attribute if a.name == "scales"),
                            *([helper.make_attribute("in_bias", bias.tolist())] if bias.size else [])])
        if p.metadata_props:  # the run it computes too (``routes``)
            q.metadata_props.add(key=MARK_IN_RUN, value=json.dumps({m.key: m.value for m in p.metadata_props}))
        gone.add(id(p))
    return [n for n in nodes if id(n) not in gone]



def _pass(fn) -> Pass:
    return Pass(fn.__name__, fn, (FLAT, ORDERED), (FLAT, ORDERED))


def signed_rows0(model: onnx.ModelProto) -> onnx.ModelProto:
    """``signed_operands`` of the rows of offset 0 alone (uint8 x int8 exact on every x86 CPU for them)."""
    return signed_operands(model, every=False)


def signed_every(model: onnx.ModelProto) -> onnx.ModelProto:
    """``signed_operands`` of every product (uint8 x int8 exact for any operands: VNNI or AMX)."""
    return signed_operands(model, every=True)


#: The one-group integer products' layouts a CPU target may fix at export; "session": left to the session.
LAYOUTS = ("session", "rows", "fused", "columns")
#: The MatMulInteger operand types: uint8 x uint8 (exact everywhere), or uint8 x int8 for the rows of offset 0
#: (exact on every x86 CPU), or for every product (exact with VNNI or AMX).
OPERANDS = ("u8u8", "u8s8-rows0", "u8s8")

CHANNELS_LAST = _pass(channels_last)
FUSED_CONVOLUTIONS = _pass(fused_convolutions)
COLUMNS_FROM_ROWS = _pass(columns_from_rows)
SIGNED_ROWS0 = _pass(signed_rows0)
SIGNED_EVERY = _pass(signed_every)


def layout_passes(layout: str, operands: str) -> tuple[Pass, ...]:
    """The passes that give the exported rows ``layout`` (one of ``LAYOUTS``) and ``operands`` (``OPERANDS``)."""
    return {"session": (), "rows": (CHANNELS_LAST,), "fused": (CHANNELS_LAST, FUSED_CONVOLUTIONS),
            "columns": (COLUMNS_FROM_ROWS,)}[layout] + {"u8u8": (), "u8s8-rows0": (SIGNED_ROWS0,),
                                                        "u8s8": (SIGNED_EVERY,)}[operands]
