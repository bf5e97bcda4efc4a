"""The importer's work grows with the model, not faster: counted in Python lines run (``lines_run``), not timed,
on models of n and 4n repeated parts, each rewrite's outcome checked exactly too."""
from __future__ import annotations

import functools
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import cvm_onnx
from cvm_onnx.app.rewrites import einsums_as_matmuls, masking_rows_apart, masks_after_biases, spectra_as_products
from cvm_onnx.converters.from_onnx.context import const
from cvm_onnx.converters.from_onnx.quantized.norm import layernorm_plan, per_distinct, real_values
from cvm_onnx.converters.from_onnx.quantized.values import Scaled

PACKAGE = str(Path(cvm_onnx.__file__).resolve().parent.parent)


def lines_run(fn):
    """(the Python lines run in this checkout's cvm_onnx and converters while ``fn()`` runs, its value)."""
    count, ours = [0], {}

    def line(frame, event, arg):
        count[0] += event == "line"
        return line

    def call(frame, event, arg):
        name = frame.f_code.co_filename
        if name not in ours:
            ours[name] = str(Path(name).resolve()).startswith(PACKAGE)
        return line if ours[name] else None

    sys.settrace(call)
    try:
        value = fn()
    finally:
        sys.settrace(None)
    return count[0], value


def rewritten(build, rewrite, layers: int) -> tuple[int, int, onnx.ModelProto, onnx.ModelProto]:
    """(the lines ``rewrite`` runs on a copy of ``build(layers)``, its count, the model, the copy rewritten)."""
    model = build(layers)
    apart = onnx.ModelProto()
    apart.CopyFrom(model)
    count, done = lines_run(lambda: rewrite(apart))
    return count, done, model, apart


def growth(build, rewrite, done) -> tuple[float, onnx.ModelProto, onnx.ModelProto]:
    """(the lines ``rewrite`` runs on 128 layers over those on 32 (``rewritten``), each rewriting ``done(layers)``
    parts; the last model and its copy rewritten), the modules ``rewrite`` imports imported first."""
    rewrite(build(1))
    (few, done_few, _, _), (many, done_many, model, apart) = (rewritten(build, rewrite, n) for n in (32, 128))
    assert (done_few, done_many) == (done(32), done(128))
    return many / few, model, apart


def same_float32(model: onnx.ModelProto, apart: onnx.ModelProto, feed: dict) -> bool:
    """Whether onnxruntime's outputs of the two models on ``feed`` are the same float32 values, bit for bit."""
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
                 for m in (model, apart))
    return np.array_equal(want, got)


