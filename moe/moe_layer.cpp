#include "moe/moe_layer.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "model/weights.h"
#include "moe/cpu_experts.h"
#include "moe/fused_moe.h"

namespace tandem {

// The threads behind a set of layers and the driver thread that runs their submitted work in
// order (started at the first submit).
class MoeContext {
 public:
  MoeContext(int threads, int numa_parts, int spin_us)
      : threading_(threading_options(threads, spin_us)) {
    if (numa_parts < 1) {
      fail(ErrorKind::kInvalidArgument, "numa parts {}: expected 1 or more", numa_parts);
    }
    std::vector<int> nodes;
    ThreadPool& pool = threading_.pool();
    for (int n = 0; n < pool.node_count(); ++n) {
      if (pool.workers_on_node(n) > 0) nodes.push_back(n);
    }
    if (numa_parts > 1 && static_cast<int>(nodes.size()) < numa_parts) {
      log_info("{} NUMA parts asked for, {} node(s) with workers here: parts share nodes (a "
               "software split, the same sums)",
               numa_parts, nodes.size());
    }
    for (int p = 0; numa_parts > 1 && p < numa_parts; ++p) {
      const int n = nodes[static_cast<size_t>(p) % nodes.size()];
      part_node_.push_back(n);
      part_os_node_.push_back(threading_.topology().nodes[static_cast<size_t>(n)].os_index);
    }
    numa_parts_ = numa_parts;
  }
  ~MoeContext() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (driver_.joinable()) driver_.join();
  }

  ThreadPool& pool() { return threading_.pool(); }
  int threads() const { return threading_.n_threads(); }
  int numa_parts() const { return numa_parts_; }
  const std::vector<int>& part_node() const { return part_node_; }
  const std::vector<int>& part_os_node() const { return part_os_node_; }

  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(fn));
      if (!driver_.joinable()) driver_ = std::thread([this] { drive(); });
    }
    cv_.notify_one();
  }

 private:
  static ThreadingOptions threading_options(int threads, int spin_us) {
    if (threads < 0) fail(ErrorKind::kInvalidArgument, "threads {}: expected 0 or more", threads);
    if (spin_us < 0 || spin_us > 1000000) {
      fail(ErrorKind::kInvalidArgument, "spin_us {}: expected 0 .. 1000000", spin_us);
    }
    ThreadingOptions o;
    o.n_threads = threads;
    o.spin_us = spin_us;
    return o;
  }
  void drive() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // (stop with nothing left)
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      fn();  // (catches its own errors: MoeLayer::submit)
      lock.lock();
    }
  }

  ThreadingContext threading_;
  int numa_parts_ = 1;
  std::vector<int> part_node_, part_os_node_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread driver_;
};

std::shared_ptr<MoeContext> make_moe_context(int threads, int numa_parts, int spin_us) {
  return std::make_shared<MoeContext>(threads, numa_parts, spin_us);
}
int moe_context_threads(const MoeContext& context) { return context.threads(); }
int moe_context_numa_parts(const MoeContext& context) { return context.numa_parts(); }

struct MoeLayer::Impl {
  std::shared_ptr<MoeContext> context;
  MoeLayerOptions options;
  std::shared_ptr<LoadedModel> model;  // the model-path constructor: the views' file
  ExpertWeights loaded;                // [logical expert]: views on the stored weights
  LayerExperts prepared;               // [logical expert]: as the kernels read them
  ExpertWeights slots;                 // [slot]: loaded, in slot order (remap)
  CpuExperts experts;                  // layer 0 = the slots' kernel matrices
  std::unique_ptr<FusedMoeBackend> backend;
  // [slot]: 1 = computed here (MoeRequest::run_here), the complement of gpu_experts_mask
  std::vector<uint8_t> mask;

  std::mutex mu;
  std::condition_variable cv;
  // begin() .. end(): the call's arguments; started: its one chunk runs into `scratch`
  struct Begun {
    const float* hidden = nullptr;
    int64_t tokens = 0;
    const int32_t* ids = nullptr;
    const float* weights = nullptr;
    int64_t k = 0;
    bool started = false;
  };
  std::optional<Begun> begun;
  std::vector<float> scratch;

