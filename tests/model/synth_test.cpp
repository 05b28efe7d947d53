// Synthetic models against the golden llama.cpp / transformers files: same layout (tensor names,
// shapes, ggml types, metadata keys), layout rules that reproduce the golden HF -> GGUF
// conversion bit for bit, quantized and FP8 variants that decode to the same weights,
// determinism, routing spread, and the `tandem synth` / `tandem show` commands.
#include "formats/synth.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/fp_convert.h"
#include "formats/gguf.h"
#include "formats/model_config.h"
#include "formats/quant.h"
#include "formats/safetensors.h"
#include "formats/tokenizer_synth.h"
#include "model/weights.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

const char* kArches[] = {"deepseek2", "deepseek3", "qwen2moe", "qwen3moe", "mixtral"};

SynthPlan synth(const fs::path& out, const std::string& arch, SynthType type,
                SynthFormat format = SynthFormat::kGguf, uint64_t seed = 7) {
  SynthOptions o;
  o.config = config_preset("tiny-" + arch);
  o.name = "test-" + arch;
  o.format = format;
  o.type = type;
  o.seed = seed;
  o.output = out;
  o.progress = false;
  return synth_model(o);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::set<std::string> model_keys(const GgufFile& f) {
  std::set<std::string> keys;
  for (const auto& [k, v] : f.metadata()) {
    if (!k.starts_with("tokenizer.") && k != "general.name") keys.insert(k);
  }
  return keys;
}

// One row of a tensor as F32 (any dtype).
std::vector<float> row_f32(const Tensor& t, int64_t r) {
  std::vector<float> out(t.row_elems());
  dequantize_row(t.dtype, t.row(r), out.data(), t.row_elems());
  return out;
}

float element_f32(const Tensor& t, int64_t index) {
  switch (t.dtype) {
    case DType::kBF16:
      return bf16_to_f32(t.as<uint16_t>()[index]);
    case DType::kF32:
      return t.as<float>()[index];
    default:
      ADD_FAILURE() << "unexpected dtype " << dtype_name(t.dtype);
      return 0;
  }
}

// Checks every row of every GGUF tensor against the HF tensor elements the layout rules map it
// to; `exact` for F32 GGUF vs BF16 safetensors holding the same numbers.
void expect_gguf_rows_from_hf(const ModelConfig& c, const GgufFile& gguf,
                              const SafetensorsModel& hf_model) {
  const std::vector<HfTensorSpec> hf = hf_tensor_specs(c);
  for (const GgufTensorSpec& spec : gguf_tensor_specs(c, hf)) {
    const Tensor g = gguf.tensor(spec.name);
    ASSERT_EQ(g.dtype, DType::kF32) << spec.name;
    const int64_t cols = spec.shape.back();
    int mismatches = 0;
    for (int64_t r = 0; r < g.rows() && mismatches == 0; ++r) {
      const HfRowRef ref = spec.row(r);
      const Tensor h = hf_model.tensor(hf[ref.hf_index].name);
      for (int64_t k = 0; k < cols; ++k) {
        const float want = element_f32(h, ref.start + k * ref.stride);
        const float got = g.row<float>(r)[k];
        if (got != want) {
          ADD_FAILURE() << spec.name << " row " << r << " col " << k << ": " << got << " vs "
                        << want << " (" << hf[ref.hf_index].name << ")";
          ++mismatches;
          break;
        }
      }
    }
  }
}

TEST(Synth, GgufLayoutMatchesGoldenPerArch) {
  test::TempDir dir("synth");
  for (const char* arch : kArches) {
    SCOPED_TRACE(arch);
    synth(dir / "m.gguf", arch, SynthType::kF32);
    GgufFile ours = GgufFile::open(dir / "m.gguf");
    GgufFile gold = GgufFile::open(test::data_path(std::string("golden/") + arch + ".gguf"));
    EXPECT_EQ(model_keys(ours), model_keys(gold));
    ASSERT_EQ(ours.tensors().size(), gold.tensors().size());
    for (const GgufTensorInfo& g : gold.tensors()) {
      const GgufTensorInfo* t = ours.find_tensor(g.name);
      ASSERT_NE(t, nullptr) << g.name;
      EXPECT_EQ(t->ndim, g.ndim) << g.name;
      EXPECT_EQ(t->shape, g.shape) << g.name;
      EXPECT_EQ(t->dtype, g.dtype) << g.name;
    }
    // Same tensor order as convert_hf_to_gguf.py wrote the golden file.
    for (size_t i = 0; i < gold.tensors().size(); ++i) {
      EXPECT_EQ(ours.tensors()[i].name, gold.tensors()[i].name);
    }
    const ModelConfig hf =
        config_from_hf_json(test::data_path(std::string("golden/") + arch + "-hf/config.json"));
    const auto diff = config_diff(config_from_gguf(ours), hf);
    EXPECT_TRUE(diff.empty()) << ::testing::PrintToString(diff);
    // Tokenizer keys: the same set as the golden BPE files (Mixtral's golden file is SPM).
    if (std::string(arch) != "mixtral") {
      std::set<std::string> a, b;
      for (const auto& [k, v] : ours.metadata())
        if (k.starts_with("tokenizer.")) a.insert(k);
      for (const auto& [k, v] : gold.metadata())
        if (k.starts_with("tokenizer.")) b.insert(k);
      EXPECT_EQ(a, b);
    }
  }
}

TEST(Synth, QuantizedTypesMatchLlamaQuantize) {
  test::TempDir dir("synthq");
  for (const char* arch : kArches) {
    for (const auto& [type, suffix] :
         {std::pair{SynthType::kQ4_K_M, "-q4_k_m"}, std::pair{SynthType::kQ8_0, "-q8_0"}}) {
      SCOPED_TRACE(std::string(arch) + suffix);
      synth(dir / "m.gguf", arch, type);
      GgufFile ours = GgufFile::open(dir / "m.gguf");
      GgufFile gold =
          GgufFile::open(test::data_path(std::string("golden/") + arch + suffix + ".gguf"));
      EXPECT_EQ(model_keys(ours), model_keys(gold));
      EXPECT_EQ(ours.get_int("general.file_type", -1), gold.get_int("general.file_type", -2));
      EXPECT_EQ(ours.get_int("general.quantization_version", -1), 2);
      for (const GgufTensorInfo& g : gold.tensors()) {
        const GgufTensorInfo* t = ours.find_tensor(g.name);
        ASSERT_NE(t, nullptr) << g.name;
        EXPECT_EQ(dtype_name(t->dtype), dtype_name(g.dtype)) << g.name;
        EXPECT_EQ(t->shape, g.shape) << g.name;
      }
    }
  }
}

// The HF -> GGUF rules (expert stacking, MLA kv_b split into k_b / v_b, Mixtral q/k permutation,
// Qwen2 shared gate reshape) applied to the golden safetensors give the golden GGUF exactly.
TEST(Synth, LayoutRulesReproduceGoldenConversion) {
  for (const char* arch : kArches) {
    SCOPED_TRACE(arch);
    const ModelConfig c =
        config_from_hf_json(test::data_path(std::string("golden/") + arch + "-hf"));
    GgufFile gguf = GgufFile::open(test::data_path(std::string("golden/") + arch + ".gguf"));
    SafetensorsModel hf =
        SafetensorsModel::open(test::data_path(std::string("golden/") + arch + "-hf"));
    expect_gguf_rows_from_hf(c, gguf, hf);
  }
}

TEST(Synth, HfLayoutMatchesGoldenAndHoldsTheGgufValues) {
  test::TempDir dir("synthhf");
  for (const char* arch : kArches) {
    SCOPED_TRACE(arch);
    const fs::path hf_dir = dir / (std::string(arch) + "-hf");
    synth(hf_dir, arch, SynthType::kBF16, SynthFormat::kHf, 11);
    synth(dir / "m.gguf", arch, SynthType::kF32, SynthFormat::kGguf, 11);
    for (const char* file : {"config.json", "generation_config.json", "tokenizer.json",
                             "tokenizer_config.json", "model.safetensors.index.json"}) {
      EXPECT_TRUE(fs::exists(hf_dir / file)) << file;
    }
    EXPECT_TRUE(fs::exists(hf_dir / "model-00001-of-00002.safetensors"));
    SafetensorsModel ours = SafetensorsModel::open(hf_dir);
    SafetensorsModel gold =
        SafetensorsModel::open(test::data_path(std::string("golden/") + arch + "-hf"));
    EXPECT_EQ(ours.num_shards(), 2u);
    ASSERT_EQ(ours.tensors().size(), gold.tensors().size());
    for (const SafetensorsTensorInfo& g : gold.tensors()) {
      const SafetensorsTensorInfo* t = ours.find_tensor(g.name);
      ASSERT_NE(t, nullptr) << g.name;
      EXPECT_EQ(t->shape, g.shape) << g.name;
      EXPECT_EQ(t->dtype, g.dtype) << g.name;
    }
    const ModelConfig c = config_from_hf_json(hf_dir);
    const auto diff =
        config_diff(c, config_from_hf_json(test::data_path(std::string("golden/") + arch + "-hf")));
    EXPECT_TRUE(diff.empty()) << ::testing::PrintToString(diff);
    // Same seed: the F32 GGUF holds exactly the BF16 checkpoint's numbers, laid out per the rules.
    expect_gguf_rows_from_hf(c, GgufFile::open(dir / "m.gguf"), ours);
  }
}

// Relative RMS error of every quantized tensor against the F32 file of the same seed.
TEST(Synth, QuantizedFilesDecodeToTheSameWeights) {
  test::TempDir dir("synthdq");
  const std::string arch = "deepseek3";
  synth(dir / "f32.gguf", arch, SynthType::kF32);
  GgufFile ref = GgufFile::open(dir / "f32.gguf");
  struct Case {
    SynthType type;
    double max_rel_rms;
    std::set<std::string> dtypes;  // norms and routers stay F32; rows of 64/128 fall back
  };
  const Case cases[] = {
      {SynthType::kBF16, 0.0, {"f32", "bf16"}},
      {SynthType::kF16, 1e-3, {"f32", "f16"}},
      {SynthType::kQ8_0, 0.01, {"f32", "q8_0"}},
      {SynthType::kQ6_K, 0.03, {"f32", "q6_K", "q8_0"}},
      {SynthType::kQ4_K, 0.12, {"f32", "q4_K", "q5_0"}},
      // The mix: Q4_K, Q6_K for lm_head and the last ffn_down, fallbacks for short rows.
      {SynthType::kQ4_K_M, 0.12, {"f32", "q4_K", "q5_0", "q6_K", "q8_0"}},
      // Q5_K: rows that are not whole super-blocks fall back to Q5_1 (llama-quantize's rule).
      {SynthType::kQ5_K, 0.06, {"f32", "q5_K", "q5_1"}},
      {SynthType::kQ5_K_M, 0.06, {"f32", "q5_K", "q5_1", "q6_K", "q8_0"}},
      // The legacy 32-blocks, pure (every row is whole blocks).
      {SynthType::kQ4_0, 0.12, {"f32", "q4_0"}},
      {SynthType::kQ4_1, 0.12, {"f32", "q4_1"}},
      {SynthType::kQ5_0, 0.06, {"f32", "q5_0"}},
      {SynthType::kQ5_1, 0.06, {"f32", "q5_1"}},
      // Q2_K / Q3_K: short rows fall back to Q4_0 (llama-quantize's rule).
      {SynthType::kQ2_K, 0.35, {"f32", "q2_K", "q4_0"}},
      {SynthType::kQ3_K, 0.18, {"f32", "q3_K", "q4_0"}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(synth_type_name(k.type)));
    synth(dir / "q.gguf", arch, k.type);
    GgufFile q = GgufFile::open(dir / "q.gguf");
    EXPECT_EQ(static_cast<uint32_t>(q.get_int("general.file_type", -1)), gguf_file_type(k.type));
    std::set<std::string> dtypes;
    for (const GgufTensorInfo& info : q.tensors()) {
      const Tensor a = ref.tensor(info.name), b = q.tensor(info.name);
      dtypes.insert(std::string(dtype_name(b.dtype)));
      if (info.ndim == 1 || info.name.find("ffn_gate_inp") != std::string::npos) {
        EXPECT_EQ(b.dtype, DType::kF32) << info.name;
      }
      double err = 0, norm = 0;
      for (int64_t r = 0; r < a.rows(); ++r) {
        const std::vector<float> x = row_f32(a, r), y = row_f32(b, r);
        for (size_t i = 0; i < x.size(); ++i) {
          err += (x[i] - y[i]) * static_cast<double>(x[i] - y[i]);
          norm += x[i] * static_cast<double>(x[i]);
        }
      }
      EXPECT_LE(std::sqrt(err / norm), k.max_rel_rms) << info.name << " " << dtype_name(b.dtype);
    }
    EXPECT_EQ(dtypes, k.dtypes);
  }
}

// gpt-oss's Hugging Face experts are stacked (gate_up_proj [E, hidden, 2 ff] with gate / up
// interleaved, down_proj [E, ff, hidden]; the release's MXFP4 as *_blocks / *_scales in its own
// nibble order): the loader rearranges them into per-expert rows. Those rows decode to exactly
// the GGUF file's of the same seed (the layout llama.cpp's golden logits hold), for a BF16
// checkpoint against the F32 GGUF and for the MXFP4 release layout against the MXFP4_MOE GGUF;
// the biases, sinks and router are the same numbers.
TEST(Synth, GptOssHfExpertsLoadAsTheGgufOnes) {
  test::TempDir dir("synthoss");
  for (const SynthType type : {SynthType::kBF16, SynthType::kMXFP4_MOE}) {
    SCOPED_TRACE(std::string(synth_type_name(type)));
    const bool mxfp4 = type == SynthType::kMXFP4_MOE;
    synth(dir / "hf", "gpt-oss", type, SynthFormat::kHf, 5);
    synth(dir / "m.gguf", "gpt-oss", mxfp4 ? type : SynthType::kF32, SynthFormat::kGguf, 5);
    if (mxfp4) {
      const SafetensorsModel st = SafetensorsModel::open(dir / "hf");
      ASSERT_NE(st.find_tensor("model.layers.0.mlp.experts.gate_up_proj_blocks"), nullptr);
      ASSERT_EQ(st.find_tensor("model.layers.0.mlp.experts.gate_up_proj"), nullptr);
    }
    const LoadedModel hf = load_model(dir / "hf"), gg = load_model(dir / "m.gguf");
    if (mxfp4) {
      // transformers' dequantization of the release's blocks, by hand: value 2 i = FP4 of byte
      // i's low nibble, 2 i + 1 of its high one, times 2^(scale - 127); row 1 of gate_up_proj
      // is expert 0's first up row.
      const float kFp4[16] = {0,     0.5f,  1,  1.5f,  2,  3,  4,  6,
                              -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
      const SafetensorsModel st = SafetensorsModel::open(dir / "hf");
      const Tensor blocks = st.tensor("model.layers.1.mlp.experts.gate_up_proj_blocks");
      const Tensor scales = st.tensor("model.layers.1.mlp.experts.gate_up_proj_scales");
      const int64_t nb = hf.config.hidden_size / 32;
      const uint8_t* q = blocks.as<const uint8_t>() + 1 * nb * 16;
      const uint8_t* e8 = scales.as<const uint8_t>() + 1 * nb;
      std::vector<float> want(static_cast<size_t>(nb * 32));
      for (int64_t k = 0; k < nb * 32; ++k) {
        const uint8_t byte = q[k / 2];
        want[k] = std::ldexp(kFp4[k % 2 ? byte >> 4 : byte & 0xF], e8[k / 32] - 127);
      }
      EXPECT_EQ(row_f32(hf.layers[1].experts.up[0].t, 0), want);
    }
    EXPECT_TRUE(config_diff(hf.config, gg.config).empty())
        << ::testing::PrintToString(config_diff(hf.config, gg.config));
    for (size_t l = 0; l < hf.layers.size(); ++l) {
      const LayerWeights &a = hf.layers[l], &b = gg.layers[l];
      EXPECT_EQ(a.sinks, b.sinks);
      EXPECT_EQ(a.bo, b.bo);
      EXPECT_EQ(a.router_logit_bias, b.router_logit_bias);
      EXPECT_EQ(a.experts.gate_bias, b.experts.gate_bias);
      EXPECT_EQ(a.experts.up_bias, b.experts.up_bias);
      EXPECT_EQ(a.experts.down_bias, b.experts.down_bias);
      ASSERT_EQ(a.experts.gate.size(), b.experts.gate.size());
      for (size_t e = 0; e < a.experts.gate.size(); ++e) {
        for (const auto m : {&ExpertWeights::gate, &ExpertWeights::up, &ExpertWeights::down}) {
          const Tensor& x = (a.experts.*m)[e].t;
          const Tensor& y = (b.experts.*m)[e].t;
          ASSERT_EQ(x.dtype, mxfp4 ? DType::kMXFP4 : DType::kBF16);
          ASSERT_EQ(y.dtype, mxfp4 ? DType::kMXFP4 : DType::kF32);
          ASSERT_EQ(x.rows(), y.rows());
          for (int64_t r = 0; r < x.rows(); ++r) {
            ASSERT_EQ(row_f32(x, r), row_f32(y, r)) << "layer " << l << " expert " << e << " row "
                                                    << r;
          }
        }
      }
    }
  }
}

// Qwen3.5's Hugging Face release stacks each layer's experts as transformers' 3-D parameters
// (mlp.experts.gate_up_proj [E, 2 ff, hidden], gate then up; mlp.experts.down_proj [E, hidden,
// ff]): the same checkpoint rewritten so loads expert rows equal to the per-expert tensors'.
TEST(Synth, Qwen35StackedHfExpertsLoadAsPerExpertOnes) {
  test::TempDir dir("synthq35");
  synth(dir / "hf", "qwen35moe", SynthType::kBF16, SynthFormat::kHf, 5);
  const SafetensorsModel src = SafetensorsModel::open(dir / "hf");
  const LoadedModel per = load_model(dir / "hf");
  const ModelConfig& c = per.config;
  const int64_t ne = c.n_experts, ff = c.moe_intermediate_size, hd = c.hidden_size;
  fs::create_directories(dir / "stacked");
  SafetensorsWriter w(dir / "stacked");
  const std::regex expert(R"((.*\.mlp\.experts\.)(\d+)\.(gate|up|down)_proj\.weight)");
  std::set<std::string> stacked;
  for (const auto& t : src.tensors()) {
    std::smatch m;
    if (!std::regex_match(t.name, m, expert)) {
      std::vector<int64_t> shape(t.shape.begin(), t.shape.begin() + t.ndim);
      const uint8_t* data = t.data;
      const uint64_t n = t.nbytes;
      w.add_tensor(t.name, t.dtype, shape, [data, n](void* dst) { std::memcpy(dst, data, n); });
      continue;
    }
    const std::string prefix = m[1];
    if (!stacked.insert(prefix).second) continue;
    const uint64_t row = static_cast<uint64_t>(hd) * 2;  // (BF16 rows of hidden values)
    w.add_tensor(prefix + "gate_up_proj", DType::kBF16, {ne, 2 * ff, hd}, [&, prefix](void* dst) {
      auto* out = static_cast<uint8_t*>(dst);
      for (int64_t e = 0; e < ne; ++e) {
        for (const char* part : {"gate", "up"}) {
          const Tensor x = src.tensor(fmt::format("{}{}.{}_proj.weight", prefix, e, part));
          std::memcpy(out, x.data, static_cast<size_t>(ff) * row);
          out += ff * row;
        }
      }
    });
    w.add_tensor(prefix + "down_proj", DType::kBF16, {ne, hd, ff}, [&, prefix](void* dst) {
      auto* out = static_cast<uint8_t*>(dst);
      for (int64_t e = 0; e < ne; ++e) {
        const Tensor x = src.tensor(fmt::format("{}{}.down_proj.weight", prefix, e));
        std::memcpy(out, x.data, static_cast<size_t>(hd * ff * 2));
        out += hd * ff * 2;
      }
    });
  }
  w.write();
  fs::copy_file(dir / "hf" / "config.json", dir / "stacked" / "config.json");
  ASSERT_EQ(stacked.size(), static_cast<size_t>(c.num_layers + c.nextn_layers));
  const LoadedModel st = load_model(dir / "stacked");
  for (size_t l = 0; l < per.layers.size(); ++l) {
    for (int64_t e = 0; e < ne; ++e) {
      for (const auto m : {&ExpertWeights::gate, &ExpertWeights::up, &ExpertWeights::down}) {
        const Tensor& x = (st.layers[l].experts.*m)[static_cast<size_t>(e)].t;
        const Tensor& y = (per.layers[l].experts.*m)[static_cast<size_t>(e)].t;
        ASSERT_EQ(x.rows(), y.rows());
        for (int64_t r = 0; r < x.rows(); ++r) {
          ASSERT_EQ(row_f32(x, r), row_f32(y, r)) << "layer " << l << " expert " << e;
        }
      }
    }
  }
}

TEST(Synth, Fp8ScalesDequantizeToTheBf16Weights) {
  test::TempDir dir("synthfp8");
  synth(dir / "bf16", "deepseek3", SynthType::kBF16, SynthFormat::kHf, 5);
  synth(dir / "fp8", "deepseek3", SynthType::kFp8, SynthFormat::kHf, 5);
  const nlohmann::json config = nlohmann::json::parse(slurp(dir / "fp8" / "config.json"));
  EXPECT_EQ(config["quantization_config"]["quant_method"], "fp8");
  EXPECT_EQ(config["quantization_config"]["weight_block_size"], nlohmann::json({128, 128}));
  SafetensorsModel bf = SafetensorsModel::open(dir / "bf16");
  SafetensorsModel f8 = SafetensorsModel::open(dir / "fp8");
  int fp8_weights = 0;
  for (const SafetensorsTensorInfo& info : bf.tensors()) {
    const SafetensorsTensorInfo* q = f8.find_tensor(info.name);
    ASSERT_NE(q, nullptr) << info.name;
    const Tensor ref = bf.tensor(info.name);
    std::vector<float> want(ref.numel());
    for (int64_t i = 0; i < ref.numel(); ++i) want[i] = bf16_to_f32(ref.as<uint16_t>()[i]);
    const std::string scale = info.name.substr(0, info.name.size() - 6) + "weight_scale_inv";
    const SafetensorsTensorInfo* s = f8.find_tensor(scale);
    if (q->dtype != DType::kF8E4M3) {
      EXPECT_EQ(s, nullptr) << info.name;
      EXPECT_TRUE(info.name.find("norm") != std::string::npos ||
                  info.name.find("embed") != std::string::npos ||
                  info.name.find("lm_head") != std::string::npos ||
                  info.name.find("mlp.gate.") != std::string::npos)
          << info.name << " should be FP8";
      const Tensor t = f8.tensor(info.name);
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(element_f32(t, i), want[i]) << info.name;
      continue;
    }
    ++fp8_weights;
    ASSERT_NE(s, nullptr) << scale;
    const int64_t rows = info.shape[0], cols = info.shape[1];
    EXPECT_EQ(s->dtype, DType::kF32);
    EXPECT_EQ(s->shape[0], (rows + 127) / 128);
    EXPECT_EQ(s->shape[1], (cols + 127) / 128);
    const Tensor w = f8.tensor(info.name), sc = f8.tensor(scale);
    std::vector<float> got(rows * cols);
    dequantize_fp8_blocks(w.as<uint8_t>(), sc.as<float>(), rows, cols, 128, 128, got.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        // E4M3: 3 mantissa bits (half-ulp 2^-4 relative); below 2^-6 * scale the subnormal
        // step is 2^-9 * scale.
        const float block_scale = sc.as<float>()[(r / 128) * s->shape[1] + c / 128];
        const float x = want[r * cols + c];
        const float tol = std::max(std::fabs(x) * 0.0625f, block_scale * 0x1p-10f) * 1.001f;
        ASSERT_LE(std::fabs(got[r * cols + c] - x), tol)
            << info.name << " [" << r << ", " << c << "]";
      }
    }
  }
  EXPECT_GT(fp8_weights, 20);
}

TEST(Synth, SameSeedSameBytesOtherSeedOtherBytes) {
  test::TempDir dir("synthdet");
  synth(dir / "a.gguf", "qwen2moe", SynthType::kQ4_K_M, SynthFormat::kGguf, 3);
  synth(dir / "b.gguf", "qwen2moe", SynthType::kQ4_K_M, SynthFormat::kGguf, 3);
  synth(dir / "c.gguf", "qwen2moe", SynthType::kQ4_K_M, SynthFormat::kGguf, 4);
  EXPECT_EQ(slurp(dir / "a.gguf"), slurp(dir / "b.gguf"));
  EXPECT_NE(slurp(dir / "a.gguf"), slurp(dir / "c.gguf"));
  // Different seeds differ in every tensor, not just somewhere.
  GgufFile a = GgufFile::open(dir / "a.gguf"), c = GgufFile::open(dir / "c.gguf");
  for (const GgufTensorInfo& t : a.tensors()) {
    EXPECT_NE(std::memcmp(a.data() + t.offset, c.data() + c.find_tensor(t.name)->offset, t.nbytes),
              0)
        << t.name;
  }
  synth(dir / "h1", "mixtral", SynthType::kFp8, SynthFormat::kHf, 3);
  synth(dir / "h2", "mixtral", SynthType::kFp8, SynthFormat::kHf, 3);
  for (const auto& e : fs::directory_iterator(dir / "h1")) {
    EXPECT_EQ(slurp(e.path()), slurp(dir / "h2" / e.path().filename())) << e.path();
  }
}

// Top-k with the model's routing rule, computed here from the definitions (HF modeling code).
std::vector<int> route(const ModelConfig& c, const std::vector<float>& logits,
                       const std::vector<float>& bias) {
  const int n = static_cast<int>(c.n_experts), k = static_cast<int>(c.n_experts_per_tok);
  std::vector<float> score(n);
  if (c.scoring == ScoringFunc::kSigmoid) {
    for (int e = 0; e < n; ++e) score[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  } else {
    const float m = *std::max_element(logits.begin(), logits.end());
    for (int e = 0; e < n; ++e) score[e] = std::exp(logits[e] - m);
  }
  std::vector<float> choice(n);
  for (int e = 0; e < n; ++e) choice[e] = score[e] + (bias.empty() ? 0.0f : bias[e]);
  if (c.n_group > 1) {  // keep the topk_group best groups (noaux_tc: sum of each group's top 2)
    const int per = n / static_cast<int>(c.n_group);
    std::vector<std::pair<float, int>> groups;
    for (int g = 0; g < c.n_group; ++g) {
      std::vector<float> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(v.rbegin(), v.rend());
      groups.push_back({c.topk_method == TopkMethod::kNoauxTc ? v[0] + v[1] : v[0], g});
    }
    std::sort(groups.rbegin(), groups.rend());
    std::vector<bool> keep(c.n_group, false);
    for (int g = 0; g < c.topk_group; ++g) keep[groups[g].second] = true;
    for (int e = 0; e < n; ++e) {
      if (!keep[e / per]) choice[e] = -INFINITY;
    }
  }
  std::vector<int> ids(n);
  for (int e = 0; e < n; ++e) ids[e] = e;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int a, int b) { return choice[a] > choice[b]; });
  ids.resize(k);
  return ids;
}

