"""Vision architectures as torch exports them, through `cvm-onnx quantize`.

Each model is built from its transformers config class with small seeded random weights (few layers, narrow widths;
no weights fetched from a hub), or is a small torch module of a building block users write; each is exported with
torch.onnx.export by the TorchScript exporter (dynamo=False, opset 17) and the dynamo exporter (opset 18), then
quantized per tensor and per channel on 8 calibration samples and measured on held-out samples as
benchmarks/real_models.py measures its corpus (`one`: imported whole or the refusals by rule; the distance from the
float model against onnxruntime's quantized model's, within the output's range; the export back exact).

Needs torch and transformers (not dependencies of the project). Run:
python benchmarks/vision_architectures.py [--only NAME ...] [--exporter torchscript|dynamo] [--held-out N]
    [--json out.json]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from real_models import Model, cpu, export_failure, imagenet, json_line, one, refusal, whole  # noqa: E402


def hf(config_name: str, model_name: str, out: str = "logits", **config):
    """A transformers model built from its config class with seeded random weights, returning one output."""
    def build():
        import torch
        import transformers
        torch.manual_seed(0)
        model = getattr(transformers, model_name)(getattr(transformers, config_name)(**config)).eval()

        class Head(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, x):
                got = self.model(pixel_values=x)
                return tuple(getattr(got, k) for k in out.split(",")) if "," in out else getattr(got, out)
        return Head()
    return build


def block(make):
    """A small torch module (make() builds its layers) of a building block users write."""
    def build():
        import torch
        torch.manual_seed(0)
        return make(torch.nn).eval()
    return build


def blocks():
    """The torch building blocks: (name, builder, input shape)."""
    def seq(layers):
        def make(nn):
            return nn.Sequential(*layers(nn))
        return make

    def conv(nn, c_in, c_out, k=3, s=1):
        return nn.Conv2d(c_in, c_out, k, s, k // 2)

    def shuffle(groups):
        import torch

        class ChannelShuffle(torch.nn.Module):
            def forward(self, x):
                n, c, h, w = x.shape
                return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)
        return ChannelShuffle()

    def fpn(nn):
        import torch

        class FPN(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.c1, self.c2, self.c3 = conv(nn, 3, 8, s=2), conv(nn, 8, 16, s=2), conv(nn, 16, 32, s=2)
                self.l1, self.l2, self.l3 = nn.Conv2d(8, 16, 1), nn.Conv2d(16, 16, 1), nn.Conv2d(32, 16, 1)
                self.out = conv(nn, 16, 4)

            def forward(self, x):
                a = torch.relu(self.c1(x))
                b = torch.relu(self.c2(a))
                c = torch.relu(self.c3(b))
                p3 = self.l3(c)
                p2 = self.l2(b) + torch.nn.functional.interpolate(p3, scale_factor=2.0, mode="nearest")
                p1 = self.l1(a) + torch.nn.functional.interpolate(p2, size=a.shape[-2:], mode="bilinear",
                                                                  align_corners=False)
                return self.out(p1)
        return FPN()

    return [
        ("bilinear-ac", block(seq(lambda nn: [conv(nn, 3, 8, s=2), nn.ReLU(),
                                              nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True),
                                              conv(nn, 8, 4)])), (3, 32, 32)),
        ("bilinear", block(seq(lambda nn: [conv(nn, 3, 8, s=2), nn.ReLU(),
                                           nn.Upsample(scale_factor=2, mode="bilinear"), conv(nn, 8, 4)])),
         (3, 32, 32)),
        ("bicubic", block(seq(lambda nn: [conv(nn, 3, 8, s=2), nn.ReLU(),
                                          nn.Upsample(scale_factor=2, mode="bicubic", align_corners=False),
                                          conv(nn, 8, 4)])), (3, 32, 32)),
        ("bicubic-ac", block(seq(lambda nn: [conv(nn, 3, 8, s=2), nn.ReLU(),
                                             nn.Upsample(size=(27, 21), mode="bicubic", align_corners=True),
                                             conv(nn, 8, 4)])), (3, 32, 32)),
        ("pixel-shuffle", block(seq(lambda nn: [conv(nn, 3, 16), nn.ReLU(), nn.PixelShuffle(2), conv(nn, 4, 3),
                                                nn.PixelUnshuffle(2), conv(nn, 12, 4)])), (3, 16, 16)),
        ("group-norm", block(seq(lambda nn: [conv(nn, 3, 16), nn.GroupNorm(4, 16), nn.SiLU(), conv(nn, 16, 8),
                                             nn.GroupNorm(1, 8), conv(nn, 8, 4)])), (3, 16, 16)),
        ("adaptive-pool", block(seq(lambda nn: [conv(nn, 3, 8, s=2), nn.ReLU(), nn.AdaptiveAvgPool2d((3, 5)),
                                                conv(nn, 8, 8), nn.AdaptiveAvgPool2d((2, 3)), nn.Flatten(),
                                                nn.Linear(48, 10)])), (3, 28, 28)),
        ("hard-acts", block(seq(lambda nn: [conv(nn, 3, 8), nn.Hardswish(), conv(nn, 8, 8), nn.Hardsigmoid(),
                                            conv(nn, 8, 8), nn.ReLU6(), conv(nn, 8, 4)])), (3, 16, 16)),
        ("channel-shuffle", block(seq(lambda nn: [conv(nn, 3, 16), nn.ReLU(), shuffle(4),
                                                  nn.Conv2d(16, 16, 3, 1, 1, groups=4), nn.ReLU(), shuffle(2),
                                                  conv(nn, 16, 4)])), (3, 16, 16)),
        ("fpn", block(fpn), (3, 32, 32)),
    ]


def architectures():
    """The transformers vision models: (name, builder, input shape)."""
    small = dict(num_channels=3)
    return [
        ("resnet", hf("ResNetConfig", "ResNetForImageClassification", embedding_size=16, hidden_sizes=[16, 32],
                      depths=[1, 1], num_labels=10, **small), (3, 64, 64)),
        ("convnext", hf("ConvNextConfig", "ConvNextForImageClassification", hidden_sizes=[16, 32], depths=[1, 1],
                        num_stages=2, num_labels=10, **small), (3, 64, 64)),
        ("convnextv2", hf("ConvNextV2Config", "ConvNextV2ForImageClassification", hidden_sizes=[16, 32],
                          depths=[1, 1], num_stages=2, num_labels=10, **small), (3, 64, 64)),
        ("swin", hf("SwinConfig", "SwinForImageClassification", image_size=64, patch_size=4, embed_dim=16,
                    depths=[2, 2], num_heads=[2, 2], window_size=4, num_labels=10, **small), (3, 64, 64)),
        ("swinv2", hf("Swinv2Config", "Swinv2ForImageClassification", image_size=64, patch_size=4, embed_dim=16,
                      depths=[2, 2], num_heads=[2, 2], window_size=4, num_labels=10, **small), (3, 64, 64)),
        ("vit", hf("ViTConfig", "ViTForImageClassification", image_size=64, patch_size=16, hidden_size=32,
                   num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=10, **small),
         (3, 64, 64)),
        ("deit", hf("DeiTConfig", "DeiTForImageClassification", image_size=64, patch_size=16, hidden_size=32,
                    num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=10, **small),
         (3, 64, 64)),
        ("beit", hf("BeitConfig", "BeitForImageClassification", image_size=64, patch_size=16, hidden_size=32,
                    num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=10,
                    use_relative_position_bias=True, **small), (3, 64, 64)),
        ("dinov2", hf("Dinov2Config", "Dinov2ForImageClassification", image_size=64, patch_size=16, hidden_size=32,
                      num_hidden_layers=2, num_attention_heads=2, num_labels=10, **small), (3, 48, 48)),
        ("dinov2-registers", hf("Dinov2WithRegistersConfig", "Dinov2WithRegistersForImageClassification",
                                image_size=64, patch_size=16, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=2, num_register_tokens=2, num_labels=10, **small), (3, 48, 48)),
        ("mobilenetv1", hf("MobileNetV1Config", "MobileNetV1ForImageClassification", depth_multiplier=0.25,
                           image_size=64, num_labels=10, **small), (3, 64, 64)),
        ("mobilenetv2", hf("MobileNetV2Config", "MobileNetV2ForImageClassification", depth_multiplier=0.25,
                           image_size=64, num_labels=10, **small), (3, 64, 64)),
        ("mobilevit", hf("MobileViTConfig", "MobileViTForImageClassification", image_size=64, hidden_sizes=[16, 24, 32],
                         neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32], num_attention_heads=2, num_labels=10,
                         initializer_range=0.5,
                         **small), (3, 64, 64)),
        ("efficientnet", hf("EfficientNetConfig", "EfficientNetForImageClassification", image_size=64,
                            width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320, num_labels=10, **small),
         (3, 64, 64)),
        ("regnet", hf("RegNetConfig", "RegNetForImageClassification", embedding_size=16, hidden_sizes=[16, 32],
                      depths=[1, 1], groups_width=8, num_labels=10, **small), (3, 64, 64)),
        ("levit", hf("LevitConfig", "LevitForImageClassification", image_size=64, hidden_sizes=[32, 48],
                     num_attention_heads=[2, 2], depths=[1, 1], key_dim=[8, 8], down_ops=[["Subsample", 8, 2, 4, 2, 2]],
                     num_labels=10, **small), (3, 64, 64)),
        ("poolformer", hf("PoolFormerConfig", "PoolFormerForImageClassification", hidden_sizes=[16, 32],
                          depths=[1, 1], num_encoder_blocks=2, patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1],
                          num_labels=10, **small), (3, 64, 64)),
        ("segformer", hf("SegformerConfig", "SegformerForSemanticSegmentation", num_encoder_blocks=2, depths=[1, 1],
                         sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                         num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32, num_labels=4,
                         **small), (3, 64, 64)),
        ("dpt", hf("DPTConfig", "DPTForDepthEstimation", "predicted_depth", image_size=64, patch_size=16,
                   hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
                   backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 16, 16, 32], fusion_hidden_size=16,
                   head_hidden_size=16, **small), (3, 64, 64)),
        ("glpn", hf("GLPNConfig", "GLPNForDepthEstimation", "predicted_depth", num_encoder_blocks=2, depths=[1, 1],
                    sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                    num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=16, **small), (3, 64, 64)),
        ("yolos", hf("YolosConfig", "YolosForObjectDetection", "logits,pred_boxes", image_size=[64, 64],
                     patch_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, num_detection_tokens=4, num_labels=4, **small), (3, 64, 64)),
        ("upernet-convnext", upernet, (3, 64, 64)),
    ]


def upernet():
    import torch
    import transformers
    torch.manual_seed(0)
    backbone = transformers.ConvNextConfig(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1],
                                           out_features=["stage1", "stage2", "stage3", "stage4"])
    config = transformers.UperNetConfig(backbone_config=backbone, hidden_size=16, auxiliary_in_channels=24,
                                        auxiliary_channels=8, num_labels=4, pool_scales=[1, 2])
    model = transformers.UperNetForSemanticSegmentation(config).eval()

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(pixel_values=x).logits
    return Head()


def export(module, shape: tuple[int, ...], path: Path, exporter: str) -> None:
    import torch
    x = torch.from_numpy(imagenet(np.full(shape, 128.0)).astype(np.float32))[None]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(module, (x,), str(path), dynamo=False, opset_version=17, input_names=["x"])
        else:
            torch.onnx.export(module, (x,), str(path), dynamo=True, opset_version=18, input_names=["x"],
                              external_data=False)


def main() -> None:
    import onnx
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", help="model names")
    ap.add_argument("--exporter", nargs="+", default=["torchscript", "dynamo"], choices=["torchscript", "dynamo"])
    ap.add_argument("--samples", type=int, default=8, help="calibration samples (default 8)")
    ap.add_argument("--held-out", type=int, default=32, help="held-out samples compared (default 32)")
    ap.add_argument("--keep", help="also keep each exported float model in this folder")
    ap.add_argument("--json", help="also write the results there, one JSON line per run as it ends")
    args = ap.parse_args()
    print(f"CPU: {cpu()}; load {os.getloadavg()[0]:.1f}; {args.samples} calibration, {args.held_out} held-out samples")
    for name, build, shape in architectures() + blocks():
        if args.only and name not in args.only:
            continue
        for exporter in args.exporter:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(args.keep or tmp) / f"{name}-{exporter}.onnx"
                try:
                    export(build(), shape, path, exporter)
                except Exception as e:  # an exporter's failure is a finding, not the end of the run
                    print(f"{name} [{exporter}]: {export_failure(e)}")
                    continue
                ops = sorted({n.op_type for n in onnx.load(str(path)).graph.node})
                print(f"{name} [{exporter}]: {len(onnx.load(str(path)).graph.node)} nodes, ops {' '.join(ops)}")
                m = Model(name, "", str(path), shape, imagenet)
                for per_channel in (False, True):
                    t = time.perf_counter()
                    r = one(m, path, None, per_channel, args.samples, args.held_out, Path(tmp))
                    r.update(exporter=exporter, seconds=round(time.perf_counter() - t, 1))
                    label = f"  {'per-channel' if per_channel else 'per-tensor'}"
                    print(f"{label}: {whole(r) if r['whole'] else refusal(r)}")
                    if args.json:
                        with open(args.json, "a") as f:
                            f.write(json_line(r))
            print(f"  (load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
