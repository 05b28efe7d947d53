// CostModel: piecewise-linear evaluation by hand, the linear constructor, JSON round trip, the
// `tandem profile` file shape, and malformed files naming the key at fault.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/error.h"
#include "runtime/cost_model.h"
#include "tests/test_util.h"

namespace tandem::rt {
namespace {

TEST(RuntimeCostModel, PiecewiseLinearByHand) {
  const std::vector<CostPoint> t = {{1, 1.0}, {4, 2.5}, {8, 4.5}};
  EXPECT_DOUBLE_EQ(cost_table_eval(t, 0), 0.0);
  EXPECT_DOUBLE_EQ(cost_table_eval(t, 1), 1.0);
  EXPECT_DOUBLE_EQ(cost_table_eval(t, 2), 1.5);  // 1 + (1/3) * 1.5
  EXPECT_DOUBLE_EQ(cost_table_eval(t, 4), 2.5);
  EXPECT_DOUBLE_EQ(cost_table_eval(t, 6), 3.5);   // 2.5 + (2/4) * 2
  EXPECT_DOUBLE_EQ(cost_table_eval(t, 12), 6.5);  // last slope 0.5 continued
  const std::vector<CostPoint> from4 = {{4, 2.0}, {8, 3.0}};
  EXPECT_DOUBLE_EQ(cost_table_eval(from4, 1), 2.0);  // below the first point: flat
}

TEST(RuntimeCostModel, LinearConstructor) {
  const CostModel m = CostModel::from_linear(1e-3, 2e-4, 1e-4, 1e-5, 5e-3);
  for (int n : {1, 2, 3, 17, 300}) {
    EXPECT_NEAR(m.cpu_expert(n), 1e-3 + 2e-4 * n, 1e-15);
    EXPECT_NEAR(m.accel_expert(n), 1e-4 + 1e-5 * n, 1e-15);
  }
  EXPECT_EQ(m.cpu_expert(0), 0.0);
  EXPECT_EQ(m.transfer(), 5e-3);
}

TEST(RuntimeCostModel, NoAcceleratorTableUsesRatio) {
  CostModel m = CostModel::from_tables({{1, 2.0}, {2, 4.0}}, {}, 1.0);
  m.accel_fallback_ratio = 0.25;
  EXPECT_DOUBLE_EQ(m.accel_expert(2), 1.0);
}

TEST(RuntimeCostModel, SaveLoadRoundTrip) {
  test::TempDir dir("cost");
  CostModel m = CostModel::from_tables({{1, 0.5}, {16, 2.0}}, {{1, 0.1}, {16, 0.2}}, 0.75);
  m.cpu_layer_overhead = 1e-5;
  m.accel_layer_overhead = 2e-5;
  m.expert_bytes = 123456;
  m.save(dir / "c.json");
  const CostModel r = CostModel::load(dir / "c.json");
  ASSERT_EQ(r.cpu_table.size(), 2u);
  EXPECT_EQ(r.cpu_table[1].tokens, 16);
  EXPECT_DOUBLE_EQ(r.cpu_expert(8), 0.5 + 7.0 / 15 * 1.5);
  EXPECT_DOUBLE_EQ(r.accel_expert(16), 0.2);
  EXPECT_DOUBLE_EQ(r.transfer(), 0.75);
  EXPECT_DOUBLE_EQ(r.cpu_layer_overhead, 1e-5);
  EXPECT_DOUBLE_EQ(r.accel_layer_overhead, 2e-5);
  EXPECT_EQ(r.expert_bytes, 123456u);
}

void write(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p) << text;
}

TEST(RuntimeCostModel, ReadsProfileOutputShape) {
  test::TempDir dir("cost");
  // What `tandem profile` writes (runtime/profile.cpp): extra keys, empty accel table.
  write(dir / "p.json", R"({"format": "tandem-cost-model", "version": 1, "model": "m",
    "cpu_backend": "x", "expert_bytes": 1000, "cpu_expert": [[1, 0.001], [2, 0.0015]],
    "accel_expert": [], "accel": "", "transfer_seconds": 0.0004, "transfer_source": "link"})");
  const CostModel m = CostModel::load(dir / "p.json");
  EXPECT_DOUBLE_EQ(m.cpu_expert(3), 0.002);
  EXPECT_DOUBLE_EQ(m.accel_expert(1), 0.001 * m.accel_fallback_ratio);
  EXPECT_DOUBLE_EQ(m.transfer(), 0.0004);
}

void expect_error(const std::filesystem::path& p, const std::string& text,
                  const std::string& what) {
  write(p, text);
  try {
    CostModel::load(p);
    ADD_FAILURE() << "no error for " << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
  }
}

TEST(RuntimeCostModel, MalformedFilesNameTheKey) {
  test::TempDir dir("cost");
  const auto p = dir / "bad.json";
  const std::string head = R"({"format": "tandem-cost-model", "version": 1, )";
  expect_error(p, "{not json", "JSON");
  expect_error(p, R"({"format": "other", "version": 1})", "format");
  expect_error(p, head + R"("transfer_seconds": 1})", "cpu_expert");
  expect_error(p, head + R"("cpu_expert": [[2, 1.0], [1, 2.0]], "transfer_seconds": 1})",
               "not increasing");
  expect_error(p, head + R"("cpu_expert": [[0, 1.0]], "transfer_seconds": 1})", "tokens");
  expect_error(p, head + R"("cpu_expert": [[1, -1.0]], "transfer_seconds": 1})", "seconds");
  expect_error(p, head + R"("cpu_expert": [[1, 1.0, 3]], "transfer_seconds": 1})",
               "[tokens, seconds]");
  expect_error(p, head + R"("cpu_expert": [[1, 1.0]]})", "transfer_seconds");
  expect_error(p, head + R"("cpu_expert": [[1, 1.0]], "transfer_seconds": "x"})",
               "transfer_seconds");
  EXPECT_THROW(CostModel::load(dir / "missing.json"), Error);
}

}  // namespace
}  // namespace tandem::rt
