"""ONNX input safety: before anything is allocated or run, the importer refuses external data that leaves the
model's directory or its file, tensors whose declared size does not match their data, shapes that would need
huge allocations, graphs with cycles, undefined inputs or twice-defined tensors; each as a clear FormatError, all
at once. The CLI exits with the error's code and writes nothing."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from cvm_onnx.app import api
from cvm_onnx.app.cli import main
from cvm_onnx.converters.from_onnx import from_onnx
from cvm_onnx.core.errors import FormatError, UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model


def add_model(w: onnx.TensorProto, nodes=None, shape=(4,)) -> onnx.ModelProto:
    nodes = nodes or [helper.make_node("Add", ["x", w.name], ["y"], name="add")]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", T.INT32, list(shape))],
                              [helper.make_tensor_value_info("y", T.INT32, list(shape))], [w])
    return onnx_model(graph, 17)


def external(w: onnx.TensorProto, location: str, offset: int = 0, length: int | None = None) -> onnx.TensorProto:
    w.ClearField("raw_data")
    w.data_location = T.EXTERNAL
    info = {"location": location, "offset": str(offset)} | ({"length": str(length)} if length is not None else {})
    w.external_data.extend(onnx.StringStringEntryProto(key=k, value=v) for k, v in info.items())
    return w


def problems(model, base_dir=None) -> list[str]:
    with pytest.raises(FormatError) as e:
        from_onnx(model, base_dir=base_dir)
    return [str(p) for p in e.value.problems]


W = np.array([3, -1, 4, -1], np.int32)


def tensor(name: str, dtype: int, dims: list[int], values: list[int]) -> onnx.TensorProto:
    """A tensor exactly as declared (onnx.helper would refuse the mismatches tested here)."""
    t = onnx.TensorProto(name=name, data_type=dtype, dims=dims)
    t.int32_data.extend(values)
    return t


def test_external_data_inside_the_directory_is_read(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 8 + W.tobytes())
    m = add_model(external(numpy_helper.from_array(W, "w"), "weights.bin", 8, 16))
    onnx.save(m, tmp_path / "m.onnx")
    graph = api.import_onnx(tmp_path / "m.onnx")
    [y] = execute(graph, np.array([1, 2, 3, 4], np.int32))
    assert np.array_equal(y, W + [1, 2, 3, 4])


@pytest.mark.parametrize("location, rule", [
    ("../outside.bin", "leaves the model's directory"),
    ("/etc/passwd", "must be a relative path"),
    ("sub/../../outside.bin", "leaves the model's directory"),
    ("link.bin", "leaves the model's directory"),
    ("missing.bin", "does not exist"),
])
def test_external_data_that_leaves_the_directory_is_refused(tmp_path, location, rule):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (tmp_path / "outside.bin").write_bytes(W.tobytes())
    os.symlink(tmp_path / "outside.bin", model_dir / "link.bin")
    [p] = problems(add_model(external(numpy_helper.from_array(W, "w"), location)), model_dir)
    assert p.startswith("initializer 'w'") and rule in p


def test_external_data_needs_the_model_directory_and_its_file_range(tmp_path):
    (tmp_path / "w.bin").write_bytes(W.tobytes())
    assert "no model directory" in problems(add_model(external(numpy_helper.from_array(W, "w"), "w.bin")))[0]
    [p] = problems(add_model(external(numpy_helper.from_array(W, "w"), "w.bin", 8, 16)), tmp_path)
    assert "outside its file of 16 bytes" in p
    [p] = problems(add_model(external(numpy_helper.from_array(W, "w"), "w.bin", 0, 12)), tmp_path)
    assert "has 12 bytes, but shape [4] of 4-byte values needs 16" in p


def test_declared_sizes_must_match_the_data():
    short = numpy_helper.from_array(W, "w")
    short.raw_data = short.raw_data[:4]
    assert "raw data has 4 bytes, but shape [4] of 4-byte values needs 16" in problems(add_model(short))[0]
    typed = tensor("w", T.INT32, [4], [1, 2, 3])
    assert "holds 3 values, but its shape [4] declares 4" in problems(add_model(typed))[0]


def test_huge_shapes_are_refused_before_allocating():
    huge = tensor("w", T.INT32, [1 << 20, 1 << 20], [])
    assert "more than 2^30" in problems(add_model(huge))[0]
    m = add_model(numpy_helper.from_array(W, "w"), shape=(1 << 25,))
    assert any("dims must lie in [0, 2^24]" in p for p in problems(m))
    const = helper.make_node("Constant", [], ["c"], name="big", value=tensor("v", T.INT8, [1 << 31], []))
    assert "big: tensor declares 2147483648 elements" in problems(add_model(numpy_helper.from_array(W, "w"),
                                                                           [const]))[0]


def test_graph_structure_problems_are_listed_together():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="first"),
             helper.make_node("Add", ["a", "x"], ["b"], name="second"),
             helper.make_node("Add", ["x", "nowhere"], ["y"], name="third"),
             helper.make_node("Neg", ["x"], ["y"], name="fourth")]
    found = problems(add_model(numpy_helper.from_array(W, "w"), nodes))
    assert "third: input 'nowhere' is not defined by any node, graph input or initializer" in found
    assert "fourth: output 'y' is already defined elsewhere" in found
    assert any(p.startswith("graph: the nodes form a cycle") and "first, second" in p for p in found)


def test_nodes_out_of_order_are_sorted():
    nodes = [helper.make_node("Neg", ["a"], ["y"], name="late"),
             helper.make_node("Add", ["x", "w"], ["a"], name="early")]
    [y] = execute(from_onnx(add_model(numpy_helper.from_array(W, "w"), nodes)), np.array([1, 2, 3, 4], np.int32))
    assert np.array_equal(y, -(W + [1, 2, 3, 4]))


def test_cli_exit_codes_and_nothing_written(tmp_path, capsys):
    bad = add_model(numpy_helper.from_array(W, "w"), [helper.make_node("Add", ["x", "nowhere"], ["y"], name="n")])
    onnx.save(bad, tmp_path / "bad.onnx")
    assert main(["convert", str(tmp_path / "bad.onnx"), "-o", str(tmp_path / "out")]) == FormatError.exit_code
    unsupported = add_model(numpy_helper.from_array(W, "w"), [helper.make_node("Sin", ["x"], ["y"], name="s")])
    onnx.save(unsupported, tmp_path / "sin.onnx")
    assert main(["convert", str(tmp_path / "sin.onnx"), "-o", str(tmp_path / "out")]) == UnsupportedError.exit_code
    assert "unsupported: s (Sin): no CVM op for ONNX Sin" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    onnx.save(add_model(numpy_helper.from_array(W, "w")), tmp_path / "ok.onnx")
    assert main(["convert", str(tmp_path / "ok.onnx"), "-o", str(tmp_path / "out"), "--input-precision", "12"]) == 0
    graph = api.load(tmp_path / "out").graph
    assert graph.nodes[graph.inputs[0]].name == "data" and graph.nodes[graph.inputs[0]].outputs[0].precision == 12


def _model(nodes, inputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", T.INT32, None)],
                              list(initializers))
    return onnx_model(graph)


@pytest.mark.parametrize("case", ["crossed_clip", "expand"])
def test_a_tiny_model_cannot_make_the_importer_fold_a_huge_constant(case):
    """A few bytes of ONNX can describe a constant of any size: a Clip whose bounds cross is its max everywhere
    on a [2^24, 64] input (8 GB as int64), an Expand of a scalar to a vast shape. Refused before allocating."""
    big = helper.make_tensor_value_info("x", T.INT32, [1 << 24, 64])
    if case == "crossed_clip":
        lo = numpy_helper.from_array(np.array(5, np.int32), "lo")
        hi = numpy_helper.from_array(np.array(3, np.int32), "hi")
        model = _model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], [big], [lo, hi])
    else:
        one = numpy_helper.from_array(np.array([7], np.int32), "one")
        shape = numpy_helper.from_array(np.array([1 << 14, 1 << 14], np.int64), "shape")
        model = _model([helper.make_node("Expand", ["one", "shape"], ["e"]),
                        helper.make_node("Add", ["x", "e"], ["y"])],
                       [helper.make_tensor_value_info("x", T.INT32, [1 << 14, 1 << 14])], [one, shape])
    with pytest.raises(UnsupportedError) as e:
        from_onnx(model)
    assert "2^24" in str(e.value)
