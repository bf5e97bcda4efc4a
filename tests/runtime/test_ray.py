"""Many inputs on Ray (cvm_onnx.runtime.on_ray, `cvm-onnx run --ray`), on a local Ray instance this module starts and
stops: results bit-identical to the single-process run and in input order, failures named by sample index with no
file left, a killed actor retried. Without the extra, --ray says how to install it."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

import cvm_onnx
from cvm_onnx.app import api
from cvm_onnx.app.cli import main
from cvm_onnx.core.errors import RuntimeFailure
from cvm_onnx.core.graph import Entry
from cvm_onnx.runtime import bulk
from cvm_onnx.runtime import on_ray as ray_runs
from cvm_onnx.runtime.on_ray import run_on_ray
from support import assert_same

ROOT = Path(__file__).resolve().parents[2]


def test_ray_is_imported_only_when_asked_for():
    code = ("import sys, numpy as np, cvm_onnx.app.cli, cvm_onnx.runtime.bulk as b, cvm_onnx.runtime.on_ray\n"
            "g = cvm_onnx.load('models/digits_cnn').graph\n"
            "b.run_many(g, np.zeros((3, 1, 1, 8, 8), np.int8))\n"
            "assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_without_the_extra_ray_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails, as when it is not installed
    np.save(tmp_path / "x.npy", np.zeros((3, 1, 1, 8, 8), np.int8))
    code = main(["run", str(ROOT / "models" / "digits_cnn"), "--input", str(tmp_path / "x.npy"), "--output",
                 str(tmp_path / "o.npy"), "--ray"])
    assert (code, capsys.readouterr().err) == (
        4, "unsupported: running on Ray needs the extra ray: in the checkout, pip install -e '.[ray]'\n")
    assert not (tmp_path / "o.npy").exists()


def test_sizes_below_one_are_refused():
    graph = api.load(ROOT / "models" / "digits_cnn").graph
    x = np.zeros((3, 1, 1, 8, 8), np.int8)
    with pytest.raises(RuntimeFailure, match="the number of actors must be >= 1, got 0"):
        run_on_ray(graph, x, actors=0)
    with pytest.raises(RuntimeFailure, match="the chunk size must be >= 1, got 0"):
        run_on_ray(graph, x, chunk=0)


@pytest.fixture
def unreachable_cluster(monkeypatch):
    """Ray as a client without the token meets a cluster that requires one (ray.init raises ConnectionError after
    its retries: `ray start --head` of Ray >= 2.59 with token authentication on); the calls to ray.init kept."""
    ray = pytest.importorskip("ray", reason="the extra ray is not installed (pip install -e '.[test,ray]')")
    calls = []

    def init(address=None, **kwargs):
        calls.append(address)
        raise ConnectionError(f"Failed to connect to Ray cluster at {address}")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray_runs, "JOIN", 0.0)  # a run here never beats Ray: the CLI goes on to ray.init
    return calls


def test_ray_before_the_model_takes_no_address_and_a_cluster_wanting_a_token_is_named(tmp_path, capsys,
                                                                                      unreachable_cluster):
    """`run --ray MODEL ...`: --ray's optional ADDRESS does not swallow the model (a new local instance); a
    cluster refusing the connection is a runtime error naming token authentication and what to set."""
    model = ROOT / "models" / "digits_cnn"
    np.save(tmp_path / "x.npy", np.zeros((3, 1, 8, 8), np.float32))
    io = ["--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "o.npy"), "--chunk", "1"]  # 3 chunks
    assert main(["run", "--ray=local", str(model), *io]) == 5
    assert main(["run", str(model), "--ray=10.0.0.1:6379", *io]) == 5
    assert unreachable_cluster == ["local", "10.0.0.1:6379"]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[1].startswith(
        "runtime error: cannot connect to the Ray cluster at 10.0.0.1:6379: ConnectionError: Failed to connect to "
        "Ray cluster at 10.0.0.1:6379. A Ray cluster started with `ray start` (Ray >= 2.59) requires token "
        "authentication: set RAY_AUTH_MODE=token and the cluster's token, RAY_AUTH_TOKEN=")
    assert main(["run", "--ray", str(model), str(model), *io]) == 64  # an address that is a model directory
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"cvm-onnx run: error: argument --ray: ADDRESS {model} is a file or directory, not a Ray address (auto, "
        "HOST:PORT, ray://HOST:10001)")
    assert sorted(os.listdir(tmp_path)) == ["x.npy"]


def test_ray_without_a_cluster_to_join_runs_here_and_says_why(tmp_path, capsys, monkeypatch):
    """`run --ray` where no cluster runs (RAY_ADDRESS unset, none started here) would start a new local instance,
    which has this machine's CPUs only; on a cluster, one chunk is one actor's work, and a run that takes less
    here than Ray adds (on_ray.JOIN, estimated from one call) does not pay: the run goes on here, equal to
    the run without --ray, with one note."""
    ray = pytest.importorskip("ray", reason="the extra ray is not installed (pip install -e '.[test,ray]')")
    from ray._private import services

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(services, "canonicalize_bootstrap_address", lambda address: None)  # no cluster here
    monkeypatch.setattr(ray, "init", None)  # never called
    model = ROOT / "models" / "digits_cnn"
    np.save(tmp_path / "x.npy", random_samples(api.load(model).graph, 70))
    io = ["--input", str(tmp_path / "x.npy"), "--output"]
    assert main(["run", "--ray", str(model), *io, str(tmp_path / "ray.npy"), "--actors", "2"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith("note: --ray: no Ray cluster to join") and len(err.splitlines()) == 1
    assert main(["run", str(model), *io, str(tmp_path / "here.npy")]) == 0
    assert_same([np.load(tmp_path / "ray.npy")], [np.load(tmp_path / "here.npy")])
    capsys.readouterr()
    monkeypatch.setattr(services, "canonicalize_bootstrap_address", lambda address: "10.0.0.1:6379")  # a cluster
    assert main(["run", "--ray", str(model), *io, str(tmp_path / "one.npy"), "--chunk", "70"]) == 0
    assert capsys.readouterr().err == ("note: --ray: 70 sample(s) make one chunk of --chunk 70, which one actor would "
                                       "run alone after Ray's connection and its start-up: runs here without Ray\n")
    assert_same([np.load(tmp_path / "one.npy")], [np.load(tmp_path / "here.npy")])
    assert main(["run", "--ray", str(model), *io, str(tmp_path / "five.npy"), "--chunk", "16"]) == 0  # 5 chunks
    [note] = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"note: --ray: the run here takes about \d+\.\d\d s \(70 calls, the first in \d+\.\d\d\d s\), "
                        r"less than Ray adds to it .*: runs here without Ray", note), note
    assert_same([np.load(tmp_path / "five.npy")], [np.load(tmp_path / "here.npy")])


def test_the_progress_bar_says_ray_is_starting(unreachable_cluster):
    said = []
    graph = api.load(ROOT / "models" / "digits_cnn").graph
    with pytest.raises(RuntimeFailure, match="token authentication"):
        run_on_ray(graph, np.zeros((5, 1, 8, 8), np.int8), progress=lambda *a: said.append(a))
    assert said == [(0, 5, "starting Ray")]


def test_an_address_where_nothing_listens_is_said_so_at_once(tmp_path, capsys, monkeypatch):
    """Nothing listens at HOST:PORT: said in seconds (ray.init retries such an address for many minutes)."""
    pytest.importorskip("ray", reason="the extra ray is not installed (pip install -e '.[test,ray]')")
    monkeypatch.setattr(ray_runs, "JOIN", 0.0)  # a run here never beats Ray
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    np.save(tmp_path / "x.npy", np.zeros((3, 1, 8, 8), np.float32))
    argv = ["run", str(ROOT / "models" / "digits_cnn"), "--input", str(tmp_path / "x.npy"), "--output",
            str(tmp_path / "o.npy"), "--chunk", "1"]  # 3 chunks: Ray could be faster
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        assert main([*argv, f"--ray={address}"]) == 5
        assert capsys.readouterr().err.startswith(f"runtime error: no Ray cluster answers at {address}: ")


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the tests that use it: 2 CPUs, a small object store, no dashboard, no external
    address."""
    ray = pytest.importorskip("ray", reason="the extra ray is not installed (pip install -e '.[test,ray]')")
    ray.init("local", num_cpus=2, object_store_memory=256 << 20, include_dashboard=False, logging_level="WARNING",
             log_to_driver=False)
    yield
    ray.shutdown()


