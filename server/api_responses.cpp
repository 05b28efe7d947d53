// OpenAI's Responses API (/v1/responses), stateless: `input` (a string, or message, function_call
// and function_call_output items) and `instructions` become a conversation in chat's shape,
// rendered like a chat request; the answer becomes output items (reasoning with its summary text,
// the message's output_text, function_call items), whole or as the API's typed stream events.
#include <fmt/format.h>

#include "server/conversation.h"
#include "server/request_fields.h"

namespace tandem::server {
namespace {

// A content part's text: a string, or an array of input_text / output_text parts.
std::string content_text(const Json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_request(where, fmt::format("'{}' must be a string or parts", where));
  std::string text;
  for (const Json& part : content) {
    const std::string type = part.is_object() ? part.value("type", "") : "";
    if ((type != "input_text" && type != "output_text" && type != "text") ||
        !part.contains("text") || !part["text"].is_string()) {
      bad_request(where, fmt::format("'{}': a part of type '{}' is not supported (text only)",
                                     where, type));
    }
    if (!text.empty()) text += "\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

std::string string_field(const Json& item, const char* key, const std::string& where) {
  if (!item.contains(key) || !item[key].is_string()) {
    bad_request(where, fmt::format("'{}' needs a string '{}'", where, key));
  }
  return item[key].get<std::string>();
}

// input (and instructions) as chat messages: function calls join the assistant message before
// them, their outputs become tool messages.
Json input_messages(const Json& body) {
  Json messages = Json::array();
  if (body.contains("instructions") && !body["instructions"].is_null()) {
    if (!body["instructions"].is_string()) {
      bad_request("instructions", "'instructions' must be a string");
    }
    messages.push_back({{"role", "system"}, {"content", body["instructions"]}});
  }
  if (!body.contains("input")) bad_request("input", "'input' is required");
  const Json& input = body["input"];
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return messages;
  }
  if (!input.is_array() || input.empty()) {
    bad_request("input", "'input' must be a string or a non-empty array of items");
  }
  for (size_t i = 0; i < input.size(); ++i) {
    const Json& item = input[i];
    const std::string where = fmt::format("input[{}]", i);
    if (!item.is_object()) bad_request(where, fmt::format("'{}' must be an object", where));
    const std::string type = item.value("type", item.contains("role") ? "message" : "");
    if (type == "message") {
      const std::string role = string_field(item, "role", where);
      const std::string text = content_text(item.contains("content") ? item["content"] : Json(),
                                            where + ".content");
      messages.push_back({{"role", role}, {"content", text}});
    } else if (type == "function_call") {
      Json call = {{"id", string_field(item, "call_id", where)},
                   {"type", "function"},
                   {"function",
                    {{"name", string_field(item, "name", where)},
                     {"arguments", string_field(item, "arguments", where)}}}};
      Json* last = messages.empty() ? nullptr : &messages.back();
      if (last == nullptr || (*last)["role"] != "assistant") {
        messages.push_back({{"role", "assistant"}, {"content", nullptr}});
        last = &messages.back();
      }
      if (!last->contains("tool_calls")) (*last)["tool_calls"] = Json::array();
      (*last)["tool_calls"].push_back(std::move(call));
    } else if (type == "function_call_output") {
      const Json& out = item.contains("output") ? item["output"] : Json();
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", string_field(item, "call_id", where)},
                          {"content", out.is_string() ? out.get<std::string>()
                                                      : content_text(out, where + ".output")}});
    } else if (type == "reasoning") {
      continue;  // (the model's earlier reasoning: templates drop it from past turns)
    } else {
      bad_request(where, fmt::format("'{}': items of type '{}' are not supported (message, "
                                     "function_call, function_call_output)",
                                     where, type));
    }
  }
  return messages;
}

// Responses' function tools ({"type": "function", "name", "parameters", ...}) in chat's shape.
Json chat_tools(const Json& body) {
  if (!body.contains("tools") || body["tools"].is_null()) return nullptr;
  if (!body["tools"].is_array()) bad_request("tools", "'tools' must be an array");
  Json tools = Json::array();
  for (const Json& t : body["tools"]) {
    if (!t.is_object() || t.value("type", "") != "function" || !t.contains("name") ||
        !t["name"].is_string()) {
      bad_request("tools", "each tool must be {\"type\": \"function\", \"name\": ...} (built-in "
                           "tools are not supported)");
    }
    Json f = {{"name", t["name"]}};
    if (t.contains("description")) f["description"] = t["description"];
    f["parameters"] = t.contains("parameters") ? t["parameters"] : Json::object();
    tools.push_back({{"type", "function"}, {"function", f}});
  }
  return tools.empty() ? Json() : tools;
}

}  // namespace

