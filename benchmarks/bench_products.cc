// The products of ResNet-20's 3x3 layers (C -> C channels, padding 1: 16 at 32 x 32, 32 at 16 x 16, 64 at 8 x 8;
// batch 1 and 64) on the AVX2 kernels: the direct form (conv.h products_avx2, vpmaddwd pairs and vpmaddubsw bytes)
// against the Winograd products (winograd.h, transforms included), each checked equal to the direct pairs' first,
// then timed in alternated rounds (the best of 5, per-thread CPU time: the figure that holds on a shared machine).
// On a CPU with AVX-512 VNNI also the direct VNNI kernel (conv.h products_avx512vnni, vpdpbusd) against the AVX-512
// Winograd products (vpdpwssd) with R tiles and NB blocks of 16 channels per register tile (the library takes R 4,
// NB 4), each checked equal too; `./bench_products avx512` times only those.
// Build and run from the repository root (x86-64 with AVX2):
//   g++ -O3 -std=c++17 -Wno-psabi -DCVM_ISA=1 -Icustom_ops benchmarks/bench_products.cc
//       custom_ops/winograd_kernels.cc custom_ops/cpu_features.cc -o bench_products && ./bench_products
// (one line)
#include <time.h>

#include <cstdio>
#include <random>
#include <string>

#include "winograd.h"

using namespace cvm_onnx;

