// Checkpoints whose weights are INT4 as released, read as stored. A Kimi-K2-Thinking / K2.5-style
// checkpoint -- its routed experts in compressed-tensors'
// pack-quantized INT4 (groups of 32, BF16 scales), written by synth -- is read as stored: each
// expert matrix becomes Q4_0 blocks holding the same values in the same bytes (18 per 32
// weights, as the checkpoint keeps them), and the model gives the logits of its twin whose INT4
// weights are dequantized to F32 here, by compressed-tensors' own unpacking written out
// independently of the loader; the difference is the Q8 rounding of the activations the Q4_0
// kernels take, which a wrong nibble or scale far exceeds. Configurations tandem cannot read
// losslessly are refused naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fp_convert.h"
#include "core/thread_pool.h"
#include "formats/quant.h"
#include "formats/safetensors.h"
#include "formats/synth.h"
#include "model/model.h"
#include "model/weights.h"
#include "moe/fused_moe.h"
#include "tests/model/twin_check.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using test::compare_logits;
using test::copy_tensor;
using test::prompt_logits;
using test::synth_checkpoint;
using test::twin_prompt;

// max|d| / max|ref| per position over 24 positions, INT4 checkpoint against its F32 twin through
// the fused CPU kernels (Q4_0 weights meet Q8 activations there, F32 ones F32): measured 0.0105
// (deepseek3) and 0.0097 (qwen3moe); bound 1.5x. Through the reference backend (F32 arithmetic
// over the dequantized rows) the two are the same numbers: exactly equal.
constexpr double kKernelBound = 0.016;

ThreadingContext& threading() {
  static ThreadingContext ctx(ThreadingOptions{2, false, 50});
  return ctx;
}

// compressed-tensors' unpack_from_int32 + dequantize, as its Python writes them: value i of a row
// is ((word[i / 8] >> 4 (i % 8)) & 15) - 8, times the scale of its group.
void dequantize_ct(const int32_t* packed, const uint16_t* scales, int64_t rows, int64_t cols,
                   int64_t group, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < cols; ++i) {
      const uint32_t word = static_cast<uint32_t>(packed[r * (cols / 8) + i / 8]);
      const int q = static_cast<int>((word >> (4 * (i % 8))) & 15u) - 8;
      out[r * cols + i] = static_cast<float>(q) * bf16_to_f32(scales[r * (cols / group) + i / group]);
    }
  }
}

TEST(ModelInt4, CompressedTensorsBlocksAreQ4_0WithoutLoss) {
  // Random words and scales, groups of 32 and 128: the Q4_0 blocks dequantize to exactly the
  // compressed-tensors values.
  std::mt19937 rng(3);
  for (const int64_t group : {int64_t{32}, int64_t{128}}) {
    const int64_t rows = 5, cols = 256;
    std::vector<int32_t> packed(rows * cols / 8);
    std::vector<uint16_t> scales(rows * cols / group);
    for (int32_t& w : packed) w = static_cast<int32_t>(rng());
    for (uint16_t& s : scales) s = f32_to_bf16(std::ldexp(1.0f + (rng() % 128) / 128.0f, -(int)(rng() % 12)));
    std::vector<BlockQ4_0> q(rows * cols / 32);
    float bad = 0;
    ASSERT_TRUE(int4_groups_to_q4_0(packed.data(), scales.data(), rows, cols, group, q.data(), &bad));
    std::vector<float> want(rows * cols), got(rows * cols);
    dequantize_ct(packed.data(), scales.data(), rows, cols, group, want.data());
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(DType::kQ4_0, q.data() + r * cols / 32, got.data() + r * cols, cols);
    }
    ASSERT_EQ(got, want) << "group " << group;
    // A scale F16 cannot hold (below its subnormals' precision) is refused.
    scales[3] = f32_to_bf16(std::ldexp(1.5f, -30));
    EXPECT_FALSE(int4_groups_to_q4_0(packed.data(), scales.data(), rows, cols, group, q.data(),
                                     &bad));
    EXPECT_EQ(bad, bf16_to_f32(scales[3]));
  }
}

class ModelInt4Release : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelInt4Release, ReadAsStoredEqualsTheDequantizedTwin) {
  test::TempDir dir("int4");
  const auto int4_dir = synth_checkpoint(dir.path(), GetParam(), SynthType::kInt4Ct, "int4");
  // (for the twin's config.json: the same model, no quantization)
  const auto bf16_dir = synth_checkpoint(dir.path(), GetParam(), SynthType::kBF16, "bf16");

