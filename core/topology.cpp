#include "core/topology.h"

#include <hwloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "core/log.h"

namespace tandem {
namespace {

constexpr uint64_t kUnlimitedCgroup = uint64_t{1} << 60;  // cgroup v1 "no limit" is ~2^63

std::vector<int> affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

}  // namespace

int allowed_cpu_count() {
  return std::max(1, static_cast<int>(affinity_cpus().size()));
}

namespace {

// Reads one number from a sysfs/cgroup file; false when missing or "max".
bool read_u64_file(const char* path, uint64_t* value) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return false;
  try {
    *value = std::stoull(text);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// The memory limit and usage of our cgroup (v2 first, then v1); limit 0 when there is none.
void cgroup_memory(uint64_t* limit, uint64_t* usage) {
  *limit = 0;
  *usage = 0;
  uint64_t l = 0, u = 0;
  if (read_u64_file("/sys/fs/cgroup/memory.max", &l)) {
    read_u64_file("/sys/fs/cgroup/memory.current", &u);
  } else if (read_u64_file("/sys/fs/cgroup/memory/memory.limit_in_bytes", &l)) {
    read_u64_file("/sys/fs/cgroup/memory/memory.usage_in_bytes", &u);
  }
  if (l > 0 && l < kUnlimitedCgroup) {
    *limit = l;
    *usage = u;
  }
}

std::vector<int> bitmap_cpus(hwloc_const_bitmap_t bitmap) {
  std::vector<int> cpus;
  if (bitmap == nullptr || hwloc_bitmap_weight(bitmap) < 0) return cpus;  // infinite set
  unsigned id;
  hwloc_bitmap_foreach_begin(id, bitmap) {
    cpus.push_back(static_cast<int>(id));
  }
  hwloc_bitmap_foreach_end();
  return cpus;
}

std::vector<int> intersect(const std::vector<int>& a, const std::set<int>& allowed) {
  std::vector<int> out;
  for (int c : a) {
    if (allowed.count(c)) out.push_back(c);
  }
  return out;
}

struct HwlocDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};

// Size of one data/unified cache instance of `type` and how many instances hold allowed CPUs.
void cache_info(hwloc_topology_t topo, hwloc_obj_type_t type, const std::set<int>& allowed,
                uint64_t* bytes, int* instances) {
  *bytes = 0;
  *instances = 0;
  const int n = hwloc_get_nbobjs_by_type(topo, type);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t obj = hwloc_get_obj_by_type(topo, type, i);
    if (obj->attr == nullptr || obj->attr->cache.type == HWLOC_OBJ_CACHE_INSTRUCTION) continue;
    if (intersect(bitmap_cpus(obj->cpuset), allowed).empty()) continue;
    *bytes = std::max<uint64_t>(*bytes, obj->attr->cache.size);
    ++*instances;
  }
}

bool detect_with_hwloc(Topology* t, const std::set<int>& allowed) {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return false;
  std::unique_ptr<hwloc_topology, HwlocDeleter> topo(raw);
  if (hwloc_topology_load(raw) != 0) return false;

  // Cores, each with its allowed PUs; a topology without Core objects gets one core per PU.
  std::vector<CoreInfo> cores;
  const int n_cores = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_CORE);
  for (int i = 0; i < n_cores; ++i) {
    hwloc_obj_t core = hwloc_get_obj_by_type(raw, HWLOC_OBJ_CORE, i);
    CoreInfo info;
    info.os_index = static_cast<int>(core->os_index);
    info.cpus = intersect(bitmap_cpus(core->cpuset), allowed);
    if (!info.cpus.empty()) cores.push_back(std::move(info));
  }
  if (cores.empty()) {
    for (int c : allowed) cores.push_back(CoreInfo{-1, {c}});
  }

  // Each core goes to the first node that holds it: where several nodes share CPUs (HBM next
  // to DDR on Xeon Max, CXL memory) the later ones are memory-only here.
  std::set<int> placed;
  const int n_nodes = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n_nodes; ++i) {
    hwloc_obj_t node = hwloc_get_obj_by_type(raw, HWLOC_OBJ_NUMANODE, i);
    NumaNodeInfo info;
    info.os_index = static_cast<int>(node->os_index);
    info.memory_bytes = node->attr ? node->attr->numanode.local_memory : 0;
    for (const CoreInfo& core : cores) {
      const int first = core.cpus.front();
      if (!placed.count(first) && hwloc_bitmap_isset(node->cpuset, static_cast<unsigned>(first))) {
        info.cores.push_back(core);
        placed.insert(first);
      }
    }
    t->nodes.push_back(std::move(info));
  }
  // Cores no node claims (or no NUMA at all) go to the first node, so none is lost.
  if (t->nodes.empty()) t->nodes.push_back(NumaNodeInfo{});
  for (const CoreInfo& c : cores) {
    if (!placed.count(c.cpus.front())) t->nodes.front().cores.push_back(c);
  }

  int l1_instances = 0;
  cache_info(raw, HWLOC_OBJ_L1CACHE, allowed, &t->l1d_bytes, &l1_instances);
  cache_info(raw, HWLOC_OBJ_L2CACHE, allowed, &t->l2_bytes, &t->l2_instances);
  cache_info(raw, HWLOC_OBJ_L3CACHE, allowed, &t->l3_bytes, &t->l3_instances);
  t->source = "hwloc";
  return true;
}

}  // namespace

