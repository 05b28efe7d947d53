// The Gated DeltaNet kernels of ops/cuda/delta_net.h against the CPU references of
// ops/cpu/delta_net.h: the projections' split (beta, the decay), the causal convolution and the
// delta rule over segments of several sequences (a checkpoint inside a sequence's tokens, one at
// its start, a sequence of one token, grouped and tiled value heads, key heads of 32, 48 and 128
// rows), the q / k normalization and the output gate; within F32 rounding. Label gpu: skipped
// (exit 77) without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "tests/gpu/gpu_gate.h"

#ifdef TANDEM_HAVE_CUDA
#include "ops/cpu/delta_net.h"
#include "ops/cuda/cuda_util.h"
#include "ops/cuda/delta_net.h"

namespace tandem {
namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

template <typename T>
DeviceBuffer up(const std::vector<T>& v) {
  DeviceBuffer b(std::max<size_t>(1, v.size()) * sizeof(T));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(T));
  return b;
}

template <typename T>
std::vector<T> down(const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  b.download(v.data(), n * sizeof(T));
  return v;
}

// max |got - want| <= tol (1 + max |want|).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double md = 0, mr = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    md = std::max(md, std::fabs(static_cast<double>(got[i]) - want[i]));
    mr = std::max(mr, std::fabs(static_cast<double>(want[i])));
  }
  EXPECT_LE(md, tol * (1.0 + mr)) << what << ": max |d| " << md << ", max |ref| " << mr;
}

TEST(CudaDeltaNet, PrepSplitsTheProjections) {
  std::mt19937 rng(1);
  const int64_t n = 7, width = 61, ch = 24, vdim = 12, nv = 3;
  const std::vector<float> mixed = randn(static_cast<size_t>(n * width), rng, 3.0f);
  std::vector<int32_t> perm(static_cast<size_t>(width));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::vector<int32_t> conv_src(perm.begin(), perm.begin() + ch);
  const std::vector<int32_t> z_src(perm.begin() + ch, perm.begin() + ch + vdim);
  const std::vector<int32_t> beta_src(perm.begin() + 40, perm.begin() + 43);
  const std::vector<int32_t> alpha_src(perm.begin() + 43, perm.begin() + 46);
  std::vector<float> a = {-0.5f, -2.0f, -0.01f}, dt = {0.1f, 25.0f, -3.0f};
  DeviceBuffer dm = up(mixed), dc = up(conv_src), dz = up(z_src), db = up(beta_src),
               da = up(alpha_src), dA = up(a), ddt = up(dt);
  DeviceBuffer oc(n * ch * 4), oz(n * vdim * 4), ob(n * nv * 4), og(n * nv * 4);
  ASSERT_EQ(delta_prep_cuda(dm.as<float>(), n, width, dc.as<int32_t>(), ch, dz.as<int32_t>(), vdim,
                            db.as<int32_t>(), da.as<int32_t>(), dA.as<float>(), ddt.as<float>(), nv,
                            oc.as<float>(), oz.as<float>(), ob.as<float>(), og.as<float>(), nullptr),
            cudaSuccess);
  TD_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> wc, wz, wb, wg;
  for (int64_t t = 0; t < n; ++t) {
    const float* row = mixed.data() + t * width;
    for (int32_t i : conv_src) wc.push_back(row[i]);
    for (int32_t i : z_src) wz.push_back(row[i]);
    for (int64_t h = 0; h < nv; ++h) {
      wb.push_back(ops::sigmoid(row[beta_src[h]]));
      wg.push_back(a[h] * ops::softplus(row[alpha_src[h]] + dt[h]));
    }
  }
  EXPECT_EQ(down<float>(oc, wc.size()), wc);
  EXPECT_EQ(down<float>(oz, wz.size()), wz);
  expect_close(down<float>(ob, wb.size()), wb, 1e-6, "beta");
  expect_close(down<float>(og, wg.size()), wg, 1e-6, "decay");
}

// Sequences of a step as the forward cuts them: (tokens, checkpoint offsets).
struct SeqPlan {
  int64_t n;
  std::vector<int64_t> checkpoints;
};

const std::vector<SeqPlan>& plans() {
  static const std::vector<SeqPlan> p = {
      {37, {16, 30}},  // prefill with two checkpoints inside
      {1, {}},         // decode
      {5, {0}},        // a checkpoint at its start
      {20, {20}},      // one at its end
  };
  return p;
}

