// `tandem bench` through the real binary on a golden model: the JSON report has both tests with
// positive rates, the time split adds up to the whole forward, and the decode bound equals the
// formula (bytes per decode step / DRAM bandwidth) for the figures it reports, and so does each
// decode repetition's fraction of it; the paired rounds' count follows the round size and their
// median is the list's. The bytes split by section adds up to the step's bytes, its lm_head part
// is the file's output.weight, and the per-section read rates are bytes / time.
// Bad values fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "formats/gguf.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

// --roofline with a made-up machine (20 GB/s DRAM): no bandwidth measured, no DRAM passes.
std::string roofline_flag(const test::TempDir& dir) {
  std::ofstream(dir / "roofline.json") << nlohmann::json{
      {"threads", 2}, {"numa_nodes", 1}, {"isa", "avx2"}, {"dram_read_gbs", 20.0},
      {"dram_kernel", "k"}, {"l3_read_gbs", 1.0}, {"l2_read_gbs", 1.0}, {"l3_kernel", "k"},
      {"l2_kernel", "k"}, {"fp32_gflops", 1.0}, {"fp32_kernel", "k"}, {"bf16_gflops", 1.0},
      {"bf16_kernel", "k"}, {"int8_gops", 1.0}, {"int8_kernel", "k"}, {"dram_buffer_bytes", 1},
      {"l3_bytes_per_thread", 1}, {"l2_bytes_per_thread", 1}, {"huge_pages", false},
      {"huge_page_backed_bytes", 0}}.dump();
  return " --roofline " + (dir / "roofline.json").string();
}

