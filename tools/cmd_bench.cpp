// `tandem bench`: prefill and decode throughput like llama.cpp's llama-bench. pp: P random
// (seeded, valid) tokens prefilled as one batch into an empty context; tg: N tokens decoded one at
// a time from an empty context. -d D: both after D tokens already in the context (prefilled once,
// untimed; each repetition rewinds to them), named "pp512 @ d4096" as llama-bench does. Each test
// runs -r times (after one untimed warm-up of a few
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

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "core/topology.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/weights.h"
#include "ops/cpu/roofline.h"
#include "runtime/timeline.h"
#include "tools/timeline_file.h"
#include "tools/bench_batch.h"
#include "tools/bench_util.h"
#include "tools/command.h"
#include "tools/options.h"

namespace tandem::tools {
namespace {

struct BenchArgs {
  std::string model;
  int n_prompt = 512;
  int n_gen = 128;
  int depth = 0;
  int reps = 2;
  int threads = 0;
  bool json = false;
  std::string roofline;
  BackendOptions backend;
  std::string vs;  // backend flags of a second configuration, alternated with the first
  std::string mla = "auto";
  std::string cache_type = "f32";
  std::vector<int> batch;       // --batch: sequences decoding together (the batched test)
  int64_t batch_tokens = 2048;  // -b: tokens per forward while the batched test's prompts fill
  std::string timeline;         // --timeline FILE: the decode repetitions' timeline
};

void check_bench_args(const BenchArgs& a) {
  if (a.n_prompt < 0 || a.n_gen < 0 || a.reps < 1 || a.depth < 0) {
    fail(ErrorKind::kInvalidArgument,
         "-p, -n and -d must be >= 0 and -r >= 1 (got {}, {}, {}, {})", a.n_prompt, a.n_gen,
         a.depth, a.reps);
  }
  if (!a.vs.empty() && !a.batch.empty()) {
    fail(ErrorKind::kInvalidArgument, "--batch and --vs: one at a time");
  }
  for (const int n : a.batch) {
    if (n < 1 || n > kMaxBatchSequences) {
      fail(ErrorKind::kInvalidArgument, "--batch: {} sequences (1 to {})", n, kMaxBatchSequences);
    }
  }
  if (a.batch_tokens < 1) {
    fail(ErrorKind::kInvalidArgument, "-b must be at least 1, got {}", a.batch_tokens);
  }
}

// --vs FLAGS: a second backend configuration (these flags over the first's), its own MoeRuntime
// and Model on the same loaded weights, each repetition run on both in alternating order (A B,
// B A, ...): the paired ratios compare the two in the same minutes.
struct VsConfig {
  BackendOptions backend;
  std::string mla, cache_type;
};

VsConfig parse_vs(const BenchArgs& a) {
  VsConfig v{a.backend, a.mla, a.cache_type};
  CLI::App flags("--vs");
  add_backend_options(flags, &v.backend);
  add_mla_option(flags, &v.mla);
  add_cache_type_option(flags, &v.cache_type);
  try {
    flags.parse(a.vs, false);
  } catch (const CLI::ParseError& e) {
    fail(ErrorKind::kInvalidArgument, "--vs '{}': {}", a.vs, e.what());
  }
  try {
    parse_mla_mode(v.mla);
    parse_kv_type(v.cache_type);
    v.backend = resolve_backend_options(v.backend, a.model);
  } catch (const Error& e) {
    fail(e.kind(), "--vs '{}': {}", a.vs, e.what());
  }
  return v;
}

// One load for both configurations: into huge-page memory when either side would read it there,
// unless the other side also copies its experts into memory of its own (repack / int8 / ...)
// and the two would not fit: about twice the model's bytes. Then mapped, said in a warning.
LoadMode shared_load_mode(const BenchArgs& a, const BackendOptions& backend,
                          const VsConfig* vs) {
  LoadMode mode = load_mode(backend) == LoadMode::kCopy ||
                          (vs != nullptr && load_mode(vs->backend) == LoadMode::kCopy)
                      ? LoadMode::kCopy
                      : LoadMode::kMap;
  if (vs != nullptr && mode == LoadMode::kCopy && load_mode(backend) != load_mode(vs->backend)) {
    const uint64_t bytes = model_file_bytes(a.model);
    const uint64_t available = meminfo_bytes("MemAvailable");
    if (available > 0 && 2 * bytes > available / 10 * 9) {
      log_warn("--vs: the model ({:.1f} GiB) copied and its experts prepared again would not fit "
               "in the {:.1f} GiB available: mapping the model instead (the side reading it in "
               "place then reads 4 KiB page-cache pages)",
               bytes / 1073741824.0, available / 1073741824.0);
      mode = LoadMode::kMap;
    }
  }
  return mode;
}

// The header lines every report starts with.
nlohmann::json report_header(const BenchArgs& a, Engine& engine) {
  nlohmann::json j;
  j["model"] = a.model;
  j["model_summary"] = model_summary(engine.weights());
  j["backend"] = engine.moe().summary();
  j["threads"] = engine.threading().n_threads();
  j["isa"] = isa_name(best_isa());
  return j;
}

void print_header(const nlohmann::json& j) {
  fmt::print("model: {}\nbackend: {}\nthreads: {}, kernel ISA {}\n",
             j["model_summary"].get<std::string>(), j["backend"].get<std::string>(),
             j["threads"].get<int>(), j["isa"].get<std::string>());
}

// One test's measurements over its repetitions.
struct BenchResult {
  std::string test;
  int n = 0;
  std::vector<double> tps, tps_b;  // per repetition: the first configuration, the --vs one
  Model::Profile profile, profile_b;
  std::vector<double> rounds;  // decode's paired rounds: each one's fraction of the bound
  int round_tokens = 0;
  // With an accelerator: the decode's timeline (the first configuration), its decode seconds.
  rt::Timeline::Summary timeline;
  double decode_s = 0;
  int64_t graph_steps = 0;  // the first configuration's steps replayed from graphs
};

// Paired rounds: a decode repetition (of both configurations under --vs) runs in rounds of
// `round_tokens` tokens, each followed by one short DRAM pass (the fastest read kernel, ~40 ms,
// not timed with the decode); a round's fraction of the bound is its bytes per second over that
// pass's. Their median compares decode with the bandwidth of the same minute, as the layer
// benchmarks' of_dram do (the figure after each repetition is the best of ten longer passes: the
// bandwidth's peaks, where a repetition averages over its swings).
int round_tokens(int n) { return std::clamp(n / 16, 1, 8); }

// The single-sequence tests (pp, tg) on one or two configurations of the same loaded model.
class SequenceBench {
 public:
  SequenceBench(const BenchArgs& a, Engine& engine, MoeRuntime* moe_b, const VsConfig* vs,
                cpu::DramReadProbe* probe, uint64_t step_bytes)
      : a_(a), engine_(engine), probe_(probe), step_bytes_(step_bytes),
        model_(engine.model(), context(a), parse_kv_type(a.cache_type)) {
    if (vs != nullptr) {
      ModelOptions mo_b;
      mo_b.forward.pool = &engine.threading().pool();
      mo_b.forward.mla = parse_mla_mode(vs->mla);
      moe_b->apply(&mo_b);
      net_b_ = std::make_unique<Model>(engine.weights(), mo_b);
      model_b_ = std::make_unique<SingleSequence>(*net_b_, context(a), parse_kv_type(vs->cache_type));
    }
    const int64_t vocab = engine.weights().config.vocab_size;
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
    prompt_.resize(static_cast<size_t>(a.n_prompt));
    for (int32_t& t : prompt_) t = tok(rng);
    logits_.resize(static_cast<size_t>(vocab));
    ctx_tokens_.resize(static_cast<size_t>(a.depth));
    for (int32_t& t : ctx_tokens_) t = tok(rng);
  }

