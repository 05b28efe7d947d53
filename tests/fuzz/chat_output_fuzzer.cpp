// libFuzzer target: a model's answer taken apart (engine/chat_output.h) from arbitrary text, as
// a model may write anything. The first byte picks the tool-call syntax, whether the prompt
// opened <think>, and the size of the streamed pieces; the rest is the answer. Whole and streamed
// must agree exactly (reasoning, content, every call's id, name and arguments), every piece must
// belong to a call already started, and nothing may crash, hang or grow without bound.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/chat_output.h"

namespace {

using namespace tandem;

const jinja::Json& tools() {
  static const jinja::Json t = jinja::Json::parse(R"([
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"code": {"type": "string"}, "n": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "get_weather"}}])");
  return t;
}

bool same(const ChatOutput& a, const ChatOutput& b) {
  if (a.reasoning != b.reasoning || a.content != b.content) return false;
  if (a.tool_calls.size() != b.tool_calls.size()) return false;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    const ToolCall& x = a.tool_calls[i];
    const ToolCall& y = b.tool_calls[i];
    if (x.id != y.id || x.name != y.name || x.arguments != y.arguments) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto syntax = static_cast<ToolCallSyntax>(data[0] % 13);
  const bool in_think = (data[0] >> 4) & 1;
  const size_t piece = ((data[0] >> 5) & 7) + 1;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const ChatOutput whole = parse_chat_output(text, syntax, in_think, tools());
  ChatStreamParser p(syntax, in_think, tools());
  ChatOutput streamed;
  size_t started = 0;
  const auto add = [&](const AnswerDelta& d) {
    for (const AnswerPiece& x : d) {
      if (x.kind == AnswerPiece::Kind::kCall && x.call != started++) __builtin_trap();
      if (x.kind == AnswerPiece::Kind::kArguments && x.call >= started) __builtin_trap();
    }
    streamed.add(d);
  };
  for (size_t i = 0; i < text.size(); i += piece) add(p.push(text.substr(i, piece)));
  add(p.finish());
  if (!same(whole, streamed)) __builtin_trap();
  // (what comes out is never more than the text and the JSON written around it)
  size_t out = whole.reasoning.size() + whole.content.size();
  for (const ToolCall& c : whole.tool_calls) out += c.arguments.size();
  if (out > 8 * text.size() + 64) __builtin_trap();
  return 0;
}
