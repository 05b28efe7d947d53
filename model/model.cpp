#include "model/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/fp_convert.h"
#include "core/thread_pool.h"
#include "core/topology.h"
#include "model/router.h"
#include "formats/quant.h"
#include "ops/cpu/kernels.h"

namespace tandem {

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace
namespace {

template <typename T>
T* grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

void add_into(float* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

MlaMode parse_mla_mode(const std::string& name) {
  if (name == "auto") return MlaMode::kAuto;
  if (name == "absorbed") return MlaMode::kAbsorbed;
  if (name == "naive") return MlaMode::kNaive;
  fail(ErrorKind::kInvalidArgument, "--mla must be 'auto', 'absorbed' or 'naive', got '{}'", name);
}

Model::Model(const LoadedModel& weights, const ModelOptions& options)
    : w_(weights),
      pool_(options.pool),
      views_(options.views),
      mla_(options.mla),
      mla_expand_tokens_(options.mla_expand_tokens),
      mla_expand_by_cost_(options.mla_expand_by_cost),
      on_routing_(options.on_routing) {
  const ModelConfig& c = w_.config;
  if (options.moe != nullptr) {
    moe_ = options.moe;
  } else {
    own_moe_ = std::make_unique<CpuMoeBackend>(pool_);
    moe_ = own_moe_.get();
  }
  moe_index_.assign(c.num_layers, -1);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (w_.layers[l].moe) moe_index_[l] = n_moe_layers_++;
  }
  rope_ = ops::Rope(c.rope_dim, c.rope_theta, c.rope_scaling);
  // llama.cpp's GGUF Mixtral has q/k rows permuted for the interleaved form; HF keeps rotate_half.
  // DeepSeek's q_pe / k_pe are interleaved in both layouts.
  const bool interleaved = c.is_mla() || (c.arch == ModelArch::kMixtral && w_.from_gguf);
  rope_form_ = interleaved ? ops::RopeForm::kInterleaved : ops::RopeForm::kNeox;
  attn_scale_ = 1.0f / std::sqrt(static_cast<float>(c.head_dim)) * rope_.softmax_scale_factor();
}

KvLayout Model::kv_layout() const {
  const ModelConfig& c = w_.config;
  KvLayout l;
  l.layers = c.num_layers;
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
  if (!(cache.layout() == kv_layout())) {
    fail(ErrorKind::kInvalidArgument,
         "forward: the KV cache was made for another layout (another model or --mla form)");
  }
  parts_.clear();
  std::vector<KvCache::Write> writes;
  writes.reserve(batch.size());
  int64_t n = 0;
  for (const SeqTokens& e : batch) {
    const int64_t m = static_cast<int64_t>(e.tokens.size());
    if (m == 0) fail(ErrorKind::kInvalidArgument, "forward: no tokens for sequence {}", e.seq);
    for (int32_t id : e.tokens) {
      if (id < 0 || id >= c.vocab_size) {
        fail(ErrorKind::kOutOfRange, "token id {} is outside the vocabulary [0, {})", id,
             c.vocab_size);
      }
    }
    const int64_t pos0 = e.pos0 < 0 ? cache.length(e.seq) : e.pos0;
    parts_.push_back(Part{e.seq, n, m, pos0});
    writes.push_back(KvCache::Write{e.seq, pos0, e.tokens});
    n += m;
  }
  cache.make_writable(writes);  // (checks every entry before it changes anything)
  try {
    tok_.resize(static_cast<size_t>(n));
    part_of_.resize(static_cast<size_t>(n));
    pos_.resize(static_cast<size_t>(n));
    for (size_t i = 0; i < parts_.size(); ++i) {
      const Part& p = parts_[i];
      for (int64_t j = 0; j < p.n; ++j) {
        tok_[static_cast<size_t>(p.t0 + j)] = batch[i].tokens[static_cast<size_t>(j)];
        part_of_[static_cast<size_t>(p.t0 + j)] = static_cast<int32_t>(i);
        pos_[static_cast<size_t>(p.t0 + j)] = p.pos0 + j;
      }
    }
    float* x = grow(x_, n * hd);
    ops::embedding(w_.embed, tok_.data(), n, x);
    run_layers(cache, n);
    rows_.clear();
    for (size_t i = 0; i < parts_.size(); ++i) {
      const Part& p = parts_[i];
      if (batch[i].logits == LogitRows::kAll) {
        for (int64_t j = 0; j < p.n; ++j) rows_.push_back(p.t0 + j);
      } else if (batch[i].logits == LogitRows::kLast) {
        rows_.push_back(p.t0 + p.n - 1);
      }
    }
    const int64_t rows = static_cast<int64_t>(rows_.size());
    if (rows == 0) return 0;
    float* h = grow(h_, n * hd);
    for (int64_t j = 0; j < rows; ++j) {
      ops::rms_norm(x + rows_[j] * hd, w_.out_norm.data(), hd, c.rms_norm_eps, h + j * hd);
    }
    const auto t2 = Clock::now();
    kern::matmul(w_.lm_head, h, rows, logits, pool_, views_);
    profile_.lm_head += seconds(t2);
    return rows;
  } catch (...) {
    // The entries' positions were taken but not (all) written: give them back.
    for (const Part& p : parts_) {
      if (cache.contains(p.seq)) cache.truncate(p.seq, p.pos0);
    }
    throw;
  }
}

void Model::run_layers(KvCache& cache, int64_t n) {
  const ModelConfig& c = w_.config;
  const int64_t hd = c.hidden_size;
  float* x = x_.data();
  float* h = grow(h_, n * hd);
  float* a = grow(a_, n * hd);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w_.layers[l];
    for (int64_t t = 0; t < n; ++t) {
      ops::rms_norm(x + t * hd, lw.attn_norm.data(), hd, c.rms_norm_eps, h + t * hd);
    }
    const auto t0 = Clock::now();
    if (c.is_mla()) {
      attention_mla(cache, l, n, h, a);
    } else {
      attention_mha(cache, l, n, h, a);
    }
    profile_.attention += seconds(t0);
    add_into(x, a, n * hd);
    for (int64_t t = 0; t < n; ++t) {
      ops::rms_norm(x + t * hd, lw.ffn_norm.data(), hd, c.rms_norm_eps, h + t * hd);
    }
    const auto t1 = Clock::now();
    ffn(l, n, h, a);
    profile_.ffn += seconds(t1);
    add_into(x, a, n * hd);
  }
}

template <typename F>
void Model::for_parts(F&& fn) {
  bool decode = parts_.size() > 1 && pool_ != nullptr;
  for (const Part& p : parts_) decode = decode && p.n == 1;
  if (decode) {
    pool_->run(parts_.size(), [&](size_t i) { fn(parts_[i], nullptr); });
  } else {
    for (const Part& p : parts_) fn(p, pool_);
  }
}

void Model::attention_mha(KvCache& cache, int64_t l, int64_t n, const float* x, float* out) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[l];
  const int64_t d = c.head_dim, nq = c.num_heads, nkv = c.num_kv_heads;
  float* q = grow(q_, n * nq * d);
  float* k = grow(k_, n * nkv * d);
  float* v = grow(v_, n * nkv * d);
  {
    const ops::Weight* ws[3] = {&lw.wq, &lw.wk, &lw.wv};
    float* ys[3] = {q, k, v};
    kern::matmul_shared_input(ws, x, n, ys, pool_, views_);
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
      cache.write_row(l, false, seq, pos, i, kt + i * d);
      cache.write_row(l, true, seq, pos, i, vt + i * d);
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
    cache.attention_args(l, p.seq, &args);
    args.pos0 = p.pos0;
    args.scale = attn_scale_;
    if (c.is_swa_layer(l)) args.window = c.sliding_window;
    if (!lw.sinks.empty()) args.sinks = lw.sinks.data();
    args.out = att + p.t0 * nq * d;
    kern::attention(args, pool);
  });
  kern::matmul(lw.wo, att, n, out, pool_, views_);
  if (!lw.bo.empty()) {
    for (int64_t t = 0; t < n; ++t) add_into(out + t * c.hidden_size, lw.bo.data(), c.hidden_size);
  }
}

