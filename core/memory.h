// Host memory for weights, activations and scratch: 64-byte aligned buffers (one cache line, one
// AVX-512 vector), huge-page-backed buffers for large streaming data (fewer TLB misses when experts
// are read at DRAM speed), buffers bound to one NUMA node (KTransformers §3.3: each socket reads
// only its own slice), and an Arena for per-step scratch so hot paths never call malloc.
//
// Not for GPU memory (ops/cuda) and not a general-purpose allocator: buffers are few and large.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem {

constexpr size_t kCacheLineBytes = 64;
constexpr size_t kHugePageBytes = size_t{2} << 20;  // x86-64 transparent huge page

// Transparent huge pages as /sys/kernel/mm/transparent_hugepage/enabled says. With kMadvise only
// regions we madvise(MADV_HUGEPAGE) get them, which is what huge-page buffers do.
enum class ThpMode { kAlways, kMadvise, kNever, kUnknown };
ThpMode thp_mode();
const char* thp_mode_name(ThpMode mode);
// The active value in a sysfs selector like "always [madvise] never"; "" when none is bracketed.
std::string parse_sysfs_selector(const std::string& text);

struct AllocOptions {
  size_t alignment = kCacheLineBytes;  // a power of two
  bool huge_pages = false;  // mmap + MADV_HUGEPAGE, 2 MiB aligned (sizes rounded up to 2 MiB)
  int numa_node = -1;       // OS node index to bind the pages to; -1: the kernel's default
  bool prefault = false;    // touch every page now, so first use does not pay page faults
  bool zero = false;        // zero the bytes (mmap-backed memory is always zero)
};

// An owned, aligned block of host memory. Move-only. Small plain buffers come from the heap;
// huge-page or NUMA-bound ones from mmap. Binding falls back to unbound memory (logged at debug
// level) where there is one node, no libnuma, or the kernel refuses; numa_bound() tells.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Throws Error(kResource) naming the size when the memory cannot be had, and
  // Error(kInvalidArgument) for a bad alignment.
  explicit AlignedBuffer(size_t bytes, const AllocOptions& options = {});
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T>
  T* as() {
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data_);
  }
  size_t size() const { return size_; }  // bytes requested
  bool empty() const { return size_ == 0; }
  bool mmapped() const { return mapped_bytes_ != 0; }
  bool huge_pages() const {
    return huge_pages_;
  }  // MADV_HUGEPAGE accepted (THP may still not
     // back every page, see huge_page_bytes())
  bool numa_bound() const { return numa_node_ >= 0; }
  int numa_node() const { return numa_node_; }  // -1 when not bound
  // Bytes of this buffer currently backed by huge pages (from /proc/self/smaps; 0 if unknown).
  size_t huge_page_bytes() const;

 private:
  void release();
  void* data_ = nullptr;
  size_t size_ = 0;
  void* map_base_ = nullptr;  // what to munmap (mmap-backed) -- may precede data_
  size_t mapped_bytes_ = 0;
  bool huge_pages_ = false;
  int numa_node_ = -1;
};

// Binds [data, data + bytes) (page aligned) to NUMA node `node`; false (and a debug log) where
// that is impossible. Pages already touched are migrated when the kernel can.
bool bind_to_numa_node(void* data, size_t bytes, int node);
// How many NUMA nodes libnuma sees (1 without libnuma).
int numa_node_count();

// A bump allocator over one aligned block: per-step scratch is carved out with allocate() and
// given back all at once with reset() (or rewound to a mark). Not thread-safe: one per thread or
// per step. Running out is a planning bug upstream, reported as Error(kResource) with the sizes.
class Arena {
 public:
  Arena() = default;
  explicit Arena(size_t capacity_bytes, const AllocOptions& options = {});

  void* allocate(size_t bytes, size_t alignment = kCacheLineBytes);
  template <typename T>
  T* allocate_array(size_t count) {
    if (count > SIZE_MAX / sizeof(T)) overflow(count, sizeof(T));
    return static_cast<T*>(
        allocate(count * sizeof(T), alignof(T) > kCacheLineBytes ? alignof(T) : kCacheLineBytes));
  }
  void reset() { used_ = 0; }
  size_t mark() const { return used_; }
  void rewind(size_t mark);

  size_t capacity() const { return block_.size(); }
  size_t used() const { return used_; }
  size_t high_water() const { return high_water_; }  // most bytes ever in use

 private:
  [[noreturn]] void overflow(size_t count, size_t size) const;
  AlignedBuffer block_;
  size_t used_ = 0;
  size_t high_water_ = 0;
};

}  // namespace tandem
