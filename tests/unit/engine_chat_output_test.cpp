// Answers taken apart: each template family's tool calls parse back into the calls the template
// itself rendered (the template is the independent expectation: parse(render(calls)) == calls),
// streamed or whole; <think> reasoning split out.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "engine/chat_output.h"
#include "engine/chat_template.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using jinja::Json;

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  EXPECT_TRUE(f.good()) << p;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::filesystem::path templates_dir() {
  return std::filesystem::path(TANDEM_TEST_DATA_DIR) / "templates";
}

// The assistant turn as the template writes it: the rendering with the assistant's message
// after the rendering of the conversation before it with the generation prompt.
struct Rendered {
  std::string prompt, answer;
};

Rendered render_answer(const ChatTemplate& t, const Json& before, const Json& assistant,
                       const Json& tools) {
  Json with = before;
  with.push_back(assistant);
  const std::string p = t.render(before, tools, true, "<s>", "</s>");
  const std::string full = t.render(with, tools, false, "<s>", "</s>");
  size_t common = 0;
  while (common < p.size() && common < full.size() && p[common] == full[common]) ++common;
  if (common < p.size()) {
    // The generation prompt is not a prefix of the history (R1's opens <think>): split after
    // the last complete tag, and the model closes the reasoning the prompt opened.
    common = full.rfind('>', common - 1) + 1;
    std::string answer = full.substr(common);
    if (prompt_opens_think(p)) answer = "</think>" + answer;
    return {p, answer};
  }
  return {p.substr(0, common), full.substr(common)};
}

ChatOutput parse_streamed(const std::string& text, ToolCallSyntax syntax, bool in_think,
                          const Json& tools, size_t piece) {
  ChatStreamParser p(syntax, in_think, tools);
  ChatOutput out;
  for (size_t i = 0; i < text.size(); i += piece) out.add(p.push(text.substr(i, piece)));
  out.add(p.finish());
  return out;
}

TEST(ChatOutput, EveryTemplatesToolCallsParseBackIntoTheCallsItRendered) {
  const Json conv = Json::parse(read_file(templates_dir() / "conversations.json"))["tools"];
  const Json tools = conv["tools"];
  const Json& msgs = conv["messages"];
  Json before = Json::array({msgs[0], msgs[1]});
  const Json& assistant = msgs[2];
  ASSERT_TRUE(assistant.contains("tool_calls"));
  int parsed_templates = 0, with_golden_tools = 0;
  for (const auto& entry : std::filesystem::directory_iterator(templates_dir())) {
    if (entry.path().extension() != ".jinja") continue;
    const std::string name = entry.path().stem().string();
    const ChatTemplate t(read_file(entry.path()), name);
    const ToolCallSyntax syntax = tool_call_syntax(t.source());
    if (syntax == ToolCallSyntax::kNone) continue;
    const auto expected = templates_dir() / "expected";
    if (std::filesystem::exists(expected / (name + ".tools.txt"))) ++with_golden_tools;
    Rendered r;
    try {
      r = render_answer(t, before, assistant, tools);
    } catch (const Error& e) {
      // Only a template that Hugging Face's renderer refuses too (its .tools.error.txt golden)
      // may refuse the conversation.
      EXPECT_TRUE(std::filesystem::exists(expected / (name + ".tools.error.txt")))
          << name << " refused the tool calls (" << e.what()
          << ") but Hugging Face renders its tools conversation";
      continue;
    }
    SCOPED_TRACE(name + " (" + tool_call_syntax_name(syntax) + "): " + r.answer);
    for (size_t piece : {r.answer.size() + 1, size_t{1}, size_t{7}}) {
      const bool in_think = prompt_opens_think(r.prompt);
      const ChatOutput out = piece > r.answer.size()
                                 ? parse_chat_output(r.answer, syntax, in_think, tools)
                                 : parse_streamed(r.answer, syntax, in_think, tools, piece);
      // (gpt-oss's template renders a message's first call only: one call per harmony message.)
      const size_t rendered =
          syntax == ToolCallSyntax::kHarmony ? 1 : assistant["tool_calls"].size();
      ASSERT_EQ(out.tool_calls.size(), rendered) << "piece " << piece;
      for (size_t i = 0; i < out.tool_calls.size(); ++i) {
        const Json& want = assistant["tool_calls"][i]["function"];
        EXPECT_EQ(out.tool_calls[i].name, want["name"].get<std::string>());
        EXPECT_EQ(Json::parse(out.tool_calls[i].arguments), want["arguments"]);
        EXPECT_FALSE(out.tool_calls[i].id.empty());
      }
      EXPECT_EQ(out.content.find(std::string(tool_call_start(syntax))), std::string::npos);
    }
    ++parsed_templates;
  }
  // Every template with a golden rendering of tool calls parses its own calls back: hermes
  // (Qwen2.5, Qwen3), qwen3-coder (and Qwen3.5), glm, deepseek-v3, deepseek-r1, kimi, mistral
  // (both), minimax, harmony, deepseek-dsml.
  EXPECT_GE(with_golden_tools, 13);
  EXPECT_EQ(parsed_templates, with_golden_tools);
}