ApiRequest parse_responses_request(const Json& body, const ModelInfo& m) {
  check_object(body);
  check_model(body, m);
  ApiRequest r;
  r.api = Api::kResponses;
  if (body.contains("previous_response_id") && !body["previous_response_id"].is_null()) {
    bad_request("previous_response_id",
                "'previous_response_id' is not supported: this server keeps no responses; send "
                "the conversation as 'input'");
  }
  if (body.contains("text") && body["text"].is_object() && body["text"].contains("format") &&
      body["text"]["format"].value("type", "text") != "text") {
    bad_request("text", "only text output is supported ('text.format.type': 'text')");
  }
  SamplingParams& s = r.params.sampling;
  s = m.defaults;
  number(body, "temperature", 0, 2, &s.temperature);
  number(body, "top_p", 0, 1, &s.top_p);
  r.params.max_tokens = -1;
  integer(body, "max_output_tokens", 1, m.context, &r.params.max_tokens);
  boolean(body, "stream", &r.stream);
  Json tools = chat_tools(body);
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& tc = body["tool_choice"];
    if (tc.is_string() && (tc == "none" || tc == "auto" || tc == "required")) {
      tools = chosen_tools(tools, tc.get<std::string>());
    } else if (tc.is_object() && tc.value("type", "") == "function" && tc.contains("name") &&
               tc["name"].is_string()) {
      tools = chosen_tools(tools, tc["name"].get<std::string>());
    } else {
      bad_request("tool_choice", "'tool_choice' must be none, auto, required or "
                                 "{\"type\": \"function\", \"name\": ...}");
    }
  }
  Json extra = Json::object();
  if (body.contains("reasoning") && body["reasoning"].is_object() &&
      body["reasoning"].contains("effort") && body["reasoning"]["effort"].is_string()) {
    extra["reasoning_effort"] = body["reasoning"]["effort"];  // (gpt-oss's template reads it)
  }
  try {
    check_sampling_params(s, m.vocab_size);
  } catch (const Error& e) {
    bad_request("", e.what());
  }
  render_conversation(input_messages(body), tools, extra, m, &r);
  return r;
}

namespace {

class ResponsesWriter : public AnswerWriter {
 public:
  ResponsesWriter(const ApiRequest& request, const ModelInfo& model, uint64_t serial,
                  int64_t created)
      : AnswerWriter(request), request_(request), model_(model), serial_(serial),
        created_(created) {}

  std::string stream_start() override {
    const Json r = response("in_progress", Json::array(), nullptr, nullptr);
    std::string out = event("response.created", {{"response", r}});
    return out + event("response.in_progress", {{"response", r}});
  }

  std::string stream_event(const Job::Event& e) override {
    const AnswerParts::Step s = parts_.push(e.ev);
    std::string out;
    for (const AnswerPiece& p : s.pieces) {
      switch (p.kind) {
        case AnswerPiece::Kind::kReasoning:
          out += reasoning_delta(p.text);
          break;
        case AnswerPiece::Kind::kContent:
          out += text_delta(p.text);
          break;
        case AnswerPiece::Kind::kCall:
          out += open_call(p);
          break;
        case AnswerPiece::Kind::kArguments:
          out += arguments_delta(p.text);
          break;
      }
    }
    if (!s.last) return out;
    if (s.finish == FinishReason::kError && error_.empty()) error_ = s.error;
    // (an answer with neither text nor calls still has its message)
    if (!message_seen_ && calls_ == 0) out += text_delta("");
    out += close_open_item();
    finish_ = s.finish;
    return out;
  }