int NumaNodeInfo::logical_cpus() const {
  int n = 0;
  for (const CoreInfo& c : cores) n += static_cast<int>(c.cpus.size());
  return n;
}

int Topology::physical_cores() const {
  int n = 0;
  for (const NumaNodeInfo& node : nodes) n += static_cast<int>(node.cores.size());
  return n;
}

int Topology::node_of_cpu(int cpu) const {
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (const CoreInfo& core : nodes[i].cores) {
      if (std::find(core.cpus.begin(), core.cpus.end(), cpu) != core.cpus.end()) {
        return static_cast<int>(i);
      }
    }
  }
  return -1;
}

uint64_t meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) != 0 || line.size() <= key.size() ||
        line[key.size()] != ':') {
      continue;
    }
    std::istringstream fields(line.substr(key.size() + 1));
    uint64_t value = 0;
    std::string unit;
    if (!(fields >> value)) return 0;
    fields >> unit;
    return unit == "kB" ? value * 1024 : value;
  }
  return 0;
}

Topology detect_topology() {
  Topology t;
  std::vector<int> cpus = affinity_cpus();
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  t.machine_logical_cpus = online > 0 ? static_cast<int>(online) : static_cast<int>(cpus.size());
  if (cpus.empty()) {
    for (int c = 0; c < std::max(1, t.machine_logical_cpus); ++c) cpus.push_back(c);
  }
  const std::set<int> allowed(cpus.begin(), cpus.end());

  if (!detect_with_hwloc(&t, allowed)) {
    log_warn("hwloc could not read the topology; assuming one NUMA node, one core per CPU");
    t = Topology{};
    t.machine_logical_cpus = online > 0 ? static_cast<int>(online) : static_cast<int>(cpus.size());
    t.source = "fallback";
    t.nodes.push_back(NumaNodeInfo{});
    for (int c : cpus) t.nodes.front().cores.push_back(CoreInfo{-1, {c}});
  }
  // hwloc already drops CPUs outside our cgroup; the affinity mask may be narrower still.
  for (const NumaNodeInfo& node : t.nodes) {
    for (const CoreInfo& core : node.cores) {
      t.allowed_cpus.insert(t.allowed_cpus.end(), core.cpus.begin(), core.cpus.end());
    }
  }
  std::sort(t.allowed_cpus.begin(), t.allowed_cpus.end());

  uint64_t limit = 0, usage = 0;
  cgroup_memory(&limit, &usage);
  t.cgroup_memory_limit_bytes = limit;
  t.total_memory_bytes = meminfo_bytes("MemTotal");
  t.available_memory_bytes = meminfo_bytes("MemAvailable");
  if (limit > 0) {
    t.total_memory_bytes = std::min(t.total_memory_bytes, limit);
    t.available_memory_bytes =
        std::min(t.available_memory_bytes, limit > usage ? limit - usage : 0);
  }
  t.huge_page_bytes = meminfo_bytes("Hugepagesize");
  if (t.nodes.size() == 1 && t.nodes.front().memory_bytes == 0) {
    t.nodes.front().memory_bytes = t.total_memory_bytes;
  }
  return t;
}

Topology synthetic_topology(int nodes, int cores_per_node) {
  Topology t;
  t.source = "synthetic";
  std::vector<int> cpus = affinity_cpus();
  if (cpus.empty()) cpus.push_back(0);
  t.machine_logical_cpus = static_cast<int>(cpus.size());
  int next = 0;
  for (int n = 0; n < nodes; ++n) {
    NumaNodeInfo node;
    node.os_index = n;
    for (int c = 0; c < cores_per_node; ++c) {
      node.cores.push_back(CoreInfo{n * cores_per_node + c, {cpus[next++ % cpus.size()]}});
    }
    t.nodes.push_back(std::move(node));
  }
  t.allowed_cpus = cpus;
  t.total_memory_bytes = meminfo_bytes("MemTotal");
  t.available_memory_bytes = meminfo_bytes("MemAvailable");
  t.huge_page_bytes = meminfo_bytes("Hugepagesize");
  return t;
}

std::string format_binary_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  // Whole numbers print without decimals ("32 MiB"), others with one ("1.5 GiB").
  if (value == static_cast<double>(static_cast<uint64_t>(value))) {
    return fmt::format("{} {}", static_cast<uint64_t>(value), kUnits[unit]);
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::vector<int> sorted = cpus;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::string out;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", sorted[i]) : fmt::format("{}-{}", sorted[i], sorted[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace tandem
