// OpenAI requests checked and turned into a prompt and GenerateParams; the error shape.
#include "server/openai.h"
#include "server/conversation.h"
#include "server/request_fields.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <unordered_set>

#include "engine/chat.h"

namespace tandem::server {

void bad_request(const std::string& param, const std::string& message) {
  throw ApiError(400, "invalid_request_error", message, param);
}

ApiError api_error(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::kInvalidArgument:
    case ErrorKind::kOutOfRange:
    case ErrorKind::kFormat:
    case ErrorKind::kUnsupported:
      return ApiError(400, "invalid_request_error", e.what());
    case ErrorKind::kBusy:
      return ApiError(429, "rate_limit_error", e.what());
    case ErrorKind::kResource:
      return ApiError(503, "server_error", e.what());
    default:
      return ApiError(500, "server_error", e.what());
  }
}

std::string dump_json(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string error_body(const ApiError& e) {
  Json err = {{"message", e.what()},
              {"type", e.type},
              {"param", e.param.empty() ? Json() : Json(e.param)},
              {"code", e.status}};
  return dump_json(Json({{"error", err}}));
}

std::string error_body(const ApiError& e, Api api) {
  if (api != Api::kMessages) return error_body(e);
  // Anthropic's error types by status.
  const char* type = e.status == 401   ? "authentication_error"
                     : e.status == 403 ? "permission_error"
                     : e.status == 404 ? "not_found_error"
                     : e.status == 413 ? "request_too_large"
                     : e.status == 429 ? "rate_limit_error"
                     : e.status == 503 ? "overloaded_error"
                     : e.status >= 500 ? "api_error"
                                       : "invalid_request_error";
  return dump_json(Json({{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}}));
}

Api api_of_path(const std::string& path) {
  const auto under = [&](const char* p) { return path.rfind(p, 0) == 0; };
  if (under("/v1/messages") || under("/messages")) return Api::kMessages;
  if (under("/v1/responses") || under("/responses")) return Api::kResponses;
  if (under("/v1/completions") || under("/completions")) return Api::kCompletions;
  return Api::kChat;
}

namespace {

// What both endpoints share: sampling, lengths, stops, n, streaming.
void parse_common(const Json& body, const ModelInfo& m, ApiRequest* r) {
  check_model(body, m);
  SamplingParams& s = r->params.sampling;
  s = m.defaults;
  number(body, "temperature", 0, 2, &s.temperature);
  number(body, "top_p", 0, 1, &s.top_p);
  number(body, "min_p", 0, 1, &s.min_p);
  integer(body, "top_k", 0, m.vocab_size, &s.top_k);
  number(body, "presence_penalty", -2, 2, &s.presence_penalty);
  number(body, "frequency_penalty", -2, 2, &s.frequency_penalty);
  number(body, "repeat_penalty", 1e-6, 1e6, &s.repeat_penalty);
  integer(body, "repeat_last_n", -1, std::numeric_limits<int32_t>::max(), &s.penalty_last_n);
  if (body.contains("seed") && !body["seed"].is_null()) {
    if (!body["seed"].is_number_integer()) {
      bad_request("seed",
                  fmt::format("'seed' must be an integer, not {}", dump_json(body["seed"])));
    }
    s.seed = body["seed"].is_number_unsigned() ? body["seed"].get<uint64_t>()
                                               : static_cast<uint64_t>(body["seed"].get<int64_t>());
  }
  if (body.contains("logit_bias") && !body["logit_bias"].is_null()) {
    const Json& lb = body["logit_bias"];
    if (!lb.is_object()) {
      bad_request("logit_bias", "'logit_bias' must be an object of token id -> bias");
    }
    for (const auto& [key, v] : lb.items()) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != key.size() || id < 0 || id >= m.vocab_size) {
        bad_request("logit_bias", fmt::format("logit_bias: '{}' is not a token id in [0, {})", key,
                                              m.vocab_size));
      }
      if (!v.is_number() || !std::isfinite(v.get<double>()) || std::fabs(v.get<double>()) > 100) {
        bad_request("logit_bias", fmt::format("logit_bias: the bias of token {} must be a number "
                                              "in [-100, 100], got {}",
                                              key, v.dump()));
      }
      // OpenAI: -100 bans the token.
      const float bias = v.get<double>() <= -100 ? -INFINITY : v.get<float>();
      s.logit_bias.push_back({static_cast<int32_t>(id), bias});
    }
    std::unordered_set<int32_t> banned;
    for (const auto& [id, bias] : s.logit_bias) {
      if (std::isinf(bias)) banned.insert(id);
    }
    if (static_cast<int64_t>(banned.size()) >= m.vocab_size) {
      bad_request("logit_bias", "logit_bias bans every token of the vocabulary");
    }
  }
  int64_t max_tokens = -1;
  integer(body, "max_tokens", 0, m.context, &max_tokens);
  integer(body, "max_completion_tokens", 0, m.context, &max_tokens);
  r->params.max_tokens = max_tokens;
  boolean(body, "ignore_eos", &r->params.ignore_eos);
  integer(body, "n", 1, m.max_n, &r->n);
  if (body.contains("stop") && !body["stop"].is_null()) {
    const Json& st = body["stop"];
    if (st.is_string()) {
      r->params.stop.push_back(st.get<std::string>());
    } else if (st.is_array() && st.size() <= 16) {
      for (const Json& x : st) {
        if (!x.is_string()) bad_request("stop", "'stop' must be a string or an array of strings");
        r->params.stop.push_back(x.get<std::string>());
      }
    } else {
      bad_request("stop", "'stop' must be a string or an array of at most 16 strings");
    }
    for (const std::string& x : r->params.stop) {
      if (x.empty()) bad_request("stop", "a stop string is empty");
    }
  }
  boolean(body, "stream", &r->stream);
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const Json& so = body["stream_options"];
    if (!so.is_object()) bad_request("stream_options", "'stream_options' must be an object");
    boolean(so, "include_usage", &r->include_usage);
  }
  try {
    check_sampling_params(s, m.vocab_size);
  } catch (const Error& e) {
    bad_request("", e.what());
  }
}

