// DeviceArena (runtime/host_device.h): the host device's memory, first-fit from a free list.
#include <algorithm>
#include <iterator>

#include "core/error.h"
#include "runtime/host_device.h"

namespace tandem::rt {

namespace {
AlignedBuffer arena_memory(uint64_t capacity) {
  if (capacity == 0) return AlignedBuffer();
  AllocOptions ao;
  ao.alignment = kHostDeviceAlign;
  return AlignedBuffer(capacity, ao);
}
}  // namespace

DeviceArena::DeviceArena(uint64_t capacity)
    : memory_(arena_memory(capacity)), capacity_(capacity / kHostDeviceAlign * kHostDeviceAlign) {
  if (capacity_ > 0) free_[0] = capacity_;
}

uint64_t DeviceArena::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

void* DeviceArena::alloc(uint64_t bytes, const std::string& device) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t left = capacity_ - used_;
  uint64_t largest = 0;
  if (bytes <= capacity_) {
    const uint64_t need = std::max(
        kHostDeviceAlign, (bytes + kHostDeviceAlign - 1) / kHostDeviceAlign * kHostDeviceAlign);
    for (auto it = free_.begin(); it != free_.end(); ++it) {  // first fit
      largest = std::max(largest, it->second);
      if (it->second < need) continue;
      const uint64_t off = it->first, size = it->second;
      free_.erase(it);
      if (size > need) free_[off + need] = size - need;
      live_[off] = need;
      used_ += need;
      return memory_.as<uint8_t>() + off;
    }
  }
  fail(ErrorKind::kResource,
       "{} device: cannot allocate {} bytes: {} of {} bytes left (largest free block {})", device,
       bytes, left, capacity_, largest);
}

void DeviceArena::free(void* p, const std::string& device) {
  if (p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t off = static_cast<uint64_t>(static_cast<uint8_t*>(p) - memory_.as<uint8_t>());
  auto it = contains(p, 0) ? live_.find(off) : live_.end();
  if (it == live_.end()) {
    fail(ErrorKind::kInvalidArgument, "{} device: free of {} which is not a live allocation",
         device, p);
  }
  uint64_t start = off, size = it->second;
  used_ -= size;
  live_.erase(it);
  auto next = free_.lower_bound(start);  // coalesce with the neighbours
  if (next != free_.end() && next->first == start + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = size;
}

bool DeviceArena::contains(const void* p, uint64_t bytes) const {
  const auto* base = memory_.as<uint8_t>();
  const auto* q = static_cast<const uint8_t*>(p);
  return base != nullptr && q >= base && q <= base + capacity_ &&
         bytes <= static_cast<uint64_t>(base + capacity_ - q);
}

}  // namespace tandem::rt
