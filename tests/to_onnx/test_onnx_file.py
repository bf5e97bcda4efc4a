"""Writing .onnx files: the piecewise serialization (format/onnx_file.py) is the same message as protobuf's own,
and params keep their stored type (int8 initializers, widened in the bodies that read them)."""
from __future__ import annotations

import numpy as np
import onnx
from hypothesis import given, settings
from onnx import TensorProto, helper, numpy_helper
from support import graphs

from cvm_onnx.app.api import import_onnx, write_onnx
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.format.onnx_file import onnx_model, onnx_pieces
from cvm_onnx.runtime.sessions import run


def parsed(pieces) -> onnx.ModelProto:
    return onnx.load_from_string(b"".join(pieces))


@settings(max_examples=20, deadline=None)
@given(case=graphs())
def test_pieces_parse_to_the_same_model(case):
    graph, _ = case
    for model in (to_onnx(graph), to_onnx(graph, inline=True)):
        assert parsed(onnx_pieces(model)) == model


def test_pieces_of_every_kind_of_field(tmp_path):
    """Scalars, repeated and nested messages, tensors with raw data, typed data, external data and none."""
    x = helper.make_tensor_value_info("x", TensorProto.INT32, [2])
    inits = [numpy_helper.from_array(np.arange(300, dtype=np.int8), "raw"),
             helper.make_tensor("typed", TensorProto.INT32, [2], [7, -8]),
             helper.make_tensor("empty", TensorProto.INT32, [0], [])]
    external = helper.make_tensor("ext", TensorProto.INT32, [2], [1, 2])
    external.data_location = TensorProto.EXTERNAL
    external.ClearField("int32_data")
    external.external_data.add(key="location", value="w.bin")
    inits.append(external)
    graph = helper.make_graph([helper.make_node("Add", ["x", "typed"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [2])], inits, doc_string="d")
    model = onnx_model(graph, producer_name="p", doc_string="doc")
    helper.set_model_props(model, {"k": "v"})
    assert parsed(onnx_pieces(model)) == model
    write_onnx(model, tmp_path / "m.onnx")
    assert onnx.load(str(tmp_path / "m.onnx"), load_external_data=False) == model


def test_int8_params_stay_int8_and_round_trip(resnet_dir, resnet, tmp_path):
    graph = resnet
    model = to_onnx(graph)
    types = {t.name: t.data_type for t in model.graph.initializer}
    for name, value in graph.params.items():
        assert types[name] == (TensorProto.INT8 if value.dtype == np.int8 else TensorProto.INT32), name
    assert any(v.dtype == np.int8 for v in graph.params.values())
    write_onnx(model, tmp_path / "r.onnx")
    back = import_onnx(tmp_path / "r.onnx")
    for name, value in graph.params.items():
        assert back.params[name].dtype == value.dtype and np.array_equal(back.params[name], value), name
    data = np.load(resnet_dir / "input.npy").astype(np.int32)
    assert np.array_equal(run(tmp_path / "r.onnx", {"data": data})[0], np.load(resnet_dir / "expected.npy"))
