// The cvm.native onnxruntime custom-op library: non_max_suppression, get_valid_counts and cvm_lut on int32
// tensors, with the CVM runtime's FORMAL semantics (docs/custom_ops.md states them), and im2col_int8 /
// im2col_uint8, which gather convolution windows for the serving form's integer products (CPU only).
//
// Built against onnxruntime's C and C++ API headers without linking libonnxruntime (ORT_API_MANUAL_INIT): the C API
// function table comes from the runtime that loads the library through RegisterCustomOps. Every op has a CPU
// kernel; with CVM_ONNX_WITH_CUDA it also has a CUDAExecutionProvider kernel (cvm_ops_cuda.cu). Inputs are never
// modified.
//
// Hostile nodes are refused, never run: every input and output is declared required, so onnxruntime refuses a node
// with an absent input ('') when it loads the model; each kernel's entry reads its inputs as tensors of the element
// types its Compute declares (Tensor, NativeOp), then the kernel checks their ranks and shapes, and the attributes
// are read as ints only. Each refusal is an onnxruntime error status.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <algorithm>
#include <atomic>
#include <climits>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

#include "conv.h"
#include "cvm_kernels.h"
#include "kernels.h"
#include "winograd.h"
#ifdef CVM_ONNX_WITH_CUDA
#include "cvm_cuda.h"
#endif

namespace cvm_onnx {

namespace {

constexpr const char* kDomain = "cvm.native";

Ort::Status invalid(const char* op, const std::string& message) {
  return Ort::Status((std::string(op) + ": " + message).c_str(), ORT_INVALID_ARGUMENT);
}

// Runs a kernel body, turning any exception into an error status (nothing is thrown across the C API).
template <typename Body>
Ort::Status guarded(const char* op, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return invalid(op, e.what());
  }
}

// Runs body(i) for i in [0, items) on the session's intra-op threads (inline with one thread or one item). The
// bodies write disjoint outputs and throw nothing, so the result is the same for any number of threads.
template <typename Body>
void parallel_for(OrtKernelContext* context, int64_t items, Body& body) {
  if (items == 1) return body(0);  // (onnxruntime's dispatch costs more than a small kernel)
  Ort::KernelContext(context).ParallelFor([](void* b, size_t i) { (*static_cast<Body*>(b))(static_cast<int64_t>(i)); },
                                          static_cast<size_t>(items), 0, &body);
}

// The CPUs this process may run on (at least one).
int64_t usable_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

// -- attributes ------------------------------------------------------------------------------------------------
bool attr_present(const OrtApi& api, const OrtKernelInfo* info, const char* name) {
  float f = 0;
  size_t size = 0;
  OrtStatus* probes[] = {
      api.KernelInfoGetAttribute_float(info, name, &f),
      api.KernelInfoGetAttribute_string(info, name, nullptr, &size),
      api.KernelInfoGetAttributeArray_int64(info, name, nullptr, &size),
  };
  bool present = false;
  for (OrtStatus* status : probes) {
    present = present || status == nullptr;
    api.ReleaseStatus(status);
  }
  return present;
}

// An int attribute; absent gives `fallback`, a value of another type (float, string, list) is an error.
int64_t int_attr(const OrtKernelInfo* info, const char* name, int64_t fallback) {
  const OrtApi& api = Ort::GetApi();
  int64_t value = 0;
  OrtStatus* status = api.KernelInfoGetAttribute_int64(info, name, &value);
  if (status == nullptr) return value;
  api.ReleaseStatus(status);
  if (attr_present(api, info, name)) {
    throw Ort::Exception("attribute " + std::string(name) + " must be an int", ORT_INVALID_ARGUMENT);
  }
  return fallback;
}

// An int list attribute; absent gives `fallback`, a value of another type is an error.
std::vector<int64_t> ints_attr(const OrtKernelInfo* info, const char* name, std::vector<int64_t> fallback) {
  const OrtApi& api = Ort::GetApi();
  size_t size = 0;
  OrtStatus* status = api.KernelInfoGetAttributeArray_int64(info, name, nullptr, &size);
  if (status != nullptr) {
    api.ReleaseStatus(status);
    if (attr_present(api, info, name)) {
      throw Ort::Exception("attribute " + std::string(name) + " must be a list of ints", ORT_INVALID_ARGUMENT);
    }
    return fallback;
  }
  std::vector<int64_t> values(size);
  if (size > 0) Ort::ThrowOnError(api.KernelInfoGetAttributeArray_int64(info, name, values.data(), &size));
  return values;
}

NmsAttrs read_nms_attrs(const OrtKernelInfo* info) {
  NmsAttrs a;
  a.max_output_size = int_attr(info, "max_output_size", a.max_output_size);
  a.iou_threshold = int_attr(info, "iou_threshold", a.iou_threshold);
  a.force_suppress = int_attr(info, "force_suppress", 0) != 0;
  a.top_k = int_attr(info, "top_k", a.top_k);
  return a;
}

// -- the kernels' arguments ------------------------------------------------------------------------------------
template <typename T>
constexpr ONNXTensorElementDataType kElementType = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
template <>
constexpr ONNXTensorElementDataType kElementType<int32_t> = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
template <>
constexpr ONNXTensorElementDataType kElementType<uint8_t> = ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
template <>
constexpr ONNXTensorElementDataType kElementType<int8_t> = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;

// A Compute argument: input or output `index` of the kernel context, a tensor of T. An input (read) has its shape
// and data, read with one type-and-shape query; an output has its data once Allocate gives it a shape.
template <typename T>
class Tensor {
 public:
  Tensor(OrtKernelContext* context, size_t index) : context_(context), index_(index) {}

  // Reads input `index`: an error message, empty when it is a present tensor of T.
  std::string read() {
    const OrtApi& api = Ort::GetApi();
    const OrtValue* value = nullptr;
    Ort::ThrowOnError(api.KernelContext_GetInput(context_, index_, &value));
    if (value == nullptr) return "input " + std::to_string(index_) + " is absent";
    int is_tensor = 0;
    Ort::ThrowOnError(api.IsTensor(value, &is_tensor));
    ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    if (is_tensor) {
      const Ort::TensorTypeAndShapeInfo info = Ort::ConstValue(value).GetTensorTypeAndShapeInfo();
      type = info.GetElementType();
      shape_ = info.GetShape();
    }
    if (type != kElementType<T>) {
      return "input " + std::to_string(index_) + " must be an " + (std::is_same_v<T, int32_t> ? "int32" : "uint8") +
             " tensor";
    }
    void* data = nullptr;
    Ort::ThrowOnError(api.GetTensorMutableData(const_cast<OrtValue*>(value), &data));
    data_ = static_cast<T*>(data);
    return {};
  }

  const std::vector<int64_t>& Shape() const { return shape_; }
  const T* Data() const { return data_; }
  int64_t NumberOfElement() const {
    return std::accumulate(shape_.begin(), shape_.end(), int64_t{1}, std::multiplies<int64_t>());
  }

  // The output's data, allocated with `shape` on the first call (later calls: the same data).
  T* Allocate(const std::vector<int64_t>& shape) {
    if (data_ == nullptr) {
      data_ = Ort::KernelContext(context_).GetOutput(index_, shape).template GetTensorMutableData<T>();
      shape_ = shape;
    }
    return data_;
  }

 private:
  OrtKernelContext* context_;
  size_t index_;
  std::vector<int64_t> shape_;
  T* data_ = nullptr;
};

using Int32Tensor = Tensor<int32_t>;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::string check_nms(const std::vector<int64_t>& data, const std::vector<int64_t>& valid_count) {
  if (data.size() != 3 || data[2] != kRow) return "data must have shape (B, N, 6), got " + shape_text(data);
  if (valid_count.size() != 1 || valid_count[0] != data[0]) {
    return "valid_count must have shape (B,) = (" + std::to_string(data[0]) + ",), got " + shape_text(valid_count);
  }
  return {};
}

std::string check_valid_counts(const std::vector<int64_t>& data) {
  if (data.size() != 3 || data[2] < 2) return "data must have shape (B, N, K) with K >= 2, got " + shape_text(data);
  return {};
}

std::string check_lut(int64_t table_size) { return table_size > 0 ? std::string{} : "the table is empty"; }

// -- CPU kernels ------------------------------------------------------------------------------------------------
// One batch of non_max_suppression: x and y are (N, 6) rows. Without force_suppress only kept rows of the
// candidate's id can suppress it, so kept rows are also listed per id (same result, far fewer IoUs).
void nms_batch(const int32_t* x, int32_t valid_count, int64_t n, int32_t* y, const NmsAttrs& a) {
  const int64_t t = std::clamp<int64_t>(valid_count, 0, n);
  std::vector<int64_t> order(static_cast<size_t>(t));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [x](int64_t i, int64_t j) { return x[i * kRow + kScore] > x[j * kRow + kScore]; });
  const int64_t p_max = a.top_k >= 0 ? std::min(t, a.top_k) : t;
  const int64_t n_max = a.max_output_size >= 0 ? std::min(t, a.max_output_size) : t;
  std::vector<int64_t> all;
  std::unordered_map<int32_t, std::vector<int64_t>> by_id;
  int64_t kept = 0;
  for (int64_t p = 0; p < p_max && kept < n_max; ++p) {
    const int32_t* cand = x + order[p] * kRow;
    if (cand[kId] < 0) continue;
    std::vector<int64_t>& rivals = a.force_suppress ? all : by_id[cand[kId]];
    const bool dropped = std::any_of(rivals.begin(), rivals.end(), [&](int64_t k) {
      return suppresses(y + k * kRow, cand, a.force_suppress, a.iou_threshold);
    });
    if (dropped) continue;
    std::copy(cand, cand + kRow, y + kept * kRow);
    rivals.push_back(kept++);
  }
  std::fill(y + kept * kRow, y + n * kRow, -1);
}

struct NonMaxSuppression {
  NonMaxSuppression(const OrtApi*, const OrtKernelInfo* info) : attrs(read_nms_attrs(info)) {}

