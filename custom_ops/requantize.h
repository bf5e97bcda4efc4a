// A requantization run in one pass (the serving form's ``requantize`` op): monotone integer steps over int32,
// in the order the CVM ops take them (docs/custom_ops.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "isa.h"

namespace cvm_onnx {

enum StepKind : int64_t { kShift = 0, kMul = 1, kAdd = 2, kClip = 3, kMul64 = 4, kEven = 5 };

struct RequantStep {
  int64_t kind, a, b;
};

// A mul64 (m = m1 2^s + m0, s) whose low product v m0 fits int32 for every value it is applied to, as
// channel_arrays lays it out (internal to ChannelArrays, never a parsed step): x m1 + ((x m0) >> s) in int32 lanes,
// the same integers as mul64 (floor(x m0 / 2^s) is the arithmetic shift of the exact x m0; the sum wraps alike).
constexpr int64_t kMul64Narrow = -4;
// A mul64 (m = m1 2^s + m0, s) whose low product needs more than int32 but splits at c, m0 = mh 2^c + ml, into
// int32 products (internal to ChannelArrays as kMul64Narrow): x m1 + ((x mh + ((x ml) >> c)) >> (s - c)), the
// same integers as mul64 where |x ml| and |x mh + floor(x ml / 2^c)| stay within int32 (nested floors:
// floor((x mh + floor(x ml / 2^c)) / 2^(s-c)) = floor(x m0 / 2^s)); a CVM product in three parts, computed as its
// own three int32 products.
constexpr int64_t kMul64Narrow2 = -5;

// What a shift by a (0..31) adds before shifting: 2^(a-1), the rounding half, or 0 for a = 0 (the value itself).
inline uint32_t shift_half(int64_t a) { return a ? 1u << (a - 1) : 0u; }

// A step's two int32 constants per lane (array_step): a shift as its half and s; a mul64 (m, s) as m1 = m >> s and
// m0 2^(31 - s) (m0 = m mod 2^s), since floor(v m / 2^s) = v m1 + floor(v m0 2^(31-s) / 2^31); else a and b.
inline std::pair<int32_t, int32_t> lane_constants(int64_t kind, int64_t a, int64_t b) {
  if (kind == kShift) return {static_cast<int32_t>(shift_half(a)), static_cast<int32_t>(a)};
  if (kind == kMul64) return {static_cast<int32_t>(a >> b), static_cast<int32_t>((a & ((int64_t{1} << b) - 1)) << (31 - b))};
  if (kind == kEven) return {static_cast<int32_t>(a ? (1u << (a - 1)) - 1u : 0u), static_cast<int32_t>(a)};
  return {static_cast<int32_t>(static_cast<uint32_t>(a)), static_cast<int32_t>(b)};
}

// kMul64 (a = m, b = s): floor(v * m / 2^s) in 64 bits, m = m1 2^s + m0 (m1 = m >> s an int32, 0 <= m0 < 2^s),
// computed as v * m1 + floor(v * m0 / 2^s) (each product within 2^62), wrapped to int32: a CVM graph's product in
// two parts (v * m1, v * m0, the add of -2^(s-1), cvm_right_shift by s, the add of both) where the exporter
// proves that none of those int32 ops wraps or clips (docs/import.md, "Two-part products").
__attribute__((always_inline)) inline int32_t mul64(int32_t v, int64_t m, int64_t s) {
  const int64_t high = static_cast<int64_t>(v) * (m >> s);
  const int64_t low = static_cast<int64_t>(v) * (m & ((int64_t{1} << s) - 1));
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(high + (low >> s))));
}

// kEven (a = s): round_half_even(v / 2^s) = floor((v + 2^(s-1) - 1 + bit s of v) / 2^s) for s >= 1 (bit s of v is
// floor(v / 2^s) mod 2: at v / 2^s = n + 1/2 the sum reaches the next multiple of 2^s exactly when n is odd), v
// for s = 0, wrapped to int32: a CVM graph's shift rounding half to even (cvm_right_shift(v + 2^(s-1) - 1, s + 1)
// + cvm_right_shift(v - 2^(s-1), s + 1)) where the exporter proves that none of its int32 ops wraps or clips
// (docs/import.md, "Ties"). In lanes (array_step): the constants 2^(s-1) - 1 (0 for s = 0) and s.
__attribute__((always_inline)) inline int32_t half_even(int32_t v, int64_t s) {
  if (!s) return v;
  const uint32_t odd = static_cast<uint32_t>(v >> s) & 1u;
  return static_cast<int32_t>(static_cast<uint32_t>(v) + (1u << (s - 1)) - 1u + odd) >> s;
}

// Parses the flat attribute [kind, a, b, ...]; returns an error message, empty when every step is valid: shift
// 0..31 (0: the value itself), mul/add an int32, clip lo <= hi within int32, mul64 s in 0..31 and m >> s an int32,
// even s in 0..31.
inline std::string parse_steps(const std::vector<int64_t>& flat, std::vector<RequantStep>& steps) {
  if (flat.size() % 3 != 0) return "steps must hold (kind, a, b) triples";
  const auto int32 = [](int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; };
  for (size_t i = 0; i < flat.size(); i += 3) {
    const RequantStep s{flat[i], flat[i + 1], flat[i + 2]};
    const bool ok = (s.kind == kShift && s.a >= 0 && s.a <= 31) || ((s.kind == kMul || s.kind == kAdd) && int32(s.a)) ||
                    (s.kind == kClip && int32(s.a) && int32(s.b) && s.a <= s.b) ||
                    (s.kind == kMul64 && s.b >= 0 && s.b <= 31 && int32(s.a >> s.b)) ||
                    (s.kind == kEven && s.a >= 0 && s.a <= 31);
    if (!ok) return "step " + std::to_string(i / 3) + " is not a valid (kind, a, b)";
    steps.push_back(s);
  }
  return {};
}

// Applies the steps in order to v[0:n] in place: int32 arithmetic with two's-complement wrap-around (the exporter
// proves no step wraps, so this is the runtime's arithmetic); shift s: (v + 2^(s-1)) >> s, the runtime's round half
// up. One loop per step, so that each vectorizes.
__attribute__((always_inline)) inline void apply_steps(int32_t* v, int64_t n,
                                                       const std::vector<RequantStep>& steps) {
  for (const RequantStep& s : steps) {
    const uint32_t a = static_cast<uint32_t>(s.a);
    switch (s.kind) {
      case kShift: {
        const uint32_t half = shift_half(s.a);
        const int shift = static_cast<int>(s.a);
        for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(static_cast<uint32_t>(v[i]) + half) >> shift;
        break;
      }
      case kMul:
        for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(static_cast<uint32_t>(v[i]) * a);
        break;
      case kAdd:
        for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(static_cast<uint32_t>(v[i]) + a);
        break;
      case kMul64:
        for (int64_t i = 0; i < n; ++i) v[i] = mul64(v[i], s.a, s.b);
        break;
      case kEven:
        for (int64_t i = 0; i < n; ++i) v[i] = half_even(v[i], s.a);
        break;
      default: {
        const int32_t lo = static_cast<int32_t>(s.a), hi = static_cast<int32_t>(s.b);
        for (int64_t i = 0; i < n; ++i) v[i] = std::min(std::max(v[i], lo), hi);
      }
    }
  }
}

inline int64_t kind_of(const RequantStep& s) { return s.kind; }
inline int64_t kind_of(int64_t kind) { return kind; }

