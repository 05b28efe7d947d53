// How the routed experts of a loaded model are executed, built once from the command line:
// the CPU experts (used as stored, or repacked to INT4/INT8/BF16 with an on-disk cache), the
// fused CPU MoE backend, and, when an accelerator is used (--accel host|cuda), the hybrid layer
// on top (placement, expert cache, assignment policy, prefetch, Expert Deferral). Every command
// that runs a model (run, chat, perplexity, bench, trace, serve) goes through this one place, so a
// flag means the same thing everywhere.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "model/moe_backend.h"
#include "model/weights.h"
#include "ops/cpu/kernels.h"

namespace tandem {

class ThreadingContext;

struct BackendOptions {
  // CPU experts (issue 4).
  std::string cpu_experts = "native";  // native | repack | int8 | int4 | bf16
  int expert_group = 128;              // int8/int4 quantization group: 32, 64, 128
  std::filesystem::path expert_cache_dir;  // empty: default (see docs/cpu-backend.md)
  bool expert_cache = true;                // read / write the repacked experts on disk
  // Map the model files (and the expert cache) instead of copying them into huge-page memory
  // (core/mapped_file.h LoadMode: a copy is made only when it fits in the memory available).
  bool mmap = false;
  // NUMA tensor parallelism: parts each expert is split into, one per NUMA node of the pool
  // (0: one per node the pool spans, so 1 on a one-node machine; 1: off). More parts than nodes
  // wrap around the nodes (tests and benchmarks force 2 parts on one node).
  int numa_parts = 0;
  // Hybrid runtime (issue 6).
  std::string accel = "auto";        // auto | none | host | cuda  (auto: cuda if present, else none)
  int gpu_experts = 0;               // experts resident on the accelerator per MoE layer
  std::string vram_budget;           // e.g. "8G"; empty: the device's capacity
  int defer = 0;                     // Expert Deferral: experts deferred per token (decode)
  std::string policy = "static";     // static | fiddler | hybrimoe | dali | optimal
  std::string cache = "lru";         // lru | lfu | mrs | dali | none
  int cache_slots = -1;              // expert cache slots per layer (-1: from the budget)
  bool cache_global = false;         // one pool of slots shared by all MoE layers
  std::string prefetch = "none";     // none | gate | residual
  std::filesystem::path rules;       // YAML placement rules
  std::filesystem::path profile;     // cost model from `tandem profile`
  std::filesystem::path residuals;   // DALI residual vectors from `tandem calibrate`
  std::string link = "pcie4";        // host device link: pcie4 | pcie5 | none | <GB/s>[,<us>]
  bool show_placement = false;       // print the resolved placement (also at -v)
};

class MoeRuntime {
 public:
  MoeRuntime(const LoadedModel& model, const BackendOptions& options, ThreadingContext& threading);
  ~MoeRuntime();
  MoeRuntime(const MoeRuntime&) = delete;
  MoeRuntime& operator=(const MoeRuntime&) = delete;

  // What ModelOptions::moe should point at.
  MoeBackend* backend() { return backend_; }
  // One line for the load summary: CPU expert format, accelerator, policy.
  const std::string& summary() const { return summary_; }
  // What ModelOptions::views should point at: the non-expert matrices `--cpu-experts repack`
  // copied (CpuExperts::other); nullptr for the other formats.
  const kern::WeightViews* weight_views() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  MoeBackend* backend_ = nullptr;
  std::string summary_;
};

}  // namespace tandem
