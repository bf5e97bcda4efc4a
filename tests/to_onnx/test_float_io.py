"""Exports with float edges in the graph (convert --float-io): float32 in, float32 out, equal to `cvm-onnx run` on
the quantized CVM model for the same floats, element for element (no tolerance), on random models and edges,
over float32 inputs with the extremes (+-inf, +-3.4e38, subnormals, -0) and values on rounding ties."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import cvm_onnx
from cvm_onnx.app.cli import main
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.converters.to_onnx.float_edges import ENDS
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import FormatError, RuntimeFailure, UnsupportedError
from cvm_onnx.core.format.edges import TYPES, Edge, Edges
from cvm_onnx.runtime.sessions import run, run_model
from cvm_onnx.runtime.verify import verify
from conftest import MODELS

DIGITS = MODELS / "digits_cnn"
F32 = np.float32
TINY = float(np.finfo(F32).smallest_subnormal)
scales = st.floats(min_value=TINY, max_value=2.0**100, width=32)  # subnormal to huge


@st.composite
def cases(draw):
    """(graph, edges, x): data -> broadcast_add(data, w) with an edge (per tensor or per channel), negative(data)
    with an edge or none; float32 input with extremes and ties of the input's scale."""
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    p = draw(st.integers(2, 18))
    b = GraphBuilder()
    d = b.input("data", shape, p)
    w = draw(hnp.arrays(np.int32, shape[-1:], elements=st.integers(-100, 100)))
    graph = b.build(b.op("broadcast_add", d, b.param("w", w), name="y"), b.op("negative", d, name="z"))

    def edge(name: str, channels: bool) -> Edge:
        kind = draw(st.sampled_from(sorted(TYPES)))
        lo, hi = TYPES[kind]
        if channels and draw(st.booleans()):
            axis = draw(st.integers(0, len(shape) - 1))
            dims = [1] * len(shape)
            dims[axis] = shape[axis]
            dims = dims[draw(st.integers(0, axis)):]  # leading ones may be left out
            scale = draw(hnp.arrays(F32, dims, elements=scales))
            zero = draw(hnp.arrays(np.int64, dims, elements=st.integers(lo, hi)))
        else:
            scale, zero = np.array(draw(scales), F32), np.array(draw(st.integers(lo, hi)), np.int64)
        return Edge(name, kind, scale, zero)

    edges = Edges(edge("data", False), (edge("y", True), edge("z", True) if draw(st.booleans()) else None))
    s, lo, hi = float(edges.input.scale), *TYPES[edges.input.type]
    z = int(edges.input.zero_point)
    tie = st.builds(lambda k, ulp: np.nextafter(F32((k + 0.5) * s), F32(ulp * np.inf)) if ulp else F32((k + 0.5) * s),
                    st.integers(lo - z - 3, hi - z + 3), st.sampled_from([-1, 0, 1]))
    big = float(np.finfo(F32).max)
    extreme = st.sampled_from([np.inf, -np.inf, big, -big, TINY, -TINY, 0.0, -0.0])
    x = draw(hnp.arrays(F32, shape, elements=st.one_of(tie, extreme, st.floats(width=32, allow_nan=False))))
    return graph, edges, x


@settings(max_examples=60, deadline=None)
@given(cases(), st.booleans())
def test_float_io_export_equals_run_on_the_cvm_model(case, inline):
    graph, edges, x = case
    want = cvm_onnx.run_cvm(graph, x, edges)
    model = to_onnx(graph, inline=inline, edges=edges, float_io=True)
    onnx.checker.check_model(model, full_check=True)
    got = run(model, {"data": x})
    for w, g, e in zip(want, got, edges.outputs):
        assert g.dtype == w.dtype == (np.int32 if e is None else F32) and g.shape == w.shape
        assert np.array_equal(g, w), (g, w)
    again = import_model(model)  # the edges come off again: the integer model and its edges as they were
    assert again.edges.to_bytes() == edges.to_bytes()
    assert [n.op for n in again.graph.nodes] == [n.op for n in graph.nodes]


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["data", "y", "z"]), st.sampled_from(ENDS), st.booleans())
def test_a_tensor_named_as_a_float_edges_own_keeps_the_export_valid(end, suffix, inline):
    """A node named as a tensor the float edges add beside the input or an output (``y:scale`` beside the output
    y: quantize's rewrite of a FusedMatMul named its Mul so): the export valid and equal to run, the edges coming
    off again. Regression: 'Duplicate definition of name (y:scale)' from onnxruntime."""
    b = GraphBuilder()
    d = b.input("data", (2, 3), 8)
    inner = b.op("negative", d, name=f"{end}:{suffix}")
    graph = b.build(b.op("broadcast_add", inner, b.param("w", np.array([1, -2, 3], np.int32)), name="y"),
                    b.op("negative", inner, name="z"))
    edges = Edges(Edge("data", "int8", np.array(0.5, F32), np.array(3)),
                  (Edge("y", "uint8", np.array(0.25, F32), np.array(7)), Edge("z", "int16", np.array(2.0, F32),
                                                                              np.array(-5))))
    x = np.linspace(-70, 70, 6, dtype=F32).reshape(2, 3)
    want = cvm_onnx.run_cvm(graph, x, edges)
    model = to_onnx(graph, inline=inline, edges=edges, float_io=True)
    onnx.checker.check_model(model, full_check=True)
    assert all(np.array_equal(g, w) for g, w in zip(run(model, {"data": x}), want))
    again = import_model(model)
    assert again.edges.to_bytes() == edges.to_bytes()
    assert [n.op for n in again.graph.nodes] == [n.op for n in graph.nodes]