  bool submitted = false;  // submit() without its sync() yet
  // Submits posted to the driver and finished (in order: the driver runs them one by one), and
  // the ticket of the one sync() waits for (a deferred submit may follow it).
  uint64_t posted = 0, finished = 0, main_ticket = 0;
  std::exception_ptr error;
  // A call in progress (forward; begin .. end; submit .. sync; remap; the mask): a second one
  // from another thread is refused, not interleaved with it (the scratch, the backend's
  // buffers and the slots are the layer's, one call's at a time).
  std::atomic<bool> busy{false};
  void claim(const char* call);
  bool in_flight_locked() {
    std::lock_guard<std::mutex> lock(mu);
    return submitted;
  }
  void release() { busy.store(false, std::memory_order_release); }

  // Waits for a deferred submit still running (every call but a deferred submit does, so the
  // layer's buffers are one call's at a time); rethrows its error.
  void wait_posted();
  void build(ThreadPool* pool);
  void set_slots(const std::vector<int64_t>& map);
  void check_call(const int32_t* ids, int64_t tokens, int64_t k, const float* hidden,
                  const float* weights, const float* out, bool check_out = true) const;
  // gpu_mask: this call's experts computed here, in `mask`'s sense (nullptr: `mask`);
  // accumulate: out += result.
  void run(const float* hidden, int64_t tokens, const int32_t* ids, const float* weights,
           int64_t k, float* out, const uint8_t* gpu_mask = nullptr, bool accumulate = false);
  void propagate_non_finite(const float* hidden, int64_t tokens, const int32_t* ids, int64_t k,
                            float* out) const;
  MoeRequest request(const float* hidden, int64_t n, const int32_t* ids, const float* weights,
                     int64_t k, float* out, const uint8_t* run_here = nullptr) const;
};

void MoeLayer::Impl::wait_posted() {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return finished == posted; });
  if (error) {
    busy.store(false, std::memory_order_release);
    std::rethrow_exception(std::exchange(error, nullptr));
  }
}

void MoeLayer::Impl::claim(const char* call) {
  if (!busy.exchange(true, std::memory_order_acq_rel)) {
    wait_posted();
    return;
  }
  if (in_flight_locked()) {
    fail(ErrorKind::kInvalidArgument, "{}: this layer has a submit in flight (sync_forward first)",
         call);
  }
  fail(ErrorKind::kInvalidArgument,
       "{}: this layer is running a call from another thread; a layer takes one call at a time "
       "(give each thread its own layer, or serialize the calls)",
       call);
}

