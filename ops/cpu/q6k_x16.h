// Q6_K rows interleaved 16 at a time ("Q6_K x16", kern::WFormat::kQ6_KX16), the layout
// `--cpu-experts repack` holds Q6_K matrices in on AVX-512 VNNI CPUs: Q4_K_M files store the
// lm_head and some layers' down projections (routed and shared experts) in Q6_K, whose one-token
// row kernel runs at about the DRAM's rate from cache (so below it from DRAM); the tile kernel
// puts a row in each lane and unpacks the 6-bit values without horizontal sums.
//
// Same bytes as the 16 GGUF rows it comes from (16 x 210 per super-block), rearranged. A tile of
// nb = cols / 256 super-blocks is nb headers of 288 bytes, then nb quant slices of 3072 bytes
// (with an even nb, e.g. 2048 columns, every 64-byte chunk on a 64-byte boundary when the tile
// is):
//   header b: bytes 16j + n = row n's scale of sub-block j (int8, j = 0..15), then at 256 + 2n
//             row n's d (F16);
//   slice b:  16 triples of 64-byte chunks; triple 8h + i (h = 0..1, i = 0..7) is, for row n at
//             bytes 4n .. 4n + 3 of each chunk, A = ql[64h + 4i ..], B = ql[64h + 32 + 4i ..],
//             Q = qh[32h + 4i ..] of its block b: A's low nibbles with Q's bits 0-1 are values
//             128h + 4i .. (sub-block 8h + i / 4), B's low nibbles with bits 2-3 values 128h + 32
//             + 4i .. (+2), A's high nibbles with bits 4-5 values 128h + 64 + 4i .. (+4), B's high
//             nibbles with bits 6-7 values 128h + 96 + 4i .. (+6).
// Per token and sub-block j an exact int32 dot of the unsigned 6-bit values (vpdpbusd, a row per
// lane), isum = sum_j sc_j * (dot_j - 32 * bsum_j) = the reference's sum of sc * (q - 32) * a, then
// acc + (da * d) * isum per super-block: bit-identical to kern::gemm on the rows.
#pragma once

#include <cstdint>

#include "core/cpu_features.h"
#include "core/memory.h"
#include "formats/quant.h"

namespace tandem::kern {

struct KMatrix;

constexpr int64_t kQ6KX16Rows = 16;

// Bytes of one tile of rows `cols` long (16 GGUF rows' bytes).
int64_t q6k_x16_tile_bytes(int64_t cols);

// Rows [0, rows) of a Q6_K matrix (row r at w + r * row_bytes; cols a positive multiple of 256)
// into ceil(rows / 16) tiles at out. A last tile's missing rows are zero blocks (d = 0).
void q6k_x16_repack(const uint8_t* w, int64_t row_bytes, int64_t rows, int64_t cols, uint8_t* out);

// The inverse for one tile: its 16 rows, row n at rows + n * row_bytes (row_bytes = cols / 256 *
// 210).
void q6k_x16_unpack(const uint8_t* tile, int64_t cols, uint8_t* rows);

// y[k * ldy + 16 t + n] = row n of tile t . token k's activations for t < n_tiles, k < tokens;
// token k's Q8_K row (nb = cols / 256 blocks) at act + k * act_row_bytes bytes. Up to four tokens
// per pass over a tile, each triple's operands formed once for them all (kern::gemm runs 1-31
// tokens so, more through each tile's rows unpacked into the tiled Q6_K GEMM); each token's
// arithmetic is the one-token kernel's (the same bits). AVX-512 VNNI (q6k_x16_vnni.cpp): call only
// where the CPU has it.
void q6k_x16_gemv_vnni(const uint8_t* tiles, int64_t n_tiles, int64_t nb, const BlockQ8_K* act,
                       float* y, int64_t tokens = 1, int64_t act_row_bytes = 0, int64_t ldy = 0);

// A Q6_K matrix (kern::KMatrix of format kQ6_K) repacked into x16 tiles in memory allocated with
// `alloc`: format kQ6_KX16, the same rows / cols / row_bytes (a GGUF row's bytes), data the tiles
// (owned). Error(kInvalidArgument) for another format or cols not a multiple of 256.
KMatrix q6k_x16_matrix(const KMatrix& q6k, const AllocOptions& alloc);

// kern::copy_submatrix for kQ6_KX16: rows [r0, r1) on tiles (r0 a multiple of 16), columns [c0,
// c1) on super-blocks (multiples of 256 or cols).
KMatrix q6k_x16_copy_submatrix(const KMatrix& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                               const AllocOptions& alloc);

}  // namespace tandem::kern
