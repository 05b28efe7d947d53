// Tokenizer loading from GGUF, added-token matching, BOS/EOS rules, detokenization and the
// streaming decoder. The model-specific encoders are in tokenizer_bpe.cpp and tokenizer_spm.cpp.
#include "engine/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "core/error.h"
#include "core/log.h"
#include "engine/tokenizer_impl.h"
#include "formats/gguf.h"

namespace tandem {
namespace {

using tokenizer_detail::TrieNode;

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

bool is_added(TokenType t) {
  return t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown;
}

TokenId read_id(const GgufFile& f, std::string_view key, size_t n_vocab) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) return kNoToken;
  int64_t id = v->as_int();
  if (id < 0 || uint64_t(id) >= n_vocab) {
    // Some converters write -1 or a too-large id for "none"; treat it as absent, loudly.
    log_warn("{}: {} = {} is not a token id (vocabulary of {}); ignored", f.path(), key, id,
             n_vocab);
    return kNoToken;
  }
  return TokenId(id);
}

void build_trie(Tokenizer::Impl& t) {
  t.trie.assign(1, TrieNode{});
  t.trie_root.assign(256, 0);
  for (TokenId id : t.special_ids) {
    const std::string& s = t.texts[id];
    uint32_t node = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      uint8_t c = uint8_t(s[i]);
      uint32_t child = 0;
      if (node == 0) {
        child = t.trie_root[c];
      } else {
        for (auto [b, n] : t.trie[node].next) {
          if (b == c) child = n;
        }
      }
      if (child == 0) {
        child = uint32_t(t.trie.size());
        t.trie.push_back(TrieNode{});
        if (node == 0) {
          t.trie_root[c] = child;
        } else {
          t.trie[node].next.emplace_back(c, child);
        }
      }
      node = child;
    }
    // Same text twice: the first id wins, as with text_to_id.
    if (t.trie[node].token == kNoToken) t.trie[node].token = id;
  }
}

// Number of bytes the UTF-8 sequence starting with `lead` has, 0 for a byte that cannot start one.
size_t utf8_seq_len(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Second-byte constraints that rule out overlong forms, surrogates and code points > U+10FFFF.
bool utf8_second_ok(uint8_t lead, uint8_t second) {
  if ((second & 0xC0) != 0x80) return false;
  if (lead == 0xE0) return second >= 0xA0;
  if (lead == 0xED) return second <= 0x9F;
  if (lead == 0xF0) return second >= 0x90;
  if (lead == 0xF4) return second <= 0x8F;
  return true;
}

}  // namespace

