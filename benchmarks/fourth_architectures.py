"""A fourth architecture sweep (issue 35): families the text, vision and more_architectures sweeps do not have. Decoder
language models (Gemma, Gemma2's soft-capping, Falcon, OPT, BLOOM's ALiBi, GPT-NeoX's partial rotary, StableLM, Phi3,
Qwen3, a SmolLM-style Llama, Mixtral's expert routing), encoders (ESM, FNet, XLNet, Nystromformer, Perceiver, the
Marian, MBart and Pegasus encoders), time series (PatchTST, PatchTSMixer, the TimeSeriesTransformer encoder), vision
(PVTv2, FocalNet, CvT, BiT, Swin2SR, ViTMAE, timm's ConvNeXt, EfficientNet, MobileNetV3, RegNet, MLP-Mixer, ResMLP,
EVA-02), audio (CLAP's HTSAT, the SpeechT5 speech encoder, UniSpeechSat) and video (VideoMAE, TimeSformer).

Built, exported and measured as benchmarks/more_architectures.py does (small seeded random configs; TorchScript
exporter at opset 17 and dynamo at 18; `quantize` per tensor and per channel on 8 calibration samples; each output's
mean distance from float against onnxruntime's quantized model's; the export back exact).

Run (torch, transformers, torchvision and timm on the path for ``export`` only):
  PYTHONPATH=.:TORCH_SITE python benchmarks/fourth_architectures.py export --work DIR [--only NAME ...]
  python benchmarks/fourth_architectures.py measure --work DIR [--only NAME ...] [--weights per-tensor|per-channel|both]
      [--held-out N] [--json out.json]
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import more_architectures  # noqa: E402
from more_architectures import AUDIO, PIXELS, TEXT_IN, VISION, WAVE, hf, normal  # noqa: E402
from text_architectures import DECODER, TEXT, VOCAB  # noqa: E402

ENCODER_DECODER = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=VOCAB,
                       max_position_embeddings=64, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                       decoder_start_token_id=0)
SERIES = {"past_values": normal(32, 3)}


def tokens(vocab: int, low: int = 1, length: int = 16):
    """(n, seed) -> n sequences of ``length`` token ids in [low, vocab)."""
    return lambda n, seed: np.random.default_rng(seed).integers(low, vocab, (n, length)).astype(np.int64)


def timm_model(name: str, shape=(3, 64, 64), **kwargs):
    """A timm model (seeded random weights, no pretrained weights fetched; 10 classes unless ``num_classes`` says):
    a registered name, or ``module.Class`` of timm.models built from ``kwargs`` (a string naming a class of that
    module, as its layers' arguments)."""
    kwargs = {"num_classes": 10, **kwargs}

    def build():
        import timm
        import torch
        torch.manual_seed(0)
        if "." not in name:
            return timm.create_model(name, pretrained=False, **kwargs).eval()
        module, model = name.split(".")
        module = getattr(timm.models, module)
        return getattr(module, model)(**{k: getattr(module, v) if isinstance(v, str) else v
                                         for k, v in kwargs.items()}).eval()
    return build, {"x": normal(*shape)}


def architectures() -> dict:
    """name: (builder, inputs {name: (n, seed) -> n samples})."""
    small = dict(num_channels=3)
    video = dict(image_size=32, patch_size=8, num_frames=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, num_channels=3)
    return {
        # decoder language models (the language model's logits where the head is the family's point)
        "gemma": hf("GemmaConfig", "GemmaModel", TEXT_IN, **dict(DECODER, head_dim=16)),
        "gemma2-lm": hf("Gemma2Config", "Gemma2ForCausalLM", TEXT_IN, out="logits",
                        **dict(DECODER, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                               attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
        "falcon": hf("FalconConfig", "FalconModel", TEXT_IN, hidden_size=64, num_hidden_layers=2,
                     num_attention_heads=4, vocab_size=VOCAB, multi_query=True, parallel_attn=True, use_cache=False),
        "opt": hf("OPTConfig", "OPTModel", TEXT_IN, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  ffn_dim=128, word_embed_proj_dim=64, vocab_size=VOCAB, max_position_embeddings=64,
                  use_cache=False),
        "bloom": hf("BloomConfig", "BloomModel", TEXT_IN, hidden_size=64, n_layer=2, n_head=4, vocab_size=VOCAB,
                    use_cache=False),
        "gpt-neox": hf("GPTNeoXConfig", "GPTNeoXModel", TEXT_IN, **dict(TEXT, partial_rotary_factor=0.25,
                                                                         use_cache=False)),
        "stablelm": hf("StableLmConfig", "StableLmModel", TEXT_IN, **dict(DECODER, partial_rotary_factor=0.25)),
        "phi3": hf("Phi3Config", "Phi3Model", TEXT_IN, **dict(DECODER, pad_token_id=0, bos_token_id=1,
                                                              eos_token_id=2)),
        "qwen3": hf("Qwen3Config", "Qwen3Model", TEXT_IN, **dict(DECODER, head_dim=16)),
        "smollm-lm": hf("LlamaConfig", "LlamaForCausalLM", TEXT_IN, out="logits",
                        **dict(DECODER, num_key_value_heads=1, tie_word_embeddings=True)),
        # its experts as a loop over each expert's tokens (the grouped default exports neither way: aten::histc)
        "mixtral": hf("MixtralConfig", "MixtralModel", TEXT_IN, **dict(DECODER, num_local_experts=4,
                                                                       num_experts_per_tok=2,
                                                                       experts_implementation="eager")),
        # encoders
        "esm": hf("EsmConfig", "EsmModel", {"input_ids": tokens(33, 4)}, **dict(TEXT, vocab_size=33,
                                                                              position_embedding_type="rotary",
                                                                              pad_token_id=1, mask_token_id=32)),
        "fnet": hf("FNetConfig", "FNetModel", TEXT_IN, **TEXT),
        "xlnet": hf("XLNetConfig", "XLNetModel", TEXT_IN, d_model=64, n_layer=2, n_head=4, d_inner=128,
                    vocab_size=VOCAB, use_mems_eval=False),
        "nystromformer": hf("NystromformerConfig", "NystromformerModel", TEXT_IN, num_landmarks=4,
                            segment_means_seq_len=16, **TEXT),
        "perceiver": hf("PerceiverConfig", "PerceiverModel", {"inputs": normal(16, 32)}, num_latents=8,
                        d_latents=32, d_model=32, num_blocks=1, num_self_attends_per_block=2,
                        num_self_attention_heads=2, num_cross_attention_heads=1),
        "marian-encoder": hf("MarianConfig", "MarianModel", TEXT_IN, sub="get_encoder", **ENCODER_DECODER),
        "mbart-encoder": hf("MBartConfig", "MBartModel", TEXT_IN, sub="get_encoder", **ENCODER_DECODER),
        "pegasus-encoder": hf("PegasusConfig", "PegasusModel", TEXT_IN, sub="get_encoder", **ENCODER_DECODER),
        # time series
        "patchtst": hf("PatchTSTConfig", "PatchTSTModel", SERIES, num_input_channels=3, context_length=32,
                       patch_length=8, patch_stride=8, d_model=32, num_hidden_layers=2, num_attention_heads=2,
                       ffn_dim=64),
        "patchtsmixer": hf("PatchTSMixerConfig", "PatchTSMixerModel", SERIES, num_input_channels=3,
                           context_length=32, patch_length=8, patch_stride=8, d_model=16, num_layers=2),
        "timeseries-encoder": hf("TimeSeriesTransformerConfig", "TimeSeriesTransformerModel",
                                 {"inputs_embeds": normal(16, 4)}, sub="get_encoder", prediction_length=4,
                                 context_length=16, input_size=1, lags_sequence=[1], num_time_features=1, d_model=32,
                                 encoder_layers=2, decoder_layers=1, encoder_attention_heads=2,
                                 decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64),
        # vision
        "pvtv2": hf("PvtV2Config", "PvtV2Model", {"pixel_values": normal(3, 64, 64)}, num_encoder_blocks=2,
                    depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                    num_attention_heads=[1, 2], mlp_ratios=[2, 2], **small),
        "focalnet": hf("FocalNetConfig", "FocalNetModel", {"pixel_values": normal(3, 64, 64)}, image_size=64,
                       patch_size=4, embed_dim=16, depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3], **small),
        "cvt": hf("CvtConfig", "CvtModel", {"pixel_values": normal(3, 64, 64)}, embed_dim=[16, 32, 48],
                  num_heads=[1, 2, 2], depth=[1, 2, 3], **small),  # CvtStage reads a rate per stage: depth[s] > s
        "bit": hf("BitConfig", "BitModel", {"pixel_values": normal(3, 64, 64)}, embedding_size=32,
                  hidden_sizes=[32, 64], depths=[1, 1], layer_type="preactivation", global_padding="SAME", num_groups=8,
                  **small),
        "swin2sr": hf("Swin2SRConfig", "Swin2SRForImageSuperResolution", {"pixel_values": normal(3, 16, 16)},
                      out="reconstruction", image_size=16, patch_size=1, embed_dim=16, depths=[2], num_heads=[2],
                      window_size=4, upscale=2, upsampler="pixelshuffledirect", **small),
        "vitmae-encoder": hf("ViTMAEConfig", "ViTMAEModel", PIXELS, mask_ratio=0.0, **VISION),
        "timm-convnext": timm_model("convnext_atto"),
        "timm-efficientnet": timm_model("efficientnet_b0"),
        "timm-mobilenetv3": timm_model("mobilenetv3_small_050"),
        "timm-regnet": timm_model("regnetx_002"),
        # MLP-Mixer's and ResMLP's heads start at zero (a constant output): their pooled features instead
        "timm-mixer": timm_model("mlp_mixer.MlpMixer", (3, 32, 32), img_size=32, patch_size=8, num_blocks=2,
                                 embed_dim=64, num_classes=0),
        "timm-resmlp": timm_model("mlp_mixer.MlpMixer", (3, 32, 32), img_size=32, patch_size=8, num_blocks=2,
                                  embed_dim=64, mlp_ratio=4, block_layer="ResBlock", norm_layer="Affine",
                                  num_classes=0),
        "timm-eva02": timm_model("eva02_tiny_patch14_224", (3, 32, 32), img_size=32, patch_size=8, depth=2,
                                 embed_dim=64, num_heads=2),
        # audio
        "clap-audio": hf("ClapAudioConfig", "ClapAudioModel", {"input_features": normal(1, 64, 32)},
                         out="pooler_output", spec_size=64, window_size=4, num_mel_bins=32, patch_size=4,
                         patch_stride=[4, 4], patch_embeds_hidden_size=16, hidden_size=32, depths=[1, 1],
                         num_attention_heads=[2, 2], enable_fusion=False, num_classes=10),
        "speecht5-encoder": hf("SpeechT5Config", "SpeechT5ForSpeechToText", WAVE, sub="get_encoder",
                               **dict(AUDIO, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
                                      decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128)),
        "unispeech-sat": hf("UniSpeechSatConfig", "UniSpeechSatModel", WAVE, **AUDIO),
        # video: 4 frames of 32 x 32
        "videomae": hf("VideoMAEConfig", "VideoMAEModel", {"pixel_values": normal(4, 3, 32, 32)}, tubelet_size=2,
                       **video),
        "timesformer": hf("TimesformerConfig", "TimesformerModel", {"pixel_values": normal(4, 3, 32, 32)}, **video),
    }


if __name__ == "__main__":
    more_architectures.main(architectures(), __doc__)
