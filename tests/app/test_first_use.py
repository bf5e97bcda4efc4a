"""What a new user meets first (issue 16): `info`/`validate` on .onnx files, `--version`, the native library's
path for plain onnxruntime, what an exported model says about itself, and messages on one line."""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from support import needs_fallback

import cvm_onnx
from cvm_onnx import native
from cvm_onnx.app.cli import main
from cvm_onnx.core.errors import RuntimeFailure
from cvm_onnx.core.graph import Entry
from cvm_onnx.runtime import sessions

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
needs_native = pytest.mark.skipif(native.library_path() is None, reason="the native library was not built")


def run(capsys, *argv) -> tuple[int, list[str], list[str]]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out.splitlines(), err.splitlines()


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("exported")
    for name in ("digits_cnn", "detection"):
        cvm_onnx.convert(MODELS / name, d / f"{name}.onnx")
    cvm_onnx.convert(MODELS / "digits_cnn", d / "served.onnx", optimize=True, batch=16)
    return {p.stem: p for p in d.glob("*.onnx")}


# -- info and validate on .onnx files ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["digits_cnn", "detection"])
def test_info_on_an_exported_model(name, exported, capsys):
    """Opsets, inputs and outputs with their CVM precisions, the provenance and the native ops with the library."""
    code, out, err = run(capsys, "info", exported[name])
    assert code == 0 and err == []
    graph = cvm_onnx.load(MODELS / name).graph
    model = onnx.load(exported[name])
    [data] = [graph.nodes[i].outputs[0] for i in graph.inputs]
    assert f"input  data: int32 {data.shape}, precision {data.precision} (|x| <= {data.bound})" in out
    for h in graph.heads:
        t = graph.type_of(h)
        assert f"output {graph.nodes[h.node].name}: int32 {t.shape}, precision {t.precision} (|x| <= {t.bound})" in out
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    assert any(f"opsets {opsets};" in line for line in out)
    assert any("source symbol kept: converts back byte for byte" in line for line in out)
    used = sorted({n.op_type for n in [*model.graph.node, *(n for f in model.functions for n in f.node)]
                   if n.domain == "cvm.native"})
    if used:
        assert any(line.startswith(f"native ops (cvm.native): {', '.join(used)}:") for line in out)
        assert out[-1] == f"  {native.status()}" and (native.library_path() or "not built") in out[-1]
    else:
        assert any(line.startswith("native ops: none") for line in out)


def test_info_on_a_cvm_model_with_native_ops_reports_the_library(capsys):
    code, out, _ = run(capsys, "info", MODELS / "detection")
    assert code == 0 and out[-1].startswith("native ops: get_valid_counts, non_max_suppression: ")
    assert out[-1].endswith(native.status())
    code, out, _ = run(capsys, "info", MODELS / "digits_cnn")
    assert code == 0 and not any("native" in line for line in out)


def test_info_on_the_serving_form(exported, capsys):
    graph = cvm_onnx.load(MODELS / "digits_cnn").graph
    t = graph.type_of(Entry(graph.inputs[0]))  # the CVM model's input precision, declared by its serving form
    code, out, _ = run(capsys, "info", exported["served"])
    assert code == 0 and f"input  data: int32 (16, 1, 8, 8), precision {t.precision} (|x| <= {t.bound})" in out
    assert any("serving form" in line for line in out)


def test_not_onnx_files_named_onnx_get_a_format_error(tmp_path, capsys):
    """Random bytes and an empty file named .onnx: a format error saying so, never "a symbol file" nor "the graph
    has no outputs", from every command that reads an .onnx file."""
    (tmp_path / "random.onnx").write_bytes(np.random.default_rng(0).bytes(1000))
    (tmp_path / "empty.onnx").write_bytes(b"")
    np.save(tmp_path / "x.npy", np.zeros((1, 4), np.int8))
    for name, why in (("random.onnx", "not an ONNX model: "), ("empty.onnx", "not an ONNX model: an empty file")):
        path = tmp_path / name
        for argv in (["info", path], ["validate", path], ["convert", path, "-o", tmp_path / "out"],
                     ["run", path, "--input", tmp_path / "x.npy", "--output", tmp_path / "o.npz"]):
            code, out, err = run(capsys, *argv)
            assert (code, out) == (2, []) and len(err) == 1, (argv, err)
            assert err[0].startswith(f"format error: {path}: {why}") and "symbol" not in err[0], err


