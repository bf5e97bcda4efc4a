"""Graph forms of a fourth sweep of architectures as torch exports them (benchmarks/fourth_architectures.py), each in
its minimal ONNX form: a time series' standardization over the time axis as PatchTST's and PatchTSMixer's scaler
writes it ((x - mean) / sqrt(var + eps) over axis 1 of (batch, time, channels), its mean and variance each a
ReduceSum of x times an observed mask of ones divided by the count)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.app.fusions import fuse_layernorm
from cvm_onnx.app.quantize import quantize
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify


def scaler(t: int, c: int, axis: int, eps: float, opset: int, ones: bool = True, summed: bool = True,
           count: int | None = None, mask_batch: int = 1, out: int = 4, traced: bool = False) -> onnx.ModelProto:
    """x (1, t, c) standardized over ``axis`` as torch's scaler exports it, then a MatMul to ``out`` features:
    x * ones (``ones``: the observed mask, a constant of shape (mask_batch, t, c)), ReduceSum over the axis /
    ``count`` (default: the count of elements summed; ``summed`` False: ReduceMean), x - mean, times ones, squared,
    the same mean of it, + eps, Sqrt, Div. ``traced``: as TorchScript writes it, the batch dynamic, the ones
    ConstantOfShape(Shape(x)) and the count Clip(ReduceSum(ones), 1)."""
    rng = np.random.default_rng(t * 31 + c)
    n = count if count is not None else (t, c)[axis % 3 - 1]
    inits = [nh.from_array(np.array([axis], np.int64), "axes"), nh.from_array(np.float32(2.0), "two"),
             nh.from_array(np.float32(eps), "eps"), nh.from_array(rng.normal(size=(c, out)).astype(np.float32), "w")]
    nodes = []
    if traced:
        inits.append(nh.from_array(np.float32(1.0), "one"))
        nodes.extend([h.make_node("Shape", ["x"], ["shape"]),
                      h.make_node("ConstantOfShape", ["shape"], ["ones"], value=nh.from_array(np.ones(1, np.float32))),
                      h.make_node("ReduceSum", ["ones", "axes"], ["n"], keepdims=1),
                      h.make_node("Clip", ["n", "one"], ["count"])])
    else:
        inits.extend([nh.from_array(np.ones((mask_batch, t, c), np.float32), "ones"),
                      nh.from_array(np.full((1, 1, c) if axis % 3 == 1 else (1, t, 1), n, np.float32), "count")])

    def masked(x: str, name: str) -> str:
        if ones:
            nodes.append(h.make_node("Mul", [x, "ones"], [name]))
            return name
        return x

    def mean(x: str, name: str) -> None:
        if summed:
            nodes.extend([h.make_node("ReduceSum", [x, "axes"], [name + "_sum"], keepdims=1),
                          h.make_node("Div", [name + "_sum", "count"], [name])])
        else:
            nodes.append(h.make_node("ReduceMean", [x, *(["axes"] if opset >= 18 else [])], [name], keepdims=1,
                                     **({} if opset >= 18 else {"axes": [axis]})))

    mean(masked("x", "xm"), "loc")
    nodes.append(h.make_node("Sub", ["x", "loc"], ["d"]))
    nodes.append(h.make_node("Pow", [masked("d", "dm"), "two"], ["sq"]))
    mean("sq", "var")
    nodes.extend([h.make_node("Add", ["var", "eps"], ["ve"]), h.make_node("Sqrt", ["ve"], ["sd"]),
                  h.make_node("Div", ["d", "sd"], ["z"]), h.make_node("MatMul", ["z", "w"], ["y"])])
    batch = "batch" if traced else 1
    g = h.make_graph(nodes, "scaler", [h.make_tensor_value_info("x", T.FLOAT, [batch, t, c])],
                     [h.make_tensor_value_info("y", T.FLOAT, [batch, t, out])], inits)
    return onnx_model(g, opset)


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@settings(max_examples=25, deadline=None)
@given(t=st.integers(2, 12), c=st.integers(1, 5), axis=st.sampled_from([1, -2, 2, -1]), eps=st.floats(1e-8, 1e-2),
       opset=st.sampled_from([17, 18]), ones=st.booleans(), summed=st.booleans(), seed=st.integers(0, 2**16),
       scale=st.sampled_from([1e-3, 1.0, 1e3]))
def test_a_scaler_over_any_axis_is_one_layernorm(t, c, axis, eps, opset, ones, summed, seed, scale):
    """The scaler becomes one LayerNormalization (scale 1, bias 0, its epsilon) over the reduced axis, moved last
    by a Transpose and back where it is not last; the Muls by ones and the ReduceSum / count go. Its output equals
    float64's (x - mean) / sqrt(var + eps) within float32's rounding (the fusion is a float rewrite), as the
    unfused model's does. Before: the axis had to be the last and the mean a ReduceMean, the scaler stayed
    written out (quantize refused its Div by a Sqrt)."""
    model = scaler(t, c, axis, eps, opset, ones, summed)
    x = (np.random.default_rng(seed).normal(size=(1, t, c)) * scale).astype(np.float32)
    want = run(model, x)
    fuse_layernorm(model)
    ops = [n.op_type for n in model.graph.node]
    last = axis % 3 == 2
    assert ops == ["LayerNormalization", "MatMul"] if last else ["Transpose", "LayerNormalization", "Transpose",
                                                                 "MatMul"]
    ln = model.graph.node[ops.index("LayerNormalization")]
    attrs = {a.name: h.get_attribute_value(a) for a in ln.attribute}
    inits = {i.name: nh.to_array(i) for i in model.graph.initializer}
    assert attrs["axis"] == -1 and attrs["epsilon"] == np.float32(eps)
    assert (inits[ln.input[1]] == 1).all() and (inits[ln.input[2]] == 0).all()
    assert inits[ln.input[1]].shape == ((c,) if last else (t,))
    x64 = x.astype(np.float64)
    d = x64 - x64.mean(axis, keepdims=True)
    z = d / np.sqrt((d * d).mean(axis, keepdims=True) + np.float64(np.float32(eps)))
    exact = z @ inits["w"].astype(np.float64)
    bound = 1e-5 * (np.abs(z) @ np.abs(inits["w"].astype(np.float64))) + 1e-6
    for got in (run(model, x), want):
        assert (np.abs(got - exact) <= bound).all()


def test_a_scaler_that_is_no_mean_is_left():
    """Left written out: a sum divided by another count (t - 1: the unbiased variance), and ones of a batch of 2
    (the Mul broadcasts x, a batch of 1, to 2)."""
    for model in (scaler(6, 3, 1, 1e-5, 18, count=5), scaler(6, 3, 1, 1e-5, 18, mask_batch=2)):
        fuse_layernorm(model)
        assert "LayerNormalization" not in {n.op_type for n in model.graph.node}
        assert "Sqrt" in {n.op_type for n in model.graph.node}


@pytest.mark.parametrize("traced", [False, True])
def test_a_scaler_quantizes_and_imports_whole(tmp_path, traced):
    """PatchTST's scaler over time (18 steps, 3 channels), as dynamo exports it (opset 18, constants) and as
    TorchScript does (opset 17, the mask and count from the input's Shape, folded by onnxruntime's optimizer at the
    batch fixed): refused before ('the divisor (Sqrt) must be quantized (QuantizeLinear) first'); imported whole
    per tensor and per channel by the LayerNormalization rule, as close to float as onnxruntime's quantized model
    (1.1x), the export exact."""
    onnx.save(scaler(18, 3, 1, 1e-5, 17 if traced else 18, traced=traced), tmp_path / "f.onnx")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "c.npy", (rng.normal(size=(24, 1, 18, 3)) * rng.uniform(0.1, 10, (24, 1, 1, 3))
                                 + rng.normal(size=(24, 1, 1, 3))).astype(np.float32))
    for per_channel in (False, True):
        done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / f"m{per_channel}", per_channel=per_channel)
        [a] = done.agreements
        assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
        assert [r for r in done.imported.requants if r.layernorm]
        assert verify(done.imported.graph, seeds=1).exact
