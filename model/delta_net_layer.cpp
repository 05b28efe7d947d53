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

// One call's arguments, dereferenced, and the layer's sizes.
struct Layer {
  explicit Layer(const DeltaNetLayerArgs& args)
      : a(args),
        c(*args.config),
        w(*args.weights),
        step(*args.step),
        cache(*args.cache),
        n(step.n_tokens()),
        nk(c.linear_num_key_heads),
        nv(c.linear_num_value_heads),
        hk(c.linear_key_head_dim),
        hv(c.linear_value_head_dim),
        qk(nk * hk),
        vdim(nv * hv),
        ch(c.linear_conv_channels()),
        K(c.linear_conv_kernel),
        window((K - 1) * ch),
        eps(c.rms_norm_eps) {}

  const DeltaNetLayerArgs& a;
  const ModelConfig& c;
  const LayerWeights::DeltaNet& w;
  const ForwardStep& step;
  KvCache& cache;
  const int64_t n;
  const int64_t nk, nv;     // key and value heads
  const int64_t hk, hv;     // their dimensions
  const int64_t qk, vdim;   // q's (and k's) width, v's (and z's and o's)
  const int64_t ch;         // the convolution's channels: q, k, v
  const int64_t K, window;  // the convolution's taps, its window's floats in the state
  const float eps;
};

// The per-token inputs of the steps after the projections, in the scratch.
struct Projected {
  float* conv_in;  // [n, ch]
  float* z;        // [n, vdim]
  float* g;        // [n, nv]: the log decay
  float* beta;     // [n, nv]
};

// The input projections (one conversion of x for all of them), each into sc.proj[i].
void project(const Layer& L, const float* x, DeltaNetScratch& sc) {
  std::vector<const ops::Weight*> ws;
  std::vector<float*> ys;
  for (size_t i = 0; i < L.w.in.size(); ++i) {
    ws.push_back(&L.w.in[i]);
    ys.push_back(grow(sc.proj[i], L.n * L.w.in[i].rows()));
  }
  kern::matmul_shared_input(ws, x, L.n, ys, L.a.pool, L.a.views);
}

