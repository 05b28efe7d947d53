// --timeline FILE's file (core/trace_events.h): opened when the run starts, so that a path that
// cannot be written fails before the run rather than after it; recording starts there; the
// trace-event JSON is written and the file committed by finish().
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/trace_events.h"
#include "formats/output_file.h"

namespace tandem::tools {

class TimelineFile {
 public:
  // Nothing when `path` is empty; else the file, and recording (from set_recording(true) when
  // `paused`).
  explicit TimelineFile(const std::string& path, bool paused = false) {
    if (path.empty()) return;
    file_.emplace(path);
    trace::start(kMaxEvents, paused);
  }
  bool on() const { return file_.has_value(); }
  void finish() {
    if (!file_) return;
    trace::write_json([this](std::string_view s) { file_->write(s.data(), s.size()); });
    file_->commit();
    file_.reset();
  }

 private:
  static constexpr size_t kMaxEvents = size_t{1} << 21;  // (~300 MB of JSON at most)
  std::optional<OutputFile> file_;
};

}  // namespace tandem::tools
