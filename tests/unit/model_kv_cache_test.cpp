// The paged KV cache: sequences, block sharing and copy-on-write, the pool's limits, and
// attention over a sequence's blocks against the same rows in a contiguous cache.
#include "model/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/fp_convert.h"
#include "core/thread_pool.h"
#include "core/topology.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {
namespace {

std::vector<float> random_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

KvLayout gqa_layout() { return KvLayout{2, 2, 32, 2, 16}; }

// The value every row of a position carries in these tests: the token id written there, so a
// row read back tells which write it came from.
void write_marks(KvCache& c, SeqId s, int64_t pos0, std::span<const int32_t> tokens) {
  const KvLayout& l = c.layout();
  for (size_t i = 0; i < tokens.size(); ++i) {
    for (int64_t layer = 0; layer < l.layers; ++layer) {
      std::vector<float> k(static_cast<size_t>(l.k_dim), static_cast<float>(tokens[i]));
      std::vector<float> v(static_cast<size_t>(l.v_dim), static_cast<float>(-tokens[i]));
      for (int64_t h = 0; h < l.k_heads; ++h) {
        c.write_row(layer, KvPart::kKey, s, pos0 + static_cast<int64_t>(i), h, k.data());
      }
      for (int64_t h = 0; h < l.v_heads; ++h) {
        c.write_row(layer, KvPart::kValue, s, pos0 + static_cast<int64_t>(i), h, v.data());
      }
    }
  }
}

void append(KvCache& c, SeqId s, const std::vector<int32_t>& tokens, int64_t pos0 = -1) {
  if (pos0 < 0) pos0 = c.length(s);
  const KvCache::Write w{s, pos0, tokens};
  c.make_writable(std::span<const KvCache::Write>(&w, 1));
  write_marks(c, s, pos0, tokens);
}

// Every row of the sequence holds the mark of its token (and its tokens are `want`).
void expect_rows(const KvCache& c, SeqId s, const std::vector<int32_t>& want) {
  ASSERT_EQ(c.length(s), static_cast<int64_t>(want.size()));
  ASSERT_TRUE(std::equal(want.begin(), want.end(), c.tokens(s).begin(), c.tokens(s).end()));
  const KvLayout& l = c.layout();
  std::vector<float> row(static_cast<size_t>(std::max(l.k_dim, l.v_dim)));
  for (int64_t p = 0; p < c.length(s); ++p) {
    for (int64_t layer = 0; layer < l.layers; ++layer) {
      for (int64_t h = 0; h < l.k_heads; ++h) {
        c.read_row(layer, KvPart::kKey, s, p, h, row.data());
        ASSERT_EQ(row[0], static_cast<float>(want[static_cast<size_t>(p)])) << "pos " << p;
        ASSERT_EQ(row[static_cast<size_t>(l.k_dim - 1)], row[0]);
      }
      for (int64_t h = 0; h < l.v_heads; ++h) {
        c.read_row(layer, KvPart::kValue, s, p, h, row.data());
        ASSERT_EQ(row[0], static_cast<float>(-want[static_cast<size_t>(p)])) << "pos " << p;
      }
    }
  }
}

std::vector<int32_t> iota(int32_t from, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = from + i;
  return v;
}

TEST(KvCache, SequencesKeepTheirRows) {
  KvCacheOptions o;
  o.positions = 64 * 8;
  KvCache c(gqa_layout(), o);
  EXPECT_EQ(c.blocks_total(), 8);
  const SeqId a = c.create(), b = c.create();
  append(c, a, iota(1, 40));
  append(c, b, iota(1000, 100));
  append(c, a, iota(41, 100));  // a's blocks now interleave with b's
  expect_rows(c, a, iota(1, 140));
  expect_rows(c, b, iota(1000, 100));
  EXPECT_EQ(c.blocks_free(), 8 - 3 - 2);
  c.release(b);
  EXPECT_EQ(c.blocks_free(), 8 - 3);
  EXPECT_FALSE(c.contains(b));
  EXPECT_THROW(c.length(b), Error);
  expect_rows(c, a, iota(1, 140));
}

TEST(KvCache, ForkSharesBlocksAndCopiesOnWrite) {
  KvCacheOptions o;
  o.positions = 64 * 8;
  KvCache c(gqa_layout(), o);
  const SeqId a = c.create();
  append(c, a, iota(1, 100));  // blocks 0 (full) and 1 (36 of 64)
  const int64_t free0 = c.blocks_free();
  const SeqId b = c.fork(a);
  EXPECT_EQ(c.blocks_free(), free0);  // nothing copied yet
  expect_rows(c, b, iota(1, 100));
  // b writes into the shared partial block: b gets a copy of it, a keeps its rows.
  append(c, b, iota(500, 10));
  EXPECT_EQ(c.blocks_free(), free0 - 1);
  std::vector<int32_t> want_b = iota(1, 100);
  const std::vector<int32_t> tail = iota(500, 10);
  want_b.insert(want_b.end(), tail.begin(), tail.end());
  expect_rows(c, b, want_b);
  expect_rows(c, a, iota(1, 100));
  // a writes too: it holds block 1 alone now, no copy.
  append(c, a, iota(700, 5));
  EXPECT_EQ(c.blocks_free(), free0 - 1);
  std::vector<int32_t> want_a = iota(1, 100);
  const std::vector<int32_t> tail_a = iota(700, 5);
  want_a.insert(want_a.end(), tail_a.begin(), tail_a.end());
  expect_rows(c, a, want_a);
  expect_rows(c, b, want_b);
  // A fork that rewrites from inside the shared full block 0 copies it.
  const SeqId d = c.fork(a);
  append(c, d, iota(900, 3), 10);
  std::vector<int32_t> want_d = iota(1, 10);
  const std::vector<int32_t> tail_d = iota(900, 3);
  want_d.insert(want_d.end(), tail_d.begin(), tail_d.end());
  expect_rows(c, d, want_d);
  expect_rows(c, a, want_a);
  // Releasing every sequence gives every block back.
  c.release(a);
  c.release(b);
  c.release(d);
  EXPECT_EQ(c.blocks_free(), c.blocks_total());
}

TEST(KvCache, TruncateThenContinueReplacesTheTail) {
  KvCacheOptions o;
  o.positions = 64 * 4;
  KvCache c(gqa_layout(), o);
  const SeqId a = c.create();
  append(c, a, iota(1, 130));
  c.truncate(a, 70);
  EXPECT_EQ(c.blocks_free(), 4 - 2);
  append(c, a, iota(300, 20));
  std::vector<int32_t> want = iota(1, 70);
  const std::vector<int32_t> tail = iota(300, 20);
  want.insert(want.end(), tail.begin(), tail.end());
  expect_rows(c, a, want);
  // pos0 inside the sequence: the same as a truncation there.
  append(c, a, iota(800, 2), 5);
  std::vector<int32_t> want2 = iota(1, 5);
  want2.push_back(800);
  want2.push_back(801);
  expect_rows(c, a, want2);
  EXPECT_THROW(append(c, a, iota(1, 1), 99), Error);  // past its end
}

TEST(KvCache, AFullPoolIsAnErrorAndChangesNothing) {
  KvCacheOptions o;
  o.positions = 64 * 3;
  KvCache c(gqa_layout(), o);
  const SeqId a = c.create(), b = c.create();
  append(c, a, iota(1, 128));
  append(c, b, iota(200, 10));
  EXPECT_EQ(c.blocks_free(), 0);
  // Two writes, the second cannot fit: neither happens.
  const std::vector<int32_t> t1 = iota(50, 10), t2 = iota(60, 60);
  const KvCache::Write ws[2] = {{b, 10, t1}, {a, 128, t2}};
  EXPECT_EQ(c.blocks_needed(ws), 1);
  try {
    c.make_writable(ws);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResource);
    EXPECT_NE(std::string(e.what()).find("KV cache full"), std::string::npos) << e.what();
  }
  expect_rows(c, a, iota(1, 128));
  expect_rows(c, b, iota(200, 10));
  // A rewrite that frees its own blocks first fits.
  append(c, a, iota(900, 100), 0);
  expect_rows(c, a, iota(900, 100));
  // The context size bounds one sequence; the same sequence twice in a batch is refused.
  KvCacheOptions small = o;
  small.max_sequence_positions = 50;
  KvCache s(gqa_layout(), small);
  const SeqId x = s.create();
  EXPECT_THROW(append(s, x, iota(1, 51)), Error);
  const KvCache::Write twice[2] = {{x, 0, t1}, {x, 0, t1}};
  EXPECT_THROW(s.make_writable(twice), Error);
  EXPECT_EQ(s.length(x), 0);
}

