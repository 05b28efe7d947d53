// The Responses and Messages writers on an answer with reasoning, text and a tool call (the
// demo model does not write tool calls, so the server tests cannot make one): streamed in pieces,
// the events assemble -- as the SDKs assemble them -- into the whole response; the parts are
// where each API puts them; the stream is well-formed (typed events in order, indices that
// match).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "server/openai.h"
#include "tests/test_util.h"

namespace tandem::server {
namespace {

const char* kAnswer =
    "<think>\nThe user wants Paris.\n</think>\n\nLet me check.\n<tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

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
std::vector<Job::Event> events(size_t piece) {
  const std::string a = kAnswer;
  std::vector<Job::Event> out;
  for (size_t i = 0; i < a.size(); i += piece) {
    Job::Event e;
    e.index = 0;
    e.ev.text = a.substr(i, piece);
    e.ev.token = 1;
    out.push_back(e);
  }
  out.back().ev.finish = FinishReason::kStop;
  return out;
}

// SSE text into (event name, data) pairs.
std::vector<std::pair<std::string, Json>> parse_sse(const std::string& text) {
  std::vector<std::pair<std::string, Json>> out;
  std::istringstream in(text);
  std::string line, name;
  while (std::getline(in, line)) {
    if (line.rfind("event: ", 0) == 0) name = line.substr(7);
    if (line.rfind("data: ", 0) == 0) out.push_back({name, Json::parse(line.substr(6))});
  }
  return out;
}

TEST(ServerWriters, MessagesStreamAssemblesIntoTheWholeMessage) {
  Fixture f;
  const Json body = Json::parse(R"({"max_tokens": 64, "messages": [{"role": "user",
      "content": "Weather?"}], "tools": [{"name": "get_weather", "input_schema": {"type":
      "object", "properties": {"city": {"type": "string"}}}}]})");
  const ApiRequest r = parse_messages_request(body, f.model);
  Job job(1);
  auto whole = make_response_writer(r, f.model, 7, 0);
  for (const Job::Event& e : events(1000)) whole->add(e);
  const Json m = whole->body(job);
  ASSERT_EQ(m["content"].size(), 3u) << m.dump();
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][0]["thinking"], "The user wants Paris.");
  EXPECT_EQ(m["content"][1], Json({{"type", "text"}, {"text", "Let me check."}}));
  EXPECT_EQ(m["content"][2]["type"], "tool_use");
  EXPECT_EQ(m["content"][2]["name"], "get_weather");
  EXPECT_EQ(m["content"][2]["input"], Json({{"city", "Paris"}}));
  EXPECT_EQ(m["stop_reason"], "tool_use");

  for (size_t piece : {size_t{1}, size_t{3}, size_t{17}}) {
    auto w = make_response_writer(r, f.model, 7, 0);
    std::string sse = w->stream_start();
    for (const Job::Event& e : events(piece)) sse += w->stream_event(e);
    sse += w->stream_end(job);
    // Assembled as Anthropic's SDK does: blocks opened, deltas appended, JSON parsed at the end.
    Json msg;
    std::vector<std::string> partial_json;
    int open = -1;
    for (const auto& [name, d] : parse_sse(sse)) {
      ASSERT_EQ(d["type"], name);
      if (name == "message_start") msg = d["message"];
      if (name == "content_block_start") {
        ASSERT_EQ(open, -1) << "a block opened inside another";
        open = d["index"].get<int>();
        ASSERT_EQ(open, static_cast<int>(msg["content"].size()));
        msg["content"].push_back(d["content_block"]);
        partial_json.emplace_back();
      }
      if (name == "content_block_delta") {
        ASSERT_EQ(d["index"].get<int>(), open);
        Json& b = msg["content"][static_cast<size_t>(open)];
        const Json& delta = d["delta"];
        if (delta["type"] == "text_delta") b["text"] = b["text"].get<std::string>() + delta["text"].get<std::string>();
        if (delta["type"] == "thinking_delta") {
          b["thinking"] = b["thinking"].get<std::string>() + delta["thinking"].get<std::string>();
        }
        if (delta["type"] == "input_json_delta") {
          partial_json[static_cast<size_t>(open)] += delta["partial_json"].get<std::string>();
        }
      }
      if (name == "content_block_stop") {
        ASSERT_EQ(d["index"].get<int>(), open);
        Json& b = msg["content"][static_cast<size_t>(open)];
        if (b["type"] == "tool_use") b["input"] = Json::parse(partial_json[static_cast<size_t>(open)]);
        open = -1;
      }
      if (name == "message_delta") {
        msg["stop_reason"] = d["delta"]["stop_reason"];
        msg["stop_sequence"] = d["delta"]["stop_sequence"];
      }
    }
    EXPECT_EQ(open, -1);
    EXPECT_EQ(msg["content"], m["content"]) << "piece " << piece;
    EXPECT_EQ(msg["stop_reason"], m["stop_reason"]);
  }
}

TEST(ServerWriters, ResponsesStreamAssemblesIntoTheWholeResponse) {
  Fixture f;
  const Json body = Json::parse(R"({"input": "Weather?", "tools": [{"type": "function",
      "name": "get_weather", "parameters": {"type": "object"}}]})");
  const ApiRequest r = parse_responses_request(body, f.model);
  Job job(1);
  auto whole = make_response_writer(r, f.model, 7, 0);
  for (const Job::Event& e : events(1000)) whole->add(e);
  const Json resp = whole->body(job);
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

  for (size_t piece : {size_t{1}, size_t{3}, size_t{17}}) {
    auto w = make_response_writer(r, f.model, 7, 0);
    std::string sse = w->stream_start();
    for (const Job::Event& e : events(piece)) sse += w->stream_event(e);
    sse += w->stream_end(job);
    // Assembled as OpenAI's SDK does (ResponseStream), and the completed event's response.
    Json snapshot;
    int64_t sequence = -1;
    for (const auto& [name, d] : parse_sse(sse)) {
      ASSERT_EQ(d["type"], name);
      ASSERT_EQ(d["sequence_number"].get<int64_t>(), sequence + 1);
      sequence = d["sequence_number"].get<int64_t>();
      if (name == "response.created") snapshot = d["response"];
      if (name == "response.output_item.added") {
        ASSERT_EQ(d["output_index"].get<size_t>(), snapshot["output"].size());
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
      if (name == "response.function_call_arguments.delta") {
        Json& item = snapshot["output"][d["output_index"].get<size_t>()];
        item["arguments"] = item["arguments"].get<std::string>() + d["delta"].get<std::string>();
      }
      if (name == "response.output_item.done") {
        ASSERT_EQ(snapshot["output"][d["output_index"].get<size_t>()]["type"], d["item"]["type"]);
      }
      if (name == "response.completed") {
        EXPECT_EQ(d["response"]["output"], out) << "piece " << piece;
      }
    }
    ASSERT_EQ(snapshot["output"].size(), 3u);
    EXPECT_EQ(snapshot["output"][1]["content"][0]["text"], "Let me check.");
    EXPECT_EQ(snapshot["output"][2]["arguments"], out[2]["arguments"]);
  }
}

}  // namespace
}  // namespace tandem::server