namespace {

bool is_gguf_block(DType t) {
  return dtype_info(t).block_elems > 1 && t != DType::kQ8_1 && t != DType::kQ8_K;
}

// The method's expert format (CpuExpertOptions::format) and whether `dtype` can feed it.
std::string format_of_method(const std::string& method, DType dtype, const char* what) {
  if (method == "int8" || method == "int4" || method == "bf16") {
    if (dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16 ||
        dtype == DType::kF8E4M3 || is_gguf_block(dtype)) {
      return method;
    }
    fail(ErrorKind::kUnsupported, "{}: dtype {} cannot be requantized to {} (expected f32, f16, "
         "bf16, fp8 with scales or a GGUF block type)", what, dtype_name(dtype), method);
  }
  if (method == "fp8") {
    if (dtype == DType::kF8E4M3) return "native";
    fail(ErrorKind::kUnsupported, "{}: method fp8 reads FP8 E4M3 weights with block scales, got "
         "{} (use int8, int4 or bf16 to requantize)", what, dtype_name(dtype));
  }
  if (method == "gguf") {
    if (is_gguf_block(dtype)) return "repack";
    fail(ErrorKind::kUnsupported, "{}: method gguf reads GGUF block types (q4_K, q8_0, ...), got "
         "{}", what, dtype_name(dtype));
  }
  fail(ErrorKind::kInvalidArgument, "method '{}': expected int4, int8, bf16, fp8 or gguf", method);
}

// Views on one weight family's experts.
std::vector<ops::Weight> views_of(const ExpertTensor& t, const char* what) {
  const bool each = !t.each.empty();
  if (each && static_cast<int64_t>(t.each.size()) != t.experts) {
    fail(ErrorKind::kInvalidArgument, "{}: {} per-expert tensors, expected {}", what,
         t.each.size(), t.experts);
  }
  for (const void* p : t.each) {
    if (p == nullptr) fail(ErrorKind::kInvalidArgument, "{}: an expert without data", what);
  }
  if (!each && t.data == nullptr) fail(ErrorKind::kInvalidArgument, "{}: no data", what);
  const int64_t block = dtype_info(t.dtype).block_elems;
  if (t.cols % block != 0) {
    fail(ErrorKind::kInvalidArgument, "{}: {} columns are not a multiple of {}'s {}-value blocks",
         what, t.cols, dtype_name(t.dtype), block);
  }
  const bool fp8 = t.dtype == DType::kF8E4M3;
  const bool each_scales = !t.each_scales.empty();
  if (fp8 && ((each_scales ? static_cast<int64_t>(t.each_scales.size()) != t.experts
                           : t.scales == nullptr) ||
              t.block_rows <= 0 || t.block_cols <= 0)) {
    fail(ErrorKind::kInvalidArgument, "{}: FP8 weights need their block scales (one set per "
         "expert)", what);
  }
  const int64_t sr = fp8 ? (t.rows + t.block_rows - 1) / t.block_rows : 0;
  const int64_t sc = fp8 ? (t.cols + t.block_cols - 1) / t.block_cols : 0;
  const int64_t row_bytes = dtype_bytes(t.dtype, t.cols);
  std::vector<ops::Weight> out;
  for (int64_t e = 0; e < t.experts; ++e) {
    auto* base = each ? static_cast<uint8_t*>(const_cast<void*>(t.each[static_cast<size_t>(e)]))
                      : static_cast<uint8_t*>(const_cast<void*>(t.data)) + e * t.rows * row_bytes;
    ops::Weight w(Tensor::dense(t.dtype, {t.rows, t.cols}, base));
    if (fp8) {
      w.scale_inv = each_scales ? t.each_scales[static_cast<size_t>(e)] : t.scales + e * sr * sc;
      w.scale_cols = sc;
      w.block_rows = t.block_rows;
      w.block_cols = t.block_cols;
    }
    out.push_back(w);
  }
  return out;
}

void check_shape(const ExpertTensor& t, const char* what, int64_t experts, int64_t rows,
                 int64_t cols) {
  if (t.experts != experts || t.rows != rows || t.cols != cols) {
    fail(ErrorKind::kInvalidArgument, "{}: shape [{}, {}, {}], expected [{}, {}, {}] "
         "(num_experts, {})", what, t.experts, t.rows, t.cols, experts, rows, cols,
         std::string(what) == "down" ? "hidden_size, moe_intermediate_size"
                                     : "moe_intermediate_size, hidden_size");
  }
}

void check_sizes(const MoeLayerOptions& o) {
  auto positive = [](int64_t v, const char* name) {
    if (v <= 0 || v > (int64_t{1} << 24)) {
      fail(ErrorKind::kInvalidArgument, "{} {}: expected 1 .. 16777216", name, v);
    }
  };
  positive(o.num_experts, "num_experts");
  positive(o.num_experts_per_tok, "num_experts_per_tok");
  positive(o.hidden_size, "hidden_size");
  positive(o.intermediate_size, "moe_intermediate_size");
  if (o.num_experts_per_tok > o.num_experts) {
    fail(ErrorKind::kInvalidArgument, "num_experts_per_tok {} > num_experts {}",
         o.num_experts_per_tok, o.num_experts);
  }
  if (o.group != 0 && o.group != 32 && o.group != 64 && o.group != 128) {
    fail(ErrorKind::kInvalidArgument, "group {}: expected 32, 64 or 128 (0: the largest that "
         "divides the sizes)", o.group);
  }
  if (o.max_chunk_tokens < 0) {
    fail(ErrorKind::kInvalidArgument, "chunked_prefill_size {}: expected 0 or more",
         o.max_chunk_tokens);
  }
}

}  // namespace

