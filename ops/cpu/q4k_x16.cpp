#include "ops/cpu/q4k_x16.h"

#include <cstring>
#include <memory>

#include "core/error.h"
#include "ops/cpu/kernels.h"

namespace tandem::kern {

namespace {

constexpr int64_t kHeader = 16;  // d, dmin, scales[12]
constexpr int64_t kSlice = kQ4KX16Rows * static_cast<int64_t>(sizeof(BlockQ4_K));

int64_t blocks(int64_t cols) {
  TD_CHECK(cols > 0 && cols % kQK_K == 0, "Q4_K x16: {} columns is not a multiple of {}", cols,
           kQK_K);
  return cols / kQK_K;
}

}  // namespace

int64_t q4k_x16_tile_bytes(int64_t cols) {
  return blocks(cols) * kSlice;
}

void q4k_x16_repack(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols,
                    uint8_t* out) {
  const int64_t nb = blocks(cols);
  const int64_t tiles = (rows + kQ4KX16Rows - 1) / kQ4KX16Rows;
  for (int64_t t = 0; t < tiles; ++t) {
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* slice = out + (t * nb + b) * kSlice;
      std::memset(slice, 0, static_cast<size_t>(kSlice));
      for (int64_t n = 0; n < kQ4KX16Rows && t * kQ4KX16Rows + n < rows; ++n) {
        const auto* blk =
            reinterpret_cast<const BlockQ4_K*>(w + (t * kQ4KX16Rows + n) * row_bytes) + b;
        std::memcpy(slice + kHeader * n, blk, kHeader);
        for (int c = 0; c < 32; ++c) {
          std::memcpy(slice + 256 + 64 * c + 4 * n, blk->qs + 32 * (c / 8) + 4 * (c % 8), 4);
        }
      }
    }
  }
}

void q4k_x16_unpack(const uint8_t* tile, int64_t cols, uint8_t* rows) {
  const int64_t nb = blocks(cols);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* slice = tile + b * kSlice;
    for (int64_t n = 0; n < kQ4KX16Rows; ++n) {
      auto* blk = reinterpret_cast<BlockQ4_K*>(rows + n * nb * sizeof(BlockQ4_K)) + b;
      std::memcpy(blk, slice + kHeader * n, kHeader);
      for (int c = 0; c < 32; ++c) {
        std::memcpy(blk->qs + 32 * (c / 8) + 4 * (c % 8), slice + 256 + 64 * c + 4 * n, 4);
      }
    }
  }
}

void q4k_x16_gemv(const uint8_t* tiles, int64_t n_tiles, int64_t cols, const BlockQ8_K* act,
                  float* y, Isa isa) {
  const int64_t nb = blocks(cols);
  if (isa >= Isa::kAvx512Vnni && best_isa() >= Isa::kAvx512Vnni) {
    q4k_x16_gemv_vnni(tiles, n_tiles, nb, act, y);
    return;
  }
  // Below it: kern::gemm on the tiles (each tile's rows unpacked, the Q4_K row kernel of `isa`).
  KMatrix m;
  m.format = WFormat::kQ4_KX16;
  m.rows = n_tiles * kQ4KX16Rows;
  m.cols = cols;
  m.row_bytes = nb * static_cast<int64_t>(sizeof(BlockQ4_K));
  m.data = tiles;
  Activations a;
  a.format = AFormat::kQ8_K;
  a.tokens = 1;
  a.cols = cols;
  a.row_bytes = nb * static_cast<int64_t>(sizeof(BlockQ8_K));
  a.data.resize(static_cast<size_t>(a.row_bytes));
  std::memcpy(a.data.data(), act, static_cast<size_t>(a.row_bytes));
  gemm(m, a, 0, m.rows, y, m.rows, isa);
}

KMatrix x16_alloc(WFormat format, int64_t rows, int64_t cols, int64_t row_bytes,
                  const AllocOptions& alloc, uint8_t** data) {
  const int64_t tiles = (rows + kQ4KX16Rows - 1) / kQ4KX16Rows;
  auto owner =
      std::make_shared<AlignedBuffer>(static_cast<size_t>(tiles * kQ4KX16Rows * row_bytes), alloc);
  *data = owner->as<uint8_t>();
  KMatrix m;
  m.format = format;
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = row_bytes;
  m.data = *data;
  m.owner = std::move(owner);
  return m;
}

KMatrix q4k_x16_matrix(const KMatrix& q4k, const AllocOptions& alloc) {
  if (q4k.format != WFormat::kQ4_K || q4k.cols % kQK_K != 0 || q4k.rows <= 0) {
    fail(ErrorKind::kInvalidArgument, "Q4_K x16: a {} x {} {} matrix cannot be repacked",
         q4k.rows, q4k.cols, wformat_name(q4k.format));
  }
  uint8_t* out = nullptr;
  KMatrix m = x16_alloc(WFormat::kQ4_KX16, q4k.rows, q4k.cols, q4k.row_bytes, alloc, &out);
  q4k_x16_repack(q4k.data, q4k.row_bytes, q4k.rows, q4k.cols, out);
  return m;
}

KMatrix q4k_x16_copy_submatrix(const KMatrix& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                               const AllocOptions& alloc) {
  TD_CHECK(w.format == WFormat::kQ4_KX16 && r0 % kQ4KX16Rows == 0 && c0 % kQK_K == 0 &&
               (c1 % kQK_K == 0 || c1 == w.cols) && r0 < r1 && r1 <= w.rows && c1 <= w.cols,
           "Q4_K x16 submatrix rows [{}, {}) x cols [{}, {}) of {} x {}", r0, r1, c0, c1, w.rows,
           w.cols);
  uint8_t* out = nullptr;
  KMatrix m = x16_alloc(WFormat::kQ4_KX16, r1 - r0, c1 - c0,
                        blocks(c1 - c0) * static_cast<int64_t>(sizeof(BlockQ4_K)), alloc, &out);
  const int64_t slice_bytes = kSlice, nb = blocks(w.cols), b0 = c0 / kQK_K;
  const int64_t n = (c1 - c0) / kQK_K;
  for (int64_t t = r0 / kQ4KX16Rows, i = 0; t * kQ4KX16Rows < r1; ++t, ++i) {
    std::memcpy(out + i * n * slice_bytes, w.data + (t * nb + b0) * slice_bytes,
                static_cast<size_t>(n * slice_bytes));
  }
  return m;
}

}  // namespace tandem::kern