  Ort::Status Compute(const Int32Tensor& data, const Int32Tensor& valid_count, Int32Tensor& out) {
    return guarded("non_max_suppression", [&] {
      const std::vector<int64_t>& shape = data.Shape();
      if (std::string err = check_nms(shape, valid_count.Shape()); !err.empty()) {
        return invalid("non_max_suppression", err);
      }
      const int64_t batches = shape[0], n = shape[1];
      int32_t* y = out.Allocate(shape);
      for (int64_t b = 0; b < batches; ++b) {
        nms_batch(data.Data() + b * n * kRow, valid_count.Data()[b], n, y + b * n * kRow, attrs);
      }
      return Ort::Status{nullptr};
    });
  }

  NmsAttrs attrs;
};

struct GetValidCounts {
  GetValidCounts(const OrtApi*, const OrtKernelInfo* info) : score_threshold(int_attr(info, "score_threshold", 0)) {}

  Ort::Status Compute(const Int32Tensor& data, Int32Tensor& valid_count, Int32Tensor& out) {
    return guarded("get_valid_counts", [&] {
      const std::vector<int64_t>& shape = data.Shape();
      if (std::string err = check_valid_counts(shape); !err.empty()) return invalid("get_valid_counts", err);
      const int64_t batches = shape[0], n = shape[1], k = shape[2];
      int32_t* counts = valid_count.Allocate({batches});
      int32_t* y = out.Allocate(shape);
      const int32_t* x = data.Data();
      for (int64_t b = 0; b < batches; ++b) {
        int32_t* yb = y + b * n * k;
        int64_t c = 0;
        for (const int32_t* row = x + b * n * k; row != x + (b + 1) * n * k; row += k) {
          if (row[kScore] > score_threshold) std::copy(row, row + k, yb + c++ * k);
        }
        counts[b] = static_cast<int32_t>(c);
        std::fill(yb + c * k, yb + n * k, -1);
      }
      return Ort::Status{nullptr};
    });
  }

  int64_t score_threshold;
};

struct Lut {
  Lut(const OrtApi*, const OrtKernelInfo*) {}

  Ort::Status Compute(const Int32Tensor& indices, const Int32Tensor& table, Int32Tensor& out) {
    return guarded("cvm_lut", [&] {
      const int64_t size = table.NumberOfElement();
      if (std::string err = check_lut(size); !err.empty()) return invalid("cvm_lut", err);
      int32_t* y = out.Allocate(indices.Shape());
      const int32_t* idx = indices.Data();
      const int32_t* tab = table.Data();
      for (int64_t i = 0, count = indices.NumberOfElement(); i < count; ++i) y[i] = tab[lut_index(idx[i], size)];
      return Ort::Status{nullptr};
    });
  }
};

// The im2col attributes (as ONNX Conv's, wide and batch_inner), checked for their lengths and values 0/1.
Im2colShape read_im2col_attrs(const OrtKernelInfo* info, const char* name) {
  Im2colShape geometry;
  const std::vector<int64_t> kernel = ints_attr(info, "kernel_shape", {});
  const std::vector<int64_t> strides = ints_attr(info, "strides", {1, 1});
  const std::vector<int64_t> dilations = ints_attr(info, "dilations", {1, 1});
  const std::vector<int64_t> pads = ints_attr(info, "pads", {0, 0, 0, 0});
  if (kernel.size() != 2 || strides.size() != 2 || dilations.size() != 2 || pads.size() != 4) {
    throw Ort::Exception(std::string(name) + ": kernel_shape (2 ints, required), strides (2), dilations (2) and "
                         "pads (4) have the wrong length", ORT_INVALID_ARGUMENT);
  }
  geometry.kh = kernel[0], geometry.kw = kernel[1], geometry.sh = strides[0], geometry.sw = strides[1];
  geometry.dh = dilations[0], geometry.dw = dilations[1];
  geometry.pt = pads[0], geometry.pl = pads[1], geometry.pb = pads[2], geometry.pr = pads[3];
  geometry.group = int_attr(info, "group", 1);
  const int64_t wide = int_attr(info, "wide", 0);
  if (wide != 0 && wide != 1) throw Ort::Exception(std::string(name) + ": wide must be 0 or 1", ORT_INVALID_ARGUMENT);
  geometry.wide = wide == 1;
  const int64_t batch_inner = int_attr(info, "batch_inner", 0);
  if (batch_inner != 0 && batch_inner != 1) {
    throw Ort::Exception(std::string(name) + ": batch_inner must be 0 or 1", ORT_INVALID_ARGUMENT);
  }
  geometry.batch_inner = batch_inner == 1;
  return geometry;
}

// The geometry of data (N, C, H, W) for the attributes in `attrs`: an error message, empty when valid.
std::string im2col_shape(const std::vector<int64_t>& shape, const Im2colShape& attrs, Im2colShape& s) {
  if (shape.size() != 4) return "data must be 4-D (N, C, H, W), got " + shape_text(shape);
  s = attrs;
  s.n = shape[0], s.c = shape[1], s.h = shape[2], s.w = shape[3];
  return im2col_geometry(s);
}

// The columns' shape: (N, G, C/G * kh * kw, positions), or (G, C/G * kh * kw, N * positions) with batch_inner.
std::vector<int64_t> columns_shape(const Im2colShape& s) {
  const int64_t k = s.c / s.group * s.kh * s.kw;
  if (s.batch_inner) return {s.group, k, s.n * s.positions()};
  return {s.n, s.group, k, s.positions()};
}

// im2col_int8 (offset 0) and im2col_uint8 (offset 128): int32 data (N, C, H, W) with values in [-128, 127] ->
// columns (N, G, C/G * kh * kw, OH * OW) holding x + offset, offset in the padding; wide=1: OH * WP columns
// (im2col.h).
template <typename Out, int32_t kOffset>
struct Im2col {
  static constexpr const char* kName = kOffset == 0 ? "im2col_int8" : "im2col_uint8";

  Im2col(const OrtApi*, const OrtKernelInfo* info) : geometry(read_im2col_attrs(info, kName)) {}

  Ort::Status Compute(OrtKernelContext* context, const Int32Tensor& data, Tensor<Out>& out) {
    return guarded(kName, [&] {
      Im2colShape s;
      if (std::string err = im2col_shape(data.Shape(), geometry, s); !err.empty()) return invalid(kName, err);
      const int32_t* x = data.Data();
      std::vector<Out> padded(static_cast<size_t>(s.n * s.c * s.plane_stride()));
      Out* cols = out.Allocate(columns_shape(s));
      std::atomic<int64_t> bad{INT64_MAX};  // the smallest flat index of a value outside [-128, 127]
      auto plane = [&](int64_t p) {
        if (const int64_t i = pad_narrow(x, s, kOffset, p, reinterpret_cast<uint8_t*>(padded.data())); i >= 0) {
          for (int64_t seen = bad.load(); i < seen && !bad.compare_exchange_weak(seen, i);) {}
        } else if (s.wide) {
          im2col_wide(padded.data(), s, p, cols);
        } else {
          im2col(padded.data(), s, p, cols);
        }
      };
      parallel_for(context, s.n * s.c, plane);
      if (const int64_t i = bad.load(); i != INT64_MAX) {
        return invalid(kName, "data value " + std::to_string(x[i]) + " at flat index " + std::to_string(i) +
                                  " is outside [-128, 127]");
      }
      return Ort::Status{nullptr};
    });
  }

  Im2colShape geometry;
};

// A run of steps on a convolution's int32 data (N, H, W, C) before the narrowing (conv_requantize's in_steps,
// in_scales, in_bias): channel c's value x becomes steps(x * scales[c] + bias[c]) (scales, bias empty: none), the
// values requantize with nhwc 1 gives, written straight into the padded copy as bytes; the steps end with a clip
// within the rows' range with offset 0 (ConvKernel checks), so every value is its byte. Empty steps: none.
// With scales or a bias, channel c's chain is mul scales[c], add bias[c], then the steps (per, its arrays: one pass
// in registers, requantize_last's fused path).
struct InputRun {
  std::vector<RequantStep> steps;
  std::vector<int32_t> scales, bias;
  ChannelSteps per;
  ChannelArrays arrays;
};

// im2col_rows (group 1): int32 data (N, C, H, W) -> uint8 rows (N, OH * OW, kh * kw * C) holding x + offset,
// offset in the padding (im2col.h); offset 0 takes values in [0, 127], 128 values in [-128, 127]. zero (-1: none)
// in [0, 255], with offset 0: values in [0, 255] as themselves, `zero` in the padding (a product with that zero
// point reads the padding as 0). In = uint8_t: uint8 data (N, H, W, C) (nhwc 1, a zero), every value as itself.
template <typename In>
struct Im2colRows {
  static constexpr const char* kName = "im2col_rows";
  static constexpr bool kBytes = std::is_same_v<In, uint8_t>;

  // name: the op whose attributes these are (im2col_rows, or a conv_requantize op, which reads the same rows).
  Im2colRows(const OrtApi*, const OrtKernelInfo* info, const char* name = kName)
      : geometry(read_im2col_attrs(info, name)), offset(int_attr(info, "offset", 128)), nhwc(int_attr(info, "nhwc", 0)),
        zero(int_attr(info, "zero", -1)) {
    const auto refuse = [&](const char* rule) {
      throw Ort::Exception(std::string(name) + ": " + rule, ORT_INVALID_ARGUMENT);
    };
    if (offset != 0 && offset != 128) refuse("offset must be 0 or 128");
    if (zero != -1 && (zero < 0 || zero > 255 || offset != 0)) refuse("zero must be -1, or in [0, 255] with offset 0");
    if (nhwc != 0 && nhwc != 1) refuse("nhwc must be 0 or 1");
    if (kBytes && (nhwc != 1 || zero < 0)) refuse("uint8 data needs nhwc 1 and a zero");
    if (geometry.group != 1 || geometry.wide || geometry.batch_inner) refuse("group must be 1, wide and batch_inner 0");
  }