void MoeLayer::Impl::build(ThreadPool* pool) {
  if (!options.gpu_experts_mask.empty() &&
      options.gpu_experts_mask.size() != static_cast<size_t>(options.num_experts)) {
    fail(ErrorKind::kInvalidArgument, "gpu_experts_mask: {} entries, expected num_experts {}",
         options.gpu_experts_mask.size(), options.num_experts);
  }
  const std::string format = format_of_method(options.method, loaded.gate.front().t.dtype, "gate");
  for (const auto* family : {&loaded.up, &loaded.down}) {
    const char* what = family == &loaded.up ? "up" : "down";
    if (format_of_method(options.method, family->front().t.dtype, what) != format) {
      fail(ErrorKind::kUnsupported, "{}: dtype {} differs from gate's {}", what,
           dtype_name(family->front().t.dtype), dtype_name(loaded.gate.front().t.dtype));
    }
  }
  if (options.group == 0) {  // the largest group that divides both sizes (32: the error names it)
    options.group = 32;
    for (int g : {128, 64}) {
      if (options.hidden_size % g == 0 && options.intermediate_size % g == 0) {
        options.group = g;
        break;
      }
    }
  }
  prepared = prepare_layer_experts(loaded, format, options.group, pool);
  std::vector<int64_t> identity(loaded.gate.size());
  for (size_t i = 0; i < identity.size(); ++i) identity[i] = static_cast<int64_t>(i);
  set_slots(identity);
  mask.assign(static_cast<size_t>(options.num_experts), 1);
  for (size_t i = 0; i < options.gpu_experts_mask.size(); ++i) {
    mask[i] = options.gpu_experts_mask[i] != 0 ? 0 : 1;
  }
  backend = std::make_unique<FusedMoeBackend>(pool, FusedMoeOptions{}, &experts);
}

void MoeLayer::Impl::set_slots(const std::vector<int64_t>& map) {
  const auto n = static_cast<int64_t>(loaded.gate.size());
  for (size_t p = 0; p < map.size(); ++p) {
    if (map[p] < 0 || map[p] >= n) {
      fail(ErrorKind::kInvalidArgument, "physical_to_logical_map[{}] = {}: expected 0 .. {}", p,
           map[p], n - 1);
    }
  }
  slots = ExpertWeights{};
  experts = CpuExperts{};
  experts.format = prepared.gate.empty() ? "" : kern::wformat_name(prepared.gate[0].format);
  experts.gate.resize(1);
  experts.up.resize(1);
  experts.down.resize(1);
  // (gpt-oss's experts bring their biases and clamped SwiGLU: each slot its expert's)
  slots.swiglu_limit = loaded.swiglu_limit;
  const auto copy_bias = [&](const std::vector<float>& from, std::vector<float>* to, size_t l,
                             int64_t width) {
    if (from.empty()) return;
    const auto w = static_cast<size_t>(width);
    to->insert(to->end(), from.begin() + l * w, from.begin() + (l + 1) * w);
  };
  for (int64_t logical : map) {
    const auto l = static_cast<size_t>(logical);
    slots.gate.push_back(loaded.gate[l]);
    slots.up.push_back(loaded.up[l]);
    slots.down.push_back(loaded.down[l]);
    copy_bias(loaded.gate_bias, &slots.gate_bias, l, loaded.gate[l].rows());
    copy_bias(loaded.up_bias, &slots.up_bias, l, loaded.up[l].rows());
    copy_bias(loaded.down_bias, &slots.down_bias, l, loaded.down[l].rows());
    experts.gate[0].push_back(prepared.gate[l]);
    experts.up[0].push_back(prepared.up[l]);
    experts.down[0].push_back(prepared.down[l]);
  }
  if (context->numa_parts() > 1) {
    split_cpu_experts(&experts, context->part_node(), context->part_os_node(), &context->pool());
  }
}

void MoeLayer::Impl::check_call(const int32_t* ids, int64_t tokens, int64_t k,
                                const float* hidden, const float* weights, const float* out,
                                bool check_out) const {
  if (tokens < 0 || tokens > (int64_t{1} << 24)) {
    fail(ErrorKind::kInvalidArgument, "hidden_states: {} tokens: expected 0 .. 16777216", tokens);
  }
  if (k != options.num_experts_per_tok) {
    fail(ErrorKind::kInvalidArgument, "topk_ids: {} experts per token, expected "
         "num_experts_per_tok {}", k, options.num_experts_per_tok);
  }
  if (tokens > 0 && (hidden == nullptr || ids == nullptr || weights == nullptr)) {
    fail(ErrorKind::kInvalidArgument, "forward: a null hidden_states, topk_ids or topk_weights "
         "pointer");
  }
  if (tokens > 0 && check_out && out == nullptr) {
    fail(ErrorKind::kInvalidArgument, "forward: a null output pointer");
  }
  const auto slots_n = static_cast<int32_t>(slots.gate.size());
  for (int64_t i = 0; i < tokens * k; ++i) {
    if (ids[i] < -1 || ids[i] >= slots_n) {
      fail(ErrorKind::kInvalidArgument, "topk_ids[{}][{}] = {}: expected -1 (none) or 0 .. {}",
           i / k, i % k, ids[i], slots_n - 1);
    }
  }
}

