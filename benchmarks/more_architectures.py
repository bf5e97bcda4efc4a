"""More architectures as torch exports them, through `cvm-onnx quantize` (issue 35): multimodal, detection and OCR
towers, speech encoders and codecs, recurrent and state-space models, torchvision's classifiers and dense heads.

Each model is built from its config class (transformers) or constructor (torch.nn, torchvision) with small seeded
random weights (no weights fetched from a hub), exported by torch's TorchScript exporter (``dynamo=False``, opset 17,
the batch dynamic) and its dynamo exporter (opset 18, static), then quantized per tensor and per channel on 8
calibration samples and measured as benchmarks/real_models.py measures (``one``): whole or refused (the rules), each
output's mean distance from float against onnxruntime's quantized model's, whether the export back is exact. Text
models take 16 token ids, their attention mask folded to ones.

Run (torch, transformers and torchvision on the path for ``export`` only):
  PYTHONPATH=.:TORCH_SITE python benchmarks/more_architectures.py export --work DIR [--only NAME ...]
  python benchmarks/more_architectures.py measure --work DIR [--only NAME ...] [--weights per-tensor|per-channel|both]
      [--held-out N] [--json out.json]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from real_models import Model, cpu, export_failure, json_line, one, refusal, whole  # noqa: E402
from text_architectures import TEXT, TOKENS, VOCAB, samples  # noqa: E402

EXPORTERS = {"ts": dict(dynamo=False, opset_version=17), "dynamo": dict(dynamo=True, opset_version=18)}
VISION = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=64, num_channels=3)
AUDIO = dict(TEXT, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
             num_conv_pos_embedding_groups=4, feat_extract_norm="group")


def normal(*shape: int, scale: float = 1.0):
    """(n, seed) -> n float32 samples of N(0, scale^2) of ``shape``."""
    return lambda n, seed: (np.random.default_rng(seed).normal(size=(n, *shape)) * scale).astype(np.float32)


TEXT_IN = {"input_ids": samples("text")}
PIXELS = {"pixel_values": normal(3, 32, 32)}
WAVE = {"input_values": normal(1600, scale=0.1)}


def hf(config: str, model: str, inputs: dict, out: str = "0", sub: str | None = None, **kwargs):
    """A transformers model from its config class (seeded random weights), called with ``inputs`` by name (text: with
    an attention mask of ones), returning its output ``out`` (an index or names, comma-separated); ``sub``: the
    attribute of the model to export (an encoder)."""
    def build():
        import torch
        import transformers
        torch.manual_seed(0)
        cfg = kwargs.pop("config_fn", None)
        conf = cfg(transformers) if cfg else getattr(transformers, config)(**kwargs)
        inner = getattr(transformers, model)(conf).eval()
        inner = getattr(inner, sub)() if sub and callable(getattr(inner, sub)) else getattr(inner, sub) if sub else \
            inner
        names = list(inputs)

        class Head(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = inner

            def forward(self, *args):
                kw = dict(zip(names, args))
                if "input_ids" in kw and "attention_mask" not in names and model not in NO_MASK:
                    kw["attention_mask"] = torch.ones_like(kw["input_ids"])
                got = self.inner(**kw)
                picks = [got[int(k)] if k.isdigit() else getattr(got, k) for k in out.split(",")]
                return tuple(picks) if len(picks) > 1 else picks[0]
        return Head()
    return build, inputs


NO_MASK = {"CanineModel", "MambaModel", "RwkvModel", "EncodecModel", "DacModel", "RecurrentGemmaModel"}


def tv(name: str, shape=(3, 64, 64), out: str | None = None, **kwargs):
    """A torchvision model (seeded random weights; ``out``: the key of a dict output)."""
    def build():
        import torch
        import torchvision
        torch.manual_seed(0)
        make = torchvision.models
        for part in name.split("."):
            make = getattr(make, part)
        inner = make(weights=None, **kwargs).eval()

        class Head(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                got = self.inner(x)
                if isinstance(got, dict):
                    return tuple(got.values()) if out is None else got[out]
                return got
        return Head()
    return build, {"x": normal(*shape)}


def frcnn_backbone():
    """Faster R-CNN's ResNet-50 backbone and FPN (frozen BN) as torchvision builds it, its levels' maps as outputs."""
    def build():
        import torch
        from torchvision.models.detection.backbone_utils import resnet_fpn_backbone
        torch.manual_seed(0)
        inner = resnet_fpn_backbone(backbone_name="resnet18", weights=None, trainable_layers=3).eval()

        class Head(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                return tuple(self.inner(x).values())
        return Head()
    return build, {"x": normal(3, 64, 64)}


def rnn(kind: str, layers: int, bidirectional: bool, batch_first: bool, state: bool):
    """torch.nn's LSTM / GRU / RNN over 12 steps of 8 features, hidden 16, followed by a Linear; ``state``: the
    initial states are inputs (else zeros), h a layer's output (tanh of normal samples), c normal."""
    def build():
        import torch
        torch.manual_seed(0)

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = getattr(torch.nn, kind)(8, 16, layers, bidirectional=bidirectional, batch_first=batch_first)
                self.out = torch.nn.Linear(32 if bidirectional else 16, 4)

            def forward(self, x, *states):
                if not batch_first:
                    x = x.transpose(0, 1)
                s = (states if kind == "LSTM" else states[0]) if states else None
                y = self.rnn(x, s)[0]
                return self.out(y if batch_first else y.transpose(0, 1))
        return Net()
    inputs = {"x": normal(12, 8)}
    if state:  # a state's batch is its axis 1: (layers * directions, batch, hidden); a sample is one of batch 1
        d = layers * (2 if bidirectional else 1)
        h = normal(d, 1, 16)
        inputs.update({"h0": lambda n, seed: np.tanh(h(n, seed))} | ({"c0": normal(d, 1, 16)} if kind == "LSTM"
                                                                     else {}))
    return build, inputs


