"""The digits CNN of ../digits_cnn, trained the same way (the same float weights), written as float ONNX and
brought to CVM by ``cvm-onnx quantize`` (onnxruntime.quantization's static quantizer and calibrator, then the
importer) instead of MRT's scheme.

    python models/digits_quantized/make.py [OUT_DIR]   (default: this script's directory; needs scikit-learn)

Writes float.onnx (the float model, float32; input x / 16 for pixels x in 0..16) and calibration.npy (256
training images, float32); the CVM model (symbol, params, quantization.json) is what ``cvm-onnx quantize
float.onnx --calibration calibration.npy -o DIR --per-channel --activation int8`` writes: int8 activations and
per-channel int8 weights calibrated by minmax, imported in integers. Also heldout_x.npy (the held-out images
quantized as the model's input, int8) and heldout_y.npy (labels), input.npy and expected.npy (the first held-out
sample and the reference executor's output: the quantized logits), and accuracy.json: held-out accuracy of the
float model (numpy), of the quantized ONNX model (onnxruntime, session.x64quantprecision), of the CVM model
(reference executor) and of its ONNX export (onnxruntime).
"""
from __future__ import annotations

import importlib.util
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
from cvm_onnx.executor import execute
from cvm_onnx.quantize import quantize
from cvm_onnx.runtime import run, session

_spec = importlib.util.spec_from_file_location("digits_cnn_make", Path(__file__).parents[1] / "digits_cnn" / "make.py")
digits_cnn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(digits_cnn)  # the float model: its training, split and seed
CALIBRATION = 256  # training images onnxruntime's calibrator sees


# -- float ONNX, quantized ---------------------------------------------------------------------------------------
def float_onnx(p: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The float model as ONNX (float32 weights), input x / 16 of shape (1, 1, 8, 8), output the logits."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["conv1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv1"], ["relu1"]),
             helper.make_node("MaxPool", ["relu1"], ["pool1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["pool1", "w2", "b2"], ["conv2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv2"], ["relu2"]),
             helper.make_node("Flatten", ["relu2"], ["flatten"]),
             helper.make_node("Gemm", ["flatten", "w3", "b3"], ["logits"], transB=1)]
    graph = helper.make_graph(nodes, "digits_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in p.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="digits_quantized/make.py")


def main(out: Path) -> None:
    digits = load_digits()
    x = digits.data.reshape(-1, 1, 8, 8)  # values 0..16
    y = digits.target
    rng = np.random.default_rng(digits_cnn.SEED)
    order = rng.permutation(len(x))
    n_test = round(len(x) * digits_cnn.HELD_OUT)
    test, tr = order[:n_test], order[n_test:]

    p = digits_cnn.train(x[tr] / 16, y[tr], rng)
    float_correct = int((digits_cnn.forward(p, x[test] / 16)[0].argmax(1) == y[test]).sum())

    out.mkdir(parents=True, exist_ok=True)
    onnx.save(float_onnx(p), out / "float.onnx")
    np.save(out / "calibration.npy", (x[tr[:CALIBRATION]] / 16).astype(np.float32))
    with tempfile.TemporaryDirectory() as tmp:
        quantize(out / "float.onnx", out / "calibration.npy", out, per_channel=True, activation="int8",
                 save_onnx=Path(tmp) / "quantized.onnx")
        options = ort.SessionOptions()
        options.add_session_config_entry("session.x64quantprecision", "1")
        quantized = ort.InferenceSession(str(Path(tmp) / "quantized.onnx"), options,
                                         providers=["CPUExecutionProvider"])
        xf = (x[test] / 16).astype(np.float32)
        ort_correct = int(sum(quantized.run(None, {"x": xf[i:i + 1]})[0].argmax() == y[test][i]
                              for i in range(n_test)))
    model = load(out)
    graph = model.graph
    xq = model.edges.input.quantize(xf).astype(np.int8)
    outputs = np.stack([execute(graph, xq[i:i + 1])[0] for i in range(n_test)])  # (n, 1, 10)
    cvm_correct = int((outputs[:, 0].argmax(1) == y[test]).sum())
    sess = session(to_onnx(graph))
    onnx_outputs = np.stack([run(sess, {"data": xq[i:i + 1].astype(np.int32)})[0] for i in range(n_test)])
    onnx_correct = int((onnx_outputs[:, 0].argmax(1) == y[test]).sum())

    np.save(out / "heldout_x.npy", xq)
    np.save(out / "heldout_y.npy", y[test].astype(np.int8))
    np.save(out / "input.npy", xq[:1])
    np.save(out / "expected.npy", outputs[0])
    summary = {"samples": n_test, "float_correct": float_correct, "float_accuracy": float_correct / n_test,
               "ort_quantized_correct": ort_correct, "ort_quantized_accuracy": ort_correct / n_test,
               "cvm_correct": cvm_correct, "cvm_accuracy": cvm_correct / n_test,
               "onnx_correct": onnx_correct, "onnx_accuracy": onnx_correct / n_test}
    (out / "accuracy.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
