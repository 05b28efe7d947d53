// A read-only memory-mapped file: how tandem reads model weights. Mapped, a model larger than
// RAM pages in from the page cache on demand; copied (LoadMode::kCopy, when it fits in the memory
// available), its bytes live in anonymous transparent-huge-page memory: the page cache holds a
// file in folios of whatever size it was read in (often 4 KiB pages, each a TLB entry), while a
// 2 MiB page covers 512 of them -- decode streams the experts at DRAM speed and pays for every
// TLB miss.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "core/memory.h"

namespace tandem {

enum class LoadMode {
  kMap,   // mmap the file (read-only, paged in from the page cache)
  kCopy,  // read it into huge-page memory when it fits in 90% of MemAvailable and transparent
          // huge pages are not off, else kMap
};

class MappedFile {
 public:
  MappedFile() = default;
  // Maps (or copies, see LoadMode) the whole file read-only. Throws Error(kIo) naming the path
  // when it cannot be opened, mapped or read. An empty file gives data() == nullptr, size() == 0.
  static MappedFile open(const std::filesystem::path& path, LoadMode mode = LoadMode::kMap);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  bool copied() const { return !copy_.empty(); }  // in anonymous memory, not mapped
  // Mapped: drops the pages this process has touched from its page tables (madvise
  // MADV_DONTNEED on the read-only file mapping), so they leave its resident set; the page cache
  // keeps them (reclaimable) and a later read faults them back in, with the same bytes. For a
  // mapping read once (experts repacked into memory of their own). Copied or empty: nothing.
  void release_pages() const;

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
  AlignedBuffer copy_;  // the bytes when copied (data_ points into it)
};

}  // namespace tandem
