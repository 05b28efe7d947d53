// compressed-tensors' pack-quantized INT4 (formats/quant.h): its mapping onto GGUF's Q4_0 and the
// quantizer the synthetic checkpoints are written with.
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

}  // namespace tandem