// Every expert of every MoE layer is chosen for some random unit-variance hidden state.
void expect_spread(const ModelConfig& c, uint64_t seed, int tokens) {
  const std::vector<HfTensorSpec> hf = hf_tensor_specs(c);
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const HfTensorSpec& t : hf) {
    if (t.role != WeightRole::kRouter || t.shape[0] != c.n_experts) continue;
    SCOPED_TRACE(t.name);
    std::vector<float> w(c.n_experts * c.hidden_size), bias;
    synth_values(seed, t, 0, 1, static_cast<int64_t>(w.size()), w.data());
    const std::string bias_name = t.name.substr(0, t.name.size() - 6) + "e_score_correction_bias";
    for (const HfTensorSpec& b : hf) {
      if (b.name == bias_name) {
        bias.resize(c.n_experts);
        synth_values(seed, b, 0, 1, c.n_experts, bias.data());
      }
    }
    std::vector<int> count(c.n_experts, 0);
    std::vector<float> x(c.hidden_size), logits(c.n_experts);
    for (int tok = 0; tok < tokens; ++tok) {
      for (float& v : x) v = normal(rng);
      for (int64_t e = 0; e < c.n_experts; ++e) {
        const float* row = w.data() + e * c.hidden_size;
        float s = 0;
        for (int64_t i = 0; i < c.hidden_size; ++i) s += row[i] * x[i];
        logits[e] = s;
      }
      for (int e : route(c, logits, bias)) ++count[e];
    }
    const int64_t expected = tokens * c.n_experts_per_tok / c.n_experts;
    for (int64_t e = 0; e < c.n_experts; ++e) {
      EXPECT_GT(count[e], 0) << "expert " << e << " never selected (" << expected << " expected)";
      // No expert takes a large share either (a collapsed router would).
      EXPECT_LE(count[e], 4 * expected) << "expert " << e;
    }
  }
}

