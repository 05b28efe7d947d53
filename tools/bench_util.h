// What `tandem bench`'s single-sequence tests (cmd_bench.cpp) and its batched test
// (bench_batch.cpp) share: statistics, and the bytes a decode step reads, the figure its speed is
// divided by (the decode bound: bytes / DRAM read bandwidth).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/weights.h"

namespace tandem::tools {

struct Stat {
  double mean = 0, stddev = 0;
};
Stat stat(const std::vector<double>& v);  // mean and sample stddev (v non-empty)
double median(std::vector<double> v);     // (v non-empty)
double now_s();                           // a steady clock, in seconds

// Bytes one decode step reads, by the section of Model::Profile that reads them: all per-layer
// weights except the routed experts, the routed experts (k average ones per MoE layer for one
// token), the final norm and lm_head (the embedding row is negligible). The router belongs to the
// FFN section.
// state: one sequence's recurrent state (hybrid models' Gated DeltaNet layers), read and written
// once per step: twice its bytes.
struct StepBytes {
  uint64_t attention = 0, ffn = 0, experts = 0, lm_head = 0;
  uint64_t kv_cache = 0;  // read by the attention, not a weight (set by the caller)
  uint64_t state = 0;
  uint64_t dense() const { return attention + ffn + lm_head; }  // read once per step, any batch
  uint64_t total() const { return dense() + experts + kv_cache + state; }
};
StepBytes decode_bytes(const LoadedModel& m);
// The KV cache's bytes one decode token of a sequence of `positions` cached positions reads:
// every attention layer's keys and values of the positions it attends to (with DeepSeek Sparse
// Attention at most index_topk of them) and every index layer's indexer keys of all of them.
double kv_read_bytes(const ModelConfig& c, const KvCache& cache, double positions);

// The routed experts' bytes a batched decode step reads: for each MoE layer, the union of the
// experts its tokens selected (each read once for all of them). A RoutingObserver target.
class ExpertUnionBytes {
 public:
  explicit ExpertUnionBytes(const LoadedModel& m);
  void on_routing(const RoutingEvent& ev);
  bool counting = false;  // events are counted only while set
  uint64_t bytes = 0;     // expert bytes of the events counted

 private:
  std::vector<std::vector<uint64_t>> per_expert_;  // [layer][expert]: gate + up + down bytes
  std::vector<uint8_t> seen_;
};

}  // namespace tandem::tools
