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

#include "core/cpu_features.h"
#include "model/forward_ops.h"
#include "model/model.h"
#include "model/moe_backend.h"
#include "model/weights.h"
#include "ops/cpu/kernels.h"
#include "runtime/choices.h"

namespace tandem {
namespace rt {
struct HybridStats;
struct HostDeviceOptions;
class Timeline;
}  // namespace rt

class ThreadingContext;

struct BackendOptions {
  // CPU experts (docs/cpu-backend.md, "CPU experts").
  // auto | native | repack | int8 | int4 | bf16 (auto: resolve_cpu_experts below)
  std::string cpu_experts = "auto";
  int expert_group = 128;                  // int8/int4 quantization group: 32, 64, 128
  std::filesystem::path expert_cache_dir;  // empty: default (see docs/cpu-backend.md)
  bool expert_cache = true;                // read / write the repacked experts on disk
  // Map the model files (and the expert cache) instead of copying them into huge-page memory
  // (core/mapped_file.h LoadMode: a copy is made only when it fits in the memory available).
  bool mmap = false;
  // NUMA tensor parallelism: parts each expert is split into, one per NUMA node of the pool
  // (0: one per node the pool spans, so 1 on a one-node machine; 1: off). More parts than nodes
  // wrap around the nodes (tests and benchmarks force 2 parts on one node).
  int numa_parts = 0;
  // Hybrid runtime (docs/hybrid.md).
  rt::Accel accel = rt::Accel::kAuto;  // (auto: see resolve_accel in moe_runtime.cpp)
  int gpu_experts = 0;              // experts resident on the accelerator per MoE layer
  std::string vram_budget;          // e.g. "8G"; empty: the device's capacity
  int defer = 0;                    // Expert Deferral: experts deferred per token (decode)
  rt::PolicyKind policy = rt::PolicyKind::kStatic;
  rt::CacheKind cache = rt::CacheKind::kLru;
  int cache_slots = -1;             // expert cache slots per layer (-1: from the budget)
  bool cache_global = false;        // one pool of slots shared by all MoE layers
  rt::PrefetchKind prefetch = rt::PrefetchKind::kNone;
  std::filesystem::path rules;      // YAML placement rules
  std::filesystem::path profile;    // cost model from `tandem profile`
  std::filesystem::path residuals;  // DALI residual vectors from `tandem calibrate`
  std::string link = "pcie4";       // host device link: pcie4 | pcie5 | none | <GB/s>[,<us>]
  bool graphs = true;               // decode steps replayed as graphs (ModelOptions::graphs)
  bool show_placement = false;      // print the resolved placement (also at -v)
  std::string cpu_experts_why;      // set by resolve_backend_options when auto chose
};

// --cpu-experts auto, decided once before the model loads (the load mode depends on it):
// "repack" for a GGUF model on a CPU with AVX-512 VNNI (the x16 / x4 kernels read DRAM faster
// than the stored rows where DRAM is fast and no slower elsewhere, at the same logits;
// docs/cpu-backend.md, "CPU experts"), unless --mmap was given,
// transparent huge pages are off or the file does not fit in 90% of the memory available (the
// rule by which `native` copies it into memory: repack holds the same bytes); "native" otherwise.
// Any other value is returned as given. why (optional): the reason, one phrase.
struct CpuExpertsFacts {
  bool gguf = false;
  uint64_t model_bytes = 0;
  uint64_t available_bytes = 0;  // MemAvailable (0: unknown, assumed to fit)
  Isa isa = Isa::kScalar;
  bool thp_never = false;
};
std::string resolve_cpu_experts(const BackendOptions& options, const CpuExpertsFacts& facts,
                                std::string* why = nullptr);
// The facts of this machine and the model at `model` (a .gguf file or an HF directory).
CpuExpertsFacts cpu_experts_facts(const std::filesystem::path& model);
// options with cpu_experts resolved (auto replaced, the reason in cpu_experts_why, logged) and
// every flag value that needs no model checked: Error(kInvalidArgument) naming the flag.
BackendOptions resolve_backend_options(const BackendOptions& options,
                                       const std::filesystem::path& model);

class MoeRuntime {
 public:
  MoeRuntime(const LoadedModel& model, const BackendOptions& options, ThreadingContext& threading);
  ~MoeRuntime();
  MoeRuntime(const MoeRuntime&) = delete;
  MoeRuntime& operator=(const MoeRuntime&) = delete;

  // What ModelOptions::moe should point at.
  MoeBackend* backend() { return backend_; }
  // Sets ModelOptions::moe, views and ops as this runtime wants them (every caller's one way to
  // build a Model over it).
  void apply(ModelOptions* options);
  // One line for the load summary: CPU expert format, accelerator, policy.
  const std::string& summary() const { return summary_; }
  // What ModelOptions::views should point at: the non-expert matrices `--cpu-experts repack`
  // copied (CpuExperts::other); nullptr for the other formats.
  const kern::WeightViews* weight_views() const;
  // What ran on the accelerator and what moved (nullptr without one). Read between forwards.
  const rt::HybridStats* hybrid_stats() const;
  // What ModelOptions::ops should be: the accelerator's forward ops over the dense part it holds
  // (uploaded here, before the expert cache takes the rest of its memory) when the placement puts
  // the dense part there; empty (the CPU's) otherwise.
  ForwardOpsFactory forward_ops() const;
  // The accelerator's timeline (its busy intervals, the CPU experts', the link's bytes; nullptr
  // without one): `tandem bench` and `tandem profile` take() it around a decode.
  rt::Timeline* timeline() const;

 private:
  // The accelerator (--accel host | cuda), and over it the hybrid backend or, when no routed
  // expert runs there, the dense part alone.
  void make_accelerator(const LoadedModel& model, const BackendOptions& o, rt::Accel accel);
  // The hybrid backend over impl_->device (the dense part uploaded first when placed there).
  void make_hybrid(const LoadedModel& model, const BackendOptions& o,
                   const rt::HostDeviceOptions& ho);

  struct Impl;
  std::unique_ptr<Impl> impl_;
  MoeBackend* backend_ = nullptr;
  std::string summary_;
};

}  // namespace tandem
