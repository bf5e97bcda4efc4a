// The kernels that run on the CPU, each a pointer to its version for this CPU's ISA, chosen when the library
// loads (kernels.cc): AVX-512F, AVX2 or the baseline for the channels-last requantizations, AVX2 or the baseline
// for the others (isa.h). Each ISA's versions are in their own objects, so that the build compiles them in
// parallel; their bodies are in requantize.h and im2col.h.
#pragma once

#include <cstdint>
#include <vector>

#include "im2col.h"
#include "requantize.h"

namespace cvm_onnx {

using RequantizeFn = void(const int32_t* x, int64_t begin, int64_t end, const int32_t* bias, const int32_t* scales,
                          int64_t channels, int64_t inner, const std::vector<RequantStep>& steps, int32_t* y,
                          const ChannelSteps& per);
using RequantizeRowsFn = void(const int32_t* x, int64_t row, int64_t width, int64_t begin, int64_t end,
                              const int32_t* bias, int64_t channels, int64_t rows_per_plane,
                              const std::vector<RequantStep>& steps, int32_t* y);
using RequantizeLastFn = void(const int32_t* x, int64_t begin, int64_t end, const int32_t* bias_all,
                              const int32_t* scales, int64_t channels, const std::vector<RequantStep>& steps,
                              int32_t* y, int64_t positions, const ChannelSteps& per, const ChannelArrays& arrays,
                              uint8_t* bytes, const Addend* addend);
using RequantizeTransposedFn = void(const int32_t* x, int64_t positions, int64_t channels, int64_t n, int64_t begin,
                                    int64_t end, const int32_t* bias, const std::vector<RequantStep>& steps,
                                    int32_t* y, const ChannelSteps& per, bool per_position,
                                    const ChannelArrays& arrays);
using PadNarrowFn = int64_t(const int32_t* x, const Im2colShape& s, uint32_t offset, int64_t plane, uint8_t* xp);
using PadNarrowHwcFn = int64_t(const int32_t* x, const Im2colShape& s, int32_t lo, int32_t hi, uint32_t offset,
                               uint8_t fill, int64_t n, uint8_t* xp);
using PadCopyNhwcFn = void(const uint8_t* x, const Im2colShape& s, uint8_t fill, int64_t n, uint8_t* xp);
using Im2colRowsFn = void(const uint8_t* xp, const Im2colShape& s, int64_t n, int64_t oh, uint8_t* rows);

// The versions of each ISA, defined by the ISA units requantize_last.cc (requantize_last writing words, and
// bytes), requantize_kernels.cc and im2col_kernels.cc (AVX-512F: requantize_last and requantize_transposed only).
#define CVM_ONNX_DECLARE_KERNELS                                                     \
  RequantizeFn requantize;                                                           \
  RequantizeRowsFn requantize_rows;                                                  \
  RequantizeLastFn requantize_last_words, requantize_last_bytes;                    \
  RequantizeTransposedFn requantize_transposed;                                      \
  PadNarrowFn pad_narrow;                                                            \
  PadNarrowHwcFn pad_narrow_hwc, pad_narrow_nhwc;                                    \
  PadCopyNhwcFn pad_copy_nhwc;                                                       \
  Im2colRowsFn im2col_rows;
namespace isa_baseline { CVM_ONNX_DECLARE_KERNELS }
namespace isa_avx2 { CVM_ONNX_DECLARE_KERNELS }
namespace isa_avx512 {
RequantizeLastFn requantize_last_words, requantize_last_bytes;
RequantizeTransposedFn requantize_transposed;
}  // namespace isa_avx512
#undef CVM_ONNX_DECLARE_KERNELS

// The version for this CPU (the bodies state each kernel's rule).
extern RequantizeFn* const requantize;
extern RequantizeRowsFn* const requantize_rows;
extern RequantizeLastFn* const requantize_last_words;  // (bytes null)
extern RequantizeLastFn* const requantize_last_bytes;  // (y null)
extern RequantizeTransposedFn* const requantize_transposed;
extern PadNarrowFn* const pad_narrow;
extern PadNarrowHwcFn* const pad_narrow_hwc;
extern PadNarrowHwcFn* const pad_narrow_nhwc;
extern PadCopyNhwcFn* const pad_copy_nhwc;
extern Im2colRowsFn* const im2col_rows;


// requantize_last for this CPU: its version that writes bytes where they are given, else words.
inline void requantize_last(const int32_t* x, int64_t begin, int64_t end, const int32_t* bias_all,
                            const int32_t* scales, int64_t channels, const std::vector<RequantStep>& steps,
                            int32_t* y, int64_t positions, const ChannelSteps& per, const ChannelArrays& arrays,
                            uint8_t* bytes, const Addend* addend) {
  (bytes ? requantize_last_bytes : requantize_last_words)(x, begin, end, bias_all, scales, channels, steps, y,
                                                          positions, per, arrays, bytes, addend);
}

}  // namespace cvm_onnx
