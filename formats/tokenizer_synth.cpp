// Deterministic byte-level BPE training on a built-in text, and the GGUF / HF writers.
#include "formats/tokenizer_synth.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "formats/gguf.h"

namespace tandem {
namespace {

// The training text: plain English prose written for this purpose, long enough to learn a few
// hundred merges that look like a real tokenizer's first ones (" the", "ing", " and", ...).
constexpr std::string_view kCorpus =
    "The river ran quietly past the old mill, and the people of the town gathered on its banks "
    "every evening to talk about the weather, the harvest and the news from the city. In the "
    "spring the water was high and cold; in the summer it was slow and warm, and the children "
    "learned to swim where the current turned around the stones. Nobody remembered when the mill "
    "had stopped working, but everyone agreed that it should be repaired one day.\n"
    "A machine that reads text does not see words the way we do. It sees a sequence of numbers, "
    "and each number stands for a piece of text that appeared often enough in the data it was "
    "trained on. Common words become single pieces, while rare words are built from smaller "
    "pieces: a prefix, a stem and an ending. This is why the same model can read names it has "
    "never seen before, and why the number of pieces in a sentence depends on the language.\n"
    "When the engineers measured the memory of the computer, they found that it could hold many "
    "more weights than the graphics card, but it could move them only slowly. So they kept the "
    "experts that were needed most often on the fast device and left the others in the large "
    "memory, computing them on the processor while the card worked on attention. The two worked "
    "together, each doing what it did best, and the model answered in time.\n"
    "Questions are easier to answer when they are asked clearly. What is the time? Where are we "
    "going? How much does it cost, and who will pay for it? These are the questions that people "
    "ask every day, in every language, and they expect short and honest answers.\n"
    "Numbers appear everywhere: 1, 2, 3, 10, 42, 100, 2024, 3.14 and 1000000. Dates such as "
    "2023-07-14 and times such as 12:30 are written in many different ways, and a good reader "
    "must handle all of them. Some text also contains code, like `for (int i = 0; i < n; ++i)` "
    "or `return x + y;`, with brackets, quotes and symbols that ordinary sentences rarely use.\n"
    "She said that the weather would be better tomorrow, and he believed her, because she was "
    "usually right about such things. They walked along the road, talking about their plans, "
    "their friends and the books they were reading, until the sun went down behind the hills.\n";

uint64_t splitmix64_mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

bool is_letter(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool is_digit(unsigned char c) {
  return c >= '0' && c <= '9';
}
bool is_space(unsigned char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

// GPT-2-style pre-tokenization of ASCII text: an optional leading space joined to the following
// run of letters, digits or punctuation; other whitespace on its own.
std::vector<std::string> pre_tokenize(std::string_view text) {
  auto cls = [](unsigned char c) {
    return is_letter(c) ? 0 : is_digit(c) ? 1 : is_space(c) ? 2 : 3;
  };
  // A space that starts the next word (it is followed by a non-space) belongs to that word.
  auto word_space = [&](size_t i) {
    return text[i] == ' ' && i + 1 < text.size() && !is_space(text[i + 1]);
  };
  std::vector<std::string> pieces;
  size_t i = 0;
  while (i < text.size()) {
    const size_t start = i;
    if (word_space(i)) ++i;
    const int k = cls(text[i]);
    ++i;
    while (i < text.size() && cls(text[i]) == k && !(k == 2 && word_space(i))) ++i;
    pieces.emplace_back(text.substr(start, i - start));
  }
  return pieces;
}

std::array<std::string, 256> make_byte_tokens() {
  // Bytes that are printable and not space keep their code point; the rest are shifted to
  // 256 + n in byte order, as in GPT-2's bytes_to_unicode().
  std::array<std::string, 256> out;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    const uint32_t cp = keep ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {  // < 0x800 for every code point used here
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    out[b] = s;
  }
  return out;
}

// GPT-2 orders its byte tokens by code point: the kept printable bytes first.
std::vector<uint8_t> byte_token_order() {
  std::vector<uint8_t> order;
  for (int b = 0; b < 256; ++b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) order.push_back(b);
  }
  for (int b = 0; b < 256; ++b) {
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) order.push_back(b);
  }
  return order;
}

// Plain BPE training: repeatedly merge the most frequent adjacent pair (ties: the
// lexicographically smallest pair) until `max_new_tokens` new tokens exist or no pair occurs
// twice. Returns the merges; new tokens are the merged strings in merge order.
void train_bpe(size_t max_new_tokens, std::vector<std::string>* merges,
               std::vector<std::string>* new_tokens) {
  std::map<std::string, int> counts;
  for (const std::string& p : pre_tokenize(kCorpus)) ++counts[p];
  struct Word {
    std::vector<std::string> symbols;
    int count;
  };
  std::vector<Word> words;
  for (const auto& [piece, count] : counts) {
    Word w{{}, count};
    for (unsigned char c : piece) w.symbols.push_back(gpt2_byte_token(c));
    words.push_back(std::move(w));
  }
  std::map<std::string, bool> known;
  while (new_tokens->size() < max_new_tokens) {
    std::map<std::pair<std::string, std::string>, int> pairs;
    for (const Word& w : words) {
      for (size_t i = 0; i + 1 < w.symbols.size(); ++i)
        pairs[{w.symbols[i], w.symbols[i + 1]}] += w.count;
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int best_count = 1;
    for (const auto& [pair, count] : pairs) {  // map order: ties go to the smallest pair
      if (count > best_count) {
        best = &pair;
        best_count = count;
      }
    }
    if (!best) break;
    const std::string a = best->first, b = best->second, ab = a + b;
    merges->push_back(a + " " + b);
    if (!known[ab]) {
      known[ab] = true;
      new_tokens->push_back(ab);
    }
    for (Word& w : words) {
      std::vector<std::string> out;
      for (size_t i = 0; i < w.symbols.size(); ++i) {
        if (i + 1 < w.symbols.size() && w.symbols[i] == a && w.symbols[i + 1] == b) {
          out.push_back(ab);
          ++i;
        } else {
          out.push_back(w.symbols[i]);
        }
      }
      w.symbols = std::move(out);
    }
  }
}

// Vocabularies larger than the text supports (a 100K+ real shape) are filled with compositional
// merges: a word-start token ("Ġthe") joined with a letters-only token ("ing"), both existing, so
// the merge list stays a valid BPE whose tokens look like words. Picks are splitmix64 of a
// counter, so the result is deterministic; what cannot be filled this way stays [PAD<id>].
void add_compositional_merges(size_t wanted, const std::vector<std::string>& learned,
                              std::vector<std::string>* merges,
                              std::vector<std::string>* new_tokens) {
  const std::string space = gpt2_byte_token(' ');
  auto letters_only = [](const std::string& t) {
    return !t.empty() && std::all_of(t.begin(), t.end(), [](char ch) {
      return is_letter(static_cast<unsigned char>(ch));
    });
  };
  std::vector<std::string> heads, tails;
  std::set<std::string> known;
  for (int b = 0; b < 256; ++b) known.insert(gpt2_byte_token(static_cast<uint8_t>(b)));
  for (char ch = 'a'; ch <= 'z'; ++ch) tails.emplace_back(1, ch);
  for (const std::string& t : learned) {
    known.insert(t);
    if (t.starts_with(space) && letters_only(t.substr(space.size()))) heads.push_back(t);
    if (letters_only(t)) tails.push_back(t);
  }
  if (heads.empty()) return;
  const size_t limit = 64 * wanted + 1000;
  for (size_t k = 0; k < limit && new_tokens->size() < wanted; ++k) {
    const uint64_t z = splitmix64_mix(k);
    const std::string a = heads[z % heads.size()];
    const std::string& b = tails[(z >> 32) % tails.size()];
    const std::string ab = a + b;
    if (ab.size() > 16 || !known.insert(ab).second) continue;
    merges->push_back(a + " " + b);
    new_tokens->push_back(ab);
    if (ab.size() <= 10) heads.push_back(ab);  // keeps most words short
  }
}

constexpr const char* kBosText = "<｜begin▁of▁sentence｜>";
constexpr const char* kEosText = "<｜end▁of▁sentence｜>";

}  // namespace

const std::string& gpt2_byte_token(uint8_t byte) {
  static const std::array<std::string, 256> tokens = make_byte_tokens();
  return tokens[byte];
}

SynthVocab build_synth_vocab(int64_t vocab_size, int64_t bos_id, int64_t eos_id) {
  if (vocab_size < 258 || vocab_size > (int64_t{1} << 23)) {
    fail(ErrorKind::kInvalidArgument,
         "a synthetic byte-level vocabulary needs 258 to 2^23 "
         "tokens (256 bytes + BOS + EOS), not {}",
         vocab_size);
  }
  if (bos_id < 0 || bos_id >= vocab_size || eos_id < 0 || eos_id >= vocab_size ||
      bos_id == eos_id) {
    fail(ErrorKind::kInvalidArgument,
         "BOS id {} and EOS id {} must be distinct ids below the "
         "vocabulary size {}",
         bos_id, eos_id, vocab_size);
  }
  std::vector<std::string> content;
  for (uint8_t b : byte_token_order()) content.push_back(gpt2_byte_token(b));
  SynthVocab v;
  std::vector<std::string> learned;
  const size_t wanted = static_cast<size_t>(vocab_size - 258);
  train_bpe(wanted, &v.merges, &learned);
  std::vector<std::string> composed;
  if (learned.size() < wanted) {
    add_compositional_merges(wanted - learned.size(), learned, &v.merges, &composed);
  }
  content.insert(content.end(), learned.begin(), learned.end());
  content.insert(content.end(), composed.begin(), composed.end());

  v.tokens.resize(vocab_size);
  v.types.resize(vocab_size);
  v.bos_id = bos_id;
  v.eos_id = eos_id;
  size_t next = 0;
  for (int64_t id = 0; id < vocab_size; ++id) {
    if (id == bos_id || id == eos_id) {
      v.tokens[id] = id == bos_id ? kBosText : kEosText;
      v.types[id] = kTokenControl;
    } else if (next < content.size()) {
      v.tokens[id] = content[next++];
      v.types[id] = kTokenNormal;
    } else {
      v.tokens[id] = fmt::format("[PAD{}]", id);
      v.types[id] = kTokenUnused;
    }
  }
  return v;
}

SynthVocab vocab_from_gguf(const GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model", "");
  if (model != "gpt2") {
    fail(ErrorKind::kUnsupported,
         "{}: tokenizer model '{}' cannot be written as a byte-level "
         "BPE tokenizer.json (only 'gpt2' vocabularies can)",
         f.path(), model);
  }
  SynthVocab v;
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (f.find("tokenizer.ggml.token_type")) {
    for (int64_t x : f.get_int_array("tokenizer.ggml.token_type")) {
      v.types.push_back(static_cast<int32_t>(x));
    }
  }
  if (v.types.size() != v.tokens.size()) {
    fail(ErrorKind::kFormat, "{}: key 'tokenizer.ggml.token_type': {} types for {} tokens",
         f.path(), v.types.size(), v.tokens.size());
  }
  if (f.find("tokenizer.ggml.merges")) v.merges = f.get_string_array("tokenizer.ggml.merges");
  v.bos_id = f.get_int("tokenizer.ggml.bos_token_id", -1);
  v.eos_id = f.get_int("tokenizer.ggml.eos_token_id", -1);
  v.pre = f.get_string("tokenizer.ggml.pre", "default");
  return v;
}

void write_gguf_vocab(const SynthVocab& v, GgufWriter& w) {
  w.set("tokenizer.ggml.model", GgufValue::string("gpt2"));
  w.set("tokenizer.ggml.pre", GgufValue::string(v.pre));
  w.set("tokenizer.ggml.tokens", GgufValue::string_array(v.tokens));
  w.set("tokenizer.ggml.token_type", GgufValue::i32_array(v.types));
  w.set("tokenizer.ggml.merges", GgufValue::string_array(v.merges));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(static_cast<uint32_t>(v.bos_id)));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(static_cast<uint32_t>(v.eos_id)));
  w.set("tokenizer.ggml.padding_token_id", GgufValue::u32(static_cast<uint32_t>(v.eos_id)));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::boolean(true));
  w.set("tokenizer.ggml.add_eos_token", GgufValue::boolean(false));
}

