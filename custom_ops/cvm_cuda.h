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

}  // namespace cvm_onnx
