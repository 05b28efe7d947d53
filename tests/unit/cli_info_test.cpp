// `tandem info` and `tandem roofline` through the real binary, checked against facts read here
// independently (sched_getaffinity, /proc/meminfo, sysfs, cpu_features()).
#include <gtest/gtest.h>
#include <sched.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/cpu_features.h"
#include "tests/test_util.h"

#if TANDEM_HAVE_CUDA
#include "ops/cuda/cuda_info.h"
#endif

namespace tandem {
namespace {

uint64_t proc_meminfo_kb(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string k;
  uint64_t v = 0;
  std::string rest;
  while (in >> k >> v) {
    std::getline(in, rest);
    if (k == key + ":") return v;
  }
  return 0;
}

int allowed_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  return CPU_COUNT(&set);
}

TEST(CliInfo, TextNamesTheMachinesFacts) {
  const test::CommandResult r = test::run_tandem("info");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string isa = isa_name(best_isa());
  EXPECT_NE(r.out.find("kernel ISA   " + isa + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(std::to_string(allowed_cpu_count()) + " logical CPUs usable"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("NUMA node 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("transparent huge pages: "), std::string::npos) << r.out;
#if !TANDEM_HAVE_CUDA
  EXPECT_NE(r.out.find("GPU          none (built without CUDA)"), std::string::npos) << r.out;
#endif
}

TEST(CliInfo, JsonAgreesWithTheKernel) {
  const test::CommandResult r = test::run_tandem("info --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kernel_isa"], isa_name(best_isa()));
  EXPECT_EQ(j["cpu"]["features"], cpu_feature_string(cpu_features()));
  EXPECT_EQ(j["topology"]["logical_cpus"].get<int>(), allowed_cpu_count());
  EXPECT_GE(j["topology"]["physical_cores"].get<int>(), 1);
  EXPECT_LE(j["topology"]["physical_cores"].get<int>(), allowed_cpu_count());
  int node_cpus = 0;
  for (const auto& node : j["topology"]["numa_nodes"]) node_cpus += node["logical_cpus"].get<int>();
  EXPECT_EQ(node_cpus, allowed_cpu_count());  // every usable CPU is in exactly one node

  const uint64_t total = j["memory"]["total_bytes"];
  if (j["memory"]["cgroup_limit_bytes"] == 0) {
    EXPECT_EQ(total, proc_meminfo_kb("MemTotal") * 1024);
  }
  EXPECT_GT(j["memory"]["available_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["memory"]["huge_page_bytes"].get<uint64_t>(), proc_meminfo_kb("Hugepagesize") * 1024);
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (std::getline(thp, line)) {
    const size_t open = line.find('['), close = line.find(']');
    EXPECT_EQ(j["memory"]["transparent_huge_pages"], line.substr(open + 1, close - open - 1));
  }
  EXPECT_GT(j["caches"]["l2_bytes"].get<uint64_t>(), 0u);
#if TANDEM_HAVE_CUDA
  std::string why;
  EXPECT_EQ(j["gpus"].size(), cuda_devices(&why).size());
#else
  EXPECT_TRUE(j["gpus"].empty());
  EXPECT_EQ(j["gpu_none_reason"], "built without CUDA");
#endif
}

TEST(CliRoofline, SmallJsonRunAndBadArguments) {
  const test::CommandResult r = test::run_tandem(
      "roofline --json --threads 1 --size-mb 48 --seconds 0.002 --repetitions 1 --no-sweep");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["threads"], 1);
  EXPECT_EQ(j["dram_buffer_bytes"], 48u << 20);
  EXPECT_GT(j["dram_read_gbs"].get<double>(), 0);
  EXPECT_GT(j["int8_gops"].get<double>(), 0);
  EXPECT_EQ(j["isa"], isa_name(best_isa()));

  // The table: the bf16 dot row has a peak on AVX-512 BF16 CPUs and says what applies instead on
  // the others.
  const test::CommandResult t = test::run_tandem(
      "roofline --threads 1 --size-mb 48 --seconds 0.002 --repetitions 1 --no-sweep");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  const bool bf16 = best_isa() >= Isa::kAvx512Bf16;
  EXPECT_EQ(t.out.find("the fp32 FMA peak applies") == std::string::npos, bf16) << t.out;
  EXPECT_EQ(j["bf16_gflops"].get<double>() > 0, bf16) << r.out;

  const test::CommandResult bad = test::run_tandem("roofline --seconds -1");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--seconds -1"), std::string::npos) << bad.err;
  const test::CommandResult huge = test::run_tandem("roofline --size-mb 1000000000");
  EXPECT_EQ(huge.exit_code, 1);
  EXPECT_NE(huge.err.find("--size-mb"), std::string::npos) << huge.err;
  const test::CommandResult threads = test::run_tandem("roofline --threads -3");
  EXPECT_EQ(threads.exit_code, 1);
  EXPECT_NE(threads.err.find("--threads: -3 is not a thread count"), std::string::npos)
      << threads.err;
}

}  // namespace
}  // namespace tandem