  Ort::Status Compute(OrtKernelContext* context, const Tensor<In>& data, Tensor<uint8_t>& out) {
    return guarded(kName, [&] {
      Im2colShape s;
      thread_local std::vector<uint8_t> padded;
      if (Ort::Status status = pad(context, data, kName, s, padded); !status.IsOK()) return status;
      uint8_t* rows = out.Allocate({s.n, s.oh * s.ow, s.kh * s.kw * s.c});
      const uint8_t* xp = padded.data();  // (a lambda on another thread would name that thread's `padded`)
      auto row = [&](int64_t r) { im2col_rows(xp, s, r / s.oh, r % s.oh, rows); };
      parallel_for(context, s.n * s.oh, row);
      return Ort::Status{nullptr};
    });
  }

  // The geometry of data in s, for op `name`.
  Ort::Status shape_of(const Tensor<In>& data, const char* name, Im2colShape& s) const {
    const std::vector<int64_t>& shape = data.Shape();
    if (shape.size() != 4) {
      return invalid(name, std::string("data must be 4-D ") + (nhwc ? "(N, H, W, C)" : "(N, C, H, W)") + ", got " +
                               shape_text(shape));
    }
    s = geometry;
    s.n = shape[0], s.c = shape[nhwc ? 3 : 1], s.h = shape[nhwc ? 1 : 2], s.w = shape[nhwc ? 2 : 3];
    if (std::string err = im2col_geometry(s); !err.empty()) return invalid(name, err);
    return Ort::Status{nullptr};
  }

  // Image n of x (data of the geometry s) padded into image n's place of xp (HP * WP * C bytes per image, every
  // byte written): the flat index in x of a value outside the data's range, or -1.
  int64_t pad_image(const In* x, const Im2colShape& s, int64_t n, uint8_t* xp) const {
    const uint8_t fill = static_cast<uint8_t>(zero >= 0 ? zero : offset);
    if constexpr (kBytes) {
      pad_copy_nhwc(x, s, fill, n, xp);
      return -1;
    } else {
      if (!before.steps.empty()) {  // (nhwc, offset 0: the bytes are the values, within range by the last clip)
        thread_local std::vector<uint8_t> image;  // the image's bytes, (H, W, C), then copied into its padded place
        const int64_t positions = s.h * s.w;
        if (image.size() < static_cast<size_t>(positions * s.c)) image.resize(static_cast<size_t>(positions * s.c));
        requantize_last(x + n * positions * s.c, 0, positions, nullptr, nullptr, s.c, before.steps, nullptr, 0,
                        before.per, before.arrays, image.data(), nullptr);
        pad_copy_nhwc(image.data(), s, fill, 0, xp + n * s.hp() * s.wp() * s.c);
        return -1;
      }
      const int32_t lo = offset == 0 ? 0 : -128, hi = zero >= 0 ? 255 : 127;
      return nhwc ? pad_narrow_nhwc(x, s, lo, hi, static_cast<uint32_t>(offset), fill, n, xp)
                  : pad_narrow_hwc(x, s, lo, hi, static_cast<uint32_t>(offset), fill, n, xp);
    }
  }

