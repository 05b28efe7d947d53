#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "core/log.h"
#include "core/progress.h"

namespace tandem {
namespace {

TEST(Progress, RendersBarPercentAndRate) {
  Progress p("writing", 1 << 20);
  p.set_drawing(false);
  p.add(256 << 10);
  p.add(256 << 10);
  EXPECT_EQ(p.done(), 512u << 10);
  // The tail "  50%  512 KiB / 1 MiB  256 KiB/s" is 33 columns, the label and brackets 7 + 4:
  // 60 - 44 = 16 bar columns, half of them filled; the line is exactly 60 wide.
  EXPECT_EQ(p.render(2.0, 60), "writing  [########        ]  50%  512 KiB / 1 MiB  256 KiB/s");
  p.set(1 << 20);
  EXPECT_EQ(p.render(1.0, 60), "writing  [####################] 100%  1 MiB / 1 MiB  1 MiB/s");
  p.set(2 << 20);  // more than the total: the bar stops at 100 %
  EXPECT_EQ(p.render(1.0, 60), "writing  [####################] 100%  2 MiB / 1 MiB  2 MiB/s");
}

TEST(Progress, ItemsAndUnknownTotal) {
  Progress items("tensors", 0, Progress::Unit::kItems);
  items.set_drawing(false);
  items.add(30);
  EXPECT_EQ(items.render(3.0, 80), "tensors  30  10/s");
  Progress narrow("a-very-long-label-indeed", 10, Progress::Unit::kItems);
  narrow.set_drawing(false);
  narrow.add(5);
  // The bar never gets narrower than 10 columns.
  EXPECT_EQ(narrow.render(1.0, 20), "a-very-long-label-indeed  [#####     ]  50%  5 / 10  5/s");
}

TEST(Progress, QuietWhenStderrIsNotATerminal) {
  Progress p("loading", 100);
  EXPECT_EQ(p.drawing(), isatty(STDERR_FILENO) == 1 && log_level() >= LogLevel::kWarn);
  // Many threads adding concurrently: every unit is counted.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) p.add(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(p.done(), 40000u);
  p.finish();
  p.finish();  // once only
}

}  // namespace
}  // namespace tandem
