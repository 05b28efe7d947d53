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

KvType parse_kv_type(const std::string& name) {
  if (name == "f32") return KvType::kF32;
  if (name == "bf16") return KvType::kBf16;
  if (name == "f16") return KvType::kF16;
  if (name == "q8_0") return KvType::kQ8_0;
  fail(ErrorKind::kInvalidArgument,
       "--cache-type must be 'f32', 'bf16', 'f16' or 'q8_0', got '{}'", name);
}

MlaMode parse_mla_mode(const std::string& name) {
  if (name == "auto") return MlaMode::kAuto;
  if (name == "absorbed") return MlaMode::kAbsorbed;
  if (name == "naive") return MlaMode::kNaive;
  fail(ErrorKind::kInvalidArgument, "--mla must be 'auto', 'absorbed' or 'naive', got '{}'", name);
}

Model::Model(const LoadedModel& weights, const ModelOptions& options)
    : w_(weights),
      ctx_(options.ctx),
      pool_(options.pool),
      views_(options.views),
      mla_(options.mla),
      kv_type_(options.kv_type),
      mla_expand_tokens_(options.mla_expand_tokens),
      mla_expand_by_cost_(options.mla_expand_by_cost),
      on_routing_(options.on_routing) {
  const ModelConfig& c = w_.config;
  if (ctx_ <= 0) fail(ErrorKind::kInvalidArgument, "context size must be positive, got {}", ctx_);
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

  KvRows k_rows, v_rows;  // a layer's: heads per position and values per head
  if (c.is_mla()) {
    if (mla_ != MlaMode::kNaive) {
      k_rows.heads = 1;
      k_rows.d = c.kv_lora_rank + c.qk_rope_head_dim;
    } else {
      k_rows.heads = v_rows.heads = c.num_heads;
      k_rows.d = c.head_dim;
      v_rows.d = c.v_head_dim;
    }
  } else {
    k_rows.heads = v_rows.heads = c.num_kv_heads;
    k_rows.d = v_rows.d = c.head_dim;
  }
  // Bytes per position.
  auto row_bytes = [&](const KvRows& r) -> uint64_t {
    if (r.heads == 0) return 0;
    const int64_t per_head = kv_type_ == KvType::kQ8_0  ? ops::q8_row_bytes(r.d)
                             : kv_type_ == KvType::kF32 ? 4 * r.d
                                                        : 2 * r.d;
    return static_cast<uint64_t>(r.heads * per_head);
  };
  const uint64_t bytes =
      static_cast<uint64_t>(ctx_) * (row_bytes(k_rows) + row_bytes(v_rows)) * c.num_layers;
  const uint64_t available = meminfo_bytes("MemAvailable");  // 0: unknown
  if (bytes > (uint64_t{1} << 40) || (available > 0 && bytes > available)) {
    fail(ErrorKind::kResource,
         "a KV cache of {} positions needs {:.1f} GiB, more than the {:.1f} GiB of memory "
         "available",
         ctx_, static_cast<double>(bytes) / 1073741824.0,
         static_cast<double>(available > 0 ? std::min(available, uint64_t{1} << 40)
                                           : uint64_t{1} << 40) /
             1073741824.0);
  }
  k_cache_.resize(c.num_layers);
  v_cache_.resize(c.num_layers);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (auto [rows, shape] : {std::pair{&k_cache_[l], &k_rows}, {&v_cache_[l], &v_rows}}) {
      rows->heads = shape->heads;
      rows->d = shape->d;
      const size_t n = static_cast<size_t>(ctx_ * shape->heads * shape->d);
      if (kv_type_ == KvType::kQ8_0) {
        rows->q8.assign(static_cast<size_t>(ctx_) * row_bytes(*shape) / 4, 0);
      } else if (kv_type_ != KvType::kF32) {
        rows->h16.assign(n, 0);
      } else {
        rows->f.assign(n, 0.0f);
      }
    }
  }
}

uint64_t Model::kv_cache_bytes() const {
  uint64_t b = 0;
  for (const std::vector<KvRows>* cache : {&k_cache_, &v_cache_}) {
    for (const KvRows& r : *cache) b += r.f.size() * 4 + r.h16.size() * 2 + r.q8.size() * 4;
  }
  return b;
}

