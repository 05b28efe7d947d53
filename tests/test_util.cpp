#include "tests/test_util.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "formats/gguf.h"

namespace tandem::test {

std::vector<float> random_values(int64_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}
namespace fs = std::filesystem;

double max_rel_diff(const std::vector<float>& got, const std::vector<float>& ref) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, std::fabs(double(got[i]) - double(ref[i])));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  return worst / std::max(scale, 1e-30);
}

fs::path data_path(const std::string& relative) {
  fs::path p = fs::path(TANDEM_TEST_DATA_DIR) / relative;
  if (!fs::exists(p)) {
    ADD_FAILURE() << "test data missing: " << p;
    throw std::runtime_error("test data missing: " + p.string());
  }
  return p;
}

TempDir::TempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  path_ = fs::path(TANDEM_BINARY_DIR) / "test-tmp" /
          (tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(path_);
  fs::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

namespace {
std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

CommandResult run_tandem(const std::string& args, const std::string& stdin_text,
                         const std::string& shell_prefix) {
  const char* bin = std::getenv("TANDEM_BIN");
  std::string binary = bin ? bin : (std::string(TANDEM_BINARY_DIR) + "/tandem");
  TempDir tmp("cmd");
  const fs::path out = tmp / "stdout", err = tmp / "stderr";
  std::string input = "/dev/null";
  if (!stdin_text.empty()) {
    input = (tmp / "stdin").string();
    std::ofstream(input, std::ios::binary) << stdin_text;
  }
  const std::string cmd = shell_prefix + binary + " " + args + " <" + input + " >" + out.string() +
                          " 2>" + err.string();
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

std::filesystem::path write_split_gguf(const GgufFile& src, const std::filesystem::path& dir,
                                       const std::string& prefix, int shards) {
  const auto n = static_cast<int64_t>(src.tensors().size());
  std::filesystem::path first;
  for (int i = 0; i < shards; ++i) {
    const std::filesystem::path p =
        dir / fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, i + 1, shards);
    if (i == 0) first = p;
    GgufWriter w(p, src.alignment());
    if (i == 0) {
      for (const auto& [key, value] : src.metadata()) w.set(key, value);
    }
    w.set("split.no", GgufValue::u16(static_cast<uint16_t>(i)));
    w.set("split.count", GgufValue::u16(static_cast<uint16_t>(shards)));
    w.set("split.tensors.count", GgufValue::i32(static_cast<int32_t>(n)));
    for (int64_t j = n * i / shards; j < n * (i + 1) / shards; ++j) {
      const GgufTensorInfo& t = src.tensors()[static_cast<size_t>(j)];
      w.add_tensor_data(t.name, t.dtype,
                        std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim),
                        src.tensor_data(t));
    }
    w.write();
  }
  return first;
}

}  // namespace tandem::test
