// Input files given on the command line or named by a model (config.json, --rules, -f, traces,
// profiles, residuals, templates) are opened and read here, with the checks every one of them
// needs: the path must name a regular file (a directory would read as empty text, /dev/zero or a
// FIFO never ends) and a file read whole must fit the bound its kind sets, checked before a byte
// is allocated. Not for model weights (core/mapped_file.h maps or copies those, through
// open_input_file) nor for files tandem reads about the machine (/proc, /sys).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace tandem {

// Byte bounds of the files read whole.
inline constexpr uint64_t kMaxConfigFileBytes = uint64_t{64} << 20;      // JSON / YAML / templates
inline constexpr uint64_t kMaxTokenizerFileBytes = uint64_t{256} << 20;  // Gemma's: 33 MB
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{1} << 30;         // prompts and corpora (-f)
inline constexpr uint64_t kMaxDataFileBytes = uint64_t{1} << 40;  // traces and other binaries

// An open regular file: its descriptor (closed by the destructor) and its size.
class InputFile {
 public:
  // Opens `path` read-only, following symlinks, without blocking on a FIFO; throws Error(kIo)
  // "<what> <path>: ..." (or "<path>: ..." when `what` is empty) when it cannot be opened or is
  // not a regular file (a directory, a device, a FIFO, a socket).
  static InputFile open(const std::filesystem::path& path, std::string_view what = {});
  ~InputFile();
  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&& other) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  int release();  // hands the descriptor to the caller (who closes it)

 private:
  InputFile(int fd, uint64_t size) : fd_(fd), size_(size) {}
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The whole content of a regular file of at most max_bytes; throws Error(kIo) as InputFile::open
// does, and Error(kFormat) naming the file, its size and the bound when it is larger.
std::string read_input_file(const std::filesystem::path& path, uint64_t max_bytes,
                            std::string_view what = {});

}  // namespace tandem
