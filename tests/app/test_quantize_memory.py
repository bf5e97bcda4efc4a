"""quantize keeps the float model on disk (its weights as external data) from its preparation to the comparison,
which runs it and the quantized model from their files (cvm_onnx.app.quantize): the comparison from the files equals
the one from the models in memory, and the float model returned holds every weight; LayerNorm fusion and constant
folding infer shapes on a copy without the weights, which infers what the whole model does."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper as nh
import pytest
from support.quantized import float_model
from support.transformers import encoder

from cvm_onnx.app.control_flow import fold_constants
from cvm_onnx.app.quantize import _tensors, compare, outputs, quantize, samples_of
from cvm_onnx.app.rewrites import shapes_only


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
    (tmp_path / "q.onnx").write_bytes(done.onnx_model)
    assert compare(tmp_path / "ext" / "f.onnx", tmp_path / "q.onnx", done.imported, samples) == from_memory
    a = outputs(done.float_model, done.onnx_model, done.imported, samples)
    for b in (outputs(tmp_path / "ext" / "f.onnx", done.onnx_model, done.imported, samples),
              outputs(tmp_path / "ext" / "f.onnx", tmp_path / "q.onnx", done.imported, samples)):
        assert all(np.array_equal(x, y) for xs, ys in zip(a, b) for x, y in zip(xs, ys))


def test_the_quantized_model_is_saved_in_one_file(tmp_path):
    """quantize_static writes the quantized model with external data; it is read back in and saved as one file,
    no tensor left external or marked with a location (as quantize_static writes a model in one file)."""
    onnx.save(encoder(seed=1, s=5, d=32, heads=4, ff=64, ln="pow"), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(1).normal(size=(4, 1, 5, 32)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m", save_onnx=tmp_path / "q.onnx",
                    per_channel=True)
    q = onnx.load(tmp_path / "q.onnx", load_external_data=False)
    assert max(t.ByteSize() for t in q.graph.initializer) >= 1024  # written out by quantize_static
    assert not [t.name for t in _tensors(q.graph) if t.HasField("data_location") or t.external_data]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.npy", "f.onnx", "m", "q.onnx"]
    assert (tmp_path / "q.onnx").read_bytes() == done.onnx_model



@pytest.mark.parametrize("ln, opset", [("pow", 17), ("mul", 18), ("fused", 17)])
def test_shape_inference_without_the_weights_equals_it_with_them(ln, opset):
    """An encoder (weights of 1 KB and more, small shape and axes constants that Reshape and ReduceMean read)."""
    m = encoder(seed=2, s=5, d=32, heads=4, ff=64, ln=ln, opset=opset, layers=2)
    light = shapes_only(m)
    assert all(t.ByteSize() < 1024 for t in light.graph.initializer)
    assert len(light.graph.initializer) < len(m.graph.initializer)
    want = onnx.shape_inference.infer_shapes(m).graph.value_info
    got = onnx.shape_inference.infer_shapes(light).graph.value_info
    assert len(want) > 20 and list(got) == list(want)


def test_constant_folding_infers_shapes_without_the_weights(monkeypatch):
    """fold_constants hands onnx's shape inference (which copies the model it gets four times over) no initializer
    of 1 KB or more, and folds what it folded with them: a 64x64 int8 weight's Cast and Mul by its scale, and the
    Shape of their product. Regression: the whole model, weights folded to float32 included (MiniLM-L6 int8:
    1.2 GB of peak for a 23 MB file)."""
    from onnx import TensorProto as T
    from onnx import helper as h

    from cvm_onnx.core.format.onnx_file import onnx_model

    q = np.random.default_rng(4).integers(-128, 128, (64, 64)).astype(np.int8)
    g = h.make_graph([h.make_node("Cast", ["q"], ["c"], to=T.FLOAT), h.make_node("Mul", ["c", "s"], ["w"]),
                      h.make_node("MatMul", ["x", "w"], ["p"]), h.make_node("Shape", ["p"], ["sp"]),
                      h.make_node("Reshape", ["p", "sp"], ["y"])], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [3, 64])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(q, "q"), nh.from_array(np.float32(0.25), "s")])
    m = onnx_model(g, 17)
    seen = []
    infer = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda model, *a, **k: seen.append(model.graph.initializer) or infer(model, *a, **k))
    assert fold_constants(m) == 3
    assert seen and all(t.ByteSize() < 1024 for inits in seen for t in inits)
    assert [n.op_type for n in m.graph.node] == ["MatMul", "Reshape"]
    assert np.array_equal(nh.to_array(next(t for t in m.graph.initializer if t.name == "w")), q * np.float32(0.25))
    assert np.array_equal(nh.to_array(next(t for t in m.graph.initializer if t.name == "sp")), [3, 64])


def test_onnxruntime_and_the_imports_run_without_the_imports_params_which_come_back_the_same(tmp_path, monkeypatch):
    """The import runs in a child first, then onnxruntime runs the float and the quantized model, then the one-part
    import (which records only its gas) in a child; the params of the import (written in the model's folder) are
    read back for the CVM model's run, after all of these, as they were: the names in order, the types, the values
    of the same import made alone (``convert`` of the quantized model). ``models=False``: neither model is
    returned."""
    from cvm_onnx.app import quantize as q
    from cvm_onnx.app.api import convert

    seen = []

    def recording(name, fn):
        def call(*args, **kwargs):
            seen.append(args[2] if name == "_apart" else name)
            if name == "run_many":
                seen.append(sum(v is not None for v in args[0].params.values()))
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(q, "has_two_parts", lambda imported: True)
    for name in ("_apart", "_run_onnx", "run_many"):
        monkeypatch.setattr(q, name, recording(name, getattr(q, name)))
    onnx.save(encoder(seed=1, s=5, d=32, heads=4, ff=64, ln="pow"), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(1).normal(size=(4, 1, 5, 32)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m", save_onnx=tmp_path / "q.onnx",
                    models=False)
    assert seen[:-1] == ["importing the quantized model", "_run_onnx", "_run_onnx", "the one-part import",
                         "run_many"]
    assert seen[-1] == len(done.imported.graph.params) > 10
    assert done.one_part_gas is not None and done.float_model is None and done.onnx_model is None
    assert (tmp_path / "q.onnx").stat().st_size > 0
    alone = convert(tmp_path / "q.onnx", tmp_path / "alone").graph.params
    got = done.imported.graph.params
    assert list(got) == list(alone) and len(got) > 10
    assert all(got[k].dtype == v.dtype and np.array_equal(got[k], v) for k, v in alone.items())
