"""`cvm-onnx convert --triton-repo`: a Triton model repository whose config.pbtxt parses with Triton's own
model-config protobuf classes (tritonclient, the extra triton: the tests that parse it skip without it) and
describes the model file beside it. The server itself is not run here (no Triton server on this machine)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper

import cvm_onnx
from cvm_onnx.app import api
from cvm_onnx.app.cli import main
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.native import library_path
from cvm_onnx.runtime import bulk
from cvm_onnx.runtime.triton import TYPES, config

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"


def classes():
    """tritonclient's model-config protobuf module (.ci/run installs the extra triton, so CI runs these tests)."""
    return pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="needs tritonclient, the extra triton "
                               "(pip install 'tritonclient[grpc]')")


def parsed(path: Path):
    return text_format.Parse(path.read_text(), classes().ModelConfig())


def described(cfg, model: onnx.ModelProto) -> None:
    """The config lists the model's inputs and outputs, in order, with their types and full static dims."""
    DataType = classes().DataType
    for entries, values in ((cfg.input, model.graph.input), (cfg.output, model.graph.output)):
        assert [(e.name, DataType.Name(e.data_type), list(e.dims)) for e in entries] == [
            (v.name, TYPES[v.type.tensor_type.elem_type], [d.dim_value for d in v.type.tensor_type.shape.dim])
            for v in values]


def test_a_batched_serving_form_in_a_repository(tmp_path, capsys):
    repo = tmp_path / "repo"
    assert main(["convert", str(MODELS / "digits_cnn"), "--optimize", "--batch", "16", "--verify",
                 "--triton-repo", str(repo)]) == 0
    model = onnx.load(repo / "digits_cnn" / "1" / "model.onnx")
    native = ["digits_cnn/libcvm_onnx_ops.so"] if any(n.domain == "cvm.native" for n in model.graph.node) else []
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote the Triton model {repo / 'digits_cnn'}: config.pbtxt, " \
        f"1/model.onnx{', libcvm_onnx_ops.so' if native else ''}"
    assert bool(native) == (library_path() is not None)  # the serving form's integer products (im2col ops)
    assert sorted(str(p.relative_to(repo)) for p in repo.rglob("*")) == sorted(
        ["digits_cnn", "digits_cnn/1", "digits_cnn/1/model.onnx", "digits_cnn/config.pbtxt"] + native)
    cfg = parsed(repo / "digits_cnn" / "config.pbtxt")
    assert (cfg.name, cfg.platform, cfg.max_batch_size) == ("digits_cnn", "onnxruntime_onnx", 0)
    described(cfg, model)
    assert list(cfg.input[0].dims) == [16, 1, 8, 8] and list(cfg.output[0].dims) == [16, 10]
    assert [classes().ModelInstanceGroup.Kind.Name(g.kind) for g in cfg.instance_group] == ["KIND_CPU"]
    assert cfg.HasField("model_operations") == bool(native)
    graph = api.load(MODELS / "digits_cnn").graph  # what is served is exact
    x = np.load(MODELS / "digits_cnn" / "heldout_x.npy")[:40]
    assert np.array_equal(bulk.run_many(model, x).arrays[0], bulk.run_many(graph, x).arrays[0])


def test_the_cuda_form_is_served_on_a_gpu_instance(tmp_path, capsys):
    """convert --provider cuda (the CUDA serving form, verified exact on the CPU provider) gets a KIND_GPU
    instance group."""
    repo = tmp_path / "repo"
    assert main(["convert", str(MODELS / "detection"), "--provider", "cuda", "--verify",
                 "--triton-repo", str(repo)]) == 0
    assert "equal element for element on onnxruntime (cpu)" in capsys.readouterr().out
    report = tmp_path / "r.md"
    assert main(["convert", str(MODELS / "detection"), "-o", str(tmp_path / "d.onnx"), "--provider", "cuda",
                 "--report", str(report)]) == 0
    assert "CUDA serving form" in report.read_text() and "every node a CUDA kernel" in report.read_text()
    model = onnx.load(repo / "detection" / "1" / "model.onnx")
    assert {p.key: p.value for p in model.metadata_props}["cvm.provider"] == "cuda"
    cfg = parsed(repo / "detection" / "config.pbtxt")
    assert [classes().ModelInstanceGroup.Kind.Name(g.kind) for g in cfg.instance_group] == ["KIND_GPU"]
    described(cfg, model)


