// ISA unit (isa.h): the Winograd products of winograd.h on AVX2 (the AVX2 routes' 3x3 convolutions) and on AVX-512
// VNNI (vpdpwssd, in the AVX-512F unit with that target of its own).
#include "winograd.h"

#if CVM_ISA_UNIT && CVM_ISA == 1
namespace cvm_onnx::isa_avx2 {

CVM_ISA_TARGET void products_winograd(const uint8_t* xp, const Im2colShape& s, int64_t oh0, int64_t oh1,
                                      const WinogradWeights& p, const int32_t* init, int32_t* c) {
  body::products_winograd(xp, s, oh0, oh1, p, init, c);
}

}  // namespace cvm_onnx::isa_avx2
#endif

#if CVM_ISA_UNIT && CVM_ISA == 2
namespace cvm_onnx::isa_avx512 {

__attribute__((target("avx512f,avx512bw,avx512vnni"))) void products_winograd(
    const uint8_t* xp, const Im2colShape& s, int64_t oh0, int64_t oh1, const WinogradWeights& p, const int32_t* init,
    int32_t* c, const TileEnd* end, int64_t first) {
  body::products_winograd_avx512<body::kWinogradTilesAvx512, body::kWinogradBlocksAvx512>(xp, s, oh0, oh1, p, init,
                                                                                          c, end, first);
}

}  // namespace cvm_onnx::isa_avx512
#endif
