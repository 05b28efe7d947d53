#include "runtime/device_forward_ops.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "core/error.h"
#include "core/log.h"

namespace tandem::rt {

DeviceForwardOps::DeviceForwardOps(Device& dev, std::shared_ptr<const DenseWeights> weights)
    : dev_(dev), w_(std::move(weights)), stream_(dev.create_stream()) {
  for (Buf*& b : slots_) b = new_buf();
  stage_ = new_buf();
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

void DeviceForwardOps::add_from_host(float* out, const float* host, int64_t count) {
  float* st = grow(stage_, count);
  dev_.copy_h2d(st, host, static_cast<uint64_t>(count) * 4, stream_);
  add(out, st, count);
}

}  // namespace tandem::rt
