// parse_link: the emulated host <-> accelerator link of the host device (runtime/device.h).
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "runtime/device.h"

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
}  // namespace

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
