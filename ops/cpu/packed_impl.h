// The one INT8 / INT4 algorithm of the packed formats, instantiated per ISA by packed_avx2.cpp,
// packed_avx512.cpp and packed_vnni.cpp through a traits class T (include this after the file's
// `#pragma GCC target`, and only in those files):
//   T::VI / T::VF       integer / float vector of kLanes 32-bit lanes (8: AVX2, 16: AVX-512)
//   T::kVecs            vectors per 64-byte chunk (16 rows / kLanes)
//   T::kMaxTokens       tokens computed together (accumulators kept in registers)
//   T::kBiasedS8        the s8 x s8 dot adds 128 * sum(w) (VNNI u8 * s8 on a + 128)
//   bcast(bits)         4 activation bytes to every lane (VNNI INT8 reads the biased copy)
//   dot_s8(acc, w, a4)  acc + per lane sum of 4 products w * a (signed * signed)
//   dot_u4(acc, u, a4)  acc + per lane sum of 4 products u * a (u in 0..15 unsigned)
// Per 16-row tile and token: for each group, an exact int32 dot product per row, corrected,
// converted and accumulated as acc = fma(sa * s, float(dot), acc): bit-identical to the reference.
#pragma once

#include <cstdint>
#include <cstring>

#include "ops/cpu/packed_kernels.h"

namespace tandem::kern::detail::packed_impl {

template <class T, bool kInt4, int NT>
inline void int_tile(const uint8_t* tile, const PackedGeometry& geo, int group,
                     const uint8_t* const* arow, int64_t scales_offset, float (*out)[16]) {
  using VI = typename T::VI;
  using VF = typename T::VF;
  constexpr int V = T::kVecs;
  VF facc[NT][V];
  for (int t = 0; t < NT; ++t) {
    for (int v = 0; v < V; ++v) facc[t][v] = T::zero_f();
  }
  for (int64_t g = 0; g < geo.groups; ++g) {
    const uint8_t* block = tile + g * geo.block_bytes;
    VI iacc[NT][V];
    for (int t = 0; t < NT; ++t) {
      for (int v = 0; v < V; ++v) iacc[t][v] = T::zero_i();
    }
    const int64_t k0 = g * group;
    if constexpr (!kInt4) {
      // VNNI reads q_a + 128 from the activation row's biased copy.
      const int64_t bias_off =
          T::kBiasedS8 ? act_biased_offset(geo.groups * group, geo.groups) : 0;
      for (int c = 0; c < group / 4; ++c) {
        VI w[V];
        for (int v = 0; v < V; ++v) w[v] = T::load(block + c * 64 + v * (64 / V));
        for (int t = 0; t < NT; ++t) {
          int32_t bits;
          std::memcpy(&bits, arow[t] + bias_off + k0 + 4 * c, 4);
          const VI a = T::bcast(bits);
          for (int v = 0; v < V; ++v) iacc[t][v] = T::dot_s8(iacc[t][v], w[v], a);
        }
      }
      if constexpr (T::kBiasedS8) {
        const int32_t* wsum = reinterpret_cast<const int32_t*>(block + geo.values_bytes + 64);
        for (int v = 0; v < V; ++v) {
          const VI corr = T::shl7(T::load(reinterpret_cast<const uint8_t*>(wsum + v * T::kLanes)));
          for (int t = 0; t < NT; ++t) iacc[t][v] = T::sub(iacc[t][v], corr);
        }
      }
    } else {
      const int half = group / 8;
      for (int c = 0; c < half; ++c) {
        VI lo[V], hi[V];
        for (int v = 0; v < V; ++v) {
          const VI b = T::load(block + c * 64 + v * (64 / V));
          lo[v] = T::low_nibbles(b);
          hi[v] = T::high_nibbles(b);
        }
        for (int t = 0; t < NT; ++t) {
          int32_t bl, bh;
          std::memcpy(&bl, arow[t] + k0 + 4 * c, 4);
          std::memcpy(&bh, arow[t] + k0 + 4 * (c + half), 4);
          const VI al = T::bcast(bl), ah = T::bcast(bh);
          for (int v = 0; v < V; ++v) {
            iacc[t][v] = T::dot_u4(iacc[t][v], lo[v], al);
            iacc[t][v] = T::dot_u4(iacc[t][v], hi[v], ah);
          }
        }
      }
      // Nibbles are q + 8: subtract 8 * sum(q_a) of the token's group.
      for (int t = 0; t < NT; ++t) {
        int32_t asum;
        std::memcpy(&asum, arow[t] + scales_offset + (geo.groups + g) * 4, 4);
        const VI corr = T::bcast(asum * 8);
        for (int v = 0; v < V; ++v) iacc[t][v] = T::sub(iacc[t][v], corr);
      }
    }
    const float* sw = reinterpret_cast<const float*>(block + geo.values_bytes);
    for (int t = 0; t < NT; ++t) {
      float sa;
      std::memcpy(&sa, arow[t] + scales_offset + g * 4, 4);
      const VF sav = T::set1_f(sa);
      for (int v = 0; v < V; ++v) {
        const VF sc = T::mul_f(sav, T::load_f(sw + v * T::kLanes));
        facc[t][v] = T::fmadd_f(sc, T::cvt_f(iacc[t][v]), facc[t][v]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) {
    for (int v = 0; v < V; ++v) T::store_f(out[t] + v * T::kLanes, facc[t][v]);
  }
}

template <class T, bool kInt4>
void int_kernel(const PackedArgs& p) {
  const KMatrix& w = *p.w;
  const Activations& a = *p.a;
  const PackedGeometry geo = packed_geometry(w.format, w.cols, w.group);
  const int64_t so = act_scales_offset(w.cols);
  const int64_t tile0 = p.n0 / 16, tile1 = (p.n1 + 15) / 16;
  alignas(64) float out[T::kMaxTokens][16];
  const uint8_t* arow[T::kMaxTokens];
  for (int64_t tile = tile0; tile < tile1; ++tile) {
    const uint8_t* tp = w.data + tile * geo.tile_bytes;
    const int64_t r0 = tile * 16 > p.n0 ? tile * 16 : p.n0;
    const int64_t r1 = tile * 16 + 16 < p.n1 ? tile * 16 + 16 : p.n1;
    for (int64_t t0 = 0; t0 < a.tokens; t0 += T::kMaxTokens) {
      const int nt = static_cast<int>(a.tokens - t0 < T::kMaxTokens ? a.tokens - t0 : T::kMaxTokens);
      for (int t = 0; t < nt; ++t) {
        arow[t] = a.row(t0 + t);
      }
      switch (nt) {
#define TD_PACKED_CASE(N)                                                        \
  case N:                                                                        \
    if constexpr (N <= T::kMaxTokens) {                                          \
      int_tile<T, kInt4, N>(tp, geo, w.group, arow, so, out);                    \
    }                                                                            \
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
        default: break;
      }
      for (int t = 0; t < nt; ++t) {
        float* yt = p.y + (t0 + t) * p.ldy;
        for (int64_t r = r0; r < r1; ++r) yt[r] = out[t][r - tile * 16];
      }
    }
  }
}

}  // namespace tandem::kern::detail::packed_impl
