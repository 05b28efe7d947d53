#include "ops/cpu/q0_x4.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "formats/quant.h"
#include "ops/cpu/kern_gguf.h"
#include "ops/cpu/kernels.h"

namespace tandem::kern {

namespace {

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Quad k of blocks (4 * kBytes bytes at src) into x4 order at dst, or back (x4 -> blocks).
void q5_0_quad(const uint8_t* src, uint8_t* dst) {
  uint64_t lo = 0, hi = 0;
  for (int i = 0; i < 4; ++i) {
    const auto* b = reinterpret_cast<const BlockQ5_0*>(src) + i;
    std::memcpy(dst + 2 * i, &b->d, 2);
    const uint32_t qh = load_u32(b->qh);
    lo |= static_cast<uint64_t>(qh & 0xFFFF) << (16 * i);
    hi |= static_cast<uint64_t>(qh >> 16) << (16 * i);
    std::memcpy(dst + 24 + 16 * i, b->qs, 16);
  }
  std::memcpy(dst + 8, &lo, 8);
  std::memcpy(dst + 16, &hi, 8);
}
void q5_0_unquad(const uint8_t* src, uint8_t* dst) {
  uint64_t lo, hi;
  std::memcpy(&lo, src + 8, 8);
  std::memcpy(&hi, src + 16, 8);
  for (int i = 0; i < 4; ++i) {
    auto* b = reinterpret_cast<BlockQ5_0*>(dst) + i;
    std::memcpy(&b->d, src + 2 * i, 2);
    const uint32_t qh = static_cast<uint32_t>((lo >> (16 * i)) & 0xFFFF) |
                        static_cast<uint32_t>((hi >> (16 * i)) & 0xFFFF) << 16;
    std::memcpy(b->qh, &qh, 4);
    std::memcpy(b->qs, src + 24 + 16 * i, 16);
  }
}
void q8_0_quad(const uint8_t* src, uint8_t* dst) {
  for (int i = 0; i < 4; ++i) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(src) + i;
    std::memcpy(dst + 2 * i, &b->d, 2);
    for (int j = 0; j < 16; ++j) {
      dst[8 + 16 * i + j] = static_cast<uint8_t>(b->qs[j]) ^ 0x80;
      dst[72 + 16 * i + j] = static_cast<uint8_t>(b->qs[16 + j]) ^ 0x80;
    }
  }
}
void q8_0_unquad(const uint8_t* src, uint8_t* dst) {
  for (int i = 0; i < 4; ++i) {
    auto* b = reinterpret_cast<BlockQ8_0*>(dst) + i;
    std::memcpy(&b->d, src + 2 * i, 2);
    for (int j = 0; j < 16; ++j) {
      b->qs[j] = static_cast<int8_t>(src[8 + 16 * i + j] ^ 0x80);
      b->qs[16 + j] = static_cast<int8_t>(src[72 + 16 * i + j] ^ 0x80);
    }
  }
}

struct QuadFns {
  int64_t block_bytes;
  void (*to_x4)(const uint8_t*, uint8_t*);
  void (*from_x4)(const uint8_t*, uint8_t*);
};
QuadFns quad_fns(WFormat stored) {
  if (stored == WFormat::kQ5_0) return {sizeof(BlockQ5_0), q5_0_quad, q5_0_unquad};
  if (stored == WFormat::kQ8_0) return {sizeof(BlockQ8_0), q8_0_quad, q8_0_unquad};
  fail(ErrorKind::kInvalidArgument, "no x4 layout for {}", wformat_name(stored));
}

// Row of nb blocks: nb / 4 quads through fn, the rest copied.
void convert_row(const uint8_t* src, int64_t nb, uint8_t* dst, int64_t block_bytes,
                 void (*fn)(const uint8_t*, uint8_t*)) {
  const int64_t quad = 4 * block_bytes, quads = nb / 4;
  for (int64_t k = 0; k < quads; ++k) fn(src + k * quad, dst + k * quad);
  std::memcpy(dst + quads * quad, src + quads * quad, static_cast<size_t>(nb % 4 * block_bytes));
}

}  // namespace

bool q0_x4_format(WFormat stored, WFormat* x4) {
  if (stored == WFormat::kQ5_0) *x4 = WFormat::kQ5_0X4;
  else if (stored == WFormat::kQ8_0) *x4 = WFormat::kQ8_0X4;
  else return false;
  return true;
}

bool q0_x4_stored_format(WFormat x4, WFormat* stored) {
  if (x4 == WFormat::kQ5_0X4) *stored = WFormat::kQ5_0;
  else if (x4 == WFormat::kQ8_0X4) *stored = WFormat::kQ8_0;
  else return false;
  return true;
}

void q0_x4_repack_row(WFormat stored, const uint8_t* row, int64_t nb, uint8_t* out) {
  const QuadFns f = quad_fns(stored);
  convert_row(row, nb, out, f.block_bytes, f.to_x4);
}

void q0_x4_unpack_row(WFormat stored, const uint8_t* x4, int64_t nb, uint8_t* row) {
  const QuadFns f = quad_fns(stored);
  convert_row(x4, nb, row, f.block_bytes, f.from_x4);
}

bool q0_x4_native() {
  const CpuFeatures& f = cpu_features();
  return best_isa() >= Isa::kAvx512Vnni && f.avx512_vbmi && f.avx512_bitalg;
}

}  // namespace tandem::kern

namespace tandem::kern::detail {

void q0_x4_through_rows(const GemmArgs& g, int stored_format, GemmFn rows) {
  const auto stored = static_cast<WFormat>(stored_format);
  const int64_t nb = g.cols / kQK;
  constexpr int64_t kRows = 64;  // per unpacked batch: ~60 KiB for a 2048-wide Q5_0 row
  thread_local std::vector<uint8_t> buf;
  buf.resize(static_cast<size_t>(kRows * g.row_bytes));
  for (int64_t r0 = g.n0; r0 < g.n1; r0 += kRows) {
    const int64_t n = std::min(kRows, g.n1 - r0);
    for (int64_t r = 0; r < n; ++r) {
      q0_x4_unpack_row(stored, g.w + (r0 + r) * g.row_bytes, nb, buf.data() + r * g.row_bytes);
    }
    GemmArgs a = g;
    a.w = buf.data();
    a.n0 = 0;
    a.n1 = n;
    a.y = g.y + r0;  // row r of the batch is column r0 + r of y
    rows(a);
  }
}

}  // namespace tandem::kern::detail
