// The Gated DeltaNet kernels at the AVX2 level (delta_net_impl.h), compiled with -mavx2 -mfma.
#include <immintrin.h>

#include "ops/cpu/delta_net_impl.h"

namespace tandem::kern::detail {
namespace {

struct Avx2 {
  using F = __m256;
  static constexpr int kLanes = 8;
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F zero() { return _mm256_setzero_ps(); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
};

}  // namespace

void delta_rule_recurrent_avx2(const ops::DeltaRuleArgs& a) {
  delta_rule_recurrent_impl<Avx2>(a);
}
void delta_rule_chunked_avx2(const ops::DeltaRuleArgs& a, int64_t pos0) {
  delta_rule_chunked_impl<Avx2>(a, pos0);
}
void conv_avx2(const float* wt, int64_t K, int64_t channels, const float* in, int64_t n,
               float* out, int64_t out_stride) {
  conv_impl<Avx2>(wt, K, channels, in, n, out, out_stride);
}

}  // namespace tandem::kern::detail
