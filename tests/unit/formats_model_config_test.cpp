// ModelConfig readers against the golden models (HF config.json and llama.cpp-made GGUFs of the
// same five models must agree field by field), the presets against published parameter counts,
// the writers by round trip, and the error paths.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/model_config.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

const char* kArches[] = {"deepseek2", "deepseek3", "qwen2moe",  "qwen3moe",
                         "mixtral",   "deepseek32", "glm-dsa"};

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ModelConfig golden_hf(const std::string& arch) {
  return config_from_hf_json(test::data_path("golden/" + arch + "-hf/config.json"));
}

// The golden config.json with one key replaced (or removed when value is discarded()).
std::string edited_hf(const std::string& arch, const std::string& key, nlohmann::json value) {
  nlohmann::json j =
      nlohmann::json::parse(read_text(test::data_path("golden/" + arch + "-hf/config.json")));
  if (value.is_discarded()) {
    j.erase(key);
  } else {
    j[key] = value;
  }
  return j.dump();
}

// Expects `f` to throw Error of `kind` whose message contains every string of `parts`.
template <typename F>
void expect_error(F&& f, ErrorKind kind, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "'" << p << "' not in: " << e.what();
    }
  }
}

TEST(ModelConfig, GoldenHfConfigsParse) {
  const ModelConfig d2 = golden_hf("deepseek2");
  EXPECT_EQ(d2.arch, ModelArch::kDeepseek2);
  EXPECT_EQ(d2.vocab_size, 512);
  EXPECT_EQ(d2.hidden_size, 256);
  EXPECT_EQ(d2.num_layers, 3);
  EXPECT_EQ(d2.num_heads, 2);
  EXPECT_EQ(d2.num_kv_heads, 2);
  EXPECT_EQ(d2.head_dim, 64 + 32);
  EXPECT_EQ(d2.rope_dim, 32);
  EXPECT_EQ(d2.q_lora_rank, 0);  // null in the file
  EXPECT_EQ(d2.kv_lora_rank, 128);
  EXPECT_EQ(d2.v_head_dim, 64);
  EXPECT_EQ(d2.shared_expert_intermediate_size, 2 * 64);
  EXPECT_EQ(d2.first_k_dense_replace, 1);
  EXPECT_FALSE(d2.is_moe_layer(0));
  EXPECT_TRUE(d2.is_moe_layer(1));
  EXPECT_EQ(d2.num_moe_layers(), 2);
  EXPECT_EQ(d2.topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(d2.scoring, ScoringFunc::kSoftmax);
  EXPECT_FALSE(d2.norm_topk_prob);
  EXPECT_FALSE(d2.has_e_score_correction_bias);
  EXPECT_EQ(d2.bos_token_id, 497);
  EXPECT_EQ(d2.eos_token_id, 498);
  EXPECT_FLOAT_EQ(d2.rms_norm_eps, 1e-6f);

  const ModelConfig d3 = golden_hf("deepseek3");
  EXPECT_EQ(d3.arch, ModelArch::kDeepseek3);
  EXPECT_EQ(d3.q_lora_rank, 128);
  EXPECT_EQ(d3.n_experts, 16);
  EXPECT_EQ(d3.n_experts_per_tok, 4);
  EXPECT_EQ(d3.n_group, 4);
  EXPECT_EQ(d3.topk_group, 2);
  EXPECT_EQ(d3.topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(d3.scoring, ScoringFunc::kSigmoid);
  EXPECT_TRUE(d3.norm_topk_prob);
  EXPECT_TRUE(d3.has_e_score_correction_bias);
  EXPECT_FLOAT_EQ(d3.routed_scaling_factor, 2.5f);
  EXPECT_EQ(d3.shared_expert_intermediate_size, 64);

  const ModelConfig q2 = golden_hf("qwen2moe");
  EXPECT_EQ(q2.arch, ModelArch::kQwen2Moe);
  EXPECT_EQ(q2.num_kv_heads, 2);
  EXPECT_EQ(q2.head_dim, 64);
  EXPECT_TRUE(q2.attention_bias);
  EXPECT_TRUE(q2.shared_expert_gate);
  EXPECT_EQ(q2.shared_expert_intermediate_size, 128);
  EXPECT_EQ(q2.intermediate_size, 512);
  EXPECT_EQ(q2.moe_intermediate_size, 128);
  EXPECT_FALSE(q2.norm_topk_prob);
  EXPECT_FALSE(q2.qk_norm);
  EXPECT_EQ(q2.num_moe_layers(), 2);

  const ModelConfig q3 = golden_hf("qwen3moe");
  EXPECT_EQ(q3.arch, ModelArch::kQwen3Moe);
  EXPECT_EQ(q3.head_dim, 32);  // explicit, != 256 / 4
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_TRUE(q3.norm_topk_prob);
  EXPECT_FALSE(q3.attention_bias);
  EXPECT_EQ(q3.shared_expert_intermediate_size, 0);

  const ModelConfig mx = golden_hf("mixtral");
  EXPECT_EQ(mx.arch, ModelArch::kMixtral);
  EXPECT_EQ(mx.num_kv_heads, 1);
  EXPECT_EQ(mx.head_dim, 64);
  EXPECT_EQ(mx.moe_intermediate_size, 128);
  EXPECT_EQ(mx.n_experts, 8);
  EXPECT_TRUE(mx.norm_topk_prob);
  EXPECT_EQ(mx.sliding_window, 0);
  EXPECT_FLOAT_EQ(mx.rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(mx.rope_theta, 1e6f);
  EXPECT_EQ(mx.bos_token_id, 1);
}

TEST(ModelConfig, GoldenGgufMatchesHfFieldByField) {
  for (const char* arch : kArches) {
    SCOPED_TRACE(arch);
    const ModelConfig hf = golden_hf(arch);
    for (const std::string suffix : {"", "-q8_0", "-q4_k_m"}) {
      GgufFile f =
          GgufFile::open(test::data_path(std::string("golden/") + arch + suffix + ".gguf"));
      const ModelConfig g = config_from_gguf(f);
      const std::vector<std::string> diff = config_diff(hf, g);
      EXPECT_TRUE(diff.empty()) << suffix << ": " << ::testing::PrintToString(diff);
    }
  }
}

TEST(ModelConfig, DiffNamesTheFields) {
  ModelConfig a = golden_hf("deepseek3");
  ModelConfig b = a;
  EXPECT_TRUE(config_diff(a, b).empty());
  b.n_group = 8;
  b.rms_norm_eps = 1e-5f;
  const auto diff = config_diff(a, b);
  ASSERT_EQ(diff.size(), 2u);
  EXPECT_EQ(diff[0], "rms_norm_eps: 1e-06 vs 1e-05");
  EXPECT_EQ(diff[1], "n_group: 4 vs 8");
}

TEST(ModelConfig, TinyPresetsAreTheGoldenShapes) {
  for (const char* arch : kArches) {
    SCOPED_TRACE(arch);
    const ModelConfig p = config_preset(std::string("tiny-") + arch);
    EXPECT_TRUE(config_diff(p, golden_hf(arch)).empty())
        << ::testing::PrintToString(config_diff(p, golden_hf(arch)));
  }
}

// Published sizes (model cards): total / activated parameters. The counts include embeddings
// and exclude DeepSeek's and GLM's MTP layers, as the cards do; DeepSeek, Moonshot, Zhipu,
// MiniMax and OpenAI leave the input embedding (a table lookup) out of "activated", Qwen and
// Mistral count it.
TEST(ModelConfig, PresetParameterCountsMatchModelCards) {
  // How many embedding tables the card leaves out of "activated": 0, the input (a lookup), or
  // both (GLM-4.5 and MiniMax-M2's cards: 12B / 32B / 10B are without the untied lm_head too).
  struct Case {
    const char* preset;
    double total_b, active_b;
    int tables_left_out;
  };
  const Case cases[] = {
      {"deepseek-v2-lite", 15.7, 2.4, 1}, {"deepseek-v3", 671, 37, 1},
      {"kimi-k2", 1000, 32, 1},           {"qwen3-30b-a3b", 30.5, 3.3, 0},
      {"qwen2-57b-a14b", 57, 14, 0},      {"mixtral-8x7b", 46.7, 12.9, 0},
      {"glm-4.5-air", 106, 12, 2},        {"glm-4.5", 355, 32, 2},
      {"minimax-m2", 230, 10, 2},         {"gpt-oss-20b", 20.9, 3.6, 1},
      {"gpt-oss-120b", 116.8, 5.1, 1},   {"deepseek-v3.2", 671, 37, 1},
      {"glm-5", 744, 40, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.preset);
    const ModelConfig config = config_preset(c.preset);
    const ParamCount p = count_params(config);
    EXPECT_NEAR(p.total / 1e9, c.total_b, c.total_b * 0.03);
    const int64_t lookup = c.tables_left_out * config.vocab_size * config.hidden_size;
    EXPECT_NEAR((p.active_per_token - lookup) / 1e9, c.active_b, c.active_b * 0.03);
    EXPECT_LT(p.routed_experts, p.total);
  }
}

TEST(ModelConfig, CountParamsByHand) {
  // tiny-mixtral: V=512, H=256, 2 layers, q 4x64, k/v 1x64, 8 experts of 128, untied.
  const ParamCount p = count_params(config_preset("tiny-mixtral"));
  const int64_t attn = 256 * 256 + 2 * 256 * 64 + 256 * 256 + 2 * 256;
  const int64_t experts = 8 * 3 * 256 * 128;
  const int64_t router = 8 * 256;
  EXPECT_EQ(p.embedding, 2 * 512 * 256);
  EXPECT_EQ(p.routed_experts, 2 * experts);
  EXPECT_EQ(p.total, 2 * 512 * 256 + 256 + 2 * (attn + router + experts));
  EXPECT_EQ(p.active_per_token, 2 * 512 * 256 + 256 + 2 * (attn + router + experts / 4));
}

TEST(ModelConfig, HfJsonRoundTripsEveryPreset) {
  for (const std::string& name : config_preset_names()) {
    SCOPED_TRACE(name);
    const ModelConfig c = config_preset(name);
    const ModelConfig back = config_from_hf_json_text(config_to_hf_json(c), name);
    EXPECT_TRUE(config_diff(c, back).empty()) << ::testing::PrintToString(config_diff(c, back));
  }
}

TEST(ModelConfig, GgufKeysRoundTripEveryPreset) {
  test::TempDir dir("mc");
  for (const std::string& name : config_preset_names()) {
    SCOPED_TRACE(name);
    const ModelConfig c = config_preset(name);
    const auto path = dir / (name + ".gguf");
    GgufWriter w(path);
    write_gguf_config(c, w);
    if (c.bos_token_id >= 0) {  // (GLM-4.5 and MiniMax-M2 name none)
      w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(static_cast<uint32_t>(c.bos_token_id)));
    }
    w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(static_cast<uint32_t>(c.eos_token_id)));
    // What config_from_gguf() learns from tensors rather than keys.
    auto one = [](void* dst) { *static_cast<float*>(dst) = 1.0f; };
    if (!c.tie_word_embeddings) w.add_tensor("output.weight", DType::kF32, {1}, one);
    if (c.attention_bias) w.add_tensor("blk.0.attn_q.bias", DType::kF32, {1}, one);
    if (c.has_e_score_correction_bias)
      w.add_tensor("blk.5.exp_probs_b.bias", DType::kF32, {1}, one);
    if (c.qk_norm) w.add_tensor("blk.0.attn_q_norm.weight", DType::kF32, {1}, one);
    w.write();
    const ModelConfig back = config_from_gguf(GgufFile::open(path));
    EXPECT_TRUE(config_diff(c, back).empty()) << ::testing::PrintToString(config_diff(c, back));
  }
}

TEST(ModelConfig, YarnKeysInBothFormats) {
  const ModelConfig c = config_preset("deepseek-v2-lite");
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kYarn);
  const nlohmann::json j = nlohmann::json::parse(config_to_hf_json(c));
  EXPECT_EQ(j["rope_scaling"]["type"], "yarn");
  EXPECT_EQ(j["rope_scaling"]["factor"], 40.0);
  EXPECT_EQ(j["rope_scaling"]["mscale_all_dim"], 0.707);
  EXPECT_EQ(j["rope_scaling"]["original_max_position_embeddings"], 4096);
  EXPECT_TRUE(j["q_lora_rank"].is_null());
  EXPECT_EQ(j["rms_norm_eps"], 1e-6);  // written as the shortest decimal of the float

  test::TempDir dir("yarn");
  GgufWriter w(dir / "y.gguf");
  write_gguf_config(c, w);
  w.write();
  GgufFile f = GgufFile::open(dir / "y.gguf");
  EXPECT_EQ(f.get_string("deepseek2.rope.scaling.type", ""), "yarn");
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("deepseek2.rope.scaling.yarn_log_multiplier", 0)),
                  0.0707f);
  EXPECT_EQ(f.get_int("deepseek2.rope.scaling.original_context_length", 0), 4096);
  EXPECT_EQ(f.get_int("deepseek2.attention.head_count_kv", 0), 1);
  EXPECT_EQ(f.get_int("deepseek2.attention.key_length", 0), 512 + 64);
  EXPECT_EQ(f.get_int("deepseek2.attention.key_length_mla", 0), 128 + 64);
}

