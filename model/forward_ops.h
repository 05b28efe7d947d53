// The ops the forward (model/model.cpp) is written against, and where they run: the CPU
// (make_cpu_forward_ops: the kernels of ops/cpu on the caller's thread pool) or an accelerator
// (rt::Device::forward_ops: its streams, its memory, the weights uploaded there once). Model
// decides the order -- layers, residuals, routing, the MoE backend, the logits rows -- and hands
// each piece to the ops; the ops own the dense weights they read, the activations they compute
// into, and the attention over the KV cache, which for an accelerator lives in its memory
// (cache_options).
//
// Granularity: one call per piece a GPU runs as a kernel or a fused group of kernels. The
// attention of a layer is one call (its projections, Qwen2 biases, Qwen3 q / k norms, RoPE / YaRN,
// the cache writes, attention over the paged cache in any of its element types, MLA absorbed,
// naive or expanded, the output projection): that is where the backends differ most, and the CPU
// one fuses decode's steps across heads and sequences.
//
// Memory: every float* argument is the ops' memory (buffer()), except where a name says host.
// Calls are ordered; an accelerator's ops return before the work is done, and host_view, lm_head
// and finish wait for it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/kv_cache.h"
#include "model/weights.h"
#include "ops/cpu/kernels.h"

namespace tandem {

class ThreadPool;

// DeepSeek MLA. kAuto: the latent cache of kAbsorbed; decode and small batches attend absorbed,
// a batch of at least ForwardOpsOptions::mla_expand_tokens tokens decompresses every cached
// position's per-head K / V (W_UK, W_UV applied to the latents) for the call and attends in the
// naive form: 192 / 128 values per head and position instead of 576 / 512, a third of the
// attention's arithmetic for a 512-token prefill (what vLLM and SGLang do for prefill too).
enum class MlaMode { kAuto, kAbsorbed, kNaive };
// "auto" | "absorbed" | "naive"; anything else: Error(kInvalidArgument) naming the choices.
MlaMode parse_mla_mode(const std::string& name);
// Expanded MLA's K / V buffers at most (bytes): past that (long contexts, many heads) a batch
// attends absorbed.
inline constexpr uint64_t kMlaExpandBytes = uint64_t{512} << 20;
// Whether expanding K / V of `positions` cached positions for a batch of n tokens costs fewer
// multiply-adds than attending absorbed: the expansion costs positions x kv_lora x (qk_nope + v)
// per head; it saves, per query and head, the absorbed form's wider scores and value sums
// ((kv_lora + rope + kv_lora) - (qk_nope + rope + v) per position) and its W_UK / W_UV products
// (kv_lora x (qk_nope + v)). A fresh prefill always pays; a short batch after a long cached
// prefix does not (V2-Lite: 32 tokens after 4096 would cost 5x what they save).
bool mla_expansion_pays(const ModelConfig& c, int64_t n, int64_t positions);

// How the ops compute (the same for every backend, so they agree).
struct ForwardOpsOptions {
  ThreadPool* pool = nullptr;  // CPU ops: the threads (nullptr: single-threaded)
  MlaMode mla = MlaMode::kAuto;
  // kAuto: the batch size from which MLA attention expands K / V (see MlaMode); the expansion
  // also needs its buffers (positions x heads x (qk + v) floats) within kMlaExpandBytes and, with
  // mla_expand_by_cost, mla_expansion_pays (false: every batch of that size expands; tests).
  int64_t mla_expand_tokens = 32;
  bool mla_expand_by_cost = true;
  // Gated DeltaNet: a sequence's part of at least this many tokens runs the delta rule's chunked
  // form, shorter ones its recurrent form (kern::delta_rule_chunked / _recurrent); 0: always the
  // recurrent form. The CPU's default: on a CPU the recurrent kernel runs a 512-token prefill of a
  // 128 x 128 head in 1.1 ms, the chunked one in 2.9 ms (bench_delta_net_bench, AVX-512): the
  // chunked form does 1.4x the multiply-adds at dk = dv = 128 (its gain is a GPU's matrix units).
  int64_t delta_chunk_tokens = 0;
  // CPU ops: prepared copies of non-expert weights (`--cpu-experts repack`), read instead of the
  // stored bytes where they hold a weight; nullptr: the stored bytes.
  const kern::WeightViews* views = nullptr;
};

// One forward's batch as the ops see it: its parts (one per sequence: rows [t0, t0 + n) of the
// activations, the position of the first token), each token's id, part and position.
struct ForwardStep {
  struct Part {
    SeqId seq;
    int64_t t0, n, pos0;
  };
  // A checkpoint of part `part`'s recurrent state after `offset` of its tokens, into the cache's
  // state slot `slot` (KvCache::pending_snapshots).
  struct Snapshot {
    int32_t part;
    int64_t offset;
    int32_t slot;
  };
  std::vector<Part> parts;
  std::vector<Snapshot> snapshots;
  std::vector<int32_t> tokens;
  std::vector<int32_t> part_of;
  std::vector<int64_t> pos;
  int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
};

// Seconds spent in the ops since they were made, where they ran (the device's time for an
// accelerator): attention and the lm_head. Read between forwards.
struct ForwardOpsProfile {
  double attention = 0, lm_head = 0;
};

class ForwardOps {
 public:
  enum class Norm { kAttention, kFfn };

