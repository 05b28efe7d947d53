// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens): `system` and `messages`
// with text, tool_use and tool_result blocks become a conversation in chat's shape, rendered like
// a chat request; the answer becomes content blocks (thinking, text, tool_use), whole or as the
// API's stream (message_start, content_block_start / _delta / _stop, message_delta,
// message_stop).
#include <fmt/format.h>

#include "server/conversation.h"
#include "server/request_fields.h"

namespace tandem::server {
namespace {

// A block list's text blocks joined (a string as it is); other block types are refused.
std::string blocks_text(const Json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    bad_request(where, fmt::format("'{}' must be a string or an array of content blocks", where));
  }
  std::string text;
  for (const Json& b : content) {
    const std::string type = b.is_object() ? b.value("type", "") : "";
    if (type != "text" || !b.contains("text") || !b["text"].is_string()) {
      bad_request(where, fmt::format("'{}': a block of type '{}' is not supported here", where,
                                     type));
    }
    if (!text.empty()) text += "\n";
    text += b["text"].get<std::string>();
  }
  return text;
}

// One Anthropic message as chat messages: a user's tool_result blocks become tool messages (before
// its text), an assistant's tool_use blocks its tool calls.
void add_message(const Json& msg, size_t i, Json* out) {
  const std::string where = fmt::format("messages[{}]", i);
  if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string()) {
    bad_request(where, fmt::format("'{}' must be an object with a 'role'", where));
  }
  const std::string role = msg["role"].get<std::string>();
  if (role != "user" && role != "assistant") {
    bad_request(where + ".role", fmt::format("'{}.role' must be user or assistant", where));
  }
  const Json& content = msg.contains("content") ? msg["content"] : Json();
  if (content.is_string()) {
    out->push_back({{"role", role}, {"content", content}});
    return;
  }
  if (!content.is_array()) {
    bad_request(where + ".content", fmt::format("'{}.content' must be a string or blocks", where));
  }
  std::string text;
  Json calls = Json::array();
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& b = content[k];
    const std::string at = fmt::format("{}.content[{}]", where, k);
    const std::string type = b.is_object() ? b.value("type", "") : "";
    if (type == "text" && b.contains("text") && b["text"].is_string()) {
      if (!text.empty()) text += "\n";
      text += b["text"].get<std::string>();
    } else if (type == "tool_use" && role == "assistant" && b.contains("id") &&
               b["id"].is_string() && b.contains("name") && b["name"].is_string()) {
      calls.push_back({{"id", b["id"]},
                       {"type", "function"},
                       {"function",
                        {{"name", b["name"]},
                         {"arguments", b.contains("input") ? b["input"] : Json::object()}}}});
    } else if (type == "tool_result" && role == "user" && b.contains("tool_use_id") &&
               b["tool_use_id"].is_string()) {
      out->push_back({{"role", "tool"},
                      {"tool_call_id", b["tool_use_id"]},
                      {"content", b.contains("content") ? blocks_text(b["content"], at) : ""}});
    } else if (type == "thinking" || type == "redacted_thinking") {
      continue;  // (earlier reasoning: templates drop it from past turns)
    } else {
      bad_request(at, fmt::format("'{}': a block of type '{}' is not supported (text, tool_use, "
                                  "tool_result)",
                                  at, type));
    }
  }
  if (role == "assistant") {
    Json m = {{"role", "assistant"}, {"content", text.empty() ? Json() : Json(text)}};
    if (!calls.empty()) m["tool_calls"] = calls;
    out->push_back(std::move(m));
  } else if (!text.empty()) {
    out->push_back({{"role", "user"}, {"content", text}});
  }
}

Json conversation(const Json& body) {
  Json messages = Json::array();
  if (body.contains("system") && !body["system"].is_null()) {
    messages.push_back({{"role", "system"}, {"content", blocks_text(body["system"], "system")}});
  }
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
    bad_request("messages", "'messages' must be a non-empty array");
  }
  for (size_t i = 0; i < body["messages"].size(); ++i) add_message(body["messages"][i], i, &messages);
  return messages;
}

