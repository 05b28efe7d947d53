#include "ops/cpu/kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/fp_convert.h"
#include "core/range_shares.h"
#include "core/thread_pool.h"
#include "formats/quant.h"
#include "ops/cpu/kern_gguf.h"
#include "ops/cpu/packed.h"
#include "ops/cpu/packed_kernels.h"
#include "ops/cpu/q0_x4.h"
#include "ops/cpu/q4k_x16.h"
#include "ops/cpu/q6k_x16.h"
#include "ops/cpu/token_blocks.h"

namespace tandem::kern {

using detail::GemmArgs;
using detail::GemmFn;
using detail::GgufKernels;

namespace {
bool is_x16(WFormat f) {
  return f == WFormat::kQ4_KX16 || f == WFormat::kQ6_KX16;
}
}  // namespace

const char* wformat_name(WFormat f) {
  switch (f) {
    case WFormat::kF32: return "f32";
    case WFormat::kF16: return "f16";
    case WFormat::kBF16: return "bf16";
    case WFormat::kFP8Block: return "fp8";
    case WFormat::kInt8: return "int8";
    case WFormat::kInt4: return "int4";
    case WFormat::kQ4_K: return "q4_k";
    case WFormat::kQ5_K: return "q5_k";
    case WFormat::kQ6_K: return "q6_k";
    case WFormat::kQ8_0: return "q8_0";
    case WFormat::kQ5_0: return "q5_0";
    case WFormat::kQ4_0: return "q4_0";
    case WFormat::kQ4_1: return "q4_1";
    case WFormat::kQ5_1: return "q5_1";
    case WFormat::kQ2_K: return "q2_k";
    case WFormat::kQ3_K: return "q3_k";
    case WFormat::kBF16Tile: return "bf16-tile";
    case WFormat::kQ4_KX16: return "q4_k-x16";
    case WFormat::kQ5_0X4: return "q5_0-x4";
    case WFormat::kQ8_0X4: return "q8_0-x4";
    case WFormat::kQ6_KX16: return "q6_k-x16";
    case WFormat::kMXFP4: return "mxfp4";
  }
  return "?";
}

AFormat act_format(WFormat f) {
  switch (f) {
    case WFormat::kF32:
    case WFormat::kF16:
    case WFormat::kBF16: return AFormat::kF32;
    case WFormat::kFP8Block:
    case WFormat::kBF16Tile: return AFormat::kBF16;
    case WFormat::kInt8:
    case WFormat::kInt4: return AFormat::kI8;
    case WFormat::kQ2_K:
    case WFormat::kQ3_K:
    case WFormat::kQ4_K:
    case WFormat::kQ4_KX16:
    case WFormat::kQ5_K:
    case WFormat::kQ6_K:
    case WFormat::kQ6_KX16: return AFormat::kQ8_K;
    case WFormat::kQ8_0:
    case WFormat::kQ8_0X4:
    case WFormat::kQ5_0:
    case WFormat::kQ5_0X4:
    case WFormat::kQ4_0:
    case WFormat::kQ4_1:
    case WFormat::kQ5_1:
    case WFormat::kMXFP4: return AFormat::kQ8_0;
  }
  return AFormat::kF32;
}

uint64_t KMatrix::bytes() const {
  // Q4_K / Q6_K x16: whole tiles (a last tile's missing rows are zero blocks, read like the
  // others).
  const int64_t r = is_x16(format) ? (rows + 15) / 16 * 16 : rows;
  return static_cast<uint64_t>(r) * static_cast<uint64_t>(row_bytes);
}

bool view_weight(const ops::Weight& w, KMatrix* out) {
  if (w.empty() || w.t.ndim < 1) return false;
  if (w.scale_inv != nullptr) return fp8_view(w, out);  // block-scaled FP8 (packed.h)
  WFormat f;
  switch (w.t.dtype) {
    case DType::kF32: f = WFormat::kF32; break;
    case DType::kF16: f = WFormat::kF16; break;
    case DType::kBF16: f = WFormat::kBF16; break;
    case DType::kQ4_K: f = WFormat::kQ4_K; break;
    case DType::kQ5_K: f = WFormat::kQ5_K; break;
    case DType::kQ6_K: f = WFormat::kQ6_K; break;
    case DType::kQ8_0: f = WFormat::kQ8_0; break;
    case DType::kQ5_0: f = WFormat::kQ5_0; break;
    case DType::kQ4_0: f = WFormat::kQ4_0; break;
    case DType::kQ4_1: f = WFormat::kQ4_1; break;
    case DType::kQ5_1: f = WFormat::kQ5_1; break;
    case DType::kQ2_K: f = WFormat::kQ2_K; break;
    case DType::kQ3_K: f = WFormat::kQ3_K; break;
    case DType::kMXFP4: f = WFormat::kMXFP4; break;
    default: return false;
  }
  KMatrix m;
  m.format = f;
  m.rows = w.rows();
  m.cols = w.cols();
  m.data = static_cast<const uint8_t*>(w.t.data);
  m.row_bytes = static_cast<int64_t>(w.t.row_bytes());
  *out = m;
  return true;
}

namespace {
bool is_packed(WFormat f) {
  return packed_tiled(f) || f == WFormat::kFP8Block;
}
}  // namespace

int64_t row_align(const KMatrix& w) {
  if (is_x16(w.format)) return kQ4KX16Rows;
  return packed_tiled(w.format) ? packed_row_align(w) : 1;
}

namespace {

// Row-major formats: values per block and bytes per block along a row.
struct RowBlocks {
  int64_t values, bytes;
};
RowBlocks row_blocks(WFormat f) {
  switch (f) {
    case WFormat::kF32: return {1, 4};
    case WFormat::kF16:
    case WFormat::kBF16: return {1, 2};
    case WFormat::kFP8Block: return {1, 1};
    case WFormat::kQ4_K:
    case WFormat::kQ4_KX16: return {kQK_K, sizeof(BlockQ4_K)};  // x16: per row within its tile
    case WFormat::kQ5_K: return {kQK_K, sizeof(BlockQ5_K)};
    case WFormat::kQ6_K:
    case WFormat::kQ6_KX16: return {kQK_K, sizeof(BlockQ6_K)};
    case WFormat::kQ8_0:
    case WFormat::kQ8_0X4: return {kQK, sizeof(BlockQ8_0)};  // x4: quads of them (col_align)
    case WFormat::kQ5_0:
    case WFormat::kQ5_0X4: return {kQK, sizeof(BlockQ5_0)};
    case WFormat::kQ4_0: return {kQK, sizeof(BlockQ4_0)};
    case WFormat::kQ4_1: return {kQK, sizeof(BlockQ4_1)};
    case WFormat::kQ5_1: return {kQK, sizeof(BlockQ5_1)};
    case WFormat::kQ2_K: return {kQK_K, sizeof(BlockQ2_K)};
    case WFormat::kQ3_K: return {kQK_K, sizeof(BlockQ3_K)};
    case WFormat::kMXFP4: return {kQK, sizeof(BlockMXFP4)};
    case WFormat::kInt8:
    case WFormat::kInt4:
    case WFormat::kBF16Tile: break;
  }
  fail(ErrorKind::kInvalidArgument, "{} is not a row-major format", wformat_name(f));
}

}  // namespace

int64_t col_align(const KMatrix& w) {
  if (w.format == WFormat::kInt8 || w.format == WFormat::kInt4) return w.group;
  if (w.format == WFormat::kBF16Tile) return 2;  // one k pair
  if (w.format == WFormat::kFP8Block) return w.block_cols;
  if (w.format == WFormat::kQ5_0X4 || w.format == WFormat::kQ8_0X4) return 4 * kQK;  // quads
  return row_blocks(w.format).values;
}

KMatrix copy_submatrix(const KMatrix& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                       const AllocOptions& alloc) {
  const int64_t ra = row_align(w), ca = col_align(w);
  if (!(0 <= r0 && r0 < r1 && r1 <= w.rows && 0 <= c0 && c0 < c1 && c1 <= w.cols) ||
      r0 % ra != 0 || (r1 % ra != 0 && r1 != w.rows) || c0 % ca != 0 ||
      (c1 % ca != 0 && c1 != w.cols)) {
    fail(ErrorKind::kInvalidArgument,
         "submatrix rows [{}, {}) x cols [{}, {}) of a {} x {} {} matrix: out of range or not on "
         "its {}-row / {}-column grid",
         r0, r1, c0, c1, w.rows, w.cols, wformat_name(w.format), ra, ca);
  }
  if (packed_tiled(w.format)) {
    return packed_copy_submatrix(w, r0, r1, c0, c1, alloc);
  }
  if (w.format == WFormat::kQ4_KX16) return q4k_x16_copy_submatrix(w, r0, r1, c0, c1, alloc);
  if (w.format == WFormat::kQ6_KX16) return q6k_x16_copy_submatrix(w, r0, r1, c0, c1, alloc);
  const RowBlocks rb = row_blocks(w.format);
  const int64_t off = c0 / rb.values * rb.bytes;
  const int64_t len = (c1 - c0 + rb.values - 1) / rb.values * rb.bytes;
  struct Owner {
    AlignedBuffer buf;
    std::shared_ptr<const void> source;  // FP8 scales live there
  };
  auto owner = std::make_shared<Owner>();
  owner->buf = AlignedBuffer(static_cast<size_t>((r1 - r0) * len), alloc);
  owner->source = w.owner;
  uint8_t* dst = owner->buf.as<uint8_t>();
  for (int64_t r = r0; r < r1; ++r) {
    std::memcpy(dst + (r - r0) * len, w.data + r * w.row_bytes + off, static_cast<size_t>(len));
  }
  KMatrix m = w;
  m.rows = r1 - r0;
  m.cols = c1 - c0;
  m.data = dst;
  m.row_bytes = len;
  if (w.format == WFormat::kFP8Block) {
    m.scales = w.scales + c0 / w.block_cols;
    m.row0 = w.row0 + r0;
  }
  m.owner = std::move(owner);
  return m;
}

int64_t block_of(AFormat f) {
  switch (f) {
    case AFormat::kQ8_K: return kQK_K;
    case AFormat::kQ8_0: return kQK;
    default: return 1;
  }
}

namespace {

int64_t act_row_bytes(AFormat f, int64_t cols) {
  switch (f) {
    case AFormat::kF32: return cols * 4;
    case AFormat::kBF16: return cols * 2;
    case AFormat::kQ8_K: return cols / kQK_K * static_cast<int64_t>(sizeof(BlockQ8_K));
    case AFormat::kQ8_0: return detail::q8_0_act_row_bytes(cols / kQK);
    case AFormat::kI8: break;
  }
  fail(ErrorKind::kUnsupported, "activation format int8 needs the packed kernels");
}

// The kernel table for `isa`, falling back level by level for entries a level lacks.
GemmFn pick(Isa isa, GemmFn GgufKernels::*entry) {
  const Isa best = best_isa();
  if (isa > best) isa = best;
  if (isa >= Isa::kAvx512Vnni && detail::gguf_kernels_avx512_vnni().*entry) {
    return detail::gguf_kernels_avx512_vnni().*entry;
  }
  if (isa >= Isa::kAvx512 && detail::gguf_kernels_avx512().*entry) {
    return detail::gguf_kernels_avx512().*entry;
  }
  if (isa >= Isa::kAvx2 && detail::gguf_kernels_avx2().*entry) {
    return detail::gguf_kernels_avx2().*entry;
  }
  return detail::gguf_kernels_scalar().*entry;
}

GemmFn GgufKernels::*entry_of(WFormat f) {
  switch (f) {
    case WFormat::kF32: return &GgufKernels::f32;
    case WFormat::kF16: return &GgufKernels::f16;
    case WFormat::kBF16: return &GgufKernels::bf16;
    case WFormat::kQ4_K: return &GgufKernels::q4_k;
    case WFormat::kQ5_K: return &GgufKernels::q5_k;
    case WFormat::kQ6_K: return &GgufKernels::q6_k;
    case WFormat::kQ8_0: return &GgufKernels::q8_0;
    case WFormat::kQ5_0: return &GgufKernels::q5_0;
    case WFormat::kQ4_0: return &GgufKernels::q4_0;
    case WFormat::kQ4_1: return &GgufKernels::q4_1;
    case WFormat::kQ5_1: return &GgufKernels::q5_1;
    case WFormat::kQ2_K: return &GgufKernels::q2_k;
    case WFormat::kQ3_K: return &GgufKernels::q3_k;
    case WFormat::kQ4_KX16: return &GgufKernels::q4_kx16;
    case WFormat::kQ5_0X4: return &GgufKernels::q5_0x4;
    case WFormat::kQ8_0X4: return &GgufKernels::q8_0x4;
    case WFormat::kMXFP4: return &GgufKernels::mxfp4;
    default: break;
  }
  fail(ErrorKind::kUnsupported, "no CPU kernel for weight format {}", wformat_name(f));
}

GemmArgs make_args(const KMatrix& w, const Activations& a, int64_t n0, int64_t n1, float* y,
                   int64_t ldy) {
  TD_CHECK(a.format == act_format(w.format), "kern::gemm: {} weights need other activations",
           wformat_name(w.format));
  TD_CHECK(a.cols == w.cols, "kern::gemm: activations have {} columns, the weight {}", a.cols,
           w.cols);
  TD_CHECK(n0 >= 0 && n0 <= n1 && n1 <= w.rows, "kern::gemm: rows [{}, {}) of {}", n0, n1, w.rows);
  GemmArgs g;
  g.w = w.data;
  g.row_bytes = w.row_bytes;
  g.cols = w.cols;
  g.act = a.data.data();
  g.act_row_bytes = a.row_bytes;
  g.tokens = a.tokens;
  g.n0 = n0;
  g.n1 = n1;
  g.y = y;
  g.ldy = ldy;
  return g;
}

}  // namespace

void quantize_activations(AFormat format, int group, const float* x, int64_t tokens, int64_t cols,
                          int64_t ldx, Activations* out, ThreadPool* pool, Isa isa) {
  if (format == AFormat::kI8 || format == AFormat::kBF16) {
    packed_quantize_activations(format, group, x, tokens, cols, ldx, out, pool, isa);
    return;
  }
  const int64_t block = block_of(format);
  if (cols % block != 0) {
    fail(ErrorKind::kUnsupported, "activations of {} values are not a multiple of the block {}",
         cols, block);
  }
  out->format = format;
  out->tokens = tokens;
  out->cols = cols;
  out->group = group;
  out->row_bytes = act_row_bytes(format, cols);
  const size_t need = static_cast<size_t>(out->row_bytes * tokens);
  if (out->data.size() < need) out->data.resize(need);
  const Isa level = std::min(isa, best_isa());
  const bool avx512 = level >= Isa::kAvx512, avx2 = level >= Isa::kAvx2;
  auto row = [&](int64_t t) {
    const float* src = x + t * ldx;
    uint8_t* dst = out->data.data() + t * out->row_bytes;
    switch (format) {
      case AFormat::kF32: std::memcpy(dst, src, static_cast<size_t>(cols) * 4); break;
      case AFormat::kQ8_K:
        if (avx512) {
          detail::quantize_q8_k_avx512(src, reinterpret_cast<BlockQ8_K*>(dst), cols / kQK_K);
        } else if (avx2) {
          detail::quantize_q8_k_avx2(src, reinterpret_cast<BlockQ8_K*>(dst), cols / kQK_K);
        } else {
          quantize_row(DType::kQ8_K, src, dst, cols);
        }
        break;
      case AFormat::kQ8_0: {
        if (avx512 || avx2) {
          (avx512 ? detail::quantize_q8_0_act_avx512 : detail::quantize_q8_0_act_avx2)(src, dst,
                                                                                       cols);
          break;
        }
        quantize_row(DType::kQ8_0, src, dst, cols);
        const int64_t nb = cols / kQK, nbp = detail::q8_0_act_padded_blocks(nb);
        const auto* blk = reinterpret_cast<const BlockQ8_0*>(dst);
        auto* negc = reinterpret_cast<int32_t*>(dst + detail::q8_0_act_aux_offset(nb));
        auto* d = reinterpret_cast<float*>(negc + nbp);
        float* s = d + nbp;
        for (int64_t b = 0; b < nbp; ++b) {
          int32_t sum = 0;
          BlockQ8_1 q1{};  // ggml's Q8_1 of the same block: its s (its d and qs are Q8_0's)
          if (b < nb) {
            for (int i = 0; i < kQK; ++i) sum += blk[b].qs[i];
            quantize_row(DType::kQ8_1, src + b * kQK, reinterpret_cast<uint8_t*>(&q1), kQK);
          }
          negc[b] = -128 * sum;
          d[b] = b < nb ? f16_to_f32(blk[b].d) : 0.0f;
          s[b] = b < nb ? f16_to_f32(q1.s) : 0.0f;
        }
        break;
      }
      case AFormat::kBF16:
      case AFormat::kI8: break;  // packed_quantize_activations (above)
    }
  };
  detail::for_token_blocks(pool, tokens, row);
}

namespace {

// Q4_K / Q6_K x16 without their AVX-512 VNNI kernel (lower levels, the reference; Q6_K x16 for
// 16 tokens and more too): each tile's rows back in GGUF order in a thread-local buffer
// (`unpack`: q4k_x16_unpack or q6k_x16_unpack), then the format's row kernel `rows` on the
// call's rows of that tile (the same arithmetic as the tile kernel: the same bits).
void x16_through_rows(const GemmArgs& g, void (*unpack)(const uint8_t*, int64_t, uint8_t*),
                      GemmFn rows) {
  const int64_t tile_bytes = kQ4KX16Rows * g.row_bytes;
  thread_local std::vector<uint8_t> buf;
  buf.resize(static_cast<size_t>(tile_bytes));
  for (int64_t t = g.n0 / kQ4KX16Rows; t * kQ4KX16Rows < g.n1; ++t) {
    const int64_t first = t * kQ4KX16Rows;
    unpack(g.w + t * tile_bytes, g.cols, buf.data());
    GemmArgs r = g;
    r.w = buf.data();
    r.n0 = std::max(g.n0, first) - first;
    r.n1 = std::min(g.n1, first + kQ4KX16Rows) - first;
    r.y = g.y + first;  // rows of this tile are columns first.. of y
    rows(r);
  }
}

void check_x16_rows(const KMatrix& w, int64_t n0) {
  TD_CHECK(!is_x16(w.format) || n0 % kQ4KX16Rows == 0,
           "kern::gemm: {} rows start on a tile ({} is not a multiple of 16)",
           wformat_name(w.format), n0);
}

// Q6_K x16 tiles for fewer tokens than this run the tile kernel, four tokens per pass over each
// tile (the tile from cache after the first pass); more go through the rows unpacked into the
// tiled Q6_K GEMM, whose per-call rearrangement then costs less than the extra passes
// (bench_kernels_bench BM_FewTokensX16/q6_k, docs/performance.md C13).
constexpr int64_t kQ6KX16RowsMinTokens = 32;

// Few tokens on Q6_K x16 tiles: the tile kernel on rows [n0, n1) (n0 on a tile; a last partial
// tile computed whole into a scratch row per token).
void q6k_x16_gemv_rows(const GemmArgs& g) {
  const int64_t nb = g.cols / kQK_K, tile_bytes = kQ6KX16Rows * g.row_bytes;
  const auto* act = reinterpret_cast<const BlockQ8_K*>(g.act);
  const int64_t t0 = g.n0 / kQ6KX16Rows, full = g.n1 / kQ6KX16Rows;
  if (full > t0) {
    q6k_x16_gemv_vnni(g.w + t0 * tile_bytes, full - t0, nb, act, g.y + 16 * t0, g.tokens,
                      g.act_row_bytes, g.ldy);
  }
  if (full * kQ6KX16Rows < g.n1) {
    alignas(64) float part[kQ6KX16RowsMinTokens][kQ6KX16Rows];
    q6k_x16_gemv_vnni(g.w + full * tile_bytes, 1, nb, act, part[0], g.tokens, g.act_row_bytes,
                      kQ6KX16Rows);
    for (int64_t k = 0; k < g.tokens; ++k) {
      for (int64_t r = full * kQ6KX16Rows; r < g.n1; ++r) {
        g.y[k * g.ldy + r] = part[k][r - full * kQ6KX16Rows];
      }
    }
  }
}

}  // namespace

void swiglu(const float* gate, const float* up, int64_t n, float* out, Isa isa) {
  isa = std::min(isa, best_isa());
  if (isa >= Isa::kAvx512) {
    detail::swiglu_avx512(gate, up, n, out);
  } else if (isa >= Isa::kAvx2) {
    detail::swiglu_avx2(gate, up, n, out);
  } else {
    ops::swiglu(gate, up, n, out);
  }
}

void gemm(const KMatrix& w, const Activations& a, int64_t n0, int64_t n1, float* y, int64_t ldy,
          Isa isa) {
  if (n0 == n1 || a.tokens == 0) return;
  if (is_packed(w.format)) {
    packed_gemm(w, a, n0, n1, y, ldy, isa);
    return;
  }
  if (w.format == WFormat::kQ4_KX16) {
    check_x16_rows(w, n0);
    const GemmArgs g = make_args(w, a, n0, n1, y, ldy);
    const GemmFn tile = std::min(isa, best_isa()) >= Isa::kAvx512Vnni
                            ? detail::gguf_kernels_avx512_vnni().q4_kx16
                            : nullptr;
    if (tile != nullptr) {
      tile(g);
    } else {
      x16_through_rows(g, q4k_x16_unpack, pick(isa, &GgufKernels::q4_k));
    }
    return;
  }
  if (w.format == WFormat::kQ6_KX16) {
    check_x16_rows(w, n0);
    const GemmArgs g = make_args(w, a, n0, n1, y, ldy);
    if (a.tokens < kQ6KX16RowsMinTokens && std::min(isa, best_isa()) >= Isa::kAvx512Vnni) {
      q6k_x16_gemv_rows(g);
    } else {
      x16_through_rows(g, q6k_x16_unpack, pick(isa, &GgufKernels::q6_k));
    }
    return;
  }
  WFormat stored;
  if (q0_x4_stored_format(w.format, &stored)) {
    const GemmArgs g = make_args(w, a, n0, n1, y, ldy);
    // (The VNNI table's code is compiled for AVX-512: looked at only where the CPU has it.)
    const GemmFn x4 = std::min(isa, best_isa()) >= Isa::kAvx512Vnni
                          ? detail::gguf_kernels_avx512_vnni().*entry_of(w.format)
                          : nullptr;
    if (x4 != nullptr) {
      x4(g);
    } else {
      detail::q0_x4_through_rows(g, static_cast<int>(stored), pick(isa, entry_of(stored)));
    }
    return;
  }
  pick(isa, entry_of(w.format))(make_args(w, a, n0, n1, y, ldy));
}

void gemm_reference(const KMatrix& w, const Activations& a, int64_t n0, int64_t n1, float* y,
                    int64_t ldy) {
  if (n0 == n1 || a.tokens == 0) return;
  if (is_packed(w.format)) {
    packed_gemm_reference(w, a, n0, n1, y, ldy);
    return;
  }
  if (w.format == WFormat::kQ4_KX16) {
    check_x16_rows(w, n0);
    x16_through_rows(make_args(w, a, n0, n1, y, ldy), q4k_x16_unpack,
                     detail::gguf_kernels_scalar().q4_k);
    return;
  }
  if (w.format == WFormat::kQ6_KX16) {
    check_x16_rows(w, n0);
    x16_through_rows(make_args(w, a, n0, n1, y, ldy), q6k_x16_unpack,
                     detail::gguf_kernels_scalar().q6_k);
    return;
  }
  WFormat stored;
  if (q0_x4_stored_format(w.format, &stored)) {
    detail::q0_x4_through_rows(make_args(w, a, n0, n1, y, ldy), static_cast<int>(stored),
                               detail::gguf_kernels_scalar().*entry_of(stored));
    return;
  }
  (detail::gguf_kernels_scalar().*entry_of(w.format))(make_args(w, a, n0, n1, y, ldy));
}

namespace {

// Rows per task of a matrix with row_bytes bytes per row in a call for `tokens` tokens that does
// not run in RangeShares (gemv_in_shares): a GEMV on one thread streams each matrix whole; a
// GEMM's tasks are worth hundreds of tokens each: 64 KiB and 16-256 rows, for balance.
int64_t rows_per_task(int64_t rows, int64_t row_bytes, int64_t tokens) {
  row_bytes = std::max<int64_t>(1, row_bytes);
  if (tokens <= 4) return std::max<int64_t>(1, rows);
  const int64_t n = std::min<int64_t>(256, (int64_t{64} << 10) / row_bytes);
  return std::max<int64_t>(16, n / 16 * 16);
}

// A GEMV (<= 4 tokens) of the matrices ws on the pool in RangeShares: items are groups of 16 rows,
// matrix after matrix; each thread's share (equal bytes) is one contiguous stream from its front
// in chunks, and a thread done with it steals the back half of the fullest other share.
// Why not a job of fixed tasks: every task starts a new stream (its first prefetch distance
// arrives as demand misses, its last is prefetched in vain), so tasks must be long, and then a
// thread that started late or ran slower leaves the others idle for up to a task at the end. Here
// each thread's stream is as long as its share and the tail is about one chunk
// (bench_kernels_bench BM_DenseDecodeX16 shares_vs_tasks compares the two).
void gemv_in_shares(std::span<const KMatrix* const> ws, const Activations& a,
                    std::span<float* const> ys, ThreadPool* pool, Isa isa) {
  constexpr int64_t kRows = 16;
  std::array<int64_t, kMaxSharedInput + 1> first{};  // matrix m's items [first[m], first[m + 1])
  int64_t total_bytes = 0, max_row_bytes = 1;
  for (size_t m = 0; m < ws.size(); ++m) {
    first[m + 1] = first[m] + (ws[m]->rows + kRows - 1) / kRows;
    total_bytes += ws[m]->rows * ws[m]->row_bytes;
    max_row_bytes = std::max(max_row_bytes, ws[m]->row_bytes);
  }
  const int64_t n_items = first[ws.size()];
  if (n_items == 0) return;
  const int shares = static_cast<int>(
      std::min<int64_t>({pool->size() + 1, RangeShares::kMaxShares, n_items}));
  // Share bounds at equal bytes (items of different matrices may differ in bytes).
  std::array<int64_t, RangeShares::kMaxShares + 1> bounds{};
  {
    int s = 1;
    int64_t bytes = 0;
    for (size_t m = 0; m < ws.size() && s < shares; ++m) {
      for (int64_t i = first[m]; i < first[m + 1] && s < shares; ++i) {
        bytes += kRows * ws[m]->row_bytes;
        while (s < shares && bytes * shares >= total_bytes * s) bounds[s++] = i + 1;
      }
    }
    for (; s <= shares; ++s) bounds[s] = n_items;
  }
  thread_local RangeShares split;
  split.reset(bounds.data(), shares);
  RangeShares* sp = &split;
  // Chunks of ~1/64 of a share, 64 KiB - 512 KiB: a decode layer's attention matrices (~1-2 MiB
  // per thread) in 64 KiB chunks, a tail of microseconds; an lm_head (~86 MiB per thread for
  // V2-Lite) in 512 KiB ones, fewer kernel calls (BM_LmHeadQ6K: 1 MiB chunks 0.99-1.02x the rate
  // of 64 KiB ones, within this VM's noise).
  const int64_t chunk_bytes =
      std::clamp<int64_t>(total_bytes / shares / 64, int64_t{64} << 10, int64_t{512} << 10);
  const int64_t chunk = std::max<int64_t>(1, chunk_bytes / (kRows * max_row_bytes));
  auto rows = [&](int64_t i0, int64_t i1) {
    for (size_t m = 0; m < ws.size(); ++m) {
      const int64_t b = std::max(i0, first[m]), e = std::min(i1, first[m + 1]);
      if (b >= e) continue;
      const KMatrix& w = *ws[m];
      gemm(w, a, (b - first[m]) * kRows, std::min(w.rows, (e - first[m]) * kRows), ys[m], w.rows,
           isa);
    }
  };
  pool->run(static_cast<size_t>(shares), [&](size_t s) {
    const int share = static_cast<int>(s);
    int64_t i0 = 0, i1 = 0;
    do {
      while (sp->take(share, chunk, &i0, &i1)) rows(i0, i1);
    } while (sp->steal_into(share));
  });
}

}  // namespace

void matmul(const KMatrix& w, const float* x, int64_t tokens, float* y, ThreadPool* pool,
            Activations* scratch) {
  const KMatrix* ws[1] = {&w};
  float* ys[1] = {y};
  matmul_shared_input(ws, x, tokens, ys, pool, scratch);
}

void matmul_shared_input(std::span<const KMatrix* const> ws, const float* x, int64_t tokens,
                         std::span<float* const> ys, ThreadPool* pool, Activations* scratch) {
  TD_CHECK(!ws.empty() && ws.size() == ys.size() && ws.size() <= kMaxSharedInput,
           "matmul_shared_input: {} matrices, {} outputs (1 to {})", ws.size(), ys.size(),
           kMaxSharedInput);
  const KMatrix& w0 = *ws[0];
  for (const KMatrix* w : ws) {
    TD_CHECK(w->cols == w0.cols && act_format(w->format) == act_format(w0.format) &&
                 w->group == w0.group,
             "matmul_shared_input: the matrices must take the same activations");
  }
  quantize_activations(act_format(w0.format), w0.group, x, tokens, w0.cols, w0.cols, scratch,
                       pool);
  const Activations& a = *scratch;
  const int64_t threads = pool != nullptr ? pool->size() + 1 : 1;
  const Isa isa = best_isa();
  if (pool != nullptr && threads > 1 && tokens <= 4) {
    gemv_in_shares(ws, a, ys, pool, isa);
    return;
  }
  // Tasks of every matrix in one list (matrix after matrix): one dispatch for all of them.
  struct Span {
    size_t first_task = 0;
    int64_t rows_per_task = 0;
  };
  std::array<Span, kMaxSharedInput> spans;  // no allocation per call: this is every matmul's path
  size_t n_tasks = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    const int64_t per = rows_per_task(ws[i]->rows, ws[i]->row_bytes, tokens);
    spans[i] = {n_tasks, per};
    n_tasks += static_cast<size_t>((ws[i]->rows + per - 1) / per);
  }
  auto task = [&](size_t i) {
    size_t m = ws.size() - 1;
    while (spans[m].first_task > i) --m;
    const KMatrix& w = *ws[m];
    const int64_t r0 = static_cast<int64_t>(i - spans[m].first_task) * spans[m].rows_per_task;
    gemm(w, a, r0, std::min(w.rows, r0 + spans[m].rows_per_task), ys[m], w.rows, isa);
  };
  if (pool == nullptr || n_tasks == 1) {
    for (size_t i = 0; i < n_tasks; ++i) task(i);
  } else {
    pool->run(n_tasks, task);
  }
}

