// Command-line options shared by several subcommands.
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/topology.h"
#include "engine/engine.h"
#include "engine/sampling.h"
#include "model/model.h"
#include "runtime/moe_runtime.h"

namespace tandem::tools {

// A flag whose value is one of an enum's words (runtime/choices.h), parsed as it is read: a word
// not in the list is an error naming the flag before anything loads. The help lists the words.
template <class E>
CLI::Option* add_choice_option(CLI::App& app, E* value, const std::string& help) {
  return app
      .add_option_function<std::string>(
          rt::Choices<E>::kFlag, [value](const std::string& w) { *value = rt::parse_choice<E>(w); },
          help + ": " + rt::choice_words<E>())
      ->default_str(std::string(rt::choice_name(*value)));
}

// The same for a comma-separated list of words (`tandem sim --sweep-*`).
template <class E>
CLI::Option* add_choice_list_option(CLI::App& app, const std::string& name, std::vector<E>* values,
                                    const std::string& help) {
  return app
      .add_option_function<std::vector<std::string>>(
          name,
          [values](const std::vector<std::string>& words) {
            values->clear();
            for (const auto& w : words) values->push_back(rt::parse_choice<E>(w));
          },
          help + " (" + rt::choice_words<E>() + ")")
      ->delimiter(',');
}

// --threads: ThreadingOptions::n_threads, the threads that compute with the caller counted, as
// llama.cpp's -t (the pool gets one worker fewer). More than the hardware threads this process
// may use only makes threads preempt one another (and 10,000 of them exhaust memory): such a
// count is clamped, with a warning.
inline CLI::Option* add_threads_option(CLI::App& app, int* threads) {
  return app
      .add_option("--threads", *threads,
                  "threads that compute, the calling one included (default: one per "
                  "physical core)")
      ->transform(CLI::Validator(
          [](std::string& text) -> std::string {
            int64_t n = 0;
            if (!CLI::detail::lexical_cast(text, n) || n < 0) {
              return fmt::format("{} is not a thread count (0: one per physical core)", text);
            }
            const int cpus = allowed_cpu_count();
            if (n > cpus) {
              log_warn(
                  "--threads {}: more than the {} hardware threads this process may use; "
                  "using {}",
                  text, cpus, cpus);
              text = std::to_string(cpus);
            }
            return {};
          },
          ""));
}

// --mla: how DeepSeek (MLA) models attend (MlaMode); parse with parse_mla_mode.
inline CLI::Option* add_mla_option(CLI::App& app, std::string* mla) {
  return app.add_option("--mla", *mla,
                        "DeepSeek attention: auto (a latent KV cache; decode absorbed, batches of "
                        "32+ tokens expanded to per-head K / V) | absorbed (always) | naive (a "
                        "per-head K / V cache)")
      ->capture_default_str();
}

// --cache-type: the KV cache's element (KvType); parse with parse_kv_type.
inline CLI::Option* add_cache_type_option(CLI::App& app, std::string* type) {
  return app.add_option("--cache-type", *type,
                        "KV cache element: f32 (as computed) | bf16 (half the memory; "
                        "attention in BF16 on AVX-512 BF16 CPUs, faster long contexts) | f16 "
                        "(half the memory, 11 significant bits, F32 arithmetic) | q8_0 (int8 in "
                        "blocks of 32 with an F32 scale: 28% of the memory, F32 arithmetic)")
      ->capture_default_str();
}

// A number in [lo, hi] (CLI::Range's message prints DBL_MAX in full). main() refuses NaN,
// infinities and out-of-range integers in every numeric option before this runs.
inline CLI::Validator number_in(double lo, double hi = std::numeric_limits<double>::max()) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return {};  // CLI11's conversion error
        if (!std::isfinite(v)) return fmt::format("{} is not a finite number", text);
        if (v >= lo && v <= hi) return {};
        if (hi == std::numeric_limits<double>::max())
          return fmt::format("{} is below {}", text, lo);
        return fmt::format("{} is not in [{}, {}]", text, lo, hi);
      },
      "");
}

// --timeline FILE: the run's timeline as Chrome trace events (core/trace_events.h).
inline void add_timeline_option(CLI::App& app, std::string* path, const char* what) {
  app.add_option("--timeline", *path,
                 fmt::format("write {} as Chrome trace-event JSON (open it in ui.perfetto.dev "
                             "or chrome://tracing): a track per thread, spans per step, layer, "
                             "expert batch, device op and copy",
                             what));
}

// --checkpoints, --checkpoint-every: hybrid models' recurrent-state checkpoints
// (CheckpointOptions).
inline void add_checkpoint_options(CLI::App& app, CheckpointOptions* o) {
  app.add_option("--checkpoints", o->per_sequence,
                 "hybrid models (Qwen3.5, Qwen3-Next): recurrent-state checkpoints per sequence "
                 "the cache has room for (each a copy of the state; a prompt sharing a prefix "
                 "resumes from one; the least recently used goes first)")
      ->capture_default_str()
      ->check(number_in(0, 1024));
  app.add_option("--checkpoint-every", o->every,
                 "hybrid models: a checkpoint every N positions of a sequence, besides the end "
                 "of each prompt (0: only there)")
      ->capture_default_str()
      ->check(number_in(0));
}


