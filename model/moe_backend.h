// The one interface through which routed experts are computed: hidden states [T, H] plus the
// router's top-k ids / weights [T, K] and an expert mask go in, the weighted sum of the selected
// experts' outputs [T, H] comes out. submit() starts the work, wait() completes it, so a caller
// can overlap it with other work (GPU experts, the next layer's attention) without the model
// code knowing where experts run.
#pragma once

#include <cstdint>
#include <vector>

#include "model/weights.h"

namespace tandem {

class ThreadPool;

struct LayerWeights;

struct MoeRequest {
  int64_t layer = 0;         // model layer index
  int64_t moe_index = 0;     // index among the MoE layers: 0 .. n_moe_layers - 1
  int64_t n_moe_layers = 0;  // Expert Deferral never defers in the last MoE layer
  // The forward computes one token (one sequence's decode step; a step of several sequences is
  // not): Expert Deferral applies only then.
  bool single_token = false;
  const LayerWeights* layer_weights = nullptr;  // the whole layer (shared experts, router)
  const ExpertWeights* experts = nullptr;
  const float* hidden = nullptr;  // [n_tokens, hidden_size]
  int64_t n_tokens = 0;
  int64_t hidden_size = 0;
  // [n_tokens, k]; -1: an empty slot, no expert (an engine that runs some of a token's experts
  // elsewhere may mark them so instead of through run_here)
  const int32_t* ids = nullptr;
  const float* weights = nullptr;  // [n_tokens, k]
  int64_t k = 0;
  // [n_experts]: nonzero = compute this expert here; nullptr = all. Skipped experts contribute
  // nothing (another backend owns them).
  const uint8_t* run_here = nullptr;
  float* out = nullptr;  // [n_tokens, hidden_size], overwritten; valid after wait()
  // [n_tokens * k] or nullptr, for a backend whose adds_slot_rows(): slot i's expert output row
  // ([hidden_size], unweighted) when another backend computed it (its expert masked here; null:
  // nothing). The backend adds weights[i] * row at the slot's place among its own experts, so the
  // sum has the bits of one backend computing every expert. Read in wait().
  const float* const* slot_rows = nullptr;
};

// Qwen2-MoE's shared-expert gate for one token: sigmoid(x . g) over h values (the one definition
// every backend and the model use, so their outputs agree bit for bit).
float shared_expert_gate(const float* x, const float* g, int64_t h);

class MoeBackend {
 public:
  virtual ~MoeBackend() = default;
  // Optional, before submit(): the layer's hidden states are final but its routing is not known
  // yet (request.ids / weights are not read). A backend may start what does not depend on the
  // routing -- the shared experts -- so that it overlaps the router and the routing. submit()
  // must follow with the same layer and hidden states.
  virtual void start_shared(const MoeRequest& request) {}
  virtual void submit(const MoeRequest& request) = 0;
  virtual void wait() = 0;
  // true: out also holds the shared experts' output (incl. Qwen2's sigmoid gate), the model does
  // not compute them (a hybrid backend runs them on the accelerator).
  virtual bool computes_shared() const { return false; }
  // true: honours MoeRequest::slot_rows.
  virtual bool adds_slot_rows() const { return false; }
  // true: begin / submit / wait may be called from a device's host function (they make no device
  // calls), so a model on a device's ops runs the MoE layer in stream order (ForwardOps::
  // host_work) instead of waiting on the host.
  virtual bool runs_in_host_callbacks() const { return false; }
};

// The reference: per expert, gather its tokens, SwiGLU FFN through ops::matmul (weights read in
// their stored dtype; gpt-oss's biases and clamp: ExpertWeights::extras), scatter-add weighted. It
// computes during submit(); wait() only checks that a request was submitted.
class CpuMoeBackend : public MoeBackend {
 public:
  explicit CpuMoeBackend(ThreadPool* pool) : pool_(pool) {}
  void submit(const MoeRequest& request) override;
  void wait() override;
  bool runs_in_host_callbacks() const override { return true; }

 private:
  ThreadPool* pool_;
  bool pending_ = false;
  std::vector<float> x_, g_, u_, d_;
  std::vector<int64_t> rows_;
};

}  // namespace tandem
