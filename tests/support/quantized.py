"""Small float CNNs quantized by onnxruntime.quantization.quantize_static: the source models of the quantized
import's tests, and the numpy oracle of docs/import.md they are checked against."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as NotImplementedError_
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator
from onnxruntime import quantization

from cvm_onnx.core.format.onnx_file import onnx_model


def ort_session(model: onnx.ModelProto | bytes) -> ort.InferenceSession:
    """onnxruntime's CPU session of a quantized model with exact int8 products on every x86 CPU
    (session.x64quantprecision: its u8 x u8 kernels; the default u8 x s8 ones saturate their int16 pair sums on AVX2
    without VNNI, steps or thousands of steps away). Where it has no such kernel (QOperator's QLinearConv of int8
    activations), the default session, exact on VNNI CPUs."""
    data = model if isinstance(model, bytes) else model.SerializeToString()
    so = ort.SessionOptions()
    so.add_session_config_entry("session.x64quantprecision", "1")
    try:
        return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    except NotImplementedError_:
        return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def conv_layer(rng, name, x, c_in, c_out, group=1, k=3, stride=1, pads=(1, 1, 1, 1), dilation=1):
    w = nh.from_array(rng.normal(size=(c_out, c_in // group, k, k)).astype(np.float32), f"{name}_w")
    b = nh.from_array(rng.normal(size=(c_out,)).astype(np.float32), f"{name}_b")
    node = h.make_node("Conv", [x, w.name, b.name], [name], group=group, strides=[stride, stride], pads=list(pads),
                       dilations=[dilation, dilation])
    return [node], [w, b]


def float_model(kind: str, seed: int, opset: int, group: int, stride: int, pads, pool: str, head: str):
    """A small float CNN: conv (+ relu) [two branches joined by Add, Mul or Concat; or squared by Pow, then a 1x1
    conv, which quantizes it: quantize_static leaves Pow unquantized], a pooling, flatten, Gemm or MatMul
    (+ Sigmoid). Group 4: the first conv is depthwise (4 channels in, 4 out)."""
    rng = np.random.default_rng(seed)
    c = 4 if group == 4 else 2 * group
    nodes, inits = conv_layer(rng, "c1", "x", c, 4, group, stride=stride, pads=pads)
    nodes.append(h.make_node("Relu", ["c1"], ["r1"]))
    last = "r1"
    if kind in ("Add", "Mul", "Concat"):
        n2, i2 = conv_layer(rng, "c2", "x", c, 4, 1, stride=stride, pads=pads)
        nodes += n2
        inits += i2
        nodes.append(h.make_node(kind, ["r1", "c2"], ["j"], **({"axis": 1} if kind == "Concat" else {})))
        last = "j"
    if kind == "Pow":
        inits.append(nh.from_array(np.array(2, np.float32), "two"))
        nodes.append(h.make_node("Pow", ["r1", "two"], ["j"]))
        n3, i3 = conv_layer(rng, "cj", "j", 4, 4, k=1, pads=(0, 0, 0, 0))
        nodes += n3
        inits += i3
        last = "cj"
    if pool == "max":
        nodes.append(h.make_node("MaxPool", [last], ["p"], kernel_shape=[2, 2], strides=[2, 2]))
    elif pool == "avg":
        nodes.append(h.make_node("AveragePool", [last], ["p"], kernel_shape=[2, 2], strides=[1, 1],
                                 pads=[1, 0, 0, 1]))
    else:
        nodes.append(h.make_node("GlobalAveragePool", [last], ["p"]))
    nodes.append(h.make_node("Flatten", ["p"], ["f"]))
    shapes = {"x": [1, c, 6, 6]}
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, shapes["x"])],
                     [h.make_tensor_value_info("f", T.FLOAT, None)], inits)
    m = onnx_model(g, opset)
    m = onnx.shape_inference.infer_shapes(m)
    n_f = [v for v in m.graph.value_info if v.name == "f"] or list(m.graph.output)
    width = n_f[0].type.tensor_type.shape.dim[1].dim_value
    w2 = nh.from_array(rng.normal(size=(width, 3)).astype(np.float32), "w2")
    b2 = nh.from_array(rng.normal(size=(3,)).astype(np.float32), "b2")
    m.graph.initializer.extend([w2, b2])
    if head == "gemm":
        m.graph.node.append(h.make_node("Gemm", ["f", "w2", "b2"], ["y"]))
    else:
        m.graph.node.append(h.make_node("MatMul", ["f", "w2"], ["mm"]))
        m.graph.node.append(h.make_node("Add", ["mm", "b2"], ["y"]))
    out = "y"
    if head == "sigmoid":
        m.graph.node.append(h.make_node("Sigmoid", ["y"], ["ys"]))
        out = "ys"
    del m.graph.output[:]
    m.graph.output.append(h.make_tensor_value_info(out, T.FLOAT, None))
    del m.graph.value_info[:]
    return m


class Reader(quantization.CalibrationDataReader):
    def __init__(self, shape, seed=0, n=4):
        rng = np.random.default_rng(seed)
        self.items = iter([{"x": rng.normal(size=shape).astype(np.float32)} for _ in range(n)])

    def get_next(self):
        return next(self.items, None)


def quantized(model: onnx.ModelProto, tmp, fmt: str, activation: str, symmetric: bool, per_channel: bool):
    src, dst = tmp / "f.onnx", tmp / "q.onnx"
    onnx.save(model, src)
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    quantization.quantize_static(
        str(src), str(dst), Reader(shape), quant_format=getattr(quantization.QuantFormat, fmt),
        activation_type=getattr(quantization.QuantType, "QInt8" if activation == "int8" else "QUInt8"),
        weight_type=quantization.QuantType.QInt8, per_channel=per_channel,
        extra_options={"ActivationSymmetric": symmetric})
    return onnx.load(dst), shape


def small_qdq(tmp, activation="uint8"):
    rng = np.random.default_rng(3)
    nodes, inits = conv_layer(rng, "y", "x", 2, 2)
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    qm, _ = quantized(onnx_model(g, 17), tmp, "QDQ", activation, False, True)
    return qm


INT_RANGE = {T.INT8: (-128, 127), T.UINT8: (0, 255), T.INT16: (-32768, 32767)}


def float32_of(r):
    """Real values as DequantizeLinear gives them: rounded to float32 (in float64)."""
    return np.asarray(r, np.float64).astype(np.float32).astype(np.float64)


#: The float functions of the oracle, by op: from the constant inputs (the Pow exponent) to a float64 function; the
#: step functions at their float32 inputs, where the float model takes their steps.
FN = {"Log": lambda c: np.log, "Exp": lambda c: np.exp, "Reciprocal": lambda c: lambda r: 1 / r,
      "Tanh": lambda c: np.tanh, "Pow": lambda c: lambda r, k=float(np.asarray(c[0][1]).reshape(())): np.power(r, k),
      "Mish": lambda c: lambda r: r * np.tanh(np.log1p(np.exp(r))), "Sign": lambda c: lambda r: np.sign(float32_of(r)),
      "Floor": lambda c: lambda r: np.floor(float32_of(r)), "Ceil": lambda c: lambda r: np.ceil(float32_of(r)),
      "Round": lambda c: lambda r: np.round(float32_of(r)), "Sin": lambda c: np.sin,
      "Cos": lambda c: np.cos, "Atan": lambda c: np.arctan, "Asin": lambda c: np.arcsin, "Acos": lambda c: np.arccos,
      "Sinh": lambda c: np.sinh, "Cosh": lambda c: np.cosh, "Asinh": lambda c: np.arcsinh,
      "Atanh": lambda c: np.arctanh, "Abs": lambda c: np.abs, "Neg": lambda c: np.negative}


# -- the oracle -------------------------------------------------------------------------------------------------
def one(op_type, inputs, **attrs):
    """One ONNX op on float64 arrays with onnx.reference (exact on the integers used here)."""
    names = [f"i{k}" for k in range(len(inputs))]
    g = h.make_graph([h.make_node(op_type, names, ["o"], **attrs)], "one",
                     [h.make_tensor_value_info(n, T.DOUBLE, None) for n in names],
                     [h.make_tensor_value_info("o", T.DOUBLE, None)])
    return ReferenceEvaluator(onnx_model(g, 21)).run(
        None, dict(zip(names, [np.asarray(x, np.float64) for x in inputs])))[0]


def transposed_conv_is_onnxruntimes(x: np.ndarray, w: np.ndarray, a: dict) -> bool:
    """``transposed_conv`` of integer-valued float32 x and w equals onnxruntime's float ConvTranspose of them (opset
    17), every element (their sums exact in float32 while they stay below 2^24)."""
    g = h.make_graph([h.make_node("ConvTranspose", ["x", "w"], ["y"], **a)], "t",
                     [h.make_tensor_value_info("x", T.FLOAT, list(x.shape))],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], [nh.from_array(w, "w")])
    [want] = ort.InferenceSession(onnx_model(g, 17).SerializeToString(),
                                  providers=["CPUExecutionProvider"]).run(None, {"x": x})
    return np.array_equal(transposed_conv(x.astype(np.int64), w.astype(np.int64), a), want.astype(np.int64))


def transposed_conv(x: np.ndarray, w: np.ndarray, a: dict) -> np.ndarray:
    """ConvTranspose by its definition, in int64: each input value times the kernel, added at
    o = i * stride - pad_begin + k * dilation per spatial axis (group by group); output_padding extends the end.
    1-D, 2-D or 3-D. Pads from output_shape or auto_pad SAME (an output of L s) by ONNX's rule: total = s (L - 1) +
    output_padding + d (k - 1) + 1 - out, total / 2 at the begin for SAME_UPPER, the rest otherwise."""
    g, n = a.get("group", 1), x.ndim - 2
    cin, per, spatial, kernel = x.shape[1], w.shape[1], x.shape[2:], w.shape[2:]
    s, d = a.get("strides", [1] * n), a.get("dilations", [1] * n)
    p, extra = a.get("pads", [0] * 2 * n), a.get("output_padding", [0] * n)
    auto = a.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if "output_shape" in a or auto.startswith("SAME"):
        want = list(a["output_shape"]) if "output_shape" in a else [size * st_ for size, st_ in zip(spatial, s)]
        total = [s[i] * (spatial[i] - 1) + extra[i] + d[i] * (kernel[i] - 1) + 1 - want[i] for i in range(n)]
        begin = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
        p = begin + [t - b for t, b in zip(total, begin)]
    elif auto == "VALID":
        p = [0] * 2 * n
    out = [(size - 1) * s[i] - p[i] - p[i + n] + d[i] * (k - 1) + 1 + extra[i]
           for i, (size, k) in enumerate(zip(spatial, kernel))]
    y = np.zeros((x.shape[0], g * per, *out), np.int64)
    cg = cin // g
    for grp in range(g):
        xs_ = x[:, grp * cg:(grp + 1) * cg].astype(np.int64)
        for taps in np.ndindex(*kernel):
            part = np.einsum("nc...,co->no...", xs_, w[(slice(grp * cg, (grp + 1) * cg), slice(None)) + taps]
                             .astype(np.int64))
            for at in np.ndindex(*spatial):
                o = tuple(i * s[k] - p[k] + j * d[k] for k, (i, j) in enumerate(zip(at, taps)))
                if all(0 <= v < m for v, m in zip(o, out)):
                    y[(slice(None), slice(grp * per, (grp + 1) * per)) + o] += part[(slice(None), slice(None)) + at]
    return y


def between_convs(middle: list, extra: dict, opset: int = 17) -> onnx.ModelProto:
    """A float model Conv 3x3 (8 channels) -> ``middle`` (reading 'a', writing 'b') -> Conv 1x1 on (1, 8, 12, 12);
    ``extra`` initializers as numpy values of their own type (float64 ones as float32)."""
    rng = np.random.default_rng(5)
    inits = {"w1": rng.normal(0, 0.3, (8, 8, 3, 3)), "w2": rng.normal(0, 0.3, (4, 8, 1, 1)), **extra}
    values = {k: np.asarray(v, np.float32) if np.asarray(v).dtype == np.float64 else np.asarray(v)
              for k, v in inits.items()}
    nodes = [h.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1])] + middle + \
        [h.make_node("Conv", ["b", "w2"], ["y"])]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 8, 12, 12])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [nh.from_array(v, k) for k, v in values.items()])
    return onnx_model(g, opset)


def divided(c: np.ndarray, constant_node: bool) -> onnx.ModelProto:
    """A float model of an image divided inside it (BlazeFace's x / 255, or a per-channel std), then Conv 3x3, Relu,
    Conv 1x1, on (1, 3, 12, 12); the divisor an initializer or a Constant node (torch's export)."""
    rng = np.random.default_rng(13)
    inits = [nh.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w1"),
             nh.from_array(rng.normal(0, 0.3, (4, 8, 1, 1)).astype(np.float32), "w2")]
    first = [h.make_node("Constant", [], ["c"], value=nh.from_array(c))] if constant_node else []
    inits += [] if constant_node else [nh.from_array(c, "c")]
    nodes = first + [h.make_node("Div", ["x", "c"], ["a"], name="/Div"),
                     h.make_node("Conv", ["a", "w1"], ["b"], pads=[1, 1, 1, 1]), h.make_node("Relu", ["b"], ["r"]),
                     h.make_node("Conv", ["r", "w2"], ["y"])]
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 12, 12])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    return onnx_model(g, 17)