  // The error of op `name` for the value x[i] outside the data's range.
  Ort::Status outside(const char* name, const In* x, int64_t i) const {
    const int32_t lo = offset == 0 ? 0 : -128, hi = zero >= 0 ? 255 : 127;
    return invalid(name, "data value " + std::to_string(x[i]) + " at flat index " + std::to_string(i) +
                             " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }

  // The geometry of data in s and its padded copy (pad_all), for op `name`.
  Ort::Status pad(OrtKernelContext* context, const Tensor<In>& data, const char* name, Im2colShape& s,
                  std::vector<uint8_t>& buffer) const {
    if (Ort::Status status = shape_of(data, name, s); !status.IsOK()) return status;
    return pad_all(context, data.Data(), name, s, buffer);
  }

  // The padded copy of x (data of the geometry s), (HP, WP, C) bytes per image (pad_narrow_hwc), in buffer (the
  // caller's, kept from call to call; kPaddedSlack bytes more after the last image), for op `name`.
  Ort::Status pad_all(OrtKernelContext* context, const In* x, const char* name, const Im2colShape& s,
                      std::vector<uint8_t>& buffer) const {
    const size_t size = static_cast<size_t>(s.n * s.hp() * s.wp() * s.c + kPaddedSlack);
    if (buffer.size() < size) buffer.resize(size);
    uint8_t* padded = buffer.data();
    std::atomic<int64_t> bad{INT64_MAX};  // the smallest flat index of a value outside the range
    auto image = [&](int64_t n) {
      const int64_t i = pad_image(x, s, n, padded);
      for (int64_t seen = bad.load(); i >= 0 && i < seen && !bad.compare_exchange_weak(seen, i);) {}
    };
    parallel_for(context, s.n, image);
    if (const int64_t i = bad.load(); i != INT64_MAX) return outside(name, x, i);
    return Ort::Status{nullptr};
  }

  Im2colShape geometry;  // the geometry attributes, read and checked as the columns ops read them
  int64_t offset, nhwc, zero;  // nhwc = 1: data (N, H, W, C); zero >= 0: data in [0, 255], zero in the padding
  InputRun before;  // a conv_requantize op's run of its data (none: empty steps), set by ConvKernel
};

// Whether a chain ends with a clip within [0, 255] (its values then bytes).
bool ends_in_bytes(const std::vector<RequantStep>& steps) {
  return !steps.empty() && steps.back().kind == kClip && steps.back().a >= 0 && steps.back().b <= 255;
}

// The AddendSteps (requantize.h) of op `name` (its attributes addend_steps and sum_steps, each a list of (kind, a, b)
// triples); bytes_out: sum_steps must end with a clip within [0, 255] (y written as bytes).
AddendSteps read_addend_steps(const OrtKernelInfo* info, const char* name, bool bytes_out) {
  std::vector<RequantStep> addend, sum;
  for (auto [attr, steps] : {std::pair{"addend_steps", &addend}, std::pair{"sum_steps", &sum}}) {
    if (std::string err = parse_steps(ints_attr(info, attr, {}), *steps); !err.empty()) {
      throw Ort::Exception(std::string(name) + ": " + attr + ": " + err, ORT_INVALID_ARGUMENT);
    }
  }
  if (bytes_out && !ends_in_bytes(sum)) {
    throw Ort::Exception(std::string(name) + ": sum_steps must end with a clip within [0, 255]", ORT_INVALID_ARGUMENT);
  }
  return addend_chains(addend, sum);
}

// The requantize attributes: steps, width, scales, batch_inner, rows, nhwc, channel_counts and channel_steps
// (checked).
struct RequantizeAttrs {
  explicit RequantizeAttrs(const OrtKernelInfo* info)
      : width(int_attr(info, "width", 0)), batch_inner(int_attr(info, "batch_inner", 0)),
        rows(ints_attr(info, "rows", {})), nhwc(int_attr(info, "nhwc", 0)) {
    flat = ints_attr(info, "steps", {});
    if (std::string err = parse_steps(flat, steps); !err.empty()) {
      throw Ort::Exception("requantize: " + err, ORT_INVALID_ARGUMENT);
    }
    if (width < 0) throw Ort::Exception("requantize: width must be >= 0", ORT_INVALID_ARGUMENT);
    for (int64_t v : ints_attr(info, "scales", {})) {
      if (v < INT32_MIN || v > INT32_MAX) throw Ort::Exception("requantize: scales must be int32s", ORT_INVALID_ARGUMENT);
      scales.push_back(static_cast<int32_t>(v));
    }
    if (width > 0 && !scales.empty()) {
      throw Ort::Exception("requantize: width and scales do not go together", ORT_INVALID_ARGUMENT);
    }
    if (batch_inner != 0 && batch_inner != 1) {
      throw Ort::Exception("requantize: batch_inner must be 0 or 1", ORT_INVALID_ARGUMENT);
    }
    if (batch_inner && width > 0) {
      throw Ort::Exception("requantize: width and batch_inner do not go together", ORT_INVALID_ARGUMENT);
    }
    if (!rows.empty() && (rows.size() != 2 || rows[0] < 1 || rows[1] < 1 || rows[0] > INT32_MAX / rows[1] ||
                          width > 0 || !scales.empty() || batch_inner)) {
      throw Ort::Exception("requantize: rows must be two positive ints (OH, OW), without width, scales or batch_inner",
                           ORT_INVALID_ARGUMENT);
    }
    if (nhwc != 0 && nhwc != 1) throw Ort::Exception("requantize: nhwc must be 0 or 1", ORT_INVALID_ARGUMENT);
    if (nhwc && (width > 0 || batch_inner)) {
      throw Ort::Exception("requantize: nhwc does not go with width or batch_inner", ORT_INVALID_ARGUMENT);
    }
    const std::vector<int64_t> counts = ints_attr(info, "channel_counts", {});
    const std::vector<int64_t> all = ints_attr(info, "channel_steps", {});
    size_t at = 0;
    for (int64_t count : counts) {
      if (count < 0 || static_cast<size_t>(count) * 3 > all.size() - at) {
        throw Ort::Exception("requantize: channel_counts must count the triples of channel_steps",
                             ORT_INVALID_ARGUMENT);
      }
      const std::vector<int64_t> one(all.begin() + static_cast<std::ptrdiff_t>(at),
                                     all.begin() + static_cast<std::ptrdiff_t>(at + 3 * count));
      per_channel.emplace_back();
      if (std::string err = parse_steps(one, per_channel.back()); !err.empty()) {
        throw Ort::Exception("requantize: channel " + std::to_string(per_channel.size() - 1) + ": " + err,
                             ORT_INVALID_ARGUMENT);
      }
      at += 3 * static_cast<size_t>(count);
    }
    if (at != all.size()) {
      throw Ort::Exception("requantize: channel_counts must count the triples of channel_steps", ORT_INVALID_ARGUMENT);
    }
    if (!per_channel.empty() && (!steps.empty() || width > 0 || batch_inner || !scales.empty())) {
      throw Ort::Exception("requantize: channel_steps go without steps, width, batch_inner or scales",
                           ORT_INVALID_ARGUMENT);
    }
  }

  // Whether every chain (steps, or each channel's) ends with a clip within [0, 255].
  bool chains_end_in_bytes() const {
    return per_channel.empty() ? ends_in_bytes(steps) : std::all_of(per_channel.begin(), per_channel.end(),
                                                                    ends_in_bytes);
  }

  // The CPU kernels' form (requantize.h, kernel_chains).
  void simplify_chains() { arrays = kernel_chains(steps, per_channel); }

  // y's shape for data's: data's, its last axis `width` long with a width, its first two axes swapped with
  // batch_inner (data (C, N, ...) gives y (N, C, ...)); empty when data cannot give one.
  std::vector<int64_t> output_shape(std::vector<int64_t> shape) const {
    if (batch_inner) {
      if (shape.size() < 2) return {};
      std::swap(shape[0], shape[1]);
    }
    return shape;
  }

  // Checks data's shape against the bias (`channels` elements, shape `bias_shape`), scales and width; sets
  // `inner` (elements per axis-1 index); returns an error message, empty when valid.
  std::string check(const std::vector<int64_t>& shape, int64_t channels, const std::vector<int64_t>& bias_shape,
                    int64_t& inner) const {
    if (channels > 0 && (shape.size() < 2 || shape[1] != channels || bias_shape.size() != 1)) {
      return "bias must be empty or (C,) for data (N, C, ...), got " + shape_text(bias_shape) + " for " +
             shape_text(shape);
    }
    const int64_t scaled = static_cast<int64_t>(scales.size());
    if (scaled > 0 && (shape.size() < 2 || shape[1] != scaled || (channels > 0 && channels != scaled))) {
      return std::to_string(scaled) + " scales for data " + shape_text(shape) + ": they must match axis 1 (and the bias)";
    }
    const int64_t programs = static_cast<int64_t>(per_channel.size());
    if (programs > 0 && (shape.size() < 2 || shape[1] != programs || (channels > 0 && channels != programs))) {
      return "steps for " + std::to_string(programs) + " channels and data " + shape_text(shape) +
             ": they must match axis 1 (and the bias)";
    }
    if (width > 0 && (shape.size() < 3 || shape.back() < width)) {
      return "width " + std::to_string(width) + " needs data of rank >= 3 with a last axis at least as long, got " +
             shape_text(shape);
    }
    inner = 1;
    for (size_t i = 2; i < shape.size(); ++i) inner *= shape[i];
    return {};
  }

  int64_t width;
  int64_t batch_inner;
  std::vector<int64_t> rows;  // (OH, OW): data (N, OH * OW, C), the products of the rows route
  int64_t nhwc;               // 1: the channels on the last axis
  std::vector<int64_t> flat;
  std::vector<int32_t> scales;
  std::vector<RequantStep> steps;
  ChannelSteps per_channel;  // channel_steps: each channel's own steps (empty: `steps` for all)
  ChannelArrays arrays;      // per_channel side by side where it has one sequence of kinds (simplify_chains)
};

constexpr int64_t kBlock = 1 << 14;  // elements per parallel task of requantize

// What a channels-last requantization writes and adds: y, allocated with `dims`, as int32 words or (Out uint8_t)
// bytes (the other null), and the addend of requantize_add and the conv ops (none: null), its data int32 or bytes
// (A), with the steps on it and those after the sum.
struct Ends {
  std::optional<Addend> addend;
  int32_t* words = nullptr;
  uint8_t* bytes = nullptr;
};

// The Ends of op `name`; an error naming it where the addend's shape is not y's.
template <typename A, typename Out>
Ort::Status ends_of(const char* name, const std::vector<int64_t>& dims, const Tensor<A>* addend,
                    const AddendSteps& steps, Tensor<Out>& out, Ends& ends) {
  if (addend && addend->Shape() != dims) {
    return invalid(name, "the addend must have y's shape " + shape_text(dims) + ", got " + shape_text(addend->Shape()));
  }
  if (addend) {
    if constexpr (std::is_same_v<A, uint8_t>) {
      ends.addend.emplace(Addend{nullptr, addend->Data(), steps.bytes, steps.after});
    } else {
      ends.addend.emplace(Addend{addend->Data(), nullptr, steps.words, steps.after});
    }
  }
  if constexpr (std::is_same_v<Out, uint8_t>) {
    ends.bytes = out.Allocate(dims);
  } else {
    ends.words = out.Allocate(dims);
  }
  return Ort::Status{nullptr};
}

// requantize with the channels on the last axis (op `name`): rows = (OH, OW) takes data (N, OH * OW, C) (the
// products of the rows route) and writes y (N, C, OH, OW), or with nhwc (N, OH, OW, C); nhwc alone takes data
// (..., C) and writes its shape; the bias and scales are per last-axis channel. Out = uint8_t (requantize_uint8,
// nhwc only): y as bytes, exact since every chain ends with a clip within [0, 255] (RequantizeAttrs checks).
// addend (requantize_add, nhwc only): y's shape, added after the steps (Addend).
template <typename Out, typename In = int32_t>
Ort::Status requantize_channels_last(OrtKernelContext* context, const char* name, const RequantizeAttrs& attrs,
                                     const Int32Tensor& data, const Int32Tensor& bias, Tensor<Out>& out,
                                     const Tensor<In>* addend = nullptr,
                                     const AddendSteps& addend_steps = {}) {
  const std::vector<int64_t>& shape = data.Shape();
  const std::vector<int64_t>& rows = attrs.rows;
  const bool fits = rows.empty() ? !shape.empty() : shape.size() == 3 && shape[1] == rows[0] * rows[1];
  // with rows, a bias (OH * OW, C): one per position and channel
  const bool per_position = fits && !rows.empty() && bias.Shape().size() == 2 && bias.Shape()[0] == shape[1];
  const int64_t channels = per_position ? bias.Shape()[1] : bias.NumberOfElement();
  const int64_t scaled = static_cast<int64_t>(attrs.scales.size());
  const int64_t programs = static_cast<int64_t>(attrs.per_channel.size());
  if (!fits || (channels > 0 && channels != shape.back()) || (scaled > 0 && scaled != shape.back()) ||
      (programs > 0 && programs != shape.back()) || (bias.Shape().size() != 1 && !per_position)) {
    return invalid(name, std::string(rows.empty() ? "nhwc needs data (..., C)" : "rows (OH, OW) need data "
                   "(N, OH * OW, C)") + " and a bias and scales (C,) or none (with rows also a bias "
                   "(OH * OW, C)), got " + shape_text(shape) + " and " + shape_text(bias.Shape()));
  }
  const int64_t c = shape.back(), count = data.NumberOfElement();
  const int32_t* b = channels > 0 ? bias.Data() : nullptr;
  const int64_t per_block = std::max<int64_t>(1, kBlock / std::max<int64_t>(c, 1));
  if (attrs.nhwc) {
    const std::vector<int64_t> dims = rows.empty() ? shape : std::vector<int64_t>{shape[0], rows[0], rows[1], c};
    Ends ends;
    if (Ort::Status status = ends_of(name, dims, addend, addend_steps, out, ends); !status.IsOK()) {
      return status;
    }
    const int64_t lines = c > 0 ? count / c : 0;
    auto block = [&](int64_t i) {
      requantize_last(data.Data() + i * per_block * c, i * per_block, std::min(lines, (i + 1) * per_block), b,
                      scaled > 0 ? attrs.scales.data() : nullptr, c, attrs.steps, ends.words,
                      per_position ? shape[1] : 0, attrs.per_channel, attrs.arrays, ends.bytes,
                      ends.addend ? &*ends.addend : nullptr);
    };
    parallel_for(context, (lines + per_block - 1) / per_block, block);
    return Ort::Status{nullptr};
  }
  if constexpr (std::is_same_v<Out, int32_t>) {
    if (scaled > 0) return invalid(name, "scales with rows need nhwc");
    const int64_t n = shape[0], positions = shape[1];
    int32_t* y = out.Allocate({n, c, rows[0], rows[1]});
    const int64_t blocks = (positions + per_block - 1) / per_block;
    auto block = [&](int64_t i) {
      const int64_t image = i / blocks, first = (i % blocks) * per_block;
      requantize_transposed(data.Data(), positions, c, image, first, std::min(positions, first + per_block), b,
                            attrs.steps, y, attrs.per_channel, per_position, attrs.arrays);
    };
    if (c > 0) parallel_for(context, n * blocks, block);
  }
  return Ort::Status{nullptr};  // (requantize_uint8 has nhwc: RequantizeUint8 checks)
}

// requantize_uint8(data int32, bias int32): requantize with nhwc, y written as uint8; every chain (steps, or each
// channel's) must end with a clip within [0, 255], which makes the narrowing exact.
struct RequantizeUint8 {
  RequantizeUint8(const OrtApi*, const OrtKernelInfo* info) : attrs(info) {
    if (!attrs.nhwc || !attrs.chains_end_in_bytes()) {
      throw Ort::Exception("requantize_uint8: needs nhwc 1 and every chain ending with a clip within [0, 255]",
                           ORT_INVALID_ARGUMENT);
    }
    attrs.simplify_chains();
  }

  Ort::Status Compute(OrtKernelContext* context, const Int32Tensor& data, const Int32Tensor& bias,
                      Tensor<uint8_t>& out) {
    return guarded("requantize_uint8", [&] {
      return requantize_channels_last(context, "requantize_uint8", attrs, data, bias, out);
    });
  }

  RequantizeAttrs attrs;
};

// requantize(data int32, bias int32 (C,)): the serving form's fused requantization run (requantize.h); width > 0
// keeps the first `width` elements of each last-axis row (data of rank >= 3); scales (C int32s) multiply data per
// axis-1 channel before the bias.
struct Requantize {
  Requantize(const OrtApi*, const OrtKernelInfo* info) : attrs(info) { attrs.simplify_chains(); }

  Ort::Status Compute(OrtKernelContext* context, const Int32Tensor& data, const Int32Tensor& bias, Int32Tensor& out) {
    return guarded("requantize", [&] {
      std::vector<int64_t> shape = attrs.output_shape(data.Shape());
      if (shape.empty()) return invalid("requantize", "batch_inner needs data of rank >= 2");
      const int64_t channels = bias.NumberOfElement();
      if (!attrs.rows.empty() || attrs.nhwc) {
        return requantize_channels_last(context, "requantize", attrs, data, bias, out);
      }
      int64_t inner = 1;
      if (std::string err = attrs.check(shape, channels, bias.Shape(), inner); !err.empty()) {
        return invalid("requantize", err);
      }
      const int64_t scaled = static_cast<int64_t>(attrs.scales.size()), width = attrs.width;
      const int64_t count = data.NumberOfElement();
      const int32_t* b = channels > 0 && inner > 0 ? bias.Data() : nullptr;
      const int32_t* x = data.Data();
      if (attrs.batch_inner && count > 0) {  // y (N, C, inner) gathered from x (C, N, inner), then done in place
        int32_t* y = out.Allocate(shape);
        const int64_t n = shape[0], c = shape[1];
        auto plane = [&](int64_t p) { std::copy_n(x + ((p % c) * n + p / c) * inner, inner, y + p * inner); };
        parallel_for(context, n * c, plane);
        x = y;
      }
      if (width == 0) {
        int32_t* y = out.Allocate(shape);  // (the same buffer when batch_inner allocated it above)
        auto block = [&](int64_t i) {
          requantize(x, i * kBlock, std::min(count, (i + 1) * kBlock), b, scaled > 0 && inner > 0 ?
                     attrs.scales.data() : nullptr, std::max({channels, scaled,
                     static_cast<int64_t>(attrs.per_channel.size())}), inner, attrs.steps, y, attrs.per_channel);
        };
        parallel_for(context, (count + kBlock - 1) / kBlock, block);
        return Ort::Status{nullptr};
      }
      const int64_t row = shape.back(), rows = row > 0 ? count / row : 0;
      const int64_t per_block = std::max<int64_t>(1, kBlock / width);
      shape.back() = width;
      int32_t* y = out.Allocate(shape);
      auto block = [&](int64_t i) {
        requantize_rows(x, row, width, i * per_block, std::min(rows, (i + 1) * per_block), b, channels, inner / row,
                        attrs.steps, y);
      };
      parallel_for(context, (rows + per_block - 1) / per_block, block);
      return Ort::Status{nullptr};
    });
  }

  RequantizeAttrs attrs;
};

// requantize_add(data int32, bias int32, addend int32 or uint8 (In)): requantize with nhwc, then y =
// sum_steps(y + addend_steps(addend)) (Addend; the attributes addend_steps and sum_steps, (kind, a, b) triples): a
// residual block's end, its shortcut run, Add and the run after it, in the pass of the convolution's run. Out =
// uint8_t (requantize_add_uint8): y as bytes, sum_steps ending with a clip within [0, 255].
template <typename In, typename Out>
struct RequantizeAdd {
  static constexpr bool kBytes = std::is_same_v<Out, uint8_t>;
  static constexpr const char* kName = kBytes ? "requantize_add_uint8" : "requantize_add";

  RequantizeAdd(const OrtApi*, const OrtKernelInfo* info)
      : attrs(info), addend_steps(read_addend_steps(info, kName, kBytes)) {
    if (!attrs.nhwc) throw Ort::Exception(std::string(kName) + ": needs nhwc 1", ORT_INVALID_ARGUMENT);
    attrs.simplify_chains();
  }

  Ort::Status Compute(OrtKernelContext* context, const Int32Tensor& data, const Int32Tensor& bias,
                      const Tensor<In>& addend, Tensor<Out>& out) {
    return guarded(kName, [&] {
      return requantize_channels_last(context, kName, attrs, data, bias, out, &addend, addend_steps);
    });
  }

  RequantizeAttrs attrs;
  AddendSteps addend_steps;
};

// conv_requantize (y int32), conv_requantize_uint8 (y uint8) and, with an addend, conv_requantize_add[_uint8]: a
// rows product and the requantize after it in one kernel (conv.h). data as im2col_rows takes it (In; its attributes
// kernel_shape, strides, dilations, pads, offset, zero, nhwc); weights uint8 (K, OC), a constant, read as w - 128;
// product_zero z in [0, 255]; bias int32, none, (OC,) or (OH * OW, OC); the requantize attributes steps or
// channel_counts and channel_steps (with an addend also addend_steps and sum_steps). y (N, OH, OW, OC) = the
// requantization of sum_k (rows[k] - z) * w[k] + bias: the values of im2col_rows, then MatMulInteger(rows, weights,
// z, 128), then requantize[_uint8 | _add | _add_uint8] with nhwc 1 and rows (OH, OW). isa: the products' kernel
// (ProductIsa; 0, the default: the fastest this CPU runs).
template <typename In, typename Out>
struct ConvKernel {
  static constexpr bool kBytes = std::is_same_v<Out, uint8_t>;

  ConvKernel(const OrtApi* api, const OrtKernelInfo* info, const char* op, bool add)
      : name(op), rows(api, info, op), attrs(info), product_zero(int_attr(info, "product_zero", 0)),
        isa(int_attr(info, "isa", kIsaBest)) {
    const auto refuse = [&](const std::string& rule) {
      throw Ort::Exception(std::string(name) + ": " + rule, ORT_INVALID_ARGUMENT);
    };
    if (!attrs.rows.empty() || attrs.width || attrs.batch_inner) {
      refuse("rows, width and batch_inner do not go with a convolution");
    }
    if (product_zero < 0 || product_zero > 255) refuse("product_zero must be in [0, 255]");
    if (isa < kIsaBest || isa > kIsaAvx2Bytes || (isa != kIsaBest && !isa_available(isa))) {
      refuse("isa " + std::to_string(isa) + " is not a kernel this CPU runs");
    }
    const bool bounded = rows.offset == 0 && rows.zero < 0;  // values in [0, 127], which pad() checks
    if (isa == kIsaAvx2Bytes && !bounded) refuse("isa 5 takes rows of values in [0, 127] (offset 0, no zero)");
    if (isa == kIsaBest) isa = best_isa(bounded);
    if (add) addend_steps = read_addend_steps(info, op, kBytes);
    if (kBytes && !add && !attrs.chains_end_in_bytes()) refuse("every chain must end with a clip within [0, 255]");
    attrs.simplify_chains();
    read_input_run(info, refuse);
    int is_constant = 0;
    const Ort::ConstValue w = Ort::ConstKernelInfo(info).GetTensorConstantInput(1, &is_constant);
    if (!is_constant) refuse("the weights must be a constant (an initializer)");
    const Ort::TensorTypeAndShapeInfo type = w.GetTensorTypeAndShapeInfo();
    const std::vector<int64_t> shape = type.GetShape();
    if (type.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 || shape.size() != 2 || shape[0] < 1 ||
        shape[1] < 1) {
      refuse("the weights must be uint8 (K, OC), got " + shape_text(shape));
    }
    if (!attrs.scales.empty() && static_cast<int64_t>(attrs.scales.size()) != shape[1]) {
      refuse(std::to_string(attrs.scales.size()) + " scales for " + std::to_string(shape[1]) + " output channels");
    }
    const int64_t kh = rows.geometry.kh, kw = rows.geometry.kw;
    if (kh < 1 || kw < 1 || kh > shape[0] || kw > shape[0] / kh || shape[0] % (kh * kw) != 0) {
      refuse("the weights (K, OC) must have K = kh * kw * C, got " + shape_text(shape) + " for a " +
             std::to_string(kh) + " x " + std::to_string(kw) + " kernel");
    }
    weights = pack_weights(w.GetTensorData<uint8_t>(), kh * kw, shape[0] / (kh * kw), shape[1]);
#if defined(CVM_ONNX_X86_PRODUCTS)
    // the AVX2 and AVX-512 VNNI kernels take the Winograd products for the 3x3 convolutions of stride 1 and
    // dilation 1 over 16 channels or more (AVX-512 VNNI: 32), where they are exact (winograd.h) and faster (and the
    // output rows not too wide, run())
    Im2colShape g = rows.geometry;
    g.c = shape[0] / (kh * kw);
    const int64_t fewest = isa == kIsaAvx512Vnni ? kWinogradMinChannelsAvx512Vnni : kWinogradMinChannels;
    if ((isa == kIsaAvx2 || isa == kIsaAvx2Bytes || isa == kIsaAvx512Vnni) && g.c >= fewest && winograd_applies(g)) {
      winograd = pack_winograd(w.GetTensorData<uint8_t>(), g.c, shape[1]);
    }
#endif
    // AVX-512 VNNI requantizes each tile as soon as it is multiplied (products_requantized) where the channels fill
    // blocks of 16, without scales, and every channel's chain has one sequence of kinds (each channel's, or the one
    // list's repeated)
    if (const int64_t oc = shape[1]; isa == kIsaAvx512Vnni && attrs.scales.empty() && oc % kBlockLanes == 0) {
      if (attrs.per_channel.empty()) uniform = channel_arrays(ChannelSteps(static_cast<size_t>(oc), attrs.steps));
      in_registers = attrs.per_channel.empty() || !attrs.arrays.kinds.empty();
    }
  }

  // The attributes in_steps, in_scales and in_bias (InputRun) into rows.before: in_steps parsed and simplified,
  // ending with a clip within [0, 127] ([0, 255] with a zero), for int32 data with nhwc 1 and offset 0; in_scales
  // and in_bias int32s, only with in_steps.
  template <typename Refuse>
  void read_input_run(const OrtKernelInfo* info, const Refuse& refuse) {
    InputRun& run = rows.before;
    if (std::string err = parse_steps(ints_attr(info, "in_steps", {}), run.steps); !err.empty()) {
      refuse("in_steps: " + err);
    }
    for (auto [attr, values] : {std::pair{"in_scales", &run.scales}, std::pair{"in_bias", &run.bias}}) {
      for (int64_t v : ints_attr(info, attr, {})) {
        if (v < INT32_MIN || v > INT32_MAX) refuse(std::string(attr) + " must be int32s");
        values->push_back(static_cast<int32_t>(v));
      }
    }
    if (run.steps.empty()) {
      if (!run.scales.empty() || !run.bias.empty()) refuse("in_scales and in_bias need in_steps");
      return;
    }
    const RequantStep& last = run.steps.back();
    if (std::is_same_v<In, uint8_t> || rows.nhwc != 1 || rows.offset != 0 || last.kind != kClip || last.a < 0 ||
        last.b > (rows.zero >= 0 ? 255 : 127)) {
      refuse("in_steps take int32 data with nhwc 1 and offset 0 and end with a clip within [0, 127] ([0, 255] "
             "with a zero)");
    }
    if (!run.scales.empty() && !run.bias.empty() && run.scales.size() != run.bias.size()) {
      refuse("in_scales and in_bias must be as many");
    }
    for (size_t c = 0; c < std::max(run.scales.size(), run.bias.size()); ++c) {
      std::vector<RequantStep> chain;
      if (!run.scales.empty()) chain.push_back({kMul, run.scales[c], 0});
      if (!run.bias.empty()) chain.push_back({kAdd, run.bias[c], 0});
      chain.insert(chain.end(), run.steps.begin(), run.steps.end());
      run.per.push_back(std::move(chain));
    }
    run.arrays = kernel_chains(run.steps, run.per);
  }

  template <typename A>
  Ort::Status run(OrtKernelContext* context, const Tensor<In>& data, const Tensor<uint8_t>&, const Int32Tensor& bias,
                  const Tensor<A>* addend, Tensor<Out>& out) const {
    Im2colShape s;
    thread_local std::vector<uint8_t> padded;
    thread_local std::vector<int32_t> init, offsets;
    if (Ort::Status status = rows.shape_of(data, name, s); !status.IsOK()) return status;
    for (const std::vector<int32_t>* v : {&rows.before.scales, &rows.before.bias}) {
      if (!v->empty() && static_cast<int64_t>(v->size()) != s.c) {
        return invalid(name, std::to_string(v->size()) + " in_scales or in_bias for " + std::to_string(s.c) +
                                 " input channels");
      }
    }
    static const int64_t cpus = usable_cpus();
    const bool by_image = s.n >= kImagesPerCpu * cpus;
    if (!by_image) {
      if (Ort::Status status = rows.pad_all(context, data.Data(), name, s, padded); !status.IsOK()) return status;
    }
    const int64_t k = s.kh * s.kw * s.c, oc = weights.oc, positions = s.oh * s.ow, total = s.n * positions;
    if (k != weights.k) {  // (the weights are the constant packed when the kernel was made)
      return invalid(name, "the weights (" + std::to_string(weights.k) + ", " + std::to_string(oc) +
                               ") must be (K, OC) with K = kh * kw * C = " + std::to_string(k));
    }
    const std::vector<int64_t>& b = bias.Shape();
    const bool per_position = b == std::vector<int64_t>{positions, oc}, per_channel = b == std::vector<int64_t>{oc};
    if (!per_position && !per_channel && bias.NumberOfElement() != 0) {
      return invalid(name, "the bias must be empty, (OC,) or (OH * OW, OC) = " +
                               shape_text({positions, oc}) + ", got " + shape_text(b));
    }
    const int64_t programs = static_cast<int64_t>(attrs.per_channel.size());
    if (programs > 0 && programs != oc) {
      return invalid(name, "steps for " + std::to_string(programs) + " channels and " + std::to_string(oc) +
                               " output channels");
    }
    const std::vector<int64_t> dims{s.n, s.oh, s.ow, oc};
    Ends ends;
    if (Ort::Status status = ends_of(name, dims, addend, addend_steps, out, ends); !status.IsOK()) {
      return status;
    }
    // the accumulators start at -z * sum(w) + bias[o] (int32 wrap-around, as the sum then the bias would wrap;
    // with scales the bias is added after them, by requantize_last)
    const bool scaled = !attrs.scales.empty(), folded = per_channel && !scaled;
    init.assign(weights.sums.size(), 0);
    for (int64_t o = 0; o < oc; ++o) {
      init[o] = static_cast<int32_t>(static_cast<uint32_t>(-product_zero) * static_cast<uint32_t>(weights.sums[o]) +
                                     static_cast<uint32_t>(folded ? bias.Data()[o] : 0));
    }
    const int32_t* later_bias = per_position || (per_channel && scaled) ? bias.Data() : nullptr;
    const int64_t tile = tile_positions(weights.k4), step = row_step(isa, weights);
    window_offsets(s, weights.c4, offsets);
    const ChannelArrays* chain = !in_registers ? nullptr : attrs.per_channel.empty() ? &uniform : &attrs.arrays;
    const TileEnd end{per_position ? bias.Data() : nullptr, positions, chain, ends.addend ? &*ends.addend : nullptr,
                      ends.words, ends.bytes};
    // the tasks run on other threads too, where `padded`, `init` and `offsets` would name that thread's own
    const int32_t* start = init.data();
    const int32_t* offset = offsets.data();
    // the requantization of the products c of the positions [first, first + count)
    auto finish = [&](const int32_t* c, int64_t first, int64_t count) {
      requantize_last(c, first, first + count, later_bias, scaled ? attrs.scales.data() : nullptr, oc, attrs.steps,
                      ends.words, per_position ? positions : 0, attrs.per_channel, attrs.arrays, ends.bytes,
                      ends.addend ? &*ends.addend : nullptr);
    };
    // the positions [first, first + count) from the padded copy xp, whose first image holds position origin
    auto tiles = [&](const uint8_t* xp, int64_t origin, int64_t first, int64_t count) {
      thread_local std::vector<const uint8_t*> at;  // each row's first byte
      thread_local std::vector<int32_t> c;
      const int64_t padded_rows = (count + step - 1) / step * step;
      if (at.size() < static_cast<size_t>(padded_rows)) at.resize(static_cast<size_t>(padded_rows));
      window_starts(xp, s, first - origin, count, padded_rows, at.data());
      if (chain) return products_requantized(at.data(), offset, count, weights, start, end, first);
      if (c.size() < static_cast<size_t>(padded_rows * oc)) c.resize(static_cast<size_t>(padded_rows * oc));
      products(isa, at.data(), offset, padded_rows, weights, start, c.data());
      finish(c.data(), first, count);
    };
    // the Winograd products instead (winograd.h): bands of output rows, a multiple of 4, of about 24 tiles of 4 x 4
    // each, of the image n whose padded copy is at xp
    const int64_t band = std::max<int64_t>(1, 24 / ((s.ow + 3) / 4)) * 4, bands = (s.oh + band - 1) / band;
    auto rows_of = [&](const uint8_t* xp, int64_t n, int64_t b) {
      thread_local std::vector<int32_t> c;
      const int64_t oh0 = b * band, oh1 = std::min(s.oh, oh0 + band), count = (oh1 - oh0) * s.ow;
      if (c.size() < static_cast<size_t>(count * oc)) c.resize(static_cast<size_t>(count * oc));
#if defined(CVM_ONNX_X86_PRODUCTS)
      if (isa == kIsaAvx512Vnni && chain) {  // each tile requantized in registers
        const int64_t first = n * positions + oh0 * s.ow;
        return isa_avx512::products_winograd(xp, s, oh0, oh1, winograd, start, nullptr, &end, first);
      }
      if (isa == kIsaAvx512Vnni) {
        isa_avx512::products_winograd(xp, s, oh0, oh1, winograd, start, c.data(), nullptr, 0);
      } else {
        isa_avx2::products_winograd(xp, s, oh0, oh1, winograd, start, c.data());
      }
#endif
      finish(c.data(), n * positions + oh0 * s.ow, count);
    };
    const bool by_rows = !winograd.u.empty() && s.ow <= kWinogradMaxWidth;
    if (!by_image) {
      const uint8_t* xp = padded.data();
      if (by_rows) {
        const int64_t image_bytes = s.hp() * s.wp() * s.c;
        auto task = [&](int64_t t) { rows_of(xp + t / bands * image_bytes, t / bands, t % bands); };
        parallel_for(context, s.n * bands, task);
        return Ort::Status{nullptr};
      }
      auto task = [&](int64_t t) { tiles(xp, 0, t * tile, std::min(tile, total - t * tile)); };
      parallel_for(context, (total + tile - 1) / tile, task);
      return Ort::Status{nullptr};
    }
    // each image padded into its thread's own copy, then its tiles read it while it is in the cache
    const In* x = data.Data();
    const int64_t image_bytes = s.hp() * s.wp() * s.c, image_values = s.c * s.h * s.w;
    std::atomic<int64_t> bad{INT64_MAX};  // the smallest flat index of a value outside the range
    auto image = [&](int64_t n) {
      thread_local std::vector<uint8_t> own;
      if (own.size() < static_cast<size_t>(image_bytes + kPaddedSlack)) {
        own.resize(static_cast<size_t>(image_bytes + kPaddedSlack));
      }
      if (const int64_t i = rows.pad_image(x + n * image_values, s, 0, own.data()); i >= 0) {
        for (int64_t seen = bad.load(); i + n * image_values < seen &&
                                        !bad.compare_exchange_weak(seen, i + n * image_values);) {}
        return;
      }
      if (by_rows) {
        for (int64_t b = 0; b < bands; ++b) rows_of(own.data(), n, b);
        return;
      }
      for (int64_t first = n * positions; first < (n + 1) * positions; first += tile) {
        tiles(own.data(), n * positions, first, std::min(tile, (n + 1) * positions - first));
      }
    };
    parallel_for(context, s.n, image);
    if (const int64_t i = bad.load(); i != INT64_MAX) return rows.outside(name, x, i);
    return Ort::Status{nullptr};
  }

  const char* name;
  Im2colRows<In> rows;  // the rows' attributes and the padded copy
  RequantizeAttrs attrs;
  int64_t product_zero, isa;
  AddendSteps addend_steps;
  PackedWeights weights;
  WinogradWeights winograd;  // the Winograd products' transformed weights where they are taken (else empty)
  ChannelArrays uniform;     // the one list's steps for every channel, side by side
  bool in_registers = false;  // whether products_requantized takes the chains (see above)
};

template <typename In, typename Out>
struct ConvRequantize {
  static constexpr const char* kName = std::is_same_v<Out, uint8_t> ? "conv_requantize_uint8" : "conv_requantize";

  ConvRequantize(const OrtApi* api, const OrtKernelInfo* info) : kernel(api, info, kName, false) {}

  Ort::Status Compute(OrtKernelContext* context, const Tensor<In>& data,
                      const Tensor<uint8_t>& weights, const Int32Tensor& bias,
                      Tensor<Out>& out) {
    return guarded(kName, [&] {
      return kernel.template run<int32_t>(context, data, weights, bias, nullptr, out);
    });
  }

  ConvKernel<In, Out> kernel;
};

// The addend (AddIn, int32 or uint8) of conv_requantize_add[_uint8].
template <typename In, typename AddIn, typename Out>
struct ConvRequantizeAdd {
  static constexpr const char* kName = std::is_same_v<Out, uint8_t> ? "conv_requantize_add_uint8"
                                                                    : "conv_requantize_add";

  ConvRequantizeAdd(const OrtApi* api, const OrtKernelInfo* info) : kernel(api, info, kName, true) {}

  Ort::Status Compute(OrtKernelContext* context, const Tensor<In>& data,
                      const Tensor<uint8_t>& weights, const Int32Tensor& bias,
                      const Tensor<AddIn>& addend, Tensor<Out>& out) {
    return guarded(kName, [&] { return kernel.run(context, data, weights, bias, &addend, out); });
  }

  ConvKernel<In, Out> kernel;
};

// -- CUDA kernels: the same checks, then the launchers of cvm_ops_cuda.cu on onnxruntime's stream --------------
#ifdef CVM_ONNX_WITH_CUDA
Ort::Status launched(const char* op, const char* cuda_error) {
  return cuda_error ? invalid(op, std::string("CUDA error: ") + cuda_error) : Ort::Status{nullptr};
}

void* stream_of(OrtKernelContext* ctx) { return Ort::KernelContext(ctx).GetGPUComputeStream(); }

struct NonMaxSuppressionCuda {
  NonMaxSuppressionCuda(const OrtApi*, const OrtKernelInfo* info) : attrs(read_nms_attrs(info)) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Int32Tensor& data, const Int32Tensor& valid_count,
                      Int32Tensor& out) {
    return guarded("non_max_suppression", [&] {
      const std::vector<int64_t>& shape = data.Shape();
      if (std::string err = check_nms(shape, valid_count.Shape()); !err.empty()) {
        return invalid("non_max_suppression", err);
      }
      int32_t* y = out.Allocate(shape);
      return launched("non_max_suppression", cuda_non_max_suppression(data.Data(), valid_count.Data(), shape[0],
                                                                      shape[1], attrs, y, stream_of(ctx)));
    });
  }

  NmsAttrs attrs;
};

struct GetValidCountsCuda {
  GetValidCountsCuda(const OrtApi*, const OrtKernelInfo* info)
      : score_threshold(int_attr(info, "score_threshold", 0)) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Int32Tensor& data, Int32Tensor& valid_count, Int32Tensor& out) {
    return guarded("get_valid_counts", [&] {
      const std::vector<int64_t>& shape = data.Shape();
      if (std::string err = check_valid_counts(shape); !err.empty()) return invalid("get_valid_counts", err);
      int32_t* counts = valid_count.Allocate({shape[0]});
      int32_t* y = out.Allocate(shape);
      return launched("get_valid_counts", cuda_get_valid_counts(data.Data(), shape[0], shape[1], shape[2],
                                                                score_threshold, counts, y, stream_of(ctx)));
    });
  }