// A message's content as the templates take it: a string (text parts joined), or null.
Json message_content(const Json& content, size_t i) {
  if (content.is_null() || content.is_string()) return content;
  const std::string field = fmt::format("messages[{}].content", i);
  if (!content.is_array())
    bad_request(field, fmt::format("'{}' must be a string or an array of "
                                   "content parts",
                                   field));
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      bad_request(field, fmt::format("'{}': each part must be an object with a 'type'", field));
    }
    const std::string type = part["type"].get<std::string>();
    if (type != "text" || !part.contains("text") || !part["text"].is_string()) {
      bad_request(field, fmt::format("'{}': a part of type '{}' is not supported (text only)",
                                     field, type));
    }
    if (!text.empty()) text += "\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

// The messages as the template takes them: checked roles, text content, tool call arguments as
// objects (OpenAI sends them as JSON text; Hugging Face templates iterate them).
Json template_messages(const Json& messages) {
  if (!messages.is_array() || messages.empty()) {
    bad_request("messages", "'messages' must be a non-empty array");
  }
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& msg = messages[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string()) {
      bad_request(where, fmt::format("'{}' must be an object with a string 'role'", where));
    }
    const std::string role = msg["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
        role != "developer") {
      bad_request(where + ".role", fmt::format("'{}.role': unknown role '{}' (system, developer, "
                                               "user, assistant, tool)",
                                               where, role));
    }
    Json m = msg;
    if (role == "developer") m["role"] = "system";
    m["content"] = message_content(msg.contains("content") ? msg["content"] : Json(), i);
    // An assistant's tool calls come with "content": null from OpenAI clients; templates that
    // take the content as a string (Qwen3's, gpt-oss's) fail on null, and those that test it
    // read null and "" alike.
    if (m["content"].is_null() && msg.contains("tool_calls")) m["content"] = "";
    if (msg.contains("tool_calls") && !msg["tool_calls"].is_null()) {
      if (!msg["tool_calls"].is_array()) {
        bad_request(where + ".tool_calls", "'tool_calls' must be an array");
      }
      for (Json& call : m["tool_calls"]) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
            !call["function"].contains("name") || !call["function"]["name"].is_string()) {
          bad_request(where + ".tool_calls",
                      "each tool call needs a 'function' with a string 'name'");
        }
        Json& args = call["function"]["arguments"];
        if (args.is_string()) {
          Json parsed = Json::parse(args.get<std::string>(), nullptr, false);
          if (parsed.is_object()) args = parsed;
        }
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

ApiRequest parse_completion_request(const Json& body, const ModelInfo& m) {
  check_object(body);
  ApiRequest r;
  r.api = Api::kCompletions;
  parse_common(body, m, &r);
  if (!body.contains("prompt")) bad_request("prompt", "'prompt' is required");
  const Json& p = body["prompt"];
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
    r.prompt = m.tokenizer->encode(r.prompt_text, /*add_special=*/true);
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    r.prompt = token_ids(p, m, "prompt");
    r.prompt_text = m.tokenizer->decode(r.prompt);
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    r.prompt_text = p[0].get<std::string>();
    r.prompt = m.tokenizer->encode(r.prompt_text, /*add_special=*/true);
  } else {
    bad_request("prompt",
                "'prompt' must be a string, one string in an array, or an array of "
                "token ids (one prompt per request)");
  }
  if (r.prompt.empty()) bad_request("prompt", "the prompt is empty");
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    int lp = 0;
    integer(body, "logprobs", 0, 20, &lp);
    r.logprobs = true;
    r.params.top_logprobs = lp;
  }
  boolean(body, "echo", &r.echo);
  if (body.contains("suffix") && !body["suffix"].is_null()) {
    bad_request("suffix", "'suffix' (fill in the middle) is not supported");
  }
  if (body.contains("best_of") && !body["best_of"].is_null() &&
      !(body["best_of"].is_number_integer() && body["best_of"].get<int64_t>() == r.n)) {
    bad_request("best_of", "'best_of' other than n is not supported");
  }
  r.params.continues_prompt = true;
  return r;
}