def many_masked_layers(layers: int, s: int = 4, mask: bool = True) -> onnx.ModelProto:
    """x -> ``layers`` times Softmax(x + (b_l + m)), b_l a float bias of the layer's own, m HF's padding term
    (1 - mask) float32's min of an int64 mask input (``mask``; else m a float input, no mask's term)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.float32(1), "one"), numpy_helper.from_array(np.finfo(np.float32).min, "low"),
             numpy_helper.from_array(np.array([1, 2], np.int64), "axes")] if mask else []
    nodes = [h.make_node("Cast", ["mask"], ["m"], to=T.FLOAT), h.make_node("Sub", ["one", "m"], ["inv"]),
             h.make_node("Mul", ["inv", "low"], ["low_m"]),
             h.make_node("Unsqueeze", ["low_m", "axes"], ["term"])] if mask else []
    x = "x"
    for k in range(layers):
        inits.append(numpy_helper.from_array(rng.normal(size=(1, 1, s, s)).astype(np.float32), f"bias{k}"))
        nodes += [h.make_node("Add", [f"bias{k}", "term"], [f"biased{k}"]),
                  h.make_node("Add", [x, f"biased{k}"], [f"scores{k}"]),
                  h.make_node("Softmax", [f"scores{k}"], [f"y{k}"], axis=-1)]
        x = f"y{k}"
    graph = h.make_graph(nodes, "masked_layers", [h.make_tensor_value_info("x", T.FLOAT, [1, 1, s, s]),
                                                  h.make_tensor_value_info("mask", T.INT64, [1, s]) if mask else
                                                  h.make_tensor_value_info("term", T.FLOAT, [1, 1, s, s])],
                         [h.make_tensor_value_info(x, T.FLOAT, [1, 1, s, s])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_masks_after_biases_grows_linearly_with_the_layers():
    """Each layer's bias plus mask taken apart (x + b_l) + m: the lines run for 4n layers at most 4.5x those for n
    (each Add's place searched among the nodes, each bias's producers indexed again: 5.7x at n = 32, growing), and
    onnxruntime's float32 outputs of the rewritten model equal the model's, bit for bit."""
    ratio, model, apart = growth(many_masked_layers, masks_after_biases, lambda n: n)
    onnx.checker.check_model(apart)
    assert [n.op_type for n in apart.graph.node[4:8]] == ["Add", "Add", "Softmax", "Add"]
    assert same_float32(model, apart, {"x": np.random.default_rng(1).normal(size=(1, 1, 4, 4)).astype(np.float32),
                                       "mask": np.array([[1, 1, 0, 1]], np.int64)})
    assert ratio < 4.5, ratio


def test_masks_after_biases_leaves_terms_of_no_mask_as_they_were_in_linear_work():
    """Each layer's bias plus a float input (no mask's term) taken apart, then put back: the model as it was, byte
    for byte, the lines run for 4n layers at most 4.5x those for n (each Add's and bias's place searched among the
    nodes: 10.3x at n = 32)."""
    ratio, model, apart = growth(functools.partial(many_masked_layers, mask=False), masks_after_biases,
                                 lambda n: 0)
    assert apart.SerializeToString() == model.SerializeToString()
    assert ratio < 4.5, ratio


def test_a_layernorm_over_equal_gammas_makes_and_hashes_no_fraction_per_position(monkeypatch):
    """gamma and beta of n positions, one value each (a per-tensor dequantized constant, a float constant): one
    Fraction per distinct stored value, each divided by the output scale once, and the plan made with at most 200
    Fractions made and hashed for n = 4096 and 16384 (4096: 28698 made, 8194 hashed; 16384: 114847 and 131080: the
    pairs hashed per position at each table tried), every position's multiplier and offset its pair's."""
    n = 16384
    gamma = real_values(Scaled(const(np.full(n, 7, np.int8), T.INT8), np.asarray(Fraction(1, 64), object),
                               np.asarray(3)), n, "Scale")
    beta = real_values(const(np.full(n, 0.25, np.float32), T.FLOAT), n, "B")
    assert [len({id(x) for x in v}) for v in (gamma, beta)] == [1, 1]
    assert gamma[0] == Fraction(4, 64) and beta[-1] == Fraction(1, 4)
    counts = {"new": 0, "hash": 0}
    new, hashed = Fraction.__new__, Fraction.__hash__

    def counted_new(cls, *args, **kwargs):
        counts["new"] += 1
        return new(cls, *args, **kwargs)

    def counted_hash(self):
        counts["hash"] += 1
        return hashed(self)

    monkeypatch.setattr(Fraction, "__new__", counted_new)
    monkeypatch.setattr(Fraction, "__hash__", counted_hash)
    for size in (4096, n):
        counts.update(new=0, hash=0)
        g, b = (per_distinct(lambda v: v / Fraction(1, 16), x[:size]) for x in (gamma, beta))
        p = layernorm_plan(size, -128, 127, Fraction(1, 16), Fraction(1, 10**5), g, b, -128, 127)
        assert counts["new"] <= 200 and counts["hash"] <= 200, (size, counts)
        assert (p.multipliers == p.multipliers[0]).all() and (p.offsets == p.offsets[0]).all()
        assert p.multipliers.shape == p.offsets.shape == (size,)


def many_masking_tables(layers: int, s: int = 4) -> onnx.ModelProto:
    """x -> ``layers`` times Softmax(x + Transpose(Gather(t_l, idx))), t_l a table of 3 rows, its last -inf (a
    padding distance), idx an int64 input."""
    rng = np.random.default_rng(0)
    inits, nodes, x = [], [], "x"
    for k in range(layers):
        table = rng.normal(size=(3, 1)).astype(np.float32)
        table[2] = -np.inf
        inits.append(numpy_helper.from_array(table, f"table{k}"))
        nodes += [h.make_node("Gather", [f"table{k}", "idx"], [f"rows{k}"]),
                  h.make_node("Transpose", [f"rows{k}"], [f"bias{k}"], perm=[0, 3, 1, 2]),
                  h.make_node("Add", [x, f"bias{k}"], [f"scores{k}"]),
                  h.make_node("Softmax", [f"scores{k}"], [f"y{k}"], axis=-1)]
        x = f"y{k}"
    graph = h.make_graph(nodes, "masking_tables", [h.make_tensor_value_info("x", T.FLOAT, [1, 1, s, s]),
                                                   h.make_tensor_value_info("idx", T.INT64, [1, s, s])],
                         [h.make_tensor_value_info(x, T.FLOAT, [1, 1, s, s])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_masking_rows_apart_grows_linearly_with_the_layers():
    """Each layer's table of a masking row taken apart (its rows 0 plus a mask's term): the lines run for 4n layers
    at most 4.5x those for n (each Gather's and Add's place searched among the nodes: 12.4x at n = 32), and
    onnxruntime's float32 outputs of the rewritten model equal the model's, bit for bit."""
    ratio, model, apart = growth(many_masking_tables, masking_rows_apart, lambda n: n)
    onnx.checker.check_model(apart)
    assert same_float32(model, apart, {"x": np.random.default_rng(1).normal(size=(1, 1, 4, 4)).astype(np.float32),
                                       "idx": np.array([[[0, 1, 2, 1]] * 4], np.int64)})
    assert ratio < 4.5, ratio


def test_convert_validates_the_import_once(tmp_path, monkeypatch):
    """The import's graph has passed ``validate`` with its one input, data, as the runtime takes it: ``convert``
    writes it without validating it again (it did, twice per import); the model read back is the import's."""
    from support.quantized import small_qdq

    import cvm_onnx.app.api as api
    import cvm_onnx.converters.from_onnx.importer as importer

    onnx.save(small_qdq(tmp_path), tmp_path / "q.onnx")
    calls = []
    for module in (api, importer):
        monkeypatch.setattr(module, "validate", lambda *a, _v=module.validate, **k: calls.append(1) or _v(*a, **k))
    imported = api.convert(tmp_path / "q.onnx", tmp_path / "m")
    assert len(calls) == 1
    monkeypatch.undo()
    back = api.load(tmp_path / "m").graph
    assert (back.nodes, back.heads, list(back.params)) == (imported.graph.nodes, imported.graph.heads,
                                                          list(imported.graph.params))
    assert all(np.array_equal(back.params[k], v) for k, v in imported.graph.params.items())


