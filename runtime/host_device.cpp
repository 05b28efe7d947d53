// The host device (runtime/host_device.h): streams are host threads, copies are paced through an
// emulated link, ops run the CPU kernels on the device's own thread pool.
#include "runtime/host_device.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/thread_pool.h"
#include "core/trace_events.h"
#include "moe/expert_ffn.h"
#include "ops/cpu/kernels.h"
#include "runtime/dense_weights.h"
#include "runtime/device_forward_ops.h"
#include "runtime/timeline.h"

namespace tandem::rt {

namespace {

using Clock = std::chrono::steady_clock;

struct Item {
  const char* op;
  std::function<void()> fn;
};

struct Stream {
  std::deque<Item> queue;
  bool capturing = false;
  std::vector<Item> captured;  // begin_capture .. end_capture: the graph being recorded
  uint64_t enqueued = 0, completed = 0;
  std::exception_ptr error;  // the first unreported failure
  uint64_t error_seq = 0;    // its position in the stream (1-based)
  std::thread thread;
};

struct Event {
  int stream = -1;  // -1: never recorded
  uint64_t target = 0;
};

class HostForwardOps;

class HostDevice final : public Device {
 public:
  explicit HostDevice(const HostDeviceOptions& o)
      : opt_(o), h2d_(o.link), d2h_(o.link), arena_(checked(o).memory_bytes) {
    // The stream thread helps run each job, so threads - 1 workers make `threads` computing.
    if (o.threads > 1) {
      ThreadPoolOptions po;
      po.pin = false;
      po.track = "device worker";
      pool_ = std::make_unique<ThreadPool>(std::vector<WorkerPlacement>(o.threads - 1), po);
    }
    create_stream();  // stream 0, the default stream
  }

  ~HostDevice() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& s : streams_) s->thread.join();  // threads drain their queues first
    for (size_t i = 0; i < streams_.size(); ++i) {
      if (!streams_[i]->error) continue;
      try {
        std::rethrow_exception(streams_[i]->error);
      } catch (const std::exception& e) {
        log_warn("host device: unreported error on stream {}: {}", i, e.what());
      }
    }
  }

  std::string name() const override { return "host"; }
  uint64_t memory_capacity() const override { return arena_.capacity(); }
  uint64_t memory_used() const override { return arena_.used(); }
  void* alloc(uint64_t bytes) override { return arena_.alloc(bytes, name()); }
  void free(void* p) override { arena_.free(p, name()); }

  StreamId create_stream() override {
    std::lock_guard<std::mutex> lock(mu_);
    auto s = std::make_unique<Stream>();
    Stream* raw = s.get();
    const int id = static_cast<int>(streams_.size());
    streams_.push_back(std::move(s));
    raw->thread = std::thread([this, raw, id] { worker(raw, id); });
    return id;
  }

