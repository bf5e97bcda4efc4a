"""Many inputs on one machine (cvm_onnx.runtime.bulk, `cvm-onnx run` with N samples): every result equals the reference
executor run on that sample alone, in input order, whatever the chunking; bad inputs are refused up front."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cvm_onnx
from cvm_onnx.app import api
from cvm_onnx.app.cli import main
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import FormatError, RuntimeFailure
from cvm_onnx.core.graph import Entry
from cvm_onnx.runtime import bulk
from cvm_onnx.serving.target import Target
from support import assert_same

ROOT = Path(__file__).resolve().parents[2]
MODELS = ["digits_cnn", "detection", "transforms"]


def graph_of(path) -> cvm_onnx.core.graph.Graph:
    return api.load(path).graph


def head_name(graph) -> str:
    """The name ``run`` gives a one-output model's output: its head node's."""
    [head] = graph.heads
    return graph.nodes[head.node].name


def random_samples(graph, n: int, seed: int = 0) -> np.ndarray:
    shape = graph.nodes[graph.inputs[0]].outputs[0].shape
    return np.random.default_rng(seed).integers(-127, 128, (n, *shape)).astype(np.int8)


def one_by_one(graph, x: np.ndarray) -> list[np.ndarray]:
    """The oracle: the reference executor on each sample alone, outputs stacked."""
    runs = [api.run_cvm(graph, s) for s in x]
    return [np.stack([r[k] for r in runs]) for k in range(len(graph.heads))]


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("name", MODELS)
def test_cli_runs_stacked_samples_exactly_in_order(name, tmp_path, capsys):
    graph = graph_of(ROOT / "models" / name)
    x = random_samples(graph, 13)
    np.save(tmp_path / "x.npy", x)
    onnx_path = tmp_path / "m.onnx"
    api.write_onnx(cvm_onnx.to_onnx(graph), onnx_path)
    want = one_by_one(graph, x)
    for model, workers in ((ROOT / "models" / name, "1"), (onnx_path, "3")):
        assert main(["run", str(model), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "o.npy"),
                     "--chunk", "4", "--workers", workers]) == 0
        assert_same([np.load(tmp_path / "o.npy")], want)
        assert f"o.npy: {graph.nodes[graph.heads[0].node].name} ({13}, " in capsys.readouterr().out
    assert leftovers(tmp_path) == []


def test_resnet20_batched_serving_form_equals_one_by_one(resnet_dir, tmp_path):
    graph = graph_of(resnet_dir)
    x = random_samples(graph, 37, seed=3)
    want = one_by_one(graph, x)
    served = cvm_onnx.to_onnx(graph, Target.default(), batch=16)
    p = bulk.plan(served)
    assert (p.batch, p.sample, p.split) == (16, (1, 3, 32, 32), (True,))
    assert_same(bulk.run_many(served, x, chunk=16).arrays, want)  # 16 + 16 + 5 padded
    assert_same(bulk.run_many(graph, x, chunk=10).arrays, want)  # the reference executor, batch 10
    np.save(tmp_path / "x.npy", x)
    out = bulk.run_many(served, tmp_path / "x.npy", tmp_path / "o.npz", chunk=32)
    with np.load(tmp_path / "o.npz") as z:
        assert list(z) == out.keys
        assert_same([z[out.keys[0]]], want)


@pytest.mark.parametrize("name", MODELS)
def test_the_runner_of_a_ray_actor_equals_one_by_one(name):
    """What each Ray actor runs: the CVM model exported on the driver (its batched serving form where the model
    takes a batch, else one input a call), one onnxruntime session over uneven chunks."""
    graph = graph_of(ROOT / "models" / name)
    p = bulk.plan(graph, 4, onnxruntime=True, threads=1)
    assert isinstance(p.model, bytes) and p.batch == (4 if name == "digits_cnn" else 1)
    runner = bulk.Runner(p)
    x = random_samples(graph, 11, seed=7)
    got = [runner(x[a:b]) for a, b in ((0, 4), (4, 5), (5, 11))]
    assert_same([np.concatenate([g[k] for g in got]) for k in range(len(graph.heads))], one_by_one(graph, x))


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 23), chunk=st.integers(1, 9), name=st.sampled_from(["digits_cnn", "transforms"]),
       seed=st.integers(0, 2**16))
def test_any_chunking_gives_the_one_by_one_results(n, chunk, name, seed):
    graph = graph_of(ROOT / "models" / name)
    x = random_samples(graph, n, seed)
    assert_same(bulk.run_many(graph, x, chunk=chunk).arrays, one_by_one(graph, x))


@settings(max_examples=10, deadline=None)
@given(n=st.integers(1, 17), chunk=st.integers(1, 5), workers=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_units_run_on_several_workers_come_back_in_order(n, chunk, workers, seed):
    """Units of ``chunk`` samples, ``workers`` at once on one session: the one-by-one results, in order."""
    graph = graph_of(ROOT / "models" / "transforms")
    x = random_samples(graph, n, seed)
    got = bulk.run_many(cvm_onnx.to_onnx(graph), x, chunk=chunk, workers=workers).arrays
    assert_same(got, one_by_one(graph, x))


def test_workers_below_one_are_refused():
    graph = graph_of(ROOT / "models" / "transforms")
    with pytest.raises(RuntimeFailure, match="the number of workers must be >= 1, got 0"):
        bulk.run_many(cvm_onnx.to_onnx(graph), random_samples(graph, 2), workers=0)


def test_samples_along_the_models_first_axis_give_outputs_along_theirs(tmp_path, capsys):
    """The held-out split, (359, 1, 8, 8) for a (1, 1, 8, 8) input: logits (359, 10), row i from image i."""
    graph = graph_of(ROOT / "models" / "digits_cnn")
    x = np.load(ROOT / "models" / "digits_cnn" / "heldout_x.npy")
    assert main(["run", str(ROOT / "models" / "digits_cnn"), "--input",
                 str(ROOT / "models" / "digits_cnn" / "heldout_x.npy"), "--output", str(tmp_path / "o.npy")]) == 0
    assert capsys.readouterr().out == f"wrote {tmp_path / 'o.npy'}: {head_name(graph)} (359, 10)\n"
    assert_same([np.load(tmp_path / "o.npy")], [np.concatenate(one_by_one(graph, x[:, None])[0])])
    transforms = graph_of(ROOT / "models" / "transforms")  # one sample gives (2, 4, 3): 3 give (6, 4, 3)
    x = random_samples(transforms, 3)
    [got] = bulk.run_many(transforms, x[:, 0], chunk=2).arrays
    assert_same([got], [np.concatenate(one_by_one(transforms, x)[0])])


def test_a_directory_is_read_in_file_name_order(tmp_path, capsys):
    graph = graph_of(ROOT / "models" / "digits_cnn")
    x = random_samples(graph, 9, seed=5)
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "a.npy", x[0])  # one sample at the model's shape
    np.save(data / "b.npy", x[1:6])  # five stacked
    np.save(data / "c.npy", x[6])
    np.save(data / "d.npy", x[7:9])
    (data / "notes.txt").write_text("not an input")
    assert main(["run", str(ROOT / "models" / "digits_cnn"), "--input", str(data), "--output",
                 str(tmp_path / "o.npz"), "--chunk", "4"]) == 0
    with np.load(tmp_path / "o.npz") as z:
        assert_same([z[head_name(graph)]], one_by_one(graph, x))


def test_bad_samples_are_all_named_with_their_index_before_anything_runs(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "a.npy", np.zeros((3, 1, 1, 8, 8), np.int8))
    np.save(data / "b.npy", np.zeros((1, 1, 8, 9), np.int8))  # sample 3: wrong shape
    np.save(data / "c.npy", np.zeros((1, 1, 8, 8), np.int8))
    np.save(data / "d.npy", np.zeros((2, 1, 1, 8, 8), np.int32))  # samples 5-6: another dtype
    out = tmp_path / "o.npy"
    assert main(["run", str(ROOT / "models" / "digits_cnn"), "--input", str(data), "--output", str(out)]) == 5
    assert capsys.readouterr().err.splitlines() == [
        "runtime error: sample 3 (b.npy): shape (1, 1, 8, 9) is not the model input's (1, 1, 8, 8), nor samples "
        "(N, 1, 8, 8) or (N, 1, 1, 8, 8)",
        "runtime error: sample 5 (d.npy): int32 samples of shape (1, 1, 8, 8); the first file holds int8 samples "
        "of shape (1, 1, 8, 8)"]
    assert not out.exists() and leftovers(tmp_path) == []


def test_a_failing_sample_is_named_by_its_index_and_leaves_no_file(tmp_path):
    graph = graph_of(ROOT / "models" / "digits_cnn")
    precision = graph.type_of(Entry(graph.inputs[0])).precision
    x = np.zeros((10, 1, 1, 8, 8), np.int16)
    x[6, 0, 0, 3, 3] = 2 ** (precision - 1)  # int16 values must fit the input precision: one above its bound
    np.save(tmp_path / "x.npy", x)
    for model, workers in ((graph, 1), (cvm_onnx.to_onnx(graph), 1), (cvm_onnx.to_onnx(graph), 3)):
        with pytest.raises(RuntimeFailure) as e:
            bulk.run_many(model, tmp_path / "x.npy", tmp_path / "o.npy", chunk=4, workers=workers)
        assert str(e.value).startswith(f"sample 6: data: input values in [0, {2 ** (precision - 1)}] do not fit "
                                       f"the model's input precision {precision}")
        assert sorted(os.listdir(tmp_path)) == ["x.npy"]


def test_the_old_output_stays_when_a_run_fails(tmp_path):
    graph = graph_of(ROOT / "models" / "digits_cnn")
    (tmp_path / "o.npy").write_bytes(b"old")
    with pytest.raises(RuntimeFailure):
        bulk.run_many(graph, np.zeros((4, 1, 1, 8, 8), np.float32), tmp_path / "o.npy")
    assert (tmp_path / "o.npy").read_bytes() == b"old" and leftovers(tmp_path) == []


def three_heads():
    """Two outputs computed from the input, one from a param alone (the same for every sample)."""
    b = GraphBuilder()
    x = b.input("data", (1, 4), 8)
    w = b.param("w", np.array([[1, -2, 3]], np.int8), 8)
    return b.build(b.op("relu", x, name="relu"), b.op("negative", x, name="neg"), b.op("negative", w, name="w_neg"))


def test_a_multi_output_model_writes_an_npz_of_stacked_arrays(tmp_path):
    graph = three_heads()
    x = np.arange(-12, 12, dtype=np.int8).reshape(6, 1, 4)
    want = one_by_one(graph, x)
    with pytest.raises(FormatError, match=r"the model has 3 outputs \(relu, neg, w_neg\); write them to an .npz"):
        bulk.run_many(graph, x, tmp_path / "o.npy")
    for model in (graph, cvm_onnx.to_onnx(graph, Target.default(), batch=4)):
        assert bulk.plan(model, 4).split == (True, True, False)
        bulk.run_many(model, x, tmp_path / "o.npz", chunk=4)
        with np.load(tmp_path / "o.npz") as z:
            assert list(z) == ["relu", "neg", "w_neg"]
            assert_same([z["relu"], z["neg"], z["w_neg"]], want)


def test_one_sample_at_the_models_rank_keeps_the_outputs_shape(tmp_path):
    graph = graph_of(ROOT / "models" / "digits_cnn")
    x = random_samples(graph, 1)[0]
    np.save(tmp_path / "x.npy", x)
    out = bulk.run_many(graph, tmp_path / "x.npy", tmp_path / "o.npy")
    assert out.shapes == [(1, 10)]
    assert np.array_equal(np.load(tmp_path / "o.npy"), api.run_cvm(graph, x)[0])


def test_no_samples_is_refused(tmp_path):
    graph = graph_of(ROOT / "models" / "digits_cnn")
    with pytest.raises(RuntimeFailure, match="the input holds no samples"):
        bulk.run_many(graph, np.zeros((0, 1, 1, 8, 8), np.int8))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="no .npy files"):
        bulk.run_many(graph, tmp_path / "empty")
