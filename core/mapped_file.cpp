#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace tandem {

MappedFile MappedFile::open(const std::filesystem::path& path) {
  MappedFile file;
  file.path_ = path.string();
  const int fd = ::open(file.path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorKind::kIo, "{}: cannot open: {}", file.path_, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(ErrorKind::kIo, "{}: cannot stat: {}", file.path_, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(ErrorKind::kIo, "{}: not a regular file", file.path_);
  }
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail(ErrorKind::kIo, "{}: cannot map {} bytes: {}", file.path_, file.size_,
           std::strerror(err));
    }
    file.data_ = static_cast<const uint8_t*>(p);
  }
  // The mapping keeps its own reference to the file.
  ::close(fd);
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

}  // namespace tandem
