// The gpu tests' gate (tests/gpu/gpu_gate.h) through the real test binaries, on any machine: with
// every device hidden (CUDA_VISIBLE_DEVICES empty: cudaErrorNoDevice, or no driver at all) they
// report "skipped" (77), and fail with TANDEM_REQUIRE_GPU=1; with the toolkit's stub libcuda
// loaded in place of a driver (what a broken driver install looks like to the runtime) they fail
// and name the error, host-only checks or not.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "tests/test_util.h"

namespace tandem {
namespace {

struct GateRun {
  int exit_code = -1;
  std::string out;  // stdout and stderr
};

// `env -u TANDEM_REQUIRE_GPU <env> BINARY`, so the outer environment (a GPU machine's scripts set
// TANDEM_REQUIRE_GPU) does not decide the outcome.
GateRun run_gpu_test(const std::string& name, const std::string& env) {
  const std::filesystem::path bin = std::filesystem::path(TANDEM_BINARY_DIR) / "tests" / name;
  EXPECT_TRUE(std::filesystem::exists(bin)) << bin;
  const std::string command = "env -u TANDEM_REQUIRE_GPU " + env + " '" + bin.string() + "' 2>&1";
  GateRun r;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  char buffer[512];
  while (fgets(buffer, sizeof buffer, pipe)) r.out += buffer;
  const int status = pclose(pipe);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

const char* const kGpuTests[] = {"test_gpu_cuda_info_test", "test_gpu_cuda_dequant_test"};

TEST(GpuGate, NoDeviceIsSkippedUnlessRequired) {
  for (const char* name : kGpuTests) {
    SCOPED_TRACE(name);
    const GateRun skip = run_gpu_test(name, "CUDA_VISIBLE_DEVICES=");
    EXPECT_EQ(skip.exit_code, 77) << skip.out;
    EXPECT_NE(skip.out.find("skipped"), std::string::npos) << skip.out;
#ifdef TANDEM_HAVE_CUDA
    // Either the runtime's own "no device" or no driver installed: never another error.
    EXPECT_TRUE(skip.out.find("cudaErrorNoDevice") != std::string::npos ||
                skip.out.find("no NVIDIA driver installed") != std::string::npos)
        << skip.out;
#else
    EXPECT_NE(skip.out.find("built without CUDA"), std::string::npos) << skip.out;
#endif
    const GateRun required = run_gpu_test(name, "CUDA_VISIBLE_DEVICES= TANDEM_REQUIRE_GPU=1");
    EXPECT_EQ(required.exit_code, 1) << required.out;
    EXPECT_NE(required.out.find("FAILED: gpu tests: "), std::string::npos) << required.out;
    EXPECT_NE(required.out.find("TANDEM_REQUIRE_GPU"), std::string::npos) << required.out;
  }
}

#if defined(TANDEM_HAVE_CUDA) && defined(TANDEM_CUDA_STUB_LIBRARY)
TEST(GpuGate, BrokenDriverFailsNamingTheError) {
  test::TempDir dir("gpu_gate");
  std::filesystem::copy_file(TANDEM_CUDA_STUB_LIBRARY, dir / "libcuda.so.1");
  for (const char* name : kGpuTests) {
    SCOPED_TRACE(name);
    const GateRun r = run_gpu_test(name, "LD_LIBRARY_PATH='" + dir.path().string() + "'");
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("FAILED: gpu tests: CUDA is unusable: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("cudaErrorStubLibrary"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("skipped"), std::string::npos) << r.out;
  }
}
#endif

}  // namespace
}  // namespace tandem