// The rotary angles of one position (computed once for all of a token's heads), per thread.
Model::RopeAngles& Model::rope_angles(int64_t pos) const {
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
void Model::for_tokens(int64_t n, F&& fn) {
  if (pool_ != nullptr && n > 1) {
    pool_->run(static_cast<size_t>(n), [&](size_t t) { fn(static_cast<int64_t>(t)); });
  } else {
    for (int64_t t = 0; t < n; ++t) fn(t);
  }
}

template <typename F>
void Model::for_heads(int64_t n_heads, int64_t n_tokens, F&& fn) {
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

void Model::attention_mla(KvCache& cache, int64_t l, int64_t n, const float* x, float* out) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[l];
  const int64_t nope = c.qk_nope_head_dim, rd = c.qk_rope_head_dim, kvl = c.kv_lora_rank;
  const int64_t vd = c.v_head_dim, nh = c.num_heads, qk = nope + rd, kr = kvl + rd;
  float* q = grow(q_, n * nh * qk);
  float* kv = grow(k_, n * kr);  // per token: latent [kvl] then rope key [rd]
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
    kern::matmul(lw.wq_b, qa, n, q, pool_, views_);
  } else {
    const ops::Weight* ws[2] = {&lw.wq, &lw.wkv_a};
    float* ys[2] = {q, kv};
    kern::matmul_shared_input(ws, x, n, ys, pool_, views_);
  }
  const bool latent = mla_ != MlaMode::kNaive;
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
      cache.write_row(l, false, seq, pos, 0, r);
    }
  });
  float* o = grow(v_, n * nh * vd);  // the heads' outputs, before wo
  if (!latent) {
    // Naive: decompress per-head K (nope part + the shared rope key) and V into the cache.
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
        cache.write_row(l, false, p.seq, pos_[static_cast<size_t>(t)], i, row.data());
      }
      ops::matmul(lw.v_up[i], lat, n, tmp, nullptr);
      for (int64_t t = 0; t < n; ++t) {
        const Part& p = parts_[static_cast<size_t>(part_of_[static_cast<size_t>(t)])];
        cache.write_row(l, true, p.seq, pos_[static_cast<size_t>(t)], i, tmp + t * vd);
      }
    }
    for (const Part& p : parts_) {
      ops::AttentionArgs kv_args;
      cache.attention_args(l, p.seq, &kv_args);
      attend_per_head(p, q, kv_args, o);
    }
    kern::matmul(lw.wo, o, n, out, pool_, views_);
    return;
  }
  // Each sequence's chunk attends expanded (a large prefill chunk) or absorbed; the absorbed
  // tokens' rows go through W_UK / W_UV together.
  rows_.clear();
  bool decode = pool_ != nullptr;  // every absorbed part one token, none split over the threads
  std::vector<ops::AttentionArgs> args;
  args.reserve(parts_.size());
  float* qc = grow(t1_, n * nh * kr);
  float* att = grow(att_, n * nh * kvl);
  for (const Part& p : parts_) {
    if (mla_expands(l, p.n, p.pos0 + p.n)) {
      attention_mla_expanded(cache, l, p, q, o);
      decode = false;
      continue;
    }
    for (int64_t j = 0; j < p.n; ++j) rows_.push_back(p.t0 + j);
    // q_cat per head: W_UK^T q_nope (kvl values) then q_pe, scored against [latent, k_pe].
    ops::AttentionArgs& a = args.emplace_back();
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
    decode = decode && p.n == 1 && !kern::attention_splits_cache(a, pool_);
  }
  if (rows_.empty()) {
    kern::matmul(lw.wo, o, n, out, pool_, views_);
    return;
  }
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
  kern::matmul(lw.wo, o, n, out, pool_, views_);
}

