// GGUF reader. Layout (little-endian):
//   "GGUF" u32 version  u64 n_tensors  u64 n_kv
//   n_kv x   { string key, u32 type, value }
//   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset }
//   padding to `general.alignment` (default 32), then the tensor data; offsets are relative to it.
// where string = u64 length + bytes, and an array value = u32 element type + u64 count + elements.
#include "formats/gguf.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <regex>

#include "core/error.h"

namespace tandem {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxArrayDepth = 8;
// Each array element becomes a GgufValue (~72 bytes), so the element count is capped to keep a
// hostile file from turning its size into 72x the memory. Real vocabularies are < 300k tokens.
constexpr uint64_t kMaxMetadataElements = 1ull << 23;
constexpr int kMaxDimsGguf = 4;

// ggml_type names for the error message of a type tandem does not support (ggml.h enum order).
std::string_view ggml_type_name(uint32_t id) {
  static constexpr std::array<std::string_view, 40> kNames = {"f32",
                                                              "f16",
                                                              "q4_0",
                                                              "q4_1",
                                                              "q4_2 (removed)",
                                                              "q4_3 (removed)",
                                                              "q5_0",
                                                              "q5_1",
                                                              "q8_0",
                                                              "q8_1",
                                                              "q2_K",
                                                              "q3_K",
                                                              "q4_K",
                                                              "q5_K",
                                                              "q6_K",
                                                              "q8_K",
                                                              "iq2_xxs",
                                                              "iq2_xs",
                                                              "iq3_xxs",
                                                              "iq1_s",
                                                              "iq4_nl",
                                                              "iq3_s",
                                                              "iq2_s",
                                                              "iq4_xs",
                                                              "i8",
                                                              "i16",
                                                              "i32",
                                                              "i64",
                                                              "f64",
                                                              "iq1_m",
                                                              "bf16",
                                                              "q4_0_4_4 (removed)",
                                                              "q4_0_4_8 (removed)",
                                                              "q4_0_8_8 (removed)",
                                                              "tq1_0",
                                                              "tq2_0",
                                                              "iq4_nl_4_4 (removed)",
                                                              "iq4_nl_4_8 (removed)",
                                                              "iq4_nl_8_8 (removed)",
                                                              "mxfp4"};
  return id < kNames.size() ? kNames[id] : "unknown";
}

// Minimum encoded size of one value of type t (used to bound counts before allocating).
uint64_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
    case GgufType::kString:
      return 8;
    case GgufType::kArray:
      return 12;
  }
  return 1;
}

bool valid_type(uint32_t t) {
  return t <= static_cast<uint32_t>(GgufType::kFloat64);
}

}  // namespace

// Reads one GGUF image into a GgufFile; every read is bounds-checked against the buffer.
class GgufParser {
 public:
  explicit GgufParser(GgufFile& file) : f_(file) {}

  void run() {
    read_header();
    for (uint64_t i = 0; i < n_kv_; ++i) read_kv(i);
    read_alignment();
    for (uint64_t i = 0; i < n_tensors_; ++i) read_tensor_info(i);
    place_data();
  }

 private:
  uint64_t remaining() const { return f_.size_ - pos_; }

  [[noreturn]] void truncated(uint64_t need) const {
    fail(ErrorKind::kFormat, "{}: {}: file truncated: {} bytes needed at offset {}, file size {}",
         f_.path_, where_, need, pos_, f_.size_);
  }

