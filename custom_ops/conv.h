// A convolution's rows product and its requantization in one kernel (the serving form's conv_requantize ops on
// the CPU): tiles of output positions, each position's window read where it lies in the padded copy, multiplied by
// weights packed once, and requantized from the tile of int32 products, so that neither the rows nor the products
// go through memory (docs/custom_ops.md).
//
// Exact on every ISA: the products are uint8 x int8 summed into int32 without saturation (4-way byte dot
// products with VNNI, vpdpbusd; pairs of int16 products with AVX2, vpmaddwd, or for rows of values in [0, 127]
// pairs in int16 by vpmaddubsw, which the bound keeps from saturating; plain int32 arithmetic in the baseline),
// and every sum is the exact integer modulo 2^32 (docs/semantics.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CVM_ONNX_X86_PRODUCTS 1
#endif

#include "im2col.h"
#include "requantize.h"

extern "C" uint32_t cvm_onnx_cpu_features();

namespace cvm_onnx {

// Which kernel multiplies: the fastest the CPU has (0), or one asked for by name (the tests run each one here).
// kIsaAvx2Bytes takes rows of values in [0, 127] only (offset 0 without a zero point: bounded_rows).
enum ProductIsa : int64_t {
  kIsaBest = 0, kIsaBaseline = 1, kIsaAvx2 = 2, kIsaAvxVnni = 3, kIsaAvx512Vnni = 4, kIsaAvx2Bytes = 5
};

inline bool isa_available(int64_t isa) {
#if defined(CVM_ONNX_X86_PRODUCTS)
  const uint32_t f = cvm_onnx_cpu_features();  // bits of cpu_features.cc: 1 avx2, 4 avx512_vnni, 8 avx_vnni
  switch (isa) {
    case kIsaBaseline: return true;
    case kIsaAvx2:
    case kIsaAvx2Bytes: return f & 1u;
    case kIsaAvxVnni: return (f & 1u) && (f & 8u);
    case kIsaAvx512Vnni: return f & 4u;
    default: return false;
  }
#else
  return isa == kIsaBaseline;
#endif
}

// The fastest kernel here for rows of values in [0, 127] (`bounded`) or in [0, 255].
inline int64_t best_isa(bool bounded) {
  for (int64_t isa : {kIsaAvx512Vnni, kIsaAvxVnni, bounded ? kIsaAvx2Bytes : kIsaAvx2, kIsaAvx2}) {
    if (isa_available(isa)) return isa;
  }
  return kIsaBaseline;
}

constexpr int64_t kBlockLanes = 16;  // output channels per block of packed weights

// Weights B (K, OC) uint8, K = taps * C in the order (tap, c), read as w = B - 128 (int8), packed once: blocks of
// 16 output channels (the last filled up with zero weights), each tap's C channels rounded up to c4 (a multiple of
// 4, zero weights beyond C), k4 = taps * c4. `bytes`: per block and group of four k, [16 channels][4 k] int8, the
// second operand of a 4-way byte dot product per 32-bit lane (VNNI). `pairs`: the same weights as int16, per block
// and group of four k, [the even k, the odd k][16 channels][2 k] (vpmaddwd). `sums`: each channel's sum of w over K.
struct PackedWeights {
  int64_t k = 0, oc = 0, c4 = 0, k4 = 0, blocks = 0;
  std::vector<int8_t> bytes;
  std::vector<int16_t> pairs;
  std::vector<int32_t> sums;
};

inline PackedWeights pack_weights(const uint8_t* b, int64_t taps, int64_t c, int64_t oc) {
  PackedWeights p;
  p.k = taps * c, p.oc = oc, p.c4 = (c + 3) / 4 * 4, p.k4 = taps * p.c4;
  p.blocks = (oc + kBlockLanes - 1) / kBlockLanes;
  const size_t size = static_cast<size_t>(p.blocks * p.k4 * kBlockLanes);
  p.bytes.assign(size, 0);
  p.pairs.assign(size, 0);
  p.sums.assign(static_cast<size_t>(p.blocks * kBlockLanes), 0);
  for (int64_t k = 0; k < p.k; ++k) {
    const int64_t i = k / c * p.c4 + k % c;  // k's place among the k4
    for (int64_t o = 0; o < oc; ++o) {
      const int32_t w = static_cast<int32_t>(b[k * oc + o]) - 128;
      const int64_t block = o / kBlockLanes, lane = o % kBlockLanes, group = (block * p.k4 + i / 4 * 4) * kBlockLanes;
      p.bytes[static_cast<size_t>(group + lane * 4 + i % 4)] = static_cast<int8_t>(w);
      p.pairs[static_cast<size_t>(group + (i % 2) * 32 + lane * 2 + i % 4 / 2)] = static_cast<int16_t>(w);
      p.sums[static_cast<size_t>(o)] += w;
    }
  }
  return p;
}

// The kernels: c[r * oc + o] = init[o] + sum_k a[r][offsets[k / 4] + k % 4] * w[k, o] for the rows r < rows (a
// multiple of row_step), int32 with wrap-around (the exact sum wherever it lies in int32): row r's window read where
// it lies (each group of four k one 32-bit load), over the k4 (the bytes past each tap's C may hold anything: the
// weights are zero there). init holds blocks * 16 values.

// Baseline: plain int32 arithmetic.
inline void products_baseline(const uint8_t* const* a, const int32_t* offsets, int64_t rows, const PackedWeights& p,
                              const int32_t* init, int32_t* c) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < p.oc; ++o) {
      const int8_t* w = p.bytes.data() + (o / kBlockLanes) * p.k4 * kBlockLanes + (o % kBlockLanes) * 4;
      uint32_t sum = static_cast<uint32_t>(init[o]);
      for (int64_t i = 0; i < p.k4; ++i) {
        const int32_t x = a[r][offsets[i / 4] + i % 4];
        sum += static_cast<uint32_t>(x * w[i / 4 * 4 * kBlockLanes + i % 4]);
      }
      c[r * p.oc + o] = static_cast<int32_t>(sum);
    }
  }
}

