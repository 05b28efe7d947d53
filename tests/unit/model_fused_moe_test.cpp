// FusedMoeBackend (moe/fused_moe.h) against two independent expectations:
//  - exactly: the same arithmetic written out directly (per expert: quantize its tokens, the
//    kernels for gate and up over all rows at once, SiLU * up, quantize, down, combine in slot
//    order). A row's result does not depend on how rows are chunked, so any error in the task
//    decomposition (chunking, per-expert dependencies, gathering, masks) shows as a mismatch;
//  - approximately: the F32-activation reference backend (CpuMoeBackend), within the activation
//    quantization error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/topology.h"
#include "formats/quant.h"
#include "moe/fused_moe.h"
#include "model/weights.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/packed.h"
#include "ops/cpu/q4k_x16.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {
namespace {

constexpr int64_t kExperts = 8, kHidden = 256, kFf = 512, kTopK = 3;

struct Experts {
  std::vector<std::vector<uint8_t>> bytes;
  ExpertWeights w;
};

Tensor quantized(DType dt, int64_t rows, int64_t cols, std::mt19937& rng,
                 std::vector<std::vector<uint8_t>>& store) {
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> f(static_cast<size_t>(rows * cols));
  for (float& v : f) v = nd(rng);
  const int64_t rb = static_cast<int64_t>(dtype_bytes(dt, cols));
  store.emplace_back(static_cast<size_t>(rb * rows));
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(dt, f.data() + r * cols, store.back().data() + r * rb, cols);
  return Tensor::dense(dt, {rows, cols}, store.back().data());
}

// gate/up in `gu`, down in `dn`; expert 5 in Q8_1, which has no fast kernel (reference path).
Experts make_experts(DType gu, DType dn) {
  std::mt19937 rng(17);
  Experts e;
  e.bytes.reserve(3 * kExperts);
  for (int64_t i = 0; i < kExperts; ++i) {
    const DType g = i == 5 ? DType::kQ8_1 : gu;
    e.w.gate.push_back(quantized(g, kFf, kHidden, rng, e.bytes));
    e.w.up.push_back(quantized(g, kFf, kHidden, rng, e.bytes));
    e.w.down.push_back(quantized(i == 5 ? DType::kQ8_1 : dn, kHidden, kFf, rng, e.bytes));
  }
  return e;
}

struct Routing {
  std::vector<float> x, w;
  std::vector<int32_t> ids;
};

Routing make_routing(int64_t t, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Routing r;
  r.x.resize(static_cast<size_t>(t * kHidden));
  for (float& v : r.x) v = nd(rng);
  for (int64_t i = 0; i < t; ++i) {
    std::vector<int32_t> all(kExperts);
    for (int32_t e = 0; e < kExperts; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), rng);
    for (int64_t j = 0; j < kTopK; ++j) {
      r.ids.push_back(all[j]);
      r.w.push_back(0.2f + 0.1f * static_cast<float>(j));
    }
  }
  return r;
}

// The direct computation of what the fused operator must produce.
std::vector<float> direct(const Experts& ex, const Routing& r, int64_t t, const uint8_t* mask) {
  std::vector<float> out(static_cast<size_t>(t * kHidden), 0.0f);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < kTopK; ++j) {
      const int32_t e = r.ids[i * kTopK + j];
      if (mask != nullptr && mask[e] == 0) continue;
      std::vector<float> y(kHidden);
      kern::KMatrix g, u, d;
      if (kern::view_weight(ex.w.gate[e], &g) && kern::view_weight(ex.w.up[e], &u) &&
          kern::view_weight(ex.w.down[e], &d)) {
        kern::Activations a, h;
        kern::quantize_activations(kern::act_format(g.format), 0, r.x.data() + i * kHidden, 1,
                                   kHidden, kHidden, &a);
        std::vector<float> gv(kFf), uv(kFf);
        kern::gemm(g, a, 0, kFf, gv.data(), kFf);
        kern::gemm(u, a, 0, kFf, uv.data(), kFf);
        for (int64_t f = 0; f < kFf; ++f) gv[f] = ops::silu(gv[f]) * uv[f];
        kern::quantize_activations(kern::act_format(d.format), 0, gv.data(), 1, kFf, kFf, &h);
        kern::gemm(d, h, 0, kHidden, y.data(), kHidden);
      } else {
        std::vector<float> gv(kFf), uv(kFf);
        ops::matmul(ex.w.gate[e], r.x.data() + i * kHidden, 1, gv.data(), nullptr);
        ops::matmul(ex.w.up[e], r.x.data() + i * kHidden, 1, uv.data(), nullptr);
        ops::swiglu(gv.data(), uv.data(), kFf, gv.data());
        ops::matmul(ex.w.down[e], gv.data(), 1, y.data(), nullptr);
      }
      for (int64_t c = 0; c < kHidden; ++c) out[i * kHidden + c] += r.w[i * kTopK + j] * y[c];
    }
  }
  return out;
}

