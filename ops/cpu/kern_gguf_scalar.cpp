// Scalar references of the GGUF / dense kernels: the arithmetic every SIMD variant must
// reproduce (kern_gguf_impl.h states the contract). Plain loops, in the order of the definition.
#include <cstring>

#include "core/fp_convert.h"
#include "formats/quant.h"
#include "ops/cpu/kern_gguf.h"

namespace tandem::kern::detail {
namespace {

void scales_k4(const uint8_t* s, uint8_t* sc, uint8_t* m) {
  for (int j = 0; j < 8; ++j) unpack_scale_min_k4(j, s, &sc[j], &m[j]);
}

float q4k_dot(const BlockQ4_K* w, const BlockQ8_K* a, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t sc[8], m[8];
    scales_k4(w[b].scales, sc, m);
    int32_t isum = 0, summs = 0;
    for (int j = 0; j < 8; ++j) {
      // Sub-block j: nibble (j % 2) of bytes 32 * (j / 2) .. + 32.
      const uint8_t* q = w[b].qs + 32 * (j / 2);
      int32_t s = 0;
      for (int l = 0; l < 32; ++l) {
        const int v = (j % 2 == 0) ? (q[l] & 0xF) : (q[l] >> 4);
        s += v * a[b].qs[32 * j + l];
      }
      isum += sc[j] * s;
      summs += m[j] * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
    }
    const float dw = f16_to_f32(w[b].d), dmw = f16_to_f32(w[b].dmin);
    acc = acc + (a[b].d * dw) * static_cast<float>(isum);
    acc = acc - (a[b].d * dmw) * static_cast<float>(summs);
  }
  return acc;
}

float q5k_dot(const BlockQ5_K* w, const BlockQ8_K* a, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t sc[8], m[8];
    scales_k4(w[b].scales, sc, m);
    int32_t isum = 0, summs = 0;
    for (int j = 0; j < 8; ++j) {
      const uint8_t* q = w[b].qs + 32 * (j / 2);
      int32_t s = 0;
      for (int l = 0; l < 32; ++l) {
        const int low = (j % 2 == 0) ? (q[l] & 0xF) : (q[l] >> 4);
        const int high = (w[b].qh[l] >> j) & 1;  // bit j of qh[l]: the fifth bit of sub-block j
        s += (low | (high << 4)) * a[b].qs[32 * j + l];
      }
      isum += sc[j] * s;
      summs += m[j] * (a[b].bsums[2 * j] + a[b].bsums[2 * j + 1]);
    }
    const float dw = f16_to_f32(w[b].d), dmw = f16_to_f32(w[b].dmin);
    acc = acc + (a[b].d * dw) * static_cast<float>(isum);
    acc = acc - (a[b].d * dmw) * static_cast<float>(summs);
  }
  return acc;
}

float q6k_dot(const BlockQ6_K* w, const BlockQ8_K* a, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t isum = 0;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = w[b].ql + 64 * h;
      const uint8_t* qh = w[b].qh + 32 * h;
      const int8_t* sc = w[b].scales + 8 * h;
      const int8_t* q8 = a[b].qs + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        const int is = l / 16;
        isum += sc[is + 0] * q1 * q8[l] + sc[is + 2] * q2 * q8[l + 32] +
                sc[is + 4] * q3 * q8[l + 64] + sc[is + 6] * q4 * q8[l + 96];
      }
    }
    acc = acc + (a[b].d * f16_to_f32(w[b].d)) * static_cast<float>(isum);
  }
  return acc;
}

float q8_0_dot(const BlockQ8_0* w, const BlockQ8_0* a, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t isum = 0;
    for (int l = 0; l < 32; ++l) isum += w[b].qs[l] * a[b].qs[l];
    acc = acc + (f16_to_f32(w[b].d) * f16_to_f32(a[b].d)) * static_cast<float>(isum);
  }
  return acc;
}

float q5_0_dot(const BlockQ5_0* w, const BlockQ8_0* a, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    uint32_t qh;
    std::memcpy(&qh, w[b].qh, 4);
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = (w[b].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int hi = (w[b].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      isum += (lo - 16) * a[b].qs[j] + (hi - 16) * a[b].qs[j + 16];
    }
    acc = acc + (f16_to_f32(w[b].d) * f16_to_f32(a[b].d)) * static_cast<float>(isum);
  }
  return acc;
}

// ggml_vec_dot_mxfp4_q8_0: per block (da * 2^(e - 128)) * (low-half sum + high-half sum).
float mxfp4_dot(const BlockMXFP4* w, const BlockQ8_0* a, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += kMxfp4Values[w[b].qs[j] & 0xF] * a[b].qs[j] +
              kMxfp4Values[w[b].qs[j] >> 4] * a[b].qs[j + 16];
    }
    acc = acc + (f16_to_f32(a[b].d) * e8m0_half(w[b].e)) * static_cast<float>(isum);
  }
  return acc;
}

