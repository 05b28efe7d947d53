// The ggml K-quants (super-blocks of 256 values): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and Q8_K.
//
// Quantization implements ggml's reference algorithms (ggml-quants.c, quantize_row_*_ref, which
// llama-quantize runs when no importance matrix is given):
//  - Q2_K, Q4_K, Q5_K (scale + min per sub-block): for each sub-block, a grid search over the
//    inverse scale around nmax / (max - min), solving the weighted least-squares scale and min for
//    each candidate quantization and keeping the lowest weighted error ("qkx2"). The sub-block
//    scales and mins are then quantized to 4 / 6 bits against the largest one, and the values are
//    re-quantized with the final scales.
//  - Q3_K, Q6_K (signed, scale only): "qx" search of ±0.9 around nmax / max with x^2 weights
//    (Q6_K), or iterative per-value refinement of the least-squares scale (Q3_K).
// Every float operation is written in ggml's order, so that the output bytes match.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp_convert.h"
#include "formats/quant_impl.h"

namespace tandem::quant_impl {
namespace {

// Below this, a group is treated as all zeros.
constexpr float kGroupMaxEps = 1e-15f;
// Largest group search_scale_min is used with (sub-blocks of Q4_K / Q5_K).
constexpr int kMaxGroup = 32;

// The grid searches below try a fixed list of candidate inverse scales ("steps"). Steps are
// evaluated side by side, one lane per step, in loops over the lanes that the compiler
// vectorizes; each lane performs exactly the float operations that ggml's sequential loop does
// for that step, and the winner is then chosen in step order, so the result is bitwise the same.
constexpr int kLanes = 24;

// The range of a group (min, max) and its weighted sums (sum_w of the weights, sum_x of the
// weighted values), accumulated in ggml's order.
struct GroupStats {
  float min, max, sum_w, sum_x;
};
GroupStats group_stats(int n, const float* x, const float* weights) {
  GroupStats g{x[0], x[0], weights[0], weights[0] * x[0]};
  for (int i = 1; i < n; ++i) {
    if (x[i] < g.min) g.min = x[i];
    if (x[i] > g.max) g.max = x[i];
    const float w = weights[i];
    g.sum_w += w;
    g.sum_x += w * x[i];
  }
  return g;
}

// The levels L of the first guess (inverse scale iscale, scale, min) and their weighted error.
float first_guess_levels(int n, int nmax, const float* x, const float* weights, float iscale,
                         float scale, float min, bool use_mad, uint8_t* L) {
  float error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::clamp(l, 0, nmax));
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    error += weights[i] * diff;
  }
  return error;
}

