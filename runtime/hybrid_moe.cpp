#include "runtime/hybrid_moe.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_file.h"
#include "core/log.h"
#include "core/topology.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/router.h"
#include "ops/cpu/ref_ops.h"
#include "runtime/calibrate.h"
#include "runtime/cost_model.h"
#include "runtime/expert_cache.h"
#include "runtime/policy.h"
#include "runtime/prefetch.h"
#include "runtime/timeline.h"

namespace tandem::rt {
namespace {

constexpr uint64_t kAlign = 256;
uint64_t align_up(uint64_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

// Scale rows of an FP8 block-scaled weight that its rows use: [first block row, count].
void scale_span(const ops::Weight& w, int64_t* first, int64_t* floats) {
  *first = 0;
  *floats = 0;
  if (w.scale_inv == nullptr) return;
  const int64_t r0 = w.row0 / w.block_rows, r1 = (w.row0 + w.rows() - 1) / w.block_rows;
  *first = r0;
  *floats = (r1 - r0 + 1) * w.scale_cols;
}

uint64_t weight_bytes(const ops::Weight& w) {
  int64_t first, floats;
  scale_span(w, &first, &floats);
  return align_up(static_cast<uint64_t>(w.t.nbytes())) + align_up(floats * 4);
}

// Device bytes of one FFN: its three weights, and gpt-oss's biases when it has them.
uint64_t ffn_bytes(const ops::Weight& g, const ops::Weight& u, const ops::Weight& d,
                   const ops::FfnExtras& x = {}) {
  const uint64_t ff = static_cast<uint64_t>(g.rows()), h = static_cast<uint64_t>(d.rows());
  return weight_bytes(g) + weight_bytes(u) + weight_bytes(d) +
         (x.gate_bias != nullptr ? align_up(ff * 4) : 0) +
         (x.up_bias != nullptr ? align_up(ff * 4) : 0) +
         (x.down_bias != nullptr ? align_up(h * 4) : 0);
}

// Router scores of n tokens for a MoE layer (the MRS cache, DALI and the prefetchers read them).
void layer_scores(const ModelConfig& c, const LayerWeights& lw, const float* x, int64_t n,
                  std::vector<float>* logits, std::vector<float>* scores) {
  logits->resize(n * c.n_experts);
  scores->resize(n * c.n_experts);
  ops::matmul(lw.router, x, n, logits->data(), nullptr);
  for (int64_t t = 0; t < n; ++t) {
    router_scores(c, logits->data() + t * c.n_experts, scores->data() + t * c.n_experts);
  }
}

}  // namespace

struct HybridMoeBackend::Layer {
  int64_t model_layer = 0;
  const LayerWeights* lw = nullptr;
  bool cpu_only = false;
  bool has_shared = false, shared_accel = false;
  DeviceFfnWeights shared;
  std::vector<DeviceFfnWeights> dev_w;  // [expert]: its weights in its slot while valid
  std::vector<uint8_t> valid;           // [expert]: dev_w points at a slot holding it
  std::vector<uint8_t> prefetched;      // [expert]: copied by the prefetcher for the next step
};

struct HybridMoeBackend::Pending {
  explicit Pending(Device* dev) : xg(dev), scale(dev), dev_y(dev) {}
  bool active = false;
  MoeRequest r;
  MoeRequest cpu_req;
  std::vector<uint8_t> mask;
  std::vector<float> cpu_out, shared_host, logits, scores;
  // Staged in alloc_host memory: the device's inputs [rows, h] and scales [rows], its outputs.
  HostStaging xg, scale, dev_y;
  std::vector<int64_t> row_of_pair;     // [t * k + j]: row of the device output, -1: on the CPU
  std::vector<const float*> slot_rows;  // the same as rows of dev_y for the CPU's combine
  int64_t shared_rows = 0;
  int64_t rows = 0;  // device rows: shared_rows + the accelerator experts' tokens
  struct Run {
    int64_t expert, row0, n;  // an accelerator expert's rows of the device buffers
  };
  std::vector<Run> runs;
  std::vector<int64_t> count;  // [n_experts]: the request's tokens per expert
  float* d_buf = nullptr;  // device: inputs [rows, h], outputs [rows, h], scales [rows]
  uint64_t d_bytes = 0;
};

HybridMoeBackend::HybridMoeBackend(const LoadedModel& model, MoeBackend* cpu, Device* device,
                                   const Placement& placement, const HybridOptions& o)
    : model_(model), cpu_(cpu), dev_(device), opt_(o), p_(std::make_unique<Pending>(device)) {
  compute_ = dev_->create_stream();
  copy_ = dev_->create_stream();
  fetched_ = dev_->create_event();
  done_ = dev_->create_event();
  uint64_t shared_total = 0;
  int max_pinned = 0;
  collect_layers(placement, &shared_total, &max_pinned);
  const int extra = size_slots(shared_total, max_pinned);
  make_strategies(extra);
  if (o.pin_experts && slots_per_layer_ > 0) register_experts();
  upload_resident(placement, max_pinned);
  dev_->sync_stream(copy_);
  stats_.bytes_copied = 0;  // count what moves while running
}

// The MoE layers (layers_, moe_layers_) with their placement; the bytes of the shared experts
// that go to the device, the pinned experts per layer, and slot_bytes_ (the largest expert).
void HybridMoeBackend::collect_layers(const Placement& placement, uint64_t* shared_total,
                                      int* max_pinned) {
  const LoadedModel& model = model_;
  const int n_experts = static_cast<int>(model.config.n_experts);
  *max_pinned = std::min(opt_.gpu_experts, n_experts);
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const LayerWeights& lw = model.layers[l];
    if (!lw.moe) continue;
    auto L = std::make_unique<Layer>();
    L->model_layer = static_cast<int64_t>(l);
    L->lw = &lw;
    L->cpu_only = placement.experts_cpu_only(L->model_layer);
    L->has_shared = !lw.sh_gate.empty();
    L->shared_accel = L->has_shared && placement.shared_on_accel(L->model_layer);
    if (L->shared_accel) *shared_total += ffn_bytes(lw.sh_gate, lw.sh_up, lw.sh_down);
    if (placement.experts_pinned(L->model_layer)) *max_pinned = n_experts;
    for (int e = 0; e < n_experts; ++e) {
      slot_bytes_ = std::max(slot_bytes_, ffn_bytes(lw.experts.gate[e], lw.experts.up[e],
                                                    lw.experts.down[e], lw.experts.extras(e)));
    }
    L->dev_w.resize(n_experts);
    L->valid.assign(n_experts, 0);
    L->prefetched.assign(n_experts, 0);
    moe_layers_.push_back(L->model_layer);
    layers_.push_back(std::move(L));
  }
  TD_CHECK(!layers_.empty(), "HybridMoeBackend on a model without MoE layers");
}

// Budget: shared experts, pinned experts, then cache slots; a reserve stays for activations
// (and the KV cache, when the dense part runs on the device: it was uploaded before). Sets
// slots_per_layer_ and the slot tables; returns the evictable slots per layer.
int HybridMoeBackend::size_slots(uint64_t shared_total, int max_pinned) {
  const HybridOptions& o = opt_;
  const int n_experts = static_cast<int>(model_.config.n_experts);
  const int n_moe = static_cast<int>(layers_.size());
  const uint64_t left = dev_->memory_capacity() - dev_->memory_used();
  const uint64_t budget = o.budget_bytes ? std::min(o.budget_bytes, left) : left;
  const uint64_t reserve =
      o.reserve_bytes > 0 ? o.reserve_bytes : std::min<uint64_t>(budget / 4, uint64_t{64} << 20);
  if (shared_total + reserve > budget) {
    fail(ErrorKind::kResource,
         "--vram-budget: the shared experts need {} bytes (+{} for activations and the KV cache), "
         "the device has {} left",
         shared_total, reserve, budget);
  }
  const uint64_t avail = budget - shared_total - reserve;
  const uint64_t pinned_bytes = uint64_t(n_moe) * max_pinned * slot_bytes_;
  if (pinned_bytes > avail) {
    fail(ErrorKind::kResource,
         "--gpu-experts {}: {} pinned experts per layer x {} MoE layers need {} bytes, the budget "
         "(--vram-budget) leaves {}",
         o.gpu_experts, max_pinned, n_moe, pinned_bytes, avail);
  }
  int extra = 0;
  if (o.cache != CacheKind::kNone) {
    const uint64_t per_layer = uint64_t(n_moe) * slot_bytes_;
    const int fit = static_cast<int>(
        std::min<uint64_t>((avail - pinned_bytes) / per_layer, uint64_t(n_experts)));
    if (o.cache_slots >= 0) {
      extra = o.cache_slots;
      if (extra > fit) {
        fail(ErrorKind::kResource,
             "--cache-slots {}: {} MoE layers x {} bytes per slot do not fit "
             "next to the pinned experts in the budget (at most {} slots)",
             extra, n_moe, slot_bytes_, fit);
      }
    } else {
      extra = fit;
    }
  }
  slots_per_layer_ = std::min(n_experts, max_pinned + extra);
  slot_mem_.assign(size_t(n_moe) * std::max(slots_per_layer_, 1), nullptr);
  slot_owner_.assign(slot_mem_.size(), {-1, -1});
  return extra;
}

// The expert cache, the assignment policy, the cost model and the prefetcher (with DALI's
// residual vectors when it predicts from them).
void HybridMoeBackend::make_strategies(int extra) {
  const HybridOptions& o = opt_;
  const ModelConfig& c = model_.config;
  const int n_moe = static_cast<int>(layers_.size());
  const int n_experts = static_cast<int>(c.n_experts), k = static_cast<int>(c.n_experts_per_tok);
  CacheConfig cc;
  cc.n_layers = n_moe;
  cc.n_experts = n_experts;
  cc.top_k = k;
  cc.slots_per_layer = slots_per_layer_;
  cc.global_pool = o.global_pool;
  cache_ = ExpertCache::make(o.cache, cc);
  PolicyOptions po;
  po.max_fetch = extra;  // at most the evictable slots: a fetched expert always finds one
  policy_ = AssignmentPolicy::make(o.policy, po);

  // Cost model: measured (tandem profile) or estimated from bytes and nominal rates.
  if (!o.profile.empty()) {
    cost_ = std::make_unique<CostModel>(CostModel::load(o.profile));
    cost_source_ = o.profile.string();
  } else {
    cost_ = std::make_unique<CostModel>(estimate_cost());
    cost_source_ = "estimated";
  }
  if (o.prefetch == PrefetchKind::kResidual) {
    if (o.residuals.empty()) {
      fail(ErrorKind::kInvalidArgument,
           "--prefetch residual needs --residuals FILE (written by `tandem calibrate`)");
    }
    residuals_ = std::make_unique<ResidualVectors>(ResidualVectors::load(o.residuals));
    if (residuals_->hidden_size != c.hidden_size ||
        residuals_->vectors.size() + 1 != layers_.size() ||
        residuals_->layers != moe_layer_indices(model_)) {
      fail(ErrorKind::kFormat,
           "{}: residual vectors for hidden {} x MoE layers {} do not fit this model (hidden {}, "
           "MoE layers {})",
           o.residuals.string(), residuals_->hidden_size, fmt::join(residuals_->layers, ","),
           c.hidden_size, fmt::join(moe_layer_indices(model_), ","));
    }
  }
  prefetcher_ = Prefetcher::make(o.prefetch);
}

// The shared experts (for the whole run) and the pinned experts: the most used ones per layer
// (profile counts) or ids 0..N-1, copied on the copy stream.
void HybridMoeBackend::upload_resident(const Placement& placement, int max_pinned) {
  const HybridOptions& o = opt_;
  const int n_experts = static_cast<int>(model_.config.n_experts);
  const int n_moe = static_cast<int>(layers_.size());
  for (auto& L : layers_) {
    if (!L->shared_accel) continue;
    const LayerWeights& lw = *L->lw;
    auto* mem = static_cast<uint8_t*>(dev_->alloc(ffn_bytes(lw.sh_gate, lw.sh_up, lw.sh_down)));
    shared_mem_.push_back(mem);
    L->shared = place_ffn(lw.sh_gate, lw.sh_up, lw.sh_down, {}, mem, copy_);
  }
  std::vector<std::vector<int64_t>> counts = expert_counts();
  if (max_pinned > 0 && counts.empty() && o.gpu_experts > 0) {
    log_warn("--gpu-experts {}: no expert counts in {}: pinning experts 0..{} of each layer",
             o.gpu_experts, o.profile.empty() ? std::string("(no --profile)") : o.profile.string(),
             o.gpu_experts - 1);
  }
  for (int l = 0; l < n_moe; ++l) {
    const int pin_n = placement.experts_pinned(layers_[l]->model_layer)
                          ? n_experts
                          : std::min(o.gpu_experts, n_experts);
    std::vector<int> order(n_experts);
    for (int e = 0; e < n_experts; ++e) order[e] = e;
    if (!counts.empty()) {
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return counts[l][a] > counts[l][b]; });
    }
    for (int i = 0; i < pin_n; ++i) {
      const int e = order[i];
      cache_->pin(l, e);  // takes a free slot (Error(kResource) when none is left)
      copy_expert(l, e, cache_->slot_of(l, e), copy_);
    }
  }
}

