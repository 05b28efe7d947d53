// Activation quantization in SIMD: one algorithm per format over a traits struct S (Avx2 in
// quant_act_avx2.cpp, Avx512 in quant_act_avx512.cpp, each compiled for its ISA), giving the
// bytes of the scalar quantizers (formats/quant_k.cpp quantize_q8_k, formats/quant_legacy.cpp
// quantize_q8_0 plus kernels.cpp's Q8_0 bias / scale / sum arrays, packed.cpp's int8 groups and
// f32_to_bf16) for finite inputs, and for Q8_K and BF16 for every input:
//  - the same products in the same precision (-ffp-contract=off);
//  - nearest_int's and round_half_away's rounding by the same 1.5 * 2^23 bias, lane by lane;
//  - the maximum searches skip NaN as the scalar comparisons do (S::max(|x|, acc) keeps acc);
//  - Q8_K's scale comes from the first x whose |x| is the largest (a compare mask, lowest lane);
//  - the C++ cast to int8 wraps: the low byte of each 32-bit lane is stored.
// S provides: F / I (float / int32 vectors of kLanes), load, abs, max, hmax, eq_mask, mul, set1,
// nearest_int, round_half_away, nearbyint_clamp127, min127, as_int8, add, hsum, zero,
// store_low_bytes (kLanes bytes), bf16_16 (16 values to BF16 bits, f32_to_bf16's rounding).
// Internal linkage (anonymous namespace): each ISA's translation unit has its own instances.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/fp_convert.h"
#include "formats/quant.h"
#include "ops/cpu/kern_gguf.h"
#include "ops/cpu/packed_kernels.h"

namespace tandem::kern::detail {
namespace {

template <class S>
void quantize_q8_k_impl(const float* x, BlockQ8_K* y, int64_t nb) {
  constexpr int kVecs = kQK_K / S::kLanes, kPerSum = 16 / S::kLanes;
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    typename S::F v[kVecs];
    typename S::F acc = S::fzero();
    for (int j = 0; j < kVecs; ++j) {
      v[j] = S::load(x + S::kLanes * j);
      acc = S::max(S::abs(v[j]), acc);
    }
    const float amax = S::hmax(acc);
    if (amax == 0) {
      y[i] = BlockQ8_K{};
      continue;
    }
    float max = 0;
    const typename S::F am = S::set1(amax);
    for (int j = 0; j < kVecs; ++j) {
      const uint32_t hit = S::eq_mask(S::abs(v[j]), am);
      if (hit != 0) {
        max = x[S::kLanes * j + __builtin_ctz(hit)];
        break;
      }
    }
    const float iscale = -127.f / max;
    const typename S::F is = S::set1(iscale);
    for (int j = 0; j < 16; ++j) {  // bsums groups of 16 values
      typename S::I sum = S::zero();
      for (int k = 0; k < kPerSum; ++k) {
        const int e = 16 * j + S::kLanes * k;
        const typename S::I q = S::min127(S::nearest_int(S::mul(is, v[e / S::kLanes])));
        S::store_low_bytes(q, y[i].qs + e);
        sum = S::add(sum, S::as_int8(q));
      }
      y[i].bsums[j] = static_cast<int16_t>(S::hsum(sum));
    }
    y[i].d = 1 / iscale;
  }
}

template <class S>
void quantize_q8_0_act_impl(const float* x, uint8_t* dst, int64_t cols) {
  constexpr int kVecs = kQK / S::kLanes;
  const int64_t nb = cols / kQK, nbp = q8_0_act_padded_blocks(nb);
  auto* blk = reinterpret_cast<BlockQ8_0*>(dst);
  auto* negc = reinterpret_cast<int32_t*>(dst + q8_0_act_aux_offset(nb));
  auto* dv = reinterpret_cast<float*>(negc + nbp);
  float* sv = dv + nbp;
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    typename S::F v[kVecs];
    typename S::F acc = S::fzero();
    for (int k = 0; k < kVecs; ++k) {
      v[k] = S::load(x + S::kLanes * k);
      acc = S::max(S::abs(v[k]), acc);
    }
    const float d = S::hmax(acc) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const Half h = f32_to_f16(d);
    std::memcpy(&blk[b].d, &h, sizeof(h));
    const typename S::F iv = S::set1(id);
    typename S::I sum = S::zero();
    for (int k = 0; k < kVecs; ++k) {
      const typename S::I q = S::round_half_away(S::mul(v[k], iv));
      S::store_low_bytes(q, blk[b].qs + S::kLanes * k);
      sum = S::add(sum, S::as_int8(q));
    }
    const int32_t isum = S::hsum(sum);
    negc[b] = -128 * isum;
    dv[b] = f16_to_f32(h);
    sv[b] = f16_to_f32(f32_to_f16(static_cast<float>(isum) * d));  // ggml's block_q8_1 s
  }
  for (int64_t b = nb; b < nbp; ++b) {
    negc[b] = 0;
    dv[b] = 0.0f;
    sv[b] = 0.0f;
  }
}

// group: a multiple of S::kLanes (the caller checks).
template <class S>
void quantize_i8_act_impl(const float* x, uint8_t* dst, int64_t cols, int64_t group) {
  const int64_t groups = cols / group;
  auto* q = reinterpret_cast<uint8_t*>(dst);
  auto* sa = reinterpret_cast<float*>(dst + act_scales_offset(cols));
  auto* sums = reinterpret_cast<int32_t*>(dst + act_scales_offset(cols) + groups * 4);
  uint8_t* biased = dst + act_biased_offset(cols, groups);
  for (int64_t g = 0; g < groups; ++g, x += group) {
    typename S::F acc = S::fzero();
    for (int64_t k = 0; k < group; k += S::kLanes) acc = S::max(S::abs(S::load(x + k)), acc);
    const float amax = S::hmax(acc);
    const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
    const typename S::F inv = S::set1(1.0f / s);
    typename S::I sum = S::zero();
    for (int64_t k = 0; k < group; k += S::kLanes) {
      const typename S::I v = S::nearbyint_clamp127(S::mul(S::load(x + k), inv));
      S::store_low_bytes(v, q + g * group + k);
      S::store_low_bytes(S::add(v, S::set1_i(0x80)), biased + g * group + k);  // low byte ^ 0x80
      sum = S::add(sum, v);
    }
    sa[g] = s;
    sums[g] = S::hsum(sum);
  }
}

template <class S>
void f32_to_bf16_impl(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) S::bf16_16(x + i, y + i);
  for (; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

}  // namespace
}  // namespace tandem::kern::detail
