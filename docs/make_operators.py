"""Write docs/operators.md: every CVM op and the ONNX form the exporter actually emits for it.

Each op is exported in a few small graphs chosen to reach each of its forms (e.g. conv2d with one float32 chunk,
several chunks, a bias too wide to join the Conv, a kernel too large for float32); the table lists the distinct
primitive ONNX ops of the emitted bodies per case, read from the exported model. Every case is also checked
exact on onnxruntime (``verify``) before it is written down. Run from the repository root:

    python docs/make_operators.py
"""
from __future__ import annotations

import inspect
import sys
from pathlib import Path

import numpy as np

from cvm_onnx import to_onnx, verify
from cvm_onnx.app.report import op_forms
from cvm_onnx.converters.to_onnx import LOWERINGS, OPSET
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.ops import REGISTRY

OUT = Path(__file__).with_name("operators.md")
rng = np.random.default_rng(0)


def ints(shape, p: int) -> np.ndarray:
    bound = (1 << (p - 1)) - 1
    return rng.integers(-bound, bound, size=shape, endpoint=True).astype(np.int32)


def case(op: str, shapes, precisions=None, params=(), **attrs):
    """A graph applying ``op`` once: input k has shape ``shapes[k]`` and precision ``precisions[k]`` (default 8);
    ``params`` maps an input index to a param value (that input is a param, as weights are in CVM models)."""
    params = dict(params)
    precisions = precisions or [8] * len(shapes)
    b = GraphBuilder()
    ins = [b.param(f"p{k}", params[k], p) if k in params else b.input("data" if k == 0 else f"in{k}", s, p)
           for k, (s, p) in enumerate(zip(shapes, precisions))]
    out = b.op(op, *ins, name=op, **attrs)
    return b.build(*(out if isinstance(out, tuple) else (out,)))


def full(shape, value) -> np.ndarray:
    return np.full(shape, value, np.int32)


X = (2, 3)
IMG = (1, 2, 5, 5)
CASES = {
    "abs": [("", case("abs", [X]))],
    "negative": [("", case("negative", [X]))],
    "relu": [("", case("relu", [X]))],
    "cvm_precision": [("", case("cvm_precision", [X]))],
    "clip": [("", case("clip", [X], a_min=-5, a_max=9))],
    "cvm_clip": [("", case("cvm_clip", [X], [16], precision=4))],
    "cvm_left_shift": [("", case("cvm_left_shift", [X], precision=12, shift_bit=3))],
    "cvm_right_shift": [
        ("15-bit input, shift 8: within 8 bits, no clip", case("cvm_right_shift", [X], [15], precision=8,
                                                                shift_bit=8)),
        ("16-bit input, shift 2, precision 8: clipped", case("cvm_right_shift", [X], [16], precision=8, shift_bit=2)),
        ("32-bit input, shift 24", case("cvm_right_shift", [X], [32], precision=8, shift_bit=24)),
    ],
    "elemwise_add": [("", case("elemwise_add", [X, X]))],
    "elemwise_sub": [("", case("elemwise_sub", [X, X]))],
    **{op: [("", case(op, [X, (1, 3)]))] for op in
       ["broadcast_add", "broadcast_sub", "broadcast_mul", "broadcast_max", "broadcast_greater", "broadcast_div"]},
    "sum": [("axis (1,)", case("sum", [X], axis=(1,))), ("all axes", case("sum", [X]))],
    "max": [("axis (1,)", case("max", [X], axis=(1,))), ("all axes, keepdims", case("max", [X], keepdims=True))],
    "flatten": [("", case("flatten", [(1, 2, 3)]))],
    "reshape": [("", case("reshape", [X], shape=(3, 2)))],
    "expand_dims": [("", case("expand_dims", [X], axis=1))],
    "squeeze": [("", case("squeeze", [(1, 3)], axis=(0,)))],
    "transpose": [("", case("transpose", [X], axes=(1, 0)))],
    "strided_slice": [("stride 1", case("strided_slice", [X], begin=(0, 1), end=(2, 3))),
                      ("negative stride", case("strided_slice", [X], begin=(1,), end=(-3,), stride=(-1,)))],
    "repeat": [("", case("repeat", [X], repeats=2, axis=1))],
    "tile": [("", case("tile", [X], reps=(2, 1)))],
    "concatenate": [("", case("concatenate", [X, (2, 2)], axis=1))],
    "take": [("axis 0", case("take", [(4, 3), (2,)], params={1: np.array([3, -1])}, axis=0)),
             ("flat (axis None)", case("take", [(4, 3), (2,)], params={1: np.array([11, 0])}))],
    "cvm_lut": [("", case("cvm_lut", [(2, 3), (8,)], params={1: ints((8,), 8)}, in_dim=8))],
    "slice_like": [("", case("slice_like", [(3, 4), (2, 2)]))],
    "where": [("", case("where", [X, X, X]))],
    "conv2d": [
        ("one float32 chunk, bias inside the Conv",
         case("conv2d", [IMG, (3, 2, 3, 3), (3,)], [8, 8, 8], {1: ints((3, 2, 3, 3), 8), 2: ints((3,), 8)},
              channels=3, kernel_size=(3, 3), padding=(1, 1))),
        ("bias too wide for float32: added in int32",
         case("conv2d", [IMG, (3, 2, 3, 3), (3,)], [8, 8, 31], {1: ints((3, 2, 3, 3), 8), 2: full((3,), 1 << 29)},
              channels=3, kernel_size=(3, 3), padding=(1, 1))),
        ("128 input channels at +-127: two float32 chunks",
         case("conv2d", [(1, 128, 3, 3), (1, 128, 3, 3)], [8, 8], {1: full((1, 128, 3, 3), 127)},
              channels=1, kernel_size=(3, 3), use_bias=False)),
        ("33x33 kernel at +-127: one channel exceeds 2^24, int32 MatMul",
         case("conv2d", [(1, 1, 33, 33), (1, 1, 33, 33)], [8, 8], {1: full((1, 1, 33, 33), 127)},
              channels=1, kernel_size=(33, 33), use_bias=False)),
    ],
    "dense": [
        ("one float32 chunk, bias inside the Gemm",
         case("dense", [(2, 16), (4, 16), (4,)], [8, 8, 8], {1: ints((4, 16), 8), 2: ints((4,), 8)}, units=4)),
        ("K = 2048 at +-127: two float32 chunks",
         case("dense", [(1, 2048), (2, 2048)], [8, 8], {1: full((2, 2048), 127)}, units=2, use_bias=False)),
    ],
    "max_pool2d": [("8-bit input: float32", case("max_pool2d", [IMG], pool_size=(2, 2), strides=(2, 2))),
                   ("32-bit input, padding: int32 windows",
                    case("max_pool2d", [IMG], [32], pool_size=(3, 3), padding=(1, 1)))],
    "upsampling": [("", case("upsampling", [IMG], scale=2))],
    "get_valid_counts": [("", case("get_valid_counts", [(1, 4, 6)], score_threshold=0))],
    "non_max_suppression": [("", case("non_max_suppression", [(1, 4, 6), (1,)], [8, 8], {1: np.array([4])}))],
}


