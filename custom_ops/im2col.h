// Gathering the windows of a 2-D convolution (im2col) from int32 data into int8 or uint8 columns: pure data
// movement plus an exact narrowing, for onnxruntime's MatMulInteger to take the products (docs/custom_ops.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "isa.h"

namespace cvm_onnx {

// A convolution's geometry: input (n, c, h, w), kernel, strides, dilations, pads (top, left, bottom, right),
// groups, and the output size it gives.
struct Im2colShape {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1;
  int64_t pt = 0, pl = 0, pb = 0, pr = 0;
  int64_t group = 1;
  bool wide = false;  // columns over the padded width (stride 1 only): see im2col_wide
  bool batch_inner = false;  // columns (G, K, N * OH * OW) instead of (N, G, K, OH * OW): see column_block
  int64_t oh = 0, ow = 0;

  int64_t hp() const { return h + pt + pb; }
  int64_t wp() const { return w + pl + pr; }
  // Columns per window position: OH * OW, or OH * WP when wide.
  int64_t positions() const { return oh * (wide ? wp() : ow); }
  // Bytes between planes of the padded copy: a wide plane has dw * (kw - 1) bytes after it, which its last
  // windows read (im2col_wide), so that no plane's windows reach into another's.
  int64_t plane_stride() const { return hp() * wp() + (wide ? dw * (kw - 1) : 0); }
};

// Fills in oh and ow; returns an error message, empty when the geometry is valid. Every size is bounded so that
// no product below overflows int64 and the columns and the padded copy stay under 2^31 elements.
inline std::string im2col_geometry(Im2colShape& s) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  for (int64_t v : {s.kh, s.kw, s.sh, s.sw, s.dh, s.dw, s.group}) {
    if (v < 1 || v >= kLimit) return "kernel_shape, strides, dilations and group must be positive int32 values";
  }
  for (int64_t v : {s.pt, s.pl, s.pb, s.pr}) {
    if (v < 0 || v >= kLimit) return "pads must be non-negative int32 values";
  }
  if (s.wide && (s.sh != 1 || s.sw != 1)) return "wide columns need strides (1, 1)";
  if (s.wide && s.batch_inner) return "wide and batch_inner columns do not go together";
  if (s.c % s.group != 0) {
    return "the input's " + std::to_string(s.c) + " channels do not divide into group " + std::to_string(s.group);
  }
  const int64_t span_h = s.dh * (s.kh - 1) + 1, span_w = s.dw * (s.kw - 1) + 1;
  if (s.h + s.pt + s.pb < span_h || s.w + s.pl + s.pr < span_w) return "the kernel is larger than the padded input";
  s.oh = (s.h + s.pt + s.pb - span_h) / s.sh + 1;
  s.ow = (s.w + s.pl + s.pr - span_w) / s.sw + 1;
  const double columns = static_cast<double>(s.n) * s.c * s.kh * s.kw * s.oh * (s.wide ? s.wp() : s.ow);
  const double padded = static_cast<double>(s.n) * s.c * s.plane_stride();
  if (std::max(columns, padded) >= 2147483648.0) {
    return "the columns or the padded input would have 2^31 elements or more";
  }
  return {};
}

// dst[i] = x[i] + offset as a byte (x + 128 and, for int8, x itself, have the byte of the value mod 256); returns
// false when some x lies outside [-128, 127]. Branch-free, so it vectorizes.
inline bool narrow_row(const int32_t* x, int64_t count, uint32_t offset, uint8_t* dst) {
  uint32_t seen = 0;
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t v = static_cast<uint32_t>(x[i]) + 128u;  // in [0, 255] exactly when x is in [-128, 127]
    seen |= v;
    dst[i] = static_cast<uint8_t>(v + offset - 128u);
  }
  return seen <= 255u;
}

namespace body {  // (isa.h)

// Copies plane `plane` of x (n, c, h, w) into xp (n, c, h + pt + pb, w + pl + pr; planes plane_stride() apart)
// as the bytes of x + offset, offset in the padding. Returns the flat index of the first x of the plane outside
// [-128, 127] (then the plane is incomplete), or -1: x + offset fits the columns' type exactly (offset 0 for
// int8, 128 for uint8).
CVM_KERNEL_BODY int64_t pad_narrow(const int32_t* x, const Im2colShape& s, uint32_t offset, int64_t plane,
                                   uint8_t* xp) {
  const int64_t wp = s.wp(), stride = s.plane_stride();
  std::fill(xp + plane * stride, xp + (plane + 1) * stride, static_cast<uint8_t>(offset));
  for (int64_t y = 0; y < s.h; ++y) {
    const int32_t* src = x + (plane * s.h + y) * s.w;
    if (!narrow_row(src, s.w, offset, xp + plane * stride + (y + s.pt) * wp + s.pl)) {
      for (int64_t i = 0; i < s.w; ++i) {
        if (src[i] < -128 || src[i] > 127) return (plane * s.h + y) * s.w + i;
      }
    }
  }
  return -1;
}

}  // namespace body

