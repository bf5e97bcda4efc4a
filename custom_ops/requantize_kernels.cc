// ISA unit (isa.h): requantize_transposed for the ISA CVM_ISA; requantize and requantize_rows for the baseline and
// AVX2.
#include "kernels.h"

#if CVM_ISA_UNIT
namespace cvm_onnx::CVM_ISA_NS {

CVM_ISA_TARGET void requantize_transposed(const int32_t* x, int64_t positions, int64_t channels, int64_t n,
                                          int64_t begin, int64_t end, const int32_t* bias,
                                          const std::vector<RequantStep>& steps, int32_t* y, const ChannelSteps& per,
                                          bool per_position, const ChannelArrays& arrays) {
  body::requantize_transposed(x, positions, channels, n, begin, end, bias, steps, y, per, per_position, arrays);
}

#if CVM_ISA < 2
CVM_ISA_TARGET void requantize(const int32_t* x, int64_t begin, int64_t end, const int32_t* bias,
                               const int32_t* scales, int64_t channels, int64_t inner,
                               const std::vector<RequantStep>& steps, int32_t* y, const ChannelSteps& per) {
  body::requantize(x, begin, end, bias, scales, channels, inner, steps, y, per);
}

CVM_ISA_TARGET void requantize_rows(const int32_t* x, int64_t row, int64_t width, int64_t begin, int64_t end,
                                    const int32_t* bias, int64_t channels, int64_t rows_per_plane,
                                    const std::vector<RequantStep>& steps, int32_t* y) {
  body::requantize_rows(x, row, width, begin, end, bias, channels, rows_per_plane, steps, y);
}
#endif

}  // namespace cvm_onnx::CVM_ISA_NS
#endif
