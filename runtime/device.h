// The accelerator interface: a CUDA-shaped Device that the hybrid runtime drives. A CUDA
// backend implements it with stream = cudaStream_t, event = cudaEvent_t, host_callback =
// cudaLaunchHostFunc, alloc = cudaMallocAsync / a pool; the host device emulates one on CPU threads
// with a bandwidth- and latency-capped link so policies can be studied without a GPU.
//
// Contract for implementers:
// - Ordering: work enqueued on one stream runs strictly in enqueue order; different streams are
//   unordered except through record / wait_event. Every enqueue call returns without waiting.
// - Lifetimes: pointers passed to copies and ops (host and device) must stay valid until the
//   stream has reached that work (sync_stream / sync_event / a later event). Weight views are
//   copied by value.
// - Events: record() marks the current end of a stream; recording again re-targets the event to the
//   newest record (like cudaEventRecord). query() of a never-recorded event is true.
// - Callbacks: host_callback's fn runs on a host thread owned by the device (the stream's thread on
//   the host device, a CUDA driver thread on CUDA), in stream order; it must not call sync_* of
//   this device nor enqueue work it then waits for.
// - Errors: an exception inside stream work is captured and rethrown as tandem::Error (naming the
//   op) by the next sync_stream / sync_event that covers it (once); the stream keeps working
//   afterwards. Bad arguments (unknown ids, shapes, host pointers as device memory) throw at once.
//   alloc throws Error(kResource) naming the bytes asked and left.
// - Thread safety: every call may come from any host thread; the runtime normally drives a device
//   from one thread plus the callbacks it enqueued.
// - Destruction waits for all enqueued work to finish; then device memory is released.
// - Graph capture (begin_capture .. end_capture): copies, ops and host callbacks (host nodes) are
//   captured; record / wait_event / alloc / free / sync_* must not be called while capturing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "model/forward_ops.h"
#include "ops/cpu/ref_ops.h"

namespace tandem::rt {

using StreamId = int;
using EventId = int;

struct DenseWeights;
class Timeline;

struct DeviceFfnWeights {      // one SwiGLU FFN (an expert or the shared experts) in device memory
  ops::Weight gate, up, down;  // tensors whose data pointers are DEVICE memory, stored dtype
  ops::FfnExtras extras;       // gpt-oss's biases (DEVICE memory) and clamp; none elsewhere
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  virtual uint64_t memory_capacity() const = 0;
  virtual uint64_t memory_used() const = 0;
  virtual void* alloc(uint64_t bytes) = 0;  // Error(kResource) naming bytes asked / left
  virtual void free(void* p) = 0;
  // Host staging memory for copies: pinned on CUDA (cudaHostAlloc / cudaFreeHost), so async copies
  // run at full link speed; the default (and the host device) is 64-byte aligned pageable memory.
  // Allocate it once (it is slow on CUDA) and reuse; free_host(nullptr) is a no-op.
  virtual void* alloc_host(uint64_t bytes);
  virtual void free_host(void* p);
  // Pins host memory that copies will read in place (CUDA: cudaHostRegister, read-only where the
  // device supports it, as a model file mapped read-only needs), so that copy_h2d from it is a DMA
  // the caller does not wait for. false, with *why, when the system refuses (a locked-memory
  // limit, a mapping the driver cannot pin): copies from it stay correct, only staged. p and bytes
  // page-aligned. Default (the host device): nothing to do, true. unregister_host takes the same
  // p; the device releases what is left when it goes.
  virtual bool register_host(const void* p, uint64_t bytes, std::string* why);
  virtual void unregister_host(const void* p);
  virtual StreamId create_stream() = 0;  // stream 0 always exists (the default stream)
  virtual EventId create_event() = 0;
  virtual void record(EventId e, StreamId s) = 0;
  virtual void wait_event(StreamId s, EventId e) = 0;  // s waits for e (no host block)
  virtual bool query(EventId e) = 0;
  virtual void sync_event(EventId e) = 0;  // host blocks
  virtual void sync_stream(StreamId s) = 0;
  // Host pointers must come from alloc_host for full link speed on CUDA (pinned memory).
  virtual void copy_h2d(void* dst, const void* src, uint64_t bytes, StreamId s) = 0;
  virtual void copy_d2h(void* dst, const void* src, uint64_t bytes, StreamId s) = 0;
  // cudaLaunchHostFunc: fn runs on a host thread when the stream reaches it; later work on s waits
  // until it returns. fn must not call sync_* of this device.
  virtual void host_callback(StreamId s, std::function<void()> fn) = 0;
  // Ops, stream-ordered, on device memory. x [n, hidden], out [n, hidden]:
  // out[t] (+)= scale[t] * down(silu(gate x[t]) * up x[t]); scale == nullptr: 1. With w.extras
  // (gpt-oss) the biases and the clamped activation of ops::FfnExtras, the down bias before the
  // scale.
  virtual void ffn(StreamId s, const DeviceFfnWeights& w, const float* x, int64_t n,
                   const float* scale, float* out, bool accumulate) = 0;
  virtual void matmul(StreamId s, const ops::Weight& w, const float* x, int64_t n, float* y) = 0;
  virtual void add(StreamId s, const float* a, float* out, int64_t count) = 0;  // out += a
  // The forward's ops (model/forward_ops.h) on this device, over the dense part in its memory
  // (upload_dense_weights, kept alive by the ops), on a stream of their own; their buffers and the
  // KV caches made with their cache_options are this device's memory. Error(kUnsupported) where a
  // device has none.
  virtual std::unique_ptr<ForwardOps> forward_ops(std::shared_ptr<const DenseWeights> weights,
                                                  const ForwardOpsOptions& options);
  // Graphs (CUDA graphs; the host device records the stream's closures): after begin_capture(s)
  // the work enqueued on s (copies, ops, host callbacks as host nodes) is recorded, not run, until
  // end_capture(s) returns it as a graph; launch_graph(g, s) runs it on s, every time with the
  // pointers and sizes it was captured with (what they point to may change between launches).
  // While capturing: no events, allocations or syncs, and no op that has to grow its scratch (run
  // the work once eagerly first). destroy_graph releases g (no launch of it in flight; its id is
  // not reused). Default: Error(kUnsupported).
  using GraphId = int;
  virtual void begin_capture(StreamId s);
  virtual GraphId end_capture(StreamId s);
  virtual void launch_graph(GraphId g, StreamId s);
  virtual void destroy_graph(GraphId g);
  // Where the device records its ops' busy intervals and its copies' bytes, and the hybrid
  // backend its CPU experts' intervals (runtime/timeline.h); nullptr: nowhere. Set it before
  // enqueuing work; it must outlive the work enqueued after.
  void set_timeline(Timeline* t) { timeline_ = t; }
  Timeline* timeline() const { return timeline_; }

