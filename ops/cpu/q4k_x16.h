// Q4_K rows interleaved 16 at a time ("Q4_K x16", kern::WFormat::kQ4_KX16), the layout
// `--cpu-experts repack` holds Q4_K experts in: its one-token GEMV computes a row per lane with no
// per-row horizontal work, fast enough to keep the weight stream busy where the row kernel is not
// (docs/cpu-kernels.md, "Repacked GGUF layouts"); its GEMM reads the quants in place (no per-call
// transposition).
//
// Same bytes as the 16 GGUF rows it comes from, rearranged. A tile is nb = cols / 256 super-block
// slices in column order; slice b is
//   header: 256 bytes, row n's d, dmin and 12 scale bytes (the first 16 bytes of its BlockQ4_K b)
//           at bytes 16n .. 16n + 15;
//   quants: 32 chunks of 64 bytes; chunk c = 8g + i (g = 0..3, i = 0..7) holds, for row n, the
//           bytes qs[32g + 4i .. 32g + 4i + 3] of its block b at bytes 4n .. 4n + 3: their low
//           nibbles are values 64g + 4i .. +3 (sub-block 2g), high nibbles 64g + 32 + 4i .. +3
//           (sub-block 2g + 1).
// One chunk is one vpdpbusd operand: 16 rows x 4 values against 4 activation bytes broadcast, a
// row per lane, no horizontal sums; the 16 rows' scales unpack once per slice in vector lanes.
// The arithmetic is the scalar reference's (exact integer isum / msum per super-block, then acc +
// (da * d) * isum - (da * dmin) * msum in block order): bit-identical to kern::gemm on the rows.
#pragma once

#include <cstdint>

#include "core/cpu_features.h"
#include "core/memory.h"
#include "formats/quant.h"

namespace tandem::kern {

struct KMatrix;
enum class WFormat : uint8_t;

constexpr int64_t kQ4KX16Rows = 16;

// Bytes of one tile of rows `cols` long (16 GGUF rows' bytes).
int64_t q4k_x16_tile_bytes(int64_t cols);

// Rows [0, rows) of a Q4_K matrix (row r at w + r * row_bytes; cols a positive multiple of 256)
// into ceil(rows / 16) tiles at out. A last tile's missing rows are zero blocks (d = dmin = 0).
void q4k_x16_repack(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, uint8_t* out);

// The inverse for one tile: its 16 rows, row n at rows + n * row_bytes (row_bytes = cols / 256 *
// 144).
void q4k_x16_unpack(const uint8_t* tile, int64_t cols, uint8_t* rows);

// One token: y[16 t + n] = row n of tile t . act for t < n_tiles; act is the token's Q8_K row
// (cols / 256 blocks). isa: AVX-512 VNNI runs the tile kernel; below it kern::gemm unpacks each
// tile and runs the Q4_K row kernel of that level (the same bits).
void q4k_x16_gemv(const uint8_t* tiles, int64_t n_tiles, int64_t cols, const BlockQ8_K* act,
                  float* y, Isa isa = best_isa());

// (Internal: the AVX-512 VNNI tile kernel behind q4k_x16_gemv and kern::gemm, q4k_x16_vnni.cpp;
// nb = cols / 256. Call only where the CPU has AVX-512 VNNI.) y[k * ldy + 16 t + n] = row n of
// tile t . token k's activations for t < n_tiles, k < tokens; token k's Q8_K row at act + k *
// act_row_bytes bytes. Up to four tokens per pass over a tile, each chunk's nibbles unpacked
// once for them all; each token's arithmetic is the one-token kernel's (the same bits).
void q4k_x16_gemv_vnni(const uint8_t* tiles, int64_t n_tiles, int64_t nb, const BlockQ8_K* act,
                       float* y, int64_t tokens = 1, int64_t act_row_bytes = 0, int64_t ldy = 0);

// A Q4_K matrix (kern::KMatrix of format kQ4_K) repacked into x16 tiles in memory allocated with
// `alloc`: format kQ4_KX16, the same rows / cols / row_bytes (a GGUF row's bytes), data the tiles
// (owned). Error(kInvalidArgument) for another format or cols not a multiple of 256.
KMatrix q4k_x16_matrix(const KMatrix& q4k, const AllocOptions& alloc);

// (Internal, for the x16 formats (Q4_K x16 and Q6_K x16, q6k_x16.h): a `format` matrix of rows x
// cols, row_bytes a GGUF row's bytes, owning memory from `alloc` for ceil(rows / 16) tiles of 16
// rows; *data is where they go.)
KMatrix x16_alloc(WFormat format, int64_t rows, int64_t cols, int64_t row_bytes,
                  const AllocOptions& alloc, uint8_t** data);

// kern::copy_submatrix for kQ4_KX16: rows [r0, r1) on tiles (r1 a multiple of 16 or rows), columns
// [c0, c1) on super-blocks (multiples of 256 or cols); each tile's slices are one copy.
KMatrix q4k_x16_copy_submatrix(const KMatrix& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                               const AllocOptions& alloc);

}  // namespace tandem::kern
