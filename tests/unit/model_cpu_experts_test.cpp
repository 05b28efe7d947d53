// prepare_cpu_experts (moe/cpu_experts.h) on a golden model: native views, `repack` (a Q4_K
// synth model: x16 tiles, bit-identical products), requantizing with the
// on-disk cache (written next to the model, mapped on the next load with no repacking; stale,
// corrupt and truncated caches rebuilt), the cache location rules, and every expert's SwiGLU
// output with packed weights against the F32 reference within the quantization tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/synth.h"
#include "moe/cpu_experts.h"
#include "model/model.h"
#include "model/weights.h"
#include "ops/cpu/packed.h"
#include "ops/cpu/q0_x4.h"
#include "ops/cpu/q4k_x16.h"
#include "ops/cpu/ref_ops.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

ThreadPool& pool() {
  static ThreadingContext ctx(ThreadingOptions{2, false, 50});
  return ctx.pool();
}

// A private copy of the golden model, so caches are written next to it in a temp dir.
fs::path copy_model(const test::TempDir& dir, const std::string& name) {
  const fs::path dst = dir / name;
  fs::copy_file(test::data_path("golden/" + name), dst);
  fs::permissions(dst, fs::perms::owner_read | fs::perms::owner_write);
  return dst;
}

void corrupt(const fs::path& p, uint64_t offset) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5A);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

TEST(CpuExperts, NativeViewsEveryRoutedExpert) {
  const LoadedModel lm = load_model(test::data_path("golden/deepseek2.gguf"));
  const CpuExperts e = prepare_cpu_experts(lm, CpuExpertOptions{}, &pool());
  ASSERT_EQ(e.gate.size(), lm.layers.size());
  EXPECT_TRUE(e.gate[0].empty());  // the leading dense layer
  for (size_t l = 1; l < lm.layers.size(); ++l) {
    ASSERT_EQ(e.gate[l].size(), 8u);
    for (size_t x = 0; x < 8; ++x) {
      EXPECT_EQ(e.down[l][x].data, lm.layers[l].experts.down[x].t.data);  // a view, no copy
      EXPECT_EQ(e.up[l][x].format, kern::WFormat::kF32);
    }
  }
  EXPECT_FALSE(e.from_cache);
  EXPECT_TRUE(e.cache_path.empty());
}

TEST(CpuExperts, CacheWrittenThenMappedStaleAndCorruptRebuilt) {
  test::TempDir dir("cpu_experts");
  const fs::path model = copy_model(dir, "qwen3moe.gguf");
  CpuExpertOptions o;
  o.format = "int4";
  o.group = 32;
  const fs::path expect_path = dir / "qwen3moe.gguf.tandem-int4-g32.bin";
  std::vector<uint8_t> first;
  {
    const LoadedModel lm = load_model(model);
    EXPECT_EQ(cpu_expert_cache_path(lm, o), expect_path);
    const CpuExperts e = prepare_cpu_experts(lm, o, &pool());
    EXPECT_TRUE(e.cache_written);
    EXPECT_FALSE(e.from_cache);
    EXPECT_EQ(e.cache_path, expect_path);
    ASSERT_TRUE(fs::exists(expect_path));
    const kern::KMatrix& m = e.gate[1][3];
    EXPECT_EQ(m.format, kern::WFormat::kInt4);
    EXPECT_EQ(m.group, 32);
    first.assign(m.data, m.data + kern::packed_bytes(m.format, m.rows, m.cols, m.group));
  }
  auto load = [&] {
    const LoadedModel lm = load_model(model);
    return prepare_cpu_experts(lm, o, &pool());
  };
  {
    const CpuExperts e = load();  // maps: no repacking, the same bytes
    EXPECT_TRUE(e.from_cache);
    EXPECT_FALSE(e.cache_written);
    const kern::KMatrix& m = e.gate[1][3];
    ASSERT_EQ(m.data != nullptr, true);
    EXPECT_EQ(std::memcmp(m.data, first.data(), first.size()), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(m.data) % 4096, 0u);  // page-aligned in the mapping
  }
  corrupt(expect_path, 0);  // magic
  EXPECT_TRUE(load().cache_written);
  EXPECT_TRUE(load().from_cache);
  corrupt(expect_path, 4096 + 20);  // the matrix table
  EXPECT_TRUE(load().cache_written);
  fs::resize_file(expect_path, fs::file_size(expect_path) - 4096);  // truncated
  EXPECT_TRUE(load().cache_written);
  EXPECT_TRUE(load().from_cache);
  // The model changed (mtime): stale.
  fs::last_write_time(model, fs::last_write_time(model) + std::chrono::seconds(5));
  const CpuExperts stale = load();
  EXPECT_TRUE(stale.cache_written);
  EXPECT_EQ(std::memcmp(stale.gate[1][3].data, first.data(), first.size()), 0);  // deterministic
  // Another group is another file.
  o.group = 64;
  EXPECT_TRUE(load().cache_written);
  EXPECT_TRUE(fs::exists(dir / "qwen3moe.gguf.tandem-int4-g64.bin"));
}

