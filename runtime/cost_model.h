// The cost model the assignment policies, prefetchers and the simulator reason with: seconds for
// one routed expert on the CPU backend and on the accelerator as piecewise-linear functions of its
// token count, and seconds to copy one expert's weights host -> accelerator. Measured by
// `tandem profile` (JSON, docs/policies.md) or built from numbers for tests and synthetic cases.
#pragma once

#include <cstdint>
#include <filesystem>
#include <utility>
#include <vector>

namespace tandem::rt {

struct CostPoint {
  int64_t tokens = 0;
  double seconds = 0;
};

struct CostModel {
  // Sorted by tokens, tokens > 0, strictly increasing. Between points: linear interpolation;
  // below the first point: the first point's time (an expert's weights are read once whatever
  // the count); above the last: the last segment's slope continued. 0 tokens cost 0.
  std::vector<CostPoint> cpu_table, accel_table;
  double transfer_seconds = 0;      // one expert's weights host -> accelerator
  double cpu_layer_overhead = 0;    // fixed per layer when the CPU runs >= 1 expert
  double accel_layer_overhead = 0;  // fixed per layer when the accelerator runs >= 1 expert
  uint64_t expert_bytes = 0;        // informational (profile)
  // No accelerator table (a profile without a device): accel time = cpu time * this ratio.
  double accel_fallback_ratio = 0.05;

  double cpu_expert(int64_t tokens) const;    // one expert on the CPU backend
  double accel_expert(int64_t tokens) const;  // one resident expert on the accelerator
  double transfer() const { return transfer_seconds; }

  // Reads the `tandem profile` JSON (format "tandem-cost-model", version 1); Error(kFormat)
  // naming the file and key on anything malformed.
  static CostModel load(const std::filesystem::path& p);
  void save(const std::filesystem::path& p) const;

  // cpu(n) = cpu_fixed + cpu_per_token * n, accel(n) = accel_fixed + accel_per_token * n (n > 0).
  static CostModel from_linear(double cpu_fixed, double cpu_per_token, double accel_fixed,
                               double accel_per_token, double transfer);
  // Tables as (tokens, seconds); validated like load().
  static CostModel from_tables(std::vector<CostPoint> cpu, std::vector<CostPoint> accel,
                               double transfer);
};

// Evaluates a table as described above (exposed for tests).
double cost_table_eval(const std::vector<CostPoint>& table, int64_t tokens);

}  // namespace tandem::rt
