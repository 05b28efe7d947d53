// The CUDA device (runtime/device.h's contract on a GPU; docs/device.md): streams are
// cudaStream_t, events cudaEvent_t, host callbacks cudaLaunchHostFunc, host staging memory
// pinned (cudaHostAlloc); device memory comes from cudaMalloc through a caching pool
// (runtime/block_pool.h) under a byte budget it accounts (--vram-budget, else 90% of the memory
// free at start). Ops: an expert FFN and a matmul read
// the weights as stored (ops/cuda/matvec.h), with the F32 kernels of ops/cuda/dense.h for the
// activation and the output; intermediates live in a per-stream scratch. The class is declared
// in runtime/cuda_device_impl.h (its forward ops, runtime/cuda_forward_ops.cpp, use it) and
// defined here; the forward ops run the dense part on the GPU with the kernels of
// ops/cuda/attention.h and dense.h.
// Not yet run on a GPU: it builds here (sm_80 to sm_90a), and its `gpu` tests skip without a
// device (docs/device.md, "The CUDA device").
#include "core/error.h"
#include "runtime/device.h"

#ifdef TANDEM_HAVE_CUDA

#include "runtime/cuda_device_impl.h"

namespace tandem::rt {

namespace cuda_detail {

CudaDevice::CudaDevice(const CudaDeviceOptions& o) : index_(o.index) {
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
  const int index = index_;
  BlockPool::Raw raw;
  raw.alloc = [index](uint64_t bytes, std::string* why) -> void* {
    void* p = nullptr;
    cudaError_t err = cudaSetDevice(index);
    if (err == cudaSuccess) err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      *why = fmt::format("cudaMalloc: {}", cudaGetErrorString(err));
      return nullptr;
    }
    return p;
  };
  raw.free = [](void* p) { cudaFree(p); };
  pool_.emplace(o.memory_bytes > 0 ? o.memory_bytes : usable, std::move(raw), name_,
                "--vram-budget");
  create_stream();  // stream 0
}

CudaDevice::~CudaDevice() {
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
  pool_.reset();  // (device memory back to CUDA)
  for (const void* p : registered_) cudaHostUnregister(const_cast<void*>(p));
}

uint64_t CudaDevice::memory_used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pool_->used();
}

void* CudaDevice::alloc(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return pool_->alloc(bytes);
}

void CudaDevice::free(void* p) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  pool_->free(p);
}

void* CudaDevice::alloc_host(uint64_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, std::max<uint64_t>(bytes, 1), cudaHostAllocDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail(ErrorKind::kResource, "{}: pinned host memory of {} bytes: {}", name_, bytes,
         cudaGetErrorString(err));
  }
  return p;
}

void CudaDevice::free_host(void* p) {
  if (p != nullptr) TD_CUDA_CHECK(cudaFreeHost(p));
}

bool CudaDevice::register_host(const void* p, uint64_t bytes, std::string* why) {
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

void CudaDevice::unregister_host(const void* p) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = std::find(registered_.begin(), registered_.end(), p);
    if (it == registered_.end()) {
      fail(ErrorKind::kInvalidArgument, "{}: unregister_host of {} which is not registered", name_,
           p);
    }
    registered_.erase(it);
  }
  TD_CUDA_CHECK(cudaHostUnregister(const_cast<void*>(p)));
}

StreamId CudaDevice::create_stream() {
  std::lock_guard<std::mutex> lock(mu_);
  TD_CUDA_CHECK(cudaSetDevice(index_));
  auto s = std::make_unique<CudaStreamState>();
  TD_CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  s->id = static_cast<int>(streams_.size());
  streams_.push_back(std::move(s));
  return static_cast<StreamId>(streams_.size() - 1);
}

