// Packing (F32 rows -> INT8 / INT4 tiles, BF16 rows), activation quantization, the scalar
// references and the ISA dispatch of the packed formats. The layouts are described in packed.h.
#include "ops/cpu/packed.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/fp_convert.h"
#include "core/thread_pool.h"
#include "ops/cpu/packed_kernels.h"
#include "ops/cpu/token_blocks.h"

namespace tandem::kern {

using detail::PackedArgs;
using detail::PackedGeometry;

namespace detail {

const uint16_t* fp8_bf16_table() {
  static const auto table = [] {
    std::array<uint16_t, 256> t{};
    for (int v = 0; v < 256; ++v) t[v] = f32_to_bf16(fp8_e4m3_to_f32(static_cast<uint8_t>(v)));
    return t;
  }();
  return table.data();
}

PackedGeometry packed_geometry(WFormat f, int64_t cols, int group) {
  PackedGeometry g;
  if (f == WFormat::kBF16Tile) {  // one 64-byte chunk per k pair, no scales
    g.groups = cols / 2;
    g.values_bytes = g.block_bytes = 64;
    g.tile_bytes = g.groups * g.block_bytes;
    return g;
  }
  g.groups = cols / group;
  if (f == WFormat::kInt8) {
    g.values_bytes = kPackTileRows * group;
    g.block_bytes = g.values_bytes + kPackTileRows * 8;  // scales + sums
  } else {
    g.values_bytes = kPackTileRows * group / 2;
    g.block_bytes = g.values_bytes + kPackTileRows * 4;  // scales
  }
  g.tile_bytes = g.groups * g.block_bytes;
  return g;
}

}  // namespace detail

namespace {

bool is_int(WFormat f) {
  return f == WFormat::kInt8 || f == WFormat::kInt4;
}

void check_int_shape(WFormat f, int64_t rows, int64_t cols, int group) {
  if (group != 32 && group != 64 && group != 128) {
    fail(ErrorKind::kInvalidArgument, "{} packing: group {} is not 32, 64 or 128", wformat_name(f),
         group);
  }
  if (rows <= 0 || cols <= 0 || cols % group != 0) {
    fail(ErrorKind::kUnsupported,
         "{} packing: a [{}, {}] matrix: columns are not a multiple of the "
         "group {}",
         wformat_name(f), rows, cols, group);
  }
}

void check_bf16_tile_shape(int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0 || cols % 2 != 0) {
    fail(ErrorKind::kUnsupported,
         "bf16 tile packing: a [{}, {}] matrix: the column count is not "
         "even (tiles hold pairs of columns)",
         rows, cols);
  }
}

int64_t tiles_of(int64_t rows) {
  return (rows + kPackTileRows - 1) / kPackTileRows;
}

// Quantizes one tile (up to 16 rows of F32, the rest zero) into its packed bytes.
void pack_tile(WFormat f, int group, const float* const* rows, int64_t n_rows, int64_t cols,
               uint8_t* out) {
  const PackedGeometry geo = detail::packed_geometry(f, cols, group);
  const float qmax = f == WFormat::kInt8 ? 127.0f : 7.0f;
  int8_t q[kPackTileRows][128];
  for (int64_t g = 0; g < geo.groups; ++g) {
    uint8_t* block = out + g * geo.block_bytes;
    float* scales = reinterpret_cast<float*>(block + geo.values_bytes);
    for (int64_t n = 0; n < kPackTileRows; ++n) {
      float amax = 0.0f;
      const float* src = n < n_rows ? rows[n] + g * group : nullptr;
      if (src != nullptr) {
        for (int k = 0; k < group; ++k) amax = std::max(amax, std::fabs(src[k]));
      }
      const float s = amax > 0.0f ? amax / qmax : 1.0f;
      scales[n] = s;
      int32_t sum = 0;
      for (int k = 0; k < group; ++k) {
        const float v = src != nullptr ? std::nearbyint(src[k] / s) : 0.0f;
        q[n][k] = static_cast<int8_t>(std::clamp(v, -qmax, qmax));
        sum += q[n][k];
      }
      if (f == WFormat::kInt8) {
        reinterpret_cast<int32_t*>(block + geo.values_bytes + kPackTileRows * 4)[n] = sum;
      }
    }
    // Chunk c: 16 rows x 4 columns (4c .. 4c+3) of the group.
    const int chunks = group / 4;
    if (f == WFormat::kInt8) {
      for (int c = 0; c < chunks; ++c) {
        for (int n = 0; n < kPackTileRows; ++n) {
          for (int j = 0; j < 4; ++j)
            block[c * 64 + n * 4 + j] = static_cast<uint8_t>(q[n][4 * c + j]);
        }
      }
    } else {
      const int half = chunks / 2;  // packed chunk c: low nibbles chunk c, high chunk c + half
      for (int c = 0; c < half; ++c) {
        for (int n = 0; n < kPackTileRows; ++n) {
          for (int j = 0; j < 4; ++j) {
            const int lo = q[n][4 * c + j] + 8, hi = q[n][4 * (c + half) + j] + 8;
            block[c * 64 + n * 4 + j] = static_cast<uint8_t>(lo | (hi << 4));
          }
        }
      }
    }
  }
}

// One BF16 tile: chunk c, row n: the pair w[n][2c], w[n][2c + 1] (rows past n_rows zero).
void pack_tile_bf16(const float* const* rows, int64_t n_rows, int64_t cols, uint8_t* out) {
  auto* dst = reinterpret_cast<uint16_t*>(out);
  for (int64_t c = 0; c < cols / 2; ++c) {
    for (int64_t n = 0; n < kPackTileRows; ++n) {
      for (int j = 0; j < 2; ++j) {
        dst[c * 32 + n * 2 + j] = n < n_rows ? f32_to_bf16(rows[n][2 * c + j]) : uint16_t{0};
      }
    }
  }
}

uint16_t bf16_tile_bits(const KMatrix& w, int64_t n, int64_t k) {
  const uint8_t* tile = w.data + (n / kPackTileRows) * kPackTileRows * w.cols * 2;
  return reinterpret_cast<const uint16_t*>(tile)[(k / 2) * 32 + (n % kPackTileRows) * 2 + k % 2];
}

// kBF16Tile: per row and token, the F32 sum in k order of the exact products bf16(w) * bf16(a).
void reference_bf16_tile(const KMatrix& w, const Activations& a, int64_t n0, int64_t n1, float* y,
                         int64_t ldy) {
  std::vector<float> wr(static_cast<size_t>(w.cols));
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t k = 0; k < w.cols; ++k) wr[k] = bf16_to_f32(bf16_tile_bits(w, n, k));
    for (int64_t t = 0; t < a.tokens; ++t) {
      const uint16_t* ar = reinterpret_cast<const uint16_t*>(a.row(t));
      float acc = 0.0f;
      for (int64_t k = 0; k < w.cols; ++k) acc = std::fma(wr[k], bf16_to_f32(ar[k]), acc);
      y[t * ldy + n] = acc;
    }
  }
}