def speech2text():
    return hf("Speech2TextConfig", "Speech2TextModel", {"input_features": normal(64, 80)}, sub="get_encoder",
              d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
              encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB, input_feat_per_channel=80,
              num_conv_layers=2, conv_channels=64, max_source_positions=64)


def detr():
    def config(transformers):
        backbone = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1],
                                             out_features=["stage4"])
        return transformers.DetrConfig(use_timm_backbone=False, backbone_config=backbone, d_model=32,
                                       encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                       decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                       num_queries=8, num_labels=4, use_pretrained_backbone=False)
    return hf("DetrConfig", "DetrForObjectDetection", {"pixel_values": normal(3, 64, 64)}, out="logits,pred_boxes",
              config_fn=config)


def architectures() -> dict:
    """name: (builder, inputs {name: (n, seed) -> n samples})."""
    text = dict(TEXT)
    return {
        # multimodal, detection, OCR
        "clip-text": hf("CLIPTextConfig", "CLIPTextModel", TEXT_IN, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64),
        "clip-vision": hf("CLIPVisionConfig", "CLIPVisionModel", PIXELS, **VISION),
        "siglip-text": hf("SiglipTextConfig", "SiglipTextModel", TEXT_IN, out="pooler_output", hidden_size=64,
                          num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=VOCAB,
                          max_position_embeddings=64),
        "siglip-vision": hf("SiglipVisionConfig", "SiglipVisionModel", PIXELS, out="pooler_output", **VISION),
        "owlvit-vision": hf("OwlViTVisionConfig", "OwlViTVisionModel", PIXELS, out="pooler_output", **VISION),
        "detr": detr(),
        "trocr-decoder": hf("TrOCRConfig", "TrOCRForCausalLM", TEXT_IN, out="logits", d_model=64, decoder_layers=2,
                            decoder_attention_heads=4, decoder_ffn_dim=128, vocab_size=VOCAB,
                            max_position_embeddings=64, use_cache=False),
        "layoutlmv3": hf("LayoutLMv3Config", "LayoutLMv3Model",
                         {"input_ids": samples("text"), "bbox": lambda n, seed: np.sort(np.random.default_rng(
                             seed).integers(0, 1000, (n, TOKENS, 4)), -1).astype(np.int64)},
                         text_embed=True, visual_embed=False, coordinate_size=12, shape_size=8, **text),
        "donut-swin": hf("DonutSwinConfig", "DonutSwinModel", {"pixel_values": normal(3, 64, 64)}, image_size=64,
                         patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=4),
        "convbert": hf("ConvBertConfig", "ConvBertModel", TEXT_IN, embedding_size=32, **text),
        "squeezebert": hf("SqueezeBertConfig", "SqueezeBertModel", TEXT_IN, embedding_size=64, **text),
        "funnel": hf("FunnelConfig", "FunnelBaseModel", TEXT_IN, d_model=64, n_head=4, d_head=16, d_inner=128,
                     block_sizes=[1, 1], vocab_size=VOCAB),
        "longformer": hf("LongformerConfig", "LongformerModel", TEXT_IN, attention_window=8, **text),
        # 30 tokens, padded to 32 for its windows of 4 (the padding masked) and un-padded after its last layer
        "longformer-30": hf("LongformerConfig", "LongformerModel", {"input_ids": lambda n, seed: np.random.default_rng(
            seed).integers(1, VOCAB, (n, 30)).astype(np.int64)}, attention_window=4, **text),
        "bigbird": hf("BigBirdConfig", "BigBirdModel", TEXT_IN, attention_type="block_sparse", block_size=2,
                      num_random_blocks=1, **text),
        "mobilebert": hf("MobileBertConfig", "MobileBertModel", TEXT_IN, embedding_size=32, intra_bottleneck_size=32,
                         true_hidden_size=32, num_feedforward_networks=2, **dict(text, hidden_size=64)),
        "canine": hf("CanineConfig", "CanineModel", {"input_ids": lambda n, seed: np.random.default_rng(seed).integers(
            32, 5000, (n, 32)).astype(np.int64)}, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, downsampling_rate=4, num_hash_buckets=64, max_position_embeddings=64),
        # speech
        "wavlm": hf("WavLMConfig", "WavLMModel", WAVE, **AUDIO),
        "sew": hf("SEWConfig", "SEWModel", WAVE, squeeze_factor=2, **AUDIO),
        "unispeech": hf("UniSpeechConfig", "UniSpeechModel", WAVE, **AUDIO),
        "data2vec-audio": hf("Data2VecAudioConfig", "Data2VecAudioModel", WAVE, **dict(AUDIO, feat_extract_norm=None)),
        "ast": hf("ASTConfig", "ASTModel", {"input_values": normal(64, 32)}, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=2, intermediate_size=64, patch_size=16, frequency_stride=10, time_stride=10,
                  max_length=64, num_mel_bins=32),
        "speech2text-encoder": speech2text(),
        "wav2vec2-conformer": hf("Wav2Vec2ConformerConfig", "Wav2Vec2ConformerModel", WAVE,
                                 position_embeddings_type="rotary", conv_depthwise_kernel_size=7, **AUDIO),
        "encodec": hf("EncodecConfig", "EncodecModel", {"input_values": normal(1, 1600, scale=0.1)}, out="audio_values",
                      num_filters=8, num_residual_layers=1, upsampling_ratios=[4, 2], hidden_size=16, codebook_size=64,
                      target_bandwidths=[1.5]),
        "dac": hf("DacConfig", "DacModel", {"input_values": normal(1, 1600, scale=0.1)}, out="audio_values",
                  encoder_hidden_size=8, downsampling_ratios=[2, 4], decoder_hidden_size=32, upsampling_ratios=[4, 2],
                  n_codebooks=2, codebook_size=64, codebook_dim=4, hidden_size=32),
        # recurrent and state-space
        "lstm": rnn("LSTM", 2, True, True, False),
        "lstm-state": rnn("LSTM", 2, False, False, True),
        "gru": rnn("GRU", 2, True, False, False),
        "gru-state": rnn("GRU", 1, True, True, True),
        "rnn": rnn("RNN", 2, False, True, True),
        "mamba": hf("MambaConfig", "MambaModel", TEXT_IN, hidden_size=64, state_size=8, num_hidden_layers=2,
                    vocab_size=VOCAB, expand=2, conv_kernel=4, use_cache=False),
        "rwkv": hf("RwkvConfig", "RwkvModel", TEXT_IN, hidden_size=64, num_hidden_layers=2, vocab_size=VOCAB,
                   context_length=64, attention_hidden_size=64, intermediate_size=128, use_cache=False),
        "recurrent-gemma": hf("RecurrentGemmaConfig", "RecurrentGemmaModel", TEXT_IN, hidden_size=64,
                              num_hidden_layers=3, vocab_size=VOCAB, num_attention_heads=4, num_key_value_heads=1,
                              lru_width=64, intermediate_size=128, attention_window_size=16, use_cache=False),
        # torchvision
        "tv-mobilenetv3": tv("mobilenet_v3_small", num_classes=10, width_mult=0.5),
        "tv-efficientnet": tv("efficientnet_b0", num_classes=10),
        "tv-shufflenetv2": tv("shufflenet_v2_x0_5", num_classes=10),
        "tv-squeezenet": tv("squeezenet1_1", num_classes=10),
        "tv-googlenet": tv("googlenet", num_classes=10, aux_logits=False, init_weights=True),
        "tv-densenet": tv("densenet121", num_classes=10),
        "tv-frcnn-fpn": frcnn_backbone(),
        "tv-deeplabv3": tv("segmentation.deeplabv3_mobilenet_v3_large", out="out", num_classes=4,
                           weights_backbone=None),
        "tv-lraspp": tv("segmentation.lraspp_mobilenet_v3_large", out="out", num_classes=4, weights_backbone=None),
    }


