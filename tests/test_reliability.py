"""Reliability: hostile and malformed models give the project's own errors, within time and memory bounds.

The pipeline under test is the converter's: read the symbol and params, validate, export to ONNX. Every outcome
must be success or a ``CVMError``; anything else is a crash. Crashes found by fuzzing get a regression test below.
"""
from __future__ import annotations

import errno
import math
import os
import re
import stat

import onnx
import pytest

from cvm_onnx.attrs import AttrSyntaxError, parse_tuple
from cvm_onnx.builder import GraphBuilder
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.api import import_onnx, write_onnx
from cvm_onnx.errors import CVMError, FormatError, UnsupportedError, ValidationError
from cvm_onnx.format import write_model


# -- crashes found by fuzzing ----------------------------------------------------------------------------------------
def test_empty_tuple_attribute_is_a_validation_error():
    """An empty string for a tuple attribute was indexed before being checked (IndexError)."""
    with pytest.raises(AttrSyntaxError):
        parse_tuple("")
    b = GraphBuilder()
    x = b.input("data", (1, 1, 4, 4), 8)
    b.op("max_pool2d", x, name="pool", pool_size="")
    with pytest.raises(ValidationError) as info:
        b.build(x)
    assert [str(p) for p in info.value.problems] == ["pool: max_pool2d: attribute pool_size='': '' is not an integer"]


def vision_graph(**attrs):
    b = GraphBuilder()
    counts, rows = b.op("get_valid_counts", b.input("data", (1, 5, 6), 8), name="gvc", **attrs)
    return b.build(counts, rows)


@pytest.mark.parametrize("value", [str(1 << 31), str(-(1 << 31) - 1), str(1 << 64), "9" * 5000, 1 << 31],
                         ids=["2^31", "-2^31-1", "2^64", "5000 digits", "typed 2^31"])
def test_int_attributes_beyond_int32_are_validation_errors(value):
    """The runtime reads int attributes into an int32 (istream >> int fails beyond). 2^64 passed validation and
    crashed the exporter (ValueError from onnx.helper); 5000 digits crashed Python's int() (ValueError)."""
    with pytest.raises(ValidationError) as info:
        vision_graph(score_threshold=value)
    [problem] = info.value.problems
    assert problem.where == "gvc" and "score_threshold" in problem.rule and "int32" in problem.rule


def test_int_attributes_at_the_int32_edges_export():
    for value in ((1 << 31) - 1, -(1 << 31)):
        to_onnx(vision_graph(score_threshold=str(value)))


def test_tuple_items_beyond_int64_are_syntax_errors():
    """Tuple items are read into int64 (TShape); 5000 digits crashed Python's int() (ValueError)."""
    assert parse_tuple(f"({(1 << 63) - 1}, {-(1 << 63)})") == ((1 << 63) - 1, -(1 << 63))
    for text in (f"({1 << 63},)", f"[{-(1 << 63) - 1}]", "9" * 5000, f"(1, {'9' * 5000})"):
        with pytest.raises(AttrSyntaxError, match="int64"):
            parse_tuple(text)


def test_write_onnx_failures_are_format_errors_and_leave_nothing(tmp_path):
    """A missing directory or a directory in the way gave FileNotFoundError / IsADirectoryError (internal errors)."""
    model = to_onnx(vision_graph())
    (tmp_path / "taken.onnx").mkdir()
    for target in (tmp_path / "missing" / "m.onnx", tmp_path / "taken.onnx"):
        with pytest.raises(FormatError, match="cannot write the model"):
            write_onnx(model, target)
    assert [p.name for p in tmp_path.iterdir()] == ["taken.onnx"] and not any((tmp_path / "taken.onnx").iterdir())


def test_write_onnx_gives_new_files_the_usual_mode(tmp_path):
    """Output was left with mkstemp's 0600; a new file gets 0644, a replaced file keeps its mode."""
    model = to_onnx(vision_graph())
    write_onnx(model, tmp_path / "m.onnx")
    assert stat.S_IMODE((tmp_path / "m.onnx").stat().st_mode) == 0o644
    (tmp_path / "m.onnx").chmod(0o640)
    write_onnx(model, tmp_path / "m.onnx")
    assert stat.S_IMODE((tmp_path / "m.onnx").stat().st_mode) == 0o640


def failing_fsync(monkeypatch, nth: int) -> None:
    """Make the ``nth`` os.fsync fail as a full disk does."""
    calls, real = [], os.fsync

    def fsync(fd):
        calls.append(fd)
        if len(calls) == nth:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_write_model_failing_on_params_keeps_both_old_files(tmp_path, monkeypatch):
    """write_model replaced the symbol before writing the params: a failure there left a new symbol with the old
    params. A fresh directory is not left behind either."""
    write_model(vision_graph(), tmp_path / "m")
    old = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()}
    failing_fsync(monkeypatch, 2)
    with pytest.raises(FormatError, match="No space left on device"):
        write_model(vision_graph(score_threshold=3), tmp_path / "m")
    assert {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()} == old
    failing_fsync(monkeypatch, 1)
    with pytest.raises(FormatError):
        write_model(vision_graph(), tmp_path / "new")
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def import_file(tmp_path, data: bytes):
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    return import_onnx(path)


