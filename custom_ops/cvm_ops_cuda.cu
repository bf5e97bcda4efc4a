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

// One block row per column row: row r holds the `positions` columns of window position k of plane `plane` = n * C +
// channel (the input's channel order): r = plane * window + k, or with batch_inner r = (channel * window + k) * N +
// n. Each row's indices are worked out once per block; each element then needs one 32-bit division (its output row
// and column), so the gather runs at memory speed. A row is one contiguous run of columns.
__global__ void gather_windows(const int32_t* x, Im2colArgs s, uint8_t offset, int64_t rows, uint8_t* cols) {
  const int64_t window = s.kh * s.kw;
  const int32_t positions = static_cast<int32_t>(s.oh * (s.wide ? s.wp : s.ow));
  const int32_t ow = static_cast<int32_t>(s.ow), wp = static_cast<int32_t>(s.wp);
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t k = s.batch_inner ? (r / s.n) % window : r % window;
    const int64_t plane = s.batch_inner ? (r % s.n) * s.c + r / s.n / window : r / window;
    const int32_t fh = static_cast<int32_t>(k / s.kw), fw = static_cast<int32_t>(k % s.kw);
    const int32_t* src = x + plane * s.h * s.w;
    uint8_t* dst = cols + r * positions;
    for (int32_t l = blockIdx.x * blockDim.x + threadIdx.x; l < positions; l += gridDim.x * blockDim.x) {
      int64_t ih, iw;
      if (s.wide) {  // padded row-major position, read on past the row's end into the following rows
        const int64_t p = l + (fh * s.dh) * wp + fw * s.dw;
        ih = p / wp - s.pt, iw = p % wp - s.pl;
        if (p / wp >= s.hp) ih = -1;  // past the plane's last padded row: the slack, padding
      } else {
        const int32_t oh = l / ow;
        ih = oh * s.sh + fh * s.dh - s.pt, iw = (l - oh * ow) * s.sw + fw * s.dw - s.pl;
      }
      const bool inside = ih >= 0 && ih < s.h && iw >= 0 && iw < s.w;
      const uint32_t v = inside ? static_cast<uint32_t>(src[ih * s.w + iw]) : 0u;
      dst[l] = static_cast<uint8_t>(v + offset);
    }
  }
}

constexpr int kMaxSteps = 32;  // steps per launch (kernel parameters); longer runs take several launches

struct Steps {
  int32_t kind[kMaxSteps], a[kMaxSteps], b[kMaxSteps];
  int count;
};

// requantize.h's apply_steps on one value: int32 with two's-complement wrap-around, shift (v + 2^(a-1)) >> a.
__device__ int32_t apply(int32_t v, const Steps& st) {
  for (int k = 0; k < st.count; ++k) {
    const uint32_t a = static_cast<uint32_t>(st.a[k]);
    switch (st.kind[k]) {
      case 0: v = static_cast<int32_t>(static_cast<uint32_t>(v) + (1u << (a - 1))) >> a; break;
      case 1: v = static_cast<int32_t>(static_cast<uint32_t>(v) * a); break;
      case 2: v = static_cast<int32_t>(static_cast<uint32_t>(v) + a); break;
      default: v = min(max(v, st.a[k]), st.b[k]);
    }
  }
  return v;
}

