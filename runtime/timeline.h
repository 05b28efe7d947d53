// What the accelerator and the CPU experts were doing during a run (`tandem bench` and
// `tandem profile` with an accelerator): the device's compute busy intervals (every stream's ops,
// not its copies, waits or host callbacks), the CPU experts' intervals in flight (from the submit
// of a layer's CPU experts to the return of their wait), and the bytes each way over the link.
// Their unions and the overlap say how much of a decode step ran on both sides at once
// (KTransformers §3.3's goal: the CPU's experts hidden behind the GPU's work, or the reverse).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tandem::rt {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  enum Lane { kDevice = 0, kCpuExperts = 1 };
  Timeline() : since_(Clock::now()) {}

  // Thread-safe.
  void add(Lane lane, Clock::time_point t0, Clock::time_point t1);
  void add_bytes(bool h2d, uint64_t bytes);

  struct Summary {
    double wall_s = 0;         // since the previous take() (or construction)
    double device_busy_s = 0;  // the union of the device's compute intervals
    double cpu_busy_s = 0;     // the union of the CPU experts' intervals in flight
    double overlap_s = 0;      // the time both were busy
    uint64_t h2d_bytes = 0, d2h_bytes = 0;
  };
  // What was recorded since the previous take(), which it forgets (intervals still open are
  // counted by the take after they close).
  Summary take();

  // One line: each side's busy time and their overlap as fractions of `seconds` (the decode's
  // time), the link's bytes per token.
  static std::string format(const Summary& s, double seconds, double tokens);

 private:
  struct Span {
    Clock::time_point t0, t1;
  };
  std::mutex mu_;
  std::vector<Span> lanes_[2];
  uint64_t h2d_ = 0, d2h_ = 0;
  Clock::time_point since_;
};

}  // namespace tandem::rt
