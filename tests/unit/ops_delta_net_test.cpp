// The Gated DeltaNet ops (ops/cpu/delta_net.h): the kernels at every ISA level give the scalar
// level's bits (recurrent, chunked, convolution); the scalar level against the references (the
// formulas as transformers writes them) within float rounding; the chunked form cut into pieces
// at its chunk boundaries gives one call's bits; the chunked and recurrent forms agree on 4,096
// tokens within a stated bound; the scalar helpers against their formulas in double.
#include "ops/cpu/delta_net.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/cpu_features.h"

namespace tandem {
namespace {

// One head's inputs for n tokens: q, k L2-normalized (q scaled), v, decays and strengths with
// the spread a trained layer has (g in [-4, -0.001]: a head that forgets in a few tokens to one
// that keeps thousands), a random starting state.
struct Head {
  int64_t n, dk, dv;
  std::vector<float> q, k, v, g, beta, state;
};

Head make_head(int64_t n, int64_t dk, int64_t dv, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  Head h{n, dk, dv, {}, {}, {}, {}, {}, {}};
  h.q.resize(static_cast<size_t>(n * dk));
  h.k.resize(h.q.size());
  h.v.resize(static_cast<size_t>(n * dv));
  for (float& x : h.q) x = normal(rng);
  for (float& x : h.k) x = normal(rng);
  for (float& x : h.v) x = normal(rng);
  for (int64_t t = 0; t < n; ++t) {
    ops::l2_normalize(&h.q[static_cast<size_t>(t * dk)], dk, 1e-6f);
    ops::l2_normalize(&h.k[static_cast<size_t>(t * dk)], dk, 1e-6f);
    for (int64_t j = 0; j < dk; ++j) h.q[static_cast<size_t>(t * dk + j)] /= std::sqrt(float(dk));
    h.g.push_back(-std::exp(unit(rng) * 8.0f - 7.0f));
    h.beta.push_back(unit(rng));
  }
  h.state.resize(static_cast<size_t>(dk * dv));
  for (float& x : h.state) x = 0.3f * normal(rng);
  return h;
}

ops::DeltaRuleArgs args(Head& h, float* state, float* out, int64_t t0 = 0, int64_t n = -1) {
  ops::DeltaRuleArgs a;
  a.n = n < 0 ? h.n - t0 : n;
  a.dk = h.dk;
  a.dv = h.dv;
  a.q = h.q.data() + t0 * h.dk;
  a.q_stride = h.dk;
  a.k = h.k.data() + t0 * h.dk;
  a.k_stride = h.dk;
  a.v = h.v.data() + t0 * h.dv;
  a.v_stride = h.dv;
  a.g = h.g.data() + t0;
  a.beta = h.beta.data() + t0;
  a.state = state;
  a.out = out + t0 * h.dv;
  a.out_stride = h.dv;
  return a;
}

// max |a - b| / max |b|.
double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    d = std::max(d, std::fabs(double(a[i]) - b[i]));
    m = std::max(m, std::fabs(double(b[i])));
  }
  return d / m;
}

struct Result {
  std::vector<float> out, state;
};

Result recurrent(Head h, Isa isa) {
  Result r{std::vector<float>(static_cast<size_t>(h.n * h.dv)), h.state};
  kern::delta_rule_recurrent(args(h, r.state.data(), r.out.data()), isa);
  return r;
}
Result chunked(Head h, Isa isa, int64_t pos0 = 0) {
  Result r{std::vector<float>(static_cast<size_t>(h.n * h.dv)), h.state};
  kern::delta_rule_chunked(args(h, r.state.data(), r.out.data()), pos0, isa);
  return r;
}
Result reference(Head h) {
  Result r{std::vector<float>(static_cast<size_t>(h.n * h.dv)), h.state};
  ops::delta_rule_reference(args(h, r.state.data(), r.out.data()));
  return r;
}

struct Shape {
  int64_t n, dk, dv;
};
// Heads of Qwen3.5 (128), the tiny goldens (32), and widths with a tail for every lane count.
constexpr Shape kShapes[] = {{1, 128, 128}, {5, 32, 32}, {70, 128, 128},
                             {130, 48, 48}, {65, 20, 20}, {200, 32, 32}};

