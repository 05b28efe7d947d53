// The staged step a device's forward ops copy in (runtime/step_staging.h): for F32 and Q8_0 caches,
// GQA and MLA layouts, parts of one and several tokens, a fork sharing blocks: each cache row
// offset addresses the row KvCache::write_row wrote for that token and head, the block tables are
// the sequences' own (zeros past them), positions and ids are the step's; and the layout of a step
// depends on its shape only, not on where its sequences stand.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/memory.h"
#include "runtime/step_staging.h"

namespace tandem::rt {
namespace {

ForwardStep make_step(const std::vector<ForwardStep::Part>& parts,
                      const std::vector<int32_t>& tokens) {
  ForwardStep s;
  s.parts = parts;
  s.tokens = tokens;
  for (size_t i = 0; i < parts.size(); ++i) {
    for (int64_t j = 0; j < parts[i].n; ++j) {
      s.part_of.push_back(static_cast<int32_t>(i));
      s.pos.push_back(parts[i].pos0 + j);
    }
  }
  return s;
}

// Makes the step's positions writable and writes a distinct row for every token, layer 0, each
// head (keys and values); then checks the staged area against the cache.
void check_staging(KvCache& cache, const ForwardStep& step, const ops::Rope& rope) {
  std::vector<KvCache::Write> writes;
  for (const ForwardStep::Part& p : step.parts) {
    writes.push_back(
        {p.seq, p.pos0,
         std::span<const int32_t>(step.tokens.data() + p.t0, static_cast<size_t>(p.n))});
  }
  cache.make_writable(writes);
  const KvLayout kl = cache.layout();
  auto row_value = [](int64_t t, int64_t h, bool v, int64_t i) {
    return static_cast<float>(1000 * t + 100 * h + (v ? 50 : 0) + i) * 0.01f;
  };
  for (int64_t t = 0; t < step.n_tokens(); ++t) {
    const ForwardStep::Part& p = step.parts[static_cast<size_t>(step.part_of[t])];
    for (int v = 0; v < 2; ++v) {
      const int64_t heads = v ? kl.v_heads : kl.k_heads, d = v ? kl.v_dim : kl.k_dim;
      for (int64_t h = 0; h < heads; ++h) {
        std::vector<float> row(static_cast<size_t>(d));
        for (int64_t i = 0; i < d; ++i) row[static_cast<size_t>(i)] = row_value(t, h, v, i);
        cache.write_row(0, v != 0 ? KvPart::kValue : KvPart::kKey, p.seq, step.pos[t], h, row.data());
      }
    }
  }
  const StepLayout l = step_layout(step, cache, rope.dim());
  AlignedBuffer area(l.bytes);
  std::memset(area.as<uint8_t>(), 0x7f, l.bytes);
  stage_step(l, step, cache, rope, area.as<uint8_t>());
  const uint8_t* a = area.as<uint8_t>();
  for (uint64_t o : {l.tokens, l.pos0, l.rope, l.rows, l.blocks}) EXPECT_EQ(o % 16, 0u);
  const auto* tokens = reinterpret_cast<const int32_t*>(a + l.tokens);
  EXPECT_EQ(std::vector<int32_t>(tokens, tokens + step.n_tokens()), step.tokens);
  const auto* pos0 = reinterpret_cast<const int64_t*>(a + l.pos0);
  const auto* cs = reinterpret_cast<const float*>(a + l.rope);
  const auto* k_rows = reinterpret_cast<const int64_t*>(a + l.rows);
  const int64_t* v_rows = k_rows + step.n_tokens() * kl.k_heads;
  const auto* blocks = reinterpret_cast<const int32_t*>(a + l.blocks);
  const int64_t half = rope.dim() / 2, n = step.n_tokens();
  for (size_t i = 0; i < step.parts.size(); ++i) {
    const ForwardStep::Part& p = step.parts[i];
    EXPECT_EQ(pos0[i], p.pos0);
    ops::AttentionArgs args;
    cache.attention_args(0, p.seq, &args);
    const int64_t nb = (p.pos0 + p.n + args.block_positions - 1) / args.block_positions;
    for (int64_t b = 0; b < l.max_blocks; ++b) {
      EXPECT_EQ(blocks[static_cast<int64_t>(i) * l.max_blocks + b], b < nb ? args.blocks[b] : 0)
          << "part " << i << " block " << b;
    }
    for (int64_t t = p.t0; t < p.t0 + p.n; ++t) {
      std::vector<float> c(static_cast<size_t>(half)), s(c.size());
      rope.angles(step.pos[t], c.data(), s.data());
      EXPECT_EQ(0, std::memcmp(cs + t * half, c.data(), c.size() * 4));
      EXPECT_EQ(0, std::memcmp(cs + (n + t) * half, s.data(), s.size() * 4));
      // Each row offset from the layer's base addresses the row written for (t, head).
      for (int v = 0; v < 2; ++v) {
        const int64_t heads = v ? kl.v_heads : kl.k_heads, d = v ? kl.v_dim : kl.k_dim;
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t at = (v ? v_rows : k_rows)[t * heads + h];
          std::vector<float> want(static_cast<size_t>(d));
          cache.read_row(0, v != 0 ? KvPart::kValue : KvPart::kKey, p.seq, step.pos[t], h, want.data());
          for (int64_t e = 0; e < d; ++e) {
            const bool q8 = cache.type() == KvType::kQ8_0;
            const float got =
                q8 ? ops::q8_value((v ? args.v8 : args.k8) + at, e) : (v ? args.v : args.k)[at + e];
            ASSERT_EQ(got, want[static_cast<size_t>(e)]) << "token " << t << " head " << h;
            if (!q8) {
              ASSERT_EQ(got, row_value(t, h, v, e));
            }
          }
        }
      }
    }
  }
}

KvCache make_cache(const KvLayout& layout, KvType type) {
  KvCacheOptions o;
  o.type = type;
  o.positions = 64 * 12;
  o.max_sequence_positions = 300;
  return KvCache(layout, o);
}

TEST(StepStaging, EveryOffsetAddressesItsRowAndTheLayoutIsTheShapes) {
  const ops::Rope rope(16, 10000.0f, RopeScaling{});
  for (KvType type : {KvType::kF32, KvType::kQ8_0}) {
    for (const KvLayout& kl : {KvLayout{2, 3, 16, 3, 16}, KvLayout{2, 1, 40, 0, 32}}) {
      SCOPED_TRACE(testing::Message() << kv_type_name(type) << " k_heads " << kl.k_heads);
      KvCache cache = make_cache(kl, type);
      const SeqId a = cache.create(), b = cache.create();
      // a: 70 positions (two blocks), b: 5; then c forks a (sharing its blocks).
      std::vector<int32_t> pa(70, 3), pb(5, 4);
      const KvCache::Write w[2] = {{a, 0, pa}, {b, 0, pb}};
      cache.make_writable(w);
      const SeqId c = cache.fork(a);
      // Parts: a one token at 70, b three at 5, c one at 70 (its own copy of the shared block).
      const ForwardStep s1 =
          make_step({{a, 0, 1, 70}, {b, 1, 3, 5}, {c, 4, 1, 70}}, {11, 12, 13, 14, 15});
      check_staging(cache, s1, rope);
      const StepLayout l1 = step_layout(s1, cache, rope.dim());
      EXPECT_EQ(l1.max_blocks, 5);  // 300 positions per sequence, 64 per block
      // The same shape further on: the same layout.
      const ForwardStep s2 =
          make_step({{a, 0, 1, 71}, {b, 1, 3, 8}, {c, 4, 1, 71}}, {21, 22, 23, 24, 25});
      check_staging(cache, s2, rope);
      const StepLayout l2 = step_layout(s2, cache, rope.dim());
      EXPECT_EQ(l2.bytes, l1.bytes);
      EXPECT_EQ(l2.rows, l1.rows);
      EXPECT_EQ(l2.blocks, l1.blocks);
    }
  }
}

}  // namespace
}  // namespace tandem::rt