namespace {

// w's prepared copy from views, else a view on its stored bytes.
bool view_of(const ops::Weight& w, const WeightViews* views, KMatrix* out) {
  if (views != nullptr) {
    const auto it = views->find(&w);
    if (it != views->end()) {
      *out = it->second;
      return true;
    }
  }
  return view_weight(w, out);
}

}  // namespace

void matmul(const ops::Weight& w, const float* x, int64_t tokens, float* y, ThreadPool* pool,
            const WeightViews* views) {
  KMatrix m;
  if (!view_of(w, views, &m) || m.cols % block_of(act_format(m.format)) != 0) {
    ops::matmul(w, x, tokens, y, pool);
    return;
  }
  thread_local Activations scratch;
  matmul(m, x, tokens, y, pool, &scratch);
}

void matmul_shared_input(std::span<const ops::Weight* const> ws, const float* x, int64_t tokens,
                         std::span<float* const> ys, ThreadPool* pool, const WeightViews* views) {
  TD_CHECK(ws.size() == ys.size() && ws.size() <= kMaxSharedInput,
           "matmul_shared_input: {} matrices, {} outputs (at most {})", ws.size(), ys.size(),
           kMaxSharedInput);
  std::array<KMatrix, kMaxSharedInput> m;
  bool shared = true;
  for (size_t i = 0; i < ws.size(); ++i) {
    shared = shared && view_of(*ws[i], views, &m[i]) &&
             m[i].cols % block_of(act_format(m[i].format)) == 0 && m[i].cols == m[0].cols &&
             act_format(m[i].format) == act_format(m[0].format) && m[i].group == m[0].group;
  }
  if (!shared) {  // different encodings or no kernel: one call each
    for (size_t i = 0; i < ws.size(); ++i) kern::matmul(*ws[i], x, tokens, ys[i], pool, views);
    return;
  }
  std::array<const KMatrix*, kMaxSharedInput> p{};
  for (size_t i = 0; i < ws.size(); ++i) p[i] = &m[i];
  thread_local Activations scratch;
  matmul_shared_input(std::span<const KMatrix* const>(p.data(), ws.size()), x, tokens, ys, pool,
                      &scratch);
}

