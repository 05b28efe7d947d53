// The CPU's forward ops (model/forward_ops.h): the kernels of ops/cpu on the caller's pool, over
// the weights as loaded (or their prepared copies, ForwardOpsOptions::views).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/topology.h"
#include "formats/quant.h"
#include "model/delta_net_layer.h"
#include "model/forward_ops.h"
#include "model/moe_backend.h"
#include "model/sparse_attention.h"
#include "ops/cpu/delta_net.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

template <typename T>
T* grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

void add_into(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// w's prepared copy from views, else a view on its stored bytes (false: no kernel for its dtype).
bool kernel_view(const ops::Weight& w, const kern::WeightViews* views, kern::KMatrix* out) {
  if (views != nullptr) {
    const auto it = views->find(&w);
    if (it != views->end()) {
      *out = it->second;
      return true;
    }
  }
  return kern::view_weight(w, out) &&
         out->cols % kern::block_of(kern::act_format(out->format)) == 0;
}

class CpuForwardOps final : public ForwardOps {
 public:
  CpuForwardOps(const LoadedModel& weights, const ForwardOpsOptions& o);

  std::string name() const override { return "cpu"; }
  float* buffer(int slot, int64_t count) override {
    TD_CHECK(slot >= 0 && slot < kBufferSlots, "forward ops: buffer slot {}", slot);
    return grow(buffers_[slot], count);
  }
  void begin_step(const ForwardStep& step, KvCache& cache) override {
    // (The DeltaNet layers and the lightning indexer read it whole.)
    if (w_.config.has_linear_layers() || w_.config.has_indexer()) step_ = step;
    parts_ = step.parts;
    part_of_ = step.part_of;
    pos_ = step.pos;
    tok_ = step.tokens;
    cache_ = &cache;
  }
  void embed(float* x) override {
    ops::embedding(w_.embed, tok_.data(), static_cast<int64_t>(tok_.size()), x);
  }
  void norm(Norm which, int64_t layer, const float* x, int64_t n, float* out) override {
    const LayerWeights& lw = w_.layers[layer];
    const float* g = which == Norm::kAttention ? lw.attn_norm.data() : lw.ffn_norm.data();
    const int64_t hd = w_.config.hidden_size;
    for (int64_t t = 0; t < n; ++t) {
      ops::rms_norm(x + t * hd, g, hd, w_.config.rms_norm_eps, out + t * hd);
    }
  }
  void add(float* out, const float* a, int64_t count) override { add_into(out, a, count); }
  void fill_zero(float* out, int64_t count) override { std::fill(out, out + count, 0.0f); }
  void attention(int64_t layer, const float* x, float* out) override {
    const auto t0 = Clock::now();
    const int64_t n = static_cast<int64_t>(pos_.size());
    if (w_.config.is_mla()) {
      attention_mla(*cache_, layer, n, x, out);
    } else {
      attention_mha(*cache_, layer, n, x, out);
    }
    profile_.attention += seconds(t0);
  }
  void linear_attention(int64_t layer, const float* x, float* out) override {
    const auto t0 = Clock::now();
    DeltaNetLayerArgs a;
    a.config = &w_.config;
    a.weights = &w_.layers[layer].delta;
    a.state_layer = w_.config.state_layer(layer);
    a.step = &step_;
    a.cache = cache_;
    a.pool = pool_;
    a.views = views_;
    a.chunk_tokens = delta_chunk_tokens_;
    delta_net_layer(a, x, out, delta_scratch_);
    profile_.attention += seconds(t0);
  }
  void dense_ffn(int64_t layer, const float* x, int64_t n, float* out) override {
    const LayerWeights& lw = w_.layers[layer];
    swiglu(lw.ffn_gate, lw.ffn_up, lw.ffn_down, n, x, out);
  }
  void shared_ffn(int64_t layer, const float* x, int64_t n, float* out) override {
    const LayerWeights& lw = w_.layers[layer];
    const int64_t hd = w_.config.hidden_size;
    if (lw.sh_gate.empty()) {
      fill_zero(out, n * hd);
      return;
    }
    swiglu(lw.sh_gate, lw.sh_up, lw.sh_down, n, x, out);
    if (!lw.sh_gate_inp.empty()) {
      for (int64_t t = 0; t < n; ++t) {
        const float gate = shared_expert_gate(x + t * hd, lw.sh_gate_inp.data(), hd);
        for (int64_t i = 0; i < hd; ++i) out[t * hd + i] *= gate;
      }
    }
  }
  void router(int64_t layer, const float* x, int64_t n, float* logits) override {
    const LayerWeights& lw = w_.layers[layer];
    const int64_t ne = w_.config.n_experts;
    kern::matmul(lw.router, x, n, logits, pool_, views_);
    if (!lw.router_logit_bias.empty()) {
      for (int64_t t = 0; t < n; ++t) add_into(logits + t * ne, lw.router_logit_bias.data(), ne);
    }
  }
  const float* host_view(const float* x, int64_t, std::vector<float>*) override { return x; }
  void add_from_host(float* out, const float* host, int64_t count) override {
    add_into(out, host, count);
  }
  void lm_head(const std::vector<int64_t>& row_ids, const float* x, float* logits) override {
    const ModelConfig& c = w_.config;
    const int64_t hd = c.hidden_size, rows = static_cast<int64_t>(row_ids.size());
    float* h = grow(t0_, rows * hd);
    for (int64_t j = 0; j < rows; ++j) {
      ops::rms_norm(x + row_ids[j] * hd, w_.out_norm.data(), hd, c.rms_norm_eps, h + j * hd);
    }
    const auto t0 = Clock::now();
    kern::matmul(w_.lm_head, h, rows, logits, pool_, views_);
    profile_.lm_head += seconds(t0);
  }
  void finish() override {}
  ForwardOpsProfile profile() const override { return profile_; }

 private:
  using Part = ForwardStep::Part;
  void attention_mha(KvCache& cache, int64_t layer, int64_t n, const float* x, float* out);
  void attention_mla(KvCache& cache, int64_t layer, int64_t n, const float* x, float* out);
  // attention_mla's steps.
  void mla_project(KvCache& cache, int64_t layer, int64_t n, const float* x, float* q, float* kv);
  void mla_naive(KvCache& cache, int64_t layer, int64_t n, const float* q, const float* kv,
                 float* o);
  bool mla_absorbed_args(KvCache& cache, int64_t layer, const float* q, float* qc, float* att,
                         float* o, std::vector<ops::AttentionArgs>* args);
  void mla_absorbed_heads(const LayerWeights& lw, const float* q, float* qc, const float* att,
                          const std::vector<ops::AttentionArgs>& args, bool decode, float* o);
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
  void swiglu(const ops::Weight& g, const ops::Weight& u, const ops::Weight& d, int64_t n,
              const float* x, float* out) {
    kern::swiglu_ffn(g, u, d, x, n, out, pool_, views_, &t1_, &t2_);
  }

  const LoadedModel& w_;
  ThreadPool* pool_;
  const kern::WeightViews* views_;
  MlaMode mla_;
  int64_t mla_expand_tokens_;
  bool mla_expand_by_cost_;
  ops::Rope rope_;
  ops::RopeForm rope_form_;
  float attn_scale_;
  int64_t delta_chunk_tokens_;
  ForwardStep step_;  // hybrid and sparse-attention models: the step being computed
  DeltaNetScratch delta_scratch_;
  ForwardOpsProfile profile_;
  // The step being computed: its parts, each token's id, part and position, its cache.
  std::vector<Part> parts_;
  std::vector<int32_t> part_of_;
  std::vector<int64_t> pos_;
  std::vector<int32_t> tok_;
  KvCache* cache_ = nullptr;
  std::vector<float> buffers_[kBufferSlots];
  // Scratch, grown on demand and reused.
  std::vector<float> q_, k_, v_, t0_, t1_, t2_, att_, gate_;
  std::vector<float> ek_, ev_;              // expanded MLA: per-head K / V of every position
  std::vector<float> lat_f32_;              // expanded MLA: the sequence's latents as F32
  std::deque<kern::Activations> lat_acts_;  // expanded MLA: the latents per encoding
  std::vector<int64_t> rows_;               // absorbed MLA's token rows
  // DeepSeek Sparse Attention: the indexer, the step's selection (of the last index layer), the
  // selected rows gathered for the layer's attention.
  std::unique_ptr<LightningIndexer> indexer_;
  SparseSelection selection_;
  GatherStorage gathered_;
  // args as they attend: split by the selection with an indexer (split_by_selection).
  void add_attention(const ops::AttentionArgs& args, int64_t t0,
                     std::vector<ops::AttentionArgs>* out);
  bool part_is_sparse(const Part& p) const;
};

CpuForwardOps::CpuForwardOps(const LoadedModel& weights, const ForwardOpsOptions& o)
    : w_(weights),
      pool_(o.pool),
      views_(o.views),
      mla_(o.mla),
      mla_expand_tokens_(o.mla_expand_tokens),
      mla_expand_by_cost_(o.mla_expand_by_cost),
      delta_chunk_tokens_(o.delta_chunk_tokens) {
  const ModelConfig& c = w_.config;
  rope_ = ops::Rope(c.rope_dim, c.rope_theta, c.rope_scaling);
  rope_.set_sections(c.rope_sections);
  // llama.cpp's GGUF Mixtral has q/k rows permuted for the interleaved form; HF keeps rotate_half.
  // DeepSeek's q_pe / k_pe are interleaved in both layouts.
  const bool interleaved = c.is_mla() || (c.arch == ModelArch::kMixtral && w_.from_gguf);
  rope_form_ = interleaved ? ops::RopeForm::kInterleaved : ops::RopeForm::kNeox;
  attn_scale_ = 1.0f / std::sqrt(static_cast<float>(c.head_dim)) * rope_.softmax_scale_factor();
  if (c.has_indexer()) indexer_ = std::make_unique<LightningIndexer>(c, pool_, views_);
}

void CpuForwardOps::add_attention(const ops::AttentionArgs& args, int64_t t0,
                                  std::vector<ops::AttentionArgs>* out) {
  if (indexer_) {
    split_by_selection(args, t0, selection_, gathered_, out);
  } else {
    out->push_back(args);
  }
}

bool CpuForwardOps::part_is_sparse(const Part& p) const {
  return indexer_ && selection_.sparse(p.t0 + p.n - 1);  // (its last token sees the most)
}

template <typename F>
void CpuForwardOps::for_parts(F&& fn) {
  bool decode = parts_.size() > 1 && pool_ != nullptr;
  for (const Part& p : parts_) decode = decode && p.n == 1;
  if (decode) {
    pool_->run(parts_.size(), [&](size_t i) { fn(parts_[i], nullptr); });
  } else {
    for (const Part& p : parts_) fn(p, pool_);
  }
}

void CpuForwardOps::attention_mha(KvCache& cache, int64_t l, int64_t n, const float* x,
                                  float* out) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[l];
  const int64_t d = c.head_dim, nq = c.num_heads, nkv = c.num_kv_heads;
  const int64_t cl = c.kv_layer(l);  // the layer's cache layer
  const bool gated = c.attn_output_gate;
  float* q = grow(q_, n * nq * d);
  float* k = grow(k_, n * nkv * d);
  float* v = grow(v_, n * nkv * d);
  float* gate = gated ? grow(gate_, n * nq * d) : nullptr;
  {
    // (Gated: q_proj's rows are each head's query then its gate, split below.)
    float* qg = gated ? grow(t2_, n * nq * 2 * d) : q;
    const ops::Weight* ws[3] = {&lw.wq, &lw.wk, &lw.wv};
    float* ys[3] = {qg, k, v};
    kern::matmul_shared_input(ws, x, n, ys, pool_, views_);
    if (gated) {
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t i = 0; i < nq; ++i) {
          const float* src = qg + (t * nq + i) * 2 * d;
          std::copy(src, src + d, q + (t * nq + i) * d);
          std::copy(src + d, src + 2 * d, gate + (t * nq + i) * d);
        }
      }
    }
  }
  for_tokens(n, [&](int64_t t) {
    const int64_t pos = pos_[static_cast<size_t>(t)];
    const SeqId seq = parts_[static_cast<size_t>(part_of_[static_cast<size_t>(t)])].seq;
    float* qt = q + t * nq * d;
    float* kt = k + t * nkv * d;
    float* vt = v + t * nkv * d;
    if (!lw.bq.empty()) {
      add_into(qt, lw.bq.data(), nq * d);
      add_into(kt, lw.bk.data(), nkv * d);
      add_into(vt, lw.bv.data(), nkv * d);
    }
    RopeAngles& ang = rope_angles(pos);
    if (c.qk_norm_all_heads) {  // MiniMax-M2: one norm over every head's query / key
      ops::rms_norm(qt, lw.q_norm.data(), nq * d, c.rms_norm_eps, qt);
      ops::rms_norm(kt, lw.k_norm.data(), nkv * d, c.rms_norm_eps, kt);
    }
    const bool head_norm = !lw.q_norm.empty() && !c.qk_norm_all_heads;
    for (int64_t i = 0; i < nq; ++i) {
      if (head_norm) ops::rms_norm(qt + i * d, lw.q_norm.data(), d, c.rms_norm_eps, qt + i * d);
      rope_.rotate(qt + i * d, ang.c.data(), ang.s.data(), rope_form_);
    }
    for (int64_t i = 0; i < nkv; ++i) {
      if (head_norm) ops::rms_norm(kt + i * d, lw.k_norm.data(), d, c.rms_norm_eps, kt + i * d);
      rope_.rotate(kt + i * d, ang.c.data(), ang.s.data(), rope_form_);
    }
    for (int64_t i = 0; i < nkv; ++i) {
      cache.write_row(cl, KvPart::kKey, seq, pos, i, kt + i * d);
      cache.write_row(cl, KvPart::kValue, seq, pos, i, vt + i * d);
    }
  });
  float* att = grow(att_, n * nq * d);
  for_parts([&](const Part& p, ThreadPool* pool) {
    ops::AttentionArgs args;
    args.q = q + p.t0 * nq * d;
    args.q_stride = nq * d;
    args.n_tokens = p.n;
    args.n_heads = nq;
    args.n_kv_heads = nkv;
    args.dk = d;
    args.dv = d;
    cache.attention_args(cl, p.seq, &args);
    args.pos0 = p.pos0;
    args.scale = attn_scale_;
    if (c.is_swa_layer(l)) args.window = c.sliding_window;
    if (!lw.sinks.empty()) args.sinks = lw.sinks.data();
    args.out = att + p.t0 * nq * d;
    kern::attention(args, pool);
  });
  if (gated) {
    for_tokens(n, [&](int64_t t) {
      for (int64_t i = t * nq * d; i < (t + 1) * nq * d; ++i) att[i] *= ops::sigmoid(gate[i]);
    });
  }
  kern::matmul(lw.wo, att, n, out, pool_, views_);
  if (!lw.bo.empty()) {
    for (int64_t t = 0; t < n; ++t) add_into(out + t * c.hidden_size, lw.bo.data(), c.hidden_size);
  }
}

