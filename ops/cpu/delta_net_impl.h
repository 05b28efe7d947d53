// The Gated DeltaNet kernels (ops/cpu/delta_net.h) over a traits struct S: Scalar here (one
// lane, the reference level), Avx2 / Avx512 in delta_net_avx2.cpp / delta_net_avx512.cpp, each
// translation unit compiled for its ISA with -ffp-contract=off. Every product is a chain of
// S::fma over its reduction index in increasing order, vectorized over the output's contiguous
// index (a tail narrower than kLanes runs the same chain on Scalar), and every other operation is
// one IEEE operation per value or a scalar shared by all levels (e^g, the chunk's decays): so the
// levels agree bit for bit.
// S provides: F (kLanes floats), load, store, set1, zero, add, sub, mul, fma(a, b, c) = a b + c.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/cpu/delta_net.h"

namespace tandem::kern::detail {
namespace {

struct Scalar {
  using F = float;
  static constexpr int kLanes = 1;
  static F load(const float* p) { return *p; }
  static void store(float* p, F v) { *p = v; }
  static F set1(float v) { return v; }
  static F zero() { return 0.0f; }
  static F add(F a, F b) { return a + b; }
  static F sub(F a, F b) { return a - b; }
  static F mul(F a, F b) { return a * b; }
  static F fma(F a, F b, F c) { return __builtin_fmaf(a, b, c); }
};

// fn(i0, tag) over [0, n): blocks of S::kLanes (tag S{}), then the tail one at a time (Scalar{}).
template <class S, class Fn>
inline void for_lanes(int64_t n, Fn&& fn) {
  int64_t i = 0;
  for (; i + S::kLanes <= n; i += S::kLanes) fn(i, S{});
  for (; i < n; ++i) fn(i, Scalar{});
}

// The recurrent form. The value columns of the state are independent (column i's update and
// output read column i alone), so a block of S::kLanes columns runs through every token while its
// dk x kLanes values stay in L1: per token, the column block decayed while S^T k is summed, then
// its rank-1 update while S^T q is summed. Each column's operations are those of the
// token-by-token order, so the bits do not depend on the blocking.
template <class S>
void delta_rule_recurrent_impl(const ops::DeltaRuleArgs& a) {
  const int64_t dk = a.dk, dv = a.dv;
  thread_local std::vector<float> eg;
  eg.resize(static_cast<size_t>(a.n));
  for (int64_t t = 0; t < a.n; ++t) eg[static_cast<size_t>(t)] = std::exp(a.g[t * a.g_stride]);
  for_lanes<S>(dv, [&](int64_t i, auto tag) {
    using V = decltype(tag);
    for (int64_t t = 0; t < a.n; ++t) {
      const float* q = a.q + t * a.q_stride;
      const float* k = a.k + t * a.k_stride;
      const typename V::F e = V::set1(eg[static_cast<size_t>(t)]);
      typename V::F kv = V::zero();
      for (int64_t j = 0; j < dk; ++j) {
        const typename V::F sd = V::mul(V::load(a.state + j * dv + i), e);
        kv = V::fma(sd, V::set1(k[j]), kv);
      }
      const typename V::F d = V::mul(V::sub(V::load(a.v + t * a.v_stride + i), kv),
                                     V::set1(a.beta[t * a.beta_stride]));
      typename V::F o = V::zero();
      for (int64_t j = 0; j < dk; ++j) {
        float* s = a.state + j * dv + i;
        const typename V::F sn = V::fma(V::set1(k[j]), d, V::mul(V::load(s), e));
        V::store(s, sn);
        o = V::fma(sn, V::set1(q[j]), o);
      }
      V::store(a.out + t * a.out_stride + i, o);
    }
  });
}

// Scratch of one chunk (thread-local, grown on demand).
struct ChunkScratch {
  std::vector<float> gc, kb, kt, kbg, vb, t, u, w, vnew, att, row, kd, qg;
  void resize(int64_t c, int64_t dk, int64_t dv) {
    const auto z = [](std::vector<float>& v, int64_t n) { v.resize(static_cast<size_t>(n)); };
    z(gc, c);
    z(kb, c * dk);
    z(kt, dk * c);
    z(kbg, c * dk);
    z(vb, c * dv);
    z(t, c * c);
    z(u, c * dv);
    z(w, c * dk);
    z(vnew, c * dv);
    z(att, c * c);
    z(row, c);
    z(kd, c * dk);
    z(qg, c * dk);
  }
};

// One chunk of c tokens (the rows of a starting at token t0) against the state, in the WY form:
//   gc = cumsum(g);  A[t][s] = -(beta_t k_t . k_s) e^(gc_t - gc_s) for s < t
//   T = (I - A)^-1 by forward substitution (transformers' loop);  U = T (beta v);
//   W = T (beta k e^gc);  V' = U - W S;  O = (q e^gc) S + tril(q k^T e^(gc_t - gc_s)) V';
//   S = e^gc_last S + (k e^(gc_last - gc))^T V'.
template <class S>
void delta_chunk(const ops::DeltaRuleArgs& a, int64_t t0, int64_t c, ChunkScratch& x) {
  const int64_t dk = a.dk, dv = a.dv;
  float* st = a.state;
  float run = 0.0f;
  for (int64_t i = 0; i < c; ++i) {
    run += a.g[(t0 + i) * a.g_stride];
    x.gc[i] = run;
  }
  const float g_last = x.gc[c - 1];
  for (int64_t i = 0; i < c; ++i) {
    const float* k = a.k + (t0 + i) * a.k_stride;
    const float* v = a.v + (t0 + i) * a.v_stride;
    const float* q = a.q + (t0 + i) * a.q_stride;
    const float b = a.beta[(t0 + i) * a.beta_stride];
    const float eg = std::exp(x.gc[i]), el = std::exp(g_last - x.gc[i]);
    for (int64_t j = 0; j < dk; ++j) {
      x.kb[i * dk + j] = k[j] * b;
      x.kt[j * c + i] = k[j];
      x.kbg[i * dk + j] = x.kb[i * dk + j] * eg;
      x.kd[i * dk + j] = k[j] * el;
      x.qg[i * dk + j] = q[j] * eg;
    }
    for (int64_t j = 0; j < dv; ++j) x.vb[i * dv + j] = v[j] * b;
  }
  // A (strictly lower), then T = I + the substitution, row by row.
  float* T = x.t.data();
  std::fill(T, T + c * c, 0.0f);
  for (int64_t i = 1; i < c; ++i) {
    float* r = T + i * c;
    for_lanes<S>(i, [&](int64_t s, auto tag) {
      using V = decltype(tag);
      typename V::F acc = V::zero();
      for (int64_t j = 0; j < dk; ++j) {
        acc = V::fma(V::set1(x.kb[i * dk + j]), V::load(x.kt.data() + j * c + s), acc);
      }
      V::store(r + s, acc);
    });
    for (int64_t s = 0; s < i; ++s) r[s] = -r[s] * std::exp(x.gc[i] - x.gc[s]);
  }
  for (int64_t i = 1; i < c; ++i) {
    float* r = T + i * c;
    std::copy(r, r + i, x.row.data());  // the row before its update
    for_lanes<S>(i, [&](int64_t s, auto tag) {
      using V = decltype(tag);
      typename V::F acc = V::zero();
      for (int64_t m = 0; m < i; ++m) {
        acc = V::fma(V::set1(x.row[m]), V::load(T + m * c + s), acc);
      }
      V::store(r + s, V::add(V::load(x.row.data() + s), acc));
    });
  }
  for (int64_t i = 0; i < c; ++i) T[i * c + i] = 1.0f;
  // U = T vb, W = T kbg (T lower triangular with a unit diagonal).
  for (int64_t i = 0; i < c; ++i) {
    const float* r = T + i * c;
    for_lanes<S>(dv, [&](int64_t j, auto tag) {
      using V = decltype(tag);
      typename V::F acc = V::zero();
      for (int64_t s = 0; s <= i; ++s) acc = V::fma(V::set1(r[s]), V::load(x.vb.data() + s * dv + j), acc);
      V::store(x.u.data() + i * dv + j, acc);
    });
    for_lanes<S>(dk, [&](int64_t j, auto tag) {
      using V = decltype(tag);
      typename V::F acc = V::zero();
      for (int64_t s = 0; s <= i; ++s) acc = V::fma(V::set1(r[s]), V::load(x.kbg.data() + s * dk + j), acc);
      V::store(x.w.data() + i * dk + j, acc);
    });
  }
  // V' = U - W S.
  for (int64_t i = 0; i < c; ++i) {
    const float* w = x.w.data() + i * dk;
    for_lanes<S>(dv, [&](int64_t j, auto tag) {
      using V = decltype(tag);
      typename V::F acc = V::zero();
      for (int64_t m = 0; m < dk; ++m) acc = V::fma(V::set1(w[m]), V::load(st + m * dv + j), acc);
      V::store(x.vnew.data() + i * dv + j, V::sub(V::load(x.u.data() + i * dv + j), acc));
    });
  }
  // The intra-chunk scores q_t . k_s e^(gc_t - gc_s), s <= t.
  for (int64_t i = 0; i < c; ++i) {
    float* r = x.att.data() + i * c;
    const float* q = a.q + (t0 + i) * a.q_stride;
    for_lanes<S>(i + 1, [&](int64_t s, auto tag) {
      using V = decltype(tag);
      typename V::F acc = V::zero();
      for (int64_t j = 0; j < dk; ++j) {
        acc = V::fma(V::set1(q[j]), V::load(x.kt.data() + j * c + s), acc);
      }
      V::store(r + s, acc);
    });
    for (int64_t s = 0; s <= i; ++s) r[s] *= std::exp(x.gc[i] - x.gc[s]);
  }
  // O = (q e^gc) S + att V'.
  for (int64_t i = 0; i < c; ++i) {
    const float* qg = x.qg.data() + i * dk;
    const float* r = x.att.data() + i * c;
    float* o = a.out + (t0 + i) * a.out_stride;
    for_lanes<S>(dv, [&](int64_t j, auto tag) {
      using V = decltype(tag);
      typename V::F inter = V::zero(), intra = V::zero();
      for (int64_t m = 0; m < dk; ++m) {
        inter = V::fma(V::set1(qg[m]), V::load(st + m * dv + j), inter);
      }
      for (int64_t s = 0; s <= i; ++s) {
        intra = V::fma(V::set1(r[s]), V::load(x.vnew.data() + s * dv + j), intra);
      }
      V::store(o + j, V::add(inter, intra));
    });
  }
  // S = e^gc_last S + kd^T V'.
  const float el = std::exp(g_last);
  for (int64_t m = 0; m < dk; ++m) {
    float* srow = st + m * dv;
    for_lanes<S>(dv, [&](int64_t j, auto tag) {
      using V = decltype(tag);
      typename V::F acc = V::zero();
      for (int64_t i = 0; i < c; ++i) {
        acc = V::fma(V::set1(x.kd[i * dk + m]), V::load(x.vnew.data() + i * dv + j), acc);
      }
      V::store(srow + j, V::add(V::mul(V::load(srow + j), V::set1(el)), acc));
    });
  }
}

template <class S>
void delta_rule_chunked_impl(const ops::DeltaRuleArgs& a, int64_t pos0) {
  thread_local ChunkScratch x;
  const int64_t C = kDeltaChunk;
  x.resize(C, a.dk, a.dv);
  for (int64_t t = 0; t < a.n;) {
    const int64_t c = std::min(C - (pos0 + t) % C, a.n - t);
    delta_chunk<S>(a, t, c, x);
    t += c;
  }
}

// in [K - 1 + n][channels] (the window's rows, then the tokens' inputs), wt [K][channels]:
// out[t][ch] = sum_j wt[j][ch] in[t + j][ch], the chain over the taps in order.
template <class S>
void conv_impl(const float* wt, int64_t K, int64_t channels, const float* in, int64_t n,
               float* out, int64_t out_stride) {
  for (int64_t t = 0; t < n; ++t) {
    for_lanes<S>(channels, [&](int64_t i, auto tag) {
      using V = decltype(tag);
      typename V::F acc = V::zero();
      for (int64_t j = 0; j < K; ++j) {
        acc = V::fma(V::load(wt + j * channels + i), V::load(in + (t + j) * channels + i), acc);
      }
      V::store(out + t * out_stride + i, acc);
    });
  }
}

}  // namespace
}  // namespace tandem::kern::detail