TEST(CliBench, JsonReportIsConsistent) {
  const std::string model = test::data_path("golden/deepseek2-q4_k_m.gguf").string();
  const test::CommandResult r =
      test::run_tandem("bench -m " + model + " -p 32 -n 8 -r 2 --threads 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["tests"].size(), 2u);
  EXPECT_EQ(j["tests"][0]["test"], "pp32");
  EXPECT_EQ(j["tests"][1]["test"], "tg8");
  for (const auto& t : j["tests"]) {
    EXPECT_EQ(t["tokens_per_s"].size(), 2u);
    EXPECT_GT(t["avg_tokens_per_s"].get<double>(), 0.0);
    const auto& s = t["time_split"];
    const double sum = s["attention"].get<double>() + s["ffn"].get<double>() +
                       s["lm_head"].get<double>();
    EXPECT_NEAR(sum, 1.0, 1e-9);
    EXPECT_LE(s["moe_wait"].get<double>(), s["ffn"].get<double>() + 1e-12);
  }
  const double gbs = j["dram_read_gbs"].get<double>();
  const double bytes = j["decode_bytes_per_token"].get<double>();
  EXPECT_GT(gbs, 0.0);
  EXPECT_GT(bytes, 0.0);
  EXPECT_NEAR(j["decode_bound_tokens_per_s"].get<double>(), gbs * 1e9 / bytes,
              1e-6 * gbs * 1e9 / bytes);
  // Decode's fraction of the bound: each repetition against the DRAM figure measured right after
  // it, averaged.
  const auto& tg = j["tests"][1];
  const auto after = tg["dram_read_gbs_after_each"].get<std::vector<double>>();
  const auto tps = tg["tokens_per_s"].get<std::vector<double>>();
  ASSERT_EQ(after.size(), tps.size());
  double fraction = 0;
  for (size_t i = 0; i < tps.size(); ++i) {
    EXPECT_GT(after[i], 0.0);
    fraction += tps[i] * bytes / (after[i] * 1e9) / static_cast<double>(tps.size());
  }
  EXPECT_NEAR(tg["fraction_of_bound"].get<double>(), fraction, 1e-9 * fraction);
  // Paired rounds: tg8 in rounds of clamp(8 / 16, 1, 8) = 1 token, each followed by a DRAM pass,
  // so 8 rounds per repetition; the reported median is the list's.
  const auto& pr = tg["paired_rounds"];
  EXPECT_EQ(pr["tokens_per_round"].get<int>(), 1);
  std::vector<double> rounds = pr["fraction_of_bound"].get<std::vector<double>>();
  ASSERT_EQ(rounds.size(), 16u);
  for (double f : rounds) EXPECT_GT(f, 0.0);
  std::sort(rounds.begin(), rounds.end());
  EXPECT_DOUBLE_EQ(pr["median"].get<double>(), 0.5 * (rounds[7] + rounds[8]));

  // Bytes by section: they add up to the step; lm_head's is output.weight's size in the file.
  const auto& split = j["decode_bytes_split"];
  const double att = split["attention"].get<double>(), ffn = split["ffn"].get<double>();
  const double head = split["lm_head"].get<double>();
  EXPECT_GT(att, 0.0);
  EXPECT_GT(ffn, 0.0);
  EXPECT_EQ(att + ffn + head + split["kv_cache"].get<double>(), bytes);
  const GgufFile f = GgufFile::open(model);
  const Tensor out = f.tensor("output.weight");
  EXPECT_EQ(head, static_cast<double>(out.rows()) * static_cast<double>(out.row_bytes()));
  // Each section's rate is its bytes over its share of the same decode time: rate * share / bytes
  // is one constant (decode steps / seconds) for every section.
  const auto& rate = tg["section_read_gbs"];
  const auto& share = tg["time_split"];
  const double k = rate["lm_head"].get<double>() * share["lm_head"].get<double>() / head;
  EXPECT_GT(k, 0.0);
  for (const char* sec : {"attention", "ffn"}) {
    const double b = split[sec].get<double>();
    EXPECT_NEAR(rate[sec].get<double>() * share[sec].get<double>() / b, k, 1e-6 * k) << sec;
  }
}

// -d: every test after that many tokens already in the context (llama-bench's depth). The tests
// are named "pp8 @ d24" / "tg4 @ d24", and a decode step's bytes include the latent KV cache of
// the positions it attends to: layers x (kv_lora_rank + rope dims) x 4 bytes per position, over
// depth + (n + 1) / 2 positions on average.
// With an accelerator, the decode's timeline: each side's busy fraction in (0, 1], their overlap
// within both, and at least the bytes the forward must move per token: per MoE layer the MoE
// input and router logits to the host and the routed output back, and the logits row.
TEST(CliBench, AcceleratorTimeline) {
  const std::string path = test::data_path("golden/deepseek3.gguf").string();
  test::TempDir dir("bench_timeline");
  const std::string flags = " --threads 2 --accel host --vram-budget 64M" + roofline_flag(dir);
  const test::CommandResult r =
      test::run_tandem("bench -m " + path + " -p 8 -n 6 -r 2 --json" + flags);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["tests"].size(), 2u);
  EXPECT_FALSE(j["tests"][0].contains("timeline"));  // prefill: no timeline
  const auto& tl = j["tests"][1]["timeline"];
  for (const char* k : {"device_busy", "cpu_experts_busy"}) {
    EXPECT_GT(tl[k].get<double>(), 0.0) << k;
    EXPECT_LE(tl[k].get<double>(), 1.0) << k;
  }
  EXPECT_LE(tl["overlap"].get<double>(),
            std::min(tl["device_busy"].get<double>(), tl["cpu_experts_busy"].get<double>()) + 1e-9);
  const GgufFile f = GgufFile::open(path);
  const int64_t hidden = f.get_int("deepseek2.embedding_length", 0);
  const int64_t experts = f.get_int("deepseek2.expert_count", 0);
  const int64_t layers = f.get_int("deepseek2.block_count", 0);
  const int64_t dense = f.get_int("deepseek2.leading_dense_block_count", 0);
  const int64_t vocab = f.find_tensor("token_embd.weight")->shape[0];
  ASSERT_GT(hidden * experts * layers * vocab, 0);
  const double moe_layers = static_cast<double>(layers - dense);
  EXPECT_GE(tl["h2d_bytes_per_token"].get<double>(), moe_layers * hidden * 4);
  EXPECT_GE(tl["d2h_bytes_per_token"].get<double>(),
            moe_layers * (hidden + experts) * 4 + static_cast<double>(vocab) * 4);
  const test::CommandResult text = test::run_tandem("bench -m " + path + " -p 0 -n 4 -r 1" + flags);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("tg4: accelerator busy "), std::string::npos) << text.out;
}

