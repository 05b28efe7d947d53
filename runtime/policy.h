// Assignment policies: for one MoE layer step, which active experts run on the accelerator (and
// which of those must be copied there first) and which on the CPU, with the policy's estimate of
// the layer's MoE time. Shared by the runtime (HybridMoeBackend) and the simulator (`tandem sim`).
//   static   KTransformers: an expert runs on the accelerator iff it is resident; nothing fetched.
//   fiddler  an uncached expert is fetched when transfer + accel(n) < cpu(n) for its n tokens.
//   hybrimoe HybriMoE §IV-B: priority queues + CPU / GPU / link timeline simulation.
//   dali     DALI Algorithm 1: greedy 0-1 assignment by |t_cpu - t_gpu| (t_gpu incl. transfer).
//   optimal  branch and bound: minimal max(CPU time, accelerator time incl. transfers).
// All policies treat the link as serial and an expert's accelerator compute as starting only when
// its copy is done; est_seconds is the resulting makespan under the CostModel.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cost_model.h"
#include "runtime/expert_cache.h"

namespace tandem::rt {

struct Assignment {
  std::vector<uint8_t> on_accel;  // [n_experts]: 1 = run on the accelerator this step
  std::vector<int> fetch;         // experts to copy to the accelerator for this step (not resident)
  double est_seconds = 0;         // the policy's estimate of the layer's MoE time
};

struct PolicyOptions {
  // optimal: give up exact search after this many branch-and-bound nodes (then the best found,
  // which starts from the dali and hybrimoe solutions).
  int64_t max_nodes = 2000000;
  // Upper bound on experts fetched per step (-1: no bound). The runtime sets it to the free +
  // evictable slots so that a fetched expert always finds a slot.
  int max_fetch = -1;
};

class AssignmentPolicy {  // static, fiddler, hybrimoe, dali, optimal (branch and bound)
 public:
  virtual ~AssignmentPolicy() = default;
  static std::unique_ptr<AssignmentPolicy> make(PolicyKind kind,
                                                const PolicyOptions& options = {});
  virtual Assignment assign(const LayerRouting& r, const ExpertCache& cache,
                            const CostModel& cost) = 0;
  virtual const std::string& name() const = 0;
};

// The makespan of a given split, with copies issued in `fetch` order on a serial link and
// accelerator work ordered resident-first then by copy completion: max(CPU, accelerator) time plus
// the per-layer overheads of each side that has work. counts: [n_experts] tokens per expert.
double assignment_makespan(const std::vector<int>& counts, const std::vector<uint8_t>& on_accel,
                           const std::vector<int>& fetch, const CostModel& cost);

// HybriMoE §IV-B timeline simulation on explicit inputs (exposed for the Fig. 5 unit test):
// counts[e] > 0 = active, cached[e] = resident. Returns the assignment; *order_out (optional)
// receives the simulated events as "cpu:E", "gpu:E", "pcie:E" strings in start order.
Assignment hybrimoe_schedule(const std::vector<int>& counts, const std::vector<uint8_t>& cached,
                             const CostModel& cost, int max_fetch,
                             std::vector<std::string>* order_out = nullptr);

}  // namespace tandem::rt