// dst[0:count] = src[0:count]. Rows are short (a call to memmove per row would cost more than the copy): the
// usual widths are copied with a constant size, which compiles to a few vector moves.
template <typename Out>
inline void copy_row(const Out* src, int64_t count, Out* dst) {
  switch (count) {
    case 8: std::memcpy(dst, src, 8); return;
    case 16: std::memcpy(dst, src, 16); return;
    case 32: std::memcpy(dst, src, 32); return;
    case 64: std::memcpy(dst, src, 64); return;
    default: break;
  }
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) std::memcpy(dst + i, src + i, 8);
  for (; i < count; ++i) dst[i] = src[i];
}

// dst[0:count] = src[0:2*count:2]: a constant stride and no aliasing, so it vectorizes.
template <typename Out>
inline void copy_every_second(const Out* __restrict src, int64_t count, Out* __restrict dst) {
  for (int64_t i = 0; i < count; ++i) dst[i] = src[2 * i];
}

// Where the OH * OW columns of window position f = fh * kw + fw of plane `plane` = n * C + ch start: at
// (plane * kh * kw + f) * OH * OW, or with batch_inner (columns (G, K, N * OH * OW): every sample's columns of one
// window row side by side, so that one GEMM takes the whole batch) at ((ch * kh * kw + f) * N + n) * OH * OW.
inline int64_t column_block(const Im2colShape& s, int64_t plane, int64_t f) {
  const int64_t window = s.kh * s.kw, count = s.oh * s.ow;
  return s.batch_inner ? (((plane % s.c) * window + f) * s.n + plane / s.c) * count : (plane * window + f) * count;
}

// cols[n, g, (c * kh + fh) * kw + fw, oh * OW + ow] = xp[n, g * C/G + c, oh*sh + fh*dh, ow*sw + fw*dw] for plane
// `plane` = n * C + g * C/G + c of the padded copy xp of pad_narrow (batch_inner: cols[g, (c * kh + fh) * kw + fw,
// (n * OH + oh) * OW + ow]). Memory order (n, g, c) is the input's channel order, so the planes fill every group;
// with stride 1 each output row is one contiguous copy.
template <typename Out>
void im2col(const Out* xp, const Im2colShape& s, int64_t plane, Out* out) {
  const int64_t wp = s.wp();
  const Out* base = xp + plane * s.plane_stride();
  for (int64_t fh = 0; fh < s.kh; ++fh) {
    for (int64_t fw = 0; fw < s.kw; ++fw) {
      Out* dst = out + column_block(s, plane, fh * s.kw + fw);
      for (int64_t oh = 0; oh < s.oh; ++oh, dst += s.ow) {
        const Out* src = base + (oh * s.sh + fh * s.dh) * wp + fw * s.dw;
        if (s.sw == 1) {
          copy_row(src, s.ow, dst);
        } else if (s.sw == 2) {
          copy_every_second(src, s.ow, dst);
        } else {
          for (int64_t ow = 0; ow < s.ow; ++ow) dst[ow] = src[ow * s.sw];
        }
      }
    }
  }
}

// Wide columns (stride 1): cols[n, g, (c * kh + fh) * kw + fw, oh * WP + j] = xp[plane, oh + fh*dh, j + fw*dw],
// reading on into the following rows (and the plane's slack) for j >= OW. Each window position is then one
// contiguous copy of OH * WP bytes; a product over column oh * WP + j with j < OW is the convolution's output
// (oh, j), and the columns j >= OW give values the caller drops (requantize's width).
template <typename Out>
void im2col_wide(const Out* xp, const Im2colShape& s, int64_t plane, Out* out) {
  const int64_t wp = s.wp(), count = s.oh * wp;
  Out* dst = out + plane * s.kh * s.kw * count;
  for (int64_t fh = 0; fh < s.kh; ++fh) {
    for (int64_t fw = 0; fw < s.kw; ++fw, dst += count) {
      std::memcpy(dst, xp + plane * s.plane_stride() + fh * s.dh * wp + fw * s.dw, static_cast<size_t>(count));
    }
  }
}


// Rows (group 1): rows[n, oh * OW + ow, (fh * kw + fw) * C + c] = x[n, c, oh*sh + fh*dh - pt, ow*sw + fw*dw - pl]
// + offset, `fill` in the padding: each output position one row of K = kh * kw * C bytes, the left operand of a
// product by the (K, OC) weights. Values must lie in [lo, hi] (offset 0: [0, 127]; 128: [-128, 127]; with a zero
// point: [0, 255], the zero point the fill).