Json chosen_tools(Json tools, const std::string& choice) {
  if (choice == "none") return nullptr;
  if (choice == "auto" || choice == "required" || choice.empty()) return tools;
  // One named tool: only it is offered.
  Json only = Json::array();
  for (const Json& t : tools.is_array() ? tools : Json::array()) {
    if (t["function"]["name"] == choice) only.push_back(t);
  }
  if (only.empty()) bad_request("tool_choice", "'tool_choice' names a tool not in 'tools'");
  return only;
}

void render_conversation(const Json& messages, const Json& tools, const Json& extra,
                         const ModelInfo& m, ApiRequest* r) {
  if (m.chat_template == nullptr) {
    bad_request("messages", "the model has no chat template; use /v1/completions");
  }
  const Json checked = template_messages(messages);
  ChatPrompt p;
  try {
    p = render_chat_prompt(*m.chat_template, *m.tokenizer, checked, true, tools, extra);
  } catch (const Error& e) {
    bad_request("messages", fmt::format("the chat template: {}", e.what()));
  }
  r->chat = true;
  r->prompt = std::move(p.ids);
  r->in_think = prompt_opens_think(p.text);
  r->prompt_text = std::move(p.text);
  r->tools = tools;
  // Harmony (gpt-oss) shapes every answer (its reasoning is a channel); the other syntaxes are
  // parsed when the request has tools.
  r->tool_syntax = tools.is_null() && m.tool_syntax != ToolCallSyntax::kHarmony
                       ? ToolCallSyntax::kNone
                       : m.tool_syntax;
  r->params.continues_prompt = false;
  // A tool call's markers (harmony's channels) may be control tokens: written out so that they
  // parse.
  r->params.special_text = r->tool_syntax != ToolCallSyntax::kNone;
  if (r->prompt.empty()) bad_request("messages", "the rendered prompt is empty");
}

ApiRequest parse_chat_request(const Json& body, const ModelInfo& m) {
  check_object(body);
  ApiRequest r;
  r.api = Api::kChat;
  parse_common(body, m, &r);
  if (!body.contains("messages")) bad_request("messages", "'messages' is required");
  Json tools = nullptr;
  if (body.contains("tools") && !body["tools"].is_null()) {
    if (!body["tools"].is_array()) bad_request("tools", "'tools' must be an array");
    for (const Json& t : body["tools"]) {
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object() ||
          !t["function"].contains("name") || !t["function"]["name"].is_string()) {
        bad_request("tools",
                    "each tool must be {\"type\": \"function\", \"function\": "
                    "{\"name\": ...}}");
      }
    }
    if (!body["tools"].empty()) tools = body["tools"];
  }
  if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
    const Json& tc = body["tool_choice"];
    if (tc.is_string() && (tc == "none" || tc == "auto" || tc == "required")) {
      tools = chosen_tools(tools, tc.get<std::string>());
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
               tc["function"].contains("name") && tc["function"]["name"].is_string()) {
      tools = chosen_tools(tools, tc["function"]["name"].get<std::string>());
    } else {
      bad_request("tool_choice", "'tool_choice' must be none, auto, required or an object");
    }
  }
  Json extra = Json::object();
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    if (!body["chat_template_kwargs"].is_object()) {
      bad_request("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    }
    extra = body["chat_template_kwargs"];
  }
  bool logprobs = false;
  boolean(body, "logprobs", &logprobs);
  int top = 0;
  integer(body, "top_logprobs", 0, 20, &top);
  if (!logprobs && body.contains("top_logprobs") && !body["top_logprobs"].is_null()) {
    bad_request("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  }
  r.logprobs = logprobs;
  r.params.top_logprobs = top;
  render_conversation(body["messages"], tools, extra, m, &r);
  return r;
}


AnswerParts::AnswerParts(const ApiRequest& request)
    : parser_(request.tool_syntax, request.in_think, request.tools) {}

AnswerParts::Step AnswerParts::push(const GenerateEvent& ev) {
  Step s;
  s.pieces = parser_.push(ev.text);
  if (ev.finish == FinishReason::kNone) return s;
  const AnswerDelta rest = parser_.finish();
  s.pieces.insert(s.pieces.end(), rest.begin(), rest.end());
  s.last = true;
  s.finish = ev.finish;
  s.stop = ev.stop;
  s.error = ev.error;
  return s;
}

}  // namespace tandem::server
