// The dense part on a device (runtime/dense_weights.h) and the host device's forward ops around
// it: every non-expert matrix copied byte for byte into device memory (the routed experts not),
// FP8 block scales sliced to a row view's rows with the same value per element, the budget error
// naming the flag; a KV cache made with the ops' cache_options lives in device memory and goes
// back to it; a forward over a host-memory cache is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/model.h"
#include "model/weights.h"
#include "runtime/dense_weights.h"
#include "runtime/device.h"
#include "tests/test_util.h"

namespace tandem::rt {
namespace {

std::unique_ptr<Device> device(uint64_t mem) {
  HostDeviceOptions o;
  o.memory_bytes = mem;
  o.link = parse_link("none");
  return make_host_device(o);
}

// [lo, lo + bytes) inside the device's memory: every allocation lies between the first one and
// the capacity, so a pointer p is device memory when the device says its bytes are (check via a
// forward ops' check_cache is indirect); here: the copies are not the host's pointers and equal
// their bytes.
void expect_copied(const ops::Weight& host, const ops::Weight& dev, const std::string& what) {
  ASSERT_EQ(host.empty(), dev.empty()) << what;
  if (host.empty()) return;
  EXPECT_NE(host.t.data, dev.t.data) << what;
  EXPECT_EQ(host.t.shape, dev.t.shape) << what;
  EXPECT_EQ(std::memcmp(host.t.data, dev.t.data, static_cast<size_t>(host.t.nbytes())), 0) << what;
}

TEST(DenseWeights, EveryDenseMatrixCopiedTheExpertsNot) {
  for (const char* name : {"deepseek3", "qwen2moe", "gpt-oss"}) {
    SCOPED_TRACE(name);
    const LoadedModel lm = load_model(test::data_path(std::string("golden/") + name + ".gguf"));
    auto dev = device(uint64_t{64} << 20);
    const uint64_t before = dev->memory_used();
    for (const bool shared : {false, true}) {
      auto w = upload_dense_weights(*dev, lm, shared);
      EXPECT_EQ(w->shared_experts, shared);
      EXPECT_EQ(dev->memory_used() - before, w->bytes);
      const LoadedModel& d = w->weights;
      EXPECT_EQ(std::memcmp(lm.embed.data, d.embed.data, static_cast<size_t>(lm.embed.nbytes())),
                0);
      expect_copied(lm.lm_head, d.lm_head, "lm_head");
      uint64_t sum = 0;
      for (size_t l = 0; l < lm.layers.size(); ++l) {
        const LayerWeights& a = lm.layers[l];
        const LayerWeights& b = d.layers[l];
        for (auto [x, y, what] : {std::tuple{&a.wq, &b.wq, "wq"},
                                  {&a.wk, &b.wk, "wk"},
                                  {&a.wv, &b.wv, "wv"},
                                  {&a.wo, &b.wo, "wo"},
                                  {&a.wq_a, &b.wq_a, "wq_a"},
                                  {&a.wq_b, &b.wq_b, "wq_b"},
                                  {&a.wkv_a, &b.wkv_a, "wkv_a"},
                                  {&a.router, &b.router, "router"},
                                  {&a.ffn_gate, &b.ffn_gate, "ffn_gate"},
                                  {&a.ffn_down, &b.ffn_down, "ffn_down"}}) {
          expect_copied(*x, *y, fmt::format("layer {} {}", l, what));
          if (!x->empty()) sum += static_cast<uint64_t>(x->t.nbytes());
        }
        ASSERT_EQ(a.k_up.size(), b.k_up.size());
        for (size_t h = 0; h < a.k_up.size(); ++h) {
          expect_copied(a.k_up[h], b.k_up[h], fmt::format("layer {} k_up {}", l, h));
          expect_copied(a.v_up[h], b.v_up[h], fmt::format("layer {} v_up {}", l, h));
        }
        if (shared) {
          expect_copied(a.sh_gate, b.sh_gate, "sh_gate");
          expect_copied(a.sh_down, b.sh_down, "sh_down");
          EXPECT_EQ(a.sh_gate_inp, b.sh_gate_inp);
        } else {
          EXPECT_TRUE(b.sh_gate.empty() && b.sh_up.empty() && b.sh_down.empty());
        }
        EXPECT_TRUE(b.experts.gate.empty());  // the routed experts stay on the host
        EXPECT_EQ(a.attn_norm, b.attn_norm);
      }
      EXPECT_GT(sum, 0u);
      EXPECT_GE(w->bytes, sum);
    }
    EXPECT_EQ(dev->memory_used(), before);  // released with the DenseWeights
  }
}

TEST(DenseWeights, Fp8ScalesFollowARowView) {
  // A 10 x 256 FP8 matrix with 4 x 128 scale blocks, viewed from row 5 (rows 5..9): the copy's
  // scale of every element equals the original's.
  const int64_t rows = 10, cols = 256, br = 4, bc = 128;
  std::vector<uint8_t> fp8(static_cast<size_t>(rows * cols), 0x38);
  std::vector<float> scales(static_cast<size_t>(3 * 2));
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 1.0f + static_cast<float>(i);
  LoadedModel lm;
  lm.config.num_layers = 1;
  lm.layers.resize(1);
  ops::Weight full(Tensor::dense(DType::kF8E4M3, {rows, cols}, fp8.data()));
  full.scale_inv = scales.data();
  full.scale_cols = 2;
  full.block_rows = br;
  full.block_cols = bc;
  lm.layers[0].wq = full.row_range(5, 5);
  auto dev = device(uint64_t{1} << 20);
  auto w = upload_dense_weights(*dev, lm, false);
  const ops::Weight& a = lm.layers[0].wq;
  const ops::Weight& b = w->weights.layers[0].wq;
  ASSERT_NE(b.scale_inv, nullptr);
  EXPECT_NE(b.scale_inv, a.scale_inv);
  for (int64_t r = 0; r < a.rows(); ++r) {
    for (int64_t c = 0; c < cols; c += bc) {
      EXPECT_EQ(b.scale_inv[(b.row0 + r) / br * b.scale_cols + c / bc],
                a.scale_inv[(a.row0 + r) / br * a.scale_cols + c / bc])
          << "row " << r << " col " << c;
    }
  }
}

TEST(DenseWeights, TooSmallADeviceNamesTheFlag) {
  const LoadedModel lm = load_model(test::data_path("golden/mixtral.gguf"));
  auto dev = device(uint64_t{1} << 20);
  try {
    upload_dense_weights(*dev, lm, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResource);
    EXPECT_NE(std::string(e.what()).find("--vram-budget"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("device: cpu"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dev->memory_used(), 0u);
}

TEST(HostForwardOps, KvCacheInDeviceMemory) {
  const LoadedModel lm = load_model(test::data_path("golden/qwen2moe.gguf"));
  auto dev = device(uint64_t{64} << 20);
  auto w = upload_dense_weights(*dev, lm, true);
  Device* d = dev.get();
  ModelOptions mo;
  mo.ops = [d, w](const LoadedModel&, const ForwardOpsOptions& o) { return d->forward_ops(w, o); };
  Model model(lm, mo);
  EXPECT_EQ(model.ops().name(), "host");
  KvCacheOptions o;
  o.positions = 128;
  const uint64_t used = dev->memory_used();
  std::vector<float> logits(static_cast<size_t>(lm.config.vocab_size));
  const std::vector<int32_t> tokens = {1, 453, 386};
  {
    KvCache cache(model.kv_layout(), model.cache_options(o));
    EXPECT_GE(dev->memory_used(), used + cache.bytes());
    const SeqId s = cache.create();
    const SeqTokens e{s, tokens, -1, LogitRows::kLast};
    EXPECT_EQ(model.forward(std::span<const SeqTokens>(&e, 1), cache, logits.data()), 1);
    EXPECT_EQ(cache.length(s), 3);
  }
  // A cache in host memory is refused, naming the fix; nothing is taken from it.
  KvCache host_cache(model.kv_layout(), o);
  const SeqId s = host_cache.create();
  const SeqTokens e{s, tokens, -1, LogitRows::kLast};
  try {
    model.forward(std::span<const SeqTokens>(&e, 1), host_cache, logits.data());
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(err.what()).find("cache_options"), std::string::npos) << err.what();
  }
  EXPECT_EQ(host_cache.length(s), 0);
  // A cache larger than the device's memory left: an error naming the flags.
  o.positions = 1 << 20;
  try {
    KvCache big(model.kv_layout(), model.cache_options(o));
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kResource);
    EXPECT_NE(std::string(err.what()).find("--ctx"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace tandem::rt