  template <typename T>
  T read() {
    if (remaining() < sizeof(T)) truncated(sizeof(T));
    T v;
    std::memcpy(&v, f_.data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const char* what) {
    const auto len = read<uint64_t>();
    if (len > remaining()) {
      fail(ErrorKind::kFormat, "{}: {}: {} length {} at offset {} exceeds the file (size {})",
           f_.path_, where_, what, len, pos_ - 8, f_.size_);
    }
    std::string s(reinterpret_cast<const char*>(f_.data_ + pos_), len);
    pos_ += len;
    return s;
  }

  // Keys and tensor names end up in every message: no control characters in them.
  void check_name(const std::string& name, const char* what) const {
    for (const char c : name) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        fail(ErrorKind::kFormat, "{}: {}: {} '{}' holds control characters", f_.path_, where_, what,
             printable(name));
      }
    }
  }

  void read_header() {
    where_ = "header";
    if (f_.size_ < 4) truncated(4);
    const auto magic = read<uint32_t>();
    if (magic != kMagic) {
      fail(ErrorKind::kFormat,
           "{}: not a GGUF file (starts with bytes {:02x} {:02x} {:02x} {:02x}, not \"GGUF\")",
           f_.path_, f_.data_[0], f_.data_[1], f_.data_[2], f_.data_[3]);
    }
    f_.version_ = read<uint32_t>();
    if (f_.version_ == 1) {
      fail(ErrorKind::kUnsupported,
           "{}: GGUF version 1 is not supported (convert it again with a current llama.cpp)",
           f_.path_);
    }
    if (f_.version_ != 2 && f_.version_ != 3) {
      // A big-endian file shows its version byte-swapped.
      if ((f_.version_ & 0xffffu) == 0 && (f_.version_ >> 24) <= 3) {
        fail(ErrorKind::kUnsupported, "{}: big-endian GGUF is not supported", f_.path_);
      }
      fail(ErrorKind::kUnsupported, "{}: unsupported GGUF version {} (supported: 2, 3)", f_.path_,
           f_.version_);
    }
    n_tensors_ = read<uint64_t>();
    n_kv_ = read<uint64_t>();
    // Bound both counts by what the rest of the file could hold before reserving anything:
    // a key/value takes at least 13 bytes, a tensor info at least 32.
    if (n_kv_ > remaining() / 13) {
      fail(ErrorKind::kFormat,
           "{}: header: {} metadata entries cannot fit in the {} bytes left (truncated or corrupt)",
           f_.path_, n_kv_, remaining());
    }
    if (n_tensors_ > remaining() / 32 || n_kv_ * 13 + n_tensors_ * 32 > remaining()) {
      fail(ErrorKind::kFormat,
           "{}: header: {} tensors and {} metadata entries cannot fit in the {} bytes left "
           "(truncated or corrupt)",
           f_.path_, n_tensors_, n_kv_, remaining());
    }
    f_.metadata_.reserve(n_kv_);
    f_.tensors_.reserve(n_tensors_);
  }

  GgufValue read_value(GgufType type, int depth) {
    GgufValue v;
    v.type_ = type;
    switch (type) {
      case GgufType::kUint8:
        v.bits_ = read<uint8_t>();
        break;
      case GgufType::kInt8:
        v.bits_ = static_cast<uint64_t>(int64_t{read<int8_t>()});
        break;
      case GgufType::kUint16:
        v.bits_ = read<uint16_t>();
        break;
      case GgufType::kInt16:
        v.bits_ = static_cast<uint64_t>(int64_t{read<int16_t>()});
        break;
      case GgufType::kUint32:
        v.bits_ = read<uint32_t>();
        break;
      case GgufType::kInt32:
        v.bits_ = static_cast<uint64_t>(int64_t{read<int32_t>()});
        break;
      case GgufType::kFloat32:
        v.bits_ = read<uint32_t>();
        break;
      case GgufType::kBool:
        v.bits_ = read<uint8_t>() != 0;
        break;
      case GgufType::kUint64:
        v.bits_ = read<uint64_t>();
        break;
      case GgufType::kInt64:
        v.bits_ = read<uint64_t>();
        break;
      case GgufType::kFloat64:
        v.bits_ = read<uint64_t>();
        break;
      case GgufType::kString:
        v.str_ = read_string("string");
        break;
      case GgufType::kArray: {
        if (depth >= kMaxArrayDepth) {
          fail(ErrorKind::kFormat, "{}: {}: arrays nested deeper than {} levels", f_.path_, where_,
               kMaxArrayDepth);
        }
        const auto elem = read<uint32_t>();
        if (!valid_type(elem)) {
          fail(ErrorKind::kFormat, "{}: {}: unknown array element type {} at offset {}", f_.path_,
               where_, elem, pos_ - 4);
        }
        v.array_type_ = static_cast<GgufType>(elem);
        const auto n = read<uint64_t>();
        if (n > remaining() / min_value_bytes(v.array_type_)) {
          fail(ErrorKind::kFormat, "{}: {}: array of {} {} values cannot fit in the {} bytes left",
               f_.path_, where_, n, gguf_type_name(v.array_type_), remaining());
        }
        elements_ += n;
        if (elements_ > kMaxMetadataElements) {
          fail(ErrorKind::kFormat, "{}: {}: metadata arrays hold more than {} elements in total",
               f_.path_, where_, kMaxMetadataElements);
        }
        v.items_.reserve(n);
        for (uint64_t i = 0; i < n; ++i) v.items_.push_back(read_value(v.array_type_, depth + 1));
        break;
      }
    }
    return v;
  }

  void read_kv(uint64_t i) {
    where_ = fmt::format("metadata entry {}", i);
    std::string key = read_string("key");
    check_name(key, "key");
    where_ = fmt::format("key '{}'", key);
    const auto type = read<uint32_t>();
    if (!valid_type(type)) {
      fail(ErrorKind::kFormat, "{}: key '{}': unknown metadata value type {}", f_.path_, key, type);
    }
    GgufValue value = read_value(static_cast<GgufType>(type), 0);
    if (!f_.key_index_.emplace(key, f_.metadata_.size()).second) {
      fail(ErrorKind::kFormat, "{}: duplicate key '{}'", f_.path_, key);
    }
    f_.metadata_.emplace_back(std::move(key), std::move(value));
  }

  void read_alignment() {
    const GgufValue* a = f_.find("general.alignment");
    if (a == nullptr) return;
    if (a->type() != GgufType::kUint32) {
      fail(ErrorKind::kFormat, "{}: key 'general.alignment': expected uint32, got {}", f_.path_,
           gguf_type_name(a->type()));
    }
    const uint64_t align = a->as_uint();
    if (align == 0 || (align & (align - 1)) != 0) {
      fail(ErrorKind::kFormat, "{}: key 'general.alignment': {} is not a power of two", f_.path_,
           align);
    }
    f_.alignment_ = align;
  }

  void read_tensor_info(uint64_t i) {
    where_ = fmt::format("tensor info {}", i);
    GgufTensorInfo t;
    t.name = read_string("tensor name");
    check_name(t.name, "tensor name");
    where_ = fmt::format("tensor '{}'", t.name);
    const auto n_dims = read<uint32_t>();
    if (n_dims < 1 || n_dims > kMaxDimsGguf) {
      fail(ErrorKind::kFormat, "{}: tensor '{}': {} dimensions (must be 1 to {})", f_.path_, t.name,
           n_dims, kMaxDimsGguf);
    }
    std::array<uint64_t, kMaxDimsGguf> ne{};
    for (uint32_t d = 0; d < n_dims; ++d) ne[d] = read<uint64_t>();
    const auto ggml_type = read<uint32_t>();
    const uint64_t rel_offset = read<uint64_t>();

    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      if (ne[d] == 0 || ne[d] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(ErrorKind::kFormat, "{}: tensor '{}': invalid extent ne[{}] = {}", f_.path_, t.name, d,
             ne[d]);
      }
      if (__builtin_mul_overflow(numel, static_cast<int64_t>(ne[d]), &numel)) {
        fail(ErrorKind::kFormat, "{}: tensor '{}': element count overflows", f_.path_, t.name);
      }
    }
    const auto dtype =
        ggml_type <= 0x7fffffffu ? dtype_from_ggml(static_cast<int32_t>(ggml_type)) : std::nullopt;
    if (!dtype) {
      fail(ErrorKind::kUnsupported, "{}: tensor '{}': ggml type {} ({}) is not supported", f_.path_,
           t.name, ggml_type, ggml_type_name(ggml_type));
    }
    t.dtype = *dtype;
    const DTypeInfo& info = dtype_info(t.dtype);
    if (static_cast<int64_t>(ne[0]) % info.block_elems != 0) {
      fail(ErrorKind::kFormat,
           "{}: tensor '{}': innermost extent {} is not a multiple of the {} block size {}",
           f_.path_, t.name, ne[0], info.name, info.block_elems);
    }
    int64_t row_bytes = 0;
    int64_t nbytes = 0;
    if (__builtin_mul_overflow(static_cast<int64_t>(ne[0]) / info.block_elems,
                               int64_t{info.block_bytes}, &row_bytes) ||
        __builtin_mul_overflow(row_bytes, numel / static_cast<int64_t>(ne[0]), &nbytes)) {
      fail(ErrorKind::kFormat, "{}: tensor '{}': byte size overflows", f_.path_, t.name);
    }
    t.nbytes = static_cast<uint64_t>(nbytes);
    t.ndim = static_cast<int>(n_dims);
    for (int d = 0; d < t.ndim; ++d) t.shape[d] = static_cast<int64_t>(ne[t.ndim - 1 - d]);
    t.offset = rel_offset;  // made absolute in place_data()
    if (!f_.tensor_index_.emplace(t.name, f_.tensors_.size()).second) {
      fail(ErrorKind::kFormat, "{}: duplicate tensor '{}'", f_.path_, t.name);
    }
    f_.tensors_.push_back(std::move(t));
  }

  // Aligns the data section and checks every tensor lies inside it, aligned and not overlapping.
  void place_data() {
    where_ = "tensor data";
    const uint64_t align = f_.alignment_;
    f_.data_offset_ = (pos_ + align - 1) / align * align;
    if (f_.tensors_.empty()) return;  // files without tensors (vocab-only) may end unpadded
    if (f_.data_offset_ > f_.size_) {
      fail(ErrorKind::kFormat, "{}: file truncated before the tensor data (offset {}, size {})",
           f_.path_, f_.data_offset_, f_.size_);
    }
    const uint64_t data_size = f_.size_ - f_.data_offset_;
    for (GgufTensorInfo& t : f_.tensors_) {
      if (t.offset % align != 0) {
        fail(ErrorKind::kFormat,
             "{}: tensor '{}': data offset {} is not a multiple of the alignment {}", f_.path_,
             t.name, t.offset, align);
      }
      if (t.offset > data_size || t.nbytes > data_size - t.offset) {
        fail(ErrorKind::kFormat,
             "{}: tensor '{}': {} bytes at data offset {} lie outside the data section ({} bytes); "
             "file truncated?",
             f_.path_, t.name, t.nbytes, t.offset, data_size);
      }
      t.offset += f_.data_offset_;
    }
    std::vector<const GgufTensorInfo*> by_offset;
    by_offset.reserve(f_.tensors_.size());
    for (const GgufTensorInfo& t : f_.tensors_) by_offset.push_back(&t);
    std::sort(
        by_offset.begin(), by_offset.end(),
        [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const GgufTensorInfo& prev = *by_offset[i - 1];
      if (by_offset[i]->offset < prev.offset + prev.nbytes) {
        fail(ErrorKind::kFormat, "{}: tensors '{}' and '{}' overlap", f_.path_, prev.name,
             by_offset[i]->name);
      }
    }
    // Writers pad each tensor to the alignment, the last one included: more bytes after it
    // than that padding means the data section starts elsewhere than computed (a
    // general.alignment that is not the one the file was written with shifts every tensor).
    const GgufTensorInfo& last = *by_offset.back();
    const uint64_t after = f_.size_ - (last.offset + last.nbytes);
    if (after >= align) {
      fail(ErrorKind::kFormat,
           "{}: {} bytes follow the last tensor ('{}'), more than alignment {} pads: the file was "
           "written with another alignment than its general.alignment, or is corrupt",
           f_.path_, after, last.name, align);
    }
  }

  GgufFile& f_;
  uint64_t pos_ = 0;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
  uint64_t elements_ = 0;  // array elements read so far (all keys, all nesting levels)
  std::string where_;
};

