// The trained demo model (tests/data/demo/README.md) through `tandem run`: the BF16 Hugging Face
// checkpoint, computed in F32, greedily continues each prompt exactly as the PyTorch reference did
// (traces/decode_texts.json, recorded with FP32 compute on the same BF16 weights); also with every
// expert split in two NUMA parts (--numa-parts 2: tensor parallelism, forced on one node).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace tandem {
namespace {

TEST(DemoModel, HfGreedyMatchesPytorchReference) {
  std::ifstream in(test::data_path("demo/traces/decode_texts.json"));
  const nlohmann::json cases = nlohmann::json::parse(in);
  ASSERT_GE(cases.size(), 3u);
  const std::string model = test::data_path("demo/tandem-demo-moe-hf").string();
  for (size_t i = 0; i < 3; ++i) {
    for (const std::string flags : {"", " --numa-parts 2"}) {
      SCOPED_TRACE(flags);
      const std::string prompt = cases[i]["prompt"], completion = cases[i]["completion"];
      const test::CommandResult r = test::run_tandem("run -m " + model + " -p '" + prompt +
                                                     "' -n 64 --temp 0 --threads 2" + flags);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      ASSERT_FALSE(r.out.empty());
      const std::string got = r.out.substr(0, r.out.size() - 1);  // the final newline
      const std::string expected = prompt + " " + completion;
      // 64 tokens of text, a prefix of the reference's 512-token continuation.
      EXPECT_GT(got.size(), prompt.size() + 150) << got;
      EXPECT_EQ(expected.compare(0, got.size(), got), 0)
          << "prompt " << i << "\n got:      " << got
          << "\n expected: " << expected.substr(0, got.size());
    }
  }
}

}  // namespace
}  // namespace tandem
