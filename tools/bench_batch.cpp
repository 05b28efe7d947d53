#include "tools/bench_batch.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "core/error.h"
#include "engine/generator.h"

namespace tandem::tools {

nlohmann::json run_batch_bench(Engine& engine, ExpertUnionBytes& experts,
                               const BatchBenchArgs& a, cpu::DramReadProbe* probe,
                               double dram_gbs) {
  const ModelConfig& c = engine.config();
  const StepBytes split = decode_bytes(engine.weights());
  nlohmann::json out = nlohmann::json::array();
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));
  for (const int n : a.batches) {
    KvCache cache = engine.make_cache(a.n_prompt + a.n_gen + 2, a.kv_type, n);
    nlohmann::json r;
    std::vector<double> pp_tps, agg_tps, fraction, bound_tps, dram;
    double step_bytes_sum = 0;
    int64_t decode_steps_sum = 0;
    for (int rep = 0; rep < a.reps; ++rep) {
      GeneratorOptions go;
      go.max_batch_tokens = std::max<int64_t>(a.batch_tokens, 1);
      go.reuse_prefix = false;
      Generator gen(engine.model(), cache, nullptr, go);
      GenerateParams p;
      p.max_tokens = a.n_gen + 1;  // the first from the prompt's logits, then n_gen decode steps
      p.ignore_eos = true;
      for (int i = 0; i < n; ++i) {
        std::vector<int32_t> prompt(static_cast<size_t>(std::max(a.n_prompt, 1)));
        for (int32_t& t : prompt) t = tok(rng);
        gen.submit(std::move(prompt), p);
      }
      // Prefill: until every sequence has its first token.
      const double t0 = now_s();
      int firsts = 0;
      std::vector<char> first(static_cast<size_t>(n), 0);
      while (firsts < n && !gen.idle()) {
        for (const GenerateEvent& ev : gen.step()) {
          if (ev.finish == FinishReason::kError) fail(ErrorKind::kResource, "{}", ev.error);
          if (ev.token >= 0 && ev.id >= 0 && ev.id < n && !first[static_cast<size_t>(ev.id)]) {
            first[static_cast<size_t>(ev.id)] = 1;
            ++firsts;
          }
        }
      }
      const double t_pp = now_s() - t0;
      // Decode: every step's tokens, the experts they read, the cache positions they attend to.
      experts.bytes = 0;
      experts.counting = true;
      int64_t tokens = 0, steps = 0;
      double kv_bytes = 0;
      const double t1 = now_s();
      while (!gen.idle()) {
        const int64_t before = cache.positions_used();  // (every sequence still live)
        for (const GenerateEvent& ev : gen.step()) {
          if (ev.finish == FinishReason::kError) fail(ErrorKind::kResource, "{}", ev.error);
        }
        tokens += gen.last_batch_tokens();
        // (Every sequence as long as the others: the batch's prompts and steps are alike.)
        const double seqs = static_cast<double>(gen.last_batch_tokens());
        kv_bytes += seqs * kv_read_bytes(c, cache, static_cast<double>(before) / seqs + 1) +
                    seqs * static_cast<double>(split.state);  // (each sequence's state)
        ++steps;
      }
      const double t_tg = now_s() - t1;
      experts.counting = false;
      const double bytes = static_cast<double>(split.dense()) * static_cast<double>(steps) +
                           static_cast<double>(experts.bytes) + kv_bytes;
      const double gbs = probe != nullptr ? probe->measure() : dram_gbs;
      pp_tps.push_back(static_cast<double>(n) * a.n_prompt / std::max(t_pp, 1e-9));
      agg_tps.push_back(static_cast<double>(tokens) / std::max(t_tg, 1e-9));
      dram.push_back(gbs);
      if (gbs > 0 && bytes > 0) {
        fraction.push_back(bytes / std::max(t_tg, 1e-9) / (gbs * 1e9));
        bound_tps.push_back(static_cast<double>(tokens) / (bytes / (gbs * 1e9)));
      }
      step_bytes_sum += bytes;
      decode_steps_sum += steps;
    }
    r["n_sequences"] = n;
    r["n_prompt"] = a.n_prompt;
    r["n_gen"] = a.n_gen;
    r["reps"] = a.reps;
    r["prefill_tokens_per_s"] = pp_tps;
    r["avg_prefill_tokens_per_s"] = stat(pp_tps).mean;
    r["aggregate_decode_tokens_per_s"] = agg_tps;
    r["avg_aggregate_decode_tokens_per_s"] = stat(agg_tps).mean;
    r["stddev_aggregate_decode_tokens_per_s"] = stat(agg_tps).stddev;
    r["per_sequence_decode_tokens_per_s"] = stat(agg_tps).mean / n;
    r["decode_bytes_per_step"] = step_bytes_sum / std::max<int64_t>(decode_steps_sum, 1);
    r["dram_read_gbs_after_each"] = dram;
    if (!fraction.empty()) {
      r["decode_bound_aggregate_tokens_per_s"] = stat(bound_tps).mean;
      r["fraction_of_bound"] = fraction;
      r["avg_fraction_of_bound"] = stat(fraction).mean;
    }
    out.push_back(r);
  }
  return out;
}

void print_batch_table(const nlohmann::json& results) {
  fmt::print("| {:>4} | {:>5} | {:>5} | {:>9} | {:>14} | {:>9} | {:>11} | {:>10} | {:>6} |\n",
             "N", "PP", "TG", "S_PP t/s", "S_TG aggregate", "per seq", "bytes/step",
             "bound t/s", "bound");
  fmt::print("| {:->4} | {:->5} | {:->5} | {:->9} | {:->14} | {:->9} | {:->11} | {:->10} | {:->6} |\n",
             "", "", "", "", "", "", "", "", "");
  for (const auto& r : results) {
    const bool bound = r.contains("avg_fraction_of_bound");
    fmt::print("| {:>4} | {:>5} | {:>5} | {:>9.1f} | {:>14.2f} | {:>9.2f} | {:>8.2f} GB | {:>10} | "
               "{:>6} |\n",
               r["n_sequences"].get<int>(), r["n_prompt"].get<int>(), r["n_gen"].get<int>(),
               r["avg_prefill_tokens_per_s"].get<double>(),
               r["avg_aggregate_decode_tokens_per_s"].get<double>(),
               r["per_sequence_decode_tokens_per_s"].get<double>(),
               r["decode_bytes_per_step"].get<double>() / 1e9,
               bound ? fmt::format("{:.2f}", r["decode_bound_aggregate_tokens_per_s"].get<double>())
                     : "-",
               bound ? fmt::format("{:.0f}%", 100 * r["avg_fraction_of_bound"].get<double>())
                     : "-");
  }
}

}  // namespace tandem::tools