// The rotary angles of one position (computed once for all of a token's heads), per thread.
CpuForwardOps::RopeAngles& CpuForwardOps::rope_angles(int64_t pos) const {
  thread_local RopeAngles a;
  const size_t half = static_cast<size_t>(rope_.dim() / 2);
  a.c.resize(half);
  a.s.resize(half);
  rope_.angles(pos, a.c.data(), a.s.data());
  return a;
}

// fn(t) for each of n tokens: on the pool for a batch (the per-token norms and rotations of a
// 512-token prefill took ~1.5% of it serially), inline for one token.
template <typename F>
void CpuForwardOps::for_tokens(int64_t n, F&& fn) {
  if (pool_ != nullptr && n > 1) {
    pool_->run(static_cast<size_t>(n), [&](size_t t) { fn(static_cast<int64_t>(t)); });
  } else {
    for (int64_t t = 0; t < n; ++t) fn(t);
  }
}

template <typename F>
void CpuForwardOps::for_heads(int64_t n_heads, int64_t n_tokens, F&& fn) {
  // Even one token's heads are worth dispatching: each reads its own up-projections (V2-Lite: 16
  // heads x 81 KiB per layer), which one thread alone streams at a fraction of the bandwidth
  // (serial, they also let the workers fall asleep before the next matmul). In decode (<= 4
  // tokens) each thread takes a contiguous range of heads, one stream through the heads' adjacent
  // weights (bench_kernels_bench BM_MlaHeads ranges_vs_heads: 1.02-1.24 against a task per head);
  // prefill keeps a task per head, for balance.
  if (pool_ == nullptr) {
    for (int64_t i = 0; i < n_heads; ++i) fn(static_cast<size_t>(i));
  } else if (n_tokens <= 4) {
    const size_t heads = static_cast<size_t>(n_heads);
    const size_t parts = std::min(heads, static_cast<size_t>(pool_->size()) + 1);
    pool_->run(parts, [&](size_t p) {
      for (size_t h = p * heads / parts; h < (p + 1) * heads / parts; ++h) fn(h);
    });
  } else {
    pool_->run(static_cast<size_t>(n_heads), fn);
  }
}