  // The twin: every INT4 matrix dequantized to F32.
  const SafetensorsModel src = SafetensorsModel::open(int4_dir);
  std::filesystem::create_directories(dir / "f32");
  SafetensorsWriter w(dir / "f32");
  uint64_t int4_bytes = 0;
  for (const auto& t : src.tensors()) {
    if (t.name.ends_with("weight_scale") || t.name.ends_with("weight_shape")) continue;
    if (!t.name.ends_with("weight_packed")) {
      copy_tensor(w, t);
      continue;
    }
    const std::string base = t.name.substr(0, t.name.size() - std::string_view("_packed").size());
    const Tensor sc = src.tensor(base + "_scale");
    int4_bytes += t.nbytes + static_cast<uint64_t>(sc.nbytes());
    const int64_t rows = t.shape[0], cols = t.shape[1] * 8;
    const auto* data = reinterpret_cast<const int32_t*>(t.data);
    w.add_tensor(base, DType::kF32, {rows, cols}, [=](void* dst) {
      dequantize_ct(data, sc.as<const uint16_t>(), rows, cols, 32, static_cast<float*>(dst));
    });
  }
  ASSERT_GT(int4_bytes, 0u);
  w.write();
  std::filesystem::copy_file(bf16_dir / "config.json", dir / "f32" / "config.json");

  const LoadedModel int4 = load_model(int4_dir);
  const int64_t moe_layer = int4.config.first_k_dense_replace;
  ASSERT_EQ(int4.layers[moe_layer].experts.gate[0].t.dtype, DType::kQ4_0);
  // Not expanded: what the loader made of the INT4 tensors is the bytes they are stored in.
  uint64_t owned = 0;
  for (const AlignedBuffer& b : int4.owned) owned += b.size();
  std::printf("%s: INT4 tensors %llu bytes stored, %llu bytes resident after load\n", GetParam(),
              static_cast<unsigned long long>(int4_bytes),
              static_cast<unsigned long long>(owned));
  EXPECT_EQ(owned, int4_bytes);

  const LoadedModel f32 = load_model(dir / "f32");
  const int64_t nv = int4.config.vocab_size;
  const std::vector<int32_t> tokens = twin_prompt(nv);
  // The reference backend: the same weights, the same arithmetic.
  EXPECT_EQ(prompt_logits(int4, tokens), prompt_logits(f32, tokens));
  // The CPU kernels: Q4_0's (Q8 activations) against F32's.
  FusedMoeBackend moe_a(&threading().pool()), moe_b(&threading().pool());
  const test::LogitsDiff d = compare_logits(prompt_logits(int4, tokens, &moe_a),
                                            prompt_logits(f32, tokens, &moe_b), nv);
  std::printf("%s: INT4 vs its dequantized twin: worst position %.5f, argmax %d/%zu\n",
              GetParam(), d.worst, d.agree, tokens.size());
  EXPECT_GT(d.worst, 0.0);
  EXPECT_LE(d.worst, kKernelBound);
  EXPECT_GE(d.agree, static_cast<int>(tokens.size()) - 1);
}

INSTANTIATE_TEST_SUITE_P(Presets, ModelInt4Release,
                         ::testing::Values("tiny-deepseek3", "tiny-qwen3moe"),
                         [](const auto& info) { return std::to_string(info.index); });

// AutoGPTQ's dequantization, written out: w[n][k] = scale[k / g][n] * (q - (z + 1)), q the nibble
// k % 8 of qweight[k / 8][n], z the nibble n % 8 of qzeros[k / g][n / 8] (checkpoint_format gptq
// stores the zero point minus one).
void dequantize_gptq(const int32_t* qweight, const uint16_t* scales, const int32_t* qzeros,
                     int64_t out, int64_t in, int64_t group, float* w) {
  for (int64_t n = 0; n < out; ++n) {
    for (int64_t k = 0; k < in; ++k) {
      const uint32_t qw = static_cast<uint32_t>(qweight[(k / 8) * out + n]);
      const uint32_t zw = static_cast<uint32_t>(qzeros[(k / group) * (out / 8) + n / 8]);
      const int q = static_cast<int>((qw >> (4 * (k % 8))) & 15u);
      const int z = static_cast<int>((zw >> (4 * (n % 8))) & 15u) + 1;
      w[n * in + k] = static_cast<float>(q - z) * f16_to_f32(scales[(k / group) * out + n]);
    }
  }
}

