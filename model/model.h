// The forward pass of every supported architecture over LoadedModel weights, for a batch of
// sequences whose keys and values live in a KvCache (model/kv_cache.h) the caller owns: prompt
// chunks of some sequences and single decode tokens of others in one call. Every matmul, the
// router and the MoE run once over all the batch's tokens (an expert selected by several
// sequences is read once per step); attention runs per sequence over its own cache blocks.
// Architecture differences are data (ModelConfig flags) plus two attention kinds: MHA/GQA
// (Qwen2/3-MoE, Mixtral; Qwen2 biases, Qwen3 q/k norm) and DeepSeek MLA (naive: decompress K/V
// per head; absorbed: cache only the kv_lora latent + rope key and fold W_UK / W_UV into the
// query and output; auto: that cache, with a sequence's large chunks expanded to per-head K / V
// on the fly).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/kv_cache.h"
#include "model/moe_backend.h"
#include "model/weights.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {

class ThreadPool;

// Expanded MLA's K / V buffers at most (bytes): past that (long contexts, many heads) a batch
// attends absorbed.
inline constexpr uint64_t kMlaExpandBytes = uint64_t{512} << 20;

// DeepSeek MLA. kAuto: the latent cache of kAbsorbed; decode and small batches attend absorbed,
// a batch of at least ModelOptions::mla_expand_tokens tokens decompresses every cached position's
// per-head K / V (W_UK, W_UV applied to the latents) for the call and attends in the naive form:
// 192 / 128 values per head and position instead of 576 / 512, a third of the attention's
// arithmetic for a 512-token prefill (what vLLM and SGLang do for prefill too).
enum class MlaMode { kAuto, kAbsorbed, kNaive };
// "auto" | "absorbed" | "naive"; anything else: Error(kInvalidArgument) naming the choices.
MlaMode parse_mla_mode(const std::string& name);
// Whether expanding K / V of `positions` cached positions for a batch of n tokens costs fewer
// multiply-adds than attending absorbed: the expansion costs positions x kv_lora x (qk_nope + v)
// per head; it saves, per query and head, the absorbed form's wider scores and value sums
// ((kv_lora + rope + kv_lora) - (qk_nope + rope + v) per position) and its W_UK / W_UV products
// (kv_lora x (qk_nope + v)). A fresh prefill always pays; a short batch after a long cached
// prefix does not (V2-Lite: 32 tokens after 4096 would cost 5x what they save).
bool mla_expansion_pays(const ModelConfig& c, int64_t n, int64_t positions);

// What the router decided for one MoE layer and one forward() batch: traces, expert statistics,
// DALI's residual calibration and the scheduling policies read it. Pointers are valid only during
// the call.
struct RoutingEvent {
  int64_t layer = 0;      // model layer index
  int64_t moe_index = 0;  // index among the MoE layers (0 = first MoE layer)
  int64_t n_tokens = 0, k = 0, n_experts = 0, hidden_size = 0;
  int64_t pos0 = 0;                // position of the batch's first token
  const int64_t* positions = nullptr;  // [n_tokens]: each token's position in its sequence
  const int32_t* ids = nullptr;    // [n_tokens, k], the router's order
  const float* weights = nullptr;  // [n_tokens, k], the weights the experts' outputs are scaled by
  const float* logits = nullptr;   // [n_tokens, n_experts] raw router logits (router_scores())
  const float* hidden = nullptr;   // [n_tokens, hidden_size] the MoE input (post-norm)
};
using RoutingObserver = std::function<void(const RoutingEvent& event)>;

struct ModelOptions {
  ThreadPool* pool = nullptr;  // nullptr: single-threaded
  MlaMode mla = MlaMode::kAuto;
  // kAuto: the batch size from which MLA attention expands K / V (see MlaMode); the expansion
  // also needs its buffers (positions x heads x (qk + v) floats) within kMlaExpandBytes and, with
  // mla_expand_by_cost, mla_expansion_pays (false: every batch of that size expands; tests).
  int64_t mla_expand_tokens = 32;
  bool mla_expand_by_cost = true;
  MoeBackend* moe = nullptr;  // nullptr: an internal CpuMoeBackend
  // Prepared copies of non-expert weights (`--cpu-experts repack`: MoeRuntime::weight_views()),
  // read instead of the stored bytes where they hold a weight; nullptr: the stored bytes.
  const kern::WeightViews* views = nullptr;
  RoutingObserver on_routing;  // optional
};

// Which logits rows a batch entry wants: none (a prompt chunk before its last), its last token's
// (the next token's distribution), or every token's (perplexity, --logits-out).
enum class LogitRows { kNone, kLast, kAll };

// One sequence's part of a batch: its tokens at positions pos0, pos0 + 1, ... (-1: the
// sequence's end; a pos0 before it replaces the positions from there on).
struct SeqTokens {
  SeqId seq = -1;
  std::span<const int32_t> tokens;
  int64_t pos0 = -1;
  LogitRows logits = LogitRows::kLast;
};