void swiglu_ffn(const ops::Weight& gate, const ops::Weight& up, const ops::Weight& down,
                const float* x, int64_t n, float* y, ThreadPool* pool, const WeightViews* views,
                std::vector<float>* g, std::vector<float>* u) {
  const size_t size = static_cast<size_t>(n * gate.rows());
  if (g->size() < size) g->resize(size);
  if (u->size() < size) u->resize(size);
  const ops::Weight* ws[2] = {&gate, &up};
  float* ys[2] = {g->data(), u->data()};
  matmul_shared_input(ws, x, n, ys, pool, views);
  swiglu(g->data(), u->data(), static_cast<int64_t>(size), g->data());
  matmul(down, g->data(), n, y, pool, views);
}

void gemm_f32_kn(const float* a, int64_t lda, int64_t m, const float* b, int64_t k, int64_t n,
                 float* c, int64_t ldc, Isa isa) {
  if (std::min(isa, best_isa()) >= Isa::kAvx512 && n % 64 == 0) {
    detail::gemm_f32_kn_avx512(a, lda, m, b, k, n, c, ldc);
    return;
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float s = 0.0f;
      for (int64_t p = 0; p < k; ++p) s = std::fma(a[i * lda + p], b[p * n + j], s);
      c[i * ldc + j] = s;
    }
  }
}

