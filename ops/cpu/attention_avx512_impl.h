// The AVX-512 attention algorithm (kern::attention; attention_avx512.cpp describes it) as
// templates over how the KV cache is stored: a `Kv` traits struct says the element type, how many
// key dimensions one dot step takes and how keys, the packed query and values are loaded.
// attention_avx512.cpp instantiates it for an F32 cache (AVX-512 F; also F16, BF16 and Q8_0
// caches dequantized as loaded), attention_bf16.cpp for a BF16 cache (AVX-512 BF16: vdpbf16ps
// scores on the query rounded to BF16, vdpbf16ps value sums on the probabilities rounded to BF16).
// Nothing here is exported.
//
// Kv provides:
//   using T;                                    the cache element (float, uint16_t BF16 bits)
//   static constexpr int64_t kDims;             key dimensions per dot step (one vector of T)
//   static const T* keys(a), values(a);         the cache rows of the arguments (KV head 0)
//   static int64_t head(int64_t d);             optional: T between a position's KV heads of d
//                                               values (default d)
//   static int64_t lead(int64_t d);             optional: bytes before a row's values that are
//                                               read with them (Q8_0's scales; default 0)
//   static __m512 load_q(const float* q, int64_t left);  a query step, zero past `left` values
//   static __m512 load_k(const T* row, int64_t d);       a full key step from value d of a row
//   static __m512 load_k(const T* row, int64_t d, int64_t left);  a tail step (left < kDims),
//                                               zero past it
//   static __m512 dot(__m512 acc, __m512 q, __m512 k);   acc + the step's products (16 F32 lanes)
//   using P;                                    the probabilities value sums read (float,
//                                               uint16_t: rounded to BF16 by round_p)
//   static void round_p(const float* p, int64_t n, P* out);  (P = uint16_t only)
//   template <int NH, int NJ> static void pv(...);  pv_chunk's contract on P probabilities
//   static __m512 load_v(const T* row, int64_t j, __mmask16 m);  where pv is pv_chunk
//                                               (ValuesByFma): values j.. of a row as F32, 0
//                                               where !m
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "ops/cpu/kern_gguf.h"
#include "ops/cpu/ref_ops.h"  // AttentionArgs