TEST(Synth, RoutingSpreadsOverEveryExpert) {
  for (const char* arch : kArches) {
    SCOPED_TRACE(arch);
    expect_spread(config_preset(std::string("tiny-") + arch), 7, 256);
  }
  // Real shapes (routers only; four layers keep it fast).
  for (const char* preset : {"deepseek-v3", "kimi-k2", "qwen3-30b-a3b", "deepseek-v2-lite"}) {
    SCOPED_TRACE(preset);
    ModelConfig c = config_preset(preset);
    c.num_layers = std::min<int64_t>(c.num_layers, c.first_k_dense_replace + 1);
    c.first_k_dense_replace = std::min(c.first_k_dense_replace, c.num_layers - 1);
    expect_spread(c, 7, 512);
  }
}

TEST(Synth, PlanEstimatesBoundTheFiles) {
  test::TempDir dir("synthplan");
  for (const auto& [arch, format, type] :
       {std::tuple{"deepseek3", SynthFormat::kGguf, SynthType::kQ4_K_M},
        std::tuple{"qwen2moe", SynthFormat::kHf, SynthType::kFp8}}) {
    const fs::path out = dir / (std::string(arch) + (format == SynthFormat::kHf ? "-hf" : ".gguf"));
    const SynthPlan plan = synth(out, arch, type, format);
    uint64_t actual = 0;
    if (fs::is_directory(out)) {
      for (const auto& e : fs::directory_iterator(out)) actual += e.file_size();
    } else {
      actual = fs::file_size(out);
    }
    EXPECT_GE(plan.file_bytes, actual);
    EXPECT_LE(plan.file_bytes, actual + (2u << 20));
    EXPECT_GE(plan.ram_bytes, plan.tensors.empty() ? 0 : plan.tensors[0].nbytes);
  }
}

