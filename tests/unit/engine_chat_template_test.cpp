// Chat templates: every real template in tests/data/templates renders each conversation of
// conversations.json byte-identically to Python's jinja2 (expected/, written by
// render_reference.py), and focused checks of the Jinja engine with hand-written expectations.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "engine/chat_template.h"
#include "formats/gguf.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using jinja::Json;

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::tm fixed_date() {  // render_reference.py's FIXED_DATE
  std::tm tm{};
  tm.tm_year = 2025 - 1900;
  tm.tm_mon = 2;
  tm.tm_mday = 14;
  tm.tm_hour = 12;
  tm.tm_wday = 5;
  tm.tm_yday = 72;
  return tm;
}

TEST(ChatTemplate, RealTemplatesMatchJinja2) {
  auto dir = test::data_path("templates");
  Json cases = Json::parse(read(dir / "conversations.json"));
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".jinja") continue;
    std::string stem = entry.path().stem().string();
    ChatTemplate tmpl(read(entry.path()), stem);
    tmpl.set_now(fixed_date());
    for (auto it = cases.begin(); it != cases.end(); ++it) {
      const Json& c = it.value();
      SCOPED_TRACE(stem + "." + it.key());
      auto ok_path = dir / "expected" / (stem + "." + it.key() + ".txt");
      auto err_path = dir / "expected" / (stem + "." + it.key() + ".error.txt");
      Json tools = c.contains("tools") ? c["tools"] : Json();
      Json extra = c.contains("extra") ? c["extra"] : Json::object();
      auto render = [&] {
        return tmpl.render(c["messages"], tools, c["add_generation_prompt"].get<bool>(), "<BOS>",
                           "<EOS>", extra);
      };
      ++checked;
      if (std::filesystem::exists(err_path)) {
        std::string expected = read(err_path);
        try {
          render();
          ADD_FAILURE() << "expected the error: " << expected;
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
        }
        continue;
      }
      ASSERT_TRUE(std::filesystem::exists(ok_path)) << ok_path;
      std::string expected = read(ok_path), got;
      try {
        got = render();
      } catch (const Error& e) {
        ADD_FAILURE() << "unexpected error: " << e.what();
        continue;
      }
      if (got != expected) {
        size_t k = 0;
        while (k < got.size() && k < expected.size() && got[k] == expected[k]) ++k;
        ADD_FAILURE() << "first difference at byte " << k << "\nexpected: ..."
                      << expected.substr(k < 40 ? 0 : k - 40, 120) << "\ngot:      ..."
                      << got.substr(k < 40 ? 0 : k - 40, 120);
      }
    }
  }
  EXPECT_GE(checked, 14 * 6);
}

// Single-feature snippets (snippets.json) against jinja2's outputs (expected/snippets.json).
TEST(Jinja, SnippetsMatchJinja2) {
  auto dir = test::data_path("templates");
  Json snippets = Json::parse(read(dir / "snippets.json"));
  Json expected = Json::parse(read(dir / "expected" / "snippets.json"));
  ASSERT_EQ(snippets.size(), expected.size());
  for (auto it = snippets.begin(); it != snippets.end(); ++it) {
    SCOPED_TRACE(it.key());
    const Json& want = expected.at(it.key());
    jinja::Value globals = jinja::from_json(it.value()["v"]);
    globals.set("raise_exception", jinja::Value::function([](std::vector<jinja::Value>& args,
                                                             jinja::KwArgs&) -> jinja::Value {
      fail(ErrorKind::kInvalidArgument, "{}", jinja::to_str(args.at(0)));
    }));
    try {
      std::string got = jinja::Template(it.value()["t"].get<std::string>(), it.key()).render(globals);
      EXPECT_EQ(got, want.value("out", "<expected an error>"));
    } catch (const Error& e) {
      ASSERT_TRUE(want.contains("error")) << e.what();
      EXPECT_NE(std::string(e.what()).find(want["error"].get<std::string>()), std::string::npos)
          << e.what() << "\nexpected: " << want["error"];
    }
  }
}

std::string render(const std::string& src, const Json& vars = Json::object()) {
  return jinja::Template(src, "t").render(jinja::from_json(vars));
}

