"""Train a small CNN on scikit-learn's 8x8 digits in plain numpy, write it as float ONNX and bring it to CVM with
``cvm-onnx quantize`` (onnxruntime.quantization's static quantizer and calibrator, then the importer).

    python models/digits_cnn/make.py [OUT_DIR]        (default: this script's directory; needs scikit-learn)

Float model: conv 3x3 8ch (pad 1) -> relu -> max_pool 2x2 -> conv 3x3 16ch (pad 1) -> relu -> flatten -> dense 10,
input a pixel value 0..16 divided by 16, trained with Adam on a fixed 80/20 split (seeded, float64: a rerun writes
byte-identical files).

Writes float.onnx (the float model, float32) and calibration.npy (256 training images, float32); the CVM model
(symbol, params, quantization.json) is what ``cvm-onnx quantize float.onnx --calibration calibration.npy -o DIR
--per-channel --activation int8`` writes, by the same function: int8 activations and per-channel int8 weights
calibrated by minmax, imported in integers. Also heldout_x.npy (the held-out images quantized as the model's input,
int8) and heldout_y.npy (labels), input.npy and expected.npy (the first held-out sample and the reference
executor's output: the quantized logits), and accuracy.json: held-out accuracy of the float model (numpy), of the
quantized ONNX model (onnxruntime, session.x64quantprecision), of the CVM model (reference executor) and of its
ONNX export (onnxruntime).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits

from cvm_onnx import load, to_onnx
from cvm_onnx.app.quantize import quantize
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.sessions import run, session

SEED = 0
HELD_OUT = 0.2
EPOCHS, BATCH, LR = 20, 32, 0.01
CALIBRATION = 256  # training images onnxruntime's calibrator sees


def split():
    """The digits (pixels 0..16, shape (n, 1, 8, 8)), their labels, the held-out and training indices, and the
    seeded generator that drew them (training goes on drawing from it)."""
    digits = load_digits()
    x = digits.data.reshape(-1, 1, 8, 8)
    rng = np.random.default_rng(SEED)
    order = rng.permutation(len(x))
    n_test = round(len(x) * HELD_OUT)
    return x, digits.target, order[:n_test], order[n_test:], rng


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


# -- float ONNX, quantized ------------------------------------------------------------------------------------------
def float_onnx(p: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The float model as ONNX (float32 weights), input x / 16 of shape (1, 1, 8, 8), output the logits."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["conv1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv1"], ["relu1"]),
             helper.make_node("MaxPool", ["relu1"], ["pool1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["pool1", "w2", "b2"], ["conv2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv2"], ["relu2"]),
             helper.make_node("Flatten", ["relu2"], ["flatten"]),
             helper.make_node("Gemm", ["flatten", "w3", "b3"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "digits_cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in p.items()])
    return onnx_model(graph, 17, producer_name="digits_cnn/make.py")


def quantized_onnx_logits(model: Path, xf: np.ndarray) -> np.ndarray:
    """onnxruntime's float logits (n, 10) of the quantized ONNX model, one image a call."""
    options = ort.SessionOptions()
    options.add_session_config_entry("session.x64quantprecision", "1")
    sess = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, {"x": xf[i:i + 1]})[0] for i in range(len(xf))])


def main(out: Path) -> None:
    x, y, test, tr, rng = split()
    p = train(x[tr] / 16, y[tr], rng)
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(float_onnx(p), out / "float.onnx")
    np.save(out / "calibration.npy", (x[tr[:CALIBRATION]] / 16).astype(np.float32))
    xf, labels, n = (x[test] / 16).astype(np.float32), y[test], len(test)
    with tempfile.TemporaryDirectory() as tmp:
        quantize(out / "float.onnx", out / "calibration.npy", out, per_channel=True, activation="int8",
                 save_onnx=Path(tmp) / "quantized.onnx")
        ort_logits = quantized_onnx_logits(Path(tmp) / "quantized.onnx", xf)
    model = load(out)
    xq = model.edges.input.quantize(xf).astype(np.int8)
    cvm = np.stack([execute(model.graph, xq[i:i + 1])[0] for i in range(n)])  # (n, 1, 10)
    sess = session(to_onnx(model.graph))
    exported = np.stack([run(sess, {"data": xq[i:i + 1].astype(np.int32)})[0] for i in range(n)])
    summary = {"samples": n}
    for name, logits in (("float", forward(p, x[test] / 16)[0]), ("ort_quantized", ort_logits),
                         ("cvm", cvm[:, 0]), ("onnx", exported[:, 0])):
        correct = int((logits.argmax(1) == labels).sum())
        summary |= {f"{name}_correct": correct, f"{name}_accuracy": correct / n}
    np.save(out / "heldout_x.npy", xq)
    np.save(out / "heldout_y.npy", labels.astype(np.int8))
    np.save(out / "input.npy", xq[:1])
    np.save(out / "expected.npy", cvm[0])
    (out / "accuracy.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
