// AVX2 (+FMA, F16C) instances of the GGUF / dense kernel templates: the baseline every supported
// CPU runs. Compiled with -ffp-contract=off like the other kern_gguf_* units.
#include <immintrin.h>

#include "ops/cpu/kern_gguf_impl.h"

namespace {

struct Avx2 {
  using V = __m256i;
  using V32 = __m256i;
  using F = __m256;
  static constexpr int kBytes = 32;
  static constexpr int kFloats = 8;

  static V zero() { return _mm256_setzero_si256(); }
  static V set1_8(int x) { return _mm256_set1_epi8(static_cast<char>(x)); }
  static V load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static V load_halves(const void* p0, const void*) { return load(p0); }
  static V and_(V a, V b) { return _mm256_and_si256(a, b); }
  static V or_(V a, V b) { return _mm256_or_si256(a, b); }
  static V srli16(V a, int n) { return _mm256_srli_epi16(a, n); }
  static V slli16(V a, int n) { return _mm256_slli_epi16(a, n); }
  static V scale16(int s0, int) { return _mm256_set1_epi16(static_cast<short>(s0)); }
  // The 8 sub-block scales as int16 in both 128-bit lanes; scale_pick broadcasts one of them.
  static V scales_prepare(const uint8_t* sc) {
    long long v;
    __builtin_memcpy(&v, sc, 8);
    return _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(v)));
  }
  static V scale_pick(V prepared, int i, int) {
    const short lo = static_cast<short>((2 * i) | ((2 * i + 1) << 8));
    return _mm256_shuffle_epi8(prepared, _mm256_set1_epi16(lo));
  }
  // Activations of group g (at q8): the low-nibble sub-block, then the high-nibble one.
  static void load_act_pair(const int8_t* q8, V* lo, V* hi) {
    *lo = load(q8);
    *hi = load(q8 + 32);
  }
  // Lanes 0-7 (bytes 0-15) scaled by a, lanes 8-15 by b.
  static V scale16_split(int a, int b) {
    return _mm256_setr_m128i(_mm_set1_epi16(static_cast<short>(a)),
                             _mm_set1_epi16(static_cast<short>(b)));
  }
  static V dot_acc(V acc, V u8, V s8, V sc) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u8, s8), sc));
  }
  static int32_t hsum(V v) { return hsum_epi32_256(v); }
  static void hsum4(V a, V b, V c, V d, int32_t* out) {
    out[0] = hsum(a);
    out[1] = hsum(b);
    out[2] = hsum(c);
    out[3] = hsum(d);
  }
  static V32 load32(const int8_t* p) { return load(p); }
  // Signed x signed through the unsigned x signed multiply: |w| * (a with w's sign).
  static int32_t dot_s8_32(V32 w, const int8_t* a) {
    const V av = load(a);
    const V p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(av, w));
    return hsum(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }

  static __m256i dot_s8_32_lanes(V32 w, const int8_t* a) {
    const V av = load(a);
    const V p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(av, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
  }
  static F to_float(V v) { return _mm256_cvtepi32_ps(v); }
  static F fset1(float x) { return _mm256_set1_ps(x); }
  static F fzero() { return _mm256_setzero_ps(); }
  static F fload(const float* p) { return _mm256_loadu_ps(p); }
  static F load_half(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static float fhsum(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static F load_bf16(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
  }
};

void q4k(const GemmArgs& g) { drive<Q4KKern<Avx2>>(g); }
void q5k(const GemmArgs& g) { drive<Q5KKern<Avx2>>(g); }
void q6k(const GemmArgs& g) { drive<Q6KKern<Avx2>>(g); }
void q50(const GemmArgs& g) { drive<Q50Kern<Avx2>>(g); }
void q40(const GemmArgs& g) { drive<Q40Kern<Avx2>>(g); }
void mxfp4(const GemmArgs& g) { drive<Mxfp4Kern<Avx2>>(g); }
void q41(const GemmArgs& g) { drive<Q41Kern<Avx2>>(g); }
void q51(const GemmArgs& g) { drive<Q51Kern<Avx2>>(g); }
void q2k(const GemmArgs& g) { drive<Q2KKern<Avx2>>(g); }
void q3k(const GemmArgs& g) { drive<Q3KKern<Avx2>>(g); }
void q80(const GemmArgs& g) { drive<Q80Kern<Avx2>>(g); }
void f32(const GemmArgs& g) { drive<DenseKern<Avx2, Dense::kF32>>(g); }
void f16(const GemmArgs& g) { drive<DenseKern<Avx2, Dense::kF16>>(g); }
void bf16(const GemmArgs& g) { drive<DenseKern<Avx2, Dense::kBF16>>(g); }

}  // namespace

namespace tandem::kern::detail {

const GgufKernels& gguf_kernels_avx2() {
  static const GgufKernels k = [] {
    GgufKernels t{q4k, q5k, q6k, q80, f32, f16, bf16, q50, q40, q41, q51, q2k, q3k};
    t.mxfp4 = mxfp4;
    return t;
  }();
  return k;
}

}  // namespace tandem::kern::detail
