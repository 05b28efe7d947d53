// Tokenizer behaviour on small hand-made vocabularies (ids worked out by hand from the merge
// ranks and scores), round trips of random text through the real vocabularies, streaming
// detokenization through split UTF-8 characters, the golden models' vocabularies and the CLI.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
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

using Ids = std::vector<TokenId>;

// GPT-2's byte -> code point mapping, written out independently of the tokenizer's table.
std::string mapped_byte(int b) {
  bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  int cp = b;
  if (!printable) {
    int rank = 0;
    for (int x = 0; x < b; ++x) {
      bool p = (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
      if (!p) ++rank;
    }
    cp = 256 + rank;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(char(cp));
  } else {
    s.push_back(char(0xC0 | (cp >> 6)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  }
  return s;
}

// Byte-level BPE: ids 0..255 are the bytes (mapped), then merges h+e, l+l, he+ll, hell+o, Ġ+w.
std::filesystem::path write_bpe_vocab(const test::TempDir& dir) {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(mapped_byte(b));
    types.push_back(1);
  }
  for (const char* t : {"he", "ll", "hell", "hello", "\xC4\xA0w"}) {
    tokens.push_back(t);
    types.push_back(1);
  }
  tokens.push_back("<|end|>");  // 261, CONTROL
  types.push_back(3);
  tokens.push_back("<tag>");  // 262, USER_DEFINED
  types.push_back(4);
  auto path = dir / "bpe.gguf";
  GgufWriter w(path);
  w.set("general.name", GgufValue::string("tiny-bpe"));
  w.set("tokenizer.ggml.model", GgufValue::string("gpt2"));
  w.set("tokenizer.ggml.pre", GgufValue::string("gpt-2"));
  w.set("tokenizer.ggml.tokens", GgufValue::string_array(tokens));
  w.set("tokenizer.ggml.token_type", GgufValue::i32_array(types));
  w.set("tokenizer.ggml.merges",
        GgufValue::string_array({"h e", "l l", "he ll", "hell o", "\xC4\xA0 w"}));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(261));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(261));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::boolean(true));
  w.write();
  return path;
}

// SentencePiece: <unk> <s> </s>, 256 byte tokens (3..258), then scored pieces.
std::filesystem::path write_spm_vocab(const test::TempDir& dir) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(fmt::format("<0x{:02X}>", b));
    types.push_back(6);
    scores.push_back(0);
  }
  const std::pair<const char*, float> pieces[] = {
      {"\xE2\x96\x81", -1.0f},  // 259 ▁
      {"a", -2.0f},             // 260
      {"b", -2.0f},             // 261
      {"ab", -3.0f},            // 262
      {"\xE2\x96\x81"
       "a",
       -1.5f},  // 263 ▁a
      {"\xE2\x96\x81"
       "ab",
       -0.5f},  // 264 ▁ab
  };
  for (auto [t, s] : pieces) {
    tokens.push_back(t);
    types.push_back(1);
    scores.push_back(s);
  }
  auto path = dir / "spm.gguf";
  GgufWriter w(path);
  w.set("tokenizer.ggml.model", GgufValue::string("llama"));
  w.set("tokenizer.ggml.tokens", GgufValue::string_array(tokens));
  w.set("tokenizer.ggml.token_type", GgufValue::i32_array(types));
  w.set("tokenizer.ggml.scores", GgufValue::f32_array(scores));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(1));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(2));
  w.write();
  return path;
}

TEST(TokenizerBpe, MergesFollowRankOrder) {
  test::TempDir dir("tok");
  Tokenizer tok = Tokenizer::from_gguf_file(write_bpe_vocab(dir));
  EXPECT_EQ(tok.model(), TokenizerModel::kByteLevelBpe);
  EXPECT_EQ(tok.encode("hello"), (Ids{259}));
  EXPECT_EQ(tok.encode("hell"), (Ids{258}));
  // " world" is one pre-token "Ġworld": only Ġ+w merges, the rest stay bytes.
  EXPECT_EQ(tok.encode("hello world"), (Ids{259, 260, 'o', 'r', 'l', 'd'}));
  EXPECT_EQ(tok.encode("lle"), (Ids{257, 'e'}));
  EXPECT_EQ(tok.decode(Ids{259, 260, 'o', 'r', 'l', 'd'}), "hello world");
  // Bytes that are not UTF-8 still encode (one token per byte) and decode back.
  EXPECT_EQ(tok.encode("\xFF\xFE"), (Ids{255, 254}));
  EXPECT_EQ(tok.decode(tok.encode("a\xC3(\n")), "a\xC3(\n");
}