// What a stream passed on, and when: each call's start and its arguments, and the byte of the
// answer at which they came.
struct StreamedCall {
  std::string id, name, arguments;
  size_t started_at = 0;        // bytes of the answer pushed when the call started
  size_t argument_pushes = 0;   // pushes that carried some of its arguments
  size_t first_arguments_at = 0;
};

std::vector<StreamedCall> stream_calls(const std::string& text, ToolCallSyntax syntax,
                                       bool in_think, const Json& tools, size_t piece) {
  ChatStreamParser p(syntax, in_think, tools);
  std::vector<StreamedCall> calls;
  const auto take = [&](const AnswerDelta& d, size_t at) {
    std::vector<bool> pushed(calls.size() + d.size(), false);
    for (const AnswerPiece& x : d) {
      if (x.kind == AnswerPiece::Kind::kCall) {
        EXPECT_EQ(x.call, calls.size()) << "calls are numbered in order";
        calls.push_back({x.id, x.name, "", at, 0, 0});
        pushed.resize(calls.size() + d.size(), false);
      } else if (x.kind == AnswerPiece::Kind::kArguments) {
        EXPECT_LT(x.call, calls.size()) << "arguments of a call not started";
        if (x.call >= calls.size()) continue;
        StreamedCall& c = calls[x.call];
        if (c.arguments.empty()) c.first_arguments_at = at;
        c.arguments += x.text;
        if (!pushed[x.call]) ++c.argument_pushes;
        pushed[x.call] = true;
      }
    }
  };
  for (size_t i = 0; i < text.size(); i += piece) {
    take(p.push(text.substr(i, piece)), std::min(i + piece, text.size()));
  }
  take(p.finish(), text.size() + 1);
  return calls;
}

// Streamed byte by byte, every template's calls start as soon as their name is read and their
// arguments come in many pieces, before the call's text ends; the pieces add up to the whole
// answer's arguments, byte for byte. (Mistral Nemo's list writes a call's id after its
// arguments: the list is read whole.)
TEST(ChatOutput, ToolCallsStreamAsTheyAreRead) {
  const Json conv = Json::parse(read_file(templates_dir() / "conversations.json"))["tools"];
  const Json tools = conv["tools"];
  const Json& msgs = conv["messages"];
  const Json before = Json::array({msgs[0], msgs[1]});
  int streamed_templates = 0;
  for (const auto& entry : std::filesystem::directory_iterator(templates_dir())) {
    if (entry.path().extension() != ".jinja") continue;
    const std::string name = entry.path().stem().string();
    const ChatTemplate t(read_file(entry.path()), name);
    const ToolCallSyntax syntax = tool_call_syntax(t.source());
    if (syntax == ToolCallSyntax::kNone) continue;
    Rendered r;
    try {
      r = render_answer(t, before, msgs[2], tools);
    } catch (const Error&) {
      continue;  // (the test above checks which templates may refuse)
    }
    SCOPED_TRACE(name + " (" + tool_call_syntax_name(syntax) + "): " + r.answer);
    const bool in_think = prompt_opens_think(r.prompt);
    const ChatOutput whole = parse_chat_output(r.answer, syntax, in_think, tools);
    for (size_t piece : {size_t{1}, size_t{4}}) {
      const std::vector<StreamedCall> calls = stream_calls(r.answer, syntax, in_think, tools, piece);
      ASSERT_EQ(calls.size(), whole.tool_calls.size());
      for (size_t i = 0; i < calls.size(); ++i) {
        EXPECT_EQ(calls[i].id, whole.tool_calls[i].id);
        EXPECT_EQ(calls[i].name, whole.tool_calls[i].name);
        EXPECT_EQ(calls[i].arguments, whole.tool_calls[i].arguments) << "piece " << piece;
        if (piece != 1) continue;
        if (syntax == ToolCallSyntax::kMistralList) {
          EXPECT_EQ(calls[i].argument_pushes, 1u);
          continue;
        }
        // Byte by byte: the call starts before the answer is over, its arguments come in more
        // pushes than one, the first of them before the answer's last byte.
        EXPECT_LT(calls[i].started_at, r.answer.size());
        EXPECT_GT(calls[i].argument_pushes, 3u) << "call " << i;
        EXPECT_LT(calls[i].first_arguments_at, r.answer.size());
      }
    }
    ++streamed_templates;
  }
  EXPECT_GE(streamed_templates, 13);
}

// A call cut short (the answer ran out of tokens) keeps the arguments read so far, in every
// syntax's way of writing them, whole or streamed alike; text after a call is content again, and
// a marker that does not start a call is text, with a call after it still read.
TEST(ChatOutput, CallsCutShortAndTextAroundThem) {
  const Json tools = Json::parse(R"([{"type":"function","function":{"name":"f","parameters":{
      "type":"object","properties":{"code":{"type":"string"},"n":{"type":"integer"}}}}}])");
  struct Case {
    ToolCallSyntax syntax;
    std::string answer, arguments;
  };
  const std::vector<Case> cases = {
      {ToolCallSyntax::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"code\": \"a b",
       "{\"code\":\"a b"},
      {ToolCallSyntax::kQwen3Coder,
       "<tool_call>\n<function=f>\n<parameter=n>\n4\n</parameter>\n<parameter=code>\nx = \"1\"\n",
       "{\"n\":4,\"code\":\"x = \\\"1\\\""},
      {ToolCallSyntax::kQwen3Coder,
       "<tool_call>\n<function=f>\n<parameter=n>\n4\n</parameter>\n", "{\"n\":4}"},
      {ToolCallSyntax::kGlm, "<tool_call>f\n<arg_key>code</arg_key>\n<arg_value>line\n",
       "{\"code\":\"line\\n"},
      {ToolCallSyntax::kDeepSeekV3,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"n\": [1, 2",
       "{\"n\":[1,2"},
      {ToolCallSyntax::kKimi,
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
       "{\"code\": \"{",
       "{\"code\":\"{"},
      {ToolCallSyntax::kMiniMax,
       "<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"n\">7</parameter>\n",
       "{\"n\":7}"},
      // (DSML's own string attribute, not the schema, says what a value is.)
      {ToolCallSyntax::kDsml,
       "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" "
       "string=\"true\">7</｜DSML｜parameter>\n<｜DSML｜parameter name=\"code\" string=\"false\">"
       "[1, 2",
       "{\"n\":\"7\",\"code\":"},
      {ToolCallSyntax::kDsmlToolCalls,
       "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"n\" "
       "string=\"false\">{\"a\": [1, 2",
       "{\"n\":"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(tool_call_syntax_name(c.syntax)) + ": " + c.answer);
    const ChatOutput whole = parse_chat_output(c.answer, c.syntax, false, tools);
    ASSERT_EQ(whole.tool_calls.size(), 1u);
    EXPECT_EQ(whole.tool_calls[0].name, "f");
    EXPECT_EQ(whole.tool_calls[0].arguments, c.arguments);
    EXPECT_EQ(whole.content, "");
    for (size_t piece : {size_t{1}, size_t{3}}) {
      const ChatOutput o = parse_streamed(c.answer, c.syntax, false, tools, piece);
      ASSERT_EQ(o.tool_calls.size(), 1u);
      EXPECT_EQ(o.tool_calls[0].arguments, c.arguments) << piece;
    }
  }
  // Text after a call; a marker that starts no call, then one that does.
  const std::string call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
  for (const std::string& a :
       {call + "\n\nDone.", "<tool_call>oops</tool_call> then " + call + " end"}) {
    const ChatOutput whole = parse_chat_output(a, ToolCallSyntax::kHermes, false, tools);
    ASSERT_EQ(whole.tool_calls.size(), 1u) << a;
    EXPECT_EQ(whole.tool_calls[0].arguments, "{}");
    EXPECT_EQ(whole.content, a.back() == '.' ? "Done." : "<tool_call>oops</tool_call> thenend");
    for (size_t piece : {size_t{1}, size_t{5}}) {
      const ChatOutput o = parse_streamed(a, ToolCallSyntax::kHermes, false, tools, piece);
      EXPECT_EQ(o.content, whole.content) << piece;
      ASSERT_EQ(o.tool_calls.size(), 1u);
    }
  }
}

