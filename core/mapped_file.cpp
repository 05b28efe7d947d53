#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/input_file.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/topology.h"

namespace tandem {

namespace {

// Reads bytes [off, end) of fd into dst + off; "" or the error.
std::string read_range(int fd, uint8_t* dst, size_t off, size_t end, size_t size, Progress* p) {
  while (off < end) {
    const ssize_t got = ::pread(fd, dst + off, end - off, static_cast<off_t>(off));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return fmt::format("read failed at byte {} of {}: {}", off, size,
                         got < 0 ? std::strerror(errno) : "unexpected end of file");
    }
    off += static_cast<size_t>(got);
    p->add(static_cast<uint64_t>(got));
  }
  return {};
}

// Reads fd's size bytes into huge-page memory, with a progress bar on a terminal. A few threads
// share the 64 MiB chunks: the kernel zeroes each new huge page in the faulting thread before the
// copy fills it, and both run at one core's speed per thread. (Plain threads, not the pool: the
// model is loaded before the pool exists, and these only wait on the kernel.)
AlignedBuffer read_into_memory(int fd, size_t size, const std::string& path) {
  AllocOptions opt;
  opt.huge_pages = true;
  AlignedBuffer buf(size, opt);
  auto* dst = buf.as<uint8_t>();
  constexpr size_t kChunk = size_t{64} << 20;
  const size_t chunks = (size + kChunk - 1) / kChunk;
  const size_t n_threads =
      std::min<size_t>({chunks, 8, std::max(1u, std::thread::hardware_concurrency())});
  Progress progress("loading", size);
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::string error;
  auto work = [&] {
    for (size_t c = next++; c < chunks; c = next++) {
      const std::string e =
          read_range(fd, dst, c * kChunk, std::min(size, (c + 1) * kChunk), size, &progress);
      if (!e.empty()) {
        const std::lock_guard<std::mutex> lock(mu);
        if (error.empty()) error = e;
        next = chunks;  // the others stop at their next chunk
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < n_threads; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  if (!error.empty()) fail(ErrorKind::kIo, "{}: {}", path, error);
  progress.finish();
  return buf;
}

}  // namespace

MappedFile MappedFile::open(const std::filesystem::path& path, LoadMode mode) {
  MappedFile file;
  file.path_ = path.string();
  InputFile input = InputFile::open(path);
  file.size_ = static_cast<size_t>(input.size());
  const int fd = input.release();
  // Without transparent huge pages a copy would only double the memory held: map instead.
  if (mode == LoadMode::kCopy && thp_mode() == ThpMode::kNever) {
    log_debug("{}: transparent huge pages are off: mapped", file.path_);
    mode = LoadMode::kMap;
  }
  if (file.size_ > 0 && mode == LoadMode::kCopy) {
    const uint64_t available = meminfo_bytes("MemAvailable");
    if (available == 0 || file.size_ <= available / 10 * 9) {
      try {
        file.copy_ = read_into_memory(fd, file.size_, file.path_);
      } catch (...) {
        ::close(fd);
        throw;
      }
      ::close(fd);
      file.data_ = file.copy_.as<uint8_t>();
      if (LogLevel::kDebug <= log_level()) {  // (huge_page_bytes reads /proc/self/smaps)
        log_debug("{}: {} read into memory ({} in huge pages)", file.path_,
                  format_binary_bytes(file.size_),
                  format_binary_bytes(file.copy_.huge_page_bytes()));
      }
      return file;
    }
    log_info("{}: {} does not fit in the {} of memory available: mapped, pages load on demand",
             file.path_, format_binary_bytes(file.size_), format_binary_bytes(available));
  }
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

void MappedFile::release_pages() const {
  if (data_ == nullptr || !copy_.empty()) return;
  if (::madvise(const_cast<uint8_t*>(data_), size_, MADV_DONTNEED) != 0) {
    log_debug("{}: madvise(MADV_DONTNEED): {}", path_, std::strerror(errno));
  }
}

MappedFile::~MappedFile() {
  if (data_ != nullptr && copy_.empty()) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)),
      copy_(std::move(other.copy_)) {}  // (the copy's address does not change when moved)

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr && copy_.empty()) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
    copy_ = std::move(other.copy_);
  }
  return *this;
}

}  // namespace tandem
