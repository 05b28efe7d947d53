// The CUDA device (runtime/device.h's contract on a GPU; docs/device.md): streams are
// cudaStream_t, events cudaEvent_t, host callbacks cudaLaunchHostFunc, host staging memory
// pinned (cudaHostAlloc); device memory comes from cudaMalloc under a byte budget it accounts
// (--vram-budget, else 90% of the memory free at start). Ops: an expert FFN and a matmul read
// the weights as stored (ops/cuda/matvec.h), with the F32 kernels of ops/cuda/dense.h for the
// activation and the output; intermediates live in a per-stream scratch. Forward ops
// (CudaForwardOps below): the dense part on the GPU with the kernels of ops/cuda/attention.h and
// dense.h.
#include "core/error.h"
#include "runtime/device.h"

#ifdef TANDEM_HAVE_CUDA

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/log.h"
#include "model/kv_cache.h"
#include "ops/cpu/ref_ops.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/cublas_api.h"
#include "ops/cuda/cuda_util.h"
#include "ops/cuda/dense.h"
#include "ops/cuda/dequant.h"
#include "ops/cuda/matvec.h"
#include "runtime/dense_weights.h"
#include "runtime/device_forward_ops.h"
#include "runtime/timeline.h"

namespace tandem::rt {

namespace {

struct CudaGraph;

struct CudaStreamState {
  cudaStream_t stream = nullptr;
  std::mutex mu;
  std::exception_ptr error;  // the first unreported failure of a host callback
  void* scratch = nullptr;   // intermediates of ffn, dequantized W_UK for MLA
  uint64_t scratch_bytes = 0;
  cublasHandle_t blas = nullptr;  // created on the first product with many tokens
  void* weights = nullptr;        // a slice of a weight dequantized for cuBLAS
  uint64_t weights_bytes = 0;
  std::unique_ptr<CudaGraph> capture;  // the graph being captured on the stream
  uint64_t generation = 0;             // scratch or weights reallocated (graphs of it stale)
};

// A host function on a stream (cudaLaunchHostFunc): an exception is kept for the stream's next
// sync.
struct CudaCallback {
  CudaStreamState* st;
  std::function<void()> fn;
  static void CUDART_CB run(void* p) {  // once: the callback is the trampoline's
    std::unique_ptr<CudaCallback> cb(static_cast<CudaCallback*>(p));
    call(*cb);
  }
  static void CUDART_CB run_kept(void* p) {  // a graph's host node, at every launch
    call(*static_cast<CudaCallback*>(p));
  }
  static void call(CudaCallback& cb) {
    try {
      cb.fn();
    } catch (...) {
      std::lock_guard<std::mutex> lock(cb.st->mu);
      if (!cb.st->error) cb.st->error = std::current_exception();
    }
  }
};

// One op's span for the timeline: timing events recorded before and after it on its stream.
struct OpSpan {
  cudaEvent_t start = nullptr, end = nullptr;
  double* seconds = nullptr;  // also added here (the forward ops' profile), when set
  bool graph = false;         // a graph's: recorded by its event nodes at every launch
};

struct CudaGraph {
  cudaGraphExec_t exec = nullptr;
  std::vector<std::unique_ptr<CudaCallback>> callbacks;  // its host nodes'
  uint64_t h2d_bytes = 0, d2h_bytes = 0;                 // its copies' (the timeline's, per launch)
  std::vector<OpSpan> spans;                             // its ops' (event record nodes)
  ~CudaGraph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    for (const OpSpan& p : spans) {
      cudaEventDestroy(p.start);
      cudaEventDestroy(p.end);
    }
  }
};

// Products with at least this many token rows (prefill) go through cuBLAS on a dequantized F32
// copy of the weight, made kGemmSliceBytes of rows at a time; fewer read the weight as stored.
constexpr int64_t kGemmMinTokens = 32;
constexpr uint64_t kGemmSliceBytes = uint64_t{64} << 20;

class CudaForwardOps;

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const CudaDeviceOptions& o) : index_(o.index) {
    TD_CUDA_CHECK(cudaSetDevice(index_));
    cudaDeviceProp prop{};
    TD_CUDA_CHECK(cudaGetDeviceProperties(&prop, index_));
    name_ = fmt::format("cuda:{} ({})", index_, prop.name);
    size_t free = 0, total = 0;
    TD_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    const uint64_t usable = static_cast<uint64_t>(free) / 10 * 9;
    if (o.memory_bytes > usable) {
      fail(ErrorKind::kResource, "--vram-budget {} bytes: the GPU {} has {} bytes free",
           o.memory_bytes, name_, free);
    }
    capacity_ = o.memory_bytes > 0 ? o.memory_bytes : usable;
    create_stream();  // stream 0
  }

  ~CudaDevice() override {
    cudaSetDevice(index_);
    for (auto& s : streams_) {
      cudaStreamSynchronize(s->stream);
      cudaFree(s->scratch);
      cudaFree(s->weights);
      if (s->blas != nullptr) cublas_api()->destroy(s->blas);
      cudaStreamDestroy(s->stream);
    }
    for (auto& e : events_) cudaEventDestroy(e.event);
    for (const std::vector<OpSpan>* v : {&spans_free_, &spans_pending_}) {
      for (const OpSpan& p : *v) {
        if (p.graph) continue;  // (its graph's)
        cudaEventDestroy(p.start);
        cudaEventDestroy(p.end);
      }
    }
    if (anchor_ != nullptr) cudaEventDestroy(anchor_);
    for (const auto& [p, bytes] : live_) cudaFree(p);
    for (const void* p : registered_) cudaHostUnregister(const_cast<void*>(p));
  }

  std::string name() const override { return name_; }
  uint64_t memory_capacity() const override { return capacity_; }
  uint64_t memory_used() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }

  void* alloc(uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes > capacity_ - used_) {
      fail(ErrorKind::kResource,
           "{}: cannot allocate {} bytes: {} of {} bytes left (--vram-budget)", name_, bytes,
           capacity_ - used_, capacity_);
    }
    TD_CUDA_CHECK(cudaSetDevice(index_));
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, std::max<uint64_t>(bytes, 1));
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail(ErrorKind::kResource, "{}: cudaMalloc of {} bytes: {}", name_, bytes,
           cudaGetErrorString(err));
    }
    live_[p] = bytes;
    used_ += bytes;
    return p;
  }

  void free(void* p) override {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = live_.find(p);
    if (it == live_.end()) {
      fail(ErrorKind::kInvalidArgument, "{}: free of {} which is not a live allocation", name_, p);
    }
    used_ -= it->second;
    live_.erase(it);
    TD_CUDA_CHECK(cudaFree(p));
  }

  void* alloc_host(uint64_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, std::max<uint64_t>(bytes, 1), cudaHostAllocDefault);
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail(ErrorKind::kResource, "{}: pinned host memory of {} bytes: {}", name_, bytes,
           cudaGetErrorString(err));
    }
    return p;
  }
  void free_host(void* p) override {
    if (p != nullptr) TD_CUDA_CHECK(cudaFreeHost(p));
  }
  bool register_host(const void* p, uint64_t bytes, std::string* why) override {
    int read_only = 0;
    cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, index_);
    const unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0u);
    const cudaError_t err = cudaHostRegister(const_cast<void*>(p), bytes, flags);
    if (err != cudaSuccess) {
      cudaGetLastError();
      if (why != nullptr) {
        *why = fmt::format("cudaHostRegister of {} bytes{}: {}", bytes,
                           read_only ? " (read-only)" : "", cudaGetErrorString(err));
      }
      return false;
    }
    std::lock_guard<std::mutex> lock(mu_);
    registered_.push_back(p);
    return true;
  }
  void unregister_host(const void* p) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto it = std::find(registered_.begin(), registered_.end(), p);
      if (it == registered_.end()) {
        fail(ErrorKind::kInvalidArgument, "{}: unregister_host of {} which is not registered",
             name_, p);
      }
      registered_.erase(it);
    }
    TD_CUDA_CHECK(cudaHostUnregister(const_cast<void*>(p)));
  }

  StreamId create_stream() override {
    std::lock_guard<std::mutex> lock(mu_);
    TD_CUDA_CHECK(cudaSetDevice(index_));
    auto s = std::make_unique<CudaStreamState>();
    TD_CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    streams_.push_back(std::move(s));
    return static_cast<StreamId>(streams_.size() - 1);
  }

  EventId create_event() override {
    std::lock_guard<std::mutex> lock(mu_);
    TD_CUDA_CHECK(cudaSetDevice(index_));
    Event e;
    TD_CUDA_CHECK(cudaEventCreateWithFlags(&e.event, cudaEventDisableTiming));
    events_.push_back(e);
    return static_cast<EventId>(events_.size() - 1);
  }

  void record(EventId e, StreamId s) override {
    Event& ev = event(e);
    TD_CUDA_CHECK(cudaEventRecord(ev.event, stream(s).stream));
    ev.stream = s;
  }
  void wait_event(StreamId s, EventId e) override {
    const Event& ev = event(e);
    if (ev.stream < 0) return;  // never recorded: no wait
    TD_CUDA_CHECK(cudaStreamWaitEvent(stream(s).stream, ev.event, 0));
  }
  bool query(EventId e) override {
    const Event& ev = event(e);
    if (ev.stream < 0) return true;
    const cudaError_t err = cudaEventQuery(ev.event);
    if (err == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    TD_CUDA_CHECK(err);
    return true;
  }
  void sync_event(EventId e) override {
    const Event& ev = event(e);
    if (ev.stream < 0) return;
    TD_CUDA_CHECK(cudaEventSynchronize(ev.event));
    collect_spans();
    rethrow(stream(ev.stream), ev.stream);
  }
  void sync_stream(StreamId s) override {
    CudaStreamState& st = stream(s);
    TD_CUDA_CHECK(cudaStreamSynchronize(st.stream));
    collect_spans();
    rethrow(st, s);
  }

  void copy_h2d(void* dst, const void* src, uint64_t bytes, StreamId s) override {
    check_device(dst, bytes, "copy_h2d destination");
    CudaStreamState& st = stream(s);
    count_bytes(st, true, bytes);
    TD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st.stream));
  }
  void copy_d2h(void* dst, const void* src, uint64_t bytes, StreamId s) override {
    check_device(src, bytes, "copy_d2h source");
    CudaStreamState& st = stream(s);
    count_bytes(st, false, bytes);
    TD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st.stream));
  }

  void host_callback(StreamId s, std::function<void()> fn) override {
    CudaStreamState& st = stream(s);
    if (st.capture != nullptr) {  // a host node: kept by the graph, run at every launch
      auto cb = std::make_unique<CudaCallback>(CudaCallback{&st, std::move(fn)});
      TD_CUDA_CHECK(cudaLaunchHostFunc(st.stream, &CudaCallback::run_kept, cb.get()));
      st.capture->callbacks.push_back(std::move(cb));
      return;
    }
    auto* cb = new CudaCallback{&st, std::move(fn)};
    const cudaError_t err = cudaLaunchHostFunc(st.stream, &CudaCallback::run, cb);
    if (err != cudaSuccess) {
      delete cb;
      TD_CUDA_CHECK(err);
    }
  }

  void begin_capture(StreamId s) override {
    CudaStreamState& st = stream(s);
    if (st.capture != nullptr) {
      fail(ErrorKind::kInvalidArgument, "{}: stream {} is capturing", name_, s);
    }
    TD_CUDA_CHECK(cudaStreamBeginCapture(st.stream, cudaStreamCaptureModeThreadLocal));
    st.capture = std::make_unique<CudaGraph>();
  }
  GraphId end_capture(StreamId s) override {
    CudaStreamState& st = stream(s);
    if (st.capture == nullptr) {
      fail(ErrorKind::kInvalidArgument, "{}: end_capture of stream {}, which is not capturing",
           name_, s);
    }
    std::unique_ptr<CudaGraph> g = std::move(st.capture);
    cudaGraph_t graph = nullptr;
    TD_CUDA_CHECK(cudaStreamEndCapture(st.stream, &graph));
    const cudaError_t err = cudaGraphInstantiate(&g->exec, graph, 0);
    cudaGraphDestroy(graph);
    TD_CUDA_CHECK(err);
    std::lock_guard<std::mutex> lock(mu_);
    graphs_.push_back(std::move(g));
    return static_cast<GraphId>(graphs_.size()) - 1;
  }
  void launch_graph(GraphId g, StreamId s) override {
    CudaStreamState& st = stream(s);
    cudaGraphExec_t exec = nullptr;
    uint64_t h2d = 0, d2h = 0;
    std::vector<OpSpan> spans;
    {
      std::lock_guard<std::mutex> lock(mu_);
      exec = graph(g).exec;
      h2d = graph(g).h2d_bytes;
      d2h = graph(g).d2h_bytes;
      spans = graph(g).spans;
    }
    TD_CUDA_CHECK(cudaGraphLaunch(exec, st.stream));
    if (timeline_ != nullptr) {
      timeline_->add_bytes(true, h2d);
      timeline_->add_bytes(false, d2h);
      std::lock_guard<std::mutex> lock(span_mu_);
      spans_pending_.insert(spans_pending_.end(), spans.begin(), spans.end());
    }
  }
  void destroy_graph(GraphId g) override {
    std::lock_guard<std::mutex> lock(mu_);
    const CudaGraph& cg = graph(g);
    {
      std::lock_guard<std::mutex> spans_lock(span_mu_);  // (its events, about to go)
      std::erase_if(spans_pending_, [&](const OpSpan& p) {
        return std::any_of(cg.spans.begin(), cg.spans.end(),
                           [&](const OpSpan& q) { return q.start == p.start; });
      });
    }
    graphs_[static_cast<size_t>(g)].reset();
  }

  void ffn(StreamId s, const DeviceFfnWeights& w, const float* x, int64_t n, const float* scale,
           float* out, bool accumulate) override {
    const int64_t H = w.gate.cols(), ff = w.gate.rows(), out_cols = w.down.rows();
    if (w.up.rows() != ff || w.up.cols() != H || w.down.cols() != ff || n < 0) {
      fail(ErrorKind::kInvalidArgument,
           "{}: ffn shapes: gate [{}, {}], up [{}, {}], down [{}, {}], {} tokens", name_, ff, H,
           w.up.rows(), w.up.cols(), out_cols, w.down.cols(), n);
    }
    check_device(x, uint64_t(n * H) * 4, "ffn input");
    check_device(out, uint64_t(n * out_cols) * 4, "ffn output");
    if (scale != nullptr) check_device(scale, uint64_t(n) * 4, "ffn scale");
    const ops::FfnExtras& e = w.extras;
    if (e.gate_bias != nullptr) check_device(e.gate_bias, uint64_t(ff) * 4, "ffn gate bias");
    if (e.up_bias != nullptr) check_device(e.up_bias, uint64_t(ff) * 4, "ffn up bias");
    if (e.down_bias != nullptr) check_device(e.down_bias, uint64_t(out_cols) * 4, "ffn down bias");
    if (n == 0) return;
    CudaStreamState& st = stream(s);
    const Timed timed(*this, st);
    // Scratch: g, u [n, ff] and the down output [n, out].
    float* g = scratch(st, static_cast<uint64_t>(2 * n * ff + n * out_cols) * 4);
    float* u = g + n * ff;
    float* d = u + n * ff;
    product(w.gate, x, H, n, g, ff, st);
    product(w.up, x, H, n, u, ff, st);
    launch(glu_cuda(g, u, n, ff, e.gate_bias, e.up_bias, e.limit, ops::kSwigluOaiAlpha, st.stream),
           "ffn activation");
    product(w.down, g, ff, n, d, out_cols, st);
    launch(scale_rows_cuda(d, n, out_cols, e.down_bias, scale, out, accumulate, st.stream),
           "ffn output");
  }

  void matmul(StreamId s, const ops::Weight& w, const float* x, int64_t n, float* y) override {
    check_device(x, uint64_t(n * w.cols()) * 4, "matmul input");
    check_device(y, uint64_t(n * w.rows()) * 4, "matmul output");
    CudaStreamState& st = stream(s);
    const Timed timed(*this, st);
    product(w, x, w.cols(), n, y, w.rows(), st);
  }

  void add(StreamId s, const float* a, float* out, int64_t count) override {
    check_device(a, uint64_t(count) * 4, "add input");
    check_device(out, uint64_t(count) * 4, "add output");
    CudaStreamState& st = stream(s);
    const Timed timed(*this, st);
    launch(add_cuda(a, out, count, st.stream), "add");
  }

  std::unique_ptr<ForwardOps> forward_ops(std::shared_ptr<const DenseWeights> weights,
                                          const ForwardOpsOptions& options) override;

 private:
  friend class CudaForwardOps;
  struct Event {
    cudaEvent_t event = nullptr;
    int stream = -1;  // -1: never recorded
  };
  CudaGraph& graph(GraphId g) {  // mu_ held
    if (g < 0 || g >= static_cast<GraphId>(graphs_.size()) ||
        graphs_[static_cast<size_t>(g)] == nullptr) {
      fail(ErrorKind::kInvalidArgument, "{}: unknown graph {}", name_, g);
    }
    return *graphs_[static_cast<size_t>(g)];
  }
  CudaStreamState& stream(StreamId s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (s < 0 || s >= static_cast<int>(streams_.size())) {
      fail(ErrorKind::kInvalidArgument, "{}: unknown stream {}", name_, s);
    }
    return *streams_[static_cast<size_t>(s)];
  }
  Event& event(EventId e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (e < 0 || e >= static_cast<int>(events_.size())) {
      fail(ErrorKind::kInvalidArgument, "{}: unknown event {}", name_, e);
    }
    return events_[static_cast<size_t>(e)];
  }

  void rethrow(CudaStreamState& st, StreamId s) {
    std::exception_ptr err;
    {
      std::lock_guard<std::mutex> lock(st.mu);
      err = std::exchange(st.error, {});
    }
    if (!err) return;
    try {
      std::rethrow_exception(err);
    } catch (const Error& e) {
      fail(e.kind(), "{} stream {}: host_callback: {}", name_, s, e.what());
    } catch (const std::exception& e) {
      fail(ErrorKind::kInternal, "{} stream {}: host_callback: {}", name_, s, e.what());
    }
  }

  // A copy's bytes for the timeline: now, or at each launch of the graph being captured.
  void count_bytes(CudaStreamState& st, bool h2d, uint64_t bytes) {
    if (st.capture != nullptr) {
      (h2d ? st.capture->h2d_bytes : st.capture->d2h_bytes) += bytes;
    } else if (timeline_ != nullptr) {
      timeline_->add_bytes(h2d, bytes);
    }
  }
  // Host pointers handed to device ops would fault in a kernel: reject them at the call.
  void check_device(const void* p, uint64_t bytes, const char* what) const {
    if (bytes == 0) return;
    cudaPointerAttributes a{};
    const cudaError_t err = cudaPointerGetAttributes(&a, p);
    if (err != cudaSuccess) cudaGetLastError();
    if (err != cudaSuccess || (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)) {
      fail(ErrorKind::kInvalidArgument, "{}: {} ({} bytes at {}) is not device memory", name_, what,
           bytes, p);
    }
  }

  void launch(cudaError_t err, const char* what) {
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail(err == cudaErrorInvalidValue ? ErrorKind::kInvalidArgument : ErrorKind::kInternal,
           "{}: {}: {}", name_, what, cudaGetErrorString(err));
    }
  }

  // The stream's scratch of at least `bytes` (a larger one replaces it once the stream is idle).
  // Outside the --vram-budget accounting: the budget leaves the GPU a tenth of its memory.
  float* scratch(CudaStreamState& st, uint64_t bytes) {
    return grow_scratch(st, &st.scratch, &st.scratch_bytes, bytes);
  }
  float* grow_scratch(CudaStreamState& st, void** p, uint64_t* have, uint64_t bytes) {
    if (*have < bytes) {
      TD_CUDA_CHECK(cudaStreamSynchronize(st.stream));
      TD_CUDA_CHECK(cudaFree(*p));
      *p = nullptr;
      *have = 0;
      const cudaError_t err = cudaMalloc(p, bytes);
      if (err != cudaSuccess) {
        cudaGetLastError();
        fail(ErrorKind::kResource, "{}: scratch of {} bytes: {}", name_, bytes,
             cudaGetErrorString(err));
      }
      *have = bytes;
      ++st.generation;
    }
    return static_cast<float*>(*p);
  }

  // w (device memory, its stored dtype) as the kernels take it.
  QuantMatrix quant_matrix(const ops::Weight& w) {
    check_device(w.t.data, 1, "weight");
    QuantMatrix q;
    q.type = w.t.dtype;
    q.data = w.t.data;
    q.row_bytes = w.t.row_bytes();
    q.rows = w.rows();
    q.cols = w.cols();
    if (w.scale_inv != nullptr) {
      if (w.row0 % w.block_rows != 0) {
        fail(ErrorKind::kUnsupported, "{}: an FP8 row view starting inside a scale block (row {})",
             name_, w.row0);
      }
      if (w.block_cols % 8 != 0) {
        fail(ErrorKind::kUnsupported, "{}: FP8 scale blocks {} columns wide (a multiple of 8 only)",
             name_, w.block_cols);
      }
      q.scale_inv = w.scale_inv + w.row0 / w.block_rows * w.scale_cols;
      q.scale_row_elems = w.scale_cols;
      q.block_rows = w.block_rows;
      q.block_cols = w.block_cols;
    }
    if (!cuda_can_matvec(q.type)) {
      fail(ErrorKind::kUnsupported, "{}: no CUDA kernel for {} weights", name_,
           dtype_info(q.type).name);
    }
    return q;
  }

  // q's rows as F32 rows of q.cols values at dst.
  void dequantize(const QuantMatrix& q, float* dst, CudaStreamState& st) {
    if (q.scale_inv != nullptr) {
      launch(dequantize_fp8_blocks_cuda(
                 static_cast<const uint8_t*>(q.data), q.row_bytes, q.scale_inv, q.scale_row_elems,
                 q.rows, q.cols, q.block_rows, q.block_cols, DType::kF32, dst, q.cols, st.stream),
             "dequantize FP8");
      return;
    }
    launch(dequantize_rows_cuda(q.type, q.data, q.row_bytes, q.rows, q.cols, DType::kF32, dst,
                                q.cols, st.stream),
           "dequantize");
  }

  // cuBLAS, or nullptr (said once) where its library is missing.
  const CublasApi* blas_api() {
    std::string why;
    const CublasApi* api = cublas_api(&why);
    if (api == nullptr) {
      static std::once_flag said;
      std::call_once(said, [&] {
        log_warn("{}: cuBLAS not loaded ({}): prefill products use tandem's own kernels", name_,
                 why);
      });
    }
    return api;
  }
  void blas(cublasStatus_t status, const char* what) {
    if (status != CUBLAS_STATUS_SUCCESS) {
      fail(ErrorKind::kInternal, "{}: cuBLAS {}: {}", name_, what,
           cublas_api()->status_string(status));
    }
  }

  // y [n, ldy] = x [n, ldx] w^T: a few tokens read w as stored (ops/cuda/matvec.h); many go
  // through cuBLAS SGEMM (FP32 arithmetic, no TF32: the CPU's numbers within F32 rounding) on w
  // dequantized to F32 a slice of rows at a time (F32 weights as they are).
  void product(const ops::Weight& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
               CudaStreamState& st) {
    const QuantMatrix q = quant_matrix(w);
    const CublasApi* cublas = n >= kGemmMinTokens ? blas_api() : nullptr;
    if (cublas == nullptr || q.rows == 0 || q.cols == 0) {
      launch(matmul_quant_cuda(q, x, ldx, n, y, ldy, st.stream), "matmul");
      return;
    }
    if (st.blas == nullptr) {
      blas(cublas->create(&st.blas), "create");
      blas(cublas->set_stream(st.blas, st.stream), "set stream");
    }
    const float one = 1.0f, zero = 0.0f;
    auto gemm = [&](const float* a, int64_t lda, int64_t rows, float* out) {
      // Column-major: out^T [rows, n] = a^T [rows, cols] . x^T [cols, n].
      blas(cublas->sgemm(st.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows),
                         static_cast<int>(n), static_cast<int>(q.cols), &one, a,
                         static_cast<int>(lda), x, static_cast<int>(ldx), &zero, out,
                         static_cast<int>(ldy)),
           "sgemm");
    };
    if (q.type == DType::kF32 && q.row_bytes % 4 == 0) {
      gemm(static_cast<const float*>(q.data), q.row_bytes / 4, q.rows, y);
      return;
    }
    int64_t slice = std::max<int64_t>(1, static_cast<int64_t>(kGemmSliceBytes) / (q.cols * 4));
    if (q.scale_inv != nullptr) slice = std::max(q.block_rows, slice / q.block_rows * q.block_rows);
    slice = std::min(slice, q.rows);
    float* wf =
        grow_scratch(st, &st.weights, &st.weights_bytes, static_cast<uint64_t>(slice * q.cols) * 4);
    for (int64_t r0 = 0; r0 < q.rows; r0 += slice) {
      QuantMatrix part = q;
      part.data = static_cast<const uint8_t*>(q.data) + r0 * q.row_bytes;
      part.rows = std::min(slice, q.rows - r0);
      if (q.scale_inv != nullptr) part.scale_inv += r0 / q.block_rows * q.scale_row_elems;
      dequantize(part, wf, st);
      gemm(wf, q.cols, part.rows, y + r0);
    }
  }

  // ---- the ops' spans for the Timeline's device lane (only while a timeline is set) ----
  // Two timing events around each op on its stream; a sync resolves the reached ones into host
  // time through an anchor event whose host time was read when it completed.
  class Timed {  // RAII: one op's span
   public:
    Timed(CudaDevice& d, CudaStreamState& s, double* seconds = nullptr) : d_(d), s_(s) {
      if (d.timeline_ != nullptr) span_ = d.span_start(s, seconds);
    }
    ~Timed() {
      if (span_.start != nullptr) d_.span_end(span_, s_);
    }
    Timed(const Timed&) = delete;
    Timed& operator=(const Timed&) = delete;

   private:
    CudaDevice& d_;
    CudaStreamState& s_;
    OpSpan span_;
  };
  // While the stream captures a graph the events are recorded by event nodes of the graph
  // (cudaEventRecordExternal) and its launches hand the spans to the timeline.
  OpSpan span_start(CudaStreamState& st, double* seconds) {
    std::lock_guard<std::mutex> lock(span_mu_);
    const bool graph = st.capture != nullptr;
    if (anchor_ == nullptr) {
      if (graph) return {};  // (no time base yet: the graph's ops untimed)
      TD_CUDA_CHECK(cudaEventCreate(&anchor_));
      TD_CUDA_CHECK(cudaEventRecord(anchor_, st.stream));
      TD_CUDA_CHECK(cudaEventSynchronize(anchor_));
      anchor_time_ = Timeline::Clock::now();
    }
    OpSpan p;
    if (!spans_free_.empty()) {
      p = spans_free_.back();
      spans_free_.pop_back();
    } else {
      TD_CUDA_CHECK(cudaEventCreate(&p.start));
      TD_CUDA_CHECK(cudaEventCreate(&p.end));
    }
    p.seconds = seconds;
    p.graph = graph;
    const cudaError_t err =
        cudaEventRecordWithFlags(p.start, st.stream, graph ? cudaEventRecordExternal : 0);
    if (err != cudaSuccess) {
      cudaGetLastError();
      spans_free_.push_back(p);
      if (graph) return {};
      TD_CUDA_CHECK(err);
    }
    return p;
  }
  void span_end(const OpSpan& p, CudaStreamState& st) {
    const cudaError_t err = cudaEventRecordWithFlags(  // (a destructor: no throw)
        p.end, st.stream, p.graph ? cudaEventRecordExternal : 0);
    std::lock_guard<std::mutex> lock(span_mu_);
    if (err != cudaSuccess) {
      cudaGetLastError();
      spans_free_.push_back(p);
      return;
    }
    if (p.graph) {
      st.capture->spans.push_back(p);
    } else {
      spans_pending_.push_back(p);
    }
  }
  // A copy of seconds the spans add to, read under their lock.
  ForwardOpsProfile span_seconds(const ForwardOpsProfile& seconds) {
    std::lock_guard<std::mutex> lock(span_mu_);
    return seconds;
  }
  // The reached spans into the timeline (and their ops' seconds); the rest wait for a later sync.
  void collect_spans() {
    std::lock_guard<std::mutex> lock(span_mu_);
    size_t keep = 0;
    for (const OpSpan& p : spans_pending_) {
      float a = 0, b = 0;
      if (cudaEventQuery(p.end) != cudaSuccess) {
        cudaGetLastError();
        spans_pending_[keep++] = p;
        continue;
      }
      if (cudaEventElapsedTime(&a, anchor_, p.start) != cudaSuccess ||
          cudaEventElapsedTime(&b, anchor_, p.end) != cudaSuccess) {
        cudaGetLastError();
        if (!p.graph) spans_pending_[keep++] = p;  // (a graph's: its next launch records again)
        continue;
      }
      const auto at = [&](float ms) {
        return anchor_time_ + std::chrono::duration_cast<Timeline::Clock::duration>(
                                  std::chrono::duration<double, std::milli>(ms));
      };
      if (timeline_ != nullptr) timeline_->add(Timeline::kDevice, at(a), at(b));
      if (p.seconds != nullptr) *p.seconds += (b - a) * 1e-3;
      if (!p.graph) spans_free_.push_back(p);
    }
    spans_pending_.resize(keep);
  }

  int index_;
  std::string name_;
  uint64_t capacity_ = 0, used_ = 0;
  mutable std::mutex mu_;
  std::map<void*, uint64_t> live_;
  std::vector<const void*> registered_;             // register_host's ranges
  std::vector<std::unique_ptr<CudaGraph>> graphs_;  // end_capture's, by GraphId
  std::mutex span_mu_;                              // the spans below and the seconds they add to
  cudaEvent_t anchor_ = nullptr;
  Timeline::Clock::time_point anchor_time_;
  std::vector<OpSpan> spans_free_, spans_pending_;
  std::vector<std::unique_ptr<CudaStreamState>> streams_;
  std::vector<Event> events_;
};

