// The machine's shape as tandem uses it: physical cores and the CPUs a process may run on, NUMA
// nodes with their cores and memory, cache sizes, memory totals and huge pages. Detected once with
// hwloc (plus /proc and /sys for what hwloc does not say) into plain data, so thread pools, the
// allocator and tests can also be handed a synthetic topology. It is not a process singleton: the
// ThreadingContext (core/thread_pool.h) owns one (STYLE.md #6).
//
// Everything here is restricted to what this process may use: the cgroup cpuset (containers) and
// the affinity mask it was started with (taskset). A machine where hwloc reports no NUMA node is
// described as one node holding every allowed core.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

// One physical core: the logical CPUs (OS indices, hyperthreads) of it this process may use.
struct CoreInfo {
  int os_index = -1;      // hwloc's core number (may be sparse); -1 when unknown
  std::vector<int> cpus;  // allowed logical CPUs of this core, ascending, never empty
};

struct NumaNodeInfo {
  int os_index = 0;             // the kernel's node number (what mbind / numa_* expect)
  std::vector<CoreInfo> cores;  // allowed physical cores whose CPUs are local to this node
  uint64_t memory_bytes = 0;    // local memory; 0 when unknown
  int logical_cpus() const;
};

struct Topology {
  std::string source;               // "hwloc" or "fallback" (sysconf only: hwloc failed)
  std::vector<NumaNodeInfo> nodes;  // at least one; nodes without allowed cores are kept
  std::vector<int> allowed_cpus;    // every CPU this process may run on, ascending
  int machine_logical_cpus = 0;     // online CPUs of the whole machine (allowed or not)

  uint64_t total_memory_bytes = 0;         // MemTotal, capped by a cgroup memory limit
  uint64_t available_memory_bytes = 0;     // MemAvailable, capped by cgroup limit - usage
  uint64_t cgroup_memory_limit_bytes = 0;  // 0: none
  uint64_t huge_page_bytes = 0;            // default huge page size (Hugepagesize), 0: none

  // Cache sizes of one instance (bytes, 0 when unknown) and how many instances the allowed CPUs
  // touch: e.g. 8 cores sharing one 32 MiB L3 give l3_bytes = 32 MiB, l3_instances = 1.
  uint64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;
  int l2_instances = 0, l3_instances = 0;

  int physical_cores() const;
  int logical_cpus() const { return static_cast<int>(allowed_cpus.size()); }
  int numa_nodes() const { return static_cast<int>(nodes.size()); }
  // Index into `nodes` of the node holding logical CPU `cpu`; -1 when no node has it.
  int node_of_cpu(int cpu) const;
};

// Detects the topology of this machine for this process. Never throws: where hwloc fails it
// falls back to one node with the allowed CPUs as cores (source = "fallback", with a warning).
Topology detect_topology();

// Logical CPUs this process may run on (its affinity mask; at least 1). Cheap: no hwloc.
int allowed_cpu_count();

// A synthetic topology for tests: `nodes` nodes of `cores_per_node` cores, each core mapped to
// the allowed CPUs round-robin (so it can be pinned to on any machine).
Topology synthetic_topology(int nodes, int cores_per_node);

// Memory facts from /proc/meminfo, in bytes (0 when the key is missing). Exposed for tests.
uint64_t meminfo_bytes(const std::string& key);

// "1.5 GiB", "512 KiB": binary units, for memory sizes shown to people.
std::string format_binary_bytes(uint64_t bytes);
// "0-3,8,10-11": a CPU list in the kernel's notation.
std::string format_cpu_list(const std::vector<int>& cpus);

}  // namespace tandem
