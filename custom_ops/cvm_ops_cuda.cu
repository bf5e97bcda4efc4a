// CUDA kernels of the cvm.native ops, with the same semantics as the CPU kernels in cvm_ops.cc: the integer rules
// (IoU, suppression, lookup clip) come from cvm_kernels.h, shared by both. cvm_ops.cc registers them for
// CUDAExecutionProvider; this file has no onnxruntime dependency, only kernels and their launchers (cvm_cuda.h).
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

constexpr int kPer = 4;  // values per thread in im2col and requantize

// Grid (position blocks, planes): a thread takes kPer consecutive columns l of a plane p = n * C + c (the input's
// channel order) and writes them for every window position k of that plane, in row r = p * window + k, or with
// batch_inner r = (c * window + k) * N + n, as one 4-byte store where the row length allows. The output positions
// (i, j) of its columns are worked out once and reused for every plane and window position, so no element costs a
// division, and a plane's window positions read the same few input rows (cached).
__global__ void gather_windows(const int32_t* x, Im2colArgs s, uint8_t offset, int64_t planes, uint8_t* cols) {
  const int32_t window = static_cast<int32_t>(s.kh * s.kw), kw = static_cast<int32_t>(s.kw);
  const int32_t width = static_cast<int32_t>(s.wide ? s.wp : s.ow);
  const int32_t positions = static_cast<int32_t>(s.oh) * width;  // columns stay under 2^31 elements (im2col.h)
  const int32_t h = static_cast<int32_t>(s.h), w = static_cast<int32_t>(s.w), hp = static_cast<int32_t>(s.hp);
  const int32_t sh = static_cast<int32_t>(s.sh), sw = static_cast<int32_t>(s.sw);
  const int32_t dh = static_cast<int32_t>(s.dh), dw = static_cast<int32_t>(s.dw);
  const int32_t pt = static_cast<int32_t>(s.pt), pl = static_cast<int32_t>(s.pl);
  for (int64_t l0 = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * kPer; l0 < positions;
       l0 += int64_t{gridDim.x} * blockDim.x * kPer) {
    const int32_t count = positions - l0 < kPer ? static_cast<int32_t>(positions - l0) : kPer;
    const bool packed = count == kPer && positions % kPer == 0;  // r * positions + l0: 4-byte aligned
    int32_t oi[kPer], oj[kPer];
    for (int32_t e = 0, i = static_cast<int32_t>(l0 / width), j = static_cast<int32_t>(l0 - int64_t{i} * width);
         e < kPer; ++e) {
      oi[e] = i, oj[e] = j;
      if (++j == width) j = 0, ++i;
    }
    for (int64_t p = blockIdx.y; p < planes; p += gridDim.y) {
      const int32_t* src = x + p * s.h * s.w;
      const int64_t n = p / s.c, c = p - n * s.c;
      for (int32_t k = 0, fh = 0, fw = 0; k < window; ++k) {
        uint32_t bytes = 0;
        for (int e = 0; e < kPer; ++e) {
          int32_t ih, iw;
          if (s.wide) {  // padded row-major position l + fh * dh * wp + fw * dw, read on past the row's end
            int32_t ii = oi[e] + fh * dh, jj = oj[e] + fw * dw;
            if (jj >= width) jj -= width, ++ii;  // fw * dw < wp: at most one row further
            ih = ii < hp ? ii - pt : -1;  // past the plane's last padded row: padding
            iw = jj - pl;
          } else {
            ih = oi[e] * sh + fh * dh - pt, iw = oj[e] * sw + fw * dw - pl;
          }
          const bool inside = e < count && ih >= 0 && ih < h && iw >= 0 && iw < w;
          const uint32_t v = inside ? static_cast<uint32_t>(src[int64_t{ih} * w + iw]) : 0u;
          bytes |= ((v + offset) & 0xffu) << (8 * e);
        }
        uint8_t* dst = cols + (s.batch_inner ? (c * window + k) * s.n + n : p * window + k) * positions + l0;
        if (packed) {
          *reinterpret_cast<uint32_t*>(dst) = bytes;
        } else {
          for (int e = 0; e < count; ++e) dst[e] = static_cast<uint8_t>(bytes >> (8 * e));
        }
        if (++fw == kw) fw = 0, ++fh;
      }
    }
  }
}

