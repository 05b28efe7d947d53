// Checkpoints' own INT4 formats (formats/quant.h): compressed-tensors' pack-quantized and GPTQ's,
// their mappings onto GGUF's Q4_0 and the quantizers the synthetic checkpoints are written with.
#include <algorithm>
#include <cmath>

#include "core/fp_convert.h"
#include "formats/quant.h"

namespace tandem {

bool int4_groups_to_q4_0(const int32_t* packed, const uint16_t* scales_bf16, int64_t rows,
                         int64_t cols, int64_t group, BlockQ4_0* out, float* bad_scale) {
  const int64_t words = cols / 8, groups = cols / group, blocks = cols / kQK;
  for (int64_t r = 0; r < rows; ++r) {
    const auto* row = reinterpret_cast<const uint32_t*>(packed + r * words);
    const auto nibble = [&](int64_t i) { return (row[i / 8] >> (4 * (i % 8))) & 0xF; };
    for (int64_t b = 0; b < blocks; ++b) {
      const float scale = bf16_to_f32(scales_bf16[r * groups + b * kQK / group]);
      const uint16_t d = f32_to_f16(scale);
      if (f16_to_f32(d) != scale) {
        *bad_scale = scale;
        return false;
      }
      BlockQ4_0& q = out[r * blocks + b];
      q.d = d;
      for (int j = 0; j < kQK / 2; ++j) {
        const int64_t i = b * kQK + j;
        q.qs[j] = static_cast<uint8_t>(nibble(i) | (nibble(i + kQK / 2) << 4));
      }
    }
  }
  return true;
}

void quantize_int4_groups(const float* src, int64_t rows, int64_t cols, int64_t group,
                          int32_t* packed, uint16_t* scales_bf16) {
  const int64_t words = cols / 8, groups = cols / group;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = src + r * cols;
    auto* row = reinterpret_cast<uint32_t*>(packed + r * words);
    std::fill(row, row + words, 0u);
    for (int64_t g = 0; g < groups; ++g) {
      float amax = 0;
      for (int64_t i = g * group; i < (g + 1) * group; ++i) amax = std::max(amax, std::fabs(x[i]));
      const uint16_t s = f32_to_bf16(amax > 0 ? amax / 7.5f : 1.0f);
      scales_bf16[r * groups + g] = s;
      const float scale = bf16_to_f32(s);
      for (int64_t i = g * group; i < (g + 1) * group; ++i) {
        const float q = std::clamp(std::nearbyint(x[i] / scale), -8.0f, 7.0f);
        row[i / 8] |= static_cast<uint32_t>(static_cast<int>(q) + 8) << (4 * (i % 8));
      }
    }
  }
}

void gptq_int4_to_q4_0(const int32_t* qweight, const uint16_t* scales_f16, int64_t rows,
                       int64_t cols, int64_t group, BlockQ4_0* out) {
  const int64_t blocks = cols / kQK;
  const auto nibble = [&](int64_t r, int64_t k) {
    return (static_cast<uint32_t>(qweight[(k / 8) * rows + r]) >> (4 * (k % 8))) & 0xF;
  };
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      BlockQ4_0& q = out[r * blocks + b];
      q.d = scales_f16[(b * kQK / group) * rows + r];
      for (int j = 0; j < kQK / 2; ++j) {
        const int64_t k = b * kQK + j;
        q.qs[j] = static_cast<uint8_t>(nibble(r, k) | (nibble(r, k + kQK / 2) << 4));
      }
    }
  }
}

void quantize_gptq_int4(const float* src, int64_t rows, int64_t cols, int64_t group,
                        int32_t* qweight, uint16_t* scales_f16) {
  std::fill(qweight, qweight + (cols / 8) * rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = src + r * cols;
    for (int64_t g = 0; g < cols / group; ++g) {
      float amax = 0;
      for (int64_t k = g * group; k < (g + 1) * group; ++k) amax = std::max(amax, std::fabs(x[k]));
      const uint16_t s = f32_to_f16(amax > 0 ? 2 * amax / 15 : 1.0f);
      scales_f16[g * rows + r] = s;
      const float scale = f16_to_f32(s);
      for (int64_t k = g * group; k < (g + 1) * group; ++k) {
        const float q = std::clamp(std::nearbyint(x[k] / scale) + 8, 0.0f, 15.0f);
        auto& word = reinterpret_cast<uint32_t&>(qweight[(k / 8) * rows + r]);
        word |= static_cast<uint32_t>(q) << (4 * (k % 8));
      }
    }
  }
}

}  // namespace tandem