// Quantized value q of packed w at (n, k) and its scale.
int packed_q(const KMatrix& w, int64_t n, int64_t k, float* scale) {
  const PackedGeometry geo = detail::packed_geometry(w.format, w.cols, w.group);
  const uint8_t* tile = w.data + (n / kPackTileRows) * geo.tile_bytes;
  const int64_t g = k / w.group, kk = k % w.group, r = n % kPackTileRows;
  const uint8_t* block = tile + g * geo.block_bytes;
  *scale = reinterpret_cast<const float*>(block + geo.values_bytes)[r];
  if (w.format == WFormat::kInt8) {
    return static_cast<int8_t>(block[(kk / 4) * 64 + r * 4 + kk % 4]);
  }
  const int64_t half = w.group / 8;
  const int64_t c = kk / 4;
  const uint8_t byte = block[(c % half) * 64 + r * 4 + kk % 4];
  return (c < half ? (byte & 0x0F) : (byte >> 4)) - 8;
}

void reference_int(const KMatrix& w, const Activations& a, int64_t n0, int64_t n1, float* y,
                   int64_t ldy) {
  const int64_t groups = w.cols / w.group;
  const int64_t so = detail::act_scales_offset(w.cols);
  std::vector<int> qw(static_cast<size_t>(w.cols));
  std::vector<float> sw(static_cast<size_t>(groups));
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t k = 0; k < w.cols; ++k) {
      qw[k] = packed_q(w, n, k, &sw[k / w.group]);
    }
    for (int64_t t = 0; t < a.tokens; ++t) {
      const int8_t* qa = reinterpret_cast<const int8_t*>(a.row(t));
      const float* sa = reinterpret_cast<const float*>(a.row(t) + so);
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        int32_t dot = 0;
        for (int64_t k = g * w.group; k < (g + 1) * w.group; ++k) dot += qa[k] * qw[k];
        acc = std::fma(sa[g] * sw[g], static_cast<float>(dot), acc);
      }
      y[t * ldy + n] = acc;
    }
  }
}

