#include "core/cpu_features.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace tandem {
namespace {

// The features of real CPU generations (their published ISA extensions), and the level each gets.
CpuFeatures avx2_cpu() {
  CpuFeatures f;
  f.avx2 = f.fma = f.f16c = f.bmi2 = true;
  return f;
}

CpuFeatures skylake_sp() {
  CpuFeatures f = avx2_cpu();
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = true;
  return f;
}

CpuFeatures ice_lake_sp() {  // Cascade Lake has VNNI too, without VBMI / BITALG
  CpuFeatures f = skylake_sp();
  f.avx512_vnni = f.avx512_vbmi = f.avx512_bitalg = true;
  return f;
}

CpuFeatures zen4() {
  CpuFeatures f = ice_lake_sp();
  f.avx512_bf16 = true;
  return f;
}

CpuFeatures sapphire_rapids() {
  CpuFeatures f = zen4();
  f.amx_tile = f.amx_int8 = f.amx_bf16 = true;
  return f;
}

TEST(CpuFeatures, LevelOfEachGeneration) {
  EXPECT_EQ(isa_level(CpuFeatures{}), Isa::kScalar);
  EXPECT_EQ(isa_level(avx2_cpu()), Isa::kAvx2);
  EXPECT_EQ(isa_level(skylake_sp()), Isa::kAvx512);
  // VNNI without BF16 is its own level: the integer kernels (Q4_K x16, x4 rows, INT4 / INT8)
  // run there, the BF16 ones do not.
  EXPECT_EQ(isa_level(ice_lake_sp()), Isa::kAvx512Vnni);
  EXPECT_EQ(isa_level(zen4()), Isa::kAvx512Bf16);
  EXPECT_EQ(isa_level(sapphire_rapids()), Isa::kAmx);
  // A level needs everything below it: BF16 without VNNI, AMX without BF16, AVX-512 without
  // F16C stay lower.
  CpuFeatures f = skylake_sp();
  f.avx512_bf16 = true;
  EXPECT_EQ(isa_level(f), Isa::kAvx512);
  f = ice_lake_sp();
  f.amx_tile = f.amx_int8 = f.amx_bf16 = true;
  EXPECT_EQ(isa_level(f), Isa::kAvx512Vnni);
  f = skylake_sp();
  f.f16c = false;
  EXPECT_EQ(isa_level(f), Isa::kScalar);
}

TEST(CpuFeatures, NamesRoundTripInLadderOrder) {
  std::set<std::string> names;
  for (int i = 0; i <= static_cast<int>(Isa::kAmx); ++i) {
    const auto isa = static_cast<Isa>(i);
    Isa back;
    ASSERT_TRUE(parse_isa(isa_name(isa), &back)) << isa_name(isa);
    EXPECT_EQ(back, isa);
    names.insert(isa_name(isa));
  }
  EXPECT_EQ(names, (std::set<std::string>{"scalar", "avx2", "avx512", "avx512_vnni", "avx512_bf16",
                                          "amx"}));
  Isa unused;
  EXPECT_FALSE(parse_isa("avx512vnni", &unused));
}

// The CPUID decoding agrees with the kernel's own flags in /proc/cpuinfo, and the level this
// process runs at is the one those features give (capped by TANDEM_ISA where it is set).
TEST(CpuFeatures, DetectionMatchesProcCpuinfo) {
  std::ifstream in("/proc/cpuinfo");
  ASSERT_TRUE(in.good()) << "/proc/cpuinfo is not readable";
  std::string line;
  std::set<std::string> flags;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string w; words >> w;) flags.insert(w);
    break;
  }
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(f.avx2, flags.count("avx2") == 1);
  EXPECT_EQ(f.fma, flags.count("fma") == 1);
  EXPECT_EQ(f.avx512f, flags.count("avx512f") == 1);
  EXPECT_EQ(f.avx512bw, flags.count("avx512bw") == 1);
  EXPECT_EQ(f.avx512_vnni, flags.count("avx512_vnni") == 1);
  EXPECT_EQ(f.avx512_bf16, flags.count("avx512_bf16") == 1);
  EXPECT_EQ(f.avx512_vbmi, flags.count("avx512vbmi") == 1);
  EXPECT_EQ(f.avx512_bitalg, flags.count("avx512_bitalg") == 1);
  EXPECT_EQ(f.gfni, f.avx512f && flags.count("gfni") == 1);
  Isa cap = Isa::kAmx;
  if (const char* env = std::getenv("TANDEM_ISA")) {
    ASSERT_TRUE(parse_isa(env, &cap)) << env;
  }
  EXPECT_EQ(best_isa(), std::min(isa_level(f), cap));
  const std::vector<Isa> all = supported_isas();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front(), Isa::kScalar);
  EXPECT_EQ(all.back(), best_isa());
  EXPECT_EQ(all.size(), static_cast<size_t>(best_isa()) + 1);
}

}  // namespace
}  // namespace tandem
