"""Build a tiny detection-style CVM model with seeded random int8 weights, ending in get_valid_counts -> NMS.

    python models/detection/make.py [OUT_DIR]        (default: this script's directory)

data (1, 3, 8, 8) -> conv 3x3 8ch -> requant -> relu -> max_pool 2x2: a 4x4 grid of 16 anchors, each cell 16
units wide. Heads (1x1 convs, each requantized as MRT does: broadcast_mul by an int scale, cvm_right_shift):

* class: 2 logits per anchor; id = broadcast_greater(logit 1, logit 0), score = max over the two;
* box: 4 values (dx, dy, w, h) at precision 6; centre = anchor centre + (dx, dy), half size = |(w, h)| + 4,
  corners x1 y1 = centre - half, x2 y2 = centre + half.

The rows [id, score, x1, y1, x2, y2] are concatenated on the channel axis, reshaped to (1, 6, 16) and transposed
to (1, 16, 6); get_valid_counts (score > 16) then non_max_suppression (IoU >= 30%, at most 8 boxes) with the
inputs MRT wires: get_valid_counts output 1, then output 0. Requantization scales are calibrated on the sample
input (its largest accumulator maps to the largest int value). Writes symbol, params, input.npy, expected.npy.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format import write_model
from cvm_onnx.core.ops.registry import bits

SEED = 1
SHAPE = (1, 3, 8, 8)
MAX_SHIFT = 23


def requant_scale(ratio: float, p_acc: int) -> tuple[int, int]:
    """(M, k) with M / 2^k ~ ratio: the largest shift k <= 23 with p_acc + precision(M) <= 32."""
    for k in range(MAX_SHIFT, 0, -1):
        m = round(ratio * 2**k)
        if m >= 1 and p_acc + bits(m) + 1 <= 32:
            return m, k
    raise ValueError(f"no requantization scale for ratio {ratio} at precision {p_acc}")


def build(x: np.ndarray, rng: np.random.Generator):
    b = GraphBuilder()

    def weights(name, shape):
        return b.param(name, rng.integers(-127, 128, shape).astype(np.int8), 8)

    def requant(name, acc, precision=8):
        """acc * M >> k to ``precision`` bits; the sample's largest |acc| maps to the largest value."""
        g = b.build(acc)
        peak = int(np.abs(execute(g, x)[0]).max())
        m, k = requant_scale(((1 << (precision - 1)) - 1) / max(peak, 1), g.type_of(acc).precision)
        scaled = b.op("broadcast_mul", acc, b.param(f"{name}_requant_scale", np.array([m], np.int32)),
                      name=f"{name}_requant")
        return b.op("cvm_right_shift", scaled, name=f"{name}_shift", precision=precision, shift_bit=k)

    def channels(name, h, lo, hi):
        return b.op("strided_slice", h, name=name, begin=(0, lo), end=(1, hi))

    data = b.input("data", SHAPE, 8)
    bias = b.param("backbone_bias", rng.integers(-2000, 2001, 8).astype(np.int32))
    h = b.op("conv2d", data, weights("backbone_weight", (8, 3, 3, 3)), bias, name="backbone",
             channels=8, kernel_size=(3, 3), padding=(1, 1))
    h = b.op("relu", requant("backbone", h), name="backbone_relu")
    h = b.op("max_pool2d", h, name="pool", pool_size=(2, 2), strides=(2, 2))  # (1, 8, 4, 4)

    cls = b.op("conv2d", h, weights("cls_weight", (2, 8, 1, 1)), name="cls", channels=2, kernel_size=(1, 1),
               use_bias=False)
    cls = requant("cls", cls)
    ids = b.op("broadcast_greater", channels("cls_1", cls, 1, 2), channels("cls_0", cls, 0, 1), name="ids")
    score = b.op("max", cls, name="score", axis=(1,), keepdims=True)

    box = b.op("conv2d", h, weights("box_weight", (4, 8, 1, 1)), name="box", channels=4, kernel_size=(1, 1),
               use_bias=False)
    box = requant("box", box, precision=6)
    grid = np.stack(np.meshgrid(np.arange(4), np.arange(4), indexing="xy")) * 16 + 8  # (2: x y, 4, 4)
    centre = b.op("broadcast_add", channels("box_offset", box, 0, 2),
                  b.param("anchors", grid[None].astype(np.int32)), name="centre")
    half = b.op("broadcast_add", b.op("abs", channels("box_size", box, 2, 4), name="box_abs"),
                b.param("min_half_size", np.array([4], np.int32)), name="half")
    corners = b.op("concatenate", b.op("elemwise_sub", centre, half, name="top_left"),
                   b.op("elemwise_add", centre, half, name="bottom_right"), name="corners", axis=1)

    rows = b.op("concatenate", ids, score, corners, name="rows", axis=1)  # (1, 6, 4, 4)
    rows = b.op("reshape", rows, name="rows_flat", shape=(1, 6, 16))
    rows = b.op("transpose", rows, name="rows_t", axes=(0, 2, 1))  # (1, 16, 6)
    count, valid = b.op("get_valid_counts", rows, name="valid", score_threshold=16)
    out = b.op("non_max_suppression", valid, count, name="nms", iou_threshold=30, max_output_size=8,
               force_suppress=False, top_k=-1)
    return b.build(out)


def main(out: Path) -> None:
    rng = np.random.default_rng(SEED)
    x = rng.integers(-127, 128, SHAPE).astype(np.int8)
    graph = build(x, rng)
    [y] = execute(graph, x)
    out.mkdir(parents=True, exist_ok=True)
    write_model(graph, out)
    np.save(out / "input.npy", x)
    np.save(out / "expected.npy", y)
    print(y[0])


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
