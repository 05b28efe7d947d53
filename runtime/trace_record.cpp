#include "runtime/trace_record.h"

#include <algorithm>

#include "core/error.h"
#include "model/router.h"

namespace tandem::rt {

TraceRecorder::TraceRecorder(const LoadedModel& model, const TraceRecordOptions& options)
    : model_(model), options_(options), layers_(moe_layer_indices(model)) {
  if (layers_.empty())
    fail(ErrorKind::kUnsupported, "{}: the model has no MoE layer to trace", model.path.string());
  const ModelConfig& c = model.config;
  trace_.model = model.path.filename().string();
  trace_.n_layers = static_cast<int>(layers_.size());
  trace_.n_experts = static_cast<int>(c.n_experts);
  trace_.top_k = static_cast<int>(c.n_experts_per_tok);
  trace_.has_scores = options.scores;
  trace_.has_gate_pred = options.gate_pred;
  trace_.has_residual_pred = options.residuals != nullptr;
  if (options.residuals) {
    const ResidualVectors& r = *options.residuals;
    if (r.hidden_size != c.hidden_size || r.layers != layers_) {
      fail(ErrorKind::kInvalidArgument,
           "--residuals: vectors for hidden size {} and {} MoE layers do not fit this model ({}, "
           "{})",
           r.hidden_size, r.layers.size(), c.hidden_size, layers_.size());
    }
  }
}

void TraceRecorder::begin_batch(TracePhase phase) {
  phase_ = phase;
  ++batch_;
  first_record_ = trace_.size();
}

void TraceRecorder::predict(int64_t moe_index, const float* hidden, int64_t n, float* out) {
  const int64_t e = trace_.n_experts;
  const LayerWeights& lw =
      model_.layers[static_cast<size_t>(layers_[static_cast<size_t>(moe_index)])];
  logits_.resize(static_cast<size_t>(n * e));
  ops::matmul(lw.router, hidden, n, logits_.data(), nullptr);
  for (int64_t t = 0; t < n; ++t) router_scores(model_.config, logits_.data() + t * e, out + t * e);
}

void TraceRecorder::on_routing(const RoutingEvent& ev) {
  Trace& t = trace_;
  const int l = static_cast<int>(ev.moe_index);
  TD_CHECK(ev.k == t.top_k && ev.n_experts == t.n_experts, "routing event shape");
  if (l == 0) {
    first_record_ = t.size();
    for (int64_t i = 0; i < ev.n_tokens; ++i) {
      const int64_t pos = ev.positions != nullptr ? ev.positions[i] : ev.pos0 + i;
      t.add_record(static_cast<int32_t>(pos), phase_, batch_);
    }
  }
  TD_CHECK(first_record_ + ev.n_tokens == t.size(), "routing event without its first MoE layer");
  const int64_t E = t.n_experts, L = t.n_layers;
  for (int64_t i = 0; i < ev.n_tokens; ++i) {
    const int64_t r = first_record_ + i;
    std::copy_n(ev.ids + i * ev.k, ev.k, t.ids_at(r, l));
    std::copy_n(ev.weights + i * ev.k, ev.k, t.weights_at(r, l));
    if (t.has_scores)
      router_scores(model_.config, ev.logits + i * E, t.scores.data() + (r * L + l) * E);
  }
  if (l + 1 >= L) return;
  const int64_t n = ev.n_tokens, H = ev.hidden_size;
  scores_.resize(static_cast<size_t>(n * E));
  if (t.has_gate_pred) {
    predict(l + 1, ev.hidden, n, scores_.data());
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(scores_.data() + i * E, E,
                  t.gate_pred.data() + ((first_record_ + i) * L + l) * E);
    }
  }
  if (t.has_residual_pred) {
    const std::vector<float>& rv = options_.residuals->vectors[static_cast<size_t>(l)];
    x_.resize(static_cast<size_t>(n * H));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t h = 0; h < H; ++h) x_[i * H + h] = ev.hidden[i * H + h] + rv[h];
    }
    predict(l + 1, x_.data(), n, scores_.data());
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(scores_.data() + i * E, E,
                  t.residual_pred.data() + ((first_record_ + i) * L + l) * E);
    }
  }
}

}  // namespace tandem::rt
