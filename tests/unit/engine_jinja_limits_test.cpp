// The render budgets of the Jinja engine (jinja::RenderLimits): a template comes from a model file
// and must not hang or take all memory. Each hostile template below stops with an Error naming its
// line; the real templates of tests/data/templates render a long conversation well within them.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "engine/chat_template.h"
#include "engine/jinja.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using jinja::Json;

// The message of the error rendering `src` throws ("(no error)" when it renders).
std::string render_error(const std::string& src, const jinja::RenderLimits& limits = {}) {
  try {
    jinja::Template(src, "t").render(jinja::Value::object(), limits);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResource) << e.what();
    return e.what();
  }
  return "(no error)";
}

// Budgets small enough for quick tests of each mechanism (the defaults are exercised by the
// first test and by cli_hostile_test through the binary).
jinja::RenderLimits small_limits() {
  jinja::RenderLimits l;
  l.output_bytes = l.string_bytes = 4 << 20;
  l.list_items = 1 << 16;
  l.iterations = 1 << 14;
  l.bytes = 16 << 20;
  return l;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(JinjaLimits, NestedLoopsStopAtTheIterationBudget) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = render_error(
      "{% for i in range(100000) %}\n{% for j in range(100000) %}{% endfor %}{% endfor %}");
  EXPECT_NE(e.find("t:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("loop iterations"), std::string::npos) << e;
  EXPECT_LT(seconds_since(t0), 5.0);
  // Macros calling themselves twice: 2^150 calls within the depth limit.
  EXPECT_NE(render_error("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}"
                         "{% endmacro %}{{ f(150) }}",
                         small_limits())
                .find("macro calls"),
            std::string::npos);
  EXPECT_NE(render_error("{{ range(10000000) | length }}").find("a list of 10000000 items"),
            std::string::npos);
}

TEST(JinjaLimits, StringsAreSizedBeforeTheyAreBuilt) {
  EXPECT_NE(render_error("x\n{{ 'x' * 1000000000 }}").find("t:2:"), std::string::npos);
  EXPECT_NE(render_error("{{ 'ab' * 4611686018427387904 }}").find("a string of"),
            std::string::npos);
  EXPECT_EQ(render_error("{{ 'x' * -5 }}"), "(no error)");  // Python: ''
  const std::string doubling =
      "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}";
  EXPECT_NE(render_error(doubling, small_limits()).find("render budget"), std::string::npos);
  EXPECT_NE(render_error("{{ ('x' * 1000000) | replace('x', 'yyyyyyyyyy') }}", small_limits())
                .find("replace() makes a string longer"),
            std::string::npos);
  EXPECT_NE(render_error("{{ 'a\nb' | indent(1000000000000) }}").find("a string of"),
            std::string::npos);
  jinja::RenderLimits small;
  small.output_bytes = 1000;
  EXPECT_NE(render_error("{% for i in range(100) %}{{ '0123456789abcdef' }}{% endfor %}", small)
                .find("output longer than 1000 bytes"),
            std::string::npos);
}

TEST(JinjaLimits, GrowingListsStopAtTheByteBudget) {
  const std::string append =
      "{% set ns = namespace(l=[]) %}{% for i in range(60000) %}"
      "{% set ns.l = ns.l + [i] %}{% endfor %}";
  EXPECT_NE(render_error(append, small_limits()).find("bytes of strings and lists"),
            std::string::npos);
  // A large string read again and again costs its copies.
  EXPECT_NE(render_error("{% set s = 'x' * 4000000 %}{% for i in range(100) %}{% set t = s %}"
                         "{% endfor %}",
                         small_limits())
                .find("bytes of strings and lists"),
            std::string::npos);
}

TEST(JinjaLimits, SelfReferenceAndDeepNestingAreBounded) {
  // A namespace holding itself: str() and tojson recursed until the stack overflowed.
  for (const char* out : {"{{ ns }}", "{{ ns | tojson }}", "{{ ns == ns2 }}"}) {
    const std::string src = std::string(
                                "{% set ns = namespace() %}{% set ns.me = ns %}"
                                "{% set ns2 = namespace() %}{% set ns2.me = ns2 %}") +
                            out;
    EXPECT_NE(render_error(src, small_limits()).find("nested deeper than"), std::string::npos)
        << out;
  }
  // Lists sharing lists: 40 doublings make 2^40 leaves from 40 values.
  const std::string dag =
      "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}"
      "{% set ns.l = [ns.l, ns.l] %}{% endfor %}";
  EXPECT_NE(render_error(dag + "{{ ns.l }}", small_limits()).find("longer than"),
            std::string::npos);
  EXPECT_NE(render_error(dag + "{{ ns.l | tojson }}", small_limits()).find("longer than"),
            std::string::npos);
  EXPECT_NE(render_error(dag + "{% set ns2 = namespace(l=[1]) %}{% for i in range(40) %}"
                               "{% set ns2.l = [ns2.l, ns2.l] %}{% endfor %}{{ ns.l == ns2.l }}",
                         small_limits())
                .find("comparing values of more than"),
            std::string::npos);
  // JSON input nested past the bound (a request's tools, say).
  Json deep = Json::array();
  for (int i = 0; i < 1000; ++i) deep = Json::array({deep});
  EXPECT_THROW(jinja::from_json(deep), Error);
}

TEST(JinjaLimits, NumberLiteralsOutOfRangeAreSyntaxErrors) {
  for (const char* src : {"{{ 99999999999999999999 }}", "{{ 1e999 }}", "{{ '\\uZZZZ' }}"}) {
    try {
      jinja::Template(src, "t");
      ADD_FAILURE() << src;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kFormat) << e.what();
      EXPECT_NE(std::string(e.what()).find("t:1:"), std::string::npos) << e.what();
    }
  }
}

// Integers are 64-bit: arithmetic past them is an error naming the operation, never a wrapped
// value or undefined behaviour; Python's floor division and modulo signs hold.
TEST(JinjaLimits, IntegerArithmeticOverflowIsAnError) {
  for (const char* t : {"{{ 120000765053 ** 3 }}", "{{ 9223372036854775807 + 1 }}",
                        "{{ -9223372036854775807 - 2 }}", "{{ 4611686018427387904 * 2 }}",
                        "{{ (-9223372036854775807 - 1) // -1 }}"}) {
    try {
      jinja::Template(t, "t").render(jinja::Value::object());
      ADD_FAILURE() << t << " rendered";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("integer overflow"), std::string::npos) << e.what();
    }
  }
  auto render = [](const std::string& t) {
    return jinja::Template(t, "t").render(jinja::Value::object());
  };
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 5 % -1 }}"),
            "4611686018427387904 -4 2 -2 0");
  EXPECT_EQ(render("{{ 2 ** 0.5 > 1.41 }}"), "True");
}

// Every real template renders a long conversation (400 messages, 300 KB) within the budgets.
TEST(JinjaLimits, RealTemplatesRenderLongConversations) {
  Json messages = Json::array();
  messages.push_back({{"role", "system"}, {"content", std::string(2000, 's')}});
  for (int i = 0; i < 400; ++i) {
    messages.push_back({{"role", i % 2 ? "assistant" : "user"},
                        {"content", std::string(700, char('a' + i % 26))}});
  }
  messages.push_back({{"role", "user"}, {"content", "last"}});
  int rendered = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& entry : std::filesystem::directory_iterator(test::data_path("templates"))) {
    if (entry.path().extension() != ".jinja") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    const ChatTemplate tmpl(ss.str(), entry.path().stem().string());
    std::string out;
    ASSERT_NO_THROW(out = tmpl.render(messages, nullptr, true, "<s>", "</s>"))
        << entry.path().filename();
    EXPECT_GT(out.size(), 280000u) << entry.path().filename();
    ++rendered;
  }
  EXPECT_GE(rendered, 10);
  EXPECT_LT(seconds_since(t0), 5.0);
}

}  // namespace
}  // namespace tandem