def linear_regressor(coefficients: np.ndarray, intercepts: np.ndarray | None, shape: list, scaler: bool = False,
                     **attrs) -> onnx.ModelProto:
    """skl2onnx's linear regressor: LinearRegressor (``targets`` rows of coefficients) of the input x, or of a
    StandardScaler's Scaler of it (a pipeline)."""
    targets = coefficients.shape[0]
    kept = {"intercepts": intercepts.tolist()} if intercepts is not None else {}
    node = h.make_node("LinearRegressor", ["s" if scaler else "x"], ["variable"], domain="ai.onnx.ml",
                       name="LinearRegressor", coefficients=coefficients.ravel().tolist(), targets=targets,
                       **kept, **attrs)
    return _scaled(node, shape, scaler, [h.make_tensor_value_info("variable", T.FLOAT, [None, targets])])


def linear_classifier(coefficients: np.ndarray, intercepts: np.ndarray, labels: list[int], shape: list,
                      scaler: bool = False, **attrs) -> onnx.ModelProto:
    """skl2onnx's linear classifier with zipmap=False: LinearClassifier (one row of coefficients per class; integer
    labels) of the input x, or of a StandardScaler's Scaler of it; outputs its label and its scores."""
    node = h.make_node("LinearClassifier", ["s" if scaler else "x"], ["label", "probabilities"], domain="ai.onnx.ml",
                       name="LinearClassifier", coefficients=coefficients.ravel().tolist(),
                       intercepts=intercepts.tolist(), classlabels_ints=labels, **attrs)
    return _scaled(node, shape, scaler, [h.make_tensor_value_info("label", T.INT64, [None]),
                                         h.make_tensor_value_info("probabilities", T.FLOAT, [None, len(labels)])])


