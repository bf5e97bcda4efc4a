"""What an eighth corpus of vision models shipped in wheels met in quantize: LayerNormalization over 256-383 values
of full-range 8-bit integers (SVTRv2's and TesseraNet's 320), where V = n^2 var fits 32 bits but the labels of its
steps do not (n sum u^2 takes label(n w^2 / 4) + label(n) bits); the form takes the quartered variance there,
equal to the integer oracle and within its bound of float. A Cast of a dequantized value to float32 (TesseraNet's
before its mask output, which onnxruntime's optimizer keeps): the value itself. A Sub of a constant from the float
input (TesseraNet's (x - mean) / std inside the model): quantize_static quantizes no Sub and left the input float;
it is the Add of -c, the same float32 operation. A -inf in a Constant node (TesseraNet's cross-attention mask
Where(m, 0, -inf)): refused in one line naming it, as an initializer's is. Div and Mul of a dequantized value by a
constant of several values (its per-channel std): the scale per element, requantized exactly. An Einsum of two
computed tensors with several free letters of one (TesseraNet's bcd,bdhw->bchw): a batched MatMul between
Reshapes. A graph whose tensors need more than the runtime's 2^32 bytes of storage (PP-OCRv3's multilingual
detector at its declared 960 x 960: 9.0e9 bytes) is refused by validation, naming the bound, as the runtime refuses
to load it."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from support.quantized import Oracle, qdq
from test_quantized_rules import check_layernorm

from cvm_onnx.app.quantize import quantize
from cvm_onnx.app.rewrites import input_subs_as_adds
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.converters.from_onnx.quantized.norm import layernorm_plan
from cvm_onnx.core.builder import GraphBuilder
from cvm_onnx.core.errors import UnsupportedError, ValidationError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.core.graph import Graph
from cvm_onnx.core.validate import MAX_STORAGE, storage_bytes, validate
from cvm_onnx.runtime.verify import verify

NP = {T.INT8: np.int8, T.UINT8: np.uint8}
RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255)}


@settings(max_examples=10, deadline=None)
@given(n=st.integers(129, 383), x_type=st.sampled_from([T.INT8, T.UINT8]),
       kind=st.sampled_from(["random", "extremes", "band", "one off"]), has_beta=st.booleans(),
       seed=st.integers(0, 2**16))
@example(n=320, x_type=T.UINT8, kind="extremes", has_beta=True, seed=0)
@example(n=256, x_type=T.INT8, kind="random", has_beta=False, seed=1)
def test_layernorm_whose_variance_steps_pass_32_bit_labels_imports(n, x_type, kind, has_beta, seed):
    """n = 129..383 over the whole 8-bit range: imports (it was refused from n = 256 on, 'precision bound exceeded:
    broadcast_mul of inputs with precisions [24, 10] needs 34 bits'), equal to the oracle, every unsaturated
    output within 1/2 + delta of the float LayerNormalization (check_layernorm)."""
    rng = np.random.default_rng(seed)
    lo, hi = (-128, 127) if x_type == T.INT8 else (0, 255)
    c = int(rng.integers(lo + 20, hi - 20))
    x = {"random": lambda: rng.integers(lo, hi + 1, (2, n)),
         "extremes": lambda: np.where(rng.integers(0, 2, (2, n)) == 0, lo, hi),
         "band": lambda: np.clip(c + rng.integers(-2, 3, (2, n)), lo, hi),
         "one off": lambda: np.where(np.arange(n) == rng.integers(0, n), hi, np.full((2, n), c))}[kind]()
    zx = int(rng.integers(-20, 20)) + (0 if x_type == T.INT8 else 128)
    gamma = rng.integers(-127, 128, n)
    beta = rng.integers(-3000, 3000, n) if has_beta else None
    check_layernorm(x.shape, -1, x_type, T.UINT8, 0.027, 0.05, 1e-5, 0.006, False, zx, 75, gamma, beta, x,
                    must_import=True)


def test_the_direct_variance_is_kept_where_its_labels_fit():
    """255 values of [0, 255] keep V's direct steps (no quartering: labels 23 + 9, 2 x 16 and 31 + 1 bits); 256
    quarter it."""
    g = np.array([Fraction(1)] * 256, dtype=object)
    assert layernorm_plan(255, 0, 255, Fraction(1, 16), Fraction(1, 10**5), g[:255], g[:255] * 0, 0, 255).quarter == 0
    assert layernorm_plan(256, 0, 255, Fraction(1, 16), Fraction(1, 10**5), g, g * 0, 0, 255).quarter >= 1


def cast_model(x_type: int, shape: tuple[int, ...], s: float, zx: int, where: str, cast: bool, to: int = T.FLOAT):
    """DequantizeLinear of x, [a Cast to ``to``,] then the graph output (where = "output"), or a Transpose and a
    QuantizeLinear to uint8 at scale 0.02 (where = "inside")."""
    inits = {"s": np.float32(s), "zx": NP[x_type](zx), "so": np.float32(0.02), "zo": np.uint8(7)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf" if cast or where == "inside" else "y"])]
    v = "xf"
    if cast:
        nodes.append(h.make_node("Cast", ["xf"], ["y" if where == "output" else "c"], name="cast", to=to))
        v = "c"
    if where == "inside":
        nodes += [h.make_node("Transpose", [v], ["t"], perm=list(range(len(shape)))[::-1]),
                  h.make_node("QuantizeLinear", ["t", "so", "zo"], ["y"])]
    return qdq(nodes, shape, x_type, inits, T.FLOAT if where == "output" else T.UINT8)


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple), x_type=st.sampled_from([T.INT8, T.UINT8]),
       s=st.sampled_from([2.0**-7, 0.003, 0.05, 0.7, 3e4]), z=st.sampled_from(["min", "max", "mid"]),
       where=st.sampled_from(["output", "inside"]), seed=st.integers(0, 2**16))
def test_a_cast_of_a_dequantized_value_to_float_is_the_value(shape, x_type, s, z, where, seed):
    """Cast to float32 of a dequantized value, at the graph output or inside before a QuantizeLinear, over random
    shapes, scales and zero points at the type's extremes: the same integers as the model without the Cast, and at
    the output the same floats as onnxruntime's run of the quantized model; the export exact. Regression: 'float
    Cast of dequantized values has no integer form'."""
    lo, hi = RANGE[x_type]
    zx = {"min": lo, "max": hi, "mid": (lo + hi) // 2}[z]
    rng = np.random.default_rng(seed)
    x = rng.integers(lo, hi + 1, shape)
    x.reshape(-1)[:2] = [lo, hi][:x.size]
    with_cast, without = (import_model(cast_model(x_type, shape, s, zx, where, c), input_precision=9)
                          for c in (True, False))
    [got] = execute(with_cast.graph, {"data": x.astype(np.int32)})
    [want] = execute(without.graph, {"data": x.astype(np.int32)})
    assert np.array_equal(got, want)
    if where == "output":
        sess = ort.InferenceSession(cast_model(x_type, shape, s, zx, where, True).SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        [ref] = sess.run(None, {"x": x.astype(NP[x_type])})
        assert np.array_equal(with_cast.edges.outputs[0].dequantize(got).astype(np.float32), ref)
    assert verify(with_cast.graph, x.astype(np.int32)).exact


def test_a_cast_of_a_dequantized_value_to_another_float_type_is_refused_naming_it():
    """To float16: one line naming the node and the rule (to an integer type it is a table: test_quantize_fresh10b)."""
    with pytest.raises(UnsupportedError, match=r"cast \(Cast\): Cast of dequantized values to float16 has no "
                                               "integer form"):
        import_model(cast_model(T.UINT8, (2, 3), 0.05, 9, "inside", True, T.FLOAT16), input_precision=9)


def normalized_model(c: np.ndarray, shape: tuple[int, ...], std: float | None = 0.25) -> onnx.ModelProto:
    """x - c [/ std, a 3x3 Conv padded by 1 and a Relu]: a normalization inside the model, as TesseraNet's."""
    rng = np.random.default_rng(3)
    inits = [nh.from_array(c.astype(np.float32), "mean")]
    nodes = [h.make_node("Sub", ["x", "mean"], ["d" if std else "y"], name="sub")]
    if std:
        inits += [nh.from_array(np.float32(std), "std"),
                  nh.from_array(rng.normal(size=(4, shape[1], 3, 3)).astype(np.float32), "w")]
        nodes += [h.make_node("Div", ["d", "std"], ["n"]), h.make_node("Conv", ["n", "w"], ["c"], pads=[1, 1, 1, 1]),
                  h.make_node("Relu", ["c"], ["y"])]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, list(shape))],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    return onnx_model(g, 13)


SPECIAL = np.array([0.0, -0.0, 1e-45, -1e-45, 3.4028235e38, -3.4028235e38, 1.0, -2.5, 0.485, 1e-38], np.float32)


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=2, max_size=4).map(tuple), per=st.sampled_from(["scalar", "last",
       "channel", "full"]), seed=st.integers(0, 2**16))