EventId CudaDevice::create_event() {
  std::lock_guard<std::mutex> lock(mu_);
  TD_CUDA_CHECK(cudaSetDevice(index_));
  Event e;
  TD_CUDA_CHECK(cudaEventCreateWithFlags(&e.event, cudaEventDisableTiming));
  events_.push_back(e);
  return static_cast<EventId>(events_.size() - 1);
}

void CudaDevice::record(EventId e, StreamId s) {
  Event& ev = event(e);
  TD_CUDA_CHECK(cudaEventRecord(ev.event, stream(s).stream));
  ev.stream = s;
}

void CudaDevice::wait_event(StreamId s, EventId e) {
  const Event& ev = event(e);
  if (ev.stream < 0) return;  // never recorded: no wait
  TD_CUDA_CHECK(cudaStreamWaitEvent(stream(s).stream, ev.event, 0));
}

bool CudaDevice::query(EventId e) {
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

void CudaDevice::sync_event(EventId e) {
  const Event& ev = event(e);
  if (ev.stream < 0) return;
  TD_CUDA_CHECK(cudaEventSynchronize(ev.event));
  collect_spans();
  rethrow(stream(ev.stream), ev.stream);
}

void CudaDevice::sync_stream(StreamId s) {
  CudaStreamState& st = stream(s);
  TD_CUDA_CHECK(cudaStreamSynchronize(st.stream));
  collect_spans();
  rethrow(st, s);
}

void CudaDevice::copy_h2d(void* dst, const void* src, uint64_t bytes, StreamId s) {
  check_device(dst, bytes, "copy_h2d destination");
  CudaStreamState& st = stream(s);
  count_bytes(st, true, bytes);
  const Timed timed(*this, st, "copy host to device", nullptr, /*compute=*/false);
  TD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st.stream));
}

void CudaDevice::copy_d2h(void* dst, const void* src, uint64_t bytes, StreamId s) {
  check_device(src, bytes, "copy_d2h source");
  CudaStreamState& st = stream(s);
  count_bytes(st, false, bytes);
  const Timed timed(*this, st, "copy device to host", nullptr, /*compute=*/false);
  TD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st.stream));
}

