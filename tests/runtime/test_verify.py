"""verify and the conversion report: the example models and ResNet-20 are exact; a planted one-element difference
(an edited constant in the export, or a lowering patched to add 1 at one position) is found and the right node is
named with the right positions; generated inputs stay within the precision and hit its extremes; the report lists
every op and every stage, and a failing stage still writes it."""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

import cvm_onnx
from cvm_onnx.app import pipeline
from cvm_onnx.app.cli import main
from cvm_onnx.app.pipeline import STAGES, Conversion
from cvm_onnx.app.progress import Bar
from cvm_onnx.app.report import op_forms
from cvm_onnx.converters.to_onnx import LOWERINGS, to_onnx
from cvm_onnx.converters.to_onnx.export import export
from cvm_onnx.converters.to_onnx.lowering import Lowering
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.executor import execute
from cvm_onnx.core.graph import Entry
from cvm_onnx.runtime.verify import generated_cases, verify

MODELS = Path(__file__).parents[2] / "models"
EXAMPLES = ["digits_cnn", "detection", "transforms"]


def graph_of(path: Path):
    return cvm_onnx.load(path).graph


def edited(model, name: str, flat_index: int, delta: int):
    """``model`` with one element of initializer ``name`` changed by ``delta`` (by -delta where that leaves the
    type's range)."""
    for k, init in enumerate(model.graph.initializer):
        if init.name == name:
            w = numpy_helper.to_array(init).copy()
            v = int(w.flat[flat_index])
            w.flat[flat_index] = v + delta if v + delta <= np.iinfo(w.dtype).max else v - delta
            model.graph.initializer[k].CopyFrom(numpy_helper.from_array(w, name))
            return model
    raise KeyError(name)


def symbol_node(path: Path, name: str) -> tuple[dict[str, str], list[str]]:
    """Node ``name``'s attributes and input names, read straight from the symbol file's JSON."""
    symbol = json.loads((path / "symbol").read_text())
    nodes = symbol["nodes"]
    k = next(i for i, n in enumerate(nodes) if n["name"] == name)
    return json.loads(symbol["attrs"]["op_attrs"][1][k]), [nodes[i]["name"] for i, _, _ in nodes[k]["inputs"]]


# -- exact models ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("inline", [False, True])
def test_example_models_are_exact(name, inline):
    verdict = verify(MODELS / name, inline=inline)
    assert verdict.exact, str(verdict)
    graph = graph_of(MODELS / name)
    bound = graph.type_of(Entry(graph.inputs[0])).bound  # the input precision's extremes
    assert verdict.cases == ["zeros", f"+{bound}", f"-{bound}", "seed 0", "seed 1", "seed 2"]
    assert str(verdict).startswith("exact:")


def test_resnet20_is_exact(resnet_dir, resnet):
    verdict = verify(resnet, seeds=1)
    assert verdict.exact, str(verdict)
    given_input = verify(resnet, np.load(resnet_dir / "input.npy"))
    assert given_input.exact and given_input.cases == ["given"]


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 32), shape=st.lists(st.integers(1, 40), min_size=1, max_size=3), seeds=st.integers(0, 3))
def test_generated_inputs_stay_within_the_precision_and_hit_its_extremes(p, shape, seeds):
    b = GraphBuilder()
    graph = b.build(b.op("relu", b.input("data", tuple(shape), p)))
    bound = (1 << (p - 1)) - 1
    cases = generated_cases(graph, seeds)
    assert len(cases) == 3 + seeds
    for case, fill in zip(cases, [0, bound, -bound]):
        assert np.array_equal(case.inputs["data"], np.full(shape, fill))
    for case in cases:
        x = case.inputs["data"]
        assert x.dtype == np.int32 and x.shape == tuple(shape) and np.abs(x.astype(np.int64)).max() <= bound
    random = np.concatenate([c.inputs["data"].ravel() for c in cases[3:]] + [np.zeros(0, np.int32)])
    if random.size >= 2000:  # one element in ten is an extreme or 0: all three show up
        assert {-bound, 0, bound} <= set(random.tolist())


