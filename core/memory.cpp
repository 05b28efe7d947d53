#include "core/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/topology.h"

#if TANDEM_HAVE_LIBNUMA
#include <numa.h>
#include <numaif.h>
#endif

namespace tandem {
namespace {

constexpr size_t kPageBytes = 4096;

bool is_power_of_two(size_t x) {
  return x != 0 && (x & (x - 1)) == 0;
}

// Rounds up to a multiple of `align` (a power of two); false when that overflows.
bool round_up(size_t value, size_t align, size_t* out) {
  if (value > SIZE_MAX - (align - 1)) return false;
  *out = (value + align - 1) & ~(align - 1);
  return true;
}

[[noreturn]] void out_of_memory(size_t bytes, const char* how, int err) {
  fail(ErrorKind::kResource, "cannot allocate {} bytes ({}) of {} memory: {}", bytes,
       format_binary_bytes(bytes), how, std::strerror(err));
}

void touch_pages(void* data, size_t bytes) {
  // One write per 4 KiB page makes the kernel back the range now (THP-sized where madvised).
  volatile char* p = static_cast<volatile char*>(data);
  for (size_t off = 0; off < bytes; off += kPageBytes) p[off] = 0;
}

}  // namespace

std::string parse_sysfs_selector(const std::string& text) {
  const size_t open = text.find('[');
  const size_t close = text.find(']', open == std::string::npos ? 0 : open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return text.substr(open + 1, close - open - 1);
}

ThpMode thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string text;
  std::getline(in, text);
  const std::string active = parse_sysfs_selector(text);
  if (active == "always") return ThpMode::kAlways;
  if (active == "madvise") return ThpMode::kMadvise;
  if (active == "never") return ThpMode::kNever;
  return ThpMode::kUnknown;
}

const char* thp_mode_name(ThpMode mode) {
  switch (mode) {
    case ThpMode::kAlways:
      return "always";
    case ThpMode::kMadvise:
      return "madvise";
    case ThpMode::kNever:
      return "never";
    case ThpMode::kUnknown:
      return "unknown";
  }
  return "unknown";
}

int numa_node_count() {
#if TANDEM_HAVE_LIBNUMA
  if (numa_available() < 0) return 1;
  return numa_max_node() + 1;
#else
  return 1;
#endif
}

bool bind_to_numa_node(void* data, size_t bytes, int node) {
#if TANDEM_HAVE_LIBNUMA
  if (numa_available() < 0) {
    log_debug("NUMA binding of {} to node {} skipped: libnuma reports no NUMA support",
              format_binary_bytes(bytes), node);
    return false;
  }
  const int max_node = numa_max_node();
  if (max_node < 1) {
    log_debug("NUMA binding of {} skipped: one node only", format_binary_bytes(bytes));
    return false;
  }
  if (node < 0 || node > max_node) {
    log_debug("NUMA binding of {} skipped: node {} does not exist (0..{})",
              format_binary_bytes(bytes), node, max_node);
    return false;
  }
  constexpr size_t kBitsPerWord = sizeof(unsigned long) * 8;
  std::vector<unsigned long> mask(static_cast<size_t>(max_node) / kBitsPerWord + 1, 0);
  mask[static_cast<size_t>(node) / kBitsPerWord] |= 1ul
                                                    << (static_cast<size_t>(node) % kBitsPerWord);
  if (mbind(data, bytes, MPOL_BIND, mask.data(), static_cast<unsigned long>(max_node) + 2,
            MPOL_MF_MOVE) != 0) {
    log_debug("NUMA binding of {} to node {} failed: {}", format_binary_bytes(bytes), node,
              std::strerror(errno));
    return false;
  }
  return true;
#else
  log_debug("NUMA binding of {} to node {} skipped: built without libnuma",
            format_binary_bytes(bytes), node);
  return false;
#endif
}

AlignedBuffer::AlignedBuffer(size_t bytes, const AllocOptions& options) {
  if (!is_power_of_two(options.alignment)) {
    fail(ErrorKind::kInvalidArgument, "buffer alignment {} is not a power of two",
         options.alignment);
  }
  if (bytes == 0) return;
  const bool use_mmap = options.huge_pages || options.numa_node >= 0;
  if (!use_mmap) {
    const size_t align = std::max(options.alignment, kCacheLineBytes);
    size_t rounded = 0;
    if (!round_up(bytes, align, &rounded)) out_of_memory(bytes, "aligned heap", ENOMEM);
    data_ = std::aligned_alloc(align, rounded);
    if (data_ == nullptr) out_of_memory(bytes, "aligned heap", ENOMEM);
    size_ = bytes;
    if (options.zero) {
      std::memset(data_, 0, bytes);
    } else if (options.prefault) {
      touch_pages(data_, bytes);
    }
    return;
  }

  // mmap path: over-map by the alignment, then trim head and tail so the mapping (one VMA) starts
  // on the boundary; a 2 MiB aligned VMA is what lets THP back it with huge pages.
  const size_t align =
      std::max(options.alignment, options.huge_pages ? kHugePageBytes : kPageBytes);
  size_t length = 0, padded = 0;
  if (!round_up(bytes, options.huge_pages ? kHugePageBytes : kPageBytes, &length) ||
      length > SIZE_MAX - align) {
    out_of_memory(bytes, "mapped", ENOMEM);
  }
  padded = length + (align > kPageBytes ? align : 0);
  void* raw = mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) out_of_memory(bytes, "mapped", errno);
  const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (base + align - 1) & ~(uintptr_t{align} - 1);
  if (start > base) munmap(raw, start - base);
  const size_t tail = (base + padded) - (start + length);
  if (tail > 0) munmap(reinterpret_cast<void*>(start + length), tail);
  map_base_ = data_ = reinterpret_cast<void*>(start);
  mapped_bytes_ = length;
  size_ = bytes;