  virtual ~ForwardOps() = default;
  // "cpu", or the device's name.
  virtual std::string name() const = 0;
  // Activation buffer `slot` (0 .. kBufferSlots - 1) of at least count floats in the ops' memory:
  // the same memory while it is large enough (a larger one replaces it, its contents lost).
  static constexpr int kBufferSlots = 8;
  virtual float* buffer(int slot, int64_t count) = 0;
  // A KV cache the ops attend over must be made with these options (an accelerator's cache is in
  // its memory); check_cache: Error(kInvalidArgument) for one that was not.
  virtual KvCacheOptions cache_options(KvCacheOptions o) const { return o; }
  virtual void check_cache(const KvCache& cache) const {}

  // The step's batch; the cache holds its positions writable (KvCache::make_writable).
  virtual void begin_step(const ForwardStep& step, KvCache& cache) = 0;
  // x [n, hidden]: the step's tokens' embeddings.
  virtual void embed(float* x) = 0;
  // out[t] = rms_norm(x[t]) with the layer's attention or FFN norm, n rows of hidden.
  virtual void norm(Norm which, int64_t layer, const float* x, int64_t n, float* out) = 0;
  virtual void add(float* out, const float* a, int64_t count) = 0;  // out += a
  virtual void fill_zero(float* out, int64_t count) = 0;
  // The layer's attention of the step's tokens: x [n, hidden] (normed) -> out [n, hidden]; writes
  // their keys and values into the cache.
  virtual void attention(int64_t layer, const float* x, float* out) = 0;
  // The layer's Gated DeltaNet instead (a linear-attention layer of a hybrid model): x [n,
  // hidden] (normed) -> out [n, hidden]; advances each part's recurrent state in the cache and
  // fills the step's checkpoints (ForwardStep::snapshots) as it passes their positions.
  // Default: Error(kUnsupported) (ops without it).
  virtual void linear_attention(int64_t layer, const float* x, float* out);
  // The layer's dense SwiGLU FFN (DeepSeek's leading layers), its shared experts (Qwen2-MoE's
  // sigmoid gate applied; zeros when it has none), its router's logits [n, n_experts] (gpt-oss's
  // logit bias added).
  virtual void dense_ffn(int64_t layer, const float* x, int64_t n, float* out) = 0;
  virtual void shared_ffn(int64_t layer, const float* x, int64_t n, float* out) = 0;
  virtual void router(int64_t layer, const float* x, int64_t n, float* logits) = 0;
  // x's count floats readable by the host: x itself for the CPU, else copied into *staging once
  // the work before has finished.
  virtual const float* host_view(const float* x, int64_t count, std::vector<float>* staging) = 0;
  // out += host (count floats the host wrote; they must stay unchanged until the next host_view,
  // lm_head or finish).
  virtual void add_from_host(float* out, const float* host, int64_t count) = 0;
  // Stream-ordered host work (a device's ops: true; the CPU's: false, and the three below are
  // not called): a MoE layer whose routing, CPU experts' submit and wait run as host functions
  // in the ops' order, so the host never waits inside a forward (KTransformers §3.3).
  // host_buffer: host memory `slot` of at least count floats that copies read and write in
  // stream order (pinned on CUDA), unchanged while large enough; copy_to_host: x's
  // count floats into it once the work before has finished; host_work: fn on a host thread once the
  // work before has finished (later work waits for it; it must not call the device: no CUDA API
  // in a host function). An exception in fn surfaces at the next lm_head / finish.
  virtual bool stream_ordered() const { return false; }
  enum class HostSlot : int {
    kMoeInput,         // a stream-ordered MoE layer's hidden states, read by the host
    kMoeRouterLogits,  // its router logits, read by the host's routing
    kMoeRouted,        // the routed experts' output the host writes back
    kLogits,           // the logits a replayed step writes
  };
  static constexpr int kHostSlots = 4;
  virtual float* host_buffer(HostSlot slot, int64_t count);
  virtual void copy_to_host(const float* x, int64_t count, float* host);
  virtual void host_work(std::function<void()> fn);
  // The CPU experts' span from their submit to the return of their wait (a stream-ordered MoE
  // layer), for the device's timeline; nothing by default.
  virtual void note_cpu_experts(std::chrono::steady_clock::time_point t0,
                                std::chrono::steady_clock::time_point t1) {}
  // host_logits [rows, vocab] = lm_head(final_norm(x[row_ids[j]])) for the rows the host names;
  // returns when they are written.
  virtual void lm_head(const std::vector<int64_t>& row_ids, const float* x, float* host_logits) = 0;
  // Waits for everything issued (after an error: so the step's memory can be reused).
  virtual void finish() = 0;
  virtual ForwardOpsProfile profile() const = 0;

