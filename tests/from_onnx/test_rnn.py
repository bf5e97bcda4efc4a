"""The ONNX RNN (tanh or sigmoid) unrolled into CVM ops (converters/from_onnx/quantized/recurrent.py): its steps equal
the integer oracle exactly; a whole layer between quantized tensors imports, exports bit-exactly and stays within
1.1x onnxruntime's quantized model's distance from float; Relu is refused naming the rule."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx.context import Importer, Tensor
from cvm_onnx.converters.from_onnx.quantized.recurrent import RNN_BITS, rnn_direction
from cvm_onnx.converters.from_onnx.quantized.values import Scaled
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.core.graph import Graph
from cvm_onnx.core.validate import validate
from cvm_onnx.runtime.verify import verify


def rnn_oracle(x, wq, rq, js, b256, h0, order, g, sigmoid):
    """The integer RNN for weights whose requantization is exact (s_x s_W = 2^-8, s_h s_R = j_r 2^-8, b a multiple
    of 2^-8): z = x W^T + (h R^T) j + 256 b clipped to +-4096, y = round(2^G f(z / 256)), h' = round_half_up(127 y
    / 2^G). Python integers."""
    f = (lambda v: 1 / (1 + math.exp(-v))) if sigmoid else math.tanh
    tab = [round((1 << g) * f(k / 256)) for k in range(-4096, 4097)]
    look = np.vectorize(lambda k: tab[int(k) + 4096], otypes=[object])
    h = np.rint(h0 * 127).astype(np.int64).astype(object)
    ys = {}
    for t in order:
        z = np.clip(x[t].astype(object) @ wq.T.astype(object) + (h @ rq.T.astype(object)) * js + b256, -4096, 4096)
        ys[t] = look(z)
        h = (ys[t] * 127 + (1 << (g - 1))) >> g
    return [ys[t] for t in order], h


@settings(max_examples=15, deadline=None)
@given(steps=st.integers(1, 5), batch=st.integers(1, 2), size=st.integers(1, 4), hidden=st.integers(1, 4),
       reverse=st.booleans(), states=st.booleans(), sigmoid=st.booleans(), seed=st.integers(0, 2**16))
def test_rnn_steps_equal_the_integer_form(steps, batch, size, hidden, reverse, states, sigmoid, seed):
    """``rnn_direction``'s unrolled steps equal the integer oracle exactly, on int8 inputs at the extremes, for
    weights quantized exactly (each row's largest |w| sets its scale) and any bias on 2^-8, h0 zero or not."""
    rng = np.random.default_rng(seed)

    def rows(shape):  # int8 rows whose largest |q| is 127
        q = rng.integers(-127, 128, shape)
        q[np.arange(shape[0]), rng.integers(0, shape[1], shape[0])] = 127 * rng.choice([-1, 1], shape[0])
        return q

    wq, rq = rows((hidden, size)), rows((hidden, hidden))
    js = rng.integers(1, 3, hidden)
    w = wq / 16.0  # s_W = 2^-4 with s_x = 2^-4: 2^-8
    r = rq * (127 * js[:, None] / 256.0)  # s_R = 127 j / 256 with s_h = 1 / 127: j 2^-8
    b = rng.integers(-512, 513, 2 * hidden) / 256.0
    h0 = rng.uniform(-1, 1, (batch, hidden)) if states else np.zeros((batch, hidden))
    x = rng.integers(-128, 128, (steps, batch, size))
    x.flat[0], x.flat[-1] = -128, 127
    order = list(range(steps))[::-1] if reverse else list(range(steps))
    ctx = Importer()
    data = ctx.variable("data", (steps, batch, size), 9)
    xs = Scaled(Tensor(T.INT8, (steps, batch, size), -128, 127, data), np.asarray(Fraction(1, 16), object),
                np.zeros((), np.int64))
    ys, hn = rnn_direction(ctx, xs, w, r, b, h0, order, sigmoid)
    graph = validate(Graph(ctx.nodes, tuple(t.entry for t in [*ys, hn]), ctx.params)).graph
    got = execute(graph, {"data": x.astype(np.int32)})
    b256 = ((b[:hidden] + b[hidden:]) * 256).astype(np.int64)
    wys, wh = rnn_oracle(x, wq, rq, js, b256, h0, order, RNN_BITS, sigmoid)
    for have, want in zip(got, [*wys, wh]):
        assert np.array_equal(have.astype(np.int64), np.asarray(want, np.int64).reshape(have.shape))
    assert verify(graph, x.astype(np.int32)).exact


def rnn_model(way: str, seed: int, steps=12, size=8, hidden=16, states=False, **attrs) -> onnx.ModelProto:
    """x (steps, 1, size) -> MatMul -> RNN (``way``, bias, initial_h when ``states``) -> MatMul by the identity:
    quantize_static quantizes the layer's input and output around the float layer."""
    rng = np.random.default_rng(seed)
    dirs = 2 if way == "bidirectional" else 1
    inits = {"w0": rng.normal(size=(size, size)) / 2, "W": rng.normal(size=(dirs, hidden, size)) / 2,
             "R": rng.normal(size=(dirs, hidden, hidden)) / 3, "B": rng.normal(size=(dirs, 2 * hidden)) / 3,
             "h0": rng.uniform(-1, 1, (dirs, 1, hidden)), "w1": np.eye(hidden)}
    ins = ["a", "W", "R", "B"] + (["", "h0"] if states else [])
    nodes = [h.make_node("MatMul", ["x", "w0"], ["a"]),
             h.make_node("RNN", ins, ["Y0"], hidden_size=hidden, direction=way, **attrs),
             h.make_node("MatMul", ["Y0", "w1"], ["y"])]
    g = h.make_graph(nodes, "rnn", [h.make_tensor_value_info("x", T.FLOAT, [steps, 1, size])],
                     [h.make_tensor_value_info("y", T.FLOAT, [steps, dirs, 1, hidden])],
                     [nh.from_array(np.asarray(v, np.float32), k) for k, v in inits.items() if k in ins + ["w0", "w1"]])
    m = onnx_model(g, 17)
    m.ir_version = 8
    return m


@pytest.mark.parametrize("way, states, attrs", [
    ("forward", False, {}), ("reverse", True, {}), ("bidirectional", True, {"activations": ["Tanh", "Sigmoid"]}),
    ("forward", True, {"activations": ["Sigmoid"]})])
def test_an_rnn_imports_whole_exact_and_as_close_to_float_as_onnxruntime(tmp_path, way, states, attrs):
    """An RNN between quantized tensors (refused before): unrolled, exported bit-exactly, its mean distance from
    the float model within 1.1x onnxruntime's quantized model's (which runs the layer in float)."""
    onnx.save(rnn_model(way, 0, states=states, **attrs), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(1).normal(size=(32, 12, 1, 8)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert [n.op for n in done.imported.graph.nodes].count("cvm_lut") >= 12 * (2 if way == "bidirectional" else 1)
    assert verify(done.imported.graph, seeds=1).exact


def test_an_rnn_with_relu_is_refused_naming_the_rule(tmp_path):
    onnx.save(rnn_model("forward", 0, steps=3, activations=["Relu"]), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(1).normal(size=(4, 3, 1, 8)).astype(np.float32))
    with pytest.raises(UnsupportedError, match="Relu's h is unbounded"):
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    assert not (tmp_path / "m").exists()