  if (options.huge_pages) {
    huge_pages_ = madvise(data_, length, MADV_HUGEPAGE) == 0;
    if (!huge_pages_) {
      log_debug("madvise(MADV_HUGEPAGE) on {} failed: {}", format_binary_bytes(length),
                std::strerror(errno));
    }
  }
  if (options.numa_node >= 0 && bind_to_numa_node(data_, length, options.numa_node)) {
    numa_node_ = options.numa_node;
  }
  if (options.prefault) touch_pages(data_, length);  // mmap memory is already zero
}

AlignedBuffer::~AlignedBuffer() {
  release();
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept {
  *this = std::move(other);
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    map_base_ = std::exchange(other.map_base_, nullptr);
    mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
    huge_pages_ = std::exchange(other.huge_pages_, false);
    numa_node_ = std::exchange(other.numa_node_, -1);
  }
  return *this;
}

void AlignedBuffer::release() {
  if (mapped_bytes_ != 0) {
    munmap(map_base_, mapped_bytes_);
  } else {
    std::free(data_);
  }
  data_ = map_base_ = nullptr;
  size_ = mapped_bytes_ = 0;
  huge_pages_ = false;
  numa_node_ = -1;
}

size_t AlignedBuffer::huge_page_bytes() const {
  if (mapped_bytes_ == 0) return 0;
  // smaps lists each mapping ("start-end perms ...") followed by "Key: value kB" lines.
  const uintptr_t lo = reinterpret_cast<uintptr_t>(map_base_), hi = lo + mapped_bytes_;
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  size_t total = 0;
  while (std::getline(in, line)) {
    const size_t dash = line.find('-');
    if (dash != std::string::npos && dash > 0 && line.find(' ') > dash &&
        std::isxdigit(static_cast<unsigned char>(line[0]))) {
      const uintptr_t start = std::strtoull(line.c_str(), nullptr, 16);
      const uintptr_t end = std::strtoull(line.c_str() + dash + 1, nullptr, 16);
      inside = start < hi && end > lo;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      std::istringstream fields(line.substr(14));
      size_t kb = 0;
      fields >> kb;
      total += kb * 1024;
    }
  }
  return total;
}

Arena::Arena(size_t capacity_bytes, const AllocOptions& options)
    : block_(capacity_bytes, options) {}

void* Arena::allocate(size_t bytes, size_t alignment) {
  TD_CHECK(is_power_of_two(alignment), "arena alignment {} is not a power of two", alignment);
  const uintptr_t base = reinterpret_cast<uintptr_t>(block_.data());
  const uintptr_t here = base + used_;
  const uintptr_t aligned = (here + alignment - 1) & ~(uintptr_t{alignment} - 1);
  const size_t offset = aligned - base;
  if (block_.empty() || offset > capacity() || bytes > capacity() - offset) {
    fail(ErrorKind::kResource, "scratch arena exhausted: {} bytes requested with {} of {} used",
         bytes, used_, capacity());
  }
  used_ = offset + bytes;
  if (used_ > high_water_) high_water_ = used_;
  return reinterpret_cast<void*>(aligned);
}

void Arena::rewind(size_t mark) {
  TD_CHECK(mark <= used_, "arena rewind to {} beyond the {} bytes in use", mark, used_);
  used_ = mark;
}

void Arena::overflow(size_t count, size_t size) const {
  fail(ErrorKind::kResource, "scratch arena: {} elements of {} bytes overflow size_t", count, size);
}

}  // namespace tandem
