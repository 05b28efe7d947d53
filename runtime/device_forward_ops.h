// What every accelerator's ForwardOps (model/forward_ops.h) shares, whatever runs its ops: a
// stream of its own on the device, the dense weights it reads, activation buffers in the
// device's memory (grown once the stream no longer reads them, freed with the ops after the
// stream is done), the host's views of device memory through a d2h copy, the routed output back
// through an h2d copy, stream-ordered host buffers and host work (the device's host callbacks),
// finish() as the stream's sync, and graphs of the stream's work (the device's capture; begin_step()
// split into stage(), the host's half, and upload_step(), the copy of what it staged, so that a
// replay reads each step's values). The host device's ops
// (runtime/host_device.cpp) and the CUDA device's (runtime/cuda_device.cpp) derive from it.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "model/forward_ops.h"
#include "runtime/dense_weights.h"
#include "runtime/device.h"

namespace tandem::rt {

class DeviceForwardOps : public ForwardOps {
 public:
  DeviceForwardOps(Device& dev, std::shared_ptr<const DenseWeights> weights);
  ~DeviceForwardOps() override;  // waits for the stream, then frees the buffers

  std::string name() const override { return dev_.name(); }
  float* buffer(int slot, int64_t count) override;
  KvCacheOptions cache_options(KvCacheOptions o) const override {
    return device_cache_options(dev_, o);
  }
  const float* host_view(const float* x, int64_t count, std::vector<float>* staging) override;
  void add_from_host(float* out, const float* host, int64_t count) override;
  bool stream_ordered() const override { return true; }
  float* host_buffer(HostSlot slot, int64_t count) override;
  void copy_to_host(const float* x, int64_t count, float* host) override;
  void host_work(std::function<void()> fn) override;
  void note_cpu_experts(std::chrono::steady_clock::time_point t0,
                        std::chrono::steady_clock::time_point t1) override;
  void finish() override { dev_.sync_stream(stream_); }
  void begin_step(const ForwardStep& step, KvCache& cache) final {
    stage(step, cache);
    upload_step();
  }
  void lm_head(const std::vector<int64_t>& row_ids, const float* x, float* host_logits) final;
  void lm_head_to_host(const std::vector<int64_t>& row_ids, const float* x, float* host) final;
  bool graphs() const override { return true; }
  uint64_t memory_epoch() const override { return epoch_; }
  void begin_capture() final { dev_.begin_capture(stream_); }
  int end_capture() final { return dev_.end_capture(stream_); }
  void launch_graph(int graph) final { dev_.launch_graph(graph, stream_); }
  void drop_graph(int graph) final { dev_.destroy_graph(graph); }

 protected:
  struct Buf {
    void* p = nullptr;
    int64_t count = 0;
  };
  // A buffer of the ops (nothing allocated until grow); valid as long as the ops.
  Buf* new_buf();
  // b's memory of at least count floats in the device's memory (its budget).
  float* grow(Buf* b, int64_t count);
  // begin_step()'s device half: what stage() put in host memory copied in, on the stream.
  virtual void upload_step() = 0;
  // The final-normed rows' logits [rows, vocab] in the ops' memory (lm_head's device half).
  virtual const float* logits_rows(const std::vector<int64_t>& row_ids, const float* x) = 0;
  // Memory a captured step may use has moved (memory_epoch()).
  void moved() { ++epoch_; }

  Device& dev_;
  std::shared_ptr<const DenseWeights> w_;
  const StreamId stream_;

 private:
  std::deque<Buf> bufs_;
  Buf* slots_[kBufferSlots];
  Buf* stage_;
  std::deque<HostStaging> host_;  // host_buffer's slots
  uint64_t epoch_ = 0;
};

}  // namespace tandem::rt
