// The hybrid MoE pipeline (KTransformers §3.3, HybriMoE, DALI): per MoE layer, the expert cache
// sees the routing, the assignment policy splits the active experts between the CPU backend and
// the accelerator, missing experts are copied on a copy stream, and the compute stream runs, in
// order: host callback "submit the CPU experts", the shared experts and the accelerator experts,
// the copy of the device results back, host callback "wait for the CPU backend" (which adds the
// device's expert rows at their router slots when it adds_slot_rows(): the CPU alone's sum), an
// event. wait() syncs that event and adds the shared experts (and, for a CPU backend without slot
// rows, the device's experts in router slot order). Prefetching copies the predicted experts of
// the next MoE layer while this one computes.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "model/moe_backend.h"
#include "model/weights.h"
#include "runtime/choices.h"
#include "runtime/device.h"
#include "runtime/placement.h"

namespace tandem::rt {

class ExpertCache;
class AssignmentPolicy;
class Prefetcher;
struct CostModel;
struct Assignment;
struct ResidualVectors;

struct HybridOptions {
  PolicyKind policy = PolicyKind::kStatic;
  CacheKind cache = CacheKind::kLru;
  PrefetchKind prefetch = PrefetchKind::kNone;
  int gpu_experts = 0;            // pinned per MoE layer, most popular first
  int cache_slots = -1;           // per MoE layer on top of the pinned ones; -1: from the budget
  uint64_t budget_bytes = 0;      // accelerator memory to use; 0: what the device has left
  // Left free for activations (and, with the dense part on the device, its KV cache); 0: a
  // quarter of the budget, at most 64 MiB.
  uint64_t reserve_bytes = 0;
  bool global_pool = false;  // one slot pool across layers instead of per-layer slots
  // Pin (Device::register_host) the routed experts' host memory, so that expert fetches are DMA
  // the runtime does not wait for: when the CPU reads those same bytes (--cpu-experts native), so
  // nothing is kept resident that would not be anyway.
  bool pin_experts = false;
  std::filesystem::path profile;    // cost model (+ optional expert_counts) from `tandem profile`
  std::filesystem::path residuals;  // DALI residual vectors (required by --prefetch residual)
  double link_gb_per_s = 25, link_latency_us = 10;  // for the estimated cost model
};

// What ran where (token-expert pairs) and what moved: tests assert on these.
struct HybridStats {
  int64_t layers = 0;
  int64_t accel_pairs = 0, cpu_pairs = 0;  // token-expert selections computed per side
  int64_t fetches = 0;                     // on-demand copies of experts (policy fetch lists)
  int64_t prefetches = 0;                  // copies for the next layer chosen by the prefetcher
  int64_t prefetch_hits = 0;               // prefetched experts the next layer then ran on-device
  int64_t bytes_copied = 0;                // expert weight bytes host -> device
  int64_t shared_on_accel = 0;             // layers whose shared experts ran on the device
  int64_t pinned_host_bytes = 0;           // expert host memory registered for copies (pages)
};

class HybridMoeBackend : public MoeBackend {
 public:
  // `cpu` computes the experts assigned to the CPU (honours MoeRequest::run_here); `device`
  // holds the slots, the shared experts and the activation buffers. Throws Error(kResource) when
  // the pinned experts and shared experts do not fit the budget.
  HybridMoeBackend(const LoadedModel& model, MoeBackend* cpu, Device* device,
                   const Placement& placement, const HybridOptions& options);
  ~HybridMoeBackend() override;

  void submit(const MoeRequest& request) override;
  void wait() override;
  bool computes_shared() const override { return true; }

  const HybridStats& stats() const { return stats_; }
  std::string summary() const;  // slots, budget, policy, cache, prefetch, cost model source

 private:
  struct Layer;
  struct Pending;
  // The constructor's steps, in order.
  void collect_layers(const Placement& placement, uint64_t* shared_total, int* max_pinned);
  int size_slots(uint64_t shared_total, int max_pinned);
  void make_strategies(int extra);
  void upload_resident(const Placement& placement, int max_pinned);
  // submit()'s steps, in order.
  Assignment assign(const MoeRequest& r, int layer);
  void stage_inputs(const MoeRequest& r, int layer, const Assignment& a);
  void launch(const MoeRequest& r, int layer, const Assignment& a);
  void copy_expert(int layer, int expert, int slot, StreamId stream);
  void register_experts();
  DeviceFfnWeights place_ffn(const ops::Weight& g, const ops::Weight& u, const ops::Weight& d,
                             const ops::FfnExtras& extras, uint8_t* mem, StreamId stream);
  CostModel estimate_cost() const;
  std::vector<std::vector<int64_t>> expert_counts() const;
  void prefetch_next(const MoeRequest& r, int layer);
  void host_shared(const MoeRequest& r, float* out);

  const LoadedModel& model_;
  MoeBackend* cpu_;
  Device* dev_;
  HybridOptions opt_;
  std::vector<int64_t> moe_layers_;  // model layer of each MoE layer
  std::vector<std::unique_ptr<Layer>> layers_;
  std::unique_ptr<ExpertCache> cache_;
  std::unique_ptr<AssignmentPolicy> policy_;
  std::unique_ptr<Prefetcher> prefetcher_;
  std::unique_ptr<CostModel> cost_;
  std::unique_ptr<ResidualVectors> residuals_;
  std::string cost_source_;
  StreamId compute_ = 0, copy_ = 0;
  EventId fetched_ = 0, done_ = 0;
  int slots_per_layer_ = 0;
  uint64_t slot_bytes_ = 0;      // one expert's gate + up + down (+ scales), the largest layer
  std::vector<void*> slot_mem_;  // [layer * slots_per_layer + slot], lazy
  std::vector<std::pair<int, int>> slot_owner_;  // (layer, expert) held by each slot
  std::vector<void*> shared_mem_;
  std::vector<const void*> registered_;  // register_host'ed ranges
  std::unique_ptr<Pending> p_;
  HybridStats stats_;
  std::chrono::steady_clock::time_point cpu_since_;  // the CPU experts' submit (Timeline)
};

}  // namespace tandem::rt
