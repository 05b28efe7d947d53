// The one INT8 / INT4 algorithm (and the BF16 tile and FP8 GEMM ones) of the packed formats,
// instantiated per ISA by packed_avx2.cpp, packed_avx512.cpp and packed_vnni.cpp through a traits
// class T (include this after the file's `#pragma GCC target`, and only in those files):
//   T::VI / T::VF       integer / float vector of kLanes 32-bit lanes (8: AVX2, 16: AVX-512)
//   T::kVecs            vectors per 64-byte chunk (16 rows / kLanes)
//   T::kMaxTokens       tokens computed together (accumulators kept in registers)
//   T::kTiles           16-row tiles computed together in the GEMM (1: AVX2, 16 registers)
//   T::kBiasedS8        the s8 x s8 dot adds 128 * sum(w) (VNNI u8 * s8 on a + 128)
//   bcast(bits)         4 activation bytes to every lane (VNNI INT8 reads the biased copy)
//   dot_s8(acc, w, a4)  acc + per lane sum of 4 products w * a (signed * signed)
//   dot_u4(acc, u, a4)  acc + per lane sum of 4 products u * a (u in 0..15 unsigned)
//   fp8_expand(src, pairs, dst)  16 FP8 rows into BF16 tile chunks (fp8_expand_lut's contract)
//   kFp8Step, F8, FA, FP, kFp8Scale, fp8_load(w), fp8_zero(), fp8_dot(part, f8, a),
//                       fp8_part(part), hsum_f(v): the FP8 row kernel's step (fp8_row_kernel; FA:
//                       the activations it reads, uint16_t = the BF16 row, float = the row's
//                       F32 copy at act_f32_offset; FP: a block's partial sums, fp8_part them
//                       as one vector; the weights come as kFp8Scale^-1 times their value)
//   WB / AB, bf16_w(chunk) / bf16_a_at(row, c, cols), bf16_dot(acc, wb, ab): a BF16 weight chunk
//                       and the broadcast activation pair c of a kBF16 row (its BF16 bits, or
//                       its F32 copy without a BF16 dot) as the ISA's dot wants them; acc +
//                       per lane w[2i] * a[0] + w[2i+1] * a[1] (exact products, F32 adds)
// Per 16-row tile and token: for each group, an exact int32 dot product per row, corrected,
// converted and accumulated as acc = fma(sa * s, float(dot), acc): bit-identical to the reference.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "ops/cpu/packed_kernels.h"

