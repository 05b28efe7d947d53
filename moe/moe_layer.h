// One MoE layer's routed experts as a stand-alone operator: the C++ API of tandem's kernel
// library (the Python module `tandem` binds it: python/). What it computes is what the model's
// forward computes for a layer's routed experts -- the fused CPU operator (moe/fused_moe.h) over
// the layer's experts made by prepare_layer_experts (moe/cpu_experts.h) -- built here from raw
// per-expert tensors, or from a model file and a layer index, instead of from a loaded model:
//
//   out[t] = sum over slots j of weights[t][j] * down_e(silu(gate_e(x_t)) * up_e(x_t)),
//            e = ids[t][j], skipping e = -1 and the experts the mask puts on the GPU.
//
// forward() computes on the calling thread (which helps the pool's workers); submit() queues the
// layer on the threading context's driver thread and returns, sync() waits for it, so an engine
// runs its GPU work meanwhile and may have several layers in flight (they run in submit order).
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tandem {

class MoeContext;

// One weight family (gate, up or down) of a layer's experts as the caller holds it: experts
// matrices of [rows, cols] stored one after another, row-major, in `dtype`; for a GGUF block type
// cols counts values (a row is cols / block values' blocks). FP8 E4M3 has block scales: F32
// [experts, ceil(rows / block_rows), ceil(cols / block_cols)] (DeepSeek-V3's weight_scale_inv).
// The memory is read in place by "fp8" (FP8 views), so it must outlive the layer; the other methods
// copy what they need (requantized, or GGUF blocks rearranged into the layer's own arena).
// Experts stored apart (a Hugging Face checkpoint's per-expert tensors) are given by `each`: one
// pointer per expert (then `data` is not read), and FP8's by `each_scales`.
struct ExpertTensor {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t experts = 0, rows = 0, cols = 0;
  const float* scales = nullptr;  // FP8 only
  int64_t block_rows = 128, block_cols = 128;
  std::vector<const void*> each;
  std::vector<const float*> each_scales;
};

struct MoeLayerOptions {
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // moe_intermediate_size
  // int4 | int8 | bf16: requantized into tandem's packed tiles (group: int4 / int8, 32/64/128);
  // fp8: FP8 E4M3 with block scales, read as given; gguf: GGUF blocks, rearranged into the x16 / x4
  // layouts where the CPU has their kernels.
  std::string method = "int8";
  int group = 128;  // 0: the largest of 128, 64, 32 that divides hidden and intermediate sizes
  // [num_experts]: nonzero = the expert lives on the GPU and is skipped here (empty: none).
  std::vector<uint8_t> gpu_experts_mask;
  // Several tokens' forward is cut into calls of at most this many tokens (0: no limit); bounds
  // the activation buffers of a long prefill.
  int64_t max_chunk_tokens = 0;
};

// The threads a set of layers share: a ThreadingContext (workers pinned per physical core,
// grouped by NUMA node) plus the driver thread that runs submitted layers in order.
// threads: compute threads (0: one per physical core); numa_parts > 1 splits every expert's
// intermediate dimension over that many NUMA nodes (KTransformers §3.3), 1: none; spin_us: how
// long idle workers spin for the next layer before they sleep (ThreadingOptions::spin_us; an
// engine that calls layer after layer with its own work in between wants them awake: a sleeping
// worker's wake-up costs tens of microseconds, more on a VM).
inline constexpr int kMoeContextSpinUs = 1000;
std::shared_ptr<MoeContext> make_moe_context(int threads, int numa_parts = 1,
                                             int spin_us = kMoeContextSpinUs);
int moe_context_threads(const MoeContext& context);
int moe_context_numa_parts(const MoeContext& context);

// What a submit() does beyond its call's arguments: kt-kernel's Expert Deferral (KTransformers
// §4) and a GPU-experts mask that may change between calls.
struct SubmitOptions {
  // Add the result to out instead of overwriting it (what the deferred experts of the layer before
  // wrote there: kt-kernel's `incremental`).
  bool accumulate = false;
  // The layer's deferred experts: a second submit while the layer's own is in flight. sync() does
  // not wait for it (it runs while the engine goes on to the next layer); the layer's next call
  // does. Submits run in order on the context's driver thread, so a later layer's submit that
  // accumulates into this one's out starts after it.
  bool deferred = false;
  // [num_experts], nonzero = on the GPU (skipped), for this submit only, as it is now (empty: the
  // layer's mask).
  std::vector<uint8_t> gpu_experts_mask;
};

class MoeLayer {
 public:
  // From the caller's tensors: gate and up [num_experts, intermediate, hidden], down
  // [num_experts, hidden, intermediate]. Error(kInvalidArgument) naming the argument for a shape
  // or option that does not fit, Error(kUnsupported) for a dtype the method cannot take.
  MoeLayer(std::shared_ptr<MoeContext> context, const MoeLayerOptions& options,
           const ExpertTensor& gate, const ExpertTensor& up, const ExpertTensor& down);
  // From a model (a .gguf file or an HF directory) and a layer index: the layer's routed experts
  // as stored there; options' sizes of 0 are taken from the model, others must match it.
  MoeLayer(std::shared_ptr<MoeContext> context, const MoeLayerOptions& options,
           const std::filesystem::path& model, int64_t layer);
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  // The experts' slots in a different order: slot p computes the expert that was loaded as
  // logical expert map[p] (SGLang's physical_to_logical_map, expert-parallel load balancing);
  // map.size() is the slot count, every value < the experts loaded.
  void remap(const std::vector<int64_t>& physical_to_logical);
  void set_gpu_experts_mask(const std::vector<uint8_t>& mask);

  // hidden [tokens, hidden_size] F32, ids [tokens, k] (-1: an empty slot), weights [tokens, k],
  // out [tokens, hidden_size] (overwritten). Ids out of range and a k other than
  // num_experts_per_tok are Error(kInvalidArgument).
  void forward(const float* hidden, int64_t tokens, const int32_t* ids, const float* weights,
               int64_t k, float* out);
  // forward() in two halves, so that the caller can make its output buffer while the workers
  // compute (a Python caller's tensor allocation costs tens of microseconds): begin() checks the
  // call and starts the experts (one chunk: into a buffer of the layer's), end(out) finishes and
  // writes out (nullptr: waits and discards). Between them the layer takes no other call.
  void begin(const float* hidden, int64_t tokens, const int32_t* ids, const float* weights,
             int64_t k);
  void end(float* out);
  // The same queued on the context's driver thread: the pointers must stay valid until sync()
  // (a deferred submit's: until the layer's next call). At most one submit per layer is in
  // flight, and one deferred submit after it: another before its sync() is an Error, finished or
  // not (its result would go unread).
  void submit(const float* hidden, int64_t tokens, const int32_t* ids, const float* weights,
              int64_t k, float* out, const SubmitOptions& submit_options = {});
  // Waits for this layer's submit (not its deferred one); rethrows its error. Nothing in flight:
  // returns at once.
  void sync();
  bool in_flight() const;  // submitted, not yet synced
  // Kept to be raised by the next sync() (a submit that failed where it could not throw: a CUDA
  // stream's host function).
  void keep_error(std::exception_ptr error);

  const MoeLayerOptions& options() const;
  std::string weight_format() const;  // the kernels' layout, e.g. "int8", "q4_K_x16"
  // gpt-oss's clamped SwiGLU (its experts' limit; 0: plain SwiGLU), from the model.
  float swiglu_limit() const;
  uint64_t weight_bytes() const;      // bytes one pass over every expert reads

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
