// A real, small byte-level BPE vocabulary for synthetic models, built deterministically (no data
// files, no downloads): the 256 GPT-2 byte tokens, merges learned by plain BPE training on a
// short built-in English text, then (for the 100K+ vocabularies of real shapes) compositional
// merges of learned word pieces until the vocabulary is full, and BOS/EOS control tokens at the
// ids the model config names. Written in the two forms the engines read: GGUF
// `tokenizer.ggml.*` keys (model "gpt2", pre "default") and HF tokenizer.json /
// tokenizer_config.json.
//
// Not a tokenizer: encoding and decoding live in engine/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

class GgufFile;
class GgufWriter;

// GGUF token types (llama.cpp's llama_token_type).
inline constexpr int32_t kTokenNormal = 1;
inline constexpr int32_t kTokenControl = 3;
inline constexpr int32_t kTokenUnused = 5;

struct SynthVocab {
  std::vector<std::string> tokens;  // byte-level strings (GPT-2 byte-to-unicode mapping)
  std::vector<int32_t> types;
  std::vector<std::string> merges;  // "left right", highest priority first
  int64_t bos_id = -1;
  int64_t eos_id = -1;
  std::string pre = "default";  // tokenizer.ggml.pre
};

// GPT-2's reversible byte -> printable code point mapping, as UTF-8 (e.g. ' ' -> "Ġ").
const std::string& gpt2_byte_token(uint8_t byte);

// vocab_size >= 258; bos_id and eos_id distinct ids in [0, vocab_size). Same arguments, same
// vocabulary. Throws Error(kInvalidArgument) otherwise.
SynthVocab build_synth_vocab(int64_t vocab_size, int64_t bos_id, int64_t eos_id);

// The vocabulary of a GGUF file with a gpt2 (byte-level BPE) tokenizer; Error(kUnsupported) for
// other tokenizer models (a SentencePiece vocabulary has no tokenizer.json form here).
SynthVocab vocab_from_gguf(const GgufFile& file);

// tokenizer.ggml.{model, pre, tokens, token_type, merges, bos/eos/padding_token_id,
// add_bos_token, add_eos_token}.
void write_gguf_vocab(const SynthVocab& vocab, GgufWriter& writer);
// Copies every `tokenizer.*` key of `source` (e.g. a real model's vocabulary) in file order.
void copy_gguf_tokenizer_keys(const GgufFile& source, GgufWriter& writer);

std::string tokenizer_json(const SynthVocab& vocab);
std::string tokenizer_config_json(const SynthVocab& vocab, int64_t model_max_length);

}  // namespace tandem