int64_t Model::cache_row(const KvRows& rows) const {
  return kv_type_ == KvType::kQ8_0 ? ops::q8_row_bytes(rows.d) : rows.d;
}

void Model::cache_write(KvRows& rows, int64_t pos, int64_t head, const float* src) const {
  const int64_t at = (head * ctx_ + pos) * cache_row(rows);  // head-major
  switch (kv_type_) {
    case KvType::kF32:
      std::copy_n(src, rows.d, rows.f.data() + at);
      break;
    case KvType::kBf16:
    case KvType::kF16: {
      uint16_t* dst = rows.h16.data() + at;
      const bool f16 = kv_type_ == KvType::kF16;
      for (int64_t i = 0; i < rows.d; ++i) dst[i] = f16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
      break;
    }
    case KvType::kQ8_0:
      ops::q8_quantize(src, rows.d,
                       reinterpret_cast<int8_t*>(rows.q8.data()) + ops::q8_lead_bytes(rows.d) + at);
      break;
  }
}

void Model::cache_args(const KvRows& k, const KvRows& v, ops::AttentionArgs* a) const {
  if (kv_type_ == KvType::kQ8_0) {
    a->k8 = reinterpret_cast<const int8_t*>(k.q8.data()) + ops::q8_lead_bytes(k.d);
    a->v8 = reinterpret_cast<const int8_t*>(v.q8.data()) + ops::q8_lead_bytes(v.d);
  } else if (kv_type_ != KvType::kF32) {
    a->k16 = k.h16.data();
    a->v16 = v.h16.data();
    a->f16 = kv_type_ == KvType::kF16;
  } else {
    a->k = k.f.data();
    a->v = v.f.data();
  }
  // Head-major: a KV head's positions are consecutive rows.
  a->k_stride = cache_row(k);
  a->v_stride = cache_row(v);
  a->k_head = k.heads > 1 ? ctx_ * a->k_stride : 0;
  a->v_head = v.heads > 1 ? ctx_ * a->v_stride : 0;
}

void Model::cache_read(const KvRows& rows, int64_t pos, int64_t head, float* dst) const {
  const int64_t at = (head * ctx_ + pos) * cache_row(rows);
  switch (kv_type_) {
    case KvType::kF32:
      std::copy_n(rows.f.data() + at, rows.d, dst);
      break;
    case KvType::kBf16:
    case KvType::kF16: {
      const uint16_t* h = rows.h16.data() + at;
      const bool f16 = kv_type_ == KvType::kF16;
      for (int64_t i = 0; i < rows.d; ++i) dst[i] = f16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
      break;
    }
    case KvType::kQ8_0: {
      const int8_t* values =
          reinterpret_cast<const int8_t*>(rows.q8.data()) + ops::q8_lead_bytes(rows.d) + at;
      for (int64_t i = 0; i < rows.d; ++i) dst[i] = ops::q8_value(values, i);
      break;
    }
  }
}

void Model::forward(std::span<const int32_t> tokens, float* logits, bool all_rows) {
  const ModelConfig& c = w_.config;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t hd = c.hidden_size;
  if (n == 0) fail(ErrorKind::kInvalidArgument, "forward: no tokens");
  if (pos_ + n > ctx_) {
    fail(ErrorKind::kOutOfRange, "{} tokens at position {} exceed the context size {}", n, pos_,
         ctx_);
  }
  float* x = grow(x_, n * hd);
  ops::embedding(w_.embed, tokens.data(), n, x);
  float* h = grow(h_, n * hd);
  float* a = grow(a_, n * hd);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& lw = w_.layers[l];
    for (int64_t t = 0; t < n; ++t) {
      ops::rms_norm(x + t * hd, lw.attn_norm.data(), hd, c.rms_norm_eps, h + t * hd);
    }
    if (c.is_mla()) {
      const auto t0 = Clock::now();
      attention_mla(l, n, h, a);
      profile_.attention += seconds(t0);
    } else {
      const auto t0 = Clock::now();
      attention_mha(l, n, h, a);
      profile_.attention += seconds(t0);
    }
    add_into(x, a, n * hd);
    for (int64_t t = 0; t < n; ++t) {
      ops::rms_norm(x + t * hd, lw.ffn_norm.data(), hd, c.rms_norm_eps, h + t * hd);
    }
    const auto t1 = Clock::now();
    ffn(l, n, h, a);
    profile_.ffn += seconds(t1);
    add_into(x, a, n * hd);
  }
  pos_ += n;
  const int64_t first = all_rows ? 0 : n - 1;
  const int64_t rows = n - first;
  for (int64_t t = first; t < n; ++t) {
    ops::rms_norm(x + t * hd, w_.out_norm.data(), hd, c.rms_norm_eps, h + (t - first) * hd);
  }
  const auto t2 = Clock::now();
  kern::matmul(w_.lm_head, h, rows, logits, pool_, views_);
  profile_.lm_head += seconds(t2);
}

