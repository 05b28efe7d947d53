// DeepSeek Sparse Attention's decode-time work per layer, DeepSeek-V3.2's shapes (64 indexer heads
// of 128, top 2048; 128 MLA heads over a 576-value latent):
//  - BM_IndexScores/<ctx>/<impl>/<f16>: one query's indexer scores against ctx cached keys (a
//    BF16 cache, or F16 with f16 1): impl 1 kern::index_scores on the pool, 0 ops::index_scores
//    (the scalar reference).
//    bytes_per_second: the keys read; items_per_second: multiply-adds x 2 (64 x 128 per key).
//  - BM_SparseMlaAttention/<ctx>: the absorbed MLA attention of one decode token over the 2048
//    positions the indexer chose from ctx (split_by_selection's gather, then kern::attention),
//    against BM_DenseMlaAttention/2048, the same attention over 2048 consecutive positions
//    (what the gather costs).
// Run: build/bench/bench_sparse_attention_bench [--benchmark_filter=Index]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "core/topology.h"
#include "model/kv_cache.h"
#include "model/sparse_attention.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {
namespace {

constexpr int64_t kHeads = 64, kDim = 128, kTopk = 2048;
constexpr int64_t kMlaHeads = 128, kLatent = 512, kRope = 64;

ThreadPool& pool() {
  static ThreadingContext ctx(ThreadingOptions{2, false, 50});
  return ctx.pool();
}

std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = g(rng);
  return v;
}

// A BF16 (or F16) cache of one sequence of ctx positions: an MLA latent layer and an index
// layer.
struct Cache {
  KvCache cache;
  SeqId seq;
  explicit Cache(int64_t ctx, KvType type = KvType::kBf16)
      : cache(KvLayout{1, 1, kLatent + kRope, 0, kLatent, 0, 0, 1, kDim},
              [&] {
                KvCacheOptions o;
                o.type = type;
                o.positions = ctx;
                return o;
              }()),
        seq(cache.create()) {
    std::vector<int32_t> tokens(static_cast<size_t>(ctx), 1);
    const KvCache::Write w{seq, 0, tokens};
    cache.make_writable(std::span<const KvCache::Write>(&w, 1));
    const std::vector<float> row = random_values(kLatent + kRope, 3);
    for (int64_t s = 0; s < ctx; ++s) {
      cache.write_row(0, KvPart::kKey, seq, s, 0, row.data());
      cache.write_index_row(0, seq, s, row.data());
    }
  }
};

void BM_IndexScores(benchmark::State& state) {
  const int64_t ctx = state.range(0);
  Cache c(ctx, state.range(2) == 1 ? KvType::kF16 : KvType::kBf16);
  ops::AttentionArgs keys;
  c.cache.index_args(0, c.seq, &keys);
  keys.dk = kDim;
  const std::vector<float> q = random_values(kHeads * kDim, 1), w = random_values(kHeads, 2);
  std::vector<float> out(static_cast<size_t>(ctx));
  for (auto _ : state) {
    if (state.range(1) == 0) {
      ops::index_scores(keys, q.data(), w.data(), kHeads, ctx, out.data());
    } else {
      kern::index_scores(keys, q.data(), w.data(), kHeads, ctx, out.data(), &pool());
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * ctx * kDim * 2);
  state.SetItemsProcessed(state.iterations() * ctx * kHeads * kDim * 2);
}
BENCHMARK(BM_IndexScores)
    ->Args({4096, 1, 0})
    ->Args({16384, 1, 0})
    ->Args({16384, 1, 1})
    ->Args({4096, 0, 0})
    ->UseRealTime();

// One decode token's absorbed attention over `positions` of the cache (all: dense).
void mla_attention(benchmark::State& state, int64_t ctx, bool sparse) {
  Cache c(ctx);
  const std::vector<float> q = random_values(kMlaHeads * (kLatent + kRope), 5);
  std::vector<float> out(static_cast<size_t>(kMlaHeads * kLatent));
  ops::AttentionArgs a;
  a.q = q.data();
  a.q_stride = kMlaHeads * (kLatent + kRope);
  a.n_tokens = 1;
  a.n_heads = kMlaHeads;
  a.n_kv_heads = 1;
  a.dk = kLatent + kRope;
  a.dv = kLatent;
  c.cache.attention_args(0, c.seq, &a);
  a.pos0 = ctx - 1;
  a.scale = 0.07f;
  a.out = out.data();
  SparseSelection sel;
  sel.topk = kTopk;
  sel.offset = {sparse ? 0 : -1};
  for (int64_t i = 0; i < kTopk; ++i) sel.positions.push_back(static_cast<int32_t>(i * ctx / kTopk));
  GatherStorage storage;
  std::vector<ops::AttentionArgs> split;
  for (auto _ : state) {
    storage.reset();
    split.clear();
    split_by_selection(a, 0, sel, storage, &split);
    for (const ops::AttentionArgs& s : split) kern::attention(s, &pool());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * kTopk * (kLatent + kRope) * 2);
}
void BM_SparseMlaAttention(benchmark::State& state) { mla_attention(state, state.range(0), true); }
void BM_DenseMlaAttention(benchmark::State& state) { mla_attention(state, kTopk, false); }
BENCHMARK(BM_SparseMlaAttention)->Arg(16384)->UseRealTime();
BENCHMARK(BM_DenseMlaAttention)->UseRealTime();

}  // namespace
}  // namespace tandem

BENCHMARK_MAIN();
