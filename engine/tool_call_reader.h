// Tool calls read from a model's answer while it is still being written, in each template
// family's syntax (engine/chat_output.h names them). A reader runs over all the text since the
// syntax's start marker every time more arrives and says how far it got: the calls whose name is
// known, each with as much of its arguments (OpenAI's JSON-object text) as is final. Text only
// grows, and so does what a reader reports, so the difference between two readings is what may be
// streamed: a call's start as soon as its name is read, then its arguments piece by piece.
//
// The arguments are written as JSON text that only grows: syntaxes that write JSON give it without
// the whitespace between tokens (strings untouched); syntaxes that write each parameter as text
// (Qwen3-Coder, GLM, MiniMax) give `{"key":value,...}` in the order written, a string-typed value
// streamed as it comes, another typed one whole once it ends. A call cut short (the answer ran
// out of tokens) keeps the arguments read so far, as OpenAI's API does with finish_reason
// "length"; that text need not be complete JSON.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "engine/chat_output.h"
#include "engine/jinja_value.h"

namespace tandem {

struct ToolCallsRead {
  std::vector<ToolCall> calls;  // id empty where the syntax writes none
  // ended: the calls' text ended at `end` and what follows is not part of them (text, or another
  // syntax marker further on). Otherwise the text may go on: `end` is where the text that is not
  // yet known to be a call begins (npos: all of it belongs to a call already read).
  bool ended = false;
  size_t end = 0;
};

// Reads calls from `text`, which begins with tool_call_start(syntax) (not kNone or kHarmony).
// `tools`: the request's tools (their schemas say which text-written values are strings). `final`:
// no more text will come (a call whose parameters were all read is closed).
ToolCallsRead read_tool_calls(std::string_view text, ToolCallSyntax syntax,
                              const jinja::Json& tools, bool final);

// A JSON object or array at the start of s (s[0] is '{' or '['), without the whitespace between
// its tokens; end: its length in s, 0 while it is incomplete (text: the part read so far).
struct JsonPrefix {
  std::string text;
  size_t end = 0;
};
JsonPrefix compact_json_prefix(std::string_view s);

}  // namespace tandem
