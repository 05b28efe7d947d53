#include "runtime/step_staging.h"

#include <algorithm>

namespace tandem::rt {

StepLayout step_layout(const ForwardStep& step, const KvCache& cache, int64_t rope_dim) {
  StepLayout l;
  l.n_tokens = step.n_tokens();
  l.parts = static_cast<int64_t>(step.parts.size());
  l.rope_half = rope_dim / 2;
  l.k_heads = cache.layout().k_heads;
  l.v_heads = cache.layout().v_heads;
  ops::AttentionArgs a;
  cache.attention_args(0, step.parts[0].seq, &a);
  if (a.blocks != nullptr) {
    l.max_blocks = (cache.max_sequence_positions() + a.block_positions - 1) / a.block_positions;
  }
  auto section = [&](uint64_t bytes) {
    const uint64_t at = l.bytes;
    l.bytes += (bytes + 15) / 16 * 16;
    return at;
  };
  const auto n = static_cast<uint64_t>(l.n_tokens), parts = static_cast<uint64_t>(l.parts);
  l.tokens = section(n * 4);
  l.pos0 = section(parts * 8);
  l.rope = section(2 * n * static_cast<uint64_t>(l.rope_half) * 4);
  l.rows = section(n * static_cast<uint64_t>(l.k_heads + l.v_heads) * 8);
  l.blocks = section(parts * static_cast<uint64_t>(l.max_blocks) * 4);
  return l;
}

void stage_step(const StepLayout& l, const ForwardStep& step, const KvCache& cache,
                const ops::Rope& rope, uint8_t* area) {
  const int64_t n = l.n_tokens, half = l.rope_half;
  std::copy(step.tokens.begin(), step.tokens.end(), reinterpret_cast<int32_t*>(area + l.tokens));
  auto* pos0 = reinterpret_cast<int64_t*>(area + l.pos0);
  auto* cs = reinterpret_cast<float*>(area + l.rope);
  for (int64_t t = 0; t < n; ++t) rope.angles(step.pos[t], cs + t * half, cs + (n + t) * half);
  auto* k_rows = reinterpret_cast<int64_t*>(area + l.rows);
  int64_t* v_rows = k_rows + n * l.k_heads;
  auto* blocks = reinterpret_cast<int32_t*>(area + l.blocks);
  for (int64_t i = 0; i < l.parts; ++i) {
    const ForwardStep::Part& p = step.parts[static_cast<size_t>(i)];
    pos0[i] = p.pos0;
    ops::AttentionArgs a;
    cache.attention_args(0, p.seq, &a);
    if (a.blocks != nullptr) {
      const int64_t nb = (p.pos0 + p.n + a.block_positions - 1) / a.block_positions;
      int32_t* table = blocks + i * l.max_blocks;
      std::copy(a.blocks, a.blocks + nb, table);
      std::fill(table + nb, table + l.max_blocks, 0);
    }
    for (int64_t t = p.t0; t < p.t0 + p.n; ++t) {
      for (int64_t h = 0; h < l.k_heads; ++h) {
        k_rows[t * l.k_heads + h] = ops::k_offset(a, step.pos[t]) + h * ops::k_head_stride(a);
      }
      for (int64_t h = 0; h < l.v_heads; ++h) {
        v_rows[t * l.v_heads + h] = ops::v_offset(a, step.pos[t]) + h * ops::v_head_stride(a);
      }
    }
  }
}

}  // namespace tandem::rt
