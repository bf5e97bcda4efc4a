// The path a requantize op's chains take in the CPU kernels (requantize.h), as the kernels choose it: the chains in
// the kernels' form (kernel_chains, addend_chains) matched by the kernels' own matchers (CvmChains,
// ChannelBlockChains, with_end, LaneSteps). For cvm_onnx.native.chain_path (ctypes): the route map prints it and
// the tests check that every chain the exporter writes is on a fast path. Where a kernel also asks the data (a
// multiple of 16 values for uniform_chain, whole rows for channel_blocks), the path is the one it takes where the
// data allows.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "requantize.h"

namespace cvm_onnx {
namespace {

// How a chain runs: one loop over the values per step (apply_steps, the generic path), on values kept in registers
// with a dispatch on each step's kind (kinds known at run time), or in one pass compiled for its kinds.
enum PathSpeed : int { kStepLoops = 0, kRunTimeKinds = 1, kCompiledKinds = 2 };

struct Path {
  int speed;
  std::string text;
};

std::string kinds_text(const std::vector<int64_t>& kinds) {
  // (cvm_onnx.native.STEP_KINDS)
  static const char* const names[] = {"shift", "multiply", "add", "clip", "mul64", "even"};
  std::string out;
  for (const int64_t k : kinds) {
    const std::string name = k >= 0 && k <= kEven ? names[k] : k == kMul64Narrow ? "mul64 narrow"
                             : k == kMul64Narrow2 ? "mul64 narrow2" : std::to_string(k);
    out += (out.empty() ? "" : " > ") + name;
  }
  return out.empty() ? "no steps" : out;
}

std::vector<int64_t> kinds_of(const std::vector<RequantStep>& steps) {
  std::vector<int64_t> kinds;
  for (const RequantStep& s : steps) kinds.push_back(s.kind);
  return kinds;
}

// One list of steps, as apply_steps_fast and uniform_chain take it: one pass where CvmChains or EvenChains holds its
// kinds, or where it is one step or none (apply_steps' loop for that kind).
Path one_list(const std::vector<RequantStep>& steps) {
  const bool compiled =
      steps.size() <= 1 || CvmChains::with(steps, [](auto) {}) || EvenChains::with(steps, [](auto) {});
  return {compiled ? kCompiledKinds : kStepLoops,
          std::string(compiled ? "one pass" : "step loops") + " (" + kinds_text(kinds_of(steps)) + ")"};
}

// What follows the chain with an addend (its data uint8 where `bytes`): with_end's choice after channel_blocks
// (`blocks`), else AnyEnd's (uniform_chain).
Path end_of(const AddendSteps& chains, bool bytes, bool blocks) {
  static const int32_t word = 0;
  static const uint8_t byte = 0;
  const std::vector<RequantStep>& steps = bytes ? chains.bytes : chains.words;
  const Addend addend{bytes ? nullptr : &word, bytes ? &byte : nullptr, steps, chains.after};
  const std::string text = " (" + kinds_text(kinds_of(steps)) + "; add; " + kinds_text(kinds_of(chains.after)) + ")";
  bool compiled = false;
  if (blocks) {
    with_end(&addend, [&](const auto& end) {
      compiled = !std::is_same_v<std::decay_t<decltype(end)>, AnyEnd>;
    });
  }
  if (compiled) return {kCompiledKinds, "compiled end" + text};
  const AnyEnd end(&addend);
  if (end.steps.fits && end.after.fits) return {kRunTimeKinds, "lane end" + text};
  return {kStepLoops, "loops end" + text};
}

// The path of a requantize op's chains: `steps`, or each channel's (`per`), with an addend's after them or not.
Path chain_path(std::vector<RequantStep> steps, ChannelSteps per, bool channels_last, const AddendSteps* addend,
                bool addend_bytes) {
  const ChannelArrays arrays = kernel_chains(steps, per);
  Path main;
  bool blocks = false;
  if (per.empty()) {
    main = one_list(steps);
  } else if (channels_last && !arrays.kinds.empty()) {  // apply_channel_arrays
    blocks = arrays.channels % kLanes == 0 && ChannelBlockChains::with(arrays.kinds, [](auto) {});
    main = {blocks ? kCompiledKinds : kRunTimeKinds,
            std::string(blocks ? "16-channel blocks" : "channel lanes") + " (" + kinds_text(arrays.kinds) + "; " +
                std::to_string(arrays.channels) + " channels)"};
  } else {  // each channel's own chain (apply_steps_fast)
    size_t compiled = 0;
    for (const std::vector<RequantStep>& chain : per) compiled += one_list(chain).speed == kCompiledKinds;
    main = {compiled == per.size() ? kCompiledKinds : kStepLoops,
            "per channel: " + std::to_string(compiled) + " of " + std::to_string(per.size()) + " in one pass (" +
                kinds_text(kinds_of(per[0])) + (arrays.kinds.empty() ? ", kinds differ)" : ")")};
  }
  if (addend == nullptr) return main;
  const Path end = end_of(*addend, addend_bytes, blocks);
  return {std::min(main.speed, end.speed), main.text + ", " + end.text};
}

std::vector<int64_t> ints(const int64_t* p, int64_t n) {
  return n > 0 ? std::vector<int64_t>(p, p + n) : std::vector<int64_t>{};
}

}  // namespace
}  // namespace cvm_onnx