void Tokenizer::Impl::finish(std::string name, TokenId eom) {
  const size_t n = texts.size();
  text_to_id.clear();
  text_to_id.reserve(n);
  for (size_t i = 0; i < n; ++i) text_to_id.emplace(texts[i], TokenId(i));
  if (model == TokenizerModel::kSentencePiece) {
    byte_tokens.assign(256, kNoToken);
    for (int b = 0; b < 256; ++b) byte_tokens[b] = find(fmt::format("<0x{:02X}>", b));
    if (unk == kNoToken) unk = find("<unk>");
  }
  // End-of-generation markers: the declared ids plus the well-known turn terminators.
  for (TokenId id : {eos, eot, eom}) {
    if (id != kNoToken) eog.push_back(id);
  }
  for (const char* s : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                        "<｜end▁of▁sentence｜>", "<|end_of_text|>", "<|eom_id|>", "<|return|>",
                        "<|call|>"}) {
    TokenId id = find(s);
    if (id != kNoToken && types[id] == TokenType::kControl) eog.push_back(id);
  }
  // gpt-oss's harmony (o200k_harmony): <|return|> and <|call|> end the answer, while <|end|> only
  // ends one of its messages (the analysis before the final one), as llama.cpp decides.
  const TokenId ret = find("<|return|>"), call = find("<|call|>"), end = find("<|end|>");
  if (ret != kNoToken && call != kNoToken && end != kNoToken && end != eos) {
    std::erase(eog, end);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());

  // Added tokens, matched in the text by the trie (longest match wins).
  if (rstrip.size() != n) rstrip.assign(n, false);  // a loader may have set them already
  if (lstrip.size() != n) lstrip.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    if (is_added(types[i]) && !texts[i].empty()) special_ids.push_back(TokenId(i));
  }
  // Phi-3's added tokens swallow the whitespace after them (HF rstrip=True); GGUF does not record
  // per-token strip flags, so follow the model name as llama.cpp does.
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (TokenId id : special_ids) rstrip[id] = true;
    if (TokenId id = find("</s>"); id != kNoToken) rstrip[id] = true;
    for (const char* s : {"<unk>", "<s>", "<|endoftext|>"}) {
      if (TokenId id = find(s); id != kNoToken) rstrip[id] = false;
    }
  }
  build_trie(*this);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_gguf_file(const std::filesystem::path& path) {
  GgufFile f = GgufFile::open(path);
  return from_gguf(f);
}

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  auto t = std::make_unique<Impl>();
  t->source = f.path();
  const std::string model = f.get_string("tokenizer.ggml.model", "");
  if (model.empty()) {
    fail(ErrorKind::kFormat, "{}: no tokenizer (key tokenizer.ggml.model)", f.path());
  }
  if (model == "gpt2") {
    t->model = TokenizerModel::kByteLevelBpe;
  } else if (model == "llama") {
    t->model = TokenizerModel::kSentencePiece;
  } else {
    fail(ErrorKind::kUnsupported, "{}: tokenizer.ggml.model '{}' is not supported (gpt2, llama)",
         f.path(), printable(model));
  }

  t->texts = f.get_string_array("tokenizer.ggml.tokens");
  const size_t n = t->texts.size();
  if (n == 0 || n > size_t(INT32_MAX)) {
    fail(ErrorKind::kFormat, "{}: tokenizer.ggml.tokens has {} entries", f.path(), n);
  }
  t->types.assign(n, TokenType::kNormal);
  if (f.find("tokenizer.ggml.token_type")) {
    std::vector<int64_t> types = f.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != n) {
      fail(ErrorKind::kFormat, "{}: tokenizer.ggml.token_type has {} entries, tokens has {}",
           f.path(), types.size(), n);
    }
    for (size_t i = 0; i < n; ++i) {
      t->types[i] = types[i] >= 0 && types[i] <= 6 ? TokenType(types[i]) : TokenType::kUndefined;
    }
  }
  t->scores.assign(n, 0.0f);
  if (f.find("tokenizer.ggml.scores")) {
    t->scores = f.get_float_array("tokenizer.ggml.scores");
    if (t->scores.size() != n) {
      fail(ErrorKind::kFormat, "{}: tokenizer.ggml.scores has {} entries, tokens has {}", f.path(),
           t->scores.size(), n);
    }
  }

  t->bos = read_id(f, "tokenizer.ggml.bos_token_id", n);
  t->eos = read_id(f, "tokenizer.ggml.eos_token_id", n);
  t->eot = read_id(f, "tokenizer.ggml.eot_token_id", n);
  t->unk = read_id(f, "tokenizer.ggml.unknown_token_id", n);
  TokenId eom = read_id(f, "tokenizer.ggml.eom_token_id", n);

  if (t->model == TokenizerModel::kByteLevelBpe) {
    t->pre_name = f.get_string("tokenizer.ggml.pre", "default");
    try {
      t->pre = std::make_unique<tokenizer_detail::PreTokenizer>(t->pre_name);
    } catch (const Error& e) {
      fail(ErrorKind::kUnsupported, "{}: tokenizer.ggml.pre: {}", f.path(), e.what());
    }
    std::vector<std::string> merges = f.get_string_array("tokenizer.ggml.merges");
    t->merge_rank.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      if (merges[i].find(' ') == std::string::npos) {
        fail(ErrorKind::kFormat, "{}: tokenizer.ggml.merges[{}] '{}' is not 'left right'", f.path(),
             i, merges[i]);
      }
      t->merge_rank.emplace(std::move(merges[i]), int32_t(i));
    }
    t->ignore_merges = t->pre_name == "llama-bpe" || t->pre_name == "llama3";
    t->add_bos = f.get_bool("tokenizer.ggml.add_bos_token", t->ignore_merges);
    t->add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", false);
  } else {
    t->add_bos = f.get_bool("tokenizer.ggml.add_bos_token", true);
    t->add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix", true);
  }
  t->add_eos = f.get_bool("tokenizer.ggml.add_eos_token", false);

  t->finish(f.get_string("general.name", ""), eom);
  return Tokenizer(std::move(t));
}

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  const Impl& t = *impl_;
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && t.add_bos && t.bos != kNoToken) out.push_back(t.bos);

  // SentencePiece adds its space prefix at the start and after every added token.
  bool prev_added = true;
  std::string buf;
  auto emit_text = [&](std::string_view s) {
    if (s.empty()) return;
    if (t.model == TokenizerModel::kSentencePiece) {
      if (t.add_space_prefix && prev_added) {
        buf.assign(1, ' ');
        buf.append(s);
        t.encode_spm(buf, out);
      } else {
        t.encode_spm(s, out);
      }
    } else {
      t.encode_bpe(s, out);
    }
    prev_added = false;
  };

  // One left-to-right pass: at each byte the longest added token that starts there wins.
  size_t raw_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t node = t.trie_root[uint8_t(text[pos])];
    TokenId best = kNoToken;
    size_t best_len = 0;
    for (size_t k = pos + 1; node != 0; ++k) {
      TokenId id = t.trie[node].token;
      if (id != kNoToken && (parse_special || t.types[id] == TokenType::kUserDefined)) {
        best = id;
        best_len = k - pos;
      }
      if (k >= text.size()) break;
      uint32_t child = 0;
      for (auto [b, c] : t.trie[node].next) {
        if (b == uint8_t(text[k])) child = c;
      }
      node = child;
    }
    if (best == kNoToken) {
      ++pos;
      continue;
    }
    size_t raw_end = pos;
    if (t.lstrip[best]) {
      while (raw_end > raw_start && std::isspace(uint8_t(text[raw_end - 1]))) --raw_end;
    }
    emit_text(text.substr(raw_start, raw_end - raw_start));
    out.push_back(best);
    prev_added = true;
    pos += best_len;
    if (t.rstrip[best]) {
      while (pos < text.size() && std::isspace(uint8_t(text[pos]))) ++pos;
    }
    raw_start = pos;
  }
  emit_text(text.substr(raw_start));

  if (add_special && t.add_eos && t.eos != kNoToken) out.push_back(t.eos);
  return out;
}