# -- planted differences --------------------------------------------------------------------------------------------
def test_an_edited_weight_names_its_conv():
    """One element of the second conv's int8 weight moved by 100 towards the other sign (a change the requantization
    after it cannot round away): that conv is named, with its attributes and inputs as the symbol file gives them."""
    graph = graph_of(MODELS / "digits_cnn")
    conv = [n for n in graph.nodes if n.op == "conv2d"][1]
    weight = graph.nodes[conv.inputs[1].node].name
    delta = -100 if graph.params[weight].flat[5] > 0 else 100
    verdict = verify(graph, onnx_model=edited(to_onnx(graph), weight, 5, delta))
    assert not verdict.exact and verdict.failed_case is not None
    d = verdict.divergence
    assert (d.node, d.op) == (conv.name, "conv2d")
    attrs, inputs = symbol_node(MODELS / "digits_cnn", conv.name)
    assert d.attrs == attrs and d.inputs == inputs and inputs[1] == weight
    assert f"first differing node (topological order): {conv.name} (conv2d)" in str(verdict)


@pytest.mark.parametrize("inline", [False, True])
def test_a_lowering_changing_one_element_is_located(monkeypatch, inline):
    """flatten (one node, on the way to the dense layer) gets +100 at flat position 37: exactly that element
    differs (+1 there rounds away in the requantization after the dense layer on every generated case)."""
    graph = graph_of(MODELS / "digits_cnn")
    [flatten] = [i for i, n in enumerate(graph.nodes) if n.op == "flatten"]
    _, sources = symbol_node(MODELS / "digits_cnn", graph.nodes[flatten].name)
    original = LOWERINGS["flatten"]

    def planted(b, a, *inputs):
        out = original.fn(b, a, *inputs)
        delta = np.zeros(b.outputs[0].shape, np.int32)
        delta.flat[37] = 100
        return b.Add(out, b.const(delta, np.int32))

    monkeypatch.setitem(LOWERINGS, "flatten", Lowering("flatten", planted))
    verdict = verify(graph, inline=inline)
    assert not verdict.exact
    d = verdict.divergence
    assert (d.node, d.op, d.inputs) == (graph.nodes[flatten].name, "flatten", sources)
    [diff] = d.differences
    case = next(c for c in generated_cases(graph) if c.name == verdict.failed_case)
    want = execute(graph, case.inputs, keep_all=True)[Entry(flatten)]
    index = np.unravel_index(37, want.shape)
    assert diff.count == 1 and diff.positions == [(index, int(want[index]), int(want[index]) + 100)]


