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

// The API a request came in (its response and error shapes).
enum class Api { kCompletions, kChat, kResponses, kMessages };

struct ApiRequest {
  Api api = Api::kCompletions;
  bool chat = false;  // rendered from a conversation (every API but completions)
  bool stream = false;
  bool include_usage = false;
  int n = 1;
  std::vector<int32_t> prompt;
  GenerateParams params;
  bool logprobs = false;  // chat: logprobs; completions: logprobs >= 0
  bool echo = false;      // completions: the prompt's text before the answer
  std::string prompt_text;  // completions: the prompt as text; the others: the rendered template
  // chat
  bool in_think = false;  // the rendered prompt opened <think>
  Json tools;             // null: no tools (or tool_choice "none")
  ToolCallSyntax tool_syntax = ToolCallSyntax::kNone;
};

// Throws ApiError for anything malformed: a wrong type names the field; an unknown model is 404.
ApiRequest parse_completion_request(const Json& body, const ModelInfo& model);
ApiRequest parse_chat_request(const Json& body, const ModelInfo& model);

// The response of one request, built from its events, in its API's shape.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  // Streaming: what opens the stream.
  virtual std::string stream_start() = 0;
  // Streaming: the SSE events of one generation event (may be empty).
  virtual std::string stream_event(const Job::Event& e) = 0;
  // Streaming: after the last event: what closes the stream.
  virtual std::string stream_end(const Job& job) = 0;
  // Not streaming: takes an event in.
  virtual void add(const Job::Event& e) = 0;
  // Not streaming: the whole response (after the last event).
  virtual Json body(const Job& job) = 0;
  // The first error event's message, if a completion ended with one.
  const std::string& error() const { return error_; }

 protected:
  std::string error_;
};

// The writer of `request`'s API; ids are made from `serial` (chatcmpl-7, resp_7, msg_7, ...).
std::unique_ptr<ResponseWriter> make_response_writer(const ApiRequest& request,
                                                     const ModelInfo& model, uint64_t serial,
                                                     int64_t created);

// An error in `api`'s shape: OpenAI's {"error": {...}}, or Anthropic's {"type": "error",
// "error": {"type", "message"}} for the Messages API.
std::string error_body(const ApiError& e, Api api);
// The API a path belongs to (for the shape of errors raised before a request is parsed).
Api api_of_path(const std::string& path);

// OpenAI's Responses API (/v1/responses) and Anthropic's Messages API (/v1/messages): the
// request's input turned into a conversation in chat's shape and rendered like a chat request.
ApiRequest parse_responses_request(const Json& body, const ModelInfo& model);
ApiRequest parse_messages_request(const Json& body, const ModelInfo& model);
// /v1/messages/count_tokens: the request's prompt (max_tokens not needed).
ApiRequest parse_count_tokens_request(const Json& body, const ModelInfo& model);

}  // namespace tandem::server