void CpuForwardOps::attention_mla(KvCache& cache, int64_t l, int64_t n, const float* x,
                                  float* out) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[l];
  const int64_t kr = c.kv_lora_rank + c.qk_rope_head_dim;
  float* q = grow(q_, n * c.num_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim));
  float* kv = grow(k_, n * kr);  // per token: latent [kvl] then rope key [rd]
  mla_project(cache, l, n, x, q, kv);
  float* o = grow(v_, n * c.num_heads * c.v_head_dim);  // the heads' outputs, before wo
  if (mla_ == MlaMode::kNaive) {
    mla_naive(cache, l, n, q, kv, o);
  } else {
    // Each sequence's chunk attends expanded (a large prefill chunk) or absorbed; the absorbed
    // tokens' rows go through W_UK / W_UV together.
    float* qc = grow(t1_, n * c.num_heads * kr);
    float* att = grow(att_, n * c.num_heads * c.kv_lora_rank);
    std::vector<ops::AttentionArgs> args;
    const bool decode = mla_absorbed_args(cache, l, q, qc, att, o, &args);
    if (!rows_.empty()) mla_absorbed_heads(lw, q, qc, att, args, decode, o);
  }
  kern::matmul(lw.wo, o, n, out, pool_, views_);
}

// q [n, heads, nope + rd] and kv [n, kvl + rd] from x: the projections (through q's LoRA and the
// indexer on its layers), the latent's norm, RoPE; the latent rows written to the cache unless
// the attention is naive.
void CpuForwardOps::mla_project(KvCache& cache, int64_t l, int64_t n, const float* x, float* q,
                                float* kv) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[l];
  const int64_t nope = c.qk_nope_head_dim, kvl = c.kv_lora_rank;
  const int64_t nh = c.num_heads, qk = nope + c.qk_rope_head_dim, kr = kvl + c.qk_rope_head_dim;
  // The projections of x (q or q_a, and kv_a) in one call.
  if (!lw.wq_a.empty()) {
    float* qa = grow(t0_, n * c.q_lora_rank);
    const ops::Weight* ws[2] = {&lw.wq_a, &lw.wkv_a};
    float* ys[2] = {qa, kv};
    kern::matmul_shared_input(ws, x, n, ys, pool_, views_);
    for (int64_t t = 0; t < n; ++t) {
      float* r = qa + t * c.q_lora_rank;
      ops::rms_norm(r, lw.q_a_norm.data(), c.q_lora_rank, c.rms_norm_eps, r);
    }
    // (A layer sharing an indexer keeps the selection of the last one before it.)
    if (c.is_index_layer(l)) indexer_->run(l, lw, x, qa, step_, cache, &selection_);
    kern::matmul(lw.wq_b, qa, n, q, pool_, views_);
  } else {
    const ops::Weight* ws[2] = {&lw.wq, &lw.wkv_a};
    float* ys[2] = {q, kv};
    kern::matmul_shared_input(ws, x, n, ys, pool_, views_);
  }
  const bool latent = mla_ != MlaMode::kNaive;
  gathered_.reset();
  for_tokens(n, [&](int64_t t) {
    const int64_t pos = pos_[static_cast<size_t>(t)];
    float* r = kv + t * kr;
    ops::rms_norm(r, lw.kv_a_norm.data(), kvl, c.rms_norm_eps, r);
    RopeAngles& ang = rope_angles(pos);
    rope_.rotate(r + kvl, ang.c.data(), ang.s.data(), rope_form_);
    for (int64_t i = 0; i < nh; ++i) {
      rope_.rotate(q + (t * nh + i) * qk + nope, ang.c.data(), ang.s.data(), rope_form_);
    }
    if (latent) {
      const SeqId seq = parts_[static_cast<size_t>(part_of_[static_cast<size_t>(t)])].seq;
      cache.write_row(l, KvPart::kKey, seq, pos, 0, r);
    }
  });
}

