#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/memory.h"

namespace tandem {
namespace {

bool aligned_to(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

TEST(AlignedBuffer, AlignedWritableAndMovable) {
  for (size_t bytes : {1u, 63u, 64u, 65u, 4096u, 1000003u}) {
    AlignedBuffer b(bytes);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_TRUE(aligned_to(b.data(), 64)) << bytes;
    EXPECT_EQ(b.size(), bytes);
    EXPECT_FALSE(b.mmapped());
    std::memset(b.data(), 0xab, bytes);
    EXPECT_EQ(b.as<unsigned char>()[bytes - 1], 0xab);
  }
  AlignedBuffer a(1000, AllocOptions{4096, false, -1, false, true});
  EXPECT_TRUE(aligned_to(a.data(), 4096));
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(a.as<char>()[i], 0) << "zero option, byte " << i;
  void* p = a.data();
  AlignedBuffer moved(std::move(a));
  EXPECT_EQ(moved.data(), p);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_TRUE(a.empty());
  AlignedBuffer assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.data(), p);
  EXPECT_EQ(assigned.size(), 1000u);
}

TEST(AlignedBuffer, EmptyAndBadArguments) {
  AlignedBuffer empty(0);
  EXPECT_TRUE(empty.empty());
  EXPECT_EQ(empty.data(), nullptr);
  try {
    AlignedBuffer bad(100, AllocOptions{48});
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("48"), std::string::npos);
  }
}

TEST(AlignedBuffer, ImpossibleSizesAreResourceErrorsNamingTheSize) {
  for (bool huge : {false, true}) {
    try {
      AlignedBuffer b(uint64_t{1} << 62, AllocOptions{64, huge});
      FAIL() << "allocated 4 EiB";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kResource);
      EXPECT_NE(std::string(e.what()).find("4611686018427387904"), std::string::npos) << e.what();
    }
    EXPECT_THROW(AlignedBuffer(SIZE_MAX, AllocOptions{64, huge}), Error);  // rounding overflows
  }
}

TEST(AlignedBuffer, HugePagesAreTwoMiBAlignedAndUsedWhenThpAllows) {
  constexpr size_t kBytes = 8u << 20;
  AlignedBuffer b(kBytes, AllocOptions{64, true, -1, /*prefault=*/true});
  ASSERT_NE(b.data(), nullptr);
  EXPECT_TRUE(b.mmapped());
  EXPECT_TRUE(aligned_to(b.data(), kHugePageBytes));
  for (size_t i = 0; i < kBytes; i += 4096) ASSERT_EQ(b.as<char>()[i], 0);
  const ThpMode mode = thp_mode();
  if (mode == ThpMode::kAlways || mode == ThpMode::kMadvise) {
    EXPECT_TRUE(b.huge_pages());
    // Prefaulted 2 MiB-aligned madvised memory is backed by huge pages (defrag permitting).
    EXPECT_GT(b.huge_page_bytes(), 0u);
    EXPECT_LE(b.huge_page_bytes(), kBytes);
  }
  AlignedBuffer small(100, AllocOptions{64, true});
  EXPECT_EQ(small.size(), 100u);  // the mapping is rounded to 2 MiB, the size is what was asked
  EXPECT_TRUE(aligned_to(small.data(), kHugePageBytes));
}

TEST(AlignedBuffer, NumaBindingFallsBackOnOneNode) {
  AlignedBuffer b(1u << 20, AllocOptions{64, false, 0, true});
  ASSERT_NE(b.data(), nullptr);
  EXPECT_TRUE(b.mmapped());
  if (numa_node_count() > 1) {
    EXPECT_TRUE(b.numa_bound());
    EXPECT_EQ(b.numa_node(), 0);
  } else {
    EXPECT_FALSE(b.numa_bound());
    EXPECT_EQ(b.numa_node(), -1);
  }
  // A node that does not exist never binds, but the memory is still usable.
  AlignedBuffer c(4096, AllocOptions{64, false, 4095});
  EXPECT_FALSE(c.numa_bound());
  c.as<int>()[10] = 7;
  EXPECT_EQ(c.as<int>()[10], 7);
}

TEST(Thp, SelectorParsingAndTheSystemsMode) {
  EXPECT_EQ(parse_sysfs_selector("always [madvise] never"), "madvise");
  EXPECT_EQ(parse_sysfs_selector("[always] madvise never\n"), "always");
  EXPECT_EQ(parse_sysfs_selector("always madvise never"), "");
  EXPECT_EQ(parse_sysfs_selector(""), "");
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (std::getline(in, line)) {
    EXPECT_EQ(thp_mode_name(thp_mode()), parse_sysfs_selector(line));
  } else {
    EXPECT_EQ(thp_mode(), ThpMode::kUnknown);
  }
}

TEST(Arena, BumpsAlignsResetsAndRewinds) {
  Arena arena(4096, AllocOptions{4096});  // a page-aligned block: offsets below are absolute
  EXPECT_EQ(arena.capacity(), 4096u);
  char* a = static_cast<char*>(arena.allocate(10));
  EXPECT_TRUE(aligned_to(a, 64));
  char* b = static_cast<char*>(arena.allocate(1));
  EXPECT_EQ(b, a + 64);  // 10 bytes rounded up to the next 64-byte boundary
  EXPECT_EQ(arena.used(), 65u);
  char* c = static_cast<char*>(arena.allocate(8, 256));
  EXPECT_TRUE(aligned_to(c, 256));
  EXPECT_EQ(c, a + 256);
  const size_t mark = arena.mark();
  float* f = arena.allocate_array<float>(100);
  EXPECT_EQ(reinterpret_cast<char*>(f), a + 320);
  EXPECT_EQ(arena.used(), 720u);
  arena.rewind(mark);
  EXPECT_EQ(arena.used(), 264u);
  EXPECT_EQ(arena.allocate_array<float>(100), f);  // the same space again
  arena.reset();
  EXPECT_EQ(arena.used(), 0u);
  EXPECT_EQ(arena.high_water(), 720u);
  EXPECT_EQ(arena.allocate(4096), a);  // exactly the capacity fits
}

TEST(Arena, ExhaustionIsAResourceErrorWithTheSizes) {
  Arena arena(1024);
  arena.allocate(1000);
  try {
    arena.allocate(100);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResource);
    EXPECT_NE(std::string(e.what()).find("100 bytes requested with 1000 of 1024"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(arena.used(), 1000u);  // a failed allocation changes nothing
  EXPECT_THROW(arena.allocate_array<double>(SIZE_MAX / 4), Error);
  EXPECT_THROW(arena.allocate(SIZE_MAX), Error);
  Arena none;
  EXPECT_THROW(none.allocate(1), Error);
}

}  // namespace
}  // namespace tandem
