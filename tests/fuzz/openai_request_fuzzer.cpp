// libFuzzer target: the OpenAI request parser on arbitrary bodies, as a client would send them
// to `tandem serve`. The first byte picks the endpoint (chat or text completions) and the chat
// template (templates of real models: tool calls, reasoning, kwargs such as enable_thinking);
// the rest is the body. A body either is refused with an ApiError or Error (what the server
// answers 4xx / 5xx), or parses into a prompt within the context: no crash, no hang, no runaway
// memory, no other exception (the server answered those with a raw 500).
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/chat_output.h"
#include "engine/chat_template.h"
#include "engine/tokenizer.h"
#include "server/openai.h"

namespace {

using namespace tandem;

struct Setup {
  Tokenizer tokenizer;
  std::vector<std::unique_ptr<ChatTemplate>> templates;
  std::vector<server::ModelInfo> models;  // [template]
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const Setup& setup() {
  static const Setup* s = [] {
    const std::string data = TANDEM_TEST_DATA_DIR;
    auto* x = new Setup{Tokenizer::from_gguf_file(data + "/demo/tandem-demo-moe-Q4_K_M.gguf"),
                        {},
                        {}};
    for (const char* name : {"Qwen-Qwen3-0.6B", "openai-gpt-oss-120b", "deepseek-ai-DeepSeek-V3.1",
                             "Qwen3.5-4B", "GLM-4.6", "moonshotai-Kimi-K2",
                             "Mistral-Small-3.2-24B-Instruct-2506", "MiniMax-M2"}) {
      x->templates.push_back(std::make_unique<ChatTemplate>(
          read_file(data + "/templates/" + name + ".jinja"), name));
    }
    for (const auto& t : x->templates) {
      server::ModelInfo m;
      m.name = "m";
      m.vocab_size = x->tokenizer.vocab_size();
      m.context = 2048;
      m.tokenizer = &x->tokenizer;
      m.chat_template = t.get();
      m.tool_syntax = tool_call_syntax(t->source());
      x->models.push_back(m);
    }
    return x;
  }();
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Setup& s = setup();
  const bool chat = (data[0] & 1) != 0;
  const server::ModelInfo& m = s.models[(data[0] >> 1) % s.models.size()];
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const server::Json j = server::parse_json_body(body);
    const server::ApiRequest r =
        chat ? server::parse_chat_request(j, m) : server::parse_completion_request(j, m);
    if (r.prompt.empty() || static_cast<int64_t>(r.prompt.size()) > m.context * 64) __builtin_trap();
    for (int32_t id : r.prompt) {
      if (id < 0 || id >= m.vocab_size) __builtin_trap();
    }
  } catch (const server::ApiError&) {
  } catch (const Error&) {
  }
  return 0;
}
