#include "runtime/moe_runtime.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/thread_pool.h"
#include "core/topology.h"
#include "moe/cpu_experts.h"
#include "moe/fused_moe.h"
#include "runtime/deferral.h"
#include "runtime/dense_weights.h"
#include "runtime/device.h"
#include "runtime/hybrid_moe.h"
#include "runtime/placement.h"
#include "runtime/timeline.h"
#ifdef TANDEM_HAVE_CUDA
#include "ops/cuda/cuda_info.h"
#endif

namespace tandem {

struct MoeRuntime::Impl {
  std::shared_ptr<const CpuExperts> experts;  // repacked experts (null: native views)
  std::unique_ptr<MoeBackend> cpu;            // the CPU MoE backend
  bool graphs = true;                         // --no-graphs: false
  std::unique_ptr<MoeBackend> cpu_deferred;   // a second instance for Expert Deferral
  std::unique_ptr<rt::Timeline> timeline;     // (outlives the device's work)
  std::unique_ptr<rt::Device> device;
  std::shared_ptr<const rt::DenseWeights> dense;  // the dense part on the device (or null)
  std::unique_ptr<rt::HybridMoeBackend> hybrid;
  std::unique_ptr<rt::DeferringMoeBackend> deferring;
  rt::Placement placement;
};

namespace {

// The CPU side: experts as the kernels read them and the backend that runs them (with the shared
// experts in its task queue when `shared_experts`: the CPU-only primary backend).
std::unique_ptr<MoeBackend> make_cpu_backend(const LoadedModel& model, const BackendOptions& o,
                                             ThreadingContext& threading, bool shared_experts,
                                             std::string* summary,
                                             std::shared_ptr<const CpuExperts>* experts) {
  FusedMoeOptions fo;
  fo.shared_experts = shared_experts;
  // NUMA parts: one per pool node that has workers (0), or as asked, wrapping around them.
  std::vector<int> nodes;
  for (int n = 0; n < threading.pool().node_count(); ++n) {
    if (threading.pool().workers_on_node(n) > 0) nodes.push_back(n);
  }
  if (nodes.empty()) nodes.push_back(-1);  // no workers: the caller runs everything
  const int parts = o.numa_parts == 0 ? static_cast<int>(nodes.size()) : o.numa_parts;
  std::vector<int> part_node, part_os_node;
  for (int p = 0; p < parts; ++p) {
    const int n = nodes[static_cast<size_t>(p) % nodes.size()];
    part_node.push_back(n);
    const auto& topo = threading.topology().nodes;
    part_os_node.push_back(nodes.size() > 1 && static_cast<size_t>(n) < topo.size()
                               ? topo[static_cast<size_t>(n)].os_index
                               : -1);
  }
  const std::string auto_why =
      o.cpu_experts_why.empty() ? std::string() : "auto: " + o.cpu_experts_why + "; ";
  if (o.cpu_experts == "native" && parts == 1) {
    *summary = fmt::format("CPU experts: native ({}fused MoE backend)", auto_why);
    return std::make_unique<FusedMoeBackend>(&threading.pool(), fo);
  }
  // Prepared once (repacked or mapped from the on-disk cache; native: views) and shared by every
  // CPU backend instance.
  if (*experts == nullptr) {
    CpuExpertOptions co;
    co.format = o.cpu_experts;
    co.group = o.expert_group;
    co.cache_dir = o.expert_cache_dir;
    co.use_cache = o.expert_cache;
    co.cache_load = o.mmap ? LoadMode::kMap : LoadMode::kCopy;
    CpuExperts ce = prepare_cpu_experts(model, co, &threading.pool());
    // repack copied every matrix decode reads: the file's pages need not stay resident.
    if (ce.format == "repack") release_model_pages(model);
    if (parts > 1) split_cpu_experts(&ce, part_node, part_os_node, &threading.pool());
    *experts = std::make_shared<const CpuExperts>(std::move(ce));
  }
  const CpuExperts& ce = **experts;
  const std::string numa = parts > 1 ? fmt::format(", {} NUMA parts", parts) : std::string();
  if (ce.format == "native") {
    *summary = fmt::format("CPU experts: native ({}fused MoE backend{})", auto_why, numa);
  } else if (ce.format == "repack") {
    *summary = fmt::format(
        "CPU experts: repack ({}Q4_K / Q6_K in x16 tiles, Q5_0 / Q8_0 in x4 "
        "rows, the rest as stored; {:.2f} GiB in memory; fused MoE backend{})",
        auto_why, ce.bytes / 1073741824.0, numa);
  } else {
    *summary = fmt::format("CPU experts: {}{} ({:.2f} GiB, {}; fused MoE backend{})", ce.format,
                           ce.format == "bf16" ? "" : fmt::format(" group {}", o.expert_group),
                           ce.bytes / 1073741824.0,
                           ce.from_cache      ? "mapped from " + ce.cache_path.string()
                           : ce.cache_written ? "packed, cached in " + ce.cache_path.string()
                                              : std::string("packed in memory"),
                           numa);
  }
  return std::make_unique<FusedMoeBackend>(&threading.pool(), fo, &ce);
}

}  // namespace

namespace {

template <size_t N>
void check_choice(const char* flag, const std::string& value, const char* const (&choices)[N]) {
  std::string all;
  for (const char* c : choices) {
    if (value == c) return;
    all += (all.empty() ? "" : " | ") + std::string(c);
  }
  fail(ErrorKind::kInvalidArgument, "{} '{}' is not one of: {}", flag, value, all);
}

// Flag values that need no model: checked before anything expensive is built.
void check_backend_options(const BackendOptions& o) {
  static const char* const kCpuExperts[] = {"auto", "native", "repack", "int8", "int4", "bf16"};
  check_choice("--cpu-experts", o.cpu_experts, kCpuExperts);
  if (o.defer < 0) fail(ErrorKind::kInvalidArgument, "--defer must be >= 0, got {}", o.defer);
  if (o.gpu_experts < 0) {
    fail(ErrorKind::kInvalidArgument, "--gpu-experts must be >= 0, got {}", o.gpu_experts);
  }
  if (o.numa_parts < 0 || o.numa_parts > 16) {
    fail(ErrorKind::kInvalidArgument, "--numa-parts must be 0 (one per NUMA node) to 16, got {}",
         o.numa_parts);
  }
  if (o.cache_slots < -1) {
    fail(ErrorKind::kInvalidArgument, "--cache-slots must be >= 0 (or -1: from the budget), got {}",
         o.cache_slots);
  }
  if (!o.vram_budget.empty()) rt::parse_bytes("--vram-budget", o.vram_budget);
  try {
    rt::parse_link(o.link);
  } catch (const Error& e) {
    fail(e.kind(), "--{}", e.what());  // "--link '...': ..."
  }
  if (!o.rules.empty()) rt::load_placement_rules(o.rules);  // a bad file fails before the load
}

// Flag values checked against the loaded model.
void check_backend_options(const BackendOptions& o, rt::Accel accel, const LoadedModel& model) {
  const int64_t experts = model.config.n_experts;
  if (o.gpu_experts > experts) {
    fail(ErrorKind::kInvalidArgument,
         "--gpu-experts {}: the model has {} routed experts per MoE layer", o.gpu_experts, experts);
  }
  const bool any_moe =
      std::any_of(model.layers.begin(), model.layers.end(), [](const auto& l) { return l.moe; });
  if (accel != rt::Accel::kNone && !any_moe) {
    fail(ErrorKind::kUnsupported,
         "--accel {}: {} has no MoE layer (all {} layers are dense): the accelerator holds "
         "experts, there are none; run without --accel",
         rt::choice_name(accel), model.path.string(), model.layers.size());
  }
}

// An F32 KV cache of the model's context (4096 positions at most), with the latent cache for MLA:
// what the device keeps free for it when it runs the dense part.
uint64_t default_kv_bytes(const ModelConfig& c) {
  const int64_t positions =
      c.max_position_embeddings > 0 ? std::min<int64_t>(c.max_position_embeddings, 4096) : 4096;
  const int64_t per_layer =
      c.is_mla() ? c.kv_lora_rank + c.qk_rope_head_dim : 2 * c.num_kv_heads * c.head_dim;
  // (Hybrid models: the attention layers' keys and values, and 8 recurrent states.)
  const uint64_t states =
      8 * static_cast<uint64_t>(c.num_linear_layers() * c.linear_state_floats()) * 4;
  return static_cast<uint64_t>(positions * per_layer * c.num_attention_layers()) * 4 + states;
}

// --accel auto|none|host|cuda -> none|host|cuda. cuda needs a build with CUDA and a GPU here;
// auto stays CPU-only until the CUDA device has run its tests on a GPU (docs/device.md).
rt::Accel resolve_accel(rt::Accel accel) {
  if (accel == rt::Accel::kCuda) {
#ifdef TANDEM_HAVE_CUDA
    std::string why;
    if (cuda_devices(&why).empty()) {
      fail(ErrorKind::kUnsupported,
           "--accel cuda: no CUDA device here ({}); --accel host "
           "emulates an accelerator",
           why);
    }
#else
    fail(ErrorKind::kUnsupported,
         "--accel cuda: this build has no CUDA (nvcc was not found when "
         "it was configured); --accel host emulates an accelerator");
#endif
    return accel;
  }
  if (accel != rt::Accel::kAuto) return accel;
#ifdef TANDEM_HAVE_CUDA
  std::string why;
  const auto gpus = cuda_devices(&why);
  if (!gpus.empty()) {
    log_info(
        "--accel auto: CUDA device {} found; running CPU-only (--accel cuda runs the routed "
        "experts the policy gives it there, --accel host emulates an accelerator)",
        gpus[0].name);
  }
#endif
  return rt::Accel::kNone;
}

}  // namespace

std::string resolve_cpu_experts(const BackendOptions& o, const CpuExpertsFacts& f,
                                std::string* why) {
  if (o.cpu_experts != "auto") return o.cpu_experts;
  auto pick = [&](const char* format, std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return std::string(format);
  };
  if (!f.gguf) return pick("native", "not a GGUF file, nothing to rearrange");
  if (o.mmap) return pick("native", "--mmap keeps the weights in the page cache");
  if (f.isa < Isa::kAvx512Vnni) {
    return pick("native",
                fmt::format("{} CPU, no AVX-512 VNNI for the repacked kernels", isa_name(f.isa)));
  }
  if (f.thp_never) return pick("native", "transparent huge pages are off");
  const double gib = 1073741824.0;
  if (f.available_bytes > 0 && f.model_bytes > f.available_bytes / 10 * 9) {
    return pick("native", fmt::format("the {:.1f} GiB model does not fit in the {:.1f} GiB "
                                      "available",
                                      f.model_bytes / gib, f.available_bytes / gib));
  }
  return pick("repack", fmt::format("GGUF on an AVX-512 VNNI CPU, {:.1f} GiB of {:.1f} GiB "
                                    "available",
                                    f.model_bytes / gib, f.available_bytes / gib));
}

CpuExpertsFacts cpu_experts_facts(const std::filesystem::path& model) {
  CpuExpertsFacts f;
  std::error_code ec;
  f.gguf = !std::filesystem::is_directory(model, ec) && model.extension() == ".gguf";
  f.model_bytes = model_file_bytes(model);
  f.available_bytes = meminfo_bytes("MemAvailable");
  f.isa = best_isa();
  f.thp_never = thp_mode() == ThpMode::kNever;
  return f;
}

BackendOptions resolve_backend_options(const BackendOptions& o,
                                       const std::filesystem::path& model) {
  BackendOptions r = o;
  if (o.cpu_experts == "auto") {
    r.cpu_experts = resolve_cpu_experts(o, cpu_experts_facts(model), &r.cpu_experts_why);
    log_info("--cpu-experts auto: {} ({})", r.cpu_experts, r.cpu_experts_why);
  }
  check_backend_options(r);  // bad flags fail here, before the model loads
  return r;
}

MoeRuntime::MoeRuntime(const LoadedModel& model, const BackendOptions& options,
                       ThreadingContext& threading)
    : impl_(std::make_unique<Impl>()) {
  // Callers that did not resolve auto before loading (tests, library users): decided here; the
  // flags are checked either way.
  const BackendOptions o = resolve_backend_options(options, model.path);
  const rt::Accel accel = resolve_accel(o.accel);
  check_backend_options(o, accel, model);
  impl_->graphs = o.graphs;
  std::vector<rt::PlacementRule> rules;
  if (!o.rules.empty()) rules = rt::load_placement_rules(o.rules);
  impl_->placement =
      rt::resolve_placement(model, rules, accel != rt::Accel::kNone, o.cpu_experts);
  impl_->cpu = make_cpu_backend(model, o, threading, accel == rt::Accel::kNone, &summary_,
                                &impl_->experts);
  backend_ = impl_->cpu.get();
  if (accel != rt::Accel::kNone) {
    make_accelerator(model, o, accel);
  } else {
    summary_ += "; accelerator: none";
  }
  if (o.defer > 0) {
    std::string unused;
    impl_->cpu_deferred = make_cpu_backend(model, o, threading, false, &unused, &impl_->experts);
    impl_->deferring =
        std::make_unique<rt::DeferringMoeBackend>(backend_, impl_->cpu_deferred.get(), o.defer);
    backend_ = impl_->deferring.get();
    const int k = static_cast<int>(model.config.n_experts_per_tok);
    summary_ += fmt::format("; Expert Deferral: {} of {} experts per token (decode)",
                            std::min(o.defer, std::max(k - 1, 0)), k);
  }
  if (o.show_placement) {
    std::fprintf(stderr, "%s\n", impl_->placement.format().c_str());
  } else {
    log_info("{}", impl_->placement.format());
  }
}

MoeRuntime::~MoeRuntime() = default;

void MoeRuntime::make_accelerator(const LoadedModel& model, const BackendOptions& o,
                                  rt::Accel accel) {
  rt::HostDeviceOptions ho;
  ho.link = rt::parse_link(o.link);
  if (accel == rt::Accel::kHost) {
    ho.memory_bytes = o.vram_budget.empty() ? (uint64_t{4} << 30)
                                            : rt::parse_bytes("--vram-budget", o.vram_budget);
    impl_->device = rt::make_host_device(ho);
  } else {
    rt::CudaDeviceOptions co;
    co.memory_bytes = o.vram_budget.empty() ? 0 : rt::parse_bytes("--vram-budget", o.vram_budget);
    impl_->device = rt::make_cuda_device(co);
    ho.memory_bytes = impl_->device->memory_capacity();
  }
  impl_->timeline = std::make_unique<rt::Timeline>();
  impl_->device->set_timeline(impl_->timeline.get());
  // --gpu-experts 0 --cache-slots 0 with the dense part and the shared experts on the device:
  // no expert ever runs there, so no hybrid backend either (KTransformers' default): the CPU
  // operator computes every routed expert and the model runs its MoE layers in the device's
  // stream order (Model::ordered_moe), the host never waiting inside a forward.
  bool shared_on_device = true, experts_pinned = false;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    if (!model.layers[l].moe) continue;
    const auto layer = static_cast<int64_t>(l);
    shared_on_device = shared_on_device && (model.layers[l].sh_gate.empty() ||
                                            impl_->placement.shared_on_accel(layer));
    experts_pinned = experts_pinned || impl_->placement.experts_pinned(layer);
  }
  if (impl_->placement.dense_device() != rt::Where::kAccel || o.gpu_experts != 0 ||
      o.cache_slots != 0 || !shared_on_device || experts_pinned) {
    make_hybrid(model, o, ho);
    return;
  }
  impl_->dense = rt::upload_dense_weights(*impl_->device, model, true);
  summary_ += fmt::format(
      "; accelerator: {} ({:.0f} MiB, link {}): the dense part and the shared experts "
      "({:.1f} MiB), every routed expert on the CPU operator (--gpu-experts 0 --cache-slots "
      "0), decode steps {}",
      impl_->device->name(), ho.memory_bytes / 1048576.0, o.link, impl_->dense->bytes / 1048576.0,
      o.graphs ? "replayed as graphs" : "op by op (--no-graphs)");
}

