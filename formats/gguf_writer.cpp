// GGUF v3 writer: the header, metadata and tensor infos are serialized in memory, then the tensors
// are produced one at a time by their fill callbacks and streamed to <path>.tmp, which is renamed
// over <path> only once everything was written (a crash never leaves a half-written model).
#include <cstring>
#include <limits>
#include <unordered_set>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/output_file.h"

namespace tandem {
namespace {

constexpr uint32_t kGgufVersion = 3;

void put_bytes(std::string& out, const void* p, size_t n) {
  out.append(static_cast<const char*>(p), n);
}
template <typename T>
void put(std::string& out, T v) {
  put_bytes(out, &v, sizeof(T));
}
void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

// The payload of a value (its type tag is written by the caller).
void put_value(std::string& out, const GgufValue& v) {
  switch (v.type()) {
    case GgufType::kUint8:
      put<uint8_t>(out, static_cast<uint8_t>(v.as_uint()));
      break;
    case GgufType::kInt8:
      put<int8_t>(out, static_cast<int8_t>(v.as_int()));
      break;
    case GgufType::kUint16:
      put<uint16_t>(out, static_cast<uint16_t>(v.as_uint()));
      break;
    case GgufType::kInt16:
      put<int16_t>(out, static_cast<int16_t>(v.as_int()));
      break;
    case GgufType::kUint32:
      put<uint32_t>(out, static_cast<uint32_t>(v.as_uint()));
      break;
    case GgufType::kInt32:
      put<int32_t>(out, static_cast<int32_t>(v.as_int()));
      break;
    case GgufType::kUint64:
      put<uint64_t>(out, v.as_uint());
      break;
    case GgufType::kInt64:
      put<int64_t>(out, v.as_int());
      break;
    case GgufType::kFloat32:
      put<uint32_t>(out, static_cast<uint32_t>(v.raw_bits()));
      break;
    case GgufType::kFloat64:
      put<uint64_t>(out, v.raw_bits());
      break;
    case GgufType::kBool:
      put<uint8_t>(out, v.as_bool() ? 1 : 0);
      break;
    case GgufType::kString:
      put_string(out, v.as_string());
      break;
    case GgufType::kArray:
      put<uint32_t>(out, static_cast<uint32_t>(v.array_type()));
      put<uint64_t>(out, v.size());
      for (size_t i = 0; i < v.size(); ++i) put_value(out, v.at(i));
      break;
  }
}

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

bool is_power_of_two(uint64_t x) {
  return x != 0 && (x & (x - 1)) == 0;
}

}  // namespace

GgufWriter::GgufWriter(std::filesystem::path path, uint64_t alignment)
    : path_(std::move(path)), alignment_(alignment) {
  if (!is_power_of_two(alignment) || alignment > std::numeric_limits<uint32_t>::max()) {
    fail(ErrorKind::kInvalidArgument, "{}: GGUF alignment {} is not a power of two", path_.string(),
         alignment);
  }
  if (alignment != 32) set("general.alignment", GgufValue::u32(static_cast<uint32_t>(alignment)));
}

void GgufWriter::set(std::string key, GgufValue value) {
  if (key == "general.alignment") {
    if (value.type() != GgufType::kUint32 || !is_power_of_two(value.as_uint())) {
      fail(ErrorKind::kInvalidArgument, "{}: general.alignment must be a uint32 power of two",
           path_.string());
    }
    alignment_ = value.as_uint();
  }
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kv_.emplace_back(std::move(key), std::move(value));
}

void GgufWriter::add_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                            std::function<void(void* dst)> fill) {
  const DTypeInfo& info = dtype_info(dtype);
  if (info.ggml_type < 0) {
    fail(ErrorKind::kUnsupported, "{}: tensor '{}': GGUF cannot store dtype {}", path_.string(),
         name, info.name);
  }
  if (shape.empty() || shape.size() > 4) {
    fail(ErrorKind::kInvalidArgument, "{}: tensor '{}': {} dimensions (GGUF allows 1 to 4)",
         path_.string(), name, shape.size());
  }
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d <= 0 || __builtin_mul_overflow(numel, d, &numel)) {
      fail(ErrorKind::kInvalidArgument, "{}: tensor '{}': invalid extent {}", path_.string(), name,
           d);
    }
  }
  if (shape.back() % info.block_elems != 0) {
    fail(ErrorKind::kInvalidArgument,
         "{}: tensor '{}': innermost extent {} is not a multiple of the {} block size {}",
         path_.string(), name, shape.back(), info.name, info.block_elems);
  }
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) {
      fail(ErrorKind::kInvalidArgument, "{}: duplicate tensor '{}'", path_.string(), name);
    }
  }
  const auto nbytes = static_cast<uint64_t>(dtype_bytes(dtype, numel));
  tensors_.push_back({std::move(name), dtype, std::move(shape), nbytes, std::move(fill)});
}

void GgufWriter::add_tensor_data(std::string name, DType dtype, std::vector<int64_t> shape,
                                 const void* src) {
  // The size is only known after validation, so the callback reads it from the pending entry.
  const size_t index = tensors_.size();
  add_tensor(std::move(name), dtype, std::move(shape), nullptr);
  const uint64_t nbytes = tensors_[index].nbytes;
  tensors_[index].fill = [src, nbytes](void* dst) { std::memcpy(dst, src, nbytes); };
}

void GgufWriter::write() {
  std::string head;
  put<uint32_t>(head, 0x46554747);  // "GGUF"
  put<uint32_t>(head, kGgufVersion);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kv_.size());
  for (const auto& [key, value] : kv_) {
    put_string(head, key);
    put<uint32_t>(head, static_cast<uint32_t>(value.type()));
    put_value(head, value);
  }
  uint64_t offset = 0;  // relative to the data section
  uint64_t max_bytes = 0;
  for (const PendingTensor& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) put<uint64_t>(head, *it);
    put<uint32_t>(head, static_cast<uint32_t>(dtype_info(t.dtype).ggml_type));
    put<uint64_t>(head, offset);
    offset = align_up(offset + t.nbytes, alignment_);
    max_bytes = std::max(max_bytes, t.nbytes);
  }

  OutputFile out(path_);
  out.write(head.data(), head.size());
  // A file without tensors ends right after the tensor infos, as llama.cpp writes it.
  if (!tensors_.empty()) out.write_zeros(align_up(head.size(), alignment_) - head.size());
  std::vector<uint8_t> buffer(max_bytes);
  for (const PendingTensor& t : tensors_) {
    std::memset(buffer.data(), 0, t.nbytes);
    if (t.fill) t.fill(buffer.data());
    out.write(buffer.data(), t.nbytes);
    out.write_zeros(align_up(t.nbytes, alignment_) - t.nbytes);
  }
  out.commit();
}

}  // namespace tandem
