// The CUDA device (runtime/device.h's contract on a GPU; docs/device.md): streams are
// cudaStream_t, events cudaEvent_t, host callbacks cudaLaunchHostFunc, host staging memory
// pinned (cudaHostAlloc); device memory comes from cudaMalloc through a caching pool
// (runtime/block_pool.h) under a byte budget it accounts (--vram-budget, else 90% of the memory
// free at start). Ops: an expert FFN and a matmul read
// the weights as stored (ops/cuda/matvec.h), with the F32 kernels of ops/cuda/dense.h for the
// activation and the output; intermediates live in a per-stream scratch. The class is in
// runtime/cuda_device_impl.h, its forward ops (the dense part on the GPU with the kernels of
// ops/cuda/attention.h and dense.h) in runtime/cuda_forward_ops.cpp.
// Not yet run on a GPU: it builds here (sm_80 to sm_90a), and its `gpu` tests skip without a
// device (docs/device.md, "The CUDA device").
#include "core/error.h"
#include "runtime/device.h"

#ifdef TANDEM_HAVE_CUDA

#include "runtime/cuda_device_impl.h"

namespace tandem::rt {

namespace cuda_detail {

std::unique_ptr<ForwardOps> CudaDevice::forward_ops(std::shared_ptr<const DenseWeights> weights,
                                                    const ForwardOpsOptions& options) {
  if (&weights->device() != this) {
    fail(ErrorKind::kInvalidArgument, "{}: forward ops over another device's weights", name_);
  }
  return make_cuda_forward_ops(*this, std::move(weights), options);
}

}  // namespace cuda_detail

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& o) {
  return std::make_unique<cuda_detail::CudaDevice>(o);
}

}  // namespace tandem::rt

#else

namespace tandem::rt {

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions&) {
  fail(ErrorKind::kUnsupported,
       "--accel cuda: this build has no CUDA (nvcc was not found when "
       "it was configured); --accel host emulates an accelerator");
}

}  // namespace tandem::rt

#endif
