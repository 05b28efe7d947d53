// Trace format round trips, the demo trace import (checked against the raw numpy-style arrays) and
// the synthetic generator's measured statistics against its knobs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <vector>

#include "core/error.h"
#include "runtime/calibrate.h"
#include "runtime/trace.h"
#include "runtime/trace_synth.h"
#include "tests/test_util.h"

namespace tandem::rt {
namespace {

Trace small_trace(int n_experts) {
  Trace t;
  t.model = "tiny";
  t.n_layers = 2;
  t.n_experts = n_experts;
  t.top_k = 2;
  t.has_scores = true;
  t.has_gate_pred = true;
  for (int r = 0; r < 5; ++r) {
    const int64_t i =
        t.add_record(r, r < 3 ? TracePhase::kPrefill : TracePhase::kDecode, r < 3 ? 0 : r);
    for (int l = 0; l < 2; ++l) {
      t.ids_at(i, l)[0] = (r * 3 + l) % n_experts;
      t.ids_at(i, l)[1] = (r * 3 + l + 1 + n_experts / 2) % n_experts;
      t.weights_at(i, l)[0] = 0.5f + 0.01f * r;
      t.weights_at(i, l)[1] = 0.25f - 0.01f * l;
    }
    for (int e = 0; e < 2 * n_experts; ++e) {
      t.scores[i * 2 * n_experts + e] = float(e) / 8.f;
      t.gate_pred[i * 2 * n_experts + e] = float(r + e) / 4.f;
    }
  }
  return t;
}

void expect_equal(const Trace& a, const Trace& b, float tol) {
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_experts, b.n_experts);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.has_scores, b.has_scores);
  EXPECT_EQ(a.has_gate_pred, b.has_gate_pred);
  EXPECT_EQ(a.has_residual_pred, b.has_residual_pred);
  EXPECT_EQ(a.token, b.token);
  EXPECT_EQ(a.phase, b.phase);
  EXPECT_EQ(a.batch, b.batch);
  EXPECT_EQ(a.ids, b.ids);
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i)
    EXPECT_NEAR(a.weights[i], b.weights[i], tol * std::fabs(a.weights[i]) + 1e-7);
  ASSERT_EQ(a.scores.size(), b.scores.size());
  for (size_t i = 0; i < a.scores.size(); ++i)
    EXPECT_NEAR(a.scores[i], b.scores[i], tol * std::fabs(a.scores[i]) + 1e-7);
  ASSERT_EQ(a.gate_pred.size(), b.gate_pred.size());
  for (size_t i = 0; i < a.gate_pred.size(); ++i)
    EXPECT_NEAR(a.gate_pred[i], b.gate_pred[i], tol * std::fabs(a.gate_pred[i]) + 1e-7);
}

TEST(RuntimeTrace, RoundTripF32F16AndWideIds) {
  test::TempDir dir("trace");
  for (int n_experts : {16, 300}) {
    const Trace t = small_trace(n_experts);
    write_trace(t, dir / "a.trace");
    expect_equal(t, read_trace(dir / "a.trace"), 0.f);
    write_trace(t, dir / "h.trace", {.f16 = true});
    expect_equal(t, read_trace(dir / "h.trace"), 1e-3f);
    // Size from the documented layout: 40-byte header + name, per record 12 + ids + weights + 2
    // score arrays.
    const int64_t id_bytes = n_experts > 256 ? 2 : 1;
    const int64_t rec = 12 + 4 * (id_bytes + 4) + 2 * 2 * n_experts * 4;
    EXPECT_EQ(std::filesystem::file_size(dir / "a.trace"), uint64_t(40 + 4 + 5 * rec));
  }
}

TEST(RuntimeTrace, RejectsCorruptFiles) {
  test::TempDir dir("trace");
  write_trace(small_trace(16), dir / "a.trace");
  std::string bytes;
  {
    std::ifstream in(dir / "a.trace", std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& b) { std::ofstream(dir / "b.trace", std::ios::binary) << b; };
  write(bytes.substr(0, bytes.size() - 1));  // truncated
  EXPECT_THROW(read_trace(dir / "b.trace"), Error);
  std::string bad = bytes;
  bad[0] = 'X';  // magic
  write(bad);
  EXPECT_THROW(read_trace(dir / "b.trace"), Error);
  bad = bytes;
  bad[44 + 12] = 16;  // first record's first id = n_experts
  write(bad);
  try {
    read_trace(dir / "b.trace");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert id 16"), std::string::npos) << e.what();
  }
  bad = bytes;
  const uint64_t huge = uint64_t(1) << 60;
  std::memcpy(bad.data() + 28, &huge, 8);  // record count
  write(bad);
  EXPECT_THROW(read_trace(dir / "b.trace"), Error);
  EXPECT_THROW(read_trace(dir / "missing.trace"), Error);
}

// A 40-byte header claiming 4096 layers x 65536 experts x top-k 65536 and no records must not make
// `sim` size gigabytes of tables: dimensions are bounded together, and a trace without records is
// refused.
TEST(RuntimeTrace, HeadersAreBoundedBeforeAnythingIsSized) {
  const std::filesystem::path path = test::data_path("hostile/huge_header.trace");
  try {
    read_trace(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4096 MoE layers x 65536 experts is more than"),
              std::string::npos)
        << e.what();
  }
  test::TempDir dir("trace");
  Trace empty = small_trace(16);
  empty.token.clear();
  empty.phase.clear();
  empty.batch.clear();
  empty.ids.clear();
  empty.weights.clear();
  empty.scores.clear();
  empty.gate_pred.clear();
  write_trace(empty, dir / "e.trace");
  try {
    read_trace(dir / "e.trace");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no records"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_trace(dir.path()), Error);  // a directory
}

// Residual vectors (`tandem calibrate`): every key checked by name; layer indices ascend and stay
// within a model's reach (layer 999 of a 27-layer model is refused).
TEST(RuntimeTrace, ResidualFilesNameTheKeyAtFault) {
  const std::string good =
      R"({"format": "tandem-residuals", "hidden_size": 2, "moe_layers": [1, 2],)"
      R"( "tokens": 5, "vectors": [[0.5, -1]]})";
  const ResidualVectors r = ResidualVectors::parse(good, "r.json");
  EXPECT_EQ(r.layers, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r.vectors[0], (std::vector<float>{0.5f, -1.f}));
  auto error_of = [](const std::string& text) {
    try {
      ResidualVectors::parse(text, "r.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  struct Case {
    std::string text, message;
  };
  for (const Case& c : {
           Case{"null", "r.json: not a JSON object"},
           Case{"[1]", "r.json: not a JSON object"},
           Case{R"({"format": "x"})", "key 'format'"},
           Case{R"({"format": "tandem-residuals", "hidden_size": "2"})", "key 'hidden_size'"},
           Case{R"({"format": "tandem-residuals", "hidden_size": 2, "moe_layers": [1, 999999]})",
                "key 'moe_layers[1]'"},
           Case{R"({"format": "tandem-residuals", "hidden_size": 2, "moe_layers": [2, 1]})",
                "key 'moe_layers[1]'"},
           Case{R"({"format": "tandem-residuals", "hidden_size": 2, "moe_layers": [1, 2],)"
                R"( "vectors": [[1]]})",
                "key 'vectors[0]'"},
           Case{R"({"format": "tandem-residuals", "hidden_size": 2, "moe_layers": [1, 2],)"
                R"( "vectors": [[1, "x"]]})",
                "key 'vectors[0][1]'"},
       }) {
    EXPECT_NE(error_of(c.text).find(c.message), std::string::npos) << c.text << "\n"
                                                                   << error_of(c.text);
  }
}

// The demo's raw arrays read directly, per FORMAT.md, against what the importer built.
TEST(RuntimeTrace, ImportsDemoDecodeTrace) {
  const auto bin = test::data_path("demo/traces/decode.bin");
  const Trace t = import_demo_trace(bin);
  ASSERT_EQ(t.size(), 4145);
  EXPECT_EQ(t.n_layers, 5);
  EXPECT_EQ(t.n_experts, 16);
  EXPECT_EQ(t.top_k, 4);
  ASSERT_TRUE(t.has_scores);
  std::ifstream in(bin, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), {});
  auto i32 = [&](int64_t off, int64_t i) {
    int32_t v;
    std::memcpy(&v, raw.data() + off + 4 * i, 4);
    return v;
  };
  auto f32 = [&](int64_t off, int64_t i) {
    float v;
    std::memcpy(&v, raw.data() + off + 4 * i, 4);
    return v;
  };
  int64_t decode_rows = 0;
  for (int64_t r = 0; r < t.size(); ++r) {
    EXPECT_EQ(t.phase[r], uint8_t(i32(33160, r)));
    decode_rows += t.phase[r];
  }
  for (int64_t i : {int64_t(0), int64_t(777), int64_t(4145 * 20 - 1)}) {
    EXPECT_EQ(t.ids[i], uint8_t(raw[82900 + i]));
    EXPECT_EQ(t.weights[i], f32(165800, i));
  }
  EXPECT_EQ(t.scores[4145 * 80 - 1], f32(497400, 4145 * 80 - 1));
  // Weights are the softmax scores of the selected experts (no renormalization).
  EXPECT_FLOAT_EQ(t.weights_at(100, 2)[1], t.scores_at(100, 2)[t.ids_at(100, 2)[1]]);
  // 8 prompts x 512 decode steps; prefill rows of a prompt form one batch.
  EXPECT_EQ(decode_rows, 8 * 512);
  const auto batches = trace_batches(t);
  int64_t prefill_batches = 0;
  for (const auto& b : batches) {
    if (b.phase == TracePhase::kPrefill)
      ++prefill_batches;
    else
      EXPECT_EQ(b.end - b.begin, 1);
  }
  EXPECT_EQ(prefill_batches, 8);
  EXPECT_EQ(int64_t(batches.size()), 8 + 8 * 512);
}

TEST(RuntimeTrace, ImportsDemoTrainTraceAndRoundTrips) {
  const Trace t = read_trace(test::data_path("demo/traces/train.json"));
  ASSERT_EQ(t.size(), 20480);
  const auto batches = trace_batches(t);
  ASSERT_EQ(batches.size(), 80u);  // chunks of 256
  for (const auto& b : batches) EXPECT_EQ(b.end - b.begin, 256);
  EXPECT_EQ(t.token[257], 1);
  test::TempDir dir("trace");
  write_trace(t, dir / "train.trace");
  expect_equal(t, read_trace(dir / "train.trace"), 0.f);
}

// Recall by hand: 2 layers, 4 experts, top-2; record 0 predicts {1, 3} for layer 1 which uses
// {3, 0} (1 of 2), record 1 predicts {0, 2} for {2, 0} (2 of 2): recall 3 / 4.
TEST(RuntimeTrace, PredictionRecallByHand) {
  Trace t;
  t.n_layers = 2;
  t.n_experts = 4;
  t.top_k = 2;
  t.has_gate_pred = true;
  const int used[2][2] = {{3, 0}, {2, 0}};
  const float pred[2][4] = {{0.1f, 0.5f, 0.0f, 0.4f}, {0.3f, 0.1f, 0.6f, 0.0f}};
  for (int r = 0; r < 2; ++r) {
    t.add_record(r, TracePhase::kDecode, r);
    t.ids_at(r, 0)[0] = 0;
    t.ids_at(r, 0)[1] = 1;
    t.ids_at(r, 1)[0] = used[r][0];
    t.ids_at(r, 1)[1] = used[r][1];
    for (int e = 0; e < 4; ++e) t.gate_pred[(r * 2 + 0) * 4 + e] = pred[r][e];
  }
  EXPECT_DOUBLE_EQ(prediction_recall(t, false), 0.75);
  EXPECT_EQ(prediction_recall(t, true), -1.0);
}

TEST(RuntimeTraceSynth, UniformWithoutSkew) {
  SynthTraceOptions o;
  o.n_layers = 2;
  o.n_experts = 32;
  o.top_k = 4;
  o.prefill_tokens = 2000;
  o.decode_steps = 2000;
  const Trace t = synth_trace(o);
  t.validate("synth");
  const auto c = expert_counts(t);
  const double expect = 4000.0 * 4 / 32;  // 500 per expert; binomial sd ~21
  for (const auto& layer : c) {
    for (int64_t n : layer) EXPECT_NEAR(double(n), expect, 0.25 * expect);
  }
  // Each token's experts are distinct, weights descending.
  for (int64_t r = 0; r < t.size(); ++r) {
    std::set<int> s(t.ids_at(r, 1), t.ids_at(r, 1) + 4);
    EXPECT_EQ(s.size(), 4u);
    EXPECT_GE(t.weights_at(r, 1)[0], t.weights_at(r, 1)[3]);
  }
}

TEST(RuntimeTraceSynth, ZipfSkewMatchesFormula) {
  SynthTraceOptions o;
  o.n_layers = 1;
  o.n_experts = 16;
  o.top_k = 1;  // one draw per token: frequencies follow Zipf(s) exactly in expectation
  o.skew = 1.0;
  o.prefill_tokens = 20000;
  o.decode_steps = 0;
  o.predictions = false;
  const Trace t = synth_trace(o);
  std::vector<int64_t> c = expert_counts(t)[0];
  std::sort(c.begin(), c.end(), std::greater<>());
  double h = 0;
  for (int i = 1; i <= 16; ++i) h += 1.0 / i;
  for (int i = 0; i < 4; ++i) {
    const double p = 1.0 / (i + 1) / h;
    EXPECT_NEAR(double(c[i]) / 20000, p, 0.02) << "rank " << i;
  }
}

TEST(RuntimeTraceSynth, LocalityAndCorrelation) {
  SynthTraceOptions o;
  o.n_layers = 3;
  o.n_experts = 16;
  o.top_k = 2;
  o.prefill_tokens = 50;
  o.decode_steps = 50;
  o.prefill_batches = 2;
  o.locality = 1.0;
  Trace t = synth_trace(o);
  for (int64_t r = 1; r < t.size(); ++r) {
    if (t.token[r] == 0) continue;  // a new prompt starts fresh
    for (int l = 0; l < 3; ++l) {
      EXPECT_EQ(t.ids_at(r, l)[0], t.ids_at(r - 1, l)[0]);
      EXPECT_EQ(t.ids_at(r, l)[1], t.ids_at(r - 1, l)[1]);
    }
  }
  o.locality = 0;
  o.correlation = 1.0;
  t = synth_trace(o);
  for (int64_t r = 0; r < t.size(); ++r) {
    for (int l = 1; l < 3; ++l) {
      for (int j = 0; j < 2; ++j) {
        EXPECT_EQ(t.ids_at(r, l)[j], synth_related_expert(o, l - 1, t.ids_at(r, l - 1)[j]));
      }
    }
  }
  // Half locality: about half the slots repeat (plus chance repeats, 2/16).
  o.correlation = 0;
  o.locality = 0.5;
  o.prefill_tokens = 1000;
  t = synth_trace(o);
  int64_t same = 0, total = 0;
  for (int64_t r = 1; r < t.size(); ++r) {
    if (t.token[r] == 0) continue;
    for (int j = 0; j < 2; ++j, ++total) same += t.ids_at(r, 0)[j] == t.ids_at(r - 1, 0)[j];
  }
  EXPECT_NEAR(double(same) / total, 0.5, 0.06);
}

TEST(RuntimeTraceSynth, PredictionsAreNoisyNextLayerScores) {
  SynthTraceOptions o;
  o.gate_noise = 0;
  o.residual_noise = 0;
  const Trace t = synth_trace(o);
  const int64_t le = int64_t(o.n_layers) * o.n_experts;
  for (int64_t r = 0; r < t.size(); r += 7) {
    for (int e = 0; e < o.n_experts; ++e) {
      EXPECT_FLOAT_EQ(t.gate_pred[r * le + e], t.scores[r * le + o.n_experts + e]);
      EXPECT_FLOAT_EQ(t.residual_pred[r * le + e], t.scores[r * le + o.n_experts + e]);
    }
  }
  // Exact predictions: every next-layer expert is in the predicted top-k.
  EXPECT_DOUBLE_EQ(prediction_recall(t, false), 1.0);
  EXPECT_DOUBLE_EQ(prediction_recall(t, true), 1.0);
  o.top_k = 99;
  EXPECT_THROW(synth_trace(o), Error);
}

}  // namespace
}  // namespace tandem::rt