// Naive MLA: per-head K (nope part + the shared rope key) and V decompressed into the cache, then
// multi-head attention per part.
void CpuForwardOps::mla_naive(KvCache& cache, int64_t l, int64_t n, const float* q,
                              const float* kv, float* o) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[l];
  const int64_t nope = c.qk_nope_head_dim, rd = c.qk_rope_head_dim, kvl = c.kv_lora_rank;
  const int64_t vd = c.v_head_dim, nh = c.num_heads, qk = nope + rd, kr = kvl + rd;
  float* lat = grow(t0_, n * kvl);
  float* tmp = grow(t2_, n * std::max(nope, vd));
  for (int64_t t = 0; t < n; ++t) std::copy(kv + t * kr, kv + t * kr + kvl, lat + t * kvl);
  std::vector<float> row(static_cast<size_t>(qk));  // a head's K: nope part, then the rope key
  for (int64_t i = 0; i < nh; ++i) {
    if (lw.k_up_transposed) {
      ops::matmul_transposed(lw.k_up[i], lat, n, tmp);
    } else {
      ops::matmul(lw.k_up[i], lat, n, tmp, nullptr);
    }
    for (int64_t t = 0; t < n; ++t) {
      std::copy(tmp + t * nope, tmp + (t + 1) * nope, row.data());
      std::copy(kv + t * kr + kvl, kv + (t + 1) * kr, row.data() + nope);
      const Part& p = parts_[static_cast<size_t>(part_of_[static_cast<size_t>(t)])];
      cache.write_row(l, KvPart::kKey, p.seq, pos_[static_cast<size_t>(t)], i, row.data());
    }
    ops::matmul(lw.v_up[i], lat, n, tmp, nullptr);
    for (int64_t t = 0; t < n; ++t) {
      const Part& p = parts_[static_cast<size_t>(part_of_[static_cast<size_t>(t)])];
      cache.write_row(l, KvPart::kValue, p.seq, pos_[static_cast<size_t>(t)], i, tmp + t * vd);
    }
  }
  for (const Part& p : parts_) {
    ops::AttentionArgs kv_args;
    cache.attention_args(l, p.seq, &kv_args);
    attend_per_head(p, q, kv_args, o);
  }
}

