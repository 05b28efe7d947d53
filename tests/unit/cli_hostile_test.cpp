// Hostile input through the real binary (docs/hostile-input.md): inputs that could crash tandem,
// hang it, take all its memory or give silent garbage. Each is refused with one line naming the
// file, key or flag (exit code 1), or handled (clamped, written through). The commands run under
// a memory limit and a timeout, so that a regression fails the test instead of the machine.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// Bounds for the commands under test: 3 GB of address space, 60 s.
const std::string kLimits = "ulimit -v 3000000; timeout 60 ";

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n + (!s.empty() && s.back() != '\n');
}

// The error: stderr's last line, which must begin "tandem: " (`run` reports its prompt first).
std::string error_line(const std::string& err) {
  std::string e = err;
  while (!e.empty() && e.back() == '\n') e.pop_back();
  const std::string line = e.substr(e.rfind('\n') == std::string::npos ? 0 : e.rfind('\n') + 1);
  EXPECT_TRUE(line.starts_with("tandem: ")) << err;
  return line;
}

// The tiny DeepSeek-V2 model of the README (2.3 MB), synthesized once per test program.
const fs::path& tiny_model() {
  static test::TempDir dir("hostile-model");
  static const fs::path path = [] {
    const fs::path p = dir / "tiny.gguf";
    const test::CommandResult r = test::run_tandem(
        "synth --arch deepseek2 --preset tiny --format gguf --type q4_k_m -o " + p.string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return p;
  }();
  return path;
}

// A copy of the tiny model with metadata replaced (`set`), tensors dropped (`drop`) and tensor
// bytes changed (`edit`).
struct GgufEdit {
  std::vector<std::pair<std::string, GgufValue>> set;
  std::function<bool(const std::string&)> drop;
  std::function<void(const GgufTensorInfo&, std::vector<uint8_t>&)> edit;
};

GgufEdit set_key(const std::string& key, GgufValue value) {
  GgufEdit e;
  e.set.emplace_back(key, std::move(value));
  return e;
}

fs::path edited_model(const test::TempDir& dir, const std::string& name, const GgufEdit& e) {
  const GgufFile src = GgufFile::open(tiny_model());
  const fs::path out = dir / name;
  GgufWriter w(out, src.alignment());
  for (const auto& [key, value] : src.metadata()) w.set(key, value);
  for (const auto& [key, value] : e.set) w.set(key, value);
  std::vector<std::vector<uint8_t>> data;
  data.reserve(src.tensors().size());
  for (const GgufTensorInfo& t : src.tensors()) {
    if (e.drop && e.drop(t.name)) continue;
    const uint8_t* p = src.tensor_data(t);
    data.emplace_back(p, p + t.nbytes);
    if (e.edit) e.edit(t, data.back());
    w.add_tensor_data(t.name, t.dtype,
                      std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim),
                      data.back().data());
  }
  w.write();
  return out;
}

std::string run_tiny(const std::string& flags) {
  return "run -m " + tiny_model().string() + " -p hi -n 2 --threads 1 " + flags;
}

// Item 1: thread counts past the machine. 400 threads under a 3 GB address-space limit ended in
// std::terminate (no stack for thread ~370); now the count is clamped with a warning.
TEST(Hostile, ThreadsPastTheMachineAreClamped) {
  const test::CommandResult r = test::run_tandem(
      "roofline --threads 400 --size-mb 8 --seconds 0.001 --repetitions 1 --no-sweep", "", kLimits);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--threads 400: more than the"), std::string::npos) << r.err;
  const test::CommandResult bad = test::run_tandem("roofline --threads -3");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--threads: -3 is not a thread count"), std::string::npos) << bad.err;
}