TEST(ModelConfig, HfErrorsNameFileAndKey) {
  using nlohmann::json;
  auto parse = [](const std::string& text) { return config_from_hf_json_text(text, "cfg.json"); };
  expect_error([&] { parse(edited_hf("qwen3moe", "hidden_size", json::value_t::discarded)); },
               ErrorKind::kFormat, {"cfg.json", "hidden_size", "missing"});
  expect_error([&] { parse(edited_hf("qwen3moe", "hidden_size", "big")); }, ErrorKind::kFormat,
               {"cfg.json", "hidden_size", "integer", "string"});
  expect_error([&] { parse(edited_hf("qwen3moe", "hidden_size", -256)); }, ErrorKind::kFormat,
               {"cfg.json", "hidden_size", "-256"});
  expect_error([&] { parse(edited_hf("qwen3moe", "num_hidden_layers", 1001)); }, ErrorKind::kFormat,
               {"cfg.json", "num_hidden_layers", "1001"});
  expect_error([&] { parse(edited_hf("qwen3moe", "num_experts_per_tok", 9)); }, ErrorKind::kFormat,
               {"cfg.json", "num_experts_per_tok", "num_experts"});
  expect_error([&] { parse(edited_hf("qwen2moe", "hidden_size", 250)); }, ErrorKind::kFormat,
               {"cfg.json", "num_attention_heads", "250"});
  expect_error([&] { parse(edited_hf("mixtral", "num_key_value_heads", 3)); }, ErrorKind::kFormat,
               {"cfg.json", "num_key_value_heads"});
  expect_error([&] { parse(edited_hf("deepseek3", "n_group", 3)); }, ErrorKind::kFormat,
               {"cfg.json", "n_group"});
  expect_error([&] { parse(edited_hf("deepseek3", "kv_lora_rank", json::value_t::discarded)); },
               ErrorKind::kFormat, {"cfg.json", "kv_lora_rank", "missing"});
  expect_error([&] { parse(edited_hf("deepseek2", "vocab_size", int64_t{1} << 40)); },
               ErrorKind::kFormat, {"cfg.json", "vocab_size"});
  expect_error([&] { parse(edited_hf("deepseek2", "rms_norm_eps", -1.0)); }, ErrorKind::kFormat,
               {"cfg.json", "rms_norm_eps"});
  expect_error([&] { parse(edited_hf("deepseek2", "bos_token_id", 512)); }, ErrorKind::kFormat,
               {"cfg.json", "bos_token_id"});
  expect_error([&] { parse(edited_hf("glm4moe", "partial_rotary_factor", 1e308)); },
               ErrorKind::kFormat, {"cfg.json", "partial_rotary_factor"});
  expect_error([&] { parse(edited_hf("glm4moe", "partial_rotary_factor", 0.01)); },
               ErrorKind::kFormat, {"cfg.json", "partial_rotary_factor"});  // rotates 0 dims
  expect_error([&] { parse(edited_hf("minimax-m2", "rotary_dim", 66)); }, ErrorKind::kFormat,
               {"cfg.json", "rotary_dim", "66"});  // more than head_dim 64
  expect_error([&] { parse(edited_hf("glm4moe", "num_nextn_predict_layers", 65)); },
               ErrorKind::kFormat, {"cfg.json", "num_nextn_predict_layers"});
  expect_error([&] { parse(edited_hf("gpt-oss", "swiglu_limit", -7.0)); }, ErrorKind::kFormat,
               {"cfg.json", "swiglu_limit"});
  expect_error([&] { parse(edited_hf("gpt-oss", "layer_types", nlohmann::json::array({"x"}))); },
               ErrorKind::kFormat, {"cfg.json", "layer_types"});
  // DeepSeek Sparse Attention's keys.
  expect_error([&] { parse(edited_hf("deepseek32", "index_head_dim", 96)); }, ErrorKind::kFormat,
               {"cfg.json", "index_head_dim", "power of two"});
  expect_error([&] { parse(edited_hf("deepseek32", "index_head_dim", 192)); }, ErrorKind::kFormat,
               {"cfg.json", "index_head_dim", "192"});
  expect_error([&] { parse(edited_hf("deepseek32", "index_head_dim", 32)); }, ErrorKind::kFormat,
               {"cfg.json", "index_head_dim", "[64"});
  expect_error([&] { parse(edited_hf("deepseek32", "index_topk", json::value_t::discarded)); },
               ErrorKind::kFormat, {"cfg.json", "index_topk", "missing"});
  expect_error([&] { parse(edited_hf("deepseek32", "q_lora_rank", nullptr)); },
               ErrorKind::kFormat, {"cfg.json", "index_topk", "q LoRA"});
  expect_error(
      [&] { parse(edited_hf("glm-dsa", "indexer_types", json::array({"full", "sometimes"}))); },
      ErrorKind::kFormat, {"cfg.json", "indexer_types"});
  expect_error([&] {
    parse(edited_hf("glm-dsa", "indexer_types", json::array({"shared", "full", "full", "full"})));
  }, ErrorKind::kFormat, {"cfg.json", "indexer_types"});  // layer 0 has nothing to share
  expect_error([&] { parse("{\"hidden_size\": "); }, ErrorKind::kFormat,
               {"cfg.json", "invalid JSON"});
  expect_error([&] { parse("[1, 2]"); }, ErrorKind::kFormat, {"cfg.json", "object"});
}