// Asymmetric quantization of n values to 0..nmax with a scale and a min <= 0 (returned negated in
// *neg_min): value ~ scale * L - neg_min. Weighted error (absolute if use_mad, else squared).
// For each step's inverse scale around nmax / (max - min), the levels are rounded and the
// weighted least-squares scale and min for those levels computed; the lowest error wins.
float search_scale_min(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* neg_min, float rmin, float rdelta, int nstep, bool use_mad) {
  TD_CHECK(n <= kMaxGroup);
  const GroupStats g = group_stats(n, x, weights);
  const float max = g.max, sum_w = g.sum_w, sum_x = g.sum_x;
  float min = g.min;
  if (min > 0) min = 0;
  if (max == min) {
    std::memset(L, 0, static_cast<size_t>(n));
    *neg_min = -min;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = first_guess_levels(n, nmax, x, weights, iscale, scale, min, use_mad, L);
  if (nstep < 1) {
    *neg_min = -min;
    return scale;
  }
  // A winning step replaces `min`, which the later steps' levels depend on: lanes after a win
  // that changed it are evaluated again.
  float levels[kMaxGroup][kLanes];  // float, like the other lanes, so the loops vectorize whole
  float step_iscale[kLanes], sum_l[kLanes], sum_l2[kLanes], sum_xl[kLanes];
  float det[kLanes], step_scale[kLanes], step_min[kLanes], error[kLanes];
  int first = 0;
  while (first <= nstep) {
    const int count = std::min(nstep - first + 1, kLanes);
    for (int s = 0; s < kLanes; ++s) {
      step_iscale[s] =
          (rmin + rdelta * static_cast<float>(first + s) + static_cast<float>(nmax)) / (max - min);
      sum_l[s] = sum_l2[s] = sum_xl[s] = error[s] = 0;
    }
    for (int i = 0; i < n; ++i) {
      const float xm = x[i] - min;
      const float w = weights[i];
      const float xi = x[i];
      for (int s = 0; s < kLanes; ++s) {
        const auto lf = static_cast<float>(std::clamp(nearest_int(step_iscale[s] * xm), 0, nmax));
        levels[i][s] = lf;
        sum_l[s] += w * lf;
        sum_l2[s] += w * lf * lf;
        sum_xl[s] += w * lf * xi;
      }
    }
    // Least-squares scale and min for each step's levels (only used where det > 0).
    for (int s = 0; s < kLanes; ++s) {
      det[s] = sum_w * sum_l2[s] - sum_l[s] * sum_l[s];
      const float lsq_scale = (sum_w * sum_xl[s] - sum_x * sum_l[s]) / det[s];
      const float lsq_min = (sum_l2[s] * sum_x - sum_l[s] * sum_xl[s]) / det[s];
      step_min[s] = lsq_min > 0 ? 0.0f : lsq_min;
      step_scale[s] = lsq_min > 0 ? sum_xl[s] / sum_l2[s] : lsq_scale;
    }
    for (int i = 0; i < n; ++i) {
      const float w = weights[i];
      const float xi = x[i];
      for (int s = 0; s < kLanes; ++s) {
        float diff = step_scale[s] * levels[i][s] + step_min[s] - xi;
        diff = use_mad ? std::fabs(diff) : diff * diff;
        error[s] += w * diff;
      }
    }
    int next = first + count;
    for (int s = 0; s < count; ++s) {
      if (!(det[s] > 0) || !(error[s] < best_error)) continue;
      for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(levels[i][s]);
      best_error = error[s];
      scale = step_scale[s];
      const bool min_changed = step_min[s] != min;
      min = step_min[s];
      if (min_changed) {
        next = first + s + 1;
        break;
      }
    }
    first = next;
  }
  *neg_min = -min;
  return scale;
}

// Symmetric quantization to -nmax..nmax-1 (stored + nmax in L) with x^2 weights: tries inverse
// scales -(nmax + 0.1 * is) / max for is in -9..9 and keeps the best least-squares fit.
float search_scale_x2(int n, int nmax, const float* x, int8_t* L) {
  TD_CHECK(n <= kMaxGroup);
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    const auto lf = static_cast<float>(l);
    sumlx += w * x[i] * lf;
    suml2 += w * lf * lf;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  // Steps is = -9..-1, 1..9 in lanes 0..17.
  constexpr int kSteps = 18;
  float levels[kMaxGroup][kLanes];
  float step_iscale[kLanes], step_lx[kLanes], step_l2[kLanes];
  for (int s = 0; s < kLanes; ++s) {
    const int is = s < 9 ? s - 9 : s - 8;
    step_iscale[s] = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    step_lx[s] = step_l2[s] = 0;
  }
  for (int i = 0; i < n; ++i) {
    const float w = x[i] * x[i];
    const float xi = x[i];
    for (int s = 0; s < kLanes; ++s) {
      const auto lf =
          static_cast<float>(std::clamp(nearest_int(step_iscale[s] * xi), -nmax, nmax - 1));
      levels[i][s] = lf;
      step_lx[s] += w * xi * lf;
      step_l2[s] += w * lf * lf;
    }
  }
  for (int s = 0; s < kSteps; ++s) {
    // Better fit <=> larger sumlx^2 / suml2 (the error is sum w x^2 - sumlx^2 / suml2).
    if (step_l2[s] > 0 && step_lx[s] * step_lx[s] > best * step_l2[s]) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(static_cast<int>(levels[i][s]) + nmax);
      scale = step_lx[s] / step_l2[s];
      best = scale * step_lx[s];
    }
  }
  return scale;
}

// Symmetric quantization for Q3_K: start from -nmax / max, then up to 5 passes moving single
// values to the level that the least-squares scale without them suggests, when that helps.
float search_scale_q3(int n, int nmax, const float* x, int8_t* L) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  const float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    const auto lf = static_cast<float>(l);
    sumlx += w * x[i] * lf;
    suml2 += w * lf * lf;
  }
  for (int pass = 0; pass < 5; ++pass) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const auto li = static_cast<float>(L[i]);
      float slx = sumlx - w * x[i] * li;
      if (slx > 0) {
        float sl2 = suml2 - w * li * li;
        const int new_l = std::clamp(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (new_l != L[i]) {
          const auto nf = static_cast<float>(new_l);
          slx += w * x[i] * nf;
          sl2 += w * nf * nf;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (n_changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Packs 2-bit values (0..3) of one super-block: in each half of 128, byte l of qs holds elements
// l, l+32, l+64, l+96 in bits 0-1, 2-3, 4-5, 6-7 (Q2_K and the low bits of Q3_K).
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < kQK_K; j += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                           (L[j + l + 96] << 6));
    }
  }
}

