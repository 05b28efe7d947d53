// MoeLayer (moe/moe_layer.h), the stand-alone operator, against the engine's own MoE path on
// golden models: prepare_cpu_experts + FusedMoeBackend as MoeRuntime builds them for `tandem run
// --cpu-experts F` (bit for bit: same formats, same kernels), built from a model path and from
// raw tensors; ids of -1 and the GPU mask skip experts (checked against the reference backend
// with those slots' weights zeroed); a remap is a permutation of the ids; several layers submitted
// before their syncs equal one at a time; bad arguments are errors naming the argument.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/moe_backend.h"
#include "model/weights.h"
#include "moe/cpu_experts.h"
#include "moe/fused_moe.h"
#include "formats/model_config.h"
#include "formats/synth.h"
#include "moe/moe_layer.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

std::string golden(const std::string& name) {
  return std::string(TANDEM_TEST_DATA_DIR) + "/golden/" + name;
}

struct Batch {
  int64_t tokens = 0, k = 0, hidden = 0;
  std::vector<float> x, w;
  std::vector<int32_t> ids;
};

Batch make_batch(int64_t tokens, int64_t k, int64_t hidden, int64_t experts, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Batch b{tokens, k, hidden, {}, {}, {}};
  b.x.resize(static_cast<size_t>(tokens * hidden));
  for (float& v : b.x) v = nd(rng);
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(experts));
    for (int32_t e = 0; e < experts; ++e) all[static_cast<size_t>(e)] = e;
    std::shuffle(all.begin(), all.end(), rng);
    for (int64_t j = 0; j < k; ++j) {
      b.ids.push_back(all[static_cast<size_t>(j)]);
      b.w.push_back(0.1f + 0.05f * static_cast<float>(j + t % 3));
    }
  }
  return b;
}

// The engine's path: the experts as MoeRuntime prepares them for --cpu-experts `format` (in
// memory, no cache file) and the fused backend without shared experts.
std::vector<float> engine_moe(const LoadedModel& m, int64_t layer, const std::string& format,
                              int group, const Batch& b, ThreadPool* pool) {
  CpuExpertOptions co;
  co.format = format;
  co.group = group;
  co.use_cache = false;
  const CpuExperts ce = prepare_cpu_experts(m, co, pool);
  FusedMoeBackend backend(pool, FusedMoeOptions{}, &ce);
  const LayerWeights& lw = m.layers[static_cast<size_t>(layer)];
  std::vector<float> out(b.x.size());
  MoeRequest r;
  r.layer = layer;
  r.n_moe_layers = m.config.num_moe_layers();
  r.layer_weights = &lw;
  r.experts = &lw.experts;
  r.hidden = b.x.data();
  r.n_tokens = b.tokens;
  r.hidden_size = b.hidden;
  r.ids = b.ids.data();
  r.weights = b.w.data();
  r.k = b.k;
  r.out = out.data();
  backend.submit(r);
  backend.wait();
  return out;
}

std::vector<float> layer_forward(MoeLayer& l, const Batch& b) {
  std::vector<float> out(b.x.size(), -1.0f);
  l.forward(b.x.data(), b.tokens, b.ids.data(), b.w.data(), b.k, out.data());
  return out;
}

void expect_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  EXPECT_EQ(diff, 0u) << what << ": " << diff << " of " << a.size() << " values differ";
}

struct Case {
  const char* model;
  int64_t layer;
  const char* method;   // MoeLayer's
  const char* format;   // the engine's --cpu-experts
  int group = 128;      // int8 / int4
};

class MoeLayerGolden : public ::testing::TestWithParam<Case> {};