  std::string stream_end(const Job& job) override {
    if (!error_.empty()) {
      return event("response.failed",
                   {{"response", response("failed", output_, usage(job),
                                          Json({{"code", "server_error"}, {"message", error_}}))}});
    }
    return event("response.completed", {{"response", final_response(job)}});
  }

  Json body(const Job& job) override { return final_response(job); }

 private:
  std::string event(const char* type, Json data) {
    data["type"] = type;
    data["sequence_number"] = sequence_++;
    return fmt::format("event: {}\ndata: {}\n\n", type, dump_json(data));
  }

  std::string id(const char* prefix) const { return fmt::format("{}_{}", prefix, serial_); }
  // An output item's id: its kind's prefix, the response and its place in the output.
  std::string item_id(const char* prefix, int index) const {
    return fmt::format("{}_{}_{}", prefix, serial_, index);
  }

  Json response(const char* status, const Json& output, const Json& usage,
                const Json& error) const {
    Json tools = Json::array();
    if (request_.tools.is_array()) {
      for (const Json& t : request_.tools) {
        Json f = t["function"];
        f["type"] = "function";
        tools.push_back(f);
      }
    }
    return {{"id", id("resp")},
            {"object", "response"},
            {"created_at", created_},
            {"status", status},
            {"error", error},
            {"incomplete_details", nullptr},
            {"model", model_.name},
            {"output", output},
            {"parallel_tool_calls", true},
            {"temperature", request_.params.sampling.temperature},
            {"top_p", request_.params.sampling.top_p},
            {"max_output_tokens",
             request_.params.max_tokens >= 0 ? Json(request_.params.max_tokens) : Json()},
            {"tool_choice", "auto"},
            {"tools", tools},
            {"store", false},
            {"text", {{"format", {{"type", "text"}}}}},
            {"usage", usage}};
  }

  Json final_response(const Job& job) const {
    const bool cut = finish_ == FinishReason::kLength || finish_ == FinishReason::kContext;
    Json r = response(cut ? "incomplete" : "completed", output_, usage(job), nullptr);
    if (cut) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    return r;
  }

  Json usage(const Job& job) const {
    const Generator::Usage u = job.usage(0);
    return {{"input_tokens", u.prompt},
            {"input_tokens_details", {{"cached_tokens", u.cached}}},
            {"output_tokens", u.generated},
            {"output_tokens_details", {{"reasoning_tokens", 0}}},
            {"total_tokens", u.prompt + u.generated}};
  }

  Json reasoning_item(const std::string& text, int index) const {
    return {{"type", "reasoning"},
            {"id", item_id("rs", index)},
            {"summary", Json::array({{{"type", "summary_text"}, {"text", text}}})}};
  }

  Json message_item(const std::string& text, int index) const {
    return {{"type", "message"},
            {"id", item_id("msg", index)},
            {"status", "completed"},
            {"role", "assistant"},
            {"content", Json::array({{{"type", "output_text"},
                                      {"text", text},
                                      {"annotations", Json::array()}}})}};
  }

  Json call_item(int index) const {
    return {{"type", "function_call"},
            {"id", item_id("fc", index)},
            {"call_id", call_.id},
            {"name", call_.name},
            {"arguments", call_.arguments},
            {"status", "completed"}};
  }

  // The output item open now: its kind, and where it is in the output.
  enum class Open { kNone, kReasoning, kMessage, kCall };

  // Opens an item of `kind` at the output's end (closing the one open), with its added event.
  std::string open_item(Open kind, Json item) {
    std::string out = close_open_item();
    open_ = kind;
    index_ = static_cast<int>(output_.size());
    output_.push_back(nullptr);  // (its place; the item when it closes)
    return out + event("response.output_item.added", {{"output_index", index_}, {"item", item}});
  }