TEST(Synth, BuiltInVocabularyIsAConsistentBpe) {
  const SynthVocab v = build_synth_vocab(600, 3, 599);
  ASSERT_EQ(v.tokens.size(), 600u);
  EXPECT_EQ(v.types[3], kTokenControl);
  EXPECT_EQ(v.types[599], kTokenControl);
  std::map<std::string, int> id_of;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    EXPECT_TRUE(id_of.emplace(v.tokens[i], static_cast<int>(i)).second)
        << "duplicate " << v.tokens[i];
  }
  for (int b = 0; b < 256; ++b) EXPECT_TRUE(id_of.count(gpt2_byte_token(b))) << b;
  EXPECT_EQ(gpt2_byte_token(' '), "Ġ");
  EXPECT_EQ(gpt2_byte_token('\n'), "Ċ");
  EXPECT_EQ(v.tokens[0], "!");  // GPT-2 order: printable bytes first
  EXPECT_GT(v.merges.size(), 150u);
  for (const std::string& m : v.merges) {
    const size_t sp = m.find(' ');
    ASSERT_NE(sp, std::string::npos) << m;
    const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
    EXPECT_TRUE(id_of.count(a) && id_of.count(b) && id_of.count(a + b)) << m;
  }
  EXPECT_TRUE(id_of.count("Ġthe"));
  EXPECT_EQ(build_synth_vocab(600, 3, 599).merges, v.merges);  // deterministic
  // A real-shape vocabulary is filled with word-like merges, not padding, and stays a valid BPE.
  const SynthVocab big = build_synth_vocab(60000, 0, 1);
  std::set<std::string> seen(big.tokens.begin(), big.tokens.end());
  EXPECT_EQ(seen.size(), big.tokens.size());
  EXPECT_EQ(std::count(big.types.begin(), big.types.end(), kTokenUnused), 0);
  EXPECT_EQ(big.merges.size(), 60000u - 258);
  for (const std::string& m : big.merges) {
    const size_t sp = m.find(' ');
    const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
    ASSERT_TRUE(seen.count(a) && seen.count(b) && seen.count(a + b)) << m;
  }
  EXPECT_THROW(build_synth_vocab(100, 0, 1), Error);
  EXPECT_THROW(build_synth_vocab(600, 5, 5), Error);
  // tokenizer.json carries the same vocabulary.
  const nlohmann::json j = nlohmann::json::parse(tokenizer_json(v));
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["model"]["vocab"].size(), 600u);
  EXPECT_EQ(j["model"]["vocab"]["Ġthe"], id_of["Ġthe"]);
  EXPECT_EQ(j["added_tokens"].size(), 2u);
  EXPECT_EQ(j["model"]["merges"].size(), v.merges.size());
}