constexpr int kMaxSteps = 32;  // steps per launch (kernel parameters); longer runs take several launches

struct Steps {
  int32_t kind[kMaxSteps], a[kMaxSteps], b[kMaxSteps];
  int count;
};

// requantize.h's apply_steps on kPer values: int32 with two's-complement wrap-around, shift (v + 2^(a-1)) >> a.
__device__ void apply(int32_t (&v)[kPer], const Steps& st) {
  for (int k = 0; k < st.count; ++k) {
    const uint32_t a = static_cast<uint32_t>(st.a[k]);
    switch (st.kind[k]) {
      case 0:
        for (int e = 0; e < kPer; ++e) v[e] = static_cast<int32_t>(static_cast<uint32_t>(v[e]) + (1u << (a - 1))) >> a;
        break;
      case 1:
        for (int e = 0; e < kPer; ++e) v[e] = static_cast<int32_t>(static_cast<uint32_t>(v[e]) * a);
        break;
      case 2:
        for (int e = 0; e < kPer; ++e) v[e] = static_cast<int32_t>(static_cast<uint32_t>(v[e]) + a);
        break;
      default:
        for (int e = 0; e < kPer; ++e) v[e] = min(max(v[e], st.a[k]), st.b[k]);
    }
  }
}

// One block row per plane p = n * C + c of y (N, C, inner): y[p, j] = steps(x[src] * scales[c] + bias[c]), src
// from plane p of x (inner_in elements per plane), or plane c * N + n with batch (batch_inner: x is (C, N, ...));
// with width, y's plane rows of `width` elements come from x's rows of `row`. bias / scales: null when absent.
// Each thread takes kPer consecutive values, walking x's rows without a division per value.
__global__ void requantize_kernel(const int32_t* x, int64_t planes, int64_t channels, int64_t inner, int64_t inner_in,
                                  int64_t row, int64_t width, int64_t batch, const int32_t* bias,
                                  const int32_t* scales, Steps st, int32_t* y) {
  for (int64_t p = blockIdx.y; p < planes; p += gridDim.y) {
    const int64_t c = p % channels;
    const int32_t* src = x + (batch > 0 ? c * batch + p / channels : p) * inner_in;
    const uint32_t add = bias ? static_cast<uint32_t>(bias[c]) : 0u;
    const uint32_t mul = scales ? static_cast<uint32_t>(scales[c]) : 1u;
    int32_t* dst = y + p * inner;
    for (int64_t j0 = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * kPer; j0 < inner;
         j0 += int64_t{gridDim.x} * blockDim.x * kPer) {
      const int64_t count = inner - j0 < kPer ? inner - j0 : kPer;
      int32_t v[kPer] = {};
      if (width > 0) {
        int64_t i = j0 / width, jj = j0 - i * width;
        for (int e = 0; e < count; ++e) {
          v[e] = src[i * row + jj];
          if (++jj == width) jj = 0, ++i;
        }
      } else {
        for (int e = 0; e < count; ++e) v[e] = src[j0 + e];
      }
      for (int e = 0; e < kPer; ++e) v[e] = static_cast<int32_t>(static_cast<uint32_t>(v[e]) * mul + add);
      apply(v, st);
      for (int e = 0; e < count; ++e) dst[j0 + e] = v[e];
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
  const int64_t planes = s.n * s.c, positions = s.oh * (s.wide ? s.wp : s.ow);
  if (planes == 0 || positions == 0 || s.kh * s.kw == 0) return nullptr;
  gather_windows<<<row_grid((positions + kPer - 1) / kPer, planes), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, s, offset,
                                                                                                    planes, cols);
  return last_error();
}

const char* cuda_requantize(const int32_t* x, int64_t planes, int64_t channels, int64_t inner, int64_t row,
                            int64_t width, int64_t batch, const int32_t* bias, const int32_t* scales,
                            const int64_t* steps, int64_t n_steps, int32_t* y, void* stream) {
  if (planes == 0 || inner == 0) return nullptr;
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid = row_grid((inner + kPer - 1) / kPer, planes);
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