def test_a_sub_of_a_constant_from_the_input_is_the_add_of_its_negation(shape, per, seed):
    """Over random shapes, constants broadcast every way and float32's special values (signed zeros, subnormals,
    the extremes, inf - inf's NaN): onnxruntime's run of the rewritten model equals the original's bit for bit."""
    rng = np.random.default_rng(seed)
    cshape = {"scalar": (), "last": shape[-1:], "channel": (shape[1],) + (1,) * (len(shape) - 2), "full": shape}[per]
    c = rng.choice(SPECIAL, cshape) if rng.random() < 0.5 else rng.normal(size=cshape) * 10.0 ** rng.integers(-3, 4)
    m = normalized_model(np.asarray(c), shape, None)
    x = np.where(rng.random(shape) < 0.3, rng.choice(np.append(SPECIAL, np.inf), shape), rng.normal(size=shape))
    x = x.astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert input_subs_as_adds(m.graph) == 1
    assert [n.op_type for n in m.graph.node] == ["Add"]
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_subs_of_other_operands_are_left():
    """c - x, x - y of two inputs and a Sub of a computed value are not this rewrite's."""
    for nodes, ins in (([h.make_node("Sub", ["mean", "x"], ["y"])], ["x"]),
                       ([h.make_node("Sub", ["x", "z"], ["y"])], ["x", "z"]),
                       ([h.make_node("Relu", ["x"], ["r"]), h.make_node("Sub", ["r", "mean"], ["y"])], ["x"])):
        g = h.make_graph(nodes, "m", [h.make_tensor_value_info(v, T.FLOAT, [2, 3]) for v in ins],
                         [h.make_tensor_value_info("y", T.FLOAT, None)],
                         [nh.from_array(np.ones(3, np.float32), "mean")])
        assert input_subs_as_adds(g) == 0 and "Sub" in [n.op_type for n in g.node]