// FP8Block: per row, per scale block of block_cols columns: a sequential F32 sum of
// bf16(w) * bf16(a) (both exact in F32), then acc = fma(scale, part, acc).
void reference_fp8(const KMatrix& w, const Activations& a, int64_t n0, int64_t n1, float* y,
                   int64_t ldy) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wr = w.data + n * w.row_bytes;
    const float* srow = w.scales + ((w.row0 + n) / w.block_rows) * w.scale_stride;
    for (int64_t t = 0; t < a.tokens; ++t) {
      const uint16_t* ar = reinterpret_cast<const uint16_t*>(a.row(t));
      float acc = 0.0f;
      for (int64_t b0 = 0; b0 < w.cols; b0 += w.block_cols) {
        const int64_t b1 = std::min(w.cols, b0 + w.block_cols);
        float part = 0.0f;
        for (int64_t k = b0; k < b1; ++k) part += fp8_e4m3_to_f32(wr[k]) * bf16_to_f32(ar[k]);
        acc = std::fma(srow[b0 / w.block_cols], part, acc);
      }
      y[t * ldy + n] = acc;
    }
  }
}

// The kernel table of the highest level <= isa that has an entry for f (nullptr: scalar).
const detail::PackedKernels* pick(WFormat f, Isa isa, detail::PackedFn* fn) {
  auto entry = [f](const detail::PackedKernels& k) {
    return f == WFormat::kInt8       ? k.int8
           : f == WFormat::kInt4     ? k.int4
           : f == WFormat::kBF16Tile ? k.bf16
                                     : k.fp8;
  };
  const Isa best = best_isa();
  if (isa > best) isa = best;
  const detail::PackedKernels* tables[] = {
      isa >= Isa::kAmx ? &detail::packed_kernels_amx() : nullptr,
      isa >= Isa::kAvx512Bf16 ? &detail::packed_kernels_vnni() : nullptr,
      isa >= Isa::kAvx512Vnni ? &detail::packed_kernels_vnni_int() : nullptr,
      isa >= Isa::kAvx512 ? &detail::packed_kernels_avx512() : nullptr,
      isa >= Isa::kAvx2 ? &detail::packed_kernels_avx2() : nullptr};
  for (const detail::PackedKernels* t : tables) {
    if (t != nullptr && entry(*t) != nullptr) {
      *fn = entry(*t);
      return t;
    }
  }
  *fn = nullptr;
  return nullptr;
}

void check_args(const KMatrix& w, const Activations& a, int64_t n0, int64_t n1) {
  TD_CHECK(w.data != nullptr, "packed_gemm: {} matrix without data", wformat_name(w.format));
  TD_CHECK(a.cols == w.cols, "packed_gemm: activations have {} columns, the weight {}", a.cols,
           w.cols);
  TD_CHECK(n0 >= 0 && n0 <= n1 && n1 <= w.rows, "packed_gemm: rows [{}, {}) of {}", n0, n1, w.rows);
  const AFormat want = is_int(w.format) ? AFormat::kI8 : AFormat::kBF16;
  TD_CHECK(a.format == want, "packed_gemm: {} weights need other activations",
           wformat_name(w.format));
  TD_CHECK(!is_int(w.format) || a.group == w.group,
           "packed_gemm: activations quantized in groups of {}, weights of {}", a.group, w.group);
}

}  // namespace