MoeRequest MoeLayer::Impl::request(const float* hidden, int64_t n, const int32_t* ids,
                                   const float* weights, int64_t k, float* out,
                                   const uint8_t* run_here) const {
  MoeRequest r;
  r.layer = 0;
  r.moe_index = 0;
  r.n_moe_layers = 1;
  r.single_token = n == 1;
  r.experts = &slots;
  r.hidden = hidden;
  r.n_tokens = n;
  r.hidden_size = options.hidden_size;
  r.ids = ids;
  r.weights = weights;
  r.k = k;
  r.run_here = run_here != nullptr ? run_here : mask.data();
  r.out = out;
  return r;
}

void MoeLayer::Impl::run(const float* hidden, int64_t tokens, const int32_t* ids,
                         const float* weights, int64_t k, float* out, const uint8_t* gpu_mask,
                         bool accumulate) {
  const int64_t H = options.hidden_size;
  std::vector<float> result;
  float* dst = out;
  if (accumulate) {
    result.resize(static_cast<size_t>(tokens * H));
    dst = result.data();
  }
  const int64_t chunk = options.max_chunk_tokens > 0 ? options.max_chunk_tokens : tokens;
  for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
    const int64_t n = std::min(chunk, tokens - t0);
    backend->submit(
        request(hidden + t0 * H, n, ids + t0 * k, weights + t0 * k, k, dst + t0 * H, gpu_mask));
    backend->wait();
  }
  propagate_non_finite(hidden, tokens, ids, k, dst);
  for (size_t i = 0; i < result.size(); ++i) out[i] += result[i];
}

// The quantized methods' activation quantizers skip NaN when they look for a group's largest
// value, so a NaN or Inf in a token's hidden state would come out as finite numbers: such a
// token's output is NaN instead, as an unquantized computation gives, when an expert of this
// layer computes it.
void MoeLayer::Impl::propagate_non_finite(const float* hidden, int64_t tokens, const int32_t* ids,
                                          int64_t k, float* out) const {
  const int64_t H = options.hidden_size;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* x = hidden + t * H;
    uint32_t non_finite = 0;
    for (int64_t i = 0; i < H; ++i) {
      uint32_t bits;
      std::memcpy(&bits, x + i, sizeof(bits));
      non_finite |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (non_finite == 0) continue;
    bool here = false;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      here = here || (e >= 0 && (mask.empty() || mask[static_cast<size_t>(e)] != 0));
    }
    if (here) std::fill(out + t * H, out + (t + 1) * H, std::numeric_limits<float>::quiet_NaN());
  }
}

MoeLayer::MoeLayer(std::shared_ptr<MoeContext> context, const MoeLayerOptions& options,
                   const ExpertTensor& gate, const ExpertTensor& up, const ExpertTensor& down)
    : impl_(std::make_unique<Impl>()) {
  if (context == nullptr) fail(ErrorKind::kInvalidArgument, "MoeLayer: no context");
  check_sizes(options);
  check_shape(gate, "gate", options.num_experts, options.intermediate_size, options.hidden_size);
  check_shape(up, "up", options.num_experts, options.intermediate_size, options.hidden_size);
  check_shape(down, "down", options.num_experts, options.hidden_size, options.intermediate_size);
  impl_->context = std::move(context);
  impl_->options = options;
  impl_->loaded.gate = views_of(gate, "gate");
  impl_->loaded.up = views_of(up, "up");
  impl_->loaded.down = views_of(down, "down");
  impl_->build(&impl_->context->pool());
}