def many_einsums(layers: int, s: int = 4, op: str = "Einsum") -> onnx.ModelProto:
    """x -> ``layers`` times Einsum('bi,ij->bj', x, w_l), w_l a float constant of the layer's own (``op`` MatMul:
    x w_l, the same products)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(s, s)).astype(np.float32), f"w{k}") for k in range(layers)]
    nodes = [h.make_node(op, ["x" if k == 0 else f"y{k - 1}", f"w{k}"], [f"y{k}"],
                         **({"equation": "bi,ij->bj"} if op == "Einsum" else {})) for k in range(layers)]
    graph = h.make_graph(nodes, "einsums", [h.make_tensor_value_info("x", T.FLOAT, [1, s])],
                         [h.make_tensor_value_info(f"y{layers - 1}", T.FLOAT, [1, s])], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_einsums_as_matmuls_grows_linearly_with_the_einsums():
    """Each Einsum by a constant replaced by a MatMul, in one pass, its constant dropped once no node reads it: the
    lines run for 4n Einsums at most 4.5x those for n (each constant's readers searched among all the nodes per
    Einsum: 8.6x at n = 32, growing), no Einsum or first constant left, and onnxruntime's float32 outputs of the
    rewritten model equal those of the model of MatMuls, bit for bit."""
    ratio, _, apart = growth(many_einsums, lambda m: einsums_as_matmuls(m.graph), lambda n: n)
    onnx.checker.check_model(apart)
    assert "Einsum" not in {n.op_type for n in apart.graph.node}
    assert not {f"w{k}" for k in range(128)} & {t.name for t in apart.graph.initializer}
    assert same_float32(many_einsums(128, op="MatMul"), apart,
                        {"x": np.random.default_rng(1).normal(size=(1, 4)).astype(np.float32)})
    assert ratio < 4.5, ratio


def many_dfts(layers: int, n: int = 8) -> onnx.ModelProto:
    """x (1, n, 2) -> ``layers`` times DFT along axis 1 of a length that a Constant node of the layer's own gives."""
    nodes = []
    for k in range(layers):
        nodes += [h.make_node("Constant", [], [f"len{k}"], value=numpy_helper.from_array(np.array(n, np.int64))),
                  h.make_node("DFT", ["x" if k == 0 else f"y{k - 1}", f"len{k}"], [f"y{k}"], axis=1)]
    graph = h.make_graph(nodes, "dfts", [h.make_tensor_value_info("x", T.FLOAT, [1, n, 2])],
                         [h.make_tensor_value_info(f"y{layers - 1}", T.FLOAT, [1, n, 2])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_spectra_as_products_grows_linearly_with_the_dfts():
    """Each DFT replaced by a MatMul by its matrix, in one pass, the Constant of its length pruned once no node
    reads it: the lines run for 4n DFTs at most 4.5x those for n (each replaced node's inputs' readers and producer
    searched among all the nodes, the graph indexed again per constant read: 12.5x at n = 32, growing), no DFT or
    Constant left."""
    ratio, _, apart = growth(many_dfts, spectra_as_products, lambda n: n)
    onnx.checker.check_model(apart)
    assert not {"DFT", "Constant"} & {n.op_type for n in apart.graph.node}
    assert ratio < 4.5, ratio
