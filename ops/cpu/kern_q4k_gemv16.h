// K-quant GEMV (one token) 16 rows at a time on AVX-512 (S = Avx512<kVnni>, kern_gguf_avx512.h):
// Q4_K and Q5_K, Q2_K and Q3_K (k23_row_partials below), Q6_K (q6k_row_partials).
// Included only by kern_gguf_avx512.cpp and kern_gguf_vnni.cpp, after kern_gguf_impl.h and the
// traits; internal linkage.
//
// The row kernel (q4k_rows) spends most of a super-block's instructions on fixed per-block work
// done one row at a time: the scalar unpacking of the 12 scale bytes, two horizontal sums (the
// quants' dot and the mins' correction) and a serial F32 chain. Here a tile of 16 rows is read
// row after row, each super-block giving one partial vector: the same vector dot as q4k_rows
// (nibbles x Q8_K with the sub-block scales, one vpermw per half), the scales unpacked by two byte
// shuffles, and the mins' correction by one vpmaddwd; then per super-block one transposing add
// tree turns the 16 rows' partial vectors into two vectors (isum and msum, a row per lane) and the
// F32 steps run a row per lane.
// Those steps are the scalar reference's, each rounded alike (acc + (da * d) * isum, then
// - (da * dmin) * msum, in block order), so the result is bit-identical to q4k_rows, to the tiled
// GEMM and to the reference: tiles and the leftover rows can mix freely.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace {

// One row's super-block against the token's: a vector whose lanes 0-7 sum to the row's isum
// (sum over sub-blocks of scale * dot) and lanes 8-15 to its msum (sum of min * the activation's
// pair of 16-sums). al / ah: the activation's low / high nibble partners for groups 0-1 and 2-3
// (load_act_pair); pairs: int16 lanes 8-15 = bsums[2j] + bsums[2j + 1], lanes 0-7 zero.
// Block: BlockQ4_K, or BlockQ5_K (the same 16-byte header; each quant's fifth bit from qh, bit
// 2g of qh[l] for element l of group g's low nibbles, 2g + 1 for its high ones, added as 16: the
// same integers as q5k_rows).
template <class S, class Block>
inline __m512i q4k_row_partials(const Block& x, const __m512i* al, const __m512i* ah,
                                __m256i pairs, const __m512i* pick) {
  // Bytes 0-3 of the block are d and dmin, 4-7 (A) the scales 0-3 and the scales' top bits, 8-11
  // (B) the mins 0-3 and their top bits, 12-15 (C) the low nibbles of scales / mins 4-7
  // (unpack_k4_scales). Into u: bytes 0-7 the 8 scales, 8-15 the 8 mins.
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&x));
  const __m128i p = _mm_shuffle_epi8(
      raw, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));  // A C B C
  const __m128i q = _mm_shuffle_epi8(
      raw, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));  // 0 A 0 B
  const __m128i low = _mm_and_si128(p, _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0));
  const __m128i mid = _mm_and_si128(_mm_srli_epi16(p, 4), _mm_setr_epi32(0, 0, 0, 0x0F0F0F0F));
  const __m128i top =
      _mm_and_si128(_mm_srli_epi16(q, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  const __m128i u = _mm_or_si128(_mm_or_si128(low, mid), top);
  const __m256i u16 = _mm256_cvtepu8_epi16(u);  // int16: scales in lanes 0-7, mins in 8-15
  const __m512i scales = _mm512_castsi256_si512(u16);
  const __m512i mask = _mm512_set1_epi8(0x0F);
  __m512i sum = _mm512_setzero_si512();
  [[maybe_unused]] __m512i qh;
  if constexpr (std::is_same_v<Block, tandem::BlockQ5_K>) {  // qh[l] in bytes l and 32 + l
    qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qh)));
  }
  for (int h = 0; h < 2; ++h) {  // groups 2h and 2h + 1 (sub-blocks 4h .. 4h + 3)
    const __m512i w = _mm512_loadu_si512(x.qs + 64 * h);
    __m512i lo = _mm512_and_si512(w, mask);
    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), mask);
    if constexpr (std::is_same_v<Block, tandem::BlockQ5_K>) {
      // Group 2h's bits (2g = 4h, 4h + 1) in the low 32 bytes, group 2h + 1's (4h + 2, 4h + 3) in
      // the high ones.
      const char b0 = static_cast<char>(1 << (4 * h)), b2 = static_cast<char>(4 << (4 * h));
      const __m512i bit_lo =
          _mm512_inserti64x4(_mm512_set1_epi8(b0), _mm256_set1_epi8(b2), 1);
      const __m512i bit_hi = _mm512_add_epi8(bit_lo, bit_lo);
      const __m512i sixteen = _mm512_set1_epi8(16);
      lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, bit_lo), lo, sixteen);
      hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, bit_hi), hi, sixteen);
    }
    sum = S::dot_acc(sum, lo, al[h], _mm512_permutexvar_epi16(pick[2 * h], scales));
    sum = S::dot_acc(sum, hi, ah[h], _mm512_permutexvar_epi16(pick[2 * h + 1], scales));
  }
  const __m256i isum8 =
      _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
  const __m256i msum8 = _mm256_madd_epi16(u16, pairs);  // lanes 0-3: scales x 0
  return _mm512_inserti64x4(_mm512_castsi256_si512(isum8), msum8, 1);
}