def test_a_model_normalizing_its_input_quantizes_and_imports(tmp_path):
    """(x - mean) / std, Conv, Relu: refused before ('the float input is read by Sub'); imports whole, the export
    exact, as close to float as onnxruntime's quantized model (1.1x)."""
    shape = (1, 3, 8, 8)
    onnx.save(normalized_model(np.array([0.485, 0.456, 0.406]).reshape(3, 1, 1), shape), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(0).uniform(0, 1, (16,) + shape[1:]).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


def masked_attention(bad: float) -> onnx.ModelProto:
    """MatMul ('logits'), then logits + Where(logits > 0, 0, ``bad``) from a Constant node, Softmax, MatMul: an
    attention mask as torch exports it, the fill a Constant node."""
    rng = np.random.default_rng(0)
    nodes = [h.make_node("MatMul", ["x", "w"], ["logits"]),
             h.make_node("Constant", [], ["zero"], value=nh.from_array(np.array([0], np.float32))),
             h.make_node("Constant", [], ["fill"], name="fill_c", value=nh.from_array(np.array([bad], np.float32))),
             h.make_node("Greater", ["logits", "zero"], ["keep"]),
             h.make_node("Where", ["keep", "zero", "fill"], ["mask"], name="mask_w"),
             h.make_node("Add", ["logits", "mask"], ["masked"]), h.make_node("Softmax", ["masked"], ["p"], axis=-1),
             h.make_node("MatMul", ["p", "v"], ["y"])]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(rng.normal(size=(8, 4)).astype(np.float32), "w"),
                      nh.from_array(rng.normal(size=(4, 3)).astype(np.float32), "v")])
    return onnx_model(g, 13)


