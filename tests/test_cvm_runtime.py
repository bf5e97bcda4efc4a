"""The models this project reads and writes run on the CVM runtime itself exactly as on the reference executor,
element for element, on its CPU and FORMAL devices: the example models, ResNet-20 and models that
onnxruntime.quantization wrote and the quantized front imported; and each one's gas is the runtime's
(CVMAPIGetGasFromModel). Needs a local build of the runtime named by
CVM_RUNTIME_LIB (tests/cvm_runtime.py); skipped without one."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from cvm_runtime import CPU, FORMAL, LIB, CvmRuntime
from support.quantized import float_model, quantized

from cvm_onnx import load
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format import write_model

pytestmark = pytest.mark.skipif(not LIB, reason="CVM_RUNTIME_LIB names no local build of the CVM runtime")
DEVICES = {"cpu": CPU, "formal": FORMAL}


def reference(graph, x) -> np.ndarray:
    return np.concatenate([o.reshape(-1) for o in execute(graph, {"data": x})])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_dir", ["digits_cnn", "detection", "transforms", "resnet20"],
                         indirect=True)
def test_example_models(model_dir, device):
    model = load(model_dir)
    x = np.load(model_dir / "input.npy")
    runtime = CvmRuntime(LIB, model_dir, DEVICES[device])
    assert np.array_equal(runtime.run(x), reference(model.graph, x))
    assert runtime.gas() == model.gas.total


@pytest.mark.parametrize("fmt, activation, symmetric, per_channel",
                         list(itertools.product(["QDQ", "QOperator"], ["int8", "uint8"], [False, True], [False, True])))
def test_quantized_imports(tmp_path, fmt, activation, symmetric, per_channel):
    """A CNN with two branches joined by Add, an average pool and a Sigmoid head (a cvm_lut table)."""
    fm = float_model("Add", seed=3, opset=17, group=2, stride=1, pads=(0, 1, 2, 0), pool="avg", head="sigmoid")
    qm, shape = quantized(fm, tmp_path, fmt, activation, symmetric, per_channel)
    imp = import_model(qm)
    write_model(imp.graph, tmp_path / "cvm")
    gas = load(tmp_path / "cvm").gas.total
    rng = np.random.default_rng(0)
    xs = [imp.edges.input.quantize(rng.normal(size=shape).astype(np.float32) * 2) for _ in range(8)]
    for device in DEVICES.values():
        runtime = CvmRuntime(LIB, tmp_path / "cvm", device)
        assert runtime.gas() == gas
        for x in xs:
            assert np.array_equal(runtime.run(x), reference(imp.graph, x))


@pytest.mark.parametrize("dims, form", [
    (dict(s=9, d=32, heads=4, ff=64), dict(gelu="erf", ln="fused")),
    (dict(s=5, d=384, heads=6, ff=64), dict(gelu="tanh", ln="pow")),
])
def test_encoder_blocks(tmp_path, dims, form):
    """Issue 35's encoder blocks (tests/support/transformers.py) as `cvm-onnx quantize` imports them: attention's
    dense of two computed 8-bit tensors per head, LayerNorm (n = 384: V past 32 bits), the GELU table."""
    import onnx
    from support.transformers import encoder

    from cvm_onnx.app.quantize import quantize

    onnx.save(encoder(seed=1, **dims, **form), tmp_path / "f.onnx")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 1, dims["s"], dims["d"])).astype(np.float32))
    imp = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "cvm").imported
    assert "dense" in [nd.op for nd in imp.graph.nodes]
    xs = [imp.edges.input.quantize(rng.normal(size=(1, dims["s"], dims["d"])).astype(np.float32)) for _ in range(4)]
    for device in DEVICES.values():
        runtime = CvmRuntime(LIB, tmp_path / "cvm", device)
        for x in xs:
            assert np.array_equal(runtime.run(x), reference(imp.graph, x))


@pytest.mark.parametrize("op, attrs", [("LSTM", {}), ("GRU", {"linear_before_reset": 1}), ("GRU", {})])
def test_recurrent_layers(tmp_path, op, attrs):
    """Issue 35's unrolled LSTM and GRU (bidirectional, tests/test_transformers.py's model) as `cvm-onnx quantize`
    imports them: per-step dense of the computed h by R, gate tables, the state's shifts."""
    import onnx
    from test_transformers import lstm_model

    from cvm_onnx.app.quantize import quantize

    onnx.save(lstm_model("bidirectional", 0, steps=6, hidden=8, op=op, **attrs), tmp_path / "f.onnx")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 6, 1, 8)).astype(np.float32))
    imp = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "cvm").imported
    xs = [imp.edges.input.quantize(rng.normal(size=(6, 1, 8)).astype(np.float32)) for _ in range(4)]
    for device in DEVICES.values():
        runtime = CvmRuntime(LIB, tmp_path / "cvm", device)
        for x in xs:
            assert np.array_equal(runtime.run(x), reference(imp.graph, x))