void Model::attention_mha(int64_t l, int64_t n, const float* x, float* out) {
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
    const int64_t pos = pos_ + t;
    float* qt = q + t * nq * d;
    float* kt = k + t * nkv * d;
    float* vt = v + t * nkv * d;
    if (!lw.bq.empty()) {
      add_into(qt, lw.bq.data(), nq * d);
      add_into(kt, lw.bk.data(), nkv * d);
      add_into(vt, lw.bv.data(), nkv * d);
    }
    RopeAngles& ang = rope_angles(pos);
    for (int64_t i = 0; i < nq; ++i) {
      if (!lw.q_norm.empty())
        ops::rms_norm(qt + i * d, lw.q_norm.data(), d, c.rms_norm_eps, qt + i * d);
      rope_.rotate(qt + i * d, ang.c.data(), ang.s.data(), rope_form_);
    }
    for (int64_t i = 0; i < nkv; ++i) {
      if (!lw.k_norm.empty())
        ops::rms_norm(kt + i * d, lw.k_norm.data(), d, c.rms_norm_eps, kt + i * d);
      rope_.rotate(kt + i * d, ang.c.data(), ang.s.data(), rope_form_);
    }
    for (int64_t i = 0; i < nkv; ++i) {
      cache_write(k_cache_[l], pos, i, kt + i * d);
      cache_write(v_cache_[l], pos, i, vt + i * d);
    }
  });
  ops::AttentionArgs args;
  args.q = q;
  args.q_stride = nq * d;
  args.n_tokens = n;
  args.n_heads = nq;
  args.n_kv_heads = nkv;
  args.dk = d;
  args.dv = d;
  cache_args(k_cache_[l], v_cache_[l], &args);
  args.pos0 = pos_;
  args.scale = attn_scale_;
  args.out = grow(att_, n * nq * d);
  kern::attention(args, pool_);
  kern::matmul(lw.wo, args.out, n, out, pool_, views_);
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

