"""quantize's own calibration (cvm_onnx.app.calibration) computes the ranges onnxruntime's calibrators compute, for
each method quantize offers, on random small models and data of any scale (zeros, constants, one sign, 1e-6 to
1e6); and quantize's files are those of quantize_static calibrating by itself."""
from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st
from support.quantized import float_model
from support.transformers import encoder

from cvm_onnx.app import calibration
from cvm_onnx.app.quantize import METHODS, quantize, quiet_onnxruntime


def _model(kind: str, seed: int) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    if kind == "encoder":
        return encoder(seed=seed, s=5, d=16, heads=2, ff=32), (1, 5, 16)
    m = float_model("Concat", seed=seed, opset=13, group=2, stride=1, pads=(1, 1, 1, 1), pool="max", head="sigmoid")
    return m, tuple(d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim)


def _samples(rng: np.random.Generator, pattern: str, scale: float, count: int, shape) -> np.ndarray:
    x = rng.normal(size=(count, *shape)) * scale
    if pattern == "zeros":
        x[:] = 0
    elif pattern == "constant":
        x[:] = scale
    elif pattern == "positive":
        x = np.abs(x)
    elif pattern == "negative":
        x = -np.abs(x)
    elif pattern == "spike":  # one value far beyond the rest
        x.reshape(count, -1)[rng.integers(count), rng.integers(x[0].size)] = 1e4 * scale
    return x.astype(np.float32)


def _onnxruntime_ranges(path, name, samples, shape, method, tmp_path):
    from onnxruntime.quantization import CalibrationMethod, create_calibrator
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    reader = iter([{name: x.reshape(shape)} for x in samples])
    cal = create_calibrator(path, list(set(QLinearOpsRegistry) | set(QDQRegistry)),
                            augmented_model_path=str(tmp_path / "augmented_ort.onnx"),
                            calibrate_method=getattr(CalibrationMethod, METHODS[method]),
                            use_external_data_format=True, extra_options={})
    cal.collect_data(type("R", (), {"get_next": lambda self: next(reader, None)})())
    return cal.compute_data()


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(["cnn", "encoder"]), seed=st.integers(0, 2**16), method=st.sampled_from(list(METHODS)),
       pattern=st.sampled_from(["normal", "zeros", "constant", "positive", "negative", "spike"]),
       scale=st.sampled_from([1e-6, 1e-3, 1.0, 37.5, 1e6]), count=st.integers(1, 4))
def test_the_ranges_are_onnxruntime_calibrators(tmp_path_factory, kind, seed, method, pattern, scale, count):
    tmp = tmp_path_factory.mktemp("cal")
    model, shape = _model(kind, seed)
    path = tmp / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    name = model.graph.input[0].name
    samples = _samples(np.random.default_rng(seed), pattern, scale, count, shape[1:] if kind == "encoder" else shape)
    with quiet_onnxruntime():
        try:
            want = _onnxruntime_ranges(path, name, samples, shape, method, tmp)
        except ValueError as e:  # numpy's histogram: "Too many bins for data range" (a constant 1e6): ours too
            with pytest.raises(ValueError, match=str(e)):
                calibration.ranges(path, name, samples, shape, method)
            return
        got = calibration.ranges(path, name, samples, shape, method)
    assert got.calibration_method == want.calibration_method
    assert sorted(got.keys()) == sorted(want.keys()) and len(want.keys()) > 5
    for t in want.keys():
        w, g = want[t], got[t]
        assert sorted(g._attrs) == sorted(w._attrs), t
        assert all(_same(getattr(g, k), getattr(w, k)) for k in w._attrs), (t, w.to_dict(), g.to_dict())
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("m-")]  # ours left nothing behind


def _digests(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("method, per_channel, form", [("minmax", True, "qdq"), ("entropy", False, "qdq"),
                                                       ("percentile", True, "qdq"), ("minmax", False, "qoperator"),
                                                       ("percentile", True, "qoperator")])
def test_quantize_writes_what_quantize_static_calibrating_itself_writes(tmp_path, monkeypatch, method, per_channel,
                                                                        form):
    """An encoder in QDQ form; a CNN in QOperator form (which has no LayerNormalization). Each method and form
    once at least, weights per tensor and per channel (which quantize the weights, not the ranges calibrated)."""
    if form == "qdq":
        model, shape = encoder(seed=3, s=5, d=32, heads=4, ff=64, ln="pow"), (1, 5, 32)
    else:
        model, shape = _model("cnn", 3)
    onnx.save(model, tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(3).normal(size=(4, *shape)).astype(np.float32))
    ours = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "a", method=method, per_channel=per_channel,
                    form=form)
    monkeypatch.setattr(calibration, "applies", lambda model: False)  # quantize_static's own calibrator
    theirs = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "b", method=method,
                      per_channel=per_channel, form=form)
    assert ours.onnx_model == theirs.onnx_model
    assert _digests(tmp_path / "a") == _digests(tmp_path / "b")
    assert ours.agreements == theirs.agreements


def test_below_opset_10_quantize_static_calibrates_itself():
    """quantize_static converts a model below opset 10 before calibrating it: ``ranges`` does not apply."""
    m = encoder(seed=0, s=5, d=16, heads=2, ff=32)
    assert calibration.applies(m)
    m.opset_import[0].version = 9
    assert not calibration.applies(m)


def test_the_reduce_nodes_go_before_each_first_reader_in_linear_time():
    """minmax's ReduceMin/ReduceMax pairs of 1001 tensors of a chain of 2000 nodes (an unrolled Loop's form): each
    pair just before its tensor's first reader (a graph output's at the end), in the tensors' order. Each tensor
    searched the graph for its first reader and each node was inserted on its own: 2.6-3.4 s for 601 tensors and
    127-142 s for 4001 (load 6-7), where this takes 0.08 s and 0.96 s."""
    import time

    from onnx import TensorProto as T
    from onnx import helper as h

    nodes, x = [], "x"
    for k in range(1000):
        nodes += [h.make_node("Relu", [x], [f"a{k}"]), h.make_node("Add", [f"a{k}", x], [f"y{k}"])]
        x = f"y{k}"
    m = onnx.shape_inference.infer_shapes(h.make_model(h.make_graph(
        nodes, "chain", [h.make_tensor_value_info("x", T.FLOAT, [2])], [h.make_tensor_value_info(x, T.FLOAT, [2])]),
        opset_imports=[h.make_opsetid("", 17)]))
    tensors = ["x"] + [f"y{k}" for k in range(1000)]
    start = time.monotonic()
    names = calibration._add_reduce_min_max(m, tensors)
    assert time.monotonic() - start < 5
    assert names == [f"{t}_{op}" for t in tensors for op in ("ReduceMin", "ReduceMax")]
    ops = [n.op_type for n in m.graph.node]
    assert len(ops) == 2000 + 4 * 1001
    at = {n.name: i for i, n in enumerate(m.graph.node)}
    first = {}
    for i, n in enumerate(m.graph.node):
        for t in n.input:
            first.setdefault(t, i)
    for t in tensors[:-1]:  # the pair, then the tensor's first reader of the chain
        assert at[f"{t}_ReduceMin"] < at[f"{t}_ReduceMin_Reshape"] < at[f"{t}_ReduceMax"] < \
            at[f"{t}_ReduceMax_Reshape"] == at[f"{t}_ReduceMin"] + 3
        assert m.graph.node[at[f"{t}_ReduceMax_Reshape"] + 1].op_type == "Relu"
    assert [n.op_type for n in m.graph.node[-4:]] == ["ReduceMin", "Reshape", "ReduceMax", "Reshape"]