// Item 2: placement-rule regexes. A 100,000-character pattern and 2,000 nested groups overflowed
// the stack of std::regex (SIGSEGV); (.*.*.*.*)*X never returned.
TEST(Hostile, PlacementRegexesAreBounded) {
  test::TempDir dir("hostile-rules");
  const fs::path long_rule = dir / "long.yaml";
  std::ofstream(long_rule) << "- match: {name: '" << std::string(100000, 'a') << "'}\n"
                           << "  device: cpu\n";
  struct Case {
    fs::path file;
    const char* message;
  };
  for (const Case& c : {Case{long_rule, "more than 1024"},
                        Case{test::data_path("hostile/rules_nested_groups.yaml"), "parentheses"},
                        Case{test::data_path("hostile/rules_backtracking.yaml"), "match limit"}}) {
    const test::CommandResult r =
        test::run_tandem(run_tiny("--rules " + c.file.string()), "", kLimits);
    EXPECT_EQ(r.exit_code, 1) << c.file << "\n" << r.err;
    EXPECT_NE(error_line(r.err).find("match.name"), std::string::npos) << r.err;
    EXPECT_NE(error_line(r.err).find(c.message), std::string::npos) << r.err;
  }
  // The issue's own pattern: PCRE2 finds the X it needs absent from every name, at once.
  const test::CommandResult r = test::run_tandem(
      run_tiny("--rules " + test::data_path("hostile/rules_issue_pattern.yaml").string()), "",
      kLimits);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Item 3: synth / convert -o wrote PATH.tmp and renamed it over PATH, whatever PATH was.
TEST(Hostile, OutputsDoNotReplaceDevicesOrLinks) {
  test::TempDir dir("hostile-out");
  const std::string synth = "synth --arch deepseek2 --preset tiny --format gguf --type q4_k_m -o ";
  // A symlink is written through: the link stays, its target becomes the model.
  std::ofstream(dir / "target.gguf") << "old";
  fs::create_symlink(dir / "target.gguf", dir / "link.gguf");
  test::CommandResult r = test::run_tandem(synth + (dir / "link.gguf").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(dir / "link.gguf"));
  EXPECT_NO_THROW(GgufFile::open(dir / "target.gguf"));
  // A FIFO (or a device: /dev/null as root) is refused and left as it was.
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0) << std::strerror(errno);
  for (const std::string& cmd :
       {synth + (dir / "fifo").string(), "convert -m " + tiny_model().string() +
                                             " --cpu-experts int8 -o " + (dir / "fifo").string()}) {
    r = test::run_tandem(cmd, "", kLimits);
    EXPECT_EQ(r.exit_code, 1) << cmd;
    EXPECT_NE(r.err.find("a FIFO; refusing to replace it"), std::string::npos) << r.err;
    EXPECT_TRUE(fs::is_fifo(dir / "fifo"));
  }
  // A character device made here (root may make one; elsewhere this part is skipped).
  if (::mknod((dir / "null").c_str(), S_IFCHR | 0600, makedev(1, 3)) == 0) {
    r = test::run_tandem(synth + (dir / "null").string(), "", kLimits);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("a character device"), std::string::npos) << r.err;
    EXPECT_TRUE(fs::is_character_file(dir / "null"));
  }
}

