// `tandem chat` and `tandem run --chat` on the trained demo model (its chat template is a plain
// concatenation: BOS, then the messages joined by newlines), driven through stdin.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/chat.h"
#include "model/weights.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

std::string demo() { return test::data_path("demo/tandem-demo-moe-hf").string(); }

// Runs `tandem chat` with `input` on stdin.
test::CommandResult chat(const std::string& args, const std::string& input) {
  return test::run_tandem("chat -m " + demo() + " " + args, input);
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(CliChat, AnswersMatchThePytorchReferenceAndResetForgets) {
  std::ifstream in(test::data_path("demo/traces/decode_texts.json"));
  const nlohmann::json ref = nlohmann::json::parse(in);
  const std::string p0 = ref[0]["prompt"], p1 = ref[1]["prompt"];
  const test::CommandResult r =
      chat("-n 24 --temp 0", p0 + "\n/reset\n" + p1 + "\n/quit\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> answers = lines(r.out);
  ASSERT_EQ(answers.size(), 2u) << r.out;
  // After /reset the second conversation is [p1] alone: both answers are the reference's greedy
  // continuation of a single prompt.
  for (size_t i = 0; i < 2; ++i) {
    const std::string completion = ref[i]["completion"];
    EXPECT_GT(answers[i].size(), 40u);
    EXPECT_EQ(completion.compare(0, answers[i].size(), answers[i]), 0)
        << "got " << answers[i] << "\nref " << completion;
  }
  EXPECT_NE(r.err.find("[conversation reset]"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("-n reached; prefill 5 tokens"), std::string::npos) << r.err;

  // run --chat renders the same template around one user message.
  const test::CommandResult one =
      test::run_tandem("run -m " + demo() + " --chat -p '" + p0 + "' -n 24 --temp 0");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_EQ(one.out, answers[0] + "\n");
}

TEST(CliChat, SecondTurnReusesTheCacheAndEqualsAFreshRun) {
  const test::CommandResult r = chat("-n 12 --temp 0", "In the beginning\nAnd God said\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> answers = lines(r.out);
  ASSERT_EQ(answers.size(), 2u) << r.out;
  // The second prompt is the rendered conversation; only its new tokens are prefilled.
  const LoadedModel lm = load_model(demo());
  const Tokenizer tok = Tokenizer::load(demo());
  const ChatTemplate tmpl = chat_template_for(lm);
  jinja::Json messages = jinja::Json::array();
  messages.push_back({{"role", "user"}, {"content", "In the beginning"}});
  messages.push_back({{"role", "assistant"}, {"content", answers[0]}});
  messages.push_back({{"role", "user"}, {"content", "And God said"}});
  const std::vector<TokenId> ids = render_chat(tmpl, tok, messages, true);
  std::string csv;
  for (TokenId id : ids) {
    if (!csv.empty()) csv += ',';
    csv += std::to_string(id);
  }
  const test::CommandResult fresh =
      test::run_tandem("run -m " + demo() + " --tokens " + csv + " -n 12 --output ids");
  ASSERT_EQ(fresh.exit_code, 0) << fresh.err;
  std::istringstream s(fresh.out);
  std::vector<TokenId> gen;
  for (int id; s >> id;) gen.push_back(id);
  EXPECT_EQ(answers[1], tok.decode(gen));
  const size_t at = r.err.rfind("prefill ");
  ASSERT_NE(at, std::string::npos);
  const size_t prefilled = std::stoul(r.err.substr(at + 8));
  // The first turn's 5 prompt tokens (BOS + "In the beginning") come from the cache. (Its answer
  // does not: this template re-renders the answer after a newline, which tokenizes differently
  // from the generated tokens.)
  EXPECT_EQ(prefilled, ids.size() - 5) << r.err;
}

TEST(CliChat, FullContextDropsOldTurnsAndKeepsServing) {
  const test::CommandResult r = chat("-n 8 --temp 0 --ctx 40",
                                     "In the beginning\nAnd the LORD said\nBlessed are the\n"
                                     "And it came to pass\n" + std::string(400, 'x') + "\nAmen\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("[context full: dropped the"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("does not fit in --ctx 40"), std::string::npos) << r.err;
  EXPECT_EQ(lines(r.out).size(), 5u) << r.out;  // every message but the oversized one answered
}

TEST(CliChat, ModelWithoutTemplateIsAClearError) {
  const test::CommandResult r = test::run_tandem(
      "chat -m " + test::data_path("golden/qwen3moe.gguf").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("has no chat template"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem
