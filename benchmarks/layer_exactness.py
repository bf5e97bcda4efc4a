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

Per kind of piece (its float ops; with --per-layer also per QuantizeLinear), on the first K samples: the elements,
the share where CVM differs from the exact arithmetic, the share of those differences where the exact value y / s
is a tie (its fraction exactly 1/2, where QuantizeLinear rounds half to even), the largest difference, the mean
signed difference (a bias), the share of values at exact ties, and the share where onnxruntime differs from the
exact arithmetic. Then the whole model against the float model within the output's range (real_models.in_range),
in output steps (each sample's mean), by CVM, by the exact arithmetic (the distance an exact implementation of the
QDQ model has) and by onnxruntime's default session, each as a ratio to onnxruntime's, over all samples and its
range over sets of 8; and the share of CVM's output integers equal to the exact arithmetic's (the model run whole).

Run: python benchmarks/layer_exactness.py MODEL_QDQ.onnx FLOAT.onnx SAMPLES.npy [--one-part] [--per-node K]
     [--per-layer]   (N samples stacked on axis 0, the input's shape less its leading 1)
"""
from __future__ import annotations

import argparse
import collections
import logging
import os

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

from cvm_onnx.app.layers import exact
from cvm_onnx.converters.from_onnx import import_model
from cvm_onnx.core.executor import execute
from real_models import cpu, in_range

NP = {T.UINT8: np.uint8, T.INT8: np.int8, T.UINT16: np.uint16, T.INT16: np.int16}


def tie_inputs(model: onnx.ModelProto, names: list[str]) -> dict[str, str]:
    """Per QuantizeLinear output of ``exact``'s model, the tensor its Round reads (y / s): a tie where its fraction
    is exactly 1/2."""
    made = {o: n for n in model.graph.node for o in n.output}
    out = {}
    for t in names:
        n = made[t]  # Cast <- Clip <- Add <- Round(y / s)
        for _ in range(3):
            n = made[n.input[0]]
        out[t] = n.input[0]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("float_model")
    ap.add_argument("samples")
    ap.add_argument("--one-part", action="store_true", help="import with one-part products (default: two-part "
                    "products where closer)")
    ap.add_argument("--per-node", type=int, default=8, metavar="K", help="samples per node (default 8)")
    ap.add_argument("--per-layer", action="store_true", help="also one row per QuantizeLinear")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    import onnxruntime as ort

    q = onnx.load(args.model)
    g = q.graph
    samples = np.load(args.samples).astype(np.float32)
    quantizers = [n for n in g.node if n.op_type == "QuantizeLinear"]
    names = [n.output[0] for n in quantizers]
    zeros = {n.output[0]: next(i for i in g.initializer if i.name == n.input[2]).data_type for n in quantizers}
    imp = import_model(q, outputs=names, two_part=not args.one_part)

    pieces = onnx.ModelProto()  # every DequantizeLinear of a quantized activation reads a new input: its CVM values
    pieces.CopyFrom(q)
    fed = set()
    for n in pieces.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in names:
            fed.add(n.input[0])
            n.input[0] += ":cvm"
    shapes = {t: tuple(imp.graph.type_of(imp.graph.heads[names.index(t)]).shape) for t in fed}
    for t in sorted(fed):
        pieces.graph.input.append(h.make_tensor_value_info(t + ":cvm", zeros[t], shapes[t]))
    del pieces.graph.output[:]
    pieces.graph.output.extend(h.make_tensor_value_info(t, zeros[t], None) for t in names)
    so = ort.SessionOptions()
    so.add_session_config_entry("session.x64quantprecision", "1")
    ort_pieces = ort.InferenceSession(pieces.SerializeToString(), so, providers=["CPUExecutionProvider"])
    exact_pieces = exact(pieces, {t + ":cvm": shapes[t] for t in fed})
    ties = tie_inputs(exact_pieces, names)
    ref_pieces = ReferenceEvaluator(exact_pieces)

    made = {o: n for n in g.node for o in n.output}

    def ops(t: str) -> str:
        out, todo = [], [t]
        while todo:
            n = made.get(todo.pop())
            if n is not None and n.op_type != "DequantizeLinear":
                out.append(n.op_type)
                todo += [i for i in n.input if i]
        return "+".join(reversed(out)) or "(the input)"

    kinds = collections.defaultdict(lambda: np.zeros(8))  # count, elements, differs, at ties, max, sum, ort, ties
    layers = collections.defaultdict(lambda: np.zeros(8))
    for k, x in enumerate(samples[:args.per_node]):
        x = x[None]
        cvm = dict(zip(names, execute(imp.graph, {"data": imp.edges.input.quantize(x)})))
        feed = {t + ":cvm": cvm[t].astype(NP[zeros[t]]) for t in fed} | {g.input[0].name: x}
        ours = dict(zip(names, ort_pieces.run(names, feed)))
        got = ref_pieces.run(names + [ties[t] for t in names], feed)
        want, before = dict(zip(names, got[:len(names)])), dict(zip(names, got[len(names):]))
        for n in quantizers:
            t = n.output[0]
            d = cvm[t].astype(np.int64).reshape(-1) - want[t].astype(np.int64).reshape(-1)
            o = ours[t].astype(np.int64).reshape(-1) != want[t].astype(np.int64).reshape(-1)
            y = np.asarray(before[t], np.float64).reshape(-1)
            tie = y - np.floor(y) == 0.5
            for r in (kinds[ops(n.input[0])], layers[t]):
                r += [k == 0, d.size, (d != 0).sum(), ((d != 0) & tie).sum(), 0, d.sum(), o.sum(), tie.sum()]
                r[4] = max(r[4], np.abs(d).max())
    print(f"{cpu()}; load average {os.getloadavg()[0]:.2f}; {args.model}{' (one-part import)' * args.one_part}; "
          f"per node on {min(args.per_node, len(samples))} sample(s), given the same integers in")
    head = ("| {} | count | elements | CVM differs | of which at exact ties | max | mean signed | exact ties | "
            "onnxruntime differs |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(head.format("piece"))
    for key, (c, size, dif, at, mx, total, o, tie) in sorted(kinds.items(), key=lambda kv: -kv[1][2]):
        print(f"| {key} | {int(c)} | {int(size)} | {dif / size:.3%} ({int(dif)}) | {at / max(dif, 1):.1%} | "
              f"{int(mx)} | {total / size:+.5f} | {tie / size:.3%} ({int(tie)}) | {o / size:.3%} ({int(o)}) |")
    if args.per_layer:
        print(head.format("tensor (its piece)"))
        for n in quantizers:
            c, size, dif, at, mx, total, o, tie = layers[n.output[0]]
            print(f"| {n.output[0]} ({ops(n.input[0])}) | 1 | {int(size)} | {dif / size:.3%} ({int(dif)}) | "
                  f"{at / max(dif, 1):.1%} | {int(mx)} | {total / size:+.5f} | {tie / size:.3%} ({int(tie)}) | "
                  f"{o / size:.3%} ({int(o)}) |")

    # the whole model: CVM and the exact arithmetic against the float model
    whole = import_model(q, two_part=not args.one_part)
    full = exact(q, {})
    ref = ReferenceEvaluator(full)
    fsess = ort.InferenceSession(onnx.load(args.float_model).SerializeToString(), providers=["CPUExecutionProvider"])
    qsess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    step = float(np.max(whole.edges.outputs[0].scale))
    dist = {"CVM": [], "exact QDQ arithmetic": [], "onnxruntime (as real_models.py runs it)": []}
    equal = []
    for s in samples:
        f = in_range(fsess.run(None, {fsess.get_inputs()[0].name: s[None]})[0].astype(np.float64),
                     whole.edges.outputs[0])
        [c] = execute(whole.graph, {"data": whole.edges.input.quantize(s[None])})
        e, last = ref.run([g.output[0].name, made[g.output[0].name].input[0]], {g.input[0].name: s[None]})
        o = qsess.run(None, {g.input[0].name: s[None]})[0]
        equal.append(c.reshape(-1) == np.asarray(last, np.int64).reshape(-1))
        for k, y in zip(dist, (whole.edges.outputs[0].dequantize(c), e, o)):
            dist[k].append(np.abs(np.asarray(y, np.float64).reshape(f.shape) - f).mean() / step)
    base = np.array(dist["onnxruntime (as real_models.py runs it)"])
    for k, v in dist.items():
        v = np.array(v)
        sets = [v[i:i + 8].sum() / base[i:i + 8].sum() for i in range(0, len(v) - 7, 8)]
        spread = f" (sets of 8: {min(sets):.2f}x-{max(sets):.2f}x)" if sets else ""
        print(f"whole model, {len(samples)} samples, {k} vs float: mean {v.mean():.4f} steps, "
              f"{v.sum() / base.sum():.3f}x onnxruntime's{spread}")
    print(f"whole model, {len(samples)} samples: CVM's output equal to the exact arithmetic's on "
          f"{np.concatenate(equal).mean():.2%} of values")


if __name__ == "__main__":
    main()
