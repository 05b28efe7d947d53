#include "engine/chat_output.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace tandem {
namespace {

using jinja::Json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

void skip_space(std::string_view& s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
}

bool eat(std::string_view& s, std::string_view prefix) {
  if (s.substr(0, prefix.size()) != prefix) return false;
  s.remove_prefix(prefix.size());
  return true;
}

// The text before `end` (consumed with it); nullopt-like false when `end` is absent.
bool take_until(std::string_view& s, std::string_view end, std::string_view* out) {
  const size_t at = s.find(end);
  if (at == std::string_view::npos) return false;
  *out = s.substr(0, at);
  s.remove_prefix(at + end.size());
  return true;
}

// Length of the JSON object or array s starts with; 0 when s does not start with one or it is
// incomplete.
size_t json_extent(std::string_view s) {
  if (s.empty() || (s[0] != '{' && s[0] != '[')) return 0;
  return jinja::json_nesting(s).end;
}

// A JSON object or array at the start of s (consumed); discarded when there is none.
Json take_json(std::string_view& s) {
  skip_space(s);
  const size_t n = json_extent(s);
  if (n == 0) return Json(Json::value_t::discarded);
  Json j = Json::parse(s.substr(0, n), nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) s.remove_prefix(n);
  return j;
}

// A parameter value the syntax writes as text: a string when the tool's schema says so (or the
// text is not JSON), else the JSON it spells (3 -> 3, true -> true, {...} -> an object).
Json text_value(const Json& tools, const std::string& name, const std::string& key,
                std::string_view text) {
  if (tools.is_array()) {
    for (const Json& t : tools) {
      const Json* f = t.contains("function") ? &t["function"] : &t;
      if (!f->is_object() || f->value("name", "") != name) continue;
      const Json* props = nullptr;
      if (f->contains("parameters") && (*f)["parameters"].is_object() &&
          (*f)["parameters"].contains("properties")) {
        props = &(*f)["parameters"]["properties"];
      }
      if (props != nullptr && props->is_object() && props->contains(key) &&
          (*props)[key].is_object() && (*props)[key].value("type", "") == "string") {
        return Json(std::string(text));
      }
    }
  }
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Json(std::string(text));
  return j;
}

std::string arguments_text(const Json& args) {
  if (args.is_string()) return args.get<std::string>();
  if (args.is_null()) return "{}";
  return args.dump();
}

// Each parser consumes calls from s (which starts at the syntax's start marker) and stops at the
// first thing that is not one; false when not even one call parsed.
using Calls = std::vector<ToolCall>;

bool parse_hermes(std::string_view& s, Calls* calls) {
  while (true) {
    std::string_view rest = s, body;
    skip_space(rest);
    if (!eat(rest, "<tool_call>") || !take_until(rest, "</tool_call>", &body)) break;
    const Json j = Json::parse(trim(body), nullptr, false);
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) break;
    calls->push_back({"", j["name"].get<std::string>(),
                      arguments_text(j.contains("arguments") ? j["arguments"] : Json())});
    s = rest;
  }
  return !calls->empty();
}

// Strips one leading and one trailing newline (the XML syntaxes put the value on its own line).
std::string_view strip_newlines(std::string_view v) {
  if (!v.empty() && v.front() == '\n') v.remove_prefix(1);
  if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
  return v;
}

bool parse_qwen3_coder(std::string_view& s, const Json& tools, Calls* calls) {
  while (true) {
    std::string_view rest = s, body, name;
    skip_space(rest);
    if (!eat(rest, "<tool_call>") || !take_until(rest, "</tool_call>", &body)) break;
    skip_space(body);
    if (!eat(body, "<function=") || !take_until(body, ">", &name)) break;
    Json args = Json::object();
    while (true) {
      skip_space(body);
      std::string_view key, value;
      if (!eat(body, "<parameter=") || !take_until(body, ">", &key) ||
          !take_until(body, "</parameter>", &value)) {
        break;
      }
      args[std::string(key)] =
          text_value(tools, std::string(name), std::string(key), strip_newlines(value));
    }
    skip_space(body);
    if (!eat(body, "</function>")) break;
    calls->push_back({"", std::string(name), args.dump()});
    s = rest;
  }
  return !calls->empty();
}

