// CUDA kernels of the cvm.native ops, with the same semantics as the CPU kernels in cvm_ops.cc: the integer rules
// (IoU, suppression, lookup clip) come from cvm_kernels.h, shared by both. cvm_ops.cc registers them for
// CUDAExecutionProvider; this file has no onnxruntime dependency (nvcc's front end cannot parse the lite
// custom-op header), only kernels and their launchers (cvm_cuda.h).
#include <cuda_runtime.h>

#include "cvm_cuda.h"
#include "cvm_kernels.h"

namespace cvm_onnx {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t count) {
  const int64_t b = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

const char* last_error(cudaError_t err = cudaGetLastError()) {
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

__device__ int64_t rows_of(const int32_t* valid_count, int64_t b, int64_t n) {
  const int64_t v = valid_count[b];
  return v < 0 ? 0 : (v > n ? n : v);
}

// order[b, rank] = row: the stable descending-score order of the first T rows of batch b. A row's rank is the
// number of rows with a higher score plus the number of earlier rows with the same score.
__global__ void nms_rank(const int32_t* x, const int32_t* valid_count, int64_t n, int32_t* order) {
  const int64_t b = blockIdx.y;
  const int64_t t = rows_of(valid_count, b, n);
  const int32_t* xb = x + b * n * kRow;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < t; i += int64_t{gridDim.x} * blockDim.x) {
    const int32_t s = xb[i * kRow + kScore];
    int64_t rank = 0;
    for (int64_t j = 0; j < t; ++j) {
      const int32_t sj = xb[j * kRow + kScore];
      rank += (sj > s) || (sj == s && j < i);
    }
    order[b * n + rank] = static_cast<int32_t>(i);
  }
}

// Greedy suppression of one batch per block: candidates in score order, each checked against every kept row by
// all threads at once; kept rows are copied to y, the rest of y is filled with -1.
__global__ void nms_greedy(const int32_t* x, const int32_t* valid_count, int64_t n, const int32_t* order,
                           NmsAttrs a, int32_t* y) {
  const int64_t b = blockIdx.x;
  const int64_t t = rows_of(valid_count, b, n);
  const int64_t p_max = a.top_k >= 0 && a.top_k < t ? a.top_k : t;
  const int64_t n_max = a.max_output_size >= 0 && a.max_output_size < t ? a.max_output_size : t;
  const int32_t* xb = x + b * n * kRow;
  int32_t* yb = y + b * n * kRow;
  int64_t kept = 0;
  for (int64_t p = 0; p < p_max && kept < n_max; ++p) {
    const int32_t* cand = xb + int64_t{order[b * n + p]} * kRow;
    if (cand[kId] < 0) continue;
    bool dropped = false;
    for (int64_t k = threadIdx.x; k < kept && !dropped; k += blockDim.x) {
      dropped = suppresses(yb + k * kRow, cand, a.force_suppress, a.iou_threshold);
    }
    if (!__syncthreads_or(dropped)) {
      if (threadIdx.x < kRow) yb[kept * kRow + threadIdx.x] = cand[threadIdx.x];
      ++kept;
      __syncthreads();
    }
  }
  for (int64_t i = kept * kRow + threadIdx.x; i < n * kRow; i += blockDim.x) yb[i] = -1;
}

// get_valid_counts, one batch per block: rows with score > threshold are compacted in order (a block-wide prefix
// sum per chunk of rows), the count is written and the rest is filled with -1.
__global__ void valid_counts(const int32_t* x, int64_t n, int64_t k, int64_t threshold, int32_t* counts,
                             int32_t* y) {
  __shared__ int32_t scan[kThreads];
  const int64_t b = blockIdx.x;
  const int32_t* xb = x + b * n * k;
  int32_t* yb = y + b * n * k;
  int64_t total = 0;
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t j = base + threadIdx.x;
    const int32_t keep = j < n && xb[j * k + kScore] > threshold;
    scan[threadIdx.x] = keep;
    __syncthreads();
    for (unsigned step = 1; step < blockDim.x; step <<= 1) {  // inclusive Hillis-Steele scan
      const int32_t add = threadIdx.x >= step ? scan[threadIdx.x - step] : 0;
      __syncthreads();
      scan[threadIdx.x] += add;
      __syncthreads();
    }
    if (keep) {
      const int64_t dst = total + scan[threadIdx.x] - 1;
      for (int64_t c = 0; c < k; ++c) yb[dst * k + c] = xb[j * k + c];
    }
    total += scan[blockDim.x - 1];
    __syncthreads();
  }
  if (threadIdx.x == 0) counts[b] = static_cast<int32_t>(total);
  for (int64_t i = total * k + threadIdx.x; i < n * k; i += blockDim.x) yb[i] = -1;
}

__global__ void lut(const int32_t* indices, int64_t count, const int32_t* table, int64_t size, int32_t* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = table[lut_index(indices[i], size)];
  }
}

}  // namespace

const char* cuda_non_max_suppression(const int32_t* data, const int32_t* valid_count, int64_t batches, int64_t n,
                                     const NmsAttrs& attrs, int32_t* y, void* stream) {
  if (batches == 0 || n == 0) return nullptr;
  if (batches > 65535) return "non_max_suppression on CUDA supports at most 65535 batches";
  const auto s = static_cast<cudaStream_t>(stream);
  int32_t* order = nullptr;
  if (cudaError_t err = cudaMallocAsync(&order, sizeof(int32_t) * batches * n, s); err != cudaSuccess) {
    return last_error(err);
  }
  nms_rank<<<dim3(blocks_for(n), static_cast<unsigned>(batches)), kThreads, 0, s>>>(data, valid_count, n, order);
  nms_greedy<<<static_cast<unsigned>(batches), kThreads, 0, s>>>(data, valid_count, n, order, attrs, y);
  cudaFreeAsync(order, s);
  return last_error();
}

const char* cuda_get_valid_counts(const int32_t* data, int64_t batches, int64_t n, int64_t k, int64_t score_threshold,
                                  int32_t* valid_count, int32_t* y, void* stream) {
  if (batches == 0) return nullptr;
  valid_counts<<<static_cast<unsigned>(batches), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      data, n, k, score_threshold, valid_count, y);
  return last_error();
}

const char* cuda_lut(const int32_t* indices, int64_t count, const int32_t* table, int64_t size, int32_t* y,
                     void* stream) {
  if (count == 0) return nullptr;
  lut<<<blocks_for(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(indices, count, table, size, y);
  return last_error();
}

}  // namespace cvm_onnx
