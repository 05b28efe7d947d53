// GGUF (llama.cpp / ggml model files): a validating reader over a read-only mapping and a
// streaming writer. Spec: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (versions 2
// and 3, little-endian only; version 1 is refused).
//
// The reader trusts nothing in the file: every count, length, offset and shape is checked against
// the file size before it is used, so a truncated or hostile file throws Error naming the file
// (and the key or tensor) instead of crashing or allocating without bound. Tensor shapes are
// exposed row-major (GGUF's `ne` reversed), tensor data is never copied.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/tensor.h"

namespace tandem {

enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8,
  kUint16,
  kInt16,
  kUint32,
  kInt32,
  kFloat32,
  kBool,
  kString,
  kArray,
  kUint64,
  kInt64,
  kFloat64,
};

// "uint8", "string", "array", ... ("unknown" for ids outside the enum).
std::string_view gguf_type_name(GgufType type);

// One metadata value: scalar, string, or (nested) array. Accessors throw Error(kFormat) when the
// value is not of a compatible type or an integer does not fit the requested signedness.
class GgufValue {
 public:
  GgufValue() = default;

  GgufType type() const { return type_; }
  GgufType array_type() const;  // element type when type() == kArray
  int64_t as_int() const;       // any integer type or bool
  uint64_t as_uint() const;
  double as_float() const;  // float32/64 or any integer
  bool as_bool() const;     // bool or any integer (non-zero is true)
  const std::string& as_string() const;
  size_t size() const;  // array length
  const GgufValue& at(size_t i) const;
  std::vector<int64_t> as_int_array() const;
  std::vector<float> as_float_array() const;
  std::vector<std::string> as_string_array() const;

  bool is_integer() const;  // any integer type (not bool)
  // The scalar payload as stored: integers/bools extended to 64 bits, floats as IEEE bits.
  uint64_t raw_bits() const { return bits_; }

  // Constructors for the writer.
  static GgufValue u8(uint8_t v);
  static GgufValue i8(int8_t v);
  static GgufValue u16(uint16_t v);
  static GgufValue i16(int16_t v);
  static GgufValue u32(uint32_t v);
  static GgufValue i32(int32_t v);
  static GgufValue u64(uint64_t v);
  static GgufValue i64(int64_t v);
  static GgufValue f32(float v);
  static GgufValue f64(double v);
  static GgufValue boolean(bool v);
  static GgufValue string(std::string v);
  // Every element must have type elem_type (Error(kInvalidArgument) otherwise).
  static GgufValue array(GgufType elem_type, std::vector<GgufValue> elems);
  static GgufValue string_array(const std::vector<std::string>& v);
  static GgufValue i32_array(const std::vector<int32_t>& v);
  static GgufValue f32_array(const std::vector<float>& v);

  bool operator==(const GgufValue& other) const;
  // Short human-readable rendering ("[1, 2, 3, ... (512 items)]") for `tandem info` and errors.
  std::string to_string(size_t max_items = 8) const;

 private:
  friend class GgufParser;
  GgufType type_ = GgufType::kUint8;
  GgufType array_type_ = GgufType::kUint8;
  // Integers and bools sign-extended (signed types) or zero-extended; floats as their raw bits.
  uint64_t bits_ = 0;
  std::string str_;
  std::vector<GgufValue> items_;
};

struct GgufTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  int ndim = 0;
  std::array<int64_t, 4> shape{};  // row-major (GGUF ne reversed)
  uint64_t offset = 0;             // from the start of its file (shard)
  uint64_t nbytes = 0;
  uint32_t shard = 0;  // split GGUF: the file holding the data (0: the first; GgufFile::shards)
};

class GgufFile {
 public:
  // mmap (or copy, see LoadMode) + parse + validate; throws Error naming the file.
  // A split GGUF (llama.cpp's gguf-split: `split.count` > 1, shards named
  // <prefix>-00001-of-0000N.gguf): `path` is the first shard; the others are opened from the same
  // directory, each validated, and their tensors join this file's (GgufTensorInfo::shard). The
  // metadata is the first shard's. A later shard, a missing or mismatched one, or a tensor in two
  // shards throws Error naming the files.
  static GgufFile open(const std::filesystem::path& path, LoadMode mode = LoadMode::kMap);
  // Parses a GGUF image in memory (fuzzing, tests). `name` is used in error messages. The buffer
  // is not copied and must outlive the returned object and every Tensor taken from it.
  static GgufFile parse(std::string name, const uint8_t* data, size_t size);

  GgufFile(GgufFile&&) noexcept = default;
  GgufFile& operator=(GgufFile&&) noexcept = default;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section

  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;  // nullptr if absent
  const GgufValue& get(std::string_view key) const;   // throws Error(kFormat) naming key and file
  // Typed getters: the fallback when absent; Error(kFormat) naming key and file on a wrong type.
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_float(std::string_view key, double fallback) const;
  std::string get_string(std::string_view key, const std::string& fallback) const;
  bool get_bool(std::string_view key, bool fallback) const;
  // Arrays: Error(kFormat) naming key and file when absent or of another type.
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;
  std::vector<float> get_float_array(std::string_view key) const;
  size_t get_array_size(std::string_view key) const;

  // File order (a split GGUF: the first shard's, then the next shard's, ...).
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  Tensor tensor(std::string_view name) const;  // view into the mapping; throws naming tensor+file
  const uint8_t* tensor_data(const GgufTensorInfo& t) const;  // its bytes in its shard's mapping

  const uint8_t* data() const { return data_; }  // the whole mapping (a split GGUF: the first's)
  uint64_t size() const { return size_; }
  bool in_memory() const { return map_.copied(); }  // read into memory (LoadMode::kCopy)
  void release_pages() const;  // MappedFile::release_pages, every shard's
  // Every file of the model: this one, then a split GGUF's other shards in order.
  std::vector<std::filesystem::path> shard_paths() const;
  std::string path_of(std::string_view tensor_name) const;  // the file holding it

 private:
  friend class GgufParser;
  GgufFile() = default;

  MappedFile map_;  // empty for parse()
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> key_index_;
  std::unordered_map<std::string, size_t> tensor_index_;
  std::vector<GgufFile> shards_;  // a split GGUF's second, third, ... files
};

// Writes GGUF v3. Streams tensors: peak memory is the largest tensor, not the model.
class GgufWriter {
 public:
  // alignment: of the tensor data (a power of two); when not 32 it is also recorded as
  // `general.alignment`. Setting `general.alignment` (uint32) with set() changes it too.
  explicit GgufWriter(std::filesystem::path path, uint64_t alignment = 32);

  void set(std::string key, GgufValue value);  // keeps insertion order; replaces the same key
  // Adds a tensor (shape row-major); `fill(dst)` is called during write() with a zeroed buffer of
  // dtype_bytes(dtype, numel) bytes to fill. Throws Error(kInvalidArgument) on a bad shape or a
  // duplicate name, Error(kUnsupported) for a dtype GGUF cannot store (F8_E4M3, U8).
  void add_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                  std::function<void(void* dst)> fill);
  // Same, with the bytes taken from `src` (which must stay valid until write()).
  void add_tensor_data(std::string name, DType dtype, std::vector<int64_t> shape, const void* src);
  void write();  // to <path>.tmp then rename; throws Error(kIo) naming the path

 private:
  struct PendingTensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes;
    std::function<void(void*)> fill;
  };
  std::filesystem::path path_;
  uint64_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace tandem
