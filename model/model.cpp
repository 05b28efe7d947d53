#include "model/model.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/log.h"
#include "core/trace_events.h"
#include "model/router.h"

namespace tandem {

void check_token_ids(std::span<const int32_t> ids, int64_t vocab_size, std::string_view what) {
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size) {
      fail(ErrorKind::kOutOfRange, "{}{}token id {} is outside the vocabulary [0, {})", what,
           what.empty() ? "" : ": ", id, vocab_size);
    }
  }
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Activation buffers of the ops (ForwardOps::buffer).
enum Slot : int { kX, kH, kA, kRouterLogits };
using HostSlot = ForwardOps::HostSlot;

}  // namespace

MlaMode parse_mla_mode(const std::string& name) {
  if (name == "auto") return MlaMode::kAuto;
  if (name == "absorbed") return MlaMode::kAbsorbed;
  if (name == "naive") return MlaMode::kNaive;
  fail(ErrorKind::kInvalidArgument, "--mla must be 'auto', 'absorbed' or 'naive', got '{}'", name);
}

bool mla_expansion_pays(const ModelConfig& c, int64_t n, int64_t positions) {
  const double kvl = static_cast<double>(c.kv_lora_rank);
  const double up = kvl * static_cast<double>(c.qk_nope_head_dim + c.v_head_dim);
  const double narrower = 2 * kvl - static_cast<double>(c.qk_nope_head_dim + c.v_head_dim);
  const double p = static_cast<double>(positions), t = static_cast<double>(n);
  return t * (narrower * p + up) > p * up;
}

Model::Model(const LoadedModel& weights, const ModelOptions& options)
    : w_(weights), mla_(options.forward.mla), on_routing_(options.on_routing) {
  const ModelConfig& c = w_.config;
  if (options.moe != nullptr) {
    moe_ = options.moe;
  } else {
    own_moe_ = std::make_unique<CpuMoeBackend>(options.forward.pool);
    moe_ = own_moe_.get();
  }
  const ForwardOpsOptions& fo = options.forward;
  ops_ = options.ops ? options.ops(w_, fo) : make_cpu_forward_ops(w_, fo);
  ordered_moe_ = ops_->stream_ordered() && moe_->runs_in_host_callbacks();
  moe_index_.assign(c.num_layers, -1);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (w_.layers[l].moe) moe_index_[l] = n_moe_layers_++;
  }
  // (Hybrid models' steps run op by op: the graphs stage no recurrent-state addresses.)
  use_graphs_ = options.graphs && ops_->graphs() && (ordered_moe_ || n_moe_layers_ == 0) &&
                !c.has_linear_layers();
  graphs_.resize(kMaxGraphBatch);
}

Model::~Model() {
  for (const StepGraph& g : graphs_) {
    if (g.id < 0) continue;
    try {
      ops_->drop_graph(g.id);
    } catch (const std::exception& e) {
      log_warn("{}: releasing a step graph: {}", ops_->name(), e.what());
    }
  }
}

Model::Profile Model::profile() const {
  const ForwardOpsProfile o = ops_->profile();
  Profile p;
  p.attention = o.attention;
  p.lm_head = o.lm_head;
  p.ffn = ffn_seconds_;
  p.moe_wait = moe_wait_seconds_;
  return p;
}

KvLayout Model::kv_layout() const {
  const ModelConfig& c = w_.config;
  KvLayout l;
  l.layers = c.num_attention_layers();
  if (c.has_linear_layers()) {
    l.state_layers = c.num_linear_layers();
    l.state_floats = c.linear_state_floats();
  }
  if (c.has_indexer()) {
    l.index_layers = c.num_index_layers();
    l.index_dim = c.index_head_dim;
  }
  if (c.is_mla() && mla_ != MlaMode::kNaive) {
    // The latent then the rope key; the values are the latent (the key rows' first kv_lora).
    l.k_heads = 1;
    l.k_dim = c.kv_lora_rank + c.qk_rope_head_dim;
    l.v_heads = 0;
    l.v_dim = c.kv_lora_rank;
  } else if (c.is_mla()) {
    l.k_heads = l.v_heads = c.num_heads;
    l.k_dim = c.head_dim;
    l.v_dim = c.v_head_dim;
  } else {
    l.k_heads = l.v_heads = c.num_kv_heads;
    l.k_dim = l.v_dim = c.head_dim;
  }
  return l;
}