void MoeRuntime::make_hybrid(const LoadedModel& model, const BackendOptions& o,
                             const rt::HostDeviceOptions& ho) {
  rt::HybridOptions h;
  if (impl_->placement.dense_device() == rt::Where::kAccel) {
    // The dense part first: the expert cache sizes itself from what is left, keeping room for
    // the KV cache of a default context and the activations.
    impl_->dense = rt::upload_dense_weights(*impl_->device, model, false);
    const uint64_t left = impl_->device->memory_capacity() - impl_->device->memory_used();
    h.reserve_bytes =
        default_kv_bytes(model.config) + std::min<uint64_t>(left / 4, uint64_t{64} << 20);
  }
  h.policy = o.policy;
  h.cache = o.cache;
  h.prefetch = o.prefetch;
  h.gpu_experts = o.gpu_experts;
  h.cache_slots = o.cache_slots;
  h.global_pool = o.cache_global;
  h.pin_experts = o.cpu_experts == "native";
  h.profile = o.profile;
  h.residuals = o.residuals;
  h.link_gb_per_s = ho.link.gb_per_s;
  h.link_latency_us = ho.link.latency_us;
  impl_->hybrid = std::make_unique<rt::HybridMoeBackend>(model, impl_->cpu.get(),
                                                         impl_->device.get(), impl_->placement, h);
  backend_ = impl_->hybrid.get();
  summary_ += fmt::format("; accelerator: {} ({:.0f} MiB, link {}): {}", impl_->device->name(),
                          ho.memory_bytes / 1048576.0, o.link, impl_->hybrid->summary());
  summary_ += impl_->dense ? fmt::format("; dense part on the accelerator ({:.1f} MiB)",
                                         impl_->dense->bytes / 1048576.0)
                           : std::string("; dense part on the cpu");
}

const kern::WeightViews* MoeRuntime::weight_views() const {
  const CpuExperts* e = impl_->experts.get();
  return e != nullptr && !e->other.empty() ? &e->other : nullptr;
}

ForwardOpsFactory MoeRuntime::forward_ops() const {
  if (!impl_->dense) return {};
  rt::Device* dev = impl_->device.get();
  std::shared_ptr<const rt::DenseWeights> w = impl_->dense;
  return
      [dev, w](const LoadedModel&, const ForwardOpsOptions& o) { return dev->forward_ops(w, o); };
}

void MoeRuntime::apply(ModelOptions* options) {
  options->moe = backend_;
  options->forward.views = weight_views();
  options->ops = forward_ops();
  options->graphs = impl_->graphs;
}

rt::Timeline* MoeRuntime::timeline() const {
  return impl_->timeline.get();
}

const rt::HybridStats* MoeRuntime::hybrid_stats() const {
  return impl_->hybrid ? &impl_->hybrid->stats() : nullptr;
}

}  // namespace tandem