MoeLayer::MoeLayer(std::shared_ptr<MoeContext> context, const MoeLayerOptions& options,
                   const std::filesystem::path& model, int64_t layer)
    : impl_(std::make_unique<Impl>()) {
  if (context == nullptr) fail(ErrorKind::kInvalidArgument, "MoeLayer: no context");
  impl_->context = std::move(context);
  impl_->model = std::make_shared<LoadedModel>(load_model(model));
  const LoadedModel& m = *impl_->model;
  const int64_t n_layers = static_cast<int64_t>(m.layers.size());
  if (layer < 0 || layer >= n_layers) {
    fail(ErrorKind::kInvalidArgument, "layer_idx {}: {} has layers 0 .. {}", layer,
         model.string(), n_layers - 1);
  }
  const LayerWeights& lw = m.layers[static_cast<size_t>(layer)];
  if (!lw.moe) {
    fail(ErrorKind::kInvalidArgument, "layer_idx {}: layer {} of {} is dense (no routed experts)",
         layer, layer, model.string());
  }
  MoeLayerOptions o = options;
  auto take = [&](int64_t* v, int64_t model_value, const char* name) {
    if (*v == 0) *v = model_value;
    if (*v != model_value) {
      fail(ErrorKind::kInvalidArgument, "{} {}: {} has {}", name, *v, model.string(),
           model_value);
    }
  };
  take(&o.num_experts, static_cast<int64_t>(lw.experts.gate.size()), "num_experts");
  take(&o.num_experts_per_tok, m.config.n_experts_per_tok, "num_experts_per_tok");
  take(&o.hidden_size, m.config.hidden_size, "hidden_size");
  take(&o.intermediate_size, lw.experts.gate.front().rows(), "moe_intermediate_size");
  check_sizes(o);
  impl_->options = o;
  impl_->loaded = lw.experts;
  impl_->build(&impl_->context->pool());
}

MoeLayer::~MoeLayer() {
  if (impl_ != nullptr) {
    try {
      sync();
      std::unique_lock<std::mutex> lock(impl_->mu);  // (a deferred submit still running)
      impl_->cv.wait(lock, [&] { return impl_->finished == impl_->posted; });
    } catch (const std::exception& e) {
      log_error("MoeLayer destroyed with a failed submit: {}", e.what());
    }
  }
}

namespace {

// Releases a layer's claim at the end of a call that does not keep it.
struct ClaimScope {
  std::atomic<bool>* busy;
  ~ClaimScope() { busy->store(false, std::memory_order_release); }
};

}  // namespace

void MoeLayer::remap(const std::vector<int64_t>& physical_to_logical) {
  impl_->claim("physical_to_logical_map");
  ClaimScope scope{&impl_->busy};
  if (physical_to_logical.empty()) {
    fail(ErrorKind::kInvalidArgument, "physical_to_logical_map: empty");
  }
  impl_->set_slots(physical_to_logical);
  impl_->options.num_experts = static_cast<int64_t>(physical_to_logical.size());
  if (impl_->mask.size() != physical_to_logical.size()) {
    impl_->mask.assign(physical_to_logical.size(), 1);
    impl_->options.gpu_experts_mask.clear();
  }
}

void MoeLayer::set_gpu_experts_mask(const std::vector<uint8_t>& m) {
  impl_->claim("gpu_experts_mask");
  ClaimScope scope{&impl_->busy};
  if (!m.empty() && m.size() != impl_->slots.gate.size()) {
    fail(ErrorKind::kInvalidArgument, "gpu_experts_mask: {} entries, expected {}", m.size(),
         impl_->slots.gate.size());
  }
  impl_->options.gpu_experts_mask = m;
  impl_->mask.assign(impl_->slots.gate.size(), 1);
  for (size_t i = 0; i < m.size(); ++i) impl_->mask[i] = m[i] != 0 ? 0 : 1;
}

void MoeLayer::forward(const float* hidden, int64_t tokens, const int32_t* ids,
                       const float* weights, int64_t k, float* out) {
  impl_->claim("forward");
  ClaimScope scope{&impl_->busy};
  impl_->check_call(ids, tokens, k, hidden, weights, out);
  impl_->run(hidden, tokens, ids, weights, k, out);
}