TEST(ChatOutput, SyntaxesAreRecognizedFromTheTemplates) {
  const auto syntax_of = [](const char* file) {
    return tool_call_syntax(read_file(templates_dir() / file));
  };
  EXPECT_EQ(syntax_of("Qwen-Qwen2.5-7B-Instruct.jinja"), ToolCallSyntax::kHermes);
  EXPECT_EQ(syntax_of("Qwen3-Coder.jinja"), ToolCallSyntax::kQwen3Coder);
  EXPECT_EQ(syntax_of("Qwen3.5-4B.jinja"), ToolCallSyntax::kQwen3Coder);
  EXPECT_EQ(syntax_of("GLM-4.6.jinja"), ToolCallSyntax::kGlm);
  EXPECT_EQ(syntax_of("deepseek-ai-DeepSeek-V3.1.jinja"), ToolCallSyntax::kDeepSeekV3);
  EXPECT_EQ(syntax_of("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"),
            ToolCallSyntax::kDeepSeekR1);
  EXPECT_EQ(syntax_of("moonshotai-Kimi-K2.jinja"), ToolCallSyntax::kKimi);
  EXPECT_EQ(syntax_of("mistralai-Mistral-Nemo-Instruct-2407.jinja"), ToolCallSyntax::kMistralList);
  EXPECT_EQ(syntax_of("Mistral-Small-3.2-24B-Instruct-2506.jinja"), ToolCallSyntax::kMistralArgs);
  EXPECT_EQ(syntax_of("MiniMax-M2.jinja"), ToolCallSyntax::kMiniMax);
  EXPECT_EQ(syntax_of("openai-gpt-oss-120b.jinja"), ToolCallSyntax::kHarmony);
  EXPECT_EQ(syntax_of("deepseek-ai-DeepSeek-V3.2.jinja"), ToolCallSyntax::kDsml);
  EXPECT_EQ(syntax_of("deepseek-ai-DeepSeek-V4.jinja"), ToolCallSyntax::kDsmlToolCalls);
  EXPECT_EQ(syntax_of("deepseek-ai-DeepSeek-V4-Flash-0731.jinja"), ToolCallSyntax::kDsmlToolCalls);
}

