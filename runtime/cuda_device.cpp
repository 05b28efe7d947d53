// The CUDA device (runtime/device.h's contract on a GPU; docs/device.md): streams are
// cudaStream_t, events cudaEvent_t, host callbacks cudaLaunchHostFunc, host staging memory
// pinned (cudaHostAlloc); device memory comes from cudaMalloc under a byte budget it accounts
// (--vram-budget, else 90% of the memory free at start). Ops: an expert FFN and a matmul
// dequantize the stored weights to F32 on the stream (ops/cuda/dequant.h) into a per-stream
// scratch and run the F32 kernels of ops/cuda/dense.h. No forward ops yet: with --accel cuda the
// dense part runs on the CPU.
#include "runtime/device.h"

#include "core/error.h"

#ifdef TANDEM_HAVE_CUDA

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/log.h"
#include "ops/cuda/cuda_util.h"
#include "ops/cuda/dense.h"
#include "ops/cuda/dequant.h"
#include "runtime/timeline.h"

namespace tandem::rt {

namespace {

struct CudaStreamState {
  cudaStream_t stream = nullptr;
  std::mutex mu;
  std::exception_ptr error;  // the first unreported failure of a host callback
  void* scratch = nullptr;   // dequantized weights and intermediates of ffn / matmul
  uint64_t scratch_bytes = 0;
};

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
      fail(ErrorKind::kResource, "--vram-budget {} bytes: the GPU {} has {} bytes free", o.memory_bytes,
           name_, free);
    }
    capacity_ = o.memory_bytes > 0 ? o.memory_bytes : usable;
    create_stream();  // stream 0
  }

  ~CudaDevice() override {
    cudaSetDevice(index_);
    for (auto& s : streams_) {
      cudaStreamSynchronize(s->stream);
      cudaFree(s->scratch);
      cudaStreamDestroy(s->stream);
    }
    for (auto& e : events_) cudaEventDestroy(e.event);
    for (const auto& [p, bytes] : live_) cudaFree(p);
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
      fail(ErrorKind::kResource, "{}: cannot allocate {} bytes: {} of {} bytes left (--vram-budget)",
           name_, bytes, capacity_ - used_, capacity_);
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
    rethrow(stream(ev.stream), ev.stream);
  }
  void sync_stream(StreamId s) override {
    CudaStreamState& st = stream(s);
    TD_CUDA_CHECK(cudaStreamSynchronize(st.stream));
    rethrow(st, s);
  }

  void copy_h2d(void* dst, const void* src, uint64_t bytes, StreamId s) override {
    check_device(dst, bytes, "copy_h2d destination");
    if (timeline_ != nullptr) timeline_->add_bytes(true, bytes);
    TD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream(s).stream));
  }
  void copy_d2h(void* dst, const void* src, uint64_t bytes, StreamId s) override {
    check_device(src, bytes, "copy_d2h source");
    if (timeline_ != nullptr) timeline_->add_bytes(false, bytes);
    TD_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream(s).stream));
  }

  void host_callback(StreamId s, std::function<void()> fn) override {
    CudaStreamState& st = stream(s);
    auto* cb = new Callback{&st, std::move(fn)};
    const cudaError_t err = cudaLaunchHostFunc(st.stream, &Callback::run, cb);
    if (err != cudaSuccess) {
      delete cb;
      TD_CUDA_CHECK(err);
    }
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
    // Scratch: the three matrices in F32, then g, u [n, ff] and the down output [n, out].
    const uint64_t mats = static_cast<uint64_t>(3 * ff * H);
    float* base = scratch(st, (mats + static_cast<uint64_t>(2 * n * ff + n * out_cols)) * 4);
    float* wg = base;
    float* wu = wg + ff * H;
    float* wd = wu + ff * H;
    float* g = wd + out_cols * ff;
    float* u = g + n * ff;
    float* d = u + n * ff;
    dequantize(w.gate, wg, st);
    dequantize(w.up, wu, st);
    dequantize(w.down, wd, st);
    launch(matmul_f32_cuda(wg, ff, H, x, n, g, ff, st.stream), "ffn gate");
    launch(matmul_f32_cuda(wu, ff, H, x, n, u, ff, st.stream), "ffn up");
    launch(glu_cuda(g, u, n, ff, e.gate_bias, e.up_bias, e.limit, ops::kSwigluOaiAlpha,
                    st.stream),
           "ffn activation");
    launch(matmul_f32_cuda(wd, out_cols, ff, g, n, d, out_cols, st.stream), "ffn down");
    launch(scale_rows_cuda(d, n, out_cols, e.down_bias, scale, out, accumulate, st.stream),
           "ffn output");
  }

  void matmul(StreamId s, const ops::Weight& w, const float* x, int64_t n, float* y) override {
    check_device(x, uint64_t(n * w.cols()) * 4, "matmul input");
    check_device(y, uint64_t(n * w.rows()) * 4, "matmul output");
    CudaStreamState& st = stream(s);
    float* wf = scratch(st, static_cast<uint64_t>(w.rows() * w.cols()) * 4);
    dequantize(w, wf, st);
    launch(matmul_f32_cuda(wf, w.rows(), w.cols(), x, n, y, w.rows(), st.stream), "matmul");
  }

  void add(StreamId s, const float* a, float* out, int64_t count) override {
    check_device(a, uint64_t(count) * 4, "add input");
    check_device(out, uint64_t(count) * 4, "add output");
    launch(add_cuda(a, out, count, stream(s).stream), "add");
  }

 private:
  struct Event {
    cudaEvent_t event = nullptr;
    int stream = -1;  // -1: never recorded
  };
  struct Callback {
    CudaStreamState* st;
    std::function<void()> fn;
    // cudaLaunchHostFunc's trampoline: an exception is kept for the stream's next sync.
    static void CUDART_CB run(void* p) {
      std::unique_ptr<Callback> cb(static_cast<Callback*>(p));
      try {
        cb->fn();
      } catch (...) {
        std::lock_guard<std::mutex> lock(cb->st->mu);
        if (!cb->st->error) cb->st->error = std::current_exception();
      }
    }
  };

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

  // Host pointers handed to device ops would fault in a kernel: reject them at the call.
  void check_device(const void* p, uint64_t bytes, const char* what) const {
    if (bytes == 0) return;
    cudaPointerAttributes a{};
    const cudaError_t err = cudaPointerGetAttributes(&a, p);
    if (err != cudaSuccess) cudaGetLastError();
    if (err != cudaSuccess ||
        (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)) {
      fail(ErrorKind::kInvalidArgument, "{}: {} ({} bytes at {}) is not device memory", name_,
           what, bytes, p);
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
    if (st.scratch_bytes < bytes) {
      TD_CUDA_CHECK(cudaStreamSynchronize(st.stream));
      TD_CUDA_CHECK(cudaFree(st.scratch));
      st.scratch = nullptr;
      st.scratch_bytes = 0;
      const cudaError_t err = cudaMalloc(&st.scratch, bytes);
      if (err != cudaSuccess) {
        cudaGetLastError();
        fail(ErrorKind::kResource, "{}: scratch of {} bytes: {}", name_, bytes,
             cudaGetErrorString(err));
      }
      st.scratch_bytes = bytes;
    }
    return static_cast<float*>(st.scratch);
  }

  // w (device memory, its stored dtype) as F32 rows at dst.
  void dequantize(const ops::Weight& w, float* dst, CudaStreamState& st) {
    check_device(w.t.data, 1, "weight");
    const int64_t rows = w.rows(), cols = w.cols();
    if (w.scale_inv != nullptr) {
      if (w.row0 % w.block_rows != 0) {
        fail(ErrorKind::kUnsupported, "{}: an FP8 row view starting inside a scale block (row {})",
             name_, w.row0);
      }
      launch(dequantize_fp8_blocks_cuda(static_cast<const uint8_t*>(w.t.data), w.t.row_bytes(),
                                        w.scale_inv + w.row0 / w.block_rows * w.scale_cols,
                                        w.scale_cols, rows, cols, w.block_rows, w.block_cols,
                                        DType::kF32, dst, cols, st.stream),
             "dequantize FP8");
      return;
    }
    if (!cuda_can_dequantize(w.t.dtype)) {
      fail(ErrorKind::kUnsupported, "{}: no CUDA kernel for {} weights", name_,
           dtype_info(w.t.dtype).name);
    }
    launch(dequantize_rows_cuda(w.t.dtype, w.t.data, w.t.row_bytes(), rows, cols, DType::kF32,
                                dst, cols, st.stream),
           "dequantize");
  }

  int index_;
  std::string name_;
  uint64_t capacity_ = 0, used_ = 0;
  mutable std::mutex mu_;
  std::map<void*, uint64_t> live_;
  std::vector<std::unique_ptr<CudaStreamState>> streams_;
  std::vector<Event> events_;
};

}  // namespace

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& o) {
  return std::make_unique<CudaDevice>(o);
}

}  // namespace tandem::rt

#else

namespace tandem::rt {

std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions&) {
  fail(ErrorKind::kUnsupported, "--accel cuda: this build has no CUDA (nvcc was not found when "
       "it was configured); --accel host emulates an accelerator");
}

}  // namespace tandem::rt

#endif