// Multi-head attention of part p over per-head K [position, heads, qk] and V [position, heads,
// v] (naive and expanded MLA) into o's rows of the part.
void Model::attend_per_head(const Part& p, const float* q, ops::AttentionArgs args, float* o) {
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
  kern::attention(args, pool_);
}

namespace {

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

}  // namespace

bool mla_expansion_pays(const ModelConfig& c, int64_t n, int64_t positions) {
  const double kvl = static_cast<double>(c.kv_lora_rank);
  const double up = kvl * static_cast<double>(c.qk_nope_head_dim + c.v_head_dim);
  const double narrower = 2 * kvl - static_cast<double>(c.qk_nope_head_dim + c.v_head_dim);
  const double p = static_cast<double>(positions), t = static_cast<double>(n);
  return t * (narrower * p + up) > p * up;
}

bool Model::mla_expands(int64_t l, int64_t n, int64_t positions_in) const {
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
void Model::attention_mla_expanded(const KvCache& kv_cache, int64_t l, const Part& p,
                                   const float* q, float* o) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[l];
  const int64_t nope = c.qk_nope_head_dim, rd = c.qk_rope_head_dim, kvl = c.kv_lora_rank;
  const int64_t vd = c.v_head_dim, nh = c.num_heads, qk = nope + rd, kr = kvl + rd;
  const int64_t np = p.pos0 + p.n;
  // [np, kr]: latent, then rope key, gathered from the sequence's blocks (and widened) once per
  // call.
  float* cache = grow(lat_f32_, np * kr);
  for (int64_t s = 0; s < np; ++s) kv_cache.read_row(l, false, p.seq, s, 0, cache + s * kr);
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

void Model::dense_ffn(const ops::Weight& g, const ops::Weight& u, const ops::Weight& d, int64_t n,
                      const float* x, float* out) {
  kern::swiglu_ffn(g, u, d, x, n, out, pool_, views_, &t1_, &t2_);
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
               return o;
             }()),
      seq_(cache_.create()) {}

