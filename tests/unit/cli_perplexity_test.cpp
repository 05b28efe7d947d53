// `tandem perplexity` against the llama-perplexity definition computed here through the library:
// chunks of ctx tokens with BOS first, the second half of each chunk scored.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "engine/tokenizer.h"
#include "model/model.h"
#include "model/weights.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

TEST(CliPerplexity, MatchesDefinition) {
  test::TempDir dir("ppl");
  std::string text;
  const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "then", "ran", "off"};
  for (int i = 0; i < 300; ++i) text += std::string(words[(i * 7 + i / 3) % 10]) + " ";
  std::ofstream(dir / "t.txt") << text;
  const std::string model = test::data_path("golden/deepseek2.gguf").string();
  const test::CommandResult r =
      test::run_tandem("perplexity -m " + model + " -f " + (dir / "t.txt").string() + " --ctx 32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.out.find("Final estimate: PPL = ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const double got = std::stod(r.out.substr(at + 22));

  const LoadedModel lm = load_model(model);
  const Tokenizer tok = Tokenizer::from_gguf_file(model);
  const std::vector<TokenId> tokens = tok.encode(text, true);
  const int64_t ctx = 32, nv = lm.config.vocab_size;
  double nll = 0;
  int count = 0;
  for (size_t c = 0; c + ctx <= tokens.size(); c += ctx) {
    ModelOptions mo;
    mo.forward.mla = MlaMode::kNaive;
    Model m_net(lm, mo);
    SingleSequence m(m_net, ctx);
    std::vector<int32_t> chunk(tokens.begin() + c, tokens.begin() + c + ctx);
    chunk[0] = tok.bos_id();
    std::vector<float> logits(ctx * nv);
    m.forward(chunk, logits.data(), true);
    for (int64_t j = ctx / 2; j < ctx - 1; ++j) {
      double z = 0;
      for (int64_t v = 0; v < nv; ++v) z += std::exp(double(logits[j * nv + v]));
      nll += std::log(z) - logits[j * nv + tokens[c + j + 1]];
      ++count;
    }
  }
  EXPECT_NEAR(got, std::exp(nll / count), 1e-3 * std::exp(nll / count));

  const test::CommandResult short_text = test::run_tandem("perplexity -m " + model + " -f " +
                                                          (dir / "t.txt").string() + " --ctx 4096");
  EXPECT_EQ(short_text.exit_code, 1);
  EXPECT_NE(short_text.err.find("needs at least 8192"), std::string::npos) << short_text.err;
}

}  // namespace
}  // namespace tandem
