// The caching device allocator (runtime/block_pool.h) over a counting raw allocator: freed blocks
// serve later requests of about their size without a raw call, never one of less than 4/5 of
// their size; the budget bounds live + cached bytes (cached blocks given back, largest first, to
// make room); a raw allocator that fails gets the cache back and one retry; errors name the bytes
// and the budget's flag; everything goes back to the raw allocator at the end.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "core/error.h"
#include "runtime/block_pool.h"

namespace tandem::rt {
namespace {

// Host memory standing for device memory; refuses past `limit` bytes held.
struct FakeRaw {
  uint64_t limit = ~uint64_t{0};
  uint64_t held = 0;
  int64_t allocs = 0, frees = 0;
  std::set<void*> live;
  std::unordered_map<void*, uint64_t> sizes;

  BlockPool::Raw raw() {
    BlockPool::Raw r;
    r.alloc = [this](uint64_t bytes, std::string* why) -> void* {
      if (held + bytes > limit) {
        *why = "out of memory";
        return nullptr;
      }
      void* p = std::malloc(bytes);
      held += bytes;
      ++allocs;
      live.insert(p);
      sizes[p] = bytes;
      return p;
    };
    r.free = [this](void* p) {
      EXPECT_EQ(live.erase(p), 1u) << "a raw free of " << p << " which is not held";
      held -= sizes[p];
      ++frees;
      std::free(p);
    };
    return r;
  }
};

constexpr uint64_t kKiB = 1024;

TEST(BlockPool, FreedBlocksServeRequestsOfAboutTheirSize) {
  FakeRaw raw;
  {
    BlockPool pool(uint64_t{1} << 30, raw.raw(), "dev", "--vram-budget");
    void* a = pool.alloc(100 * kKiB);
    EXPECT_EQ(pool.used(), 100 * kKiB);
    pool.free(a);
    EXPECT_EQ(pool.used(), 0u);
    EXPECT_EQ(pool.cached(), 100 * kKiB);
    // 90 KiB: the 100 KiB block serves it (a tenth wasted), no raw call.
    void* b = pool.alloc(90 * kKiB);
    EXPECT_EQ(b, a);
    EXPECT_EQ(raw.allocs, 1);
    EXPECT_EQ(pool.used(), 100 * kKiB);  // (the block's size)
    EXPECT_EQ(pool.stats().reuses, 1);
    pool.free(b);
    // 70 KiB is less than 4/5 of the block: new memory.
    void* c = pool.alloc(70 * kKiB);
    EXPECT_NE(c, a);
    EXPECT_EQ(raw.allocs, 2);
    // Of two cached blocks the smallest that fits serves.
    void* d = pool.alloc(200 * kKiB);
    pool.free(c);
    pool.free(d);
    EXPECT_EQ(pool.alloc(65 * kKiB), c);
    EXPECT_EQ(pool.alloc(190 * kKiB), d);
    // Sizes round up to the granule.
    void* e = pool.alloc(1);
    EXPECT_EQ(pool.used(), 70 * kKiB + 200 * kKiB + BlockPool::kGranule);
    pool.free(e);
    EXPECT_EQ(raw.frees, 0);
    // A choice: 100 and 110 KiB cached (allocated in either order), both can serve 95 KiB: the
    // smaller one does, and the larger is left for a larger request.
    for (const bool larger_first : {false, true}) {
      void* first = pool.alloc(larger_first ? 110 * kKiB : 100 * kKiB);
      void* second = pool.alloc(larger_first ? 100 * kKiB : 110 * kKiB);
      void* big = larger_first ? first : second;     // 110 KiB
      void* small = larger_first ? second : first;  // 100 KiB
      pool.free(big);
      pool.free(small);
      void* got = pool.alloc(95 * kKiB);
      EXPECT_EQ(got, small) << (larger_first ? "larger allocated first" : "smaller first");
      EXPECT_EQ(pool.alloc(105 * kKiB), big);
      pool.free(got);
      pool.free(big);
      pool.trim();
    }
  }
  EXPECT_EQ(raw.frees, raw.allocs);  // live and cached blocks given back
  EXPECT_TRUE(raw.live.empty());
}

TEST(BlockPool, TheBudgetBoundsLiveAndCachedBytes) {
  FakeRaw raw;
  BlockPool pool(kKiB * kKiB, raw.raw(), "cuda:0 (test)", "--vram-budget");
  void* a = pool.alloc(512 * kKiB);
  void* b = pool.alloc(256 * kKiB);
  pool.free(a);
  pool.free(b);
  // 768 KiB: neither cached block serves it; 512 + 256 + 768 KiB would pass the budget, so the
  // largest cached block goes back first, which is enough.
  void* c = pool.alloc(768 * kKiB);
  EXPECT_EQ(raw.frees, 1);
  EXPECT_EQ(raw.live.count(a), 0u);
  EXPECT_EQ(pool.cached(), 256 * kKiB);
  EXPECT_LE(raw.held, kKiB * kKiB);
  // More than is left: an error naming the bytes and the flag, nothing changed.
  try {
    pool.alloc(300 * kKiB);
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kResource);
    const std::string what = err.what();
    EXPECT_NE(what.find("cuda:0 (test): cannot allocate 307200 bytes: 262144 of 1048576 bytes "
                        "left (--vram-budget)"),
              std::string::npos)
        << what;
  }
  EXPECT_EQ(pool.used(), 768 * kKiB);
  // An absurd size: the same error, no raw call.
  const int64_t allocs = raw.allocs;
  EXPECT_THROW(pool.alloc(~uint64_t{0}), Error);
  EXPECT_EQ(raw.allocs, allocs);
  pool.free(c);
  pool.trim();
  EXPECT_EQ(pool.cached(), 0u);
  EXPECT_TRUE(raw.live.empty());
}

TEST(BlockPool, AFailingRawAllocationGetsTheCacheBackAndOneRetry) {
  FakeRaw raw;
  raw.limit = 600 * kKiB;  // the GPU holds less than the budget says
  BlockPool pool(uint64_t{1} << 30, raw.raw(), "dev", "--vram-budget");
  void* a = pool.alloc(512 * kKiB);
  pool.free(a);
  void* b = pool.alloc(256 * kKiB);  // 512 + 256 KiB > 600: the cached block goes, then it fits
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(pool.cached(), 0u);
  EXPECT_EQ(raw.frees, 1);
  try {
    pool.alloc(500 * kKiB);  // nothing cached to give back: the raw allocator's reason
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kResource);
    EXPECT_NE(std::string(err.what()).find("cannot allocate 512000 bytes: out of memory"),
              std::string::npos)
        << err.what();
  }
  EXPECT_EQ(pool.used(), 256 * kKiB);
}

TEST(BlockPool, FreeingWhatItDidNotHandOutIsAnError) {
  FakeRaw raw;
  BlockPool pool(kKiB * kKiB, raw.raw(), "dev", "--vram-budget");
  int x = 0;
  try {
    pool.free(&x);
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kInvalidArgument);
  }
  void* a = pool.alloc(64);
  pool.free(a);
  EXPECT_THROW(pool.free(a), Error);  // (twice)
  pool.free(nullptr);                 // (a no-op)
}

}  // namespace
}  // namespace tandem::rt
