"""The native custom-op library: its ONNX domain, where the built library is, and the ONNX schemas of its ops.

The library (``libcvm_onnx_ops.so``, built from custom_ops/ at install time) owns the ONNX domain ``cvm.native``,
version 1: the CVM runtime's ``non_max_suppression``, ``get_valid_counts`` and ``cvm_lut`` (FORMAL semantics), and
the serving form's kernels: the window ops (``im2col_int8``, ``im2col_uint8``, ``im2col_rows``), the fused
requantization (``requantize``, ``requantize_uint8``, ``requantize_add[_uint8]``) and the convolution with its
requantization (``conv_requantize[_uint8]``, ``conv_requantize_add[_uint8]``). docs/custom_ops.md states their
semantics. Their interface is stated once, by the schemas here (``_schemas``; ``attributes`` lists each op's
attributes with their types and defaults): the kernels and docs/custom_ops.md's table are checked against it.

Importing this module registers the schemas with onnx (idempotent), so ``onnx.checker`` (full_check) and strict
shape inference check and infer through them. ``chain_path`` asks the library which path a requantize op's chains
take in its CPU kernels. ``python -m cvm_onnx.native`` prints the library's path (for
``SessionOptions.register_custom_ops_library``), or says that it was not built and exits 1. The pure-Python fallback
is in ``cvm_onnx.native.fallback``.
"""
from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import onnx
from onnx import TensorProto, TypeProto
from onnx.defs import OpSchema
from onnx.shape_inference import InferenceError

from cvm_onnx.core.errors import FormatError
from cvm_onnx.core.ops import REGISTRY

DOMAIN = "cvm.native"
#: The native requantize step kinds, each (kind, a, b) triple's first int (custom_ops/requantize.h: kShift, kMul,
#: kAdd, kClip, kMul64, kEven): shift by a bits, multiply by a, add a, clip to [a, b], floor(v a / 2^b) in 64 bits (a
#: product in two parts, docs/import.md; CPU only), shift by a bits rounding half to even (docs/import.md, "Ties"; CPU
#: only).
SHIFT, MULTIPLY, ADD, CLIP, MUL64, EVEN = 0, 1, 2, 3, 4, 5
STEP_KINDS = ("shift", "multiply", "add", "clip", "mul64", "even")
VERSION = 1
LIBRARY = "libcvm_onnx_ops.so"

#: The native ops and their attributes with the defaults (ONNX ints), from the ops' definitions (``native_attrs``).
ATTRS: dict[str, dict[str, int]] = {op.name: {n: int(op.attr(n).default) for n in op.native_attrs}
                                    for op in REGISTRY.values() if op.native_attrs is not None}


def library_path() -> str | None:
    """Path of the built library inside the installed package, or None if the build skipped it."""
    # the package's __path__: an editable install spreads the package over sources and built files
    for root in map(Path, sys.modules[__name__.rpartition(".")[0]].__path__):
        if (root / LIBRARY).is_file():
            return str(root / LIBRARY)
    return None


def ops_used(model: onnx.ModelProto) -> list[str]:
    """The ops of this domain that ``model`` calls, in its graph or its functions."""
    nodes = [*model.graph.node, *(n for f in model.functions for n in f.node)]
    return sorted({n.op_type for n in nodes if n.domain == DOMAIN})


@cache
def cuda_ops(path: str | None) -> tuple[str, ...]:
    """The ops the library at ``path`` registers for CUDAExecutionProvider (it asks the library): none without
    CUDA kernels, and none where there is no library or it does not load (``status`` says which)."""
    try:
        fn = ctypes.CDLL(path).CvmOnnxCudaOps if path is not None else None
    except (OSError, AttributeError):
        fn = None
    if fn is None:
        return ()
    fn.restype = ctypes.c_char_p
    return tuple(op for op in fn().decode().split(",") if op)


#: How a requantize op's chains run in the CPU kernels (custom_ops/chain_path.cc, PathSpeed): some chain in one
#: loop over the values per step (the generic path), some with its kinds dispatched at run time on values in
#: registers, or every chain in one pass compiled for its kinds.
STEP_LOOPS, RUN_TIME_KINDS, COMPILED_KINDS = 0, 1, 2