// Step kinds known at compile time. With<T>: T<K...>.
template <int64_t... K>
struct Kinds {
  template <template <int64_t...> class T>
  using With = T<K...>;

  // Whether `steps` (RequantSteps, or their kinds) are of the kinds K... .
  template <typename Steps>
  static bool of(const Steps& steps) {
    constexpr int64_t want[] = {K..., -1};
    if (steps.size() != sizeof...(K)) return false;
    for (size_t k = 0; k < sizeof...(K); ++k) {
      if (kind_of(steps[k]) != want[k]) return false;
    }
    return true;
  }
};

// Sequences of kinds (Kinds...): with(steps, body) calls body(Kinds{}) for the first that `steps` are of and
// returns true; false where none is.
template <typename... Chains>
struct KindsList {
  template <typename Steps, typename Body>
  __attribute__((always_inline)) static bool with(const Steps& steps, Body&& body) {
    return ((Chains::of(steps) && (body(Chains{}), true)) || ...);
  }
};

// A CVM model's requantization as simplify leaves it: clip, multiply, shift, clip, after a shift or not; then
// nothing, a multiply before a residual Add, or a second multiply and shift, with its clip or without (where the
// values are within it already); a quantized import's with its product in two parts: clip, mul64, shift, clip,
// then nothing or a multiply before a residual Add.
using CvmChains = KindsList<Kinds<kClip, kMul, kShift, kClip>, Kinds<kShift, kClip, kMul, kShift, kClip>,
                            Kinds<kClip, kMul, kShift, kClip, kMul>, Kinds<kShift, kClip, kMul, kShift, kClip, kMul>,
                            Kinds<kClip, kMul, kShift, kClip, kMul, kShift>,
                            Kinds<kShift, kClip, kMul, kShift, kClip, kMul, kShift>,
                            Kinds<kClip, kMul, kShift, kClip, kMul, kShift, kClip>,
                            Kinds<kShift, kClip, kMul, kShift, kClip, kMul, kShift, kClip>,
                            Kinds<kClip, kMul64, kShift, kClip>, Kinds<kClip, kMul64, kShift, kClip, kMul>>;

// One step of a kind known at compile time: the same arithmetic as apply_steps' loops.
template <int64_t Kind>
__attribute__((always_inline)) inline int32_t step_of(int32_t x, const RequantStep& s) {
  if constexpr (Kind == kShift) {
    return static_cast<int32_t>(static_cast<uint32_t>(x) + shift_half(s.a)) >> s.a;
  } else if constexpr (Kind == kMul) {
    return static_cast<int32_t>(static_cast<uint32_t>(x) * static_cast<uint32_t>(s.a));
  } else if constexpr (Kind == kAdd) {
    return static_cast<int32_t>(static_cast<uint32_t>(x) + static_cast<uint32_t>(s.a));
  } else if constexpr (Kind == kMul64) {
    return mul64(x, s.a, s.b);
  } else if constexpr (Kind == kEven) {  // half_even without a branch: s = 0 adds nothing and shifts by 0
    const uint32_t some = s.a != 0;
    const uint32_t odd = static_cast<uint32_t>(x >> s.a) & some;
    return static_cast<int32_t>(static_cast<uint32_t>(x) + shift_half(s.a) - some + odd) >> s.a;
  } else {
    return std::min(std::max(x, static_cast<int32_t>(s.a)), static_cast<int32_t>(s.b));
  }
}

template <int64_t... K, size_t... I>
__attribute__((always_inline)) inline void steps_fused(int32_t* __restrict v, int64_t n, const RequantStep* steps,
                                                       std::index_sequence<I...>) {
  const RequantStep s[] = {steps[I]...};
  for (int64_t i = 0; i < n; ++i) {
    int32_t x = v[i];
    ((x = step_of<K>(x, s[I])), ...);
    v[i] = x;
  }
}

// The steps, of the kinds K..., in one pass over v[0:n] (the whole chain on each value in registers).
template <int64_t... K>
__attribute__((always_inline)) inline void steps_fused(Kinds<K...>, int32_t* v, int64_t n, const RequantStep* steps) {
  steps_fused<K...>(v, n, steps, std::make_index_sequence<sizeof...(K)>{});
}

// A quantized import's requantization whose shift rounds half to even (docs/import.md, "Ties"): a pool's at one
// scale (clip, even), a product's (clip, multiply, even), each with its final clip or without, after a shift or not.
using EvenChains = KindsList<Kinds<kClip, kEven>, Kinds<kClip, kEven, kClip>, Kinds<kClip, kMul, kEven>,
                             Kinds<kClip, kMul, kEven, kClip>, Kinds<kShift, kClip, kMul, kEven, kClip>>;

// apply_steps, in one pass for a CVM model's chains (CvmChains) and an import's that round half to even
// (EvenChains), else one loop per step.
__attribute__((always_inline)) inline void apply_steps_fast(int32_t* v, int64_t n,
                                                            const std::vector<RequantStep>& steps) {
  const auto fused = [&](auto kinds) __attribute__((always_inline)) { steps_fused(kinds, v, n, steps.data()); };
  if (!CvmChains::with(steps, fused) && !EvenChains::with(steps, fused)) apply_steps(v, n, steps);
}

// Steps per channel (the channel_steps attribute): steps[c] for channel c; empty when the op has one list for all.
using ChannelSteps = std::vector<std::vector<RequantStep>>;

// The values a chain of steps can hold at some point: [lo, hi] within int32.
struct Range {
  int64_t lo = INT32_MIN, hi = INT32_MAX;
};

// The values step s gives for values in r (int32 wrap-around anywhere in r: every value the step can give).
inline Range after(const RequantStep& s, Range r) {
  const auto fits = [](int64_t lo, int64_t hi) { return lo >= INT32_MIN && hi <= INT32_MAX; };
  switch (s.kind) {
    case kClip:
      return {std::clamp(r.lo, s.a, s.b), std::clamp(r.hi, s.a, s.b)};
    case kShift: {
      const int64_t half = shift_half(s.a);
      if (!fits(r.lo + half, r.hi + half)) return {int64_t{INT32_MIN} >> s.a, int64_t{INT32_MAX} >> s.a};
      return {(r.lo + half) >> s.a, (r.hi + half) >> s.a};
    }
    case kMul: {
      const int64_t p = r.lo * s.a, q = r.hi * s.a;
      return fits(std::min(p, q), std::max(p, q)) ? Range{std::min(p, q), std::max(p, q)} : Range{};
    }
    case kMul64: {  // monotone in v; the ends exact where they stay within int32 (|v m1| < 2^62)
      const auto at = [&](int64_t v) { return v * (s.a >> s.b) + ((v * (s.a & ((int64_t{1} << s.b) - 1))) >> s.b); };
      const int64_t p = at(r.lo), q = at(r.hi);
      return fits(std::min(p, q), std::max(p, q)) ? Range{std::min(p, q), std::max(p, q)} : Range{};
    }
    case kEven: {  // monotone; the ends exact where v + 2^(s-1) stays within int32
      if (!s.a) return r;
      const int64_t half = int64_t{1} << (s.a - 1);
      if (!fits(r.lo - half, r.hi + half)) return {int64_t{INT32_MIN} >> s.a, int64_t{INT32_MAX} >> s.a};
      const auto at = [&](int64_t v) { return (v + half - 1 + ((v >> s.a) & 1)) >> s.a; };
      return {at(r.lo), at(r.hi)};
    }
    default:
      return fits(r.lo + s.a, r.hi + s.a) ? Range{r.lo + s.a, r.hi + s.a} : Range{};
  }
}

