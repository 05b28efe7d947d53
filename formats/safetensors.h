// safetensors (Hugging Face checkpoints): a validating reader for one file or a sharded checkpoint
// (model.safetensors.index.json + shards), and a writer producing the same layout as
// safetensors-python / transformers' save_pretrained.
//
// File layout: u64 little-endian header length N, N bytes of JSON header, then the data. The
// header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// relative to the data start) plus an optional "__metadata__" string map. The reader validates
// every offset, shape and dtype against the file before exposing a view; data is never copied.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "core/mapped_file.h"
#include "core/tensor.h"

namespace tandem {

// The safetensors dtype name <-> DType ("BF16", "F16", "F32", "F64", "F8_E4M3", "I8", "U8", "I16",
// "I32", "I64"). nullopt / empty for dtypes safetensors cannot name.
std::optional<DType> dtype_from_safetensors(std::string_view name);
std::string_view safetensors_dtype_name(DType dtype);

struct SafetensorsTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  int ndim = 0;
  std::array<int64_t, 4> shape{};
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;
  std::string file;  // the shard holding it
};

// One file, or a sharded checkpoint through model.safetensors.index.json.
class SafetensorsModel {
 public:
  // path: a .safetensors file, an index .json, or a directory holding model.safetensors or
  // model.safetensors.index.json. Throws Error naming the file / tensor / missing shard.
  // mode: map or copy each file (LoadMode).
  static SafetensorsModel open(const std::filesystem::path& path, LoadMode mode = LoadMode::kMap);
  // Parses one safetensors image in memory (fuzzing, tests). The buffer is not copied and must
  // outlive the returned object.
  static SafetensorsModel parse(std::string name, const uint8_t* data, size_t size);
  // Parses the text of an index .json and returns its weight_map (tensor name -> shard file name).
  // Validates that weight_map is an object of strings and that shard names are plain file names
  // (no directories, no ".."). `name` is used in error messages.
  static std::map<std::string, std::string> parse_index(const std::string& name,
                                                        std::string_view json_text);

  SafetensorsModel(SafetensorsModel&&) noexcept = default;
  SafetensorsModel& operator=(SafetensorsModel&&) noexcept = default;

  const std::vector<SafetensorsTensorInfo>& tensors() const {
    return tensors_;
  }  // shard, offset order
  const SafetensorsTensorInfo* find_tensor(std::string_view name) const;
  Tensor tensor(std::string_view name) const;  // throws Error(kFormat) naming tensor and path
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // first shard
  // Every shard read into memory (LoadMode::kCopy; false for parse()).
  bool in_memory() const {
    for (const auto& m : maps_) {
      if (!m->copied()) return false;
    }
    return !maps_.empty();
  }
  const std::string& path() const { return path_; }  // what open() was given
  void release_pages() const {  // MappedFile::release_pages, every shard
    for (const auto& m : maps_) m->release_pages();
  }
  size_t num_shards() const { return maps_.size(); }

 private:
  SafetensorsModel() = default;
  void add_shard(std::string name, const uint8_t* data, size_t size, bool first);

  std::string path_;
  std::vector<std::unique_ptr<MappedFile>> maps_;
  std::vector<SafetensorsTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsWriter {
 public:
  // Writes <dir>/model.safetensors, or when the tensors exceed max_shard_bytes,
  // <dir>/model-00001-of-0000N.safetensors ... + model.safetensors.index.json (HF layout).
  SafetensorsWriter(std::filesystem::path dir, uint64_t max_shard_bytes = 5ull << 30);
  void set_metadata(std::string key, std::string value);  // e.g. {"format": "pt"}
  // Throws Error(kInvalidArgument) on a bad shape / duplicate name, Error(kUnsupported) for a
  // dtype safetensors cannot name (the GGUF block types).
  void add_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                  std::function<void(void* dst)> fill);
  void write();  // each file to <file>.tmp then rename; throws Error(kIo) naming the file

 private:
  struct PendingTensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes;
    std::function<void(void*)> fill;
  };
  void write_file(const std::filesystem::path& file,
                  const std::vector<const PendingTensor*>& list) const;

  std::filesystem::path dir_;
  uint64_t max_shard_bytes_;
  std::map<std::string, std::string> metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace tandem
