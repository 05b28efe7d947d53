// cuda_devices() on a GPU machine: the list is sane and agrees with the runtime. Without CUDA in
// the build or without a device the test is skipped (exit 77), after checking that the empty
// list comes with a reason, which is what the CLI prints on CPU-only machines.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <sys/wait.h>

#include "ops/cuda/cuda_info.h"

namespace tandem {
namespace {

TEST(CudaInfo, DevicesAreSane) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  std::string why = "unchanged";
  const std::vector<CudaDeviceInfo> devices = cuda_devices(&why);
  ASSERT_EQ(static_cast<int>(devices.size()), count);
  EXPECT_EQ(why, "unchanged");  // only set when the list is empty
  for (size_t i = 0; i < devices.size(); ++i) {
    const CudaDeviceInfo& d = devices[i];
    SCOPED_TRACE(d.name);
    EXPECT_EQ(d.index, static_cast<int>(i));
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.free_bytes, 0u);
    EXPECT_GE(d.total_bytes, d.free_bytes);
    EXPECT_GT(d.sm_count, 0);
    EXPECT_GE(d.cc_major, 1);

    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, d.index), cudaSuccess);
    EXPECT_EQ(d.name, prop.name);
    EXPECT_EQ(d.cc_major, prop.major);
    EXPECT_EQ(d.cc_minor, prop.minor);
    EXPECT_EQ(d.sm_count, prop.multiProcessorCount);
    EXPECT_EQ(d.total_bytes, prop.totalGlobalMem);
  }
}

TEST(CudaInfo, KeepsTheCurrentDevice) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  const int chosen = count - 1;
  ASSERT_EQ(cudaSetDevice(chosen), cudaSuccess);
  cuda_devices(nullptr);
  int now = -1;
  ASSERT_EQ(cudaGetDevice(&now), cudaSuccess);
  EXPECT_EQ(now, chosen);
}

// A process that sees no device (CUDA_VISIBLE_DEVICES empty) gets an empty list and a reason.
// It must be a fresh process: the runtime reads the variable once, at initialization.
TEST(CudaInfo, HiddenDevicesGiveAReason) {
  // Resolved here: inside the shell that popen starts, /proc/self/exe would be the shell.
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string command = "CUDA_VISIBLE_DEVICES= '" + self + "' --print-devices 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buffer[256];
  while (fgets(buffer, sizeof buffer, pipe)) out += buffer;
  const int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_NE(out.find("devices: 0"), std::string::npos) << out;
  EXPECT_NE(out.find("no CUDA device"), std::string::npos) << out;
}

}  // namespace
}  // namespace tandem
#endif

int main(int argc, char** argv) {
#ifndef TANDEM_HAVE_CUDA
  std::printf("gpu tests: built without CUDA, skipped\n");
  return 77;
#else
  std::string why;
  const std::vector<tandem::CudaDeviceInfo> devices = tandem::cuda_devices(&why);
  if (argc > 1 && std::string(argv[1]) == "--print-devices") {  // child of HiddenDevices...
    std::printf("devices: %zu\nreason: %s\n", devices.size(), why.c_str());
    return 0;
  }
  if (devices.empty()) {
    if (why.empty()) {
      std::printf("FAILED: cuda_devices() returned no device and no reason\n");
      return 1;
    }
    std::printf("gpu tests: %s, skipped\n", why.c_str());
    return 77;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
#endif
}
