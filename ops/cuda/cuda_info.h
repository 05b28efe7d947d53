// Which CUDA devices this process can use, asked of the CUDA runtime once per call. Plain C++
// (no CUDA headers) so that runtime/ and tools/ can include it; it exists only in builds with
// TANDEM_HAVE_CUDA. A machine without a driver or a GPU is a normal case, not an error: the list
// is empty and `why_none` says why, so callers fall back to the host device with one clear line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct CudaDeviceInfo {
  int index = 0;  // CUDA ordinal (after CUDA_VISIBLE_DEVICES)
  std::string name;
  int cc_major = 0, cc_minor = 0;            // compute capability
  uint64_t total_bytes = 0, free_bytes = 0;  // device memory, free as of the call
  int sm_count = 0;
};

// Every visible device. Never throws and never aborts: when the runtime reports no driver, no
// device or any other error, returns an empty list and, if why_none is given, sets it to a reason
// such as "CUDA driver not found (cudaErrorInsufficientDriver)". Devices that fail to answer are
// left out (the reason names them when the list ends up empty).
std::vector<CudaDeviceInfo> cuda_devices(std::string* why_none);

// Whether this process has CUDA devices, for callers that must tell a machine without a GPU from
// a GPU that does not work (the gpu tests skip the first and fail the second).
enum class CudaPresence {
  kDevices,   // device_count > 0 and every device answered
  kNoDevice,  // the runtime reports cudaErrorNoDevice (none, or CUDA_VISIBLE_DEVICES hides them),
              // or no NVIDIA driver is installed at all (libcuda.so.1 cannot be loaded: the
              // runtime then says cudaErrorInsufficientDriver, but there is no GPU to drive)
  kError,     // anything else: a driver older than the runtime, a driver / kernel module
              // mismatch, the stub libcuda, a device that fails to answer, ...
};

struct CudaStatus {
  CudaPresence presence = CudaPresence::kNoDevice;
  int device_count = 0;
  // kNoDevice / kError: what the runtime said, with the error's name, e.g. "CUDA driver and
  // kernel module do not match (cudaErrorSystemDriverMismatch)".
  std::string detail;
};

// Asks the runtime once (never throws); leaves the current device as it was.
CudaStatus cuda_status();

// The version of the CUDA runtime this binary was built with, e.g. "13.0".
std::string cuda_runtime_version();

}  // namespace tandem