HybridMoeBackend::~HybridMoeBackend() {
  try {
    if (p_->active) dev_->sync_event(done_);
    dev_->sync_stream(copy_);
    dev_->sync_stream(compute_);
    for (const void* p : registered_) dev_->unregister_host(p);
  } catch (...) {
  }
  for (void* m : slot_mem_)
    if (m != nullptr) dev_->free(m);
  for (void* m : shared_mem_) dev_->free(m);
  if (p_->d_buf != nullptr) dev_->free(p_->d_buf);
}

CostModel HybridMoeBackend::estimate_cost() const {
  // Nominal rates (docs/hybrid.md): the CPU streams expert weights from DRAM at ~50 GB/s and
  // computes at ~0.5 TFLOP/s; the accelerator computes a resident expert ~20x faster; a transfer
  // is latency + bytes / link.
  const ModelConfig& c = model_.config;
  const double bytes = static_cast<double>(slot_bytes_);
  const double flops_per_token =
      6.0 * c.hidden_size * static_cast<double>(layers_[0]->lw->experts.gate[0].rows());
  const double cpu_fixed = bytes / 50e9, cpu_per_token = flops_per_token / 0.5e12;
  const double transfer = opt_.link_latency_us * 1e-6 +
                          (opt_.link_gb_per_s > 0 ? bytes / (opt_.link_gb_per_s * 1e9) : 0.0);
  return CostModel::from_linear(cpu_fixed, cpu_per_token, cpu_fixed / 20, cpu_per_token / 20,
                                transfer);
}