TEST(CliBench, DepthStartsEveryTestAfterAContext) {
  const std::string model = test::data_path("golden/deepseek2-q4_k_m.gguf").string();
  const test::CommandResult r =
      test::run_tandem("bench -m " + model + " -d 24 -p 8 -n 4 -r 2 --threads 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["depth"], 24);
  ASSERT_EQ(j["tests"].size(), 2u);
  EXPECT_EQ(j["tests"][0]["test"], "pp8 @ d24");
  EXPECT_EQ(j["tests"][1]["test"], "tg4 @ d24");
  for (const auto& t : j["tests"]) EXPECT_GT(t["avg_tokens_per_s"].get<double>(), 0.0);
  const GgufFile f = GgufFile::open(model);
  const double per_position = 4.0 * static_cast<double>(f.get_int("deepseek2.block_count", 0)) *
                              static_cast<double>(f.get_int("deepseek2.attention.kv_lora_rank", 0) +
                                                  f.get_int("deepseek2.rope.dimension_count", 0));
  EXPECT_GT(per_position, 0.0);
  EXPECT_NEAR(j["decode_bytes_split"]["kv_cache"].get<double>(), per_position * (24 + 2.5), 1.0);
  const test::CommandResult bad = test::run_tandem("bench -m " + model + " -d -5");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("-d"), std::string::npos) << bad.err;
  // A depth whose KV cache cannot fit (here > 1 TiB): a clear error, no allocation attempted.
  const test::CommandResult huge = test::run_tandem("bench -m " + model + " -d 1000000000");
  EXPECT_NE(huge.exit_code, 0);
  EXPECT_NE(huge.err.find("a KV cache of 1000000648 positions needs"), std::string::npos)
      << huge.err;
}

