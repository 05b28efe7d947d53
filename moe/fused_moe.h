// The fused CPU MoE operator behind MoeBackend (KTransformers §3.2, OSDI'26 §3.5.1): one submit()
// computes every routed expert of a layer for T tokens.
//
//  1. The hidden states are converted once into each activation encoding the layer's experts need
//     (ops/cpu/kernels.h); each expert's token rows are gathered from them (a row copy: rows are
//     quantized independently, so gathering quantized rows equals quantizing gathered rows).
//  2. One pool job whose tasks are (expert, row chunk) units: first every expert's gate+up chunks
//     (both matrices in one task over the same activations, then SiLU(gate)*up for those rows),
//     then every expert's down chunks. Chunk sizes are balanced over the active experts so a big
//     expert is split along its output dimension, and workers pull tasks from the pool's atomic
//     counter (dynamic scheduling). Dependencies are per expert: the last gate/up chunk of an
//     expert converts its intermediate rows for the down projection and marks it ready; a down
//     chunk waits only for its own expert (no barrier between the phases of different experts).
//     A prefill with many experts runs most of them whole instead, one task each (its gather,
//     gate/up, SiLU * up, down) on one core, largest first; the rest stay in row chunks
//     (FusedMoeOptions::whole_experts_per_thread).
//     A decode's shared experts start earlier, in start_shared(): their gate/up and down chunks form a
//     job of their own that one core streams while the caller computes the router, the routing
//     and the routed experts' set-up (serial work that otherwise left both cores idle).
//  3. wait(): joins the job and combines the experts' outputs per token in top-k slot order
//     (deterministic: the same sums whichever thread ran what).
// NUMA tensor parallelism (KTransformers §3.3): when the experts were split (split_cpu_experts),
// each active expert becomes one sub-expert per part (its rows of gate/up, its columns of down, in
// node-local memory), each part's tasks form one job on its node's workers, and wait() adds the
// parts' outputs in part order. Unsplit experts run whole in part 0's job.
// Experts stored in a dtype without a kernel run the reference matmul inside one task.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/thread_pool.h"
#include "model/moe_backend.h"
#include "moe/cpu_experts.h"
#include "ops/cpu/kernels.h"

namespace tandem {

struct FusedMoeOptions {
  // Target rows per task; the real chunk adapts so there are at least ~4 tasks per thread.
  // (A task streams its rows once, and a stream reads faster the longer it runs;
  // bench_moe_layer_bench with TANDEM_BENCH_MOE_ROWS / _ROWS_B compares caps.)
  int64_t max_rows_per_task = 1024;
  // The cap for decode (<= 4 tokens), where a layer's few experts make few tasks anyway: 4096
  // lets a V2-Lite or Qwen3 expert's gate/up and down each be one stream; against 1024 it is
  // no slower for any layer and faster for the GGUF ones where DRAM is fastest
  // (docs/performance.md).
  int64_t max_rows_per_task_decode = 4096;
  // The last `threads` down chunks of a part (the queue's tail) are cut into this many pieces
  // (>= 16 rows each), so the threads finish together: the wait at the end is a piece's time, not
  // a chunk's. 1: off.
  int tail_pieces = 4;
  // Compute the layer's shared experts too (computes_shared()): one more expert over every token,
  // its gate/up and down chunks in the same task queue as the routed ones, added to each token's
  // routed sum (after it: the bits of Model::ffn's shared + routed). Off for a backend inside a
  // hybrid one (the accelerator runs the shared experts) and for Expert Deferral's deferred one.
  bool shared_experts = false;
  // A prefill's (> 4 tokens) routed experts as whole-expert tasks when there are at least this
  // many per thread (see submit()); 0: every expert in row chunks.
  int whole_experts_per_thread = 4;
};

class FusedMoeBackend : public MoeBackend {
 public:
  // experts: the routed experts as prepared by prepare_cpu_experts (repacked INT8/INT4/BF16, or
  // native views); nullptr: views on the request's stored weights, made per request.
  explicit FusedMoeBackend(ThreadPool* pool, FusedMoeOptions options = {},
                           const CpuExperts* experts = nullptr);
  ~FusedMoeBackend() override;
  // A decode's (<= 4 tokens) shared experts, when computes_shared() and they have kernels: their
  // tasks start now, as a job of their own (unsplit experts only: no NUMA parts).
  void start_shared(const MoeRequest& request) override;
  void submit(const MoeRequest& request) override;
  void wait() override;
  bool computes_shared() const override { return options_.shared_experts; }
  bool adds_slot_rows() const override { return true; }
  bool runs_in_host_callbacks() const override { return true; }
  // Whether the last request's shared experts ran as start_shared()'s early job.
  bool last_shared_early() const { return early_tasks_count_ > 0; }

