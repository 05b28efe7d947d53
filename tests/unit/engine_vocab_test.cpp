// The llama.cpp tokenizer test vectors (tests/data/vocab, see its README): every input must give
// exactly the expected ids (no BOS/EOS, special-token parsing off) and decode back to itself. The
// glm4, gpt-4o and kimi-k2 files are GPT-2's vocabulary under those pre-tokenizers, their expected
// ids computed by llama.cpp (scripts/golden/llama_ref.cpp).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/tokenizer.h"
#include "engine/tokenizer_impl.h"
#include "formats/gguf.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

struct VocabCase {
  std::string text;
  std::vector<TokenId> expected;
};

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<VocabCase> load_cases(const std::string& vocab) {
  std::string inp = read_all(test::data_path("vocab/" + vocab + ".gguf.inp"));
  std::string outp = read_all(test::data_path("vocab/" + vocab + ".gguf.out"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<VocabCase> cases;
  for (size_t pos = 0; pos < inp.size();) {
    size_t end = inp.find(sep, pos);
    if (end == std::string::npos) break;
    cases.push_back({inp.substr(pos, end - pos), {}});
    pos = end + sep.size();
  }
  std::istringstream lines(outp);
  std::string line;
  size_t i = 0;
  while (std::getline(lines, line)) {
    if (i >= cases.size()) {
      ADD_FAILURE() << vocab << ": more expected lines than inputs";
      break;
    }
    std::istringstream ids(line);
    TokenId id;
    while (ids >> id) cases[i].expected.push_back(id);
    ++i;
  }
  EXPECT_EQ(i, cases.size()) << vocab << ": expected-id lines vs inputs";
  return cases;
}

class VocabTest : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabTest, EveryCaseMatchesAndRoundTrips) {
  const std::string vocab = GetParam();
  Tokenizer tok = Tokenizer::from_gguf_file(test::data_path("vocab/" + vocab + ".gguf"));
  std::vector<VocabCase> cases = load_cases(vocab);
  ASSERT_GE(cases.size(), 46u);  // llama.cpp's 46, and for the retagged vocabularies 6 more
  int failures = 0;
  size_t expected_ids = 0;
  for (const VocabCase& c : cases) {
    expected_ids += c.expected.size();
    std::vector<TokenId> got = tok.encode(c.text, /*add_special=*/false, /*parse_special=*/false);
    if (got != c.expected) {
      ++failures;
      ADD_FAILURE() << vocab << ": input '" << c.text << "'\n  expected "
                    << ::testing::PrintToString(c.expected) << "\n  got      "
                    << ::testing::PrintToString(got);
    }
    // SentencePiece cannot tell a typed space from its own leading-space marker when the text
    // starts with a space; the decoder drops exactly one, so round trips hold for all cases.
    EXPECT_EQ(tok.decode(got), c.text) << vocab << ": round trip of '" << c.text << "'";
  }
  EXPECT_EQ(failures, 0);
  EXPECT_GT(expected_ids, 300u) << "the expected-id file was not read";
}

INSTANTIATE_TEST_SUITE_P(Vocabs, VocabTest,
                         ::testing::Values("ggml-vocab-deepseek-llm", "ggml-vocab-gpt-2",
                                           "ggml-vocab-llama-spm", "ggml-vocab-phi-3",
                                           "ggml-vocab-glm4", "ggml-vocab-gpt-4o",
                                           "ggml-vocab-kimi-k2", "ggml-vocab-qwen35"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (!isalnum(uint8_t(ch))) ch = '_';
                           }
                           return n;
                         });

// A GGUF byte-level vocabulary rewritten as a Hugging Face tokenizer.json: normal tokens in
// model.vocab, CONTROL/USER_DEFINED ones as added_tokens, the given pre_tokenizer.
void write_tokenizer_json(const std::string& vocab, const nlohmann::json& pre_tokenizer,
                          const std::filesystem::path& out) {
  GgufFile f = GgufFile::open(test::data_path("vocab/" + vocab + ".gguf"));
  std::vector<std::string> tokens = f.get("tokenizer.ggml.tokens").as_string_array();
  std::vector<int64_t> types = f.get("tokenizer.ggml.token_type").as_int_array();
  nlohmann::json v = nlohmann::json::object();
  nlohmann::json added = nlohmann::json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] == 1) {
      v[tokens[i]] = i;
    } else {
      added.push_back({{"id", i}, {"content", tokens[i]}, {"special", types[i] == 3}});
    }
  }
  nlohmann::json j;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = pre_tokenizer;
  j["post_processor"] = nullptr;
  j["added_tokens"] = added;
  j["model"] = {
      {"type", "BPE"}, {"vocab", v}, {"merges", f.get("tokenizer.ggml.merges").as_string_array()}};
  std::ofstream(out) << j.dump();
}

void expect_cases(const Tokenizer& tok, const std::string& vocab) {
  std::vector<VocabCase> cases = load_cases(vocab);
  ASSERT_EQ(cases.size(), 46u);
  for (const VocabCase& c : cases) {
    EXPECT_EQ(tok.encode(c.text), c.expected) << vocab << ": input '" << c.text << "'";
  }
}