TEST(Synth, VocabFromAnotherGguf) {
  test::TempDir dir("synthvocab");
  const fs::path vocab = test::data_path("vocab/ggml-vocab-deepseek-llm.gguf");
  SynthOptions o;
  o.config = config_preset("tiny-deepseek2");
  o.type = SynthType::kQ8_0;
  o.vocab_gguf = vocab;
  o.output = dir / "v.gguf";
  o.progress = false;
  const SynthPlan plan = synth_model(o);
  EXPECT_EQ(plan.config.vocab_size, 102400);
  GgufFile ours = GgufFile::open(o.output), src = GgufFile::open(vocab);
  for (const auto& [k, v] : src.metadata()) {
    if (!k.starts_with("tokenizer.")) continue;
    const GgufValue* mine = ours.find(k);
    ASSERT_NE(mine, nullptr) << k;
    EXPECT_TRUE(*mine == v) << k;
  }
  const ModelConfig c = config_from_gguf(ours);
  EXPECT_EQ(c.vocab_size, 102400);
  EXPECT_EQ(c.bos_token_id, 100000);
  EXPECT_EQ(ours.find_tensor("token_embd.weight")->shape[0], 102400);
}

TEST(SynthCli, WritesAndShowsModels) {
  test::TempDir dir("synthcli");
  const std::string gguf = (dir / "m.gguf").string();
  auto r = test::run_tandem(
      "synth --arch deepseek2 --preset tiny --format gguf --type q4_k_m "
      "--seed 1 -o " +
      gguf);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("tiny-deepseek2"), std::string::npos) << r.out;
  r = test::run_tandem("show -m " + gguf);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"architecture  deepseek2", "kv_lora_rank", "parameters    total",
                        "routed experts", "active per token", "q4_K", "q6_K", "file size"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s << " in\n" << r.out;
  }
  // Parameter count as count_params() computes it from the golden config.
  const ParamCount p = count_params(config_preset("tiny-deepseek2"));
  EXPECT_NE(r.out.find(fmt::format("total {:.2f} M", p.total / 1e6)), std::string::npos) << r.out;

  // The same model split in three (llama.cpp's gguf-split layout): `show` counts every shard's
  // bytes, `run` from the first shard writes the one file's tokens, a later shard is refused with
  // the first one's name.
  const std::string shown = r.out;
  const std::filesystem::path first =
      test::write_split_gguf(GgufFile::open(gguf), dir.path(), "s", 3);
  r = test::run_tandem("show -m " + first.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("split in 3 files"), std::string::npos) << r.out;
  uint64_t split_bytes = 0;
  for (int i = 1; i <= 3; ++i) {
    split_bytes += std::filesystem::file_size(dir / fmt::format("s-{:05d}-of-00003.gguf", i));
  }
  EXPECT_NE(r.out.find(fmt::format("({} bytes)", split_bytes)), std::string::npos) << r.out;
  EXPECT_NE(shown.find(fmt::format("({} bytes)", std::filesystem::file_size(gguf))),
            std::string::npos)
      << shown;
  const std::string args = " -p \"hello world\" -n 6 --temp 0";
  const auto one = test::run_tandem("run -m " + gguf + args);
  const auto three = test::run_tandem("run -m " + first.string() + args);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(three.exit_code, 0) << three.err;
  EXPECT_FALSE(one.out.empty());
  EXPECT_EQ(one.out, three.out);
  r = test::run_tandem("run -m " + (dir / "s-00002-of-00003.gguf").string() + args);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("pass the first, " + first.string()), std::string::npos) << r.err;

  const std::string hf = (dir / "hf").string();
  r = test::run_tandem("synth --arch qwen3moe --format hf --type fp8 -o " + hf);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run_tandem("show -m " + hf);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"architecture  qwen3moe", "HF checkpoint, 2 safetensors files", "f8_e4m3",
                        "bf16", "qk_norm"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s << " in\n" << r.out;
  }
}

