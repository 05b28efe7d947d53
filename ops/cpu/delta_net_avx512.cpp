// The Gated DeltaNet kernels at the AVX-512 level (delta_net_impl.h), compiled with -mavx512f.
#include <immintrin.h>

#include "ops/cpu/delta_net_impl.h"

namespace tandem::kern::detail {
namespace {

struct Avx512 {
  using F = __m512;
  static constexpr int kLanes = 16;
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F zero() { return _mm512_setzero_ps(); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
};

}  // namespace

void delta_rule_recurrent_avx512(const ops::DeltaRuleArgs& a) {
  delta_rule_recurrent_impl<Avx512>(a);
}
void delta_rule_chunked_avx512(const ops::DeltaRuleArgs& a, int64_t pos0) {
  delta_rule_chunked_impl<Avx512>(a, pos0);
}
void conv_avx512(const float* wt, int64_t K, int64_t channels, const float* in, int64_t n,
               float* out, int64_t out_stride) {
  conv_impl<Avx512>(wt, K, channels, in, n, out, out_stride);
}

}  // namespace tandem::kern::detail