// Runs `launch(segs)` round by round over plans(): each sequence's segments cut at its
// checkpoints, as the CUDA forward ops do; state of sequence i at states + i * per_seq, its
// checkpoint c at snaps + (i * 4 + c) * per_seq.
template <typename F>
void run_rounds(float* states, float* snaps, int64_t per_seq, F&& launch) {
  std::vector<std::vector<DeltaSegment>> rounds;
  int64_t t0 = 0;
  for (size_t i = 0; i < plans().size(); ++i) {
    const SeqPlan& p = plans()[i];
    int64_t done = 0;
    size_t r = 0;
    auto add = [&](int64_t end, float* snap) {
      if (rounds.size() <= r) rounds.emplace_back();
      rounds[r++].push_back(DeltaSegment{t0 + done, end - done, states + i * per_seq, snap});
      done = end;
    };
    for (size_t c = 0; c < p.checkpoints.size(); ++c) {
      add(p.checkpoints[c], snaps + (i * 4 + c) * per_seq);
    }
    if (done < p.n || r == 0) add(p.n, nullptr);
    t0 += p.n;
  }
  for (const auto& round : rounds) {
    DeltaSegments segs;
    segs.count = static_cast<int>(round.size());
    for (size_t i = 0; i < round.size(); ++i) segs.s[i] = round[i];
    ASSERT_EQ(launch(segs), cudaSuccess);
  }
  TD_CUDA_CHECK(cudaDeviceSynchronize());
}

int64_t total_tokens() {
  int64_t n = 0;
  for (const SeqPlan& p : plans()) n += p.n;
  return n;
}

TEST(CudaDeltaNet, ConvolutionOverSegmentsWithCheckpoints) {
  std::mt19937 rng(2);
  const int64_t K = 4, ch = 200, n = total_tokens(), per = (K - 1) * ch;
  const int64_t seqs = static_cast<int64_t>(plans().size());
  const std::vector<float> w = randn(static_cast<size_t>(ch * K), rng, 0.5f);  // [ch][K]
  std::vector<float> wt(static_cast<size_t>(K * ch));
  for (int64_t c = 0; c < ch; ++c) {
    for (int64_t j = 0; j < K; ++j) wt[j * ch + c] = w[c * K + j];
  }
  const std::vector<float> x = randn(static_cast<size_t>(n * ch), rng);
  std::vector<float> windows = randn(static_cast<size_t>(seqs * per), rng);
  DeviceBuffer dw = up(wt), dx = up(x), dst = up(windows), dout(n * ch * 4);
  DeviceBuffer dsnap(seqs * 4 * per * 4);
  dsnap.fill_zero();
  run_rounds(dst.as<float>(), dsnap.as<float>(), per, [&](const DeltaSegments& s) {
    return conv_silu_cuda(dw.as<float>(), K, ch, s, dx.as<float>(), dout.as<float>(), nullptr);
  });
  std::vector<float> want(static_cast<size_t>(n * ch)), snaps(static_cast<size_t>(seqs * 4 * per));
  int64_t t0 = 0;
  for (size_t i = 0; i < plans().size(); ++i) {
    const SeqPlan& p = plans()[i];
    float* win = windows.data() + i * per;
    int64_t done = 0;
    auto run_to = [&](int64_t end) {
      ops::conv_silu_reference(w.data(), K, ch, win, x.data() + (t0 + done) * ch, ch, end - done,
                               want.data() + (t0 + done) * ch, ch);
      done = end;
    };
    for (size_t c = 0; c < p.checkpoints.size(); ++c) {
      run_to(p.checkpoints[c]);
      std::copy(win, win + per, snaps.begin() + static_cast<int64_t>(i * 4 + c) * per);
    }
    run_to(p.n);
    t0 += p.n;
  }
  expect_close(down<float>(dout, want.size()), want, 1e-5, "outputs");
  EXPECT_EQ(down<float>(dst, windows.size()), windows);  // the windows: copies of inputs
  EXPECT_EQ(down<float>(dsnap, snaps.size()), snaps);
  // Too wide a convolution is refused before any launch.
  DeltaSegments none;
  EXPECT_EQ(conv_silu_cuda(dw.as<float>(), 9, ch, none, dx.as<float>(), dout.as<float>(), nullptr),
            cudaErrorInvalidValue);
}

TEST(CudaDeltaNet, QueriesAndKeysNormalized) {
  std::mt19937 rng(3);
  const int64_t n = 9, nk = 3, hk = 48, ch = 2 * nk * hk + 70;
  std::vector<float> rows = randn(static_cast<size_t>(n * ch), rng, 4.0f);
  rows[5] = 0.0f;  // (a head of zeros stays zeros: eps bounds the scale)
  DeviceBuffer d = up(rows);
  const float eps = 1e-6f, qs = 1.0f / std::sqrt(static_cast<float>(hk));
  ASSERT_EQ(l2_normalize_qk_cuda(d.as<float>(), n, ch, nk, hk, eps, qs, nullptr), cudaSuccess);
  TD_CUDA_CHECK(cudaDeviceSynchronize());
  for (int64_t t = 0; t < n; ++t) {
    float* r = rows.data() + t * ch;
    for (int64_t h = 0; h < nk; ++h) {
      ops::l2_normalize(r + h * hk, hk, eps);
      for (int64_t j = 0; j < hk; ++j) r[h * hk + j] *= qs;
      ops::l2_normalize(r + nk * hk + h * hk, hk, eps);
    }
  }
  expect_close(down<float>(d, rows.size()), rows, 1e-6, "rows");
}

struct RuleCase {
  int64_t nk, nv, hk, hv;
  bool tiled;
};

class CudaDeltaRule : public ::testing::TestWithParam<RuleCase> {};