@pytest.mark.parametrize("dtype", [0, 8, 14, 17, 22, -1, 127])
def test_tensors_of_unreadable_types_are_format_errors(tmp_path, dtype):
    """UNDEFINED, STRING, COMPLEX64, FLOAT8E4M3FN, INT4 and unknown values crashed numpy_helper.to_array (KeyError,
    TypeError, ValueError) when a Constant of that type was read."""
    model = to_onnx(vision_graph())
    assert model.graph.node[0].op_type == "Constant"
    model.graph.node[0].attribute[0].t.data_type = dtype
    with pytest.raises(FormatError, match="data type"):
        import_file(tmp_path, model.SerializeToString())
    model.graph.input[0].type.tensor_type.elem_type = dtype  # its name in a message crashed too (ValueError)
    model.graph.node[0].attribute[0].t.data_type = onnx.TensorProto.INT32
    with pytest.raises(CVMError, match="data: input of non-integer type"):
        import_file(tmp_path, model.SerializeToString())


def test_strings_that_are_not_utf8_are_format_errors(tmp_path):
    """Protobuf hands such strings over as bytes: TypeErrors all over the importer, or the exporter after it."""
    data = to_onnx(vision_graph()).SerializeToString()
    assert data.count(b"gvc") > 2
    with pytest.raises(FormatError, match="not UTF-8") as info:
        import_file(tmp_path, data.replace(b"gvc", b"g\xffc"))
    assert all("not UTF-8" in p.rule for p in info.value.problems)


def int_model(nodes, outputs=("y",)) -> bytes:
    vi = [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.INT32, [1, 4]) for n in ("data", *outputs)]
    graph = onnx.helper.make_graph(nodes, "g", vi[:1], vi[1:])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 21)]).SerializeToString()


@pytest.mark.parametrize("node, problem", [
    (onnx.helper.make_node("Clip", ["data", "", "", "data"], ["y"], name="n"), "n: Clip takes 1 to 3 input(s), has 4"),
    (onnx.helper.make_node("Conv", ["data"], ["y"], name="n"), "n: Conv takes 2 to 3 input(s), has 1"),
    (onnx.helper.make_node("Relu", [], ["y"], name="n"), "n: Relu takes 1 input(s), has 0"),
    (onnx.helper.make_node("Relu", ["data"], ["y", "z"], name="n"), "n: Relu gives 1 output(s), has 2"),
    (onnx.helper.make_node("Clip", ["", "data"], ["y"], name="n"), "n: Clip: input 0 (input) is required, but empty"),
])
def test_nodes_with_inputs_their_op_does_not_take_are_format_errors(tmp_path, node, problem):
    """Import rules were called with the node's inputs as they came: TypeError (Clip with 4 inputs, Conv with 1) or
    AttributeError (Clip without its required input)."""
    with pytest.raises(FormatError) as info:
        import_file(tmp_path, int_model([node]))
    assert [str(p) for p in info.value.problems] == [problem]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_constant_bounds_are_refused(tmp_path, value):
    """int(nan) and int(inf) in the check that a constant scalar is an integer raised ValueError/OverflowError."""
    nodes = [onnx.helper.make_node("Constant", [], ["lo"], value=onnx.helper.make_tensor("lo", 1, [], [value])),
             onnx.helper.make_node("Clip", ["data", "lo"], ["y"], name="clip")]
    with pytest.raises(UnsupportedError, match=re.escape(f"clip (Clip): Clip min = {value} is not an integer")):
        import_file(tmp_path, int_model(nodes))


@pytest.mark.parametrize("version", [(1 << 63) - 1, -(1 << 63), 0])
def test_absurd_opset_versions_are_not_a_crash(tmp_path, version):
    """The schema lookup of the arity check got the version as a C int (TypeError beyond it)."""
    model = onnx.load_from_string(int_model([onnx.helper.make_node("Relu", ["data"], ["y"], name="relu")]))
    model.opset_import[0].version = version
    try:
        import_file(tmp_path, model.SerializeToString())
    except CVMError:
        pass


@pytest.mark.parametrize("shape", [[3], [1], [2, 5], []])
def test_matmul_operands_that_do_not_match_are_refused(tmp_path, shape):
    """The MatMul rule reshaped the right operand to (k, 1) with k taken from the left one (ValueError), or
    indexed the shape of a scalar (IndexError)."""
    b = onnx.helper.make_tensor("b", onnx.TensorProto.INT32, shape, [1] * math.prod(shape))
    nodes = [onnx.helper.make_node("Constant", [], ["b"], value=b),
             onnx.helper.make_node("MatMul", ["data", "b"], ["y"], name="mm")]
    with pytest.raises(UnsupportedError, match=re.escape(f"mm (MatMul): MatMul operands of shapes (1, 4) and "
                                                         f"{tuple(shape)} do not match")):
        import_file(tmp_path, int_model(nodes))


def test_an_unread_declared_param_that_cannot_be_one_is_refused(tmp_path):
    """Params that no node reads are added last, outside the rules' error handling: the importer's internal
    Refuse escaped (found by fuzzing: a flat-form marker changed, so its weight was read by nothing)."""
    model = onnx.load_from_string(int_model([onnx.helper.make_node("Relu", ["data"], ["y"])]))
    model.graph.initializer.append(onnx.helper.make_tensor("w", onnx.TensorProto.FLOAT, [2], [0.5, 1.0]))
    info = model.graph.value_info.add()
    info.CopyFrom(onnx.helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [2]))
    info.metadata_props.add(key="cvm.precision", value="8")
    with pytest.raises(UnsupportedError) as error:
        import_file(tmp_path, model.SerializeToString())
    assert [str(p) for p in error.value.problems] == ["w: constant w holds non-integer values"]