TEST(ModelConfig, HfUnsupportedNamesWhat) {
  using nlohmann::json;
  auto parse = [](const std::string& text) { return config_from_hf_json_text(text, "cfg.json"); };
  std::string text = edited_hf("mixtral", "architectures", json::array({"LlamaForCausalLM"}));
  text = nlohmann::json::parse(text).dump();
  nlohmann::json j = nlohmann::json::parse(text);
  j["model_type"] = "llama";
  expect_error([&] { parse(j.dump()); }, ErrorKind::kUnsupported,
               {"cfg.json", "LlamaForCausalLM", "not supported"});
  expect_error([&] { parse(edited_hf("mixtral", "hidden_act", "gelu")); }, ErrorKind::kUnsupported,
               {"cfg.json", "hidden_act", "gelu"});
  expect_error(
      [&] {
        parse(edited_hf("qwen3moe", "rope_scaling", {{"type", "dynamic"}, {"factor", 2.0}}));
      },
      ErrorKind::kUnsupported, {"cfg.json", "rope_scaling", "dynamic"});
  expect_error([&] { parse(edited_hf("deepseek3", "scoring_func", "tanh")); },
               ErrorKind::kUnsupported, {"cfg.json", "scoring_func", "tanh"});
  expect_error([&] { parse(edited_hf("minimax-m2", "scoring_func", "softmax")); },
               ErrorKind::kUnsupported, {"cfg.json", "scoring_func"});
  expect_error([&] { parse(edited_hf("minimax-m2", "qk_norm_type", "per_head")); },
               ErrorKind::kUnsupported, {"cfg.json", "qk_norm_type", "per_head"});
  // gpt-oss: windowed layers other than a repeating pattern of windowed then one full.
  const json types = json::array(
      {"sliding_attention", "full_attention", "full_attention", "sliding_attention"});
  expect_error([&] { parse(edited_hf("gpt-oss", "layer_types", types)); },
               ErrorKind::kUnsupported, {"cfg.json", "layer_types", "layer 2"});
}