bool parse_glm(std::string_view& s, const Json& tools, Calls* calls) {
  while (true) {
    std::string_view rest = s, body;
    skip_space(rest);
    if (!eat(rest, "<tool_call>") || !take_until(rest, "</tool_call>", &body)) break;
    const size_t name_end = std::min(body.find('\n'), body.find("<arg_key>"));
    const std::string name(trim(body.substr(0, name_end)));
    if (name.empty()) break;
    body.remove_prefix(std::min(name_end, body.size()));
    Json args = Json::object();
    while (true) {
      skip_space(body);
      std::string_view key, value;
      if (!eat(body, "<arg_key>") || !take_until(body, "</arg_key>", &key)) break;
      skip_space(body);
      if (!eat(body, "<arg_value>") || !take_until(body, "</arg_value>", &value)) break;
      args[std::string(key)] = text_value(tools, name, std::string(key), value);
    }
    calls->push_back({"", name, args.dump()});
    s = rest;
  }
  return !calls->empty();
}

bool parse_deepseek(std::string_view& s, bool r1, Calls* calls) {
  std::string_view rest = s;
  if (!eat(rest, kDsCallsBegin)) return false;
  while (true) {
    std::string_view r = rest, name;
    skip_space(r);
    if (!eat(r, kDsCallBegin)) break;
    if (r1) {
      std::string_view type;
      if (!take_until(r, kDsSep, &type) || !take_until(r, "\n", &name)) break;
      skip_space(r);
      eat(r, "```json");
    } else if (!take_until(r, kDsSep, &name)) {
      break;
    }
    const Json args = take_json(r);
    if (args.is_discarded()) break;
    skip_space(r);
    if (r1) eat(r, "```");
    if (!eat(r, kDsCallEnd)) break;
    calls->push_back({"", std::string(trim(name)), args.dump()});
    rest = r;
  }
  skip_space(rest);
  eat(rest, kDsCallsEnd);
  if (calls->empty()) return false;
  s = rest;
  return true;
}

bool parse_kimi(std::string_view& s, Calls* calls) {
  std::string_view rest = s;
  if (!eat(rest, "<|tool_calls_section_begin|>")) return false;
  while (true) {
    std::string_view r = rest, id;
    skip_space(r);
    if (!eat(r, "<|tool_call_begin|>") || !take_until(r, "<|tool_call_argument_begin|>", &id)) {
      break;
    }
    const Json args = take_json(r);
    if (args.is_discarded()) break;
    skip_space(r);
    if (!eat(r, "<|tool_call_end|>")) break;
    // "functions.NAME:INDEX"
    std::string_view name = trim(id);
    if (name.substr(0, 10) == "functions.") name.remove_prefix(10);
    name = name.substr(0, name.rfind(':'));
    calls->push_back({std::string(trim(id)), std::string(name), args.dump()});
    rest = r;
  }
  skip_space(rest);
  eat(rest, "<|tool_calls_section_end|>");
  if (calls->empty()) return false;
  s = rest;
  return true;
}

bool parse_mistral_list(std::string_view& s, Calls* calls) {
  std::string_view rest = s;
  if (!eat(rest, "[TOOL_CALLS]")) return false;
  const Json list = take_json(rest);
  if (!list.is_array()) return false;
  for (const Json& c : list) {
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) return false;
    const std::string id =
        c.contains("id") && c["id"].is_string() ? c["id"].get<std::string>() : std::string();
    calls->push_back({id, c["name"].get<std::string>(),
                      arguments_text(c.contains("arguments") ? c["arguments"] : Json())});
  }
  if (calls->empty()) return false;
  s = rest;
  return true;
}

bool parse_mistral_args(std::string_view& s, Calls* calls) {
  while (true) {
    std::string_view rest = s, name, id;
    skip_space(rest);
    if (!eat(rest, "[TOOL_CALLS]")) break;
    const size_t args_at = rest.find("[ARGS]");
    if (args_at == std::string_view::npos) break;
    std::string_view head = rest.substr(0, args_at);
    rest.remove_prefix(args_at + 6);
    const size_t id_at = head.find("[CALL_ID]");
    name = head.substr(0, id_at);
    if (id_at != std::string_view::npos) id = head.substr(id_at + 9);
    const Json args = take_json(rest);
    if (args.is_discarded()) break;
    calls->push_back({std::string(id), std::string(trim(name)), args.dump()});
    s = rest;
  }
  return !calls->empty();
}