@dataclass(frozen=True)
class ChainPath:
    """The path of a requantize op's chains in the CPU kernels: ``speed`` (the slowest chain's: STEP_LOOPS,
    RUN_TIME_KINDS or COMPILED_KINDS) and the library's description of it (``text``)."""

    speed: int
    text: str


@cache
def _chain_probe(path: str | None):
    try:
        fn = ctypes.CDLL(path).cvm_onnx_chain_path if path is not None else None
    except (OSError, AttributeError):
        return None
    ints = ctypes.POINTER(ctypes.c_int64)
    fn.argtypes = [ints, ctypes.c_int64] * 5 + [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


def chain_path(attrs: dict[str, list[int]], channels_last: bool, addend: str | None) -> ChainPath | None:
    """The path a requantize op's chains take in the CPU kernels, as the library's kernels choose it (its
    ``cvm_onnx_chain_path``: their own matchers on the chains simplified as they hold them): ``attrs`` the op's
    steps, channel_counts, channel_steps, addend_steps and sum_steps (absent: empty), ``channels_last`` whether it
    runs with the channels innermost (nhwc, rows or a conv_requantize op), ``addend`` its addend's type ("int32",
    "uint8"; None: none). None where the library is not built or does not load; ``FormatError`` for chains the
    kernels refuse."""
    fn = _chain_probe(library_path())
    if fn is None:
        return None
    arrays = [(ctypes.c_int64 * len(v))(*v) for v in (list(attrs.get(a, ())) for a in (
        "steps", "channel_counts", "channel_steps", "addend_steps", "sum_steps"))]
    text = ctypes.create_string_buffer(512)
    speed = fn(*(x for a in arrays for x in (a, len(a))), int(channels_last), {None: 0, "int32": 1, "uint8": 2}[addend],
               text, len(text))
    if speed < 0:
        raise FormatError(f"requantize chains: {text.value.decode()}")
    return ChainPath(speed, text.value.decode())


def status() -> str:
    """One line: where the native library is and which kernels it has, or that it was not built."""
    path = library_path()
    if path is None:
        return (f"native library: not built ({LIBRARY} is missing: the {DOMAIN} ops run through the slow "
                "pure-Python fallback; see docs/custom_ops.md)")
    try:
        ctypes.CDLL(path)
    except OSError as e:
        return f"native library: {path} (does not load: {e})"
    return f"native library: {path} ({'CPU and CUDA kernels' if cuda_ops(path) else 'CPU kernels, no CUDA kernels'})"


# -- schemas ------------------------------------------------------------------------------------------------------
def _dims(t: TypeProto, what: str, rank: int | None = None, bytes_too: bool = False) -> list | None:
    """The dims of an int32 tensor type (or uint8 with ``bytes_too``; None if its rank is unknown); checks the type
    and, if given, the rank."""
    if t is None or not t.HasField("tensor_type"):
        raise InferenceError(f"{what} must be a tensor")
    if t.tensor_type.elem_type not in (TensorProto.UNDEFINED, TensorProto.INT32, *[TensorProto.UINT8] * bytes_too):
        raise InferenceError(f"{what} must be int32{' or uint8' * bytes_too}, got "
                             f"{TensorProto.DataType.Name(t.tensor_type.elem_type)}")
    if not t.tensor_type.HasField("shape"):
        return None
    dims = list(t.tensor_type.shape.dim)
    if rank is not None and len(dims) != rank:
        raise InferenceError(f"{what} must be {rank}-D, got rank {len(dims)}")
    return dims


def _known(dim) -> int | None:
    return dim.dim_value if dim.HasField("dim_value") else None


def _int32(dims: list | tuple | None, elem_type: int = TensorProto.INT32) -> TypeProto:
    """A tensor type (int32 unless ``elem_type``) of the shape ``dims``, each a Dimension, a size or None (unknown);
    no shape for None."""
    t = TypeProto()
    t.tensor_type.elem_type = elem_type
    if dims is not None:
        t.tensor_type.shape.SetInParent()
        for d in dims:
            dim = t.tensor_type.shape.dim.add()
            if isinstance(d, onnx.TensorShapeProto.Dimension):
                dim.CopyFrom(d)
            elif d is not None:
                dim.dim_value = d
    return t


def _infer_nms(ctx) -> None:
    data = _dims(ctx.get_input_type(0), "non_max_suppression data", 3)
    count = _dims(ctx.get_input_type(1), "non_max_suppression valid_count", 1)
    if data is not None:
        if _known(data[2]) not in (None, 6):
            raise InferenceError(f"non_max_suppression data rows must have 6 values, got {_known(data[2])}")
        if count is not None and None not in (_known(data[0]), _known(count[0])) and data[0] != count[0]:
            raise InferenceError(f"non_max_suppression valid_count length {_known(count[0])} must equal the "
                                 f"batch size {_known(data[0])}")
    ctx.set_output_type(0, _int32(data))


def _infer_valid_counts(ctx) -> None:
    data = _dims(ctx.get_input_type(0), "get_valid_counts data", 3)
    if data is not None and _known(data[2]) is not None and _known(data[2]) < 2:
        raise InferenceError(f"get_valid_counts data rows must have >= 2 values, got {_known(data[2])}")
    ctx.set_output_type(0, _int32(None if data is None else data[:1]))
    ctx.set_output_type(1, _int32(data))


def _infer_lut(ctx) -> None:
    indices = _dims(ctx.get_input_type(0), "cvm_lut indices")
    table = _dims(ctx.get_input_type(1), "cvm_lut table")
    if table is not None and 0 in [_known(d) for d in table]:
        raise InferenceError("cvm_lut table must not be empty")
    ctx.set_output_type(0, _int32(indices))


#: The im2col ops: output element type, and the attributes with their defaults (None: required).
IM2COL: dict[str, int] = {"im2col_int8": TensorProto.INT8, "im2col_uint8": TensorProto.UINT8}
#: The serving form's kernels (no Python fallback: a model using them needs the library): the exported ones, and
#: those the CPU layout passes write (``cvm_onnx.serving.cpu_layout``: at export for a target of a fixed layout,
#: else at session creation).
SERVING_KERNELS = (*IM2COL, "im2col_rows", "requantize", "requantize_uint8", "requantize_add", "requantize_add_uint8",
                   "conv_requantize", "conv_requantize_uint8", "conv_requantize_add", "conv_requantize_add_uint8")
#: Attributes that the CUDA kernel of an op refuses when set (non-zero, non-empty): the CPU serving form's
#: channels-last layout (cvm_ops.cc, RequantizeCuda::Compute).
CPU_ONLY_ATTRIBUTES: dict[str, tuple[str, ...]] = {"requantize": ("rows", "nhwc", "channel_counts")}
IM2COL_ATTRS: dict[str, list[int] | int | None] = {"kernel_shape": None, "strides": [1, 1], "dilations": [1, 1],
                                                   "pads": [0, 0, 0, 0], "group": 1, "wide": 0, "batch_inner": 0,
                                                   "offset": 128, "nhwc": 0, "zero": -1}

#: The attributes of the windows an ``im2col_rows`` (group 1, no wide or batch_inner columns) or a
#: ``conv_requantize`` op reads.
ROWS_ATTRS = tuple(a for a in IM2COL_ATTRS if a not in ("group", "wide", "batch_inner"))


def _ints(ctx, name: str, n: int, low: int) -> list[int]:
    attr = ctx.get_attribute(name)
    default = IM2COL_ATTRS[name]
    if attr is None and default is None:
        raise InferenceError(f"im2col: attribute {name} is required")
    values = default if attr is None else list(attr.ints) if n else attr.i
    if n and len(values) != n or any(v < low for v in (values if n else [values])):
        raise InferenceError(f"im2col: {name} must be {n or 1} int(s) >= {low}, got {values}")
    return values


def _windows(ctx, rows: bool) -> tuple[int | None, ...] | None:
    """An im2col op's attributes checked and its output geometry (N, OH, OW, K, positions) (unknown sizes None; OW
    and positions over the padded width with wide), or None where the data's shape is unknown."""
    (kh, kw), (sh, sw), (dh, dw) = (_ints(ctx, a, 2, 1) for a in ("kernel_shape", "strides", "dilations"))
    pt, pl, pb, pr = _ints(ctx, "pads", 4, 0)
    group = _ints(ctx, "group", 0, 1)
    wide = _ints(ctx, "wide", 0, 0)
    batch_inner = _ints(ctx, "batch_inner", 0, 0)
    if wide not in (0, 1) or wide and (sh, sw) != (1, 1):
        raise InferenceError(f"im2col: wide must be 0, or 1 with strides (1, 1); got {wide}, strides {[sh, sw]}")
    if batch_inner not in (0, 1) or batch_inner and wide:
        raise InferenceError(f"im2col: batch_inner must be 0, or 1 without wide; got {batch_inner}")
    nhwc = _ints(ctx, "nhwc", 0, 0) if rows else 0
    offset, zero = (_ints(ctx, "offset", 0, 0), _ints(ctx, "zero", 0, -1)) if rows else (0, -1)
    if rows and (group != 1 or wide or batch_inner or offset not in (0, 128) or nhwc not in (0, 1) or
                 zero != -1 and (offset or not 0 <= zero <= 255)):
        raise InferenceError("im2col_rows: group must be 1, wide and batch_inner 0, offset 0 or 128, nhwc "
                             "0 or 1 and zero -1 or, with offset 0, in [0, 255]")
    data = _dims(ctx.get_input_type(0), "im2col data", 4, bytes_too=rows)
    if rows and data is not None and ctx.get_input_type(0).tensor_type.elem_type == TensorProto.UINT8 and (
            not nhwc or zero < 0):
        raise InferenceError("im2col_rows: uint8 data needs nhwc 1 and a zero")
    if data is None:
        return None
    n, c, h, w = map(_known, [data[0], data[3], data[1], data[2]] if nhwc else data)
    if c is not None and c % group:
        raise InferenceError(f"im2col: {c} input channels do not divide into group {group}")
    oh = None if h is None else (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = None if w is None else (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    if (oh is not None and oh < 1) or (ow is not None and ow < 1):
        raise InferenceError("im2col: the kernel is larger than the padded input")
    if wide and ow is not None:
        ow = w + pl + pr
    k, positions = None if c is None else c // group * kh * kw, None if None in (oh, ow) else oh * ow
    return n, oh, ow, k, positions


def _infer_im2col(elem_type: int, rows: bool = False):
    def infer(ctx) -> None:
        geometry = _windows(ctx, rows)
        if geometry is None:
            return ctx.set_output_type(0, _int32(None, elem_type))
        n, _, _, k, positions = geometry
        group, batch_inner = _ints(ctx, "group", 0, 1), _ints(ctx, "batch_inner", 0, 0)
        ctx.set_output_type(0, _int32((n, positions, k) if rows else
                                      (group, k, None if None in (n, positions) else n * positions) if batch_inner
                                      else (n, group, k, positions), elem_type))

    return infer


def _infer_conv(elem_type: int):
    """conv_requantize[...]'s: y (N, OH, OW, OC), the weights (K, OC) with K = kh * kw * C."""
    def infer(ctx) -> None:
        geometry = _windows(ctx, rows=True)
        weights = _dims(ctx.get_input_type(1), "conv weights", 2, bytes_too=True)
        oc = None if weights is None else _known(weights[1])
        k = None if weights is None else _known(weights[0])
        if geometry is not None and None not in (k, geometry[3]) and k != geometry[3]:
            raise InferenceError(f"conv_requantize: the weights' K {k} is not kh * kw * C = {geometry[3]}")
        counts, product_zero = ctx.get_attribute("channel_counts"), ctx.get_attribute("product_zero")
        if product_zero is not None and not 0 <= product_zero.i <= 255:
            raise InferenceError("conv_requantize: product_zero must be in [0, 255]")
        if counts is not None and oc is not None and len(counts.ints) != oc:
            raise InferenceError(f"conv_requantize: steps for {len(counts.ints)} channels and {oc} output channels")
        ctx.set_output_type(0, _int32(None if geometry is None else (*geometry[:3], oc), elem_type))

    return infer


def _im2col_schema(name: str, elem_type: int) -> OpSchema:
    attr_types = {"group": OpSchema.AttrType.INT, "wide": OpSchema.AttrType.INT, "batch_inner": OpSchema.AttrType.INT}
    rows = name == "im2col_rows"
    doc = ("The windows of a 2-D convolution (group 1) as rows (N, OH * OW, kh * kw * C), each in the order "
           "(fh, fw, c): x + offset, offset in the padding; offset 128 takes data in [-128, 127], 0 data in [0, 127]; "
           "zero in [0, 255] (offset 0): data in [0, 255], zero in the padding; nhwc=1: data (N, H, W, C); uint8 "
           "data (nhwc=1, a zero): every value as itself."
           if rows else
           "The windows of a 2-D convolution as columns (N, G, C/G * kh * kw, OH * OW): x + offset (0 for int8, 128 "
           "for uint8), offset in the padding; data values must lie in [-128, 127]. wide=1 (strides 1): OH * WP "
           "columns, WP the padded width, those past OW in each row to be dropped. batch_inner=1: columns (G, "
           "C/G * kh * kw, N * OH * OW), every sample's columns of a window row side by side.")
    s = OpSchema(
        name, DOMAIN, VERSION, doc,
        inputs=[OpSchema.FormalParameter("data", "T", "(N, C, H, W) int32 (rows: also uint8, nhwc)")],
        outputs=[OpSchema.FormalParameter("rows" if rows else "columns", "U",
                                          "(N, OH * OW, kh * kw * C)" if rows else "(N, G, C/G * kh * kw, OH * OW)")],
        type_constraints=[("T", ["tensor(int32)", *["tensor(uint8)"] * rows], "the data"),
                          ("U", [f"tensor({TensorProto.DataType.Name(elem_type).lower()})"], "the windows")],
        attributes=[OpSchema.Attribute(a, attr_types.get(a, OpSchema.AttrType.INTS), "as ONNX Conv's", required=True)
                    if v is None else OpSchema.Attribute(a, onnx.helper.make_attribute(a, v), f"default {v}")
                    for a, v in IM2COL_ATTRS.items() if rows or a not in ("offset", "nhwc", "zero")],
    )
    s.set_type_and_shape_inference_function(_infer_im2col(elem_type, rows))
    return s


def _infer_requantize(ctx, elem_type: int = TensorProto.INT32) -> None:
    data = _dims(ctx.get_input_type(0), "requantize data")
    rows = ctx.get_attribute("rows")
    bias = _dims(ctx.get_input_type(1), "requantize bias")
    if bias is not None and len(bias) != 1 and not (len(bias) == 2 and rows is not None and len(rows.ints)):
        raise InferenceError(f"requantize bias must be 1-D (2-D (OH * OW, C) with rows), got rank {len(bias)}")
    steps, counts, per = map(ctx.get_attribute, ("steps", "channel_counts", "channel_steps"))
    if counts is None and (steps is None or len(steps.ints) % 3):
        raise InferenceError("requantize: steps must hold (kind, a, b) triples")
    if counts is not None and (steps is not None and len(steps.ints) or per is None or
                               min(counts.ints, default=0) < 0 or 3 * sum(counts.ints) != len(per.ints)):
        raise InferenceError("requantize: channel_counts must count the (kind, a, b) triples of channel_steps, "
                             "without steps")
    width, batch_inner = ((a.i if a is not None else 0) for a in map(ctx.get_attribute, ("width", "batch_inner")))
    if batch_inner not in (0, 1) or batch_inner and (width or data is not None and len(data) < 2):
        raise InferenceError("requantize: batch_inner must be 0, or 1 without a width on data of rank >= 2")
    if batch_inner and data is not None:  # y's shape: data (C, N, ...) gives (N, C, ...)
        data = [data[1], data[0], *data[2:]]
    if width < 0 or width and data is not None and (len(data) < 3 or (_known(data[-1]) or width) < width):
        raise InferenceError(f"requantize: width {width} needs data of rank >= 3 with a last axis at least as long")
    scales = ctx.get_attribute("scales")
    nhwc = ctx.get_attribute("nhwc")
    nhwc = 0 if nhwc is None else nhwc.i
    if nhwc not in (0, 1) or nhwc and (width or batch_inner):
        raise InferenceError("requantize: nhwc must be 0 or 1, and not with a width or batch_inner")
    axis = -1 if nhwc else 1
    if scales is not None and len(scales.ints) and (width or data is not None and (
            len(data) < 2 or (_known(data[axis]) or len(scales.ints)) != len(scales.ints))):
        raise InferenceError("requantize: scales must be one per channel, and without a width")
    if width and data is not None:
        data = [*data[:-1], onnx.TensorShapeProto.Dimension(dim_value=width)]
    if rows is not None and len(rows.ints):
        oh, ow = list(rows.ints) if len(rows.ints) == 2 and min(rows.ints) > 0 else (0, 0)
        if not oh or width or batch_inner or scales is not None and len(scales.ints) or data is not None and (
                len(data) != 3 or (_known(data[1]) or oh * ow) != oh * ow):
            raise InferenceError("requantize: rows (OH, OW) need data (N, OH * OW, C), without width or scales")
        hw = [onnx.TensorShapeProto.Dimension(dim_value=d) for d in (oh, ow)]
        data = None if data is None else [data[0], *hw, data[2]] if nhwc else [data[0], data[2], *hw]
    ctx.set_output_type(0, _int32(data, elem_type))


def _requantize_schema(name: str = "requantize") -> OpSchema:
    """requantize's schema, or requantize_uint8's (the same with nhwc, y uint8: every chain ends with a clip
    within [0, 255]; CPU only), or requantize_add's (the same with nhwc and an addend of y's shape, int32 or uint8;
    CPU only), or requantize_add_uint8's (requantize_add's with y uint8: sum_steps end with a clip within
    [0, 255])."""
    bytes_out, add = name.endswith("_uint8"), name.startswith("requantize_add")
    s = OpSchema(
        name, DOMAIN, VERSION,
        "A requantization run in one pass: y = the steps applied in order to data + bias[c] (c the axis-1 index; "
        "bias empty: none); steps (kind, a, b): 0 shift a (round half up; 0: none, CPU only), 1 multiply by a, 2 "
        "add a, 3 clip to "
        "[a, b], 4 floor(v a / 2^b) in 64 bits (CPU only); int32 arithmetic."
        " width > 0 keeps the first width elements of each last-axis row; scales (one "
        "per axis-1 channel) multiply data before the bias. batch_inner=1: data (C, N, ...) gives y (N, C, ...), "
        "c the channel (data's axis 0). channel_steps and channel_counts instead of steps: channel c's own steps "
        "(not with width, batch_inner or scales; CPU only)." + (
            " requantize_add: with nhwc=1, then y = sum_steps(y + addend_steps(addend)), the addend int32 or uint8."
            * add + " uint8: with nhwc=1, y as uint8; every chain (requantize_add: sum_steps) must end with a clip "
            "within [0, 255]." * bytes_out),
        inputs=[OpSchema.FormalParameter("data", "T", "int32"),
                OpSchema.FormalParameter("bias", "T", "(C,) or (0,); with rows also (OH * OW, C)"),
                *[OpSchema.FormalParameter("addend", "A", "y-shaped")] * add],
        outputs=[OpSchema.FormalParameter("y", "U", "data-shaped")],
        type_constraints=[("T", ["tensor(int32)"], "int32 tensors"),
                          ("U", ["tensor(uint8)" if bytes_out else "tensor(int32)"], "y"),
                          *[("A", ["tensor(int32)", "tensor(uint8)"], "the addend")] * add],
        attributes=[OpSchema.Attribute("steps", OpSchema.AttrType.INTS, "(kind, a, b) triples", required=False),
                    OpSchema.Attribute("channel_steps", OpSchema.AttrType.INTS, "each axis-1 channel's own steps, "
                                       "one list after the other (instead of steps)", required=False),
                    OpSchema.Attribute("channel_counts", OpSchema.AttrType.INTS, "how many steps each channel's list "
                                       "holds", required=False),
                    OpSchema.Attribute("width", onnx.helper.make_attribute("width", 0), "default 0: every element"),
                    OpSchema.Attribute("batch_inner", onnx.helper.make_attribute("batch_inner", 0),
                                       "default 0; 1: data (C, N, ...), y (N, C, ...)"),
                    OpSchema.Attribute("scales", OpSchema.AttrType.INTS, "per axis-1 channel", required=False),
                    OpSchema.Attribute("rows", OpSchema.AttrType.INTS, "(OH, OW): data (N, OH * OW, C) -> "
                                       "(N, C, OH, OW)", required=False),
                    OpSchema.Attribute("nhwc", onnx.helper.make_attribute("nhwc", 0), "1: channels on the last axis "
                                       "(with rows: y (N, OH, OW, C))"),
                    *[OpSchema.Attribute(a, OpSchema.AttrType.INTS, f"(kind, a, b) triples {what}", required=False)
                      for a, what in (("addend_steps", "on the addend"), ("sum_steps", "on the sum")) if add]],
    )
    s.set_type_and_shape_inference_function(
        lambda ctx: _infer_requantize(ctx, TensorProto.UINT8 if bytes_out else TensorProto.INT32))
    return s


def _conv_schema(name: str) -> OpSchema:
    """conv_requantize's schema (y int32), conv_requantize_uint8's (y uint8), conv_requantize_add's and
    conv_requantize_add_uint8's (an addend): CPU only, written by the layout "fused"
    (``cvm_onnx.serving.cpu_layout.fused_convolutions``)."""
    bytes_out, add = name.endswith("_uint8"), "_add" in name
    steps = [("steps", "(kind, a, b) triples"), ("channel_steps", "each output channel's own steps"),
             ("scales", "one int32 per output channel, multiplying the products before the bias"),
             ("channel_counts", "how many steps each channel's list holds"),
             ("in_steps", "(kind, a, b) triples run on the int32 data (nhwc, offset 0) before its narrowing, ending "
                          "with a clip within the rows' range"),
             ("in_scales", "one int32 per input channel, multiplying the data before in_bias and in_steps"),
             ("in_bias", "one int32 per input channel, added to the data before in_steps"),
             *[("addend_steps", "(kind, a, b) triples on the addend"), ("sum_steps", "(kind, a, b) triples on the "
                                                                                     "sum")] * add]
    s = OpSchema(
        name, DOMAIN, VERSION,
        "A convolution of one group and its requantization in one kernel: the windows of data as im2col_rows takes "
        "them (its attributes), the products sum_k (rows[k] - product_zero) * (weights[k] - 128) exact in int32, "
        "then requantize's steps with the bias (none, (OC,) or (OH * OW, OC)) and scales, as requantize with nhwc=1 "
        "and rows (OH, OW) would: y (N, OH, OW, OC)." + (" Then y = sum_steps(y + addend_steps(addend))." * add) +
        (" y as uint8: every chain (with an addend: sum_steps) ends with a clip within [0, 255]." * bytes_out),
        inputs=[OpSchema.FormalParameter("data", "T", "(N, C, H, W) int32, or nhwc (N, H, W, C) int32 or uint8"),
                OpSchema.FormalParameter("weights", "W", "(K, OC) uint8, a constant; K = kh * kw * C"),
                OpSchema.FormalParameter("bias", "B", "int32: (0,), (OC,) or (OH * OW, OC)"),
                *[OpSchema.FormalParameter("addend", "A", "y-shaped")] * add],
        outputs=[OpSchema.FormalParameter("y", "U", "(N, OH, OW, OC)")],
        type_constraints=[("T", ["tensor(int32)", "tensor(uint8)"], "the data"), ("W", ["tensor(uint8)"], "weights"),
                          ("B", ["tensor(int32)"], "the bias"),
                          ("U", ["tensor(uint8)" if bytes_out else "tensor(int32)"], "y"),
                          *[("A", ["tensor(int32)", "tensor(uint8)"], "the addend")] * add],
        attributes=[*(OpSchema.Attribute(a, OpSchema.AttrType.INTS, "as ONNX Conv's", required=True) if v is None
                      else OpSchema.Attribute(a, onnx.helper.make_attribute(a, v), f"default {v}")
                      for a, v in ((a, IM2COL_ATTRS[a]) for a in ROWS_ATTRS)),
                    OpSchema.Attribute("product_zero", onnx.helper.make_attribute("product_zero", 0),
                                       "the rows' zero point in [0, 255]"),
                    OpSchema.Attribute("isa", onnx.helper.make_attribute("isa", 0), "the products' kernel: 0 the "
                                       "fastest here, 1 baseline, 2 AVX2 pairs, 3 AVX-VNNI, 4 AVX-512 VNNI, 5 AVX2 "
                                       "bytes (rows of values in [0, 127])"),
                    *(OpSchema.Attribute(a, OpSchema.AttrType.INTS, what, required=False) for a, what in steps)],
    )
    s.set_type_and_shape_inference_function(_infer_conv(TensorProto.UINT8 if bytes_out else TensorProto.INT32))
    return s


def _schema(name: str, doc: str, inputs: list[tuple[str, str]], outputs: list[tuple[str, str]], infer) -> OpSchema:
    s = OpSchema(
        name, DOMAIN, VERSION, doc,
        inputs=[OpSchema.FormalParameter(n, "T", d) for n, d in inputs],
        outputs=[OpSchema.FormalParameter(n, "T", d) for n, d in outputs],
        type_constraints=[("T", ["tensor(int32)"], "int32 tensors")],
        attributes=[OpSchema.Attribute(a, onnx.helper.make_attribute(a, v), f"int, default {v}")
                    for a, v in ATTRS[name].items()],
    )
    s.set_type_and_shape_inference_function(infer)
    return s


def _schemas() -> list[OpSchema]:
    return [
        _schema("non_max_suppression",
                "Greedy NMS per batch with the CVM runtime's integer IoU percent (FORMAL semantics); rows "
                "[id, score, x1, y1, x2, y2]; kept rows first, the rest -1.",
                [("data", "(B, N, 6) rows"), ("valid_count", "(B,) rows to consider per batch")],
                [("y", "(B, N, 6) kept rows, then -1")], _infer_nms),
        _schema("get_valid_counts",
                "Rows with score (column 1) > score_threshold moved to the top in order, the rest -1, and their "
                "count per batch.",
                [("data", "(B, N, K) rows, K >= 2")],
                [("valid_count", "(B,) number of valid rows"), ("y", "(B, N, K) valid rows, then -1")],
                _infer_valid_counts),
        _schema("cvm_lut", "Table lookup: y = table.flat[clip(indices, 0, table.size - 1)].",
                [("indices", "indices, any shape"), ("table", "the table, any shape, not empty")],
                [("y", "the indices' shape")], _infer_lut),
        *(_im2col_schema(name, t) for name, t in {**IM2COL, "im2col_rows": TensorProto.UINT8}.items()),
        _requantize_schema(),
        _requantize_schema("requantize_uint8"),
        _requantize_schema("requantize_add"),
        _requantize_schema("requantize_add_uint8"),
        *(_conv_schema(name) for name in ("conv_requantize", "conv_requantize_uint8", "conv_requantize_add",
                                          "conv_requantize_add_uint8")),
    ]


#: An attribute the op cannot go without (``attributes``).
REQUIRED = "required"


def attributes() -> dict[str, dict[str, tuple[str, int | list[int] | str | None]]]:
    """The native ops' attributes as their schemas state them, the one statement of the ops' interface (the
    kernels' reads in custom_ops/cvm_ops.cc and docs/custom_ops.md's table are checked against it): op ->
    attribute -> (type "int" or "ints", default: a value, ``REQUIRED``, or None for a list that is empty when
    absent), in the order of the schemas and of the attributes' names."""
    out = {}
    for s in _schemas():
        attrs = {}
        for name, a in sorted(s.attributes.items()):
            kind = "ints" if a.type == OpSchema.AttrType.INTS else "int"
            default = onnx.helper.get_attribute_value(a.default_value) if a.default_value.name else None
            attrs[name] = (kind, REQUIRED if a.required else list(default) if kind == "ints" and default is not None
                           else default)
        out[s.name] = attrs
    return out


def attribute_table() -> list[str]:
    """docs/custom_ops.md's table of the native ops' attributes (``attributes``), as markdown lines."""
    def cell(name: str, kind: str, default) -> str:
        return f"`{name}` ({kind}{'' if default is None else f', {default}'})"

    return ["| op | attributes (type, default; none: an empty list) |", "|---|---|",
            *(f"| `{op}` | {', '.join(cell(n, *v) for n, v in attrs.items()) or 'none'} |"
              for op, attrs in attributes().items())]


def register_schemas() -> None:
    """Register the ONNX schemas (types, attributes, shape inference) of the cvm.native ops; idempotent."""
    for s in _schemas():
        if not onnx.defs.has(s.name, s.since_version, s.domain):
            onnx.defs.register_schema(s)


register_schemas()
