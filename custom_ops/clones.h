// Kernels compiled for AVX2 and for the baseline, chosen when the library loads (GCC/Clang function
// multiversioning): the same integer operations in both, so the same results on every x86 CPU.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CVM_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CVM_AVX2_CLONES
#endif