// The parts that attend absorbed: their token rows (rows_) and attention args over the latent
// cache (q_cat per head into qc, outputs into att); the expanded parts attend here, into o.
// Returns whether the absorbed attention is a decode's (one token per part, none split).
bool CpuForwardOps::mla_absorbed_args(KvCache& cache, int64_t l, const float* q, float* qc,
                                      float* att, float* o, std::vector<ops::AttentionArgs>* args) {
  const ModelConfig& c = w_.config;
  const int64_t kvl = c.kv_lora_rank, nh = c.num_heads, kr = kvl + c.qk_rope_head_dim;
  rows_.clear();
  bool decode = pool_ != nullptr;  // every absorbed part one token, none split over the threads
  args->clear();
  args->reserve(parts_.size());
  for (const Part& p : parts_) {
    // (Expanded: every position's K / V; a sparse part reads its selection's latents.)
    if (mla_expands(l, p.n, p.pos0 + p.n) && !part_is_sparse(p)) {
      attention_mla_expanded(cache, l, p, q, o);
      decode = false;
      continue;
    }
    for (int64_t j = 0; j < p.n; ++j) rows_.push_back(p.t0 + j);
    decode = decode && p.n == 1;
    // q_cat per head: W_UK^T q_nope (kvl values) then q_pe, scored against [latent, k_pe].
    ops::AttentionArgs a;
    a.q = qc + p.t0 * nh * kr;
    a.q_stride = nh * kr;
    a.n_tokens = p.n;
    a.n_heads = nh;
    a.n_kv_heads = 1;
    a.dk = kr;
    a.dv = kvl;
    cache.attention_args(l, p.seq, &a);  // the values: each row's first kvl
    a.pos0 = p.pos0;
    a.scale = attn_scale_;
    a.out = att + p.t0 * nh * kvl;
    add_attention(a, p.t0, args);
  }
  for (const ops::AttentionArgs& a : *args) {
    decode = decode && a.n_tokens == 1 && !kern::attention_splits_cache(a, pool_);
  }
  return decode;
}