// One block row per plane p = n * C + c of y (N, C, inner): y[p, j] = steps(x[src] * scales[c] + bias[c]), src
// from plane p of x (inner_in elements per plane), or plane c * N + n with batch (batch_inner: x is (C, N, ...));
// with width, y's plane rows of `width` elements come from x's rows of `row`. bias / scales: null when absent.
__global__ void requantize_kernel(const int32_t* x, int64_t planes, int64_t channels, int64_t inner, int64_t inner_in,
                                  int64_t row, int64_t width, int64_t batch, const int32_t* bias,
                                  const int32_t* scales, Steps st, int32_t* y) {
  for (int64_t p = blockIdx.y; p < planes; p += gridDim.y) {
    const int64_t c = p % channels;
    const int32_t* src = x + (batch > 0 ? c * batch + p / channels : p) * inner_in;
    const uint32_t add = bias ? static_cast<uint32_t>(bias[c]) : 0u;
    const uint32_t mul = scales ? static_cast<uint32_t>(scales[c]) : 1u;
    int32_t* dst = y + p * inner;
    for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < inner; j += int64_t{gridDim.x} * blockDim.x) {
      const int32_t v = width > 0 ? src[(j / width) * row + j % width] : src[j];
      dst[j] = apply(static_cast<int32_t>(static_cast<uint32_t>(v) * mul + add), st);
    }
  }
}

__global__ void lut(const int32_t* indices, int64_t count, const int32_t* table, int64_t size, int32_t* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = table[lut_index(indices[i], size)];
  }
}

}  // namespace

// A grid of (blocks along a row, rows): each within CUDA's limits, the kernels loop over the rest.
dim3 row_grid(int64_t per_row, int64_t rows) {
  const int64_t x = (per_row + kThreads - 1) / kThreads;
  return dim3(static_cast<unsigned>(x < 1 ? 1 : (x > 1024 ? 1024 : x)),
              static_cast<unsigned>(rows < 1 ? 1 : (rows > 65535 ? 65535 : rows)));
}

const char* cuda_im2col(const int32_t* x, const Im2colArgs& s, uint8_t offset, uint8_t* cols, void* stream) {
  const int64_t rows = s.n * s.c * s.kh * s.kw, positions = s.oh * (s.wide ? s.wp : s.ow);
  if (rows == 0 || positions == 0) return nullptr;
  gather_windows<<<row_grid(positions, rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, s, offset, rows,
                                                                                                  cols);
  return last_error();
}

const char* cuda_requantize(const int32_t* x, int64_t planes, int64_t channels, int64_t inner, int64_t row,
                            int64_t width, int64_t batch, const int32_t* bias, const int32_t* scales,
                            const int64_t* steps, int64_t n_steps, int32_t* y, void* stream) {
  if (planes == 0 || inner == 0) return nullptr;
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid = row_grid(inner, planes);
  const int64_t inner_in = width > 0 ? inner / width * row : inner;
  int64_t done = 0;
  do {  // the first launch reads x (bias, scales, width, batch); any further one continues on y in place
    Steps st{};
    st.count = static_cast<int>(n_steps - done < kMaxSteps ? n_steps - done : kMaxSteps);
    for (int k = 0; k < st.count; ++k) {
      st.kind[k] = static_cast<int32_t>(steps[3 * (done + k)]);
      st.a[k] = static_cast<int32_t>(steps[3 * (done + k) + 1]);
      st.b[k] = static_cast<int32_t>(steps[3 * (done + k) + 2]);
    }
    if (done == 0) {
      requantize_kernel<<<grid, kThreads, 0, s>>>(x, planes, channels, inner, inner_in, row, width, batch, bias,
                                                  scales, st, y);
    } else {
      requantize_kernel<<<grid, kThreads, 0, s>>>(y, planes, channels, inner, inner, 0, 0, 0, nullptr, nullptr, st,
                                                  y);
    }
    done += st.count;
  } while (done < n_steps);
  return last_error();
}

int32_t* cuda_upload(const int32_t* host, int64_t count, const char** error) {
  int32_t* device = nullptr;
  cudaError_t err = cudaMalloc(&device, sizeof(int32_t) * (count > 0 ? count : 1));
  if (err == cudaSuccess && count > 0) {
    err = cudaMemcpy(device, host, sizeof(int32_t) * count, cudaMemcpyHostToDevice);
  }
  *error = last_error(err);
  return device;
}

void cuda_free(int32_t* device) {
  if (device != nullptr) cudaFree(device);
}

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