  void set_step_bytes(uint64_t bytes) { step_bytes_ = bytes; }
  static int64_t context(const BenchArgs& a) {
    return std::max<int64_t>(1, int64_t{a.depth} + a.n_prompt + a.n_gen + 8);
  }
  SingleSequence& model() { return model_; }

  // Warm-up, as llama-bench does: one prefill of the test's size (the scratch buffers grow to it:
  // first-touch page faults were ~9% of a cold pp512) and one decode step, outside the timing.
  // Then -d: the context every test starts from, prefilled once (in batches of up to 512 tokens,
  // as a chat would); the tests only write the positions after it, so rewinding restores it.
  void prepare() {
    const int32_t warm[4] = {1, 2, 3, 4};
    for (SingleSequence* m : {&model_, model_b_.get()}) {
      if (m == nullptr) continue;
      if (a_.n_prompt > 0) {
        m->forward(prompt_, logits_.data(), false);
      } else {
        m->forward(std::span<const int32_t>(warm, 4), logits_.data(), false);
      }
      m->forward(std::span<const int32_t>(warm, 1), logits_.data(), false);
      m->reset();
      for (size_t b = 0; b < ctx_tokens_.size(); b += 512) {
        const size_t e = std::min(ctx_tokens_.size(), b + 512);
        // (A checkpoint at the end: a recurrent state rewinds to it.)
        m->forward(std::span<const int32_t>(ctx_tokens_.data() + b, e - b), logits_.data(),
                   false, e == ctx_tokens_.size());
      }
    }
  }

