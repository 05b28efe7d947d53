#include "engine/chat_output.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "engine/text_scan.h"
#include "engine/tool_call_reader.h"

namespace tandem {
namespace {

using jinja::Json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";

using text::held_tail;
using text::is_space;
using text::trim;

}  // namespace

ToolCallSyntax tool_call_syntax(std::string_view src) {
  const auto has = [&](std::string_view s) { return src.find(s) != std::string_view::npos; };
  if (has("<|channel|>") && has("<|message|>")) return ToolCallSyntax::kHarmony;
  if (has("<minimax:tool_call>")) return ToolCallSyntax::kMiniMax;
  if (has("｜DSML｜")) {
    return has("function_calls>") ? ToolCallSyntax::kDsml : ToolCallSyntax::kDsmlToolCalls;
  }
  if (has("tool_calls_section_begin")) return ToolCallSyntax::kKimi;
  if (has("tool▁calls▁begin")) {
    return has("```json") ? ToolCallSyntax::kDeepSeekR1 : ToolCallSyntax::kDeepSeekV3;
  }
  if (has("[TOOL_CALLS]")) {
    return has("[ARGS]") ? ToolCallSyntax::kMistralArgs : ToolCallSyntax::kMistralList;
  }
  if (has("<arg_key>")) return ToolCallSyntax::kGlm;
  if (has("<function=")) return ToolCallSyntax::kQwen3Coder;
  if (has("<tool_call>")) return ToolCallSyntax::kHermes;
  return ToolCallSyntax::kNone;
}

const char* tool_call_syntax_name(ToolCallSyntax syntax) {
  switch (syntax) {
    case ToolCallSyntax::kNone:
      return "none";
    case ToolCallSyntax::kHermes:
      return "hermes";
    case ToolCallSyntax::kQwen3Coder:
      return "qwen3-coder";
    case ToolCallSyntax::kGlm:
      return "glm";
    case ToolCallSyntax::kDeepSeekV3:
      return "deepseek-v3";
    case ToolCallSyntax::kDeepSeekR1:
      return "deepseek-r1";
    case ToolCallSyntax::kKimi:
      return "kimi";
    case ToolCallSyntax::kMistralList:
      return "mistral";
    case ToolCallSyntax::kMistralArgs:
      return "mistral-args";
    case ToolCallSyntax::kMiniMax:
      return "minimax";
    case ToolCallSyntax::kDsml:
      return "deepseek-dsml";
    case ToolCallSyntax::kDsmlToolCalls:
      return "deepseek-v4-dsml";
    case ToolCallSyntax::kHarmony:
      return "harmony";
  }
  return "?";
}

std::string_view tool_call_start(ToolCallSyntax syntax) {
  switch (syntax) {
    case ToolCallSyntax::kNone:
      return "";
    case ToolCallSyntax::kHermes:
    case ToolCallSyntax::kQwen3Coder:
    case ToolCallSyntax::kGlm:
      return "<tool_call>";
    case ToolCallSyntax::kDeepSeekV3:
    case ToolCallSyntax::kDeepSeekR1:
      return kDsCallsBegin;
    case ToolCallSyntax::kKimi:
      return "<|tool_calls_section_begin|>";
    case ToolCallSyntax::kMistralList:
    case ToolCallSyntax::kMistralArgs:
      return "[TOOL_CALLS]";
    case ToolCallSyntax::kMiniMax:
      return "<minimax:tool_call>";
    case ToolCallSyntax::kDsml:
      return "<｜DSML｜function_calls>";
    case ToolCallSyntax::kDsmlToolCalls:
      return "<｜DSML｜tool_calls>";
    case ToolCallSyntax::kHarmony:
      return "to=functions.";
  }
  return "";
}

bool prompt_opens_think(std::string_view prompt) {
  const std::string_view p = trim(prompt);
  return p.size() >= kThinkOpen.size() && p.substr(p.size() - kThinkOpen.size()) == kThinkOpen;
}

namespace {

// Appends text of a kind to d, to its last piece when that is of the same kind (and call).
void add_piece(AnswerDelta* d, AnswerPiece::Kind kind, std::string_view text, size_t call = 0) {
  if (text.empty()) return;
  if (!d->empty() && d->back().kind == kind && kind != AnswerPiece::Kind::kCall &&
      d->back().call == call) {
    d->back().text += text;
    return;
  }
  AnswerPiece p;
  p.kind = kind;
  p.text = std::string(text);
  p.call = call;
  d->push_back(std::move(p));
}

}  // namespace

void ChatOutput::add(const AnswerDelta& d) {
  for (const AnswerPiece& p : d) {
    switch (p.kind) {
      case AnswerPiece::Kind::kReasoning:
        reasoning += p.text;
        break;
      case AnswerPiece::Kind::kContent:
        content += p.text;
        break;
      case AnswerPiece::Kind::kCall:
        tool_calls.push_back({p.id, p.name, ""});
        break;
      case AnswerPiece::Kind::kArguments:
        tool_calls.at(p.call).arguments += p.text;
        break;
    }
  }
}

ChatStreamParser::ChatStreamParser(ToolCallSyntax syntax, bool in_think, Json tools)
    : syntax_(syntax == ToolCallSyntax::kHarmony || (tools.is_array() && !tools.empty())
                  ? syntax
                  : ToolCallSyntax::kNone),
      tools_(std::move(tools)),
      in_think_(in_think),
      seen_think_(in_think) {}

void ChatStreamParser::start_call(AnswerDelta* d, const std::string& id, const std::string& name) {
  AnswerPiece p;
  p.kind = AnswerPiece::Kind::kCall;
  p.call = calls_ + sent_.size();
  p.id = id.empty() ? fmt::format("call_{}", p.call) : id;
  p.name = name;
  d->push_back(std::move(p));
  sent_.push_back(0);
}

namespace {

constexpr std::string_view kHarmonyMessage = "<|message|>";
constexpr std::string_view kHarmonyEnds[] = {"<|end|>", "<|return|>", "<|call|>"};
// A header longer than this before <|message|>: the model is not writing harmony, its text is
// content as it is.
constexpr size_t kHarmonyHeaderMax = 256;

// The word after `key` in a harmony header ("<|channel|>analysis", "to=functions.get_weather"):
// up to a space or the next <|...|> token.
std::string_view header_word(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return {};
  std::string_view w = header.substr(at + key.size());
  return w.substr(0, std::min(w.find(' '), w.find("<|")));
}

}  // namespace

// Harmony: messages one after another, each a header up to <|message|> (what follows the prompt's
// `<|start|>assistant`, then `<|start|>assistant ...` for the next) and a body up to <|end|>,
// <|return|> or <|call|> (the last two end the generation and may not be in the text).
void ChatStreamParser::push_harmony(std::string_view text, AnswerDelta* d) {
  pending_ += text;
  while (!pending_.empty()) {
    if (harmony_ == Harmony::kHeader) {
      // Harmony when <|message|> starts within kHarmonyHeaderMax bytes: once that many and the
      // token's length have come without one, or one starts later, not harmony.
      const size_t at = pending_.find(kHarmonyMessage);
      if (at == std::string::npos || at > kHarmonyHeaderMax) {
        if (at != std::string::npos ||
            pending_.size() >= kHarmonyHeaderMax + kHarmonyMessage.size()) {
          // not harmony: plain content from here
          syntax_ = ToolCallSyntax::kNone;
          harmony_ = Harmony::kContent;
          started_content_ = true;
          in_think_ = false;  // (as written: no reasoning, no <think> to look for)
          seen_think_ = true;
          add_piece(d, AnswerPiece::Kind::kContent, pending_);
          pending_.clear();
        }
        break;
      }
      const std::string_view header = std::string_view(pending_).substr(0, at);
      const std::string_view to = header_word(header, "to=functions.");
      const std::string_view channel = header_word(header, "<|channel|>");
      if (!to.empty() && tools_.is_array() && !tools_.empty()) {
        harmony_ = Harmony::kCall;
        call_name_ = std::string(to);
        tool_text_.clear();
      } else {
        harmony_ = channel == "analysis" ? Harmony::kReasoning : Harmony::kContent;
      }
      pending_.erase(0, at + kHarmonyMessage.size());
      continue;
    }
    size_t end = std::string::npos, end_size = 0;
    for (std::string_view e : kHarmonyEnds) {
      const size_t at = pending_.find(e);
      if (at < end) {
        end = at;
        end_size = e.size();
      }
    }
    const size_t body = end != std::string::npos
                            ? end
                            : pending_.size() - held_tail(pending_, {kHarmonyEnds[0],
                                                                     kHarmonyEnds[1],
                                                                     kHarmonyEnds[2]});
    harmony_text(d, std::string_view(pending_).substr(0, body));
    pending_.erase(0, body);
    if (end == std::string::npos) break;
    pending_.erase(0, end_size);
    end_harmony_message(d);
  }
}

// Body text of the current harmony message to where it goes.
void ChatStreamParser::harmony_text(AnswerDelta* d, std::string_view part) {
  if (harmony_ == Harmony::kCall) {
    tool_text_ += part;
    harmony_call(d);
    return;
  }
  if (part.empty() || harmony_ == Harmony::kHeader) return;
  const int k = harmony_ == Harmony::kReasoning ? 0 : 1;
  const auto kind = k == 0 ? AnswerPiece::Kind::kReasoning : AnswerPiece::Kind::kContent;
  if (sep_[k]) add_piece(d, kind, "\n");
  sep_[k] = false;
  wrote_[k] = true;
  add_piece(d, kind, part);
}

// A call's body so far: a call once it starts as a JSON object (its arguments), else the content
// it was written as.
void ChatStreamParser::harmony_call(AnswerDelta* d) {
  const size_t first = tool_text_.find_first_not_of(" \n\t\r");
  if (first == std::string::npos) return;
  if (!in_tools_) {
    if (tool_text_[first] != '{') {
      harmony_ = Harmony::kContent;
      const std::string text = std::move(tool_text_);
      tool_text_.clear();
      harmony_text(d, text);
      return;
    }
    in_tools_ = true;
    start_call(d, "", call_name_);
  }
  const JsonPrefix args = compact_json_prefix(std::string_view(tool_text_).substr(first));
  add_piece(d, AnswerPiece::Kind::kArguments, std::string_view(args.text).substr(sent_[0]),
            calls_);
  sent_[0] = args.text.size();
}

// A harmony message's end: a call's is over (text after its JSON is content).
void ChatStreamParser::end_harmony_message(AnswerDelta* d) {
  if (harmony_ == Harmony::kCall && in_tools_) {
    const size_t first = tool_text_.find_first_not_of(" \n\t\r");
    const size_t end = compact_json_prefix(std::string_view(tool_text_).substr(first)).end;
    const std::string after = end == 0 ? "" : std::string(trim(tool_text_.substr(first + end)));
    in_tools_ = false;
    calls_ += 1;
    sent_.clear();
    tool_text_.clear();
    harmony_ = Harmony::kContent;
    harmony_text(d, after);
  }
  tool_text_.clear();
  for (int k = 0; k < 2; ++k) sep_[k] = wrote_[k];
  harmony_ = Harmony::kHeader;
}

// Text passed on for one side: what follows held whitespace gets it first; the whitespace it ends
// with is held; the side's leading whitespace is dropped.
void ChatStreamParser::hold_space(std::string* out, int k) {
  if (!begun_[k]) {
    const size_t first = out->find_first_not_of(" \n\t\r");
    out->erase(0, first == std::string::npos ? out->size() : first);
    begun_[k] = !out->empty();
  }
  if (out->empty()) return;
  size_t end = out->size();
  while (end > 0 && is_space((*out)[end - 1])) --end;
  if (end == 0) {
    held_space_[k] += *out;
    out->clear();
    return;
  }
  std::string tail = out->substr(end);
  out->erase(end);
  out->insert(0, held_space_[k]);
  held_space_[k] = std::move(tail);
}

// The pieces as they are passed on: the whitespace held; a call ends the content before it (its
// held whitespace dropped, the content after it starts afresh).
AnswerDelta ChatStreamParser::settle(AnswerDelta raw) {
  AnswerDelta out;
  for (AnswerPiece& p : raw) {
    switch (p.kind) {
      case AnswerPiece::Kind::kCall:
        held_space_[1].clear();
        begun_[1] = false;
        out.push_back(std::move(p));
        break;
      case AnswerPiece::Kind::kArguments:
        add_piece(&out, p.kind, p.text, p.call);
        break;
      case AnswerPiece::Kind::kReasoning:
      case AnswerPiece::Kind::kContent: {
        const int k = p.kind == AnswerPiece::Kind::kReasoning ? 0 : 1;
        hold_space(&p.text, k);
        add_piece(&out, p.kind, p.text);
        break;
      }
    }
  }
  return out;
}

AnswerDelta ChatStreamParser::push(std::string_view text) {
  AnswerDelta d;
  if (syntax_ == ToolCallSyntax::kHarmony) {
    push_harmony(text, &d);
  } else {
    (in_tools_ ? tool_text_ : pending_) += text;
    drain(&d, /*final=*/false);
  }
  return settle(std::move(d));
}

AnswerDelta ChatStreamParser::finish() {
  AnswerDelta d;
  if (syntax_ == ToolCallSyntax::kHarmony) {
    if (harmony_ == Harmony::kHeader) {
      harmony_ = Harmony::kContent;  // an unfinished header: the text as written
    }
    harmony_text(&d, pending_);
    pending_.clear();
    end_harmony_message(&d);
  } else {
    drain(&d, /*final=*/true);
  }
  return settle(std::move(d));  // (whitespace still held ends the answer: dropped)
}

void ChatStreamParser::read_calls(AnswerDelta* d, bool final) {
  const ToolCallsRead r = read_tool_calls(tool_text_, syntax_, tools_, final);
  for (size_t i = 0; i < r.calls.size(); ++i) {
    const ToolCall& c = r.calls[i];
    if (i == sent_.size()) start_call(d, c.id, c.name);
    add_piece(d, AnswerPiece::Kind::kArguments, std::string_view(c.arguments).substr(sent_[i]),
              calls_ + i);
    sent_[i] = c.arguments.size();
  }
  if (!r.ended && !final) return;
  // The calls' text is over: what follows is text again.
  std::string rest = r.end == std::string::npos ? "" : tool_text_.substr(r.end);
  in_tools_ = false;
  calls_ += sent_.size();
  sent_.clear();
  tool_text_.clear();
  if (r.calls.empty()) {  // the marker did not start a call: it is text
    const size_t marker = tool_call_start(syntax_).size();
    add_piece(d, AnswerPiece::Kind::kContent, std::string_view(rest).substr(0, marker));
    rest.erase(0, marker);
  } else {
    started_content_ = false;  // (the content after calls starts afresh, without a <think>)
    seen_think_ = true;
  }
  pending_ = std::move(rest);
}

void ChatStreamParser::drain(AnswerDelta* d, bool final) {
  while (true) {
    if (in_tools_) {
      read_calls(d, final);
      if (in_tools_) return;
      continue;
    }
    if (pending_.empty()) break;
    if (in_think_) {
      const size_t at = pending_.find(kThinkClose);
      if (at == std::string::npos) {
        const size_t keep = final ? 0 : held_tail(pending_, {kThinkClose});
        add_piece(d, AnswerPiece::Kind::kReasoning,
                  std::string_view(pending_).substr(0, pending_.size() - keep));
        pending_.erase(0, pending_.size() - keep);
        break;
      }
      add_piece(d, AnswerPiece::Kind::kReasoning, std::string_view(pending_).substr(0, at));
      pending_.erase(0, at + kThinkClose.size());
      in_think_ = false;
      started_content_ = false;
      continue;
    }
    if (!started_content_) {
      // The answer's start: blank lines are dropped; a <think> block may open here.
      const size_t first = pending_.find_first_not_of(" \n\t\r");
      if (first == std::string::npos) {
        pending_.clear();
        break;
      }
      pending_.erase(0, first);
      if (!seen_think_) {
        if (!final && pending_.size() < kThinkOpen.size() &&
            kThinkOpen.substr(0, pending_.size()) == pending_) {
          break;  // it may still become <think>
        }
        if (pending_.compare(0, kThinkOpen.size(), kThinkOpen) == 0) {
          pending_.erase(0, kThinkOpen.size());
          in_think_ = seen_think_ = true;
          continue;
        }
      }
      started_content_ = true;
    }
    const std::string_view start = tool_call_start(syntax_);
    if (!start.empty()) {
      const size_t at = pending_.find(start);
      if (at != std::string::npos) {
        add_piece(d, AnswerPiece::Kind::kContent, std::string_view(pending_).substr(0, at));
        tool_text_ = pending_.substr(at);
        pending_.clear();
        in_tools_ = true;
        continue;
      }
    }
    const size_t keep = start.empty() || final ? 0 : held_tail(pending_, {start});
    add_piece(d, AnswerPiece::Kind::kContent,
              std::string_view(pending_).substr(0, pending_.size() - keep));
    pending_.erase(0, pending_.size() - keep);
    break;
  }
}

ChatOutput parse_chat_output(std::string_view text, ToolCallSyntax syntax, bool in_think,
                             const Json& tools) {
  ChatStreamParser p(syntax, in_think, tools);
  ChatOutput out;
  out.add(p.push(text));
  out.add(p.finish());
  return out;
}

}  // namespace tandem