// What follows the products where the AVX-512 VNNI kernel requantizes each tile as soon as it is multiplied
// (products_requantized): the bias per position and channel (positions, OC), added first (null: none, or in the
// accumulators' start), every channel's steps side by side (ChannelArrays, the channels a multiple of 16), the
// addend's (null: none), and y (N * positions, OC) as words or as bytes (the other null).
struct TileEnd {
  const int32_t* bias;
  int64_t positions;
  const ChannelArrays* chain;
  const Addend* addend;
  int32_t* words;
  uint8_t* bytes;
};

#if defined(CVM_ONNX_X86_PRODUCTS)
inline int32_t four_bytes(const uint8_t* a) {
  int32_t v;
  std::memcpy(&v, a, sizeof v);
  return v;
}

// acc += the 4-way dot products of a (uint8) and w (int8) in each 32-bit lane (vpdpbusd), as assembly: with the
// intrinsic GCC 12 copies every accumulator to another register and back around each product (3x the instructions).
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) inline __m512i dot(__m512i acc, __m512i a,
                                                                                         __m512i w) {
  asm("vpdpbusd %[w], %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [w] "v"(w));
  return acc;
}

// The same on 256 bits with the VEX encoding of AVX-VNNI (an EVEX one would need AVX-512); assembly needs no target
// option, so the AVX2 kernels share their code with it.
__attribute__((target("avx2"), always_inline)) inline __m256i dot(__m256i acc, __m256i a, __m256i w) {
  asm("%{vex%} vpdpbusd %[w], %[a], %[acc]" : [acc] "+x"(acc) : [a] "x"(a), [w] "x"(w));
  return acc;
}

// R rows x NB blocks of 16 channels, AVX-512 VNNI: per group of four k, one broadcast of each row's four bytes and
// one vpdpbusd per (row, block) (uint8 x int8, four products added into each int32 lane, no saturation).
template <int R, int NB>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void tile_avx512vnni(const uint8_t* const* a,
                                                                             const int32_t* offsets,
                                                                             const int8_t* w, int64_t block_stride,
                                                                             int64_t groups, const int32_t* init,
                                                                             int32_t* c, int64_t ldc, int lanes) {
  __m512i acc[R][NB];
#pragma GCC unroll 16
  for (int j = 0; j < NB; ++j) {
    const __m512i start = _mm512_loadu_si512(init + j * kBlockLanes);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r][j] = start;
  }
  for (int64_t q = 0; q < groups; ++q) {
    __m512i wv[NB];
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_si512(w + j * block_stride + q * 64);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i av = _mm512_set1_epi32(four_bytes(a[r] + offsets[q]));
#pragma GCC unroll 16
      for (int j = 0; j < NB; ++j) acc[r][j] = dot(acc[r][j], av, wv[j]);
    }
  }
  // a masked store only where the last block is partial (the requantization reads these values straight back, and
  // store-to-load forwarding may not work from a masked store)
  const __mmask16 last = static_cast<__mmask16>((1u << lanes) - 1);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) {
      if (j < NB - 1 || lanes == kBlockLanes) {
        _mm512_storeu_si512(c + r * ldc + j * kBlockLanes, acc[r][j]);
      } else {
        _mm512_mask_storeu_epi32(c + r * ldc + j * kBlockLanes, last, acc[r][j]);
      }
    }
  }
}