// Stores the 6-bit scale and min of sub-block j (0..7) of Q4_K / Q5_K (see unpack_scale_min_k4).
void pack_scale_min_k4(int j, uint8_t ls, uint8_t lm, uint8_t* scales) {
  if (j < 4) {
    scales[j] = ls;
    scales[j + 4] = lm;
  } else {
    scales[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
    scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
    scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
  }
}

// Shared by Q4_K (nmax 15) and Q5_K (nmax 31): fills d, dmin and scales of `d_dmin_scales`
// and the levels L (0..nmax) of the 256 values.
struct ScaleMinParams {
  int nmax;
  float rmin;
  float rdelta;
  int nstep;
};

void quantize_scale_min_k4(const float* x, const ScaleMinParams& p, Half* d_out, Half* dmin_out,
                           uint8_t* scales_out, uint8_t* L) {
  float weights[32];
  float mins[kQK_K / 32];
  float scales[kQK_K / 32];
  float max_scale = 0;  // scales are positive since the min is subtracted
  float max_min = 0;
  for (int j = 0; j < kQK_K / 32; ++j) {
    // Weights favour large values but keep small ones relevant (av_x: RMS of the sub-block).
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = search_scale_min(32, p.nmax, x + 32 * j, weights, L + 32 * j, &mins[j], p.rmin,
                                 p.rdelta, p.nstep, false);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  std::memset(scales_out, 0, 12);
  for (int j = 0; j < kQK_K / 32; ++j) {
    // ggml stores nearest_int through uint8_t before clamping to 63.
    const auto ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    const auto lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
    pack_scale_min_k4(j, ls, lm, scales_out);
  }
  *d_out = f32_to_f16(max_scale / 63.f);
  *dmin_out = f32_to_f16(max_min / 63.f);

  // Re-quantize against the scales actually stored.
  for (int j = 0; j < kQK_K / 32; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(j, scales_out, &sc, &m);
    const float d = f16_to_f32(*d_out) * sc;
    if (d == 0) continue;
    const float dm = f16_to_f32(*dmin_out) * m;
    for (int ii = 0; ii < 32; ++ii) {
      L[32 * j + ii] =
          static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + ii] + dm) / d), 0, p.nmax));
    }
  }
}

}  // namespace

// ---- dequantization (ggml's operation order: (d * sc) * q - (dmin * m)) ----

void dequantize_q2_k(const BlockQ2_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(x[i].d);
    const float dmin = f16_to_f32(x[i].dmin);
    const uint8_t* q = x[i].qs;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 2; ++part) {  // two sub-blocks of 16 per shift
          const uint8_t sc = x[i].scales[is++];
          const float dl = d * static_cast<float>(sc & 0xF);
          const float ml = dmin * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) {
            *y++ = dl * static_cast<float>((q[l + 16 * part] >> shift) & 3) - ml;
          }
        }
      }
    }
  }
}

void dequantize_q3_k(const BlockQ3_K* x, float* y, int64_t nb) {
  uint8_t scales[16];
  for (int64_t i = 0; i < nb; ++i) {
    const float d_all = f16_to_f32(x[i].d);
    unpack_q3_k_scales(x[i].scales, scales);
    const uint8_t* q = x[i].qs;
    uint8_t hbit = 1;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, hbit = static_cast<uint8_t>(hbit << 1)) {
        for (int part = 0; part < 2; ++part) {
          const float dl = d_all * static_cast<float>(scales[is++] - 32);
          for (int l = 16 * part; l < 16 * part + 16; ++l) {
            const int v = ((q[l] >> shift) & 3) - ((x[i].hmask[l] & hbit) ? 0 : 4);
            *y++ = dl * static_cast<float>(v);
          }
        }
      }
    }
  }
}