namespace tandem::kern::detail::packed_impl {

// GEMV steps (one tile, <= 2 tokens) prefetch this far ahead of the weight stream (tiles are
// contiguous): one core's hardware prefetchers alone leave a single stream short of bandwidth
// (as in kern_gguf_impl.h). INT4 and BF16 tiles 8 KiB ahead, INT8 and the FP8 rows 4 KiB: the
// distances at which the MoE layer's decode read DRAM fastest in same-minute A/Bs (2 KiB was
// slower for all, 12 and 16 KiB no better than 8, and INT8 gained nothing from 8). Into L2
// (locality 2: prefetcht1), as the GGUF kernels: the INT4 GEMV read 0.70 of DRAM prefetching into
// L1, 0.78-0.79 into L2 (docs/performance.md, D6).
constexpr int kPackedPrefetchBytes = 4096;
constexpr int kPackedPrefetchFar = 8192;
template <int NR, int NT, int kDistance = kPackedPrefetchBytes>
inline void gemv_prefetch(const uint8_t* p) {
  if constexpr (NR == 1 && NT <= 2) __builtin_prefetch(p + kDistance, 0, 2);
}

// The GEMM's next panel (the next step's tiles), prefetched into L2 while this step's token blocks
// run: each block takes a slice, spread evenly over its 64-byte chunks (`lines` per `chunks`).
// Without it the first token block of every step waits for DRAM (an expert's 48 tokens of a
// 512-token prefill are 12 blocks of 4, and their first one read the panel at one core's DRAM
// rate). Evenly, not a line per chunk from the block's start: those bursts (a third of a 48-token
// block's chunks) left the rest of the block without requests in flight.
struct PanelPrefetch {
  const uint8_t* p = nullptr;
  const uint8_t* end = nullptr;
  int64_t lines = 0, chunks = 1;
  int64_t credit = 0;  // lines * chunks stepped, less chunks per line issued
  void step(int n = 1) {
    credit += n * lines;
    for (; credit >= chunks && p < end; credit -= chunks, p += 64) __builtin_prefetch(p, 0, 2);
  }
};

// NR tiles (16 * NR rows) x NT tokens: each activation broadcast feeds NR tiles' dot products and
// each weight vector NT tokens' (the loads per dot product drop from (1 + NT) / NT to (NR + NT) /
// (NR * NT): one 512-bit vpdpbusd per load is the port limit otherwise).
// Groups [g0, g1) only, the accumulators read from `out` first where `load` (a K-blocked step:
// tiles_step); the accumulation order is the same either way.
template <class T, bool kInt4, int NT, int NR>
inline void int_tile(const uint8_t* const* tiles, const KMatrix& wm, const PackedGeometry& geo,
                     const uint8_t* const* arow, float (*out)[16 * NR], PanelPrefetch& pf,
                     int64_t g0, int64_t g1, bool load) {
  const int group = wm.group;
  const int64_t scales_offset = act_scales_offset(wm.cols);
  using VI = typename T::VI;
  using VF = typename T::VF;
  constexpr int V = T::kVecs;
  constexpr int W = V * NR;  // vectors of one chunk across the NR tiles
  VF facc[NT][W];
  for (int t = 0; t < NT; ++t) {
    for (int v = 0; v < W; ++v) facc[t][v] = load ? T::load_f(out[t] + v * T::kLanes) : T::zero_f();
  }
  // A GEMV step (one tile, <= 2 tokens) has one integer accumulator per token and group: its dot
  // products form one dependency chain, a vpdpbusd's latency per step. Four accumulators there
  // (INT8: chunks c % 4; INT4: low / high nibbles of even / odd chunks), added at the group's end:
  // integer sums, so the same result. The unroll pragma below keeps the chains in registers
  // (without it GCC 12 kept them in memory, a store-to-load forward per dot product).
  constexpr int IC = NR == 1 && NT <= 2 ? 4 : 1;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* block[NR];
    for (int r = 0; r < NR; ++r) block[r] = tiles[r] + g * geo.block_bytes;
    VI iacc[IC][NT][W];
    for (int j = 0; j < IC; ++j) {
      for (int t = 0; t < NT; ++t) {
        for (int v = 0; v < W; ++v) iacc[j][t][v] = T::zero_i();
      }
    }
    if constexpr (!kInt4 && T::kBiasedS8) {
      // The biased dot adds 128 * sum(w) per row: start the last chain at minus that, one negation
      // per row vector and group where a subtraction per token came after the chunks (an integer
      // sum: the same result).
      for (int r = 0; r < NR; ++r) {
        const int32_t* wsum = reinterpret_cast<const int32_t*>(block[r] + geo.values_bytes + 64);
        for (int v = 0; v < V; ++v) {
          const VI sum = T::load(reinterpret_cast<const uint8_t*>(wsum + v * T::kLanes));
          const VI neg = T::sub(T::zero_i(), T::shl7(sum));
          for (int t = 0; t < NT; ++t) iacc[IC - 1][t][r * V + v] = neg;
        }
      }
    }
    const int64_t k0 = g * group;
    if constexpr (!kInt4) {
      // VNNI reads q_a + 128 from the activation row's biased copy.
      const int64_t bias_off = T::kBiasedS8 ? act_biased_offset(geo.groups * group, geo.groups) : 0;
      for (int c0 = 0; c0 < group / 4; c0 += 4) {  // group / 4 is a multiple of 4
        pf.step(4);
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const int c = c0 + j;
          gemv_prefetch<NR, NT>(block[0] + c * 64);
          VI w[W];
          for (int r = 0; r < NR; ++r) {
            for (int v = 0; v < V; ++v) w[r * V + v] = T::load(block[r] + c * 64 + v * (64 / V));
          }
          for (int t = 0; t < NT; ++t) {
            int32_t bits;
            std::memcpy(&bits, arow[t] + bias_off + k0 + 4 * c, 4);
            const VI a = T::bcast(bits);
            for (int v = 0; v < W; ++v) iacc[j % IC][t][v] = T::dot_s8(iacc[j % IC][t][v], w[v], a);
          }
        }
      }
    } else {
      const int half = group / 8;
      // Chunk c's low nibbles into acc_lo, its high ones into acc_hi.
      auto chunk = [&](int c, VI (&acc_lo)[NT][W], VI (&acc_hi)[NT][W])
                       __attribute__((always_inline)) {
        gemv_prefetch<NR, NT, kPackedPrefetchFar>(block[0] + c * 64);
        VI lo[W], hi[W];
        for (int r = 0; r < NR; ++r) {
          for (int v = 0; v < V; ++v) {
            const VI b = T::load(block[r] + c * 64 + v * (64 / V));
            lo[r * V + v] = T::low_nibbles(b);
            hi[r * V + v] = T::high_nibbles(b);
          }
        }
        for (int t = 0; t < NT; ++t) {
          int32_t bl, bh;
          std::memcpy(&bl, arow[t] + k0 + 4 * c, 4);
          std::memcpy(&bh, arow[t] + k0 + 4 * (c + half), 4);
          const VI al = T::bcast(bl), ah = T::bcast(bh);
          for (int v = 0; v < W; ++v) {
            acc_lo[t][v] = T::dot_u4(acc_lo[t][v], lo[v], al);
            acc_hi[t][v] = T::dot_u4(acc_hi[t][v], hi[v], ah);
          }
        }
      };
      // Four chunks per panel prefetch step, straight-line (as INT8's loop above).
      for (int c0 = 0; c0 < half; c0 += 4) {  // half = group / 8 is a multiple of 4
        pf.step(4);
        if constexpr (IC == 4) {
          chunk(c0, iacc[0], iacc[1]);
          chunk(c0 + 1, iacc[2], iacc[3]);
          chunk(c0 + 2, iacc[0], iacc[1]);
          chunk(c0 + 3, iacc[2], iacc[3]);
        } else {
#pragma GCC unroll 4
          for (int j = 0; j < 4; ++j) chunk(c0 + j, iacc[0], iacc[IC - 1]);
        }
      }
      // Nibbles are q + 8: subtract 8 * sum(q_a) of the token's group.
      for (int t = 0; t < NT; ++t) {
        int32_t asum;
        std::memcpy(&asum, arow[t] + scales_offset + (geo.groups + g) * 4, 4);
        const VI corr = T::bcast(asum * 8);
        for (int v = 0; v < W; ++v) iacc[IC - 1][t][v] = T::sub(iacc[IC - 1][t][v], corr);
      }
    }
    for (int j = 1; j < IC; ++j) {
      for (int t = 0; t < NT; ++t) {
        for (int v = 0; v < W; ++v) iacc[0][t][v] = T::add_i(iacc[0][t][v], iacc[j][t][v]);
      }
    }
    for (int t = 0; t < NT; ++t) {
      float sa;
      std::memcpy(&sa, arow[t] + scales_offset + g * 4, 4);
      const VF sav = T::set1_f(sa);
      for (int r = 0; r < NR; ++r) {
        const float* sw = reinterpret_cast<const float*>(block[r] + geo.values_bytes);
        for (int v = 0; v < V; ++v) {
          const VF sc = T::mul_f(sav, T::load_f(sw + v * T::kLanes));
          facc[t][r * V + v] = T::fmadd_f(sc, T::cvt_f(iacc[0][t][r * V + v]), facc[t][r * V + v]);
        }
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    for (int v = 0; v < W; ++v) T::store_f(out[t] + v * T::kLanes, facc[t][v]);
  }
}

// kBF16Tile: NR tiles x NT tokens, F32 accumulators over the whole row (no groups, no scales):
// per 64-byte chunk (16 rows x one k pair) one BF16 dot per token against the broadcast pair.
// Chunks [c0, c1) only, the accumulators read from `out` first where `load` (as int_tile).
template <class T, int NT, int NR>
inline void bf16_tile(const uint8_t* const* tiles, const KMatrix& wm, const PackedGeometry& geo,
                      const uint8_t* const* arow, float (*out)[16 * NR], PanelPrefetch& pf,
                      int64_t c0, int64_t c1, bool load) {
  using VF = typename T::VF;
  constexpr int V = T::kVecs;
  constexpr int W = V * NR;
  VF acc[NT][W];
  for (int t = 0; t < NT; ++t) {
    for (int v = 0; v < W; ++v) acc[t][v] = load ? T::load_f(out[t] + v * T::kLanes) : T::zero_f();
  }
  (void)wm;
  (void)geo;
  for (int64_t c = c0; c < c1; ++c) {
    gemv_prefetch<NR, NT, kPackedPrefetchFar>(tiles[0] + c * 64);
    pf.step();
    typename T::WB w[W];
    for (int r = 0; r < NR; ++r) {
      for (int v = 0; v < V; ++v)
        w[r * V + v] = T::bf16_w(T::load(tiles[r] + c * 64 + v * (64 / V)));
    }
    for (int t = 0; t < NT; ++t) {
      const typename T::AB a = T::bf16_a_at(arow[t], c, wm.cols);
      for (int v = 0; v < W; ++v) acc[t][v] = T::bf16_dot(acc[t][v], w[v], a);
    }
  }
  for (int t = 0; t < NT; ++t) {
    for (int v = 0; v < W; ++v) T::store_f(out[t] + v * T::kLanes, acc[t][v]);
  }
}

// The tile computations as types (Op::run<T, NT, NR>) for the driver below, over units [u0, u1)
// of the row (INT8 / INT4: groups; BF16: k pairs). kblock(): the units of one K-block of the
// GEMM (tiles_step), 32 KiB of a 4-tile panel's values: INT8 512 columns, INT4 1024; BF16 the
// whole row (K-blocks of 16 and 32 KiB measured no faster for it). 32 KiB: the size at which the
// INT8 / INT4 MoE prefill layer ran fastest against whole-row passes and 16 KiB K-blocks
// (bench_moe_layer_bench, of_peak in same-minute rounds).
constexpr int64_t kKBlockBytes = 32768;
template <bool kInt4>
struct IntOp {
  template <class T, int NT, int NR>
  static void run(const uint8_t* const* tiles, const KMatrix& w, const PackedGeometry& geo,
                  const uint8_t* const* arow, float (*out)[16 * NR], PanelPrefetch& pf,
                  int64_t u0, int64_t u1, bool load) {
    int_tile<T, kInt4, NT, NR>(tiles, w, geo, arow, out, pf, u0, u1, load);
  }
  static int64_t kblock(const KMatrix& w) {
    const int64_t cols = kKBlockBytes / 64 * (kInt4 ? 2 : 1);
    return std::max<int64_t>(1, cols / w.group);
  }
};
struct Bf16Op {
  template <class T, int NT, int NR>
  static void run(const uint8_t* const* tiles, const KMatrix& w, const PackedGeometry& geo,
                  const uint8_t* const* arow, float (*out)[16 * NR], PanelPrefetch& pf,
                  int64_t u0, int64_t u1, bool load) {
    bf16_tile<T, NT, NR>(tiles, w, geo, arow, out, pf, u0, u1, load);
  }
  static int64_t kblock(const KMatrix& w) { return w.cols / 2; }  // k pairs: the whole row
};

// NR tiles starting at `tile` for every token of a, in blocks of up to T::kMaxTokens; the tiles
// [next, next_end) are prefetched meanwhile (PanelPrefetch; none for a GEMV step).
// K-blocked (more than one token block): for each K-block of the panel (Op::kblock: 32 KiB of the
// NR = 4 tiles' values), every token block of up to kSuperBlocks, the accumulators kept in `acc`
// between K-blocks: the token blocks reuse the K-block from L1 / near L2, where a whole-row pass
// per token block would read the panel (136 KiB of INT8 at 2048 columns) from L2 once per block,
// the part of the step a neighbour sharing the core's L2 slows most. Same accumulation order, so
// the same bits.
template <class T, class Op, int NR>
void tiles_step(const KMatrix& w, const Activations& a, const PackedGeometry& geo, int64_t tile,
                int64_t n0, int64_t n1, float* y, int64_t ldy, int64_t next, int64_t next_end) {
  constexpr int kSuperBlocks = 16;
  alignas(64) float acc[kSuperBlocks][T::kMaxTokens][16 * NR];
  const uint8_t* arow[T::kMaxTokens];
  const uint8_t* tp[NR];
  for (int r = 0; r < NR; ++r) tp[r] = w.data + (tile + r) * geo.tile_bytes;
  const int64_t r0 = tile * 16 > n0 ? tile * 16 : n0;
  const int64_t r1 = tile * 16 + 16 * NR < n1 ? tile * 16 + 16 * NR : n1;
  const int64_t blocks = (a.tokens + T::kMaxTokens - 1) / T::kMaxTokens;
  const bool gemv = NR == 1 && a.tokens <= 2;
  const int64_t lines = gemv || next >= next_end ? 0 : (next_end - next) * geo.tile_bytes / 64;
  // The 64-byte chunks of one tile a call steps through (INT8: 4 columns, INT4: 8, BF16: 2).
  const int64_t chunks = std::max<int64_t>(geo.groups * geo.values_bytes / 64, 1);
  const uint8_t* pf_base = w.data + next * geo.tile_bytes;
  const int64_t units = geo.groups;
  auto run = [&](int nt, float (*out)[16 * NR], PanelPrefetch& pf, int64_t u0, int64_t u1,
                 bool load) {
    switch (nt) {
#define TD_PACKED_CASE(N)                                                     \
  case N:                                                                     \
    if constexpr (N <= T::kMaxTokens) {                                       \
      Op::template run<T, N, NR>(tp, w, geo, arow, out, pf, u0, u1, load); \
    }                                                                         \
    break;
      TD_PACKED_CASE(1)
      TD_PACKED_CASE(2)
      TD_PACKED_CASE(3)
      TD_PACKED_CASE(4)
      TD_PACKED_CASE(5)
      TD_PACKED_CASE(6)
      TD_PACKED_CASE(7)
      TD_PACKED_CASE(8)
#undef TD_PACKED_CASE
      default:
        break;
    }
  };
  auto block_tokens = [&](int64_t b) {
    const int64_t t0 = b * T::kMaxTokens;
    const int nt = static_cast<int>(a.tokens - t0 < T::kMaxTokens ? a.tokens - t0 : T::kMaxTokens);
    for (int t = 0; t < nt; ++t) arow[t] = a.row(t0 + t);
    return nt;
  };
  // Whole tiles by vector loads and stores (as a plain loop GCC made each token's 64-256 bytes a
  // memmove call: 4-5% of an INT8 MoE prefill layer under perf), a partial edge row by row.
  const bool whole = r0 == tile * 16 && r1 == tile * 16 + 16 * NR;
  auto store = [&](int64_t b, int nt, float (*out)[16 * NR]) {
    for (int t = 0; t < nt; ++t) {
      float* yt = y + (b * T::kMaxTokens + t) * ldy;
      if (whole) {
        for (int v = 0; v < 16 * NR / T::kLanes; ++v) {
          T::store_f(yt + r0 + v * T::kLanes, T::load_f(out[t] + v * T::kLanes));
        }
      } else {
        for (int64_t r = r0; r < r1; ++r) yt[r] = out[t][r - tile * 16];
      }
    }
  };
  if (!gemv && blocks > 1) {
    // One prefetch stream over the whole step: `lines` spread over blocks * chunks.
    PanelPrefetch pf;
    pf.lines = lines;
    pf.chunks = blocks * chunks;
    pf.p = pf_base;
    pf.end = pf_base + lines * 64;
    const int64_t kb = Op::kblock(w);
    for (int64_t sb = 0; sb < blocks; sb += kSuperBlocks) {
      const int64_t sb_end = std::min(blocks, sb + kSuperBlocks);
      for (int64_t u0 = 0; u0 < units; u0 += kb) {
        const int64_t u1 = std::min(units, u0 + kb);
        for (int64_t b = sb; b < sb_end; ++b) run(block_tokens(b), acc[b - sb], pf, u0, u1, u0 > 0);
      }
      for (int64_t b = sb; b < sb_end; ++b) store(b, block_tokens(b), acc[b - sb]);
    }
    return;
  }
  const int64_t block_lines = (lines + blocks - 1) / blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    const int nt = block_tokens(b);
    PanelPrefetch pf;
    pf.lines = block_lines;
    pf.chunks = chunks;
    if (lines > 0) {
      pf.p = pf_base + b * block_lines * 64;
      pf.end = pf_base + std::min(lines, (b + 1) * block_lines) * 64;
    }
    run(nt, acc[0], pf, 0, units, false);
    store(b, nt, acc[0]);
  }
}

