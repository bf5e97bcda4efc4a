// The x86 features that decide which integer products onnxruntime computes exactly (cvm_onnx/native/cpu.py reads them
// through ctypes): CPUID, with the register state the OS enables (XGETBV), as onnxruntime's MLAS checks them.
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace {

enum Feature : uint32_t {
  kAvx2 = 1u << 0,
  kAvx512bw = 1u << 1,
  kAvx512Vnni = 1u << 2,
  kAvxVnni = 1u << 3,
  kAmxInt8 = 1u << 4,
};

#if defined(__x86_64__) || defined(__i386__)
uint64_t xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

uint32_t detect() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27)) || !(c & (1u << 28))) return 0;  // OSXSAVE, AVX
  const uint64_t state = xcr0();
  const bool ymm = (state & 0x6) == 0x6, zmm = (state & 0xE6) == 0xE6, tiles = (state & 0x60000) == 0x60000;
  if (!ymm || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  uint32_t f = 0;
  if (b & (1u << 5)) f |= kAvx2;
  if (zmm && (b & (1u << 16)) && (b & (1u << 30))) {  // AVX512F, AVX512BW
    f |= kAvx512bw;
    if (c & (1u << 11)) f |= kAvx512Vnni;
  }
  if (tiles && (d & (1u << 25))) f |= kAmxInt8;
  const unsigned leaves = a;
  if (leaves >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4))) f |= kAvxVnni;
  return f;
}
#else
uint32_t detect() { return 0; }
#endif

}  // namespace

extern "C" __attribute__((visibility("default"))) uint32_t cvm_onnx_cpu_features() { return detect(); }
