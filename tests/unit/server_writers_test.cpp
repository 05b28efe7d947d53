// The Responses and Messages writers on an answer with reasoning, text and a tool call (the
// demo model does not write tool calls, so the server tests cannot make one): streamed in pieces,
// the events assemble -- as the SDKs assemble them -- into the whole response; the parts are
// where each API puts them; the stream is well-formed (typed events in order, indices that
// match).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "server/openai.h"
#include "tests/test_util.h"

namespace tandem::server {
namespace {

const char* kAnswer =
    "<think>\nThe user wants Paris.\n</think>\n\nLet me check.\n<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
// Text after the call, and a second call cut short by max_tokens.
const char* kAnswerWithMore =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
    "</tool_call>\nOne more.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
    "{\"city\": \"Ly";

struct Fixture {
  Tokenizer tokenizer;
  ChatTemplate tmpl;
  ModelInfo model;
  Fixture()
      : tokenizer(Tokenizer::from_gguf_file(test::data_path("demo/tandem-demo-moe-Q4_K_M.gguf"))),
        tmpl(read(test::data_path("templates/Qwen-Qwen3-0.6B.jinja")), "qwen3") {
    model.name = "m";
    model.vocab_size = static_cast<int64_t>(tokenizer.vocab_size());
    model.context = 2048;
    model.tokenizer = &tokenizer;
    model.chat_template = &tmpl;
    model.tool_syntax = tool_call_syntax(tmpl.source());
  }
  static std::string read(const std::filesystem::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
};

// The answer's events, `piece` bytes each, the last one ending it.
std::vector<Job::Event> events(size_t piece, const std::string& a = kAnswer,
                               FinishReason finish = FinishReason::kStop) {
  std::vector<Job::Event> out;
  for (size_t i = 0; i < a.size(); i += piece) {
    Job::Event e;
    e.index = 0;
    e.ev.text = a.substr(i, piece);
    e.ev.token = 1;
    out.push_back(e);
  }
  out.back().ev.finish = finish;
  return out;
}

// SSE text into (event name, data) pairs.
std::vector<std::pair<std::string, Json>> parse_sse(const std::string& text) {
  std::vector<std::pair<std::string, Json>> out;
  std::istringstream in(text);
  std::string line, name;
  while (std::getline(in, line)) {
    if (line.rfind("event: ", 0) == 0) name = line.substr(7);
    if (line.rfind("data: ", 0) == 0 && line != "data: [DONE]") {
      out.push_back({name, Json::parse(line.substr(6))});
    }
  }
  return out;
}

// A writer's stream of an answer: what it wrote at the start, for each event, and at the end.
struct Stream {
  std::vector<std::string> parts;
  std::string all() const {
    std::string s;
    for (const std::string& p : parts) s += p;
    return s;
  }
  // Events (not the start or end) whose text holds `what`.
  int events_with(const std::string& what) const {
    int n = 0;
    for (size_t i = 1; i + 1 < parts.size(); ++i) n += parts[i].find(what) != std::string::npos;
    return n;
  }
};

Stream stream(const ApiRequest& r, const ModelInfo& model, const std::vector<Job::Event>& evs) {
  Job job(1);
  auto w = make_response_writer(r, model, 7, 0);
  Stream s;
  s.parts.push_back(w->stream_start());
  for (const Job::Event& e : evs) s.parts.push_back(w->stream_event(e));
  s.parts.push_back(w->stream_end(job));
  return s;
}

Json whole(const ApiRequest& r, const ModelInfo& model, const std::vector<Job::Event>& evs) {
  Job job(1);
  auto w = make_response_writer(r, model, 7, 0);
  for (const Job::Event& e : evs) w->add(e);
  return w->body(job);
}

// A Messages stream assembled as Anthropic's SDK does: blocks opened, deltas appended, a
// tool_use block's JSON parsed at its end.
Json assemble_messages(const std::string& sse) {
  Json msg;
  std::vector<std::string> partial_json;
  int open = -1;
  for (const auto& [name, d] : parse_sse(sse)) {
    EXPECT_EQ(d["type"], name);
    if (name == "message_start") msg = d["message"];
    if (name == "content_block_start") {
      EXPECT_EQ(open, -1) << "a block opened inside another";
      open = d["index"].get<int>();
      EXPECT_EQ(open, static_cast<int>(msg["content"].size()));
      msg["content"].push_back(d["content_block"]);
      partial_json.emplace_back();
    }
    if (name == "content_block_delta") {
      EXPECT_EQ(d["index"].get<int>(), open);
      Json& b = msg["content"][static_cast<size_t>(open)];
      const Json& delta = d["delta"];
      if (delta["type"] == "text_delta") {
        b["text"] = b["text"].get<std::string>() + delta["text"].get<std::string>();
      }
      if (delta["type"] == "thinking_delta") {
        b["thinking"] = b["thinking"].get<std::string>() + delta["thinking"].get<std::string>();
      }
      if (delta["type"] == "input_json_delta") {
        partial_json[static_cast<size_t>(open)] += delta["partial_json"].get<std::string>();
      }
    }
    if (name == "content_block_stop") {
      EXPECT_EQ(d["index"].get<int>(), open);
      Json& b = msg["content"][static_cast<size_t>(open)];
      if (b["type"] == "tool_use") {
        const Json input = Json::parse(partial_json[static_cast<size_t>(open)], nullptr, false);
        b["input"] = input.is_object() ? input : Json::object();
      }
      open = -1;
    }
    if (name == "message_delta") {
      msg["stop_reason"] = d["delta"]["stop_reason"];
      msg["stop_sequence"] = d["delta"]["stop_sequence"];
    }
  }
  EXPECT_EQ(open, -1);
  return msg;
}

// A Responses stream assembled as OpenAI's SDK does (ResponseStream): the output items; the
// completed event's response must be what they assembled into.
Json assemble_responses(const std::string& sse) {
  Json snapshot;
  int64_t sequence = -1;
  for (const auto& [name, d] : parse_sse(sse)) {
    EXPECT_EQ(d["type"], name);
    EXPECT_EQ(d["sequence_number"].get<int64_t>(), sequence + 1);
    sequence = d["sequence_number"].get<int64_t>();
    if (name == "response.created") snapshot = d["response"];
    if (name == "response.output_item.added") {
      EXPECT_EQ(d["output_index"].get<size_t>(), snapshot["output"].size());
      snapshot["output"].push_back(d["item"]);
    }
    if (name == "response.content_part.added") {
      snapshot["output"][d["output_index"].get<size_t>()]["content"].push_back(d["part"]);
    }
    if (name == "response.output_text.delta") {
      Json& part = snapshot["output"][d["output_index"].get<size_t>()]["content"]
                           [d["content_index"].get<size_t>()];
      part["text"] = part["text"].get<std::string>() + d["delta"].get<std::string>();
    }
    if (name == "response.reasoning_summary_part.added") {
      snapshot["output"][d["output_index"].get<size_t>()]["summary"].push_back(d["part"]);
    }
    if (name == "response.reasoning_summary_text.delta") {
      Json& part = snapshot["output"][d["output_index"].get<size_t>()]["summary"]
                           [d["summary_index"].get<size_t>()];
      part["text"] = part["text"].get<std::string>() + d["delta"].get<std::string>();
    }
    if (name == "response.function_call_arguments.delta") {
      Json& item = snapshot["output"][d["output_index"].get<size_t>()];
      item["arguments"] = item["arguments"].get<std::string>() + d["delta"].get<std::string>();
    }
    if (name == "response.output_item.done") {
      Json& item = snapshot["output"][d["output_index"].get<size_t>()];
      EXPECT_EQ(item["id"], d["item"]["id"]);
      if (d["item"].contains("status")) item["status"] = d["item"]["status"];
      if (item["type"] == "message") item["content"][0]["annotations"] = Json::array();
      EXPECT_EQ(item, d["item"]) << "the item done is not what its events assembled";
    }
    if (name == "response.completed" || name == "response.incomplete") {
      EXPECT_EQ(d["response"]["output"], snapshot["output"]);
      snapshot["status"] = d["response"]["status"];
    }
  }
  return snapshot;
}

// A chat completion stream assembled as OpenAI's SDK does (ChatCompletionStream): content and
// reasoning appended; tool calls by index, the first entry with the id and name, the arguments
// appended.
Json assemble_chat(const std::string& sse) {
  Json message = {{"content", ""}, {"tool_calls", Json::array()}};
  Json finish;
  for (const auto& [name, d] : parse_sse(sse)) {
    if (!d.is_object() || d["choices"].empty()) continue;
    const Json& choice = d["choices"][0];
    const Json& delta = choice["delta"];
    if (delta.contains("content")) {
      message["content"] = message["content"].get<std::string>() + delta["content"].get<std::string>();
    }
    for (const Json& t : delta.value("tool_calls", Json::array())) {
      const size_t i = t["index"].get<size_t>();
      Json& calls = message["tool_calls"];
      if (i == calls.size()) {
        EXPECT_TRUE(t.contains("id") && t["function"].contains("name")) << "a call's first entry";
        calls.push_back({{"id", t["id"]}, {"type", t["type"]},
                         {"function", {{"name", t["function"]["name"]}, {"arguments", ""}}}});
      }
      EXPECT_LT(i, calls.size()) << "a call's entries before its first";
      if (i >= calls.size()) continue;
      Json& args = calls[i]["function"]["arguments"];
      args = args.get<std::string>() + t["function"]["arguments"].get<std::string>();
    }
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  message["finish_reason"] = finish;
  return message;
}

Json messages_request(const Fixture& f) {
  const Json body = Json::parse(R"({"max_tokens": 64, "messages": [{"role": "user",
      "content": "Weather?"}], "tools": [{"name": "get_weather", "input_schema": {"type":
      "object", "properties": {"city": {"type": "string"}}}}]})");
  return body;
}

TEST(ServerWriters, MessagesStreamAssemblesIntoTheWholeMessage) {
  Fixture f;
  const ApiRequest r = parse_messages_request(messages_request(f), f.model);
  const Json m = whole(r, f.model, events(1000));
  ASSERT_EQ(m["content"].size(), 3u) << m.dump();
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][0]["thinking"], "The user wants Paris.");
  EXPECT_EQ(m["content"][1], Json({{"type", "text"}, {"text", "Let me check."}}));
  EXPECT_EQ(m["content"][2]["type"], "tool_use");
  EXPECT_EQ(m["content"][2]["name"], "get_weather");
  EXPECT_EQ(m["content"][2]["input"], Json({{"city", "Paris"}}));
  EXPECT_EQ(m["stop_reason"], "tool_use");

  for (size_t piece : {size_t{1}, size_t{3}, size_t{17}}) {
    const Stream s = stream(r, f.model, events(piece));
    const Json msg = assemble_messages(s.all());
    EXPECT_EQ(msg["content"], m["content"]) << "piece " << piece;
    EXPECT_EQ(msg["stop_reason"], m["stop_reason"]);
    // The call's input streams as it is written: many deltas, not one at the end.
    if (piece == 1) {
      EXPECT_GT(s.events_with("input_json_delta"), 5);
    }
  }
}

TEST(ServerWriters, ResponsesStreamAssemblesIntoTheWholeResponse) {
  Fixture f;
  const Json body = Json::parse(R"({"input": "Weather?", "tools": [{"type": "function",
      "name": "get_weather", "parameters": {"type": "object"}}]})");
  const ApiRequest r = parse_responses_request(body, f.model);
  const Json resp = whole(r, f.model, events(1000));
  const Json& out = resp["output"];
  ASSERT_EQ(out.size(), 3u) << resp.dump();
  EXPECT_EQ(out[0]["type"], "reasoning");
  EXPECT_EQ(out[0]["summary"][0]["text"], "The user wants Paris.");
  EXPECT_EQ(out[1]["type"], "message");
  EXPECT_EQ(out[1]["content"][0]["text"], "Let me check.");
  EXPECT_EQ(out[2]["type"], "function_call");
  EXPECT_EQ(out[2]["name"], "get_weather");
  EXPECT_EQ(Json::parse(out[2]["arguments"].get<std::string>()), Json({{"city", "Paris"}}));
  EXPECT_EQ(resp["status"], "completed");
  std::set<std::string> ids;
  for (const Json& item : out) ids.insert(item["id"].get<std::string>());
  EXPECT_EQ(ids.size(), out.size()) << "items share an id";

  for (size_t piece : {size_t{1}, size_t{3}, size_t{17}}) {
    const Stream s = stream(r, f.model, events(piece));
    const Json snapshot = assemble_responses(s.all());
    EXPECT_EQ(snapshot["output"], out) << "piece " << piece;
    EXPECT_EQ(snapshot["status"], "completed");
    if (piece == 1) {
      EXPECT_GT(s.events_with("response.function_call_arguments.delta"), 5);
    }
  }
}

