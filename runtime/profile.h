// `tandem profile`: the cost model's inputs measured on this machine. CPU: time of one routed
// expert through the CPU MoE backend the runtime would build (BackendOptions) for 1, 2, 4, ... 512
// tokens, best of N runs; accelerator: the same through a Device's ffn when one is available;
// link: one expert's weights host -> accelerator (measured through the Device, else computed from
// the LinkSpec). The result is saved as the CostModel JSON the policies and `tandem sim` read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/weights.h"
#include "runtime/moe_runtime.h"

namespace tandem {
class ThreadingContext;
}

namespace tandem::rt {

struct ProfilePoint {
  int64_t tokens = 0;
  double seconds = 0;  // one expert, all tokens
};

struct ProfileResult {
  std::string model;
  std::string cpu_backend;          // MoeRuntime summary
  uint64_t expert_bytes = 0;        // gate + up + down of one routed expert, stored dtype
  std::vector<ProfilePoint> cpu;    // CPU expert time vs tokens
  std::vector<ProfilePoint> accel;  // empty: no accelerator measured
  std::string accel_name;           // "" when none
  double transfer_seconds = 0;      // one expert host -> accelerator
  std::string transfer_source;      // "measured" or "link model GBPS,US"
  // [moe layer][expert] selections counted in a routing trace (`--trace`): the popularity
  // `--gpu-experts N` pins by. Empty: none given.
  std::vector<std::vector<int64_t>> expert_counts;
};

struct ProfileOptions {
  std::vector<int64_t> tokens = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
  int repeats = 5;             // best of
  BackendOptions backend;      // CPU experts as the runtime builds them (accel forced to none)
  Accel accel = Accel::kNone;  // none | host (the emulated device when the build has it)
  std::string link = "pcie4";
  std::filesystem::path trace;  // optional routing trace: expert popularity for --gpu-experts
};

ProfileResult profile_experts(const LoadedModel& model, const ProfileOptions& options,
                              ThreadingContext& threading);

}  // namespace tandem::rt

namespace tandem::rt {
// The measured tables as JSON (docs/traces.md, "profile"): {"format": "tandem-cost-model",
// "version": 1, "cpu_expert": [[tokens, seconds], ...], "accel_expert": [...], "transfer_seconds",
// "expert_bytes", "model", "cpu_backend", "accel", "transfer_source"}.
void save_profile(const ProfileResult& result, const std::filesystem::path& path);
}  // namespace tandem::rt
