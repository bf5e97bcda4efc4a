// Launchers of the CUDA kernels (cvm_ops_cuda.cu), callable from host C++ without CUDA headers.
// Each works on device pointers, enqueues on `stream` (a cudaStream_t) and returns nullptr, or the CUDA error text.
#pragma once

#include <cstdint>

#include "cvm_kernels.h"

namespace cvm_onnx {

const char* cuda_non_max_suppression(const int32_t* data, const int32_t* valid_count, int64_t batches, int64_t n,
                                     const NmsAttrs& attrs, int32_t* y, void* stream);
const char* cuda_get_valid_counts(const int32_t* data, int64_t batches, int64_t n, int64_t k, int64_t score_threshold,
                                  int32_t* valid_count, int32_t* y, void* stream);
const char* cuda_lut(const int32_t* indices, int64_t count, const int32_t* table, int64_t size, int32_t* y,
                     void* stream);

// A convolution's geometry for im2col, as checked on the host (im2col.h's Im2colShape, im2col_geometry).
struct Im2colArgs {
  int64_t n, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, group, oh, ow;
  bool wide;  // columns over the padded width wp = w + pl + pr (strides 1), reading on into the next rows
  bool batch_inner;  // columns (G, K, N * OH * OW) instead of (N, G, K, OH * OW)
  int64_t wp, hp;
};

// cols = the windows of x (N, C, H, W) as bytes of x + offset (offset in the padding): im2col.h's im2col and
// im2col_wide. Values outside [-128, 127] are not checked here (the host cannot see them without waiting for the
// GPU): they narrow modulo 256. The exporter proves every value it feeds these kernels within [-128, 127].
const char* cuda_im2col(const int32_t* x, const Im2colArgs& s, uint8_t offset, uint8_t* cols, void* stream);

// requantize.h's requantize and requantize_rows on the GPU, y (planes = N * C planes of `inner` elements, channel c
// = plane % channels): y = the steps (kind, a, b; kShift... kClip) applied in order to x * scales[c] + bias[c] in
// int32 with wrap-around. width > 0: each plane's rows of `width` elements are the first `width` of x's rows of
// `row`; batch > 0 (batch_inner): x is (channels, batch, inner), plane n * C + c read from x's plane c * N + n.
// bias / scales: device arrays of `channels` int32, or null. steps: host array of n_steps (kind, a, b) triples.
const char* cuda_requantize(const int32_t* x, int64_t planes, int64_t channels, int64_t inner, int64_t row,
                            int64_t width, int64_t batch, const int32_t* bias, const int32_t* scales,
                            const int64_t* steps, int64_t n_steps, int32_t* y, void* stream);

// A device copy of `count` int32 values (cudaMalloc + cudaMemcpy), or the CUDA error text in `error`.
int32_t* cuda_upload(const int32_t* host, int64_t count, const char** error);
// Frees what cuda_upload gave (null: nothing).
void cuda_free(int32_t* device);

}  // namespace cvm_onnx
