// DeviceBuffer and the CUDA error helper (ops/cuda/cuda_util.h).
#include "ops/cuda/cuda_util.h"

#include "core/log.h"

namespace tandem {

void cuda_fail(cudaError_t err, const char* what, const char* file, int line) {
  cudaGetLastError();  // a non-sticky error must not be reported again by the next call
  const ErrorKind kind =
      err == cudaErrorMemoryAllocation ? ErrorKind::kResource : ErrorKind::kInternal;
  fail(kind, "CUDA error in {} ({}:{}): {} ({})", what, file, line, cudaGetErrorString(err),
       cudaGetErrorName(err));
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  TD_CUDA_CHECK(cudaGetDevice(&device_));
  if (bytes == 0) return;
  const cudaError_t err = cudaMalloc(&data_, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    data_ = nullptr;
    bytes_ = 0;
    fail(ErrorKind::kResource, "cannot allocate {} bytes on CUDA device {}: {} ({})", bytes,
         device_, cudaGetErrorString(err), cudaGetErrorName(err));
  }
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  TD_CHECK(offset <= bytes_ && bytes <= bytes_ - offset, "upload of {} bytes at {} into {}", bytes,
           offset, bytes_);
  TD_CUDA_CHECK(
      cudaMemcpy(static_cast<char*>(data_) + offset, host, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  TD_CHECK(offset <= bytes_ && bytes <= bytes_ - offset, "download of {} bytes at {} from {}",
           bytes, offset, bytes_);
  TD_CUDA_CHECK(
      cudaMemcpy(host, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::fill_zero() {
  if (bytes_) TD_CUDA_CHECK(cudaMemset(data_, 0, bytes_));
}

void DeviceBuffer::reset() {
  if (!data_) return;
  int current = 0;
  const bool switch_device = cudaGetDevice(&current) == cudaSuccess && current != device_;
  if (switch_device) cudaSetDevice(device_);
  const cudaError_t err = cudaFree(data_);
  if (switch_device) cudaSetDevice(current);
  if (err != cudaSuccess) {
    cudaGetLastError();
    log_warn("cudaFree of {} bytes on device {} failed: {}", bytes_, device_,
             cudaGetErrorName(err));
  }
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace tandem