// Item 4: a chat template in a GGUF is untrusted: nested range() loops ran for hours and
// "x" * 10**9 took all memory. Each now stops at a budget naming the template line.
TEST(Hostile, ChatTemplatesFromAModelAreBudgeted) {
  test::TempDir dir("hostile-template");
  struct Case {
    const char* name;
    const char* source;
    const char* message;
  };
  for (const Case& c : {
           Case{"loops",
                "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                "{% endfor %}",
                "loop iterations"},
           Case{"product", "\n{{ 'x' * 1000000000 }}", "a string of 1000000000 x 1 bytes"},
           Case{"doubling",
                "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                "strings and lists made or copied"},
           Case{"append",
                "{% set ns = namespace(l=[]) %}{% for i in range(1000000) %}"
                "{% set ns.l = ns.l + [i] %}{% endfor %}",
                "bytes of strings and lists"},
       }) {
    const fs::path model =
        edited_model(dir, std::string(c.name) + ".gguf",
                     set_key("tokenizer.chat_template", GgufValue::string(c.source)));
    const test::CommandResult r = test::run_tandem(
        "run -m " + model.string() + " --chat -p hi -n 1 --threads 1", "", kLimits);
    EXPECT_EQ(r.exit_code, 1) << c.name << "\n" << r.err;
    EXPECT_NE(r.err.find("chat_template:"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.name << ": " << r.err;
    EXPECT_NE(r.err.find("render budget"), std::string::npos) << r.err;
  }
}

// Item 5: a 40-byte trace claiming 4096 layers x 65536 experts x top-k 65536 and no records:
// `sim` and `profile --trace` sized their tables from it (gigabytes) before failing.
TEST(Hostile, TraceHeadersAreCheckedBeforeSizingAnything) {
  test::TempDir dir("hostile-trace");
  const fs::path trace = test::data_path("hostile/huge_header.trace");
  ASSERT_EQ(fs::file_size(trace), 40u);
  nlohmann::json profile = {{"format", "tandem-cost-model"},
                            {"version", 1},
                            {"cpu_expert", {{1, 0.001}}},
                            {"transfer_seconds", 0.001}};
  std::ofstream(dir / "p.json") << profile.dump();
  for (const std::string& cmd :
       {"sim --trace " + trace.string() + " --profile " + (dir / "p.json").string(),
        "profile -m " + tiny_model().string() + " --tokens 1 --repeats 1 --trace " +
            trace.string() + " -o " + (dir / "q.json").string()}) {
    const test::CommandResult r = test::run_tandem(cmd, "", "ulimit -v 1000000; timeout 60 ");
    EXPECT_EQ(r.exit_code, 1) << cmd << "\n" << r.err;
    EXPECT_NE(r.err.find("4096 MoE layers x 65536 experts is more than"), std::string::npos)
        << r.err;
  }
}

// Item 6: /dev/zero, a FIFO or a directory given as a file was read until memory ran out (8 GB
// before "unexpected end of input"), or read as empty text.
TEST(Hostile, InputFilesMustBeRegularFiles) {
  test::TempDir dir("hostile-in");
  fs::create_directories(dir / "hf");
  fs::create_symlink("/dev/zero", dir / "hf" / "config.json");
  const std::string m = "-m " + tiny_model().string() + " ";
  const std::string d = (dir / "hf").string();
  struct Case {
    std::string cmd;
    std::string message;
  };
  for (const Case& c : {
           Case{"tokenize " + m + "-f /dev/zero", "-f /dev/zero: not a regular file"},
           Case{"tokenize " + m + "-f " + d, "a directory"},
           Case{"perplexity " + m + "-f /dev/zero", "-f /dev/zero: not a regular file"},
           Case{"trace " + m + "-f /dev/zero -o " + (dir / "t").string(), "not a regular file"},
           Case{"calibrate " + m + "-f /dev/zero -o " + (dir / "r").string(), "not a regular file"},
           Case{run_tiny("--rules /dev/zero"), "--rules /dev/zero: not a regular file"},
           Case{run_tiny("--rules " + d), "--rules " + d + ": not a regular file (a directory)"},
           Case{"bench " + m + "-p 1 -n 1 -r 1 --roofline /dev/zero", "--roofline /dev/zero"},
           Case{"show -m " + d, "config.json: not a regular file (a character device)"},
           Case{"run -m " + d + " -p hi", "config.json: not a regular file"},
       }) {
    const test::CommandResult r = test::run_tandem(c.cmd, "", kLimits);
    EXPECT_EQ(r.exit_code, 1) << c.cmd << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.cmd << "\n" << r.err;
  }
}

// Item 8: a config that declares fewer layers or no shared experts than the tensors present ran
// a truncated model; a NaN in a norm weight turned the text into "!!!".
TEST(Hostile, ConfigAndWeightsMustAgree) {
  test::TempDir dir("hostile-agree");
  const GgufFile src = GgufFile::open(tiny_model());
  const int64_t layers = src.get_int("deepseek2.block_count", 0);
  ASSERT_GT(layers, 1);
  struct Case {
    const char* name;
    GgufEdit edit;
    const char* message;
  };
  GgufEdit nan_norm;
  nan_norm.edit = [](const GgufTensorInfo& t, std::vector<uint8_t>& bytes) {
    if (t.name != "blk.0.attn_norm.weight") return;
    const float nan = std::nanf("");
    std::memcpy(bytes.data() + 4, &nan, 4);
  };
  const Case cases[] = {
      {"fewer_layers.gguf", set_key("deepseek2.block_count", GgufValue::u32(uint32_t(layers - 1))),
       "not read: 'blk."},
      {"no_shared.gguf", set_key("deepseek2.expert_shared_count", GgufValue::u32(0)), "shexp"},
      {"nan_norm.gguf", nan_norm, "tensor 'blk.0.attn_norm.weight' holds nan at index 1"},
  };
  for (const Case& c : cases) {
    const fs::path model = edited_model(dir, c.name, c.edit);
    const test::CommandResult r =
        test::run_tandem("run -m " + model.string() + " -p hi -n 2 --threads 1", "", kLimits);
    EXPECT_EQ(r.exit_code, 1) << c.name << "\n" << r.err << r.out;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.name << ": " << r.err;
  }
}

// A context past the model's trained positions is a warning; one past the memory is an error
// before anything is allocated (not gigabytes touched); a negative one names the flag.
TEST(Hostile, ContextSizesAreChecked) {
  const std::string base = "run -m " + tiny_model().string() + " --tokens 1,2,3 -n 2 --threads 2";
  test::CommandResult r = test::run_tandem(base + " --ctx 8192", "", kLimits);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("--ctx 8192 is past the 4096 positions the model was trained for"),
            std::string::npos)
      << r.err;
  r = test::run_tandem(base + " --ctx 100000000000", "", kLimits);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(error_line(r.err).find("GiB"), std::string::npos) << r.err;
  r = test::run_tandem(base + " --ctx -5", "", kLimits);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(error_line(r.err).find("--ctx"), std::string::npos) << r.err;
  // The recurrent-state checkpoints' flags (hybrid models) are checked the same way.
  for (const char* flag : {" --checkpoints -1", " --checkpoints 5000", " --checkpoint-every -5"}) {
    r = test::run_tandem(base + flag, "", kLimits);
    EXPECT_EQ(r.exit_code, 1) << flag;
    EXPECT_NE(error_line(r.err).find(std::string(flag).substr(1, 13)), std::string::npos)
        << r.err;
  }
}

// Item 9: --link 0.000001 (GB/s) emulated a link on which one expert's copy takes days.
TEST(Hostile, AbsurdLinkFiguresAreRefused) {
  for (const char* link : {"0.000001", "1e9", "10,1e12"}) {
    const test::CommandResult r =
        test::run_tandem(run_tiny(std::string("--accel host --vram-budget 256M --link ") + link),
                         "", kLimits);
    EXPECT_EQ(r.exit_code, 1) << link;
    EXPECT_NE(r.err.find(std::string("--link '") + link + "'"), std::string::npos) << r.err;
  }
}

// Item 10: `profile -o` on a full disk printed "wrote" and exited 0. A file size limit
// (ulimit -f: writes past it fail with EFBIG) stands for the full disk here.
TEST(Hostile, WriteFailuresAreErrors) {
  test::TempDir dir("hostile-write");
  const std::string full = "trap '' XFSZ; ulimit -f 1; ";
  test::CommandResult r =
      test::run_tandem("profile -m " + tiny_model().string() + " --tokens 1,2 --repeats 1 -o " +
                           (dir / "p.json").string(),
                       "", full);
  EXPECT_EQ(r.exit_code, 1) << r.err << r.out;
  EXPECT_NE(r.err.find("write failed"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("wrote"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "p.json"));
  r = test::run_tandem("trace --synthetic --prompts 64 -o " + (dir / "t.trace").string(), "", full);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("write failed"), std::string::npos) << r.err;
  // Standard output is an output file too.
  const char* bin = std::getenv("TANDEM_BIN");
  const std::string cmd = std::string(bin ? bin : TANDEM_BINARY_DIR "/tandem") +
                          " info >/dev/full 2>" + (dir / "err").string();
  const int status = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  std::ifstream in(dir / "err");
  const std::string err((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(err.find("standard output: write failed"), std::string::npos) << err;
}

// Item 11: values that were accepted: NaN sampling parameters, a negative temperature, a seed past
// 2^64 (strtoull saturates), "-1" for an unsigned option (it wraps to 2^64 - 1), more pinned
// experts than the model has, GGUF scalar keys stored as arrays or booleans.
TEST(Hostile, NumbersAreValidated) {
  test::TempDir dir("hostile-numbers");
  const std::string sim = "sim --trace t --profile p ";
  struct Case {
    std::string cmd;
    std::string message;
  };
  for (const Case& c : {
           Case{run_tiny("--temp nan"), "--temp: nan is not a finite number"},
           Case{run_tiny("--temp -1"), "--temp: -1 is below 0"},
           Case{run_tiny("--top-p nan"), "--top-p: nan is not a finite number"},
           Case{run_tiny("--min-p nan"), "--min-p: nan is not a finite number"},
           Case{run_tiny("--top-p 2"), "--top-p: 2 is not in [0, 1]"},
           Case{run_tiny("--seed 18446744073709551616"),
                "--seed: 18446744073709551616 is not an integer in 0..18446744073709551615"},
           Case{run_tiny("--seed -1"), "--seed: -1 is not an integer"},
           Case{run_tiny("--accel host --gpu-experts 100000"),
                "--gpu-experts 100000: the model has"},
           Case{sim + "--expert-bytes -1", "--expert-bytes: -1 is not an integer"},
           Case{sim + "--prefetch-size -1", "--prefetch-size: -1 is below 0"},
           Case{sim + "--mrs-alpha nan", "--mrs-alpha: nan is not a finite number"},
           Case{sim + "--dali-w 1000000000", "--dali-w: 1000000000 is not in [1, 4096]"},
       }) {
    const test::CommandResult r = test::run_tandem(c.cmd, "", kLimits);
    EXPECT_EQ(r.exit_code, 1) << c.cmd << "\n" << r.err;
    EXPECT_NE(error_line(r.err).find(c.message), std::string::npos) << c.cmd << "\n" << r.err;
  }
  const fs::path arr = edited_model(
      dir, "array.gguf",
      set_key("deepseek2.expert_count",
              GgufValue::array(GgufType::kUint32, {GgufValue::u32(8), GgufValue::u32(8)})));
  const fs::path boolean =
      edited_model(dir, "bool.gguf", set_key("deepseek2.expert_count", GgufValue::boolean(true)));
  for (const auto& [model, type] : {std::pair{arr, "array"}, std::pair{boolean, "bool"}}) {
    const test::CommandResult r = test::run_tandem("show -m " + model.string());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(
        r.err.find("key 'deepseek2.expert_count': expected an integer, got " + std::string(type)),
        std::string::npos)
        << r.err;
  }
}

// Item 11: residual vectors naming layers the model does not have were accepted.
TEST(Hostile, ResidualLayersMustBeTheModels) {
  test::TempDir dir("hostile-residuals");
  const fs::path res = dir / "r.json";
  test::CommandResult r = test::run_tandem("calibrate -m " + tiny_model().string() + " -f " +
                                           test::data_path("hostile/text.txt").string() +
                                           " --ctx 16 -o " + res.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(std::ifstream(res));
  ASSERT_GE(j["moe_layers"].size(), 2u);
  j["moe_layers"].back() = 999;
  std::ofstream(res) << j.dump();
  r = test::run_tandem(run_tiny("--accel host --prefetch residual --residuals " + res.string()));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("MoE layers"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("999"), std::string::npos) << r.err;
}

// Item 12: messages. GGUF strings reached the terminal raw (ANSI escapes, newlines; a NUL cut the
// message); CLI parse errors exited 104-114 with two lines; --accel host on a model without MoE
// layers failed an internal check; -m of a missing path blamed the format.
TEST(Hostile, MessagesAreOneSafeLine) {
  test::TempDir dir("hostile-messages");
  const fs::path evil =
      edited_model(dir, "evil.gguf",
                   set_key("general.architecture",
                           GgufValue::string(std::string("\x1b[31mred\nsecond line\0after", 28))));
  test::CommandResult r = test::run_tandem("show -m " + evil.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\\x1b[31mred\\nsecond line\\x00after"), std::string::npos) << r.err;

  for (const char* args : {"run --no-such-flag", "run -m", "sim --trace", "no-such-command"}) {
    r = test::run_tandem(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_EQ(count_lines(r.err), 1) << args << ": " << r.err;
    EXPECT_TRUE(r.err.starts_with("tandem: ")) << r.err;
  }
  EXPECT_EQ(test::run_tandem("--help").exit_code, 0);
  EXPECT_EQ(test::run_tandem("--version").exit_code, 0);

  r = test::run_tandem("run -m " + (dir / "missing.gguf").string() + " -p hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("missing.gguf: no such file or directory"), std::string::npos) << r.err;

  // A value of the wrong type names its key (was "expected an array, got string" alone, or
  // nlohmann's "[json.exception.type_error.302] ...").
  const fs::path tokens =
      edited_model(dir, "tokens.gguf", set_key("tokenizer.ggml.tokens", GgufValue::string("x")));
  r = test::run_tandem("tokenize -m " + tokens.string() + " -p hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("key 'tokenizer.ggml.tokens': expected an array, got string"),
            std::string::npos)
      << r.err;
  nlohmann::json profile = {{"format", "tandem-cost-model"}, {"version", 1},
                            {"cpu_expert", {{1, 0.001}}}, {"transfer_seconds", 0.001},
                            {"expert_counts", {{1, 2}, "x"}}};
  std::ofstream(dir / "p.json") << profile.dump();
  r = test::run_tandem(run_tiny("--accel host --vram-budget 256M --gpu-experts 1 --profile " +
                                (dir / "p.json").string()));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(error_line(r.err).find("key 'expert_counts[1]' is not a list"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace tandem