  EventId create_event() override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.emplace_back();
    return static_cast<int>(events_.size()) - 1;
  }

  void record(EventId e, StreamId s) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stream& st = stream(s);
    not_capturing(st, s, "record");
    event(e) = Event{s, st.enqueued};
  }

  void wait_event(StreamId s, EventId e) override {
    Event ev;
    Stream* other = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      not_capturing(stream(s), s, "wait_event");
      ev = event(e);  // the newest record at the time of the call, like cudaStreamWaitEvent
      if (ev.stream < 0 || ev.stream == s) return;  // never recorded / already ordered
      other = streams_[ev.stream].get();
    }
    enqueue(s, "wait_event", [this, other, ev] {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return other->completed >= ev.target; });
    });
  }

  bool query(EventId e) override {
    std::lock_guard<std::mutex> lock(mu_);
    const Event& ev = event(e);
    return ev.stream < 0 || streams_[ev.stream]->completed >= ev.target;
  }

  void sync_event(EventId e) override {
    std::unique_lock<std::mutex> lock(mu_);
    const Event ev = event(e);
    if (ev.stream < 0) return;
    Stream& st = *streams_[ev.stream];
    cv_.wait(lock, [&] { return st.completed >= ev.target; });
    if (st.error && st.error_seq <= ev.target) std::rethrow_exception(std::exchange(st.error, {}));
  }

  void sync_stream(StreamId s) override {
    std::unique_lock<std::mutex> lock(mu_);
    Stream& st = stream(s);
    not_capturing(st, s, "sync_stream");
    const uint64_t target = st.enqueued;
    cv_.wait(lock, [&] { return st.completed >= target; });
    if (st.error) std::rethrow_exception(std::exchange(st.error, {}));
  }

  void copy_h2d(void* dst, const void* src, uint64_t bytes, StreamId s) override {
    check_device(dst, bytes, "copy_h2d destination");
    enqueue(s, "copy_h2d", [this, dst, src, bytes] {
      h2d_.copy(dst, src, bytes);
      if (Timeline* t = timeline_) t->add_bytes(true, bytes);  // (at every launch of a graph)
    });
  }

  void copy_d2h(void* dst, const void* src, uint64_t bytes, StreamId s) override {
    check_device(src, bytes, "copy_d2h source");
    enqueue(s, "copy_d2h", [this, dst, src, bytes] {
      d2h_.copy(dst, src, bytes);
      if (Timeline* t = timeline_) t->add_bytes(false, bytes);
    });
  }

  void host_callback(StreamId s, std::function<void()> fn) override {
    enqueue(s, "host_callback", std::move(fn));
  }

  void ffn(StreamId s, const DeviceFfnWeights& w, const float* x, int64_t n, const float* scale,
           float* out, bool accumulate) override {
    check_ffn_args(
        "host device", w, x, n, scale, out,
        [this](const void* p, uint64_t bytes, const char* what) { check_device(p, bytes, what); });
    enqueue(s, "ffn",
            [this, w, x, n, scale, out, accumulate] { run_ffn(w, x, n, scale, out, accumulate); });
  }

  void matmul(StreamId s, const ops::Weight& w, const float* x, int64_t n, float* y) override {
    check_device(w.t.data, 1, "matmul weight");
    check_device(x, uint64_t(n * w.cols()) * 4, "matmul input");
    check_device(y, uint64_t(n * w.rows()) * 4, "matmul output");
    enqueue(s, "matmul", [this, w, x, n, y] { kern::matmul(w, x, n, y, pool_.get()); });
  }

  void add(StreamId s, const float* a, float* out, int64_t count) override {
    check_device(a, uint64_t(count) * 4, "add input");
    check_device(out, uint64_t(count) * 4, "add output");
    enqueue(s, "add", [a, out, count] {
      for (int64_t i = 0; i < count; ++i) out[i] += a[i];
    });
  }

  std::unique_ptr<ForwardOps> forward_ops(std::shared_ptr<const DenseWeights> weights,
                                          const ForwardOpsOptions& options) override;

 private:
  friend class HostForwardOps;

  Stream& stream(StreamId s) {  // mu_ held
    if (s < 0 || s >= static_cast<int>(streams_.size())) {
      fail(ErrorKind::kInvalidArgument, "{} device: unknown stream {}", name(), s);
    }
    return *streams_[s];
  }
  Event& event(EventId e) {  // mu_ held
    if (e < 0 || e >= static_cast<int>(events_.size())) {
      fail(ErrorKind::kInvalidArgument, "{} device: unknown event {}", name(), e);
    }
    return events_[e];
  }

  static const HostDeviceOptions& checked(const HostDeviceOptions& o) {
    if (o.threads < 1) {
      fail(ErrorKind::kInvalidArgument, "host device: threads must be >= 1 (got {})", o.threads);
    }
    return o;
  }
  // Host pointers handed to device ops work here but would crash a CUDA device: reject them.
  void check_device(const void* p, uint64_t bytes, const char* what) const {
    if (bytes > 0 && !arena_.contains(p, bytes)) {
      fail(ErrorKind::kInvalidArgument, "{} device: {} ({} bytes at {}) is not device memory",
           name(), what, bytes, p);
    }
  }

  // The items that are the device computing (Timeline): not copies, waits or host callbacks.
  static bool is_compute(const char* op) {
    for (const char* other : {"copy_h2d", "copy_d2h", "host_callback", "wait_event", "begin"}) {
      if (std::strcmp(op, other) == 0) return false;
    }
    return true;
  }

  void enqueue(StreamId s, const char* op, std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Stream& st = stream(s);
      if (st.capturing) {
        st.captured.push_back(Item{op, std::move(fn)});
        return;
      }
      st.queue.push_back(Item{op, std::move(fn)});
      ++st.enqueued;
    }
    cv_.notify_all();
  }

  // A graph is the stream's closures in order; a launch enqueues copies of them.
  void begin_capture(StreamId s) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stream& st = stream(s);
    if (st.capturing) fail(ErrorKind::kInvalidArgument, "{}: stream {} is capturing", name(), s);
    st.capturing = true;
    st.captured.clear();
  }
  GraphId end_capture(StreamId s) override {
    std::lock_guard<std::mutex> lock(mu_);
    Stream& st = stream(s);
    if (!st.capturing) {
      fail(ErrorKind::kInvalidArgument, "{}: end_capture of stream {}, which is not capturing",
           name(), s);
    }
    st.capturing = false;
    graphs_.push_back(std::exchange(st.captured, {}));
    destroyed_.push_back(false);
    return static_cast<GraphId>(graphs_.size()) - 1;
  }
  void launch_graph(GraphId g, StreamId s) override {
    std::vector<Item> items;
    {
      std::lock_guard<std::mutex> lock(mu_);
      graph(g);
      if (stream(s).capturing) {
        fail(ErrorKind::kUnsupported, "{}: launch_graph while stream {} captures", name(), s);
      }
      items = graph(g);
    }
    for (Item& it : items) enqueue(s, it.op, std::move(it.fn));
  }
  void destroy_graph(GraphId g) override {
    std::lock_guard<std::mutex> lock(mu_);
    graph(g) = {};
    destroyed_[static_cast<size_t>(g)] = true;
  }
  std::vector<Item>& graph(GraphId g) {  // mu_ held
    if (g < 0 || g >= static_cast<GraphId>(graphs_.size()) || destroyed_[static_cast<size_t>(g)]) {
      fail(ErrorKind::kInvalidArgument, "{}: unknown graph {}", name(), g);
    }
    return graphs_[static_cast<size_t>(g)];
  }
  // Fails when s is capturing (events and syncs are not part of a graph).
  void not_capturing(Stream& st, StreamId s, const char* what) {
    if (st.capturing) {
      fail(ErrorKind::kUnsupported, "{}: {} on stream {} while it captures a graph", name(), what,
           s);
    }
  }

  void worker(Stream* st, int id) {
    trace::name_thread(fmt::format("device stream {}", id));
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !st->queue.empty(); });
      if (st->queue.empty()) return;  // stopping and drained
      Item item = std::move(st->queue.front());
      st->queue.pop_front();
      lock.unlock();
      std::exception_ptr err;
      Timeline* timeline = timeline_;
      const bool compute = timeline != nullptr && is_compute(item.op);
      const Clock::time_point t0 = compute ? Clock::now() : Clock::time_point{};
      try {
        trace::Span span(item.op, is_compute(item.op) ? "device" : "device copy or wait");
        item.fn();
        if (compute) timeline->add(Timeline::kDevice, t0, Clock::now());
      } catch (const Error& e) {
        err = std::make_exception_ptr(Error(
            e.kind(), fmt::format("{} device stream {}: {}: {}", name(), id, item.op, e.what())));
      } catch (const std::exception& e) {
        err = std::make_exception_ptr(
            Error(ErrorKind::kInternal,
                  fmt::format("{} device stream {}: {}: {}", name(), id, item.op, e.what())));
      } catch (...) {
        err = std::make_exception_ptr(
            Error(ErrorKind::kInternal,
                  fmt::format("{} device stream {}: {}: unknown exception", name(), id, item.op)));
      }
      item.fn = nullptr;  // release captures before reporting completion
      lock.lock();
      ++st->completed;
      if (err && !st->error) {
        st->error = err;
        st->error_seq = st->completed;
      }
      cv_.notify_all();
    }
  }

  // Row tiles of one GEMM over the device pool (per-row arithmetic does not depend on the split).
  void gemm_rows(const kern::KMatrix& w, const kern::Activations& a, float* y) {
    const int64_t rows_per_task = std::max<int64_t>(
        16, std::min<int64_t>(256, (64 * 1024) / std::max<int64_t>(1, w.row_bytes)) / 16 * 16);
    const int64_t n_tasks = (w.rows + rows_per_task - 1) / rows_per_task;
    auto task = [&](size_t i) {
      const int64_t r0 = static_cast<int64_t>(i) * rows_per_task;
      kern::gemm(w, a, r0, std::min(w.rows, r0 + rows_per_task), y, w.rows);
    };
    if (pool_ == nullptr || n_tasks == 1) {
      for (int64_t i = 0; i < n_tasks; ++i) task(static_cast<size_t>(i));
    } else {
      pool_->run(static_cast<size_t>(n_tasks), task);
    }
  }

  // One expert by the fused operator's formula (moe/expert_ffn.h), so a hybrid run produces the
  // CPU backend's numbers for every expert.
  void run_ffn(const DeviceFfnWeights& w, const float* x, int64_t n, const float* scale, float* out,
               bool accumulate) {
    if (n == 0) return;
    const int64_t H = w.gate.cols(), out_cols = w.down.rows();
    thread_local expert::Scratch s;
    thread_local std::vector<float> d;
    thread_local kern::Activations ax;
    d.resize(static_cast<size_t>(n * out_cols));
    kern::KMatrix kg, ku, kd;
    const bool fast = kern::view_weight(w.gate, &kg) && kern::view_weight(w.up, &ku) &&
                      kern::view_weight(w.down, &kd) && kg.format == ku.format;
    if (fast) {
      kern::quantize_activations(kern::act_format(kg.format), kg.group, x, n, H, H, &ax);
      expert::whole(kg, ku, kd, w.extras, ax, &s, d.data(),
                    [this](const kern::KMatrix& m, const kern::Activations& a, float* y) {
                      gemm_rows(m, a, y);
                    });
    } else {
      ops::swiglu_ffn(w.gate, w.up, w.down, x, n, d.data(), pool_.get(), &s.g, &s.u, w.extras);
    }
    for (int64_t t = 0; t < n; ++t) {
      const float s = scale != nullptr ? scale[t] : 1.0f;
      float* o = out + t * out_cols;
      const float* src = d.data() + t * out_cols;
      if (accumulate) {
        for (int64_t i = 0; i < out_cols; ++i) o[i] += s * src[i];
      } else {
        for (int64_t i = 0; i < out_cols; ++i) o[i] = s * src[i];
      }
    }
  }

  HostDeviceOptions opt_;
  EmulatedLink h2d_, d2h_;
  DeviceArena arena_;
  std::unique_ptr<ThreadPool> pool_;

  std::mutex mu_;  // guards streams, events and queues
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<Event> events_;
  std::vector<std::vector<Item>> graphs_;  // end_capture's, by GraphId
  std::vector<bool> destroyed_;            // by GraphId
};