def test_an_edited_weight_in_resnet20_names_its_conv(resnet):
    graph = resnet
    convs = [n for n in graph.nodes if n.op == "conv2d" and n.attrs["kernel_size"] == (3, 3)]
    target = convs[len(convs) // 2]
    weight = graph.nodes[target.inputs[1].node].name
    verdict = verify(graph, seeds=1, onnx_model=edited(to_onnx(graph), weight, 0, 100))
    assert not verdict.exact
    assert (verdict.divergence.node, verdict.divergence.op) == (target.name, "conv2d")


def test_cli_verify_exit_codes(monkeypatch, capsys):
    assert main(["verify", str(MODELS / "transforms"), "--seeds", "1"]) == 0
    assert capsys.readouterr().out.startswith("exact: ")
    original = LOWERINGS["take"]

    def planted(b, a, *inputs):
        return b.Add(original.fn(b, a, *inputs), b.const(np.ones(b.outputs[0].shape, np.int32), np.int32))

    monkeypatch.setitem(LOWERINGS, "take", Lowering("take", planted))
    first_take = next(n for n in graph_of(MODELS / "transforms").nodes if n.op == "take")
    assert main(["verify", str(MODELS / "transforms"), "--input", str(MODELS / "transforms" / "input.npy")]) == 5
    out = capsys.readouterr().out
    assert out.startswith("MISMATCH on input 'sample 0'")
    assert f"first differing node (topological order): {first_take.name} (take)" in out
    assert main(["verify", "missing.onnx"]) == 2  # an .onnx file is read (test_cli: verify on an export)
    assert capsys.readouterr().err == "format error: missing.onnx: no such file\n"


# -- the conversion report ------------------------------------------------------------------------------------------
def symbol_ops(path: Path) -> set[str]:
    """The ops named in a symbol file, read straight from its JSON: an op node is ``cvm_op`` with ``func_name``, whose
    trailing ``_<digits>`` the runtime drops."""
    nodes = json.loads((path / "symbol").read_text())["nodes"]
    return {re.sub(r"_\d*$", "", n["attrs"]["func_name"]) for n in nodes if n["op"] != "null"}


@pytest.mark.parametrize("model_dir", ["digits_cnn", "detection", "resnet20"], indirect=True)
def test_report_lists_every_op_and_every_stage(model_dir, tmp_path, capsys):
    out, md = tmp_path / "m.onnx", tmp_path / "report.md"
    assert main(["convert", str(model_dir), "-o", str(out), "--report", str(md), "--verify"]) == 0
    assert out.is_file()
    text = md.read_text()
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert symbol_ops(model_dir) <= rows.keys()
    ran = ["read", "validate", "export", "check", "compare", "write"]
    for stage in ran:
        assert f"| {stage} | passed |" in text
    assert "| batch | skipped |" in text
    for op in symbol_ops(model_dir):
        assert ("function cvm::" + op in rows[op]) or ("native custom op cvm.native::" in rows[op])
    summary = capsys.readouterr().out
    assert "stages passed: " + ", ".join(ran) in summary and f"report: {md}" in summary


@pytest.mark.parametrize("model_dir", ["digits_cnn", "resnet20"], indirect=True)
def test_report_of_the_optimized_batched_form(model_dir, tmp_path, capsys):
    """--optimize --batch with --report --verify: every stage passes on the batched graph, and the op table shows
    the fused runs."""
    out, md = tmp_path / "m.onnx", tmp_path / "report.md"
    assert main(["convert", str(model_dir), "-o", str(out), "--report", str(md), "--verify", "--optimize",
                 "--batch", "4"]) == 0
    text = md.read_text()
    for stage in STAGES:
        assert f"| {stage.name} | passed |" in text
    assert "optimized flat form, batch 4" in text and "fused run (optimized form)" in text
    from cvm_onnx.serving.flat import SERVING

    assert "passes: " + ", ".join(p.name for p in SERVING) in text  # the serving passes, listed in order
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "fused run" in rows["cvm_right_shift"]
    assert "stages passed" in capsys.readouterr().out


def test_report_primitives_match_the_flat_form(resnet):
    """The op table's primitive ops for the function form are the op types the flat form emits for that op."""
    graph = resnet
    flat = to_onnx(graph, inline=True)
    emitted: dict[str, set[str]] = {}
    for n in flat.graph.node:
        marks = {p.key: p.value for p in n.metadata_props}
        if "cvm.op" in marks and n.op_type != "Constant":
            emitted.setdefault(marks["cvm.op"], set()).add(n.op_type)
    assert {o.op: set(o.primitives) for o in op_forms(graph, to_onnx(graph))} == emitted


def test_a_failing_stage_is_reported_and_nothing_is_written(tmp_path, capsys):
    src = tmp_path / "bad"
    shutil.copytree(MODELS / "digits_cnn", src)
    symbol = json.loads((src / "symbol").read_text())
    k = next(i for i, n in enumerate(symbol["nodes"]) if n.get("attrs", {}).get("func_name") == "cvm_right_shift")
    shift = symbol["nodes"][k]["name"]
    symbol["attrs"]["op_attrs"][1][k] = json.dumps({"precision": "8", "shift_bit": "0"})  # shift_bit in 1..32
    (src / "symbol").write_text(json.dumps(symbol))
    out, md = tmp_path / "m.onnx", tmp_path / "report.md"
    assert main(["convert", str(src), "-o", str(out), "--report", str(md)]) == 3
    assert not out.exists()
    text = md.read_text()
    assert "| read | passed |" in text and "| validate | failed |" in text and shift in text
    assert "| export |" not in text
    assert "stage failed: validate" in capsys.readouterr().out


@pytest.mark.parametrize("batch", [None, 2])
def test_one_pipeline_plain_and_timed(tmp_path, monkeypatch, batch):
    """api.convert and the timed run (convert --report --verify) run the same stages: identical files, one export
    (the comparison checks the exported model, it does not export again)."""
    exports = []
    monkeypatch.setattr(pipeline, "export", lambda *a, **k: exports.append(1) or export(*a, **k))
    monkeypatch.setattr(sys.modules["cvm_onnx.runtime.verify"], "to_onnx", None)  # the comparison must not export
    cvm_onnx.convert(MODELS / "digits_cnn", tmp_path / "plain.onnx", batch=batch, optimize=True)
    timed = pipeline.run(Conversion(MODELS / "digits_cnn", tmp_path / "timed.onnx", batch=batch, optimize=True,
                                    check=True, seeds=1), timed=True)
    assert timed.error is None and timed.verdict.exact and exports == [1, 1]
    assert (tmp_path / "plain.onnx").read_bytes() == (tmp_path / "timed.onnx").read_bytes()
    assert [(s.name, s.status) for s in timed.stages] == [
        (s.name, "skipped" if s.name == "batch" and batch is None else "passed") for s in STAGES]


def test_progress_bar_is_silent_off_a_terminal(capsys):
    with Bar(delay=0) as bar:
        for k in range(3):
            bar(k, 3, f"step {k}")
    assert capsys.readouterr() == ("", "")