def test_a_minus_infinity_mask_of_the_scores_is_left_float(tmp_path):
    """logits + Where(logits > 0, 0, -inf) before a Softmax (TesseraNet's decoder: a mask computed from the scores,
    its -inf in a Constant node): an attention mask, left float by quantize and imported by the masked Softmax
    (keep the integer comparison of the logits), within 1.1x onnxruntime's quantized model's distance from float,
    exported exactly (on samples where every row keeps a logit: else float32's softmax is NaN). Regression: refused
    ('the Constant 'fill' holds -inf')."""
    onnx.save(masked_attention(-np.inf), tmp_path / "f.onnx")
    x = np.random.default_rng(1).normal(size=(64, 1, 4, 8)).astype(np.float32)
    session = ort.InferenceSession(tmp_path / "f.onnx", providers=["CPUExecutionProvider"])
    x = x[[np.isfinite(session.run(None, {"x": v})[0]).all() for v in x]][:8]
    assert len(x) == 8
    np.save(tmp_path / "c.npy", x)
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "whole")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, None, seeds=1).exact


def test_a_non_finite_constant_node_is_refused_in_one_line_naming_it(tmp_path, bad=np.nan):
    """One problem naming the Constant and its reader, pointing at --outputs (was one line per infinite scale
    quantize_static computed from it: 'the scale ... holds inf'); cut before it, the model imports."""
    onnx.save(masked_attention(bad), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(1).normal(size=(8, 1, 4, 8)).astype(np.float32))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "whole")
    [p] = e.value.problems
    assert "the Constant 'fill' holds" in p.rule and "(read by mask_w (Where): --outputs cuts a float tail off" \
        in p.rule, p.rule
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "cut", outputs=["logits"])
    assert verify(done.imported.graph, None, seeds=1).exact


def per_channel_model(op: str, x_type: int, shape: tuple[int, ...], s: float, zx: int, c: np.ndarray, so: float,
                      zo: int) -> onnx.ModelProto:
    """DequantizeLinear of x, ``op`` (Div or Mul) by the float constant c, QuantizeLinear to uint8."""
    inits = {"s": np.float32(s), "zx": NP[x_type](zx), "c": c.astype(np.float32), "so": np.float32(so),
             "zo": np.uint8(zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]), h.make_node(op, ["xf", "c"], ["d"], name="f"),
             h.make_node("QuantizeLinear", ["d", "so", "zo"], ["y"], name="q")]
    return qdq(nodes, shape, x_type, inits, T.UINT8)


@settings(max_examples=40, deadline=None)
@given(d=st.data(), op=st.sampled_from(["Div", "Mul"]), x_type=st.sampled_from([T.INT8, T.UINT8]),
       per=st.sampled_from(["channel", "last", "full", "channel4"]), s=st.sampled_from([2.0**-7, 0.003, 0.05, 0.7]),
       so=st.sampled_from([2.0**-8, 0.01, 0.05, 0.4]), seed=st.integers(0, 2**16))