template <int R, int NB>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void rows_avx512vnni(const uint8_t* const* a,
                                                                             const int32_t* offsets,
                                                                             int64_t rows, const PackedWeights& p,
                                                                             int64_t block, const int32_t* init,
                                                                             int32_t* c) {
  const int lanes = static_cast<int>(std::min<int64_t>(kBlockLanes, p.oc - (block + NB - 1) * kBlockLanes));
  const int8_t* w = p.bytes.data() + block * p.k4 * kBlockLanes;
  for (int64_t r = 0; r < rows; r += R) {
    tile_avx512vnni<R, NB>(a + r, offsets, w, p.k4 * kBlockLanes, p.k4 / 4, init + block * kBlockLanes,
                           c + r * p.oc + block * kBlockLanes, p.oc, lanes);
  }
}

// Up to four blocks at a time, R rows (dividing 24) whose accumulators fit AVX-512's 32 registers and whose window
// pointers fit the general registers (12 rows of one block spill them).
inline void products_avx512vnni(const uint8_t* const* a, const int32_t* offsets, int64_t rows, const PackedWeights& p,
                                const int32_t* init, int32_t* c) {
  for (int64_t block = 0; block < p.blocks; block += 4) {
    switch (std::min<int64_t>(4, p.blocks - block)) {
      case 1: rows_avx512vnni<6, 1>(a, offsets, rows, p, block, init, c); break;
      case 2: rows_avx512vnni<8, 2>(a, offsets, rows, p, block, init, c); break;
      case 3: rows_avx512vnni<6, 3>(a, offsets, rows, p, block, init, c); break;
      default: rows_avx512vnni<6, 4>(a, offsets, rows, p, block, init, c);
    }
  }
}

// The requantization of R rows of one block of 16 channels (y, the int32 products) in registers, then written from
// the position `first` on (TileEnd): row r's bias (at bias[r] + channel; TileEnd's bias null: none) added, each step
// of the chain on the R rows at once with its channels' constants, then the addend's (its steps, the sum, the steps
// after): the same lane arithmetic as requantize_last's (array_step); only the rows [0, valid) are read from the
// bias and the addend and written (Full: valid is R).
template <int R, bool Full>
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) inline void requantize_block(
    Lanes (&y)[R], const TileEnd& end, const int32_t* const (&bias)[R], int64_t oc, int64_t channel, int64_t first,
    int valid) {
  if (end.bias) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      if (Full || r < valid) y[r] = (Lanes)((ULanes)y[r] + (ULanes)load_lanes(bias[r] + channel));
    }
  }
  const ChannelArrays& p = *end.chain;
  const int32_t* a = p.a.data() + channel;  // channel c's constants of step k at k * period + c
  const int32_t* b = p.b.data() + channel;
  for (const int64_t kind : p.kinds) {
    const Lanes ca = load_lanes(a), cb = load_lanes(b);
    switch (kind) {
      case kShift: tile_step<kShift, R>(y, ca, cb); break;
      case kMul: tile_step<kMul, R>(y, ca, cb); break;
      case kAdd: tile_step<kAdd, R>(y, ca, cb); break;
      case kMul64: tile_step<kMul64, R>(y, ca, cb); break;
      case kEven: tile_step<kEven, R>(y, ca, cb); break;
      case kMul64Narrow: tile_step<kMul64Narrow, R>(y, ca, cb); break;
      case kMul64Narrow2: tile_step<kMul64Narrow2, R>(y, ca, cb); break;
      default: tile_step<kClip, R>(y, ca, cb);
    }
    a += p.period;
    b += p.period;
  }
  const int64_t at = first * oc + channel;  // row r's 16 values at at + r * oc
  if (const Addend* addend = end.addend) {
    Lanes z[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      if (!Full && r >= valid) {
        z[r] = Lanes{};
      } else if (addend->x) {
        z[r] = load_lanes(addend->x + at + r * oc);
      } else {
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(addend->bytes + at + r * oc));
        z[r] = (Lanes)_mm512_maskz_cvtepu8_epi32(static_cast<__mmask16>(0xffff), bytes);  // (vpmovzxbd)
      }
    }
    tile_steps<R>(z, addend->steps);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) y[r] = (Lanes)((ULanes)y[r] + (ULanes)z[r]);
    tile_steps<R>(y, addend->after);
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    if (!Full && r >= valid) break;
    if (end.bytes) {
      store_lanes(y[r], end.bytes, at + r * oc);
    } else {
      store_lanes(y[r], end.words, at + r * oc);
    }
  }
}