  // Runs a test -r times (alternating with the --vs configuration) and keeps its result.
  void run_test(const std::string& name, bool decode, int n) {
    BenchResult r;
    r.test = name;
    r.n = n;
    std::vector<double>* rounds = decode && probe_ != nullptr ? &r.rounds : nullptr;
    if (rounds != nullptr) r.round_tokens = round_tokens(n);
    // The --vs configuration's decode runs in the same rounds (their passes between its tokens
    // too, so both sides of a pair see the same interruptions); its fractions are not reported.
    std::vector<double> rounds_b;
    std::vector<double>* rb = rounds != nullptr ? &rounds_b : nullptr;
    for (int i = 0; i < a_.reps; ++i) {
      if (model_b_ && i % 2 == 1) r.tps_b.push_back(rep(*model_b_, decode, n, &r.profile_b, rb));
      r.tps.push_back(rep(model_, decode, n, &r.profile, rounds, &r));
      if (model_b_ && i % 2 == 0) r.tps_b.push_back(rep(*model_b_, decode, n, &r.profile_b, rb));
      if (decode && probe_ != nullptr) rep_dram_gbs_.push_back(probe_->measure());
    }
    results_.push_back(r);
  }

  const std::vector<BenchResult>& results() const { return results_; }
  // DRAM read GB/s measured right after each decode repetition.
  const std::vector<double>& rep_dram_gbs() const { return rep_dram_gbs_; }

 private:
  // One repetition of a test on m: tokens/s, its profile added to *profile; with `rounds`, a
  // decode's paired rounds appended there; `traced`: the result the decode's timeline goes to.
  double rep(SingleSequence& m, bool decode, int n, Model::Profile* profile,
             std::vector<double>* rounds, BenchResult* traced = nullptr) {
    rewind(m);
    const Model::Profile p0 = m.model().profile();
    const int64_t replayed0 = m.model().graph_stats().replayed;
    rt::Timeline* timeline = engine_.moe().timeline();
    // (--timeline: the first configuration's timed decode tokens)
    const bool recorded = !a_.timeline.empty() && decode && traced != nullptr;
    traced = decode && timeline != nullptr ? traced : nullptr;
    if (traced != nullptr) timeline->take();  // (forget what came before)
    const double seconds = decode ? decode_tokens(m, n, rounds, recorded) : prefill(m);
    add_profile(profile, p0, m.model().profile());
    if (traced != nullptr) {
      traced->graph_steps += m.model().graph_stats().replayed - replayed0;
      const rt::Timeline::Summary t = timeline->take();
      traced->decode_s += seconds;
      traced->timeline.device_busy_s += t.device_busy_s;
      traced->timeline.cpu_busy_s += t.cpu_busy_s;
      traced->timeline.overlap_s += t.overlap_s;
      traced->timeline.h2d_bytes += t.h2d_bytes;
      traced->timeline.d2h_bytes += t.d2h_bytes;
    }
    return n / seconds;
  }

