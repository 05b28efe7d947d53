// `tandem bench`: prefill and decode throughput like llama.cpp's llama-bench. pp: P random
// (seeded, valid) tokens prefilled as one batch into an empty context; tg: N tokens decoded one at
// a time from an empty context. Each test runs -r times (after one untimed warm-up of a few
// tokens); mean +- sample stddev of tokens/s. Also prints where the time went (attention, MoE,
// lm_head) and the decode bound from DRAM bandwidth: bytes a decode step must read (every
// non-expert weight the step uses + top-k routed experts per MoE layer) / DRAM read GB/s, measured
// now (a short `tandem roofline`) or read from `--roofline FILE` (`tandem roofline --json`).
// Measured, it is measured again right after each decode repetition and each repetition's
// fraction of the bound uses that figure: on a shared host DRAM bandwidth swings within minutes.
// Decode also reports each section's weight bytes per step and the rate it read them at (bytes /
// the section's time): the part of the step that falls short of DRAM.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/weights.h"
#include "ops/cpu/roofline.h"
#include "tools/command.h"
#include "tools/options.h"

namespace tandem::tools {
namespace {

struct BenchArgs {
  std::string model;
  int n_prompt = 512;
  int n_gen = 128;
  int reps = 2;
  int threads = 0;
  bool json = false;
  std::string roofline;
  BackendOptions backend;
};

struct Stat {
  double mean = 0, stddev = 0;
};

Stat stat(const std::vector<double>& v) {
  Stat s;
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  if (v.size() > 1) {
    double q = 0;
    for (double x : v) q += (x - s.mean) * (x - s.mean);
    s.stddev = std::sqrt(q / static_cast<double>(v.size() - 1));
  }
  return s;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t tensor_bytes(const Tensor& t) {
  return t.data == nullptr ? 0 : static_cast<uint64_t>(t.rows()) * t.row_bytes();
}
uint64_t weight_bytes(const ops::Weight& w) {
  return tensor_bytes(w.t);
}

// Bytes one decode step reads, by the section of Model::Profile that reads them: all per-layer
// weights except the routed experts, k average routed experts per MoE layer, the final norm and
// lm_head (the embedding row is negligible). The router belongs to the FFN section.
struct StepBytes {
  uint64_t attention = 0, ffn = 0, lm_head = 0;
  uint64_t total() const { return attention + ffn + lm_head; }
};

StepBytes decode_bytes(const LoadedModel& m) {
  StepBytes b;
  b.lm_head = weight_bytes(m.lm_head);
  const int64_t k = m.config.n_experts_per_tok;
  for (const LayerWeights& l : m.layers) {
    for (const ops::Weight* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.wq_a, &l.wq_b, &l.wkv_a}) {
      b.attention += weight_bytes(*w);
    }
    for (const auto& v : {&l.k_up, &l.v_up}) {
      for (const ops::Weight& w : *v) b.attention += weight_bytes(w);
    }
    for (const ops::Weight* w : {&l.ffn_gate, &l.ffn_up, &l.ffn_down, &l.router, &l.sh_gate,
                                 &l.sh_up, &l.sh_down}) {
      b.ffn += weight_bytes(*w);
    }
    if (l.moe && !l.experts.gate.empty()) {
      uint64_t all = 0;
      const size_t ne = l.experts.gate.size();
      for (size_t e = 0; e < ne; ++e) {
        all += weight_bytes(l.experts.gate[e]) + weight_bytes(l.experts.up[e]) +
               weight_bytes(l.experts.down[e]);
      }
      b.ffn += all / ne * static_cast<uint64_t>(k);
    }
  }
  return b;
}

void run_bench(const BenchArgs& a) {
  if (a.n_prompt < 0 || a.n_gen < 0 || a.reps < 1) {
    fail(ErrorKind::kInvalidArgument, "-p and -n must be >= 0 and -r >= 1 (got {}, {}, {})",
         a.n_prompt, a.n_gen, a.reps);
  }
  const LoadedModel lm = load_model(a.model, load_mode(a.backend));
  page_in_model(lm);
  ThreadingContext threading(ThreadingOptions{a.threads, true, 50});
  MoeRuntime moe(lm, a.backend, threading);
  const ModelConfig& c = lm.config;

  // DRAM read bandwidth: from --roofline FILE, or measured now and again right after each decode
  // repetition (the bandwidth this machine gets can change within minutes).
  double dram_gbs = 0;
  std::unique_ptr<cpu::DramReadProbe> probe;
  if (!a.roofline.empty()) {
    std::ifstream in(a.roofline);
    if (!in) fail(ErrorKind::kIo, "--roofline: cannot read '{}'", a.roofline);
    std::stringstream text;
    text << in.rdbuf();
    dram_gbs = cpu::roofline_from_json(text.str()).dram_read_gbs;
  } else {
    cpu::RooflineOptions ro;
    ro.dram_bytes = size_t{512} << 20;
    ro.seconds = 0.1;
    ro.repetitions = 2;
    probe = std::make_unique<cpu::DramReadProbe>(threading, ro);
    dram_gbs = probe->measure();
  }
  const StepBytes split = decode_bytes(lm);
  const uint64_t step_bytes = split.total();
  const double bound_tps = dram_gbs > 0 ? dram_gbs * 1e9 / static_cast<double>(step_bytes) : 0;

  ModelOptions mo;
  mo.ctx = std::max(1, a.n_prompt + a.n_gen + 8);
  mo.pool = &threading.pool();
  mo.moe = moe.backend();
  Model model(lm, mo);
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(a.n_prompt));
  for (int32_t& t : prompt) t = tok(rng);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));

  // Warm-up, as llama-bench does: one prefill of the test's size (the scratch buffers grow to it:
  // first-touch page faults were ~9% of a cold pp512) and one decode step, outside the timing.
  const int32_t warm[4] = {1, 2, 3, 4};
  if (a.n_prompt > 0) {
    model.forward(prompt, logits.data(), false);
  } else {
    model.forward(std::span<const int32_t>(warm, 4), logits.data(), false);
  }
  model.forward(std::span<const int32_t>(warm, 1), logits.data(), false);
  model.reset();

  struct Result {
    std::string test;
    int n = 0;
    std::vector<double> tps;
    Model::Profile profile;
  };
  std::vector<Result> results;
  std::vector<double> rep_dram_gbs;  // measured right after each decode repetition
  auto diff = [](const Model::Profile& b, const Model::Profile& e) {
    Model::Profile d;
    d.attention = e.attention - b.attention;
    d.ffn = e.ffn - b.ffn;
    d.moe_wait = e.moe_wait - b.moe_wait;
    d.lm_head = e.lm_head - b.lm_head;
    return d;
  };
  if (a.n_prompt > 0) {
    Result r{fmt::format("pp{}", a.n_prompt), a.n_prompt, {}, {}};
    const Model::Profile p0 = model.profile();
    for (int i = 0; i < a.reps; ++i) {
      model.reset();
      const double t0 = now_s();
      model.forward(prompt, logits.data(), false);
      r.tps.push_back(a.n_prompt / (now_s() - t0));
    }
    r.profile = diff(p0, model.profile());
    results.push_back(r);
  }
  if (a.n_gen > 0) {
    Result r{fmt::format("tg{}", a.n_gen), a.n_gen, {}, {}};
    Model::Profile profile;
    for (int i = 0; i < a.reps; ++i) {
      model.reset();
      const Model::Profile p0 = model.profile();
      const double t0 = now_s();
      for (int j = 0; j < a.n_gen; ++j) {
        const int32_t t = prompt.empty() ? j % static_cast<int32_t>(c.vocab_size)
                                         : prompt[j % prompt.size()];
        model.forward(std::span<const int32_t>(&t, 1), logits.data(), false);
      }
      r.tps.push_back(a.n_gen / (now_s() - t0));
      const Model::Profile d = diff(p0, model.profile());
      profile.attention += d.attention;
      profile.ffn += d.ffn;
      profile.moe_wait += d.moe_wait;
      profile.lm_head += d.lm_head;
      if (probe) rep_dram_gbs.push_back(probe->measure());
    }
    r.profile = profile;
    results.push_back(r);
  }

  nlohmann::json j;
  j["model"] = a.model;
  j["model_summary"] = model_summary(lm);
  j["backend"] = moe.summary();
  j["threads"] = threading.n_threads();
  j["isa"] = isa_name(best_isa());
  j["dram_read_gbs"] = dram_gbs;
  j["decode_bytes_per_token"] = step_bytes;
  j["decode_bound_tokens_per_s"] = bound_tps;
  j["decode_bytes_split"] = {
      {"attention", split.attention}, {"ffn", split.ffn}, {"lm_head", split.lm_head}};
  for (const Result& r : results) {
    const Stat s = stat(r.tps);
    const double total = r.profile.attention + r.profile.ffn + r.profile.lm_head;
    nlohmann::json t;
    t["test"] = r.test;
    t["n_tokens"] = r.n;
    t["reps"] = a.reps;
    t["tokens_per_s"] = r.tps;
    t["avg_tokens_per_s"] = s.mean;
    t["stddev_tokens_per_s"] = s.stddev;
    t["time_split"] = {{"attention", r.profile.attention / std::max(total, 1e-12)},
                       {"ffn", r.profile.ffn / std::max(total, 1e-12)},
                       {"moe_wait", r.profile.moe_wait / std::max(total, 1e-12)},
                       {"lm_head", r.profile.lm_head / std::max(total, 1e-12)}};
    if (r.test.rfind("tg", 0) == 0 && bound_tps > 0) {
      // Each repetition against the DRAM figure measured right after it, when there is one.
      std::vector<double> fraction;
      for (size_t i = 0; i < r.tps.size(); ++i) {
        const double gbs = i < rep_dram_gbs.size() ? rep_dram_gbs[i] : dram_gbs;
        fraction.push_back(r.tps[i] * static_cast<double>(step_bytes) / (gbs * 1e9));
      }
      t["fraction_of_bound"] = stat(fraction).mean;
      // Each section's weight bytes over its time: which part of the step falls short of DRAM.
      const double steps = static_cast<double>(r.n) * static_cast<double>(r.tps.size());
      auto rate = [&](uint64_t bytes, double seconds) {
        return seconds > 0 ? static_cast<double>(bytes) * steps / seconds / 1e9 : 0.0;
      };
      t["section_read_gbs"] = {{"attention", rate(split.attention, r.profile.attention)},
                               {"ffn", rate(split.ffn, r.profile.ffn)},
                               {"lm_head", rate(split.lm_head, r.profile.lm_head)}};
      if (!rep_dram_gbs.empty()) t["dram_read_gbs_after_each"] = rep_dram_gbs;
    }
    j["tests"].push_back(t);
  }
  if (a.json) {
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("model: {}\nbackend: {}\nthreads: {}, kernel ISA {}\n", model_summary(lm), moe.summary(),
             threading.n_threads(), isa_name(best_isa()));
  fmt::print("| {:>8} | {:>18} | {:>9} | {:>6} | {:>8} | {:>7} |\n", "test", "t/s", "attention",
             "ffn", "moe_wait", "lm_head");
  fmt::print("| {:->8} | {:->18} | {:->9} | {:->6} | {:->8} | {:->7} |\n", "", "", "", "", "", "");
  for (const auto& t : j["tests"]) {
    const auto& sp = t["time_split"];
    fmt::print("| {:>8} | {:>9.2f} ± {:<6.2f} | {:>8.0f}% | {:>5.0f}% | {:>7.0f}% | {:>6.0f}% |\n",
               t["test"].get<std::string>(), t["avg_tokens_per_s"].get<double>(),
               t["stddev_tokens_per_s"].get<double>(), 100 * sp["attention"].get<double>(),
               100 * sp["ffn"].get<double>(), 100 * sp["moe_wait"].get<double>(),
               100 * sp["lm_head"].get<double>());
  }
  fmt::print("decode bound: {:.2f} GB per token at {:.1f} GB/s DRAM read = {:.1f} tokens/s\n",
             step_bytes / 1e9, dram_gbs, bound_tps);
  for (const auto& t : j["tests"]) {
    if (t.contains("fraction_of_bound")) {
      fmt::print("{}: {:.0f}% of the decode bound", t["test"].get<std::string>(),
                 100 * t["fraction_of_bound"].get<double>());
      if (t.contains("dram_read_gbs_after_each")) {
        fmt::print(" (each repetition against DRAM measured right after it: {:.1f} GB/s)",
                   fmt::join(t["dram_read_gbs_after_each"].get<std::vector<double>>(), " / "));
      }
      fmt::print("\n");
    }
    if (t.contains("section_read_gbs")) {
      const auto& g = t["section_read_gbs"];
      fmt::print("{}: weights read at {:.1f} GB/s in attention, {:.1f} in the FFN / MoE, {:.1f} in "
                 "lm_head\n",
                 t["test"].get<std::string>(), g["attention"].get<double>(),
                 g["ffn"].get<double>(), g["lm_head"].get<double>());
    }
  }
}

void add_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  app.add_option("-m,--model", args->model, "a .gguf file or an HF checkpoint directory")
      ->required();
  app.add_option("-p,--n-prompt", args->n_prompt, "prompt tokens prefilled as one batch (0: skip)")
      ->capture_default_str();
  app.add_option("-n,--n-gen", args->n_gen, "tokens decoded one at a time (0: skip)")
      ->capture_default_str();
  app.add_option("-r,--repetitions", args->reps, "repetitions of each test")->capture_default_str();
  app.add_option("--threads", args->threads, "worker threads (default: one per physical core)");
  app.add_flag("--json", args->json, "print JSON instead of the table");
  app.add_option("--roofline", args->roofline,
                 "`tandem roofline --json` output to take DRAM bandwidth from (default: measure)");
  add_backend_options(app, &args->backend);
  app.callback([args] { run_bench(*args); });
}

Registrar reg("bench", "prefill (pp) and decode (tg) tokens/s, like llama-bench", add_bench);

}  // namespace
}  // namespace tandem::tools