std::string Tokenizer::token_to_piece(TokenId id, bool special) const {
  const Impl& t = *impl_;
  if (id < 0 || size_t(id) >= t.texts.size()) {
    fail(ErrorKind::kOutOfRange, "token id {} outside the vocabulary of {} ({})", id,
         t.texts.size(), t.source);
  }
  const std::string& text = t.texts[id];
  switch (t.types[id]) {
    case TokenType::kControl:
    case TokenType::kUnknown:
      return special ? text : std::string();
    case TokenType::kUserDefined:
      return text;
    case TokenType::kByte:
      if (t.model == TokenizerModel::kSentencePiece && text.size() == 6 &&
          text.starts_with("<0x") && text.back() == '>') {
        unsigned byte = 0;
        const auto r = std::from_chars(text.data() + 3, text.data() + 5, byte, 16);
        if (r.ec == std::errc() && r.ptr == text.data() + 5) return std::string(1, char(byte));
      }
      break;
    default:
      break;
  }
  std::string out;
  if (t.model == TokenizerModel::kByteLevelBpe) {
    if (!tokenizer_detail::unicode_to_bytes(text, out)) out = text;
    return out;
  }
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, kSpaceMark.size(), kSpaceMark) == 0) {
      out.push_back(' ');
      i += kSpaceMark.size();
    } else {
      out.push_back(text[i++]);
    }
  }
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool special) const {
  std::string out;
  // Raw bytes, not the stream decoder's U+FFFD replacement: decode(encode(x)) == x for any x.
  bool first = true;
  for (TokenId id : ids) {
    std::string piece = token_to_piece(id, special);
    if (first && impl_->model == TokenizerModel::kSentencePiece && impl_->add_space_prefix &&
        impl_->types[id] != TokenType::kControl) {
      if (!piece.empty() && piece[0] == ' ') piece.erase(0, 1);
      first = false;
    }
    out += piece;
  }
  return out;
}

