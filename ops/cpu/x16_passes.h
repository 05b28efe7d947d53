// The token loop the x16 tile kernels (q4k_x16_vnni.cpp, q6k_x16_vnni.cpp) share: tile after
// tile, the call's tokens in passes of up to four (from the second pass on the tile comes from
// L1 / L2), each pass one call of the kernel instantiated for its token count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "formats/quant.h"

namespace tandem::kern::detail {

// kernel(std::integral_constant<int, NT>{}, tile, a, out) for NT = 1..4 computes tokens a[0..NT)
// on one tile of 16 rows into out[k][0..16). y[k * ldy + 16 t + n]: row n of tile t, token k;
// token k's Q8_K row at act + k * act_row_bytes bytes.
template <class Kernel>
void x16_token_passes(const uint8_t* tiles, int64_t n_tiles, int64_t tile_bytes,
                      const BlockQ8_K* act, int64_t tokens, int64_t act_row_bytes, float* y,
                      int64_t ldy, const Kernel& kernel) {
  constexpr int kPass = 4;
  const BlockQ8_K* a[kPass];
  float* out[kPass];
  for (int64_t t = 0; t < n_tiles; ++t) {
    const uint8_t* tile = tiles + t * tile_bytes;
    for (int64_t k0 = 0; k0 < tokens; k0 += kPass) {
      const int nt = static_cast<int>(std::min<int64_t>(kPass, tokens - k0));
      for (int k = 0; k < nt; ++k) {
        a[k] = reinterpret_cast<const BlockQ8_K*>(reinterpret_cast<const uint8_t*>(act) +
                                                  (k0 + k) * act_row_bytes);
        out[k] = y + (k0 + k) * ldy + 16 * t;
      }
      switch (nt) {
        case 4: kernel(std::integral_constant<int, 4>{}, tile, a, out); break;
        case 3: kernel(std::integral_constant<int, 3>{}, tile, a, out); break;
        case 2: kernel(std::integral_constant<int, 2>{}, tile, a, out); break;
        default: kernel(std::integral_constant<int, 1>{}, tile, a, out); break;
      }
    }
  }
}

}  // namespace tandem::kern::detail
