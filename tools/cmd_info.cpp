// `tandem info`: what this machine offers tandem: CPU model and ISA features, the kernel ISA
// chosen, physical cores and the CPUs this process may use, NUMA nodes, memory, caches, huge
// pages, and GPUs when CUDA finds any. `--json` prints the same facts for scripts.
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/memory.h"
#include "core/topology.h"
#include "tools/command.h"

#if TANDEM_HAVE_CUDA
#include "ops/cuda/cuda_info.h"
#endif

namespace tandem::tools {
namespace {

struct GpuFacts {
  nlohmann::json devices = nlohmann::json::array();
  std::string none_reason;  // set when there are no devices
};

GpuFacts gpu_facts() {
  GpuFacts g;
#if TANDEM_HAVE_CUDA
  std::string why;
  for (const CudaDeviceInfo& d : cuda_devices(&why)) {
    g.devices.push_back({{"index", d.index},
                         {"name", d.name},
                         {"compute_capability", fmt::format("{}.{}", d.cc_major, d.cc_minor)},
                         {"total_bytes", d.total_bytes},
                         {"free_bytes", d.free_bytes},
                         {"sm_count", d.sm_count}});
  }
  if (g.devices.empty()) g.none_reason = why.empty() ? "no CUDA device found" : why;
#else
  g.none_reason = "built without CUDA";
#endif
  return g;
}

std::string node_cpus(const NumaNodeInfo& node) {
  std::vector<int> cpus;
  for (const CoreInfo& c : node.cores) cpus.insert(cpus.end(), c.cpus.begin(), c.cpus.end());
  return format_cpu_list(cpus);
}

std::string cache_line(uint64_t bytes, int instances) {
  if (bytes == 0) return "none";
  return instances > 1 ? fmt::format("{} x{}", format_binary_bytes(bytes), instances)
                       : format_binary_bytes(bytes);
}

nlohmann::json info_json(const CpuFeatures& f, const Topology& t, const GpuFacts& gpus) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const NumaNodeInfo& n : t.nodes) {
    nodes.push_back({{"os_index", n.os_index},
                     {"physical_cores", n.cores.size()},
                     {"logical_cpus", n.logical_cpus()},
                     {"cpus", node_cpus(n)},
                     {"memory_bytes", n.memory_bytes}});
  }
  return {
      {"cpu", {{"model", f.model_name}, {"vendor", f.vendor}, {"features", cpu_feature_string(f)}}},
      {"kernel_isa", isa_name(best_isa())},
      {"topology",
       {{"source", t.source},
        {"physical_cores", t.physical_cores()},
        {"logical_cpus", t.logical_cpus()},
        {"machine_logical_cpus", t.machine_logical_cpus},
        {"allowed_cpus", format_cpu_list(t.allowed_cpus)},
        {"numa_nodes", nodes}}},
      {"memory",
       {{"total_bytes", t.total_memory_bytes},
        {"available_bytes", t.available_memory_bytes},
        {"cgroup_limit_bytes", t.cgroup_memory_limit_bytes},
        {"huge_page_bytes", t.huge_page_bytes},
        {"transparent_huge_pages", thp_mode_name(thp_mode())},
        {"numa_binding", numa_node_count() > 1}}},
      {"caches",
       {{"l1d_bytes", t.l1d_bytes},
        {"l2_bytes", t.l2_bytes},
        {"l2_instances", t.l2_instances},
        {"l3_bytes", t.l3_bytes},
        {"l3_instances", t.l3_instances}}},
      {"gpus", gpus.devices},
      {"gpu_none_reason", gpus.none_reason},
  };
}

void print_text(const CpuFeatures& f, const Topology& t, const GpuFacts& gpus) {
  fmt::print("CPU          {} ({})\n", f.model_name.empty() ? "unknown" : f.model_name, f.vendor);
  fmt::print("ISA features {}\n", cpu_feature_string(f));
  fmt::print("kernel ISA   {}\n", isa_name(best_isa()));
  fmt::print("cores        {} physical, {} logical CPUs usable ({}; {} online)\n",
             t.physical_cores(), t.logical_cpus(), format_cpu_list(t.allowed_cpus),
             t.machine_logical_cpus);
  for (const NumaNodeInfo& n : t.nodes) {
    fmt::print("NUMA node {}  {} cores, CPUs {}, memory {}\n", n.os_index, n.cores.size(),
               n.cores.empty() ? "none" : node_cpus(n), format_binary_bytes(n.memory_bytes));
  }
  std::string memory =
      fmt::format("{} total, {} available", format_binary_bytes(t.total_memory_bytes),
                  format_binary_bytes(t.available_memory_bytes));
  if (t.cgroup_memory_limit_bytes > 0) {
    memory += fmt::format(" (cgroup limit {})", format_binary_bytes(t.cgroup_memory_limit_bytes));
  }
  fmt::print("memory       {}\n", memory);
  fmt::print("caches       L1d {}, L2 {}, L3 {}\n", cache_line(t.l1d_bytes, 0),
             cache_line(t.l2_bytes, t.l2_instances), cache_line(t.l3_bytes, t.l3_instances));
  fmt::print("huge pages   {} pages, transparent huge pages: {}\n",
             t.huge_page_bytes ? format_binary_bytes(t.huge_page_bytes) : "no",
             thp_mode_name(thp_mode()));
  if (gpus.devices.empty()) {
    fmt::print("GPU          none ({})\n", gpus.none_reason);
  }
  for (const nlohmann::json& d : gpus.devices) {
    fmt::print("GPU {:<9}{} (compute {}, {} SMs), {} total, {} free\n", d["index"].get<int>(),
               d["name"].get<std::string>(), d["compute_capability"].get<std::string>(),
               d["sm_count"].get<int>(), format_binary_bytes(d["total_bytes"].get<uint64_t>()),
               format_binary_bytes(d["free_bytes"].get<uint64_t>()));
  }
}

void run_info(bool json) {
  const CpuFeatures& f = cpu_features();
  const Topology t = detect_topology();
  const GpuFacts gpus = gpu_facts();
  if (json) {
    fmt::print("{}\n", info_json(f, t, gpus).dump(2));
  } else {
    print_text(f, t, gpus);
  }
}

void add_info(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  app.add_flag("--json", *json, "print JSON instead of text");
  app.callback([json] { run_info(*json); });
}

Registrar reg("info", "Print CPU, ISA, cores, NUMA, memory and GPU facts", add_info);

}  // namespace
}  // namespace tandem::tools
