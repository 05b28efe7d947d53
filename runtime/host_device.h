// The host device: runtime/device.h's Device emulated on CPU threads, so the hybrid runtime and its
// policies run (and are tested) without a GPU. make_host_device() and parse_link() are declared in
// runtime/device.h; this header names the emulation's constants.
//
// Emulation (docs/device.md): device memory is one aligned host buffer of memory_bytes managed by
// a first-fit free list; each stream is a host thread running its queue in order; copies go through
// one emulated link per direction (h2d, d2h) shared by every stream, paced chunk by chunk to
// latency + bytes / bandwidth; ffn / matmul / add run the CPU kernels (kern::matmul, ops::silu) on
// the device's own unpinned ThreadPool, so device compute never takes the CPU backend's workers.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>

#include "core/memory.h"
#include "runtime/device.h"

namespace tandem::rt {

// Link pacing granularity: concurrent copies in one direction interleave at this size, so they
// share the bandwidth like PCIe transfers do.
inline constexpr uint64_t kHostLinkChunkBytes = 256 * 1024;
// Device allocations are aligned (and rounded) to this, like cudaMalloc's 256-byte alignment.
inline constexpr uint64_t kHostDeviceAlign = 256;

// One direction of the emulated host <-> device link (runtime/link.cpp). Copies reserve
// chunk-sized slots on a shared schedule (next_free_), so two copies at once each get about half
// the bandwidth. A copy's own chunks chain on virtual times, so sleep overshoot does not
// accumulate over a long copy.
class EmulatedLink {
 public:
  using Clock = std::chrono::steady_clock;
  explicit EmulatedLink(LinkSpec spec) : spec_(spec) {}
  // Copies bytes from src to dst, returning when the link would have delivered them.
  void copy(void* dst, const void* src, uint64_t bytes);

 private:
  LinkSpec spec_;
  std::mutex mu_;
  Clock::time_point next_free_{};
};

// The host device's memory (runtime/device_arena.cpp): one aligned buffer of a fixed capacity,
// allocations first-fit from a free list (aligned and rounded to kHostDeviceAlign), freed blocks
// coalesced with their neighbours. Thread-safe.
class DeviceArena {
 public:
  // capacity 0: no memory (every alloc fails).
  explicit DeviceArena(uint64_t capacity);
  // Error(kResource) naming `device`, the size, what is left and the largest free block.
  void* alloc(uint64_t bytes, const std::string& device);
  // Error(kInvalidArgument) when p is not a live allocation (nullptr: nothing).
  void free(void* p, const std::string& device);
  uint64_t capacity() const { return capacity_; }
  uint64_t used() const;
  // Whether [p, p + bytes) lies in the arena's memory.
  bool contains(const void* p, uint64_t bytes) const;

 private:
  mutable std::mutex mu_;
  AlignedBuffer memory_;
  uint64_t capacity_ = 0, used_ = 0;
  std::map<uint64_t, uint64_t> free_, live_;  // offset -> bytes
};

}  // namespace tandem::rt
