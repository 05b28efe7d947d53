// MoeLayer submit / sync as host functions on a CUDA stream (moe/moe_stream.h).
// Not yet run on a GPU: it builds here (sm_80 to sm_90a); tests/gpu/moe_stream_test.cpp
// checks it against the CPU on a device and skips without one.
#include "moe/moe_stream.h"

#include <exception>
#include <memory>
#include <utility>

#include "core/error.h"
#include "core/log.h"

#if defined(TANDEM_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace tandem {

#if defined(TANDEM_HAVE_CUDA)

namespace {

struct SubmitArgs {
  MoeLayer* layer;
  const float* hidden;
  int64_t tokens;
  const int32_t* ids;
  const float* weights;
  int64_t k;
  float* out;
  SubmitOptions options;
};

void CUDART_CB run_submit(void* data) {
  std::unique_ptr<SubmitArgs> a(static_cast<SubmitArgs*>(data));
  try {
    a->layer->submit(a->hidden, a->tokens, a->ids, a->weights, a->k, a->out, a->options);
  } catch (...) {
    a->layer->keep_error(std::current_exception());
  }
}

void CUDART_CB run_sync(void* data) {
  auto* layer = static_cast<MoeLayer*>(data);
  try {
    layer->sync();
  } catch (...) {
    layer->keep_error(std::current_exception());
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    fail(ErrorKind::kInvalidArgument, "cuda_stream: {} failed: {}", what, cudaGetErrorString(e));
  }
}

}  // namespace

bool stream_hooks_built() { return true; }

void enqueue_submit(uintptr_t stream, MoeLayer* layer, const float* hidden, int64_t tokens,
                    const int32_t* ids, const float* weights, int64_t k, float* out,
                    SubmitOptions options) {
  auto* a = new SubmitArgs{layer, hidden, tokens, ids, weights, k, out, std::move(options)};
  const cudaError_t e =
      cudaLaunchHostFunc(reinterpret_cast<cudaStream_t>(stream), run_submit, a);
  if (e != cudaSuccess) delete a;
  check(e, "cudaLaunchHostFunc(submit)");
}

void enqueue_sync(uintptr_t stream, MoeLayer* layer) {
  check(cudaLaunchHostFunc(reinterpret_cast<cudaStream_t>(stream), run_sync, layer),
        "cudaLaunchHostFunc(sync)");
}

#else

bool stream_hooks_built() { return false; }

void enqueue_submit(uintptr_t, MoeLayer*, const float*, int64_t, const int32_t*, const float*,
                    int64_t, float*, SubmitOptions) {
  fail(ErrorKind::kUnsupported, "cuda_stream: this tandem was built without CUDA (no nvcc at "
       "build time); pass cuda_stream=None");
}

void enqueue_sync(uintptr_t, MoeLayer*) {
  fail(ErrorKind::kUnsupported, "cuda_stream: this tandem was built without CUDA (no nvcc at "
       "build time); pass cuda_stream=None");
}

#endif

}  // namespace tandem