TokenizerModel Tokenizer::model() const {
  return impl_->model;
}
const std::string& Tokenizer::pre_tokenizer() const {
  return impl_->pre_name;
}
size_t Tokenizer::vocab_size() const {
  return impl_->texts.size();
}

const std::string& Tokenizer::token_text(TokenId id) const {
  if (id < 0 || size_t(id) >= impl_->texts.size()) {
    fail(ErrorKind::kOutOfRange, "token id {} outside the vocabulary of {}", id,
         impl_->texts.size());
  }
  return impl_->texts[id];
}

TokenType Tokenizer::token_type(TokenId id) const {
  if (id < 0 || size_t(id) >= impl_->types.size()) {
    fail(ErrorKind::kOutOfRange, "token id {} outside the vocabulary of {}", id,
         impl_->types.size());
  }
  return impl_->types[id];
}

TokenId Tokenizer::token_id(std::string_view text) const {
  return impl_->find(text);
}
TokenId Tokenizer::bos_id() const {
  return impl_->bos;
}
TokenId Tokenizer::eos_id() const {
  return impl_->eos;
}
bool Tokenizer::add_bos() const {
  return impl_->add_bos;
}
bool Tokenizer::add_eos() const {
  return impl_->add_eos;
}
bool Tokenizer::add_space_prefix() const {
  return impl_->add_space_prefix;
}

bool Tokenizer::is_end_of_generation(TokenId id) const {
  return std::binary_search(impl_->eog.begin(), impl_->eog.end(), id);
}

TokenStreamDecoder::TokenStreamDecoder(const Tokenizer& tokenizer, bool special)
    : tokenizer_(&tokenizer), special_(special) {}

std::string TokenStreamDecoder::push(TokenId id) {
  std::string piece = tokenizer_->token_to_piece(id, special_);
  if (first_ && tokenizer_->model() == TokenizerModel::kSentencePiece &&
      tokenizer_->token_type(id) != TokenType::kControl) {
    if (tokenizer_->add_space_prefix() && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    first_ = false;
  }
  pending_ += piece;
  return take_complete(false);
}

std::string TokenStreamDecoder::flush() {
  return take_complete(true);
}

std::string TokenStreamDecoder::take_complete(bool at_end) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    uint8_t lead = uint8_t(pending_[i]);
    size_t n = utf8_seq_len(lead);
    if (n == 0) {  // a stray continuation byte or an impossible lead byte
      out += kReplacement;
      ++i;
      continue;
    }
    // How many of the expected bytes are there and fit the sequence?
    size_t have = 1;
    while (have < n && i + have < pending_.size()) {
      uint8_t c = uint8_t(pending_[i + have]);
      bool ok = have == 1 ? utf8_second_ok(lead, c) : (c & 0xC0) == 0x80;
      if (!ok) break;
      ++have;
    }
    if (have == n) {
      out.append(pending_, i, n);
      i += n;
    } else if (i + have == pending_.size() && !at_end) {
      break;  // incomplete so far: wait for the next token
    } else {
      out += kReplacement;  // broken sequence: replace its valid prefix, resume after it
      i += have;
    }
  }
  pending_.erase(0, i);
  return out;
}

}  // namespace tandem