TEST(CpuExperts, CacheLocationAndNoCache) {
  test::TempDir dir("cpu_experts_loc");
  LoadedModel lm;
  lm.path = "/proc/self/model.gguf";  // a directory nobody may write into
  CpuExpertOptions o;
  o.format = "int8";
  o.group = 64;
  ASSERT_EQ(setenv("XDG_CACHE_HOME", dir.path().c_str(), 1), 0);
  EXPECT_EQ(cpu_expert_cache_path(lm, o), dir / "tandem" / "model.gguf.tandem-int8-g64.bin");
  o.cache_dir = dir / "mine";
  EXPECT_EQ(cpu_expert_cache_path(lm, o), dir / "mine" / "model.gguf.tandem-int8-g64.bin");
  o.format = "bf16";
  EXPECT_EQ(cpu_expert_cache_path(lm, o), dir / "mine" / "model.gguf.tandem-bf16.bin");
  o.format = "fp4";
  EXPECT_THROW(cpu_expert_cache_path(lm, o), Error);

  const fs::path model = copy_model(dir, "qwen3moe.gguf");
  const LoadedModel real = load_model(model);
  CpuExpertOptions nc;
  nc.format = "int8";
  nc.use_cache = false;
  const CpuExperts e = prepare_cpu_experts(real, nc, &pool());
  EXPECT_TRUE(e.cache_path.empty());
  EXPECT_FALSE(fs::exists(dir / "qwen3moe.gguf.tandem-int8-g128.bin"));
  EXPECT_EQ(e.gate[0].size(), 8u);
  EXPECT_EQ(e.gate[0][0].format, kern::WFormat::kInt8);
}

TEST(CpuExperts, GroupMustDivideTheRows) {
  // deepseek2's experts are 64 wide: down rows of 64 values cannot take groups of 128.
  const LoadedModel lm = load_model(test::data_path("golden/deepseek2.gguf"));
  CpuExpertOptions o;
  o.format = "int8";
  o.group = 128;
  o.use_cache = false;
  try {
    prepare_cpu_experts(lm, o, &pool());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--expert-group 128"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("down"), std::string::npos) << e.what();
  }
  o.group = 48;
  EXPECT_THROW(prepare_cpu_experts(lm, o, &pool()), Error);
}

