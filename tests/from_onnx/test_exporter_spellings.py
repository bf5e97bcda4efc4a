"""Forms that exporters write for what CVM already imports (tf2onnx's LSTM with its default activations written out,
its attention's Gemm with beta 0 and no C, Q K^T as a Gemm of two computed tensors): each imports as the form it
spells, checked against that form's import (itself tested against the exact oracles) and exported bit-exactly."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from support.quantized import qdq
from support.transformers import lstm_model

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.runtime.verify import verify

RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255)}


def same_import(a: onnx.ModelProto, b: onnx.ModelProto):
    """Both models import to the same CVM graph (nodes, attributes and params in order, names apart); that graph."""
    ga, gb = import_model(a, input_precision=9).graph, import_model(b, input_precision=9).graph
    assert [(n.op, n.attrs) for n in ga.nodes] == [(n.op, n.attrs) for n in gb.nodes]
    assert len(ga.params) == len(gb.params)
    assert all(np.array_equal(p, q) for p, q in zip(ga.params.values(), gb.params.values()))
    return ga


def layer(m: onnx.ModelProto, op: str) -> onnx.NodeProto:
    return next(n for n in m.graph.node if n.op_type == op)


@pytest.mark.parametrize("op, way", [("LSTM", "forward"), ("LSTM", "bidirectional"), ("GRU", "reverse"),
                                     ("GRU", "bidirectional")])
def test_default_activations_written_out_import_as_the_defaults(tmp_path, op, way):
    """tf2onnx writes activations=[Sigmoid, Tanh, Tanh] (GRU: [Sigmoid, Tanh]) per direction: ONNX's defaults, so
    the same import as without the attribute (refused before as "other activations")."""
    onnx.save(lstm_model(way, 0, steps=4, size=4, hidden=4, op=op), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(1).normal(size=(8, 4, 1, 4)).astype(np.float32))
    quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m", save_onnx=tmp_path / "q.onnx")
    plain = onnx.load(tmp_path / "q.onnx")
    spelled = onnx.load(tmp_path / "q.onnx")
    dirs = 2 if way == "bidirectional" else 1
    acts = (["Sigmoid", "Tanh", "Tanh"] if op == "LSTM" else ["Sigmoid", "Tanh"]) * dirs
    layer(spelled, op).attribute.append(h.make_attribute("activations", acts))
    assert verify(same_import(plain, spelled), seeds=1).exact
    for other in ([*acts[:-1], "Relu"], acts[:len(acts) // dirs] if dirs == 2 else acts * 2):
        node = layer(spelled, op)
        node.ClearField("attribute")
        node.attribute.extend(layer(plain, op).attribute)
        node.attribute.append(h.make_attribute("activations", other))
        with pytest.raises(UnsupportedError, match=f"{op} with layout 1, clip.*other activations"):
            import_model(spelled, input_precision=9)
    node.attribute.append(h.make_attribute("activation_alpha", [1.0] * len(acts)))
    with pytest.raises(UnsupportedError, match="other activations"):
        import_model(spelled, input_precision=9)


def gemm_model(m: int, n: int, k: int, x_type: int, s: float, zx: int, so: float, zo: int, spelled: bool,
               trans_b: bool, beta: float | None) -> onnx.ModelProto:
    """x (m + n, k) integers, dequantized; A its first m rows, B the next n rows (transposed to (k, n) unless
    ``trans_b``); ``spelled``: Gemm(A, B, transB, beta), else MatMul(A, B^T); quantized to int8 at (so, zo)."""
    inits = {"s": np.float32(s), "zx": np.array(zx, np.int8 if x_type == T.INT8 else np.uint8),
             "so": np.float32(so), "zo": np.int8(zo), "a0": np.array([0], np.int64), "a1": np.array([m], np.int64),
             "b1": np.array([m + n], np.int64), "ax": np.array([0], np.int64)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("Slice", ["xf", "a0", "a1", "ax"], ["a"]),
             h.make_node("Slice", ["xf", "a1", "b1", "ax"], ["rows"])]
    if spelled and trans_b:
        attrs = {"transB": 1} | ({} if beta is None else {"beta": beta})
        nodes.append(h.make_node("Gemm", ["a", "rows"], ["p"], **attrs))
    else:
        nodes.append(h.make_node("Transpose", ["rows"], ["b"], perm=[1, 0]))
        attrs = {} if beta is None else {"beta": beta}
        nodes.append(h.make_node("Gemm", ["a", "b"], ["p"], **attrs) if spelled else h.make_node("MatMul", ["a", "b"],
                                                                                                 ["p"]))
    nodes.append(h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"]))
    return qdq(nodes, (m + n, k), x_type, inits, T.INT8)


@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 5), n=st.integers(1, 5), k=st.integers(1, 40), x_type=st.sampled_from([T.INT8, T.UINT8]),
       s=st.floats(2.0**-6, 2.0**-1, width=32), so=st.floats(2.0**-4, 2.0**2, width=32), zo=st.integers(-128, 127),
       zfrac=st.floats(0, 1), trans_b=st.booleans(), beta=st.sampled_from([None, 0.0, 0.5, 3.0]),
       seed=st.integers(0, 2**16))
def test_gemm_of_two_computed_tensors_is_the_matmul(m, n, k, x_type, s, so, zo, zfrac, trans_b, beta, seed):
    """Gemm(A, B) of two computed tensors, B transposed or not, any beta without C: the import of MatMul(A, B^T)
    (``variable_matmul``, tested against numpy's exact integer product), on inputs at the type's extremes."""
    lo, hi = RANGE[x_type]
    zx = lo + round(zfrac * (hi - lo))
    args = (m, n, k, x_type, s, zx, so, zo)
    graph = same_import(gemm_model(*args, True, trans_b, beta), gemm_model(*args, False, trans_b, None))
    x = np.random.default_rng(seed).integers(lo, hi + 1, (m + n, k))
    x.flat[0], x.flat[-1] = lo, hi
    assert verify(graph, x.astype(np.int32)).exact
    assert execute(graph, {"data": x.astype(np.int32)})[0].shape == (m, n)


@pytest.mark.parametrize("beta", [0.0, 0.5, 3.0])
def test_gemm_beta_without_c_is_the_product(beta):
    """A Gemm by a constant weight with no C (tf2onnx writes beta 0): beta scales nothing, the import is beta 1's;
    with a float C that no DequantizeLinear produced and beta 0, C is unread; with beta other than 0 it is put on the
    product's grid (tests/from_onnx/test_gemm_float_c.py; a dequantized C of any beta: test_gemm_factors.py)."""
    rng = np.random.default_rng(3)
    inits = {"s": np.float32(0.05), "zx": np.int8(3), "w": rng.integers(-127, 128, (6, 5)).astype(np.int8),
             "sw": np.float32(0.02), "zw": np.int8(0), "c": rng.normal(size=6).astype(np.float32),
             "so": np.float32(0.3), "zo": np.int8(-2)}

    def model(attrs, with_c=False):
        return qdq([h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
                    h.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"]),
                    h.make_node("Gemm", ["xf", "wf"] + (["c"] if with_c else []), ["p"], transB=1, **attrs),
                    h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])], (4, 5), T.INT8, inits, T.INT8)

    verify(same_import(model({"beta": beta}), model({})), seeds=1)
    if beta == 0.0:
        same_import(model({"beta": beta}, with_c=True), model({}))
    else:
        assert verify(import_model(model({"beta": beta}, with_c=True), input_precision=9).graph, seeds=1).exact