// rows_avx512vnni with each tile requantized as soon as it is stored (requantize_block), from a tile of its own that
// stays in the cache: the rows [0, count) of the positions from `first` on, the tiles past them skipped.
template <int R, int NB>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void rows_avx512vnni_requantized(
    const uint8_t* const* a, const int32_t* offsets, int64_t count, const PackedWeights& p, int64_t block,
    const int32_t* init, const TileEnd& end, int64_t first) {
  constexpr int64_t ldc = NB * kBlockLanes;
  alignas(64) int32_t acc[R * ldc];
  const int8_t* w = p.bytes.data() + block * p.k4 * kBlockLanes;
  int64_t position = end.bias ? first % end.positions : 0;  // the tile's first row's (with a bias per position)
  for (int64_t r = 0; r < count; r += R) {
    tile_avx512vnni<R, NB>(a + r, offsets, w, p.k4 * kBlockLanes, p.k4 / 4, init + block * kBlockLanes, acc, ldc,
                           kBlockLanes);
    const int valid = static_cast<int>(std::min<int64_t>(R, count - r));
    const int32_t* bias[R] = {};  // each row's bias per position
    if (end.bias) {
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) {
        bias[i] = end.bias + position * p.oc;
        for (++position; position >= end.positions;) position -= end.positions;
      }
    }
#pragma GCC unroll 16
    for (int j = 0; j < NB; ++j) {
      Lanes y[R];
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) y[i] = load_lanes(acc + i * ldc + j * kBlockLanes);
      if (valid == R) {
        requantize_block<R, true>(y, end, bias, p.oc, (block + j) * kBlockLanes, first + r, valid);
      } else {
        requantize_block<R, false>(y, end, bias, p.oc, (block + j) * kBlockLanes, first + r, valid);
      }
    }
  }
}

// products_avx512vnni, each tile requantized as soon as it is multiplied (products_requantized; p.oc a multiple of
// 16).
inline void products_avx512vnni_requantized(const uint8_t* const* a, const int32_t* offsets, int64_t count,
                                            const PackedWeights& p, const int32_t* init, const TileEnd& end,
                                            int64_t first) {
  for (int64_t block = 0; block < p.blocks; block += 4) {
    switch (std::min<int64_t>(4, p.blocks - block)) {
      case 1: rows_avx512vnni_requantized<6, 1>(a, offsets, count, p, block, init, end, first); break;
      case 2: rows_avx512vnni_requantized<8, 2>(a, offsets, count, p, block, init, end, first); break;
      case 3: rows_avx512vnni_requantized<6, 3>(a, offsets, count, p, block, init, end, first); break;
      default: rows_avx512vnni_requantized<6, 4>(a, offsets, count, p, block, init, end, first);
    }
  }
}

// Stores 16 int32 lanes (two vectors of 8) at c, the first `lanes` only.
__attribute__((target("avx2"))) inline void store_lanes(int32_t* c, __m256i lo, __m256i hi, int lanes) {
  if (lanes == kBlockLanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + 8), hi);
    return;
  }
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  _mm256_maskstore_epi32(c, _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes), index), lo);
  _mm256_maskstore_epi32(c + 8, _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes - 8), index), hi);
}

