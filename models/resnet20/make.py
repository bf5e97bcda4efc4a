"""Build a CIFAR ResNet-20-shaped CVM model with seeded random int8 weights, the stand-in for the on-chain one.

    python models/resnet20/make.py [OUT_DIR]        (default: out/resnet20 under the current directory)

Tests and benchmarks/bench.py take the on-chain model where it is (``resnet20``), else this one.

The layers and shapes of ../shared/models/resnet20-cifar (the deployed model, which a clone of the project does
not have; it has one more 3x3 stem conv, for its first shortcut): data (1, 3, 32, 32) int8; a per-channel 1x1
input scaling (conv2d, groups 3); a 3x3 stem of 16 channels; three stages of three pre-activation blocks (a
per-channel scale as a 1x1 conv of one channel a group, relu, 3x3 conv, relu, 3x3 conv, the shortcut added,
relu) of 16, 32 and 64 channels, the first block of stages 2 and 3 at stride 2 with a 1x1 projection shortcut
from the block's scaled input; a global sum over 8x8, dense 64 -> 10. Every conv2d and dense takes a bias; each result is requantized to 8 bits as MRT does
(cvm_right_shift to 16 bits where it is wider, broadcast_mul by an int scale, cvm_right_shift), the scale
calibrated on the sample input (its largest value maps to 127). Writes symbol, params, input.npy and expected.npy
(the reference executor's output, int32). About 400 KB: generated, not shipped.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format import write_model
from cvm_onnx.core.graph import Entry, Graph, TensorType
from cvm_onnx.core.ops import REGISTRY, type_node
from cvm_onnx.core.ops.registry import bits

#: The on-chain ResNet-20: the directory CVM_RESNET20 names, else ../shared/models/resnet20-cifar beside the
#: checkout.
ONCHAIN = Path(os.environ.get("CVM_RESNET20") or
               Path(__file__).resolve().parents[3] / "shared" / "models" / "resnet20-cifar")
SEED = 20
SHAPE = (1, 3, 32, 32)
MAX_SHIFT = 23


class Builder(GraphBuilder):
    """A GraphBuilder that also types every entry and computes its value on the sample input (the scales'
    calibration)."""

    def __init__(self, x: np.ndarray):
        super().__init__()
        self.values: dict[Entry, np.ndarray] = {}
        self.types: dict[Entry, TensorType] = {}
        e = self.input("data", x.shape, 8)
        self.values[e], self.types[e] = x.astype(np.int32), self.nodes[0].outputs[0]

    def param(self, name, value, precision=None):
        e = super().param(name, value, precision)
        self.values[e], self.types[e] = self.params[name].astype(np.int32), self.nodes[e.node].outputs[0]
        return e

    def op(self, op, *inputs, name=None, **attrs):
        e = super().op(op, *inputs, name=name, **attrs)
        typed = type_node(op, attrs, [self.types[i] for i in inputs])
        [self.types[e]] = typed.outputs
        [self.values[e]] = REGISTRY[op].run(typed.attrs, [self.values[i] for i in inputs])
        return e


def build(x: np.ndarray, rng: np.random.Generator) -> Graph:
    b = Builder(x)

    def weights(shape: tuple[int, ...]) -> np.ndarray:
        """int8 weights as a quantizer leaves them: normal, the largest of each layer 127."""
        w = rng.normal(size=shape)
        return np.round(w * 127 / np.abs(w).max()).astype(np.int8)

    def biases(n: int) -> np.ndarray:
        return np.round(rng.normal(size=n) * 1024).astype(np.int32)

    def requant(name: str, acc: Entry) -> Entry:
        """acc to 8 bits: where wider than 16 bits, to 16 (cvm_right_shift by what the sample's peak needs, else
        cvm_clip); then * M >> k, M / 2^k ~ 127 / the sample's peak."""
        if b.types[acc].precision > 16:
            shift = max(bits(int(np.abs(b.values[acc]).max())) - 15, 0)
            acc = (b.op("cvm_right_shift", acc, name=f"{name}_pre", shift_bit=shift, precision=16) if shift else
                   b.op("cvm_clip", acc, name=f"{name}_pre", precision=16))
        p_acc = b.types[acc].precision
        peak = max(int(np.abs(b.values[acc]).max()), 1)
        for k in range(MAX_SHIFT, 0, -1):
            m = round(127 / peak * 2**k)
            if 1 <= m and p_acc + bits(m) + 1 <= 32:
                break
        scaled = b.op("broadcast_mul", acc, b.param(f"{name}_requant_scale", np.array([m], np.int32)),
                      name=f"{name}_requant")
        return b.op("cvm_right_shift", scaled, name=f"{name}_shift", shift_bit=k, precision=8)

    def conv(name: str, x: Entry, c_in: int, c_out: int, k: int, stride: int = 1, groups: int = 1) -> Entry:
        w = b.param(f"{name}_weight", weights((c_out, c_in // groups, k, k)), 8)
        bias = b.param(f"{name}_bias", biases(c_out), 16)
        return requant(name, b.op("conv2d", x, w, bias, name=name, channels=c_out, kernel_size=(k, k),
                                  strides=(stride, stride), padding=(k // 2, k // 2), groups=groups))

    def relu(name: str, x: Entry) -> Entry:
        return b.op("relu", x, name=f"{name}_relu")

    x = conv("data_scale", Entry(0), 3, 3, 1, groups=3)
    x, c = relu("stem", conv("stem", x, 3, 16, 3)), 16
    for stage, width in enumerate((16, 32, 64), start=1):
        for block in range(3):
            name, stride = f"stage{stage}_block{block}", 2 if stage > 1 and block == 0 else 1
            pre = relu(f"{name}_bn", conv(f"{name}_bn", x, c, c, 1, groups=c))
            y = relu(f"{name}_conv0", conv(f"{name}_conv0", pre, c, width, 3, stride))
            y = conv(f"{name}_conv1", y, width, width, 3)
            short = conv(f"{name}_proj", pre, c, width, 1, stride) if stride > 1 or c != width else x
            s = b.op("elemwise_add", y, short, name=f"{name}_add")
            x, c = relu(name, b.op("cvm_clip", s, name=f"{name}_clip", precision=8)), width
    flat = b.op("flatten", requant("pool", b.op("sum", x, name="pool", axis=(2, 3))), name="flatten")
    w = b.param("dense_weight", weights((10, 64)), 8)
    bias = b.param("dense_bias", biases(10), 16)
    return b.build(requant("dense", b.op("dense", flat, w, bias, name="dense", units=10)))


def main(out: str | Path = Path("out") / "resnet20") -> Path:
    out = Path(out)
    rng = np.random.default_rng(SEED)
    x = rng.integers(-127, 128, SHAPE).astype(np.int8)
    graph = build(x, rng)
    write_model(graph, out)
    np.save(out / "input.npy", x)
    np.save(out / "expected.npy", execute(graph, {"data": x})[0].astype(np.int32))
    return out


def resnet20(cache: str | Path) -> Path:
    """The on-chain ResNet-20 where it is here (``ONCHAIN``), else this stand-in, made in ``cache`` unless there."""
    if (ONCHAIN / "symbol").is_file():
        return ONCHAIN
    cache = Path(cache)
    return cache if (cache / "expected.npy").is_file() else main(cache)


if __name__ == "__main__":
    print(f"wrote {main(*sys.argv[1:2])}")