int64_t Model::forward(std::span<const SeqTokens> batch, KvCache& cache, float* logits) {
  const ModelConfig& c = w_.config;
  const int64_t hd = c.hidden_size;
  if (batch.empty()) fail(ErrorKind::kInvalidArgument, "forward: an empty batch");
  int64_t step_tokens = 0;
  for (const SeqTokens& e : batch) step_tokens += static_cast<int64_t>(e.tokens.size());
  trace::name_thread("host");
  trace::set_step(steps_++);
  const trace::Span step_span("step", "step", {.tokens = step_tokens});
  if (!(cache.layout() == kv_layout())) {
    fail(ErrorKind::kInvalidArgument,
         "forward: the KV cache was made for another layout (another model or --mla form)");
  }
  ops_->check_cache(cache);
  ForwardStep& s = step_;
  s.parts.clear();
  std::vector<KvCache::Write> writes;
  writes.reserve(batch.size());
  int64_t n = 0;
  for (const SeqTokens& e : batch) {
    const int64_t m = static_cast<int64_t>(e.tokens.size());
    if (m == 0) fail(ErrorKind::kInvalidArgument, "forward: no tokens for sequence {}", e.seq);
    check_token_ids(e.tokens, c.vocab_size);
    const int64_t pos0 = e.pos0 < 0 ? cache.length(e.seq) : e.pos0;
    s.parts.push_back(ForwardStep::Part{e.seq, n, m, pos0});
    writes.push_back(KvCache::Write{e.seq, pos0, e.tokens, e.checkpoint});
    n += m;
  }
  cache.make_writable(writes);  // (checks every entry before it changes anything)
  s.snapshots.clear();
  for (const KvCache::Snapshot& snap : cache.pending_snapshots()) {
    for (size_t i = 0; i < s.parts.size(); ++i) {
      if (s.parts[i].seq == snap.seq) {
        s.snapshots.push_back({static_cast<int32_t>(i), snap.offset, snap.slot});
      }
    }
  }
  try {
    s.tokens.resize(static_cast<size_t>(n));
    s.part_of.resize(static_cast<size_t>(n));
    s.pos.resize(static_cast<size_t>(n));
    for (size_t i = 0; i < s.parts.size(); ++i) {
      const ForwardStep::Part& p = s.parts[i];
      for (int64_t j = 0; j < p.n; ++j) {
        const size_t t = static_cast<size_t>(p.t0 + j);
        s.tokens[t] = batch[i].tokens[static_cast<size_t>(j)];
        s.part_of[t] = static_cast<int32_t>(i);
        s.pos[t] = p.pos0 + j;
      }
    }
    rows_.clear();
    for (size_t i = 0; i < s.parts.size(); ++i) {
      const ForwardStep::Part& p = s.parts[i];
      if (batch[i].logits == LogitRows::kAll) {
        for (int64_t j = 0; j < p.n; ++j) rows_.push_back(p.t0 + j);
      } else if (batch[i].logits == LogitRows::kLast) {
        rows_.push_back(p.t0 + p.n - 1);
      }
    }
    const int64_t rows = static_cast<int64_t>(rows_.size());
    if (graph_step(batch) && replay_graph(cache, logits)) return rows;
    ops_->begin_step(s, cache);
    float* x = ops_->buffer(kX, n * hd);
    {
      const trace::Span span("embed", "model");
      ops_->embed(x);
    }
    run_layers(n);
    if (rows == 0) {
      ops_->finish();
      return 0;
    }
    const trace::Span span("lm_head", "model", {.tokens = rows});
    ops_->lm_head(rows_, x, logits);
    return rows;
  } catch (...) {
    try {
      ops_->finish();  // (the ops' work in flight reads this step's memory)
    } catch (...) {
    }
    // The entries' positions were taken but not (all) written: give them back.
    for (const ForwardStep::Part& p : s.parts) {
      if (cache.contains(p.seq)) cache.truncate(p.seq, p.pos0);
    }
    throw;
  }
}

// A decode step a graph can compute: 1 .. kMaxGraphBatch sequences of one token each, each
// wanting its logits.
bool Model::graph_step(std::span<const SeqTokens> batch) const {
  if (!use_graphs_ || static_cast<int64_t>(batch.size()) > kMaxGraphBatch) return false;
  return std::all_of(batch.begin(), batch.end(), [](const SeqTokens& e) {
    return e.tokens.size() == 1 && e.logits == LogitRows::kLast;
  });
}