  int64_t score_threshold;
};

struct LutCuda {
  LutCuda(const OrtApi*, const OrtKernelInfo*) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Int32Tensor& indices, const Int32Tensor& table, Int32Tensor& out) {
    return guarded("cvm_lut", [&] {
      const int64_t size = table.NumberOfElement();
      if (std::string err = check_lut(size); !err.empty()) return invalid("cvm_lut", err);
      int32_t* y = out.Allocate(indices.Shape());
      return launched("cvm_lut", cuda_lut(indices.Data(), indices.NumberOfElement(), table.Data(), size, y,
                                          stream_of(ctx)));
    });
  }
};

// im2col_int8 / im2col_uint8 on the GPU: the same geometry checks, then cuda_im2col (values not range-checked:
// cvm_cuda.h says why).
template <int32_t kOffset>
struct Im2colCuda {
  static constexpr const char* kName = kOffset == 0 ? "im2col_int8" : "im2col_uint8";
  using Out = std::conditional_t<kOffset == 0, int8_t, uint8_t>;

  Im2colCuda(const OrtApi*, const OrtKernelInfo* info) : geometry(read_im2col_attrs(info, kName)) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Int32Tensor& data, Tensor<Out>& out) {
    return guarded(kName, [&] {
      Im2colShape s;
      if (std::string err = im2col_shape(data.Shape(), geometry, s); !err.empty()) return invalid(kName, err);
      Out* cols = out.Allocate(columns_shape(s));
      const Im2colArgs args{s.n, s.c, s.h, s.w, s.kh, s.kw, s.sh, s.sw, s.dh, s.dw, s.pt, s.pl, s.group, s.oh, s.ow,
                            s.wide, s.batch_inner, s.wp(), s.hp()};
      return launched(kName, cuda_im2col(data.Data(), args, static_cast<uint8_t>(kOffset),
                                         reinterpret_cast<uint8_t*>(cols), stream_of(ctx)));
    });
  }

  Im2colShape geometry;
};