// GEMV (few tokens) reads one tile at a time: one weight stream per thread is what the hardware
// prefetchers follow best. GEMM takes T::kTiles tiles per step (then 2, then 1 for the rest).
template <class T, class Op>
void tiled_kernel(const PackedArgs& p) {
  const KMatrix& w = *p.w;
  const PackedGeometry geo = packed_geometry(w.format, w.cols, w.group);
  const int64_t tile0 = p.n0 / 16, tile1 = (p.n1 + 15) / 16;
  int64_t tile = tile0;
  // Each step prefetches up to as many tiles as it computes, following it (within the call).
  auto step = [&](auto nr) {
    constexpr int NR = decltype(nr)::value;
    const int64_t next = tile + NR, next_end = std::min(tile1, next + NR);
    tiles_step<T, Op, NR>(w, *p.a, geo, tile, p.n0, p.n1, p.y, p.ldy, next, next_end);
    tile += NR;
  };
  if (T::kTiles > 1 && p.a->tokens > T::kMaxTokens / 2) {
    while (tile + T::kTiles <= tile1) step(std::integral_constant<int, T::kTiles>());
    if constexpr (T::kTiles > 2) {
      while (tile + 2 <= tile1) step(std::integral_constant<int, 2>());
    }
  }
  while (tile < tile1) step(std::integral_constant<int, 1>());
}

