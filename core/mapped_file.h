// A read-only memory-mapped file: how tandem reads model weights (never copied into the heap,
// so a model larger than RAM pages in from the page cache on demand).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace tandem {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps the whole file read-only. Throws Error(kIo) naming the path when it cannot be opened
  // or mapped. An empty file maps to data() == nullptr, size() == 0.
  static MappedFile open(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace tandem
