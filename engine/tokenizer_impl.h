// Internals shared by the tokenizer translation units (engine/tokenizer*.cpp); not a public API.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/tokenizer.h"

namespace tandem::tokenizer_detail {

// Heterogeneous lookup so a string_view finds a std::string key without allocating.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// The split regexes of one pre-tokenizer, compiled with PCRE2 (UTF + Unicode properties). Each
// regex further splits every piece the previous one produced; text between matches stays a piece.
class PreTokenizer {
 public:
  // Throws Error(kUnsupported) for a pre-tokenizer name it does not know.
  explicit PreTokenizer(const std::string& name);
  // Explicit patterns (a tokenizer.json's Split regexes); `name` is for error messages. Throws
  // Error(kUnsupported) naming the pattern when PCRE2 cannot compile it.
  PreTokenizer(const std::string& name, const std::vector<std::string>& patterns);
  static const char* gpt2_pattern();  // what a ByteLevel pre-tokenizer with use_regex applies
  // The split patterns of a named (GGUF tokenizer.ggml.pre) pre-tokenizer, in order.
  static std::vector<std::string> named_patterns(const std::string& name);
  PreTokenizer(PreTokenizer&&) noexcept;
  ~PreTokenizer();
  // Appends [offset, length) pieces of `text` to `out`. Invalid UTF-8 bytes become one-byte pieces.
  void split(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  void add_pattern(const std::string& name, const std::string& pattern);
  struct Regexes;
  std::unique_ptr<Regexes> regexes_;
};

// Byte-level BPE: GPT-2's byte <-> printable code point mapping.
const std::string& byte_to_unicode(uint8_t byte);  // UTF-8 of the code point
// Decodes a byte-level token text back to bytes; false if a character is not in the mapping.
bool unicode_to_bytes(std::string_view text, std::string& out);

// Byte trie over the added tokens' texts, for longest-match scanning in one pass.
struct TrieNode {
  std::vector<std::pair<uint8_t, uint32_t>> next;  // byte -> node index
  TokenId token = kNoToken;                        // a token ends here
};

}  // namespace tandem::tokenizer_detail

namespace tandem {

struct Tokenizer::Impl {
  TokenizerModel model = TokenizerModel::kByteLevelBpe;
  std::string pre_name;
  std::string source;  // file name, for errors

  std::vector<std::string> texts;
  std::vector<TokenType> types;
  std::vector<float> scores;
  std::vector<bool> rstrip;  // whitespace after the token is swallowed when it is matched
  std::vector<bool> lstrip;  // whitespace before it is swallowed
  tokenizer_detail::StringIdMap text_to_id;
  tokenizer_detail::StringIdMap merge_rank;  // "left right" -> rank (byte-level BPE)
  std::unique_ptr<tokenizer_detail::PreTokenizer> pre;
  bool ignore_merges = false;  // llama-3 style: a whole pre-token in the vocab is used directly

  std::vector<TokenId> byte_tokens;  // byte -> <0xNN> token (SentencePiece), kNoToken if absent
  std::vector<TokenId> special_ids;  // CONTROL/USER_DEFINED/UNKNOWN tokens matched in text
  std::vector<tokenizer_detail::TrieNode> trie;  // trie[0] is the root
  std::vector<uint32_t> trie_root;               // 256 entries: first byte -> node (0 = none)

  TokenId bos = kNoToken, eos = kNoToken, eot = kNoToken, unk = kNoToken;
  bool add_bos = false, add_eos = false, add_space_prefix = true;
  std::vector<TokenId> eog;

  TokenId find(std::string_view s) const {
    auto it = text_to_id.find(s);
    return it == text_to_id.end() ? kNoToken : it->second;
  }

  // After the vocabulary, types, scores and ids are set: builds the lookup tables,
  // end-of-generation set and added-token matcher. `name` is the model's name (some strip rules
  // depend on it).
  void finish(std::string name, TokenId eom);

  // Tokenizes text that holds no added tokens.
  void encode_bpe(std::string_view text, std::vector<TokenId>& out) const;
  void encode_spm(std::string_view text, std::vector<TokenId>& out) const;
};

}  // namespace tandem