TEST_P(MoeLayerGolden, EqualsTheEnginesMoeBitForBit) {
  const Case c = GetParam();
  auto ctx = make_moe_context(2);
  const LoadedModel m = load_model(golden(c.model));
  MoeLayerOptions o;
  o.method = c.method;
  o.group = c.group;
  MoeLayer layer(ctx, o, golden(c.model), c.layer);
  const MoeLayerOptions& got = layer.options();
  EXPECT_EQ(got.num_experts, m.config.n_experts);
  EXPECT_EQ(got.hidden_size, m.config.hidden_size);
  ThreadingOptions to;
  to.n_threads = 2;
  ThreadingContext threading(to);
  for (int64_t tokens : {1, 3, 17}) {
    const Batch b = make_batch(tokens, got.num_experts_per_tok, got.hidden_size, got.num_experts,
                               static_cast<uint32_t>(tokens));
    expect_bits(layer_forward(layer, b), engine_moe(m, c.layer, c.format, c.group, b, &threading.pool()),
                std::string(c.model) + " " + c.method + " tokens " + std::to_string(tokens));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, MoeLayerGolden,
    ::testing::Values(Case{"qwen3moe-q8_0.gguf", 1, "gguf", "repack"},
                      Case{"deepseek2-q4_k_m.gguf", 2, "gguf", "repack"},
                      Case{"mixtral-q4_k_m.gguf", 0, "int8", "int8"},
                      Case{"qwen3moe-hf", 0, "bf16", "bf16"},
                      Case{"deepseek3-hf", 1, "int4", "int4", 32},
                      // gpt-oss: the experts' biases and clamped SwiGLU with the weights
                      Case{"gpt-oss-mxfp4_moe.gguf", 1, "gguf", "repack"},
                      Case{"gpt-oss-hf", 0, "int8", "int8", 32}),
    [](const auto& info) {
      std::string s = std::string(info.param.model) + "_" + info.param.method;
      for (char& ch : s) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return s;
    });

// A DeepSeek-V3-style FP8 checkpoint (block-scaled E4M3, as `tandem synth --type fp8` writes it):
// method fp8 (read as stored) and int8 (requantized from FP8) against the engine's native and
// int8 experts, and its per-expert tensors handed over one pointer each = the model path.
TEST(MoeLayer, Fp8CheckpointEqualsTheEngine) {
  test::TempDir dir("moefp8");
  SynthOptions so;
  so.config = config_preset("tiny-deepseek3");
  so.format = SynthFormat::kHf;
  so.type = SynthType::kFp8;
  so.seed = 3;
  so.output = dir / "fp8";
  so.progress = false;
  synth_model(so);
  const std::string path = (dir / "fp8").string();
  const LoadedModel m = load_model(path);
  int64_t layer = 0;
  while (!m.layers[static_cast<size_t>(layer)].moe) ++layer;
  const ExpertWeights& e = m.layers[static_cast<size_t>(layer)].experts;
  ASSERT_EQ(e.gate[0].t.dtype, DType::kF8E4M3);
  auto ctx = make_moe_context(2);
  ThreadingOptions to;
  to.n_threads = 2;
  ThreadingContext threading(to);
  for (const auto& [method, format] : {std::pair<const char*, const char*>{"fp8", "native"},
                                       {"int8", "int8"}}) {
    MoeLayerOptions o;
    o.method = method;
    o.group = 32;
    MoeLayer from_path(ctx, o, path, layer);
    o = from_path.options();
    auto each = [&](const std::vector<ops::Weight>& w) {
      ExpertTensor t;
      t.dtype = w[0].t.dtype;
      t.experts = static_cast<int64_t>(w.size());
      t.rows = w[0].rows();
      t.cols = w[0].cols();
      t.block_rows = w[0].block_rows;
      t.block_cols = w[0].block_cols;
      for (const ops::Weight& x : w) {
        t.each.push_back(x.t.data);
        t.each_scales.push_back(x.scale_inv);
      }
      return t;
    };
    MoeLayer from_raw(ctx, o, each(e.gate), each(e.up), each(e.down));
    const Batch b = make_batch(7, o.num_experts_per_tok, o.hidden_size, o.num_experts, 9);
    const std::vector<float> want = engine_moe(m, layer, format, 32, b, &threading.pool());
    expect_bits(layer_forward(from_path, b), want, std::string(method) + " model path");
    expect_bits(layer_forward(from_raw, b), want, std::string(method) + " per-expert tensors");
  }
}

// The GGUF's stacked expert tensors handed over as raw memory = the model path constructor.
TEST(MoeLayer, RawTensorsEqualTheModelPath) {
  const std::string path = golden("qwen3moe-q4_k_m.gguf");
  const LoadedModel m = load_model(path);
  const ExpertWeights& e = m.layers[1].experts;
  auto raw = [&](const std::vector<ops::Weight>& w) {
    ExpertTensor t;
    t.data = w[0].t.data;
    t.dtype = w[0].t.dtype;
    t.experts = static_cast<int64_t>(w.size());
    t.rows = w[0].rows();
    t.cols = w[0].cols();
    // (the GGUF stacks them: expert i's rows follow expert i - 1's)
    EXPECT_EQ(static_cast<const uint8_t*>(w[1].t.data),
              static_cast<const uint8_t*>(w[0].t.data) + t.rows * w[0].t.row_bytes());
    return t;
  };
  auto ctx = make_moe_context(2);
  for (const char* method : {"gguf", "int8", "int4", "bf16"}) {
    MoeLayerOptions o;
    o.method = method;
    MoeLayer from_path(ctx, o, path, 1);
    o = from_path.options();
    MoeLayer from_raw(ctx, o, raw(e.gate), raw(e.up), raw(e.down));
    EXPECT_EQ(from_raw.weight_format(), from_path.weight_format());
    const Batch b = make_batch(9, o.num_experts_per_tok, o.hidden_size, o.num_experts, 5);
    expect_bits(layer_forward(from_raw, b), layer_forward(from_path, b), method);
  }
}

// Skipped experts (mask, -1) contribute nothing: the reference backend on the same weights with
// those selections' weights set to 0 gives the same sums (within activation quantization: F32
// reference, Q8 activations).
TEST(MoeLayer, MaskAndEmptySlotsSkipExperts) {
  const std::string path = golden("qwen3moe.gguf");  // F32 weights
  const LoadedModel m = load_model(path);
  auto ctx = make_moe_context(2);
  MoeLayerOptions o;
  o.method = "int8";
  o.gpu_experts_mask.assign(8, 0);
  o.gpu_experts_mask[2] = o.gpu_experts_mask[5] = 1;
  MoeLayer layer(ctx, o, path, 0);
  o = layer.options();
  Batch b = make_batch(6, o.num_experts_per_tok, o.hidden_size, o.num_experts, 3);
  b.ids[1] = -1;  // token 0's second slot: empty
  Batch ref = b;
  for (size_t i = 0; i < ref.ids.size(); ++i) {
    if (ref.ids[i] == -1 || ref.ids[i] == 2 || ref.ids[i] == 5) {
      ref.ids[i] = 0;
      ref.w[i] = 0.0f;
    }
  }
  std::vector<float> want(b.x.size());
  CpuMoeBackend reference(nullptr);
  MoeRequest r;
  r.experts = &m.layers[0].experts;
  r.hidden = ref.x.data();
  r.n_tokens = ref.tokens;
  r.hidden_size = ref.hidden;
  r.ids = ref.ids.data();
  r.weights = ref.w.data();
  r.k = ref.k;
  r.out = want.data();
  reference.submit(r);
  reference.wait();
  const std::vector<float> got = layer_forward(layer, b);
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  EXPECT_LT(std::sqrt(num / den), 0.02) << "relative L2 error vs the F32 reference";
  // And the mask is really honoured: without it the result differs.
  layer.set_gpu_experts_mask({});
  const std::vector<float> unmasked = layer_forward(layer, b);
  EXPECT_NE(std::memcmp(unmasked.data(), got.data(), got.size() * sizeof(float)), 0);
}

TEST(MoeLayer, RemapPermutesSlots) {
  const std::string path = golden("qwen3moe-q8_0.gguf");
  auto ctx = make_moe_context(2);
  MoeLayerOptions o;
  o.method = "gguf";
  MoeLayer plain(ctx, o, path, 0), mapped(ctx, o, path, 0);
  // Slot p holds logical expert map[p]; 10 slots for 8 experts (two replicas).
  const std::vector<int64_t> map = {7, 6, 5, 4, 3, 2, 1, 0, 3, 0};
  mapped.remap(map);
  o = plain.options();
  const Batch logical = make_batch(5, o.num_experts_per_tok, o.hidden_size, 8, 11);
  Batch physical = logical;
  for (size_t i = 0; i < physical.ids.size(); ++i) {
    // the first slot holding each logical expert (3 and 0 also at 8, 9: use those)
    const int32_t e = logical.ids[i];
    physical.ids[i] = e == 3 ? 8 : e == 0 ? 9 : 7 - e;
  }
  expect_bits(layer_forward(mapped, physical), layer_forward(plain, logical), "remap");
  EXPECT_THROW(mapped.remap({0, 8}), Error);  // logical 8 does not exist
}

TEST(MoeLayer, SeveralLayersInFlightEqualOneAtATime) {
  const std::string path = golden("deepseek2-q8_0.gguf");
  auto ctx = make_moe_context(2);
  MoeLayerOptions o;
  o.method = "gguf";
  MoeLayer a(ctx, o, path, 1), b(ctx, o, path, 2);
  o = a.options();
  const Batch x = make_batch(4, o.num_experts_per_tok, o.hidden_size, o.num_experts, 1);
  const Batch y = make_batch(30, o.num_experts_per_tok, o.hidden_size, o.num_experts, 2);
  const std::vector<float> want_a = layer_forward(a, x), want_b = layer_forward(b, y);
  for (int round = 0; round < 3; ++round) {
    std::vector<float> got_a(x.x.size()), got_b(y.x.size());
    a.submit(x.x.data(), x.tokens, x.ids.data(), x.w.data(), x.k, got_a.data());
    b.submit(y.x.data(), y.tokens, y.ids.data(), y.w.data(), y.k, got_b.data());
    EXPECT_THROW(a.submit(x.x.data(), x.tokens, x.ids.data(), x.w.data(), x.k, got_a.data()),
                 Error);  // one in flight per layer
    b.sync();
    a.sync();
    expect_bits(got_a, want_a, "layer a");
    expect_bits(got_b, want_b, "layer b");
    a.sync();  // nothing in flight: returns
  }
}

// Expert Deferral's submits (kt-kernel's): a layer's deferred experts submitted after its own
// submit run after it without sync() waiting for them, into another buffer; the next layer's
// submit that accumulates adds to what they wrote, bit for bit the two forwards summed; a
// submit's own mask is used for it alone; a deferred submit without the layer's submit, or a
// second one, is refused.
TEST(MoeLayer, DeferredSubmitsAccumulateIntoTheNextLayer) {
  const std::string path = golden("deepseek2-q8_0.gguf");
  auto ctx = make_moe_context(2);
  MoeLayerOptions o;
  o.method = "gguf";
  MoeLayer a(ctx, o, path, 1), b(ctx, o, path, 2);
  o = a.options();
  const int64_t E = o.num_experts;
  const Batch x = make_batch(5, o.num_experts_per_tok, o.hidden_size, E, 4);
  const Batch y = make_batch(5, o.num_experts_per_tok, o.hidden_size, E, 5);
  // Split a's slots: the first of each token immediate, the rest deferred.
  Batch now = x, later = x;
  for (size_t i = 0; i < x.ids.size(); ++i) {
    const bool first = i % static_cast<size_t>(x.k) == 0;
    now.ids[i] = first ? x.ids[i] : -1;
    later.ids[i] = first ? -1 : x.ids[i];
  }
  const std::vector<float> want_now = layer_forward(a, now), want_later = layer_forward(a, later);
  const std::vector<float> want_b = layer_forward(b, y);
  std::vector<float> out_a(x.x.size()), carry(x.x.size(), 123.0f);
  a.submit(now.x.data(), now.tokens, now.ids.data(), now.w.data(), now.k, out_a.data());
  SubmitOptions deferred;
  deferred.deferred = true;
  a.submit(later.x.data(), later.tokens, later.ids.data(), later.w.data(), later.k, carry.data(),
           deferred);
  EXPECT_THROW(a.submit(later.x.data(), later.tokens, later.ids.data(), later.w.data(), later.k,
                        carry.data(), deferred),
               Error);  // one deferred submit per submit
  a.sync();
  expect_bits(out_a, want_now, "the immediate experts");
  SubmitOptions accumulate;
  accumulate.accumulate = true;
  b.submit(y.x.data(), y.tokens, y.ids.data(), y.w.data(), y.k, carry.data(), accumulate);
  b.sync();
  std::vector<float> sum(want_b.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = want_later[i] + want_b[i];
  expect_bits(carry, sum, "the next layer's experts added to the deferred ones");
  EXPECT_THROW(a.submit(x.x.data(), x.tokens, x.ids.data(), x.w.data(), x.k, out_a.data(),
                        deferred),
               Error);  // no submit of the layer's own in flight

  // A submit's mask: every expert on the GPU -> nothing computed, for this submit only.
  SubmitOptions all_gpu;
  all_gpu.gpu_experts_mask.assign(static_cast<size_t>(E), 1);
  std::vector<float> none(x.x.size(), 7.0f);
  a.submit(x.x.data(), x.tokens, x.ids.data(), x.w.data(), x.k, none.data(), all_gpu);
  a.sync();
  for (float v : none) ASSERT_EQ(v, 0.0f);
  expect_bits(layer_forward(a, now), want_now, "the layer's own mask after it");
  all_gpu.gpu_experts_mask.pop_back();
  EXPECT_THROW(a.submit(x.x.data(), x.tokens, x.ids.data(), x.w.data(), x.k, none.data(),
                        all_gpu),
               Error);  // a mask of the wrong size
}

// begin() / end(out) is forward() in two halves: the same bits, chunked or not; the layer takes
// no other call in between; end(nullptr) discards.
TEST(MoeLayer, BeginEndEqualsForward) {
  const std::string path = golden("qwen3moe-q4_k_m.gguf");
  auto ctx = make_moe_context(2);
  MoeLayerOptions o;
  o.method = "gguf";
  MoeLayer whole(ctx, o, path, 1);
  o.max_chunk_tokens = 4;
  MoeLayer chunked(ctx, o, path, 1);
  o = whole.options();
  for (int64_t tokens : {1, 4, 11}) {
    const Batch b = make_batch(tokens, o.num_experts_per_tok, o.hidden_size, o.num_experts, 4);
    const std::vector<float> want = layer_forward(whole, b);
    for (MoeLayer* l : {&whole, &chunked}) {
      std::vector<float> got(b.x.size(), -1.0f);
      l->begin(b.x.data(), b.tokens, b.ids.data(), b.w.data(), b.k);
      EXPECT_THROW(l->forward(b.x.data(), b.tokens, b.ids.data(), b.w.data(), b.k, got.data()),
                   Error);
      l->end(got.data());
      expect_bits(got, want, "begin/end, tokens " + std::to_string(tokens));
      l->begin(b.x.data(), b.tokens, b.ids.data(), b.w.data(), b.k);
      l->end(nullptr);
    }
  }
  EXPECT_THROW(whole.end(nullptr), Error);  // no begin
}

template <typename F>
void expect_error(F&& f, ErrorKind kind, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(MoeLayer, BadArgumentsNameTheArgument) {
  auto ctx = make_moe_context(1);
  std::vector<float> w(4 * 64 * 32, 0.01f);
  MoeLayerOptions o;
  o.num_experts = 4;
  o.num_experts_per_tok = 2;
  o.hidden_size = 32;
  o.intermediate_size = 64;
  o.method = "int8";
  o.group = 32;
  auto t = [&](int64_t rows, int64_t cols, DType dt = DType::kF32) {
    ExpertTensor x;
    x.data = w.data();
    x.dtype = dt;
    x.experts = 4;
    x.rows = rows;
    x.cols = cols;
    return x;
  };
  expect_error([&] { MoeLayer l(ctx, o, t(64, 32), t(64, 32), t(64, 32)); },
               ErrorKind::kInvalidArgument, "down");
  expect_error([&] { MoeLayer l(ctx, o, t(64, 31), t(64, 32), t(32, 64)); },
               ErrorKind::kInvalidArgument, "gate");
  MoeLayerOptions bad = o;
  bad.method = "int3";
  expect_error([&] { MoeLayer l(ctx, bad, t(64, 32), t(64, 32), t(32, 64)); },
               ErrorKind::kInvalidArgument, "method");
  bad = o;
  bad.method = "fp8";
  expect_error([&] { MoeLayer l(ctx, bad, t(64, 32), t(64, 32), t(32, 64)); },
               ErrorKind::kUnsupported, "fp8");
  bad = o;
  bad.num_experts_per_tok = 5;
  expect_error([&] { MoeLayer l(ctx, bad, t(64, 32), t(64, 32), t(32, 64)); },
               ErrorKind::kInvalidArgument, "num_experts_per_tok");
  bad = o;
  bad.gpu_experts_mask = {1, 0};
  expect_error([&] { MoeLayer l(ctx, bad, t(64, 32), t(64, 32), t(32, 64)); },
               ErrorKind::kInvalidArgument, "gpu_experts_mask");
  MoeLayer layer(ctx, o, t(64, 32), t(64, 32), t(32, 64));
  std::vector<float> x(2 * 32, 1.0f), out(2 * 32), wt(4, 0.5f);
  std::vector<int32_t> ids = {0, 1, 2, 4};
  expect_error([&] { layer.forward(x.data(), 2, ids.data(), wt.data(), 2, out.data()); },
               ErrorKind::kInvalidArgument, "topk_ids[1][1] = 4");
  ids[3] = 3;
  expect_error([&] { layer.forward(x.data(), 2, ids.data(), wt.data(), 3, out.data()); },
               ErrorKind::kInvalidArgument, "num_experts_per_tok");
  expect_error([&] { MoeLayer l(ctx, MoeLayerOptions{}, golden("qwen3moe.gguf"), 9); },
               ErrorKind::kInvalidArgument, "layer_idx");
  expect_error([&] { MoeLayer l(ctx, MoeLayerOptions{}, golden("deepseek2.gguf"), 0); },
               ErrorKind::kInvalidArgument, "dense");
  layer.forward(x.data(), 2, ids.data(), wt.data(), 2, out.data());  // still works
}

}  // namespace
}  // namespace tandem