 protected:
  Timeline* timeline_ = nullptr;
};

// Device::ffn's arguments checked, for every device alike: the three matrices' shapes
// (Error(kInvalidArgument) naming them, and `device`) and each device pointer with its bytes
// handed to check (which throws for memory that is not the device's).
void check_ffn_args(
    const std::string& device, const DeviceFfnWeights& w, const float* x, int64_t n,
    const float* scale, const float* out,
    const std::function<void(const void* p, uint64_t bytes, const char* what)>& check);

// Host memory from a device's alloc_host (pinned on CUDA), grown on demand: where a runtime
// stages what it copies to and from the device, so that the copies stay asynchronous (a copy
// from pageable memory on CUDA blocks the host until the stream reaches it). Growing drops the
// contents; the caller makes sure no copy still uses the memory then. The device outlives it.
class HostStaging {
 public:
  explicit HostStaging(Device* dev) : dev_(dev) {}
  ~HostStaging() { dev_->free_host(p_); }
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  // Room for at least count floats; *grew (optional): whether the memory moved for it.
  float* floats(int64_t count, bool* grew = nullptr);

 private:
  Device* dev_;
  void* p_ = nullptr;
  uint64_t bytes_ = 0;
};

struct LinkSpec {  // 0 GB/s: uncapped
  double gb_per_s = 0;
  double latency_us = 0;
};
LinkSpec parse_link(const std::string& text);  // pcie4 (~25 GB/s, 10 us), pcie5, none, "GBPS[,US]"

struct HostDeviceOptions {
  uint64_t memory_bytes;
  int threads = 1;
  LinkSpec link;
};
std::unique_ptr<Device> make_host_device(const HostDeviceOptions& o);

struct CudaDeviceOptions {
  int index = 0;              // the GPU (cudaSetDevice)
  uint64_t memory_bytes = 0;  // the budget device memory is allocated within; 0: 90% of free
};
// The CUDA device (runtime/cuda_device.cpp): Error(kUnsupported) in a build without CUDA,
// Error(kResource) when memory_bytes is more than the GPU has free, a CUDA error as Error.
std::unique_ptr<Device> make_cuda_device(const CudaDeviceOptions& o);

}  // namespace tandem::rt
