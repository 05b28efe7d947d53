// safetensors writer in the layout of safetensors-python / transformers' save_pretrained:
// tensors in name order, compact JSON header padded with spaces to a multiple of 8 bytes, and for
// checkpoints above max_shard_bytes, model-0000i-of-0000N.safetensors shards plus
// model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map"}, indent 2, sorted).
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "core/error.h"
#include "formats/output_file.h"
#include "formats/safetensors.h"

namespace tandem {

SafetensorsWriter::SafetensorsWriter(std::filesystem::path dir, uint64_t max_shard_bytes)
    : dir_(std::move(dir)), max_shard_bytes_(max_shard_bytes) {
  if (max_shard_bytes_ == 0) {
    fail(ErrorKind::kInvalidArgument, "{}: max_shard_bytes must be positive", dir_.string());
  }
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

void SafetensorsWriter::add_tensor(std::string name, DType dtype, std::vector<int64_t> shape,
                                   std::function<void(void* dst)> fill) {
  const std::string_view dtype_name = safetensors_dtype_name(dtype);
  if (dtype_name.empty()) {
    fail(ErrorKind::kUnsupported, "{}: tensor '{}': safetensors cannot store dtype {}",
         dir_.string(), name, dtype_info(dtype).name);
  }
  if (name.empty() || name == "__metadata__") {
    fail(ErrorKind::kInvalidArgument, "{}: invalid tensor name '{}'", dir_.string(), name);
  }
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    fail(ErrorKind::kInvalidArgument, "{}: tensor '{}': {} dimensions (at most {})", dir_.string(),
         name, shape.size(), kMaxDims);
  }
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(numel, d, &numel)) {
      fail(ErrorKind::kInvalidArgument, "{}: tensor '{}': invalid extent {}", dir_.string(), name,
           d);
    }
  }
  for (const PendingTensor& t : tensors_) {
    if (t.name == name)
      fail(ErrorKind::kInvalidArgument, "{}: duplicate tensor '{}'", dir_.string(), name);
  }
  const auto nbytes = static_cast<uint64_t>(dtype_bytes(dtype, numel));
  tensors_.push_back({std::move(name), dtype, std::move(shape), nbytes, std::move(fill)});
}

void SafetensorsWriter::write_file(const std::filesystem::path& file,
                                   const std::vector<const PendingTensor*>& list) const {
  // ordered_json keeps __metadata__ first and the tensors in data order, like safetensors-rust.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  uint64_t max_bytes = 0;
  for (const PendingTensor* t : list) {
    header[t->name] = {{"dtype", safetensors_dtype_name(t->dtype)},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + t->nbytes}}};
    offset += t->nbytes;
    max_bytes = std::max(max_bytes, t->nbytes);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // names or metadata that are not UTF-8
    fail(ErrorKind::kInvalidArgument, "{}: cannot encode the header: {}", file.string(), e.what());
  }
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const uint64_t header_len = text.size();

  OutputFile out(file);
  out.write(&header_len, sizeof(header_len));
  out.write(text.data(), text.size());
  std::vector<uint8_t> buffer(max_bytes);
  for (const PendingTensor* t : list) {
    std::memset(buffer.data(), 0, t->nbytes);
    if (t->fill) t->fill(buffer.data());
    out.write(buffer.data(), t->nbytes);
  }
  out.commit();
}

void SafetensorsWriter::write() {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) fail(ErrorKind::kIo, "{}: cannot create directory: {}", dir_.string(), ec.message());

  std::vector<const PendingTensor*> sorted;
  uint64_t total = 0;
  for (const PendingTensor& t : tensors_) {
    sorted.push_back(&t);
    total += t.nbytes;
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const PendingTensor* a, const PendingTensor* b) { return a->name < b->name; });
  if (total <= max_shard_bytes_) {
    write_file(dir_ / "model.safetensors", sorted);
    return;
  }

  // Greedy split in name order, as transformers does: a new shard starts when the next tensor
  // would overflow the current one (a tensor larger than the limit gets a shard of its own).
  std::vector<std::vector<const PendingTensor*>> shards(1);
  uint64_t shard_bytes = 0;
  for (const PendingTensor* t : sorted) {
    if (!shards.back().empty() && shard_bytes + t->nbytes > max_shard_bytes_) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(t);
    shard_bytes += t->nbytes;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name =
        fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
    write_file(dir_ / name, shards[i]);
    for (const PendingTensor* t : shards[i]) weight_map[t->name] = name;
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  const std::string text = index.dump(2) + "\n";
  OutputFile out(dir_ / "model.safetensors.index.json");
  out.write(text.data(), text.size());
  out.commit();
}

}  // namespace tandem
