// The Gated DeltaNet ops: the references (ops::) and the kernels' dispatch (kern::), the scalar
// level instantiated here (delta_net_impl.h).
#include "ops/cpu/delta_net.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "ops/cpu/delta_net_impl.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/ref_ops.h"

namespace tandem::ops {

void delta_rule_reference(const DeltaRuleArgs& a) {
  const int64_t dk = a.dk, dv = a.dv;
  std::vector<float> kv(static_cast<size_t>(dv));
  for (int64_t t = 0; t < a.n; ++t) {
    const float* q = a.q + t * a.q_stride;
    const float* k = a.k + t * a.k_stride;
    const float* v = a.v + t * a.v_stride;
    float* o = a.out + t * a.out_stride;
    const float eg = std::exp(a.g[t * a.g_stride]);
    const float beta = a.beta[t * a.beta_stride];
    for (int64_t i = 0; i < dk * dv; ++i) a.state[i] *= eg;
    for (int64_t i = 0; i < dv; ++i) {
      float sum = 0.0f;
      for (int64_t j = 0; j < dk; ++j) sum += a.state[j * dv + i] * k[j];
      kv[static_cast<size_t>(i)] = (v[i] - sum) * beta;
    }
    for (int64_t j = 0; j < dk; ++j) {
      for (int64_t i = 0; i < dv; ++i) a.state[j * dv + i] += k[j] * kv[static_cast<size_t>(i)];
    }
    for (int64_t i = 0; i < dv; ++i) {
      float sum = 0.0f;
      for (int64_t j = 0; j < dk; ++j) sum += a.state[j * dv + i] * q[j];
      o[i] = sum;
    }
  }
}

void l2_normalize(float* x, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::fmax(std::sqrt(static_cast<float>(sum)), eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

float softplus(float x) {
  return x > 20.0f ? x : std::log(1.0f + std::exp(x));
}

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

void conv_silu_reference(const float* w, int64_t K, int64_t channels, float* window,
                         const float* x, int64_t x_stride, int64_t n, float* out,
                         int64_t out_stride) {
  // The inputs in order: the window's K - 1, then the n tokens'.
  std::vector<float> in(static_cast<size_t>((K - 1 + n) * channels));
  std::memcpy(in.data(), window, static_cast<size_t>((K - 1) * channels) * 4);
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(in.data() + (K - 1 + t) * channels, x + t * x_stride,
                static_cast<size_t>(channels) * 4);
  }
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < channels; ++c) {
      float sum = 0.0f;
      for (int64_t j = 0; j < K; ++j) sum += w[c * K + j] * in[(t + j) * channels + c];
      out[t * out_stride + c] = silu(sum);
    }
  }
  std::memcpy(window, in.data() + n * channels, static_cast<size_t>((K - 1) * channels) * 4);
}

}  // namespace tandem::ops

namespace tandem::kern {

void delta_rule_recurrent(const ops::DeltaRuleArgs& a, Isa isa) {
  if (isa >= Isa::kAvx512) {
    detail::delta_rule_recurrent_avx512(a);
  } else if (isa >= Isa::kAvx2) {
    detail::delta_rule_recurrent_avx2(a);
  } else {
    detail::delta_rule_recurrent_impl<detail::Scalar>(a);
  }
}

void delta_rule_chunked(const ops::DeltaRuleArgs& a, int64_t pos0, Isa isa) {
  if (isa >= Isa::kAvx512) {
    detail::delta_rule_chunked_avx512(a, pos0);
  } else if (isa >= Isa::kAvx2) {
    detail::delta_rule_chunked_avx2(a, pos0);
  } else {
    detail::delta_rule_chunked_impl<detail::Scalar>(a, pos0);
  }
}

void conv_silu(const float* wt, int64_t K, int64_t channels, float* window, const float* x,
               int64_t x_stride, int64_t n, float* out, int64_t out_stride, Isa isa) {
  if (n <= 0) return;
  thread_local std::vector<float> in, ones;
  in.resize(static_cast<size_t>((K - 1 + n) * channels));
  std::memcpy(in.data(), window, static_cast<size_t>((K - 1) * channels) * 4);
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(in.data() + (K - 1 + t) * channels, x + t * x_stride,
                static_cast<size_t>(channels) * 4);
  }
  if (isa >= Isa::kAvx512) {
    detail::conv_avx512(wt, K, channels, in.data(), n, out, out_stride);
  } else if (isa >= Isa::kAvx2) {
    detail::conv_avx2(wt, K, channels, in.data(), n, out, out_stride);
  } else {
    detail::conv_impl<detail::Scalar>(wt, K, channels, in.data(), n, out, out_stride);
  }
  // silu(y) = swiglu's silu(y) * 1, bit for bit at every level.
  ones.assign(static_cast<size_t>(channels), 1.0f);
  for (int64_t t = 0; t < n; ++t) {
    float* o = out + t * out_stride;
    swiglu(o, ones.data(), channels, o, isa);
  }
  std::memcpy(window, in.data() + n * channels, static_cast<size_t>((K - 1) * channels) * 4);
}

}  // namespace tandem::kern
