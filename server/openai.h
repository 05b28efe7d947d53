// OpenAI's API on the server's side: requests (`/v1/chat/completions`, `/v1/completions`) checked
// and turned into a prompt and GenerateParams, and the events of their completions turned into
// responses -- one JSON body, or Server-Sent Events chunks as OpenAI streams them. Errors are
// OpenAI's shape: {"error": {"message", "type", "param", "code"}} with the HTTP status.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/chat_output.h"
#include "engine/chat_template.h"
#include "engine/generator.h"
#include "engine/jinja_value.h"
#include "engine/tokenizer.h"
#include "server/scheduler.h"

namespace tandem::server {

using jinja::Json;

// A request the server refuses: the status, OpenAI's error type and the message.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, const std::string& message, std::string param = {})
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)) {}
  int status;
  std::string type;
  std::string param;
};

// 400 invalid_request_error naming the parameter.
[[noreturn]] void bad_request(const std::string& param, const std::string& message);
// An engine Error as the client sees it: bad arguments and out-of-range values 400, a full
// queue 429, memory 503, the rest 500.
ApiError api_error(const Error& e);
std::string error_body(const ApiError& e);
// A request body as JSON: 400 for text that is not JSON or nests deeper than kMaxJsonDepth.
constexpr int kMaxJsonDepth = 64;
Json parse_json_body(const std::string& body);
// The checks of one request field, shared by every route: absent or null leaves `out` as it is;
// a wrong type is a 400 naming the field.
void boolean(const Json& body, const char* key, bool* out);
struct ModelInfo;
// An array of token ids of the model's vocabulary, or a 400 naming `field` and the bad id.
std::vector<int32_t> token_ids(const Json& v, const ModelInfo& model, const char* field);
// JSON as text, invalid UTF-8 (a byte token's piece) replaced by U+FFFD instead of throwing.
std::string dump_json(const Json& j);

// What requests are checked against and rendered with.
struct ModelInfo {
  std::string name;  // the id of /v1/models; a request's "model" must be it (when given)
  int64_t vocab_size = 0;
  int64_t context = 0;  // positions per sequence
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // nullptr: the model has none
  ToolCallSyntax tool_syntax = ToolCallSyntax::kNone;
  SamplingParams defaults;  // the server's sampling flags, for what a request leaves out
  int max_n = 16;
};

struct ApiRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  int n = 1;
  std::vector<int32_t> prompt;
  GenerateParams params;
  bool logprobs = false;  // chat: logprobs; completions: logprobs >= 0
  bool echo = false;      // completions: the prompt's text before the answer
  std::string prompt_text;
  // chat
  bool in_think = false;  // the rendered prompt opened <think>
  Json tools;             // null: no tools (or tool_choice "none")
  ToolCallSyntax tool_syntax = ToolCallSyntax::kNone;
};

// Throws ApiError for anything malformed: a wrong type names the field; an unknown model is 404.
ApiRequest parse_completion_request(const Json& body, const ModelInfo& model);
ApiRequest parse_chat_request(const Json& body, const ModelInfo& model);

// The response of one request, built from its events.
class ResponseBuilder {
 public:
  ResponseBuilder(const ApiRequest& request, const ModelInfo& model, std::string id,
                  int64_t created);
  ~ResponseBuilder();
  // Streaming: what opens the stream (chat: each choice's role).
  std::string stream_start();
  // Streaming: the SSE chunks of one event ("data: {...}\n\n" each; may be empty).
  std::string stream_event(const Job::Event& e);
  // Streaming: after the last event: the usage chunk (when asked for) and "data: [DONE]".
  std::string stream_end(const Job& job);
  // Not streaming: takes an event in.
  void add(const Job::Event& e);
  // Not streaming: the whole response (after the last event).
  Json body(const Job& job);
  // The first error event's message, if any completion ended with one.
  const std::string& error() const { return error_; }

 private:
  struct Choice;
  Json chunk(int index, Json delta_or_text, const Json& finish, const Json& logprobs) const;
  Json logprobs_of(const GenerateEvent& ev) const;
  Json usage(const Job& job) const;
  const char* finish_name(const Choice& c, FinishReason reason) const;

  const ApiRequest& request_;
  const ModelInfo& model_;
  std::string id_;
  int64_t created_;
  std::vector<std::unique_ptr<Choice>> choices_;
  std::string error_;
};

}  // namespace tandem::server