// Whether step s leaves every value in r as it is.
inline bool identity(const RequantStep& s, Range r) {
  switch (s.kind) {
    case kClip: return s.a <= r.lo && r.hi <= s.b;
    case kMul: return s.a == 1;
    case kMul64: return s.a == (int64_t{1} << s.b);
    case kEven: return s.a == 0;
    default: return s.a == 0;  // a shift by 0, an add of 0
  }
}

// The same chains in fewer steps, their kinds kept the same for every chain (chains[c] channel c's; each chain's
// values tracked by Range from `from`, the values the chains are applied to): a step that leaves every chain's
// values as they are goes; two clips in a row are one, clip(clip(x, a1, b1), a2, b2) = clip(x, min(max(a1, a2), b2),
// max(min(b1, b2), a2)); add c, clip (a, b), add -c, where neither add wraps around, is clip(a - c, b - c).
inline void simplify(ChannelSteps& chains, Range from = {}) {
  for (bool changed = !chains.empty(); changed;) {
    changed = false;
    std::vector<Range> r(chains.size(), from);  // each chain's values before step k
    const auto all = [&](auto&& rule) {
      for (size_t c = 0; c < chains.size(); ++c) {
        if (!rule(chains[c], r[c])) return false;
      }
      return true;
    };
    const auto erase = [&](size_t k, size_t count) {
      for (std::vector<RequantStep>& chain : chains) {
        chain.erase(chain.begin() + static_cast<std::ptrdiff_t>(k), chain.begin() + static_cast<std::ptrdiff_t>(k + count));
      }
    };
    const std::vector<RequantStep>& first = chains[0];
    for (size_t k = 0; k < first.size() && !changed; ++k) {
      const auto kind = [&](size_t j) { return j < first.size() ? first[j].kind : int64_t{-1}; };
      if (all([&](const std::vector<RequantStep>& chain, Range v) { return identity(chain[k], v); })) {
        erase(k, 1);
        changed = true;
      } else if (kind(k) == kClip && kind(k + 1) == kClip) {
        for (std::vector<RequantStep>& chain : chains) {
          const RequantStep &one = chain[k], &two = chain[k + 1];
          chain[k] = {kClip, std::min(std::max(one.a, two.a), two.b), std::max(std::min(one.b, two.b), two.a)};
        }
        erase(k + 1, 1);
        changed = true;
      } else if (kind(k) == kAdd && kind(k + 1) == kClip && kind(k + 2) == kAdd &&
                 all([&](const std::vector<RequantStep>& chain, Range v) {
                   const int64_t add = chain[k].a, lo = chain[k + 1].a - add, hi = chain[k + 1].b - add;
                   return chain[k + 2].a == -add && v.lo + add >= INT32_MIN && v.hi + add <= INT32_MAX &&
                          lo >= INT32_MIN && hi <= INT32_MAX;
                 })) {
        for (std::vector<RequantStep>& chain : chains) {
          chain[k] = {kClip, chain[k + 1].a - chain[k].a, chain[k + 1].b - chain[k].a};
        }
        erase(k + 1, 2);
        changed = true;
      }
      for (size_t c = 0; c < chains.size() && !changed; ++c) r[c] = after(chains[c][k], r[c]);
    }
  }
}

// One chain simplified (applied to values in `from`).
inline std::vector<RequantStep> simplified(const std::vector<RequantStep>& chain, Range from = {}) {
  ChannelSteps one{chain};
  simplify(one, from);
  return one[0];
}

// The steps of an op with an addend as the CPU kernels run them, simplified: addend_steps on an int32 addend (words)
// or on a uint8 one (bytes: its values in [0, 255], so that a clip holding them goes), sum_steps after the sum
// (after).
struct AddendSteps {
  std::vector<RequantStep> words, bytes, after;
};

inline AddendSteps addend_chains(const std::vector<RequantStep>& addend, const std::vector<RequantStep>& sum) {
  return {simplified(addend), simplified(addend, Range{0, 255}), simplified(sum)};
}

// Values per dispatch of apply_channel_arrays: 8 vectors of 16 lanes, independent chains that hide the steps'
// latencies (8 of AVX-512's 32 registers).
constexpr size_t kTile = 128;

// Channel steps of one sequence of kinds, their constants laid out for values with the channel innermost: step k
// of the value at index i (i % C its channel) is kinds[k] with a[k * period + i % period], b[k * period +
// i % period] (lane_constants: a shift as its half, 2^(s-1) or 0, and s), period = lcm(C, kTile): every run of
// kTile values from a multiple of kTile finds its constants side by side. Empty kinds: the channels' kinds differ.
struct ChannelArrays {
  std::vector<int64_t> kinds;
  size_t period = 0, channels = 0;
  std::vector<int32_t> a, b;
};

// Whether every channel's chain has one sequence of kinds (none for no channels).
inline bool same_kinds(const ChannelSteps& per) {
  if (per.empty()) return false;
  for (const std::vector<RequantStep>& p : per) {
    if (p.size() != per[0].size()) return false;
    for (size_t k = 0; k < p.size(); ++k) {
      if (p[k].kind != per[0][k].kind) return false;
    }
  }
  return true;
}

// Whether mul64 step s (m, shift) on values in r is kMul64Narrow's: |v| (m mod 2^shift) < 2^31 for every v in r
// (checked in 128 bits), and m mod 2^shift < 2^26 (its lane constant m0 2^5 + shift).
inline bool narrow(const RequantStep& s, Range r) {
  const int64_t m0 = s.a & ((int64_t{1} << s.b) - 1);
  const __int128 v = std::max(-r.lo, r.hi);
  return m0 < (int64_t{1} << 26) && v * m0 < (__int128{1} << 31);
}

// Whether mul64 step s on values in r is kMul64Narrow2's with the split c (0 if none; the largest that holds): 0 <= m1
// < 2^16 and 0 <= mh < 2^15 (its lane constant mh 2^16 + m1), ml < 2^21 (ml 2^10 + c 2^5 + s - c), |v| ml < 2^31
// and |v| mh + ceil(|v| ml / 2^c) < 2^31 for every v in r (checked in 128 bits).
inline int64_t narrow2(const RequantStep& s, Range r) {
  const int64_t m1 = s.a >> s.b, m0 = s.a & ((int64_t{1} << s.b) - 1);
  const __int128 v = std::max(-r.lo, r.hi), limit = __int128{1} << 31;
  if (m1 < 0 || m1 >= (int64_t{1} << 16)) return 0;
  for (int64_t c = s.b - 1; c >= 1; --c) {
    const int64_t mh = m0 >> c, ml = m0 & ((int64_t{1} << c) - 1);
    const __int128 low = v * ml;
    if (mh < (int64_t{1} << 15) && ml < (int64_t{1} << 21) && low < limit &&
        v * mh + ((low + (__int128{1} << c) - 1) >> c) < limit) {
      return c;
    }
  }
  return 0;
}

