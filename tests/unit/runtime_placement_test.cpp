// Placement rules: YAML parsing (errors name file:line and the key), first-match-wins resolution
// over a golden model's modules, the defaults, and the no-accelerator fallback.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/error.h"
#include "model/weights.h"
#include "runtime/placement.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

std::string error_of(const std::string& yaml) {
  try {
    rt::parse_placement_rules(yaml, "r.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Placement, ParsesRules) {
  const auto rules = rt::parse_placement_rules(
      "# pin layer 1\n"
      "- match:\n"
      "    name: 'layers\\.1\\.experts'\n"
      "  device: accel\n"
      "  op: fused\n"
      "- match: {module: moe}\n"
      "  device: cpu\n"
      "  cpu_experts: int4\n",
      "r.yaml");
  ASSERT_EQ(rules.size(), 2u);
  EXPECT_EQ(rules[0].name, "layers\\.1\\.experts");
  EXPECT_TRUE(rules[0].has_device);
  EXPECT_EQ(rules[0].device, rt::Where::kAccel);
  EXPECT_EQ(rules[0].op, "fused");
  EXPECT_EQ(rules[0].origin, "r.yaml:2");
  EXPECT_EQ(rules[1].module, "moe");
  EXPECT_EQ(rules[1].cpu_experts, "int4");
  EXPECT_EQ(rules[1].origin, "r.yaml:6");
  EXPECT_TRUE(rt::parse_placement_rules("", "e.yaml").empty());
}

TEST(Placement, ErrorsNameFileLineAndKey) {
  EXPECT_NE(error_of("- match: {module: experts}\n  devcie: accel\n").find("r.yaml:2"),
            std::string::npos);
  EXPECT_NE(error_of("- match: {module: experts}\n  devcie: accel\n").find("'devcie'"),
            std::string::npos);
  EXPECT_NE(error_of("- match: {modul: experts}\n").find("match.modul"), std::string::npos);
  EXPECT_NE(error_of("- match: {module: mlp}\n").find("'mlp'"), std::string::npos);
  EXPECT_NE(error_of("- match: {name: '('}\n").find("regex"), std::string::npos);
  EXPECT_NE(error_of("- match: {module: experts}\n  device: gpu\n").find("r.yaml:2"),
            std::string::npos);
  EXPECT_NE(error_of("- device: cpu\n").find("no 'match'"), std::string::npos);
  EXPECT_NE(error_of("match: x\n").find("list"), std::string::npos);
  EXPECT_NE(error_of("- match: [\n").find("r.yaml:"), std::string::npos);
  EXPECT_NE(error_of("- match: {module: experts}\n  dtype: f33\n").find("f33"), std::string::npos);
  EXPECT_NE(error_of("- match: {module: experts}\n  cpu_experts: int3\n").find("cpu_experts"),
            std::string::npos);
}

TEST(Placement, LoadFileErrors) {
  test::TempDir dir;
  EXPECT_THROW(rt::load_placement_rules(dir / "missing.yaml"), Error);
  const auto path = dir / "bad.yaml";
  std::ofstream(path) << "- match: {module: experts}\n  speed: fast\n";
  try {
    rt::load_placement_rules(path);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path.string() + ":2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'speed'"), std::string::npos);
  }
}

TEST(Placement, DefaultsAndFirstMatchWins) {
  const LoadedModel lm = load_model(test::data_path("golden/deepseek3.gguf"));
  const rt::Placement def = rt::resolve_placement(lm, {}, true, "native");
  ASSERT_NE(def.find("layers.0.ffn"), nullptr);  // the dense leading layer
  EXPECT_EQ(def.find("layers.0.ffn")->device, rt::Where::kAccel);
  EXPECT_EQ(def.find("layers.1.attention")->device, rt::Where::kAccel);
  EXPECT_EQ(def.find("layers.1.experts")->device, rt::Where::kCpu);
  EXPECT_EQ(def.find("layers.1.experts")->dtype, "f32");
  EXPECT_TRUE(def.shared_on_accel(1));
  EXPECT_FALSE(def.experts_pinned(1));
  EXPECT_FALSE(def.experts_cpu_only(1));
  EXPECT_EQ(def.find("lm_head")->device, rt::Where::kAccel);
  EXPECT_EQ(def.find("layers.0.experts"), nullptr);

  const auto rules = rt::parse_placement_rules(
      "- match: {name: 'layers\\.2\\.experts'}\n"
      "  device: accel\n"
      "- match: {module: moe}\n"
      "  device: cpu\n"
      "  cpu_experts: int8\n"
      "- match: {module: experts}\n"
      "  device: accel\n",
      "p.yaml");
  const rt::Placement p = rt::resolve_placement(lm, rules, true, "native");
  EXPECT_TRUE(p.experts_pinned(2));
  EXPECT_EQ(p.find("layers.2.experts")->rule, "p.yaml:1");
  EXPECT_FALSE(p.experts_pinned(1));  // rule 2 matched first, not rule 3
  EXPECT_TRUE(p.experts_cpu_only(1));
  EXPECT_EQ(p.find("layers.1.experts")->cpu_experts, "int8");
  EXPECT_FALSE(p.shared_on_accel(1));  // module moe covers the shared experts
  // The router follows the dense part (on the accelerator), whatever the moe rule said.
  EXPECT_EQ(p.find("layers.1.router")->device, rt::Where::kAccel);
  EXPECT_EQ(p.find("layers.1.router")->rule, "p.yaml:3 (with the dense part)");
  EXPECT_EQ(p.dense_device(), rt::Where::kAccel);
  EXPECT_EQ(p.find("layers.1.attention")->rule, "default");
  EXPECT_NE(p.format().find("layers.2.experts"), std::string::npos);

  const rt::Placement none = rt::resolve_placement(lm, rules, false, "native");
  EXPECT_FALSE(none.experts_pinned(2));
  EXPECT_FALSE(none.shared_on_accel(2));
  EXPECT_EQ(none.find("lm_head")->device, rt::Where::kCpu);
  EXPECT_EQ(none.dense_device(), rt::Where::kCpu);

  // The dense part moves as a whole: all of it to the CPU is a placement, a part of it an error
  // naming a module on each side and the rule that put it there.
  const rt::Placement dense_cpu = rt::resolve_placement(
      lm,
      rt::parse_placement_rules(
          "- {match: {name: 'embed|lm_head|layers\\.\\d+\\.(attention|ffn)'}, device: cpu}\n",
          "d.yaml"),
      true, "native");
  EXPECT_EQ(dense_cpu.dense_device(), rt::Where::kCpu);
  EXPECT_EQ(dense_cpu.find("layers.2.router")->device, rt::Where::kCpu);
  EXPECT_TRUE(dense_cpu.shared_on_accel(2));
  try {
    rt::resolve_placement(
        lm, rt::parse_placement_rules("- {match: {module: dense}, device: cpu}\n", "s.yaml"), true,
        "native");
    FAIL() << "a split dense part was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("layers.0.ffn on the cpu (s.yaml:1)"), std::string::npos)
        << e.what();
  }
}

// A rules file is user input: its regexes are compiled and matched by PCRE2 with bounds (a long or
// deeply nested pattern must not overflow the stack, an exponential one must return), and a key
// that is no scalar is a message, not yaml-cpp's bare exception.
TEST(Placement, RegexesAndKeysAreBounded) {
  const std::string long_pattern = "- match: {name: '" + std::string(100000, 'a') + "'}\n";
  EXPECT_NE(
      error_of(long_pattern).find("r.yaml:1: match.name is 100000 bytes long, more than 1024"),
      std::string::npos)
      << error_of(long_pattern);
  const std::string nested =
      "- match: {name: '" + std::string(500, '(') + "a" + std::string(500, ')') + "'}\n";
  EXPECT_NE(error_of(nested).find("parentheses are too deeply nested"), std::string::npos)
      << error_of(nested);
  EXPECT_NE(error_of("- match: {{a: b}: experts}\n").find("r.yaml:1: bad YAML"), std::string::npos)
      << error_of("- match: {{a: b}: experts}\n");
  EXPECT_NE(error_of("- {[1]: 2}\n").find("r.yaml:1: bad YAML"), std::string::npos);

  const LoadedModel lm = load_model(test::data_path("golden/deepseek3.gguf"));
  const auto slow = rt::parse_placement_rules("- match: {name: '(.*.*.*.*)*[XYZ]'}\n", "s.yaml");
  try {
    rt::resolve_placement(lm, slow, true, "native");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("s.yaml:1: match.name '(.*.*.*.*)*[XYZ]' on 'layers."),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("match limit exceeded"), std::string::npos) << e.what();
  }
  // Whole-name matches, as before: a pattern matching a prefix only does not apply.
  const auto prefix = rt::parse_placement_rules(
      "- match: {name: 'layers\\.1'}\n"
      "  device: cpu\n",
      "p.yaml");
  EXPECT_EQ(rt::resolve_placement(lm, prefix, true, "native").find("layers.1.attention")->rule,
            "default");
}

}  // namespace
}  // namespace tandem