// FP8Block GEMM (many tokens; OSDI'26 §3.4 "expand FP8 to BF16, BF16 dot, post-scale once per
// block"): NR 16-row tiles of the row-major FP8 matrix are expanded, a chunk of whole scale blocks
// at a time, into the kBF16Tile layout (exact: every E4M3 value is a BF16 value) and multiplied
// like BF16 tiles; each scale block's partial sums are post-scaled once per row lane,
// acc = fma(scale, part, acc), as the reference does per block. The expansion is paid once per
// tile and chunk for all tokens. acc_io: NT rows of 16 * NR F32 accumulators, updated in place.
// arow: the tokens' activation rows (cols values); the chunk is their k pairs [c0, c0 + pairs).
template <class T, int NT, int NR>
inline void fp8_tile_chunk(const uint16_t* buf, int64_t pairs, const float* scales, int64_t blocks,
                           int64_t block_pairs, const uint8_t* const* arow, int64_t c0,
                           int64_t cols, float* acc_io, int64_t acc_stride) {
  using VF = typename T::VF;
  constexpr int V = T::kVecs;
  constexpr int W = V * NR;
  for (int64_t b = 0; b < blocks; ++b) {
    VF part[NT][W];
    for (int t = 0; t < NT; ++t) {
      for (int v = 0; v < W; ++v) part[t][v] = T::zero_f();
    }
    const int64_t c1 = (b + 1) * block_pairs < pairs ? (b + 1) * block_pairs : pairs;
    for (int64_t c = b * block_pairs; c < c1; ++c) {
      typename T::WB w[W];
      for (int r = 0; r < NR; ++r) {
        const auto* chunk = reinterpret_cast<const uint8_t*>(buf + (r * pairs + c) * 32);
        for (int v = 0; v < V; ++v) w[r * V + v] = T::bf16_w(T::load(chunk + v * (64 / V)));
      }
      for (int t = 0; t < NT; ++t) {
        const typename T::AB a = T::bf16_a_at(arow[t], c0 + c, cols);
        for (int v = 0; v < W; ++v) part[t][v] = T::bf16_dot(part[t][v], w[v], a);
      }
    }
    for (int t = 0; t < NT; ++t) {
      float* acc = acc_io + t * acc_stride;
      for (int r = 0; r < NR; ++r) {
        for (int v = 0; v < V; ++v) {
          const int64_t lane = r * 16 + v * T::kLanes;
          const VF s = T::load_f(scales + (r * blocks + b) * 16 + v * T::kLanes);
          T::store_f(acc + lane, T::fmadd_f(s, part[t][r * V + v], T::load_f(acc + lane)));
        }
      }
    }
  }
}