// GPT-2 as tokenizer.json: a ByteLevel pre-tokenizer with its own regex.
TEST(VocabHfJson, Gpt2TokenizerJsonMatchesTheVectors) {
  test::TempDir dir("hf");
  write_tokenizer_json("ggml-vocab-gpt-2",
                       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}},
                       dir / "tokenizer.json");
  Tokenizer tok = Tokenizer::load(dir.path());
  EXPECT_EQ(tok.vocab_size(), 50257u);
  expect_cases(tok, "ggml-vocab-gpt-2");
  EXPECT_EQ(tok.encode("<|endoftext|>", false, true), (std::vector<TokenId>{50256}));
}

// DeepSeek LLM as tokenizer.json: a Sequence of six Isolated Splits, then ByteLevel without regex.
TEST(VocabHfJson, DeepseekSequenceOfSplitsMatchesTheVectors) {
  nlohmann::json pre = nlohmann::json::array();
  for (const std::string& p : tokenizer_detail::PreTokenizer::named_patterns("deepseek-llm")) {
    pre.push_back({{"type", "Split"}, {"pattern", {{"Regex", p}}}, {"behavior", "Isolated"}});
  }
  pre.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}});
  test::TempDir dir("hf");
  write_tokenizer_json("ggml-vocab-deepseek-llm", {{"type", "Sequence"}, {"pretokenizers", pre}},
                       dir / "tokenizer.json");
  Tokenizer tok = Tokenizer::from_hf_json(dir / "tokenizer.json");
  expect_cases(tok, "ggml-vocab-deepseek-llm");
}


std::string base64(const std::string& bytes) {
  const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t n = uint32_t(uint8_t(bytes[i])) << 16;
    if (i + 1 < bytes.size()) n |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) n |= uint32_t(uint8_t(bytes[i + 2]));
    out += a[n >> 18];
    out += a[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? a[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? a[n & 63] : '=';
  }
  return out;
}

// Kimi-K2's Hugging Face form: a tiktoken.model (base64 bytes and rank per line) beside a
// tokenizer_config.json naming the special tokens. tiktoken's GPT-2 encoding is GPT-2's ids as
// ranks, so GPT-2's vocabulary written that way and read as Kimi's (the kimi-k2 pattern) must
// give llama.cpp's ids for GPT-2's vocabulary under the kimi-k2 pre-tokenizer.
TEST(VocabTiktoken, Gpt2RanksReadAsKimiMatchLlamaCppKimiVectors) {
  test::TempDir dir("tiktoken");
  GgufFile f = GgufFile::open(test::data_path("vocab/ggml-vocab-gpt-2.gguf"));
  const std::vector<std::string> tokens = f.get("tokenizer.ggml.tokens").as_string_array();
  ASSERT_EQ(tokens.size(), 50257u);
  {
    std::ofstream out(dir / "tiktoken.model", std::ios::binary);
    for (size_t id = 0; id + 1 < tokens.size(); ++id) {  // 50256 is <|endoftext|>
      std::string bytes;
      ASSERT_TRUE(tokenizer_detail::unicode_to_bytes(tokens[id], bytes)) << id;
      out << base64(bytes) << " " << id << "\n";
    }
    nlohmann::json config;
    config["tokenizer_class"] = "TikTokenTokenizer";
    config["added_tokens_decoder"]["50256"] = {{"content", "[BOS]"}, {"special", true}};
    config["added_tokens_decoder"]["50257"] = {{"content", "[EOS]"}, {"special", true}};
    config["added_tokens_decoder"]["50264"] = {{"content", "<|im_end|>"}, {"special", true}};
    config["bos_token"] = "[BOS]";
    config["eos_token"] = "[EOS]";
    std::ofstream(dir / "tokenizer_config.json") << config.dump();
  }
  Tokenizer tok = Tokenizer::load(dir.path());
  EXPECT_EQ(tok.vocab_size(), 50256u + 256u);
  EXPECT_EQ(tok.pre_tokenizer(), "kimi-k2");
  EXPECT_EQ(tok.bos_id(), 50256);
  EXPECT_EQ(tok.eos_id(), 50257);
  EXPECT_TRUE(tok.is_end_of_generation(50264));  // <|im_end|> ends a turn
  EXPECT_EQ(tok.encode("a[EOS]b", false, true), (std::vector<TokenId>{64, 50257, 65}));
  EXPECT_EQ(tok.token_to_piece(50300, true), "<|reserved_token_50300|>");
  const std::vector<VocabCase> cases = load_cases("ggml-vocab-kimi-k2");
  ASSERT_EQ(cases.size(), 52u);
  for (const VocabCase& c : cases) {
    const std::vector<TokenId> got = tok.encode(c.text);
    EXPECT_EQ(got, c.expected) << "input '" << c.text << "'";
    EXPECT_EQ(tok.decode(got), c.text);
  }
  // A broken line names the file and line.
  std::ofstream(dir / "tiktoken.model", std::ios::app) << "!!notbase64 50256\n";
  try {
    Tokenizer::load(dir.path());
    ADD_FAILURE() << "a bad line was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tiktoken.model: line 50257"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tandem
