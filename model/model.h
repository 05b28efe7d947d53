// The forward pass of every supported architecture over LoadedModel weights, for a batch of
// sequences whose keys and values live in a KvCache (model/kv_cache.h) the caller owns: prompt
// chunks of some sequences and single decode tokens of others in one call. Every matmul, the
// router and the MoE run once over all the batch's tokens (an expert selected by several
// sequences is read once per step); attention runs per sequence over its own cache blocks.
// Architecture differences are data (ModelConfig flags) plus two attention kinds: MHA/GQA
// (Qwen2/3-MoE, Mixtral; Qwen2 biases, Qwen3 q/k norm) and DeepSeek MLA (naive: decompress K/V
// per head; absorbed: cache only the kv_lora latent + rope key and fold W_UK / W_UV into the
// query and output; auto: that cache, with a sequence's large chunks expanded to per-head K / V
// on the fly). The forward is written once against ForwardOps (model/forward_ops.h): the CPU's,
// or an accelerator's that holds the dense weights and the KV cache in its memory; the routed
// experts go to the MoeBackend either way.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/forward_ops.h"
#include "model/kv_cache.h"
#include "model/moe_backend.h"
#include "model/weights.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {

class ThreadPool;

// What the router decided for one MoE layer and one forward() batch: traces, expert statistics,
// DALI's residual calibration and the scheduling policies read it. Pointers are valid only during
// the call.
struct RoutingEvent {
  int64_t layer = 0;      // model layer index
  int64_t moe_index = 0;  // index among the MoE layers (0 = first MoE layer)
  int64_t n_tokens = 0, k = 0, n_experts = 0, hidden_size = 0;
  int64_t pos0 = 0;                    // position of the batch's first token
  const int64_t* positions = nullptr;  // [n_tokens]: each token's position in its sequence
  const int32_t* ids = nullptr;        // [n_tokens, k], the router's order
  const float* weights = nullptr;  // [n_tokens, k], the weights the experts' outputs are scaled by
  const float* logits = nullptr;   // [n_tokens, n_experts] raw router logits (router_scores())
  const float* hidden = nullptr;   // [n_tokens, hidden_size] the MoE input (post-norm)
};
using RoutingObserver = std::function<void(const RoutingEvent& event)>;

struct ModelOptions {
  // The forward ops' options: the threads (nullptr: single-threaded; also the internal MoE
  // backend's), MLA's mode, DeltaNet's chunked form, the prepared weight copies
  // (`--cpu-experts repack`: MoeRuntime::weight_views()).
  ForwardOpsOptions forward;
  MoeBackend* moe = nullptr;  // nullptr: an internal CpuMoeBackend
  // Where the dense part runs (MoeRuntime::forward_ops()); empty: the CPU (make_cpu_forward_ops).
  ForwardOpsFactory ops;
  // With ops that have graphs (a device's) and every MoE layer in their stream order: a decode
  // step of 1 .. kMaxGraphBatch sequences replays the graph captured for its batch size (the
  // second step of that size captures it); false: every step op by op (--no-graphs).
  bool graphs = true;
  RoutingObserver on_routing;  // optional
};

// Decode steps of up to this many sequences are captured as graphs (ModelOptions::graphs).
inline constexpr int64_t kMaxGraphBatch = 8;

// Which logits rows a batch entry wants: none (a prompt chunk before its last), its last token's
// (the next token's distribution), or every token's (perplexity, --logits-out).
enum class LogitRows { kNone, kLast, kAll };

// One sequence's part of a batch: its tokens at positions pos0, pos0 + 1, ... (-1: the
// sequence's end; a pos0 before it replaces the positions from there on).
// checkpoint: with recurrent layers, keep a checkpoint of the state before the entry's last token
// (the end of a prompt: where the next turn of a chat or the same prompt again resumes).
// Error(kOutOfRange) "<what>: token id X is outside the vocabulary [0, V)" for the first id not
// in [0, vocab_size) (`what` empty: no prefix).
void check_token_ids(std::span<const int32_t> ids, int64_t vocab_size, std::string_view what = {});

struct SeqTokens {
  SeqId seq = -1;
  std::span<const int32_t> tokens;
  int64_t pos0 = -1;
  LogitRows logits = LogitRows::kLast;
  bool checkpoint = false;
};

class Model {
 public:
  Model(const LoadedModel& weights, const ModelOptions& options);
  ~Model();

  const ModelConfig& config() const { return w_.config; }
  // What this model (with its MLA mode) caches per layer and position: a KvCache for it is made
  // with this layout.
  KvLayout kv_layout() const;

