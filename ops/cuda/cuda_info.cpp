// cuda_devices(): asks the (statically linked) CUDA runtime which devices exist. No GPU and no
// driver are expected states on CPU-only machines, so every failure becomes a reason string.
#include "ops/cuda/cuda_info.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

namespace tandem {
namespace {

std::string describe_count_error(cudaError_t err) {
  const char* name = cudaGetErrorName(err);
  switch (err) {
    case cudaErrorInsufficientDriver:
      return fmt::format("CUDA driver not found or older than CUDA {} ({})", cuda_runtime_version(),
                         name);
    case cudaErrorNoDevice:
      return fmt::format("no CUDA device found ({})", name);
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorSystemDriverMismatch:
      return fmt::format("CUDA driver and kernel module do not match ({})", name);
    default:
      return fmt::format("CUDA runtime unavailable: {} ({})", cudaGetErrorString(err), name);
  }
}

}  // namespace

std::string cuda_runtime_version() {
  return fmt::format("{}.{}", CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
}

std::vector<CudaDeviceInfo> cuda_devices(std::string* why_none) {
  std::vector<CudaDeviceInfo> devices;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count <= 0) {
    cudaGetLastError();  // reset the last-error slot so later calls start clean
    if (why_none)
      *why_none = err != cudaSuccess ? describe_count_error(err) : "no CUDA device found";
    return devices;
  }
  int previous = 0;
  const bool had_device = cudaGetDevice(&previous) == cudaSuccess;
  std::string failures;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    err = cudaGetDeviceProperties(&prop, i);
    size_t free_bytes = 0, total_bytes = 0;
    // cudaMemGetInfo needs the device current (it creates the primary context).
    if (err == cudaSuccess) err = cudaSetDevice(i);
    if (err == cudaSuccess) err = cudaMemGetInfo(&free_bytes, &total_bytes);
    if (err != cudaSuccess) {
      failures += fmt::format("{}device {}: {} ({})", failures.empty() ? "" : "; ", i,
                              cudaGetErrorString(err), cudaGetErrorName(err));
      cudaGetLastError();
      continue;
    }
    CudaDeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.cc_major = prop.major;
    info.cc_minor = prop.minor;
    info.total_bytes = total_bytes;
    info.free_bytes = free_bytes;
    info.sm_count = prop.multiProcessorCount;
    devices.push_back(std::move(info));
  }
  if (had_device) cudaSetDevice(previous);
  if (devices.empty() && why_none) *why_none = "no usable CUDA device: " + failures;
  return devices;
}

}  // namespace tandem