// requantize on the GPU: the same checks, then cuda_requantize; the scales are copied to the device once.
struct RequantizeCuda {
  RequantizeCuda(const OrtApi*, const OrtKernelInfo* info) : attrs(info) {}
  RequantizeCuda(const RequantizeCuda&) = delete;
  RequantizeCuda& operator=(const RequantizeCuda&) = delete;
  ~RequantizeCuda() { cuda_free(device_scales); }

  Ort::Status Compute(OrtKernelContext* ctx, const Int32Tensor& data, const Int32Tensor& bias, Int32Tensor& out) {
    return guarded("requantize", [&] {
      if (!attrs.rows.empty() || attrs.nhwc || !attrs.per_channel.empty()) {
        return invalid("requantize", "rows, nhwc and channel_steps have CPU kernels only");
      }
      for (const RequantStep& s : attrs.steps) {
        if (s.kind == kShift && s.a == 0) return invalid("requantize", "shift 0 has a CPU kernel only");
        if (s.kind == kMul64) return invalid("requantize", "mul64 has a CPU kernel only");
        if (s.kind == kEven) return invalid("requantize", "even has a CPU kernel only");
      }
      std::vector<int64_t> shape = attrs.output_shape(data.Shape());
      if (shape.empty()) return invalid("requantize", "batch_inner needs data of rank >= 2");
      const int64_t channels = bias.NumberOfElement();
      int64_t inner = 1;
      if (std::string err = attrs.check(shape, channels, bias.Shape(), inner); !err.empty()) {
        return invalid("requantize", err);
      }
      const int32_t* scales = nullptr;
      if (!attrs.scales.empty()) {
        std::lock_guard<std::mutex> lock(upload);
        if (device_scales == nullptr) {
          const char* error = nullptr;
          device_scales = cuda_upload(attrs.scales.data(), static_cast<int64_t>(attrs.scales.size()), &error);
          if (error) return launched("requantize", error);
        }
        scales = device_scales;
      }
      const int64_t width = attrs.width, row = shape.back();
      if (width > 0) shape.back() = width;
      int32_t* y = out.Allocate(shape);
      // planes of y: (N * C) of `inner` elements for rank >= 2, else one plane of everything (no channels)
      const int64_t planes = shape.size() >= 2 ? shape[0] * shape[1] : 1;
      const int64_t per_plane = shape.size() >= 2 ? (width > 0 ? inner / row * width : inner) : data.NumberOfElement();
      return launched("requantize", cuda_requantize(data.Data(), planes, shape.size() >= 2 ? shape[1] : 1, per_plane,
                                                    row, width, attrs.batch_inner ? shape[0] : 0,
                                                    channels > 0 ? bias.Data() : nullptr, scales, attrs.flat.data(),
                                                    static_cast<int64_t>(attrs.steps.size()), y, stream_of(ctx)));
    });
  }

