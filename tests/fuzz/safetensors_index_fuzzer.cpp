// libFuzzer target: the model.safetensors.index.json parser on arbitrary text.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto map = tandem::SafetensorsModel::parse_index(
        "fuzz.index.json", std::string_view(reinterpret_cast<const char*>(data), size));
    size_t sink = 0;
    for (const auto& [tensor, shard] : map) sink += tensor.size() + shard.size();
    return static_cast<int>(sink & 0);
  } catch (const tandem::Error&) {
    return 0;
  }
}
