"""The command line: one line per problem on stderr, a distinct exit code per error family, no traceback unless
--debug (docs/cli.md). Commands run through ``cli.main`` in-process, and as ``python -m cvm_onnx.app.cli`` where the
process' own exit status or stdout matters."""
from __future__ import annotations

import contextlib
import io
import re
import select
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from cvm_onnx.app import api, cli
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import FormatError, RuntimeFailure, UnsupportedError, ValidationError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format import write_model, write_params, write_symbol
from cvm_onnx.core.format.onnx_file import onnx_model

ROOT = Path(__file__).parents[2]
CODES = {"format error": 2, "invalid model": 3, "unsupported": 4, "runtime error": 5}


def small_graph(out: str = "out"):
    b = GraphBuilder()
    w = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    y = b.op("dense", b.input("data", (1, 4), 8), b.param("w", w), units=3, use_bias=False)
    return b.build(b.op("cvm_right_shift", y, name=out, shift_bit=2, precision=8))


@pytest.fixture
def model(tmp_path) -> Path:
    write_model(small_graph(), tmp_path / "model")
    return tmp_path / "model"


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def failed(capsys, code: int, *argv) -> list[str]:
    """Run, expect exit ``code`` and an empty stdout; return the stderr lines (never a traceback)."""
    got, out, err = run(capsys, *argv)
    assert (got, out) == (code, ""), err
    assert "Traceback" not in err
    return err.splitlines()


def test_family_codes_are_distinct_and_documented():
    families = {FormatError: 2, ValidationError: 3, UnsupportedError: 4, RuntimeFailure: 5}
    assert {cls.exit_code for cls in families} == set(families.values())
    assert {cls.kind: cls.exit_code for cls in families} == CODES
    others = [cli.USAGE_ERROR, cli.INTERNAL_ERROR, cli.INTERRUPTED, cli.BROKEN_PIPE]
    assert others == [64, 70, 130, 141] and len({0, *families.values(), *others}) == 9
    documented = re.findall(r"^\| (\d+) \|", (ROOT / "docs" / "cli.md").read_text(), re.M)
    assert sorted(map(int, documented)) == sorted([0, *families.values(), *others])


def test_commands_succeed(model, tmp_path, capsys):
    # gas: memory 5 x (4 data + 12 w + 3 dense + 3 shift) = 110; ops 3 x (4 x 3) dense + 3 shift = 39
    gas = "gas 149 = ops 39 + memory 110 (the runtime's GetOps)"
    code, out, err = run(capsys, "validate", model)
    assert (code, err) == (0, "") and out == f"ok: {model}: 2 op nodes, 1 params, valid for the CVM runtime\n{gas}\n"
    code, out, _ = run(capsys, "info", model)
    assert code == 0 and "input  data: shape (1, 4), precision 8" in out and "output out: shape (1, 3)" in out
    assert run(capsys, "convert", model, "-o", tmp_path / "m.onnx")[:2] == (
        0, f"wrote {tmp_path / 'm.onnx'}\nthe CVM model's {gas}\n")
    onnx.checker.check_model(onnx.load(tmp_path / "m.onnx"))
    x = np.array([[127, -127, 3, 0]], np.int8)
    np.save(tmp_path / "x.npy", x)
    want = execute(api.load(model).graph, {"data": x})[0]
    for source, npz in ((model, "cvm.npz"), (tmp_path / "m.onnx", "onnx.npz")):
        assert run(capsys, "run", source, "--input", tmp_path / "x.npy", "--output", tmp_path / npz)[0] == 0
        with np.load(tmp_path / npz) as got:
            assert list(got) == ["out"] and np.array_equal(got["out"], want)
    assert run(capsys, "convert", tmp_path / "m.onnx", "-o", tmp_path / "back")[0] == 0
    assert (tmp_path / "back" / "params").read_bytes() == (model / "params").read_bytes()


def test_format_errors_exit_2(model, tmp_path, capsys):
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 4), np.int8))
    header = x.read_bytes()[:128].replace(b"(1, 4)", b"(10**13,)".replace(b"10**13", b"10000000000000"))
    (tmp_path / "huge.npy").write_bytes(header[:128].ljust(128))  # claims 10^13 values, holds none
    np.savez(tmp_path / "z.npz", x=np.zeros((1, 4), np.int8))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "symbol").write_bytes((model / "symbol").read_bytes())
    (tmp_path / "broken" / "params").write_bytes((model / "params").read_bytes()[:-1])
    cases = [
        (["validate", tmp_path / "missing"], "no such model directory or file"),
        (["info", tmp_path / "broken"], "array data needs 12 bytes, only 11 left"),
        (["convert", model, "-o", tmp_path / "no" / "m.onnx"], "cannot write the model"),
        (["run", model, "--input", tmp_path / "huge.npy", "--output", tmp_path / "o.npz"], "cannot read the input"),
        (["run", model, "--input", tmp_path / "z.npz", "--output", tmp_path / "o.npz"], "an .npz archive"),
        (["run", model, "--input", x, "--output", tmp_path / "no" / "o.npz"], "cannot write the outputs"),
        (["convert", x, "-o", tmp_path / "out"], "or a symbol file with --params"),
    ]
    for argv, fragment in cases:
        [line] = failed(capsys, 2, *argv)
        assert line.startswith("format error: ") and fragment in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "huge.npy", "model", "x.npy", "z.npz"]


