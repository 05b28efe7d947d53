#include "core/trace_events.h"

#include <fmt/format.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>


namespace tandem::trace {
namespace {

struct Event {
  const char* name;
  const char* category;
  int64_t t0_ns, dur_ns;
  int64_t step;
  Args args;
};

// One thread's track: its events, appended by it alone (the mutex is for write()).
struct Track {
  int id = 0;
  std::string name;
  bool named = false;  // named_track()'s (no thread's)
  std::mutex mu;
  std::vector<Event> events;
};

struct Recorder {
  std::mutex mu;
  std::vector<std::unique_ptr<Track>> tracks;  // (outlive their threads)
  std::atomic<bool> recording{false};
  std::atomic<int64_t> step{-1};
  std::atomic<size_t> events{0}, dropped{0};
  size_t max_events = 0;
  Clock::time_point t0 = Clock::now();
};

Recorder& recorder() {
  static Recorder* r = new Recorder;  // (never destroyed: threads may record at exit)
  return *r;
}

thread_local Track* t_track = nullptr;

Track& track() {
  if (t_track == nullptr) {
    Recorder& r = recorder();
    std::lock_guard<std::mutex> lock(r.mu);
    r.tracks.push_back(std::make_unique<Track>());
    t_track = r.tracks.back().get();
    t_track->id = static_cast<int>(r.tracks.size());
  }
  return *t_track;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

void start(size_t max_events, bool paused) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& t : r.tracks) {
    std::lock_guard<std::mutex> tl(t->mu);
    t->events.clear();
  }
  r.max_events = max_events;
  r.events = 0;
  r.dropped = 0;
  r.t0 = Clock::now();
  r.recording.store(!paused, std::memory_order_relaxed);
}

bool recording() {
  return recorder().recording.load(std::memory_order_relaxed);
}

void set_recording(bool on) {
  recorder().recording.store(on, std::memory_order_relaxed);
}

void name_thread(const std::string& name) {
  Track& t = track();
  if (!t.name.empty()) return;  // (only this thread sets it)
  std::lock_guard<std::mutex> lock(t.mu);
  t.name = name;
}

void set_step(int64_t step) {
  recorder().step.store(step, std::memory_order_relaxed);
}

namespace {

void add_event(Track& t, const char* name, const char* category, Clock::time_point t0,
               Clock::time_point t1, const Args& args) {
  Recorder& r = recorder();
  if (r.events.fetch_add(1, std::memory_order_relaxed) >= r.max_events) {
    r.dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const auto ns = [&](Clock::duration d) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  };
  std::lock_guard<std::mutex> lock(t.mu);
  t.events.push_back(Event{name, category, ns(t0 - r.t0), ns(t1 - t0),
                           r.step.load(std::memory_order_relaxed), args});
}

}  // namespace

void record(const char* name, const char* category, Clock::time_point t0, Clock::time_point t1,
            const Args& args) {
  add_event(track(), name, category, t0, t1, args);
}

int named_track(const std::string& name) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& t : r.tracks) {
    if (t->named && t->name == name) return t->id;
  }
  r.tracks.push_back(std::make_unique<Track>());
  Track& t = *r.tracks.back();
  t.id = static_cast<int>(r.tracks.size());
  t.name = name;
  t.named = true;
  return t.id;
}

void record_on(int track, const char* name, const char* category, Clock::time_point t0,
               Clock::time_point t1, const Args& args) {
  Recorder& r = recorder();
  Track* t = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (track < 1 || track > static_cast<int>(r.tracks.size())) return;
    t = r.tracks[static_cast<size_t>(track - 1)].get();
  }
  add_event(*t, name, category, t0, t1, args);
}

void write_json(const std::function<void(std::string_view)>& sink) {
  Recorder& r = recorder();
  r.recording = false;
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  const auto add = [&](const std::string& event) {
    if (!first) out += ",\n";
    first = false;
    out += event;
    if (out.size() > (4u << 20)) {
      sink(out);
      out.clear();
    }
  };
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& t : r.tracks) {
    std::lock_guard<std::mutex> tl(t->mu);
    if (t->events.empty()) continue;
    const std::string name = t->name.empty() ? fmt::format("thread {}", t->id) : t->name;
    add(fmt::format(R"({{"ph": "M", "pid": 1, "tid": {}, "name": "thread_name", )"
                    R"("args": {{"name": {}}}}})",
                    t->id, quoted(name)));
    add(fmt::format(R"({{"ph": "M", "pid": 1, "tid": {}, "name": "thread_sort_index", )"
                    R"("args": {{"sort_index": {}}}}})",
                    t->id, t->id));
    for (const Event& e : t->events) {
      std::string args = fmt::format(R"("step": {})", e.step);
      if (e.args.layer >= 0) args += fmt::format(R"(, "layer": {})", e.args.layer);
      if (e.args.expert >= 0) args += fmt::format(R"(, "expert": {})", e.args.expert);
      if (e.args.tokens >= 0) args += fmt::format(R"(, "tokens": {})", e.args.tokens);
      add(fmt::format(R"({{"ph": "X", "pid": 1, "tid": {}, "name": {}, "cat": {}, "ts": {:.3f}, )"
                      R"("dur": {:.3f}, "args": {{{}}}}})",
                      t->id, quoted(e.name), quoted(e.category), e.t0_ns / 1e3, e.dur_ns / 1e3,
                      args));
    }
  }
  out += fmt::format("\n], \"otherData\": {{\"dropped_events\": {}}}}}\n", r.dropped.load());
  sink(out);
}

}  // namespace tandem::trace
