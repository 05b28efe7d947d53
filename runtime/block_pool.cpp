#include "runtime/block_pool.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "core/error.h"

namespace tandem::rt {

BlockPool::BlockPool(uint64_t capacity, Raw raw, std::string name, std::string budget_flag)
    : capacity_(capacity),
      raw_(std::move(raw)),
      name_(std::move(name)),
      flag_(std::move(budget_flag)) {}

BlockPool::~BlockPool() {
  for (const auto& [bytes, p] : cached_) raw_.free(p);
  for (const auto& [p, bytes] : live_) raw_.free(p);
}

void BlockPool::release(std::multimap<uint64_t, void*>::iterator it) {
  raw_.free(it->second);
  cached_bytes_ -= it->first;
  ++stats_.raw_frees;
  cached_.erase(it);
}

void BlockPool::trim() {
  while (!cached_.empty()) release(cached_.begin());
}

void* BlockPool::alloc(uint64_t bytes) {
  const uint64_t left = capacity_ - used_;
  if (bytes > left) {
    fail(ErrorKind::kResource, "{}: cannot allocate {} bytes: {} of {} bytes left ({})", name_,
         bytes, left, capacity_, flag_);
  }
  const uint64_t need = (std::max<uint64_t>(bytes, 1) + kGranule - 1) / kGranule * kGranule;
  // The smallest cached block that fits, if it wastes at most a fifth of itself.
  if (auto it = cached_.lower_bound(need); it != cached_.end() && it->first <= need + need / 4) {
    const uint64_t size = it->first;
    void* p = it->second;
    cached_.erase(it);
    cached_bytes_ -= size;
    live_[p] = size;
    used_ += size;
    ++stats_.reuses;
    return p;
  }
  // New memory within the budget: cached blocks given back, largest first, until it fits.
  while (used_ + cached_bytes_ + need > capacity_ && !cached_.empty()) {
    release(std::prev(cached_.end()));
  }
  if (used_ + need > capacity_) {  // (rounding past the budget's last bytes)
    fail(ErrorKind::kResource, "{}: cannot allocate {} bytes: {} of {} bytes left ({})", name_,
         bytes, left, capacity_, flag_);
  }
  std::string why;
  void* p = raw_.alloc(need, &why);
  if (p == nullptr && !cached_.empty()) {  // the device holds less than the budget: retry bare
    trim();
    p = raw_.alloc(need, &why);
  }
  if (p == nullptr) {
    fail(ErrorKind::kResource, "{}: cannot allocate {} bytes: {}", name_, bytes, why);
  }
  ++stats_.raw_allocs;
  live_[p] = need;
  used_ += need;
  return p;
}

void BlockPool::free(void* p) {
  if (p == nullptr) return;
  const auto it = live_.find(p);
  if (it == live_.end()) {
    fail(ErrorKind::kInvalidArgument, "{}: free of {} which is not a live allocation", name_, p);
  }
  const uint64_t size = it->second;
  live_.erase(it);
  used_ -= size;
  cached_.emplace(size, p);
  cached_bytes_ += size;
}

}  // namespace tandem::rt