ThreadPool& pool() {
  static ThreadPool p(place_workers(detect_topology(), 2));
  return p;
}

MoeRequest request(const Experts& ex, const Routing& r, int64_t t, float* out) {
  MoeRequest q;
  q.experts = &ex.w;
  q.hidden = r.x.data();
  q.n_tokens = t;
  q.hidden_size = kHidden;
  q.ids = r.ids.data();
  q.weights = r.w.data();
  q.k = kTopK;
  q.out = out;
  return q;
}

class FusedMoe : public ::testing::TestWithParam<std::pair<DType, DType>> {};

// Row chunks (small: many tasks per expert) and, for a prefill on the pool, whole-expert tasks
// (whole_experts_per_thread 1: all but the `threads` smallest of the 7 experts with kernels run
// whole).
TEST_P(FusedMoe, EqualsDirectComputationAndMasksSplitWork) {
  const Experts ex = make_experts(GetParam().first, GetParam().second);
  for (int64_t t : {1, 3, 40}) {
    const Routing r = make_routing(t, 100 + static_cast<uint32_t>(t));
    const std::vector<float> want = direct(ex, r, t, nullptr);
    for (const int per_thread : {0, 1}) {
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool()}) {
        SCOPED_TRACE(::testing::Message() << "tokens " << t << " whole_experts_per_thread "
                                          << per_thread << (p ? " pool" : " no pool"));
        FusedMoeOptions o{16, 16};
        o.whole_experts_per_thread = per_thread;
        FusedMoeBackend be(p, o);
        std::vector<float> got(want.size(), -7.0f);
        be.submit(request(ex, r, t, got.data()));
        be.wait();
        if (per_thread > 0 && p != nullptr && t > 4) {
          EXPECT_EQ(be.last_whole_count(), kExperts - 1 - (p->size() + 1))
              << "all but the `threads` smallest with kernels (not expert 5) run whole";
        } else {
          EXPECT_EQ(be.last_whole_count(), 0);
          EXPECT_GT(be.last_task_count(), kExperts) << "the experts are split into row chunks";
        }
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_EQ(got[i], want[i]) << "t " << t << " i " << i;

        const uint8_t mask_a[kExperts] = {1, 0, 1, 0, 1, 0, 1, 0};
        const uint8_t mask_b[kExperts] = {0, 1, 0, 1, 0, 1, 0, 1};
        std::vector<float> a(want.size()), b(want.size());
        MoeRequest q = request(ex, r, t, a.data());
        q.run_here = mask_a;
        be.submit(q);
        be.wait();
        EXPECT_EQ(a, direct(ex, r, t, mask_a));
        q.run_here = mask_b;
        q.out = b.data();
        be.submit(q);
        be.wait();
        EXPECT_EQ(b, direct(ex, r, t, mask_b));
      }
    }
  }
}

// Close to the F32-activation reference backend: only the activations' Q8 rounding differs. Two
// roundings (the input, the intermediate), each with a step of amax/127 ~ 3 sigma/127 per block,
// i.e. ~0.7% rms of the values: the relative L2 error must stay near 1%, bound 3%.
TEST_P(FusedMoe, CloseToF32ActivationReference) {
  const Experts ex = make_experts(GetParam().first, GetParam().second);
  const int64_t t = 5;
  const Routing r = make_routing(t, 9);
  std::vector<float> fused(static_cast<size_t>(t * kHidden)), ref(fused.size());
  FusedMoeBackend be(&pool());
  be.submit(request(ex, r, t, fused.data()));
  be.wait();
  CpuMoeBackend reference(nullptr);
  reference.submit(request(ex, r, t, ref.data()));
  reference.wait();
  double ref2 = 0, err2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ref2 += static_cast<double>(ref[i]) * ref[i];
    err2 += (static_cast<double>(fused[i]) - ref[i]) * (static_cast<double>(fused[i]) - ref[i]);
  }
  EXPECT_GT(ref2, 0.0);
  EXPECT_LE(std::sqrt(err2 / ref2), 0.03);
}

