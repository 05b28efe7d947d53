// Attention with a sliding window and sinks (gpt-oss): ops::attention against the formula in
// double, the kernels on every ISA against ops::attention, a BF16 cache's kernel against
// ops::attention_bf16_segments, and one token at a time (decode) against the batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "core/cpu_features.h"
#include "core/fp_convert.h"
#include "core/thread_pool.h"
#include "core/topology.h"
#include "ops/cpu/kern_gguf.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/ref_ops.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using test::random_values;

// Attention of n tokens after pos0 cached positions over contiguous rows of heads / kv_heads
// heads of d values (keys and values side by side per position), scale 1/8.
ops::AttentionArgs args(const float* q, int64_t n, int64_t heads, int64_t kv_heads, int64_t d,
                        int64_t pos0, int64_t window, const float* sinks) {
  ops::AttentionArgs a;
  a.q = q;
  a.q_stride = heads * d;
  a.n_tokens = n;
  a.n_heads = heads;
  a.n_kv_heads = kv_heads;
  a.dk = a.dv = d;
  a.k_stride = a.v_stride = kv_heads * d;
  a.pos0 = pos0;
  a.scale = 0.125f;
  a.window = window;
  a.sinks = sinks;
  return a;
}

// The formula: query t (position pos0 + t), head h attends to positions
// max(0, p - window + 1) .. p; softmax over the scaled scores plus e^sink in the denominator.
std::vector<float> by_formula(const ops::AttentionArgs& a) {
  const int64_t group = a.n_heads / a.n_kv_heads;
  std::vector<float> out(static_cast<size_t>(a.n_tokens * a.n_heads * a.dv));
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const int64_t p = a.pos0 + t;
    const int64_t lo = a.window > 0 ? std::max<int64_t>(0, p - a.window + 1) : 0;
    for (int64_t h = 0; h < a.n_heads; ++h) {
      const int64_t g = h / group;
      std::vector<double> s;
      for (int64_t j = lo; j <= p; ++j) {
        double d = 0;
        for (int64_t i = 0; i < a.dk; ++i) {
          d += static_cast<double>(a.q[t * a.q_stride + h * a.dk + i]) *
               a.k[j * a.k_stride + g * a.dk + i];
        }
        s.push_back(d * a.scale);
      }
      double m = *std::max_element(s.begin(), s.end());
      if (a.sinks != nullptr) m = std::max(m, static_cast<double>(a.sinks[h]));
      double l = a.sinks != nullptr ? std::exp(a.sinks[h] - m) : 0.0;
      for (double& x : s) {
        x = std::exp(x - m);
        l += x;
      }
      for (int64_t i = 0; i < a.dv; ++i) {
        double o = 0;
        for (int64_t j = lo; j <= p; ++j) o += s[j - lo] * a.v[j * a.v_stride + g * a.dv + i];
        out[(t * a.n_heads + h) * a.dv + i] = static_cast<float>(o / l);
      }
    }
  }
  return out;
}

