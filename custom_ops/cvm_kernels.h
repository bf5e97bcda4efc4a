// Integer rules shared by the CPU and CUDA kernels of the cvm.native ops, written once so both devices agree.
//
// They follow the CVM runtime's FORMAL device (see docs/custom_ops.md): the NMS IoU is an integer percentage
// computed in int64, and table lookups clip their index into the table.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define CVM_HD __host__ __device__
#else
#define CVM_HD
#endif

namespace cvm_onnx {

// NMS row layout: [id, score, x1, y1, x2, y2].
constexpr int kRow = 6;
constexpr int kId = 0;
constexpr int kScore = 1;
constexpr int kBox = 2;

// Attributes of non_max_suppression, with the runtime's defaults (-1 means "no limit").
struct NmsAttrs {
  int64_t max_output_size = -1;
  int64_t iou_threshold = 50;
  bool force_suppress = false;
  int64_t top_k = -1;
};

// int32 a - b with two's-complement wrap-around, as the runtime's int32 arithmetic behaves (no undefined behaviour).
CVM_HD inline int32_t wrap_sub(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) - static_cast<uint32_t>(b));
}

CVM_HD inline int32_t min32(int32_t a, int32_t b) { return a < b ? a : b; }
CVM_HD inline int32_t max32(int32_t a, int32_t b) { return a > b ? a : b; }

// IoU of two corner boxes [x1, y1, x2, y2] as a truncated integer percentage (the runtime's `iou`):
//   sum_area = area(a) + area(b) in int64 (sides are int32 differences); 0 if sum_area <= 0
//   overlap  = max(0, w) * max(0, h) in int64; tmp = sum_area - overlap; 0 if tmp <= 0
//   if INT64_MAX / 100 < overlap: tmp /= 100, else overlap *= 100; result overlap / tmp.
// Inputs within the runtime's NMS precision (<= 30 bits) never wrap. A divisor that the /100 branch turns into 0
// (only reachable with wrapped coordinates) gives 0.
CVM_HD inline int64_t iou_percent(const int32_t* a, const int32_t* b) {
  const uint64_t area_a = static_cast<uint64_t>(static_cast<int64_t>(wrap_sub(a[2], a[0])) * wrap_sub(a[3], a[1]));
  const uint64_t area_b = static_cast<uint64_t>(static_cast<int64_t>(wrap_sub(b[2], b[0])) * wrap_sub(b[3], b[1]));
  const int64_t sum_area = static_cast<int64_t>(area_a + area_b);
  if (sum_area <= 0) return 0;
  const int32_t w = max32(0, wrap_sub(min32(a[2], b[2]), max32(a[0], b[0])));
  const int32_t h = max32(0, wrap_sub(min32(a[3], b[3]), max32(a[1], b[1])));
  int64_t overlap = static_cast<int64_t>(h) * w;
  int64_t tmp = sum_area - overlap;
  if (tmp <= 0) return 0;
  if (INT64_MAX / 100 < overlap) {
    tmp /= 100;
  } else {
    overlap *= 100;
  }
  return tmp == 0 ? 0 : overlap / tmp;
}

// Whether a candidate row is suppressed by an already kept row (same id or force_suppress, and iou >= threshold).
CVM_HD inline bool suppresses(const int32_t* kept, const int32_t* cand, bool force_suppress, int64_t iou_threshold) {
  return (force_suppress || kept[kId] == cand[kId]) && iou_percent(kept + kBox, cand + kBox) >= iou_threshold;
}

// Table index of a lookup: clip(index, 0, size - 1) (the runtime's `take` with axis=None).
template <typename I>
CVM_HD inline int64_t lut_index(I index, int64_t size) {
  const int64_t i = static_cast<int64_t>(index);
  return i < 0 ? 0 : (i >= size ? size - 1 : i);
}

}  // namespace cvm_onnx