// "ID+BIAS" / "ID-BIAS" (llama.cpp's --logit-bias; "-inf" bans the token). Error naming the flag
// otherwise.
inline std::pair<int32_t, float> parse_logit_bias(const std::string& item) {
  const size_t at = item.find_first_of("+-", 1);
  try {
    if (at != std::string::npos && at > 0) {
      size_t used = 0;
      const long long id = std::stoll(item.substr(0, at), &used);
      const std::string value = item.substr(at + 1);
      if (used == at && id >= 0 && id <= INT32_MAX) {
        const float sign = item[at] == '-' ? -1.0f : 1.0f;
        if (value == "inf") return {static_cast<int32_t>(id), sign * INFINITY};
        size_t vused = 0;
        const float v = std::stof(value, &vused);
        if (vused == value.size() && std::isfinite(v)) return {static_cast<int32_t>(id), sign * v};
      }
    }
  } catch (const std::exception&) {
  }
  fail(ErrorKind::kInvalidArgument, "--logit-bias: '{}' is not TOKEN_ID+BIAS or TOKEN_ID-BIAS",
       item);
}

inline void add_sampling_options(CLI::App& app, SamplingParams* p) {
  app.add_option("--temp", p->temperature, "temperature; 0 = greedy")
      ->check(number_in(0))
      ->capture_default_str();
  app.add_option("--top-k", p->top_k, "keep the k most likely tokens (0 = off)")
      ->check(number_in(0))
      ->capture_default_str();
  app.add_option("--top-p", p->top_p, "nucleus sampling mass (1 = off)")
      ->check(number_in(0, 1))
      ->capture_default_str();
  app.add_option("--min-p", p->min_p, "drop tokens below min-p * p_max (0 = off)")
      ->check(number_in(0, 1))
      ->capture_default_str();
  app.add_option("--seed", p->seed, "sampler seed")->capture_default_str();
  app.add_option("--repeat-penalty", p->repeat_penalty,
                 "divide a repeated token's positive logit by this (multiply a negative one; "
                 "1 = off)")
      ->check(number_in(1e-6))
      ->capture_default_str();
  app.add_option("--presence-penalty", p->presence_penalty,
                 "subtract this from a repeated token's logit (0 = off)")
      ->check(number_in(-2, 2))
      ->capture_default_str();
  app.add_option("--frequency-penalty", p->frequency_penalty,
                 "subtract this per earlier occurrence from a token's logit (0 = off)")
      ->check(number_in(-2, 2))
      ->capture_default_str();
  app.add_option("--repeat-last-n", p->penalty_last_n,
                 "the penalties look at the last N tokens (-1 = all, 0 = off)")
      ->check(number_in(-1))
      ->capture_default_str();
  app.add_option_function<std::vector<std::string>>(
         "--logit-bias",
         [p](const std::vector<std::string>& items) {
           for (const std::string& item : items) p->logit_bias.push_back(parse_logit_bias(item));
         },
         "add BIAS to a token's logit, as llama.cpp: ID+BIAS or ID-BIAS (ID-inf: never)")
      ->take_all();
}

// Where and how experts run: every command that runs a model takes these.
inline void add_backend_options(CLI::App& app, BackendOptions* o) {
  app.add_option("--cpu-experts", o->cpu_experts,
                 "CPU expert weights: auto (repack for a GGUF model on an AVX-512 VNNI CPU "
                 "when it fits in memory, else native) | native (as stored) | repack (every "
                 "matrix copied at load into huge-page memory, Q4_K rearranged into 16-row "
                 "tiles, Q5_0 / Q8_0 into 4-block groups, same values) | int8 | int4 | bf16 "
                 "(requantized at load, cached on disk)")
      ->capture_default_str();
  app.add_option("--expert-group", o->expert_group, "int8/int4 quantization group: 32, 64, 128")
      ->capture_default_str();
  app.add_option("--expert-cache-dir", o->expert_cache_dir,
                 "directory of repacked expert caches (default: next to the model)");
  app.add_flag("!--no-expert-cache", o->expert_cache, "repack at every load, write no cache");
  app.add_flag("--mmap", o->mmap,
               "map the model files instead of reading them into huge-page memory (less memory "
               "held; decode slower when the page cache holds the file in 4 KiB pages)");
  app.add_option("--numa-parts", o->numa_parts,
                 "NUMA tensor parallelism: split each expert into N parts, one per NUMA node "
                 "(0 = one per node, 1 = off)")
      ->capture_default_str();
  add_choice_option(app, &o->accel, "accelerator");
  app.add_option("--gpu-experts", o->gpu_experts,
                 "routed experts resident on the accelerator per MoE layer (most popular first)")
      ->capture_default_str();
  app.add_option("--vram-budget", o->vram_budget, "accelerator memory to use, e.g. 8G");
  app.add_option("--defer", o->defer, "Expert Deferral: experts per token deferred to the next "
                 "layer (decode)")
      ->capture_default_str();
  add_choice_option(app, &o->policy, "CPU/accelerator assignment");
  add_choice_option(app, &o->cache, "accelerator expert cache");
  app.add_option("--cache-slots", o->cache_slots,
                 "expert cache slots per MoE layer (-1: what the budget allows)")
      ->capture_default_str();
  app.add_flag("--cache-global", o->cache_global,
               "one expert cache pool shared by all MoE layers (n_layers x --cache-slots slots)");
  add_choice_option(app, &o->prefetch, "expert prefetching");
  app.add_option("--rules", o->rules, "YAML placement rules");
  app.add_option("--profile", o->profile, "cost model written by `tandem profile`");
  app.add_option("--residuals", o->residuals, "residual vectors written by `tandem calibrate`");
  app.add_flag("--show-placement", o->show_placement, "print where each module runs");
  app.add_flag("!--no-graphs", o->graphs,
               "run each decode step op by op instead of replaying the graph captured for its "
               "batch size (with an accelerator and every routed expert on the CPU)");
  app.add_option("--link", o->link,
                 "host accelerator's link: pcie4 | pcie5 | none | GBPS[,LATENCY_US]")
      ->capture_default_str();
}

}  // namespace tandem::tools
