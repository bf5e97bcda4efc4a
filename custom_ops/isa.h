// Kernels compiled once per x86 ISA and chosen when the library loads (kernels.h): the same integer operations in
// each, so the same results on every x86 CPU. A kernel's body (namespace body, CVM_KERNEL_BODY: always inlined) is
// in its header; an ISA unit, a source compiled once per ISA with CVM_ISA (0 baseline, 1 AVX2, 2 AVX-512F; see
// CMakeLists.txt), defines the kernel around its body in namespace CVM_ISA_NS with that ISA's target attribute,
// which the inlined body's code takes (as a target_clones clone would, each clone here in its own object).
#pragma once

#define CVM_KERNEL_BODY __attribute__((always_inline)) inline

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CVM_ONNX_X86_ISAS 1
#endif

#if defined(CVM_ISA)
#if CVM_ISA == 2
#define CVM_ISA_NS isa_avx512
#define CVM_ISA_TARGET __attribute__((target("avx512f")))
#elif CVM_ISA == 1
#define CVM_ISA_NS isa_avx2
#define CVM_ISA_TARGET __attribute__((target("avx2")))
#else
#define CVM_ISA_NS isa_baseline
#define CVM_ISA_TARGET
#endif
// An ISA unit defines its kernels where this is 1 (an x86 ISA's unit is empty elsewhere).
#if CVM_ISA == 0 || defined(CVM_ONNX_X86_ISAS)
#define CVM_ISA_UNIT 1
#else
#define CVM_ISA_UNIT 0
#endif
#endif