class Model {
 public:
  Model(const LoadedModel& weights, const ModelOptions& options);

  const ModelConfig& config() const { return w_.config; }
  // What this model (with its MLA mode) caches per layer and position: a KvCache for it is made
  // with this layout.
  KvLayout kv_layout() const;

  // Wall time spent per part of the forward since construction (seconds): where time goes,
  // for `tandem bench` and profiling. moe_wait is the part of ffn spent waiting for the backend.
  struct Profile {
    double attention = 0, ffn = 0, moe_wait = 0, lm_head = 0;
  };
  const Profile& profile() const { return profile_; }

  // One forward over a batch (at most one entry per sequence): writes the entries' keys and
  // values into `cache` and the logits rows they ask for, entry after entry, into logits
  // ([rows, vocab]); returns the rows. Throws Error(kOutOfRange) for a bad token id or a
  // sequence past the context size, Error(kResource) when the cache has no room (nothing is
  // written then), Error(kInvalidArgument) for an empty batch or entry or a cache of another
  // layout.
  int64_t forward(std::span<const SeqTokens> batch, KvCache& cache, float* logits);

 private:
  // One entry of the batch being computed: its sequence, rows [t0, t0 + n) of the activations,
  // the position of its first token.
  struct Part {
    SeqId seq;
    int64_t t0, n, pos0;
  };
  void run_layers(KvCache& cache, int64_t n);
  void attention_mha(KvCache& cache, int64_t layer, int64_t n, const float* x, float* out);
  void attention_mla(KvCache& cache, int64_t layer, int64_t n, const float* x, float* out);
  bool mla_expands(int64_t layer, int64_t n, int64_t positions) const;
  // Part p's attention outputs (before wo) into o rows [t0, t0 + n), per-head K / V expanded.
  void attention_mla_expanded(const KvCache& cache, int64_t layer, const Part& p, const float* q,
                              float* o);
  // Multi-head attention of part p over per-head K / V in `kv` (the caller sets the rows and
  // strides; q, out and the positions are set here) into o rows [t0, t0 + n).
  void attend_per_head(const Part& p, const float* q, ops::AttentionArgs kv, float* o);
  // fn(i) for each part, one pool task each when every part is one token (a decode batch:
  // single-threaded attention per sequence, the sequences spread over the threads), else in
  // turn (each attention call spreads over the threads itself).
  template <typename F>
  void for_parts(F&& fn);
  template <typename F>
  void for_heads(int64_t n_heads, int64_t n_tokens, F&& fn);
  template <typename F>
  void for_tokens(int64_t n, F&& fn);
  struct RopeAngles {
    std::vector<float> c, s;
  };
  RopeAngles& rope_angles(int64_t pos) const;
  void ffn(int64_t layer, int64_t n, const float* x, float* out);
  void dense_ffn(const ops::Weight& g, const ops::Weight& u, const ops::Weight& d, int64_t n,
                 const float* x, float* out);

  const LoadedModel& w_;
  ThreadPool* pool_;
  const kern::WeightViews* views_;
  MlaMode mla_;
  int64_t mla_expand_tokens_;
  bool mla_expand_by_cost_;
  RoutingObserver on_routing_;
  std::unique_ptr<CpuMoeBackend> own_moe_;
  MoeBackend* moe_;
  ops::Rope rope_;
  ops::RopeForm rope_form_;
  float attn_scale_;
  Profile profile_;
  std::vector<int64_t> moe_index_;  // per layer: index among MoE layers, -1 for dense
  int64_t n_moe_layers_ = 0;
  // The batch being computed: its parts, each token's part and position.
  std::vector<Part> parts_;
  std::vector<int32_t> part_of_;
  std::vector<int64_t> pos_;
  // Activation scratch, grown on demand and reused.
  std::vector<int32_t> tok_;
  std::vector<float> x_, h_, a_, b_, q_, k_, v_, t0_, t1_, t2_, att_, logits_r_;
  std::vector<float> ek_, ev_;             // expanded MLA: per-head K / V of every position
  std::vector<float> lat_f32_;             // expanded MLA: the sequence's latents as F32
  std::deque<kern::Activations> lat_acts_;  // expanded MLA: the latents per encoding
  std::vector<int64_t> rows_;               // token rows (absorbed MLA's, the logits rows)
  std::vector<int32_t> ids_;
  std::vector<float> topw_, route_scratch_;
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
  // prompt.
  void truncate(int64_t pos) { cache_.truncate(seq_, std::max<int64_t>(pos, 0)); }
  uint64_t kv_cache_bytes() const { return cache_.bytes(); }
  // Feeds `tokens` at the current position. logits receives [n, vocab] when all_rows, else the
  // last row's [vocab]. Throws as Model::forward.
  void forward(std::span<const int32_t> tokens, float* logits, bool all_rows);

 private:
  Model& model_;
  KvCache cache_;
  SeqId seq_;
};

}  // namespace tandem
