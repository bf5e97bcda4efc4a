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
from support import recurrent as rec

from cvm_onnx.app.quantize import quantize
from cvm_onnx.converters.from_onnx.context import Importer, Tensor
from cvm_onnx.converters.from_onnx.quantized.recurrent import RNN_BITS, rnn_direction
from cvm_onnx.converters.from_onnx.quantized.values import Scaled
from cvm_onnx.converters.from_onnx.registry import Refuse
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.core.graph import Graph
from cvm_onnx.core.validate import validate
from cvm_onnx.runtime.verify import verify


def rnn_oracle(x, w16, e_w, r16, e_r, bias, h0, order, g, sigmoid):
    """The integer RNN of docs/import.md: z from x W^T + b and h R^T on 2^-14 (support.recurrent), rounded to
    2^-10 and clipped to +-16, y = round(2^G f(z / 1024)), h' = rhu(127 y, G - 7) at 1/16256. Python integers."""
    sig, tnh = rec.gate_tables(g)
    h = rec.state(h0)
    xf = [rec.x_part(x[t], w16, e_w, bias) for t in range(len(x))]
    ys = {}
    for t in order:
        ys[t] = rec.lookup(sig if sigmoid else tnh, rec.index(xf[t] + rec.h_part(h, r16, e_r)))
        h = rec.rhu(ys[t] * 127, g - 7)
    return [ys[t] for t in order], h


@settings(max_examples=15, deadline=None)
@given(steps=st.integers(1, 5), batch=st.integers(1, 2), size=st.integers(1, 4), hidden=st.integers(1, 4),
       reverse=st.booleans(), states=st.booleans(), sigmoid=st.booleans(),
       e_w=st.one_of(st.integers(12, 22), st.sampled_from([40, 140])),
       e_r=st.one_of(st.integers(17, 24), st.sampled_from([45, 150])), seed=st.integers(0, 2**16))
def test_rnn_steps_equal_the_integer_form(steps, batch, size, hidden, reverse, states, sigmoid, e_w, e_r, seed):
    """``rnn_direction``'s unrolled steps equal the integer oracle exactly, on int8 inputs at the extremes, for
    16-bit weights at power-of-two scales from |W| <= 64 to 0.06 and |R| <= 16 to 0.12 (products shifted left and
    right) and tiny ones (2^-26 to 2^-136: products shifted out), any float bias, h0 zero or not."""
    rng = np.random.default_rng(seed)
    w16, r16 = rec.ints16(rng, (hidden, size)), rec.ints16(rng, (hidden, hidden))
    w = w16 * 2.0 ** (4 - e_w)  # s_x = 2^-4: s_x s_W = 2^-e_w
    r = r16 * 127 * 2.0 ** -e_r
    b = rng.normal(size=2 * hidden)
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
    wys, wh = rnn_oracle(x, w16, e_w, r16, e_r, b[:hidden] + b[hidden:], h0, order, RNN_BITS, sigmoid)
    for have, want in zip(got, [*wys, wh]):
        assert np.array_equal(have.astype(np.int64), np.asarray(want, np.int64).reshape(have.shape))
    assert verify(graph, x.astype(np.int32)).exact


@pytest.mark.parametrize("w, r, b, why", [
    (1e30, 0.5, 0.0, r"reaches 2\^\d+: beyond CVM's 32 bits"),
    (0.5, 1e30, 0.0, r"reaches 2\^\d+: beyond CVM's 32 bits"),
    (np.nan, 0.5, 0.0, "NaN or infinity"), (0.5, np.inf, 0.0, "NaN or infinity"),
    (0.5, 0.5, 1e9, r"bias reaches 2e\+09: beyond 2\^30 steps of 2\^-14")])
def test_values_beyond_the_labels_are_refused_naming_the_rule(w, r, b, why):
    """Weights whose products on 2^-14 pass 32 bits, non-finite ones, and a bias beyond 2^30 steps of 2^-14 are
    refused in one line (no overflow)."""
    ctx = Importer()
    data = ctx.variable("data", (3, 1, 2), 9)
    xs = Scaled(Tensor(T.INT8, (3, 1, 2), -128, 127, data), np.asarray(Fraction(1, 16), object),
                np.zeros((), np.int64))
    with pytest.raises(Refuse, match=why):
        rnn_direction(ctx, xs, np.full((2, 2), w), np.full((2, 2), r), np.full(4, b), np.full((1, 2), 0.5),
                      [0, 1, 2], False)


def test_weights_and_tables_are_one_param_however_many_steps():
    """R's three int8 weights and the table are params once per direction: more steps add no params but
    scalars."""
    def params(steps: int) -> int:
        ctx = Importer()
        data = ctx.variable("data", (steps, 1, 3), 9)
        xs = Scaled(Tensor(T.INT8, (steps, 1, 3), -128, 127, data), np.asarray(Fraction(1, 16), object),
                    np.zeros((), np.int64))
        rng = np.random.default_rng(0)
        ys, h = rnn_direction(ctx, xs, rng.normal(size=(4, 3)), rng.normal(size=(4, 4)), rng.normal(size=8),
                              np.zeros((1, 4)), list(range(steps)), False)
        graph = validate(Graph(ctx.nodes, tuple(t.entry for t in ys), ctx.params)).graph
        return sum(n.is_variable and math.prod(n.outputs[0].shape) > 1 for n in graph.nodes)

    assert params(2) == params(9)  # scalars (shifts' multipliers) aside


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
    the float model within 1.02x onnxruntime's quantized model's (which runs the layer in float)."""
    onnx.save(rnn_model(way, 0, states=states, **attrs), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(1).normal(size=(32, 12, 1, 8)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.02 * a.ort_mean_steps, a.line()
    assert [n.op for n in done.imported.graph.nodes].count("cvm_lut") >= 12 * (2 if way == "bidirectional" else 1)
    assert verify(done.imported.graph, seeds=1).exact


def test_an_rnn_with_relu_is_refused_naming_the_rule(tmp_path):
    onnx.save(rnn_model("forward", 0, steps=3, activations=["Relu"]), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(1).normal(size=(4, 3, 1, 8)).astype(np.float32))
    with pytest.raises(UnsupportedError, match="Relu's h is unbounded"):
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    assert not (tmp_path / "m").exists()