TEST(ModelConfig, HfArchFromModelTypeAndOptionalForms) {
  using nlohmann::json;
  nlohmann::json j =
      nlohmann::json::parse(edited_hf("deepseek3", "architectures", json::value_t::discarded));
  j["model_type"] = "kimi_k2";
  j["eos_token_id"] = json::array({498, 12});  // a list of ids: the first one
  j["rope_scaling"] = {{"rope_type", "yarn"},
                       {"factor", 32.0},
                       {"beta_fast", 1.0},
                       {"original_max_position_embeddings", 4096}};
  const ModelConfig c = config_from_hf_json_text(j.dump(), "k.json");
  EXPECT_EQ(c.arch, ModelArch::kDeepseek3);
  EXPECT_EQ(c.eos_token_id, 498);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_FLOAT_EQ(c.rope_scaling.factor, 32.0f);
  EXPECT_FLOAT_EQ(c.rope_scaling.beta_fast, 1.0f);
  EXPECT_FLOAT_EQ(c.rope_scaling.beta_slow, 1.0f);  // HF default
  EXPECT_FLOAT_EQ(c.rope_scaling.mscale, 1.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);

  // A directory holding config.json is accepted too.
  const ModelConfig d = config_from_hf_json(test::data_path("golden/mixtral-hf"));
  EXPECT_EQ(d.arch, ModelArch::kMixtral);
  expect_error([] { config_from_hf_json("/nonexistent/config.json"); }, ErrorKind::kIo,
               {"/nonexistent/config.json"});
}

