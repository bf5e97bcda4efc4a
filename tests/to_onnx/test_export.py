"""The exporter end to end: ResNet-20 on onnxruntime reproduces the runtime's published output, random multi-op
graphs built from the registry are exact, and every exported model passes the checker and strict shape
inference, with identical bytes for identical input."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import assert_exact, graphs

import cvm_onnx
from cvm_onnx.converters.to_onnx import DOMAIN, to_onnx
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.graph import Graph, Node
from cvm_onnx.runtime.sessions import run

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.mark.parametrize("inline", [False, True])
def test_resnet20_on_onnxruntime_reproduces_expected(resnet_dir, resnet, inline):
    """expected.npy: the runtime's output for the on-chain model, the reference executor's for the stand-in."""
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


def test_the_export_record_holds_the_model_its_routes_and_passes():
    """``export`` returns the model ``to_onnx`` returns, with the serving form's conv2d routes (those its metadata
    ``cvm.routes`` states) and the names of the passes run, in order; the other forms have neither."""
    from cvm_onnx.converters.to_onnx.export import export
    from cvm_onnx.core.constants import ROUTES
    from cvm_onnx.serving import pipeline

    graph = cvm_onnx.load(MODELS / "digits_cnn").graph
    for form in ({}, {"inline": True}, {"target": cvm_onnx.Target.default()},
                 {"target": cvm_onnx.Target(products="float")}, {"target": cvm_onnx.Target.native()}):
        record = export(graph, **form)
        bytes_ = record.model.SerializeToString(deterministic=True)
        assert bytes_ == to_onnx(graph, **form).SerializeToString(deterministic=True)
        props = {p.key: p.value for p in record.model.metadata_props}
        if form.get("target"):
            assert record.passes == pipeline(form["target"]).names
            assert [list(r) for r in record.routes] == json.loads(props[ROUTES])
            assert {r[0] for r in record.routes} == {n.name for n in graph.nodes if n.op == "conv2d"}
        else:
            assert (record.routes, record.passes) == ((), ()) and ROUTES not in props