def export(name: str, exporter: str, path: Path, models: dict | None = None) -> None:
    """The model (seeded random weights, eval) of ``models`` (default: this sweep's) exported to ``path`` by
    ``exporter``."""
    import types
    # a torchvision wheel built for CUDA beside a CPU torch: its operators' fake kernels cannot register; models need
    # none (transformers imports torchvision too)
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import torch
    build, inputs = (models or architectures())[name]
    args = [torch.from_numpy(s(1, 0)[0] if n in ("h0", "c0") else s(1, 0)) for n, s in inputs.items()]
    names = list(inputs)
    dynamic = {n: {1 if n in ("h0", "c0") else 0: "batch"} for n in names} if exporter == "ts" else None
    with torch.no_grad():
        torch.onnx.export(build(), tuple(args), str(path), input_names=names, dynamic_axes=dynamic,
                          external_data=False, **EXPORTERS[exporter])


def measure(name: str, exporter: str, path: Path, per_channel: bool, held_out: int, models: dict | None = None) -> dict:
    """``one``'s measure of the exported model."""
    import onnx
    inputs = (models or architectures())[name][1]

    def sample(n, seed):
        got = {k: s(n, seed + i) for i, (k, s) in enumerate(inputs.items())}
        return got if len(got) > 1 else next(iter(got.values()))
    first = next(iter(inputs.values()))(1, 0)
    m = Model(f"{name}-{exporter}", "", str(path), first.shape[1:], lambda x: x, sample=sample)
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        r = one(m, path, None, per_channel, 8, held_out, Path(tmp))
        r["seconds"] = round(time.perf_counter() - t, 1)
    r.update(exporter=exporter, ops=len(onnx.load(str(path), load_external_data=False).graph.node))
    return r


