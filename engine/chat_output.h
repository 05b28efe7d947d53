// A chat model's answer taken apart the way its template put it together: the reasoning a
// thinking model writes between <think> and </think> (or, in gpt-oss's harmony format, in its
// `analysis` channel), the text for the user, and the tool calls in the syntax the template
// renders an assistant's `tool_calls` in (each template family has its own). The syntax is
// recognized from the template's source, so a model's output parses back into what its template
// would render: parse(render(tool_calls)) == tool_calls.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/jinja_value.h"

namespace tandem {

enum class ToolCallSyntax {
  kNone,        // the template renders no tool calls
  kHermes,      // <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call> (Qwen2.5, Qwen3)
  kQwen3Coder,  // <tool_call>\n<function=N>\n<parameter=K>\nV\n</parameter>...</tool_call>
  kGlm,         // <tool_call>N\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>
  kDeepSeekV3,  // <｜tool▁call▁begin｜>N<｜tool▁sep｜>{...}<｜tool▁call▁end｜> (V3.1)
  kDeepSeekR1,   // <｜tool▁call▁begin｜>function<｜tool▁sep｜>N\n```json\n{...}\n```...
  kKimi,         // <|tool_call_begin|>functions.N:I<|tool_call_argument_begin|>{...}...
  kMistralList,  // [TOOL_CALLS][{"name": N, "arguments": {...}, "id": I}, ...] (Nemo)
  kMistralArgs,  // [TOOL_CALLS]N[CALL_ID]I[ARGS]{...} (Small 3.2)
  kMiniMax,      // <minimax:tool_call>\n<invoke name="N">\n<parameter name="K">V</parameter>
  // gpt-oss's harmony messages, [<|start|>assistant]HEADER<|message|>BODY<|end|> / <|return|> /
  // <|call|>: channel `analysis` -> reasoning, `final` -> content, a header naming
  // `to=functions.N` -> a call of N with BODY as its arguments. It shapes every answer, with tools
  // or without.
  kHarmony,
  // DeepSeek-V3.2's DSML: <｜DSML｜function_calls>\n<｜DSML｜invoke name="N">\n<｜DSML｜parameter
  // name="K" string="true|false">V</｜DSML｜parameter>...</｜DSML｜invoke>...</｜DSML｜function_calls>
  kDsml,
  // DeepSeek-V4's DSML: the same invokes inside <｜DSML｜tool_calls> .. </｜DSML｜tool_calls>.
  kDsmlToolCalls,
};

// The syntax a template renders tool calls in (kNone when it renders none).
ToolCallSyntax tool_call_syntax(std::string_view template_source);
const char* tool_call_syntax_name(ToolCallSyntax syntax);

struct ToolCall {
  std::string id;  // the model's id where the syntax has one, else "call_<index>"
  std::string name;
  std::string arguments;  // a JSON object, as text (OpenAI's `function.arguments`)
};

// A piece of an answer as it streams, in the order the model wrote it.
struct AnswerPiece {
  enum class Kind {
    kReasoning,  // text of the reasoning
    kContent,    // text for the user
    kCall,       // a tool call starts: its index in the answer, id and name
    kArguments,  // more of call `call`'s arguments
  };
  Kind kind = Kind::kContent;
  std::string text;  // kReasoning, kContent, kArguments
  size_t call = 0;   // kCall, kArguments
  std::string id, name;
};
using AnswerDelta = std::vector<AnswerPiece>;

struct ChatOutput {
  std::string reasoning;  // between <think> and </think> (harmony: the analysis channel)
  std::string content;    // the rest, without the tool calls
  std::vector<ToolCall> tool_calls;
  // Adds streamed pieces (calls numbered from 0 in order, as a ChatStreamParser numbers them).
  void add(const AnswerDelta& d);
};

// The marker a tool call starts with in this syntax ("" for kNone).
std::string_view tool_call_start(ToolCallSyntax syntax);

// Parses a whole answer. in_think: the prompt ended inside <think> (the template opened it), so
// the answer begins with reasoning. tools: the request's tools (their parameter schemas decide
// whether a value written as text is a string or JSON, in the syntaxes that write values as
// text); null when there are none. Text after a start marker that is not a tool call stays in
// the content; a call cut short keeps the arguments read (engine/tool_call_reader.h).
ChatOutput parse_chat_output(std::string_view text, ToolCallSyntax syntax, bool in_think,
                             const jinja::Json& tools);

// Whether a rendered prompt ends inside an opened <think> block (the model answers with its
// reasoning first).
bool prompt_opens_think(std::string_view prompt);

// The same, as the text streams in: push() returns the pieces that are final so far (a tail that
// may still become "<think>", "</think>" or a tool call's start is held back), a tool call as
// soon as its name is read and then its arguments as they are read (engine/tool_call_reader.h);
// finish() the rest. The pieces add up to what parse_chat_output returns: the reasoning and each
// run of content without the whitespace around them (whitespace is held until text follows it).
class ChatStreamParser {
 public:
  ChatStreamParser(ToolCallSyntax syntax, bool in_think, jinja::Json tools);
  AnswerDelta push(std::string_view text);
  AnswerDelta finish();

 private:
  // The text read so far into pieces (final: no more will come).
  void drain(AnswerDelta* d, bool final);
  // Tool calls in tool_text_ as far as they go; the text after them back to pending_.
  void read_calls(AnswerDelta* d, bool final);
  void start_call(AnswerDelta* d, const std::string& id, const std::string& name);
  AnswerDelta settle(AnswerDelta raw);
  // Whitespace at the end of what was passed on, [0] reasoning, [1] content; and whether that
  // side has begun (its leading whitespace is dropped: at the start, and content after a call).
  std::string held_space_[2];
  bool begun_[2] = {false, false};
  void hold_space(std::string* out, int k);
  void push_harmony(std::string_view text, AnswerDelta* d);
  void end_harmony_message(AnswerDelta* d);
  // Harmony: a message's header (until <|message|>) or its body; the body's destination.
  enum class Harmony { kHeader, kReasoning, kContent, kCall };
  Harmony harmony_ = Harmony::kHeader;
  // Texts of several messages of a kind are joined with a newline, written before the next
  // message's first text: [0] reasoning, [1] content. (wrote: some text came; sep: one is due.)
  bool wrote_[2] = {false, false}, sep_[2] = {false, false};
  void harmony_text(AnswerDelta* d, std::string_view part);
  void harmony_call(AnswerDelta* d);
  std::string call_name_;
  ToolCallSyntax syntax_;
  jinja::Json tools_;
  bool in_think_;
  bool seen_think_ = false;       // a <think> block opened or closed: no second one
  bool started_content_ = false;  // non-blank content came (a <think> can no longer open)
  bool in_tools_ = false;         // (harmony: a call's body started as JSON)
  std::string pending_;           // text not yet classified
  std::string tool_text_;         // the tool calls' text since their start marker
  size_t calls_ = 0;              // calls finished before tool_text_'s
  std::vector<size_t> sent_;      // arguments passed on of each call in tool_text_
};

}  // namespace tandem