TEST(CliBench, BadValuesFailWithMessage) {
  const std::string model = test::data_path("golden/deepseek2-q4_k_m.gguf").string();
  const test::CommandResult r = test::run_tandem("bench -m " + model + " -r 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("-r"), std::string::npos) << r.err;
  const test::CommandResult m = test::run_tandem("bench -m /nonexistent/model.gguf");
  EXPECT_NE(m.exit_code, 0);
  EXPECT_NE(m.err.find("/nonexistent/model.gguf"), std::string::npos) << m.err;
  const test::CommandResult a = test::run_tandem("bench -m " + model + " --mla fast");
  EXPECT_NE(a.exit_code, 0);
  EXPECT_NE(a.err.find("'auto', 'absorbed' or 'naive', got 'fast'"), std::string::npos) << a.err;
}

// --vs: a second backend configuration on the same loaded model, every repetition run on both.
// The report has both configurations' rates, the ratio of each back-to-back pair equals their
// quotient and the median is the middle one; the second backend is the one the flags describe.
// Bad --vs flags fail naming --vs.
TEST(CliBench, VsRunsASecondBackendPairByPair) {
  const std::string model = test::data_path("golden/deepseek2-q4_k_m.gguf").string();
  const test::CommandResult r = test::run_tandem(
      "bench -m " + model +
      " -p 16 -n 4 -r 3 --threads 2 --json --vs \"--cpu-experts int8 --expert-group 32 "
      "--no-expert-cache\"");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["vs"]["backend"].get<std::string>().find("int8 group 32"), std::string::npos)
      << j["vs"];
  EXPECT_EQ(j["backend"].get<std::string>().find("int8"), std::string::npos) << j["backend"];
  ASSERT_EQ(j["tests"].size(), 2u);
  for (const auto& t : j["tests"]) {
    const auto a = t["tokens_per_s"].get<std::vector<double>>();
    const auto b = t["vs"]["tokens_per_s"].get<std::vector<double>>();
    const auto ratio = t["vs"]["ratio_per_pair"].get<std::vector<double>>();
    ASSERT_EQ(a.size(), 3u);
    ASSERT_EQ(b.size(), 3u);
    ASSERT_EQ(ratio.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_GT(b[i], 0.0);
      EXPECT_NEAR(ratio[i], b[i] / a[i], 1e-12 * ratio[i]);
    }
    std::vector<double> sorted = ratio;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(t["vs"]["ratio_median"].get<double>(), sorted[1]);
    const auto& s = t["vs"]["time_split"];
    EXPECT_NEAR(s["attention"].get<double>() + s["ffn"].get<double>() + s["lm_head"].get<double>(),
                1.0, 1e-9);
  }
  for (const char* bad : {"--bogus 3", "--cpu-experts int9", "--mla fast", "--cache-type q8"}) {
    const test::CommandResult e = test::run_tandem("bench -m " + model + " -p 0 -n 2 -r 1 --vs \"" +
                                                   std::string(bad) + "\"");
    EXPECT_NE(e.exit_code, 0) << bad;
    EXPECT_NE(e.err.find("--vs"), std::string::npos) << e.err;
  }
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// --batch N: llama-batched-bench's test. Per N the report has the aggregate decode rate (and per
// sequence: aggregate / N), and the bytes a step read: the dense weights, per MoE layer the union
// of the experts its N tokens chose (counted from the routing), the latent KV cache of the
// positions attended. For N = 1 the union is the top-k: the step's bytes equal the single-sequence
// report's formula (dense + k average experts) with the cache of P + (n + 1) / 2 positions; for
// N = 4 the experts' part lies between k and min(4k, experts) experts per layer. The fraction of
// the bound is the bytes read per second over the DRAM figure measured after the repetition.
TEST(CliBench, BatchCountsTheExpertsTheStepsRead) {
  const std::string model = test::data_path("golden/deepseek2-q4_k_m.gguf").string();
  // A machine of 20 GB/s (--roofline: no bandwidth measured, the test stays short).
  test::TempDir dir("bench_batch");
  const std::string roofline = roofline_flag(dir);
  const test::CommandResult single =
      test::run_tandem("bench -m " + model + " -p 0 -n 8 -r 1 --threads 2 --json" + roofline);
  ASSERT_EQ(single.exit_code, 0) << single.err;
  const nlohmann::json s = nlohmann::json::parse(single.out);
  const double kv_per_position = s["decode_bytes_split"]["kv_cache"].get<double>() / 4.5;
  const double no_kv = s["decode_bytes_per_token"].get<double>() -
                       s["decode_bytes_split"]["kv_cache"].get<double>();
  EXPECT_DOUBLE_EQ(kv_per_position, 3 * (128 + 32) * 4);  // 3 layers of F32 latents
  const test::CommandResult r =
      test::run_tandem("bench -m " + model + " --batch 1,4 -p 16 -n 8 -r 1 --threads 2 --json" +
                       roofline);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["batched"].size(), 2u);
  // One expert of each MoE layer (gate + up + down), from the file.
  const GgufFile f = GgufFile::open(model);
  double one_each = 0;
  for (const GgufTensorInfo& t : f.tensors()) {
    if (t.name.find("_exps.weight") != std::string::npos) one_each += t.nbytes / 8.0;
  }
  const double kv = (16 + (8 + 1) / 2.0) * kv_per_position;  // mean positions attended
  const double dense = no_kv - 2 * one_each;                  // top-2
  for (const auto& b : j["batched"]) {
    const int n = b["n_sequences"].get<int>();
    const double agg = b["avg_aggregate_decode_tokens_per_s"].get<double>();
    EXPECT_GT(agg, 0.0);
    EXPECT_DOUBLE_EQ(b["per_sequence_decode_tokens_per_s"].get<double>(), agg / n);
    EXPECT_GT(b["avg_prefill_tokens_per_s"].get<double>(), 0.0);
    const double bytes = b["decode_bytes_per_step"].get<double>();
    const double experts = bytes - dense - n * kv;
    if (n == 1) {
      EXPECT_NEAR(experts, 2 * one_each, 1.0);
    } else {
      EXPECT_GE(experts, 2 * one_each - 1.0);
      EXPECT_LE(experts, 8 * one_each + 1.0);
    }
    const double gbs = b["dram_read_gbs_after_each"][0].get<double>();
    EXPECT_EQ(gbs, 20.0);
    EXPECT_NEAR(b["avg_fraction_of_bound"].get<double>(), agg / n * bytes / (gbs * 1e9),
                1e-6 * agg / n * bytes / (gbs * 1e9));
  }
  EXPECT_EQ(j["batched"][0]["n_sequences"], 1);
  EXPECT_EQ(j["batched"][1]["n_sequences"], 4);
  const test::CommandResult bad =
      test::run_tandem("bench -m " + model + " --batch 0 -p 16 -n 8 --threads 2");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--batch"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace tandem