TEST(ServerWriters, ChatStreamAssemblesIntoTheWholeMessage) {
  Fixture f;
  const Json body = Json::parse(R"({"messages": [{"role": "user", "content": "Weather?"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "parameters":
      {"type": "object"}}}]})");
  const ApiRequest r = parse_chat_request(body, f.model);
  const Json w = whole(r, f.model, events(1000));
  const Json& m = w["choices"][0]["message"];
  ASSERT_EQ(m["tool_calls"].size(), 1u) << w.dump();
  EXPECT_EQ(m["content"], "Let me check.");
  EXPECT_EQ(m["reasoning_content"], "The user wants Paris.");
  EXPECT_EQ(w["choices"][0]["finish_reason"], "tool_calls");
  for (size_t piece : {size_t{1}, size_t{3}, size_t{17}}) {
    const Stream s = stream(r, f.model, events(piece));
    const Json streamed = assemble_chat(s.all());
    EXPECT_EQ(streamed["content"], m["content"]) << "piece " << piece;
    EXPECT_EQ(streamed["tool_calls"], m["tool_calls"]) << "piece " << piece;
    EXPECT_EQ(streamed["finish_reason"], "tool_calls");
    if (piece == 1) {
      EXPECT_GT(s.events_with("\"arguments\""), 5);
    }
  }
}