void MoeLayer::begin(const float* hidden, int64_t tokens, const int32_t* ids,
                     const float* weights, int64_t k) {
  impl_->claim("forward");  // (held until end())
  try {
    impl_->check_call(ids, tokens, k, hidden, weights, nullptr, /*check_out=*/false);
    Impl::Begun b{hidden, tokens, ids, weights, k, false};
    const int64_t chunk = impl_->options.max_chunk_tokens;
    if (tokens > 0 && (chunk == 0 || tokens <= chunk)) {
      impl_->scratch.resize(static_cast<size_t>(tokens * impl_->options.hidden_size));
      impl_->backend->submit(
          impl_->request(hidden, tokens, ids, weights, k, impl_->scratch.data()));
      b.started = true;
    }
    impl_->begun = b;
  } catch (...) {
    impl_->release();
    throw;
  }
}

void MoeLayer::end(float* out) {
  if (!impl_->begun) fail(ErrorKind::kInvalidArgument, "forward: end without begin");
  ClaimScope scope{&impl_->busy};
  const Impl::Begun b = *impl_->begun;
  impl_->begun.reset();
  if (b.started) {
    impl_->backend->wait();
    if (out != nullptr) {
      std::memcpy(out, impl_->scratch.data(),
                  static_cast<size_t>(b.tokens * impl_->options.hidden_size) * sizeof(float));
      impl_->propagate_non_finite(b.hidden, b.tokens, b.ids, b.k, out);
    }
  } else if (out != nullptr) {
    impl_->run(b.hidden, b.tokens, b.ids, b.weights, b.k, out);
  }
}

void MoeLayer::submit(const float* hidden, int64_t tokens, const int32_t* ids,
                      const float* weights, int64_t k, float* out, const SubmitOptions& so) {
  if (so.deferred) {
    // (the layer's claim is its submit's, held until sync())
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->submitted || impl_->posted != impl_->main_ticket) {
      fail(ErrorKind::kInvalidArgument, "submit_forward: a deferred submit follows the layer's "
           "own submit, before its sync_forward (one per submit)");
    }
  } else {
    impl_->claim("submit_forward");  // (held until sync())
  }
  // This call's mask, in the sense of the layer's (1 = computed here).
  std::vector<uint8_t> mask;
  try {
    impl_->check_call(ids, tokens, k, hidden, weights, out);
    if (!so.gpu_experts_mask.empty()) {
      if (so.gpu_experts_mask.size() != impl_->slots.gate.size()) {
        fail(ErrorKind::kInvalidArgument, "gpu_experts_mask: {} entries, expected {}",
             so.gpu_experts_mask.size(), impl_->slots.gate.size());
      }
      mask.resize(so.gpu_experts_mask.size());
      for (size_t i = 0; i < mask.size(); ++i) mask[i] = so.gpu_experts_mask[i] != 0 ? 0 : 1;
    }
  } catch (...) {
    if (!so.deferred) impl_->release();
    throw;
  }
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    ticket = ++impl_->posted;
    if (!so.deferred) {
      impl_->submitted = true;
      impl_->main_ticket = ticket;
      impl_->error = nullptr;
    }
  }
  Impl* impl = impl_.get();
  const bool accumulate = so.accumulate;
  impl_->context->post([impl, hidden, tokens, ids, weights, k, out, ticket, accumulate,
                        mask = std::move(mask)] {
    std::exception_ptr error;
    try {
      impl->run(hidden, tokens, ids, weights, k, out, mask.empty() ? nullptr : mask.data(),
                accumulate);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(impl->mu);
      impl->finished = ticket;
      if (error && !impl->error) impl->error = error;
    }
    impl->cv.notify_all();
  });
}

void MoeLayer::sync() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->finished >= impl_->main_ticket; });
  if (impl_->submitted) impl_->release();
  impl_->submitted = false;
  if (impl_->error) std::rethrow_exception(std::exchange(impl_->error, nullptr));
}

bool MoeLayer::in_flight() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->submitted;
}

void MoeLayer::keep_error(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (!impl_->error) impl_->error = std::move(error);
}

const MoeLayerOptions& MoeLayer::options() const { return impl_->options; }

std::string MoeLayer::weight_format() const { return impl_->experts.format; }

float MoeLayer::swiglu_limit() const { return impl_->loaded.swiglu_limit; }

uint64_t MoeLayer::weight_bytes() const { return impl_->prepared.bytes; }

}  // namespace tandem