TEST(KvCache, BadSizesAreErrors) {
  KvCacheOptions o;
  o.block_positions = 48;  // not a power of two
  EXPECT_THROW(KvCache(gqa_layout(), o), Error);
  o.block_positions = 32;  // below the kernels' 64
  EXPECT_THROW(KvCache(gqa_layout(), o), Error);
  o.block_positions = 64;
  o.positions = 0;
  EXPECT_THROW(KvCache(gqa_layout(), o), Error);
  o.positions = int64_t{1} << 60;  // far more than any memory
  try {
    KvCache c(gqa_layout(), o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResource);
  }
  EXPECT_THROW(KvCache(KvLayout{1, 0, 8, 0, 8}, KvCacheOptions{}), Error);
}

TEST(KvCache, LongestPrefixFindsTheSharedStart) {
  KvCache c(gqa_layout(), KvCacheOptions{});
  const SeqId a = c.create(), b = c.create();
  append(c, a, {5, 6, 7, 8});
  append(c, b, {5, 6, 9});
  const std::vector<int32_t> q = {5, 6, 7, 1};
  const KvCache::PrefixMatch m = c.longest_prefix(q);
  EXPECT_EQ(m.seq, a);
  EXPECT_EQ(m.length, 3);
  const std::vector<int32_t> none = {1};
  EXPECT_EQ(c.longest_prefix(none).length, 0);
}

