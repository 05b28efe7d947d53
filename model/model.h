// The forward pass of every supported architecture over LoadedModel weights, with an F32 (or
// BF16) KV cache: prefill a batch of tokens, then decode one at a time. Architecture differences
// are data (ModelConfig flags) plus two attention kinds: MHA/GQA (Qwen2/3-MoE, Mixtral; Qwen2
// biases, Qwen3 q/k norm) and DeepSeek MLA (naive: decompress K/V per head; absorbed: cache only
// the kv_lora latent + rope key and fold W_UK / W_UV into the query and output; auto: that
// cache, with batches expanded to per-head K / V on the fly).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

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

// The KV cache's element (`--cache-type`; llama.cpp's `-ctk` / `-ctv`, whose default is F16).
// kF32: as computed, the reference's numbers. kBf16: half the memory and, on AVX-512 BF16,
// attention by vdpbf16ps (queries and probabilities rounded to BF16): faster long-context
// attention, logits within BF16 rounding of F32's. kF16: half the memory, 11 significant bits,
// F32 arithmetic on the rows widened (the F32 cache's speed or a little better).
enum class KvType { kF32, kBf16, kF16, kQ8_0 };
// "f32" | "bf16" | "f16"; anything else: Error(kInvalidArgument) naming the choices.
KvType parse_kv_type(const std::string& name);

// What the router decided for one MoE layer and one forward() batch: traces, expert statistics,
// DALI's residual calibration and the scheduling policies read it. Pointers are valid only during
// the call.
struct RoutingEvent {
  int64_t layer = 0;      // model layer index
  int64_t moe_index = 0;  // index among the MoE layers (0 = first MoE layer)
  int64_t n_tokens = 0, k = 0, n_experts = 0, hidden_size = 0;
  int64_t pos0 = 0;                // position of the batch's first token
  const int32_t* ids = nullptr;    // [n_tokens, k], the router's order
  const float* weights = nullptr;  // [n_tokens, k], the weights the experts' outputs are scaled by
  const float* logits = nullptr;   // [n_tokens, n_experts] raw router logits (router_scores())
  const float* hidden = nullptr;   // [n_tokens, hidden_size] the MoE input (post-norm)
};
using RoutingObserver = std::function<void(const RoutingEvent& event)>;

struct ModelOptions {
  int64_t ctx = 4096;          // KV cache positions
  ThreadPool* pool = nullptr;  // nullptr: single-threaded
  MlaMode mla = MlaMode::kAuto;
  KvType kv_type = KvType::kF32;
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

class Model {
 public:
  Model(const LoadedModel& weights, const ModelOptions& options);

  const ModelConfig& config() const { return w_.config; }
  int64_t position() const { return pos_; }
  int64_t ctx() const { return ctx_; }
  void reset() { pos_ = 0; }
  // Forgets every position from `pos` on (the KV cache is indexed by position, so the next
  // forward() overwrites them): how a chat keeps the prefix it shares with the next prompt.
  void truncate(int64_t pos) {
    if (pos >= 0 && pos < pos_) pos_ = pos;
  }
  uint64_t kv_cache_bytes() const;
  KvType kv_type() const { return kv_type_; }

  // Wall time spent per part of the forward since construction (seconds): where time goes,
  // for `tandem bench` and profiling. moe_wait is the part of ffn spent waiting for the backend.
  struct Profile {
    double attention = 0, ffn = 0, moe_wait = 0, lm_head = 0;
  };
  const Profile& profile() const { return profile_; }

  // Feeds `tokens` at the current position. logits receives [n, vocab] when all_rows, else the
  // last row's [vocab]. Throws Error(kOutOfRange) for a bad id or when the context is full.
  void forward(std::span<const int32_t> tokens, float* logits, bool all_rows);

 private:
  void attention_mha(int64_t layer, int64_t n, const float* x, float* out);
  void attention_mla(int64_t layer, int64_t n, const float* x, float* out);
  bool mla_expands(int64_t layer, int64_t n) const;
  void attention_mla_expanded(int64_t layer, int64_t n, const float* q, float* out);
  // One layer's cached rows: `heads` rows of d values per position, head-major (a KV head's
  // positions consecutive: a decode task streams its head's keys and values), F32, 16-bit
  // (BF16 / F16 bits) or Q8_0 (ops::q8_row_bytes each, in 4-byte words) as kv_type_ says.
  struct KvRows {
    int64_t heads = 0, d = 0;
    std::vector<float> f;
    std::vector<uint16_t> h16;
    std::vector<int32_t> q8;
  };
  // Elements (bytes for Q8_0) of one row.
  int64_t cache_row(const KvRows& rows) const;
  // Writes the d values of position pos, KV head `head` (converted to the cache's element).
  void cache_write(KvRows& rows, int64_t pos, int64_t head, const float* src) const;
  // Points a.k / a.v (or a.k16 / a.v16, a.k8 / a.v8) at the caches, with their strides.
  void cache_args(const KvRows& k, const KvRows& v, ops::AttentionArgs* a) const;
  // Position pos, KV head `head` of a cache as F32 into dst.
  void cache_read(const KvRows& rows, int64_t pos, int64_t head, float* dst) const;
  // Multi-head attention over per-head K / V in `kv` (the caller sets the rows and strides; q,
  // out and the positions are set here), then wo.
  void attend_per_head(int64_t layer, int64_t n, const float* q, ops::AttentionArgs kv,
                       float* out);
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
  int64_t ctx_;
  ThreadPool* pool_;
  const kern::WeightViews* views_;
  MlaMode mla_;
  KvType kv_type_;
  int64_t mla_expand_tokens_;
  bool mla_expand_by_cost_;
  RoutingObserver on_routing_;
  std::unique_ptr<CpuMoeBackend> own_moe_;
  MoeBackend* moe_;
  ops::Rope rope_;
  ops::RopeForm rope_form_;
  float attn_scale_;
  int64_t pos_ = 0;
  Profile profile_;
  std::vector<int64_t> moe_index_;  // per layer: index among MoE layers, -1 for dense
  int64_t n_moe_layers_ = 0;
  // Per layer: K and V (MHA, naive MLA) or the latent + rope key (absorbed MLA, in k only).
  std::vector<KvRows> k_cache_, v_cache_;
  // Activation scratch, grown on demand and reused.
  std::vector<float> x_, h_, a_, b_, q_, k_, v_, t0_, t1_, t2_, att_, logits_r_;
  std::vector<float> ek_, ev_;             // expanded MLA: per-head K / V of every position
  std::vector<float> lat_f32_;             // expanded MLA on a 16-bit / Q8_0 cache: the latents
                                           // widened
  std::deque<kern::Activations> lat_acts_;  // expanded MLA: the latents per encoding
  std::vector<int32_t> ids_;
  std::vector<float> topw_, route_scratch_;
};

}  // namespace tandem
