// Small text helpers shared by the parsers of a model's answer (chat_output.cpp,
// tool_call_reader.cpp): ASCII whitespace as the templates write it, trimming, and the tail of a
// streamed text held back because it may still become a marker.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <string_view>

namespace tandem::text {

inline bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// The longest tail of s that is a proper prefix of one of the markers.
inline size_t held_tail(std::string_view s, std::initializer_list<std::string_view> markers) {
  size_t keep = 0;
  for (std::string_view m : markers) {
    for (size_t k = std::min(m.size() - 1, s.size()); k > keep; --k) {
      if (s.substr(s.size() - k) == m.substr(0, k)) {
        keep = k;
        break;
      }
    }
  }
  return keep;
}

}  // namespace tandem::text