  RequantizeAttrs attrs;
  std::mutex upload;
  int32_t* device_scales = nullptr;
};
#endif

// -- the ops: each kernel struct registered through onnxruntime's C API ---------------------------------------
// A kernel struct K has K(const OrtApi*, const OrtKernelInfo*) (attributes read and checked; throws to refuse the
// node) and Ort::Status Compute([OrtKernelContext*,] const Tensor<T>&..., Tensor<U>&...): its inputs, then its
// outputs, whose element types are the op's.

// An op's description for onnxruntime: its name, provider and element types; its kernels (CreateKernel) are K's.
struct NativeOp : OrtCustomOp {
  std::string name, provider;
  std::vector<ONNXTensorElementDataType> inputs, outputs;
};
using OpPtr = std::unique_ptr<NativeOp>;

// What K's Compute takes: whether the context first, then the element types of its inputs (const Tensor<T>&) and
// outputs (Tensor<T>&) in order.
template <typename Method>
struct Signature;

template <typename T>
struct Arg;
template <typename T>
struct Arg<const Tensor<T>&> {
  static constexpr bool kInput = true;
  using Type = T;
};
template <typename T>
struct Arg<Tensor<T>&> {
  static constexpr bool kInput = false;
  using Type = T;
};

template <typename K, typename... A>
struct Signature<Ort::Status (K::*)(A...)> {
  static constexpr bool kContext = false;
  using Args = std::tuple<A...>;
};
template <typename K, typename... A>
struct Signature<Ort::Status (K::*)(OrtKernelContext*, A...)> {
  static constexpr bool kContext = true;
  using Args = std::tuple<A...>;
};

// The kernel of op `name`: K and the op's name, for its errors.
template <typename K>
struct Instance {
  Instance(const char* op, const OrtApi* api, const OrtKernelInfo* info) : name(op), kernel(api, info) {}
  const char* name;
  K kernel;
};

// K's entry: Compute's arguments read from the kernel context, then Compute.
template <typename K>
struct Entry {
  using Sig = Signature<decltype(&K::Compute)>;
  static constexpr size_t kArgs = std::tuple_size_v<typename Sig::Args>;
  template <size_t I>
  using ArgOf = Arg<std::tuple_element_t<I, typename Sig::Args>>;