void CudaDevice::host_callback(StreamId s, std::function<void()> fn) {
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

void CudaDevice::begin_capture(StreamId s) {
  CudaStreamState& st = stream(s);
  if (st.capture != nullptr) {
    fail(ErrorKind::kInvalidArgument, "{}: stream {} is capturing", name_, s);
  }
  TD_CUDA_CHECK(cudaStreamBeginCapture(st.stream, cudaStreamCaptureModeThreadLocal));
  st.capture = std::make_unique<CudaGraph>();
}

CudaDevice::GraphId CudaDevice::end_capture(StreamId s) {
  CudaStreamState& st = stream(s);
  if (st.capture == nullptr) {
    fail(ErrorKind::kInvalidArgument, "{}: end_capture of stream {}, which is not capturing", name_,
         s);
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

void CudaDevice::launch_graph(GraphId g, StreamId s) {
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
  }
  if (timeline_ != nullptr || trace::recording()) {
    for (OpSpan& p : spans) p.stream = st.id;
    std::lock_guard<std::mutex> lock(span_mu_);
    spans_pending_.insert(spans_pending_.end(), spans.begin(), spans.end());
  }
}

void CudaDevice::destroy_graph(GraphId g) {
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

void CudaDevice::ffn(StreamId s, const DeviceFfnWeights& w, const float* x, int64_t n,
                     const float* scale, float* out, bool accumulate) {
  check_ffn_args(
      name_, w, x, n, scale, out,
      [this](const void* p, uint64_t bytes, const char* what) { check_device(p, bytes, what); });
  if (n == 0) return;
  const int64_t H = w.gate.cols(), ff = w.gate.rows(), out_cols = w.down.rows();
  const ops::FfnExtras& e = w.extras;
  CudaStreamState& st = stream(s);
  const Timed timed(*this, st, "expert FFN");
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

void CudaDevice::matmul(StreamId s, const ops::Weight& w, const float* x, int64_t n, float* y) {
  check_device(x, uint64_t(n * w.cols()) * 4, "matmul input");
  check_device(y, uint64_t(n * w.rows()) * 4, "matmul output");
  CudaStreamState& st = stream(s);
  const Timed timed(*this, st, "matmul");
  product(w, x, w.cols(), n, y, w.rows(), st);
}

void CudaDevice::add(StreamId s, const float* a, float* out, int64_t count) {
  check_device(a, uint64_t(count) * 4, "add input");
  check_device(out, uint64_t(count) * 4, "add output");
  CudaStreamState& st = stream(s);
  const Timed timed(*this, st, "add");
  launch(add_cuda(a, out, count, st.stream), "add");
}

CudaGraph& CudaDevice::graph(GraphId g) {
  if (g < 0 || g >= static_cast<GraphId>(graphs_.size()) ||
      graphs_[static_cast<size_t>(g)] == nullptr) {
    fail(ErrorKind::kInvalidArgument, "{}: unknown graph {}", name_, g);
  }
  return *graphs_[static_cast<size_t>(g)];
}

CudaStreamState& CudaDevice::stream(StreamId s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (s < 0 || s >= static_cast<int>(streams_.size())) {
    fail(ErrorKind::kInvalidArgument, "{}: unknown stream {}", name_, s);
  }
  return *streams_[static_cast<size_t>(s)];
}

CudaDevice::Event& CudaDevice::event(EventId e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (e < 0 || e >= static_cast<int>(events_.size())) {
    fail(ErrorKind::kInvalidArgument, "{}: unknown event {}", name_, e);
  }
  return events_[static_cast<size_t>(e)];
}

void CudaDevice::rethrow(CudaStreamState& st, StreamId s) {
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

void CudaDevice::count_bytes(CudaStreamState& st, bool h2d, uint64_t bytes) {
  if (st.capture != nullptr) {
    (h2d ? st.capture->h2d_bytes : st.capture->d2h_bytes) += bytes;
  } else if (timeline_ != nullptr) {
    timeline_->add_bytes(h2d, bytes);
  }
}

void CudaDevice::check_device(const void* p, uint64_t bytes, const char* what) const {
  if (bytes == 0) return;
  cudaPointerAttributes a{};
  const cudaError_t err = cudaPointerGetAttributes(&a, p);
  if (err != cudaSuccess) cudaGetLastError();
  if (err != cudaSuccess || (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)) {
    fail(ErrorKind::kInvalidArgument, "{}: {} ({} bytes at {}) is not device memory", name_, what,
         bytes, p);
  }
}

void CudaDevice::launch(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail(err == cudaErrorInvalidValue ? ErrorKind::kInvalidArgument : ErrorKind::kInternal,
         "{}: {}: {}", name_, what, cudaGetErrorString(err));
  }
}

float* CudaDevice::scratch(CudaStreamState& st, uint64_t bytes) {
  return grow_scratch(st, &st.scratch, &st.scratch_bytes, bytes);
}

float* CudaDevice::grow_scratch(CudaStreamState& st, void** p, uint64_t* have, uint64_t bytes) {
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

QuantMatrix CudaDevice::quant_matrix(const ops::Weight& w) {
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

void CudaDevice::dequantize(const QuantMatrix& q, float* dst, CudaStreamState& st) {
  if (q.scale_inv != nullptr) {
    launch(dequantize_fp8_blocks_cuda(static_cast<const uint8_t*>(q.data), q.row_bytes, q.scale_inv,
                                      q.scale_row_elems, q.rows, q.cols, q.block_rows, q.block_cols,
                                      DType::kF32, dst, q.cols, st.stream),
           "dequantize FP8");
    return;
  }
  launch(dequantize_rows_cuda(q.type, q.data, q.row_bytes, q.rows, q.cols, DType::kF32, dst, q.cols,
                              st.stream),
         "dequantize");
}

const CublasApi* CudaDevice::blas_api() {
  std::string why;
  const CublasApi* api = cublas_api(&why);
  if (api == nullptr) {
    static std::once_flag said;
    std::call_once(said, [&] {
      log_warn("{}: cuBLAS not loaded ({}): prefill products use tandem's own kernels", name_, why);
    });
  }
  return api;
}

void CudaDevice::blas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    fail(ErrorKind::kInternal, "{}: cuBLAS {}: {}", name_, what,
         cublas_api()->status_string(status));
  }
}

void CudaDevice::product(const ops::Weight& w, const float* x, int64_t ldx, int64_t n, float* y,
                         int64_t ldy, CudaStreamState& st) {
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
    blas(
        cublas->sgemm(st.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows),
                      static_cast<int>(n), static_cast<int>(q.cols), &one, a, static_cast<int>(lda),
                      x, static_cast<int>(ldx), &zero, out, static_cast<int>(ldy)),
        "sgemm");
  };
  if (q.type == DType::kF32 && q.row_bytes % 4 == 0) {
    gemm(static_cast<const float*>(q.data), q.row_bytes / 4, q.rows, y);
    return;
  }
  if (q.type == DType::kBF16 && q.row_bytes % 2 == 0) {
    // The activations split into three BF16 parts (dequant::split_bf16x3), each multiplied with
    // the weight as stored on tensor cores (exact products, F32 sums), the smallest part first:
    // an F32 product's accuracy, no dequantized copy of the weight.
    const int64_t plane = n * q.cols;
    auto* parts = reinterpret_cast<uint16_t*>(
        grow_scratch(st, &st.weights, &st.weights_bytes, static_cast<uint64_t>(3 * plane) * 2));
    launch(split_bf16x3_cuda(x, ldx, n, q.cols, parts, st.stream), "BF16 parts");
    for (int i = 2; i >= 0; --i) {
      const float beta = i == 2 ? 0.0f : 1.0f;
      blas(cublas->gemm_ex(st.blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(q.rows),
                           static_cast<int>(n), static_cast<int>(q.cols), &one, q.data, CUDA_R_16BF,
                           static_cast<int>(q.row_bytes / 2), parts + i * plane, CUDA_R_16BF,
                           static_cast<int>(q.cols), &beta, y, CUDA_R_32F, static_cast<int>(ldy),
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
           "gemm_ex");
    }
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

OpSpan CudaDevice::span_start(CudaStreamState& st, double* seconds) {
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
  p.stream = st.id;
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

void CudaDevice::span_end(const OpSpan& p, CudaStreamState& st) {
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

ForwardOpsProfile CudaDevice::span_seconds(const ForwardOpsProfile& seconds) {
  std::lock_guard<std::mutex> lock(span_mu_);
  return seconds;
}

void CudaDevice::collect_spans() {
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
    if (timeline_ != nullptr && p.compute) timeline_->add(Timeline::kDevice, at(a), at(b));
    if (trace::recording()) {
      trace::record_on(trace::named_track(fmt::format("cuda stream {}", p.stream)), p.name,
                       p.compute ? "device" : "device copy or wait", at(a), at(b));
    }
    if (p.seconds != nullptr) *p.seconds += (b - a) * 1e-3;
    if (!p.graph) spans_free_.push_back(p);
  }
  spans_pending_.resize(keep);
}

std::unique_ptr<ForwardOps> CudaDevice::forward_ops(std::shared_ptr<const DenseWeights> weights,
                                                    const ForwardOpsOptions& options) {
  if (&weights->device() != this) {
    fail(ErrorKind::kInvalidArgument, "{}: forward ops over another device's weights", name_);
  }
  return make_cuda_forward_ops(*this, std::move(weights), options);
}

}  // namespace cuda_detail

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& o) {
  return std::make_unique<cuda_detail::CudaDevice>(o);
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
