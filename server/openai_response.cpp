// OpenAI responses: the events of a request's completions as one JSON body, or as the
// Server-Sent Events chunks OpenAI streams.
#include <fmt/format.h>

#include "server/conversation.h"
#include "server/openai.h"

namespace tandem::server {
namespace {

std::string piece(const Tokenizer& tok, int32_t id) {
  return tok.token_to_piece(id, true);
}

Json bytes_of(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Chat and text completions (OpenAI): one JSON body, or SSE "data:" chunks then "[DONE]".
class ChatCompletionWriter : public ResponseWriter {
 public:
  ChatCompletionWriter(const ApiRequest& request, const ModelInfo& model, std::string id,
                       int64_t created);
  ~ChatCompletionWriter() override;
  std::string stream_start() override;
  std::string stream_event(const Job::Event& e) override;
  std::string stream_end(const Job& job) override;
  void add(const Job::Event& e) override;
  Json body(const Job& job) override;

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
};

struct ChatCompletionWriter::Choice {
  std::unique_ptr<ChatStreamParser> parser;
  std::string text;  // completions (and chat before parsing, when not streaming)
  Json logprobs = Json::array();
  FinishReason finish = FinishReason::kNone;
  bool tool_calls = false;
  // completions' logprobs, OpenAI's legacy shape
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
       offsets = Json::array();
  size_t offset = 0;
};

ChatCompletionWriter::ChatCompletionWriter(const ApiRequest& request, const ModelInfo& model, std::string id,
                                 int64_t created)
    : request_(request), model_(model), id_(std::move(id)), created_(created) {
  for (int i = 0; i < request_.n; ++i) {
    auto c = std::make_unique<Choice>();
    if (request_.chat) {
      c->parser = std::make_unique<ChatStreamParser>(request_.tool_syntax, request_.in_think,
                                                     request_.tools);
    }
    if (request_.echo) {
      c->text = request_.prompt_text;
      c->offset = request_.prompt_text.size();
    }
    choices_.push_back(std::move(c));
  }
}

ChatCompletionWriter::~ChatCompletionWriter() = default;

Json ChatCompletionWriter::chunk(int index, Json delta_or_text, const Json& finish,
                            const Json& logprobs) const {
  Json choice = {{"index", index}};
  if (request_.chat) {
    choice["delta"] = std::move(delta_or_text);
  } else {
    choice["text"] = std::move(delta_or_text);
  }
  choice["logprobs"] = logprobs;
  choice["finish_reason"] = finish;
  return Json({{"id", id_},
               {"object", request_.chat ? "chat.completion.chunk" : "text_completion"},
               {"created", created_},
               {"model", model_.name},
               {"choices", Json::array({choice})}});
}

Json ChatCompletionWriter::logprobs_of(const GenerateEvent& ev) const {
  const Tokenizer& tok = *model_.tokenizer;
  const std::string t = piece(tok, ev.token);
  Json top = Json::array();
  for (const TokenLogprob& x : ev.top_logprobs) {
    const std::string p = piece(tok, x.token);
    top.push_back({{"token", p}, {"logprob", x.logprob}, {"bytes", bytes_of(p)}});
  }
  return {{"token", t}, {"logprob", ev.logprob}, {"bytes", bytes_of(t)}, {"top_logprobs", top}};
}

// (an answer cut short is that, even inside a tool call)
const char* ChatCompletionWriter::finish_name(const Choice& c, FinishReason reason) const {
  switch (reason) {
    case FinishReason::kLength:
    case FinishReason::kContext:
      return "length";
    default:
      return c.tool_calls ? "tool_calls" : "stop";
  }
}

Json ChatCompletionWriter::usage(const Job& job) const {
  int64_t completion = 0, prompt = 0, cached = 0;
  for (int i = 0; i < job.n(); ++i) {
    const Generator::Usage u = job.usage(i);
    completion += u.generated;
    if (i == 0) {
      prompt = u.prompt;
      cached = u.cached;
    }
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

std::string ChatCompletionWriter::stream_start() {
  std::string out;
  for (int i = 0; i < request_.n; ++i) {
    if (request_.chat) {
      out += "data: " +
             dump_json(chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)) +
             "\n\n";
    } else if (request_.echo) {
      out += "data: " + dump_json(chunk(i, request_.prompt_text, nullptr, nullptr)) + "\n\n";
    }
  }
  return out;
}

namespace {

// Streamed pieces as a chat.completion.chunk's delta: the reasoning, the content, and the tool
// calls as OpenAI streams them (a call's first entry with its index, id and name, then entries
// with its index and more of its arguments).
Json chat_delta(const AnswerDelta& pieces) {
  Json delta = Json::object();
  std::string reasoning, content;
  Json calls = Json::array();
  for (const AnswerPiece& p : pieces) {
    switch (p.kind) {
      case AnswerPiece::Kind::kReasoning:
        reasoning += p.text;
        break;
      case AnswerPiece::Kind::kContent:
        content += p.text;
        break;
      case AnswerPiece::Kind::kCall:
        calls.push_back({{"index", p.call},
                         {"id", p.id},
                         {"type", "function"},
                         {"function", {{"name", p.name}, {"arguments", ""}}}});
        break;
      case AnswerPiece::Kind::kArguments:
        if (calls.empty() || calls.back()["index"] != p.call) {
          calls.push_back({{"index", p.call}, {"function", {{"arguments", ""}}}});
        }
        Json& args = calls.back()["function"]["arguments"];
        args = args.get<std::string>() + p.text;
        break;
    }
  }
  if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
  if (!content.empty()) delta["content"] = content;
  if (!calls.empty()) delta["tool_calls"] = calls;
  return delta;
}

}  // namespace

std::string ChatCompletionWriter::stream_event(const Job::Event& e) {
  Choice& c = *choices_.at(static_cast<size_t>(e.index));
  const GenerateEvent& ev = e.ev;
  std::string out;
  if (ev.finish == FinishReason::kError) {
    if (error_.empty()) error_ = ev.error;
    return "data: " + error_body(ApiError(500, "server_error", ev.error)) + "\n\n";
  }
  if (ev.finish == FinishReason::kCancelled) return out;
  Json lp = nullptr;
  if (request_.logprobs && ev.token >= 0) {
    if (request_.chat) {
      lp = {{"content", Json::array({logprobs_of(ev)})}};
    } else {
      const Json one = logprobs_of(ev);
      Json top = Json::object();
      for (const Json& t : one["top_logprobs"]) top[t["token"].get<std::string>()] = t["logprob"];
      lp = {{"tokens", {one["token"]}},
            {"token_logprobs", {one["logprob"]}},
            {"top_logprobs", {top}},
            {"text_offset", {c.offset}}};
    }
  }
  const bool last = ev.finish != FinishReason::kNone;
  if (request_.chat) {
    AnswerDelta pieces = c.parser->push(ev.text);
    if (last) {
      const AnswerDelta rest = c.parser->finish();
      pieces.insert(pieces.end(), rest.begin(), rest.end());
    }
    Json delta = chat_delta(pieces);
    if (delta.contains("tool_calls")) c.tool_calls = true;
    if (!delta.empty() || !lp.is_null()) {
      out += "data: " + dump_json(chunk(e.index, delta, nullptr, lp)) + "\n\n";
    }
    if (last) {
      out +=
          "data: " + dump_json(chunk(e.index, Json::object(), finish_name(c, ev.finish), nullptr)) +
          "\n\n";
    }
  } else {
    c.offset += ev.text.size();
    if (!ev.text.empty() || !lp.is_null() || last) {
      out +=
          "data: " +
          dump_json(chunk(e.index, ev.text, last ? Json(finish_name(c, ev.finish)) : Json(), lp)) +
          "\n\n";
    }
  }
  return out;
}

std::string ChatCompletionWriter::stream_end(const Job& job) {
  std::string out;
  if (request_.include_usage && error_.empty()) {
    Json u = {{"id", id_},
              {"object", request_.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", model_.name},
              {"choices", Json::array()},
              {"usage", usage(job)}};
    out += "data: " + dump_json(u) + "\n\n";
  }
  out += "data: [DONE]\n\n";
  return out;
}

void ChatCompletionWriter::add(const Job::Event& e) {
  Choice& c = *choices_.at(static_cast<size_t>(e.index));
  const GenerateEvent& ev = e.ev;
  if (ev.finish == FinishReason::kError && error_.empty()) error_ = ev.error;
  c.text += ev.text;
  if (ev.finish != FinishReason::kNone) c.finish = ev.finish;
  if (!request_.logprobs || ev.token < 0) return;
  const Json one = logprobs_of(ev);
  if (request_.chat) {
    c.logprobs.push_back(one);
  } else {
    Json top = Json::object();
    for (const Json& t : one["top_logprobs"]) top[t["token"].get<std::string>()] = t["logprob"];
    c.tokens.push_back(one["token"]);
    c.token_logprobs.push_back(one["logprob"]);
    c.top.push_back(top);
    c.offsets.push_back(c.offset);
    c.offset += one["token"].get<std::string>().size();
  }
}

Json ChatCompletionWriter::body(const Job& job) {
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = *choices_[i];
    Json choice = {{"index", i}};
    if (request_.chat) {
      const ChatOutput out =
          parse_chat_output(c.text, request_.tool_syntax, request_.in_think, request_.tools);
      Json message = {{"role", "assistant"}};
      message["content"] =
          out.content.empty() && !out.tool_calls.empty() ? Json() : Json(out.content);
      if (!out.reasoning.empty()) message["reasoning_content"] = out.reasoning;
      if (!out.tool_calls.empty()) {
        c.tool_calls = true;
        Json calls = Json::array();
        for (const ToolCall& t : out.tool_calls) {
          calls.push_back({{"id", t.id},
                           {"type", "function"},
                           {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
        }
        message["tool_calls"] = calls;
      }
      choice["message"] = message;
      choice["logprobs"] = request_.logprobs ? Json({{"content", c.logprobs}}) : Json();
    } else {
      choice["text"] = c.text;
      choice["logprobs"] = request_.logprobs ? Json({{"tokens", c.tokens},
                                                     {"token_logprobs", c.token_logprobs},
                                                     {"top_logprobs", c.top},
                                                     {"text_offset", c.offsets}})
                                             : Json();
    }
    choice["finish_reason"] = finish_name(c, c.finish);
    choices.push_back(std::move(choice));
  }
  return {{"id", id_},           {"object", request_.chat ? "chat.completion" : "text_completion"},
          {"created", created_}, {"model", model_.name},
          {"choices", choices},  {"usage", usage(job)}};
}

}  // namespace

std::unique_ptr<ResponseWriter> make_response_writer(const ApiRequest& request,
                                                     const ModelInfo& model, uint64_t serial,
                                                     int64_t created) {
  switch (request.api) {
    case Api::kResponses:
      return make_responses_writer(request, model, serial, created);
    case Api::kMessages:
      return make_messages_writer(request, model, serial, created);
    default:
      return std::make_unique<ChatCompletionWriter>(
          request, model,
          fmt::format("{}-{}", request.api == Api::kChat ? "chatcmpl" : "cmpl", serial),
          created);
  }
}

}  // namespace tandem::server