// A copy of a golden GGUF's metadata (no tensors) with one key dropped or replaced.
std::filesystem::path edited_gguf(const test::TempDir& dir, const std::string& arch,
                                  const std::string& key, const GgufValue* value) {
  GgufFile src = GgufFile::open(test::data_path("golden/" + arch + ".gguf"));
  const auto path = dir / (arch + "-edited.gguf");
  GgufWriter w(path);
  for (const auto& [k, v] : src.metadata()) {
    if (k == key) {
      if (value) w.set(k, *value);
    } else {
      w.set(k, v);
    }
  }
  w.add_tensor("output.weight", DType::kF32, {1}, [](void* d) { *static_cast<float*>(d) = 0; });
  w.write();
  return path;
}

TEST(ModelConfig, GgufErrorsNameFileAndKey) {
  test::TempDir dir("mcerr");
  auto open = [&](const std::string& arch, const std::string& key, const GgufValue* v) {
    return
        [&dir, arch, key, v] { config_from_gguf(GgufFile::open(edited_gguf(dir, arch, key, v))); };
  };
  expect_error(open("qwen3moe", "qwen3moe.embedding_length", nullptr), ErrorKind::kFormat,
               {"qwen3moe-edited.gguf", "qwen3moe.embedding_length", "missing"});
  const GgufValue too_many = GgufValue::u32(9);
  expect_error(open("qwen3moe", "qwen3moe.expert_used_count", &too_many), ErrorKind::kFormat,
               {"qwen3moe-edited.gguf", "qwen3moe.expert_used_count"});
  const GgufValue layers = GgufValue::u32(5000);
  expect_error(open("mixtral", "llama.block_count", &layers), ErrorKind::kFormat,
               {"mixtral-edited.gguf", "llama.block_count", "5000"});
  const GgufValue text = GgufValue::string("many");
  expect_error(open("deepseek2", "deepseek2.attention.kv_lora_rank", &text), ErrorKind::kFormat,
               {"deepseek2.attention.kv_lora_rank", "string"});
  const GgufValue gpt = GgufValue::string("gpt2");
  expect_error(open("deepseek2", "general.architecture", &gpt), ErrorKind::kUnsupported,
               {"deepseek2-edited.gguf", "gpt2"});
  const GgufValue no_experts = GgufValue::u32(0);
  expect_error(open("mixtral", "llama.expert_count", &no_experts), ErrorKind::kUnsupported,
               {"mixtral-edited.gguf", "dense"});
  expect_error(open("deepseek32", "deepseek32.attention.indexer.top_k", nullptr),
               ErrorKind::kFormat, {"deepseek32-edited.gguf", "deepseek32.attention.indexer.top_k"});
  const std::vector<GgufValue> two(2, GgufValue::boolean(true));
  const GgufValue short_types = GgufValue::array(GgufType::kBool, two);
  expect_error(open("glm-dsa", "glm-dsa.attention.indexer.types", &short_types),
               ErrorKind::kFormat, {"glm-dsa-edited.gguf", "glm-dsa.attention.indexer.types", "4"});
  const std::vector<GgufValue> words(4, GgufValue::string("full"));
  const GgufValue word_types = GgufValue::array(GgufType::kString, words);
  expect_error(open("glm-dsa", "glm-dsa.attention.indexer.types", &word_types), ErrorKind::kFormat,
               {"glm-dsa-edited.gguf", "glm-dsa.attention.indexer.types", "bool"});
  const GgufValue head = GgufValue::u32(100);
  expect_error(open("glm-dsa", "glm-dsa.attention.indexer.key_length", &head), ErrorKind::kFormat,
               {"glm-dsa-edited.gguf", "glm-dsa.attention.indexer.key_length"});
  const GgufValue gating = GgufValue::u32(7);
  expect_error(open("deepseek3", "deepseek2.expert_gating_func", &gating), ErrorKind::kUnsupported,
               {"deepseek2.expert_gating_func", "7"});
}

TEST(ModelConfig, PresetLookup) {
  EXPECT_EQ(config_preset("deepseek-v3").n_experts, 256);
  EXPECT_EQ(config_preset("kimi-k2").n_experts, 384);
  EXPECT_EQ(config_preset("qwen3-30b-a3b").head_dim, 128);
  expect_error([] { config_preset("gpt-5"); }, ErrorKind::kInvalidArgument,
               {"gpt-5", "deepseek-v3", "tiny-mixtral"});
}

TEST(ModelConfig, WritersRefuseWhatTheFormatCannotSay) {
  ModelConfig c = config_preset("tiny-qwen2moe");
  c.norm_topk_prob = true;  // llama.cpp's qwen2moe never renormalizes
  test::TempDir dir("refuse");
  GgufWriter w(dir / "x.gguf");
  expect_error([&] { write_gguf_config(c, w); }, ErrorKind::kUnsupported, {"norm_topk_prob"});
  EXPECT_NO_THROW(config_to_hf_json(c));  // HF can say it
  c = config_preset("tiny-mixtral");
  c.qk_norm = true;
  expect_error([&] { config_to_hf_json(c); }, ErrorKind::kUnsupported, {"q/k norms"});
}

}  // namespace
}  // namespace tandem