def test_native_ops_bring_their_library_named_by_the_servers_path(tmp_path):
    repo = tmp_path / "repo"
    assert main(["convert", str(MODELS / "detection"), "-o", str(tmp_path / "d.onnx"), "--triton-repo", str(repo),
                 "--triton-server-repo", "/srv/triton"]) == 0
    folder = repo / "detection"
    assert (folder / "1" / "model.onnx").read_bytes() == (tmp_path / "d.onnx").read_bytes()
    assert (folder / "libcvm_onnx_ops.so").read_bytes() == Path(library_path()).read_bytes()
    cfg = parsed(folder / "config.pbtxt")
    assert list(cfg.model_operations.op_library_filename) == ["/srv/triton/detection/libcvm_onnx_ops.so"]
    described(cfg, onnx.load(folder / "1" / "model.onnx"))


@pytest.mark.skipif(library_path() is None, reason="the native library was not built")
def test_a_model_replacing_one_with_native_ops_leaves_no_stale_library(tmp_path, capsys):
    """The summary names the library when it is copied; a model without cvm.native ops written over one with them
    takes the library away with the config naming it."""
    import shutil

    source, repo = tmp_path / "src" / "m", tmp_path / "repo"
    shutil.copytree(MODELS / "detection", source)
    assert main(["convert", str(source), "--triton-repo", str(repo)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == \
        f"wrote the Triton model {repo / 'm'}: config.pbtxt, 1/model.onnx, libcvm_onnx_ops.so"
    shutil.rmtree(source)
    shutil.copytree(MODELS / "digits_cnn", source)
    assert main(["convert", str(source), "--triton-repo", str(repo)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote the Triton model {repo / 'm'}: config.pbtxt, 1/model.onnx"
    assert sorted(str(p.relative_to(repo)) for p in repo.rglob("*")) == [
        "m", "m/1", "m/1/model.onnx", "m/config.pbtxt"]
    assert not parsed(repo / "m" / "config.pbtxt").HasField("model_operations")


def test_any_tensor_name_survives_the_config():
    names = ['quote"d', "back\\slash", "new\nline", "unicode é ☃", "tab\there"]
    inputs = [helper.make_tensor_value_info(names[0], TensorProto.INT8, [1, 3])]
    outputs = [helper.make_tensor_value_info(n, t, [2]) for n, t in
               zip(names[1:], [TensorProto.INT32, TensorProto.FLOAT, TensorProto.INT64, TensorProto.UINT8])]
    nodes = [helper.make_node("Cast", [names[0]], [n], to=o.type.tensor_type.elem_type)
             for n, o in zip(names[1:], outputs)]
    model = onnx_model(helper.make_graph(nodes, "g", inputs, outputs))
    cfg = text_format.Parse(config(model, "m ☃", "/models/m/lib.so"), classes().ModelConfig())
    assert cfg.name == "m ☃" and list(cfg.model_operations.op_library_filename) == ["/models/m/lib.so"]
    described(cfg, model)


def test_nothing_is_left_when_the_conversion_fails(tmp_path, capsys):
    repo = tmp_path / "repo"
    # non_max_suppression refuses a batch > 1
    assert main(["convert", str(MODELS / "detection"), "--batch", "4", "--triton-repo", str(repo)]) == 4
    assert not (repo / "detection").exists()


def test_only_a_cvm_model_goes_into_a_repository(tmp_path, capsys):
    api.write_onnx(cvm_onnx.to_onnx(api.load(MODELS / "digits_cnn").graph), tmp_path / "m.onnx")
    assert main(["convert", str(tmp_path / "m.onnx"), "--triton-repo", str(tmp_path / "repo")]) == 64
    assert "--triton-repo applies to a CVM model (CVM -> ONNX); SOURCE is an .onnx file" in capsys.readouterr().err
    assert main(["convert", str(MODELS / "digits_cnn")]) == 64
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b"])
def test_a_model_name_must_name_a_directory(bad, tmp_path):
    from cvm_onnx.core.errors import FormatError
    from cvm_onnx.runtime.triton import write_repository

    with pytest.raises(FormatError, match="cannot name a model directory"):
        write_repository(cvm_onnx.to_onnx(api.load(MODELS / "digits_cnn").graph), tmp_path, bad)