// 16 FP8 rows (src[i] == nullptr: a zero padding row) x 2 * pairs columns into one BF16 tile's
// chunks (dst[c * 32 + 2 i + j] = bf16(row i, column 2c + j)) through the exact E4M3 -> BF16 table.
// The ISAs without a faster transposition (T::fp8_expand) use this.
inline void fp8_expand_lut(const uint8_t* const* src, int64_t pairs, uint16_t* dst) {
  const uint16_t* lut = fp8_bf16_table();
  for (int i = 0; i < 16; ++i) {
    uint16_t* d = dst + i * 2;
    if (src[i] == nullptr) {
      for (int64_t c = 0; c < pairs; ++c) d[c * 32] = d[c * 32 + 1] = 0;
      continue;
    }
    for (int64_t c = 0; c < pairs; ++c) {
      d[c * 32] = lut[src[i][2 * c]];
      d[c * 32 + 1] = lut[src[i][2 * c + 1]];
    }
  }
}

// Rows [n, n + 16 * NR) ∩ [p.n0, p.n1) of an FP8Block matrix for every token (fp8_tile_chunk).
// Needs cols and block_cols multiples of 32 (packed_gemm checks).
template <class T, int NR>
void fp8_rows(const PackedArgs& p, int64_t n) {
  const KMatrix& w = *p.w;
  const Activations& a = *p.a;
  const int64_t n_end = n + 16 * NR < p.n1 ? n + 16 * NR : p.n1;
  // Chunks of whole scale blocks, ~512 columns: NR x 16 x 512 BF16 = 16 KiB per tile.
  const int64_t chunk_cols = w.block_cols >= 512 ? w.block_cols : 512 / w.block_cols * w.block_cols;
  const int64_t max_blocks = (chunk_cols + w.block_cols - 1) / w.block_cols;
  thread_local std::vector<uint16_t> buf;
  thread_local std::vector<float> scales, acc;
  buf.resize(static_cast<size_t>(NR * 16 * chunk_cols));
  scales.resize(static_cast<size_t>(NR * max_blocks * 16));
  const int64_t acc_stride = 16 * NR;
  acc.assign(static_cast<size_t>(a.tokens * acc_stride), 0.0f);
  for (int64_t k0 = 0; k0 < w.cols; k0 += chunk_cols) {
    const int64_t k1 = k0 + chunk_cols < w.cols ? k0 + chunk_cols : w.cols;
    const int64_t pairs = (k1 - k0) / 2;
    const int64_t blocks = (k1 - k0 + w.block_cols - 1) / w.block_cols;
    for (int r = 0; r < NR; ++r) {
      const uint8_t* src[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t row = n + r * 16 + i;
        float* sc = scales.data() + r * blocks * 16 + i;
        if (row >= n_end) {
          src[i] = nullptr;
          for (int64_t b = 0; b < blocks; ++b) sc[b * 16] = 0.0f;
          continue;
        }
        src[i] = w.data + row * w.row_bytes + k0;
        const float* srow = w.scales + ((w.row0 + row) / w.block_rows) * w.scale_stride;
        for (int64_t b = 0; b < blocks; ++b) sc[b * 16] = srow[k0 / w.block_cols + b];
      }
      T::fp8_expand(src, pairs, buf.data() + r * pairs * 32);
    }
    const uint8_t* arow[T::kMaxTokens];
    for (int64_t t0 = 0; t0 < a.tokens; t0 += T::kMaxTokens) {
      const int nt =
          static_cast<int>(a.tokens - t0 < T::kMaxTokens ? a.tokens - t0 : T::kMaxTokens);
      for (int t = 0; t < nt; ++t) arow[t] = a.row(t0 + t);
      float* acc_t = acc.data() + t0 * acc_stride;
      switch (nt) {
#define TD_FP8_CASE(N)                                                                           \
  case N:                                                                                        \
    if constexpr (N <= T::kMaxTokens) {                                                          \
      fp8_tile_chunk<T, N, NR>(buf.data(), pairs, scales.data(), blocks, w.block_cols / 2, arow, \
                               k0 / 2, w.cols, acc_t, acc_stride);                              \
    }                                                                                            \
    break;
        TD_FP8_CASE(1)
        TD_FP8_CASE(2)
        TD_FP8_CASE(3)
        TD_FP8_CASE(4)
        TD_FP8_CASE(5)
        TD_FP8_CASE(6)
        TD_FP8_CASE(7)
        TD_FP8_CASE(8)
#undef TD_FP8_CASE
        default:
          break;
      }
    }
  }
  for (int64_t t = 0; t < a.tokens; ++t) {
    for (int64_t r = n; r < n_end; ++r) p.y[t * p.ldy + r] = acc[t * acc_stride + (r - n)];
  }
}

