// The products of ResNet-20's 3x3 layers (C -> C channels, padding 1: 16 at 32 x 32, 32 at 16 x 16, 64 at 8 x 8;
// batch 1 and 64) on the AVX2 kernels: the direct form (conv.h products_avx2, vpmaddwd pairs and vpmaddubsw bytes)
// against the Winograd products (winograd.h, transforms included), each checked equal to the direct pairs' first,
// then timed in alternated rounds (the best of 5, per-thread CPU time: the figure that holds on a shared machine).
// Build and run from the repository root (x86-64 with AVX2):
//   g++ -O3 -std=c++17 -Wno-psabi -DCVM_ISA=1 -Icustom_ops benchmarks/bench_products.cc
//       custom_ops/winograd_kernels.cc custom_ops/cpu_features.cc -o bench_products && ./bench_products
// (one line)
#include <time.h>

#include <cstdio>
#include <random>

#include "winograd.h"

using namespace cvm_onnx;

static double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main() {
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
            if (!out || rows == count) {
              products_avx2<decltype(isa)::value>(at.data(), offsets.data(), rows, pw, init.data(), to);
            } else {
              products_avx2<decltype(isa)::value>(at.data(), offsets.data(), rows, pw, init.data(), buffer.data());
              std::copy(buffer.begin(), buffer.begin() + count * oc, to);
            }
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
      for (int round = 0; round < 5; ++round) {
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
      std::printf("batch %2ld, %2ld channels %2ldx%-2ld: pairs %.4f ms (%.0f GMAC/s), bytes %.4f ms (%.0f), "
                  "Winograd %.4f ms (%.0f G of the direct form's MAC/s): %.2fx, %.2fx; equal: %s\n",
                  static_cast<long>(batch), static_cast<long>(c), static_cast<long>(size), static_cast<long>(size),
                  best[0] * 1e3, macs / best[0] / 1e9, best[1] * 1e3, macs / best[1] / 1e9, best[2] * 1e3,
                  macs / best[2] / 1e9, best[0] / best[2], best[1] / best[2],
                  bytes_equal && winograd_equal ? "yes" : "NO");
    }
  }
}