def main(models: dict | None = None, doc: str = __doc__) -> None:
    """The sweep's command line over ``models`` (default: this sweep's), described by ``doc``."""
    models = models or architectures()
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("stage", choices=("export", "measure"))
    ap.add_argument("--work", required=True, help="the folder of the exported models")
    ap.add_argument("--only", nargs="+", help="model names")
    ap.add_argument("--exporters", nargs="+", default=list(EXPORTERS), choices=list(EXPORTERS))
    ap.add_argument("--weights", choices=("per-tensor", "per-channel", "both"), default="both")
    ap.add_argument("--held-out", type=int, default=16, help="held-out samples compared (default 16)")
    ap.add_argument("--json", help="also write the results there, one JSON line per run as it ends")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    names = [n for n in models if not args.only or n in args.only]
    if args.stage == "export":
        for name in names:
            for exporter in args.exporters:
                try:
                    export(name, exporter, work / f"{name}-{exporter}.onnx", models)
                    print(f"{name} {exporter}: exported", flush=True)
                except Exception as e:  # an exporter's failure is a row of the sweep, not its end
                    print(f"{name} {exporter}: {export_failure(e)}", flush=True)
        return
    print(f"CPU: {cpu()}; load {os.getloadavg()[0]:.1f}; 8 calibration, {args.held_out} held-out samples")
    for name in names:
        for exporter in args.exporters:
            path = work / f"{name}-{exporter}.onnx"
            if not path.is_file():
                print(f"{name} {exporter}: not exported")
                continue
            for per_channel in {"per-tensor": (False,), "per-channel": (True,), "both": (False, True)}[args.weights]:
                try:
                    r = measure(name, exporter, path, per_channel, args.held_out, models)
                except Exception as e:  # a crash of the product is a finding of the sweep
                    print(f"{name} {exporter}: CRASH {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                label = f"{name} {exporter} ({r['ops']} ops) {'per-channel' if per_channel else 'per-tensor'}"
                print(f"{label}: {whole(r) if r['whole'] else refusal(r)} ({r['seconds']} s; load "
                      f"{os.getloadavg()[0]:.1f})", flush=True)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json_line(r))


if __name__ == "__main__":
    main()