void Model::attention_mla(int64_t l, int64_t n, const float* x, float* out) {
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
  for_tokens(n, [&](int64_t t) {
    float* r = kv + t * kr;
    ops::rms_norm(r, lw.kv_a_norm.data(), kvl, c.rms_norm_eps, r);
    RopeAngles& ang = rope_angles(pos_ + t);
    rope_.rotate(r + kvl, ang.c.data(), ang.s.data(), rope_form_);
    for (int64_t i = 0; i < nh; ++i) {
      rope_.rotate(q + (t * nh + i) * qk + nope, ang.c.data(), ang.s.data(), rope_form_);
    }
  });
  float* lat = grow(t0_, n * std::max(kvl, nope));
  float* tmp = grow(t2_, n * std::max({kvl, nope, vd}));
  ops::AttentionArgs args;
  args.n_tokens = n;
  args.n_heads = nh;
  args.pos0 = pos_;
  args.scale = attn_scale_;
  if (mla_ != MlaMode::kNaive) {
    for (int64_t t = 0; t < n; ++t) cache_write(k_cache_[l], pos_ + t, 0, kv + t * kr);
    if (mla_expands(l, n)) {
      attention_mla_expanded(l, n, q, out);
      return;
    }
    // q_cat per head: W_UK^T q_nope (kvl values) then q_pe, scored against [latent, k_pe].
    float* qc = grow(t1_, n * nh * kr);
    // Heads are independent: one task each (per-thread scratch), threaded for prefill.
    auto q_head = [&](size_t head) {
      const int64_t i = static_cast<int64_t>(head);
      thread_local std::vector<float> lat_l, tmp_l;
      lat_l.resize(static_cast<size_t>(n * nope));
      tmp_l.resize(static_cast<size_t>(n * kvl));
      for (int64_t t = 0; t < n; ++t) {
        const float* src = q + (t * nh + i) * qk;
        std::copy(src, src + nope, lat_l.data() + t * nope);
      }
      // (kern: quantized activations where llama.cpp's absorbed MLA quantizes them too.)
      if (lw.k_up_transposed) {
        kern::matmul(lw.k_up[i], lat_l.data(), n, tmp_l.data(), nullptr, views_);
      } else {
        ops::matmul_transposed(lw.k_up[i], lat_l.data(), n, tmp_l.data());
      }
      for (int64_t t = 0; t < n; ++t) {
        float* dst = qc + (t * nh + i) * kr;
        std::copy(tmp_l.data() + t * kvl, tmp_l.data() + (t + 1) * kvl, dst);
        const float* pe = q + (t * nh + i) * qk + nope;
        std::copy(pe, pe + rd, dst + kvl);
      }
    };
    args.q = qc;
    args.q_stride = nh * kr;
    args.n_kv_heads = 1;
    args.dk = kr;
    args.dv = kvl;
    cache_args(k_cache_[l], k_cache_[l], &args);  // the values: each row's first kvl
    float* att = grow(att_, n * nh * kvl);
    args.out = att;
    float* o = grow(v_, n * nh * vd);
    auto v_head = [&](size_t head) {
      const int64_t i = static_cast<int64_t>(head);
      thread_local std::vector<float> lat_l, tmp_l;
      lat_l.resize(static_cast<size_t>(n * kvl));
      tmp_l.resize(static_cast<size_t>(n * vd));
      for (int64_t t = 0; t < n; ++t) {
        const float* src = att + (t * nh + i) * kvl;
        std::copy(src, src + kvl, lat_l.data() + t * kvl);
      }
      kern::matmul(lw.v_up[i], lat_l.data(), n, tmp_l.data(), nullptr, views_);
      for (int64_t t = 0; t < n; ++t) {
        std::copy(tmp_l.data() + t * vd, tmp_l.data() + (t + 1) * vd, o + (t * nh + i) * vd);
      }
    };
    if (n == 1 && pool_ != nullptr && !kern::attention_splits_cache(args, pool_)) {
      // Decode: one job instead of three, each thread a contiguous range of heads through W_UK,
      // those heads' attention over the latent cache, then their W_UV (the heads share no
      // data: two dispatches and their waits fewer per layer, every head's arithmetic as below).
      // Where kern::attention on the pool would split the cache over the threads (a long
      // context; each thread would read all of it here): the three steps.
      const size_t heads = static_cast<size_t>(nh);
      const size_t parts = std::min(heads, static_cast<size_t>(pool_->size()) + 1);
      pool_->run(parts, [&](size_t p) {
        const size_t h0 = p * heads / parts, h1 = (p + 1) * heads / parts;
        for (size_t h = h0; h < h1; ++h) q_head(h);
        ops::AttentionArgs range = args;
        range.q = qc + static_cast<int64_t>(h0) * kr;
        range.n_heads = static_cast<int64_t>(h1 - h0);
        range.out = att + static_cast<int64_t>(h0) * kvl;
        kern::attention(range, nullptr);
        for (size_t h = h0; h < h1; ++h) v_head(h);
      });
    } else {
      for_heads(nh, n, q_head);
      kern::attention(args, pool_);
      for_heads(nh, n, v_head);
    }
    kern::matmul(lw.wo, o, n, out, pool_, views_);
    return;
  }
  // Naive: decompress per-head K (nope part + the shared rope key) and V into the cache.
  for (int64_t t = 0; t < n; ++t) std::copy(kv + t * kr, kv + t * kr + kvl, lat + t * kvl);
  for (int64_t i = 0; i < nh; ++i) {
    if (lw.k_up_transposed) {
      ops::matmul_transposed(lw.k_up[i], lat, n, tmp);
    } else {
      ops::matmul(lw.k_up[i], lat, n, tmp, nullptr);
    }
    thread_local std::vector<float> row;  // a head's K: nope part, then the rope key
    row.resize(static_cast<size_t>(qk));
    for (int64_t t = 0; t < n; ++t) {
      std::copy(tmp + t * nope, tmp + (t + 1) * nope, row.data());
      std::copy(kv + t * kr + kvl, kv + (t + 1) * kr, row.data() + nope);
      cache_write(k_cache_[l], pos_ + t, i, row.data());
    }
    ops::matmul(lw.v_up[i], lat, n, tmp, nullptr);
    for (int64_t t = 0; t < n; ++t) {
      cache_write(v_cache_[l], pos_ + t, i, tmp + t * vd);
    }
  }
  ops::AttentionArgs kv_args;
  cache_args(k_cache_[l], v_cache_[l], &kv_args);
  attend_per_head(l, n, q, kv_args, out);
}

