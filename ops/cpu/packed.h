// Tandem's packed weight formats for routed experts repacked at load (KTransformers §3.2): INT8 and
// INT4 symmetric group-wise quantization in a tile layout that a GEMV streams linearly and a VNNI /
// AMX dot product consumes without shuffles, plus block-scaled FP8 (stored E4M3 + scale_inv, OSDI'26
// §3.4: expanded to BF16 in registers, post-scaled once per 128-column block).
//
// INT8 / INT4 layout (docs/cpu-kernels.md, "Packed formats"): rows are grouped in tiles of
// kPackTileRows = 16 (the last tile zero-padded). A tile is G = cols / group group blocks, in column
// order; one group block is
//   values: group / 4 chunks of 64 bytes; chunk c holds, for row n = 0..15, the 4 values
//           w[n][g*group + 4c .. 4c+3] at bytes 4n..4n+3 (INT8: int8 q in [-127, 127]).
//           INT4 stores the same chunks two per 64 bytes: packed chunk j's low nibbles are chunk j,
//           its high nibbles chunk j + group / 8, each nibble q + 8 (q in [-7, 7]).
//   scales: 16 F32, s[n] = amax(row n over the group) / 127 (INT8) or / 7 (INT4); 1 when all zero.
//   wsum:   16 int32, sum of row n's q over the group (INT8 only: the u8*s8 VNNI compensation).
// This 16 rows x 4 columns chunk is one 64-byte row of an AMX B tile and one zmm of vpdpbusd: the
// dot product of 16 rows with 4 activation bytes (broadcast) is one instruction, no reduction.
//
// kI8 activations (per token row, row_bytes rounded up to 64): cols int8 q (per-group scale
// sa[g] = amax / 127 over the token's group g), then G F32 sa[g], then G int32 sum of q over group
// g (the INT4 compensation: nibbles are q + 8), then 64-byte aligned cols bytes q + 128 (q ^ 0x80:
// VNNI's unsigned operand for INT8, compensated by the weights' sums). For either format, exactly:
//   y[t][n] = sum over g, in order, of (sa[g] * s[n][g]) * float(sum_k q_a[k] * q_w[n][k]).
//
// BF16 (kBF16Tile, `--cpu-experts bf16`): the same 16-row tiles, a tile being cols / 2 chunks of
// 64 bytes, chunk c holding for row n the BF16 pair w[n][2c], w[n][2c+1] at bytes 4n..4n+3 (no
// scales; cols even). One chunk is one zmm operand of vdpbf16ps against a broadcast activation
// pair (kBF16 activation rows: BF16 round-to-nearest-even of the F32 values), 16 rows' dot products
// with no reduction, and one line of an AMX-BF16 B tile. y = the F32 sum over k of the exact
// products bf16(w) * bf16(a). pack_weight(kBF16) still writes plain row-major BF16 rows (the
// kern::gemm BF16 kernel's layout, F32 activations). FP8Block: a zero-copy view (KMatrix fields as
// in kernels.h) with kBF16 activations.
#pragma once

#include <cstdint>
#include <memory>

#include "ops/cpu/kernels.h"

namespace tandem::kern {

constexpr int64_t kPackTileRows = 16;

// The 16-row tile layouts: kInt8, kInt4, kBF16Tile.
inline bool packed_tiled(WFormat f) {
  return f == WFormat::kInt8 || f == WFormat::kInt4 || f == WFormat::kBF16Tile;
}

// kBF16, kI8; pool and isa as kern::quantize_activations (every level gives the same bytes).
void packed_quantize_activations(AFormat f, int group, const float* x, int64_t tokens, int64_t cols,
                                 int64_t ldx, Activations* out, ThreadPool* pool = nullptr,
                                 Isa isa = best_isa());
void packed_gemm(const KMatrix& w, const Activations& a, int64_t n0, int64_t n1, float* y,
                 int64_t ldy, Isa isa);
void packed_gemm_reference(const KMatrix& w, const Activations& a, int64_t n0, int64_t n1, float* y,
                           int64_t ldy);
int64_t packed_row_align(const KMatrix& w);
// Quantize / convert any ops::Weight (F32, F16, BF16, FP8 with scales, GGUF blocks) to kInt8 / kInt4
// (symmetric, group-wise), kBF16Tile or kBF16 rows in tandem's packed layout (group: INT only).
// Deterministic (same bytes every time).
KMatrix pack_weight(const ops::Weight& w, WFormat target, int group, ThreadPool* pool);
uint64_t packed_bytes(WFormat target, int64_t rows, int64_t cols, int group);
// pack_weight into caller memory of packed_bytes() bytes (a cache file mapped for writing).
void pack_weight_into(const ops::Weight& w, WFormat target, int group, uint8_t* out,
                      ThreadPool* pool);
// The same packed matrix over caller-owned bytes (a mapped cache file): no copy.
KMatrix packed_view(WFormat target, int64_t rows, int64_t cols, int group, const uint8_t* bytes,
                    std::shared_ptr<const void> owner);

// copy_submatrix (kernels.h) for the tiled formats: whole 16-row tiles, whole groups / k pairs.
KMatrix packed_copy_submatrix(const KMatrix& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                              const AllocOptions& alloc);
// A zero-copy FP8Block view of an FP8 weight with block scales (false for anything else).
bool fp8_view(const ops::Weight& w, KMatrix* out);
// Bytes of one 16-row tile of a packed INT8 / INT4 / BF16-tile matrix (its row_bytes is this / 16).
int64_t packed_tile_bytes(WFormat target, int64_t cols, int group);
// The packed formats' group-quantized value of w[n][k] (tests: pack error against the source).
float packed_value(const KMatrix& w, int64_t n, int64_t k);

}  // namespace tandem::kern
