#include "formats/output_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace tandem {

OutputFile::OutputFile(std::filesystem::path path) : path_(std::move(path)) {
  tmp_ = path_;
  tmp_ += ".tmp";
  file_ = std::fopen(tmp_.c_str(), "wb");
  if (file_ == nullptr) {
    fail(ErrorKind::kIo, "{}: cannot create: {}", tmp_.string(), std::strerror(errno));
  }
}

OutputFile::~OutputFile() {
  if (file_ != nullptr) std::fclose(file_);
  if (!committed_) {
    std::error_code ec;
    std::filesystem::remove(tmp_, ec);
  }
}

void OutputFile::write(const void* data, size_t n) {
  if (n != 0 && std::fwrite(data, 1, n, file_) != n) {
    fail(ErrorKind::kIo, "{}: write failed: {}", tmp_.string(), std::strerror(errno));
  }
  written_ += n;
}

void OutputFile::write_zeros(uint64_t n) {
  static const char kZeros[4096] = {};
  while (n > 0) {
    const uint64_t chunk = std::min<uint64_t>(n, sizeof(kZeros));
    write(kZeros, chunk);
    n -= chunk;
  }
}

void OutputFile::commit() {
  const int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) fail(ErrorKind::kIo, "{}: write failed: {}", tmp_.string(), std::strerror(errno));
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) {
    fail(ErrorKind::kIo, "{}: cannot rename {} into place: {}", path_.string(), tmp_.string(),
         ec.message());
  }
  committed_ = true;
}

}  // namespace tandem
