#include "model/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {

LightningIndexer::LightningIndexer(const ModelConfig& c, ThreadPool* pool,
                                   const kern::WeightViews* views)
    : c_(c),
      pool_(pool),
      views_(views),
      rope_(c.rope_dim, c.rope_theta, c.rope_scaling),
      form_(c.index_rope_interleaved ? ops::RopeForm::kInterleaved : ops::RopeForm::kNeox) {}

void LightningIndexer::run(int64_t layer, const LayerWeights& lw, const float* x, const float* qr,
                           const ForwardStep& step, KvCache& cache, SparseSelection* out) {
  const int64_t n = step.n_tokens();
  sparse_.clear();
  for (int64_t t = 0; t < n; ++t) {
    if (step.pos[static_cast<size_t>(t)] + 1 > c_.index_topk) sparse_.push_back(t);
  }
  project(lw, x, qr, n);
  write_keys(layer, lw, step, cache);
  select(layer, step, cache, out);
}

// The keys and the heads' weights of every token; the queries where some token selects.
void LightningIndexer::project(const LayerWeights& lw, const float* x, const float* qr,
                               int64_t n) {
  const int64_t nh = c_.index_n_heads, d = c_.index_head_dim;
  if (static_cast<int64_t>(q_.size()) < n * nh * d) q_.resize(static_cast<size_t>(n * nh * d));
  if (static_cast<int64_t>(k_.size()) < n * d) k_.resize(static_cast<size_t>(n * d));
  if (static_cast<int64_t>(w_.size()) < n * nh) w_.resize(static_cast<size_t>(n * nh));
  const ops::Weight* ws[2] = {&lw.idx_wk, &lw.idx_weights};
  float* ys[2] = {k_.data(), w_.data()};
  kern::matmul_shared_input(ws, x, n, ys, pool_, views_);
  if (!sparse_.empty()) kern::matmul(lw.idx_wq_b, qr, n, q_.data(), pool_, views_);
}

// Each token's key normed, rotated and written into the cache; the selecting tokens' queries
// rotated; the weights scaled.
void LightningIndexer::write_keys(int64_t layer, const LayerWeights& lw, const ForwardStep& step,
                                  KvCache& cache) {
  const int64_t n = step.n_tokens(), nh = c_.index_n_heads, d = c_.index_head_dim;
  const int64_t il = c_.index_layer(layer);
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(d * nh));
  std::vector<float> c(static_cast<size_t>(rope_.dim() / 2)), s(c.size());
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = step.pos[static_cast<size_t>(t)];
    rope_.angles(pos, c.data(), s.data());
    float* kt = k_.data() + t * d;
    ops::layer_norm(kt, lw.idx_k_norm.data(), lw.idx_k_norm_bias.data(), d, 1e-6f, kt);
    rope_.rotate(kt, c.data(), s.data(), form_);
    ops::hadamard(kt, d);
    const SeqId seq = step.parts[static_cast<size_t>(step.part_of[static_cast<size_t>(t)])].seq;
    cache.write_index_row(il, seq, pos, kt);
    for (int64_t h = 0; h < nh; ++h) w_[static_cast<size_t>(t * nh + h)] *= w_scale;
    if (pos + 1 <= c_.index_topk) continue;
    for (int64_t h = 0; h < nh; ++h) {
      float* qh = q_.data() + (t * nh + h) * d;
      rope_.rotate(qh, c.data(), s.data(), form_);
      ops::hadamard(qh, d);
    }
  }
}

// Each selecting token's scores over the positions it sees, and the topk best (the earlier
// position first among equal scores), in position order.
void LightningIndexer::select(int64_t layer, const ForwardStep& step, const KvCache& cache,
                              SparseSelection* out) {
  const int64_t nh = c_.index_n_heads, d = c_.index_head_dim, topk = c_.index_topk;
  out->topk = topk;
  out->offset.assign(static_cast<size_t>(step.n_tokens()), -1);
  out->positions.resize(sparse_.size() * static_cast<size_t>(topk));
  for (size_t i = 0; i < sparse_.size(); ++i) {
    const int64_t t = sparse_[i], visible = step.pos[static_cast<size_t>(t)] + 1;
    const SeqId seq = step.parts[static_cast<size_t>(step.part_of[static_cast<size_t>(t)])].seq;
    ops::AttentionArgs keys;
    cache.index_args(c_.index_layer(layer), seq, &keys);
    keys.dk = d;
    if (static_cast<int64_t>(scores_.size()) < visible) scores_.resize(static_cast<size_t>(visible));
    kern::index_scores(keys, q_.data() + t * nh * d, w_.data() + t * nh, nh, visible,
                       scores_.data(), pool_);
    order_.resize(static_cast<size_t>(visible));
    for (int64_t p = 0; p < visible; ++p) order_[static_cast<size_t>(p)] = static_cast<int32_t>(p);
    const float* sc = scores_.data();
    std::nth_element(order_.begin(), order_.begin() + topk - 1, order_.end(),
                     [sc](int32_t a, int32_t b) { return sc[a] > sc[b] || (sc[a] == sc[b] && a < b); });
    std::sort(order_.begin(), order_.begin() + topk);
    out->offset[static_cast<size_t>(t)] = static_cast<int64_t>(i) * topk;
    std::copy(order_.begin(), order_.begin() + topk, out->positions.begin() + i * topk);
  }
}