bool attention_splits_cache(const ops::AttentionArgs& a, const ThreadPool* pool, Isa isa) {
  return std::min(isa, best_isa()) >= Isa::kAvx512 && pool != nullptr && pool->size() > 0 &&
         a.window == 0 && a.sinks == nullptr && a.n_tokens == 1 && a.n_kv_heads == 1 &&
         a.n_heads >= 8 && a.n_heads <= 256 && a.pos0 + 1 >= kLongDecodeContext;
}

void attention(const ops::AttentionArgs& a, ThreadPool* pool, Isa isa) {
  const int64_t group = a.n_heads / a.n_kv_heads;
  isa = std::min(isa, best_isa());
  TD_CHECK(a.blocks == nullptr ||
               (a.block_positions > 0 && (a.block_positions & (a.block_positions - 1)) == 0 &&
                a.block_positions % ops::kKvBlockAlign == 0),
           "kern::attention: a paged cache's block_positions must be a power of two and a "
           "multiple of {}, got {}",
           ops::kKvBlockAlign, a.block_positions);
  // A paged, 16-bit or Q8_0 cache below AVX-512: the F32 kernels on its rows gathered / widened
  // into copies (and BF16's queries rounded to BF16), the contract's numbers on any CPU.
  if ((a.k16 != nullptr || a.k8 != nullptr || a.blocks != nullptr) && isa < Isa::kAvx512) {
    thread_local std::vector<float> wq, wk, wv;
    attention(ops::widen_cache(a, &wq, &wk, &wv), pool, isa);
    return;
  }
  // The AVX-512 kernels: a BF16 cache by the BF16 instructions where the CPU has them, else the
  // F32 ones (an F32 cache, or 16-bit / Q8_0 rows widened as loaded).
  const bool dp = a.k16 != nullptr && !a.f16 && isa >= Isa::kAvx512Bf16;
  const auto task_fn = dp ? detail::attention_task_bf16 : detail::attention_task_avx512;
  const auto tokens_fn = dp ? detail::attention_tokens_bf16 : detail::attention_tokens_avx512;
  const auto segments_fn = dp ? detail::decode_segments_bf16 : detail::decode_segments_avx512;
  // Fewer (token, KV group) tasks than threads (decode; absorbed MLA has one KV group): the
  // group's heads are split over tasks in blocks of 4 (each task reads the whole KV cache, which
  // the split keeps in L3 for moderate contexts). Every head's arithmetic is the same either way.
  int64_t splits = 1;
  if (isa >= Isa::kAvx512 && pool != nullptr && group >= 8) {
    const int64_t threads = pool->size() + 1;
    while (splits * 2 <= group / 4 && a.n_tokens * a.n_kv_heads * splits * 2 <= threads) {
      splits *= 2;
    }
  }
  const int64_t heads_per = group / splits;  // a multiple of 4 (group >= 8 when splits > 1)
  // One token and one KV group of many heads over a long context (absorbed MLA decode): split by
  // heads, every task would read the whole cache. Instead the key segments are spread over the
  // threads (each computes every head's scores, numerators and value sums of its segments, the
  // cache read once), then the heads' folds over all segments (the one task's arithmetic: the
  // same bits).
  if (attention_splits_cache(a, pool, isa)) {
    const int64_t n_ctx = a.pos0 + 1;
    const int64_t threads = pool->size() + 1;
    const int64_t segs = (n_ctx + detail::kSegment - 1) / detail::kSegment;
    thread_local std::vector<float> partial, stats;  // the caller's: every task writes into them
    partial.resize(static_cast<size_t>(segs * a.n_heads * a.dv));
    stats.resize(static_cast<size_t>(segs * a.n_heads * 2));
    float* part = partial.data();  // (a thread_local named in a task would be the task's own)
    float* st = stats.data();
    // Thread i's segments end where its share of the keys, rounded to a segment, ends.
    auto seg_end = [&](int64_t i) {
      return std::min(segs, (n_ctx * i / threads + detail::kSegment / 2) / detail::kSegment);
    };
    pool->run(static_cast<size_t>(threads), [&](size_t p) {
      const int64_t i = static_cast<int64_t>(p);
      const int64_t s1 = i + 1 == threads ? segs : seg_end(i + 1);
      segments_fn(a, seg_end(i), s1, part, st);
    });
    const int64_t parts = std::min(threads, a.n_heads);
    pool->run(static_cast<size_t>(parts), [&](size_t p) {
      const int64_t i = static_cast<int64_t>(p);
      detail::decode_fold_avx512(a, part, st, a.n_heads * i / parts, a.n_heads * (i + 1) / parts);
    });
    return;
  }
  // One head per KV group (MHA, naive MLA) and a batch of tokens: tasks of kTokenBlock
  // consecutive tokens of one head, which share each block of keys and values (a task per token
  // streamed them from L2 / L3 once per token; every output keeps its bits). Head-major order:
  // one head's keys stay in L2 over its blocks.
  constexpr int64_t kTokenBlock = 16;
  if (group == 1 && isa >= Isa::kAvx512 && a.n_tokens > 1) {
    const int64_t blocks = (a.n_tokens + kTokenBlock - 1) / kTokenBlock;
    auto block_task = [&](size_t id) {
      thread_local std::vector<float> scores;
      const int64_t g = static_cast<int64_t>(id) / blocks, b = static_cast<int64_t>(id) % blocks;
      const int64_t t0 = b * kTokenBlock, t1 = std::min(a.n_tokens, t0 + kTokenBlock);
      scores.resize(static_cast<size_t>((t1 - t0) * detail::kSegment + a.dv));
      tokens_fn(a, t0, t1, g, scores.data(), scores.data() + (t1 - t0) * detail::kSegment);
    };
    const size_t n = static_cast<size_t>(blocks * a.n_kv_heads);
    if (pool == nullptr || n == 1) {
      for (size_t i = 0; i < n; ++i) block_task(i);
    } else {
      pool->run(n, block_task);
    }
    return;
  }
  auto task = [&](size_t id) {
    thread_local Activations q;
    thread_local std::vector<float> scores;
    const int64_t part = static_cast<int64_t>(id) % splits;
    const int64_t t = static_cast<int64_t>(id) / splits / a.n_kv_heads;
    const int64_t g = static_cast<int64_t>(id) / splits % a.n_kv_heads;
    const int64_t lo = ops::first_key(a, a.pos0 + t), n_ctx = a.pos0 + t + 1 - lo;
    if (isa >= Isa::kAvx512) {
      const int64_t hb = part * heads_per, he = part + 1 == splits ? group : hb + heads_per;
      scores.resize(static_cast<size_t>((he - hb) * detail::kSegment + a.dv));
      task_fn(a, t, g, hb, he, scores.data(), scores.data() + (he - hb) * detail::kSegment);
      return;
    }
    KMatrix k;
    k.format = WFormat::kF32;
    k.rows = n_ctx;
    k.cols = a.dk;
    k.data = reinterpret_cast<const uint8_t*>(a.k + lo * a.k_stride + g * ops::k_head_stride(a));
    k.row_bytes = a.k_stride * 4;
    const float* qg = a.q + t * a.q_stride + g * group * a.dk;
    quantize_activations(AFormat::kF32, 0, qg, group, a.dk, a.dk, &q);
    scores.resize(static_cast<size_t>(group * n_ctx));
    gemm(k, q, 0, n_ctx, scores.data(), n_ctx, isa);
    for (int64_t h = 0; h < group; ++h) {
      float* sc = scores.data() + h * n_ctx;
      for (int64_t s = 0; s < n_ctx; ++s) sc[s] *= a.scale;
      ops::softmax_with_sink(sc, n_ctx, ops::sink_of(a, g * group + h));
      float* out = a.out + (t * a.n_heads + g * group + h) * a.dv;
      std::fill(out, out + a.dv, 0.0f);
      for (int64_t s = 0; s < n_ctx; ++s) {
        const float* v = a.v + (lo + s) * a.v_stride + g * ops::v_head_stride(a);
        const float p = sc[s];
        for (int64_t j = 0; j < a.dv; ++j) out[j] += p * v[j];
      }
    }
  };
  const size_t n = static_cast<size_t>(a.n_tokens * a.n_kv_heads * splits);
  if (pool == nullptr || n == 1) {
    for (size_t i = 0; i < n; ++i) task(i);
  } else {
    pool->run(n, task);
  }
}

}  // namespace tandem::kern