// Text after a call, then a call cut short by max_tokens: each API puts the parts in the
// order written, streamed as whole; the answer is reported cut short (not a finished call).
TEST(ServerWriters, TextAfterACallAndACallCutShort) {
  Fixture f;
  const auto evs = [](size_t piece) { return events(piece, kAnswerWithMore, FinishReason::kLength); };

  const ApiRequest mr = parse_messages_request(messages_request(f), f.model);
  const Json m = whole(mr, f.model, evs(1000));
  ASSERT_EQ(m["content"].size(), 3u) << m.dump();
  EXPECT_EQ(m["content"][0]["input"], Json({{"city", "Paris"}}));
  EXPECT_EQ(m["content"][1], Json({{"type", "text"}, {"text", "One more."}}));
  EXPECT_EQ(m["content"][2]["type"], "tool_use");
  EXPECT_EQ(m["content"][2]["input"], Json::object());  // (its JSON broke off)
  EXPECT_EQ(m["stop_reason"], "max_tokens");
  const Json rbody = Json::parse(R"({"input": "Weather?", "tools": [{"type": "function",
      "name": "get_weather", "parameters": {"type": "object"}}]})");
  const ApiRequest rr = parse_responses_request(rbody, f.model);
  const Json resp = whole(rr, f.model, evs(1000));
  ASSERT_EQ(resp["output"].size(), 3u) << resp.dump();
  EXPECT_EQ(resp["output"][1]["content"][0]["text"], "One more.");
  EXPECT_EQ(resp["output"][2]["arguments"], "{\"city\":\"Ly");
  EXPECT_EQ(resp["status"], "incomplete");
  for (size_t piece : {size_t{1}, size_t{4}}) {
    EXPECT_EQ(assemble_messages(stream(mr, f.model, evs(piece)).all())["content"], m["content"]);
    const Json snapshot = assemble_responses(stream(rr, f.model, evs(piece)).all());
    EXPECT_EQ(snapshot["output"], resp["output"]) << piece;
    EXPECT_EQ(snapshot["status"], "incomplete");
  }
  const Json cbody = Json::parse(R"({"messages": [{"role": "user", "content": "Weather?"}],
      "tools": [{"type": "function", "function": {"name": "get_weather"}}]})");
  const ApiRequest cr = parse_chat_request(cbody, f.model);
  const Json c = assemble_chat(stream(cr, f.model, evs(2)).all());
  EXPECT_EQ(c["finish_reason"], "length");
  ASSERT_EQ(c["tool_calls"].size(), 2u);
  EXPECT_EQ(c["tool_calls"][1]["function"]["arguments"], "{\"city\":\"Ly");
  EXPECT_EQ(c["content"], "One more.");
}

// The three APIs' streams of the answer and their whole answers, written for
// tests/server/node/tool_streams.test.mjs, which feeds them to the official SDKs (the demo model
// does not write tool calls, so a server cannot be made to). Two bytes per event.
TEST(ServerWriters, StreamsForTheSdks) {
  Fixture f;
  const std::filesystem::path dir = std::filesystem::path(TANDEM_BINARY_DIR) / "tests" / "sse";
  std::filesystem::create_directories(dir);
  const Json chat = Json::parse(R"({"messages": [{"role": "user", "content": "Weather?"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "parameters":
      {"type": "object"}}}]})");
  const Json responses = Json::parse(R"({"input": "Weather?", "tools": [{"type": "function",
      "name": "get_weather", "parameters": {"type": "object"}}]})");
  const std::pair<const char*, ApiRequest> apis[] = {
      {"chat", parse_chat_request(chat, f.model)},
      {"responses", parse_responses_request(responses, f.model)},
      {"messages", parse_messages_request(messages_request(f), f.model)},
  };
  for (const auto& [name, r] : apis) {
    const Stream s = stream(r, f.model, events(2));
    std::ofstream(dir / (std::string(name) + ".sse"), std::ios::binary) << s.all();
    std::ofstream(dir / (std::string(name) + ".json"), std::ios::binary)
        << whole(r, f.model, events(2)).dump();
    EXPECT_GT(s.events_with(name == std::string("messages") ? "input_json_delta" : "arguments"),
              5)
        << name;
  }
}

}  // namespace
}  // namespace tandem::server
