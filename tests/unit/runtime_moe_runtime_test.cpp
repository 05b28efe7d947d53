// --cpu-experts auto (runtime/moe_runtime.h resolve_cpu_experts): which format each machine and
// model gets, from the facts alone, against the rule written in the header.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/weights.h"
#include "runtime/moe_runtime.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

CpuExpertsFacts fitting_gguf_on_zen5() {
  CpuExpertsFacts f;
  f.gguf = true;
  f.model_bytes = 10 * kGiB;
  f.available_bytes = 20 * kGiB;
  f.isa = Isa::kAvx512Bf16;
  return f;
}

TEST(CpuExpertsAuto, RepacksAFittingGgufOnAnAvx512VnniCpu) {
  BackendOptions o;
  EXPECT_EQ(o.cpu_experts, "auto");  // the default
  std::string why;
  EXPECT_EQ(resolve_cpu_experts(o, fitting_gguf_on_zen5(), &why), "repack");
  EXPECT_NE(why.find("AVX-512 VNNI"), std::string::npos) << why;
  CpuExpertsFacts f = fitting_gguf_on_zen5();
  f.isa = Isa::kAmx;  // a higher level has the kernels too
  EXPECT_EQ(resolve_cpu_experts(o, f), "repack");
  f.isa = Isa::kAvx512Vnni;  // and VNNI without BF16 (Cascade Lake, Ice Lake) has them all
  EXPECT_EQ(resolve_cpu_experts(o, f), "repack");
  f.available_bytes = 0;  // MemAvailable unknown: assumed to fit, as LoadMode::kCopy does
  EXPECT_EQ(resolve_cpu_experts(o, f), "repack");
  // Exactly 90% of the memory available still fits; one byte more does not.
  f.available_bytes = 20 * kGiB;
  f.model_bytes = f.available_bytes / 10 * 9;
  EXPECT_EQ(resolve_cpu_experts(o, f), "repack");
  f.model_bytes += 1;
  EXPECT_EQ(resolve_cpu_experts(o, f, &why), "native");
  EXPECT_NE(why.find("does not fit"), std::string::npos) << why;
}

TEST(CpuExpertsAuto, KeepsTheStoredWeightsElsewhere) {
  const BackendOptions o;
  std::string why;
  CpuExpertsFacts f = fitting_gguf_on_zen5();
  f.gguf = false;
  EXPECT_EQ(resolve_cpu_experts(o, f, &why), "native");
  EXPECT_NE(why.find("GGUF"), std::string::npos) << why;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    f = fitting_gguf_on_zen5();
    f.isa = isa;
    EXPECT_EQ(resolve_cpu_experts(o, f, &why), "native") << isa_name(isa);
    EXPECT_NE(why.find(isa_name(isa)), std::string::npos) << why;
  }
  f = fitting_gguf_on_zen5();
  f.thp_never = true;
  EXPECT_EQ(resolve_cpu_experts(o, f, &why), "native");
  EXPECT_NE(why.find("huge pages"), std::string::npos) << why;
  BackendOptions mapped;
  mapped.mmap = true;
  EXPECT_EQ(resolve_cpu_experts(mapped, fitting_gguf_on_zen5(), &why), "native");
  EXPECT_NE(why.find("--mmap"), std::string::npos) << why;
  // --mmap is the reason named on any CPU (the user's choice comes first).
  f = fitting_gguf_on_zen5();
  f.isa = Isa::kAvx2;
  EXPECT_EQ(resolve_cpu_experts(mapped, f, &why), "native");
  EXPECT_NE(why.find("--mmap"), std::string::npos) << why;
}