namespace {

// Bytes of one cached row of d values and the offset of its first byte from the address the
// arguments point at (a Q8_0 row's scales come before its values), per element type.
struct RowShape {
  int64_t elem = 4;  // bytes per element of the strides (1 for Q8_0: strides in bytes)
  int64_t bytes = 0, lead = 0;
};
RowShape row_shape(const ops::AttentionArgs& a, int64_t d) {
  if (a.k8 != nullptr) return {1, ops::q8_row_bytes(d), ops::q8_lead_bytes(d)};
  if (a.k16 != nullptr) return {2, 2 * d, 0};
  return {4, 4 * d, 0};
}

// Copies the rows (every KV head's) of `positions` from the cache at `base` (keys or values)
// into dst, position after position with the heads side by side.
void gather_rows(const ops::AttentionArgs& a, const uint8_t* base, int64_t stride, int64_t block,
                 int64_t head_stride, const RowShape& r, std::span<const int32_t> positions,
                 uint8_t* dst) {
  for (const int32_t s : positions) {
    const int64_t at = ops::kv_offset(a, s, stride, block);
    for (int64_t g = 0; g < a.n_kv_heads; ++g) {
      std::memcpy(dst, base + (at + g * head_stride) * r.elem - r.lead,
                  static_cast<size_t>(r.bytes));
      dst += r.bytes;
    }
  }
}

const uint8_t* key_base(const ops::AttentionArgs& a) {
  return a.k8 != nullptr    ? reinterpret_cast<const uint8_t*>(a.k8)
         : a.k16 != nullptr ? reinterpret_cast<const uint8_t*>(a.k16)
                            : reinterpret_cast<const uint8_t*>(a.k);
}
const uint8_t* value_base(const ops::AttentionArgs& a) {
  return a.v8 != nullptr    ? reinterpret_cast<const uint8_t*>(a.v8)
         : a.v16 != nullptr ? reinterpret_cast<const uint8_t*>(a.v16)
                            : reinterpret_cast<const uint8_t*>(a.v);
}

// Points args' key (or value) fields at rows gathered at dst (+ lead: a Q8_0 row's values).
void point_at(ops::AttentionArgs* g, bool value, const uint8_t* rows, const RowShape& r) {
  const uint8_t* p = rows + r.lead;
  if (g->k8 != nullptr) {
    (value ? g->v8 : g->k8) = reinterpret_cast<const int8_t*>(p);
  } else if (g->k16 != nullptr) {
    (value ? g->v16 : g->k16) = reinterpret_cast<const uint16_t*>(p);
  } else {
    (value ? g->v : g->k) = reinterpret_cast<const float*>(p);
  }
}

// Token j of args attending to `positions` only: their rows copied into storage, arguments over
// them as a contiguous cache.
ops::AttentionArgs gathered_args(const ops::AttentionArgs& args, int64_t j,
                                 std::span<const int32_t> positions, GatherStorage& storage) {
  const bool values_in_keys = value_base(args) == key_base(args) && args.v_stride == args.k_stride;
  const RowShape kr = row_shape(args, args.dk), vr = row_shape(args, args.dv);
  const int64_t m = static_cast<int64_t>(positions.size());
  const int64_t k_bytes = m * args.n_kv_heads * kr.bytes;
  const int64_t v_bytes = values_in_keys ? 0 : m * args.n_kv_heads * vr.bytes;
  uint8_t* buf = storage.take(static_cast<size_t>(k_bytes + v_bytes));
  gather_rows(args, key_base(args), args.k_stride, args.k_block, ops::k_head_stride(args), kr,
              positions, buf);
  if (!values_in_keys) {
    gather_rows(args, value_base(args), args.v_stride, args.v_block, ops::v_head_stride(args), vr,
                positions, buf + k_bytes);
  }
  ops::AttentionArgs g = args;
  g.q = args.q + j * args.q_stride;
  g.out = args.out + j * args.n_heads * args.dv;
  g.n_tokens = 1;
  g.pos0 = m - 1;  // (the query sees every gathered row)
  g.window = 0;
  g.blocks = nullptr;
  g.block_positions = g.k_block = g.v_block = 0;
  g.k_head = g.v_head = 0;  // (the heads side by side)
  g.k_stride = args.n_kv_heads * kr.bytes / kr.elem;
  point_at(&g, false, buf, kr);
  if (values_in_keys) {
    point_at(&g, true, buf, kr);
    g.v_stride = g.k_stride;
  } else {
    point_at(&g, true, buf + k_bytes, vr);
    g.v_stride = args.n_kv_heads * vr.bytes / vr.elem;
  }
  return g;
}

}  // namespace

uint8_t* GatherStorage::take(size_t bytes) {
  if (used_ == bufs_.size()) bufs_.emplace_back();
  std::vector<uint8_t>& b = bufs_[used_++];
  if (b.size() < bytes) b.resize(bytes);
  return b.data();
}

void split_by_selection(const ops::AttentionArgs& args, int64_t t0, const SparseSelection& sel,
                        GatherStorage& storage, std::vector<ops::AttentionArgs>* out) {
  int64_t dense = 0;
  while (dense < args.n_tokens && !sel.sparse(t0 + dense)) ++dense;
  if (dense > 0) {
    ops::AttentionArgs a = args;
    a.n_tokens = dense;
    out->push_back(a);
  }
  for (int64_t j = dense; j < args.n_tokens; ++j) {
    TD_CHECK(sel.sparse(t0 + j), "sparse attention: a dense token after a sparse one");
    out->push_back(gathered_args(args, j, sel.of(t0 + j), storage));
  }
}

}  // namespace tandem