// FP8Block with few tokens (the GEMV): per row and scale block, T::kFp8Step columns at a time
// (T::fp8_load expands the weights once for up to 4 tokens, T::fp8_dot multiplies into F32 lanes),
// post-scaled in the lanes, acc = fma(scale, part, acc), one reduction per row and token at the
// end; the row stream is prefetched kPackedPrefetchBytes ahead.
template <class T, int NT>
inline void fp8_row(const KMatrix& w, const uint8_t* wr, const float* srow,
                    const typename T::FA* const* ar, float* out) {
  using VF = typename T::VF;
  VF acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = T::zero_f();
  int64_t bi = 0;  // the scale block's index (a division per block measured ~20% of the loop)
  for (int64_t b0 = 0; b0 < w.cols; b0 += w.block_cols, ++bi) {
    const int64_t b1 = b0 + w.block_cols < w.cols ? b0 + w.block_cols : w.cols;
    typename T::FP part[NT];
    for (int t = 0; t < NT; ++t) part[t] = T::fp8_zero();
    for (int64_t k = b0; k < b1; k += T::kFp8Step) {
      if (k % 64 == 0) __builtin_prefetch(wr + k + kPackedPrefetchBytes, 0, 3);
      const typename T::F8 wv = T::fp8_load(wr + k);
      for (int t = 0; t < NT; ++t) part[t] = T::fp8_dot(part[t], wv, ar[t] + k);
    }
    // (kFp8Scale is a power of two: the scale times it is exact, and so is the product.)
    const VF sv = T::set1_f(srow[bi] * T::kFp8Scale);
    for (int t = 0; t < NT; ++t) acc[t] = T::fmadd_f(sv, T::fp8_part(part[t]), acc[t]);
  }
  for (int t = 0; t < NT; ++t) out[t] = T::hsum_f(acc[t]);
}