// Attention over a sequence's blocks (scattered among another sequence's) gives the bits of the
// same rows in a contiguous head-major cache, for every element type, GQA and MLA's layout
// (values the first dv of the key rows), prefill chunks and decode steps, on the kernels of
// every ISA here and the reference.
TEST(KvCache, PagedAttentionEqualsContiguous) {
  ThreadPool pool(place_workers(detect_topology(), 2));
  struct Shape {
    int64_t heads, kv_heads, dk, dv;
    bool latent;
  };
  for (const KvType type : {KvType::kF32, KvType::kBf16, KvType::kF16, KvType::kQ8_0}) {
    for (const Shape sh : {Shape{8, 2, 64, 64, false}, Shape{6, 3, 40, 24, false},
                           Shape{16, 1, 72, 64, true}, Shape{1, 1, 160, 128, true}}) {
      const KvLayout layout = sh.latent ? KvLayout{1, 1, sh.dk, 0, sh.dv}
                                        : KvLayout{1, sh.kv_heads, sh.dk, sh.kv_heads, sh.dv};
      KvCacheOptions o;
      o.type = type;
      o.positions = 64 * 24;
      KvCache cache(layout, o);
      const SeqId other = cache.create(), s = cache.create();
      const int64_t n_ctx = 600;  // the split long decode for MLA's 16 heads past 512
      const std::vector<float> k = random_values(n_ctx * sh.kv_heads * sh.dk, 11);
      const std::vector<float> v = random_values(n_ctx * sh.kv_heads * sh.dv, 12);
      // s's positions written in chunks, `other` taking blocks between them (s has the pool's
      // first block: nothing may be read before it).
      for (int64_t p0 = 0; p0 < n_ctx; p0 += 100) {
        const std::vector<int32_t> toks(100, 1);
        const KvCache::Write w{s, p0, toks};
        cache.make_writable(std::span<const KvCache::Write>(&w, 1));
        append(cache, other, std::vector<int32_t>(70, 2));
        for (int64_t p = p0; p < p0 + 100; ++p) {
          for (int64_t g = 0; g < layout.k_heads; ++g) {
            cache.write_row(0, KvPart::kKey, s, p, g, k.data() + (p * sh.kv_heads + g) * sh.dk);
          }
          for (int64_t g = 0; g < layout.v_heads; ++g) {
            cache.write_row(0, KvPart::kValue, s, p, g, v.data() + (p * sh.kv_heads + g) * sh.dv);
          }
        }
      }
      // The contiguous cache: each row converted alone as write_row does, head-major.
      const int64_t eb = type == KvType::kF32 ? 4 : type == KvType::kQ8_0 ? 1 : 2;
      const int64_t krow = type == KvType::kQ8_0 ? ops::q8_row_bytes(sh.dk) : sh.dk * eb;
      const int64_t vrow = type == KvType::kQ8_0 ? ops::q8_row_bytes(sh.dv) : sh.dv * eb;
      std::vector<int32_t> kmem(static_cast<size_t>(sh.kv_heads * n_ctx * krow / 4 + 1));
      std::vector<int32_t> vmem(static_cast<size_t>(sh.kv_heads * n_ctx * vrow / 4 + 1));
      auto convert = [&](const float* x, int64_t d, uint8_t* row) {
        if (type == KvType::kF32) {
          std::memcpy(row, x, static_cast<size_t>(d) * 4);
        } else if (type == KvType::kQ8_0) {
          ops::q8_quantize(x, d, reinterpret_cast<int8_t*>(row) + ops::q8_lead_bytes(d));
        } else {
          uint16_t* h = reinterpret_cast<uint16_t*>(row);
          for (int64_t i = 0; i < d; ++i) {
            h[i] = type == KvType::kF16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
          }
        }
      };
      uint8_t* kb = reinterpret_cast<uint8_t*>(kmem.data());
      uint8_t* vb = reinterpret_cast<uint8_t*>(vmem.data());
      for (int64_t g = 0; g < sh.kv_heads; ++g) {
        for (int64_t p = 0; p < n_ctx; ++p) {
          convert(k.data() + (p * sh.kv_heads + g) * sh.dk, sh.dk, kb + (g * n_ctx + p) * krow);
          convert(v.data() + (p * sh.kv_heads + g) * sh.dv, sh.dv, vb + (g * n_ctx + p) * vrow);
        }
      }
      ops::AttentionArgs flat;
      flat.n_heads = sh.heads;
      flat.n_kv_heads = sh.kv_heads;
      flat.dk = sh.dk;
      flat.dv = sh.dv;
      flat.scale = 0.125f;
      const uint8_t* vsrc = sh.latent ? kb : vb;
      const int64_t vstride = sh.latent ? krow : vrow;
      if (type == KvType::kF32) {
        flat.k = reinterpret_cast<const float*>(kb);
        flat.v = reinterpret_cast<const float*>(vsrc);
      } else if (type == KvType::kQ8_0) {
        flat.k8 = reinterpret_cast<const int8_t*>(kb) + ops::q8_lead_bytes(sh.dk);
        flat.v8 = sh.latent ? flat.k8
                            : reinterpret_cast<const int8_t*>(vb) + ops::q8_lead_bytes(sh.dv);
      } else {
        flat.k16 = reinterpret_cast<const uint16_t*>(kb);
        flat.v16 = reinterpret_cast<const uint16_t*>(vsrc);
        flat.f16 = type == KvType::kF16;
      }
      const int64_t unit = type == KvType::kQ8_0 ? 1 : eb;
      flat.k_stride = krow / unit;
      flat.v_stride = vstride / unit;
      flat.k_head = sh.kv_heads > 1 ? n_ctx * flat.k_stride : 0;
      flat.v_head = sh.kv_heads > 1 ? n_ctx * flat.v_stride : 0;
      ops::AttentionArgs paged = flat;
      paged.k = paged.v = nullptr;
      paged.k16 = paged.v16 = nullptr;
      paged.k8 = paged.v8 = nullptr;
      cache.attention_args(0, s, &paged);
      ASSERT_NE(paged.blocks, nullptr);
      // Prefill chunks (5, 100 tokens after a prefix) and decode steps (short and long).
      struct Call {
        int64_t pos0, n;
      };
      for (const Call call : {Call{0, 5}, Call{30, 100}, Call{130, 1}, Call{599, 1}}) {
        const std::vector<float> q = random_values(call.n * sh.heads * sh.dk, 13);
        for (ops::AttentionArgs* a : {&flat, &paged}) {
          a->q = q.data();
          a->q_stride = sh.heads * sh.dk;
          a->n_tokens = call.n;
          a->pos0 = call.pos0;
        }
        const size_t out = static_cast<size_t>(call.n * sh.heads * sh.dv);
        std::vector<float> want(out), got(out);
        flat.out = want.data();
        paged.out = got.data();
        ops::attention(flat, nullptr);
        ops::attention(paged, nullptr);
        ASSERT_EQ(got, want) << "reference, type " << kv_type_name(type) << " pos0 "
                             << call.pos0;
        for (const Isa isa : {Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
          if (isa > best_isa()) continue;
          for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
            kern::attention(flat, p, isa);
            kern::attention(paged, p, isa);
            ASSERT_EQ(got, want) << "kernel " << isa_name(isa) << ", type "
                                 << kv_type_name(type) << " pos0 " << call.pos0 << " n "
                                 << call.n << (p != nullptr ? " pool" : "");
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem
