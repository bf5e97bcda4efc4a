// The products of a 3x3 convolution of stride 1, dilation 1 and one group by integer Winograd F(4x4, 3x3) on the
// AVX2 and AVX-512 VNNI routes (docs/custom_ops.md, Winograd): per tile of 4 x 4 output positions, the transformed
// window V = B^T d B (int16) times the scaled transformed filter U (int16) at each of the 6 x 6 points, summed over
// the channels by vpmaddwd or vpdpwssd into int32 with wrap-around (36 products where the direct form takes 144),
// then A^T (M * F2) A = 576 y modulo 2^32, times the inverse of 9 modulo 2^32 = 64 y, and y = (64 y) >> 6, exact
// while |y| < 2^25, which kWinogradMaxChannels keeps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "conv.h"
#include "isa.h"

namespace cvm_onnx {

// Channels C for which every sum of a window's products, |y| <= 9 * C * 255 * 128, lies below 2^25.
constexpr int64_t kWinogradMaxChannels = ((int64_t{1} << 25) - 1) / (9 * 255 * 128);

// The fewest channels for which the AVX2 kernels take the Winograd products (fewer run faster in the direct form).
constexpr int64_t kWinogradMinChannels = 16;

// The same for the AVX-512 VNNI kernel: its direct form's vpdpbusd multiplies 64 bytes an instruction, vpdpwssd 32
// pairs, and at 16 channels the transforms take what the 4x fewer products save.
constexpr int64_t kWinogradMinChannelsAvx512Vnni = 32;

// The widest output rows the Winograd products take (a band's transformed windows then stay within about 1 MB).
constexpr int64_t kWinogradMaxWidth = 512;

// Whether the convolution of geometry s (C channels, one group) takes the Winograd products.
inline bool winograd_applies(const Im2colShape& s) {
  return s.kh == 3 && s.kw == 3 && s.sh == 1 && s.sw == 1 && s.dh == 1 && s.dw == 1 && s.group == 1 &&
         s.c <= kWinogradMaxChannels;
}

// The point (i, j)'s factor F2 of the output transform (F1 * F2 = 576 / (s_i s_j)): 2 at (1|2, 5) and (5, 1|2), 4 at
// (5, 5), else 1; the rest of 576 / (s_i s_j), F1, is in U.
constexpr int kWinogradF2[6][6] = {{1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 2}, {1, 1, 1, 1, 1, 2},
                                   {1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1}, {1, 2, 2, 1, 1, 4}};

// The transformed filters of weights B (9 * C, OC) uint8 in the order (tap, c), read as g = B - 128 (int8):
// U = F1 * (G' g G'^T) for each (c, o), G' = S G = [[1,0,0],[-1,-1,-1],[-1,1,-1],[1,2,4],[1,-2,4],[0,0,1]] (S =
// diag(4, 6, 6, 24, 24, 1) clears the fractions of Winograd's G), F1 = 576 / (s_i s_j) / F2: |U| <= 21504, int16.
// u: per point x of the 6 x 6 (36), block of 16 output channels and pair of channels (C rounded up to c2, even,
// zero beyond C), the channels 0-7 then 8-15, each as (the even c, the odd c) int16 (the second operand of
// vpmaddwd); zero past OC.
struct WinogradWeights {
  int64_t c = 0, c2 = 0, oc = 0, blocks = 0;
  std::vector<int16_t> u;
};

inline WinogradWeights pack_winograd(const uint8_t* b, int64_t c, int64_t oc) {
  constexpr int kG[6][3] = {{1, 0, 0}, {-1, -1, -1}, {-1, 1, -1}, {1, 2, 4}, {1, -2, 4}, {0, 0, 1}};
  constexpr int kS[6] = {4, 6, 6, 24, 24, 1};
  WinogradWeights p;
  p.c = c, p.c2 = (c + 1) / 2 * 2, p.oc = oc, p.blocks = (oc + kBlockLanes - 1) / kBlockLanes;
  const int64_t pairs = p.c2 / 2;
  p.u.assign(static_cast<size_t>(36 * p.blocks * pairs * 32), 0);
  for (int64_t ci = 0; ci < c; ++ci) {
    for (int64_t o = 0; o < oc; ++o) {
      int32_t g[3][3], t[6][3];
      for (int64_t tap = 0; tap < 9; ++tap) {
        g[tap / 3][tap % 3] = static_cast<int32_t>(b[(tap * c + ci) * oc + o]) - 128;
      }
      for (int i = 0; i < 6; ++i) {  // t = G' g
        for (int j = 0; j < 3; ++j) t[i][j] = kG[i][0] * g[0][j] + kG[i][1] * g[1][j] + kG[i][2] * g[2][j];
      }
      for (int i = 0; i < 6; ++i) {  // U = F1 * (t G'^T)
        for (int j = 0; j < 6; ++j) {
          const int32_t f1 = 576 / (kS[i] * kS[j]) / kWinogradF2[i][j];
          const int32_t value = f1 * (t[i][0] * kG[j][0] + t[i][1] * kG[j][1] + t[i][2] * kG[j][2]);
          const int64_t at = (((i * 6 + j) * p.blocks + o / kBlockLanes) * pairs + ci / 2) * 32 +
                             (o % kBlockLanes) / 8 * 16 + o % 8 * 2 + ci % 2;
          p.u[static_cast<size_t>(at)] = static_cast<int16_t>(value);
        }
      }
    }
  }
  return p;
}

namespace isa_avx2 {
// The products of output rows [oh0, oh1) (oh0 a multiple of 4) of one image whose padded copy (HP, WP, C) is at
// xp (geometry s), c[((oh - oh0) * OW + ow) * OC + o] = init[o] + sum over the window of x * g, int32 with
// wrap-around (the same values as products()); winograd_kernels.cc.
void products_winograd(const uint8_t* xp, const Im2colShape& s, int64_t oh0, int64_t oh1, const WinogradWeights& p,
                       const int32_t* init, int32_t* c);
}  // namespace isa_avx2

namespace isa_avx512 {
// products_winograd on AVX-512 VNNI (vpdpwssd), the same values; with `end` (its chain set, OC a multiple of 16)
// each tile's rows requantized in registers (conv.h requantize_block) and written where `end` says, output row oh0's
// first position being `first` of the N * OH * OW, instead of c; winograd_kernels.cc's AVX-512 unit.
void products_winograd(const uint8_t* xp, const Im2colShape& s, int64_t oh0, int64_t oh1, const WinogradWeights& p,
                       const int32_t* init, int32_t* c, const TileEnd* end, int64_t first);
}  // namespace isa_avx512

#if defined(CVM_ONNX_X86_PRODUCTS)
namespace body {

constexpr int kWinogradRows = 6;  // tiles per register tile: 12 accumulators, 2 weights and a broadcast

// B^T d of six values d (int16 lanes or int32), B^T = [[4,0,-5,0,1,0],[0,-4,-4,1,1,0],[0,4,-4,-1,1,0],
// [0,-2,-1,2,1,0],[0,2,-1,-2,1,0],[0,4,0,-5,0,1]]: of values in [0, 255] within [-2040, 1275], then of those
// within [-17340, 17340], exact in int16.
template <typename T>
CVM_KERNEL_BODY void input_transform(const T (&d)[6], T (&r)[6]) {
  const T a = d[4] - 4 * d[2], b = d[3] - 4 * d[1], e = d[4] - d[2], f = 2 * (d[3] - d[1]);
  r[0] = 4 * d[0] - 5 * d[2] + d[4];
  r[1] = a + b, r[2] = a - b, r[3] = e + f, r[4] = e - f;
  r[5] = 4 * d[1] - 5 * d[3] + d[5];
}

// A^T m of six values m (uint32 lanes: wrap-around), A^T = [[1,1,1,1,1,0],[0,1,-1,2,-2,0],[0,1,1,4,4,0],
// [0,1,-1,8,-8,1]].
template <typename T>
CVM_KERNEL_BODY void output_transform(const T (&m)[6], T (&o)[4]) {
  const T a = m[1] + m[2], b = m[1] - m[2], e = m[3] + m[4], f = m[3] - m[4];
  o[0] = m[0] + a + e, o[1] = b + 2 * f, o[2] = a + 4 * e, o[3] = b + 8 * f + m[5];
}

using Int16Lanes = int16_t __attribute__((vector_size(32)));
using Uint32Lanes = uint32_t __attribute__((vector_size(32)));

// The transformed windows V = B^T d B of the tiles of output rows [4 * ty0, 4 * (ty0 + rows)), tile t = (ty - ty0)
// * tx + x, at v[(t * 36 + point) * c2 + c]: per row of tiles, B^T over its six rows of the padded copy (a strip of
// int16, each pixel's C channels at a stride of c2, zero beyond C), then B over each tile's six columns. Window rows
// and columns past the padded copy are read at its last row and column: they meet only outputs past the image (each
// output's sum is its own window's, whatever the others hold).
__attribute__((target("avx2"))) inline void winograd_inputs(const uint8_t* xp, const Im2colShape& s, int64_t ty0,
                                                            int64_t rows, int64_t tx, int64_t c2, int16_t* v) {
  const int64_t hp = s.hp(), wp = s.wp(), c = s.c, c16 = c / 16 * 16, width = 4 * tx + 2, line = width * c2;
  thread_local std::vector<int16_t> strip;
  if (strip.size() < static_cast<size_t>(6 * line)) strip.resize(static_cast<size_t>(6 * line));
  int16_t* r = strip.data();
  for (int64_t ty = 0; ty < rows; ++ty) {
    const uint8_t* d[6];
    for (int i = 0; i < 6; ++i) d[i] = xp + std::min(4 * (ty0 + ty) + i, hp - 1) * wp * c;
    for (int64_t col = 0; col < width; ++col) {
      const int64_t at = std::min(col, wp - 1) * c;
      for (int64_t ci = 0; ci < c16; ci += 16) {
        Int16Lanes in[6], out[6];
        for (int i = 0; i < 6; ++i) {
          in[i] = (Int16Lanes)_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d[i] + at + ci)));
        }
        input_transform(in, out);
        for (int i = 0; i < 6; ++i) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(r + i * line + col * c2 + ci), (__m256i)out[i]);
        }
      }
      for (int64_t ci = c16; ci < c2; ++ci) {
        int32_t in[6], out[6];
        for (int i = 0; i < 6; ++i) in[i] = ci < c ? d[i][at + ci] : 0;
        input_transform(in, out);
        for (int i = 0; i < 6; ++i) r[i * line + col * c2 + ci] = static_cast<int16_t>(out[i]);
      }
    }
    for (int64_t x = 0; x < tx; ++x) {
      int16_t* out = v + ((ty * tx + x) * 36) * c2;
      const int16_t* in = r + 4 * x * c2;
      for (int64_t ci = 0; ci < c16; ci += 16) {
        for (int i = 0; i < 6; ++i) {
          Int16Lanes a[6], b[6];
          for (int j = 0; j < 6; ++j) {
            a[j] = (Int16Lanes)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i * line + j * c2 + ci));
          }
          input_transform(a, b);
          for (int j = 0; j < 6; ++j) {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (6 * i + j) * c2 + ci), (__m256i)b[j]);
          }
        }
      }
      for (int64_t ci = c16; ci < c2; ++ci) {
        for (int i = 0; i < 6; ++i) {
          int32_t a[6], b[6];
          for (int j = 0; j < 6; ++j) a[j] = in[i * line + j * c2 + ci];
          input_transform(a, b);
          for (int j = 0; j < 6; ++j) out[(6 * i + j) * c2 + ci] = static_cast<int16_t>(b[j]);
        }
      }
    }
  }
}

