// What every command that runs a model sets up, in one place: the backend flags checked before
// the load, the weights loaded (read into huge-page memory or mapped) and paged in, the threads,
// the MoE runtime (CPU experts, accelerator), the Model over them, and on demand the tokenizer and
// KV caches. Commands, the server and tests build one Engine from their flags and use its parts;
// none repeats the sequence.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "engine/tokenizer.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/weights.h"
#include "runtime/moe_runtime.h"

namespace tandem {

// The model files are copied into huge-page memory unless --mmap, or unless the CPU experts are
// repacked (repack / int8 / int4 / bf16): then the stored experts are read once to pack (or never,
// with a cache) and copying the whole file would hold it in memory for nothing; the packed experts
// (their huge-page arena, or the packed cache) are the copy then (BackendOptions::mmap,
// CpuExpertOptions::cache_load). o: resolved (resolve_backend_options: no "auto" left).
LoadMode load_mode(const BackendOptions& o);

// Hybrid models' recurrent-state checkpoints (KvCache): the slots held per sequence for them,
// and a checkpoint every `every` positions (0: only at the end of each prompt).
// `--checkpoints`, `--checkpoint-every`.
struct CheckpointOptions {
  int64_t per_sequence = 4;
  int64_t every = 1024;
};

struct EngineOptions {
  std::filesystem::path model;  // a .gguf file (or its first shard) or an HF directory
  int threads = 0;              // ThreadingOptions::n_threads (0: one per physical core)
  BackendOptions backend;       // as given (resolved here)
  MlaMode mla = MlaMode::kAuto;
  RoutingObserver on_routing;            // optional
  std::optional<LoadMode> load;          // default: load_mode(resolved backend)
  bool page_in = true;                   // touch the weights' pages before the first forward
};

class Engine {
 public:
  // Throws what resolve_backend_options, load_model and MoeRuntime throw (Error naming the flag
  // or the file).
  explicit Engine(const EngineOptions& options);
  ~Engine();

  const LoadedModel& weights() const { return *weights_; }
  const ModelConfig& config() const { return weights_->config; }
  const BackendOptions& backend() const { return backend_; }
  ThreadingContext& threading() { return *threading_; }
  MoeRuntime& moe() { return *moe_; }
  Model& model() { return *model_; }
  // The vocabulary: the GGUF metadata, or the HF directory's tokenizer.model / tokenizer.json
  // (loaded on first use; throws Error when the model has none).
  const Tokenizer& tokenizer();
  // The model's and the MoE runtime's summary lines.
  std::string summary() const;
  double load_seconds() const { return load_seconds_; }

  // A KV cache for `sequences` sequences of up to ctx positions each, all at once (each
  // sequence's positions rounded up to whole blocks) (ctx 0: 4096, or the
  // model's trained context when shorter); with recurrent layers, state slots for them, for
  // kRetainedStates finished sequences kept for their prefix, and for their checkpoints.
  // Error(kInvalidArgument) for ctx < 0, sequences < 1 or bad checkpoint options; a warning when
  // ctx is past the trained context; Error(kResource) naming the sizes when the pool does not
  // fit in memory.
  static constexpr int64_t kRetainedStates = 4;  // GeneratorOptions::retain's default
  KvCache make_cache(int64_t ctx, KvType type, int64_t sequences = 1,
                     const CheckpointOptions& checkpoints = {}) const;
  // ctx as make_cache resolves it.
  int64_t context_size(int64_t ctx) const;

 private:
  std::filesystem::path path_;
  BackendOptions backend_;
  std::unique_ptr<LoadedModel> weights_;
  std::unique_ptr<ThreadingContext> threading_;
  std::unique_ptr<MoeRuntime> moe_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  double load_seconds_ = 0;
};

}  // namespace tandem
