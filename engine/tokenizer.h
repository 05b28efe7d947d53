// Tokenizers read from GGUF metadata: byte-level BPE (`tokenizer.ggml.model = gpt2`, GPT-2 /
// tiktoken style, with the pre-tokenizer regexes named by `tokenizer.ggml.pre`) and
// SentencePiece-style BPE (`tokenizer.ggml.model = llama`: score-driven merges, byte fallback,
// `▁` for spaces). Both produce the same ids as the reference tokenizers (llama.cpp / Hugging Face)
// on the llama.cpp vocab test vectors (tests/data/vocab).
//
// Added tokens (CONTROL and USER_DEFINED types) are matched in the text before the model runs:
// USER_DEFINED ones always, CONTROL ones only when the caller asks (`parse_special`), so text
// typed by a user cannot smuggle in `<|im_start|>`. Not here: chat templates, HF tokenizer.json.
//
// A Tokenizer is immutable after loading; encode()/decode() may be called from several threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

class GgufFile;

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// The GGUF `tokenizer.ggml.token_type` values.
enum class TokenType : uint8_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

enum class TokenizerModel { kByteLevelBpe, kSentencePiece };

class Tokenizer {
 public:
  // Reads the `tokenizer.ggml.*` keys. Throws Error(kFormat) naming the file and key on missing or
  // inconsistent metadata, Error(kUnsupported) for an unknown model or pre-tokenizer.
  static Tokenizer from_gguf(const GgufFile& file);
  static Tokenizer from_gguf_file(const std::filesystem::path& path);
  // A SentencePiece `tokenizer.model` (BPE type only; throws Error(kUnsupported) for Unigram).
  static Tokenizer from_sentencepiece_file(const std::filesystem::path& path);
  // A Hugging Face tokenizer.json of a byte-level BPE model (see engine/tokenizer_hf.cpp for the
  // supported pre_tokenizer types); Error(kUnsupported) names any other feature it meets.
  static Tokenizer from_hf_json(const std::filesystem::path& path);
  // A directory with a tiktoken `tiktoken.model` and its tokenizer_config.json (Kimi-K2's release:
  // the kimi-k2 pre-tokenizer, 256 special ids after the base vocabulary).
  static Tokenizer from_tiktoken(const std::filesystem::path& dir);
  // A .gguf file, a tokenizer.model or tokenizer.json, or a Hugging Face directory holding one
  // (tokenizer.model preferred, then tokenizer.json, then tiktoken.model), with
  // tokenizer_config.json's BOS/EOS settings applied.
  static Tokenizer load(const std::filesystem::path& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // add_special: BOS/EOS as the metadata asks (add_bos()/add_eos()). parse_special: CONTROL tokens
  // written in the text (e.g. "<s>") become their ids; otherwise they are tokenized as plain text.
  std::vector<TokenId> encode(std::string_view text, bool add_special = false,
                              bool parse_special = false) const;

  // The bytes a token stands for (may be part of a UTF-8 sequence). CONTROL/UNKNOWN tokens give
  // their text only when `special`, otherwise nothing. Throws Error(kOutOfRange) on a bad id.
  std::string token_to_piece(TokenId id, bool special = false) const;
  // Concatenated pieces; SentencePiece drops the leading space its encoder added.
  std::string decode(std::span<const TokenId> ids, bool special = false) const;

  TokenizerModel model() const;
  const std::string& pre_tokenizer() const;  // `tokenizer.ggml.pre` ("" for SentencePiece)
  size_t vocab_size() const;
  const std::string& token_text(TokenId id) const;  // as stored in the vocabulary
  TokenType token_type(TokenId id) const;
  TokenId token_id(std::string_view text) const;  // kNoToken when absent

  TokenId bos_id() const;  // kNoToken when the metadata names none
  TokenId eos_id() const;
  bool add_bos() const;
  bool add_eos() const;
  bool add_space_prefix() const;  // SentencePiece only
  // End of generation: EOS, EOT and the other end markers the vocabulary declares.
  bool is_end_of_generation(TokenId id) const;

  struct Impl;  // engine/tokenizer_impl.h; public only so the encoders' files can name it

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of generated tokens into text that is always valid UTF-8 so far: bytes of a
// character split across tokens are held back until the character is complete. Bytes that can
// never complete a character are passed through as U+FFFD.
class TokenStreamDecoder {
 public:
  explicit TokenStreamDecoder(const Tokenizer& tokenizer, bool special = false);
  // Text that became complete with this token (may be empty).
  std::string push(TokenId id);
  // Whatever is still held back (an incomplete sequence at the end becomes U+FFFD).
  std::string flush();

 private:
  std::string take_complete(bool at_end);

  const Tokenizer* tokenizer_;
  bool special_;
  bool first_ = true;
  std::string pending_;
};

}  // namespace tandem
