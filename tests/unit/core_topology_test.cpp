// Topology from hwloc, checked against what the kernel says directly (sched_getaffinity,
// /sys/devices/system/cpu, /proc/meminfo): two independent readings of the same facts.
#include <gtest/gtest.h>
#include <sched.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/topology.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string read_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}
std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.empty()) continue;
    const size_t dash = part.find('-');
    const int lo = std::stoi(part.substr(0, dash));
    const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  return cpus;
}

uint64_t parse_cache_size(const std::string& text) {  // "1024K", "32768K", "2M"
  uint64_t n = std::stoull(text);
  if (text.back() == 'K') n <<= 10;
  if (text.back() == 'M') n <<= 20;
  return n;
}

std::vector<int> affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

TEST(Topology, CpusAreExactlyTheAllowedOnesGroupedIntoCores) {
  const Topology t = detect_topology();
  EXPECT_EQ(t.source, "hwloc");
  EXPECT_EQ(t.allowed_cpus, affinity());
  EXPECT_EQ(t.logical_cpus(), static_cast<int>(affinity().size()));
  EXPECT_GE(t.machine_logical_cpus, t.logical_cpus());
  ASSERT_GE(t.numa_nodes(), 1);
  ASSERT_GE(t.physical_cores(), 1);
  EXPECT_LE(t.physical_cores(), t.logical_cpus());

  std::multiset<int> placed;
  for (size_t n = 0; n < t.nodes.size(); ++n) {
    for (const CoreInfo& core : t.nodes[n].cores) {
      ASSERT_FALSE(core.cpus.empty());
      for (int cpu : core.cpus) {
        placed.insert(cpu);
        EXPECT_EQ(t.node_of_cpu(cpu), static_cast<int>(n));
        // The kernel's view of which CPUs share this core.
        const fs::path siblings = fs::path("/sys/devices/system/cpu") /
                                  ("cpu" + std::to_string(cpu)) / "topology" /
                                  "thread_siblings_list";
        if (fs::exists(siblings)) {
          std::vector<int> expected;
          const std::set<int> allowed(t.allowed_cpus.begin(), t.allowed_cpus.end());
          for (int s : parse_cpu_list(read_line(siblings))) {
            if (allowed.count(s)) expected.push_back(s);
          }
          EXPECT_EQ(core.cpus, expected) << "cpu " << cpu;
        }
      }
    }
  }
  // Every allowed CPU is in exactly one core.
  EXPECT_EQ(std::vector<int>(placed.begin(), placed.end()), t.allowed_cpus);
  EXPECT_EQ(t.node_of_cpu(1 << 20), -1);
}

TEST(Topology, NumaNodesMatchSysfs) {
  const Topology t = detect_topology();
  int sysfs_nodes = 0;
  std::map<int, std::vector<int>> node_cpus;
  if (fs::exists("/sys/devices/system/node")) {
    for (const auto& entry : fs::directory_iterator("/sys/devices/system/node")) {
      const std::string name = entry.path().filename();
      if (name.rfind("node", 0) != 0 || name.size() < 5 || !isdigit(name[4])) continue;
      ++sysfs_nodes;
      node_cpus[std::stoi(name.substr(4))] = parse_cpu_list(read_line(entry.path() / "cpulist"));
    }
  }
  EXPECT_EQ(t.numa_nodes(), std::max(1, sysfs_nodes));
  for (const NumaNodeInfo& node : t.nodes) {
    EXPECT_GT(node.memory_bytes, 0u);
    if (node_cpus.count(node.os_index)) {
      const std::set<int> local(node_cpus[node.os_index].begin(), node_cpus[node.os_index].end());
      for (const CoreInfo& core : node.cores) {
        for (int cpu : core.cpus) EXPECT_TRUE(local.count(cpu)) << "cpu " << cpu;
      }
    }
  }
}