TEST(Jinja, TrimAndLstripBlocks) {
  EXPECT_EQ(render("a\n  {% if true %}\n  b\n  {% endif %}\nc"), "a\n  b\nc");
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif %}"), "ab");
  EXPECT_EQ(render("x\n  {%+ if true %}y{% endif %}"), "x\n  y");
  EXPECT_EQ(render("{{ 1 }}\n{# c #}\n{{ 2 }}"), "1\n2");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
}

TEST(Jinja, LoopsAndScopes) {
  EXPECT_EQ(render("{% for x in [1,2,3] %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}"
                   "{% endfor %}"),
            "11,22,33");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 3 %}{% break %}{% endif %}"
                   "{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
            "02");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
                   Json::parse(R"({"d": {"b": 1, "a": 2}})")),
            "b=1;a=2;");
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(x=1) %}{% for i in [1,2] %}{% set ns.x = ns.x + i %}"
                   "{% endfor %}{{ ns.x }}"),
            "4");
  EXPECT_EQ(render("{% for x in [1,2,3,4] if x is even %}{{ loop.index }}:{{ x }} {% endfor %}"),
            "1:2 2:4 ");
}

TEST(Jinja, MacrosAndSetBlocks) {
  EXPECT_EQ(render("{% macro f(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ f(1) }}{{ f(2, b=3) }}"),
            "[1B][23]");
  EXPECT_EQ(render("{% set s %}x{{ 1 + 1 }}{% endset %}{{ s | length }}{{ s }}"), "2x2");
}

TEST(Jinja, ExpressionsFollowPython) {
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1 ~ 'a' }}"),
            "3 -4 1 1024 3.5 1a");
  EXPECT_EQ(render("{{ 'yes' if 'b' in 'abc' else 'no' }} {{ 3 not in [1, 2] }} {{ none }}"),
            "yes True None");
  EXPECT_EQ(render("{{ [1, 'a', none, true] }} {{ {'k': 'it\\'s'} }}"), "[1, 'a', None, True] {'k': \"it's\"}");
  EXPECT_EQ(render("{{ 'abcdef'[1:4] }} {{ 'abcdef'[::-1] }} {{ [1,2,3][-1] }} {{ 'héllo'[1] }}"),
            "bcd fedcba 3 é");
  EXPECT_EQ(render("{{ x }}|{{ x is defined }}|{{ y.z is defined }}", Json::parse(R"({"y": {}})")),
            "|False|False");
  EXPECT_EQ(render("{{ 0 or 'd' }} {{ 1 and 2 }} {{ 1 < 2 }} {{ 1.0 }} {{ 0.1 + 0.2 }}"),
            "d 2 True 1.0 0.30000000000000004");
}

TEST(Jinja, StringMethodsAndFilters) {
  EXPECT_EQ(render("{{ ' a b '.strip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' x  y '.split() }}|"
                   "{{ 'abc'.startswith(('x', 'a')) }}|{{ 'a.b.c'.rsplit('.', 1) }}"),
            "a b|['a', 'b', '', 'c']|['x', 'y']|True|['a.b', 'c']");
  EXPECT_EQ(render("{{ '  t  ' | trim }}|{{ [3,1,2] | sort | join('-') }}|{{ 'Ab' | upper }}|"
                   "{{ x | default('dflt') }}|{{ [1,1,2] | unique | list }}|{{ 'a b c' | wordcount }}"),
            "t|1-2-3|AB|dflt|[1, 2]|3");
  Json vars = Json::parse(R"({"ms": [{"role": "user", "c": 1}, {"role": "tool", "c": 2},
                                     {"role": "user", "c": 3}]})");
  EXPECT_EQ(render("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='c') | list }}"
                   "{{ ms | rejectattr('role', '==', 'user') | list | length }}",
                   vars),
            "[1, 3]1");
  EXPECT_EQ(render("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=true, "
                   "separators=(',', ':')) }}",
                   Json::parse(R"({"d": {"b": [1, 2.5], "a": "é\"\n"}})")),
            "{\"b\": [1, 2.5], \"a\": \"é\\\"\\n\"}|{\n  \"b\": [\n    1,\n    2.5\n  ],\n"
            "  \"a\": \"é\\\"\\n\"\n}|{\"a\":\"é\\\"\\n\",\"b\":[1,2.5]}");
  // from_json (llama.cpp's templates: DeepSeek-V3.2's tool-call arguments given as a string).
  EXPECT_EQ(render("{% set a = s | from_json %}{{ a.x[1] }}|{% for k, v in a.items() %}{{ k }}={{ "
                   "v | tojson }};{% endfor %}",
                   Json::parse(R"({"s": "{\"x\": [1, \"two\"], \"y\": null}"})")),
            "two|x=[1, \"two\"];y=null;");
}