void dequantize_q4_k(const BlockQ4_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(x[i].d);
    const float dmin = f16_to_f32(x[i].dmin);
    const uint8_t* q = x[i].qs;
    for (int is = 0; is < 8; is += 2, q += 32) {
      uint8_t sc, m;
      unpack_scale_min_k4(is, x[i].scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = dmin * m;
      unpack_scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void dequantize_q5_k(const BlockQ5_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(x[i].d);
    const float dmin = f16_to_f32(x[i].dmin);
    const uint8_t* ql = x[i].qs;
    const uint8_t* qh = x[i].qh;
    uint8_t u1 = 1, u2 = 2;
    for (int is = 0; is < 8; is += 2, ql += 32) {
      uint8_t sc, m;
      unpack_scale_min_k4(is, x[i].scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = dmin * m;
      unpack_scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = dmin * m;
      for (int l = 0; l < 32; ++l) {
        *y++ = d1 * static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
      }
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

void dequantize_q6_k(const BlockQ6_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    // ggml computes d * sc first, then * q: precomputing the 16 products keeps that rounding.
    float ds[kQK_K / 16] = {};
    const float d = f16_to_f32(x[i].d);
    for (int s = 0; s < kQK_K / 16; ++s) ds[s] = d * static_cast<float>(x[i].scales[s]);
    for (int half = 0; half < 2; ++half, y += 128) {
      const uint8_t* ql = x[i].ql + 64 * half;
      const uint8_t* qh = x[i].qh + 32 * half;
      // Quarter k (32 values): low nibble from ql[l + 32 * (k & 1)] (high nibble for k >= 2),
      // top 2 bits from qh[l] at bit 2k; sub-blocks of 16 use ds[8 * half + 2 * k + l / 16].
      for (int k = 0; k < 4; ++k) {
        const uint8_t* low = ql + 32 * (k & 1);
        const int nibble_shift = k >= 2 ? 4 : 0;
        for (int part = 0; part < 2; ++part) {
          const float scale = ds[8 * half + 2 * k + part];
          for (int l = 16 * part; l < 16 * part + 16; ++l) {
            const int q = (((low[l] >> nibble_shift) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
            y[32 * k + l] = scale * static_cast<float>(q);
          }
        }
      }
    }
  }
}

void dequantize_q8_k(const BlockQ8_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    for (int j = 0; j < kQK_K; ++j) *y++ = x[i].d * static_cast<float>(x[i].qs[j]);
  }
}

// ---- quantization ----

void quantize_q2_k(const float* x, BlockQ2_K* y, int64_t nb) {
  uint8_t L[kQK_K];
  float weights[16];
  float mins[kQK_K / 16];
  float scales[kQK_K / 16];
  constexpr float kQ4Scale = 15.f;
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float max_scale = 0;
    float max_min = 0;
    for (int j = 0; j < kQK_K / 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] =
          search_scale_min(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    if (max_scale > 0) {
      const float iscale = kQ4Scale / max_scale;
      for (int j = 0; j < kQK_K / 16; ++j) {
        y[i].scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      }
      y[i].d = f32_to_f16(max_scale / kQ4Scale);
    } else {
      std::memset(y[i].scales, 0, sizeof(y[i].scales));
      y[i].d = f32_to_f16(0.f);
    }
    if (max_min > 0) {
      const float iscale = kQ4Scale / max_min;
      for (int j = 0; j < kQK_K / 16; ++j) {
        y[i].scales[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
      }
      y[i].dmin = f32_to_f16(max_min / kQ4Scale);
    } else {
      y[i].dmin = f32_to_f16(0.f);
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = f16_to_f32(y[i].d) * static_cast<float>(y[i].scales[j] & 0xF);
      if (d == 0) continue;
      const float dm = f16_to_f32(y[i].dmin) * static_cast<float>(y[i].scales[j] >> 4);
      for (int ii = 0; ii < 16; ++ii) {
        L[16 * j + ii] =
            static_cast<uint8_t>(std::clamp(nearest_int((x[16 * j + ii] + dm) / d), 0, 3));
      }
    }
    pack_2bit(L, y[i].qs);
  }
}

void quantize_q3_k(const float* x, BlockQ3_K* y, int64_t nb) {
  int8_t L[kQK_K];
  float scales[kQK_K / 16];
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float max_scale = 0;
    float amax = 0;
    for (int j = 0; j < kQK_K / 16; ++j) {
      scales[j] = search_scale_q3(16, 4, x + 16 * j, L + 16 * j);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    std::memset(y[i].scales, 0, sizeof(y[i].scales));
    if (max_scale != 0) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < kQK_K / 16; ++j) {
        const int l =
            std::clamp<int>(static_cast<int8_t>(nearest_int(iscale * scales[j])), -32, 31) + 32;
        if (j < 8) {
          y[i].scales[j] = static_cast<uint8_t>(l & 0xF);
        } else {
          y[i].scales[j - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
        }
        y[i].scales[j % 4 + 8] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
      }
      y[i].d = f32_to_f16(1 / iscale);
    } else {
      y[i].d = f32_to_f16(0.f);
    }
    uint8_t sc[16];
    unpack_q3_k_scales(y[i].scales, sc);
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = f16_to_f32(y[i].d) * static_cast<float>(sc[j] - 32);
      if (d == 0) continue;
      for (int ii = 0; ii < 16; ++ii) {
        L[16 * j + ii] =
            static_cast<int8_t>(std::clamp(nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
      }
    }
    // The third bit of element j goes to bit j / 32 of hmask[j % 32].
    std::memset(y[i].hmask, 0, sizeof(y[i].hmask));
    uint8_t low[kQK_K];
    for (int j = 0; j < kQK_K; ++j) {
      int l = L[j];
      if (l > 3) {
        y[i].hmask[j % 32] |= static_cast<uint8_t>(1 << (j / 32));
        l -= 4;
      }
      low[j] = static_cast<uint8_t>(l);
    }
    pack_2bit(low, y[i].qs);
  }
}

void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t nb) {
  uint8_t L[kQK_K];
  const ScaleMinParams params{15, -1.f, 0.1f, 20};
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    quantize_scale_min_k4(x, params, &y[i].d, &y[i].dmin, y[i].scales, L);
    uint8_t* q = y[i].qs;
    for (int j = 0; j < kQK_K; j += 64, q += 32) {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    }
  }
}

void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t nb) {
  uint8_t L[kQK_K];
  const ScaleMinParams params{31, -0.5f, 0.1f, 15};
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    quantize_scale_min_k4(x, params, &y[i].d, &y[i].dmin, y[i].scales, L);
    uint8_t* qh = y[i].qh;
    uint8_t* ql = y[i].qs;
    std::memset(qh, 0, kQK_K / 8);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < kQK_K; n += 64, ql += 32) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n + j];
        if (l1 > 15) {
          l1 -= 16;
          qh[j] |= m1;
        }
        int l2 = L[n + j + 32];
        if (l2 > 15) {
          l2 -= 16;
          qh[j] |= m2;
        }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
      m1 = static_cast<uint8_t>(m1 << 2);
      m2 = static_cast<uint8_t>(m2 << 2);
    }
  }
}