def summary(op: str) -> str:
    doc = inspect.cleandoc(LOWERINGS[op].fn.__doc__ or "")
    return doc.split("\n\n")[0].replace("\n", " ").replace("|", "\\|")


def render() -> str:
    """The text of operators.md; ``ValueError`` when an op has no case or a case is not exact."""
    missing = sorted(set(REGISTRY) - set(CASES))
    if missing:
        raise ValueError(f"no case for {', '.join(missing)}")
    rows = []
    for op in sorted(CASES):
        for k, (label, graph) in enumerate(CASES[op]):
            verdict = verify(graph, seeds=2)
            if not verdict.exact:
                raise ValueError(f"{op} ({label}) is not exact:\n{verdict}")
            [form] = [f for f in op_forms(graph, to_onnx(graph)) if f.op == op]
            how = "native custom op" if form.form.startswith("native") else "function"
            ops = ", ".join(form.primitives) or f"`{form.form.split()[-1]}`"
            rows.append(f"| {op if k == 0 else ''} | {summary(op) if k == 0 else ''} | {label or '-'} | {how} | "
                        f"{ops} | {form.onnx_nodes} |")
    return f"""# Operators: each CVM op and its ONNX form

Generated by `python docs/make_operators.py` from the exporter itself; do not edit by hand.

Every CVM op becomes one node of domain `cvm` calling a model-local ONNX function (opset {OPSET}) specialised to
the node's attributes, shapes and value bounds, so one op may have several bodies: each row below is one small
model exported and checked exact on onnxruntime (0, +-(2^(p-1)-1) and random inputs), with the distinct
primitive op types of its body (Constant left out) and its node count. `get_valid_counts`,
`non_max_suppression` and `cvm_lut` run as native onnxruntime custom ops of domain `cvm.native` (see
[custom_ops.md](custom_ops.md)). `--inline` writes the same primitive nodes into the main graph instead of
functions. The reasons each form is exact are in the lowerings' docstrings (shown by Netron as the function's
description) and in [semantics.md](semantics.md).

| CVM op | rule | case | converted as | primitive ONNX ops | nodes |
|---|---|---|---|---|---:|
""" + "\n".join(rows) + "\n"


def main() -> int:
    try:
        OUT.write_text(render())
    except ValueError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"wrote docs/{OUT.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