float q4_0_dot(const BlockQ4_0* w, const BlockQ8_0* a, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      isum += ((w[b].qs[j] & 0xF) - 8) * a[b].qs[j] + ((w[b].qs[j] >> 4) - 8) * a[b].qs[j + 16];
    }
    acc = acc + (f16_to_f32(w[b].d) * f16_to_f32(a[b].d)) * static_cast<float>(isum);
  }
  return acc;
}

// Q4_1 / Q5_1: x = d * q + m against ggml's Q8_1 (the Q8_0 row's quants and d, and its s array,
// s = d_a * sum(q_a) rounded to F16): per block (dw * da) * isum + m * s, as
// ggml_vec_dot_q4_1_q8_1 / q5_1_q8_1.
template <bool kFive, class Block>
float q_1_dot(const Block* w, const BlockQ8_0* a, const float* s, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    uint32_t qh = 0;
    if constexpr (kFive) std::memcpy(&qh, w[b].qh, 4);
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = (w[b].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int hi = (w[b].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      isum += lo * a[b].qs[j] + hi * a[b].qs[j + 16];
    }
    acc = acc + ((f16_to_f32(w[b].d) * f16_to_f32(a[b].d)) * static_cast<float>(isum) +
                 f16_to_f32(w[b].m) * s[b]);
  }
  return acc;
}

// Q2_K: 16 sub-blocks of 16, x = d * (sc & 15) * q - dmin * (sc >> 4), q 2 bits; element
// 128n + 32j + 16p + l is bits 2j.. of qs[32n + 16p + l] (sub-block 8n + 2j + p). The Q4_K steps:
// acc + (da * d) * isum, then - (da * dmin) * summs, summs = sum_j (sc_j >> 4) * bsums[j].
float q2k_dot(const BlockQ2_K* w, const BlockQ8_K* a, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t isum = 0, summs = 0;
    for (int j = 0; j < 16; ++j) summs += (w[b].scales[j] >> 4) * a[b].bsums[j];
    for (int sub = 0; sub < 16; ++sub) {
      const int n = sub / 8, j = (sub % 8) / 2, p = sub % 2;
      int32_t s = 0;
      for (int l = 0; l < 16; ++l) {
        const int q = (w[b].qs[32 * n + 16 * p + l] >> (2 * j)) & 3;
        s += q * a[b].qs[16 * sub + l];
      }
      isum += (w[b].scales[sub] & 0xF) * s;
    }
    acc = acc + (a[b].d * f16_to_f32(w[b].d)) * static_cast<float>(isum);
    acc = acc - (a[b].d * f16_to_f32(w[b].dmin)) * static_cast<float>(summs);
  }
  return acc;
}

// Q3_K: 16 sub-blocks of 16, x = d * (sc - 32) * q, q = the 2 bits of qs (as Q2_K) minus 4 where
// bit 4n + j of hmask[16p + l] is clear; 6-bit scales (unpack_q3_k_scales). As Q6_K:
// acc + (da * d) * isum per super-block.
float q3k_dot(const BlockQ3_K* w, const BlockQ8_K* a, int64_t nb) {
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t sc[16];
    unpack_q3_k_scales(w[b].scales, sc);
    int32_t isum = 0;
    for (int sub = 0; sub < 16; ++sub) {
      const int n = sub / 8, j = (sub % 8) / 2, p = sub % 2;
      int32_t s = 0;
      for (int l = 0; l < 16; ++l) {
        const int low = (w[b].qs[32 * n + 16 * p + l] >> (2 * j)) & 3;
        const int high = (w[b].hmask[16 * p + l] >> (4 * n + j)) & 1;
        s += (low - (high ? 0 : 4)) * a[b].qs[16 * sub + l];
      }
      isum += (sc[sub] - 32) * s;
    }
    acc = acc + (a[b].d * f16_to_f32(w[b].d)) * static_cast<float>(isum);
  }
  return acc;
}

template <typename Dot>
void rows(const GemmArgs& g, Dot&& dot) {
  for (int64_t t = 0; t < g.tokens; ++t) {
    const uint8_t* act = g.act + t * g.act_row_bytes;
    for (int64_t r = g.n0; r < g.n1; ++r) g.y[t * g.ldy + r] = dot(g.w + r * g.row_bytes, act);
  }
}