// acc += the 4-way dot products of a (uint8, each in [0, 127]) and w (int8) in each 32-bit lane, AVX2: vpmaddubsw
// sums pairs of products into int16 with saturation, which the bound keeps from acting (|pair| <= 2 * 127 * 128 =
// 32512), then vpmaddwd sums pairs of those into int32.
__attribute__((target("avx2"), always_inline)) inline __m256i bytes_dot(__m256i acc, __m256i a, __m256i w) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, w), _mm256_set1_epi16(1)));
}

// R rows x one block of 16 channels (two vectors of 8), per group of four k: AVX-VNNI's vpdpbusd on 256 bits
// (kIsaAvxVnni) or AVX2's bytes_dot (kIsaAvx2Bytes: rows of values in [0, 127]) with the packed bytes, or (kIsaAvx2)
// each row's four bytes as two pairs of int16, bytes (k, k+2) and (k+1, k+3), vpmaddwd with the packed int16 pairs
// (two products summed into int32: |sum| <= 2 * 255 * 128, no saturation). R keeps the accumulators and the
// temporaries within AVX2's 16 registers (the weights read from memory as operands).
template <int64_t Isa, int R>
__attribute__((target("avx2"))) void tile_256(const uint8_t* const* a, const int32_t* offsets, const PackedWeights& p,
                                                int64_t block, const int32_t* init, int32_t* c, int64_t ldc,
                                                int lanes) {
  const int8_t* bytes = p.bytes.data() + block * p.k4 * kBlockLanes;
  const int16_t* pairs = p.pairs.data() + block * p.k4 * kBlockLanes;
  __m256i lo[R], hi[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    lo[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(init));
    hi[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(init + 8));
  }
  const __m256i even = _mm256_set1_epi32(0x00ff00ff);  // bytes 0 and 2 of each lane's four as two int16
  for (int64_t q = 0, groups = p.k4 / 4; q < groups; ++q) {
    const __m256i* at = reinterpret_cast<const __m256i*>(Isa == kIsaAvx2 ? static_cast<const void*>(pairs + q * 64)
                                                                         : static_cast<const void*>(bytes + q * 64));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256i v = _mm256_set1_epi32(four_bytes(a[r] + offsets[q]));
      if constexpr (Isa == kIsaAvx2) {  // at: (even k, channels 0-7 or 8-15), then the odd k, 16 int16 each
        const __m256i p0 = _mm256_and_si256(v, even), p1 = _mm256_srli_epi16(v, 8);
        lo[r] = _mm256_add_epi32(lo[r], _mm256_add_epi32(_mm256_madd_epi16(p0, _mm256_loadu_si256(at)),
                                                         _mm256_madd_epi16(p1, _mm256_loadu_si256(at + 2))));
        hi[r] = _mm256_add_epi32(hi[r], _mm256_add_epi32(_mm256_madd_epi16(p0, _mm256_loadu_si256(at + 1)),
                                                         _mm256_madd_epi16(p1, _mm256_loadu_si256(at + 3))));
      } else if constexpr (Isa == kIsaAvxVnni) {  // at: channels 0-7, then 8-15, four bytes each
        lo[r] = dot(lo[r], v, _mm256_loadu_si256(at));
        hi[r] = dot(hi[r], v, _mm256_loadu_si256(at + 1));
      } else {
        lo[r] = bytes_dot(lo[r], v, _mm256_loadu_si256(at));
        hi[r] = bytes_dot(hi[r], v, _mm256_loadu_si256(at + 1));
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) store_lanes(c + r * ldc, lo[r], hi[r], lanes);
}

// One block of 16 channels and R rows at a time (4 for the pairs, 6 otherwise), with the kernel of `Isa` (AVX-VNNI,
// AVX2 bytes or pairs).
template <int64_t Isa>
void products_avx2(const uint8_t* const* a, const int32_t* offsets, int64_t rows, const PackedWeights& p,
                   const int32_t* init, int32_t* c) {
  constexpr int R = Isa == kIsaAvx2 ? 4 : 6;
  for (int64_t block = 0; block < p.blocks; ++block) {
    const int lanes = static_cast<int>(std::min<int64_t>(kBlockLanes, p.oc - block * kBlockLanes));
    for (int64_t r = 0; r < rows; r += R) {
      tile_256<Isa, R>(a + r, offsets, p, block, init + block * kBlockLanes, c + r * p.oc + block * kBlockLanes,
                       p.oc, lanes);
    }
  }
}
#endif

// The products of `rows` rows (a multiple of row_step) with the kernel of `isa` (available here), products.cc.
void products(int64_t isa, const uint8_t* const* a, const int32_t* offsets, int64_t rows, const PackedWeights& p,
              const int32_t* init, int32_t* c);

// The products of the positions [first, first + count) (rows of a from position `first` on, as many as row_step
// rounds count up to) with the AVX-512 VNNI kernel (available here), each tile of 6 or 8 rows requantized as soon as
// it is multiplied, in registers, and written (TileEnd), products.cc: no tile of up to 96 positions' int32 products
// stored for requantize_last, and its requantization overlaps the next tile's products.
void products_requantized(const uint8_t* const* a, const int32_t* offsets, int64_t count, const PackedWeights& p,
                          const int32_t* init, const TileEnd& end, int64_t first);

constexpr int64_t kTileRows = 24;  // a tile's positions are a multiple of this (but the last): every R divides it

// The rows the kernel of `isa` takes at a time for the weights p (a multiple of every R its tiles of p run; each
// divides kTileRows): a tile's last positions are rounded up to it, not to kTileRows.
inline int64_t row_step(int64_t isa, const PackedWeights& p) {
  switch (isa) {
    case kIsaAvx512Vnni:  // R 6, or 8 for the last two blocks (products_avx512vnni)
      return p.blocks % 4 != 2 ? 6 : p.blocks == 2 ? 8 : 24;
    case kIsaAvx2: return 4;
    case kIsaAvxVnni:
    case kIsaAvx2Bytes: return 6;
    default: return 1;
  }
}

// Positions per tile: as many multiples of 24 as keep its rows (k4 bytes each) within 16 KB, at least 24, at most 96.
inline int64_t tile_positions(int64_t k4) { return std::clamp<int64_t>(16384 / k4 / kTileRows, 1, 4) * kTileRows; }

// A batch of at least this many images per CPU the process may run on (the most threads a session takes) is split
// over the threads by image (each padded by the task that multiplies it, into its thread's own copy, which its tiles
// then read from the cache); a smaller one by tiles of positions over one padded copy of the batch, so that every
// thread finds work.
constexpr int64_t kImagesPerCpu = 4;

// Bytes of the padded copy after its last image that a window's last group of four may read (window_offsets).
constexpr int64_t kPaddedSlack = 3;

// The offset of each group of four k from a position's first byte in the padded copy, (fh * dh * WP + fw * dw) * C
// + c for c < c4 in steps of 4, in out: one 32-bit load each. Where C is not a multiple of 4, a tap's last group
// reads the next pixel's first bytes (or, past the last image, up to kPaddedSlack bytes), which meet zero
// weights (pack_weights).
inline void window_offsets(const Im2colShape& s, int64_t c4, std::vector<int32_t>& out) {
  out.clear();
  for (int64_t fh = 0; fh < s.kh; ++fh) {
    for (int64_t fw = 0; fw < s.kw; ++fw) {
      const int64_t tap = (fh * s.dh * s.wp() + fw * s.dw) * s.c;
      for (int64_t c = 0; c < c4; c += 4) out.push_back(static_cast<int32_t>(tap + c));
    }
  }
}

// The first byte of the windows of the positions [first, first + count) (global: image g / (OH * OW)) in the
// padded copy xp, at[0:rows]; the rows past count repeat the last (their products are not read).
inline void window_starts(const uint8_t* xp, const Im2colShape& s, int64_t first, int64_t count, int64_t rows,
                          const uint8_t** at) {
  const int64_t positions = s.oh * s.ow, image = s.hp() * s.wp() * s.c, row = s.sh * s.wp() * s.c, step = s.sw * s.c;
  const int64_t n = first / positions;
  int64_t oh = first % positions / s.ow;
  int64_t ow = first % s.ow;
  const uint8_t* line = xp + n * image + oh * row;  // output row oh's windows (the next image's follow on)
  for (int64_t i = 0; i < count; ++i) {
    at[i] = line + ow * step;
    if (++ow == s.ow) {
      ow = 0;
      line += oh + 1 == s.oh ? image - oh * row : row;
      oh = oh + 1 == s.oh ? 0 : oh + 1;
    }
  }
  std::fill(at + count, at + rows, at[count - 1]);
}

}  // namespace cvm_onnx
