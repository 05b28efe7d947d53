#include "core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace tandem {
namespace {

std::string name_of(const std::filesystem::path& path, std::string_view what) {
  return what.empty() ? path.string() : fmt::format("{} {}", what, path.string());
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

InputFile InputFile::open(const std::filesystem::path& path, std::string_view what) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; regular files
  // ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    fail(ErrorKind::kIo, "{}: cannot open: {}", name_of(path, what), std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(ErrorKind::kIo, "{}: cannot stat: {}", name_of(path, what), std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(ErrorKind::kIo, "{}: not a regular file ({})", name_of(path, what), kind_of(st.st_mode));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return InputFile(fd, static_cast<uint64_t>(st.st_size));
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

InputFile::InputFile(InputFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

InputFile& InputFile::operator=(InputFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

int InputFile::release() {
  return std::exchange(fd_, -1);
}

std::string read_input_file(const std::filesystem::path& path, uint64_t max_bytes,
                            std::string_view what) {
  const InputFile file = InputFile::open(path, what);
  if (file.size() > max_bytes) {
    fail(ErrorKind::kFormat, "{}: {} bytes, more than the {} this kind of file may have",
         name_of(path, what), file.size(), max_bytes);
  }
  // Read to the end rather than to the size fstat gave: /proc files say 0, a log may grow.
  std::string data(static_cast<size_t>(file.size()) + 1, '\0');
  size_t off = 0;
  for (;;) {
    if (off == data.size()) {
      if (off > max_bytes) {
        fail(ErrorKind::kFormat, "{}: more than the {} bytes this kind of file may have",
             name_of(path, what), max_bytes);
      }
      data.resize(std::min<uint64_t>(max_bytes + 1, uint64_t{data.size()} * 2 + 4096));
    }
    const ssize_t got = ::read(file.fd(), data.data() + off, data.size() - off);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      fail(ErrorKind::kIo, "{}: read failed at byte {}: {}", name_of(path, what), off,
           std::strerror(errno));
    }
    if (got == 0) break;
    off += static_cast<size_t>(got);
  }
  if (off > max_bytes) {
    fail(ErrorKind::kFormat, "{}: more than the {} bytes this kind of file may have",
         name_of(path, what), max_bytes);
  }
  data.resize(off);
  return data;
}

}  // namespace tandem
