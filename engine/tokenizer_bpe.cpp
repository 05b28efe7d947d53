// Byte-level BPE (GPT-2 / tiktoken style): the pre-tokenizer splits text with the model's regexes
// (PCRE2, UTF mode with Unicode properties, so \p{L} means what it means in the Hugging Face
// tokenizers' Rust regex), each piece is mapped byte -> printable code point, then merged by rank.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <queue>

#include "core/error.h"
#include "engine/tokenizer_impl.h"

namespace tandem::tokenizer_detail {
namespace {

// The split patterns as written in each model family's tokenizer.json (pre_tokenizer Split or
// ByteLevel regex). Several patterns run in sequence, each refining the previous pieces.
constexpr const char* kGpt2[] = {
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"};
constexpr const char* kLlama3[] = {
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
constexpr const char* kQwen2[] = {
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
// Qwen3.5: Qwen2's pattern with combining marks in words ([\p{L}\p{M}]+).
constexpr const char* kQwen35[] = {
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
// DeepSeek LLM / V2: letters are an explicit list of cased-script ranges rather than \p{L}.
constexpr const char* kDeepseekLlm[] = {
    R"([\r\n])",
    R"(\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+)",
    R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)",
    R"(\s+$)",
    R"([一-龥ࠀ-一가-퟿]+)",
    R"(\p{N}+)"};
constexpr const char* kDeepseekV3[] = {
    R"(\p{N}{1,3})", R"([一-龥぀-ゟ゠-ヿ]+)",
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
constexpr const char* kDeepseekCoder[] = {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)",
                                          R"([一-龥ࠀ-一가-퟿]+)", R"(\p{N})"};
// GLM-4 / GLM-4.5 ("glm4", "chatglm-bpe").
constexpr const char* kGlm4[] = {
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
// o200k (gpt-4o, gpt-oss) and MiniMax-M2: tokenizer.json's pattern, case-aware words with
// contractions, numbers in threes.
constexpr const char* kGpt4o[] = {
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
// Kimi-K2's tiktoken pattern: runs of Han characters on their own, other letters as o200k's
// without the Han ones (its class intersections written as lookaheads).
constexpr const char* kKimiK2[] = {
    R"(\p{Han}+|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])*(?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])+(?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"};
// What llama.cpp applies when a GGUF names no (or the "default") pre-tokenizer.
constexpr const char* kDefault[] = {
    R"([\p{P}\$\+<=>\^~\|]+)",
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))", R"(\p{N}+)",
    R"([0-9][0-9][0-9])"};

struct PreTokenizerSpec {
  const char* name;
  std::span<const char* const> patterns;
};

constexpr PreTokenizerSpec kSpecs[] = {
    {"default", kDefault},
    {"gpt-2", kGpt2},
    {"phi-2", kGpt2},
    {"llama-bpe", kLlama3},
    {"llama3", kLlama3},
    {"llama-v3", kLlama3},
    {"smaug-bpe", kLlama3},
    {"dbrx", kLlama3},
    {"qwen2", kQwen2},
    {"deepseek-r1-qwen", kQwen2},
    {"stablelm2", kQwen2},
    {"qwen35", kQwen35},
    {"deepseek-llm", kDeepseekLlm},
    {"deepseek-v3", kDeepseekV3},
    {"deepseek-coder", kDeepseekCoder},
    {"glm4", kGlm4},
    {"chatglm-bpe", kGlm4},
    {"gpt-4o", kGpt4o},
    {"llama4", kGpt4o},
    {"minimax-m2", kGpt4o},
    {"kimi-k2", kKimiK2},
};

std::array<std::string, 256> make_byte_map() {
  // GPT-2: printable Latin-1 bytes stand for themselves; the rest are shifted to U+0100.. in order.
  std::array<std::string, 256> map;
  int shifted = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + shifted++);
    std::string s;
    if (cp < 0x80) {
      s.push_back(char(cp));
    } else {
      s.push_back(char(0xC0 | (cp >> 6)));
      s.push_back(char(0x80 | (cp & 0x3F)));
    }
    map[b] = s;
  }
  return map;
}

const std::array<std::string, 256>& byte_map() {
  static const std::array<std::string, 256> map = make_byte_map();
  return map;
}

// Code point (< 0x200, the range the byte map uses) -> byte, or -1.
const std::array<int16_t, 512>& reverse_byte_map() {
  static const std::array<int16_t, 512> rev = [] {
    std::array<int16_t, 512> r;
    r.fill(-1);
    const auto& map = byte_map();
    for (int b = 0; b < 256; ++b) {
      const std::string& s = map[b];
      uint32_t cp =
          s.size() == 1 ? uint8_t(s[0]) : ((uint8_t(s[0]) & 0x1F) << 6) | (uint8_t(s[1]) & 0x3F);
      r[cp] = int16_t(b);
    }
    return r;
  }();
  return rev;
}

// Length of the valid UTF-8 sequence at s[i], or 0 if the bytes there are not one.
size_t utf8_valid_len(std::string_view s, size_t i) {
  uint8_t c = uint8_t(s[i]);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) {
    n = 2, cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    uint8_t cc = uint8_t(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

const std::string& byte_to_unicode(uint8_t byte) {
  return byte_map()[byte];
}

bool unicode_to_bytes(std::string_view text, std::string& out) {
  const auto& rev = reverse_byte_map();
  for (size_t i = 0; i < text.size();) {
    uint8_t c = uint8_t(text[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c, i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < text.size()) {
      cp = ((c & 0x1F) << 6) | (uint8_t(text[i + 1]) & 0x3F), i += 2;
    } else {
      return false;
    }
    if (cp >= rev.size() || rev[cp] < 0) return false;
    out.push_back(char(rev[cp]));
  }
  return true;
}

struct PreTokenizer::Regexes {
  std::vector<pcre2_code*> codes;
  ~Regexes() {
    for (pcre2_code* c : codes) pcre2_code_free(c);
  }
};

std::vector<std::string> PreTokenizer::named_patterns(const std::string& name) {
  for (const PreTokenizerSpec& spec : kSpecs) {
    if (name == spec.name) return {spec.patterns.begin(), spec.patterns.end()};
  }
  fail(ErrorKind::kUnsupported, "unknown pre-tokenizer '{}'", printable(name));
}

PreTokenizer::PreTokenizer(const std::string& name) : PreTokenizer(name, named_patterns(name)) {}

PreTokenizer::PreTokenizer(const std::string& name, const std::vector<std::string>& patterns)
    : regexes_(std::make_unique<Regexes>()) {
  for (const std::string& pattern : patterns) add_pattern(name, pattern);
}

const char* PreTokenizer::gpt2_pattern() {
  return kGpt2[0];
}

void PreTokenizer::add_pattern(const std::string& name, const std::string& pattern) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // DOLLAR_ENDONLY: '$' is the end of the piece only, as in the Rust regex crate.
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    fail(ErrorKind::kUnsupported, "pre-tokenizer '{}': regex /{}/ at offset {}: {}",
         printable(name), printable(pattern), err_offset, reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter on failure
  regexes_->codes.push_back(code);
}

PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  // Start from maximal valid UTF-8 runs (PCRE2 in UTF mode rejects invalid input); a stray byte
  // is its own piece, which byte-level BPE encodes like any other byte.
  struct Piece {
    size_t off, len;
    bool valid;
  };
  std::vector<Piece> pieces, next;
  for (size_t i = 0; i < text.size();) {
    size_t start = i;
    while (i < text.size()) {
      size_t n = utf8_valid_len(text, i);
      if (n == 0) break;
      i += n;
    }
    if (i > start) pieces.push_back({start, i - start, true});
    if (i < text.size() && utf8_valid_len(text, i) == 0) pieces.push_back({i++, 1, false});
  }

  for (pcre2_code* code : regexes_->codes) {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
    next.clear();
    for (const Piece& p : pieces) {
      if (!p.valid) {
        next.push_back(p);
        continue;
      }
      auto subject = reinterpret_cast<PCRE2_SPTR>(text.data() + p.off);
      size_t pos = 0, emitted = 0;
      while (pos < p.len) {
        int rc = pcre2_match(code, subject, p.len, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {  // a match or JIT-stack limit: refuse rather than split differently
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof(msg));
          pcre2_match_data_free(md);
          fail(ErrorKind::kResource, "pre-tokenizer regex failed on a {}-byte piece: {}", p.len,
               reinterpret_cast<const char*>(msg));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {  // an empty match splits nothing; step over one character
          pos = ms + std::max<size_t>(1, utf8_valid_len(text, p.off + ms));
          continue;
        }
        if (ms > emitted) next.push_back({p.off + emitted, ms - emitted, true});
        next.push_back({p.off + ms, me - ms, true});
        emitted = pos = me;
      }
      if (emitted < p.len) next.push_back({p.off + emitted, p.len - emitted, true});
    }
    pcre2_match_data_free(md);
    pieces.swap(next);
  }
  for (const Piece& p : pieces) out.emplace_back(p.off, p.len);
}

}  // namespace tandem::tokenizer_detail

namespace tandem {

namespace {

struct BpeSymbol {
  uint32_t start, len;
  int prev, next;
};

struct BpeBigram {
  int rank;
  int left, right;
  uint32_t size;
  // Lowest rank first; among equal ranks the leftmost pair.
  bool operator<(const BpeBigram& o) const {
    return rank != o.rank ? rank > o.rank : left > o.left;
  }
};

}  // namespace

void Tokenizer::Impl::encode_bpe(std::string_view text, std::vector<TokenId>& out) const {
  std::vector<std::pair<size_t, size_t>> pieces;
  pre->split(text, pieces);

  std::string word, key;
  std::vector<BpeSymbol> syms;
  std::priority_queue<BpeBigram> queue;
  for (auto [off, len] : pieces) {
    word.clear();
    for (size_t i = 0; i < len; ++i)
      word += tokenizer_detail::byte_to_unicode(uint8_t(text[off + i]));

    if (ignore_merges) {
      if (TokenId id = find(word); id != kNoToken) {
        out.push_back(id);
        continue;
      }
    }
    // One symbol per code point of the mapped word (every one is 1 or 2 bytes long).
    syms.clear();
    for (uint32_t i = 0; i < word.size();) {
      uint32_t n = (uint8_t(word[i]) & 0x80) ? 2 : 1;
      int idx = int(syms.size());
      syms.push_back({i, n, idx - 1, -1});
      if (idx > 0) syms[idx - 1].next = idx;
      i += n;
    }
    auto try_add = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      key.assign(word, syms[l].start, syms[l].len);
      key.push_back(' ');
      key.append(word, syms[r].start, syms[r].len);
      auto it = merge_rank.find(key);
      if (it != merge_rank.end()) queue.push({it->second, l, r, syms[l].len + syms[r].len});
    };
    for (int i = 1; i < int(syms.size()); ++i) try_add(i - 1, i);
    while (!queue.empty()) {
      BpeBigram b = queue.top();
      queue.pop();
      BpeSymbol& l = syms[b.left];
      BpeSymbol& r = syms[b.right];
      if (l.len == 0 || r.len == 0 || l.next != b.right || l.len + r.len != b.size) continue;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) syms[r.next].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }
    for (int i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) {
      std::string_view s(word.data() + syms[i].start, syms[i].len);
      if (TokenId id = find(s); id != kNoToken) {
        out.push_back(id);
        continue;
      }
      // A merge result missing from the vocabulary: fall back to its characters.
      for (size_t k = 0; k < s.size();) {
        size_t n = (uint8_t(s[k]) & 0x80) ? 2 : 1;
        TokenId id = find(s.substr(k, n));
        if (id != kNoToken) {
          out.push_back(id);
        } else if (unk != kNoToken) {
          out.push_back(unk);
        }
        k += n;
      }
    }
  }
}

}  // namespace tandem
