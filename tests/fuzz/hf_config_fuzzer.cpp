// libFuzzer target: Hugging Face config.json parsing (formats/model_config.h) on arbitrary text.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "formats/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)tandem::config_from_hf_json_text(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz/config.json");
  } catch (const tandem::Error&) {
  }
  return 0;
}