// A Q8_K token row's super-block as q4k_row_partials takes it (prepared once per call).
struct Q4KAct {
  __m512i al[2], ah[2];
  __m256i pairs;
  float d;
};

template <class S>
inline void q4k_prepare_act(const tandem::BlockQ8_K& x, Q4KAct* p) {
  S::load_act_pair(x.qs, &p->al[0], &p->ah[0]);
  S::load_act_pair(x.qs + 128, &p->al[1], &p->ah[1]);
  const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.bsums));
  const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.bsums + 8));
  p->pairs = _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_hadd_epi16(b0, b1), 1);
  p->d = x.d;
}

// Q2_K / Q3_K: k23_rows' arithmetic (kern_gguf_impl.h) a super-block per step. The 64 bytes of qs
// hold all 256 2-bit fields: shifted right by 2j they give run j's values (bytes 0-31: elements
// 32j .. 32j + 31, sub-blocks 2j and 2j + 1; bytes 32-63: elements 128 + 32j .., sub-blocks 8 + 2j
// and 9 + 2j), against the token's bytes in that order (RunAct, prepared once per call); Q3_K adds
// 4 where its hmask bit is set (u = q + 4, 0..7, as k23_rows). One vpmaddubsw and one vpmaddwd
// (VNNI: vpdpwssd) by the sub-blocks' int16 scales per run: the same exact integers.
//
// RunAct: the token's 256 bytes as a row's four steps take them (K23: run j; Q6_K: bytes 64k ..),
// its bsums (Q3_K: times -4, below) and d.
struct RunAct {
  __m512i run[4];
  __m256i bsums;
  float d;
};

// bsums: the token's 16-value sums; for Q3_K times -4 (|bsum| <= 2048: exact in int16), so that
// its bias sum_j sc_j * (-4 * bsum_j) is one vpmaddwd by the scales.
template <class S, bool kThree>
inline void k23_prepare_act(const tandem::BlockQ8_K& x, RunAct* p) {
  for (int j = 0; j < 4; ++j) p->run[j] = S::load_halves(x.qs + 32 * j, x.qs + 128 + 32 * j);
  p->bsums = load_bsums(x);
  if constexpr (kThree) p->bsums = _mm256_mullo_epi16(p->bsums, _mm256_set1_epi16(-4));
  p->d = x.d;
}

// Q3_K's 16 scales minus 32 as int16 (q3k_scales8's bytes, in vector lanes): the 16 bytes that
// end with d (the block's bytes 94-109; the 12 scale bytes at 2-13) shuffled into words a0 a1 a0
// a1 (the low nibbles, shifted by 0 0 4 4) and t t t t (the top bits, by 0 2 4 6).
inline __m256i q3k_scales16(const tandem::BlockQ3_K& x) {
  const auto* p =
      reinterpret_cast<const uint8_t*>(&x) + offsetof(tandem::BlockQ3_K, scales) - 2;
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i a =
      _mm_shuffle_epi8(raw, _mm_setr_epi8(2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9));
  const __m128i t = _mm_shuffle_epi32(_mm_srli_si128(raw, 10), 0);
  const __m128i lo =
      _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 4, 4)), _mm_set1_epi8(0x0F));
  const __m128i hi = _mm_slli_epi32(
      _mm_and_si128(_mm_srlv_epi32(t, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3)), 4);
  return _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_or_si128(lo, hi), _mm_set1_epi8(32)));
}