// M = sum over the channel pairs of V U (vpmaddwd: |pair| <= 2 * 17340 * 21504 < 2^31, no saturation) for R
// tiles from t0 and one block of 16 channels, at m[(x * R + r) * 16 + lane], each point x.
template <int R>
__attribute__((target("avx2"))) void winograd_products(const int16_t* v, int64_t t0, const WinogradWeights& p,
                                                       int64_t block, int32_t* m) {
  const int64_t pairs = p.c2 / 2;
  for (int x = 0; x < 36; ++x) {
    const int16_t* w = p.u.data() + (x * p.blocks + block) * pairs * 32;
    const int16_t* a = v + (t0 * 36 + x) * p.c2;
    __m256i lo[R], hi[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
    for (int64_t q = 0; q < pairs; ++q) {
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + q * 32));
      const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + q * 32 + 16));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, a + r * 36 * p.c2 + 2 * q, sizeof pair);
        const __m256i b = _mm256_set1_epi32(pair);
        lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(b, w0));
        hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(b, w1));
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(m + (x * R + r) * 16), lo[r]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(m + (x * R + r) * 16 + 8), hi[r]);
    }
  }
}

// The products of the R tiles from t0 (tile t's first output at row y0 = oh0 + t / tx * 4, column x0 = t % tx * 4)
// for one block of 16 channels, written where they lie in c (the outputs past row oh1 or column OW not): M, then
// 576 y = A^T (M F2) A modulo 2^32, times the inverse of 9 modulo 2^32 (9 * 954437177 = 2^33 + 1): 64 y modulo
// 2^32, exactly 64 y while |y| < 2^25, then y = (64 y) >> 6 and the accumulators' start init added (wrapping).
template <int R>
__attribute__((target("avx2"))) void winograd_tiles(const int16_t* v, int64_t t0, int64_t tx, int64_t oh0,
                                                    int64_t oh1, int64_t ow, const WinogradWeights& p, int64_t block,
                                                    const int32_t* init, int32_t* c) {
  constexpr uint32_t kInverse9 = 954437177;
  alignas(32) int32_t m[36 * R * 16];
  winograd_products<R>(v, t0, p, block, m);
  int64_t y0 = oh0 + t0 / tx * 4, x0 = t0 % tx * 4;
  for (int r = 0; r < R; ++r) {
    for (int h = 0; h < 2; ++h) {  // channels 0-7, then 8-15 of the block
      const int64_t channel = block * kBlockLanes + 8 * h;
      const int n = static_cast<int>(std::clamp<int64_t>(p.oc - channel, 0, 8));
      if (n == 0) break;
      Uint32Lanes t[4][6];  // A^T (M F2): columns, then rows
#pragma GCC unroll 6
      for (int j = 0; j < 6; ++j) {
        Uint32Lanes col[6], out[4];
#pragma GCC unroll 6
        for (int i = 0; i < 6; ++i) {
          col[i] = (Uint32Lanes)_mm256_load_si256(reinterpret_cast<const __m256i*>(m + ((i * 6 + j) * R + r) * 16 +
                                                                                    8 * h)) *
                   static_cast<uint32_t>(kWinogradF2[i][j]);
        }
        output_transform(col, out);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) t[i][j] = out[i];
      }
      const Uint32Lanes start = (Uint32Lanes)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(init + channel));
      const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      const bool whole = n == 8 && y0 + 4 <= oh1 && x0 + 4 <= ow;
      int32_t* at = c + ((y0 - oh0) * ow + x0) * p.oc + channel;
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        Uint32Lanes y[4];
        output_transform(t[i], y);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const __m256i value = (__m256i)((Uint32Lanes)_mm256_srai_epi32((__m256i)(y[j] * kInverse9), 6) + start);
          if (whole) {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(at + (i * ow + j) * p.oc), value);
          } else if (y0 + i < oh1 && x0 + j < ow) {
            _mm256_maskstore_epi32(at + (i * ow + j) * p.oc, mask, value);
          }
        }
      }
    }
    if ((x0 += 4) >= 4 * tx) x0 = 0, y0 += 4;
  }
}