// Anthropic's tools ({"name", "description", "input_schema"}) in chat's shape, and tool_choice.
Json chat_tools(const Json& body) {
  Json tools = nullptr;
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) bad_request("tools", "'tools' must be an array");
    tools = Json::array();
    for (const Json& t : body["tools"]) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string() ||
          (t.contains("type") && t["type"] != "custom")) {
        bad_request("tools", "each tool must be {\"name\", \"input_schema\", ...} (server and "
                             "client tools of Anthropic's own types are not supported)");
      }
      Json f = {{"name", t["name"]},
                {"parameters", t.contains("input_schema") ? t["input_schema"] : Json::object()}};
      if (t.contains("description")) f["description"] = t["description"];
      tools.push_back({{"type", "function"}, {"function", f}});
    }
    if (tools.empty()) tools = nullptr;
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& tc = body["tool_choice"];
    const std::string type = tc.is_object() ? tc.value("type", "") : "";
    if (type == "auto" || type == "none") {
      tools = chosen_tools(tools, type);
    } else if (type == "any") {
      tools = chosen_tools(tools, "required");
    } else if (type == "tool" && tc.contains("name") && tc["name"].is_string()) {
      tools = chosen_tools(tools, tc["name"].get<std::string>());
    } else {
      bad_request("tool_choice", "'tool_choice' must be {\"type\": auto | any | none | tool}");
    }
  }
  return tools;
}

ApiRequest parse(const Json& body, const ModelInfo& m, bool needs_max_tokens) {
  check_object(body);
  check_model(body, m);
  ApiRequest r;
  r.api = Api::kMessages;
  SamplingParams& s = r.params.sampling;
  s = m.defaults;
  number(body, "temperature", 0, 1, &s.temperature);
  number(body, "top_p", 0, 1, &s.top_p);
  integer(body, "top_k", 0, m.vocab_size, &s.top_k);
  if (needs_max_tokens && (!body.contains("max_tokens") || body["max_tokens"].is_null())) {
    bad_request("max_tokens", "'max_tokens' is required");
  }
  integer(body, "max_tokens", 1, m.context, &r.params.max_tokens);
  boolean(body, "stream", &r.stream);
  if (body.contains("stop_sequences") && !body["stop_sequences"].is_null()) {
    const Json& st = body["stop_sequences"];
    if (!st.is_array() || st.size() > 16) {
      bad_request("stop_sequences", "'stop_sequences' must be an array of at most 16 strings");
    }
    for (const Json& x : st) {
      if (!x.is_string() || x.get<std::string>().empty()) {
        bad_request("stop_sequences", "each stop sequence must be a non-empty string");
      }
      r.params.stop.push_back(x.get<std::string>());
    }
  }
  Json extra = Json::object();
  if (body.contains("thinking") && body["thinking"].is_object()) {
    const std::string type = body["thinking"].value("type", "");
    if (type != "enabled" && type != "disabled") {
      bad_request("thinking", "'thinking.type' must be enabled or disabled");
    }
    extra["enable_thinking"] = type == "enabled";  // (Qwen3's and others' templates read it)
  }
  try {
    check_sampling_params(s, m.vocab_size);
  } catch (const Error& e) {
    bad_request("", e.what());
  }
  render_conversation(conversation(body), chat_tools(body), extra, m, &r);
  return r;
}

class MessagesWriter : public AnswerWriter {
 public:
  MessagesWriter(const ApiRequest& request, const ModelInfo& model, uint64_t serial)
      : AnswerWriter(request), request_(request), model_(model), serial_(serial) {}

  std::string stream_start() override {
    Json m = message(Json::array(), nullptr, nullptr);
    m["usage"] = {{"input_tokens", request_.prompt.size()}, {"output_tokens", 0}};
    return event("message_start", {{"message", m}});
  }