template <class T>
void fp8_row_kernel(const PackedArgs& p) {
  using FA = typename T::FA;
  const KMatrix& w = *p.w;
  const Activations& a = *p.a;
  // Without a BF16 dot product the activations are read as F32 (exact), from the copy every kBF16
  // row carries (act_f32_offset): the step is then the E4M3 widening and one FMA reading memory.
  auto act = [&](int64_t t) {
    if constexpr (std::is_same_v<FA, float>) {
      return reinterpret_cast<const FA*>(a.row(t) + act_f32_offset(a.cols));
    } else {
      return reinterpret_cast<const FA*>(a.row(t));
    }
  };
  for (int64_t n = p.n0; n < p.n1; ++n) {
    const uint8_t* wr = w.data + n * w.row_bytes;
    const float* srow = w.scales + ((w.row0 + n) / w.block_rows) * w.scale_stride;
    for (int64_t t0 = 0; t0 < a.tokens; t0 += 4) {
      const int nt = static_cast<int>(a.tokens - t0 < 4 ? a.tokens - t0 : 4);
      const FA* ar[4];
      for (int t = 0; t < nt; ++t) ar[t] = act(t0 + t);
      float out[4];
      // Token counts as template arguments: the accumulators stay in registers.
      if (nt == 1) fp8_row<T, 1>(w, wr, srow, ar, out);
      if (nt == 2) fp8_row<T, 2>(w, wr, srow, ar, out);
      if (nt == 3) fp8_row<T, 3>(w, wr, srow, ar, out);
      if (nt == 4) fp8_row<T, 4>(w, wr, srow, ar, out);
      for (int t = 0; t < nt; ++t) p.y[(t0 + t) * p.ldy + n] = out[t];
    }
  }
}

template <class T>
void fp8_gemm(const PackedArgs& p) {
  int64_t n = p.n0;
  for (; n + 16 * T::kTiles <= p.n1; n += 16 * T::kTiles) fp8_rows<T, T::kTiles>(p, n);
  if constexpr (T::kTiles > 2) {
    for (; n + 32 <= p.n1; n += 32) fp8_rows<T, 2>(p, n);
  }
  for (; n < p.n1; n += 16) fp8_rows<T, 1>(p, n);
}

template <class T, bool kInt4>
void int_kernel(const PackedArgs& p) {
  tiled_kernel<T, IntOp<kInt4>>(p);
}
template <class T>
void bf16_kernel(const PackedArgs& p) {
  tiled_kernel<T, Bf16Op>(p);
}

}  // namespace tandem::kern::detail::packed_impl