__attribute__((target("avx2"))) inline void products_winograd(const uint8_t* xp, const Im2colShape& s, int64_t oh0,
                                                              int64_t oh1, const WinogradWeights& p,
                                                              const int32_t* init, int32_t* c) {
  const int64_t ty0 = oh0 / 4, rows = (oh1 - oh0 + 3) / 4, tx = (s.ow + 3) / 4, tiles = rows * tx;
  thread_local std::vector<int16_t> v;
  if (v.size() < static_cast<size_t>(36 * tiles * p.c2)) v.resize(static_cast<size_t>(36 * tiles * p.c2));
  winograd_inputs(xp, s, ty0, rows, tx, p.c2, v.data());
  for (int64_t block = 0; block < p.blocks; ++block) {
    int64_t t0 = 0;
    for (; t0 + kWinogradRows <= tiles; t0 += kWinogradRows) {
      winograd_tiles<kWinogradRows>(v.data(), t0, tx, oh0, oh1, s.ow, p, block, init, c);
    }
    switch (tiles - t0) {  // the last tiles
      case 1: winograd_tiles<1>(v.data(), t0, tx, oh0, oh1, s.ow, p, block, init, c); break;
      case 2: winograd_tiles<2>(v.data(), t0, tx, oh0, oh1, s.ow, p, block, init, c); break;
      case 3: winograd_tiles<3>(v.data(), t0, tx, oh0, oh1, s.ow, p, block, init, c); break;
      case 4: winograd_tiles<4>(v.data(), t0, tx, oh0, oh1, s.ow, p, block, init, c); break;
      case 5: winograd_tiles<5>(v.data(), t0, tx, oh0, oh1, s.ow, p, block, init, c); break;
      default: break;
    }
  }
}


