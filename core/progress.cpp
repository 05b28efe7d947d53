#include "core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "core/log.h"
#include "core/topology.h"

namespace tandem {
namespace {

constexpr int64_t kRedrawIntervalNs = 200'000'000;  // 5 redraws per second
constexpr int kLineWidth = 100;

std::string amount(uint64_t n, Progress::Unit unit) {
  return unit == Progress::Unit::kBytes ? format_binary_bytes(n) : fmt::format("{}", n);
}

}  // namespace

Progress::Progress(std::string label, uint64_t total, Unit unit)
    : label_(std::move(label)),
      total_(total),
      unit_(unit),
      start_(std::chrono::steady_clock::now()) {
  draw_ = isatty(STDERR_FILENO) == 1 && log_level() >= LogLevel::kWarn;
}

Progress::~Progress() {
  finish();
}

void Progress::add(uint64_t n) {
  done_.fetch_add(n, std::memory_order_relaxed);
  if (draw_) maybe_draw();
}

void Progress::set(uint64_t done) {
  done_.store(done, std::memory_order_relaxed);
  if (draw_) maybe_draw();
}

void Progress::maybe_draw() {
  const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - start_)
                             .count();
  int64_t due = next_draw_ns_.load(std::memory_order_relaxed);
  // One thread wins the right to draw this interval; the others return at once.
  if (now_ns < due || !next_draw_ns_.compare_exchange_strong(due, now_ns + kRedrawIntervalNs)) {
    return;
  }
  std::lock_guard lock(draw_mutex_);
  if (finished_) return;
  const std::string line = render(static_cast<double>(now_ns) * 1e-9, kLineWidth);
  std::fprintf(stderr, "\r%s\033[K", line.c_str());
  std::fflush(stderr);
}

void Progress::finish() {
  std::lock_guard lock(draw_mutex_);
  if (finished_) return;
  finished_ = true;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (draw_) {
    std::fprintf(stderr, "\r%s\033[K\n", render(elapsed, kLineWidth).c_str());
    std::fflush(stderr);
  } else {
    log_info("{}: {} in {:.1f} s", label_, amount(done(), unit_), elapsed);
  }
}

std::string Progress::render(double elapsed_s, int width) const {
  const uint64_t done_now = done();
  std::string rate;
  if (elapsed_s > 0) {
    const double per_s = static_cast<double>(done_now) / elapsed_s;
    rate = unit_ == Unit::kBytes ? format_binary_bytes(static_cast<uint64_t>(per_s)) + "/s"
                                 : fmt::format("{:.0f}/s", per_s);
  }
  if (total_ == 0) return fmt::format("{}  {}  {}", label_, amount(done_now, unit_), rate);
  const double fraction =
      std::min(1.0, static_cast<double>(done_now) / static_cast<double>(total_));
  const std::string tail = fmt::format(" {:3.0f}%  {} / {}  {}", fraction * 100.0,
                                       amount(done_now, unit_), amount(total_, unit_), rate);
  // The bar takes what the label and the numbers leave of the line, at least 10 columns.
  const int bar = std::max(10, width - static_cast<int>(label_.size() + tail.size()) - 4);
  const int filled = static_cast<int>(fraction * bar + 1e-9);
  return fmt::format("{}  [{}{}]{}", label_, std::string(static_cast<size_t>(filled), '#'),
                     std::string(static_cast<size_t>(bar - filled), ' '), tail);
}

}  // namespace tandem
