// Helpers shared by tests: where the test data and the tandem binary are, temporary directories,
// running the CLI. Test data lives in tests/data (copied from ../shared so a fresh clone tests
// itself); a missing file fails the test, it never skips it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace tandem {
class GgufFile;
}

namespace tandem::test {

// n values drawn from N(0, sigma^2) by std::mt19937(seed): the random inputs of kernel tests.
std::vector<float> random_values(int64_t n, uint32_t seed, float sigma = 1.0f);

// max |got - ref| / max |ref| over the values (the relative error of a whole output).
double max_rel_diff(const std::vector<float>& got, const std::vector<float>& ref);

// tests/data/<relative>; fails the current test (ADD_FAILURE + throws) when it does not exist.
std::filesystem::path data_path(const std::string& relative);

// A fresh directory under the build tree, removed when the object goes away.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "t");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `tandem <args>` (the binary from TANDEM_BIN) and captures both streams; standard input
// is `stdin_text` (empty: /dev/null). `shell_prefix` goes before the binary on the sh command
// line: limits for hostile-input tests ("ulimit -v 2000000; timeout 30 ").
CommandResult run_tandem(const std::string& args, const std::string& stdin_text = "",
                         const std::string& shell_prefix = "");

// Writes `src` as a split GGUF in `dir`, as llama.cpp's gguf-split does: `shards` files named
// <prefix>-0000i-of-0000N.gguf, the first with all of src's metadata, each with split.no (u16,
// from 0), split.count (u16) and split.tensors.count (i32), src's tensors in order spread evenly
// over them. Returns the first shard's path.
std::filesystem::path write_split_gguf(const GgufFile& src, const std::filesystem::path& dir,
                                       const std::string& prefix, int shards);

}  // namespace tandem::test