TEST(Topology, CachesMatchSysfs) {
  const Topology t = detect_topology();
  EXPECT_GT(t.l1d_bytes, 0u);
  EXPECT_GT(t.l2_bytes, t.l1d_bytes);
  EXPECT_GE(t.l2_instances, 1);
  const fs::path cache = fs::path("/sys/devices/system/cpu") /
                         ("cpu" + std::to_string(t.allowed_cpus.front())) / "cache";
  ASSERT_TRUE(fs::exists(cache)) << "no " << cache;
  std::map<int, uint64_t> sizes;
  for (const auto& entry : fs::directory_iterator(cache)) {
    if (entry.path().filename().string().rfind("index", 0) != 0) continue;
    if (read_line(entry.path() / "type") == "Instruction") continue;
    sizes[std::stoi(read_line(entry.path() / "level"))] =
        parse_cache_size(read_line(entry.path() / "size"));
  }
  EXPECT_EQ(t.l1d_bytes, sizes[1]);
  EXPECT_EQ(t.l2_bytes, sizes[2]);
  EXPECT_EQ(t.l3_bytes, sizes[3]);  // 0 on both sides where there is no L3
  if (t.l3_bytes > 0) {
    EXPECT_GE(t.l3_instances, 1);
  }
}

TEST(Topology, MemoryFromProcMeminfo) {
  const Topology t = detect_topology();
  // Read /proc/meminfo here by hand, independently of meminfo_bytes().
  std::ifstream in("/proc/meminfo");
  std::map<std::string, uint64_t> kb;
  std::string key;
  uint64_t value;
  std::string unit_line;
  while (in >> key >> value) {
    std::getline(in, unit_line);
    kb[key.substr(0, key.size() - 1)] = value;
  }
  ASSERT_GT(kb["MemTotal"], 0u);
  EXPECT_EQ(meminfo_bytes("MemTotal"), kb["MemTotal"] * 1024);
  EXPECT_EQ(meminfo_bytes("NoSuchKey"), 0u);
  EXPECT_EQ(meminfo_bytes("MemTot"), 0u);  // a prefix is not the key
  if (t.cgroup_memory_limit_bytes == 0) {
    EXPECT_EQ(t.total_memory_bytes, kb["MemTotal"] * 1024);
  } else {
    EXPECT_LE(t.total_memory_bytes, t.cgroup_memory_limit_bytes);
  }
  EXPECT_GT(t.available_memory_bytes, 0u);
  EXPECT_LE(t.available_memory_bytes, t.total_memory_bytes);
  EXPECT_EQ(t.huge_page_bytes, kb["Hugepagesize"] * 1024);
}

TEST(Topology, SyntheticTopologyHasTheRequestedShape) {
  const Topology t = synthetic_topology(2, 3);
  EXPECT_EQ(t.numa_nodes(), 2);
  EXPECT_EQ(t.physical_cores(), 6);
  EXPECT_EQ(t.nodes[1].os_index, 1);
  const std::vector<int> allowed = affinity();
  for (const NumaNodeInfo& node : t.nodes) {
    for (const CoreInfo& core : node.cores) {
      ASSERT_EQ(core.cpus.size(), 1u);
      EXPECT_NE(std::find(allowed.begin(), allowed.end(), core.cpus[0]), allowed.end());
    }
  }
  EXPECT_EQ(t.nodes[0].cores[0].cpus[0], allowed[0]);
  EXPECT_EQ(t.nodes[0].logical_cpus(), 3);
}

TEST(Topology, Formatting) {
  EXPECT_EQ(format_binary_bytes(0), "0 B");
  EXPECT_EQ(format_binary_bytes(1023), "1023 B");
  EXPECT_EQ(format_binary_bytes(1024), "1 KiB");
  EXPECT_EQ(format_binary_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_binary_bytes(uint64_t{32} << 20), "32 MiB");
  EXPECT_EQ(format_binary_bytes(uint64_t{3} << 39), "1.5 TiB");
  EXPECT_EQ(format_cpu_list({}), "");
  EXPECT_EQ(format_cpu_list({5}), "5");
  EXPECT_EQ(format_cpu_list({3, 0, 1, 2, 8, 10, 11, 11}), "0-3,8,10-11");
  EXPECT_EQ(parse_cpu_list(format_cpu_list({0, 2, 4, 5, 6})), (std::vector<int>{0, 2, 4, 5, 6}));
}

}  // namespace
}  // namespace tandem