// The forward's ops on the GPU: each a kernel (or a few) on the ops' own stream, over the dense
// weights upload_dense_weights put in device memory (read as stored by ops/cuda/matvec.h's
// products), the small F32 vectors uploaded here, activations and the KV cache (F32, BF16 or
// F16) in device memory. RoPE's cos / sin per token come from ops::Rope on the
// host (the CPU's YaRN), the cache's write offsets and block tables from the KvCache on the host:
// stage() puts them, the token ids and each part's first position in pinned memory that the
// step's first copy brings over, so a graph of the step replays at new positions. MLA attends
// absorbed (W_UK / W_UV per head around attention over the latent cache).
class CudaForwardOps final : public DeviceForwardOps {
 public:
  CudaForwardOps(CudaDevice& dev, std::shared_ptr<const DenseWeights> w, const ForwardOpsOptions& o)
      : DeviceForwardOps(dev, std::move(w)),
        cuda_(dev),
        st_(dev.stream(stream_)),
        step_host_(&dev) {
    for (Buf** b : {&logits_, &head_in_, &step_dev_, &q_, &k_, &v_, &qa_, &qc_, &att_, &o_, &g_,
                    &u_, &scores_}) {
      *b = new_buf();
    }
    const LoadedModel& m = w_->weights;
    const ModelConfig& c = m.config;
    if (c.is_mla() && o.mla == MlaMode::kNaive) {
      fail(ErrorKind::kUnsupported,
           "{}: the CUDA forward ops attend MLA absorbed (--mla auto or "
           "absorbed), not naive",
           dev.name());
    }
    rope_ = ops::Rope(c.rope_dim, c.rope_theta, c.rope_scaling);
    neox_ = !(c.is_mla() || (c.arch == ModelArch::kMixtral && m.from_gguf));
    attn_scale_ = 1.0f / std::sqrt(static_cast<float>(c.head_dim)) * rope_.softmax_scale_factor();
    upload(m.out_norm);
    for (const LayerWeights& lw : m.layers) {
      for (const std::vector<float>* v :
           {&lw.attn_norm, &lw.ffn_norm, &lw.q_norm, &lw.k_norm, &lw.q_a_norm, &lw.kv_a_norm,
            &lw.bq, &lw.bk, &lw.bv, &lw.bo, &lw.sinks, &lw.router_logit_bias, &lw.sh_gate_inp}) {
        upload(*v);
      }
    }
  }
  ~CudaForwardOps() override {
    try {
      finish();  // (before the vectors the stream's work reads go)
    } catch (const std::exception& e) {
      log_warn("{} forward ops: {}", dev_.name(), e.what());
    }
    for (const auto& [h, d] : vecs_) dev_.free(d);
  }