TEST(Jinja, ErrorsCarryLineAndColumn) {
  auto message = [](const std::string& src) {
    try {
      render(src);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("ok\n{% if x %}\n{% endfor %}").find("t:3:4"), std::string::npos)
      << message("ok\n{% if x %}\n{% endfor %}");
  EXPECT_NE(message("{{ 1 +\n }}").find("t:2:2: unexpected end of expression"), std::string::npos)
      << message("{{ 1 +\n }}");
  EXPECT_NE(message("a\n  {{ x | nosuchfilter }}").find("t:2:8: No filter named 'nosuchfilter'."),
            std::string::npos)
      << message("a\n  {{ x | nosuchfilter }}");
  EXPECT_NE(message("{{ x.y }}").find("'x' is undefined"), std::string::npos);
  EXPECT_NE(message("{{ '{\"a\": ' | from_json }}").find("t:1:13: from_json: not valid JSON"),
            std::string::npos)
      << message("{{ '{\"a\": ' | from_json }}");
  EXPECT_NE(message("{{ 3 | from_json }}").find("from_json expects a string"), std::string::npos);
  EXPECT_NE(message("{% for x in 3 %}{% endfor %}").find("'int' object is not iterable"),
            std::string::npos);
  EXPECT_NE(message("{{ 'abc").find("unterminated string"), std::string::npos);
  // Hostile templates (they come from model files) fail cleanly instead of overflowing the stack.
  EXPECT_NE(message("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}")
                .find("nested deeper"),
            std::string::npos);
  EXPECT_NE(message("{{ " + std::string(50000, '-') + "1 }}").find("nested deeper"), std::string::npos);
  std::string deep_ifs;
  for (int k = 0; k < 5000; ++k) deep_ifs += "{% if 1 %}";
  EXPECT_NE(message(deep_ifs).find("nested deeper"), std::string::npos);
  EXPECT_NE(message("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("nested deeper"),
            std::string::npos);
}

TEST(ChatTemplate, RaiseExceptionAndStrftime) {
  ChatTemplate t("{% if messages[0].role != 'user' %}{{ raise_exception('user first!') }}{% endif %}"
                 "{{ strftime_now('%d %b %Y') }}");
  t.set_now(fixed_date());
  EXPECT_EQ(t.render(Json::parse(R"([{"role": "user"}])"), Json(), false, "", ""), "14 Mar 2025");
  try {
    t.render(Json::parse(R"([{"role": "system"}])"), Json(), false, "", "");
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "user first!");
  }
}

TEST(ChatTemplate, LoadsFromHfDirectory) {
  test::TempDir dir("chat_template");
  {
    std::ofstream(dir.path() / "tokenizer_config.json")
        << R"({"chat_template": [{"name": "tool_use", "template": "T"},
                                 {"name": "default", "template": "{{ bos_token }}D"}]})";
  }
  EXPECT_EQ(ChatTemplate::from_hf_dir(dir.path().string()).render(Json::array(), Json(), false, "<s>", ""),
            "<s>D");
  { std::ofstream(dir.path() / "chat_template.jinja") << "J{{ messages | length }}"; }
  EXPECT_EQ(ChatTemplate::from_hf_dir(dir.path().string()).render(Json::array({1}), Json(), false, "", ""),
            "J1");
}

TEST(ChatTemplate, LoadsFromGguf) {
  test::TempDir dir("chat_template_gguf");
  auto path = dir.path() / "m.gguf";
  {
    GgufWriter w(path);
    w.set("general.architecture", GgufValue::string("llama"));
    w.set("tokenizer.chat_template",
          GgufValue::string("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"));
    w.write();
  }
  GgufFile gguf = GgufFile::open(path);
  EXPECT_EQ(ChatTemplate::from_gguf(gguf).render(Json::parse(R"([{"role": "user", "content": "hi"}])"),
                                                 Json(), true, "", ""),
            "<user>hi");
  auto bare = dir.path() / "bare.gguf";
  {
    GgufWriter w(bare);
    w.set("general.architecture", GgufValue::string("llama"));
    w.write();
  }
  try {
    ChatTemplate::from_gguf(GgufFile::open(bare));
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bare.gguf: no tokenizer.chat_template"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tandem
