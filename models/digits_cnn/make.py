"""Train a small CNN on scikit-learn's 8x8 digits in plain numpy, quantize it to CVM as MRT does, write the model.

    python models/digits_cnn/make.py [OUT_DIR]        (default: this script's directory; needs scikit-learn)

Float model: conv 3x3 8ch (pad 1) -> relu -> max_pool 2x2 -> conv 3x3 16ch (pad 1) -> relu -> flatten -> dense 10,
trained with Adam on a fixed 80/20 split (seeded, float64: a rerun writes byte-identical files).

CVM model, MRT's scheme: the input x in 0..16 becomes round(x * 127 / 16) (int8, precision 8); each weight
tensor is int8 with its own symmetric scale 127 / max|w|; biases are int32 at the accumulator scale
(input scale * weight scale); after each conv the accumulator is requantized to int8 by
``broadcast_mul(acc, M)`` then ``cvm_right_shift(precision=8, shift_bit=k)``, M / 2^k being the ratio of the
activation scale (127 / the largest activation on the training set) to the accumulator scale; the dense layer
gives int32 logits. Writes symbol, params, heldout_x.npy (int8 model inputs) and heldout_y.npy (labels),
input.npy and expected.npy (the first held-out sample and the reference executor's output), and accuracy.json:
the float model's, the CVM model's (reference executor) and its ONNX export's (onnxruntime) held-out accuracy.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

from cvm_onnx import to_onnx
from cvm_onnx.builder import GraphBuilder
from cvm_onnx.executor import execute
from cvm_onnx.format import write_model
from cvm_onnx.ops.registry import bits
from cvm_onnx.runtime import run, session

SEED = 0
HELD_OUT = 0.2
EPOCHS, BATCH, LR = 20, 32, 0.01
MAX_SHIFT = 23  # cvm_right_shift with precision 8 needs 8 + shift_bit < 32 to agree on every device


# -- float model ----------------------------------------------------------------------------------------------------
def patches(x: np.ndarray) -> np.ndarray:
    """(N, C, H, W) -> (N, H*W, C*9): the zero-padded 3x3 neighbourhood of every position, in OIHW weight order."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3)], axis=2)
    return cols.reshape(n, c * 9, h * w).transpose(0, 2, 1)


