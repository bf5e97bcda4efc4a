"""The documents stay true: docs/api.md's and the README's Python examples run, the README's step-by-step commands
succeed, and docs/operators.md is what docs/make_operators.py generates from the exporter today."""
from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

from cvm_onnx.app.cli import main

ROOT = Path(__file__).parents[1]


def blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", path.read_text(), re.S)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """A working directory where ``models/`` is the repository's, so outputs land in the temporary directory."""
    (tmp_path / "models").symlink_to(ROOT / "models")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("doc", ["docs/api.md", "README.md"])
def test_python_examples_run(doc, in_tmp, capsys):
    code = blocks(ROOT / doc, "python")
    assert code
    if importlib.util.find_spec("netron") is None:
        code = [c for c in code if "served(" not in c]
    for made in re.findall(r"# made by: (cvm-onnx .*)", "\n".join(code)):  # the files an example reads
        (in_tmp / "out").mkdir(exist_ok=True)
        assert main(shlex.split(made)[1:]) == 0, made
    namespace: dict = {}
    exec(compile("\n".join(code), doc, "exec"), namespace)  # one script, in order, as the document reads
    if doc == "docs/api.md":
        assert "MISMATCH on input" in capsys.readouterr().out


def test_readme_step_by_step_commands_succeed(in_tmp, capsys):
    [steps] = [b for b in blocks(ROOT / "README.md", "bash") if b.startswith("mkdir -p out")]
    lines = [shlex.split(line.split("#")[0]) for line in steps.splitlines()]
    commands = [c for c in lines if c[0] == "cvm-onnx"]
    assert [c[1] for c in commands] == ["info", "convert", "info", "run", "run", "verify", "convert", "run", "convert"]
    assert lines[0] == ["mkdir", "-p", "out"]
    (in_tmp / "out").mkdir()
    for command in commands:
        assert main(command[1:]) == 0, command
    assert sorted(p.name for p in in_tmp.iterdir()) == ["models", "out"]  # everything written went to out/
    assert all((in_tmp / "out" / f).exists()
               for f in ["digits.onnx", "report.md", "out.npz", "ref.npz", "served.onnx", "logits.npy", "digits_back"])
    [exact] = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("exact: ")]
    assert exact in capsys.readouterr().out.splitlines()  # the line the README shows, as verify prints it
    for name in ("symbol", "params"):
        back, source = in_tmp / "out" / "digits_back" / name, ROOT / "models" / "digits_cnn" / name
        assert back.read_bytes() == source.read_bytes()