void copy_gguf_tokenizer_keys(const GgufFile& source, GgufWriter& w) {
  for (const auto& [key, value] : source.metadata()) {
    if (key.starts_with("tokenizer.")) w.set(key, value);
  }
}

std::string tokenizer_json(const SynthVocab& v) {
  using OJson = nlohmann::ordered_json;
  OJson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  OJson added = OJson::array();
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    if (v.types[id] != kTokenControl) continue;
    added.push_back({{"id", id},
                     {"content", v.tokens[id]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"},
                        {"add_prefix_space", false},
                        {"trim_offsets", true},
                        {"use_regex", true}};
  if (v.bos_id >= 0) {
    const std::string bos = v.tokens[v.bos_id];
    OJson special = OJson::object();
    special[bos] = {{"id", bos}, {"ids", {v.bos_id}}, {"tokens", {bos}}};
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single",
                            {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                           {"pair",
                            {{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                             {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
                             {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
                           {"special_tokens", special}};
  } else {
    j["post_processor"] = nullptr;
  }
  j["decoder"] = {{"type", "ByteLevel"},
                  {"add_prefix_space", true},
                  {"trim_offsets", true},
                  {"use_regex", true}};
  // The vocab object is spliced in as text: ordered_json looks keys up linearly, which is
  // quadratic for a 160K-token vocabulary.
  constexpr std::string_view kVocabMark = "\"@vocab@\"";
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", "@vocab@"},
                {"merges", v.merges}};
  std::string text = j.dump(1) + "\n";
  std::string vocab = "{";
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    if (id > 0) vocab += ",";
    vocab += nlohmann::json(v.tokens[id]).dump();
    vocab += ":" + std::to_string(id);
  }
  vocab += "}";
  const size_t at = text.find(kVocabMark);
  TD_CHECK(at != std::string::npos);
  return text.replace(at, kVocabMark.size(), vocab);
}

std::string tokenizer_config_json(const SynthVocab& v, int64_t model_max_length) {
  using OJson = nlohmann::ordered_json;
  OJson j;
  j["add_bos_token"] = true;
  j["add_eos_token"] = false;
  OJson decoder = OJson::object();
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    if (v.types[id] != kTokenControl) continue;
    decoder[std::to_string(id)] = {{"content", v.tokens[id]}, {"lstrip", false},
                                   {"normalized", false},     {"rstrip", false},
                                   {"single_word", false},    {"special", true}};
  }
  j["added_tokens_decoder"] = decoder;
  j["bos_token"] = v.bos_id >= 0 ? OJson(v.tokens[v.bos_id]) : OJson(nullptr);
  j["eos_token"] = v.eos_id >= 0 ? OJson(v.tokens[v.eos_id]) : OJson(nullptr);
  j["pad_token"] = v.eos_id >= 0 ? OJson(v.tokens[v.eos_id]) : OJson(nullptr);
  j["clean_up_tokenization_spaces"] = false;
  j["model_max_length"] = model_max_length;
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  return j.dump(2) + "\n";
}

}  // namespace tandem