// The path of a requantize op's chains in the CPU kernels: its attributes steps, channel_counts and channel_steps,
// addend_steps and sum_steps ((kind, a, b) triples; n each one's length), channels_last (1: the op runs with the
// channels innermost: nhwc, rows or a conv_requantize op), addend (0: none, 1: int32, 2: uint8). Returns 2 (every
// chain compiled for its kinds), 1 (some chain's kinds taken at run time, in registers), 0 (some chain in one loop per
// step) or -1 (the chains are not valid), and writes the path's description (or the error) to text[0:capacity].
extern "C" __attribute__((visibility("default"))) int cvm_onnx_chain_path(
    const int64_t* steps, int64_t steps_n, const int64_t* counts, int64_t counts_n, const int64_t* channel_steps,
    int64_t channel_steps_n, const int64_t* addend_steps, int64_t addend_steps_n, const int64_t* sum_steps,
    int64_t sum_steps_n, int channels_last, int addend, char* text, int64_t capacity) {
  using namespace cvm_onnx;
  Path path{-1, ""};
  std::vector<RequantStep> one, words, sum;
  ChannelSteps per;
  std::string err = parse_steps(ints(steps, steps_n), one);
  const std::vector<int64_t> all = ints(channel_steps, channel_steps_n);
  int64_t at = 0;
  for (const int64_t count : ints(counts, counts_n)) {
    if (!err.empty() || count < 0 || 3 * count > channel_steps_n - at) {
      err = err.empty() ? "channel_counts must count the triples of channel_steps" : err;
      break;
    }
    per.emplace_back();
    err = parse_steps(std::vector<int64_t>(all.begin() + at, all.begin() + at + 3 * count), per.back());
    at += 3 * count;
  }
  if (err.empty() && at != channel_steps_n) err = "channel_counts must count the triples of channel_steps";
  if (err.empty()) err = parse_steps(ints(addend_steps, addend_steps_n), words);
  if (err.empty()) err = parse_steps(ints(sum_steps, sum_steps_n), sum);
  if (err.empty()) {
    const AddendSteps chains = addend_chains(words, sum);
    path = chain_path(one, per, channels_last != 0, addend ? &chains : nullptr, addend == 2);
  }
  const std::string& out = err.empty() ? path.text : err;
  if (capacity > 0) {
    const size_t n = std::min(out.size(), static_cast<size_t>(capacity - 1));
    std::memcpy(text, out.data(), n);
    text[n] = '\0';
  }
  return path.speed;
}