std::vector<std::vector<int64_t>> HybridMoeBackend::expert_counts() const {
  if (opt_.profile.empty()) return {};
  const std::string text = read_input_file(opt_.profile, kMaxConfigFileBytes, "--profile");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail(ErrorKind::kFormat, "--profile {}: {}", opt_.profile.string(), e.what());
  }
  if (!j.contains("expert_counts")) return {};
  std::vector<std::vector<int64_t>> counts;
  const nlohmann::json& rows = j["expert_counts"];
  if (!rows.is_array()) {
    fail(ErrorKind::kFormat, "--profile {}: key 'expert_counts' is not a list of lists",
         opt_.profile.string());
  }
  for (size_t l = 0; l < rows.size(); ++l) {
    if (!rows[l].is_array()) {
      fail(ErrorKind::kFormat, "--profile {}: key 'expert_counts[{}]' is not a list",
           opt_.profile.string(), l);
    }
    counts.emplace_back();
    for (size_t e = 0; e < rows[l].size(); ++e) {
      if (!rows[l][e].is_number_integer()) {
        fail(ErrorKind::kFormat, "--profile {}: key 'expert_counts[{}][{}]' is not an integer",
             opt_.profile.string(), l, e);
      }
      counts.back().push_back(rows[l][e].get<int64_t>());
    }
  }
  if (counts.size() != layers_.size()) {
    fail(ErrorKind::kFormat, "--profile {}: expert_counts has {} layers, the model {} MoE layers",
         opt_.profile.string(), counts.size(), layers_.size());
  }
  for (const auto& row : counts) {
    if (static_cast<int64_t>(row.size()) != model_.config.n_experts) {
      fail(ErrorKind::kFormat, "--profile {}: expert_counts rows must have {} experts",
           opt_.profile.string(), model_.config.n_experts);
    }
  }
  return counts;
}

