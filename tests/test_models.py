"""The example models in models/: each loads and validates, reproduces its recorded output on the reference executor
and on onnxruntime, and its script regenerates it byte for byte. The digits model's accuracies are recomputed from
the shipped model and held-out data; the transforms model and the detection model's NMS tail are checked against
oracles written here from the runtime's formulas."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import cvm_onnx
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.executor import execute
from cvm_onnx.core.graph import Entry
from cvm_onnx.runtime.sessions import run, session

MODELS = Path(__file__).parents[1] / "models"
NAMES = ["digits_cnn", "detection", "transforms"]
SOURCES = {"make.py", "README.md"}


def load(name: str):
    model = cvm_onnx.load(MODELS / name)
    assert model.warnings == []
    return model.graph


def sample(name: str) -> tuple[np.ndarray, np.ndarray]:
    x, want = np.load(MODELS / name / "input.npy"), np.load(MODELS / name / "expected.npy")
    assert x.dtype == np.int8 and want.dtype == np.int32
    return x, want


def onnx_session(graph):
    """A session on the exported model: an export that fails (UnsupportedError included) fails the test."""
    return session(to_onnx(graph))


@pytest.mark.parametrize("name", NAMES)
def test_model_is_small_and_listed(name):
    size = sum(f.stat().st_size for f in (MODELS / name).iterdir())
    assert size < 256 * 1024
    assert f"{name}/" in (MODELS / "README.md").read_text()


@pytest.mark.parametrize("name", NAMES)
def test_reference_reproduces_expected(name):
    x, want = sample(name)
    [y] = execute(load(name), x)
    assert y.dtype == np.int32 and y.shape == want.shape and np.array_equal(y, want)


@pytest.mark.parametrize("name", NAMES)
def test_onnx_reproduces_expected(name):
    x, want = sample(name)
    [y] = run(onnx_session(load(name)), {"data": x.astype(np.int32)})
    assert y.dtype == np.int32 and y.shape == want.shape and np.array_equal(y, want)


@pytest.mark.parametrize("name", NAMES)
def test_make_regenerates_identical_files(name, tmp_path):
    if name.startswith("digits"):
        pytest.importorskip("sklearn", reason="regenerating the digits model needs scikit-learn (extra `models`)")
    spec = importlib.util.spec_from_file_location(f"make_{name}", MODELS / name / "make.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    make.main(tmp_path)
    shipped = sorted(f.name for f in (MODELS / name).iterdir() if f.is_file() and f.name not in SOURCES)
    assert sorted(f.name for f in tmp_path.iterdir()) == shipped
    for f in shipped:
        assert (tmp_path / f).read_bytes() == (MODELS / name / f).read_bytes(), f


# -- digits: accuracies ---------------------------------------------------------------------------------------------
def heldout():
    d = MODELS / "digits_cnn"
    x, y = np.load(d / "heldout_x.npy"), np.load(d / "heldout_y.npy")
    assert x.dtype == np.int8 and x.shape[1:] == (1, 8, 8) and len(x) == len(y)
    return x, y, json.loads((d / "accuracy.json").read_text())


@pytest.mark.parametrize("path", sorted(MODELS.rglob("*.onnx")), ids=lambda p: str(p.relative_to(MODELS)))
def test_shipped_onnx_files_have_the_ir_version_their_opsets_need(path):
    """Not the newest of the onnx that wrote them (onnx 1.23 stamps IR 14, which onnxruntime 1.31 cannot load)."""
    import onnx

    from cvm_onnx.core.format.onnx_file import ir_version

    model = onnx.load(path, load_external_data=False)
    assert model.ir_version == ir_version(model.opset_import)
    session(path)


def test_digits_accuracies_are_recorded_and_its_commands_reproduce_it(tmp_path):
    """The digits model: accuracies recomputed from the shipped files (the CVM model within one point of the float
    model), and its README's `cvm-onnx quantize` command writes the shipped model byte for byte."""
    from cvm_onnx.app.cli import main

    d = MODELS / "digits_cnn"
    x, y, acc = heldout()
    graph = load("digits_cnn")
    logits = np.stack([execute(graph, x[i:i + 1])[0][0] for i in range(len(x))])
    correct = int((logits.argmax(axis=1) == y).sum())
    assert acc["samples"] == len(y)
    assert correct == acc["cvm_correct"] and correct / len(y) == acc["cvm_accuracy"]
    assert abs(acc["cvm_accuracy"] - acc["float_accuracy"]) <= 0.01
    assert acc["float_accuracy"] > 0.9 and acc["ort_quantized_accuracy"] > 0.9
    readme = (d / "README.md").read_text()
    for key in ("float_accuracy", "ort_quantized_accuracy", "cvm_accuracy", "onnx_accuracy"):
        assert f"{acc[key]:.2%}" in readme, key
    assert main(["quantize", str(d / "float.onnx"), "--calibration", str(d / "calibration.npy"), "-o",
                 str(tmp_path / "q"), "--per-channel", "--activation", "int8"]) == 0
    assert "--per-channel --activation int8" in readme
    for f in ("symbol", "params", "quantization.json"):
        assert (tmp_path / "q" / f).read_bytes() == (d / f).read_bytes(), f