TEST(TokenizerBpe, AddedTokensAndBos) {
  test::TempDir dir("tok");
  Tokenizer tok = Tokenizer::from_gguf_file(write_bpe_vocab(dir));
  // CONTROL text is plain text unless parse_special; USER_DEFINED always matches.
  EXPECT_EQ(tok.encode("a<|end|>b"), (Ids{'a', '<', '|', 'e', 'n', 'd', '|', '>', 'b'}));
  EXPECT_EQ(tok.encode("a<|end|>b", false, true), (Ids{'a', 261, 'b'}));
  EXPECT_EQ(tok.encode("x<tag>y"), (Ids{'x', 262, 'y'}));
  EXPECT_EQ(tok.encode("hello", true), (Ids{261, 259}));
  EXPECT_TRUE(tok.is_end_of_generation(261));
  EXPECT_FALSE(tok.is_end_of_generation(259));
  EXPECT_EQ(tok.token_to_piece(261), "");
  EXPECT_EQ(tok.token_to_piece(261, true), "<|end|>");
  EXPECT_EQ(tok.token_to_piece(262), "<tag>");
  EXPECT_THROW(tok.token_to_piece(263), Error);
}

TEST(TokenizerSpm, ScoresByteFallbackAndSpacePrefix) {
  test::TempDir dir("tok");
  Tokenizer tok = Tokenizer::from_gguf_file(write_spm_vocab(dir));
  EXPECT_EQ(tok.model(), TokenizerModel::kSentencePiece);
  // "▁ab": ▁a (-1.5) beats ab (-3), then ▁a+b = ▁ab (-0.5).
  EXPECT_EQ(tok.encode("ab"), (Ids{264}));
  EXPECT_EQ(tok.encode("ba"), (Ids{259, 261, 260}));
  EXPECT_EQ(tok.encode("a b"), (Ids{263, 259, 261}));
  // é has no piece: its two UTF-8 bytes fall back to <0xC3> <0xA9>.
  EXPECT_EQ(tok.encode("\xC3\xA9"), (Ids{259, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok.encode("ab", true), (Ids{1, 264}));
  EXPECT_EQ(tok.encode("<s>ab", false, true), (Ids{1, 264}));
  EXPECT_EQ(tok.encode("<s>ab"), (Ids{259, 3 + '<', 3 + 's', 3 + '>', 262}));
  EXPECT_EQ(tok.decode(Ids{1, 264}), "ab");
  EXPECT_EQ(tok.decode(Ids{259, 3 + 0xC3, 3 + 0xA9}), "\xC3\xA9");
  EXPECT_EQ(tok.encode(""), Ids{});
}

TEST(TokenizerStream, HoldsBackSplitCharacters) {
  test::TempDir dir("tok");
  Tokenizer tok = Tokenizer::from_gguf_file(write_spm_vocab(dir));
  TokenStreamDecoder dec(tok);
  EXPECT_EQ(dec.push(263), "a");  // the leading space of the first piece is dropped
  EXPECT_EQ(dec.push(3 + 0xF0), "");
  EXPECT_EQ(dec.push(3 + 0x9F), "");
  EXPECT_EQ(dec.push(3 + 0x99), "");
  EXPECT_EQ(dec.push(3 + 0x82), "\xF0\x9F\x99\x82");
  EXPECT_EQ(dec.push(259), " ");
  EXPECT_EQ(dec.push(3 + 0x80), "\xEF\xBF\xBD");  // a lone continuation byte can never complete
  EXPECT_EQ(dec.push(3 + 0xE4), "");
  EXPECT_EQ(dec.push(3 + 'x'), "\xEF\xBF\xBDx");  // E4 followed by ASCII: broken
  EXPECT_EQ(dec.push(3 + 0xE4), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(dec.flush(), "");
}

// Random text over ASCII, Latin, Greek/Cyrillic, CJK, emoji and whitespace.
std::string random_utf8(std::mt19937& rng, bool allow_space_mark) {
  static const std::pair<uint32_t, uint32_t> ranges[] = {
      {0x20, 0x7E},   {0x20, 0x7E},     {0x20, 0x7E},     {0x09, 0x0A},     {0xA0, 0x17F},
      {0x370, 0x4FF}, {0x2000, 0x206F}, {0x4E00, 0x4FFF}, {0xAC00, 0xAC40}, {0x1F600, 0x1F64F}};
  std::uniform_int_distribution<int> len_d(0, 40), range_d(0, std::size(ranges) - 1);
  std::string s;
  for (int n = len_d(rng); n > 0; --n) {
    auto [lo, hi] = ranges[range_d(rng)];
    uint32_t cp = std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
    if (cp == 0x2581 && !allow_space_mark) cp = 'x';
    if (cp < 0x80) {
      s.push_back(char(cp));
    } else if (cp < 0x800) {
      s += {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
    } else if (cp < 0x10000) {
      s += {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
    } else {
      s += {char(0xF0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 0x3F)),
            char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
    }
  }
  return s;
}

std::vector<std::string> pre_split(const char* pre, std::string_view text) {
  tokenizer_detail::PreTokenizer p(pre);
  std::vector<std::pair<size_t, size_t>> pieces;
  p.split(text, pieces);
  std::vector<std::string> out;
  for (auto [off, len] : pieces) out.emplace_back(text.substr(off, len));
  return out;
}

using Pieces = std::vector<std::string>;

// Expected splits worked out by hand from each family's tokenizer.json split patterns.
TEST(PreTokenizer, SplitsLikeEachModelFamily) {
  EXPECT_EQ(pre_split("gpt-2", "Hello world123  !!"),
            (Pieces{"Hello", " world", "123", " ", " !!"}));
  EXPECT_EQ(pre_split("llama-bpe", "Hello world12345 I'M"),
            (Pieces{"Hello", " world", "123", "45", " I", "'M"}));
  EXPECT_EQ(pre_split("qwen2", "Hello world12345 I'M"),
            (Pieces{"Hello", " world", "1", "2", "3", "4", "5", " I", "'M"}));
  EXPECT_EQ(pre_split("deepseek-v3", "Hello world12345"), (Pieces{"Hello", " world", "123", "45"}));
  EXPECT_EQ(pre_split("deepseek-v3",
                      "ab\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E"
                      "cd"),
            (Pieces{"ab", "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", "cd"}));
  EXPECT_EQ(pre_split("deepseek-llm", "Hello, world!\n123"),
            (Pieces{"Hello", ",", " world", "!", "\n", "123"}));
  EXPECT_EQ(pre_split("default", "a+b==c 1234"),
            (Pieces{"a", "+", "b", "==", "c", " ", "123", "4"}));
  // Invalid UTF-8 bytes become pieces of their own; the text around them is still split.
  EXPECT_EQ(pre_split("gpt-2", "ab\xFF cd"), (Pieces{"ab", "\xFF", " cd"}));
  // o200k / MiniMax-M2: words split at case changes keep their contraction, any case.
  EXPECT_EQ(pre_split("minimax-m2", "HelloWorld DON'T 12345"),
            (Pieces{"Hello", "World", " DON'T", " ", "123", "45"}));
  // Kimi-K2: Han runs stand alone, even inside a word.
  EXPECT_EQ(pre_split("kimi-k2", "ab\xE4\xBD\xA0\xE5\xA5\xBD" "cd"),
            (Pieces{"ab", "\xE4\xBD\xA0\xE5\xA5\xBD", "cd"}));
  EXPECT_THROW(tokenizer_detail::PreTokenizer("nope"), Error);
}

class RoundTripTest : public ::testing::TestWithParam<const char*> {};

TEST_P(RoundTripTest, RandomUtf8EncodesAndDecodesBack) {
  Tokenizer tok = Tokenizer::from_gguf_file(test::data_path(GetParam()));
  const bool spm = tok.model() == TokenizerModel::kSentencePiece;
  std::mt19937 rng(1234);
  for (int i = 0; i < 200; ++i) {
    // SentencePiece stores spaces as U+2581, so a literal U+2581 decodes as a space.
    std::string s = random_utf8(rng, !spm);
    Ids ids = tok.encode(s);
    for (TokenId id : ids) ASSERT_LT(size_t(id), tok.vocab_size());
    ASSERT_EQ(tok.decode(ids), s) << "case " << i;
    // The streaming decoder yields the same text when the input was valid UTF-8.
    TokenStreamDecoder dec(tok);
    std::string streamed;
    for (TokenId id : ids) streamed += dec.push(id);
    streamed += dec.flush();
    ASSERT_EQ(streamed, s) << "case " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabs, RoundTripTest,
                         ::testing::Values("vocab/ggml-vocab-gpt-2.gguf",
                                           "vocab/ggml-vocab-deepseek-llm.gguf",
                                           "vocab/ggml-vocab-llama-spm.gguf",
                                           "vocab/ggml-vocab-phi-3.gguf", "golden/deepseek2.gguf",
                                           "vocab/ggml-vocab-glm4.gguf",
                                           "vocab/ggml-vocab-gpt-4o.gguf",
                                           "vocab/ggml-vocab-kimi-k2.gguf",
                                           "vocab/ggml-vocab-qwen35.gguf"),
                         [](const auto& info) { return std::to_string(info.index); });

TEST(TokenizerGolden, SmallVocabsOfTheGoldenModels) {
  Tokenizer ds = Tokenizer::from_gguf_file(test::data_path("golden/deepseek2.gguf"));
  EXPECT_EQ(ds.vocab_size(), 512u);
  EXPECT_EQ(ds.pre_tokenizer(), "deepseek-llm");
  EXPECT_EQ(ds.bos_id(), 497);
  EXPECT_EQ(ds.eos_id(), 498);
  Ids ids = ds.encode("the end", true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 497);
  EXPECT_EQ(ds.token_text(ds.token_id("\xC4\xA0t")), "\xC4\xA0t");  // "Ġ t" is the 2nd merge
  EXPECT_TRUE(ds.is_end_of_generation(498));

  Tokenizer mx = Tokenizer::from_gguf_file(test::data_path("golden/mixtral.gguf"));
  EXPECT_EQ(mx.model(), TokenizerModel::kSentencePiece);
  EXPECT_EQ(mx.encode("", true), (Ids{1}));
  Ids m = mx.encode("Hello", true);
  ASSERT_GE(m.size(), 2u);
  EXPECT_EQ(m[0], 1);
  EXPECT_EQ(mx.decode(m), "Hello");
  // This 512-piece vocabulary has no lone "▁": the space prefix falls back to its three bytes,
  // which decode to the character itself (as SentencePiece and llama.cpp do), not to a space.
  EXPECT_EQ(mx.token_id("\xE2\x96\x81"), kNoToken);
  Ids q = mx.encode("\xC4\xAB");
  EXPECT_EQ(q, (Ids{3 + 0xE2, 3 + 0x96, 3 + 0x81, 3 + 0xC4, 3 + 0xAB}));
}

// The demo model's SentencePiece tokenizer.model (tests/data/vocab/tandem-demo-moe, copied from
// ../shared/demo): the prompt ids are the ones recorded in the demo's decode traces
// (../shared/demo/traces/decode.bin, produced by the reference pipeline), BOS included.
TEST(TokenizerSentencePiece, DemoModelMatchesRecordedPromptIds) {
  Tokenizer tok = Tokenizer::load(test::data_path("vocab/tandem-demo-moe"));
  EXPECT_EQ(tok.model(), TokenizerModel::kSentencePiece);
  EXPECT_EQ(tok.vocab_size(), 2048u);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.token_type(1), TokenType::kControl);
  EXPECT_EQ(tok.token_type(3), TokenType::kByte);
  const std::pair<const char*, Ids> cases[] = {
      {"In the beginning", {1, 1016, 261, 1936, 1292}},
      {"And the LORD said unto Moses,", {1, 300, 261, 341, 390, 322, 681, 2001}},
      {"Blessed are the", {1, 1953, 427, 261}},
      {"The LORD is my shepherd;", {1, 453, 341, 344, 381, 506, 492, 269, 1996, 2014}},
      {"And it came to pass", {1, 300, 358, 471, 293, 616}},
      {"For God so loved the world,", {1, 514, 394, 531, 568, 612, 261, 1303, 2001}},
      {"Then Jesus said unto them,", {1, 544, 648, 390, 322, 342, 2001}},
      {"Praise ye the LORD.", {1, 505, 333, 557, 403, 261, 341, 2009}},
  };
  for (const auto& [text, ids] : cases) {
    EXPECT_EQ(tok.encode(text, true), ids) << text;
    EXPECT_EQ(tok.decode(ids), text);
  }
  // The bare file gives the same ids.
  Tokenizer file =
      Tokenizer::from_sentencepiece_file(test::data_path("vocab/tandem-demo-moe/tokenizer.model"));
  EXPECT_EQ(file.encode("In the beginning", true), cases[0].second);
}

TEST(TokenizerSentencePiece, TruncatedModelThrowsNamingTheFile) {
  test::TempDir dir("tok");
  std::string data;
  {
    std::ifstream in(test::data_path("vocab/tandem-demo-moe/tokenizer.model"), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    data = ss.str();
  }
  auto path = dir / "cut.model";
  std::ofstream(path, std::ios::binary) << data.substr(0, data.size() / 2);
  try {
    Tokenizer::from_sentencepiece_file(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find("cut.model"), std::string::npos) << e.what();
  }
}

// A tokenizer.json with a Sequence pre-tokenizer (digits in groups of three, then ByteLevel without
// its regex), a BOS template, and added tokens with and without `special` and `lstrip`.
TEST(TokenizerHfJson, SequenceSplitTemplateAndAddedTokens) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[mapped_byte(b)] = b;
  vocab["12"] = 256;
  vocab["123"] = 257;
  nlohmann::json j;
  j["normalizer"] = nullptr;
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"1 2", "12 3"}}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}{1,3}"}}}, {"behavior", "Isolated"}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  j["added_tokens"] = {{{"id", 258}, {"content", "<s>"}, {"special", true}},
                       {{"id", 259}, {"content", "<x>"}, {"special", false}, {"lstrip", true}}};
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single",
                          {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}};
  test::TempDir dir("hf");
  std::ofstream(dir / "tokenizer.json") << j.dump();
  Tokenizer tok = Tokenizer::from_hf_json(dir / "tokenizer.json");
  EXPECT_EQ(tok.bos_id(), 258);
  EXPECT_TRUE(tok.add_bos());
  // "1234567" -> "123" "456" "7": only the first group has merges.
  EXPECT_EQ(tok.encode("1234567", true), (Ids{258, 257, '4', '5', '6', '7'}));
  EXPECT_EQ(tok.encode("a <x>b"), (Ids{'a', 259, 'b'}));  // lstrip ate the space
  EXPECT_EQ(tok.encode("<s>"), (Ids{'<', 's', '>'}));
  EXPECT_EQ(tok.encode("<s>", false, true), (Ids{258}));
  EXPECT_EQ(tok.decode(Ids{258, 257}), "123");

  j["normalizer"] = {{"type", "NFC"}};
  std::ofstream(dir / "bad.json") << j.dump();
  try {
    Tokenizer::from_hf_json(dir / "bad.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("normalizer 'NFC'"), std::string::npos) << e.what();
  }
}

TEST(TokenizerErrors, BadMetadataNamesFileAndKey) {
  test::TempDir dir("tok");
  auto path = dir / "bad.gguf";
  {
    GgufWriter w(path);
    w.set("general.name", GgufValue::string("x"));
    w.write();
  }
  try {
    Tokenizer::from_gguf_file(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find("bad.gguf"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.model"), std::string::npos) << e.what();
  }
  {
    GgufWriter w(path);
    w.set("tokenizer.ggml.model", GgufValue::string("gpt2"));
    w.set("tokenizer.ggml.pre", GgufValue::string("no-such-pre"));
    w.set("tokenizer.ggml.tokens", GgufValue::string_array({"a"}));
    w.set("tokenizer.ggml.merges", GgufValue::string_array({}));
    w.write();
  }
  try {
    Tokenizer::from_gguf_file(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("no-such-pre"), std::string::npos) << e.what();
  }
}

TEST(CliTokenize, PrintsIdsAndPieces) {
  const std::string gpt2 = test::data_path("vocab/ggml-vocab-gpt-2.gguf").string();
  test::CommandResult r = test::run_tandem("tokenize -m " + gpt2 + " -p 'Hello world' --ids-only");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "15496 995\n");  // GPT-2's well-known ids for "Hello" and " world"

  const std::string phi3 = test::data_path("vocab/ggml-vocab-phi-3.gguf").string();
  r = test::run_tandem("tokenize -m " + phi3 + " -p '<|user|>' --special");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("      1 '<s>'\n"), std::string::npos) << r.out;  // BOS added
  EXPECT_NE(r.out.find("  32010 '<|user|>'\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 tokens"), std::string::npos) << r.out;

  r = test::run_tandem("tokenize -m " + phi3 + " -p '<|user|>' --no-bos --ids-only");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("32010"), std::string::npos) << r.out;  // typed text, not the token

  const std::string demo = test::data_path("vocab/tandem-demo-moe").string();
  r = test::run_tandem("tokenize -m " + demo + " -p 'Blessed are the' --ids-only");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "1 1953 427 261\n");

  r = test::run_tandem("tokenize -m " + phi3);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("-p"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem
