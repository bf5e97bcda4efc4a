// Each kernel of kernels.h for this CPU, chosen once when the library loads: AVX-512F, then AVX2, then the
// baseline, by the CPU's features and the OS's support of their registers (__builtin_cpu_supports, as GCC's
// target_clones chooses).
#include "kernels.h"

namespace cvm_onnx {

#if defined(CVM_ONNX_X86_ISAS)
namespace {

// The version for this CPU among an AVX2 one, the baseline and an AVX-512F one (null: none).
template <typename F>
F* pick(F* avx2, F* baseline, F* avx512 = nullptr) {
  __builtin_cpu_init();
  if (avx512 && __builtin_cpu_supports("avx512f")) return avx512;
  return __builtin_cpu_supports("avx2") ? avx2 : baseline;
}

}  // namespace

#define CVM_ONNX_CHOSEN(name) pick(isa_avx2::name, isa_baseline::name)
#define CVM_ONNX_CHOSEN512(name) pick(isa_avx2::name, isa_baseline::name, isa_avx512::name)
#else
#define CVM_ONNX_CHOSEN(name) isa_baseline::name
#define CVM_ONNX_CHOSEN512(name) isa_baseline::name
#endif

RequantizeFn* const requantize = CVM_ONNX_CHOSEN(requantize);
RequantizeRowsFn* const requantize_rows = CVM_ONNX_CHOSEN(requantize_rows);
RequantizeLastFn* const requantize_last_words = CVM_ONNX_CHOSEN512(requantize_last_words);
RequantizeLastFn* const requantize_last_bytes = CVM_ONNX_CHOSEN512(requantize_last_bytes);
RequantizeTransposedFn* const requantize_transposed = CVM_ONNX_CHOSEN512(requantize_transposed);
PadNarrowFn* const pad_narrow = CVM_ONNX_CHOSEN(pad_narrow);
PadNarrowHwcFn* const pad_narrow_hwc = CVM_ONNX_CHOSEN(pad_narrow_hwc);
PadNarrowHwcFn* const pad_narrow_nhwc = CVM_ONNX_CHOSEN(pad_narrow_nhwc);
PadCopyNhwcFn* const pad_copy_nhwc = CVM_ONNX_CHOSEN(pad_copy_nhwc);
Im2colRowsFn* const im2col_rows = CVM_ONNX_CHOSEN(im2col_rows);
#undef CVM_ONNX_CHOSEN
#undef CVM_ONNX_CHOSEN512

}  // namespace cvm_onnx
