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
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from cvm_onnx import load
from cvm_onnx.quantize import quantize

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
    graph = helper.make_graph(nodes, "digits_cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in p.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             producer_name="digits_quantized/make.py")


def main(out: Path) -> None:
    x, y, test, tr, rng = digits_cnn.split()
    p = digits_cnn.train(x[tr] / 16, y[tr], rng)
    float_correct = int((digits_cnn.forward(p, x[test] / 16)[0].argmax(1) == y[test]).sum())

    out.mkdir(parents=True, exist_ok=True)
    onnx.save(float_onnx(p), out / "float.onnx")
    np.save(out / "calibration.npy", (x[tr[:CALIBRATION]] / 16).astype(np.float32))
    xf = (x[test] / 16).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        quantize(out / "float.onnx", out / "calibration.npy", out, per_channel=True, activation="int8",
                 save_onnx=Path(tmp) / "quantized.onnx")
        options = ort.SessionOptions()
        options.add_session_config_entry("session.x64quantprecision", "1")
        quantized = ort.InferenceSession(str(Path(tmp) / "quantized.onnx"), options,
                                         providers=["CPUExecutionProvider"])
        ort_correct = int(sum(quantized.run(None, {"x": xf[i:i + 1]})[0].argmax() == y[test][i]
                              for i in range(len(test))))
    model = load(out)
    n = len(test)
    digits_cnn.record_heldout(model.graph, model.edges.input.quantize(xf).astype(np.int8), y[test], out,
                              {"samples": n, "float_correct": float_correct, "float_accuracy": float_correct / n,
                               "ort_quantized_correct": ort_correct, "ort_quantized_accuracy": ort_correct / n})


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
