// DeepSeek Sparse Attention's pieces: the Hadamard rotation and the LayerNorm against their
// formulas, the indexer's scores (kern vs the scalar reference, bit for bit, and the reference
// against a double-precision formula) over a paged cache of every element type, the indexer keys
// a KvCache keeps (forks, copy-on-write, truncation), and attention over a selection
// (split_by_selection, then kern::attention) against a softmax over the selected positions only.
#include "model/sparse_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "core/fp_convert.h"
#include "core/thread_pool.h"
#include "core/topology.h"
#include "model/kv_cache.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {
namespace {

std::vector<float> random_values(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = g(rng);
  return v;
}

ThreadPool& pool() {
  static ThreadingContext ctx(ThreadingOptions{2, false, 50});
  return ctx.pool();
}

TEST(Hadamard, IsTheOrthonormalWalshMatrix) {
  for (const int64_t n : {int64_t{64}, int64_t{128}}) {
    const std::vector<float> x = random_values(n, 7);
    std::vector<float> y = x;
    ops::hadamard(y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      double want = 0;
      for (int64_t j = 0; j < n; ++j) {
        const int sign = std::popcount(static_cast<uint64_t>(i & j)) % 2 ? -1 : 1;
        want += sign * static_cast<double>(x[j]);
      }
      want /= std::sqrt(static_cast<double>(n));
      EXPECT_NEAR(y[i], want, 1e-5) << n << " " << i;
    }
    ops::hadamard(y.data(), n);  // its own inverse
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
  }
}

TEST(LayerNorm, IsTheFormula) {
  const int64_t n = 64;
  const std::vector<float> x = random_values(n, 1, 3.0f), w = random_values(n, 2),
                           b = random_values(n, 3);
  std::vector<float> y(n);
  ops::layer_norm(x.data(), w.data(), b.data(), n, 1e-6f, y.data());
  double mean = 0, var = 0;
  for (float v : x) mean += v;
  mean /= n;
  for (float v : x) var += (v - mean) * (v - mean);
  var /= n;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(y[i], (x[i] - mean) / std::sqrt(var + 1e-6) * w[i] + b[i], 1e-5);
  }
}

// A cache with indexer keys (one index layer of d values) holding `n` random positions of one
// sequence; the keys as written, in F32.
struct IndexCache {
  KvCache cache;
  SeqId seq;
  std::vector<float> keys;  // [n, d]
  IndexCache(KvType type, int64_t n, int64_t d)
      : cache(KvLayout{1, 1, 8, 0, 8, 0, 0, 1, d},
              [&] {
                KvCacheOptions o;
                o.type = type;
                o.positions = 512;
                o.block_positions = 64;
                return o;
              }()),
        seq(cache.create()),
        keys(random_values(n * d, 11)) {
    std::vector<int32_t> tokens(static_cast<size_t>(n), 1);
    const KvCache::Write w{seq, 0, tokens};
    cache.make_writable(std::span<const KvCache::Write>(&w, 1));
    for (int64_t s = 0; s < n; ++s) cache.write_index_row(0, seq, s, keys.data() + s * d);
  }
};

TEST(IndexScores, KernelIsTheReferenceAndTheReferenceIsTheFormula) {
  const int64_t d = 64;
  for (const KvType type : {KvType::kF32, KvType::kBf16, KvType::kF16, KvType::kQ8_0}) {
    for (const int64_t heads : {int64_t{16}, int64_t{64}}) {
      const int64_t n = 200;  // (past three cache blocks, not a whole tile)
      IndexCache c(type, n, d);
      ops::AttentionArgs keys;
      c.cache.index_args(0, c.seq, &keys);
      keys.dk = d;
      const std::vector<float> q = random_values(heads * d, 5), w = random_values(heads, 6);
      std::vector<float> ref(n), got(n), got1(n);
      ops::index_scores(keys, q.data(), w.data(), heads, n, ref.data());
      kern::index_scores(keys, q.data(), w.data(), heads, n, got.data(), &pool());
      kern::index_scores(keys, q.data(), w.data(), heads, n, got1.data(), nullptr);
      EXPECT_EQ(got, ref) << kv_type_name(type) << " " << heads;
      EXPECT_EQ(got1, ref) << kv_type_name(type) << " " << heads;
      // The formula, in double, on the keys as the cache holds them (read through its element
      // type here; the BF16 / F16 / Q8_0 rounding of the written keys within its own bound).
      for (int64_t s = 0; s < n; ++s) {
        const int64_t at = ops::k_offset(keys, s);
        auto key = [&](int64_t i) -> double {
          if (keys.k8 != nullptr) return ops::q8_value(keys.k8 + at, i);
          if (keys.k16 != nullptr) {
            return keys.f16 ? f16_to_f32(keys.k16[at + i]) : bf16_to_f32(keys.k16[at + i]);
          }
          return keys.k[at + i];
        };
        const double rounding = type == KvType::kF32 ? 0 : type == KvType::kF16 ? 1e-3 : 0.02;
        double want = 0;
        for (int64_t h = 0; h < heads; ++h) {
          double dot = 0;
          for (int64_t i = 0; i < d; ++i) {
            dot += double(q[h * d + i]) * key(i);
            EXPECT_NEAR(key(i), c.keys[s * d + i], rounding * 4) << kv_type_name(type);
          }
          want += w[h] * std::max(dot, 0.0);
        }
        EXPECT_NEAR(ref[s], want, 1e-4 * (1 + std::fabs(want))) << kv_type_name(type) << " " << s;
      }
    }
  }
}