namespace {

// llama.cpp's shard names, <prefix>-%05d-of-%05d.gguf (gguf-split, llama_split_path).
std::string shard_name(const std::string& prefix, int64_t no, int64_t count) {
  return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, no, count);
}

// The prefix of a shard's file name, "" when the name is not <prefix>-NNNNN-of-NNNNN.gguf.
std::string shard_prefix(const std::string& name, int64_t* no, int64_t* count) {
  static const std::regex re(R"(^(.+)-([0-9]{5})-of-([0-9]{5})\.gguf$)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return "";
  *no = std::stoll(m[2].str());
  *count = std::stoll(m[3].str());
  return m[1].str();
}

}  // namespace

GgufFile GgufFile::open(const std::filesystem::path& path, LoadMode mode) {
  auto open_one = [mode](const std::filesystem::path& p) {
    MappedFile map = MappedFile::open(p, mode);
    GgufFile file = parse(p.string(), map.data(), map.size());
    file.map_ = std::move(map);  // the mapping's address does not change when moved
    return file;
  };
  GgufFile file = open_one(path);
  const int64_t count = file.get_int("split.count", 1);
  if (count <= 1) return file;
  const int64_t no = file.get_int("split.no", 0);
  int64_t name_no = 0, name_count = 0;
  const std::string prefix = shard_prefix(path.filename().string(), &name_no, &name_count);
  if (prefix.empty() || name_count != count || name_no != no + 1) {
    fail(ErrorKind::kFormat,
         "{}: shard {} of a GGUF split in {} files, but its name is not <prefix>-{:05d}-of-{:05d}"
         ".gguf, so the other shards cannot be found (llama.cpp's naming; llama-gguf-split "
         "--merge joins them into one file)",
         file.path_, no + 1, count, no + 1, count);
  }
  if (no != 0) {
    fail(ErrorKind::kInvalidArgument, "{}: shard {} of {} of a split GGUF: pass the first, {}",
         file.path_, no + 1, count, (path.parent_path() / shard_name(prefix, 1, count)).string());
  }
  for (int64_t i = 1; i < count; ++i) {
    const std::filesystem::path sp = path.parent_path() / shard_name(prefix, i + 1, count);
    std::error_code ec;
    if (!std::filesystem::exists(sp, ec)) {
      fail(ErrorKind::kIo, "{}: shard {} of {} of this split GGUF is missing: {}",
           file.path_, i + 1, count, sp.string());
    }
    GgufFile shard = open_one(sp);
    const int64_t s_no = shard.get_int("split.no", -1), s_count = shard.get_int("split.count", 0);
    if (s_no != i || s_count != count) {
      fail(ErrorKind::kFormat, "{}: expected shard {} of {} (split.no {}), found split.no {} of {}",
           shard.path_, i + 1, count, i, s_no, s_count);
    }
    const auto k = static_cast<uint32_t>(file.shards_.size() + 1);
    for (GgufTensorInfo t : shard.tensors_) {
      t.shard = k;
      if (!file.tensor_index_.emplace(t.name, file.tensors_.size()).second) {
        fail(ErrorKind::kFormat, "{}: tensor '{}' is in two shards (also in {})", shard.path_,
             t.name, file.path_of(t.name));
      }
      file.tensors_.push_back(std::move(t));
    }
    file.shards_.push_back(std::move(shard));
  }
  const int64_t want = file.get_int("split.tensors.count", -1);
  if (want >= 0 && want != static_cast<int64_t>(file.tensors_.size())) {
    fail(ErrorKind::kFormat, "{}: split.tensors.count is {} but the {} shards hold {} tensors",
         file.path_, want, count, file.tensors_.size());
  }
  return file;
}

