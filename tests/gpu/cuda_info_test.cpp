// cuda_devices() and cuda_status() on a GPU machine: the list is sane and agrees with the runtime,
// and hidden devices are "no device" with a reason (what the CLI prints on CPU-only machines).
// Without a device the test is skipped, with a broken CUDA it fails (gpu_gate.h).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <sys/wait.h>

#include "ops/cuda/cuda_info.h"
#endif
#include "tests/gpu/gpu_gate.h"

#ifdef TANDEM_HAVE_CUDA
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

TEST(CudaInfo, StatusAgreesWithTheDeviceList) {
  const CudaStatus s = cuda_status();
  EXPECT_EQ(s.presence, CudaPresence::kDevices) << s.detail;
  EXPECT_EQ(s.device_count, static_cast<int>(cuda_devices(nullptr).size()));
  EXPECT_EQ(s.detail, "");
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

// A process that sees no device (CUDA_VISIBLE_DEVICES empty) gets an empty list and a reason,
// and cuda_status() calls it "no device" (cudaErrorNoDevice: the gpu tests would skip there).
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
  EXPECT_NE(out.find("status: no device, 0 devices, no CUDA device found (cudaErrorNoDevice)"),
            std::string::npos)
      << out;
}

}  // namespace
}  // namespace tandem
#endif

int main(int argc, char** argv) {
#ifdef TANDEM_HAVE_CUDA
  if (argc > 1 && std::string(argv[1]) == "--print-devices") {  // child of HiddenDevices...
    std::string why;
    const std::vector<tandem::CudaDeviceInfo> devices = tandem::cuda_devices(&why);
    const tandem::CudaStatus s = tandem::cuda_status();
    const char* presence = s.presence == tandem::CudaPresence::kDevices    ? "devices"
                           : s.presence == tandem::CudaPresence::kNoDevice ? "no device"
                                                                           : "error";
    std::printf("devices: %zu\nreason: %s\nstatus: %s, %d devices, %s\n", devices.size(),
                why.c_str(), presence, s.device_count, s.detail.c_str());
    return 0;
  }
#endif
  return tandem::test::gpu_test_main(argc, argv);
}
