// DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): the lightning indexer and what MLA attention
// does with its choice. The indexer keeps one key per position (index_head_dim values, in the
// KvCache's index layers) and, for a query that sees more than index_topk positions, scores every
// earlier one -- sum over its heads of w_h * relu(q_h . k_s) -- and keeps the index_topk best;
// the attention of that query then reads only those positions. A query that sees at most
// index_topk positions attends to all of them (what llama.cpp's top-k of the masked scores gives),
// so prompts shorter than index_topk cost no scoring at all.
//
// The indexer's query comes from the normed q LoRA (wq_b), its key from the layer's normed input
// (wk, a LayerNorm with bias), both rotated on their first rope_dim values (NeoX halves for
// DeepSeek-V3.2, adjacent pairs for GLM-5) and multiplied by the orthonormal Hadamard matrix;
// each head's weight is w_h = weights_proj x / sqrt(index_head_dim * index_heads), as llama.cpp's
// deepseek32 / glm-dsa graphs compute them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "formats/model_config.h"
#include "model/forward_ops.h"
#include "model/kv_cache.h"
#include "model/weights.h"
#include "ops/cpu/kernels.h"

namespace tandem {

class ThreadPool;

// The positions each token of a step attends to. offset[t] < 0: every position up to its own;
// else positions [offset[t], offset[t] + topk) of `positions`, ascending.
struct SparseSelection {
  int64_t topk = 0;
  std::vector<int64_t> offset;
  std::vector<int32_t> positions;
  bool sparse(int64_t t) const { return offset[static_cast<size_t>(t)] >= 0; }
  std::span<const int32_t> of(int64_t t) const {
    return {positions.data() + offset[static_cast<size_t>(t)], static_cast<size_t>(topk)};
  }
};

class LightningIndexer {
 public:
  LightningIndexer(const ModelConfig& c, ThreadPool* pool, const kern::WeightViews* views);

  // Layer `layer` (an index layer) over the step's n tokens: x [n, hidden] the layer's normed
  // input, qr [n, q_lora] the normed q LoRA. Writes each token's key into the cache, then selects
  // the positions of every token that sees more than index_topk of them.
  void run(int64_t layer, const LayerWeights& lw, const float* x, const float* qr,
           const ForwardStep& step, KvCache& cache, SparseSelection* out);

 private:
  void project(const LayerWeights& lw, const float* x, const float* qr, int64_t n);
  void write_keys(int64_t layer, const LayerWeights& lw, const ForwardStep& step, KvCache& cache);
  void select(int64_t layer, const ForwardStep& step, const KvCache& cache, SparseSelection* out);

  const ModelConfig& c_;
  ThreadPool* pool_;
  const kern::WeightViews* views_;
  ops::Rope rope_;
  ops::RopeForm form_;
  std::vector<float> q_, k_, w_, scores_;
  std::vector<int32_t> order_;
  std::vector<int64_t> sparse_;  // the step's tokens that select
};

// The rows gathered for sparse queries: buffers kept across calls (a decode step's 2,048 latents
// per layer reuse the same memory, no allocation or page faults per token), handed out until
// reset(). A buffer's memory stays where it is while the storage grows.
class GatherStorage {
 public:
  uint8_t* take(size_t bytes);
  void reset() { used_ = 0; }

 private:
  std::vector<std::vector<uint8_t>> bufs_;
  size_t used_ = 0;
};

// A part's attention arguments split by the selection: `args` covers the part's tokens (its
// queries from args.q, outputs from args.out, [n_tokens, n_heads, dv] with q_stride between
// queries; t0 the part's first token in the step). The leading tokens that attend densely keep
// args (fewer tokens); each sparse token gets arguments over a copy of its selected rows (keys,
// and values unless they are the keys' rows), gathered into `storage` (valid until it is
// reset). Appends to out.
void split_by_selection(const ops::AttentionArgs& args, int64_t t0, const SparseSelection& sel,
                        GatherStorage& storage, std::vector<ops::AttentionArgs>* out);

}  // namespace tandem
