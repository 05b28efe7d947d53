#include "core/range_shares.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace tandem {
namespace {

using Range = std::pair<int64_t, int64_t>;

// Everything task s gets: its chunks, then after each steal the stolen range's chunks.
std::vector<Range> drain(RangeShares* r, int s, int64_t chunk) {
  std::vector<Range> got;
  int64_t b = 0, e = 0;
  do {
    while (r->take(s, chunk, &b, &e)) got.emplace_back(b, e);
  } while (r->steal_into(s));
  return got;
}

TEST(RangeShares, OneThreadTakesChunksThenStealsBackHalves) {
  RangeShares r;
  const int64_t bounds[3] = {0, 10, 17};
  r.reset(bounds, 2);
  int64_t b = 0, e = 0;
  // Share 0 front to back in chunks of 4: [0, 4) [4, 8) [8, 10), then empty.
  ASSERT_TRUE(r.take(0, 4, &b, &e));
  EXPECT_EQ(Range(b, e), Range(0, 4));
  ASSERT_TRUE(r.take(0, 4, &b, &e));
  EXPECT_EQ(Range(b, e), Range(4, 8));
  ASSERT_TRUE(r.take(0, 4, &b, &e));
  EXPECT_EQ(Range(b, e), Range(8, 10));
  EXPECT_FALSE(r.take(0, 4, &b, &e));
  // Share 1 has 7 left after one chunk of its own: [10, 12) taken, [12, 17) left; the steal takes
  // the back half rounded up, [14, 17), and share 0 goes on with it.
  ASSERT_TRUE(r.take(1, 2, &b, &e));
  EXPECT_EQ(Range(b, e), Range(10, 12));
  ASSERT_TRUE(r.steal_into(0));
  ASSERT_TRUE(r.take(0, 100, &b, &e));
  EXPECT_EQ(Range(b, e), Range(14, 17));
  ASSERT_TRUE(r.take(1, 100, &b, &e));
  EXPECT_EQ(Range(b, e), Range(12, 14));
  EXPECT_FALSE(r.steal_into(0));
  EXPECT_FALSE(r.steal_into(1));
  // A chunk of 0 or less still takes one item.
  r.reset(bounds, 2);
  ASSERT_TRUE(r.take(1, 0, &b, &e));
  EXPECT_EQ(Range(b, e), Range(10, 11));
}

TEST(RangeShares, ATaskAloneGetsEveryItemOnce) {
  // The other shares' tasks never run (a pool whose workers are busy elsewhere): task 2 alone
  // takes its share, then steals everything else.
  RangeShares r;
  const int64_t bounds[5] = {0, 7, 7, 30, 31};
  r.reset(bounds, 4);
  std::vector<int> hits(31);
  for (const Range& g : drain(&r, 2, 3)) {
    ASSERT_LT(g.first, g.second);
    for (int64_t i = g.first; i < g.second; ++i) ++hits[static_cast<size_t>(i)];
  }
  for (size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(hits[i], 1) << "item " << i;
}

TEST(RangeShares, ThreadsClaimEveryItemExactlyOnce) {
  for (int threads : {1, 2, 3, 4, 8}) {
    ThreadingContext ctx(synthetic_topology(1, 8), ThreadingOptions{threads, true, 20});
    ThreadPool& pool = ctx.pool();
    std::mt19937 rng(static_cast<uint32_t>(threads));
    for (int round = 0; round < 50; ++round) {
      const int shares = 1 + static_cast<int>(rng() % 8);
      const int64_t n = static_cast<int64_t>(rng() % 5000);
      std::vector<int64_t> bounds(static_cast<size_t>(shares) + 1, 0);
      for (int s = 1; s < shares; ++s) bounds[s] = static_cast<int64_t>(rng() % (n + 1));
      bounds[shares] = n;
      std::sort(bounds.begin(), bounds.end());
      const int64_t chunk = 1 + static_cast<int64_t>(rng() % 40);
      RangeShares r;
      r.reset(bounds.data(), shares);
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.run(static_cast<size_t>(shares), [&](size_t s) {
        int64_t b = 0, e = 0;
        int k = 0;
        do {
          while (r.take(static_cast<int>(s), chunk, &b, &e)) {
            for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
            if (++k % 3 == static_cast<int>(s % 3)) std::this_thread::yield();  // uneven speeds
          }
        } while (r.steal_into(static_cast<int>(s)));
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1)
            << "item " << i << " of " << n << ", " << shares << " shares, chunk " << chunk
            << ", " << threads << " threads";
      }
    }
  }
}

TEST(RangeShares, BadBoundsAreErrors) {
  RangeShares r;
  const int64_t descending[3] = {0, 9, 4};
  EXPECT_THROW(r.reset(descending, 2), Error);
  const int64_t not_from_zero[2] = {1, 4};
  EXPECT_THROW(r.reset(not_from_zero, 1), Error);
  const int64_t huge[2] = {0, int64_t{1} << 32};
  EXPECT_THROW(r.reset(huge, 1), Error);
  const int64_t ok[2] = {0, 4};
  EXPECT_THROW(r.reset(ok, 0), Error);
  EXPECT_THROW(r.reset(ok, RangeShares::kMaxShares + 1), Error);
}

}  // namespace
}  // namespace tandem