DeviceFfnWeights HybridMoeBackend::place_ffn(const ops::Weight& g, const ops::Weight& u,
                                             const ops::Weight& d, const ops::FfnExtras& extras,
                                             uint8_t* mem, StreamId s) {
  DeviceFfnWeights out;
  uint64_t off = 0;
  auto place = [&](const ops::Weight& w, ops::Weight* dst) {
    *dst = w;
    const uint64_t n = static_cast<uint64_t>(w.t.nbytes());
    dev_->copy_h2d(mem + off, w.t.data, n, s);
    dst->t.data = mem + off;
    dst->t.device = DeviceRef{DeviceKind::kAccel, 0};
    off += align_up(n);
    int64_t first, floats;
    scale_span(w, &first, &floats);
    if (floats > 0) {
      dev_->copy_h2d(mem + off, w.scale_inv + first * w.scale_cols, floats * 4, s);
      dst->scale_inv = reinterpret_cast<const float*>(mem + off);
      dst->row0 = w.row0 - first * w.block_rows;
      off += align_up(floats * 4);
    }
    stats_.bytes_copied += static_cast<int64_t>(n + floats * 4);
  };
  place(g, &out.gate);
  place(u, &out.up);
  place(d, &out.down);
  // gpt-oss: the expert's biases after its weights (ffn_bytes counts them), the clamp by value.
  auto place_bias = [&](const float* b, int64_t n) -> const float* {
    if (b == nullptr) return nullptr;
    const uint64_t bytes = static_cast<uint64_t>(n) * 4;
    dev_->copy_h2d(mem + off, b, bytes, s);
    const auto* at = reinterpret_cast<const float*>(mem + off);
    off += align_up(bytes);
    stats_.bytes_copied += static_cast<int64_t>(bytes);
    return at;
  };
  out.extras.gate_bias = place_bias(extras.gate_bias, g.rows());
  out.extras.up_bias = place_bias(extras.up_bias, u.rows());
  out.extras.down_bias = place_bias(extras.down_bias, d.rows());
  out.extras.limit = extras.limit;
  return out;
}