// Multi-head attention of n tokens over per-head K [position, heads, qk] and V [position, heads,
// v] (naive and expanded MLA), then wo.
void Model::attend_per_head(int64_t l, int64_t n, const float* q, ops::AttentionArgs args,
                            float* out) {
  const ModelConfig& c = w_.config;
  const int64_t nh = c.num_heads, qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  const int64_t vd = c.v_head_dim;
  args.q = q;
  args.q_stride = nh * qk;
  args.n_tokens = n;
  args.n_heads = nh;
  args.n_kv_heads = nh;
  args.dk = qk;
  args.dv = vd;
  args.pos0 = pos_;
  args.scale = attn_scale_;
  args.out = grow(att_, n * nh * vd);
  kern::attention(args, pool_);
  kern::matmul(w_.layers[l].wo, args.out, n, out, pool_, views_);
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

bool Model::mla_expands(int64_t l, int64_t n) const {
  if (mla_ != MlaMode::kAuto || n < std::max<int64_t>(1, mla_expand_tokens_)) return false;
  const ModelConfig& c = w_.config;
  if (mla_expand_by_cost_ && !mla_expansion_pays(c, n, pos_ + n)) return false;
  const uint64_t positions = static_cast<uint64_t>(pos_ + n);
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

// MLA attention of a batch in the naive form over the latent cache: every cached position's
// per-head K (W_UK latent, then the shared rope key) and V (W_UV latent) computed for this call,
// then multi-head attention (kern::attention runs a KV head per head in blocks of query tokens)
// and wo. q: [n, heads, qk_nope + rope], rotated; the cache holds positions [0, pos_ + n).
void Model::attention_mla_expanded(int64_t l, int64_t n, const float* q, float* out) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[l];
  const int64_t nope = c.qk_nope_head_dim, rd = c.qk_rope_head_dim, kvl = c.kv_lora_rank;
  const int64_t vd = c.v_head_dim, nh = c.num_heads, qk = nope + rd, kr = kvl + rd;
  const int64_t np = pos_ + n;
  // [np, kr]: latent, then rope key (a 16-bit or Q8_0 cache widened once per call)
  const float* cache = k_cache_[l].f.data();
  if (kv_type_ != KvType::kF32) {
    float* w = grow(lat_f32_, np * kr);
    for (int64_t s = 0; s < np; ++s) cache_read(k_cache_[l], s, 0, w + s * kr);
    cache = w;
  }
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
  attend_per_head(l, n, q, kv_args, out);
}

void Model::dense_ffn(const ops::Weight& g, const ops::Weight& u, const ops::Weight& d, int64_t n,
                      const float* x, float* out) {
  const int64_t ff = g.rows();
  float* gb = grow(t1_, n * ff);
  float* ub = grow(t2_, n * ff);
  const ops::Weight* ws[2] = {&g, &u};
  float* ys[2] = {gb, ub};
  kern::matmul_shared_input(ws, x, n, ys, pool_, views_);
  kern::swiglu(gb, ub, n * ff, gb);
  kern::matmul(d, gb, n, out, pool_, views_);
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
    ev.pos0 = pos_;
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