// acc += the sums of pairs of int16 products of w and the pair at a broadcast to each 32-bit lane (vpdpwssd, with
// wrap-around: no saturation), as assembly (conv.h's dot: GCC 12 copies accumulators around the intrinsic).
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) inline __m512i dot_pairs(__m512i acc,
                                                                                               __m512i w,
                                                                                               const int16_t* a) {
  asm("vpdpwssd %[a]%{1to16%}, %[w], %[acc]"
      : [acc] "+v"(acc)
      : [w] "v"(w), [a] "m"(*reinterpret_cast<const int32_t*>(a)));
  return acc;
}

using Uint32Lanes16 = uint32_t __attribute__((vector_size(64)));
using Int32Lanes16 = int32_t __attribute__((vector_size(64)));

// winograd_tiles on AVX-512 VNNI for `count` tiles (at most R; the products of the last repeated past it, not
// written) from t0 and NB blocks of 16 channels from block: M by vpdpwssd (|pair| < 2^31 as with vpmaddwd), then
// the output transform of 16 channels at a time, each tile row's values written to c, or with `end` requantized
// (isa_avx512::products_winograd).
template <int R, int NB>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void winograd_tiles_avx512(
    const int16_t* v, int64_t t0, int64_t count, int64_t tx, int64_t oh0, int64_t oh1, int64_t ow,
    const WinogradWeights& p, int64_t block, const int32_t* init, int32_t* c, const TileEnd* end, int64_t first) {
  constexpr uint32_t kInverse9 = 954437177;
  alignas(64) int32_t m[36 * NB * R * 16];
  const int64_t pairs = p.c2 / 2;
  const int16_t* a[R];
  for (int r = 0; r < R; ++r) a[r] = v + (t0 + std::min<int64_t>(r, count - 1)) * 36 * p.c2;
  for (int x = 0; x < 36; ++x) {
    const int16_t* w = p.u.data() + (x * p.blocks + block) * pairs * 32;
    __m512i acc[NB][R];
#pragma GCC unroll 32
    for (int i = 0; i < NB * R; ++i) acc[i / R][i % R] = _mm512_setzero_si512();
    for (int64_t q = 0; q < pairs; ++q) {
#pragma GCC unroll 4
      for (int b = 0; b < NB; ++b) {
        const __m512i wb = _mm512_loadu_si512(w + (b * pairs + q) * 32);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[b][r] = dot_pairs(acc[b][r], wb, a[r] + x * p.c2 + 2 * q);
      }
    }
#pragma GCC unroll 32
    for (int i = 0; i < NB * R; ++i) _mm512_store_si512(m + ((x * NB + i / R) * R + i % R) * 16, acc[i / R][i % R]);
  }
  for (int b = 0; b < NB; ++b) {
    const int64_t channel = (block + b) * kBlockLanes;
    const int n = static_cast<int>(std::min<int64_t>(p.oc - channel, 16));
    const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1);
    const Uint32Lanes16 start = (Uint32Lanes16)_mm512_maskz_loadu_epi32(mask, init + channel);
    int64_t y0 = oh0 + t0 / tx * 4, x0 = t0 % tx * 4;
    for (int r = 0; r < count; ++r) {
      Uint32Lanes16 t[4][6];  // A^T (M F2): columns, then rows
#pragma GCC unroll 6
      for (int j = 0; j < 6; ++j) {
        Uint32Lanes16 col[6], out[4];
#pragma GCC unroll 6
        for (int i = 0; i < 6; ++i) {
          col[i] = (Uint32Lanes16)_mm512_load_si512(m + (((i * 6 + j) * NB + b) * R + r) * 16) *
                   static_cast<uint32_t>(kWinogradF2[i][j]);
        }
        output_transform(col, out);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) t[i][j] = out[i];
      }
      const int valid = static_cast<int>(std::min<int64_t>(4, ow - x0));  // the tile's columns in the image
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        if (y0 + i >= oh1) break;
        Uint32Lanes16 y[4];
        Lanes value[4];
        output_transform(t[i], y);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) value[j] = (Lanes)((Uint32Lanes16)((Int32Lanes16)(y[j] * kInverse9) >> 6) + start);
        const int64_t position = (y0 - oh0 + i) * ow + x0;  // the row's first, from output row oh0's
        if (!end) {
          for (int j = 0; j < valid; ++j) {
            _mm512_mask_storeu_epi32(c + (position + j) * p.oc + channel, mask, (__m512i)value[j]);
          }
          continue;
        }
        const int32_t* bias[4] = {};  // each position's bias
        if (end->bias) {
          for (int j = 0; j < 4; ++j) bias[j] = end->bias + (first + position + j) % end->positions * p.oc;
        }
        if (valid == 4) {
          requantize_block<4, true>(value, *end, bias, p.oc, channel, first + position, 4);
        } else {
          requantize_block<4, false>(value, *end, bias, p.oc, channel, first + position, valid);
        }
      }
      if ((x0 += 4) >= 4 * tx) x0 = 0, y0 += 4;
    }
  }
}