// Every expert's SwiGLU output with packed weights vs the F32 reference on the stored weights:
// relative L2 error within what the quantization step allows (golden weights are N(0, 0.02^2):
// INT4 per-group step amax/7 gives ~8% per matrix, INT8 ~0.5%; BF16 weights are exact on these
// BF16-valued weights, the BF16 activations (x and the SwiGLU output rounded to 8 significant
// bits, up to 2^-9 relative each) give ~0.3%).
TEST(CpuExperts, PackedExpertsMatchNative) {
  const LoadedModel lm = load_model(test::data_path("golden/qwen3moe.gguf"));
  const int64_t hidden = lm.config.hidden_size, tokens = 3;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(tokens * hidden);
  for (float& v : x) v = dist(rng);
  struct Case {
    const char* format;
    int group;
    double tolerance;
  };
  for (const Case c : {Case{"int8", 32, 0.03}, Case{"int4", 32, 0.25}, Case{"int4", 128, 0.3},
                       Case{"bf16", 0, 0.01}}) {
    CpuExpertOptions o;
    o.format = c.format;
    o.group = c.group == 0 ? 128 : c.group;
    o.use_cache = false;
    const CpuExperts e = prepare_cpu_experts(lm, o, &pool());
    for (size_t l = 0; l < lm.layers.size(); ++l) {
      for (size_t xi = 0; xi < e.gate[l].size(); ++xi) {
        const ExpertWeights& w = lm.layers[l].experts;
        const int64_t ff = w.gate[xi].rows();
        // Reference: F32 on the stored weights.
        std::vector<float> g(tokens * ff), u(tokens * ff), h(tokens * ff), ref(tokens * hidden);
        ops::matmul(w.gate[xi], x.data(), tokens, g.data(), nullptr);
        ops::matmul(w.up[xi], x.data(), tokens, u.data(), nullptr);
        ops::swiglu(g.data(), u.data(), tokens * ff, h.data());
        ops::matmul(w.down[xi], h.data(), tokens, ref.data(), nullptr);
        // Packed: activations in the format's encoding, gemm over all rows.
        auto run = [&](const kern::KMatrix& m, const std::vector<float>& in, int64_t rows) {
          kern::Activations a;
          std::vector<float> y(tokens * rows);
          kern::quantize_activations(kern::act_format(m.format), m.group, in.data(), tokens, m.cols,
                                     m.cols, &a);
          kern::packed_gemm(m, a, 0, rows, y.data(), rows, best_isa());
          return y;
        };
        const std::vector<float> pg = run(e.gate[l][xi], x, ff), pu = run(e.up[l][xi], x, ff);
        std::vector<float> ph(tokens * ff);
        ops::swiglu(pg.data(), pu.data(), tokens * ff, ph.data());
        const std::vector<float> out = run(e.down[l][xi], ph, hidden);
        double err = 0, norm = 0;
        for (int64_t i = 0; i < tokens * hidden; ++i) {
          err += (out[i] - ref[i]) * (out[i] - ref[i]);
          norm += ref[i] * ref[i];
        }
        ASSERT_LT(std::sqrt(err / norm), c.tolerance)
            << c.format << " g" << c.group << " layer " << l << " expert " << xi;
      }
    }
  }
}