TEST(DeltaRule, EveryLevelGivesTheScalarBits) {
  for (const Shape& s : kShapes) {
    const Head h = make_head(s.n, s.dk, s.dv, 3);
    const Result rs = recurrent(h, Isa::kScalar), cs = chunked(h, Isa::kScalar, 17);
    for (int level = 1; level <= static_cast<int>(best_isa()); ++level) {
      const Isa isa = static_cast<Isa>(level);
      const Result r = recurrent(h, isa), c = chunked(h, isa, 17);
      EXPECT_EQ(r.out, rs.out) << isa_name(isa) << " n " << s.n << " d " << s.dk;
      EXPECT_EQ(r.state, rs.state) << isa_name(isa);
      EXPECT_EQ(c.out, cs.out) << isa_name(isa) << " chunked n " << s.n << " d " << s.dk;
      EXPECT_EQ(c.state, cs.state) << isa_name(isa);
    }
  }
}

// Against the formula token by token, max |d| / max |want| of outputs and states: the recurrent
// form within float rounding (its sums fused chains, the reference's separate products; measured
// <= 1.6e-7, bound 2e-6), the chunked form within the WY representation's reassociation
// (measured <= 1.3e-6, bound 2e-5).
TEST(DeltaRule, KernelsMatchTheReference) {
  for (const Shape& s : kShapes) {
    const Head h = make_head(s.n, s.dk, s.dv, 5);
    const Result want = reference(h);
    const Result r = recurrent(h, Isa::kScalar), c = chunked(h, best_isa());
    EXPECT_LE(rel(r.out, want.out), 2e-6) << "n " << s.n << " d " << s.dk;
    EXPECT_LE(rel(r.state, want.state), 2e-6);
    EXPECT_LE(rel(c.out, want.out), 2e-5) << "chunked n " << s.n << " d " << s.dk;
    EXPECT_LE(rel(c.state, want.state), 2e-5);
    EXPECT_GT(rel(want.state, h.state), 0.01);  // (the state moved)
  }
}

// Chunks fall on multiples of kDeltaChunk of the position: a sequence fed in pieces cut there
// gives one call's bits; cut elsewhere (another chunking), float rounding.
TEST(DeltaRule, ChunkedPiecesAtChunkBoundariesGiveOneCallsBits) {
  Head h = make_head(300, 32, 32, 7);
  const int64_t pos0 = 40;  // the first chunk holds 24 tokens
  const Result whole = chunked(h, best_isa(), pos0);
  for (const std::vector<int64_t> cuts : {std::vector<int64_t>{24, 88, 216},
                                          std::vector<int64_t>{24, 152}}) {
    Result r{std::vector<float>(whole.out.size()), h.state};
    int64_t t = 0;
    for (size_t i = 0; i <= cuts.size(); ++i) {
      const int64_t end = i < cuts.size() ? cuts[i] : h.n;
      kern::delta_rule_chunked(args(h, r.state.data(), r.out.data(), t, end - t), pos0 + t);
      t = end;
    }
    EXPECT_EQ(r.out, whole.out);
    EXPECT_EQ(r.state, whole.state);
  }
  Result odd{std::vector<float>(whole.out.size()), h.state};
  kern::delta_rule_chunked(args(h, odd.state.data(), odd.out.data(), 0, 100), pos0);
  kern::delta_rule_chunked(args(h, odd.state.data(), odd.out.data(), 100), pos0 + 100);
  EXPECT_NE(odd.out, whole.out);
  EXPECT_LE(rel(odd.out, whole.out), 2e-5);
}

// The two forms on 4,096 tokens of Qwen3.5's head size, from an empty state: the chunked form's
// outputs within 1e-4 of max |out| of the recurrence's (measured 1.5e-6), the final state too
// (9e-7).
TEST(DeltaRule, ChunkedAndRecurrentAgreeOn4096Tokens) {
  Head h = make_head(4096, 128, 128, 9);
  std::fill(h.state.begin(), h.state.end(), 0.0f);
  const Result r = recurrent(h, best_isa()), c = chunked(h, best_isa());
  const double out = rel(c.out, r.out), state = rel(c.state, r.state);
  std::printf("chunked vs recurrent, 4096 tokens: outputs %.3g, state %.3g of max\n", out, state);
  EXPECT_LE(out, 1e-4);
  EXPECT_LE(state, 1e-4);
}

