// The legacy ggml block formats (32 values per block): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, and
// MXFP4 (gpt-oss).
// Quantizers follow ggml's reference quantizers (ggml-quants.c, *_ref), which llama-quantize uses
// for these types when no importance matrix is given: the scale is computed in F32 and stored as
// F16, but the values are divided by the unrounded F32 scale. Keep the arithmetic as it is.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/fp_convert.h"
#include "formats/quant_impl.h"

namespace tandem::quant_impl {
namespace {

// The signed value of largest magnitude (the first one on ties), as the symmetric formats use.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void min_max(const float* x, int n, float* min_out, float* max_out) {
  float min = FLT_MAX;
  float max = -FLT_MAX;
  for (int j = 0; j < n; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  *min_out = min;
  *max_out = max;
}

// roundf (halves away from zero) for |x| < 2^22, written so that loops using it vectorize:
// adding 1.5 * 2^23 rounds to nearest even, and x - that is exact, +-1/2 exactly at the ties,
// which are then moved away from zero. Checked against roundf for every float with |x| <= 200.
inline int round_half_away(float x) {
  const float rne = (x + 12582912.0f) - 12582912.0f;
  const float diff = x - rne;
  // Bitwise & on the comparisons: no branches, which would stop vectorization.
  const int away = static_cast<int>((diff == 0.5f) & (x > 0.0f)) -
                   static_cast<int>((diff == -0.5f) & (x < 0.0f));
  return static_cast<int>(rne) + away;
}

// Packs 32 5-bit values: low nibbles as Q4 (j | j+16 << 4), bit 4 of value j into bit j of qh.
void pack_5bit(const uint8_t* q, uint8_t* qs, uint8_t* qh_bytes) {
  uint32_t qh = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0x0F) | ((q[j + kQK / 2] & 0x0F) << 4));
    qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q[j + kQK / 2] >> 4) & 1) << (j + kQK / 2);
  }
  std::memcpy(qh_bytes, &qh, sizeof(qh));
}

// The 32 values of a 5-bit block: low nibbles as Q4 (value j in qs[j % 16], high nibble for
// j >= 16), bit 4 of value j in bit j of qh (little-endian u32).
inline void unpack_5bit(const uint8_t* qs, const uint8_t* qh_bytes, int* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof(qh));
  for (int j = 0; j < kQK / 2; ++j) {
    q[j] = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1) << 4);
    q[j + kQK / 2] = (qs[j] >> 4) | static_cast<int>(((qh >> (j + kQK / 2)) & 1) << 4);
  }
}

}  // namespace

void dequantize_q4_0(const BlockQ4_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = f16_to_f32(x[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((x[i].qs[j] & 0x0F) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const BlockQ4_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = f16_to_f32(x[i].d);
    const float m = f16_to_f32(x[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(x[i].qs[j] & 0x0F) * d + m;
      y[j + kQK / 2] = static_cast<float>(x[i].qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_q5_0(const BlockQ5_0* x, float* y, int64_t nb) {
  int q[kQK];
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = f16_to_f32(x[i].d);
    unpack_5bit(x[i].qs, x[i].qh, q);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q[j] - 16) * d;
  }
}

void dequantize_q5_1(const BlockQ5_1* x, float* y, int64_t nb) {
  int q[kQK];
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = f16_to_f32(x[i].d);
    const float m = f16_to_f32(x[i].m);
    unpack_5bit(x[i].qs, x[i].qh, q);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q[j]) * d + m;
  }
}

void dequantize_q8_0(const BlockQ8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = f16_to_f32(x[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

void dequantize_q8_1(const BlockQ8_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const float d = f16_to_f32(x[i].d);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

// Symmetric 4 bits: d = max / -8 maps the value of largest magnitude to q = 0 exactly, so that
// the other side keeps the full range up to +7 (q = 15 after clamping).
void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    const float d = signed_absmax(x, kQK) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      // ggml truncates x/d + 8.5 through int8_t, which rounds half up for these non-negative
      // values.
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int q1 =
          std::min(15, static_cast<int>(static_cast<int8_t>(x[j + kQK / 2] * id + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_q4_1(const float* x, BlockQ4_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min, max;
    min_max(x, kQK, &min, &max);
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    y[i].m = f32_to_f16(min);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
      const int q1 =
          std::min(15, static_cast<int>(static_cast<int8_t>((x[j + kQK / 2] - min) * id + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_q5_0(const float* x, BlockQ5_0* y, int64_t nb) {
  uint8_t q[kQK];
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    const float d = signed_absmax(x, kQK) / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    for (int j = 0; j < kQK; ++j) {
      q[j] = static_cast<uint8_t>(
          std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f))));
    }
    pack_5bit(q, y[i].qs, y[i].qh);
  }
}

void quantize_q5_1(const float* x, BlockQ5_1* y, int64_t nb) {
  uint8_t q[kQK];
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float min, max;
    min_max(x, kQK, &min, &max);
    const float d = (max - min) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    y[i].m = f32_to_f16(min);
    // No clamp: (x - min) / d <= 31 up to rounding, and +0.5 then truncation stays <= 31.
    for (int j = 0; j < kQK; ++j) q[j] = static_cast<uint8_t>((x[j] - min) * id + 0.5f);
    pack_5bit(q, y[i].qs, y[i].qh);
  }
}

void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    // Halves away from zero, as ggml's roundf (unlike the K-quants' nearest_int).
    for (int j = 0; j < kQK; ++j) y[i].qs[j] = static_cast<int8_t>(round_half_away(x[j] * id));
  }
}

void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_f16(d);
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      y[i].qs[j] = static_cast<int8_t>(round_half_away(x[j] * id));
      sum += y[i].qs[j];
    }
    y[i].s = f32_to_f16(static_cast<float>(sum) * d);
  }
}


void dequantize_mxfp4(const BlockMXFP4* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = e8m0_half(x[i].e);
    for (int j = 0; j < kQK / 2; ++j) {
      y[i * kQK + j] = kMxfp4Values[x[i].qs[j] & 0xF] * d;
      y[i * kQK + j + kQK / 2] = kMxfp4Values[x[i].qs[j] >> 4] * d;
    }
  }
}

// ggml's quantize_row_mxfp4_ref: the exponent from the block's largest magnitude (so that it maps
// to 4..8 in the doubled table), each value to its nearest table entry (lowest index on ties).
void quantize_mxfp4(const float* x, BlockMXFP4* y, int64_t nb) {
  auto nearest = [](float v, float d) {
    int best = 0;
    float err = std::fabs(kMxfp4Values[0] * d - v);
    for (int i = 1; i < 16; ++i) {
      const float e = std::fabs(kMxfp4Values[i] * d - v);
      if (e < err) {
        best = i;
        err = e;
      }
    }
    return static_cast<uint8_t>(best);
  };
  for (int64_t i = 0; i < nb; ++i) {
    const float* v = x + i * kQK;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(v[j]));
    const uint8_t e =
        amax > 0.0f ? static_cast<uint8_t>(std::floor(std::log2(amax)) - 2 + 127) : uint8_t{0};
    const float d = e8m0_half(e);
    y[i].e = e;
    for (int j = 0; j < kQK / 2; ++j) {
      y[i].qs[j] = static_cast<uint8_t>(nearest(v[j], d) | (nearest(v[j + kQK / 2], d) << 4));
    }
  }
}

}  // namespace tandem::quant_impl
