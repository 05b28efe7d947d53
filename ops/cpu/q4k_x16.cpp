#include "ops/cpu/q4k_x16.h"

#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/cpu/kernels.h"

namespace tandem::kern {

// q4k_x16_vnni.cpp (compiled for AVX-512 VNNI): tiles [0, n_tiles).
void q4k_x16_gemv_vnni(const uint8_t* tiles, int64_t n_tiles, int64_t nb, const BlockQ8_K* act,
                       float* y);

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
  if (isa >= Isa::kAvx512Bf16 && best_isa() >= Isa::kAvx512Bf16) {
    q4k_x16_gemv_vnni(tiles, n_tiles, nb, act, y);
    return;
  }
  // The reference: each tile's rows back in GGUF order through kern::gemm_reference.
  const int64_t row_bytes = nb * static_cast<int64_t>(sizeof(BlockQ4_K));
  std::vector<uint8_t> rows(static_cast<size_t>(kQ4KX16Rows * row_bytes));
  KMatrix m;
  m.format = WFormat::kQ4_K;
  m.rows = kQ4KX16Rows;
  m.cols = cols;
  m.row_bytes = row_bytes;
  m.data = rows.data();
  Activations a;
  a.format = AFormat::kQ8_K;
  a.tokens = 1;
  a.cols = cols;
  a.row_bytes = nb * static_cast<int64_t>(sizeof(BlockQ8_K));
  a.data.resize(static_cast<size_t>(a.row_bytes));
  std::memcpy(a.data.data(), act, static_cast<size_t>(a.row_bytes));
  for (int64_t t = 0; t < n_tiles; ++t) {
    q4k_x16_unpack(tiles + t * nb * kSlice, cols, rows.data());
    gemm_reference(m, a, 0, kQ4KX16Rows, y + t * kQ4KX16Rows, kQ4KX16Rows);
  }
}

}  // namespace tandem::kern