def test_a_symbol_file_without_params_is_told_truthfully(tmp_path, capsys):
    code, _, err = run(capsys, "info", MODELS / "digits_cnn" / "symbol")
    assert code == 2 and err == [f"format error: {MODELS / 'digits_cnn' / 'symbol'}: is not a model directory: give "
                                 "the directory holding symbol and params, or a symbol file with --params"]


def test_validate_on_an_exported_model(exported, capsys):
    graph = cvm_onnx.load(MODELS / "detection").graph
    code, out, err = run(capsys, "validate", exported["detection"])
    ops = sum(not n.is_variable for n in graph.nodes)
    assert code == 0 and out == [f"ok: {exported['detection']}: imports as a CVM model of {ops} op nodes, "
                                 f"{len(graph.params)} params, valid for the CVM runtime",
                                 cvm_onnx.load(MODELS / "detection").gas.line()]  # the same gas as the source's


def test_an_empty_symbol_object_is_summarized_first(tmp_path, capsys):
    (tmp_path / "symbol").write_text("{}")
    (tmp_path / "params").write_bytes((MODELS / "digits_cnn" / "params").read_bytes())
    code, _, err = run(capsys, "info", tmp_path)
    assert code == 2 and len(err) > 2
    assert err[0] == (f"format error: {tmp_path / 'symbol'}: not a CVM symbol: an empty JSON object, without nodes, "
                      "heads or attrs; each rule it breaks follows")
    assert not any("not a CVM symbol" in line for line in err[1:])


# -- --version and the native library ---------------------------------------------------------------------------
def test_version(capsys, monkeypatch):
    code, out, err = run(capsys, "--version")
    assert code == 0 and err == []
    assert out[0] == f"cvm-onnx {importlib.metadata.version('cvm-onnx')}"
    assert f"onnxruntime {ort.__version__}, onnx {onnx.__version__}" in out[1]
    path = native.library_path()
    if path is not None:
        cuda = b"__cudaRegisterFatBinary" in Path(path).read_bytes()  # CUDA kernels are registered with the runtime
        kernels = "CPU and CUDA kernels" if cuda else "CPU kernels, no CUDA kernels"
        assert out[2] == f"native library: {path} ({kernels})"
        assert out[3].endswith(f"native CUDA kernels: {'built' if cuda else 'not built'}")
    if "CUDAExecutionProvider" not in ort.get_available_providers():  # onnxruntime, not onnxruntime-gpu
        assert out[3].startswith(f"CUDA: not usable here: onnxruntime {ort.__version__} has no CUDAExecutionProvider "
                                 "(install onnxruntime-gpu)")
    else:
        assert out[3].startswith(("CUDA: usable here: CUDAExecutionProvider starts", "CUDA: not usable here"))
    monkeypatch.setattr(native, "library_path", lambda: None)
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out[2].startswith("native library: not built (libcvm_onnx_ops.so is missing")


