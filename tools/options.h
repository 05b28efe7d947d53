// Command-line options shared by several subcommands.
#pragma once

#include <CLI/CLI.hpp>

#include "engine/sampling.h"

namespace tandem::tools {

inline void add_sampling_options(CLI::App& app, SamplingParams* p) {
  app.add_option("--temp", p->temperature, "temperature; 0 = greedy")->capture_default_str();
  app.add_option("--top-k", p->top_k, "keep the k most likely tokens (0 = off)")
      ->capture_default_str();
  app.add_option("--top-p", p->top_p, "nucleus sampling mass (1 = off)")->capture_default_str();
  app.add_option("--min-p", p->min_p, "drop tokens below min-p * p_max (0 = off)")
      ->capture_default_str();
  app.add_option("--seed", p->seed, "sampler seed")->capture_default_str();
}

}  // namespace tandem::tools