on_ray = pytest.mark.usefixtures("local_ray")


def random_samples(graph, n: int, seed: int = 0, dtype=np.int8) -> np.ndarray:
    shape = graph.nodes[graph.inputs[0]].outputs[0].shape
    return np.random.default_rng(seed).integers(-127, 128, (n, *shape)).astype(dtype)


@on_ray
@pytest.mark.parametrize("name", ["digits_cnn", "detection"])
def test_example_models_on_ray_equal_the_single_process_run(name):
    """digits_cnn: a CVM graph, run in its batched serving form; detection: an .onnx file with native ops (NMS)
    that takes no batch, run one sample a call."""
    graph = api.load(ROOT / "models" / name).graph
    model = graph if name == "digits_cnn" else cvm_onnx.to_onnx(graph)
    x = random_samples(graph, 11, seed=1)
    assert bulk.plan(model, 4, onnxruntime=True).batch == (4 if name == "digits_cnn" else 1)
    assert_same(run_on_ray(model, x, actors=2, chunk=4).arrays, bulk.run_many(graph, x, chunk=4).arrays)


@on_ray
def test_no_more_actors_than_chunks():
    """Three samples are one chunk: one actor, so Ray Data does not warn that the operator received fewer inputs
    than its minimum number of concurrent actors."""
    import warnings

    graph = api.load(ROOT / "models" / "digits_cnn").graph
    x = random_samples(graph, 3, seed=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = run_on_ray(graph, x, actors=2).arrays
    assert not [w for w in caught if "concurrent actors" in str(w.message)]
    assert_same(got, bulk.run_many(graph, x).arrays)


@on_ray
def test_resnet20_on_ray_keeps_the_input_order_with_uneven_chunks(resnet_dir, tmp_path, capsys):
    graph = api.load(resnet_dir).graph  # the CLI on Ray: the CVM model exported in its serving form, batch 16
    np.save(tmp_path / "x.npy", random_samples(graph, 75, seed=2))  # chunks of 16: 4 full and one of 11
    argv = ["run", str(resnet_dir), "--input", str(tmp_path / "x.npy"), "--chunk", "16"]
    assert main([*argv, "--output", str(tmp_path / "one.npy")]) == 0
    assert main([*argv, "--output", str(tmp_path / "ray.npy"), "--actors", "2", "--ray"]) == 0
    head = graph.nodes[graph.heads[0].node].name  # cvm_right_shift135 on chain
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {tmp_path / 'ray.npy'}: {head} (75, 1, 10)"
    assert_same([np.load(tmp_path / "ray.npy")], [np.load(tmp_path / "one.npy")])


@on_ray
def test_a_quantized_model_takes_float_inputs_on_ray(tmp_path):
    """A CVM model imported from a quantized ONNX model: float inputs in, float32 outputs out, as in one process."""
    from support.quantized import small_qdq

    onnx.save(small_qdq(tmp_path), tmp_path / "q.onnx")
    cvm_onnx.convert(tmp_path / "q.onnx", tmp_path / "q")
    model = cvm_onnx.load(tmp_path / "q")
    x = np.random.default_rng(5).normal(size=(9, 1, 2, 4, 4)).astype(np.float32)
    want = bulk.run_many(model.graph, x, chunk=4, edges=model.edges).arrays
    assert want[0].dtype == np.float32
    assert_same(run_on_ray(model.graph, x, actors=2, chunk=4, edges=model.edges).arrays, want)


@on_ray
def test_a_failing_sample_is_named_by_its_index_and_no_file_is_left(tmp_path, capsys):
    graph = api.load(ROOT / "models" / "digits_cnn").graph
    low = -graph.type_of(Entry(graph.inputs[0])).bound - 1
    x = np.zeros((30, 1, 1, 8, 8), np.int16)
    x[13, 0, 0, 2, 5] = low  # found in an actor: int16 values must fit the input precision (one below its bound)
    with pytest.raises(RuntimeFailure) as e:
        run_on_ray(graph, x, tmp_path / "o.npy", actors=2, chunk=4)
    assert str(e.value).startswith(f"sample 13: data: input values in [{low}, 0] do not fit")
    data = tmp_path / "data"  # found before anything runs: a sample of the wrong shape
    data.mkdir()
    np.save(data / "a.npy", np.zeros((5, 1, 1, 8, 8), np.int8))
    np.save(data / "b.npy", np.zeros((1, 8, 8), np.int8))
    assert main(["run", str(ROOT / "models" / "digits_cnn"), "--input", str(data), "--output",
                 str(tmp_path / "o.npy"), "--ray"]) == 5
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        "runtime error: sample 5 (b.npy): shape (1, 8, 8) is not the model")
    assert sorted(os.listdir(tmp_path)) == ["data"]