  KvCacheOptions cache_options(KvCacheOptions o) const override {
    o = DeviceForwardOps::cache_options(o);
    o.copy = [](void* dst, const void* src, uint64_t bytes) {
      TD_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    };
    return o;
  }
  void check_cache(const KvCache& cache) const override {
    if (cache.type() == KvType::kQ8_0) {
      fail(ErrorKind::kUnsupported,
           "{}: the CUDA forward ops attend over an F32, BF16 or F16 KV cache "
           "(--cache-type f32 | bf16 | f16), not {}",
           dev_.name(), kv_type_name(cache.type()));
    }
    cuda_.check_device(cache.memory(), cache.bytes(),
                       "the KV cache (make it with "
                       "Model::cache_options)");
  }

  // What the step's kernels read that changes from step to step, in one pinned host area and one
  // device buffer of the same layout (a graph's replay copies it in): token ids, each part's
  // first position, RoPE's cos / sin per token, each token's cache rows (offsets from a layer's
  // base, the same in every layer) and each part's block table at a fixed stride (the most
  // blocks a sequence of the cache can have), so that sizes follow from the step's shape.
  void stage(const ForwardStep& step, KvCache& cache) override {
    step_ = step;
    cache_ = &cache;
    const int64_t n = step.n_tokens(), parts = static_cast<int64_t>(step.parts.size());
    const int64_t half = rope_.dim() / 2;
    const KvLayout l = cache.layout();
    ops::AttentionArgs a0;
    cache.attention_args(0, step.parts[0].seq, &a0);
    max_blocks_ = a0.blocks == nullptr ? 0
                                       : (cache.max_sequence_positions() + a0.block_positions - 1) /
                                             a0.block_positions;
    // Byte offsets of the sections, each 16-byte aligned.
    uint64_t at = 0;
    auto section = [&](uint64_t bytes) {
      const uint64_t o = at;
      at += (bytes + 15) / 16 * 16;
      return o;
    };
    const uint64_t o_tok = section(static_cast<uint64_t>(n) * 4);
    const uint64_t o_pos0 = section(static_cast<uint64_t>(parts) * 8);
    const uint64_t o_cs = section(static_cast<uint64_t>(2 * n * half) * 4);
    const int64_t nk = n * l.k_heads, nv = n * l.v_heads;
    const uint64_t o_ofs = section(static_cast<uint64_t>(nk + nv) * 8);
    const uint64_t o_blocks = section(static_cast<uint64_t>(parts * max_blocks_) * 4);
    step_bytes_ = at;
    auto* host = reinterpret_cast<uint8_t*>(host_step_floats(static_cast<int64_t>(at / 4)));
    auto* dev = reinterpret_cast<uint8_t*>(grow(step_dev_, static_cast<int64_t>(at / 4)));
    host_step_ = host;
    std::copy(step.tokens.begin(), step.tokens.end(), reinterpret_cast<int32_t*>(host + o_tok));
    auto* pos0 = reinterpret_cast<int64_t*>(host + o_pos0);
    auto* cs = reinterpret_cast<float*>(host + o_cs);
    for (int64_t t = 0; t < n; ++t) rope_.angles(step.pos[t], cs + t * half, cs + (n + t) * half);
    auto* ofs = reinterpret_cast<int64_t*>(host + o_ofs);
    auto* blocks = reinterpret_cast<int32_t*>(host + o_blocks);
    for (int64_t i = 0; i < parts; ++i) {
      const ForwardStep::Part& p = step.parts[static_cast<size_t>(i)];
      pos0[i] = p.pos0;
      ops::AttentionArgs a;
      cache.attention_args(0, p.seq, &a);
      if (a.blocks != nullptr) {
        const int64_t nb = (p.pos0 + p.n + a.block_positions - 1) / a.block_positions;
        std::copy(a.blocks, a.blocks + nb, blocks + i * max_blocks_);
        std::fill(blocks + i * max_blocks_ + nb, blocks + (i + 1) * max_blocks_, 0);
      }
      for (int64_t t = p.t0; t < p.t0 + p.n; ++t) {
        for (int64_t h = 0; h < l.k_heads; ++h) {
          ofs[t * l.k_heads + h] = ops::k_offset(a, step.pos[t]) + h * ops::k_head_stride(a);
        }
        for (int64_t h = 0; h < l.v_heads; ++h) {
          ofs[nk + t * l.v_heads + h] = ops::v_offset(a, step.pos[t]) + h * ops::v_head_stride(a);
        }
      }
    }
    tok_dev_ = reinterpret_cast<const int32_t*>(dev + o_tok);
    pos0_dev_ = reinterpret_cast<const int64_t*>(dev + o_pos0);
    cs_dev_ = reinterpret_cast<const float*>(dev + o_cs);
    k_ofs_ = reinterpret_cast<const int64_t*>(dev + o_ofs);
    v_ofs_ = k_ofs_ + nk;
    blocks_dev_ = reinterpret_cast<const int32_t*>(dev + o_blocks);
    step_dev_bytes_ = dev;
  }
  void upload_step() override { dev_.copy_h2d(step_dev_bytes_, host_step_, step_bytes_, stream_); }
  uint64_t memory_epoch() const override {
    return DeviceForwardOps::memory_epoch() + st_.generation;
  }
  void embed(float* x) override {
    const CudaDevice::Timed timed(cuda_, st_);
    const LoadedModel& m = w_->weights;
    const int64_t hd = m.config.hidden_size;
    run(gather_rows_cuda(m.embed.dtype, m.embed.data, m.embed.row_bytes(), tok_dev_,
                         step_.n_tokens(), hd, x, hd, st_.stream),
        "embedding");
  }
  void norm(Norm which, int64_t layer, const float* x, int64_t n, float* out) override {
    const CudaDevice::Timed timed(cuda_, st_);
    const LayerWeights& lw = w_->weights.layers[layer];
    const ModelConfig& c = w_->weights.config;
    const float* g = vec(which == Norm::kAttention ? lw.attn_norm : lw.ffn_norm);
    run(rms_norm_cuda(x, c.hidden_size, g, n, c.hidden_size, c.rms_norm_eps, out, c.hidden_size,
                      st_.stream),
        "norm");
  }
  void add(float* out, const float* a, int64_t count) override {
    const CudaDevice::Timed timed(cuda_, st_);
    run(add_cuda(a, out, count, st_.stream), "add");
  }
  void fill_zero(float* out, int64_t count) override {
    TD_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(count) * 4, st_.stream));
  }
  void attention(int64_t layer, const float* x, float* out) override {
    const CudaDevice::Timed timed(cuda_, st_, &seconds_.attention);
    if (w_->weights.config.is_mla()) {
      attention_mla(layer, x, out);
    } else {
      attention_mha(layer, x, out);
    }
  }
  void dense_ffn(int64_t layer, const float* x, int64_t n, float* out) override {
    const CudaDevice::Timed timed(cuda_, st_);
    const LayerWeights& lw = w_->weights.layers[layer];
    swiglu(lw.ffn_gate, lw.ffn_up, lw.ffn_down, x, n, out);
  }
  void shared_ffn(int64_t layer, const float* x, int64_t n, float* out) override {
    TD_CHECK(w_->shared_experts,
             "CUDA forward ops: the shared experts were not uploaded (the MoE backend computes "
             "them)");
    const CudaDevice::Timed timed(cuda_, st_);
    const LayerWeights& lw = w_->weights.layers[layer];
    const int64_t hd = w_->weights.config.hidden_size;
    if (lw.sh_gate.empty()) {
      fill_zero(out, n * hd);
      return;
    }
    swiglu(lw.sh_gate, lw.sh_up, lw.sh_down, x, n, out);
    if (!lw.sh_gate_inp.empty()) {
      run(sigmoid_gate_rows_cuda(x, vec(lw.sh_gate_inp), n, hd, out, st_.stream), "shared gate");
    }
  }
  void router(int64_t layer, const float* x, int64_t n, float* logits) override {
    const CudaDevice::Timed timed(cuda_, st_);
    const LayerWeights& lw = w_->weights.layers[layer];
    const ModelConfig& c = w_->weights.config;
    mm(lw.router, x, c.hidden_size, n, logits, c.n_experts);
    if (!lw.router_logit_bias.empty()) {
      run(scale_rows_cuda(logits, n, c.n_experts, vec(lw.router_logit_bias), nullptr, logits, false,
                          st_.stream),
          "router bias");
    }
  }
  const float* logits_rows(const std::vector<int64_t>& row_ids, const float* x) override {
    const LoadedModel& m = w_->weights;
    const ModelConfig& c = m.config;
    const int64_t hd = c.hidden_size, rows = static_cast<int64_t>(row_ids.size());
    float* h = grow(head_in_, rows * hd);
    const CudaDevice::Timed timed(cuda_, st_, &seconds_.lm_head);
    for (int64_t j = 0; j < rows; ++j) {
      run(rms_norm_cuda(x + row_ids[j] * hd, hd, vec(m.out_norm), 1, hd, c.rms_norm_eps, h + j * hd,
                        hd, st_.stream),
          "final norm");
    }
    float* d = grow(logits_, rows * c.vocab_size);
    mm(m.lm_head, h, hd, rows, d, c.vocab_size);
    return d;
  }
  // The attention and lm_head spans collected so far (with a timeline set: tandem bench).
  ForwardOpsProfile profile() const override { return cuda_.span_seconds(seconds_); }

 private:
  void run(cudaError_t err, const char* what) { cuda_.launch(err, what); }
  bool capturing() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    TD_CUDA_CHECK(cudaStreamIsCapturing(st_.stream, &status));
    return status != cudaStreamCaptureStatusNone;
  }
  // The pinned host area stage() fills (grown like the buffers: memory a graph reads).
  float* host_step_floats(int64_t count) {
    const float* before = step_host_.floats(0);
    float* p = step_host_.floats(count);
    if (p != before) moved();
    return p;
  }
  void upload(const std::vector<float>& v) {
    if (v.empty() || vecs_.count(v.data()) > 0) return;
    auto* d = static_cast<float*>(dev_.alloc(v.size() * 4));
    TD_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    vecs_[v.data()] = d;
  }
  const float* vec(const std::vector<float>& v) const {
    const auto it = vecs_.find(v.data());
    TD_CHECK(it != vecs_.end(), "CUDA forward ops: a vector was not uploaded");
    return it->second;
  }
  // y [n, ldy] = x [n, ldx] W^T, W read as stored.
  void mm(const ops::Weight& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy) {
    cuda_.product(w, x, ldx, n, y, ldy, st_);
  }
  void swiglu(const ops::Weight& gw, const ops::Weight& uw, const ops::Weight& dw, const float* x,
              int64_t n, float* out) {
    const int64_t hd = gw.cols(), ff = gw.rows();
    float* g = grow(g_, n * ff);
    float* u = grow(u_, n * ff);
    mm(gw, x, hd, n, g, ff);
    mm(uw, x, hd, n, u, ff);
    run(glu_cuda(g, u, n, ff, nullptr, nullptr, 0.0f, ops::kSwigluOaiAlpha, st_.stream), "swiglu");
    mm(dw, g, ff, n, out, dw.rows());
  }
  void bias(float* x, int64_t n, int64_t cols, const std::vector<float>& b) {
    if (!b.empty()) {
      run(scale_rows_cuda(x, n, cols, vec(b), nullptr, x, false, st_.stream), "bias");
    }
  }
  // Attention of each part over its cache rows; args' q / out / heads / dims set by `fill`.
  template <typename F>
  void attend(int64_t layer, F&& fill) {
    for (size_t i = 0; i < step_.parts.size(); ++i) {
      const ForwardStep::Part& p = step_.parts[i];
      ops::AttentionArgs a;
      cache_->attention_args(layer, p.seq, &a);
      if (a.blocks != nullptr) a.blocks = blocks_dev_ + static_cast<int64_t>(i) * max_blocks_;
      a.n_tokens = p.n;
      a.pos0 = p.pos0;
      a.scale = attn_scale_;
      fill(p, a);
      const int64_t nf = attention_scratch_floats(a);
      float* sc = grow(scores_, nf);
      // The split kernels read the part's first position from the staged step (a graph's replay
      // then attends at the new positions); the others take it as a parameter, which a graph
      // would keep: no graph of them.
      const bool splits = attention_cuda_splits(a);
      if (!splits && capturing()) {
        fail(ErrorKind::kUnsupported,
             "{}: attention of {} tokens, dk {}, dv {} takes its positions as parameters",
             dev_.name(), a.n_tokens, a.dk, a.dv);
      }
      run(attention_cuda(a, sc, nf, st_.stream, splits ? pos0_dev_ + i : nullptr), "attention");
    }
  }

  // Rows [rows, d] (stride d) into layer l's keys (or values) at the offsets begin() uploaded.
  void write_cache(int64_t l, bool values, const int64_t* offsets, int64_t rows, const float* src,
                   int64_t d, const char* what) {
    ops::AttentionArgs base;
    cache_->attention_args(l, step_.parts[0].seq, &base);
    const void* dst = values ? (base.v != nullptr ? static_cast<const void*>(base.v) : base.v16)
                             : (base.k != nullptr ? static_cast<const void*>(base.k) : base.k16);
    const DType type = cache_->type() == KvType::kF32    ? DType::kF32
                       : cache_->type() == KvType::kBf16 ? DType::kBF16
                                                         : DType::kF16;
    run(kv_write_cuda(type, const_cast<void*>(dst), offsets, rows, src, d, d, st_.stream), what);
  }

  void attention_mha(int64_t l, const float* x, float* out) {
    const LayerWeights& lw = w_->weights.layers[l];
    const ModelConfig& c = w_->weights.config;
    const int64_t n = step_.n_tokens(), hd = c.hidden_size, d = c.head_dim;
    const int64_t nq = c.num_heads, nkv = c.num_kv_heads, half = rope_.dim() / 2;
    float* q = grow(q_, n * nq * d);
    float* k = grow(k_, n * nkv * d);
    float* v = grow(v_, n * nkv * d);
    mm(lw.wq, x, hd, n, q, nq * d);
    mm(lw.wk, x, hd, n, k, nkv * d);
    mm(lw.wv, x, hd, n, v, nkv * d);
    bias(q, n, nq * d, lw.bq);
    bias(k, n, nkv * d, lw.bk);
    bias(v, n, nkv * d, lw.bv);
    if (c.qk_norm_all_heads) {
      run(rms_norm_cuda(q, nq * d, vec(lw.q_norm), n, nq * d, c.rms_norm_eps, q, nq * d,
                        st_.stream),
          "q norm");
      run(rms_norm_cuda(k, nkv * d, vec(lw.k_norm), n, nkv * d, c.rms_norm_eps, k, nkv * d,
                        st_.stream),
          "k norm");
    } else if (!lw.q_norm.empty()) {
      run(rms_norm_cuda(q, d, vec(lw.q_norm), n * nq, d, c.rms_norm_eps, q, d, st_.stream),
          "q norm");
      run(rms_norm_cuda(k, d, vec(lw.k_norm), n * nkv, d, c.rms_norm_eps, k, d, st_.stream),
          "k norm");
    }
    const float* cs = cs_dev_;
    run(rope_cuda(q, n, nq * d, nq, d, 0, rope_.dim(), cs, cs + n * half, neox_, st_.stream),
        "rope q");
    run(rope_cuda(k, n, nkv * d, nkv, d, 0, rope_.dim(), cs, cs + n * half, neox_, st_.stream),
        "rope k");
    write_cache(l, false, k_ofs_, n * nkv, k, d, "cache keys");
    write_cache(l, true, v_ofs_, n * nkv, v, d, "cache values");
    float* att = grow(att_, n * nq * d);
    const float* sinks = lw.sinks.empty() ? nullptr : vec(lw.sinks);
    attend(l, [&](const ForwardStep::Part& p, ops::AttentionArgs& a) {
      a.q = q + p.t0 * nq * d;
      a.q_stride = nq * d;
      a.n_heads = nq;
      a.n_kv_heads = nkv;
      a.dk = a.dv = d;
      if (c.is_swa_layer(l)) a.window = c.sliding_window;
      a.sinks = sinks;
      a.out = att + p.t0 * nq * d;
    });
    mm(lw.wo, att, nq * d, n, out, hd);
    bias(out, n, hd, lw.bo);
  }

  void attention_mla(int64_t l, const float* x, float* out) {
    const LayerWeights& lw = w_->weights.layers[l];
    const ModelConfig& c = w_->weights.config;
    const int64_t n = step_.n_tokens(), hd = c.hidden_size;
    const int64_t nope = c.qk_nope_head_dim, rd = c.qk_rope_head_dim, kvl = c.kv_lora_rank;
    const int64_t vd = c.v_head_dim, nh = c.num_heads, qk = nope + rd, kr = kvl + rd;
    const int64_t half = rope_.dim() / 2;
    float* q = grow(q_, n * nh * qk);
    float* kv = grow(k_, n * kr);
    if (!lw.wq_a.empty()) {
      float* qa = grow(qa_, n * c.q_lora_rank);
      mm(lw.wq_a, x, hd, n, qa, c.q_lora_rank);
      run(rms_norm_cuda(qa, c.q_lora_rank, vec(lw.q_a_norm), n, c.q_lora_rank, c.rms_norm_eps, qa,
                        c.q_lora_rank, st_.stream),
          "q_a norm");
      mm(lw.wq_b, qa, c.q_lora_rank, n, q, nh * qk);
    } else {
      mm(lw.wq, x, hd, n, q, nh * qk);
    }
    mm(lw.wkv_a, x, hd, n, kv, kr);
    run(rms_norm_cuda(kv, kr, vec(lw.kv_a_norm), n, kvl, c.rms_norm_eps, kv, kr, st_.stream),
        "kv_a norm");
    const float* cs = cs_dev_;
    run(rope_cuda(kv, n, kr, 1, kr, kvl, rope_.dim(), cs, cs + n * half, neox_, st_.stream),
        "rope k");
    run(rope_cuda(q, n, nh * qk, nh, qk, nope, rope_.dim(), cs, cs + n * half, neox_, st_.stream),
        "rope q");
    write_cache(l, false, k_ofs_, n, kv, kr, "cache latents");
    // q_cat per head: W_UK^T q_nope (kv_lora values), then q_pe.
    float* qc = grow(qc_, n * nh * kr);
    for (int64_t h = 0; h < nh; ++h) {
      const ops::Weight& wk = lw.k_up[static_cast<size_t>(h)];
      if (lw.k_up_transposed) {  // [kv_lora, qk_nope]
        mm(wk, q + h * qk, nh * qk, n, qc + h * kr, nh * kr);
      } else {  // [qk_nope, kv_lora], dequantized for the transposed product
        float* wf = cuda_.scratch(st_, static_cast<uint64_t>(wk.rows() * wk.cols()) * 4);
        cuda_.dequantize(cuda_.quant_matrix(wk), wf, st_);
        run(matmul_t_f32_cuda(wf, nope, kvl, q + h * qk, nh * qk, n, qc + h * kr, nh * kr,
                              st_.stream),
            "W_UK");
      }
      TD_CUDA_CHECK(cudaMemcpy2DAsync(qc + h * kr + kvl, static_cast<size_t>(nh * kr) * 4,
                                      q + h * qk + nope, static_cast<size_t>(nh * qk) * 4,
                                      static_cast<size_t>(rd) * 4, static_cast<size_t>(n),
                                      cudaMemcpyDeviceToDevice, st_.stream));
    }
    float* att = grow(att_, n * nh * kvl);
    attend(l, [&](const ForwardStep::Part& p, ops::AttentionArgs& a) {
      a.q = qc + p.t0 * nh * kr;
      a.q_stride = nh * kr;
      a.n_heads = nh;
      a.n_kv_heads = 1;
      a.dk = kr;
      a.dv = kvl;
      a.out = att + p.t0 * nh * kvl;
    });
    float* o = grow(o_, n * nh * vd);
    for (int64_t h = 0; h < nh; ++h) {
      const ops::Weight& wv = lw.v_up[static_cast<size_t>(h)];  // [v_head, kv_lora]
      mm(wv, att + h * kvl, nh * kvl, n, o + h * vd, nh * vd);
    }
    mm(lw.wo, o, nh * vd, n, out, hd);
  }

  CudaDevice& cuda_;
  CudaStreamState& st_;
  ForwardOpsProfile seconds_;  // added to by the collected spans (CudaDevice::span_mu_)
  ops::Rope rope_;
  bool neox_ = true;
  float attn_scale_ = 1.0f;
  std::map<const float*, float*> vecs_;  // host vector -> its device copy
  ForwardStep step_;
  KvCache* cache_ = nullptr;
  // The staged step (stage()): the pinned host area, the device buffer it is copied into, and
  // the sections' device pointers.
  HostStaging step_host_;
  uint8_t* host_step_ = nullptr;
  void* step_dev_bytes_ = nullptr;
  uint64_t step_bytes_ = 0;
  int64_t max_blocks_ = 0;  // block table entries per part
  const int32_t* tok_dev_ = nullptr;
  const int64_t* pos0_dev_ = nullptr;
  const float* cs_dev_ = nullptr;
  const int64_t* k_ofs_ = nullptr;
  const int64_t* v_ofs_ = nullptr;
  const int32_t* blocks_dev_ = nullptr;
  Buf *logits_, *head_in_, *step_dev_, *q_, *k_, *v_, *qa_, *qc_, *att_, *o_, *g_, *u_, *scores_;
};

std::unique_ptr<ForwardOps> CudaDevice::forward_ops(std::shared_ptr<const DenseWeights> weights,
                                                    const ForwardOpsOptions& options) {
  if (&weights->device() != this) {
    fail(ErrorKind::kInvalidArgument, "{}: forward ops over another device's weights", name_);
  }
  return std::make_unique<CudaForwardOps>(*this, std::move(weights), options);
}

}  // namespace

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& o) {
  return std::make_unique<CudaDevice>(o);
}

}  // namespace tandem::rt

#else

namespace tandem::rt {

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions&) {
  fail(ErrorKind::kUnsupported,
       "--accel cuda: this build has no CUDA (nvcc was not found when "
       "it was configured); --accel host emulates an accelerator");
}

}  // namespace tandem::rt

#endif