// The forward's ops on the host device: each call is enqueued on the ops' stream and runs the
// CPU's ops (make_cpu_forward_ops) on the stream's thread and the device's pool, over the dense
// weights in device memory, into activation buffers and a KV cache in device memory; the host
// reads results through the d2h link (host_view, lm_head) and gives the routed experts' output
// back through the h2d link (add_from_host).
class HostForwardOps final : public DeviceForwardOps {
 public:
  HostForwardOps(HostDevice& dev, std::shared_ptr<const DenseWeights> w, const ForwardOpsOptions& o)
      : DeviceForwardOps(dev, std::move(w)), host_(dev), logits_(new_buf()) {
    ForwardOpsOptions inner = o;
    inner.pool = dev.pool_.get();
    inner.views = nullptr;  // (the host's prepared copies are not in device memory)
    cpu_ = make_cpu_forward_ops(w_->weights, inner);
  }
  ~HostForwardOps() override {
    try {
      finish();  // (before cpu_, which the stream's work uses, goes)
    } catch (const std::exception& e) {
      log_warn("host device forward ops: {}", e.what());
    }
  }

  void check_cache(const KvCache& cache) const override {
    if (!host_.arena_.contains(cache.memory(), cache.bytes())) {
      fail(ErrorKind::kInvalidArgument,
           "forward: the KV cache is not in the {} device's memory, where the dense part runs "
           "(make it with Model::cache_options)",
           host_.name());
    }
  }
  // The step is read when the stream reaches begin (the previous forward has finished by then).
  void stage(const ForwardStep& step, KvCache& cache) override {
    staged_ = step;
    cache_ = &cache;
  }
  // The cache is bound when the op is enqueued -- or captured into a graph, as a CUDA graph binds
  // its kernels' pointers: a graph replayed on another cache (a stale graph) computes on the one
  // it was captured with, here as on a GPU. (The step's contents are read at run time, as a
  // graph's copy from the pinned staging buffer is.)
  void upload_step() override {
    KvCache* cache = cache_;
    run("begin", [this, cache] { cpu_->begin_step(staged_, *cache); });
  }
  void embed(float* x) override {
    run("embed", [this, x] { cpu_->embed(x); });
  }
  void norm(Norm which, int64_t layer, const float* x, int64_t n, float* out) override {
    run("norm", [this, which, layer, x, n, out] { cpu_->norm(which, layer, x, n, out); });
  }
  void add(float* out, const float* a, int64_t count) override {
    run("add", [this, out, a, count] { cpu_->add(out, a, count); });
  }
  void fill_zero(float* out, int64_t count) override {
    run("fill_zero", [this, out, count] { cpu_->fill_zero(out, count); });
  }
  void attention(int64_t layer, const float* x, float* out) override {
    run("attention", [this, layer, x, out] { cpu_->attention(layer, x, out); });
  }
  void linear_attention(int64_t layer, const float* x, float* out) override {
    run("linear_attention", [this, layer, x, out] { cpu_->linear_attention(layer, x, out); });
  }
  void dense_ffn(int64_t layer, const float* x, int64_t n, float* out) override {
    run("dense_ffn", [this, layer, x, n, out] { cpu_->dense_ffn(layer, x, n, out); });
  }
  void shared_ffn(int64_t layer, const float* x, int64_t n, float* out) override {
    TD_CHECK(w_->shared_experts,
             "host device forward ops: the shared experts were not uploaded (the MoE backend "
             "computes them)");
    run("shared_ffn", [this, layer, x, n, out] { cpu_->shared_ffn(layer, x, n, out); });
  }
  void router(int64_t layer, const float* x, int64_t n, float* logits) override {
    run("router", [this, layer, x, n, logits] { cpu_->router(layer, x, n, logits); });
  }
  const float* logits_rows(const std::vector<int64_t>& row_ids, const float* x) override {
    const int64_t count = static_cast<int64_t>(row_ids.size()) * w_->weights.config.vocab_size;
    float* d = grow(logits_, count);
    run("lm_head", [this, row_ids, x, d] { cpu_->lm_head(row_ids, x, d); });
    return d;
  }
  ForwardOpsProfile profile() const override { return cpu_->profile(); }

 private:
  void run(const char* op, std::function<void()> fn) { host_.enqueue(stream_, op, std::move(fn)); }

  HostDevice& host_;
  std::unique_ptr<ForwardOps> cpu_;
  Buf* logits_;
  ForwardStep staged_;
  KvCache* cache_ = nullptr;
};

std::unique_ptr<ForwardOps> HostDevice::forward_ops(std::shared_ptr<const DenseWeights> weights,
                                                    const ForwardOpsOptions& options) {
  if (&weights->device() != this) {
    fail(ErrorKind::kInvalidArgument, "host device: forward ops over another device's weights");
  }
  return std::make_unique<HostForwardOps>(*this, std::move(weights), options);
}

}  // namespace

std::unique_ptr<Device> make_host_device(const HostDeviceOptions& o) {
  return std::make_unique<HostDevice>(o);
}

}  // namespace tandem::rt
