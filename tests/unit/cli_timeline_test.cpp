// `--timeline FILE`: the run's timeline as Chrome trace events. The file is valid trace-event
// JSON (what Perfetto and chrome://tracing read: "X" spans with ts / dur in microseconds on
// named thread tracks); it has the host's, the CPU workers' and the device streams' tracks; each
// decode step has its spans for every layer (attention, and the MoE layers' router and wait for
// the CPU experts), the CPU experts' batches and the device's copies; and the steps' spans add
// up to the decode time `tandem bench` reports, within 5%.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <set>

#include "engine/jinja_value.h"
#include "tests/test_util.h"

namespace tandem::test {
namespace {

using Json = jinja::Json;

std::string demo() {
  return data_path("demo/tandem-demo-moe-Q4_K_M.gguf").string();
}

TEST(CliTimeline, BenchWritesTheDecodeStepsAsTraceEvents) {
  TempDir tmp("timeline");
  const std::string path = (tmp / "timeline.json").string();
  const int kTokens = 24;
  const CommandResult r = run_tandem(fmt::format(
      "bench -m {} -p 0 -n {} -r 1 --threads 2 --accel host --timeline {} --json", demo(), kTokens, path));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Json bench = Json::parse(r.out);
  const double tps = bench["tests"][0]["avg_tokens_per_s"].get<double>();
  const double decode_us = kTokens / tps * 1e6;

  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  const Json trace = Json::parse(f, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(trace.is_object() && trace["traceEvents"].is_array()) << "not trace-event JSON";
  std::map<int64_t, std::string> tracks;
  for (const Json& e : trace["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("tid") && e.contains("name"));
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      tracks[e["tid"].get<int64_t>()] = e["args"]["name"].get<std::string>();
    }
  }
  std::set<std::string> names;
  for (const auto& [tid, name] : tracks) names.insert(name.substr(0, name.find_last_of(' ')));
  EXPECT_TRUE(names.count("host")) << "no host track";
  EXPECT_TRUE(names.count("cpu worker")) << "no CPU worker track";
  EXPECT_TRUE(names.count("device stream")) << "no device stream track";

  double steps_us = 0;
  int steps = 0;
  std::map<std::string, std::map<int64_t, int>> per_layer;  // span -> layer -> count
  std::map<std::string, int> spans;
  for (const Json& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number() && e["dur"].get<double>() >= 0);
    ASSERT_TRUE(tracks.count(e["tid"].get<int64_t>())) << "a span on an unnamed track";
    const std::string name = e["name"].get<std::string>();
    ++spans[name];
    if (name == "step") {
      ++steps;
      steps_us += e["dur"].get<double>();
      EXPECT_EQ(e["args"]["tokens"], 1);
    }
    if (e["args"].contains("layer")) ++per_layer[name][e["args"]["layer"].get<int64_t>()];
  }
  EXPECT_EQ(steps, kTokens);
  // Every layer's attention in every step; the MoE layers' router and wait in every step.
  ASSERT_FALSE(per_layer["attention"].empty());
  for (const auto& [layer, n] : per_layer["attention"]) EXPECT_EQ(n, kTokens) << layer;
  ASSERT_FALSE(per_layer["router"].empty());
  for (const auto& [layer, n] : per_layer["router"]) {
    EXPECT_EQ(n, kTokens) << layer;
    EXPECT_EQ(per_layer["wait cpu experts"][layer], kTokens) << layer;
    EXPECT_EQ(per_layer["moe"][layer], kTokens) << layer;
  }
  EXPECT_EQ(per_layer["attention"].size(),
            per_layer["router"].size() + per_layer["dense ffn"].size());
  EXPECT_GT(spans["expert gate+up"] + spans["expert"], 0);
  EXPECT_GT(spans["expert down"] + spans["expert"], 0);
  EXPECT_GT(spans["copy_h2d"], 0);
  EXPECT_GT(spans["copy_d2h"], 0);
  // The steps are the decode bench timed.
  EXPECT_NEAR(steps_us, decode_us, 0.05 * decode_us)
      << steps << " steps of " << steps_us << " us, bench: " << decode_us << " us";
}

TEST(CliTimeline, ProfileNeedsAnAcceleratorAndBadPathsAreErrors) {
  const CommandResult p = run_tandem("profile -m " + demo() + " --timeline /tmp/x.json");
  EXPECT_NE(p.exit_code, 0);
  EXPECT_NE(p.err.find("--timeline"), std::string::npos) << p.err;
  const CommandResult b = run_tandem("bench -m " + demo() +
                                     " -p 0 -n 2 -r 1 --timeline /nonexistent/dir/t.json");
  EXPECT_EQ(b.exit_code, 1);
  EXPECT_NE(b.err.find("/nonexistent/dir/t.json"), std::string::npos) << b.err;
}

}  // namespace
}  // namespace tandem::test