def two_orders_bound(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """2 gamma(n + 1) (sum |x_i w_i| + |b|) + (n + 1) 2^-149 for each output of x W^T + b (n features, x of shape
    (n,) or (N, n)): how far two float32 sums of its n + 1 terms in any orders may be apart (docs/import.md)."""
    n = w.shape[1]
    k = (n + 1) * 2.0 ** -24
    terms = np.abs(np.atleast_2d(x).astype(np.float64)) @ np.abs(w.T.astype(np.float64)) + np.abs(b)
    return 2 * k / (1 - k) * terms + (n + 1) * 2.0 ** -149


def _scaled(node: onnx.NodeProto, shape: list, scaler: bool, outputs: list) -> onnx.ModelProto:
    """A model of ``node`` of the float input x of ``shape``, or of a StandardScaler's Scaler of x (offset 0.5,
    scale 2 per feature) where ``scaler``."""
    nodes = [h.make_node("Scaler", ["x"], ["s"], domain="ai.onnx.ml", offset=[0.5] * shape[-1],
                         scale=[2.0] * shape[-1])] if scaler else []
    g = h.make_graph([*nodes, node], "linear", [h.make_tensor_value_info("x", T.FLOAT, shape)], outputs)
    return onnx_model(g, 13, {"ai.onnx.ml": 1})


def quantizes_whole(tmp_path, model, per_channel: bool, samples: np.ndarray | None = None, fold=None) -> None:
    """``cvm-onnx quantize`` takes the float ``model`` (a ``between_convs``, or a model file) whole on ``samples``
    (absent: 8 normal ones of its one input's static shape), ``fold`` as quantize takes it: every output within
    1.1x onnxruntime's quantized model's mean distance from float, the export exact."""
    from cvm_onnx.app.quantize import quantize
    from cvm_onnx.runtime.verify import verify

    if isinstance(model, onnx.ModelProto):
        onnx.save(model, tmp_path / "f.onnx")
        model = tmp_path / "f.onnx"
    if samples is None:
        dims = onnx.load(model, load_external_data=False).graph.input[0].type.tensor_type.shape.dim
        samples = np.random.default_rng(7).normal(size=[8] + [d.dim_value for d in dims])
    np.save(tmp_path / "c.npy", samples.astype(np.float32))
    done = quantize(model, tmp_path / "c.npy", tmp_path / "m", per_channel=per_channel, fold=fold)
    for a in done.agreements:
        assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    assert verify(done.imported.graph, seeds=2).exact


def per_channel_output(m: onnx.ModelProto, scale: float, n: int, axis: int) -> None:
    """The model's last node, a QuantizeLinear, given a scale of n values along ``axis`` (and no zero point)."""
    m.graph.initializer.append(nh.from_array(np.full(n, scale, np.float32), "so_per_channel"))
    q = m.graph.node[-1]
    q.input[1] = "so_per_channel"
    del q.input[2:]
    q.attribute.append(h.make_attribute("axis", axis))


class Oracle:
    """Runs a quantized model as docs/import.md states: integers; values (v, scale) with v an integer array whose
    real value is v * scale; QuantizeLinear as the import's plan (multiplier, shifts, clip) of each node; float
    functions as a float64 table. Checks each requantization against its bound."""

    def __init__(self, model, imported):
        self.model = model
        self.inits = {t.name: nh.to_array(t) for t in model.graph.initializer}
        self.types = {t.name: t.data_type for t in model.graph.initializer}
        self.plans = {r.node: r for r in imported.requants}
        self.fixed = {}  # id -> the integers of a value no input reaches (a constant), kept alive

    def constant(self, v: np.ndarray) -> np.ndarray:
        self.fixed[id(v)] = v
        return v

    def const(self, name):
        return self.inits[name] if name else None

    def run(self, q: np.ndarray) -> list[np.ndarray]:
        env = {self.model.graph.input[0].name: ("int", q.astype(np.int64))}  # an integer input (a QDQ layer)
        varying = {self.model.graph.input[0].name}
        for i, node in enumerate(self.model.graph.node):
            ins = list(node.input)
            a = {x.name: h.get_attribute_value(x) for x in node.attribute}
            name = node.name or f"{node.op_type}_{i}"
            op = node.op_type
            if op == "QuantizeLinear" and ins[0] == self.model.graph.input[0].name:
                out = ("int", q.astype(np.int64))
            elif op == "DequantizeLinear":
                out = self.dq(env.get(ins[0]), ins, a)
            elif op == "QuantizeLinear":
                out = self.q(name, env[ins[0]], ins[1], ins[2] if len(ins) > 2 else "")
            elif op.startswith("QLinear") or op == "QGemm":
                out = self.qop(name, op, ins, a, env)
            else:
                out = self.float_op(op, [env.get(x) if x in env else ("const", self.inits.get(x)) for x in ins], a)
            outs = out if isinstance(out, list) else [out]
            if varying.intersection(ins):
                varying.update(node.output)
            else:  # a constant: its integers (each term's) are a constant's
                for value in outs:
                    for term in value[1] if value[0] == "sum" else [value] if value[0] == "real" else []:
                        self.constant(term[1])
            for name_, value in zip(node.output, outs):
                env[name_] = value
        return [env[o.name] for o in self.model.graph.output]

    # values: ("int", q), ("real", v, scale, zero-free) with real = v * scale, ("fn", value, f), ("sum", [reals])
    def dq(self, x, ins, a):
        q = x[1] if x is not None else self.inits[ins[0]].astype(np.int64)
        s = self.const(ins[1]).astype(np.float64)
        z = self.const(ins[2]) if len(ins) > 2 and ins[2] else np.zeros((), np.int64)
        axis = a.get("axis", 1)
        if s.size > 1:
            shape = (-1,) + (1,) * (q.ndim - 1 - axis % q.ndim)
            s, z = s.reshape(shape), z.reshape(shape)
        v = q - z.astype(np.int64)
        return ("real", self.constant(v) if x is None else v, np.vectorize(Fraction, otypes=[object])(s))

    def q(self, name, x, s_name, z_name):
        lo, hi = INT_RANGE[self.types.get(z_name, T.UINT8)]
        z = int(self.inits[z_name]) if z_name else 0
        return ("int", self.requant(name, x, Fraction(float(self.inits[s_name])), z, lo, hi))

    def settled(self, rec, term, s_out, zo, lo, hi):
        """The term with its far rows set to 0, and what each element of them adds: a settled row K - z_out (every
        value of it checked to quantize, exactly, half to even, saturated, to K), a far row whose output varies
        its plan's r on v itself (docs/import.md: clip, v1 = round_half_up(v / 2^s), r = floor((v1 m + 2^(k-1)) /
        2^k)), checked within 1/2 + delta of v M where it does not saturate."""
        _, v, sc = term
        shape = np.broadcast_shapes(v.shape, sc.shape)
        mask, offset = np.zeros(sc.shape, bool), np.zeros(sc.shape, np.int64)
        for row, k in rec.settled:
            mask.flat[row], offset.flat[row] = True, k - zo
        rows = np.broadcast_to(mask, shape)
        ratio = np.broadcast_to(sc / s_out, shape)
        exact = np.vectorize(lambda a, m: min(max(round(a * m) + zo, lo), hi), otypes=[np.int64])(
            np.broadcast_to(v, shape).astype(object), ratio)
        assert np.array_equal(exact[rows], np.broadcast_to(offset + zo, shape)[rows])
        added = np.broadcast_to(offset, shape).copy()
        for row, fp in rec.far:
            one = np.zeros(sc.shape, bool)
            one.flat[row] = True
            sel = np.broadcast_to(one, shape)
            p, vals = fp.plan, np.broadcast_to(v, shape)[sel].astype(object)
            if p.clip is not None:
                vals = np.clip(vals, p.clip[0] + fp.offset, p.clip[1] + fp.offset)
            if p.pre_shift:
                vals = (vals + (1 << (p.pre_shift - 1))) >> p.pre_shift
            r = (vals * int(p.multipliers[0].reshape(-1)[0]) + (1 << (p.shift - 1))) >> p.shift
            real = np.broadcast_to(v, shape)[sel].astype(object) * ratio[sel]
            inside = (r + zo >= lo) & (r + zo <= hi)
            if inside.any():
                assert max(abs(r[inside] - real[inside])) <= Fraction(1, 2) + p.delta
            added[sel] = r.astype(np.int64)
            rows = rows | sel
        return [("real", np.where(rows, 0, v), sc)], added

    def requant(self, name, x, s_out, zo, lo, hi):
        rec = self.plans[name]
        if x[0] == "fn":
            _, (kind, v, sc), f = x
            real = v * float(sc.reshape(-1)[0])
            with np.errstate(all="ignore"):
                return np.clip(np.rint(f(real) / float(s_out)) + zo, lo, hi).astype(np.int64)
        if x[0] == "after":  # max(r, z) of the sum's r; |r| or -r of its r at zero point 0, unsaturated
            _, op, inner = x
            if op == "Relu":
                return np.maximum(self.requant(name, inner, s_out, zo, lo, hi), min(max(zo, lo), hi))
            r = self.requant_terms(rec, name, inner[1], s_out, 0, -(1 << 15), (1 << 15) - 1)
            return np.clip((np.abs(r) if op == "Abs" else -r) + zo, lo, hi)
        terms = x[1] if x[0] == "sum" else [x]
        if rec.settled or rec.far:  # rows of a bias no conv2d holds: one value K on all of each, or their own plan
            terms, offset = self.settled(rec, terms[0], s_out, zo, lo, hi)
            return np.clip(self.requant_terms(rec, name, terms, s_out, zo, lo, hi) + offset, lo, hi)
        return self.requant_terms(rec, name, terms, s_out, zo, lo, hi)

    def requant_terms(self, rec, name, terms, s_out, zo, lo, hi):
        if not rec.plans:
            return np.clip(terms[0][1] + zo, lo, hi)
        if rec.runs:  # one term, per-channel runs: each run's channels by its own plan
            v, scale = terms[0][1], terms[0][2]
            axis = v.ndim - scale.ndim + next(i for i, n in enumerate(scale.shape) if n > 1)
            r = np.empty(np.broadcast_shapes(v.shape, scale.shape), np.int64)
            for run in rec.runs:
                sub = np.take(v, run.channels, axis=axis)
                shape = [1] * sub.ndim
                shape[axis] = -1
                got = self.plan_of(run.plan, [sub], [m.reshape(shape) for m in run.plan.multipliers])
                idx = [slice(None)] * r.ndim
                idx[axis] = run.channels
                r[tuple(idx)] = got
            self.check(name, r, terms, s_out, zo, lo, hi, max(run.plan.error for run in rec.runs))
            return np.clip(r + zo, lo, hi)
        p = rec.plan
        r = self.plan_of(p, [t[1] for t in terms], p.multipliers)
        self.check(name, r, terms, s_out, zo, lo, hi, p.error)
        return np.clip(r + zo, lo, hi)

    @staticmethod
    def plan_of(p, vs, multipliers):
        """r of the plan ``p`` on the integers ``vs`` (docs/import.md, Requantization)."""
        if len(vs) == 1:
            v = vs[0]
            if p.clip is not None:
                v = np.clip(v, *p.clip)
            if p.pre_shift:
                v = (v + (1 << (p.pre_shift - 1))) >> p.pre_shift
            total = v * multipliers[0]
        else:
            total = sum(v * m for v, m in zip(vs, multipliers))
        if p.even:  # round half to even: floor((t + 2^(k-1) - 1 + bit k of t) / 2^k)
            return (total + (1 << (p.shift - 1)) - 1 + ((total >> p.shift) & 1)) >> p.shift
        return (total + (1 << (p.shift - 1))) >> p.shift

    def check(self, name, r, terms, s_out, zo, lo, hi, bound):
        """Every unsaturated r within ``bound`` steps of the exact rational value: sum_t v_t n_t / d_t, each ratio
        scale_t / s_out = n_t / d_t, compared as integers over their common denominator D (|r D - N| <= bound D)."""
        ratios = [np.vectorize(lambda f: f / s_out, otypes=[object])(t[2]) for t in terms]
        nums = [np.frompyfunc(lambda f: f.numerator, 1, 1)(q) for q in ratios]
        dens = [np.frompyfunc(lambda f: f.denominator, 1, 1)(q) for q in ratios]
        common = dens[0]
        for d in dens[1:]:
            common = np.frompyfunc(math.lcm, 2, 1)(common, d)
        total = sum(t[1].astype(object) * (n * (common // d)) for t, n, d in zip(terms, nums, dens))
        r = np.atleast_1d(r)
        shape = np.broadcast_shapes(r.shape, np.shape(total), np.shape(common))
        inside = np.broadcast_to((r + zo >= lo) & (r + zo <= hi), shape)
        diff = np.abs(np.broadcast_to(r.astype(object), shape) * common - total)[inside]
        if diff.size:
            worst = max((diff / np.broadcast_to(common, shape)[inside]).flat)  # int / int: correctly rounded
            assert worst <= bound + 1e-12, (name, worst, bound)

    def terms(self, x) -> list:
        """The terms of a sum's operand: a sum's, a value, or a float constant c as sign(c) at scale |c| (1 where c
        is 0)."""
        if x[0] == "const":
            c = np.asarray(x[1], np.float64)
            size = np.vectorize(lambda q: Fraction(float(abs(q))) if q else Fraction(1), otypes=[object])
            return [("real", self.constant(np.sign(c).astype(np.int64)), size(c))]
        return list(x[1]) if x[0] == "sum" else [x]

    def negated(self, t):
        v = -t[1]
        return ("real", self.constant(v) if id(t[1]) in self.fixed else v, t[2])

    def sum_of(self, terms):
        """The sum of ``terms``: ONNX's x + 0 = x, so a constant term of value 0 throughout is none where the others
        broadcast to the sum's shape without it; a sum of one term is that term."""
        shape = np.broadcast_shapes(*(np.shape(t[1]) for t in terms))
        kept = [t for t in terms if id(t[1]) not in self.fixed or np.any(t[1])]
        if kept and np.broadcast_shapes(*(np.shape(t[1]) for t in kept)) == shape:
            terms = kept
        return terms[0] if len(terms) == 1 else ("sum", terms)

    def as_real(self, x, what):
        assert x[0] == "real", (what, x[0])
        return x

    def float_op(self, op, xs, a):
        if op == "MatMul" and xs[1][0] == "real" and xs[1][1].ndim > 2 and np.asarray(xs[1][2]).size == 1:  # per tensor
            return ("real", xs[0][1] @ xs[1][1], xs[0][2].reshape(()) * xs[1][2].reshape(()))
        if op in ("Conv", "ConvTranspose", "Gemm", "MatMul"):
            x, w = xs[0], xs[1]
            scale_x = x[2].reshape(())
            if op == "Conv":
                v = one("Conv", [x[1], w[1]] + ([xs[2][1]] if len(xs) > 2 else []), **a)
                sw = np.broadcast_to(w[2], w[1].shape).reshape(len(w[1]), -1)[:, 0]
                sw = sw.reshape((-1,) + (1,) * (w[1].ndim - 2))
            elif op == "ConvTranspose":  # weights (C_in, C_out / group, kh, kw), per channel along axis 1
                axes = (1,) * (w[1].ndim - 2)
                v = transposed_conv(x[1], w[1], a) + (xs[2][1].reshape((-1,) + axes) if len(xs) > 2 else 0)
                sw = np.tile(np.broadcast_to(w[2], w[1].shape)[(0, slice(None)) + (0,) * len(axes)],
                             a.get("group", 1)).reshape((-1,) + axes)
            elif op == "Gemm":
                return self.gemm(x, w, xs[2] if len(xs) > 2 else None, a)
            else:
                v = x[1] @ w[1]
                sw = np.broadcast_to(w[2], w[1].shape)[..., 0, :]  # per column
            return ("real", np.rint(v).astype(np.int64), scale_x * sw)
        if op in ("Relu", "Abs", "Neg") and xs[0][0] == "sum":  # requantized at the output's scale, then the op
            return ("after", op, xs[0])
        if op == "Relu":
            return ("real", np.maximum(xs[0][1], 0), xs[0][2]) if xs[0][0] == "real" else \
                ("fn", xs[0][1], lambda r, f=xs[0][2]: np.maximum(f(r), 0))
        if op == "GatherND":  # of constant indices
            v, idx, b = xs[0][1], xs[1][1].astype(np.int64), a.get("batch_dims", 0)
            rows, sites = v.reshape((-1,) + v.shape[b:]), idx.reshape((math.prod(v.shape[:b]), -1, idx.shape[-1]))
            got = np.stack([rows[i][tuple(j)] for i in range(len(rows)) for j in sites[i]])
            v = got.reshape(idx.shape[:-1] + v.shape[b + idx.shape[-1]:])
            return ("int", v) if xs[0][0] == "int" else ("real", v, xs[0][2])
        if op in ("MaxPool", "Flatten", "Reshape", "Transpose"):
            v = np.rint(one(op, [xs[0][1]] + [c[1] for c in xs[1:]], **a)).astype(np.int64)
            return ("int", v) if xs[0][0] == "int" else ("real", v, xs[0][2])
        if op == "AveragePool":
            return ("real", *average_pool(xs[0][1], xs[0][2], a))
        if op == "CumSum":  # numpy's inclusive sums of the integers, shifted for exclusive, reversed for reverse
            v, axis = xs[0][1], int(np.asarray(xs[1][1]).reshape(-1)[0])
            v = np.flip(v, axis) if a.get("reverse", 0) else v
            c = np.cumsum(v, axis=axis) - (v if a.get("exclusive", 0) else 0)
            return ("real", np.flip(c, axis) if a.get("reverse", 0) else c, xs[0][2])
        if op == "Trilu":  # numpy's triu / tril of the integers (x - z): 0 where dropped
            k = int(np.asarray(xs[1][1]).reshape(-1)[0]) if len(xs) > 1 else 0
            return ("real", (np.triu if a.get("upper", 1) else np.tril)(xs[0][1], k), xs[0][2])
        if op == "Hardmax":  # 1 at numpy's argmax of the integers (the first max) along the axis, at scale 1
            v, axis = xs[0][1], a.get("axis", -1) % xs[0][1].ndim
            hot = np.expand_dims(np.argmax(v, axis=axis), axis) == np.arange(v.shape[axis]).reshape(
                (-1,) + (1,) * (v.ndim - 1 - axis))
            return ("real", hot.astype(np.int64), np.array(Fraction(1), dtype=object))
        if op == "GlobalLpPool":  # the sum of |x| (p = 1), or the root of the sum of x^2 (p = 2), over the image
            v, axes = xs[0][1], tuple(range(2, xs[0][1].ndim))
            if a.get("p", 2) == 1:
                return ("real", np.abs(v).sum(axis=axes, keepdims=True), xs[0][2])
            return ("fn", ("real", (v * v).sum(axis=axes, keepdims=True), np.asarray(xs[0][2] ** 2, object)), np.sqrt)
        if op == "LpPool":  # the window sums of |x| (p = 1), or the root of those of x^2 (p = 2)
            v = xs[0][1]
            if a.get("p", 2) == 1:
                return ("real", pool_sums(np.abs(v), a), xs[0][2])
            return ("fn", ("real", pool_sums(v * v, a), np.asarray(xs[0][2] ** 2, object)), np.sqrt)
        if op == "GlobalAveragePool":
            v = xs[0][1].sum(axis=(2, 3), keepdims=True)
            return ("real", v, xs[0][2] / math.prod(xs[0][1].shape[2:]))
        if op in ("Add", "Sum", "Mean"):  # every operand's terms; Mean's scales over n
            terms = [t for x in xs for t in self.terms(x)]
            n = len(xs) if op == "Mean" else 1
            return self.sum_of([(k, v, np.asarray(sc / n, dtype=object)) for k, v, sc in terms])
        if op == "Sub":
            return self.sum_of(self.terms(xs[0]) + [self.negated(t) for t in self.terms(xs[1])])
        if op == "BatchNormalization":  # a x + c per channel, a and c in float64 as docs/import.md states
            g, b, mu, var = (np.asarray(c[1], np.float64) for c in xs[1:])
            a_ = g / np.sqrt(var + np.float64(np.float32(a.get("epsilon", 1e-5))))
            c_ = b - a_ * mu
            shape = (-1,) + (1,) * (xs[0][1].ndim - 2)
            size = np.vectorize(lambda q: Fraction(float(abs(q))) if q else Fraction(1), otypes=[object])
            sign = np.sign(a_).astype(np.int64).reshape(shape)  # the terms as the import writes them: sign, size
            return ("sum", [("real", xs[0][1] * sign, xs[0][2] * size(a_).reshape(shape)),
                            ("real", np.sign(c_).astype(np.int64).reshape(shape), size(c_).reshape(shape))])
        if op in ("Mul", "Div") and "const" in (xs[0][0], xs[1][0]):  # by a float constant: the scale times/over it
            x, c = (xs[0], xs[1][1]) if xs[1][0] == "const" else (xs[1], xs[0][1])
            c = np.asarray(c, np.float64)
            c = Fraction(float(c.reshape(-1)[0])) if c.size == 1 or (c == c.flat[0]).all() else \
                np.vectorize(lambda q: Fraction(float(q)), otypes=[object])(c)  # per element
            return ("real", x[1], x[2] * c if op == "Mul" else x[2] / c)
        if op == "ReduceMean":
            v = xs[0][1]
            axes = a.get("axes", None) if len(xs) < 2 else list(xs[1][1])
            axes = tuple(sorted(x % v.ndim for x in (axes if axes else range(v.ndim))))
            return ("real", np.asarray(v.sum(axis=axes, keepdims=bool(a.get("keepdims", 1)))),
                    np.asarray(xs[0][2] / math.prod(v.shape[i] for i in axes), dtype=object))
        if op == "Split":
            v, axis = xs[0][1], a.get("axis", 0) % xs[0][1].ndim
            cuts = np.cumsum(list(xs[1][1]) if len(xs) > 1 else a["split"])[:-1]
            return [("real", part, xs[0][2]) for part in np.split(v, cuts, axis=axis)]
        if op == "Mul":
            return ("real", xs[0][1] * xs[1][1], xs[0][2] * xs[1][2])
        if op == "Pow" and float(np.asarray(xs[1][1]).reshape(())) in (1, 2, 3, 4):  # exact products; else a table
            k = int(np.asarray(xs[1][1]).reshape(()))
            return ("real", xs[0][1] ** k, xs[0][2] ** k)
        if op == "Concat":
            axis = a["axis"]
            v = np.concatenate([x[1] for x in xs], axis=axis)
            scale = np.concatenate([np.broadcast_to(np.asarray(x[2], dtype=object).reshape((1,) * x[1].ndim),
                                                    x[1].shape[:axis] + (x[1].shape[axis],) + (1,) *
                                                    (x[1].ndim - axis - 1)) for x in xs], axis=axis)
            return ("real", v, scale)
        if op == "Sigmoid":
            return ("fn", xs[0], lambda r: 1 / (1 + np.exp(-r)))
        if op in FN:  # a table of the exact input values (log 0 = -inf and 1 / 0 = inf saturate)
            f = FN[op](xs[1:])
            return ("fn", xs[0], f) if xs[0][0] == "real" else ("fn", xs[0][1], lambda r, g=xs[0][2]: f(g(r)))
        if op == "ReduceProd":  # numpy's product of the integers (Python ints: exact) at s^n
            v = xs[0][1]
            axes = a.get("axes") if len(xs) < 2 else list(xs[1][1])
            axes = tuple(sorted(x % v.ndim for x in (axes if axes else range(v.ndim))))
            p = np.prod(v.astype(object), axis=axes, keepdims=bool(a.get("keepdims", 1)))
            return ("real", np.asarray(p).astype(np.int64), xs[0][2] ** math.prod(v.shape[i] for i in axes))
        if op == "ReduceLogSum":  # log of ReduceSum's exact sum (a table of it: log 0 = -inf saturates)
            return ("fn", self.float_op("ReduceSum", xs, a), lambda r: np.log(np.where(r >= 0, r, np.nan)))
        if op in ("GlobalMaxPool", "ReduceMax", "ReduceMin", "ReduceSum"):
            v = xs[0][1]
            axes = tuple(range(2, v.ndim)) if op == "GlobalMaxPool" else a.get("axes") if len(xs) < 2 else \
                list(xs[1][1])
            axes = tuple(sorted(x % v.ndim for x in (axes if axes else range(v.ndim))))
            f = {"ReduceSum": np.sum, "ReduceMin": np.min}.get(op, np.max)
            return ("real", np.asarray(f(v, axis=axes, keepdims=bool(a.get("keepdims", 1)))), xs[0][2])
        if op == "PRelu":  # max(x, 0) + a min(x, 0): the sum of the two parts, the second at scale s |a| (signed)
            v, sl = xs[0][1], np.asarray(xs[1][1], np.float64)
            size = np.vectorize(lambda q: Fraction(float(abs(q))) if q else Fraction(1), otypes=[object])
            return ("sum", [("real", np.maximum(v, 0), xs[0][2]),
                            ("real", np.minimum(v, 0) * np.sign(sl).astype(np.int64), xs[0][2] * size(sl))])
        raise AssertionError(f"the oracle has no {op}")

    def gemm(self, x, w, c, a):
        """alpha A' B' + beta C as docs/import.md states: the product's integers times sign(alpha) at scale |alpha|
        s_a s_b; C (("real", ints, None): QGemm's, in the accumulator) folded into it as a bias where it is a
        constant of one value per column at beta s_c = alpha s_a s_b to float32's rounding (times sign(beta /
        alpha)), else a second term, times sign(beta) at |beta| s_c."""
        alpha, beta = Fraction(float(a.get("alpha", 1.0))), Fraction(float(a.get("beta", 1.0)))
        xa = x[1].T if a.get("transA", 0) else x[1]
        wv = w[1].T if a.get("transB", 0) else w[1]
        sw = np.broadcast_to(np.asarray(w[2], dtype=object), w[1].shape)
        sw = (sw.T if a.get("transB", 0) else sw)[0]
        scale = x[2].reshape(()) * sw
        v = xa @ wv
        sign = 1 if alpha > 0 else -1
        if c is None or beta == 0:
            return ("real", sign * v, scale * abs(alpha))
        if c[0] == "const":  # a float C: round_half_even(C / unit) of the exact rationals, unit = |alpha / beta| scale
            unit = np.asarray(scale * abs(alpha / beta), dtype=object)
            cv = np.asarray(c[1], np.float64)
            shape = np.broadcast_shapes(cv.shape, unit.shape)
            ints = np.array([round(Fraction(float(f)) / u) for f, u in zip(np.broadcast_to(cv, shape).flat,
                                                                            np.broadcast_to(unit, shape).flat)],
                            dtype=object).reshape(shape).astype(np.int64)
            c = ("real", self.constant(ints), unit)
        if c[2] is None:  # QGemm: C in the accumulator, beta unread
            return ("real", sign * (v + c[1]), scale * abs(alpha))
        ints, sc = c[1], np.asarray(c[2], dtype=object)
        per_column = ints.size in (1, v.shape[1]) and all(n == 1 for n in ints.shape[:-1]) and sc.size in (1, ints.size)
        if per_column:
            have = np.broadcast_to(sc.reshape(-1) * abs(beta / alpha), (v.shape[1],))
            want = np.broadcast_to(scale, (v.shape[1],))
            if all(abs(hv - wv_) <= max(wv_ / 2**22, Fraction(1, 2**149)) for hv, wv_ in zip(have, want)):
                bias = ints.reshape(-1) * (1 if beta / alpha > 0 else -1)
                return ("real", sign * (v + bias), scale * abs(alpha))
        term = ints * (1 if beta > 0 else -1)
        return self.sum_of([("real", sign * v, scale * abs(alpha)),
                            ("real", self.constant(term) if id(ints) in self.fixed else term, sc * abs(beta))])

    def qop(self, name, op, ins, a, env):
        def dq3(k, axis=1):
            return self.dq(env.get(ins[k]), ins[k:k + 3], {"axis": axis})

        if op == "QLinearConv":
            x, w = dq3(0), dq3(3, 0)
            b = ("real", self.inits[ins[8]].astype(np.int64), None) if len(ins) > 8 else None
            val = self.float_op("Conv", [x, w] + ([b] if b else []), a)
            return self.q(name, val, ins[6], ins[7])
        if op == "QGemm":
            x, w = dq3(0), dq3(3, 0 if a.get("transB", 0) else 1)
            b = ("real", self.inits[ins[6]].astype(np.int64), None) if len(ins) > 6 and ins[6] else None
            val = self.float_op("Gemm", [x, w] + ([b] if b else []), a)
            return self.q(name, val, ins[7], ins[8])
        if op == "QLinearMatMul":
            val = self.float_op("MatMul", [dq3(0), dq3(3, -1)], a)  # b per column: its last axis
            return self.q(name, val, ins[6], ins[7])
        if op in ("QLinearAdd", "QLinearMul"):
            val = self.float_op(op[len("QLinear"):], [dq3(0), dq3(3)], a)
            return self.q(name, val, ins[6], ins[7])
        if op == "QLinearConcat":
            xs = [dq3(k) for k in range(2, len(ins), 3)]
            return self.q(name, self.float_op("Concat", xs, a), ins[0], ins[1])
        val = self.float_op(op[len("QLinear"):], [dq3(0)], a)
        return self.q(name, val, ins[3], ins[4])


def pool_windows(n: int, k: int, s: int, b: int, e: int, ceil: bool) -> list[tuple[int, int, int]]:
    """(start, end, counted end) of each pooling window on one axis of n values, as onnxruntime places them where
    the last starts inside the input: floor or ceil((n + b + e - k) / s) + 1 windows; a window reads [start, start +
    k) of the padded axis, counted (with count_include_pad) up to the end padding."""
    out = (n + b + e - k + (s - 1 if ceil else 0)) // s + 1
    return [(o * s - b, o * s - b + k, min(o * s - b + k, n + e)) for o in range(out)]


def pool_sums(v: np.ndarray, a: dict) -> np.ndarray:
    """The pools' window sums of the integers v (N, C, spatial...) by their definition, axis by axis: window o reads
    o s + j d - b for taps j < k, positions outside the axis adding 0; pads from ``pads`` or ``auto_pad`` (SAME: the
    total (ceil(n / s) - 1) s + (k - 1) d + 1 - n, its half truncated toward 0 first for SAME_UPPER, of total + 1 for
    SAME_LOWER, as onnxruntime: a negative total crops); ceil_mode's count where the last window starts inside the
    input."""
    n = v.ndim - 2
    k, st, dil = a["kernel_shape"], a.get("strides", [1] * n), a.get("dilations", [1] * n)
    auto, pads = a.get("auto_pad", "NOTSET"), list(a.get("pads", [0] * 2 * n))
    if isinstance(auto, bytes):
        auto = auto.decode()
    for i in range(n):
        size = v.shape[2 + i]
        span = (k[i] - 1) * dil[i] + 1
        if auto in ("SAME_UPPER", "SAME_LOWER"):  # a negative total crops (onnxruntime's C division)
            total = (-(-size // st[i]) - 1) * st[i] + span - size
            pads[i] = int((total + (auto == "SAME_LOWER")) / 2)
            pads[n + i] = total - pads[i]
        elif auto == "VALID":
            pads[i] = pads[n + i] = 0
        b, e = pads[i], pads[n + i]
        out = (size + b + e - span + (st[i] - 1 if a.get("ceil_mode", 0) else 0)) // st[i] + 1
        if a.get("ceil_mode", 0) and (out - 1) * st[i] - b >= size:
            out -= 1
        moved = np.moveaxis(v, 2 + i, -1)
        sums = np.zeros(moved.shape[:-1] + (out,), np.int64)
        for o in range(out):
            for j in range(k[i]):
                if 0 <= o * st[i] + j * dil[i] - b < size:
                    sums[..., o] += moved[..., o * st[i] + j * dil[i] - b]
        v = np.moveaxis(sums, -1, 2 + i)
    return v


def average_pool(v: np.ndarray, scale, a: dict) -> tuple[np.ndarray, np.ndarray]:
    """AveragePool (any spatial axes, explicit pads) of integers v at ``scale``: (the window sums, scale / count per
    window), a window counting the input positions it reads, or with count_include_pad those up to the end padding."""
    n = v.ndim - 2
    k, st, pads = a["kernel_shape"], a.get("strides", [1] * n), a.get("pads", [0] * 2 * n)
    count = np.ones((), object)
    for i in range(n):
        size = v.shape[2 + i]
        axis = pool_windows(size, k[i], st[i], pads[i], pads[n + i], bool(a.get("ceil_mode", 0)))
        per = [c - s0 if a.get("count_include_pad", 0) else min(e0, size) - max(s0, 0) for s0, e0, c in axis]
        count = np.multiply.outer(count, np.array(per, object))
    sums = pool_sums(v, {**a, "auto_pad": "NOTSET", "pads": pads})
    return sums, scale.reshape(()) / np.vectorize(Fraction, otypes=[object])(count)


def layernorm_oracle(x: np.ndarray, view: tuple[int, int], s: Fraction, eps: Fraction, gamma: list[Fraction],
                     beta: list[Fraction], s_out: Fraction, zo: int, lo: int, hi: int, p) -> np.ndarray:
    """QuantizeLinear(LayerNormalization) by the integer form of docs/import.md, with the import's T, K, F, j and k
    and everything else recomputed here: u = x - c (x the stored integers, as the import reads them: the wide
    form's floors of sums of u are not translation-invariant), D = n u - sum u, V = n sum u^2 - (sum u)^2, the level
    m and bucket of V, R = round(2^(F+m+h) / sqrt(v + G)) (math.sqrt, v the bucket's middle, G = eps n^2 / s^2),
    N = trunc(D R / 2^(m+j)) (h = 0), else trunc(D (R >> h) / 2^(m+j)) + trunc(D (R mod 2^h) / 2^(m+j+h)),
    y = round_half_up((N m_i + B_i) / 2^k) with m_i = round(gamma_i 2^(k-F+j) / s_out) (s = 0), else
    round_half_up((N (m_i >> s) + trunc(N (m_i mod 2^s) / 2^s) + B_i) / 2^k) with m_i = round(gamma_i 2^(k+s-F+j) /
    s_out), B_i = round(beta_i 2^k / s_out), + z_out, saturated. The plan's clip of N is not applied (it must be
    exact)."""
    outer, n = view
    u = x.reshape(outer, n).astype(object) - p.centre
    total = u.sum(axis=1, keepdims=True)
    d = n * u - total
    v = n * (u * u).sum(axis=1, keepdims=True) - total * total
    g = float(eps * n * n / (s * s))
    t, q = p.table_bits, 1 << (p.table_bits - 2)

    def one(vi: int) -> tuple[int, int]:  # (R, m) of a row's V
        m = sum(1 for k in range(p.levels) if vi >= (1 << t) << (2 * k))
        if vi == 0:
            return 0, 0
        mid = vi if m == 0 else (vi >> (2 * m) << (2 * m)) + ((1 << (2 * m)) - 1) / 2
        return math.floor(math.ldexp(1 / math.sqrt(mid + g), p.frac_bits + m + p.split) + 0.5), m

    assert q  # T >= 2
    rm = [one(int(vi)) for vi in v.reshape(-1)]
    if p.wide:
        d, rm = wide_rows(u, total, d, n, g, p)
    f, j, k = p.frac_bits, p.extra, p.shift
    sg = p.gamma_split
    ms = [math.floor(gi / s_out * 2 ** (k + sg - f + j) + Fraction(1, 2)) for gi in gamma]
    bs = [math.floor(bi / s_out * 2 ** k + Fraction(1, 2)) for bi in beta]
    out = np.empty((outer, n), np.int64)
    for row, (r, m) in enumerate(rm):
        for i in range(n):
            nn = 0
            for part, shift in ([(r >> p.split, m + j), (r & ((1 << p.split) - 1), m + j + p.split)] if p.split
                                else [(r, m + j)]):
                prod = int(d[row, i]) * part
                nn += abs(prod) >> shift if prod >= 0 else -(abs(prod) >> shift)  # C's truncation
            if sg:
                lowp = nn * (ms[i] & ((1 << sg) - 1))
                scaled = nn * (ms[i] >> sg) + (abs(lowp) >> sg if lowp >= 0 else -(abs(lowp) >> sg))
            else:
                scaled = nn * ms[i]
            y = (scaled + bs[i] + (1 << (k - 1))) >> k
            out[row, i] = min(max(y + zo, lo), hi)
    return out.reshape(x.shape)


def wide_rows(u, total, d, n: int, g: float, p):
    """The wide form's (docs/import.md, "Rows of any width") D' = trunc(D / 2^p) and (R, x) of each row, with
    the plan's w, c, z, g, K, T, K levels and per-entry p and x: a = 2^c u - q, q = trunc(2^c sum u / n),
    r = 2^c sum u - n q, Y = clip(floor(sum a^2 / 2^z) - floor(trunc(r / 2^g)^2 / K), 0, y_max), its level m and
    bucket after the exact V's entries, or where Y <= y_small the exact V's level and bucket (T_s and K_s levels);
    R recomputed here (math.sqrt) as round_half_up(2^(e+h) (1 / sqrt(A + G) + 1 / sqrt(B + G)) / 2), e = F + p + x,
    A = max(n - 1, u (Y_a - 1)), B = max(A, min(u (Y_b + 1), n^2 w^2 / 4)), u = n 2^z / 4^c, or for the exact V
    A = max(n - 1, V_a), B = max(A, V_b) over its bucket V_a..V_b."""
    wide, t, h = p.wide, p.table_bits, p.split
    total = total.reshape(-1)
    per = float(Fraction(n << wide.z, 4 ** wide.scale))
    v_top = n * n * wide.width ** 2 // 4

    def trunc(a: int, b: int) -> int:  # C's division
        return abs(a) // b * (1 if a >= 0 else -1)

    def bucket(v: int, t: int, levels: int, top: int) -> tuple[int, int, int]:  # (entry, first, last)
        m = sum(1 for lv in range(levels) if v >= (1 << t) << (2 * lv))
        b = v >> (2 * m)
        return m * (3 << (t - 2)) + b, b << (2 * m), min(((b + 1) << (2 * m)) - 1, top)

    t_s, levels_s = wide.small_shape
    first = (1 << t_s) + levels_s * (3 << (t_s - 2)) if wide.cap else 0
    rows, out = [], np.empty_like(d)
    for row in range(u.shape[0]):
        qc = trunc(int(total[row]) << wide.scale, n)
        r = (int(total[row]) << wide.scale) - n * qc
        big_p = sum(((int(x) << wide.scale) - qc) ** 2 for x in u[row])
        y = min(max(big_p // 2 ** wide.z - trunc(r, 2 ** wide.g) ** 2 // wide.k, 0), wide.y_max)
        if y <= wide.y_small:
            v = (n * big_p - r * r) // 4 ** wide.scale
            entry, va, vb = bucket(v, t_s, levels_s, wide.v_small)
            a_nom = max(va, n - 1)
            b_nom = max(min(vb, v_top), a_nom)
        else:
            entry, ya, yb = bucket(y, t, p.levels, wide.y_max)
            entry += first
            a_nom = max(per * (ya - 1), n - 1)
            b_nom = max(min(per * (yb + 1), float(v_top)), a_nom)
        shift, x = int(wide.shifts[entry]), int(wide.exps[entry])
        mid = (1 / math.sqrt(a_nom + g) + 1 / math.sqrt(b_nom + g)) / 2
        # a constant row (V = 0, D = 0) may reach an entry no other row reaches, of R = 0: its N is 0 either way
        constant = not any(int(v) for v in d[row])
        rows.append((0 if constant else math.floor(math.ldexp(mid, p.frac_bits + shift + x + h) + 0.5), x))
        out[row] = [trunc(int(v), 1 << shift) for v in d[row]]
    return out, rows


def conv_transpose_qdq(rng, x_shape, x_type, zx: int, w_shape, group: int, per_channel: bool, with_bias: bool,
                       **attrs) -> onnx.ModelProto:
    """QDQ ConvTranspose "up" as quantize_static writes it: x of x_type at 0.05 and zero point zx; random int8
    weights of w_shape (C_in, C_out / group, k...) at 0.01, or per output channel along axis 1 at 0.005-0.02; an
    int32 bias at 0.05 times the weights' scales; then QuantizeLinear to int8 at 0.1."""
    per = w_shape[1]
    w = rng.integers(-127, 128, size=w_shape).astype(np.int8)
    sw = (rng.uniform(0.5, 2, per) * 0.01).astype(np.float32) if per_channel else np.float32(0.01)
    inits = {"s": np.float32(0.05), "zx": h.tensor_dtype_to_np_dtype(x_type).type(zx), "w": w, "sw": sw,
             "so": np.float32(0.1), "zo": np.int8(0)}
    ins = ["xf", "wf"]
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"], axis=1)]
    if with_bias:
        inits.update(b=rng.integers(-300, 300, per * group).astype(np.int32),
                     sb=(np.float32(0.05) * np.tile(np.broadcast_to(sw, (per,)), group)).astype(np.float32))
        nodes.append(h.make_node("DequantizeLinear", ["b", "sb"], ["bf"], axis=0))
        ins.append("bf")
    nodes += [h.make_node("ConvTranspose", ins, ["c"], name="up", group=group, **attrs),
              h.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"])]
    return qdq(nodes, x_shape, x_type, inits, T.INT8)


def qdq(nodes, x_shape, x_type, inits: dict, out_type, opset=17, out="y"):
    """A model of ``nodes`` reading the integer input ``x``, writing ``out``; ``inits`` as numpy values."""
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", x_type, list(x_shape))],
                     [h.make_tensor_value_info(out, out_type, None)],
                     [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    return onnx_model(g, opset, {"com.microsoft": 1})


def declared(m, shape):
    """``m`` with its output's shape declared."""
    m.graph.output[0].CopyFrom(h.make_tensor_value_info(m.graph.output[0].name, T.INT8, list(shape)))
    return m


def written_softmax(shape, axes, shift: str, form: str, keep: bool, sum_qdq: bool, expand: bool, out_type,
                    zx: int, zo: int, opset: int = 17):
    """DequantizeLinear(x) -> [less a shift constant along ``axes``] -> Exp -> ReduceSum over ``axes`` (keepdims or
    not, then reshaped to the keepdims shape) [-> QuantizeLinear/DequantizeLinear] [-> Expand] -> Div, or Mul by
    its Reciprocal -> [QuantizeLinear]. shift: none; max (ReduceMax over ``axes``, requantized at its own scale,
    as Magika's); const (a float constant of the keepdims shape; before opset 13 a Constant node, the axes an
    attribute); max-float (ReduceMax read unquantized)."""
    keep_shape = [1 if a in axes else n for a, n in enumerate(shape)]
    inits = {"s": np.float32(0.0625), "zx": np.int8(zx), "sm": np.float32(0.09), "zm": np.int8(0),
             "axes": np.array(axes, np.int64), "kshape": np.array(keep_shape, np.int64),
             "full": np.array(shape, np.int64), "ss": np.float32(0.05), "zs": np.uint8(0),
             "c": np.linspace(-3, 4, math.prod(keep_shape)).reshape(keep_shape).astype(np.float32)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"])]
    if shift in ("max", "max-float"):
        nodes.append(h.make_node("ReduceMax", ["xf"], ["mx"], axes=axes, keepdims=1))
        if shift == "max":
            nodes += [h.make_node("QuantizeLinear", ["mx", "sm", "zm"], ["mq"]),
                      h.make_node("DequantizeLinear", ["mq", "sm", "zm"], ["m"])]
        nodes.append(h.make_node("Sub", ["xf", "mx" if shift == "max-float" else "m"], ["u"]))
    elif shift == "const":
        if opset < 13:
            nodes.append(h.make_node("Constant", [], ["cn"], value=nh.from_array(inits.pop("c"), "cv")))
        nodes.append(h.make_node("Sub", ["xf", "c" if opset >= 13 else "cn"], ["u"]))
    nodes += [h.make_node("Exp", ["u" if shift != "none" else "xf"], ["e"]),
              h.make_node("ReduceSum", ["e", "axes"], ["sum0"], keepdims=int(keep)) if opset >= 13 else
              h.make_node("ReduceSum", ["e"], ["sum0"], keepdims=int(keep), axes=axes)]
    last = "sum0"
    if not keep:
        nodes.append(h.make_node("Reshape", [last, "kshape"], ["sumk"]))
        last = "sumk"
    if sum_qdq:
        nodes += [h.make_node("QuantizeLinear", [last, "ss", "zs"], ["sq"]),
                  h.make_node("DequantizeLinear", ["sq", "ss", "zs"], ["sd"])]
        last = "sd"
    if expand:
        nodes.append(h.make_node("Expand", [last, "full"], ["sx"]))
        last = "sx"
    if form == "div":
        nodes.append(h.make_node("Div", ["e", last], ["p"], name="softmax_div"))
    else:
        nodes += [h.make_node("Reciprocal", [last], ["r"]),
                  h.make_node("Mul", ["e", "r"] if form == "mul" else ["r", "e"], ["p"], name="softmax_div")]
    if out_type == T.FLOAT:
        return qdq(nodes, shape, T.INT8, inits, T.FLOAT, opset=opset, out="p")
    inits.update(so=np.float32(1 / 256), zo={T.INT8: np.int8, T.UINT8: np.uint8}[out_type](zo))
    nodes.append(h.make_node("QuantizeLinear", ["p", "so", "zo"], ["y"]))
    return qdq(nodes, shape, T.INT8, inits, out_type, opset=opset)


def long_conv_bias_apart(rng, channels: int = 2048, group: int = 1, kernel=(3, 3), outputs: int = 2):
    """A QDQ Conv of ``channels`` uint8 channels in ``group`` groups by a ``kernel`` kernel, padded 1, into
    ``outputs`` int8 channels, whose int32 bias (+-2^23) would take its output past 32 bits beside the product (the
    import adds it apart)."""
    inits = {"s": np.float32(0.02), "zx": np.uint8(3),
             "w": rng.integers(-127, 128, (outputs, channels // group, *kernel)).astype(np.int8),
             "sw": np.float32(0.004), "b": np.resize(np.array([2**23 - 5, -2**23 + 7], np.int32), outputs),
             "sb": np.float32(np.float32(0.02) * np.float32(0.004)), "so": np.float32(40.0), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"]),
             h.make_node("DequantizeLinear", ["b", "sb"], ["bf"]),
             h.make_node("Conv", ["xf", "wf", "bf"], ["c"], kernel_shape=list(kernel), pads=[1, 1, 1, 1],
                         group=group),
             h.make_node("QuantizeLinear", ["c", "so", "zo"], ["y"])]
    return qdq(nodes, (1, channels, kernel[0], kernel[1]), T.UINT8, inits, T.INT8)


def min_max_quotient(form: str, shape, x_type, m_type, o_type, sx, zx, sm, zm, sM, zM, so, zo, eps, opset=17):
    """A min-max normalization, QDQ: x -> min, max over axes (1, 2) (keepdims), each QuantizeLinear'd at its own
    scale; y = Q(a / b): a = x - min; b = max - min [+ eps] ("minmax"), or max ("max", basic-pitch's)."""
    x_np, m_np, o_np = (h.tensor_dtype_to_np_dtype(t).type for t in (x_type, m_type, o_type))
    inits = {"sx": np.float32(sx), "zx": x_np(zx), "sm": np.float32(sm), "zm": m_np(zm), "sM": np.float32(sM),
             "zM": m_np(zM), "so": np.float32(so), "zo": o_np(zo)}
    nodes = [h.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             h.make_node("ReduceMin", ["xf"], ["mn"], axes=[1, 2], keepdims=1),
             h.make_node("QuantizeLinear", ["mn", "sm", "zm"], ["mq"]),
             h.make_node("DequantizeLinear", ["mq", "sm", "zm"], ["mf"]),
             h.make_node("ReduceMax", ["xf"], ["mx"], axes=[1, 2], keepdims=1),
             h.make_node("QuantizeLinear", ["mx", "sM", "zM"], ["Mq"]),
             h.make_node("DequantizeLinear", ["Mq", "sM", "zM"], ["Mf"]),
             h.make_node("Sub", ["xf", "mf"], ["a"])]
    b = "Mf"
    if form == "minmax":
        nodes.append(h.make_node("Sub", ["Mf", "mf"], ["b"]))
        b = "b"
        if eps:
            inits["eps"] = np.float32(eps)
            nodes.append(h.make_node("Add", ["b", "eps"], ["be"]))
            b = "be"
    nodes += [h.make_node("Div", ["a", b], ["r"], name="quotient"),
              h.make_node("QuantizeLinear", ["r", "so", "zo"], ["y"])]
    return qdq(nodes, shape, x_type, inits, o_type, opset=min(opset, 17))


def long_dense(rng, x_type: int, k: int, units: int, form: str, so: float, signs: bool = False):
    """A QDQ Gemm (``form`` "gemm", or "gemm-bias" with an int32 bias of +-2^23) or MatMul of a (1, k) input of
    ``x_type`` (uint8 with a random zero point, or int8 with zero point 0) by int8 weights into ``units`` outputs
    at output scale ``so``: past k = 2^15 (uint8: its 9-bit values in two halves) or 2^16 - 1 (int8) the dense alone
    passes the runtime's 32 bits. ``signs``: the weights of each output of one sign (the sums reach their bound)."""
    zx = int(rng.integers(0, 256)) if x_type == T.UINT8 else 0
    w = rng.integers(-127, 128, (units, k))
    if signs:
        w = np.abs(w) * np.where(np.arange(units) % 2, -1, 1)[:, None]
    sw = np.float32(0.004)
    inits = {"s": np.float32(0.02), "zx": (np.uint8 if x_type == T.UINT8 else np.int8)(zx),
             "w": w.astype(np.int8).T.copy() if form == "matmul" else w.astype(np.int8), "sw": sw,
             "b": rng.integers(-2**23, 2**23, units).astype(np.int32), "sb": np.float32(np.float32(0.02) * sw),
             "so": np.float32(so), "zo": np.int8(0)}
    nodes = [h.make_node("DequantizeLinear", ["x", "s", "zx"], ["xf"]),
             h.make_node("DequantizeLinear", ["w", "sw"], ["wf"]),
             h.make_node("DequantizeLinear", ["b", "sb"], ["bf"]),
             h.make_node("MatMul", ["xf", "wf"], ["g"]) if form == "matmul" else
             h.make_node("Gemm", ["xf", "wf"] + (["bf"] if form == "gemm-bias" else []), ["g"], transB=1),
             h.make_node("QuantizeLinear", ["g", "so", "zo"], ["y"])]
    return qdq(nodes, (1, k), x_type, inits, T.INT8)
