// Recording a Trace from a running model: an observer for ModelOptions::on_routing that appends
// one record per token (at the first MoE layer) and fills every MoE layer's ids, weights, full
// router scores and the predicted next-layer scores the prefetchers would see: gate = the next MoE
// layer's router applied to this layer's MoE input; residual = the same on input + r_l (DALI eq.
// 11).
#pragma once

#include <optional>
#include <vector>

#include "model/model.h"
#include "runtime/calibrate.h"
#include "runtime/trace.h"

namespace tandem::rt {

struct TraceRecordOptions {
  bool scores = false;                         // full router scores per layer
  bool gate_pred = false;                      // gate-predicted next-layer scores
  const ResidualVectors* residuals = nullptr;  // non-null: residual-predicted scores too
};

class TraceRecorder {
 public:
  TraceRecorder(const LoadedModel& model, const TraceRecordOptions& options);
  // Call before each Model::forward(): the tokens of that call form one batch.
  void begin_batch(TracePhase phase);
  void on_routing(const RoutingEvent& event);
  Trace& trace() { return trace_; }

 private:
  // Router scores of MoE layer `moe_index` for `n` hidden rows -> out [n, E].
  void predict(int64_t moe_index, const float* hidden, int64_t n, float* out);

  const LoadedModel& model_;
  TraceRecordOptions options_;
  std::vector<int64_t> layers_;
  Trace trace_;
  TracePhase phase_ = TracePhase::kPrefill;
  int32_t batch_ = -1;
  int64_t first_record_ = 0;
  std::vector<float> x_, logits_, scores_;
};

}  // namespace tandem::rt
