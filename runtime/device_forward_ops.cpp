#include "runtime/device_forward_ops.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "runtime/timeline.h"

namespace tandem::rt {

DeviceForwardOps::DeviceForwardOps(Device& dev, std::shared_ptr<const DenseWeights> weights)
    : dev_(dev), w_(std::move(weights)), stream_(dev.create_stream()) {
  for (Buf*& b : slots_) b = new_buf();
  stage_ = new_buf();
  for (int i = 0; i < kHostSlots; ++i) host_.emplace_back(&dev_);
}

DeviceForwardOps::~DeviceForwardOps() {
  try {
    dev_.sync_stream(stream_);
  } catch (const std::exception& e) {
    log_warn("{} forward ops: {}", dev_.name(), e.what());
  }
  for (Buf& b : bufs_) dev_.free(b.p);
}

DeviceForwardOps::Buf* DeviceForwardOps::new_buf() {
  return &bufs_.emplace_back();
}

float* DeviceForwardOps::grow(Buf* b, int64_t count) {
  if (b->count < count) {
    dev_.sync_stream(stream_);  // (the stream may still read the old memory)
    dev_.free(b->p);
    b->p = nullptr;
    b->count = 0;
    b->p = dev_.alloc(static_cast<uint64_t>(std::max<int64_t>(count, 1)) * 4);
    b->count = count;
    moved();
  }
  return static_cast<float*>(b->p);
}

float* DeviceForwardOps::buffer(int slot, int64_t count) {
  TD_CHECK(slot >= 0 && slot < kBufferSlots, "forward ops: buffer slot {}", slot);
  return grow(slots_[slot], count);
}

const float* DeviceForwardOps::host_view(const float* x, int64_t count,
                                         std::vector<float>* staging) {
  staging->resize(static_cast<size_t>(count));
  dev_.copy_d2h(staging->data(), x, static_cast<uint64_t>(count) * 4, stream_);
  dev_.sync_stream(stream_);
  return staging->data();
}

float* DeviceForwardOps::host_buffer(HostSlot slot, int64_t count) {
  const auto i = static_cast<size_t>(slot);
  TD_CHECK(i < host_.size(), "forward ops: host buffer {}", i);
  bool grew = false;
  float* p = host_[i].floats(count, &grew);
  if (grew) moved();
  return p;
}

void DeviceForwardOps::lm_head(const std::vector<int64_t>& row_ids, const float* x,
                               float* host_logits) {
  const int64_t count = static_cast<int64_t>(row_ids.size()) * w_->weights.config.vocab_size;
  const float* d = logits_rows(row_ids, x);
  dev_.copy_d2h(host_logits, d, static_cast<uint64_t>(count) * 4, stream_);
  dev_.sync_stream(stream_);
}

void DeviceForwardOps::lm_head_to_host(const std::vector<int64_t>& row_ids, const float* x,
                                       float* host) {
  const int64_t count = static_cast<int64_t>(row_ids.size()) * w_->weights.config.vocab_size;
  copy_to_host(logits_rows(row_ids, x), count, host);
}

void DeviceForwardOps::copy_to_host(const float* x, int64_t count, float* host) {
  dev_.copy_d2h(host, x, static_cast<uint64_t>(count) * 4, stream_);
}

void DeviceForwardOps::host_work(std::function<void()> fn) {
  dev_.host_callback(stream_, std::move(fn));
}

void DeviceForwardOps::note_cpu_experts(std::chrono::steady_clock::time_point t0,
                                        std::chrono::steady_clock::time_point t1) {
  if (Timeline* t = dev_.timeline()) t->add(Timeline::kCpuExperts, t0, t1);
}

void DeviceForwardOps::add_from_host(float* out, const float* host, int64_t count) {
  float* st = grow(stage_, count);
  dev_.copy_h2d(st, host, static_cast<uint64_t>(count) * 4, stream_);
  add(out, st, count);
}

}  // namespace tandem::rt
