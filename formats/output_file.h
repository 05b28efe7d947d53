// Atomic output for the files tandem writes (models, traces, profiles, residuals): bytes go to
// <path>.tmp, which replaces <path> only on commit(); a writer that throws part-way leaves no
// half-written file behind. Every write and the close are checked (a full disk is an error, not
// a truncated file reported as written). An existing <path> that is a symlink is written through
// (its target is replaced, the link kept); one that is not a regular file (a device such as
// /dev/null, a FIFO, a directory) is refused rather than renamed over.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string_view>

namespace tandem {

// The file an output path names: `path` itself, or where its symlinks lead. Throws Error(kIo)
// naming `path` when that exists and is not a regular file.
std::filesystem::path resolve_output_path(const std::filesystem::path& path);

class OutputFile {
 public:
  // Creates <target>.tmp beside the resolved target; throws Error(kIo) naming it when it cannot.
  explicit OutputFile(const std::filesystem::path& path);
  ~OutputFile();  // removes the temporary file unless committed
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t n);  // throws Error(kIo)
  void write_zeros(uint64_t n);
  uint64_t written() const { return written_; }
  void commit();  // flush, close, rename over the final path; throws Error(kIo)
  const std::filesystem::path& path() const { return path_; }  // the resolved target

 private:
  std::filesystem::path path_;
  std::filesystem::path tmp_;
  std::FILE* file_ = nullptr;
  uint64_t written_ = 0;
  bool committed_ = false;
};

// Writes `data` as the whole of `path` through an OutputFile.
void write_output_file(const std::filesystem::path& path, std::string_view data);

}  // namespace tandem