bool parse_minimax(std::string_view& s, const Json& tools, Calls* calls) {
  std::string_view rest = s, body;
  if (!eat(rest, "<minimax:tool_call>") || !take_until(rest, "</minimax:tool_call>", &body)) {
    return false;
  }
  Calls found;
  while (true) {
    std::string_view name, inv;
    skip_space(body);
    if (!eat(body, "<invoke name=\"") || !take_until(body, "\">", &name) ||
        !take_until(body, "</invoke>", &inv)) {
      break;
    }
    Json args = Json::object();
    while (true) {
      std::string_view key, value;
      skip_space(inv);
      if (!eat(inv, "<parameter name=\"") || !take_until(inv, "\">", &key) ||
          !take_until(inv, "</parameter>", &value)) {
        break;
      }
      args[std::string(key)] = text_value(tools, std::string(name), std::string(key), value);
    }
    found.push_back({"", std::string(name), args.dump()});
  }
  if (found.empty()) return false;
  *calls = std::move(found);
  s = rest;
  return true;
}

// The longest tail of s that is a proper prefix of one of the markers.
size_t held_tail(std::string_view s, const std::vector<std::string_view>& markers) {
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

}  // namespace

ToolCallSyntax tool_call_syntax(std::string_view src) {
  const auto has = [&](std::string_view s) { return src.find(s) != std::string_view::npos; };
  if (has("<|channel|>") && has("<|message|>")) return ToolCallSyntax::kHarmony;
  if (has("<minimax:tool_call>")) return ToolCallSyntax::kMiniMax;
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
    case ToolCallSyntax::kHarmony:
      return "to=functions.";
  }
  return "";
}

bool prompt_opens_think(std::string_view prompt) {
  const std::string_view p = trim(prompt);
  return p.size() >= kThinkOpen.size() && p.substr(p.size() - kThinkOpen.size()) == kThinkOpen;
}

ChatStreamParser::ChatStreamParser(ToolCallSyntax syntax, bool in_think, Json tools)
    : syntax_(syntax == ToolCallSyntax::kHarmony || (tools.is_array() && !tools.empty())
                  ? syntax
                  : ToolCallSyntax::kNone),
      tools_(std::move(tools)),
      in_think_(in_think),
      seen_think_(in_think) {}