// The channels' steps (from values in `from`) side by side; a mul64 whose low product fits int32 in every channel
// (narrow, each channel's values tracked by Range) as kMul64Narrow, else one that splits into int32 products in
// every channel (narrow2) as kMul64Narrow2.
inline ChannelArrays channel_arrays(const ChannelSteps& per, Range from = {}) {
  ChannelArrays out;
  if (!same_kinds(per)) return out;
  const size_t channels = per.size(), steps = per[0].size();
  out.period = std::lcm<size_t>(channels, kTile);
  out.channels = channels;
  out.a.resize(steps * out.period);
  out.b.resize(steps * out.period);
  std::vector<Range> r(channels, from);  // each channel's values before step k
  for (size_t k = 0; k < steps; ++k) {
    bool narrowed = per[0][k].kind == kMul64;
    for (size_t c = 0; c < channels && narrowed; ++c) narrowed = narrow(per[c][k], r[c]);
    std::vector<int64_t> splits(per[0][k].kind == kMul64 && !narrowed ? channels : 0);
    bool split = !splits.empty();
    for (size_t c = 0; c < splits.size() && split; ++c) split = (splits[c] = narrow2(per[c][k], r[c])) != 0;
    out.kinds.push_back(narrowed ? kMul64Narrow : split ? kMul64Narrow2 : per[0][k].kind);
    for (size_t i = 0; i < out.period; ++i) {
      const RequantStep& s = per[i % channels][k];
      const int64_t m1 = s.a >> s.b, m0 = s.a & ((int64_t{1} << s.b) - 1);
      if (split) {
        const int64_t c = splits[i % channels];
        std::tie(out.a[k * out.period + i], out.b[k * out.period + i]) = std::pair<int32_t, int32_t>(
            static_cast<int32_t>(((m0 >> c) << 16) | m1),
            static_cast<int32_t>(((m0 & ((int64_t{1} << c) - 1)) << 10) | (c << 5) | (s.b - c)));
        continue;
      }
      std::tie(out.a[k * out.period + i], out.b[k * out.period + i]) =
          narrowed ? std::pair<int32_t, int32_t>(static_cast<int32_t>(m1), static_cast<int32_t>((m0 << 5) | s.b))
                   : lane_constants(s.kind, s.a, s.b);
    }
    for (size_t c = 0; c < channels; ++c) r[c] = after(per[c][k], r[c]);
  }
  return out;
}

// A requantize op's chains as the CPU kernels run them (the CUDA kernel runs the steps as given): `steps` and each
// channel's chain simplified, the channels' together where they have one sequence of kinds; returns the channels'
// chains side by side (channel_arrays).
inline ChannelArrays kernel_chains(std::vector<RequantStep>& steps, ChannelSteps& per) {
  steps = simplified(steps);
  if (same_kinds(per)) {
    simplify(per);
  } else {
    for (std::vector<RequantStep>& chain : per) chain = simplified(chain);
  }
  return channel_arrays(per);
}

// 16 int32 lanes (GCC/Clang vector extensions): one AVX-512 register, two AVX2 or four SSE2 ones, the same
// lane-wise integer arithmetic in every clone.
using Lanes = int32_t __attribute__((vector_size(64)));
using ULanes = uint32_t __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;
using WideLanes = int64_t __attribute__((vector_size(128)));  // 16 int64 lanes (mul64's products)

