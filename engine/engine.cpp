#include "engine/engine.h"

#include <chrono>

#include "core/error.h"
#include "core/log.h"

namespace tandem {

LoadMode load_mode(const BackendOptions& o) {
  return o.mmap || o.cpu_experts != "native" ? LoadMode::kMap : LoadMode::kCopy;
}

Engine::Engine(const EngineOptions& o) : path_(o.model) {
  const auto t0 = std::chrono::steady_clock::now();
  backend_ = resolve_backend_options(o.backend, o.model);  // (flags checked before the load)
  weights_ = std::make_unique<LoadedModel>(load_model(o.model, o.load.value_or(load_mode(backend_))));
  if (o.page_in) page_in_model(*weights_);
  threading_ = std::make_unique<ThreadingContext>(ThreadingOptions{o.threads, true, 50});
  moe_ = std::make_unique<MoeRuntime>(*weights_, backend_, *threading_);
  ModelOptions mo;
  mo.forward.pool = &threading_->pool();
  mo.forward.mla = o.mla;
  moe_->apply(&mo);
  mo.on_routing = o.on_routing;
  model_ = std::make_unique<Model>(*weights_, mo);
  load_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Engine::~Engine() = default;

const Tokenizer& Engine::tokenizer() {
  if (tokenizer_ == nullptr) {
    tokenizer_ = std::make_unique<Tokenizer>(weights_->gguf ? Tokenizer::from_gguf(*weights_->gguf)
                                                            : Tokenizer::load(path_));
  }
  return *tokenizer_;
}

std::string Engine::summary() const { return model_summary(*weights_) + "\n" + moe_->summary(); }

int64_t Engine::context_size(int64_t ctx) const {
  if (ctx < 0) fail(ErrorKind::kInvalidArgument, "--ctx must be >= 0, got {}", ctx);
  const int64_t trained = config().max_position_embeddings;
  if (ctx == 0) return trained > 0 ? std::min<int64_t>(trained, 4096) : 4096;
  return ctx;
}

KvCache Engine::make_cache(int64_t ctx, KvType type, int64_t sequences,
                           const CheckpointOptions& checkpoints) const {
  ctx = context_size(ctx);
  if (sequences < 1) {
    fail(ErrorKind::kInvalidArgument, "a KV cache for {} sequences", sequences);
  }
  const int64_t trained = config().max_position_embeddings;
  if (trained > 0 && ctx > trained) {
    log_warn("--ctx {} is past the {} positions the model was trained for: its output degrades "
             "past them",
             ctx, trained);
  }
  if (ctx > (int64_t{1} << 40) / sequences) {
    fail(ErrorKind::kInvalidArgument, "--ctx {} for {} sequences is past any memory", ctx,
         sequences);
  }
  KvCacheOptions o;
  o.type = type;
  // Each sequence's ctx positions in whole blocks: `sequences` of them fit at once.
  const int64_t per_sequence = (ctx + o.block_positions - 1) / o.block_positions * o.block_positions;
  o.positions = per_sequence * sequences;
  o.max_sequence_positions = ctx;
  if (config().has_linear_layers()) {
    if (checkpoints.per_sequence < 0 || checkpoints.per_sequence > 1024 || checkpoints.every < 0) {
      fail(ErrorKind::kInvalidArgument,
           "--checkpoints {} / --checkpoint-every {}: need 0 .. 1024 checkpoints per sequence "
           "and an interval >= 0",
           checkpoints.per_sequence, checkpoints.every);
    }
    o.state_slots = sequences * (1 + checkpoints.per_sequence) + kRetainedStates;
    o.checkpoint_interval = checkpoints.every;
  }
  return KvCache(model_->kv_layout(), model_->cache_options(o));
}

}  // namespace tandem