TEST_P(CudaDeltaRule, EqualsTheReferenceOverSegmentsWithCheckpoints) {
  const RuleCase rc = GetParam();
  std::mt19937 rng(4);
  const int64_t n = total_tokens(), seqs = static_cast<int64_t>(plans().size());
  const int64_t qk = rc.nk * rc.hk, ch = 2 * qk + rc.nv * rc.hv, window = 3 * ch;
  const int64_t per = window + rc.nv * rc.hk * rc.hv;
  // Normalized q / k (q scaled), decays in (-1, 0), strengths in (0, 1), as the layer feeds it.
  std::vector<float> qkv = randn(static_cast<size_t>(n * ch), rng);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < 2 * rc.nk; ++h) {
      ops::l2_normalize(qkv.data() + t * ch + h * rc.hk, rc.hk, 1e-6f);
    }
  }
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> g(static_cast<size_t>(n * rc.nv)), beta(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = -u(rng);
    beta[i] = u(rng);
  }
  std::vector<float> states = randn(static_cast<size_t>(seqs * per), rng, 0.1f);
  DeviceBuffer dq = up(qkv), dg = up(g), db = up(beta), dst = up(states),
               dout(n * rc.nv * rc.hv * 4), dsnap(seqs * 4 * per * 4);
  dsnap.fill_zero();
  DeltaRuleShape sh;
  sh.nk = rc.nk;
  sh.nv = rc.nv;
  sh.hk = rc.hk;
  sh.hv = rc.hv;
  sh.channels = ch;
  sh.window = window;
  sh.tiled = rc.tiled;
  run_rounds(dst.as<float>(), dsnap.as<float>(), per, [&](const DeltaSegments& s) {
    return delta_rule_cuda(sh, s, dq.as<float>(), dg.as<float>(), db.as<float>(),
                           dout.as<float>(), nullptr);
  });
  const int64_t vdim = rc.nv * rc.hv;
  std::vector<float> want(static_cast<size_t>(n * vdim));
  std::vector<float> snaps(static_cast<size_t>(seqs * 4 * per));
  const std::vector<float> snaps_got = down<float>(dsnap, snaps.size());
  int64_t t0 = 0;
  for (size_t i = 0; i < plans().size(); ++i) {
    const SeqPlan& p = plans()[i];
    for (int64_t h = 0; h < rc.nv; ++h) {
      const int64_t kh = rc.tiled ? h % rc.nk : h / (rc.nv / rc.nk);
      float* st = states.data() + i * per + window + h * rc.hk * rc.hv;
      int64_t done = 0;
      auto run_to = [&](int64_t end) {
        ops::DeltaRuleArgs a;
        a.n = end - done;
        a.dk = rc.hk;
        a.dv = rc.hv;
        const int64_t t = t0 + done;
        a.q = qkv.data() + t * ch + kh * rc.hk;
        a.k = a.q + qk;
        a.v = qkv.data() + t * ch + 2 * qk + h * rc.hv;
        a.q_stride = a.k_stride = a.v_stride = ch;
        a.g = g.data() + t * rc.nv + h;
        a.beta = beta.data() + t * rc.nv + h;
        a.g_stride = a.beta_stride = rc.nv;
        a.state = st;
        a.out = want.data() + t * vdim + h * rc.hv;
        a.out_stride = vdim;
        if (a.n > 0) ops::delta_rule_reference(a);
        done = end;
      };
      for (size_t c = 0; c < p.checkpoints.size(); ++c) {
        run_to(p.checkpoints[c]);
        const int64_t at = static_cast<int64_t>(i * 4 + c) * per + window + h * rc.hk * rc.hv;
        std::copy(st, st + rc.hk * rc.hv, snaps.begin() + at);
      }
      run_to(p.n);
    }
    t0 += p.n;
  }
  expect_close(down<float>(dout, want.size()), want, 2e-5, "outputs");
  expect_close(down<float>(dst, states.size()), states, 2e-5, "states");
  expect_close(snaps_got, snaps, 2e-5, "checkpoints");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaDeltaRule,
                         ::testing::Values(RuleCase{2, 4, 32, 32, false},
                                           RuleCase{2, 4, 48, 40, true},
                                           RuleCase{1, 2, 128, 128, false},
                                           RuleCase{2, 6, 128, 72, true},
                                           RuleCase{1, 1, 256, 64, false}));

TEST(CudaDeltaNet, OutputGate) {
  std::mt19937 rng(5);
  const std::vector<float> x = randn(1000, rng, 2.0f), gate = randn(1000, rng, 3.0f);
  DeviceBuffer dx = up(x), dg = up(gate);
  ASSERT_EQ(sigmoid_mul_cuda(dx.as<float>(), dg.as<float>(), 1000, nullptr), cudaSuccess);
  TD_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] * ops::sigmoid(gate[i]);
  expect_close(down<float>(dx, want.size()), want, 1e-6, "gated");
}

}  // namespace
}  // namespace tandem
#endif

int main(int argc, char** argv) {
  return tandem::test::gpu_test_main(argc, argv);
}
