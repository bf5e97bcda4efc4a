"""Batched export (cvm_onnx.core.batch, ``to_onnx(graph, batch=N)``): a batch of N equals N single runs, on the
reference executor and on onnxruntime, bit for bit; graphs whose ops would not keep the batch are refused,
naming the node and the reason."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import graphs, tensors

import cvm_onnx
from cvm_onnx.app import pipeline
from cvm_onnx.converters.to_onnx import to_onnx
from cvm_onnx.core.batch import batched
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.sessions import run

MODELS = Path(__file__).resolve().parents[2] / "models"


def singles(graph, data: np.ndarray) -> list[np.ndarray]:
    """Each head of ``graph`` run on every example alone, stacked along the first axis."""
    runs = [execute(graph, {"data": data[k:k + 1]}) for k in range(len(data))]
    return [np.concatenate([r[h] for r in runs]) for h in range(len(graph.heads))]


def check_batch(graph, data: np.ndarray, inline: bool = False) -> None:
    n = len(data)
    big = batched(graph, n)
    want = singles(graph, data)
    assert all(np.array_equal(g, w) for g, w in zip(execute(big, {"data": data}), want))
    got = run(to_onnx(graph, batch=n, inline=inline), {"data": data})
    assert all(g.shape == w.shape and np.array_equal(g, w) for g, w in zip(got, want))


@settings(max_examples=25, deadline=None)
@given(case=graphs(), n=st.integers(1, 4), inline=st.booleans(), data=st.data())
def test_random_graphs(case, n, inline, data):
    """The exporter's random graphs (conv2d, pooling, shifts, clips, products, sums): all keep the batch."""
    graph, feeds = case
    shape = feeds["data"].shape
    x = np.concatenate([feeds["data"], data.draw(tensors((n - 1,) + shape[1:], 9))])
    check_batch(graph, x, inline)


@st.composite
def transform_graphs(draw):
    """(graph, data): flatten / reshape keeping the first axis (code 0, or the example's literal 1) / transpose
    keeping it / sum over other axes /
    dense / take along another axis / concatenate off axis 0 / broadcast with a leading-1 param."""
    b = GraphBuilder()
    c, h, w = (draw(st.integers(1, 3)) for _ in range(3))
    x = b.input("data", (1, c, h, w), 8)
    kind = draw(st.sampled_from(["flatten", "reshape", "reshape1", "transpose", "sum", "take", "concat",
                                 "broadcast"]))
    if kind == "flatten":
        y = b.op("dense", b.op("flatten", x), b.param("w", draw(tensors((2, c * h * w), 8)), 8), units=2,
                 use_bias=False)
    elif kind == "reshape":
        y = b.op("reshape", x, shape=(0, -1, w))
    elif kind == "reshape1":  # the example's literal 1 (as an imported GlobalAveragePool writes): N with the batch
        y = b.op("reshape", b.op("sum", x, axis=(2, 3)), shape=(1, c, 1, 1))
    elif kind == "transpose":
        y = b.op("transpose", x, axes=(0, 3, 1, 2))
    elif kind == "sum":
        y = b.op("sum", x, axis=(1, 3), keepdims=draw(st.booleans()))
    elif kind == "take":
        y = b.op("take", x, b.param("i", np.array([[0, h - 1], [h, -1]]), 8), axis=2)
    elif kind == "concat":
        y = b.op("concatenate", x, b.op("relu", x), axis=draw(st.integers(1, 3)))
    else:
        y = b.op("broadcast_add", x, b.param("p", draw(tensors((1, c, 1, w), 8)), 8))
    n = draw(st.integers(2, 4))
    return b.build(y), draw(tensors((n, c, h, w), 8))


@settings(max_examples=30, deadline=None)
@given(case=transform_graphs())
def test_transforms_keeping_the_batch(case):
    check_batch(*case)


def test_resnet20_batch_4_equals_4_single_runs(resnet):
    graph = resnet
    x = np.random.default_rng(0).integers(-128, 128, (4, 3, 32, 32)).astype(np.int32)
    x[0] = 127
    x[1] = -128  # clamped to -127 by the input's Clip, as the runtime does
    check_batch(graph, x)
    assert batched(graph, 4).nodes[0].outputs[0].shape == (4, 3, 32, 32)


def refusal(build) -> str:
    b = GraphBuilder()
    y = build(b, b.input("data", (1, 4, 2, 2), 8))
    with pytest.raises(UnsupportedError) as e:
        to_onnx(b.build(y), batch=3)
    (problem,) = e.value.problems
    return str(problem)


@pytest.mark.parametrize("build, where, why", [
    (lambda b, x: b.op("reshape", x, shape=(4, 4), name="fold"), "fold", "does not take the batched input"),
    (lambda b, x: b.op("reshape", x, shape=(-1,), name="fold"), "fold", "for 3"),
    (lambda b, x: b.op("sum", x, axis=(0,), name="s"), "s", "does not keep the batch"),
    (lambda b, x: b.op("max", x, name="m"), "m", "does not keep the batch"),
    (lambda b, x: b.op("concatenate", x, x, axis=0, name="c"), "c", "(2, 4, 2, 2) for one example"),
    (lambda b, x: b.op("transpose", b.op("expand_dims", x, axis=1), axes=(1, 0, 2, 3, 4), name="t"),
     "t", "does not keep the batch"),
    (lambda b, x: b.op("take", x, b.param("i", np.array([[0]]), 8), name="tk"), "tk", "(1, 1) for 3"),
    (lambda b, x: b.op("take", x, b.op("cvm_clip", x, precision=3), name="tk"), "tk", "flattened data"),
    (lambda b, x: b.op("take", x, b.op("sum", x, axis=(1, 2, 3)), axis=0, name="tk"), "tk", "its first axis"),
    (lambda b, x: b.op("cvm_lut", b.param("i", np.array([[1, 2]]), 8), x, in_dim=16, name="lut"), "lut",
     "does not take the batched input shapes [(1, 2), (3, 4, 2, 2)]"),
    (lambda b, x: b.op("slice_like", b.param("d", np.ones((3, 4, 2, 2)), 8), x, name="sl"), "sl",
     "only the shape"),
])
def test_refusals(build, where, why):
    text = refusal(build)
    assert text.startswith(f"{where}") and "cannot batch" in text and why in text, text


def test_non_max_suppression_with_a_batch_is_not_portable():
    b = GraphBuilder()
    x = b.input("data", (1, 5, 6), 8)
    count, boxes = b.op("get_valid_counts", x, score_threshold=0)
    y = b.op("non_max_suppression", boxes, count, iou_threshold=50, name="nms")
    graph = b.build(y)
    with pytest.raises(UnsupportedError, match="nms: cannot batch: non_max_suppression over a batch is not portable"):
        batched(graph, 2)
    assert batched(graph, 1).nodes[-1].outputs[0].shape == (1, 5, 6)


def test_input_without_a_leading_1_and_bad_sizes():
    b = GraphBuilder()
    graph = b.build(b.op("relu", b.input("data", (2, 3), 8)))
    with pytest.raises(UnsupportedError, match="data: cannot batch: input shape .2, 3. must have a first dim"):
        batched(graph, 4)
    b = GraphBuilder()
    graph = b.build(b.op("relu", b.input("data", (1, 1 << 20), 8)))
    with pytest.raises(UnsupportedError, match="size exceeds 2"):
        batched(graph, 1 << 11)
    with pytest.raises(UnsupportedError, match="batch size must be >= 1"):
        batched(graph, 0)


def test_get_valid_counts_per_example():
    b = GraphBuilder()
    count, boxes = b.op("get_valid_counts", b.input("data", (1, 6, 5), 8), score_threshold=3)
    graph = b.build(count, boxes)
    x = np.random.default_rng(5).integers(-10, 10, (3, 6, 5)).astype(np.int32)
    x[1, :, 1] = -1  # no valid row in example 1
    check_batch(graph, x)


def test_cli_convert_batch_and_optimize(tmp_path):
    from cvm_onnx.app.cli import main
    from cvm_onnx.core.format import write_model

    b = GraphBuilder()
    x = b.input("data", (1, 2, 3, 3), 8)
    y = b.op("cvm_right_shift", b.op("conv2d", x, b.param("w", np.ones((2, 2, 1, 1)), 8), channels=2,
                                     kernel_size=(1, 1), use_bias=False), shift_bit=1, precision=8)
    graph = b.build(y)
    write_model(graph, tmp_path / "m")
    data = np.arange(-27, 27, dtype=np.int32).reshape(3, 2, 3, 3)
    assert main(["convert", str(tmp_path / "m"), "-o", str(tmp_path / "m.onnx"), "--batch", "3", "--optimize"]) == 0
    [got] = run(str(tmp_path / "m.onnx"), {"data": data})
    assert np.array_equal(got, singles(graph, data)[0])
    assert main(["convert", str(tmp_path / "m"), "-o", str(tmp_path / "n.onnx"), "--batch", "0"]) == 64  # a usage error
    assert not (tmp_path / "n.onnx").exists()
    args = ["convert", str(tmp_path / "m"), "-o", str(tmp_path / "n.onnx"), "--batch", "2", "--optimize", "--verify"]
    assert main(args) == 0  # the batched, optimized model checked against the batched CVM graph
    [got] = run(str(tmp_path / "n.onnx"), {"data": data[:2]})
    assert np.array_equal(got, singles(graph, data[:2])[0])


def test_a_batched_conversion_batches_the_graph_once(tmp_path, monkeypatch):
    """convert --batch N: the batch stage batches the graph and the export takes it as it is (it batched the
    one-sample graph again); the model takes N samples."""
    calls = []

    def counted(graph, n):
        calls.append(n)
        return batched(graph, n)

    exporter = sys.modules["cvm_onnx.converters.to_onnx.export"]
    monkeypatch.setattr(pipeline, "batched", counted)
    monkeypatch.setattr(exporter, "batched_graph", counted, raising=False)
    monkeypatch.setattr(exporter, "batched", counted, raising=False)
    cvm_onnx.convert(MODELS / "digits_cnn", tmp_path / "m.onnx", batch=3)
    assert calls == [3]
    model = onnx.load(tmp_path / "m.onnx")
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim][0] == 3


def test_a_batched_serving_plan_batches_the_graph_once(monkeypatch):
    """The bulk runner's onnxruntime plan exports the graph it batched (it batched the one-sample graph again);
    the model takes the chunk."""
    from cvm_onnx.runtime import bulk

    calls = []

    def counted(graph, n):
        calls.append(n)
        return batched(graph, n)

    graph = cvm_onnx.load(MODELS / "digits_cnn").graph
    exporter = sys.modules["cvm_onnx.converters.to_onnx.export"]
    monkeypatch.setattr(bulk, "batched", counted)
    monkeypatch.setattr(exporter, "batched_graph", counted, raising=False)
    monkeypatch.setattr(exporter, "batched", counted, raising=False)
    model = onnx.load_from_string(bulk.plan(graph, chunk=4, onnxruntime=True).model)
    assert calls == [4]
    assert [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim][0] == 4