// Lanes 0-7 sum to the row's isum (sum of scale * dot), lanes 8-15 to its correction: Q2_K the
// mins' sum_j m_j * bsums_j, Q3_K the bias sum_j -4 * sc_j * bsums_j (added to isum in the F32
// step, as k23_rows does). pick: gemv16_picks.
template <class S, class Block>
inline __m512i k23_row_partials(const Block& x, const RunAct& a, const __m512i* pick) {
  constexpr bool kThree = std::is_same_v<Block, tandem::BlockQ3_K>;
  __m256i sc16, corr16;
  if constexpr (kThree) {
    sc16 = q3k_scales16(x);
    corr16 = sc16;  // against -4 * bsums
  } else {
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
    const __m128i lo4 = _mm_set1_epi8(0x0F);
    sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc, lo4));
    corr16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), lo4));
  }
  const __m512i scales = _mm512_castsi256_si512(sc16);
  const __m512i qs = _mm512_loadu_si512(x.qs);
  [[maybe_unused]] __m512i hm;
  if constexpr (kThree) {
    hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.hmask)));
  }
  __m512i sum = _mm512_setzero_si512();
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    __m512i u = _mm512_and_si512(_mm512_srli_epi16(qs, 2 * j), _mm512_set1_epi8(3));
    if constexpr (kThree) {  // element 32m + l's bit m of hmask[l]: m = j below, 4 + j above
      const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << j)),
                                             _mm256_set1_epi8(static_cast<char>(16 << j)), 1);
      u = _mm512_mask_add_epi8(u, _mm512_test_epi8_mask(hm, bit), u, _mm512_set1_epi8(4));
    }
    sum = S::dot_acc(sum, u, a.run[j], _mm512_permutexvar_epi16(pick[j], scales));
  }
  const __m256i isum8 =
      _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
  return _mm512_inserti64x4(_mm512_castsi256_si512(isum8), _mm256_madd_epi16(corr16, a.bsums),
                            1);
}

// Q6_K: q6k_rows' 512-bit steps (per half h: the low nibbles of ql + 64h with their qh bit pairs
// are elements 0-63, the high nibbles 64-127, unsigned 0..63) with the 16 scales widened once per
// super-block and picked per step by vpermw. Lanes 8-15 of the partial sum to sum_j sc_j *
// bsums_j (one vpmaddwd); the F32 step subtracts 32 times it from isum (exact int32), as q6k_rows.
template <class S>
inline __m512i q6k_row_partials(const tandem::BlockQ6_K& x, const RunAct& a,
                                const __m512i* pick) {
  const __m256i sc16 =
      _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales)));
  const __m512i scales = _mm512_castsi256_si512(sc16);
  const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(0x03);
  __m512i sum = _mm512_setzero_si512();
  for (int h = 0; h < 2; ++h) {
    const __m512i l = _mm512_loadu_si512(x.ql + 64 * h);
    const __m512i hb = S::broadcast32(x.qh + 32 * h);
    const __m512i q_lo = _mm512_or_si512(
        _mm512_and_si512(l, m4),
        _mm512_slli_epi16(_mm512_and_si512(S::srlv16_halves(hb, 0, 2), m2), 4));
    const __m512i q_hi = _mm512_or_si512(
        _mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
        _mm512_slli_epi16(_mm512_and_si512(S::srlv16_halves(hb, 4, 6), m2), 4));
    sum = S::dot_acc(sum, q_lo, a.run[2 * h], _mm512_permutexvar_epi16(pick[2 * h], scales));
    sum = S::dot_acc(sum, q_hi, a.run[2 * h + 1],
                     _mm512_permutexvar_epi16(pick[2 * h + 1], scales));
  }
  const __m256i isum8 =
      _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
  return _mm512_inserti64x4(_mm512_castsi256_si512(isum8), _mm256_madd_epi16(sc16, a.bsums),
                            1);
}

template <class Block>
constexpr bool kK23 =
    std::is_same_v<Block, tandem::BlockQ2_K> || std::is_same_v<Block, tandem::BlockQ3_K>;

