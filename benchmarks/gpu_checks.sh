#!/bin/sh
# Everything that needs a GPU, in one go: run from the repository root on a machine where onnxruntime offers
# CUDAExecutionProvider (onnxruntime-gpu; README, CUDA) and the native library was built with its CUDA kernels
# (`cvm-onnx --version` says both). RESNET names the ResNet-20 model directory (default: the shared copy beside
# the checkout, as the tests look for it).
#
#   1. the versions, the GPU, and whether CUDA is usable;
#   2. the GPU tests: the native CUDA kernels against their oracles (im2col, requantize, NMS, lookups), the CUDA
#      forms of the examples and ResNet-20 exact with every node on CUDA (read from a session profile), IO binding
#      and CUDA graphs;
#   3. each example and ResNet-20 converted to the CUDA form and verified exact on the GPU (one sample, and
#      ResNet-20 batched by 64);
#   4. benchmarks/bench_cuda.py: every form at batch 1, 64 and 1024 on CUDA, beside the CPU and PyTorch, and the
#      CUDA form's time per op type.
set -eu
RESNET=${RESNET:-../shared/models/resnet20-cifar}
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
cvm-onnx --version
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
cvm-onnx --version | grep -q "^CUDA: usable here" || { echo "gpu_checks: CUDA is not usable here" >&2; exit 1; }
python -m pytest -q -p no:xdist -rs tests/test_cuda.py tests/test_native.py
for model in models/digits_cnn models/detection models/transforms "$RESNET"; do
  cvm-onnx convert "$model" -o "$OUT/$(basename "$model").cuda.onnx" --provider cuda --verify
done
cvm-onnx convert "$RESNET" -o "$OUT/resnet20.cuda.b64.onnx" --provider cuda --batch 64 --verify
python benchmarks/bench_cuda.py --cpu --profile