// (An anonymous namespace: each translation unit its own copy, compiled with its own flags.)
namespace tandem::kern::detail::attn {
namespace {

// out[i] = the sum of v[i]'s 16 lanes, i = 0..15 (unpack / shuffle tree, 4 levels).
inline __m512 sum16(const __m512* v) {
  __m512 a[8], b[4];
  for (int i = 0; i < 8; ++i) {
    a[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  // b[i], 128-bit lane k: the sums of lane k's four floats of v[4i..4i+3].
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(a[2 * i]), y = _mm512_castps_pd(a[2 * i + 1]);
    b[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 c0 =
      _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88), _mm512_shuffle_f32x4(b[0], b[1], 0xDD));
  const __m512 c1 =
      _mm512_add_ps(_mm512_shuffle_f32x4(b[2], b[3], 0x88), _mm512_shuffle_f32x4(b[2], b[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(c0, c1, 0x88), _mm512_shuffle_f32x4(c0, c1, 0xDD));
}

// Lane h * NS + s: dot(q[h], k[s]) over dk values, the NH query rows packed step-major
// (qp[step * NH + h]: row h's values kDims * step .. on, zero past dk): one pointer for every
// row, so the loop keeps its addresses in registers (with a pointer per row the scores ran ~20%
// slower). A zero-padded tail gives what masked loads of q gave. (qk_block and pv_chunk are
// forced inline: called from score_keys / value_sums, GCC kept them out of line and the decode
// step ran 1.5x slower.)
template <class Kv, int NH, int NS>
__attribute__((always_inline)) inline __m512 qk_block(const __m512* qp,
                                                      const typename Kv::T* const* k,
                                                      int64_t dk) {
  static_assert(NH * NS == 16);
  __m512 acc[16];
  for (__m512& x : acc) x = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + Kv::kDims <= dk; d += Kv::kDims, qp += NH) {
    __m512 kv[NS];
    for (int s = 0; s < NS; ++s) kv[s] = Kv::load_k(k[s], d);
    for (int h = 0; h < NH; ++h) {
      // The query step in a register, loaded once for its NS keys: GCC folded the load into
      // every FMA (NS loads; the decode step's scores ran load-bound, ~5% slower).
      __m512 qh = qp[h];
      __asm__("" : "+v"(qh));
      for (int s = 0; s < NS; ++s) acc[h * NS + s] = Kv::dot(acc[h * NS + s], qh, kv[s]);
    }
  }
  if (d < dk) {
    __m512 kv[NS];
    for (int s = 0; s < NS; ++s) kv[s] = Kv::load_k(k[s], d, dk - d);
    for (int h = 0; h < NH; ++h) {
      for (int s = 0; s < NS; ++s) acc[h * NS + s] = Kv::dot(acc[h * NS + s], qp[h], kv[s]);
    }
  }
  return sum16(acc);
}

// The probabilities' rows as the value sums read them (row h of a block at p + h * kPRow<P>):
// F32 scores in place, or BF16 with room for a zero after the segment's last key.
template <class P>
inline constexpr int64_t kPRow = std::is_same_v<P, float> ? kSegment : kSegment + 2;

// out[h][j0 + ...] = the value sums over n keys (values v, rows v_stride apart) for the NJ * 16
// output dimensions from j0 (mask m[z] for vector z) of NH rows: acc = fma(p[h][s], v[s][j], acc)
// over s in order, from 0 (first) or continuing out's sums. Row h's probabilities are
// p[h * kPRow<float> ..]: one pointer and constant offsets (a pointer per row ran out of
// registers: the GQA decode step 1.1x slower).
template <class Kv, int NH, int NJ>
__attribute__((always_inline)) inline void pv_chunk(const float* p,
                                                    const typename Kv::T* v, int64_t v_stride,
                                                    int64_t n, int64_t j0, const __mmask16* m,
                                                    bool first, float* const* out) {
  static_assert(NH * NJ == 16);
  __m512 acc[NH][NJ];
  for (int h = 0; h < NH; ++h) {
    for (int z = 0; z < NJ; ++z) {
      acc[h][z] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m[z], out[h] + j0 + 16 * z);
    }
  }
  for (int64_t s = 0; s < n; ++s) {
    const typename Kv::T* vr = v + s * v_stride;
    __m512 vv[NJ];
    for (int z = 0; z < NJ; ++z) vv[z] = Kv::load_v(vr, j0 + 16 * z, m[z]);
    for (int h = 0; h < NH; ++h) {
      const __m512 ph = _mm512_set1_ps(p[h * kPRow<float> + s]);
      for (int z = 0; z < NJ; ++z) acc[h][z] = _mm512_fmadd_ps(ph, vv[z], acc[h][z]);
    }
  }
  for (int h = 0; h < NH; ++h) {
    for (int z = 0; z < NJ; ++z) _mm512_mask_storeu_ps(out[h] + j0 + 16 * z, m[z], acc[h][z]);
  }
}

// What a Kv whose value sums are pv_chunk's (F32 probabilities, values by Kv::load_v) derives
// from: `struct KvF32 : ValuesByFma<KvF32>`.
template <class Kv>
struct ValuesByFma {
  using P = float;
  template <int NH, int NJ, class T>  // (T: Kv::T, deduced; Kv is incomplete here)
  __attribute__((always_inline)) static void pv(const float* p, const T* v,
                                                int64_t v_stride, int64_t n, int64_t j0,
                                                const __mmask16* m, bool first,
                                                float* const* out) {
    pv_chunk<Kv, NH, NJ>(p, v, v_stride, n, j0, m, first, out);
  }
};

// Kv::head / Kv::lead where Kv has them (attention_avx512_impl.h's list).
template <class Kv>
int64_t head_elems(int64_t d) {
  if constexpr (requires { Kv::head(d); }) {
    return Kv::head(d);
  } else {
    return d;
  }
}
template <class Kv>
int64_t lead_bytes(int64_t d) {
  if constexpr (requires { Kv::lead(d); }) {
    return Kv::lead(d);
  } else {
    return 0;
  }
}

// One KV head's rows of the keys or of the values, contiguous or paged (ops::AttentionArgs):
// position p's row is at base + blocks[p >> shift] * block + (p & mask) * stride. A contiguous
// cache is one block of every position (a table of one 0, shift 62, mask all ones), so both
// take the same code: one table load per row, next to its dk-long dot product.
template <class T>
struct Lane {
  const T* base;
  int64_t stride;
  const int32_t* blocks;
  int64_t shift, mask, block;
  const T* row(int64_t p) const { return base + blocks[p >> shift] * block + (p & mask) * stride; }
};

inline constexpr int32_t kOneBlock[1] = {0};

template <class T>
Lane<T> make_lane(const ops::AttentionArgs& a, const T* base, int64_t stride, int64_t block) {
  if (a.blocks == nullptr) return Lane<T>{base, stride, kOneBlock, 62, INT64_MAX, 0};
  const int64_t shift = __builtin_ctzll(static_cast<uint64_t>(a.block_positions));
  return Lane<T>{base, stride, a.blocks, shift, a.block_positions - 1, block};
}

// KV head g's rows of the keys and of the values: a.k_head / a.v_head apart, or side by side in
// a position's row.
template <class Kv>
Lane<typename Kv::T> key_rows(const ops::AttentionArgs& a, int64_t g) {
  return make_lane(a, Kv::keys(a) + g * (a.k_head != 0 ? a.k_head : head_elems<Kv>(a.dk)),
                   a.k_stride, a.k_block);
}
template <class Kv>
Lane<typename Kv::T> value_rows(const ops::AttentionArgs& a, int64_t g) {
  return make_lane(a, Kv::values(a) + g * (a.v_head != 0 ? a.v_head : head_elems<Kv>(a.dv)),
                   a.v_stride, a.v_block);
}

// The mask of the 16 values from j of n.
inline __mmask16 tail_mask(int64_t j, int64_t n) {
  const int64_t left = n - j;
  return left >= 16  ? static_cast<__mmask16>(0xFFFF)
         : left <= 0 ? static_cast<__mmask16>(0)
                     : static_cast<__mmask16>((1u << left) - 1);
}

// A segment's value sums folded into a row's output: out = fma(o_s, b, out * a).
inline __m512 fold_step(__m512 out, __m512 o_s, float a, float b) {
  return _mm512_fmadd_ps(o_s, _mm512_set1_ps(b), _mm512_mul_ps(out, _mm512_set1_ps(a)));
}

constexpr int64_t kChunk = 64;  // keys per prefetch step of the scores (the next chunk's lines)
static_assert(kSegment % kChunk == 0 && ops::kKvBlockAlign % kChunk == 0);
constexpr int64_t kMaxRows = 256;  // query rows per rows_task call (every model's heads fit)

// One row's softmax over its segments, folded in segment order: after the segments' (m_s, l_s)
// so far, m is their maximum and l the sum of their exponentials relative to it. add gives the
// coefficients of the output's fold, o = fma(o_s, b, o * a) (the first segment: a 0, b 1).
struct SegmentFold {
  float m, l;
  bool started;
  void add(float m_s, float l_s, float* a, float* b) {
    if (!started) {
      started = true;
      m = m_s;
      l = l_s;
      *a = 0.0f;
      *b = 1.0f;
      return;
    }
    const float mn = std::max(m, m_s);
    *a = std::exp(m - mn);
    *b = std::exp(m_s - mn);
    l = std::fma(l_s, *b, l * *a);
    m = mn;
  }
};

// The query rows of one task: they share the keys k0 and values v0 (rows a.k_stride / a.v_stride
// apart); row r attends to keys lo[r] .. n_ctx[r] - 1 of them (both ascending in r) and writes
// out[r]; sink[r] is its softmax's sink (-infinity: none, ops::sink_of).
struct Rows {
  const float* q[kMaxRows];
  int64_t lo[kMaxRows];
  int64_t n_ctx[kMaxRows];
  float sink[kMaxRows];
  float* out[kMaxRows];
  int64_t n = 0;
};

// Lines [l0, l1) (64 bytes each, from `lead` bytes before each row's values) of rows [r0, r1) of
// a cache: the row blocks of a chunk prefetch the next chunk's keys between them, evenly over the
// chunk's time.
template <class T>
inline void prefetch_lines(const Lane<T>& rows, int64_t lead, int64_t r0, int64_t r1, int64_t l0,
                           int64_t l1) {
  for (int64_t r = r0; r < r1; ++r) {
    const char* p = reinterpret_cast<const char*>(rows.row(r)) - lead;
    for (int64_t l = l0; l < l1; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
  }
}

// The rows' queries packed per block of NH for qk_block (qp[(b * steps + step) * NH + h]), a
// short last block repeating its last row.
template <class Kv, int NH>
const __m512* pack_rows(const ops::AttentionArgs& a, const Rows& rows) {
  const int64_t steps = (a.dk + Kv::kDims - 1) / Kv::kDims, blocks = (rows.n + NH - 1) / NH;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wignored-attributes"  // (a vector of SIMD values: fine)
  thread_local std::vector<__m512> packed;
#pragma GCC diagnostic pop
  packed.resize(static_cast<size_t>(blocks * steps * NH));
  for (int64_t b = 0; b < blocks; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* q = rows.q[std::min<int64_t>(b * NH + h, rows.n - 1)];
      for (int64_t st = 0; st < steps; ++st) {
        packed[static_cast<size_t>((b * steps + st) * NH + h)] =
            Kv::load_q(q + Kv::kDims * st, a.dk - Kv::kDims * st);
      }
    }
  }
  return packed.data();
}

// What a task prefetches: with `on`, the keys a chunk ahead up to position `end` (across its
// segments), and the values too where they are other rows than the keys (prefill: off, its keys
// come from L2 / L3 for most tasks, where the prefetches cost 5-10%).
struct Prefetch {
  bool on = false;
  int64_t end = 0;
};

// The scores of every row against keys [s_begin, s_end) (at most kSegment of them):
// scores[r * kSegment + s - s_begin]. Row blocks of NH (a short last block repeats its last row),
// key blocks of NS (a short last block repeats the last key); repeated outputs are dropped. Every
// output is its own accumulator and lane tree, whichever rows and keys share its block.
template <class Kv, int NH>
void score_keys(const ops::AttentionArgs& a, const Rows& rows, const __m512* packed,
                const Lane<typename Kv::T>& k0, const Lane<typename Kv::T>& v0, int64_t s_begin,
                int64_t s_end, Prefetch pf, float* scores) {
  using T = typename Kv::T;
  constexpr int NS = 16 / NH;
  const int64_t steps = (a.dk + Kv::kDims - 1) / Kv::kDims, blocks = (rows.n + NH - 1) / NH;
  // Each row block's share of a key's (and a value's) 64-byte lines to prefetch: lines
  // share[b] .. share[b + 1] (computed once per call, not with two divisions per block).
  const bool pf_values = pf.on && v0.base != k0.base;
  const int64_t elem = static_cast<int64_t>(sizeof(T));
  const int64_t klead = lead_bytes<Kv>(a.dk), vlead = lead_bytes<Kv>(a.dv);
  const int64_t lines = (klead + a.dk * elem + 63) / 64, vlines = (vlead + a.dv * elem + 63) / 64;
  thread_local std::vector<int64_t> share, vshare;
  share.resize(static_cast<size_t>(blocks + 1));
  vshare.resize(static_cast<size_t>(blocks + 1));
  for (int64_t b = 0; b <= blocks; ++b) {
    share[static_cast<size_t>(b)] = lines * b / blocks;
    vshare[static_cast<size_t>(b)] = vlines * b / blocks;
  }
  // Key chunks outer: a chunk's keys stay in L1 / L2 while every row block passes over them.
  for (int64_t c0 = s_begin; c0 < s_end; c0 += kChunk) {
    const int64_t c1 = std::min(s_end, c0 + kChunk);
    for (int64_t h0 = 0; h0 < rows.n; h0 += NH) {
      const int64_t b = h0 / NH;
      const __m512* qp = packed + b * steps * NH;
      for (int64_t s0 = c0; s0 < c1; s0 += NS) {
        // The row blocks prefetch the next chunk's keys between them as they go (without, a
        // long context read latency-bound).
        if (pf.on && s0 + kChunk < pf.end) {
          const int64_t r1 = std::min(pf.end, s0 + kChunk + NS);
          prefetch_lines(k0, klead, s0 + kChunk, r1, share[b], share[b + 1]);
          if (pf_values) prefetch_lines(v0, vlead, s0 + kChunk, r1, vshare[b], vshare[b + 1]);
        }
        const T* k[NS];
        for (int s = 0; s < NS; ++s) k[s] = k0.row(std::min(s0 + s, s_end - 1));
        const __m512 dots = qk_block<Kv, NH, NS>(qp, k, a.dk);
        // Row h's NS dot products (lanes h * NS ..) stored in place by a masked store of the
        // whole vector shifted back h * NS floats (masked-off lanes are not written; storing 16
        // keys per row after a transpose of NH blocks measured the same).
        const unsigned keys = static_cast<unsigned>((1u << std::min<int64_t>(NS, c1 - s0)) - 1);
        for (int h = 0; h < NH && h0 + h < rows.n; ++h) {
          _mm512_mask_storeu_ps(scores + (h0 + h) * kSegment + s0 - s_begin - h * NS,
                                static_cast<__mmask16>(keys << (h * NS)), dots);
        }
      }
    }
  }
}

// The value sums of every row over keys [s_begin, s_end) with probabilities
// p[r * kSegment + s - s_begin] (0 past a row's own n_ctx: fma(0, v, acc) = acc), unscaled into
// sums[r] (dv floats; rows whose sums[r] is nullptr are computed into `dummy` and dropped). Key
// chunks outer, then the row blocks, then the dimension blocks: a chunk's values stay in L1 / L2
// while every block passes over them (the dimension blocks outside the row blocks measured
// 2-5% slower in prefill).
template <class Kv, int NH>
void value_sums(const ops::AttentionArgs& a, const Rows& rows, const Lane<typename Kv::T>& v0,
                int64_t s_begin, int64_t s_end, const float* p_f32, float* const* sums,
                float* dummy) {
  using P = typename Kv::P;
  constexpr int NJ = 16 / NH;
  // The probabilities as the value sums read them: BF16 rows (kSegment + 2 entries each, a zero
  // after the segment's last key: a pair's missing partner), or the F32 scores' rows.
  constexpr int64_t kStride = kPRow<P>;
  const P* p_all;
  if constexpr (std::is_same_v<P, float>) {
    p_all = p_f32;
  } else {
    thread_local std::vector<P> rounded;
    rounded.resize(static_cast<size_t>(rows.n * kStride));
    for (int64_t r = 0; r < rows.n; ++r) {
      Kv::round_p(p_f32 + r * kSegment, s_end - s_begin, rounded.data() + r * kStride);
    }
    p_all = rounded.data();
  }
  // A short last row block reads a copy of its rows padded to NH with its last row (the rows of
  // a block kStride apart; the copies' sums go to `dummy`).
  const int64_t h_short = rows.n / NH * NH;
  const P* p_short = nullptr;
  if (h_short < rows.n) {
    thread_local std::vector<P> pad;
    pad.resize(static_cast<size_t>(NH * kStride));
    const int64_t used = std::min(kStride, s_end - s_begin + 1);  // (BF16: an odd key's partner)
    for (int64_t h = 0; h < NH; ++h) {
      const P* src = p_all + std::min(h_short + h, rows.n - 1) * kStride;
      std::copy(src, src + used, pad.data() + h * kStride);
    }
    p_short = pad.data();
  }
  for (int64_t c0 = s_begin; c0 < s_end; c0 += kChunk) {
    const int64_t c1 = std::min(s_end, c0 + kChunk);
    for (int64_t h0 = 0; h0 < rows.n; h0 += NH) {
      const P* p = (h0 == h_short ? p_short : p_all + h0 * kStride) + (c0 - s_begin);
      float* out[NH];
      for (int h = 0; h < NH; ++h) {
        const int64_t hh = std::min<int64_t>(h0 + h, rows.n - 1);
        out[h] = h0 + h < rows.n && sums[hh] != nullptr ? sums[hh] : dummy;
      }
      for (int64_t j0 = 0; j0 < a.dv; j0 += 16 * NJ) {
        __mmask16 m[NJ];
        for (int z = 0; z < NJ; ++z) m[z] = tail_mask(j0 + 16 * z, a.dv);
        // (A chunk's rows are in one block: chunks start at multiples of kChunk, blocks hold
        // multiples of ops::kKvBlockAlign positions.)
        Kv::template pv<NH, NJ>(p, v0.row(c0), v0.stride, c1 - c0, j0, m, c0 == s_begin, out);
      }
    }
  }
}

// Each row's segment [s_begin, s_end) after its scores: p in place over its own keys (zeros
// before and past them), the segment's (m_s, l_s) into m_out / l_out. Returns whether the row has
// keys there.
inline bool segment_probabilities(const ops::AttentionArgs& a, const Rows& rows, int64_t r,
                                  int64_t s_begin, int64_t s_end, float* scores, float* m_out,
                                  float* l_out) {
  float* sc = scores + r * kSegment;
  const int64_t b = std::max(rows.lo[r], s_begin) - s_begin;
  const int64_t e = std::min(rows.n_ctx[r], s_end) - s_begin;
  if (e <= b) {
    std::fill(sc, sc + (s_end - s_begin), 0.0f);
    return false;
  }
  std::fill(sc, sc + b, 0.0f);
  segment_exp_avx512(sc + b, e - b, a.scale, m_out, l_out);
  std::fill(sc + e, sc + (s_end - s_begin), 0.0f);
  return true;
}

template <class Kv, int NH>
void rows_task(const ops::AttentionArgs& a, const Rows& rows, const Lane<typename Kv::T>& k0,
               const Lane<typename Kv::T>& v0, float* scores, float* dummy, bool prefetch) {
  // Each row's arithmetic does not depend on which rows share the task: its dot products are the
  // same blocks' (one accumulator and lane tree per output), its segments end at its own n_ctx,
  // its probabilities outside lo .. n_ctx are 0 (the value blocks' longer key range adds
  // fma(0, v, acc) = acc), and a segment outside them leaves it as it was. Segments start at
  // multiples of kSegment (a window's first keys in a partial segment).
  const int64_t n_max = rows.n_ctx[rows.n - 1];
  const int64_t c_first = rows.lo[0] / kSegment * kSegment;
  const __m512* packed = pack_rows<Kv, NH>(a, rows);
  thread_local std::vector<float> seg_sums;  // each row's value sums of the segment
  seg_sums.resize(static_cast<size_t>(rows.n * a.dv));
  SegmentFold fold[kMaxRows];
  float fa[kMaxRows], fb[kMaxRows];
  float* sums[kMaxRows];
  bool first[kMaxRows];
  for (int64_t r = 0; r < rows.n; ++r) fold[r].started = false;  // (a POD: only rows.n set)
  for (int64_t c0 = c_first; c0 < n_max; c0 += kSegment) {
    const int64_t c1 = std::min(n_max, c0 + kSegment);
    score_keys<Kv, NH>(a, rows, packed, k0, v0, c0, c1, Prefetch{prefetch, n_max}, scores);
    for (int64_t r = 0; r < rows.n; ++r) {
      float m_s, l_s;
      sums[r] = nullptr;
      if (segment_probabilities(a, rows, r, c0, c1, scores, &m_s, &l_s)) {
        // A row's first segment: its sums are the output as they are (the fold with a = 0,
        // b = 1 gives fma(o_s, 1, +0) = o_s: sums from +0 are never -0).
        first[r] = !fold[r].started;
        fold[r].add(m_s, l_s, &fa[r], &fb[r]);
        sums[r] = first[r] ? rows.out[r] : seg_sums.data() + r * a.dv;
      }
    }
    value_sums<Kv, NH>(a, rows, v0, c0, c1, scores, sums, dummy);
    for (int64_t r = 0; r < rows.n; ++r) {
      if (sums[r] == nullptr || first[r]) continue;
      for (int64_t j = 0; j < a.dv; j += 16) {
        const __mmask16 m = tail_mask(j, a.dv);
        float* o = rows.out[r] + j;
        _mm512_mask_storeu_ps(o, m,
                              fold_step(_mm512_maskz_loadu_ps(m, o),
                                        _mm512_maskz_loadu_ps(m, sums[r] + j), fa[r], fb[r]));
      }
    }
  }
  for (int64_t r = 0; r < rows.n; ++r) {
    // The sink: a last segment of one key, numerator 1, value 0 (-infinity: keep 1, l as it is).
    float keep;
    fold[r].add(rows.sink[r], 1.0f, &keep, &fb[r]);
    const __m512 inv = _mm512_set1_ps(keep / fold[r].l);
    for (int64_t j = 0; j < a.dv; j += 16) {
      const __mmask16 m = tail_mask(j, a.dv);
      _mm512_mask_storeu_ps(rows.out[r] + j, m,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(m, rows.out[r] + j), inv));
    }
  }
}

// The row block of a KV group's heads. (Every output's arithmetic is the same in any block, so
// this is speed only.) A decode task of all 8 heads of a group of 8 (GQA, e.g. Qwen3-30B-A3B's
// 32 / 4; decode_heads = the task's heads, 0 elsewhere) takes them in one block of 8 x 2 keys:
// each key line read once per chunk instead of twice (a long decode from DRAM 1.01-1.28x,
// same-minute A/B). A 512-token prefill ran 1.2x slower that way (its keys come from L2 / L3), and
// absorbed MLA's 16 heads on 576-wide rows 0.84-0.96x: they keep blocks of 4.
inline int group_nh(int64_t group, int64_t decode_heads) {
  if (group == 8 && decode_heads == 8) return 8;
  return group >= 4 ? 4 : group >= 2 ? 2 : 1;
}

template <class Kv>
void rows_any(const ops::AttentionArgs& a, int nh, const Rows& rows,
              const Lane<typename Kv::T>& k0, const Lane<typename Kv::T>& v0, float* scores,
              float* dummy, bool prefetch) {
  if (nh == 8) {
    rows_task<Kv, 8>(a, rows, k0, v0, scores, dummy, prefetch);
  } else if (nh == 4) {
    rows_task<Kv, 4>(a, rows, k0, v0, scores, dummy, prefetch);
  } else if (nh == 2) {
    rows_task<Kv, 2>(a, rows, k0, v0, scores, dummy, prefetch);
  } else {
    rows_task<Kv, 1>(a, rows, k0, v0, scores, dummy, prefetch);
  }
}

// attention_task_avx512's contract (kern_gguf.h) for a cache read by Kv.
template <class Kv>
void task(const ops::AttentionArgs& a, int64_t t, int64_t g, int64_t hb, int64_t he,
          float* scores, float* dummy) {
  const int64_t group = a.n_heads / a.n_kv_heads, base = g * group;
  const int nh = group_nh(group, a.n_tokens == 1 ? he - hb : 0);
  const float* q0 = a.q + t * a.q_stride + base * a.dk;
  for (int64_t h0 = hb; h0 < he; h0 += kMaxRows) {
    Rows rows;
    rows.n = std::min<int64_t>(kMaxRows, he - h0);
    for (int64_t r = 0; r < rows.n; ++r) {
      rows.q[r] = q0 + (h0 + r) * a.dk;
      rows.lo[r] = ops::first_key(a, a.pos0 + t);
      rows.n_ctx[r] = a.pos0 + t + 1;
      rows.sink[r] = ops::sink_of(a, base + h0 + r);
      rows.out[r] = a.out + (t * a.n_heads + base + h0 + r) * a.dv;
    }
    rows_any<Kv>(a, nh, rows, key_rows<Kv>(a, g), value_rows<Kv>(a, g), scores, dummy,
                 a.n_tokens == 1);
  }
}

// attention_tokens_avx512's contract for a cache read by Kv.
template <class Kv>
void tokens(const ops::AttentionArgs& a, int64_t t0, int64_t t1, int64_t g, float* scores,
            float* dummy) {
  for (int64_t b = t0; b < t1; b += kMaxRows) {
    Rows rows;
    rows.n = std::min<int64_t>(kMaxRows, t1 - b);
    for (int64_t r = 0; r < rows.n; ++r) {
      rows.q[r] = a.q + (b + r) * a.q_stride + g * a.dk;
      rows.lo[r] = ops::first_key(a, a.pos0 + b + r);
      rows.n_ctx[r] = a.pos0 + b + r + 1;
      rows.sink[r] = ops::sink_of(a, g);
      rows.out[r] = a.out + ((b + r) * a.n_heads + g) * a.dv;
    }
    rows_any<Kv>(a, 4, rows, key_rows<Kv>(a, g), value_rows<Kv>(a, g), scores, dummy, false);
  }
}

// Token 0's rows of KV group 0 (all a.n_heads of them: one group) with n_ctx = pos0 + 1 keys.
inline Rows decode_rows(const ops::AttentionArgs& a) {
  Rows rows;
  rows.n = a.n_heads;
  for (int64_t r = 0; r < rows.n; ++r) {
    rows.q[r] = a.q + r * a.dk;
    rows.lo[r] = 0;  // (no window, no sinks: kern::attention_splits_cache)
    rows.n_ctx[r] = a.pos0 + 1;
    rows.sink[r] = ops::sink_of(a, r);
    rows.out[r] = a.out + r * a.dv;
  }
  return rows;
}

template <class Kv, int NH>
void decode_segments_nh(const ops::AttentionArgs& a, int64_t seg_begin, int64_t seg_end,
                        float* partial, float* stats) {
  const Rows rows = decode_rows(a);
  const int64_t n_ctx = a.pos0 + 1;
  const __m512* packed = pack_rows<Kv, NH>(a, rows);
  thread_local std::vector<float> scores, dummy;
  scores.resize(static_cast<size_t>(rows.n * kSegment));
  dummy.resize(static_cast<size_t>(a.dv));
  const Prefetch pf{true, std::min(n_ctx, seg_end * kSegment)};
  float* sums[kMaxRows];
  for (int64_t seg = seg_begin; seg < seg_end; ++seg) {
    const int64_t c0 = seg * kSegment, c1 = std::min(n_ctx, c0 + kSegment);
    score_keys<Kv, NH>(a, rows, packed, key_rows<Kv>(a, 0), value_rows<Kv>(a, 0), c0, c1, pf,
                       scores.data());
    for (int64_t r = 0; r < rows.n; ++r) {
      float* st = stats + (seg * rows.n + r) * 2;
      segment_probabilities(a, rows, r, c0, c1, scores.data(), st, st + 1);
      sums[r] = partial + (seg * rows.n + r) * a.dv;
    }
    value_sums<Kv, NH>(a, rows, value_rows<Kv>(a, 0), c0, c1, scores.data(), sums,
                       dummy.data());
  }
}

// decode_segments_avx512's contract for a cache read by Kv.
template <class Kv>
void decode_segments(const ops::AttentionArgs& a, int64_t seg_begin, int64_t seg_end,
                     float* partial, float* stats) {
  switch (group_nh(a.n_heads, 0)) {  // (the split decode: MLA, blocks of 4)
    case 4: decode_segments_nh<Kv, 4>(a, seg_begin, seg_end, partial, stats); break;
    case 2: decode_segments_nh<Kv, 2>(a, seg_begin, seg_end, partial, stats); break;
    default: decode_segments_nh<Kv, 1>(a, seg_begin, seg_end, partial, stats); break;
  }
}

}  // namespace
}  // namespace tandem::kern::detail::attn
