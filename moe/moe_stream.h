// A MoeLayer's submit and sync enqueued on a CUDA stream as host functions (cudaLaunchHostFunc),
// the way an engine captures a decode step into a CUDA graph (KTransformers §3.3): the submit runs
// when the stream reaches it (the hidden states, ids and weights written by the kernels before it
// are then final), the sync blocks the stream until the layer's output is written. Built when
// tandem is built with CUDA; otherwise both raise Error(kUnsupported) and stream_hooks_built() is
// false. An error inside the submit callback is kept and raised by the layer's next sync().
#pragma once

#include <cstdint>

#include "moe/moe_layer.h"

namespace tandem {

bool stream_hooks_built();
// (options, its mask included, are taken as they are now)
void enqueue_submit(uintptr_t stream, MoeLayer* layer, const float* hidden, int64_t tokens,
                    const int32_t* ids, const float* weights, int64_t k, float* out,
                    SubmitOptions options = {});
void enqueue_sync(uintptr_t stream, MoeLayer* layer);

}  // namespace tandem