void HybridMoeBackend::register_experts() {
  // The host bytes the expert copies read (weights and FP8 scale rows of every layer that can
  // hold experts), in whole pages, touching ranges merged: a GGUF layer's experts are one run.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end)
  auto add = [&](const void* p, uint64_t bytes) {
    if (p == nullptr || bytes == 0) return;
    const auto a = reinterpret_cast<uint64_t>(p);
    ranges.emplace_back(a / page * page, (a + bytes + page - 1) / page * page);
  };
  for (const auto& L : layers_) {
    if (L->cpu_only) continue;
    const ExpertWeights& ex = L->lw->experts;
    for (size_t e = 0; e < ex.gate.size(); ++e) {
      for (const ops::Weight* w : {&ex.gate[e], &ex.up[e], &ex.down[e]}) {
        add(w->t.data, static_cast<uint64_t>(w->t.nbytes()));
        int64_t first, floats;
        scale_span(*w, &first, &floats);
        if (floats > 0)
          add(w->scale_inv + first * w->scale_cols, static_cast<uint64_t>(floats) * 4);
      }
    }
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  // Mapped files: pinning makes their cached pages unreclaimable, so only what fits in the memory
  // available now (as page_in_model decides); files copied into memory are resident anyway.
  uint64_t total = 0;
  for (const auto& [begin, end] : merged) total += end - begin;
  const bool in_memory = (model_.gguf && model_.gguf->in_memory()) ||
                         (model_.safetensors && model_.safetensors->in_memory());
  const uint64_t available = meminfo_bytes("MemAvailable");
  if (!in_memory && available > 0 && total > available / 10 * 9) {
    log_warn(
        "{}: the experts' {} of host memory are not pinned for copies ({} available): expert "
        "fetches are staged through the driver",
        dev_->name(), format_binary_bytes(total), format_binary_bytes(available));
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& [begin, end] : merged) {
    std::string why;
    const auto* p = reinterpret_cast<const void*>(begin);
    if (!dev_->register_host(p, end - begin, &why)) {
      log_warn(
          "{}: the experts' host memory could not be pinned for copies ({}): expert fetches "
          "are staged through the driver, the caller waiting for each",
          dev_->name(), why);
      return;
    }
    registered_.push_back(p);
    stats_.pinned_host_bytes += static_cast<int64_t>(end - begin);
  }
  log_info("{}: the experts' {} of host memory pinned for copies in {:.1f} s", dev_->name(),
           format_binary_bytes(total),
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

void HybridMoeBackend::copy_expert(int layer, int expert, int slot, StreamId stream) {
  // Per-layer slots are [0, slots_per_layer) of each layer; a global pool numbers all of them.
  const int n_slots = opt_.global_pool ? static_cast<int>(slot_mem_.size()) : slots_per_layer_;
  TD_CHECK(slot >= 0 && slot < n_slots, "expert cache slot {} out of range", slot);
  const size_t key = opt_.global_pool ? size_t(slot) : size_t(layer) * slots_per_layer_ + slot;
  if (slot_mem_[key] == nullptr) slot_mem_[key] = dev_->alloc(slot_bytes_);
  const auto [old_layer, old_expert] = slot_owner_[key];
  if (old_expert >= 0) layers_[old_layer]->valid[old_expert] = 0;
  Layer& L = *layers_[layer];
  const ExpertWeights& ex = L.lw->experts;
  L.dev_w[expert] = place_ffn(ex.gate[expert], ex.up[expert], ex.down[expert], ex.extras(expert),
                              static_cast<uint8_t*>(slot_mem_[key]), stream);
  L.valid[expert] = 1;
  slot_owner_[key] = {layer, expert};
}

void HybridMoeBackend::host_shared(const MoeRequest& r, float* out) {
  const LayerWeights& lw = *r.layer_weights;
  const int64_t n = r.n_tokens, h = r.hidden_size;
  std::vector<float> g, u;
  ops::swiglu_ffn(lw.sh_gate, lw.sh_up, lw.sh_down, r.hidden, n, out, nullptr, &g, &u);
  if (!lw.sh_gate_inp.empty()) {
    for (int64_t t = 0; t < n; ++t) {
      const float gate = shared_expert_gate(r.hidden + t * h, lw.sh_gate_inp.data(), h);
      for (int64_t i = 0; i < h; ++i) out[t * h + i] *= gate;
    }
  }
}

void HybridMoeBackend::submit(const MoeRequest& r) {
  TD_CHECK(!p_->active, "HybridMoeBackend::submit while a request is pending");
  TD_CHECK(r.moe_index >= 0 && r.moe_index < static_cast<int64_t>(layers_.size()),
           "MoE index {} out of range", r.moe_index);
  const int layer = static_cast<int>(r.moe_index);
  p_->r = r;
  const Assignment a = assign(r, layer);
  stage_inputs(r, layer, a);
  launch(r, layer, a);
  // 5. Prefetch the next MoE layer's predicted experts behind this layer's compute.
  if (opt_.prefetch != PrefetchKind::kNone && layer + 1 < static_cast<int>(layers_.size())) {
    prefetch_next(r, layer);
  }
}

// Steps 1 and 2 of submit(): which experts run on the device (resident, fetched now, not masked
// off), the fetches on the copy stream that the compute stream waits for; Pending::count.
Assignment HybridMoeBackend::assign(const MoeRequest& r, int layer) {
  Layer& L = *layers_[layer];
  Pending& p = *p_;
  const ModelConfig& c = model_.config;
  const int64_t n = r.n_tokens, k = r.k, ne = c.n_experts;
  // 1. Routing -> cache statistics -> assignment.
  layer_scores(c, *L.lw, r.hidden, n, &p.logits, &p.scores);
  LayerRouting lr;
  lr.layer = layer;
  lr.n_tokens = static_cast<int>(n);
  lr.k = static_cast<int>(k);
  lr.n_experts = static_cast<int>(ne);
  lr.ids = r.ids;
  lr.weights = r.weights;
  lr.scores = p.scores.data();
  cache_->on_routing(lr);
  // DALI's workload window asks for its best non-resident experts after each window.
  if (!L.cpu_only) {
    for (int e : cache_->wanted(layer)) {
      bool admitted = false;
      cache_->admit(layer, e, &admitted);
      if (!admitted) continue;
      copy_expert(layer, e, cache_->slot_of(layer, e), copy_);
      ++stats_.fetches;
    }
  }
  Assignment a = policy_->assign(lr, *cache_, *cost_);
  prefetcher_->set_layer_seconds(a.est_seconds);
  a.on_accel.resize(ne, 0);
  if (L.cpu_only) {
    std::fill(a.on_accel.begin(), a.on_accel.end(), 0);
    a.fetch.clear();
  }
  // 2. Fetch what the policy wants on the copy stream; an expert that gets no slot runs on the CPU.
  for (int e : a.fetch) {
    if (cache_->resident(layer, e) && L.valid[e]) continue;
    bool admitted = false;
    cache_->admit(layer, e, &admitted);
    if (!admitted) {
      a.on_accel[e] = 0;
      continue;
    }
    copy_expert(layer, e, cache_->slot_of(layer, e), copy_);
    ++stats_.fetches;
  }
  std::vector<int64_t>& count = p_->count;
  count.assign(ne, 0);
  for (int64_t i = 0; i < n * k; ++i) ++count[r.ids[i]];
  for (int64_t e = 0; e < ne; ++e) {
    if (a.on_accel[e] && !(cache_->resident(layer, static_cast<int>(e)) && L.valid[e])) {
      a.on_accel[e] = 0;
    }
    if (r.run_here != nullptr && r.run_here[e] == 0) a.on_accel[e] = 0;
    if (a.on_accel[e] && count[e] > 0 && L.prefetched[e]) ++stats_.prefetch_hits;
  }
  std::fill(L.prefetched.begin(), L.prefetched.end(), 0);
  dev_->record(fetched_, copy_);
  dev_->wait_event(compute_, fetched_);
  return a;
}

// Step 3: the device's inputs, shared rows (all tokens) then each accelerator expert's tokens by
// id (Pending::runs, row_of_pair, rows), staged and copied on the compute stream.
void HybridMoeBackend::stage_inputs(const MoeRequest& r, int layer, const Assignment& a) {
  Layer& L = *layers_[layer];
  Pending& p = *p_;
  const int64_t n = r.n_tokens, k = r.k, h = r.hidden_size, ne = model_.config.n_experts;
  const std::vector<int64_t>& count = p.count;
  p.shared_rows = L.shared_accel ? n : 0;
  p.row_of_pair.assign(n * k, -1);
  int64_t rows = p.shared_rows;
  for (int64_t e = 0; e < ne; ++e) {
    if (a.on_accel[e]) rows += count[e];
  }
  float* xg = p.xg.floats(rows * h);
  float* scale = p.scale.floats(p.shared_rows);  // Qwen2's shared-expert gate per token
  if (p.shared_rows > 0) {
    std::copy(r.hidden, r.hidden + n * h, xg);
    for (int64_t t = 0; t < n; ++t) {
      scale[t] = L.lw->sh_gate_inp.empty()
                     ? 1.0f
                     : shared_expert_gate(r.hidden + t * h, L.lw->sh_gate_inp.data(), h);
    }
  }
  std::vector<Pending::Run>& runs = p.runs;
  runs.clear();
  int64_t row = p.shared_rows;
  for (int64_t e = 0; e < ne; ++e) {
    if (!a.on_accel[e] || count[e] == 0) continue;
    runs.push_back({e, row, count[e]});
    for (int64_t i = 0; i < n * k; ++i) {
      if (r.ids[i] != e) continue;
      const float* src = r.hidden + (i / k) * h;
      std::copy(src, src + h, xg + row * h);
      p.row_of_pair[i] = row++;
    }
    stats_.accel_pairs += count[e];
  }
  stats_.cpu_pairs += n * k - (rows - p.shared_rows);
  const uint64_t need = static_cast<uint64_t>(rows) * (2 * h + 1) * 4;
  if (need > p.d_bytes) {
    if (p.d_buf != nullptr) dev_->free(p.d_buf);
    p.d_buf = nullptr;
    p.d_buf = static_cast<float*>(dev_->alloc(need));
    p.d_bytes = need;
  }
  float* d_x = p.d_buf;
  float* d_s = d_x + 2 * rows * h;
  if (rows > 0) dev_->copy_h2d(d_x, xg, rows * h * 4, compute_);
  if (p.shared_rows > 0) dev_->copy_h2d(d_s, scale, p.shared_rows * 4, compute_);
  p.rows = rows;
}

// Step 4: the CPU experts start when the compute stream gets here (after the copies above), the
// device experts run meanwhile, their outputs (unweighted) come back, and the stream then waits
// for the CPU before reporting done. A CPU backend that adds slot rows combines every expert of
// a token in router slot order, the device's among its own: the bits of the CPU alone.
void HybridMoeBackend::launch(const MoeRequest& r, int layer, const Assignment& a) {
  Layer& L = *layers_[layer];
  Pending& p = *p_;
  const int64_t n = r.n_tokens, k = r.k, h = r.hidden_size, ne = model_.config.n_experts;
  const int64_t rows = p.rows;
  float* dev_y = p.dev_y.floats(rows * h);  // the device's outputs, back on the host
  float* d_x = p.d_buf;
  float* d_y = d_x + rows * h;
  float* d_s = d_y + rows * h;
  p.mask.assign(ne, 1);
  for (int64_t e = 0; e < ne; ++e) {
    p.mask[e] = (a.on_accel[e] || (r.run_here != nullptr && r.run_here[e] == 0)) ? 0 : 1;
  }
  p.cpu_out.resize(n * h);
  p.cpu_req = r;
  p.cpu_req.run_here = p.mask.data();
  p.cpu_req.out = p.cpu_out.data();
  if (cpu_->adds_slot_rows()) {
    p.slot_rows.assign(n * k, nullptr);
    for (int64_t i = 0; i < n * k; ++i) {
      if (p.row_of_pair[i] >= 0) p.slot_rows[i] = dev_y + p.row_of_pair[i] * h;
    }
    p.cpu_req.slot_rows = p.slot_rows.data();
  }
  dev_->host_callback(compute_, [this] {
    cpu_since_ = Timeline::Clock::now();
    cpu_->submit(p_->cpu_req);
  });
  if (p.shared_rows > 0) {
    dev_->ffn(compute_, L.shared, d_x, n, L.lw->sh_gate_inp.empty() ? nullptr : d_s, d_y, false);
    ++stats_.shared_on_accel;
  }
  for (const Pending::Run& run : p.runs) {
    dev_->ffn(compute_, L.dev_w[run.expert], d_x + run.row0 * h, run.n, nullptr, d_y + run.row0 * h,
              false);
  }
  if (rows > 0) dev_->copy_d2h(dev_y, d_y, rows * h * 4, compute_);
  dev_->host_callback(compute_, [this] {
    cpu_->wait();
    if (Timeline* t = dev_->timeline()) {
      t->add(Timeline::kCpuExperts, cpu_since_, Timeline::Clock::now());
    }
  });
  dev_->record(done_, compute_);
  p.active = true;
  ++stats_.layers;

}

void HybridMoeBackend::prefetch_next(const MoeRequest& r, int layer) {
  const ModelConfig& c = model_.config;
  const int64_t n = r.n_tokens, h = r.hidden_size;
  Layer& next = *layers_[layer + 1];
  if (next.cpu_only) return;
  const float* x = r.hidden;
  std::vector<float> shifted;
  if (residuals_ != nullptr) {  // DALI eq. 11: this layer's input + r_l approximates the next's
    shifted.assign(r.hidden, r.hidden + n * h);
    const std::vector<float>& rv = residuals_->vectors[layer];
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < h; ++i) shifted[t * h + i] += rv[i];
    x = shifted.data();
  }
  std::vector<float> logits, scores;
  layer_scores(c, *next.lw, x, n, &logits, &scores);
  const std::vector<int> chosen =
      prefetcher_->choose(layer + 1, scores.data(), static_cast<int>(n), *cache_, *cost_);
  for (int e : chosen) {
    if (cache_->resident(layer + 1, e) && next.valid[e]) continue;
    bool admitted = false;
    cache_->admit(layer + 1, e, &admitted);
    if (!admitted) continue;
    copy_expert(layer + 1, e, cache_->slot_of(layer + 1, e), copy_);
    next.prefetched[e] = 1;
    ++stats_.prefetches;
  }
}

void HybridMoeBackend::wait() {
  TD_CHECK(p_->active, "HybridMoeBackend::wait without submit");
  Pending& p = *p_;
  p.active = false;
  const MoeRequest& r = p.r;
  const Layer& L = *layers_[r.moe_index];
  const int64_t n = r.n_tokens, h = r.hidden_size, k = r.k;
  const bool host_sh = L.has_shared && !L.shared_accel;
  if (host_sh) {  // placement put the shared experts on the CPU: compute them while we wait
    p.shared_host.resize(n * h);
    host_shared(r, p.shared_host.data());
  }
  dev_->sync_event(done_);  // rethrows errors from the stream (CPU backend included)
  // Combine per token: the CPU's sum (with the device experts when it added the slot rows, else
  // they follow in router slot order), then the shared experts in front, as the model adds them.
  const bool added = p.cpu_req.slot_rows != nullptr;
  const float* dev_y = p.dev_y.floats(0);
  for (int64_t t = 0; t < n; ++t) {
    float* dst = r.out + t * h;
    std::copy(p.cpu_out.data() + t * h, p.cpu_out.data() + (t + 1) * h, dst);
    for (int64_t j = 0; j < k && !added; ++j) {
      const int64_t row = p.row_of_pair[t * k + j];
      if (row < 0) continue;
      const float w = r.weights[t * k + j];
      const float* y = dev_y + row * h;
      for (int64_t i = 0; i < h; ++i) dst[i] += w * y[i];
    }
    const float* sh = p.shared_rows > 0 ? dev_y + t * h
                      : host_sh         ? p.shared_host.data() + t * h
                                        : nullptr;
    if (sh != nullptr) {
      for (int64_t i = 0; i < h; ++i) dst[i] = sh[i] + dst[i];
    }
  }
}

std::string HybridMoeBackend::summary() const {
  // The pinned experts by name, read back from the cache: what --gpu-experts really placed.
  std::string pinned;
  for (size_t l = 0; l < layers_.size(); ++l) {
    std::string ids;
    for (int e = 0; e < cache_->n_experts(); ++e) {
      if (cache_->pinned(static_cast<int>(l), e)) ids += fmt::format(" {}", e);
    }
    if (!ids.empty()) {
      pinned +=
          fmt::format("{}layers.{}:{}", pinned.empty() ? ": " : ", ", layers_[l]->model_layer, ids);
    }
  }
  const std::string host = stats_.pinned_host_bytes > 0
                               ? fmt::format(", experts' host memory pinned for copies: {:.1f} MiB",
                                             stats_.pinned_host_bytes / 1048576.0)
                               : std::string();
  return fmt::format(
      "{} slots/layer of {:.2f} MiB ({} pinned{}), policy {}, cache {}, prefetch "
      "{}, cost model {}{}",
      slots_per_layer_, slot_bytes_ / 1048576.0, opt_.gpu_experts, pinned,
      choice_name(opt_.policy), choice_name(opt_.cache), choice_name(opt_.prefetch), cost_source_,
      host);
}

}  // namespace tandem::rt