static double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char** argv) {
  const bool avx512 = cvm_onnx_cpu_features() & 4u, only512 = argc > 1 && std::string(argv[1]) == "avx512";
  std::mt19937 rng(1);
  for (int64_t batch : {1, 64}) {
    for (auto [c, size] : {std::pair<int64_t, int64_t>{16, 32}, {32, 16}, {64, 8}}) {
      Im2colShape s;
      s.n = batch, s.c = c, s.h = s.w = size, s.kh = s.kw = 3, s.pt = s.pl = s.pb = s.pr = 1;
      im2col_geometry(s);
      const int64_t oc = c, positions = s.oh * s.ow, image = s.hp() * s.wp() * c;
      std::vector<uint8_t> b(static_cast<size_t>(9 * c * oc)), xp(static_cast<size_t>(batch * image + kPaddedSlack));
      for (auto& v : b) v = static_cast<uint8_t>(rng());
      for (auto& v : xp) v = rng() & 127;  // rows in [0, 127]: both direct kernels take them
      const PackedWeights pw = pack_weights(b.data(), 9, c, oc);
      const WinogradWeights ww = pack_winograd(b.data(), c, oc);
      std::vector<int32_t> init(pw.sums.size()), offsets;
      for (auto& v : init) v = static_cast<int32_t>(rng());
      window_offsets(s, pw.c4, offsets);
      const int64_t tile = tile_positions(pw.k4), band = std::max<int64_t>(1, 24 / ((s.ow + 3) / 4)) * 4;
      std::vector<const uint8_t*> at(static_cast<size_t>(tile + kTileRows));
      std::vector<int32_t> all(static_cast<size_t>(batch * positions * oc)), buffer(all.size());
      // the direct kernel Isa over every tile of positions (into `out`, else a tile's buffer)
      auto direct = [&](auto isa, int32_t* out) {
        const int64_t step = row_step(isa.value, pw);
        for (int64_t n = 0; n < batch; ++n) {
          for (int64_t first = 0; first < positions; first += tile) {
            const int64_t count = std::min(tile, positions - first), rows = (count + step - 1) / step * step;
            window_starts(xp.data() + n * image, s, first, count, rows, at.data());
            int32_t* to = out ? out + (n * positions + first) * oc : buffer.data();
            int32_t* into = !out || rows == count ? to : buffer.data();
            if constexpr (decltype(isa)::value == kIsaAvx512Vnni) {
              products_avx512vnni(at.data(), offsets.data(), rows, pw, init.data(), into);
            } else {
              products_avx2<decltype(isa)::value>(at.data(), offsets.data(), rows, pw, init.data(), into);
            }
            if (into != to) std::copy(buffer.begin(), buffer.begin() + count * oc, to);
          }
        }
      };
      auto winograd = [&](int32_t* out) {
        for (int64_t n = 0; n < batch; ++n) {
          for (int64_t oh0 = 0; oh0 < s.oh; oh0 += band) {
            isa_avx2::products_winograd(xp.data() + n * image, s, oh0, std::min(oh0 + band, s.oh), ww, init.data(),
                                        out ? out + (n * positions + oh0 * s.ow) * oc : buffer.data());
          }
        }
      };
      // the AVX-512 VNNI Winograd products with R tiles and NB blocks of 16 channels per register tile
      auto winograd512 = [&](auto r, auto nb, int32_t* out) {
        for (int64_t n = 0; n < batch; ++n) {
          for (int64_t oh0 = 0; oh0 < s.oh; oh0 += band) {
            body::products_winograd_avx512<decltype(r)::value, decltype(nb)::value>(
                xp.data() + n * image, s, oh0, std::min(oh0 + band, s.oh), ww, init.data(),
                out ? out + (n * positions + oh0 * s.ow) * oc : buffer.data());
          }
        }
      };
      using Pairs = std::integral_constant<int64_t, kIsaAvx2>;
      using Bytes = std::integral_constant<int64_t, kIsaAvx2Bytes>;
      std::vector<int32_t> want(all.size());
      direct(Pairs{}, want.data());
      direct(Bytes{}, all.data());
      const bool bytes_equal = all == want;
      winograd(all.data());
      const bool winograd_equal = all == want;
      double best[3] = {1e9, 1e9, 1e9};
      const int runs = batch == 1 ? 200 : 8;
      for (int round = 0; round < (only512 ? 0 : 5); ++round) {
        for (int k = 0; k < 3; ++k) {
          const double t = cpu_seconds();
          for (int i = 0; i < runs; ++i) {
            if (k == 0) direct(Pairs{}, nullptr);
            if (k == 1) direct(Bytes{}, nullptr);
            if (k == 2) winograd(nullptr);
          }
          best[k] = std::min(best[k], (cpu_seconds() - t) / runs);
        }
      }
      const double macs = static_cast<double>(batch * positions * 9 * c * oc);
      if (avx512) {  // the direct VNNI kernel against the AVX-512 Winograd products
        using Vnni = std::integral_constant<int64_t, kIsaAvx512Vnni>;
        using R2 = std::integral_constant<int, 2>;
        using R4 = std::integral_constant<int, 4>;
        using R6 = std::integral_constant<int, 6>;
        using NB1 = std::integral_constant<int, 1>;
        using NB2 = std::integral_constant<int, 2>;
        using NB4 = std::integral_constant<int, 4>;
        auto run512 = [&](int k, int32_t* out) {
          switch (k) {
            case 0: direct(Vnni{}, out); break;
            case 1: winograd512(R4{}, NB4{}, out); break;
            case 2: winograd512(R4{}, NB2{}, out); break;
            case 3: winograd512(R2{}, NB4{}, out); break;
            case 4: winograd512(R6{}, NB1{}, out); break;
          }
        };
        const char* names[5] = {"direct VNNI", "Winograd R4 NB4", "R4 NB2", "R2 NB4", "R6 NB1"};
        bool equal = true;
        for (int k = 0; k < 5; ++k) {
          std::fill(all.begin(), all.end(), 0);
          run512(k, all.data());
          equal = equal && all == want;
        }
        double t512[5] = {1e9, 1e9, 1e9, 1e9, 1e9};
        for (int round = 0; round < 5; ++round) {
          for (int k = 0; k < 5; ++k) {
            const double t = cpu_seconds();
            for (int i = 0; i < runs; ++i) run512(k, nullptr);
            t512[k] = std::min(t512[k], (cpu_seconds() - t) / runs);
          }
        }
        std::printf("batch %2ld, %2ld channels %2ldx%-2ld AVX-512:", static_cast<long>(batch), static_cast<long>(c),
                    static_cast<long>(size), static_cast<long>(size));
        for (int k = 0; k < 5; ++k) {
          std::printf(" %s %.4f ms (%.0f)%s", names[k], t512[k] * 1e3, macs / t512[k] / 1e9, k == 0 ? ";" : "");
          if (k > 0) std::printf(" %.2fx;", t512[0] / t512[k]);
        }
        std::printf(" equal: %s\n", equal ? "yes" : "NO");
        if (only512) continue;
      }
      std::printf("batch %2ld, %2ld channels %2ldx%-2ld: pairs %.4f ms (%.0f GMAC/s), bytes %.4f ms (%.0f), "
                  "Winograd %.4f ms (%.0f G of the direct form's MAC/s): %.2fx, %.2fx; equal: %s\n",
                  static_cast<long>(batch), static_cast<long>(c), static_cast<long>(size), static_cast<long>(size),
                  best[0] * 1e3, macs / best[0] / 1e9, best[1] * 1e3, macs / best[1] / 1e9, best[2] * 1e3,
                  macs / best[2] / 1e9, best[0] / best[2], best[1] / best[2],
                  bytes_equal && winograd_equal ? "yes" : "NO");
    }
  }
}