template <class Block>
constexpr bool kQ6 = std::is_same_v<Block, tandem::BlockQ6_K>;

// The prepared token super-block of each family.
template <class Block>
using Gemv16Act = std::conditional_t<kK23<Block> || kQ6<Block>, RunAct, Q4KAct>;

template <class S, class Block>
inline void gemv16_prepare_act(const tandem::BlockQ8_K& x, Gemv16Act<Block>* p) {
  if constexpr (kK23<Block>) {
    k23_prepare_act<S, std::is_same_v<Block, tandem::BlockQ3_K>>(x, p);
  } else if constexpr (kQ6<Block>) {
    for (int k = 0; k < 4; ++k) p->run[k] = S::load(x.qs + 64 * k);
    p->bsums = load_bsums(x);
    p->d = x.d;
  } else {
    q4k_prepare_act<S>(x, p);
  }
}

// The scale-picking indices of the partials: step i's int16 scales by one vpermw with pick[i]
// (K23, run i: lanes 0-7 scale 2i, 8-15 2i + 1, 16-23 8 + 2i, 24-31 9 + 2i; Q4_K / Q5_K: lanes
// 0-15 scale i0, 16-31 i0 + 2, i0 = 0, 1, 4, 5 for steps 0-3). (One vpermw per super-block into
// per-lane quads, then a vpshufb per step, measured no faster.)
template <class Block>
inline void gemv16_picks(__m512i* pick) {
  for (int i = 0; i < 4; ++i) {
    int16_t idx[32];
    for (int k = 0; k < 32; ++k) {
      if constexpr (kK23<Block>) {
        idx[k] = static_cast<int16_t>(8 * (k / 16) + 2 * i + (k % 16) / 8);
      } else if constexpr (kQ6<Block>) {  // step i: lanes 8q .. 8q + 7 scale 4i + q
        idx[k] = static_cast<int16_t>(4 * i + k / 8);
      } else {
        idx[k] = static_cast<int16_t>((i / 2) * 4 + i % 2 + 2 * (k / 16));
      }
    }
    pick[i] = _mm512_loadu_si512(idx);
  }
}

template <class S, class Block>
inline __m512i gemv16_partials(const Block& x, const Gemv16Act<Block>& a, const __m512i* pick) {
  if constexpr (kK23<Block>) {
    return k23_row_partials<S>(x, a, pick);
  } else if constexpr (kQ6<Block>) {
    return q6k_row_partials<S>(x, a, pick);
  } else {
    return q4k_row_partials<S>(x, a.al, a.ah, a.pairs, pick);
  }
}