void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t nb) {
  int8_t L[kQK_K];
  float scales[kQK_K / 16];
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float max_scale = 0;
    float max_abs_scale = 0;
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      const float scale = search_scale_x2(16, 32, x + 16 * ib, L + 16 * ib);
      scales[ib] = scale;
      if (std::fabs(scale) > max_abs_scale) {
        max_abs_scale = std::fabs(scale);
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(BlockQ6_K));
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[i].d = f32_to_f16(1 / iscale);
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      y[i].scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = f16_to_f32(y[i].d) * static_cast<float>(y[i].scales[j]);
      if (d == 0) continue;
      for (int ii = 0; ii < 16; ++ii) {
        L[16 * j + ii] =
            static_cast<int8_t>(std::clamp(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
      }
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < kQK_K; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
        ql[l] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((q2 & 0xF) | ((q4 & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) |
                                     ((q4 >> 4) << 6));
      }
    }
  }
}

void quantize_q8_k(const float* x, BlockQ8_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float max = 0;
    float amax = 0;
    for (int j = 0; j < kQK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0) {
      y[i] = BlockQ8_K{};
      continue;
    }
    // -127 (not -128) keeps q symmetric, as ggml's SIMD kernels assume.
    const float iscale = -127.f / max;
    for (int j = 0; j < kQK_K; ++j) {
      y[i].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      int sum = 0;
      for (int ii = 0; ii < 16; ++ii) sum += y[i].qs[j * 16 + ii];
      y[i].bsums[j] = static_cast<int16_t>(sum);
    }
    y[i].d = 1 / iscale;
  }
}

}  // namespace tandem::quant_impl
