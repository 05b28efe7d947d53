#include "model/delta_net_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/cpu/delta_net.h"

namespace tandem {

namespace {

template <typename T>
T* grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// fn(i) for i in [0, n): on the pool when it is worth a dispatch, else inline.
template <typename F>
void for_each(ThreadPool* pool, int64_t n, F&& fn) {
  if (pool != nullptr && n > 1) {
    pool->run(static_cast<size_t>(n), [&](size_t i) { fn(static_cast<int64_t>(i)); });
  } else {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
}

}  // namespace

void delta_net_layer(const DeltaNetLayerArgs& a, const float* x, float* out,
                     DeltaNetScratch& sc) {
  const ModelConfig& c = *a.config;
  const LayerWeights::DeltaNet& w = *a.weights;
  const ForwardStep& step = *a.step;
  KvCache& cache = *a.cache;
  const int64_t n = step.n_tokens();
  const int64_t nk = c.linear_num_key_heads, nv = c.linear_num_value_heads;
  const int64_t hk = c.linear_key_head_dim, hv = c.linear_value_head_dim;
  const int64_t qk = nk * hk, vdim = nv * hv, ch = c.linear_conv_channels();
  const int64_t K = c.linear_conv_kernel, window = (K - 1) * ch;
  const float eps = c.rms_norm_eps;
  TD_CHECK(w.in.size() <= 4, "delta net: {} input projections", w.in.size());

  // The projections (one conversion of x for all of them), concatenated per token.
  {
    std::vector<const ops::Weight*> ws;
    std::vector<float*> ys;
    for (size_t i = 0; i < w.in.size(); ++i) {
      ws.push_back(&w.in[i]);
      ys.push_back(grow(sc.proj[i], n * w.in[i].rows()));
    }
    kern::matmul_shared_input(ws, x, n, ys, a.pool, a.views);
  }
  float* mixed = grow(sc.mixed, n * w.in_rows);
  float* conv_in = grow(sc.conv_in, n * ch);
  float* z = grow(sc.z, n * vdim);
  float* g = grow(sc.g, n * nv);
  float* beta = grow(sc.beta, n * nv);
  for_each(n > 64 ? a.pool : nullptr, n, [&](int64_t t) {
    float* m = mixed + t * w.in_rows;
    int64_t at = 0;
    for (size_t i = 0; i < w.in.size(); ++i) {
      const int64_t rows = w.in[i].rows();
      std::memcpy(m + at, sc.proj[i].data() + t * rows, static_cast<size_t>(rows) * 4);
      at += rows;
    }
    for (int64_t i = 0; i < ch; ++i) conv_in[t * ch + i] = m[w.conv_src[static_cast<size_t>(i)]];
    for (int64_t i = 0; i < vdim; ++i) z[t * vdim + i] = m[w.z_src[static_cast<size_t>(i)]];
    for (int64_t h = 0; h < nv; ++h) {
      beta[t * nv + h] = ops::sigmoid(m[w.beta_src[static_cast<size_t>(h)]]);
      g[t * nv + h] =
          w.a[static_cast<size_t>(h)] *
          ops::softplus(m[w.alpha_src[static_cast<size_t>(h)]] + w.dt_bias[static_cast<size_t>(h)]);
    }
  });

  // Each part's snapshots, by offset (the cache plans them ascending per sequence).
  auto snapshots_of = [&](size_t part) {
    std::vector<ForwardStep::Snapshot> out;
    for (const ForwardStep::Snapshot& s : step.snapshots) {
      if (s.part == static_cast<int32_t>(part)) out.push_back(s);
    }
    return out;
  };

  // The convolution per sequence, its window copied into each checkpoint it passes.
  float* conv_out = grow(sc.conv_out, n * ch);
  for_each(a.pool, static_cast<int64_t>(step.parts.size()), [&](int64_t pi) {
    const ForwardStep::Part& p = step.parts[static_cast<size_t>(pi)];
    float* win = cache.state(a.state_layer, p.seq);
    int64_t done = 0;
    auto run_to = [&](int64_t end) {
      kern::conv_silu(w.conv_t.data(), K, ch, win, conv_in + (p.t0 + done) * ch, ch, end - done,
                      conv_out + (p.t0 + done) * ch, ch);
      done = end;
    };
    for (const ForwardStep::Snapshot& s : snapshots_of(static_cast<size_t>(pi))) {
      run_to(s.offset);
      std::memcpy(cache.slot_state(s.slot, a.state_layer), win, static_cast<size_t>(window) * 4);
    }
    run_to(p.n);
  });

  // q and k normalized per key head, q scaled.
  const float qscale = 1.0f / std::sqrt(static_cast<float>(hk));
  for_each(n > 64 ? a.pool : nullptr, n, [&](int64_t t) {
    float* r = conv_out + t * ch;
    for (int64_t h = 0; h < nk; ++h) {
      ops::l2_normalize(r + h * hk, hk, eps);
      for (int64_t j = 0; j < hk; ++j) r[h * hk + j] *= qscale;
      ops::l2_normalize(r + qk + h * hk, hk, eps);
    }
  });

  // The delta rule per (sequence, value head), checkpoints of each head's matrix on the way.
  float* o = grow(sc.o, n * vdim);
  const int64_t heads = nv;
  for_each(a.pool, static_cast<int64_t>(step.parts.size()) * heads, [&](int64_t task) {
    const size_t pi = static_cast<size_t>(task / heads);
    const int64_t h = task % heads;
    const ForwardStep::Part& p = step.parts[pi];
    const int64_t kh = w.key_head(h, nk, nv);
    float* state = cache.state(a.state_layer, p.seq) + window + h * hk * hv;
    ops::DeltaRuleArgs d;
    d.dk = hk;
    d.dv = hv;
    d.q_stride = d.k_stride = d.v_stride = ch;
    d.g_stride = d.beta_stride = nv;
    d.out_stride = vdim;
    d.state = state;
    const bool chunked = a.chunk_tokens > 0 && p.n >= a.chunk_tokens;
    // Tokens [from, to) of the part into `st`, their outputs to `out` (rows of vdim).
    auto run = [&](int64_t from, int64_t to, float* st, float* out) {
      if (to <= from) return;
      const int64_t t = p.t0 + from;
      ops::DeltaRuleArgs r = d;
      r.n = to - from;
      r.q = conv_out + t * ch + kh * hk;
      r.k = conv_out + t * ch + qk + kh * hk;
      r.v = conv_out + t * ch + 2 * qk + h * hv;
      r.g = g + t * nv + h;
      r.beta = beta + t * nv + h;
      r.state = st;
      r.out = out;
      if (chunked) {
        kern::delta_rule_chunked(r, p.pos0 + from);
      } else {
        kern::delta_rule_recurrent(r);
      }
    };
    // The part's computation does not depend on its checkpoints: the chunked form runs in
    // pieces cut at its own chunk boundaries (the same bits as one call), and a checkpoint inside
    // a chunk is the state at the chunk's start advanced over its first tokens apart, in the
    // checkpoint's slot (their outputs dropped).
    thread_local std::vector<float> dropped;
    int64_t done = 0;
    for (const ForwardStep::Snapshot& s : snapshots_of(pi)) {
      float* dst = cache.slot_state(s.slot, a.state_layer) + window + h * hk * hv;
      int64_t at = s.offset;
      if (chunked) {
        const int64_t c = kern::kDeltaChunk;
        at = std::max(done, (p.pos0 + s.offset) / c * c - p.pos0);
      }
      run(done, at, state, o + (p.t0 + done) * vdim + h * hv);
      done = at;
      std::memcpy(dst, state, static_cast<size_t>(hk * hv) * 4);
      if (s.offset > at) {
        dropped.resize(static_cast<size_t>((s.offset - at) * vdim));
        run(at, s.offset, dst, dropped.data());
      }
    }
    run(done, p.n, state, o + (p.t0 + done) * vdim + h * hv);
  });

  // The gated norm: rms_norm(o_h) * w * silu(z_h) per token and value head.
  float* normed = grow(sc.normed, n * vdim);
  for_each(n > 16 ? a.pool : nullptr, n, [&](int64_t t) {
    for (int64_t h = 0; h < nv; ++h) {
      const int64_t at = t * vdim + h * hv;
      ops::rms_norm(o + at, w.norm.data(), hv, eps, normed + at);
      kern::swiglu(z + at, normed + at, hv, normed + at);
    }
  });
  kern::matmul(w.out, normed, n, out, a.pool, a.views);
}

}  // namespace tandem