// Two backends with requests in flight at once (how Expert Deferral overlaps layers).
TEST(FusedMoeOverlap, TwoInstancesPendingAtOnce) {
  const Experts ex = make_experts(DType::kQ4_K, DType::kQ6_K);
  const Routing r1 = make_routing(2, 1), r2 = make_routing(3, 2);
  std::vector<float> o1(2 * kHidden), o2(3 * kHidden);
  FusedMoeBackend a(&pool()), b(&pool());
  a.submit(request(ex, r1, 2, o1.data()));
  b.submit(request(ex, r2, 3, o2.data()));
  b.wait();
  a.wait();
  EXPECT_EQ(o1, direct(ex, r1, 2, nullptr));
  EXPECT_EQ(o2, direct(ex, r2, 3, nullptr));
}

// The shared experts in the operator's task queue (FusedMoeOptions::shared_experts) against
// Model::ffn's own computation written out: routed experts as `direct`, the shared FFN through
// kern::matmul_shared_input, SwiGLU and kern::matmul, Qwen2-MoE's sigmoid gate applied to it,
// then shared + routed. Bit for bit, for the fast path (Q4_K gate / up, Q6_K down), the path
// without one (gate and up of different formats: phase 3), with and without the gate, 1 / 3 / 20
// tokens, with a pool and without, submitted alone or after start_shared(); a backend without the option
// leaves them out.
TEST(FusedMoeShared, EqualsModelSharedPlusRouted) {
  const Experts ex = make_experts(DType::kQ4_K, DType::kQ5_0);
  constexpr int64_t kSharedFf = 2 * kFf;
  std::mt19937 rng(23);
  std::vector<std::vector<uint8_t>> store;
  store.reserve(4);
  LayerWeights fast, slow;
  fast.sh_gate = ops::Weight(quantized(DType::kQ4_K, kSharedFf, kHidden, rng, store));
  fast.sh_up = ops::Weight(quantized(DType::kQ4_K, kSharedFf, kHidden, rng, store));
  fast.sh_down = ops::Weight(quantized(DType::kQ6_K, kHidden, kSharedFf, rng, store));
  slow = fast;
  slow.sh_up = ops::Weight(quantized(DType::kQ8_0, kSharedFf, kHidden, rng, store));
  std::vector<float> gate_inp(kHidden);
  std::normal_distribution<float> nd(0.0f, 0.1f);
  for (float& v : gate_inp) v = nd(rng);
  FusedMoeOptions with;
  with.shared_experts = true;
  with.max_rows_per_task = with.max_rows_per_task_decode = 64;  // several shared chunks
  for (LayerWeights* lw : {&fast, &slow}) {
    for (const bool gated : {false, true}) {
      lw->sh_gate_inp = gated ? gate_inp : std::vector<float>();
      for (const int64_t t : {1, 3, 20}) {
        SCOPED_TRACE(::testing::Message() << (lw == &fast ? "fast" : "phase 3") << " gated "
                                          << gated << " tokens " << t);
        const Routing r = make_routing(t, 300 + static_cast<uint32_t>(t));
        std::vector<float> g(static_cast<size_t>(t * kSharedFf)), u(g.size());
        std::vector<float> want(static_cast<size_t>(t * kHidden));
        const ops::Weight* ws[2] = {&lw->sh_gate, &lw->sh_up};
        float* ys[2] = {g.data(), u.data()};
        kern::matmul_shared_input(ws, r.x.data(), t, ys, nullptr);
        ops::swiglu(g.data(), u.data(), t * kSharedFf, g.data());
        kern::matmul(lw->sh_down, g.data(), t, want.data(), nullptr);
        for (int64_t i = 0; i < t && gated; ++i) {
          const float s = shared_expert_gate(r.x.data() + i * kHidden, gate_inp.data(), kHidden);
          for (int64_t c = 0; c < kHidden; ++c) want[i * kHidden + c] *= s;
        }
        const std::vector<float> routed = direct(ex, r, t, nullptr);
        for (size_t i = 0; i < want.size(); ++i) want[i] += routed[i];
        for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool()}) {
          FusedMoeBackend be(p, with);
          ASSERT_TRUE(be.computes_shared());
          FusedMoeOptions whole = with;  // 20 tokens on the pool: routed experts run whole
          whole.whole_experts_per_thread = 1;
          FusedMoeBackend bw(p, whole);
          std::vector<float> got(want.size(), -7.0f);
          MoeRequest q = request(ex, r, t, got.data());
          q.layer_weights = lw;
          be.submit(q);
          be.wait();
          ASSERT_EQ(got, want);
          EXPECT_FALSE(be.last_shared_early());
          // start_shared() first (the routing not known yet, as Model::ffn calls it): a decode's shared
          // expert with kernels runs as its own job, the same bits.
          MoeRequest early = q;
          early.ids = nullptr;
          early.weights = nullptr;
          std::fill(got.begin(), got.end(), -7.0f);
          be.start_shared(early);
          be.submit(q);
          be.wait();
          ASSERT_EQ(got, want) << "begun early";
          EXPECT_EQ(be.last_shared_early(), p != nullptr && t <= 4 && lw == &fast);
          // A start_shared() whose request never came (a forward that threw midway), and one for
          // another layer: forgotten, the next request computed whole.
          MoeRequest other = early;
          other.layer = 1;
          std::fill(got.begin(), got.end(), -7.0f);
          be.start_shared(early);
          be.start_shared(other);
          be.submit(q);
          be.wait();
          ASSERT_EQ(got, want) << "after an abandoned start_shared()";
          EXPECT_FALSE(be.last_shared_early());
          std::fill(got.begin(), got.end(), -7.0f);
          bw.submit(q);
          bw.wait();
          ASSERT_EQ(got, want) << "with whole-expert tasks";
          EXPECT_EQ(bw.last_whole_count() > 0, p != nullptr && t > 4);
          FusedMoeBackend routed_only(p);
          ASSERT_FALSE(routed_only.computes_shared());
          routed_only.submit(q);
          routed_only.wait();
          ASSERT_EQ(got, routed);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, FusedMoe,
                         ::testing::Values(std::pair{DType::kQ4_K, DType::kQ6_K},
                                           std::pair{DType::kQ4_K, DType::kQ5_0},
                                           std::pair{DType::kQ5_K, DType::kQ5_1},
                                           std::pair{DType::kQ4_0, DType::kQ4_1},
                                           std::pair{DType::kQ2_K, DType::kQ3_K},
                                           std::pair{DType::kQ8_0, DType::kQ8_0}),
                         [](const auto& info) {
                           return std::string(dtype_info(info.param.first).name) + "_" +
                                  std::string(dtype_info(info.param.second).name);
                         });

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Repacked experts (INT8 / INT4 groups of 64, ops/cpu/packed.h) through the same operator: equal
// to the direct computation with those matrices, and close to the F32 reference (INT8 within the
// Q8 roundings; INT4 within its 4-bit weight error).
TEST(FusedMoePacked, Int8AndInt4Experts) {
  const Experts ex = make_experts(DType::kF32, DType::kF32);
  for (auto [fmt, bound] : {std::pair{kern::WFormat::kInt8, 0.03}, {kern::WFormat::kInt4, 0.3}}) {
    CpuExperts ce;
    ce.format = kern::wformat_name(fmt);
    ce.gate.resize(1);
    ce.up.resize(1);
    ce.down.resize(1);
    for (int64_t e = 0; e < kExperts; ++e) {
      if (e == 5) {  // Q8_1 in make_experts: keep it on the reference path (no prepared matrix)
        ce.gate[0].emplace_back();
        ce.up[0].emplace_back();
        ce.down[0].emplace_back();
        continue;
      }
      ce.gate[0].push_back(kern::pack_weight(ex.w.gate[e], fmt, 64, nullptr));
      ce.up[0].push_back(kern::pack_weight(ex.w.up[e], fmt, 64, nullptr));
      ce.down[0].push_back(kern::pack_weight(ex.w.down[e], fmt, 64, nullptr));
    }
    const int64_t t = 7;
    const Routing r = make_routing(t, 21);
    std::vector<float> got(static_cast<size_t>(t * kHidden)), ref(got.size()),
        want(got.size(), 0.0f);
    FusedMoeBackend be(&pool(), FusedMoeOptions{16, 16}, &ce);
    be.submit(request(ex, r, t, got.data()));
    be.wait();
    FusedMoeOptions whole_opt{16, 16};
    whole_opt.whole_experts_per_thread = 1;  // the 7 fast experts: some run whole
    FusedMoeBackend whole(&pool(), whole_opt, &ce);
    std::vector<float> got_whole(got.size(), -7.0f);
    whole.submit(request(ex, r, t, got_whole.data()));
    whole.wait();
    EXPECT_GT(whole.last_whole_count(), 0);
    EXPECT_EQ(got_whole, got) << kern::wformat_name(fmt) << " whole-expert tasks";
    // Direct: per selection, the packed kernels on that token alone.
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t j = 0; j < kTopK; ++j) {
        const int32_t e = r.ids[i * kTopK + j];
        std::vector<float> y(kHidden), gv(kFf), uv(kFf);
        if (e == 5) {
          ops::matmul(ex.w.gate[e], r.x.data() + i * kHidden, 1, gv.data(), nullptr);
          ops::matmul(ex.w.up[e], r.x.data() + i * kHidden, 1, uv.data(), nullptr);
          ops::swiglu(gv.data(), uv.data(), kFf, gv.data());
          ops::matmul(ex.w.down[e], gv.data(), 1, y.data(), nullptr);
        } else {
          kern::Activations a, h;
          kern::quantize_activations(kern::AFormat::kI8, 64, r.x.data() + i * kHidden, 1, kHidden,
                                     kHidden, &a);
          kern::gemm(ce.gate[0][e], a, 0, kFf, gv.data(), kFf);
          kern::gemm(ce.up[0][e], a, 0, kFf, uv.data(), kFf);
          for (int64_t f = 0; f < kFf; ++f) gv[f] = ops::silu(gv[f]) * uv[f];
          kern::quantize_activations(kern::AFormat::kI8, 64, gv.data(), 1, kFf, kFf, &h);
          kern::gemm(ce.down[0][e], h, 0, kHidden, y.data(), kHidden);
        }
        for (int64_t c = 0; c < kHidden; ++c) want[i * kHidden + c] += r.w[i * kTopK + j] * y[c];
      }
    }
    EXPECT_EQ(got, want) << kern::wformat_name(fmt);
    CpuMoeBackend reference(nullptr);
    reference.submit(request(ex, r, t, ref.data()));
    reference.wait();
    double ref2 = 0, err2 = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ref2 += double(ref[i]) * ref[i];
      err2 += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    }
    EXPECT_LE(std::sqrt(err2 / ref2), bound) << kern::wformat_name(fmt);
  }
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// NUMA tensor parallelism (split_cpu_experts + FusedMoeBackend parts) on a pool of two synthetic
// nodes. Expectations: (1) exactly the direct split arithmetic: per part, the kernels on that
// part's rows of gate/up and columns of down (copied with kern::copy_submatrix), the parts' down
// outputs added in part order; (2) the unsplit operator within F32 rounding (activation blocks are
// cut on their own boundaries, so only the down sums' order differs).
TEST(FusedMoeNuma, SplitExpertsMatchDirectSplitAndUnsplit) {
  ThreadingContext ctx(synthetic_topology(2, 1), ThreadingOptions{2, false, 20});
  ASSERT_EQ(ctx.pool().node_count(), 2);
  struct Case {
    DType gu, dn;
    std::vector<int> nodes;  // pool node per part
  };
  // Three parts of a Q4_K down (256-column blocks, 512 columns): part 0 is empty, its expert's
  // activations are still gathered there for the other parts.
  for (const Case& k :
       {Case{DType::kQ4_K, DType::kQ5_0, {0, 1}}, Case{DType::kQ8_0, DType::kQ6_K, {0, 1}},
        Case{DType::kBF16, DType::kF32, {0, 1}}, Case{DType::kQ4_K, DType::kQ4_K, {0, 1, 0}},
        Case{DType::kQ5_K, DType::kQ5_1, {0, 1}}}) {
    const DType gu = k.gu, dn = k.dn;
    const size_t n_parts = k.nodes.size();
    SCOPED_TRACE(std::string(dtype_info(gu).name) + " parts " + std::to_string(n_parts));
    const Experts ex = make_experts(gu, dn);
    CpuExperts ce;
    ce.format = "native";
    ce.gate.resize(1);
    ce.up.resize(1);
    ce.down.resize(1);
    for (int64_t e = 0; e < kExperts; ++e) {
      kern::KMatrix g, u, d;
      kern::view_weight(ex.w.gate[e], &g);  // expert 5 (Q8_1) stays invalid: reference path
      kern::view_weight(ex.w.up[e], &u);
      kern::view_weight(ex.w.down[e], &d);
      ce.gate[0].push_back(g);
      ce.up[0].push_back(u);
      ce.down[0].push_back(d);
    }
    CpuExperts split = ce;
    split_cpu_experts(&split, k.nodes, std::vector<int>(n_parts, -1), &ctx.pool());
    ASSERT_EQ(split.parts[0].size(), static_cast<size_t>(kExperts));
    EXPECT_TRUE(split.parts[0][5].empty()) << "no kernel: not split";
    const std::vector<ExpertPart>& p0 = split.parts[0][0];
    ASSERT_EQ(p0.size(), n_parts);
    EXPECT_EQ(p0[0].f0, 0);
    for (size_t p = 0; p + 1 < n_parts; ++p) {
      EXPECT_EQ(p0[p].f1, p0[p + 1].f0);
      EXPECT_EQ(p0[p].f1 % kern::col_align(ce.down[0][0]), 0);
    }
    EXPECT_EQ(p0[n_parts - 1].f1, kFf);
    if (n_parts == 2) {
      EXPECT_GT(p0[0].f1, 0);
      EXPECT_LT(p0[0].f1, kFf);
    } else {
      EXPECT_EQ(p0[0].f1, 0) << "a 512-wide Q4_K down has two blocks for three parts";
    }

    for (int64_t t : {1, 6}) {
      const Routing r = make_routing(t, 300 + static_cast<uint32_t>(t));
      std::vector<float> got(static_cast<size_t>(t * kHidden), -7.0f), whole(got.size());
      FusedMoeBackend be(&ctx.pool(), FusedMoeOptions{16, 16}, &split);
      be.submit(request(ex, r, t, got.data()));
      be.wait();
      EXPECT_EQ(be.last_part_count(), static_cast<int>(n_parts));
      FusedMoeBackend unsplit(&ctx.pool(), FusedMoeOptions{16, 16}, &ce);
      unsplit.submit(request(ex, r, t, whole.data()));
      unsplit.wait();

      std::vector<float> want(got.size(), 0.0f);
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t j = 0; j < kTopK; ++j) {
          const int32_t e = r.ids[i * kTopK + j];
          const float w = r.w[i * kTopK + j];
          std::vector<std::vector<float>> ys;
          if (e == 5) {
            std::vector<float> y(kHidden), gv(kFf), uv(kFf);
            ops::matmul(ex.w.gate[e], r.x.data() + i * kHidden, 1, gv.data(), nullptr);
            ops::matmul(ex.w.up[e], r.x.data() + i * kHidden, 1, uv.data(), nullptr);
            ops::swiglu(gv.data(), uv.data(), kFf, gv.data());
            ops::matmul(ex.w.down[e], gv.data(), 1, y.data(), nullptr);
            ys.push_back(y);
          } else {
            const kern::KMatrix& g = ce.gate[0][e];
            const kern::KMatrix& d = ce.down[0][e];
            for (const ExpertPart& part : split.parts[0][e]) {
              const int64_t f0 = part.f0, f1 = part.f1, n = f1 - f0;
              if (n == 0) continue;
              const kern::KMatrix gs = kern::copy_submatrix(g, f0, f1, 0, kHidden, {});
              const kern::KMatrix us = kern::copy_submatrix(ce.up[0][e], f0, f1, 0, kHidden, {});
              const kern::KMatrix ds = kern::copy_submatrix(d, 0, kHidden, f0, f1, {});
              kern::Activations a, h;
              kern::quantize_activations(kern::act_format(g.format), 0, r.x.data() + i * kHidden, 1,
                                         kHidden, kHidden, &a);
              std::vector<float> y(kHidden), gv(static_cast<size_t>(n)), uv(gv.size());
              kern::gemm(gs, a, 0, n, gv.data(), n);
              kern::gemm(us, a, 0, n, uv.data(), n);
              for (int64_t f = 0; f < n; ++f) gv[f] = ops::silu(gv[f]) * uv[f];
              kern::quantize_activations(kern::act_format(d.format), 0, gv.data(), 1, n, n, &h);
              kern::gemm(ds, h, 0, kHidden, y.data(), kHidden);
              ys.push_back(y);
            }
          }
          for (const std::vector<float>& y : ys) {
            for (int64_t c = 0; c < kHidden; ++c) want[i * kHidden + c] += w * y[c];
          }
        }
      }
      float amax = 0.0f;
      for (float v : whole) amax = std::max(amax, std::fabs(v));
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << "t " << t << " i " << i;
        ASSERT_NEAR(got[i], whole[i], 2e-5f * amax) << "t " << t << " i " << i;
      }
    }
  }
}

