// Q5_0 and Q8_0 rows with their blocks rearranged four at a time ("x4", kern::WFormat::kQ5_0X4 /
// kQ8_0X4), the layout `--cpu-experts repack` holds those matrices in where the CPU has AVX-512
// VBMI and BITALG: the GEMV reads a quad of blocks with plain loads instead of the byte permutes
// and bit shuffles the stored 22- / 34-byte blocks need (docs/cpu-kernels.md, "Repacked GGUF
// layouts").
//
// Row-local, the same bytes as the GGUF row it comes from (same row_bytes): a row of nb blocks is
// nb / 4 quads, then the last nb % 4 blocks as stored. Quad k (blocks 4k .. 4k + 3) is
//   Q5_0 (88 bytes): the four fp16 d (8 bytes); a 64-bit mask whose bit 16i + j is bit j of block
//        i's qh (the fifth bit of its value j); one whose bit 16i + j is bit 16 + j (value 16 + j);
//        the four 16-byte qs arrays, block i's at byte 16i (low nibbles values j, high 16 + j).
//   Q8_0 (136 bytes): the four fp16 d; the quants 0-15 of block i at byte 16i of 64 bytes, then
//        the quants 16-31 likewise, each stored as q + 128 (q XOR 0x80: the unsigned operand the
//        VNNI dot products read).
// The arithmetic is the stored format's: kern::gemm gives bit-identical results on both layouts.
#pragma once

#include <cstdint>

namespace tandem::kern {

enum class WFormat : uint8_t;
struct KMatrix;

// The x4 format of a stored one (kQ5_0 -> kQ5_0X4, kQ8_0 -> kQ8_0X4) and back; false where there
// is none.
bool q0_x4_format(WFormat stored, WFormat* x4);
bool q0_x4_stored_format(WFormat x4, WFormat* stored);

// One row of nb blocks of `stored` (kQ5_0 or kQ8_0) into the x4 layout, and the inverse.
void q0_x4_repack_row(WFormat stored, const uint8_t* row, int64_t nb, uint8_t* out);
void q0_x4_unpack_row(WFormat stored, const uint8_t* x4, int64_t nb, uint8_t* row);

// Whether this CPU runs the x4 kernels (AVX-512 VNNI + VBMI + BITALG); elsewhere kern::gemm
// unpacks the rows first, so repacking would only cost.
bool q0_x4_native();

}  // namespace tandem::kern
