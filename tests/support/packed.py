"""Models of several inputs, which the importer packs into one ``data``: a BERT-like encoder (token ids read by a
Gather, a float mask added to the attention scores) and its samples; one output per input of any type."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from cvm_onnx.core.format.onnx_file import onnx_model


def bert_like(vocab: int = 30, length: int = 6, d: int = 8, seed: int = 0, state: bool = False,
              low: float | None = None, hf: str | None = None, decoder: str | None = None,
              lse: bool = False) -> onnx.ModelProto:
    """input_ids (1, L) int64 -> token embeddings (Gather); one attention head whose scores q k^T / sqrt(d) get
    30 (mask - 1) added (mask (1, 1, L) float: 1 for a token, 0 for padding); softmax, the values, a mean over the
    tokens and a dense head (1, 3). ``low``: the mask int64 instead, Where(Cast(mask, bool), 0, low) added (torch's
    form). ``hf`` with ``low``: HF's additive mask from the int64 mask instead: "mul", (1 - Cast(mask, float)) * low;
    "where", Where(Cast(inv, bool), low, inv) of inv = 1 - Cast(Expand(mask, (1, L, L)), float), as transformers'
    _prepare_4d_attention_mask writes it. ``decoder`` with ``low``: the mask int64 (1, L) and a decoder's padding and
    causal term of it instead (``support.masks.decoder_term``: that form; GPT-2's eager forms a Where on the scores,
    then the padding term). ``state``: a third input (1, d) float added
    to the pooled vector (a recurrent model's state, to fold). ``lse``: ReduceLogSumExp of the masked scores over the
    keys (1, L, 1) times the values instead of the softmax's product."""
    rng = np.random.default_rng(seed)

    def c(name, shape):
        return nh.from_array((rng.normal(size=shape) * 0.5).astype(np.float32), name)

    nodes = [h.make_node("Gather", ["emb", "input_ids"], ["e"]),
             h.make_node("MatMul", ["e", "wq"], ["q"]), h.make_node("MatMul", ["e", "wk"], ["k"]),
             h.make_node("MatMul", ["e", "wv"], ["v"]), h.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             h.make_node("MatMul", ["q", "kt"], ["s0"]), h.make_node("Mul", ["s0", "scale"], ["s1"]),
             h.make_node("Add", ["mask", "minus_one"], ["inv"]), h.make_node("Mul", ["inv", "big"], ["bias"]),
             h.make_node("Add", ["s1", "bias"], ["s2"]), h.make_node("Softmax", ["s2"], ["p"], axis=-1),
             h.make_node("MatMul", ["p", "v"], ["ctx"]),
             h.make_node("ReduceMean", ["ctx"], ["pooled"], axes=[1], keepdims=0)]
    inputs = [h.make_tensor_value_info("input_ids", T.INT64, [1, length]),
              h.make_tensor_value_info("mask", T.FLOAT, [1, 1, length])]
    inits = []
    if low is not None:
        nodes[7:9] = [h.make_node("Cast", ["mask"], ["keep"], to=T.BOOL),
                      h.make_node("Where", ["keep", "zero", "low"], ["bias"])]
        inputs[1] = h.make_tensor_value_info("mask", T.INT64, [1, 1, length])
        inits = [nh.from_array(np.float32(0), "zero"), nh.from_array(np.float32(low), "low")]
    if hf is not None:
        inits = [nh.from_array(np.float32(1), "one"), nh.from_array(np.float32(low), "low"),
                 nh.from_array(np.array([1, length, length], np.int64), "square")]
        nodes[7:9] = {"mul": [h.make_node("Cast", ["mask"], ["mf"], to=T.FLOAT),
                              h.make_node("Sub", ["one", "mf"], ["inv"]), h.make_node("Mul", ["inv", "low"], ["bias"])],
                      "where": [h.make_node("Expand", ["mask", "square"], ["wide"]),
                                h.make_node("Cast", ["wide"], ["mf"], to=T.FLOAT),
                                h.make_node("Sub", ["one", "mf"], ["inv"]),
                                h.make_node("Cast", ["inv"], ["masked"], to=T.BOOL),
                                h.make_node("Where", ["masked", "low", "inv"], ["bias"])]}[hf]
    if decoder is not None:
        from support.masks import decoder_term, mask_length

        term, consts = decoder_term(decoder, 1, length, low)
        scores = [h.make_node("Squeeze", ["bias", "axis1"], ["bias3"]), h.make_node("Add", ["s1", "bias3"], ["s2"])]
        if decoder in ("eager", "eager_causal"):  # Where(keep, s1, c) (+ pad)
            term = term[:-2] if decoder == "eager" else []
            scores = [h.make_node("Squeeze", ["keep", "axis1"], ["keep3"]),
                      h.make_node("Where", ["keep3", "s1", "c"], ["s2" if term == [] else "kept"])]
            if decoder == "eager":
                scores += [h.make_node("Squeeze", ["pad", "axis1"], ["pad3"]),
                           h.make_node("Add", ["kept", "pad3"], ["s2"])]
        nodes[7:10] = [*term, *scores]
        inputs[1:2] = [h.make_tensor_value_info("mask", T.INT64, [1, mask_length(decoder, length)])] \
            if "causal" not in decoder else []
        used = {x for n in nodes for x in n.input} | {"bias"}
        inits = [nh.from_array(np.asarray(v), k) for k, v in consts.items() if k in used]
        inits.append(nh.from_array(np.array([1], np.int64), "axis1"))
        for n in nodes:
            n.input[:] = ["mask" if x == "m" else x for x in n.input]
    if lse:
        [k] = [i for i, n in enumerate(nodes) if n.op_type == "Softmax"]
        nodes[k:k + 2] = [h.make_node("ReduceLogSumExp", ["s2"], ["p"], axes=[-1]), h.make_node("Mul", ["p", "v"],
                                                                                                ["ctx"])]
    if state:
        nodes.append(h.make_node("Add", ["pooled", "state"], ["pooled2"]))
        inputs.append(h.make_tensor_value_info("state", T.FLOAT, [1, d]))
    nodes.append(h.make_node("MatMul", ["pooled2" if state else "pooled", "wo"], ["y"]))
    g = h.make_graph(nodes, "bert", inputs, [h.make_tensor_value_info("y", T.FLOAT, [1, 3])],
                     [c("emb", (vocab, d)), c("wq", (d, d)), c("wk", (d, d)), c("wv", (d, d)), c("wo", (d, 3)),
                      nh.from_array(np.float32(1 / np.sqrt(d)), "scale"),
                      nh.from_array(np.float32(-1), "minus_one"), nh.from_array(np.float32(30), "big"), *inits])
    return onnx_model(g, 17)


def bert_samples(n: int = 16, vocab: int = 30, length: int = 6, seed: int = 1) -> dict[str, np.ndarray]:
    """N samples of each input: token ids (N, 1, L) in [0, vocab), every id drawn at least once when N L allows
    (so the calibration's max is vocab - 1); masks (N, 1, 1, L) of 2 to L tokens then padding."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (n, 1, length)).astype(np.int64)
    ids.reshape(-1)[:min(vocab, ids.size)] = np.arange(min(vocab, ids.size))
    lens = rng.integers(2, length + 1, n)
    mask = (np.arange(length)[None, :] < lens[:, None]).astype(np.float32).reshape(n, 1, 1, length)
    return {"input_ids": ids, "mask": mask}


def quantized_bert(tmp_path, model: onnx.ModelProto, samples: dict[str, np.ndarray] | None = None, **kwargs):
    """``cvm-onnx quantize`` of ``model`` (a ``bert_like``) on ``samples`` (``bert_samples()`` with int64 masks where
    not given), its quantized ONNX model kept: (the result, that model), its one output asserted within 1.1x
    onnxruntime's quantized model's distance from float."""
    from cvm_onnx.app.quantize import quantize

    if samples is None:
        samples = bert_samples()
        samples["mask"] = samples["mask"].astype(np.int64)
    onnx.save(model, tmp_path / "b.onnx")
    np.savez(tmp_path / "c.npz", **samples)
    done = quantize(tmp_path / "b.onnx", tmp_path / "c.npz", tmp_path / "m", save_onnx=tmp_path / "q.onnx", **kwargs)
    [a] = done.agreements
    assert a.mean_steps <= 1.1 * a.ort_mean_steps, a.line()
    return done, onnx.load(tmp_path / "q.onnx")


def identity_model(specs: list[tuple[int, tuple[int, ...]]]) -> onnx.ModelProto:
    """Input x_i of type and shape ``specs[i]`` -> output y_i: an integer input cast to int32; a float one
    quantized (uint8, scale 0.25 + i, zero point 3 i) and dequantized."""
    nodes, inits, ins, outs = [], [], [], []
    for i, (t, shape) in enumerate(specs):
        x, y = f"x{i}", f"y{i}"
        ins.append(h.make_tensor_value_info(x, t, shape))
        if t == T.FLOAT:
            inits += [nh.from_array(np.float32(0.25 + i), f"s{i}"), nh.from_array(np.uint8(3 * i), f"z{i}")]
            nodes += [h.make_node("QuantizeLinear", [x, f"s{i}", f"z{i}"], [f"q{i}"]),
                      h.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [y])]
        else:
            nodes.append(h.make_node("Cast", [x], [y], to=T.INT32))
        outs.append(h.make_tensor_value_info(y, T.FLOAT if t == T.FLOAT else T.INT32, shape))
    return onnx_model(h.make_graph(nodes, "packed", ins, outs, inits), 19)