// The convolution: every level the scalar bits, the scalar level within rounding of the
// reference (fused vs separate products), the window the last K - 1 inputs (bit for bit), and
// a sequence fed in pieces gives one call's bits.
TEST(CausalConv, LevelsReferenceWindowAndPieces) {
  const int64_t K = 4;
  for (const int64_t channels : {int64_t{8192}, int64_t{256}, int64_t{77}}) {
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t n = 37;
    std::vector<float> w(static_cast<size_t>(channels * K)), wt(w.size());
    std::vector<float> x(static_cast<size_t>(n * channels)), win0(static_cast<size_t>((K - 1) * channels));
    for (float& v : w) v = 0.5f * normal(rng);
    for (float& v : x) v = normal(rng);
    for (float& v : win0) v = normal(rng);
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t j = 0; j < K; ++j) wt[j * channels + c] = w[c * K + j];
    }
    std::vector<float> want(x.size()), win_ref = win0;
    ops::conv_silu_reference(w.data(), K, channels, win_ref.data(), x.data(), channels, n,
                             want.data(), channels);
    std::vector<float> scalar(x.size()), win_s = win0;
    kern::conv_silu(wt.data(), K, channels, win_s.data(), x.data(), channels, n, scalar.data(),
                    channels, Isa::kScalar);
    EXPECT_LE(rel(scalar, want), 1e-6) << channels;
    EXPECT_EQ(win_s, win_ref);
    EXPECT_EQ(std::vector<float>(win_s.begin(), win_s.end()),
              std::vector<float>(x.end() - (K - 1) * channels, x.end()));
    for (int level = 1; level <= static_cast<int>(best_isa()); ++level) {
      std::vector<float> got(x.size()), win = win0;
      kern::conv_silu(wt.data(), K, channels, win.data(), x.data(), channels, n, got.data(),
                      channels, static_cast<Isa>(level));
      EXPECT_EQ(got, scalar) << isa_name(static_cast<Isa>(level)) << " " << channels;
    }
    std::vector<float> pieces(x.size()), win = win0;
    for (int64_t t0 : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{20}}) {
      const int64_t t1 = t0 == 0 ? 1 : t0 == 1 ? 3 : t0 == 3 ? 20 : n;
      kern::conv_silu(wt.data(), K, channels, win.data(), x.data() + t0 * channels, channels,
                      t1 - t0, pieces.data() + t0 * channels, channels);
    }
    std::vector<float> one(x.size()), w1 = win0;
    kern::conv_silu(wt.data(), K, channels, w1.data(), x.data(), channels, n, one.data(),
                    channels);
    EXPECT_EQ(pieces, one);
    EXPECT_EQ(win, w1);
  }
}

TEST(DeltaNetHelpers, AgainstTheirFormulas) {
  std::vector<float> x = {3.0f, -4.0f, 0.0f, 12.0f};
  ops::l2_normalize(x.data(), 4, 1e-6f);
  EXPECT_FLOAT_EQ(x[0], 3.0f / 13.0f);
  EXPECT_FLOAT_EQ(x[3], 12.0f / 13.0f);
  std::vector<float> tiny = {1e-9f, 0.0f};
  ops::l2_normalize(tiny.data(), 2, 1e-6f);  // ggml: divided by max(||x||, eps)
  EXPECT_FLOAT_EQ(tiny[0], 1e-3f);
  for (const double v : {-30.0, -2.5, 0.0, 0.7, 19.9, 20.1, 60.0}) {
    EXPECT_NEAR(ops::softplus(float(v)), v > 20 ? v : std::log1p(std::exp(v)),
                1e-6 * std::max(1.0, std::fabs(v)))
        << v;
    EXPECT_NEAR(ops::sigmoid(float(v)), 1.0 / (1.0 + std::exp(-v)), 1e-7) << v;
  }
}

}  // namespace
}  // namespace tandem
