// libFuzzer target: the Jinja engine on arbitrary template text, as a GGUF's
// tokenizer.chat_template would hand it over. A template either fails to parse, or renders a
// small conversation within its render budgets (lowered here to fit the fuzzer's memory and time
// limits), or throws Error: no crash, no hang, no runaway memory, no leak (namespace cycles).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "engine/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tandem::jinja::Json messages = tandem::jinja::Json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <b>there</b>"},
    {"role": "assistant", "content": "Hello!", "tool_calls": [{"type": "function",
      "function": {"name": "f", "arguments": {"x": 1, "y": [true, null, 2.5]}}}]},
    {"role": "tool", "content": "{\"ok\": 1}"},
    {"role": "user", "content": "\u00e9t\u00e9 \ud83d\ude00"}])");
  static const tandem::jinja::Json tools = tandem::jinja::Json::parse(R"([
    {"type": "function", "function": {"name": "f", "description": "d",
     "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}])");
  tandem::jinja::RenderLimits limits;
  limits.output_bytes = limits.string_bytes = 1 << 20;
  limits.list_items = 1 << 16;
  limits.iterations = 1 << 16;
  limits.bytes = 1 << 26;
  try {
    const tandem::ChatTemplate t(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    (void)t.render(messages, tools, true, "<s>", "</s>", tandem::jinja::Json::object(), limits);
  } catch (const tandem::Error&) {
  }
  return 0;
}