__attribute__((always_inline)) inline Lanes load_lanes(const int32_t* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Step Kind with the constants a, b (lane_constants), on one value (T int32_t, U uint32_t) or on 16
// lanes (T Lanes, U ULanes): apply_steps' arithmetic, with int32 wrap-around.
template <int64_t Kind, typename T, typename U>
__attribute__((always_inline)) inline T array_step(T x, T a, T b) {
  if constexpr (Kind == kShift) {
    return (T)((U)x + (U)a) >> b;
  } else if constexpr (Kind == kMul) {
    return (T)((U)x * (U)a);
  } else if constexpr (Kind == kAdd) {
    return (T)((U)x + (U)a);
  } else if constexpr (Kind == kMul64Narrow) {  // a = m1, b = m0 2^5 + s (channel_arrays): x m1 + ((x m0) >> s)
    const T low = (T)((U)x * (U)(b >> 5)) >> (b & 31);
    return (T)((U)x * (U)a + (U)low);
  } else if constexpr (Kind == kMul64Narrow2) {  // a = mh 2^16 + m1, b = ml 2^10 + c 2^5 + (s - c) (channel_arrays)
    const T low = (T)((U)x * (U)(b >> 10)) >> ((b >> 5) & 31);
    const T mid = (T)((U)x * (U)(a >> 16) + (U)low) >> (b & 31);
    return (T)((U)x * (U)(a & 0xffff) + (U)mid);
  } else if constexpr (Kind == kMul64) {  // a = m1, b = m0 2^(31 - s) (lane_constants): x m1 + floor(x b / 2^31)
    if constexpr (std::is_same_v<T, int32_t>) {
      const int64_t low = (static_cast<int64_t>(x) * static_cast<int64_t>(b)) >> 31;
      return static_cast<int32_t>(static_cast<uint32_t>(x) * static_cast<uint32_t>(a) + static_cast<uint32_t>(low));
    } else {
      const WideLanes p = __builtin_convertvector(x, WideLanes) * __builtin_convertvector(b, WideLanes);
      return (T)((U)x * (U)a + (U)__builtin_convertvector(p >> 31, T));
    }
  } else if constexpr (Kind == kEven) {  // a = 2^(s-1) - 1 (0 for s = 0), b = s: x + a + bit s of x (s > 0), >> s
    const T odd = (x >> b) & ((T)(b != 0) & 1);
    return (T)((U)x + (U)a + (U)odd) >> b;
  } else {
    x = x < a ? a : x;
    return x > b ? b : x;
  }
}

// Calls body(std::integral_constant<int64_t, kind>{}): the kind as a compile-time constant.
template <typename Body>
__attribute__((always_inline)) inline void with_kind(int64_t kind, Body&& body) {
  switch (kind) {
    case kShift: return body(std::integral_constant<int64_t, kShift>{});
    case kMul: return body(std::integral_constant<int64_t, kMul>{});
    case kAdd: return body(std::integral_constant<int64_t, kAdd>{});
    case kMul64: return body(std::integral_constant<int64_t, kMul64>{});
    case kEven: return body(std::integral_constant<int64_t, kEven>{});
    case kMul64Narrow: return body(std::integral_constant<int64_t, kMul64Narrow>{});
    case kMul64Narrow2: return body(std::integral_constant<int64_t, kMul64Narrow2>{});
    default: return body(std::integral_constant<int64_t, kClip>{});
  }
}

// Step Kind on Count vectors of 16 lanes, their constants from a and b on.
template <int64_t Kind, int Count>
__attribute__((always_inline)) inline void tile_step(Lanes* y, const int32_t* a, const int32_t* b) {
  for (int j = 0; j < Count; ++j) {
    y[j] = array_step<Kind, Lanes, ULanes>(y[j], load_lanes(a + j * kLanes), load_lanes(b + j * kLanes));
  }
}

// 16 bytes: the low byte of each of 16 int32 lanes (__builtin_convertvector narrows lane by lane), or 16 uint8
// values widened to int32 lanes.
using ByteLanes = uint8_t __attribute__((vector_size(16)));
using ShortLanes = uint16_t __attribute__((vector_size(32)));

// The 16 bytes from p on as int32 lanes: widened through 16-bit lanes (GCC 12 widens bytes to int32 directly one
// byte at a time; bytes to words and words to int32 are vector instructions).
__attribute__((always_inline)) inline Lanes widen_bytes(const uint8_t* p) {
  ByteLanes u;
  std::memcpy(&u, p, sizeof u);
  return (Lanes)__builtin_convertvector(__builtin_convertvector(u, ShortLanes), ULanes);
}

// The second operand of requantize_add, laid out as y: y = after(the steps' value + steps(x)), the sum in int32
// with wrap-around (as onnxruntime's Add); x int32, or bytes (x null) taken as their values.
struct Addend {
  const int32_t* x;
  const uint8_t* bytes;
  const std::vector<RequantStep>& steps;
  const std::vector<RequantStep>& after;
};

// Step Kind with the constants a, b in every lane on Count vectors of 16 lanes.
template <int64_t Kind, int Count>
__attribute__((always_inline)) inline void tile_step(Lanes* y, Lanes a, Lanes b) {
  for (int j = 0; j < Count; ++j) y[j] = array_step<Kind, Lanes, ULanes>(y[j], a, b);
}

// Step s's constants in every lane: a and b (lane_constants).
__attribute__((always_inline)) inline void step_lanes(const RequantStep& s, Lanes& a, Lanes& b) {
  const auto [ca, cb] = lane_constants(s.kind, s.a, s.b);
  a = Lanes{} + ca;
  b = Lanes{} + cb;
}

// Steps (one list, the same constants in every lane) on Count vectors of 16 lanes: apply_steps' arithmetic (a
// switch, not with_kind: its lambda may stay a call, which would keep the vectors in memory; the constants built
// here, not by step_lanes, which GCC 12 compiled 3% slower into the on-chain ResNet-20's kernels).
template <int Count>
__attribute__((always_inline)) inline void tile_steps(Lanes* y, const std::vector<RequantStep>& steps) {
  for (const RequantStep& s : steps) {
    const auto [ca, cb] = lane_constants(s.kind, s.a, s.b);
    const Lanes a = Lanes{} + ca, b = Lanes{} + cb;
    switch (s.kind) {
      case kShift: tile_step<kShift, Count>(y, a, b); break;
      case kMul: tile_step<kMul, Count>(y, a, b); break;
      case kAdd: tile_step<kAdd, Count>(y, a, b); break;
      case kMul64: tile_step<kMul64, Count>(y, a, b); break;
      case kEven: tile_step<kEven, Count>(y, a, b); break;
      default: tile_step<kClip, Count>(y, a, b);
    }
  }
}

// 16 values written to v[i:i + 16]: int32, or (Out uint8_t) their low bytes.
template <typename Out>
__attribute__((always_inline)) inline void store_lanes(Lanes y, Out* v, int64_t i) {
  if constexpr (std::is_same_v<Out, uint8_t>) {
    const ByteLanes u = __builtin_convertvector(y, ByteLanes);
    std::memcpy(v + i, &u, sizeof u);
  } else {
    std::memcpy(v + i, &y, sizeof y);
  }
}

// The Count vectors y of the values from index i on, with an addend (its x or bytes indexed as v; null: none)
// after(y + steps(addend)), written to v; Out uint8_t: as the low bytes (the caller proves every value in
// [0, 255]).
template <int Count, typename Out>
__attribute__((always_inline)) inline void add_and_store(Lanes* y, const Addend* addend, int64_t i, Out* v) {
  if (addend) {
    Lanes z[Count];
    for (int j = 0; j < Count; ++j) {
      if (addend->x) {
        z[j] = load_lanes(addend->x + i + j * kLanes);
      } else {
        z[j] = widen_bytes(addend->bytes + i + j * kLanes);
      }
    }
    tile_steps<Count>(z, addend->steps);
    for (int j = 0; j < Count; ++j) y[j] = (Lanes)((ULanes)y[j] + (ULanes)z[j]);
    tile_steps<Count>(y, addend->after);
  }
  for (int j = 0; j < Count; ++j) store_lanes(y[j], v, i + j * kLanes);
}

// Count vectors of 16 lanes from index i on, their constants from index at = i % period on: v = each channel's
// steps applied to x + add (add null: x), then add_and_store's, all the steps on values kept in registers, one
// dispatch on a step's kind for all Count vectors.
template <int Count, typename Out>
__attribute__((always_inline)) inline void lanes_chain(const int32_t* x, const int32_t* add, int64_t i, size_t at,
                                                       const ChannelArrays& p, const Addend* addend, Out* v) {
  Lanes y[Count];
  for (int j = 0; j < Count; ++j) {
    y[j] = load_lanes(x + i + j * kLanes);
    if (add) y[j] = (Lanes)((ULanes)y[j] + (ULanes)load_lanes(add + i + j * kLanes));
  }
  const int32_t* a = p.a.data() + at;
  const int32_t* b = p.b.data() + at;
  for (const int64_t kind : p.kinds) {
    switch (kind) {
      case kShift: tile_step<kShift, Count>(y, a, b); break;
      case kMul: tile_step<kMul, Count>(y, a, b); break;
      case kAdd: tile_step<kAdd, Count>(y, a, b); break;
      case kMul64: tile_step<kMul64, Count>(y, a, b); break;
      case kEven: tile_step<kEven, Count>(y, a, b); break;
      case kMul64Narrow: tile_step<kMul64Narrow, Count>(y, a, b); break;
      case kMul64Narrow2: tile_step<kMul64Narrow2, Count>(y, a, b); break;
      default: tile_step<kClip, Count>(y, a, b);
    }
    a += p.period;
    b += p.period;
  }
  add_and_store<Count>(y, addend, i, v);
}

// v[i] = each channel's steps (ChannelArrays) applied to x[i] + add[i] (add null: x[i]) for i < n, x's first value
// of channel 0, then the addend's (lanes_chain; null: none), as int32 or (Out uint8_t) bytes: the whole chain on
// kTile values at a time (then 16, then one), kept in registers from the first step to the last, each lane with its
// channel's constants. x and v may be the same.
template <typename Out>
__attribute__((always_inline)) inline void channel_chains(const int32_t* x, const int32_t* add, int64_t n,
                                                          const ChannelArrays& p, Out* v, const Addend* addend) {
  int64_t i = 0;
  size_t at = 0;  // i % period
  const auto advance = [&](int64_t by) {
    i += by;
    at = at + static_cast<size_t>(by) == p.period ? 0 : at + static_cast<size_t>(by);
  };
  for (; i + static_cast<int64_t>(kTile) <= n; advance(kTile)) lanes_chain<kTile / kLanes>(x, add, i, at, p, addend, v);
  for (; i + kLanes <= n; advance(kLanes)) lanes_chain<1>(x, add, i, at, p, addend, v);
  for (; i < n; advance(1)) {
    int32_t y = static_cast<int32_t>(static_cast<uint32_t>(x[i]) + static_cast<uint32_t>(add ? add[i] : 0));
    for (size_t k = 0; k < p.kinds.size(); ++k) {
      const size_t c = k * p.period + at;
      with_kind(p.kinds[k], [&](auto kind) { y = array_step<kind, int32_t, uint32_t>(y, p.a[c], p.b[c]); });
    }
    if (addend) {
      int32_t z = addend->x ? addend->x[i] : addend->bytes[i];
      apply_steps(&z, 1, addend->steps);
      y = static_cast<int32_t>(static_cast<uint32_t>(y) + static_cast<uint32_t>(z));
      apply_steps(&y, 1, addend->after);
    }
    v[i] = static_cast<Out>(y);
  }
}

// Step Kind on one vector with the constants a, b (a fold's element).
template <int64_t Kind>
__attribute__((always_inline)) inline void lane_step(Lanes& y, Lanes a, Lanes b) {
  y = array_step<Kind, Lanes, ULanes>(y, a, b);
}

template <int64_t... K, size_t... I>
__attribute__((always_inline)) inline void lane_steps(Lanes& y, const Lanes* a, const Lanes* b,
                                                      std::index_sequence<I...>) {
  (lane_step<K>(y, a[I], b[I]), ...);
}

// Steps of the kinds K... (known at compile time), each with its constants in every lane, broadcast once.
template <int64_t... K>
struct UniformLanes {
  static constexpr size_t kSteps = sizeof...(K);
  Lanes a[kSteps + 1], b[kSteps + 1];

  static bool fits(const std::vector<RequantStep>& steps) { return Kinds<K...>::of(steps); }

  explicit UniformLanes(const std::vector<RequantStep>& steps) {
    for (size_t k = 0; k < kSteps; ++k) step_lanes(steps[k], a[k], b[k]);
  }

  __attribute__((always_inline)) Lanes operator()(Lanes y) const {
    lane_steps<K...>(y, a, b, std::make_index_sequence<kSteps>{});
    return y;
  }
};

// Steps of any kinds (one list, the same constants in every lane), at most kMax, their constants broadcast once
// (fits: not more than kMax).
struct LaneSteps {
  static constexpr size_t kMax = 8;
  size_t count = 0;
  bool fits = true;
  int64_t kinds[kMax] = {};
  Lanes a[kMax], b[kMax];

  explicit LaneSteps(const std::vector<RequantStep>& steps) : count(steps.size()), fits(steps.size() <= kMax) {
    for (size_t k = 0; k < count && fits; ++k) {
      kinds[k] = steps[k].kind;
      step_lanes(steps[k], a[k], b[k]);
    }
  }

  __attribute__((always_inline)) Lanes operator()(Lanes y) const {
    for (size_t k = 0; k < count; ++k) {
      switch (kinds[k]) {
        case kShift: y = array_step<kShift, Lanes, ULanes>(y, a[k], b[k]); break;
        case kMul: y = array_step<kMul, Lanes, ULanes>(y, a[k], b[k]); break;
        case kAdd: y = array_step<kAdd, Lanes, ULanes>(y, a[k], b[k]); break;
        case kMul64: y = array_step<kMul64, Lanes, ULanes>(y, a[k], b[k]); break;
        case kEven: y = array_step<kEven, Lanes, ULanes>(y, a[k], b[k]); break;
        default: y = array_step<kClip, Lanes, ULanes>(y, a[k], b[k]);
      }
    }
    return y;
  }
};

// What follows a chain's steps on each vector: add_and_store's work (any addend, or none), the addend's steps and
// those after the sum with their constants broadcast once (LaneSteps; add_and_store itself past LaneSteps::kMax).
struct AnyEnd {
  const Addend* addend;
  LaneSteps steps, after;

  explicit AnyEnd(const Addend* a)
      : addend(a), steps(a ? a->steps : std::vector<RequantStep>{}), after(a ? a->after : std::vector<RequantStep>{}) {}

  template <typename Out>
  __attribute__((always_inline)) void operator()(Lanes y, int64_t i, Out* v) const {
    if (addend && steps.fits && after.fits) {
      const Lanes z = addend->x ? load_lanes(addend->x + i) : widen_bytes(addend->bytes + i);
      y = after((Lanes)((ULanes)y + (ULanes)steps(z)));
    } else if (addend) {
      return add_and_store<1>(&y, addend, i, v);
    }
    store_lanes(y, v, i);
  }
};

// The same for an addend (A int32_t: its x, uint8_t: its bytes) whose steps and steps after the sum are of kinds
// known at compile time (Steps and After, UniformLanes), their constants in registers.
template <typename A, typename Steps, typename After>
struct UniformEnd {
  const A* addend;
  Steps steps;
  After after;

  template <typename Out>
  __attribute__((always_inline)) void operator()(Lanes y, int64_t i, Out* v) const {
    Lanes z;
    if constexpr (std::is_same_v<A, uint8_t>) {
      z = widen_bytes(addend + i);
    } else {
      z = load_lanes(addend + i);
    }
    store_lanes(after((Lanes)((ULanes)y + (ULanes)steps(z))), v, i);
  }
};

// channel_chains where the channels are a multiple of 16 and the kinds K... are known: the values taken 16
// channels at a time over every row, so that each block's constants are loaded once for all rows and stay in
// registers (channel_chains loads them for every vector: ten loads per vector of values); end(y, i, v) adds the
// addend and writes.
template <typename Out, typename End, int64_t... K>
__attribute__((always_inline)) inline void blocks_then(const int32_t* x, const int32_t* add, int64_t n,
                                                       const ChannelArrays& p, Out* v, const End& end) {
  constexpr size_t steps = sizeof...(K);
  const int64_t channels = static_cast<int64_t>(p.channels), rows = n / channels;
  for (int64_t block = 0; block < channels; block += kLanes) {
    Lanes a[steps], b[steps];
    for (size_t k = 0; k < steps; ++k) {
      a[k] = load_lanes(p.a.data() + k * p.period + block);
      b[k] = load_lanes(p.b.data() + k * p.period + block);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r * channels + block;
      Lanes y = load_lanes(x + i);
      if (add) y = (Lanes)((ULanes)y + (ULanes)load_lanes(add + i));
      lane_steps<K...>(y, a, b, std::make_index_sequence<steps>{});
      end(y, i, v);
    }
  }
}

// body(UniformEnd) and true where the addend's steps (A its type, data its values) are of Steps' kinds and a shift
// and a clip follow the sum; else false.
template <typename A, typename Steps, typename Body>
__attribute__((always_inline)) inline bool uniform_end(const Addend& addend, const A* data, Body& body) {
  using After = UniformLanes<kShift, kClip>;
  if (!Steps::fits(addend.steps) || !After::fits(addend.after)) return false;
  body(UniformEnd<A, Steps, After>{data, Steps(addend.steps), After(addend.after)});
  return true;
}

// body(end), end what follows a chain's steps on each vector: UniformEnd where the addend's steps are none, a
// multiply or a clip and a multiply (a quantized import's residual Add; a uint8 addend's clip within [0, 255] has
// gone) and a shift and a clip follow the sum; else AnyEnd (any addend, or none).
template <typename Body>
__attribute__((always_inline)) inline void with_end(const Addend* addend, Body&& body) {
  if (addend) {
    const auto ends = [&](const auto* data) __attribute__((always_inline)) {
      using A = std::remove_const_t<std::remove_pointer_t<decltype(data)>>;
      return uniform_end<A, UniformLanes<>>(*addend, data, body) ||
             uniform_end<A, UniformLanes<kMul>>(*addend, data, body) ||
             uniform_end<A, UniformLanes<kClip, kMul>>(*addend, data, body);
    };
    if (addend->x ? ends(addend->x) : ends(addend->bytes)) return;
  }
  body(AnyEnd(addend));
}

// blocks_then with with_end's end.
template <typename Out, int64_t... K>
__attribute__((always_inline)) inline void channel_blocks(const int32_t* x, const int32_t* add, int64_t n,
                                                          const ChannelArrays& p, Out* v, const Addend* addend) {
  with_end(addend, [&](const auto& end) __attribute__((always_inline)) {
    blocks_then<Out, std::decay_t<decltype(end)>, K...>(x, add, n, p, v, end);
  });
}

// v = steps(x), the same steps for every value, then AnyEnd's, over n values, 16 at a time: in registers where n is
// a multiple of 16 and the steps are of CvmChains (true); else false.
template <typename Out>
__attribute__((always_inline)) inline bool uniform_chain(const int32_t* x, int64_t n,
                                                         const std::vector<RequantStep>& steps, Out* v,
                                                         const Addend* addend) {
  return n % kLanes == 0 && CvmChains::with(steps, [&](auto kinds) __attribute__((always_inline)) {
    const typename decltype(kinds)::template With<UniformLanes> chain(steps);
    const AnyEnd end(addend);
    for (int64_t i = 0; i < n; i += kLanes) end(chain(load_lanes(x + i)), i, v);
  });
}

// channel_blocks of the kinds K... (Kinds<K...>, as KindsList::with gives them).
template <typename Out, int64_t... K>
__attribute__((always_inline)) inline void channel_blocks(Kinds<K...>, const int32_t* x, const int32_t* add, int64_t n,
                                                          const ChannelArrays& p, Out* v, const Addend* addend) {
  channel_blocks<Out, K...>(x, add, n, p, v, addend);
}

// The channels' kinds that channel_blocks runs, known at compile time: a quantized import's requantization (clip,
// shift, multiply, shift, clip; then a multiply before a residual Add, or the output's zero point added and clipped;
// or its product in two parts, clip, mul64, shift, clip, after a shift or not, the multiply or the zero point after
// it or not; its low product within int32, kMul64Narrow, or not; in three parts, its products within int32,
// kMul64Narrow2).
using ChannelBlockChains = KindsList<Kinds<kClip, kShift, kMul, kShift, kClip>,
                                     Kinds<kClip, kShift, kMul, kShift, kClip, kMul>,
                                     Kinds<kClip, kShift, kMul, kShift, kClip, kAdd, kClip>,
                                     Kinds<kClip, kMul64Narrow, kShift, kClip, kAdd, kClip>,
                                     Kinds<kClip, kShift, kMul64, kShift, kClip>,
                                     Kinds<kClip, kMul64, kShift, kClip>, Kinds<kClip, kMul64, kShift, kClip, kMul>,
                                     Kinds<kClip, kShift, kMul64Narrow, kShift, kClip>,
                                     Kinds<kClip, kMul64Narrow, kShift, kClip>,
                                     Kinds<kClip, kMul64Narrow, kShift, kClip, kMul>,
                                     Kinds<kClip, kMul64Narrow2, kShift, kClip, kAdd, kClip>,
                                     Kinds<kClip, kMul64Narrow2, kShift, kClip>,
                                     Kinds<kClip, kMul64Narrow2, kShift, kClip, kMul>>;

// channel_chains; where the channels are a multiple of 16 and the kinds of ChannelBlockChains, channel_blocks.
template <typename Out>
__attribute__((always_inline)) inline void apply_channel_arrays(const int32_t* x, const int32_t* add, int64_t n,
                                                                const ChannelArrays& p, Out* v,
                                                                const Addend* addend = nullptr) {
  const auto blocks = [&](auto kinds) __attribute__((always_inline)) {
    channel_blocks<Out>(kinds, x, add, n, p, v, addend);
  };
  if (p.channels % kLanes == 0 && n % static_cast<int64_t>(p.channels) == 0 &&  // rows of 16-channel blocks
      ChannelBlockChains::with(p.kinds, blocks)) {
    return;
  }
  channel_chains<Out>(x, add, n, p, v, addend);
}

// The kernels' bodies (namespace body), inlined into one function per ISA by the ISA units (isa.h, kernels.h):
// for AVX2 and the baseline, those of the channels-last products also for AVX-512.
namespace body {

// y[begin:end] = the steps (channel c's own where `per` is not empty) applied to x * scales[c] + bias[c] (c the
// axis-1 index of x (N, C, inner...); no bias or no scales: null), in chunks that stay in the L1 cache. Any range
// gives the same elements as the whole: calls on disjoint ranges may run in parallel.
CVM_KERNEL_BODY void requantize(const int32_t* x, int64_t begin, int64_t end, const int32_t* bias,
                                const int32_t* scales, int64_t channels, int64_t inner,
                                const std::vector<RequantStep>& steps, int32_t* y, const ChannelSteps& per) {
  const bool per_channel = bias || scales || !per.empty();
  for (int64_t start = begin; start < end;) {
    const int64_t plane = per_channel ? start / inner : 0;
    const int64_t stop = std::min({end, start + 1024, per_channel ? (plane + 1) * inner : end});
    const uint32_t add = bias ? static_cast<uint32_t>(bias[plane % channels]) : 0u;
    const uint32_t mul = scales ? static_cast<uint32_t>(scales[plane % channels]) : 1u;
    int32_t* v = y + start;
    const int64_t n = stop - start;
    if (scales) {
      for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(static_cast<uint32_t>(x[start + i]) * mul + add);
    } else {
      for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(static_cast<uint32_t>(x[start + i]) + add);
    }
    apply_steps_fast(v, n, per.empty() ? steps : per[plane % channels]);
    start = stop;
  }
}

// The rows [begin, end) of y (rows of `width`) = the steps applied to the first `width` elements of the same rows of
// x (rows of `row` >= width) + bias[c], c = (r / rows_per_plane) % channels for row r (no bias: bias null). Short
// rows are gathered into chunks of about 1024 elements, so that each step's loop stays long.
CVM_KERNEL_BODY void requantize_rows(const int32_t* x, int64_t row, int64_t width, int64_t begin, int64_t end,
                                     const int32_t* bias, int64_t channels, int64_t rows_per_plane,
                                     const std::vector<RequantStep>& steps, int32_t* y) {
  const int64_t group = std::max<int64_t>(1, 1024 / width);
  for (int64_t first = begin; first < end; first += group) {
    const int64_t last = std::min(end, first + group);
    for (int64_t r = first; r < last; ++r) {
      const uint32_t add = bias ? static_cast<uint32_t>(bias[(r / rows_per_plane) % channels]) : 0u;
      const int32_t* u = x + r * row;
      int32_t* v = y + r * width;
      for (int64_t i = 0; i < width; ++i) v[i] = static_cast<int32_t>(static_cast<uint32_t>(u[i]) + add);
    }
    apply_steps_fast(y + first * width, (last - first) * width, steps);
  }
}


// Channels innermost (NHWC, or the (N, P, C) products of the rows route): y[i] = the steps applied to
// x[i] * scales[c] + bias[c], c = i % channels (no scales or no bias: null), for the rows [begin, end) of
// `channels` values (x holds them from row `begin` on; every other pointer from row 0), in chunks of about 1024
// values (ending where the bias rows wrap around). positions > 0: the bias is per position and channel, (P, C), row
// r's the bias row r % positions. `per` not empty: channel c's own steps, in one pass with the bias, the addend's
// and the narrowing where `arrays` holds them and there are no scales and no bias (C,), else applied to the chunk's
// values of channel c gathered side by side (then put back); `per` empty, no scales and no bias: one pass too where
// the steps are of uniform_chain's kinds. addend not null: each chunk then gets the addend's (Addend). bytes not
// null: y is written there as bytes instead (y unused), each chunk narrowed from int32; the caller proves every
// value in [0, 255].
CVM_KERNEL_BODY void requantize_last(const int32_t* x, int64_t begin, int64_t end, const int32_t* bias_all,
                                       const int32_t* scales, int64_t channels, const std::vector<RequantStep>& steps,
                                       int32_t* y, int64_t positions, const ChannelSteps& per,
                                       const ChannelArrays& arrays, uint8_t* bytes, const Addend* addend) {
  const int64_t group = std::max<int64_t>(1, 1024 / channels);
  const bool fused = !arrays.kinds.empty() && !scales && (positions > 0 || !bias_all);
  const bool one_chain = per.empty() && !scales && !bias_all;  // uniform_chain, where its kinds are the steps'
  std::vector<int32_t> lane, chunk, second;  // the steps' loops' values (sized where used)
  for (int64_t first = begin, last = 0; first < end; first = last) {
    last = std::min({end, first + group, positions > 0 ? (first / positions + 1) * positions : end});
    const int64_t count = last - first, at = first * channels, n = count * channels;
    const int32_t* u = x + (first - begin) * channels;  // the chunk's values
    std::optional<Addend> from;  // the addend from the chunk's first value on
    if (addend) {
      from.emplace(Addend{addend->x ? addend->x + at : nullptr, addend->bytes ? addend->bytes + at : nullptr,
                          addend->steps, addend->after});
    }
    const Addend* chunk_addend = from ? &*from : nullptr;
    if (fused) {  // the bias, the steps, the addend's and the narrowing in one pass, in registers
      const int32_t* bias = bias_all ? bias_all + (first % positions) * channels : nullptr;
      if (bytes) {
        apply_channel_arrays(u, bias, n, arrays, bytes + at, chunk_addend);
      } else {
        apply_channel_arrays(u, bias, n, arrays, y + at, chunk_addend);
      }
      continue;
    }
    if (one_chain && (bytes ? uniform_chain(u, n, steps, bytes + at, chunk_addend)
                            : uniform_chain(u, n, steps, y + at, chunk_addend))) {
      continue;  // the steps, the addend's and the narrowing in one pass, in registers
    }
    if (bytes) chunk.resize(static_cast<size_t>(n));
    int32_t* v = bytes ? chunk.data() : y + at;
    for (int64_t r = 0; r < count; ++r) {
      const int32_t* bias = bias_all && positions ? bias_all + ((first + r) % positions) * channels : bias_all;
      const int32_t* row = u + r * channels;
      int32_t* w = v + r * channels;
      if (scales) {
        for (int64_t c = 0; c < channels; ++c) {
          w[c] = static_cast<int32_t>(static_cast<uint32_t>(row[c]) * static_cast<uint32_t>(scales[c]) +
                                      static_cast<uint32_t>(bias ? bias[c] : 0));
        }
      } else if (bias) {
        for (int64_t c = 0; c < channels; ++c) w[c] = static_cast<int32_t>(static_cast<uint32_t>(row[c]) +
                                                                           static_cast<uint32_t>(bias[c]));
      } else {
        std::copy(row, row + channels, w);
      }
    }
    if (per.empty()) {
      apply_steps_fast(v, n, steps);
    } else if (!arrays.kinds.empty()) {
      apply_channel_arrays(v, nullptr, n, arrays, v);
    } else {
      lane.resize(static_cast<size_t>(count));
      for (int64_t c = 0; c < channels; ++c) {
        for (int64_t r = 0; r < count; ++r) lane[r] = v[r * channels + c];
        apply_steps_fast(lane.data(), count, per[c]);
        for (int64_t r = 0; r < count; ++r) v[r * channels + c] = lane[r];
      }
    }
    if (addend) {
      second.resize(static_cast<size_t>(n));
      if (addend->x) {
        std::copy_n(addend->x + at, n, second.data());
      } else {
        std::copy_n(addend->bytes + at, n, second.data());
      }
      apply_steps_fast(second.data(), n, addend->steps);
      for (int64_t i = 0; i < n; ++i) {
        v[i] = static_cast<int32_t>(static_cast<uint32_t>(v[i]) + static_cast<uint32_t>(second[i]));
      }
      apply_steps_fast(v, n, addend->after);
    }
    if (bytes) {
      uint8_t* out = bytes + at;
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(v[i]);
    }
  }
}

// dst[j * dst_stride + i] = src[i * src_stride + j] for a 4 x 4 block of int32 (SSE2 unpacks on x86-64).
inline void transpose4x4(const int32_t* src, int64_t src_stride, int32_t* dst, int64_t dst_stride) {
#if defined(__SSE2__)
  const __m128i r0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  const __m128i r1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + src_stride));
  const __m128i r2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * src_stride));
  const __m128i r3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 3 * src_stride));
  const __m128i a0 = _mm_unpacklo_epi32(r0, r1), a1 = _mm_unpacklo_epi32(r2, r3);
  const __m128i a2 = _mm_unpackhi_epi32(r0, r1), a3 = _mm_unpackhi_epi32(r2, r3);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm_unpacklo_epi64(a0, a1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + dst_stride), _mm_unpackhi_epi64(a0, a1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * dst_stride), _mm_unpacklo_epi64(a2, a3));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 3 * dst_stride), _mm_unpackhi_epi64(a2, a3));
