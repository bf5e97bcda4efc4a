"""Per node, how far a CVM import of a QDQ model lies from the model's own arithmetic, given the same integers in.

Every QuantizeLinear of the model ends a piece: the DequantizeLinear nodes that feed it, the float ops between
(Conv, ConvTranspose, Add, Mul, Div, Resize, Concat, Sigmoid, HardSigmoid, GlobalAveragePool, ...) and the
QuantizeLinear. The model is imported cut at every QuantizeLinear's output (`import_model(..., outputs=[...])`) and
run once on the reference executor; each piece is then run alone on the CVM integers of its own quantized inputs,
by two oracles:

* the exact arithmetic (docs/import.md): the piece in float64 with onnx's reference implementation,
  DequantizeLinear as (q - z) s and QuantizeLinear as round half to even of y / s, + z, saturated. float64 is
  exact on these integers up to its rounding of products and sums (2^-52 relative), far inside any plan's delta;
* onnxruntime (session.x64quantprecision) running the QDQ pieces as it runs the model (its fused QLinear kernels).

Per kind of piece (its float ops): the elements, the share where CVM differs from the exact arithmetic, the
largest difference, the mean signed difference (a bias), and the share where onnxruntime differs from it. Then the
whole model against the float model within the output's range (real_models.in_range), in output steps (each
sample's mean), by CVM, by the exact arithmetic (the distance an exact implementation of the QDQ model has) and by
onnxruntime's default session, each as a ratio to onnxruntime's, over all samples and its range over sets of 8.

Run: python benchmarks/layer_exactness.py MODEL_QDQ.onnx FLOAT.onnx SAMPLES.npy [--one-part]   (N samples of the input's shape;
the first is used per node, all of them for the whole model)
"""
from __future__ import annotations

import argparse
import collections
import logging

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.executor import execute
from real_models import cpu, in_range

NP = {T.UINT8: np.uint8, T.INT8: np.int8, T.UINT16: np.uint16, T.INT16: np.int16}


