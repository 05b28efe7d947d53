// The dense part of a model in an accelerator's memory: what an accelerator's ForwardOps reads
// (KTransformers' default placement: embedding, attention, dense FFNs, routers, shared experts
// and lm_head on the GPU; the routed experts stay in DRAM for the CPU operator).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/kv_cache.h"
#include "model/weights.h"
#include "runtime/device.h"

namespace tandem::rt {

// `weights` is the model with every non-expert matrix copied into the device's memory, in its
// stored dtype (FP8 with the block scales of its rows), each tensor's data pointing there; tied
// matrices (an lm_head that is the embedding) are copied once. Routed experts are absent (empty
// ExpertWeights); the small F32 vectors (norms, biases, sinks, the routers' correction bias)
// stay host vectors, which the host device reads directly and a GPU's ops upload themselves.
struct DenseWeights {
  LoadedModel weights;
  uint64_t bytes = 0;           // device memory the copies hold
  bool shared_experts = false;  // copied (else absent: the MoE backend computes them)
  DenseWeights(Device& dev) : dev_(dev) {}
  ~DenseWeights();
  DenseWeights(const DenseWeights&) = delete;
  DenseWeights& operator=(const DenseWeights&) = delete;

  Device& device() const { return dev_; }

 private:
  friend std::shared_ptr<DenseWeights> upload_dense_weights(Device&, const LoadedModel&, bool);
  Device& dev_;
  std::vector<void*> allocations_;
};

// Copies the dense part of `model` into dev's memory through copy_h2d (a progress bar on a
// terminal). Error(kResource) before anything is copied when it does not fit in the memory left,
// naming the bytes and how to change it (--vram-budget, or a placement rule keeping the dense
// part on the CPU); Error(kUnsupported) for a non-contiguous matrix. shared_experts false: the
// shared experts are left out (a hybrid MoE backend holds and computes them).
std::shared_ptr<DenseWeights> upload_dense_weights(Device& dev, const LoadedModel& model,
                                                   bool shared_experts);

// o with the KV cache's pool in dev's memory (KvCacheOptions::alloc / release): what a device's
// ForwardOps::cache_options returns. A pool larger than the memory left is Error(kResource)
// naming --ctx, --parallel, --cache-slots and --vram-budget.
KvCacheOptions device_cache_options(Device& dev, KvCacheOptions o);

}  // namespace tandem::rt
