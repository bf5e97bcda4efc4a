// Kernels compiled for several x86 ISAs, chosen when the library loads (GCC/Clang function multiversioning): the
// same integer operations in each, so the same results on every x86 CPU.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CVM_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
// The requantize kernels also for AVX-512 (their 16-lane vectors in one register; CPUs with AVX-512 only: its 32-bit lane operations are AVX512F).
#define CVM_AVX512_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CVM_AVX2_CLONES
#define CVM_AVX512_CLONES
#endif