std::string GgufFile::path_of(std::string_view tensor_name) const {
  const GgufTensorInfo* t = find_tensor(tensor_name);
  return t == nullptr || t->shard == 0 ? path_ : shards_[t->shard - 1].path_;
}

const uint8_t* GgufFile::tensor_data(const GgufTensorInfo& t) const {
  return (t.shard == 0 ? data_ : shards_[t.shard - 1].data_) + t.offset;
}

void GgufFile::release_pages() const {
  map_.release_pages();
  for (const GgufFile& s : shards_) s.release_pages();
}

std::vector<std::filesystem::path> GgufFile::shard_paths() const {
  std::vector<std::filesystem::path> v{path_};
  for (const GgufFile& s : shards_) v.emplace_back(s.path_);
  return v;
}

GgufFile GgufFile::parse(std::string name, const uint8_t* data, size_t size) {
  GgufFile file;
  file.path_ = std::move(name);
  file.data_ = data;
  file.size_ = size;
  GgufParser(file).run();
  return file;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = key_index_.find(std::string(key));
  return it == key_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufValue& GgufFile::get(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) fail(ErrorKind::kFormat, "{}: missing metadata key '{}'", path_, key);
  return *v;
}

namespace {
// Runs `f` on a value and prefixes any Error with the file and key.
template <typename F>
auto with_key(const std::string& path, std::string_view key, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    fail(e.kind(), "{}: key '{}': {}", path, key, e.what());
  }
}
}  // namespace