// gpt-oss's harmony messages: the template's own rendering of an assistant turn with its
// thinking (the analysis channel) and its answer (the final channel) parses back into them, whole
// and streamed, with or without tools; a call's message after the analysis; text that is not
// harmony stays content.
TEST(ChatOutput, HarmonyChannelsSplitReasoningContentAndCalls) {
  const ChatTemplate t(read_file(templates_dir() / "openai-gpt-oss-120b.jinja"), "gpt-oss");
  const Json conv = Json::parse(read_file(templates_dir() / "conversations.json"));
  const Json& msgs = conv["reasoning_last"]["messages"];
  Json assistant = msgs[2];
  assistant["thinking"] = assistant["reasoning_content"];
  const Rendered r =
      render_answer(t, Json::array({msgs[0], msgs[1]}), assistant, Json(nullptr));
  ASSERT_NE(r.answer.find("<|channel|>analysis<|message|>"), std::string::npos) << r.answer;
  const Json tools = conv["tools"]["tools"];
  for (const Json& with : {Json(nullptr), tools}) {
    for (size_t piece : {r.answer.size() + 1, size_t{1}, size_t{5}}) {
      SCOPED_TRACE(r.answer + " piece " + std::to_string(piece));
      const ChatOutput o =
          piece > r.answer.size()
              ? parse_chat_output(r.answer, ToolCallSyntax::kHarmony, false, with)
              : parse_streamed(r.answer, ToolCallSyntax::kHarmony, false, with, piece);
      EXPECT_EQ(o.reasoning, assistant["thinking"].get<std::string>());
      EXPECT_EQ(o.content, assistant["content"].get<std::string>());
      EXPECT_TRUE(o.tool_calls.empty());
    }
  }
  // As a model writes a call after its reasoning (the recipient after the channel, a
  // constraint), its end token <|call|> not in the text (it ends the generation).
  const std::string call =
      "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
      "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";
  for (size_t piece : {call.size() + 1, size_t{1}, size_t{3}}) {
    const ChatOutput o = piece > call.size()
                             ? parse_chat_output(call, ToolCallSyntax::kHarmony, false, tools)
                             : parse_streamed(call, ToolCallSyntax::kHarmony, false, tools, piece);
    EXPECT_EQ(o.reasoning, "Need the weather.");
    EXPECT_EQ(o.content, "");
    ASSERT_EQ(o.tool_calls.size(), 1u) << piece;
    EXPECT_EQ(o.tool_calls[0].name, "get_weather");
    EXPECT_EQ(Json::parse(o.tool_calls[0].arguments), Json::parse(R"({"city": "Paris"})"));
  }
  // Without tools in the request the same message is text; a body that is not a JSON object is
  // text too; a call cut short keeps the arguments written so far.
  EXPECT_EQ(parse_chat_output(call, ToolCallSyntax::kHarmony, false, Json(nullptr)).content,
            "{\"city\": \"Paris\"}");
  const ChatOutput text = parse_chat_output(
      "<|channel|>commentary to=functions.f<|message|>Paris", ToolCallSyntax::kHarmony, false,
      tools);
  EXPECT_TRUE(text.tool_calls.empty());
  EXPECT_EQ(text.content, "Paris");
  const ChatOutput cut = parse_chat_output(
      "<|channel|>commentary to=functions.f<|message|>{\"a\": ", ToolCallSyntax::kHarmony, false,
      tools);
  ASSERT_EQ(cut.tool_calls.size(), 1u);
  EXPECT_EQ(cut.tool_calls[0].arguments, "{\"a\":");
  EXPECT_EQ(cut.content, "");
  // A model that does not write harmony: its text is the content.
  const std::string plain(300, 'x');
  EXPECT_EQ(parse_streamed(plain, ToolCallSyntax::kHarmony, false, Json(nullptr), 7).content,
            plain);
}

TEST(ChatOutput, ReasoningIsSplitFromTheAnswer) {
  const Json none = nullptr;
  ChatOutput o = parse_chat_output("<think>\nadd them\n</think>\n\nIt is 7.", ToolCallSyntax::kNone,
                                   false, none);
  EXPECT_EQ(o.reasoning, "add them");
  EXPECT_EQ(o.content, "It is 7.");
  // The template opened <think> in the prompt: the answer starts inside it.
  o = parse_chat_output("add them</think>It is 7.", ToolCallSyntax::kNone, true, none);
  EXPECT_EQ(o.reasoning, "add them");
  EXPECT_EQ(o.content, "It is 7.");
  // Unterminated: all reasoning.
  o = parse_chat_output("still thinking", ToolCallSyntax::kNone, true, none);
  EXPECT_EQ(o.reasoning, "still thinking");
  EXPECT_EQ(o.content, "");
  // <think> only opens at the start; later it is text.
  o = parse_chat_output("a <think> b", ToolCallSyntax::kNone, false, none);
  EXPECT_EQ(o.reasoning, "");
  EXPECT_EQ(o.content, "a <think> b");
  // Streamed a byte at a time: the same.
  o = parse_streamed("<think>x</think>y<thi", ToolCallSyntax::kNone, false, none, 1);
  EXPECT_EQ(o.reasoning, "x");
  EXPECT_EQ(o.content, "y<thi");
}

