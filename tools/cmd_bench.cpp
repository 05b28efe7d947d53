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

void run_bench(const BenchArgs& a) {
  if (a.n_prompt < 0 || a.n_gen < 0 || a.reps < 1 || a.depth < 0) {
    fail(ErrorKind::kInvalidArgument,
         "-p, -n and -d must be >= 0 and -r >= 1 (got {}, {}, {}, {})", a.n_prompt, a.n_gen,
         a.depth, a.reps);
  }
  // --vs FLAGS: a second backend configuration (these flags over the first's), its own MoeRuntime
  // and Model on the same loaded weights, each repetition run on both in alternating order (A B,
  // B A, ...): the paired ratios compare the two in the same minutes.
  const bool vs = !a.vs.empty();
  TimelineFile timeline_file(a.timeline, /*paused=*/true);
  if (vs && !a.batch.empty()) {
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
  BackendOptions backend_b = a.backend;
  const MlaMode mla = parse_mla_mode(a.mla);
  const KvType kv_type = parse_kv_type(a.cache_type);
  std::string mla_b = a.mla, cache_type_b = a.cache_type;
  if (vs) {
    CLI::App flags("--vs");
    add_backend_options(flags, &backend_b);
    add_mla_option(flags, &mla_b);
    add_cache_type_option(flags, &cache_type_b);
    try {
      flags.parse(a.vs, false);
    } catch (const CLI::ParseError& e) {
      fail(ErrorKind::kInvalidArgument, "--vs '{}': {}", a.vs, e.what());
    }
    try {
      parse_mla_mode(mla_b);
      parse_kv_type(cache_type_b);
      backend_b = resolve_backend_options(backend_b, a.model);
    } catch (const Error& e) {
      fail(e.kind(), "--vs '{}': {}", a.vs, e.what());
    }
  }
  const BackendOptions backend = resolve_backend_options(a.backend, a.model);
  // One load for both: into huge-page memory when either side would read it there, unless the
  // other side also copies its experts into memory of its own (repack / int8 / ...) and the two
  // would not fit: about twice the model's bytes. Then mapped, said in a warning.
  LoadMode mode = load_mode(backend) == LoadMode::kCopy ||
                          (vs && load_mode(backend_b) == LoadMode::kCopy)
                      ? LoadMode::kCopy
                      : LoadMode::kMap;
  if (vs && mode == LoadMode::kCopy && load_mode(backend) != load_mode(backend_b)) {
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
  ExpertUnionBytes* experts = nullptr;  // (the batched test's observer, made after the load)
  std::unique_ptr<ExpertUnionBytes> experts_owned;
  EngineOptions eo;
  eo.model = a.model;
  eo.threads = a.threads;
  eo.backend = backend;
  eo.mla = mla;
  eo.load = mode;
  if (!a.batch.empty()) {
    eo.on_routing = [&experts](const RoutingEvent& ev) { experts->on_routing(ev); };
  }
  Engine engine(eo);
  const LoadedModel& lm = engine.weights();
  ThreadingContext& threading = engine.threading();
  MoeRuntime& moe = engine.moe();
  experts_owned = std::make_unique<ExpertUnionBytes>(lm);
  experts = experts_owned.get();
  std::unique_ptr<MoeRuntime> moe_b;
  if (vs) {
    try {
      moe_b = std::make_unique<MoeRuntime>(lm, backend_b, threading);
    } catch (const Error& e) {
      fail(e.kind(), "--vs '{}': {}", a.vs, e.what());
    }
  }
  const ModelConfig& c = lm.config;

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
    probe = std::make_unique<cpu::DramReadProbe>(threading, ro);
    dram_gbs = probe->measure();
  }
  StepBytes split = decode_bytes(lm);
  if (!a.batch.empty()) {
    BatchBenchArgs ba;
    ba.batches = a.batch;
    ba.n_prompt = a.n_prompt;
    ba.n_gen = a.n_gen;
    ba.reps = a.reps;
    ba.batch_tokens = a.batch_tokens;
    ba.kv_type = kv_type;
    const nlohmann::json results = run_batch_bench(engine, *experts, ba, probe.get(), dram_gbs);
    if (a.json) {
      nlohmann::json j;
      j["model"] = a.model;
      j["model_summary"] = model_summary(lm);
      j["backend"] = moe.summary();
      j["threads"] = threading.n_threads();
      j["isa"] = isa_name(best_isa());
      j["cache_type"] = a.cache_type;
      j["batched"] = results;
      fmt::print("{}\n", j.dump(2));
    } else {
      fmt::print("model: {}\nbackend: {}\nthreads: {}, kernel ISA {}\n", model_summary(lm),
                 moe.summary(), threading.n_threads(), isa_name(best_isa()));
      print_batch_table(results);
    }
    return;
  }
  const int64_t ctx = std::max<int64_t>(1, int64_t{a.depth} + a.n_prompt + a.n_gen + 8);
  Model& net = engine.model();
  SingleSequence model(net, ctx, kv_type);
  // A decode step also reads the KV cache of every position it attends to: mean over the test's
  // steps, (depth + (n + 1) / 2) positions of the cache's bytes per position.
  if (a.n_gen > 0) {
    const double per_position =
        static_cast<double>(model.cache().position_bytes() * model.cache().layout().layers);
    split.kv_cache =
        static_cast<uint64_t>(per_position * (a.depth + (a.n_gen + 1) / 2.0));
  }
  const uint64_t step_bytes = split.total();
  const double bound_tps = dram_gbs > 0 ? dram_gbs * 1e9 / static_cast<double>(step_bytes) : 0;
  std::unique_ptr<Model> net_b;
  std::unique_ptr<SingleSequence> model_b;
  if (vs) {
    ModelOptions mo_b;
    mo_b.pool = &threading.pool();
    mo_b.mla = parse_mla_mode(mla_b);
    moe_b->apply(&mo_b);
    net_b = std::make_unique<Model>(lm, mo_b);
    model_b = std::make_unique<SingleSequence>(*net_b, ctx, parse_kv_type(cache_type_b));
  }
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));
  std::vector<int32_t> prompt(static_cast<size_t>(a.n_prompt));
  for (int32_t& t : prompt) t = tok(rng);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));

  // Warm-up, as llama-bench does: one prefill of the test's size (the scratch buffers grow to it:
  // first-touch page faults were ~9% of a cold pp512) and one decode step, outside the timing.
  const int32_t warm[4] = {1, 2, 3, 4};
  for (SingleSequence* m : {&model, model_b.get()}) {
    if (m == nullptr) continue;
    if (a.n_prompt > 0) {
      m->forward(prompt, logits.data(), false);
    } else {
      m->forward(std::span<const int32_t>(warm, 4), logits.data(), false);
    }
    m->forward(std::span<const int32_t>(warm, 1), logits.data(), false);
    m->reset();
  }
  // -d: the context every test starts from, prefilled once (in batches of up to 512 tokens, as
  // a chat would); the tests only write the positions after it, so rewinding to it restores it.
  std::vector<int32_t> ctx_tokens(static_cast<size_t>(a.depth));
  if (a.depth > 0) {
    for (int32_t& t : ctx_tokens) t = tok(rng);
    for (SingleSequence* m : {&model, model_b.get()}) {
      if (m == nullptr) continue;
      for (size_t b = 0; b < ctx_tokens.size(); b += 512) {
        const size_t e = std::min(ctx_tokens.size(), b + 512);
        // (A checkpoint at the end: a recurrent state rewinds to it.)
        m->forward(std::span<const int32_t>(ctx_tokens.data() + b, e - b), logits.data(), false,
                   e == ctx_tokens.size());
      }
    }
  }

  struct Result {
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
  std::vector<Result> results;
  std::vector<double> rep_dram_gbs;  // measured right after each decode repetition
  auto add = [](Model::Profile* to, const Model::Profile& b, const Model::Profile& e) {
    to->attention += e.attention - b.attention;
    to->ffn += e.ffn - b.ffn;
    to->moe_wait += e.moe_wait - b.moe_wait;
    to->lm_head += e.lm_head - b.lm_head;
  };
  // Paired rounds: a decode repetition (of both configurations under --vs) runs in rounds of
  // `round_tokens` tokens, each followed by one short DRAM pass (the fastest read kernel, ~40 ms,
  // not timed with the decode); a round's fraction of the bound is its bytes per second over that
  // pass's. Their median compares decode with the bandwidth of the same minute, as the layer
  // benchmarks' of_dram do (the figure after each repetition is the best of ten longer passes: the
  // bandwidth's peaks, where a repetition averages over its swings).
  auto round_tokens = [](int n) { return std::clamp(n / 16, 1, 8); };
  // One repetition of a test on m: tokens/s, its profile added to *profile; with `rounds`, a
  // decode's paired rounds appended there.
  rt::Timeline* timeline = moe.timeline();
  auto rep = [&](SingleSequence& m, bool decode, int n, Model::Profile* profile,
                 std::vector<double>* rounds, Result* traced = nullptr) {
    // (A recurrent state rewinds to its checkpoint one token before the depth: that token again.)
    const int64_t kept = m.truncate(a.depth);
    if (kept < a.depth) {
      m.forward(std::span<const int32_t>(ctx_tokens.data() + kept,
                                         static_cast<size_t>(a.depth - kept)),
                logits.data(), false);
    }
    const Model::Profile p0 = m.model().profile();
    const int64_t replayed0 = m.model().graph_stats().replayed;
    // (--timeline: the first configuration's timed decode tokens)
    const bool recorded = !a.timeline.empty() && decode && traced != nullptr;
    traced = decode && timeline != nullptr ? traced : nullptr;
    if (traced != nullptr) timeline->take();  // (forget what came before)
    double seconds = 0;
    if (!decode) {
      const double t0 = now_s();
      m.forward(prompt, logits.data(), false);
      seconds = now_s() - t0;
    } else {
      const int per = rounds != nullptr ? round_tokens(n) : n;
      for (int j0 = 0; j0 < n; j0 += per) {
        const int j1 = std::min(n, j0 + per);
        trace::set_recording(recorded);
        const double t0 = now_s();
        for (int j = j0; j < j1; ++j) {
          const int32_t t = prompt.empty() ? j % static_cast<int32_t>(c.vocab_size)
                                           : prompt[j % prompt.size()];
          m.forward(std::span<const int32_t>(&t, 1), logits.data(), false);
        }
        const double s = now_s() - t0;
        trace::set_recording(false);
        seconds += s;
        if (rounds != nullptr) {
          const double gbs = probe->measure_once(0.04);
          rounds->push_back((j1 - j0) * static_cast<double>(step_bytes) / s / (gbs * 1e9));
        }
      }
    }
    add(profile, p0, m.model().profile());
    if (traced != nullptr) traced->graph_steps += m.model().graph_stats().replayed - replayed0;
    if (traced != nullptr) {
      const rt::Timeline::Summary t = timeline->take();
      traced->decode_s += seconds;
      traced->timeline.device_busy_s += t.device_busy_s;
      traced->timeline.cpu_busy_s += t.cpu_busy_s;
      traced->timeline.overlap_s += t.overlap_s;
      traced->timeline.h2d_bytes += t.h2d_bytes;
      traced->timeline.d2h_bytes += t.d2h_bytes;
    }
    return n / seconds;
  };
  auto run_test = [&](const std::string& name, bool decode, int n) {
    Result r{name, n, {}, {}, {}, {}, {}, 0, {}, 0, 0};
    std::vector<double>* rounds = decode && probe ? &r.rounds : nullptr;
    if (rounds != nullptr) r.round_tokens = round_tokens(n);
    // The --vs configuration's decode runs in the same rounds (their passes between its tokens
    // too, so both sides of a pair see the same interruptions); its fractions are not reported.
    std::vector<double> rounds_b;
    std::vector<double>* rb = rounds != nullptr ? &rounds_b : nullptr;
    for (int i = 0; i < a.reps; ++i) {
      if (vs && i % 2 == 1) r.tps_b.push_back(rep(*model_b, decode, n, &r.profile_b, rb));
      r.tps.push_back(rep(model, decode, n, &r.profile, rounds, &r));
      if (vs && i % 2 == 0) r.tps_b.push_back(rep(*model_b, decode, n, &r.profile_b, rb));
      if (decode && probe) rep_dram_gbs.push_back(probe->measure());
    }
    results.push_back(r);
  };
  const std::string at = a.depth > 0 ? fmt::format(" @ d{}", a.depth) : std::string();
  if (a.n_prompt > 0) run_test(fmt::format("pp{}{}", a.n_prompt, at), false, a.n_prompt);
  if (a.n_gen > 0) run_test(fmt::format("tg{}{}", a.n_gen, at), true, a.n_gen);

  nlohmann::json j;
  j["model"] = a.model;
  j["model_summary"] = model_summary(lm);
  j["backend"] = moe.summary();
  j["threads"] = threading.n_threads();
  j["isa"] = isa_name(best_isa());
  j["dram_read_gbs"] = dram_gbs;
  j["decode_bytes_per_token"] = step_bytes;
  j["decode_bound_tokens_per_s"] = bound_tps;
  j["decode_bytes_split"] = {{"attention", split.attention},
                             {"ffn", split.ffn + split.experts},
                             {"lm_head", split.lm_head},
                             {"kv_cache", split.kv_cache}};
  j["depth"] = a.depth;
  j["cache_type"] = a.cache_type;
  auto time_split = [](const Model::Profile& p) {
    const double total = std::max(p.attention + p.ffn + p.lm_head, 1e-12);
    return nlohmann::json{{"attention", p.attention / total},
                          {"ffn", p.ffn / total},
                          {"moe_wait", p.moe_wait / total},
                          {"lm_head", p.lm_head / total}};
  };
  if (vs) {
    j["vs"] = {{"flags", a.vs}, {"backend", moe_b->summary()}};
  }
  std::vector<std::string> timeline_lines;  // with an accelerator, per decode test
  for (const Result& r : results) {
    const Stat s = stat(r.tps);
    nlohmann::json t;
    t["test"] = r.test;
    t["n_tokens"] = r.n;
    t["reps"] = a.reps;
    t["tokens_per_s"] = r.tps;
    t["avg_tokens_per_s"] = s.mean;
    t["stddev_tokens_per_s"] = s.stddev;
    t["time_split"] = time_split(r.profile);
    if (vs) {
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
      timeline_lines.push_back(r.test + ": " + rt::Timeline::format(tl, r.decode_s, tokens) +
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
    j["tests"].push_back(t);
  }
  timeline_file.finish();
  if (a.json) {
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("model: {}\nbackend: {}\nthreads: {}, kernel ISA {}\n", model_summary(lm), moe.summary(),
             threading.n_threads(), isa_name(best_isa()));
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
    fmt::print("vs: {} ({})\n", a.vs, moe_b->summary());
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
             step_bytes / 1e9, kv, dram_gbs, bound_tps);
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
