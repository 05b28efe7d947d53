// What a device's forward ops copy in at the start of a step, so that a graph of the step replays
// at new positions (runtime/cuda_forward_ops.cpp's stage(); docs/model.md, "Decode steps as
// graphs"): one area of sections, each 16-byte aligned -- the tokens' ids (int32), each part's
// first position (int64), RoPE's cos then sin per token (dim / 2 floats each, ops::Rope::angles),
// each token's cache rows for the keys then the values (int64 offsets from a layer's base, per KV
// head: ops::k_offset + head * ops::k_head_stride, the same in every layer; bytes for a Q8_0
// cache), and each part's block table at a fixed stride, the most blocks a sequence of the cache
// can hold, zeros past its own. The layout follows from the step's shape (parts, tokens per part)
// and the cache alone, never from positions: every step of one shape on one cache stages the same
// number of bytes at the same offsets.
#pragma once

#include <cstdint>

#include "model/forward_ops.h"
#include "model/kv_cache.h"
#include "ops/cpu/ref_ops.h"

namespace tandem::rt {

struct StepLayout {
  int64_t n_tokens = 0, parts = 0;
  int64_t rope_half = 0;             // cos / sin values per token
  int64_t k_heads = 0, v_heads = 0;  // cache rows per token: keys, values
  int64_t max_blocks = 0;            // block table entries per part (0: a contiguous cache)
  // Byte offsets of the sections and the area's size.
  uint64_t tokens = 0, pos0 = 0, rope = 0, rows = 0, blocks = 0, bytes = 0;
};

StepLayout step_layout(const ForwardStep& step, const KvCache& cache, int64_t rope_dim);

// Writes the step into area (layout.bytes, 16-byte aligned).
void stage_step(const StepLayout& layout, const ForwardStep& step, const KvCache& cache,
                const ops::Rope& rope, uint8_t* area);

}  // namespace tandem::rt