// Qwen3.5's template opens <think> in its generation prompt (or writes an empty block when
// thinking is off): the model's reasoning, its answer and its Qwen3-Coder-style call come apart,
// whole and streamed.
TEST(ChatOutput, Qwen35PromptOpensThinkingAndItsCallsParse) {
  const ChatTemplate t(read_file(templates_dir() / "Qwen3.5-4B.jinja"));
  const Json user = Json::parse(R"([{"role":"user","content":"Weather in Paris?"}])");
  const Json tools = Json::parse(R"([{"type":"function","function":{"name":"get_weather",
      "parameters":{"type":"object","properties":{"city":{"type":"string"},
      "days":{"type":"integer"}}}}}])");
  const std::string prompt = t.render(user, tools, true, "", "<|im_end|>");
  ASSERT_TRUE(prompt_opens_think(prompt)) << prompt;
  Json no_think = Json::object();
  no_think["enable_thinking"] = false;
  EXPECT_FALSE(prompt_opens_think(t.render(user, tools, true, "", "<|im_end|>", no_think)));

  const std::string answer =
      "The user wants Paris.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
      "</tool_call>";
  const ToolCallSyntax syntax = tool_call_syntax(read_file(templates_dir() / "Qwen3.5-4B.jinja"));
  const ChatOutput whole = parse_chat_output(answer, syntax, true, tools);
  EXPECT_EQ(whole.reasoning, "The user wants Paris.");
  EXPECT_EQ(whole.content, "Let me check.");
  ASSERT_EQ(whole.tool_calls.size(), 1u);
  EXPECT_EQ(whole.tool_calls[0].name, "get_weather");
  EXPECT_EQ(Json::parse(whole.tool_calls[0].arguments),
            Json::parse(R"({"city":"Paris","days":3})"));
  // Streamed, the pieces add up to the whole answer (the whitespace around the tags is held
  // until text follows it, and dropped at the end).
  for (size_t piece : {size_t{1}, size_t{5}}) {
    const ChatOutput o = parse_streamed(answer, syntax, true, tools, piece);
    EXPECT_EQ(o.reasoning, "The user wants Paris.") << piece;
    EXPECT_EQ(o.content, "Let me check.") << piece;
    ASSERT_EQ(o.tool_calls.size(), 1u) << piece;
    EXPECT_EQ(Json::parse(o.tool_calls[0].arguments), Json::parse(whole.tool_calls[0].arguments));
  }
}

// Whatever the pieces, a streamed answer adds up to the whole one: answers with whitespace
// before, between and after their parts, in every syntax, with and without an opened <think>.
TEST(ChatOutput, StreamedPiecesAddUpToTheWholeAnswer) {
  const Json tools = Json::parse(R"([{"type":"function","function":{"name":"f"}}])");
  const std::vector<std::string> answers = {
      "Hello.  ", " \n Hi there \n\n", "<think>\n plan \n</think>\n\n Answer. \n",
      "plan </think> done  ", "a  b\t\n", "Sure.\n\n<tool_call>\n{\"name\": \"f\", "
      "\"arguments\": {}}\n</tool_call>\n",
      "<|channel|>analysis<|message|> think  <|end|><|start|>assistant<|channel|>final"
      "<|message|>  The answer.  \n<|return|>",
      "<|channel|>final<|message|>text ending in spaces   ", "   ", ""};
  for (int si = 0; si <= static_cast<int>(ToolCallSyntax::kDsmlToolCalls); ++si) {
    const auto syntax = static_cast<ToolCallSyntax>(si);
    for (const bool in_think : {false, true}) {
      for (const std::string& a : answers) {
        const ChatOutput whole = parse_chat_output(a, syntax, in_think, tools);
        for (size_t piece : {size_t{1}, size_t{3}, size_t{7}}) {
          const ChatOutput o = parse_streamed(a, syntax, in_think, tools, piece);
          EXPECT_EQ(o.reasoning, whole.reasoning) << tool_call_syntax_name(syntax) << " " << a;
          EXPECT_EQ(o.content, whole.content) << tool_call_syntax_name(syntax) << " " << a;
          EXPECT_EQ(o.tool_calls.size(), whole.tool_calls.size());
        }
        // (What the whole answer is: the parts without the whitespace around them.)
        EXPECT_TRUE(whole.content.empty() || !std::isspace(static_cast<unsigned char>(
                                                 whole.content.back())));
        EXPECT_TRUE(whole.reasoning.empty() ||
                    (!std::isspace(static_cast<unsigned char>(whole.reasoning.back())) &&
                     !std::isspace(static_cast<unsigned char>(whole.reasoning.front()))));
      }
    }
  }
}

