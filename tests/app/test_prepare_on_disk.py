"""quantize's preparation runs quant_pre_process's shape inference with the weights on disk
(cvm_onnx.app.quantize._pre_processed): the prepared model (its file and its weights' file) is byte for byte the one
quant_pre_process itself writes with the weights in memory, which still runs where the light path fails."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper as h, numpy_helper as nh
from support.quantized import float_model
from support.transformers import encoder

import cvm_onnx.app.quantize as Q
from cvm_onnx.core.format.onnx_file import onnx_model


def _class_token_model() -> onnx.ModelProto:
    """A class token Expanded and Concatenated before the tokens (the values symbolic shape inference reads), a
    position embedding Added, a MatMul weight: a ViT's embedding."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.normal(size=(1, 1, 384)).astype(np.float32), "cls"),
             nh.from_array(np.array([1, 1, 384], np.int64), "shape"),
             nh.from_array(rng.normal(size=(1, 9, 384)).astype(np.float32), "pos"),
             nh.from_array(rng.normal(size=(384, 64)).astype(np.float32), "w")]
    nodes = [h.make_node("Expand", ["cls", "shape"], ["c"]), h.make_node("Concat", ["c", "x"], ["t"], axis=1),
             h.make_node("Add", ["t", "pos"], ["p"]), h.make_node("MatMul", ["p", "w"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 384])],
                     [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    return onnx_model(g, 17)


MODELS = {
    "cnn": lambda: float_model("Add", seed=3, opset=17, group=2, stride=1, pads=(0, 1, 2, 0), pool="avg",
                               head="sigmoid"),
    "cnn-opset9": lambda: float_model("Concat", seed=1, opset=9, group=1, stride=2, pads=(1, 1, 1, 1), pool="max",
                                      head="sigmoid"),
    "encoder": lambda: encoder(seed=1, s=5, d=32, heads=4, ff=64, ln="pow"),
    "encoder-opset18": lambda: encoder(seed=2, s=5, d=32, heads=4, ff=64, ln="mul", opset=18, layers=2),
    "class-token": _class_token_model,
}


def _prepared(make, tmp_path, name) -> dict[str, bytes]:
    folder = tmp_path / name
    folder.mkdir()
    with Q.quiet_onnxruntime():
        Q.prepare(make(), folder / "prepared.onnx")
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.name.startswith("prepared.onnx")}


@pytest.mark.parametrize("kind", list(MODELS))
def test_the_prepared_model_is_quant_pre_process_s(tmp_path, monkeypatch, kind):
    light = _prepared(MODELS[kind], tmp_path, "light")
    assert light and "prepared.onnx" in light

    def fails(optimized):
        raise RuntimeError("the light path off")

    monkeypatch.setattr(Q, "_pre_processed", fails)
    assert _prepared(MODELS[kind], tmp_path, "full") == light


@pytest.mark.parametrize("kind", ["cnn", "encoder", "encoder-opset18", "class-token"])
def test_quant_pre_process_with_the_weights_in_memory_is_not_run(tmp_path, monkeypatch, kind):
    def heavy(optimized, path):
        raise AssertionError("quant_pre_process ran")

    monkeypatch.setattr(Q, "_quant_pre_processed", heavy)
    _prepared(MODELS[kind], tmp_path, "light")


@pytest.mark.parametrize("kind", ["cnn", "cnn-opset9", "encoder"])
def test_a_model_given_in_a_list_is_taken_and_prepared_the_same(tmp_path, kind):
    """prepare empties the list it is given (it then holds the model's only reference, and frees it once its
    weights are on disk) and writes the same files, the float model as compared among them."""
    def files(folder):
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    given = [MODELS[kind]()]
    with Q.quiet_onnxruntime():
        Q.prepare(MODELS[kind](), tmp_path / "a" / "prepared.onnx")
        Q.prepare(given, tmp_path / "b" / "prepared.onnx")
    assert given == [] and files(tmp_path / "a") == files(tmp_path / "b")


def test_a_lightened_model_is_the_same_model_without_the_bytes_its_weights_left(tmp_path):
    """_lightened: the model parsed anew serializes as before; protobuf keeps the bytes of weights moved out of a
    model until the model is gone, and the new one never held them."""
    m = MODELS["encoder"]()
    Q._save_external(m, tmp_path / "m.onnx")
    light = Q._lightened(m)
    assert light.SerializeToString() == m.SerializeToString()
    assert any(t.external_data for t in light.graph.initializer)
