"""Transformer text and audio architectures as torch exports them, through `cvm-onnx quantize` (issue 35).

Each architecture is built from its transformers config class with small random weights (seeded; never fetched from a
hub): its base model returning its last hidden state, or a task head's logits (a classifier, a language model, CTC),
exported the way users and optimum export it: input_ids and attention_mask of 16 tokens (audio: 1600 samples of a
waveform, or 80 x 100 log-mel frames), by torch's TorchScript exporter (``dynamo=False``, opset 17, batch and sequence
dynamic) and by its dynamo exporter (opset 18, static); ``--eager``, ``--opset``: transformers' eager attention instead
of SDPA, another opset (``--tag`` names the variant's files). Then each model through `quantize` (QDQ, uint8
activations, minmax on 8 samples, the attention mask folded to ones, or with ``--mask`` an input of padded samples) per
tensor and per channel, measured as benchmarks/real_models.py measures (``one``): whole or refused (the rules), each
output's mean distance from float against onnxruntime's quantized model's, and whether the export is exact.

Run (torch and transformers on the path for ``export`` only):
  PYTHONPATH=.:TORCH_SITE python benchmarks/text_architectures.py export --work DIR [--only NAME ...] [--eager]
      [--opset N] [--tag=-VARIANT]
  python benchmarks/text_architectures.py measure --work DIR [--only NAME ...] [--mask] [--tag=-VARIANT]
      [--weights per-tensor|per-channel|both] [--held-out N] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from real_models import Model, cpu, export_failure, one, refusal, whole  # noqa: E402

TOKENS, VOCAB = 16, 1000
TEXT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=VOCAB,
            max_position_embeddings=64)
DECODER = dict(TEXT, num_key_value_heads=2, use_cache=False)

# name: (config class, model class, config arguments, input kind: text, wave or mel)
ARCHITECTURES = {
    "bert": ("BertConfig", "BertModel", TEXT, "text"),
    "roberta": ("RobertaConfig", "RobertaModel", TEXT, "text"),
    "distilbert": ("DistilBertConfig", "DistilBertModel",
                   dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=VOCAB, max_position_embeddings=64),
                   "text"),
    "albert": ("AlbertConfig", "AlbertModel", dict(TEXT, embedding_size=32), "text"),
    "electra": ("ElectraConfig", "ElectraModel", dict(TEXT, embedding_size=32), "text"),
    "deberta-v2": ("DebertaV2Config", "DebertaV2Model",
                   dict(TEXT, relative_attention=True, position_buckets=32, max_relative_positions=64,
                        pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", position_biased_input=False),
                   "text"),
    "mpnet": ("MPNetConfig", "MPNetModel", TEXT, "text"),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", TEXT, "text"),
    "gpt2": ("GPT2Config", "GPT2Model", dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=VOCAB,
                                             use_cache=False), "text"),
    "gpt-neo": ("GPTNeoConfig", "GPTNeoModel",
                dict(hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
                     window_size=8, max_position_embeddings=64, vocab_size=VOCAB, use_cache=False), "text"),
    "llama": ("LlamaConfig", "LlamaModel", DECODER, "text"),
    "qwen2": ("Qwen2Config", "Qwen2Model", DECODER, "text"),
    "mistral": ("MistralConfig", "MistralModel", DECODER, "text"),
    "phi": ("PhiConfig", "PhiModel", dict(TEXT, partial_rotary_factor=0.5, use_cache=False), "text"),
    "t5-encoder": ("T5Config", "T5EncoderModel",
                   dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=VOCAB), "text"),
    "bart-encoder": ("BartConfig", "BartModel",
                     dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB,
                          max_position_embeddings=64), "text"),
    "wav2vec2": ("Wav2Vec2Config", "Wav2Vec2Model",
                 dict(TEXT, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                      num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, feat_extract_norm="group"),
                 "wave"),
    "hubert": ("HubertConfig", "HubertModel",
               dict(TEXT, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                    num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, feat_extract_norm="group"), "wave"),
    "whisper-encoder": ("WhisperConfig", "WhisperModel",
                        dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                             decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=80,
                             max_source_positions=50, vocab_size=VOCAB, pad_token_id=1, bos_token_id=0,
                             eos_token_id=2, decoder_start_token_id=0), "mel"),
}
# task heads as users ship them: a classifier (the pooler's Tanh, a dense), a language model's logits (the tied
# embedding's MatMul), CTC logits
ARCHITECTURES.update({
    "bert-cls": ("BertConfig", "BertForSequenceClassification", dict(TEXT, num_labels=3), "text"),
    "roberta-cls": ("RobertaConfig", "RobertaForSequenceClassification", dict(TEXT, num_labels=3), "text"),
    "gpt2-lm": ("GPT2Config", "GPT2LMHeadModel", ARCHITECTURES["gpt2"][2], "text"),
    "llama-lm": ("LlamaConfig", "LlamaForCausalLM", DECODER, "text"),
    "wav2vec2-ctc": ("Wav2Vec2Config", "Wav2Vec2ForCTC", dict(ARCHITECTURES["wav2vec2"][2], vocab_size=32), "wave"),
})
SHAPES = {"text": (TOKENS,), "wave": (1600,), "mel": (80, 100)}
EXPORTERS = {"ts": dict(dynamo=False, opset_version=17), "dynamo": dict(dynamo=True, opset_version=18)}


def samples(kind: str, mask: bool = False):
    """(n, seed) -> n inputs of the kind: token ids (``mask``: with their attention mask, 4 to 16 tokens then
    padding), a waveform, log-mel frames."""
    if kind == "text" and mask:
        return lambda n, seed: {"input_ids": samples(kind)(n, seed), "attention_mask": (np.arange(TOKENS) < np.random.
                                default_rng(seed + 1).integers(4, TOKENS + 1, (n, 1))).astype(np.int64)}
    if kind == "text":
        return lambda n, seed: np.random.default_rng(seed).integers(1, VOCAB, (n, TOKENS)).astype(np.int64)
    return lambda n, seed: (np.random.default_rng(seed).normal(size=(n, *SHAPES[kind])) *
                            (0.1 if kind == "wave" else 1)).astype(np.float32)


def export(name: str, exporter: str, path: Path, eager: bool = False, opset: int | None = None) -> None:
    """The architecture's model (seeded random weights, eval) exported to ``path`` by ``exporter`` (``eager``:
    transformers' eager attention instead of its default, SDPA; ``opset``: instead of the exporter's)."""
    import torch
    import transformers

    config_class, model_class, kwargs, kind = ARCHITECTURES[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**kwargs, **({"attn_implementation": "eager"} if eager else {}))
    model = getattr(transformers, model_class)(config).eval()
    if name in ("bart-encoder", "whisper-encoder"):
        model = model.get_encoder()

    class Hidden(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            names = ("input_ids", "attention_mask") if kind == "text" else \
                ("input_values",) if kind == "wave" else ("input_features",)
            return self.inner(**dict(zip(names, args)))[0]  # the last hidden state, or the head's logits

    x = torch.from_numpy(samples(kind)(1, 0))
    args = (x, torch.ones_like(x)) if kind == "text" else (x,)
    names = ["input_ids", "attention_mask"] if kind == "text" else ["input"]
    dynamic = {n: {0: "batch", 1: "sequence"} for n in names} if exporter == "ts" else None
    with torch.no_grad():
        torch.onnx.export(Hidden(model), args, str(path), input_names=names, output_names=["output"],
                          dynamic_axes=dynamic, external_data=False,
                          **dict(EXPORTERS[exporter], **({"opset_version": opset} if opset else {})))


def measure(name: str, exporter: str, path: Path, per_channel: bool, held_out: int, mask: bool = False) -> dict:
    """``one``'s measure of the exported model (``mask``: the attention mask an input of padded samples, not folded)."""
    kind = ARCHITECTURES[name][3]
    m = Model(f"{name}-{exporter}", "", str(path), SHAPES[kind], lambda x: x, sample=samples(kind, mask),
              fold={"attention_mask": 1} if kind == "text" and not mask else None)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        r = one(m, path, None, per_channel, 8, held_out, Path(tmp))
        r["seconds"] = round(time.perf_counter() - t, 1)
    import onnx

    r["ops"] = len(onnx.load(str(path), load_external_data=False).graph.node)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stage", choices=("export", "measure"))
    ap.add_argument("--work", required=True, help="the folder of the exported models")
    ap.add_argument("--only", nargs="+", help="architecture names")
    ap.add_argument("--exporters", nargs="+", default=list(EXPORTERS), choices=list(EXPORTERS))
    ap.add_argument("--weights", choices=("per-tensor", "per-channel", "both"), default="both")
    ap.add_argument("--eager", action="store_true", help="export: transformers' eager attention (default SDPA)")
    ap.add_argument("--opset", type=int, help="export: this opset instead of the exporter's (17, 18)")
    ap.add_argument("--mask", action="store_true", help="measure: the attention mask an input (padded samples), "
                    "not folded to ones")
    ap.add_argument("--tag", default="", help="a suffix of the model files (an export's variant)")
    ap.add_argument("--held-out", type=int, default=32, help="held-out samples compared (default 32)")
    ap.add_argument("--json", help="also write the results there")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    names = [n for n in ARCHITECTURES if not args.only or n in args.only]
    if args.stage == "export":
        for name in names:
            for exporter in args.exporters:
                try:
                    export(name, exporter, work / f"{name}-{exporter}{args.tag}.onnx", args.eager, args.opset)
                    print(f"{name} {exporter}: exported", flush=True)
                except Exception as e:  # an exporter's failure is a row of the sweep, not its end
                    print(f"{name} {exporter}: {export_failure(e)}", flush=True)
        return
    print(f"CPU: {cpu()}; load {os.getloadavg()[0]:.1f}; 8 calibration, {args.held_out} held-out samples")
    results = []
    for name in names:
        for exporter in args.exporters:
            path = work / f"{name}-{exporter}{args.tag}.onnx"
            if not path.is_file():
                print(f"{name} {exporter}: not exported")
                continue
            for per_channel in {"per-tensor": (False,), "per-channel": (True,), "both": (False, True)}[args.weights]:
                if args.mask and ARCHITECTURES[name][3] != "text":
                    continue
                r = measure(name, exporter, path, per_channel, args.held_out, args.mask)
                results.append(r)
                label = f"{name} {exporter}{args.tag} ({r['ops']} ops) {'per-channel' if per_channel else 'per-tensor'}"
                print(f"{label}: {whole(r) if r['whole'] else refusal(r)} ({r['seconds']} s; load "
                      f"{os.getloadavg()[0]:.1f})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu(), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
