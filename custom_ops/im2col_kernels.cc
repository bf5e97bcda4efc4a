// ISA unit (isa.h): the padded copies and the rows of im2col.h for the ISA CVM_ISA (the baseline or AVX2).
#include "kernels.h"

#if CVM_ISA_UNIT
namespace cvm_onnx::CVM_ISA_NS {

CVM_ISA_TARGET int64_t pad_narrow(const int32_t* x, const Im2colShape& s, uint32_t offset, int64_t plane,
                                  uint8_t* xp) {
  return body::pad_narrow(x, s, offset, plane, xp);
}

CVM_ISA_TARGET int64_t pad_narrow_hwc(const int32_t* x, const Im2colShape& s, int32_t lo, int32_t hi,
                                      uint32_t offset, uint8_t fill, int64_t n, uint8_t* xp) {
  return body::pad_narrow_hwc(x, s, lo, hi, offset, fill, n, xp);
}

CVM_ISA_TARGET int64_t pad_narrow_nhwc(const int32_t* x, const Im2colShape& s, int32_t lo, int32_t hi,
                                       uint32_t offset, uint8_t fill, int64_t n, uint8_t* xp) {
  return body::pad_narrow_nhwc(x, s, lo, hi, offset, fill, n, xp);
}

CVM_ISA_TARGET void pad_copy_nhwc(const uint8_t* x, const Im2colShape& s, uint8_t fill, int64_t n, uint8_t* xp) {
  body::pad_copy_nhwc(x, s, fill, n, xp);
}

CVM_ISA_TARGET void im2col_rows(const uint8_t* xp, const Im2colShape& s, int64_t n, int64_t oh, uint8_t* rows) {
  body::im2col_rows(xp, s, n, oh, rows);
}

}  // namespace cvm_onnx::CVM_ISA_NS
#endif
