// AVX-512 traits for the kernel templates (kern_gguf_impl.h). kVnni adds AVX-512 VNNI (vpdpwssd,
// vpdpbusd). Included only by kern_gguf_avx512.cpp / kern_gguf_vnni.cpp,
// which are compiled with the matching -mavx512* flags; internal linkage throughout.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace {

template <bool kVnni>
struct Avx512 {
  using V = __m512i;
  using V32 = __m256i;
  using F = __m512;
  static constexpr int kBytes = 64;
  static constexpr int kFloats = 16;

  static V zero() { return _mm512_setzero_si512(); }
  static V set1_8(int x) { return _mm512_set1_epi8(static_cast<char>(x)); }
  static V load(const void* p) { return _mm512_loadu_si512(p); }
  static V load_halves(const void* p0, const void* p1) {
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(p0))),
        _mm256_loadu_si256(static_cast<const __m256i*>(p1)), 1);
  }
  static V broadcast32(const void* p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
  }
  static V and_(V a, V b) { return _mm512_and_si512(a, b); }
  static V or_(V a, V b) { return _mm512_or_si512(a, b); }
  static V srli16(V a, unsigned n) { return _mm512_srli_epi16(a, n); }
  static V slli16(V a, unsigned n) { return _mm512_slli_epi16(a, n); }
  // 16-bit lanes 0-15 shifted right by a, lanes 16-31 by b.
  static V srlv16_halves(V v, int a, int b) {
    const V counts = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(a)),
                                        _mm256_set1_epi16(static_cast<short>(b)), 1);
    return _mm512_srlv_epi16(v, counts);
  }
  // Lanes 0-15 (the low 256 bits) scaled by s0, lanes 16-31 by s1.
  static V scale16(int s0, int s1) {
    return _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(s0)),
                              _mm256_set1_epi16(static_cast<short>(s1)), 1);
  }
  // The 8 sub-block scales as int16 in lanes 0-7; scale_pick(i0, i1) puts scale i0 in lanes
  // 0-15 and i1 in lanes 16-31 (one permute from a constant index).
  static V scales_prepare(const uint8_t* sc) {
    long long v;
    __builtin_memcpy(&v, sc, 8);
    return _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(v)));
  }
  static V scale_pick(V prepared, int i0, int i1) {
    const V idx = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<short>(i0)),
                                     _mm256_set1_epi16(static_cast<short>(i1)), 1);
    return _mm512_permutexvar_epi16(idx, prepared);
  }
  // Activations of groups g and g+1 (at q8): [sub 2g, sub 2g+2] and [sub 2g+1, sub 2g+3] from two
  // 64-byte loads and two lane shuffles.
  static void load_act_pair(const int8_t* q8, V* lo, V* hi) {
    const V l0 = _mm512_loadu_si512(q8), l1 = _mm512_loadu_si512(q8 + 64);
    *lo = _mm512_shuffle_i64x2(l0, l1, 0x44);
    *hi = _mm512_shuffle_i64x2(l0, l1, 0xEE);
  }
  // 16-bit lanes 8q .. 8q+7 scaled by sc[q], q = 0..3 (16 bytes of quants per scale).
  static V scale16_quarters(const int8_t* sc) {
    int32_t four;
    __builtin_memcpy(&four, sc, 4);
    const __m128i s16 = _mm_cvtepi8_epi16(_mm_cvtsi32_si128(four));
    const V idx = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1,
                                   1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_permutexvar_epi16(idx, _mm512_castsi128_si512(s16));
  }
  static V dot_acc(V acc, V u8, V s8, V sc) {
    const V p = _mm512_maddubs_epi16(u8, s8);
    if constexpr (kVnni) {
      return _mm512_dpwssd_epi32(acc, p, sc);
    } else {
      return _mm512_add_epi32(acc, _mm512_madd_epi16(p, sc));
    }
  }
  static int32_t hsum(V v) { return _mm512_reduce_add_epi32(v); }
  // out[i] = hsum(v_i) for four vectors through one transposing add tree (exact integers).
  static void hsum4(V a, V b, V c, V d, int32_t* out) {
    const V ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    const V cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    // Per 128-bit lane: the sums of a, b, c, d over that lane.
    const V t = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    const __m256i h =
        _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                     _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
  }
  // Per 32-bit lane: acc + the sum of 4 products u * s (u unsigned, s signed bytes; |u * s| pairs
  // fit int16 for the callers: u <= 31 or u == 16).
  static V dot_u8s8(V acc, V u, V s) {
    if constexpr (kVnni) {
      return _mm512_dpbusd_epi32(acc, u, s);
    } else {
      return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s),
                                                     _mm512_set1_epi16(1)));
    }
  }
  static V sub32(V a, V b) { return _mm512_sub_epi32(a, b); }
  // The nibbles of two consecutive legacy 4/5-bit blocks (qs0, qs1) as 64 bytes 0..15 in element
  // order: bytes 0-15 the low nibbles of block 0, 16-31 its high nibbles, 32-63 block 1's.
  static V nib_pair_u8(const uint8_t* qs0, const uint8_t* qs1) {
    const __m256i q = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs0))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs1)), 1);
    // [q0, q0, q1, q1], then the 2nd and 4th 128-bit lanes shifted right by 4.
    const V dup = _mm512_permutexvar_epi64(_mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0),
                                           _mm512_castsi256_si512(q));
    return _mm512_and_si512(_mm512_mask_srli_epi16(dup, 0xFF00FF00u, dup, 4),
                            _mm512_set1_epi8(0x0F));
  }
  // The same with the fifth bits (qh0, qh1: bit j of the LE 32-bit word adds 16 to element j):
  // 64 unsigned quants 0..31.
  static V q5_pair_u8(const uint8_t* qs0, const uint8_t* qh0, const uint8_t* qs1,
                      const uint8_t* qh1) {
    const V nib = nib_pair_u8(qs0, qs1);
    uint32_t h0, h1;
    __builtin_memcpy(&h0, qh0, 4);
    __builtin_memcpy(&h1, qh1, 4);
    const __mmask64 high = static_cast<__mmask64>(h0) | (static_cast<__mmask64>(h1) << 32);
    return _mm512_mask_add_epi8(nib, high, nib, _mm512_set1_epi8(16));
  }
  static V q5_0_pair_u8(const tandem::BlockQ5_0& x0, const tandem::BlockQ5_0& x1) {
    return q5_pair_u8(x0.qs, x0.qh, x1.qs, x1.qh);
  }
  // Lanes 0-7 s0, lanes 8-15 s1.
  static F fpair(float s0, float s1) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(s0)), _mm256_set1_ps(s1), 1);
  }

  static V32 load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static int32_t hsum256(__m256i v) { return hsum_epi32_256(v); }  // kern_gguf_impl.h
  static int32_t dot_s8_32(V32 w, const int8_t* a) {
    const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
    const __m256i ax = _mm256_sign_epi8(w, w), sy = _mm256_sign_epi8(av, w);
    if constexpr (kVnni) {
      return hsum256(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy));
    } else {
      return hsum256(_mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1)));
    }
  }

  static __m256i dot_s8_32_lanes(V32 w, const int8_t* a) {
    const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
    const __m256i ax = _mm256_sign_epi8(w, w), sy = _mm256_sign_epi8(av, w);
    if constexpr (kVnni) {
      return _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy);
    } else {
      return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
    }
  }
  static F to_float(V v) { return _mm512_cvtepi32_ps(v); }
  static F fset1(float x) { return _mm512_set1_ps(x); }
  static F fzero() { return _mm512_setzero_ps(); }
  static F fload(const float* p) { return _mm512_loadu_ps(p); }
  static F load_half(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static float fhsum(F v) { return _mm512_reduce_add_ps(v); }
  static F load_bf16(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
};

// Transposing add trees over 32-bit lanes, per 128-bit lane of a and b: tree2 gives
// a0+a2, b0+b2, a1+a3, b1+b3; tree4 of two tree2 results the four vectors' lane sums in order.
inline __m512i tree2_epi32(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
inline __m512i tree4_epi32(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

// The fixed tree over 16 F32 lanes of the legacy formats' order (kern_gguf_vnni.cpp): h8[i] =
// acc[i] + acc[i + 8], h4[i] = h8[i] + h8[i + 4], h2[i] = h4[i] + h4[i + 2], h2[0] + h2[1].
inline float lane_tree_ps(__m512 acc) {
  const __m256 h8 = _mm256_add_ps(_mm512_castps512_ps256(acc),
                                  _mm512_castps512_ps256(_mm512_shuffle_f32x4(acc, acc, 0xEE)));
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps(h8, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}

// v[p]: lanes 0-7 partial sums of block 2p, 8-15 of block 2p + 1 -> the 16 block sums in order.
inline __m512i q0_block_sums(const __m512i* v) {
  // y0, 128-bit lane k: the sums of v[0..3]'s dwords 4k..4k+3; y1 the same for v[4..7].
  const __m512i y0 = tree4_epi32(tree2_epi32(v[0], v[1]), tree2_epi32(v[2], v[3]));
  const __m512i y1 = tree4_epi32(tree2_epi32(v[4], v[5]), tree2_epi32(v[6], v[7]));
  // Lanes 0, 2 + lanes 1, 3: blocks (0 2 4 6) (1 3 5 7) (8 10 12 14) (9 11 13 15).
  const __m512i s =
      _mm512_add_epi32(_mm512_shuffle_i32x4(y0, y1, 0x88), _mm512_shuffle_i32x4(y0, y1, 0xDD));
  return _mm512_permutexvar_epi32(
      _mm512_set_epi32(15, 11, 14, 10, 13, 9, 12, 8, 7, 3, 6, 2, 5, 1, 4, 0), s);
}

}  // namespace
