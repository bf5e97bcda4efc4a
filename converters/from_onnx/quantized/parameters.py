"""One check of every quantization parameter of a quantizing node, before any rule computes on it.

Each quantized tensor of QuantizeLinear, DequantizeLinear and the QOperator ops (QLinearConv, QLinearMatMul, QGemm,
QLinearAdd, ...) comes with a scale and an optional zero point, held to the rules of onnx's and onnxruntime's
schemas: the scale a constant float, non-empty, every value finite and > 0; a scalar (or one value) per tensor, or a
1-D tensor of one value per slice along the axis where the op quantizes per axis (``axis`` in range, the counts
equal, at most MAX_CHANNELS); the zero point a constant of the quantized tensor's integer type, of the scale's
shape; an int32 bias of one value per output channel. Only shapes and dtypes are read before the values (scale
values by numpy, no Fraction), so a huge parameter is refused from its shape.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..context import INT32, INT_RANGES, Tensor, type_name
from .values import MS, QUANTIZED_TYPES, Real

#: Slices a per-axis scale may have (a CVM product over more output channels is out of reach anyway).
MAX_CHANNELS = 1 << 16
PER_TENSOR, AXIS_ATTR = "tensor", "attr"


@dataclass(frozen=True)
class Group:
    """One quantized tensor of a node: the positions of the tensor (None: the node's output), its scale and zero
    point, and the axis its scale may run along (PER_TENSOR: none; AXIS_ATTR: the node's ``axis``, default 1;
    "transB": QGemm's N, axis 0 or 1 by its transB; an int: that axis, negative from the end)."""

    data: int | None
    scale: int
    zero: int
    axis: int | str = PER_TENSOR


def _triple(k: int, axis: int | str = PER_TENSOR) -> Group:
    return Group(k, k + 1, k + 2, axis)


#: The quantized tensors of each quantizing op, by (domain, op); QLinearConcat's inputs are counted at run time.
GROUPS: dict[tuple[str, str], tuple[Group, ...]] = {
    **{(d, "QuantizeLinear"): (Group(0, 1, 2, AXIS_ATTR),) for d in ("", MS)},
    **{(d, "DequantizeLinear"): (Group(0, 1, 2, AXIS_ATTR),) for d in ("", MS)},
    ("", "QLinearConv"): (_triple(0), _triple(3, 0), Group(None, 6, 7)),
    ("", "QLinearMatMul"): (_triple(0), _triple(3, -1), Group(None, 6, 7)),
    (MS, "QGemm"): (_triple(0), _triple(3, "transB"), Group(None, 7, 8)),
    **{(MS, op): (_triple(0), _triple(3), Group(None, 6, 7)) for op in ("QLinearAdd", "QLinearMul")},
    **{(MS, op): (_triple(0), Group(None, 3, 4)) for op in
       ("QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftsign",
        "QLinearSoftmax")},
}
#: The int32 bias of a QOperator product, by (domain, op): its position and the tensor whose output channels it
#: follows (QLinearConv: the weight's first axis; QGemm: B's N).
BIASES = {("", "QLinearConv"): 8, (MS, "QGemm"): 6}


def groups(key: tuple[str, str], n_inputs: int) -> tuple[Group, ...]:
    if key == (MS, "QLinearConcat"):
        return (Group(None, 0, 1),) + tuple(_triple(k) for k in range(2, n_inputs - 2, 3))
    return GROUPS.get(key, ())


def _tensor_name(node, k: int) -> str:
    names = list(node.proto.input)
    return repr(names[k]) if k < len(names) and names[k] else f"input {k}"


def problem(node, ins: list, key: tuple[str, str]) -> str | None:
    """Why the quantization parameters of ``node`` (a ``NodeView``; ``ins`` its inputs as the importer holds them)
    break their op's rules, as one sentence naming the tensor; None where they hold or the op quantizes nothing."""
    gs = groups(key, len(ins))
    if not gs:
        return None
    if key == (MS, "QLinearConcat") and (len(ins) - 2) % 3:
        return (f"QLinearConcat takes Y_scale, Y_zero_point, then (tensor, scale, zero point) per input: "
                f"{len(ins)} inputs are not 2 + 3k")
    if key[1] in ("QuantizeLinear", "DequantizeLinear") and node.attr_int("block_size", 0):
        return "blocked quantization (block_size) has no CVM form: quantize per tensor or per channel"
    for g in gs:
        if (why := _group_problem(node, ins, key, g)) is not None:
            return why
    if key in BIASES:
        return _bias_problem(node, ins, key)
    return None


def _at(ins: list, k: int | None):
    return ins[k] if k is not None and k < len(ins) else None


def _group_problem(node, ins: list, key: tuple[str, str], g: Group) -> str | None:
    op = node.op_type
    x, s, z = _at(ins, g.data), _at(ins, g.scale), _at(ins, g.zero)
    if g.data is not None and op != "QuantizeLinear" and x is not None and \
            (isinstance(x, Real) or x.dtype not in (*QUANTIZED_TYPES, INT32)):
        return (f"the tensor {_tensor_name(node, g.data)} is "
                f"{'a float value' if isinstance(x, Real) else type_name(x.dtype)}: {op} takes quantized integers "
                "(int8, uint8, int16, uint16; int32 for DequantizeLinear)")
    sname, zname = _tensor_name(node, g.scale), _tensor_name(node, g.zero)
    what = f"the scale {sname}"
    if s is None:
        return None if g.data is None and key == (MS, "QGemm") else f"{op} needs a scale (input {g.scale})"
    if isinstance(s, Real) or not s.is_const:
        return (f"{what} is computed at run time (it is not an initializer or Constant): CVM needs the "
                "quantization parameters constant, as onnxruntime.quantization writes them")
    if s.value.dtype.kind != "f":
        return f"{what} is {type_name(s.dtype)}: a scale is a float tensor"
    if s.value.dtype == np.float16 and op in ("QuantizeLinear", "DequantizeLinear"):
        return (f"{what} is float16: {op} then computes in float16, whose roundings CVM's integers do not "
                "reproduce (quantize with float32 scales)")
    shape = tuple(s.value.shape)
    if s.value.size == 0:
        return f"{what} has shape {shape}, no values: a scale needs one value, or one per channel"
    if len(shape) > 1:
        return (f"{what} has shape {shape}: a scale is a scalar (per tensor) or 1-D (per channel); "
                "blocked quantization has no CVM form")
    if g.data is not None and x is not None and s.value.size > 1:
        if (why := _axis_problem(node, x, g, what, s.value.size)) is not None:
            return why
    elif s.value.size > 1:
        return (f"{what} has {s.value.size} values: {op} quantizes {'its output' if g.data is None else 'this input'}"
                " per tensor (one scale and zero point)")
    v = np.asarray(s.value, np.float64)
    bad = v[~(np.isfinite(v) & (v > 0))]
    if bad.size:
        return f"{what} holds {bad.reshape(-1)[0]}: every scale must be finite and > 0"
    if z is None:
        return None
    if isinstance(z, Real) or not z.is_const:
        return f"the zero point {zname} is computed at run time: CVM needs it constant"
    if z.value.dtype.kind not in "iu":
        return f"the zero point {zname} is {type_name(z.dtype)}: a zero point is an 8- or 16-bit integer"
    if z.value.size != s.value.size or z.value.ndim > 1:
        return (f"the zero point {zname} has shape {tuple(z.value.shape)} and the scale {sname} {shape}: "
                "they must have the same shape (one zero point per scale)")
    if op != "QuantizeLinear" and isinstance(x, Tensor) and x.dtype != z.dtype and \
            not (op == "DequantizeLinear" and x.dtype == INT32 and z.dtype == INT32):
        return (f"the zero point {zname} is {type_name(z.dtype)} but the tensor {_tensor_name(node, g.data)} it "
                f"dequantizes is {type_name(x.dtype)}: they must have the same type")
    if z.dtype not in (*QUANTIZED_TYPES, INT32):
        return f"the zero point {zname} is {type_name(z.dtype)}: CVM takes int8, uint8, int16 or uint16"
    if z.dtype == INT32 and np.any(z.value != 0):
        return f"the zero point {zname} of an int32 tensor must be 0"
    lo, hi = INT_RANGES[z.dtype]
    if z.value.min() < lo or z.value.max() > hi:
        return f"the zero point {zname} lies outside {type_name(z.dtype)} [{lo}, {hi}]"
    return None


def _axis_problem(node, x, g: Group, what: str, n: int) -> str | None:
    """Why a scale of ``n`` values does not run along its axis of ``x`` (one value per slice), or None."""
    shape = getattr(x, "shape", None)
    if shape is None:
        return None
    rank = len(shape)
    if g.axis == PER_TENSOR:
        return (f"{what} has {n} values: {node.op_type} quantizes this input per tensor (one scale and zero "
                "point)")
    if g.axis == AXIS_ATTR:
        axis, said = node.attr_int("axis", 1), "axis"
    elif g.axis == "transB":
        axis, said = (0 if node.attr_int("transB", 0) else 1), "the output channels of B"
    else:
        axis, said = g.axis, "the output channels"
    if not -rank <= axis < rank:
        return f"{what} runs along axis {axis}, out of range for the tensor's rank {rank}"
    if n > MAX_CHANNELS:
        return f"{what} has {n} values: at most {MAX_CHANNELS} channels per axis here"
    if shape[axis % rank] != n:
        return (f"{what} has {n} values but the tensor {_tensor_name(node, g.data)} has {shape[axis % rank]} along "
                f"{said} (axis {axis}, shape {tuple(shape)}): per-channel quantization needs one scale per channel")
    return None


def _bias_problem(node, ins: list, key: tuple[str, str]) -> str | None:
    k = BIASES[key]
    b, w = _at(ins, k), _at(ins, 3)
    if b is None or w is None:
        return None
    name = _tensor_name(node, k)
    if isinstance(b, Real) or not b.is_const:
        return f"the bias {name} is computed at run time: CVM needs a constant bias"
    if b.dtype != INT32:
        return f"the bias {name} is {type_name(b.dtype)}: a QOperator bias is int32 at scale x_scale * w_scale"
    if key == ("", "QLinearConv"):
        n = w.shape[0] if w.shape else 0
        if tuple(b.shape) != (n,):
            return (f"the bias {name} has shape {tuple(b.shape)}: QLinearConv's B is 1-D, one value per output "
                    f"channel ({n})")
        return None
    n = w.shape[0 if node.attr_int("transB", 0) else -1] if w.shape else 0
    shape = tuple(b.shape)
    if b.value.size not in (1, n) or any(d != 1 for d in shape[:-1]) or len(shape) > 2:
        return (f"the bias {name} has shape {shape}: QGemm's C is int32 of shape (N,) or (1, N), N = {n} outputs")
    return None