  // ---- Graphs of a step (a device's ops; the CPU's: graphs() false, the rest not called) ----
  // A decode step captured once per batch shape and replayed (KTransformers §3.3: a CUDA graph
  // whose host nodes are the CPU experts' submit and wait). What a step's work reads that changes
  // from step to step (token ids, positions, RoPE angles, cache rows, block tables) lives in fixed
  // memory that stage() fills on the host and begin_step()'s device half copies in, so a replay after
  // stage() computes the new step; begin_step(step, cache) is stage(step, cache) then that copy. The
  // sizes of everything a step uses follow from its shape (parts, tokens per part, the cache's
  // positions per sequence), never from its positions. memory_epoch() changes whenever memory a
  // captured step may use has moved (a buffer or a scratch grown): graphs captured before are
  // stale then. While capturing nothing runs, and nothing may grow (run the shape eagerly first).
  // lm_head_to_host: lm_head's rows in stream order into host memory (a host_buffer), read after
  // finish(). Graph ids are the device's; drop_graph releases one (no launch in flight).
  virtual bool graphs() const { return false; }
  virtual void stage(const ForwardStep& step, KvCache& cache);
  virtual uint64_t memory_epoch() const { return 0; }
  virtual void begin_capture();
  virtual int end_capture();
  virtual void launch_graph(int graph);
  virtual void drop_graph(int graph);
  virtual void lm_head_to_host(const std::vector<int64_t>& row_ids, const float* x, float* host);
};

// The CPU's ops: the fast kernels (ops/cpu) over `weights` as loaded, on options.pool.
std::unique_ptr<ForwardOps> make_cpu_forward_ops(const LoadedModel& weights,
                                                 const ForwardOpsOptions& options);

// Makes the ops a Model runs its forward on (ModelOptions::ops): the CPU's when none is given.
using ForwardOpsFactory =
    std::function<std::unique_ptr<ForwardOps>(const LoadedModel&, const ForwardOpsOptions&)>;

}  // namespace tandem
