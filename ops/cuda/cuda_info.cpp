// cuda_devices(): asks the (statically linked) CUDA runtime which devices exist. No GPU and no
// driver are expected states on CPU-only machines, so every failure becomes a reason string.
#include "ops/cuda/cuda_info.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
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

// The CUDA runtime loads the driver API from libcuda.so.1; without it (no NVIDIA driver installed)
// it reports cudaErrorInsufficientDriver, the same error as for a driver that is too old.
bool driver_library_present() {
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (lib == nullptr) return false;
  dlclose(lib);
  return true;
}

// Every device's properties and free memory; devices that fail to answer are listed in *failures.
std::vector<CudaDeviceInfo> query_devices(int count, std::string* failures) {
  std::vector<CudaDeviceInfo> devices;
  int previous = 0;
  const bool had_device = cudaGetDevice(&previous) == cudaSuccess;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    cudaError_t err = cudaGetDeviceProperties(&prop, i);
    size_t free_bytes = 0, total_bytes = 0;
    // cudaMemGetInfo needs the device current (it creates the primary context).
    if (err == cudaSuccess) err = cudaSetDevice(i);
    if (err == cudaSuccess) err = cudaMemGetInfo(&free_bytes, &total_bytes);
    if (err != cudaSuccess) {
      *failures += fmt::format("{}device {}: {} ({})", failures->empty() ? "" : "; ", i,
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
  return devices;
}

}  // namespace

CudaStatus cuda_status() {
  CudaStatus s;
  const cudaError_t err = cudaGetDeviceCount(&s.device_count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    s.device_count = 0;
    if (err == cudaErrorInsufficientDriver && !driver_library_present()) {
      s.presence = CudaPresence::kNoDevice;
      s.detail = fmt::format("no NVIDIA driver installed (libcuda.so.1 not found; {})",
                             cudaGetErrorName(err));
    } else {
      s.presence = err == cudaErrorNoDevice ? CudaPresence::kNoDevice : CudaPresence::kError;
      s.detail = describe_count_error(err);
    }
    return s;
  }
  if (s.device_count <= 0) {
    s.presence = CudaPresence::kNoDevice;
    s.detail = "no CUDA device found (count 0)";
    return s;
  }
  std::string failures;
  query_devices(s.device_count, &failures);
  s.presence = failures.empty() ? CudaPresence::kDevices : CudaPresence::kError;
  s.detail = failures;
  return s;
}

std::string cuda_runtime_version() {
  return fmt::format("{}.{}", CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
}

std::vector<CudaDeviceInfo> cuda_devices(std::string* why_none) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count <= 0) {
    cudaGetLastError();  // reset the last-error slot so later calls start clean
    if (why_none)
      *why_none = err != cudaSuccess ? describe_count_error(err) : "no CUDA device found";
    return {};
  }
  std::string failures;
  std::vector<CudaDeviceInfo> devices = query_devices(count, &failures);
  if (devices.empty() && why_none) *why_none = "no usable CUDA device: " + failures;
  return devices;
}

}  // namespace tandem
