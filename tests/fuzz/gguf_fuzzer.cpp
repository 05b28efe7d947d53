// libFuzzer target: the GGUF reader on arbitrary bytes. A parse either succeeds, and then every
// value and every tensor byte it exposes is readable (ASan checks the bounds), or throws Error.
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "formats/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const tandem::GgufFile f = tandem::GgufFile::parse("fuzz.gguf", data, size);
    size_t sink = 0;
    for (const auto& [key, value] : f.metadata()) sink += value.to_string(4).size() + key.size();
    (void)f.get_int("general.alignment", 0);
    for (const tandem::GgufTensorInfo& info : f.tensors()) {
      const tandem::Tensor t = f.tensor(info.name);
      const auto* p = static_cast<const uint8_t*>(t.data);
      sink += p[0] + p[info.nbytes - 1] +
              static_cast<size_t>(t.nbytes() == static_cast<int64_t>(info.nbytes));
    }
    return static_cast<int>(sink & 0);
  } catch (const tandem::Error&) {
    return 0;
  }
}
