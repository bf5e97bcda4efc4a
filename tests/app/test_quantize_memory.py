"""quantize keeps the float model on disk (its weights as external data) from its preparation to the comparison,
which runs it from there (cvm_onnx.app.quantize): the comparison from the file equals the one from the model in
memory, and the float model returned holds every weight."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper as nh
from support.quantized import float_model

from cvm_onnx.app.quantize import compare, outputs, quantize, samples_of


def test_the_comparison_from_the_file_equals_the_one_from_memory(tmp_path):
    fm = float_model("Add", seed=3, opset=17, group=2, stride=1, pads=(0, 1, 2, 0), pool="avg", head="sigmoid")
    onnx.save(fm, tmp_path / "f.onnx")
    rng = np.random.default_rng(0)
    shape = [d.dim_value for d in fm.graph.input[0].type.tensor_type.shape.dim]
    np.save(tmp_path / "c.npy", rng.normal(size=(6, *shape[1:])).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")

    want = {t.name: nh.to_array(t) for t in fm.graph.initializer}
    got = {t.name: nh.to_array(t) for t in done.float_model.graph.initializer}
    assert want.keys() <= got.keys() and all(np.array_equal(got[k], v) for k, v in want.items())

    (tmp_path / "ext").mkdir()
    disk = onnx.ModelProto()
    disk.CopyFrom(done.float_model)
    onnx.save(disk, tmp_path / "ext" / "f.onnx", save_as_external_data=True, location="w.data", size_threshold=0)
    assert not any(t.raw_data for t in onnx.load(tmp_path / "ext" / "f.onnx", load_external_data=False).graph
                   .initializer)
    _, _, samples = samples_of(done.float_model, tmp_path / "c.npy")
    from_memory = compare(done.float_model, done.onnx_model, done.imported, samples)
    assert compare(tmp_path / "ext" / "f.onnx", done.onnx_model, done.imported, samples) == from_memory
    assert from_memory == done.agreements
    a = outputs(done.float_model, done.onnx_model, done.imported, samples)
    b = outputs(tmp_path / "ext" / "f.onnx", done.onnx_model, done.imported, samples)
    assert all(np.array_equal(x, y) for xs, ys in zip(a, b) for x, y in zip(xs, ys))