def test_float64_data_is_rounded_to_float32_as_run_rounds_it():
    model = cvm_onnx.load(DIGITS)
    x = np.load(DIGITS / "calibration.npy")[:1].astype(np.float64) + 1e-9
    exported = to_onnx(model.graph, edges=model.edges, float_io=True)
    assert np.array_equal(run_model(exported, x)[1][0], cvm_onnx.run_cvm(model.graph, x, model.edges)[0])


def test_nan_is_refused_by_run():
    model = cvm_onnx.load(DIGITS)
    x = np.zeros((1, 1, 8, 8), F32)
    x[0, 0, 3, 4] = np.nan
    with pytest.raises(RuntimeFailure, match="NaN in the float input"):
        cvm_onnx.run_cvm(model.graph, x, model.edges)


def test_verify_feeds_floats_and_fails_on_a_changed_scale():
    model = cvm_onnx.load(DIGITS)
    verdict = verify(model.graph, edges=model.edges)
    assert verdict.exact and {"ties", "+inf", "-3.4e38"} <= set(verdict.cases)
    bad = to_onnx(model.graph, edges=model.edges, float_io=True)
    scale = next(t for t in bad.graph.initializer if t.name == "data:scale")
    scale.raw_data = np.nextafter(np.frombuffer(scale.raw_data, F32), F32(1)).tobytes()
    verdict = verify(model.graph, onnx_model=bad, edges=model.edges)
    assert not verdict.exact and verdict.differences[0].name == "logits"


def test_cli_float_io_convert_verify_run_info_triton_and_back(tmp_path, capsys):
    out = tmp_path / "d.onnx"
    assert main(["convert", str(DIGITS), "-o", str(out), "--float-io", "--verify"]) == 0
    assert main(["verify", str(DIGITS), "--float-io"]) == 0
    text = capsys.readouterr().out
    assert text.count("exact: 1 output(s) (logits)") == 2 and text.count("+inf, -inf, ties") == 2
    assert main(["run", str(out), "--input", str(DIGITS / "calibration.npy"), "--output", str(tmp_path / "a.npy")]) == 0
    assert main(["run", str(DIGITS), "--input", str(DIGITS / "calibration.npy"),
                 "--output", str(tmp_path / "b.npy")]) == 0
    a, b = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    assert a.dtype == F32 and np.array_equal(a, b)
    assert main(["info", str(out)]) == 0
    assert "input  data: float (1, 1, 8, 8)\n" in capsys.readouterr().out
    assert main(["convert", str(DIGITS), "--triton-repo", str(tmp_path / "repo"), "--float-io"]) == 0
    config = (tmp_path / "repo" / "digits_cnn" / "config.pbtxt").read_text()
    assert config.count("data_type: TYPE_FP32") == 2
    assert main(["convert", str(out), "-o", str(tmp_path / "back")]) == 0
    for f in ("symbol", "params", "quantization.json"):
        assert (tmp_path / "back" / f).read_bytes() == (DIGITS / f).read_bytes()


def test_float_io_needs_a_quantized_cvm_model(tmp_path, capsys):
    assert main(["convert", str(MODELS / "transforms"), "-o", str(tmp_path / "m.onnx"), "--float-io"]) == 4
    assert "need a quantized model" in capsys.readouterr().err
    assert main(["convert", str(DIGITS / "float.onnx"), "-o", str(tmp_path / "m"), "--float-io"]) == 64
    assert "--float-io applies to a CVM model (CVM -> ONNX)" in capsys.readouterr().err
    plain = tmp_path / "plain"
    shutil.copytree(DIGITS, plain)
    doc = json.loads((plain / "quantization.json").read_text())
    (plain / "quantization.json").write_text(json.dumps(doc | {"input": None}))
    with pytest.raises(UnsupportedError, match="quantization.json gives the input none"):
        to_onnx(cvm_onnx.load(plain).graph, edges=cvm_onnx.load(plain).edges, float_io=True)


def test_edges_that_are_not_the_graphs_are_a_format_error():
    model = cvm_onnx.load(DIGITS)
    bad = to_onnx(model.graph, edges=model.edges, float_io=True)
    next(t for t in bad.graph.initializer if t.name == "logits:zero_point").raw_data = np.int32(31).tobytes()
    with pytest.raises(FormatError, match="cvm.float_io: the graph's float edges are not the ones it names"):
        import_model(bad)


@pytest.mark.parametrize("key", ["cvm.float_io", "cvm.quantization"])
def test_verify_and_info_refuse_edges_for_another_number_of_outputs(key, tmp_path, capsys):
    """The float edges in an export's metadata are read with the graph's output count, as the import reads them."""
    model = cvm_onnx.load(DIGITS)
    onnx_model = to_onnx(model.graph, edges=model.edges, float_io=key == "cvm.float_io")
    props = {p.key: p for p in onnx_model.metadata_props}
    doc = json.loads(props[key].value)
    props[key].value = json.dumps(doc | {"outputs": doc["outputs"] * 2})
    path = tmp_path / "m.onnx"
    onnx.save(onnx_model, path)
    command = ["verify", str(path)] if key == "cvm.float_io" else ["info", str(path)]
    code = main(command)
    text = capsys.readouterr()
    said = f"metadata {key}: 2 output edges for a model of 1 outputs"
    if key == "cvm.float_io":
        assert code == 2 and f"format error: {said}" in text.err
    else:
        assert code == 0 and f"float edges: malformed: {said}" in text.out