// copy_submatrix keeps the values: a row slice computes exactly the full matrix's rows, and a
// column split's two halves add up to the full product within F32 rounding.
TEST(CopySubmatrix, RowAndColumnSlicesOfEveryFormat) {
  std::mt19937 rng(5);
  std::vector<std::vector<uint8_t>> store;
  const int64_t rows = 48, cols = 512;
  std::vector<float> x(cols);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : x) v = nd(rng);
  std::vector<kern::KMatrix> mats;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,
                   DType::kQ8_0, DType::kQ5_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_1,
                   DType::kQ2_K, DType::kQ3_K}) {
    kern::KMatrix m;
    ASSERT_TRUE(kern::view_weight(ops::Weight(quantized(dt, rows, cols, rng, store)), &m));
    mats.push_back(m);
  }
  // FP8 E4M3 with 128 x 128 block scales (bytes & 0x77 are never NaN), viewed from row 16 of the
  // scaled matrix so the slices' scale rows are offset too.
  store.emplace_back(static_cast<size_t>(rows * cols));
  for (uint8_t& b : store.back()) b = static_cast<uint8_t>(rng()) & 0x77;
  const std::vector<float> fp8_scales = {0.5f, 1.5f, 0.25f, 2.0f, 1.0f, 0.75f, 3.0f, 0.125f};
  ops::Weight fp8(Tensor::dense(DType::kF8E4M3, {rows, cols}, store.back().data()));
  fp8.scale_inv = fp8_scales.data();
  fp8.scale_cols = 4;
  fp8.block_rows = 128;
  fp8.block_cols = 128;
  fp8.row0 = 112;  // rows 112..159 of the scaled matrix: scale rows 0 and 1
  kern::KMatrix fp8m;
  ASSERT_TRUE(kern::view_weight(fp8, &fp8m));
  mats.push_back(fp8m);
  const Tensor f32 = quantized(DType::kF32, rows, cols, rng, store);
  mats.push_back(kern::pack_weight(ops::Weight(f32), kern::WFormat::kInt8, 64, nullptr));
  mats.push_back(kern::pack_weight(ops::Weight(f32), kern::WFormat::kInt4, 128, nullptr));
  mats.push_back(kern::pack_weight(ops::Weight(f32), kern::WFormat::kBF16Tile, 0, nullptr));
  for (const kern::KMatrix& m : mats) {
    SCOPED_TRACE(kern::wformat_name(m.format));
    const kern::AFormat af = kern::act_format(m.format);
    kern::Activations a;
    kern::quantize_activations(af, m.group, x.data(), 1, cols, cols, &a);
    std::vector<float> full(rows);
    kern::gemm(m, a, 0, rows, full.data(), rows);

    const kern::KMatrix top = kern::copy_submatrix(m, 16, 48, 0, cols, {});
    std::vector<float> part(32);
    kern::gemm(top, a, 0, 32, part.data(), 32);
    for (int64_t r = 0; r < 32; ++r) ASSERT_EQ(part[r], full[16 + r]) << r;

    const int64_t c = 256;  // on every format's grid
    ASSERT_EQ(c % kern::col_align(m), 0);
    const kern::KMatrix left = kern::copy_submatrix(m, 0, rows, 0, c, {});
    const kern::KMatrix right = kern::copy_submatrix(m, 0, rows, c, cols, {});
    kern::Activations al, ar;
    kern::quantize_activations(af, m.group, x.data(), 1, c, cols, &al);
    kern::quantize_activations(af, m.group, x.data() + c, 1, cols - c, cols, &ar);
    std::vector<float> yl(rows), yr(rows);
    kern::gemm(left, al, 0, rows, yl.data(), rows);
    kern::gemm(right, ar, 0, rows, yr.data(), rows);
    float amax = 0.0f;
    for (float v : full) amax = std::max(amax, std::fabs(v));
    for (int64_t r = 0; r < rows; ++r) ASSERT_NEAR(yl[r] + yr[r], full[r], 1e-5f * amax) << r;
    if (kern::col_align(m) > 1) {
      EXPECT_THROW(kern::copy_submatrix(m, 0, rows, 0, c + 1, {}), Error);
    }
    EXPECT_THROW(kern::copy_submatrix(m, 0, rows, 0, cols + 1, {}), Error);
  }
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// `--cpu-experts repack`'s experts: the Q4_K matrices rearranged into x16 tiles
// (kern::q4k_x16_matrix), the others as stored. The fused operator on them gives exactly the
// direct computation on the stored rows (1, 3 and 40 tokens: the x16 GEMV and the in-place tiles;
// expert 5 without a kernel on the reference path), and split into NUMA parts exactly what the
// stored rows split the same way give.
TEST(FusedMoeRepack, Q4KX16ExpertsEqualTheStoredRows) {
  ThreadingContext ctx(synthetic_topology(2, 1), ThreadingOptions{2, false, 20});
  for (const auto& [gu, dn] : {std::pair{DType::kQ4_K, DType::kQ4_K},
                               std::pair{DType::kQ4_K, DType::kQ5_0}}) {
    SCOPED_TRACE(std::string(dtype_info(dn).name) + " down");
    const Experts ex = make_experts(gu, dn);
    CpuExperts native, repacked;
    for (CpuExperts* c : {&native, &repacked}) {
      c->gate.resize(1);
      c->up.resize(1);
      c->down.resize(1);
    }
    int64_t tiled = 0;
    for (int64_t e = 0; e < kExperts; ++e) {
      const ops::Weight* w[3] = {&ex.w.gate[e], &ex.w.up[e], &ex.w.down[e]};
      for (int m = 0; m < 3; ++m) {
        kern::KMatrix v;
        kern::view_weight(*w[m], &v);  // expert 5 (Q8_1) stays invalid: reference path
        kern::KMatrix x = v;
        if (v.valid() && v.format == kern::WFormat::kQ4_K) {
          x = kern::q4k_x16_matrix(v, AllocOptions{});
          ++tiled;
        }
        (m == 0 ? native.gate : m == 1 ? native.up : native.down)[0].push_back(v);
        (m == 0 ? repacked.gate : m == 1 ? repacked.up : repacked.down)[0].push_back(x);
      }
    }
    ASSERT_EQ(tiled, dn == DType::kQ4_K ? 21 : 14);
    for (int64_t t : {1, 3, 40}) {
      const Routing r = make_routing(t, 200 + static_cast<uint32_t>(t));
      const std::vector<float> want = direct(ex, r, t, nullptr);
      std::vector<float> got(want.size(), -1.0f);
      FusedMoeBackend be(&pool(), FusedMoeOptions{}, &repacked);
      be.submit(request(ex, r, t, got.data()));
      be.wait();
      ASSERT_EQ(got, want) << "tokens " << t;
      // Two NUMA parts (each expert's rows of gate/up on 16-row tiles, down's columns on
      // super-blocks / blocks): the same as the stored rows split alike.
      CpuExperts split_n = native, split_r = repacked;
      split_cpu_experts(&split_n, {0, 1}, {-1, -1}, &ctx.pool());
      split_cpu_experts(&split_r, {0, 1}, {-1, -1}, &ctx.pool());
      ASSERT_EQ(split_r.parts[0][0].size(), 2u);
      ASSERT_EQ(split_r.parts[0][0][0].gate.format, kern::WFormat::kQ4_KX16);
      std::vector<float> a(want.size()), b(want.size());
      FusedMoeBackend bn(&ctx.pool(), FusedMoeOptions{}, &split_n);
      bn.submit(request(ex, r, t, a.data()));
      bn.wait();
      FusedMoeBackend br(&ctx.pool(), FusedMoeOptions{}, &split_r);
      br.submit(request(ex, r, t, b.data()));
      br.wait();
      ASSERT_EQ(b, a) << "split, tokens " << t;
    }
  }
}

}  // namespace
}  // namespace tandem