@needs_native
def test_python_m_native_prints_the_library_path():
    done = subprocess.run([sys.executable, "-m", "cvm_onnx.native"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, native.library_path() + "\n", "")


# -- plain onnxruntime: what the exported model says is enough ----------------------------------------------------
def test_exported_model_says_what_it_needs(exported):
    for name in ("digits_cnn", "detection"):
        model = onnx.load(exported[name])
        props = {p.key: p.value for p in model.metadata_props}
        uses_native = bool(native.ops_used(model))
        assert ("libcvm_onnx_ops.so" in model.doc_string) == uses_native == ("cvm.native_library" in props)
        assert "python -m cvm_onnx.native" in model.doc_string or not uses_native
        data = cvm_onnx.load(MODELS / name).graph.nodes[0].outputs[0]
        assert f"values within precision {data.precision} (|x| <= {data.bound})" in model.doc_string
        [inp] = model.graph.input
        assert inp.doc_string.startswith(f"int32, values within precision {data.precision}")


def test_the_readme_names_every_native_op_an_export_may_need(exported):
    """README "Plain onnxruntime" lists the ops of the cvm.native domain, the serving form's among them, as the
    library defines them; the serving form of the digits model calls some of them (so it needs the library)."""
    import re

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Plain onnxruntime"):]
    listed = set(re.findall(r"`([a-z0-9_]+)`", section[:section.index("```")]))
    assert listed == set(native.ATTRS) | set(native.SERVING_KERNELS)
    served = native.ops_used(onnx.load(exported["served"]))
    assert served and set(served) <= listed


@needs_native
def test_plain_onnxruntime_as_the_docs_say(exported):
    """No cvm_onnx at run time: the library path from `python -m cvm_onnx.native`, the input cast to int32."""
    path = subprocess.run([sys.executable, "-m", "cvm_onnx.native"], capture_output=True, text=True,
                          check=True).stdout.strip()
    so = ort.SessionOptions()
    so.register_custom_ops_library(path)
    sess = ort.InferenceSession(str(exported["detection"]), so, providers=["CPUExecutionProvider"])
    x = np.load(MODELS / "detection" / "input.npy").astype(np.int32)
    [y] = sess.run(None, {"data": x})
    assert np.array_equal(y, np.load(MODELS / "detection" / "expected.npy"))


# -- messages -----------------------------------------------------------------------------------------------------
def test_batch_mismatch_in_our_words(exported):
    """run_model feeds one call: one sample to a batch-16 model is told what the model takes (the CLI's `run`
    chunks and pads samples itself)."""
    with pytest.raises(RuntimeFailure) as e:
        sessions.run_model(exported["served"], np.load(MODELS / "digits_cnn" / "input.npy"))
    assert [str(p) for p in e.value.problems] == [
        "data: the model takes a batch of 16 samples, shape (16, 1, 8, 8); got 1: give 16 samples, or convert the "
        "CVM model without --batch"]


def test_onnxruntime_errors_on_one_line(exported):
    """onnxruntime's multi-line messages are joined: no newline, no escaped one."""
    with pytest.raises(RuntimeFailure) as e:
        sessions.run(exported["served"], {"data": np.zeros((1, 1, 8, 8), np.int32)})
    message = str(e.value)
    assert "onnxruntime failed to run the model: " in message and "\n" not in message and "\\n" not in message


@pytest.mark.parametrize("n", ["0", "-3", "x"])
def test_batch_must_be_positive(n, tmp_path, capsys):
    code, out, err = run(capsys, "convert", MODELS / "digits_cnn", "-o", tmp_path / "m.onnx", "--batch", n)
    assert (code, out) == (64, []) and err[-1] == f"cvm-onnx convert: error: argument --batch: must be a positive " \
                                                  f"integer, not '{n}'"


@needs_fallback
def test_missing_native_library_warns_once_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sessions, "library_path", lambda: None)
    code, _, err = run(capsys, "convert", MODELS / "detection", "-o", tmp_path / "m.onnx", "--verify")
    assert code == 0
    assert [line for line in err if "native" in line or "Warning" in line] == [
        "warning: the native custom-op library was not built with this install (see docs/custom_ops.md); the "
        "cvm.native ops run through the slow pure-Python fallback"]


def test_missing_native_library_and_fallback_is_one_error_saying_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sessions, "library_path", lambda: None)
    monkeypatch.setitem(sys.modules, "onnxruntime_extensions", None)  # import onnxruntime_extensions raises ImportError
    code, _, err = run(capsys, "convert", MODELS / "detection", "-o", tmp_path / "m.onnx", "--verify")
    assert code == 4
    assert [line for line in err if not line.startswith("warning:")] == [
        "unsupported: the native custom-op library is not built with this install, and its pure-Python "
        "fallback needs onnxruntime-extensions, the extra fallback (pip install onnxruntime-extensions); or "
        "reinstall with the library (README, Building)"]


def test_view_checks_the_file_format_first(tmp_path):
    """Netron is not started on a file that is not an ONNX model."""
    pytest.importorskip("netron")
    from cvm_onnx.app.view import served
    from cvm_onnx.core.errors import FormatError

    (tmp_path / "random.onnx").write_bytes(np.random.default_rng(1).bytes(500))
    with pytest.raises(FormatError) as e, served(tmp_path / "random.onnx"):
        pass
    assert str(e.value).startswith(f"{tmp_path / 'random.onnx'}: not an ONNX model")
