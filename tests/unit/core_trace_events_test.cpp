// The trace recorder's tracks: a thread's spans on its own track, and a named track (a GPU
// stream's, whose times the host reads at a sync) that any thread adds to -- one track per name,
// written as Chrome trace-event JSON with its name and its spans at the times given.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <map>
#include <thread>
#include <vector>

#include "core/trace_events.h"

namespace tandem::trace {
namespace {

using Json = nlohmann::json;

Json written() {
  std::string text;
  write_json([&](std::string_view s) { text += s; });
  return Json::parse(text);
}

TEST(TraceEvents, NamedTracksTakeSpansFromAnyThread) {
  start();
  name_thread("host");
  const Clock::time_point t0 = Clock::now();
  const auto ms = [&](int n) { return t0 + std::chrono::milliseconds(n); };
  const int stream = named_track("cuda stream 0");
  EXPECT_EQ(named_track("cuda stream 0"), stream);
  EXPECT_NE(named_track("cuda stream 1"), stream);
  record_on(stream, "matmul", "device", ms(1), ms(3), {.layer = 2});
  std::thread other([&] { record_on(named_track("cuda stream 0"), "norm", "device", ms(4), ms(5)); });
  other.join();
  record("step", "host", ms(0), ms(6));
  const Json j = written();

  std::map<int, std::string> names;
  std::map<std::string, std::vector<Json>> spans;  // by track name
  for (const Json& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"]] = e["args"]["name"];
  }
  for (const Json& e : j["traceEvents"]) {
    if (e["ph"] == "X") spans[names.at(e["tid"].get<int>())].push_back(e);
  }
  ASSERT_EQ(spans["cuda stream 0"].size(), 2u) << j.dump();
  ASSERT_EQ(spans["host"].size(), 1u);
  EXPECT_EQ(spans.count("cuda stream 1"), 0u);  // (a track without spans is not written)
  const Json& matmul = spans["cuda stream 0"][0];
  EXPECT_EQ(matmul["name"], "matmul");
  EXPECT_EQ(matmul["args"]["layer"], 2);
  EXPECT_NEAR(matmul["dur"].get<double>(), 2000.0, 1e-3);  // microseconds
  const double host_ts = spans["host"][0]["ts"].get<double>();
  EXPECT_NEAR(matmul["ts"].get<double>() - host_ts, 1000.0, 1e-3);
  EXPECT_NEAR(spans["cuda stream 0"][1]["ts"].get<double>() - host_ts, 4000.0, 1e-3);

  // A new recording starts empty, named tracks too.
  start();
  EXPECT_TRUE(written()["traceEvents"].empty());
}

}  // namespace
}  // namespace tandem::trace
