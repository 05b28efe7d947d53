#include "formats/output_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace tandem {
namespace fs = std::filesystem;

fs::path resolve_output_path(const fs::path& path) {
  fs::path target = path;
  for (int hops = 0;; ++hops) {
    struct stat st {};
    if (::lstat(target.c_str(), &st) != 0) {
      if (errno == ENOENT) return target;  // created by the writer
      fail(ErrorKind::kIo, "{}: cannot stat: {}", target.string(), std::strerror(errno));
    }
    if (S_ISREG(st.st_mode)) return target;
    if (!S_ISLNK(st.st_mode)) {
      const char* kind = S_ISDIR(st.st_mode)    ? "a directory"
                         : S_ISCHR(st.st_mode)  ? "a character device"
                         : S_ISBLK(st.st_mode)  ? "a block device"
                         : S_ISFIFO(st.st_mode) ? "a FIFO"
                                                : "not a regular file";
      fail(ErrorKind::kIo, "{}: {}{}; refusing to replace it with a file", path.string(), kind,
           target == path ? "" : fmt::format(" (through {})", target.string()));
    }
    if (hops >= 40) fail(ErrorKind::kIo, "{}: too many levels of symbolic links", path.string());
    std::error_code ec;
    const fs::path link = fs::read_symlink(target, ec);
    if (ec) fail(ErrorKind::kIo, "{}: cannot read the link: {}", target.string(), ec.message());
    target = link.is_absolute() ? link : target.parent_path() / link;
  }
}

OutputFile::OutputFile(const fs::path& path) : path_(resolve_output_path(path)) {
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
    fs::remove(tmp_, ec);
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
  // fclose flushes what the stdio buffer holds: a full disk shows here for small files.
  const bool flushed = std::fflush(file_) == 0 && std::ferror(file_) == 0;
  const int flush_errno = errno;
  const int rc = std::fclose(file_);
  file_ = nullptr;
  if (!flushed || rc != 0) {
    fail(ErrorKind::kIo, "{}: write failed: {}", tmp_.string(),
         std::strerror(flushed ? errno : flush_errno));
  }
  std::error_code ec;
  fs::rename(tmp_, path_, ec);
  if (ec) {
    fail(ErrorKind::kIo, "{}: cannot rename {} into place: {}", path_.string(), tmp_.string(),
         ec.message());
  }
  committed_ = true;
}

void write_output_file(const fs::path& path, std::string_view data) {
  OutputFile out(path);
  out.write(data.data(), data.size());
  out.commit();
}

}  // namespace tandem
