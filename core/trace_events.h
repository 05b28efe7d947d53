// The run's timeline as Chrome trace events (`--timeline FILE` of profile, bench and serve): what
// each thread did, as complete spans on one track per thread -- the host thread's steps and
// layers (attention, router, the wait for the CPU experts), each CPU worker's expert batches, each
// device stream's ops and copies (a CUDA stream's kernels, timed by events) -- written as the JSON that Perfetto (ui.perfetto.dev) and
// chrome://tracing open (docs/performance.md, "Reading a timeline").
//
// The recorder is the process's: a trace describes the whole process, and the threads that add
// to it (pool workers, device streams) are made far from the flag that asks for it. Nothing is
// recorded until start(); then a span costs two clock reads and an append to its thread's own
// buffer, and while recording is off, one relaxed load.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace tandem::trace {

using Clock = std::chrono::steady_clock;

// Clears what was recorded, and records from now (or from set_recording(true) when `paused`),
// up to `max_events` spans (the rest are counted, not kept).
void start(size_t max_events = size_t{1} << 22, bool paused = false);
// Whether spans are recorded now (start()ed and not paused).
bool recording();
void set_recording(bool on);

// The calling thread's track ("host", "cpu worker 3", "device stream 1"); its first name stays.
void name_thread(const std::string& name);
// The step the host is in (Model::forward numbers them): every span records it.
void set_step(int64_t step);

struct Args {
  int64_t layer = -1;   // a model layer
  int64_t expert = -1;  // a routed expert
  int64_t tokens = -1;  // tokens it computed
};

void record(const char* name, const char* category, Clock::time_point t0, Clock::time_point t1,
            const Args& args = {});

// A track of its own name, not a thread's: for work the host learns the times of afterwards
// (a GPU stream's kernels, read from timing events at a sync). The same name, the same track.
int named_track(const std::string& name);
void record_on(int track, const char* name, const char* category, Clock::time_point t0,
               Clock::time_point t1, const Args& args = {});

// A span from its construction to its destruction (names and categories: string literals).
class Span {
 public:
  Span(const char* name, const char* category, const Args& args = {})
      : name_(name), category_(category), args_(args), on_(recording()) {
    if (on_) t0_ = Clock::now();
  }
  ~Span() {
    if (on_) record(name_, category_, t0_, Clock::now(), args_);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* name_;
  const char* category_;
  Args args_;
  bool on_;
  Clock::time_point t0_;
};

// Everything recorded since start(), as trace-event JSON ({"traceEvents": [...]}), handed to
// `out` in pieces (the tools write it through an OutputFile). Recording stops.
void write_json(const std::function<void(std::string_view)>& out);

}  // namespace tandem::trace