// The absorbed rows' heads: W_UK^T q_nope into qc, the attention, W_UV into o.
void CpuForwardOps::mla_absorbed_heads(const LayerWeights& lw, const float* q, float* qc,
                                       const float* att, const std::vector<ops::AttentionArgs>& args,
                                       bool decode, float* o) {
  const ModelConfig& c = w_.config;
  const int64_t nope = c.qk_nope_head_dim, rd = c.qk_rope_head_dim, kvl = c.kv_lora_rank;
  const int64_t vd = c.v_head_dim, nh = c.num_heads, qk = nope + rd, kr = kvl + rd;
  const int64_t na = static_cast<int64_t>(rows_.size());
  // Heads are independent: one task each (per-thread scratch), threaded for prefill.
  auto q_head = [&](size_t head) {
    const int64_t i = static_cast<int64_t>(head);
    thread_local std::vector<float> lat_l, tmp_l;
    lat_l.resize(static_cast<size_t>(na * nope));
    tmp_l.resize(static_cast<size_t>(na * kvl));
    for (int64_t j = 0; j < na; ++j) {
      const float* src = q + (rows_[j] * nh + i) * qk;
      std::copy(src, src + nope, lat_l.data() + j * nope);
    }
    // (kern: quantized activations where llama.cpp's absorbed MLA quantizes them too. Every
    // sequence's tokens in one product: a row's numbers do not depend on the rows beside it.)
    if (lw.k_up_transposed) {
      kern::matmul(lw.k_up[i], lat_l.data(), na, tmp_l.data(), nullptr, views_);
    } else {
      ops::matmul_transposed(lw.k_up[i], lat_l.data(), na, tmp_l.data());
    }
    for (int64_t j = 0; j < na; ++j) {
      const int64_t t = rows_[j];
      float* dst = qc + (t * nh + i) * kr;
      std::copy(tmp_l.data() + j * kvl, tmp_l.data() + (j + 1) * kvl, dst);
      const float* pe = q + (t * nh + i) * qk + nope;
      std::copy(pe, pe + rd, dst + kvl);
    }
  };
  auto v_head = [&](size_t head) {
    const int64_t i = static_cast<int64_t>(head);
    thread_local std::vector<float> lat_l, tmp_l;
    lat_l.resize(static_cast<size_t>(na * kvl));
    tmp_l.resize(static_cast<size_t>(na * vd));
    for (int64_t j = 0; j < na; ++j) {
      const float* src = att + (rows_[j] * nh + i) * kvl;
      std::copy(src, src + kvl, lat_l.data() + j * kvl);
    }
    kern::matmul(lw.v_up[i], lat_l.data(), na, tmp_l.data(), nullptr, views_);
    for (int64_t j = 0; j < na; ++j) {
      std::copy(tmp_l.data() + j * vd, tmp_l.data() + (j + 1) * vd, o + (rows_[j] * nh + i) * vd);
    }
  };
  if (decode) {
    // Decode (one token per sequence): one job instead of three, each thread a contiguous range
    // of heads through W_UK (for every sequence's token at once: the weights read once), those
    // heads' attention over each sequence's latent cache, then their W_UV (the heads share no
    // data: two dispatches and their waits fewer per layer, every head's arithmetic as below).
    // Where kern::attention on the pool would split a cache over the threads (a long context;
    // each thread would read all of it here): the three steps.
    const size_t heads = static_cast<size_t>(nh);
    const size_t ranges = std::min(heads, static_cast<size_t>(pool_->size()) + 1);
    pool_->run(ranges, [&](size_t r) {
      const size_t h0 = r * heads / ranges, h1 = (r + 1) * heads / ranges;
      for (size_t h = h0; h < h1; ++h) q_head(h);
      for (const ops::AttentionArgs& a : args) {
        ops::AttentionArgs range = a;
        range.q = a.q + static_cast<int64_t>(h0) * kr;
        range.n_heads = static_cast<int64_t>(h1 - h0);
        range.out = a.out + static_cast<int64_t>(h0) * kvl;
        kern::attention(range, nullptr);
      }
      for (size_t h = h0; h < h1; ++h) v_head(h);
    });
  } else {
    for_heads(nh, na, q_head);
    for (const ops::AttentionArgs& a : args) kern::attention(a, pool_);
    for_heads(nh, na, v_head);
  }
}

