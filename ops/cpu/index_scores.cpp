// DeepSeek Sparse Attention's indexer scores (kern::index_scores): the keys widened to F32 in
// tiles of 64 positions, each tile's dot products with every query head as one F32 GEMM
// (gemm_f32_kn: AVX-512 register blocks where the heads come in 64s, its scalar reference
// otherwise; the same bits), then ops::index_score per position.
#include <algorithm>
#include <vector>

#include "core/fp_convert.h"
#include "core/thread_pool.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/ref_ops.h"

namespace tandem::kern {

namespace detail {
void widen_keys_avx512(const ops::AttentionArgs& a, int64_t s0, int64_t rows, float* tile);
}  // namespace detail

namespace {

constexpr int64_t kTile = ops::kKvBlockAlign;  // positions per tile: never across a cache block

// Rows [s0, s0 + rows) of the keys as F32 into tile [rows, dk] (widen_keys_avx512's bits).
void widen_keys(const ops::AttentionArgs& a, int64_t s0, int64_t rows, float* tile) {
  if (best_isa() >= Isa::kAvx512) {
    detail::widen_keys_avx512(a, s0, rows, tile);
    return;
  }
  const int64_t d = a.dk;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = ops::k_offset(a, s0 + r);
    float* dst = tile + r * d;
    if (a.k8 != nullptr) {
      for (int64_t i = 0; i < d; ++i) dst[i] = ops::q8_value(a.k8 + at, i);
    } else if (a.k16 != nullptr) {
      const uint16_t* src = a.k16 + at;
      for (int64_t i = 0; i < d; ++i) dst[i] = a.f16 ? f16_to_f32(src[i]) : bf16_to_f32(src[i]);
    } else {
      std::copy(a.k + at, a.k + at + d, dst);
    }
  }
}

}  // namespace

void index_scores(const ops::AttentionArgs& keys, const float* q, const float* w, int64_t heads,
                  int64_t n, float* out, ThreadPool* pool) {
  const int64_t d = keys.dk;
  // The queries transposed, [dk, heads]: the GEMM's right-hand side (kept per calling thread).
  // (The tasks read it through `qt`, a pointer: a thread_local named in the lambda would be each
  // worker's own.)
  thread_local std::vector<float> qt_rows;
  qt_rows.resize(static_cast<size_t>(d * heads));
  float* qt = qt_rows.data();
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < d; ++i) qt[static_cast<size_t>(i * heads + h)] = q[h * d + i];
  }
  const int64_t tiles = (n + kTile - 1) / kTile;
  auto tile = [&](size_t t) {
    thread_local std::vector<float> k, dots;
    const int64_t s0 = static_cast<int64_t>(t) * kTile, rows = std::min(kTile, n - s0);
    k.resize(static_cast<size_t>(kTile * d));
    dots.resize(static_cast<size_t>(kTile * heads));
    widen_keys(keys, s0, rows, k.data());
    gemm_f32_kn(k.data(), d, rows, qt, d, heads, dots.data(), heads);
    for (int64_t r = 0; r < rows; ++r) out[s0 + r] = ops::index_score(dots.data() + r * heads, w, heads);
  };
  if (pool == nullptr || tiles == 1) {
    for (int64_t t = 0; t < tiles; ++t) tile(static_cast<size_t>(t));
  } else {
    pool->run(static_cast<size_t>(tiles), tile);
  }
}

}  // namespace tandem::kern