  // Tasks of the last submitted layer (tests and benchmarks look at the decomposition).
  int64_t last_task_count() const { return static_cast<int64_t>(tasks_.size()); }
  // Jobs (NUMA parts) of the last submitted layer.
  int last_part_count() const { return static_cast<int>(handles_.size()); }
  // Experts of the last submitted layer run as one whole-expert task each.
  int64_t last_whole_count() const { return static_cast<int64_t>(whole_.size()); }

 private:
  struct Expert;
  struct Task {
    int32_t expert;  // index into experts_
    // 0: gate+up rows, 1: down rows, 2: whole expert (reference path), 3: whole shared expert as
    // Model::dense_ffn computes it (no fast path for its matrices), 4: whole expert on the fast
    // path (gather, gate+up, SiLU * up, down: a prefill's experts when there are many)
    int32_t phase;
    int64_t r0, r1;
  };
  // submit()'s steps, in order.
  void route(const MoeRequest& r, bool prepared, int n_parts);  // n_parts 0: experts unsplit
  void activate(const MoeRequest& r, int32_t e, bool prepared, int n_parts);
  void choose_whole_experts(int64_t tokens, bool split);
  void prepare_activations(const MoeRequest& r);
  void launch(bool split, int n_parts);
  void run_task(const Task& task);
  void gather(const Expert& x, kern::Activations* out) const;
  void add_tasks(int part, int64_t threads);
  void add_shared(const MoeRequest& r);  // the shared expert as experts_[n_active_] (shared_)
  Expert& next_expert();
  void drop_early();  // waits for start_shared()'s job, if any, and forgets it

  ThreadPool* pool_;
  FusedMoeOptions options_;
  const CpuExperts* prepared_;
  MoeRequest req_;
  bool pending_ = false;
  std::vector<std::unique_ptr<Expert>> experts_;  // active experts of the request (reused)
  int64_t n_active_ = 0;
  std::vector<Task> tasks_;         // all parts' tasks, part by part
  std::vector<Task> tail_;          // add_tasks' scratch: the chunks cut into pieces
  std::vector<size_t> part_begin_;  // [parts + 1]: each part's range in tasks_
  std::vector<int32_t> index_of_;   // [n_experts]: index into experts_, -1 when inactive
  std::vector<int32_t> whole_;      // experts_ indices run as one phase-4 task each, largest first
  std::vector<int32_t> slot_row_;   // [T * k]: row of that selection in its expert's output, -1
  std::vector<int32_t> slot_expert_;  // [T * k]: index into experts_, -1 when masked out
  int64_t shared_ = -1;               // index of the shared expert in experts_, -1: none
  std::vector<float> shared_gate_;    // [T]: Qwen2-MoE's sigmoid gate per token (when present)
  std::vector<kern::Activations> hidden_acts_;  // hidden in each encoding needed (by AFormat)
  std::vector<TaskHandle> handles_;             // one job per part
  // start_shared()'s job: the shared expert (experts_[0]) of the pending request, its gate/up chunks
  // then its down chunks. While it runs, experts_ does not grow (start_shared() allocated every entry
  // submit() can use).
  std::vector<Task> early_tasks_;
  TaskHandle early_;
  bool early_started_ = false;
  int64_t early_tasks_count_ = 0;
};

}  // namespace tandem
