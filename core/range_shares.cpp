#include "core/range_shares.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {
namespace {

constexpr uint64_t pack(uint64_t front, uint64_t back) { return front | back << 32; }
constexpr int64_t front_of(uint64_t v) { return static_cast<int64_t>(v & 0xFFFFFFFFu); }
constexpr int64_t back_of(uint64_t v) { return static_cast<int64_t>(v >> 32); }

}  // namespace

void RangeShares::reset(const int64_t* bounds, int shares) {
  TD_CHECK(shares >= 1 && shares <= kMaxShares, "RangeShares: {} shares (1 to {})", shares,
           kMaxShares);
  TD_CHECK(bounds[0] == 0 && bounds[shares] < (int64_t{1} << 32),
           "RangeShares: items [{}, {}) (from 0, fewer than 2^32)", bounds[0], bounds[shares]);
  for (int s = 0; s < shares; ++s) {
    TD_CHECK(bounds[s] <= bounds[s + 1], "RangeShares: share {} is [{}, {})", s, bounds[s],
             bounds[s + 1]);
    storage_[s].range.store(
        pack(static_cast<uint64_t>(bounds[s]), static_cast<uint64_t>(bounds[s + 1])),
        std::memory_order_relaxed);
  }
  shares_ = shares;
}

bool RangeShares::take(int s, int64_t chunk, int64_t* begin, int64_t* end) {
  std::atomic<uint64_t>& r = storage_[s].range;
  uint64_t v = r.load(std::memory_order_relaxed);
  for (;;) {
    const int64_t f = front_of(v), b = back_of(v);
    if (f >= b) return false;
    const int64_t e = std::min(b, f + std::max<int64_t>(1, chunk));
    if (r.compare_exchange_weak(v, pack(static_cast<uint64_t>(e), static_cast<uint64_t>(b)),
                                std::memory_order_relaxed)) {
      *begin = f;
      *end = e;
      return true;
    }
  }
}

bool RangeShares::steal_into(int s) {
  for (;;) {
    // The victim: the share with the most items left (a snapshot; the CAS below checks it).
    int victim = -1;
    uint64_t seen = 0;
    int64_t most = 0;
    for (int i = 0; i < shares_; ++i) {
      const uint64_t v = storage_[i].range.load(std::memory_order_relaxed);
      if (back_of(v) - front_of(v) > most) {
        victim = i;
        seen = v;
        most = back_of(v) - front_of(v);
      }
    }
    if (victim < 0) return false;
    const int64_t f = front_of(seen), b = back_of(seen), mid = b - (most + 1) / 2;
    if (storage_[victim].range.compare_exchange_strong(
            seen, pack(static_cast<uint64_t>(f), static_cast<uint64_t>(mid)),
            std::memory_order_relaxed)) {
      // Share s is empty and only its task (this one) refills it: a plain store.
      storage_[s].range.store(pack(static_cast<uint64_t>(mid), static_cast<uint64_t>(b)),
                              std::memory_order_relaxed);
      return true;
    }
  }
}

}  // namespace tandem