TEST(AttentionWindowSinks, ReferenceKernelsAndDecodeAgree) {
  ThreadPool pool(place_workers(detect_topology(), 2));
  // gpt-oss's 64 / 8 heads of 64, a GQA group of 2 with a tail dimension, MHA (one head per KV
  // head: the kernels' token blocks).
  for (auto [heads, kv_heads, d] : {std::tuple<int64_t, int64_t, int64_t>{64, 8, 64},
                                    {6, 3, 40},
                                    {4, 4, 16}}) {
    // Windows inside one segment, across a segment boundary (300 > 256), longer than the context.
    for (const int64_t window : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{128}, int64_t{300}}) {
      for (const bool sinks_on : {false, true}) {
        for (auto [pos0, n] : {std::pair<int64_t, int64_t>{0, 9}, {7, 40}, {250, 300}}) {
          if (heads == 64 && n == 300) continue;  // (time: the small shapes cover it)
          const int64_t ctx = pos0 + n;
          const std::vector<float> q = random_values(n * heads * d, 1);
          const std::vector<float> k = random_values(ctx * kv_heads * d, 2);
          const std::vector<float> v = random_values(ctx * kv_heads * d, 3);
          // Sinks of sd 3: below and above the scores (the sink the maximum, or not).
          const std::vector<float> sinks = random_values(heads, 4, 3.0f);
          ops::AttentionArgs a = args(q.data(), n, heads, kv_heads, d, pos0, window,
                                      sinks_on ? sinks.data() : nullptr);
          a.k = k.data();
          a.v = v.data();
          const std::string what = "heads " + std::to_string(heads) + " window " +
                                   std::to_string(window) + " sinks " +
                                   std::to_string(sinks_on) + " pos0 " + std::to_string(pos0);
          const std::vector<float> formula = by_formula(a);
          std::vector<float> want(formula.size());
          a.out = want.data();
          ops::attention(a, nullptr);
          for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_NEAR(want[i], formula[i], 2e-5f) << what << " reference " << i;
          }
          for (const Isa isa : supported_isas()) {
            std::vector<float> got(want.size());
            a.out = got.data();
            kern::attention(a, &pool, isa);
            for (size_t i = 0; i < want.size(); ++i) {
              ASSERT_NEAR(got[i], want[i], 2e-5f) << what << " " << isa_name(isa) << " " << i;
            }
            // Decode: one token at a time with the prefix cached gives the batch's bits.
            for (int64_t t = 0; t < n; t += (n > 50 ? 23 : 1)) {
              ops::AttentionArgs one = a;
              one.q = q.data() + t * heads * d;
              one.n_tokens = 1;
              one.pos0 = pos0 + t;
              std::vector<float> y(static_cast<size_t>(heads * d));
              one.out = y.data();
              kern::attention(one, &pool, isa);
              for (int64_t i = 0; i < heads * d; ++i) {
                ASSERT_EQ(y[i], got[t * heads * d + i]) << what << " " << isa_name(isa) << " t "
                                                        << t;
              }
            }
          }
        }
      }
    }
  }
}

// A BF16 cache: with the AVX-512 BF16 instructions the kernel's arithmetic is
// attention_bf16_segments' (segments from the window's first one, the sink folded last); on any
// other CPU it is ops::attention's on the cache widened (the F32 contract).
TEST(AttentionWindowSinks, Bf16CacheEqualsItsReference) {
  const bool dp = best_isa() >= Isa::kAvx512Bf16;
  ThreadPool pool(place_workers(detect_topology(), 2));
  const int64_t heads = 8, kv_heads = 2, d = 64, pos0 = 200, n = 120, ctx = pos0 + n;
  const std::vector<float> q = random_values(n * heads * d, 5);
  const std::vector<float> kf = random_values(ctx * kv_heads * d, 6);
  const std::vector<float> vf = random_values(ctx * kv_heads * d, 7);
  const std::vector<float> sinks = random_values(heads, 8, 2.0f);
  std::vector<uint16_t> kb(kf.size()), vb(vf.size());
  for (size_t i = 0; i < kf.size(); ++i) kb[i] = f32_to_bf16(kf[i]);
  for (size_t i = 0; i < vf.size(); ++i) vb[i] = f32_to_bf16(vf[i]);
  for (const int64_t window : {int64_t{0}, int64_t{100}}) {
    ops::AttentionArgs a = args(q.data(), n, heads, kv_heads, d, pos0, window, sinks.data());
    a.k16 = kb.data();
    a.v16 = vb.data();
    std::vector<float> want(static_cast<size_t>(n * heads * d)), got(want.size());
    a.out = want.data();
    if (dp) {
      ops::attention_bf16_segments(a, kern::detail::kSegment);
    } else {
      ops::attention(a, nullptr);
    }
    a.out = got.data();
    kern::attention(a, &pool);
    // (The tolerances of KernelsAttention.Bf16CacheEqualsReference: with the BF16 instructions a
    // probability at a BF16 rounding tie rounds either way.)
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], dp ? 1e-3f : 2e-5f) << "window " << window << " " << i;
    }
  }
}

}  // namespace
}  // namespace tandem
