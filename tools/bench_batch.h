// `tandem bench --batch N1,N2,...`: llama-batched-bench's test. For each N, N sequences of
// -p random prompt tokens are prefilled together, then decode -n tokens each in steps of N tokens
// (every step one forward over the N sequences, through the generator). Reported per N: prefill
// tokens/s; aggregate decode tokens/s (N x tokens per step / time) and per sequence; and the
// decode bound from the bytes the steps really read -- the dense weights once per step, per MoE
// layer the union of the experts the step's tokens selected, the KV cache positions attended --
// over the DRAM read bandwidth measured right after each repetition, with the fraction reached.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "engine/engine.h"
#include "model/kv_cache.h"
#include "ops/cpu/roofline.h"
#include "tools/bench_util.h"

namespace tandem::tools {

inline constexpr int kMaxBatchSequences = 4096;

struct BatchBenchArgs {
  std::vector<int> batches;  // N values, in order
  int n_prompt = 128, n_gen = 64, reps = 1;
  int64_t batch_tokens = 2048;  // tokens per forward while prompts are prefilled
  KvType kv_type = KvType::kF32;
};

// The results, one JSON object per N. experts: the Engine's routing observer target.
// probe: nullptr to use dram_gbs for every repetition.
nlohmann::json run_batch_bench(Engine& engine, ExpertUnionBytes& experts,
                               const BatchBenchArgs& args, cpu::DramReadProbe* probe,
                               double dram_gbs);
void print_batch_table(const nlohmann::json& results);

}  // namespace tandem::tools
