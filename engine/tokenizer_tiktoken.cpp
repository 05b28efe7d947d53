// A tiktoken `tiktoken.model` (Kimi-K2's Hugging Face release): one "<base64 bytes> <rank>" line
// per token, the special tokens after them named by tokenizer_config.json's
// added_tokens_decoder. Read into the byte-level BPE tables tokenizer.json models use: each
// multi-byte token becomes the merge of the two parts that tiktoken's rank-ordered merging of
// its bytes ends with (as Hugging Face's TikTokenConverter does), ranked by the token's rank; so
// merging by those ranks is tiktoken's own encoding.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_file.h"
#include "engine/tokenizer_impl.h"

namespace tandem {
namespace fs = std::filesystem;
namespace {

// Standard base64 (RFC 4648, padded); false on anything else.
bool base64_decode(std::string_view in, std::string& out) {
  static const std::array<int8_t, 256> table = [] {
    std::array<int8_t, 256> t;
    t.fill(-1);
    const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(a[i])] = static_cast<int8_t>(i);
    return t;
  }();
  out.clear();
  if (in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + k];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else if (pad > 0 || (v[k] = table[static_cast<uint8_t>(c)]) < 0) {
        return false;
      }
    }
    const uint32_t n = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) |
                       uint32_t(v[3]);
    out += static_cast<char>(n >> 16);
    if (pad < 2) out += static_cast<char>((n >> 8) & 0xFF);
    if (pad < 1) out += static_cast<char>(n & 0xFF);
  }
  return true;
}

std::string byte_level(std::string_view bytes) {
  std::string s;
  for (char c : bytes) s += tokenizer_detail::byte_to_unicode(static_cast<uint8_t>(c));
  return s;
}

