#include "runtime/timeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

namespace tandem::rt {

namespace {

using Interval = std::pair<Timeline::Clock::time_point, Timeline::Clock::time_point>;

// The union of the intervals, as disjoint sorted intervals.
std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const Interval& s : v) {
    if (!out.empty() && s.first <= out.back().second) {
      out.back().second = std::max(out.back().second, s.second);
    } else {
      out.push_back(s);
    }
  }
  return out;
}

double seconds(Timeline::Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

double length(const std::vector<Interval>& v) {
  double s = 0;
  for (const Interval& x : v) s += seconds(x.second - x.first);
  return s;
}

// The length of the intersection of two unions.
double overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double s = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const auto lo = std::max(a[i].first, b[j].first);
    const auto hi = std::min(a[i].second, b[j].second);
    if (lo < hi) s += seconds(hi - lo);
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return s;
}

}  // namespace

void Timeline::add(Lane lane, Clock::time_point t0, Clock::time_point t1) {
  std::lock_guard<std::mutex> lock(mu_);
  lanes_[lane].push_back(Span{t0, t1});
}

void Timeline::add_bytes(bool h2d, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  (h2d ? h2d_ : d2h_) += bytes;
}

Timeline::Summary Timeline::take() {
  std::vector<Interval> lanes[2];
  Summary s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int l = 0; l < 2; ++l) {
      for (const auto& x : lanes_[l]) lanes[l].emplace_back(x.t0, x.t1);
      lanes_[l].clear();
    }
    s.h2d_bytes = std::exchange(h2d_, 0);
    s.d2h_bytes = std::exchange(d2h_, 0);
    const Clock::time_point now = Clock::now();
    s.wall_s = seconds(now - since_);
    since_ = now;
  }
  const std::vector<Interval> dev = merged(std::move(lanes[kDevice]));
  const std::vector<Interval> cpu = merged(std::move(lanes[kCpuExperts]));
  s.device_busy_s = length(dev);
  s.cpu_busy_s = length(cpu);
  s.overlap_s = overlap(dev, cpu);
  return s;
}

std::string Timeline::format(const Summary& s, double seconds, double tokens) {
  return fmt::format(
      "accelerator busy {:.0f}% of the decode time, CPU experts in flight {:.0f}%, both at once "
      "{:.0f}%; link per token {:.3f} MB to the device, {:.3f} MB back",
      100 * s.device_busy_s / seconds, 100 * s.cpu_busy_s / seconds, 100 * s.overlap_s / seconds,
      static_cast<double>(s.h2d_bytes) / tokens / 1e6,
      static_cast<double>(s.d2h_bytes) / tokens / 1e6);
}

}  // namespace tandem::rt