  // Back to the -d context. (A recurrent state rewinds to its checkpoint one token before the
  // depth: that token again.)
  void rewind(SingleSequence& m) {
    const int64_t kept = m.truncate(a_.depth);
    if (kept < a_.depth) {
      m.forward(std::span<const int32_t>(ctx_tokens_.data() + kept,
                                         static_cast<size_t>(a_.depth - kept)),
                logits_.data(), false);
    }
  }

  double prefill(SingleSequence& m) {
    const double t0 = now_s();
    m.forward(prompt_, logits_.data(), false);
    return now_s() - t0;
  }

  // n tokens one at a time; with `rounds`, in paired rounds (each followed by a DRAM pass).
  double decode_tokens(SingleSequence& m, int n, std::vector<double>* rounds, bool recorded) {
    const int64_t vocab = engine_.weights().config.vocab_size;
    const int per = rounds != nullptr ? round_tokens(n) : n;
    double seconds = 0;
    for (int j0 = 0; j0 < n; j0 += per) {
      const int j1 = std::min(n, j0 + per);
      trace::set_recording(recorded);
      const double t0 = now_s();
      for (int j = j0; j < j1; ++j) {
        const int32_t t =
            prompt_.empty() ? j % static_cast<int32_t>(vocab) : prompt_[j % prompt_.size()];
        m.forward(std::span<const int32_t>(&t, 1), logits_.data(), false);
      }
      const double s = now_s() - t0;
      trace::set_recording(false);
      seconds += s;
      if (rounds != nullptr) {
        const double gbs = probe_->measure_once(0.04);
        rounds->push_back((j1 - j0) * static_cast<double>(step_bytes_) / s / (gbs * 1e9));
      }
    }
    return seconds;
  }

  static void add_profile(Model::Profile* to, const Model::Profile& b, const Model::Profile& e) {
    to->attention += e.attention - b.attention;
    to->ffn += e.ffn - b.ffn;
    to->moe_wait += e.moe_wait - b.moe_wait;
    to->lm_head += e.lm_head - b.lm_head;
  }

  const BenchArgs& a_;
  Engine& engine_;
  cpu::DramReadProbe* probe_;
  uint64_t step_bytes_;  // a decode step's bytes (the paired rounds' fractions)
  SingleSequence model_;
  std::unique_ptr<Model> net_b_;
  std::unique_ptr<SingleSequence> model_b_;
  std::vector<int32_t> prompt_, ctx_tokens_;
  std::vector<float> logits_;
  std::vector<BenchResult> results_;
  std::vector<double> rep_dram_gbs_;
};

nlohmann::json time_split(const Model::Profile& p) {
  const double total = std::max(p.attention + p.ffn + p.lm_head, 1e-12);
  return nlohmann::json{{"attention", p.attention / total},
                        {"ffn", p.ffn / total},
                        {"moe_wait", p.moe_wait / total},
                        {"lm_head", p.lm_head / total}};
}

// A test's JSON: tokens/s, the time split, the --vs pairs, the accelerator's timeline (and its
// line for the table, appended to *timeline_lines), decode against the DRAM bound.
nlohmann::json test_json(const BenchResult& r, const BenchArgs& a, const StepBytes& split,
                         double dram_gbs, const std::vector<double>& rep_dram_gbs,
                         std::vector<std::string>* timeline_lines) {
  const uint64_t step_bytes = split.total();
  const double bound_tps = dram_gbs > 0 ? dram_gbs * 1e9 / static_cast<double>(step_bytes) : 0;
  const Stat s = stat(r.tps);
  nlohmann::json t;
  t["test"] = r.test;
  t["n_tokens"] = r.n;
  t["reps"] = a.reps;
  t["tokens_per_s"] = r.tps;
  t["avg_tokens_per_s"] = s.mean;
  t["stddev_tokens_per_s"] = s.stddev;
  t["time_split"] = time_split(r.profile);
  if (!a.vs.empty()) {
    // Repetition i of both ran back to back: ratio_per_pair[i] = B / A.
    std::vector<double> ratio;
    for (size_t i = 0; i < r.tps.size(); ++i) ratio.push_back(r.tps_b[i] / r.tps[i]);
    const Stat sb = stat(r.tps_b);
    t["vs"] = {{"tokens_per_s", r.tps_b},
               {"avg_tokens_per_s", sb.mean},
               {"stddev_tokens_per_s", sb.stddev},
               {"time_split", time_split(r.profile_b)},
               {"ratio_per_pair", ratio},
               {"ratio_median", median(ratio)}};
  }
  if (r.decode_s > 0) {
    // The accelerator's decode timeline: each side's busy time and their overlap as fractions
    // of the decode's time, the link's bytes per token.
    const double tokens = static_cast<double>(r.n) * static_cast<double>(r.tps.size());
    const rt::Timeline::Summary& tl = r.timeline;
    t["timeline"] = {{"device_busy", tl.device_busy_s / r.decode_s},
                     {"cpu_experts_busy", tl.cpu_busy_s / r.decode_s},
                     {"overlap", tl.overlap_s / r.decode_s},
                     {"h2d_bytes_per_token", static_cast<double>(tl.h2d_bytes) / tokens},
                     {"d2h_bytes_per_token", static_cast<double>(tl.d2h_bytes) / tokens},
                     {"steps_from_graphs", static_cast<double>(r.graph_steps) / tokens}};
    timeline_lines->push_back(r.test + ": " + rt::Timeline::format(tl, r.decode_s, tokens) +
                              fmt::format("; {:.0f}% of the steps replayed from graphs",
                                          100.0 * static_cast<double>(r.graph_steps) / tokens));
  }
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
                             {"ffn", rate(split.ffn + split.experts, r.profile.ffn)},
                             {"lm_head", rate(split.lm_head, r.profile.lm_head)}};
    if (!rep_dram_gbs.empty()) t["dram_read_gbs_after_each"] = rep_dram_gbs;
    if (!r.rounds.empty()) {
      t["paired_rounds"] = {{"tokens_per_round", r.round_tokens},
                            {"fraction_of_bound", r.rounds},
                            {"median", median(r.rounds)}};
    }
  }
  return t;
}