// A GPTQ INT4 release (Qwen's GPTQ-Int4 checkpoints: every linear weight, groups of 128), written
// by synth, read as Q4_0 blocks: against its twin dequantized by AutoGPTQ's formula above, within
// kKernelBound on both backends (attention's Q4_0 products take Q8 activations on both; measured
// 0.0083 reference, 0.0113 kernels).
TEST(ModelInt4, GptqReadAsStoredEqualsTheDequantizedTwin) {
  test::TempDir dir("gptq");
  const auto gptq_dir = synth_checkpoint(dir.path(), "tiny-qwen3moe", SynthType::kGptqInt4, "gptq");
  const auto bf16_dir = synth_checkpoint(dir.path(), "tiny-qwen3moe", SynthType::kBF16, "bf16");
  const SafetensorsModel src = SafetensorsModel::open(gptq_dir);
  std::filesystem::create_directories(dir / "f32");
  SafetensorsWriter w(dir / "f32");
  uint64_t int4_bytes = 0, q4_0_bytes = 0;
  for (const auto& t : src.tensors()) {
    const bool part = t.name.ends_with(".scales") || t.name.ends_with(".qzeros") ||
                      t.name.ends_with(".g_idx");
    if (part) continue;
    if (!t.name.ends_with(".qweight")) {
      copy_tensor(w, t);
      continue;
    }
    const std::string base = t.name.substr(0, t.name.size() - std::string_view(".qweight").size());
    const Tensor sc = src.tensor(base + ".scales"), qz = src.tensor(base + ".qzeros");
    int4_bytes += t.nbytes + static_cast<uint64_t>(sc.nbytes());
    const int64_t in = t.shape[0] * 8, out = t.shape[1];
    q4_0_bytes += static_cast<uint64_t>(in * out / 32 * 18);
    const auto* qw = reinterpret_cast<const int32_t*>(t.data);
    w.add_tensor(base + ".weight", DType::kF32, {out, in}, [=](void* dst) {
      dequantize_gptq(qw, sc.as<const uint16_t>(), qz.as<const int32_t>(), out, in, 128,
                      static_cast<float*>(dst));
    });
  }
  w.write();
  std::filesystem::copy_file(bf16_dir / "config.json", dir / "f32" / "config.json");
  const LoadedModel gptq = load_model(gptq_dir);
  const LoadedModel f32 = load_model(dir / "f32");
  ASSERT_EQ(gptq.layers[0].experts.gate[0].t.dtype, DType::kQ4_0);
  ASSERT_EQ(gptq.layers[0].wq.t.dtype, DType::kQ4_0);
  // What loading made is Q4_0's 18 bytes per 32 weights: GPTQ's groups of 128 keep a scale per 128
  // (16.5 bytes per 32), so 9% more than stored, not the 7x of F32.
  const auto owned = [](const LoadedModel& m) {
    uint64_t n = 0;
    for (const AlignedBuffer& b : m.owned) n += b.size();
    return n;
  };
  EXPECT_EQ(owned(gptq) - owned(f32), q4_0_bytes);
  std::printf("gptq: INT4 tensors %llu bytes stored, %llu resident after load\n",
              static_cast<unsigned long long>(int4_bytes),
              static_cast<unsigned long long>(owned(gptq)));
  const int64_t nv = gptq.config.vocab_size;
  const std::vector<int32_t> tokens = twin_prompt(nv);
  // (Attention's Q4_0 products take Q8 activations on both paths: no path is exact here.)
  FusedMoeBackend moe_a(&threading().pool()), moe_b(&threading().pool());
  for (const bool kernels : {false, true}) {
    const test::LogitsDiff d =
        compare_logits(prompt_logits(gptq, tokens, kernels ? &moe_a : nullptr),
                       prompt_logits(f32, tokens, kernels ? &moe_b : nullptr), nv);
    std::printf("gptq vs its dequantized twin (%s): worst position %.5f\n",
                kernels ? "kernels" : "reference", d.worst);
    EXPECT_GT(d.worst, 0.0);
    EXPECT_LE(d.worst, kKernelBound);
  }
  // Reordered groups are refused.
  nlohmann::json j;
  std::ifstream(gptq_dir / "config.json") >> j;
  j["quantization_config"]["desc_act"] = true;
  std::ofstream(gptq_dir / "config.json") << j.dump(2);
  try {
    load_model(gptq_dir);
    ADD_FAILURE() << "desc_act: no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("desc_act true"), std::string::npos) << e.what();
  }
}

// What is not compressed-tensors' symmetric pack-quantized INT4 is refused, naming the field.
TEST(ModelInt4, OtherQuantizationConfigsAreRefused) {
  test::TempDir dir("int4c");
  const auto m = synth_checkpoint(dir.path(), "tiny-deepseek3", SynthType::kInt4Ct, "m");
  const std::filesystem::path config = m / "config.json";
  nlohmann::json j;
  std::ifstream(config) >> j;
  const nlohmann::json original = j;
  const auto refused = [&](const char* what, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json k = original;
    edit(k["quantization_config"]);
    std::ofstream(config) << k.dump(2);
    try {
      load_model(m);
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused("format 'nvfp4-pack-quantized'",
          [](nlohmann::json& q) { q["format"] = "nvfp4-pack-quantized"; });
  refused("symmetric false", [](nlohmann::json& q) {
    q["config_groups"]["group_0"]["weights"]["symmetric"] = false;
  });
  refused("8-bit", [](nlohmann::json& q) {
    q["config_groups"]["group_0"]["weights"]["num_bits"] = 8;
  });
  refused("quantizes activations", [](nlohmann::json& q) {
    q["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}};
  });
  refused("groups of 16", [](nlohmann::json& q) {
    q["config_groups"]["group_0"]["weights"]["group_size"] = 16;
  });
  refused("quant_method 'awq'", [](nlohmann::json& q) { q = {{"quant_method", "awq"}}; });
  refused("quantization_config: [json.exception", [](nlohmann::json& q) {
    q["config_groups"]["group_0"]["weights"]["num_bits"] = "4";  // (a string: refused, named)
  });
}

}  // namespace
}  // namespace tandem
