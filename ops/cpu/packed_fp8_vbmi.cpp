// FP8Block GEMV (1-4 tokens) with AVX-512 VBMI on top of VNNI + BF16 (compiled for it;
// packed_vnni.cpp calls it only on CPUs that have VBMI: Ice Lake+, Sapphire Rapids, Zen 4+).
//
// The VNNI row kernel widens 32 E4M3 bytes to 16-bit lanes and rebuilds BF16 with shifts, an add,
// a masked table permute for the subnormals and the sign: ten instructions per 32 weights, which
// left the GEMV slower in L3 than DRAM's bandwidth. Here 64 E4M3 bytes stay in one vector and two
// 128-entry byte tables (vpermt2b, indexed by the 7 magnitude bits) give each value's BF16 high and
// low byte, exact for subnormals too (the tables are fp8_bf16_table's bytes); one vpternlogd puts
// the sign bit back and two byte unpacks form the two BF16 vectors: six instructions per 64
// weights.
// The unpacks interleave within 128-bit lanes, so the first vector holds elements 0-7, 16-23,
// 32-39, 48-55 of the 64 and the second the others; the token's BF16 row is permuted alike once
// per call. Per row and scale block: vdpbf16ps into two F32 accumulators per token, their sum
// post-scaled once (acc = fma(scale, part, acc), as the row kernel), one reduction per row.
// (Same products as the row kernel; their F32 summation order differs, within the bound the
// conformance test asserts.) The many-token GEMM keeps the VNNI expansion into BF16 tiles: this
// step there (two 16 x 16 dword transposes per 64 columns, each chunk stored at its pair's place)
// measured 12-14% slower per MoE layer prefill, even without register spills.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>
#include <vector>

#include "ops/cpu/packed_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512bf16,avx512vbmi")

#include "ops/cpu/fp8_vbmi_impl.h"

namespace tandem::kern::detail {
namespace {

constexpr int kMaxTokens = 4;
// The row stream is prefetched this far ahead, as the other packed GEMV kernels do. The MoE
// layer's decode (bench_moe_layer_bench 'Packed.*fp8_decode', alternated) in fast minutes (75-80
// GB/s): 2 KiB 0.73, 4 KiB 0.80-0.83, 6 KiB 0.85-0.87, 8 KiB 0.86-0.90 of DRAM; in slow minutes
// (~50 GB/s) 8 KiB 0.95-0.98 against 4 KiB's 0.96-0.98.
constexpr int kPrefetchBytes = 8192;

// 64 BF16 activations permuted as the unpacks order the weights (8-element runs: 0, 2, 4, 6 into
// the first half, 1, 3, 5, 7 into the second).
inline void permute64(const uint16_t* a, uint16_t* out) {
  const __m512i x0 = _mm512_loadu_si512(a), x1 = _mm512_loadu_si512(a + 32);
  const __m512i lo = _mm512_set_epi64(13, 12, 9, 8, 5, 4, 1, 0);
  const __m512i hi = _mm512_set_epi64(15, 14, 11, 10, 7, 6, 3, 2);
  _mm512_storeu_si512(out, _mm512_permutex2var_epi64(x0, lo, x1));
  _mm512_storeu_si512(out + 32, _mm512_permutex2var_epi64(x0, hi, x1));
}

template <int NT>
inline void fp8_row_vbmi(const KMatrix& w, const uint8_t* wr, const float* srow,
                         const uint16_t* const* ar, const Fp8Tables& tab, float* out) {
  // The 64 weights at k as two BF16 vectors (unpack order), their dots into pa / pb.
  auto chunk = [&](int64_t k, __m512* pa, __m512* pb) __attribute__((always_inline)) {
    __builtin_prefetch(wr + k + kPrefetchBytes, 0, 3);
    __m512i hi, lo;
    fp8x64_bf16_bytes(_mm512_loadu_si512(wr + k), tab, &hi, &lo);
    const __m512bh w0 = (__m512bh)_mm512_unpacklo_epi8(lo, hi);
    const __m512bh w1 = (__m512bh)_mm512_unpackhi_epi8(lo, hi);
    for (int t = 0; t < NT; ++t) {
      pa[t] = _mm512_dpbf16_ps(pa[t], w0, (__m512bh)_mm512_loadu_si512(ar[t] + k));
      pb[t] = _mm512_dpbf16_ps(pb[t], w1, (__m512bh)_mm512_loadu_si512(ar[t] + k + 32));
    }
  };
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  // DeepSeek's 128-column blocks as straight-line pairs of chunks; other block widths by count.
  int64_t bi = 0;
  for (int64_t b0 = 0; b0 < w.cols; b0 += w.block_cols, ++bi) {
    __m512 pa[NT], pb[NT];
    for (int t = 0; t < NT; ++t) pa[t] = pb[t] = _mm512_setzero_ps();
    if (w.block_cols == 128 && b0 + 128 <= w.cols) {
      chunk(b0, pa, pb);
      chunk(b0 + 64, pa, pb);
    } else {
      const int64_t b1 = b0 + w.block_cols < w.cols ? b0 + w.block_cols : w.cols;
      for (int64_t k = b0; k < b1; k += 64) chunk(k, pa, pb);
    }
    const __m512 sv = _mm512_set1_ps(srow[bi]);
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_fmadd_ps(sv, _mm512_add_ps(pa[t], pb[t]), acc[t]);
  }
  for (int t = 0; t < NT; ++t) out[t] = _mm512_reduce_add_ps(acc[t]);
}

template <int NT>
void rows_vbmi(const PackedArgs& p, const uint16_t* const* ar, const Fp8Tables& tab) {
  fp8_scale_rows<NT>(p, [&](const uint8_t* wr, const float* srow, float* out) {
    fp8_row_vbmi<NT>(*p.w, wr, srow, ar, tab, out);
  });
}

}  // namespace

bool fp8_rows_vbmi_fits(const KMatrix& w, int64_t tokens) {
  return tokens <= kMaxTokens && w.cols % 64 == 0 && w.block_cols > 0 && w.block_cols % 64 == 0;
}

void fp8_rows_vbmi(const PackedArgs& p) {
  static const Fp8Tables tab = make_fp8_tables();
  const KMatrix& w = *p.w;
  const Activations& a = *p.a;
  const int nt = static_cast<int>(a.tokens);
  thread_local std::vector<uint16_t> perm;
  perm.resize(static_cast<size_t>(nt * w.cols));
  const uint16_t* ar[kMaxTokens];
  for (int t = 0; t < nt; ++t) {
    const auto* src = reinterpret_cast<const uint16_t*>(a.row(t));
    uint16_t* dst = perm.data() + t * w.cols;
    for (int64_t k = 0; k < w.cols; k += 64) permute64(src + k, dst + k);
    ar[t] = dst;
  }
  // Token counts as template arguments: the accumulators stay in registers.
  if (nt == 1) rows_vbmi<1>(p, ar, tab);
  if (nt == 2) rows_vbmi<2>(p, ar, tab);
  if (nt == 3) rows_vbmi<3>(p, ar, tab);
  if (nt == 4) rows_vbmi<4>(p, ar, tab);
}

}  // namespace tandem::kern::detail

#pragma GCC pop_options