  std::string reasoning_delta(const std::string& text) {
    std::string out;
    if (open_ != Open::kReasoning) {
      Json item = reasoning_item("", static_cast<int>(output_.size()));
      item["summary"] = Json::array();
      out += open_item(Open::kReasoning, item);
      out += event("response.reasoning_summary_part.added",
                   {{"item_id", item["id"]},
                    {"output_index", index_},
                    {"summary_index", 0},
                    {"part", {{"type", "summary_text"}, {"text", ""}}}});
    }
    text_ += text;
    return out + event("response.reasoning_summary_text.delta",
                       {{"item_id", item_id("rs", index_)},
                        {"output_index", index_},
                        {"summary_index", 0},
                        {"delta", text}});
  }

  std::string text_delta(const std::string& text) {
    std::string out;
    if (open_ != Open::kMessage) {
      message_seen_ = true;
      Json item = message_item("", static_cast<int>(output_.size()));
      item["status"] = "in_progress";
      item["content"] = Json::array();
      out += open_item(Open::kMessage, item);
      out += event("response.content_part.added",
                   {{"item_id", item["id"]},
                    {"output_index", index_},
                    {"content_index", 0},
                    {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()}}}});
    }
    text_ += text;
    if (text.empty()) return out;
    return out + event("response.output_text.delta", {{"item_id", item_id("msg", index_)},
                                                      {"output_index", index_},
                                                      {"content_index", 0},
                                                      {"delta", text}});
  }

  std::string open_call(const AnswerPiece& p) {
    call_ = {p.id, p.name, ""};
    ++calls_;
    Json item = call_item(static_cast<int>(output_.size()));
    item["status"] = "in_progress";
    return open_item(Open::kCall, item);
  }

  std::string arguments_delta(const std::string& text) {
    call_.arguments += text;
    return event("response.function_call_arguments.delta",
                 {{"item_id", item_id("fc", index_)}, {"output_index", index_}, {"delta", text}});
  }

  // The open item's done events; the item in its place in the output.
  std::string close_open_item() {
    const int index = index_;
    std::string out;
    // (one statement each: the events are numbered in the order they are made)
    switch (open_) {
      case Open::kNone:
        return "";
      case Open::kReasoning: {
        const Json item = reasoning_item(text_, index);
        output_[static_cast<size_t>(index)] = item;
        out = event("response.reasoning_summary_text.done", {{"item_id", item["id"]},
                                                             {"output_index", index},
                                                             {"summary_index", 0},
                                                             {"text", text_}});
        out += event("response.reasoning_summary_part.done", {{"item_id", item["id"]},
                                                              {"output_index", index},
                                                              {"summary_index", 0},
                                                              {"part", item["summary"][0]}});
        break;
      }
      case Open::kMessage: {
        const Json item = message_item(text_, index);
        output_[static_cast<size_t>(index)] = item;
        out = event("response.output_text.done", {{"item_id", item["id"]},
                                                  {"output_index", index},
                                                  {"content_index", 0},
                                                  {"text", text_}});
        out += event("response.content_part.done", {{"item_id", item["id"]},
                                                    {"output_index", index},
                                                    {"content_index", 0},
                                                    {"part", item["content"][0]}});
        break;
      }
      case Open::kCall: {
        output_[static_cast<size_t>(index)] = call_item(index);
        out = event("response.function_call_arguments.done", {{"item_id", item_id("fc", index)},
                                                              {"output_index", index},
                                                              {"arguments", call_.arguments}});
        break;
      }
    }
    open_ = Open::kNone;
    index_ = -1;
    text_.clear();
    const Json item = output_[static_cast<size_t>(index)];
    return out + event("response.output_item.done", {{"output_index", index}, {"item", item}});
  }

  const ApiRequest& request_;
  const ModelInfo& model_;
  uint64_t serial_;
  int64_t created_;
  int64_t sequence_ = 0;
  Json output_ = Json::array();
  Open open_ = Open::kNone;
  int index_ = -1;       // the open item's place in the output
  std::string text_;     // the open reasoning's or message's text so far
  ToolCall call_;        // the open call so far
  size_t calls_ = 0;
  bool message_seen_ = false;
};

}  // namespace

std::unique_ptr<ResponseWriter> make_responses_writer(const ApiRequest& request,
                                                      const ModelInfo& model, uint64_t serial,
                                                      int64_t created) {
  return std::make_unique<ResponsesWriter>(request, model, serial, created);
}

}  // namespace tandem::server
