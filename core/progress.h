// A progress bar on stderr for long work (converting, loading, writing a model):
//
//   Progress p("writing", total_bytes);
//   p.add(n);        // from any thread
//   p.finish();      // or let the destructor do it
//
// It is drawn only when stderr is a terminal and the log level is warn (the default) or more
// verbose: `--log error` silences it. Redraws are limited to a few per second. When stderr is not a
// terminal nothing is drawn and finish() writes one log_info line. Not for hot loops finer than a
// few microseconds: add() is one atomic add.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace tandem {

class Progress {
 public:
  enum class Unit { kBytes, kItems };
  // total = 0: unknown (shows the count and rate, no bar).
  Progress(std::string label, uint64_t total, Unit unit = Unit::kBytes);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void add(uint64_t n);
  void set(uint64_t done);
  // Draws the final state (or logs one line) once; later calls do nothing.
  void finish();

  uint64_t done() const { return done_.load(std::memory_order_relaxed); }
  bool drawing() const { return draw_; }
  // One rendered line, e.g. "writing  [#####     ]  50%  512 MiB / 1 GiB  1.2 GiB/s": for tests.
  std::string render(double elapsed_s, int width) const;

  // Forces drawing on or off regardless of the terminal (tests; --progress flags).
  void set_drawing(bool draw) { draw_ = draw; }

 private:
  void maybe_draw();
  std::string label_;
  uint64_t total_;
  Unit unit_;
  bool draw_ = false;
  bool finished_ = false;
  std::atomic<uint64_t> done_{0};
  std::chrono::steady_clock::time_point start_;
  std::atomic<int64_t> next_draw_ns_{0};  // since start_; rate limit
  std::mutex draw_mutex_;
};

}  // namespace tandem