// `repack` on a Q4_K_M file: every routed expert copied out of the model into memory of its own,
// the Q4_K and Q6_K ones (lm_head, the last layer's downs) in x16 tiles where the CPU has AVX-512
// VNNI (else as stored), the Q5_0 / Q8_0 ones (here downs of
// 64-value rows: no full quad) in x4 rows where it has VBMI too (ops/cpu/q0_x4.h), the others as
// stored; every matrix's product on random activations, 1 and 5
// tokens, bit for bit the stored rows'. No cache file, and `convert` has nothing to write.
TEST(CpuExperts, RepackRearrangesQ4KQ6KAndKeepsTheProducts) {
  test::TempDir dir("repack");
  SynthOptions so;
  so.config = config_preset("tiny-deepseek2");  // routed and shared experts, a dense layer 0
  so.type = SynthType::kQ4_K_M;
  so.seed = 5;
  so.progress = false;
  so.threads = 1;
  so.output = dir / "q4k.gguf";
  synth_model(so);
  const LoadedModel lm = load_model(so.output);
  CpuExpertOptions o;
  o.format = "repack";
  const CpuExperts e = prepare_cpu_experts(lm, o, &pool());
  EXPECT_EQ(e.format, "repack");
  EXPECT_TRUE(e.cache_path.empty());
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) files += entry.is_regular_file();
  EXPECT_EQ(files, 1u);  // the model alone: no cache file
  const bool x16 = best_isa() >= Isa::kAvx512Vnni;
  int64_t tiled = 0, tiled_q6 = 0, checked = 0, shared = 0;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // A copy in the stored format or (Q4_K / Q6_K on AVX-512 VNNI) in x16 tiles, with the same
  // products.
  auto check = [&](const ops::Weight& stored, const kern::KMatrix& r, const std::string& what) {
    kern::KMatrix v;
    ASSERT_TRUE(kern::view_weight(stored, &v)) << what;
    ASSERT_TRUE(r.valid()) << what;
    EXPECT_NE(r.data, v.data) << what;  // a copy
    const bool q6 = v.format == kern::WFormat::kQ6_K;
    const bool want_x16 = x16 && (v.format == kern::WFormat::kQ4_K || q6);
    kern::WFormat want = !want_x16 ? v.format
                         : q6      ? kern::WFormat::kQ6_KX16
                                   : kern::WFormat::kQ4_KX16;
    if (kern::q0_x4_native()) kern::q0_x4_format(v.format, &want);  // Q5_0 / Q8_0 in x4 rows
    ASSERT_EQ(r.format, want) << what;
    tiled += want_x16 ? 1 : 0;
    tiled_q6 += want_x16 && q6 ? 1 : 0;
    for (const int64_t tokens : {int64_t{1}, int64_t{5}}) {
      std::vector<float> x(static_cast<size_t>(tokens * v.cols));
      for (float& f : x) f = nd(rng);
      kern::Activations a;
      kern::quantize_activations(kern::act_format(v.format), 0, x.data(), tokens, v.cols, v.cols,
                                 &a);
      std::vector<float> want(static_cast<size_t>(tokens * v.rows)), have(want.size());
      kern::gemm(v, a, 0, v.rows, want.data(), v.rows);
      kern::gemm(r, a, 0, r.rows, have.data(), r.rows);
      ASSERT_EQ(have, want) << what;
      ++checked;
    }
  };
  ASSERT_EQ(e.shared_gate.size(), lm.layers.size());
  for (size_t l = 0; l < lm.layers.size(); ++l) {
    const LayerWeights& lw = lm.layers[l];
    const ExpertWeights& w = lw.experts;
    for (size_t xi = 0; xi < e.gate[l].size(); ++xi) {
      const std::string what = "layer " + std::to_string(l) + " expert " + std::to_string(xi);
      check(w.gate[xi], e.gate[l][xi], what + " gate");
      check(w.up[xi], e.up[l][xi], what + " up");
      check(w.down[xi], e.down[l][xi], what + " down");
    }
    if (!lw.moe || lw.sh_gate.empty()) {
      EXPECT_FALSE(e.shared_gate[l].valid()) << "layer " << l;
      continue;
    }
    const std::string what = "layer " + std::to_string(l) + " shared";
    check(lw.sh_gate, e.shared_gate[l], what + " gate");
    check(lw.sh_up, e.shared_up[l], what + " up");
    check(lw.sh_down, e.shared_down[l], what + " down");
    ++shared;
  }
  EXPECT_GT(shared, 0);
  // Every other matrix the forward reads through kern::matmul, copied alike (ModelOptions::views).
  EXPECT_EQ(e.other.count(&lm.lm_head), 1u);
  EXPECT_EQ(e.other.count(&lm.layers[0].ffn_gate), 1u);  // the dense layer
  EXPECT_EQ(e.other.count(&lm.layers[1].wkv_a), 1u);
  EXPECT_EQ(e.other.count(&lm.layers[1].sh_gate), 1u);
  for (const auto& [w, m] : e.other) check(*w, m, "other matrix");
  // A forward reading them gives the stored weights' logits, bit for bit.
  std::vector<float> want(static_cast<size_t>(lm.config.vocab_size)), got(want.size());
  const std::vector<int32_t> ids = {1, 5, 9, 2};
  for (const kern::WeightViews* views : {static_cast<const kern::WeightViews*>(nullptr), &e.other}) {
    ModelOptions mo;
    mo.forward.pool = &pool();
    mo.forward.views = views;
    Model model_net(lm, mo);
    SingleSequence model(model_net, 16);
    model.forward(ids, (views == nullptr ? want : got).data(), false);
  }
  EXPECT_EQ(got, want);
  EXPECT_GT(checked, 0);
  if (x16) {
    EXPECT_GT(tiled, 0);
    EXPECT_GT(tiled_q6, 0);
  }
  EXPECT_THROW(cpu_expert_cache_path(lm, o), Error);  // nothing to cache or convert
}

}  // namespace
}  // namespace tandem