// Multi-head attention of part p over per-head K [position, heads, qk] and V [position, heads,
// v] (naive and expanded MLA) into o's rows of the part.
void CpuForwardOps::attend_per_head(const Part& p, const float* q, ops::AttentionArgs args,
                                    float* o) {
  const ModelConfig& c = w_.config;
  const int64_t nh = c.num_heads, qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  const int64_t vd = c.v_head_dim;
  args.q = q + p.t0 * nh * qk;
  args.q_stride = nh * qk;
  args.n_tokens = p.n;
  args.n_heads = nh;
  args.n_kv_heads = nh;
  args.dk = qk;
  args.dv = vd;
  args.pos0 = p.pos0;
  args.scale = attn_scale_;
  args.out = o + p.t0 * nh * vd;
  std::vector<ops::AttentionArgs> split;
  add_attention(args, p.t0, &split);
  for (const ops::AttentionArgs& a : split) kern::attention(a, pool_);
}

bool CpuForwardOps::mla_expands(int64_t l, int64_t n, int64_t positions_in) const {
  if (mla_ != MlaMode::kAuto || n < std::max<int64_t>(1, mla_expand_tokens_)) return false;
  const ModelConfig& c = w_.config;
  if (mla_expand_by_cost_ && !mla_expansion_pays(c, n, positions_in)) return false;
  const uint64_t positions = static_cast<uint64_t>(positions_in);
  const uint64_t per_position =
      static_cast<uint64_t>(c.num_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim));
  if (positions * per_position * 4 > kMlaExpandBytes) return false;
  // The up-projections need kernels (a GGUF k_b is expanded to F32 per call, any GGUF dtype;
  // its F32 product and the blocked attention are AVX-512 code).
  if (best_isa() < Isa::kAvx512) return false;
  const LayerWeights& lw = w_.layers[l];
  if (lw.k_up_transposed && lw.k_up[0].scale_inv != nullptr) return false;
  kern::KMatrix m;
  return kernel_view(lw.v_up[0], views_, &m) &&
         (lw.k_up_transposed || kernel_view(lw.k_up[0], views_, &m));
}