// The rank after a token's space, or -1 when it is not a whole integer.
int64_t parse_rank(std::string_view text) {
  try {
    size_t used = 0;
    const std::string r(text);
    const int64_t rank = std::stoll(r, &used);
    return used == r.size() ? rank : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

// tiktoken.model's tokens: bytes by rank (ranks dense from 0), and each one's rank.
struct RankedTokens {
  std::vector<std::string> tokens;
  tokenizer_detail::StringIdMap rank_of;
};

// Reads the "<base64 bytes> <rank>" lines of `text` (`file` names it in errors); blank lines are
// skipped, and every single byte must be a token.
RankedTokens read_ranked_tokens(const std::string& text, const std::string& file) {
  RankedTokens out;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    std::string bytes;
    const int64_t rank = sp != std::string_view::npos ? parse_rank(line.substr(sp + 1)) : -1;
    if (sp == std::string_view::npos || !base64_decode(line.substr(0, sp), bytes) ||
        bytes.empty() || rank != static_cast<int64_t>(out.tokens.size()) ||
        !out.rank_of.emplace(bytes, static_cast<int32_t>(rank)).second) {
      fail(ErrorKind::kFormat,
           "{}: line {}: expected '<base64 bytes> {}' (ranks dense from 0, tokens distinct)", file,
           line_no, out.tokens.size());
    }
    out.tokens.push_back(std::move(bytes));
  }
  for (int b = 0; b < 256; ++b) {
    if (!out.rank_of.count(std::string(1, static_cast<char>(b)))) {
      fail(ErrorKind::kFormat, "{}: byte 0x{:02X} has no token", file, b);
    }
  }
  return out;
}

// Where tiktoken's merging of the token of rank `r` stops when only the ranks below `r` may
// merge: its bytes as `parts` (two when the token is such a merge).
void merge_below(const RankedTokens& ranked, size_t r, std::vector<std::string>& parts) {
  parts.clear();
  for (char c : ranked.tokens[r]) parts.emplace_back(1, c);
  while (parts.size() > 2) {
    int32_t best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = ranked.rank_of.find(parts[i] + parts[i + 1]);
      if (it != ranked.rank_of.end() && it->second < static_cast<int32_t>(r) &&
          (best < 0 || it->second < best)) {
        best = it->second;
        at = i;
      }
    }
    if (best < 0) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
}

// The base vocabulary as byte-level BPE: the tokens' texts, and each multi-byte token as the merge
// of the two parts tiktoken's merging of its bytes with the ranks below its own stops at, ranked
// by the token.
void add_base_vocabulary(Tokenizer::Impl& t, const RankedTokens& ranked, const std::string& file) {
  const size_t n_base = ranked.tokens.size();
  t.texts.reserve(n_base + 256);
  for (const std::string& b : ranked.tokens) t.texts.push_back(byte_level(b));
  t.types.assign(n_base, TokenType::kNormal);
  std::vector<std::string> parts;
  for (size_t r = 0; r < n_base; ++r) {
    if (ranked.tokens[r].size() < 2) continue;
    merge_below(ranked, r, parts);
    if (parts.size() != 2) {
      fail(ErrorKind::kFormat, "{}: token of rank {} is not the merge of two lower-ranked tokens",
           file, r);
    }
    t.merge_rank.emplace(byte_level(parts[0]) + " " + byte_level(parts[1]),
                         static_cast<int32_t>(r));
  }
}

// tokenizer_config.json's added_tokens_decoder (id -> entry): an empty object when the file or
// the member is absent.
nlohmann::json read_added_tokens_decoder(const fs::path& config) {
  nlohmann::json added = nlohmann::json::object();
  std::error_code ec;
  if (fs::exists(config, ec)) {
    try {
      const nlohmann::json j =
          nlohmann::json::parse(read_input_file(config, kMaxTokenizerFileBytes));
      if (j.contains("added_tokens_decoder") && j["added_tokens_decoder"].is_object()) {
        added = j["added_tokens_decoder"];
      }
    } catch (const nlohmann::json::exception& e) {
      fail(ErrorKind::kFormat, "{}: {}", config.string(), e.what());
    }
  }
  return added;
}

// The special tokens: the vocabulary's size with them (at least n_base + 256: Kimi reserves 256
// ids after the base vocabulary) and the named ones, entries of `added` by id.
struct SpecialTokens {
  size_t n = 0;
  std::vector<std::pair<size_t, const nlohmann::json*>> named;
};

SpecialTokens check_added_tokens(const nlohmann::json& added, size_t n_base,
                                 const fs::path& config) {
  SpecialTokens out;
  out.n = n_base + 256;
  for (auto it = added.begin(); it != added.end(); ++it) {
    size_t id = 0;
    try {
      size_t used = 0;
      id = std::stoull(it.key(), &used);
      if (used != it.key().size()) throw std::invalid_argument("id");
    } catch (const std::exception&) {
      fail(ErrorKind::kFormat, "{}: added_tokens_decoder key '{}' is not a token id",
           config.string(), it.key());
    }
    if (id < n_base || id >= n_base + (size_t{1} << 16) || !it.value().is_object() ||
        !it.value().contains("content") || !it.value()["content"].is_string()) {
      fail(ErrorKind::kFormat,
           "{}: added_tokens_decoder entry {}: an id from {} with a 'content' string",
           config.string(), it.key(), n_base);
    }
    out.n = std::max(out.n, id + 1);
    out.named.emplace_back(id, &it.value());
  }
  return out;
}

// The ids from n_base on: control tokens, the unnamed ones "<|reserved_token_ID|>"; a named one
// is user-defined when its entry says "special": false.
void add_special_tokens(Tokenizer::Impl& t, size_t n_base, const SpecialTokens& special) {
  t.texts.resize(special.n);
  t.types.resize(special.n, TokenType::kControl);
  for (size_t id = n_base; id < special.n; ++id) {
    t.texts[id] = fmt::format("<|reserved_token_{}|>", id);
  }
  for (const auto& [id, entry] : special.named) {
    t.texts[id] = (*entry)["content"].get<std::string>();
    t.types[id] = entry->value("special", true) ? TokenType::kControl : TokenType::kUserDefined;
  }
}

}  // namespace

Tokenizer Tokenizer::from_tiktoken(const fs::path& dir) {
  const fs::path model_path = dir / "tiktoken.model";
  const std::string file = model_path.string();
  const RankedTokens ranked =
      read_ranked_tokens(read_input_file(model_path, kMaxTokenizerFileBytes), file);
  auto t = std::make_unique<Impl>();
  t->source = file;
  t->model = TokenizerModel::kByteLevelBpe;
  t->pre_name = "kimi-k2";
  add_base_vocabulary(*t, ranked, file);
  const fs::path config = dir / "tokenizer_config.json";
  const nlohmann::json added = read_added_tokens_decoder(config);
  const SpecialTokens special = check_added_tokens(added, ranked.tokens.size(), config);
  add_special_tokens(*t, ranked.tokens.size(), special);
  t->scores.assign(special.n, 0.0f);
  t->pre = std::make_unique<tokenizer_detail::PreTokenizer>("kimi-k2");
  t->add_space_prefix = false;
  t->finish("", kNoToken);
  return Tokenizer(std::move(t));
}

}  // namespace tandem