def exact(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """``model`` in float64: DequantizeLinear as (q - z) s, QuantizeLinear as Round(y / s) + z, clipped (Round is
    half to even); float initializers as float64, a Resize's scales and roi kept."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {i.name: nh.to_array(i) for i in g.initializer}
    keep = {i for n in g.node if n.op_type in ("Resize", "Upsample") for i in n.input[1:]}
    extra, nodes = [], []

    def const(name: str, v) -> str:
        extra.append(nh.from_array(np.asarray(v, np.float64), name))
        return name

    for k, n in enumerate(g.node):
        axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
        if n.op_type == "DequantizeLinear":
            s, z = inits[n.input[1]].astype(np.float64), inits[n.input[2]].astype(np.float64)
            if s.size > 1:  # per channel: weights, or a piece's input
                rank = len(inits[n.input[0]].shape if n.input[0] in inits else shapes[n.input[0]])
                shape = (-1,) + (1,) * (rank - 1 - axis % rank)
                s, z = s.reshape(shape), z.reshape(shape)
            nodes += [h.make_node("Cast", [n.input[0]], [f"dq{k}c"], to=T.DOUBLE),
                      h.make_node("Sub", [f"dq{k}c", const(f"dq{k}z", z)], [f"dq{k}s"]),
                      h.make_node("Mul", [f"dq{k}s", const(f"dq{k}m", s)], [n.output[0]])]
        elif n.op_type == "QuantizeLinear":
            s, z = inits[n.input[1]].astype(np.float64), inits[n.input[2]]
            info = np.iinfo(z.dtype)
            src = n.input[0]
            if src in (i.name for i in g.input):
                nodes.append(h.make_node("Cast", [src], [f"q{k}x"], to=T.DOUBLE))
                src = f"q{k}x"
            nodes += [h.make_node("Div", [src, const(f"q{k}s", s)], [f"q{k}d"]),
                      h.make_node("Round", [f"q{k}d"], [f"q{k}r"]),
                      h.make_node("Add", [f"q{k}r", const(f"q{k}z", z.astype(np.float64))], [f"q{k}a"]),
                      h.make_node("Clip", [f"q{k}a", const(f"q{k}lo", info.min), const(f"q{k}hi", info.max)],
                                  [f"q{k}k"]),
                      h.make_node("Cast", [f"q{k}k"], [n.output[0]],
                                  to=h.np_dtype_to_tensor_dtype(z.dtype))]
        else:
            nodes.append(n)
    inits_ = [nh.from_array(v.astype(np.float64), name) if v.dtype == np.float32 and name not in keep
              else nh.from_array(v, name) for name, v in inits.items()]
    del g.node[:], g.initializer[:], g.value_info[:]
    g.node.extend(nodes)
    g.initializer.extend(inits_ + extra)
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("float_model")
    ap.add_argument("samples")
    ap.add_argument("--one-part", action="store_true", help="import with one-part products (default: two-part "
                    "products where closer)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    import onnxruntime as ort

    q = onnx.load(args.model)
    g = q.graph
    samples = np.load(args.samples).astype(np.float32)
    x = samples[:1]
    quantizers = [n for n in g.node if n.op_type == "QuantizeLinear"]
    names = [n.output[0] for n in quantizers]
    zeros = {n.output[0]: next(i for i in g.initializer if i.name == n.input[2]).data_type for n in quantizers}
    imp = import_model(q, outputs=names, two_part=not args.one_part)
    cvm = dict(zip(names, execute(imp.graph, {"data": imp.edges.input.quantize(x)})))

    pieces = onnx.ModelProto()  # every DequantizeLinear of a quantized activation reads a new input: its CVM values
    pieces.CopyFrom(q)
    fed = set()
    for n in pieces.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in cvm:
            fed.add(n.input[0])
            n.input[0] += ":cvm"
    for t in sorted(fed):
        pieces.graph.input.append(h.make_tensor_value_info(t + ":cvm", zeros[t], cvm[t].shape))
    del pieces.graph.output[:]
    pieces.graph.output.extend(h.make_tensor_value_info(t, zeros[t], None) for t in names)
    feed = {t + ":cvm": cvm[t].astype(NP[zeros[t]]) for t in fed} | {g.input[0].name: x}
    so = ort.SessionOptions()
    so.add_session_config_entry("session.x64quantprecision", "1")
    ours = dict(zip(names, ort.InferenceSession(pieces.SerializeToString(), so,
                                                providers=["CPUExecutionProvider"]).run(names, feed)))
    want = dict(zip(names, ReferenceEvaluator(exact(pieces, {t + ":cvm": cvm[t].shape for t in fed})).run(names, feed)))

    made = {o: n for n in g.node for o in n.output}

    def ops(t: str) -> str:
        out, todo = [], [t]
        while todo:
            n = made.get(todo.pop())
            if n is not None and n.op_type != "DequantizeLinear":
                out.append(n.op_type)
                todo += [i for i in n.input if i]
        return "+".join(reversed(out)) or "(the input)"

    rows = collections.defaultdict(lambda: np.zeros(6))
    for n in quantizers:
        t = n.output[0]
        d = cvm[t].astype(np.int64) - want[t].astype(np.int64).reshape(cvm[t].shape)
        o = ours[t].astype(np.int64) != want[t].astype(np.int64)
        r = rows[ops(n.input[0])]
        r += [1, d.size, (d != 0).sum(), 0, d.sum(), o.sum()]
        r[3] = max(r[3], np.abs(d).max())
    print(f"{cpu()}; {args.model}; per node on sample 0")
    print("| piece | count | elements | CVM differs | max | mean signed | onnxruntime differs |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    for k, (c, size, dif, mx, total, o) in sorted(rows.items(), key=lambda kv: -kv[1][2]):
        print(f"| {k} | {int(c)} | {int(size)} | {dif / size:.3%} | {int(mx)} | {total / size:+.5f} | "
              f"{o / size:.3%} |")

    # the whole model: CVM and the exact arithmetic against the float model
    whole = import_model(q, two_part=not args.one_part)
    full = exact(q, {})
    ref = ReferenceEvaluator(full)
    fsess = ort.InferenceSession(onnx.load(args.float_model).SerializeToString(), providers=["CPUExecutionProvider"])
    qsess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    step = float(np.max(whole.edges.outputs[0].scale))
    dist = {"CVM": [], "exact QDQ arithmetic": [], "onnxruntime (as real_models.py runs it)": []}
    for s in samples:
        f = in_range(fsess.run(None, {fsess.get_inputs()[0].name: s[None]})[0].astype(np.float64),
                     whole.edges.outputs[0])
        [c] = execute(whole.graph, {"data": whole.edges.input.quantize(s[None])})
        e = ref.run(None, {g.input[0].name: s[None]})[0]
        o = qsess.run(None, {g.input[0].name: s[None]})[0]
        for k, y in zip(dist, (whole.edges.outputs[0].dequantize(c), e, o)):
            dist[k].append(np.abs(np.asarray(y, np.float64).reshape(f.shape) - f).mean() / step)
    base = np.array(dist["onnxruntime (as real_models.py runs it)"])
    for k, v in dist.items():
        v = np.array(v)
        sets = [v[i:i + 8].sum() / base[i:i + 8].sum() for i in range(0, len(v) - 7, 8)]
        spread = f" (sets of 8: {min(sets):.2f}x-{max(sets):.2f}x)" if sets else ""
        print(f"whole model, {len(samples)} samples, {k} vs float: mean {v.mean():.4f} steps, "
              f"{v.sum() / base.sum():.3f}x onnxruntime's{spread}")


if __name__ == "__main__":
    main()