def test_div_and_mul_by_a_constant_of_several_values_equal_the_oracle(d, op, x_type, per, s, so, seed):
    """(x - z) s / c_k and * c_k over random shapes, constants broadcast along any axes (a per-channel std of (C, 1,
    1), the last axis, the whole shape) with values from 1e-3 to 1e3, x over every integer of its type, zero points
    at the extremes: the import equals the oracle (the requantization by its plan, within its bound) and onnxruntime's
    quantized model within one step (float32 rounding at ties); the export exact. Regression: 'the divisor must be a
    finite constant > 0, a scalar or one value throughout'."""
    rng = np.random.default_rng(seed)
    shape = (1, d.draw(st.integers(2, 4)), d.draw(st.integers(1, 4)), d.draw(st.integers(2, 8)))
    cshape = {"channel": (shape[1], 1, 1), "last": (shape[-1],), "full": shape, "channel4": (1, shape[1], 1, 1)}[per]
    c = 10.0 ** rng.uniform(-3, 3, cshape)
    c.reshape(-1)[0] = c.reshape(-1)[1] * 2  # several values
    lo, hi = RANGE[x_type]
    zx = d.draw(st.sampled_from([lo, hi, (lo + hi) // 2]))
    zo = d.draw(st.sampled_from([0, 255, 128]))
    m = per_channel_model(op, x_type, shape, s, zx, c, so, zo)
    x = rng.integers(lo, hi + 1, shape)
    x.reshape(-1)[:2] = [lo, hi]
    imp = import_model(m, input_precision=9)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    [(_, want, *_)] = Oracle(m, imp).run(x.astype(np.int64))
    assert np.array_equal(got.astype(np.int64), np.asarray(want).reshape(got.shape))
    [ref] = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(NP[x_type])})
    assert np.abs(got.astype(np.int64) - ref.astype(np.int64)).max() <= 1
    assert verify(imp.graph, x.astype(np.int32)).exact


def test_div_by_a_constant_that_grows_the_shape_or_is_not_positive_is_refused():
    """A constant that would broadcast x to more values, or holds 0: refused naming the node, as before."""
    for c, shape in ((np.array([[1.0], [2.0]]), (1, 3)), (np.array([0.5, 0.0, 2.0]), (2, 3))):
        m = per_channel_model("Div", T.UINT8, shape, 0.05, 3, c, 0.1, 0)
        with pytest.raises(UnsupportedError, match=r"f \(Div\): the divisor must be a finite constant > 0"):
            import_model(m, input_precision=9)


def test_a_model_with_a_wide_einsum_quantizes_and_imports(tmp_path):
    """x (1, 6, 8) -> MatMul -> q (1, 6, 4); x -> MatMul -> Reshape (1, 4, 3, 4): q's rows against a computed map
    (bcd,bdhw->bchw, TesseraNet's query x strip features), Relu: imports whole, the export exact, as close to float
    as onnxruntime's quantized model (1.1x)."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.normal(size=(8, 4)).astype(np.float32), "wq"),
             nh.from_array(rng.normal(size=(8, 8)).astype(np.float32), "wk"),
             nh.from_array(np.array([1, 4, 3, 4], np.int64), "shape")]
    g = h.make_graph([h.make_node("MatMul", ["x", "wq"], ["q"]), h.make_node("MatMul", ["x", "wk"], ["k"]),
                      h.make_node("Reshape", ["k", "shape"], ["f"]),
                      h.make_node("Einsum", ["q", "f"], ["e"], equation="bcd,bdhw->bchw"),
                      h.make_node("Relu", ["e"], ["y"])], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 6, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    onnx.save(onnx_model(g, 13), tmp_path / "f.onnx")
    np.save(tmp_path / "c.npy", rng.normal(size=(16, 6, 8)).astype(np.float32))
    done = quantize(tmp_path / "f.onnx", tmp_path / "c.npy", tmp_path / "m")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=1).exact


@pytest.mark.parametrize("relus, refused", [(3, False), (4, True)])
def test_a_graph_past_the_runtimes_storage_bound_is_refused(relus, refused):
    """data (2^28 int32 values: 1 GiB) and 3 relus, each a head (live to the end: no storage to reuse), make
    4 GiB, the bound itself: valid; a fourth passes it: one problem naming the bound (the runtime refuses to load
    such a model: 'storage size exceed MAX_STORAGE'; it was written and only the runtime refused it)."""
    b = GraphBuilder()
    y = b.input("data", (16, 1 << 24), 8)
    heads = []
    for k in range(relus):
        y = b.op("relu", y, name=f"relu{k}")
        heads.append(y)
    graph = Graph(list(b.nodes), heads, dict(b.params))
    if not refused:
        assert storage_bytes(validate(graph).graph) == MAX_STORAGE
        return
    with pytest.raises(ValidationError) as e:
        validate(graph)
    [p] = e.value.problems
    assert p.where == "storage" and "passes its load-time bound 2^32 = 4294967296" in p.rule, p.rule