constexpr int kWinogradTilesAvx512 = 4;   // R: 4 divides the tiles of a band of output rows 8, 16 or 32 wide
constexpr int kWinogradBlocksAvx512 = 4;  // NB: 16 accumulators

// products_winograd on AVX-512 VNNI with R tiles and NB blocks of 16 channels at a time (then one block at a time).
template <int R, int NB>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) inline void products_winograd_avx512(
    const uint8_t* xp, const Im2colShape& s, int64_t oh0, int64_t oh1, const WinogradWeights& p, const int32_t* init,
    int32_t* c, const TileEnd* end = nullptr, int64_t first = 0) {
  const int64_t ty0 = oh0 / 4, rows = (oh1 - oh0 + 3) / 4, tx = (s.ow + 3) / 4, tiles = rows * tx;
  thread_local std::vector<int16_t> v;
  if (v.size() < static_cast<size_t>(36 * tiles * p.c2)) v.resize(static_cast<size_t>(36 * tiles * p.c2));
  winograd_inputs(xp, s, ty0, rows, tx, p.c2, v.data());
  for (int64_t block = 0; block < p.blocks;) {
    const bool all = p.blocks - block >= NB;  // NB blocks at a time, then one
    for (int64_t t0 = 0; t0 < tiles; t0 += R) {
      const int64_t count = std::min<int64_t>(R, tiles - t0);
      if (all) {
        winograd_tiles_avx512<R, NB>(v.data(), t0, count, tx, oh0, oh1, s.ow, p, block, init, c, end, first);
      } else {
        winograd_tiles_avx512<R, 1>(v.data(), t0, count, tx, oh0, oh1, s.ow, p, block, init, c, end, first);
      }
    }
    block += all ? NB : 1;
  }
}

}  // namespace body
#endif

}  // namespace cvm_onnx