void q4k(const GemmArgs& g) {
  rows(g, [&](const uint8_t* w, const uint8_t* a) {
    return q4k_dot(reinterpret_cast<const BlockQ4_K*>(w), reinterpret_cast<const BlockQ8_K*>(a),
                   g.cols / kQK_K);
  });
}
void q5k(const GemmArgs& g) {
  rows(g, [&](const uint8_t* w, const uint8_t* a) {
    return q5k_dot(reinterpret_cast<const BlockQ5_K*>(w), reinterpret_cast<const BlockQ8_K*>(a),
                   g.cols / kQK_K);
  });
}
void q6k(const GemmArgs& g) {
  rows(g, [&](const uint8_t* w, const uint8_t* a) {
    return q6k_dot(reinterpret_cast<const BlockQ6_K*>(w), reinterpret_cast<const BlockQ8_K*>(a),
                   g.cols / kQK_K);
  });
}
void q80(const GemmArgs& g) {
  rows(g, [&](const uint8_t* w, const uint8_t* a) {
    return q8_0_dot(reinterpret_cast<const BlockQ8_0*>(w), reinterpret_cast<const BlockQ8_0*>(a),
                    g.cols / kQK);
  });
}
void q50(const GemmArgs& g) {
  rows(g, [&](const uint8_t* w, const uint8_t* a) {
    return q5_0_dot(reinterpret_cast<const BlockQ5_0*>(w), reinterpret_cast<const BlockQ8_0*>(a),
                    g.cols / kQK);
  });
}
void q40(const GemmArgs& g) {
  rows(g, [&](const uint8_t* w, const uint8_t* a) {
    return q4_0_dot(reinterpret_cast<const BlockQ4_0*>(w), reinterpret_cast<const BlockQ8_0*>(a),
                    g.cols / kQK);
  });
}
void mxfp4(const GemmArgs& g) {
  rows(g, [&](const uint8_t* w, const uint8_t* a) {
    return mxfp4_dot(reinterpret_cast<const BlockMXFP4*>(w),
                     reinterpret_cast<const BlockQ8_0*>(a), g.cols / kQK);
  });
}
template <bool kFive, class Block>
void q_1(const GemmArgs& g) {
  const int64_t nb = g.cols / kQK;
  rows(g, [&](const uint8_t* w, const uint8_t* a) {
    return q_1_dot<kFive>(reinterpret_cast<const Block*>(w), reinterpret_cast<const BlockQ8_0*>(a),
                          q8_0_act_sums(a, nb), nb);
  });
}
void q2k(const GemmArgs& g) {
  rows(g, [&](const uint8_t* w, const uint8_t* a) {
    return q2k_dot(reinterpret_cast<const BlockQ2_K*>(w), reinterpret_cast<const BlockQ8_K*>(a),
                   g.cols / kQK_K);
  });
}
void q3k(const GemmArgs& g) {
  rows(g, [&](const uint8_t* w, const uint8_t* a) {
    return q3k_dot(reinterpret_cast<const BlockQ3_K*>(w), reinterpret_cast<const BlockQ8_K*>(a),
                   g.cols / kQK_K);
  });
}
void f32(const GemmArgs& g) {
  rows(g, [&](const uint8_t* w, const uint8_t* a) {
    const float* wf = reinterpret_cast<const float*>(w);
    const float* af = reinterpret_cast<const float*>(a);
    float s = 0.0f;
    for (int64_t i = 0; i < g.cols; ++i) s += wf[i] * af[i];
    return s;
  });
}
void f16(const GemmArgs& g) {
  rows(g, [&](const uint8_t* w, const uint8_t* a) {
    const uint16_t* wh = reinterpret_cast<const uint16_t*>(w);
    const float* af = reinterpret_cast<const float*>(a);
    float s = 0.0f;
    for (int64_t i = 0; i < g.cols; ++i) s += f16_to_f32(wh[i]) * af[i];
    return s;
  });
}
void bf16(const GemmArgs& g) {
  rows(g, [&](const uint8_t* w, const uint8_t* a) {
    const uint16_t* wb = reinterpret_cast<const uint16_t*>(w);
    const float* af = reinterpret_cast<const float*>(a);
    float s = 0.0f;
    for (int64_t i = 0; i < g.cols; ++i) s += bf16_to_f32(wb[i]) * af[i];
    return s;
  });
}

}  // namespace

const GgufKernels& gguf_kernels_scalar() {
  static const GgufKernels k = [] {
    GgufKernels t{q4k,  q5k, q6k, q80, f32, f16, bf16, q50, q40,
                  q_1<false, BlockQ4_1>, q_1<true, BlockQ5_1>, q2k, q3k};
    t.mxfp4 = mxfp4;
    return t;
  }();
  return k;
}

}  // namespace tandem::kern::detail
