// The CUDA device's class (runtime/cuda_device.cpp: what it is; docs/device.md), shared with its
// forward ops (runtime/cuda_forward_ops.cpp), which use its streams' state, its products and its
// op timing. Included only by those two files, in a build with CUDA.
// Not yet run on a GPU: it builds here (sm_80 to sm_90a), and its `gpu` tests skip without a
// device (docs/device.md, "The CUDA device").
#pragma once

#ifndef TANDEM_HAVE_CUDA
#error "runtime/cuda_device_impl.h needs a build with CUDA"
#endif

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "core/log.h"
#include "core/trace_events.h"
#include "model/kv_cache.h"
#include "ops/cpu/ref_ops.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/cublas_api.h"
#include "ops/cuda/cuda_util.h"
#include "ops/cuda/dense.h"
#include "ops/cuda/dequant.h"
#include "ops/cuda/matvec.h"
#include "runtime/block_pool.h"
#include "runtime/dense_weights.h"
#include "runtime/device_forward_ops.h"
#include "runtime/timeline.h"

namespace tandem::rt::cuda_detail {

struct CudaGraph;

struct CudaStreamState {
  cudaStream_t stream = nullptr;
  int id = 0;  // its StreamId
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

// One op's span for the timeline and the trace: timing events recorded before and after it on
// its stream.
struct OpSpan {
  cudaEvent_t start = nullptr, end = nullptr;
  double* seconds = nullptr;  // also added here (the forward ops' profile), when set
  bool graph = false;         // a graph's: recorded by its event nodes at every launch
  const char* name = "op";    // (a string literal)
  bool compute = true;        // a kernel (the timeline's device lane), else a copy
  int stream = 0;             // the stream it ran on (its trace track)
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
  explicit CudaDevice(const CudaDeviceOptions& o);

  ~CudaDevice() override;

  std::string name() const override { return name_; }
  uint64_t memory_capacity() const override { return pool_->capacity(); }
  uint64_t memory_used() const override;

  // Device memory through the caching pool (runtime/block_pool.h): a freed block serves a later
  // request of about its size without cudaMalloc / cudaFree.
  void* alloc(uint64_t bytes) override;
  void free(void* p) override;

  void* alloc_host(uint64_t bytes) override;
  void free_host(void* p) override;
  bool register_host(const void* p, uint64_t bytes, std::string* why) override;
  void unregister_host(const void* p) override;

  StreamId create_stream() override;

  EventId create_event() override;

  void record(EventId e, StreamId s) override;
  void wait_event(StreamId s, EventId e) override;
  bool query(EventId e) override;
  void sync_event(EventId e) override;
  void sync_stream(StreamId s) override;

  void copy_h2d(void* dst, const void* src, uint64_t bytes, StreamId s) override;
  void copy_d2h(void* dst, const void* src, uint64_t bytes, StreamId s) override;

  void host_callback(StreamId s, std::function<void()> fn) override;

  void begin_capture(StreamId s) override;
  GraphId end_capture(StreamId s) override;
  void launch_graph(GraphId g, StreamId s) override;
  void destroy_graph(GraphId g) override;

  void ffn(StreamId s, const DeviceFfnWeights& w, const float* x, int64_t n, const float* scale,
           float* out, bool accumulate) override;

  void matmul(StreamId s, const ops::Weight& w, const float* x, int64_t n, float* y) override;

  void add(StreamId s, const float* a, float* out, int64_t count) override;

  std::unique_ptr<ForwardOps> forward_ops(std::shared_ptr<const DenseWeights> weights,
                                          const ForwardOpsOptions& options) override;

 private:
  friend class CudaForwardOps;
  struct Event {
    cudaEvent_t event = nullptr;
    int stream = -1;  // -1: never recorded
  };
  CudaGraph& graph(GraphId g);  // mu_ held
  CudaStreamState& stream(StreamId s);
  Event& event(EventId e);

  void rethrow(CudaStreamState& st, StreamId s);

  // A copy's bytes for the timeline: now, or at each launch of the graph being captured.
  void count_bytes(CudaStreamState& st, bool h2d, uint64_t bytes);
  // Host pointers handed to device ops would fault in a kernel: reject them at the call.
  void check_device(const void* p, uint64_t bytes, const char* what) const;

  void launch(cudaError_t err, const char* what);

  // The stream's scratch of at least `bytes` (a larger one replaces it once the stream is idle).
  // Outside the --vram-budget accounting: the budget leaves the GPU a tenth of its memory.
  float* scratch(CudaStreamState& st, uint64_t bytes);
  float* grow_scratch(CudaStreamState& st, void** p, uint64_t* have, uint64_t bytes);

  // w (device memory, its stored dtype) as the kernels take it.
  QuantMatrix quant_matrix(const ops::Weight& w);

  // q's rows as F32 rows of q.cols values at dst.
  void dequantize(const QuantMatrix& q, float* dst, CudaStreamState& st);

  // cuBLAS, or nullptr (said once) where its library is missing.
  const CublasApi* blas_api();
  void blas(cublasStatus_t status, const char* what);

  // y [n, ldy] = x [n, ldx] w^T: a few tokens read w as stored (ops/cuda/matvec.h); many go
  // through cuBLAS: BF16 weights as stored on tensor cores (three products with the activations'
  // BF16 parts), the others by SGEMM (FP32 arithmetic, no TF32) on w dequantized to F32 a slice of
  // rows at a time (F32 weights as they are); the CPU's numbers within F32 rounding either way.
  void product(const ops::Weight& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
               CudaStreamState& st);

  // ---- the ops' spans for the Timeline's device lane and the trace (only while a timeline is
  // set or a trace records) ----
  // Two timing events around each op on its stream; a sync resolves the reached ones into host
  // time through an anchor event whose host time was read when it completed.
  class Timed {  // RAII: one op's span (name: a string literal)
   public:
    Timed(CudaDevice& d, CudaStreamState& s, const char* name, double* seconds = nullptr,
          bool compute = true)
        : d_(d), s_(s) {
      if ((compute && d.timeline_ != nullptr) || trace::recording()) {
        span_ = d.span_start(s, seconds);
        span_.name = name;
        span_.compute = compute;
      }
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
  OpSpan span_start(CudaStreamState& st, double* seconds);
  void span_end(const OpSpan& p, CudaStreamState& st);
  // A copy of seconds the spans add to, read under their lock.
  ForwardOpsProfile span_seconds(const ForwardOpsProfile& seconds);
  // The reached spans into the timeline (and their ops' seconds); the rest wait for a later sync.
  void collect_spans();

  int index_;
  std::string name_;
  std::optional<BlockPool> pool_;  // device memory (mu_)
  mutable std::mutex mu_;
  std::vector<const void*> registered_;             // register_host's ranges
  std::vector<std::unique_ptr<CudaGraph>> graphs_;  // end_capture's, by GraphId
  std::mutex span_mu_;                              // the spans below and the seconds they add to
  cudaEvent_t anchor_ = nullptr;
  Timeline::Clock::time_point anchor_time_;
  std::vector<OpSpan> spans_free_, spans_pending_;
  std::vector<std::unique_ptr<CudaStreamState>> streams_;
  std::vector<Event> events_;
};

// The forward ops over `weights` on dev (runtime/cuda_forward_ops.cpp).
std::unique_ptr<ForwardOps> make_cuda_forward_ops(CudaDevice& dev,
                                                  std::shared_ptr<const DenseWeights> weights,
                                                  const ForwardOpsOptions& options);

}  // namespace tandem::rt::cuda_detail