int64_t packed_tile_bytes(WFormat target, int64_t cols, int group) {
  return detail::packed_geometry(target, cols, group).tile_bytes;
}

uint64_t packed_bytes(WFormat target, int64_t rows, int64_t cols, int group) {
  if (target == WFormat::kBF16) return static_cast<uint64_t>(rows * cols * 2);
  if (target == WFormat::kBF16Tile) {
    check_bf16_tile_shape(rows, cols);
    return static_cast<uint64_t>(tiles_of(rows) * packed_tile_bytes(target, cols, 0));
  }
  TD_CHECK(is_int(target), "packed_bytes: {} is not a packed format", wformat_name(target));
  check_int_shape(target, rows, cols, group);
  return static_cast<uint64_t>(tiles_of(rows) * packed_tile_bytes(target, cols, group));
}

KMatrix packed_view(WFormat target, int64_t rows, int64_t cols, int group, const uint8_t* bytes,
                    std::shared_ptr<const void> owner) {
  KMatrix m;
  m.format = target;
  m.rows = rows;
  m.cols = cols;
  m.data = bytes;
  m.owner = std::move(owner);
  if (target == WFormat::kBF16) {
    m.row_bytes = cols * 2;
    return m;
  }
  if (target == WFormat::kBF16Tile) {
    check_bf16_tile_shape(rows, cols);
    m.row_bytes = packed_tile_bytes(target, cols, 0) / kPackTileRows;
    return m;
  }
  TD_CHECK(is_int(target), "packed_view: {} is not a packed format", wformat_name(target));
  check_int_shape(target, rows, cols, group);
  m.group = group;
  m.row_bytes = packed_tile_bytes(target, cols, group) / kPackTileRows;
  return m;
}

KMatrix packed_copy_submatrix(const KMatrix& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                              const AllocOptions& alloc) {
  TD_CHECK(packed_tiled(w.format), "packed_copy_submatrix: {} is not a tiled format",
           wformat_name(w.format));
  const detail::PackedGeometry geo = detail::packed_geometry(w.format, w.cols, w.group);
  const int64_t t0 = r0 / kPackTileRows, t1 = (r1 + kPackTileRows - 1) / kPackTileRows;
  const int64_t group_cols = w.format == WFormat::kBF16Tile ? 2 : w.group;
  const int64_t g0 = c0 / group_cols, g1 = c1 / group_cols;
  const int64_t tile_bytes = (g1 - g0) * geo.block_bytes;
  TD_CHECK(tile_bytes == packed_tile_bytes(w.format, c1 - c0, w.group),
           "packed_copy_submatrix: group blocks do not add up");
  auto buf = std::make_shared<AlignedBuffer>(static_cast<size_t>((t1 - t0) * tile_bytes), alloc);
  uint8_t* dst = buf->as<uint8_t>();
  for (int64_t t = t0; t < t1; ++t) {
    std::memcpy(dst + (t - t0) * tile_bytes, w.data + t * geo.tile_bytes + g0 * geo.block_bytes,
                static_cast<size_t>(tile_bytes));
  }
  return packed_view(w.format, r1 - r0, c1 - c0, w.group, dst, std::move(buf));
}

