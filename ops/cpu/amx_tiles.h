// The AMX tile configuration (ldtilecfg's 64-byte palette-1 block), shared by the AMX GEMM
// kernels (kern_amx.cpp) and the AMX peak measurement (roofline_kernels.cpp). Plain data: the
// files that load it compile with the AMX target.
#pragma once

#include <cstdint>

namespace tandem::kern {

struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row of tile i (0: unused)
  uint8_t rows[16] = {};    // rows of tile i (0: unused)
};

}  // namespace tandem::kern