def map_workers() -> list[int]:
    """PIDs of the Ray Data actors running map_batches (process title ray::MapWorker(...))."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and Path(f"/proc/{entry}/cmdline").read_bytes().startswith(b"ray::MapWorker"):
                pids.append(int(entry))
        except OSError:
            continue
    return pids


@on_ray
def test_a_killed_actor_is_restarted_and_the_result_is_complete_and_exact():
    graph = api.load(ROOT / "models" / "digits_cnn").graph
    x = random_samples(graph, 301, seed=4)[:, 0]  # along the batch axis: (301, 1, 8, 8), logits (301, 10)
    first: list[int] = []
    later: set[int] = set()

    def kill_one_actor(done, total, what):  # once the first results are in, with chunks still queued
        if first or not done:  # (done 0: Ray and its actors are starting)
            return
        first.extend(map_workers())
        os.kill(first[0], signal.SIGKILL)
        # the pool cannot finish while this callback holds the driver's iteration: wait for Ray to start the
        # actor again (a loaded machine may finish every chunk on the other actor before that one is up)
        deadline = time.monotonic() + 120
        while not later - set(first) and time.monotonic() < deadline:
            time.sleep(0.2)
            later.update(map_workers())

    got = run_on_ray(graph, x, actors=2, chunk=8, progress=kill_one_actor).arrays
    assert first and later - set(first), "no actor was started again after the kill"
    assert_same(got, bulk.run_many(graph, x).arrays)