  template <size_t... I>
  static constexpr size_t inputs(std::index_sequence<I...>) {
    return (0 + ... + ArgOf<I>::kInput);
  }
  static constexpr size_t kInputs = inputs(std::make_index_sequence<kArgs>{});

  // Argument i's index among the inputs, or among the outputs (the arguments are the inputs, then the outputs).
  static constexpr size_t index(size_t i) { return i < kInputs ? i : i - kInputs; }

  template <size_t... I>
  static OrtStatusPtr run(Instance<K>& self, OrtKernelContext* context, std::index_sequence<I...>) {
    std::tuple<std::decay_t<std::tuple_element_t<I, typename Sig::Args>>...> args{
        std::decay_t<std::tuple_element_t<I, typename Sig::Args>>(context, index(I))...};
    Ort::Status status = guarded(self.name, [&] {
      size_t count = 0;
      Ort::ThrowOnError(Ort::GetApi().KernelContext_GetInputCount(context, &count));
      if (count != kInputs) {
        return invalid(self.name, "takes " + std::to_string(kInputs) + " inputs, got " + std::to_string(count));
      }
      std::string err;  // the first input's that is not a tensor of its type
      const auto read = [&](auto& arg, size_t i) {
        if (err.empty() && i < kInputs) err = arg.read();
      };
      (read(std::get<I>(args), I), ...);
      if (!err.empty()) return invalid(self.name, err);
      if constexpr (Sig::kContext) {
        return self.kernel.Compute(context, std::get<I>(args)...);
      } else {
        return self.kernel.Compute(std::get<I>(args)...);
      }
    });
    return status.release();
  }

  static OrtStatusPtr ORT_API_CALL compute(void* kernel, OrtKernelContext* context) {
    return run(*static_cast<Instance<K>*>(kernel), context, std::make_index_sequence<kArgs>{});
  }

  // The element types of the inputs (in) or of the outputs.
  template <size_t... I>
  static std::vector<ONNXTensorElementDataType> types(bool in, std::index_sequence<I...>) {
    std::vector<ONNXTensorElementDataType> out;
    for (const auto& [input, type] : {std::pair{ArgOf<I>::kInput, kElementType<typename ArgOf<I>::Type>}...}) {
      if (input == in) out.push_back(type);
    }
    return out;
  }
};

const NativeOp& op_of(const OrtCustomOp* op) { return *static_cast<const NativeOp*>(op); }

// The kernel struct K as op `name` on `provider`: every input and output required, one version for all opsets.
template <typename K>
OpPtr native_op(const char* name, const char* provider) {
  auto op = std::make_unique<NativeOp>();  // value-initialized: every other OrtCustomOp field null
  OrtCustomOp& c = *op;
  c.version = ORT_API_VERSION;
  op->name = name;
  op->provider = provider;
  op->inputs = Entry<K>::types(true, std::make_index_sequence<Entry<K>::kArgs>{});
  op->outputs = Entry<K>::types(false, std::make_index_sequence<Entry<K>::kArgs>{});
  c.CreateKernel = [](const OrtCustomOp* o, const OrtApi* api, const OrtKernelInfo* info) -> void* {
    return new Instance<K>(op_of(o).name.c_str(), api, info);
  };
  c.GetName = [](const OrtCustomOp* o) { return op_of(o).name.c_str(); };
  c.GetExecutionProviderType = [](const OrtCustomOp* o) { return op_of(o).provider.c_str(); };
  c.GetInputType = [](const OrtCustomOp* o, size_t i) { return op_of(o).inputs[i]; };
  c.GetInputTypeCount = [](const OrtCustomOp* o) { return op_of(o).inputs.size(); };
  c.GetOutputType = [](const OrtCustomOp* o, size_t i) { return op_of(o).outputs[i]; };
  c.GetOutputTypeCount = [](const OrtCustomOp* o) { return op_of(o).outputs.size(); };
  c.KernelComputeV2 = &Entry<K>::compute;
  c.KernelDestroy = [](void* kernel) { delete static_cast<Instance<K>*>(kernel); };
  c.GetInputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
  c.GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return INPUT_OUTPUT_REQUIRED; };
  c.GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
  c.GetStartVersion = [](const OrtCustomOp*) { return 1; };
  c.GetEndVersion = [](const OrtCustomOp*) { return INT_MAX; };
  return op;
}

std::vector<OpPtr> create_ops() {
  std::vector<OpPtr> ops;
  const char* cpu = "CPUExecutionProvider";
  ops.push_back(native_op<NonMaxSuppression>("non_max_suppression", cpu));
  ops.push_back(native_op<GetValidCounts>("get_valid_counts", cpu));
  ops.push_back(native_op<Lut>("cvm_lut", cpu));
  ops.push_back(native_op<Im2col<int8_t, 0>>("im2col_int8", cpu));
  ops.push_back(native_op<Im2col<uint8_t, 128>>("im2col_uint8", cpu));
  ops.push_back(native_op<Requantize>("requantize", cpu));
  ops.push_back(native_op<Im2colRows<int32_t>>("im2col_rows", cpu));
  ops.push_back(native_op<Im2colRows<uint8_t>>("im2col_rows", cpu));
  ops.push_back(native_op<RequantizeUint8>("requantize_uint8", cpu));
  ops.push_back(native_op<RequantizeAdd<int32_t, int32_t>>("requantize_add", cpu));
  ops.push_back(native_op<RequantizeAdd<uint8_t, int32_t>>("requantize_add", cpu));
  ops.push_back(native_op<RequantizeAdd<int32_t, uint8_t>>("requantize_add_uint8", cpu));
  ops.push_back(native_op<RequantizeAdd<uint8_t, uint8_t>>("requantize_add_uint8", cpu));
  ops.push_back(native_op<ConvRequantize<uint8_t, int32_t>>("conv_requantize", cpu));
  ops.push_back(native_op<ConvRequantize<int32_t, int32_t>>("conv_requantize", cpu));
  ops.push_back(native_op<ConvRequantize<uint8_t, uint8_t>>("conv_requantize_uint8", cpu));
  ops.push_back(native_op<ConvRequantize<int32_t, uint8_t>>("conv_requantize_uint8", cpu));
  // conv_requantize_add[_uint8]: the data and the addend each uint8 or int32
  ops.push_back(native_op<ConvRequantizeAdd<uint8_t, uint8_t, int32_t>>("conv_requantize_add", cpu));
  ops.push_back(native_op<ConvRequantizeAdd<uint8_t, int32_t, int32_t>>("conv_requantize_add", cpu));
  ops.push_back(native_op<ConvRequantizeAdd<int32_t, uint8_t, int32_t>>("conv_requantize_add", cpu));
  ops.push_back(native_op<ConvRequantizeAdd<int32_t, int32_t, int32_t>>("conv_requantize_add", cpu));
  ops.push_back(native_op<ConvRequantizeAdd<uint8_t, uint8_t, uint8_t>>("conv_requantize_add_uint8", cpu));
  ops.push_back(native_op<ConvRequantizeAdd<uint8_t, int32_t, uint8_t>>("conv_requantize_add_uint8", cpu));
  ops.push_back(native_op<ConvRequantizeAdd<int32_t, uint8_t, uint8_t>>("conv_requantize_add_uint8", cpu));
  ops.push_back(native_op<ConvRequantizeAdd<int32_t, int32_t, uint8_t>>("conv_requantize_add_uint8", cpu));
#ifdef CVM_ONNX_WITH_CUDA
  const char* cuda = "CUDAExecutionProvider";
  ops.push_back(native_op<NonMaxSuppressionCuda>("non_max_suppression", cuda));
  ops.push_back(native_op<GetValidCountsCuda>("get_valid_counts", cuda));
  ops.push_back(native_op<LutCuda>("cvm_lut", cuda));
  ops.push_back(native_op<Im2colCuda<0>>("im2col_int8", cuda));
  ops.push_back(native_op<Im2colCuda<128>>("im2col_uint8", cuda));
  ops.push_back(native_op<RequantizeCuda>("requantize", cuda));
#endif
  return ops;
}

// The ops, created once: they outlive every session that uses them.
const std::vector<OpPtr>& registered_ops() {
  static const std::vector<OpPtr> ops = create_ops();
  return ops;
}

}  // namespace

}  // namespace cvm_onnx

// The ops registered for CUDAExecutionProvider, comma-separated ("" without CUDA), for cvm_onnx.native.cuda_ops
// (via ctypes).
extern "C" __attribute__((visibility("default"))) const char* CvmOnnxCudaOps() {
  static const std::string names = [] {
    std::string joined;
    try {
      for (const auto& op : cvm_onnx::registered_ops()) {
        if (std::string(op->GetExecutionProviderType(op.get())) != "CUDAExecutionProvider") continue;
        joined += (joined.empty() ? "" : ",") + std::string(op->GetName(op.get()));
      }
    } catch (const std::exception&) {  // a broken registration: RegisterCustomOps reports it
    }
    return joined;
  }();
  return names.c_str();
}

// The entry point onnxruntime calls from SessionOptions.register_custom_ops_library.
extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    const OrtApi* oldest = api_base->GetApi(1);
    const std::string msg = "cvm.native needs onnxruntime C API version " + std::to_string(ORT_API_VERSION) +
                            " or newer; this onnxruntime is " + api_base->GetVersionString();
    return oldest ? oldest->CreateStatus(ORT_FAIL, msg.c_str()) : nullptr;
  }
  Ort::InitApi(api);
  try {
    // The domains must outlive every session that uses them.
    const std::vector<cvm_onnx::OpPtr>& ops = cvm_onnx::registered_ops();
    static std::mutex mutex;
    static std::vector<Ort::CustomOpDomain> domains;
    Ort::CustomOpDomain domain{cvm_onnx::kDomain};
    for (const auto& op : ops) domain.Add(op.get());
    Ort::UnownedSessionOptions{options}.Add(domain);
    std::lock_guard<std::mutex> lock(mutex);
    domains.push_back(std::move(domain));
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_FAIL, e.what());
  }
  return nullptr;
}
