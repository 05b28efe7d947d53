// Work stealing by ranges: items [0, n) cut into contiguous shares, one per pool task; a task
// takes its share's items front to back in chunks, and once its share is empty it steals the back
// half of the share with the most items left and goes on with that as its own. Each thread so
// walks long contiguous ranges (a weight stream the prefetchers keep up with, instead of a new
// stream per task) and the job's tail is about one chunk, however unevenly the threads started
// or ran. Used by the decode GEMVs (kern::matmul_shared_input, <= 4 tokens).
//
// Each share is one 64-bit word, front in the low and back in the high 32 bits, changed only by
// compare-and-swap (taking from the front, stealing from the back) or, once empty, by the task
// that owns it (refilling it with what it stole): an item is claimed exactly once.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace tandem {

class RangeShares {
 public:
  // Shares at most (a pool of more threads than this shares its shares).
  static constexpr int kMaxShares = 256;

  // `shares` shares (1 .. kMaxShares) of items [0, n) (n < 2^32); share s is [bounds[s],
  // bounds[s + 1]) for the shares + 1 ascending bounds, bounds[0] = 0 and bounds[shares] = n.
  // Not thread-safe: call before the job starts.
  void reset(const int64_t* bounds, int shares);

  // The next chunk of share s, at most `chunk` items from its front, into [*begin, *end); false
  // once the share is empty.
  bool take(int s, int64_t chunk, int64_t* begin, int64_t* end);

  // Share s (empty: its task took everything) refilled with the back half (rounded up) of the
  // share with the most items left; false once every share is empty.
  bool steal_into(int s);

  int shares() const { return shares_; }

 private:
  struct alignas(64) Share {
    std::atomic<uint64_t> range{0};  // front | back << 32
  };
  std::unique_ptr<Share[]> storage_ = std::make_unique<Share[]>(kMaxShares);
  int shares_ = 0;
};

}  // namespace tandem