TEST(IndexKeys, ForksShareThemAndWritesCopyTheirBlock) {
  const int64_t d = 64;
  IndexCache c(KvType::kF32, 100, d);
  const SeqId fork = c.cache.fork(c.seq);
  std::vector<int32_t> one = {7};
  const KvCache::Write w{fork, 70, one};  // (into the shared second block: copy-on-write)
  c.cache.make_writable(std::span<const KvCache::Write>(&w, 1));
  const std::vector<float> mark(static_cast<size_t>(d), 42.0f);
  c.cache.write_index_row(0, fork, 70, mark.data());
  ops::AttentionArgs a, b;
  c.cache.index_args(0, c.seq, &a);
  c.cache.index_args(0, fork, &b);
  a.dk = b.dk = d;
  for (int64_t s = 0; s < 71; ++s) {
    const float* orig = a.k + ops::k_offset(a, s);
    const float* forked = b.k + ops::k_offset(b, s);
    for (int64_t i = 0; i < d; ++i) {
      EXPECT_EQ(orig[i], c.keys[s * d + i]) << s;  // the original keeps its keys
      EXPECT_EQ(forked[i], s == 70 ? 42.0f : c.keys[s * d + i]) << s;
    }
  }
  EXPECT_EQ(c.cache.position_bytes(), uint64_t{8 * 4});
  EXPECT_EQ(c.cache.index_position_bytes(), uint64_t{d * 4});
}

// Softmax attention of one query over the selected positions of F32 rows: the definition.
std::vector<double> attend_selected(const float* q, int64_t heads, int64_t dk, int64_t dv,
                                    const std::vector<float>& k, const std::vector<float>& v,
                                    int64_t kv_heads, std::span<const int32_t> sel, float scale) {
  std::vector<double> out(static_cast<size_t>(heads * dv), 0.0);
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t g = h / (heads / kv_heads);
    std::vector<double> x;
    for (const int32_t s : sel) {
      double dot = 0;
      for (int64_t i = 0; i < dk; ++i) dot += double(q[h * dk + i]) * k[(s * kv_heads + g) * dk + i];
      x.push_back(scale * dot);
    }
    const double m = *std::max_element(x.begin(), x.end());
    double l = 0;
    for (double& e : x) l += (e = std::exp(e - m));
    for (size_t j = 0; j < sel.size(); ++j) {
      for (int64_t i = 0; i < dv; ++i) {
        out[h * dv + i] += x[j] / l * v[(sel[j] * kv_heads + g) * dv + i];
      }
    }
  }
  return out;
}

