"""onnxruntime's dynamic int8 models (``onnxruntime.quantization.quantize_dynamic``) and weight-only quantized models
(its MatMulNBits quantizer: transformers.js' ``model_q4``) as the float models they stand for.

A dynamic model quantizes each activation at run time (DynamicQuantizeLinear: a scale and zero point from the
tensor's own min and max), a weight-only one leaves them float, so no static CVM form of either exists;
``cvm-onnx quantize`` takes it as the float model whose weights it holds, then calibrates the activations as for any
float model. ``as_float(graph)`` rewrites, in place:

* DynamicQuantizeLinear(x) -> MatMulInteger or ConvInteger (the weight a constant) -> Cast to float -> Mul by
  the product of x's scale and the weight's: MatMul(x, w_f), or Conv(x, w_f) with the ConvInteger's attributes;
* com.microsoft MatMulIntegerToFloat of a DynamicQuantizeLinear's output, and DynamicQuantizeMatMul: MatMul(x, w_f),
  plus Add of the bias where there is one;
* com.microsoft DynamicQuantizeLSTM: LSTM of the same inputs and attributes, W and R dequantized and transposed
  to ONNX's (directions, 4 hidden, inputs) layout;
* DequantizeLinear of a constant integer tensor, directly or through data movement alone (Gather, Transpose,
  Reshape, ...: quantize_dynamic quantizes an embedding so) with one scale and zero point: the movement of the
  dequantized constant;
* com.microsoft MatMulNBits (B's K x N weights packed 2, 4 or 8 bits a value, low bits first, in blocks of
  ``block_size`` along K, a scale and a uint8-packed zero point per block and column, 2^(bits - 1) where absent):
  MatMul(A, w_f), plus Add of the bias, w_f in the scales' type (float16 is widened later, as any float16 model);
  its ``accuracy_level`` (onnxruntime may quantize A to int8 on the fly) is an approximation of this product, not
  part of the model;
* com.microsoft GatherBlockQuantized (a weight-only quantized embedding: int4 or uint4 data, or uint8 packed as
  MatMulNBits' B along the last axis; a scale and zero point per block along ``quantize_axis``): Gather of the
  dequantized table along ``gather_axis``;

each weight w_f = (w - zero point) * scale in float32, as DequantizeLinear computes it. Returned: the
``TensorQuantOverrides`` (quantize_static's extra option) that give each dequantized product weight its own scale,
zero point and type again, per tensor or per channel as it was, so quantize_static writes back the dynamic
model's weight integers exactly (round(w_f / scale) = w - zero point: w_f is within float32's rounding of it).
A dynamic node of another form is refused naming it.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from cvm_onnx.converters.from_onnx.importer import DYNAMIC_OPS
from cvm_onnx.core.errors import UnsupportedError

#: Ops that move values and never compute them: a per-tensor dequantization commutes with them.
MOVES = ("Gather", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Slice", "Expand")
_PRODUCTS = ("MatMulInteger", "ConvInteger")


class _Graph:
    """The graph's constants, producers and readers, and the nodes replaced so far."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        for n in graph.node:
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.attribute) == 1 \
                    and n.attribute[0].name == "value":
                self.consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        self.producer = {o: n for n in graph.node for o in n.output if o}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for n in graph.node:
            for x in n.input:
                self.readers.setdefault(x, []).append(n)
        self.outputs = {o.name for o in graph.output}
        self.names = set(self.consts) | set(self.producer) | {v.name for v in graph.input}
        self.replaced: dict[int, list[onnx.NodeProto]] = {}
        self.floats: dict[tuple[str, ...], str] = {}
        self.overrides: dict[str, list[dict]] = {}
        self.retyped: set[str] = set()  # integer tensors now float (their declared types dropped)
        self.sources: dict[str, tuple[float, int]] = {}  # constants now float: their scale and zero point

    def added(self, base: str, value: np.ndarray) -> str:
        """A new initializer holding ``value``, named afresh from ``base``."""
        name = self.fresh(base)
        self.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        self.consts[name] = value
        return name

    def fresh(self, name: str) -> str:
        k, out = 0, name
        while out in self.names:
            k += 1
            out = f"{name}_{k}"
        self.names.add(out)
        return out

    def only_reader(self, name: str) -> onnx.NodeProto | None:
        rs = self.readers.get(name, [])
        return rs[0] if len(rs) == 1 and name not in self.outputs else None

    def const(self, name: str) -> np.ndarray | None:
        return self.consts.get(name) if name else None

    def weight(self, w: str, scale: str, zero: str, axes: tuple[int, ...], grid: bool = True,
               perm: tuple[int, ...] | None = None) -> str | None:
        """The name of a new float32 initializer (w - zero) * scale, transposed by ``perm`` where given: scale and
        zero one value, or of w's dims at ``axes``; with ``grid`` (one axis) its scale, zero point and type recorded
        in the overrides. None where w, scale or zero is no constant, or their shapes are not of that form."""
        key = (w, scale, zero, str(axes), str(grid), str(perm))
        if key in self.floats:
            return self.floats[key]
        q, s = self.const(w), self.const(scale)
        if q is None or s is None or q.dtype.kind not in "iu" or s.dtype != np.float32 or q.ndim <= max(axes):
            return None
        z = self.const(zero) if zero else np.zeros(s.shape, q.dtype)
        spans = s.size > 1  # else one value for the whole tensor
        if z is None or z.dtype != q.dtype or z.shape != s.shape or \
                (spans and s.shape != tuple(q.shape[a] for a in axes)):
            return None
        shape = [q.shape[a] if spans and a in axes else 1 for a in range(q.ndim)]
        f = (q.astype(np.int32) - z.reshape(shape).astype(np.int32)).astype(np.float32) * s.reshape(shape)
        name = self.added(f"{w.removesuffix('_quantized')}_dequantized", f if perm is None else f.transpose(perm))
        if grid:
            kind = _quant_type(q.dtype)
            if s.size == 1:
                self.overrides[name] = [{"scale": float(s.reshape(())), "zero_point": int(z.reshape(())),
                                         "quant_type": kind}]
            else:
                self.overrides[name] = [{"axis": axes[0], "scale": float(a), "zero_point": int(b),
                                         "quant_type": kind} for a, b in zip(s.ravel(), z.ravel())]
        self.floats[key] = name
        return name


def _quant_type(dtype: np.dtype):
    from onnxruntime.quantization import QuantType

    return QuantType.QInt8 if dtype == np.int8 else QuantType.QUInt8


def _dynamic(g: _Graph, name: str) -> onnx.NodeProto | None:
    n = g.producer.get(name)
    return n if n is not None and n.op_type == "DynamicQuantizeLinear" and n.domain in ("", "ai.onnx") else None


def _product(g: _Graph, n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """MatMulInteger/ConvInteger of a constant weight, cast to float and times the two scales' product, as one
    float MatMul/Conv writing the Mul's output. Its A: a DynamicQuantizeLinear's output (x read instead), or a
    constant integer tensor moved by ``MOVES`` (quantize_dynamic's embedding into a product, its scale and zero
    point ``<name>_scale`` and ``<name>_zero_point``: the moved constant dequantized, ``_float_source``). None where
    it is not of that form."""
    if len(n.input) < 3:
        return None
    cast = g.only_reader(n.output[0])
    if cast is None or cast.op_type != "Cast" or helper.get_attribute_value(cast.attribute[0]) != TensorProto.FLOAT:
        return None
    mul = g.only_reader(cast.output[0])
    if mul is None or mul.op_type != "Mul" or cast.output[0] not in mul.input:
        return None
    scales = g.producer.get(mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0])
    if scales is None or scales.op_type != "Mul":
        return None
    q = _dynamic(g, n.input[0])
    if q is not None:
        if n.input[2] != q.output[2] or q.output[1] not in scales.input:
            return None
        x, sa = q.input[0], q.output[1]
    else:  # a moved constant, its scale named after its zero point
        x, sa = n.input[0], n.input[2].removesuffix("_zero_point") + "_scale"
        if not n.input[2].endswith("_zero_point") or sa not in scales.input or \
                not _float_source(g, x, sa, n.input[2]):
            return None
    ws = scales.input[1] if scales.input[0] == sa else scales.input[0]
    conv = n.op_type == "ConvInteger"
    w = g.weight(n.input[1], ws, n.input[3] if len(n.input) > 3 else "", (0,) if conv else (1,))
    if w is None or (not conv and g.consts[n.input[1]].ndim != 2):
        return None
    g.replaced[id(cast)] = g.replaced[id(mul)] = []
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute} if conv else {}
    return [helper.make_node("Conv" if conv else "MatMul", [x, w], [mul.output[0]], name=n.name or None, **attrs)]


def _with_bias(g: _Graph, n: onnx.NodeProto, x: str, w: str | None, bias: str) -> list[onnx.NodeProto] | None:
    if w is None or g.const(w).ndim != 2:
        return None
    if not bias:
        return [helper.make_node("MatMul", [x, w], [n.output[0]], name=n.name or None)]
    y = g.fresh(f"{n.output[0]}:product")
    return [helper.make_node("MatMul", [x, w], [y], name=n.name or None),
            helper.make_node("Add", [y, bias], [n.output[0]], name=g.fresh(f"{n.name or y}:bias"))]


def _contrib(g: _Graph, n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """com.microsoft MatMulIntegerToFloat (of a DynamicQuantizeLinear's output) and DynamicQuantizeMatMul as
    MatMul (+ Add of the bias); None where they are not of that form."""
    ins = list(n.input) + [""] * 7
    if n.op_type == "DynamicQuantizeMatMul":  # A, B, b_scale, b_zero_point, bias
        return _with_bias(g, n, ins[0], g.weight(ins[1], ins[2], ins[3], (1,)), ins[4])
    q = _dynamic(g, ins[0])  # A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias
    if q is None or ins[2] != q.output[1] or ins[4] != q.output[2]:
        return None
    return _with_bias(g, n, q.input[0], g.weight(ins[1], ins[3], ins[5], (1,)), ins[6])


def _unpacked(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 values packed ``bits`` (2, 4 or 8) a value along the last axis, low bits first, as int32 (the last
    axis 8 / bits times longer)."""
    values = packed[..., None] >> np.arange(0, 8, bits, dtype=np.uint8) & (1 << bits) - 1
    return values.reshape(*packed.shape[:-1], -1).astype(np.int32)


def _blocks(q: np.ndarray, z: np.ndarray, s: np.ndarray, size: int, axis: int) -> np.ndarray:
    """(q - z) * s in the scales' type, z and s given per block of ``size`` values of q along ``axis``."""
    at = np.arange(q.shape[axis]) // size  # each value's block: no array sized by block_size
    return (q - z.take(at, axis)).astype(s.dtype) * s.take(at, axis)


def _ints(n: onnx.NodeProto, defaults: dict[str, int]) -> dict[str, int] | None:
    """``n``'s attributes named in ``defaults`` (the default where absent); None where one is not an INT."""
    given = {a.name: a for a in n.attribute}
    if any(given[k].type != onnx.AttributeProto.INT for k in defaults if k in given):
        return None
    return {k: given[k].i if k in given else v for k, v in defaults.items()}


def _block_size(size: int) -> bool:
    """onnxruntime's rule for both weight-only ops: a power of two, at least 16."""
    return size >= 16 and size & (size - 1) == 0


def _nbits(g: _Graph, n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """com.microsoft MatMulNBits as MatMul(A, w_f) (+ Add of the bias): B (N, blocks, block_size * bits / 8) uint8
    unpacked low bits first, w_f[k, n] = (q - zero point) * scale of k's block in the scales' type, the zero points
    uint8 packed as B (N rows of ceil(blocks * bits / 8) bytes) or 2^(bits - 1) where absent. None where an
    attribute is not onnxruntime's (integers; block_size a power of two, at least 16), B, the scales, zero points or
    bias (N values of the scales' type) are no constants of that form, or g_idx (act-order blocks) or float zero
    points are given."""
    ins = list(n.input) + [""] * 6
    attrs = _ints(n, {"K": 0, "N": 0, "bits": 4, "block_size": 0})
    if attrs is None:
        return None
    k, cols, bits, size = attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]
    q, s, bias = g.const(ins[1]), g.const(ins[2]), g.const(ins[5])
    if bits not in (2, 4, 8) or k < 1 or cols < 1 or not _block_size(size) or ins[4] or q is None or s is None or \
            q.dtype != np.uint8 or s.dtype not in (np.float32, np.float16):
        return None
    blocks = -(-k // size)
    if q.size != cols * blocks * size * bits // 8 or s.size != cols * blocks or \
            ins[5] and (bias is None or bias.shape != (cols,) or bias.dtype != s.dtype):
        return None
    z = np.full((cols, blocks), 1 << bits - 1, np.int32)
    if ins[3]:
        zq = g.const(ins[3])
        if zq is None or zq.dtype != np.uint8 or zq.size != cols * -(-blocks * bits // 8):
            return None
        z = _unpacked(zq.reshape(cols, -1), bits)[:, :blocks]
    w = _blocks(_unpacked(q.reshape(cols, -1), bits)[:, :k], z, s.reshape(cols, blocks), size, 1).T
    return _with_bias(g, n, ins[0], g.added(f"{ins[1]}_dequantized", w), ins[5])


def _gathered(g: _Graph, n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """com.microsoft GatherBlockQuantized as Gather(table, indices, axis=gather_axis) of its dequantized table,
    (q - zero point) * scale of each value's block of ``block_size`` along ``quantize_axis``, in the scales' type:
    q int4 or uint4 data (zero points of its type, 0 where absent), or uint8 packed ``bits`` (2, 4, 8) a value
    along the last axis, low bits first (zero points packed so, 2^(bits - 1) where absent). None where an attribute
    is not onnxruntime's (integers; block_size a power of two, at least 16; axes within the rank; bits 4 for int4 and
    uint4; uint8 gathered along axis 0 and quantized along another), or the data, scales or zero points are no
    constants of that form (float8 and float4 data)."""
    ins = list(n.input) + [""] * 4
    attrs = _ints(n, {"bits": 4, "block_size": 128, "quantize_axis": 1, "gather_axis": 0})
    d, s = g.const(ins[0]), g.const(ins[2])
    if attrs is None or d is None or s is None or s.dtype not in (np.float32, np.float16) or \
            not _block_size(attrs["block_size"]) or d.ndim != s.ndim or not d.ndim or \
            not all(-d.ndim <= attrs[a] < d.ndim for a in ("quantize_axis", "gather_axis")):
        return None
    bits, size, packed = attrs["bits"], attrs["block_size"], d.dtype == np.uint8
    axis, gather = attrs["quantize_axis"] % d.ndim, attrs["gather_axis"] % d.ndim
    if (packed and (bits not in (2, 4, 8) or gather != 0 or axis == gather)) or \
            (not packed and (d.dtype.name not in ("int4", "uint4") or bits != 4)):
        return None
    q = _unpacked(d, bits) if packed else d.astype(np.int32)
    blocks = [-(-m // size) if a == axis else m for a, m in enumerate(q.shape)]
    if list(s.shape) != blocks:
        return None
    z = np.full(s.shape, 1 << bits - 1 if packed else 0, np.int32)
    if ins[3]:
        zq = g.const(ins[3])
        if zq is None or zq.dtype != d.dtype:
            return None
        z = _unpacked(zq, bits)[..., :s.shape[-1]] if packed else zq.astype(np.int32)
        if z.shape != s.shape:
            return None
    name = g.added(f"{ins[0]}_dequantized", _blocks(q, z, s, size, axis))
    return [helper.make_node("Gather", [name, ins[1]], [n.output[0]], name=n.name or None, axis=gather)]


def _lstm(g: _Graph, n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """DynamicQuantizeLSTM as LSTM: W (directions, inputs, 4 hidden) and R dequantized (a scale and zero point per
    direction, or per direction and gate row) and transposed to ONNX's (directions, 4 hidden, inputs); None where
    they are not constants of that form."""
    ins = list(n.input) + [""] * 12
    weights = []
    for w, s, z in ((ins[1], ins[8], ins[9]), (ins[2], ins[10], ins[11])):
        q, sc = g.const(w), g.const(s)
        if q is None or sc is None or q.ndim != 3:
            return None
        weights.append(g.weight(w, s, z, (0, 2) if sc.ndim == 2 else (0,), grid=False, perm=(0, 2, 1)))
    if None in weights:
        return None
    inputs = [ins[0], *weights, *ins[3:8]]
    while inputs and not inputs[-1]:
        inputs.pop()
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
    return [helper.make_node("LSTM", inputs, list(n.output), name=n.name or None, **attrs)]


def _float_source(g: _Graph, x: str, scale: str, zero: str) -> bool:
    """Whether ``x``, a constant integer tensor moved by ``MOVES`` alone, is now float: its constant replaced by
    the dequantized float32 twin (one scale and zero point), where every path from the constant through moves ends
    in a DequantizeLinear of that scale and zero point (then Identity) or in a product's A of that zero point
    (``_product`` reads it as float)."""
    s, z = g.const(scale), g.const(zero) if zero else None
    if s is None or s.size != 1 or (zero and (z is None or z.size != 1)):
        return False
    source = x
    while g.const(source) is None:
        p = g.producer.get(source)
        if p is None or p.op_type not in MOVES or p.domain not in ("", "ai.onnx"):
            return False
        source = p.input[0]
    if source in g.sources:
        return g.sources[source] == (s.item(), 0 if z is None else z.item())
    ends, todo, seen = [], [source], set()
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        if t in g.outputs:
            return False
        for r in g.readers.get(t, []):
            ins = list(r.input) + ["", ""]
            rs, rz = g.const(ins[1]), g.const(ins[2]) if ins[2] else None
            zr = 0 if rz is None or rz.size != 1 else rz.item()
            if r.op_type == "DequantizeLinear" and ins[0] == t:
                if rs is None or rs.size != 1 or rs.item() != s.item() or zr != (0 if z is None else z.item()):
                    return False
                ends.append(r)
            elif r.op_type in _PRODUCTS and ins[0] == t:
                if zr != (0 if z is None else z.item()) or (ins[2] and rz is None):
                    return False
            elif r.op_type in MOVES and r.domain in ("", "ai.onnx") and ins[0] == t:
                todo.extend(o for o in r.output if o)
            else:
                return False
    w = g.weight(source, scale, zero, (0,), grid=False)
    if w is None:
        return False
    g.sources[source] = g.sources[w] = (s.item(), 0 if z is None else z.item())  # its readers now read w
    g.retyped |= seen
    for r in g.readers.get(source, []):
        r.input[list(r.input).index(source)] = w
    for r in ends:
        g.replaced[id(r)] = [helper.make_node("Identity", [r.input[0]], [r.output[0]], name=r.name or None)]
    return True


def _dequantized(g: _Graph, n: onnx.NodeProto) -> list[onnx.NodeProto] | None:
    """A DequantizeLinear of a constant integer tensor (any axis): the constant dequantized; of one moved by
    ``MOVES`` (per tensor): Identity, the constant dequantized (``_float_source``). None where it is neither."""
    ins = list(n.input) + [""] * 2
    if g.const(ins[0]) is not None:
        axis = next((helper.get_attribute_value(a) for a in n.attribute if a.name == "axis"), 1)
        q = g.consts[ins[0]]
        w = g.weight(ins[0], ins[1], ins[2], (axis % q.ndim,), grid=False) if q.ndim else None
        return None if w is None else [helper.make_node("Identity", [w], [n.output[0]], name=n.name or None)]
    return g.replaced.get(id(n)) if _float_source(g, ins[0], ins[1], ins[2]) else None


def as_float(graph: onnx.GraphProto) -> dict[str, list[dict]]:
    """Rewrite the dynamic model's nodes in ``graph`` (its initializers loaded) as the float model's (module
    docstring); returns the TensorQuantOverrides keeping the product weights' grids. Raises ``UnsupportedError``
    naming every dynamic node of another form."""
    if not any((n.domain if n.domain != "ai.onnx" else "", n.op_type) in DYNAMIC_OPS or n.op_type in _PRODUCTS
               for n in graph.node):
        return {}
    g = _Graph(graph)
    for n in graph.node:
        if id(n) in g.replaced:
            continue
        if n.op_type in _PRODUCTS and n.domain in ("", "ai.onnx"):
            new = _product(g, n)
        elif n.domain == "com.microsoft" and n.op_type in ("MatMulIntegerToFloat", "DynamicQuantizeMatMul"):
            new = _contrib(g, n)
        elif n.domain == "com.microsoft" and n.op_type == "DynamicQuantizeLSTM":
            new = _lstm(g, n)
        elif n.domain == "com.microsoft" and n.op_type == "MatMulNBits":
            new = _nbits(g, n)
        elif n.domain == "com.microsoft" and n.op_type == "GatherBlockQuantized":
            new = _gathered(g, n)
        elif n.op_type == "DequantizeLinear" and n.domain in ("", "ai.onnx"):
            new = _dequantized(g, n)
        else:
            continue
        if new is not None:
            g.replaced[id(n)] = new
    nodes = [m for n in graph.node for m in g.replaced.get(id(n), [n])]
    nodes = _live(nodes, {o.name for o in graph.output})
    left = [n for n in nodes if (n.domain if n.domain != "ai.onnx" else "", n.op_type) in DYNAMIC_OPS or
            n.op_type in _PRODUCTS and n.input[0] in g.retyped]
    names = [f"{n.name or n.output[0]} ({n.op_type})" for n in left]
    if names:
        raise UnsupportedError(f"onnxruntime's dynamic or weight-only quantization in a form not rewritten as its "
                               f"float model: {', '.join(names[:8])}{' ...' if len(names) > 8 else ''} (taken: "
                               "DynamicQuantizeLinear into MatMulInteger or ConvInteger of a constant weight, Cast, "
                               "Mul by the scales' product; MatMulIntegerToFloat, DynamicQuantizeMatMul, "
                               "DynamicQuantizeLSTM of constant weights; MatMulNBits of constant packed weights, "
                               "scales and uint8 zero points, without g_idx; GatherBlockQuantized of constant int4, "
                               "uint4 or packed uint8 data)", where=left[0].name or left[0].output[0])
    used = {x for n in nodes for x in n.input}
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in graph.initializer if t.name in used or t.name in {o.name for o in graph.output}]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    inits = {t.name for t in kept}
    retyped = [v for v in graph.value_info if v.name in g.retyped]
    for v in retyped:
        graph.value_info.remove(v)
    stale = [v for v in graph.input if v.name not in used and v.name in g.consts and v.name not in inits]
    for v in stale:
        graph.input.remove(v)
    return {k: v for k, v in g.overrides.items() if k in used}


def _live(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` less those whose outputs nothing reads (the dynamic model's scale products and quantizations)."""
    needed, keep = set(outputs), []
    for n in reversed(nodes):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(x for x in n.input if x)
    return keep[::-1]