// The step (staged in step_) through its batch size's graph: captured on the second step of the
// size (the first runs op by op, growing every buffer the size needs, so that nothing grows while
// capturing), captured again when the memory it used has moved or the cache is another one.
// false: run the step op by op.
bool Model::replay_graph(KvCache& cache, float* logits) {
  const int64_t b = step_.n_tokens(), nv = w_.config.vocab_size;
  StepGraph& g = graphs_[static_cast<size_t>(b - 1)];
  if (g.failed) return false;
  float* host = ops_->host_buffer(HostSlot::kLogits, b * nv);
  const CacheKey key{cache.memory(), cache.bytes(), cache.max_sequence_positions(), cache.type()};
  if (g.id >= 0 && (g.epoch != ops_->memory_epoch() || !(g.cache == key))) {
    ops_->drop_graph(g.id);
    g.id = -1;
  }
  if (!(g.cache == key)) {
    g.cache = key;
    g.warm = false;  // (the cache's positions per sequence size the block tables)
  }
  if (g.id < 0) {
    if (!g.warm) {
      g.warm = true;
      return false;
    }
    const uint64_t epoch = ops_->memory_epoch();
    int id = -1;
    ops_->begin_capture();
    try {
      enqueue_step(cache, host);
      id = ops_->end_capture();
    } catch (const std::exception& e) {
      try {  // (the capture ended, or it is ended here)
        ops_->drop_graph(ops_->end_capture());
      } catch (...) {
      }
      g.failed = true;
      log_warn("{}: decode steps of {} sequences run op by op: capturing their graph failed: {}",
               ops_->name(), b, e.what());
      return false;
    }
    if (ops_->memory_epoch() != epoch) {  // (host memory grown while capturing: next step)
      ops_->drop_graph(id);
      return false;
    }
    g.id = id;
    g.epoch = epoch;
    ++graph_stats_.captured;
  } else {
    ops_->stage(step_, cache);
    if (ops_->memory_epoch() != g.epoch) {  // (staging moved memory the graph reads)
      ops_->drop_graph(g.id);
      g.id = -1;
      return false;
    }
  }
  ops_->launch_graph(g.id);
  ops_->finish();
  std::copy(host, host + b * nv, logits);
  ++graph_stats_.replayed;
  return true;
}

// The whole step enqueued on the ops' stream, its logits rows into host memory.
void Model::enqueue_step(KvCache& cache, float* host_logits) {
  const int64_t n = step_.n_tokens();
  ops_->begin_step(step_, cache);
  float* x = ops_->buffer(kX, n * w_.config.hidden_size);
  ops_->embed(x);
  run_layers(n);
  ops_->lm_head_to_host(rows_, x, host_logits);
}

void Model::run_layers(int64_t n) {
  const ModelConfig& c = w_.config;
  const int64_t hd = c.hidden_size;
  float* x = ops_->buffer(kX, n * hd);
  float* h = ops_->buffer(kH, n * hd);
  float* a = ops_->buffer(kA, n * hd);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    {
      const bool linear = c.is_linear_layer(l);
      const trace::Span span(linear ? "linear attention" : "attention", "layer", {.layer = l});
      ops_->norm(ForwardOps::Norm::kAttention, l, x, n, h);
      if (linear) {
        ops_->linear_attention(l, h, a);
      } else {
        ops_->attention(l, h, a);
      }
      ops_->add(x, a, n * hd);
    }
    const trace::Span span(w_.layers[l].moe ? "moe" : "dense ffn", "layer", {.layer = l});
    ops_->norm(ForwardOps::Norm::kFfn, l, x, n, h);
    const auto t1 = Clock::now();
    ffn(l, n, h, a);
    ffn_seconds_ += seconds(t1);
    ops_->add(x, a, n * hd);
  }
}

SingleSequence::SingleSequence(Model& model, int64_t ctx, KvType type)
    : model_(model),
      cache_(model.kv_layout(),
             [&] {
               if (ctx <= 0) {
                 fail(ErrorKind::kInvalidArgument, "context size must be positive, got {}", ctx);
               }
               KvCacheOptions o;
               o.type = type;
               o.positions = ctx;
               o.max_sequence_positions = ctx;
               return model.cache_options(o);
             }()),
      seq_(cache_.create()) {}

void SingleSequence::forward(std::span<const int32_t> tokens, float* logits, bool all_rows,
                             bool checkpoint) {
  const SeqTokens entry{seq_, tokens, -1, all_rows ? LogitRows::kAll : LogitRows::kLast,
                        checkpoint};
  model_.forward(std::span<const SeqTokens>(&entry, 1), cache_, logits);
}