// Rows w, w + row_bytes, ..., w + 15 * row_bytes (nb super-blocks each; 16 * row_bytes < 2^31)
// against one prepared token row: y[r] for r = 0..15. The rows are read one after the other (one
// sequential stream, prefetched ahead like the row kernels: walking the 16 rows super-block by
// super-block measured 20-40% slower), their partial vectors parked in part (16 * nb vectors,
// L1-resident) until the tree and the F32 steps run per super-block.
template <class S, class Block>
void gemv16(const uint8_t* w, int64_t row_bytes, int64_t nb, const Gemv16Act<Block>* act,
            float* y, __m512i* part) {
  __m512i pick[4];
  gemv16_picks<Block>(pick);
  for (int r = 0; r < 16; ++r) {
    const auto* row = reinterpret_cast<const Block*>(w + r * row_bytes);
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_ahead(row + b, sizeof(Block));
      part[b * 16 + r] = gemv16_partials<S>(row[b], act[b], pick);
    }
  }
  // The 32 bits gathered per row hold d (low half) and dmin (high); Q3_K and Q6_K have no dmin,
  // and their d ends the block: the word before it, d in the high half.
  constexpr bool kThree = std::is_same_v<Block, tandem::BlockQ3_K>;
  constexpr bool kDLast = kThree || kQ6<Block>;
  constexpr int64_t kDWord = static_cast<int64_t>(offsetof(Block, d)) - (kDLast ? 2 : 0);
  const __m512i offs =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(static_cast<int32_t>(row_bytes)));
  __m512 acc = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m512i* v = part + b * 16;
    __m512i quad[4];
    for (int qd = 0; qd < 4; ++qd) {  // 128-bit lane j: rows 4qd..4qd+3, part j
      quad[qd] = tree4_epi32(tree2_epi32(v[4 * qd], v[4 * qd + 1]),
                             tree2_epi32(v[4 * qd + 2], v[4 * qd + 3]));
    }
    // 128-bit lanes: [isum rows 0-3, msum 0-3, isum 4-7, msum 4-7], then rows 8-15.
    const __m512i h0 = _mm512_add_epi32(_mm512_shuffle_i64x2(quad[0], quad[1], 0x88),
                                        _mm512_shuffle_i64x2(quad[0], quad[1], 0xDD));
    const __m512i h1 = _mm512_add_epi32(_mm512_shuffle_i64x2(quad[2], quad[3], 0x88),
                                        _mm512_shuffle_i64x2(quad[2], quad[3], 0xDD));
    const __m512i isum = _mm512_shuffle_i64x2(h0, h1, 0x88);
    const __m512i msum = _mm512_shuffle_i64x2(h0, h1, 0xDD);
    const __m512i dd = _mm512_i32gather_epi32(
        offs, w + b * static_cast<int64_t>(sizeof(Block)) + kDWord, 1);
    const __m512 da = _mm512_set1_ps(act[b].d);
    if constexpr (kQ6<Block>) {  // acc + (da * d) * (isum - 32 * bias), as q6k_rows
      const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
      const __m512i is = _mm512_sub_epi32(isum, _mm512_slli_epi32(msum, 5));
      acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(da, dw), _mm512_cvtepi32_ps(is)));
    } else if constexpr (kThree) {  // acc + (da * d) * (isum + bias), as k23_rows
      const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
      acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(da, dw),
                                             _mm512_cvtepi32_ps(_mm512_add_epi32(isum, msum))));
    } else {  // acc + (da * d) * isum, then - (da * dmin) * msum
      const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
      const __m512 dmw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16)));
      acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_mul_ps(da, dw), _mm512_cvtepi32_ps(isum)));
      acc = _mm512_sub_ps(acc, _mm512_mul_ps(_mm512_mul_ps(da, dmw), _mm512_cvtepi32_ps(msum)));
    }
  }
  _mm512_storeu_ps(y, acc);
}

// The row path of a K-quant (Block: BlockQ4_K, BlockQ5_K, BlockQ2_K, BlockQ3_K or BlockQ6_K): one
// token's full tiles of 16 rows through gemv16, the remaining rows (more tokens, the last rows,
// matrices too large for 32-bit gather offsets) through the format's row kernel: the same bits
// either way.
template <class S, class Block>
void k_rows(const GemmArgs& g) {
  int64_t r = g.n0;
  if (g.tokens == 1 && 16 * g.row_bytes < (int64_t{1} << 31)) {
    const int64_t nb = g.cols / tandem::kQK_K;
    const auto* a = reinterpret_cast<const tandem::BlockQ8_K*>(g.act);
    thread_local std::vector<Gemv16Act<Block>> act;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"  // (a vector of SIMD values: fine)
    thread_local std::vector<__m512i> part;
#pragma GCC diagnostic pop
    if (r + 16 <= g.n1) {
      act.resize(static_cast<size_t>(nb));
      part.resize(static_cast<size_t>(16 * nb));
      for (int64_t b = 0; b < nb; ++b) {
        gemv16_prepare_act<S, Block>(a[b], &act[static_cast<size_t>(b)]);
      }
    }
    for (; r + 16 <= g.n1; r += 16) {
      gemv16<S, Block>(g.w + r * g.row_bytes, g.row_bytes, nb, act.data(), g.y + r, part.data());
    }
  }
  if (r < g.n1) {
    GemmArgs rest = g;
    rest.n0 = r;
    if constexpr (std::is_same_v<Block, tandem::BlockQ5_K>) {
      drive<Q5KKern<S>>(rest);
    } else if constexpr (std::is_same_v<Block, tandem::BlockQ2_K>) {
      drive<Q2KKern<S>>(rest);
    } else if constexpr (std::is_same_v<Block, tandem::BlockQ3_K>) {
      drive<Q3KKern<S>>(rest);
    } else if constexpr (kQ6<Block>) {
      drive<Q6KKern<S>>(rest);
    } else {
      drive<Q4KKern<S>>(rest);
    }
  }
}

}  // namespace
