// The convolution's products (conv.h): each ISA's kernel instances, compiled in a unit of their own.
#include "conv.h"

namespace cvm_onnx {

void products(int64_t isa, const uint8_t* const* a, const int32_t* offsets, int64_t rows, const PackedWeights& p,
              const int32_t* init, int32_t* c) {
#if defined(CVM_ONNX_X86_PRODUCTS)
  switch (isa) {
    case kIsaAvx512Vnni: return products_avx512vnni(a, offsets, rows, p, init, c);
    case kIsaAvxVnni: return products_avx2<kIsaAvxVnni>(a, offsets, rows, p, init, c);
    case kIsaAvx2Bytes: return products_avx2<kIsaAvx2Bytes>(a, offsets, rows, p, init, c);
    case kIsaAvx2: return products_avx2<kIsaAvx2>(a, offsets, rows, p, init, c);
    default: break;
  }
#endif
  products_baseline(a, offsets, rows, p, init, c);
}

void products_requantized(const uint8_t* const* a, const int32_t* offsets, int64_t count, const PackedWeights& p,
                          const int32_t* init, const TileEnd& end, int64_t first) {
#if defined(CVM_ONNX_X86_PRODUCTS)
  products_avx512vnni_requantized(a, offsets, count, p, init, end, first);
#endif
}

}  // namespace cvm_onnx