void Model::ffn(int64_t l, int64_t n, const float* x, float* out) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[l];
  const int64_t hd = c.hidden_size;
  if (!lw.moe) {
    ops_->dense_ffn(l, x, n, out);
    return;
  }
  const int64_t ne = c.n_experts, k = c.n_experts_per_tok;
  MoeRequest req;
  req.layer = l;
  req.moe_index = moe_index_[l];
  req.n_moe_layers = n_moe_layers_;
  req.single_token = n == 1;
  req.layer_weights = &lw;
  req.experts = &lw.experts;
  req.n_tokens = n;
  req.hidden_size = hd;
  req.k = k;
  if (ordered_moe_) {
    ordered_moe(l, n, x, out, req);
    return;
  }
  // The MoE's input as the host reads it (the CPU ops' own memory: no copy).
  const float* hx = ops_->host_view(x, n * hd, &hidden_host_);
  if (routed_.size() < static_cast<size_t>(n * hd)) routed_.resize(static_cast<size_t>(n * hd));
  float* routed = routed_.data();
  req.hidden = hx;
  req.out = routed;
  // What does not depend on the routing (the backend's shared experts) starts first: it streams
  // while the router and the routing run.
  moe_->start_shared(req);
  {
    const trace::Span span("router", "layer", {.layer = l});
    float* router_logits = ops_->buffer(kRouterLogits, n * ne);
    ops_->router(l, x, n, router_logits);
    route(l, n, ops_->host_view(router_logits, n * ne, &logits_host_), hx);
  }
  req.ids = ids_.data();
  req.weights = topw_.data();
  moe_->submit(req);
  if (moe_->computes_shared()) {
    ops_->fill_zero(out, n * hd);
  } else {
    const trace::Span span("shared experts", "layer", {.layer = l});
    ops_->shared_ffn(l, x, n, out);
  }
  const auto tw = Clock::now();
  {
    const trace::Span span("wait cpu experts", "wait", {.layer = l});
    moe_->wait();
  }
  moe_wait_seconds_ += seconds(tw);
  ops_->add_from_host(out, routed, n * hd);
}

// The top-k of each token's router logits into ids_ / topw_, and the routing observer.
void Model::route(int64_t l, int64_t n, const float* logits, const float* hidden) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[l];
  const int64_t ne = c.n_experts, k = c.n_experts_per_tok;
  ids_.resize(static_cast<size_t>(n * k));
  topw_.resize(static_cast<size_t>(n * k));
  const float* bias = lw.router_bias.empty() ? nullptr : lw.router_bias.data();
  for (int64_t t = 0; t < n; ++t) {
    route_token(c, logits + t * ne, bias, ids_.data() + t * k, topw_.data() + t * k,
                route_scratch_);
  }
  if (on_routing_) {
    RoutingEvent ev;
    ev.layer = l;
    ev.moe_index = moe_index_[l];
    ev.n_tokens = n;
    ev.k = k;
    ev.n_experts = ne;
    ev.hidden_size = c.hidden_size;
    ev.pos0 = step_.pos[0];
    ev.positions = step_.pos.data();
    ev.ids = ids_.data();
    ev.weights = topw_.data();
    ev.logits = logits;
    ev.hidden = hidden;
    on_routing_(ev);
  }
}

// The MoE layer in the ops' stream order (KTransformers §3.3): the layer's input and router
// logits are copied into host buffers, a host function routes and submits the CPU experts, the
// device computes the shared experts meanwhile, a second host function waits for the CPU, and
// the routed sum is added from its host buffer. The host thread only enqueues; ids_, topw_ and
// ordered_req_ are the host functions' (the layers' run one after another on the stream).
void Model::ordered_moe(int64_t l, int64_t n, const float* x, float* out, MoeRequest req) {
  const ModelConfig& c = w_.config;
  const int64_t hd = c.hidden_size, ne = c.n_experts;
  float* hx = ops_->host_buffer(HostSlot::kMoeInput, n * hd);
  float* logits = ops_->host_buffer(HostSlot::kMoeRouterLogits, n * ne);
  float* routed = ops_->host_buffer(HostSlot::kMoeRouted, n * hd);
  float* router_logits = ops_->buffer(kRouterLogits, n * ne);
  ops_->router(l, x, n, router_logits);
  ops_->copy_to_host(x, n * hd, hx);
  ops_->copy_to_host(router_logits, n * ne, logits);
  req.hidden = hx;
  req.out = routed;
  ops_->host_work([this, l, n, logits, hx, req] {
    route(l, n, logits, hx);
    ordered_req_ = req;
    ordered_req_.ids = ids_.data();
    ordered_req_.weights = topw_.data();
    cpu_since_ = Clock::now();
    moe_->submit(ordered_req_);
  });
  if (moe_->computes_shared()) {
    ops_->fill_zero(out, n * hd);
  } else {
    ops_->shared_ffn(l, x, n, out);
  }
  ops_->host_work([this] {
    const auto tw = Clock::now();
    moe_->wait();
    moe_wait_seconds_ += seconds(tw);
    ops_->note_cpu_experts(cpu_since_, Clock::now());
  });
  ops_->add_from_host(out, routed, n * hd);
}

}  // namespace tandem