  std::string stream_event(const Job::Event& e) override {
    const AnswerParts::Step s = parts_.push(e.ev);
    std::string out;
    for (const AnswerPiece& p : s.pieces) {
      switch (p.kind) {
        case AnswerPiece::Kind::kReasoning:
          out += open_block("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
          out += delta("thinking", {{"type", "thinking_delta"}, {"thinking", p.text}});
          break;
        case AnswerPiece::Kind::kContent:
          out += open_block("text", {{"type", "text"}, {"text", ""}});
          out += delta("text", {{"type", "text_delta"}, {"text", p.text}});
          break;
        case AnswerPiece::Kind::kCall:
          tool_use_ = true;
          out += open_block("tool_use", {{"type", "tool_use"},
                                         {"id", p.id},
                                         {"name", p.name},
                                         {"input", Json::object()}});
          break;
        case AnswerPiece::Kind::kArguments:
          out += delta("partial_json", {{"type", "input_json_delta"}, {"partial_json", p.text}});
          break;
      }
    }
    if (!s.last) return out;
    if (s.finish == FinishReason::kError) {
      if (error_.empty()) error_ = s.error;
      return out;
    }
    if (blocks_ == 0) out += open_block("text", {{"type", "text"}, {"text", ""}});
    out += close_block();
    finish_ = s.finish;
    stop_ = s.stop;
    return out;
  }

  std::string stream_end(const Job& job) override {
    if (!error_.empty()) {
      return event("error", {{"error", {{"type", "api_error"}, {"message", error_}}}});
    }
    std::string out =
        event("message_delta",
              {{"delta", {{"stop_reason", stop_reason()}, {"stop_sequence", stop_sequence()}}},
               {"usage", {{"output_tokens", job.usage(0).generated}}}});
    return out + event("message_stop", Json::object());
  }

  Json body(const Job& job) override {
    const Generator::Usage u = job.usage(0);
    Json m = message(content_, stop_reason(), stop_sequence());
    m["usage"] = {{"input_tokens", u.prompt},
                  {"output_tokens", u.generated},
                  {"cache_read_input_tokens", u.cached}};
    return m;
  }

 private:
  std::string event(const char* type, Json data) {
    data["type"] = type;
    return fmt::format("event: {}\ndata: {}\n\n", type, dump_json(data));
  }

  Json message(Json content, const Json& stop_reason, const Json& stop_sequence) const {
    return {{"id", fmt::format("msg_{}", serial_)},
            {"type", "message"},
            {"role", "assistant"},
            {"model", model_.name},
            {"content", std::move(content)},
            {"stop_reason", stop_reason},
            {"stop_sequence", stop_sequence}};
  }

  // (an answer cut short is that, even inside a tool call)
  Json stop_reason() const {
    switch (finish_) {
      case FinishReason::kLength:
      case FinishReason::kContext:
        return "max_tokens";
      default:
        if (tool_use_) return "tool_use";
        return stop_.empty() ? "end_turn" : "stop_sequence";
    }
  }
  Json stop_sequence() const { return stop_.empty() || tool_use_ ? Json() : Json(stop_); }

  // Opens a block of `kind` unless one is open (closing the open one of another kind).
  std::string open_block(const std::string& kind, const Json& block) {
    if (open_ == kind && kind != "tool_use") return "";
    std::string out = close_block();
    open_ = kind;
    content_.push_back(block);
    out += event("content_block_start", {{"index", blocks_}, {"content_block", block}});
    ++blocks_;
    return out;
  }
  // The open block's end; a tool_use block's input is the JSON its deltas spelled (an object
  // as the parsers write them; anything else, as a call cut short, is no input).
  std::string close_block() {
    if (open_.empty()) return "";
    if (open_ == "tool_use") {
      Json input = Json::parse(partial_json_, nullptr, false);
      content_.back()["input"] = input.is_object() ? std::move(input) : Json::object();
      partial_json_.clear();
    }
    open_.clear();
    return event("content_block_stop", {{"index", blocks_ - 1}});
  }
  // More of the open block's `field`.
  std::string delta(const char* field, const Json& d) {
    const std::string& more = d[field].get_ref<const std::string&>();
    if (open_ == "tool_use") {
      partial_json_ += more;
    } else {
      Json& b = content_.back()[field];
      b = b.get<std::string>() + more;
    }
    return event("content_block_delta", {{"index", blocks_ - 1}, {"delta", d}});
  }

  const ApiRequest& request_;
  const ModelInfo& model_;
  uint64_t serial_;
  std::string stop_;
  bool tool_use_ = false;
  std::string open_;  // the kind of the open block ("" none)
  int blocks_ = 0;
  Json content_ = Json::array();  // the blocks so far
  std::string partial_json_;      // the open tool_use block's input so far
};

}  // namespace

ApiRequest parse_messages_request(const Json& body, const ModelInfo& m) {
  return parse(body, m, /*needs_max_tokens=*/true);
}

ApiRequest parse_count_tokens_request(const Json& body, const ModelInfo& m) {
  return parse(body, m, /*needs_max_tokens=*/false);
}

std::unique_ptr<ResponseWriter> make_messages_writer(const ApiRequest& request,
                                                     const ModelInfo& model, uint64_t serial,
                                                     int64_t) {
  return std::make_unique<MessagesWriter>(request, model, serial);
}

}  // namespace tandem::server