TEST(SynthCli, RefusesWhenDiskOrMemoryIsShort) {
  test::TempDir dir("synthres");
  const std::string out = (dir / "v3.gguf").string();
  auto r = test::run_tandem("synth --preset deepseek-v3 --type q4_k_m -o " + out +
                            " --assume-free-disk 3100000000");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("needs 4"), std::string::npos) << r.err;  // ~400 GB
  EXPECT_NE(r.err.find("GB of disk, 3.1 GB free at " + dir.path().string()), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(out));
  r = test::run_tandem("synth --arch mixtral -o " + out + " --assume-free-ram 1000000");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("of RAM"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1.0 MB available"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  // A truncated real shape fits where the whole model does not.
  SynthOptions o;
  o.config = config_preset("deepseek-v3");
  o.type = SynthType::kQ4_K_M;
  o.output = out;
  const uint64_t whole = plan_synth(o).file_bytes;
  o.config.num_layers = 4;
  const SynthPlan four = plan_synth(o);
  EXPECT_LT(four.file_bytes * 10, whole);
  EXPECT_GT(four.file_bytes, 256 * 3 * 7168ull * 2048 / 2);  // its one MoE layer, 4-bit
}

TEST(SynthCli, RefusesBadArguments) {
  test::TempDir dir("synthargs");
  const std::string out = " -o " + (dir / "x.gguf").string();
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {"synth --preset tiny" + out, "--preset tiny needs --arch"},
      {"synth --arch mixtral --preset deepseek-v3" + out, "does not match --preset deepseek-v3"},
      {"synth --arch qwen3moe --type fp8" + out, "--type fp8 is not available for --format gguf"},
      {"synth --arch qwen3moe --format hf --type q4_k_m" + out, "--type q4_k_m is not available"},
      {"synth --arch qwen3moe --type iq2_xs" + out, "--type iq2_xs"},
      {"synth --arch qwen3moe --layers 0" + out, "--layers 0"},
      {"synth --arch qwen3moe --layers 5000" + out, "--layers 5000"},
      {"synth --arch llama2" + out, "--arch"},
      {"synth --preset gpt-5" + out, "--preset"},
      {"synth --arch qwen3moe", "--output is required"},
      {"synth --arch qwen3moe --vocab /nonexistent.gguf" + out, "--vocab"},
      {"synth --arch qwen3moe -o " + dir.path().string(), "is a directory"},
      {"synth --arch mixtral --format hf --vocab " +
           test::data_path("vocab/ggml-vocab-llama-spm.gguf").string() + " -o " +
           (dir / "spm").string(),
       "cannot be written as a byte-level BPE tokenizer.json"},
  };
  for (const Case& c : cases) {
    const auto r = test::run_tandem(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_NE((r.err + r.out).find(c.message), std::string::npos)
        << c.args << "\nstderr: " << r.err << "\nstdout: " << r.out;
  }
  EXPECT_FALSE(fs::exists(dir / "x.gguf"));
  EXPECT_FALSE(fs::exists(dir / "spm"));
  const auto r = test::run_tandem("show -m /nonexistent/model.gguf");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem
