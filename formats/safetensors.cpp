// safetensors reader: one file or a sharded checkpoint (Hugging Face index .json + shards).
// Spec: https://github.com/huggingface/safetensors (README "Format"). Every header field is
// validated against the file before a view is handed out.
#include "formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/input_file.h"
#include "core/log.h"

namespace tandem {
namespace {

using nlohmann::json;

// safetensors-rust refuses headers above 100 MB; so do we (no file needs more).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr uint64_t kMaxIndexBytes = 256ull << 20;
constexpr int kMaxJsonDepth = 8;

struct NameDType {
  std::string_view name;
  DType dtype;
};
constexpr NameDType kDTypes[] = {
    {"BF16", DType::kBF16},      {"F16", DType::kF16}, {"F32", DType::kF32}, {"F64", DType::kF64},
    {"F8_E4M3", DType::kF8E4M3}, {"I8", DType::kI8},   {"U8", DType::kU8},   {"I16", DType::kI16},
    {"I32", DType::kI32},        {"I64", DType::kI64},
};

// Parses JSON text, refusing nesting deeper than kMaxJsonDepth and duplicate keys in the top
// object (nlohmann would silently keep the last one). `what` names the file in errors.
json parse_json(const std::string& what, std::string_view text) {
  std::set<std::string> top_keys;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxJsonDepth) {
      fail(ErrorKind::kFormat, "{}: JSON nested deeper than {} levels", what, kMaxJsonDepth);
    }
    if (event == json::parse_event_t::key && depth == 1 &&
        !top_keys.insert(parsed.get<std::string>()).second) {
      fail(ErrorKind::kFormat, "{}: duplicate key '{}' in the JSON header", what,
           parsed.get<std::string>());
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    fail(ErrorKind::kFormat, "{}: invalid JSON: {}", what, e.what());
  }
}

uint64_t json_uint(const json& v, const std::string& what) {
  if (!v.is_number_unsigned())
    fail(ErrorKind::kFormat, "{}: expected a non-negative integer", what);
  return v.get<uint64_t>();
}

std::string shape_string(const SafetensorsTensorInfo& t) {
  std::string s = "[";
  for (int d = 0; d < t.ndim; ++d) s += fmt::format("{}{}", d ? ", " : "", t.shape[d]);
  return s + "]";
}

// The JSON header of shard `name`: its 8-byte length, checked against the file and the limit,
// then the object itself. *header_len receives the length.
json read_shard_header(const std::string& name, const uint8_t* data, size_t size,
                       uint64_t* header_len) {
  if (size < 8) {
    fail(ErrorKind::kFormat, "{}: file truncated: {} bytes, the header length alone needs 8", name,
         size);
  }
  std::memcpy(header_len, data, 8);
  if (*header_len > size - 8) {
    fail(ErrorKind::kFormat, "{}: header length {} exceeds the file ({} bytes); truncated?", name,
         *header_len, size);
  }
  if (*header_len > kMaxHeaderBytes) {
    fail(ErrorKind::kFormat, "{}: header length {} exceeds the {} byte limit", name, *header_len,
         kMaxHeaderBytes);
  }
  const json header =
      parse_json(name, std::string_view(reinterpret_cast<const char*>(data + 8), *header_len));
  if (!header.is_object()) fail(ErrorKind::kFormat, "{}: the header is not a JSON object", name);
  return header;
}

// The __metadata__ entry: a map of strings, kept in *metadata unless that is null.
void read_shard_metadata(const std::string& name, const json& entry,
                         std::map<std::string, std::string>* metadata) {
  if (!entry.is_object()) fail(ErrorKind::kFormat, "{}: __metadata__ is not an object", name);
  for (const auto& [mkey, mval] : entry.items()) {
    if (!mval.is_string()) {
      fail(ErrorKind::kFormat, "{}: __metadata__ '{}' is not a string", name, mkey);
    }
    if (metadata) (*metadata)[mkey] = mval.get<std::string>();
  }
}

// The shape of a tensor entry into t (ndim, shape) and its element count, refusing overflow.
uint64_t read_tensor_shape(const json& shape, const std::string& where, SafetensorsTensorInfo& t) {
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    fail(ErrorKind::kUnsupported, "{}: {} dimensions (tandem supports up to {})", where,
         shape.size(), kMaxDims);
  }
  t.ndim = static_cast<int>(shape.size());
  uint64_t numel = 1;
  for (int d = 0; d < t.ndim; ++d) {
    const uint64_t extent = json_uint(shape[d], where + " shape");
    if (extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(numel, extent, &numel)) {
      fail(ErrorKind::kFormat, "{}: shape overflows", where);
    }
    t.shape[d] = static_cast<int64_t>(extent);
  }
  return numel;
}

// One tensor entry of shard `name` ({dtype, shape, data_offsets}), its bytes checked to lie in
// the data section (data_size bytes at base) and to match the dtype and shape. Returns the
// entry's begin offset with the tensor.
std::pair<uint64_t, SafetensorsTensorInfo> read_tensor_entry(const std::string& name,
                                                             const std::string& key,
                                                             const json& entry, const uint8_t* base,
                                                             uint64_t data_size) {
  const std::string where = fmt::format("{}: tensor '{}'", name, key);
  if (!entry.is_object()) fail(ErrorKind::kFormat, "{}: entry is not an object", where);
  const auto dtype_it = entry.find("dtype");
  const auto shape_it = entry.find("shape");
  const auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    fail(ErrorKind::kFormat, "{}: missing or non-string 'dtype'", where);
  }
  if (shape_it == entry.end() || !shape_it->is_array()) {
    fail(ErrorKind::kFormat, "{}: missing or non-array 'shape'", where);
  }
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    fail(ErrorKind::kFormat, "{}: 'data_offsets' must be an array [begin, end]", where);
  }
  const std::string dtype_name = dtype_it->get<std::string>();
  const auto dtype = dtype_from_safetensors(dtype_name);
  if (!dtype) fail(ErrorKind::kUnsupported, "{}: dtype '{}' is not supported", where, dtype_name);
  SafetensorsTensorInfo t;
  t.name = key;
  t.dtype = *dtype;
  const uint64_t numel = read_tensor_shape(*shape_it, where, t);
  uint64_t expected = 0;
  if (__builtin_mul_overflow(numel, uint64_t(dtype_info(t.dtype).block_bytes), &expected)) {
    fail(ErrorKind::kFormat, "{}: byte size overflows", where);
  }
  const uint64_t begin = json_uint((*offsets_it)[0], where + " data_offsets");
  const uint64_t end = json_uint((*offsets_it)[1], where + " data_offsets");
  if (begin > end || end > data_size) {
    fail(ErrorKind::kFormat, "{}: data_offsets [{}, {}] out of bounds (data section {} bytes)",
         where, begin, end, data_size);
  }
  if (end - begin != expected) {
    fail(ErrorKind::kFormat, "{}: data_offsets [{}, {}] hold {} bytes, but {} {} needs {}", where,
         begin, end, end - begin, dtype_name, shape_string(t), expected);
  }
  t.data = base + begin;
  t.nbytes = expected;
  t.file = name;
  return {begin, std::move(t)};
}

// Sorts the (begin offset, tensor) entries into [begin, end) order and checks the format's
// rule: the tensors fill the data section, no holes, nothing after. A header length off by a
// byte or two (data read shifted into the JSON's padding) breaks it.
void check_data_section(const std::string& name,
                        std::vector<std::pair<uint64_t, SafetensorsTensorInfo>>& found,
                        uint64_t data_size) {
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {  // [begin, end) order
    return a.first != b.first ? a.first < b.first : a.second.nbytes < b.second.nbytes;
  });
  uint64_t filled = 0;
  for (size_t i = 0; i < found.size(); ++i) {
    if (i > 0 && found[i].first < filled) {
      fail(ErrorKind::kFormat, "{}: tensors '{}' and '{}' overlap", name, found[i - 1].second.name,
           found[i].second.name);
    }
    if (found[i].first != filled) {
      fail(ErrorKind::kFormat,
           "{}: tensor '{}': data_offsets begin at {}, but the data before it ends at {} (a hole "
           "in the data section: wrong header length or offsets?)",
           name, found[i].second.name, found[i].first, filled);
    }
    filled = found[i].first + found[i].second.nbytes;
  }
  if (!found.empty() && filled != data_size) {
    fail(ErrorKind::kFormat,
         "{}: the tensors fill {} bytes of the {}-byte data section (wrong header length or "
         "offsets?)",
         name, filled, data_size);
  }
}

}  // namespace

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const NameDType& e : kDTypes) {
    if (e.name == name) return e.dtype;
  }
  return std::nullopt;
}

std::string_view safetensors_dtype_name(DType dtype) {
  for (const NameDType& e : kDTypes) {
    if (e.dtype == dtype) return e.name;
  }
  return {};
}

void SafetensorsModel::add_shard(std::string name, const uint8_t* data, size_t size, bool first) {
  uint64_t header_len = 0;
  const json header = read_shard_header(name, data, size, &header_len);
  const uint8_t* base = data + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  std::vector<std::pair<uint64_t, SafetensorsTensorInfo>> found;  // (begin offset, info)
  for (const auto& [key, entry] : header.items()) {
    if (key == "__metadata__") {
      read_shard_metadata(name, entry, first ? &metadata_ : nullptr);
      continue;
    }
    found.push_back(read_tensor_entry(name, key, entry, base, data_size));
  }
  check_data_section(name, found, data_size);
  for (auto& [begin, t] : found) {
    if (!index_.emplace(t.name, tensors_.size()).second) {
      fail(ErrorKind::kFormat, "{}: tensor '{}' is also in {}", name, t.name,
           tensors_[index_[t.name]].file);
    }
    tensors_.push_back(std::move(t));
  }
}

SafetensorsModel SafetensorsModel::parse(std::string name, const uint8_t* data, size_t size) {
  SafetensorsModel model;
  model.path_ = name;
  model.add_shard(std::move(name), data, size, true);
  return model;
}

std::map<std::string, std::string> SafetensorsModel::parse_index(const std::string& name,
                                                                 std::string_view json_text) {
  const json index = parse_json(name, json_text);
  if (!index.is_object()) fail(ErrorKind::kFormat, "{}: the index is not a JSON object", name);
  const auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) {
    fail(ErrorKind::kFormat, "{}: missing 'weight_map' object", name);
  }
  std::map<std::string, std::string> out;
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string()) {
      fail(ErrorKind::kFormat, "{}: weight_map['{}'] is not a string", name, tensor);
    }
    std::string file = shard.get<std::string>();
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\\') != std::string::npos || file.find('\0') != std::string::npos) {
      fail(ErrorKind::kFormat, "{}: weight_map['{}'] = '{}' is not a plain shard file name", name,
           tensor, file);
    }
    out.emplace(tensor, std::move(file));
  }
  return out;
}

SafetensorsModel SafetensorsModel::open(const std::filesystem::path& path, LoadMode mode) {
  namespace fs = std::filesystem;
  fs::path file = path;
  if (fs::is_directory(path)) {
    if (fs::exists(path / "model.safetensors.index.json")) {
      file = path / "model.safetensors.index.json";
    } else if (fs::exists(path / "model.safetensors")) {
      file = path / "model.safetensors";
    } else {
      fail(ErrorKind::kIo, "{}: holds neither model.safetensors nor model.safetensors.index.json",
           path.string());
    }
  }
  SafetensorsModel model;
  model.path_ = path.string();
  if (file.extension() != ".json") {
    model.maps_.push_back(std::make_unique<MappedFile>(MappedFile::open(file, mode)));
    const MappedFile& m = *model.maps_.back();
    model.add_shard(file.string(), m.data(), m.size(), true);
    return model;
  }

  const std::map<std::string, std::string> weight_map =
      parse_index(file.string(), read_input_file(file, kMaxIndexBytes));
  // Shards in name order, so model-00001-of-N comes first and provides the metadata.
  std::set<std::string> shards;
  for (const auto& [tensor, shard] : weight_map) shards.insert(shard);
  std::map<std::string, std::string> shard_path;
  for (const std::string& shard : shards) {
    const fs::path p = file.parent_path() / shard;
    if (!fs::exists(p)) {
      fail(ErrorKind::kIo, "{}: shard '{}' named in weight_map is missing ({})", file.string(),
           shard, p.string());
    }
    model.maps_.push_back(std::make_unique<MappedFile>(MappedFile::open(p, mode)));
    const MappedFile& m = *model.maps_.back();
    model.add_shard(p.string(), m.data(), m.size(), model.maps_.size() == 1);
    shard_path[shard] = p.string();
  }
  for (const auto& [tensor, shard] : weight_map) {
    const SafetensorsTensorInfo* t = model.find_tensor(tensor);
    if (t == nullptr || t->file != shard_path[shard]) {
      fail(ErrorKind::kFormat, "{}: tensor '{}' is mapped to shard '{}', which does not hold it",
           file.string(), tensor, shard);
    }
  }
  if (model.tensors_.size() != weight_map.size()) {
    log_debug("{}: {} tensors in the shards are not in weight_map", file.string(),
              model.tensors_.size() - weight_map.size());
  }
  return model;
}

const SafetensorsTensorInfo* SafetensorsModel::find_tensor(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Tensor SafetensorsModel::tensor(std::string_view name) const {
  const SafetensorsTensorInfo* info = find_tensor(name);
  if (info == nullptr) fail(ErrorKind::kFormat, "{}: no tensor '{}'", path_, name);
  Tensor t;
  t.dtype = info->dtype;
  t.ndim = info->ndim;
  t.shape = info->shape;
  if (t.ndim > 0) {
    int64_t stride = dtype_bytes(t.dtype, t.shape[t.ndim - 1]);
    t.stride_bytes[t.ndim - 1] = dtype_info(t.dtype).block_bytes;
    for (int d = t.ndim - 2; d >= 0; --d) {
      t.stride_bytes[d] = stride;
      stride *= t.shape[d];
    }
  }
  // Views are non-const by design; the mapping is read-only, so writing through one faults.
  t.data = const_cast<uint8_t*>(info->data);
  return t;
}

}  // namespace tandem
