// The emulated host <-> accelerator link of the host device: parse_link (runtime/device.h) and
// EmulatedLink (runtime/host_device.h).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "runtime/device.h"
#include "runtime/host_device.h"

namespace tandem::rt {

namespace {
constexpr double kMinLinkGBps = 0.1, kMaxLinkGBps = 10000, kMaxLinkLatencyUs = 100000;

// A finite, non-negative number filling all of `s`; false otherwise.
bool parse_number(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v) || v < 0) return false;
  *out = v;
  return true;
}

using Clock = EmulatedLink::Clock;

// sleep_until overshoots by tens of microseconds (timer slack), as much as a PCIe copy's whole
// latency: sleep to just before t, then yield-spin to it.
void wait_until(Clock::time_point t) {
  const auto margin = std::chrono::microseconds(100);
  if (t - Clock::now() > margin) std::this_thread::sleep_until(t - margin);
  while (Clock::now() < t) std::this_thread::yield();
}
}  // namespace

void EmulatedLink::copy(void* dst, const void* src, uint64_t bytes) {
  const Clock::time_point begin = Clock::now();
  if (spec_.latency_us > 0) {
    wait_until(begin + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double, std::micro>(spec_.latency_us)));
  }
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  if (spec_.gb_per_s <= 0) {
    if (bytes > 0) std::memcpy(d, s, bytes);
    return;
  }
  const double ns_per_byte = 1.0 / spec_.gb_per_s;  // 1 GB/s = 1 byte/ns
  Clock::time_point finish = Clock::now();
  for (uint64_t off = 0; off < bytes; off += kHostLinkChunkBytes) {
    const uint64_t n = std::min(kHostLinkChunkBytes, bytes - off);
    {
      std::lock_guard<std::mutex> lock(mu_);
      const Clock::time_point start = std::max(next_free_, finish);
      finish = start + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double, std::nano>(double(n) * ns_per_byte));
      next_free_ = finish;
    }
    std::memcpy(d + off, s + off, n);
    // Pace only when well ahead: many short waits cost more than they pace.
    if (finish > Clock::now() + std::chrono::microseconds(100)) wait_until(finish);
  }
  wait_until(finish);
}
LinkSpec parse_link(const std::string& text) {
  if (text == "pcie4") return {25.0, 10.0};
  if (text == "pcie5") return {50.0, 8.0};
  if (text == "none") return {0.0, 0.0};
  LinkSpec spec;
  size_t comma = text.find(',');
  std::string gbps = text.substr(0, comma);
  bool ok = parse_number(gbps, &spec.gb_per_s);
  if (ok && comma != std::string::npos) ok = parse_number(text.substr(comma + 1), &spec.latency_us);
  if (!ok) {
    fail(ErrorKind::kInvalidArgument,
         "link '{}': expected pcie4, pcie5, none or GBPS[,LATENCY_US] (non-negative numbers)", text);
  }
  // A copy of one expert at 1e-6 GB/s takes days: a figure no link has is refused rather than
  // emulated. 0 GB/s is "no cap", as `none`.
  if (spec.gb_per_s != 0 && (spec.gb_per_s < kMinLinkGBps || spec.gb_per_s > kMaxLinkGBps)) {
    fail(ErrorKind::kInvalidArgument,
         "link '{}': {} GB/s is outside {}..{} (0: no cap); no real link is that slow or fast",
         text, spec.gb_per_s, kMinLinkGBps, kMaxLinkGBps);
  }
  if (spec.latency_us > kMaxLinkLatencyUs) {
    fail(ErrorKind::kInvalidArgument, "link '{}': latency {} us is more than {} us", text,
         spec.latency_us, kMaxLinkLatencyUs);
  }
  return spec;
}

}  // namespace tandem::rt
