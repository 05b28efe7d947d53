// A caching allocator over a device's raw allocator (cudaMalloc / cudaFree for the CUDA device),
// with the budget accounted: freed blocks stay reserved and serve later requests of about their
// size, so a steady state (activation buffers regrown, KV caches made and dropped, expert slots,
// staging) calls neither cudaMalloc nor cudaFree, which synchronizes the whole device. The budget
// bounds what the raw allocator holds (live + cached): a request that would pass it first gives
// cached blocks back, largest first, and so does a raw allocation that fails (the GPU holds less
// than the budget said). Requests are rounded up to kGranule bytes; a cached block serves a
// request of at least 4/5 of its size (the smallest such block first), so no block wastes more than
// a fifth of itself.
//
// free() does not wait for anything (cudaFree does): the Device contract already says a pointer
// must not be freed before the work that uses it has finished. Not thread-safe: the caller
// serializes (the CUDA device's lock).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>

namespace tandem::rt {

class BlockPool {
 public:
  static constexpr uint64_t kGranule = 512;
  struct Raw {
    // bytes of device memory, or nullptr with the reason in *why.
    std::function<void*(uint64_t bytes, std::string* why)> alloc;
    std::function<void(void* p)> free;
  };
  struct Stats {
    int64_t raw_allocs = 0, raw_frees = 0, reuses = 0;
  };

  // name: the device, for error messages; budget_flag: the option that sets capacity.
  BlockPool(uint64_t capacity, Raw raw, std::string name, std::string budget_flag);
  ~BlockPool();  // every block back to the raw allocator, live ones too
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Error(kResource) naming the bytes asked, the bytes left and the budget's flag when the budget
  // cannot hold it, or the raw allocator's reason when it fails with the cache given back.
  void* alloc(uint64_t bytes);
  // Error(kInvalidArgument) for a pointer the pool did not hand out (or handed out and took back).
  void free(void* p);
  // The cached blocks back to the raw allocator.
  void trim();

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_; }  // live blocks' bytes (rounded)
  uint64_t cached() const { return cached_bytes_; }
  Stats stats() const { return stats_; }

 private:
  void release(std::multimap<uint64_t, void*>::iterator it);

  uint64_t capacity_;
  Raw raw_;
  std::string name_, flag_;
  uint64_t used_ = 0, cached_bytes_ = 0;
  std::multimap<uint64_t, void*> cached_;     // bytes -> block
  std::unordered_map<void*, uint64_t> live_;  // block -> bytes
  Stats stats_;
};

}  // namespace tandem::rt
