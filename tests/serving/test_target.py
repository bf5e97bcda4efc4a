"""The serving form's Target (cvm_onnx/serving/target.py): one value, checked, stated in the model's metadata, the
export a function of (graph, Target) alone, and a fixed layout run as exported by plain onnxruntime and sessions."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import MODELS

import cvm_onnx
from cvm_onnx import native
from cvm_onnx.app.cli import main
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.constants import ROUTES, TARGET
from cvm_onnx.core.errors import FormatError, RuntimeFailure, UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.native import cpu, library_path
from cvm_onnx.runtime import sessions
from cvm_onnx.serving import pipeline
from cvm_onnx.serving.cpu_layout import LAYOUTS
from cvm_onnx.serving.target import Target

needs_library = pytest.mark.skipif(library_path() is None, reason="the native custom-op library was not built")


@pytest.mark.parametrize("fields, message", [
    ({"provider": "tpu"}, "target provider 'tpu'"),
    ({"products": "int8"}, "target products 'int8'"),
    ({"layout": "diagonal"}, "target layout 'diagonal'"),
    ({"operands": "s8s8"}, "target operands 's8s8'"),
    ({"isa": "neon"}, "target isa 'neon'"),
    ({"provider": "cuda", "layout": "fused"}, "only a CPU target with integer products has a layout"),
    ({"products": "float", "operands": "u8s8"}, "only a CPU target with integer products has a layout"),
    ({"provider": "cuda", "isa": "avx2"}, "only a CPU target with integer products has a layout"),
])
def test_a_target_outside_its_choices_is_refused_naming_the_field(fields, message):
    with pytest.raises(UnsupportedError, match=message):
        Target(**fields)


def test_a_model_states_its_target_and_a_bad_statement_is_a_format_error():
    graph = cvm_onnx.load(MODELS / "digits_cnn").graph
    for target in (Target(products="float"), Target("cuda"), Target(layout="columns", operands="u8s8-rows0")):
        assert Target.of(to_onnx(graph, target)) == target
    assert Target.of(to_onnx(graph, inline=True)) is None
    model = to_onnx(graph, Target(products="float"))
    next(p for p in model.metadata_props if p.key == TARGET).value = json.dumps({"provider": "cpu", "layout": "x"})
    with pytest.raises(FormatError, match="cvm.target"):
        Target.of(model)


def test_the_bytes_of_an_export_depend_on_its_target_not_on_the_native_library(monkeypatch):
    """The same Target gives the same bytes whether or not the exporting machine has the native library (which
    only ``Target.default`` and ``Target.native`` read, to choose a target)."""
    graph = cvm_onnx.load(MODELS / "digits_cnn").graph
    targets = [Target(), Target(products="float"), Target(layout="fused", operands="u8s8", isa="avx2"), Target("cuda")]
    before = [to_onnx(graph, t).SerializeToString(deterministic=True) for t in targets]
    monkeypatch.setattr(native, "LIBRARY", "absent.so")
    assert library_path() is None and Target.default() == Target(products="float") == Target.native()
    assert [to_onnx(graph, t).SerializeToString(deterministic=True) for t in targets] == before
    assert len(set(before)) == len(before)


def test_the_pipeline_of_a_target_holds_its_layout_passes():
    flat = [p.name for p in pipeline(Target(products="float")).passes]
    assert pipeline(Target()).names == tuple(flat)
    assert pipeline(Target(layout="fused", operands="u8s8")).names[len(flat):] == (
        "channels_last", "fused_convolutions", "signed_every")
    assert pipeline(Target(layout="columns", operands="u8s8-rows0")).names[len(flat):] == (
        "columns_from_rows", "signed_rows0")
    assert pipeline(Target("cuda")).names[len(flat):] == ("clips_as_max_min",)


def plain_session(model: onnx.ModelProto) -> ort.InferenceSession:
    """The model on plain onnxruntime, as a user or Triton runs it: default options, the native library
    registered."""
    so = ort.SessionOptions()
    so.register_custom_ops_library(library_path())
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@needs_library
def test_this_machines_target_runs_exactly_and_as_exported_on_plain_onnxruntime():
    """``Target.native()`` fixes the layout at export: the file holds the layout's nodes (one conv_requantize per
    rows convolution where fused, as the routes say), plain onnxruntime computes the reference's outputs, and a
    session runs it as it is (taking no layout of its own)."""
    loaded = cvm_onnx.load(MODELS / "digits_cnn")
    target = Target.native()
    model = to_onnx(loaded.graph, target)
    rows = sum("rows" in route for _, route, _ in json.loads(next(
        p.value for p in model.metadata_props if p.key == ROUTES)))
    fused = sum(n.op_type.startswith("conv_requantize") for n in model.graph.node)
    assert fused == (rows if target.layout == "fused" else 0)
    x = np.random.default_rng(0).integers(-127, 128, (1, 1, 8, 8)).astype(np.int32)
    want = execute(loaded.graph, {"data": x})
    for got in (plain_session(model).run(None, {"data": x}), sessions.session(model).run(None, {"data": x})):
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    with pytest.raises(RuntimeFailure, match="fixed at export"):
        sessions.session(model, layout="rows")


@needs_library
def test_a_session_refuses_operands_this_cpu_does_not_compute_exactly(monkeypatch):
    graph = cvm_onnx.load(MODELS / "digits_cnn").graph
    model = to_onnx(graph, Target(layout="rows", operands="u8s8"))
    monkeypatch.setattr(cpu, "unbounded", lambda: False)
    with pytest.raises(RuntimeFailure, match=r"uint8 x int8 \(u8s8\).*not compute exactly on this CPU"):
        sessions.session(model)
    sessions.session(to_onnx(graph, Target(layout="rows")))  # uint8 x uint8: exact everywhere


@needs_library
def test_a_fused_model_without_the_native_library_is_refused_with_one_error():
    """A target's fused layout holds conv_requantize alone (no plain requantize): a session without the native
    library refuses it as a serving form (its kernels have no fallback), not as an unknown op."""
    from cvm_onnx.core.builder import GraphBuilder

    b = GraphBuilder()
    x = b.op("relu", b.input("data", (1, 4, 6, 6), 8))
    y = b.op("conv2d", x, b.param("w", np.full((4, 4, 3, 3), -3), 8), channels=4, kernel_size=(3, 3),
             padding=(1, 1), use_bias=False)
    model = to_onnx(b.build(b.op("relu", b.op("cvm_right_shift", y, shift_bit=8, precision=8))), Target(layout="fused"))
    assert [n.op_type for n in model.graph.node if n.domain == native.DOMAIN] == ["conv_requantize"]
    with pytest.raises(RuntimeFailure, match="native im2col and requantize kernels"):
        sessions.session(model, native=False)


def test_convert_target_names_a_target_and_the_old_flags_are_its_aliases(tmp_path):
    """``--target native`` writes this machine's target with the layout measured for the model (one of the
    layouts), its report lists each conv2d's layout (that one, or rows); ``--target cpu`` writes what ``--optimize`` writes and
    ``--target cuda`` what ``--provider cuda`` writes, byte for byte."""
    source, out = str(MODELS / "digits_cnn"), tmp_path / "m.onnx"
    assert main(["convert", source, "-o", str(out), "--target", "native", "--report", str(tmp_path / "r.md")]) == 0
    written = Target.of(onnx.load(out))
    assert written.layout in set(LAYOUTS) - {"session"}
    assert replace(written, layout=Target.native().layout) == Target.native()
    table = (tmp_path / "r.md").read_text().split("## Convolution routes", 1)[1].split("\n## ", 1)[0]
    assert "| layout | kernel | ISA | chain | path |" in table
    layouts = [line.split("|")[4].split()[0] for line in table.splitlines() if line.startswith("| Conv")]
    # each convolution in the written layout, or rows where that layout has no form of its chain (per channel)
    assert layouts and set(layouts) <= {written.layout, "rows"}, layouts
    assert "channel lanes (" in table  # (its convolutions' chains' path: test_chain_paths.KNOWN)
    for alias, name in ((["--optimize"], "cpu"), (["--provider", "cuda"], "cuda")):
        files = []
        for flags in (alias, ["--target", name]):
            assert main(["convert", source, "-o", str(out), *flags]) == 0
            files.append(out.read_bytes())
        assert files[0] == files[1] and Target.of(onnx.load(out)) == Target.default(name)


def two_convolutions():
    """relu > conv2d 3x3 (one group: rows) > shift > relu > conv2d 3x3 of two groups (columns) > shift > relu."""
    from cvm_onnx.core.builder import GraphBuilder

    rng = np.random.default_rng(3)
    b = GraphBuilder()
    x = b.op("relu", b.input("data", (1, 4, 6, 6), 8))
    y = b.op("conv2d", x, b.param("w1", rng.integers(-127, 128, (4, 4, 3, 3)), 8), channels=4, kernel_size=(3, 3),
             padding=(1, 1), use_bias=False)
    y = b.op("relu", b.op("cvm_right_shift", y, shift_bit=8, precision=8))
    y = b.op("conv2d", y, b.param("w2", rng.integers(-127, 128, (4, 2, 3, 3)), 8), channels=4, kernel_size=(3, 3),
             padding=(1, 1), groups=2, use_bias=False)
    return b.build(b.op("relu", b.op("cvm_right_shift", y, shift_bit=8, precision=8)))


@needs_library
@pytest.mark.parametrize("layout, rows", [("rows", "rows (channels-last)"), ("fused", "fused"),
                                          ("columns", "columns")])
def test_the_route_map_says_where_each_convolution_runs(layout, rows):
    """One Route per conv2d: the one-group convolution in the target's layout, the grouped one as columns, each
    kernel a node of the model, and the same map from ``cvm-onnx info``."""
    from cvm_onnx.app.onnx_info import describe
    from cvm_onnx.serving.routes import route_map

    graph = two_convolutions()
    model = to_onnx(graph, Target(layout=layout))
    first, second = route_map(model)
    assert (first.layout, second.layout) == (rows, "columns")
    assert first.kernel.split(" > ")[0] in {n.op_type for n in model.graph.node}
    assert first.chain == "shift > clip" and second.isa == "MLAS u8u8"
    assert first.path.endswith("(shift > clip)") and second.path.endswith("(shift > clip)")  # (chain_paths)
    assert not first.why and not second.why
    info = describe(model)
    assert any(line.strip().startswith(f"{first.conv}: ") and rows in line and f"; path {first.path}" in line
               for line in info)
    floats = route_map(to_onnx(graph, Target(products="float")))
    assert {(r.layout, r.kernel, r.path) for r in floats} == {("float32 products", "Conv", "-")}
    signed = route_map(to_onnx(graph, Target(layout=layout, operands="u8s8-rows0")))  # the rows of x >= 0 alone
    assert signed[0].isa == {"rows": "MLAS u8s8", "fused": first.isa, "columns": "MLAS u8u8"}[layout]
    assert signed[1].isa == "MLAS u8u8"
    assert {(r.layout, r.isa, r.path) for r in route_map(to_onnx(graph, Target("cuda")))} == {
        ("cuda", "cuBLAS int8 x int8", "-")}
