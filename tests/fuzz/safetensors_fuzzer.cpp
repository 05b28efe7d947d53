// libFuzzer target: the safetensors reader on arbitrary bytes (one file). A parse either succeeds,
// and then every tensor byte it exposes is readable (ASan checks the bounds), or throws Error.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const tandem::SafetensorsModel m =
        tandem::SafetensorsModel::parse("fuzz.safetensors", data, size);
    size_t sink = m.metadata().size();
    for (const tandem::SafetensorsTensorInfo& info : m.tensors()) {
      const tandem::Tensor t = m.tensor(info.name);
      if (info.nbytes > 0) {
        const auto* p = static_cast<const uint8_t*>(t.data);
        sink += p[0] + p[info.nbytes - 1];
      }
    }
    return static_cast<int>(sink & 0);
  } catch (const tandem::Error&) {
    return 0;
  }
}