namespace {

constexpr std::string_view kHarmonyMessage = "<|message|>";
constexpr std::string_view kHarmonyEnds[] = {"<|end|>", "<|return|>", "<|call|>"};
// A header longer than this without <|message|>: the model is not writing harmony, its text is
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
ChatStreamParser::Delta ChatStreamParser::push_harmony(std::string_view text) {
  Delta d;
  pending_ += text;
  while (!pending_.empty()) {
    if (harmony_ == Harmony::kHeader) {
      const size_t at = pending_.find(kHarmonyMessage);
      if (at == std::string::npos) {
        if (pending_.size() > kHarmonyHeaderMax) {  // not harmony: plain content from here
          syntax_ = ToolCallSyntax::kNone;
          harmony_ = Harmony::kContent;
          started_content_ = true;
          d.content += pending_;
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
    harmony_text(&d, std::string_view(pending_).substr(0, body));
    pending_.erase(0, body);
    if (end == std::string::npos) break;
    pending_.erase(0, end_size);
    end_harmony_message(&d);
  }
  return d;
}

// Body text of the current harmony message to where it goes.
void ChatStreamParser::harmony_text(Delta* d, std::string_view part) {
  if (harmony_ == Harmony::kCall) {
    tool_text_ += part;
    return;
  }
  if (part.empty() || harmony_ == Harmony::kHeader) return;
  const int k = harmony_ == Harmony::kReasoning ? 0 : 1;
  std::string& out = k == 0 ? d->reasoning : d->content;
  if (sep_[k]) out += '\n';
  sep_[k] = false;
  wrote_[k] = true;
  out += part;
}

// A harmony message's end: a call's body becomes the call (arguments as JSON), or, when it is not
// a JSON object, the content it was written as.
void ChatStreamParser::end_harmony_message(Delta* d) {
  if (harmony_ == Harmony::kCall) {
    std::string_view body = tool_text_;
    const Json args = take_json(body);
    if (args.is_object() && trim(body).empty()) {
      harmony_calls_.push_back({"", call_name_, args.dump()});
      tool_text_.clear();
    } else {
      harmony_ = Harmony::kContent;
      const std::string text = std::move(tool_text_);
      tool_text_.clear();
      harmony_text(d, text);
    }
  }
  for (int k = 0; k < 2; ++k) sep_[k] = wrote_[k];
  harmony_ = Harmony::kHeader;
}

// Text parsed for one side, as it is passed on: what follows held whitespace gets it first; the
// whitespace it ends with is held; the reasoning's leading whitespace is dropped.
void ChatStreamParser::hold_space(std::string* out, int k) {
  if (k == 0 && !reasoning_begun_) {
    const size_t first = out->find_first_not_of(" \n\t\r");
    out->erase(0, first == std::string::npos ? out->size() : first);
    reasoning_begun_ = !out->empty();
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

ChatStreamParser::Delta ChatStreamParser::push(std::string_view text) {
  Delta d = push_text(text);
  hold_space(&d.reasoning, 0);
  hold_space(&d.content, 1);
  return d;
}

ChatOutput ChatStreamParser::finish() {
  ChatOutput out = finish_text();
  hold_space(&out.reasoning, 0);
  hold_space(&out.content, 1);
  return out;  // (whitespace still held ends the answer: dropped)
}

ChatStreamParser::Delta ChatStreamParser::push_text(std::string_view text) {
  if (syntax_ == ToolCallSyntax::kHarmony) return push_harmony(text);
  Delta d;
  if (in_tools_) {
    tool_text_ += text;
    return d;
  }
  pending_ += text;
  while (!pending_.empty()) {
    if (in_think_) {
      const size_t at = pending_.find(kThinkClose);
      if (at == std::string::npos) {
        const size_t keep = held_tail(pending_, {kThinkClose});
        d.reasoning += pending_.substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        break;
      }
      d.reasoning += pending_.substr(0, at);
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
        if (pending_.size() < kThinkOpen.size() &&
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
        d.content += pending_.substr(0, at);
        tool_text_ = pending_.substr(at);
        pending_.clear();
        in_tools_ = true;
        break;
      }
    }
    const size_t keep = start.empty() ? 0 : held_tail(pending_, {start});
    d.content += pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
    break;
  }
  return d;
}

ChatOutput ChatStreamParser::finish_text() {
  ChatOutput out;
  if (syntax_ == ToolCallSyntax::kHarmony) {
    Delta d;
    if (harmony_ == Harmony::kHeader) {
      harmony_ = Harmony::kContent;  // an unfinished header: the text as written
    }
    harmony_text(&d, pending_);
    pending_.clear();
    end_harmony_message(&d);
    out.reasoning = std::move(d.reasoning);
    out.content = std::move(d.content);
    for (size_t i = 0; i < harmony_calls_.size(); ++i) {
      harmony_calls_[i].id = fmt::format("call_{}", i);
    }
    out.tool_calls = std::move(harmony_calls_);
    return out;
  }
  if (in_think_) {
    out.reasoning = std::move(pending_);
  } else {
    out.content = std::move(pending_);
  }
  pending_.clear();
  if (!in_tools_) return out;
  std::string_view s = tool_text_;
  Calls calls;
  bool ok = false;
  switch (syntax_) {
    case ToolCallSyntax::kNone:
      break;
    case ToolCallSyntax::kHermes:
      ok = parse_hermes(s, &calls);
      break;
    case ToolCallSyntax::kQwen3Coder:
      ok = parse_qwen3_coder(s, tools_, &calls);
      break;
    case ToolCallSyntax::kGlm:
      ok = parse_glm(s, tools_, &calls);
      break;
    case ToolCallSyntax::kDeepSeekV3:
      ok = parse_deepseek(s, false, &calls);
      break;
    case ToolCallSyntax::kDeepSeekR1:
      ok = parse_deepseek(s, true, &calls);
      break;
    case ToolCallSyntax::kKimi:
      ok = parse_kimi(s, &calls);
      break;
    case ToolCallSyntax::kMistralList:
      ok = parse_mistral_list(s, &calls);
      break;
    case ToolCallSyntax::kMistralArgs:
      ok = parse_mistral_args(s, &calls);
      break;
    case ToolCallSyntax::kMiniMax:
      ok = parse_minimax(s, tools_, &calls);
      break;
    case ToolCallSyntax::kHarmony:  // (push_harmony's)
      break;
  }
  if (!ok) {
    out.content += tool_text_;  // not a tool call after all: the text as written
    return out;
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].id.empty()) calls[i].id = fmt::format("call_{}", i);
  }
  out.tool_calls = std::move(calls);
  out.content += trim(s);
  return out;
}

ChatOutput parse_chat_output(std::string_view text, ToolCallSyntax syntax, bool in_think,
                             const Json& tools) {
  ChatStreamParser p(syntax, in_think, tools);
  const ChatStreamParser::Delta d = p.push(text);
  ChatOutput rest = p.finish();
  ChatOutput out;
  out.reasoning = d.reasoning + rest.reasoning;
  out.content = d.content + rest.content;
  out.tool_calls = std::move(rest.tool_calls);
  return out;
}

}  // namespace tandem
