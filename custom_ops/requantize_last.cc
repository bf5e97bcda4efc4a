// ISA unit (isa.h): requantize_last for the ISA CVM_ISA, writing words (CVM_BYTES 0: y) or bytes (CVM_BYTES 1):
// each its own object, the body's other half gone with its null pointer.
#include "kernels.h"

#if CVM_ISA_UNIT
namespace cvm_onnx::CVM_ISA_NS {

#if CVM_BYTES
CVM_ISA_TARGET void requantize_last_bytes(const int32_t* x, int64_t begin, int64_t end, const int32_t* bias_all,
                                          const int32_t* scales, int64_t channels,
                                          const std::vector<RequantStep>& steps, int32_t*, int64_t positions,
                                          const ChannelSteps& per, const ChannelArrays& arrays, uint8_t* bytes,
                                          const Addend* addend) {
  body::requantize_last(x, begin, end, bias_all, scales, channels, steps, nullptr, positions, per, arrays, bytes,
                        addend);
}
#else
CVM_ISA_TARGET void requantize_last_words(const int32_t* x, int64_t begin, int64_t end, const int32_t* bias_all,
                                          const int32_t* scales, int64_t channels,
                                          const std::vector<RequantStep>& steps, int32_t* y, int64_t positions,
                                          const ChannelSteps& per, const ChannelArrays& arrays, uint8_t*,
                                          const Addend* addend) {
  body::requantize_last(x, begin, end, bias_all, scales, channels, steps, y, positions, per, arrays, nullptr,
                        addend);
}
#endif

}  // namespace cvm_onnx::CVM_ISA_NS
#endif
