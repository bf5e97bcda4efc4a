"""The documents stay true: docs/api.md's and the README's Python examples run, the README's step-by-step commands
succeed, and docs/operators.md is what docs/make_operators.py generates from the exporter today."""
from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from cvm_onnx.cli import main

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
    assert "exact: 1 output(s) (dense)" in capsys.readouterr().out
    for name in ("symbol", "params"):
        back, source = in_tmp / "out" / "digits_back" / name, ROOT / "models" / "digits_cnn" / name
        assert back.read_bytes() == source.read_bytes()


def options(p) -> dict[str, list[tuple[str, ...]]]:
    """Each command's options (each as its option strings; not --help, --debug), by command name."""
    [sub] = [a for a in p._actions if a.choices and isinstance(a.choices, dict)]
    return {name: [tuple(a.option_strings) for a in c._actions if a.option_strings and a.dest not in ("help", "debug")]
            for name, c in sub.choices.items()}


@pytest.mark.parametrize("doc, prefix", [("README.md", "cvm-onnx "), ("docs/cli.md", "")])
def test_command_tables_list_every_option(doc, prefix):
    """The command table of the README and of docs/cli.md names every option of every command (in any of its
    spellings: -o or --output)."""
    from cvm_onnx.cli import parser

    text = (ROOT / doc).read_text()
    rows = [r for r in text.splitlines() if r.startswith(f"| `{prefix}")]
    for command, opts in options(parser()).items():
        if command == "check":  # the alias of validate
            continue
        mine = " ".join(r for r in rows if r.startswith(f"| `{prefix}{command} "))
        missing = [o for o in opts if not any(re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", mine) for s in o)]
        assert mine and not missing, (doc, command, missing)
    assert "--version" in text and "--debug" in text


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