@pytest.mark.parametrize("content, why", [
    (b"", "an empty file"), (b"hello\n", "not a .npy file (it does not start with numpy's magic string)"),
    (bytes(range(256)), "not a .npy file (it does not start with numpy's magic string)"),
    (None, "it holds Python objects (dtype object), not numbers")])
def test_garbage_npy_is_named_not_a_pickle(content, why, model, tmp_path, capsys):
    """A file that is no .npy array gets our reason, not numpy's advice to unpickle it (nor an EOFError), from
    every command that reads one."""
    bad = tmp_path / "bad.npy"
    if content is None:
        np.save(bad, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    else:
        bad.write_bytes(content)
    for argv, what in ((["run", model, "--input", bad, "--output", tmp_path / "o.npz"], "the input array"),
                       (["verify", model, "--input", bad], "the input array"),
                       (["quantize", ROOT / "models" / "digits_cnn" / "float.onnx", "--calibration", bad, "-o",
                         tmp_path / "q"], "the calibration samples")):
        assert failed(capsys, 2, *argv) == [f"format error: {bad}: cannot read {what}: {why}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npy", "model"]


def test_verify_takes_an_export_and_checks_that_file(model, tmp_path, capsys):
    """`verify m.onnx` (as its --help says) compares the file itself with the reference executor on the CVM graph
    it holds: an export and its batch form are exact, one whose rounding was edited is not; the serving form and
    a model convert did not write are refused saying what to verify instead."""
    for name, options in (("m.onnx", []), ("b.onnx", ["--batch", "3"]), ("s.onnx", ["--optimize"])):
        assert run(capsys, "convert", model, "-o", tmp_path / name, *options)[0] == 0
    for name in ("m.onnx", "b.onnx"):
        code, out, err = run(capsys, "verify", tmp_path / name)
        assert (code, err) == (0, "") and out.startswith("exact: 1 output(s) (out) equal element for element"), out
    edited = onnx.load(tmp_path / "m.onnx")
    for function in edited.functions:
        for node in function.node:
            node.op_type = "Floor" if node.op_type == "Round" else node.op_type
    onnx.save(edited, tmp_path / "edited.onnx")
    code, out, _ = run(capsys, "verify", tmp_path / "edited.onnx", "--seeds", "8")
    assert code == 5 and out.startswith("MISMATCH on input") and \
        "first differing node (topological order): out (cvm_right_shift)" in out, out
    [line] = failed(capsys, 4, "verify", tmp_path / "s.onnx")
    assert line == f"unsupported: {tmp_path / 's.onnx'}: the serving form (--optimize) keeps no CVM graph to verify " \
                   f"it against: verify it as it is written, cvm-onnx convert MODEL_DIR --optimize --verify"
    plain = onnx_model(helper.make_graph(
        [helper.make_node("Neg", ["data"], ["y"])], "g", [helper.make_tensor_value_info("data", TensorProto.INT32, [2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [2])]), 13)
    onnx.save(plain, tmp_path / "plain.onnx")
    [line] = failed(capsys, 4, "verify", tmp_path / "plain.onnx")
    assert line.startswith(f"unsupported: {tmp_path / 'plain.onnx'}: not an export of a CVM model") and \
        "verify DIR" in line


def test_info_shows_the_float_edges_of_a_cvm_model_as_of_its_export(model, tmp_path, capsys):
    """`info` on a quantized import's directory names quantization.json and how its input and outputs become floats,
    in the same lines as `info` on its export (metadata cvm.quantization)."""
    from cvm_onnx.core.format import Edge, Edges

    edges = Edges(Edge("data", "uint8", np.array(0.25, np.float32), np.array(3)),
                  (Edge("out", "int8", np.array([[0.5, 0.125, 3.0]], np.float32), np.zeros((1, 3), np.int64)),))
    (model / "quantization.json").write_bytes(edges.to_bytes())
    code, out, _ = run(capsys, "info", model)
    assert code == 0
    details = ["  input  data: float, quantized to uint8 (scale 0.25, zero point 3)",
               "  output out: int8 dequantized to float32 (per channel: 3 scales and zero points)"]
    lines = out.splitlines()
    at = lines.index("float edges (quantization.json): `cvm-onnx run` takes float input and gives float32 outputs; "
                     "its export on onnxruntime alone takes and gives the integers")
    assert lines[at + 1:at + 3] == details
    assert run(capsys, "convert", model, "-o", tmp_path / "m.onnx")[0] == 0
    code, out, _ = run(capsys, "info", tmp_path / "m.onnx")
    lines = out.splitlines()
    at = lines.index("float edges (metadata cvm.quantization): `cvm-onnx run` takes float input and gives float32 "
                     "outputs; onnxruntime alone takes and gives the integers")
    assert code == 0 and lines[at + 1:at + 3] == details


def test_validation_errors_exit_3(tmp_path, capsys):
    graph = small_graph()
    graph.params["w"] = np.full((3, 4), 300, np.int32)  # beyond its precision (4 bits hold 7)
    (tmp_path / "symbol").write_text(write_symbol(graph))
    (tmp_path / "params").write_bytes(write_params(graph.params))
    for command in (["validate"], ["info"], ["convert", "-o", tmp_path / "m.onnx"]):
        assert failed(capsys, 3, *command[:1], tmp_path, *command[1:]) == [
            "invalid model: w: param value 300 exceeds precision 4 (|x| <= 7)"]
    assert not (tmp_path / "m.onnx").exists()


def test_unsupported_exits_4(tmp_path, capsys):
    nodes = [helper.make_node("Tan", ["data"], ["y"], name="tan"), helper.make_node("Acosh", ["y"], ["z"], name="acosh")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("data", TensorProto.INT32, [1, 4])],
                              [helper.make_tensor_value_info("z", TensorProto.INT32, [1, 4])])
    onnx.save(onnx_model(graph), tmp_path / "m.onnx")
    lines = failed(capsys, 4, "convert", tmp_path / "m.onnx", "-o", tmp_path / "out")
    assert lines == ["unsupported: tan (Tan): no CVM op for ONNX Tan", "unsupported: acosh (Acosh): no CVM op for ONNX "
                     "Acosh"]
    assert not (tmp_path / "out").exists()


def test_an_input_precision_of_0_is_refused_as_any_outside_1_to_32(tmp_path, capsys):
    """The CLI read --input-precision 0 as not given (8); -1 and 33 were refused. Now 0 is refused too. (verify
    --seeds -1 drew no random input, 2^62 drew them until memory ran out: usage errors now, above.)"""
    graph = helper.make_graph([helper.make_node("Relu", ["data"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("data", TensorProto.INT32, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 4])])
    onnx.save(onnx_model(graph), tmp_path / "m.onnx")
    lines = failed(capsys, 4, "convert", tmp_path / "m.onnx", "-o", tmp_path / "out", "--input-precision", "0")
    assert lines == ["unsupported: data: input precision 0 must lie in [1, 32]"]
    assert not (tmp_path / "out").exists()


def test_runtime_errors_exit_5(model, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((2, 5), np.int8))
    assert failed(capsys, 5, "run", model, "--input", tmp_path / "x.npy", "--output", tmp_path / "o.npz") == [
        f"runtime error: {tmp_path / 'x.npy'}: shape (2, 5) is not the model input's (1, 4), nor samples (N, 4) or "
        f"(N, 1, 4)"]
    np.save(tmp_path / "x.npy", np.zeros((1, 4), np.float32))
    [line] = failed(capsys, 5, "run", model, "--input", tmp_path / "x.npy", "--output", tmp_path / "o.npz")
    assert line == "runtime error: data: input dtype float32 must be an integer type"
    assert not (tmp_path / "o.npz").exists()


def test_a_float_io_export_refuses_integer_input(tmp_path, capsys):
    """The shipped int8 input fed to the export with float input (convert --float-io) is not taken as pixel
    values: exit 5 saying so; its float samples run."""
    digits = ROOT / "models" / "digits_cnn"
    assert cli.main(["convert", str(digits), "-o", str(tmp_path / "f.onnx"), "--float-io"]) == 0
    capsys.readouterr()
    [line] = failed(capsys, 5, "run", tmp_path / "f.onnx", "--input", digits / "input.npy", "--output",
                    tmp_path / "y.npy")
    assert "got int8 data, which would be taken as float values: give float data" in line
    assert not (tmp_path / "y.npy").exists()
    np.save(tmp_path / "x.npy", np.load(digits / "calibration.npy")[:3])
    code, _, _ = run(capsys, "run", tmp_path / "f.onnx", "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy")
    assert code == 0
    assert np.load(tmp_path / "y.npy").shape == (3, 10)


def test_convert_for_cuda_says_where_every_node_runs(tmp_path, capsys):
    """convert --provider cuda --verify (not only --report) says whether every node has a CUDA kernel: every one
    where the native library has its CUDA kernels (built with nvcc), else it names those without."""
    from cvm_onnx import native

    code, out, _ = run(capsys, "convert", ROOT / "models" / "digits_cnn", "-o", tmp_path / "c.onnx", "--provider",
                       "cuda", "--verify")
    lines = [line for line in out.splitlines() if line.startswith("  CUDA provider: ")]
    assert code == 0 and len(lines) == 1
    assert (lines[0] == "  CUDA provider: every node a CUDA kernel") == bool(native.cuda_ops(native.library_path()))


def test_verify_takes_the_samples_run_takes(model, tmp_path, capsys):
    """verify --input compares every sample of what run --input takes: a stack on a new axis, samples along the
    model's first axis, a directory of .npy files."""
    x = np.arange(-10, 10, dtype=np.int8).reshape(5, 4)
    np.save(tmp_path / "along.npy", x)
    np.save(tmp_path / "stacked.npy", x[:, None])
    (tmp_path / "dir").mkdir()
    np.save(tmp_path / "dir" / "a.npy", x[:2])
    np.save(tmp_path / "dir" / "b.npy", x[2:])
    for source in ("along.npy", "stacked.npy", "dir"):
        code, out, err = run(capsys, "verify", model, "--input", tmp_path / source)
        assert (code, err) == (0, "")
        assert out.endswith("for 5 input(s): sample 0, sample 1, sample 2, sample 3, sample 4\n"), out


def test_verify_names_float_io_for_float_samples(tmp_path, capsys):
    """Float samples for the integer export are refused naming --float-io (the model has quantization.json); with
    --float-io they are compared; --float-io where there are no float edges is refused, not ignored."""
    digits = ROOT / "models" / "digits_cnn"
    np.save(tmp_path / "x.npy", np.load(digits / "calibration.npy")[:4])
    [line] = failed(capsys, 5, "verify", digits, "--input", tmp_path / "x.npy")
    assert line.startswith("runtime error: data: float32 samples, but the export compared takes integers") and \
        "verify MODEL --float-io" in line
    code, out, _ = run(capsys, "verify", digits, "--input", tmp_path / "x.npy", "--float-io")
    assert code == 0 and out.endswith("for 4 input(s): sample 0, sample 1, sample 2, sample 3\n")
    [line] = failed(capsys, 5, "verify", digits, "--input", digits / "input.npy", "--float-io")
    assert "int8 samples, but the export with float input and outputs takes floats" in line
    [line] = failed(capsys, 4, "verify", ROOT / "models" / "detection", "--float-io")
    assert "--float-io: float input and outputs need a quantized model" in line


INTEGER_DTYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


@settings(max_examples=8, deadline=None)
@given(st.sampled_from(INTEGER_DTYPES), st.lists(st.integers(-127, 127), min_size=4, max_size=4), st.integers(1, 200))
def test_run_takes_any_integer_dtype_whose_values_fit_the_precision(dtype, values, past):
    """uint8 images and other integer types run on the reference executor and on the export when every value fits
    the 8-bit input (equal to the int32 run); values beyond |x| <= 127 are refused, but int8/int32 are clamped as
    the runtime does."""
    info = np.iinfo(dtype)
    x = np.clip(np.array([values]), info.min, info.max).astype(dtype)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_model(small_graph(), tmp / "m")
        assert run_quiet("convert", tmp / "m", "-o", tmp / "m.onnx") == 0
        np.save(tmp / "x.npy", x)
        want = execute(small_graph(), {"data": x.astype(np.int32)})[0]
        for source in (tmp / "m", tmp / "m.onnx"):
            assert run_quiet("run", source, "--input", tmp / "x.npy", "--output", tmp / "o.npz") == 0
            with np.load(tmp / "o.npz") as got:
                assert np.array_equal(next(iter(got.values())), want)
        wide = x.copy()
        wide[0, 0] = min(127 + past, info.max) if info.max > 127 else max(-127 - past, info.min)
        np.save(tmp / "x.npy", wide)
        for source in (tmp / "m", tmp / "m.onnx"):
            code = run_quiet("run", source, "--input", tmp / "x.npy", "--output", tmp / "o.npz")
            assert code == (0 if dtype in (np.int8, np.int32) else 5)


def run_quiet(*argv) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        code = cli.main([str(a) for a in argv])
    if code == 5:
        assert "do not fit the model's input precision 8 (|x| <= 127)" in err.getvalue()
    return code


@pytest.mark.parametrize("argv", [[], ["bogus"], ["validate"], ["convert", "m"], ["run", "m", "--input", "x.npy"],
                                  ["convert", "m", "-o", "o.onnx", "--input-precision", "eight"],
                                  ["validate", "m", "--unknown"], ["run", "m", "--input", "x", "--output", "y",
                                                                   "--provider", "tpu"],
                                  *[["run", "m", "--input", "x", "--output", "y", option, "0"]
                                    for option in ("--chunk", "--workers", "--actors")],
                                  *[["verify", "m", "--seeds", n] for n in ("-1", str(1 << 62), "three")]])
def test_usage_errors_exit_64(argv, capsys):
    lines = failed(capsys, 64, *argv)
    assert lines[0].startswith("usage: cvm-onnx") and lines[-1].startswith("cvm-onnx")
    assert "error: " in lines[-1]


@pytest.mark.parametrize("argv, why", [
    (["run", "M", "--input", "X", "--output", "O", "--provider", "cuda"], "--provider chooses onnxruntime's provider"),
    (["run", "M", "--input", "X", "--output", "O", "--actors", "2"], "--actors applies with --ray only"),
    (["run", "M.onnx", "--input", "X", "--output", "O", "--cuda-graph"], "--cuda-graph applies with --provider cuda"),
    (["run", "--ray", "M", "--input", "X", "--output", "O", "--workers", "2"], "with --ray, use --actors"),
    (["run", "M.onnx", "--params", "M/params", "--input", "X", "--output", "O"], "MODEL is an .onnx file"),
    (["convert", "M", "-o", "O.onnx", "--triton-server-repo", "/srv"], "applies with --triton-repo only"),
    (["convert", "M.onnx", "-o", "D", "--batch", "4"], "--batch applies to a CVM model"),
    (["convert", "M.onnx", "-o", "D", "--verify"], "--verify applies to a CVM model"),
    (["convert", "M.onnx", "-o", "D", "--provider", "cuda"], "--provider applies to a CVM model"),
    (["convert", "M.onnx", "-o", "D", "--float-io"], "--float-io applies to a CVM model"),
    (["convert", "M.onnx", "--triton-repo", "R"], "--triton-repo applies to a CVM model"),
    (["convert", "M", "-o", "O.onnx", "--two-part"], "--two-part applies to an .onnx SOURCE"),
    (["convert", "M", "-o", "O.onnx", "--one-part"], "--one-part applies to an .onnx SOURCE"),
    (["convert", "M.onnx", "-o", "D", "--one-part", "--two-part"], "--two-part: not allowed with argument --one-part"),
    (["convert", "M", "-o", "O.onnx", "--outputs", "y"], "--outputs applies to an .onnx SOURCE"),
    (["convert", "M", "-o", "O.onnx", "--input-precision", "9"], "--input-precision applies to an .onnx SOURCE"),
    (["convert", "M.onnx", "-o", "D", "--samples", "X"], "--samples applies to an .onnx SOURCE with --report"),
    (["convert", "M", "-o", "O.onnx", "--report", "R", "--samples", "X"], "--samples applies to an .onnx SOURCE"),
    (["convert", "M.onnx", "-o", "D", "--report", "R", "--float-model", "M.onnx"], "--float-model applies with "
     "--samples only"),
    (["verify", "M", "--input", "X", "--seeds", "5"], "--seeds sets the random inputs, drawn without --input"),
    (["info", "M.onnx", "--params", "M/params"], "MODEL is an .onnx file"),
    (["view", "M", "--port", "99999"], "must be a port number in [0, 65535]"),
])
def test_options_that_do_not_apply_exit_64(argv, why, model, tmp_path, capsys):
    """An option given where it does not apply is refused as a usage error, before anything runs, naming it."""
    assert cli.main(["convert", str(model), "-o", str(tmp_path / "M.onnx")]) == 0
    np.save(tmp_path / "X.npy", np.zeros((1, 4), np.int8))
    names = {"M": model, "M.onnx": tmp_path / "M.onnx", "M/params": model / "params", "X": tmp_path / "X.npy"}
    capsys.readouterr()
    lines = failed(capsys, 64, *[names.get(a, tmp_path / a if a in ("O", "O.onnx", "D", "R") else a) for a in argv])
    assert lines[0].startswith("usage: cvm-onnx") and why in lines[-1], lines
    assert not any((tmp_path / a).exists() for a in ("O", "O.onnx", "D", "R"))


@pytest.mark.parametrize("argv", [
    ["run", "m", "--input", "x", "--output", "o", "--provider", "cuda", "--ray"],  # the actors' CUDA serving form
    ["run", "m.onnx", "--input", "x", "--output", "o", "--provider", "cuda", "--cuda-graph"],
    ["run", "m", "--input", "x", "--output", "o", "--ray=auto", "--actors", "2"],
    ["run", "m", "--params", "p", "--input", "x", "--output", "o", "--workers", "2"],
    ["convert", "m", "--triton-repo", "r", "--triton-server-repo", "/srv", "--batch", "4", "--verify"],
    ["convert", "m.onnx", "-o", "d", "--two-part", "--outputs", "y", "--input-precision", "9", "--report", "r.md"],
    ["convert", "m.onnx", "-o", "d", "--report", "r.md", "--samples", "s.npy", "--float-model", "f.onnx"],
    ["convert", "m.onnx", "-o", "d", "--one-part", "--outputs", "y", "--input-precision", "9", "--report", "r.md"],
    ["verify", "m", "--seeds", "5", "--params", "p"],
    ["view", "m", "--port", "65535"],
])
def test_options_where_they_apply_pass_the_check(argv):
    """The check refuses only misplaced options: each of these combinations applies."""
    args = cli.parser().parse_args(argv)
    cli.check_usage(args)


def test_run_help_names_every_integer_type_it_takes(capsys):
    """run --input takes any integer type (uint8 images too), not only int8 and int32 as its help once said."""
    code, out, _ = run(capsys, "run", "--help")
    text = " ".join(out.split())
    assert code == 0 and "of any integer type" in text and "uint8" in text and "int8 or int32" not in text


def test_help_exits_0(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "validate" in out and "docs/cli.md" in out


def boom(*args, **kwargs):
    raise ZeroDivisionError("boom")


def test_internal_errors_exit_70_with_a_traceback_only_under_debug(model, monkeypatch, capsys):
    monkeypatch.setattr(api, "load", boom)
    assert failed(capsys, 70, "validate", model) == [
        "internal error: ZeroDivisionError: boom (run with --debug for the traceback)"]
    for argv in (["--debug", "validate", model], ["validate", "--debug", model]):
        code, out, err = run(capsys, *argv)
        assert (code, out) == (70, "") and err.startswith("Traceback") and "in boom" in err
        assert err.endswith("internal error: ZeroDivisionError: boom (run with --debug for the traceback)\n")


def test_debug_shows_the_traceback_of_project_errors_too(tmp_path, capsys):
    code, _, err = run(capsys, "validate", "--debug", tmp_path / "missing")
    assert code == 2 and err.startswith("Traceback") and "FormatError" in err
    assert err.splitlines()[-1] == f"format error: {tmp_path / 'missing'}: no such model directory or file"


def test_interrupt_exits_130(model, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "load", interrupted)
    assert failed(capsys, 130, "info", model) == ["interrupted"]


def test_hostile_names_stay_on_one_line(tmp_path, capsys):
    """Names come from the file: a newline or a terminal escape must not forge output lines or colours."""
    name = "y\ninvalid model: forged\x1b[31m"
    graph = small_graph(name)
    graph.nodes[-1].attrs["shift_bit"] = 0
    graph.nodes[1].name = "w\r"
    graph.params = {"w\r": np.full((3, 4), 300, np.int32)}
    (tmp_path / "symbol").write_text(write_symbol(graph))
    (tmp_path / "params").write_bytes(write_params(graph.params))
    assert failed(capsys, 3, "validate", tmp_path) == [
        "invalid model: w\\r: param value 300 exceeds precision 4 (|x| <= 7)",
        "invalid model: y\\ninvalid model: forged\\x1b[31m: cvm_right_shift: attribute shift_bit='0': must lie in "
        "[1, 32]"]
    write_model(small_graph(name), tmp_path)
    code, out, _ = run(capsys, "info", tmp_path)
    assert code == 0 and "output y\\ninvalid model: forged\\x1b[31m: shape (1, 3)" in out and "\x1b" not in out


def test_native_writes_to_a_terminal_are_held_off_the_bar(monkeypatch):
    """While Ray runs under the progress bar, what native code writes to stderr's descriptor is held, shown only if
    the run fails; our own lines reach the terminal at once."""
    import os

    from cvm_onnx.app.progress import native_stderr_held

    master, slave = os.openpty()
    terminal = os.fdopen(slave, "w", buffering=1)
    monkeypatch.setattr(sys, "stderr", terminal)

    def shown() -> str:
        text = b""
        while select.select([master], [], [], 0.2)[0]:
            text += os.read(master, 4096)
        return text.decode()

    with native_stderr_held():
        os.write(slave, b"native noise\n")
        print("ours", file=sys.stderr)
        assert shown() == "ours\r\n"
    assert sys.stderr is terminal and shown() == ""
    with pytest.raises(ZeroDivisionError), native_stderr_held():
        os.write(slave, b"native trouble\n")
        1 / 0
    assert shown() == "native trouble\r\n"
    terminal.close()
    os.close(master)


def test_the_bar_shows_no_count_before_it_knows_the_total():
    """While Ray starts the total is not known yet: the bar shows no `0/?`, then done/total."""
    from rich.progress import MofNCompleteColumn

    from cvm_onnx.app.progress import Bar

    bar = Bar()
    [count] = [c for c in bar._bar.columns if isinstance(c, MofNCompleteColumn)]
    [task] = bar._bar.tasks
    assert str(count.render(task)) == ""
    bar(2, 5, "samples")
    assert str(count.render(task)) == "2/5"


def test_native_writes_to_a_pipe_are_held_too(monkeypatch):
    """On a pipe (or a file) too, a run that succeeds prints only its own lines: Ray's core worker logging to the
    descriptor is held."""
    import os

    from cvm_onnx.app.progress import native_stderr_held

    read, write = os.pipe()
    stream = os.fdopen(write, "w", buffering=1)
    monkeypatch.setattr(sys, "stderr", stream)
    with native_stderr_held():
        os.write(write, b"[... E 1 1] core_worker.cc:2465: Actor with class name ...\n")
        print("ours", file=sys.stderr)
    stream.close()
    with os.fdopen(read, "rb") as got:
        assert got.read() == b"ours\n"


def cli_process(*argv, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cvm_onnx.app.cli", *map(str, argv)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_process_exit_statuses(model, tmp_path):
    ok, missing = cli_process("validate", model), cli_process("validate", tmp_path / "missing")
    assert ok.wait(60) == 0 and missing.wait(60) == 2
    assert ok.stdout.read().startswith(b"ok: ") and b"Traceback" not in missing.stderr.read()
    closed = cli_process("info", model)  # its reader goes away before it writes (`cvm-onnx info m | head -0`)
    closed.stdout.close()
    assert closed.wait(60) == cli.BROKEN_PIPE and closed.stderr.read() == b""


def test_run_reproduces_the_runtimes_resnet20_output(onchain_resnet_dir, tmp_path, capsys):
    """`cvm-onnx run` on the real on-chain model, on the reference executor and on its ONNX export, gives the
    runtime's published output, one int32 array of the head's shape."""
    resnet_dir = onchain_resnet_dir
    want = np.load(resnet_dir / "expected.npy")
    assert run(capsys, "convert", resnet_dir, "-o", tmp_path / "r.onnx")[0] == 0
    for source in (resnet_dir, tmp_path / "r.onnx"):
        assert run(capsys, "run", source, "--input", resnet_dir / "input.npy", "--output", tmp_path / "out.npz")[0] == 0
        with np.load(tmp_path / "out.npz") as got:
            [y] = got.values()
            assert y.dtype == np.int32 and np.array_equal(y, want)


def test_validate_warns_of_heads_the_c_api_refuses(tmp_path, capsys):
    """A model whose heads have different row counts validates, with one warning naming each head's rows."""
    b = GraphBuilder()
    x = b.input("data", (1, 2, 3), 8)
    write_model(b.build(b.op("sum", x, name="rows2", axis=(2,), keepdims=True),
                        b.op("sum", x, name="rows1", axis=(1, 2), keepdims=True)), tmp_path / "m")
    assert cli.main(["validate", str(tmp_path / "m")]) == 0
    err = capsys.readouterr().err
    assert "rows2 2, rows1 1" in err and "does not run on chain" in err


# -- the per-layer report (quantize --report, convert --report --samples) ---------------------------------------
def conv_pool_float(name: str) -> onnx.ModelProto:
    """x (1, 2, 4, 4) -> Conv 3x3 (3 channels) named ``name`` -> AveragePool 2x2 -> y."""
    rng = np.random.default_rng(7)
    w = onnx.numpy_helper.from_array(rng.normal(size=(3, 2, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], [name], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", [name], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return onnx_model(g, 17)


def table_rows(out: str, names: list[str]) -> list[list[str]]:
    """The cells of the table's rows printed for ``names``, split at runs of spaces (the names hold none)."""
    lines = out.splitlines()
    return [re.split(r" {2,}", next(t for t in lines if t.startswith(n + " ")).strip()) for n in names]


def test_quantize_report_prints_and_writes_every_quantized_tensor(tmp_path, capsys):
    """`quantize --report`: one table row per QuantizeLinear of the quantized model, in its order, the same numbers
    on stdout, in the Markdown and in the JSON file (those of cvm_onnx.app.layers, tested on its own); a name from
    the model printed escaped, not read as markup."""
    import json

    from cvm_onnx.app.layers import cells

    name = "c[bold]\x1b"
    onnx.save(conv_pool_float(name), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(1).normal(size=(4, 2, 4, 4)).astype(np.float32))
    base = ["quantize", tmp_path / "f.onnx", "--calibration", tmp_path / "c.npy", "--save-onnx", tmp_path / "q.onnx"]
    code, out, err = run(capsys, *base, "-o", tmp_path / "m", "--report", tmp_path / "r.json")
    assert code == 0, err
    q = onnx.load(tmp_path / "q.onnx")
    tensors = [n.output[0] for n in q.graph.node if n.op_type == "QuantizeLinear"]
    assert len(tensors) == 3 and tensors[1] == name + "_QuantizeLinear_Output"
    doc = json.loads((tmp_path / "r.json").read_text())
    assert (doc["samples"], doc["float_model"], doc["note"]) == (4, True, None)
    assert [r["name"] for r in doc["layers"]] == tensors
    assert [r["op"] for r in doc["layers"]] == ["(the input)", "Conv", "AveragePool"]
    assert all(r["elements"] == 4 * n for r, n in zip(doc["layers"], (32, 48, 12)))
    assert all(r[k] is not None for r in doc["layers"] for k in ("float_mean", "float_max", "equal", "off"))
    from cvm_onnx.app.layers import Layer

    want = [cells(Layer(**r)) for r in doc["layers"]]
    printed = [n.replace("\x1b", "\\x1b") for n in tensors]
    assert "\x1b" not in out and table_rows(out, printed) == [[p] + w[1:] for p, w in zip(printed, want)]
    code, out, err = run(capsys, *base, "-o", tmp_path / "m2", "--report", tmp_path / "r.md")
    assert code == 0, err
    md = (tmp_path / "r.md").read_text().splitlines()
    assert [line for line in md if line.startswith("| ") and "QuantizeLinear_Output" in line] == [
        "| " + " | ".join(w) + " |" for w in want]


def test_convert_report_measures_the_samples_given(tmp_path, capsys):
    """`convert q.onnx --report R --samples S [--float-model F]`: the report's per-tensor section and the table,
    the float columns only with the float model; bad samples are refused before anything is written."""
    from support.quantized import quantized

    f = conv_pool_float("c")
    q, _ = quantized(f, tmp_path, "QDQ", "uint8", False, True)
    onnx.save(q, tmp_path / "q.onnx")
    np.save(tmp_path / "s.npy", np.random.default_rng(2).normal(size=(3, 2, 4, 4)).astype(np.float32))
    code, out, err = run(capsys, "convert", tmp_path / "q.onnx", "-o", tmp_path / "d", "--report", tmp_path / "r.md",
                         "--samples", tmp_path / "s.npy", "--float-model", tmp_path / "f.onnx")
    assert code == 0, err
    names = [n.output[0] for n in q.graph.node if n.op_type == "QuantizeLinear"]
    rows = table_rows(out, names)
    assert [r[1] for r in rows] == ["(the input)", "Conv", "AveragePool"] and all("-" not in r for r in rows)
    assert [r[3] for r in rows] == ["96", "144", "36"]  # 3 samples of 32, 48 and 12 values
    md = (tmp_path / "r.md").read_text()
    assert "## Per quantized tensor" in md and "on 3 sample(s)" in md
    code, out, err = run(capsys, "convert", tmp_path / "q.onnx", "-o", tmp_path / "d2", "--report",
                         tmp_path / "r2.md", "--samples", tmp_path / "s.npy")
    assert code == 0, err
    assert [r[4:6] for r in table_rows(out, names)] == [["-", "-"]] * 3
    np.save(tmp_path / "bad.npy", np.zeros((3, 5), np.float32))
    lines = failed(capsys, 2, "convert", tmp_path / "q.onnx", "-o", tmp_path / "d3", "--report", tmp_path / "r3.md",
                   "--samples", tmp_path / "bad.npy")
    assert "samples must be floats of shape (N, 2, 4, 4)" in lines[0]
    assert not (tmp_path / "d3").exists() and not (tmp_path / "r3.md").exists()
    other = conv_pool_float("c")
    other.graph.input[0].name = "z"
    other.graph.node[0].input[0] = "z"
    onnx.save(other, tmp_path / "other.onnx")
    lines = failed(capsys, 4, "convert", tmp_path / "q.onnx", "-o", tmp_path / "d3", "--report", tmp_path / "r3.md",
                   "--samples", tmp_path / "s.npy", "--float-model", tmp_path / "other.onnx")
    assert lines == [f"unsupported: {tmp_path / 'other.onnx'}: the float model takes z, not the quantized model's "
                     "input 'x'"]
    assert not (tmp_path / "d3").exists() and not (tmp_path / "r3.md").exists()


def test_convert_takes_a_dynamic_batch_axis_as_one(tmp_path, capsys):
    """A shipped quantized model whose input's first dim is symbolic ('batch', declared on value_info and the output
    too) converts as the same model with that dim written as 1 (symbol and params byte for byte), saying so on
    stderr; a dynamic dim elsewhere is still refused naming the input. Regression: 'input needs a static shape'."""
    def qdq(dims):
        s, z = onnx.numpy_helper.from_array(np.float32(0.1), "s"), onnx.numpy_helper.from_array(np.uint8(128), "z")
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]), helper.make_node("Relu", ["d"], ["r"]),
                 helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q2"]),
                 helper.make_node("DequantizeLinear", ["q2", "s", "z"], ["y"])]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)], [s, z],
                              value_info=[helper.make_tensor_value_info("r", TensorProto.FLOAT, dims)])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = 8
        return m

    onnx.save(qdq(["batch", 4]), tmp_path / "dynamic.onnx")
    onnx.save(qdq([1, 4]), tmp_path / "static.onnx")
    code, _, err = run(capsys, "convert", tmp_path / "dynamic.onnx", "-o", tmp_path / "dynamic")
    assert code == 0 and "x: its dynamic first dim 'batch' taken as 1" in err
    assert run(capsys, "convert", tmp_path / "static.onnx", "-o", tmp_path / "static")[0] == 0
    for f in ("symbol", "params"):
        assert (tmp_path / "dynamic" / f).read_bytes() == (tmp_path / "static" / f).read_bytes()
    onnx.save(qdq([1, "width"]), tmp_path / "wide.onnx")
    [line] = failed(capsys, 4, "convert", tmp_path / "wide.onnx", "-o", tmp_path / "wide")
    assert "x" in line and "static shape" in line
