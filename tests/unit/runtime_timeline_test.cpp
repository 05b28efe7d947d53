// rt::Timeline: the union of each lane's intervals, their overlap and the link's bytes, against
// sums worked out by hand; take() forgets what it reported.
#include <gtest/gtest.h>

#include <chrono>

#include "runtime/timeline.h"

namespace tandem::rt {
namespace {

TEST(Timeline, UnionsOverlapAndBytes) {
  Timeline t;
  const auto z = Timeline::Clock::now();
  auto at = [z](int ms) { return z + std::chrono::milliseconds(ms); };
  // Device: [0, 10) and [5, 20) overlap (union 20 ms), [30, 40) apart: 30 ms.
  t.add(Timeline::kDevice, at(5), at(20));
  t.add(Timeline::kDevice, at(0), at(10));
  t.add(Timeline::kDevice, at(30), at(40));
  // CPU experts: [15, 35): 20 ms, overlapping the device over [15, 20) and [30, 35): 10 ms.
  t.add(Timeline::kCpuExperts, at(15), at(35));
  t.add_bytes(true, 1000);
  t.add_bytes(true, 24);
  t.add_bytes(false, 7);
  const Timeline::Summary s = t.take();
  EXPECT_NEAR(s.device_busy_s, 0.030, 1e-9);
  EXPECT_NEAR(s.cpu_busy_s, 0.020, 1e-9);
  EXPECT_NEAR(s.overlap_s, 0.010, 1e-9);
  EXPECT_EQ(s.h2d_bytes, 1024u);
  EXPECT_EQ(s.d2h_bytes, 7u);
  EXPECT_GE(s.wall_s, 0.0);
  const Timeline::Summary again = t.take();
  EXPECT_EQ(again.device_busy_s, 0.0);
  EXPECT_EQ(again.cpu_busy_s, 0.0);
  EXPECT_EQ(again.h2d_bytes, 0u);
  // format: fractions of the given time, bytes per token.
  EXPECT_EQ(Timeline::format(s, 0.1, 2),
            "accelerator busy 30% of the decode time, CPU experts in flight 20%, both at once 10%; "
            "link per token 0.001 MB to the device, 0.000 MB back");
}

}  // namespace
}  // namespace tandem::rt