  // Time spent per part of the forward since construction (seconds): where time goes, for
  // `tandem bench` and profiling. attention and lm_head where the ops ran them (an accelerator's
  // own time); ffn the host's wall time of the FFN layers, moe_wait its part spent waiting for the
  // MoE backend.
  struct Profile {
    double attention = 0, ffn = 0, moe_wait = 0, lm_head = 0;
  };
  Profile profile() const;
  // Decode steps replayed from a graph, and graphs captured, since construction.
  struct GraphStats {
    int64_t replayed = 0, captured = 0;
  };
  GraphStats graph_stats() const { return graph_stats_; }
  // Where the dense part runs, and the options a KV cache it attends over is made with (an
  // accelerator's cache lives in its memory).
  const ForwardOps& ops() const { return *ops_; }
  KvCacheOptions cache_options(KvCacheOptions o) const { return ops_->cache_options(o); }

  // One forward over a batch (at most one entry per sequence): writes the entries' keys and
  // values into `cache` and the logits rows they ask for, entry after entry, into logits
  // ([rows, vocab]); returns the rows. Throws Error(kOutOfRange) for a bad token id or a
  // sequence past the context size, Error(kResource) when the cache has no room (nothing is
  // written then), Error(kInvalidArgument) for an empty batch or entry or a cache of another
  // layout.
  int64_t forward(std::span<const SeqTokens> batch, KvCache& cache, float* logits);

 private:
  void run_layers(int64_t n);
  bool graph_step(std::span<const SeqTokens> batch) const;
  bool replay_graph(KvCache& cache, float* logits);
  void enqueue_step(KvCache& cache, float* host_logits);
  void ffn(int64_t layer, int64_t n, const float* x, float* out);
  void ordered_moe(int64_t layer, int64_t n, const float* x, float* out, MoeRequest req);
  void route(int64_t layer, int64_t n, const float* logits, const float* hidden);

  const LoadedModel& w_;
  MlaMode mla_;
  RoutingObserver on_routing_;
  std::unique_ptr<CpuMoeBackend> own_moe_;
  MoeBackend* moe_;
  std::unique_ptr<ForwardOps> ops_;
  double ffn_seconds_ = 0, moe_wait_seconds_ = 0;
  int64_t steps_ = 0;  // forwards run (a timeline's step numbers)
  // The ops are a device's and the MoE backend can run in its host functions: MoE layers in
  // stream order, the routed request kept here for the host function that waits for it.
  bool ordered_moe_ = false;
  MoeRequest ordered_req_;
  std::chrono::steady_clock::time_point cpu_since_;
  std::vector<int64_t> moe_index_;  // per layer: index among MoE layers, -1 for dense
  int64_t n_moe_layers_ = 0;
  ForwardStep step_;  // the batch being computed
  // The decode step's graph per batch size (index size - 1): captured for a cache's memory and
  // the ops' memory epoch; warm once the size ran op by op (its buffers grown), failed when a
  // capture failed (the size then always runs op by op).
  struct CacheKey {
    const void* memory = nullptr;
    uint64_t bytes = 0;
    int64_t sequence_positions = 0;
    KvType type = KvType::kF32;
    bool operator==(const CacheKey&) const = default;
  };
  struct StepGraph {
    int id = -1;
    uint64_t epoch = 0;
    CacheKey cache;
    bool warm = false, failed = false;
  };
  bool use_graphs_ = false;
  std::vector<StepGraph> graphs_;
  GraphStats graph_stats_;
  // Host-side scratch: the MoE's input and router logits as the host reads them, the routing, the
  // routed experts' output, the logits rows.
  std::vector<float> hidden_host_, logits_host_, routed_;
  std::vector<int32_t> ids_;
  std::vector<float> topw_, route_scratch_;
  std::vector<int64_t> rows_;
};

// One sequence on a model, with a KV cache of its own: the single-sequence API (a batch of one
// entry) for commands and tests that feed one token stream.
class SingleSequence {
 public:
  // ctx: the sequence's positions at most (the cache holds exactly that, rounded up to a block).
  SingleSequence(Model& model, int64_t ctx, KvType type = KvType::kF32);
  Model& model() { return model_; }
  KvCache& cache() { return cache_; }
  SeqId seq() const { return seq_; }
  int64_t position() const { return cache_.length(seq_); }
  int64_t ctx() const { return cache_.max_sequence_positions(); }
  void reset() { cache_.truncate(seq_, 0); }
  // Forgets every position from `pos` on: how a chat keeps the prefix it shares with the next
  // prompt. With recurrent layers the sequence resumes from its latest checkpoint at or before
  // pos: returns the position kept (position() after it).
  int64_t truncate(int64_t pos) { return cache_.truncate(seq_, std::max<int64_t>(pos, 0)); }
  uint64_t kv_cache_bytes() const { return cache_.bytes(); }
  // Feeds `tokens` at the current position. logits receives [n, vocab] when all_rows, else the
  // last row's [vocab]; checkpoint: SeqTokens::checkpoint. Throws as Model::forward.
  void forward(std::span<const int32_t> tokens, float* logits, bool all_rows,
               bool checkpoint = false);

 private:
  Model& model_;
  KvCache cache_;
  SeqId seq_;
};

}  // namespace tandem