TEST(ChatOutput, WhatDoesNotParseStaysText) {
  const Json tools = Json::parse(R"([{"type":"function","function":{"name":"f"}}])");
  // Broken JSON after the marker: the text as written.
  ChatOutput o = parse_chat_output("Sure. <tool_call>\n{\"name\": \"f\", \"argu",
                                   ToolCallSyntax::kHermes, false, tools);
  EXPECT_TRUE(o.tool_calls.empty());
  EXPECT_EQ(o.content, "Sure. <tool_call>\n{\"name\": \"f\", \"argu");
  // No tools in the request: markers are text.
  o = parse_chat_output("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
                        ToolCallSyntax::kHermes, false, nullptr);
  EXPECT_TRUE(o.tool_calls.empty());
  // Text before a call is content; the call parses.
  o = parse_chat_output(
      "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": "
      "[1, \"}\"]}}\n</tool_call>",
      ToolCallSyntax::kHermes, false, tools);
  ASSERT_EQ(o.tool_calls.size(), 1u);
  EXPECT_EQ(o.content, "Let me check.");
  EXPECT_EQ(Json::parse(o.tool_calls[0].arguments), Json::parse(R"({"x": [1, "}"]})"));
}

TEST(ChatOutput, TextValuesFollowTheToolsSchema) {
  // Qwen3-Coder writes values as text: a string parameter stays a string even if it looks
  // like a number; others are read as JSON.
  const Json tools = Json::parse(R"([{"type":"function","function":{"name":"f","parameters":{
      "type":"object","properties":{"code":{"type":"string"},"n":{"type":"integer"}}}}}])");
  const ChatOutput o = parse_chat_output(
      "<tool_call>\n<function=f>\n<parameter=code>\n42\n</parameter>\n<parameter=n>\n42\n"
      "</parameter>\n</function>\n</tool_call>",
      ToolCallSyntax::kQwen3Coder, false, tools);
  ASSERT_EQ(o.tool_calls.size(), 1u);
  EXPECT_EQ(Json::parse(o.tool_calls[0].arguments), Json::parse(R"({"code": "42", "n": 42})"));
}

TEST(ChatOutput, JsonNestingRespectsStringsAndEscapes) {
  const std::string a = R"({"a": "}]\"{"} tail)";
  EXPECT_EQ(jinja::json_nesting(a).end, a.find(" tail"));
  EXPECT_EQ(jinja::json_nesting(a).max_depth, 1);
  EXPECT_EQ(jinja::json_nesting(R"([[1], {"x": [2]}])").max_depth, 3);
  const jinja::JsonNesting open = jinja::json_nesting(R"({"a": [)");
  EXPECT_EQ(open.end, 0u);
  EXPECT_EQ(open.max_depth, 2);
  EXPECT_EQ(jinja::json_nesting(R"("\"{[")").max_depth, 0);
  EXPECT_EQ(jinja::json_nesting("]]}{}").end, 5u);  // stray closers do not go below zero
}

// Text that is not harmony (no <|message|> starting within the header's 256 bytes) is content as
// written, whole or in any pieces: none of it reasoning, whatever the prompt opened; a
// <|message|> past the limit does not make it harmony.
TEST(ChatOutput, TextThatIsNotHarmonyStaysContentWhenStreamed) {
  for (const std::string& text : {std::string(300, 'x'), std::string(260, 'x') + "<|message|>hi",
                                  std::string(250, 'x') + "<|message|>hi"}) {
    const bool harmony = text.find("<|message|>") < 256;
    for (const bool in_think : {false, true}) {
      const ChatOutput whole = parse_chat_output(text, ToolCallSyntax::kHarmony, in_think, Json());
      EXPECT_EQ(whole.content, harmony ? "hi" : text);
      for (size_t piece : {size_t{1}, size_t{2}, size_t{7}}) {
        const ChatOutput o =
            parse_streamed(text, ToolCallSyntax::kHarmony, in_think, Json(), piece);
        EXPECT_EQ(o.reasoning, "") << "piece " << piece;
        EXPECT_EQ(o.content, whole.content) << "piece " << piece;
      }
    }
  }
}


}  // namespace
}  // namespace tandem