void SingleSequence::forward(std::span<const int32_t> tokens, float* logits, bool all_rows) {
  const SeqTokens entry{seq_, tokens, -1, all_rows ? LogitRows::kAll : LogitRows::kLast};
  model_.forward(std::span<const SeqTokens>(&entry, 1), cache_, logits);
}

void Model::ffn(int64_t l, int64_t n, const float* x, float* out) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[l];
  const int64_t hd = c.hidden_size;
  if (!lw.moe) {
    dense_ffn(lw.ffn_gate, lw.ffn_up, lw.ffn_down, n, x, out);
    return;
  }
  const int64_t ne = c.n_experts, k = c.n_experts_per_tok;
  float* routed = grow(b_, n * hd);
  MoeRequest req;
  req.layer = l;
  req.moe_index = moe_index_[l];
  req.n_moe_layers = n_moe_layers_;
  req.decode = n == 1;
  req.layer_weights = &lw;
  req.experts = &lw.experts;
  req.hidden = x;
  req.n_tokens = n;
  req.hidden_size = hd;
  req.k = k;
  req.out = routed;
  // What does not depend on the routing (the backend's shared experts) starts first: it streams
  // while the router and the routing run.
  moe_->begin(req);
  float* logits = grow(t0_, n * ne);
  kern::matmul(lw.router, x, n, logits, pool_, views_);
  if (!lw.router_logit_bias.empty()) {
    for (int64_t t = 0; t < n; ++t) add_into(logits + t * ne, lw.router_logit_bias.data(), ne);
  }
  int32_t* ids = grow(ids_, n * k);
  float* wts = grow(topw_, n * k);
  const float* bias = lw.router_bias.empty() ? nullptr : lw.router_bias.data();
  for (int64_t t = 0; t < n; ++t) {
    route_token(c, logits + t * ne, bias, ids + t * k, wts + t * k, route_scratch_);
  }
  if (on_routing_) {
    RoutingEvent ev;
    ev.layer = l;
    ev.moe_index = moe_index_[l];
    ev.n_tokens = n;
    ev.k = k;
    ev.n_experts = ne;
    ev.hidden_size = hd;
    ev.pos0 = pos_[0];
    ev.positions = pos_.data();
    ev.ids = ids;
    ev.weights = wts;
    ev.logits = logits;
    ev.hidden = x;
    on_routing_(ev);
  }
  req.ids = ids;
  req.weights = wts;
  moe_->submit(req);
  if (moe_->computes_shared()) {
    std::fill(out, out + n * hd, 0.0f);
  } else if (!lw.sh_gate.empty()) {
    dense_ffn(lw.sh_gate, lw.sh_up, lw.sh_down, n, x, out);
    if (!lw.sh_gate_inp.empty()) {
      for (int64_t t = 0; t < n; ++t) {
        const float gate = shared_expert_gate(x + t * hd, lw.sh_gate_inp.data(), hd);
        for (int64_t i = 0; i < hd; ++i) out[t * hd + i] *= gate;
      }
    }
  } else {
    std::fill(out, out + n * hd, 0.0f);
  }
  const auto tw = Clock::now();
  moe_->wait();
  profile_.moe_wait += seconds(tw);
  add_into(out, routed, n * hd);
}

}  // namespace tandem