void pack_weight_into(const ops::Weight& w, WFormat target, int group, uint8_t* out,
                      ThreadPool* pool) {
  const int64_t rows = w.rows(), cols = w.cols();
  packed_bytes(target, rows, cols, group);  // validates the shape
  const int64_t n_tiles = tiles_of(rows);
  const int64_t tile_bytes =
      target == WFormat::kBF16 ? kPackTileRows * cols * 2 : packed_tile_bytes(target, cols, group);
  auto task = [&](size_t i) {
    std::vector<float> scratch[kPackTileRows];
    const float* src[kPackTileRows];
    const int64_t r0 = static_cast<int64_t>(i) * kPackTileRows;
    const int64_t n = std::min(kPackTileRows, rows - r0);
    for (int64_t r = 0; r < n; ++r) {
      const float* row = ops::weight_row(w, r0 + r, scratch[r]);
      if (row != scratch[r].data()) {  // unscaled F32: copy so every row is its own buffer
        scratch[r].assign(row, row + cols);
      }
      src[r] = scratch[r].data();
    }
    if (target == WFormat::kBF16) {
      auto* dst = reinterpret_cast<uint16_t*>(out + r0 * cols * 2);
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t k = 0; k < cols; ++k) dst[r * cols + k] = f32_to_bf16(src[r][k]);
      }
    } else if (target == WFormat::kBF16Tile) {
      pack_tile_bf16(src, n, cols, out + static_cast<int64_t>(i) * tile_bytes);
    } else {
      pack_tile(target, group, src, n, cols, out + static_cast<int64_t>(i) * tile_bytes);
    }
  };
  if (pool == nullptr || n_tiles == 1) {
    for (int64_t i = 0; i < n_tiles; ++i) task(static_cast<size_t>(i));
  } else {
    pool->run(static_cast<size_t>(n_tiles), task);
  }
}

KMatrix pack_weight(const ops::Weight& w, WFormat target, int group, ThreadPool* pool) {
  const uint64_t bytes = packed_bytes(target, w.rows(), w.cols(), group);
  auto buffer = std::shared_ptr<uint8_t[]>(
      static_cast<uint8_t*>(::operator new[](bytes, std::align_val_t{64})),
      [](uint8_t* p) { ::operator delete[](p, std::align_val_t{64}); });
  pack_weight_into(w, target, group, buffer.get(), pool);
  return packed_view(target, w.rows(), w.cols(), group, buffer.get(), buffer);
}

float packed_value(const KMatrix& w, int64_t n, int64_t k) {
  if (w.format == WFormat::kBF16) {
    return bf16_to_f32(reinterpret_cast<const uint16_t*>(w.data + n * w.row_bytes)[k]);
  }
  if (w.format == WFormat::kBF16Tile) return bf16_to_f32(bf16_tile_bits(w, n, k));
  float s = 0.0f;
  const int q = packed_q(w, n, k, &s);
  return static_cast<float>(q) * s;
}

bool fp8_view(const ops::Weight& w, KMatrix* out) {
  if (w.empty() || w.t.dtype != DType::kF8E4M3 || w.scale_inv == nullptr) return false;
  KMatrix m;
  m.format = WFormat::kFP8Block;
  m.rows = w.rows();
  m.cols = w.cols();
  m.data = static_cast<const uint8_t*>(w.t.data);
  m.row_bytes = static_cast<int64_t>(w.t.row_bytes());
  m.scales = w.scale_inv;
  m.scale_stride = w.scale_cols;
  m.block_rows = w.block_rows;
  m.block_cols = w.block_cols;
  m.row0 = w.row0;
  *out = m;
  return true;
}

int64_t packed_row_align(const KMatrix& w) {
  return packed_tiled(w.format) ? kPackTileRows : 1;
}