#else
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) dst[j * dst_stride + i] = src[i * src_stride + j];
  }
#endif
}

// Transposed products (the rows route): x holds (N, P, C) (each position's C channels together), y (N, C, P).
// y[n, c, p] = the steps (channel c's own where `per` is not empty) applied to x[n, p, c] + bias[c] (no bias:
// null), for the positions [begin, end) of image n, in blocks of about 1024 elements: the block's steps on the
// (position, channel) order, then written out channel by channel (with `per`: written out, then each channel's
// steps on its positions). per_position: the bias is (P, C), x[n, p, c] + bias[p, c]. `arrays` (``per`` of one
// sequence of kinds): the bias (none or per position) and the steps in one pass, before the block is written out.
CVM_KERNEL_BODY void requantize_transposed(const int32_t* x, int64_t positions, int64_t channels, int64_t n,
                                             int64_t begin, int64_t end, const int32_t* bias,
                                             const std::vector<RequantStep>& steps, int32_t* y,
                                             const ChannelSteps& per, bool per_position,
                                             const ChannelArrays& arrays) {
  const int64_t block = std::max<int64_t>(1, 1024 / channels);
  std::vector<int32_t> v(static_cast<size_t>(block * channels));
  for (int64_t first = begin; first < end; first += block) {
    const int64_t count = std::min(end, first + block) - first;
    const int32_t* u = x + (n * positions + first) * channels;
    if (!arrays.kinds.empty() && (!bias || per_position)) {  // the bias and the steps in one pass
      apply_channel_arrays(u, bias ? bias + first * channels : nullptr, count * channels, arrays, v.data());
    } else {
      for (int64_t p = 0; p < count; ++p) {
        const int32_t* b = bias && per_position ? bias + (first + p) * channels : bias;
        for (int64_t c = 0; c < channels; ++c) {
          v[p * channels + c] = static_cast<int32_t>(static_cast<uint32_t>(u[p * channels + c]) +
                                                     static_cast<uint32_t>(b ? b[c] : 0));
        }
      }
      if (per.empty()) {
        apply_steps_fast(v.data(), count * channels, steps);
      } else if (!arrays.kinds.empty()) {
        apply_channel_arrays(v.data(), nullptr, count * channels, arrays, v.data());
      }
    }
    int32_t* dst = y + n * channels * positions + first;  // dst[c * positions + p] = v[p * channels + c]
    const int64_t c4 = channels - channels % 4, p4 = count - count % 4;
    for (int64_t c = 0; c < c4; c += 4) {
      for (int64_t p = 0; p < p4; p += 4) transpose4x4(v.data() + p * channels + c, channels, dst + c * positions + p,
                                                       positions);
    }
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t p = c < c4 ? p4 : 0; p < count; ++p) dst[c * positions + p] = v[p * channels + c];
    }
    if (!per.empty() && arrays.kinds.empty()) {
      for (int64_t c = 0; c < channels; ++c) apply_steps_fast(dst + c * positions, count, per[c]);
    }
  }
}

}  // namespace body

}  // namespace cvm_onnx
