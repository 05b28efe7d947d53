// SentencePiece-style BPE as GGUF `llama` vocabularies use it (Llama 2, Mistral, Mixtral, Phi-3):
// spaces become U+2581 "▁", adjacent pieces merge greedily by the score of the merged piece (the
// piece must be in the vocabulary), and a piece left without a token falls back to <0xNN> bytes.
#include <algorithm>
#include <queue>

#include "engine/tokenizer_impl.h"

namespace tandem {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581

struct SpmSymbol {
  uint32_t start, len;
  int prev, next;
};

struct SpmBigram {
  float score;
  int left, right;
  uint32_t size;
  // Highest score first; among equal scores the leftmost pair.
  bool operator<(const SpmBigram& o) const {
    return score != o.score ? score < o.score : left > o.left;
  }
};

uint32_t utf8_len_from_lead(uint8_t c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;  // a continuation or invalid byte stands alone (it will fall back to <0xNN>)
}

}  // namespace

void Tokenizer::Impl::encode_spm(std::string_view raw, std::vector<TokenId>& out) const {
  std::string text;
  text.reserve(raw.size() + raw.size() / 4);
  for (char c : raw) {
    if (c == ' ') {
      text += kSpaceMark;
    } else {
      text.push_back(c);
    }
  }

  std::vector<SpmSymbol> syms;
  for (uint32_t i = 0; i < text.size();) {
    uint32_t n =
        std::min<uint32_t>(utf8_len_from_lead(uint8_t(text[i])), uint32_t(text.size()) - i);
    int idx = int(syms.size());
    syms.push_back({i, n, idx - 1, -1});
    if (idx > 0) syms[idx - 1].next = idx;
    i += n;
  }

  std::priority_queue<SpmBigram> queue;
  auto try_add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    std::string_view s(text.data() + syms[l].start, syms[l].len + syms[r].len);
    TokenId id = find(s);
    if (id == kNoToken) return;
    queue.push({scores[id], l, r, uint32_t(s.size())});
  };
  for (int i = 1; i < int(syms.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    SpmBigram b = queue.top();
    queue.pop();
    SpmSymbol& l = syms[b.left];
    SpmSymbol& r = syms[b.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.size) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  // Every merged piece has a token (merges require it), so a piece without one is a single
  // character the vocabulary lacks: emit its bytes.
  for (int i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) {
    std::string_view s(text.data() + syms[i].start, syms[i].len);
    if (TokenId id = find(s); id != kNoToken) {
      out.push_back(id);
      continue;
    }
    for (char c : s) {
      TokenId id = byte_tokens[uint8_t(c)];
      if (id != kNoToken) {
        out.push_back(id);
      } else if (unk != kNoToken) {
        out.push_back(unk);
      }
    }
  }
}

}  // namespace tandem
