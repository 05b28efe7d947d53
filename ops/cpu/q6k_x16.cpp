#include "ops/cpu/q6k_x16.h"

#include <cstring>
#include <memory>

#include "core/error.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/q4k_x16.h"

namespace tandem::kern {

namespace {

constexpr int64_t kHeader = 288;                             // 16 x 16 scales, 16 F16 d
constexpr int64_t kQuants = kQ6KX16Rows * 192;               // 16 triples of 64-byte chunks
constexpr int64_t kBlock = static_cast<int64_t>(sizeof(BlockQ6_K));  // 210
static_assert(kHeader + kQuants == kQ6KX16Rows * kBlock, "a tile holds the rows' bytes");

int64_t blocks(int64_t cols) {
  TD_CHECK(cols > 0 && cols % kQK_K == 0, "Q6_K x16: {} columns is not a multiple of {}", cols,
           kQK_K);
  return cols / kQK_K;
}

// Where byte `k` (0..3) of row n's share of chunk `which` (0: A, 1: B, 2: Q) of triple t is.
int64_t chunk_at(int64_t nb, int64_t b, int t, int which, int64_t n) {
  return nb * kHeader + b * kQuants + 192 * t + 64 * which + 4 * n;
}

// The row bytes a triple's chunks hold: A, B from ql, Q from qh (4 bytes each).
template <class Blk>  // BlockQ6_K or const BlockQ6_K
auto triple_src(Blk& blk, int t, int which) -> decltype(blk.ql + 0) {
  const int h = t / 8, i = t % 8;
  return which == 0 ? blk.ql + 64 * h + 4 * i
         : which == 1 ? blk.ql + 64 * h + 32 + 4 * i
                      : blk.qh + 32 * h + 4 * i;
}

}  // namespace

int64_t q6k_x16_tile_bytes(int64_t cols) {
  return blocks(cols) * kQ6KX16Rows * kBlock;
}

void q6k_x16_repack(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols,
                    uint8_t* out) {
  const int64_t nb = blocks(cols), tile_bytes = q6k_x16_tile_bytes(cols);
  const int64_t tiles = (rows + kQ6KX16Rows - 1) / kQ6KX16Rows;
  for (int64_t t = 0; t < tiles; ++t) {
    uint8_t* tile = out + t * tile_bytes;
    std::memset(tile, 0, static_cast<size_t>(tile_bytes));
    for (int64_t n = 0; n < kQ6KX16Rows && t * kQ6KX16Rows + n < rows; ++n) {
      const auto* row = reinterpret_cast<const BlockQ6_K*>(w + (t * kQ6KX16Rows + n) * row_bytes);
      for (int64_t b = 0; b < nb; ++b) {
        const BlockQ6_K& blk = row[b];
        uint8_t* hd = tile + b * kHeader;
        for (int j = 0; j < 16; ++j) hd[16 * j + n] = static_cast<uint8_t>(blk.scales[j]);
        std::memcpy(hd + 256 + 2 * n, &blk.d, 2);
        for (int tr = 0; tr < 16; ++tr) {
          for (int which = 0; which < 3; ++which) {
            std::memcpy(tile + chunk_at(nb, b, tr, which, n), triple_src(blk, tr, which), 4);
          }
        }
      }
    }
  }
}

void q6k_x16_unpack(const uint8_t* tile, int64_t cols, uint8_t* rows) {
  const int64_t nb = blocks(cols);
  for (int64_t n = 0; n < kQ6KX16Rows; ++n) {
    auto* row = reinterpret_cast<BlockQ6_K*>(rows + n * nb * kBlock);
    for (int64_t b = 0; b < nb; ++b) {
      BlockQ6_K& blk = row[b];
      const uint8_t* hd = tile + b * kHeader;
      for (int j = 0; j < 16; ++j) blk.scales[j] = static_cast<int8_t>(hd[16 * j + n]);
      std::memcpy(&blk.d, hd + 256 + 2 * n, 2);
      for (int tr = 0; tr < 16; ++tr) {
        for (int which = 0; which < 3; ++which) {
          std::memcpy(triple_src(blk, tr, which),
                      tile + chunk_at(nb, b, tr, which, n), 4);
        }
      }
    }
  }
}

KMatrix q6k_x16_matrix(const KMatrix& q6k, const AllocOptions& alloc) {
  if (q6k.format != WFormat::kQ6_K || q6k.cols % kQK_K != 0 || q6k.rows <= 0) {
    fail(ErrorKind::kInvalidArgument, "Q6_K x16: a {} x {} {} matrix cannot be repacked",
         q6k.rows, q6k.cols, wformat_name(q6k.format));
  }
  uint8_t* out = nullptr;
  KMatrix m = x16_alloc(WFormat::kQ6_KX16, q6k.rows, q6k.cols, q6k.row_bytes, alloc, &out);
  q6k_x16_repack(q6k.data, q6k.row_bytes, q6k.rows, q6k.cols, out);
  return m;
}

KMatrix q6k_x16_copy_submatrix(const KMatrix& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                               const AllocOptions& alloc) {
  TD_CHECK(w.format == WFormat::kQ6_KX16 && r0 % kQ6KX16Rows == 0 && c0 % kQK_K == 0 &&
               (c1 % kQK_K == 0 || c1 == w.cols) && r0 < r1 && r1 <= w.rows && c1 <= w.cols,
           "Q6_K x16 submatrix rows [{}, {}) x cols [{}, {}) of {} x {}", r0, r1, c0, c1, w.rows,
           w.cols);
  uint8_t* out = nullptr;
  KMatrix m =
      x16_alloc(WFormat::kQ6_KX16, r1 - r0, c1 - c0, blocks(c1 - c0) * kBlock, alloc, &out);
  const int64_t nb = blocks(w.cols), b0 = c0 / kQK_K, n = (c1 - c0) / kQK_K;
  const int64_t from_bytes = q6k_x16_tile_bytes(w.cols), to_bytes = q6k_x16_tile_bytes(m.cols);
  for (int64_t t = r0 / kQ6KX16Rows, i = 0; t * kQ6KX16Rows < r1; ++t, ++i) {
    const uint8_t* src = w.data + t * from_bytes;
    uint8_t* dst = out + i * to_bytes;
    std::memcpy(dst, src + b0 * kHeader, static_cast<size_t>(n * kHeader));
    std::memcpy(dst + n * kHeader, src + nb * kHeader + b0 * kQuants,
                static_cast<size_t>(n * kQuants));
  }
  return m;
}

}  // namespace tandem::kern