// MLA attention of part p in the naive form over its latent cache: every cached position's
// per-head K (W_UK latent, then the shared rope key) and V (W_UV latent) computed for this call,
// then multi-head attention (kern::attention runs a KV head per head in blocks of query tokens)
// into o's rows of the part. q: [n, heads, qk_nope + rope], rotated; the sequence holds
// positions [0, pos0 + n).
void CpuForwardOps::attention_mla_expanded(const KvCache& kv_cache, int64_t l, const Part& p,
                                           const float* q, float* o) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[l];
  const int64_t nope = c.qk_nope_head_dim, rd = c.qk_rope_head_dim, kvl = c.kv_lora_rank;
  const int64_t vd = c.v_head_dim, nh = c.num_heads, qk = nope + rd, kr = kvl + rd;
  const int64_t np = p.pos0 + p.n;
  // [np, kr]: latent, then rope key, gathered from the sequence's blocks (and widened) once per
  // call.
  float* cache = grow(lat_f32_, np * kr);
  for (int64_t s = 0; s < np; ++s) kv_cache.read_row(l, KvPart::kKey, p.seq, s, 0, cache + s * kr);
  float* K = grow(ek_, np * nh * qk);
  float* V = grow(ev_, np * nh * vd);
  // The latents in each activation encoding the up-projections read, converted once for all
  // heads (a transposed GGUF k_b reads the cache's F32 rows in place).
  // (A deque: the references taken stay valid as it grows; an entry per encoding, kept across
  // layers and calls, converted once per layer.)
  for (kern::Activations& a : lat_acts_) a.tokens = -1;
  auto acts_for = [&](const kern::KMatrix& m) -> const kern::Activations& {
    const kern::AFormat f = kern::act_format(m.format);
    kern::Activations* slot = nullptr;
    for (kern::Activations& a : lat_acts_) {
      if (a.format == f && a.group == m.group) slot = &a;
    }
    if (slot == nullptr) slot = &lat_acts_.emplace_back();
    if (slot->tokens != np) {
      kern::quantize_activations(f, m.group, cache, np, kvl, kr, slot, pool_);
    }
    return *slot;
  };
  std::vector<kern::KMatrix> km(static_cast<size_t>(nh)), vm(static_cast<size_t>(nh));
  std::vector<const kern::Activations*> ka(static_cast<size_t>(nh)), va(ka.size());
  for (int64_t i = 0; i < nh; ++i) {
    const size_t h = static_cast<size_t>(i);
    TD_CHECK(kernel_view(lw.v_up[h], views_, &vm[h]), "expanded MLA: no kernel for v_b");
    va[h] = &acts_for(vm[h]);
    if (!lw.k_up_transposed) {
      TD_CHECK(kernel_view(lw.k_up[h], views_, &km[h]), "expanded MLA: no kernel for k_b");
      ka[h] = &acts_for(km[h]);
    }
  }
  auto head = [&](size_t h) {
    const int64_t i = static_cast<int64_t>(h);
    if (lw.k_up_transposed) {
      // GGUF k_b [kv_lora, qk_nope]: its rows run along the reduction; in F32 as stored.
      thread_local std::vector<float> wk;
      const ops::Weight& w = lw.k_up[h];
      wk.resize(static_cast<size_t>(kvl * nope));
      dequantize_row(w.t.dtype, w.t.row<const void>(0), wk.data(), kvl * nope);
      kern::gemm_f32_kn(cache, kr, np, wk.data(), kvl, nope, K + i * qk, nh * qk);
    } else {
      kern::gemm(km[h], *ka[h], 0, nope, K + i * qk, nh * qk);
    }
    kern::gemm(vm[h], *va[h], 0, vd, V + i * vd, nh * vd);
    for (int64_t s = 0; s < np; ++s) {
      const float* pe = cache + s * kr + kvl;
      std::copy(pe, pe + rd, K + (s * nh + i) * qk + nope);
    }
  };
  if (pool_ != nullptr) {
    pool_->run(static_cast<size_t>(nh), head);
  } else {
    for (int64_t i = 0; i < nh; ++i) head(static_cast<size_t>(i));
  }
  ops::AttentionArgs kv_args;
  kv_args.k = K;
  kv_args.v = V;
  kv_args.k_stride = nh * qk;
  kv_args.v_stride = nh * vd;
  attend_per_head(p, q, kv_args, o);
}

}  // namespace

std::unique_ptr<ForwardOps> make_cpu_forward_ops(const LoadedModel& weights,
                                                 const ForwardOpsOptions& options) {
  return std::make_unique<CpuForwardOps>(weights, options);
}

}  // namespace tandem