def test_digits_onnx_equals_cvm_on_the_whole_heldout_split():
    x, y, acc = heldout()
    graph = load("digits_cnn")
    sess = onnx_session(graph)
    correct = 0
    for i in range(len(x)):
        [want] = execute(graph, x[i:i + 1])
        [got] = run(sess, {"data": x[i:i + 1].astype(np.int32)})
        assert got.dtype == np.int32 and np.array_equal(got, want), f"held-out sample {i}"
        correct += int(got.argmax() == y[i])
    assert correct == acc["onnx_correct"] == acc["cvm_correct"]
    assert correct / len(y) == acc["onnx_accuracy"] == acc["cvm_accuracy"]


# -- oracles --------------------------------------------------------------------------------------------------------
def test_transforms_against_a_numpy_oracle():
    """The model's dataflow written out in numpy from its README: lookups clip ids into 0..31."""
    graph = load("transforms")
    x, want = sample("transforms")
    emb, table = graph.params["embedding"].astype(np.int32), graph.params["table"].astype(np.int32)
    ids = np.clip(x[0].astype(np.int64), 0, len(table) - 1)
    et = emb[ids].T  # (4 features, 6 tokens)
    rev = et[::-1, [5, 3, 1]]
    lut = table[ids][[5, 3, 1]]
    sel = np.where(rev > lut, rev, lut)
    cat = np.concatenate([np.repeat(sel, 2, axis=1), et])  # (8, 6)
    assert np.array_equal(want, cat.reshape(2, 4, 6)[:, :, :3])


def iou_percent(a, b) -> int:
    """The runtime's integer IoU in percent (notes: non_max_suppression)."""
    sum_area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1])
    if sum_area <= 0:
        return 0
    w = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    overlap = w * h
    union = sum_area - overlap
    return 0 if union <= 0 else overlap * 100 // union


def test_detection_tail_against_an_nms_oracle():
    """get_valid_counts -> NMS recomputed with loops from the rows the head produced; the sample exercises the
    score threshold, a suppression and the output limit."""
    graph = load("detection")
    x, want = sample("detection")
    names = {n.name: i for i, n in enumerate(graph.nodes)}
    gvc, nms = graph.nodes[names["valid"]], graph.nodes[names["nms"]]
    assert nms.inputs == (Entry(names["valid"], 1), Entry(names["valid"], 0))  # MRT's wiring
    rows = execute(graph, x, keep_all=True)[Entry(names["rows_t"])][0].tolist()
    valid = [r for r in rows if r[1] > gvc.attrs["score_threshold"]]
    kept = []
    for r in sorted(valid, key=lambda r: -r[1]):  # stable
        if len(kept) == nms.attrs["max_output_size"]:
            break
        if r[0] >= 0 and not any(k[0] == r[0] and iou_percent(k[2:], r[2:]) >= nms.attrs["iou_threshold"]
                                 for k in kept):
            kept.append(r)
    assert kept + [[-1] * 6] * (len(rows) - len(kept)) == want[0].tolist()
    assert len(valid) < len(rows) and len(kept) == nms.attrs["max_output_size"] < len(valid)
    assert any(r not in kept for r in sorted(valid, key=lambda r: -r[1])[:len(kept)])  # a suppressed box


# -- resnet20: the generated stand-in for the on-chain ResNet-20 -------------------------------------------------
def test_the_resnet20_stand_in_is_generated_byte_for_byte_again(tmp_path):
    spec = importlib.util.spec_from_file_location("make_resnet20_again", MODELS / "resnet20" / "make.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    first, second = make.main(tmp_path / "a"), make.main(tmp_path / "b")
    names = ["expected.npy", "input.npy", "params", "symbol"]
    assert sorted(f.name for f in first.iterdir()) == names
    assert [f.name for f in (MODELS / "resnet20").iterdir() if f.name != "__pycache__"] == ["make.py"]  # not shipped
    for f in names:
        assert (first / f).read_bytes() == (second / f).read_bytes(), f
    model = cvm_onnx.load(first)
    assert model.warnings == []
    [y] = execute(model.graph, np.load(first / "input.npy"))
    assert np.array_equal(y, np.load(first / "expected.npy")) and len(set(y.reshape(-1).tolist())) > 5


def test_the_resnet20_stand_in_has_the_on_chain_models_shapes(onchain_resnet_dir, tmp_path):
    spec = importlib.util.spec_from_file_location("make_resnet20_shapes", MODELS / "resnet20" / "make.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    stand_in, onchain = cvm_onnx.load(make.main(tmp_path)).graph, cvm_onnx.load(onchain_resnet_dir).graph

    def layers(g):
        return {(n.op, g.type_of(n.inputs[0]).shape, g.type_of(n.inputs[1]).shape, n.outputs[0].shape)
                for n in g.nodes if n.op in ("conv2d", "dense")}

    assert layers(stand_in) == layers(onchain)
    for g in (stand_in, onchain):
        assert [g.nodes[i].outputs[0].shape for i in g.inputs] == [(1, 3, 32, 32)]
        assert [g.type_of(h).shape for h in g.heads] == [(1, 10)]