// dst[j * dst_stride + i] = src[i * src_stride + j] for an 8 x 8 block of bytes (SSE2 unpacks on x86-64).
inline void transpose8x8(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride) {
#if defined(__SSE2__)
  __m128i r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i * src_stride));
  const __m128i a0 = _mm_unpacklo_epi8(r[0], r[1]), a1 = _mm_unpacklo_epi8(r[2], r[3]);
  const __m128i a2 = _mm_unpacklo_epi8(r[4], r[5]), a3 = _mm_unpacklo_epi8(r[6], r[7]);
  const __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);
  const __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);
  const __m128i c[4] = {_mm_unpacklo_epi32(b0, b2), _mm_unpackhi_epi32(b0, b2), _mm_unpacklo_epi32(b1, b3),
                        _mm_unpackhi_epi32(b1, b3)};
  for (int j = 0; j < 4; ++j) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + 2 * j * dst_stride), c[j]);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + (2 * j + 1) * dst_stride), _mm_unpackhi_epi64(c[j], c[j]));
  }
#else
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) dst[j * dst_stride + i] = src[i * src_stride + j];
  }
#endif
}

namespace body {  // (isa.h)

// Image n of x (n, c, h, w) into xp (HP, WP, C) bytes (images hp() * wp() * C apart) as x + offset, `fill` in the
// padding: the narrowing of pad_narrow with the channels innermost (each input row narrowed plane by plane, then
// transposed in 8 x 8 blocks). Returns the flat index of the first x of the image outside [lo, hi] (then the copy
// is incomplete), or -1.
CVM_KERNEL_BODY int64_t pad_narrow_hwc(const int32_t* x, const Im2colShape& s, int32_t lo, int32_t hi,
                                       uint32_t offset, uint8_t fill, int64_t n, uint8_t* xp) {
  const int64_t c = s.c, w = s.w, wp = s.wp(), size = s.hp() * wp * c;
  uint8_t* base = xp + n * size;
  std::fill(base, base + size, fill);
  const uint32_t span = static_cast<uint32_t>(hi) - static_cast<uint32_t>(lo);
  std::vector<uint8_t> narrow(static_cast<size_t>(c * w));  // one input row of every plane: (C, W)
  for (int64_t y = 0; y < s.h; ++y) {
    uint32_t outside = 0;
    for (int64_t ch = 0; ch < c; ++ch) {
      const int32_t* src = x + ((n * c + ch) * s.h + y) * w;
      uint8_t* dst = narrow.data() + ch * w;
      for (int64_t i = 0; i < w; ++i) {
        outside |= static_cast<uint32_t>(static_cast<uint32_t>(src[i]) - static_cast<uint32_t>(lo) > span);
        dst[i] = static_cast<uint8_t>(static_cast<uint32_t>(src[i]) + offset);
      }
    }
    if (outside) {
      for (int64_t ch = 0; ch < c; ++ch) {
        const int32_t* src = x + ((n * c + ch) * s.h + y) * w;
        for (int64_t i = 0; i < w; ++i) {
          if (src[i] < lo || src[i] > hi) return ((n * c + ch) * s.h + y) * w + i;
        }
      }
    }
    uint8_t* row = base + ((y + s.pt) * wp + s.pl) * c;  // row[i * C + ch] = narrow[ch * W + i]
    const int64_t c8 = c - c % 8, w8 = w - w % 8;
    for (int64_t ch = 0; ch < c8; ch += 8) {
      for (int64_t i = 0; i < w8; i += 8) transpose8x8(narrow.data() + ch * w + i, w, row + i * c + ch, c);
    }
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t i = ch < c8 ? w8 : 0; i < w; ++i) row[i * c + ch] = narrow[ch * w + i];
    }
  }
  return -1;
}

// pad_narrow_hwc for data already (n, h, w, c) (channels innermost): each input row one contiguous narrowing.
CVM_KERNEL_BODY int64_t pad_narrow_nhwc(const int32_t* x, const Im2colShape& s, int32_t lo, int32_t hi,
                                        uint32_t offset, uint8_t fill, int64_t n, uint8_t* xp) {
  const int64_t c = s.c, w = s.w, wp = s.wp(), size = s.hp() * wp * c, row = w * c;
  uint8_t* base = xp + n * size;
  std::fill(base, base + size, fill);
  const uint32_t span = static_cast<uint32_t>(hi) - static_cast<uint32_t>(lo);
  for (int64_t y = 0; y < s.h; ++y) {
    const int32_t* src = x + (n * s.h + y) * row;
    uint8_t* dst = base + ((y + s.pt) * wp + s.pl) * c;
    uint32_t outside = 0;
    for (int64_t i = 0; i < row; ++i) {
      outside |= static_cast<uint32_t>(static_cast<uint32_t>(src[i]) - static_cast<uint32_t>(lo) > span);
      dst[i] = static_cast<uint8_t>(static_cast<uint32_t>(src[i]) + offset);
    }
    if (outside) {
      for (int64_t i = 0; i < row; ++i) {
        if (src[i] < lo || src[i] > hi) return (n * s.h + y) * row + i;
      }
    }
  }
  return -1;
}

// pad_narrow_nhwc for uint8 data (n, h, w, c) taken as themselves (any value fits the rows): each input row one
// contiguous copy.
CVM_KERNEL_BODY void pad_copy_nhwc(const uint8_t* x, const Im2colShape& s, uint8_t fill, int64_t n, uint8_t* xp) {
  const int64_t c = s.c, line = s.wp() * c, row = s.w * c;
  uint8_t* base = xp + n * s.hp() * line;
  std::fill(base, base + s.pt * line, fill);  // the rows above
  for (int64_t y = 0; y < s.h; ++y) {
    uint8_t* dst = base + (y + s.pt) * line;
    std::fill(dst, dst + s.pl * c, fill);
    std::memcpy(dst + s.pl * c, x + (n * s.h + y) * row, static_cast<size_t>(row));
    std::fill(dst + s.pl * c + row, dst + line, fill);
  }
  std::fill(base + (s.h + s.pt) * line, base + s.hp() * line, fill);  // the rows below
}

}  // namespace body

// The rows of output row `oh` of image n: for each of the OW positions, kh * pieces copies of `Piece` bytes (a
// constant for the usual sizes, so that each copy is a few vector moves); the shape's fields are read into locals
// first (byte stores may alias them).
template <int64_t Piece>
inline void copy_rows(const uint8_t* base, int64_t ow_count, int64_t kh, int64_t pieces, int64_t src_step,
                      int64_t row_step, int64_t piece_step, int64_t piece, uint8_t* dst) {
  const int64_t size = Piece > 0 ? Piece : piece;
  for (int64_t ow = 0; ow < ow_count; ++ow) {
    for (int64_t fh = 0; fh < kh; ++fh) {
      const uint8_t* src = base + ow * src_step + fh * row_step;
      for (int64_t fw = 0; fw < pieces; ++fw, dst += size) std::memcpy(dst, src + fw * piece_step, size);
    }
  }
}

namespace body {  // (isa.h)

// The rows of output row `oh` of image n (OW rows of K bytes) from the copy of pad_narrow_hwc. With dilation 1
// along W, each (position, fh) is one contiguous copy of kw * C bytes.
CVM_KERNEL_BODY void im2col_rows(const uint8_t* xp, const Im2colShape& s, int64_t n, int64_t oh, uint8_t* rows) {
  const int64_t c = s.c, wp = s.wp(), k = s.kh * s.kw * c, kh = s.kh, ow_count = s.ow;
  const uint8_t* base = xp + (n * s.hp() * wp + oh * s.sh * wp) * c;
  uint8_t* dst = rows + (n * s.oh + oh) * ow_count * k;
  const int64_t piece = s.dw == 1 ? s.kw * c : c, pieces = s.dw == 1 ? 1 : s.kw;
  const int64_t src_step = s.sw * c, row_step = s.dh * wp * c, piece_step = s.dw * c;
  switch (piece) {
    case 16: return copy_rows<16>(base, ow_count, kh, pieces, src_step, row_step, piece_step, piece, dst);
    case 32: return copy_rows<32>(base, ow_count, kh, pieces, src_step, row_step, piece_step, piece, dst);
    case 48: return copy_rows<48>(base, ow_count, kh, pieces, src_step, row_step, piece_step, piece, dst);
    case 64: return copy_rows<64>(base, ow_count, kh, pieces, src_step, row_step, piece_step, piece, dst);
    case 96: return copy_rows<96>(base, ow_count, kh, pieces, src_step, row_step, piece_step, piece, dst);
    case 128: return copy_rows<128>(base, ow_count, kh, pieces, src_step, row_step, piece_step, piece, dst);
    case 192: return copy_rows<192>(base, ow_count, kh, pieces, src_step, row_step, piece_step, piece, dst);
    default: return copy_rows<0>(base, ow_count, kh, pieces, src_step, row_step, piece_step, piece, dst);
  }
}

}  // namespace body

}  // namespace cvm_onnx
