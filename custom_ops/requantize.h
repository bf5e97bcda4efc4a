// A requantization run in one pass (the serving form's ``requantize`` op): monotone integer steps over int32,
// in the order the CVM ops take them (docs/custom_ops.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "clones.h"

namespace cvm_onnx {

enum StepKind : int64_t { kShift = 0, kMul = 1, kAdd = 2, kClip = 3 };

struct RequantStep {
  int64_t kind, a, b;
};

// Parses the flat attribute [kind, a, b, ...]; returns an error message, empty when every step is valid: shift
// 1..31, mul/add an int32, clip lo <= hi within int32.
inline std::string parse_steps(const std::vector<int64_t>& flat, std::vector<RequantStep>& steps) {
  if (flat.size() % 3 != 0) return "steps must hold (kind, a, b) triples";
  const auto int32 = [](int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; };
  for (size_t i = 0; i < flat.size(); i += 3) {
    const RequantStep s{flat[i], flat[i + 1], flat[i + 2]};
    const bool ok = (s.kind == kShift && s.a >= 1 && s.a <= 31) || ((s.kind == kMul || s.kind == kAdd) && int32(s.a)) ||
                    (s.kind == kClip && int32(s.a) && int32(s.b) && s.a <= s.b);
    if (!ok) return "step " + std::to_string(i / 3) + " is not a valid (kind, a, b)";
    steps.push_back(s);
  }
  return {};
}

// Applies the steps in order to v[0:n] in place: int32 arithmetic with two's-complement wrap-around (the exporter
// proves no step wraps, so this is the runtime's arithmetic); shift s: (v + 2^(s-1)) >> s, the runtime's round half
// up. One loop per step, so that each vectorizes.
inline void apply_steps(int32_t* v, int64_t n, const std::vector<RequantStep>& steps) {
  for (const RequantStep& s : steps) {
    const uint32_t a = static_cast<uint32_t>(s.a);
    switch (s.kind) {
      case kShift: {
        const uint32_t half = 1u << (s.a - 1);
        const int shift = static_cast<int>(s.a);
        for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(static_cast<uint32_t>(v[i]) + half) >> shift;
        break;
      }
      case kMul:
        for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(static_cast<uint32_t>(v[i]) * a);
        break;
      case kAdd:
        for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(static_cast<uint32_t>(v[i]) + a);
        break;
      default: {
        const int32_t lo = static_cast<int32_t>(s.a), hi = static_cast<int32_t>(s.b);
        for (int64_t i = 0; i < n; ++i) v[i] = std::min(std::max(v[i], lo), hi);
      }
    }
  }
}

// The kernels below are compiled for AVX2 and the baseline (clones.h): 2.2x faster with AVX2 (16 K elements, five
// steps: 5.6 against 12.2 us).

// y[begin:end] = the steps applied to x * scales[c] + bias[c] (c the axis-1 index of x (N, C, inner...); no bias
// or no scales: null), in chunks that stay in the L1 cache. Any range gives the same elements as the whole: calls on
// disjoint ranges may run in parallel.
CVM_AVX2_CLONES void requantize(const int32_t* x, int64_t begin, int64_t end, const int32_t* bias,
                                const int32_t* scales, int64_t channels, int64_t inner,
                                const std::vector<RequantStep>& steps, int32_t* y) {
  const bool per_channel = bias || scales;
  for (int64_t start = begin; start < end;) {
    const int64_t plane = per_channel ? start / inner : 0;
    const int64_t stop = std::min({end, start + 1024, per_channel ? (plane + 1) * inner : end});
    const uint32_t add = bias ? static_cast<uint32_t>(bias[plane % channels]) : 0u;
    const uint32_t mul = scales ? static_cast<uint32_t>(scales[plane % channels]) : 1u;
    int32_t* v = y + start;
    const int64_t n = stop - start;
    if (scales) {
      for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(static_cast<uint32_t>(x[start + i]) * mul + add);
    } else {
      for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(static_cast<uint32_t>(x[start + i]) + add);
    }
    apply_steps(v, n, steps);
    start = stop;
  }
}

// The rows [begin, end) of y (rows of `width`) = the steps applied to the first `width` elements of the same rows of
// x (rows of `row` >= width) + bias[c], c = (r / rows_per_plane) % channels for row r (no bias: bias null). Short
// rows are gathered into chunks of about 1024 elements, so that each step's loop stays long.
CVM_AVX2_CLONES void requantize_rows(const int32_t* x, int64_t row, int64_t width, int64_t begin, int64_t end,
                                     const int32_t* bias, int64_t channels, int64_t rows_per_plane,
                                     const std::vector<RequantStep>& steps, int32_t* y) {
  const int64_t group = std::max<int64_t>(1, 1024 / width);
  for (int64_t first = begin; first < end; first += group) {
    const int64_t last = std::min(end, first + group);
    for (int64_t r = first; r < last; ++r) {
      const uint32_t add = bias ? static_cast<uint32_t>(bias[(r / rows_per_plane) % channels]) : 0u;
      const int32_t* u = x + r * row;
      int32_t* v = y + r * width;
      for (int64_t i = 0; i < width; ++i) v[i] = static_cast<int32_t>(static_cast<uint32_t>(u[i]) + add);
    }
    apply_steps(y + first * width, (last - first) * width, steps);
  }
}

}  // namespace cvm_onnx
