// Routing traces: which experts every MoE layer selected for every token, recorded from a model
// (`tandem trace`), imported from the demo's numpy-style traces or synthesized, and replayed by
// the simulator (`tandem sim`) through the same cache / policy / prefetch objects the runtime
// uses. The on-disk format ("TDTRACE1", documented in docs/traces.md) is compact and fixed-size
// per record, so a reader can validate the whole file from the header alone.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tandem::rt {

enum class TracePhase : uint8_t { kPrefill = 0, kDecode = 1 };

// Header flags (docs/traces.md).
enum TraceFlags : uint32_t {
  kTraceScores = 1u << 0,        // full router scores [L, E] per record
  kTraceGatePred = 1u << 1,      // gate-predicted scores of the next MoE layer [L, E]
  kTraceResidualPred = 1u << 2,  // residual-predicted (DALI eq. 11) scores of the next layer
  kTraceF16 = 1u << 3,           // weights and score arrays stored as IEEE f16 (else f32)
  kTraceIds16 = 1u << 4,         // expert ids stored as uint16 (else uint8; needs E <= 256)
};

// A whole trace in memory. Records are tokens in the order they were routed; consecutive records
// with the same batch id went through the layers together (one prefill chunk, one decode step).
struct Trace {
  std::string model;
  int n_layers = 0, n_experts = 0, top_k = 0;  // MoE layers, routed experts, experts per token
  bool has_scores = false, has_gate_pred = false, has_residual_pred = false;

  std::vector<int32_t> token;  // [N] token index (position in its sequence)
  std::vector<uint8_t> phase;  // [N] TracePhase
  std::vector<int32_t> batch;  // [N] batch id
  std::vector<int32_t> ids;    // [N, L, K] selected experts, the router's order
  std::vector<float> weights;  // [N, L, K] their routing weights
  std::vector<float> scores;   // [N, L, E] router scores (softmax / sigmoid), when has_scores
  // [N, L, E] at layer l: predicted scores of MoE layer l + 1 (the last layer's row is zero).
  std::vector<float> gate_pred, residual_pred;

  int64_t size() const { return static_cast<int64_t>(token.size()); }
  // Appends one record with zeroed arrays; returns its index.
  int64_t add_record(int32_t token_index, TracePhase ph, int32_t batch_id);
  int32_t* ids_at(int64_t r, int l) { return ids.data() + (r * n_layers + l) * top_k; }
  const int32_t* ids_at(int64_t r, int l) const { return ids.data() + (r * n_layers + l) * top_k; }
  float* weights_at(int64_t r, int l) { return weights.data() + (r * n_layers + l) * top_k; }
  const float* weights_at(int64_t r, int l) const {
    return weights.data() + (r * n_layers + l) * top_k;
  }
  const float* scores_at(int64_t r, int l) const {
    return scores.data() + (r * n_layers + l) * n_experts;
  }
  // Throws Error(kFormat) naming `what` when sizes or ids are inconsistent.
  void validate(const std::string& what) const;
};

struct TraceWriteOptions {
  bool f16 = false;  // store weights / scores as f16 (half the bytes, ~3 significant digits)
};

// Binary trace I/O. read_trace also accepts the demo format: a `.json` path (or a `.bin` with a
// sibling `.json`) is imported with import_demo_trace.
void write_trace(const Trace& trace, const std::filesystem::path& path,
                 const TraceWriteOptions& options = {});
Trace read_trace(const std::filesystem::path& path);
// The binary format from memory (read_trace's parser; `what` names it in errors). Throws
// Error(kFormat) for a header past the limits or not matching `size`, before sizing anything.
Trace parse_trace(const std::string& what, const uint8_t* data, size_t size);

// The demo's NAME.json + NAME.bin traces (../shared/demo/traces/FORMAT.md): train (teacher-forced
// 256-token chunks: one prefill batch per chunk) and decode (per prompt one prefill batch, then one
// batch per decode step). `path` is either file of the pair.
Trace import_demo_trace(const std::filesystem::path& path);

// [begin, end) record ranges of consecutive records sharing a batch id and phase.
struct TraceBatch {
  int64_t begin = 0, end = 0;
  TracePhase phase = TracePhase::kPrefill;
};
std::vector<TraceBatch> trace_batches(const Trace& trace);

// Per-layer expert selection counts [L][E] (how often each expert was chosen).
std::vector<std::vector<int64_t>> expert_counts(const Trace& trace);

}  // namespace tandem::rt

namespace tandem::rt {
// How well a trace's predicted next-layer scores (gate or residual) foresee the next layer's
// routing: the mean over records and layers 0..L-2 of |top-K(predicted) ∩ actual ids| / K.
// -1 when the trace has no such predictions.
double prediction_recall(const Trace& trace, bool residual);
}  // namespace tandem::rt