void packed_quantize_activations(AFormat f, int group, const float* x, int64_t tokens, int64_t cols,
                                 int64_t ldx, Activations* out, ThreadPool* pool, Isa isa) {
  if (f != AFormat::kI8 && f != AFormat::kBF16) {
    fail(ErrorKind::kUnsupported, "packed activations: format {} is not kI8 or kBF16",
         static_cast<int>(f));
  }
  if (f == AFormat::kI8 && (group <= 0 || cols % group != 0)) {
    fail(ErrorKind::kUnsupported, "int8 activations: {} values are not a multiple of the group {}",
         cols, group);
  }
  const int64_t groups = f == AFormat::kI8 ? cols / group : 0;
  const int64_t so = detail::act_scales_offset(cols);
  out->format = f;
  out->tokens = tokens;
  out->cols = cols;
  out->group = group;
  const int64_t bo = detail::act_biased_offset(cols, groups);
  out->row_bytes = f == AFormat::kBF16 ? detail::act_f32_offset(cols) + (cols * 4 + 63) / 64 * 64
                                       : (bo + cols + 63) / 64 * 64;
  const size_t need = static_cast<size_t>(out->row_bytes * tokens);
  if (out->data.size() < need) out->data.resize(need);
  const Isa level = std::min(isa, best_isa());
  const bool avx512 = level >= Isa::kAvx512, avx2 = level >= Isa::kAvx2;
  auto row = [&](int64_t t) {
    const float* src = x + t * ldx;
    uint8_t* dst = out->data.data() + t * out->row_bytes;
    if (f == AFormat::kBF16) {
      auto* d = reinterpret_cast<uint16_t*>(dst);
      if (avx512) {
        detail::f32_to_bf16_avx512(src, d, cols);
      } else if (avx2) {
        detail::f32_to_bf16_avx2(src, d, cols);
      } else {
        for (int64_t k = 0; k < cols; ++k) d[k] = f32_to_bf16(src[k]);
      }
      auto* wide = reinterpret_cast<float*>(dst + detail::act_f32_offset(cols));
      for (int64_t k = 0; k < cols; ++k) wide[k] = std::bit_cast<float>(uint32_t{d[k]} << 16);
      return;
    }
    if (avx512 && group % 16 == 0) {
      detail::quantize_i8_act_avx512(src, dst, cols, group);
      return;
    }
    if (avx2 && group % 8 == 0) {
      detail::quantize_i8_act_avx2(src, dst, cols, group);
      return;
    }
    auto* q = reinterpret_cast<int8_t*>(dst);
    auto* sa = reinterpret_cast<float*>(dst + so);
    auto* sums = reinterpret_cast<int32_t*>(dst + so + groups * 4);
    for (int64_t g = 0; g < groups; ++g) {
      float amax = 0.0f;
      for (int64_t k = g * group; k < (g + 1) * group; ++k)
        amax = std::max(amax, std::fabs(src[k]));
      const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
      const float inv = 1.0f / s;
      int32_t sum = 0;
      for (int64_t k = g * group; k < (g + 1) * group; ++k) {
        const float v = std::clamp(std::nearbyint(src[k] * inv), -127.0f, 127.0f);
        q[k] = static_cast<int8_t>(v);
        sum += q[k];
      }
      sa[g] = s;
      sums[g] = sum;
    }
    for (int64_t k = 0; k < cols; ++k) dst[bo + k] = static_cast<uint8_t>(q[k]) ^ 0x80;
  };
  detail::for_token_blocks(pool, tokens, row);
}

void packed_gemm_reference(const KMatrix& w, const Activations& a, int64_t n0, int64_t n1, float* y,
                           int64_t ldy) {
  if (n0 == n1 || a.tokens == 0) return;
  check_args(w, a, n0, n1);
  if (is_int(w.format)) {
    reference_int(w, a, n0, n1, y, ldy);
  } else if (w.format == WFormat::kBF16Tile) {
    reference_bf16_tile(w, a, n0, n1, y, ldy);
  } else if (w.format == WFormat::kFP8Block) {
    reference_fp8(w, a, n0, n1, y, ldy);
  } else {
    fail(ErrorKind::kUnsupported, "packed_gemm: no packed kernel for {}", wformat_name(w.format));
  }
}

void packed_gemm(const KMatrix& w, const Activations& a, int64_t n0, int64_t n1, float* y,
                 int64_t ldy, Isa isa) {
  if (n0 == n1 || a.tokens == 0) return;
  check_args(w, a, n0, n1);
  detail::PackedFn fn = nullptr;
  pick(w.format, isa, &fn);
  // The SIMD FP8 kernels want whole 32-column steps inside each scale block.
  if (w.format == WFormat::kFP8Block && (w.block_cols % 32 != 0 || w.cols % 32 != 0)) fn = nullptr;
  if (fn == nullptr) {
    packed_gemm_reference(w, a, n0, n1, y, ldy);
    return;
  }
  PackedArgs args{&w, &a, n0, n1, y, ldy};
  fn(args);
}

}  // namespace tandem::kern