def test_readme_quantize_story_commands_succeed(in_tmp, capsys):
    """The three commands: float ONNX -> `quantize` (the shipped CVM model, byte for byte) -> `run` on CVM with float
    images (float32 logits, the dequantized reference executor's) -> `convert --verify` back to ONNX."""
    import numpy as np

    import cvm_onnx

    [steps] = [b for b in blocks(ROOT / "README.md", "bash") if b.startswith("cvm-onnx quantize models/digits_cnn")]
    commands = [shlex.split(line.split("#")[0]) for line in steps.splitlines()]
    assert [c[:2] for c in commands] == [["cvm-onnx", "quantize"], ["cvm-onnx", "run"], ["cvm-onnx", "convert"]]
    assert commands[0][2] == "models/digits_cnn/float.onnx" and "--verify" in commands[2]
    (in_tmp / "out").mkdir()
    for command in commands:
        assert main(command[1:]) == 0, command
    shipped = ROOT / "models" / "digits_cnn"
    for name in ("symbol", "params", "quantization.json"):
        assert (in_tmp / "out" / "digits_cvm" / name).read_bytes() == (shipped / name).read_bytes(), name
    images = np.load(shipped / "calibration.npy")
    logits = np.load(in_tmp / "out" / "digits_logits.npy")
    model = cvm_onnx.load(shipped)
    [want] = cvm_onnx.run_cvm(model.graph, images[:1], edges=model.edges)
    assert logits.dtype == np.float32 and logits.shape == (len(images), 10) and np.array_equal(logits[:1], want)
    assert "exact: 1 output(s)" in capsys.readouterr().out
    assert sorted(p.name for p in (in_tmp / "out").iterdir()) == ["digits_cvm", "digits_cvm.onnx", "digits_logits.npy"]
    accuracy = json.loads((shipped / "accuracy.json").read_text())
    assert accuracy["cvm_accuracy"] == accuracy["float_accuracy"] == accuracy["ort_quantized_accuracy"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"byte for byte: {accuracy['cvm_accuracy']:.2%} held-out accuracy, as the float model and" in readme


def options(p) -> dict[str, list[tuple[str, ...]]]:
    """Each command's options (each as its option strings; not --help, --debug), by command name."""
    [sub] = [a for a in p._actions if a.choices and isinstance(a.choices, dict)]
    return {name: [tuple(a.option_strings) for a in c._actions if a.option_strings and a.dest not in ("help", "debug")]
            for name, c in sub.choices.items()}


@pytest.mark.parametrize("doc, prefix", [("README.md", "cvm-onnx "), ("docs/cli.md", "")])
def test_command_tables_list_every_option(doc, prefix):
    """The command table of the README and of docs/cli.md names every option of every command (in any of its
    spellings: -o or --output)."""
    from cvm_onnx.app.cli import parser

    text = (ROOT / doc).read_text()
    rows = [r for r in text.splitlines() if r.startswith(f"| `{prefix}")]
    for command, opts in options(parser()).items():
        if command == "check":  # the alias of validate
            continue
        mine = " ".join(r for r in rows if r.startswith(f"| `{prefix}{command} "))
        missing = [o for o in opts if not any(re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", mine) for s in o)]
        assert mine and not missing, (doc, command, missing)
    assert "--version" in text and "--debug" in text


def test_the_native_ops_attribute_tables_are_their_schemas():
    """docs/custom_ops.md's table of the native ops' attributes is what their schemas state
    (``native.attribute_table``), and its first table's defaults are theirs too."""
    from cvm_onnx import native

    lines = (ROOT / "docs" / "custom_ops.md").read_text().splitlines()
    table = native.attribute_table()
    at = lines.index(table[0])
    assert lines[at:at + len(table)] == table and not lines[at + len(table)].startswith("|")
    schemas = native.attributes()
    first = [line.split(" | ") for line in lines[:at] if re.match(r"\| `\w+` \| `", line)]
    assert [row[0][3:-1] for row in first] == ["non_max_suppression", "get_valid_counts", "cvm_lut"]
    for row in first:
        stated = {n: int(v) for n, v in re.findall(r"`(\w+)` \((-?\d+)\)", row[3])}
        assert stated == {n: d for n, (_, d) in schemas[row[0][3:-1]].items()}, row


def test_operators_doc_is_generated_from_the_exporter():
    spec = importlib.util.spec_from_file_location("make_operators", ROOT / "docs" / "make_operators.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    assert (ROOT / "docs" / "operators.md").read_text() == make.render(), \
        "docs/operators.md is stale: run python docs/make_operators.py"


def test_no_machine_paths_in_the_documents():
    """No absolute path of the machine the documents were written on (the checkout's own parent, /tmp, ~)."""
    here = str(ROOT.resolve().parent)
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        assert here not in text and "/tmp/" not in text and "/root/" not in text, doc


WRITES = ("-o", "--output", "--report", "--triton-repo", "--save-onnx")


def test_documented_commands_on_the_shipped_models_write_to_out():
    """A documented command that a checkout can run as written (it reads models/) writes only under out/, which git
    ignores: none leaves detection.onnx or logits.npy in the checkout."""
    docs = [ROOT / "README.md", ROOT / "models" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    outside = []
    for doc in docs:
        for block in blocks(doc, "bash"):
            for line in block.splitlines():
                words = shlex.split(line.split("#")[0])
                if words[:1] != ["cvm-onnx"] or not any(w.startswith("models/") for w in words):
                    continue
                outside += [(str(doc.relative_to(ROOT)), line) for k, w in enumerate(words[:-1])
                            if w in WRITES and not words[k + 1].startswith("out/")]
    assert outside == []