// The report as a table: tokens/s and the time split per test, the --vs ratios, the timelines,
// the decode bound and each decode's fraction of it.
void print_report(const nlohmann::json& j, const BenchArgs& a, const StepBytes& split,
                  const std::vector<std::string>& timeline_lines) {
  const bool vs = j.contains("vs");
  print_header(j);
  // The test column fits its longest name ("tg128 @ d4096 vs").
  size_t w = 8;
  for (const auto& t : j["tests"]) {
    w = std::max(w, t["test"].get<std::string>().size() + (vs ? 3 : 0));
  }
  fmt::print("| {:>{}} | {:>18} | {:>9} | {:>6} | {:>8} | {:>7} |\n", "test", w, "t/s",
             "attention", "ffn", "moe_wait", "lm_head");
  fmt::print("| {:->{}} | {:->18} | {:->9} | {:->6} | {:->8} | {:->7} |\n", "", w, "", "", "", "",
             "");
  auto row = [w](const std::string& name, const nlohmann::json& t) {
    const auto& sp = t["time_split"];
    fmt::print("| {:>{}} | {:>9.2f} ± {:<6.2f} | {:>8.0f}% | {:>5.0f}% | {:>7.0f}% | {:>6.0f}% |\n",
               name, w, t["avg_tokens_per_s"].get<double>(), t["stddev_tokens_per_s"].get<double>(),
               100 * sp["attention"].get<double>(), 100 * sp["ffn"].get<double>(),
               100 * sp["moe_wait"].get<double>(), 100 * sp["lm_head"].get<double>());
  };
  for (const auto& t : j["tests"]) {
    row(t["test"].get<std::string>(), t);
    if (t.contains("vs")) row(t["test"].get<std::string>() + " vs", t["vs"]);
  }
  if (vs) {
    fmt::print("vs: {} ({})\n", a.vs, j["vs"]["backend"].get<std::string>());
    for (const auto& t : j["tests"]) {
      const auto ratio = t["vs"]["ratio_per_pair"].get<std::vector<double>>();
      fmt::print("{} vs / first: median {:.3f} of {} back-to-back pairs ({:.3f})\n",
                 t["test"].get<std::string>(), t["vs"]["ratio_median"].get<double>(),
                 ratio.size(), fmt::join(ratio, " / "));
    }
  }
  for (const std::string& line : timeline_lines) fmt::print("{}\n", line);
  const std::string kv =
      a.depth > 0 ? fmt::format(" ({:.2f} GB of it the KV cache)", split.kv_cache / 1e9) : "";
  fmt::print("decode bound: {:.2f} GB per token{} at {:.1f} GB/s DRAM read = {:.1f} tokens/s\n",
             split.total() / 1e9, kv, j["dram_read_gbs"].get<double>(),
             j["decode_bound_tokens_per_s"].get<double>());
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
    if (t.contains("paired_rounds")) {
      const auto& pr = t["paired_rounds"];
      const int per = pr["tokens_per_round"].get<int>();
      fmt::print("{}: {:.0f}% of the decode bound, the median of {} paired rounds ({} token{}, "
                 "then one DRAM pass: each round against the bandwidth read right after it)\n",
                 t["test"].get<std::string>(), 100 * pr["median"].get<double>(),
                 pr["fraction_of_bound"].size(), per, per == 1 ? "" : "s");
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

// The batched test (--batch): its own runner (tools/bench_batch.h), reported here.
void run_batched(const BenchArgs& a, Engine& engine, ExpertUnionBytes& experts,
                 cpu::DramReadProbe* probe, double dram_gbs) {
  BatchBenchArgs ba;
  ba.batches = a.batch;
  ba.n_prompt = a.n_prompt;
  ba.n_gen = a.n_gen;
  ba.reps = a.reps;
  ba.batch_tokens = a.batch_tokens;
  ba.kv_type = parse_kv_type(a.cache_type);
  const nlohmann::json results = run_batch_bench(engine, experts, ba, probe, dram_gbs);
  nlohmann::json j = report_header(a, engine);
  if (a.json) {
    j["cache_type"] = a.cache_type;
    j["batched"] = results;
    fmt::print("{}\n", j.dump(2));
  } else {
    print_header(j);
    print_batch_table(results);
  }
}

void run_bench(const BenchArgs& a) {
  check_bench_args(a);
  TimelineFile timeline_file(a.timeline, /*paused=*/true);
  const std::optional<VsConfig> vs =
      a.vs.empty() ? std::nullopt : std::optional<VsConfig>(parse_vs(a));
  const BackendOptions backend = resolve_backend_options(a.backend, a.model);
  ExpertUnionBytes* experts = nullptr;  // (the batched test's observer, made after the load)
  EngineOptions eo;
  eo.model = a.model;
  eo.threads = a.threads;
  eo.backend = backend;
  eo.mla = parse_mla_mode(a.mla);
  eo.load = shared_load_mode(a, backend, vs ? &*vs : nullptr);
  if (!a.batch.empty()) {
    eo.on_routing = [&experts](const RoutingEvent& ev) { experts->on_routing(ev); };
  }
  Engine engine(eo);
  const LoadedModel& lm = engine.weights();
  auto experts_owned = std::make_unique<ExpertUnionBytes>(lm);
  experts = experts_owned.get();
  std::unique_ptr<MoeRuntime> moe_b;
  if (vs) {
    try {
      moe_b = std::make_unique<MoeRuntime>(lm, vs->backend, engine.threading());
    } catch (const Error& e) {
      fail(e.kind(), "--vs '{}': {}", a.vs, e.what());
    }
  }
  // DRAM read bandwidth: from --roofline FILE, or measured now and again right after each decode
  // repetition (the bandwidth this machine gets can change within minutes).
  double dram_gbs = 0;
  std::unique_ptr<cpu::DramReadProbe> probe;
  if (!a.roofline.empty()) {
    dram_gbs =
        cpu::roofline_from_json(read_input_file(a.roofline, kMaxConfigFileBytes, "--roofline"))
            .dram_read_gbs;
  } else {
    cpu::RooflineOptions ro;
    ro.dram_bytes = size_t{512} << 20;
    ro.seconds = 0.1;
    ro.repetitions = 2;
    probe = std::make_unique<cpu::DramReadProbe>(engine.threading(), ro);
    dram_gbs = probe->measure();
  }
  if (!a.batch.empty()) {
    run_batched(a, engine, *experts, probe.get(), dram_gbs);
    return;
  }
  StepBytes split = decode_bytes(lm);
  // A decode step also reads the KV cache of the positions it attends to: at the test's middle
  // step, depth + (n + 1) / 2 positions (kv_read_bytes).
  SequenceBench bench(a, engine, moe_b.get(), vs ? &*vs : nullptr, probe.get(), 0);
  if (a.n_gen > 0) {
    split.kv_cache = static_cast<uint64_t>(kv_read_bytes(
        engine.config(), bench.model().cache(), a.depth + (a.n_gen + 1) / 2.0));
  }
  bench.set_step_bytes(split.total());
  bench.prepare();
  const std::string at = a.depth > 0 ? fmt::format(" @ d{}", a.depth) : std::string();
  if (a.n_prompt > 0) bench.run_test(fmt::format("pp{}{}", a.n_prompt, at), false, a.n_prompt);
  if (a.n_gen > 0) bench.run_test(fmt::format("tg{}{}", a.n_gen, at), true, a.n_gen);

  const uint64_t step_bytes = split.total();
  nlohmann::json j = report_header(a, engine);
  j["dram_read_gbs"] = dram_gbs;
  j["decode_bytes_per_token"] = step_bytes;
  j["decode_bound_tokens_per_s"] =
      dram_gbs > 0 ? dram_gbs * 1e9 / static_cast<double>(step_bytes) : 0.0;
  j["decode_bytes_split"] = {{"attention", split.attention},
                             {"ffn", split.ffn + split.experts},
                             {"lm_head", split.lm_head},
                             {"kv_cache", split.kv_cache}};
  j["depth"] = a.depth;
  j["cache_type"] = a.cache_type;
  if (vs) j["vs"] = {{"flags", a.vs}, {"backend", moe_b->summary()}};
  std::vector<std::string> timeline_lines;  // with an accelerator, per decode test
  for (const BenchResult& r : bench.results()) {
    j["tests"].push_back(test_json(r, a, split, dram_gbs, bench.rep_dram_gbs(), &timeline_lines));
  }
  timeline_file.finish();
  if (a.json) {
    fmt::print("{}\n", j.dump(2));
    return;
  }
  print_report(j, a, split, timeline_lines);
}

void add_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  app.add_option("-m,--model", args->model, "a .gguf file or an HF checkpoint directory")
      ->required();
  app.add_option("-p,--n-prompt", args->n_prompt, "prompt tokens prefilled as one batch (0: skip)")
      ->capture_default_str();
  app.add_option("-n,--n-gen", args->n_gen, "tokens decoded one at a time (0: skip)")
      ->capture_default_str();
  app.add_option("-d,--n-depth", args->depth,
                 "tokens already in the context when each test starts (prefilled once, untimed)")
      ->capture_default_str();
  app.add_option("-r,--repetitions", args->reps, "repetitions of each test")->capture_default_str();
  add_threads_option(app, &args->threads);
  app.add_flag("--json", args->json, "print JSON instead of the table");
  add_timeline_option(app, &args->timeline, "the timed decode tokens' timeline");
  app.add_option("--roofline", args->roofline,
                 "`tandem roofline --json` output to take DRAM bandwidth from (default: measure)");
  add_backend_options(app, &args->backend);
  add_mla_option(app, &args->mla);
  add_cache_type_option(app, &args->cache_type);
  app.add_option("--batch", args->batch,
                 "llama-batched-bench's test: N sequences (a list: 1,2,4,8) of -p prompt tokens "
                 "each, then -n decode steps of N tokens; aggregate and per-sequence tokens/s "
                 "and the decode bound of the bytes the steps read")
      ->delimiter(',');
  app.add_option("-b,--batch-tokens", args->batch_tokens,
                 "--batch: tokens per forward while the prompts are prefilled")
      ->capture_default_str();
  app.add_option("--vs", args->vs,
                 "backend flags (and --mla, --cache-type) of a second configuration (e.g. "
                 "\"--cpu-experts repack\"), run alternately with the first on the same loaded "
                 "model: per-pair tokens/s ratios");
  app.callback([args] { run_bench(*args); });
}

Registrar reg("bench", "prefill (pp) and decode (tg) tokens/s, like llama-bench", add_bench);

}  // namespace
}  // namespace tandem::tools