TEST(CpuExpertsAuto, AnExplicitFormatIsKept) {
  CpuExpertsFacts small = fitting_gguf_on_zen5();
  CpuExpertsFacts none;  // no GGUF, scalar CPU, nothing available
  for (const char* f : {"native", "repack", "int8", "int4", "bf16", "int9"}) {
    BackendOptions o;
    o.cpu_experts = f;
    std::string why = "unchanged";
    EXPECT_EQ(resolve_cpu_experts(o, small, &why), f);
    EXPECT_EQ(resolve_cpu_experts(o, none, &why), f);
    EXPECT_EQ(why, "unchanged");
    if (std::string(f) != "int9") {
      EXPECT_EQ(resolve_backend_options(o, "/nonexistent.gguf").cpu_experts, f);
    }
  }
  // resolve_backend_options checks the values before anything loads, naming the flag.
  auto error_of = [](const BackendOptions& o) {
    try {
      resolve_backend_options(o, "/nonexistent.gguf");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  BackendOptions bad;
  bad.cpu_experts = "int9";
  EXPECT_NE(error_of(bad).find("--cpu-experts 'int9'"), std::string::npos) << error_of(bad);
}

// The runtime's named choices are parsed where the flags are read: a word not in the list is an
// error naming the flag, the word and the list; each word names its enum back.
TEST(MoeRuntime, ChoicesParseTheirWordsAndNameTheFlag) {
  try {
    rt::parse_choice<rt::PolicyKind>("fastest");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_STREQ(e.what(),
                 "--policy 'fastest' is not one of: static | fiddler | hybrimoe | dali | optimal");
  }
  EXPECT_THROW(rt::parse_choice<rt::Accel>("tpu"), Error);
  EXPECT_THROW(rt::parse_choice<rt::CacheKind>("LRU"), Error);  // words are lower case
  EXPECT_EQ(rt::parse_choice<rt::Accel>("host"), rt::Accel::kHost);
  EXPECT_EQ(rt::parse_choice<rt::PrefetchKind>("residual"), rt::PrefetchKind::kResidual);
  for (const auto& [kind, word] : rt::Choices<rt::CacheKind>::kWords) {
    EXPECT_EQ(rt::parse_choice<rt::CacheKind>(word), kind);
    EXPECT_EQ(rt::choice_name(kind), word);
  }
  EXPECT_EQ(rt::choice_words<rt::PrefetchKind>(), "none | gate | residual");
}

TEST(CpuExpertsAuto, FactsOfARealFile) {
  const auto path = test::data_path("golden/deepseek3.gguf");
  const CpuExpertsFacts f = cpu_experts_facts(path);
  EXPECT_TRUE(f.gguf);
  EXPECT_EQ(f.model_bytes, std::filesystem::file_size(path));
  EXPECT_EQ(f.isa, best_isa());
  EXPECT_FALSE(cpu_experts_facts(test::data_path("golden")).gguf);  // a directory
  // resolve_backend_options replaces auto and says why.
  const BackendOptions r = resolve_backend_options(BackendOptions{}, path);
  EXPECT_NE(r.cpu_experts, "auto");
  EXPECT_EQ(r.cpu_experts, resolve_cpu_experts(BackendOptions{}, f));
  EXPECT_FALSE(r.cpu_experts_why.empty());
}

// Flags checked against the model before anything is built: more pinned experts than the model
// has, an accelerator for a model without MoE layers (a message, not an internal check).
TEST(MoeRuntime, FlagsAreCheckedAgainstTheModel) {
  LoadedModel lm = load_model(test::data_path("golden/deepseek3.gguf"));
  ThreadingContext threading(ThreadingOptions{1, false, 20});
  auto error_of = [&](const BackendOptions& o) {
    try {
      MoeRuntime moe(lm, o, threading);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  BackendOptions o;
  o.cpu_experts = "native";
  o.accel = rt::Accel::kHost;
  o.gpu_experts = 100000;
  EXPECT_NE(error_of(o).find("--gpu-experts 100000: the model has"), std::string::npos)
      << error_of(o);
  o.gpu_experts = 0;
  o.link = "0.000001";
  EXPECT_NE(error_of(o).find("--link '0.000001'"), std::string::npos) << error_of(o);
  o.link = "pcie4";
  for (LayerWeights& l : lm.layers) l.moe = false;
  EXPECT_NE(error_of(o).find("--accel host: "), std::string::npos) << error_of(o);
  EXPECT_NE(error_of(o).find("has no MoE layer"), std::string::npos) << error_of(o);
}

}  // namespace
}  // namespace tandem
