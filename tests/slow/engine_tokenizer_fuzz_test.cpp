// Slow: encode -> decode must give back any text, for every vocabulary we ship tests for: random
// Unicode scalar values from the whole range (and, for byte-level BPE, random bytes that are not
// UTF-8 at all), plus the streaming decoder's output, which must be the same text in valid pieces.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "engine/tokenizer.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

void append_utf8(std::string& s, uint32_t cp) {
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

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    uint8_t c = uint8_t(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((uint8_t(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

std::string random_text(std::mt19937& rng, bool spm) {
  std::uniform_int_distribution<int> len_d(0, 200), kind_d(0, 9);
  std::string s;
  for (int n = len_d(rng); n > 0; --n) {
    int kind = kind_d(rng);
    uint32_t cp;
    if (kind < 5) {
      cp = std::uniform_int_distribution<uint32_t>(0x09, 0x7E)(rng);  // mostly ASCII
    } else if (kind < 7) {
      cp = std::uniform_int_distribution<uint32_t>(0x80, 0xFFFF)(rng);
    } else if (kind < 8) {
      cp = std::uniform_int_distribution<uint32_t>(0x10000, 0x10FFFF)(rng);
    } else {
      cp = " \t\n"[std::uniform_int_distribution<int>(0, 2)(rng)];
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';  // surrogates are not scalar values
    if (spm && cp == 0x2581) cp = 'y';           // SentencePiece's space marker
    append_utf8(s, cp);
  }
  return s;
}

class TokenizerFuzz : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenizerFuzz, RoundTripsRandomText) {
  Tokenizer tok = Tokenizer::load(test::data_path(GetParam()));
  const bool spm = tok.model() == TokenizerModel::kSentencePiece;
  std::mt19937 rng(20261121);
  for (int i = 0; i < 20000; ++i) {
    const std::string s = random_text(rng, spm);
    const std::vector<TokenId> ids = tok.encode(s);
    ASSERT_EQ(tok.decode(ids), s) << "case " << i;
    TokenStreamDecoder dec(tok);
    std::string streamed;
    for (TokenId id : ids) {
      std::string chunk = dec.push(id);
      ASSERT_TRUE(valid_utf8(chunk)) << "case " << i;
      streamed += chunk;
    }
    streamed += dec.flush();
    ASSERT_EQ(streamed, s) << "case " << i;
  }
  if (!spm) {
    // Byte-level BPE represents every byte: invalid UTF-8 byte strings round-trip too.
    std::uniform_int_distribution<int> byte_d(0, 255), len_d(0, 64);
    for (int i = 0; i < 20000; ++i) {
      std::string s;
      for (int n = len_d(rng); n > 0;) {
        // C0, C1 and F5..FF never occur in UTF-8; DeepSeek's vocabulary keeps them only as
        // user-defined tokens that decode as the characters they are named by, as llama.cpp does.
        int b = byte_d(rng);
        if (b == 0xC0 || b == 0xC1 || b >= 0xF5) continue;
        s.push_back(char(b));
        --n;
      }
      ASSERT_EQ(tok.decode(tok.encode(s)), s) << "bytes case " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabs, TokenizerFuzz,
                         ::testing::Values("vocab/ggml-vocab-gpt-2.gguf",
                                           "vocab/ggml-vocab-deepseek-llm.gguf",
                                           "vocab/ggml-vocab-llama-spm.gguf",
                                           "vocab/ggml-vocab-phi-3.gguf", "vocab/tandem-demo-moe"),
                         [](const auto& info) { return std::to_string(info.index); });

}  // namespace
}  // namespace tandem
