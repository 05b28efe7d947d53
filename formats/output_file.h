// Atomic output for the model writers (GGUF, safetensors): bytes go to <path>.tmp, which replaces
// <path> only on commit(); a writer that throws part-way leaves no half-written model behind.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>

namespace tandem {

class OutputFile {
 public:
  // Creates <path>.tmp; throws Error(kIo) naming it when it cannot.
  explicit OutputFile(std::filesystem::path path);
  ~OutputFile();  // removes the temporary file unless committed
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t n);  // throws Error(kIo)
  void write_zeros(uint64_t n);
  uint64_t written() const { return written_; }
  void commit();  // flush, close, rename over the final path; throws Error(kIo)

 private:
  std::filesystem::path path_;
  std::filesystem::path tmp_;
  std::FILE* file_ = nullptr;
  uint64_t written_ = 0;
  bool committed_ = false;
};

}  // namespace tandem