int64_t GgufFile::get_int(std::string_view key, int64_t fallback) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return fallback;
  return with_key(path_, key, [&] {
    if (!v->is_integer())
      fail(ErrorKind::kFormat, "expected an integer, got {}", gguf_type_name(v->type()));
    return v->as_int();
  });
}

double GgufFile::get_float(std::string_view key, double fallback) const {
  const GgufValue* v = find(key);
  return v == nullptr ? fallback : with_key(path_, key, [&] { return v->as_float(); });
}

std::string GgufFile::get_string(std::string_view key, const std::string& fallback) const {
  const GgufValue* v = find(key);
  return v == nullptr ? fallback : with_key(path_, key, [&] { return v->as_string(); });
}

std::vector<std::string> GgufFile::get_string_array(std::string_view key) const {
  return with_key(path_, key, [&] { return get(key).as_string_array(); });
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
  return with_key(path_, key, [&] { return get(key).as_int_array(); });
}

std::vector<float> GgufFile::get_float_array(std::string_view key) const {
  return with_key(path_, key, [&] { return get(key).as_float_array(); });
}

size_t GgufFile::get_array_size(std::string_view key) const {
  return with_key(path_, key, [&] { return get(key).size(); });
}

bool GgufFile::get_bool(std::string_view key, bool fallback) const {
  const GgufValue* v = find(key);
  return v == nullptr ? fallback : with_key(path_, key, [&] { return v->as_bool(); });
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Tensor GgufFile::tensor(std::string_view name) const {
  const GgufTensorInfo* info = find_tensor(name);
  if (info == nullptr) fail(ErrorKind::kFormat, "{}: no tensor '{}'", path_, name);
  Tensor t;
  t.dtype = info->dtype;
  t.ndim = info->ndim;
  t.shape = info->shape;
  int64_t stride = dtype_bytes(info->dtype, info->shape[info->ndim - 1]);
  t.stride_bytes[info->ndim - 1] = dtype_info(info->dtype).block_bytes;
  for (int d = info->ndim - 2; d >= 0; --d) {
    t.stride_bytes[d] = stride;
    stride *= info->shape[d];
  }
  // Views are non-const by design; the mapping is read-only, so writing through one faults.
  t.data = const_cast<uint8_t*>(tensor_data(*info));
  return t;
}

}  // namespace tandem