// The projections concatenated per token, then gathered into the convolution's input and z,
// with beta = sigmoid(b) and g = a * softplus(alpha + dt_bias).
Projected split_projections(const Layer& L, DeltaNetScratch& sc) {
  const LayerWeights::DeltaNet& w = L.w;
  const int64_t n = L.n, ch = L.ch, vdim = L.vdim, nv = L.nv;
  float* mixed = grow(sc.mixed, n * w.in_rows);
  float* conv_in = grow(sc.conv_in, n * ch);
  float* z = grow(sc.z, n * vdim);
  float* g = grow(sc.g, n * nv);
  float* beta = grow(sc.beta, n * nv);
  for_each(n > 64 ? L.a.pool : nullptr, n, [&](int64_t t) {
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
  return {conv_in, z, g, beta};
}

// A part's snapshots, by offset (the cache plans them ascending per sequence).
std::vector<ForwardStep::Snapshot> snapshots_of(const ForwardStep& step, size_t part) {
  std::vector<ForwardStep::Snapshot> out;
  for (const ForwardStep::Snapshot& s : step.snapshots) {
    if (s.part == static_cast<int32_t>(part)) out.push_back(s);
  }
  return out;
}

// The convolution per sequence, its window copied into each checkpoint it passes.
void convolve(const Layer& L, const float* conv_in, float* conv_out) {
  const int64_t ch = L.ch;
  for_each(L.a.pool, static_cast<int64_t>(L.step.parts.size()), [&](int64_t pi) {
    const ForwardStep::Part& p = L.step.parts[static_cast<size_t>(pi)];
    float* win = L.cache.state(L.a.state_layer, p.seq);
    int64_t done = 0;
    auto run_to = [&](int64_t end) {
      kern::conv_silu(L.w.conv_t.data(), L.K, ch, win, conv_in + (p.t0 + done) * ch, ch, end - done,
                      conv_out + (p.t0 + done) * ch, ch);
      done = end;
    };
    for (const ForwardStep::Snapshot& s : snapshots_of(L.step, static_cast<size_t>(pi))) {
      run_to(s.offset);
      std::memcpy(L.cache.slot_state(s.slot, L.a.state_layer), win,
                  static_cast<size_t>(L.window) * 4);
    }
    run_to(p.n);
  });
}

// q and k (in the convolution's output) normalized per key head, q scaled.
void normalize_qk(const Layer& L, float* conv_out) {
  const int64_t hk = L.hk;
  const float qscale = 1.0f / std::sqrt(static_cast<float>(hk));
  for_each(L.n > 64 ? L.a.pool : nullptr, L.n, [&](int64_t t) {
    float* r = conv_out + t * L.ch;
    for (int64_t h = 0; h < L.nk; ++h) {
      ops::l2_normalize(r + h * hk, hk, L.eps);
      for (int64_t j = 0; j < hk; ++j) r[h * hk + j] *= qscale;
      ops::l2_normalize(r + L.qk + h * hk, hk, L.eps);
    }
  });
}

// The delta rule over part `pi`'s tokens for value head `h`, its outputs into `o` (rows of
// vdim), its matrix copied into each of the part's checkpoints on the way.
void delta_rule_head(const Layer& L, const float* conv_out, const Projected& in, size_t pi,
                     int64_t h, float* o) {
  const int64_t hk = L.hk, hv = L.hv, ch = L.ch, qk = L.qk, nv = L.nv, vdim = L.vdim;
  const ForwardStep::Part& p = L.step.parts[pi];
  const int64_t kh = L.w.key_head(h, L.nk, nv);
  float* state = L.cache.state(L.a.state_layer, p.seq) + L.window + h * hk * hv;
  ops::DeltaRuleArgs d;
  d.dk = hk;
  d.dv = hv;
  d.q_stride = d.k_stride = d.v_stride = ch;
  d.g_stride = d.beta_stride = nv;
  d.out_stride = vdim;
  d.state = state;
  const bool chunked = L.a.chunk_tokens > 0 && p.n >= L.a.chunk_tokens;
  // Tokens [from, to) of the part into `st`, their outputs to `out` (rows of vdim).
  auto run = [&](int64_t from, int64_t to, float* st, float* out) {
    if (to <= from) return;
    const int64_t t = p.t0 + from;
    ops::DeltaRuleArgs r = d;
    r.n = to - from;
    r.q = conv_out + t * ch + kh * hk;
    r.k = conv_out + t * ch + qk + kh * hk;
    r.v = conv_out + t * ch + 2 * qk + h * hv;
    r.g = in.g + t * nv + h;
    r.beta = in.beta + t * nv + h;
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
  for (const ForwardStep::Snapshot& s : snapshots_of(L.step, pi)) {
    float* dst = L.cache.slot_state(s.slot, L.a.state_layer) + L.window + h * hk * hv;
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
}

// The delta rule per (sequence, value head).
void delta_rule(const Layer& L, const float* conv_out, const Projected& in, float* o) {
  const int64_t heads = L.nv;
  for_each(L.a.pool, static_cast<int64_t>(L.step.parts.size()) * heads, [&](int64_t task) {
    delta_rule_head(L, conv_out, in, static_cast<size_t>(task / heads), task % heads, o);
  });
}

// The gated norm: rms_norm(o_h) * w * silu(z_h) per token and value head.
void gated_norm(const Layer& L, const float* o, const float* z, float* normed) {
  for_each(L.n > 16 ? L.a.pool : nullptr, L.n, [&](int64_t t) {
    for (int64_t h = 0; h < L.nv; ++h) {
      const int64_t at = t * L.vdim + h * L.hv;
      ops::rms_norm(o + at, L.w.norm.data(), L.hv, L.eps, normed + at);
      kern::swiglu(z + at, normed + at, L.hv, normed + at);
    }
  });
}

}  // namespace

void delta_net_layer(const DeltaNetLayerArgs& a, const float* x, float* out, DeltaNetScratch& sc) {
  const Layer L(a);
  TD_CHECK(L.w.in.size() <= 4, "delta net: {} input projections", L.w.in.size());
  project(L, x, sc);
  const Projected in = split_projections(L, sc);
  float* conv_out = grow(sc.conv_out, L.n * L.ch);
  convolve(L, in.conv_in, conv_out);
  normalize_qk(L, conv_out);
  float* o = grow(sc.o, L.n * L.vdim);
  delta_rule(L, conv_out, in, o);
  float* normed = grow(sc.normed, L.n * L.vdim);
  gated_norm(L, o, in.z, normed);
  kern::matmul(L.w.out, normed, L.n, out, a.pool, a.views);
}

}  // namespace tandem
