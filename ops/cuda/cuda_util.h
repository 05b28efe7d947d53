// Host-side helpers for code that calls the CUDA runtime: turning a cudaError_t into a
// tandem::Error that names the failed call, and an owning device buffer. Kernels and launchers do
// not use these (they return cudaError_t, STYLE.md #8); the layers above them do.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/error.h"

namespace tandem {

// Throws Error naming `what` (the call) and the CUDA error; out-of-memory is kResource, anything
// else kInternal (a launch with bad arguments or a dead device is not the user's input at fault).
[[noreturn]] void cuda_fail(cudaError_t err, const char* what, const char* file, int line);

inline void cuda_check(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess) [[unlikely]]
    cuda_fail(err, what, file, line);
}

}  // namespace tandem

// TD_CUDA_CHECK(cudaMemcpy(...)): throws tandem::Error with the expression text when it fails.
#define TD_CUDA_CHECK(expr) ::tandem::cuda_check((expr), #expr, __FILE__, __LINE__)

namespace tandem {

// An owning allocation of device memory on the device that is current at construction. Move-only;
// the memory is freed on the same device. Allocation failure throws Error(kResource).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)),
        device_(other.device_) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      device_ = other.device_;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  int device() const { return device_; }
  explicit operator bool() const { return data_ != nullptr; }

  // Synchronous copies of `bytes` at byte `offset` of the buffer; throw on error.
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;
  void fill_zero();

  void reset();  // frees now; never throws (a failed free at teardown is only logged)

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
};

}  // namespace tandem
