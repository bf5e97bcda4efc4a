"""The exporter end to end: ResNet-20 on onnxruntime reproduces the runtime's published output, random multi-op
graphs built from the registry are exact, and every exported model passes the checker and strict shape
inference, with identical bytes for identical input."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from harness import assert_exact, tensors
from hypothesis import given, settings
from hypothesis import strategies as st

import cvm_onnx
from cvm_onnx.converters.to_onnx import DOMAIN, to_onnx
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.graph import Graph, Node
from cvm_onnx.runtime.sessions import run


@pytest.mark.parametrize("inline", [False, True])
def test_resnet20_on_onnxruntime_reproduces_the_runtime(resnet_dir, resnet, inline):
    model = to_onnx(resnet, inline=inline)
    onnx.checker.check_model(model, full_check=True)
    x = np.load(resnet_dir / "input.npy")
    [y] = run(model, {"data": x.astype(np.int32)})
    assert np.array_equal(y, np.load(resnet_dir / "expected.npy"))


def test_resnet20_model_reads_well(resnet):
    """One node per CVM op, named as in CVM; shapes on every tensor; provenance in the metadata."""
    model = to_onnx(resnet)
    ops = [n for n in model.graph.node if n.domain == DOMAIN]
    assert len(ops) == sum(not n.is_variable for n in resnet.nodes)
    assert {n.name for n in ops} == {n.name for n in resnet.nodes if not n.is_variable}
    typed = {v.name for v in model.graph.value_info} | {v.name for v in model.graph.output}
    assert all(o in typed for n in ops for o in n.output)
    props = {p.key: p.value for p in model.metadata_props}
    assert props["converted_from"] == "CVM"
    assert all(f.doc_string for f in model.functions)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    assert len(inferred.graph.value_info) >= len(model.graph.value_info)


def test_export_is_deterministic(resnet_dir, resnet):
    first = to_onnx(resnet).SerializeToString(deterministic=True)
    assert to_onnx(cvm_onnx.load(resnet_dir).graph).SerializeToString(deterministic=True) == first


def test_unsupported_ops_are_listed_together():
    g = Graph([Node("data", "null", outputs=(cvm_onnx.core.graph.TensorType((2,), 8),)),
               Node("a", "frobnicate", (cvm_onnx.core.graph.Entry(0),)), Node("b", "twiddle", (cvm_onnx.core.graph.Entry(1),))],
              [cvm_onnx.core.graph.Entry(2)])
    with pytest.raises(UnsupportedError) as e:
        to_onnx(g)
    assert [p.where for p in e.value.problems] == ["a", "b"]


# -- random multi-op graphs ---------------------------------------------------------------------------------------
UNARY = ["relu", "abs", "negative", "cvm_precision"]


@st.composite
def graphs(draw):
    """A random chain-and-merge graph over a 4-D input, every precision kept within the runtime's rules by
    requantizing (cvm_right_shift) wherever a value grows past 16 bits, and feeding conv2d/dense 8-bit inputs."""
    b = GraphBuilder()
    c = draw(st.integers(1, 3))
    h = draw(st.integers(2, 5))
    x = b.input("data", (1, c, h, h), 8)
    live = [(x, (1, c, h, h), 8)]
    for k in range(draw(st.integers(1, 6))):
        e, shape, p = live[draw(st.integers(0, len(live) - 1))]
        kind = draw(st.sampled_from(["unary", "shift", "conv", "add", "mul", "pool", "clip"]))
        if kind == "unary":
            op = draw(st.sampled_from(UNARY))
            y, q = b.op(op, e), (6 if op == "cvm_precision" else p)
        elif kind == "shift" or p > 16:
            s = draw(st.integers(1, max(1, p - 1)))
            y, q = b.op("cvm_right_shift", e, precision=8, shift_bit=s), 8
        elif kind == "conv":
            if p > 8:
                e, p = b.op("cvm_clip", e, precision=8), 8
            oc = draw(st.integers(1, 3))
            w = draw(tensors((oc, shape[1], 3, 3), 8))
            bias = draw(tensors((oc,), 12))
            y = b.op("conv2d", e, b.param(f"w{k}", w, 8), b.param(f"b{k}", bias, 12), channels=oc,
                     kernel_size=(3, 3), padding=(1, 1))
            shape, q = (1, oc, shape[2], shape[3]), 8 + 8 + (shape[1] * 9).bit_length() + 1
            q = max(q, 13)
        elif kind == "add":
            y, q = b.op("elemwise_add", e, e), p + 1
        elif kind == "mul":
            y, q = b.op("broadcast_mul", e, b.param(f"m{k}", np.array([draw(st.integers(-100, 100))]), 8)), p + 8
        elif kind == "pool" and shape[2] >= 2:
            y = b.op("max_pool2d", e, pool_size=(2, 2), strides=(1, 1))
            shape = (1, shape[1], shape[2] - 1, shape[3] - 1)
            q = p
        else:
            y, q = b.op("cvm_clip", e, precision=draw(st.integers(1, 8))), 8
        live.append((y, shape, q))
    heads = [live[-1][0]] + ([live[draw(st.integers(0, len(live) - 1))][0]] if draw(st.booleans()) else [])
    graph = b.build(*heads)
    return graph, {"data": draw(tensors((1, c, h, h), 9))}


@settings(max_examples=25, deadline=None)
@given(case=graphs(), inline=st.booleans())
def test_random_graphs_are_exact(case, inline):
    graph, feeds = case
    assert_exact(graph, feeds, inline=inline)


@pytest.mark.parametrize("inline", [False, True])
def test_models_load_on_a_plain_onnxruntime_session(inline):
    """Exported models need none of the project's session options: relu then cvm_clip once tripped
    onnxruntime's Relu -> Clip fusion, which throws on int32 at session creation."""
    import onnxruntime as ort

    b = GraphBuilder()
    y = b.op("cvm_clip", b.op("relu", b.input("data", (4,), 8)), precision=4)
    model = to_onnx(b.build(y), inline=inline)
    session = ort.InferenceSession(model.SerializeToString())
    [out] = session.run(None, {"data": np.array([-5, 3, 9, 100], np.int32)})
    assert out.tolist() == [0, 3, 7, 7]
