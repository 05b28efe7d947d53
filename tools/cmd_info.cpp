// `tandem info`: what this machine offers tandem: CPU model and ISA features, the kernel ISA
// chosen, cores, NUMA nodes, memory, and GPUs when CUDA finds any.
#include <fmt/format.h>

#include "core/cpu_features.h"
#include "tools/command.h"

namespace tandem::tools {
namespace {

void run_info() {
  const CpuFeatures& f = cpu_features();
  fmt::print("CPU          {} ({})\n", f.model_name.empty() ? "unknown" : f.model_name, f.vendor);
  fmt::print("ISA features {}\n", cpu_feature_string(f));
  fmt::print("kernel ISA   {}\n", isa_name(best_isa()));
}

void add_info(CLI::App& app) { app.callback(run_info); }

Registrar reg("info", "Print CPU, ISA, cores, NUMA, memory and GPU facts", add_info);

}  // namespace
}  // namespace tandem::tools