// Attention of a part's tokens over a selection: the leading tokens (positions < topk) attend
// to everything before them, each later one to its selected positions, for a latent-like cache
// (one KV head, the values the keys' first dv) and a multi-head one with values of their own.
TEST(SparseAttention, SelectedRowsAttendAsTheSoftmaxOverThem) {
  struct Shape {
    int64_t kv_heads, heads, dk, dv;
  };
  for (const Shape sh : {Shape{1, 8, 48, 32}, Shape{4, 4, 32, 16}}) {
    for (const KvType type : {KvType::kF32, KvType::kBf16, KvType::kF16, KvType::kQ8_0}) {
      const int64_t n = 150, topk = 20, t0 = 3;  // (the part is tokens 3.. of a step)
      const bool latent = sh.kv_heads == 1;
      KvCacheOptions o;
      o.type = type;
      o.positions = 256;
      KvCache cache(KvLayout{1, sh.kv_heads, sh.dk, latent ? 0 : sh.kv_heads, sh.dv}, o);
      const SeqId seq = cache.create();
      std::vector<int32_t> tokens(n, 1);
      const KvCache::Write w{seq, 0, tokens};
      cache.make_writable(std::span<const KvCache::Write>(&w, 1));
      // The rows as the cache holds them (read back: the type's rounding), position-major.
      std::vector<float> k(n * sh.kv_heads * sh.dk), v(n * sh.kv_heads * sh.dv);
      for (int64_t s = 0; s < n; ++s) {
        for (int64_t g = 0; g < sh.kv_heads; ++g) {
          const auto kr = random_values(sh.dk, 100 + s * 8 + g);
          const auto vr = random_values(sh.dv, 900 + s * 8 + g);
          cache.write_row(0, KvPart::kKey, seq, s, g, kr.data());
          if (!latent) cache.write_row(0, KvPart::kValue, seq, s, g, vr.data());
          cache.read_row(0, KvPart::kKey, seq, s, g, k.data() + (s * sh.kv_heads + g) * sh.dk);
          if (latent) {
            std::copy_n(k.data() + s * sh.dk, sh.dv, v.data() + s * sh.dv);
          } else {
            cache.read_row(0, KvPart::kValue, seq, s, g, v.data() + (s * sh.kv_heads + g) * sh.dv);
          }
        }
      }
      // The part: queries at positions 140 .. 149 (none dense) after 12 .. 19 (dense).
      const std::vector<int64_t> pos = {12, 13, 14, 15, 16, 17, 18, 19, 140, 149};
      const int64_t m = static_cast<int64_t>(pos.size());
      SparseSelection sel;
      sel.topk = topk;
      sel.offset.assign(static_cast<size_t>(t0 + m), -1);
      std::mt19937 rng(3);
      for (int64_t j = 0; j < m; ++j) {
        if (pos[j] + 1 <= topk) continue;
        std::vector<int32_t> all(static_cast<size_t>(pos[j] + 1));
        for (int32_t i = 0; i <= pos[j]; ++i) all[i] = i;
        std::shuffle(all.begin(), all.end(), rng);
        std::sort(all.begin(), all.begin() + topk);
        sel.offset[t0 + j] = static_cast<int64_t>(sel.positions.size());
        sel.positions.insert(sel.positions.end(), all.begin(), all.begin() + topk);
      }
      // (The dense tokens' positions are consecutive: one call with pos0 = 12.)
      const std::vector<float> q = random_values(m * sh.heads * sh.dk, 77);
      std::vector<float> out(m * sh.heads * sh.dv, -1.0f);
      ops::AttentionArgs a;
      a.q = q.data();
      a.q_stride = sh.heads * sh.dk;
      a.n_tokens = m;
      a.n_heads = sh.heads;
      a.n_kv_heads = sh.kv_heads;
      a.dk = sh.dk;
      a.dv = sh.dv;
      cache.attention_args(0, seq, &a);
      a.pos0 = pos[0];
      a.scale = 0.3f;
      a.out = out.data();
      GatherStorage storage;
      std::vector<ops::AttentionArgs> split;
      split_by_selection(a, t0, sel, storage, &split);
      ASSERT_EQ(split.size(), 3u);
      EXPECT_EQ(split[0].n_tokens, 8);
      // (Scored against the F32 rows: a BF16 cache's kernel rounds the queries too.)
      const double tol = type == KvType::kBf16 ? 0.02 : 1e-4;
      for (const ops::AttentionArgs& s : split) kern::attention(s, &pool());
      for (int64_t j = 0; j < m; ++j) {
        std::vector<int32_t> positions;
        if (sel.sparse(t0 + j)) {
          const auto p = sel.of(t0 + j);
          positions.assign(p.begin(), p.end());
        } else {
          for (int32_t i = 0; i <= pos[j]; ++i) positions.push_back(i);
        }
        const std::vector<double> want =
            attend_selected(q.data() + j * sh.heads * sh.dk, sh.heads, sh.dk, sh.dv, k, v,
                            sh.kv_heads, positions, 0.3f);
        for (int64_t i = 0; i < sh.heads * sh.dv; ++i) {
          EXPECT_NEAR(out[j * sh.heads * sh.dv + i], want[i], tol)
              << kv_type_name(type) << " heads " << sh.kv_heads << " token " << j;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem
