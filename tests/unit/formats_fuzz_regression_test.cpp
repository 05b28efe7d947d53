// Replays the fuzzing corpora through the parsers in the normal (GCC) build (the model-file
// formats, chat templates, routing traces, residual files, placement rules): every seed in
// tests/data/fuzz/<target>/ is a valid file and must parse; every input a fuzzer once crashed on
// (tests/data/fuzz/regressions/<target>/) must now either parse or throw tandem::Error.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "engine/chat_template.h"
#include "formats/gguf.h"
#include "formats/model_config.h"
#include "formats/safetensors.h"
#include "runtime/calibrate.h"
#include "runtime/placement.h"
#include "runtime/trace.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

using Parser = std::function<void(const std::string& name, const std::string& bytes)>;

const std::vector<std::pair<std::string, Parser>>& targets() {
  static const std::vector<std::pair<std::string, Parser>> kTargets = {
      {"gguf",
       [](const std::string& name, const std::string& b) {
         const GgufFile f =
             GgufFile::parse(name, reinterpret_cast<const uint8_t*>(b.data()), b.size());
         for (const GgufTensorInfo& t : f.tensors()) (void)f.tensor(t.name);
       }},
      {"safetensors",
       [](const std::string& name, const std::string& b) {
         const SafetensorsModel m =
             SafetensorsModel::parse(name, reinterpret_cast<const uint8_t*>(b.data()), b.size());
         for (const SafetensorsTensorInfo& t : m.tensors()) (void)m.tensor(t.name);
       }},
      {"safetensors_index", [](const std::string& name,
                               const std::string& b) { SafetensorsModel::parse_index(name, b); }},
      {"hf_config", [](const std::string& name,
                       const std::string& b) { (void)config_from_hf_json_text(b, name); }},
      {"jinja",
       [](const std::string& name, const std::string& b) {
         const jinja::Json messages = jinja::Json::parse(
             R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])");
         (void)ChatTemplate(b, name).render(messages, nullptr, true, "<s>", "</s>");
       }},
      {"trace",
       [](const std::string& name, const std::string& b) {
         (void)rt::expert_counts(
             rt::parse_trace(name, reinterpret_cast<const uint8_t*>(b.data()), b.size()));
       }},
      {"residuals", [](const std::string& name,
                       const std::string& b) { (void)rt::ResidualVectors::parse(b, name); }},
      {"placement",
       [](const std::string& name, const std::string& b) {
         LoadedModel skeleton;  // as the fuzzer: a dense layer, then MoE layers
         skeleton.layers.resize(4);
         for (size_t l = 1; l < 4; ++l) skeleton.layers[l].moe = true;
         (void)rt::resolve_placement(skeleton, rt::parse_placement_rules(b, name), true, "native");
       }},
  };
  return kTargets;
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(FormatsFuzzRegression, SeedsAreValidFiles) {
  for (const auto& [target, parse] : targets()) {
    const std::vector<fs::path> seeds = files_in(test::data_path("fuzz/" + target));
    EXPECT_GE(seeds.size(), 2u) << target;
    for (const fs::path& p : seeds) {
      try {
        parse(p.string(), read_file(p));
      } catch (const Error& e) {
        ADD_FAILURE() << target << " seed " << p << " does not parse: " << e.what();
      }
    }
  }
}

TEST(FormatsFuzzRegression, CrashersNowParseOrThrowError) {
  size_t replayed = 0;
  for (const auto& [target, parse] : targets()) {
    for (const fs::path& p : files_in(test::data_path("fuzz/regressions") / target)) {
      ++replayed;
      try {
        parse(p.string(), read_file(p));
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos)
            << p << ": the error does not name the input: " << e.what();
      }
      // Any other exception escapes and fails the test, as a crash would.
    }
  }
  EXPECT_GT(replayed, 0u) << "no regression inputs under tests/data/fuzz/regressions/";
}

}  // namespace
}  // namespace tandem
