// ISA unit (isa.h): the Winograd products of winograd.h, AVX2 only (the AVX2 routes' 3x3 convolutions).
#include "winograd.h"

#if CVM_ISA_UNIT && CVM_ISA == 1
namespace cvm_onnx::isa_avx2 {

CVM_ISA_TARGET void products_winograd(const uint8_t* xp, const Im2colShape& s, int64_t oh0, int64_t oh1,
                                      const WinogradWeights& p, const int32_t* init, int32_t* c) {
  body::products_winograd(xp, s, oh0, oh1, p, init, c);
}

}  // namespace cvm_onnx::isa_avx2
#endif
