// Expert Deferral (KTransformers §4.1): during decode, each token's N lowest-weight routed experts
// of MoE layer k are computed asynchronously and their output is added to layer k+1's MoE output,
// so they overlap with layer k+1's attention instead of blocking it:
//   O_k = I_k + S_k(I_k) + R_{k-1}^def(I_{k-1}) + R_k^imm(I_k)
// Never in the last MoE layer (it computes all its experts and adds the previous deferred part),
// never in prefill. A MoeBackend wrapper, so it works over the CPU backend and the hybrid one.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "model/moe_backend.h"

namespace tandem::rt {

// How the k selected experts of one token split: the `n_defer` slots with the lowest weight are
// deferred (ties: the later slot first), the rest stay immediate; both keep the router's slot
// order. n_defer is clamped to k - 1.
void split_deferred(const int32_t* ids, const float* weights, int64_t k, int64_t n_defer,
                    int32_t* imm_ids, float* imm_weights, int32_t* def_ids, float* def_weights);

struct DeferralStats {
  int64_t deferred_requests = 0;  // layers whose deferred part ran on the deferred backend
  int64_t deferred_experts = 0;   // token-expert pairs deferred
  int64_t passthrough = 0;        // requests computed whole (prefill, last layer, defer 0)
};

class DeferringMoeBackend : public MoeBackend {
 public:
  // `immediate` computes each request's immediate experts (and the shared experts when it
  // computes_shared()); `deferred` (a CPU backend: one pending request) the deferred ones.
  // n_defer == 0: a pure pass-through to `immediate`. async_submit: call deferred->submit() on
  // a helper thread, so a backend that computes inside submit() (CpuMoeBackend) still overlaps
  // with the model's next layer; a backend whose submit() only starts work needs none.
  DeferringMoeBackend(MoeBackend* immediate, MoeBackend* deferred, int n_defer,
                      bool async_submit = true);
  ~DeferringMoeBackend() override;

  // (The shared experts belong to the immediate part.)
  void start_shared(const MoeRequest& request) override { immediate_->start_shared(request); }
  void submit(const MoeRequest& request) override;
  void wait() override;
  bool computes_shared() const override { return immediate_->computes_shared(); }
  bool runs_in_host_callbacks() const override {
    return immediate_->runs_in_host_callbacks() && deferred_->runs_in_host_callbacks();
  }

  int n_defer() const { return n_defer_; }
  const DeferralStats& stats() const { return stats_; }

 private:
  void collect_deferred(float* out, int64_t count);  // waits for the deferred part, adds it
  void drop_deferred();
  void start_deferred();   // deferred_->submit(def_req_), on the helper thread if async
  void finish_deferred();  // waits for that submit (rethrows its error), then deferred_->wait()
  void helper_loop();

  MoeBackend* immediate_;
  MoeBackend* deferred_;
  int n_defer_;
  int64_t clamped_warned_k_ = -1;
  DeferralStats stats_;

  MoeRequest current_;  // the request being computed (immediate part)
  bool have_current_ = false;
  bool split_current_ = false;  // current_ was split: its deferred part starts in wait()
  bool def_pending_ = false;    // deferred_ holds the previous layer's deferred part
  int64_t def_moe_index_ = -1;
  int64_t def_tokens_ = 0;
  int64_t def_hidden_size_ = 0;
  // Immediate part of the current request; copies of the deferred part's inputs (the model
  // reuses its buffers for the next layer while the deferred experts run).
  std::vector<int32_t> imm_ids_, next_def_ids_, def_ids_;
  std::vector<float> imm_w_, next_def_w_, def_w_, next_def_hidden_, def_hidden_, def_out_;
  std::vector<uint8_t> next_def_mask_, def_mask_;
  int64_t next_def_k_ = 0;
  MoeRequest def_req_;
  // The helper thread: runs deferred_->submit(def_req_) when job_ is set.
  bool async_ = false;
  std::thread helper_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool job_ = false, job_done_ = false, stop_ = false;
  std::exception_ptr job_error_;
};

}  // namespace tandem::rt
