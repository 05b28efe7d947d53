// Python str semantics the interpreter needs (jinja_interp.h): split/strip/replace as Python does
// them, UTF-8 code points as the unit of length and indexing.
#include <cctype>

#include "core/error.h"
#include "engine/jinja_ast.h"

namespace tandem::jinja {

// Bytes of the code point a byte starts (a stray continuation byte counts as a 2-byte lead).
static size_t utf8_len(unsigned char c) {
  return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t k = 0; k < s.size();) {
    const size_t len = utf8_len(static_cast<unsigned char>(s[k]));
    out.push_back(s.substr(k, len));
    k += len;
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (size_t k = 0; k < s.size(); k += utf8_len(static_cast<unsigned char>(s[k]))) ++n;
  return n;
}

std::vector<uint32_t> utf8_starts(const std::string& s) {
  std::vector<uint32_t> out;
  size_t k = 0;
  for (; k < s.size(); k += utf8_len(static_cast<unsigned char>(s[k]))) {
    out.push_back(static_cast<uint32_t>(k));
  }
  out.push_back(static_cast<uint32_t>(s.size()));
  return out;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string strip_chars(const std::string& s, const Value* chars, bool left, bool right) {
  auto in_set = [&](char c) {
    return chars && chars->is_string() ? chars->s.find(c) != std::string::npos : is_space(c);
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && in_set(s[b])) ++b;
  }
  if (right) {
    while (e > b && in_set(s[e - 1])) --e;
  }
  return s.substr(b, e - b);
}

std::vector<std::string> split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (!sep || sep->is_none()) {  // runs of whitespace, no empty parts
    std::vector<std::string> words;
    size_t k = 0;
    while (k < s.size()) {
      while (k < s.size() && is_space(s[k])) ++k;
      size_t b = k;
      while (k < s.size() && !is_space(s[k])) ++k;
      if (k > b) words.push_back(s.substr(b, k - b));
    }
    if (maxsplit < 0 || static_cast<int64_t>(words.size()) <= maxsplit + 1) return words;
    // Rare: rejoin the remainder with the original text.
    std::string rest;
    if (!from_right) {
      size_t pos = 0;
      for (int64_t n = 0; n < maxsplit; ++n) {
        pos = s.find(words[n], pos) + words[n].size();
        parts.push_back(words[n]);
      }
      parts.push_back(strip_chars(s.substr(pos), nullptr, true, true));
      return parts;
    }
    return words;
  }
  const std::string& d = sep->s;
  if (d.empty()) fail(ErrorKind::kInvalidArgument, "empty separator");
  if (!from_right) {
    size_t pos = 0;
    for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
      size_t f = s.find(d, pos);
      if (f == std::string::npos) break;
      parts.push_back(s.substr(pos, f - pos));
      pos = f + d.size();
    }
    parts.push_back(s.substr(pos));
    return parts;
  }
  size_t end = s.size();
  for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
    if (end < d.size()) break;
    size_t f = s.rfind(d, end - d.size());
    if (f == std::string::npos) break;
    parts.insert(parts.begin(), s.substr(f + d.size(), end - f - d.size()));
    end = f;
  }
  parts.insert(parts.begin(), s.substr(0, end));
  return parts;
}

Value str_array(const std::vector<std::string>& v) {
  Array a;
  for (const auto& s : v) a.push_back(Value::string(s));
  return Value::array(std::move(a));
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string title(std::string s) {
  bool start = true;
  for (char& c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    c = static_cast<char>(start ? toupper(u) : tolower(u));
    start = !isalnum(u);
  }
  return s;
}
std::string capitalize(std::string s) {
  s = lower(std::move(s));
  if (!s.empty()) s[0] = static_cast<char>(toupper(static_cast<unsigned char>(s[0])));
  return s;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count, uint64_t max_bytes) {
  if (from.empty()) return s;
  // Built front to back (replacing in place moves the tail at each match: quadratic).
  std::string r;
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    r.append(s, pos, f - pos);
    r += to;
    pos = f + from.size();
    if (r.size() > max_bytes) {
      fail(ErrorKind::kResource, "replace() makes a string longer than {} bytes", max_bytes);
    }
  }
  r.append(s, pos, std::string::npos);
  if (r.size() > max_bytes) {
    fail(ErrorKind::kResource, "replace() makes a string longer than {} bytes", max_bytes);
  }
  return r;
}

}  // namespace tandem::jinja