def patches_grad(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The gradient of ``patches`` w.r.t. its input: each patch gradient added back where it was read."""
    n, c, h, w = shape
    g = g.transpose(0, 2, 1).reshape(n, c, 9, h, w)
    out = np.zeros((n, c, h + 2, w + 2))
    for t in range(9):
        i, j = divmod(t, 3)
        out[:, :, i:i + h, j:j + w] += g[:, :, t]
    return out[:, :, 1:-1, 1:-1]


def conv(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """3x3 conv, pad 1: the output (N, OC, H, W) and the patches it read."""
    n, _, h, wd = x.shape
    cols = patches(x)
    y = cols @ w.reshape(len(w), -1).T + b
    return y.transpose(0, 2, 1).reshape(n, len(w), h, wd), cols


def pool(x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def forward(p: dict[str, np.ndarray], x: np.ndarray):
    z1, cols1 = conv(x, p["w1"], p["b1"])
    a1 = np.maximum(z1, 0)
    m1 = pool(a1)
    z2, cols2 = conv(m1, p["w2"], p["b2"])
    a2 = np.maximum(z2, 0)
    f = a2.reshape(len(x), -1)
    logits = f @ p["w3"].T + p["b3"]
    return logits, (cols1, z1, a1, m1, cols2, z2, f)


def gradients(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """Gradients of the mean softmax cross-entropy."""
    logits, (cols1, z1, a1, m1, cols2, z2, f) = forward(p, x)
    prob = np.exp(logits - logits.max(axis=1, keepdims=True))
    prob /= prob.sum(axis=1, keepdims=True)
    prob[np.arange(len(y)), y] -= 1
    d3 = prob / len(y)
    g = {"w3": d3.T @ f, "b3": d3.sum(0)}
    dz2 = (d3 @ p["w3"]).reshape(z2.shape) * (z2 > 0)
    d2 = dz2.reshape(len(x), len(p["w2"]), -1).transpose(0, 2, 1)  # (N, HW, OC)
    g["w2"] = np.einsum("npo,npk->ok", d2, cols2).reshape(p["w2"].shape)
    g["b2"] = d2.sum((0, 1))
    dm1 = patches_grad(d2 @ p["w2"].reshape(len(p["w2"]), -1), m1.shape)
    up = np.repeat(np.repeat(m1, 2, axis=2), 2, axis=3)
    dz1 = (a1 == up) * np.repeat(np.repeat(dm1, 2, axis=2), 2, axis=3) * (z1 > 0)
    d1 = dz1.reshape(len(x), len(p["w1"]), -1).transpose(0, 2, 1)
    g["w1"] = np.einsum("npo,npk->ok", d1, cols1).reshape(p["w1"].shape)
    g["b1"] = d1.sum((0, 1))
    return g


def train(x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Adam on mini-batches of the mean cross-entropy, He initialisation."""
    shapes = {"w1": (8, 1, 3, 3), "b1": (8,), "w2": (16, 8, 3, 3), "b2": (16,), "w3": (10, 256), "b3": (10,)}
    p = {k: rng.normal(0, np.sqrt(2 / np.prod(s[1:])), s) if k[0] == "w" else np.zeros(s)
         for k, s in shapes.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    t = 0
    for _ in range(EPOCHS):
        order = rng.permutation(len(x))
        for i in range(0, len(x), BATCH):
            batch = order[i:i + BATCH]
            t += 1
            for k, g in gradients(p, x[batch], y[batch]).items():
                m[k] = 0.9 * m[k] + 0.1 * g
                v[k] = 0.999 * v[k] + 0.001 * g * g
                p[k] -= LR * (m[k] / (1 - 0.9 ** t)) / (np.sqrt(v[k] / (1 - 0.999 ** t)) + 1e-8)
    return p


# -- quantization ---------------------------------------------------------------------------------------------------
def int8_weights(w: np.ndarray) -> tuple[np.ndarray, float]:
    """Symmetric per-tensor int8: round(w * s) with s = 127 / max|w|."""
    s = 127 / np.abs(w).max()
    return np.round(w * s).astype(np.int8), s


def requant_scale(ratio: float, p_acc: int) -> tuple[int, int]:
    """(M, k) with M / 2^k ~ ratio: the largest shift k whose M keeps broadcast_mul within 32 bits
    (p_acc + precision(M) <= 32)."""
    for k in range(MAX_SHIFT, 0, -1):
        m = round(ratio * 2**k)
        if m >= 1 and p_acc + bits(m) + 1 <= 32:
            return m, k
    raise ValueError(f"no requantization scale for ratio {ratio} at precision {p_acc}")


def quantize(p: dict[str, np.ndarray], x_train: np.ndarray):
    """The CVM graph of the float model ``p``; activation scales calibrated on ``x_train``."""
    _, (_, _, a1, _, _, z2, _) = forward(p, x_train)
    b = GraphBuilder()
    data = b.input("data", (1, 1, 8, 8), 8)
    s_in = 127.0  # real input x / 16 = data / 127

    def conv_requant(name, x, s_x, w, bias, s_out):
        wq, s_w = int8_weights(w)
        acc = b.op("conv2d", x, b.param(f"{name}_weight", wq, 8),
                   b.param(f"{name}_bias", np.round(bias * s_x * s_w).astype(np.int32)),
                   name=name, channels=len(w), kernel_size=(3, 3), padding=(1, 1))
        p_acc = b.build(acc).type_of(acc).precision
        m, k = requant_scale(s_out / (s_x * s_w), p_acc)
        scaled = b.op("broadcast_mul", acc, b.param(f"{name}_requant_scale", np.array([m], np.int32)),
                      name=f"{name}_requant")
        return b.op("cvm_right_shift", scaled, name=f"{name}_shift", precision=8, shift_bit=k)

    s1 = 127 / a1.max()
    h = conv_requant("conv1", data, s_in, p["w1"], p["b1"], s1)
    h = b.op("relu", h, name="relu1")
    h = b.op("max_pool2d", h, name="pool1", pool_size=(2, 2), strides=(2, 2))
    s2 = 127 / np.maximum(z2, 0).max()
    h = conv_requant("conv2", h, s1, p["w2"], p["b2"], s2)
    h = b.op("relu", h, name="relu2")
    h = b.op("flatten", h, name="flatten")
    wq, s_w = int8_weights(p["w3"])
    logits = b.op("dense", h, b.param("dense_weight", wq, 8),
                  b.param("dense_bias", np.round(p["b3"] * s2 * s_w).astype(np.int32)), name="dense", units=10)
    return b.build(logits)


def split():
    """The digits (pixels 0..16, shape (n, 1, 8, 8)), their labels, the held-out and training indices, and the
    seeded generator that drew them (training goes on drawing from it)."""
    digits = load_digits()
    x = digits.data.reshape(-1, 1, 8, 8)
    rng = np.random.default_rng(SEED)
    order = rng.permutation(len(x))
    n_test = round(len(x) * HELD_OUT)
    return x, digits.target, order[:n_test], order[n_test:], rng


def record_heldout(graph, xq: np.ndarray, labels: np.ndarray, out: Path, summary: dict) -> None:
    """Save the held-out inputs ``xq`` (the model's integer input) and labels, the first sample and the reference
    executor's output for it (input.npy, expected.npy), and accuracy.json: ``summary`` followed by the held-out
    accuracy of the CVM model (reference executor) and of its ONNX export (onnxruntime)."""
    n = len(xq)
    outputs = np.stack([execute(graph, xq[i:i + 1])[0] for i in range(n)])  # (n, 1, 10)
    sess = session(to_onnx(graph))
    onnx_outputs = np.stack([run(sess, {"data": xq[i:i + 1].astype(np.int32)})[0] for i in range(n)])
    for name, o in (("cvm", outputs), ("onnx", onnx_outputs)):
        correct = int((o[:, 0].argmax(1) == labels).sum())
        summary |= {f"{name}_correct": correct, f"{name}_accuracy": correct / n}
    np.save(out / "heldout_x.npy", xq)
    np.save(out / "heldout_y.npy", labels.astype(np.int8))
    np.save(out / "input.npy", xq[:1])
    np.save(out / "expected.npy", outputs[0])
    (out / "accuracy.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


def main(out: Path) -> None:
    x, y, test, tr, rng = split()
    p = train(x[tr] / 16, y[tr], rng)
    float_correct = int((forward(p, x[test] / 16)[0].argmax(1) == y[test]).sum())

    graph = quantize(p, x[tr] / 16)
    out.mkdir(parents=True, exist_ok=True)
    write_model(graph, out)
    record_heldout(graph, np.round(x[test] * 127 / 16).astype(np.int8), y[test], out,
                   {"samples": len(test), "float_correct": float_correct, "float_accuracy": float_correct / len(test)})


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
